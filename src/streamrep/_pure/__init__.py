"""Pure-Python twins of the compiled core modules in :mod:`streamrep._core`.

Each module here exposes exactly the API of its compiled namesake. They are what
runs with ``STREAMREP_NO_EXTENSIONS=1`` and the reference the compiled modules
are tested against.
"""

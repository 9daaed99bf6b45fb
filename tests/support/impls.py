"""Both implementations of each core module, for tests and benchmarks."""

from __future__ import annotations

from types import ModuleType

from streamrep import _impl

#: Core implementations under test. With STREAMREP_NO_EXTENSIONS=1 only the twins run.
IMPLEMENTATIONS: tuple[str, ...] = ("pure",) if _impl.NO_EXTENSIONS else ("compiled", "pure")


def core_module(name: str, kind: str) -> ModuleType:
    """The ``kind`` ("compiled" or "pure") implementation of core module *name*."""
    if kind == "compiled":
        return _impl.load_compiled(name)
    if kind == "pure":
        return _impl.load_pure(name)
    raise ValueError(kind)

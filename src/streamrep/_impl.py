"""The one place that chooses between the compiled core and its pure twins.

``STREAMREP_NO_EXTENSIONS=1`` (any non-empty value but ``0``) forces the pure-Python
twins. Otherwise the compiled module must import: a wheel whose extension failed
to load raises a clear :class:`ImportError` instead of silently running slower.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

#: The core modules; each exists as ``streamrep._core.<name>`` and ``streamrep._pure.<name>``.
CORE_MODULES = ("wire", "tracker", "extremities", "state", "changecache", "authchain", "compress",
                "rowcheck", "stateset", "plaincheck", "eventrecord", "batchrows", "treewalk",
                "eventhash", "pubsub", "authrules")

NO_EXTENSIONS: bool = os.environ.get("STREAMREP_NO_EXTENSIONS", "") not in ("", "0")


def load_pure(name: str) -> ModuleType:
    """Return the pure-Python twin of core module *name*."""
    return importlib.import_module(f"streamrep._pure.{name}")


def load_compiled(name: str) -> ModuleType:
    """Return the compiled core module *name*, or raise :class:`ImportError`."""
    try:
        return importlib.import_module(f"streamrep._core.{name}")
    except ImportError as exc:
        raise ImportError(
            f"streamrep's compiled core module streamrep._core.{name} did not load ({exc}). "
            "Reinstall streamrep so its extensions build, or set STREAMREP_NO_EXTENSIONS=1 "
            "to run on the pure-Python implementation."
        ) from exc


def load(name: str) -> ModuleType:
    """Return the implementation of core module *name* that this process uses."""
    if name not in CORE_MODULES:
        raise ValueError(f"unknown core module {name!r}")
    return load_pure(name) if NO_EXTENSIONS else load_compiled(name)


def is_compiled(module: ModuleType) -> bool:
    """True when *module* is one of the compiled core modules."""
    return module.__name__.startswith("streamrep._core.")

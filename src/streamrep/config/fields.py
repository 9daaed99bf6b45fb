"""Checks of single values in a configuration file, each reporting to :class:`Problems`.

Every checker returns a usable value even when it reports a problem (a default, or
None), so validation goes on and finds every problem of a file in one pass.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, TypeVar

from streamrep.config.model import DEFAULT_DATABASE, Address, parse_address
from streamrep.config.problems import Problems, suggest

__all__ = ["address", "database_url", "flag", "number", "path", "section", "unknown_keys"]

_T = TypeVar("_T")


def unknown_keys(section: Mapping[str, Any], allowed: Sequence[str], prefix: str,
                 problems: Problems) -> None:
    """Report every key of *section* not in *allowed* (with the closest known one)."""
    for key in section:
        if key not in allowed:
            problems.add(f"{prefix}{key}", f"unknown key (known: {', '.join(allowed)})",
                         f"remove it or {suggest(str(key), allowed)}")


def section(data: Mapping[str, Any], key: str, problems: Problems) -> dict[str, Any]:
    """The mapping under *key* (empty when absent or not a mapping)."""
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        problems.add(key, f"expected a mapping, got {type(value).__name__}",
                     f"write {key}: followed by indented `name: value` lines")
        return {}
    return value


def address(value: object, key: str, problems: Problems, example: str) -> Address | None:
    """``HOST:PORT`` as an :class:`Address`, or None."""
    if not isinstance(value, str):
        problems.add(key, f"expected HOST:PORT, got {value!r}", f"write it like {example}")
        return None
    try:
        return parse_address(value)
    except ValueError as exc:
        problems.add(key, f"{value!r} is not an address ({exc})", f"write it like {example}")
        return None


def number(value: object, key: str, problems: Problems, kind: type[_T], low: float,
           default: _T) -> _T:
    """A number of *kind* greater than *low*, else *default*."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if ok and kind is int and not isinstance(value, int):
        ok = False
    if not ok or value <= low:  # type: ignore[operator]
        noun = "a whole number" if kind is int else "a number"
        problems.add(key, f"expected {noun} greater than {low:g}, got {value!r}",
                     f"set it to {noun} such as {default}")
        return default
    return kind(value)  # type: ignore[call-arg]


def database_url(value: object, problems: Problems) -> str:
    """A ``sqlite:///`` or ``postgresql://`` URL (the default when unusable)."""
    fix = "use sqlite:///PATH or postgresql://USER@HOST:PORT/DBNAME"
    if not isinstance(value, str) or not value:
        problems.add("database", f"expected a database URL, got {value!r}", fix)
        return DEFAULT_DATABASE
    scheme = value.partition(":")[0].lower()
    if scheme == "sqlite":
        if not value.startswith("sqlite:///") or len(value) <= len("sqlite:///"):
            problems.add("database", f"{value!r} has no file path",
                         "write sqlite:///relative/path.db or sqlite:////absolute/path.db")
    elif scheme in ("postgresql", "postgres"):
        if not value.startswith(f"{scheme}://"):
            problems.add("database", f"{value!r} is not a PostgreSQL URL", fix)
    else:
        problems.add("database", f"unsupported database scheme {scheme!r} in {value!r}", fix)
    return value


def path(value: object, key: str, problems: Problems, example: str) -> str | None:
    """A file path (None when absent or unusable)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        problems.add(key, f"expected a file path, got {value!r}", f"write it like {example}")
        return None
    return value


def flag(value: object, key: str, problems: Problems) -> bool:
    """``true`` or ``false`` (False when unusable)."""
    if not isinstance(value, bool):
        problems.add(key, f"expected true or false, got {value!r}", "write true or false")
        return False
    return value

"""The one place where a process's set of streams is built, at start-up.

:func:`known_streams` is every stream definition streamrep has: the built-in streams
and the room DAG store's ``events`` and ``backfill``. :func:`served_streams` is the
set a deployment serves, from its configuration. Importing a module never adds a
stream; a program with streams of its own passes ``extra`` definitions here.
:func:`row_formats` is the row format of every stream streamrep can read: those it
serves and those only the reference implementation serves
(:data:`~streamrep.streams.formats.FORMAT_ONLY_STREAMS`), one per stream.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from streamrep.errors import DatabaseConfigError
from streamrep.events.streams import EVENT_STORE_STREAMS
from streamrep.streams import BUILTIN_STREAMS, RowFormat, StreamDefinition, StreamSet
from streamrep.streams.formats import FORMAT_ONLY_STREAMS

if TYPE_CHECKING:
    from streamrep.config import Config

__all__ = ["known_streams", "served_streams", "row_formats"]


def known_streams(extra: Iterable[StreamDefinition] = ()) -> StreamSet:
    """Every stream definition streamrep has, plus *extra*."""
    return StreamSet((*BUILTIN_STREAMS, *EVENT_STORE_STREAMS, *extra))


def served_streams(config: "Config", extra: Iterable[StreamDefinition] = ()) -> StreamSet:
    """The streams the deployment of *config* serves: those its ``stream_writers``
    names a writer for (a loaded configuration names one for every known stream)."""
    return known_streams(extra).only(config.stream_writers)


def row_formats(extra: Iterable[StreamDefinition] = ()) -> dict[str, RowFormat]:
    """The row format of every stream streamrep knows, by name, sorted: each served
    stream's definition's (with *extra*), then the format-only ones of the streams
    only the reference serves. A stream described twice raises
    :class:`~streamrep.errors.DatabaseConfigError`."""
    formats = {d.name: d.row for d in known_streams(extra) if d.row is not None}
    both = sorted(set(formats) & set(FORMAT_ONLY_STREAMS))
    if both:
        raise DatabaseConfigError(f"streams described twice (served and format-only): {', '.join(both)}")
    formats.update(FORMAT_ONLY_STREAMS)
    return {name: formats[name] for name in sorted(formats)}

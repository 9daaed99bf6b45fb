"""The one place where a process's set of streams is built, at start-up.

:func:`known_streams` is every stream definition streamrep has: the built-in streams
and the room DAG store's ``events`` and ``backfill``. :func:`served_streams` is the
set a deployment serves, from its configuration. Importing a module never adds a
stream; a program with streams of its own passes ``extra`` definitions here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

from streamrep.events.streams import EVENT_STORE_STREAMS
from streamrep.streams import BUILTIN_STREAMS, StreamDefinition, StreamSet

if TYPE_CHECKING:
    from streamrep.config import Config

__all__ = ["known_streams", "served_streams"]


def known_streams(extra: Iterable[StreamDefinition] = ()) -> StreamSet:
    """Every stream definition streamrep has, plus *extra*."""
    return StreamSet((*BUILTIN_STREAMS, *EVENT_STORE_STREAMS, *extra))


def served_streams(config: "Config", extra: Iterable[StreamDefinition] = ()) -> StreamSet:
    """The streams the deployment of *config* serves: those its ``stream_writers``
    names a writer for (a loaded configuration names one for every known stream)."""
    return known_streams(extra).only(config.stream_writers)

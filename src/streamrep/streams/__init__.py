"""Streams: the registry of stream definitions and the per-process :class:`Streams`.

Built-in streams (``caches``, ``account_data``, ``to_device``, ``receipts``,
``typing``) are registered on import; other modules register theirs with
:func:`register_stream` (the room DAG store adds ``events`` and ``backfill``).
See docs/streams.md for every row format.
"""

from streamrep.streams.definition import RowFormat, Stream, StreamDefinition, StreamRow
from streamrep.streams.registry import (
    Streams,
    get_stream_definition,
    register_stream,
    stream_definitions,
    unregister_stream,
)
from streamrep.streams import builtin as _builtin  # noqa: F401  (registers the built-ins)
from streamrep.streams.memory import InMemoryStream

__all__ = [
    "InMemoryStream",
    "RowFormat",
    "Stream",
    "StreamDefinition",
    "StreamRow",
    "Streams",
    "get_stream_definition",
    "register_stream",
    "stream_definitions",
    "unregister_stream",
]

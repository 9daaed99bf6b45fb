"""Streams: stream definitions, the :class:`StreamSet` a process serves, and the
per-process :class:`Streams` handle.

Nothing is registered by importing a module: a process builds its
:class:`StreamSet` once at start-up (:func:`streamrep.catalogue.served_streams`
from the deployment's configuration), from the built-in streams
(:data:`BUILTIN_STREAMS`: ``caches``, ``account_data``, ``to_device``,
``receipts``, ``typing``) and those of other modules (the room DAG store's
``events`` and ``backfill``). The streams only the reference implementation serves have a row
format and nothing else (:data:`streamrep.streams.formats.FORMAT_ONLY_STREAMS`).
See docs/streams.md for every row format.
"""

from streamrep.streams.builtin import BUILTIN_STREAMS
from streamrep.streams.definition import RowFormat, Stream, StreamDefinition, StreamRow
from streamrep.streams.memory import InMemoryStream
from streamrep.streams.handle import Streams
from streamrep.streams.streamset import StreamSet

__all__ = [
    "BUILTIN_STREAMS",
    "InMemoryStream",
    "RowFormat",
    "Stream",
    "StreamDefinition",
    "StreamRow",
    "StreamSet",
    "Streams",
]

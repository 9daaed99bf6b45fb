"""Stream ID generators and completion tracking.

* :class:`CompletionTracker` / :class:`WriterPositions`: the bookkeeping core (compiled,
  or its pure twin with ``STREAMREP_NO_EXTENSIONS=1``).
* :class:`StreamIdGenerator`: one writer, IDs from ``MAX(stream_id)`` of the backing
  tables at startup (SQLite or PostgreSQL).
* :class:`MultiWriterIdGenerator`: several writers on PostgreSQL, IDs from a sequence,
  positions persisted in ``stream_positions``.
* :func:`make_id_generator`: the right one for a configuration.
* :class:`WriterLease`: one live process per writer instance and stream.

See docs/idgen.md.
"""

from __future__ import annotations

from typing import Sequence

from streamrep.db import Database
from streamrep.idgen.base import BackingTable, IdGenerator, PositionListener
from streamrep.idgen.lease import WriterLease
from streamrep.idgen.multi import MultiWriterIdGenerator
from streamrep.idgen.sequences import SequenceRepair, check_sequence, repair_sequences
from streamrep.idgen.single import StreamIdGenerator
from streamrep.idgen.tracking import CompletionTracker, WriterPositions

__all__ = [
    "BackingTable",
    "CompletionTracker",
    "IdGenerator",
    "MultiWriterIdGenerator",
    "PositionListener",
    "SequenceRepair",
    "StreamIdGenerator",
    "WriterLease",
    "WriterPositions",
    "check_sequence",
    "make_id_generator",
    "repair_sequences",
]


def make_id_generator(db: Database, stream_name: str, instance_name: str,
                      writers: Sequence[str], tables: Sequence[BackingTable],
                      sequence_name: str | None = None, *,
                      negative: bool = False) -> IdGenerator:
    """The generator for a stream: multi-writer (PostgreSQL sequence) when a
    *sequence_name* is given and the database is PostgreSQL, else single-writer.

    Several writers on SQLite raise :class:`DatabaseConfigError`.
    """
    db.require_multiple_writers(stream_name, list(writers))
    if sequence_name is not None and db.is_postgres:
        return MultiWriterIdGenerator(db, stream_name, instance_name, writers, tables,
                                      sequence_name, negative=negative)
    writer = writers[0] if writers else instance_name
    gen = StreamIdGenerator(db, stream_name, tables, instance_name=writer, negative=negative)
    if instance_name != writer:
        gen.instance_name = instance_name  # a reader of a single-writer stream
    return gen

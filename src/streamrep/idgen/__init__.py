"""Stream ID generators and completion tracking.

* :class:`CompletionTracker` / :class:`WriterPositions`: the bookkeeping core (compiled,
  or its pure twin with ``STREAMREP_NO_EXTENSIONS=1``).
* :class:`StreamIdGenerator`: one writer, IDs from ``MAX(stream_id)`` of the backing
  tables at startup (SQLite or PostgreSQL).
* :class:`MultiWriterIdGenerator`: several writers on PostgreSQL, IDs from a sequence,
  positions persisted in ``stream_positions``.

See docs/idgen.md.
"""

from streamrep.idgen.tracking import CompletionTracker, WriterPositions

__all__ = ["CompletionTracker", "WriterPositions"]

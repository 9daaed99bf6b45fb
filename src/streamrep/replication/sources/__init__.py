"""Where replication reads stream rows from: catch-up sources.

A source answers "the rows of writer W on stream S between two tokens", page by
page. The hub reads its own writers' new rows and serves catch-up from one; a
reader fills the gaps it finds from one. Rows are ``(token, row_json)`` pairs in
token order, the JSON being exactly what an ``RDATA`` line carries, so the hub
relays without re-encoding and a reader decodes database rows and wire rows the
same way.

* :class:`CatchUpSource`: what a reader needs to fill a gap;
* :class:`StreamSource`: a database, which also knows every writer's position
  (the hub, and readers that verify what they are told);
* :func:`pages`: the one loop over a source's pages;
* :class:`~.memory.MemorySource` (streams held in memory),
  :class:`~.database.DatabaseSource` (the database-backed stream registry) and
  :class:`~.http.HttpSource` (the writers of a reference deployment, over their
  HTTP replication API).

A source that cannot answer for a writer now raises
:class:`~streamrep.errors.CatchUpUnavailableError` (its subclass
:class:`~streamrep.errors.CatchUpRefusedError` when the writer refused its
credentials); one that will never hold a stream or a writer
:class:`~streamrep.errors.UnknownStreamError` or
:class:`~streamrep.errors.UnknownWriterError`.
"""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence, runtime_checkable

__all__ = ["CatchUpSource", "StreamSource", "pages", "Rows"]

#: ``(token, row_json)`` rows of one writer, in token order.
Rows = list[tuple[int, bytes]]


class CatchUpSource(Protocol):
    """Rows of any writer between two tokens: what fills a reader's gap.

    A source over the network may say it can be cut short between its calls'
    network waits (a class attribute ``interruptible = True``): a follower filling
    a gap as it reads then gives each page a few seconds, and holds a writer that
    takes longer back (filling it in the background) rather than every writer."""

    def stream_names(self) -> Sequence[str]:
        """Names of the streams this source can fill."""
        ...

    def updates(
        self, stream: str, instance: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[Rows, bool]:
        """Rows of *instance* with ``from_token < token <= upto_token``, token order.

        About *limit* rows: when more remain the flag is True and the rows end at a
        whole token (rows sharing a token are never split, so the answer may exceed
        *limit* by the rest of the last token's rows)."""
        ...


@runtime_checkable
class StreamSource(CatchUpSource, Protocol):
    """A database's streams: rows, and every writer's position."""

    def writers(self, stream: str, after: int | None = None) -> Sequence[str]:
        """Instances known to have written (or to write) *stream*; with *after*, only
        those with rows past that token (a cheap look for newcomers)."""
        ...

    def current_token(self, stream: str, instance: str) -> int:
        """The writer's persisted position: every fact up to it is readable."""
        ...

    def stored_token(self, stream: str, instance: str) -> int:
        """The largest token of *instance* in *stream* that the database holds (0
        if none): its largest row, or its persisted position on a stream several
        writers share when that is further. No fact of that writer can be past it."""
        ...


def pages(source: CatchUpSource, stream: str, instance: str, from_token: int, upto_token: int,
          limit: int) -> Iterator[Rows]:
    """The rows of *instance* on *stream* with ``from_token < token <= upto_token``,
    page by page (each non-empty and ending at a whole token), read lazily: a
    consumer that stops early reads no further."""
    while from_token < upto_token:
        rows, limited = source.updates(stream, instance, from_token, upto_token, limit)
        if not rows:
            return
        yield rows
        from_token = rows[-1][0]
        if not limited:
            return

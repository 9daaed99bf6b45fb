"""A reader's bookkeeping of every writer's position (sans-IO).

:class:`StreamFollower` turns the ``RDATA`` and ``POSITION`` commands a worker
receives into calls of the application's handler, one per fact, exactly once and
in token order per writer:

* ``RDATA`` rows with the token ``batch`` wait until the row carrying the real
  token arrives; the position only advances on that final row.
* A fact whose token is not past the writer's position has been delivered
  already (a replay after a reconnect) and is dropped.
* A ``POSITION`` whose ``prev_token`` is ahead of what this reader has seen
  reveals a gap: the missed facts are fetched with the stream source's
  ``updates`` (the database) and delivered before the position moves. Without a
  source the gap cannot be filled here and :meth:`on_position` says so; the
  client then resynchronises through the hub.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, Mapping, Sequence

import orjson

from streamrep.replication.commands import rdata_rows
from streamrep.replication.source import StreamSource

__all__ = ["StreamFollower", "Handler", "group_facts"]

logger = logging.getLogger(__name__)

#: ``handler(stream, instance, token, rows)``: called once per fact.
Handler = Callable[[str, str, int, list[Any]], None]

#: Rows fetched per database round trip while filling a gap.
FETCH_LIMIT = 1000


def group_facts(rows: Sequence[tuple[int, bytes]]) -> list[tuple[int, list[Any]]]:
    """Group ``(token, row_json)`` rows (token order) into facts ``(token, rows)``."""
    facts: list[tuple[int, list[Any]]] = []
    for token, row_json in rows:
        row = orjson.loads(row_json)
        if facts and facts[-1][0] == token:
            facts[-1][1].append(row)
        else:
            facts.append((token, [row]))
    return facts


class StreamFollower:
    """Per-writer positions of one reader, and delivery of facts to its handler.

    *streams* limits which streams are followed (None: all). *start_from* gives
    where to start for a writer seen for the first time: a token per stream or
    per ``(stream, instance)``; without one the reader starts at the writer's
    current position.
    """

    def __init__(
        self,
        handler: Handler,
        source: StreamSource | None = None,
        streams: Iterable[str] | None = None,
        start_from: Mapping[Any, int] | None = None,
    ) -> None:
        self.handler = handler
        self.source = source
        self.streams = frozenset(streams) if streams is not None else None
        self.start_from: dict[Any, int] = dict(start_from or {})
        self.positions: dict[tuple[str, str], int] = {}
        self._pending: dict[tuple[str, str], list[Any]] = {}
        #: facts delivered, for progress reports
        self.delivered = 0

    def follows(self, stream: str) -> bool:
        return self.streams is None or stream in self.streams

    def _base(self, key: tuple[str, str]) -> int | None:
        pos = self.positions.get(key)
        if pos is not None:
            return pos
        base = self.start_from.get(key)
        if base is None:
            base = self.start_from.get(key[0])
        return base

    def connection_lost(self) -> None:
        """Forget half-received batches: the hub resends whole facts."""
        self._pending.clear()

    # --- commands ------------------------------------------------------------------------

    def on_rdata(self, stream: str, instance: str, token: int | None, row: Any) -> None:
        """One ``RDATA`` row; *token* None means ``batch``."""
        if self.streams is not None and stream not in self.streams:
            return
        key = (stream, instance)
        if token is None:
            waiting = self._pending.get(key)
            if waiting is None:
                self._pending[key] = [row]
            else:
                waiting.append(row)
            return
        pending = self._pending.pop(key, None)
        base = self._base(key)
        if base is not None and token <= base:
            return
        rows = pending + [row] if pending else [row]
        # The position moves only once the handler has taken the fact: if it
        # raises, the connection drops and the fact comes again on resume.
        self.handler(stream, instance, token, rows)
        self.positions[key] = token
        self.delivered += 1

    def on_rdata_run(self, stream: str, instance: str, token: int | None, commands: list[Any]) -> None:
        """Consecutive ``RDATA`` commands of one writer, all ``batch`` but the last,
        whose token is *token* (None: every one is ``batch``, the fact goes on in
        a later read).

        The same as :meth:`on_rdata` for each, with the bookkeeping done once per
        fact; rows of a fact that is dropped (already delivered, or of a stream not
        followed) are never decoded.
        """
        if self.streams is not None and stream not in self.streams:
            return
        key = (stream, instance)
        if token is None:
            waiting = self._pending.get(key)
            rows = rdata_rows(commands)
            if waiting is None:
                self._pending[key] = rows
            else:
                waiting.extend(rows)
            return
        pending = self._pending.pop(key, None)
        pos = self.positions.get(key)
        base = pos if pos is not None else self._base(key)
        if base is not None and token <= base:
            return
        if pending:
            pending.extend(rdata_rows(commands))
            rows = pending
        else:
            rows = rdata_rows(commands)
        self.handler(stream, instance, token, rows)
        self.positions[key] = token
        self.delivered += 1

    def on_position(self, stream: str, instance: str, prev_token: int, new_token: int) -> bool:
        """A ``POSITION``. Returns False when a gap needs filling and there is no
        source to fill it from (the position is then left alone)."""
        if self.streams is not None and stream not in self.streams:
            return True
        key = (stream, instance)
        self._pending.pop(key, None)
        base = self._base(key)
        if base is None:
            self.positions[key] = new_token
            return True
        if prev_token > base:
            if self.source is None:
                return False
            self._fill(stream, instance, base, new_token)
        if new_token > self.positions.get(key, base):
            self.positions[key] = new_token
        elif key not in self.positions:
            self.positions[key] = base
        return True

    def catch_up(self, stream: str, instance: str, upto_token: int) -> None:
        """Deliver facts from this reader's position up to *upto_token* from the source."""
        key = (stream, instance)
        base = self._base(key)
        if base is None or self.source is None:
            return
        self._fill(stream, instance, base, upto_token)
        if upto_token > self.positions.get(key, base):
            self.positions[key] = upto_token

    def _fill(self, stream: str, instance: str, from_token: int, upto_token: int) -> None:
        assert self.source is not None
        key = (stream, instance)
        while from_token < upto_token:
            # Limited answers end at a whole stream ID (the source's contract).
            rows, limited = self.source.updates(stream, instance, from_token, upto_token, FETCH_LIMIT)
            if not rows:
                break
            facts = group_facts(rows)
            for token, fact_rows in facts:
                if token <= from_token:
                    continue
                self.handler(stream, instance, token, fact_rows)
                self.positions[key] = token
                self.delivered += 1
                from_token = token
            if not limited:
                break

    def resume_tokens(self) -> dict[str, int]:
        """Per stream, the token to resume from through the hub: the lowest
        position over its writers (facts already seen are dropped on arrival)."""
        tokens: dict[str, int] = {}
        for (stream, _instance), pos in self.positions.items():
            tokens[stream] = min(pos, tokens.get(stream, pos))
        for key, base in self.start_from.items():
            stream = key if isinstance(key, str) else key[0]
            if isinstance(key, str) and stream in tokens:
                continue  # every writer the hub knows has a position already
            tokens[stream] = min(base, tokens.get(stream, base))
        return tokens

"""A reader's facts handed to the application, exactly once and in order per writer.

:class:`StreamFollower` carries out the reader actions of the protocol
(:class:`~streamrep.replication.protocol.Fact` and
:class:`~streamrep.replication.protocol.FillGap`) against the application's
handler and its database (a :class:`~streamrep.replication.source.StreamSource`);
the bookkeeping itself (positions, ``batch`` rows, replays, gaps) is the
protocol's :class:`~streamrep.replication.protocol.FollowerState`.

* ``RDATA`` rows with the token ``batch`` wait until the row carrying the real
  token arrives; the position only advances on that final row.
* A fact whose token is not past the writer's position has been delivered
  already (a replay after a reconnect) and is dropped.
* A ``POSITION`` whose ``prev_token`` is ahead of what this reader has seen
  reveals a gap: the missed facts are read from the catch-up source (the
  database, or a writer's replication API) and delivered before the position
  moves. Without a source :meth:`on_position` says so; the TCP link then
  resynchronises through the hub, and a link with nothing to resynchronise
  from calls :meth:`skip_gap`, which logs the gap, counts it (:attr:`unfilled`,
  exported as a metric) and tells the application before moving on.
* A handler that raises leaves the position before its fact, so the fact comes
  again after the reconnect: a failing handler is retried, never skipped.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable, Iterable

import orjson

from streamrep.replication.protocol import (
    Action, Fact, FillGap, FollowerState, GapUnfilled, Positions, Refused, StartFrom, WriterKey, group_facts,
)
from streamrep.replication.sources import CatchUpSource, StreamSource, pages

__all__ = ["StreamFollower", "Handler", "group_facts", "FETCH_LIMIT"]

logger = logging.getLogger(__name__)

#: ``handler(stream, instance, token, rows)``: called once per fact.
Handler = Callable[[str, str, int, list[Any]], None]

#: Rows fetched per database round trip while filling a gap.
FETCH_LIMIT = 1000


class StreamFollower:
    """Per-writer positions of one reader, and delivery of facts to its handler.

    *streams* limits which streams are followed (None: all). *start_from* gives
    where to start for a writer seen for the first time: a token per stream or
    per ``(stream, instance)``; without one the reader starts "from now on":
    with a database (a :class:`~streamrep.replication.sources.StreamSource`) at
    every writer's position there when it starts (:meth:`resolve_start`), and
    writers it meets later from their first fact; without one at the position
    each writer's first ``POSITION`` gives. ``state`` is the protocol's
    bookkeeping, shared with the transport's session.

    *verify*: check every ``RDATA`` and ``POSITION`` against the database and
    deliver the stored rows (a bus where anyone may publish, see
    :class:`~streamrep.replication.protocol.FollowerState`); refusals are logged
    once per writer and reason, and counted in :attr:`refused`.

    *new_writers_from*: where a writer neither *start_from* nor a position names
    starts (0 for a reader resumed from a cursor: a writer met later is followed
    from its first fact). *after_read* is called with the follower once every
    fact of a read has been handed on, so its positions are exactly what the
    application took (see :mod:`streamrep.replication.cursor`).
    """

    def __init__(
        self,
        handler: Handler,
        source: CatchUpSource | None = None,
        streams: Iterable[str] | None = None,
        start_from: StartFrom | None = None,
        on_gap: Callable[[str, str, int, int], None] | None = None,
        *,
        verify: bool = False,
        new_writers_from: int | None = None,
        after_read: Callable[[StreamFollower], None] | None = None,
    ) -> None:
        self.handler = handler
        self.source = source
        self.on_gap = on_gap
        if verify and not isinstance(source, StreamSource):
            raise ValueError("verifying needs a database source (a StreamSource)")
        stored = source.stored_token if verify and isinstance(source, StreamSource) else None
        self.state = FollowerState(streams, start_from, can_fill=source is not None, verify=stored,
                                   new_writers_from=new_writers_from)
        #: called once the facts of a read have all been handed on (a cursor saves here)
        self.after_read = after_read
        #: True once :meth:`hold` was called: no fact is handed on any more
        self.held = False
        #: True while :meth:`run` hands a read's facts on (its positions are then
        #: ahead of what the application took)
        self.handing_on = False
        #: facts delivered, for progress reports
        self.delivered = 0
        #: gaps that could not be filled, per (stream, instance)
        self.unfilled: Counter[tuple[str, str]] = Counter()
        #: commands not taken as facts, per reason (verifying readers)
        self.refused: Counter[str] = Counter()
        self._refusals_logged: set[tuple[str, str, str]] = set()

    def resolve_start(self) -> None:
        """Make "from now on" exact before the first connection: with a database and
        no *start_from*, start every writer at its position there now, and writers
        met later from their first fact (none of their facts can predate this)."""
        source = self.source
        state = self.state
        if (state.start_from or state.positions or state.new_writers_from is not None
                or not isinstance(source, StreamSource)):
            return
        for stream in source.stream_names():
            if state.follows(stream):
                for instance in source.writers(stream):
                    state.start_from[(stream, instance)] = source.current_token(stream, instance)
        state.new_writers_from = 0

    def stored_positions(self) -> list[Action]:
        """For a reader that verifies against its database: the actions of hearing
        every writer there announce its stored position (fills up to it). A writer
        that stopped answers no ``REPLICATE``; its facts committed while this reader
        was away are in the database all the same."""
        source = self.source
        state = self.state
        out: list[Action] = []
        if state.verify is None or not isinstance(source, StreamSource):
            return out
        for stream in source.stream_names():
            if state.follows(stream):
                for instance in source.writers(stream):
                    token = source.current_token(stream, instance)
                    state.position(stream, instance, token, token, out)
        return out

    def taken_positions(self) -> dict[WriterKey, int]:
        """``{(stream, instance): token}`` of the last fact the application took from
        each writer (or the position a writer moved to with no fact): what a cursor
        records. Exact between reads (:attr:`after_read`) and once the link stopped."""
        return dict(self.state.positions)

    @property
    def positions(self) -> Positions:
        """``{(stream, instance): token}`` of the last fact taken (or position reached)."""
        return self.state.positions

    @property
    def streams(self) -> frozenset[str] | None:
        return self.state.streams

    @property
    def start_from(self) -> dict[str | WriterKey, int]:
        return self.state.start_from

    def follows(self, stream: str) -> bool:
        return self.state.follows(stream)

    def connection_lost(self) -> None:
        """Forget half-received batches: the hub resends whole facts."""
        self.state.connection_lost()

    def hold(self) -> None:
        """Hand no more facts on (the link is stopping, a ``--limit`` was reached,
        a cursor could not be saved): the rest of the read is not taken and the
        positions go back to before it, so they say exactly what the application
        took."""
        self.held = True

    def release(self) -> None:
        """Hand facts on again (a link started anew)."""
        self.held = False

    def resume_tokens(self) -> dict[str, int]:
        """Per stream, the token to resume from through the hub."""
        return self.state.resume_tokens()

    # --- carrying out the protocol's actions -----------------------------------------------

    def run(self, actions: list[Action]) -> list[Action]:
        """Carry out every :class:`Fact` and :class:`FillGap` of *actions*, in order;
        return the other actions, in order, for the transport.

        If the handler (or the source) raises, the positions go back to before
        the first fact not taken, and the exception propagates. Once :meth:`hold`
        was called, the facts left are not taken and their positions go back.
        """
        rest: list[Action] = []
        self.handing_on = True
        try:
            self._run(actions, rest)
        finally:
            self.handing_on = False
        if self.after_read is not None:
            self.after_read(self)
        return rest

    def _run(self, actions: list[Action], rest: list[Action]) -> None:
        for index, action in enumerate(actions):
            kind = type(action)
            try:
                if kind is Fact:
                    assert isinstance(action, Fact)
                    if self.held:
                        self._drop_rest(actions, index, rest)
                        break
                    self.handler(action.stream, action.instance, action.token, action.rows)
                    self.delivered += 1
                elif kind is FillGap:
                    assert isinstance(action, FillGap)
                    if self.held:
                        self._drop_rest(actions, index, rest)
                        break
                    self._fill(action)
                elif kind is Refused:
                    assert isinstance(action, Refused)
                    self._refused(action.stream, action.instance, action.reason)
                else:
                    rest.append(action)
            except BaseException:
                self.state.rewind_unfinished(actions[index + 1:])
                if kind is Fact:
                    assert isinstance(action, Fact)
                    self.state.rewind(action.stream, action.instance, action.prev)
                raise

    def _drop_rest(self, actions: list[Action], index: int, rest: list[Action]) -> None:
        """Held: take none of the facts from *index* on; pass the other actions on."""
        left = actions[index:]
        self.state.rewind_unfinished(left)
        rest.extend(a for a in left if type(a) is not Fact and type(a) is not FillGap and type(a) is not Refused)

    def _fill(self, gap: FillGap) -> None:
        source = self.source
        assert source is not None, "FillGap needs a source"
        stream, instance = gap.stream, gap.instance
        from_token = gap.from_token
        expect = gap.expect
        try:
            for rows in pages(source, stream, instance, from_token, gap.upto_token, FETCH_LIMIT):
                if expect:
                    self._compare(stream, instance, expect, rows)
                for fact in self.state.gap_facts(stream, instance, from_token, rows):
                    if self.held:
                        self.state.rewind(stream, instance, from_token)
                        return
                    self.handler(stream, instance, fact.token, fact.rows)
                    self.delivered += 1
                    from_token = fact.token
        except BaseException:
            self.state.rewind(stream, instance, from_token)
            raise

    def _compare(self, stream: str, instance: str, expect: dict[int, list[bytes]],
                 rows: list[tuple[int, bytes]]) -> None:
        """Rows heard on the bus that differ from the stored rows of their fact: the
        stored ones are delivered; the difference is refused. A fact whose rows are
        no longer stored (a later fact replaced them) proves nothing either way."""
        stored: dict[int, list[bytes]] = {}
        for token, row_json in rows:
            if token in expect:
                stored.setdefault(token, []).append(row_json)
        for token, row_jsons in stored.items():
            heard = expect[token]
            if heard != row_jsons and [orjson.loads(r) for r in heard] != [orjson.loads(r) for r in row_jsons]:
                self._refused(stream, instance, f"token {token}: the rows heard differ from the stored ones")

    def _refused(self, stream: str, instance: str, reason: str) -> None:
        kind = "rows differ from the database" if "differ" in reason else "token past the database"
        self.refused[kind] += 1
        if (stream, instance, kind) not in self._refusals_logged:
            self._refusals_logged.add((stream, instance, kind))
            logger.warning("refused what the bus said of %s/%s: %s (delivered what the database holds; "
                           "logged once per writer)", stream, instance, reason)

    def skip_gap(self, gap: GapUnfilled) -> None:
        """Move past a gap nothing can fill: log it, count it, tell ``on_gap``."""
        self.unfilled[(gap.stream, gap.instance)] += 1
        logger.warning("missed facts of %s/%s after token %s (the writer is at %s) and cannot fetch "
                       "them: no catch-up source for this stream; going on from there",
                       gap.stream, gap.instance, gap.from_token, gap.upto_token)
        if self.on_gap is not None:
            self.on_gap(gap.stream, gap.instance, gap.from_token, gap.upto_token)
        self.state.skip_gap(gap)

    # --- feeding commands by hand (tests, embedding) -----------------------------------------

    def on_rdata(self, stream: str, instance: str, token: int | None, row: Any) -> None:
        """One ``RDATA`` row; *token* None means ``batch``."""
        out: list[Action] = []
        self.state.rdata(stream, instance, token, row, out)
        self.run(out)

    def on_rdata_run(self, stream: str, instance: str, token: int | None, commands: list[Any]) -> None:
        """Consecutive ``RDATA`` commands of one writer, all ``batch`` but the last,
        whose token is *token* (None: the fact goes on in a later read)."""
        out: list[Action] = []
        self.state.rdata_run(stream, instance, token, commands, out)
        self.run(out)

    def on_position(self, stream: str, instance: str, prev_token: int, new_token: int) -> bool:
        """A ``POSITION``. Returns False when a gap needs filling and there is no
        source to fill it from (the position is then left alone)."""
        out: list[Action] = []
        self.state.position(stream, instance, prev_token, new_token, out)
        if any(type(action) is GapUnfilled for action in out):
            return False
        self.run(out)
        return True

    def catch_up(self, stream: str, instance: str, upto_token: int) -> None:
        """Deliver facts from this reader's position up to *upto_token* from the source."""
        key = (stream, instance)
        base = self.state.base(key)
        if base is None or self.source is None:
            return
        if upto_token > self.positions.get(key, base):
            self.positions[key] = upto_token
        self.run([FillGap(stream, instance, base, upto_token)])


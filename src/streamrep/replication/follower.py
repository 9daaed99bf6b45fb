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
* A source that cannot answer for one writer now (a writer of a reference
  deployment that is down: :class:`~streamrep.errors.CatchUpUnavailableError`)
  holds back that writer only: it is *stalled* (:class:`Stall`) at the last fact
  handed on, said once in the log and to ``on_stall``, and counted
  (:attr:`stalls`, :meth:`stalled_seconds`, exported as metrics). Its later facts
  are not handed on: the fill covers them, retried in the background with
  backoff until the writer answers, and the writer resumes exactly once
  (``on_resume``). The other writers go on meanwhile. A source that will never
  hold the stream or the writer (:class:`~streamrep.errors.UnknownStreamError`,
  :class:`~streamrep.errors.UnknownWriterError`) leaves an unfilled gap, as
  without a source.
* Facts are handed on by one greenlet at a time (:attr:`lock`): the transport's
  reads and the background fills take turns, and :attr:`after_read` sees
  positions that say exactly what the application took.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

import gevent
import gevent.lock
import orjson

from streamrep.errors import CatchUpRefusedError, CatchUpUnavailableError, UnknownStreamError, UnknownWriterError
from streamrep.replication.backoff import Backoff
from streamrep.replication.protocol import (
    Action, Fact, FillGap, FollowerState, GapUnfilled, Positions, Refused, StartFrom, WriterKey, group_facts,
)
from streamrep.replication.sources import CatchUpSource, Rows, StreamSource, pages

__all__ = ["StreamFollower", "Handler", "Stall", "group_facts", "FETCH_LIMIT"]

logger = logging.getLogger(__name__)

#: ``handler(stream, instance, token, rows)``: called once per fact.
Handler = Callable[[str, str, int, list[Any]], None]

#: Rows fetched per database round trip while filling a gap.
FETCH_LIMIT = 1000


@dataclass
class Stall:
    """A writer whose gap the source could not fill: held back at *position* (the
    last token handed on), while its writer is known to be at *upto*."""

    stream: str
    instance: str
    position: int
    upto: int
    #: why, in one line (the source's last error)
    problem: str
    #: time.monotonic() when it stalled
    since: float
    #: the writer refused the source's credentials
    refused: bool = False
    #: background attempts made so far
    attempts: int = 0


def _patiently(pages: Iterator[Rows], patience: float | None, stream: str, instance: str,
               where: str = "") -> Iterator[Rows]:
    """*pages*, each given at most *patience* seconds (None: as long as it takes)."""
    while True:
        if patience is None:
            page = next(pages, None)
        else:
            slow = CatchUpUnavailableError(f"the writer {instance}{f' at {where}' if where else ''} did not "
                                           f"answer for {stream} within {patience:g}s", stream, instance, where)
            with gevent.Timeout(patience, slow):
                page = next(pages, None)
        if page is None:
            return
        yield page


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
        on_stall: Callable[[Stall], None] | None = None,
        on_resume: Callable[[Stall], None] | None = None,
        retry_base: float = 1.0,
        retry_max: float = 60.0,
        fill_patience: float | None = 5.0,
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
        #: writers held back because their gap could not be filled yet
        self.stalled: dict[WriterKey, Stall] = {}
        #: how many times each writer stalled
        self.stalls: Counter[WriterKey] = Counter()
        #: the last refusal of the source's credentials by a writer (None: none)
        self.refusal: str | None = None
        self.on_stall = on_stall
        self.on_resume = on_resume
        self.retry_base = retry_base
        self.retry_max = retry_max
        #: seconds a page of a gap may take, from a source that may be cut short,
        #: before its writer is held back and filled in the background (None: no limit)
        self.fill_patience = fill_patience
        #: held while facts are handed on: the transport's reads and the background
        #: fills of stalled writers take turns
        self.lock = gevent.lock.RLock()
        self._retries: dict[WriterKey, gevent.Greenlet] = {}

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
        records. Exact between reads (:attr:`after_read`) and once the link stopped;
        a stalled writer is where it stalled."""
        positions = dict(self.state.positions)
        for key, stall in self.stalled.items():
            positions[key] = stall.position
        return positions

    def stalled_seconds(self) -> dict[WriterKey, float]:
        """Seconds each writer stalled now has been held back."""
        now = time.monotonic()
        return {key: now - stall.since for key, stall in self.stalled.items()}

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
        """Hand facts on again (a link started anew); stalled writers are retried."""
        self.held = False
        for stall in self.stalled.values():
            self._retry_later(stall)

    def stop_retrying(self) -> None:
        """Held, and stopping: wait for a fact being handed on in the background,
        then stop the background fills (the stalls stay, for :meth:`release`)."""
        self.held = True
        current = gevent.getcurrent()
        with self.lock:
            retries, self._retries = self._retries, {}
            for greenlet in retries.values():
                if greenlet is not current:
                    greenlet.kill(block=False)

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
        with self.lock:
            self.handing_on = True
            try:
                self._run(actions, rest)
            finally:
                self.handing_on = False
                self._pin_stalled()
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
                    if self.stalled and (action.stream, action.instance) in self.stalled:
                        self._held_back(action.stream, action.instance, action.token)
                        continue
                    self.handler(action.stream, action.instance, action.token, action.rows)
                    self.delivered += 1
                elif kind is FillGap:
                    assert isinstance(action, FillGap)
                    if self.held:
                        self._drop_rest(actions, index, rest)
                        break
                    if self.stalled and (action.stream, action.instance) in self.stalled:
                        self._held_back(action.stream, action.instance, action.upto_token)
                        continue
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
        """Hand on the facts of *gap* from the source; a source that cannot answer for
        the writer stalls it, one that never will leaves the gap unfilled."""
        from_token = gap.from_token
        try:
            self._fill_pages(gap)
        except CatchUpUnavailableError as exc:
            self._stall(gap.stream, gap.instance, self._reached(gap), gap.upto_token, exc)
        except (UnknownStreamError, UnknownWriterError) as exc:
            self.skip_gap(GapUnfilled(gap.stream, gap.instance, max(from_token, self._reached(gap)),
                                      gap.upto_token), str(exc))

    def _reached(self, gap: FillGap) -> int:
        """How far a failed fill of *gap* got (its positions were rewound there)."""
        position = self.state.positions.get((gap.stream, gap.instance))
        return gap.from_token if position is None else min(max(position, gap.from_token), gap.upto_token)

    def _fill_pages(self, gap: FillGap) -> None:
        source = self.source
        assert source is not None, "FillGap needs a source"
        stream, instance = gap.stream, gap.instance
        from_token = gap.from_token
        expect = gap.expect
        # A source that may be cut short (over the network) gets a page's worth of
        # patience here: a writer that hangs is then held back in the background
        # rather than holding every other writer's facts.
        patience = self.fill_patience if getattr(source, "interruptible", False) else None
        where = getattr(source, "where", None)
        try:
            for rows in _patiently(pages(source, stream, instance, from_token, gap.upto_token, FETCH_LIMIT),
                                   patience, stream, instance, where(instance) if callable(where) else ""):
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

    def skip_gap(self, gap: GapUnfilled, why: str = "no catch-up source for this stream") -> None:
        """Move past a gap nothing can fill: log it, count it, tell ``on_gap``."""
        self.unfilled[(gap.stream, gap.instance)] += 1
        logger.warning("missed facts of %s/%s after token %s (the writer is at %s) and cannot fetch "
                       "them: %s; going on from there",
                       gap.stream, gap.instance, gap.from_token, gap.upto_token, why)
        if self.on_gap is not None:
            self.on_gap(gap.stream, gap.instance, gap.from_token, gap.upto_token)
        self.state.skip_gap(gap)

    # --- writers whose source cannot answer now ----------------------------------------------

    def _stall(self, stream: str, instance: str, position: int, upto: int, exc: CatchUpUnavailableError) -> None:
        """Hold *instance* back at *position* (what was handed on) until the source
        answers for it up to *upto*; said once, counted, retried in the background."""
        key = (stream, instance)
        refused = isinstance(exc, CatchUpRefusedError)
        stall = Stall(stream, instance, position, upto, str(exc), time.monotonic(), refused)
        self.stalled[key] = stall
        self.stalls[key] += 1
        self.state.rewind(stream, instance, position)
        if refused:
            self.refusal = str(exc)
        # Said once: in the log, or by the application when it says it itself.
        logger.log(logging.INFO if self.on_stall is not None else logging.WARNING,
                   "holding back %s/%s at token %s (the writer is at %s): %s; the other writers go on, "
                   "and its facts are fetched again in the background until it answers "
                   "(streamrep_replication_client_stalled_seconds)", stream, instance, position, upto, exc)
        if self.on_stall is not None:
            self.on_stall(stall)
        self._retry_later(stall)

    def _held_back(self, stream: str, instance: str, token: int) -> None:
        """A fact or a gap of a stalled writer: not handed on (its fill covers it)."""
        stall = self.stalled[(stream, instance)]
        if token > stall.upto:
            stall.upto = token
        self.state.rewind(stream, instance, stall.position)

    def _pin_stalled(self) -> None:
        """Positions a read moved for a stalled writer (a ``POSITION`` with no gap)
        raise its target and go back to what was handed on."""
        positions = self.state.positions
        for key, stall in self.stalled.items():
            position = positions.get(key)
            if position is not None and position != stall.position:
                stall.upto = max(stall.upto, position)
                positions[key] = stall.position

    def _retry_later(self, stall: Stall) -> None:
        key = (stall.stream, stall.instance)
        running = self._retries.get(key)
        if not self.held and (running is None or running.dead):
            self._retries[key] = gevent.spawn(self._retry, stall)

    def _retry(self, stall: Stall) -> None:
        """Fill a stalled writer's gap in the background, with backoff, until it is
        filled (the writer resumes) or the follower is held."""
        key = (stall.stream, stall.instance)
        backoff = Backoff(self.retry_base, max(self.retry_base, self.retry_max))
        try:
            while not self.held and self.stalled.get(key) is stall:
                gevent.sleep(backoff.next_delay())
                if self.held:
                    return
                stall.attempts += 1
                try:
                    if self._refill(stall):
                        return
                except CatchUpUnavailableError as exc:
                    stall.problem = str(exc)
                    logger.debug("%s/%s still held back: %s", stall.stream, stall.instance, exc)
                except (UnknownStreamError, UnknownWriterError) as exc:
                    with self.lock:
                        self._give_up(stall, str(exc))
                    return
                except Exception:
                    logger.exception("filling %s/%s in the background failed; trying again", stall.stream,
                                     stall.instance)
        finally:
            if self._retries.get(key) is gevent.getcurrent():
                del self._retries[key]

    def _refill(self, stall: Stall) -> bool:
        """One background attempt: hand on the stalled writer's facts page by page
        (each page under :attr:`lock`, with :attr:`after_read` after it). True once
        it caught up with the writer and resumed."""
        source = self.source
        assert source is not None
        stream, instance = stall.stream, stall.instance
        while True:
            upto = stall.upto
            for rows in pages(source, stream, instance, stall.position, upto, FETCH_LIMIT):
                with self.lock:
                    if self.held or self.stalled.get((stream, instance)) is not stall:
                        return True
                    self._hand_on_page(stall, rows)
            with self.lock:
                if self.held or self.stalled.get((stream, instance)) is not stall:
                    return True
                self._pin_stalled()
                if stall.upto <= upto:  # nothing arrived meanwhile: caught up
                    self._resume(stall, upto)
                    return True

    def _hand_on_page(self, stall: Stall, rows: list[tuple[int, bytes]]) -> None:
        stream, instance = stall.stream, stall.instance
        key = (stream, instance)
        try:
            self.handing_on = True
            try:
                for fact in self.state.gap_facts(stream, instance, stall.position, rows):
                    if self.held:
                        break
                    self.handler(stream, instance, fact.token, fact.rows)
                    self.delivered += 1
                    stall.position = fact.token
                    self.state.positions[key] = fact.token
            finally:
                self.handing_on = False
            if self.after_read is not None:
                self.after_read(self)
        finally:
            # A keeper whose transaction failed went back to what it committed.
            rewound = self.state.positions.get(key)
            if rewound is not None and rewound < stall.position:
                stall.position = rewound

    def _resume(self, stall: Stall, upto: int) -> None:
        """The stalled writer's gap is filled up to *upto*: it goes on from there."""
        key = (stall.stream, stall.instance)
        del self.stalled[key]
        if stall.refused and not any(s.refused for s in self.stalled.values()):
            self.refusal = None
        self.state.positions[key] = max(stall.position, upto)
        logger.log(logging.INFO if self.on_resume is not None else logging.WARNING,
                   "%s/%s answers again: handed on what it held back, up to token %s; following it again",
                   stall.stream, stall.instance, self.state.positions[key])
        if self.on_resume is not None:
            self.on_resume(stall)
        if self.after_read is not None:
            self.after_read(self)

    def _give_up(self, stall: Stall, why: str) -> None:
        """The source will never hold this writer's rows: an unfilled gap."""
        key = (stall.stream, stall.instance)
        del self.stalled[key]
        self.skip_gap(GapUnfilled(stall.stream, stall.instance, stall.position, stall.upto), why)
        if self.after_read is not None:
            self.after_read(self)

    # --- feeding commands by hand (tests, embedding) -----------------------------------------

    # The state moves as it reads a command: reading and handing on are one step
    # under the lock, so a background fill never sees a position ahead of its facts.

    def on_rdata(self, stream: str, instance: str, token: int | None, row: Any) -> None:
        """One ``RDATA`` row; *token* None means ``batch``."""
        out: list[Action] = []
        with self.lock:
            self.state.rdata(stream, instance, token, row, out)
            self.run(out)

    def on_rdata_run(self, stream: str, instance: str, token: int | None, commands: list[Any]) -> None:
        """Consecutive ``RDATA`` commands of one writer, all ``batch`` but the last,
        whose token is *token* (None: the fact goes on in a later read)."""
        out: list[Action] = []
        with self.lock:
            self.state.rdata_run(stream, instance, token, commands, out)
            self.run(out)

    def on_position(self, stream: str, instance: str, prev_token: int, new_token: int) -> bool:
        """A ``POSITION``. Returns False when a gap needs filling and there is no
        source to fill it from (the position is then left alone)."""
        out: list[Action] = []
        with self.lock:
            self.state.position(stream, instance, prev_token, new_token, out)
            if any(type(action) is GapUnfilled for action in out):
                return False
            self.run(out)
        return True

    def catch_up(self, stream: str, instance: str, upto_token: int) -> None:
        """Deliver facts from this reader's position up to *upto_token* from the source."""
        key = (stream, instance)
        with self.lock:
            base = self.state.base(key)
            if base is None or self.source is None:
                return
            if upto_token > self.positions.get(key, base):
                self.positions[key] = upto_token
            self.run([FillGap(stream, instance, base, upto_token)])


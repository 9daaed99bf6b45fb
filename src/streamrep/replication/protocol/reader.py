"""A reader's position per writer, as actions: replays dropped, gaps found."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import orjson

from streamrep.replication import commands as C
from streamrep.replication.protocol.actions import Action, Fact, FillGap, GapUnfilled, Refused

__all__ = ["FollowerState", "group_facts", "WriterKey", "Positions", "StartFrom"]

#: A writer of a stream: ``(stream, instance)``.
WriterKey = tuple[str, str]
#: Where a reader is: ``{(stream, instance): token}``.
Positions = dict[WriterKey, int]
#: Where a reader starts: a token per stream (every writer of it), per writer, or both.
StartFrom = Mapping[str, int] | Mapping[WriterKey, int] | Mapping[str | WriterKey, int]

_rdata_rows = C.rdata_rows
_loads = orjson.loads


def group_facts(rows: Sequence[tuple[int, bytes]]) -> list[tuple[int, list[Any]]]:
    """Group ``(token, row_json)`` rows (token order) into facts ``(token, rows)``."""
    if not rows:
        return []
    # One decoder call for the whole page rather than one per row.
    decoded = _loads(b"[" + b",".join([row_json for _token, row_json in rows]) + b"]")
    facts: list[tuple[int, list[Any]]] = []
    last = None
    for (token, _row_json), row in zip(rows, decoded):
        if token == last:
            facts[-1][1].append(row)
        else:
            facts.append((token, [row]))
            last = token
    return facts


class FollowerState:
    """A reader's position per ``(stream, instance)``, as actions.

    ``RDATA`` ``batch`` rows wait for the row with the token; a fact at or below
    the writer's position is a replay and is dropped; a ``POSITION`` whose
    ``prev_token`` is past the position is a gap: :class:`FillGap` when the
    reader has a catch-up source (*can_fill*), :class:`GapUnfilled` otherwise.

    Where a writer starts: its position once it has one, else *start_from* (a
    token per ``(stream, instance)`` or per stream), else *new_writers_from*: 0
    for a reader whose start is defined (resumed from a cursor, or from its
    database's positions), so a writer it meets later is followed from its
    first fact; None for a reader "from now on" with nothing to resume, which
    starts each writer where its first ``POSITION`` says it is.

    *verify* ``(stream, instance) -> stored token`` makes every ``RDATA`` and
    ``POSITION`` a notification checked against the database the reader fills
    from (a bus where anyone may publish): a token past what the database holds
    is :class:`Refused` and moves nothing; anything else becomes a
    :class:`FillGap` up to it, carrying the rows heard (``expect``) so the
    transport can compare them with the stored ones. The stored token is read
    again only when a token passes the last value read.

    Positions move when the actions are made; a transport whose handler fails
    calls :meth:`rewind` with the actions it did not finish.
    """

    def __init__(self, streams: Iterable[str] | None = None, start_from: StartFrom | None = None,
                 can_fill: bool = False, *, new_writers_from: int | None = None,
                 verify: Callable[[str, str], int] | None = None) -> None:
        self.streams = frozenset(streams) if streams is not None else None
        self.start_from: dict[str | WriterKey, int] = {key: token for key, token in (start_from or {}).items()}
        self.can_fill = can_fill
        self.new_writers_from = new_writers_from
        self.verify = verify
        self.positions: Positions = {}
        self._pending: dict[tuple[str, str], list[Any]] = {}
        self._stored: dict[tuple[str, str], int] = {}

    def follows(self, stream: str) -> bool:
        return self.streams is None or stream in self.streams

    def base(self, key: tuple[str, str]) -> int | None:
        """Where the reader is for *key*: its position, else its configured start."""
        pos = self.positions.get(key)
        if pos is not None:
            return pos
        base = self.start_from.get(key)
        if base is None:
            base = self.start_from.get(key[0])
            if base is None:
                return self.new_writers_from
        return base

    def connection_lost(self) -> None:
        """Forget half-received batches: facts are always resent whole."""
        self._pending.clear()

    def rdata(self, stream: str, instance: str, token: int | None, row: Any, out: list[Action]) -> None:
        """One decoded ``RDATA`` row (*token* None: ``batch``)."""
        if self.streams is not None and stream not in self.streams:
            return
        key = (stream, instance)
        if token is None:
            self._pending.setdefault(key, []).append(row)
            return
        pending = self._pending.pop(key, None)
        self._fact(key, token, pending + [row] if pending else [row], out)

    def rdata_run(self, stream: str, instance: str, token: int | None, commands: list[Any],
                  out: list[Action]) -> None:
        """Consecutive ``RDATA`` commands of one writer, all ``batch`` but the last
        (whose token is *token*; None: the fact goes on in a later read). Rows of a
        dropped fact are never decoded."""
        if self.streams is not None and stream not in self.streams:
            return
        key = (stream, instance)
        if token is None:
            waiting = self._pending.get(key)
            rows = list(commands) if self.verify is not None else _rdata_rows(commands)
            if waiting is None:
                self._pending[key] = rows
            else:
                waiting.extend(rows)
            return
        pending = self._pending.pop(key, None)
        pos = self.positions.get(key)
        base = pos if pos is not None else self.base(key)
        if base is not None and token <= base:
            return
        if self.verify is not None:
            heard = [c.row_json for c in pending] if pending else []
            heard.extend(c.row_json for c in commands)
            self._verified(stream, instance, base, token, heard, out)
            return
        if pending:
            pending.extend(_rdata_rows(commands))
            rows = pending
        else:
            rows = _rdata_rows(commands)
        self.positions[key] = token
        out.append(Fact(stream, instance, token, rows, base))

    def _fact(self, key: tuple[str, str], token: int, rows: list[Any], out: list[Action]) -> None:
        base = self.base(key)
        if base is not None and token <= base:
            return
        self.positions[key] = token
        out.append(Fact(key[0], key[1], token, rows, base))

    def position(self, stream: str, instance: str, prev_token: int, new_token: int, out: list[Action]) -> None:
        """A ``POSITION``."""
        if self.streams is not None and stream not in self.streams:
            return
        key = (stream, instance)
        self._pending.pop(key, None)
        base = self.base(key)
        if self.verify is not None and base is not None:
            # Only the database says where the writer is: fill up to the position
            # if the database holds it, whatever prev_token claims.
            if new_token > base:
                self._verified(stream, instance, base, new_token, None, out)
            return
        if base is None:
            self.positions[key] = new_token
            return
        if prev_token > base:
            if not self.can_fill:
                # A writer met for the first time keeps its start as its position,
                # so resuming through the hub asks for its stream from there.
                self.positions.setdefault(key, base)
                out.append(GapUnfilled(stream, instance, base, prev_token))
                return
            out.append(FillGap(stream, instance, base, new_token))
        if new_token > self.positions.get(key, base):
            self.positions[key] = new_token
        elif key not in self.positions:
            self.positions[key] = base

    def _verified(self, stream: str, instance: str, base: int | None, token: int, heard: list[bytes] | None,
                  out: list[Action]) -> None:
        """A writer said it reached *token* (with the rows *heard* of that fact, or
        none for a ``POSITION``): fill up to it from the database, or refuse it."""
        key = (stream, instance)
        assert self.verify is not None
        if token > self._stored.get(key, -1):
            self._stored[key] = self.verify(stream, instance)
            if token > self._stored[key]:
                out.append(Refused(stream, instance, f"token {token} is past what the database holds "
                                                     f"({self._stored[key]})"))
                return
        start = base if base is not None else token - 1
        last = out[-1] if out else None
        if (type(last) is FillGap and last.stream == stream and last.instance == instance
                and last.upto_token == start):
            last.upto_token = token  # one database read for consecutive facts of a writer
            gap = last
        else:
            gap = FillGap(stream, instance, start, token)
            out.append(gap)
        if heard is not None:
            if gap.expect is None:
                gap.expect = {}
            gap.expect[token] = heard
        self.positions[key] = token

    def stored_positions(self, stored: Mapping[tuple[str, str], int]) -> list[Action]:
        """A verifying reader's look at its database: fill every writer whose stored
        position *stored* gives is past the reader's (facts nobody announced: their
        writer crashed after committing, or lost its link). Writers it does not
        follow yet start where :meth:`base` says."""
        out: list[Action] = []
        for (stream, instance), token in stored.items():
            if not self.follows(stream):
                continue
            base = self.base((stream, instance))
            if base is not None and token > base:
                self._verified(stream, instance, base, token, None, out)
        return out

    def gap_facts(self, stream: str, instance: str, after: int, rows: Sequence[tuple[int, bytes]]) -> list[Fact]:
        """Facts of database rows ``(token, row_json)`` filling a gap, past *after*
        (rows at or below it were delivered already)."""
        out: list[Fact] = []
        prev = after
        for token, fact_rows in group_facts(rows):
            if token <= prev:
                continue
            out.append(Fact(stream, instance, token, fact_rows, prev))
            prev = token
        return out

    def skip_gap(self, gap: GapUnfilled) -> None:
        """Accept that a gap will not be filled: move past it."""
        key = (gap.stream, gap.instance)
        if gap.upto_token > self.positions.get(key, gap.from_token):
            self.positions[key] = gap.upto_token

    def rewind(self, stream: str, instance: str, token: int | None) -> None:
        """The application did not take facts after *token*: go back there (None:
        the writer was never seen)."""
        key = (stream, instance)
        if token is None:
            self.positions.pop(key, None)
        elif token < self.positions.get(key, token + 1):
            self.positions[key] = token

    def rewind_unfinished(self, actions: Iterable[Action]) -> None:
        """Rewind for every :class:`Fact` and :class:`FillGap` not carried out."""
        for action in actions:
            if type(action) is Fact:
                self.rewind(action.stream, action.instance, action.prev)
            elif type(action) is FillGap:
                self.rewind(action.stream, action.instance, action.from_token)

    def resume_tokens(self) -> dict[str, int]:
        """Per stream, the token to resume from through the hub: the lowest position
        over its writers (facts already seen are dropped on arrival)."""
        tokens: dict[str, int] = {}
        for (stream, _instance), pos in self.positions.items():
            tokens[stream] = min(pos, tokens.get(stream, pos))
        for key, base in self.start_from.items():
            stream = key if isinstance(key, str) else key[0]
            if isinstance(key, str) and stream in tokens:
                continue  # every writer the hub knows has a position already
            tokens[stream] = min(base, tokens.get(stream, base))
        return tokens

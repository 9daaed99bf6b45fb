"""Checking one batch of events against the Matrix room rules (pure: the event
store hands in the rooms' models and a reader of their current state).

Each event is checked, the batch's own state events before the events that cite
them, against:

* **its auth events** - failing makes it *rejected*: it fails the authorization
  rules against them, cites auth events the room does not hold, or rejected ones.
  An out-of-band membership (an outlier invite, leave or knock in a room whose
  create event is not held) is accepted unchecked;
* **the room's current state** - a live, non-outlier event that passes against its
  auth events but fails here is *soft-failed*.

:class:`BatchCheck` gathers the verdicts and the rows of the rules' tables as it
goes and hands them over as one :class:`~streamrep.matrix.verdict.Verdict`.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

import orjson

from streamrep import _impl
from streamrep.matrix import auth
from streamrep.matrix.errors import AuthRejection, MatrixError, RejectionReason
from streamrep.matrix.events import (
    ALIASES,
    CREATE,
    CREATE_KEY,
    JOIN_RULES_KEY,
    MEMBER,
    POWER_LEVELS_KEY,
    REDACTION,
    THIRD_PARTY_INVITE,
    MatrixEvent,
    StateKey,
    create_event_id_for_room,
    parse_event,
)
from streamrep.matrix.room_versions import RoomVersion, room_version
from streamrep.matrix.roommodel import RoomModel, known_version, parse_held, version_of
from streamrep.matrix.verdict import Rejection, StateReader, Verdict

if TYPE_CHECKING:
    from streamrep._pure import plaincheck as _plaincheck
else:
    _plaincheck = _impl.load("plaincheck")

__all__ = ["BatchCheck", "CurrentState", "NOT_PLAIN"]

#: Memberships a server may hold for a room it has not joined (out-of-band).
_OUT_OF_BAND = frozenset({"invite", "leave", "knock"})
_STR_ONLY = frozenset({str})
#: Event types whose authorization reads more than their type, sender and auth events.
NOT_PLAIN = frozenset({CREATE, MEMBER, ALIASES, THIRD_PARTY_INVITE, REDACTION})
_FLAGGED = Rejection("flagged", "persisted with the rejected flag")


class BatchCheck:
    """The check of one batch: call :meth:`check_room` for each room's records,
    then take the :meth:`verdict`."""

    def __init__(self) -> None:
        self._rejected: dict[str, Rejection] = {}
        self._soft_failed: set[str] = set()
        # The auth event IDs of the checked events, for their event_auth rows.
        self._auth_ids: dict[str, tuple[str, ...]] = {}
        # The batch's state events (only they have event_auth rows) and their rooms.
        self._state_records: list[Any] = []
        self._models: dict[str, RoomModel] = {}

    def check_room(self, model: RoomModel, records: list[Any],
                   current: CurrentState | None) -> None:
        """Check *records*, the batch's events of *model*'s room (in the order
        given, but for citations of the batch's state events as auth events);
        *current* reads the room's current state (None: no soft-failure checks,
        as for backfilled events)."""
        self._models[model.room_id] = model
        version = model.version
        # Plain events of the usual shape are checked from the fields validation
        # read (see _check_plain); the others are decoded here and parsed in full.
        scan = _plaincheck.scan_batch(
            records, model.room_id,
            create_event_id_for_room(model.room_id)
            if version is not None and version.room_id_from_create_event else None,
            NOT_PLAIN if version is not None else None, MEMBER)
        if current is not None:
            current.prefetch(_keys_likely_read(scan), scan.senders)
        state_records = [r for r in scan.others if r.state_key is not None]
        self._state_records.extend(state_records)
        plain = scan.plain
        bodies: dict[str, dict[str, Any]] = {}
        other_cites: dict[str, Sequence[str]] = {}
        for r in scan.others:
            body = bodies[r.event_id] = orjson.loads(r.json)
            other_cites[r.event_id] = _listed_auth(body)
        model.bound_memos()
        # Soft-failure verdicts of plain events by (sender, type) (see CurrentState).
        plain_verdicts = current.plain_verdicts if current is not None else None
        ordered = _topological(records, plain, other_cites,
                               {r.event_id for r in state_records})
        settled_until = _plaincheck.settled_until
        i, count = 0, len(ordered)
        while True:
            # The records the verdicts of an earlier event settle pass.
            i = settled_until(ordered, i, plain, model.passed, plain_verdicts)
            if i == count:
                return
            record = ordered[i]
            ids = plain.get(record.event_id)
            if ids is None:
                self._check(model, record, bodies[record.event_id], current)
            else:
                self._check_plain(model, record, ids, current)
            i += 1

    def verdict(self) -> Verdict:
        """The verdicts of every room checked, and the rows of the rules' tables."""
        rejected = self._rejected
        auth_rows: list[tuple[str, str, str]] = []
        room_versions: list[tuple[str, str]] = []
        checked = self._auth_ids
        for record in self._state_records:
            event_id, room_id = record.event_id, record.room_id
            ids: Sequence[str] | None = checked.get(event_id)
            if ids is None:  # not checked: stored unchecked, or its room had no version
                ids = _listed_auth(orjson.loads(record.json))
            if len(set(ids)) != len(ids):  # listed twice (it was rejected): one row each
                ids = list(dict.fromkeys(ids))
            auth_rows.extend([(event_id, auth_id, room_id) for auth_id in ids])
            if record.type == CREATE and record.state_key == "" and event_id not in rejected:
                version = self._models[room_id].version
                if version is not None:
                    room_versions.append((room_id, version.identifier))
        return Verdict(rejected, frozenset(self._soft_failed), auth_rows, room_versions)

    def _reject(self, record: Any, rejection: Rejection) -> None:
        self._rejected[record.event_id] = rejection

    def _soft_fail(self, record: Any) -> None:
        if not record.soft_failed:
            self._soft_failed.add(record.event_id)

    def _check_plain(self, model: RoomModel, record: Any, auth_ids: tuple[str, ...],
                     current: CurrentState | None) -> None:
        """:meth:`_check` for a plain event of the usual shape (see
        ``plaincheck.scan_batch``): the verdicts are memoized by what they read,
        so the event is parsed only when one is worked out."""
        if record.rejected:
            self._reject(record, _FLAGGED)
            return
        version = model.version
        assert version is not None
        event: MatrixEvent | None = None
        seen = (auth_ids, record.sender, record.type)
        passed = model.passed
        if seen not in passed:
            event = parse_event(record.event_id, orjson.loads(record.json), version)
            try:
                auth.authorize(event, version, model.source.events, model.source.rejected)
            except AuthRejection as exc:
                self._reject(record, Rejection(exc.reason.value, exc.detail))
                return
            passed[seen] = True
        if current is not None and not record.outlier:
            fails = current.plain_verdicts.get((record.sender, record.type))
            if fails is None:
                if event is None:
                    event = parse_event(record.event_id, orjson.loads(record.json), version)
                fails = current.fails_plain(event, version)
            if fails:
                self._soft_fail(record)

    def _versionless(self, model: RoomModel, record: Any,
                     body: dict[str, Any]) -> Rejection | None:
        """The check of an event of a room without a version: a create event gives
        the room its version (then None: check it); an out-of-band membership is
        accepted unchecked (then None too); anything else is rejected."""
        if record.type == CREATE and record.state_key == "":
            model.version = room_version(version_of(body)) if known_version(body) else None
        elif record.outlier and record.membership in _OUT_OF_BAND:
            # An out-of-band membership (an invite received over federation, its
            # rejection, a knock) in a room whose auth events are not held: stored
            # unchecked, as Matrix servers store them.
            return None
        if model.version is not None:
            return None
        if record.type == CREATE:
            return Rejection(RejectionReason.BAD_CREATE_EVENT.value,
                             "the create event names no known room version")
        missing = sorted(a for a in _listed_auth(body) if a not in model.source.events)
        if missing:
            return Rejection(RejectionReason.MISSING_AUTH_EVENTS.value,
                             f"auth events not held: {', '.join(missing)}")
        return Rejection(RejectionReason.NO_CREATE_EVENT.value, "the room has no create event")

    def _check(self, model: RoomModel, record: Any, body: dict[str, Any],
               current: CurrentState | None) -> None:
        if model.version is None:
            rejection = self._versionless(model, record, body)
            if rejection is not None:
                self._reject(record, rejection)
                return
            if model.version is None:
                return  # an out-of-band membership, accepted unchecked
        version = model.version
        try:
            event = parse_held(record.event_id, body, version)
        except MatrixError as exc:
            self._reject(record, Rejection(RejectionReason.MALFORMED.value, str(exc)))
            return
        self._auth_ids[event.event_id] = event.auth_ids
        if event.room_id != record.room_id:
            # Version 12: the room ID must be the one the create event defines.
            self._reject(record, Rejection(
                RejectionReason.BAD_CREATE_EVENT.value,
                f"room {record.room_id} is not the room {event.room_id} this create event "
                "defines"))
            return
        plain = event.state_key is None and event.type not in NOT_PLAIN
        rejection, keys = self._against_auth_events(model, record, event, plain)
        soft_failed = record.soft_failed
        if rejection is not None:
            self._reject(record, rejection)
        elif current is not None and not record.outlier:
            if plain:
                fails = current.fails_plain(event, version)
            else:
                fails = current.fails(event, version, keys if keys is not None
                                      else auth.auth_types_for_event(event, version))
            if fails:
                self._soft_fail(record)
                soft_failed = True
        if event.state_key is not None:
            model.add(event, rejected=rejection is not None)
            if current is not None and rejection is None and not soft_failed and (
                    not record.outlier):
                current.apply(event)

    def _against_auth_events(self, model: RoomModel, record: Any, event: MatrixEvent,
                             plain: bool) -> tuple[Rejection | None, set[StateKey] | None]:
        """The rejection of *event* by its auth events (None when it passes), and its
        ``auth_types_for_event`` when they were worked out."""
        if record.rejected:
            return _FLAGGED, None
        version = model.version
        assert version is not None
        # A plain non-state event's verdict depends only on its type, its sender and
        # its auth events: messages citing the same auth events as one that passed
        # pass too. Not one listing the create event its room ID names (version 12):
        # its auth event IDs are those of one that does not, but listing it is what
        # the rules forbid.
        passed = model.passed
        seen = (event.auth_ids, event.sender, event.type) if plain and not (
            version.room_id_from_create_event
            and create_event_id_for_room(event.room_id) in event.auth_events) else None
        if seen is not None and seen in passed:
            return None, None
        keys = auth.auth_types_for_event(event, version)
        try:
            auth.authorize(event, version, model.source.events, model.source.rejected,
                           allowed=keys)
        except AuthRejection as exc:
            return Rejection(exc.reason.value, exc.detail), keys
        if seen is not None:
            passed[seen] = True
        return None, keys


class CurrentState:
    """A room's current state as the batch's checks read it, key by key, through
    the store's *reader*, with the changes the batch's accepted state events make."""

    def __init__(self, reader: StateReader, model: RoomModel) -> None:
        self._reader = reader
        self._room_id = model.room_id
        self._model = model
        # The keys read so far and those the batch's events changed.
        self._state: dict[StateKey, str | None] = {}
        #: Soft-failure verdicts of plain events by (sender, type): they read only the
        #: create event, the power levels and the sender's membership (the keys of
        #: auth_types_for_event), so they hold until an event for one of those keys
        #: enters the current state.
        self.plain_verdicts: dict[tuple[str, str], bool] = {}

    def prefetch(self, keys: set[StateKey], senders: Iterable[str] = ()) -> None:
        """Read *keys* now, at once, rather than one by one later (the current state
        does not change until the batch's rows are written), and take up the room's
        soft-failure verdicts of *senders*' plain events whose state is still
        current."""
        self._fetch(keys)
        memo = self._model.plain_memo
        if not memo:
            return
        state = self._state
        for sender in senders:
            for etype, (verdict, read) in memo.get(sender, {}).items():
                for key, event_id in read:
                    if key not in state:
                        self._fetch({key})
                    if state[key] != event_id:
                        break
                else:
                    self.plain_verdicts[(sender, etype)] = verdict

    def _fetch(self, keys: set[StateKey]) -> None:
        state = self._state
        wanted = [k for k in keys if k not in state]
        if not wanted:
            return
        found = self._reader.read(self._room_id, wanted)
        for key in wanted:
            state[key] = found.get(key)

    def fails(self, event: MatrixEvent, version: RoomVersion, keys: set[StateKey]) -> bool:
        """True when *event*, which passed against its auth events, fails against
        the current state's events for *keys* (its ``auth_types_for_event``)."""
        self._fetch(keys)
        state = self._state
        held = self._model.source.events
        now_ids = {event_id for event_id in map(state.__getitem__, keys)
                   if event_id is not None and event_id in held}
        if now_ids == frozenset(event.auth_ids):
            return False  # citing exactly those events, it has just passed against them
        now: dict[StateKey, MatrixEvent] = {}
        for key in keys:
            event_id = state[key]
            if event_id is not None and event_id in now_ids:
                now[key] = held[event_id]
        try:
            auth.check_against_state(event, version, now)
        except AuthRejection:
            return True
        return False

    def fails_plain(self, event: MatrixEvent, version: RoomVersion) -> bool:
        """True when a plain event (see :data:`NOT_PLAIN`) fails against the current
        state."""
        memo = (event.sender, event.type)
        verdict = self.plain_verdicts.get(memo)
        if verdict is None:
            keys = auth.auth_types_for_event(event, version)
            verdict = self.fails(event, version, keys)
            self.plain_verdicts[memo] = verdict
            read = tuple((key, self._state.get(key)) for key in keys)
            self._model.plain_memo.setdefault(event.sender, {})[event.type] = (verdict, read)
        return verdict

    def apply(self, event: MatrixEvent) -> None:
        """*event* (accepted) enters the current state: drop the verdicts that read
        its key. (Events held but not current are read by no verdict.)"""
        key = event.key
        self._state[key] = event.event_id
        if not self.plain_verdicts:
            return
        if key[0] == MEMBER:
            for memo in [m for m in self.plain_verdicts if m[0] == key[1]]:
                del self.plain_verdicts[memo]
        elif key == POWER_LEVELS_KEY or key == CREATE_KEY:
            self.plain_verdicts.clear()


def _topological(records: list[Any], plain: Mapping[str, Sequence[str]],
                 other_cites: Mapping[str, Sequence[str]], held_here: set[str]) -> list[Any]:
    """Batch records with the batch's state events (*held_here*) they cite as auth
    events first (*plain* and *other_cites* give each record's auth events: the
    plain records' and the others').

    Only state events are held as auth events, so an event citing another kind of
    event of the batch fails alike whichever of the two is checked first."""
    if not held_here or not (_cites_any(plain.values(), held_here)
                             or _cites_any(other_cites.values(), held_here)):
        return records  # the usual case: they cite stored events only
    cites = {**plain, **other_cites}
    by_id = {r.event_id: r for r in records}
    waiting: dict[str, int] = {}
    children: dict[str, list[str]] = {}
    for r in records:
        listed = cites[r.event_id]
        if held_here.isdisjoint(listed):  # the usual case: it cites stored events only
            waiting[r.event_id] = 0
            continue
        cited = {a for a in listed if a in held_here and a != r.event_id}
        waiting[r.event_id] = len(cited)
        for a in cited:
            children.setdefault(a, []).append(r.event_id)
    if not children:
        return records
    position = {r.event_id: i for i, r in enumerate(records)}
    ready = [(position[e], e) for e, n in waiting.items() if n == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, eid = heapq.heappop(ready)
        out.append(by_id[eid])
        for child in children.get(eid, ()):
            waiting[child] -= 1
            if waiting[child] == 0:
                heapq.heappush(ready, (position[child], child))
    if len(out) < len(records):  # a cycle: its events cite each other; keep given order
        seen = {r.event_id for r in out}
        out.extend(r for r in records if r.event_id not in seen)
    return out


def _cites_any(listings: Iterable[Sequence[str]], held_here: set[str]) -> bool:
    """Whether any of *listings* (auth event IDs) names one of *held_here*."""
    last = None
    for listed in listings:
        # Records listing the same auth events as the one before mostly share its
        # sequence (see plaincheck.scan_batch): each is looked at once.
        if listed is not last:
            last = listed
            if not held_here.isdisjoint(listed):
                return True
    return False


def _keys_likely_read(scan: Any) -> set[StateKey]:
    """The current state's keys that checking the batch *scan* (a
    ``plaincheck.BatchScan``) describes will most likely read: the create event, the
    power levels, each sender's membership and, for membership events, the target's
    and the join rules (see ``auth_types_for_event``)."""
    keys = {CREATE_KEY, POWER_LEVELS_KEY}
    users = scan.senders
    if scan.member_targets:
        keys.add(JOIN_RULES_KEY)
        users = users | scan.member_targets
    keys.update((MEMBER, user) for user in users)
    return keys


def _listed_auth(body: Mapping[str, Any]) -> list[str]:
    listed = body.get("auth_events", ()) or ()
    if type(listed) is list and _STR_ONLY.issuperset(map(type, listed)):
        return list(listed)  # the usual case: event IDs only
    out = []
    for item in listed:
        if isinstance(item, list) and item:
            item = item[0]
        if isinstance(item, str):
            out.append(item)
    return out

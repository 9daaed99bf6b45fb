"""The Matrix room rules at the event store's door, and its state resolver.

:class:`RoomRules` keeps, per room, the room version and every stored state event
(auth events are always state events) in memory with an auth chain index, loading a
room from the database the first time a batch or a resolution touches it. For each
batch it decides, before anything is written:

* **rejected** - the event fails the authorization rules against its own auth
  events (or cites auth events streamrep does not hold, or rejected ones). The
  event is stored with the ``rejected`` flag (never in state, never an extremity)
  and a ``rejections`` row with the reason. An out-of-band membership (an outlier
  invite, leave or knock in a room whose create event is not held) is stored
  unchecked;
* **soft-failed** - a live, non-outlier event that passes against its auth events
  but fails against the room's current state. It is stored with the
  ``soft_failed`` flag (not an extremity, not sent to clients).

With the batch's rows, :meth:`RoomRules.queue_rows` queues its ``event_auth`` (of
state events, as the reference system stores them), ``rejections`` and ``rooms``
rows, written in the same transaction and round trip.
:class:`MatrixStateResolver` is the store's :class:`StateResolver` that resolves
with the algorithm of the room's version over that in-memory room.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import orjson

from streamrep import _impl
from streamrep.matrix import auth
from streamrep.matrix import schema as _schema
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
from streamrep.matrix.room_versions import DEFAULT_ROOM_VERSION, RoomVersion, room_version
from streamrep.matrix.stateres import InMemoryEventSource, resolve_state

if TYPE_CHECKING:
    from streamrep.db.database import Database, Transaction
    from streamrep.events.writes import Writes

__all__ = ["KnownState", "Rejection", "RoomModel", "RoomRules", "MatrixStateResolver"]

#: A room's current state held in memory, or None when it is not held.
KnownState = Callable[[str], "Mapping[StateKey, str] | None"]

#: Current-state keys looked up by one query: three values each, within the 999
#: values any SQLite build binds.
_KEYS_PER_QUERY = 333
#: Memberships a server may hold for a room it has not joined (out-of-band).
_OUT_OF_BAND = frozenset({"invite", "leave", "knock"})
_STR_ONLY = frozenset({str})
_plaincheck = _impl.load("plaincheck")
_batchrows = _impl.load("batchrows")
#: Event types whose authorization reads more than their type, sender and auth events.
_NOT_PLAIN = frozenset({CREATE, MEMBER, ALIASES, THIRD_PARTY_INVITE, REDACTION})
#: Entries a room model's verdict memos hold before they are emptied: one per
#: (auth events, sender, type) and per (sender, type) seen, so a room of many senders
#: cannot grow them without bound.
_MAX_MEMO = 4096

#: A soft-failure verdict and the current state it read: ``(key, event ID)`` pairs.
PlainVerdict = tuple[bool, tuple[tuple[StateKey, "str | None"], ...]]


@dataclass(frozen=True)
class Rejection:
    """Why an event was rejected: a :class:`RejectionReason` value and one line."""

    reason: str
    detail: str


class RoomModel:
    """One room as the rules see it: its version and its state events."""

    def __init__(self, room_id: str, version: RoomVersion | None) -> None:
        self.room_id = room_id
        self.version = version
        self.source = InMemoryEventSource()
        #: Events of the room stored as outliers (a non-outlier copy de-outliers them).
        self.outliers: set[str] = set()
        #: ``(auth event IDs, sender, type)`` of plain events (see ``_NOT_PLAIN``)
        #: that passed against their auth events. Held events never change, so such a
        #: verdict holds from batch to batch until a held event is replaced or one is
        #: added rejected (see :meth:`RoomRules._check`).
        self.passed: dict[tuple[tuple[str, ...], str, str], bool] = {}
        #: Soft-failure verdicts of plain events, sender -> type -> verdict and the
        #: current state it read; a batch uses those whose state is still current.
        self.plain_memo: dict[str, dict[str, PlainVerdict]] = {}

    def add(self, event: MatrixEvent, rejected: bool) -> None:
        """Hold *event* (a state event) for later authorization and resolution."""
        if self.passed and (rejected or event.event_id in self.source.events):
            self.passed.clear()  # a held event replaced or rejected: verdicts may change
        self.source.add(event, rejected=rejected)

    def bound_memos(self) -> None:
        """Empty the verdict memos that have grown past their bound."""
        if len(self.passed) > _MAX_MEMO:
            self.passed.clear()
        if len(self.plain_memo) > _MAX_MEMO:
            self.plain_memo.clear()


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


class RoomRules:
    """Authorization at persist and room models for state resolution (see module)."""

    def __init__(self, max_rooms: int = 256) -> None:
        self._rooms: OrderedDict[str, RoomModel] = OrderedDict()
        self._max_rooms = max_rooms
        self._db: Database | None = None
        # The auth event IDs of the last batch's events, for their event_auth rows.
        self._auth_ids: dict[str, tuple[str, ...]] = {}
        self._batch: list[Any] | None = None
        # Events of the last batch stored before as outliers: their rows are replaced.
        self._deoutliered: set[str] = set()
        # The last batch's state events: only they have event_auth rows.
        self._state_records: list[Any] = []
        # The flags the checks of the last batch set: (record, "rejected" or
        # "soft_failed").
        self._flagged: list[tuple[Any, str]] = []
        self.resolver = MatrixStateResolver(self)

    def attach(self, db: Database) -> None:
        """Use *db* (its ``matrix`` tables are created or brought up to date)."""
        db.ensure_schema(_schema.COMPONENT)
        self._db = db

    def forget(self, room_id: str | None = None) -> None:
        """Drop the in-memory room (all rooms when None): after a failed batch, or
        when another process wrote the room."""
        if room_id is None:
            self._rooms.clear()
        else:
            self._rooms.pop(room_id, None)

    # --- loading -------------------------------------------------------------------

    def room(self, txn: Transaction, room_id: str) -> RoomModel:
        """The room's model, loaded through *txn* when not held."""
        model = self._rooms.get(room_id)
        if model is not None:
            self._rooms.move_to_end(room_id)
            return model
        model = self._load(txn, room_id)
        self._rooms[room_id] = model
        while len(self._rooms) > self._max_rooms:
            self._rooms.popitem(last=False)
        return model

    def _load(self, txn: Transaction, room_id: str) -> RoomModel:
        stored = txn.fetchval("SELECT room_version FROM rooms WHERE room_id = ?", (room_id,))
        version = room_version(stored) if stored is not None else None
        rows = txn.fetchall(
            "SELECT event_id, json, rejected FROM events"
            " WHERE room_id = ? AND state_key IS NOT NULL", (room_id,))
        bodies = []
        for event_id, raw, rejected in rows:
            body = orjson.loads(bytes(raw))
            bodies.append((event_id, body, bool(rejected)))
            if version is None and body.get("type") == CREATE and body.get("state_key") == "":
                version = _version_of(body)
        model = RoomModel(room_id, version)
        model.outliers.update(row[0] for row in txn.fetchall(
            "SELECT event_id FROM events WHERE room_id = ? AND outlier", (room_id,)))
        if version is not None:
            for event_id, body, rejected in bodies:
                try:
                    model.add(_parse(event_id, body, version), rejected)
                except MatrixError:
                    continue  # stored before these rules; it can authorize nothing
        return model

    # --- the batch -----------------------------------------------------------------

    def check_batch(self, txn: Transaction, records: list[Any], backfilled: bool = False,
                    known_state: KnownState | None = None) -> dict[str, Rejection]:
        """Authorize a batch: set ``rejected``/``soft_failed`` on its records and
        return the rejected ones' reasons.

        *known_state*, when given, answers a room's current state from memory (None
        when it does not hold the room): the store's cache of what its last batch
        committed, which spares reading the keys the checks need."""
        if records is self._batch:
            # A retried transaction checks again from the flags as the caller gave
            # them, not from the previous attempt's verdicts.
            for record, flag in self._flagged:
                setattr(record, flag, False)
        self._batch = records
        self._flagged = []
        self._auth_ids = {}
        self._deoutliered = set()
        self._state_records = []
        out: dict[str, Rejection] = {}
        for room_id, room_records in _batchrows.by_room(records).items():
            model = self.room(txn, room_id)
            current = None
            if not backfilled:
                known = known_state(room_id) if known_state is not None else None
                current = _CurrentState(txn, room_id, model, known)
            self._check_room(model, room_id, room_records, current, out)
        return out

    def end_batch(self) -> None:
        """Let go of the last batch (its transaction has ended, committed or not):
        held longer, its records would outlive the young generations of the garbage
        collector and make its full collections come sooner."""
        self._batch = None
        self._flagged = []
        self._auth_ids = {}
        self._deoutliered = set()
        self._state_records = []

    def _flag(self, record: Any, flag: str) -> None:
        """Set *record*'s ``rejected`` or ``soft_failed`` flag (*flag*)."""
        if not getattr(record, flag):
            self._flagged.append((record, flag))
            setattr(record, flag, True)

    def _check_room(self, model: RoomModel, room_id: str, records: list[Any],
                    current: _CurrentState | None, out: dict[str, Rejection]) -> None:
        version = model.version
        # Plain events of the usual shape are checked from the fields validation
        # read (see _check_plain); the others are decoded here and parsed in full.
        scan = _plaincheck.scan_batch(
            records, room_id,
            create_event_id_for_room(room_id)
            if version is not None and version.room_id_from_create_event else None,
            _NOT_PLAIN if version is not None else None, MEMBER)
        if current is not None:
            current.prefetch(_keys_likely_read(scan), scan.senders)
        state_records = [r for r in scan.others if r.state_key is not None]
        self._state_records.extend(state_records)
        if model.outliers or scan.has_outlier:
            for record in records:
                if record.outlier:
                    model.outliers.add(record.event_id)
                elif record.event_id in model.outliers:
                    self._deoutliered.add(record.event_id)
                    model.outliers.discard(record.event_id)
        plain = scan.plain
        bodies: dict[str, dict[str, Any]] = {}
        other_cites: dict[str, Sequence[str]] = {}
        for r in scan.others:
            body = bodies[r.event_id] = orjson.loads(r.json)
            other_cites[r.event_id] = _listed_auth(body)
        model.bound_memos()
        # Soft-failure verdicts of plain events by (sender, type) (see _CurrentState).
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
            event_id = record.event_id
            ids = plain.get(event_id)
            if ids is None:
                rejection = self._check(model, record, bodies[event_id], current)
            else:
                rejection = self._check_plain(model, record, ids, current)
            if rejection is not None:
                out[event_id] = rejection
            i += 1

    def _check_plain(self, model: RoomModel, record: Any, auth_ids: tuple[str, ...],
                     current: _CurrentState | None) -> Rejection | None:
        """:meth:`_check` for a plain event of the usual shape (see
        ``plaincheck.scan_batch``): the verdicts are memoized by what they read,
        so the event is parsed only when one is worked out."""
        if record.rejected:
            return Rejection("flagged", "persisted with the rejected flag")
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
                self._flag(record, "rejected")
                return Rejection(exc.reason.value, exc.detail)
            passed[seen] = True
        if current is not None and not record.outlier:
            fails = current.plain_verdicts.get((record.sender, record.type))
            if fails is None:
                if event is None:
                    event = parse_event(record.event_id, orjson.loads(record.json), version)
                fails = current.fails_plain(event, version)
            if fails:
                self._flag(record, "soft_failed")
        return None

    def _check(self, model: RoomModel, record: Any, body: dict[str, Any],
               current: _CurrentState | None) -> Rejection | None:
        if model.version is None:
            if record.type == CREATE and record.state_key == "":
                model.version = room_version(_version_of(body)) if _known_version(
                    body) else None
            elif record.outlier and record.membership in _OUT_OF_BAND:
                # An out-of-band membership (an invite received over federation, its
                # rejection, a knock) in a room whose auth events are not held: stored
                # unchecked, as Matrix servers store them.
                return None
            if model.version is None:
                self._flag(record, "rejected")
                if record.type == CREATE:
                    return Rejection(RejectionReason.BAD_CREATE_EVENT.value,
                                     "the create event names no known room version")
                missing = sorted(a for a in _listed_auth(body)
                                 if a not in model.source.events)
                if missing:
                    return Rejection(RejectionReason.MISSING_AUTH_EVENTS.value,
                                     f"auth events not held: {', '.join(missing)}")
                return Rejection(RejectionReason.NO_CREATE_EVENT.value,
                                 "the room has no create event")
        version = model.version
        try:
            event = _parse(record.event_id, body, version)
        except MatrixError as exc:
            self._flag(record, "rejected")
            return Rejection(RejectionReason.MALFORMED.value, str(exc))
        self._auth_ids[event.event_id] = event.auth_ids
        if event.room_id != record.room_id:
            # Version 12: the room ID must be the one the create event defines.
            self._flag(record, "rejected")
            return Rejection(RejectionReason.BAD_CREATE_EVENT.value,
                             f"room {record.room_id} is not the room {event.room_id} "
                             "this create event defines")
        rejection: Rejection | None = None
        plain = event.state_key is None and event.type not in _NOT_PLAIN
        keys: set[StateKey] | None = None  # its auth_types_for_event, once worked out
        if record.rejected:
            rejection = Rejection("flagged", "persisted with the rejected flag")
        else:
            # A plain non-state event's verdict depends only on its type, its sender
            # and its auth events: messages citing the same auth events as one that
            # passed pass too. Not one listing the create event its room ID names
            # (version 12): its auth event IDs are those of one that does not, but
            # listing it is what the rules forbid.
            passed = model.passed
            seen = (event.auth_ids, event.sender, event.type) if plain and not (
                version.room_id_from_create_event
                and create_event_id_for_room(event.room_id) in event.auth_events) else None
            if seen is None or seen not in passed:
                keys = auth.auth_types_for_event(event, version)
                try:
                    auth.authorize(event, version, model.source.events,
                                   model.source.rejected, allowed=keys)
                except AuthRejection as exc:
                    self._flag(record, "rejected")
                    rejection = Rejection(exc.reason.value, exc.detail)
                else:
                    if seen is not None:
                        passed[seen] = True
        if rejection is None and current is not None and not record.outlier:
            if plain:
                if current.fails_plain(event, version):
                    self._flag(record, "soft_failed")
            elif current.fails(event, version, keys if keys is not None
                               else auth.auth_types_for_event(event, version)):
                self._flag(record, "soft_failed")
        if event.state_key is not None:
            model.add(event, rejected=rejection is not None)
            if current is not None and rejection is None and not record.soft_failed and (
                    not record.outlier):
                current.apply(event)
        return rejection

    def queue_rows(self, writes: Writes, persisted: Iterable[str], records: list[Any],
                   rejections: Mapping[str, Rejection]) -> None:
        """Queue on *writes* (the batch's own, so they go out with its rows) the
        ``event_auth`` (state events only), ``rejections`` and ``rooms`` rows of the
        batch's newly stored events."""
        # Only state events have auth edges stored (see schema).
        state_records = (self._state_records if records is self._batch
                         else [r for r in records if r.state_key is not None])
        if not (state_records or rejections or self._deoutliered):
            return  # the usual batch of messages: nothing to write
        persisted = persisted if isinstance(persisted, list) else list(persisted)
        # The persisted IDs are some of the records': as many means all of them.
        new = None if len(persisted) == len(records) else set(persisted)
        auth_rows: list[str] = []  # event_id, auth_id, room_id of each row, flat
        add_rows = auth_rows.extend
        rooms: list[tuple[str, str]] = []
        checked = self._auth_ids
        for record in state_records:
            event_id = record.event_id
            if new is not None and event_id not in new:
                continue
            ids: Sequence[str] | None = checked.get(event_id)
            if ids is None:  # not checked: stored unchecked, or its room had no version
                ids = _listed_auth(orjson.loads(record.json))
            room_id = record.room_id
            if len(set(ids)) != len(ids):  # listed twice (it was rejected): one row each
                ids = list(dict.fromkeys(ids))
            for auth_id in ids:
                add_rows((event_id, auth_id, room_id))
            if record.type == CREATE and record.state_key == "" and event_id not in rejections:
                model = self._rooms.get(room_id)
                if model is not None and model.version is not None:
                    rooms.append((room_id, model.version.identifier))
        replaced = sorted(self._deoutliered if new is None else self._deoutliered & new)
        if replaced:
            writes.delete_in("event_auth", "event_id", replaced)
            writes.delete_in("rejections", "event_id", replaced)
        writes.insert_flat("event_auth", "event_id, auth_id, room_id", auth_rows)
        now = int(time.time() * 1000)
        writes.insert("rejections", "event_id, reason, last_check",
                      [(e, r.reason, now) for e, r in rejections.items()
                       if new is None or e in new])
        writes.insert("rooms", "room_id, room_version", rooms, " ON CONFLICT (room_id) DO NOTHING")

    def loaded(self, room_id: str) -> RoomModel:
        """The room's model, loaded in a transaction of its own when not held."""
        model = self._rooms.get(room_id)
        if model is not None:
            return model
        if self._db is None:
            raise MatrixError(f"room {room_id} is not loaded and no database is attached")
        db = self._db
        return db.run(lambda txn: self.room(txn, room_id), name="load_room_rules")


class _CurrentState:
    """The room's current state, read for the keys the batch's events need: from
    *known* (the whole state, held in memory) when given, else from the database."""

    def __init__(self, txn: Transaction, room_id: str, model: RoomModel,
                 known: Mapping[StateKey, str] | None = None) -> None:
        self._txn = txn
        self._room_id = room_id
        self._model = model
        self._known = known
        # The keys read so far and those the batch's events changed.
        self._state: dict[StateKey, str | None] = {}
        #: Soft-failure verdicts of plain events by (sender, type): they read only the
        #: create event, the power levels and the sender's membership (the keys of
        #: auth_types_for_event), so they hold until an event for one of those keys
        #: enters the current state.
        self.plain_verdicts: dict[tuple[str, str], bool] = {}

    def prefetch(self, keys: set[StateKey], senders: Iterable[str] = ()) -> None:
        """Read *keys* now, in one query, rather than one query per event later (the
        current state does not change until the batch's rows are written), and take
        up the room's soft-failure verdicts of *senders*' plain events whose state is
        still current."""
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
        wanted = [k for k in keys if k not in self._state]
        known = self._known
        if known is not None:
            for key in wanted:
                self._state[key] = known.get(key)
            return
        for i in range(0, len(wanted), _KEYS_PER_QUERY):
            chunk = wanted[i:i + _KEYS_PER_QUERY]
            for key in chunk:
                self._state[key] = None
            # Each term names the whole primary key, so that SQLite looks each key up
            # (with room_id factored out it reads every row of the room's state).
            clause = " OR ".join(["(room_id = ? AND type = ? AND state_key = ?)"] * len(chunk))
            params: list[str] = []
            for etype, skey in chunk:
                params.extend((self._room_id, etype, skey))
            rows = self._txn.fetchall(
                f"SELECT type, state_key, event_id FROM current_state_events WHERE {clause}",
                tuple(params))
            for etype, skey, event_id in rows:
                self._state[(etype, skey)] = event_id

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
        """True when a plain event (see ``_NOT_PLAIN``) fails against the current
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

    def forget_plain(self, key: StateKey) -> None:
        """A state event for *key* entered the current state: drop the verdicts that
        read *key*. (Events held but not current are read by no verdict.)"""
        if not self.plain_verdicts:
            return
        if key[0] == MEMBER:
            for memo in [m for m in self.plain_verdicts if m[0] == key[1]]:
                del self.plain_verdicts[memo]
        elif key == POWER_LEVELS_KEY or key == CREATE_KEY:
            self.plain_verdicts.clear()

    def apply(self, event: MatrixEvent) -> None:
        self._state[event.key] = event.event_id
        self.forget_plain(event.key)


class MatrixStateResolver:
    """The event store's :class:`~streamrep.events.resolver.StateResolver` with the
    Matrix algorithm of each room's version."""

    def __init__(self, rules: RoomRules) -> None:
        self._rules = rules

    def resolve(self, room_id: str, state_sets: Sequence[Mapping[StateKey, str]],
                orderings: Mapping[str, tuple[int, int]]) -> dict[StateKey, str]:
        model = self._rules.loaded(room_id)
        version = model.version or room_version(DEFAULT_ROOM_VERSION)
        return resolve_state(room_id, version, state_sets, model.source)


def _known_version(body: Mapping[str, Any]) -> bool:
    try:
        room_version(_version_of(body))
    except MatrixError:
        return False
    return True


def _version_of(body: Mapping[str, Any]) -> Any:
    content = body.get("content")
    return content.get("room_version", DEFAULT_ROOM_VERSION) if isinstance(
        content, dict) else DEFAULT_ROOM_VERSION


def _parse(event_id: str, body: dict[str, Any], version: RoomVersion) -> MatrixEvent:
    if version.room_id_from_create_event and body.get("type") == CREATE and body.get(
            "state_key") == "" and "room_id" in body:
        # The store needs a room ID on every event; a version 12 create event has
        # none of its own, so the one the store was given is set aside here.
        body = {k: v for k, v in body.items() if k != "room_id"}
    return parse_event(event_id, body, version)


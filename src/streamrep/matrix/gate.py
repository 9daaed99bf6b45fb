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
#: Event types whose authorization reads more than their type, sender and auth events.
_NOT_PLAIN = frozenset({CREATE, MEMBER, ALIASES, THIRD_PARTY_INVITE, REDACTION})


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

    def add(self, event: MatrixEvent, rejected: bool) -> None:
        """Hold *event* (a state event) for later authorization and resolution."""
        self.source.add(event, rejected=rejected)


def _by_room(records: list[Any]) -> dict[str, list[Any]]:
    """The batch's records by room, in the order given."""
    first = records[0].room_id if records else ""
    if all(r.room_id == first for r in records):  # the usual case: a batch of one room
        return {first: records} if records else {}
    rooms: dict[str, list[Any]] = {}
    for r in records:
        rooms.setdefault(r.room_id, []).append(r)
    return rooms


def _topological(records: list[Any], cites: Mapping[str, Sequence[str]]) -> list[Any]:
    """Batch records with the batch events they cite as auth events first."""
    by_id = {r.event_id: r for r in records}
    in_batch = by_id.keys()
    if in_batch.isdisjoint(set().union(*cites.values())):
        return records  # the usual case: they cite stored events only
    waiting: dict[str, int] = {}
    children: dict[str, list[str]] = {}
    for r in records:
        listed = cites[r.event_id]
        if in_batch.isdisjoint(listed):  # the usual case: it cites stored events only
            waiting[r.event_id] = 0
            continue
        cited = {a for a in listed if a in by_id and a != r.event_id}
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


def _keys_likely_read(records: list[Any]) -> set[StateKey]:
    """The current state's keys that checking *records* will most likely read: the
    create event, the power levels, each sender's membership and, for membership
    events, the target's and the join rules (see ``auth_types_for_event``)."""
    keys = {CREATE_KEY, POWER_LEVELS_KEY}
    users = {r.sender for r in records}
    for r in records:
        if r.type == MEMBER and type(r.state_key) is str:
            users.add(r.state_key)
            keys.add(JOIN_RULES_KEY)
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
        self._given: list[tuple[bool, bool]] = []
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
        if records is not self._batch:
            # The flags as the caller gave them: a retried transaction checks again
            # from these, not from the previous attempt's verdicts.
            self._batch = records
            self._given = [(r.rejected, r.soft_failed) for r in records]
        else:
            for r, (rejected, soft_failed) in zip(records, self._given):
                r.rejected, r.soft_failed = rejected, soft_failed
        self._auth_ids = {}
        self._deoutliered = set()
        out: dict[str, Rejection] = {}
        for room_id, room_records in _by_room(records).items():
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
        self._given = []
        self._auth_ids = {}
        self._deoutliered = set()

    def _check_room(self, model: RoomModel, room_id: str, records: list[Any],
                    current: _CurrentState | None, out: dict[str, Rejection]) -> None:
        if current is not None:
            current.prefetch(_keys_likely_read(records))
        if model.outliers or any(r.outlier for r in records):
            for record in records:
                if record.outlier:
                    model.outliers.add(record.event_id)
                elif record.event_id in model.outliers:
                    self._deoutliered.add(record.event_id)
                    model.outliers.discard(record.event_id)
        # Plain events of the usual shape are checked from the fields validation
        # read (see _check_plain); the others are decoded here and parsed in full.
        plain: dict[str, tuple[str, ...]] = {}
        if model.version is not None:
            plain = _plaincheck.usual_plain_auth_ids(
                records, room_id, create_event_id_for_room(room_id)
                if model.version.room_id_from_create_event else None, _NOT_PLAIN)
        bodies: dict[str, dict[str, Any]] = {}
        cites: dict[str, Sequence[str]] = dict(plain)
        if len(plain) < len(records):
            for r in records:
                if r.event_id not in plain:
                    body = bodies[r.event_id] = orjson.loads(r.json)
                    cites[r.event_id] = _listed_auth(body)
        passed: dict[tuple[tuple[str, ...], str, str], bool] = {}
        # Soft-failure verdicts of plain events by (sender, type) (see _CurrentState).
        plain_verdicts = current.plain_verdicts if current is not None else None
        ordered = _topological(records, cites)
        settled_until = _plaincheck.settled_until
        i, count = 0, len(ordered)
        while True:
            # The records the verdicts of an earlier event of the batch settle pass.
            i = settled_until(ordered, i, plain, passed, plain_verdicts)
            if i == count:
                return
            record = ordered[i]
            event_id = record.event_id
            ids = plain.get(event_id)
            if ids is None:
                rejection = self._check(model, record, bodies[event_id], current, passed)
            else:
                rejection = self._check_plain(model, record, ids, current, passed)
            if rejection is not None:
                out[event_id] = rejection
            i += 1

    def _check_plain(self, model: RoomModel, record: Any, auth_ids: tuple[str, ...],
                     current: _CurrentState | None,
                     passed: dict[tuple[tuple[str, ...], str, str], bool]) -> Rejection | None:
        """:meth:`_check` for a plain event of the usual shape (see
        ``plaincheck.usual_plain_auth_ids``): the verdicts are memoized by what they read,
        so the event is parsed only when one is worked out."""
        if record.rejected:
            return Rejection("flagged", "persisted with the rejected flag")
        version = model.version
        assert version is not None
        event: MatrixEvent | None = None
        seen = (auth_ids, record.sender, record.type)
        if seen not in passed:
            event = parse_event(record.event_id, orjson.loads(record.json), version)
            try:
                auth.authorize(event, version, model.source.events, model.source.rejected)
            except AuthRejection as exc:
                record.rejected = True
                return Rejection(exc.reason.value, exc.detail)
            passed[seen] = True
        if current is not None and not record.outlier:
            fails = current.plain_verdicts.get((record.sender, record.type))
            if fails is None:
                if event is None:
                    event = parse_event(record.event_id, orjson.loads(record.json), version)
                fails = current.fails_plain(event, version)
            if fails:
                record.soft_failed = True
        return None

    def _check(self, model: RoomModel, record: Any, body: dict[str, Any],
               current: _CurrentState | None,
               passed: dict[tuple[tuple[str, ...], str, str], bool]) -> Rejection | None:
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
                record.rejected = True
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
            record.rejected = True
            return Rejection(RejectionReason.MALFORMED.value, str(exc))
        self._auth_ids[event.event_id] = event.auth_ids
        if event.room_id != record.room_id:
            # Version 12: the room ID must be the one the create event defines.
            record.rejected = True
            return Rejection(RejectionReason.BAD_CREATE_EVENT.value,
                             f"room {record.room_id} is not the room {event.room_id} "
                             "this create event defines")
        rejection: Rejection | None = None
        plain = event.state_key is None and event.type not in _NOT_PLAIN
        if record.rejected:
            rejection = Rejection("flagged", "persisted with the rejected flag")
        else:
            # A plain non-state event's verdict depends only on its type, its sender
            # and its auth events: the batch's messages citing the same auth events
            # as one that passed pass too.
            seen = (event.auth_ids, event.sender, event.type) if plain else None
            if seen is None or seen not in passed:
                try:
                    auth.authorize(event, version, model.source.events,
                                   model.source.rejected)
                except AuthRejection as exc:
                    record.rejected = True
                    rejection = Rejection(exc.reason.value, exc.detail)
                else:
                    if seen is not None:
                        passed[seen] = True
        if rejection is None and current is not None and not record.outlier:
            if plain:
                if current.fails_plain(event, version):
                    record.soft_failed = True
            else:
                now, now_ids = current.for_event(event, version)
                # Citing exactly the current state's events, it has just passed
                # against them.
                if now_ids != frozenset(event.auth_ids):
                    try:
                        auth.check_against_state(event, version, now)
                    except AuthRejection:
                        record.soft_failed = True
        if event.state_key is not None:
            if current is not None:
                current.forget_plain(event.key)
            if passed and (rejection is not None or event.event_id in model.source.events):
                passed.clear()  # a held event replaced or rejected: verdicts may change
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
        new = set(persisted)
        if not new:
            return
        auth_rows: list[str] = []  # event_id, auth_id, room_id of each row, flat
        add_rows = auth_rows.extend
        rooms: list[tuple[str, str]] = []
        checked = self._auth_ids
        for record in records:
            event_id = record.event_id
            if record.state_key is None or event_id not in new:
                continue  # only state events have auth edges stored (see schema)
            ids: Sequence[str] | None = checked.get(event_id)
            if ids is None:  # not checked: stored unchecked, or its room had no version
                ids = _listed_auth(orjson.loads(record.json))
            room_id = record.room_id
            for auth_id in ids:
                add_rows((event_id, auth_id, room_id))
            if record.type == CREATE and record.state_key == "" and event_id not in rejections:
                model = self._rooms.get(room_id)
                if model is not None and model.version is not None:
                    rooms.append((room_id, model.version.identifier))
        replaced = sorted(self._deoutliered & new)
        if replaced:
            writes.delete_in("event_auth", "event_id", replaced)
            writes.delete_in("rejections", "event_id", replaced)
        writes.insert_flat("event_auth", "event_id, auth_id, room_id", auth_rows)
        now = int(time.time() * 1000)
        writes.insert("rejections", "event_id, reason, last_check",
                      [(e, r.reason, now) for e, r in rejections.items() if e in new])
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
        #: auth_types_for_event), so they hold until an event for one of those is added.
        self.plain_verdicts: dict[tuple[str, str], bool] = {}

    def prefetch(self, keys: set[StateKey]) -> None:
        """Read *keys* now, in one query, rather than one query per event later (the
        current state does not change until the batch's rows are written)."""
        self._fetch(keys)

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

    def for_event(self, event: MatrixEvent, version: RoomVersion
                  ) -> tuple[dict[StateKey, MatrixEvent], frozenset[str]]:
        """The current state's events that may authorize *event*, and their IDs."""
        keys = auth.auth_types_for_event(event, version)
        self._fetch(keys)
        out: dict[StateKey, MatrixEvent] = {}
        for key in keys:
            event_id = self._state.get(key)
            held = self._model.source.get_event(event_id) if event_id else None
            if held is not None:
                out[key] = held
        return out, frozenset(e.event_id for e in out.values())

    def fails_plain(self, event: MatrixEvent, version: RoomVersion) -> bool:
        """True when a plain event (see ``_NOT_PLAIN``) fails against the current
        state."""
        memo = (event.sender, event.type)
        verdict = self.plain_verdicts.get(memo)
        if verdict is None:
            now, now_ids = self.for_event(event, version)
            verdict = False
            if now_ids != frozenset(event.auth_ids):
                try:
                    auth.check_against_state(event, version, now)
                except AuthRejection:
                    verdict = True
            self.plain_verdicts[memo] = verdict
        return verdict

    def forget_plain(self, key: StateKey) -> None:
        """A state event for *key* was added (to the current state or the events
        held): drop the verdicts that read *key*."""
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


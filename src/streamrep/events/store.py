"""The room DAG event store: ``EventStore(url)``.

Persists events with their edges, forward/backward extremities, state groups and
visibility in one transaction per batch, and answers reads (orders, state, sync,
pagination) from in-memory caches where it can. See docs/events.md.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Final, Iterable, Sequence

import gevent.lock

from streamrep import _impl
from streamrep.db import Database, Transaction
from streamrep.db.inlists import in_list
from streamrep.errors import (
    DatabaseConfigError,
    EventNotFoundError,
    InvalidTokenError,
)
from streamrep.events import rules_schema, schema
from streamrep.events.authorize import authorize_batch, hold_rooms
from streamrep.events.batch import BatchCaches, PersistOutcome
from streamrep.events.encoding import check_batch_text, codec_of
from streamrep.events.orderings import BACKFILL_STREAM, EVENTS_STREAM, GeneratorAllocator, StreamAllocator
from streamrep.events.persist import persist_batch
from streamrep.events.plan import plan_batch
from streamrep.events.reading import (
    NEWEST_FIRST,
    STREAM_ORDER,
    Readers,
    StoredEvent,
    fetch_events,
    user_membership_changes,
    visible_timeline,
)
from streamrep.events.resolver import DepthOrderResolver, StateKey, StateResolver
from streamrep.events.room_state import current_state_of
from streamrep.events.roomversions import RoomVersions
from streamrep.events.rules import NO_VERDICT, Rejection, RoomRules
from streamrep.events.state import GroupState, StateGroupStore, StateOverlay
from streamrep.events.tokens import StreamToken, TopologicalToken, parse_token
from streamrep.events.validation import EventRecord, parse_batch
from streamrep.events.verify import (EarlyCheck, VerifyMode, check_early, check_mode,
                                     verify_planned)
from streamrep.lru import Lru
from streamrep.matrix.rules import MatrixRoomRules

if TYPE_CHECKING:
    from streamrep._pure import changecache as _core_changecache
    from streamrep.streams import Streams
else:
    _core_changecache = _impl.load("changecache")

logger = logging.getLogger(__name__)

__all__ = ["EventStore", "PersistResult", "SyncResult", "RoomTimeline", "MATRIX_RULES"]


class _DefaultRules(enum.Enum):
    MATRIX = "matrix"


#: The default of ``EventStore(room_rules=...)``: new
#: :class:`~streamrep.matrix.rules.MatrixRoomRules` for each store.
MATRIX_RULES: Final = _DefaultRules.MATRIX

#: ``[cache_name, key, ts]`` rows for the ``caches`` stream.
CacheRow = tuple[str, list[Any] | None]


@dataclass(frozen=True)
class PersistResult:
    """What ``persist_events`` stored: each new event's stream ordering (events
    already stored are left out) and the highest live (positive) stream position
    the batch used, 0 when it used none (a backfill that moved no current state)."""

    orderings: Mapping[str, int]
    max_stream: int
    #: Each event of the batch the authorization rules rejected (none without room rules),
    #: with the reason (``"<reason>: <detail>"``); it is stored, flagged rejected.
    rejected: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class SyncResult:
    """New events for a user since a stream token."""

    events: list[StoredEvent]
    membership_changes: list[StoredEvent]
    next_token: StreamToken


@dataclass(frozen=True)
class RoomTimeline:
    """A room's most recent events (topological order) and the token to paginate
    back from."""

    room_id: str
    events: list[StoredEvent]
    prev_token: TopologicalToken | None


class EventStore:
    """The event store over a database URL (or an open :class:`Database`).

    One process writes events to a database (it hands out stream orderings and
    state group IDs from memory); any number of processes may read, keeping their
    caches correct from the ``events`` stream (see :mod:`streamrep.events.streams`).

    ``streams``: a :class:`streamrep.streams.Streams` handle; stream orderings then
    come from its ``events``/``backfill`` ID generators (whose listeners announce
    them), and when this instance writes the ``caches`` stream, each batch's cache
    invalidations are appended to it after the commit. Without it the store counts
    from the largest stored ordering itself.
    ``on_persisted(outcome, cache_rows)`` runs after each committed batch with the
    ``caches`` stream rows to write. ``max_delta_hops`` bounds state-group delta
    chains; ``cache_size`` and ``max_cached_state_entries`` bound the in-memory
    caches (entries, and state keys held by cached states).

    ``room_rules`` (a :class:`~streamrep.events.rules.RoomRules`; by default new
    :class:`streamrep.matrix.rules.MatrixRoomRules`) checks every batch, by default
    against the Matrix authorization rules of the room's version: rejected events
    are stored flagged rejected with a ``rejections`` row, soft-failed ones flagged
    soft-failed, and each state event's auth events go into ``event_auth``.
    ``resolver`` merges conflicting states; by default it is the rules' resolver,
    the Matrix state resolution of each room's version.
    ``room_rules=None`` is for DAG data that is not a Matrix room: nothing is
    authorized, and the default resolver is
    :class:`~streamrep.events.resolver.DepthOrderResolver`.

    ``verify_event_ids`` (``"strict"``, ``"warn"``, the default, or ``"off"``):
    whether each event of a room of version 3 or later must match its ID (the
    reference hash) and its content hash; see :mod:`streamrep.events.verify`.
    """

    def __init__(
        self,
        database: str | Database,
        *,
        resolver: StateResolver | None = None,
        max_delta_hops: int = 100,
        cache_size: int = 20_000,
        change_cache_size: int = 100_000,
        max_cached_state_entries: int = 5_000_000,
        on_persisted: Callable[[PersistOutcome, list[CacheRow]], None] | None = None,
        streams: "Streams | None" = None,
        room_rules: RoomRules | None | _DefaultRules = MATRIX_RULES,
        verify_event_ids: VerifyMode = "warn",
    ) -> None:
        self.verify_event_ids: VerifyMode = check_mode(verify_event_ids)
        self._owns_db = isinstance(database, str)
        self.db = Database.open(database, migrate=False) if isinstance(database, str) else database
        self.db.ensure_schema(schema.COMPONENT)
        rules: RoomRules | None = (MatrixRoomRules() if isinstance(room_rules, _DefaultRules)
                                   else room_rules)
        self.room_rules = rules
        if rules is not None:
            self.db.ensure_schema(rules_schema.COMPONENT)
        #: room -> events stored although they did not match their ID or content
        #: hash (``verify_event_ids="warn"``); each room is logged once
        self.unverified_events: dict[str, int] = {}
        self.room_versions = RoomVersions(
            rooms_table=self.db.schema_version(rules_schema.COMPONENT) > 0)
        self.resolver: StateResolver = resolver or (
            rules.resolver if rules is not None else DepthOrderResolver())
        self.states = StateGroupStore(max_delta_hops, cache_size, max_cached_state_entries)
        self._allocator: StreamAllocator
        self._streams = streams
        if streams is not None:
            # Stream orderings from the handle's generators, which announce them.
            from streamrep.streams.builtin import CACHES

            if EVENTS_STREAM not in streams.definitions or BACKFILL_STREAM not in streams.definitions:
                raise DatabaseConfigError(
                    f"the Streams handle given to the event store does not serve the "
                    f"{EVENTS_STREAM} and {BACKFILL_STREAM} streams: build it with "
                    "definitions=streamrep.catalogue.known_streams()")
            self._writes_caches = streams.instance_name in streams.writers_of(CACHES.name)
            self._allocator = GeneratorAllocator(streams.generator(EVENTS_STREAM),
                                                 streams.generator(BACKFILL_STREAM))
        else:
            self._writes_caches = False
            self._allocator = StreamAllocator()
        # Per greenlet (and thread): one batch at a time, in stream order.
        self._write_lock = gevent.lock.RLock()
        # Bounded: a server may hold many rooms, and large rooms have large states.
        self._forward: Lru[str, frozenset[str]] = Lru("forward_extremities", cache_size)
        self._current_state: Lru[str, GroupState] = Lru(
            "current_state", cache_size, max_cached_state_entries // 4, lambda s: len(s) + 1)
        self._visibility_values: Lru[str, str] = Lru("history_visibility", cache_size)
        self.event_cache: Lru[str, StoredEvent] = Lru("get_event", cache_size)
        self._readers = Readers(self.states, self._visibility_values, self.room_versions)
        # The Python codec of a PostgreSQL database's text, read at the first batch.
        self._codec: str | None = None
        self._codec_read = False
        self._on_persisted = on_persisted
        live, _ = self.db.run(lambda txn: self._allocator.current(txn), name="positions")
        # Everything at or below this live position is reflected in the caches.
        self._position = live
        self.room_changes = _core_changecache.StreamChangeCache(
            "room_changes", live, change_cache_size)
        self.membership_changes = _core_changecache.StreamChangeCache(
            "membership_changes", live, change_cache_size)

    def close(self) -> None:
        """Close the database if this store opened it."""
        if self._owns_db:
            self.db.close()

    def __enter__(self) -> "EventStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------

    def persist_events(self, events: Iterable[Any], backfilled: bool = False, *,
                       remote: bool = False) -> PersistResult:
        """Persist a batch of events in one transaction.

        Each event is a mapping with ``event_id`` beside the event's own fields
        (optional ``outlier``, ``rejected``, ``soft_failed`` flags), or an
        ``(event_id, json_bytes[, flags])`` tuple. Live events get increasing
        positive stream orderings; ``backfilled=True`` gives negative, decreasing
        ones. Events already stored are skipped, except that an outlier persisted
        again as a non-outlier is de-outliered. Raises :class:`InvalidEventError`
        (and stores nothing) when any event of the batch is invalid.

        ``remote``: the events were received from another server. The room rules
        check every event against its auth events; a live event received from
        another server is also checked against the room's current state, and
        soft-failed if it fails there. Events this deployment created (the default)
        are not: they were authorized by the state they were created on.
        """
        records = self._validate(events)
        with self._write_lock:
            # Checked now, while validation has left the events in the caches.
            early = check_early(records, self.room_versions) if (
                self.verify_event_ids != "off") else None
            try:
                outcome = self.db.run(self._persist_txn, records, backfilled, remote, early,
                                      name="persist_events")
            except BaseException:
                if self.room_rules is not None:
                    self.room_rules.forget()
                self._allocator.reset()
                self.states.reset_allocator()
                self._forward.clear()
                self._current_state.clear()
                raise
            finally:
                if self.room_rules is not None:
                    self.room_rules.trim()
            cache_rows = self._apply_outcome(outcome)
        if self._writes_caches and cache_rows and self._streams is not None:
            for cache_name, keys in cache_rows:
                self._streams.add_cache_invalidation(cache_name, keys)
        if self._on_persisted is not None:
            self._on_persisted(outcome, cache_rows)
        return PersistResult(MappingProxyType(outcome.event_orderings), outcome.max_live,
                             MappingProxyType(outcome.rejected))

    @staticmethod
    def _validate(events: Iterable[Any]) -> list[EventRecord]:
        return parse_batch(events)

    def _persist_txn(self, txn: Transaction, records: list[EventRecord], backfilled: bool,
                     remote: bool, early: EarlyCheck | None) -> PersistOutcome:
        """One batch, forward: what to write, the event ID check and the rules'
        verdict on it, the writes."""
        plan = plan_batch(txn, records)
        if not plan.todo:
            return PersistOutcome()
        if txn.is_postgres and not txn.database.text_is_utf8:
            codec = self._text_codec(txn)
            if codec is not None:
                check_batch_text(txn, plan.todo, codec)
        rules = self.room_rules
        checked = verify_planned(txn, plan.todo, plan.deoutliered, self.room_versions,
                                 self.verify_event_ids, early) if (
            self.verify_event_ids != "off") else None
        if checked is not None and checked.rejected:
            plan = dataclasses.replace(plan, todo=checked.records)
        verdict = NO_VERDICT
        if rules is not None:
            verdict = authorize_batch(txn, rules, plan.todo, remote and not backfilled,
                                      self._current_state)
        if checked is not None and checked.rejected:
            verdict = dataclasses.replace(verdict, rejected={**verdict.rejected,
                                                             **checked.rejected})
        outcome = persist_batch(
            txn, plan, verdict, backfilled, rule_tables=rules is not None, states=self.states,
            resolver=self.resolver, allocator=self._allocator,
            caches=BatchCaches(self._forward, self._current_state, self._visibility_values))
        if checked is not None:
            outcome.unverified = checked.unverified
        return outcome

    def _apply_outcome(self, outcome: PersistOutcome) -> list[CacheRow]:
        """Bring the caches up to date with a committed batch; return the ``caches``
        stream rows other processes need."""
        self.states.event_group_cache.put_many(outcome.event_groups)
        # Groups left as overlays on the batch's base are not cached (their state is
        # read back from the tables when asked for, as for any uncached group), but
        # for a room's current state: the base of the next batch's overlays.
        current = {id(state) for state in outcome.current_state.values()}
        self.states.group_cache.put_many(
            [(group, value) for group, value in outcome.new_groups.items()
             if type(value[0]) is not StateOverlay or id(value[0]) in current])
        for room_id, forward in outcome.forward.items():
            self._forward.put(room_id, forward)
        for room_id, state in outcome.current_state.items():
            self._current_state.put(room_id, state)
        for event_id, setting in outcome.visibility_values.items():
            self._visibility_values.put(event_id, setting)
        self.event_cache.pop_many(outcome.persisted)
        self.event_cache.pop_many(outcome.redacted)
        if outcome.redacted and self.room_rules is not None:
            self.room_rules.redact(outcome.redacted)
        for room_id, version in outcome.created_rooms.items():
            self.room_versions.learn(room_id, version)
        for event_id, (room_id, why) in outcome.unverified.items():
            self._count_unverified(room_id, event_id, why)
        if outcome.max_live > self._position:
            self._position = outcome.max_live
        for room_id, pos in outcome.room_positions.items():
            self.room_changes.entity_has_changed(room_id, pos)
        for user_id, pos in outcome.membership_positions.items():
            self.membership_changes.entity_has_changed(user_id, pos)
        rows: list[CacheRow] = []
        for room_id, users in outcome.current_state_changes.items():
            rows.append(("cs_cache_fake", [room_id, *sorted(users)]))
        for event_id in sorted(outcome.redacted):
            rows.append(("get_event", [event_id]))
        return rows

    def _text_codec(self, txn: Transaction) -> str | None:
        """The Python codec of the database's text (None: it holds any text)."""
        if not self._codec_read:
            self._codec = codec_of(str(txn.fetchval("SHOW server_encoding")))
            self._codec_read = True
        return self._codec

    def _count_unverified(self, room_id: str, event_id: str, why: Rejection) -> None:
        seen = self.unverified_events.get(room_id, 0)
        self.unverified_events[room_id] = seen + 1
        if not seen:
            logger.warning(
                "room %s: event %s does not match its hashes (%s: %s); stored as given "
                "(verify_event_ids=warn; further events of this room are counted in "
                "unverified_events, not logged)", room_id, event_id, why.reason, why.detail)

    def invalidate_extremities(self, room_id: str) -> None:
        """Drop the cached forward extremities of *room_id* (another process wrote)."""
        self._forward.pop(room_id)

    def invalidate_current_state(self, room_id: str | None) -> None:
        """Drop cached current state and extremities of *room_id* (None: of every room)."""
        if self.room_rules is not None:
            self.room_rules.forget(room_id)
        if room_id is None:
            self._current_state.clear()
            self._forward.clear()
        else:
            self._current_state.pop(room_id)
            self._forward.pop(room_id)

    # -- extremities and orders ------------------------------------------------------

    def get_forward_extremities(self, room_id: str) -> set[str]:
        """The room's forward extremities."""
        cached = self._forward.get(room_id)
        if cached is not None:
            return set(cached)
        rows = self.db.fetchall(
            "SELECT event_id FROM event_forward_extremities WHERE room_id = ?", (room_id,))
        return {r[0] for r in rows}

    def get_backward_extremities(self, room_id: str) -> set[str]:
        """The room's backward extremities (where backfill continues from)."""
        rows = self.db.fetchall(
            "SELECT event_id FROM event_backward_extremities WHERE room_id = ?", (room_id,))
        return {r[0] for r in rows}

    def get_room_events(self, room_id: str, order: str = "topological") -> list[str]:
        """The room's non-outlier event IDs in ``(topological_ordering,
        stream_ordering)`` order, or in stream order with ``order="stream"``."""
        if order == "topological":
            by = "topological_ordering, stream_ordering"
        elif order == "stream":
            by = "stream_ordering"
        else:
            raise ValueError(f"order must be 'topological' or 'stream', not {order!r}")
        rows = self.db.fetchall(
            f"SELECT event_id FROM events WHERE room_id = ? AND NOT outlier ORDER BY {by}",
            (room_id,))
        return [r[0] for r in rows]

    # -- events -----------------------------------------------------------------------

    def get_event(self, event_id: str) -> StoredEvent:
        """One stored event (outliers included); pruned when redacted."""
        cached = self.event_cache.get(event_id)
        if cached is not None:
            return cached
        found = self.db.run(fetch_events, [event_id], self.room_versions, name="get_event",
                            read_only=True).get(event_id)
        if found is None:
            raise EventNotFoundError(f"event {event_id} is not stored")
        self.event_cache.put(event_id, found)
        return found

    def get_events(self, event_ids: Sequence[str]) -> dict[str, StoredEvent]:
        """The stored ones of *event_ids*."""
        out: dict[str, StoredEvent] = {}
        missing = []
        for event_id in event_ids:
            cached = self.event_cache.get(event_id)
            if cached is None:
                missing.append(event_id)
            else:
                out[event_id] = cached
        if missing:
            found = self.db.run(fetch_events, missing, self.room_versions, name="get_events",
                                read_only=True)
            for event_id, event in found.items():
                self.event_cache.put(event_id, event)
            out.update(found)
        return out

    def get_event_json(self, event_id: str) -> bytes:
        """The exact JSON bytes received for *event_id* (never pruned)."""
        raw = self.db.fetchval("SELECT json FROM events WHERE event_id = ?", (event_id,))
        if raw is None:
            raise EventNotFoundError(f"event {event_id} is not stored")
        return bytes(raw)

    # -- state --------------------------------------------------------------------------

    def get_state_group_for_event(self, event_id: str) -> int:
        """The state group of the state after *event_id*; raises
        :class:`EventNotFoundError` for unknown events and outliers."""
        group = self.states.event_group_cache.get(event_id)
        if group is None:
            group = self.db.run(
                lambda txn: self.states.groups_for_events(txn, [event_id]),
                name="event_state_group", read_only=True).get(event_id)
            if group is None:
                raise EventNotFoundError(
                    f"event {event_id} has no state group (not stored, or an outlier)")
        return group

    def get_state_group(self, group: int) -> GroupState:
        """The full state of state group *group*."""
        cached = self.states.group_cache.get(group)
        if cached is not None:
            return cached[0]
        return self.db.run(lambda txn: self.states.load(txn, group), name="state_group",
                           read_only=True)[0]

    def get_state_after_event(self, event_id: str) -> Mapping[StateKey, str]:
        """The room state after *event_id*: ``{(type, state_key): event_id}``."""
        group = self.states.event_group_cache.get(event_id)
        if group is not None:
            cached = self.states.group_cache.get(group)
            if cached is not None:
                return cached[0]
        return self.get_state_group(self.get_state_group_for_event(event_id))

    def get_current_state(self, room_id: str) -> Mapping[StateKey, str]:
        """The room's current state (the resolved state at its forward extremities)."""
        cached = self._current_state.get(room_id)
        if cached is not None:
            return cached
        state: GroupState = MappingProxyType({
            (t, sk): e for t, sk, e in self.db.fetchall(
                "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?",
                (room_id,))})
        self._current_state.put(room_id, state)
        return state

    def compute_state_at_extremities(self, room_id: str) -> Mapping[StateKey, str]:
        """Recompute the room's state from its forward extremities (bypassing
        ``current_state_events``)."""
        forward = self.get_forward_extremities(room_id)
        try:
            return self.db.run(self._state_at, room_id, forward, name="state_at_ext",
                               read_only=True)
        finally:
            if self.room_rules is not None:
                self.room_rules.trim()

    def _state_at(self, txn: Transaction, room_id: str,
                  extremities: set[str]) -> Mapping[StateKey, str]:
        if self.room_rules is not None:
            hold_rooms(txn, self.room_rules, [room_id])
        return current_state_of(txn, self.states, self.resolver, room_id, extremities,
                                {}, {}, {})

    # -- positions, sync and pagination ---------------------------------------------------

    def current_token(self) -> StreamToken:
        """The live stream position this store's caches reflect: on the writer its
        last persisted batch, on a worker the last ``events`` row applied."""
        return StreamToken(self._position)

    def advance_position(self, token: int) -> None:
        """Record that every ``events`` row up to *token* has been applied."""
        if token > self._position:
            self._position = token

    def has_room_changed_since(self, room_id: str, token: str | StreamToken) -> bool:
        """Answered from the change cache: may *room_id* have new events after *token*?"""
        return self.room_changes.has_entity_changed(room_id, _stream_position(token))

    def get_user_rooms(self, user_id: str, memberships: Sequence[str] = ("join",)) -> list[str]:
        """Rooms where *user_id*'s current membership is one of *memberships*."""
        params: list[Any] = ["m.room.member", user_id]
        rows = self.db.fetchall(
            "SELECT room_id FROM current_state_events WHERE type = ? AND state_key = ? AND "
            + in_list(self.db, "membership", memberships, params) + " ORDER BY room_id", params)
        return [r[0] for r in rows]

    def get_pending_invites(self, user_id: str) -> list[StoredEvent]:
        """Invites (out-of-band ones included) that are the user's latest membership
        event in their room, newest first."""
        def run(txn: Transaction) -> list[StoredEvent]:
            rows = txn.fetchall(
                "SELECT m.event_id FROM room_memberships m WHERE m.user_id = ?"
                " AND m.membership = ? AND NOT EXISTS (SELECT 1 FROM room_memberships n"
                " WHERE n.user_id = m.user_id AND n.room_id = m.room_id"
                " AND n.stream_ordering > m.stream_ordering)"
                " ORDER BY m.stream_ordering DESC", (user_id, "invite"))
            found = fetch_events(txn, [r[0] for r in rows], self.room_versions)
            return [found[r[0]] for r in rows if r[0] in found]

        return self.db.run(run, name="pending_invites", read_only=True)

    def get_new_events_for_user(self, user_id: str, since: str | StreamToken,
                                limit: int = 100) -> SyncResult:
        """Events after *since* in the rooms *user_id* is in (visible to them), and
        their membership changes in any room, invites from rooms not joined included."""
        since_pos = _stream_position(since)
        now = self.current_token().stream

        def run(txn: Transaction) -> SyncResult:
            memberships = user_membership_changes(txn, user_id, since_pos, now, limit,
                                                  self.room_versions)
            rooms = {r[0] for r in txn.fetchall(
                "SELECT room_id FROM current_state_events WHERE type = ? AND state_key = ?"
                " AND membership = ?", ("m.room.member", user_id, "join"))}
            rooms |= {e.room_id for e in memberships if not e.outlier}
            changed = self.room_changes.get_entities_changed(sorted(rooms), since_pos)
            events: list[StoredEvent] = []
            for room_id in sorted(str(r) for r in changed):
                events.extend(visible_timeline(
                    txn, room_id, user_id,
                    where="e.stream_ordering > ? AND e.stream_ordering <= ?",
                    params=(since_pos, now), order=STREAM_ORDER, limit=limit,
                    readers=self._readers))
            events.sort(key=lambda e: e.stream_ordering)
            return SyncResult(events[:limit], memberships, StreamToken(now))

        return self.db.run(run, name="sync", read_only=True)

    def get_initial_sync(self, user_id: str, rooms: int = 20,
                         events_per_room: int = 10) -> list[RoomTimeline]:
        """The most recent *events_per_room* visible events in each of the user's
        *rooms* most recently active joined rooms."""
        def run(txn: Transaction) -> list[RoomTimeline]:
            # The correlated MAX is one index probe per room.
            room_rows = txn.fetchall(
                "SELECT c.room_id, (SELECT MAX(e.stream_ordering) FROM events e"
                " WHERE e.room_id = c.room_id) AS last FROM current_state_events c"
                " WHERE c.type = ? AND c.state_key = ? AND c.membership = ?"
                " ORDER BY last DESC, c.room_id LIMIT ?",
                ("m.room.member", user_id, "join", rooms))
            out = []
            for room_id, _ in room_rows:
                newest = visible_timeline(
                    txn, room_id, user_id, where="1 = 1", params=(), order=NEWEST_FIRST,
                    readers=self._readers,
                    limit=events_per_room)
                newest.reverse()
                prev = newest[0].token if newest else None
                out.append(RoomTimeline(room_id, newest, prev))
            return out

        return self.db.run(run, name="initial_sync", read_only=True)

    def room_end_token(self, room_id: str) -> TopologicalToken:
        """A token after every event of the room, to paginate back from."""
        row = self.db.fetchone(
            "SELECT topological_ordering, stream_ordering FROM events WHERE room_id = ?"
            " AND NOT outlier ORDER BY topological_ordering DESC, stream_ordering DESC LIMIT 1",
            (room_id,))
        if row is None:
            return TopologicalToken(0, 0)
        return TopologicalToken(int(row[0]), int(row[1]) + 1)

    def paginate_back(self, room_id: str, user_id: str,
                      from_token: str | StreamToken | TopologicalToken | None = None,
                      limit: int = 10) -> tuple[list[StoredEvent], TopologicalToken | None]:
        """Events before *from_token* that *user_id* may see, newest first in
        topological order, and the token to continue from (None at the start).

        ``from_token`` may be a topological token, a stream token (events up to that
        stream position), or None for the room's end."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        if isinstance(from_token, str):
            from_token = parse_token(from_token)
        if from_token is None:
            from_token = self.room_end_token(room_id)
        elif isinstance(from_token, StreamToken):
            from_token = self._topological_at_stream(room_id, from_token.stream)

        bound = from_token

        def run(txn: Transaction) -> list[StoredEvent]:
            return visible_timeline(
                txn, room_id, user_id,
                where="(e.topological_ordering < ? OR (e.topological_ordering = ?"
                      " AND e.stream_ordering < ?))",
                params=(bound.topological, bound.topological, bound.stream),
                order=NEWEST_FIRST, limit=limit, readers=self._readers)

        events = self.db.run(run, name="paginate", read_only=True)
        next_token = events[-1].token if len(events) == limit else None
        return events, next_token

    def _topological_at_stream(self, room_id: str, stream: int) -> TopologicalToken:
        row = self.db.fetchone(
            "SELECT topological_ordering FROM events WHERE room_id = ? AND NOT outlier"
            " AND stream_ordering <= ? ORDER BY stream_ordering DESC LIMIT 1", (room_id, stream))
        if row is None:
            return TopologicalToken(0, 0)
        return TopologicalToken(int(row[0]), stream + 1)


def _stream_position(token: str | StreamToken) -> int:
    if isinstance(token, StreamToken):
        return token.stream
    parsed = parse_token(token)
    if not isinstance(parsed, StreamToken):
        raise InvalidTokenError(f"expected a stream token (s<n>), got {token!r}")
    return parsed.stream

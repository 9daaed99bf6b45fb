"""The room rules' I/O: what the store reads for them and writes of their verdicts.

* :func:`authorize_batch` holds each room of a batch in the rules (read from the
  tables the first time), gives them a reader of the rooms' current state
  (:class:`CurrentStateReader`: the store's cache, else the tables) and returns
  their :class:`~streamrep.events.rules.Verdict`;

What the store writes of the verdict is :mod:`~streamrep.events.persist`'s (the
rules' tables are :mod:`~streamrep.events.rules_schema`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Collection, Iterable, Mapping

from streamrep import _impl
from streamrep.db import Transaction
from streamrep.events.resolver import StateKey
from streamrep.events.rules import RoomRules, Verdict
from streamrep.events.state import GroupState
from streamrep.events.validation import EventRecord
from streamrep.lru import Lru

if TYPE_CHECKING:
    from streamrep._pure import batchrows as _batchrows
else:
    _batchrows = _impl.load("batchrows")

__all__ = ["CurrentStateReader", "authorize_batch", "hold_rooms"]

#: Current-state keys looked up by one query: three values each, within the 999
#: values any SQLite build binds.
_KEYS_PER_QUERY = 333


def hold_rooms(txn: Transaction, rules: RoomRules, room_ids: Iterable[str]) -> None:
    """Have *rules* hold each of *room_ids*, read from the tables where it does not."""
    for room_id in room_ids:
        if not rules.holds(room_id):
            version = txn.fetchval("SELECT room_version FROM rooms WHERE room_id = ?",
                                   (room_id,))
            rows = txn.fetchall(
                "SELECT event_id, json, rejected, redacted FROM events"
                " WHERE room_id = ? AND state_key IS NOT NULL", (room_id,))
            rules.hold(room_id, None if version is None else str(version),
                       [(event_id, bytes(raw), bool(rejected), bool(redacted))
                        for event_id, raw, rejected, redacted in rows])


class CurrentStateReader:
    """Rooms' current state for the rules: from *known* (the store's cache of what
    its last batches committed, whole states) when it holds the room, else from
    ``current_state_events``, the keys asked for in one query."""

    def __init__(self, txn: Transaction, known: Lru[str, GroupState]) -> None:
        self._txn = txn
        self._known = known
        # Each room's cached state, looked up once a batch (None: not cached).
        self._cached: dict[str, GroupState | None] = {}

    def read(self, room_id: str, keys: Collection[StateKey]) -> Mapping[StateKey, str]:
        """The current state's event of each of *keys* the room's state holds."""
        if room_id in self._cached:
            cached = self._cached[room_id]
        else:
            cached = self._cached[room_id] = self._known.get(room_id)
        if cached is not None:
            return {key: cached[key] for key in keys if key in cached}
        out: dict[StateKey, str] = {}
        wanted = list(keys)
        for i in range(0, len(wanted), _KEYS_PER_QUERY):
            chunk = wanted[i:i + _KEYS_PER_QUERY]
            # Each term names the whole primary key, so that SQLite looks each key up
            # (with room_id factored out it reads every row of the room's state).
            clause = " OR ".join(["(room_id = ? AND type = ? AND state_key = ?)"] * len(chunk))
            params: list[str] = []
            for etype, skey in chunk:
                params.extend((room_id, etype, skey))
            for etype, skey, event_id in self._txn.fetchall(
                    f"SELECT type, state_key, event_id FROM current_state_events WHERE {clause}",
                    tuple(params)):
                out[(etype, skey)] = event_id
        return out


def authorize_batch(txn: Transaction, rules: RoomRules, records: list[EventRecord],
                    against_current: bool, known_state: Lru[str, GroupState]) -> Verdict:
    """The rules' verdict on *records* (the batch's events to write, in topological
    order): against their auth events and, when *against_current* (live events
    received from another server), the rooms' current state (*known_state*: the
    store's cache of it)."""
    by_room = _batchrows.by_room(records)
    hold_rooms(txn, rules, by_room)
    return rules.check(by_room,
                       CurrentStateReader(txn, known_state) if against_current else None)

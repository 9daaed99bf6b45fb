"""Each room's version as the store knows it, for the readers that apply a room
version's rules (pruning redacted events) and for verifying event IDs.

A room's version is its ``rooms`` row where the room rules' tables exist, else what
its stored create event names; version 1 for a room whose create event the store
does not hold (not remembered: the create event may come later). Known versions
are cached: a room's version never changes.
"""

from __future__ import annotations

from typing import Any, Iterable

import orjson

from streamrep.db import Transaction
from streamrep.db.inlists import chunks, in_list
from streamrep.lru import Lru
from streamrep.matrix.errors import MatrixError
from streamrep.matrix.room_versions import DEFAULT_ROOM_VERSION, RoomVersion, room_version

__all__ = ["RoomVersions", "version_named_by_create"]

_DEFAULT = room_version(DEFAULT_ROOM_VERSION)


def version_named_by_create(content: Any) -> RoomVersion | None:
    """The version a create event's *content* names, None when streamrep does not
    implement it."""
    named = content.get("room_version", DEFAULT_ROOM_VERSION) if isinstance(
        content, dict) else DEFAULT_ROOM_VERSION
    try:
        return room_version(named)
    except MatrixError:
        return None


class RoomVersions:
    """Rooms' versions (see the module docstring); *rooms_table*: whether the
    room rules' ``rooms`` table exists in the database."""

    def __init__(self, rooms_table: bool, max_rooms: int = 100_000) -> None:
        self._rooms_table = rooms_table
        self._known: Lru[str, RoomVersion] = Lru("room_versions", max_rooms)

    def learn(self, room_id: str, version: RoomVersion) -> None:
        """Remember *room_id*'s version (its create event was just persisted)."""
        self._known.put(room_id, version)

    def known(self, room_id: str) -> RoomVersion | None:
        """The room's version if it is cached."""
        return self._known.get(room_id)

    def of(self, txn: Transaction, room_ids: Iterable[str]) -> dict[str, RoomVersion]:
        """The version of each of *room_ids*, read through *txn* where not cached."""
        out: dict[str, RoomVersion] = {}
        missing = []
        for room_id in room_ids:
            version = self._known.get(room_id)
            if version is None:
                missing.append(room_id)
            else:
                out[room_id] = version
        if missing:
            found = self._read(txn, missing)
            for room_id in missing:
                version = found.get(room_id)
                if version is not None:
                    self._known.put(room_id, version)
                out[room_id] = version or _DEFAULT
        return out

    def _read(self, txn: Transaction, room_ids: list[str]) -> dict[str, RoomVersion]:
        found: dict[str, RoomVersion] = {}
        if self._rooms_table:
            for chunk in chunks(room_ids):
                params: list[Any] = []
                for room_id, identifier in txn.fetchall(
                        "SELECT room_id, room_version FROM rooms WHERE "
                        + in_list(txn, "room_id", chunk, params), params):
                    try:
                        found[room_id] = room_version(identifier)
                    except MatrixError:
                        continue
        rest = [r for r in room_ids if r not in found]
        for chunk in chunks(rest):
            params = ["m.room.create"]
            for room_id, raw in txn.fetchall(
                    "SELECT room_id, json FROM events WHERE type = ? AND state_key = ''"
                    " AND NOT rejected AND " + in_list(txn, "room_id", chunk, params), params):
                try:
                    body = orjson.loads(bytes(raw))
                except orjson.JSONDecodeError:
                    continue
                version = version_named_by_create(
                    body.get("content") if isinstance(body, dict) else None)
                if version is not None:
                    found.setdefault(room_id, version)
        return found

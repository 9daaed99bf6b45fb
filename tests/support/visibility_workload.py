"""A seeded history visibility workload driven through a real reference homeserver's
client API (``support.reference_homeserver``), and the homeserver's own record of it.

Users join, leave, are invited (and accept late or decline), kicked, banned and
unbanned; the creator switches the history visibility among the four settings;
members send messages, sometimes in concurrent bursts from several threads, which
fork the DAG. :func:`read_history` then reads, from the homeserver's database, each
room's events as persisted and its own DAG state at each event.
"""

from __future__ import annotations

import json
import random
import sqlite3
import threading
import uuid
from contextlib import closing
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from support.reference_homeserver import Homeserver

SETTINGS = ("joined", "invited", "shared", "world_readable")


@dataclass
class RoomPlay:
    """What the workload knows of one room while it drives it."""

    room_id: str
    creator: str
    joined: set[str] = field(default_factory=set)
    invited: set[str] = field(default_factory=set)
    banned: set[str] = field(default_factory=set)


class Workload:
    """Drives *hs* with *users* (localpart -> access token)."""

    def __init__(self, hs: Homeserver, seed: int, users: int = 8) -> None:
        self.hs = hs
        self.rng = random.Random(seed)
        self.tokens = {f"@u{n}:{hs.server_name}": hs.register(f"u{n}") for n in range(users)}
        self.rooms: list[RoomPlay] = []

    def _path(self, room_id: str, tail: str) -> str:
        return f"/_matrix/client/v3/rooms/{quote(room_id)}/{tail}"

    def create_room(self, version: str, public: bool) -> RoomPlay:
        creator = sorted(self.tokens)[len(self.rooms) % len(self.tokens)]
        answer = self.hs.request("POST", "/_matrix/client/v3/createRoom", {
            "preset": "public_chat" if public else "private_chat", "room_version": version},
            self.tokens[creator])
        play = RoomPlay(str(answer["room_id"]), creator, {creator})
        self.rooms.append(play)
        return play

    def _send(self, user: str, room: RoomPlay, text: str) -> None:
        path = self._path(room.room_id, f"send/m.room.message/{uuid.uuid4().hex}")
        self.hs.request("PUT", path, {"msgtype": "m.text", "body": text}, self.tokens[user])

    def _member(self, action: str, actor: str, room: RoomPlay, target: str | None) -> None:
        body = {} if target is None else {"user_id": target}
        self.hs.request("POST", self._path(room.room_id, action), body, self.tokens[actor])

    def _setting(self, room: RoomPlay, setting: str) -> None:
        self.hs.request("PUT", self._path(room.room_id, "state/m.room.history_visibility/"),
                        {"history_visibility": setting}, self.tokens[room.creator])

    def burst(self, room: RoomPlay, step: int) -> None:
        """Several members send at once: concurrent requests fork the DAG."""
        senders = sorted(room.joined)
        threads = [threading.Thread(target=self._send, args=(s, room, f"burst {step} {s} {n}"))
                   for s in senders for n in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def step(self, room: RoomPlay, step: int, public: bool) -> None:
        """One action in *room*, chosen by the seeded mix."""
        rng = self.rng
        others = sorted(set(self.tokens) - {room.creator})
        roll = rng.random()
        outsiders = [u for u in others if u not in room.joined | room.banned]
        if roll < 0.12:
            self._setting(room, rng.choice(SETTINGS))
        elif roll < 0.27 and outsiders:
            user = rng.choice(outsiders)
            if public and user not in room.invited and rng.random() < 0.5:
                self._member("join", user, room, None)
                room.joined.add(user)
            elif user in room.invited:
                if rng.random() < 0.7:
                    self._member("join", user, room, None)
                    room.joined.add(user)
                else:
                    self._member("leave", user, room, None)  # declines
                room.invited.discard(user)
            else:
                self._member("invite", room.creator, room, user)
                room.invited.add(user)
        elif roll < 0.35 and len(room.joined) > 1:
            user = rng.choice(sorted(room.joined - {room.creator}))
            self._member("leave", user, room, None)
            room.joined.discard(user)
        elif roll < 0.40 and len(room.joined) > 1:
            user = rng.choice(sorted(room.joined - {room.creator}))
            self._member("kick", room.creator, room, user)
            room.joined.discard(user)
        elif roll < 0.45 and others:
            user = rng.choice([u for u in others if u not in room.banned] or others)
            if user not in room.banned:
                self._member("ban", room.creator, room, user)
                room.banned.add(user)
                room.joined.discard(user)
                room.invited.discard(user)
        elif roll < 0.48 and room.banned:
            user = rng.choice(sorted(room.banned))
            self._member("unban", room.creator, room, user)
            room.banned.discard(user)
        elif roll < 0.60 and len(room.joined) > 2:
            self.burst(room, step)
        else:
            self._send(rng.choice(sorted(room.joined)), room, f"message {step}")


@dataclass
class StoredHistory:
    """A room as the reference homeserver persisted it."""

    room_id: str
    version: str
    #: ``(event_id, json bytes)`` in stream order
    events: list[tuple[str, bytes]]
    #: event ID -> its fields (decoded JSON)
    bodies: dict[str, dict[str, Any]]
    #: event ID -> (topological ordering, stream ordering)
    places: dict[str, tuple[int, int]]
    #: event ID -> its prev events
    prevs: dict[str, list[str]]
    #: event ID -> the state after it, the reference's own
    state_after: dict[str, dict[tuple[str, str], str]]


def read_history(database: str, room_id: str) -> StoredHistory:
    """*room_id*'s events and the reference's state after each, from its database."""
    with closing(sqlite3.connect(database, timeout=30)) as db:
        version = db.execute("SELECT room_version FROM rooms WHERE room_id = ?",
                             (room_id,)).fetchone()[0]
        rows = db.execute(
            "SELECT e.event_id, j.json, e.topological_ordering, e.stream_ordering FROM events e"
            " JOIN event_json j ON j.event_id = e.event_id WHERE e.room_id = ?"
            " AND NOT e.outlier ORDER BY e.stream_ordering", (room_id,)).fetchall()
        groups = dict(db.execute(
            "SELECT g.event_id, g.state_group FROM event_to_state_groups g"
            " JOIN events e ON e.event_id = g.event_id WHERE e.room_id = ?", (room_id,)))
        edges = dict(db.execute("SELECT state_group, prev_state_group FROM state_group_edges"))
        deltas: dict[int, dict[tuple[str, str], str]] = {}
        for group, etype, state_key, event_id in db.execute(
                "SELECT state_group, type, state_key, event_id FROM state_groups_state"
                " WHERE room_id = ?", (room_id,)):
            deltas.setdefault(group, {})[(etype, state_key)] = event_id
    full: dict[int, dict[tuple[str, str], str]] = {}

    def state_of(group: int) -> dict[tuple[str, str], str]:
        chain = []
        g: int | None = group
        while g is not None and g not in full:
            chain.append(g)
            g = edges.get(g)
        for g in reversed(chain):
            parent = edges.get(g)
            full[g] = {**(full[parent] if parent is not None else {}), **deltas.get(g, {})}
        return full[group]

    bodies = {event_id: json.loads(raw) for event_id, raw, _, _ in rows}
    return StoredHistory(
        room_id, str(version), [(event_id, raw.encode() if isinstance(raw, str) else raw)
                                for event_id, raw, _, _ in rows],
        bodies, {event_id: (int(t), int(s)) for event_id, _, t, s in rows},
        {e: [p if isinstance(p, str) else p[0] for p in b.get("prev_events", [])]
         for e, b in bodies.items()},
        {event_id: state_of(group) for event_id, group in groups.items()})

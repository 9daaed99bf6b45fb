"""A client-API workload that makes a reference homeserver write nine of its streams:
``events``, ``typing``, ``receipts``, ``account_data``, ``to_device``,
``device_lists``, ``push_rules``, ``pushers`` and ``presence``.

Two users share a room; each :meth:`NineStreams.step` sends a message and touches
every other stream once (typing on and off, a read receipt, global and room
account data and a tag, a to-device message, a device's display name, a push rule,
a pusher added or removed, and a presence status). :class:`MediaQuarantine` writes
a tenth, ``quarantined_media``.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

from support.reference_homeserver import Homeserver

#: The streams :class:`NineStreams` writes.
STREAMS = ("events", "typing", "receipts", "account_data", "to_device", "device_lists", "push_rules",
           "pushers", "presence")

_V3 = "/_matrix/client/v3"


class _User:
    def __init__(self, hs: Homeserver, localpart: str) -> None:
        self.token = hs.register(localpart)
        self.user_id = f"@{localpart}:{hs.server_name}"
        self.device_id = str(hs.request("GET", f"{_V3}/devices", token=self.token)["devices"][0]["device_id"])


class NineStreams:
    """Two users in one room, and steps that touch nine streams."""

    def __init__(self, hs: Homeserver) -> None:
        self.hs = hs
        tag = uuid.uuid4().hex[:8]
        self.alice = _User(hs, f"alice{tag}")
        self.bob = _User(hs, f"bob{tag}")
        self.room = hs.create_room(self.alice.token)
        room = quote(self.room)
        hs.request("POST", f"{_V3}/rooms/{room}/invite", {"user_id": self.bob.user_id}, self.alice.token)
        hs.request("POST", f"{_V3}/rooms/{room}/join", {}, self.bob.token)

    def _as(self, user: _User, method: str, path: str, body: Any = None) -> Any:
        return self.hs.request(method, _V3 + path, body, user.token)

    def step(self, n: int) -> None:
        """One round: a message and one change on each of the other eight streams."""
        alice, bob, room = self.alice, self.bob, quote(self.room)
        event_id = self.hs.send_message(alice.token, self.room, f"message {n}")
        self._as(bob, "PUT", f"/rooms/{room}/typing/{quote(bob.user_id)}",
                 {"typing": n % 2 == 0, "timeout": 30000})
        self._as(bob, "POST", f"/rooms/{room}/receipt/m.read/{quote(event_id)}", {})
        self._as(alice, "PUT", f"/user/{quote(alice.user_id)}/account_data/org.example.step", {"n": n})
        self._as(alice, "PUT", f"/user/{quote(alice.user_id)}/rooms/{room}/account_data/org.example.room",
                 {"n": n})
        self._as(alice, "PUT", f"/user/{quote(alice.user_id)}/rooms/{room}/tags/u.step{n % 2}", {"order": 0.5})
        self._as(alice, "PUT", f"/sendToDevice/org.example.ping/{uuid.uuid4().hex}",
                 {"messages": {bob.user_id: {bob.device_id: {"n": n}}}})
        self._as(bob, "PUT", f"/devices/{quote(bob.device_id)}", {"display_name": f"phone {n}"})
        self._as(alice, "PUT", f"/pushrules/global/override/org.example.rule{n % 2}",
                 {"actions": ["dont_notify"],
                  "conditions": [{"kind": "event_match", "key": "content.body", "pattern": f"step {n}"}]})
        self._as(alice, "POST", "/pushers/set", self._pusher(n))
        self._as(bob, "PUT", f"/presence/{quote(bob.user_id)}/status",
                 {"presence": "online" if n % 2 == 0 else "unavailable", "status_msg": f"step {n}"})

    @staticmethod
    def _pusher(n: int) -> dict[str, Any]:
        """A pusher added on even steps, removed (``kind`` null) on odd ones; it
        points at a port nothing listens on."""
        return {"kind": "http" if n % 2 == 0 else None, "app_id": "org.example.app", "pushkey": "key",
                "app_display_name": "example", "device_display_name": "phone", "lang": "en",
                "data": {"url": "http://127.0.0.1:9/_matrix/push/v1/notify"}}


class MediaQuarantine:
    """A server admin whose steps upload a file, quarantine it and release it: two
    ``quarantined_media`` rows of local media each."""

    def __init__(self, hs: Homeserver) -> None:
        self.hs = hs
        self.token = hs.register(f"admin{uuid.uuid4().hex[:8]}", admin=True)

    def step(self, n: int) -> None:
        media_id = self.hs.upload(self.token, f"file {n}".encode())
        where = f"{quote(self.hs.server_name)}/{quote(media_id)}"
        self.hs.request("POST", f"/_synapse/admin/v1/media/quarantine/{where}", {}, self.token)
        self.hs.request("POST", f"/_synapse/admin/v1/media/unquarantine/{where}", {}, self.token)

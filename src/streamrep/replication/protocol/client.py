"""A worker's or writer's end of a TCP connection to the hub."""

from __future__ import annotations

from typing import Any, Sequence

import orjson

from streamrep.replication import commands as C
from streamrep.replication.protocol.actions import Action, Confirmed, DisconnectReason, GapUnfilled, Received, Send
from streamrep.replication.protocol.reader import FollowerState
from streamrep.replication.protocol.session import Session
from streamrep.replication.protocol.settings import ConnectionSettings
from streamrep.wire_commands import SERVER_SIDE

__all__ = ["ClientSession"]

_group_rdata = C.group_rdata
_loads = orjson.loads
_ALL = "ALL"


class ClientSession(Session):
    """A worker's or writer's end of one connection to the hub.

    *follower* is None for a process that only writes. *writer_positions* are
    this process's persisted positions ``(stream, instance, token)``, announced
    first so the hub fills what it missed. *resume_through_hub*: the reader has
    no database, so it asks the hub to stream what it missed (legacy
    ``REPLICATE <stream> <token>``) instead of filling gaps itself. A gap such
    a reader cannot fill (:class:`GapUnfilled`) closes the session at once,
    so no later fact of the read moves a position past the missing ones.

    The hub answers this process's own ``RDATA`` and ``POSITION`` with the
    position it took for the writer (a ``POSITION`` naming this client's
    instance, which is the only instance it may write as): those are
    :class:`Confirmed`, not facts to follow.

    A line naming a command this version does not know is handed on as
    :class:`Received` (a newer hub may send one), never a reason to close.
    With *hand_on_positions*, every other writer's ``POSITION`` of a followed
    stream is also :class:`Received`, after the follower took it.
    """

    peer_side = SERVER_SIDE
    passes_unknown_commands = True

    def __init__(self, settings: ConnectionSettings, *, client_name: str, server_name: str | None = None,
                 follower: FollowerState | None = None, resume_through_hub: bool = False,
                 hand_on_positions: bool = False, now: float | None = None) -> None:
        super().__init__(settings, now)
        self.client_name = client_name
        self.expected_server = server_name
        self.server_name: str | None = None
        self.follower = follower
        self.resume_through_hub = resume_through_hub
        self.hand_on_positions = hand_on_positions

    def greeting(self, writer_positions: Sequence[tuple[str, str, int]] = ()) -> list[Action]:
        """What the client sends on a new connection: ``NAME``, ``PING``, its
        writers' positions, ``REPLICATE``."""
        out: list[Action] = [Send(C.encode_one(C.name(self.client_name)), 1, "NAME"),
                             Send(C.encode_one(C.ping()), 1, "PING")]
        if writer_positions:
            data, count = C.position_lines((s, i, t, t) for s, i, t in writer_positions)
            out.append(Send(data, count, "POSITION"))
        for command in self.replicate_commands():
            out.append(Send(C.encode_one(command), 1, "REPLICATE"))
        return out

    def replicate_commands(self) -> list[Any]:
        """The ``REPLICATE`` commands for a new connection."""
        follower = self.follower
        if follower is None:
            return []
        if not self.resume_through_hub:
            return [C.replicate()]
        tokens = follower.resume_tokens()
        if follower.streams is None and not tokens:
            return [C.replicate(_ALL, None)]
        # Each stream from its own token (one token for all would replay the
        # busiest streams from the quietest one's position).
        names = sorted(follower.streams) if follower.streams is not None else sorted(tokens)
        return [C.replicate(stream, tokens.get(stream)) for stream in names]

    def _dispatch(self, commands: list[Any], out: list[Action]) -> None:
        # RDATA is nearly all of the traffic: the core groups consecutive rows of
        # one writer, so the bookkeeping runs once per fact, not per row.
        follower = self.follower
        if follower is None:
            super()._dispatch(commands, out)
            return
        on_run = follower.rdata_run
        handlers = self._handlers
        for item in _group_rdata(commands):
            if self.closed:
                return
            if type(item) is tuple:
                on_run(item[0], item[1], item[2], item[3], out)
                continue
            handler = handlers.get(item.NAME)
            if handler is None:
                self._refuse(item, out)
                return
            handler(self, item, out)

    def on_SERVER(self, command: Any, out: list[Action]) -> None:
        self.server_name = command.data
        if self.expected_server is not None and command.data != self.expected_server:
            self._close(out, DisconnectReason.WRONG_SERVER,
                        f"expected server {self.expected_server}, found {command.data}")

    def on_RDATA(self, command: Any, out: list[Action]) -> None:
        if self.follower is not None:
            try:
                row = _loads(command.row_json)
            except orjson.JSONDecodeError:
                row = command.row  # raises the wire format's own MalformedCommandError
            self.follower.rdata(command.stream_name, command.instance_name, command.token, row, out)

    def on_POSITION(self, command: Any, out: list[Action]) -> None:
        if command.instance_name == self.client_name:
            out.append(Confirmed(command.stream_name, command.instance_name, command.new_token))
            return
        if self.follower is not None:
            before = len(out)
            self.follower.position(command.stream_name, command.instance_name, command.prev_token,
                                   command.new_token, out)
            if self.hand_on_positions and self.follower.follows(command.stream_name):
                out.insert(before, Received(command))
            if len(out) > before and type(out[-1]) is GapUnfilled:
                # No database to fill it: resynchronise through the hub from the
                # positions as they are now. Nothing after the gap is taken, since
                # a later fact of this writer would move its position past the
                # missing ones and the hub would never send them.
                self._close(out, DisconnectReason.GAP_UNFILLED)

    def _other(self, command: Any, out: list[Action]) -> None:
        out.append(Received(command))

    on_USER_SYNC = on_CLEAR_USER_SYNC = on_FEDERATION_ACK = on_USER_IP = _other
    on_REMOTE_SERVER_UP = on_LOCK_RELEASED = on_NEW_ACTIVE_TASK = on_CANCEL_TASK = _other

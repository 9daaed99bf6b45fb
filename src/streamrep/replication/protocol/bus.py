"""One process on a shared bus with no hub (Redis pub/sub), sans-IO (see :class:`BusSession`)."""

from __future__ import annotations

from typing import Any, Collection, Mapping, Sequence

from streamrep.replication import commands as C
from streamrep.replication.protocol.actions import Action, Received, Send
from streamrep.replication.protocol.reader import FollowerState
from streamrep.replication.protocol.session import Session
from streamrep.replication.protocol.settings import ConnectionSettings

__all__ = ["BusSession"]

_group_rdata = C.group_rdata


class BusSession(Session):
    """One process on a shared bus (Redis pub/sub): there is no hub.

    Every process publishes its own commands (:class:`Send` means "publish") and
    receives everyone's, its own included. It answers every ``REPLICATE`` with
    the positions of the streams it writes, drops ``RDATA``/``POSITION`` of its
    own *instances* (its echoes), and follows everyone else's through
    *follower* (gaps become :class:`FillGap`, or :class:`GapUnfilled` without a
    database). With *stream_writers*, rows and positions of an instance that is
    not a configured writer of the stream are dropped (nobody can be
    disconnected on a bus) and counted in :attr:`refused`.

    Without a database to check them against, a writer's rows count only once one
    of its ``POSITION`` commands arrived on the current subscription
    (:meth:`announce` starts one): rows published while this process was not
    subscribed are unknown to it, and that ``POSITION`` reveals the gap, whereas
    the first rows heard would otherwise move the position past them. A reader
    that verifies (``follower.verify``) fills every fact from its database up
    to what it hears, so it needs no such ``POSITION``.

    A line naming a command this version does not know is handed on as
    :class:`Received`; a bad line closes nothing (anyone may publish). With
    *hand_on_positions*, every other writer's ``POSITION`` of a followed stream is
    also :class:`Received`, after the follower took it.
    """

    peer_side = None
    passes_unknown_commands = True
    closes_on_bad_lines = False

    def __init__(self, settings: ConnectionSettings, *, instances: Collection[str] = (),
                 follower: FollowerState | None = None,
                 stream_writers: Mapping[str, Collection[str]] | None = None,
                 hand_on_positions: bool = False, now: float | None = None) -> None:
        super().__init__(settings, now)
        self.instances = frozenset(instances)
        self.follower = follower
        self.hand_on_positions = hand_on_positions
        self.stream_writers = ({s: frozenset(ws) for s, ws in stream_writers.items()}
                               if stream_writers is not None else None)
        #: this process's writers' positions, as announced
        self.own_positions: dict[tuple[str, str], int] = {}
        #: commands dropped because their writer may not write that stream
        self.refused = 0
        #: writers whose POSITION arrived on the current subscription
        self.heard: set[tuple[str, str]] = set()

    def announce(self, writer_positions: Sequence[tuple[str, str, int]]) -> list[Action]:
        """On (re)subscribing: ``REPLICATE``, then the position of every stream this
        process writes (peers cannot see a bus reconnect), as every reference
        process does."""
        out: list[Action] = [Send(C.encode_one(C.replicate()), 1, "REPLICATE")]
        self.heard.clear()
        if self.follower is not None:
            self.follower.connection_lost()
        for stream, instance, token in writer_positions:
            self.own_positions[(stream, instance)] = token
        data, count = C.position_lines((s, i, t, t) for (s, i), t in self.own_positions.items())
        if count:
            out.append(Send(data, count, "POSITION"))
        return out

    def rows(self, stream: str, instance: str, rows: Sequence[tuple[int, bytes]]) -> list[Action]:
        """Publish committed rows ``(token, row_json)`` of one of this process's writers."""
        if not rows:
            return []
        self.own_positions[(stream, instance)] = rows[-1][0]
        return [Send(C.rdata_lines(stream, instance, rows), len(rows), "RDATA")]

    def position(self, stream: str, instance: str, prev_token: int, new_token: int) -> list[Action]:
        """Publish an advance of one of this process's writers without rows."""
        self.own_positions[(stream, instance)] = new_token
        return [Send(C.encode_one(C.position(stream, instance, prev_token, new_token)), 1, "POSITION")]

    def _allowed(self, stream: str, instance: str) -> bool:
        if instance in self.instances:
            return False  # our own echo
        if self.stream_writers is not None and instance not in self.stream_writers.get(stream, ()):
            self.refused += 1
            return False
        return True

    def _dispatch(self, commands: list[Any], out: list[Action]) -> None:
        handlers = self._handlers
        follower = self.follower
        for item in _group_rdata(commands):
            if type(item) is tuple:
                if (follower is not None and (follower.verify is not None or (item[0], item[1]) in self.heard)
                        and self._allowed(item[0], item[1])):
                    follower.rdata_run(item[0], item[1], item[2], item[3], out)
                continue
            handler = handlers.get(item.NAME)
            if handler is not None:
                handler(self, item, out)

    def on_REPLICATE(self, command: Any, out: list[Action]) -> None:
        data, count = C.position_lines((s, i, t, t) for (s, i), t in self.own_positions.items())
        if count:
            out.append(Send(data, count, "POSITION"))

    def on_POSITION(self, command: Any, out: list[Action]) -> None:
        if self.follower is not None and self._allowed(command.stream_name, command.instance_name):
            self.heard.add((command.stream_name, command.instance_name))
            self.follower.position(command.stream_name, command.instance_name, command.prev_token,
                                   command.new_token, out)
            if self.hand_on_positions and self.follower.follows(command.stream_name):
                out.append(Received(command))

    def on_ERROR(self, command: Any, out: list[Action]) -> None:
        out.append(Received(command))  # a bus is not closed by one process's complaint

    def _other(self, command: Any, out: list[Action]) -> None:
        out.append(Received(command))

    on_SERVER = on_NAME = on_USER_SYNC = on_CLEAR_USER_SYNC = on_FEDERATION_ACK = on_USER_IP = _other
    on_REMOTE_SERVER_UP = on_LOCK_RELEASED = on_NEW_ACTIVE_TASK = on_CANCEL_TASK = _other

"""The hub's end of one connection: who may say what, relaying (see :class:`HubPeer`)."""

from __future__ import annotations

from typing import Any, Callable, Collection, Protocol, Sequence

from streamrep.errors import MalformedCommandError
from streamrep.replication import commands as C
from streamrep.replication.protocol.actions import (
    Action, CatchUp, Close, DisconnectReason, Publish, Relay, Send,
)
from streamrep.replication.protocol.session import Session
from streamrep.replication.protocol.settings import ConnectionSettings
from streamrep.wire_commands import CLIENT_SIDE

__all__ = ["HubPeer", "HubView"]

_group_rdata = C.group_rdata
_ALL = "ALL"
#: Commands that do not make a peer active: a peer that sends only these holds a
#: slot without replicating, writing or relaying anything.
_NOT_ACTIVITY = frozenset({"NAME", "PING", "ERROR"})


class HubView(Protocol):
    """What a peer reads and changes of the hub's shared state:
    :class:`~streamrep.replication.protocol.hub.HubState` is the one implementation,
    and it makes each peer (:meth:`~streamrep.replication.protocol.hub.HubState.new_peer`)."""

    @property
    def settings(self) -> ConnectionSettings: ...
    @property
    def server_name(self) -> str: ...
    @property
    def server_line(self) -> bytes: ...
    @property
    def own_instances(self) -> Collection[str]: ...
    @property
    def row_check(self) -> Callable[[str, Sequence[Any]], str | None] | None: ...
    @property
    def positions(self) -> dict[tuple[str, str], int]: ...
    @property
    def known_streams(self) -> dict[str, None]: ...

    def peer_active(self, peer: HubPeer) -> None: ...
    def claim_writer(self, instance: str, peer: HubPeer) -> str | None: ...
    def may_write(self, peer_name: str | None, stream: str, instance: str) -> str | None: ...
    def token_limit(self, stream: str, instance: str, token: int) -> int | None: ...
    def position_lines(self, stream: str | None = None) -> tuple[bytes, int]: ...
    def stream_names(self) -> list[str]: ...
    def readable(self, stream: str) -> bool: ...
    def writer_position(self, stream: str, instance: str, prev_token: int,
                        new_token: int) -> list[Action]: ...
    def user_sync(self, instance_id: str, user_id: str, is_syncing: bool) -> None: ...
    def clear_user_sync(self, instance_id: str) -> None: ...


class HubPeer(Session):
    """The hub's end of one connection (see :class:`HubState`).

    A peer must send a valid ``NAME`` within ``handshake_timeout``; a writer's
    ``NAME`` claims its instance (one live connection each). ``RDATA`` of one
    writer is gathered per fact and published once per read as the writer's exact
    lines; a row that does not fit its stream (or is not JSON), a ``batch`` run longer than
    ``max_pending_rows``, or a stream the peer may not write closes it with ``ERROR``.

    A peer is *pending* until it is :attr:`active`: named, and it sent a command the
    hub acts on (``REPLICATE``, ``RDATA``, ``POSITION``, a relayed command; not
    ``PING``). A pending peer still pending ``idle_timeout`` seconds after it
    connected is closed, and :class:`HubState` closes the oldest pending peers when
    new connections exceed the pending limits.
    """

    peer_side = CLIENT_SIDE
    # No __dict__: a hub holds thousands of these.
    __slots__ = ("hub", "label", "host", "name", "live_all", "live_streams", "catching_up", "sync_instances",
                 "_batches", "_pending_rows", "_claimed", "_relay", "_acks", "active", "_acted")

    def __init__(self, hub: HubView, label: str, host: str = "", now: float | None = None) -> None:
        super().__init__(hub.settings, now)
        self.hub = hub
        self.label = label
        self.host = host
        #: the peer's NAME once accepted
        self.name: str | None = None
        #: subscribed to every stream (``REPLICATE`` or ``REPLICATE ALL``)
        self.live_all = False
        #: streams subscribed one by one (legacy ``REPLICATE <stream> ...``)
        self.live_streams: set[str] = set()
        #: streams whose catch-up is still being streamed; no live rows meanwhile
        self.catching_up: set[str] = set()
        #: instance IDs this connection reported syncing users for
        self.sync_instances: set[str] = set()
        self._batches: dict[tuple[str, str], list[Any]] = {}
        self._pending_rows = 0
        self._claimed = False
        self._relay: dict[str, list[Any]] = {}
        #: writers whose RDATA or POSITION this read took: answered with their position
        self._acks: set[tuple[str, str]] = set()
        #: named and sent a command the hub acts on (see the class docstring)
        self.active = False
        self._acted = False

    def greeting(self) -> list[Action]:
        """``SERVER <name>`` and ``PING``."""
        return [Send(self.hub.server_line, 1, "SERVER"),
                Send(C.encode_one(C.ping()), 1, "PING")]

    def wants(self, stream: str) -> bool:
        """Whether live rows of *stream* go to this peer now."""
        return (self.live_all or stream in self.live_streams) and stream not in self.catching_up

    def tick(self, now: float, idle: bool) -> list[Action]:
        if not self.closed and not self.active:
            settings = self.settings
            waited = now - self.started_at
            if self.name is None and waited > settings.handshake_timeout:
                self._mark_closed(DisconnectReason.HANDSHAKE_TIMEOUT)
                return [Close(DisconnectReason.HANDSHAKE_TIMEOUT,
                              f"no NAME received within {settings.handshake_timeout:g} seconds")]
            if waited > settings.idle_timeout:
                self._mark_closed(DisconnectReason.IDLE_TIMEOUT)
                return [Close(DisconnectReason.IDLE_TIMEOUT,
                              f"idle: no REPLICATE, RDATA, POSITION or other command after NAME within "
                              f"{settings.idle_timeout:g} seconds of connecting")]
        return super().tick(now, idle)

    def _note_activity(self, commands: list[Any]) -> None:
        """Become active once named and a command the hub acts on has come."""
        if not self._acted:
            for command in commands:
                if command.NAME not in _NOT_ACTIVITY:
                    self._acted = True
                    break
        if self._acted and self.name is not None and not self.closed:
            self.active = True
            self.hub.peer_active(self)

    def catch_up_done(self, stream: str) -> None:
        """The transport streamed *stream*'s catch-up: live rows flow again."""
        self.catching_up.discard(stream)

    # --- dispatch ----------------------------------------------------------------------------

    def _dispatch(self, commands: list[Any], out: list[Action]) -> None:
        if not self.active:
            try:
                self._dispatch_commands(commands, out)
            finally:
                self._note_activity(commands)
            return
        self._dispatch_commands(commands, out)

    def _dispatch_commands(self, commands: list[Any], out: list[Action]) -> None:
        # A writer's RDATA comes grouped per fact by the core; consecutive facts of
        # one writer are checked together and gathered per stream, published once
        # per read; anything else first flushes what was gathered, keeping the order.
        handlers = self._handlers
        facts: list[tuple[Any, ...]] = []
        try:
            for item in _group_rdata(commands):
                if type(item) is tuple:
                    if facts and (item[0] != facts[0][0] or item[1] != facts[0][1]):
                        self._writer_facts(facts, out)
                        facts = []
                    facts.append(item)
                    continue
                if facts:
                    self._writer_facts(facts, out)
                    facts = []
                if self.closed:
                    return
                if self._relay:
                    self._flush_relay(out)
                handler = handlers.get(item.NAME)
                if handler is None:
                    self._refuse(item, out)
                    return
                handler(self, item, out)
            if facts:
                self._writer_facts(facts, out)
            if self._acks and not self.closed:
                if self._relay:
                    self._flush_relay(out)
                self._answer_writer(out)
        finally:
            # Facts gathered before a bad line passed every check and moved the
            # hub's positions: they go out whatever follows.
            if self._relay:
                self._flush_relay(out)
            self._acks.clear()

    def _answer_writer(self, out: list[Action]) -> None:
        """Tell the writer the position the hub took for each of its streams this
        read touched: what its link counts as accepted (``confirmed``). Only on a
        connection the hub keeps: a writer refused in this read hears the refusal."""
        acks, self._acks = self._acks, set()
        positions = self.hub.positions
        data, count = C.position_lines((s, i, positions[(s, i)], positions[(s, i)])
                                       for s, i in sorted(acks) if (s, i) in positions)
        if count:
            out.append(Send(data, count, "POSITION"))

    def _flush_relay(self, out: list[Action]) -> None:
        relay = self._relay
        self._relay = {}
        for stream, rdata in relay.items():
            out.append(Publish(stream, C.encode_many(rdata), len(rdata), "RDATA"))

    def _refused(self, out: list[Action], why: str) -> None:
        self._close(out, DisconnectReason.REFUSED, why)

    def _writer_facts(self, facts: list[tuple[Any, ...]], out: list[Action]) -> None:
        """Consecutive facts ``(stream, instance, token, commands)`` of one writer
        from one read. Several are checked together (one read of the database's
        token per batch of facts rather than per fact); when that fails they are
        checked one by one, so the facts before the first bad one still go out, as
        they would have alone."""
        stream, instance = facts[0][0], facts[0][1]
        if (len(facts) > 1 and not self.closed and self._may_write(stream, instance, out)
                and self._all_pass(stream, instance, facts)):
            if self._take_run(stream, instance, facts):
                return
            for fact in facts:
                self._take_fact(stream, instance, fact[2], fact[3], out)
                if self.closed:
                    return
            return
        for fact in facts:
            if self.closed:
                return
            self._rdata_run(stream, instance, fact[2], fact[3], out)

    def _all_pass(self, stream: str, instance: str, facts: list[tuple[Any, ...]]) -> bool:
        """Whether every row of *facts* fits and their last token is stored."""
        if self._rows_problem(stream, [command for fact in facts for command in fact[3]]) is not None:
            return False
        last = max((fact[2] for fact in facts if fact[2] is not None), default=None)
        return last is None or self.hub.token_limit(stream, instance, last) is None

    def _rows_problem(self, stream: str, commands: list[Any]) -> str | None:
        """What is wrong with the rows of RDATA *commands* of *stream*, or None."""
        row_check = self.hub.row_check
        if row_check is not None:
            # The stream's row format (JSON validity included), checked in place.
            return row_check(stream, commands)
        try:
            C.validate_rows(commands)
        except MalformedCommandError:
            return "row is not valid JSON"
        return None

    def _rdata_run(self, stream: str, instance: str, token: int | None, commands: list[Any],
                   out: list[Action]) -> None:
        """One fact (or the ``batch`` rows of one), checked on its own."""
        if not self._may_write(stream, instance, out):
            return
        problem = self._rows_problem(stream, commands)
        if problem is not None:
            raise MalformedCommandError(f"RDATA {stream} {instance}: {problem}")
        if token is not None:
            pos = self.hub.positions.get((stream, instance))
            if pos is None or token > pos:
                limit = self.hub.token_limit(stream, instance, token)
                if limit is not None:
                    self._refused(out, f"{stream}/{instance} token {token} is past what the database "
                                       f"holds ({limit})")
                    return
        self._take_fact(stream, instance, token, commands, out)

    def _take_run(self, stream: str, instance: str, facts: list[tuple[Any, ...]]) -> bool:
        """Take checked facts at once when they are the usual run of a writer: each
        with a token past the one before and the writer's position, no ``batch`` rows
        waiting. False (nothing taken) otherwise, for :meth:`_take_fact` one by one."""
        key = (stream, instance)
        hub = self.hub
        if key in self._batches:
            return False
        last = hub.positions.get(key, -1)
        for fact in facts:
            token = fact[2]
            if token is None or token <= last:
                return False
            last = token
        self._acks.add(key)
        hub.positions[key] = last
        hub.known_streams.setdefault(stream, None)
        buf = self._relay.get(stream)
        if buf is None:
            buf = self._relay[stream] = []
        for fact in facts:
            buf.extend(fact[3])
        return True

    def _take_fact(self, stream: str, instance: str, token: int | None, commands: list[Any],
                   out: list[Action]) -> None:
        """Gather a checked fact for relaying (``batch`` rows wait for their token)."""
        key = (stream, instance)
        if token is None:
            self._pending_rows += len(commands)
            if self._pending_rows > self.settings.max_pending_rows:
                self._refused(out, f"more than {self.settings.max_pending_rows} batch rows without a token")
                return
            waiting = self._batches.get(key)
            if waiting is None:
                self._batches[key] = commands
            else:
                waiting.extend(commands)
            return
        waiting = self._batches.pop(key, None)
        if waiting:
            self._pending_rows -= len(waiting)
        hub = self.hub
        self._acks.add(key)
        pos = hub.positions.get(key)
        if pos is not None and token <= pos:
            return  # already published (the hub filled it from the database)
        hub.positions[key] = token
        hub.known_streams.setdefault(stream, None)
        buf = self._relay.get(stream)
        if buf is None:
            buf = self._relay[stream] = []
        if waiting:
            buf.extend(waiting)
        buf.extend(commands)

    # --- commands ----------------------------------------------------------------------------

    def on_NAME(self, command: Any, out: list[Action]) -> None:
        name = command.data
        if not name or " " in name:
            self._refused(out, f"NAME must be one word, not {name!r}")
            return
        if self.name is not None and name != self.name:
            self._refused(out, f"NAME {name}: this connection is {self.name} already")
            return
        if name in self.hub.own_instances:
            self._refused(out, f"NAME {name} is this hub's own instance")
            return
        self.name = name

    def _may_write(self, stream: str, instance: str, out: list[Action]) -> bool:
        # The first write claims the instance: one live connection per writer.
        hub = self.hub
        problem = hub.may_write(self.name, stream, instance)
        if problem is None and not self._claimed:
            problem = hub.claim_writer(instance, self)
            self._claimed = problem is None
        if problem is not None:
            self._refused(out, problem)
            return False
        return True

    def on_REPLICATE(self, command: Any, out: list[Action]) -> None:
        stream = command.stream_name
        hub = self.hub
        if stream is None:
            # Current protocol: every position, then everything live.
            data, count = hub.position_lines()
            if count:
                out.append(Send(data, count, "POSITION"))
            self.live_all = True
            return
        known = hub.stream_names()
        if stream != _ALL and stream not in known:
            self._close(out, DisconnectReason.PROTOCOL_ERROR, f"unknown stream {stream}")
            return
        streams = list(known) if stream == _ALL else [stream]
        token = command.token
        if token is None:
            for name in streams:
                data, count = hub.position_lines(name)
                if count:
                    out.append(Send(data, count, "POSITION"))
        else:
            if stream != _ALL and not hub.readable(stream):
                self._close(out, DisconnectReason.PROTOCOL_ERROR,
                            f"cannot replicate {stream} from a token: this hub has no stored rows of it")
                return
            for name in streams:
                if hub.readable(name):
                    self.catching_up.add(name)
                    out.append(CatchUp(name, int(token)))
                else:
                    # Streams only relayed through the hub go live from now.
                    data, count = hub.position_lines(name)
                    if count:
                        out.append(Send(data, count, "POSITION"))
        if stream == _ALL:
            self.live_all = True
        else:
            self.live_streams.add(stream)

    def on_RDATA(self, command: Any, out: list[Action]) -> None:
        self._rdata_run(command.stream_name, command.instance_name, command.token, [command], out)

    def on_POSITION(self, command: Any, out: list[Action]) -> None:
        stream, instance = command.stream_name, command.instance_name
        if not self._may_write(stream, instance, out):
            return
        hub = self.hub
        prev_token, new_token = command.prev_token, command.new_token
        limit = hub.token_limit(stream, instance, new_token)
        if limit is not None:
            # Refused rather than trimmed: the hub's position does not move, so
            # if the database was only behind, the writer's next connection
            # announces again and the hub fills everything from there.
            self._refused(out, f"{stream}/{instance} position {new_token} is past what the database holds "
                               f"({limit})")
            return
        waiting = self._batches.pop((stream, instance), None)
        if waiting:
            self._pending_rows -= len(waiting)
        out.extend(hub.writer_position(stream, instance, prev_token, new_token))
        self._acks.add((stream, instance))

    def on_USER_SYNC(self, command: Any, out: list[Action]) -> None:
        self.sync_instances.add(command.instance_id)
        self.hub.user_sync(command.instance_id, command.user_id, bool(command.is_syncing))
        out.append(Relay(C.encode_one(command), "USER_SYNC"))

    def on_CLEAR_USER_SYNC(self, command: Any, out: list[Action]) -> None:
        self.hub.clear_user_sync(command.instance_id)
        self.sync_instances.discard(command.instance_id)
        out.append(Relay(C.encode_one(command), "CLEAR_USER_SYNC"))

    def _relay_command(self, command: Any, out: list[Action]) -> None:
        out.append(Relay(C.encode_one(command), command.NAME))

    on_FEDERATION_ACK = on_USER_IP = on_REMOTE_SERVER_UP = _relay_command
    on_LOCK_RELEASED = on_NEW_ACTIVE_TASK = on_CANCEL_TASK = _relay_command

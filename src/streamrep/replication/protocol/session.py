"""What every replication session shares: dispatch bound once, keepalive, closing."""

from __future__ import annotations

import time
from typing import Any, Callable

from streamrep.errors import ProtocolError
from streamrep.replication import commands as C
from streamrep.replication.protocol.actions import Action, Close, DisconnectReason, Received
from streamrep.replication.protocol.keepalive import Keepalive
from streamrep.replication.protocol.settings import ConnectionSettings
from streamrep.wire_commands import CLIENT_SIDE, SERVER_SIDE, SPECS, accepted_from

__all__ = ["Session"]

#: ``handler(session, command, out)``: an ``on_<COMMAND>`` method, unbound.
Handler = Callable[[Any, Any, list[Action]], None]
# Session class -> command -> its handler function, found once per class: a new
# session binds nothing (a hub accepting thousands of connections a second pays
# for no bound method it may never call).
_HANDLERS: dict[type, dict[str, Handler]] = {}


class Session:
    """What every session shares: dispatch bound once, keepalive, closing.

    *peer_side* is the side the peer plays (:data:`~streamrep.wire_commands.SERVER_SIDE`
    or :data:`~streamrep.wire_commands.CLIENT_SIDE`); only the commands it may send
    get a handler. ``None`` (a bus) accepts every declared command.
    """

    peer_side: str | None = None
    #: hand lines naming unknown commands on rather than close (a reader: a newer
    #: writer may send commands this version does not know)
    passes_unknown_commands = False
    #: close on a line that cannot be decoded (a bus is never closed by one line)
    closes_on_bad_lines = True
    __slots__ = ("settings", "keepalive", "started_at", "closed", "close_reason", "_handlers")

    def __init__(self, settings: ConnectionSettings, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.settings = settings
        self.keepalive = Keepalive(settings, now)
        self.started_at = now
        self.closed = False
        self.close_reason: str | None = None
        handlers = _HANDLERS.get(type(self))
        if handlers is None:
            handlers = _HANDLERS[type(self)] = self._handler_table()
        #: command -> ``handler(self, command, out)``, shared by every session of the class
        self._handlers = handlers

    @classmethod
    def _handler_table(cls) -> dict[str, Handler]:
        """command -> ``on_<command>`` function, for every command the peer may send
        that this class handles; looked up once per class."""
        allowed = SPECS.keys() if cls.peer_side is None else accepted_from(cls.peer_side)
        return {name: getattr(cls, f"on_{name}") for name in allowed if hasattr(cls, f"on_{name}")}

    # --- driven by the transport ---------------------------------------------------------

    def receive(self, commands: list[Any], now: float) -> list[Action]:
        """Act on decoded *commands* received at *now*."""
        self.keepalive.last_received = now
        out: list[Action] = []
        try:
            self._dispatch(commands, out)
        except ProtocolError as exc:
            self._close(out, DisconnectReason.PROTOCOL_ERROR, str(exc))
        return out

    def receive_failed(self, error: ProtocolError, now: float) -> list[Action]:
        """A read whose decoding failed: act on its good commands (``error.commands``),
        then close with the first problem's message. A session that
        :attr:`passes_unknown_commands` hands lines naming unknown commands on
        (:class:`Received` of an :class:`~streamrep.replication.commands.UnknownCommand`,
        after the read's known commands) and closes only for other problems."""
        out = self.receive(list(getattr(error, "commands", None) or ()), now)
        if self.passes_unknown_commands:
            unknown, problems = C.split_unknown(error)
            out.extend(Received(command) for command in unknown)
        else:
            problems = [error]
        if problems and self.closes_on_bad_lines and not self.closed:
            self._close(out, DisconnectReason.PROTOCOL_ERROR, str(problems[0]))
        return out

    def tick(self, now: float, idle: bool) -> list[Action]:
        """Timers: *idle* says nothing is waiting to be written to this peer."""
        if self.closed:
            return []
        action = self.keepalive.due(now, idle)
        if action is None:
            return []
        if type(action) is Close:
            self._mark_closed(action.reason)
        return [action]

    def data_sent(self, now: float) -> None:
        """The transport handed lines (or part of them) to the peer's socket at *now*."""
        self.keepalive.last_sent = now

    def closing(self, reason: str) -> None:
        """The transport closed the connection (any reason); idempotent."""
        self._mark_closed(reason)

    # --- for subclasses --------------------------------------------------------------------

    def _dispatch(self, commands: list[Any], out: list[Action]) -> None:
        handlers = self._handlers
        for command in commands:
            if self.closed:
                return
            handler = handlers.get(command.NAME)
            if handler is None:
                self._refuse(command, out)
                return
            handler(self, command, out)

    def _refuse(self, command: Any, out: list[Action]) -> None:
        sender = {CLIENT_SIDE: "a client", SERVER_SIDE: "a server"}.get(self.peer_side or "", "a peer")
        self._close(out, DisconnectReason.PROTOCOL_ERROR, f"{command.NAME} is not accepted from {sender}")

    def _close(self, out: list[Action], reason: str, error: str | None = None) -> None:
        if not self.closed:
            self._mark_closed(reason)
            out.append(Close(reason, error))

    def _mark_closed(self, reason: str) -> None:
        if not self.closed:
            self.closed = True
            self.close_reason = reason

    def on_PING(self, command: Any, out: list[Action]) -> None:
        self.keepalive.ping_seen = True

    def on_ERROR(self, command: Any, out: list[Action]) -> None:
        out.append(Received(command))
        self._close(out, DisconnectReason.PEER_ERROR)

"""The two Redis connections of a replication process, in bulk.

A replication process publishes and receives one message per command line, many
thousands a second: through redis-py's ``PubSub`` and pipelines that costs tens
of microseconds a message. These connections instead hand everything one ``recv``
returned to hiredis's reply parser at once, and write a whole batch of
``PUBLISH`` commands packed by hiredis in one send. They speak only what
replication needs (``AUTH``, ``SUBSCRIBE``, ``PUBLISH``, ``PING``), read the
server's address, credentials and TLS settings from the URLs redis-py takes (with
redis-py's own URL parser), and work on the standard library's sockets, which
gevent makes cooperative.
"""

from __future__ import annotations

import socket
import ssl
from typing import TYPE_CHECKING, Any

import gevent
import hiredis
from redis.connection import parse_url

from streamrep import _impl
from streamrep.errors import MalformedReplyError

if TYPE_CHECKING:
    from streamrep._pure import pubsub as _pubsub
else:
    _pubsub = _impl.load("pubsub")

__all__ = ["Publisher", "RedisRefused", "Subscription", "SubscriptionLost", "encode_publish"]

_RECV_BYTES = 1 << 18

#: A publisher's sends time out per piece of this many bytes (see Publisher.send).
_SEND_PIECE = 1 << 20


def encode_publish(channel: str, messages: list[bytes]) -> bytes:
    """``PUBLISH channel message`` for each message, in Redis's wire format."""
    name = channel.encode()
    head = b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%b\r\n$" % (len(name), name)
    return b"".join([b"%b%d\r\n%b\r\n" % (head, len(m), m) for m in messages])


class SubscriptionLost(Exception):
    """The subscribed connection is gone or refused us (the message says which)."""


class RedisRefused(SubscriptionLost):
    """Redis refused this process's credentials or rights (``WRONGPASS``, ``NOAUTH``,
    ``NOPERM``): retrying will not help until the URL or the server's ACL changes.
    *credentials*: it was the user or password, not a right."""

    def __init__(self, message: str, credentials: bool = False) -> None:
        super().__init__(message)
        self.credentials = credentials


#: Error prefixes that mean the credentials or the ACL, not the server's state.
_REFUSALS = ("WRONGPASS", "NOAUTH", "NOPERM", "ERR invalid password", "ERR AUTH", "ERR Client sent AUTH")


def _refusal(command: str, reply: Exception) -> SubscriptionLost:
    """The exception for Redis's error *reply* to *command*."""
    text = str(reply)
    if text.startswith(_REFUSALS):
        if command == "AUTH" or text.startswith(("WRONGPASS", "ERR invalid password", "ERR AUTH",
                                                   "ERR Client sent AUTH")):
            return RedisRefused(f"Redis refused the password: {text}; fix the user and password in the "
                                "Redis URL (or the server's ACL)", credentials=True)
        if text.startswith("NOAUTH"):
            return RedisRefused(f"Redis asks for a password: {text}; put it in the Redis URL "
                                "(redis://:PASSWORD@host:port)", credentials=True)
        return RedisRefused(f"Redis refused {command}: {text}; grant it in the server's ACL")
    return SubscriptionLost(f"Redis refused {command}: {text}")


def _tls_context(options: dict[str, Any]) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=options.get("ssl_ca_certs"), capath=options.get("ssl_ca_path"))
    reqs = str(options.get("ssl_cert_reqs", "required")).lower()
    if reqs in ("none", "cert_none"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif reqs in ("optional", "cert_optional"):
        context.check_hostname = False
        context.verify_mode = ssl.CERT_OPTIONAL
    if options.get("ssl_certfile"):
        context.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
    return context


class _Connection:
    """A connection to the Redis at *url*, authenticated."""

    def __init__(self, url: str, connect_timeout: float) -> None:
        self.url = url
        self.connect_timeout = connect_timeout
        self._sock: socket.socket | None = None
        self._reader = hiredis.Reader()

    # --- connecting --------------------------------------------------------------------

    def _connect(self) -> None:
        options: dict[str, Any] = parse_url(self.url)  # type: ignore[no-untyped-call]
        if "path" in options:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.connect_timeout)
            sock.connect(options["path"])
        else:
            host = options.get("host", "localhost")
            sock = socket.create_connection((host, int(options.get("port", 6379))), self.connect_timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.url.startswith("rediss:"):
                sock = _tls_context(options).wrap_socket(sock, server_hostname=host)
        self._sock = sock
        password = options.get("password")
        if password is not None:
            username = options.get("username")
            self._call(*(("AUTH", username, password) if username else ("AUTH", password)))

    def _send(self, *args: str) -> None:
        assert self._sock is not None
        self._sock.sendall(hiredis.pack_command(args))  # type: ignore[arg-type]

    def _call(self, *args: str) -> Any:
        self._send(*args)
        while True:
            for reply in self._replies():
                if isinstance(reply, hiredis.ReplyError):
                    raise _refusal(args[0], reply)
                return reply

    def _replies(self) -> list[Any]:
        """Everything the next read completes (waits for at least one reply)."""
        while True:
            out = self.read()
            if out:
                return out

    # --- reading -----------------------------------------------------------------------

    def read(self, timeout: float | None = None) -> list[Any]:
        """The replies one read completes: ``[b"message", channel, data]`` lists,
        ``[b"pong", b""]``, ...; empty when *timeout* passed with nothing to read."""
        sock = self._sock
        if sock is None:
            raise SubscriptionLost("not connected")
        reader = self._reader
        sock.settimeout(timeout if timeout is not None else self.connect_timeout)
        try:
            data = sock.recv(_RECV_BYTES)
        except TimeoutError:
            if timeout is None:
                raise SubscriptionLost(f"no answer from Redis in {self.connect_timeout:g}s") from None
            return []
        if not data:
            raise SubscriptionLost("Redis closed the connection")
        reader.feed(data)
        out = []
        gets = reader.gets
        reply = gets()
        while reply is not False:
            out.append(reply)
            reply = gets()
        return out

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass


def _cooperative(sock: Any) -> bool:
    """Whether *sock* is one of gevent's (it waits by switching greenlets)."""
    return type(sock).__module__.startswith("gevent.")


class Subscription(_Connection):
    """One connection subscribed to *channels*."""

    def __init__(self, url: str, channels: list[str], connect_timeout: float) -> None:
        super().__init__(url, connect_timeout)
        self.channels = channels
        # Once subscribed, replies are parsed by the core, not hiredis: the bytes
        # hiredis holds after the subscription's confirmations go to it first.
        self._messages = _pubsub.MessageSplitter()
        self._early = b""

    def open(self) -> None:
        """Connect, authenticate and subscribe; returns once Redis confirmed every channel."""
        self._connect()
        self._send("SUBSCRIBE", *self.channels)
        messages = self._messages
        while messages.subscribed < len(self.channels):
            sock = self._sock
            assert sock is not None
            sock.settimeout(self.connect_timeout)
            try:
                data = sock.recv(_RECV_BYTES)
            except TimeoutError:
                raise SubscriptionLost(f"no answer from Redis in {self.connect_timeout:g}s") from None
            if not data:
                raise SubscriptionLost("Redis closed the connection")
            try:
                lines, _ = messages.feed(data)
            except MalformedReplyError as exc:
                raise SubscriptionLost(str(exc)) from None
            if messages.refusal is not None:
                raise _refusal("SUBSCRIBE", hiredis.ReplyError(messages.refusal.decode(errors="replace")))
            # Messages right behind the confirmations: the first read hands them on.
            self._early += lines

    def ping(self) -> None:
        """Ask for a ``pong`` (a subscribed connection answers it in the stream)."""
        self._send("PING")

    def read_messages(self, timeout: float, skip: bytes | None = None) -> tuple[bytes, int]:
        """The messages one read completes (without those starting with *skip*),
        each followed by a newline, and how many replies it completed (pongs
        included); ``(b"", 0)`` when *timeout* passed with nothing to read."""
        sock = self._sock
        if sock is None:
            raise SubscriptionLost("not connected")
        if self._early:
            return self._take_early(skip), 0
        sock.settimeout(timeout)
        try:
            data = sock.recv(_RECV_BYTES)
        except TimeoutError:
            return b"", 0
        if not data:
            raise SubscriptionLost("Redis closed the connection")
        try:
            lines, replies = self._messages.feed(data, skip)
        except MalformedReplyError as exc:
            raise SubscriptionLost(str(exc)) from None
        return lines, replies

    def _take_early(self, skip: bytes | None) -> bytes:
        """The messages that came behind the subscription's confirmations (those
        starting with *skip* left out), once."""
        early, self._early = self._early, b""
        if skip is None:
            return early
        return b"".join(line + b"\n" for line in early.split(b"\n")[:-1]
                        if not line.startswith(skip))


class Publisher(_Connection):
    """The connection a process publishes on.

    Commands go out as soon as they are queued, without waiting for the answers
    to the previous ones (Redis reads a connection's input a slice at a time, so
    waiting for a big batch's answers makes the next batch bigger still); one
    greenlet sends (:meth:`send`), another takes the answers
    (:meth:`take_answers`) and :attr:`unanswered` counts the difference.
    """

    def __init__(self, url: str, connect_timeout: float) -> None:
        super().__init__(url, connect_timeout)
        #: commands sent, and answered, on this connection
        self.sent = 0
        self.answered = 0

    @property
    def unanswered(self) -> int:
        """Commands sent whose answer has not arrived."""
        return self.sent - self.answered

    def open(self) -> None:
        self._connect()
        self._call("PING")

    def send(self, data: bytes, count: int) -> None:
        """Send *count* commands encoded for Redis (:func:`encode_publish`).

        A big batch takes Redis a while (it passes every message on to each
        subscriber as it reads): what fails is Redis taking no part of it for
        ``connect_timeout``, not the whole batch taking longer than that. The
        socket's timeout stays ``connect_timeout`` (the answers are waited for
        with a greenlet's timeout, see :meth:`take_answers`) and applies to each
        piece of :data:`_SEND_PIECE` bytes.
        """
        sock = self._sock
        if sock is None:
            raise SubscriptionLost("not connected")
        self.sent += count
        sock.settimeout(self.connect_timeout)
        if len(data) <= _SEND_PIECE:
            sock.sendall(data)
            return
        view = memoryview(data)
        for start in range(0, len(view), _SEND_PIECE):
            sock.sendall(view[start:start + _SEND_PIECE])

    def ping(self) -> None:
        self.send(hiredis.pack_command(("PING",)), 1)

    def take_answers(self, timeout: float) -> tuple[int, str | None]:
        """Wait up to *timeout* for answers: how many came, and Redis's refusal of
        one of them (None: none refused)."""
        replies: list[Any] = []
        if _cooperative(self._sock):
            # Not the socket's timeout: a send may be under way on the same socket
            # from another greenlet, and a short socket timeout would cut it.
            with gevent.Timeout(timeout, False):
                replies = self.read()
        else:  # blocking sockets: nothing else runs meanwhile
            replies = self.read(timeout)
        refusal = None
        for reply in replies:
            if isinstance(reply, hiredis.ReplyError):
                refusal = str(reply)
        self.answered += len(replies)
        return len(replies), refusal

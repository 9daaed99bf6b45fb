"""How replication commands sit on Redis pub/sub (sans-IO).

The format every reference deployment shares:

* every command is published on the channel named after the server
  (``example.com``), except ``USER_IP``, which goes to ``example.com/USER_IP``
  and is read only by the processes that subscribe to it;
* each message is one command line, ``NAME args``, UTF-8, without a newline.

A streamrep writer may pack up to ``lines_per_message`` of its ``RDATA`` lines into
one message, separated by newlines (:func:`pack_lines`): one ``PUBLISH`` then carries
a hundred rows, which spares Redis and every reader most of their cost per line.
Every streamrep process reads such messages line by line, whichever format its
peers publish in; a reference process would fail to parse one, so packed messages
belong on channels that no reference process follows.

Redis hands every publisher its own messages back on its subscription.
``RDATA`` and ``POSITION`` name the writer and are recognised by that name;
:class:`EchoFilter` recognises the rest (``REPLICATE``, ``USER_SYNC``, ...):
Redis delivers a connection's own messages in the order it published them, so
the oldest message still awaiting its echo is always the next one of ours to
come back.
"""

from __future__ import annotations

from collections import deque

__all__ = ["USER_IP_SUFFIX", "channels", "channel_for", "pack_lines", "EchoFilter"]

#: The channel suffix of ``USER_IP`` commands.
USER_IP_SUFFIX = "/USER_IP"


def channels(server_name: str, user_ip: bool = False) -> list[str]:
    """The channels a process of *server_name* subscribes to."""
    return [server_name + USER_IP_SUFFIX, server_name] if user_ip else [server_name]


def channel_for(command_name: str, server_name: str) -> str:
    """The channel a command named *command_name* is published on."""
    return server_name + USER_IP_SUFFIX if command_name == "USER_IP" else server_name


def pack_lines(lines: list[bytes], per_message: int) -> list[bytes]:
    """*lines* (without newlines) as messages of up to *per_message* lines each."""
    if per_message <= 1 or len(lines) <= 1:
        return lines
    return [b"\n".join(lines[start:start + per_message]) for start in range(0, len(lines), per_message)]


class EchoFilter:
    """Recognises this process's own messages coming back from Redis.

    :meth:`published` records a message as it goes out (only while subscribed:
    otherwise no echo will come), :meth:`is_echo` consumes the echo. Identical
    messages of another process are indistinguishable from ours; whichever comes
    first is taken as the echo, so the number acted on is still right. The
    record is bounded and cleared on every new subscription.
    """

    __slots__ = ("_waiting", "max_waiting")

    def __init__(self, max_waiting: int = 10_000) -> None:
        self._waiting: deque[bytes] = deque()
        self.max_waiting = max_waiting

    def __len__(self) -> int:
        return len(self._waiting)

    def published(self, message: bytes) -> None:
        waiting = self._waiting
        if len(waiting) >= self.max_waiting:
            waiting.popleft()  # its echo is long overdue: the subscription lost it
        waiting.append(message)

    def is_echo(self, message: bytes) -> bool:
        waiting = self._waiting
        if waiting and waiting[0] == message:
            waiting.popleft()
            return True
        return False

    def clear(self) -> None:
        self._waiting.clear()

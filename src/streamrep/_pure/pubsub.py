"""Messages out of what a Redis subscription sends, in bulk (the pure twin of
``streamrep._core.pubsub``).

A replication process subscribed to its deployment's channel receives one Redis
``message`` reply per command line, many thousands a second. A
:class:`MessageSplitter` takes the bytes a read returned, however they are cut,
and gives back the payloads of the complete messages among them as one buffer of
lines, each followed by a newline, ready for the wire decoder; it counts every
reply (pongs and subscription confirmations included), which tells the link that
Redis is answering. This twin leaves parsing to hiredis; the compiled core parses
the replies itself without making an object per message.
"""

from __future__ import annotations

import hiredis

from streamrep.errors import MalformedReplyError

__all__ = ["MessageSplitter", "MAX_BULK"]

#: The longest bulk string accepted (Redis's own default proto-max-bulk-len).
MAX_BULK = 512 * 1024 * 1024


class MessageSplitter:
    """Splits a subscription's byte stream (RESP2: Redis speaks it until asked for
    another) into message payloads (see the module docstring). Bytes of a reply
    not yet complete are kept for the next feed."""

    def __init__(self, max_bulk: int = MAX_BULK) -> None:
        self._reader = hiredis.Reader()
        self._max_bulk = max_bulk
        #: ``subscribe`` confirmations received so far
        self.subscribed = 0
        #: the first error reply received (its text), if any
        self.refusal: bytes | None = None

    def feed(self, data: bytes, skip: bytes | None = None) -> tuple[bytes, int]:
        """The payloads of the messages *data* completes (those starting with *skip*
        left out), each followed by a newline, and how many replies it completed.
        Bytes that are not replies raise
        :class:`~streamrep.errors.MalformedReplyError` (the connection is then
        unusable)."""
        reader = self._reader
        try:
            reader.feed(data)
            payloads: list[bytes] = []
            count = 0
            reply = reader.gets()
            while reply is not False:
                count += 1
                _check(reply, self._max_bulk)
                if type(reply) is list and reply and reply[0] == b"subscribe":
                    self.subscribed += 1
                elif isinstance(reply, hiredis.ReplyError) and self.refusal is None:
                    self.refusal = str(reply).encode()
                if type(reply) is list and len(reply) == 3 and reply[0] == b"message" and (
                        type(reply[2]) is bytes):
                    payload = reply[2]
                    if skip is None or not payload.startswith(skip):
                        payloads.append(payload)
                reply = reader.gets()
        except hiredis.ProtocolError as exc:
            raise MalformedReplyError(f"Redis sent something that is not a reply: {exc}") from None
        if not payloads:
            return b"", count
        payloads.append(b"")
        return b"\n".join(payloads), count


def _check(reply: object, max_bulk: int) -> None:
    """The replies a subscription receives: no nested arrays, no bulk string over
    *max_bulk* (as the compiled parser refuses them)."""
    if type(reply) is list:
        for item in reply:
            if type(item) is list:
                raise MalformedReplyError("Redis sent a nested array to a subscription")
            if type(item) is bytes and len(item) > max_bulk:
                raise MalformedReplyError(f"Redis sent a bulk string of {len(item)} bytes "
                                     f"(more than {max_bulk})")
    elif type(reply) is bytes and len(reply) > max_bulk:
        raise MalformedReplyError(f"Redis sent a bulk string of {len(reply)} bytes (more than {max_bulk})")


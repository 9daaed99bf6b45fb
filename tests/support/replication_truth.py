"""What a follower of a reference deployment should receive, found without streamrep.

* :class:`Capture`: a raw Redis subscriber on the deployment's channel, recording every
  ``RDATA`` row (rows of a ``batch`` get the token of the line that closes it) and
  every message, in the order Redis delivered them, and telling each writer's answer
  (``POSITION``) to a follower's ``REPLICATE``. When Redis goes away it subscribes
  again as soon as Redis is back, and says where it was deaf.
* :func:`served_rows`: every row a writer serves over its HTTP replication API for a
  range of tokens, read with urllib, page after page while the answer is ``limited``.

Rows are compared as ``(stream, instance, token, row)`` with the row as canonical
JSON (sorted keys), so a row heard on Redis and the same row served over HTTP are
equal.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.request
import uuid
from typing import Any, Iterable

import orjson

#: (stream, instance)
Writer = tuple[str, str]
#: (stream, instance, token)
Fact = tuple[str, str, int]
#: (stream, instance, token, the row as canonical JSON)
Row = tuple[str, str, int, bytes]


def canonical(row: Any) -> bytes:
    """*row* as JSON with sorted keys: one spelling for equal rows."""
    return orjson.dumps(row, option=orjson.OPT_SORT_KEYS)


class Capture:
    """Every ``RDATA`` and ``POSITION`` published on *channel* (of *streams*, or of
    every stream when None), by a raw subscriber of its own."""

    def __init__(self, url: str, channel: str, streams: Iterable[str] | None = None) -> None:
        self.url = url
        self.channel = channel
        self.streams = None if streams is None else frozenset(streams)
        #: every message in order, for the commands that are not rows
        self.messages: list[bytes] = []
        #: one per RDATA line that closes a fact
        self.facts: list[Fact] = []
        self.rows: list[Row] = []
        #: for each time Redis went away: (len(messages), len(rows)) when it did
        self.deaf: list[tuple[int, int]] = []
        self._batches: dict[tuple[str, str], list[bytes]] = {}
        self._stop = threading.Event()
        self._subscribed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._subscribed.wait(30):
            raise AssertionError(f"could not subscribe to {channel} at {url}")

    def _run(self) -> None:
        import redis

        while not self._stop.is_set():
            try:
                pubsub = redis.Redis.from_url(self.url, socket_connect_timeout=2).pubsub()
                pubsub.subscribe(self.channel)
                pubsub.get_message(timeout=2)  # the subscription's confirmation
            except (redis.RedisError, OSError):
                time.sleep(0.1)
                continue
            self._subscribed.set()
            try:
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.2)
                    if message is not None and message["type"] == "message":
                        self._take(message["data"])
            except (redis.RedisError, OSError):
                self.deaf.append((len(self.messages), len(self.rows)))
                self._batches.clear()
            finally:
                with contextlib.suppress(Exception):
                    pubsub.close()

    def _take(self, data: bytes) -> None:
        self.messages.append(data)
        parts = data.split(b" ", 4)
        if parts[0] != b"RDATA" or len(parts) != 5:
            return
        stream, instance = parts[1].decode(), parts[2].decode()
        if self.streams is not None and stream not in self.streams:
            return
        row = canonical(json.loads(parts[4]))
        if parts[3] == b"batch":
            self._batches.setdefault((stream, instance), []).append(row)
            return
        token = int(parts[3])
        for held in self._batches.pop((stream, instance), []) + [row]:
            self.rows.append((stream, instance, token, held))
        self.facts.append((stream, instance, token))

    def answers(self, since: int, streams: Iterable[str], timeout: float = 60.0,
                settle: float = 0.5) -> dict[Writer, int]:
        """Each writer's answer to the first ``REPLICATE`` published after message
        *since* (a follower's, on subscribing): its first ``POSITION`` after it, once
        every stream of *streams* has one and *settle* seconds more have passed for
        the other writers of those streams."""
        wanted = set(streams)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            messages = self.messages[since:]
            if b"REPLICATE" in messages:
                index = since + messages.index(b"REPLICATE")
                if wanted <= {stream for stream, _i in self._positions_after(index)}:
                    time.sleep(settle)
                    return {w: t for w, t in self._positions_after(index).items() if w[0] in wanted}
            time.sleep(0.05)
        raise AssertionError(f"no POSITION of every stream of {sorted(wanted)} answered a REPLICATE "
                             f"after message {since}")

    def _positions_after(self, index: int) -> dict[Writer, int]:
        found: dict[Writer, int] = {}
        for data in self.messages[index:]:
            parts = data.split(b" ")
            if parts[0] == b"POSITION" and len(parts) == 5:
                found.setdefault((parts[1].decode(), parts[2].decode()), int(parts[4]))
        return found

    def rows_of(self, writer: Writer, after: int, upto: int | None = None) -> list[Row]:
        """The rows heard of *writer* with ``after < token <= upto``, in order."""
        return [row for row in list(self.rows)
                if row[:2] == writer and row[2] > after and (upto is None or row[2] <= upto)]

    def last_tokens(self) -> dict[Writer, int]:
        """The token of the last row heard of each writer."""
        return {(stream, instance): token for stream, instance, token, _r in list(self.rows)}

    def settle(self, stream: str, instance: str, token: int, timeout: float = 30.0) -> None:
        """Until the capture has the fact (*stream*, *instance*, *token*) or a later one
        of that writer, and a moment after (what was published before it is in by then)."""
        deadline = time.monotonic() + timeout
        while not any(s == stream and i == instance and t >= token for s, i, t in self.facts[-50:]):
            assert time.monotonic() < deadline, f"{stream}/{instance} {token} not published"
            time.sleep(0.05)
        time.sleep(0.3)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


def served_rows(base_url: str, stream: str, after: int, upto: int, secret: str | None = None,
                timeout: float = 30.0) -> list[tuple[int, bytes]]:
    """Every row of *stream* the writer at *base_url* serves after token *after* up to
    *upto*: ``GET /_synapse/replication/get_repl_stream_updates/<stream>/<txn_id>``
    (a new transaction ID per page: the writer caches answers by it), again from the
    answer's ``upto_token`` while it says ``limited``. Each row is (token, canonical JSON)."""
    rows: list[tuple[int, bytes]] = []
    while after < upto:
        url = (f"{base_url}/_synapse/replication/get_repl_stream_updates/{stream}/{uuid.uuid4().hex}"
               f"?from_token={after}&upto_token={upto}")
        request = urllib.request.Request(url)
        if secret is not None:
            request.add_header("Authorization", f"Bearer {secret}")
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            page = json.loads(answer.read())
        rows.extend((int(token), canonical(row)) for token, row in page["updates"])
        if not page["limited"]:
            break
        after = int(page["upto_token"])
    return rows

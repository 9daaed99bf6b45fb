"""A raw subscriber to a Redis channel, for tests that compare what a writer
published with what a follower made of it."""

from __future__ import annotations

import threading


class RawSubscriber:
    """Every message published on *channel*, in order, read by a thread of its own."""

    def __init__(self, url: str, channel: str) -> None:
        import redis

        self.messages: list[bytes] = []
        self._pubsub = redis.Redis.from_url(url).pubsub()
        self._pubsub.subscribe(channel)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            message = self._pubsub.get_message(timeout=0.2)
            if message is not None and message["type"] == "message":
                self.messages.append(message["data"])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._pubsub.close()

"""Following a real reference deployment through Redis.

A reference homeserver (matrix-synapse, run from its own venv, never imported)
replicates through a Redis of the test's own; ``streamrep tail --redis`` follows
it read-only while a room is created and messages are sent through the client
API. Every event the homeserver persisted must come out of tail as one ``events``
fact, and nothing else may.
"""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from collections import Counter

import orjson

from support.redis_server import own_redis_server, unique_server_name, wait_subscribed
from support.reference_homeserver import running_homeserver


def _events_facts(path: pathlib.Path) -> Counter[int]:
    """Tokens of the ``events`` facts tail printed (rows of one fact share a token)."""
    tokens: list[int] = []
    last = None
    for line in path.read_bytes().splitlines():
        item = orjson.loads(line)
        key = (item["stream"], item["instance"], item["token"])
        if key != last and item["stream"] == "events":
            tokens.append(item["token"])
        last = key
    return Counter(tokens)


def test_tail_prints_every_event_a_reference_homeserver_persists(tmp_path: pathlib.Path) -> None:
    redis_server = own_redis_server()
    try:
        server_name = unique_server_name("ref")
        with running_homeserver(str(tmp_path / "hs"), redis_server.url, server_name) as hs:
            token = hs.register("alice")
            before = max(hs.stream_orderings(), default=0)
            import redis

            listener = redis.Redis.from_url(redis_server.url).pubsub()
            listener.subscribe(server_name)
            env = dict(os.environ)
            env.pop("STREAMREP_CONFIG", None)
            out, err = tmp_path / "tail.out", tmp_path / "tail.err"
            with out.open("wb") as sink, err.open("wb") as errors:
                tail = subprocess.Popen(
                    [sys.executable, "-m", "streamrep", "tail", "--redis", redis_server.url,
                     "--server-name", server_name, "--name", "streamrep-tail"],
                    stdout=sink, stderr=errors, env=env)
            try:
                # tail's REPLICATE is answered by the homeserver's POSITIONs: from
                # then on tail counts the homeserver's events. Redis hands every
                # subscriber the channel's messages in one order, so once this
                # listener heard the answer, tail hears it before any later event.
                wait_subscribed(redis_server.url, server_name, 3, logs=[err])
                deadline = time.monotonic() + 60
                asked = answered = False
                while not answered and time.monotonic() < deadline:
                    message = listener.get_message(timeout=0.5)
                    if message is not None and message["type"] == "message":
                        asked = asked or message["data"] == b"REPLICATE"
                        answered = asked and message["data"].startswith(b"POSITION events master ")
                assert answered, "the homeserver did not answer tail's REPLICATE"
                room = hs.create_room(token)
                for i in range(25):
                    hs.send_message(token, room, f"message {i}")
                expected = [so for so in hs.stream_orderings() if so > before]
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    if set(_events_facts(out)) >= set(expected):
                        break
                    time.sleep(0.1)
                time.sleep(1.0)  # anything more would show up now
            finally:
                tail.send_signal(signal.SIGTERM)
                tail.wait(30)
                listener.close()
        facts = _events_facts(out)
        assert len(expected) >= 30  # the room's own events and the 25 messages
        assert sorted(facts) == expected, err.read_text()[-2000:]
        assert max(facts.values()) == 1
        assert "cannot fetch" not in err.read_text()
    finally:
        redis_server.stop()

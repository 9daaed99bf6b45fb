"""Interop with the reference implementation: its own parsers judge streamrep's lines.

The reference runs in its own venv (see tests/support/reference.py); these tests skip
without it, and fail under ``STREAMREP_REQUIRE_REFERENCE=1``.
"""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
import yaml

from streamrep.caches import CacheRegistry, LruCache
from streamrep.catalogue import known_streams, row_formats
from streamrep.events import EventStore
from streamrep.events.streams import BACKFILL_STREAM, EVENTS_STREAM, EventsStreamFollower
from streamrep.streams import RowFormat
from streamrep.streams.builtin import CACHES
from streamrep.wire import parse_line
from support.redis_server import shared_redis_url
from support.reference import check_lines, reference_fields, reference_lines


def test_the_oracle_refuses_rows_the_reference_cannot_parse() -> None:
    report = check_lines([
        'RDATA to_device w 5 ["@u:hs","DEVICE"]',
        'RDATA caches w 6 ["get_user_by_id",null,"1700000000000"]',
        'RDATA nonsense w 7 []',
        'POSITION events w 1',
        'RDATA to_device w 8 ["@u:hs"]',
    ])
    assert report.checked == 5
    refused = {f["line"].split(" ")[1] + " " + f["line"].split(" ")[3] for f in report.failures}
    assert refused == {"to_device 5", "caches 6", "nonsense 7", "events 1"}


def test_the_reference_accepts_its_own_rows() -> None:
    lines = reference_lines()
    streams = {line.split(" ")[1] for line in lines}
    assert streams == {"events", "backfill", "caches", "account_data", "to_device",
                       "receipts", "typing"}
    assert check_lines(lines).failures == []


def _capture_hub_lines(workdir: pathlib.Path, demo: subprocess.Popen[str]) -> list[str]:
    """Every line the demo's hub sends to a reader connected before the writers
    start, until the demo ends (a plain socket: nothing of streamrep's client)."""
    config = workdir / "streamrep.yaml"
    deadline = time.monotonic() + 60
    sock = None
    while sock is None:
        assert demo.poll() is None and time.monotonic() < deadline, "the demo's hub never listened"
        try:
            port = int(yaml.safe_load(config.read_text())["listen"].rsplit(":", 1)[1])
            sock = socket.create_connection(("127.0.0.1", port), timeout=1)
        except (OSError, TypeError, KeyError, AttributeError):
            time.sleep(0.02)
    sock.sendall(b"NAME capture\nREPLICATE\n")
    sock.settimeout(0.5)
    data = bytearray()
    last_ping = time.monotonic()
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except TimeoutError:
            chunk = None
        if chunk == b"":
            break
        if chunk:
            data += chunk
        if time.monotonic() - last_ping > 1:
            sock.sendall(b"PING %d\n" % int(time.time() * 1000))
            last_ping = time.monotonic()
        if demo.poll() is not None and not chunk:
            break
    sock.close()
    return [line.decode() for line in bytes(data).split(b"\n") if line.strip()]


def _capture_redis_lines(workdir: pathlib.Path, demo: subprocess.Popen[str],
                         url: str) -> list[str]:
    """Every message published on the demo's Redis channels (every command of every
    process), subscribed before the writers start, until the demo ends."""
    import redis

    config = workdir / "streamrep.yaml"
    deadline = time.monotonic() + 60
    server_name = None
    while server_name is None:
        assert demo.poll() is None and time.monotonic() < deadline, "the demo wrote no config"
        try:
            server_name = yaml.safe_load(config.read_text())["server_name"]
        except (OSError, TypeError, KeyError):
            time.sleep(0.02)
    client = redis.Redis.from_url(url)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(server_name, f"{server_name}/USER_IP")
    lines: list[str] = []
    try:
        while True:
            message = pubsub.get_message(timeout=0.5)
            if message is not None:
                lines.append(message["data"].decode())
            elif demo.poll() is not None:
                break
    finally:
        pubsub.close()
        client.close()
    return lines


@pytest.mark.parametrize("transport", ["tcp", "redis"])
def test_the_reference_parses_every_line_a_demo_sends(tmp_path: pathlib.Path,
                                                       transport: str) -> None:
    check_lines(["PING 1"])  # skips (or fails under STREAMREP_REQUIRE_REFERENCE) first
    extra = []
    if transport == "redis":
        url = shared_redis_url()
        extra = ["--redis", url]
    workdir = tmp_path / "demo"
    env = dict(os.environ)
    env.pop("STREAMREP_CONFIG", None)
    demo = subprocess.Popen(
        [sys.executable, "-m", "streamrep", "demo", "--duration", "3", "--rate", "150",
         "--rooms", "4", "--workers", "1", "--catch-up-timeout", "60",
         "--workdir", str(workdir), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        if transport == "redis":
            lines = _capture_redis_lines(workdir, demo, url)
        else:
            lines = _capture_hub_lines(workdir, demo)
        output = demo.communicate(timeout=240)[0]
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    assert demo.returncode == 0, output
    report = check_lines(lines)
    assert report.checked == len(lines)
    assert report.failures == [], report.failures[:5]
    # Every stream the demo writes went past the reference's parse_row.
    for stream in ("events", "backfill", "caches", "account_data", "to_device", "receipts"):
        assert report.by_stream.get(stream, 0) > 0, (stream, report.by_stream)
    assert {line.split(" ", 1)[0] for line in lines} >= {"POSITION", "RDATA"}


def test_streamrep_accepts_every_row_the_reference_sends(sqlite_url: str) -> None:
    lines = reference_lines()
    served = known_streams()
    store = EventStore(sqlite_url)
    follower = EventsStreamFollower(store)
    caches = CacheRegistry()
    users: LruCache[Any] = LruCache("get_user_by_id", 10)
    users.set(("@u:hs",), {"name": "u"})
    caches.register("get_user_by_id", users)
    try:
        for line in lines:
            command = parse_line(line.encode())
            assert command.NAME == "RDATA"
            assert served.check_row(command.stream_name, command.row_json) is None, line
            row = command.row
            # The consumers streamrep has for these streams take the row as it is.
            if command.stream_name == EVENTS_STREAM:
                follower.on_events_row(command.token, row)
            elif command.stream_name == BACKFILL_STREAM:
                follower.on_backfill_row(command.token, row)
            elif command.stream_name == CACHES.name:
                caches.handle_row(row)
                follower.on_caches_row(row[0], row[1])
    finally:
        store.close()
    assert users.get(("@u:hs",)) is None  # the reference's get_user_by_id row invalidated it
    assert len(lines) >= 20


# streamrep's JSON kinds and the reference's declared field types they stand for
# (a user ID and a str enum travel as strings, a frozenset as an array).
KIND_OF_DECLARED = {"str": "string", "str|None": "string|null", "int": "integer",
                    "bool": "boolean", "dict": "object", "JsonDict": "object",
                    "dict[str, Any]": "object", "list[Any]|None": "array|null",
                    "list[str]": "string[]", "UserID": "string", "ProfileUpdateAction": "string",
                    "frozenset[str]|None": "array|null"}

#: The streams streamrep serves itself (a definition with a table or in memory).
SERVED = {"events", "backfill", "caches", "account_data", "to_device", "receipts", "typing"}


def _ours(row: RowFormat) -> Any:
    if row.variants:
        return {kind: [list(f) for f in fields] for kind, fields in row.variants}
    return [list(f) for f in row.fields]


#: Fields whose values differ from the type the reference declares: a ``bool`` it
#: reads from a database column (the column itself, ``IS NOT NULL`` or a constant of
#: a query) arrives on SQLite as 0 or 1, streamrep's ``flag`` (its other booleans are
#: Python values of its code); a ``str`` of a nullable column can be null.
AS_SENT = {"events/ev": {("rejected", "bool"): "flag", ("outlier", "bool"): "flag"},
           "presence": {("currently_active", "bool"): "flag", ("status_msg", "str"): "string|null"},
           "device_lists": {("hosts_calculated", "bool"): "flag"},
           "quarantined_media": {("quarantined", "bool"): "flag", ("origin", "str"): "string|null"}}


def _theirs(declared: Any, where: str) -> Any:
    if isinstance(declared, dict):
        return {kind: _theirs(fields, f"{where}/{kind}") for kind, fields in declared.items()}
    sent = AS_SENT.get(where, {})
    return [[name, sent.get((name, t), KIND_OF_DECLARED[t])] for name, t in declared]


def test_every_stream_has_the_references_row_format() -> None:
    declared = reference_fields()
    formats = row_formats()
    streams = {name for name in declared if "/" not in name}
    # Every stream of the reference, each described once, and no other.
    assert sorted(formats) == sorted(streams), sorted(set(formats) ^ streams)
    assert {d.name for d in known_streams()} == SERVED
    for name, row in formats.items():
        assert _ours(row) == _theirs(declared[name], name), name
    assert list(formats["events"].names) == declared["events/row"]
    for name in streams - SERVED:
        assert list(formats[name].names) == [field for field, _type in declared[name]]

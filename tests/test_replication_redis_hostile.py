"""What anyone who can publish on the deployment's Redis channel can and cannot do.

A reader with a database checks every ``RDATA`` and ``POSITION`` against it: a
forged token past what the writer stored, or a forged row, is refused (logged once,
counted), and the writer's real facts all arrive exactly once. A reader without a
database cannot tell; what protects it is Redis itself: an ACL under which only
writer instances may publish, as the replication docs show.
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import time
from collections import Counter
from typing import Iterator

import orjson
import pytest
import redis

from support.processes import reap_processes, streamrep_process
from support.redis_server import (deployment_database, own_redis_server, shared_redis_url, unique_server_name,
                                  wait_subscribed)

pytestmark = pytest.mark.slow

@pytest.fixture(autouse=True)
def _reap() -> Iterator[None]:
    yield
    reap_processes()


def _streamrep(tmp: pathlib.Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    return streamrep_process(tmp / f"{name}.err", *args, out=tmp / f"{name}.out")


def _printed(path: pathlib.Path) -> Counter[tuple[str, str, int]]:
    seen: list[tuple[str, str, int]] = []
    rows: dict[tuple[str, str, int], list[object]] = {}
    for line in path.read_bytes().splitlines():
        item = orjson.loads(line)
        key = (item["stream"], item["instance"], item["token"])
        rows.setdefault(key, []).append(item["row"])
        if not seen or seen[-1] != key:
            seen.append(key)
    return Counter(seen)


def _rows(path: pathlib.Path) -> list[object]:
    return [orjson.loads(line)["row"] for line in path.read_bytes().splitlines()]


def _wait(predicate: object, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)


def test_forged_publishes_are_refused_by_a_reader_with_a_database(tmp_path: pathlib.Path) -> None:
    """A forged row far ahead, a forged POSITION and a forged row for a real token,
    published while a writer writes: the reader prints every real fact once, none of
    the forged ones, and says once per kind what it refused."""
    url, server = shared_redis_url(), unique_server_name("forge")
    db = f"sqlite:///{tmp_path}/deployment.db"
    tail = _streamrep(tmp_path, "reader", "tail", "--redis", url, "--server-name", server,
                      "--db", deployment_database(db, server),
                      "--stream", "caches")
    wait_subscribed(url, server, 1, logs=[tmp_path / "reader.err"])
    writer = _streamrep(tmp_path, "w1", "write", "--redis", url, "--server-name", server, "--db", db,
                        "--instance-name", "writer1", "--stream", "caches", "--count", "400", "--rate", "200")
    forger = redis.Redis.from_url(url)
    try:
        _wait(lambda: len(_printed(tmp_path / "reader.out")) >= 100)
        forger.publish(server, 'RDATA caches writer1 1900 ["forged",["@evil:x"],1]')
        forger.publish(server, "POSITION caches writer1 475 2000")
        # A token the writer did store, with rows it never wrote.
        forger.publish(server, 'RDATA caches writer1 3 ["forged",["@liar:x"],1]')
        assert writer.wait(60) == 0, (tmp_path / "w1.err").read_text()
        _wait(lambda: ("caches", "writer1", 400) in _printed(tmp_path / "reader.out"))
    finally:
        forger.close()
    _stop(tail)
    printed = _printed(tmp_path / "reader.out")
    assert sorted(t for (_s, _i, t) in printed) == list(range(1, 401)) and max(printed.values()) == 1
    assert not any(row[0] == "forged" for row in _rows(tmp_path / "reader.out"))  # type: ignore[index]
    err = (tmp_path / "reader.err").read_text()
    assert err.count("refused what the bus said of caches/writer1: token 1900 is past") == 1, err
    assert err.count("the rows heard differ from the stored ones") <= 1, err


def test_an_acl_lets_only_writers_publish(tmp_path: pathlib.Path) -> None:
    """The protection of a reader without a database: a Redis ACL under which the
    writer's user may publish on the channel and the readers' user may only
    subscribe. A forger with the readers' password is refused (NOPERM); the reader,
    which may not publish its REPLICATE either, still prints every fact once."""
    server_name = unique_server_name("acl")
    redis_server = own_redis_server()
    try:
        admin = redis.Redis(port=redis_server.port)
        admin.execute_command("ACL", "SETUSER", "admin", "on", ">admin-secret", "allkeys", "allchannels", "+@all")
        admin.execute_command("ACL", "SETUSER", "default", "off")
        admin_url = f"redis://admin:admin-secret@127.0.0.1:{redis_server.port}"
        admin.execute_command("ACL", "SETUSER", "writer1", "on", ">writer-secret", "resetchannels",
                              f"&{server_name}", "+subscribe", "+publish", "+ping")
        admin.execute_command("ACL", "SETUSER", "reader", "on", ">reader-secret", "resetchannels",
                              f"&{server_name}", "+subscribe", "+ping")
        reader_url = f"redis://reader:reader-secret@127.0.0.1:{redis_server.port}"
        writer_url = f"redis://writer1:writer-secret@127.0.0.1:{redis_server.port}"
        tail = _streamrep(tmp_path, "reader", "tail", "--redis", reader_url, "--server-name", server_name)
        wait_subscribed(admin_url, server_name, 1, logs=[tmp_path / "reader.err"])
        forger = redis.Redis.from_url(reader_url)
        with pytest.raises(redis.exceptions.NoPermissionError):
            forger.publish(server_name, 'RDATA caches writer1 1900 ["forged",["@evil:x"],1]')
        forger.close()
        writer = _streamrep(tmp_path, "w1", "write", "--redis", writer_url, "--server-name", server_name,
                            "--db", f"sqlite:///{tmp_path}/deployment.db", "--instance-name", "writer1",
                            "--stream", "caches", "--count", "200", "--rate", "400")
        assert writer.wait(60) == 0, (tmp_path / "w1.err").read_text()
        _wait(lambda: ("caches", "writer1", 200) in _printed(tmp_path / "reader.out"))
        _stop(tail)
        printed = _printed(tmp_path / "reader.out")
        assert sorted(t for (_s, _i, t) in printed) == list(range(1, 201)) and max(printed.values()) == 1
        assert "Redis refused this process's PUBLISH" in (tmp_path / "reader.err").read_text()
    finally:
        redis_server.stop()

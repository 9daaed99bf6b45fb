"""Replication through Redis pub/sub: the format, the configuration, and real
processes (``streamrep write``, ``tail``, ``demo``) on a real Redis server, through
Redis crashes and Redis cutting off a subscriber that fell behind."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from click.testing import CliRunner

from streamrep.catalogue import known_streams
from streamrep.cli.config import check_config
from streamrep.cli.exits import ExitCode
from streamrep.config import load_config, redis_url_for_display
from streamrep.errors import ConfigError
from streamrep.replication.transport.redis_format import EchoFilter, channel_for, channels, pack_lines
from support.processes import reap_processes, streamrep_process
from support.redis_server import (deployment_database, own_redis_server, shared_redis_url, unique_server_name,
                                  wait_subscribed)

# --- the format (sans-IO) ------------------------------------------------------------


def test_channels_follow_the_reference_layout() -> None:
    assert channels("example.com") == ["example.com"]
    assert channels("example.com", user_ip=True) == ["example.com/USER_IP", "example.com"]
    assert channel_for("RDATA", "example.com") == "example.com"
    assert channel_for("REPLICATE", "example.com") == "example.com"
    assert channel_for("USER_IP", "example.com") == "example.com/USER_IP"


def test_echo_filter_takes_our_messages_in_order_and_nobody_elses() -> None:
    echoes = EchoFilter()
    echoes.published(b"REPLICATE")
    echoes.published(b"USER_SYNC main @a:x true 1")
    # Another process's message first: not ours.
    assert not echoes.is_echo(b"USER_SYNC other @b:x true 1")
    assert echoes.is_echo(b"REPLICATE")
    # Ours come back in publishing order.
    assert not echoes.is_echo(b"REPLICATE")
    assert echoes.is_echo(b"USER_SYNC main @a:x true 1")
    assert len(echoes) == 0


def test_echo_filter_is_bounded() -> None:
    echoes = EchoFilter(max_waiting=3)
    for i in range(10):
        echoes.published(b"%d" % i)
    assert len(echoes) == 3
    assert echoes.is_echo(b"7")


def test_publish_commands_are_encoded_as_redis_encodes_them() -> None:
    import hiredis

    from streamrep.replication.transport.redis_connection import encode_publish

    messages = [b'RDATA caches w1 1 ["k",["\xc3\xa9"],1]', b"", b"POSITION caches w1 1 1"]
    assert encode_publish("example.com", messages) == b"".join(
        hiredis.pack_command(("PUBLISH", "example.com", m)) for m in messages)


def test_lines_are_packed_up_to_the_limit_in_order() -> None:
    lines = [b"RDATA to_device w1 %d [%d]" % (i, i) for i in range(1, 8)]
    assert pack_lines(lines, 1) == lines  # the reference's format: a line a message
    assert pack_lines(lines[:1], 3) == lines[:1]
    assert pack_lines([], 3) == []
    packed = pack_lines(lines, 3)
    assert [m.count(b"\n") + 1 for m in packed] == [3, 3, 1]
    assert b"\n".join(packed).split(b"\n") == lines


def _decode(text: str) -> list[Any]:
    from streamrep.replication import commands as C

    return list(C.new_decoder(65536).feed(text.encode()))


def test_a_writers_rows_count_only_after_its_position_on_this_subscription() -> None:
    """Rows heard before a writer's POSITION would move the reader past facts it
    missed while unsubscribed; that POSITION fills them from the database first."""
    from streamrep.replication.protocol import BusSession, ConnectionSettings, Fact, FillGap, FollowerState

    follower = FollowerState(start_from={"caches": 0}, can_fill=True)
    bus = BusSession(ConnectionSettings(), instances=["reader"], follower=follower, now=0.0)
    bus.announce([])
    out = bus.receive(_decode('RDATA caches w1 15 ["x"]\nPOSITION caches w1 15 15\n'
                              'RDATA caches w1 16 ["y"]\n'), 0.0)
    assert out == [FillGap("caches", "w1", 0, 15), Fact("caches", "w1", 16, [["y"]], 15)]
    # A new subscription forgets what it heard.
    bus.announce([])
    assert bus.receive(_decode('RDATA caches w1 17 ["z"]\n'), 0.0) == []
    assert bus.receive(_decode('POSITION caches w1 17 17\nRDATA caches w1 18 ["w"]\n'), 0.0) == [
        FillGap("caches", "w1", 16, 17), Fact("caches", "w1", 18, [["w"]], 17)]


# --- configuration -------------------------------------------------------------------


def _config_file(tmp_path: pathlib.Path, text: str) -> str:
    path = tmp_path / "streamrep.yaml"
    path.write_text("server_name: example.com\n" + text)
    return str(path)


def test_config_reads_the_redis_url(tmp_path: pathlib.Path) -> None:
    config = load_config(_config_file(tmp_path, "replication:\n  redis:\n    url: rediss://:pw@r.internal:6380/0\n"),
                         streams=known_streams())
    assert config.redis is not None and config.redis.url == "rediss://:pw@r.internal:6380/0"
    assert load_config(_config_file(tmp_path, ""), streams=known_streams()).redis is None
    unix = load_config(_config_file(tmp_path, "replication: {redis: {url: 'unix:///run/redis.sock'}}\n"),
                       streams=known_streams())
    assert unix.redis is not None and unix.redis.url == "unix:///run/redis.sock"


@pytest.mark.parametrize(("text", "expected"), [
    ("replication:\n  redis:\n    url: http://r:1\n", "unsupported scheme 'http'"),
    ("replication:\n  redis:\n    url: 'redis://'\n", "names no host"),
    ("replication:\n  redis:\n    url: 'unix://'\n", "names no socket path"),
    ("replication:\n  redis:\n    url: 'redis://:secret@r:99999'\n", "is not a Redis URL"),
    ("replication:\n  redis:\n    uri: redis://r\n", "replication.redis.uri: unknown key"),
    ("replication:\n  redis: redis://r\n", "replication.redis: expected a mapping"),
    ("replication:\n  hub: {}\n", "replication.hub: unknown key"),
])
def test_config_refuses_bad_redis_settings(tmp_path: pathlib.Path, text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_config_file(tmp_path, text), streams=known_streams())
    assert expected in str(info.value)
    assert "secret" not in str(info.value)


def test_config_reads_lines_per_message(tmp_path: pathlib.Path) -> None:
    text = "replication:\n  redis:\n    url: redis://127.0.0.1:6379\n"
    config = load_config(_config_file(tmp_path, text), streams=known_streams())
    assert config.redis is not None and config.redis.lines_per_message == 1
    config = load_config(_config_file(tmp_path, text + "    lines_per_message: 100\n"), streams=known_streams())
    assert config.redis is not None and config.redis.lines_per_message == 100
    result = CliRunner().invoke(check_config, [_config_file(tmp_path, text + "    lines_per_message: 100\n"),
                                               "--no-port-check"])
    assert result.exit_code == 0, result.output
    assert "up to 100 RDATA lines per Redis message, which reference processes cannot read" in result.output


@pytest.mark.parametrize(("value", "expected"), [
    ("0", "expected a whole number greater than 0, got 0"),
    ("1.5", "expected a whole number greater than 0, got 1.5"),
    ("many", "expected a whole number greater than 0, got 'many'"),
    ("5000", "5000 is more than 1000"),
])
def test_config_refuses_bad_lines_per_message(tmp_path: pathlib.Path, value: str, expected: str) -> None:
    text = f"replication:\n  redis:\n    url: redis://127.0.0.1:6379\n    lines_per_message: {value}\n"
    with pytest.raises(ConfigError) as info:
        load_config(_config_file(tmp_path, text), streams=known_streams())
    assert "replication.redis.lines_per_message" in str(info.value)
    assert expected in str(info.value)


def test_check_config_names_redis_without_its_password(tmp_path: pathlib.Path) -> None:
    path = _config_file(tmp_path, "replication:\n  redis:\n    url: redis://:hunter2@127.0.0.1:6379\n")
    result = CliRunner().invoke(check_config, [path, "--no-port-check"])
    assert result.exit_code == 0, result.output
    assert "replication through Redis at redis://:***@127.0.0.1:6379, channel example.com" in result.output
    assert "hunter2" not in result.output
    bad = _config_file(tmp_path, "replication:\n  redis:\n    url: redis:/nohost\n")
    result = CliRunner().invoke(check_config, [bad, "--no-port-check"])
    assert result.exit_code == 2
    assert "replication.redis.url" in result.output


def test_url_display_masks_passwords() -> None:
    assert redis_url_for_display("redis://u:p@h:1/0") == "redis://u:***@h:1/0"
    assert redis_url_for_display("redis://h:1") == "redis://h:1"
    assert redis_url_for_display("unix:///s.sock?password=p") == "unix:///s.sock?***"


# --- processes on a real Redis -------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_process_outlives_its_test() -> Iterator[None]:
    """A test that fails half-way leaves no ``streamrep`` process running into the next."""
    yield
    reap_processes()


_streamrep = streamrep_process


def _tail(url: str, server: str, db: str | None, limit: int, out: pathlib.Path, *extra: str
          ) -> subprocess.Popen[bytes]:
    args = ["tail", "--redis", url, "--server-name", server, "--from", "0", "--limit", str(limit), *extra]
    if db is not None:
        args += ["--db", deployment_database(db, server)]
    return _streamrep(out.with_suffix(".err"), *args, out=out)


def _write(url: str, server: str, db: str, instance: str, count: int, log: pathlib.Path,
           *extra: str) -> subprocess.Popen[bytes]:
    return _streamrep(log, "write", "--redis", url, "--server-name", server, "--db", db,
                      "--instance-name", instance, *extra, "--count", str(count), out=log.with_suffix(".out"))


def _facts(path: pathlib.Path) -> Counter[tuple[str, str, int]]:
    """Facts printed by tail (rows of one fact share its token)."""
    seen: list[tuple[str, str, int]] = []
    for line in path.read_bytes().splitlines():
        item = orjson.loads(line)
        key = (item["stream"], item["instance"], item["token"])
        if not seen or seen[-1] != key:
            seen.append(key)
    return Counter(seen)


def _finish(proc: subprocess.Popen[bytes], timeout: float, what: str) -> int:
    try:
        code = proc.wait(timeout)
        if proc.stdout is not None:
            proc.stdout.close()
        return code
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        raise AssertionError(f"{what} did not finish in {timeout:g}s") from None


def _assert_exactly_once(path: pathlib.Path, stream: str, instance: str, count: int) -> None:
    facts = _facts(path)
    assert sorted(t for (s, i, t) in facts if (s, i) == (stream, instance)) == list(range(1, count + 1))
    assert max(facts.values()) == 1, [k for k, n in facts.items() if n > 1][:5]


def test_write_and_tail_through_redis(tmp_path: pathlib.Path) -> None:
    url = shared_redis_url()
    server = unique_server_name("wt")
    db = f"sqlite:///{tmp_path}/s.db"
    tail = _tail(url, server, db, 200, tmp_path / "tail.out")
    wait_subscribed(url, server, 1, logs=[tmp_path / "tail.err"])
    writer = _write(url, server, db, "w1", 200, tmp_path / "write.err", "--stream", "caches", "--rate", "400")
    assert _finish(writer, 60, "write") == 0, (tmp_path / "write.err").read_text()
    assert _finish(tail, 60, "tail") == 0, (tmp_path / "tail.err").read_text()
    _assert_exactly_once(tmp_path / "tail.out", "caches", "w1", 200)


def _rows_printed(path: pathlib.Path) -> Counter[tuple[str, str, int]]:
    """Rows tail printed, by fact."""
    return Counter((item["stream"], item["instance"], item["token"])
                   for item in map(orjson.loads, path.read_bytes().splitlines()))


@pytest.mark.parametrize("with_database", [True, False])
def test_packed_messages_carry_every_row_exactly_once(tmp_path: pathlib.Path, with_database: bool) -> None:
    """A writer packing up to 7 lines a message (facts of 20 rows: messages of 7, 7
    and 6 lines): a reader with a database and one trusting what it hears get every
    row of every fact once; what Redis carried is looked at by a plain subscriber."""
    import redis

    url = shared_redis_url()
    server = unique_server_name("pack")
    db = f"sqlite:///{tmp_path}/s.db"
    config = tmp_path / "streamrep.yaml"
    config.write_text(f"server_name: {server}\ndatabase: {db}\n"
                      f"replication:\n  redis:\n    url: {url}\n    lines_per_message: 7\n")
    watcher = redis.Redis.from_url(url).pubsub(ignore_subscribe_messages=True)
    watcher.subscribe(server)
    tail = _tail(url, server, db if with_database else None, 30, tmp_path / "tail.out")
    wait_subscribed(url, server, 2, logs=[tmp_path / "tail.err"])
    writer = _streamrep(tmp_path / "write.err", "write", "--config", str(config), "--instance-name", "main",
                        "--stream", "to_device", "--rows-per-fact", "20", "--count", "30", "--rate", "300",
                        out=tmp_path / "write.out")
    assert _finish(writer, 60, "write") == 0, (tmp_path / "write.err").read_text()
    assert _finish(tail, 60, "tail") == 0, (tmp_path / "tail.err").read_text()
    rows = _rows_printed(tmp_path / "tail.out")
    assert rows == Counter({("to_device", "main", token): 20 for token in range(1, 31)})
    sizes = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        message = watcher.get_message(timeout=0.5)
        if message is None:
            if sum(sizes) >= 30 * 20:
                break
            continue
        lines = message["data"].split(b"\n")
        if lines[0].startswith(b"RDATA "):
            assert all(line.startswith(b"RDATA to_device main ") for line in lines)
            sizes.append(len(lines))
    watcher.close()
    assert sum(sizes) == 30 * 20
    assert max(sizes) == 7 and Counter(sizes)[7] >= 2 * 30


def _write_and_tail(tmp_path: pathlib.Path, url: str) -> None:
    server = unique_server_name("url")
    db = f"sqlite:///{tmp_path}/s.db"
    tail = _tail(url, server, db, 50, tmp_path / "tail.out")
    wait_subscribed(url, server, 1, logs=[tmp_path / "tail.err"])
    writer = _write(url, server, db, "w1", 50, tmp_path / "write.err", "--stream", "caches", "--rate", "200")
    assert _finish(writer, 60, "write") == 0, (tmp_path / "write.err").read_text()
    assert _finish(tail, 60, "tail") == 0, (tmp_path / "tail.err").read_text()
    _assert_exactly_once(tmp_path / "tail.out", "caches", "w1", 50)


def test_a_password_and_a_unix_socket(tmp_path: pathlib.Path) -> None:
    redis_server = own_redis_server(password="s3cret")
    try:
        _write_and_tail(tmp_path, f"unix://{redis_server.unix_socket}?password=s3cret")
        wrong = _streamrep(tmp_path / "wrong.err", "tail", "--redis",
                           f"redis://:wrong@127.0.0.1:{redis_server.port}", "--server-name", "x.example",
                           out=tmp_path / "wrong.out")
        # A refused password is not retried for ever: one line, its own status.
        assert _finish(wrong, 30, "tail") == ExitCode.AUTHENTICATION
        err = (tmp_path / "wrong.err").read_text()
        assert "refused the password" in err and "wrong" not in err.replace("refused the password", "")
        assert err.strip().splitlines()[-1].startswith("streamrep tail: error: cannot follow: Redis refused the password")
    finally:
        redis_server.stop()


def test_tls(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("cryptography")
    from streamrep.demo.certificates import make_deployment_certificates

    certs = make_deployment_certificates(str(tmp_path / "pki"), [])
    redis_server = own_redis_server(tls=(certs.ca, certs.hub.cert, certs.hub.key))
    try:
        _write_and_tail(tmp_path, redis_server.url)
    finally:
        redis_server.stop()


def test_tail_without_a_database_says_once_that_it_cannot_fill_a_gap(tmp_path: pathlib.Path) -> None:
    url = shared_redis_url()
    server = unique_server_name("gap")
    db = f"sqlite:///{tmp_path}/s.db"
    # Facts persisted while nobody listens: a reader starting from 0 sees a gap.
    first = _write(url, server, db, "w1", 20, tmp_path / "write1.err", "--stream", "caches")
    assert _finish(first, 60, "write") == 0, (tmp_path / "write1.err").read_text()
    tail = _tail(url, server, None, 1000, tmp_path / "tail.out")
    wait_subscribed(url, server, 1, logs=[tmp_path / "tail.err"])
    second = _write(url, server, db, "w1", 20, tmp_path / "write2.err", "--stream", "caches", "--rate", "10")
    assert _finish(second, 60, "write") == 0, (tmp_path / "write2.err").read_text()
    deadline = time.monotonic() + 30
    while ("caches", "w1", 40) not in _facts(tmp_path / "tail.out") and time.monotonic() < deadline:
        time.sleep(0.05)
    tail.send_signal(signal.SIGTERM)
    assert _finish(tail, 30, "tail") == 0, (tmp_path / "tail.err").read_text()
    err = (tmp_path / "tail.err").read_text()
    assert err.count("cannot fetch them without --db") == 1, err
    assert "caches/w1 after token 0" in err
    # It went on from the writer's position when it first heard of it (what the
    # writer persisted before its subscription was confirmed is missed too).
    tokens = sorted(t for (_s, _i, t) in _facts(tmp_path / "tail.out"))
    assert tokens and tokens[0] > 20 and tokens == list(range(tokens[0], 41))


@pytest.mark.parametrize("lines_per_message", [1, 7])
def test_every_fact_exactly_once_through_a_redis_crash(tmp_path: pathlib.Path, lines_per_message: int) -> None:
    """Redis killed with SIGKILL mid-stream and started again (empty): the writer
    keeps persisting, both readers resubscribe and fill the gap from the database;
    in the reference's format and with the writer packing facts of 10 rows 7 lines
    to a message."""
    redis_server = own_redis_server()
    try:
        url, server, count = redis_server.url, unique_server_name("crash"), 600
        db = f"sqlite:///{tmp_path}/s.db"
        tails = [_tail(url, server, db, count, tmp_path / f"tail{i}.out") for i in (1, 2)]
        wait_subscribed(url, server, 2, logs=[tmp_path / "tail1.err", tmp_path / "tail2.err"])
        if lines_per_message == 1:
            writer = _write(url, server, db, "w1", count, tmp_path / "write.err",
                            "--stream", "caches", "--rate", "300")
            stream, instance = "caches", "w1"
        else:
            config = tmp_path / "streamrep.yaml"
            config.write_text(f"server_name: {server}\ndatabase: {db}\nreplication:\n  redis:\n"
                              f"    url: {url}\n    lines_per_message: {lines_per_message}\n")
            writer = _streamrep(tmp_path / "write.err", "write", "--config", str(config), "--instance-name",
                                "main", "--stream", "to_device", "--rows-per-fact", "10", "--count", str(count),
                                "--rate", "300", out=tmp_path / "write.out")
            stream, instance = "to_device", "main"
        time.sleep(0.8)
        redis_server.kill()
        time.sleep(0.8)
        redis_server.start()
        assert _finish(writer, 60, "write") == 0, (tmp_path / "write.err").read_text()
        for i, tail in enumerate(tails, 1):
            err = tmp_path / f"tail{i}.err"
            assert _finish(tail, 60, f"tail {i}") == 0, err.read_text()
            _assert_exactly_once(tmp_path / f"tail{i}.out", stream, instance, count)
            if lines_per_message > 1:
                assert set(_rows_printed(tmp_path / f"tail{i}.out").values()) == {10}
            assert "reconnecting" in err.read_text()
    finally:
        redis_server.stop()


def test_a_slow_subscriber_is_cut_off_by_redis_and_catches_up(tmp_path: pathlib.Path) -> None:
    """Redis's output-buffer limit cuts off a reader that stopped reading; it
    reconnects and catches up from the database; the other reader is unaffected."""
    redis_server = own_redis_server("--client-output-buffer-limit", "pubsub 256kb 64kb 1")
    try:
        url, server = redis_server.url, unique_server_name("slow")
        count, rows, more = 1000, 100, 5
        db = f"sqlite:///{tmp_path}/s.db"
        fast = _tail(url, server, db, count + more, tmp_path / "fast.out")
        slow = _tail(url, server, db, count + more, tmp_path / "slow.out")
        wait_subscribed(url, server, 2, logs=[tmp_path / "fast.err", tmp_path / "slow.err"])
        # Stopped before anything flows, the slow reader's socket buffers stay
        # small, and what it does not read piles up in Redis (about 10 MB).
        slow.send_signal(signal.SIGSTOP)
        try:
            writer = _write(url, server, db, "w1", count, tmp_path / "write.err", "--stream", "to_device",
                            "--rows-per-fact", str(rows))
            assert _finish(writer, 120, "write") == 0, (tmp_path / "write.err").read_text()
        finally:
            slow.send_signal(signal.SIGCONT)
        deadline = time.monotonic() + 30
        while "reconnecting" not in (tmp_path / "slow.err").read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        # The writer goes on: its POSITION tells the slow reader what it missed.
        writer = _write(url, server, db, "w1", more, tmp_path / "write2.err", "--stream", "to_device",
                        "--rows-per-fact", str(rows))
        assert _finish(writer, 60, "write") == 0, (tmp_path / "write2.err").read_text()
        assert _finish(fast, 60, "fast tail") == 0, (tmp_path / "fast.err").read_text()
        assert _finish(slow, 60, "slow tail") == 0, (tmp_path / "slow.err").read_text()
        # Redis closed the slow reader's connection; nobody else's.
        assert "reconnecting" in (tmp_path / "slow.err").read_text()
        assert "reconnecting" not in (tmp_path / "fast.err").read_text()
        for name in ("fast", "slow"):
            _assert_exactly_once(tmp_path / f"{name}.out", "to_device", "w1", count + more)
            assert len((tmp_path / f"{name}.out").read_bytes().splitlines()) == (count + more) * rows
    finally:
        redis_server.stop()


def _run_demo(tmp_path: pathlib.Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamrep", "demo", "--duration", "3", "--rate", "120", "--rooms", "4",
         "--workers", "2", "--catch-up-timeout", "60", "--redis", url, "--workdir",
         str(tmp_path / "demo"), *extra],
        capture_output=True, text=True, timeout=240,
        env={k: v for k, v in os.environ.items() if k != "STREAMREP_CONFIG"})


def _assert_demo_passed(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "exactly-once check passed: 2 workers" in proc.stdout
    assert "facts: 0 lost, 0 duplicated" in proc.stdout
    assert "through Redis" in proc.stderr
    for stream in ("events", "backfill", "caches", "account_data", "receipts", "to_device"):
        assert stream in proc.stdout
    # No hub ran.
    assert not (tmp_path_of(proc) / "hub.log").exists()


def tmp_path_of(proc: subprocess.CompletedProcess[str]) -> pathlib.Path:
    args = list(proc.args)
    return pathlib.Path(args[args.index("--workdir") + 1])


def test_demo_over_redis_on_sqlite(tmp_path: pathlib.Path) -> None:
    _assert_demo_passed(_run_demo(tmp_path, shared_redis_url()))


@pytest.mark.postgres
def test_demo_over_redis_on_postgres_with_two_writers(tmp_path: pathlib.Path, pg_url: str) -> None:
    proc = _run_demo(tmp_path, shared_redis_url(), "--db", pg_url)
    _assert_demo_passed(proc)
    assert "writers writer1, writer2," in proc.stderr


def test_demo_refuses_a_hub_restart_over_redis(tmp_path: pathlib.Path) -> None:
    proc = _run_demo(tmp_path, "redis://127.0.0.1:1", "--restart-hub-after", "1")
    assert proc.returncode == 2
    assert "with --redis there is none" in proc.stderr


def test_serve_announces_its_positions_and_answers_every_replicate(tmp_path: pathlib.Path) -> None:
    """``serve --redis`` (a process that writes and follows nothing): on subscribing
    REPLICATE and one POSITION per stream it writes, and the positions again for
    each REPLICATE of another process (its own, echoed back, is not answered)."""
    import redis

    url = shared_redis_url()
    server = unique_server_name("serve")
    listener = redis.Redis.from_url(url).pubsub()
    listener.subscribe(server)
    try:
        assert listener.get_message(timeout=5)["type"] == "subscribe"
        serve = _streamrep(tmp_path / "serve.err", "serve", "--redis", url, "--server-name", server,
                           "--db", f"sqlite:///{tmp_path}/s.db", out=tmp_path / "serve.out")
        try:
            def heard(seconds: float) -> list[bytes]:
                out, deadline = [], time.monotonic() + seconds
                while time.monotonic() < deadline:
                    message = listener.get_message(timeout=0.1)
                    if message is not None and message["type"] == "message":
                        out.append(message["data"])
                return out

            greeting = heard(8)
            assert greeting[0] == b"REPLICATE", greeting
            positions = greeting[1:]
            assert positions and all(p.startswith(b"POSITION ") and b" main " in p for p in positions)
            assert len(set(positions)) == len(positions)
            redis.Redis.from_url(url).publish(server, "REPLICATE")
            again = heard(2)
            assert again[0] == b"REPLICATE"
            assert sorted(again[1:]) == sorted(positions)
        finally:
            serve.send_signal(signal.SIGTERM)
            assert _finish(serve, 30, "serve") == 0, (tmp_path / "serve.err").read_text()
    finally:
        listener.close()

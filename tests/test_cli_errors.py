"""What a new user's mistakes look like: one line naming what failed and how to fix
it, the exit status of streamrep.cli.exits, no traceback (unless --log-level debug)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from streamrep.cli import SUBCOMMANDS, main, with_log_level
from streamrep.cli.exits import ExitCode

MISSING_DIR = "/nonexistent-streamrep-dir/sub"
BAD_SQLITE = f"sqlite:///{MISSING_DIR}/streamrep.db"
# Nothing listens on port 1 of the loopback address.
DEAD_POSTGRES = "postgresql://postgres@127.0.0.1:1/test?connect_timeout=2"


def free_address() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def run(*args: str, cwd: Path, prelude: str = "", timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``streamrep ARGS`` in a fresh interpreter (after running *prelude* in it)."""
    code = f"{prelude}\nimport sys\nfrom streamrep.cli import main\nsys.argv = ['streamrep', *sys.argv[1:]]\nmain()"
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONWARNINGS": ""})


def assert_one_line(proc: subprocess.CompletedProcess[str], code: ExitCode, *needles: str) -> str:
    """The process exited with *code* and its last stderr line is the report, naming
    *needles*; no traceback anywhere."""
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert ": error: " in line, proc.stderr
    for needle in needles:
        assert needle in line, (needle, line)
    return line


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


def test_serve_with_a_bad_sqlite_path(workdir: Path) -> None:
    proc = run("serve", "--db", BAD_SQLITE, "--listen", free_address(), cwd=workdir)
    assert_one_line(proc, ExitCode.BAD_PATH, "streamrep serve", MISSING_DIR, "directory exists")


def test_serve_with_an_unreachable_postgres(workdir: Path) -> None:
    proc = run("serve", "--db", DEAD_POSTGRES, "--listen", free_address(), cwd=workdir)
    assert_one_line(proc, ExitCode.DATABASE_UNAVAILABLE, "streamrep serve", "PostgreSQL",
                    "127.0.0.1:1", "start the database server")


def test_demo_with_a_bad_sqlite_path(workdir: Path) -> None:
    proc = run("demo", "--db", BAD_SQLITE, "--duration", "1", "--workers", "1",
               "--workdir", str(workdir / "demo"), cwd=workdir)
    assert_one_line(proc, ExitCode.BAD_PATH, "streamrep demo", MISSING_DIR)


def test_demo_with_an_unreachable_postgres(workdir: Path) -> None:
    proc = run("demo", "--db", DEAD_POSTGRES, "--duration", "1", "--workers", "1",
               "--workdir", str(workdir / "demo"), cwd=workdir)
    assert_one_line(proc, ExitCode.DATABASE_UNAVAILABLE, "streamrep demo", "PostgreSQL")


def test_write_with_a_bad_sqlite_path(workdir: Path) -> None:
    proc = run("write", "--db", BAD_SQLITE, "--connect", "127.0.0.1:1", "--instance-name", "w1",
               "--stream", "caches", "--count", "1", cwd=workdir)
    assert_one_line(proc, ExitCode.BAD_PATH, "streamrep write", MISSING_DIR)


def test_write_with_nothing_listening_says_so_and_fails(workdir: Path) -> None:
    proc = run("write", "--db", f"sqlite:///{workdir}/w.db", "--connect", "127.0.0.1:1",
               "--instance-name", "w1", "--stream", "caches", "--count", "2",
               "--announce-timeout", "1", cwd=workdir)
    assert_one_line(proc, ExitCode.HUB_UNREACHABLE, "streamrep write", "2 facts persisted",
                    "not announced", "127.0.0.1:1", "refused")
    assert "write: cannot connect to 127.0.0.1:1" in proc.stderr


def test_db_with_an_unreachable_postgres(workdir: Path) -> None:
    proc = run("db", "repair-sequences", "--db", DEAD_POSTGRES, "--dry-run", cwd=workdir)
    assert_one_line(proc, ExitCode.DATABASE_UNAVAILABLE, "streamrep db repair-sequences",
                    "PostgreSQL")


def test_state_export_with_a_bad_sqlite_path(workdir: Path) -> None:
    pytest.importorskip("pyarrow")
    proc = run("state", "export", "--db", BAD_SQLITE, "--out", str(workdir / "out"), cwd=workdir)
    assert_one_line(proc, ExitCode.BAD_PATH, "streamrep state export", "--db")


def test_spark_without_its_extra(workdir: Path) -> None:
    # As on a base install: importing pyarrow fails.
    proc = run("spark", "reconstruct", "--input", str(workdir), "--output", str(workdir / "out"),
               "--single-process", cwd=workdir, prelude="import sys; sys.modules['pyarrow'] = None")
    assert_one_line(proc, ExitCode.MISSING_EXTRA, "streamrep spark reconstruct", "pyarrow",
                    "pip install 'streamrep[spark]'")


def test_demo_tls_without_its_extra(workdir: Path) -> None:
    proc = run("demo", "--tls", "--duration", "1", "--workers", "1",
               "--workdir", str(workdir / "demo"), cwd=workdir,
               prelude="import sys; sys.modules['cryptography'] = None")
    assert_one_line(proc, ExitCode.MISSING_EXTRA, "streamrep demo", "cryptography", "pip install")


def test_tail_with_nothing_listening_says_so_and_gives_up(workdir: Path) -> None:
    proc = run("tail", "--connect", "127.0.0.1:1", "--give-up-after", "1", cwd=workdir)
    line = assert_one_line(proc, ExitCode.HUB_UNREACHABLE, "streamrep tail", "gave up after 1s",
                           "127.0.0.1:1", "streamrep serve")
    # It said why while it was retrying, not only at the end.
    retries = [x for x in proc.stderr.splitlines() if "retrying in" in x]
    assert retries and "refused" in retries[0].lower(), proc.stderr
    assert "refused" in line.lower()


def test_tail_with_redis_unreachable_gives_up_naming_it(workdir: Path) -> None:
    proc = run("tail", "--redis", "redis://127.0.0.1:1", "--server-name", "example.com",
               "--give-up-after", "1", cwd=workdir)
    assert_one_line(proc, ExitCode.HUB_UNREACHABLE, "streamrep tail", "Redis",
                    "redis://127.0.0.1:1", "--redis")


@pytest.fixture
def hub() -> Iterator[tuple[str, int]]:
    from streamrep.replication import ReplicationHub
    from streamrep.replication.sources.memory import MemorySource

    hub = ReplicationHub("example.com", MemorySource(), port=0)
    hub.start()
    try:
        yield hub.address[0], hub.address[1]
    finally:
        hub.stop()


def test_tail_with_a_wrong_server_name_says_the_name_it_found(workdir: Path,
                                                               hub: tuple[str, int]) -> None:
    import gevent

    host, port = hub
    # The hub runs in this process's greenlets: let them serve while tail runs.
    job = gevent.get_hub().threadpool.spawn(
        run, "tail", "--connect", f"{host}:{port}", "--server-name", "wrong.example",
        "--give-up-after", "1", cwd=workdir)
    proc = job.get(timeout=60)
    line = assert_one_line(proc, ExitCode.WRONG_SERVER, "streamrep tail", "'example.com'",
                           "'wrong.example'", "--server-name")
    assert "says it is 'example.com'" in line


def test_debug_log_level_prints_the_traceback(workdir: Path) -> None:
    proc = run("db", "repair-sequences", "--db", DEAD_POSTGRES, "--log-level", "debug",
               cwd=workdir)
    assert proc.returncode == ExitCode.DATABASE_UNAVAILABLE
    assert "Traceback" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("streamrep db repair-sequences: error:")


def _leaves(command: object, path: str) -> Iterator[tuple[str, object]]:
    import click

    assert isinstance(command, click.Command)
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _leaves(sub, f"{path} {name}")
    else:
        yield path, command


def test_every_command_takes_log_level() -> None:
    import click

    ctx = click.Context(main)
    for name in SUBCOMMANDS:
        command = main.get_command(ctx, name)
        assert command is not None and with_log_level(command) is command
        for path, leaf in _leaves(command, name):
            assert isinstance(leaf, click.Command)
            assert any("--log-level" in getattr(p, "opts", ()) for p in leaf.params), path


def test_operations_page_lists_every_exit_status() -> None:
    import re

    page = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    listed = {int(code): name for code, name in re.findall(r"^\| (\d+) \| `(\w+)` \|", page, re.M)}
    assert listed == {code.value: code.name for code in ExitCode}


# --- the state jobs ------------------------------------------------------------------


def _empty_sqlite(workdir: Path) -> str:
    import sqlite3

    path = workdir / "empty.db"
    sqlite3.connect(path).close()
    return f"sqlite:///{path}"


@pytest.mark.parametrize("command", [
    ["spark", "compress", "--single-process", "--output", "out"],
    ["spark", "reconstruct", "--single-process", "--output", "out"],
    ["state", "export", "--output", "out"],
])
def test_state_jobs_on_a_database_without_state_tables(workdir: Path, command: list[str]) -> None:
    pytest.importorskip("pyarrow")
    proc = run(*command, "--db", _empty_sqlite(workdir), cwd=workdir)
    name = "streamrep " + " ".join(command[:2])
    assert_one_line(proc, ExitCode.DATABASE_STATE, name, "has no state tables",
                    "Synapse or streamrep deployment")


def _corrupt_input(workdir: Path) -> str:
    from support.state_forest import corrupt_forest, make_forest

    forest = corrupt_forest(make_forest(300, seed=2, rooms=3), "missing", at=5,
                            missing_group=999_999_999)
    forest.write_parquet(str(workdir / "in"))
    return str(workdir / "in")


def test_state_corruption_is_one_line_with_a_fix(workdir: Path) -> None:
    pytest.importorskip("pyarrow")
    proc = run("spark", "compress", "--single-process", "--input", _corrupt_input(workdir),
               "--output", str(workdir / "out"), cwd=workdir)
    line = assert_one_line(proc, ExitCode.STATE_CORRUPT, "streamrep spark compress: error: ",
                           "999999999", "; repair or remove the named state groups")
    assert "StateCorruptionError" not in line


def test_a_non_empty_output_is_one_line_with_a_fix(workdir: Path) -> None:
    pytest.importorskip("pyarrow")
    (workdir / "out").mkdir()
    (workdir / "out" / "x").write_text("x")
    proc = run("spark", "reconstruct", "--single-process", "--db", _empty_sqlite(workdir),
               "--output", str(workdir / "out"), cwd=workdir)
    assert_one_line(proc, ExitCode.USAGE, "streamrep spark reconstruct: error: output directory",
                    "is not empty; give --overwrite")


def test_compress_summary_shows_the_change_with_one_sign() -> None:
    from streamrep.spark.compress import CompressResult

    grown = CompressResult("out", rows_before=364, rows_after=819).summary()
    assert "364 -> 819 rows (+125.0%)" in grown
    shrunk = CompressResult("out", rows_before=1000, rows_after=250).summary()
    assert "1000 -> 250 rows (-75.0%)" in shrunk


def test_state_export_takes_output_and_the_old_out(workdir: Path) -> None:
    pytest.importorskip("pyarrow")
    from support.state_forest import load_database, make_forest

    url = f"sqlite:///{workdir / 'state.db'}"
    load_database(url, make_forest(50, seed=1, rooms=2))
    for flag in ("--output", "--out"):
        proc = run("state", "export", "--db", url, flag, str(workdir / flag.strip("-")), cwd=workdir)
        assert proc.returncode == 0, proc.stderr
        assert (workdir / flag.strip("-") / "state_groups" / "part-00000.parquet").exists()
    helped = run("state", "export", "--help", cwd=workdir)
    assert "--output" in helped.stdout and "--out " not in helped.stdout
def test_write_refused_by_the_hub_says_so_with_its_own_status(workdir: Path) -> None:
    """A writer the hub refuses (here: not a configured writer of the stream) never
    reports its facts as announced: one line quoting the hub, status REFUSED."""
    import gevent

    from streamrep.replication import ReplicationHub
    from streamrep.replication.sources.memory import MemorySource

    hub = ReplicationHub("example.com", MemorySource(), port=0, stream_writers={"caches": ["w1"]})
    hub.start()
    try:
        job = gevent.get_hub().threadpool.spawn(
            run, "write", "--db", f"sqlite:///{workdir}/w.db", "--connect", f"127.0.0.1:{hub.address[1]}",
            "--instance-name", "w2", "--stream", "caches", "--count", "3", "--announce-timeout", "2",
            cwd=workdir)
        proc = job.get(timeout=60)
    finally:
        hub.stop()
    line = assert_one_line(proc, ExitCode.REFUSED, "streamrep write", "3 facts persisted", "not announced",
                           "refused this process", "w2 is not a configured writer of caches")
    assert "announced, and accepted" not in proc.stderr, line


def test_announcing_str_rows_fails_at_the_call() -> None:
    from streamrep.replication import LinkSettings, open_link

    link = open_link(LinkSettings("w1", "example.com", hub=("127.0.0.1", 1)))
    with pytest.raises(TypeError, match="bytes row_json"):
        link.announce("caches", "w1", [(1, '["c",["k"],1]')])  # type: ignore[list-item]


# SQLite then refuses to grow the file past 60 pages (about 240 KB): a full disk, as
# the writer sees one.
_SMALL_SQLITE = """
import sqlite3
_connect = sqlite3.connect
def _small(*args, **kwargs):
    conn = _connect(*args, **kwargs)
    conn.execute("PRAGMA max_page_count=60")
    return conn
sqlite3.connect = _small
"""


def test_write_on_a_full_disk_announces_what_it_committed_and_says_so(workdir: Path) -> None:
    import gevent

    from streamrep.replication import ReplicationHub
    from streamrep.replication.sources.memory import MemorySource

    hub = ReplicationHub("example.com", MemorySource(), port=0)
    hub.start()
    try:
        job = gevent.get_hub().threadpool.spawn(
            run, "write", "--db", f"sqlite:///{workdir}/w.db", "--connect", f"127.0.0.1:{hub.address[1]}",
            "--instance-name", "w1", "--stream", "to_device", "--rows-per-fact", "20", "--count", "100000",
            cwd=workdir, prelude=_SMALL_SQLITE)
        proc = job.get(timeout=120)
        announced = hub.positions.get(("to_device", "w1"), 0)
    finally:
        hub.stop()
    assert_one_line(proc, ExitCode.DISK_FULL, "streamrep write", "disk is full", "free disk space")
    import sqlite3

    conn = sqlite3.connect(f"{workdir}/w.db")
    try:
        committed = conn.execute("SELECT MAX(stream_id) FROM device_inbox").fetchone()[0]
    finally:
        conn.close()
    # Every fact committed before the disk filled up was announced to the hub (the
    # one that failed completed too, rolled back: the position passes it, no rows).
    assert committed and committed <= announced <= committed + 1, (announced, committed)


def _deployment_db(workdir: Path, server_name: str) -> str:
    """A database that belongs to *server_name*, as its hub or a writer leaves it."""
    from support.redis_server import deployment_database

    return deployment_database(f"sqlite:///{workdir}/{server_name}.db", server_name)


def test_tail_refuses_another_deployments_database(workdir: Path) -> None:
    other = _deployment_db(workdir, "other.example")
    proc = run("tail", "--redis", "redis://127.0.0.1:1", "--server-name", "mine.example", "--db", other,
               "--give-up-after", "1", cwd=workdir)
    assert_one_line(proc, ExitCode.DEPLOYMENT_MISMATCH, "streamrep tail", "'other.example'",
                    "not 'mine.example'")


def test_tail_never_creates_a_database(workdir: Path) -> None:
    typo = workdir / "deploymnet.db"
    proc = run("tail", "--redis", "redis://127.0.0.1:1", "--server-name", "mine.example",
               "--db", f"sqlite:///{typo}", "--give-up-after", "1", cwd=workdir)
    assert_one_line(proc, ExitCode.BAD_PATH, "streamrep tail", "no database at", str(typo))
    assert not typo.exists()


def test_serve_and_write_refuse_another_deployments_database(workdir: Path) -> None:
    other = _deployment_db(workdir, "other.example")
    proc = run("serve", "--db", other, "--server-name", "mine.example", "--listen", free_address(), cwd=workdir)
    assert_one_line(proc, ExitCode.DEPLOYMENT_MISMATCH, "streamrep serve", "'other.example'")
    proc = run("write", "--db", other, "--server-name", "mine.example", "--connect", "127.0.0.1:1",
               "--instance-name", "w1", "--stream", "caches", "--count", "1", cwd=workdir)
    assert_one_line(proc, ExitCode.DEPLOYMENT_MISMATCH, "streamrep write", "'other.example'")


# --- the first hour: check-config, serve's logs and options -----------------------------


def test_check_config_suggests_no_flag_it_does_not_take(workdir: Path) -> None:
    import click
    from click.testing import CliRunner

    path = workdir / "streamrep.yaml"
    path.write_text("listen: 127.0.0.1:9092\n")
    checked = CliRunner().invoke(main, ["check-config", str(path), "--no-port-check"])
    assert checked.exit_code == ExitCode.USAGE
    missing = [line for line in checked.output.splitlines() if "server_name: missing" in line]
    assert missing and "--server-name" not in missing[0], checked.output
    assert "--server-name" not in (main.get_command(click.Context(main), "check-config")
                                   .get_help(click.Context(main)))
    # serve takes --server-name, so its line may suggest it.
    served = run("serve", "--config", str(path), cwd=workdir)
    assert served.returncode == ExitCode.USAGE
    assert "server_name: missing; add `server_name: example.com` (the name workers check on " \
           "connect) or pass --server-name" in served.stderr


def _serve_log(workdir: Path, db: str) -> str:
    """What ``serve --log-level info`` logs while it opens *db* and starts, then stops."""
    import signal
    import socket
    import time

    listen = free_address()
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrep", "serve", "--db", db, "--listen", listen,
         "--log-level", "info"], cwd=workdir, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONWARNINGS": ""})
    assert proc.stderr is not None
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if not line or "listening on" in line:
            break
    # The hub greets a connection once it serves (and handles SIGTERM).
    host, port = listen.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as peer:
        assert peer.makefile("rb").readline().startswith(b"SERVER ")
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=30)
    text = "".join(lines) + rest
    assert proc.returncode == 0, text
    assert "applied migration" in text, text
    return text


def test_serve_logs_only_its_own_engines_migrations(workdir: Path, pg_url: str) -> None:
    postgres = _serve_log(workdir, pg_url)
    assert "SQLite" not in postgres, [line for line in postgres.splitlines() if "SQLite" in line]
    sqlite = _serve_log(workdir, f"sqlite:///{workdir / 'streamrep.db'}")
    assert "(PostgreSQL)" not in sqlite, [line for line in sqlite.splitlines() if "PostgreSQL" in line]


def test_serve_log_level_takes_a_level_only(workdir: Path) -> None:
    refused = run("serve", "--log-level", "loud", "--db", f"sqlite:///{workdir / 'x.db'}",
                  cwd=workdir)
    assert refused.returncode == ExitCode.USAGE
    assert "Invalid value for '--log-level': 'loud' is not one of" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (workdir / "x.db").exists()
    helped = run("serve", "--help", cwd=workdir)
    assert "--log-level [debug|info|warning|error|critical]" in helped.stdout


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_shell_completion_script_is_produced(shell: str) -> None:
    from click.testing import CliRunner

    runner = CliRunner()
    script = runner.invoke(main, [], prog_name="streamrep",
                           env={"_STREAMREP_COMPLETE": f"{shell}_source"})
    assert script.exit_code == 0, script.output
    assert "_STREAMREP_COMPLETE" in script.output and "streamrep" in script.output
    # What the bash script asks the program when completing `streamrep serve --log-l`.
    asked = runner.invoke(main, [], prog_name="streamrep", env={
        "_STREAMREP_COMPLETE": "bash_complete", "COMP_WORDS": "streamrep serve --log-l",
        "COMP_CWORD": "2"})
    assert asked.output.split() == ["plain,--log-level"], asked.output


# --- the documented exit statuses against the code ----------------------------------------


def _operations() -> str:
    return (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()


def _exit_section() -> str:
    text = _operations()
    section = text[text.index("## Exit statuses"):]
    return section[:section.index("\n## ", 1)]


def _statuses_in_code(module: str) -> set[int]:
    """The statuses *module* and the cli helpers it imports give themselves:
    ``ExitCode.NAME`` anywhere, and integers passed to ``sys.exit``/``SystemExit``."""
    import ast
    import importlib.util

    seen: set[str] = set()
    statuses: set[int] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or name in ("streamrep.cli", "streamrep.cli.exits"):
            continue
        seen.add(name)
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        tree = ast.parse(Path(spec.origin).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("streamrep.cli."):
                todo.append(node.module or "")
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id == "ExitCode":
                statuses.add(int(ExitCode[node.attr]))
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("sys.exit", "SystemExit"):
                statuses.update(n.value for arg in node.args for n in ast.walk(arg)
                                if isinstance(n, ast.Constant) and type(n.value) is int)
    return statuses


def test_exit_status_table_is_exit_code() -> None:
    import re

    rows = re.findall(r"^\| (\d+) \| `(\w+)` \| (.+?) \|$", _exit_section(), re.M)
    assert [(int(n), name) for n, name, _ in rows] == [(int(c), c.name) for c in ExitCode]


def test_each_command_gives_the_statuses_documented_for_it() -> None:
    import re

    section = _exit_section()
    table = section[section.index("| Command |"):]
    documented = {name: {int(n) for n in re.findall(r"\d+", statuses)}
                  for name, statuses in re.findall(r"^\| `(\S+)` \| ([^|]*) \|$", table, re.M)}
    assert sorted(documented) == sorted(SUBCOMMANDS)
    known = {int(code) for code in ExitCode}
    for command, target in SUBCOMMANDS.items():
        given = _statuses_in_code(target.partition(":")[0]) - {0}
        assert documented[command] <= known, (command, documented[command] - known)
        assert given == documented[command], (
            f"streamrep {command} gives {sorted(given)} itself, operations.md says "
            f"{sorted(documented[command])}")


def test_every_status_named_in_the_docs_has_its_number() -> None:
    import re

    root = Path(__file__).resolve().parent.parent
    wrong = []
    for page in [*sorted((root / "docs").glob("*.md")), root / "README.md"]:
        for number, name in re.findall(r"\b(\d+),? \(?`([A-Z][A-Z_]+)`", page.read_text()):
            if name in ExitCode.__members__ and int(ExitCode[name]) != int(number):
                wrong.append(f"{page.name}: {number} {name} (is {int(ExitCode[name])})")
    assert not wrong, wrong


def test_state_jobs_print_json_summaries(workdir: Path) -> None:
    """``--json``: compress, apply-compression and reconstruct print one JSON object
    each, whose counts agree with one another and with the tables."""
    import json

    pytest.importorskip("pyarrow")
    from support.state_forest import load_database, make_forest

    forest = make_forest(300, seed=3, rooms=3)
    url = f"sqlite:///{workdir / 'state.db'}"
    load_database(url, forest)
    proc = run("spark", "compress", "--single-process", "--db", url, "--output", str(workdir / "c"),
               "--max-depth", "10", "--json", cwd=workdir, timeout=120)
    assert proc.returncode == 0, proc.stderr
    compressed = json.loads(proc.stdout)
    assert compressed["command"] == "compress" and compressed["groups"] == len(forest.groups)
    assert compressed["rows_before"] == len(forest.state) and compressed["changed_groups"] > 0
    assert compressed["max_depth_after"] <= 10 and "timings" in compressed
    proc = run("state", "apply-compression", "--db", url, "--changes", str(workdir / "c"), "--json",
               cwd=workdir, timeout=120)
    assert proc.returncode == 0, proc.stderr
    applied = json.loads(proc.stdout)
    assert applied["command"] == "apply-compression"
    assert applied["rewritten"] == compressed["changed_groups"] and applied["skipped"] == {}
    assert applied["rows_after"] == compressed["rows_after"]
    proc = run("spark", "reconstruct", "--single-process", "--db", url, "--output", str(workdir / "r"),
               "--digest", "--json", cwd=workdir, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rebuilt = json.loads(proc.stdout)
    assert rebuilt["command"] == "reconstruct" and rebuilt["digest"] is True
    assert rebuilt["wanted_groups"] == rebuilt["rows"] == len(forest.groups)


def test_state_jobs_show_progress_in_groups(workdir: Path) -> None:
    """Single-process compress, apply-compression and reconstruct report progress in
    groups on stderr: lines when it is not a terminal (here every update), a rich
    bar with groups/s and the time left on a terminal."""
    import io
    import re

    pytest.importorskip("pyarrow")
    from streamrep.cli._progress import GroupProgress
    from support.state_forest import load_database, make_forest

    forest = make_forest(300, seed=4, rooms=3)
    url = f"sqlite:///{workdir / 'state.db'}"
    load_database(url, forest)
    every_update = "import os; os.environ['STREAMREP_PROGRESS_INTERVAL'] = '0'"
    line = re.compile(r"^(\S+): (\d+)/(\d+) groups \(\d+%\), [\d,]+ groups/s, ETA \d+s$")

    def progress_lines(proc: subprocess.CompletedProcess[str], label: str) -> list[tuple[int, int]]:
        assert proc.returncode == 0, proc.stderr
        found = [line.match(text) for text in proc.stderr.splitlines()]
        return [(int(m[2]), int(m[3])) for m in found if m and m[1] == label]

    proc = run("spark", "compress", "--single-process", "--db", url, "--output", str(workdir / "c"),
               "--max-depth", "10", cwd=workdir, prelude=every_update, timeout=120)
    assert progress_lines(proc, "compress")[-1] == (len(forest.groups), len(forest.groups))
    proc = run("state", "apply-compression", "--db", url, "--changes", str(workdir / "c"),
               "--batch-groups", "5", cwd=workdir, prelude=every_update, timeout=120)
    applied = progress_lines(proc, "apply-compression")
    assert len(applied) > 2 and applied[-1][0] == applied[-1][1] > 0
    assert [done for done, _ in applied] == sorted(done for done, _ in applied)
    proc = run("spark", "reconstruct", "--single-process", "--db", url, "--output", str(workdir / "r"),
               "--digest", cwd=workdir, prelude=every_update, timeout=120)
    assert progress_lines(proc, "reconstruct")[-1] == (len(forest.groups), len(forest.groups))

    screen = io.StringIO()
    bar = GroupProgress("compress", stream=screen, terminal=True)
    bar(50, 200)
    bar(100, 200)
    bar.close()
    drawn = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.getvalue())
    assert "100/200 groups" in drawn and "groups/s" in drawn and "ETA" in drawn

"""A change set proves itself before anything is written, and apply-compression
rides out a dropped PostgreSQL connection.

``spark compress`` writes MANIFEST.json (size and SHA-256 of every file) last;
``state apply-compression`` checks every file against it first. A changed,
truncated, missing or added file is one line with exit status 17 and the
database untouched. A backend killed with ``pg_terminate_backend`` in the middle
of an apply is retried on a new connection and the run ends with every group's
full state kept.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest
from click.testing import CliRunner

from streamrep.cli import main
from streamrep.cli.exits import ExitCode
from streamrep.spark.manifest import MANIFEST_NAME, check_manifest
from streamrep.spark.tables import read_db_table
from support.state_forest import Forest, load_database, make_forest


@pytest.fixture(scope="module")
def forest() -> Forest:
    return make_forest(900, seed=13, rooms=4, fan_out=60)


def db_rows(url: str) -> dict[str, list[tuple[object, ...]]]:
    found = {}
    for name in ("state_groups", "state_group_edges", "state_groups_state"):
        table = read_db_table(url, name)
        found[name] = sorted(zip(*(table.column(c).to_pylist() for c in table.column_names)))
    return found


def db_forest(url: str) -> Forest:
    rows = db_rows(url)
    return Forest(rows["state_groups"], rows["state_group_edges"], rows["state_groups_state"])


def compressed(url: str, out: Path) -> None:
    result = CliRunner().invoke(main, ["spark", "compress", "--db", url, "--output", str(out),
                                       "--single-process", "--max-depth", "20"])
    assert result.exit_code == 0, result.output


def a_file(out: Path, folder: str) -> Path:
    return sorted((out / folder).glob("*.parquet"))[0]


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])


def add_file(out: Path) -> None:
    (out / "changes" / "part-99999.parquet").write_bytes(a_file(out, "changes").read_bytes())


def drop_manifest(out: Path) -> None:
    (out / MANIFEST_NAME).unlink()


DAMAGE: dict[str, tuple[Callable[[Path], None], str]] = {
    "changed": (lambda out: flip_byte(a_file(out, "change_rows")), "does not match the SHA-256"),
    "truncated": (lambda out: truncate(a_file(out, "changes")), "(truncated or changed)"),
    "missing": (lambda out: a_file(out, "change_rows").unlink(), "which its MANIFEST.json lists"),
    "added": (add_file, "which its MANIFEST.json does not list"),
    "no manifest": (drop_manifest, "has no MANIFEST.json"),
}


def test_compress_writes_a_manifest_of_every_file(forest: Forest, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    load_database(url, forest)
    out = tmp_path / "out"
    compressed(url, out)
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    files = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} - {MANIFEST_NAME}
    assert set(manifest["files"]) == files
    assert {f.split("/")[0] for f in files} >= {"changes", "change_rows", "state_groups_state",
                                                "state_group_edges"}
    assert check_manifest(str(out)) == len(files)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_damaged_change_set_is_refused_with_nothing_written(
        forest: Forest, tmp_path: Path, damage: str) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    load_database(url, forest)
    out = tmp_path / "out"
    compressed(url, out)
    before = db_rows(url)
    harm, said = DAMAGE[damage]
    harm(out)
    proc = subprocess.run([sys.executable, "-m", "streamrep", "state", "apply-compression",
                           "--db", url, "--changes", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == ExitCode.CHANGE_SET_INVALID == 17, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("streamrep state apply-compression: error: change set ")
    assert said in lines[0] and "nothing was written" in lines[0]
    assert db_rows(url) == before


@pytest.mark.postgres
def test_apply_retries_a_terminated_backend(forest: Forest, pg_url: str, tmp_path: Path) -> None:
    import psycopg2

    load_database(pg_url, forest)
    out = tmp_path / "out"
    compressed(pg_url, out)
    name = f"apply-{uuid.uuid4().hex[:12]}"
    url = pg_url + ("&" if "?" in pg_url else "?") + f"application_name={name}"
    watcher = psycopg2.connect(pg_url.split("?")[0])
    watcher.autocommit = True
    killed: list[int] = []

    def kill_once_mid_apply() -> None:
        # Cut the apply's backend as soon as it is inside a transaction.
        deadline = time.monotonic() + 120
        cur = watcher.cursor()
        while time.monotonic() < deadline and not killed:
            cur.execute("SELECT pid, xact_start IS NOT NULL FROM pg_stat_activity "
                        "WHERE application_name = %s", (name,))
            rows = cur.fetchall()
            if rows and rows[0][1] and proc.poll() is None:
                cur.execute("SELECT pg_terminate_backend(%s)", (rows[0][0],))
                if cur.fetchone()[0]:
                    killed.append(rows[0][0])
                return
            time.sleep(0.05)

    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "streamrep", "state", "apply-compression",
                             "--db", url, "--changes", str(out), "--batch-groups", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    thread = threading.Thread(target=kill_once_mid_apply)
    thread.start()
    stdout, stderr = proc.communicate(timeout=300)
    thread.join()
    watcher.close()
    assert killed, "the apply ended before its backend could be terminated: " + stdout
    assert proc.returncode == 0, stderr
    assert "database connection lost" in stderr and "starting again" in stderr
    after = db_forest(pg_url)
    assert after.brute_force() == forest.brute_force()
    assert len(after.state) != len(forest.state)

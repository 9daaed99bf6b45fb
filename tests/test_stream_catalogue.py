"""The streams a process serves are built in one place; importing registers nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from streamrep.catalogue import known_streams, served_streams
from streamrep.config import load_config
from streamrep.events.streams import EVENT_STORE_STREAMS
from streamrep.streams import BUILTIN_STREAMS

EVERY_STREAM = ("account_data", "backfill", "caches", "events", "receipts", "to_device",
                "typing")


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_importing_every_module_registers_nothing(tmp_path: pytest.TempPathFactory) -> None:
    # The streams a handle serves and the package's catalogue are the same before and
    # after importing every module of the package, in a fresh interpreter.
    out = _run(f"""
        import importlib, pkgutil
        import streamrep
        from streamrep.catalogue import known_streams
        from streamrep.db import Database
        from streamrep.streams import Streams

        def served():
            db = Database.open("sqlite:///{tmp_path}/x.db")
            try:
                return (tuple(Streams(db, "w").names()), known_streams().names())
            finally:
                db.close()

        before = served()
        imported = 0
        for info in pkgutil.walk_packages(streamrep.__path__, "streamrep."):
            if info.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(info.name)
            except ImportError:  # an optional extra that is not installed
                continue
            imported += 1
        assert served() == before, (before, served())
        print(imported, before)
    """)
    imported, _, rest = out.partition(" ")
    assert int(imported) > 50
    assert rest == repr((("account_data", "caches", "receipts", "to_device", "typing"),
                         EVERY_STREAM))


@pytest.mark.parametrize("module", ["streamrep.events.streams", "streamrep.events.store",
                                    "streamrep.streams.builtin", "streamrep.streams.handle",
                                    "streamrep.catalogue"])
def test_each_stream_module_imports_first(module: str) -> None:
    # No import circle: each module imports on its own in a fresh interpreter.
    assert _run(f"import {module}; print('ok')") == "ok"


def test_no_global_registry() -> None:
    import streamrep.streams

    for name in ("register_stream", "unregister_stream", "stream_definitions",
                 "get_stream_definition"):
        assert not hasattr(streamrep.streams, name)


def test_the_catalogue_and_a_deployments_streams(tmp_path: pytest.TempPathFactory) -> None:
    assert known_streams().names() == EVERY_STREAM
    assert set(known_streams()) == set(BUILTIN_STREAMS) | set(EVENT_STORE_STREAMS)
    path = f"{tmp_path}/streamrep.yaml"
    with open(path, "w") as f:
        f.write("server_name: hs.example\ndatabase: sqlite:///x.db\n"
                "instance_map: {main: {}, writer1: {}}\n"
                "stream_writers: {events: [writer1]}\n")
    config = load_config(path, streams=known_streams())
    served = served_streams(config)
    assert served.names() == EVERY_STREAM
    # backfill is written in the events writer's transactions: it follows its writers.
    assert config.stream_writers["backfill"] == ("writer1",)
    assert config.stream_writers["caches"] == ("main",)

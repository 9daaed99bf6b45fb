"""The streams a process serves are built in one place; importing registers nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from streamrep.catalogue import known_streams, row_formats, served_streams
from streamrep.config import load_config
from streamrep.errors import DatabaseConfigError
from streamrep.events.streams import EVENT_STORE_STREAMS
from streamrep.streams import BUILTIN_STREAMS, InMemoryStream, RowFormat
from streamrep.streams.formats import FORMAT_ONLY_STREAMS

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


#: Every stream of the reference implementation (tests/test_interop_reference.py
#: checks this list and each format against the reference's own row classes).
REFERENCE_STREAMS = ("account_data", "backfill", "caches", "device_lists", "events", "federation",
                     "presence", "presence_federation", "profile_updates", "push_rules", "pushers",
                     "quarantined_media", "receipts", "sticky_events", "thread_subscriptions",
                     "to_device", "typing", "un_partial_stated_event", "un_partial_stated_room")


def test_one_row_format_per_stream_served_or_not() -> None:
    formats = row_formats()
    assert tuple(formats) == REFERENCE_STREAMS
    # A served stream's format is its definition's; the others are format-only.
    for definition in known_streams():
        assert formats[definition.name] is definition.row
    assert set(FORMAT_ONLY_STREAMS) == set(REFERENCE_STREAMS) - set(EVERY_STREAM)
    # A program's own stream joins the table; one described twice is refused.
    notes = InMemoryStream.Definition("notes", row=RowFormat.flat(("body", "string")))
    assert row_formats([notes])["notes"].names == ("body",)
    with pytest.raises(DatabaseConfigError, match="described twice.*presence"):
        row_formats([InMemoryStream.Definition("presence", row=RowFormat.flat(("x", "string")))])


def test_rows_named_by_their_format() -> None:
    formats = row_formats()
    ev = ["$e:hs", "!r:hs", "m.room.message", None, None, None, None, False, False]
    assert formats["events"].names == ("type", "data")
    assert formats["events"].named(["ev", ev]) == {"type": "ev", "data": {
        "event_id": "$e:hs", "room_id": "!r:hs", "type": "m.room.message", "state_key": None,
        "redacts": None, "relates_to": None, "membership": None, "rejected": False, "outlier": False}}
    assert formats["events"].named(["state-all", ["!r:hs"]]) == {"type": "state-all", "data": {"room_id": "!r:hs"}}
    assert formats["pushers"].named(["@a:hs", "m.http", "k", True]) == {
        "user_id": "@a:hs", "app_id": "m.http", "pushkey": "k", "deleted": True}
    # Only the shape counts (the reference sends 0 and 1 for booleans on SQLite).
    assert formats["device_lists"].named(["@a:hs", False, 1]) == {
        "user_id": "@a:hs", "is_signature": False, "hosts_calculated": 1}
    for stream, row, why in [
        ("pushers", ["@a:hs", "m.http", "k"], "3 fields, not the 4 of the format"),
        ("push_rules", {"user_id": "@a:hs"}, "a row is a JSON array, not dict"),
        ("events", ["ev", ev[:-1]], "8 fields, not the 9 of the format"),
        ("events", ["new-kind", []], "unknown row type 'new-kind'"),
        ("events", ["ev"], "a row is [type, [fields]]"),
    ]:
        assert formats[stream].misfit(row) == why, (stream, row)
        assert formats[stream].named(row) is None


def _documented() -> dict[str, tuple[str, list[str]]]:
    """docs/streams.md's table of every stream: name -> (served, backticked words of
    its fields column)."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "streams.md").read_text()
    section = text.split("## Every stream of a Matrix deployment", 1)[1]
    table: dict[str, tuple[str, list[str]]] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 4:
            table[cells[0].strip("`")] = (cells[1], re.findall(r"`([^`]+)`", cells[2]))
    return table


def test_the_documented_table_is_the_catalogues() -> None:
    table = _documented()
    formats = row_formats()
    assert sorted(table) == list(formats)
    served = set(known_streams().names())
    for name, (is_served, words) in table.items():
        assert is_served == ("yes" if name in served else "no"), name
        row = formats[name]
        if row.variants:
            expected = ["[type, data]"] + [word for kind, fields in row.variants
                                           for word in (kind, *(field for field, _ in fields))]
        else:
            expected = list(row.names)
        assert words == expected, name

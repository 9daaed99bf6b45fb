"""The row-shape check a relay runs on every RDATA row, compiled and pure side by side,
on ``ev`` rows with their flags as streamrep sends them (booleans) and as the
reference does on SQLite (0 and 1)."""

from __future__ import annotations

from types import ModuleType

import pytest

from support.impls import core_module

EV = [("event_id", "string"), ("room_id", "string"), ("type", "string"),
      ("state_key", "string|null"), ("redacts", "string|null"), ("relates_to", "string|null"),
      ("membership", "string|null"), ("rejected", "flag"), ("outlier", "flag")]
FLAGS = {"booleans": b"false,false", "0 and 1": b"0,0"}


@pytest.fixture
def rowcheck(impl_kind: str) -> ModuleType:
    return core_module("rowcheck", impl_kind)


@pytest.mark.parametrize("flags", sorted(FLAGS))
def test_check_1000_events_rows(benchmark: pytest.FixtureRequest, rowcheck: ModuleType, flags: str) -> None:
    shape = rowcheck.RowShape("events", variants={"ev": EV, "state-all": [("room_id", "string")]})
    check = rowcheck.check_row
    rows = [b'["ev",["$%d:hs","!room%d:hs","m.room.message",null,null,null,null,%s]]'
            % (i, i % 50, FLAGS[flags]) for i in range(1000)]

    def run() -> int:
        return sum(check(shape, row) is None for row in rows)

    assert benchmark(run) == len(rows)

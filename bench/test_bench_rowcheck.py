"""The row-shape check a relay runs on every RDATA row, compiled and pure side by side."""

from __future__ import annotations

from types import ModuleType

import pytest

from support.impls import core_module

EV = [("event_id", "string"), ("room_id", "string"), ("type", "string"),
      ("state_key", "string|null"), ("redacts", "string|null"), ("relates_to", "string|null"),
      ("membership", "string|null"), ("rejected", "boolean"), ("outlier", "boolean")]
ROWS = [b'["ev",["$%d:hs","!room%d:hs","m.room.message",null,null,null,null,false,false]]'
        % (i, i % 50) for i in range(1000)]


@pytest.fixture
def rowcheck(impl_kind: str) -> ModuleType:
    return core_module("rowcheck", impl_kind)


def test_check_1000_events_rows(benchmark: pytest.FixtureRequest, rowcheck: ModuleType) -> None:
    shape = rowcheck.RowShape("events", variants={"ev": EV, "state-all": [("room_id", "string")]})
    check = rowcheck.check_row

    def run() -> int:
        return sum(check(shape, row) is None for row in ROWS)

    assert benchmark(run) == len(ROWS)

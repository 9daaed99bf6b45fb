"""Typed rows of the built-in streams, and handlers per stream."""

from __future__ import annotations

from typing import Any

import pytest

from streamrep.replication import StreamHandlers
from streamrep.streams import builtin, rows


@pytest.mark.parametrize("typed", rows.TYPED_STREAMS, ids=lambda t: t.name)
def test_each_typed_row_has_its_streams_row_format_fields(typed: rows.TypedStream[Any]) -> None:
    definition = next(d for d in builtin.BUILTIN_STREAMS if d.name == typed.name)
    assert typed.row_type._fields == definition.row.names  # type: ignore[attr-defined]


def test_handlers_get_their_streams_rows_typed_and_the_rest_goes_to_the_default() -> None:
    handlers = StreamHandlers(default=lambda *fact: others.append(fact))
    caches: list[tuple[str, int, list[rows.CachesRow]]] = []
    others: list[tuple[Any, ...]] = []

    @handlers.on(rows.CACHES)
    def on_caches(instance: str, token: int, facts: list[rows.CachesRow]) -> None:
        caches.append((instance, token, facts))

    assert handlers.streams == ["caches"]
    handlers("caches", "w1", 7, [["get_user_by_id", ["@a:x"], 1], ["cs_cache_fake", None, 2]])
    handlers("typing", "w1", 3, [["!r:x", ["@a:x"]]])
    [(instance, token, facts)] = caches
    assert (instance, token) == ("w1", 7)
    assert facts[0].cache_func == "get_user_by_id" and facts[0].keys == ["@a:x"]
    assert facts[1].keys is None and facts[1].invalidation_ts == 2
    assert others == [("typing", "w1", 3, [["!r:x", ["@a:x"]]])]
    with pytest.raises(TypeError):
        rows.CACHES.rows([["too", "short"]])  # a row of another shape is not silently cut

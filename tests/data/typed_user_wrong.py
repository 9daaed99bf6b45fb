"""Mistakes the types catch (tests/test_typing.py expects mypy to refuse each line)."""

from __future__ import annotations

from streamrep.replication import StreamHandlers, open_link
from streamrep.streams import rows

handlers = StreamHandlers()


@handlers.on(rows.CACHES)
def wrong_rows(instance: str, token: int, facts: list[rows.ReceiptsRow]) -> None:
    pass


def wrong_token(link: object) -> None:
    open_link(link, start_from={"caches": "0"})  # type: ignore[arg-type]
    rows.CACHES.rows([["c", None, "not an int"]])[0].cache_func.no_such_attribute

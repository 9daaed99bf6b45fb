"""Typed rows of the built-in streams, for handlers that know their stream.

A fact's rows arrive as the JSON arrays ``RDATA`` carries (``list[Any]``). A worker
that follows a known stream can have them as named tuples instead, typed field by
field: :class:`TypedStream` pairs a stream's name with its row type, and
:class:`~streamrep.replication.handlers.StreamHandlers` hands each handler the rows
of its stream converted. The field names are those of the stream's
:class:`~streamrep.streams.RowFormat` (``tests/test_stream_rows.py`` checks it).
"""

from __future__ import annotations

from typing import Any, Generic, NamedTuple, TypeVar

__all__ = [
    "TypedStream", "CachesRow", "AccountDataRow", "ToDeviceRow", "ReceiptsRow", "TypingRow",
    "CACHES", "ACCOUNT_DATA", "TO_DEVICE", "RECEIPTS", "TYPING", "TYPED_STREAMS",
]

R = TypeVar("R", bound=tuple[Any, ...])


class TypedStream(Generic[R]):
    """A stream's name and the named tuple its rows become (``row_type._make(row)``)."""

    __slots__ = ("name", "row_type")

    def __init__(self, name: str, row_type: type[R]) -> None:
        self.name = name
        self.row_type = row_type

    def rows(self, rows: list[Any]) -> list[R]:
        """*rows* as received, as named tuples."""
        make = self.row_type._make  # type: ignore[attr-defined]
        return [make(row) for row in rows]

    def __repr__(self) -> str:
        return f"TypedStream({self.name!r}, {self.row_type.__name__})"


class CachesRow(NamedTuple):
    """A cache invalidation: the cached function, its key (None: every key), when."""

    cache_func: str
    keys: list[Any] | None
    invalidation_ts: int


class AccountDataRow(NamedTuple):
    """A user's account data of *data_type* changed (in *room_id*, or global)."""

    user_id: str
    room_id: str | None
    data_type: str


class ToDeviceRow(NamedTuple):
    """A user (``@user:server``) or a remote server has to-device messages waiting."""

    entity: str


class ReceiptsRow(NamedTuple):
    """A receipt."""

    room_id: str
    receipt_type: str
    user_id: str
    event_id: str
    thread_id: str | None
    data: dict[str, Any]


class TypingRow(NamedTuple):
    """Who is typing in a room now."""

    room_id: str
    user_ids: list[str]


CACHES: TypedStream[CachesRow] = TypedStream("caches", CachesRow)
ACCOUNT_DATA: TypedStream[AccountDataRow] = TypedStream("account_data", AccountDataRow)
TO_DEVICE: TypedStream[ToDeviceRow] = TypedStream("to_device", ToDeviceRow)
RECEIPTS: TypedStream[ReceiptsRow] = TypedStream("receipts", ReceiptsRow)
TYPING: TypedStream[TypingRow] = TypedStream("typing", TypingRow)

#: Every typed built-in stream.
TYPED_STREAMS: tuple[TypedStream[Any], ...] = (CACHES, ACCOUNT_DATA, TO_DEVICE, RECEIPTS, TYPING)

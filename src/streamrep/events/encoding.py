"""What a PostgreSQL database whose encoding is not UTF-8 can hold.

The event's JSON is stored as bytes and survives any encoding; its identifiers (event
ID, room ID, type, state key, sender, membership, the events it names) go into text
columns, which hold only the characters of the database's encoding. Before a batch
is written there, :func:`check_batch_text` refuses an event whose identifiers the
encoding cannot hold, naming the field, instead of the server refusing the whole
batch's statement. UTF-8 databases, ``SQL_ASCII`` ones (which store bytes
unchecked) and SQLite need no check.
"""

from __future__ import annotations

import codecs
from typing import Any

from streamrep.db import Transaction
from streamrep.errors import InvalidEventError
from streamrep.events.validation import EventRecord

__all__ = ["codec_of", "check_batch_text"]

#: PostgreSQL's server encodings by their Python codec (the ones whose names differ).
_CODECS = {
    "LATIN1": "latin-1", "LATIN2": "iso8859-2", "LATIN3": "iso8859-3", "LATIN4": "iso8859-4",
    "LATIN5": "iso8859-9", "LATIN6": "iso8859-10", "LATIN7": "iso8859-13",
    "LATIN8": "iso8859-14", "LATIN9": "iso8859-15", "LATIN10": "iso8859-16",
    "ISO_8859_5": "iso8859-5", "ISO_8859_6": "iso8859-6", "ISO_8859_7": "iso8859-7",
    "ISO_8859_8": "iso8859-8", "EUC_JP": "euc_jp", "EUC_KR": "euc_kr", "EUC_CN": "gb2312",
    "EUC_JIS_2004": "euc_jis_2004", "KOI8R": "koi8_r", "KOI8U": "koi8_u", "SJIS": "shift_jis",
    "BIG5": "big5", "GBK": "gbk", "UHC": "cp949", "GB18030": "gb18030", "JOHAB": "johab",
    "SHIFT_JIS_2004": "shift_jis_2004",
}


def codec_of(server_encoding: str) -> str | None:
    """The Python codec of a PostgreSQL server encoding; None for the encodings that
    hold any text sent as UTF-8 (``UTF8``, ``SQL_ASCII``)."""
    name = server_encoding.upper()
    if name in ("UTF8", "SQL_ASCII"):
        return None
    if name.startswith("WIN"):  # WIN1250 ... WIN1258, WIN866, WIN874
        return "cp" + name[3:]
    codec = _CODECS.get(name, name.lower())
    try:
        codecs.lookup(codec)
    except LookupError:
        return "ascii"  # an encoding Python does not know: only ASCII is sure to fit
    return codec


def _fields(record: EventRecord) -> list[tuple[str, Any]]:
    fields: list[tuple[str, Any]] = [
        ("event_id", record.event_id), ("room_id", record.room_id), ("type", record.type),
        ("sender", record.sender), ("state_key", record.state_key),
        ("membership", record.membership), ("redacts", record.redacts),
        ("m.relates_to.event_id", record.relates_to)]
    fields.extend(("prev_events", prev) for prev in record.prev_events)
    auth = record.body.get("auth_events")
    if isinstance(auth, list):
        fields.extend(("auth_events", a[0] if isinstance(a, list) and a else a) for a in auth)
    content = record.content.get("history_visibility") if record.type == (
        "m.room.history_visibility") else None
    fields.append(("content.history_visibility", content))
    return fields


def check_batch_text(txn: Transaction, records: list[EventRecord], codec: str) -> None:
    """Raise :class:`InvalidEventError` naming the first field of *records* that the
    database's encoding (its Python *codec*) cannot hold."""
    for record in records:
        for field, value in _fields(record):
            if not isinstance(value, str) or value.isascii():
                continue
            try:
                value.encode(codec)
            except UnicodeEncodeError as exc:
                encoding = txn.fetchval("SHOW server_encoding")
                raise InvalidEventError(
                    f"event {record.event_id}: {field!r} holds {value[exc.start]!r}, which "
                    f"this database's encoding ({encoding}) cannot hold; store events in a "
                    "database created with ENCODING 'UTF8'") from None

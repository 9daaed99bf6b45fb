"""Identifiers a database cannot hold are refused before anything is written, with an
``InvalidEventError`` naming the field, on either engine: a NUL character, more than
255 bytes (where PostgreSQL's indexes refuse keys), and, in a PostgreSQL database
whose encoding is not UTF-8, characters that encoding lacks (the event's JSON, stored
as bytes, may hold anything)."""

from __future__ import annotations

import uuid
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from streamrep import EventStore
from streamrep.errors import InvalidEventError
from streamrep.matrix.room_builder import RoomBuilder

ANN = "@ann:t.org"
LONG = "".join(chr(0x61 + (n * 7919) % 26) for n in range(200_000))


def _room() -> tuple[RoomBuilder, list[dict[str, Any]]]:
    r = RoomBuilder("!text:t.org", ANN, "10")
    return r, [r.create, r.event("m.room.member", ANN, {"membership": "join"}, state_key=ANN)]


CASES: dict[str, tuple[str, Callable[[RoomBuilder], dict[str, Any]]]] = {
    "NUL in a state key": ("state_key", lambda r: r.event(
        "m.room.topic", ANN, {"topic": "t"}, state_key="a\x00b")),
    "200,000-character state key": ("state_key", lambda r: r.event(
        "m.room.topic", ANN, {"topic": "t"}, state_key=LONG)),
    "200,000-character user ID": ("sender", lambda r: r.event(
        "m.room.member", "@" + LONG + ":t.org", {"membership": "join"},
        state_key="@" + LONG + ":t.org")),
    "NUL in the sender": ("sender", lambda r: r.event("m.room.message", "@a\x00n:t.org",
                                                       {"body": "x"})),
    "long event type": ("type", lambda r: r.event("x" + LONG, ANN, {"x": 1}, state_key="")),
    "long event ID": ("event_id", lambda r: r.event("m.room.message", ANN, {"body": "x"},
                                                    event_id="$" + LONG)),
    "long prev event": ("prev_events", lambda r: {**r.event("m.room.message", ANN, {"body": "x"}),
                                                  "prev_events": ["$" + LONG]}),
    "NUL in an auth event": ("auth_events", lambda r: {
        **r.event("m.room.message", ANN, {"body": "x"}), "auth_events": ["$a\x00"]}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_what_no_database_holds_is_refused_naming_the_field(db_url: str, case: str) -> None:
    field, make = CASES[case]
    r, events = _room()
    store = EventStore(db_url, verify_event_ids="off")
    try:
        store.persist_events(events)
        event = make(r)
        with pytest.raises(InvalidEventError, match=f"'{field}'"):
            store.persist_events([event, r.event("m.room.message", ANN, {"body": "ok"})])
        # Nothing of the batch is stored; NUL and length both read as bytes or mapping.
        assert store.get_room_events(r.room_id) == [e["event_id"] for e in events]
    finally:
        store.close()


def test_what_the_store_holds_everywhere(db_url: str) -> None:
    """255-byte identifiers and NUL in content (an escape in the JSON) are stored."""
    r, events = _room()
    store = EventStore(db_url, verify_event_ids="off")
    try:
        store.persist_events(events)
        key = "k" * 255
        fine = [r.event("m.room.topic", ANN, {"topic": "a\x00b"}, state_key=key),
                r.event("m.room.message", ANN, {"body": "nul \x00 and ☃"})]
        assert store.persist_events(fine).rejected == {}
        assert store.get_current_state(r.room_id)[("m.room.topic", key)] == fine[0]["event_id"]
        assert store.get_event(fine[1]["event_id"]).as_dict()["content"]["body"] == "nul \x00 and ☃"
    finally:
        store.close()


@pytest.fixture
def latin1_url(pg_server: str) -> Iterator[str]:
    """A new PostgreSQL database whose encoding is LATIN1, dropped afterwards."""
    import psycopg2

    name = f"streamrep_latin1_{uuid.uuid4().hex[:12]}"
    admin = psycopg2.connect(pg_server)
    admin.autocommit = True
    try:
        with admin.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C'"
                           " LC_CTYPE 'C' TEMPLATE template0")
        parts = urlsplit(pg_server)
        yield urlunsplit(parts._replace(path="/" + name))
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE {name} WITH (FORCE)")
    finally:
        admin.close()


def test_a_latin1_database_refuses_what_it_cannot_hold_naming_the_field(
        latin1_url: str) -> None:
    r, events = _room()
    store = EventStore(latin1_url, verify_event_ids="off")
    try:
        assert not store.db.text_is_utf8
        store.persist_events(events)
        # Latin-1 characters fit; a content of any script is JSON bytes.
        fine = [r.event("m.room.topic", ANN, {"topic": "日本語 ☃"}, state_key="café"),
                r.event("m.room.member", ANN, {"membership": "join", "displayname": "Zoë"},
                        state_key=ANN)]
        assert store.persist_events(fine).rejected == {}
        assert store.get_event(fine[0]["event_id"]).as_dict()["content"]["topic"] == "日本語 ☃"
        for field, event in [
                ("state_key", r.event("m.room.topic", ANN, {"topic": "t"}, state_key="日本")),
                ("sender", r.event("m.room.message", "@☃:t.org", {"body": "x"})),
                ("type", r.event("m.room.☃", ANN, {"x": 1}, state_key=""))]:
            with pytest.raises(InvalidEventError, match=f"'{field}' holds .*LATIN1.*UTF8"):
                store.persist_events([event])
        assert store.get_room_events(r.room_id) == [e["event_id"] for e in [*events, *fine]]
    finally:
        store.close()

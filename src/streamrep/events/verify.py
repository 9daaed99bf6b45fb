"""Verifying event IDs and content hashes on persist (``EventStore(...,
verify_event_ids=...)``).

From room version 3 on an event's ID is its reference hash, and every event
carries its content hash (``hashes.sha256``); an event that matches neither is not
the event it claims to be (a tampered copy, or one built without them). Per store:

* ``"strict"``: such an event is rejected, with the reason (``bad_event_id``,
  ``bad_content_hash``), before the room rules see it;
* ``"warn"`` (the default): it is stored as given, counted per room
  (``EventStore.unverified_events``) and logged once per room;
* ``"off"``: nothing is computed.

Rooms of versions 1 and 2, whose event IDs their servers choose, are not checked.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from streamrep import _impl
from streamrep.db import Transaction
from streamrep.errors import InvalidEventError
from streamrep.events.roomversions import RoomVersions, version_named_by_create
from streamrep.events.validation import EventRecord
from streamrep.matrix.eventformat import check_events
from streamrep.matrix.room_versions import RoomVersion
from streamrep.matrix.verdict import Rejection

if TYPE_CHECKING:
    from streamrep._pure import batchrows as _batchrows
else:
    _batchrows = _impl.load("batchrows")

__all__ = ["VERIFY_MODES", "VerifyMode", "Verification", "check_mode", "verify_batch",
           "batch_versions"]

VerifyMode = Literal["strict", "warn", "off"]
VERIFY_MODES: tuple[VerifyMode, ...] = ("strict", "warn", "off")


def check_mode(mode: object) -> VerifyMode:
    """*mode* when it is one of :data:`VERIFY_MODES`, else :class:`InvalidEventError`."""
    if mode == "strict" or mode == "warn" or mode == "off":
        return mode
    raise InvalidEventError(f"verify_event_ids must be one of {', '.join(VERIFY_MODES)}, "
                            f"not {mode!r}")


@dataclass
class Verification:
    """What verifying a batch found."""

    #: the batch's records, those rejected (``strict``) flagged
    records: list[EventRecord]
    #: ``strict``: the events rejected and why
    rejected: dict[str, Rejection] = field(default_factory=dict)
    #: ``warn``: the events stored although they failed, ``(room, reason)``
    unverified: dict[str, tuple[str, Rejection]] = field(default_factory=dict)


def batch_versions(txn: Transaction, records: list[EventRecord],
                   versions: RoomVersions) -> dict[str, RoomVersion]:
    """The version of each room of *records*: what a create event of the batch
    names, else what the store knows (:class:`RoomVersions`)."""
    out: dict[str, RoomVersion] = {}
    for record in records:
        if record.type == "m.room.create" and record.state_key == "" and (
                record.room_id not in out):
            named = version_named_by_create(record.content)
            if named is not None:
                out[record.room_id] = named
    rest = {r.room_id for r in records if r.room_id not in out}
    if rest:
        out.update(versions.of(txn, rest))
    return out


def verify_batch(records: list[EventRecord], versions: dict[str, RoomVersion],
                 mode: VerifyMode) -> Verification:
    """Check each of *records* (its room's version in *versions*) under *mode*."""
    found = Verification(records)
    if mode == "off":
        return found
    failed: dict[str, Rejection] = {}
    for room_id, room_records in _batchrows.by_room(records).items():
        version = versions.get(room_id)
        if version is not None:
            failed.update(check_events(room_records, version))
    if not failed:
        return found
    if mode == "warn":
        found.unverified = {r.event_id: (r.room_id, failed[r.event_id])
                            for r in records if r.event_id in failed}
        return found
    found.rejected = failed
    found.records = [dataclasses.replace(r, rejected=True) if r.event_id in failed else r
                     for r in records]
    return found

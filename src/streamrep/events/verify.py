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

The store checks a batch right after validating it, before its transaction
(:func:`check_early`), wherever the room's version is known without the database
(named by a create event of the batch, or cached): the check reads every value of
every event, and then finds them in the processor's caches, where validation has
just read them; in the transaction, after the database round trip, the same check
takes about a fifth more CPU time. The transaction (:func:`verify_planned`) takes
those results as they are when its plan writes every event of the batch as
validated; otherwise it takes them for the events it writes that were checked under
the version it finds, and checks the rest.
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

__all__ = ["VERIFY_MODES", "VerifyMode", "Verification", "EarlyCheck", "check_mode",
           "check_early", "verify_planned", "verify_batch", "batch_versions"]

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


@dataclass
class EarlyCheck:
    """What :func:`check_early` found."""

    #: the batch's records, as validated
    records: list[EventRecord]
    #: the version each room was checked under
    versions: dict[str, RoomVersion]
    #: whether that is every room of the batch
    complete: bool
    #: the records that failed, and why
    failed: dict[str, Rejection]

    def checked(self) -> dict[str, EventRecord]:
        """The records checked, by event ID."""
        return {r.event_id: r for r in self.records if r.room_id in self.versions}


def _named_by_creates(records: list[EventRecord]) -> dict[str, RoomVersion]:
    """The version each create event of *records* names, by room (the first)."""
    out: dict[str, RoomVersion] = {}
    for record in records:
        if record.type == "m.room.create" and record.state_key == "" and (
                record.room_id not in out):
            named = version_named_by_create(record.content)
            if named is not None:
                out[record.room_id] = named
    return out


def batch_versions(txn: Transaction, records: list[EventRecord],
                   versions: RoomVersions) -> dict[str, RoomVersion]:
    """The version of each room of *records*: what a create event of the batch
    names, else what the store knows (:class:`RoomVersions`)."""
    out = _named_by_creates(records)
    rest = {r.room_id for r in records if r.room_id not in out}
    if rest:
        out.update(versions.of(txn, rest))
    return out


def check_early(records: list[EventRecord], versions: RoomVersions) -> EarlyCheck:
    """Check the records of each room whose version is known without the database
    (named by a create event of *records*, else cached), as soon as they are
    validated (see the module docstring)."""
    rooms = _batchrows.by_room(records)
    known = _named_by_creates(records)
    for room_id in rooms:
        if room_id not in known:
            version = versions.known(room_id)
            if version is not None:
                known[room_id] = version
    failed: dict[str, Rejection] = {}
    for room_id, room_records in rooms.items():
        version = known.get(room_id)
        if version is not None:
            failed.update(check_events(room_records, version))
    return EarlyCheck(records, known, len(known) == len(rooms), failed)


def verify_planned(txn: Transaction, todo: list[EventRecord], deoutliered: list[str],
                   versions: RoomVersions, mode: VerifyMode,
                   early: EarlyCheck | None) -> Verification:
    """:func:`verify_batch` of the events a batch's plan writes (*todo*; those of
    them *deoutliered*) under the versions :func:`batch_versions` gives them,
    taking what *early* found. When the plan writes every record of the batch as
    validated (none was stored before), and *early* checked every room, its
    results are the answer: the versions are the same (the same create events,
    else the same cached versions)."""
    if mode == "off":
        return Verification(todo)
    if (early is not None and early.complete and not deoutliered
            and len(todo) == len(early.records)):
        return _verdict(todo, early.failed, mode)
    return verify_batch(todo, batch_versions(txn, todo, versions), mode, early)


def _check_room(records: list[EventRecord], version: RoomVersion,
                early: EarlyCheck | None) -> dict[str, Rejection]:
    """:func:`check_events` of *records* (of one room), taking *early*'s result for
    each record it checked (the same record, under the same version)."""
    used = None if early is None else early.versions.get(records[0].room_id)
    if early is None or (used is not version and used != version):
        return check_events(records, version)
    checked = early.checked()
    rest = [r for r in records if checked.get(r.event_id) is not r]
    failed = check_events(rest, version) if rest else {}
    if early.failed:
        failed.update((r.event_id, early.failed[r.event_id]) for r in records
                      if r.event_id in early.failed and checked.get(r.event_id) is r)
    return failed


def verify_batch(records: list[EventRecord], versions: dict[str, RoomVersion],
                 mode: VerifyMode, early: EarlyCheck | None = None) -> Verification:
    """Check each of *records* (its room's version in *versions*) under *mode*;
    *early*: what :func:`check_early` found for them, if it ran."""
    if mode == "off":
        return Verification(records)
    failed: dict[str, Rejection] = {}
    for room_id, room_records in _batchrows.by_room(records).items():
        version = versions.get(room_id)
        if version is not None:
            failed.update(_check_room(room_records, version, early))
    return _verdict(records, failed, mode)


def _verdict(records: list[EventRecord], failed: dict[str, Rejection],
             mode: VerifyMode) -> Verification:
    """What *mode* makes of the *failed* ones of *records*."""
    found = Verification(records)
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

"""Matrix events as the specification writes them, per room version: redaction,
canonical JSON, the content hash, the reference hash and the event ID.

The work runs in the ``eventhash`` core (:mod:`streamrep._pure.eventhash` defines
it); this module applies a :class:`~streamrep.matrix.room_versions.RoomVersion`'s
rules. Signatures are not computed or checked here: no keys are fetched.

* :func:`prune_event` - the event as redaction leaves it (``unsigned`` goes too: the
  specification keeps only the listed keys);
* :func:`content_hash`, :func:`reference_hash` - unpadded Base64, standard alphabet;
* :func:`event_id_for` - ``$`` + the reference hash in the version's alphabet
  (versions 3 on; versions 1 and 2 let the sending server choose);
* :func:`check_event`, :func:`check_events` - why an event does not match its ID
  or its content hash.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

from streamrep import _impl
from streamrep._pure.eventhash import BAD_EVENT_ID as _BAD_EVENT_ID
from streamrep._pure.eventhash import HASHES_MATCH as _HASHES_MATCH
from streamrep._pure.eventhash import NO_CONTENT_HASH as _NO_CONTENT_HASH
from streamrep._pure.eventhash import CanonicalJsonError, RedactionRules
from streamrep.matrix.errors import MalformedEventError, RejectionReason
from streamrep.matrix.room_versions import EventIdFormat, RoomVersion
from streamrep.matrix.verdict import Rejection

if TYPE_CHECKING:
    from streamrep._pure import eventhash as _eventhash
else:
    _eventhash = _impl.load("eventhash")

__all__ = ["CanonicalJsonError", "redaction_rules", "prune_event", "canonical_json",
           "content_hash", "reference_hash", "event_id_for", "check_event", "check_events",
           "ids_are_hashes"]

_RULES: dict[str, RedactionRules] = {}


def redaction_rules(version: RoomVersion) -> RedactionRules:
    """The ``eventhash`` core's form of *version*'s redaction rules (made once)."""
    rules = _RULES.get(version.identifier)
    if rules is None:
        redaction = version.redaction
        rules = _RULES[version.identifier] = RedactionRules(
            redaction.top_level, redaction.content, redaction.nested)
    return rules


def ids_are_hashes(version: RoomVersion) -> bool:
    """Whether *version*'s event IDs are reference hashes (versions 3 on)."""
    return version.event_id_format is not EventIdFormat.SERVER_CHOSEN


def prune_event(event: Mapping[str, Any], version: RoomVersion) -> dict[str, Any]:
    """*event* with every key *version*'s redaction algorithm removes taken out."""
    return _eventhash.prune(event, redaction_rules(version))


def canonical_json(value: Any, version: RoomVersion | None = None) -> bytes:
    """*value*'s canonical JSON; numbers as *version* allows them (strictly, as the
    specification defines canonical JSON, when None)."""
    return _eventhash.canonical_json(value, version is None or version.strict_canonical_json)


def content_hash(event: Mapping[str, Any], version: RoomVersion) -> str:
    """The event's content hash (``hashes.sha256``) in unpadded Base64."""
    return _eventhash.unpadded_base64(
        _eventhash.content_hash(event, version.strict_canonical_json))


def reference_hash(event: Mapping[str, Any], version: RoomVersion) -> str:
    """The event's reference hash in unpadded Base64 (standard alphabet)."""
    return _eventhash.unpadded_base64(_eventhash.reference_hash(
        event, redaction_rules(version), version.strict_canonical_json))


def event_id_for(event: Mapping[str, Any], version: RoomVersion) -> str:
    """The ID of *event* (its fields, without ``event_id``) in a room of *version*;
    :class:`MalformedEventError` for versions 1 and 2, whose IDs are not derived."""
    if not ids_are_hashes(version):
        raise MalformedEventError(
            f"room version {version.identifier} event IDs are chosen by their server, "
            "not derived from the event")
    return _eventhash.event_id_from_hash(
        _eventhash.reference_hash(event, redaction_rules(version),
                                  version.strict_canonical_json), _urlsafe(version))


def check_event(event_id: str, event: Mapping[str, Any],
                version: RoomVersion) -> Rejection | None:
    """Why *event* (its fields) does not match *event_id* (versions 3 on: its
    reference hash) or the content hash it carries; None when it matches both (or
    for versions 1 and 2, whose IDs are not derived)."""
    if not ids_are_hashes(version):
        return None
    try:
        found = _eventhash.check_hashes(event_id, event, redaction_rules(version),
                                        version.strict_canonical_json, _urlsafe(version))
    except CanonicalJsonError as exc:
        return Rejection(RejectionReason.BAD_CONTENT_HASH.value,
                         f"the event is not canonical JSON ({exc})")
    return None if found == _HASHES_MATCH else _why(found, event_id, event, version)


def check_events(records: Iterable[Any], version: RoomVersion) -> dict[str, Rejection]:
    """:func:`check_event` of each record (the event store's: ``event_id``, ``body``,
    ``rejected``; those flagged rejected are not checked) of a room of *version*:
    the ones that do not match, with why."""
    if not ids_are_hashes(version):
        return {}
    records = list(records)
    try:
        failed = _eventhash.check_records(records, redaction_rules(version),
                                          version.strict_canonical_json, _urlsafe(version))
    except CanonicalJsonError:
        # One of them has no canonical JSON: name each on its own.
        return {r.event_id: why for r in records if not r.rejected
                and (why := check_event(r.event_id, r.body, version)) is not None}
    if not failed:
        return {}
    return {r.event_id: _why(failed[r.event_id], r.event_id, r.body, version)
            for r in records if r.event_id in failed}


def _urlsafe(version: RoomVersion) -> bool:
    return version.event_id_format is EventIdFormat.REFERENCE_HASH_URLSAFE


def _why(found: int, event_id: str, event: Mapping[str, Any], version: RoomVersion) -> Rejection:
    """The rejection for what ``check_hashes`` *found* (not a match)."""
    if found == _BAD_EVENT_ID:
        return Rejection(RejectionReason.BAD_EVENT_ID.value,
                         f"event ID {event_id} is not the event's reference hash "
                         f"({event_id_for(event, version)})")
    if found == _NO_CONTENT_HASH:
        return Rejection(RejectionReason.BAD_CONTENT_HASH.value,
                         "the event has no content hash (hashes.sha256)")
    hashes = event.get("hashes")
    claimed = hashes.get("sha256") if isinstance(hashes, dict) else None
    return Rejection(RejectionReason.BAD_CONTENT_HASH.value,
                     f"content hash {claimed} is not the event's "
                     f"({content_hash(event, version)})")

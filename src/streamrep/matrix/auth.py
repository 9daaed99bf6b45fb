"""The Matrix authorization rules, room versions 1 to 12.

Two entry points:

* :func:`check_auth_events` - the rules about the event's own ``auth_events``
  (all known, in this room, no duplicates, only the kinds the event may cite, none
  rejected, a create event among them). Returns the state they define.
* :func:`check_against_state` - every other rule, against a state (the event's auth
  events when it arrives; the room's current state for soft-failure; the partial
  state during state resolution).

Both raise :class:`~streamrep.matrix.errors.AuthRejection` with a
:class:`~streamrep.matrix.errors.RejectionReason`. The rules against a state run in
the core module ``authrules`` (compiled, or its pure twin), one
:func:`rules_for` object per room version; the create event's own rules and the
third-party invite's signature are checked here. :func:`authorize` runs both.
Signatures and hashes of the events themselves are the transport's business and
are not checked here; the one signature the rules look inside content (a
third-party invite's ``signed`` block) is checked.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Container, Mapping
from typing import TYPE_CHECKING, Any

from streamrep import _impl
from streamrep.matrix.errors import AuthRejection
from streamrep.matrix.errors import RejectionReason as R
from streamrep.matrix.events import (
    CREATE,
    CREATE_KEY,
    THIRD_PARTY_INVITE,
    MatrixEvent,
    StateKey,
    create_event_id_for_room,
)
from streamrep.matrix.room_versions import ROOM_VERSIONS, RoomVersion

if TYPE_CHECKING:
    from streamrep._pure import authrules as _authrules
else:
    _authrules = _impl.load("authrules")

__all__ = [
    "auth_types_for_event",
    "check_auth_events",
    "check_against_state",
    "authorize",
    "create_allowed",
    "domain_of",
    "rules_for",
]

#: The server name of a user, room (versions 1-11) or event (versions 1-2) ID.
domain_of = _authrules.domain_of

#: The held events a resolution reads, the power events among them, and one of
#: another room if any (the compiled core asks the processor for them first).
held_events = _authrules.held_events

_RULES: dict[int, tuple[RoomVersion, _authrules.Rules]] = {}


def rules_for(version: RoomVersion) -> _authrules.Rules:
    """The rules of *version* on the core in use (one object per version object)."""
    found = _RULES.get(id(version))
    if found is None or found[0] is not version:
        found = _RULES[id(version)] = (version, _authrules.Rules(version, _third_party_invite_ok))
    return found[1]


def auth_types_for_event(event: MatrixEvent, version: RoomVersion) -> set[StateKey]:
    """The state keys whose events may authorize *event* (the spec's auth event selection)."""
    return rules_for(version).auth_types(event)


def check_auth_events(
    event: MatrixEvent,
    version: RoomVersion,
    auth_events: Mapping[str, MatrixEvent],
    rejected: Container[str] = (),
    *,
    allowed: set[StateKey] | None = None,
) -> dict[StateKey, MatrixEvent]:
    """Check the event's ``auth_events`` and return the state they define.

    *auth_events* maps event IDs to the events streamrep holds (it may hold more);
    *rejected* holds the IDs of events stored as rejected; *allowed*, when the
    caller has it, is ``auth_types_for_event(event, version)``.
    """
    if event.type == CREATE and event.state_key == "":
        return {}
    missing = [aid for aid in event.auth_ids if aid not in auth_events]
    if missing:
        raise AuthRejection(R.MISSING_AUTH_EVENTS,
                            f"auth events not held: {', '.join(sorted(missing))}")
    if version.room_id_from_create_event:
        implied = create_event_id_for_room(event.room_id)
        if implied in event.auth_events:
            raise AuthRejection(R.BAD_AUTH_EVENTS,
                                "the create event must not be listed in auth_events")
    if allowed is None:
        allowed = auth_types_for_event(event, version)
    state: dict[StateKey, MatrixEvent] = {}
    for aid in event.auth_ids:
        auth = auth_events[aid]
        if auth.room_id != event.room_id:
            raise AuthRejection(R.BAD_AUTH_EVENTS,
                                f"auth event {aid} belongs to room {auth.room_id}")
        if auth.state_key is None:
            raise AuthRejection(R.BAD_AUTH_EVENTS, f"auth event {aid} is not a state event")
        key = auth.key
        if key in state:
            raise AuthRejection(R.BAD_AUTH_EVENTS, f"two auth events for {key}")
        if key not in allowed:
            raise AuthRejection(R.BAD_AUTH_EVENTS, f"auth event {aid} for {key} is not allowed")
        if aid in rejected:
            raise AuthRejection(R.REJECTED_AUTH_EVENT, f"auth event {aid} is rejected")
        state[key] = auth
    if CREATE_KEY not in state:
        raise AuthRejection(R.NO_CREATE_EVENT, "no create event among the auth events")
    return state


def authorize(
    event: MatrixEvent,
    version: RoomVersion,
    auth_events: Mapping[str, MatrixEvent],
    rejected: Container[str] = (),
    *,
    allowed: set[StateKey] | None = None,
) -> None:
    """Check *event* against its own auth events: every rule, or raise (*allowed*:
    see :func:`check_auth_events`)."""
    state = check_auth_events(event, version, auth_events, rejected, allowed=allowed)
    check_against_state(event, version, state)


def check_against_state(
    event: MatrixEvent, version: RoomVersion, state: Mapping[StateKey, MatrixEvent]
) -> None:
    """Check *event* against *state* (only the keys of :func:`auth_types_for_event`
    are read); raise :class:`AuthRejection` when a rule forbids it."""
    if event.type == CREATE and event.state_key == "":
        _check_create(event, version)
        return
    found = rules_for(version).check(event, state)
    if found is not None:
        raise AuthRejection(R(found[0]), found[1])


def create_allowed(event: MatrixEvent, version: RoomVersion) -> bool:
    """True when the create event *event* passes the rules."""
    try:
        _check_create(event, version)
    except AuthRejection:
        return False
    return True


def _check_create(event: MatrixEvent, version: RoomVersion) -> None:
    if event.prev_events:
        raise AuthRejection(R.BAD_CREATE_EVENT, "a create event has no prev_events")
    if not version.room_id_from_create_event and (
            domain_of(event.room_id) != domain_of(event.sender)):
        raise AuthRejection(R.BAD_CREATE_EVENT, "room ID and sender are on different servers")
    declared = event.content.get("room_version", "1")
    if declared not in ROOM_VERSIONS:
        raise AuthRejection(R.BAD_CREATE_EVENT, f"unknown room version {declared!r}")
    if not version.implicit_room_creator and "creator" not in event.content:
        raise AuthRejection(R.BAD_CREATE_EVENT, "the create event has no creator")
    if version.creator_power and "additional_creators" in event.content:
        extra = event.content["additional_creators"]
        if not isinstance(extra, list) or not all(_authrules.is_user_id(x) for x in extra):
            raise AuthRejection(R.BAD_CREATE_EVENT,
                                "additional_creators must be a list of user IDs")


def _b64decode(text: str) -> bytes:
    padded = text + "=" * (-len(text) % 4)
    if "-" in text or "_" in text:
        return base64.urlsafe_b64decode(padded)
    return base64.b64decode(padded)


def _canonical_json(value: Any) -> bytes:
    import orjson

    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _third_party_invite_ok(event: _authrules.Event,
                           state: Mapping[StateKey, _authrules.Event]) -> bool:
    from nacl.exceptions import BadSignatureError
    from nacl.signing import VerifyKey

    tpi = event.content.get("third_party_invite")
    if not isinstance(tpi, Mapping):
        return False
    signed = tpi.get("signed")
    if not isinstance(signed, Mapping):
        return False
    if not all(k in signed for k in ("mxid", "token", "signatures")):
        return False
    if signed["mxid"] != event.state_key or not isinstance(signed["token"], str):
        return False
    invite = state.get((THIRD_PARTY_INVITE, signed["token"]))
    if invite is None or invite.sender != event.sender:
        return False
    keys: list[object] = []
    if "public_key" in invite.content:
        keys.append(invite.content["public_key"])
    extra = invite.content.get("public_keys", [])
    if isinstance(extra, list):
        keys.extend(k.get("public_key") for k in extra if isinstance(k, Mapping))
    signatures = signed["signatures"]
    if not isinstance(signatures, Mapping):
        return False
    try:
        message = _canonical_json({k: v for k, v in signed.items()
                                   if k not in ("signatures", "unsigned")})
    except TypeError:  # orjson's JSONEncodeError is a TypeError
        return False
    for key in keys:
        if not isinstance(key, str):
            continue
        try:
            verify_key = VerifyKey(_b64decode(key))
        except (ValueError, binascii.Error, TypeError):
            continue
        for block in signatures.values():
            if not isinstance(block, Mapping):
                continue
            for key_name, signature in block.items():
                if not str(key_name).startswith("ed25519:") or not isinstance(signature, str):
                    continue
                try:
                    verify_key.verify(message, _b64decode(signature))
                    return True
                except (BadSignatureError, ValueError, binascii.Error):
                    continue
    return False

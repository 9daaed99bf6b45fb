"""The Matrix authorization rules, room versions 1 to 12.

Two entry points:

* :func:`check_auth_events` - the rules about the event's own ``auth_events``
  (all known, in this room, no duplicates, only the kinds the event may cite, none
  rejected, a create event among them). Returns the state they define.
* :func:`check_against_state` - every other rule, against a state (the event's auth
  events when it arrives; the room's current state for soft-failure; the partial
  state during state resolution).

Both raise :class:`~streamrep.matrix.errors.AuthRejection` with a
:class:`~streamrep.matrix.errors.RejectionReason`. :func:`authorize` runs both.
Signatures and hashes of the events themselves are the transport's business and
are not checked here; the one signature the rules look inside content (a
third-party invite's ``signed`` block) is checked.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Container, Mapping
from typing import Any

from streamrep.matrix import powerlevels as pl
from streamrep.matrix.errors import AuthRejection
from streamrep.matrix.errors import RejectionReason as R
from streamrep.matrix.events import (
    ALIASES,
    CREATE,
    CREATE_KEY,
    JOIN_RULES_KEY,
    MEMBER,
    POWER_LEVELS,
    POWER_LEVELS_KEY,
    REDACTION,
    THIRD_PARTY_INVITE,
    MatrixEvent,
    StateKey,
    create_event_id_for_room,
)
from streamrep.matrix.room_versions import ROOM_VERSIONS, RoomVersion

__all__ = [
    "auth_types_for_event",
    "check_auth_events",
    "check_against_state",
    "authorize",
    "domain_of",
]

_LEVEL_KEYS = ("users_default", "events_default", "state_default", "ban", "redact", "kick",
               "invite")
_MAX_ID_LENGTH = 255
_NO_LEVELS: Mapping[str, Any] = {}
_ABSENT = object()


def domain_of(identifier: str) -> str:
    """The server name of a user, room (versions 1-11) or event (versions 1-2) ID."""
    _, sep, domain = identifier.partition(":")
    return domain if sep else ""


def _is_user_id(value: object) -> bool:
    if not isinstance(value, str) or not value.startswith("@") or value.find(":", 2) < 0:
        return False
    # An ASCII string is as long in UTF-8 (and has nothing to fail encoding).
    return len(value if value.isascii() else value.encode()) <= _MAX_ID_LENGTH


def _third_party_token(event: MatrixEvent) -> str | None:
    tpi = event.content.get("third_party_invite")
    if tpi is not None and isinstance(tpi, Mapping):
        signed = tpi.get("signed")
        if isinstance(signed, Mapping) and isinstance(signed.get("token"), str):
            return str(signed["token"])
    return None


def auth_types_for_event(event: MatrixEvent, version: RoomVersion) -> set[StateKey]:
    """The state keys whose events may authorize *event* (the spec's auth event selection)."""
    if event.type == CREATE and event.state_key == "":
        return set()
    keys = {POWER_LEVELS_KEY, (MEMBER, event.sender), CREATE_KEY}
    if event.type == MEMBER and event.state_key is not None:
        membership = event.membership
        if membership in ("join", "invite", "knock"):
            keys.add(JOIN_RULES_KEY)
        keys.add((MEMBER, event.state_key))
        if membership == "invite":
            token = _third_party_token(event)
            if token is not None:
                keys.add((THIRD_PARTY_INVITE, token))
        if version.restricted_join_rule and membership == "join":
            via = event.content.get("join_authorised_via_users_server")
            if isinstance(via, str):
                keys.add((MEMBER, via))
    return keys


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
    create = state.get(CREATE_KEY)
    if create is None:
        raise AuthRejection(R.NO_CREATE_EVENT, "no create event in the room state")
    if create.content.get("m.federate", True) is not True and (
            domain_of(event.sender) != domain_of(create.sender)):
        raise AuthRejection(R.NOT_FEDERATED, "the room does not federate")
    if event.type == ALIASES and version.special_case_aliases_auth:
        if not event.state_key:
            raise AuthRejection(R.BAD_ALIASES, "an aliases event needs a state_key")
        if event.state_key != domain_of(event.sender):
            raise AuthRejection(R.BAD_ALIASES, "aliases state_key is not the sender's server")
        return
    if event.type == MEMBER:
        _check_membership(event, version, state, create)
        return
    _require_joined(event.sender, state)
    sender_level = pl.user_level(event.sender, state, version)
    if event.type == THIRD_PARTY_INVITE:
        if sender_level < pl.named_level(state, "invite", 0, version):
            raise AuthRejection(R.INSUFFICIENT_POWER, "sender may not invite")
        return
    needed = pl.send_level(event.type, event.is_state, state, version)
    if sender_level < needed:
        raise AuthRejection(R.INSUFFICIENT_POWER,
                            f"sending {event.type} needs level {needed}, sender has {sender_level}")
    if event.state_key is not None and event.state_key.startswith("@") and (
            event.state_key != event.sender):
        raise AuthRejection(R.OTHERS_STATE, "state keyed by another user's ID")
    if event.type == POWER_LEVELS and event.state_key == "":
        _check_power_levels(event, version, state, create, sender_level)
    if event.type == REDACTION and version.redaction_needs_same_domain:
        if sender_level < pl.named_level(state, "redact", 50, version):
            target = event.redacts
            # Without a target there is nothing to protect (the reference lets it pass).
            if target is not None and domain_of(target) != domain_of(event.event_id):
                raise AuthRejection(R.INSUFFICIENT_POWER, "sender may not redact that event")


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
        if not isinstance(extra, list) or not all(_is_user_id(x) for x in extra):
            raise AuthRejection(R.BAD_CREATE_EVENT,
                                "additional_creators must be a list of user IDs")


def _membership(state: Mapping[StateKey, MatrixEvent], user_id: str) -> str | None:
    member = state.get((MEMBER, user_id))
    return member.membership if member is not None else None


def _require_joined(user_id: str, state: Mapping[StateKey, MatrixEvent]) -> None:
    if _membership(state, user_id) != "join":
        raise AuthRejection(R.NOT_IN_ROOM, f"{user_id} is not joined to the room")


def _check_join(event: MatrixEvent, version: RoomVersion, state: Mapping[StateKey, MatrixEvent],
                create: MatrixEvent, sender_ms: str | None, join_rule: Any) -> None:
    """The membership rules of a join (*sender_ms*: the sender's membership now)."""
    target = event.state_key
    # The creator's own join right after the create event.
    if len(event.prev_events) == 1 and event.prev_events[0] == create.event_id:
        first = create.sender if version.implicit_room_creator else create.content.get(
            "creator")
        if first == target:
            return
    if event.sender != target:
        raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, "cannot join on behalf of another user")
    if sender_ms == "ban":
        raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, "sender is banned")
    restricted = ((version.restricted_join_rule and join_rule == "restricted")
                  or (version.knock_restricted_join_rule and join_rule == "knock_restricted"))
    if join_rule == "public":
        return
    if restricted:
        if sender_ms in ("join", "invite"):
            return
        via = event.content.get("join_authorised_via_users_server")
        if not isinstance(via, str):
            raise AuthRejection(R.MEMBERSHIP_FORBIDDEN,
                                "restricted join without join_authorised_via_users_server")
        if _membership(state, via) != "join":
            raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, f"authorising user {via} is not joined")
        if pl.user_level(via, state, version) < pl.named_level(state, "invite", 0, version):
            raise AuthRejection(R.MEMBERSHIP_FORBIDDEN,
                                f"authorising user {via} may not invite")
        return
    if join_rule == "invite" or (version.knock and join_rule == "knock"):
        if sender_ms in ("join", "invite"):
            return
        raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, "the room is invite-only")
    raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, f"join rule {join_rule!r} forbids joining")


def _check_membership(event: MatrixEvent, version: RoomVersion,
                      state: Mapping[StateKey, MatrixEvent], create: MatrixEvent) -> None:
    target = event.state_key
    membership = event.membership
    if target is None or membership is None:
        raise AuthRejection(R.MALFORMED, "membership event without state_key or membership")
    # As the reference reads the rules, an unfederated room also refuses memberships
    # of users on other servers, whoever sends them.
    if create.content.get("m.federate", True) is not True and (
            domain_of(target) != domain_of(create.sender)):
        raise AuthRejection(R.NOT_FEDERATED, "the room does not federate")
    sender_ms = _membership(state, event.sender)
    target_ms = _membership(state, target)
    join_rules = state.get(JOIN_RULES_KEY)
    join_rule = join_rules.content.get("join_rule", "invite") if join_rules else "invite"

    def level(user: str) -> int:
        return pl.user_level(user, state, version)

    if membership == "join":
        _check_join(event, version, state, create, sender_ms, join_rule)
        return

    if membership == "invite":
        if "third_party_invite" in event.content:
            if target_ms == "ban":
                raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, f"{target} is banned")
            if not _third_party_invite_ok(event, state):
                raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, "third-party invite does not verify")
            return
        if sender_ms != "join":
            raise AuthRejection(R.NOT_IN_ROOM, f"{event.sender} is not joined to the room")
        if target_ms in ("join", "ban"):
            raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, f"{target}'s membership is {target_ms}")
        if level(event.sender) < pl.named_level(state, "invite", 0, version):
            raise AuthRejection(R.INSUFFICIENT_POWER, "sender may not invite")
        return

    if membership == "leave":
        if event.sender == target:
            allowed = ("join", "invite", "knock") if version.knock else ("join", "invite")
            if sender_ms in allowed:
                return
            raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, f"{target} cannot leave from {sender_ms}")
        if sender_ms != "join":
            raise AuthRejection(R.NOT_IN_ROOM, f"{event.sender} is not joined to the room")
        sender_level = level(event.sender)
        if target_ms == "ban" and sender_level < pl.named_level(state, "ban", 50, version):
            raise AuthRejection(R.INSUFFICIENT_POWER, "sender may not unban")
        if sender_level >= pl.named_level(state, "kick", 50, version) and (
                level(target) < sender_level):
            return
        raise AuthRejection(R.INSUFFICIENT_POWER, f"sender may not kick {target}")

    if membership == "ban":
        if sender_ms != "join":
            raise AuthRejection(R.NOT_IN_ROOM, f"{event.sender} is not joined to the room")
        sender_level = level(event.sender)
        if sender_level >= pl.named_level(state, "ban", 50, version) and (
                level(target) < sender_level):
            return
        raise AuthRejection(R.INSUFFICIENT_POWER, f"sender may not ban {target}")

    if membership == "knock" and version.knock:
        if join_rule != "knock" and not (version.knock_restricted_join_rule
                                         and join_rule == "knock_restricted"):
            raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, f"join rule {join_rule!r} forbids knocking")
        if event.sender != target:
            raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, "cannot knock on behalf of another user")
        if sender_ms in ("ban", "invite", "join"):
            raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, f"cannot knock while {sender_ms}")
        return

    raise AuthRejection(R.MEMBERSHIP_FORBIDDEN, f"unknown membership {membership!r}")


def _check_power_levels(event: MatrixEvent, version: RoomVersion,
                        state: Mapping[StateKey, MatrixEvent], create: MatrixEvent,
                        sender_level: int) -> None:
    new = event.content
    ints_only = version.integer_power_levels
    for name in _LEVEL_KEYS:
        if name in new and pl.parse_level(new[name], ints_only) is None:
            raise AuthRejection(R.BAD_POWER_LEVELS, f"{name} must be an integer")
    for group in ("events", "notifications", "users"):
        if group in new:
            values = new[group]
            if not isinstance(values, Mapping) or not all(
                    type(v) is int or pl.parse_level(v, ints_only) is not None
                    for v in values.values()):
                raise AuthRejection(R.BAD_POWER_LEVELS,
                                    f"{group} must map to integer levels")
    users = new.get("users", {})
    for user in users:
        if not _is_user_id(user):
            raise AuthRejection(R.BAD_POWER_LEVELS, f"{user!r} is not a user ID")
    if version.creator_power:
        named = pl.creators(create, version).intersection(users)
        if named:
            raise AuthRejection(R.BAD_POWER_LEVELS,
                                f"creators may not be listed in users: {sorted(named)}")
    previous = state.get(POWER_LEVELS_KEY)
    if previous is None:
        return
    old = previous.content

    def read(content: Mapping[str, Any], group: str | None, name: str) -> int | None:
        where = content.get(group, {}) if group else content
        if not isinstance(where, Mapping) or name not in where:
            return None
        return pl.parse_level(where[name], False)

    checks: list[tuple[str | None, str]] = [(None, name) for name in _LEVEL_KEYS]
    groups = ["users", "events"] + (["notifications"] if version.limit_notifications_power_levels
                                    else [])
    for group_name in groups:
        old_values = old.get(group_name, _NO_LEVELS)
        new_values = new.get(group_name, _NO_LEVELS)
        names: set[str] = set()
        if type(old_values) is dict and type(new_values) is dict:
            # Only the names whose values differ can change a level.
            for n, v in old_values.items():
                w = new_values.get(n, _ABSENT)
                if not (v is w or (type(v) is type(w) and v == w)):
                    names.add(n)
            names.update(n for n in new_values if n not in old_values)
        else:
            for values in (old_values, new_values):
                if isinstance(values, Mapping):
                    names.update(values)
        checks.extend((group_name, name) for name in sorted(names))
    for where, name in checks:
        if where is None and _same_value(old.get(name, _ABSENT), new.get(name, _ABSENT)):
            continue
        old_level = read(old, where, name)
        new_level = read(new, where, name)
        if old_level == new_level:
            continue
        if where == "users" and name != event.sender and old_level == sender_level:
            raise AuthRejection(R.INSUFFICIENT_POWER,
                                f"sender may not change {name}'s level, equal to its own")
        if (old_level is not None and old_level > sender_level) or (
                new_level is not None and new_level > sender_level):
            label = f"{where}.{name}" if where else name
            raise AuthRejection(R.INSUFFICIENT_POWER,
                                f"sender may not change {label} beyond its own level")


def _same_value(a: object, b: object) -> bool:
    """Identical JSON values of one type (``True == 1``, but they read differently)."""
    return a is b or (type(a) is type(b) and a == b)


def _b64decode(text: str) -> bytes:
    padded = text + "=" * (-len(text) % 4)
    if "-" in text or "_" in text:
        return base64.urlsafe_b64decode(padded)
    return base64.b64decode(padded)


def _canonical_json(value: Any) -> bytes:
    import orjson

    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def _third_party_invite_ok(event: MatrixEvent, state: Mapping[StateKey, MatrixEvent]) -> bool:
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

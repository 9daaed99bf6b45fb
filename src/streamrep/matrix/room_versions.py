"""The facts that differ between Matrix room versions 1 to 12, as data.

Each :class:`RoomVersion` names the state resolution algorithm, the switches the
authorization rules consult, and the event format: what the redaction algorithm
keeps (:class:`Redaction`), how event IDs are made (:class:`EventIdFormat`), how
``prev_events`` and ``auth_events`` are written and whether the room ID derives from
the create event. The identifiers are the ones room creators write into
``m.room.create``'s ``content.room_version``; a create event without one makes a
version 1 room. ``docs/events.md`` lists the differences with the specification's
section for each.
"""

from __future__ import annotations

import dataclasses
import enum
from types import MappingProxyType
from typing import Mapping

from streamrep.matrix.errors import UnknownRoomVersionError

__all__ = [
    "StateResAlgorithm",
    "EventIdFormat",
    "Redaction",
    "RoomVersion",
    "ROOM_VERSIONS",
    "DEFAULT_ROOM_VERSION",
    "room_version",
]


class StateResAlgorithm(enum.Enum):
    """Which state resolution algorithm a room version uses."""

    V1 = "v1"
    V2 = "v2"
    #: v2 with the conflicted state subgraph and an empty starting state.
    V2_1 = "v2.1"


class EventIdFormat(enum.Enum):
    """How a room version's event IDs are made."""

    #: ``$opaque_id:server`` chosen by the sending server (versions 1 and 2).
    SERVER_CHOSEN = "server"
    #: ``$`` + the reference hash in unpadded Base64 (version 3).
    REFERENCE_HASH_BASE64 = "base64"
    #: ``$`` + the reference hash in URL-safe unpadded Base64 (versions 4 on).
    REFERENCE_HASH_URLSAFE = "urlsafe"


@dataclasses.dataclass(frozen=True)
class Redaction:
    """What the redaction algorithm of a room version keeps."""

    #: The top-level keys kept.
    top_level: frozenset[str]
    #: Per event type, the content keys kept (None: every key); other types keep none.
    content: Mapping[str, frozenset[str] | None]
    #: Per event type, content keys whose object value keeps only these keys.
    nested: Mapping[str, Mapping[str, frozenset[str]]]


#: The top-level keys redaction keeps in room versions 1 to 10.
_TOP_LEVEL_V1 = frozenset({
    "event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "signatures",
    "depth", "prev_events", "prev_state", "auth_events", "origin", "origin_server_ts",
    "membership"})
#: Version 11 no longer keeps ``origin``, ``membership`` nor ``prev_state``.
_TOP_LEVEL_V11 = _TOP_LEVEL_V1 - {"origin", "membership", "prev_state"}
_POWER_LEVELS_V1 = frozenset({"ban", "events", "events_default", "kick", "redact",
                              "state_default", "users", "users_default"})


def _redaction(n: int) -> Redaction:
    """Version *n*'s redaction rules: version 1's, with each later version's change."""
    member = {"membership"} | ({"join_authorised_via_users_server"} if n >= 9 else set())
    content: dict[str, frozenset[str] | None] = {
        "m.room.member": frozenset(member),
        "m.room.create": None if n >= 11 else frozenset({"creator"}),
        "m.room.join_rules": frozenset({"join_rule", "allow"} if n >= 8 else {"join_rule"}),
        "m.room.power_levels": _POWER_LEVELS_V1 | ({"invite"} if n >= 11 else set()),
        "m.room.history_visibility": frozenset({"history_visibility"}),
    }
    if n <= 5:
        content["m.room.aliases"] = frozenset({"aliases"})
    if n >= 11:
        content["m.room.redaction"] = frozenset({"redacts"})
    nested = {"m.room.member": MappingProxyType({"third_party_invite": frozenset({"signed"})})} \
        if n >= 11 else {}
    return Redaction(_TOP_LEVEL_V11 if n >= 11 else _TOP_LEVEL_V1,
                     MappingProxyType(content), MappingProxyType(nested))


@dataclasses.dataclass(frozen=True)
class RoomVersion:
    """One room version's rules."""

    identifier: str
    state_res: StateResAlgorithm
    #: Event IDs carry the server name (``$id:server``) in versions 1 and 2 only;
    #: from version 3 on they are hashes and ``prev_events``/``auth_events`` are plain IDs.
    event_ids_have_domain: bool
    #: ``m.room.aliases`` has its own authorization rule (versions 1 to 5).
    special_case_aliases_auth: bool
    #: Floats and integers outside ±(2**53 - 1) are invalid (version 6 on).
    strict_canonical_json: bool
    #: Changing ``notifications`` in power levels needs power (version 6 on).
    limit_notifications_power_levels: bool
    #: ``knock`` membership and join rule (version 7 on).
    knock: bool
    #: ``restricted`` join rule with ``join_authorised_via_users_server`` (version 8 on).
    restricted_join_rule: bool
    #: Redaction keeps ``join_authorised_via_users_server`` (version 9 on).
    restricted_join_rule_redaction_fix: bool
    #: ``knock_restricted`` join rule (version 10 on).
    knock_restricted_join_rule: bool
    #: Power level values must be JSON integers (version 10 on).
    integer_power_levels: bool
    #: The create event's sender is the creator; ``content.creator`` is gone (version 11 on).
    implicit_room_creator: bool
    #: Version 11's redaction algorithm.
    updated_redaction_rules: bool
    #: Creators (create sender plus ``additional_creators``) have infinite power and
    #: may not appear in power levels (version 12).
    creator_power: bool
    #: The room ID is ``!`` + the create event's ID without ``$``; the create event has
    #: no ``room_id`` and other events do not list it in ``auth_events`` (version 12).
    room_id_from_create_event: bool
    #: What redaction keeps.
    redaction: Redaction
    #: How event IDs are made; ``prev_events`` and ``auth_events`` list
    #: ``[event_id, {hashes}]`` pairs where the server chooses IDs, plain IDs otherwise.
    event_id_format: EventIdFormat

    @property
    def redaction_needs_same_domain(self) -> bool:
        """Versions 1 and 2: a redaction by a user without redact power passes only
        when it targets an event from the redacting event's own server."""
        return self.event_ids_have_domain


def _v(identifier: str, n: int) -> RoomVersion:
    return RoomVersion(
        identifier=identifier,
        state_res=(StateResAlgorithm.V1 if n == 1 else
                   StateResAlgorithm.V2_1 if n >= 12 else StateResAlgorithm.V2),
        event_ids_have_domain=n <= 2,
        special_case_aliases_auth=n <= 5,
        strict_canonical_json=n >= 6,
        limit_notifications_power_levels=n >= 6,
        knock=n >= 7,
        restricted_join_rule=n >= 8,
        restricted_join_rule_redaction_fix=n >= 9,
        knock_restricted_join_rule=n >= 10,
        integer_power_levels=n >= 10,
        implicit_room_creator=n >= 11,
        updated_redaction_rules=n >= 11,
        creator_power=n >= 12,
        room_id_from_create_event=n >= 12,
        redaction=_redaction(n),
        event_id_format=(EventIdFormat.SERVER_CHOSEN if n <= 2 else
                         EventIdFormat.REFERENCE_HASH_BASE64 if n == 3 else
                         EventIdFormat.REFERENCE_HASH_URLSAFE),
    )


#: Every room version streamrep implements, by identifier.
ROOM_VERSIONS: dict[str, RoomVersion] = {str(n): _v(str(n), n) for n in range(1, 13)}

#: The version of a room whose create event names none.
DEFAULT_ROOM_VERSION = "1"


def room_version(identifier: object) -> RoomVersion:
    """The :class:`RoomVersion` for *identifier*; raise
    :class:`~streamrep.matrix.errors.UnknownRoomVersionError` for anything else."""
    if isinstance(identifier, str):
        found = ROOM_VERSIONS.get(identifier)
        if found is not None:
            return found
    raise UnknownRoomVersionError(
        f"unknown room version {identifier!r}: streamrep implements versions "
        f"{', '.join(ROOM_VERSIONS)}"
    )

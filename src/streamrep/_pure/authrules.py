"""The Matrix authorization rules against a state (pure twin).

Same API and results as the compiled ``streamrep._core.authrules``. The rules read
events and room versions by attribute (``streamrep.matrix.events.MatrixEvent`` and
``streamrep.matrix.room_versions.RoomVersion`` are what they get); a :class:`Rules`
holds one room version's switches. A check answers ``None`` when the rules allow
the event, else ``(reason, detail)``: the value of a
``streamrep.matrix.errors.RejectionReason`` and one line saying why.

What lives here:

* :meth:`Rules.auth_types` - the keys whose events may authorize an event (the
  specification's auth event selection);
* :meth:`Rules.check` - every rule against a state, but the create event's own
  (which needs the list of known room versions; ``streamrep.matrix.auth`` has it)
  and the third-party invite's signature (checked by the *third_party_ok* callable
  given to the :class:`Rules`);
* the power levels readers (:meth:`Rules.user_level`, ...);
* :meth:`Rules.check_in_order` - the iterative auth checks of state resolution v2.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Container, Mapping
from typing import Any, Callable, Iterable, Protocol, Sequence

__all__ = ["CREATOR_POWER_LEVEL", "Rules", "domain_of", "held_events", "is_user_id",
           "parse_level"]

StateKey = tuple[str, str]

#: Version 12 creators' level: above every level canonical JSON can express.
CREATOR_POWER_LEVEL = 2**53

_CREATE = "m.room.create"
_MEMBER = "m.room.member"
_POWER_LEVELS = "m.room.power_levels"
_THIRD_PARTY_INVITE = "m.room.third_party_invite"
#: The types whose events with an empty state key are power events.
_POWER_TYPES = frozenset({_POWER_LEVELS, _CREATE, "m.room.join_rules"})
_ALIASES = "m.room.aliases"
_REDACTION = "m.room.redaction"
_CREATE_KEY = (_CREATE, "")
_POWER_LEVELS_KEY = (_POWER_LEVELS, "")
_JOIN_RULES_KEY = ("m.room.join_rules", "")

_LEVEL_KEYS = ("users_default", "events_default", "state_default", "ban", "redact", "kick",
               "invite")
_MAX_ID_LENGTH = 255
_MAX_DIGITS = 40
_INT_STRING = re.compile(r"\s*[+-]?[0-9]+\s*\Z")
_NO_LEVELS: Mapping[str, Any] = {}
_ABSENT = object()

Rejection = tuple[str, str]


class Event(Protocol):
    """What the rules read of an event."""

    @property
    def event_id(self) -> str: ...
    @property
    def room_id(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def sender(self) -> str: ...
    @property
    def state_key(self) -> str | None: ...
    @property
    def content(self) -> Mapping[str, Any]: ...
    @property
    def prev_events(self) -> tuple[str, ...]: ...
    @property
    def redacts(self) -> str | None: ...
    @property
    def auth_ids(self) -> tuple[str, ...]: ...
    @property
    def key(self) -> StateKey: ...
    @property
    def membership(self) -> str | None: ...
    @property
    def origin_server_ts(self) -> int: ...


class Version(Protocol):
    """The room version switches the rules read."""

    @property
    def special_case_aliases_auth(self) -> bool: ...
    @property
    def limit_notifications_power_levels(self) -> bool: ...
    @property
    def knock(self) -> bool: ...
    @property
    def restricted_join_rule(self) -> bool: ...
    @property
    def knock_restricted_join_rule(self) -> bool: ...
    @property
    def integer_power_levels(self) -> bool: ...
    @property
    def implicit_room_creator(self) -> bool: ...
    @property
    def creator_power(self) -> bool: ...
    @property
    def redaction_needs_same_domain(self) -> bool: ...


State = Mapping[StateKey, Event]


def domain_of(identifier: str) -> str:
    """The server name of a user, room (versions 1-11) or event (versions 1-2) ID."""
    _, sep, domain = identifier.partition(":")
    return domain if sep else ""


def is_user_id(value: object) -> bool:
    """True for a string shaped as a user ID of at most 255 bytes."""
    if not isinstance(value, str) or not value.startswith("@") or value.find(":", 2) < 0:
        return False
    # An ASCII string is as long in UTF-8 (and has nothing to fail encoding).
    return len(value if value.isascii() else value.encode()) <= _MAX_ID_LENGTH


def parse_level(value: object, integers_only: bool = False) -> int | None:
    """*value* as a power level, or None when it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if integers_only:
        return None
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        return int(value)
    if isinstance(value, str) and len(value) <= _MAX_DIGITS and _INT_STRING.match(value):
        return int(value)
    return None


def held_events(events: Mapping[str, Event], event_ids: Iterable[str], room_id: str
                ) -> tuple[set[str], list[str], str | None]:
    """``(held, power, foreign)``: the IDs of *event_ids* that *events* holds, those of
    the power events among them (power levels, join rules, create, or a kick or ban
    of another user) in the order *event_ids* gives, and the ID of the first held
    event of another room than *room_id* (None when there is none; the set and the
    list end before it). The compiled core also asks the processor for the events
    ahead of the resolution that reads them one by one; Python has no way to."""
    held: set[str] = set()
    power: list[str] = []
    get = events.get
    for event_id in event_ids:
        event = get(event_id)
        if event is None:
            continue
        if event.room_id != room_id:
            return held, power, event_id
        held.add(event_id)
        etype, state_key = event.type, event.state_key
        if (state_key == "" and etype in _POWER_TYPES) or (
                etype == _MEMBER and event.membership in ("leave", "ban")
                and event.sender != state_key):
            power.append(event_id)
    return held, power, None


def _third_party_token(event: Event) -> str | None:
    tpi = event.content.get("third_party_invite")
    if tpi is not None and isinstance(tpi, Mapping):
        signed = tpi.get("signed")
        if isinstance(signed, Mapping) and isinstance(signed.get("token"), str):
            return str(signed["token"])
    return None


def _membership(state: State, user_id: str) -> str | None:
    member = state.get((_MEMBER, user_id))
    return member.membership if member is not None else None


def _same_value(a: object, b: object) -> bool:
    """Identical JSON values of one type (``True == 1``, but they read differently)."""
    return a is b or (type(a) is type(b) and a == b)


def _read(content: Mapping[str, Any], group: str | None, name: str) -> int | None:
    where = content.get(group, {}) if group else content
    if not isinstance(where, Mapping) or name not in where:
        return None
    return parse_level(where[name], False)


def _changed_names(old: Mapping[str, Any], new: Mapping[str, Any], group_name: str) -> list[str]:
    """The names of a power levels group whose level may differ between *old* and *new*."""
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
    return sorted(names)


class Rules:
    """The authorization rules of one room version.

    *third_party_ok(event, state)* answers whether an invite's ``third_party_invite``
    verifies against *state* (its signature check lives with the caller).
    """

    def __init__(self, version: Version, third_party_ok: Callable[[Event, State], bool]) -> None:
        self._version = version
        self._third_party_ok = third_party_ok
        self._restricted = bool(version.restricted_join_rule)
        self._knock_restricted = bool(version.knock_restricted_join_rule)
        self._knock = bool(version.knock)
        self._aliases = bool(version.special_case_aliases_auth)
        self._integers = bool(version.integer_power_levels)
        self._implicit_creator = bool(version.implicit_room_creator)
        self._creator_power = bool(version.creator_power)
        self._notifications = bool(version.limit_notifications_power_levels)
        self._redaction_domain = bool(version.redaction_needs_same_domain)

    # --- auth event selection ---------------------------------------------------

    def auth_types(self, event: Event) -> set[StateKey]:
        """The state keys whose events may authorize *event*."""
        if event.type == _CREATE and event.state_key == "":
            return set()
        keys = {_POWER_LEVELS_KEY, (_MEMBER, event.sender), _CREATE_KEY}
        if event.type == _MEMBER and event.state_key is not None:
            membership = event.membership
            if membership in ("join", "invite", "knock"):
                keys.add(_JOIN_RULES_KEY)
            keys.add((_MEMBER, event.state_key))
            if membership == "invite":
                token = _third_party_token(event)
                if token is not None:
                    keys.add((_THIRD_PARTY_INVITE, token))
            if self._restricted and membership == "join":
                via = event.content.get("join_authorised_via_users_server")
                if isinstance(via, str):
                    keys.add((_MEMBER, via))
        return keys

    # --- power levels -------------------------------------------------------------

    def creators(self, create: Event) -> frozenset[str]:
        """The room's creators: the create event's sender (``content.creator``
        before version 11), plus ``additional_creators`` from version 12."""
        if self._implicit_creator:
            found = {create.sender}
        else:
            creator = create.content.get("creator")
            found = {creator} if isinstance(creator, str) else set()
        if self._creator_power:
            extra = create.content.get("additional_creators")
            if isinstance(extra, list):
                found.update(x for x in extra if isinstance(x, str))
        return frozenset(found)

    def is_creator(self, user_id: str, create: Event) -> bool:
        """True when *user_id* is one of the room's creators."""
        if self._implicit_creator:
            if user_id == create.sender:
                return True
        elif user_id == create.content.get("creator"):
            return True
        if self._creator_power:
            extra = create.content.get("additional_creators")
            # A JSON value other than a string never equals a user ID.
            return isinstance(extra, list) and user_id in extra
        return False

    def user_level(self, user_id: str, state: State) -> int:
        """*user_id*'s power level in *state*."""
        create = state.get(_CREATE_KEY)
        if self._creator_power and create is not None and self.is_creator(user_id, create):
            return CREATOR_POWER_LEVEL
        levels = state.get(_POWER_LEVELS_KEY)
        if levels is not None:
            content = levels.content
            users = content.get("users")
            if isinstance(users, Mapping) and user_id in users:
                level = parse_level(users[user_id])
                if level is not None:
                    return level
            level = parse_level(content.get("users_default"))
            return level if level is not None else 0
        if create is not None and create.type == _CREATE and self.is_creator(user_id, create):
            return 100
        return 0

    def named_level(self, state: State, name: str, default: int) -> int:
        """The level ``content[name]`` of the power levels in *state* (``ban``, ...)."""
        levels = state.get(_POWER_LEVELS_KEY)
        if levels is None:
            return default
        level = parse_level(levels.content.get(name))
        return level if level is not None else default

    def send_level(self, event_type: str, is_state: bool, state: State) -> int:
        """The level needed to send an event of *event_type* (without a power levels
        event: 50 for state events, 0 for others, as the reference reads the rules)."""
        levels = state.get(_POWER_LEVELS_KEY)
        content: Mapping[str, Any] = levels.content if levels is not None else _NO_LEVELS
        events = content.get("events")
        if isinstance(events, Mapping) and event_type in events:
            level = parse_level(events[event_type])
            if level is not None:
                return level
        if is_state:
            level = parse_level(content.get("state_default"))
            return level if level is not None else 50
        level = parse_level(content.get("events_default"))
        return level if level is not None else 0

    # --- the rules against a state ----------------------------------------------

    def check(self, event: Event, state: State) -> Rejection | None:
        """Check *event* (not a create event) against *state*."""
        create = state.get(_CREATE_KEY)
        if create is None:
            return ("no_create_event", "no create event in the room state")
        if create.content.get("m.federate", True) is not True and (
                domain_of(event.sender) != domain_of(create.sender)):
            return ("not_federated", "the room does not federate")
        etype = event.type
        if etype == _ALIASES and self._aliases:
            if not event.state_key:
                return ("bad_aliases", "an aliases event needs a state_key")
            if event.state_key != domain_of(event.sender):
                return ("bad_aliases", "aliases state_key is not the sender's server")
            return None
        if etype == _MEMBER:
            return self._check_membership(event, state, create)
        if _membership(state, event.sender) != "join":
            return ("not_in_room", f"{event.sender} is not joined to the room")
        sender_level = self.user_level(event.sender, state)
        if etype == _THIRD_PARTY_INVITE:
            if sender_level < self.named_level(state, "invite", 0):
                return ("insufficient_power", "sender may not invite")
            return None
        needed = self.send_level(etype, event.state_key is not None, state)
        if sender_level < needed:
            return ("insufficient_power",
                    f"sending {etype} needs level {needed}, sender has {sender_level}")
        state_key = event.state_key
        if state_key is not None and state_key.startswith("@") and state_key != event.sender:
            return ("others_state", "state keyed by another user's ID")
        if etype == _POWER_LEVELS and state_key == "":
            return self._check_power_levels(event, state, create, sender_level)
        if etype == _REDACTION and self._redaction_domain:
            if sender_level < self.named_level(state, "redact", 50):
                target = event.redacts
                # Without a target there is nothing to protect (the reference lets it pass).
                if target is not None and domain_of(target) != domain_of(event.event_id):
                    return ("insufficient_power", "sender may not redact that event")
        return None

    def _check_join(self, event: Event, state: State, create: Event, sender_ms: str | None,
                    join_rule: Any) -> Rejection | None:
        """The membership rules of a join (*sender_ms*: the sender's membership now)."""
        target = event.state_key
        # The creator's own join right after the create event.
        if len(event.prev_events) == 1 and event.prev_events[0] == create.event_id:
            first = create.sender if self._implicit_creator else create.content.get("creator")
            if first == target:
                return None
        if event.sender != target:
            return ("membership_forbidden", "cannot join on behalf of another user")
        if sender_ms == "ban":
            return ("membership_forbidden", "sender is banned")
        if join_rule == "public":
            return None
        if ((self._restricted and join_rule == "restricted")
                or (self._knock_restricted and join_rule == "knock_restricted")):
            if sender_ms in ("join", "invite"):
                return None
            via = event.content.get("join_authorised_via_users_server")
            if not isinstance(via, str):
                return ("membership_forbidden",
                        "restricted join without join_authorised_via_users_server")
            if _membership(state, via) != "join":
                return ("membership_forbidden", f"authorising user {via} is not joined")
            if self.user_level(via, state) < self.named_level(state, "invite", 0):
                return ("membership_forbidden", f"authorising user {via} may not invite")
            return None
        if join_rule == "invite" or (self._knock and join_rule == "knock"):
            if sender_ms in ("join", "invite"):
                return None
            return ("membership_forbidden", "the room is invite-only")
        return ("membership_forbidden", f"join rule {join_rule!r} forbids joining")

    def _check_membership(self, event: Event, state: State, create: Event) -> Rejection | None:
        target = event.state_key
        membership = event.membership
        if target is None or membership is None:
            return ("malformed", "membership event without state_key or membership")
        # As the reference reads the rules, an unfederated room also refuses memberships
        # of users on other servers, whoever sends them.
        if create.content.get("m.federate", True) is not True and (
                domain_of(target) != domain_of(create.sender)):
            return ("not_federated", "the room does not federate")
        sender = event.sender
        sender_ms = _membership(state, sender)
        join_rules = state.get(_JOIN_RULES_KEY)
        join_rule = join_rules.content.get("join_rule", "invite") if join_rules else "invite"
        if membership == "join":
            return self._check_join(event, state, create, sender_ms, join_rule)
        target_ms = _membership(state, target)
        if membership == "invite":
            if "third_party_invite" in event.content:
                if target_ms == "ban":
                    return ("membership_forbidden", f"{target} is banned")
                if not self._third_party_ok(event, state):
                    return ("membership_forbidden", "third-party invite does not verify")
                return None
            if sender_ms != "join":
                return ("not_in_room", f"{sender} is not joined to the room")
            if target_ms in ("join", "ban"):
                return ("membership_forbidden", f"{target}'s membership is {target_ms}")
            if self.user_level(sender, state) < self.named_level(state, "invite", 0):
                return ("insufficient_power", "sender may not invite")
            return None
        if membership == "leave" and sender == target:
            allowed = ("join", "invite", "knock") if self._knock else ("join", "invite")
            if sender_ms in allowed:
                return None
            return ("membership_forbidden", f"{target} cannot leave from {sender_ms}")
        if membership in ("leave", "ban"):
            if sender_ms != "join":
                return ("not_in_room", f"{sender} is not joined to the room")
            sender_level = self.user_level(sender, state)
            ban_level = self.named_level(state, "ban", 50)
            if membership == "ban":
                if sender_level >= ban_level and self.user_level(target, state) < sender_level:
                    return None
                return ("insufficient_power", f"sender may not ban {target}")
            if target_ms == "ban" and sender_level < ban_level:
                return ("insufficient_power", "sender may not unban")
            if sender_level >= self.named_level(state, "kick", 50) and (
                    self.user_level(target, state) < sender_level):
                return None
            return ("insufficient_power", f"sender may not kick {target}")
        if membership == "knock" and self._knock:
            if join_rule != "knock" and not (self._knock_restricted
                                             and join_rule == "knock_restricted"):
                return ("membership_forbidden", f"join rule {join_rule!r} forbids knocking")
            if sender != target:
                return ("membership_forbidden", "cannot knock on behalf of another user")
            if sender_ms in ("ban", "invite", "join"):
                return ("membership_forbidden", f"cannot knock while {sender_ms}")
            return None
        return ("membership_forbidden", f"unknown membership {membership!r}")

    def _new_levels_shape(self, new: Mapping[str, Any], create: Event) -> Rejection | None:
        """The rules on the new power levels content alone."""
        ints_only = self._integers
        for name in _LEVEL_KEYS:
            if name in new and parse_level(new[name], ints_only) is None:
                return ("bad_power_levels", f"{name} must be an integer")
        for group in ("events", "notifications", "users"):
            if group in new:
                values = new[group]
                if not isinstance(values, Mapping) or not all(
                        type(v) is int or parse_level(v, ints_only) is not None
                        for v in values.values()):
                    return ("bad_power_levels", f"{group} must map to integer levels")
        users = new.get("users", {})
        for user in users:
            if not is_user_id(user):
                return ("bad_power_levels", f"{user!r} is not a user ID")
        if self._creator_power:
            named = self.creators(create).intersection(users)
            if named:
                return ("bad_power_levels",
                        f"creators may not be listed in users: {sorted(named)}")
        return None

    def _check_power_levels(self, event: Event, state: State, create: Event,
                            sender_level: int) -> Rejection | None:
        new = event.content
        found = self._new_levels_shape(new, create)
        if found is not None:
            return found
        previous = state.get(_POWER_LEVELS_KEY)
        if previous is None:
            return None
        old = previous.content
        checks: list[tuple[str | None, str]] = [(None, name) for name in _LEVEL_KEYS]
        groups = ["users", "events"] + (["notifications"] if self._notifications else [])
        for group_name in groups:
            checks.extend((group_name, name) for name in _changed_names(old, new, group_name))
        for where, name in checks:
            if where is None and _same_value(old.get(name, _ABSENT), new.get(name, _ABSENT)):
                continue
            old_level = _read(old, where, name)
            new_level = _read(new, where, name)
            if old_level == new_level:
                continue
            if where == "users" and name != event.sender and old_level == sender_level:
                return ("insufficient_power",
                        f"sender may not change {name}'s level, equal to its own")
            if (old_level is not None and old_level > sender_level) or (
                    new_level is not None and new_level > sender_level):
                label = f"{where}.{name}" if where else name
                return ("insufficient_power",
                        f"sender may not change {label} beyond its own level")
        return None

    # --- state resolution -----------------------------------------------------------

    def _auth_sender_level(self, event: Event, events: Mapping[str, Event],
                           fetch: Callable[[str], Event | None] | None) -> tuple[int, bool]:
        """The sender's level by the event's own auth events, rejected ones included
        (0 when they hold no create event, unless the event is one), and whether
        every auth event was found."""
        create = levels = None
        complete = True
        for aid in event.auth_ids:
            auth_event = events.get(aid)
            if auth_event is None and fetch is not None:
                auth_event = fetch(aid)
            if auth_event is None:
                complete = False
                continue
            if auth_event.state_key is None:
                continue
            key = auth_event.key
            if key == _CREATE_KEY:
                create = auth_event
            elif key == _POWER_LEVELS_KEY:
                levels = auth_event
        if create is None and event.type != _CREATE:
            return 0, complete
        state: dict[StateKey, Event] = {}
        if create is not None:
            state[_CREATE_KEY] = create
        if levels is not None:
            state[_POWER_LEVELS_KEY] = levels
        return self.user_level(event.sender, state), complete

    def sender_levels(self, event_ids: Sequence[str], events: Mapping[str, Event],
                      memo: dict[str, int],
                      fetch: Callable[[str], Event | None] | None = None) -> dict[str, int]:
        """Each event's sender's power level by its own auth events, rejected ones
        included (0 when they hold no create event, unless the event is one).

        *memo* keeps the levels by event ID and is read first; an auth event not in
        *events* is asked of *fetch* (when given). Without *fetch*, the level of an
        event with an auth event not found is not kept.
        """
        out: dict[str, int] = {}
        for eid in event_ids:
            found = memo.get(eid)
            if found is None:
                found, complete = self._auth_sender_level(events[eid], events, fetch)
                if complete or fetch is not None:
                    memo[eid] = found
            out[eid] = found
        return out

    def power_order(self, event_ids: Sequence[str] | set[str], full: Container[str],
                    events: Mapping[str, Event], memo: dict[str, int],
                    fetch: Callable[[str], Event | None] | None = None) -> list[str]:
        """*event_ids* and their auth ancestors within *full* (keys of *events*), auth
        events first (Kahn's algorithm), ties by (-sender level, origin_server_ts,
        event ID): state resolution v2's reverse topological power ordering. The
        levels are :meth:`sender_levels` (*memo*, *fetch*)."""
        auth_edges: dict[str, list[str]] = {}
        stack = list(event_ids)
        while stack:
            eid = stack.pop()
            if eid in auth_edges:
                continue
            edges = [a for a in events[eid].auth_ids if a in full]
            auth_edges[eid] = edges
            stack.extend(edges)
        levels = self.sender_levels(list(auth_edges), events, memo, fetch)
        children: dict[str, list[str]] = {eid: [] for eid in auth_edges}
        waiting: dict[str, int] = {}
        ready: list[tuple[int, int, str]] = []
        for eid, edges in auth_edges.items():
            if edges:
                # An event may list an auth event twice; count each edge once.
                unique = set(edges)
                waiting[eid] = len(unique)
                for a in unique:
                    children[a].append(eid)
            else:
                ready.append((-levels[eid], events[eid].origin_server_ts, eid))
        heapq.heapify(ready)
        out: list[str] = []
        while ready:
            eid = heapq.heappop(ready)[2]
            out.append(eid)
            for child in children[eid]:
                left = waiting[child] - 1
                waiting[child] = left
                if not left:
                    heapq.heappush(ready, (-levels[child], events[child].origin_server_ts,
                                           child))
        return out

    def _power_levels_parent(self, event_id: str, events: Mapping[str, Event],
                             memo: dict[str, str | None],
                             fetch: Callable[[str], Event | None] | None) -> str | None:
        if event_id in memo:
            return memo[event_id]
        found = None
        complete = True
        event = events.get(event_id)
        if event is None and fetch is not None:
            event = fetch(event_id)
        if event is None:
            return None
        for aid in event.auth_ids:
            auth_event = events.get(aid)
            if auth_event is None and fetch is not None:
                auth_event = fetch(aid)
            if auth_event is None:
                complete = False
            elif auth_event.key == _POWER_LEVELS_KEY:
                found = aid
                break
        if complete or fetch is not None:
            memo[event_id] = found
        return found

    def mainline_order(self, event_ids: Sequence[str], power_levels_id: str | None,
                       events: Mapping[str, Event], memo: dict[str, str | None],
                       fetch: Callable[[str], Event | None] | None = None) -> list[str]:
        """*event_ids* (keys of *events*) by (mainline position, origin_server_ts,
        event ID): state resolution v2's mainline ordering.

        The mainline is *power_levels_id* and its chain of power levels parents (the
        power levels event among an event's auth events), numbered from its oldest,
        1 up; an event's position is that of the first mainline event on its own
        chain of power levels parents, 0 when there is none. The parents are kept in
        *memo* by event ID; an event not in *events* is asked of *fetch* (when given),
        and without *fetch* a parent found while some auth event was not is not kept.
        """
        mainline: list[str] = []
        current = power_levels_id
        while current is not None and (
                current in events or (fetch is not None and fetch(current) is not None)):
            mainline.append(current)
            current = self._power_levels_parent(current, events, memo, fetch)
        position = {eid: i + 1 for i, eid in enumerate(reversed(mainline))}
        keyed: list[tuple[int, int, str]] = []
        for eid in event_ids:
            found = position.get(eid)
            if found is None:
                walked: list[str] = []
                found = 0
                current = eid
                while current is not None:
                    at = position.get(current)
                    if at is not None:
                        found = at
                        break
                    walked.append(current)
                    current = self._power_levels_parent(current, events, memo, fetch)
                for w in walked:
                    position[w] = found
            keyed.append((found, events[eid].origin_server_ts, eid))
        keyed.sort()
        return [eid for _, _, eid in keyed]

    def check_in_order(self, order: Sequence[str], events: Mapping[str, Event],
                       resolved: dict[StateKey, str], base: Mapping[StateKey, str] | None,
                       hidden: Container[StateKey], rejected: Container[str],
                       check_create: Callable[[Event], bool],
                       fetch: Callable[[str], Event | None] | None = None) -> None:
        """Apply the state events of *order* not *rejected* to the partial state
        *resolved* (the iterative auth checks of state resolution v2).

        Each event is checked against the state its auth events define (those not
        *rejected*; a later one of a key replaces an earlier one) overlaid, for its
        :meth:`auth_types`, with the partial state: *resolved*, else *base* for keys
        not in *hidden*; an event there that is *rejected* is left out. An event not
        in *events* is asked of *fetch* (when given) and left out when not found. An
        event that passes goes into *resolved* under its key. *check_create* checks
        a create event.
        """
        for eid in order:
            event = events[eid]
            if event.state_key is None or eid in rejected:
                continue
            if event.type == _CREATE and event.state_key == "":
                if check_create(event):
                    resolved[event.key] = eid
                continue
            state: dict[StateKey, Event] = {}
            for aid in event.auth_ids:
                auth_event = events.get(aid)
                if auth_event is None and fetch is not None:
                    auth_event = fetch(aid)
                if auth_event is not None and auth_event.state_key is not None and (
                        aid not in rejected):
                    state[auth_event.key] = auth_event
            for key in self.auth_types(event):
                held = resolved.get(key)
                if held is None:
                    if base is None or key in hidden:
                        continue
                    held = base.get(key)
                    if held is None:
                        continue
                if held in rejected:
                    continue
                held_event = events.get(held)
                if held_event is None:
                    held_event = fetch(held) if fetch is not None else None
                    if held_event is None:
                        continue
                state[key] = held_event
            if self.check(event, state) is None:
                resolved[event.key] = eid

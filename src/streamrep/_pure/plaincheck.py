"""The plain events of a batch under the Matrix room rules (pure twin of
``streamrep._core.plaincheck``).

A *plain* event is one whose authorization reads only its type, its sender and its
auth events: not a state event, nor one of the types the caller names. Of a batch's
records (as the event store's validation made them: type, sender and room ID are
non-empty strings), :func:`usual_plain_auth_ids` finds the plain ones whose fields
have exactly the JSON types a Matrix event parser reads, so they need no parsing to
be checked; :func:`settled_until` walks the batch while the verdicts an earlier
event worked out settle each record.
"""

from __future__ import annotations

from typing import Any

__all__ = ["usual_plain_auth_ids", "settled_until"]

_STR_ONLY = frozenset({str})


def usual_plain_auth_ids(records: list[Any], room_id: str, create_id: str | None,
                         not_plain: frozenset[str]) -> dict[str, tuple[str, ...]]:
    """Event ID -> auth event IDs of the records of room *room_id* that are plain
    (no state key, type not in *not_plain*) and of the usual shape: ``auth_events``
    and ``prev_events`` lists of event IDs, ``origin_server_ts`` an integer or
    absent, the event ID starting with ``$`` and the sender a user ID. *create_id*
    (room version 12: the create event the room ID names) is put first among the
    auth event IDs when the event does not list it."""
    out: dict[str, tuple[str, ...]] = {}
    if not room_id.startswith("!"):
        return out
    senders: set[str] = set()  # the senders already seen to be user IDs
    for r in records:
        if r.state_key is not None or r.type in not_plain:
            continue
        body = r.body
        listed = body.get("auth_events")
        prevs = body.get("prev_events")
        ts = body.get("origin_server_ts")
        if not (type(listed) is list and _STR_ONLY.issuperset(map(type, listed))
                and "" not in listed and type(prevs) is list
                and _STR_ONLY.issuperset(map(type, prevs))
                and (ts is None or type(ts) is int) and r.event_id.startswith("$")):
            continue
        sender = r.sender
        if sender not in senders:
            if not sender.startswith("@") or ":" not in sender:
                continue
            senders.add(sender)
        ids = tuple(listed)
        if create_id is not None and create_id not in ids:
            ids = (create_id,) + ids
        out[r.event_id] = ids
    return out


def settled_until(records: list[Any], start: int, plain: dict[str, tuple[str, ...]],
                  passed: dict[tuple[tuple[str, ...], str, str], Any],
                  verdicts: dict[tuple[str, str], bool] | None) -> int:
    """The index of the first record from *start* that the memos do not settle
    (``len(records)`` when they settle all): a record is settled when it is in
    *plain*, is not flagged rejected, its ``(auth event IDs, sender, type)`` is in
    *passed* and, unless *verdicts* is None or it is an outlier, *verdicts* holds
    False (passes against the current state) for its ``(sender, type)``."""
    if start < 0:
        raise ValueError(f"start must not be negative, not {start}")
    for i in range(start, len(records)):
        r = records[i]
        ids = plain.get(r.event_id)
        if ids is None or r.rejected or (ids, r.sender, r.type) not in passed:
            return i
        if verdicts is not None and not r.outlier and verdicts.get((r.sender, r.type)) is not False:
            return i
    return len(records)

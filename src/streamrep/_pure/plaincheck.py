"""The plain events of a batch under the Matrix room rules (pure twin of
``streamrep._core.plaincheck``).

A *plain* event is one whose authorization reads only its type, its sender and its
auth events: not a state event, nor one of the types the caller names. Of a batch's
records (as the event store's validation made them: type, sender and room ID are
non-empty strings), :func:`scan_batch` finds the plain ones whose fields have
exactly the JSON types a Matrix event parser reads, so they need no parsing to be
checked, and in the same pass what else the checks ask of the batch;
:func:`settled_until` walks the batch while the verdicts an earlier event worked
out settle each record.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BatchScan", "scan_batch", "settled_until"]

_STR_ONLY = frozenset({str})


class BatchScan:
    """What one pass over a batch's records found (see :func:`scan_batch`)."""

    __slots__ = ("plain", "others", "senders", "member_targets", "has_outlier")

    def __init__(self) -> None:
        #: Event ID -> auth event IDs of the plain records of the usual shape.
        self.plain: dict[str, tuple[str, ...]] = {}
        #: The other records (the state records among them), in the order given.
        self.others: list[Any] = []
        #: The records' senders.
        self.senders: set[str] = set()
        #: State keys of the membership records.
        self.member_targets: set[str] = set()
        #: Whether any record is an outlier.
        self.has_outlier = False


def scan_batch(records: list[Any], room_id: str, create_id: str | None,
               not_plain: frozenset[str] | None, member_type: str) -> BatchScan:
    """One pass over the batch's *records* (as the event store's validation made
    them: type, sender and room ID are non-empty strings).

    ``plain`` holds the records of room *room_id* that are plain (no state key, type
    not in *not_plain*; none when *not_plain* is None) and of the usual shape:
    ``auth_events`` and ``prev_events`` lists of event IDs, ``origin_server_ts`` an
    integer or absent, the event ID starting with ``$`` and the sender a user ID.
    *create_id* (room version 12: the create event the room ID names) is put first
    among their auth event IDs; a record that lists it is not one of them. Records
    listing the same auth events as the record before them share its tuple."""
    scan = BatchScan()
    plain, others, senders = scan.plain, scan.others, scan.senders
    excluded = not_plain if not_plain is not None else frozenset()
    find_plain = not_plain is not None and room_id.startswith("!")
    user_ids: set[str] = set()  # the senders already seen to be user IDs
    last_listed: list[str] | None = None
    last_ids: tuple[str, ...] = ()
    for r in records:
        if r.outlier:
            scan.has_outlier = True
        sender = r.sender
        senders.add(sender)
        state_key = r.state_key
        if state_key is not None:
            if r.type == member_type:
                scan.member_targets.add(state_key)
            others.append(r)
            continue
        if not find_plain or r.type in excluded:
            others.append(r)
            continue
        body = r.body
        listed = body.get("auth_events")
        prevs = body.get("prev_events")
        ts = body.get("origin_server_ts")
        if not (type(listed) is list and _STR_ONLY.issuperset(map(type, listed))
                and "" not in listed and type(prevs) is list
                and _STR_ONLY.issuperset(map(type, prevs))
                and (ts is None or type(ts) is int) and r.event_id.startswith("$")):
            others.append(r)
            continue
        if sender not in user_ids:
            if not sender.startswith("@") or ":" not in sender:
                others.append(r)
                continue
            user_ids.add(sender)
        if create_id is not None and create_id in listed:
            others.append(r)  # listing it is forbidden: the full check says why
            continue
        if listed != last_listed:
            last_listed = listed
            last_ids = tuple(listed)
            if create_id is not None:
                last_ids = (create_id,) + last_ids
        plain[r.event_id] = last_ids
    return scan


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

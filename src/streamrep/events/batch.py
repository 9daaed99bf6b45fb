"""One batch being persisted: what the modules writing it share (:class:`Batch`)
and what it changes (:class:`PersistOutcome`), handed to the store once its
transaction has committed."""

from __future__ import annotations

from dataclasses import dataclass, field

from streamrep.db import Transaction
from streamrep.events.orderings import StreamAllocator
from streamrep.events.resolver import StateKey, StateResolver
from streamrep.events.state import GroupState, StateGroupStore
from streamrep.events.writes import Writes
from streamrep.lru import Lru
from streamrep.matrix.room_versions import RoomVersion
from streamrep.matrix.verdict import Rejection

__all__ = ["Batch", "BatchCaches", "PersistOutcome"]


@dataclass
class PersistOutcome:
    """What a committed batch changes in the in-memory caches and streams.

    Filled in while the batch is written; the store applies it to its caches only
    after the transaction has committed."""

    event_orderings: dict[str, int] = field(default_factory=dict)
    event_groups: dict[str, int] = field(default_factory=dict)
    # new group -> (its state, hops from the snapshot it is stored over)
    new_groups: dict[int, tuple[GroupState, int]] = field(default_factory=dict)
    # new group -> (the group whose state it changes, or None when it is not one
    # group's state changed; the keys it changes): a delta's parent and keys, or
    # for a snapshot the prev group it was made from
    group_parents: dict[int, tuple[int | None, tuple[StateKey, ...]]] = \
        field(default_factory=dict)
    forward: dict[str, frozenset[str]] = field(default_factory=dict)
    current_state: dict[str, GroupState] = field(default_factory=dict)
    # room -> users whose current membership changed
    current_state_changes: dict[str, set[str]] = field(default_factory=dict)
    visibility_values: dict[str, str] = field(default_factory=dict)
    room_positions: dict[str, int] = field(default_factory=dict)
    membership_positions: dict[str, int] = field(default_factory=dict)
    redacted: set[str] = field(default_factory=set)
    max_stream: int = 0
    max_live: int = 0
    persisted: list[str] = field(default_factory=list)
    #: each event the room rules (or the event ID check) rejected:
    #: ``"<reason>: <detail>"``
    rejected: dict[str, str] = field(default_factory=dict)
    #: each membership event -> the membership event it replaced in the state before it
    replaces_state: dict[str, str] = field(default_factory=dict)
    #: the rooms whose create event the batch stored, and their versions
    created_rooms: dict[str, RoomVersion] = field(default_factory=dict)
    #: events stored although their ID or content hash did not match (``warn``)
    unverified: dict[str, tuple[str, Rejection]] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchCaches:
    """The store's caches a batch reads (it never writes them: see
    :class:`PersistOutcome`)."""

    forward: Lru[str, frozenset[str]]
    current_state: Lru[str, GroupState]
    visibility: Lru[str, str]


@dataclass
class Batch:
    """What the steps of persisting one batch share: its transaction, the writes it
    queues, the store's state groups, resolver, allocator and caches, the orderings
    known so far and the outcome being filled in."""

    txn: Transaction
    writes: Writes
    states: StateGroupStore
    resolver: StateResolver
    allocator: StreamAllocator
    caches: BatchCaches
    out: PersistOutcome
    #: event_id -> (topological ordering, stream ordering): the batch's events, and
    #: stored events read when a conflict needs them
    orderings: dict[str, tuple[int, int]] = field(default_factory=dict)

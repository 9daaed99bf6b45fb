"""Typed API of streamrep._core.stateset (same as streamrep._pure.stateset)."""

from array import array
from typing import Hashable, Mapping, Sequence, TypeVar

__all__ = ["NumberMemo", "differing_events", "split_state_sets"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Hashable)

class NumberMemo:
    def __init__(self) -> None: ...

def split_state_sets(states: Sequence[Mapping[K, V]], numbers: Mapping[V, int] | None,
                     memo: NumberMemo | None = None,
                     ) -> tuple[set[K], array[int], list[V]]: ...

def differing_events(states: Sequence[Mapping[K, V]]) -> tuple[set[K], list[set[V]]]: ...

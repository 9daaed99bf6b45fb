"""Typed API of streamrep._core.stateset (same as streamrep._pure.stateset)."""

from array import array
from typing import Hashable, Mapping, Sequence, TypeVar

__all__ = ["split_state_sets"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V", bound=Hashable)

def split_state_sets(states: Sequence[Mapping[K, V]], numbers: Mapping[V, int],
                     ) -> tuple[set[K], array[int], list[V]]: ...

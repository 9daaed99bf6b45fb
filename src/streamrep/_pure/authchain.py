"""Auth chains over a room's auth DAG with dense integer event IDs (pure twin).

The caller interns event IDs into integers ``0..n-1`` and tells :class:`AuthGraph`
each event's auth events once (:meth:`AuthGraph.set_auth_events`). Then:

* :meth:`AuthGraph.auth_chain` - every event reachable from the given events along
  auth edges (the events themselves only when another one reaches them);
* :meth:`AuthGraph.auth_chain_difference` - the events that are in the full auth
  chain (the events plus their auth chains) of some, but not all, of several sets:
  the *auth difference* of state resolution v2;
* :meth:`AuthGraph.conflicted_subgraph` - the events that are both reachable from
  some given event and reach some given event along auth edges, the given events
  included: the *conflicted state subgraph* of state resolution v2.1;
* :meth:`AuthGraph.in_chain_of` - which of some events are in the full auth chain
  of an event a test takes, found by walking from them to the state events citing
  them: what of a set's auth chain the unconflicted state also holds, without
  walking the whole unconflicted state.

Results are ``array('q')`` in ascending order. An event never described has no auth
events. Same API and results as :mod:`streamrep._core.authchain`.
"""

from __future__ import annotations

from array import array
from typing import Any, Callable, Container, Iterable, Mapping, Sequence

__all__ = ["AuthGraph", "HeldBy"]

_MAX_NODE = 2**31 - 2


def _node(value: int) -> int:
    node = int(value)
    if node < 0 or node > _MAX_NODE:
        raise ValueError(f"event number {node} outside 0..{_MAX_NODE}")
    return node


class HeldBy:
    """A test for :meth:`AuthGraph.in_chain_of`: takes an event when *state* maps the
    event's key to it, the key not in *hidden*. ``ids[node]`` is the event's ID,
    ``keys[node]`` its state key (None for an event that is not state, or not known);
    an event without a key, or numbered past *keys*, is asked of *otherwise* by ID."""

    def __init__(self, ids: Sequence[Any], keys: Sequence[Any], state: Mapping[Any, Any],
                 hidden: Container[Any], otherwise: Callable[[Any], object]) -> None:
        self._ids = ids
        self._keys = keys
        self._state = state
        self._hidden = hidden
        self._otherwise = otherwise

    def __call__(self, node: int) -> bool:
        node = _node(node)
        key = self._keys[node] if node < len(self._keys) else None
        if key is None:
            return bool(self._otherwise(self._ids[node]))
        return self._state.get(key) == self._ids[node] and key not in self._hidden


class AuthGraph:
    """The auth edges of one room's events."""

    def __init__(self) -> None:
        self._parents: list[tuple[int, ...]] = []
        #: The state events citing each event, in the order they were recorded.
        self._citing: dict[int, list[int]] = {}

    @property
    def node_count(self) -> int:
        """One more than the highest event number mentioned so far."""
        return len(self._parents)

    def _grow(self, node: int) -> None:
        if node >= len(self._parents):
            self._parents.extend(() for _ in range(node + 1 - len(self._parents)))

    def set_auth_events(self, node: int, auth: Iterable[int], state: bool = True) -> None:
        """Record event *node*'s auth events (replacing any recorded before); *state*:
        whether it is a state event (one other events may cite), which
        :meth:`in_chain_of` walks to from its auth events."""
        node = _node(node)
        parents = tuple(_node(p) for p in auth)
        self._grow(max((node, *parents)))
        self._parents[node] = parents
        if state:
            for p in parents:
                self._citing.setdefault(p, []).append(node)

    def auth_events(self, node: int) -> array[int]:
        """The auth events recorded for *node*."""
        node = _node(node)
        return array("q", self._parents[node] if node < len(self._parents) else ())

    def _reach(self, roots: Iterable[int], include_roots: bool,
               stop: set[int] | frozenset[int] = frozenset()) -> set[int]:
        parents = self._parents
        n = len(parents)
        seen: set[int] = set()
        stack: list[int] = []
        for root in roots:
            root = _node(root)
            if root in stop:
                continue
            if include_roots:
                if root not in seen:
                    seen.add(root)
                    stack.append(root)
            else:
                stack.append(root)
        while stack:
            node = stack.pop()
            if node >= n:
                continue
            for p in parents[node]:
                if p not in seen and p not in stop:
                    seen.add(p)
                    stack.append(p)
        return seen

    def auth_chain(self, roots: Sequence[int]) -> array[int]:
        """Every event reachable from *roots* along auth edges."""
        return array("q", sorted(self._reach(roots, include_roots=False)))

    def auth_chain_difference(self, sets: Sequence[Sequence[int]],
                              common: Sequence[int] = ()) -> array[int]:
        """Events in the full auth chain of some but not all of *sets*.

        *common* names events that belong to every set (a state's unconflicted
        part): passing them once instead of in each set gives the same answer, and
        the walks from the sets stop where they reach the common events' chain.
        """
        for roots in sets:
            for root in roots:
                _node(root)
        if len(sets) < 2:
            for root in common:
                _node(root)
            return array("q")
        shared = self._reach(common, include_roots=True)
        chains = [self._reach(roots, include_roots=True, stop=shared) for roots in sets]
        union = set().union(*chains)
        everywhere = set.intersection(*chains)
        return array("q", sorted(union - everywhere))

    def conflicted_subgraph(self, conflicted: Sequence[int]) -> array[int]:
        """Events on some auth path between two of *conflicted* (those included)."""
        targets = {_node(c) for c in conflicted}
        ancestors = self._reach(targets, include_roots=True)
        parents = self._parents
        n = len(parents)
        children: dict[int, list[int]] = {}
        for node in ancestors:
            if node < n:
                for p in parents[node]:
                    children.setdefault(p, []).append(node)
        found = set(targets)
        stack = list(targets)
        while stack:
            node = stack.pop()
            for child in children.get(node, ()):
                if child not in found:
                    found.add(child)
                    stack.append(child)
        return array("q", sorted(found))

    def in_chain_of(self, nodes: Iterable[int], accepts: Callable[[int], object],
                    limit: int) -> array[int] | None:
        """Those of *nodes* in the full auth chain (the events and their auth chains)
        of some event that *accepts* takes: each found by walking from it to the state
        events citing it, and on, until an event *accepts* takes. In ascending order;
        None when that asks *accepts* about more than *limit* events (an event it
        is asked about once in a call, an event beyond :attr:`node_count` asked
        about without counting).

        What one walk learns is kept for the next: an event from which an accepted
        one was reached, and every event of a walk that reached none (nothing
        citing them, directly or not, is accepted)."""
        taken: set[int] = set()
        untaken: set[int] = set()
        closed: set[int] = set()
        found: list[int] = []
        seen = 0
        for x in sorted({_node(value) for value in nodes}):
            if x >= len(self._parents):
                if accepts(x):
                    found.append(x)
                continue
            stack = [x]
            stamped = {x}
            visited: list[int] = []
            reached = False
            while stack:
                node = stack.pop()
                if node in taken:
                    reached = True
                    break
                if node in closed:
                    continue
                visited.append(node)
                if node not in untaken:
                    seen += 1
                    if seen > limit:
                        return None
                    if accepts(node):
                        taken.add(node)
                        reached = True
                        break
                    untaken.add(node)
                # Newest first, as the compiled core keeps them; the stack then
                # takes the oldest first.
                for child in reversed(self._citing.get(node, ())):
                    if child not in stamped and node in self._parents[child]:
                        stamped.add(child)
                        stack.append(child)
            if reached:
                taken.add(x)
                found.append(x)
            else:
                closed.update(visited)
        return array("q", found)

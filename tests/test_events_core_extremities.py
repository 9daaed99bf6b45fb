"""The extremity core: fixed cases, a brute-force model and compiled == pure."""

from __future__ import annotations

from array import array

import pytest
from hypothesis import given, settings, strategies as st

from support.impls import IMPLEMENTATIONS, core_module

NON_OUTLIER, COUNTED = 1, 2
STORED, CHILD, FORWARD = 1, 2, 4


def run(mod, batch, id_flags):
    """batch: list of (id, flags, prevs)."""
    ids = array("q", [b[0] for b in batch])
    flags = bytes(b[1] for b in batch)
    offsets, prevs = array("q", [0]), array("q")
    for _, _, ps in batch:
        prevs.extend(ps)
        offsets.append(len(prevs))
    out = mod.update_extremities(ids, flags, offsets, prevs, bytes(id_flags))
    return tuple(list(a) for a in out)


def test_constants_match(impl_kind):
    mod = core_module("extremities", impl_kind)
    assert (mod.BATCH_NON_OUTLIER, mod.BATCH_COUNTED) == (NON_OUTLIER, COUNTED)
    assert (mod.ID_STORED_NON_OUTLIER, mod.ID_HAS_COUNTED_CHILD, mod.ID_FORWARD) == (
        STORED, CHILD, FORWARD)


def test_linear_chain_moves_the_extremity(impl_kind):
    mod = core_module("extremities", impl_kind)
    # 0 stored and forward; batch 1 -> 0, 2 -> 1
    out = run(mod, [(1, 3, [0]), (2, 3, [1])], [STORED | FORWARD, 0, 0])
    assert out == ([2], [0], [], [1, 2])


def test_fork_and_merge(impl_kind):
    mod = core_module("extremities", impl_kind)
    out = run(mod, [(1, 3, [0]), (2, 3, [0])], [STORED | FORWARD, 0, 0])
    assert out == ([1, 2], [0], [], [1, 2])
    out = run(mod, [(3, 3, [1, 2])], [STORED, STORED | FORWARD, STORED | FORWARD, 0])
    assert out == ([3], [1, 2], [], [3])


def test_out_of_order_event_with_stored_child_is_not_forward(impl_kind):
    mod = core_module("extremities", impl_kind)
    # 1 was stored earlier pointing at the missing 0; now 0 arrives.
    out = run(mod, [(0, 3, [])], [CHILD, STORED | FORWARD])
    assert out == ([], [], [], [0])


def test_missing_prevs_become_backward_extremities(impl_kind):
    mod = core_module("extremities", impl_kind)
    out = run(mod, [(2, 3, [0, 1]), (3, 3, [0])], [0, STORED, 0, 0])
    assert out == ([2, 3], [], [0], [2, 3])


def test_rejected_and_outliers_do_not_count(impl_kind):
    mod = core_module("extremities", impl_kind)
    # 1 is rejected (non-outlier, not counted), 2 is an outlier.
    out = run(mod, [(1, NON_OUTLIER, [0]), (2, 0, [0])], [STORED | FORWARD, 0, 0])
    assert out == ([], [], [], [1])


def test_rejects_bad_buffers(impl_kind):
    mod = core_module("extremities", impl_kind)
    with pytest.raises(ValueError):
        mod.update_extremities(array("q", [0]), b"\x03", array("q", [0]), array("q"), b"\x00")
    with pytest.raises(ValueError):
        mod.update_extremities(array("q", [5]), b"\x03", array("q", [0, 0]), array("q"), b"\x00")
    with pytest.raises(ValueError):
        mod.update_extremities(array("q", [0]), b"\x03", array("q", [0, 1]), array("q", [9]),
                               b"\x00")
    with pytest.raises(ValueError):  # int32 where int64 is needed
        mod.update_extremities(array("i", [0]), b"\x03", array("q", [0, 0]), array("q"),
                               b"\x00")
    with pytest.raises(ValueError):
        mod.update_extremities(array("q", [0]), array("q", [3]), array("q", [0, 0]),
                               array("q"), b"\x00")


def test_empty_batch(impl_kind):
    mod = core_module("extremities", impl_kind)
    out = mod.update_extremities(array("q"), b"", array("q", [0]), array("q"), b"")
    assert [list(a) for a in out] == [[], [], [], []]
    assert all(a.typecode == "q" for a in out)


@st.composite
def histories(draw):
    """A random DAG delivered in random batches, with random flags."""
    n = draw(st.integers(1, 14))
    events = []
    for i in range(n):
        prevs = sorted(set(draw(st.lists(st.integers(0, n - 1), max_size=3))) - {i})
        kind = draw(st.sampled_from(["ok", "ok", "ok", "outlier", "rejected"]))
        events.append((i, kind, prevs))
    order = draw(st.permutations(range(n)))
    cuts = sorted(set(draw(st.lists(st.integers(1, n), max_size=4))) | {n})
    return events, order, cuts


def model(stored):
    counted = {i for i, k, _ in stored if k == "ok"}
    nonout = {i for i, k, _ in stored if k != "outlier"}
    referenced = {p for i, k, ps in stored if i in counted for p in ps}
    backward = {p for i, k, ps in stored if i in nonout for p in ps} - nonout
    return counted - referenced, backward


@settings(max_examples=150, deadline=None)
@given(histories())
def test_incremental_matches_brute_force_model(history):
    events, order, cuts = history
    results = {}
    for kind in IMPLEMENTATIONS:
        mod = core_module("extremities", kind)
        stored = []
        forward, backward = set(), set()
        start = 0
        trace = []
        for cut in cuts:
            batch_events = [events[k] for k in order[start:cut]]
            start = cut
            counted_stored = {i for i, k, _ in stored if k == "ok"}
            id_flags = [0] * len(events)
            for i, k, ps in stored:
                if k != "outlier":
                    id_flags[i] |= STORED
                if i in counted_stored:
                    for p in ps:
                        id_flags[p] |= CHILD
            for f in forward:
                id_flags[f] |= FORWARD
            batch = []
            for i, k, ps in batch_events:
                flags = {"ok": 3, "rejected": 1, "outlier": 0}[k]
                batch.append((i, flags, ps if k != "outlier" else []))
            f_add, f_rem, b_add, b_rem = run(mod, batch, id_flags)
            forward = (forward - set(f_rem)) | set(f_add)
            backward = (backward - set(b_rem)) | set(b_add)
            stored.extend((i, k, ps if k != "outlier" else []) for i, k, ps in batch_events)
            assert (forward, backward) == model(stored)
            trace.append((f_add, f_rem, b_add, b_rem))
        results[kind] = trace
    assert len({repr(t) for t in results.values()}) == 1

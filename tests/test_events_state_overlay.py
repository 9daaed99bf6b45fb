"""``StateOverlay``: the state of a group a batch makes, as changes over a full
state, behaves as the whole state would."""

from __future__ import annotations

from types import MappingProxyType

from hypothesis import given, settings
from hypothesis import strategies as st

from streamrep.events.state import StateOverlay, mutable_copy

KEYS = st.tuples(st.sampled_from(["m.room.member", "m.room.name", "m.room.topic"]),
                 st.sampled_from(["", "@a:x", "@b:x", "@c:x"]))


@settings(max_examples=200, deadline=None)
@given(base=st.dictionaries(KEYS, st.text(min_size=1, max_size=3), max_size=8),
       changes=st.lists(st.tuples(KEYS, st.text(min_size=1, max_size=3)), min_size=1,
                        max_size=8))
def test_overlay_reads_as_the_whole_state(base, changes):
    expected = dict(base)
    state = MappingProxyType(dict(base))
    overlays = []
    for key, event_id in changes:
        state = StateOverlay.over(state, key, event_id)
        expected[key] = event_id
        overlays.append((state, dict(expected)))
    # Each overlay keeps its own state, whatever came after it.
    for overlay, whole in overlays:
        assert type(overlay) is StateOverlay and overlay.base is not overlay
        assert type(overlay.base) is MappingProxyType  # never an overlay of an overlay
        assert len(overlay) == len(whole)
        assert sorted(overlay) == sorted(whole)
        assert dict(overlay.items()) == whole and overlay == whole
        for key in whole:
            assert key in overlay and overlay[key] == whole[key] == overlay.get(key)
        assert ("x.absent", "") not in overlay and overlay.get(("x.absent", ""), "d") == "d"
        assert mutable_copy(overlay) == whole
        materialized = overlay.materialize()
        assert type(materialized) is MappingProxyType and materialized == whole
    assert dict(base) == dict(overlays[0][0].base)  # the base is left alone

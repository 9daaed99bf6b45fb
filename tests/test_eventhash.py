"""Canonical JSON, redaction and the hashes of events (the ``eventhash`` core), on both
implementations: the specification's public test vectors (restated as data in
``tests/data/matrix_spec_vectors.json``), properties, and compiled against pure.

What the reference implementation computes for real-shaped events of every room
version is compared in ``test_eventformat_reference.py``."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrep._pure.eventhash import CanonicalJsonError
from streamrep.matrix.eventformat import redaction_rules
from streamrep.matrix.room_versions import ROOM_VERSIONS
from support.impls import IMPLEMENTATIONS, core_module

VECTORS = json.loads((Path(__file__).parent / "data" / "matrix_spec_vectors.json").read_text())
MAX_SAFE = 2**53 - 1


@pytest.fixture
def eventhash(impl_kind: str) -> ModuleType:
    return core_module("eventhash", impl_kind)


@pytest.mark.parametrize("case", VECTORS["canonical_json"], ids=lambda c: c["canonical"][:30])
def test_the_specifications_canonical_json_examples(eventhash: ModuleType,
                                                     case: dict[str, str]) -> None:
    assert eventhash.canonical_json(json.loads(case["input"])) == case["canonical"].encode()


@pytest.mark.parametrize("data, encoded", VECTORS["unpadded_base64"])
def test_the_specifications_unpadded_base64_examples(eventhash: ModuleType, data: str,
                                                     encoded: str) -> None:
    assert eventhash.unpadded_base64(data.encode()) == encoded
    assert eventhash.unpadded_base64(data.encode(), urlsafe=True) == encoded


@pytest.mark.parametrize("case", VECTORS["content_hashes"], ids=lambda c: c["sha256"][:8])
def test_the_specifications_event_signing_content_hashes(eventhash: ModuleType,
                                                          case: dict[str, Any]) -> None:
    assert eventhash.unpadded_base64(eventhash.content_hash(case["event"])) == case["sha256"]


def test_escapes_are_the_shortest(eventhash: ModuleType) -> None:
    text = "".join(chr(c) for c in range(0x20)) + '"\\/\x7f\u2028é\U0001F600'
    expected = ('"\\u0000\\u0001\\u0002\\u0003\\u0004\\u0005\\u0006\\u0007\\b\\t\\n\\u000b'
                '\\f\\r\\u000e\\u000f\\u0010\\u0011\\u0012\\u0013\\u0014\\u0015\\u0016\\u0017'
                '\\u0018\\u0019\\u001a\\u001b\\u001c\\u001d\\u001e\\u001f\\"\\\\/\x7f\u2028é'
                '\U0001F600"').encode()
    assert eventhash.canonical_json(text) == expected


@pytest.mark.parametrize("value", [1.5, -0.25, float("nan"), float("inf"), MAX_SAFE + 1,
                                   -MAX_SAFE - 1, 2**64, 1e16, {1: "a"}, {"a": b"x"},
                                   "\udc80", ["ok", {"deep": 0.5}]])
def test_canonical_json_refuses_what_it_cannot_encode(eventhash: ModuleType, value: Any) -> None:
    with pytest.raises(CanonicalJsonError):
        eventhash.canonical_json(value)


def test_outside_strict_mode_numbers_are_written_as_the_reference_hashes_them(
        eventhash: ModuleType) -> None:
    # Room versions 1 to 5 allow larger integers and floats.
    value = {"big": 2**70, "f": 0.5, "neg": -MAX_SAFE - 5}
    assert eventhash.canonical_json(value, strict=False) == \
        b'{"big":1180591620717411303424,"f":0.5,"neg":-9007199254740996}'
    with pytest.raises(CanonicalJsonError):
        eventhash.canonical_json(float("nan"), strict=False)


def test_sha256_matches_hashlib_on_either_block_function() -> None:
    compiled = [core_module("eventhash", kind) for kind in IMPLEMENTATIONS]
    data = bytes(range(256)) * 41
    for module in compiled:
        for mode in ("auto", "portable"):
            module.sha256_blocks(mode)
            for n in [*range(0, 200), 4095, 4096, 10_000]:
                assert module.sha256(data[:n]) == hashlib.sha256(data[:n]).digest(), (mode, n)
        module.sha256_blocks("auto")


def test_sha256_pair_matches_hashlib_whatever_the_two_lengths() -> None:
    # The compiled pair hashes the blocks the two messages have in number together,
    # then the longer one's rest alone: every split of the padded tails.
    compiled = [core_module("eventhash", kind) for kind in IMPLEMENTATIONS]
    first, second = bytes(range(256)) * 3, bytes(range(255, -1, -1)) * 3
    lengths = [*range(0, 140, 3), 55, 56, 63, 64, 119, 120, 128, 700]
    for module in compiled:
        for mode in ("auto", "portable"):
            module.sha256_blocks(mode)
            for n in lengths:
                for m in lengths:
                    assert module.sha256_pair(first[:n], second[:m]) == (
                        hashlib.sha256(first[:n]).digest(),
                        hashlib.sha256(second[:m]).digest()), (mode, n, m)
        module.sha256_blocks("auto")


# --- properties ------------------------------------------------------------------

keys = st.text(max_size=12)
scalars = (st.none() | st.booleans() | st.integers(-MAX_SAFE, MAX_SAFE)
           | st.text(max_size=30))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(keys, inner, max_size=6),
    max_leaves=40)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(keys, json_values, max_size=8), st.integers(0, 4), st.randoms())
def test_canonical_json_is_stable_under_key_order_and_whitespace(
        value: dict[str, Any], indent: int, rng: Any) -> None:
    shuffled = dict(rng.sample(list(value.items()), len(value)))
    text = json.dumps(shuffled, indent=indent or None, ensure_ascii=rng.random() < 0.5)
    for kind in IMPLEMENTATIONS:
        module = core_module("eventhash", kind)
        assert module.canonical_json(json.loads(text)) == module.canonical_json(value)
    assert core_module("eventhash", IMPLEMENTATIONS[0]).canonical_json(value) == json.dumps(
        value, ensure_ascii=False, separators=(",", ":"), sort_keys=True).encode()


@settings(max_examples=200, deadline=None)
@given(st.floats().filter(lambda f: not (math.isfinite(f) and f.is_integer()
                                         and abs(f) <= MAX_SAFE)))
def test_canonical_json_refuses_floats(value: float) -> None:
    for kind in IMPLEMENTATIONS:
        with pytest.raises(CanonicalJsonError):
            core_module("eventhash", kind).canonical_json({"a": [value]})


@settings(max_examples=200, deadline=None)
@given(st.integers(MAX_SAFE + 1, 2**80), st.booleans())
def test_canonical_json_refuses_integers_out_of_range(magnitude: int, negative: bool) -> None:
    value = -magnitude if negative else magnitude
    for kind in IMPLEMENTATIONS:
        with pytest.raises(CanonicalJsonError):
            core_module("eventhash", kind).canonical_json({"n": value})


event_types = st.sampled_from(["m.room.member", "m.room.create", "m.room.join_rules",
                               "m.room.power_levels", "m.room.history_visibility",
                               "m.room.aliases", "m.room.redaction", "m.room.message",
                               "m.room.topic"])
content_keys = st.sampled_from(["membership", "creator", "room_version", "join_rule", "allow",
                                "ban", "events", "invite", "users", "redact", "aliases",
                                "history_visibility", "redacts", "third_party_invite",
                                "join_authorised_via_users_server", "body", "topic"])
events = st.fixed_dictionaries(
    {"type": event_types, "room_id": st.just("!r:x"), "sender": st.just("@a:x"),
     "content": st.dictionaries(content_keys, json_values | st.fixed_dictionaries(
         {"signed": json_values, "display_name": st.text(max_size=5)}), max_size=6),
     "depth": st.integers(0, 100), "origin_server_ts": st.integers(0, MAX_SAFE),
     "prev_events": st.lists(st.text(min_size=1, max_size=8), max_size=3),
     "auth_events": st.lists(st.text(min_size=1, max_size=8), max_size=3)},
    optional={"state_key": st.text(max_size=5), "origin": st.just("x"),
              "membership": st.just("join"), "prev_state": st.just([]),
              "unsigned": json_values, "hashes": st.fixed_dictionaries({"sha256": st.text()}),
              "signatures": json_values, "redacts": st.just("$t"), "age_ts": st.integers(0, 9),
              "extra": json_values})


@settings(max_examples=300, deadline=None)
@given(events, st.sampled_from(sorted(ROOM_VERSIONS, key=int)))
def test_pruning_twice_is_pruning_once_and_keeps_the_reference_hash(
        event: dict[str, Any], version_id: str) -> None:
    rules = redaction_rules(ROOM_VERSIONS[version_id])
    results = []
    for kind in IMPLEMENTATIONS:
        module = core_module("eventhash", kind)
        once = module.prune(event, rules)
        assert module.prune(once, rules) == once
        # A redaction changes nothing the reference hash covers.
        assert module.reference_hash(once, rules) == module.reference_hash(event, rules)
        results.append((once, module.reference_hash(event, rules), module.content_hash(event)))
    assert all(r == results[0] for r in results)


@settings(max_examples=300, deadline=None)
@given(events, st.sampled_from(sorted(ROOM_VERSIONS, key=int)), st.booleans())
def test_check_hashes_finds_what_was_changed(event: dict[str, Any], version_id: str,
                                             tamper: bool) -> None:
    rules = redaction_rules(ROOM_VERSIONS[version_id])
    for kind in IMPLEMENTATIONS:
        module = core_module("eventhash", kind)
        sealed = dict(event, hashes={"sha256": module.unpadded_base64(module.content_hash(event))})
        event_id = module.event_id_from_hash(module.reference_hash(sealed, rules), True)
        assert module.check_hashes(event_id, sealed, rules, True, True) == 0
        records = [SimpleNamespace(event_id=event_id, body=sealed, rejected=False)]
        assert module.check_records(records, rules, True, True) == {}
        if tamper:
            changed = dict(sealed, content={**sealed["content"], "tampered": True})
            assert module.check_hashes(event_id, changed, rules, True, True) in (1, 3)
            assert module.check_hashes(event_id[:-1] + "A", sealed, rules, True, True) == 1 or \
                event_id.endswith("A")


class _Key(str):
    """A str subclass, which canonical JSON writes as the str it is."""


def _nested(shapes: int) -> dict[str, Any]:
    """*shapes* dicts, each of its own keys, each inside the one before."""
    inner: dict[str, Any] = {"leaf": [1, "x"]}
    for n in range(shapes):
        inner = {f"k{n}a": n, f"k{n}b": inner, "z": "é" * (n % 3)}
    return inner


def test_dicts_of_one_shape_are_written_by_their_own_values(eventhash: ModuleType) -> None:
    """The compiled writer reuses the order it worked out for dicts of the same key
    objects; what it writes must still be each dict's own, whatever the dicts before."""
    from streamrep._pure import eventhash as pure

    rules = redaction_rules(ROOM_VERSIONS["11"])
    keys = ["type", "room_id", "sender", "content", "depth", "hashes", "unsigned"]
    events = [dict(zip(keys, ["m.room.member", f"!r{n}:x", "@a:x",
                              {"membership": "join", "n": n}, n, {"sha256": "abc"},
                              {"age": n}])) for n in range(50)]
    # The same key objects in another order: another shape.
    events += [dict(reversed(list(e.items()))) for e in events[:10]]
    # Keys made anew (and dropped) each time: stale shapes must not be taken.
    events += [{"".join(["ty", "pe"]): "m.room.topic", "".join(["con", "tent"]): {"topic": n},
                "origin": "x"} for n in range(10)]
    # The same text in keys made anew: ASCII ones find the shape kept for the first,
    # others (and str subclasses) are worked out each time.
    events += [{"".join(["ключ", str(n % 2)]): n, "".join(["b", "ody"]): "x"} for n in range(6)]
    events += [{_Key("type"): "m.room.topic", "content": {_Key("topic"): n}} for n in range(3)]
    # More shapes than the compiled table has slots, nested inside each other, so
    # a nested dict's slot is one an enclosing dict is being written from.
    events += [_nested(150), _nested(70)]
    # Shapes over a hundred in turn, each met twice.
    events += [{f"key{n}": n, "content": {"body": str(n)}} for n in range(130)] * 2
    for event in events:
        assert eventhash.canonical_json(event) == pure.canonical_json(event)
        assert eventhash.content_hash(event) == pure.content_hash(event)
        assert eventhash.reference_hash(event, rules) == pure.reference_hash(event, rules)
        assert eventhash.check_hashes("$x", event, rules, True, True) == pure.check_hashes(
            "$x", event, rules, True, True)
    with pytest.raises(CanonicalJsonError):
        eventhash.canonical_json({**events[0], 7: "a key that is not a string"})


def test_a_nested_dict_never_takes_the_shape_its_parent_is_written_by(
        eventhash: ModuleType) -> None:
    """A dict inside another may have a shape whose place in the compiled table is the
    one its parent's shape holds; the parent's must stay as it is while it is written.
    Each inner shape is written alone first, as a shape goes into the table once it
    has been met there; with 400 of them some share the parent's place."""
    from streamrep._pure import eventhash as pure

    keys = [f"inner{n}" for n in range(400)]
    for n, key in enumerate(keys):
        outer_alone = {"a": 0, "b": 1, "c": 2}
        eventhash.canonical_json(outer_alone)
        eventhash.canonical_json(outer_alone)
        inner = {key: n, "z": [n]}
        eventhash.canonical_json(inner)
        # The inner dict first: the parent writes more members after it.
        outer = {"a": inner, "b": 1, "c": 2}
        assert eventhash.canonical_json(outer) == pure.canonical_json(outer)

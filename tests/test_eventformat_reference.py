"""Pruning, content hashes, reference hashes and event IDs of real-shaped events of
every room version, against what the reference implementation computes in its own
venv (``support/eventformat_oracle.py``), on both core implementations."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from streamrep import _impl
from streamrep.matrix import eventformat
from streamrep.matrix.room_versions import room_version
from support.impls import IMPLEMENTATIONS, core_module
from support.real_events import ROOM_VERSION_IDS, room_events
from support.reference import reference_python

ORACLE = Path(__file__).resolve().parent / "support" / "eventformat_oracle.py"


def _reference(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    done = subprocess.run([reference_python(), str(ORACLE)], input=json.dumps(cases),
                          capture_output=True, text=True, timeout=300, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    answers: list[dict[str, Any]] = json.loads(done.stdout)
    return answers


def _cases() -> list[dict[str, Any]]:
    cases = []
    for version_id in ROOM_VERSION_IDS:
        for event in room_events(version_id, messages=3):
            fields = dict(event)
            event_id = fields.pop("event_id")
            if not eventformat.ids_are_hashes(room_version(version_id)):
                fields["event_id"] = event_id  # versions 1 and 2 carry their ID
            cases.append({"version": version_id, "event": fields, "event_id": event_id})
    return cases


@pytest.fixture(scope="module")
def answered() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    cases = _cases()
    oracle = _reference([{"version": c["version"], "event": c["event"]} for c in cases])
    return list(zip(cases, oracle))


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_hashes_and_ids_are_the_references(answered: list[tuple[dict[str, Any], dict[str, Any]]],
                                           kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eventformat, "_eventhash", core_module("eventhash", kind))
    assert len(answered) == 12 * 14
    for case, reference in answered:
        version = room_version(case["version"])
        event = case["event"]
        where = f"room version {case['version']}, {event['type']}"
        assert eventformat.content_hash(event, version) == reference["content_hash"], where
        assert event["hashes"]["sha256"] == reference["content_hash"], where
        assert eventformat.reference_hash(event, version) == reference["reference_hash"], where
        if reference["event_id"] is not None:
            assert eventformat.event_id_for(event, version) == reference["event_id"], where
            assert case["event_id"] == reference["event_id"], where
            assert eventformat.check_event(case["event_id"], event, version) is None, where


@pytest.mark.parametrize("kind", IMPLEMENTATIONS)
def test_pruning_is_the_references(answered: list[tuple[dict[str, Any], dict[str, Any]]],
                                   kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eventformat, "_eventhash", core_module("eventhash", kind))
    for case, reference in answered:
        pruned = eventformat.prune_event(case["event"], room_version(case["version"]))
        # The reference keeps two server annotations under unsigned; the specification
        # keeps no unsigned key at all (docs/events.md, "Redaction").
        expected = {k: v for k, v in reference["pruned"].items() if k != "unsigned"}
        assert pruned == expected, f"room version {case['version']}, {case['event']['type']}"


def test_the_compiled_core_is_under_test() -> None:
    if not _impl.NO_EXTENSIONS:
        assert "compiled" in IMPLEMENTATIONS

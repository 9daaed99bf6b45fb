"""The public state resolution scenarios, resolved by streamrep and by the reference."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import stateres_build as build
from tests.support import stateres_scenarios as sc

DOC = sc.load()
ORACLE_PYTHON = Path(os.environ.get("STREAMREP_REFERENCE_PYTHON", "/work/refvenv/bin/python"))
ORACLE = Path(__file__).resolve().parent / "support" / "stateres_oracle.py"


def _keys_of(case: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {s["id"]: (s["type"], s.get("state_key", ""))
            for s in DOC["initial_events"] + case["events"]}


@pytest.mark.parametrize("case", DOC["graphs"], ids=lambda c: c["name"])
def test_graph_scenario(case: dict[str, Any]) -> None:
    keys_of = _keys_of(case)
    expected = {keys_of[n]: n for n in case["expected"]}
    assert build.graph_state(DOC, case) == expected


@pytest.mark.parametrize("case", DOC["explicit"], ids=lambda c: c["name"])
def test_explicit_scenario(case: dict[str, Any]) -> None:
    expected = {(t, k): n for t, k, n in case["expected"]}
    assert build.explicit_state(case) == expected


@pytest.mark.parametrize("case", DOC["explicit"], ids=lambda c: c["name"])
def test_explicit_scenario_in_any_set_order(case: dict[str, Any]) -> None:
    flipped = dict(case, state_sets=list(reversed(case["state_sets"])))
    assert build.explicit_state(flipped) == build.explicit_state(case)


def run_oracle(doc: dict[str, Any]) -> dict[str, Any]:
    """The reference implementation's answers for *doc* (skips when it is absent)."""
    if not ORACLE_PYTHON.exists():
        pytest.skip(f"reference interpreter {ORACLE_PYTHON} not installed")
    done = subprocess.run([str(ORACLE_PYTHON), str(ORACLE)], input=json.dumps(doc),
                          capture_output=True, text=True, timeout=120, cwd="/")
    if done.returncode != 0 and "No module named 'synapse'" in done.stderr:
        pytest.skip("the reference implementation is not importable")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_reference_agrees_on_every_scenario() -> None:
    answers = run_oracle(DOC)
    for case in DOC["graphs"]:
        assert answers["graphs"][case["name"]] == build.as_rows(build.graph_state(DOC, case)), \
            case["name"]
    for case in DOC["explicit"]:
        assert answers["explicit"][case["name"]] == build.as_rows(build.explicit_state(case)), \
            case["name"]

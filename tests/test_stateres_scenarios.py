"""The public state resolution scenarios, resolved by streamrep and by the reference."""

from __future__ import annotations

from typing import Any

import pytest

from support import stateres_build as build
from support import stateres_scenarios as sc
from support.stateres_reference import run_oracle

DOC = sc.load()


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


def test_reference_agrees_on_every_scenario() -> None:
    answers = run_oracle(DOC)
    for case in DOC["graphs"]:
        assert answers["graphs"][case["name"]] == build.as_rows(build.graph_state(DOC, case)), \
            case["name"]
    for case in DOC["explicit"]:
        assert answers["explicit"][case["name"]] == build.as_rows(build.explicit_state(case)), \
            case["name"]

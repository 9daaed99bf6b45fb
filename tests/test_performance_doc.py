"""docs/performance.md keeps its shape: one table per area, every figure with the
command that produced it (a numbered command of its area) and its machine's probe,
and nothing from the past (no before/after, no commits, no one machine's paths)."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "performance.md"


def _areas() -> dict[str, str]:
    text = DOC.read_text()
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _table(body: str) -> tuple[list[str], list[list[str]]]:
    rows = [line for line in body.splitlines() if line.startswith("|")]
    split = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    return split[0], [row for row in split[2:]]


def test_each_area_has_one_table_with_command_and_probe() -> None:
    areas = _areas()
    assert areas
    for area, body in areas.items():
        tables = re.findall(r"^\|.*\|\n\|[-| ]+\|\n(?:\|.*\|\n?)+", body, re.M)
        assert len(tables) == 1, f"{area}: {len(tables)} tables (one per area)"
        header, rows = _table(tables[0])
        assert header[-2:] == ["Command", "Probe"], (area, header)
        commands = {int(n) for n in re.findall(r"^(\d+)\. `", body, re.M)}
        assert commands, f"{area}: no numbered commands"
        for row in rows:
            assert len(row) == len(header), (area, row)
            cited = {int(n) for n in row[-2].split(",")}
            assert cited and cited <= commands, (area, row[0], row[-2])
            assert re.fullmatch(r"\d+(\.\d+)?(-\d+(\.\d+)?)?", row[-1]), (area, row[0], row[-1])


def test_nothing_from_the_past() -> None:
    text = DOC.read_text()
    assert not re.search(r"^#+ .*\b([Bb]efore|[Aa]fter)\b", text, re.M), "a before/after section"
    assert not re.search(r"\b(version|commit) before\b|\b(previous|earlier|old) version", text)
    commit = r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"
    assert not re.search(commit, text), "a commit in the page"
    assert not re.search(r"(?<![\w.~])/(work|tmp|home|root)/", text), "a machine's path"

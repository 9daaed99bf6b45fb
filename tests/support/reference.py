"""The reference implementation (matrix-synapse) as a test oracle, in its own venv.

The reference is never imported by streamrep or by these tests: its interpreter runs
``reference_oracle.py`` in a subprocess. ``STREAMREP_REFERENCE_PYTHON`` names that
interpreter (default ``/work/refvenv/bin/python`` when it exists; ``scripts/test``
creates a venv and sets the variable). Without one the tests that need it are
skipped with the reason, unless ``STREAMREP_REQUIRE_REFERENCE=1`` (CI sets it), which
turns the absence into a failure.

Use::

    from support.reference import check_lines, reference_lines
    report = check_lines(lines)          # skips (or fails) when no reference
    assert report.failures == []
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pytest

DEFAULT_PYTHON = "/work/refvenv/bin/python"
ORACLE = Path(__file__).with_name("reference_oracle.py")


def _required() -> bool:
    return os.environ.get("STREAMREP_REQUIRE_REFERENCE", "") not in ("", "0")


@functools.lru_cache(maxsize=1)
def _find() -> tuple[str | None, str]:
    """(interpreter, "") when the reference answers, else (None, why not)."""
    python = os.environ.get("STREAMREP_REFERENCE_PYTHON") or (
        DEFAULT_PYTHON if os.path.exists(DEFAULT_PYTHON) else "")
    if not python:
        return None, ("no reference interpreter: set STREAMREP_REFERENCE_PYTHON to the "
                      "python of a venv with matrix-synapse installed (scripts/test makes one)")
    try:
        done = subprocess.run(
            [python, "-c", "import synapse.replication.tcp.streams, synapse; "
                           "print(synapse.__version__)"],
            capture_output=True, text=True, timeout=120)
    except OSError as exc:
        return None, f"reference interpreter {python} does not run: {exc}"
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"{python} cannot import the reference (synapse): {last}"
    return python, ""


def reference_python() -> str:
    """The reference's interpreter; skips the test (fails it under
    ``STREAMREP_REQUIRE_REFERENCE=1``) when there is none."""
    python, why = _find()
    if python is None:
        if _required():
            pytest.fail(f"STREAMREP_REQUIRE_REFERENCE is set but {why}", pytrace=False)
        pytest.skip(why)
    return python


@dataclass(frozen=True)
class OracleReport:
    """What the reference made of some command lines."""

    checked: int
    by_stream: dict[str, int]
    #: ``{"line": ..., "error": ...}`` for every line the reference refused
    failures: list[dict[str, Any]]


def _run(mode: str, stdin: str) -> str:
    done = subprocess.run([reference_python(), str(ORACLE), mode], input=stdin,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise AssertionError(f"reference_oracle.py {mode} failed:\n{done.stderr}")
    return done.stdout


def check_lines(lines: Iterable[str]) -> OracleReport:
    """Feed command *lines* (without newlines) to the reference's parsers."""
    data = json.loads(_run("check", "".join(line + "\n" for line in lines)))
    return OracleReport(data["checked"], data["by_stream"], data["failures"])


def reference_lines() -> list[str]:
    """``RDATA`` lines built and serialised by the reference, for every stream
    streamrep shares with it."""
    return [line for line in _run("produce", "").splitlines() if line]


def reference_fields() -> dict[str, Any]:
    """Each stream's row fields as the reference declares them: ``{stream: [[name,
    type], ...]}`` for every stream it has; ``events`` maps each row kind to such a
    list, and ``events/row`` names the two parts of an ``events`` row."""
    result: dict[str, Any] = json.loads(_run("fields", ""))
    return result

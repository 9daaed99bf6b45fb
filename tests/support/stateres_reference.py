"""Running tests/support/stateres_oracle.py in the reference's own interpreter."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from support.reference import reference_python

ORACLE = Path(__file__).resolve().parent / "stateres_oracle.py"


def run_oracle(doc: dict[str, Any], *args: str) -> Any:
    """The reference implementation's answers for *doc* (skips, or fails when the
    reference is required, when it is absent)."""
    done = subprocess.run([reference_python(), str(ORACLE), *args], input=json.dumps(doc),
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)

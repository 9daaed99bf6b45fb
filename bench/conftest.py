"""Benchmarks run each core routine on both implementations, side by side.

Run with ``python -m pytest bench/ --benchmark-only``; compare the ``compiled`` and
``pure`` rows of each group for the compiled/pure ratio.
"""

from __future__ import annotations

import pytest

from support.impls import IMPLEMENTATIONS


@pytest.fixture(params=IMPLEMENTATIONS, scope="session")
def impl_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)

"""Benchmarks run each core routine on both implementations, side by side.

Run with ``python -m pytest bench/ --benchmark-only``; compare the ``compiled`` and
``pure`` rows of each group for the compiled/pure ratio.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest

if importlib.util.find_spec("streamrep._core") is None and importlib.util.find_spec("_core"):
    # Running from the source tree on PYTHONPATH (a virtualenv holding the reference
    # implementation): the compiled core lives in src/_core, installed as streamrep._core.
    import _core

    sys.modules["streamrep._core"] = _core

from support.impls import IMPLEMENTATIONS  # noqa: E402


@pytest.fixture(params=IMPLEMENTATIONS, scope="session")
def impl_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)

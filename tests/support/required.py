"""What a test needs from the machine: skipped where it is missing, unless CI
requires it (``STREAMREP_REQUIRE_...=1``), which turns the skip into a failure."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def required(variable: str) -> bool:
    """Whether *variable* (``STREAMREP_REQUIRE_...``) asks for a failure, not a skip."""
    return os.environ.get(variable, "") not in ("", "0")


def missing(variable: str, why: str) -> NoReturn:
    """Skip the test with *why*, or fail it where *variable* is set."""
    if required(variable):
        pytest.fail(f"{variable} is set but {why}", pytrace=False)
    pytest.skip(why)

"""Reconnection delays, shared by every transport."""

from __future__ import annotations

import random

__all__ = ["Backoff"]


class Backoff:
    """Exponential backoff with jitter: attempt *n* waits a random time between
    half and all of ``min(maximum, base * 2**n)``."""

    def __init__(self, base: float = 0.1, maximum: float = 10.0, rng: random.Random | None = None) -> None:
        if base <= 0 or maximum < base:
            raise ValueError("need 0 < base <= maximum")
        self.base = base
        self.maximum = maximum
        self.attempt = 0
        self._rng = rng or random.Random()

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.base * (2 ** min(self.attempt, 32)))
        self.attempt += 1
        return float(ceiling * self._rng.uniform(0.5, 1.0))

    def reset(self) -> None:
        self.attempt = 0

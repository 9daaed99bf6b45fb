"""Tokens a client can hold: ``s<stream>`` for a stream position and
``t<topological>-<stream>`` for a position in a room's topological order.

A topological token sits *between* events: paginating backwards from
``t<t>-<s>`` returns the events ordered before ``(t, s)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from streamrep.errors import InvalidTokenError

__all__ = ["StreamToken", "TopologicalToken", "parse_token"]

_STREAM_RE = re.compile(r"s(-?\d{1,19})")
_TOPO_RE = re.compile(r"t(\d{1,19})-(-?\d{1,19})")


@dataclass(frozen=True, order=True, slots=True)
class StreamToken:
    """A position on the ``events`` stream (events with ``stream_ordering <= stream``
    have been seen)."""

    stream: int

    def __str__(self) -> str:
        return f"s{self.stream}"


@dataclass(frozen=True, order=True, slots=True)
class TopologicalToken:
    """A position in a room's ``(topological_ordering, stream_ordering)`` order."""

    topological: int
    stream: int

    def __str__(self) -> str:
        return f"t{self.topological}-{self.stream}"


def parse_token(token: str) -> StreamToken | TopologicalToken:
    """Parse ``s<n>`` or ``t<t>-<s>``; raises :class:`InvalidTokenError`."""
    if not isinstance(token, str):
        raise InvalidTokenError(f"a token is a string, not {type(token).__name__}")
    match = _STREAM_RE.fullmatch(token)
    if match:
        return StreamToken(int(match.group(1)))
    match = _TOPO_RE.fullmatch(token)
    if match:
        return TopologicalToken(int(match.group(1)), int(match.group(2)))
    raise InvalidTokenError(f"not a stream token (s<n>) or topological token (t<t>-<s>): "
                            f"{token[:64]!r}")

"""Typed API of streamrep._core.plaincheck (same as streamrep._pure.plaincheck)."""

from typing import Any

__all__ = ["usual_plain_auth_ids", "settled_until"]

def usual_plain_auth_ids(records: list[Any], room_id: str, create_id: str | None,
                         not_plain: frozenset[str]) -> dict[str, tuple[str, ...]]: ...
def settled_until(records: list[Any], start: int, plain: dict[str, tuple[str, ...]],
                  passed: dict[tuple[tuple[str, ...], str, str], Any],
                  verdicts: dict[tuple[str, str], bool] | None) -> int: ...

"""Typed API of streamrep._core.rowcheck (same as streamrep._pure.rowcheck)."""

from typing import Any, Mapping, Sequence

__all__ = ["KINDS", "RowShape", "check_row", "check_rows"]

KINDS: tuple[str, ...]

class RowShape:
    name: str
    fields: tuple[tuple[str, str], ...]
    variants: dict[str, RowShape] | None
    def __init__(self, name: str, fields: Sequence[tuple[str, str]] = (),
                 variants: Mapping[str, Sequence[tuple[str, str]]] | None = None) -> None: ...

def check_row(shape: RowShape, row_json: bytes) -> str | None: ...
def check_rows(shape: RowShape, commands: Sequence[Any]) -> str | None: ...

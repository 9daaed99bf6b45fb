"""Typed API of streamrep._core.eventrecord (same as streamrep._pure.eventrecord)."""

from typing import Any

from streamrep._pure.eventrecord import EventRecord

__all__ = ["parse_batch", "parse_event"]

def parse_event(item: Any) -> EventRecord: ...
def parse_batch(items: Any) -> list[EventRecord]: ...

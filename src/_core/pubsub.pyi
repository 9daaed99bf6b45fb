"""Typed API of streamrep._core.pubsub (same as streamrep._pure.pubsub)."""

__all__ = ["MessageSplitter", "MAX_BULK"]

MAX_BULK: int

class MessageSplitter:
    subscribed: int
    refusal: bytes | None
    def __init__(self, max_bulk: int = ...) -> None: ...
    def feed(self, data: bytes, skip: bytes | None = None) -> tuple[bytes, int]: ...

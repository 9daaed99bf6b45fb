"""One handler per stream, each given its stream's rows typed.

A link calls one handler per fact, ``(stream, instance, token, rows)``. A worker that
follows a few known streams can register a function per stream instead, and have the
rows as the named tuples of :mod:`streamrep.streams.rows`::

    handlers = StreamHandlers()

    @handlers.on(rows.CACHES)
    def invalidate(instance: str, token: int, facts: list[rows.CachesRow]) -> None:
        ...

    link = open_link(settings, handler=handlers, streams=handlers.streams)

Facts of streams without a handler are passed to *default* (or ignored without one).
"""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from streamrep.streams.rows import TypedStream

__all__ = ["StreamHandlers", "RowsHandler"]

R = TypeVar("R", bound=tuple[Any, ...])

#: ``handler(instance, token, rows)`` for one stream's facts.
RowsHandler = Callable[[str, int, list[R]], None]


class StreamHandlers:
    """A link handler dispatching each fact to its stream's handler (see the module
    docstring); *default* ``(stream, instance, token, rows)`` takes the others."""

    def __init__(self, default: Callable[[str, str, int, list[Any]], None] | None = None) -> None:
        self.default = default
        self._handlers: dict[str, Callable[[str, int, list[Any]], None]] = {}

    @property
    def streams(self) -> list[str]:
        """The streams with a handler (what to follow, when there is no default)."""
        return list(self._handlers)

    def on(self, stream: TypedStream[R]) -> Callable[[RowsHandler[R]], RowsHandler[R]]:
        """A decorator registering a handler of *stream*'s facts, rows typed."""
        def register(handler: RowsHandler[R]) -> RowsHandler[R]:
            convert = stream.rows

            def typed(instance: str, token: int, rows: list[Any]) -> None:
                handler(instance, token, convert(rows))

            self._handlers[stream.name] = typed
            return handler

        return register

    def __call__(self, stream: str, instance: str, token: int, rows: list[Any]) -> None:
        handler = self._handlers.get(stream)
        if handler is not None:
            handler(instance, token, rows)
        elif self.default is not None:
            self.default(stream, instance, token, rows)

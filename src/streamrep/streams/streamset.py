"""A :class:`StreamSet`: the stream definitions one process serves.

A process builds its set once, at start-up, from the definitions it knows and the
deployment's configuration (:func:`streamrep.catalogue.served_streams`); nothing is
added to it by importing a module. A :class:`~streamrep.streams.Streams` handle and
a replication relay look streams up in it, and the relay checks every row against
the stream's row format with :meth:`StreamSet.check_rows`.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Sequence

from streamrep.errors import DatabaseConfigError, UnknownStreamError
from streamrep.streams.definition import StreamDefinition

__all__ = ["StreamSet"]


class StreamSet:
    """An immutable set of stream definitions, by name.

    Two different definitions of one name raise :class:`DatabaseConfigError`; the
    same definition twice is harmless.
    """

    __slots__ = ("_definitions",)

    def __init__(self, definitions: Iterable[StreamDefinition] = ()) -> None:
        found: dict[str, StreamDefinition] = {}
        for definition in definitions:
            existing = found.get(definition.name)
            if existing is not None and existing != definition:
                raise DatabaseConfigError(
                    f"two different definitions of stream {definition.name!r}")
            found[definition.name] = definition
        self._definitions = {name: found[name] for name in sorted(found)}

    def get(self, name: str) -> StreamDefinition:
        """The definition of stream *name* (:class:`UnknownStreamError` if none)."""
        try:
            return self._definitions[name]
        except KeyError:
            raise UnknownStreamError(
                f"unknown stream {name!r} (known: {', '.join(self._definitions) or 'none'})"
            ) from None

    __getitem__ = get

    def names(self) -> tuple[str, ...]:
        """Every stream name, sorted."""
        return tuple(self._definitions)

    def with_streams(self, *definitions: StreamDefinition) -> "StreamSet":
        """A new set holding these streams and *definitions*."""
        return StreamSet((*self._definitions.values(), *definitions))

    def only(self, names: Iterable[str]) -> "StreamSet":
        """A new set of the streams named (each must be in this set)."""
        return StreamSet(self.get(name) for name in names)

    def check_row(self, stream: str, row_json: bytes) -> str | None:
        """None when *row_json* (raw JSON) is a well-formed row of *stream*, else one
        sentence naming what is wrong (an unknown stream is wrong too)."""
        definition = self._definitions.get(stream)
        if definition is None:
            return f"unknown stream {stream!r}"
        return definition.check_row(row_json)

    def check_rows(self, stream: str, commands: Sequence[Any]) -> str | None:
        """As :meth:`check_row` for the ``row_json`` of each RDATA command of
        *stream*; the first error, or None."""
        definition = self._definitions.get(stream)
        if definition is None:
            return f"unknown stream {stream!r}"
        return definition.check_rows(commands)

    def __contains__(self, name: object) -> bool:
        return name in self._definitions

    def __iter__(self) -> Iterator[StreamDefinition]:
        return iter(self._definitions.values())

    def __len__(self) -> int:
        return len(self._definitions)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StreamSet) and other._definitions == self._definitions

    def __hash__(self) -> int:
        return hash(tuple(self._definitions.values()))

    def __repr__(self) -> str:
        return f"StreamSet({list(self._definitions)})"

"""Helpers for the wire format tests: comparable summaries of decoder outcomes."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from streamrep.errors import LineTooLongError, ProtocolError


def describe(command: Any) -> tuple[Any, ...]:
    """Everything observable about *command*, as plain values (rows decoded or their error)."""
    fields = []
    for field in command.FIELDS:
        if field == "row":
            fields.append(("row_json", command.row_json))
            try:
                fields.append(("row", command.row))
            except ProtocolError as exc:
                fields.append(("row_error", type(exc).__name__, str(exc)))
        else:
            fields.append((field, getattr(command, field)))
    return (type(command).__name__, command.NAME, command.to_bytes(), tuple(fields))


def describe_error(exc: ProtocolError) -> tuple[Any, ...]:
    prefix = exc.line_prefix if isinstance(exc, LineTooLongError) else None
    return (type(exc).__name__, str(exc), prefix)


def feed_outcome(decoder: Any, data: bytes) -> tuple[Any, ...]:
    """What one ``feed`` call did: its commands, or its errors and the commands kept."""
    try:
        commands = decoder.feed(data)
    except ProtocolError as exc:
        assert exc.errors and exc.errors[0] is exc
        return (
            "error",
            [describe_error(e) for e in exc.errors],
            [describe(c) for c in exc.commands],
        )
    return ("ok", [describe(c) for c in commands])


def run_chunks(wire: ModuleType, chunks: list[bytes], max_line_length: int) -> list[Any]:
    decoder = wire.Decoder(max_line_length)
    outcomes = []
    for chunk in chunks:
        outcomes.append(feed_outcome(decoder, chunk))
        assert decoder.buffered <= max_line_length
    return outcomes


def flatten(outcomes: list[Any]) -> tuple[list[Any], list[Any]]:
    """All commands and all errors of a run, whatever the chunking."""
    commands: list[Any] = []
    errors: list[Any] = []
    for outcome in outcomes:
        if outcome[0] == "ok":
            commands.extend(outcome[1])
        else:
            errors.extend(outcome[1])
            commands.extend(outcome[2])
    return commands, errors

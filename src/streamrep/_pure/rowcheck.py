"""Stream row shapes (pure twin): does an RDATA row have its stream's fields?

A :class:`RowShape` lists the fields of a stream's row and the JSON kind of each; a
*tagged* shape describes rows ``[kind, data]`` whose ``data`` shape depends on the
``kind`` string (the ``events`` stream). :func:`check_row` takes the row's raw JSON
bytes and returns None when the row fits, else one sentence naming what is wrong.

Field kinds: ``string``, ``string|null``, ``integer``, ``boolean``, ``flag``,
``object``, ``array``, ``array|null``, ``string[]`` (an array of strings) and ``any``.
A ``flag`` is a boolean or the integer 0 or 1: the reference implementation reads
some booleans from SQLite integer columns and sends them as they come out.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import orjson

__all__ = ["KINDS", "RowShape", "check_row", "check_rows"]

#: Every field kind a shape may use.
KINDS = ("string", "string|null", "integer", "boolean", "flag", "object", "array",
         "array|null", "string[]", "any")

_EXPECTED = {
    "string": "a string",
    "string|null": "a string or null",
    "integer": "an integer",
    "boolean": "a boolean",
    "flag": "a boolean or the integer 0 or 1",
    "object": "an object",
    "array": "an array",
    "array|null": "an array or null",
    "string[]": "an array of strings",
    "any": "any JSON value",
}


def _json_kind(value: Any) -> str:
    """How a decoded JSON value is named in messages."""
    kind = type(value)
    if value is None:
        return "null"
    if kind is bool:
        return "a boolean"
    if kind is int:
        return "an integer"
    if kind is float:
        return "a number"
    if kind is str:
        return "a string"
    if kind is list:
        return "an array"
    return "an object"


def _fits(value: Any, kind: str) -> bool:
    vtype = type(value)
    if kind == "string":
        return vtype is str
    if kind == "string|null":
        return value is None or vtype is str
    if kind == "integer":
        return vtype is int
    if kind == "boolean":
        return vtype is bool
    if kind == "flag":
        return vtype is bool or (vtype is int and (value == 0 or value == 1))
    if kind == "object":
        return vtype is dict
    if kind == "array":
        return vtype is list
    if kind == "array|null":
        return value is None or vtype is list
    if kind == "string[]":
        return vtype is list and all(type(item) is str for item in value)
    return True


class RowShape:
    """The shape of one stream's rows.

    *fields* is a sequence of ``(name, kind)`` for rows that are a flat JSON array;
    *variants* maps each ``kind`` tag to such a sequence for rows ``[tag, [fields]]``
    (give one or the other). *name* (the stream) starts every message.
    """

    def __init__(self, name: str, fields: Sequence[tuple[str, str]] = (),
                 variants: Mapping[str, Sequence[tuple[str, str]]] | None = None) -> None:
        if variants is not None and fields:
            raise ValueError("a row shape has fields or variants, not both")
        self.name = str(name)
        self.fields: tuple[tuple[str, str], ...] = tuple(
            (str(field), str(kind)) for field, kind in fields)
        for field, kind in self.fields:
            if kind not in KINDS:
                raise ValueError(f"field {field!r} of {name!r} has unknown kind {kind!r} "
                                 f"(known: {', '.join(KINDS)})")
        self.variants: dict[str, RowShape] | None = None
        if variants is not None:
            if not variants:
                raise ValueError("a tagged row shape needs at least one variant")
            self.variants = {str(tag): RowShape(f"{name} {tag}", shape)
                             for tag, shape in variants.items()}

    def __repr__(self) -> str:
        if self.variants is not None:
            return f"RowShape({self.name!r}, variants={sorted(self.variants)!r})"
        return f"RowShape({self.name!r}, {list(self.fields)!r})"


def _check_value(shape: RowShape, row: Any) -> str | None:
    if type(row) is not list:
        return f"{shape.name} row must be a JSON array, not {_json_kind(row)}"
    if shape.variants is not None:
        if len(row) != 2:
            return f"{shape.name} row has {len(row)} fields, expected 2 (kind, data)"
        tag = row[0]
        if type(tag) is not str:
            return f"{shape.name} row field 0 (kind) must be a string, not {_json_kind(tag)}"
        variant = shape.variants.get(tag)
        if variant is None:
            known = ", ".join(sorted(shape.variants))
            return f"{shape.name} row kind {tag!r} is unknown (known: {known})"
        return _check_value(variant, row[1])
    fields = shape.fields
    if len(row) != len(fields):
        names = ", ".join(field for field, _ in fields)
        return f"{shape.name} row has {len(row)} fields, expected {len(fields)} ({names})"
    for index, ((field, kind), value) in enumerate(zip(fields, row)):
        if not _fits(value, kind):
            if kind == "string[]" and type(value) is list:
                item = next(i for i, v in enumerate(value) if type(v) is not str)
                return (f"{shape.name} row field {index} ({field}) must be an array of "
                        f"strings, but item {item} is {_json_kind(value[item])}")
            if kind == "flag" and type(value) is int:
                return (f"{shape.name} row field {index} ({field}) must be {_EXPECTED[kind]}, "
                        f"not {value}")
            return (f"{shape.name} row field {index} ({field}) must be {_EXPECTED[kind]}, "
                    f"not {_json_kind(value)}")
    return None


def check_row(shape: RowShape, row_json: bytes) -> str | None:
    """None when the JSON row *row_json* has *shape*, else what is wrong."""
    if type(row_json) is not bytes:
        row_json = bytes(row_json)
    try:
        row = orjson.loads(row_json)
    except orjson.JSONDecodeError:
        return f"{shape.name} row is not valid JSON"
    return _check_value(shape, row)


def check_rows(shape: RowShape, commands: Sequence[Any]) -> str | None:
    """The first error of :func:`check_row` over the ``row_json`` of each command."""
    for command in commands:
        error = check_row(shape, command.row_json)
        if error is not None:
            return error
    return None

"""Run by the reference implementation's interpreter, never imported by streamrep.

Two modes, chosen by the first argument:

``check``
    Reads replication command lines (one per line) on stdin and checks each with the
    reference's own code: ``parse_command_from_line``, then for ``RDATA`` the named
    stream's ``parse_row``, then that every field of the parsed row holds the JSON
    type the reference's row class declares, then the round trip (the parsed command
    serialised by the reference decodes to the same command). Prints one JSON object:
    ``{"checked": N, "by_stream": {stream: rows}, "failures": [{"line", "error"}]}``.

``fields``
    Prints each stream's row fields and their declared types, as JSON (every
    stream of the reference's ``STREAMS_MAP``; ``events`` per row type, and the
    names of its row's two parts under ``events/row``).

``produce``
    Prints ``RDATA`` lines built the reference's way: rows constructed with each
    shared stream's own row class, turned into the tuple the reference's update
    functions yield, wrapped in its ``RdataCommand`` and serialised with ``to_line``.

This file must only import the standard library and the reference (``synapse``):
it runs in the reference's separate virtualenv.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import attr
from synapse.replication.tcp.commands import RdataCommand, parse_command_from_line
from synapse.replication.tcp.streams import STREAMS_MAP
from synapse.replication.tcp.streams.events import (
    EventsStreamCurrentStateRow,
    EventsStreamEventRow,
    EventsStreamRow,
    TypeToRow,
)

# Declared field types this check understands; any other alternative is accepted.
_SIMPLE = {
    "str": (str,),
    "int": (int,),
    "bool": (bool,),
    "dict": (dict,),
    "JsonDict": (dict,),
    "None": (type(None),),
}


def _alternatives(declared: Any) -> list[str]:
    if isinstance(declared, str):
        text = declared
    elif isinstance(declared, type):  # a class such as int or UserID, not list[str]
        text = declared.__name__
    else:
        text = str(declared).replace("typing.", "")
    return [part.strip() for part in text.split("|")]


def _matches(value: Any, alternative: str) -> bool | None:
    """Whether *value* has the JSON type *alternative* names (None: not understood)."""
    if alternative in _SIMPLE:
        kinds = _SIMPLE[alternative]
        if isinstance(value, bool) and bool not in kinds:
            return False
        return isinstance(value, kinds)
    if alternative.startswith("list["):
        if not isinstance(value, list):
            return False
        inner = alternative[len("list["):-1]
        if inner in _SIMPLE:
            return all(_matches(item, inner) for item in value)
        return True
    return None


def _type_errors(row: Any) -> list[str]:
    """Fields of the attrs *row* whose value is not of the declared type."""
    errors = []
    for field in attr.fields(type(row)):
        value = getattr(row, field.name)
        verdicts = [_matches(value, alt) for alt in _alternatives(field.type)]
        if None in verdicts or any(verdicts):
            continue
        errors.append(f"{type(row).__name__}.{field.name} is {value!r}, "
                      f"declared {field.type}")
    return errors


def _check_line(line: str, by_stream: dict[str, int]) -> str | None:
    try:
        command = parse_command_from_line(line)
    except Exception as exc:  # any refusal is what this check reports
        return f"parse_command_from_line: {type(exc).__name__}: {exc}"
    try:
        again = parse_command_from_line(f"{command.NAME} {command.to_line()}")
    except Exception as exc:
        return f"round trip: {type(exc).__name__}: {exc}"
    if vars_of(again) != vars_of(command):
        return f"round trip: {vars_of(command)!r} came back as {vars_of(again)!r}"
    if not isinstance(command, RdataCommand):
        return None
    stream = STREAMS_MAP.get(command.stream_name)
    if stream is None:
        return f"unknown stream {command.stream_name!r}"
    by_stream[command.stream_name] = by_stream.get(command.stream_name, 0) + 1
    try:
        parsed = stream.parse_row(command.row)
    except Exception as exc:
        return f"{stream.__name__}.parse_row: {type(exc).__name__}: {exc}"
    rows = [parsed.data] if isinstance(parsed, EventsStreamRow) else [parsed]
    errors = [error for row in rows for error in _type_errors(row)]
    return "; ".join(errors) or None


def vars_of(command: Any) -> dict[str, Any]:
    return {slot: getattr(command, slot) for slot in type(command).__slots__}


def check(lines: list[str]) -> dict[str, Any]:
    by_stream: dict[str, int] = {}
    failures = []
    for line in lines:
        error = _check_line(line, by_stream)
        if error is not None:
            failures.append({"line": line, "error": error})
    return {"checked": len(lines), "by_stream": by_stream, "failures": failures}


def _row_tuple(row: Any) -> tuple[Any, ...]:
    return attr.astuple(row, recurse=False)


def produce() -> list[str]:
    """RDATA lines for every stream streamrep shares with the reference."""
    rows: list[tuple[str, int, Any]] = []
    ev = EventsStreamEventRow
    state = EventsStreamCurrentStateRow
    state_all = TypeToRow["state-all"]
    events = [
        ev("$a:hs", "!r:hs", "m.room.message", None, None, None, None, False, False),
        ev("$b:hs", "!r:hs", "m.room.member", "@u:hs", None, None, "join", False, False),
        ev("$c:hs", "!r:hs", "m.room.redaction", None, "$a:hs", None, None, False, False),
        ev("$d:hs", "!r:hs", "m.reaction", None, None, "$a:hs", None, True, True),
        state("!r:hs", "m.room.member", "@u:hs", "$b:hs"),
        state("!r:hs", "m.room.topic", "", None),
        state_all("!r:hs"),
    ]
    for token, row in enumerate(events, start=1):
        rows.append(("events", token, (row.TypeId, _row_tuple(row))))
    samples = {
        "backfill": [("$old:hs", "!r:hs", "m.room.member", "@u:hs", None, None),
                     ("$old2:hs", "!r:hs", "m.room.message", None, None, "$old:hs")],
        "caches": [("get_user_by_id", ["@u:hs"], 1700000000000),
                   ("cs_cache_fake", ["!r:hs", "@u:hs"], 1700000000001),
                   ("get_event", None, 1700000000002)],
        "account_data": [("@u:hs", None, "m.push_rules"),
                         ("@u:hs", "!r:hs", "m.fully_read")],
        "to_device": [("@u:hs",), ("remote.example",)],
        "receipts": [("!r:hs", "m.read", "@u:hs", "$a:hs", None, {"ts": 1700000000000}),
                     ("!r:hs", "m.read.private", "@u:hs", "$b:hs", "$a:hs", {})],
        "typing": [("!r:hs", ["@u:hs", "@v:hs"]), ("!r:hs", [])],
    }
    for name, values in samples.items():
        row_type = STREAMS_MAP[name].ROW_TYPE
        for token, value in enumerate(values, start=1):
            rows.append((name, token, _row_tuple(row_type(*value))))
    return [f"RDATA {RdataCommand(name, 'reference', token, row).to_line()}"
            for name, token, row in rows]


def _declared(row_type: Any) -> list[list[str]]:
    return [[field.name, "|".join(_alternatives(field.type))] for field in attr.fields(row_type)]


def fields() -> dict[str, Any]:
    """Each stream's row fields as the reference declares them: ``{stream: [[name,
    type], ...]}``, and for ``events`` ``{"events": {kind: [[name, type], ...]}}``."""
    out: dict[str, Any] = {name: _declared(stream.ROW_TYPE)
                           for name, stream in STREAMS_MAP.items() if stream.ROW_TYPE is not None}
    out["events"] = {kind: _declared(row) for kind, row in TypeToRow.items()}
    # The names of a tagged row's two parts: the kind, and the data of that kind.
    out["events/row"] = [field.name for field in attr.fields(EventsStreamRow)]
    return out


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode == "check":
        lines = [line.rstrip("\r\n") for line in sys.stdin if line.strip()]
        json.dump(check(lines), sys.stdout)
        return 0
    if mode == "fields":
        json.dump(fields(), sys.stdout)
        return 0
    if mode == "produce":
        sys.stdout.write("".join(line + "\n" for line in produce()))
        return 0
    sys.stderr.write("usage: reference_oracle.py check|fields|produce\n")
    return 2


if __name__ == "__main__":
    sys.exit(main())

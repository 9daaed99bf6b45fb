"""The declared command set (``streamrep.wire_commands``) against everything that
describes the commands again: the compiled parser, its twin, the ``.pyi`` stub,
the compiled source's command enum and docs/wire-protocol.md. Any disagreement in
names, arities, fields or senders fails here, naming what differs."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import ModuleType

import pytest

from streamrep.errors import MalformedCommandError, ProtocolError
from streamrep.wire_commands import (
    CLIENT_SIDE,
    COMMAND_SET,
    SERVER_SIDE,
    SPECS,
    CommandSpec,
    accepted_from,
    command_table,
)
from support.impls import core_module

ROOT = Path(__file__).resolve().parent.parent

# One valid spelling of each argument kind; JSON payloads depend on the command.
_EXAMPLES = {
    "word": "w1",
    "text": "some text",
    "int": "42",
    "token": "7",
    "device": "None",
    "sync_state": "start",
    "stream_or_all": "ALL",
    "int_or_now": "NOW",
}
_JSON = {
    "RDATA": '["get_user_by_id",["@a:x"],1]',
    "USER_IP": '["tok","10.0.0.1","agent",null,5]',
    "LOCK_RELEASED": '["w1","lock","key"]',
}


def _line(spec: CommandSpec, shape: tuple[object, ...]) -> str:
    words = [_JSON[spec.name] if arg.kind == "json" else _EXAMPLES[arg.kind]  # type: ignore[attr-defined]
             for arg in shape]
    return " ".join([spec.name, *words])


@pytest.fixture
def wire(impl_kind: str) -> ModuleType:
    return core_module("wire", impl_kind)


def test_commands_and_fields_match_the_declaration(wire: ModuleType) -> None:
    assert list(wire.COMMANDS) == [spec.name for spec in COMMAND_SET]
    for spec in COMMAND_SET:
        assert wire.COMMANDS[spec.name].FIELDS == spec.fields, spec.name
        assert wire.COMMANDS[spec.name].NAME == spec.name


@pytest.mark.parametrize("spec", COMMAND_SET, ids=lambda s: s.name)
def test_every_declared_shape_parses_and_round_trips(wire: ModuleType, spec: CommandSpec) -> None:
    for shape in spec.shapes:
        line = _line(spec, shape)
        command = wire.parse_line(line)
        assert command.NAME == spec.name
        assert command.to_line() == line


_COUNTED = [spec for spec in COMMAND_SET if not all(shape and shape[-1].kind == "text" for shape in spec.shapes)]


@pytest.mark.parametrize("spec", _COUNTED, ids=lambda s: s.name)
def test_arity_is_enforced_as_declared(wire: ModuleType, spec: CommandSpec) -> None:
    # One argument fewer is refused (a "text" argument may be empty, so those
    # commands take any count); one more is refused unless the last argument
    # takes the rest of the line.
    arities = set(spec.arities)
    checked = 0
    for shape in spec.shapes:
        words = _line(spec, shape).split(" ", len(shape))[1:]
        wrong = []
        if len(shape) - 1 >= 0 and len(shape) - 1 not in arities:
            wrong.append(words[:-1])
        if not spec.rest_of_line and len(shape) + 1 not in arities:
            wrong.append([*words, "9"])
        for args in wrong:
            with pytest.raises(MalformedCommandError):
                wire.parse_line(" ".join([spec.name, *args]))
            checked += 1
    assert checked


def test_an_undeclared_command_is_unknown(wire: ModuleType) -> None:
    with pytest.raises(ProtocolError):
        wire.parse_line("NOT_DECLARED x")


def test_command_table_refuses_a_drifted_implementation() -> None:
    pure = core_module("wire", "pure")
    classes = list(pure.COMMANDS.values())
    with pytest.raises(TypeError, match="missing"):
        command_table(classes[1:])

    class Renamed(pure.PingCommand):  # type: ignore[misc,name-defined]
        NAME = "PONG"
        FIELDS = ("data",)
    with pytest.raises(TypeError, match="undeclared"):
        command_table([*classes, Renamed])

    class Reshaped(pure.PingCommand):  # type: ignore[misc,name-defined]
        FIELDS = ("data", "extra")
    with pytest.raises(TypeError, match="PING: fields"):
        command_table([c for c in classes if c.NAME != "PING"] + [Reshaped])


def test_compiled_source_declares_every_command() -> None:
    source = (ROOT / "src" / "_core" / "wire.pyx").read_text()
    enum = re.search(r"cdef enum CommandKind:\n((?:    .*\n)+)", source)
    assert enum is not None
    members = re.findall(r"CMD_(\w+)", enum.group(1))
    assert [m for m in members if m != "UNKNOWN"] == [spec.name for spec in COMMAND_SET]
    kind = source[source.index("cdef CommandKind _kind("):source.index("return CMD_UNKNOWN")]
    matched = set(re.findall(r'memcmp\(p, b"(\w+)", (\d+)\) == 0:\n\s+return CMD_(\w+)', kind))
    assert {name for name, _, _ in matched} == set(SPECS)
    for name, length, member in matched:
        assert name == member and int(length) == len(name), name


def _stub_classes() -> dict[str, ast.ClassDef]:
    tree = ast.parse((ROOT / "src" / "_core" / "wire.pyi").read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _stub_init_fields(classes: dict[str, ast.ClassDef], name: str) -> tuple[str, ...]:
    node = classes[name]
    for item in node.body:
        if isinstance(item, ast.FunctionDef) and item.name == "__init__":
            return tuple(a.arg for a in item.args.args[1:])
    bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
    assert bases, f"{name} has no __init__ in the stub"
    return _stub_init_fields(classes, bases[0])


def test_stub_declares_every_command_with_its_fields() -> None:
    classes = _stub_classes()
    pure = core_module("wire", "pure")
    for spec in COMMAND_SET:
        class_name = pure.COMMANDS[spec.name].__name__
        assert class_name in classes, f"{class_name} missing from wire.pyi"
        assert _stub_init_fields(classes, class_name) == spec.fields, class_name


def test_documented_senders_match_the_declaration() -> None:
    text = (ROOT / "docs" / "wire-protocol.md").read_text()
    documented = {}
    for name, direction in re.findall(r"^\| `(\w+)` \| ([SC, ]+) \|", text, re.M):
        documented[name] = frozenset(
            {"S": SERVER_SIDE, "C": CLIENT_SIDE}[d.strip()] for d in direction.split(","))
    assert documented == {spec.name: spec.sent_by for spec in COMMAND_SET}


def test_accepted_from_each_side() -> None:
    assert "SERVER" in accepted_from(SERVER_SIDE) and "SERVER" not in accepted_from(CLIENT_SIDE)
    assert "NAME" in accepted_from(CLIENT_SIDE) and "NAME" not in accepted_from(SERVER_SIDE)
    assert accepted_from(SERVER_SIDE) | accepted_from(CLIENT_SIDE) == set(SPECS)
    with pytest.raises(ValueError):
        accepted_from("bystander")

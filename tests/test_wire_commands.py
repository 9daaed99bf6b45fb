"""The declared command set (``streamrep.wire_commands``) against everything that
describes the commands again: the compiled parser, its twin, the ``.pyi`` stub,
the compiled source's command enum, dispatch and classes, the facade and
docs/wire-protocol.md. Any disagreement in names, arities, fields or senders
fails here, naming what differs; a declared command with a piece missing fails
with the list of every missing piece (file and what to add)."""

from __future__ import annotations

import ast
import re
from dataclasses import replace
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


# --- every piece a declared command needs --------------------------------------------


def _class_name(name: str) -> str:
    """The class of command *name*: ``USER_IP`` -> ``UserIpCommand``."""
    return "".join(part.capitalize() for part in name.split("_")) + "Command"


def _module_classes(tree: ast.Module) -> dict[str, ast.ClassDef]:
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _declares_name(node: ast.ClassDef, name: str) -> bool:
    return any(isinstance(item, ast.Assign) and isinstance(item.value, ast.Constant)
               and item.value.value == name
               and any(isinstance(t, ast.Name) and t.id == "NAME" for t in item.targets)
               for item in node.body)


def _has_method(classes: dict[str, ast.ClassDef], class_name: str, method: str) -> bool:
    node = classes.get(class_name)
    if node is None:
        return False
    if any(isinstance(item, ast.FunctionDef) and item.name == method for item in node.body):
        return True
    return any(isinstance(b, ast.Name) and _has_method(classes, b.id, method) for b in node.bases)


def _names_in_call(tree: ast.Module, target: str) -> set[str]:
    """Names passed (in a tuple) to the call assigned to *target* (``COMMANDS = f((...))``)."""
    for node in tree.body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == target for t in targets) and value is not None:
            return {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
    return set()


def _all_names(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return {e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant)}
    return set()


def _pyx_function(source: str, signature: str) -> str:
    """The text of the top-level Cython function that starts with *signature*."""
    start = source.find(signature)
    if start < 0:
        return ""
    body = source.index("\n", start) + 1
    end = re.search(r"^\S", source[body:], re.M)
    return source[start:body + end.start()] if end else source[start:]


def _missing_in_core(spec: CommandSpec, source: str) -> list[str]:
    where = "src/_core/wire.pyx"
    cls = _class_name(spec.name)
    missing = []
    enum = re.search(r"cdef enum CommandKind:\n((?:    .*\n)+)", source)
    if enum is None or f"CMD_{spec.name}\n" not in enum.group(1):
        missing.append(f"{where}: a member CMD_{spec.name} of `cdef enum CommandKind`")
    kind = _pyx_function(source, "cdef CommandKind _kind(")
    if not re.search(rf'memcmp\(p, b"{spec.name}", {len(spec.name)}\) == 0:\n\s+return CMD_{spec.name}\n',
                     kind):
        missing.append(f'{where}: a match of b"{spec.name}" returning CMD_{spec.name} in _kind() '
                       f"(under `n == {len(spec.name)}`)")
    body = re.search(rf"^cdef class {cls}\(\w+\):\n((?:(?:    .*)?\n)+)", source, re.M)
    if body is None or f'    NAME = "{spec.name}"' not in body.group(1):
        missing.append(f'{where}: `cdef class {cls}` with NAME = "{spec.name}" and FIELDS = {spec.fields}')
    if not re.search(rf"kind == CMD_{spec.name}\b", _pyx_function(source, "cdef object _parse(const")):
        missing.append(f"{where}: a branch for CMD_{spec.name} in _parse() calling its parse helper")
    table = re.search(r"^COMMANDS = command_table\(\((.*?)\)\)", source, re.M | re.S)
    if table is None or not re.search(rf"\b{cls}\b", table.group(1)):
        missing.append(f"{where}: {cls} in the COMMANDS table")
    return missing


def _missing_in_twin(spec: CommandSpec, tree: ast.Module) -> list[str]:
    where = "src/streamrep/_pure/wire.py"
    cls = _class_name(spec.name)
    classes = _module_classes(tree)
    missing = []
    if cls not in classes or not _declares_name(classes[cls], spec.name):
        missing.append(f'{where}: class {cls} with NAME = "{spec.name}" and FIELDS = {spec.fields}')
    elif not _has_method(classes, cls, "_parse"):
        missing.append(f"{where}: {cls}._parse (a classmethod parsing the arguments)")
    if cls not in _names_in_call(tree, "COMMANDS"):
        missing.append(f"{where}: {cls} in the COMMANDS table")
    if cls not in _all_names(tree):
        missing.append(f"{where}: {cls} in __all__")
    return missing


def _missing_in_stub_and_facade(spec: CommandSpec, stub: ast.Module,
                                facade: ast.Module) -> list[str]:
    cls = _class_name(spec.name)
    missing = []
    classes = _module_classes(stub)
    if cls not in classes:
        missing.append(f"src/_core/wire.pyi: class {cls} with __init__{spec.fields}")
    elif _stub_init_fields(classes, cls) != spec.fields:
        missing.append(f"src/_core/wire.pyi: {cls}.__init__ taking {spec.fields}")
    assigned = {t.id for node in facade.body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    if cls not in assigned or cls not in _all_names(facade):
        missing.append(f"src/streamrep/wire.py: `{cls} = _core_wire.{cls}` and {cls} in __all__")
    return missing


def _missing_in_docs(spec: CommandSpec, text: str) -> list[str]:
    sides = " and ".join(sorted("S" if s == SERVER_SIDE else "C" for s in spec.sent_by))
    if not re.search(rf"^\| `{spec.name}` \| [SC, ]+ \|", text, re.M):
        return [f"docs/wire-protocol.md: a row `| `{spec.name}` | <senders: {sides}> | "
                "<arguments> | <fields> |` in the command table"]
    return []


def missing_pieces(specs: tuple[CommandSpec, ...]) -> list[str]:
    """Every piece a command of *specs* lacks, one line each naming file and piece."""
    core = (ROOT / "src" / "_core" / "wire.pyx").read_text()
    twin = ast.parse((ROOT / "src" / "streamrep" / "_pure" / "wire.py").read_text())
    stub = ast.parse((ROOT / "src" / "_core" / "wire.pyi").read_text())
    facade = ast.parse((ROOT / "src" / "streamrep" / "wire.py").read_text())
    docs = (ROOT / "docs" / "wire-protocol.md").read_text()
    missing = []
    for spec in specs:
        for piece in (_missing_in_core(spec, core) + _missing_in_twin(spec, twin)
                      + _missing_in_stub_and_facade(spec, stub, facade)
                      + _missing_in_docs(spec, docs)):
            missing.append(f"{spec.name}: {piece}")
    return missing


def test_every_declared_command_has_every_piece() -> None:
    missing = missing_pieces(COMMAND_SET)
    assert not missing, "declared commands lack pieces:\n" + "\n".join(missing)


def test_a_command_declared_alone_is_named_with_every_missing_piece() -> None:
    # As if someone declared a command in wire_commands.py and nothing else.
    ping = SPECS["PING"]
    added = replace(ping, name="WAVE_HELLO", fields=("data",))
    missing = missing_pieces((*COMMAND_SET, added))
    assert all(line.startswith("WAVE_HELLO: ") for line in missing)
    files = [line.split(": ")[1] for line in missing]
    assert files.count("src/_core/wire.pyx") == 5
    assert files.count("src/streamrep/_pure/wire.py") == 3
    assert {"src/_core/wire.pyi", "src/streamrep/wire.py",
            "docs/wire-protocol.md"} <= set(files)
    assert any("WaveHelloCommand" in line for line in missing)
    assert len(missing) == 11

"""The ``.pyi`` stubs, the compiled core modules and their pure twins agree on every
public signature.

For each core module the three descriptions are reduced to the same shape, then
compared: every public function, class and constant the stub declares; each class's
constructor, public methods (with ``__len__``, ``__iter__`` and the other special
methods a stub lists) and properties; each callable's parameters with their names,
kinds and defaults. Types are not compared (mypy checks the stubs against their
use; the twins are tested against each other for behaviour).

* Stubs are parsed with :mod:`ast`.
* Twins are read with :mod:`inspect`.
* Compiled modules are built with ``embedsignature=True``: every function's and
  method's docstring starts with its signature, C types included, which is parsed
  here. A class's docstring starts with its constructor's signature.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

from streamrep import _impl

# Compares the compiled core with the stubs and twins: the compiled run's business.
pytestmark = pytest.mark.compiled_vs_pure

P = inspect.Parameter
KIND_NAMES = {P.POSITIONAL_ONLY: "positional-only", P.POSITIONAL_OR_KEYWORD: "positional",
              P.VAR_POSITIONAL: "*args", P.KEYWORD_ONLY: "keyword-only",
              P.VAR_KEYWORD: "**kwargs"}

#: A default that is present but has no value to compare: ``...`` in a stub, a
#: private sentinel in an implementation.
UNSPECIFIED = "<some default>"
NO_DEFAULT = "<no default>"


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    default: str = NO_DEFAULT

    def __str__(self) -> str:
        default = "" if self.default == NO_DEFAULT else f"={self.default}"
        return f"{self.name}{default} ({self.kind})"


Signature = tuple[Param, ...]

#: A special method of a compiled class (a C slot): present, signature not embedded.
SLOT = (Param("<slot>", "any"),)


@dataclass
class ClassShape:
    init: Signature | None
    methods: dict[str, Signature]
    properties: set[str]


@dataclass
class ModuleShape:
    functions: dict[str, Signature]
    classes: dict[str, ClassShape]
    others: set[str]


def _value(text: str) -> str:
    """A default's canonical text: the repr of a literal, else UNSPECIFIED."""
    if text == "...":
        return UNSPECIFIED
    try:
        return repr(ast.literal_eval(text))
    except (ValueError, SyntaxError):
        return UNSPECIFIED


def _agree(a: Signature | None, b: Signature | None) -> bool:
    """Same names, kinds and defaults; a default without a value to compare
    (UNSPECIFIED) agrees with any default but not with none."""
    if a is None or b is None:
        return a is b
    if a == SLOT or b == SLOT:
        return True
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if (x.name, x.kind) != (y.name, y.kind):
            return False
        if x.default != y.default and (
                NO_DEFAULT in (x.default, y.default)
                or UNSPECIFIED not in (x.default, y.default)):
            return False
    return True


def _default_of_value(value: Any) -> str:
    if value is P.empty:
        return NO_DEFAULT
    try:
        if ast.literal_eval(repr(value)) == value:
            return repr(value)
    except (ValueError, SyntaxError):
        pass
    return UNSPECIFIED


# -- the stub --------------------------------------------------------------------------


def _stub_signature(node: ast.FunctionDef) -> Signature:
    a = node.args
    out: list[Param] = []
    positional = [*a.posonlyargs, *a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = P.POSITIONAL_ONLY if i < len(a.posonlyargs) else P.POSITIONAL_OR_KEYWORD
        out.append(Param(arg.arg, KIND_NAMES[kind],
                         NO_DEFAULT if default is None else _value(ast.unparse(default))))
    if a.vararg:
        out.append(Param(a.vararg.arg, KIND_NAMES[P.VAR_POSITIONAL]))
    for arg, kw_default in zip(a.kwonlyargs, a.kw_defaults):
        out.append(Param(arg.arg, KIND_NAMES[P.KEYWORD_ONLY],
                         NO_DEFAULT if kw_default is None else _value(ast.unparse(kw_default))))
    if a.kwarg:
        out.append(Param(a.kwarg.arg, KIND_NAMES[P.VAR_KEYWORD]))
    return tuple(out)


def _decorators(node: ast.FunctionDef) -> set[str]:
    return {ast.unparse(d) for d in node.decorator_list}


def _is_public(name: str) -> bool:
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def _stub_shape(path: Path) -> ModuleShape:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    exported: set[str] = set()
    classes: dict[str, ast.ClassDef] = {}
    functions: dict[str, Signature] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            exported = set(ast.literal_eval(node.value))
        elif isinstance(node, ast.ClassDef):
            classes[node.name] = node
        elif isinstance(node, ast.FunctionDef):
            functions[node.name] = _stub_signature(node)

    def class_shape(name: str) -> ClassShape:
        node = classes[name]
        base = ClassShape((), {}, set())  # no __init__: object's, which takes nothing
        for b in node.bases:  # bases declared in the stub itself (private ones included)
            if isinstance(b, ast.Name) and b.id in classes:
                inherited = class_shape(b.id)
                base = ClassShape(inherited.init, dict(inherited.methods),
                                  set(inherited.properties))
        for item in node.body:
            if isinstance(item, ast.FunctionDef):
                decorators = _decorators(item)
                if "property" in decorators:
                    base.properties.add(item.name)
                elif item.name == "__init__":
                    base.init = _stub_signature(item)[1:]  # without self
                elif _is_public(item.name) and not any(d.endswith(".setter") for d in decorators):
                    base.methods[item.name] = _stub_signature(item)
            elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                if _is_public(item.target.id):
                    base.properties.add(item.target.id)
        return base

    return ModuleShape(
        functions={n: s for n, s in functions.items() if n in exported},
        classes={n: class_shape(n) for n in classes if n in exported},
        others=exported - set(functions) - set(classes))


# -- the twin ----------------------------------------------------------------------------


def _inspect_signature(obj: Any, drop_first: bool = False) -> Signature:
    params = list(inspect.signature(obj).parameters.values())
    if drop_first:
        params = params[1:]
    return tuple(Param(p.name, KIND_NAMES[p.kind], _default_of_value(p.default))
                 for p in params)


def _class_members(cls: type) -> Iterator[tuple[str, Any]]:
    """Public members of *cls* and its bases (not ``object``'s), nearest first."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if klass is object:
            continue
        for name, value in vars(klass).items():
            if name not in seen and _is_public(name):
                seen.add(name)
                yield name, value


_COMPARED_SPECIAL = {"__len__", "__iter__", "__contains__", "__getitem__", "__eq__",
                     "__hash__", "__call__", "__enter__", "__exit__", "__bool__"}


def _wanted(name: str) -> bool:
    return not name.startswith("__") or name in _COMPARED_SPECIAL


def _instance_attributes(cls: type) -> set[str]:
    """Public attributes the ``__init__`` of *cls* or its bases assigns (``self.x = ...``)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if klass is object or not inspect.isfunction(init):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(init)))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id == "self" and not target.attr.startswith("_"):
                    names.add(target.attr)
    return names


def _pure_class(cls: type) -> ClassShape:
    shape = ClassShape(_inspect_signature(cls), {}, _instance_attributes(cls))
    for name, value in _class_members(cls):
        if isinstance(value, property) or inspect.ismemberdescriptor(value):
            shape.properties.add(name)  # a property, or a public slot
        elif isinstance(value, (staticmethod, classmethod)):
            if _wanted(name):
                shape.methods[name] = _inspect_signature(value.__func__)
        elif inspect.isfunction(value):
            if _wanted(name) and name != "__init__":
                shape.methods[name] = _inspect_signature(value)
        elif not name.startswith("__"):
            shape.properties.add(name)  # a class attribute (NAME, FIELDS, ...)
    return shape


def _pure_shape(module: ModuleType) -> ModuleShape:
    shape = ModuleShape({}, {}, set())
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isclass(value):
            shape.classes[name] = _pure_class(value)
        elif callable(value):
            shape.functions[name] = _inspect_signature(value)
        else:
            shape.others.add(name)
    return shape


# -- the compiled module -------------------------------------------------------------------

_SIGNATURE_LINE = re.compile(r"^(?:[\w.]+\.)?(?P<name>\w+)\((?P<params>.*)\)(?:\s*->.*)?$")


def _split_top_level(text: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def _embedded_signature(obj: Any, name: str, constructor: bool = False) -> Signature | None:
    """The signature Cython embedded in *obj*'s docstring, or None if there is none.

    A parameter reads ``[C type ]name[=default]``. For a constructor (the class's
    docstring, where ``self`` is hidden) Cython places the ``*`` and ``/`` markers
    one parameter late, as it counts the hidden ``self``; they are moved back here."""
    first = (getattr(obj, "__doc__", None) or "").split("\n", 1)[0].strip()
    match = _SIGNATURE_LINE.match(first)
    if match is None or match["name"] != name:
        return None
    items = _split_top_level(match["params"])
    if constructor:
        for marker_index, item in enumerate(list(items)):
            if (item == "/" or item.startswith("*") and not item.startswith("**")) \
                    and marker_index > 0:
                items[marker_index - 1], items[marker_index] = item, items[marker_index - 1]
    out: list[Param] = []
    kind: inspect._ParameterKind = P.POSITIONAL_OR_KEYWORD
    for item in items:
        if item == "/":
            out = [Param(p.name, KIND_NAMES[P.POSITIONAL_ONLY], p.default) for p in out]
            continue
        if item == "*":
            kind = P.KEYWORD_ONLY
            continue
        if item.startswith("**"):
            out.append(Param(item[2:].split()[-1], KIND_NAMES[P.VAR_KEYWORD]))
            continue
        if item.startswith("*"):
            out.append(Param(item[1:].split()[-1], KIND_NAMES[P.VAR_POSITIONAL]))
            kind = P.KEYWORD_ONLY
            continue
        declaration, equals, default = item.partition("=")
        pname = re.findall(r"\w+", declaration)[-1]
        out.append(Param(pname, KIND_NAMES[kind],
                         _compiled_default(obj, default.strip()) if equals else NO_DEFAULT))
    return tuple(out)


def _compiled_default(obj: Any, text: str) -> str:
    value = _value(text)
    if value != UNSPECIFIED:
        return value
    module = inspect.getmodule(obj) or __import__(getattr(obj, "__module__", "builtins"),
                                                  fromlist=["_"])
    if re.fullmatch(r"[A-Z]\w*", text) and hasattr(module, text):  # a public constant
        return _default_of_value(getattr(module, text))
    return UNSPECIFIED


def _compiled_class(cls: type) -> ClassShape:
    # The nearest class whose docstring has a constructor; none: a class without
    # __init__, whose constructor takes nothing.
    init: Signature = ()
    for klass in cls.__mro__:
        if klass is object:
            break
        found = _embedded_signature(klass, klass.__name__, constructor=True)
        if found is not None:
            init = found
            break
    shape = ClassShape(init, {}, set())
    for name, value in _class_members(cls):
        if inspect.isgetsetdescriptor(value) or inspect.ismemberdescriptor(value) or \
                isinstance(value, property):
            shape.properties.add(name)
        elif callable(value) or isinstance(value, (staticmethod, classmethod)):
            if _wanted(name) and name != "__init__":
                target = value.__func__ if isinstance(value, (staticmethod, classmethod)) \
                    else value
                signature = _embedded_signature(target, name)
                if signature is None:
                    signature = SLOT if name.startswith("__") else (
                        Param("<no embedded signature>", "?"),)
                shape.methods[name] = signature
        elif not name.startswith("__"):
            shape.properties.add(name)
    return shape


def _compiled_shape(module: ModuleType) -> ModuleShape:
    shape = ModuleShape({}, {}, set())
    for name in module.__all__:
        value = getattr(module, name)
        if inspect.isclass(value):
            shape.classes[name] = _compiled_class(value)
        elif callable(value):
            shape.functions[name] = _embedded_signature(value, name) or (
                Param("<no embedded signature>", "?"),)
        else:
            shape.others.add(name)
    return shape


# -- comparing -------------------------------------------------------------------------------


def _describe(signature: Signature | None) -> str:
    return "(not found)" if signature is None else "(" + ", ".join(map(str, signature)) + ")"


def _differences(stub: ModuleShape, impl: ModuleShape, what: str) -> list[str]:
    """How *impl* (``compiled`` or ``pure``) differs from the stub, one line each.

    Special methods the stub does not list are not compared (every class has some)."""
    out: list[str] = []
    for kind, a, b in (("functions", stub.functions, impl.functions),
                       ("classes", stub.classes, impl.classes)):
        for name in sorted(set(a) ^ set(b)):
            where = f"the stub, not {what}" if name in a else f"{what}, not the stub"
            out.append(f"{name}: a {kind[:-1]} only in {where}")
    for name in sorted(stub.others ^ impl.others):
        out.append(f"{name}: declared as a constant in one and not the other")
    for name in sorted(set(stub.functions) & set(impl.functions)):
        if not _agree(stub.functions[name], impl.functions[name]):
            out.append(f"{name}{_describe(stub.functions[name])} in the stub, "
                       f"{_describe(impl.functions[name])} in {what}")
    for cname in sorted(set(stub.classes) & set(impl.classes)):
        s, i = stub.classes[cname], impl.classes[cname]
        if not _agree(s.init, i.init):
            out.append(f"{cname}{_describe(s.init)} in the stub, {_describe(i.init)} in {what}")
        stub_methods = set(s.methods)
        impl_methods = {m for m in i.methods if not m.startswith("__") or m in stub_methods}
        for m in sorted(stub_methods ^ impl_methods):
            where = f"the stub, not {what}" if m in stub_methods else f"{what}, not the stub"
            out.append(f"{cname}.{m}: a method only in {where}")
        for m in sorted(stub_methods & impl_methods):
            if not _agree(s.methods[m], i.methods[m]):
                out.append(f"{cname}.{m}{_describe(s.methods[m])} in the stub, "
                           f"{_describe(i.methods[m])} in {what}")
        for p in sorted(s.properties ^ i.properties):
            where = f"the stub, not {what}" if p in s.properties else f"{what}, not the stub"
            out.append(f"{cname}.{p}: an attribute only in {where}")
    return out


def _stub_path(name: str) -> Path:
    import streamrep._core

    return Path(streamrep._core.__file__).parent / f"{name}.pyi"


@pytest.mark.parametrize("name", _impl.CORE_MODULES)
def test_stub_compiled_and_twin_agree(name: str) -> None:
    stub = _stub_shape(_stub_path(name))
    problems = [*_differences(stub, _compiled_shape(_impl.load_compiled(name)), "compiled"),
                *_differences(stub, _pure_shape(_impl.load_pure(name)), "pure")]
    assert not problems, f"streamrep._core.{name}: the stub, compiled module and twin " \
        "disagree:\n  " + "\n  ".join(problems)


def test_embedded_signatures_are_read() -> None:
    """The parser reads what Cython embeds, markers of a constructor included."""
    class Fake:
        """Fake(str stream_name, token, row=_MISSING, row_json=None, *)

        Text."""

    assert _embedded_signature(Fake, "Fake", constructor=True) == (
        Param("stream_name", "positional"), Param("token", "positional"),
        Param("row", "positional", UNSPECIFIED),
        Param("row_json", "keyword-only", "None"))

    def expand(group_ids: Any, wanted: Any = None) -> None:
        """expand(const int64_t[::1] group_ids, Py_ssize_t max_size=10000, *args, **kw) -> int"""

    assert _embedded_signature(expand, "expand") == (
        Param("group_ids", "positional"), Param("max_size", "positional", "10000"),
        Param("args", "*args"), Param("kw", "**kwargs"))

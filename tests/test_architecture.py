"""docs/architecture.md against the code: every module it names exists, every package
is named, and the imports of ``src/streamrep`` follow its layers with no circle,
neither between modules (inside a package too) nor between top-level packages.

The import graph is read from the sources (every ``import``, inside functions and
``TYPE_CHECKING`` blocks too), so it shows what a reader of the code sees.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "streamrep"
CORE = ROOT / "src" / "_core"
DOC = ROOT / "docs" / "architecture.md"

def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _packages() -> list[str]:
    names = [".".join(p.parent.relative_to(SRC.parent).parts) for p in SRC.rglob("__init__.py")]
    return sorted(names + ["streamrep._core"])


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of the package that module *name* imports."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {target for target in found if target in modules and target != name}


def _graph(node: Callable[[str], str] = lambda module: module) -> dict[str, set[str]]:
    """Who imports whom, each module counted as the node *node* names (itself by
    default)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(node(name), set())
        edges.update(node(t) for t in _imports(name, path, modules))
        edges.discard(node(name))
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of *graph* (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_one_circle(graph, set(group)) for group in groups]


def _one_circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A path that leaves the group's first member and comes back to it."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        node = queue.pop(0)
        for target in sorted(graph[node] & group):
            if target == start:
                return paths[node] + [start]
            if target not in paths:
                paths[target] = paths[node] + [target]
                queue.append(target)
    raise AssertionError(f"no circle through {start}")


def _doc() -> str:
    return DOC.read_text()


def _layers() -> dict[str, int]:
    """Package or top-level module -> its layer, from the doc's Layers table."""
    text = _doc()
    section = text[text.index("## Layers"):]
    section = section[:section.index("\n## ", 1)]
    layers = {}
    for number, names in re.findall(r"^\| (\d+) \| ([^|]+) \|", section, re.M):
        for name in re.findall(r"`(streamrep[\w.]*)`", names):
            layers[name] = int(number)
    return layers


def _unit(module: str) -> str:
    """The layered unit of *module*: ``streamrep`` or ``streamrep.<top>``."""
    return ".".join(module.split(".")[:2])


def test_every_module_it_names_exists() -> None:
    modules = set(_modules()) | {"streamrep._core"}
    text = _doc()
    named = set(re.findall(r"`(streamrep(?:\.\w+)*)`", text))
    core_files = set(re.findall(r"`(src/_core/\w+\.pyx)`", text))
    missing = sorted(n for n in named if n not in modules and not (
        n.startswith("streamrep._core.") and (CORE / (n.rpartition(".")[2] + ".pyx")).exists()))
    missing += sorted(f for f in core_files if not (ROOT / f).exists())
    cores = set(re.findall(r"cores? ((?:`\w+`(?:, )?)+)", text))
    for group in cores:
        missing += [f"core {c}" for c in re.findall(r"`(\w+)`", group)
                    if not (CORE / f"{c}.pyx").exists()]
    assert not missing, f"docs/architecture.md names what does not exist: {missing}"


def test_every_package_is_named() -> None:
    text = _doc()
    unnamed = [p for p in _packages() if f"`{p}`" not in text]
    assert not unnamed, f"docs/architecture.md does not name these packages: {unnamed}"


def test_every_top_level_module_has_a_layer() -> None:
    layers = _layers()
    units = {_unit(m) for m in _modules()} | {"streamrep._core"}
    assert not sorted(units - set(layers)), (
        f"in no layer of docs/architecture.md: {sorted(units - set(layers))}")
    assert not sorted(set(layers) - units), (
        f"docs/architecture.md layers name what does not exist: {sorted(set(layers) - units)}")


def test_no_import_goes_back_up() -> None:
    layers = _layers()
    modules = _modules()
    upward = []
    for name, path in sorted(modules.items()):
        for target in sorted(_imports(name, path, modules)):
            source_layer, target_layer = layers.get(_unit(name)), layers.get(_unit(target))
            if source_layer is not None and target_layer is not None \
                    and target_layer < source_layer:
                upward.append(f"{name} (layer {source_layer}) imports {target} "
                              f"(layer {target_layer})")
    assert not upward, "imports back up the layers of docs/architecture.md:\n" + "\n".join(upward)


def test_no_import_circle() -> None:
    circles = [" -> ".join(c) for c in _circles(_graph())]
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_no_circle_between_packages() -> None:
    # Modules of two packages may each import the other's without a module circle;
    # the packages would still lean on each other.
    circles = [" -> ".join(c) for c in _circles(_graph(_unit))]
    assert not circles, "import circles between packages:\n" + "\n".join(circles)


def test_a_circle_is_named() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _circles(graph) == [["a", "b", "c", "a"]]
    assert _circles({"a": {"b"}, "b": set()}) == []

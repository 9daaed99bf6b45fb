"""No function in ``src/streamrep`` over 100 lines, and no kernel of the compiled core
(``src/_core/*.pyx``) over 150: a longer one is split into helpers named for its
phases. The test lists every function over its bound, file and line."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON_LIMIT = 100
KERNEL_LIMIT = 150


_KERNEL = re.compile(
    r"^(?P<indent>\s*)(?:cpdef|cdef|def)\s+"
    r"(?!(?:class|enum|extern|struct|union|packed|public|readonly|fused)\b)"
    r"[^=(]*?\b(?P<name>\w+)\s*\(")


def python_functions(path: Path) -> list[tuple[str, int, int]]:
    """``(name, first line, length)`` of every function and method in *path*."""
    tree = ast.parse(path.read_text(), str(path))
    return [(node.name, node.lineno, node.end_lineno - node.lineno + 1)  # type: ignore[operator]
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def kernel_functions(path: Path) -> list[tuple[str, int, int]]:
    """``(name, first line, length)`` of every ``def``/``cdef``/``cpdef`` function of a
    ``.pyx`` file: from its signature to its last line before the indentation falls
    back to the signature's."""
    lines = path.read_text().splitlines()
    found = []
    for start, line in enumerate(lines):
        match = _KERNEL.match(line)
        if match is None:
            continue
        indent = len(match["indent"])
        end = start + 1
        while end < len(lines):
            text = lines[end]
            if text.strip() and not text.lstrip().startswith("#") and \
                    len(text) - len(text.lstrip()) <= indent and not text.lstrip().startswith(")"):
                break
            end += 1
        while end > start + 1 and not lines[end - 1].strip():
            end -= 1
        found.append((match["name"], start + 1, end - start))
    return found


def _too_long() -> list[str]:
    found = []
    for path in sorted((ROOT / "src" / "streamrep").rglob("*.py")):
        for name, line, length in python_functions(path):
            if length > PYTHON_LIMIT:
                found.append((path, name, line, length))
    for path in sorted((ROOT / "src" / "_core").glob("*.pyx")):
        for name, line, length in kernel_functions(path):
            if length > KERNEL_LIMIT:
                found.append((path, name, line, length))
    return [f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
            for path, name, line, length in found]


def test_no_function_over_its_bound() -> None:
    long = _too_long()
    assert not long, (f"functions over {PYTHON_LIMIT} lines (.py) or {KERNEL_LIMIT} lines "
                      "(.pyx): split them into helpers named for their phases:\n"
                      + "\n".join(long))


def test_the_kernel_scanner_measures_cdef_functions(tmp_path: Path) -> None:
    source = tmp_path / "k.pyx"
    source.write_text(
        "cdef class C:\n    cdef int x\n\n"
        "cdef inline object _f(const char* p,\n                      Py_ssize_t n):\n"
        "    # one\n    if n:\n        return None\n\n    return p\n\n"
        "cdef object _loads = None\n"
        "def g():\n    pass\n")
    assert kernel_functions(source) == [("_f", 4, 7), ("g", 13, 2)]

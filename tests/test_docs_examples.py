"""Every example in docs/*.md runs (the convention is described in docs/index.md).

* ```` ```python ```` blocks run, in order, in one interpreter per page (a page's
  blocks share their globals) with a fresh temporary working directory.
  ```` ```python fragment ```` blocks are only compiled: illustrations that need a
  deployment (a PostgreSQL server on another host, a running hub).
* ```` ```console ```` blocks: each ``$ streamrep ...`` line runs in the page's
  working directory (where ``docs/examples/`` is available under the same path);
  the lines after it are expected output, matched in order as whole lines, with
  ``...`` standing for any text. The info string ``exit=N`` gives the expected
  status of every command in the block (default 0). ```` ```console fragment ````
  blocks are not run (long-running commands such as ``serve``).
* ```` ```yaml ```` blocks are streamrep configuration files: the configuration
  loader must accept them. ```` ```yaml fragment ```` blocks must parse as YAML.
* ``docs/examples/*.yaml`` files must load too, and ``docs/examples/invalid/*.yaml``
  (examples of mistakes) must be refused.
* Relative links between pages resolve, anchors included.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest
import yaml

from streamrep.catalogue import known_streams
from streamrep.config import load_config
from streamrep.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^\n`]*)\n(?P<body>.*?)^(?P=indent)```\s*$",
                   re.S | re.M)


@dataclass
class Block:
    page: pathlib.Path
    line: int
    lang: str
    options: tuple[str, ...]
    body: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def fragment(self) -> bool:
        return "fragment" in self.options


def blocks_of(page: pathlib.Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        words = match.group("info").split()
        if not words:
            continue
        body = textwrap.dedent(match.group("body"))
        line = text.count("\n", 0, match.start()) + 1
        found.append(Block(page, line, words[0].lower(), tuple(words[1:]), body))
    return found


PAGES = sorted(DOCS.glob("*.md"))
ALL_BLOCKS = [block for page in PAGES for block in blocks_of(page)]


def ids(blocks: list[Block]) -> list[str]:
    return [block.where for block in blocks]


def page_workdir(tmp_path: pathlib.Path) -> pathlib.Path:
    work = tmp_path / "work"
    shutil.copytree(DOCS / "examples", work / "docs" / "examples")
    return work


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("STREAMREP_CONFIG", None)
    # The examples run against the installed package, as a user would run them.
    return env


# --- python ----------------------------------------------------------------------

PYTHON_PAGES = [page for page in PAGES
                if any(b.lang == "python" and not b.fragment for b in blocks_of(page))]

RUNNER = """
import sys, traceback
blocks = {blocks!r}
namespace = {{"__name__": "__docs__"}}
for where, source in blocks:
    try:
        exec(compile(source, where, "exec"), namespace)
    except BaseException:
        print(f"example at {{where}} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def uses_spark(page: pathlib.Path) -> bool:
    """Whether the page's examples start Spark (they then need Java, and minutes: a
    local-cluster start and its first jobs take several on a busy machine)."""
    return any("pyspark" in b.body for b in blocks_of(page) if b.lang == "python")


@pytest.mark.parametrize("page", [
    pytest.param(page, marks=[pytest.mark.spark] if uses_spark(page) else [], id=page.name)
    for page in PYTHON_PAGES])
def test_python_examples_run(page: pathlib.Path, tmp_path: pathlib.Path) -> None:
    blocks = [(b.where, b.body) for b in blocks_of(page) if b.lang == "python"
              and not b.fragment]
    proc = subprocess.run([sys.executable, "-c", RUNNER.format(blocks=blocks)],
                          cwd=page_workdir(tmp_path), env=subprocess_env(),
                          capture_output=True, text=True, timeout=900 if uses_spark(page) else 120)
    assert proc.returncode == 0, proc.stderr[-4000:]


FRAGMENTS = [b for b in ALL_BLOCKS if b.lang == "python" and b.fragment]


@pytest.mark.parametrize("block", FRAGMENTS, ids=ids(FRAGMENTS))
def test_python_fragments_compile(block: Block) -> None:
    compile(block.body, block.where, "exec")


# --- console ---------------------------------------------------------------------

CONSOLE = [b for b in ALL_BLOCKS if b.lang == "console" and not b.fragment
           and b.body.lstrip().startswith("$ streamrep")]


def parse_console(body: str) -> list[tuple[str, list[str]]]:
    """``[(command, expected_lines)]``: a command starts with ``$ `` and may continue
    over lines ending in a backslash."""
    commands: list[tuple[str, list[str]]] = []
    continuing = False
    for raw in body.splitlines():
        if continuing:
            command, expected = commands[-1]
            commands[-1] = (command + "\n" + raw, expected)
            continuing = raw.endswith("\\")
        elif raw.startswith("$ "):
            commands.append((raw[2:], []))
            continuing = raw.endswith("\\")
        elif commands and raw.strip():
            commands[-1][1].append(raw.rstrip())
    return commands


def output_matches(expected: list[str], actual: list[str]) -> str | None:
    """None when every expected line appears in *actual*, in order; else the first
    expected line that did not."""
    pos = 0
    for want in expected:
        pattern = re.compile(".*".join(re.escape(part) for part in want.split("...")) + r"\s*$")
        while pos < len(actual) and not pattern.match(actual[pos].rstrip()):
            pos += 1
        if pos == len(actual):
            return want
        pos += 1
    return None


def expected_exit(block: Block) -> int:
    for option in block.options:
        if option.startswith("exit="):
            return int(option.partition("=")[2])
    return 0


@pytest.mark.parametrize("block", CONSOLE, ids=ids(CONSOLE))
def test_console_examples_run(block: Block, tmp_path: pathlib.Path) -> None:
    work = page_workdir(tmp_path)
    for command, expected in parse_console(block.body):
        argv = shlex.split(command.replace("\\\n", " "))
        assert argv[0] == "streamrep", f"{block.where}: only streamrep commands run: {command}"
        proc = subprocess.run([sys.executable, "-m", "streamrep", *argv[1:]], cwd=work,
                              env=subprocess_env(), capture_output=True, text=True,
                              timeout=120)
        output = (proc.stdout + proc.stderr).splitlines()
        assert proc.returncode == expected_exit(block), (
            f"{block.where}: `{command}` exited {proc.returncode}:\n" + "\n".join(output))
        missing = output_matches(expected, output)
        assert missing is None, (f"{block.where}: `{command}` did not print {missing!r}; "
                                 "it printed:\n" + "\n".join(output))


# --- yaml ------------------------------------------------------------------------

YAML = [b for b in ALL_BLOCKS if b.lang in ("yaml", "yml")]


@pytest.mark.parametrize("block", YAML, ids=ids(YAML))
def test_yaml_examples_load(block: Block, tmp_path: pathlib.Path) -> None:
    if block.fragment:
        yaml.safe_load(block.body)
        return
    path = tmp_path / "config.yaml"
    path.write_text(block.body)
    load_config(path, streams=known_streams())


EXAMPLE_FILES = sorted((DOCS / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.name for p in EXAMPLE_FILES])
def test_example_files_load(path: pathlib.Path) -> None:
    load_config(path, streams=known_streams())


INVALID_FILES = sorted((DOCS / "examples" / "invalid").glob("*.yaml"))


@pytest.mark.parametrize("path", INVALID_FILES, ids=[p.name for p in INVALID_FILES])
def test_invalid_example_files_are_refused(path: pathlib.Path) -> None:
    with pytest.raises(ConfigError):
        load_config(path, streams=known_streams())


# --- links ----------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub renders it."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors_of(page: pathlib.Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_relative_links_resolve(page: pathlib.Path) -> None:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors_of(resolved):
            broken.append(f"{target} (no heading for #{anchor})")
    assert not broken, f"{page.name}: broken links: {broken}"


# --- the mechanism itself ----------------------------------------------------------


def test_block_parser_and_matcher(tmp_path: pathlib.Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n```python fragment\nx = 1\n```\n\n```console exit=2\n"
                    "$ streamrep check-config \\\n  a.yaml\nconfig error: ...\n```\n")
    found = blocks_of(page)
    assert [(b.lang, b.options, b.line) for b in found] == [
        ("python", ("fragment",), 2), ("console", ("exit=2",), 6)]
    assert expected_exit(found[1]) == 2
    assert parse_console(found[1].body) == [
        ("streamrep check-config \\\n  a.yaml", ["config error: ..."])]
    assert output_matches(["config error: ...", "b"], ["x", "config error: foo", "b"]) is None
    assert output_matches(["b", "config error: ..."], ["config error: foo", "b"]) == \
        "config error: ..."
    assert slug("`streamrep.idgen`: completion tracking") == "streamrepidgen-completion-tracking"
    assert slug("Every example runs") == "every-example-runs"
    assert PAGES, "no docs found"

"""The package type-checks under ``mypy --strict``, compiled core included via its stubs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import streamrep
import streamrep._core


def _typed_copy(dest: Path) -> Path:
    """Copy the imported package's sources and stubs into *dest* in the installed layout.

    An editable install keeps ``streamrep._core`` in ``src/_core``; a wheel keeps it
    inside the package. Copying makes both look the same to mypy.
    """
    ignore = shutil.ignore_patterns("*.so", "*.c", "*.html", "__pycache__", "*.pyx", "*.pxd")
    package = dest / "streamrep"
    shutil.copytree(Path(streamrep.__file__).parent, package, ignore=ignore)
    core = package / "_core"
    if not core.exists():
        shutil.copytree(Path(streamrep._core.__file__).parent, core, ignore=ignore)
    return dest


@pytest.mark.slow
def test_mypy_strict(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    tree = _typed_copy(tmp_path / "tree")
    config_file = pytestconfig.rootpath / "pyproject.toml"
    env = dict(os.environ, MYPY_CACHE_DIR=str(tmp_path / "mypy-cache"))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--config-file", str(config_file), "-p", "streamrep"],
        capture_output=True, text=True, env=env, cwd=tree, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-8000:] + result.stderr[-2000:]


@pytest.mark.slow
def test_matrix_events_are_read_only_to_the_type_checker(tmp_path: Path,
                                                        pytestconfig: pytest.Config) -> None:
    """``MatrixEvent`` is not frozen at run time (building it is faster so): mypy is
    what refuses an assignment to its fields."""
    tree = _typed_copy(tmp_path / "tree")
    (tree / "assigns.py").write_text(
        "from streamrep.matrix.events import MatrixEvent\n\n\n"
        "def retype(event: MatrixEvent) -> None:\n"
        "    event.type = 'm.room.message'\n")
    env = dict(os.environ, MYPY_CACHE_DIR=str(tmp_path / "mypy-cache"))
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--follow-imports=silent",
         "--config-file", str(pytestconfig.rootpath / "pyproject.toml"), "assigns.py"],
        capture_output=True, text=True, env=env, cwd=tree, timeout=900,
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'assigns.py:5: error: Property "type" defined in "MatrixEvent" is read-only' in (
        result.stdout), result.stdout

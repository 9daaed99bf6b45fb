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


def _mypy_user_file(tmp_path: Path, pytestconfig: pytest.Config, name: str) -> subprocess.CompletedProcess[str]:
    tree = _typed_copy(tmp_path / "tree")
    shutil.copy(Path(__file__).parent / "data" / name, tree / name)
    env = dict(os.environ, MYPY_CACHE_DIR=str(tmp_path / "mypy-cache"))
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--follow-imports=silent",
         "--config-file", str(pytestconfig.rootpath / "pyproject.toml"), name],
        capture_output=True, text=True, env=env, cwd=tree, timeout=900,
    )


@pytest.mark.slow
def test_the_public_api_types_a_users_worker_and_writer(tmp_path: Path, pytestconfig: pytest.Config) -> None:
    """tests/data/typed_user.py uses the link, the announcer, typed per-stream handlers
    and positions as a user would: it passes mypy --strict; tests/data/typed_user_wrong.py
    holds mistakes the types catch, and each is refused."""
    ok = _mypy_user_file(tmp_path / "ok", pytestconfig, "typed_user.py")
    assert ok.returncode == 0, ok.stdout[-4000:] + ok.stderr[-2000:]
    wrong = _mypy_user_file(tmp_path / "wrong", pytestconfig, "typed_user_wrong.py")
    assert wrong.returncode != 0
    assert 'Argument 1 has incompatible type "Callable[[str, int, list[ReceiptsRow]], None]"' in wrong.stdout, \
        wrong.stdout
    assert '"str" has no attribute "no_such_attribute"' in wrong.stdout, wrong.stdout


@pytest.mark.slow
def test_spark_functions_type_check_as_a_user_uses_them(tmp_path: Path,
                                                       pytestconfig: pytest.Config) -> None:
    """tests/data/typed_spark_user.py, a pipeline over streamrep.spark.functions,
    passes mypy --strict; typed_spark_user_wrong.py holds mistakes the types catch."""
    ok = _mypy_user_file(tmp_path / "ok", pytestconfig, "typed_spark_user.py")
    assert ok.returncode == 0, ok.stdout[-4000:] + ok.stderr[-2000:]
    wrong = _mypy_user_file(tmp_path / "wrong", pytestconfig, "typed_spark_user_wrong.py")
    assert wrong.returncode != 0
    assert 'Argument "split_threshold" to "full_state" has incompatible type "str"' in wrong.stdout, \
        wrong.stdout
    assert '"CompressionPlan" has no attribute "edges"' in wrong.stdout, wrong.stdout

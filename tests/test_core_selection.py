"""The compiled core must load unless the pure twins were asked for."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

import pytest

from streamrep import _impl


@pytest.mark.parametrize("name", _impl.CORE_MODULES)
def test_selected_implementation(name: str) -> None:
    module = _impl.load(name)
    if _impl.NO_EXTENSIONS:
        assert not _impl.is_compiled(module), f"{name}: compiled core used despite NO_EXTENSIONS"
    else:
        assert _impl.is_compiled(module), f"{name}: compiled core did not load"


@pytest.mark.parametrize("name", _impl.CORE_MODULES)
def test_twins_expose_the_same_names(name: str) -> None:
    compiled = _impl.load_compiled(name)
    pure = _impl.load_pure(name)
    public = set(getattr(pure, "__all__", ()))
    assert public, f"streamrep._pure.{name} declares no __all__"
    assert set(getattr(compiled, "__all__", ())) == public
    for attr in public:
        assert hasattr(compiled, attr), f"streamrep._core.{name} lacks {attr}"


def test_no_top_level_core_package() -> None:
    with pytest.raises(ImportError):
        importlib.import_module("_core")


def test_missing_extension_is_an_error_not_a_silent_fallback() -> None:
    # A child interpreter where streamrep._core.wire cannot import must fail loudly.
    code = (
        "import sys; sys.modules['streamrep._core.wire'] = None\n"
        "from streamrep import _impl\n"
        "try:\n    _impl.load('wire')\nexcept ImportError as e:\n"
        "    print('ImportError', 'STREAMREP_NO_EXTENSIONS' in str(e))\n"
        "else:\n    print('loaded')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "STREAMREP_NO_EXTENSIONS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "ImportError True", out.stderr

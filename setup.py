"""Build script for streamrep's compiled core.

Every ``src/_core/<name>.pyx`` becomes the extension ``streamrep._core.<name>``.

Build knobs (options of ``build_ext`` or environment variables, never edits):

``--cython-annotate`` / ``STREAMREP_CYTHON_ANNOTATE=1``
    write Cython's HTML annotation next to each ``.pyx``.
``--cython-debug`` / ``STREAMREP_CYTHON_DEBUG=1``
    line tracing (for coverage and profilers), bounds checks back on, ``-O0 -g``.
``--cython-always`` / ``STREAMREP_CYTHON_ALWAYS=1``
    re-cythonize even when the generated C looks up to date.
``STREAMREP_CORE_ONLY=wire,tracker``
    build only these core modules (for quick local iteration).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext as _build_ext
from setuptools.extension import Extension

HERE = Path(__file__).parent.resolve()
CORE_DIR = Path("src") / "_core"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}


def _python_packages() -> list[str]:
    packages = ["streamrep._core"]
    root = HERE / "src" / "streamrep"
    for init in sorted(root.rglob("__init__.py")):
        rel = init.parent.relative_to(root.parent)
        packages.append(".".join(rel.parts))
    return packages


def _core_extensions() -> list[Extension]:
    only = {n.strip() for n in os.environ.get("STREAMREP_CORE_ONLY", "").split(",") if n.strip()}
    extensions = []
    for pyx in sorted((HERE / CORE_DIR).glob("*.pyx")):
        if only and pyx.stem not in only:
            continue
        extensions.append(
            Extension(
                f"streamrep._core.{pyx.stem}",
                [str(CORE_DIR / pyx.name)],
                extra_compile_args=["-O2", "-Wno-unused-function", "-Wno-unreachable-code"],
            )
        )
    return extensions


def _cython_include_root() -> Path:
    """A directory where ``streamrep/_core`` resolves to ``src/_core``.

    Core modules cimport each other as ``streamrep._core.<name>``; the sources
    live in ``src/_core``, so Cython is shown them under their installed name.
    """
    root = HERE / "build" / "cython-include"
    package = root / "streamrep"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.pxd").touch()
    link = package / "_core"
    if not link.is_symlink():
        if link.exists():
            link.rmdir()
        link.symlink_to(HERE / CORE_DIR, target_is_directory=True)
    return root


class build_ext(_build_ext):
    user_options = _build_ext.user_options + [
        ("cython-annotate", None, "write Cython's HTML annotation of each core module"),
        ("cython-debug", None, "line tracing, bounds checks and -O0 -g"),
        ("cython-always", None, "re-cythonize even when the C file looks current"),
    ]
    boolean_options = _build_ext.boolean_options + [
        "cython-annotate",
        "cython-debug",
        "cython-always",
    ]

    def initialize_options(self) -> None:
        super().initialize_options()
        self.cython_annotate = _env_flag("STREAMREP_CYTHON_ANNOTATE")
        self.cython_debug = _env_flag("STREAMREP_CYTHON_DEBUG")
        self.cython_always = _env_flag("STREAMREP_CYTHON_ALWAYS")

    def finalize_options(self) -> None:
        super().finalize_options()
        from Cython.Build import cythonize

        directives = {
            "language_level": 3,
            "embedsignature": True,
            "binding": False,
            "cdivision": True,
            "initializedcheck": False,
        }
        if self.cython_debug:
            directives.update(linetrace=True, profile=True, boundscheck=True, wraparound=True)
            for ext in self.distribution.ext_modules or []:
                ext.define_macros = list(ext.define_macros or []) + [
                    ("CYTHON_TRACE", "1"),
                    ("CYTHON_TRACE_NOGIL", "1"),
                ]
                ext.extra_compile_args = ["-O0", "-g"]
        include_root = _cython_include_root()
        self.distribution.ext_modules = cythonize(
            self.distribution.ext_modules or [],
            compiler_directives=directives,
            annotate=bool(self.cython_annotate),
            force=bool(self.cython_always),
            include_path=[str(include_root)],
            quiet=True,
            nthreads=0 if sys.platform == "win32" else min(2, os.cpu_count() or 1),
        )


setup(
    packages=_python_packages(),
    ext_modules=_core_extensions(),
    cmdclass={"build_ext": build_ext},
    zip_safe=False,
)

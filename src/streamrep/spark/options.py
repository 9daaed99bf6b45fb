"""What a reconstruction reads, what it keeps, and what it reports."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

from streamrep.errors import ConfigError

__all__ = ["Source", "ReconstructOptions", "ReconstructResult", "prepare_output"]


@dataclass(frozen=True)
class Source:
    """Where the state tables come from: an input directory or a database URL.

    ``db_url`` is a ``postgresql://`` URL (read over JDBC by the Spark job, or
    with ``COPY`` by the single-process mode) or, for the single-process mode
    only, a ``sqlite:///`` URL.
    """

    input_dir: str | None = None
    db_url: str | None = None

    def __post_init__(self) -> None:
        if (self.input_dir is None) == (self.db_url is None):
            raise ConfigError("give exactly one of an input directory and a database URL")
        if self.input_dir is not None and not os.path.isdir(self.input_dir):
            raise ConfigError(f"input directory {self.input_dir} does not exist")

    def describe(self) -> str:
        if self.input_dir is not None:
            return self.input_dir
        from streamrep.db.url import redact_url

        assert self.db_url is not None
        return redact_url(self.db_url)


@dataclass(frozen=True)
class ReconstructOptions:
    """What to compute and where to write it.

    Restrictions narrow the wanted groups and combine: a group is wanted when it
    passes every restriction given (``groups``, ``rooms``,
    ``referenced_by_events``); with none, every group is wanted. Ancestors of
    wanted groups are always read, never written.
    """

    output: str
    digest: bool = False
    groups: tuple[int, ...] = ()
    rooms: tuple[str, ...] = ()
    referenced_by_events: bool = False
    split_threshold: int = 200_000
    verify: int = 0
    seed: int = 0
    overwrite: bool = False

    @property
    def restricted(self) -> bool:
        return bool(self.groups or self.rooms or self.referenced_by_events)


@dataclass
class ReconstructResult:
    """Counts and the time spent in each phase (seconds), for logs and benchmarks."""

    output: str
    wanted_groups: int = 0
    rows: int = 0
    verified: int = 0
    digest: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        phases = ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items())
        what = "digests" if self.digest else "rows"
        return (f"{self.wanted_groups} groups, {self.rows} {what} written to {self.output}"
                f" ({phases})" + (f"; verified {self.verified} groups" if self.verified else ""))


def prepare_output(path: str, overwrite: bool) -> None:
    """Refuse to write into a non-empty directory unless *overwrite*.

    Remote URIs (``hdfs://``, ``s3://``...) are left to the writers.
    """
    if "://" in path:
        return
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ConfigError(f"output {path} exists and is not a directory")
        if os.listdir(path):
            if not overwrite:
                raise ConfigError(f"output directory {path} is not empty; give --overwrite to "
                                  "replace it, or another --output")
            shutil.rmtree(path)

"""Progress of a long single-process state job, in groups.

On a terminal: a rich bar with the groups done, groups/s and the time left.
Otherwise (a log file, a pipe): one line on stderr at most every
``STREAMREP_PROGRESS_INTERVAL`` seconds (default 10) as work completes, and a
last line at the end.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

__all__ = ["GroupProgress"]

#: Seconds between two progress lines when stderr is not a terminal.
DEFAULT_INTERVAL = 10.0


class GroupProgress:
    """Call it with ``(done, total)`` groups as work completes; :meth:`close` at the end."""

    def __init__(self, label: str, stream: IO[str] | None = None,
                 terminal: bool | None = None, interval: float | None = None) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = self.stream.isatty() if terminal is None else terminal
        if interval is None:
            interval = float(os.environ.get("STREAMREP_PROGRESS_INTERVAL", DEFAULT_INTERVAL))
        self.interval = interval
        self.started = time.monotonic()
        self.last_line = self.started
        self.done = self.total = 0
        self._bar: Any = None
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        if self.terminal:
            self._draw()
        elif time.monotonic() - self.last_line >= self.interval:
            self._line()

    def _rate(self) -> float:
        return self.done / max(1e-9, time.monotonic() - self.started)

    def _draw(self) -> None:
        if self._bar is None:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeRemainingColumn)

            self._bar = Progress(
                TextColumn(self.label), BarColumn(), MofNCompleteColumn(), TextColumn("groups"),
                TextColumn("{task.fields[rate]:,.0f} groups/s"), TextColumn("ETA"),
                TimeRemainingColumn(), console=Console(file=self.stream, force_terminal=True),
                transient=False)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=max(1, self.total), rate=0.0)
        self._bar.update(self._task, completed=self.done, total=max(1, self.total),
                         rate=self._rate())

    def _line(self) -> None:
        self.last_line = time.monotonic()
        rate = self._rate()
        share = 100.0 * self.done / self.total if self.total else 100.0
        eta = (self.total - self.done) / rate if rate > 0 else 0.0
        print(f"{self.label}: {self.done}/{self.total} groups ({share:.0f}%), {rate:,.0f} groups/s, "
              f"ETA {eta:.0f}s", file=self.stream, flush=True)

    def close(self) -> None:
        """Stop the bar, or print the last line (when anything was reported)."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
        elif not self.terminal and self.total:
            self._line()

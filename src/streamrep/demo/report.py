"""The demo's live progress display and final summary (rich, or plain lines).

Progress shows facts written per stream and, per worker, facts received and how
many facts it is behind the writers. The summary shows facts in the database per
stream, facts received per worker and stream, commit-to-handler lag percentiles,
and the exactly-once check per worker.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

__all__ = ["Progress", "WorkerResult", "Summary", "render_summary", "percentile"]


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The *q*-th percentile (0-100) of already sorted values, nearest rank."""
    if not sorted_values:
        return float("nan")
    rank = math.ceil(q / 100 * len(sorted_values))
    return sorted_values[max(0, min(len(sorted_values), rank) - 1)]


@dataclass
class WorkerResult:
    """What the check found for one worker."""

    name: str
    received: dict[str, int]
    lost: int
    duplicated: int
    unexpected: int
    lag_ms: list[float]
    sync_queries: int = 0
    sync_mismatches: int = 0
    cache_invalidations: int = 0
    exit_code: int | None = 0
    examples: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return (self.lost == 0 and self.duplicated == 0 and self.unexpected == 0
                and self.sync_mismatches == 0 and self.exit_code == 0)


@dataclass
class Summary:
    """The whole run's result; ``ok`` is what the exit status reflects."""

    duration: float
    database: str
    writers: list[str]
    #: facts in the database at the end, per stream
    written: dict[str, int]
    workers: list[WorkerResult]
    #: facts the writers committed and announced, per stream (more than ``written``
    #: where later facts replaced earlier rows: account data, receipts)
    committed: dict[str, int] = field(default_factory=dict)
    #: facts in the database before the run, per stream
    previous: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and bool(self.workers) and all(w.ok for w in self.workers)

    @property
    def total_lost(self) -> int:
        return sum(w.lost for w in self.workers)

    @property
    def total_duplicated(self) -> int:
        return sum(w.duplicated for w in self.workers)


class Progress:
    """The live display: a rich table on a terminal, a plain line every few
    seconds otherwise."""

    def __init__(self, console: Console, workers: Sequence[str], live: bool | None = None,
                 interval: float = 2.0) -> None:
        self.console = console
        self.workers = list(workers)
        self.live_mode = console.is_terminal if live is None else live
        self.interval = interval
        self._live: Live | None = None
        self._last_plain = 0.0
        self.started = time.monotonic()

    def __enter__(self) -> Progress:
        if self.live_mode:
            self._live = Live(console=self.console, refresh_per_second=4, transient=True)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def update(self, phase: str, written: Mapping[str, int],
               received: Mapping[str, Mapping[str, int]], behind: Mapping[str, int]) -> None:
        """Show the current counts (*received*: worker -> stream -> facts)."""
        elapsed = time.monotonic() - self.started
        if self._live is not None:
            self._live.update(self._table(phase, elapsed, written, received, behind))
            return
        now = time.monotonic()
        if now - self._last_plain < self.interval:
            return
        self._last_plain = now
        total = sum(written.values())
        parts = [f"{w} {sum(received.get(w, {}).values())} (behind {behind.get(w, 0)})"
                 for w in self.workers]
        self.console.print(f"[{elapsed:5.1f}s] {phase}: written {total}; received: "
                           + ", ".join(parts), highlight=False, markup=False)

    def _table(self, phase: str, elapsed: float, written: Mapping[str, int],
               received: Mapping[str, Mapping[str, int]], behind: Mapping[str, int]) -> Group:
        table = Table(title=f"streamrep demo: {phase} ({elapsed:.1f}s)", title_justify="left")
        table.add_column("stream")
        table.add_column("written", justify="right")
        for worker in self.workers:
            table.add_column(worker, justify="right")
        for stream in sorted(set(written) | {s for r in received.values() for s in r}):
            table.add_row(stream, str(written.get(stream, 0)),
                          *(str(received.get(w, {}).get(stream, 0)) for w in self.workers))
        table.add_row(Text("behind (stream IDs)", style="bold"), "",
                      *(str(behind.get(w, 0)) for w in self.workers))
        return Group(table)


def _fmt_ms(value: float) -> str:
    return "-" if value != value else f"{value:.1f}"


def render_summary(summary: Summary, console: Console) -> None:
    """Print the summary tables and the verdict."""
    written = Table(title="Facts written, per stream", title_justify="left",
                    caption="replaced since: committed facts whose rows a later fact "
                    "replaced (account_data and receipts keep the latest row per key)",
                    caption_justify="left")
    written.add_column("stream")
    show_previous = any(summary.previous.values())
    if show_previous:
        written.add_column("before the run", justify="right")
    written.add_column("committed by writers", justify="right")
    written.add_column("in the database", justify="right")
    written.add_column("replaced since", justify="right")
    totals = [0, 0, 0]
    for stream in sorted(summary.written):
        previous = summary.previous.get(stream, 0)
        committed = summary.committed.get(stream, 0)
        in_db = summary.written[stream]
        totals = [totals[0] + previous, totals[1] + committed, totals[2] + in_db]
        cells = [str(committed), str(in_db), str(max(0, previous + committed - in_db))]
        written.add_row(stream, *([str(previous)] if show_previous else []), *cells)
    cells = [str(totals[1]), str(totals[2]), str(max(0, sum(totals[:2]) - totals[2]))]
    written.add_row(Text("total", style="bold"), *([str(totals[0])] if show_previous else []),
                    *cells)
    console.print(written)

    streams = sorted(summary.written)
    received = Table(title="Facts received, per worker", title_justify="left")
    received.add_column("worker")
    for stream in streams:
        received.add_column(stream, justify="right")
    received.add_column("total", justify="right")
    for w in summary.workers:
        received.add_row(w.name, *(str(w.received.get(s, 0)) for s in streams),
                         str(sum(w.received.values())))
    console.print(received)

    checks = Table(title="Lag from commit to worker handler (ms); exactly-once and sync checks",
                   title_justify="left", caption="lost: in the database, never received; dup: "
                   "received twice; unexp: received, never committed; sync err: sync answers "
                   "from change caches that differ from the database, and stale cache entries",
                   caption_justify="left")
    # Short headers so the table fits an 80-column terminal.
    for col in ("worker", "p50", "p90", "p99", "max", "lost", "dup", "unexp", "syncs",
                "sync err", "result"):
        checks.add_column(col, justify="left" if col in ("worker", "result") else "right")
    for w in summary.workers:
        lag = sorted(w.lag_ms)
        checks.add_row(
            w.name, _fmt_ms(percentile(lag, 50)), _fmt_ms(percentile(lag, 90)),
            _fmt_ms(percentile(lag, 99)), _fmt_ms(lag[-1] if lag else float("nan")),
            str(w.lost), str(w.duplicated), str(w.unexpected), str(w.sync_queries),
            str(w.sync_mismatches),
            Text("ok", style="green") if w.ok else Text("FAILED", style="bold red"))
    console.print(checks)
    for w in summary.workers:
        for example in w.examples:
            console.print(f"  {w.name}: {example}", highlight=False, markup=False)
    for problem in summary.problems:
        console.print(f"problem: {problem}", style="red", highlight=False, markup=False)
    verdict = (f"{len(summary.workers)} workers, {sum(summary.committed.values())} facts: "
               f"{summary.total_lost} lost, {summary.total_duplicated} duplicated")
    if summary.ok:
        console.print(f"exactly-once check passed: {verdict}", style="bold green",
                      highlight=False)
    else:
        console.print(f"check FAILED: {verdict}", style="bold red", highlight=False)

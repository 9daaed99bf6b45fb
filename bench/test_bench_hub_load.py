"""The hub under heavy load, over loopback, compiled core (``streamrep serve``).

* ``stalled_readers``: 990 readers that send ``NAME`` and ``REPLICATE`` and never read
  (``hub_load.py stalled``), one normal reader (``replication_roles.py worker``), then
  a writer persisting 20,000 one-row facts flat out. Figures: the normal reader's
  commit-to-handler p50/p99/max, the hub's CPU from the writer's start until the
  reader has every fact, the hub's RSS before the stalled readers connect, with
  them connected, at its peak, once the hub has cut every stalled reader off (and
  how long after the burst that was; what they were told), and once the stalled
  process has read its sockets and closed them.
* ``connects``: ``hub_load.py connects`` connects, reads ``SERVER`` and closes, from
  two processes of 75 connections each (40 per source address, under the hub's
  limits on pending peers) for 10 seconds, while a writer persists 1,000 one-row
  facts a second and a normal reader follows them. Figures: connects per second,
  the hub's and the generator's CPU per connect, the kernel's ``ListenOverflows``
  during the run, and the reader's commit-to-handler p50/p99/max.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import orjson
import pytest

HERE = os.path.dirname(__file__)
ROLES = os.path.join(HERE, "replication_roles.py")
LOAD = os.path.join(HERE, "hub_load.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def _cpu_seconds(pid: int) -> float:
    """The CPU time of every thread of *pid*, to the nanosecond (``schedstat``;
    ``stat`` counts in clock ticks of 10 ms, as long as a whole burst takes)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


def _established(port: int) -> int:
    """Established TCP connections whose local end is 127.0.0.1:*port* (the hub's
    side; a client on another loopback address may have the same port number)."""
    local = f"0100007F:{port:04X}"
    count = 0
    with open("/proc/net/tcp") as fh:
        next(fh)
        for line in fh:
            fields = line.split()
            if fields[3] == "01" and fields[1] == local:
                count += 1
    return count


def _listen_overflows() -> int:
    with open("/proc/net/netstat") as fh:
        lines = [line.split() for line in fh if line.startswith("TcpExt:")]
    return int(lines[1][lines[0].index("ListenOverflows")])


class Run:
    """A hub and the processes around it, all killed at the end."""

    def __init__(self, tmp: str) -> None:
        self.tmp = tmp
        self.db = f"sqlite:///{tmp}/bench.db"
        self.port = _free_port()
        self.connect = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        self.env = dict(os.environ)
        self.env.pop("STREAMREP_NO_EXTENSIONS", None)

    def start(self, args: list[str], name: str, **kw: Any) -> subprocess.Popen[bytes]:
        log = open(os.path.join(self.tmp, f"{name}.log"), "wb")
        proc = subprocess.Popen(args, env=self.env, stderr=log, cwd=self.tmp, **kw)
        log.close()
        self.procs.append(proc)
        return proc

    def serve(self) -> subprocess.Popen[bytes]:
        hub = self.start([sys.executable, "-m", "streamrep", "serve", "--db", self.db, "--listen", self.connect,
                          "--server-name", "bench.example"], "hub")
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return hub
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def worker(self, rows: int) -> subprocess.Popen[bytes]:
        worker = self.start([sys.executable, ROLES, "worker", self.connect, "reader", str(rows),
                             os.path.join(self.tmp, "reader.json")], "reader", stdout=subprocess.PIPE)
        assert worker.stdout is not None and worker.stdout.readline().strip() == b"ready"
        worker.stdout.close()
        return worker

    def writer(self, facts: int, rate: float) -> subprocess.Popen[bytes]:
        return self.start([sys.executable, ROLES, "writer", self.connect, self.db, str(facts), "1", str(rate),
                           os.path.join(self.tmp, "writer.json")], "writer")

    def latencies(self) -> dict[str, float]:
        with open(os.path.join(self.tmp, "writer.json"), "rb") as fh:
            commits = dict(orjson.loads(fh.read())["commits"])
        with open(os.path.join(self.tmp, "reader.json"), "rb") as fh:
            facts = orjson.loads(fh.read())["facts"]
        ms = sorted((ns - commits[token]) / 1e6 for token, ns in facts if token in commits)
        return {"reader_p50_ms": ms[len(ms) // 2], "reader_p99_ms": ms[int(len(ms) * 0.99)],
                "reader_max_ms": ms[-1], "reader_facts": len(facts)}

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()


def _report(benchmark: Any, name: str, figures: dict[str, Any]) -> None:
    benchmark.extra_info.update(figures)
    print(f"\n{name}: " + ", ".join(f"{k}={v:,.2f}" if isinstance(v, float) else f"{k}={v}"
                                   for k, v in figures.items()))


def _stalled_readers(tmp: str, count: int, facts: int) -> dict[str, Any]:
    run = Run(tmp)
    try:
        hub = run.serve()
        worker = run.worker(facts)
        time.sleep(1.0)
        figures: dict[str, Any] = {"rss_before_mb": _rss_mb(hub.pid)}
        stalled = run.start([sys.executable, LOAD, "stalled", run.connect, str(count)], "stalled",
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert stalled.stdout is not None and stalled.stdin is not None
        assert stalled.stdout.readline().strip() == b"ready"
        time.sleep(1.0)
        figures["rss_stalled_connected_mb"] = _rss_mb(hub.pid)
        peak = [0.0]
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.is_set():
                peak[0] = max(peak[0], _rss_mb(hub.pid))
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        hub_cpu = _cpu_seconds(hub.pid)
        writer = run.writer(facts, 0)
        assert writer.wait(300) == 0
        assert worker.wait(300) == 0
        figures["hub_cpu_burst_ms"] = (_cpu_seconds(hub.pid) - hub_cpu) * 1000
        # The hub cuts the stalled readers off once their sockets have taken
        # nothing for keepalive.timeout (15 s), or as their queues pass the bound.
        deadline = time.monotonic() + 60
        while _established(run.port) > 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        figures["cut_after_s"] = time.monotonic() - (deadline - 60)
        time.sleep(3.0)
        figures["rss_after_cut_mb"] = _rss_mb(hub.pid)
        # Then the readers the burst did not push past the bound go too.
        stalled.stdin.write(b"go\n")
        stalled.stdin.flush()
        told = orjson.loads(stalled.stdout.readline())
        time.sleep(4.0)
        sampling.set()
        sampler.join()
        figures["rss_peak_mb"] = peak[0]
        figures["rss_all_gone_mb"] = _rss_mb(hub.pid)
        figures["stalled_closed_by_hub"] = told["closed"]
        figures["stalled_told"] = "; ".join(f"{n}x {line}" for line, n in told["errors"].items())
        figures.update(run.latencies())
        return figures
    finally:
        run.close()


def _connects(tmp: str, seconds: float, processes: int, concurrency: int, rate: float) -> dict[str, Any]:
    run = Run(tmp)
    try:
        hub = run.serve()
        facts = int(rate * (seconds + 2))
        worker = run.worker(facts)
        writer = run.writer(facts, rate)
        time.sleep(1.0)
        overflows = _listen_overflows()
        hub_cpu = _cpu_seconds(hub.pid)
        out = os.path.join(tmp, "connects.json")
        load = run.start([sys.executable, LOAD, "connects", run.connect, str(seconds), str(concurrency),
                          str(processes), out], "connects")
        assert load.wait(seconds + 60) == 0
        figures: dict[str, Any] = {}
        with open(out, "rb") as fh:
            result = orjson.loads(fh.read())
        figures["connects_per_second"] = result["connects"] / result["seconds"]
        figures["connect_failures"] = result["failures"]
        figures["connect_ms_p50_p99_max"] = ", ".join(f"{v:.1f}" for v in result["connect_ms"])
        figures["listen_overflows"] = _listen_overflows() - overflows
        figures["hub_cpu_us_per_connect"] = (_cpu_seconds(hub.pid) - hub_cpu) / max(result["connects"], 1) * 1e6
        figures["generator_cpu_us_per_connect"] = result["generator_cpu_seconds"] / max(result["connects"], 1) * 1e6
        assert writer.wait(120) == 0
        assert worker.wait(120) == 0
        figures.update(run.latencies())
        figures["hub_rss_mb"] = _rss_mb(hub.pid)
        return figures
    finally:
        run.close()


@pytest.mark.benchmark(group="hub-load")
@pytest.mark.parametrize("stalled", [0, 990])
def test_bench_stalled_readers(benchmark: Any, impl_kind: str, stalled: int, tmp_path: Any) -> None:
    """With 0 stalled readers: the same burst alone, what the machine gives the
    reader anyway."""
    if impl_kind == "pure":
        pytest.skip("measured with the compiled core")
    results: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: results.append(_stalled_readers(str(tmp_path), stalled, 20_000)),
                       rounds=1, iterations=1)
    _report(benchmark, f"stalled_readers[{stalled}]", results[0])
    assert results[0]["reader_facts"] == 20_000


@pytest.mark.benchmark(group="hub-load")
def test_bench_connects(benchmark: Any, impl_kind: str, tmp_path: Any) -> None:
    if impl_kind == "pure":
        pytest.skip("measured with the compiled core")
    results: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: results.append(_connects(str(tmp_path), 10.0, 2, 75, 1000.0)),
                       rounds=1, iterations=1)
    _report(benchmark, "connects", results[0])
    assert results[0]["connect_failures"] == 0

"""End to end over loopback: one writer process persisting rows, the hub
(``streamrep serve``), four worker processes.

* ``throughput``: the writer persists flat out (to-device facts of 1,000 rows);
  the figure is RDATA lines per second delivered to the four workers in total.
* ``fanout``: the writer persists its facts first (to-device facts of 1,000
  rows), then announces them all at once; the figure is RDATA lines per second
  delivered to the four workers in total: the relay alone, which the writer's
  persisting does not limit (latencies are from the announcement).
* ``latency``: the writer persists 50,000 rows/s (facts of 10 rows, about 5 ms
  of them per transaction); the figure is the 99th percentile from a fact's
  commit to the worker's handler.

Each runs with the compiled core and with the pure-Python twins (every process
of the run uses the same one), and once more with the compiled core over TLS
(``transport=tls``: the hub's certificate from a CA made for the run, every
process checking it), and once more with the compiled core through Redis pub/sub
instead of the hub (``transport=redis``: a ``redis-server`` of the run's own in the
hub's place, its pub/sub output-buffer limit lifted as the hub's queue bound is
raised; the ``hub_*`` CPU figures are then Redis's own; ``transport=redis-packed``:
the same with up to 100 of the writer's lines a Redis message, the format only
streamrep reads),
``STREAMREP_BENCH_ROUNDS`` times (default 3); the
figures of the median round are in ``extra_info`` and printed, with every round's
rate and p99.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import orjson
import pytest

ROLES = os.path.join(os.path.dirname(__file__), "replication_roles.py")
WORKERS = 4


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _reap(proc: subprocess.Popen[bytes], timeout: float = 300) -> tuple[int, float]:
    """Wait for *proc*; its exit status and the CPU seconds it used."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.args} did not finish")
        time.sleep(0.01)


def _cpu_seconds(pid: int) -> float:
    """CPU (user + system) a live process has used so far."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        fields = fh.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run(tmp: str, impl_kind: str, facts: int, rows_per_fact: int, rate: float,
         transport: str = "plain") -> dict[str, Any]:
    env = dict(os.environ)
    if impl_kind == "pure":
        env["STREAMREP_NO_EXTENSIONS"] = "1"
    else:
        env.pop("STREAMREP_NO_EXTENSIONS", None)
    serve_tls: list[str] = []
    env.pop("STREAMREP_BENCH_TLS_CA", None)
    if transport == "tls":
        from streamrep.demo.certificates import make_deployment_certificates

        certs = make_deployment_certificates(os.path.join(tmp, "pki"), [])
        serve_tls = ["--tls-cert", certs.hub.cert, "--tls-key", certs.hub.key]
        env["STREAMREP_BENCH_TLS_CA"] = certs.ca
    db = f"sqlite:///{tmp}/bench.db"
    port = _free_port()
    through_redis = transport.startswith("redis")
    connect = f"redis://127.0.0.1:{port}" if through_redis else f"127.0.0.1:{port}"
    env["STREAMREP_BENCH_REDIS_LINES"] = str(PACKED_LINES if transport == "redis-packed" else 1)
    procs: list[subprocess.Popen[bytes]] = []
    logs = []

    def start(args: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        role = args[3] if args[1] == "-m" else args[2]
        log = open(os.path.join(tmp, f"{role}-{len(procs)}.log"), "wb")
        logs.append(log)
        proc = subprocess.Popen(args, env=env, stderr=log, **kw)
        procs.append(proc)
        return proc

    try:
        if through_redis:
            start([_redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--client-output-buffer-limit", "pubsub 0 0 0"], cwd=tmp,
                  stdout=subprocess.DEVNULL)
        else:
            start([sys.executable, "-m", "streamrep", "serve", "--db", db, "--listen", f"127.0.0.1:{port}",
                   "--server-name", "bench.example", "--log-level", "WARNING", *serve_tls], cwd=tmp)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        total_rows = facts * rows_per_fact
        workers = [
            start([sys.executable, ROLES, "worker", connect, f"w{i}", str(total_rows),
                   os.path.join(tmp, f"w{i}.json")], stdout=subprocess.PIPE)
            for i in range(WORKERS)
        ]
        for w in workers:
            assert w.stdout is not None
            assert w.stdout.readline().strip() == b"ready"
            w.stdout.close()
        # CPU before the run, to count what the run cost without process start-up.
        hub_cpu_before = _cpu_seconds(procs[0].pid)
        workers_cpu_before = sum(_cpu_seconds(w.pid) for w in workers)
        writer = start([sys.executable, ROLES, "writer", connect, db, str(facts),
                        str(rows_per_fact), str(rate), os.path.join(tmp, "writer.json")])
        writer_code, writer_cpu = _reap(writer)
        assert writer_code == 0
        worker_cpu = 0.0
        for w in workers:
            code, cpu = _reap(w)
            assert code == 0
            worker_cpu += cpu
        hub = procs[0]
        hub_run_cpu = _cpu_seconds(hub.pid) - hub_cpu_before
        hub.send_signal(signal.SIGTERM)
        hub_cpu = _reap(hub)[1]
        with open(os.path.join(tmp, "writer.json"), "rb") as fh:
            written = orjson.loads(fh.read())
        results = []
        for i in range(WORKERS):
            with open(os.path.join(tmp, f"w{i}.json"), "rb") as fh:
                results.append(orjson.loads(fh.read()))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for log in logs:
            log.close()
    commit_ns = {token: ns for token, ns in written["commits"]}
    latencies = sorted(
        (ns - commit_ns[token]) / 1e6 for r in results for token, ns in r["facts"] if token in commit_ns
    )
    total = WORKERS * total_rows
    first = min(r["first_ns"] for r in results)
    last = max(r["last_ns"] for r in results)
    delivered = sum(r["rows"] for r in results)
    return {
        "lines_per_second": delivered / ((last - first) / 1e9),
        "delivered_lines": delivered,
        "writer_rows_per_second": total_rows / written["persist_seconds"],
        # CPU cost per delivered line, whatever else the machine was doing
        # ("hub": redis-server when the transport is Redis).
        "hub_cpu_us_per_line": hub_cpu / total * 1e6,
        "worker_cpu_us_per_line": worker_cpu / total * 1e6,
        # The same over the run only (from every worker being ready to the end),
        # without interpreter start-up and imports.
        "hub_run_cpu_us_per_line": hub_run_cpu / total * 1e6,
        "worker_run_cpu_us_per_line": (worker_cpu - workers_cpu_before) / total * 1e6,
        "writer_cpu_us_per_row": writer_cpu / total_rows * 1e6,
        "p50_ms": latencies[len(latencies) // 2],
        "p99_ms": latencies[int(len(latencies) * 0.99)],
        "max_ms": latencies[-1],
    }


def _report(benchmark: Any, name: str, figures: dict[str, Any]) -> None:
    benchmark.extra_info.update(figures)
    print(f"\n{name}: " + ", ".join(
        f"{k}={v:,.2f}" if isinstance(v, float) else
        f"{k}={v:,}" if isinstance(v, int) else f"{k}=[{v}]" for k, v in figures.items()))


#: Rounds per benchmark (each with fresh processes and database); the figures
#: reported are the round with the median ``lines_per_second``, so one round
#: disturbed by another job on a shared machine does not decide the result.
ROUNDS = int(os.environ.get("STREAMREP_BENCH_ROUNDS", "3"))


def _rounds(benchmark: Any, tmp_path: Any, impl_kind: str, **params: Any) -> dict[str, Any]:
    results: list[dict[str, Any]] = []

    def run() -> None:
        directory = os.path.join(str(tmp_path), f"round{len(results)}")
        os.makedirs(directory)
        results.append(_run(directory, impl_kind, **params))

    benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    ranked = sorted(results, key=lambda r: r["lines_per_second"])
    figures = dict(ranked[len(ranked) // 2])
    figures["lines_per_second_each_round"] = ", ".join(
        f"{r['lines_per_second']:,.0f}" for r in results)
    figures["p99_ms_each_round"] = ", ".join(f"{r['p99_ms']:.2f}" for r in results)
    return figures


#: Plain TCP, and TLS on the replication port (compiled core only: what TLS costs
#: is the same whichever core decodes); Redis in the reference's format (a line a
#: message), and with up to PACKED_LINES of a writer's lines a message.
TRANSPORTS = ["plain", "tls", "redis", "redis-packed"]
PACKED_LINES = 100


def _redis_server() -> str:
    import shutil

    found = shutil.which("redis-server")
    if found is None:
        pytest.skip("the redis-server binary is not installed")
    return found


def _transport(impl_kind: str, transport: str) -> None:
    if transport == "tls":
        if impl_kind == "pure":
            pytest.skip("TLS is measured with the compiled core")
        pytest.importorskip("cryptography")
    if transport.startswith("redis"):
        if impl_kind == "pure":
            pytest.skip("Redis is measured with the compiled core")
        _redis_server()


@pytest.mark.benchmark(group="replication-e2e-throughput")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bench_replication_throughput(benchmark: Any, impl_kind: str, transport: str, tmp_path: Any) -> None:
    _transport(impl_kind, transport)
    figures = _rounds(benchmark, tmp_path, impl_kind, facts=150, rows_per_fact=1000, rate=0,
                      transport=transport)
    _report(benchmark, f"throughput[{impl_kind}-{transport}]", figures)
    assert figures["delivered_lines"] == WORKERS * 150 * 1000


@pytest.mark.benchmark(group="replication-e2e-fanout")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bench_replication_fanout(benchmark: Any, impl_kind: str, transport: str, tmp_path: Any) -> None:
    _transport(impl_kind, transport)
    figures = _rounds(benchmark, tmp_path, impl_kind, facts=300, rows_per_fact=1000, rate=-1,
                      transport=transport)
    _report(benchmark, f"fanout[{impl_kind}-{transport}]", figures)
    assert figures["delivered_lines"] == WORKERS * 300 * 1000


@pytest.mark.benchmark(group="replication-e2e-latency")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bench_replication_latency_at_50k_rows_per_second(benchmark: Any, impl_kind: str, transport: str,
                                                          tmp_path: Any) -> None:
    _transport(impl_kind, transport)
    figures = _rounds(benchmark, tmp_path, impl_kind, facts=15_000, rows_per_fact=10, rate=50_000,
                      transport=transport)
    _report(benchmark, f"latency[{impl_kind}-{transport}]", figures)
    assert figures["delivered_lines"] == WORKERS * 15_000 * 10

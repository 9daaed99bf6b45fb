"""``streamrep demo``: a hub, writers and workers on one machine, checked end to end.

The run:

1. writes a configuration file for the deployment (validated by the same loader
   ``streamrep serve --config`` uses) into a work directory;
2. starts the hub (``streamrep serve``), one writer process (two on PostgreSQL,
   sharing the multi-writer streams) persisting the seeded room workload of
   :mod:`streamrep.demo.workload`, and N worker processes following every stream;
3. shows progress while the writers run for ``duration`` seconds;
4. waits until every worker has reached every writer's final position, stops the
   workers and the hub;
5. compares what each worker received with what the database holds: a fact of the
   database a worker never received is *lost*, one it received twice is
   *duplicated*, one the database does not hold is *unexpected*; lag percentiles
   come from the writers' visibility times and the workers' receipt times.

The exit status is non-zero when any check fails.
"""

from __future__ import annotations

import functools
import os
import queue
import secrets
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson
import yaml
from rich.console import Console

from streamrep.catalogue import known_streams
from streamrep.config import Config, load_config, redis_url_for_display
from streamrep.db import deployment
from streamrep.demo.processes import Child, StatusLine, free_port, wait_for_port
from streamrep.demo.report import Progress, Summary, WorkerResult, render_summary
from streamrep.demo.streams import demo_writers
from streamrep.demo.verify import check_worker, read_facts

__all__ = ["DemoOptions", "run_demo"]

SERVER_NAME = "demo.example"

@dataclass
class DemoOptions:
    """What ``streamrep demo`` was asked for."""

    duration: float = 10.0
    rate: float = 200.0
    rooms: int = 20
    workers: int = 3
    db: str | None = None
    seed: int = 1
    #: Matrix room version of the workload's rooms
    room_version: str = "10"
    workdir: str | None = None
    #: how long workers may take to catch up after the writers stop
    catch_up_timeout: float = 30.0
    #: live rich table (None: when stderr is a terminal)
    live: bool | None = None
    log_level: str = "INFO"
    #: kill the hub with SIGKILL this many seconds into the run and start it again
    restart_hub_after: float | None = None
    #: replicate through this Redis server instead of a hub
    redis: str | None = None
    #: TLS on the hub's port (a throwaway CA and certificates in the work directory)
    tls: bool = False
    #: and a client certificate per process, naming its instance (implies tls)
    mutual_tls: bool = False
    #: peers prove a shared secret (a new one in the work directory)
    shared_secret: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)


def _writers_for(db_url: str) -> list[str]:
    return ["writer1", "writer2"] if db_url.startswith(("postgresql:", "postgres:")) else ["writer1"]


def write_config(path: str, db_url: str, port: int, writers: list[str],
                 log_level: str, redis_url: str | None = None,
                 security: dict[str, Any] | None = None) -> None:
    """The demo deployment's configuration file; *security* adds its ``tls``,
    ``shared_secret_file`` and per-instance certificate keys."""
    # Streams that may have several writers are shared on PostgreSQL; the event
    # store's have one (it hands out their orderings in one process).
    stream_writers = demo_writers(writers)
    data: dict[str, Any] = {
        "server_name": SERVER_NAME,
        "database": db_url,
        "listen": f"127.0.0.1:{port}",
        "instance_name": "main",
        "instance_map": {"main": {}, **{w: {} for w in writers}},
        "stream_writers": stream_writers,
        "keepalive": {"ping_interval": 5, "timeout": 15},
        "backpressure": {"max_queue": 100_000},
        "logging": {"level": log_level, "format": "logfmt"},
    }
    for key, value in (security or {}).items():
        if key == "instance_map":
            for name, entry in value.items():
                data["instance_map"].setdefault(name, {}).update(entry)
        else:
            data[key] = value
    found = deployment.recorded(db_url)
    if redis_url is not None:
        data["replication"] = {"redis": {"url": redis_url}}
        # The server name is the Redis channel: one of its own per run, so runs
        # sharing a Redis server never hear each other.
        data["server_name"] = f"demo-{os.urandom(4).hex()}.example"
    if found is not None:
        # A database belongs to one deployment: a run on a database of an earlier
        # run is that deployment again.
        data["server_name"] = found.server_name
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("# written by streamrep demo\n")
        yaml.safe_dump(data, fh, sort_keys=False)


def _read_jsonl(path: str) -> list[list[Any]]:
    try:
        with open(path, "rb") as fh:
            return [orjson.loads(line) for line in fh if line.strip()]
    except FileNotFoundError:
        return []


class _Run:
    def __init__(self, options: DemoOptions, console: Console) -> None:
        self.options = options
        self.console = console
        self.workdir = options.workdir or tempfile.mkdtemp(prefix="streamrep-demo-")
        os.makedirs(self.workdir, exist_ok=True)
        self.db_url = options.db or f"sqlite:///{os.path.join(self.workdir, 'demo.db')}"
        self.writer_names = _writers_for(self.db_url)
        self.worker_names = [f"worker{i + 1}" for i in range(options.workers)]
        self.lines: queue.Queue[StatusLine] = queue.Queue()
        self.children: dict[str, Child] = {}
        self.problems: list[str] = []
        self.port = free_port()
        self.config_path = os.path.join(self.workdir, "streamrep.yaml")
        self.config: Config | None = None
        self.truth: dict[tuple[str, str], list[int]] | None = None
        self.before: dict[tuple[str, str], list[int]] | None = None
        self.hub_restarts = 0
        # Room and event IDs of this run: another run on the same database adds rooms.
        self.run_id = f"r{os.urandom(3).hex()}-"

    # --- children --------------------------------------------------------------------

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("STREAMREP_CONFIG", None)
        env.update(self.options.extra_env)
        return env

    def _child(self, name: str, role: str, argv: list[str]) -> Child:
        child = Child(name, role, argv, os.path.join(self.workdir, f"{name}.log"),
                      self.lines, env=self._env())
        self.children[name] = child
        child.start()
        return child

    def _out(self, name: str) -> str:
        return os.path.join(self.workdir, f"{name}.facts.jsonl")

    def _start_hub(self, log_name: str = "hub") -> bool:
        hub = Child("hub", "hub", [sys.executable, "-m", "streamrep", "serve", "--config",
                                   self.config_path],
                    os.path.join(self.workdir, f"{log_name}.log"), self.lines, env=self._env())
        self.children["hub"] = hub
        hub.start()
        if not wait_for_port("127.0.0.1", self.port, 30.0, hub):
            self.problems.append("the hub did not start listening: "
                                 + " | ".join(hub.log_tail(5)))
            return False
        return True

    def restart_hub(self) -> bool:
        """Kill the hub with SIGKILL (no goodbye to anyone) and start a new one."""
        old = self.children["hub"]
        old.signal(signal.SIGKILL)
        old.wait(10.0)
        old.stop()
        self.hub_restarts += 1
        self.console.print("killed the hub (SIGKILL); starting it again",
                           highlight=False, markup=False)
        return self._start_hub(f"hub-{self.hub_restarts + 1}")

    def _security(self) -> dict[str, Any]:
        """Certificates and a secret for the run, as configuration keys."""
        options = self.options
        out: dict[str, Any] = {}
        if options.tls or options.mutual_tls:
            from streamrep.demo.certificates import make_deployment_certificates

            instances = self.writer_names + self.worker_names if options.mutual_tls else []
            certs = make_deployment_certificates(os.path.join(self.workdir, "pki"), instances)
            out["tls"] = {"cert": certs.hub.cert, "key": certs.hub.key, "ca": certs.ca,
                          "require_client_cert": options.mutual_tls}
            out["instance_map"] = {name: {"tls_cert": files.cert, "tls_key": files.key}
                                   for name, files in certs.clients.items()}
        if options.shared_secret:
            path = os.path.join(self.workdir, "replication.secret")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32) + "\n")
            out["shared_secret_file"] = path
        return out

    def start(self) -> bool:
        write_config(self.config_path, self.db_url, self.port, self.writer_names,
                     self.options.log_level, self.options.redis, self._security())
        self.config = load_config(self.config_path, streams=known_streams(),
                                  check_ports_of="main")
        # A database used before holds facts already: workers receive them too.
        self.before = read_facts(self.config)
        py = sys.executable
        # Over Redis there is no hub: writers publish, workers subscribe.
        if self.options.redis is None and not self._start_hub():
            return False
        # Workers first, so they follow from the very first fact. Processes start one
        # at a time: at startup each records its streams' sequences (table
        # stream_sequences), and two doing so at the same moment on PostgreSQL can
        # collide on that table's key.
        for name in self.worker_names:
            self._child(name, "worker", [
                py, "-m", "streamrep.demo.worker", "--config", self.config_path,
                "--name", name, "--out", self._out(name), "--seed", str(self.options.seed)])
            if not self._wait_until(functools.partial(self._is_connected, name),
                                    f"{name} to connect to the hub"):
                return False
        rate = self.options.rate / len(self.writer_names)
        for i, name in enumerate(self.writer_names):
            self._child(name, "writer", [
                py, "-m", "streamrep.demo.writer", "--config", self.config_path,
                "--instance-name", name, "--seed", str(self.options.seed + i),
                "--rate", str(rate), "--duration", str(self.options.duration),
                "--rooms", str(self.options.rooms), "--out", self._out(name),
                "--events", "yes" if i == 0 else "no", "--id-prefix", self.run_id,
                "--room-version", self.options.room_version])
            if not self._wait_until(functools.partial(self._has_reported, name),
                                    f"{name} to start writing"):
                return False
        return True

    def _is_connected(self, name: str) -> bool:
        return bool(self.children[name].last.get("connected"))

    def _has_reported(self, name: str) -> bool:
        return bool(self.children[name].last)

    def _wait_until(self, ready: Callable[[], bool], what: str, timeout: float = 60.0) -> bool:
        """Wait for *ready* while watching every child; False (with a problem noted)
        if a child fails or *timeout* passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._drain()
            if ready():
                return True
            if not self._check_children(("hub", "worker", "writer")):
                return False
            time.sleep(0.05)
        self.problems.append(f"gave up waiting {timeout:g}s for {what}")
        return False

    # --- the loop --------------------------------------------------------------------

    def _drain(self) -> None:
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                return
            child = self.children.get(line.child)
            if child is None:
                continue
            kind = line.data.get("type")
            if kind == "status":
                child.last = line.data
            elif kind == "done":
                child.last = line.data
                child.done = line.data
            elif kind == "error":
                self.problems.append(f"{line.child}: {line.data.get('message')}")

    def _written(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for name in self.writer_names:
            total.update(self.children[name].last.get("written", {}))
        return dict(total)

    def _received(self) -> dict[str, dict[str, int]]:
        return {w: dict(self.children[w].last.get("received", {})) for w in self.worker_names}

    def _positions(self, name: str) -> dict[tuple[str, str], int]:
        return {(s, i): int(t) for s, i, t in self.children[name].last.get("positions", [])}

    def _behind(self, target: dict[tuple[str, str], int] | None = None) -> dict[str, int]:
        """Per worker: stream IDs between its positions and the writers' (summed over
        streams and writers; for the display)."""
        if target is None:
            target = {}
            for name in self.writer_names:
                target.update(self._positions(name))
        behind = {}
        for w in self.worker_names:
            mine = self._positions(w)
            behind[w] = sum(max(0, t - mine.get(k, 0)) for k, t in target.items())
        return behind

    def _check_children(self, roles: tuple[str, ...]) -> bool:
        ok = True
        for child in self.children.values():
            code = child.poll()
            if child.role in roles and code is not None and (code != 0 or child.role != "writer"):
                if child.role == "writer" and code == 0:
                    continue
                self.problems.append(f"{child.name} exited with status {code}: "
                                     + " | ".join(child.log_tail(4)))
                ok = False
        return ok

    def run(self, progress: Progress) -> None:
        writers = [self.children[n] for n in self.writer_names]
        started = time.monotonic()
        deadline = started + self.options.duration + 60.0
        restart_at = (started + self.options.restart_hub_after
                      if self.options.restart_hub_after is not None else None)
        while True:
            if restart_at is not None and time.monotonic() >= restart_at:
                restart_at = None
                if not self.restart_hub():
                    return
            self._drain()
            progress.update("writing", self._written(), self._received(), self._behind())
            if not self._check_children(("hub", "worker")):
                return
            codes = [w.poll() for w in writers]
            if all(c is not None for c in codes):
                break
            if any(c not in (None, 0) for c in codes):
                self._check_children(("writer",))
                return
            if time.monotonic() > deadline:
                self.problems.append("the writers did not finish in time")
                return
            time.sleep(0.1)
        self._drain()
        if not self._check_children(("writer",)):
            return
        # The database is the truth: wait until every worker reached every writer's
        # final position there.
        assert self.config is not None
        self.truth = read_facts(self.config)
        target = {key: max(tokens) for key, tokens in self.truth.items() if tokens}
        deadline = time.monotonic() + self.options.catch_up_timeout
        while time.monotonic() < deadline:
            self._drain()
            behind = self._behind(target)
            progress.update("catching up", self._written(), self._received(),
                            self._behind(target))
            if not any(behind.values()):
                return
            if not self._check_children(("hub", "worker")):
                return
            time.sleep(0.1)
        for w in self.worker_names:
            late = sorted(f"{s}/{i} at {self._positions(w).get((s, i), 0)} of {t}"
                          for (s, i), t in target.items() if self._positions(w).get((s, i), 0) < t)
            if late:
                self.problems.append(f"{w} did not catch up in {self.options.catch_up_timeout:g}s: "
                                     + ", ".join(late[:5]))

    def stop(self) -> dict[str, int | None]:
        """Ask the workers to finish (they check their caches and write what they
        received), then stop the writers and the hub."""
        codes: dict[str, int | None] = {}
        workers = [self.children[n] for n in self.worker_names if n in self.children]
        for child in workers:
            child.ask_to_stop()
        for child in workers:
            child.wait(30.0)
            codes[child.name] = child.stop()
        for name in self.writer_names + ["hub"]:
            other = self.children.get(name)
            if other is not None:
                codes[name] = other.stop()
        time.sleep(0.1)
        self._drain()
        return codes

    # --- the check -------------------------------------------------------------------

    def summarise(self, codes: dict[str, int | None], elapsed: float) -> Summary:
        truth = self.truth
        if truth is None and self.config is not None:
            truth = read_facts(self.config)
        truth = truth or {}
        expected = {(s, i, t) for (s, i), tokens in truth.items() for t in tokens}
        before = {(s, i, t) for (s, i), tokens in (self.before or {}).items() for t in tokens}
        previous: Counter[str] = Counter(s for s, _i, _t in before)
        written: Counter[str] = Counter()
        for (stream, _inst), tokens in truth.items():
            written[stream] += len(tokens)
        visible_at: dict[tuple[str, str, int], float] = {}
        for name in self.writer_names:
            for stream, inst, token, when in _read_jsonl(self._out(name)):
                visible_at[(stream, inst, token)] = when
        results = []
        for w in self.worker_names:
            check = check_worker(expected, visible_at,
                                 [(s, i, t, when) for s, i, t, when in _read_jsonl(self._out(w))],
                                 before)
            lost, dup, unexpected = check.lost, check.duplicated, check.unexpected
            final = self.children[w].done or self.children[w].last
            examples = [f"lost {s}/{i} token {t}" for s, i, t in sorted(lost)[:3]]
            examples += [f"duplicated {s}/{i} token {t} x{n}" for (s, i, t), n in
                         sorted(dup.items())[:3]]
            examples += [f"unexpected {s}/{i} token {t}" for s, i, t in sorted(unexpected)[:3]]
            examples += [str(m) for m in final.get("mismatch_examples", [])[:3]]
            results.append(WorkerResult(
                name=w, received=dict(check.received), lost=len(lost),
                duplicated=check.duplicates, unexpected=len(unexpected),
                lag_ms=check.lag_ms, sync_queries=int(final.get("sync_queries", 0)),
                sync_mismatches=int(final.get("sync_mismatches", 0)),
                cache_invalidations=int(final.get("cache_invalidations", 0)),
                exit_code=codes.get(w), examples=examples))
        for name in self.writer_names + ["hub"]:
            if codes.get(name) not in (0, None) and not any(
                    p.startswith(name) for p in self.problems):
                self.problems.append(f"{name} exited with status {codes.get(name)}: "
                                     + " | ".join(self.children[name].log_tail(4)))
        if not expected:
            self.problems.append("the writers persisted nothing")
        committed = Counter(stream for stream, _i, _t in visible_at)
        return Summary(duration=elapsed, database=self.db_url.partition(":")[0],
                       writers=self.writer_names, written=dict(written), workers=results,
                       committed=dict(committed), previous=dict(previous),
                       problems=list(self.problems))


def _console(stderr: bool) -> Console:
    probe = Console(stderr=stderr)
    # Wide enough for the summary tables when the output is a file or a pipe.
    return probe if probe.is_terminal else Console(stderr=stderr, width=160)


def run_demo(options: DemoOptions, console: Console | None = None,
             summary_console: Console | None = None) -> Summary:
    """Run the demo (see the module docstring), showing progress on *console*
    (stderr) and printing the summary on *summary_console* (stdout)."""
    console = console or _console(stderr=True)
    summary_console = summary_console or _console(stderr=False)
    run = _Run(options, console)
    transport = (f"through Redis {redis_url_for_display(options.redis)}" if options.redis
                 else f"hub on 127.0.0.1:{run.port}")
    console.print(f"streamrep demo: {transport}, database "
                  f"{run.db_url.partition(':')[0]}, writers {', '.join(run.writer_names)}, "
                  f"{options.workers} workers, {options.rooms} rooms, ~{options.rate:g} ops/s "
                  f"for {options.duration:g}s; logs in {run.workdir}",
                  highlight=False, markup=False)
    started = time.monotonic()
    codes: dict[str, int | None] = {}
    try:
        with Progress(console, run.worker_names, live=options.live) as progress:
            if run.start():
                run.run(progress)
    finally:
        codes = run.stop()
    summary = run.summarise(codes, time.monotonic() - started)
    render_summary(summary, summary_console)
    return summary

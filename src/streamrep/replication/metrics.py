"""Prometheus metrics of a replication hub or client.

Counting happens in plain dicts on the hot path; a custom collector turns them
into Prometheus families only when scraped, so a million commands a second do
not pay for a lock each. Each hub owns its own :class:`CollectorRegistry`, so
several hubs (or tests) in one process do not collide.
"""

from __future__ import annotations

from collections import Counter
from operator import attrgetter
from typing import Any, Callable, Iterable, Iterator, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

_command_name = attrgetter("NAME")

__all__ = ["ReplicationMetrics", "serve_metrics"]


class ReplicationMetrics(Collector):
    """Counters of one hub or client, exposed through :attr:`registry`.

    ``positions``, ``queue_depths``, ``queue_bytes``, ``gaps`` and ``refusals`` are
    callables the owner supplies, read at scrape time: ``() -> {(stream, instance):
    token}``, ``() -> {connection_name: queued_commands}``, ``() -> {connection_name:
    bytes waiting}``, ``() -> {(stream, instance): gaps}`` (gaps a reader could not
    fill) and ``() -> {reason: count}`` (what a verifying reader refused); :attr:`refused` counts what the owner itself refused,
    by reason. ``stalled`` ``() -> {(stream, instance): seconds}`` gives the writers
    a reader holds back now because its source cannot answer for them, and
    ``stalls`` ``() -> {(stream, instance): count}`` how often each was.
    """

    def __init__(
        self,
        positions: Callable[[], dict[tuple[str, str], int]] | None = None,
        queue_depths: Callable[[], dict[str, int]] | None = None,
        gaps: Callable[[], Mapping[tuple[str, str], int]] | None = None,
        refusals: Callable[[], Mapping[str, int]] | None = None,
        prefix: str = "streamrep_replication",
        stalled: Callable[[], Mapping[tuple[str, str], float]] | None = None,
        stalls: Callable[[], Mapping[tuple[str, str], int]] | None = None,
        queue_bytes: Callable[[], dict[str, int]] | None = None,
    ) -> None:
        self.prefix = prefix
        self.commands_in: Counter[str] = Counter()
        self.commands_out: Counter[str] = Counter()
        self.disconnects: Counter[str] = Counter()
        self.connections_total = 0
        self.refused: Counter[str] = Counter()
        self._gaps = gaps
        self._stalled = stalled
        self._stalls = stalls
        self._refusals = refusals
        self._positions = positions
        self._queue_depths = queue_depths
        self._queue_bytes = queue_bytes
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    # --- hot-path counting ------------------------------------------------------------

    def received_commands(self, commands: Iterable[Any]) -> None:
        # Counter.update counts an iterable in C: no Python step per command.
        self.commands_in.update(map(_command_name, commands))

    def sent(self, name: str, count: int) -> None:
        self.commands_out[name] += count

    def disconnected(self, reason: str) -> None:
        self.disconnects[reason] += 1

    def connected(self) -> None:
        self.connections_total += 1

    # --- the collector ----------------------------------------------------------------

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        p = self.prefix
        inbound = CounterMetricFamily(f"{p}_commands_received", "Commands received, by command", labels=["command"])
        for name, count in sorted(self.commands_in.items()):
            inbound.add_metric([name], count)
        yield inbound
        outbound = CounterMetricFamily(f"{p}_commands_sent", "Commands queued to peers, by command", labels=["command"])
        for name, count in sorted(self.commands_out.items()):
            outbound.add_metric([name], count)
        yield outbound
        disconnects = CounterMetricFamily(f"{p}_disconnects", "Connections ended, by reason", labels=["reason"])
        for reason, count in sorted(self.disconnects.items()):
            disconnects.add_metric([reason], count)
        yield disconnects
        yield CounterMetricFamily(f"{p}_connections", "Connections accepted or made", value=self.connections_total)
        refused = CounterMetricFamily(f"{p}_refused", "Commands refused (not accepted as facts), by reason",
                                      labels=["reason"])
        reasons = Counter(self.refused)
        if self._refusals is not None:
            reasons.update(self._refusals())
        for reason, count in sorted(reasons.items()):
            refused.add_metric([reason], count)
        yield refused
        if self._gaps is not None:
            gaps = CounterMetricFamily(f"{p}_gaps_unfilled",
                                       "Gaps a reader found and could not fill, per stream and writer",
                                       labels=["stream", "instance"])
            for (stream, instance), count in sorted(self._gaps().items()):
                gaps.add_metric([stream, instance], count)
            yield gaps
        yield from self._collect_stalls()
        if self._positions is not None:
            positions = GaugeMetricFamily(
                f"{p}_stream_position", "Latest token per stream and writer", labels=["stream", "instance"]
            )
            for (stream, instance), token in sorted(self._positions().items()):
                positions.add_metric([stream, instance], token)
            yield positions
        for name, what, read in (("queued_commands", "Commands", self._queue_depths),
                                 ("queued_bytes", "Bytes", self._queue_bytes)):
            if read is not None:
                waiting = GaugeMetricFamily(f"{p}_{name}", f"{what} waiting to be written, per connection",
                                            labels=["connection"])
                for conn_name, queued in sorted(read().items()):
                    waiting.add_metric([conn_name], queued)
                yield waiting


    def _collect_stalls(self) -> Iterator[Metric]:
        p = self.prefix
        if self._stalled is not None:
            stalled = GaugeMetricFamily(
                f"{p}_stalled_seconds", "Seconds a writer has been held back because its gap cannot be "
                "fetched (only writers held back now)", labels=["stream", "instance"])
            for (stream, instance), seconds in sorted(self._stalled().items()):
                stalled.add_metric([stream, instance], seconds)
            yield stalled
        if self._stalls is not None:
            stalls = CounterMetricFamily(f"{p}_stalls", "Times a writer was held back because its gap could "
                                         "not be fetched", labels=["stream", "instance"])
            for (stream, instance), count in sorted(self._stalls().items()):
                stalls.add_metric([stream, instance], count)
            yield stalls


def serve_metrics(metrics: ReplicationMetrics, host: str, port: int) -> Any:
    """Serve ``/metrics`` on *host*:*port* from a gevent WSGI server; returns it
    (started). Stop it with ``.stop()``."""
    from gevent.pywsgi import WSGIServer
    from prometheus_client import make_wsgi_app

    server = WSGIServer((host, port), make_wsgi_app(metrics.registry), log=None)
    server.start()
    return server

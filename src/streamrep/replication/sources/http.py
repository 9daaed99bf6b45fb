"""The reference's HTTP replication API as a catch-up source.

Every process of a reference deployment (matrix-synapse) that writes a stream
serves that stream's rows over HTTP, on the listener its ``instance_map`` entry
names (a listener with the ``replication`` resource)::

    GET /_synapse/replication/get_repl_stream_updates/<stream>/<txn_id>?from_token=A&upto_token=B
    Authorization: Bearer <worker_replication_secret>        (when one is set)

    200 {"updates": [[token, row], ...], "upto_token": T, "limited": false}

The writer answers for itself only: a gap of writer W is fetched from W's own
entry. The main process is ``master`` on the wire and ``main`` in
``instance_map``. ``<txn_id>`` is chosen by the caller: the writer keeps each
answer for a while under its ID and answers the same ID with the same answer, so
one request keeps one ID across its retries and every new request takes a new
one. The writer returns about 100 rows at a time; ``limited`` says more remain,
from ``upto_token`` on (an answer may be limited and empty: its rows were all
skipped, and the next request starts at its ``upto_token``).

:class:`HttpSource` is a :class:`~streamrep.replication.sources.CatchUpSource`
over that API. Each request has a timeout; a writer that does not answer, drops
the connection or answers 5xx is asked again with exponential backoff and jitter
(:class:`~streamrep.replication.backoff.Backoff`), and after the last attempt
:class:`~streamrep.errors.CatchUpUnavailableError` names the writer, its address
and the last problem. A writer that refuses the secret raises
:class:`~streamrep.errors.CatchUpRefusedError`: the reference answers a missing
or wrong secret with a 500 (an exception in its handler), so a 500 is told apart
from a failure of the stream by asking the same writer for an empty range, which
needs nothing but the secret. A stream the writer does not serve (400) raises
:class:`~streamrep.errors.UnknownStreamError`, an instance with no address
:class:`~streamrep.errors.UnknownWriterError`.

Requests go through the standard library's :mod:`http.client`, one kept-alive
connection per writer and caller; under gevent (``monkey.patch_all()``, as the
command-line tools do) they are cooperative.
"""

from __future__ import annotations

import http.client
import secrets
import socket
import ssl
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence
from urllib.parse import quote

import orjson

from streamrep.errors import CatchUpRefusedError, CatchUpUnavailableError, UnknownStreamError, UnknownWriterError
from streamrep.replication.backoff import Backoff

if TYPE_CHECKING:
    from streamrep.config.synapse import SynapseConfig

__all__ = [
    "HttpSource", "WriterAddress", "MAIN_INSTANCE", "MAIN_INSTANCE_MAP_KEY", "REFERENCE_STREAMS", "ENDPOINT",
]

#: The main process's instance name on the wire (``RDATA events master ...``).
MAIN_INSTANCE = "master"
#: ... and its key in ``instance_map``.
MAIN_INSTANCE_MAP_KEY = "main"

#: The path of the endpoint, under which ``<stream>/<txn_id>`` follow.
ENDPOINT = "/_synapse/replication/get_repl_stream_updates"

#: The streams of the reference (matrix-synapse 1.163), each served by its writers.
REFERENCE_STREAMS = (
    "events", "backfill", "presence", "presence_federation", "typing", "receipts", "push_rules", "pushers",
    "caches", "device_lists", "to_device", "federation", "account_data", "profile_updates", "sticky_events",
    "thread_subscriptions", "un_partial_stated_room", "un_partial_stated_event", "quarantined_media",
)

#: Statuses worth asking again: the writer is restarting, overloaded or failing.
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
#: Statuses that mean the writer refused the credentials.
_REFUSED_STATUSES = frozenset({401, 403})


@dataclass(frozen=True)
class WriterAddress:
    """Where one writer's replication listener is: *host* and *port* (``https``
    with *tls*), or the Unix socket *path*; an ``instance_map`` entry."""

    host: str | None = None
    port: int | None = None
    tls: bool = False
    path: str | None = None

    def __post_init__(self) -> None:
        if (self.path is None) == (self.host is None or self.port is None):
            raise ValueError("a writer's address is a host and a port, or a Unix socket path")

    def __str__(self) -> str:
        if self.path is not None:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if self.host is not None and ":" in self.host else self.host
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class _Failed(Exception):
    """One attempt failed; *retry*: asking again may help."""

    def __init__(self, problem: str, retry: bool = True, status: int | None = None) -> None:
        super().__init__(problem)
        self.retry = retry
        self.status = status


class HttpSource:
    """Rows of the writers of a reference deployment, over their HTTP replication
    API (see the module docstring).

    *writers* maps each writer's instance name, as it appears on the wire, to its
    :class:`WriterAddress` (:meth:`from_instance_map` takes an ``instance_map``,
    whose ``main`` is ``master``). *secret* is the deployment's
    ``worker_replication_secret`` (None: none is sent). *timeout* bounds each
    attempt (connecting, and each wait for the answer); *attempts* is how many
    times one request is tried, waiting between them as :class:`Backoff` says
    from *backoff_base* up to *backoff_max* seconds. *streams*: the streams it
    says it can fill (default: every stream of the reference).
    """

    #: a request may be cut short (a gevent.Timeout) and the connection is dropped
    interruptible = True

    def __init__(self, writers: Mapping[str, WriterAddress], *, secret: str | None = None,
                 timeout: float = 10.0, attempts: int = 4, backoff_base: float = 0.25, backoff_max: float = 4.0,
                 streams: Iterable[str] | None = None, ssl_context: ssl.SSLContext | None = None,
                 sleep: Callable[[float], Any] | None = None) -> None:
        if attempts < 1 or timeout <= 0:
            raise ValueError("need attempts >= 1 and timeout > 0")
        self.writers = dict(writers)
        self.secret = secret
        self.timeout = timeout
        self.attempts = attempts
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.ssl_context = ssl_context
        self._streams = tuple(streams) if streams is not None else REFERENCE_STREAMS
        self._sleep = sleep
        #: idle kept-alive connections per writer
        self._idle: dict[str, list[http.client.HTTPConnection]] = {}
        #: requests made (attempts included), for tests and benchmarks
        self.requests = 0

    @classmethod
    def from_instance_map(cls, instance_map: Mapping[str, WriterAddress], **options: Any) -> HttpSource:
        """A source over the writers of a reference ``instance_map`` (its ``main``
        entry is the main process, ``master`` on the wire)."""
        writers = {MAIN_INSTANCE if name == MAIN_INSTANCE_MAP_KEY else name: address
                   for name, address in instance_map.items()}
        return cls(writers, **options)

    @classmethod
    def from_synapse(cls, synapse: SynapseConfig, **options: Any) -> HttpSource:
        """A source over every writer in the ``instance_map`` of a reference
        ``homeserver.yaml`` (:func:`streamrep.config.load_synapse_config`), with its
        replication secret."""
        addresses = {name: WriterAddress(entry.host, entry.port, entry.tls, entry.path)
                     for name, entry in synapse.instance_map.items()}
        options.setdefault("secret", synapse.replication_secret)
        return cls.from_instance_map(addresses, **options)

    def stream_names(self) -> Sequence[str]:
        return list(self._streams)

    def where(self, instance: str) -> str:
        """The address of writer *instance*, for messages."""
        address = self.writers.get(instance)
        return str(address) if address is not None else "(not in instance_map)"

    def close(self) -> None:
        """Close the kept-alive connections."""
        idle, self._idle = self._idle, {}
        for connections in idle.values():
            for connection in connections:
                connection.close()

    def __enter__(self) -> HttpSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the CatchUpSource ------------------------------------------------------------

    def updates(self, stream: str, instance: str, from_token: int, upto_token: int,
                limit: int) -> tuple[list[tuple[int, bytes]], bool]:
        """Rows of *instance* with ``from_token < token <= upto_token``, as the writer
        pages them (about 100 rows; *limit* is the writer's to choose). An answer
        that is limited but empty is followed here, from its ``upto_token``."""
        while True:
            answer = self._fetch(stream, instance, from_token, upto_token)
            rows, answered_upto, limited = _parse(answer, stream, instance, self.where(instance))
            rows = [row for row in rows if from_token < row[0] <= upto_token]
            if rows or not limited:
                return rows, limited and answered_upto < upto_token
            if answered_upto <= from_token:
                raise CatchUpUnavailableError(
                    f"the writer {instance} at {self.where(instance)} answered {stream} from {from_token} "
                    f"with nothing, limited, up to {answered_upto}: it would never get further",
                    stream, instance, self.where(instance))
            from_token = answered_upto

    # --- one request, with its retries ------------------------------------------------

    def _fetch(self, stream: str, instance: str, from_token: int, upto_token: int) -> bytes:
        address = self.writers.get(instance)
        if address is None:
            raise UnknownWriterError(
                f"no address for the writer {instance!r} of {stream}: it is not in instance_map "
                f"(known: {', '.join(sorted(self.writers)) or 'none'}); add it there")
        # One transaction ID for this request and its retries: the writer answers a
        # retry whose first attempt it did receive from its cache.
        path = (f"{ENDPOINT}/{quote(stream, safe='')}/streamrep{secrets.token_hex(8)}"
                f"?from_token={int(from_token)}&upto_token={int(upto_token)}")
        backoff = Backoff(self.backoff_base, max(self.backoff_base, self.backoff_max))
        problem = ""
        tried = 0
        for attempt in range(self.attempts):
            if attempt:
                self._pause(backoff.next_delay())
            tried += 1
            try:
                return self._get(instance, address, path)
            except _Failed as failed:
                problem = str(failed)
                if failed.status == 500 and self._refuses_secret(instance, address):
                    raise self._refused(stream, instance, address, failed) from None
                if failed.status == 400 and "Unknown stream" in problem:
                    raise UnknownStreamError(f"the writer {instance} at {address} does not serve the stream "
                                             f"{stream!r}: {problem}") from None
                if failed.status in _REFUSED_STATUSES:
                    raise self._refused(stream, instance, address, failed) from None
                if not failed.retry:
                    break
        raise CatchUpUnavailableError(
            f"the writer {instance} at {address} did not answer for {stream} "
            f"({tried} attempt{'s' if tried != 1 else ''}): {problem}",
            stream, instance, str(address))

    def _refused(self, stream: str, instance: str, address: WriterAddress, failed: _Failed) -> CatchUpRefusedError:
        given = "a wrong" if self.secret else "no"
        return CatchUpRefusedError(
            f"the writer {instance} at {address} refused the request for {stream} ({failed}) even for an "
            f"empty range: the replication secret is missing or wrong ({given} secret was sent); set "
            "worker_replication_secret (or worker_replication_secret_path) to the writers' own",
            stream, instance, str(address))

    def _refuses_secret(self, instance: str, address: WriterAddress) -> bool:
        """A 500: does the writer refuse even an empty range of ``events`` (which it
        answers without reading anything once the secret is right)?"""
        path = f"{ENDPOINT}/events/streamrep{secrets.token_hex(8)}?from_token=0&upto_token=0"
        try:
            self._get(instance, address, path)
        except _Failed as failed:
            return failed.status == 500 or failed.status in _REFUSED_STATUSES
        return False

    def _pause(self, seconds: float) -> None:
        if self._sleep is not None:
            self._sleep(seconds)
            return
        import gevent

        gevent.sleep(seconds)

    def _connection(self, instance: str, address: WriterAddress) -> http.client.HTTPConnection:
        idle = self._idle.get(instance)
        if idle:
            return idle.pop()
        if address.path is not None:
            return _UnixConnection(address.path, self.timeout)
        assert address.host is not None and address.port is not None
        if address.tls:
            context = self.ssl_context or ssl.create_default_context()
            return http.client.HTTPSConnection(address.host, address.port, timeout=self.timeout, context=context)
        return http.client.HTTPConnection(address.host, address.port, timeout=self.timeout)

    def _get(self, instance: str, address: WriterAddress, path: str) -> bytes:
        """One attempt: the answer's body on 200, else :class:`_Failed`. A kept-alive
        connection the writer closed meanwhile is replaced at once."""
        headers = {"Accept": "application/json"}
        if self.secret:
            headers["Authorization"] = f"Bearer {self.secret}"
        while True:
            reused = bool(self._idle.get(instance))
            connection = self._connection(instance, address)
            self.requests += 1
            try:
                connection.request("GET", path, headers=headers)
                response = connection.getresponse()
                body = response.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                connection.close()
                if not reused:
                    raise _Failed(_describe(exc)) from None
            except BaseException:
                connection.close()  # cut short: the connection is in no known state
                raise
        if response.will_close:
            connection.close()
        else:
            self._idle.setdefault(instance, []).append(connection)
        status = response.status
        if status == 200:
            return body
        problem = f"{status} {_error_text(body)}"
        if status == 404:
            problem += " (is instance_map pointing at a listener with the replication resource?)"
        raise _Failed(problem, retry=status in _RETRY_STATUSES, status=status)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "no answer in time (timed out)"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is the writer running, and is this its replication listener?)"
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


def _error_text(body: bytes) -> str:
    """The reference's error (``{"errcode": ..., "error": ...}``) or the start of the body."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:120].decode("utf-8", "replace").strip() or "(no body)"
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return str(doc["error"])
    return body[:120].decode("utf-8", "replace")


def _parse(body: bytes, stream: str, instance: str, where: str) -> tuple[list[tuple[int, bytes]], int, bool]:
    """``(rows, upto_token, limited)`` of an answer; the rows as ``(token, row_json)``."""
    try:
        doc = orjson.loads(body)
        updates, upto_token, limited = doc["updates"], doc["upto_token"], doc["limited"]
        if type(upto_token) is not int or type(limited) is not bool or not isinstance(updates, list):
            raise TypeError
        dumps = orjson.dumps
        rows = []
        for token, row in updates:
            if type(token) is not int:
                raise TypeError
            rows.append((token, dumps(row)))
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise CatchUpUnavailableError(
            f"the writer {instance} at {where} answered {stream} with what is not a stream update "
            f"({body[:120]!r}); is instance_map pointing at its replication listener?",
            stream, instance, where) from None
    return rows, upto_token, limited

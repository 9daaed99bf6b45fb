"""A writer's HTTP replication listener, as the reference serves it, for unit tests.

:class:`FakeWriter` answers ``GET /_synapse/replication/get_repl_stream_updates/
<stream>/<txn_id>?from_token=A&upto_token=B`` from rows held in memory, the way
the reference does: its own rows with ``A < token <= B``, about *page* rows an
answer (whole tokens), ``limited`` when more remain; each answer kept under its
transaction ID and given again for the same ID; a missing or wrong secret is an
exception in the reference's handler, so a 500 (``refusal_status`` changes that);
an unknown stream a 400. It runs in a thread of its own on 127.0.0.1 (or a Unix
socket), and can be stopped and started again on the same address.
"""

from __future__ import annotations

import http.server
import os
import socket
import socketserver
import threading
import time
from typing import Any
from urllib.parse import parse_qs, urlsplit

import orjson

from support.redis_server import free_port

PREFIX = "/_synapse/replication/get_repl_stream_updates/"


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass

    def setup(self) -> None:
        super().setup()
        if self.connection.family != socket.AF_UNIX:
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.writer.connections.add(self.connection)

    def finish(self) -> None:
        self.server.writer.connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def do_GET(self) -> None:
        writer: FakeWriter = self.server.writer
        status, body = writer.answer(self.path, self.headers.get("Authorization"))
        if status is None:
            return  # a writer that hangs: no answer at all
        data = orjson.dumps(body)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _TcpServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self) -> Any:
        request, _address = super().get_request()
        return request, ("unix", 0)


class FakeWriter:
    """One writer instance's replication listener (see the module docstring)."""

    def __init__(self, instance: str, *, secret: str | None = None, page: int = 100,
                 refusal_status: int = 500, unix_path: str | None = None) -> None:
        self.instance = instance
        self.secret = secret
        self.page = page
        self.refusal_status = refusal_status
        self.unix_path = unix_path
        self.port = 0 if unix_path is not None else free_port()
        #: stream -> [(token, row)] in token order
        self.rows: dict[str, list[tuple[int, Any]]] = {}
        #: (stream, txn_id, from_token, upto_token) of every request received
        self.requests: list[tuple[str, str, int, int]] = []
        #: answers to give first, in order, instead of reading rows: a status, or
        #: ("empty-limited", upto) for an answer that is limited with no rows, or
        #: "hang" for no answer at all
        self.scripted: list[Any] = []
        self._cache: dict[str, tuple[int, Any]] = {}
        #: connections open now (closed when the writer stops)
        self.connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None

    # --- the rows --------------------------------------------------------------------

    def add(self, stream: str, token: int, *rows: Any) -> None:
        with self._lock:
            held = self.rows.setdefault(stream, [])
            assert not held or token > held[-1][0], "tokens of a writer increase"
            held.extend((token, row) for row in rows)

    def keep_latest_per_key(self, stream: str) -> None:
        """Forget every row of *stream* but the last one per key (its first field),
        as the reference's streams that serve only the current row per key do."""
        with self._lock:
            latest: dict[Any, tuple[int, Any]] = {}
            for token, row in self.rows.get(stream, []):
                latest[orjson.dumps(row[0])] = (token, row)
            self.rows[stream] = sorted(latest.values(), key=lambda item: item[0])

    # --- serving ---------------------------------------------------------------------

    def answer(self, path: str, authorization: str | None) -> tuple[int | None, Any]:
        parts = urlsplit(path)
        if not parts.path.startswith(PREFIX):
            return 404, {"errcode": "M_UNRECOGNIZED", "error": "Unrecognized request"}
        stream, _, txn = parts.path[len(PREFIX):].partition("/")
        if self.secret is not None and authorization != f"Bearer {self.secret}":
            return self.refusal_status, {"errcode": "M_UNKNOWN", "error": "Internal server error"}
        query = parse_qs(parts.query)
        try:
            from_token, upto_token = int(query["from_token"][0]), int(query["upto_token"][0])
        except (KeyError, ValueError):
            return 400, {"errcode": "M_MISSING_PARAM", "error": "Missing required integer query parameter"}
        with self._lock:
            self.requests.append((stream, txn, from_token, upto_token))
            if txn in self._cache:
                return self._cache[txn]
            if self.scripted and from_token != upto_token:  # an empty range reads nothing
                step = self.scripted.pop(0)
                if step == "hang":
                    time.sleep(5)
                    return None, None
                if isinstance(step, tuple):
                    return 200, {"updates": [], "upto_token": step[1], "limited": True}
                return step, {"errcode": "M_UNKNOWN", "error": f"scripted {step}"}
            if stream not in self.rows and stream not in ("events", "typing"):
                return 400, {"errcode": "M_UNKNOWN", "error": "Unknown stream"}
            result = (200, self._updates(stream, from_token, upto_token))
            self._cache[txn] = result
            return result

    def _updates(self, stream: str, from_token: int, upto_token: int) -> dict[str, Any]:
        if from_token == upto_token:
            return {"updates": [], "upto_token": upto_token, "limited": False}
        rows = [(t, r) for t, r in self.rows.get(stream, []) if from_token < t <= upto_token]
        if len(rows) > self.page:
            end = self.page
            while end < len(rows) and rows[end][0] == rows[end - 1][0]:
                end += 1
            if end < len(rows):
                return {"updates": [list(r) for r in rows[:end]], "upto_token": rows[end - 1][0], "limited": True}
        return {"updates": [list(r) for r in rows], "upto_token": upto_token, "limited": False}

    # --- up and down -----------------------------------------------------------------

    @property
    def address(self) -> Any:
        from streamrep.replication.sources.http import WriterAddress

        if self.unix_path is not None:
            return WriterAddress(path=self.unix_path)
        return WriterAddress("127.0.0.1", self.port)

    def start(self) -> FakeWriter:
        if self.unix_path is not None:
            if os.path.exists(self.unix_path):
                os.unlink(self.unix_path)
            server: Any = _UnixServer(self.unix_path, _Handler)
        else:
            server = _TcpServer(("127.0.0.1", self.port), _Handler)
        server.writer = self
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening: new connections are refused (kept-alive ones are closed)."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        for connection in list(self.connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> FakeWriter:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


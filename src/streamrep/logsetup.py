"""Structured logging: one line per event, ``logfmt`` or JSON lines.

Every line carries a timestamp, the level, the logger, an event name and fields::

    ts=2026-11-21T20:41:07.113Z level=warning logger=streamrep.hub event=consumer_too_slow conn=worker2 queued=10000

Servers and clients get a logger with fields bound once (the connection's name, the
stream) and add per-event fields as keywords::

    from streamrep.logsetup import get_logger, setup_logging
    setup_logging("INFO", "logfmt")
    log = get_logger("streamrep.hub", conn="worker1")
    log.info("connected", peer="127.0.0.1:50412")
    log.bind(stream="events").debug("rdata", token=42)

Modules that use the standard library's ``logging`` get the same lines; fields can
be passed as ``logger.info("peer_closed", extra={"conn": name})``.

A line never spans several lines: multi-line values (tracebacks included) are
escaped, so ``grep`` and log shippers see one event per line. Expected failures (a
peer that hung up, a slow consumer) deserve ``log.warning(event, error=str(exc))``,
not a traceback; ``log.exception`` is for bugs.
"""

from __future__ import annotations

import datetime
import logging
import sys
import traceback
from typing import IO, Mapping

import orjson

__all__ = [
    "BoundLogger",
    "JsonFormatter",
    "LogfmtFormatter",
    "format_logfmt",
    "get_logger",
    "setup_logging",
]

_FIELDS_ATTR = "streamrep_fields"
_EVENT_ATTR = "streamrep_event"
_HANDLER_NAME = "streamrep-structured"


def _timestamp(created: float) -> str:
    moment = datetime.datetime.fromtimestamp(created, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _logfmt_value(value: object) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = value if isinstance(value, str) else str(value)
    if text and not any(c in text for c in ' ="\\\n\r\t') and text.isprintable():
        return text
    escaped = (text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
               .replace("\r", "\\r").replace("\t", "\\t"))
    return f'"{escaped}"'


def format_logfmt(fields: Mapping[str, object]) -> str:
    """Render *fields* as one ``key=value`` line (values quoted and escaped as needed)."""
    return " ".join(f"{key}={_logfmt_value(value)}" for key, value in fields.items())


#: Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", _FIELDS_ATTR, _EVENT_ATTR}


def _record_fields(record: logging.LogRecord) -> dict[str, object]:
    fields: dict[str, object] = {
        "ts": _timestamp(record.created),
        "level": record.levelname.lower(),
        "logger": record.name,
    }
    event = getattr(record, _EVENT_ATTR, None)
    if event is not None:
        fields["event"] = event
    else:
        # A record from a library's own logging: its message is the event.
        fields["event"] = "message"
        fields["msg"] = record.getMessage()
    # Plain ``logging`` calls may pass fields with ``extra={"conn": ..., "stream": ...}``.
    for key, value in vars(record).items():
        if key not in _STANDARD_ATTRS and not key.startswith("_"):
            fields[key if key not in fields else f"field_{key}"] = value
    extra = getattr(record, _FIELDS_ATTR, None)
    if extra:
        for key, value in extra.items():
            fields[key if key not in fields else f"field_{key}"] = value
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        fields["error"] = f"{type(exc).__name__}: {exc}"
        fields["traceback"] = "".join(traceback.format_exception(*record.exc_info)).rstrip()
    return fields


class LogfmtFormatter(logging.Formatter):
    """Formats records as ``key=value`` lines."""

    def format(self, record: logging.LogRecord) -> str:
        return format_logfmt(_record_fields(record))


class JsonFormatter(logging.Formatter):
    """Formats records as one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        return orjson.dumps(_record_fields(record), default=str).decode()


class BoundLogger:
    """A logger with fields bound to it; each call logs one event with more fields."""

    __slots__ = ("_logger", "_fields")

    def __init__(self, logger: logging.Logger, fields: Mapping[str, object]) -> None:
        self._logger = logger
        self._fields = dict(fields)

    @property
    def name(self) -> str:
        """The underlying logger's name."""
        return self._logger.name

    @property
    def fields(self) -> Mapping[str, object]:
        """The bound fields."""
        return dict(self._fields)

    def bind(self, **fields: object) -> BoundLogger:
        """A logger with *fields* added to the bound ones."""
        return BoundLogger(self._logger, {**self._fields, **fields})

    def is_enabled_for(self, level: int) -> bool:
        """Whether an event at *level* would be written (skip costly fields if not)."""
        return self._logger.isEnabledFor(level)

    def _emit(self, level: int, event: str, fields: Mapping[str, object],
              exc_info: bool = False) -> None:
        if not self._logger.isEnabledFor(level):
            return
        self._logger.log(level, event, exc_info=exc_info, stacklevel=3, extra={
            _EVENT_ATTR: event, _FIELDS_ATTR: {**self._fields, **fields}})

    def log(self, level: int, event: str, **fields: object) -> None:
        """Log *event* at *level* with the bound fields and *fields*."""
        self._emit(level, event, fields)

    def debug(self, event: str, **fields: object) -> None:
        """Log a detail useful while investigating (per-command traffic)."""
        self._emit(logging.DEBUG, event, fields)

    def info(self, event: str, **fields: object) -> None:
        """Log a normal lifecycle event (started, connected, caught up)."""
        self._emit(logging.INFO, event, fields)

    def warning(self, event: str, **fields: object) -> None:
        """Log something an operator may act on (slow consumer, peer timed out)."""
        self._emit(logging.WARNING, event, fields)

    def error(self, event: str, **fields: object) -> None:
        """Log a failure of this process's own work (a write that failed)."""
        self._emit(logging.ERROR, event, fields)

    def exception(self, event: str, **fields: object) -> None:
        """Log an unexpected exception (call from an ``except`` block) with its
        traceback, escaped into the same line."""
        self._emit(logging.ERROR, event, fields, exc_info=True)


def get_logger(name: str, **fields: object) -> BoundLogger:
    """The structured logger *name* (use a ``streamrep.`` name) with *fields* bound."""
    return BoundLogger(logging.getLogger(name), fields)


def setup_logging(level: str | int = "INFO", fmt: str = "logfmt",
                  stream: IO[str] | None = None) -> logging.Handler:
    """Send log lines of every logger to *stream* (stderr), one line per event.

    *fmt* is ``"logfmt"`` or ``"json"``. Calling it again replaces the handler it
    installed before rather than adding another. Returns the handler.
    """
    if fmt not in ("logfmt", "json"):
        raise ValueError(f"unknown log format {fmt!r} (use logfmt or json)")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == _HANDLER_NAME:
            root.removeHandler(old)
    root.addHandler(handler)
    numeric = level if isinstance(level, int) else logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    root.setLevel(numeric)
    # Libraries are chatty at DEBUG; keep their noise at WARNING unless asked.
    for noisy in ("py4j", "urllib3"):
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    return handler


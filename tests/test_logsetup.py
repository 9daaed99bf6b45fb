"""Structured logging: one line per event, fields bound once."""

from __future__ import annotations

import io
import logging
from typing import Iterator

import orjson
import pytest

from streamrep.logsetup import format_logfmt, get_logger, setup_logging


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_logfmt_line_has_bound_and_event_fields(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("INFO", "logfmt", out)
    log = get_logger("streamrep.hub", conn="worker1")
    log.bind(stream="events").info("caught_up", token=42, note="two words")
    log.debug("not_shown")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    line = lines[0]
    assert line.startswith("ts=") and line.split()[0].endswith("Z")
    assert (" level=info logger=streamrep.hub event=caught_up conn=worker1 stream=events "
            'token=42 note="two words"') in line


def test_json_lines_and_exceptions_stay_on_one_line(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("DEBUG", "json", out)
    log = get_logger("streamrep.client", conn="w")
    try:
        raise ValueError("bad\nthing")
    except ValueError:
        log.exception("handler_failed", stream="caches")
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    record = orjson.loads(lines[0])
    assert record["event"] == "handler_failed" and record["level"] == "error"
    assert record["error"] == "ValueError: bad\nthing"
    assert "Traceback" in record["traceback"] and record["stream"] == "caches"


def test_setup_twice_keeps_one_handler_and_library_records_are_lines(
        restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("INFO", "logfmt", out)
    setup_logging("INFO", "logfmt", out)
    logging.getLogger("somelib").warning("plain %s\nmessage", "old-style")
    assert out.getvalue().count("\n") == 1
    assert 'event=message msg="plain old-style\\nmessage"' in out.getvalue()


def test_logfmt_escaping() -> None:
    assert format_logfmt({"a": "", "b": 'x"y', "c": None, "d": True, "e": 1.5}) == \
        'a="" b="x\\"y" c=null d=true e=1.5'


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        setup_logging("INFO", "xml")


def test_stdlib_extra_becomes_fields(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("INFO", "logfmt", out)
    logging.getLogger("streamrep.replication.hub").info(
        "connection closed", extra={"conn": "worker1", "reason": "peer_closed"})
    line = out.getvalue()
    assert line.count("\n") == 1
    assert ('event=message msg="connection closed" conn=worker1 reason=peer_closed') in line

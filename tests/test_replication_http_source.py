"""The reference's HTTP replication API as a catch-up source (``HttpSource``),
against a local listener that answers as the reference does (support/repl_http.py)."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Iterator

import orjson
import pytest

from streamrep.errors import CatchUpRefusedError, CatchUpUnavailableError, UnknownStreamError, UnknownWriterError
from streamrep.replication.sources import CatchUpSource, pages
from streamrep.replication.sources.http import MAIN_INSTANCE, HttpSource, WriterAddress
from support.repl_http import FakeWriter


_opened: list[HttpSource] = []


@pytest.fixture(autouse=True)
def _close_sources() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


def _source(*writers: FakeWriter, **options: Any) -> HttpSource:
    options.setdefault("backoff_base", 0.01)
    options.setdefault("backoff_max", 0.02)
    source = HttpSource({w.instance: w.address for w in writers}, **options)
    _opened.append(source)
    return source


def _rows(source: CatchUpSource, stream: str, instance: str, after: int, upto: int) -> list[tuple[int, Any]]:
    return [(token, orjson.loads(row)) for page in pages(source, stream, instance, after, upto, 1000)
            for token, row in page]


@pytest.fixture
def writer() -> Iterator[FakeWriter]:
    with FakeWriter(MAIN_INSTANCE, secret="s3cret", page=10) as running:
        yield running


def test_pages_through_limited_answers_in_token_order(writer: FakeWriter) -> None:
    expected = []
    for token in range(1, 60):
        rows = [["ev", [f"$e{token}-{n}", "!room:example.com"]] for n in range(1 + token % 3)]
        writer.add("events", token, *rows)
        expected.extend((token, row) for row in rows)
    source = _source(writer, secret="s3cret")
    assert _rows(source, "events", MAIN_INSTANCE, 0, 59) == expected
    # Each page went on where the last one ended (rows of a token are never split).
    assert [a for _s, _t, a, _b in writer.requests] == [0, 5, 11, 17, 23, 29, 35, 41, 47, 53]
    assert _rows(source, "events", MAIN_INSTANCE, 20, 40) == [r for r in expected if 20 < r[0] <= 40]
    # Every request a new transaction ID (the writer answers an ID it knows from its cache).
    txns = [txn for _stream, txn, _a, _b in writer.requests]
    assert len(txns) == len(set(txns)) == 14


def test_rows_are_what_an_rdata_line_carries(writer: FakeWriter) -> None:
    row = ["ev", ["$e:example.com", "!r:example.com", "m.room.message", None, None, None, None, False, 0]]
    writer.add("events", 7, row)
    rows, limited = _source(writer, secret="s3cret").updates("events", MAIN_INSTANCE, 0, 7, 100)
    assert rows == [(7, orjson.dumps(row))] and limited is False


def test_an_answer_limited_and_empty_goes_on_from_its_upto_token(writer: FakeWriter) -> None:
    for token in (3, 9, 15):
        writer.add("receipts", token, ["!r:example.com", "m.read", f"@u{token}:example.com", "$e", None, {}])
    writer.scripted = [("empty-limited", 4), ("empty-limited", 10)]
    rows, limited = _source(writer, secret="s3cret").updates("receipts", MAIN_INSTANCE, 0, 15, 100)
    assert [token for token, _row in rows] == [15]
    assert [(a, b) for _s, _t, a, b in writer.requests] == [(0, 15), (4, 15), (10, 15)]
    assert limited is False


@pytest.mark.parametrize("status", [500, 401])
def test_a_wrong_or_missing_secret_is_refused_with_a_clear_error(status: int) -> None:
    with FakeWriter(MAIN_INSTANCE, secret="s3cret", refusal_status=status) as writer:
        writer.add("events", 1, ["ev", ["$e"]])
        with pytest.raises(CatchUpRefusedError) as wrong:
            _source(writer, secret="not-it").updates("events", MAIN_INSTANCE, 0, 1, 100)
        with pytest.raises(CatchUpRefusedError) as missing:
            _source(writer).updates("events", MAIN_INSTANCE, 0, 1, 100)
        assert _source(writer, secret="s3cret").updates("events", MAIN_INSTANCE, 0, 1, 100)[0]
    assert "a wrong secret was sent" in str(wrong.value) and "worker_replication_secret" in str(wrong.value)
    assert "no secret was sent" in str(missing.value)
    assert (wrong.value.stream, wrong.value.instance) == ("events", MAIN_INSTANCE)


def test_a_failing_stream_is_retried_and_then_named(writer: FakeWriter) -> None:
    """A 500 for one stream while the secret is right (an empty range answers):
    the stream's failure, asked again with backoff, then reported."""
    writer.add("caches", 2, ["get_user", ["@u:example.com"], 0])
    slept: list[float] = []
    source = _source(writer, secret="s3cret", attempts=3, sleep=slept.append)
    writer.scripted = [500, 500, 500]
    with pytest.raises(CatchUpUnavailableError) as failed:
        source.updates("caches", MAIN_INSTANCE, 0, 2, 100)
    assert not isinstance(failed.value, CatchUpRefusedError)
    assert "500" in str(failed.value) and "3 attempts" in str(failed.value) and "caches" in str(failed.value)
    assert len(slept) == 2
    writer.scripted = [503]
    assert source.updates("caches", MAIN_INSTANCE, 0, 2, 100)[0] == [(2, b'["get_user",["@u:example.com"],0]')]


def test_retries_of_one_request_keep_its_transaction_id(writer: FakeWriter) -> None:
    writer.add("events", 1, ["ev", ["$e1"]])
    writer.add("events", 2, ["ev", ["$e2"]])
    source = _source(writer, secret="s3cret")
    writer.scripted = [502]
    source.updates("events", MAIN_INSTANCE, 0, 1, 100)
    source.updates("events", MAIN_INSTANCE, 1, 2, 100)
    txns = [txn for _s, txn, _a, _b in writer.requests]
    assert txns[0] == txns[1] != txns[2]


def test_a_writer_that_is_down_is_named_after_the_retries(writer: FakeWriter) -> None:
    writer.add("events", 1, ["ev", ["$e1"]])
    slept: list[float] = []
    source = _source(writer, secret="s3cret", attempts=4, backoff_base=0.5, backoff_max=8.0, sleep=slept.append)
    assert source.updates("events", MAIN_INSTANCE, 0, 1, 100)[0]  # a kept-alive connection now
    writer.stop()
    with pytest.raises(CatchUpUnavailableError) as down:
        source.updates("events", MAIN_INSTANCE, 0, 1, 100)
    assert f"the writer master at http://127.0.0.1:{writer.port}" in str(down.value)
    assert "connection refused" in str(down.value) and "4 attempts" in str(down.value)
    # Exponential backoff with jitter: each wait between half and all of base * 2**n.
    assert len(slept) == 3
    assert all(0.5 * 2 ** n / 2 <= delay <= 0.5 * 2 ** n for n, delay in enumerate(slept))
    writer.start()
    assert source.updates("events", MAIN_INSTANCE, 0, 1, 100)[0] == [(1, b'["ev",["$e1"]]')]


def test_a_writer_that_does_not_answer_times_out(writer: FakeWriter) -> None:
    writer.scripted = ["hang"]
    source = _source(writer, secret="s3cret", timeout=0.3, attempts=1)
    with pytest.raises(CatchUpUnavailableError) as late:
        source.updates("events", MAIN_INSTANCE, 0, 1, 100)
    assert "timed out" in str(late.value)


def test_unknown_streams_and_writers(writer: FakeWriter) -> None:
    source = _source(writer, secret="s3cret")
    with pytest.raises(UnknownStreamError, match="does not serve the stream 'no_such_stream'"):
        source.updates("no_such_stream", MAIN_INSTANCE, 0, 5, 100)
    with pytest.raises(UnknownWriterError, match="'persister9' of events: it is not in instance_map"):
        source.updates("events", "persister9", 0, 5, 100)


def test_a_listener_without_the_replication_resource_is_named(writer: FakeWriter) -> None:
    writer.scripted = [404]
    with pytest.raises(CatchUpUnavailableError, match="listener with the replication resource"):
        _source(writer, secret="s3cret").updates("events", MAIN_INSTANCE, 0, 5, 100)


def test_the_instance_map_names_the_main_process_main(writer: FakeWriter) -> None:
    writer.add("events", 1, ["ev", ["$e1"]])
    source = HttpSource.from_instance_map({"main": writer.address, "persister1": WriterAddress("127.0.0.1", 1)},
                                          secret="s3cret")
    _opened.append(source)
    assert sorted(source.writers) == ["master", "persister1"]
    assert source.updates("events", "master", 0, 1, 100)[0] == [(1, b'["ev",["$e1"]]')]


def test_a_writer_on_a_unix_socket(tmp_path: pathlib.Path) -> None:
    path = os.path.join(tmp_path, "main.sock")
    with FakeWriter(MAIN_INSTANCE, unix_path=path) as writer:
        writer.add("typing", 4, ["!r:example.com", ["@u:example.com"]])
        source = HttpSource({MAIN_INSTANCE: writer.address})
        _opened.append(source)
        assert source.updates("typing", MAIN_INSTANCE, 0, 4, 100)[0] == [(4, b'["!r:example.com",["@u:example.com"]]')]
        assert source.where(MAIN_INSTANCE) == f"unix:{path}"

"""Splitting a Redis subscription's bytes into message payloads (``pubsub``), on
both core implementations, and compiled against pure over generated streams cut
at random places."""

from __future__ import annotations

from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamrep.errors import MalformedReplyError
from streamrep.replication.transport.redis_connection import encode_publish
from support.impls import core_module


@pytest.fixture
def pubsub(impl_kind: str) -> ModuleType:
    return core_module("pubsub", impl_kind)


def message(payload: bytes, channel: bytes = b"example.com") -> bytes:
    """A ``message`` reply as Redis sends it to a subscriber."""
    return b"*3\r\n$7\r\nmessage\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (
        len(channel), channel, len(payload), payload)


PONG = b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"
SUBSCRIBED = b"*3\r\n$9\r\nsubscribe\r\n$11\r\nexample.com\r\n:1\r\n"


def test_messages_come_out_as_lines_and_every_reply_is_counted(pubsub: ModuleType) -> None:
    data = SUBSCRIBED + message(b"RDATA events w 1 []") + PONG + message(b"POSITION events w 1 2")
    assert pubsub.MessageSplitter().feed(data) == (b"RDATA events w 1 []\nPOSITION events w 1 2\n", 4)


def test_a_reply_cut_anywhere_waits_for_the_rest(pubsub: ModuleType) -> None:
    data = message(b"RDATA caches w 7 [1]") + PONG + message(b"")
    for cut in range(len(data) + 1):
        splitter = pubsub.MessageSplitter()
        first, first_count = splitter.feed(data[:cut])
        second, second_count = splitter.feed(data[cut:])
        assert (first + second, first_count + second_count) == (b"RDATA caches w 7 [1]\n\n", 3), cut


def test_messages_starting_with_skip_are_counted_not_returned(pubsub: ModuleType) -> None:
    data = message(b"RDATA a") + message(b"POSITION b") + message(b"RDATA c")
    assert pubsub.MessageSplitter().feed(data, b"RDATA ") == (b"POSITION b\n", 3)


def test_only_message_replies_of_three_values_carry_payloads(pubsub: ModuleType) -> None:
    data = (b"*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$1\r\nc\r\n$1\r\nx\r\n"  # not subscribed to patterns
            b"*3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$-1\r\n"  # a null payload
            b"+OK\r\n-ERR something\r\n:5\r\n$-1\r\n*-1\r\n*0\r\n")
    assert pubsub.MessageSplitter().feed(data) == (b"", 8)


@pytest.mark.parametrize("data", [
    b"?what\r\n", b":12a\r\n", b"$abc\r\n", b"$3\r\nabcd\r\n", b"$-5\r\n", b"*-2\r\n", b":\r\n",
    b"*1\r\n*1\r\n:1\r\n",  # a subscription's replies hold no arrays
])
def test_what_is_not_a_reply_is_refused(pubsub: ModuleType, data: bytes) -> None:
    with pytest.raises(MalformedReplyError):
        pubsub.MessageSplitter().feed(data)


def test_a_bulk_string_over_the_limit_is_refused(pubsub: ModuleType) -> None:
    with pytest.raises(MalformedReplyError, match="more than 10"):
        pubsub.MessageSplitter(max_bulk=10).feed(message(b"x" * 11))
    assert pubsub.MessageSplitter(max_bulk=11).feed(message(b"x" * 11)) == (b"x" * 11 + b"\n", 1)


def test_it_reads_what_encode_publish_writes_the_other_way(pubsub: ModuleType) -> None:
    # PUBLISH commands are arrays of bulk strings too: a splitter counts them.
    assert pubsub.MessageSplitter().feed(encode_publish("c", [b"a", b"b"])) == (b"", 2)


_payload = st.binary(max_size=40)
_reply = st.one_of(_payload.map(message), st.just(PONG), st.just(SUBSCRIBED),
                   st.integers(-5, 10**12).map(lambda n: b":%d\r\n" % n),
                   st.text("abc ", max_size=5).map(lambda t: b"+" + t.encode() + b"\r\n"))


@settings(max_examples=300, deadline=None)
@given(replies=st.lists(_reply, max_size=30), cuts=st.lists(st.integers(0, 2000), max_size=6),
       skip=st.sampled_from([None, b"", b"R", b"RDATA "]))
def test_compiled_and_pure_agree_however_the_bytes_are_cut(
        replies: list[bytes], cuts: list[int], skip: bytes | None) -> None:
    data = b"".join(replies)
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    results = []
    for kind in ("compiled", "pure"):
        splitter = core_module("pubsub", kind).MessageSplitter()
        out, count = b"", 0
        for start, end in zip(bounds, bounds[1:]):
            lines, replied = splitter.feed(data[start:end], skip)
            out += lines
            count += replied
        results.append((out, count))
    assert results[0] == results[1]
    assert results[0][1] == len(replies)

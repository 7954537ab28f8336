"""The asyncio driver's RESP2 reply reader: complete replies out, partial ones kept."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure._core.resp import ErrorReply, ReplyReader

STREAM = b"+OK\r\n:1\r\n:-2\r\n$3\r\nabc\r\n$-1\r\n$0\r\n\r\n*2\r\n:-2\r\n:17\r\n-ERR no\r\n*-1\r\n"
VALUES: list[object] = [b"OK", 1, -2, b"abc", None, b"", [-2, 17], ErrorReply("ERR no"), None]


def test_whole_stream_at_once() -> None:
    assert ReplyReader().feed(STREAM) == VALUES


@settings(max_examples=200, derandomize=True, database=None)
@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=12))
def test_any_split_gives_the_same_replies(cuts: list[int]) -> None:
    reader = ReplyReader()
    out: list[object] = []
    last = 0
    for cut in [*sorted(cuts), len(STREAM)]:
        out += reader.feed(STREAM[last:cut])
        last = cut
    assert out == VALUES


def test_byte_by_byte() -> None:
    reader = ReplyReader()
    out: list[object] = []
    for i in range(len(STREAM)):
        out += reader.feed(STREAM[i : i + 1])
    assert out == VALUES


def test_garbage_is_an_error() -> None:
    with pytest.raises(ValueError, match="not a RESP2 reply"):
        ReplyReader().feed(b"?what\r\n")

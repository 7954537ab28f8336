"""The RESP2 reply readers the drivers read with: complete replies out, partial ones kept."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure._core.resp import ErrorReply, ReplyReader
from tenure._driver.replies import (
    NOT_RESP,
    HiredisReader,
    PulledReplies,
    PullReader,
    pull_reader,
)

# The pure-Python reader, and hiredis's doing the same work (the one used when installed).
READERS = [ReplyReader, HiredisReader]

STREAM = b"+OK\r\n:1\r\n:-2\r\n$3\r\nabc\r\n$-1\r\n$0\r\n\r\n*2\r\n:-2\r\n:17\r\n-ERR no\r\n*-1\r\n"
VALUES: list[object] = [b"OK", 1, -2, b"abc", None, b"", [-2, 17], ErrorReply("ERR no"), None]


@pytest.mark.parametrize("reader", READERS)
def test_whole_stream_at_once(reader: type[ReplyReader]) -> None:
    assert reader().feed(STREAM) == VALUES


@settings(max_examples=200, derandomize=True, database=None)
@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=12), make=st.sampled_from(READERS))
def test_any_split_gives_the_same_replies(cuts: list[int], make: type[ReplyReader]) -> None:
    reader = make()
    out: list[object] = []
    last = 0
    for cut in [*sorted(cuts), len(STREAM)]:
        out += reader.feed(STREAM[last:cut])
        last = cut
    assert out == VALUES


@pytest.mark.parametrize("make", READERS)
def test_byte_by_byte(make: type[ReplyReader]) -> None:
    reader = make()
    out: list[object] = []
    for i in range(len(STREAM)):
        out += reader.feed(STREAM[i : i + 1])
    assert out == VALUES


@pytest.mark.parametrize("reader", READERS)
def test_garbage_is_an_error(reader: type[ReplyReader]) -> None:
    with pytest.raises(ValueError, match="not a RESP2 reply"):
        reader().feed(b"?what\r\n")


def test_both_drivers_read_with_hiredis_when_installed() -> None:
    # The asyncio protocol, and the blocking client's notification connections.
    import tenure
    from tenure._async.protocol import RespProtocol

    assert isinstance(RespProtocol(print, None)._reader, HiredisReader)  # type: ignore[arg-type]
    client = tenure.Client(
        ["redis://127.0.0.1:6399", "redis://127.0.0.1:6400", "redis://127.0.0.1:6401"]
    )
    try:
        readers = client._listener._readers
        assert len(readers) == 3
        assert all(isinstance(r, HiredisReader) for r in readers)
    finally:
        client.close()


# The same parser pulled one reply at a time (the blocking client's lock connections):
# hiredis's own reader, and the pure-Python reader behind that interface.
PULL_READERS = [pull_reader, PulledReplies]


def _pulled(reader: PullReader) -> list[object]:
    out = []
    while (reply := reader.gets()) is not False:
        out.append(reply)
    return out


@settings(max_examples=200, derandomize=True, database=None)
@given(cuts=st.lists(st.integers(0, len(STREAM)), max_size=12), make=st.sampled_from(PULL_READERS))
def test_pulled_replies_are_the_same_at_any_split(
    cuts: list[int], make: Callable[[], PullReader]
) -> None:
    reader = make()
    out: list[object] = []
    last = 0
    for cut in [*sorted(cuts), len(STREAM)]:
        reader.feed(STREAM[last:cut])
        out += _pulled(reader)
        last = cut
    assert out == VALUES
    assert reader.gets() is False  # nothing left, and nothing invented


@pytest.mark.parametrize("make", PULL_READERS)
def test_pulled_garbage_raises_at_every_look(make: Callable[[], PullReader]) -> None:
    # A stream that stopped being RESP2 never turns into "nothing yet", which would have
    # the blocking client wait on the socket for a reply that cannot come.
    reader = make()
    reader.feed(b":1\r\n?what\r\n")
    for _ in range(2):
        with pytest.raises(NOT_RESP):
            _pulled(reader)

"""The fastest RESP2 reply reader installed, for the connections both drivers read
themselves: every lock and notification connection of both clients.

Two shapes of one parser. ``reply_reader`` hands over every reply a chunk of bytes
completed, as a list (the asyncio protocol and the notification connections, which
take replies as they come). ``pull_reader`` takes bytes and gives one reply at a time
(``gets``), for the blocking client's lock connections (``redis_compat.SocketReplies``),
which read one reply per node and round: with hiredis that is its own ``Reader``, with
nothing in between.

hiredis is a dependency, and its C parser does ``ReplyReader``'s work (``_core.resp``) at a
fifth of the CPU per reply; the pure-Python reader stays for an interpreter without the
wheel. Both give the same values: bytes, ints, lists, None, ``ErrorReply``.
"""

from __future__ import annotations

import collections
from typing import Protocol

from .._core.resp import ErrorReply, ReplyReader

try:
    import hiredis

    HIREDIS = True
except ImportError:  # a dependency, but the pure-Python reader does the same work
    HIREDIS = False

__all__ = ["HIREDIS", "NOT_RESP", "HiredisReader", "PullReader", "pull_reader", "reply_reader"]

# What a reader raises for bytes that are not RESP2.
NOT_RESP: tuple[type[Exception], ...] = (
    (ValueError, hiredis.ProtocolError) if HIREDIS else (ValueError,)
)


class HiredisReader:
    """``ReplyReader``'s work done by hiredis's C parser: the same replies (bytes, ints,
    lists, None, ``ErrorReply``), the same ``ValueError`` for bytes that are not RESP2."""

    def __init__(self) -> None:
        # hiredis calls replyError with an error reply's text and hands back whatever it
        # returns: our ErrorReply, as the pure-Python reader makes (its stubs expect an
        # exception class).
        self._reader = hiredis.Reader(replyError=ErrorReply)  # type: ignore[arg-type]

    def feed(self, data: bytes) -> list[object]:
        """Add ``data``; return the replies it completed, in order."""
        reader = self._reader
        reader.feed(data)
        out = []
        try:
            while (reply := reader.gets()) is not False:  # False: no complete reply yet
                out.append(reply)
        except hiredis.ProtocolError as exc:
            raise ValueError(f"not a RESP2 reply: {exc}") from None
        return out


def reply_reader() -> ReplyReader | HiredisReader:
    """The fastest reader installed."""
    return HiredisReader() if HIREDIS else ReplyReader()


class PullReader(Protocol):
    """hiredis's ``Reader`` interface: ``feed`` bytes, then ``gets`` the next complete
    reply, or False while there is none (no RESP2 reply is False). A reply that is not
    RESP2 raises one of ``NOT_RESP`` from ``gets``, again at every call."""

    def feed(self, data: bytes, /) -> None: ...

    def gets(self) -> object: ...


class PulledReplies:
    """``ReplyReader`` behind ``PullReader``'s interface, for an interpreter without
    hiredis."""

    __slots__ = ("_error", "_reader", "_ready")

    def __init__(self) -> None:
        self._reader = ReplyReader()
        self._ready: collections.deque[object] = collections.deque()
        self._error: ValueError | None = None  # the stream is not RESP2 from here on

    def feed(self, data: bytes, /) -> None:
        if self._error is None:
            try:
                self._ready.extend(self._reader.feed(data))
            except ValueError as exc:
                self._error = exc

    def gets(self) -> object:
        if self._ready:
            return self._ready.popleft()
        if self._error is not None:
            raise self._error
        return False


def pull_reader() -> PullReader:
    """The fastest reader installed, in ``PullReader``'s shape."""
    if HIREDIS:
        return hiredis.Reader(replyError=ErrorReply)  # type: ignore[arg-type]
    return PulledReplies()

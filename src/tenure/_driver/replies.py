"""The fastest RESP2 reply reader installed, for the connections both drivers read
themselves: every lock and notification connection of both clients (the blocking
client's lock connections through ``redis_compat.SocketReplies``).

hiredis is a dependency, and its C parser does ``ReplyReader``'s work (``_core.resp``) at a
fifth of the CPU per reply; the pure-Python reader stays for an interpreter without the
wheel. Both give the same values: bytes, ints, lists, None, ``ErrorReply``.
"""

from __future__ import annotations

from .._core.resp import ErrorReply, ReplyReader

try:
    import hiredis

    HIREDIS = True
except ImportError:  # a dependency, but the pure-Python reader does the same work
    HIREDIS = False

__all__ = ["HIREDIS", "HiredisReader", "reply_reader"]


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

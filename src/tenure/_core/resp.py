"""An incremental reader of RESP2 replies (pure: bytes in, values out).

The asyncio driver parses replies itself, inside the transport's ``data_received``, so a
reply reaches its round without first waking a reader task: one trip through the event
loop per reply instead of two. The replies tenure reads are small and few in kind:
``+OK``, ``-ERR ...``, ``:1``, ``$n``/``$-1`` and short arrays of those.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ErrorReply", "ReplyReader", "as_text"]


def as_text(value: object) -> str:
    """A reply's field as text: bytes decoded as UTF-8 (undecodable bytes replaced, as a
    name or address from a server is only shown or compared), anything else by ``str``."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass(frozen=True)
class ErrorReply:
    """A ``-...`` reply: the node refused or failed the command."""

    message: str


_INCOMPLETE = object()
_PLUS, _MINUS, _COLON, _DOLLAR, _STAR = b"+-:$*"


class ReplyReader:
    """Feed bytes as they arrive; take every reply that is complete."""

    def __init__(self) -> None:
        self._buf = b""  # the start of a reply not yet complete

    def feed(self, data: bytes) -> list[object]:
        """Add ``data``; return the replies it completed, in order."""
        # Usually nothing is left over and ``data`` holds whole replies: parse it where
        # it lies, without copying it into a buffer first.
        buf = self._buf + data if self._buf else bytes(data)
        out = []
        pos, size = 0, len(buf)
        while pos < size:
            value, end = _parse(buf, pos)
            if value is _INCOMPLETE:
                break
            out.append(value)
            pos = end
        self._buf = buf[pos:] if pos < size else b""
        return out


def _parse(buf: bytes, pos: int) -> tuple[object, int]:
    """The reply that starts at ``pos`` and where it ends, or (_INCOMPLETE, pos)."""
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        return _INCOMPLETE, pos
    kind, nxt = buf[pos], eol + 2
    if kind == _COLON:
        return int(buf[pos + 1 : eol]), nxt
    if kind == _STAR:
        count = int(buf[pos + 1 : eol])
        if count < 0:
            return None, nxt
        items: list[object] = []
        size = len(buf)
        for _ in range(count):
            if nxt < size and buf[nxt] == _COLON:
                # An integer (acquire.lua answers an array of them): read in place.
                end = buf.find(b"\r\n", nxt)
                if end < 0:
                    return _INCOMPLETE, pos
                items.append(int(buf[nxt + 1 : end]))
                nxt = end + 2
                continue
            item, nxt = _parse(buf, nxt)
            if item is _INCOMPLETE:
                return _INCOMPLETE, pos
            items.append(item)
        return items, nxt
    if kind == _DOLLAR:
        length = int(buf[pos + 1 : eol])
        if length < 0:
            return None, nxt
        if len(buf) < nxt + length + 2:
            return _INCOMPLETE, pos
        return buf[nxt : nxt + length], nxt + length + 2
    if kind == _PLUS:
        return buf[pos + 1 : eol], nxt
    if kind == _MINUS:
        return ErrorReply(buf[pos + 1 : eol].decode("utf-8", "replace")), nxt
    raise ValueError(f"not a RESP2 reply: {buf[pos : pos + 20]!r}")

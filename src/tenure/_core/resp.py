"""An incremental reader of RESP2 replies (pure: bytes in, values out).

The asyncio driver parses replies itself, inside the transport's ``data_received``, so a
reply reaches its round without first waking a reader task: one trip through the event
loop per reply instead of two. The replies tenure reads are small and few in kind:
``+OK``, ``-ERR ...``, ``:1``, ``$n``/``$-1`` and short arrays of those.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ErrorReply", "ReplyReader"]


@dataclass(frozen=True)
class ErrorReply:
    """A ``-...`` reply: the node refused or failed the command."""

    message: str


_INCOMPLETE = object()


class ReplyReader:
    """Feed bytes as they arrive; take every reply that is complete."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[object]:
        """Add ``data``; return the replies it completed, in order."""
        self._buf += data
        out = []
        pos = 0
        while True:
            value, end = self._parse(pos)
            if value is _INCOMPLETE:
                break
            out.append(value)
            pos = end
        if pos:
            del self._buf[:pos]
        return out

    def _parse(self, pos: int) -> tuple[object, int]:
        buf = self._buf
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return _INCOMPLETE, pos
        kind, line, nxt = buf[pos : pos + 1], bytes(buf[pos + 1 : eol]), eol + 2
        if kind == b"+":
            return line, nxt
        if kind == b"-":
            return ErrorReply(line.decode("utf-8", "replace")), nxt
        if kind == b":":
            return int(line), nxt
        if kind == b"$":
            size = int(line)
            if size < 0:
                return None, nxt
            if len(buf) < nxt + size + 2:
                return _INCOMPLETE, pos
            return bytes(buf[nxt : nxt + size]), nxt + size + 2
        if kind == b"*":
            count = int(line)
            if count < 0:
                return None, nxt
            items = []
            for _ in range(count):
                item, nxt = self._parse(nxt)
                if item is _INCOMPLETE:
                    return _INCOMPLETE, pos
                items.append(item)
            return items, nxt
        raise ValueError(f"not a RESP2 reply: {bytes(buf[pos : pos + 20])!r}")

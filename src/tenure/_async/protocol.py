"""The asyncio protocol both kinds of connection use once set up: RESP off the transport.

redis-py connects (TCP or unix socket, TLS, AUTH, SELECT); then the transport's protocol
is replaced by ``RespProtocol``, which parses replies as they arrive and hands each one
on at once, from ``data_received``: no reader task, no future per reply. The lock
connections (``channels``) hand them to their pending requests, the notification
connections (``notify``) to the listener.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from .._driver.redis_compat import ClosedByNode, NotRedis
from .._driver.replies import reply_reader

__all__ = ["RespProtocol", "closed_under_us", "write"]


class RespProtocol(asyncio.Protocol):
    """Reads replies off a transport and hands each one to ``deliver``; sets ``lost``
    (once) to why the connection ended."""

    def __init__(
        self, deliver: Callable[[object], None], lost: asyncio.Future[BaseException]
    ) -> None:
        self._reader = reply_reader()
        self._deliver = deliver
        self._lost = lost
        # Bytes came from the node: a close before any is what a TLS port does to a
        # plain client (``redis_compat.before_first_reply``).
        self.heard = False

    def data_received(self, data: bytes) -> None:
        self.heard = True
        try:
            replies = self._reader.feed(data)
        except ValueError as exc:  # not RESP2: nothing more on this connection can be trusted
            self._end(NotRedis(str(exc)))
            return
        for reply in replies:
            self._deliver(reply)

    def let_go(self, transport: asyncio.BaseTransport, last: object, within: float) -> None:
        """Hand no more replies on: drop them, and close ``transport`` once the reply
        ``last`` comes (the answer to what was written last), or ``within`` seconds."""
        timer = asyncio.get_running_loop().call_later(within, transport.close)

        def drop(reply: object) -> None:
            if reply == last:
                timer.cancel()
                transport.close()

        self._deliver = drop

    def eof_received(self) -> bool:
        self._end(ClosedByNode("connection closed by the node"))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or ConnectionError("connection lost"))

    def _end(self, exc: BaseException) -> None:
        if not self._lost.done():
            self._lost.set_result(exc)


def closed_under_us(transport: asyncio.BaseTransport) -> bool:
    """Whether a write to ``transport`` that raised ``RuntimeError`` met a connection
    already closed.

    uvloop refuses a write to a connection whose handle it closed (a reset read, an
    abort) in the turn before the task that owns the connection hears of the loss;
    asyncio's own transports drop such a write. It is dropped then: the loss, heard
    next, fails what was written meanwhile as it fails what was in flight.
    """
    return transport.is_closing()


def write(transport: asyncio.WriteTransport, data: bytes) -> None:
    """``transport.write(data)``, dropped if the connection closed under us
    (``closed_under_us``). The lock connections' hot path writes inline instead (a
    ``try`` costs nothing there; a call would)."""
    try:
        transport.write(data)
    except RuntimeError:
        if not closed_under_us(transport):
            raise

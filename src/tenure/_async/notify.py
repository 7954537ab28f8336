"""Release notifications for the asyncio client: one subscription per node, shared.

Theory of operation
-------------------
The first time a task of an ``AsyncClient`` has to wait for a lock, the client opens one
pub/sub connection per node (in its event loop) and subscribes to its own channel. Every
waiting task registers an ``AsyncSlot`` under its waiter id; the connection's protocol
parses each message in ``data_received`` and settles the slot's future right there, so
a notification reaches its task in one trip through the event loop, and a thousand
waiting tasks cost one connection per node, not one each.

A connection that fails is re-established after a back-off; once subscribed again,
every slot is nudged to re-check (notifications sent meanwhile reached nobody).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Sequence

import redis.asyncio

from .._core import diagnosis
from .._core.backoff import Reconnect
from .._core.commands import pack
from .._core.resp import ErrorReply
from .._core.waiting import CHANNEL_PREFIX, STRAGGLE, Switchboard, Wake, WakeTally
from .._driver.redis_compat import diagnose
from .._driver.report import NodeReporter
from .protocol import RespProtocol

__all__ = ["AsyncListener", "AsyncSlot"]


class AsyncSlot(WakeTally):
    """Where the notifications of one waiting task are filed.

    On a quorum (``need`` > 1) the waiter is woken once a majority of nodes have notified
    it, or ``STRAGGLE`` seconds after the first did (``waiting.WakeTally``).
    """

    __slots__ = ("_flag", "_future", "_timer")

    def __init__(self, need: int = 1) -> None:
        super().__init__(need)
        self._flag = False
        self._future: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def put(self, wake: Wake | None, node: int = -1) -> None:
        if wake is not None and not self.file(wake, node):
            if self._timer is None:
                loop = asyncio.get_running_loop()
                self._timer = loop.call_later(STRAGGLE, self._fire)
            return
        self._fire()

    def _fire(self) -> None:
        self._flag = True
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)

    def take(self) -> list[tuple[int, Wake]]:
        self._flag = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        return super().take()

    async def wait(self, timeout: float) -> bool:
        """Until a notification is filed (True) or ``timeout`` seconds pass (False)."""
        if self._flag:
            return True
        loop = asyncio.get_running_loop()
        future = self._future = loop.create_future()
        timer = loop.call_later(timeout, _settle, future)
        try:
            await future
        finally:
            timer.cancel()
            self._future = None
        return self._flag


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class ResponseRefused(Exception):
    """The node answered our SUBSCRIBE with an error (its text, as sent)."""


class AsyncListener:
    """The subscriptions of one client in one event loop, started on first need."""

    def __init__(
        self,
        pools: Sequence[redis.asyncio.ConnectionPool],
        reporter: NodeReporter | None = None,
        channel_prefix: str = CHANNEL_PREFIX,
    ) -> None:
        self._pools = list(pools)
        self._reporter = reporter or NodeReporter([str(i) for i in range(len(self._pools))])
        self.channel = channel_prefix + secrets.token_hex(8)  # key prefix + "wake:" + random
        self._board = Switchboard[AsyncSlot]()
        self._slots = self._board.slots
        self.departed = self._board.departed
        self._tasks: list[asyncio.Task[None]] = []
        self._up = [False] * len(pools)
        self._all_up: asyncio.Event | None = None
        self._closed = False

    @property
    def started(self) -> bool:
        return bool(self._tasks)

    def register_now(self, waiter: str, need: int = 1) -> AsyncSlot:
        slot = self._slots[waiter] = AsyncSlot(need)
        return slot

    async def register(self, waiter: str, timeout: float, need: int = 1) -> AsyncSlot:
        """A slot for ``waiter``; subscribes first if needed (waiting up to ``timeout``)."""
        slot = self.register_now(waiter, need)
        if not self._tasks and not self._closed:
            self._all_up = asyncio.Event()
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._run(i)) for i in range(len(self._pools))]
        if self._all_up is not None and not self._all_up.is_set():
            with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
                await asyncio.wait_for(self._all_up.wait(), timeout)
        return slot

    def unregister(self, waiter: str) -> None:
        self._slots.pop(waiter, None)

    async def close(self) -> None:
        self._closed = True
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _nudge_all(self) -> None:
        self._board.nudge_all()

    async def _run(self, i: int) -> None:
        reconnect = Reconnect()
        ever = False
        while True:
            conn: redis.asyncio.Connection = self._pools[i].make_connection()  # type: ignore[no-untyped-call]
            try:
                await conn.connect()  # type: ignore[no-untyped-call]
                lost: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()

                def handle(reply: object, lost: asyncio.Future[BaseException] = lost) -> None:
                    nonlocal ever
                    if isinstance(reply, ErrorReply):
                        # SUBSCRIBE refused (ACL without the channel, NOAUTH): retried
                        # after the back-off; waiters re-check meanwhile.
                        if not lost.done():
                            lost.set_result(ResponseRefused(reply.message))
                        return
                    if self._board.message(reply, i, time.monotonic()):
                        self._up[i] = True
                        reconnect.succeeded()
                        if all(self._up) and self._all_up is not None:
                            self._all_up.set()
                        if ever:
                            self._nudge_all()
                        ever = True

                transport = conn._writer.transport  # type: ignore[union-attr]
                transport.set_protocol(RespProtocol(handle, lost))
                transport.write(pack("SUBSCRIBE", self.channel))
                raise await lost
            except asyncio.CancelledError:
                await conn.disconnect(nowait=True)
                raise
            except Exception as exc:  # a failed connection is retried after a back-off
                why = (
                    diagnosis.error_reply(str(exc))
                    if isinstance(exc, ResponseRefused)
                    else diagnose(exc)
                )
                if why.failure.configuration:
                    self._reporter.note(i, why.failure, f"{why.detail} (notifications)")
            self._up[i] = False
            await conn.disconnect(nowait=True)
            await asyncio.sleep(reconnect.failed(time.monotonic()))

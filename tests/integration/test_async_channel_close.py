"""An asyncio connection given up just as it comes up ends, and ``aclose()`` returns.

Python 3.11's ``asyncio.wait_for`` returns the result of an awaitable that finished in
the same turn of the event loop as the waiting task was cancelled. A channel's
connection task cancelled then (by a reset after a stall, or by ``aclose()``) went on:
it took the channel over and waited on its connection forever, and ``aclose()`` waited
for it. A hang of ``test_overload.py`` under load led here; this test makes the reset
land in exactly that turn, from inside the connection's own ``connect()``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

import redis.asyncio

import tenure
from tenure._async.channels import Channel
from tenure.testing import LocalCluster


class _GivenUpAsItConnects(redis.asyncio.Connection):
    """Connects to the real node, then has the channel give it up before returning."""

    channel: ClassVar[Channel | None] = None

    async def connect(self, *args: Any, **kwargs: Any) -> None:
        await super().connect(*args, **kwargs)  # type: ignore[no-untyped-call]
        assert self.channel is not None
        self.channel._reset(ConnectionError("given up as it came up"), time.monotonic())


def test_a_connection_given_up_as_it_comes_up_ends_and_close_returns(
    shared5: LocalCluster,
) -> None:
    async def main() -> None:
        client = tenure.AsyncClient([shared5.urls[0]], connect_timeout=2.0)
        channels = client._channels
        channels._pools[0].connection_class = _GivenUpAsItConnects
        channel = channels._current()[0]
        _GivenUpAsItConnects.channel = channel
        channel.connect(time.monotonic())
        task = channel._task
        assert task is not None
        # The reset ran inside connect(): the task was cancelled in the turn its
        # connection came up. It must end, not take the channel over.
        done, _ = await asyncio.wait({task}, timeout=5.0)
        assert task in done, "the connection task given up lives on"
        assert channel._conn is None
        assert not channel.ready
        await asyncio.wait_for(client.aclose(), 5.0)

    asyncio.run(main())

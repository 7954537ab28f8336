"""``within``: a bounded wait that raises one TimeoutError class on every Python."""

from __future__ import annotations

import asyncio

import pytest

from tenure._driver.timeouts import within


async def _late() -> None:
    await asyncio.sleep(10)


def test_a_wait_past_its_bound_raises_the_built_in_timeout_error() -> None:
    async def wait() -> None:
        await within(_late(), 0.01)

    # The built-in class, exactly: a caller that catches TimeoutError alone
    # (``Channel.close``) must see it.
    with pytest.raises(TimeoutError) as raised:
        asyncio.run(wait())
    assert raised.type is TimeoutError


def test_a_wait_within_its_bound_returns_the_result() -> None:
    async def quick() -> int:
        return 7

    assert asyncio.run(within(quick(), 1.0)) == 7
    assert asyncio.run(within(quick(), None)) == 7

"""The asyncio driver's loop over a flow: ``flows.drive`` with ``await``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .._core.flows import Flow, Op, check_instant

__all__ = ["adrive"]

T = TypeVar("T")


async def adrive(
    flow: Flow[T], perform: Callable[[Op], Awaitable[Any]], first: Op | None = None
) -> T:
    """Run ``flow`` to its end, awaiting ``perform`` for each operation; ``first``: the
    operation the flow has already yielded (None: it has not begun).

    A ``CancelledError`` raised by an operation is thrown into the flow; what the flow
    yields then is instant (``check_instant``), so awaiting it does not suspend the task
    and its cleanup is written before the cancellation leaves.
    """
    unwinding = False
    try:
        op = next(flow) if first is None else first
        while True:
            try:
                result = await perform(op)
            except BaseException as exc:
                unwinding = unwinding or not isinstance(exc, Exception)
                op = flow.throw(exc)
            else:
                op = flow.send(result)
            if unwinding:
                check_instant(flow, op)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]

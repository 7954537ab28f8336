"""``Deadlines``: the asyncio client's round deadlines on one timer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tenure._async.deadlines import Deadlines


def test_deadlines_run_once_each_in_their_order_at_their_time() -> None:
    async def main() -> list[tuple[str, float, float]]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        ran: list[tuple[str, float, float]] = []
        start = loop.time()

        # Later first, then an earlier one: the one timer moves to the earlier.
        def note(name: str) -> Callable[[float], None]:
            return lambda when: ran.append((name, when, loop.time()))

        for name, after in [("c", 0.06), ("a", 0.02), ("b", 0.04), ("b2", 0.04)]:
            deadlines.add(start + after, note(name))
        assert len(deadlines) == 4
        await asyncio.sleep(0.1)
        assert len(deadlines) == 0
        return ran

    ran = asyncio.run(main())
    assert [name for name, _, _ in ran] == ["a", "b", "b2", "c"]
    for _, when, at in ran:
        assert at >= when - 1e-6  # never early (give or take the clock's resolution)


def test_a_cancelled_deadline_never_runs() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        ran: list[str] = []
        first = deadlines.add(loop.time() + 0.01, lambda when: ran.append("first"))
        deadlines.add(loop.time() + 0.02, lambda when: ran.append("second"))
        deadlines.cancel(first)
        deadlines.cancel(first)  # twice: nothing more
        assert len(deadlines) == 1
        await asyncio.sleep(0.05)
        done = deadlines.add(loop.time(), lambda when: ran.append("third"))
        await asyncio.sleep(0.01)
        deadlines.cancel(done)  # after it ran: nothing
        assert len(deadlines) == 0
        return ran

    assert asyncio.run(main()) == ["second", "third"]


def test_a_deadline_added_by_a_callback_waits_for_a_later_turn() -> None:
    # A round's grace: its deadline callback adds another, which must not run in the
    # same turn (the loop first gets to read the replies waiting in the sockets).
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        ran: list[str] = []

        def first(when: float) -> None:
            ran.append("deadline")
            # Already due (its time is this one's): it still waits for a later turn.
            deadlines.add(when, lambda when: ran.append("grace"))
            loop.call_soon(ran.append, "next turn")

        deadlines.add(loop.time() + 0.01, first)
        await asyncio.sleep(0.05)
        return ran

    assert asyncio.run(main()) == ["deadline", "next turn", "grace"]


def test_cancelled_deadlines_do_not_pile_up() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        for _ in range(10_000):
            deadlines.cancel(deadlines.add(loop.time() + 60, lambda when: None))
        return len(deadlines._heap)

    assert asyncio.run(main()) <= 2048


def test_close_drops_every_deadline() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        deadlines = Deadlines(loop)
        ran: list[str] = []
        deadlines.add(loop.time() + 0.01, lambda when: ran.append("x"))
        deadlines.close()
        await asyncio.sleep(0.03)
        return ran

    assert asyncio.run(main()) == []

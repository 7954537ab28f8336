"""Reading the listed nodes side by side, each within a budget, for ``tenure check`` and
``tenure status``.

redis-py bounds each wait for bytes by its socket timeout, not a whole reply: a server
that sends a reply a byte at a time, each byte sooner than the timeout (a stalled proxy,
a server dying slowly, something that is not Redis), kept a read going for ever, and the
command with it (as a host name whose lookup hangs can: no timeout bounds it). Nor could
SIGTERM (``timeout(1)``, a CI job's time limit) end the command meanwhile: leaving waited
for the threads still reading. So each node is read in a daemon thread of its own, and
the command waits for it at most its budget (``budget``: twice what its reading takes
when every connection and every reply takes the whole ``--node-timeout``, and a second);
a node still being read then is reported as such, and its thread is left to die with
the process, as it does when a signal ends the command.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["budget", "each", "late_detail", "late_text"]

T = TypeVar("T")
R = TypeVar("R")


def budget(waits: int, node_timeout: float) -> float:
    """The seconds a node's reading is given: ``waits`` is how many connections and
    replies it waits for one after another, each for at most ``node_timeout``. Doubled,
    and a second more, so that a node answering within its timeouts on a loaded machine
    is never cut short: the budget only stops a reading that no timeout bounds."""
    return 2 * waits * node_timeout + 1.0


def late_text(seconds: float) -> str:
    """What a node still being read after ``seconds`` (its budget) is reported as."""
    return f"unreachable: {late_detail(seconds)}"


def late_detail(seconds: float, whose: str = "node's") -> str:
    """Why a server still being read after ``seconds`` (its budget) was given up: a node,
    or one of the servers behind it (``whose``: "Sentinel's")."""
    return (
        f"no complete answer within {seconds:.3g} s, though each connection and reply may "
        "take only --node-timeout (a server sending its replies a byte at a time, a host "
        f"name slow to resolve): check the {whose} host and port"
    )


def each(
    items: Sequence[T],
    read: Callable[[T], R],
    late: Callable[[T, float], R] | None = None,
    seconds: Callable[[T], float] | None = None,
) -> list[R]:
    """``read(item)`` for every item, each in a daemon thread, in order; an item not read
    within ``seconds(item)`` of the start is ``late(item, seconds(item))`` instead
    (without ``seconds``: waited for however long it takes). An exception ``read``
    raised is raised here."""
    done = [threading.Event() for _ in items]
    results: list[tuple[bool, object]] = [(False, None)] * len(items)

    def run(i: int, item: T) -> None:
        try:
            results[i] = (True, read(item))
        except BaseException as exc:  # handed to the waiting thread, which raises it
            results[i] = (False, exc)
        finally:
            done[i].set()

    start = time.monotonic()
    for i, item in enumerate(items):
        threading.Thread(target=run, args=(i, item), name="tenure-read", daemon=True).start()
    out: list[R] = []
    for i, item in enumerate(items):
        if seconds is None or late is None:
            done[i].wait()  # a signal's handler still runs, and may end the wait
        else:
            allowed = seconds(item)
            if not done[i].wait(max(start + allowed - time.monotonic(), 0.0)):
                out.append(late(item, allowed))
                continue
        ok, value = results[i]
        if not ok:
            assert isinstance(value, BaseException)
            raise value
        out.append(value)  # type: ignore[arg-type]
    return out

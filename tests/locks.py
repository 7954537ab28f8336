"""What the tests ask of a thread lock: whether another thread can take it."""

from __future__ import annotations

import threading
from typing import Protocol


class _Lock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...
    def release(self) -> None: ...


def free_to_another_thread(lock: _Lock, timeout: float) -> bool:
    """Whether a new thread takes ``lock`` within ``timeout`` seconds (and gives it back
    at once: an ``RLock`` is given back by the thread that took it)."""
    taken: list[bool] = []

    def take() -> None:
        taken.append(lock.acquire(timeout=timeout))
        if taken[0]:
            lock.release()

    taker = threading.Thread(target=take)
    taker.start()
    taker.join()
    return taken[0]

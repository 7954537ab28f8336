"""What a link's socket could not take, written as soon as it can, whoever uses the link.

A blocking link never waits for a full socket: what the socket cannot take waits in the
link (``Link.unsent``) and goes out ahead of the link's next write. A socket fills only
when its node stopped reading (frozen, starved), and the node's wake-up is not a write of
ours: a client that goes quiet then (its thread finished its work, the link set went back
to the pool) would keep the rest, releases included, until its next round on that very
link set, and the node would keep the locks those releases free until their TTL. So a
link that keeps something back is handed to the flusher: one daemon thread for the
process, which waits for its socket to take more (``poll``) and writes it then. It
runs only while some link keeps something back, and ends when none does.

The flusher and the link's own rounds write in turn, under the link's ``writing`` lock,
taken only while something waits: on the common path, with nothing kept back, a round
writes as before, without it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Any, Protocol

from .._driver.guard import Guard
from .._driver.ready import ready

__all__ = ["Keeping", "hand_over"]


class Keeping(Protocol):
    """A link that may keep back what its socket could not take."""

    def keeping(self) -> Any:
        """The socket that has something waiting for it; None once nothing waits (or
        the link was closed)."""

    def flush(self, sock: Any) -> None:
        """Write to ``sock`` what waits for it, as much as it takes without waiting."""


class _Flusher:
    def __init__(self) -> None:
        self._lock = Guard()
        self._links: set[Keeping] = set()
        self._running = False
        # Wakes the thread from its wait for sockets when a link is handed over.
        self._wake: tuple[int, int] | None = None

    def hand_over(self, link: Keeping) -> None:
        with self._lock:
            if link in self._links:
                return  # already waited for (a round's write that the socket took in part)
            self._links.add(link)
            if self._running:
                if self._wake is not None:
                    with contextlib.suppress(BlockingIOError):
                        os.write(self._wake[1], b".")
                return
            if self._wake is None:
                self._wake = os.pipe()
                os.set_blocking(self._wake[0], False)
                os.set_blocking(self._wake[1], False)
            self._running = True
        try:
            threading.Thread(target=self._run, name="tenure-flusher", daemon=True).start()
        except RuntimeError:  # the interpreter is shutting down: the next write sends it
            with self._lock:
                self._running = False

    def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while True:
            with self._lock:
                waiting: dict[Any, Keeping] = {}
                for link in list(self._links):
                    sock = link.keeping()
                    if sock is None:
                        self._links.discard(link)
                    else:
                        waiting[sock] = link
                if not waiting:
                    self._running = False
                    return
            try:
                found = ready((wake[0],), list(waiting), _LOOK)
            except (OSError, ValueError):
                # A socket was closed as we began to wait (its link dropped meanwhile):
                # the next turn no longer finds anything waiting for it.
                continue
            for sock in found:
                if sock is wake[0]:
                    with contextlib.suppress(BlockingIOError):
                        os.read(wake[0], 4096)
                else:
                    waiting[sock].flush(sock)

    def close(self) -> None:
        if self._wake is not None:
            for fd in self._wake:
                with contextlib.suppress(OSError):
                    os.close(fd)


# How long the flusher waits before it looks again at links whose socket still takes
# nothing: one a round closed meanwhile is let go then (a node frozen for good, with the
# client idle, costs one wake-up a second).
_LOOK = 1.0

_FLUSHER = _Flusher()


def hand_over(link: Keeping) -> None:
    """Have what ``link`` keeps back written as soon as its socket takes it."""
    _FLUSHER.hand_over(link)


def _forget_after_fork() -> None:
    # The parent's thread does not run in the child, and the links handed over to it are
    # the parent's (the child's pools forget them too).
    global _FLUSHER
    _FLUSHER.close()
    _FLUSHER = _Flusher()


os.register_at_fork(after_in_child=_forget_after_fork)

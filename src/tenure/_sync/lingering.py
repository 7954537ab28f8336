"""Connections given up as stalled, kept open until their node has answered them all.

A connection that went ``STALL`` seconds without a reply (a frozen or cut-off node) is
given up (``Link._linger``), but not closed: a frozen node woken with requests waiting
on a closed connection runs the first ones, is reset by its first answer, and drops the
rest unread, releases behind their grants included. So it is shut for writing, behind
all that was written to it, and read (its replies dropped) until the node has answered
it all and closed its end, or for ``LINGER`` seconds; then closed.

One daemon thread for the process reads them all, and runs only while some connection
lingers. A thread each made a blocking client hold as many threads more as it had
connections to a node when the node froze (one per thread locking then), for a minute.
It is a daemon: a program that ends does not wait for a frozen node.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from .._driver.clock import monotonic
from .._driver.guard import Guard
from .._driver.ready import readable
from .._driver.redis_compat import disconnect
from .._driver.threads import start_thread

__all__ = ["linger", "read_on"]

# How long the thread waits on its sockets before it looks for connections handed over
# meanwhile and for deadlines passed: what the node sends a new one meanwhile waits in
# its socket, which stays open.
_LOOK = 0.25
_DRAIN = 65536  # bytes read at a time
_NO_WAIT = socket.MSG_DONTWAIT


class _Lingering:
    def __init__(self) -> None:
        self._lock = Guard()
        self._conns: dict[Any, tuple[Any, float]] = {}  # socket -> (connection, deadline)
        self._running = False

    def hand_over(self, sock: Any, conn: Any, deadline: float) -> None:
        with self._lock:
            self._conns[sock] = (conn, deadline)
            if self._running:
                return
            self._running = True
        if start_thread(self._run, "tenure-linger") is None:
            # No thread to be had (the interpreter is ending): closed now.
            with self._lock:
                self._running = False
                conns, self._conns = self._conns, {}
            for conn, _ in conns.values():
                disconnect(conn)

    def _run(self) -> None:
        while True:
            now = monotonic()
            with self._lock:
                due = [s for s, (_, deadline) in self._conns.items() if deadline <= now]
                ended = [self._conns.pop(sock)[0] for sock in due]
                socks = list(self._conns)
                if not socks:
                    self._running = False
            for conn in ended:
                disconnect(conn)
            if not socks:
                return
            try:
                found = readable(socks, _LOOK)
            except (OSError, ValueError):
                found = socks  # one that cannot be looked at fails its read: closed
            for sock in found:
                if not read_on(sock):
                    with self._lock:
                        conn, _ = self._conns.pop(sock)
                    disconnect(conn)


def read_on(sock: Any) -> bool:
    """Read and drop what waits on ``sock``, without waiting; False once its end (or a
    failure) was read."""
    try:
        while sock.recv(_DRAIN, _NO_WAIT):
            pass
    except BlockingIOError:
        return True
    except OSError:
        pass
    return False


_LINGERING = _Lingering()


def linger(sock: Any, conn: Any, deadline: float) -> None:
    """Read ``sock`` (``conn``'s, shut for writing) to its end, or until ``deadline`` on
    the monotonic clock, then close ``conn``: in the process's lingering thread."""
    _LINGERING.hand_over(sock, conn, deadline)


def _forget_after_fork() -> None:
    # The parent's thread does not run in the child, and the connections are the
    # parent's: dropped here, each closes the child's copy of its socket only.
    global _LINGERING
    _LINGERING = _Lingering()


os.register_at_fork(after_in_child=_forget_after_fork)

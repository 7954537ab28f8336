"""Which sockets are ready, whatever the number of their file descriptor.

``select()`` takes only descriptors below ``FD_SETSIZE`` (1024): in a process with more
files open (a server with many clients, a worker with many connections), every socket
the client opens gets a higher number, and ``select()`` raises ``ValueError``. The
blocking client's rounds then failed with it, raw, and the looks that do not wait said
"nothing unread" of a socket that had replies waiting. ``poll()`` has no such bound, but
costs a registration per socket, where ``select()`` is one call: it stays the first
choice, and ``poll()`` answers whenever ``select()`` refuses a descriptor.
"""

from __future__ import annotations

import errno
import math
import select
from collections.abc import Sequence
from typing import Any

__all__ = ["readable", "ready"]


def readable(socks: Sequence[Any], timeout: float | None) -> list[Any]:
    """Those of ``socks`` with something to read (data, their end, an error), waiting at
    most ``timeout`` seconds (None: until one has)."""
    try:
        return select.select(socks, (), (), timeout)[0]
    except ValueError:
        return ready(socks, (), timeout)


def ready(reading: Sequence[Any], writing: Sequence[Any], timeout: float | None) -> list[Any]:
    """Those of ``reading`` with something to read and of ``writing`` that take more
    without waiting (or whose connection failed), by ``poll()``, at most ``timeout``
    seconds. Raises ``OSError`` (``EBADF``) for a closed socket and ``ValueError`` for a
    socket object closed here, as ``select()`` does."""
    look = select.poll()
    by_fd: dict[int, Any] = {}
    for socks, event in ((reading, select.POLLIN), (writing, select.POLLOUT)):
        for sock in socks:
            fd = sock if isinstance(sock, int) else sock.fileno()
            by_fd[fd] = sock
            look.register(fd, event)  # a negative descriptor (closed): ValueError
    # poll() counts whole milliseconds: rounded up, a wait of 0.3 ms is not a busy poll.
    ms = None if timeout is None else math.ceil(max(timeout, 0.0) * 1000)
    found = []
    for fd, events in look.poll(ms):
        if events & select.POLLNVAL:
            raise OSError(errno.EBADF, "a socket was closed while it was looked at")
        found.append(by_fd[fd])
    return found

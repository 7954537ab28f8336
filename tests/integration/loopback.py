"""What the tests' proxies share: a listener on a free loopback port, served by threads.

A subclass serves each accepted connection in a thread of its own (``_spawn``) and
closes its connections in ``close``, which stops the listener first (``_stop_listening``)
and joins the threads last (``_join``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

__all__ = ["HOST", "LoopbackServer"]

HOST = "127.0.0.1"


class LoopbackServer:
    """A listener on a free loopback port, and the threads that serve it."""

    def __init__(self) -> None:
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server((HOST, 0))
        self.port: int = self._listener.getsockname()[1]

    def close(self) -> None:
        self._stop_listening()
        self._join()

    def __enter__(self) -> LoopbackServer:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _stop_listening(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept() (Linux)
        with contextlib.suppress(OSError):
            self._listener.close()

    def _join(self) -> None:
        for thread in self._threads:
            thread.join(5.0)

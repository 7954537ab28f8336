"""A TCP proxy in front of one node that can hold back what clients already connected send.

A node runs each connection's commands in order, but two connections' in any order: a
command written on one connection may run after a later one written on another. To make
that happen on purpose, ``HoldingProxy.hold()`` keeps what clients send on the
connections open at that moment from reaching the node, while connections made later
pass; ``let_go()`` then delivers what was held, in order. Replies are never held.

One thread per direction per connection: a test opens a handful of connections.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType

__all__ = ["HoldingProxy"]

_HOST = "127.0.0.1"
_CHUNK = 64 * 1024


class _Upstream:
    """What one client sends towards the node, and whether it is held back."""

    def __init__(self, server: socket.socket) -> None:
        self.server = server
        self.lock = threading.Lock()
        self.held = False
        self.backlog: list[bytes] = []

    def forward(self, data: bytes) -> None:
        with self.lock:
            if self.held:
                self.backlog.append(data)
            else:
                self.server.sendall(data)

    def let_go(self) -> None:
        with self.lock:
            self.held = False
            backlog, self.backlog = self.backlog, []
            self.server.sendall(b"".join(backlog))


class HoldingProxy:
    """Forwards every connection to ``target``; see the module docstring."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self._lock = threading.Lock()
        self._upstreams: list[_Upstream] = []
        self._sockets: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._listener = socket.create_server((_HOST, 0))
        self.port: int = self._listener.getsockname()[1]
        self._spawn(self._accept)

    @property
    def url(self) -> str:
        return f"redis://{_HOST}:{self.port}"

    def hold(self) -> None:
        """From now on, hold back what clients send on the connections open now."""
        with self._lock:
            upstreams = list(self._upstreams)
        for up in upstreams:
            with up.lock:
                up.held = True

    def let_go(self) -> None:
        """Deliver what was held back, and stop holding."""
        with self._lock:
            upstreams = list(self._upstreams)
        for up in upstreams:
            up.let_go()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept() (Linux)
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(5.0)

    def __enter__(self) -> HoldingProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up = _Upstream(server)
            with self._lock:
                self._upstreams.append(up)
                self._sockets += [client, server]
            self._spawn(self._copy, client, up.forward)
            self._spawn(self._copy, server, client.sendall)

    @staticmethod
    def _copy(source: socket.socket, write: object) -> None:
        assert callable(write)
        try:
            while data := source.recv(_CHUNK):
                write(data)
        except OSError:
            pass  # closed by the test, or by the other side

"""A TCP proxy in front of one node that can hold back what clients already connected send.

A node runs each connection's commands in order, but two connections' in any order: a
command written on one connection may run after a later one written on another. To make
that happen on purpose, ``HoldingProxy.hold()`` keeps what clients send on the
connections open at that moment from reaching the node, while connections made later
pass; ``let_go()`` then delivers what was held, in order. Replies are never held.
``slow_new(seconds)`` holds what each connection made from then on sends for its first
``seconds``: a connection whose set-up (HELLO, CLIENT SETNAME) takes that long.
``drop()`` resets each connection when its client next sends anything, without an
answer: what a TLS port does to a client that speaks no TLS, or a server dying.

One thread per direction per connection: a test opens a handful of connections.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

from .loopback import HOST, LoopbackServer

__all__ = ["HoldingProxy"]

_CHUNK = 64 * 1024


class _Upstream:
    """What one client sends towards the node, and whether it is held back."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.lock = threading.Lock()
        self.held = False
        self.dropping = False
        self.backlog: list[bytes] = []

    def forward(self, data: bytes) -> None:
        with self.lock:
            if self.dropping:
                # A reset (no lingering), as a TLS port gives a plain client's command.
                linger = struct.pack("ii", 1, 0)
                self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                self.client.close()
                # Shut down first: it wakes the thread reading the node's side.
                with contextlib.suppress(OSError):
                    self.server.shutdown(socket.SHUT_RDWR)
                self.server.close()
            elif self.held:
                self.backlog.append(data)
            else:
                self.server.sendall(data)

    def let_go(self) -> None:
        with self.lock:
            self.held = False
            backlog, self.backlog = self.backlog, []
            self.server.sendall(b"".join(backlog))


class HoldingProxy(LoopbackServer):
    """Forwards every connection to ``target``; see the module docstring."""

    def __init__(self, target: tuple[str, int]) -> None:
        super().__init__()
        self._target = target
        self._lock = threading.Lock()
        self._upstreams: list[_Upstream] = []
        self._sockets: list[socket.socket] = []
        self._new_held_for = 0.0
        self._dropping = False
        self._spawn(self._accept)

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}"

    def hold(self) -> None:
        """From now on, hold back what clients send on the connections open now."""
        with self._lock:
            upstreams = list(self._upstreams)
        for up in upstreams:
            with up.lock:
                up.held = True

    def slow_new(self, seconds: float) -> None:
        """From now on, hold back what each new connection sends for its first ``seconds``."""
        self._new_held_for = seconds

    def drop(self) -> None:
        """From now on, reset each connection (open now or later) when its client next
        sends anything, instead of passing it on."""
        with self._lock:
            self._dropping = True
            upstreams = list(self._upstreams)
        for up in upstreams:
            with up.lock:
                up.dropping = True

    def let_go(self) -> None:
        """Deliver what was held back, and stop holding."""
        with self._lock:
            upstreams = list(self._upstreams)
        for up in upstreams:
            up.let_go()

    def close(self) -> None:
        self._stop_listening()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._join()

    def __enter__(self) -> HoldingProxy:
        return self

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            server = socket.create_connection(self._target)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            up = _Upstream(client, server)
            if self._new_held_for:
                up.held = True
                self._spawn(self._let_go_after, up, self._new_held_for)
            with self._lock:
                up.dropping = self._dropping  # under the lock ``drop`` sets it by
                self._upstreams.append(up)
                self._sockets += [client, server]
            self._spawn(self._copy, client, up.forward)
            self._spawn(self._copy, server, client.sendall)

    @staticmethod
    def _let_go_after(up: _Upstream, seconds: float) -> None:
        time.sleep(seconds)
        with contextlib.suppress(OSError):
            up.let_go()

    @staticmethod
    def _copy(source: socket.socket, write: object) -> None:
        assert callable(write)
        try:
            while data := source.recv(_CHUNK):
                write(data)
        except OSError:
            pass  # closed by the test, or by the other side

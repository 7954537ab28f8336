"""A TCP server on loopback that is not Redis: what a wrong port in a node URL finds.

It answers every chunk it receives, on every connection, until the client hangs up:

* ``"http"``: ``HTTP/1.1 400 Bad Request`` (an HTTP server, a load balancer's port);
* ``"random"``: 1 to 64 bytes from a seeded random source, then CRLF, so that a RESP
  parser reads them as a (garbled) line rather than waiting for more (a binary protocol,
  a TLS port).

Or it speaks RESP without being Redis, answering each whole command it receives (a RESP
array of bulk strings, as clients send them) with one valid reply:

* ``"echo"``: the command itself, an array of bulk strings (an echo service);
* ``"ok"``: ``+OK``; ``"one"``: ``:1`` (a stub or a proxy that answers anything alike).

Or (``"slow"``) it begins a reply and never ends it: the header of a long bulk string,
then one byte every ``DRIP`` seconds, each well within any socket timeout (a stalled
proxy, a server dying slowly). ``connected`` is set when a client first sends it
something; ``accepted`` counts the connections made to it.

Bounded by construction: it only ever answers what a client sent, and stops with the
test (``with GarbageServer(...) as g:``; a slow answer ends when the client hangs up or
the server stops).

``SlowSubscribe`` is a real node behind a proxy that answers SUBSCRIBE as ``"slow"``
does: every other command goes to the node and its reply comes back as it came, so the
node locks as it should and its notifications alone never arrive.
"""

from __future__ import annotations

import contextlib
import random
import socket
import socketserver
import threading
from types import TracebackType
from typing import TypeVar

__all__ = ["DRIP", "SPEAKS", "GarbageServer", "SlowSubscribe"]

HTTP_400 = b"HTTP/1.1 400 Bad Request\r\n\r\n"
# What each RESP-speaking kind answers a command (None: the command itself).
_RESP_ANSWERS = {"echo": None, "ok": b"+OK\r\n", "one": b":1\r\n"}
SPEAKS = ("http", "random", *_RESP_ANSWERS)
DRIP = 0.05  # seconds between the bytes of a slow answer


def _commands(buf: bytes) -> tuple[list[bytes], bytes]:
    """The whole commands at the start of ``buf`` (RESP arrays of bulk strings), and the
    rest, a command still coming."""
    out: list[bytes] = []
    start = 0
    while buf.startswith(b"*", start):
        eol = buf.find(b"\r\n", start)
        if eol < 0:
            break
        pos = eol + 2
        for _ in range(int(buf[start + 1 : eol])):
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                return out, buf[start:]
            pos = eol + 2 + int(buf[pos + 1 : eol]) + 2
        if pos > len(buf):
            break
        out.append(buf[start:pos])
        start = pos
    return out, buf[start:]


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    speaks = "http"
    seed = 0
    connected: threading.Event
    stopping: threading.Event
    accepted: list[None]


class _Answer(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, _Server)
        server.accepted.append(None)  # (list.append: atomic across the handlers' threads)
        rng = random.Random(server.seed)
        if server.speaks in _RESP_ANSWERS:
            self._speak_resp(_RESP_ANSWERS[server.speaks])
            return
        if server.speaks == "slow":
            self._drip(server)
            return
        try:
            while self.request.recv(65536):
                if server.speaks == "http":
                    reply = HTTP_400
                else:
                    reply = rng.randbytes(rng.randint(1, 64)).replace(b"\r\n", b"") + b"\r\n"
                self.request.sendall(reply)
        except OSError:
            pass  # the client hung up

    def _drip(self, server: _Server) -> None:
        try:
            if not self.request.recv(65536):
                return
            server.connected.set()
            self.request.sendall(b"$1000000\r\n")
            while not server.stopping.wait(DRIP):
                self.request.sendall(b"x")
        except OSError:
            pass  # the client hung up

    def _speak_resp(self, answer: bytes | None) -> None:
        buf = b""
        try:
            while data := self.request.recv(65536):
                commands, buf = _commands(buf + data)
                if commands:
                    self.request.sendall(b"".join(answer or c for c in commands))
        except OSError:
            pass  # the client hung up


S = TypeVar("S", bound="_Serving")


class _Serving:
    """A server thread of a test: started on ``with``, stopped and joined at its end."""

    _server: _Server | _Proxy
    _thread: threading.Thread

    def __enter__(self: S) -> S:
        self._thread.start()
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class GarbageServer(_Serving):
    """A server on 127.0.0.1 answering ``speaks`` (one of ``SPEAKS``) to anything."""

    _server: _Server

    def __init__(self, speaks: str, seed: int = 1) -> None:
        assert speaks in (*SPEAKS, "slow")
        self._server = _Server(("127.0.0.1", 0), _Answer)
        self._server.speaks = speaks
        self._server.seed = seed
        self._server.connected = self.connected = threading.Event()
        self._server.stopping = threading.Event()
        self._server.accepted = []
        self.port: int = self._server.server_address[1]
        self.url = f"redis://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"garbage-{speaks}", daemon=True
        )

    def as_node(self, kind: str) -> str:
        """Its URL as a node of ``kind``: "plain", "sentinel" (it is the Sentinel of
        service ``locks``) or "cluster" (it is the seed)."""
        where = f"127.0.0.1:{self.port}"
        return {
            "plain": self.url,
            "sentinel": f"redis+sentinel://{where}/locks",
            "cluster": f"redis+cluster://{where}",
        }[kind]

    @property
    def accepted(self) -> int:
        return len(self._server.accepted)


class _Forward(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        server = self.server
        assert isinstance(server, _Proxy)
        client: socket.socket = self.request
        try:
            node = socket.create_connection(server.target)
        except OSError:
            return
        down = threading.Thread(target=_copy, args=(node, client), daemon=True)
        down.start()
        buf = b""
        try:
            while data := client.recv(65536):
                commands, buf = _commands(buf + data)
                for command in commands:
                    if command.split(b"\r\n", 3)[2].upper() not in (b"SUBSCRIBE", b"SSUBSCRIBE"):
                        node.sendall(command)
                        continue
                    # Its reply, begun and never ended; nothing more goes to the node.
                    server.subscribed.set()
                    client.sendall(b"$1000000\r\n")
                    while not server.stopping.wait(DRIP):
                        client.sendall(b"x")
                    return
        except OSError:
            pass  # either side hung up
        finally:
            with contextlib.suppress(OSError):
                node.shutdown(socket.SHUT_RDWR)
            node.close()
            down.join()


def _copy(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_RDWR)


class _Proxy(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    target: tuple[str, int]
    subscribed: threading.Event
    stopping: threading.Event


class SlowSubscribe(_Serving):
    """A proxy on 127.0.0.1 to the node at ``host:port`` that sends its replies to
    SUBSCRIBE (and SSUBSCRIBE) a byte at a time; ``subscribed`` is set once one came."""

    def __init__(self, host: str, port: int) -> None:
        self._server = _Proxy(("127.0.0.1", 0), _Forward)
        self._server.target = (host, port)
        self._server.subscribed = self.subscribed = threading.Event()
        self._server.stopping = threading.Event()
        self.port: int = self._server.server_address[1]
        self.url = f"redis://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="slow-subscribe", daemon=True
        )

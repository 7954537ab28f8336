"""The floors: the least a Redlock client can do per acquire + release, with no library.

Each cycle sends ``SET key token NX PX ttl`` to every node, then ``EVALSHA`` of a
compare-and-delete script, each pre-encoded in RESP (only the token is spliced in), and
decides each of the two rounds at the **first majority** of replies, as a correct
Redlock client may: once a majority said OK, the others' replies cannot change the
outcome. Replies still to come when a round is decided are read and dropped before the
next round's, so the connections stay in step (a node's replies come in request order).

Every reply these commands get is one RESP line (``+OK``, ``$-1``, ``:1``, ``:0``,
``-ERR ...``), so counting lines is parsing.

``MajorityFloor`` is the blocking one (raw sockets, one ``poll`` per wait, in the calling
thread); ``AsyncMajorityFloor`` the asyncio one (one connection per node, a protocol
that counts lines in ``data_received``, one future per round). The asyncio one takes
any number of concurrent cycles on the same connections: requests are pipelined, and
each node's replies are handed to its callbacks in order.
"""

from __future__ import annotations

import asyncio
import collections
import secrets
import select
import socket
from collections.abc import Callable, Sequence

__all__ = ["AsyncMajorityFloor", "MajorityFloor", "Payloads"]

Address = tuple[str, int]


# The floor's release: the compare-and-delete every Redis lock uses (two calls, as
# tenure's release of a lock that nobody waits for).
COMPARE_AND_DELETE = (
    b'if redis.call("GET", KEYS[1]) == ARGV[1] then return redis.call("DEL", KEYS[1]) end return 0'
)


def _bulk(data: bytes) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(data), data)


class Payloads:
    """The two commands of a cycle on one key, encoded once but for the token."""

    def __init__(self, key: str, ttl_ms: int, release_sha: str) -> None:
        k = _bulk(key.encode())
        # SET key token NX PX ttl: the head up to the token, then the tail after it.
        self._set_head = b"*6\r\n$3\r\nSET\r\n" + k
        self._set_tail = b"$2\r\nNX\r\n$2\r\nPX\r\n" + _bulk(str(ttl_ms).encode())
        # EVALSHA sha 1 key token
        sha = _bulk(release_sha.encode())
        self._del_head = b"*5\r\n$7\r\nEVALSHA\r\n" + sha + b"$1\r\n1\r\n" + k

    def acquire(self, token: bytes) -> bytes:
        return b"".join((self._set_head, b"$%d\r\n" % len(token), token, b"\r\n", self._set_tail))

    def release(self, token: bytes) -> bytes:
        return b"".join((self._del_head, b"$%d\r\n" % len(token), token, b"\r\n"))


def new_token() -> bytes:
    return secrets.token_hex(16).encode()


class MajorityFloor:
    """Blocking: send to every node, return at the first majority of replies."""

    def __init__(self, addresses: Sequence[Address], payloads: Payloads) -> None:
        self._socks = []
        for host, port in addresses:
            sock = socket.create_connection((host, port))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks.append(sock)
        self._fds = {s.fileno(): i for i, s in enumerate(self._socks)}
        self._poll = select.poll()
        for fd in self._fds:
            self._poll.register(fd, select.POLLIN)
        self._bufs = [b""] * len(self._socks)
        self._owed = [0] * len(self._socks)  # replies of earlier rounds, to drop first
        self._quorum = len(self._socks) // 2 + 1
        self.payloads = payloads

    def round(self, payload: bytes, yes: bytes) -> bool:
        """Send ``payload`` to all; True once a majority answered ``yes`` (a line)."""
        socks, bufs, owed = self._socks, self._bufs, self._owed
        for sock in socks:
            sock.sendall(payload)
        answered = [False] * len(socks)
        ayes = noes = 0
        need, n = self._quorum, len(socks)
        while ayes < need and noes <= n - need:
            for fd, _ in self._poll.poll(1000):
                i = self._fds[fd]
                data = socks[i].recv(65536)
                if not data:
                    raise ConnectionError(f"node {i} closed the connection")
                buf = bufs[i] + data
                while True:
                    end = buf.find(b"\r\n")
                    if end < 0:
                        break
                    line, buf = buf[:end], buf[end + 2 :]
                    if owed[i]:
                        owed[i] -= 1
                    else:
                        answered[i] = True
                        if line == yes:
                            ayes += 1
                        else:
                            noes += 1
                bufs[i] = buf
        for i, done in enumerate(answered):
            owed[i] += not done
        return ayes >= need

    def cycle(self) -> bool:
        token = new_token()
        p = self.payloads
        return self.round(p.acquire(token), b"+OK") and self.round(p.release(token), b":1")

    def close(self) -> None:
        for sock in self._socks:
            sock.close()


class _Lines(asyncio.Protocol):
    """One node: each reply line goes to the oldest waiting callback."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiting: collections.deque[Callable[[bytes], None]] = collections.deque()
        self._buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data
        waiting = self.waiting
        while True:
            end = buf.find(b"\r\n")
            if end < 0:
                break
            waiting.popleft()(buf[:end])
            buf = buf[end + 2 :]
        self._buf = buf


class AsyncMajorityFloor:
    """asyncio: one pipelined connection per node, a round decided at the first majority."""

    def __init__(self, protocols: list[_Lines]) -> None:
        self._nodes = protocols
        self._quorum = len(protocols) // 2 + 1

    @classmethod
    async def connect(cls, addresses: Sequence[Address]) -> AsyncMajorityFloor:
        loop = asyncio.get_running_loop()
        protocols = []
        for host, port in addresses:
            transport, protocol = await loop.create_connection(_Lines, host, port)
            sock = transport.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            protocols.append(protocol)
        return cls(protocols)

    async def round(self, payload: bytes, yes: bytes) -> bool:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[bool] = loop.create_future()
        need, n = self._quorum, len(self._nodes)
        tally = [0, 0]  # ayes, noes

        def on_reply(line: bytes) -> None:
            if done.done():
                return  # decided: a late reply, dropped
            tally[line != yes] += 1
            if tally[0] >= need:
                done.set_result(True)
            elif tally[1] > n - need:
                done.set_result(False)

        for node in self._nodes:
            assert node.transport is not None
            node.transport.write(payload)
            node.waiting.append(on_reply)
        return await done

    async def cycle(self, payloads: Payloads) -> bool:
        token = new_token()
        return await self.round(payloads.acquire(token), b"+OK") and await self.round(
            payloads.release(token), b":1"
        )

    async def close(self) -> None:
        for node in self._nodes:
            if node.transport is not None:
                node.transport.close()
        await asyncio.sleep(0)

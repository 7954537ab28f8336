"""Release notifications for the blocking client: one subscriber thread per client.

Theory of operation
-------------------
A client that ever waits for a lock starts one daemon thread that holds one pub/sub
connection per node, subscribed to the client's own channel, and ``select()``s on all of
them. Every waiting thread of the client registers a ``Slot`` under its waiter id; the
thread files each message (``_core.waiting.Wake``) in its waiter's slot and sets the
slot's event. A waiter blocks on that event for at most the time the core allows
(``Wait.timeout``): the notification or the fallback re-check, whichever comes first.

A connection that fails is re-established after a back-off; once subscribed again,
every slot is nudged to re-check at once, since notifications sent meanwhile reached
nobody (release.lua then skipped those waiters; the re-check queues them again). After
``fork()`` the child forgets the parent's thread and sockets and picks a new channel.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import socket
import threading
import time
import weakref
from collections.abc import Sequence
from typing import cast

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core.commands import pack
from .._core.resp import ReplyReader
from .._core.waiting import Wake, parse_wake
from .links import NodeState

__all__ = ["Listener", "Slot"]

BACKOFF_MIN = 0.025
BACKOFF_MAX = 1.0
# After the first node's notification, how long a waiter on a quorum waits for a
# majority of them before trying (see ``Slot``).
STRAGGLE = 0.002
_NETWORK_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


class Slot:
    """Where the notifications of one waiting thread are filed.

    On a quorum (``need`` > 1) the event is set once a majority of nodes have notified,
    or ``STRAGGLE`` seconds after the first did: a release reaches the nodes one after
    another, and trying after the first notification would find the others still held (a
    wasted round, and a partial grant to clean up). The listener thread does the
    counting and keeps the timer, so the waiter wakes once, not once per node.
    """

    __slots__ = ("event", "need", "nodes", "since", "wakes")

    def __init__(self, need: int = 1) -> None:
        self.event = threading.Event()
        self.wakes: list[Wake] = []
        self.nodes: set[int] = set()  # the nodes whose notifications are in ``wakes``
        self.need = need
        self.since = 0.0  # when the first notification of this round of them came

    def put(self, wake: Wake | None, node: int = -1) -> None:
        if wake is None:
            self.event.set()  # a nudge: re-check now
            return
        self.wakes.append(wake)
        self.nodes.add(node)
        if len(self.nodes) >= self.need:
            self.event.set()
        elif len(self.nodes) == 1:
            self.since = time.monotonic()

    def overdue(self, now: float) -> bool:
        """Notified by too few nodes for too long: let the waiter try anyway."""
        return bool(self.wakes) and not self.event.is_set() and now - self.since >= STRAGGLE

    def take(self) -> list[Wake]:
        """The notifications so far (clears the event first, so none can be missed)."""
        self.event.clear()
        wakes, self.wakes = self.wakes, []
        self.nodes = set()
        return wakes

    def wait(self, timeout: float) -> bool:
        """Until notified (True) or ``timeout`` seconds pass (False)."""
        return self.event.wait(timeout)


class Listener:
    """The subscriber thread of one client, started on first need."""

    def __init__(self, nodes: Sequence[NodeState]) -> None:
        self._nodes = list(nodes)
        self._slots: dict[str, Slot] = {}
        self._guard = threading.Condition()
        self._thread: threading.Thread | None = None
        self._up = [False] * len(nodes)
        self._stop = False
        self._waker: tuple[socket.socket, socket.socket] | None = None
        self.channel = f"tenure:wake:{secrets.token_hex(8)}"
        _LISTENERS.add(self)

    @property
    def started(self) -> bool:
        return self._thread is not None

    def register(self, waiter: str, timeout: float, need: int = 1) -> Slot:
        """A slot for ``waiter``; starts the thread if needed and waits (up to ``timeout``)
        until every node confirmed the subscription, so the first queued attempt can be
        notified. ``need``: the notifications that make a majority (see ``Slot``)."""
        slot = Slot(need)
        self._slots[waiter] = slot
        if self._thread is None:
            with self._guard:
                if self._thread is None and not self._stop:
                    self._waker = socket.socketpair()
                    self._thread = threading.Thread(
                        target=self._run, name="tenure-notify", daemon=True
                    )
                    self._thread.start()
                self._guard.wait_for(lambda: all(self._up) or self._stop, timeout)
        return slot

    def unregister(self, waiter: str) -> None:
        self._slots.pop(waiter, None)

    def close(self) -> None:
        with self._guard:
            self._stop = True
            waker, thread = self._waker, self._thread
        if waker is not None:
            with contextlib.suppress(OSError):
                waker[1].send(b"x")
        if thread is not None and thread is not threading.current_thread():
            thread.join(2.0)

    def forget(self) -> None:
        """In a child after fork: the thread and its sockets are the parent's."""
        self._thread = None
        self._waker = None
        self._up = [False] * len(self._nodes)
        self._slots = {}
        self._guard = threading.Condition()
        self.channel = f"tenure:wake:{secrets.token_hex(8)}"

    def _nudge_all(self) -> None:
        for slot in list(self._slots.values()):
            slot.put(None)

    def _run(self) -> None:
        nodes = self._nodes
        n = len(nodes)
        socks: list[socket.socket | None] = [None] * n
        conns: list[object] = [None] * n
        readers = [ReplyReader() for _ in range(n)]
        retry_at = [0.0] * n
        backoff = [BACKOFF_MIN] * n
        ever = [False] * n
        waker = self._waker
        assert waker is not None
        subscribe = pack("SUBSCRIBE", self.channel)

        def drop(i: int, now: float) -> None:
            conn = conns[i]
            conns[i] = socks[i] = None
            if conn is not None:
                with contextlib.suppress(Exception):
                    conn.disconnect()  # type: ignore[attr-defined]
            self._up[i] = False
            retry_at[i] = now + backoff[i]
            backoff[i] = min(backoff[i] * 2, BACKOFF_MAX)

        try:
            while not self._stop:
                now = time.monotonic()
                for i in range(n):
                    if socks[i] is None and now >= retry_at[i]:
                        try:
                            conn = nodes[i].new_connection()
                            conns[i] = conn
                            conn.connect()  # type: ignore[no-untyped-call]
                            sock = cast("socket.socket | None", conn._sock)
                            if sock is None:
                                raise OSError("not connected")
                            sock.settimeout(nodes[i].timeout)
                            sock.sendall(subscribe)
                            socks[i] = sock
                            readers[i] = ReplyReader()
                        except _NETWORK_ERRORS:
                            drop(i, now)
                pending = [retry_at[i] - now for i in range(n) if socks[i] is None]
                if n > 1:
                    for slot in list(self._slots.values()):
                        if slot.overdue(now):
                            slot.event.set()
                        elif slot.wakes and not slot.event.is_set():
                            pending.append(slot.since + STRAGGLE - now)
                timeout = max(min(pending), 0.0005) if pending else None
                watched = [waker[0]] + [s for s in socks if s is not None]
                readable, _, _ = select.select(watched, [], [], timeout)
                for sock in readable:
                    if sock is waker[0]:
                        continue
                    i = socks.index(sock)
                    try:
                        data = sock.recv(65536)
                    except OSError:
                        data = b""
                    try:
                        replies = readers[i].feed(data) if data else None
                    except ValueError:
                        replies = None
                    if replies is None:
                        drop(i, time.monotonic())
                        continue
                    for reply in replies:
                        self._handle(i, reply, ever)
        finally:
            for i in range(n):
                drop(i, 0.0)
            for s in waker:
                s.close()

    def _handle(self, i: int, reply: object, ever: list[bool]) -> None:
        if not isinstance(reply, list) or len(reply) != 3:
            return
        kind = reply[0]
        if kind == b"message":
            wake = parse_wake(reply[2])
            if wake is not None:
                slot = self._slots.get(wake.waiter)
                if slot is not None:
                    slot.put(wake, i)
        elif kind == b"subscribe":
            with self._guard:
                self._up[i] = True
                self._guard.notify_all()
            if ever[i]:
                self._nudge_all()  # notifications sent while we were away reached nobody
            ever[i] = True


_LISTENERS: weakref.WeakSet[Listener] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for listener in list(_LISTENERS):
        listener.forget()


os.register_at_fork(after_in_child=_forget_after_fork)

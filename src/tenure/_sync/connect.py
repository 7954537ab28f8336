"""Setting up one connection in a thread of its own, so that rounds never wait on it.

Setting up a connection is a TCP connect, then (``rediss://``) a TLS handshake, then
(with credentials or a database) AUTH and SELECT, then (to a node whose last connection
went unanswered: ``_core.backoff``) a PING: one or more round trips, each of which
blocks in redis-py. Done inline in a round, it would be charged to the round's
``node_timeout`` (a TLS handshake alone often takes longer than the default 50 ms), and
the nodes would have to be connected one after the other. A ``SetUp`` runs it in a
short-lived daemon thread instead, under ``connect_timeout``, so the caller can connect
every node at once and go on with the nodes that are ready (``LinkSet.run``); the
notification listener sets up its subscriptions the same way. The thread
ends with the set-up; a set-up nobody wants any more is closed when it ends.

redis-py's socket timeout bounds each wait for bytes, not a whole reply: a node that
sends its reply to AUTH (or HELLO, CLIENT SETNAME, SELECT) a byte at a time, each sooner
than that, kept the set-up reading for ever, long after its caller gave it up at its
deadline. So a set-up given up (``abandon``) while it talks to the node has its socket
shut down, as a slot-map load given up has its seed's (``cluster._MapLoad``): the read
sees the connection closed and the thread ends.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Callable

import redis

from .._core.commands import PING
from .._core.diagnosis import silent_since_stall
from .._driver.guard import Guard
from .._driver.redis_compat import Diagnosed, disconnect, kernel_timeouts
from .._driver.threads import start_thread

__all__ = ["SetUp"]


class SetUp:
    """One connection being set up; ``done`` once it is connected or failed.

    Args:
        conn: the unconnected redis-py connection.
        connect_timeout: bounds each step of the set-up (connect, handshake, each reply).
        node_timeout: the socket timeouts the connection gets once set up (see
            ``kernel_timeouts``).
        on_done: called (in the set-up's thread) when it ends, to wake whoever waits.
        deadline: when the caller stops waiting for it (the steps' own bounds add up).
        probe: send a PING after the handshake and wait for its answer: the node's last
            connection was given up as stalled (``_core.backoff``).
    """

    def __init__(
        self,
        conn: redis.Connection,
        connect_timeout: float,
        node_timeout: float,
        on_done: Callable[[], None],
        deadline: float,
        *,
        probe: bool = False,
    ) -> None:
        self.deadline = deadline
        self.probe = probe
        self.probing = False  # the handshake is done, and the PING sent
        self._conn = conn
        self._timeouts = (connect_timeout, node_timeout)
        self._on_done = on_done
        self._lock = Guard()
        self._done = False
        self._abandoned = False
        self._talking = False  # connected, and the handshake under way (``_handshake``)
        self.error: Exception | None = None
        # redis-py calls this (rather than its own ``on_connect``) once the socket is
        # connected, before the first command of the handshake: the one moment the socket
        # exists and nothing has been read from it yet. (tenure refuses a
        # redis_connect_func of the application's, so none is replaced.) redis-py types
        # it as taking no argument, and calls it with the connection.
        conn.redis_connect_func = self._handshake  # type: ignore[assignment,unused-ignore]
        if start_thread(self._run, "tenure-connect") is None:
            self._run()  # no thread to be had (the interpreter is ending): here, done on return

    @property
    def done(self) -> bool:
        return self._done

    def take(self) -> redis.Connection:
        """The connection, once ``done`` without ``error``."""
        assert self._done
        assert self.error is None
        return self._conn

    def abandon(self) -> None:
        """Nobody will use this connection: close it now, or when its set-up ends. A
        handshake under way is cut short (its socket shut down, not closed under the
        thread reading it); one not yet begun never begins (``_handshake``)."""
        with self._lock:
            self._abandoned = True
            done, talking = self._done, self._talking
        if done:
            disconnect(self._conn)
        elif talking:
            sock: socket.socket | None = self._conn._sock  # (typed as never None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _handshake(self, conn: redis.Connection) -> None:
        """AUTH, HELLO, CLIENT SETNAME, SELECT: redis-py's own ``on_connect``, unless the
        set-up was given up first. Checked and noted under the lock: an ``abandon``
        either comes before (and nothing is sent) or finds ``_talking`` and the socket."""
        with self._lock:
            if self._abandoned:
                raise redis.ConnectionError("set-up given up (connect_timeout)")
            self._talking = True
        conn.on_connect()  # type: ignore[no-untyped-call]
        if self.probe:
            self._ping(conn)

    def _ping(self, conn: redis.Connection) -> None:
        """Send a PING and wait for its answer, an error too (an ACL user may not be
        granted PING, and saying so is an answer), for the connect timeout (the
        socket's timeout in the set-up)."""
        self.probing = True
        conn.send_packed_command([PING], check_health=False)  # type: ignore[no-untyped-call]
        try:
            conn.read_response()
        except redis.ResponseError:
            pass
        except redis.TimeoutError:
            raise Diagnosed(silent_since_stall(self._timeouts[0])) from None

    def _run(self) -> None:
        conn = self._conn
        connect_timeout, node_timeout = self._timeouts
        error: Exception | None = None
        try:
            # redis-py runs the TLS handshake and AUTH under ``socket_timeout``: they get
            # the connect timeout, then the connection gets the round's timeouts back.
            conn.socket_timeout = connect_timeout
            conn.connect()  # type: ignore[no-untyped-call]
            conn.socket_timeout = node_timeout
            kernel_timeouts(conn._sock, node_timeout)  # type: ignore[arg-type]
        except Exception as exc:  # reported to the round, which classifies it
            error = exc
        # The hook held this set-up, and the set-up the connection: a cycle, which left a
        # connection dropped unclosed (a second Ctrl-C as its link was closed) to the
        # cyclic collector, which may finalize its socket before redis-py's ``__del__``
        # closes it (a ``ResourceWarning``). Without it, dropping one closes its socket.
        conn.redis_connect_func = None
        with self._lock:
            self.error = error
            self._done = True
            close = self._abandoned or error is not None
        if close:
            conn.disconnect()  # type: ignore[no-untyped-call]
        self._on_done()

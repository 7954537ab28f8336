"""A per-node TCP proxy that injects network faults: delay, blackhole, reset, lost replies.

Theory of operation
-------------------

A :class:`Proxy` listens on a free loopback port and forwards every accepted connection
to one target (a redis-server). Each accepted connection is a *link*: a client-side
socket, a server-side socket, and two *pipes*, ``up`` (client -> server) and ``down``
(server -> client). One daemon thread runs a ``selectors`` loop over every socket (no
thread per connection) plus a timer heap for delayed chunks, so a hundred connections
cost a hundred file descriptors and nothing more.

The *mode* decides the fate of each chunk at the moment it is read from its source:

=================  ===========  ===========  ==========================================
mode               up           down         models
=================  ===========  ===========  ==========================================
``pass``           forward      forward      a healthy network
``delay``          after ``d``  after ``d``  a slow link (order kept per direction)
``blackhole``      discard      discard      a partition: connections stay open, and
                                             nothing arrives either way
``drop_replies``   forward      discard      the ambiguous outcome: the command runs,
                                             its reply never comes
``reset``          --           --           every connection is RST, and new ones are
                                             RST as soon as they are accepted
=================  ===========  ===========  ==========================================

A mode change is carried out by the loop thread; the caller waits until it has been
applied to every open link, so once ``blackhole()`` returns, no byte read afterwards is
forwarded. Chunks already queued (delayed, or waiting for a slow reader) are in flight:
a mode that forwards their direction keeps them (``delay`` -> ``pass`` delivers them at
once, in order), a mode that discards it discards them too.

**A stream with a hole is never resumed.** Redis's protocol has no framing checks: a
client whose reply was discarded would read the *next* reply as the answer to its
command, and a replica that missed part of the replication stream would silently diverge
from its master. So every discarded byte (or swallowed FIN) *taints* its direction, and
when a later mode would forward a tainted direction again, the link is reset instead.
After a partition heals, connections that lost data see ``ECONNRESET`` and reconnect
(a replica then resumes with ``PSYNC`` from the offset it really has); connections that
were idle throughout carry on. Real TCP would retransmit rather than lose data, but it
would also give up after a long enough partition; the reset is the conservative model.

End-of-stream follows the same rules as data, because a close is information flowing
in one direction: a FIN read from one side is passed on as ``shutdown(SHUT_WR)`` on the
other (after the data before it, so half-closes work), and an error (``ECONNRESET``, a
refused connect to a target that is down) resets the other side. In a mode that discards
that direction, the event is swallowed and the direction tainted: a partitioned client
cannot see that its server died. Only an error is not delayed: a reset overtakes data
still queued behind a delay, as it does on a real network.

Bytes are counted when written to their destination (``bytes_up``, ``bytes_down``) or
when discarded (``bytes_dropped``): the proof a verifier report shows that a fault
really happened.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import errno
import heapq
import ipaddress
import itertools
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from types import TracebackType

from tenure._errors import ConfigurationError, TenureError

__all__ = ["Proxy", "ProxyError", "ProxyMode", "ProxyStats"]

_HOST = "127.0.0.1"
_CHUNK = 256 * 1024
# Stop reading a source while this much is queued for its destination: back-pressure
# instead of unbounded buffering when a reader is slow or a delay holds data back.
_HIGH_WATER = 4 * 1024 * 1024
_BACKLOG = 1024
_COMMAND_TIMEOUT = 5.0  # seconds for the loop thread to apply a mode change
_LINGER_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST
_IN_PROGRESS = {errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN}


class ProxyError(TenureError, RuntimeError):
    """The proxy's loop thread is not running or did not apply a change in time."""


class ProxyMode(str, enum.Enum):
    """What a :class:`Proxy` does with traffic; see the module docstring."""

    PASS = "pass"
    DELAY = "delay"
    BLACKHOLE = "blackhole"
    DROP_REPLIES = "drop_replies"
    RESET = "reset"

    def forwards(self, up: bool) -> bool:
        """Whether this mode forwards the direction (``up``: client -> server)."""
        if self is ProxyMode.DROP_REPLIES:
            return up
        return self in (ProxyMode.PASS, ProxyMode.DELAY)


@dataclasses.dataclass(frozen=True)
class ProxyStats:
    """Counters since the proxy was created, for proof that a fault happened.

    Attributes:
        connections: client connections accepted.
        open_connections: links open right now.
        bytes_up: bytes written to the target (client -> server).
        bytes_down: bytes written to clients (server -> client).
        bytes_dropped: bytes read and discarded, in either direction.
        resets: links closed with RST by the proxy (by ``reset()``, on accept in reset
            mode, or because a tainted stream would have been resumed).
        mode: the mode in force.
        delay: the delay in seconds (0 unless the mode is ``delay``).
    """

    connections: int
    open_connections: int
    bytes_up: int
    bytes_down: int
    bytes_dropped: int
    resets: int
    mode: ProxyMode
    delay: float


@dataclasses.dataclass
class _Counters:
    connections: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    bytes_dropped: int = 0
    resets: int = 0


class _Pipe:
    """One direction of a link: what is queued for the destination, and its state."""

    def __init__(self, up: bool) -> None:
        self.up = up
        self.outbuf = bytearray()  # due now, waiting for the destination to be writable
        self.delayed: collections.deque[tuple[float, bytes | None]] = collections.deque()
        self.delayed_bytes = 0
        self.src_eof = False  # a FIN was read from the source (or the source is gone)
        self.eof_due = False  # the FIN is to be passed on once outbuf is empty
        self.shut = False  # the FIN was passed on: shutdown(SHUT_WR) on the destination
        self.tainted = False  # something was discarded: the stream has a hole

    @property
    def pending(self) -> int:
        return len(self.outbuf) + self.delayed_bytes

    @property
    def done(self) -> bool:
        """Nothing more will ever travel this way."""
        return self.src_eof and not self.eof_due and not self.outbuf and not self.delayed


class _Link:
    """A client connection and its connection to the target."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client: socket.socket | None = client
        self.server: socket.socket | None = server
        self.connecting = True
        self.up = _Pipe(up=True)
        self.down = _Pipe(up=False)
        self.closed = False

    def src(self, pipe: _Pipe) -> socket.socket | None:
        return self.client if pipe.up else self.server

    def dst(self, pipe: _Pipe) -> socket.socket | None:
        return self.server if pipe.up else self.client


class Proxy:
    """A TCP proxy on a free loopback port in front of ``target_host:target_port``.

    Args:
        target_host: the target's IPv4 loopback address (or ``"localhost"``).
        target_port: the target's port.
        name: a label for the loop thread and ``repr``, e.g. the node's name.

    Raises:
        ConfigurationError: (``target_host``) not an IPv4 loopback address.

    Use as a context manager, or call :meth:`start` and :meth:`close`. The fault methods
    (:meth:`heal`, :meth:`delay`, :meth:`blackhole`, :meth:`reset`,
    :meth:`drop_replies`) are thread-safe and apply to open connections at once.
    """

    def __init__(self, target_host: str, target_port: int, *, name: str = "") -> None:
        # Resolved here, once: a name lookup in the loop thread would stall every link.
        host = _HOST if target_host == "localhost" else target_host
        try:
            loopback = ipaddress.IPv4Address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ConfigurationError("target_host", f"{target_host!r} is not IPv4 loopback")
        self.target = (host, target_port)
        self.name = name or f"proxy->{target_port}"
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((_HOST, 0))
        self._listener.listen(_BACKLOG)
        self._listener.setblocking(False)
        bound_host, bound_port = self._listener.getsockname()[:2]
        self._address: tuple[str, int] = (bound_host, bound_port)
        self._mode = ProxyMode.PASS
        self._delay = 0.0
        self._counters = _Counters()
        self._stats_lock = threading.Lock()  # counters are read from other threads
        self._commands: collections.deque[tuple[Callable[[], None], threading.Event]] = (
            collections.deque()
        )
        self._commands_lock = threading.Lock()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._events: dict[socket.socket, int] = {}
        self._links: set[_Link] = set()
        self._timers: list[tuple[float, int, _Link, _Pipe]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False
        self.error: BaseException | None = None
        """The exception that stopped the loop thread, if one did (a bug)."""

    def __repr__(self) -> str:
        target = f"{self.target[0]}:{self.target[1]}"
        return f"<Proxy {self.name} {self.url} -> {target} {self._mode.value}>"

    # -- public surface ------------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)`` clients connect to."""
        return self._address

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT``: the node's URL as seen through the proxy."""
        return f"redis://{self._address[0]}:{self._address[1]}"

    @property
    def mode(self) -> ProxyMode:
        """The mode in force."""
        return self._mode

    @property
    def stats(self) -> ProxyStats:
        """A snapshot of the counters."""
        with self._stats_lock:
            c = dataclasses.replace(self._counters)
            open_links = len(self._links)
        return ProxyStats(
            connections=c.connections,
            open_connections=open_links,
            bytes_up=c.bytes_up,
            bytes_down=c.bytes_down,
            bytes_dropped=c.bytes_dropped,
            resets=c.resets,
            mode=self._mode,
            delay=self._delay,
        )

    def start(self) -> None:
        """Start the loop thread (connections made before are queued by the kernel).

        Raises:
            ProxyError: it is closed or already started.
        """
        if self._closed or self._thread is not None:
            raise ProxyError(f"{self.name}: cannot start a proxy that was started or closed")
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the loop thread and close every socket; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._stopping = True
            self._wake()
            self._thread.join(_COMMAND_TIMEOUT)
        for link in list(self._links):
            self._close_link(link, rst=False)
        self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    def __enter__(self) -> Proxy:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def heal(self) -> None:
        """Pass traffic normally; links that lost data are reset (see the module doc)."""
        self._set_mode(ProxyMode.PASS, 0.0)

    def delay(self, seconds: float) -> None:
        """Forward every chunk, both ways, ``seconds`` after it was read (order kept).

        Raises:
            ConfigurationError: (``seconds``) negative.
        """
        if not seconds >= 0:
            raise ConfigurationError("seconds", f"a delay must be >= 0, got {seconds}")
        self._set_mode(ProxyMode.DELAY, float(seconds))

    def blackhole(self) -> None:
        """Partition: read and discard everything both ways; connections stay open."""
        self._set_mode(ProxyMode.BLACKHOLE, 0.0)

    def reset(self) -> None:
        """RST every open connection, and every new one as soon as it is accepted."""
        self._set_mode(ProxyMode.RESET, 0.0)

    def drop_replies(self) -> None:
        """Forward client -> server, discard server -> client: commands run, no replies."""
        self._set_mode(ProxyMode.DROP_REPLIES, 0.0)

    # -- commands from other threads -----------------------------------------------------

    def _set_mode(self, mode: ProxyMode, delay: float) -> None:
        def apply() -> None:
            self._apply_mode(mode, delay)

        if self._thread is None or self._closed:
            if self._closed:
                raise ProxyError(f"{self.name}: closed")
            apply()  # no links exist before start
            return
        if threading.current_thread() is self._thread:
            apply()
            return
        done = threading.Event()
        with self._commands_lock:
            self._commands.append((apply, done))
        self._wake()
        if not done.wait(_COMMAND_TIMEOUT) or self.error is not None:
            raise ProxyError(
                f"{self.name}: loop thread did not apply {mode.value} within "
                f"{_COMMAND_TIMEOUT} s (error: {self.error!r})"
            )

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full of wake-ups already
            self._wake_w.send(b"\0")

    # -- the loop thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._relay_until_stopped()
        except BaseException as exc:  # a bug: keep it, and release waiting callers
            self.error = exc
            with self._commands_lock:
                waiting, self._commands = list(self._commands), collections.deque()
            for _, done in waiting:
                done.set()
            raise

    def _relay_until_stopped(self) -> None:
        # (A loop apart from ``_run``'s ``try``: docs/architecture.md, "A loop in a try
        # or with block".)
        while not self._stopping:
            timeout = None
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
            for key, events in self._selector.select(timeout):
                sock = key.fileobj
                if sock is self._listener:
                    self._accept()
                elif sock is self._wake_r:
                    self._drain_commands()
                else:
                    link: _Link = key.data
                    try:
                        self._service(link, sock, events)  # type: ignore[arg-type]
                    except OSError:  # this link is broken; the others carry on
                        self._close_link(link, rst=True)
            self._fire_timers()

    def _drain_commands(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        while True:
            with self._commands_lock:
                if not self._commands:
                    return
                apply, done = self._commands.popleft()
            apply()
            done.set()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except BlockingIOError:
                return
            except OSError:  # e.g. EMFILE: leave it in the backlog for the next round
                return
            with self._stats_lock:
                self._counters.connections += 1
            if self._mode is ProxyMode.RESET:
                self._rst(client)
                with self._stats_lock:
                    self._counters.resets += 1
                continue
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            server.setblocking(False)
            server.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, server)
            with self._stats_lock:
                self._links.add(link)
            code = server.connect_ex(self.target)
            if code == 0:
                link.connecting = False
            elif code not in _IN_PROGRESS:
                self._side_died(link, server_side=True, error=True)
            self._update(link)

    def _fire_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, link, pipe = heapq.heappop(self._timers)
            if link.closed:
                continue
            while pipe.delayed and pipe.delayed[0][0] <= now:
                _, chunk = pipe.delayed.popleft()
                if chunk is None:
                    pipe.eof_due = True
                else:
                    pipe.delayed_bytes -= len(chunk)
                    pipe.outbuf += chunk
            self._flush(link, pipe)
            self._update(link)

    def _service(self, link: _Link, sock: socket.socket, events: int) -> None:
        if link.closed or (sock is not link.server and sock is not link.client):
            return  # an event for a socket closed earlier in this round
        is_server = sock is link.server
        if is_server and link.connecting:
            code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if code != 0:
                self._side_died(link, server_side=True, error=True)
                self._update(link)
                return
            link.connecting = False
            self._flush(link, link.up)
            self._update(link)
            return
        if events & selectors.EVENT_WRITE and not link.closed:
            self._flush(link, link.up if is_server else link.down)
        if events & selectors.EVENT_READ and not link.closed:
            self._read(link, link.down if is_server else link.up)
        if not link.closed:
            self._update(link)

    def _read(self, link: _Link, pipe: _Pipe) -> None:
        src = link.src(pipe)
        assert src is not None
        try:
            data = src.recv(_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._side_died(link, server_side=not pipe.up, error=True)
            return
        if not data:
            self._side_died(link, server_side=not pipe.up, error=False)
            return
        mode = self._mode
        if not mode.forwards(pipe.up) or link.dst(pipe) is None:
            self._discard(pipe, len(data))
        elif mode is ProxyMode.DELAY and self._delay > 0:
            self._schedule(link, pipe, data)
        else:
            pipe.outbuf += data
            self._flush(link, pipe)

    def _schedule(self, link: _Link, pipe: _Pipe, chunk: bytes | None) -> None:
        due = time.monotonic() + self._delay
        if pipe.delayed:  # never overtake an earlier chunk queued under a longer delay
            due = max(due, pipe.delayed[-1][0])
        pipe.delayed.append((due, chunk))
        if chunk is not None:
            pipe.delayed_bytes += len(chunk)
        heapq.heappush(self._timers, (due, next(self._seq), link, pipe))

    def _discard(self, pipe: _Pipe, n: int) -> None:
        pipe.tainted = True
        with self._stats_lock:
            self._counters.bytes_dropped += n

    def _flush(self, link: _Link, pipe: _Pipe) -> None:
        """Write what is due to the destination, then pass on a due FIN."""
        dst = link.dst(pipe)
        if dst is None or (pipe.up and link.connecting):
            return
        sent_total = 0
        while pipe.outbuf:
            try:
                sent = dst.send(pipe.outbuf)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._count_sent(pipe, sent_total)
                # The destination is gone; that news travels the other way.
                self._side_died(link, server_side=pipe.up, error=True)
                return
            del pipe.outbuf[:sent]
            sent_total += sent
        self._count_sent(pipe, sent_total)
        if pipe.eof_due and not pipe.outbuf:
            pipe.eof_due = False
            pipe.shut = True
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                self._side_died(link, server_side=pipe.up, error=True)
                return
            if link.up.done and link.down.done:
                self._close_link(link, rst=False)

    def _count_sent(self, pipe: _Pipe, n: int) -> None:
        if n:
            with self._stats_lock:
                if pipe.up:
                    self._counters.bytes_up += n
                else:
                    self._counters.bytes_down += n

    def _side_died(self, link: _Link, *, server_side: bool, error: bool) -> None:
        """One side sent FIN (``error=False``) or failed: pass it on, or swallow it."""
        pipe = link.down if server_side else link.up
        pipe.src_eof = True
        if error:  # the socket is unusable: whatever was queued for it is lost
            self._drop_side(link, server_side)
        if not self._mode.forwards(pipe.up):
            # Swallowed: a partitioned peer cannot learn that the other end went away.
            pipe.tainted = True
            if link.client is None and link.server is None:
                self._close_link(link, rst=False)
            return
        if error:
            self._close_link(link, rst=True)
            return
        if self._mode is ProxyMode.DELAY and self._delay > 0:
            self._schedule(link, pipe, None)
        else:
            pipe.eof_due = True
            self._flush(link, pipe)

    def _drop_side(self, link: _Link, server_side: bool) -> None:
        sock = link.server if server_side else link.client
        if sock is None:
            return
        self._unregister(sock)
        sock.close()
        if server_side:
            link.server = None
            link.connecting = False
        else:
            link.client = None
        # Data queued *for* the dead side can never be delivered.
        into = link.up if server_side else link.down
        lost = into.pending
        into.outbuf.clear()
        into.delayed.clear()
        into.delayed_bytes = 0
        into.eof_due = False
        into.shut = True
        if lost:
            self._discard(into, lost)

    def _apply_mode(self, mode: ProxyMode, delay: float) -> None:
        with self._stats_lock:
            self._mode = mode
            self._delay = delay
        for link in list(self._links):
            if link.closed:
                continue
            if mode is ProxyMode.RESET:
                self._close_link(link, rst=True, deliberate=True)
                continue
            if any(p.tainted and mode.forwards(p.up) for p in (link.up, link.down)) or (
                # A dead side's peer would wait forever on a forwarding link.
                (link.client is None or link.server is None)
                and (mode.forwards(True) or mode.forwards(False))
            ):
                self._close_link(link, rst=True, deliberate=True)
                continue
            for pipe in (link.up, link.down):
                if not mode.forwards(pipe.up):
                    # In flight on a link that is now cut: lost.
                    lost = pipe.pending
                    eof_lost = pipe.eof_due or any(c is None for _, c in pipe.delayed)
                    pipe.outbuf.clear()
                    pipe.delayed.clear()
                    pipe.delayed_bytes = 0
                    pipe.eof_due = False
                    if lost:
                        self._discard(pipe, lost)
                    if eof_lost:
                        pipe.tainted = True
                elif mode is ProxyMode.PASS or (mode is ProxyMode.DELAY and delay == 0):
                    while pipe.delayed:  # deliver what was held back, in order
                        _, chunk = pipe.delayed.popleft()
                        if chunk is None:
                            pipe.eof_due = True
                        else:
                            pipe.outbuf += chunk
                    pipe.delayed_bytes = 0
                    self._flush(link, pipe)  # a no-op once the link is closed
            self._update(link)

    # -- sockets -------------------------------------------------------------------------

    def _update(self, link: _Link) -> None:
        """Register each socket of the link for exactly the events it needs now."""
        if link.closed:
            return
        client, server = link.client, link.server
        if client is not None:
            want = 0
            if not link.up.src_eof and link.up.pending < _HIGH_WATER:
                want |= selectors.EVENT_READ
            if link.down.outbuf:
                want |= selectors.EVENT_WRITE
            self._register(client, want, link)
        if server is not None:
            if link.connecting:
                want = selectors.EVENT_WRITE
            else:
                want = 0
                if not link.down.src_eof and link.down.pending < _HIGH_WATER:
                    want |= selectors.EVENT_READ
                if link.up.outbuf:
                    want |= selectors.EVENT_WRITE
            self._register(server, want, link)

    def _register(self, sock: socket.socket, events: int, link: _Link) -> None:
        current = self._events.get(sock, 0)
        if events == current:
            return
        if not events:
            self._unregister(sock)
        elif current:
            self._selector.modify(sock, events, link)
            self._events[sock] = events
        else:
            self._selector.register(sock, events, link)
            self._events[sock] = events

    def _unregister(self, sock: socket.socket) -> None:
        if self._events.pop(sock, 0):
            self._selector.unregister(sock)

    def _close_link(self, link: _Link, *, rst: bool, deliberate: bool = False) -> None:
        """Close both sides; ``deliberate`` resets are the fault's own, and counted."""
        if link.closed:
            return
        link.closed = True
        for sock in (link.client, link.server):
            if sock is None:
                continue
            self._unregister(sock)
            if rst:
                self._rst(sock)
            else:
                sock.close()
        link.client = link.server = None
        with self._stats_lock:
            self._links.discard(link)
            if deliberate:
                self._counters.resets += 1

    @staticmethod
    def _rst(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):  # already dead: a plain close is all there is
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
        sock.close()

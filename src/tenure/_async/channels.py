"""Multiplexed rounds for asyncio: one pipelined connection per node, shared by all tasks.

Theory of operation
-------------------
Each node has one ``Channel``: a redis-py asyncio connection, a FIFO of callbacks for the
requests written to it, and a task that sets the connection up and then only waits for it
to end. Once connected, the transport's protocol is replaced by ``RespProtocol``, which parses
replies in ``data_received`` and calls the callbacks in order as replies arrive: no task
reads the connection. Writing a request is synchronous (no ``await``), so

* requests from many tasks are pipelined on one connection, in the order they were made;
* a round writes to every node, then awaits one future that the reply callbacks settle
  as soon as the core's ``Round`` is decided, or a timer at the deadline (the callbacks
  run inside ``data_received``, so a reply costs no extra trip through the event loop);
* cleanup after a cancelled acquire needs no ``await``: the release is written behind the
  ``SET`` on the same connection before ``CancelledError`` propagates, and Redis executes
  one connection's commands in order. Nothing to shield, nothing to lose.

A reply that comes after its round ended is still read (by ``RespProtocol``) and dropped,
so no connection is ever left with an unread reply. A node that answers nothing for
``STALL`` seconds while requests wait is given up and left alone for a back-off; its
connection stays open until the node has answered what was written to it, a release
written first behind the rest (``Channel._let_go``). A
connection the node closed while nothing was pending on it (its idle ``timeout``, a
proxy's, a restart) is replaced at once: the event loop reads its end as it comes, or,
when the loop was not running meanwhile, the next round finds it before writing to a
channel left unused for ``IDLE_LOOK`` seconds (``_core.backoff``).

Setting up a connection (TCP, TLS handshake, AUTH) is not part of a round: it runs in the
channel's task under ``connect_timeout``, every node at once, and a round begins when
no set-up is left, or once the ready channels could decide it and a short grace has
passed (``Round.set_up_wait``); its clock starts then (``Round.begin_at``). A slow
handshake is so never charged to ``node_timeout``, and a node whose set-up hangs costs
at most that grace to a round the others can decide: its request waits in ``_unsent``
and goes out when it connects (so, unlike the blocking driver's, such a node may still
execute it: it counts as unreachable).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, cast

import redis.asyncio
from redis.exceptions import ResponseError

from .._core.backoff import IDLE_LOOK, LINGER, SERVED, STALL, Reconnect
from .._core.batching import Batch, Batches
from .._core.commands import PING, Command, ScriptCache, about_scripts, pack, split_batch
from .._core.config import ClientConfig, NodeAddress
from .._core.diagnosis import (
    BackingOff,
    Diagnosis,
    being_probed,
    in_url_form,
    not_connected_in_time,
    refuses_connection,
    reply_ends_link,
    rule_out,
    silent_since_stall,
)
from .._core.quorum import NEVER, Failure, Round
from .._core.resp import ErrorReply
from .._core.sentinel import demoted
from .._driver.redis_compat import (
    Diagnosed,
    NotRedis,
    before_first_reply,
    bound_tcp_connect,
    diagnose,
    has_unread,
    node_pool,
)
from .._driver.report import NodeReporter
from .._driver.timeouts import within
from .deadlines import Deadline, Deadlines
from .protocol import RespProtocol, closed_under_us, write
from .tasks import finish

__all__ = ["Channels", "Reply", "lost"]

# How many times a round's deadline is pushed back while the client itself held up its
# requests or the timer (``Channels.run``): bounded, so a silent node still times out.
MAX_GRACES = 3

# A timer that ran this late, as a fraction of its time, ran late because the event loop
# was busy with other work, not because the time was used up waiting (``Channel._connect``).
LATE = 0.1

# How long a connection task cancelled from outside (a loop shutting down) goes on
# reading the replies to what the tasks cancelled with it wrote: on a healthy node, a
# round trip; a node that is slower only delays the end of the loop by this much.
DRAIN = 0.05

# What ends a connection given up as stalled (``Channel._let_go``), and its answer, which
# no other command of ours gets. A script: EVAL is among the commands an ACL user of
# tenure's is granted (``_driver.acl``), PING is not.
_LET_GO_REPLY = b"tenure: let go"
_LET_GO = pack("EVAL", b"return '" + _LET_GO_REPLY + b"'", 0)

# A reply: (True, value) or (False, the error it came as), handed to the request's
# callback from ``RespProtocol.data_received``: no future, no extra trip through the event loop.
Reply = tuple[bool, Any]
# Called with the node's place in the client's list of nodes (``Channel.node``) and the
# reply. The place comes from the channel, not from a callback made per node and round
# (``partial(on_reply, i)``): a round on 5 nodes then makes one callback object, not 11,
# and with hundreds of rounds in flight the garbage collector runs less often.
OnReply = Callable[[int, Reply], None]


def lost(reply: Reply) -> bool:
    """Whether ``reply`` is the end of the connection (the error that ended it, handed
    to every request still unanswered, or a node's refusal of the connection itself),
    not an answer from the node."""
    ok, value = reply
    if ok:
        return False
    return not isinstance(value, ResponseError) or refuses_connection(str(value))


# The send time of a request still in this turn's batch (``Channel._flush`` sets it).
_UNSENT = float("inf")


def _ignore(node: int, reply: Reply) -> None:
    """The callback of a request nobody waits for (a cleanup written on cancellation)."""


def _callbacks(command: Command, on_reply: OnReply) -> list[OnReply]:
    # A command with several replies (a script, then WAIT) calls back once per reply.
    return [on_reply] * command.replies


class Channel:
    """One pipelined connection to one node (``node``: its place in the client's list of
    nodes, which every reply's callback is given; a Cluster node's members share it)."""

    def __init__(
        self,
        address: NodeAddress,
        pool: redis.asyncio.ConnectionPool,
        connect_timeout: float,
        changed: asyncio.Event,
        *,
        node: int,
        batching: bool = False,
    ) -> None:
        self.address = address
        self.node = node
        self._pool = pool
        self._connect_timeout = connect_timeout
        self._changed = changed  # set when a set-up ends (Channels._set_up waits on it)
        self._conn: redis.asyncio.Connection | None = None
        # Connected: a request written now goes out at once (``_conn`` set by the
        # running ``_task``). An attribute, not a property: every round reads it per node.
        self.ready = False
        self.ups = 0  # connections set up so far (a Cluster node's member: ``_on_reply``)
        self.used_at = 0.0  # when a request was last written (``Channels.run``'s look)
        self._pending: deque[tuple[OnReply, float]] = deque()
        self._unsent: list[tuple[Command, OnReply]] = []
        self._task: asyncio.Task[None] | None = None
        # Tasks of connections given up (``_reset``) that have not yet closed theirs:
        # ``close`` waits for them too, or a loop closed right after would leave their
        # connections open.
        self._retired: set[asyncio.Task[None]] = set()
        self._reconnect = Reconnect()
        self._idle: asyncio.Event | None = None  # set when nothing is pending (for close)
        # Written this turn of the loop, flushed at its end; a batch of acquires or of
        # releases is packed then (``_core.batching``).
        self._outbox: list[bytes | Batch[OnReply]] = []
        self._batching = batching  # a plain node: commands may go as one script run
        self._batches: Batches[OnReply] = Batches()  # the ones this turn's commands join
        # Why the connection last ended: a node in its back-off for a configuration
        # failure is reported with that failure, not as merely "backing off".
        self.last: Diagnosis | None = None
        self.scripts = ScriptCache()  # what its answers to EVALSHA told us
        # When it last answered a request whose round no longer waited for it: its
        # silence in a round under way since is that of a node behind (``Round.time_out``).
        self.answered_at = NEVER
        # A refusal the node sent before anything was asked on the connection (``_deliver``).
        self._refusal: ResponseError | None = None

    def send(self, command: Command, on_reply: OnReply = _ignore) -> None:
        """Write ``command`` now (or as soon as the connection is up).

        ``on_reply`` is called once per reply the command produces (``command.replies``),
        from the protocol's ``data_received``: with ``node`` and the reply, or the error
        that ended the connection first.
        """
        now = self.used_at = time.monotonic()
        if self._pending and now - self._pending[0][1] > STALL and self._nothing_to_read():
            self._let_go(command, now)
        if self._conn is not None and self._task is not None and not self._unsent:
            if command.item is not None and self._batching and self._pending:
                # (A batch goes by EVAL where the node lacks its script: ``_packed``.)
                opened = self._batches.join(command, on_reply)
                if opened is not None:
                    # Its place in the order of writes, and of replies: its first
                    # command's.
                    self._write(opened)
                    self._pending.append((partial(self._deliver_batch, opened), _UNSENT))
                return
            if self._batches.open:
                self._batches.passed(command)
            # Only a script sent by EVALSHA has another form (``ScriptCache``).
            scripts = self.scripts
            if not command.by_sha or scripts.as_packed:
                self._write(command.packed)
            else:
                self._write(scripts.packed(command))
            # A request in this turn's batch has not left yet: its wait for a reply
            # begins when the batch is written (``_flush`` stamps it then).
            sent = _UNSENT if self._outbox else now
            if command.replies == 1:
                self._pending.append((on_reply, sent))
            else:
                self._pending.extend((c, sent) for c in _callbacks(command, on_reply))
            return
        self.connect(now)
        self._unsent.append((command, on_reply))

    def _deliver_batch(self, batch: Batch[OnReply], node: int, reply: Reply) -> None:
        """Hand each command of ``batch`` its own reply out of the batch's."""
        callbacks = batch.callbacks
        if batch.alone:
            callbacks[0](node, reply)
            return
        ok, value = reply
        replies = split_batch(value, len(callbacks)) if ok else None
        if replies is None:
            # One answer for all (NOSCRIPT, a dropped connection): each command takes it
            # as its own, and an acquire's round resends it alone if a script was missing.
            if isinstance(value, ResponseError):
                self.scripts.answered(str(value), None)
            for on_reply in callbacks:
                on_reply(node, reply)
            return
        for on_reply, one in zip(callbacks, replies, strict=True):
            on_reply(
                node,
                (False, ResponseError(one.message)) if isinstance(one, ErrorReply) else (True, one),
            )

    @property
    def unread(self) -> bool:
        """Bytes from the node wait in the socket, not yet read by the event loop."""
        return self._conn is not None and not self._nothing_to_read()

    def _nothing_to_read(self) -> bool:
        """Is the connection's socket empty? A request unanswered for ``STALL`` seconds
        means a stalled connection only then: an event loop blocked that long (a CPU-bound
        callback, a starved process) finds the answers waiting in the socket, unread,
        and its nodes are not to blame."""
        writer = None if self._conn is None else self._conn._writer
        sock = None if writer is None else writer.transport.get_extra_info("socket")
        return sock is None or not has_unread(sock)

    def connect(self, now: float) -> None:
        """Start setting up a connection unless there is one (or one on its way).

        Raises:
            BackingOff: the node is in its reconnect back-off.
        """
        if self._task is None:
            wait = self.backing_off(now)
            if wait:
                raise BackingOff(wait, self.last)
            self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def probing(self) -> bool:
        """Is the set-up under way one whose PING must be answered before the connection
        is used (``_core.backoff``)?"""
        return self._reconnect.probe and self.connecting

    @property
    def connecting(self) -> bool:
        return self._conn is None and self._task is not None

    def backing_off(self, now: float) -> float:
        """Seconds until a new connection may be tried (0 when it may be tried now)."""
        return self._reconnect.left(now) if self._task is None else 0.0

    def _write(self, packed: bytes | Batch[OnReply]) -> None:
        # Many tasks share this connection. With requests already in flight (other
        # tasks are busy too), the command joins the ones written in this turn of the
        # event loop, and all go out in one write at the end of the turn (``_flush``):
        # one system call for many rounds. On an idle connection it is written at once.
        # Either way it is written before the caller's next await can be cancelled,
        # in the order commands were made, so a cleanup follows what it cleans up.
        outbox = self._outbox
        if outbox:
            outbox.append(packed)
        elif self._pending:
            outbox.append(packed)
            asyncio.get_running_loop().call_soon(self._flush, self._conn)
        else:
            assert self._conn is not None
            assert isinstance(packed, bytes)  # a batch opens only behind pending requests
            # redis-py has no public synchronous write: its StreamWriter, directly.
            writer = self._conn._writer
            try:
                writer.write(packed)  # type: ignore[union-attr]
            except RuntimeError:  # uvloop, a connection closed in this turn: dropped
                if not closed_under_us(writer.transport):  # type: ignore[union-attr]
                    raise

    @property
    def batched(self) -> bool:
        """Commands wait in this turn's batch (``_write``)."""
        return bool(self._outbox)

    @property
    def backlogged(self) -> bool:
        """Requests of ours have not all left this process yet (the batch, or bytes the
        transport holds while the socket's send buffer is full)."""
        if self._outbox:
            return True
        writer = None if self._conn is None else self._conn._writer
        return writer is not None and writer.transport.get_write_buffer_size() > 0

    def _flush(self, conn: redis.asyncio.Connection | None) -> None:
        outbox, self._outbox = self._outbox, []
        self._batches.clear()
        if conn is not None and conn is self._conn and outbox:
            data = [part if isinstance(part, bytes) else self._packed(part) for part in outbox]
            writer = conn._writer
            try:
                writer.write(b"".join(data))  # type: ignore[union-attr]
            except RuntimeError:  # uvloop, a connection closed in this turn: dropped
                if not closed_under_us(writer.transport):  # type: ignore[union-attr]
                    raise
            # Their wait for replies (``STALL``) begins now, not when they were queued:
            # a loop blocked between the two did not make the node silent.
            now = time.monotonic()
            pending = self._pending
            i = len(pending) - 1
            while i >= 0 and pending[i][1] == _UNSENT:
                pending[i] = (pending[i][0], now)
                i -= 1

    def _packed(self, batch: Batch[OnReply]) -> bytes:
        # A batch of one goes as that command.
        return self.scripts.packed(batch.command())

    async def _run(self) -> None:
        """Connect, flush what was queued meanwhile, then wait until the link fails.

        redis-py connects (TLS, AUTH, SELECT); then the transport's protocol is replaced by
        ``RespProtocol``, which parses each reply as it arrives and hands it to its request's
        callback right there, without waking a reader task first.
        """
        conn: redis.asyncio.Connection = self._pool.make_connection()  # type: ignore[no-untyped-call]
        up_at = None  # when it was set up
        protocol: RespProtocol | None = None
        try:
            protocol, lost = await self._connect(conn)
            if self._task is not asyncio.current_task():
                # Given up (reset, closed) just as the connection came up. Never take the
                # channel over from the connection that replaced this one.
                raise asyncio.CancelledError
            self._conn = conn
            self.ready = True
            self.ups += 1
            now = time.monotonic()
            for command, on_reply in self._unsent:
                self._write(self.scripts.packed(command))
                sent = _UNSENT if self._outbox else now
                self._pending.extend((c, sent) for c in _callbacks(command, on_reply))
            self._unsent.clear()
            self._reconnect.succeeded()
            self.last = None
            self._changed.set()
            up_at = now
            raise await lost
        except asyncio.CancelledError:
            if self._task is asyncio.current_task():
                # Cancelled from outside (a shutdown that cancels every task, as
                # ``asyncio.run`` does when its main task fails): nothing detached the
                # channel from this task, so it would keep a closed connection and fail
                # every later write. Its requests fail as on a lost connection; the next
                # one connects again at once, since the node itself did nothing wrong.
                # But first one turn of the loop: the tasks cancelled with this one
                # write their cleanups in it (a lease's release as its ``async with``
                # unwinds), and they go out on this connection, still open, with what
                # this turn wrote before; their replies are read for up to DRAIN
                # seconds, lest releases that reached the nodes be told lost. Detached
                # at once, the channel dropped them, or sent them on a new connection
                # that nobody waited for, in a loop about to close.
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(0)
                    if self._task is asyncio.current_task():
                        self._flush(self._conn)
                        if self._pending:
                            self._idle = asyncio.Event()
                            with contextlib.suppress(TimeoutError):
                                await within(self._idle.wait(), DRAIN)
                if self._task is asyncio.current_task():
                    self._flush(self._conn)
                    self._detach(ConnectionError("its connection task was cancelled"))
            # Otherwise whoever cancelled us (reset, close) already failed our requests;
            # the channel may own a new connection by now, so touch nothing but our own.
            await conn.disconnect(
                nowait=True
            )  # our protocol replaced the stream's: no wait_closed()
            raise
        except Exception as raised:
            # A node at its connection limit ended it with its refusal (``_deliver``),
            # not with the bare close that followed.
            exc = raised if self._refusal is None else self._refusal
            if protocol is None or not protocol.heard:
                # Closed before the node's first reply (in the set-up, or at the first
                # command): the TLS port it may be is named. Other failures keep their
                # class, which the rounds look at.
                why = diagnose(exc)
                said = before_first_reply(why, exc, self.address.login_form)
                if said is not why:
                    exc = Diagnosed(said)
            if self._task is asyncio.current_task():
                if (
                    up_at is not None
                    and time.monotonic() - up_at >= SERVED
                    and not self._pending
                    and not self._unsent
                ):
                    # Closed by the node while unused, after serving a while (its idle
                    # timeout, a restart): no fault to back off from; the next request
                    # connects again at once. (One closed as soon as it came up, as by a
                    # proxy whose server is gone, is a failure like any other.)
                    self._detach(exc)
                else:
                    self._reset(exc, time.monotonic(), from_task=True)
            await conn.disconnect(
                nowait=True
            )  # our protocol replaced the stream's: no wait_closed()

    async def _connect(
        self, conn: redis.asyncio.Connection
    ) -> tuple[RespProtocol, asyncio.Future[BaseException]]:
        """redis-py's set-up of ``conn`` (TCP, TLS, AUTH, SELECT), within the connect
        timeout, then ``RespProtocol`` in place of redis-py's stream; returns it and the
        future it sets when the connection ends.

        redis-py bounds the TCP connect and TLS handshake by the connect timeout, but not
        AUTH/SELECT (the async driver has no socket timeout), so all are bounded here. A
        bound that ran out while this client's own event loop was too busy to run the
        set-up (its timer ran late: the loop was blocked by other work, and what the
        node sent meanwhile waits unread) is not the node's silence: the set-up goes on
        for another connect timeout, up to ``MAX_GRACES`` times, as a round's deadline
        is pushed back. Without it, a loop blocked for longer than the connect timeout
        while its first connections came up called every healthy node unreachable.

        Raises:
            Diagnosed: not set up in time (over TLS, with the likely cause: see
                ``diagnosis.not_connected_in_time``).
            Exception: what the set-up raised.
        """
        loop = asyncio.get_running_loop()
        # redis-py's own bound on the TCP connect runs on the same late timer: it is
        # only the backstop here, the whole of what the graces may give.
        bound_tcp_connect(conn, self._connect_timeout * (MAX_GRACES + 1))

        probing = False  # the handshake is done, and the probe's PING sent

        async def set_up() -> tuple[RespProtocol, asyncio.Future[BaseException]]:
            nonlocal probing
            await conn.connect()  # type: ignore[no-untyped-call]
            if self._reconnect.probe:
                # The node's last connection was given up as stalled: this one is used
                # once the node answered a PING on it, an error too (an ACL user may not
                # be granted PING, and saying so is an answer): ``_core.backoff``.
                probing = True
                await conn.send_packed_command(PING, check_health=False)
                with contextlib.suppress(ResponseError):
                    await conn.read_response()
            # Our protocol in the very step that set the connection up: what the node
            # sends a turn later (an error and its close, from a node at its connection
            # limit) must reach it, not redis-py's stream, which nobody reads any more.
            lost: asyncio.Future[BaseException] = loop.create_future()
            protocol = RespProtocol(self._deliver, lost)
            self._refusal = None
            conn._writer.transport.set_protocol(protocol)  # type: ignore[union-attr]
            return protocol, lost

        setup = loop.create_task(set_up())
        try:
            graces = 0
            while True:
                due = loop.time() + self._connect_timeout
                await asyncio.wait((setup,), timeout=self._connect_timeout)
                if setup.done():
                    return setup.result()
                if graces >= MAX_GRACES or loop.time() - due < self._connect_timeout * LATE:
                    raise Diagnosed(
                        silent_since_stall(self._connect_timeout)
                        if probing
                        else not_connected_in_time(self.address, self._connect_timeout)
                    )
                graces += 1
        finally:
            # Given up (timed out, or this task cancelled): the set-up ends before the
            # caller disconnects what it may have opened.
            await finish((setup,))

    def _deliver(self, value: object) -> None:
        reply: Reply = (
            (False, ResponseError(value.message))
            if isinstance(value, ErrorReply)
            else (True, value)
        )
        if self._pending:
            self._pending.popleft()[0](self.node, reply)
            if self._idle is not None and not self._pending and not self._unsent:
                self._idle.set()
        elif isinstance(reply[1], ResponseError) and refuses_connection(str(reply[1])):
            # A node at its connection limit (or in protected mode) says so as soon as it
            # takes the connection, and closes it: before our first request, it answers
            # nothing of ours, but it is why the connection ends (``_run``), not a bare
            # close.
            self._refusal = reply[1]

    def _fail_all(self, exc: BaseException) -> None:
        waiting = [f for f, _ in self._pending]
        waiting += [c for command, f in self._unsent for c in _callbacks(command, f)]
        self._pending.clear()
        self._unsent.clear()
        for on_reply in waiting:
            on_reply(self.node, (False, exc))

    def drop(self, exc: Exception) -> None:
        """Start over after a back-off: a reply made no sense (not Redis), or the node
        refused for its configuration (it would again; see ``_sync.links.Link.fail``)."""
        self._reset(exc, time.monotonic())

    def diagnose(self, exc: Exception) -> Diagnosis:
        """``exc`` as this node's failure: a Sentinel node's ``READONLY`` is its master
        demoted, so the channel is dropped and silent until it finds the new one. Advice to
        give a password in the URL shows this node's kind of URL (``unix://``...)."""
        why = in_url_form(diagnose(exc), self.address.login_form)
        return why if self.address.sentinel is None else demoted(why)

    def _reset(
        self,
        exc: BaseException,
        now: float,
        *,
        from_task: bool = False,
        close: bool = True,
        stalled: bool = False,
    ) -> None:
        if isinstance(exc, Exception):
            self.last = self.diagnose(exc)
        self._reconnect.failed(now, stalled=stalled)
        task = self._detach(exc)
        if task is not None and not from_task:
            self._retire(task, close=close)

    def _let_go(self, command: Command, now: float) -> None:
        """Give up the connection as stalled (``STALL``) before ``command`` is written:
        its requests fail, and the node sits out a back-off. But it is not closed yet.

        A frozen node that wakes runs what was written to it, in order, the grants
        included; closed, a connection loses all but its first few commands (a node
        that finds it closed stops reading it), the releases behind those grants with
        them. So it stays open until the node has answered everything written to it
        (a script behind the rest marks the end) or for ``LINGER`` seconds, its
        replies read and dropped. And ``command``, if it is a release (``Command.undo``:
        a cancelled acquire's cleanup, say, whose grant went out on this connection),
        is written on it first, by EVAL (a NOSCRIPT would go unheard): on a new
        connection it could run before that grant and leave the key for a whole TTL.
        Commands of this turn not yet written (``_outbox``) are dropped, as they fail.
        """
        writer = None if self._conn is None or self._task is None else self._conn._writer
        if writer is not None:  # (else not connected: nothing was written)
            if command.undo:
                write(writer.transport, command.fallback or command.packed)
            write(writer.transport, _LET_GO)
            protocol = writer.transport.get_protocol()
            assert isinstance(protocol, RespProtocol)
            protocol.let_go(writer.transport, _LET_GO_REPLY, LINGER)
        self._reset(
            ConnectionError(f"no reply for {STALL}s"), now, close=writer is None, stalled=True
        )

    def shed_if_closed(self) -> bool:
        """Let go of the connection if the node closed it while nothing was pending: its
        end (or bytes out of turn) waits unread in the socket, never an answer. Returns
        True when replies to earlier requests wait unread instead (their rounds were
        decided without them, and the loop has not run since): the loop must read them
        before the end behind them, if any, can be seen."""
        if self._conn is None or self._nothing_to_read():
            return False
        if self._pending:
            return True
        task = self._detach(ConnectionError("closed by the node while unused"))
        if task is not None:
            self._retire(task)
        return False

    def _retire(self, task: asyncio.Task[None], *, close: bool = True) -> None:
        """Cancel the task of a connection given up (``close``; else it ends when its
        connection does); ``close`` (the channel's) waits for it to end."""
        if close:
            task.cancel()
        self._retired.add(task)
        task.add_done_callback(self._retired.discard)

    def _detach(self, exc: BaseException) -> asyncio.Task[None] | None:
        """Fail every request with ``exc`` and let go of the connection and its task
        (returned, for the caller to cancel if it is not that task)."""
        self._fail_all(exc)
        self._outbox = []  # their requests just failed: never to reach a later connection
        self._batches.clear()
        task, self._task = self._task, None
        self._conn = None
        self.ready = False
        self._changed.set()  # a round waiting for this channel's set-up looks again
        return task

    async def close(self, grace: float) -> None:
        """Close, first giving requests already made up to ``grace`` seconds to be answered.

        A release written just before ``aclose()`` (or queued while connecting) must reach
        its node, or the key would stay until its TTL.
        """
        if self._pending or self._unsent:
            self._idle = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await within(self._idle.wait(), grace)
        self._fail_all(ConnectionError("client closed"))
        task, self._task = self._task, None
        self._conn = None
        self.ready = False
        self._changed.set()
        await finish([*self._retired] if task is None else [*self._retired, task])


# Turns of the event loop a round gives it to read the replies owed on connections left
# unused (``Channels.run``): the replies, then the end of the stream behind them, are
# each a turn's reading; the rest is margin.
_LOOKS = 5


def _shed_closed(channels: list[Channel]) -> bool:
    """Let go of the connections of ``channels`` their nodes closed while unused
    (``Channel.shed_if_closed``, every one looked at); True while owed replies still
    wait unread on any of them."""
    behind = False
    for channel in channels:
        if channel.ready and channel.shed_if_closed():
            behind = True
    return behind


class _Wait:
    """One round's wait for its replies (``Channels.run``): the callbacks its replies
    and its deadline call, on one object rather than a closure each (a round is made per
    attempt, on the hot path)."""

    __slots__ = (
        "budget",
        "channels",
        "command",
        "done",
        "graces",
        "heard_out",
        "loop",
        "order",
        "owner",
        "parts",
        "rnd",
        "timer",
    )

    def __init__(
        self,
        owner: Channels,
        channels: list[Channel],
        command: Command,
        rnd: Round,
        order: Sequence[int],
    ) -> None:
        self.owner = owner
        self.channels = channels
        self.command = command
        self.rnd = rnd
        self.order = order
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future[None] = self.loop.create_future()
        self.budget = 0.0  # seconds from the moment the requests went out
        self.graces = 0
        self.timer: Deadline | None = None  # the deadline (or its latest grace)
        self.heard_out: asyncio.TimerHandle | None = None
        self.parts: dict[int, list[Any]] = {}  # replies so far of a command that has several

    def settle(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def on_reply(self, i: int, reply: Reply) -> None:
        ok, value = reply
        rnd, command, channels = self.rnd, self.command, self.channels
        if self.done.done() or rnd.results[i] is not None:
            # The round, or this node's part in it, is over: dropped, but for what it
            # says of the node's scripts (a late NOSCRIPT) and of its configuration. A
            # release sent by EVALSHA goes again by EVAL: its work must reach the node.
            # And for what it says of the node: it answers (the rounds waiting on it now
            # wait behind this request).
            channels[i].answered_at = time.monotonic()
            if isinstance(value, ResponseError):
                late = command if command.resend_late else None
                text = str(value)
                retry = channels[i].scripts.answered(text, late)
                if retry is not None:
                    with contextlib.suppress(BackingOff):  # reset meanwhile: as if lost
                        channels[i].send(retry, _ignore)
                if not about_scripts(text):
                    self.owner.reporter.late(i, channels[i].diagnose(value))
            return
        if ok and command.replies > 1:
            got = self.parts.setdefault(i, [])
            got.append(value)
            if len(got) < command.replies:
                return
            value = got
        if ok:
            try:
                answer = command.parse(value)
            except Exception as exc:  # a reply of the wrong shape: not Redis speaking
                # Said as the blocking driver says it (``Link.fail``), and dropped with
                # the parser's words, not the diagnosis (which would be diagnosed again).
                garbled = NotRedis(str(exc) or type(exc).__name__)
                why = diagnose(garbled)
                rnd.fail(i, why.failure, why.detail)
                self.owner._current()[i].drop(garbled)
            else:
                rnd.record(i, *answer)
        elif (
            isinstance(value, ResponseError)
            and command.replies == 1
            # Our parser keeps the reply's code in the text, as the node sent it.
            and (retry := channels[i].scripts.answered(str(value), command)) is not None
        ):
            # The EVAL form of an EVALSHA the node could not run, behind anything
            # written since; its reply comes back here.
            try:
                channels[i].send(retry, self.on_reply)
            except BackingOff as exc:  # it stalled meanwhile, and was reset
                rnd.fail(i, exc.failure, exc.detail)
            else:
                self._wait_for_resent()
                return
        else:
            # The error reply, or whatever ended the connection first.
            why = (
                channels[i].diagnose(value)
                if isinstance(value, Exception)
                else Diagnosis(Failure.UNREACHABLE, type(value).__name__)
            )
            rnd.fail(i, why.failure, why.detail)
            if isinstance(value, ResponseError) and reply_ends_link(why):
                self.owner._current()[i].drop(value)
        if rnd.decided:
            self.settle()
        elif rnd.hear_out and rnd.impossible and self.heard_out is None:
            # A failed round heard out (see ``Round``): for a little longer only.
            self.heard_out = self.loop.call_later(rnd.hear_out, self.settle)

    def _wait_for_resent(self) -> None:
        """A node answered and asked for the command again (the EVAL form after
        NOSCRIPT): the round waits a node timeout for that from now, as for any request
        (a node that is alive is not silent for our second one). Validity still counts
        from the round's start."""
        timer = self.timer
        if timer is None or self.done.done():
            return  # not armed yet: the whole budget is still ahead
        due = self.loop.time() + self.owner._config.node_timeout
        if due > timer.when:
            self.owner._deadlines.cancel(timer)
            self.timer = self.owner._deadlines.add(due, self.expire)

    def arm(self) -> None:
        if not self.done.done():
            self.timer = self.owner._deadlines.add(self.loop.time() + self.budget, self.expire)

    def expire(self, due: float) -> None:
        if self.done.done() or self.graces >= MAX_GRACES:
            self.settle()
            return
        results, channels = self.rnd.results, self.channels
        silent = [i for i in self.order if results[i] is None]
        # The deadline of a client too busy to have given the nodes their time: its
        # event loop ran the timer late (blocked by other work), or the request still
        # sits in its own send buffer. Once more, up to MAX_GRACES times; a node that is
        # really silent is a timeout a little later.
        if self.loop.time() - due > self.budget or any(channels[i].backlogged for i in silent):
            self.graces += 1
            self.arm()
        elif any(channels[i].unread for i in silent):
            # Replies that came while this turn of the loop ran other callbacks (the
            # loop looked at its sockets before them): they are not silence. The loop
            # reads them first in its next turn, before this looks again.
            self.graces += 1
            self.timer = self.owner._deadlines.add(self.loop.time(), self.expire)
        else:
            self.settle()

    def end(self) -> None:
        """The round is over: drop its timers; replies still to come are dropped."""
        if self.timer is not None:
            self.owner._deadlines.cancel(self.timer)
        if self.heard_out is not None:
            self.heard_out.cancel()
        self.settle()


class Channels:
    """One channel per node, bound to the event loop that first used them."""

    def __init__(
        self,
        config: ClientConfig,
        connection_options: dict[str, Any],
        reporter: NodeReporter,
    ) -> None:
        self._config = config
        self.reporter = reporter

        self._options = connection_options
        # A Redis Cluster node's pool is its first seed's (the notification listener's).
        self._pools: list[redis.asyncio.ConnectionPool] = [
            node_pool(
                a.member(*a.seeds[0]) if a.seeds else a, config, connection_options, asyncio=True
            )
            for a in config.nodes
        ]
        self.pools = self._pools  # the notification listener connects through them too
        # Closed with the client: a flow still running then (the release after a failed
        # extension, an attempt's cleanup) must not open connections nobody would close.
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._channels: list[Channel] = []
        self._deadlines: Deadlines  # the running loop's (made with its channels)
        # The running loop's timers of watched leases (``Watchdog``), apart from the
        # rounds': closing the channels ends every round, but not the leases' watch.
        self._watches: Deadlines
        self._to_arm: list[_Wait] = []  # rounds whose wait begins after this turn's flush
        # Rounds awaiting their replies now: while any is, the loop is running and reads
        # every connection as data comes (``run``'s idle look is for a loop that was not).
        self._awaited = 0
        self._changed = asyncio.Event()  # a channel's set-up ended

    def serves_another_loop(self) -> bool:
        """Whether the channels belong to another event loop that is running now: one
        of another thread (a thread runs one loop at a time). ``_current`` would take
        them from under it."""
        loop = self._loop
        return loop is not None and loop is not asyncio.get_running_loop() and loop.is_running()

    def _current(self) -> list[Channel]:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            # Connections belong to the loop that made them; a new loop gets new ones.
            self._loop = loop
            self._deadlines = Deadlines(loop)
            self._watches = Deadlines(loop)
            self._to_arm = []
            self._awaited = 0  # (a round of a loop that ended may never count itself out)
            self._changed = asyncio.Event()
            connect_timeout = self._config.connect_timeout
            self._channels = [
                self._cluster(a, i)
                if a.seeds
                else Channel(a, p, connect_timeout, self._changed, node=i, batching=True)
                for i, (a, p) in enumerate(zip(self._config.nodes, self._pools, strict=True))
            ]
        return self._channels

    def watches(self) -> Deadlines:
        """The running loop's deadlines for watched leases (``Watchdog``)."""
        self._current()
        return self._watches

    def _cluster(self, address: NodeAddress, node: int) -> Channel:
        from .cluster import ClusterChannel  # it builds on this module

        config, options, changed = self._config, self._options, self._changed

        def pool(a: NodeAddress) -> redis.asyncio.ConnectionPool:
            made: redis.asyncio.ConnectionPool = node_pool(a, config, options, asyncio=True)
            return made

        def channel(a: NodeAddress) -> Channel:
            return Channel(a, pool(a), config.connect_timeout, changed, node=node)

        cluster = ClusterChannel(address, channel, pool, config.connect_timeout, changed, node)
        return cast("Channel", cluster)  # it stands for a Channel: the same attributes

    def send(
        self,
        command: Command,
        rnd: Round,
        targets: Sequence[int] | None = None,
        on_reply: OnReply = _ignore,
    ) -> None:
        """Write ``command`` to ``targets`` now; failures to even send go into ``rnd``.
        ``on_reply`` is called with each node's place and reply."""
        if self._closed:
            self._refuse(rnd, targets)
            return
        channels = self._current()
        for i in range(len(channels)) if targets is None else targets:
            try:
                channels[i].send(command, on_reply)
            except BackingOff as exc:
                rnd.fail(i, exc.failure, exc.detail)

    async def run(
        self,
        command: Command,
        rnd: Round,
        deadline: float,
        targets: Sequence[int] | None = None,
        *,
        hopeless_unsent: bool = False,
        begin_by: float | None = None,
    ) -> None:
        """Send to ``targets`` (default: all); return when ``rnd`` is decided or at ``deadline``.

        Channels without a connection are set up first (``_set_up``), and then the round,
        ``deadline`` included, begins again from that moment.
        ``hopeless_unsent``: as for the blocking driver's ``LinkSet.run``, send nothing if
        the nodes in their reconnect back-off (or whose set-up failed) already make the
        round impossible. ``begin_by``: send nothing if the set-ups end only then or
        later (``flows.Run``).
        """
        if self._closed:
            self._refuse(rnd, targets)
            return
        channels = self._current()
        order: Sequence[int] = range(len(channels)) if targets is None else targets
        unready = False
        now = time.monotonic()
        unused: list[Channel] | None = None
        # No look while other rounds await replies: a loop serving hundreds of tasks
        # takes longer than IDLE_LOOK per turn, and would otherwise look (and give up
        # turns) at the start of nearly every wave of rounds, for ends it reads anyway.
        look = self._awaited <= 0
        for i in order:  # a loop, not all() over a generator: it runs in every round
            channel = channels[i]
            if not channel.ready:
                unready = True
            elif look and now - channel.used_at >= IDLE_LOOK:
                if unused is None:
                    unused = []  # (only then: a list per round is a cost on the hot path)
                unused.append(channel)
        if unused is not None:
            # Unused for a while: the node may have closed a connection meanwhile, its
            # end unread if the loop did not run (``_core.backoff``). Replies still owed
            # are read first, by the loop, within a few turns.
            turns = 0
            while turns < _LOOKS and _shed_closed(unused):
                turns += 1
                await asyncio.sleep(0)
            if turns:
                # The turns given to the loop (which may have run anything meanwhile)
                # are no part of the round: it begins when its requests go out.
                deadline += rnd.begin_at(time.monotonic())
            unready = unready or not all(c.ready for c in unused)
        if unready:
            # (A channel that is connected is in no back-off: with every one connected,
            # as nearly always, there is nothing to rule out and nothing to set up.)
            if hopeless_unsent:
                asked = rule_out(
                    rnd, order, lambda i: (channels[i].backing_off(now), channels[i].last)
                )
                if asked is None:
                    self.reporter.round(rnd)
                    return
                targets = order = asked
            if not all(channels[i].ready for i in order):
                await self._set_up(channels, order, rnd)
                if hopeless_unsent and rnd.impossible:
                    self.reporter.round(rnd)
                    return
                deadline += rnd.begin_at(time.monotonic())
                if rnd.began_too_late(begin_by, order):
                    self.reporter.round(rnd)
                    return
        wait = _Wait(self, channels, command, rnd, order)
        self.send(command, rnd, targets, wait.on_reply)
        if not rnd.decided:
            # The wait begins once the requests went out: time this task was held up
            # before it wrote them (a GC pause, a starved process) is the client's own,
            # not the nodes' (validity still counts from the round's start).
            wait.budget = max(deadline - min(rnd.started, time.monotonic()), 0)
            batched = False
            for i in order:
                if channels[i].batched:
                    batched = True
                    break
            if batched:
                # Written into this turn's batch: the wait for replies begins once the
                # batch went out, not while the loop was still busy with other tasks: a
                # client too busy to send is not a node too slow to answer.
                self._arm_after_flush(wait)
            else:
                wait.arm()
            self._awaited += 1
            try:
                await wait.done
            finally:
                self._awaited -= 1
                wait.end()
        else:
            wait.settle()
        rnd.stop_hearing()
        if not rnd.decided:
            for i, got in wait.parts.items():
                # A node that answered the command but not yet all of it (a WAIT still
                # blocked in Redis) is judged on what came: it is not silent.
                try:
                    rnd.record(i, *command.parse(got))
                except Exception as exc:  # a reply of the wrong shape: not Redis speaking
                    why = diagnose(NotRedis(str(exc) or type(exc).__name__))
                    rnd.fail(i, why.failure, why.detail)
            for i in order:
                if rnd.results[i] is None and channels[i].connecting:
                    # Not CONNECTING ("not asked"): the request is queued, and goes out
                    # (its cleanup behind it) once the connection is up. Silent, like a
                    # node that did not answer: it may be up, its set-up only slow.
                    rnd.went_silent(i, "not connected yet; sent once it is", connecting=True)
            rnd.time_out([channel.answered_at for channel in channels])
        self.reporter.round(rnd)

    def _arm_after_flush(self, wait: _Wait) -> None:
        # One callback per turn of the loop arms every round written into that turn's
        # batches, not one per round (a ``call_soon`` costs the loop a handle and about
        # six calls of Python: 1.9% of a cycle's instructions at 16 tasks on 5 nodes).
        # It was scheduled after the flushes of the turn's first round, so it runs
        # after them.
        to_arm = self._to_arm
        if not to_arm:
            wait.loop.call_soon(self._arm_all)
        to_arm.append(wait)

    def _arm_all(self) -> None:
        waits, self._to_arm = self._to_arm, []
        for wait in waits:
            wait.arm()

    async def _set_up(self, channels: list[Channel], order: Sequence[int], rnd: Round) -> None:
        """Connect the channels of ``order`` that have no connection, all at once, and
        wait until the round may begin (``Round.set_up_wait``).

        Nodes that cannot be asked are recorded in ``rnd`` (back-off, failed set-up);
        those still connecting are not: their request waits in the channel's queue.
        """
        now = time.monotonic()
        waiting: list[int] = []
        fresh: set[int] = set()  # set-ups this round started
        for i in order:
            channel = channels[i]
            if rnd.results[i] is not None or channel.ready:
                continue  # a cleanup's bystander is not waited for
            if not channel.connecting:
                fresh.add(i)
            try:
                channel.connect(now)
            except BackingOff as exc:
                rnd.fail(i, exc.failure, exc.detail)
            else:
                if channel.probing:
                    why = being_probed()  # not waited for: ``_core.backoff``
                    rnd.fail(i, why.failure, why.detail)
                else:
                    waiting.append(i)
        changed = self._changed
        while True:
            changed.clear()  # before looking, so that a set-up ending meanwhile is not missed
            still: list[int] = []
            for i in waiting:
                channel = channels[i]
                if channel.connecting:
                    still.append(i)
                elif not channel.ready:
                    # Its set-up failed: why, as diagnosed when the channel was reset.
                    why = channel.last or Diagnosis(Failure.UNREACHABLE, "connection lost")
                    rnd.fail(i, why.failure, why.detail)
            waiting = still
            ready = sum(1 for i in order if rnd.results[i] is None and channels[i].ready)
            wait = rnd.set_up_wait(
                ready,
                len(waiting),
                len(fresh.intersection(waiting)),
                time.monotonic(),
                self._config.node_timeout,
            )
            if wait == 0.0:
                return
            # Every set-up ends within the connect timeout (Channel._run), so without a
            # wait of the round's own this ends too.
            with contextlib.suppress(TimeoutError):
                await within(changed.wait(), wait)

    def _refuse(self, rnd: Round, targets: Sequence[int] | None) -> None:
        """Fail ``targets`` in ``rnd``: the client was closed, and nothing is sent."""
        for i in range(len(self._pools)) if targets is None else targets:
            rnd.fail(i, Failure.UNREACHABLE, "the client was closed")  # (if not answered)

    async def close(self) -> None:
        self._closed = True
        channels, self._channels = self._channels, []
        if self._loop is not None:
            self._deadlines.close()
        self._loop = None
        await asyncio.gather(*(c.close(self._config.node_timeout) for c in channels))
        for pool in self._pools:
            await pool.disconnect()

"""Multiplexed rounds over plain redis-py connections, in the calling thread.

Theory of operation
-------------------
A round writes one command to every node's connection, then waits on all the sockets at
once with ``select`` under one deadline, reading each reply as it arrives and feeding it
to the core's ``Round``. It stops the moment the round is decided. No thread per request,
no thread per node: the cost is one round trip to the slowest node *needed*.

A node that has not answered when the round ends (frozen, slow) keeps its request on the
wire. We do not close the connection, which would lose the ordering guarantee below;
instead the link remembers that it *owes* one reply and discards it before reading the
next. Later commands (the release) are pipelined behind the unanswered one on the same
connection, and Redis executes one connection's commands in order, so a late ``SET NX``
that lands when the node wakes up is always followed by its own release. What the
socket cannot take (a frozen node stops reading, and a unix socket's buffer holds only
some 170 commands) waits in the link, written before anything after it (or as soon as the
socket takes more, by the ``flusher``, if the link's next round comes later), rather than
end the connection: a node runs the first of the commands a closed connection left in its
buffer, fails to answer them, and drops the rest, releases behind their grants
included. A link that heard nothing for ``STALL`` seconds is given up when the next
command comes for it, a release written on it first (``Link._let_go``), and the node left
alone for a back-off period, so a dead node costs nothing per round; its connection is
shut for writing and read to its end by the process's lingering thread, so that the
node, once awake, still runs all it carries (``Link._linger``, ``lingering``).

A link without a connection is set up before the round begins, not inside it: every such
node is connected at once, each in a thread of its own (``SetUp``, bounded by
``connect_timeout``), and the round begins when the set-ups ended, or once the ready
links could decide it and a short grace has passed (``Round.set_up_wait``). Its clock
starts then (``Round.begin_at``), so a slow TLS handshake is never charged to
``node_timeout``, and a node whose set-up hangs costs at most that grace to a round the
others can decide: it sits that round out (``Failure.CONNECTING``) while its set-up
goes on for the next.

Links are grouped in sets (one link per node) that one operation uses at a time; a pool
of sets lets many threads lock at once. After ``fork()`` the child drops the parent's
sets (without closing the parent's sockets) and opens its own. A round on a set left
unused for ``IDLE_LOOK`` seconds first drops the connections the nodes closed
meanwhile (``Link.shed_if_closed``), and sets them up again like any others, rather than
finding their end in its replies (``_core.backoff``).
"""

from __future__ import annotations

import contextlib
import os
import socket
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NoReturn

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .._core.backoff import IDLE_LOOK, LINGER, STALL, Reconnect
from .._core.commands import Command, ScriptCache, about_scripts
from .._core.config import ClientConfig, NodeAddress
from .._core.diagnosis import (
    BackingOff,
    Diagnosis,
    being_probed,
    in_url_form,
    not_connected_in_time,
    reply_ends_link,
    rule_out,
    silent_since_stall,
)
from .._core.quorum import NEVER, Failure, Round
from .._core.sentinel import demoted
from .._driver.clock import monotonic
from .._driver.events import Event
from .._driver.guard import Guard
from .._driver.ready import readable
from .._driver.redis_compat import (
    SocketReplies,
    before_first_reply,
    closed_by_peer,
    diagnose,
    disconnect,
    has_unread,
    node_pool,
    own_connection,
    reply_text,
    timed_out,
)
from .._driver.report import NodeReporter
from .._driver.threads import start_thread
from .connect import SetUp
from .flusher import hand_over
from .lingering import linger, read_on

__all__ = ["LinkPool", "LinkSet", "NodeState", "let_go"]

_NETWORK_ERRORS = (RedisConnectionError, RedisTimeoutError, OSError)


class NodeState:
    """What all links to one node share: its address and when to try connecting again."""

    def __init__(
        self,
        address: NodeAddress,
        pool: redis.ConnectionPool,
        timeout: float,
        connect_timeout: float,
    ) -> None:
        self.address = address
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.name = address.display
        self._factory = pool
        self._lock = Guard()
        self._reconnect = Reconnect()
        # Why it was last dropped: a node in its back-off for a configuration failure is
        # reported with that failure, not as merely "backing off".
        self.last: Diagnosis | None = None
        self.scripts = ScriptCache()  # what its answers to EVALSHA told us

    def new_connection(self) -> redis.Connection:
        # The pool is only our parsed URL and settings (``own_connection``).
        conn = own_connection(self._factory)
        assert isinstance(conn, redis.connection.AbstractConnection)
        return conn  # type: ignore[return-value]  # a Connection or UnixDomainSocketConnection

    def diagnose(self, exc: Exception) -> Diagnosis:
        """``exc`` as this node's failure: a Sentinel node's ``READONLY`` is its master
        demoted, so the node is dropped and silent until it finds the new one. Advice to
        give a password in the URL shows this node's kind of URL (``unix://``...)."""
        why = in_url_form(diagnose(exc), self.address.login_form)
        return why if self.address.sentinel is None else demoted(why)

    def new_link(self) -> Link:
        return Link(self)

    def down(self, now: float, why: Diagnosis | None = None, *, stalled: bool = False) -> None:
        """A connection failed (``stalled``: was given up, having heard nothing for
        ``STALL`` seconds): start or lengthen the back-off."""
        with self._lock:
            self._reconnect.failed(now, stalled=stalled)
            self.last = why

    @property
    def probe(self) -> bool:
        """Must a new connection hear the node answer a PING before it is used?"""
        return self._reconnect.probe

    def up(self) -> None:
        """The node accepted a connection: reset the back-off."""
        with self._lock:
            self._reconnect.succeeded()

    def backing_off(self, now: float) -> float:
        """Seconds left of the node's reconnect back-off (0: connect now)."""
        return self._reconnect.left(now)


class _Failed(Exception):
    """Writing to the node failed; already diagnosed."""

    def __init__(self, why: Diagnosis) -> None:
        super().__init__(why.detail)
        self.diagnosis = why


class Link:
    """One connection to one node, used by one operation at a time."""

    __slots__ = (
        "answered_at",
        "conn",
        "cut",
        "heard",
        "io",
        "late",
        "node",
        "owed",
        "owed_read",
        "owed_releases",
        "partial",
        "quiet_since",
        "resends",
        "setup",
        "unsent",
        "writing",
    )

    def __init__(self, node: NodeState) -> None:
        self.node = node
        self.late: ResponseError | None = None  # an owed reply's error, to be told
        self.conn: redis.Connection | None = None
        # The connection's socket, written and read here (``SocketReplies``), once set up.
        self.io: SocketReplies | None = None
        self.setup: SetUp | None = None  # the connection being set up, while conn is None
        self.owed = 0  # replies of abandoned requests, read and dropped before ours
        # How many owed replies were read: with ``owed``, it numbers each owed reply.
        self.owed_read = 0
        # When an owed reply was last read: the node's silence in a round under way since
        # is that of a node behind (``Round.time_out``).
        self.answered_at = NEVER
        # The releases by EVALSHA among the owed requests, by the number of their reply:
        # one answered NOSCRIPT is sent again by EVAL (``Command.resend_late``), once the
        # round that read it has read or owed its own replies (``LinkSet``).
        self.owed_releases: deque[tuple[int, Command]] = deque()
        self.resends: list[Command] = []
        self.partial: list[Any] = []  # replies so far of a command that has several
        # Since when it has owed replies of abandoned requests and heard none
        # (``abandon``), 0.0 while it owes none; ``heard``: an owed reply was read since
        # the last look. (A Cluster node's ASKING owes a reply too, but starts no quiet
        # spell: it is answered before the request behind it.)
        self.quiet_since = 0.0
        self.heard = False
        # What the socket could not take yet (``_write_now``), oldest first; written by
        # whoever comes first, the link's next round or the flusher (``flusher``), in
        # turn under ``writing`` while anything waits here.
        self.unsent: list[bytes] = []
        self.writing = Guard()
        # A write is under way: an interrupt now may leave part of a command on the wire.
        self.cut = False

    def send(self, command: Command, now: float) -> Any:
        """Write ``command`` on the connection (set up beforehand: ``prepare``); returns
        the socket it was written to, where its reply will come (``socket``).

        Raises:
            _Failed: writing failed; the link is dropped.
        """
        io = self.io
        assert io is not None  # set up by LinkSet._set_up
        if self.quiet_since and self._stalled(now):
            self._let_go(command, now)
        try:
            # Only a script sent by EVALSHA has another form (``ScriptCache``).
            sock = io.sock
            if not command.by_sha or self.node.scripts.as_packed:
                data = command.packed
            else:
                data = self.node.scripts.packed(command)
            # ``_put``, inline: a call per node and round cost 0.7% of a cycle's instructions.
            if io.plain:
                self._write_now(sock, data)
            else:
                self.cut = True
                sock.sendall(data)  # TLS: a TCP buffer, which holds far more than STALL's worth
                self.cut = False
        except Exception as exc:  # not BaseException: an interrupt is no node's failure
            why = diagnose(exc)
            self.drop(now, why)
            raise _Failed(why) from exc
        except BaseException:
            # Interrupted (Ctrl-C). Mid-write, part of the command may be on its way: the
            # connection is closed, so the node drops that part unrun, and nothing
            # written behind it (a cleanup) can be read as the rest of it. No back-off:
            # the node did nothing wrong. Before the write, or after it, the stream is
            # whole, and the connection stays for the cleanup written behind
            # (``LinkSet.write_behind``): an interrupted release that closed it left the
            # lock to its TTL.
            if self.cut:
                self.close()
            raise
        return sock

    def send_behind(self, command: Command, now: float) -> None:
        """Write ``command`` behind an interrupted round, whose replies nobody reads any
        more (``LinkSet.write_behind``): a plain node's connection runs it after that
        round's request. (A Cluster node's link also has its answer read, and its
        redirections followed, once the set is closed: ``ClusterLink.send_behind``.)

        Raises:
            _Failed: as ``send``.
        """
        self.send(command, now)

    def _put(self, io: SocketReplies, data: bytes) -> None:
        """Write ``data`` as ``send`` does."""
        if io.plain:
            self._write_now(io.sock, data)
        else:
            self.cut = True
            io.sock.sendall(data)
            self.cut = False

    def _stalled(self, now: float) -> bool:
        """Owed replies for ``STALL`` seconds, and heard none (``abandon``)."""
        return (
            self.owed > 0
            and not self.heard
            and now - self.quiet_since > STALL
            and not self._unread()
        )

    def _let_go(self, command: Command, now: float) -> NoReturn:
        """Give up the connection as stalled before ``command`` is written: it has owed
        replies for ``STALL`` seconds and heard none (a frozen or cut-off node). The
        node sits out a back-off, and the link lets go of the connection.

        A release (``Command.undo``: a failed attempt's cleanup, say, whose grant went
        out on this connection) is first written on it, behind that grant, by EVAL (a
        NOSCRIPT would go unheard): on a new connection the release could run before the
        grant. Closed at the end of the grant's own round, as it was, the cleanup was
        never written and the node kept the key for its TTL. Nor is the connection
        closed now (``_linger``): a woken node runs only the first commands of a closed
        connection's buffer.

        Raises:
            _Failed: always (the node is unreachable for this round).
        """
        io = self.io
        assert io is not None
        if command.undo:
            with contextlib.suppress(Exception):
                self._put(io, command.fallback or command.packed)
        why = Diagnosis(Failure.UNREACHABLE, f"no reply for {STALL}s")
        self._linger()
        self.drop(now, why, stalled=True)
        raise _Failed(why)

    def _linger(self) -> None:
        """Hand the connection, shut for writing behind all that was written to it, to the
        process's lingering thread, which reads it to its end (or for ``LINGER``
        seconds) and then closes it (``lingering``): the node, once awake, reads it
        all, runs it in order, answers, and closes its end. Closed at once, the
        connection was reset by the node's first answer, and the node dropped what it
        had not read yet: a frozen node woken with 200 requests waiting (a lease's
        grant, 100 cycles, the lease's release) ran the first ones only, and kept the
        lease's key and others for their TTL. Something the socket did not take
        (``unsent``: a node that stopped reading long ago) cannot be shut behind; such
        a connection is closed at once, by ``drop``."""
        sock = self.end_writing()
        if sock is not None:
            linger(sock, self.detach(), monotonic() + LINGER)

    def _write_now(self, sock: Any, data: bytes) -> None:
        """Write ``data`` behind what the socket could not take yet, without waiting;
        what it cannot take now waits in ``unsent``, in order, and is handed to the
        flusher, which writes it once the socket takes more, should no round of this link
        come first.

        The socket is full only when the node stopped reading (frozen, starved). Ending
        the connection then, as a write refused after the kernel timeout would, leaves
        the node a buffer of our commands that it reads in part when it wakes: it runs
        those, cannot answer them, frees the connection and drops the rest, releases
        behind their grants included, which then hold their locks for a whole TTL.
        """
        # ``cut`` from the system call until ``unsent`` holds whatever did not go out.
        # (A signal is handled after a call, not between this and the next line.)
        unsent = self.unsent
        if unsent:
            with self.writing:  # the flusher may be writing the start of it
                self.cut = True
                self._push(sock, data)
            self.cut = False
            if self.unsent:
                hand_over(self)
            return
        # Nothing waits, so the flusher has nothing of this link to write: no lock. (The
        # path of nearly every write, so ``_push`` inline: a call costs 0.3% of a cycle.)
        self.cut = True
        try:
            sent = sock.send(data, _NO_WAIT)
        except BlockingIOError:
            sent = 0
        if sent < len(data):
            unsent.append(data[sent:])
        self.cut = False
        if unsent:
            hand_over(self)

    def _push(self, sock: Any, data: bytes) -> None:
        """Write what waits, then ``data``, as much as ``sock`` takes now; keep the rest."""
        unsent = self.unsent
        if unsent:
            data = b"".join((*unsent, data))
        try:
            sent = sock.send(data, _NO_WAIT)
        except BlockingIOError:
            sent = 0
        unsent.clear()
        if sent < len(data):
            unsent.append(data[sent:])

    def keeping(self) -> Any:
        """The socket that what this link kept back waits for (None: nothing waits)."""
        io = self.io
        return io.sock if self.unsent and io is not None else None

    def flush(self, sock: Any) -> None:
        """Write to ``sock`` what waits for it, as much as it takes now (the flusher's
        thread, while the link may be in a round of its own). A connection that fails
        here loses what waited, as a lost connection does; the link's next round finds
        the failure and drops the link."""
        with self.writing:
            io = self.io
            if io is None or io.sock is not sock or not self.unsent:
                return  # closed, or set up again, or written by a round meanwhile
            try:
                self._push(sock, b"")
            except OSError:
                self.unsent = []

    def prepare(self, now: float, wake: Callable[[], None]) -> Diagnosis | None:
        """Start or follow this link's set-up.

        Returns None when the link is connected (``conn``) or still being set up
        (``setup``); otherwise why its node cannot be asked now: its back-off, or why
        the set-up failed (for any reason: a refused connection, a TLS certificate that
        fails verification, an AUTH refused, a handshake answered with garbage).
        """
        if self.conn is not None:
            return None
        node = self.node
        setup = self.setup
        if setup is None:
            wait = self.backing_off(now)
            if wait:
                down = BackingOff(wait, node.last)
                return Diagnosis(down.failure, down.detail)
            setup = self.setup = SetUp(
                node.new_connection(),
                node.connect_timeout,
                node.timeout,
                wake,
                now + node.connect_timeout,
                probe=node.probe,
            )
        if setup.done:
            if setup.error is None:
                # ``conn`` last, and the set-up dropped only then: an interrupt (Ctrl-C)
                # in between leaves a link that is not ``ready`` (the cleanup written
                # behind an interrupted round skips it) and whose ``close`` still
                # closes the connection through its set-up.
                conn = setup.take()
                self.io = SocketReplies(conn)
                self.conn = conn
                self.setup = None
                node.up()
                return None
            self.setup = None
            why = before_first_reply(
                node.diagnose(setup.error), setup.error, node.address.login_form
            )
            node.down(now, why)
            return why
        if now >= setup.deadline:
            self.setup = None
            setup.abandon()
            why = (
                silent_since_stall(node.connect_timeout)
                if setup.probing
                else not_connected_in_time(node.address, node.connect_timeout)
            )
            node.down(now, why)
            return why
        return None

    def ready(self) -> bool:
        """Can a round be sent on this link now (nothing of it still being set up)?"""
        return self.conn is not None

    def backing_off(self, now: float) -> float:
        """Seconds until a new connection may be tried (0 when connected or it may be now)."""
        return self.node.backing_off(now) if self.conn is None else 0.0

    def socket(self) -> Any:
        return self.io.sock if self.io is not None else None

    def reply(self) -> Any:
        """The connection's next reply, whoever's it is (error replies raise)."""
        assert self.io is not None
        return self.io.read()

    def read(self) -> Any:
        """Read one reply: ours (error replies raise), or ``_NOT_YET`` if it was owed
        (``_LATE``: an owed error reply, which ``take_late`` and ``take_resends`` tell)."""
        io = self.io
        assert io is not None
        if self.owed:
            self.owed -= 1
            self.heard = True
            if not self.owed:
                self.quiet_since = 0.0
            self.owed_read += 1
            release = self._owed_release() if self.owed_releases else None
            # An abandoned request's error reply is nobody's business any more, but
            # for what it says of the node's scripts (a late NOSCRIPT: a release goes
            # again by EVAL).
            try:
                io.read()
            except ResponseError as exc:
                text = reply_text(exc)
                retry = self.node.scripts.answered(text, release)
                if retry is not None:
                    self.resends.append(retry)
                if not about_scripts(text):
                    self.late = exc  # and for what it says of the node's configuration
                return _LATE
            return _NOT_YET
        return io.read()

    def _owed_release(self) -> Command | None:
        """The release whose reply is the one just read (``owed_read``), if it is one;
        the releases whose replies came before are forgotten."""
        releases = self.owed_releases
        while releases and releases[0][0] < self.owed_read:
            releases.popleft()
        if releases and releases[0][0] == self.owed_read:
            return releases.popleft()[1]
        return None

    def take_resends(self) -> list[Command]:
        """The releases to send again by EVAL (read NOSCRIPT late), once."""
        resends, self.resends = self.resends, []
        return resends

    def take_late(self) -> Diagnosis | None:
        """What the error of a reply read after its round was over says of the node,
        once (then it is forgotten)."""
        exc, self.late = self.late, None
        return None if exc is None else self.node.diagnose(exc)

    def more_ready(self) -> bool:
        """Is another reply already received (read without waiting)?"""
        return self.io is not None and self.io.ready()

    def abandon(self, now: float, replies: int = 1, command: Command | None = None) -> None:
        """Stop waiting for the in-flight command; its ``replies`` are dropped when they
        come (``command``: a release by EVALSHA's is looked at for a NOSCRIPT).

        The connection is given up (by ``send``) only once it has owed replies for
        ``STALL`` seconds and heard none (a frozen or cut-off node), never for being
        behind. A node that is slow but answering keeps its connection: closed, the node
        would still run the grant it had received, and then sit out its back-off while
        the release goes out, keeping the key for its whole TTL.
        """
        if not self.owed or self.heard or not self.quiet_since:
            self.quiet_since = now
            self.heard = False
        self.owed += replies - len(self.partial)
        self.partial = []
        if command is not None and command.resend_late:
            self.owed_releases.append((self.owed_read + self.owed, command))
        # Given up, if it stays silent, only when the next command comes (``send``),
        # not here: that may be the cleanup of what this round wrote.

    def _unread(self) -> bool:
        """Answers from the node wait here unread: parsed, or still in the socket."""
        io = self.io
        return io is not None and (io.ready() or has_unread(io.sock))

    def drop(self, now: float, why: Diagnosis | None = None, *, stalled: bool = False) -> None:
        self.close()
        self.node.down(now, why, stalled=stalled)

    def shed_if_closed(self, now: float, wake: Callable[[], None]) -> None:
        """Close the connection if the node closed it while it was unused: with no reply
        owed, anything to read is its end (or bytes out of turn), never an answer; with
        replies owed (to requests of rounds decided without them), the end is looked
        for behind them, without reading them (``closed_by_peer``). No back-off: the
        node did nothing wrong, and the round connects it again. (What an owed reply
        had to say, a late NOSCRIPT to a release, goes with the connection: that
        release's keys expire by their TTL, as a lost request's do.)"""
        io = self.io
        if io is None:
            return
        if closed_by_peer(io.sock) if self.owed else has_unread(io.sock):
            self.close()

    def end_writing(self) -> Any:
        """Shut the connection for writing, behind all that was written to it (a FIN,
        not a reset): the node reads it all, runs it, answers, and then closes its end.
        Returns the socket, to be read to that end (``let_go``); None if there
        is nothing to wait for: not connected, something kept back that the socket did
        not take (its node stopped reading), or the connection already broken; and in
        a child forked from the process that opened it, where the shutdown would end
        the parent's connection too (redis-py's ``disconnect`` checks the same)."""
        io = self.io
        conn = self.conn
        if io is None or conn is None or self.unsent or conn.pid != os.getpid():
            return None
        try:
            io.sock.shutdown(socket.SHUT_WR)
        except OSError:
            return None
        return io.sock

    def detach(self) -> Any:
        """Hand the connection over (to be closed by whoever takes it: ``let_go``); the
        link then closes without it."""
        conn, self.conn = self.conn, None
        return conn

    def close(self) -> None:
        """Close the connection (or abandon its set-up); owe nothing."""
        if self.setup is not None:
            self.setup.abandon()
            self.setup = None
        if self.conn is not None:
            disconnect(self.conn)
            self.conn = None
        self.io = None
        self.owed = 0
        self.quiet_since = 0.0
        with self.writing:  # in turn with the flusher, which may be writing it out
            self.unsent = []
        self.cut = False
        self.partial = []
        # Nothing of the closed connection comes any more (a release owed there stays
        # until its TTL, as when its request was lost).
        self.owed_releases.clear()
        self.resends = []

    def resend(self, command: Command, exc: ResponseError, now: float) -> Command | None:
        """Write what ``command`` takes after the error reply ``exc`` within the round
        (the EVAL form of an EVALSHA the node could not run: ``ScriptCache``), and
        return it; None if nothing is to be resent.

        Raises:
            _Failed: writing failed; the link is dropped.
        """
        retry = self.node.scripts.answered(reply_text(exc), command)
        if retry is not None:
            self.send(retry, now)
        return retry

    def fail(self, i: int, exc: Exception, rnd: Round, now: float) -> None:
        """Node ``i`` raised ``exc`` while we read its reply: a per-node failure.

        An error reply leaves the connection in step (the command's later replies are
        owed); anything else (a network error, bytes that are not RESP, a reply our
        parser cannot read) means the stream can no longer be trusted, so it is dropped.
        So is a node that refused for its configuration (a read-only replica, NOAUTH):
        it will refuse again, so it is left alone for a back-off like a down node, and
        reported meanwhile with what is wrong (``BackingOff``). Redis also closes some of
        those connections itself (an unauthenticated client sending a script).
        """
        why = self.node.diagnose(exc)
        if self.io is not None and not self.io.heard:
            why = before_first_reply(why, exc, self.node.address.login_form)
        if not isinstance(exc, ResponseError) or reply_ends_link(why):
            self.drop(now, why)
        rnd.fail(i, why.failure, why.detail)


_NOT_YET = object()
_LATE = object()
_NO_WAIT = socket.MSG_DONTWAIT
# What ``LinkSet._read_one`` found of a node's answer.
_DONE, _MORE, _RESENT = 0, 1, 2


class LinkSet:
    """One link per node, in the configured node order."""

    __slots__ = ("_reporter", "_resends", "_wake", "clean", "links", "used_at")

    def __init__(self, nodes: Sequence[NodeState], reporter: NodeReporter) -> None:
        self.links = [n.new_link() for n in nodes]
        self._reporter = reporter
        self.used_at = 0.0  # when its latest round began
        # Releases read NOSCRIPT late in this round, by node (``_told_late``).
        self._resends: list[tuple[int, list[Command]]] = []
        # False while a round is in progress: a set left unclean by an exception has
        # replies nobody accounted for, and must be closed rather than reused.
        self.clean = True
        self._wake = Event()  # set by a set-up of ours when it ends

    def write_behind(self, command: Command, targets: Sequence[int], now: float) -> list[int]:
        """Write ``command`` to those ``targets`` that are connected, and read nothing:
        the cleanup of a round an interrupt cut short (``clean`` is False), on the
        connections that carried its request, behind it. Such a set is closed, never
        read again: the replies on its connections are no longer accounted for. (A
        Cluster node's answer is still read, apart, and its redirections followed:
        ``ClusterLink.send_behind``.)

        Returns the targets it could not be written to, which the caller reaches on
        other connections: the interrupt closed that one as the request was written
        (which may have gone out whole, and run), or it was not connected (an earlier
        round's connection: a waiter's places, and a hand-off to it, may be there).
        """
        unwritten = []
        for i in targets:
            link = self.links[i]
            if link.ready():
                try:
                    link.send_behind(command, now)
                    continue
                except _Failed:  # that link is closed
                    pass
            unwritten.append(i)
        return unwritten

    def end_writing(self) -> dict[Any, Link]:
        """Shut for writing the connections that may carry requests their node has not
        answered yet (every one of a set an interrupt left unclean, and of a clean set
        those that owe replies): by socket, to be read to their end (``let_go``)."""
        ending = {}
        for link in self.links:
            if not self.clean or link.owed:
                sock = link.end_writing()
                if sock is not None:
                    ending[sock] = link
        return ending

    def shed_closed(self, now: float) -> None:
        """Drop the connections the nodes closed while this set was unused; the next
        round sets them up again (``Link.shed_if_closed``)."""
        for link in self.links:
            link.shed_if_closed(now, self._wake.set)

    def run(
        self,
        command: Command,
        rnd: Round,
        deadline: float,
        clock: Callable[[], float],
        targets: Sequence[int] | None = None,
        *,
        hopeless_unsent: bool = False,
        begin_by: float | None = None,
    ) -> None:
        """Send ``command`` to ``targets`` (all nodes by default) and tally into ``rnd``.

        Returns when ``rnd`` is decided or at ``deadline``; nodes still silent then are
        recorded as unreachable and their replies are owed, never left unread. Nodes
        outside ``targets`` are not touched: the caller records them in ``rnd`` first.
        Links without a connection are set up first (``_set_up``), and then the round,
        ``deadline`` included, begins again from that moment.
        ``hopeless_unsent``: if the nodes in their reconnect back-off (or whose set-up
        failed) already make the round impossible, send nothing at all (an acquire that
        cannot win would only leave keys to clean up, and replies to owe, on the nodes
        that are up).
        ``begin_by``: send nothing if the set-ups end only then or later (``Run``).
        """
        self.clean = False
        links = self.links
        now = rnd.started
        if now - self.used_at >= IDLE_LOOK:
            self.shed_closed(now)  # connections the nodes closed meanwhile
        self.used_at = now
        order: Sequence[int] = range(len(links)) if targets is None else targets
        ready = True
        for i in order:  # a loop, not all() over a generator: it runs in every round
            if not links[i].ready():
                ready = False
                break
        if not ready:
            # (A link that is ready is in no back-off, a Cluster node's too: with every
            # one ready, as nearly always, there is nothing to rule out or set up.)
            if hopeless_unsent:
                asked = rule_out(
                    rnd, order, lambda i: (links[i].backing_off(now), links[i].node.last)
                )
                if asked is None:
                    self._reporter.round(rnd)
                    self.clean = True
                    return
                order = asked
            if not all(links[i].ready() for i in order):
                order = self._set_up(order, rnd, clock)
                if hopeless_unsent and rnd.impossible:
                    self._reporter.round(rnd)
                    self.clean = True
                    return
                deadline += rnd.begin_at(clock())
                now = rnd.started
                if rnd.began_too_late(begin_by, order):
                    self._reporter.round(rnd)
                    self.clean = True
                    return
        # The nodes still to answer, by the socket their reply will come on (the one
        # their request was written to).
        waiting: dict[Any, int] = {}
        for i in order:
            try:
                waiting[links[i].send(command, now)] = i
            except _Failed as exc:
                rnd.fail(i, exc.diagnosis.failure, exc.diagnosis.detail)
        # The wait for replies begins once the requests went out: a thread held up
        # before it wrote them (another thread's C call holding the interpreter, a GC
        # pause, a descheduled process) did not make the nodes slow to answer. The
        # validity still counts from the round's start.
        behind = clock() - now
        if behind > 0.0:
            deadline += behind
        if len(links) == 1 and waiting and not links[0].owed:
            # One node, nothing owed: nothing to multiplex, so wait in recv itself. Its
            # socket's timeout (node_timeout: ``kernel_timeouts``) bounds the wait; no select().
            self._read_alone(command, rnd, deadline, clock)
            if self._resends:
                self._resend(clock())
            self._reporter.round(rnd)
            self.clean = True
            return
        heard_out = False
        while waiting and not rnd.decided:
            if rnd.hear_out and rnd.impossible and not heard_out:
                # A failed round heard out (see ``Round``): for a little longer only.
                heard_out = True
                deadline = min(deadline, clock() + rnd.hear_out)
            # Past the deadline we still poll once without waiting: replies that arrived
            # while we were busy (a slow connect) count; only true silence is a timeout.
            timeout = max(deadline - clock(), 0.0)
            arrived = readable(list(waiting), timeout)
            now = clock()
            for sock in arrived:
                i = waiting.pop(sock)
                got = self._read_one(i, command, rnd, now)
                if got == _DONE:
                    continue
                if got == _RESENT:
                    # The node answered, and asked for the command again: the round
                    # waits a node timeout for that (a node that is alive is not
                    # silent for our second request). Validity still counts from the
                    # round's start.
                    deadline = max(deadline, now + links[i].node.timeout)
                # Still to come; on the same socket unless a Cluster node's request
                # was redirected to another member.
                waiting[links[i].socket()] = i
            # Nothing by the deadline is not yet silence: select() woke at the deadline,
            # but this thread may have run much later (other threads holding the
            # interpreter, a starved process), so the next turn polls once more without
            # waiting, and replies that arrived meanwhile count.
            if timeout == 0.0:
                break

        now = clock()
        rnd.stop_hearing()
        for i in waiting.values():
            self._give_up_on(i, command, rnd, now)
        if not rnd.decided:
            rnd.time_out([link.answered_at for link in links])
        if self._resends:
            self._resend(now)
        self._reporter.round(rnd)
        self.clean = True

    def _set_up(self, order: Sequence[int], rnd: Round, clock: Callable[[], float]) -> list[int]:
        """Connect the links of ``order`` that have no connection, all at once, and wait
        until the round may begin (``Round.set_up_wait``).

        Nodes that cannot be asked are recorded in ``rnd``: back-off, failed set-up, or
        still connecting (its set-up goes on, for a later round). Returns the nodes to
        send to: those of ``order`` that are connected.
        """
        links = self.links
        wake = self._wake
        fresh: set[int] = set()  # set-ups this round started
        while True:
            wake.clear()  # before looking, so that a set-up ending meanwhile is not missed
            now = clock()
            ready = 0
            pending: list[int] = []
            for i in order:
                if rnd.results[i] is not None:
                    continue  # not waited for (a cleanup's bystander): sent only if connected
                link = links[i]
                before = link.setup
                why = link.prepare(now, wake.set)
                if why is not None:
                    rnd.fail(i, why.failure, why.detail)
                elif link.ready():
                    ready += 1
                elif link.setup is not None and link.setup.probe:
                    why = being_probed()  # not waited for: ``_core.backoff``
                    rnd.fail(i, why.failure, why.detail)
                else:
                    pending.append(i)
                    if before is None:
                        fresh.add(i)
            wait = rnd.set_up_wait(
                ready, len(pending), len(fresh.intersection(pending)), now, links[0].node.timeout
            )
            if wait == 0.0:
                break
            first = min(s.deadline for i in pending if (s := links[i].setup) is not None)
            timeout = first - now if wait is None else min(wait, first - now)
            wake.wait(max(timeout, 0.0))
        for i in pending:
            rnd.fail(i, Failure.CONNECTING, "not connected yet when the round began")
        return [i for i in order if links[i].ready()]

    def _give_up_on(self, i: int, command: Command, rnd: Round, now: float) -> None:
        """The deadline passed before node ``i`` answered all of ``command``.

        Its replies still to come are owed. A node that answered part (a WAIT still
        blocked in Redis) is judged on what came: it is not silent.
        """
        link = self.links[i]
        if link.partial and not rnd.decided:
            try:
                answer = command.parse(list(link.partial))
            except Exception as exc:  # a reply of the wrong shape: not Redis speaking
                link.fail(i, exc, rnd, now)  # dropped: nothing more to owe
                return
            rnd.record(i, *answer)
        link.abandon(now, command.replies, command)

    def _read_alone(
        self, command: Command, rnd: Round, deadline: float, clock: Callable[[], float]
    ) -> None:
        link = self.links[0]
        assert link.conn is not None
        try:
            while True:
                try:
                    if command.replies == 1:
                        while True:  # a resend may meet another error: a cluster's redirections
                            try:
                                while link.owed:  # an ASKING's reply, ahead of the redirected one
                                    if link.read() is _LATE:
                                        self._told_late(0)
                                reply = link.reply()
                                break
                            except ResponseError as exc:
                                retry = link.resend(command, exc, clock())
                                if retry is None:
                                    raise
                                command = retry
                    else:
                        while len(link.partial) < command.replies:
                            link.partial.append(link.reply())
                        reply, link.partial = link.partial, []
                    break
                except _NETWORK_ERRORS as exc:
                    # The socket's timeout is one node timeout, but a round may wait
                    # longer (a release waits RELEASE_PATIENCE of them): read on, where
                    # it left off, until the round's deadline.
                    if not timed_out(exc) or clock() >= deadline:
                        raise
            answer = command.parse(reply)
        except _Failed as exc:  # the resend could not be written; the link is dropped
            rnd.fail(0, exc.diagnosis.failure, exc.diagnosis.detail)
        except ResponseError as exc:
            # The command's later replies (a WAIT behind a failed script) still come.
            link.owed += command.replies - 1 - len(link.partial)
            link.partial = []
            link.fail(0, exc, rnd, clock())
        except _NETWORK_ERRORS as exc:
            if timed_out(exc):
                # The socket's timeout: the node is silent (frozen?). Keep the connection
                # and owe the reply, exactly as the select() path does at its deadline.
                self._give_up_on(0, command, rnd, clock())
                rnd.time_out()
            else:
                link.fail(0, exc, rnd, clock())
        except Exception as exc:  # not Redis speaking (InvalidResponse, a garbled reply)
            link.fail(0, exc, rnd, clock())
        else:
            rnd.record(0, *answer)

    def _told_late(self, i: int) -> None:
        """Tell what a late error reply of node ``i`` says of its configuration, and keep
        a release it refused (NOSCRIPT) to be sent again when the round ends."""
        link = self.links[i]
        why = link.take_late()
        if why is not None:
            self._reporter.late(i, why)
        resends = link.take_resends()
        if resends:
            self._resends.append((i, resends))

    def _resend(self, now: float) -> None:
        """Send the releases read NOSCRIPT late by EVAL (``_told_late``), after this
        round's replies were read or owed, so that theirs are owed behind them. Nobody
        waits for them; one that cannot be written stays until its TTL."""
        resends, self._resends = self._resends, []
        for i, commands in resends:
            link = self.links[i]
            for command in commands:
                if not link.ready():
                    break  # the link was dropped after it read the NOSCRIPT
                try:
                    link.send(command, now)
                except _Failed:
                    break  # the link was dropped
                link.abandon(now, command.replies)

    def _read_one(self, i: int, command: Command, rnd: Round, now: float) -> int:
        """Read what node ``i`` has for us: ``_DONE`` once its answer to this round is in,
        ``_MORE`` while it is still to come, ``_RESENT`` when the node asked for another
        form of the command (the EVAL form after NOSCRIPT, a Cluster redirection), which
        is on its way."""
        link = self.links[i]
        try:
            while True:
                reply = link.read()
                if reply is _NOT_YET or reply is _LATE:
                    # An earlier request's: the node answers (``Round.time_out``).
                    link.answered_at = now
                    if reply is _LATE:
                        self._told_late(i)
                else:
                    if command.replies == 1:
                        rnd.record(i, *command.parse(reply))
                        return _DONE
                    link.partial.append(reply)
                    if len(link.partial) == command.replies:
                        replies, link.partial = link.partial, []
                        rnd.record(i, *command.parse(replies))
                        return _DONE
                if not link.more_ready():
                    return _MORE
        except ResponseError as exc:
            if command.replies == 1:
                try:
                    if link.resend(command, exc, now) is not None:
                        return _RESENT  # wait for the reply to what was resent
                except _Failed as failed:
                    rnd.fail(i, failed.diagnosis.failure, failed.diagnosis.detail)
                    return _DONE
            # Replies of this command still to come (a WAIT behind a failed script) are owed.
            link.owed += command.replies - 1 - len(link.partial)
            link.partial = []
            link.fail(i, exc, rnd, now)
            return _DONE
        except Exception as exc:  # not BaseException: an interrupt is no node's failure
            # A network error, or a node that does not speak Redis (InvalidResponse, a
            # reply the parser cannot read): a per-node failure, never the caller's.
            link.fail(i, exc, rnd, now)
            return _DONE


class LinkPool:
    """Link sets for concurrent operations of one client; fork-aware.

    ``list.append`` and ``list.pop`` are atomic, so borrowing needs no lock. After
    ``fork()`` the child forgets the parent's sets (see ``_forget_after_fork``) without
    closing them: the sockets are the parent's.
    """

    def __init__(
        self,
        config: ClientConfig,
        connection_options: dict[str, Any],
        reporter: NodeReporter,
    ) -> None:
        from .cluster import ClusterState  # it builds on this module

        def state(a: NodeAddress) -> NodeState:
            pool = node_pool(a, config, connection_options, asyncio=False)
            return NodeState(a, pool, config.node_timeout, config.connect_timeout)

        self.nodes = [
            ClusterState(a, state, config.node_timeout, config.connect_timeout)
            if a.seeds
            else state(a)
            for a in config.nodes
        ]
        self.reporter = reporter
        self._free: list[LinkSet] = []
        self._closed = False
        _POOLS.add(self)

    def get(self) -> LinkSet:
        try:
            return self._free.pop()
        except IndexError:
            return LinkSet(self.nodes, self.reporter)

    def put(self, links: LinkSet) -> None:
        if self._closed:
            let_go([links])  # borrowed when the pool was closed: not kept open
            return
        self._free.append(links)

    def forget(self) -> None:
        self._free = []

    def close(self) -> None:
        self._closed = True
        sets, self._free = self._free, []
        let_go(sets)


def let_go(sets: Sequence[LinkSet]) -> None:
    """Close every connection of ``sets``; those that may carry requests their node has
    not answered yet only once the node has read them (``LinkSet.end_writing``).

    A connection closed with replies unread in it is reset (RST), and a node that has
    read the first of two requests and then fails to write its answer on the reset
    connection drops the connection, the second request with it, unread: the cleanup
    written behind an interrupted acquire on a connection that owed replies was lost so,
    and the lock held on one node of three until its TTL (and a loop of grant, release
    written behind it, close lost 15 of 5,000 releases). So they are shut for writing
    first, and read to their end, their replies dropped, for one node timeout at most
    (all of them at once: a client closed with a frozen node waits that long, not that
    long per set), as the asyncio client's close gives requests already made; then
    closed. (A Cluster node's link reads the answers of what it wrote behind in a thread
    of its own: ``ClusterLink.close``.) Another interrupt (Ctrl-C) as it waits leaves
    those not at their end yet to a thread, which reads them on until the same deadline
    and then closes them: closed at once, they were reset, and what was written behind
    was lost again (``_close_all``).
    """
    ending: dict[Any, Link] = {}
    deadline = 0.0
    try:
        patience = max((link.node.timeout for links in sets for link in links.links), default=0.0)
        deadline = monotonic() + patience
        for links in sets:
            ending.update(links.end_writing())
        _read_to_end(ending, deadline)
    finally:
        _close_all(sets, ending, deadline)


def _close_all(sets: Sequence[LinkSet], ending: dict[Any, Link], deadline: float) -> None:
    """Close every connection of ``sets``; those of ``ending`` (shut for writing, their
    end not read yet) are handed to a thread that reads them to their end first, while
    ``deadline`` allows: ``let_go``'s reading was cut short by an interrupt. Not a
    daemon: a program that ends of the interrupt waits for it, up to ``deadline``."""
    if ending and deadline > monotonic():
        conns = {sock: link.detach() for sock, link in ending.items()}
        reading = partial(_read_then_close, conns, deadline)
        if start_thread(reading, "tenure-let-go", daemon=False) is None:
            _read_then_close(conns, monotonic())  # no thread to be had: closed now
    for links in sets:
        for link in links.links:
            link.close()


def _read_then_close(conns: dict[Any, Any], deadline: float) -> None:
    """Read the sockets of ``conns`` to their end (or ``deadline``), then close their
    connections."""
    try:
        _read_to_end(dict(conns), deadline)
    finally:
        for conn in conns.values():
            disconnect(conn)


def _read_to_end(ending: dict[Any, Any], deadline: float) -> None:
    """Read the sockets of ``ending`` until each one's end comes, or ``deadline``.

    (A function of its own, not a loop in ``let_go``'s ``try``: docs/architecture.md,
    "A loop in a try or with block".)"""
    while ending:
        left = deadline - monotonic()
        if left <= 0.0:
            return
        try:
            ready = readable(list(ending), left)
        except (OSError, ValueError):
            return  # best effort, as any cleanup: the rest are closed unread
        for sock in ready:
            if not read_on(sock):
                del ending[sock]  # its end came: closed with the rest, by ``let_go``


_POOLS: weakref.WeakSet[LinkPool] = weakref.WeakSet()


def _forget_after_fork() -> None:
    for pool in list(_POOLS):
        pool.forget()


os.register_at_fork(after_in_child=_forget_after_fork)

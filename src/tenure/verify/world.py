"""One scenario run's world: lock nodes, proxies, the store, workers, and the faults.

Everything a run starts is tracked here and stopped by :meth:`World.close`, in reverse
order, whatever happened: workers first (so nothing writes while nodes go away), then
proxies, then nodes. Only processes this world spawned are ever signalled, by PID.

Every fault is named after what it does (``pause_worker``, ``kill_node``, ``cut``,
``jump_clock``) and recorded as a ``Fault`` event in the run's history with a *proof* that
it happened, observed rather than assumed: the kernel's ``T`` state of a stopped process,
the bytes a proxy threw away, the node's ``TIME`` before and after a jump, a new
``run_id`` after a restart. A fault without its proof is reported as such.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import redis

from ..testing.local import LocalNode, Persistence
from ..testing.topologies import LocalSentinelSet
from .actors import Actor, ActorSpec
from .clock import NodeClock, server_time
from .history import Crash, Fault, Final, HistoryWriter, Note
from .locks import LockRecipe
from .proof import process_state, wait_for_state
from .proxy import Proxy
from .register import Register

__all__ = ["World"]

_LINK_TIMEOUT = 10.0


class World:
    """The processes of one run, and the faults done to them.

    Args:
        directory: the run's directory; ``history/`` in it receives every process's
            history file, ``nodes/`` the nodes' directories.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.history_dir = directory / "history"
        self.history_dir.mkdir(parents=True, exist_ok=True)
        self._log = HistoryWriter(self.history_dir / "nemesis.jsonl")
        self._nodes: list[LocalNode] = []
        self._proxies: list[Proxy] = []
        self._sentinel_sets: list[LocalSentinelSet] = []
        self._actors: list[Actor] = []
        self._clocks: dict[str, NodeClock] = {}
        self._paused: dict[str, tuple[int, str]] = {}  # worker or node -> (since, proof)
        self.faults = 0
        try:
            self.store = self.node("store")
        except BaseException:
            self.close()  # no ``with`` will: the store's files and our history file
            raise
        self.store_url = self.store.url

    # --- building ---------------------------------------------------------------------

    def node(
        self,
        name: str,
        *,
        persistence: Persistence = Persistence.NONE,
        extra_config: Mapping[str, str] | None = None,
        fake_clock: bool = False,
    ) -> LocalNode:
        """Start a redis-server; ``fake_clock`` lets :meth:`jump_clock` move its wall clock."""
        directory = self.directory / "nodes" / f"{name}-{len(self._nodes)}"
        env: dict[str, str] | None = None
        if fake_clock:
            clock = NodeClock(directory)
            self._clocks[name] = clock
            env = clock.env()
        node = LocalNode(
            name, directory, persistence=persistence, extra_config=extra_config, env=env
        )
        self._nodes.append(node)
        node.start()
        return node

    def proxy(self, node: LocalNode) -> Proxy:
        assert node.port is not None
        proxy = Proxy(node.host, node.port, name=node.name)
        self._proxies.append(proxy)
        proxy.start()
        return proxy

    def sentinel_set(self, name: str, *, down_after: float = 1.0) -> LocalSentinelSet:
        """Start a master, one replica and three Sentinels (quorum 2) watching it, and
        wait until they agree; lock clients reach it through ``.url``."""
        sentinels = LocalSentinelSet(
            replicas=1,
            sentinels=3,
            service=name.replace(".", "-"),
            down_after=down_after,
            base_dir=self.directory / "nodes" / f"sentinel-{name}",
        )
        self._sentinel_sets.append(sentinels)
        sentinels.start()
        return sentinels

    def _spec(self, proc: str, lock: LockRecipe, fenced: bool) -> ActorSpec:
        return ActorSpec(
            proc=proc,
            lock=lock,
            store_url=self.store_url,
            fenced=fenced,
            history_path=os.fspath(self.history_dir / f"{proc}.jsonl"),
        )

    def actor(self, proc: str, lock: LockRecipe, *, fenced: bool) -> Actor:
        actor = Actor(self._spec(proc, lock, fenced))
        self._actors.append(actor)
        return actor

    def actors(self, procs: Iterable[str], lock: LockRecipe, *, fenced: bool) -> list[Actor]:
        """Start one worker per name side by side (spawning takes a while each), then
        wait until all are ready."""
        started = []
        for proc in procs:
            actor = Actor(self._spec(proc, lock, fenced), wait=False)
            self._actors.append(actor)
            started.append(actor)
        for actor in started:
            actor.wait_ready()
        return started

    def replicate(self, replica: LocalNode, source: LocalNode | Proxy) -> None:
        """Make ``replica`` follow ``source`` (a node, or a proxy in front of one)."""
        address = source.address if isinstance(source, Proxy) else source
        replica.replicate_from(address)
        # (The loop apart from the ``with``: docs/architecture.md, "A loop in a try or
        # with block".)
        with replica.client() as c:
            _await_link(c, replica.name, time.monotonic() + _LINK_TIMEOUT)

    # --- recording ----------------------------------------------------------------------

    def note(self, text: str) -> None:
        self._log.write(Note(time.monotonic_ns(), text))

    def fault(self, name: str, target: str, t_start: int, proof: str) -> None:
        self.faults += 1
        self._log.write(Fault(name, target, t_start, time.monotonic_ns(), proof))

    def final(self, resource: str = "register") -> list[str]:
        """Read the register's final content into the history."""
        reg = Register(self.store_url, fenced=False, resource=resource)
        try:
            ops = reg.read()
        finally:
            reg.close()
        self._log.write(Final(time.monotonic_ns(), tuple(ops)))
        return ops

    # --- faults -------------------------------------------------------------------------

    def pause_worker(self, actor: Actor) -> None:
        """SIGSTOP a worker: a GC pause or a frozen VM, until :meth:`resume_worker`."""
        t = time.monotonic_ns()
        actor.pause()
        state = wait_for_state(actor.pid, "T", 5.0)
        self._paused[actor.name] = (t, f"state {state} in /proc/{actor.pid}/stat")

    def resume_worker(self, actor: Actor) -> None:
        actor.resume()
        t, proof = self._paused.pop(actor.name)
        self.fault("pause", actor.name, t, proof)

    def crash_worker(self, actor: Actor) -> None:
        """SIGKILL a worker mid-hold."""
        t = time.monotonic_ns()
        pid = actor.pid
        actor.kill()
        self._log.write(Crash(actor.name, t))
        self.fault("crash", actor.name, t, f"pid {pid} gone: {not _exists(pid)}")

    def pause_node(self, node: LocalNode) -> None:
        """SIGSTOP a node: it accepts connections and answers nothing (a frozen VM),
        until :meth:`resume_node`."""
        t = time.monotonic_ns()
        node.pause()
        pid = node.pid
        assert pid is not None  # pause() raised if it was not running
        state = wait_for_state(pid, "Tt", 5.0)
        self._paused[node.name] = (t, f"state {state} in /proc/{pid}/stat")

    def resume_node(self, node: LocalNode) -> None:
        """SIGCONT a node paused by :meth:`pause_node`; the pause is recorded now, with
        the proof of its start and that the node answered again."""
        node.resume()
        with node.client(socket_timeout=5.0) as c:
            c.ping()
        t, proof = self._paused.pop(node.name)
        self.fault("pause", node.name, t, f"{proof}; PONG after SIGCONT")

    def kill_node(self, node: LocalNode) -> None:
        t = time.monotonic_ns()
        pid = node.pid
        node.kill()
        self.fault("kill", node.name, t, f"pid {pid} gone: {pid is not None and not _exists(pid)}")

    def restart_node(self, node: LocalNode) -> None:
        """Crash and restart a node; what survives depends on its persistence."""
        t = time.monotonic_ns()
        before = _run_id(node)
        node.restart(keep_data=True)
        with node.client() as c:
            after = str(c.info("server")["run_id"])
            keys = c.dbsize()
        self.fault(
            "restart",
            node.name,
            t,
            f"run_id {before[:8]} -> {after[:8]}, {keys} keys after ({node.persistence.value})",
        )

    def promote(self, node: LocalNode) -> None:
        t = time.monotonic_ns()
        node.promote()
        with node.client() as c:
            role = c.info("replication")["role"]
        self.fault("promote", node.name, t, f"role {role}")

    def drop_replicas(self, master: LocalNode) -> None:
        """Close the master's connections to its replicas (``CLIENT KILL TYPE slave``):
        with the replica paused it cannot come back, so it misses every write from now
        on. Recorded at once (the link stays down until the run ends or it reconnects)."""
        t = time.monotonic_ns()
        with master.client() as c:
            killed = int(c.execute_command("CLIENT", "KILL", "TYPE", "slave"))
            left = int(c.info("replication")["connected_slaves"])
        self.fault(
            "replication cut", master.name, t, f"{killed} replica link(s) closed, {left} left"
        )

    def wait_for_promotion(self, sentinels: LocalSentinelSet, old: LocalNode) -> LocalNode:
        """Wait until every Sentinel names a new master, after ``old`` died or froze;
        recorded as a ``promotion`` whose proof is what the Sentinels and the node say."""
        t = time.monotonic_ns()
        master = sentinels.wait_for_promotion(old, timeout=60.0)
        with master.client() as c:
            info = c.info("replication")
        replid2 = str(info.get("master_replid2", ""))
        self.fault(
            "promotion",
            master.name,
            t,
            f"{len(sentinels.sentinels)} Sentinels name port {master.port} (was {old.port}); "
            f"role {info['role']}, previous replid {replid2[:8]}",
        )
        return master

    def cut(self, proxies: Iterable[Proxy]) -> list[tuple[Proxy, int, int]]:
        """Partition: the proxies swallow everything. Returns what :meth:`heal` needs."""
        started = []
        for p in proxies:
            started.append((p, time.monotonic_ns(), p.stats.bytes_dropped))
            p.blackhole()
        return started

    def heal(self, cuts: list[tuple[Proxy, int, int]], name: str = "partition") -> None:
        for p, t, dropped in cuts:
            now_dropped = p.stats.bytes_dropped
            p.heal()
            self.fault(name, p.name, t, f"{now_dropped - dropped} bytes dropped by the proxy")

    def jump_clock(self, node: LocalNode, seconds: float) -> None:
        """Move ``node``'s wall clock forward (libfaketime): its keys expire early."""
        t = time.monotonic_ns()
        with node.client() as c:
            clock = self._clocks[node.name]
            before = server_time(c) - time.time()
            clock.jump(seconds)
            after = clock.wait_seen(c)
        self.fault("clock jump", node.name, t, f"TIME jumped {after - before:+.1f}s")

    # --- teardown -----------------------------------------------------------------------

    def close(self) -> None:
        for actor in reversed(self._actors):
            with contextlib.suppress(Exception):
                actor.close()
        for proxy in reversed(self._proxies):
            with contextlib.suppress(Exception):
                proxy.close()
        for sentinels in reversed(self._sentinel_sets):
            with contextlib.suppress(Exception):
                sentinels.close()
        for node in reversed(self._nodes):
            with contextlib.suppress(Exception):
                node.kill()
        self._log.close()

    def __enter__(self) -> World:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _exists(pid: int) -> bool:
    try:
        return process_state(pid) not in ("Z", "X")
    except OSError:
        return False


def _run_id(node: LocalNode) -> str:
    with contextlib.suppress(redis.RedisError), node.client(socket_timeout=1.0) as c:
        return str(c.info("server")["run_id"])
    return "?"


def _await_link(c: redis.Redis, name: str, deadline: float) -> None:
    """Until the replica behind ``c`` reports its link to its master up."""
    while c.info("replication").get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not link to its master")
        time.sleep(0.02)

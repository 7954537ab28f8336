"""The rules of ``tenure check``, pure: what a node's facts say about the lock's safety.

:func:`evaluate` and the ``check_*`` functions take :class:`NodeFacts` (what
:mod:`tenure.cli.node_check` read from the nodes, as plain strings and dicts) and return
:class:`Finding` s; nothing here talks to a server, so every rule is unit-tested without
one.

Levels
------
======= =================================================================================
OK      nothing found that threatens safety.
WARN    safe only under an assumption that the detail states (the host does not crash
        and come back at once, memory never runs short, ...), or something that could not
        be checked (a command not permitted, an unknown server), or a risk to liveness.
UNSAFE  mutual exclusion or fencing can break through an ordinary event (a process
        crash, memory pressure, a failover), or tenure cannot work on the node at all
        (unreachable, commands refused by ACL): do not use the node as it is.
======= =================================================================================

The checks
----------
``persistence``
    ``CONFIG`` disabled or renamed (as managed services do): WARN, saying that the
    provider's persistence and failover decide what a restart keeps.
    ``appendonly yes`` + ``appendfsync always``: OK. ``everysec`` (or ``no``): WARN, a
    crash of the *host* loses the last second (or ~30 s) of acknowledged writes. No AOF
    and no RDB (``save ""``): WARN, a restart comes back empty, which tenure detects (no
    floor: the node's record of the tokens it issued) and answers with a ``max_ttl``
    warm-up (docs/fencing.md). No AOF but RDB snapshots: WARN, a crash restarts from an
    old snapshot with an older floor (``tenure:node:floor``) under a new replication
    history, which the scripts recognise (the same warm-up), except in the first restart
    after an upgrade from a tenure that kept no history.
``eviction``
    ``noeviction``: OK. Any ``volatile-*`` or ``allkeys-*`` policy: UNSAFE, since every
    lock key has a TTL and so can be evicted while held (``tenure verify eviction``
    shows it for ``volatile-ttl``, ``volatile-lru`` and ``allkeys-lru``); WARN while
    ``maxmemory`` is 0, since nothing is evicted until a limit is set.
``role``
    A replica: UNSAFE. A master with replicas, or a Redis Cluster node listed as a plain
    one: WARN (failover to an async replica can lose grants). A master alone: OK. A
    server of a Sentinel-managed or Cluster node (``NodeFacts.listed``): its master with
    replicas WARN (a failover is a data loss the node detects and sits out), without OK;
    its replica OK while its link is up (it is what a failover promotes), else WARN.
``min-replicas``
    A Sentinel master only: ``min-replicas-to-write`` and ``min-replicas-max-lag`` ``L``
    both at least 1, ``L`` below ``--max-ttl``: OK, saying that leases must be at most
    ``max_ttl - L`` (an isolated old master stops granting within ``L``, and the new
    master's warm-up outlasts those grants); either 0: WARN (two masters grant after a
    failover unless the clients use ``wait_replicas``); ``L`` >= ``--max-ttl``: WARN (no
    TTL fits); fewer replicas connected than required: WARN (no writes now); unreadable:
    WARN.
``slots``
    A Cluster node as a whole (:func:`check_slots`): every slot has a master and every
    master says ``cluster_state:ok``: OK; otherwise UNSAFE (those slots' locks get no
    vote from the node).
``independent``
    Two entries with the same ``run_id`` (the same server listed twice) or the same
    ``master_replid`` (one replication set): UNSAFE, their votes are not independent.
``uptime``
    Started less than ``--max-ttl`` ago: WARN, unless AOF with ``appendfsync always``
    brought its data back (OK).
``server``
    Which server, from ``INFO server``: Valkey (``valkey_version``, or ``server_name``
    valkey; its ``redis_version`` stays 7.2.4) >= 7.2 and Redis (``redis_version``) >= 6.2
    are supported: OK. An older one: WARN naming the minimum (Redis < 2.6.12, without
    ``SET ... PX``: UNSAFE). Another server (Dragonfly, another ``server_name``, no
    ``redis_version``): WARN (untested). Then whether tenure's scripts run there at all,
    from a script that does nothing but declares a lock key and the node's floor (two
    hash slots), as the lock's scripts do: refused as an unknown command or with scripting
    disabled, UNSAFE ("unsupported": every lock operation is a Lua script); refused with
    ``CROSSSLOT``/``MOVED`` (cluster mode, even a cluster endpoint of one virtual node),
    UNSAFE ("unsupported": the scripts cannot run); refused by the ACL, left to the ``acl``
    check.
``acl``
    Whether the user may send everything tenure sends (:mod:`tenure._driver.acl`: the commands
    of the lock scripts, read from their Lua source, and the drivers' ``EVAL``,
    ``EXISTS``, ``SUBSCRIBE``, ``WAIT``, and what the node's kind adds:
    ``tenure._driver.acl.NODE_KINDS``) on keys ``tenure:*`` and channels
    ``tenure:wake:*`` (with ``--key-prefix``, that prefix in place of ``tenure:``); and
    what the node's URL has every connection send as it opens: ``SELECT`` for a
    database other than 0, ``CLIENT SETNAME`` for a ``client_name`` (refused, every
    connection fails; the fix names the URL's alternative too).
    Asked with ``ACL DRYRUN`` on Redis >= 7 (and Valkey), with ``ACL GETUSER`` +
    ``COMMAND INFO`` on 6.2, or, where the user may not use those, by running
    each command harmlessly. Anything refused: UNSAFE, naming it, with the ``ACL SETUSER``
    line that grants it; only ``WAIT`` refused: WARN (sent only with ``wait_replicas``).
``sentinels``
    A Sentinel-managed node whose Sentinels disagree: one names a master the clients
    cannot use (``ROLE`` says it is a replica, or it does not answer) while another
    names one they can: WARN, one row per out-of-date Sentinel, naming it, what it
    names and the master the clients use (the one checked). The clients ask such a
    Sentinel last, so they work, but with one Sentinel fewer than listed.
``reachable``
    Unreachable, or the login failed: UNSAFE, and nothing else is checked on that node.
    For a Sentinel-managed node, no master named by its Sentinels; for a Cluster node, no
    slot map.

The replicas of a Sentinel-managed or Cluster node (``NodeFacts.replica``) get
``server``, ``role``, ``persistence``, ``eviction`` and ``acl`` (never probed).

Commands that are not permitted degrade one check to WARN ("cannot read persistence
settings (CONFIG not permitted)") instead of failing the run; ``INFO memory`` stands in
for ``CONFIG GET maxmemory-policy`` where it can.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .._core.config import DEFAULT_KEY_PREFIX
from .._core.quorum import majority
from .._core.slots import SLOTS
from .._driver import acl as _acl

__all__ = [
    "CONFIG_KEYS",
    "DEFAULT_MAX_TTL",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_UNSAFE",
    "EXIT_WARN",
    "MINIMUM_VERSIONS",
    "Finding",
    "Level",
    "NodeFacts",
    "UserLogin",
    "check_access",
    "check_eviction",
    "check_independence",
    "check_min_replicas",
    "check_persistence",
    "check_role",
    "check_sentinels",
    "check_server",
    "check_slots",
    "check_uptime",
    "evaluate",
    "exit_code",
    "parse_version",
]

EXIT_OK = 0
EXIT_WARN = 1
EXIT_UNSAFE = 3
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE (sysexits.h), as tenure status and tenure run

DEFAULT_MAX_TTL = 60.0

#: The oldest version of each server tenure supports (and tests: Redis 6.2 in CI).
MINIMUM_VERSIONS: dict[str, tuple[int, ...]] = {"Redis": (6, 2), "Valkey": (7, 2)}

# What CONFIG GET reads (one pattern per call: Redis < 7 takes only one).
CONFIG_KEYS = (
    "appendonly",
    "appendfsync",
    "save",
    "maxmemory-policy",
    "maxmemory",
    "replica-read-only",
    "min-replicas-to-write",
    "min-replicas-max-lag",
)

_DATA_LOSS_NOTE = (
    "a node that comes back empty is detected (no floor) and kept out for max_ttl; "
    "one that comes back with older data is not (docs/fencing.md)"
)


class Level(enum.Enum):
    """How bad a finding is; see the module docstring."""

    OK = "OK"
    WARN = "WARN"
    UNSAFE = "UNSAFE"

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Level.OK: 0, Level.WARN: 1, Level.UNSAFE: 2}


@dataclass(frozen=True)
class Finding:
    """One line of the report: what ``check`` found on ``node``."""

    node: str
    check: str
    level: Level
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {
            "node": self.node,
            "check": self.check,
            "level": self.level.value,
            "detail": self.detail,
        }


@dataclass
class NodeFacts:
    """What was read from one node, as plain strings (the input of the evaluation).

    Attributes:
        node: the node's URL without credentials.
        error: why the node could not be read at all (unreachable, login failed), or
            ``None``; when set, nothing else was gathered.
        info: ``INFO`` (default sections), every value as text; ``None`` if refused.
        info_error: why ``info`` is missing (e.g. "INFO not permitted").
        config: ``CONFIG GET`` results for :data:`CONFIG_KEYS` (absent keys: unknown).
        config_error: why ``config`` is missing or partial (e.g. "CONFIG not permitted").
        user: the ACL user (``ACL WHOAMI``, else the URL's, else ``None``).
        access: what was tried (``"EVAL"``, ``"EXISTS"``, ``"SET in scripts"``, ...) ->
            ``None`` if allowed, else the refusal or error text; ``None`` if not checked.
        access_method: ``"ACL DRYRUN"`` or ``"probe"``.
        access_error: why the access check could not run, if it could not.
        scripts: the reply to a script that only declares two keys of different hash
            slots (``EVAL "return 1" 2 <lock key> <node floor>``): ``"OK"``, the error
            text, or ``None`` if not tried.
        key_prefix: the clients' key prefix: the ACL is judged for keys and channels
            under it.
        kind: what the server is to the lock (``tenure._driver.acl.NODE_KINDS``):
            ``"plain"`` (listed as it is), ``"sentinel"`` (the master, or a replica, of a
            Sentinel-managed node) or ``"cluster"`` (a member of a Redis Cluster node);
            what its ACL must allow depends on it.
        tag: the hash tag of the keys asked about (``tenure._driver.acl.probe_keys``): on
            a Cluster member, one of the slots it serves.
        replica: a replica of a Sentinel-managed or Cluster node: what a failover
            promotes, checked as a future master (not the ``uptime`` and
            ``independent`` checks, and no probe, which writes).
        listed: the node as listed (its URL without credentials) when this server is
            one of a Sentinel-managed or Cluster node's; ``None`` for a plain node.
        cluster_state: a Cluster master's ``cluster_state`` (``CLUSTER INFO``): ``ok``,
            ``fail``, or why it could not be read.
        login: whether clients can log in as the user at all, read with ``--acl-user``
            (``ACL GETUSER``): its flags (``on``/``off``, ``nopass``, ...) and how many
            passwords it has; ``None`` when not read (logged in as the user itself,
            which shows that it can, or ``ACL GETUSER`` refused).
        db: the database the clients' connections select (the URL's ``/3``), 0 for
            none; a user who may not ``SELECT`` it fails every connection.
        client_name: the name the clients' connections give themselves (the URL's
            ``?client_name=``), if any; a user who may not ``CLIENT SETNAME`` fails every
            connection.
        sentinel_warnings: on the master of a Sentinel-managed node, what to say of
            each of its Sentinels that says something else than the one whose master
            the clients use (a master they cannot use, another master, none, or no
            answer: ``tenure._core.sentinel.Survey``), and of each that refuses the
            clients' subscription to its announcements of a failover, worded.
    """

    node: str
    error: str | None = None
    info: dict[str, str] | None = None
    info_error: str | None = None
    config: dict[str, str] | None = None
    config_error: str | None = None
    user: str | None = None
    access: dict[str, str | None] | None = None
    access_method: str | None = None
    access_error: str | None = None
    scripts: str | None = None
    key_prefix: str = DEFAULT_KEY_PREFIX
    kind: str = "plain"
    tag: str = "check"
    replica: bool = False
    listed: str | None = None
    cluster_state: str | None = None
    login: UserLogin | None = None
    db: int = 0
    client_name: str | None = None
    sentinel_warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class UserLogin:
    """What ``ACL GETUSER`` says about logging in as a user: its flags and passwords.

    ``ACL DRYRUN`` and the rules of ``ACL GETUSER`` judge a user's permissions whether or
    not anybody can log in as it: a user switched ``off``, or one with neither a password
    nor ``nopass``, passes them and still fails every client's ``AUTH``.
    """

    flags: tuple[str, ...]
    passwords: int


def evaluate(nodes: Sequence[NodeFacts], max_ttl: float = DEFAULT_MAX_TTL) -> list[Finding]:
    """Every finding for ``nodes``, node by node in the given order, checks in a fixed order."""
    independence = _independence(nodes)
    findings: list[Finding] = []
    for facts, independent in zip(nodes, independence, strict=True):
        if facts.error is not None:
            findings.append(Finding(facts.node, "reachable", Level.UNSAFE, facts.error))
            findings += check_sentinels(facts)
            continue
        findings += [check_server(facts), check_role(facts)]
        if facts.kind == "sentinel" and not facts.replica:
            findings.append(check_min_replicas(facts, max_ttl))
        findings += [check_persistence(facts), check_eviction(facts)]
        if not facts.replica:
            findings.append(check_uptime(facts, max_ttl))
        if independent is not None:
            findings.append(independent)
        findings += check_access(facts)
        findings += check_sentinels(facts)
    return findings


def exit_code(nodes: Sequence[NodeFacts], findings: Iterable[Finding]) -> int:
    """69 if fewer than a majority of the listed nodes answered, else 3 (UNSAFE), 1 (WARN)
    or 0. A Sentinel-managed or Cluster node answered when a master of it did."""
    answered: dict[str, bool] = {}
    for f in nodes:
        key = f.listed if f.listed is not None else f"{id(f)}"
        answered[key] = answered.get(key, False) or (f.error is None and not f.replica)
    if answered and sum(answered.values()) < majority(len(answered)):
        return EXIT_UNAVAILABLE
    worst = max((f.level.rank for f in findings), default=0)
    return {0: EXIT_OK, 1: EXIT_WARN, 2: EXIT_UNSAFE}[worst]


def check_sentinels(facts: NodeFacts) -> list[Finding]:
    """A row per Sentinel of the node that says something else than the one whose
    master the clients use (out of date, naming another master or none, not answering):
    WARN. The clients work (they use the master that one names), so nothing is unsafe;
    but the node has one Sentinel fewer than listed to find its master, and an operator
    should know."""
    node = facts.listed or facts.node
    return [Finding(node, "sentinels", Level.WARN, detail) for detail in facts.sentinel_warnings]


def check_server(facts: NodeFacts) -> Finding:
    """Which server this is, whether tenure supports its version, and whether tenure's
    scripts can run on it."""
    info = facts.info
    if info is None:
        return _cannot(facts, "server", "server version", facts.info_error, "INFO")
    server, version = _identify(info)
    unsupported = _scripts_unsupported(facts.scripts, info)
    if unsupported is not None:
        label = f"{server} {version}" if server else f"server {version}"
        return Finding(facts.node, "server", Level.UNSAFE, f"unsupported: {label}: {unsupported}")
    if not server:
        return Finding(
            facts.node,
            "server",
            Level.WARN,
            f"not Redis? INFO has no redis_version (server: {version}); untested: tenure "
            "supports Redis >= 6.2 and Valkey >= 7.2",
        )
    minimum = MINIMUM_VERSIONS.get(server)
    parsed = parse_version(version)
    if minimum is None:
        return Finding(
            facts.node,
            "server",
            Level.WARN,
            f"{server} {version} (reports redis_version {info.get('redis_version', 'none')}): "
            "untested; tenure supports Redis >= 6.2 and Valkey >= 7.2",
        )
    if server == "Redis" and parsed < (2, 6, 12):
        return Finding(
            facts.node,
            "server",
            Level.UNSAFE,
            f"Redis {version}: older than 2.6.12, which brought SET ... NX PX (Lua scripts "
            "came in 2.6.0); tenure cannot lock here",
        )
    if parsed < minimum:
        oldest = ".".join(map(str, minimum))
        return Finding(
            facts.node,
            "server",
            Level.WARN,
            f"{server} {version}: older than {server} {oldest}, the oldest tenure supports; "
            f"upgrade to {server} {oldest} or later",
        )
    reply = facts.scripts
    if reply is not None and reply != "OK" and _acl.denial(reply) is None:
        return Finding(
            facts.node,
            "server",
            Level.WARN,
            f"{server} {version}; the probe script failed ({_first_line(reply)}): cannot "
            "tell whether tenure's scripts run here",
        )
    denied = reply is not None and reply != "OK"
    note = "; scripts not permitted to this user (see the acl check)" if denied else ""
    return Finding(facts.node, "server", Level.OK, f"{server} {version}{note}")


def _identify(info: dict[str, str]) -> tuple[str, str]:
    """``(server, version)`` from ``INFO server`` (``("", what INFO says)`` for a server
    without ``redis_version``). Valkey reports ``redis_version`` 7.2.4
    (the Redis it is compatible with) whatever its own version, so its own fields come
    first."""
    name = info.get("server_name", "").lower()
    if "valkey_version" in info or name == "valkey":
        return "Valkey", info.get("valkey_version") or info.get("redis_version", "?")
    if "dragonfly_version" in info:
        return "Dragonfly", info["dragonfly_version"]
    if name and name != "redis":
        return info["server_name"], info.get(f"{name}_version") or info.get("redis_version", "?")
    if "redis_version" not in info:
        return "", info.get("server") or "unknown"
    return "Redis", info["redis_version"]


def _scripts_unsupported(reply: str | None, info: dict[str, str]) -> str | None:
    """Why tenure's scripts cannot run on a node, from the probe script's reply; ``None``
    if they can, or if the probe says nothing about the server (not tried, refused by
    the ACL: the ``acl`` check's business)."""
    if reply is None or reply == "OK" or _acl.denial(reply) is not None:
        return None
    upper, lower = reply.upper(), reply.lower()
    said = _first_line(reply)
    if upper.startswith(("CROSSSLOT", "MOVED", "ASK ", "CLUSTERDOWN")) or (
        info.get("cluster_enabled") == "1" and "slot" in lower
    ):
        return (
            f"cluster mode refuses a script declaring a lock key and the node's floor "
            f"({said}): every tenure script touches both, in different hash slots, so no "
            "lock operation can run on a cluster endpoint, even of one (virtual) node, "
            "listed as a plain node. List the cluster as one node, "
            "redis+cluster://host:port[,host:port...], whose keys a client keeps per hash "
            "slot (docs/cluster-and-sentinel.md), or use standalone servers (cluster mode "
            "disabled)"
        )
    if "unknown command" in lower or "disabled" in lower or "not supported" in lower:
        return (
            f"this server cannot run Lua scripts (EVAL: {said}): every tenure lock "
            "operation is one Lua script (EVAL), so tenure cannot lock here"
        )
    return None


def check_role(facts: NodeFacts) -> Finding:
    """A lock node must be a master of its own, without replicas that could take over."""
    info = facts.info
    if info is None:
        return _cannot(facts, "role", "role", facts.info_error, "INFO")
    role = info.get("role")
    if facts.listed is not None:
        return _managed_role(facts, info)
    if role in ("slave", "replica"):
        master = f"{info.get('master_host', '?')}:{info.get('master_port', '?')}"
        link = info.get("master_link_status", "?")
        read_only = (facts.config or {}).get("replica-read-only")
        writes = (
            "writes to it are lost at the next resync (replica-read-only no)"
            if read_only == "no"
            else "writes to it fail (READONLY)"
        )
        return Finding(
            facts.node,
            "role",
            Level.UNSAFE,
            f"a replica of {master} (link {link}): a lock node must be an independent "
            f"master; {writes}",
        )
    if role != "master":
        return Finding(facts.node, "role", Level.WARN, f"unknown role {role!r}")
    if info.get("cluster_enabled") == "1":
        return Finding(
            facts.node,
            "role",
            Level.WARN,
            "a Redis Cluster node: the cluster fails a master over to an async replica, "
            "which can lose grants; use independent masters, not a cluster",
        )
    replicas = _int(info.get("connected_slaves"), 0)
    if replicas > 0:
        where = [
            _replica_address(info[f"slave{i}"]) for i in range(replicas) if f"slave{i}" in info
        ]
        listed = f" ({', '.join(where)})" if where else ""
        return Finding(
            facts.node,
            "role",
            Level.WARN,
            f"a master with {replicas} connected replica(s){listed}: failing over to an "
            "async replica can lose grants; Redlock wants independent masters without "
            "failover",
        )
    return Finding(facts.node, "role", Level.OK, "master, no replicas")


_FAILOVER_IS_A_LOSS = (
    "a failover promotes an async replica that may lack the last grants: the new master "
    "sees its replication history changed and sits out max_ttl (docs/fencing.md), which "
    "is safe while fewer than a majority of the nodes lose their data, a failover "
    "counted as a loss, within max_ttl"
)


def _managed_role(facts: NodeFacts, info: dict[str, str]) -> Finding:
    """The role of a server of a Sentinel-managed or Cluster node: its master is expected
    to have replicas (a failover needs one), and a replica is what a failover promotes."""
    role = info.get("role")
    what = "Redis Cluster" if facts.kind == "cluster" else "Sentinel-managed"
    if facts.replica:
        if role not in ("slave", "replica"):
            return Finding(
                facts.node,
                "role",
                Level.WARN,
                f"listed as a replica but INFO says role {role!r}: a failover under way? "
                "run tenure check again",
            )
        master = f"{info.get('master_host', '?')}:{info.get('master_port', '?')}"
        link = info.get("master_link_status", "?")
        level = Level.OK if link == "up" else Level.WARN
        behind = "" if link == "up" else ": promoted now, it would lack what it missed"
        return Finding(
            facts.node,
            "role",
            level,
            f"replica of {master} (link {link}){behind}; checked as the master a failover "
            "may make it",
        )
    if role != "master":
        # The Sentinels (the slot map) named it master, and it says otherwise.
        return Finding(
            facts.node,
            "role",
            Level.WARN,
            f"named master of the {what} node but INFO says role {role!r}: a failover "
            "under way? run tenure check again",
        )
    replicas = _int(info.get("connected_slaves"), 0)
    if replicas == 0:
        return Finding(
            facts.node,
            "role",
            Level.OK,
            f"master of the {what} node, no replicas: nothing to fail over to",
        )
    return Finding(
        facts.node,
        "role",
        Level.WARN,
        f"master of the {what} node with {replicas} connected replica(s): {_FAILOVER_IS_A_LOSS}",
    )


def check_min_replicas(facts: NodeFacts, max_ttl: float = DEFAULT_MAX_TTL) -> Finding:
    """Whether the master of a Sentinel-managed node stops granting when cut off from its
    replicas (``min-replicas-to-write``, ``min-replicas-max-lag``): after a failover, an
    old master that still reaches some clients grants beside the new one, and the new
    one's ``max_ttl`` warm-up covers the old one's grants only if ``max_ttl`` is at least
    the longest TTL plus the lag (docs/cluster-and-sentinel.md, "An old master that keeps
    granting")."""
    config = facts.config or {}
    info = facts.info or {}
    need, lag = config.get("min-replicas-to-write"), config.get("min-replicas-max-lag")
    if need is None or lag is None:
        reason = facts.config_error or "CONFIG GET min-replicas-* answered nothing"
        return Finding(
            facts.node,
            "min-replicas",
            Level.WARN,
            f"cannot read min-replicas-to-write / min-replicas-max-lag ({reason}): unless "
            "they are set, an old master cut off from its Sentinels keeps granting after "
            "the failover; use wait_replicas >= 1 in the clients, or ask the provider",
        )
    wanted, max_lag = _int(need, 0), _int(lag, 0)
    if wanted < 1 or max_lag < 1:
        setting = (
            f"min-replicas-to-write {wanted}" if wanted < 1 else f"min-replicas-max-lag {max_lag}"
        )
        return Finding(
            facts.node,
            "min-replicas",
            Level.WARN,
            f"{setting}: a master cut off from its Sentinels and replicas but still "
            "reached by some clients keeps granting after the Sentinels promote a "
            "replica, so two masters grant the same lock; safe only if the clients use "
            "wait_replicas >= 1 (an isolated master's grants are never acknowledged). "
            "Set min-replicas-to-write 1 and min-replicas-max-lag L, with the clients' "
            "max_ttl at least their longest TTL plus L (docs/cluster-and-sentinel.md)",
        )
    if max_lag >= max_ttl:
        return Finding(
            facts.node,
            "min-replicas",
            Level.WARN,
            f"min-replicas-max-lag {max_lag} is not below max_ttl {max_ttl:g} s: an old "
            f"master cut off from its replicas grants for up to {max_lag} s more, and the "
            "new master's max_ttl warm-up outlasts those leases only if max_ttl is at "
            "least the longest TTL plus the lag: no TTL fits. Lower the lag, raise "
            "max_ttl (and --max-ttl), or use wait_replicas >= 1",
        )
    connected = _int(info.get("connected_slaves"), -1)
    if 0 <= connected < wanted:
        return Finding(
            facts.node,
            "min-replicas",
            Level.WARN,
            f"min-replicas-to-write {wanted} but {connected} replica(s) connected: the "
            "master refuses every write now, so this node grants nothing until a replica "
            "is back (a risk to liveness, not to safety)",
        )
    return Finding(
        facts.node,
        "min-replicas",
        Level.OK,
        f"min-replicas-to-write {wanted}, min-replicas-max-lag {max_lag}: a master cut off "
        f"from its replicas stops granting within {max_lag} s; safe with leases of at "
        f"most max_ttl - {max_lag} s ({max_ttl - max_lag:g} s with max_ttl {max_ttl:g} s), "
        "whose last one from the old master the new master's warm-up outlasts",
    )


def check_slots(node: str, unserved: int, masters: int, states: Sequence[str]) -> Finding:
    """Whether every slot of a Cluster node has a master: ``unserved`` slots without one
    in its slot map, ``masters`` serving the rest, ``states`` each master's
    ``cluster_state`` (``ok``/``fail``; ``?`` unread)."""
    failing = sum(1 for s in states if s == "fail")
    if unserved:
        return Finding(
            node,
            "slots",
            Level.UNSAFE,
            f"{unserved} of {SLOTS} slots have no master in the slot map: the locks of "
            "those slots get no vote from this node (it is unreachable for them) until "
            "a master serves them",
        )
    if failing:
        return Finding(
            node,
            "slots",
            Level.UNSAFE,
            f"every slot has a master, but {failing} of {masters} master(s) say "
            "cluster_state:fail: they answer CLUSTERDOWN, and their slots get no vote",
        )
    unread = [s for s in states if s != "ok"]
    note = f" (cluster_state not read on {len(unread)}: {unread[0]})" if unread else ""
    return Finding(
        node,
        "slots",
        Level.OK,
        f"all {SLOTS} slots served by {masters} master(s), cluster_state ok{note}",
    )


def check_persistence(facts: NodeFacts) -> Finding:
    """What survives a crash: decides whether a restart can forget grants unnoticed."""
    config = facts.config or {}
    appendonly = config.get("appendonly")
    if appendonly is None:
        reason = facts.config_error or "CONFIG GET appendonly answered nothing"
        detail = f"cannot read persistence settings ({reason})"
        if _disabled(reason):
            detail += (
                ": CONFIG is disabled or renamed, as managed services do, so the provider's "
                "settings decide what a node keeps across a restart or a failover. tenure "
                "recognises a node that comes back empty, restored from a snapshot or "
                "replaced by a replica (a new replication history) and keeps it out for "
                "max_ttl, but not data restored by hand without a restart: ask the provider "
                "which can happen, and count such a node as one that can lose grants "
                "(docs/deployment.md)"
            )
        aof = (facts.info or {}).get("aof_enabled")
        if aof is not None:
            detail += f"; INFO says AOF is {'on' if aof == '1' else 'off'}"
        return Finding(facts.node, "persistence", Level.WARN, detail)
    if appendonly.lower() == "yes":
        fsync = config.get("appendfsync", "?").lower()
        if fsync == "always":
            return Finding(
                facts.node,
                "persistence",
                Level.OK,
                "appendonly yes, appendfsync always: a grant is on disk before it is acknowledged",
            )
        window = {"everysec": "~1 s", "no": "~30 s (kernel writeback)"}.get(fsync)
        if window is None:
            return Finding(
                facts.node, "persistence", Level.WARN, f"appendonly yes, appendfsync {fsync}?"
            )
        return Finding(
            facts.node,
            "persistence",
            Level.WARN,
            f"appendonly yes, appendfsync {fsync}: a crash of the host (not of redis-server "
            f"alone) loses up to {window} of acknowledged grants, keeping an older floor. "
            "tenure recognises the restart by its new replication history and keeps the "
            "node out for max_ttl, except in the first restart after an upgrade from a "
            "tenure that kept no history (docs/fencing.md); appendfsync always loses "
            "nothing",
        )
    save = config.get("save")
    if save is not None and save.strip() not in ("", '""'):
        return Finding(
            facts.node,
            "persistence",
            Level.WARN,
            f"appendonly no with RDB snapshots (save {save}): a crash restarts from the last "
            "snapshot, missing the grants made since but with an older floor. tenure "
            "recognises the restart by its new replication history and keeps the node out "
            "for max_ttl, except in the first restart after an upgrade from a tenure that "
            "kept no history, or for a snapshot restored by hand without a restart "
            "(docs/fencing.md). appendonly yes + appendfsync always, or no persistence "
            '(save "") leave no such case',
        )
    snapshots = "save unknown" if save is None else 'save ""'
    return Finding(
        facts.node,
        "persistence",
        Level.WARN,
        f"no AOF (appendonly no, {snapshots}): a restart comes back without data; tenure "
        "keeps the node out for max_ttl after it notices; see docs/fencing.md. Safe while "
        "fewer than a majority of the nodes lose their data within max_ttl (a restart with "
        "its data on disk warms up too: it starts a new replication history)",
    )


def check_eviction(facts: NodeFacts) -> Finding:
    """Whether Redis may evict a held lock under memory pressure: only ``noeviction`` is safe."""
    config = facts.config or {}
    info = facts.info or {}
    policy = config.get("maxmemory-policy") or info.get("maxmemory_policy")
    if policy is None:
        reason = facts.config_error or "CONFIG GET maxmemory-policy answered nothing"
        return Finding(
            facts.node, "eviction", Level.WARN, f"cannot read maxmemory-policy ({reason})"
        )
    maxmemory = config.get("maxmemory") or info.get("maxmemory")
    unlimited = maxmemory == "0"
    if policy == "noeviction":
        return Finding(
            facts.node,
            "eviction",
            Level.OK,
            "noeviction: keys are never evicted (a full node refuses writes instead)",
        )
    if policy.startswith(("volatile-", "allkeys-")):
        # Every lock key has a TTL (it is how a crashed holder's lock ends), so the
        # volatile-* policies, which evict only keys with a TTL, pick among lock keys
        # too; allkeys-* pick among every key. tenure verify eviction shows it.
        victims = (
            "keys with a TTL, and every lock key has one"
            if policy.startswith("volatile-")
            else "any key, lock keys included"
        )
        breaks = (
            f"{policy}: under memory pressure Redis evicts {victims}, so a held lock can "
            "vanish and a second client acquire it: mutual exclusion breaks (tenure verify "
            "eviction shows it). Use noeviction: a full node then refuses new writes "
            "(acquires fail) and keeps the locks it holds"
        )
        if unlimited:
            return Finding(
                facts.node,
                "eviction",
                Level.WARN,
                f"{breaks}. Nothing is evicted while maxmemory is 0 (no limit), but setting a "
                "limit later makes it unsafe",
            )
        return Finding(facts.node, "eviction", Level.UNSAFE, breaks)
    return Finding(facts.node, "eviction", Level.WARN, f"unknown maxmemory-policy {policy!r}")


def check_uptime(facts: NodeFacts, max_ttl: float) -> Finding:
    """A node (re)started within ``max_ttl`` may have forgotten leases that are still valid."""
    info = facts.info
    if info is None:
        return _cannot(facts, "uptime", "uptime", facts.info_error, "INFO")
    uptime = _int(info.get("uptime_in_seconds"), -1)
    if uptime < 0:
        return Finding(facts.node, "uptime", Level.WARN, "INFO has no uptime_in_seconds")
    if uptime >= max_ttl:
        return Finding(facts.node, "uptime", Level.OK, f"up {_duration(uptime)}")
    config = facts.config or {}
    if config.get("appendonly") == "yes" and config.get("appendfsync") == "always":
        return Finding(
            facts.node,
            "uptime",
            Level.OK,
            f"started {uptime} s ago (less than max_ttl {max_ttl:g} s), with AOF fsync'd "
            "on every write: it came back with all its data",
        )
    return Finding(
        facts.node,
        "uptime",
        Level.WARN,
        f"(re)started {uptime} s ago (less than max_ttl {max_ttl:g} s): leases it granted "
        f"before may still be valid; {_DATA_LOSS_NOTE}",
    )


def check_independence(nodes: Sequence[NodeFacts]) -> list[Finding]:
    """Whether the nodes are independent servers: no ``run_id`` or ``master_replid`` twice."""
    return [f for f in _independence(nodes) if f is not None]


def _independence(nodes: Sequence[NodeFacts]) -> list[Finding | None]:
    """One finding per node (``None``: not checkable or alone), in the order of ``nodes``."""
    readable = [f for f in nodes if f.error is None and f.info is not None and not f.replica]
    by_run: dict[str, list[NodeFacts]] = {}
    by_set: dict[str, list[NodeFacts]] = {}
    for facts in readable:
        info = facts.info or {}
        if run_id := info.get("run_id"):
            by_run.setdefault(run_id, []).append(facts)
        if replid := info.get("master_replid"):
            by_set.setdefault(replid, []).append(facts)
    findings: list[Finding | None] = []
    for facts in nodes:
        if facts.error is not None or facts.info is None or len(nodes) < 2 or facts.replica:
            findings.append(None)
            continue
        info = facts.info or {}
        run_id, replid = info.get("run_id", ""), info.get("master_replid", "")
        twins = [o for o in by_run.get(run_id, []) if o is not facts]
        kin = [
            o for o in by_set.get(replid, []) if o is not facts and all(o is not t for t in twins)
        ]
        if twins:
            finding = Finding(
                facts.node,
                "independent",
                Level.UNSAFE,
                f"the same server as {', '.join(o.node for o in twins)} (run_id "
                f"{run_id[:8]}...): one server counted as several votes, so its crash or data "
                "loss costs them all at once",
            )
        elif kin:
            finding = Finding(
                facts.node,
                "independent",
                Level.UNSAFE,
                f"one replication set with {', '.join(o.node for o in kin)} (master_replid "
                f"{replid[:8]}...): not independent masters; replication copies grants "
                "between them and a failover can lose them",
            )
        elif not run_id:
            finding = Finding(facts.node, "independent", Level.WARN, "INFO has no run_id")
        else:
            finding = Finding(
                facts.node,
                "independent",
                Level.OK,
                "no other node shares its run_id or replication ID",
            )
        findings.append(finding)
    return findings


def check_access(facts: NodeFacts) -> list[Finding]:
    """Whether the node's ACL lets tenure send everything it sends (see :mod:`tenure._driver.acl`):
    UNSAFE naming what is refused and the ``ACL SETUSER`` line that grants it; UNSAFE too
    when nobody can log in as the user (``--acl-user``: switched off, or no password)."""
    findings = _check_permissions(facts)
    refusal = _login_refused(facts)
    if refusal is None:
        return findings
    who, (why, grant) = f"user {facts.user!r}" if facts.user else "the user", refusal
    permitted = [f for f in findings if f.level is Level.OK]
    also = " (its permissions are enough otherwise)" if permitted else ""
    login = Finding(
        facts.node,
        "acl",
        Level.UNSAFE,
        f"{who} {why}: every client logging in as it is refused (WRONGPASS), so tenure "
        f"cannot lock on this node{also}. Fix: ACL SETUSER {facts.user or 'default'} {grant}",
    )
    # A permission row that is not OK stays: it names what to grant besides.
    return [login, *(f for f in findings if f.level is not Level.OK)]


def _login_refused(facts: NodeFacts) -> tuple[str, str] | None:
    """Why nobody can log in as the user, and the ``ACL SETUSER`` rule that fixes it."""
    if facts.login is None:
        return None
    whys, grants = [], []
    if "off" in facts.login.flags:
        whys.append("is switched off")
        grants.append("on")
    if facts.login.passwords == 0 and "nopass" not in facts.login.flags:
        whys.append("has no password (and is not nopass)")
        grants.append(">PASSWORD")
    return (" and ".join(whys), " ".join(grants)) if whys else None


def _check_permissions(facts: NodeFacts) -> list[Finding]:
    who = f"user {facts.user!r}" if facts.user else "the user"
    if facts.access is None:
        if facts.access_error is None:
            return []
        return [
            Finding(
                facts.node,
                "acl",
                Level.WARN,
                f"cannot check the permissions of {who}: {facts.access_error}",
            )
        ]
    prefix = facts.key_prefix
    version = parse_version((facts.info or {}).get("redis_version", "0"))
    needs = _acl.needs(
        prefix, facts.kind, version, facts.tag, db=facts.db, client_name=facts.client_name
    )
    wanted = {n.name: n for n in needs}
    method = facts.access_method or "probe"
    refused: dict[str, str] = {}  # command -> "command" | "key" | "channel"
    texts: dict[str, str] = {}
    # Never OK for a command nobody asked about (a reply that was cut short, say).
    failed = {c: "not checked" for c in wanted if c not in facts.access}
    for command, text in facts.access.items():
        if not text:
            continue
        kind = _acl.denial(text)
        if kind is None:
            failed[command] = text
        else:
            refused[command], texts[command] = kind, text
    if refused:
        required = [c for c in refused if c not in wanted or wanted[c].only is None]
        first = texts[(required or list(refused))[0]]
        fix = _acl.fix_line(facts.user or "default", refused, prefix)
        # A connection's SELECT or CLIENT SETNAME comes from the URL: changing it does too.
        fix += "".join(
            f" (or {wanted[c].instead} instead of +{c.lower()})"
            for c in refused
            if c in wanted and wanted[c].instead
        )
        what = ", ".join(_refused_item(c, kind, prefix) for c, kind in refused.items())
        unchecked = (
            f"; not checked: {', '.join(failed)} ({_first_line(next(iter(failed.values())))}): "
            "run tenure check again after the fix"
            if failed
            else ""
        )
        if required:
            return [
                Finding(
                    facts.node,
                    "acl",
                    Level.UNSAFE,
                    f"{who} may not run {what} ({method}: {_first_line(first)}); tenure "
                    f"cannot lock on this node. Fix: {fix}{unchecked}",
                )
            ]
        when = "; ".join(f"{c} only {wanted[c].only}" for c in refused)
        return [
            Finding(
                facts.node,
                "acl",
                Level.WARN,
                f"{who} may not run {what} ({method}: {_first_line(first)}); tenure sends "
                f"{when}. Fix if you use that: {fix}{unchecked}",
            )
        ]
    if failed:
        text = next(iter(failed.values()))
        return [
            Finding(
                facts.node,
                "acl",
                Level.WARN,
                f"the {method} of {', '.join(failed)} failed: {_first_line(text)}",
            )
        ]
    direct = [n.name for n in wanted.values() if n.where != "scripts"]
    scripted = sorted(n.name for n in wanted.values() if "scripts" in n.where)
    return [
        Finding(
            facts.node,
            "acl",
            Level.OK,
            f"{who} may run everything tenure sends ({', '.join(direct)}; in scripts: "
            f"{', '.join(scripted)}) on keys {_acl.key_pattern(prefix)} and channels "
            f"{_acl.channel_pattern(prefix)} ({method})",
        )
    ]


def _refused_item(command: str, kind: str, prefix: str) -> str:
    if kind == "key":
        return f"{command} on keys {_acl.key_pattern(prefix)}"
    if kind == "channel":
        return f"{command} on channels {_acl.channel_pattern(prefix)}"
    return command


def _cannot(facts: NodeFacts, check: str, what: str, reason: str | None, command: str) -> Finding:
    return Finding(
        facts.node, check, Level.WARN, f"cannot read {what} ({reason or command + ' failed'})"
    )


def _disabled(reason: str) -> bool:
    """Whether a command's error says it does not exist here (disabled or renamed)."""
    lower = reason.lower()
    return "unknown command" in lower or "unknown subcommand" in lower


def parse_version(text: str) -> tuple[int, ...]:
    """``"7.2.4"`` -> ``(7, 2, 4)``: the leading digits of each part, up to the first
    part without any (``"6.2-rc1"`` -> ``(6, 2)``)."""
    parts: list[int] = []
    for piece in text.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def _int(text: str | None, default: int) -> int:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default


def _duration(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} days"


def _replica_address(text: str) -> str:
    fields = dict(part.partition("=")[::2] for part in text.split(","))
    return f"{fields.get('ip', '?')}:{fields.get('port', '?')}"


def _first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else text

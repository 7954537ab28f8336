"""``tenure check``: inspect the lock nodes and say what threatens the lock's safety.

``tenure check [--redis URL ...] [--max-ttl SECONDS] [--acl-user NAME] [--json]``

Every node is read in parallel with a plain redis-py client (the same connection options
as ``tenure status``: no retries, RESP2, short timeouts). One pipelined round reads
``INFO``, ``CONFIG GET`` of the settings below and ``ACL WHOAMI``; a second checks that
the node lets tenure run its commands (``ACL DRYRUN`` on Redis >= 7, ``ACL GETUSER`` on
6.2, where the user may use them; otherwise the real, harmless operations on the probe
keys ``tenure:{check}:probe``, which expires after 2 s even if it cannot be deleted, and
``tenure:{check}:probe:q``, emptied at once). Nothing else is written.

The module has two halves. *Gathering* (:func:`gather`) turns a node into a
:class:`NodeFacts` of plain strings and dicts. *Evaluation* (:func:`evaluate` and the
``check_*`` functions) is pure: facts in, :class:`Finding` s out, so every rule below is
unit-tested without a server.

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
    ``appendonly yes`` + ``appendfsync always``: OK. ``everysec`` (or ``no``): WARN, a
    crash of the *host* loses the last second (or ~30 s) of acknowledged writes. No AOF
    and no RDB (``save ""``): WARN, a restart comes back empty, which tenure detects (no
    floor: the node's record of the tokens it issued) and answers with a ``max_ttl``
    warm-up (docs/fencing.md). No AOF
    but RDB snapshots: UNSAFE, a crash restarts from an old snapshot whose older
    counters tenure cannot tell from current ones, so grants made since are forgotten
    unnoticed.
``eviction``
    ``noeviction``: OK. Any ``volatile-*`` or ``allkeys-*`` policy: UNSAFE, since every
    lock key has a TTL and so can be evicted while held (``tenure verify eviction``
    shows it for ``volatile-ttl``, ``volatile-lru`` and ``allkeys-lru``); WARN while
    ``maxmemory`` is 0, since nothing is evicted until a limit is set.
``role``
    A replica: UNSAFE. A master with replicas, or a Redis Cluster node: WARN (failover to
    an async replica can lose grants). A master alone: OK.
``independent``
    Two entries with the same ``run_id`` (the same server listed twice) or the same
    ``master_replid`` (one replication set): UNSAFE, their votes are not independent.
``uptime``
    Started less than ``--max-ttl`` ago: WARN, unless AOF with ``appendfsync always``
    brought its data back (OK).
``server``
    ``redis_version`` < 2.6.12 (no ``SET ... PX``, no Lua): UNSAFE; < 6.2: WARN
    (untested); not Redis (no ``redis_version``, or a fork such as Valkey or Dragonfly):
    WARN (untested).
``acl``
    Whether the user may send everything tenure sends (:mod:`tenure._driver.acl`: the commands
    of the lock scripts, read from their Lua source, and the drivers' ``EVAL``,
    ``EXISTS``, ``SUBSCRIBE``, ``WAIT``) on keys ``tenure:*`` and channels
    ``tenure:wake:*``. Asked with ``ACL DRYRUN`` on Redis >= 7 (and Valkey), with ``ACL
    GETUSER`` + ``COMMAND INFO`` on 6.2, or, where the user may not use those, by running
    each command harmlessly. Anything refused: UNSAFE, naming it, with the ``ACL SETUSER``
    line that grants it; only ``WAIT`` refused: WARN (sent only with ``wait_replicas``).
``reachable``
    Unreachable, or the login failed: UNSAFE, and nothing else is checked on that node.

Commands that are not permitted degrade one check to WARN ("cannot read persistence
settings (CONFIG not permitted)") instead of failing the run; ``INFO memory`` stands in
for ``CONFIG GET maxmemory-policy`` where it can.

Exit codes
----------
== ======================================================================================
0  every finding is OK
1  warnings, nothing UNSAFE
2  usage error (no nodes, a malformed URL or option)
3  at least one UNSAFE finding
69 fewer than a majority of the nodes answered (EX_UNAVAILABLE, as ``tenure status``)
== ======================================================================================
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import unquote, urlsplit

import redis

from ._core.config import NodeAddress, parse_node_url
from ._core.quorum import majority
from ._driver import acl as _acl
from ._driver.redis_compat import connection_kwargs
from ._errors import ConfigurationError

__all__ = [
    "CHECK_EXIT_CODES",
    "EXIT_OK",
    "EXIT_UNAVAILABLE",
    "EXIT_UNSAFE",
    "EXIT_WARN",
    "Finding",
    "Level",
    "NodeFacts",
    "check",
    "check_access",
    "check_eviction",
    "check_independence",
    "check_persistence",
    "check_role",
    "check_server",
    "check_uptime",
    "evaluate",
    "exit_code",
    "gather",
]

EXIT_OK = 0
EXIT_WARN = 1
EXIT_UNSAFE = 3
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE (sysexits.h), as tenure status and tenure run

# For --help (kept next to the codes so the two cannot drift apart).
CHECK_EXIT_CODES = """\
levels:
  OK      nothing found that threatens safety
  WARN    safe only under a stated assumption, or could not be checked
  UNSAFE  mutual exclusion or fencing can break, or tenure cannot work on the node

exit codes:
  0   every finding is OK
  1   warnings, nothing UNSAFE
  2   usage error (no --redis/TENURE_REDIS, bad option or URL)
  3   at least one UNSAFE finding
  69  fewer than a majority of the nodes answered

Where neither ACL DRYRUN (Redis >= 7) nor ACL GETUSER (6.2) may be used, the ACL check
runs each command for real: it writes the probe keys tenure:{check}:probe (2 s TTL) and
tenure:{check}:probe:q, deletes them at once, and publishes to tenure:wake:check-probe.
Nothing else is written. See docs/deployment.md.
"""

_DEFAULT_MAX_TTL = 60.0

# What CONFIG GET reads (one pattern per call: Redis < 7 takes only one).
CONFIG_KEYS = (
    "appendonly",
    "appendfsync",
    "save",
    "maxmemory-policy",
    "maxmemory",
    "replica-read-only",
)

# Runs calls given in ARGV as (count, command, args...)... and reports, per call, "OK" or
# the error (an ACL refusal is an error reply that pcall catches, in 6.2 and 7 alike),
# then deletes the probe keys it was given.
_PROBE_SCRIPT = """\
local out, i = {}, 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local reply = redis.pcall(unpack(ARGV, i + 1, i + n))
  if type(reply) == "table" and reply.err then
    out[#out + 1] = reply.err
  else
    out[#out + 1] = "OK"
  end
  i = i + n + 1
end
redis.pcall("DEL", unpack(KEYS))
return out
"""

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


# --- evaluation (pure) ------------------------------------------------------------------


def evaluate(nodes: Sequence[NodeFacts], max_ttl: float = _DEFAULT_MAX_TTL) -> list[Finding]:
    """Every finding for ``nodes``, node by node in the given order, checks in a fixed order."""
    independence = _independence(nodes)
    findings: list[Finding] = []
    for facts, independent in zip(nodes, independence, strict=True):
        if facts.error is not None:
            findings.append(Finding(facts.node, "reachable", Level.UNSAFE, facts.error))
            continue
        findings += [
            check_server(facts),
            check_role(facts),
            check_persistence(facts),
            check_eviction(facts),
            check_uptime(facts, max_ttl),
        ]
        if independent is not None:
            findings.append(independent)
        findings += check_access(facts)
    return findings


def exit_code(nodes: Sequence[NodeFacts], findings: Iterable[Finding]) -> int:
    """69 if fewer than a majority answered, else 3 (UNSAFE), 1 (WARN) or 0."""
    answered = sum(1 for f in nodes if f.error is None)
    if nodes and answered < majority(len(nodes)):
        return EXIT_UNAVAILABLE
    worst = max((f.level.rank for f in findings), default=0)
    return {0: EXIT_OK, 1: EXIT_WARN, 2: EXIT_UNSAFE}[worst]


def check_server(facts: NodeFacts) -> Finding:
    """Which server this is, and whether tenure can work on (and was tested with) it."""
    info = facts.info
    if info is None:
        return _cannot(facts, "server", "server version", facts.info_error, "INFO")
    version = info.get("redis_version")
    if version is None:
        server = info.get("server_name") or info.get("server") or "unknown"
        return Finding(
            facts.node,
            "server",
            Level.WARN,
            f"not Redis? INFO has no redis_version (server: {server}); tenure is tested on "
            "Redis only",
        )
    for fork, key in (("Valkey", "valkey_version"), ("Dragonfly", "dragonfly_version")):
        if key in info:
            return Finding(
                facts.node,
                "server",
                Level.WARN,
                f"not Redis: {fork} {info[key]} (reports redis_version {version}); tenure is "
                "tested on Redis only",
            )
    parsed = _version(version)
    if parsed < (2, 6, 12):
        return Finding(
            facts.node,
            "server",
            Level.UNSAFE,
            f"Redis {version}: older than 2.6.12, which brought SET ... NX PX (Lua scripts "
            "came in 2.6.0); tenure cannot lock here",
        )
    if parsed < (6, 2):
        return Finding(
            facts.node,
            "server",
            Level.WARN,
            f"Redis {version}: older than 6.2, untested by tenure",
        )
    return Finding(facts.node, "server", Level.OK, f"Redis {version}")


def check_role(facts: NodeFacts) -> Finding:
    """A lock node must be a master of its own, without replicas that could take over."""
    info = facts.info
    if info is None:
        return _cannot(facts, "role", "role", facts.info_error, "INFO")
    role = info.get("role")
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


def check_persistence(facts: NodeFacts) -> Finding:
    """What survives a crash: decides whether a restart can forget grants unnoticed."""
    config = facts.config or {}
    appendonly = config.get("appendonly")
    if appendonly is None:
        reason = facts.config_error or "CONFIG GET appendonly answered nothing"
        detail = f"cannot read persistence settings ({reason})"
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
            f"alone) loses up to {window} of acknowledged grants. tenure's data-loss "
            "detection and max_ttl warm-up cover a node that lost its floor, "
            "not one that kept an older floor, so after a host crash keep the node out for "
            "max_ttl before restarting it, or use appendfsync always",
        )
    save = config.get("save")
    if save is not None and save.strip() not in ("", '""'):
        return Finding(
            facts.node,
            "persistence",
            Level.UNSAFE,
            f"appendonly no with RDB snapshots (save {save}): a crash restarts from the last "
            "snapshot, missing the grants made since but with older fencing counters, which "
            "tenure cannot tell from a healthy node, so a second client can win a majority"
            '. Use appendonly yes + appendfsync always, or no persistence (save "") so '
            "that a restart comes back empty and is detected",
        )
    snapshots = "save unknown" if save is None else 'save ""'
    return Finding(
        facts.node,
        "persistence",
        Level.WARN,
        f"no AOF (appendonly no, {snapshots}): a restart comes back without data; tenure "
        "keeps the node out for max_ttl after it notices; see docs/fencing.md. Safe while "
        "fewer than a majority of the nodes lose their data within max_ttl; appendonly yes "
        "+ appendfsync always avoids the warm-up",
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
    readable = [f for f in nodes if f.error is None and f.info is not None]
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
        if facts.error is not None or facts.info is None or len(nodes) < 2:
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
    UNSAFE naming what is refused and the ``ACL SETUSER`` line that grants it."""
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
    wanted = {need.command: need for need in _acl.needs()}
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
        fix = _acl.fix_line(facts.user or "default", refused)
        what = ", ".join(_refused_item(c, kind) for c, kind in refused.items())
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
    direct = [n.command for n in wanted.values() if n.where != "scripts"]
    scripted = sorted(n.command for n in wanted.values() if n.where != "direct")
    return [
        Finding(
            facts.node,
            "acl",
            Level.OK,
            f"{who} may run everything tenure sends ({', '.join(direct)}; in scripts: "
            f"{', '.join(scripted)}) on keys {_acl.KEY_PATTERN} and channels "
            f"{_acl.CHANNEL_PATTERN} ({method})",
        )
    ]


def _refused_item(command: str, kind: str) -> str:
    if kind == "key":
        return f"{command} on keys {_acl.KEY_PATTERN}"
    if kind == "channel":
        return f"{command} on channels {_acl.CHANNEL_PATTERN}"
    return command


def _cannot(facts: NodeFacts, check: str, what: str, reason: str | None, command: str) -> Finding:
    return Finding(
        facts.node, check, Level.WARN, f"cannot read {what} ({reason or command + ' failed'})"
    )


def _version(text: str) -> tuple[int, ...]:
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


# --- gathering ---------------------------------------------------------------------------


def gather(address: NodeAddress, timeout: float, acl_user: str | None = None) -> NodeFacts:
    """Read one node (two pipelined rounds); never raises for the node's own failures.

    ``acl_user``: whose permissions to check (default: the user this login is).
    """
    facts = NodeFacts(node=address.display)
    options = connection_kwargs(timeout, asyncio=False, unix=address.scheme == "unix")
    options["socket_timeout"] = timeout
    client = redis.Redis.from_url(address.url, decode_responses=True, **options)
    try:
        try:
            _read_state(client, facts)
        except redis.AuthenticationError as exc:
            facts.error = f"login failed: {_one_line(exc)}"
        except redis.ResponseError as exc:  # e.g. SELECT refused while connecting
            facts.error = f"connection set-up refused: {_one_line(exc)}"
        except (redis.RedisError, OSError) as exc:
            facts.error = f"unreachable: {_one_line(exc)}"
        if facts.error is not None:
            return facts
        if facts.user is None:
            facts.user = unquote(urlsplit(address.url).username or "") or None
        try:
            _read_access(client, facts, acl_user)
        except (redis.RedisError, OSError) as exc:
            facts.access_error = _one_line(exc)
    finally:
        client.close()
    return facts


def _read_state(client: redis.Redis, facts: NodeFacts) -> None:
    with client.pipeline(transaction=False) as pipe:
        pipe.info()
        for key in CONFIG_KEYS:
            pipe.config_get(key)
        pipe.acl_whoami()
        replies = pipe.execute(raise_on_error=False)
    info, *configs, whoami = replies
    if isinstance(info, redis.AuthenticationError):
        raise info  # NOAUTH: a password is required
    if isinstance(info, Exception):
        facts.info_error = _refusal(info, "INFO")
    else:
        facts.info = _flatten(info)
    config: dict[str, str] = {}
    for key, reply in zip(CONFIG_KEYS, configs, strict=True):
        if isinstance(reply, Exception):
            facts.config_error = facts.config_error or _refusal(reply, "CONFIG")
        elif isinstance(reply, dict) and key in reply:
            config[key] = str(reply[key])
    facts.config = config if config or facts.config_error is None else None
    if not isinstance(whoami, Exception) and whoami:
        facts.user = str(whoami)


def _read_access(client: redis.Redis, facts: NodeFacts, acl_user: str | None) -> None:
    """Ask the node what the user may run: ``ACL DRYRUN`` (Redis >= 7), else ``ACL
    GETUSER`` (6.2), else, where the user may use neither, try every command for real
    (only possible for the user this login is, not for ``acl_user``)."""
    info = facts.info or {}
    if info.get("role") in ("slave", "replica"):
        return  # not probed (the probe writes); the role check already says UNSAFE
    if acl_user is not None:
        facts.user = acl_user
    user = facts.user or "default"
    needs = _acl.needs()
    if _version(info.get("redis_version", "0")) >= (7,):
        answers = _dry_run(client, user, needs)
        method = "ACL DRYRUN"
    else:
        answers = _get_user(client, user, needs)
        method = "ACL GETUSER"
    if answers is None and acl_user is not None:
        facts.access_error = (
            f"--acl-user needs a login that may run {method} (or log in as "
            f"{acl_user!r} and leave --acl-user out)"
        )
        return
    if answers is None:
        answers = _probe(client, needs)
        method = "probe"
    facts.access = answers
    facts.access_method = method


def _dry_run(client: redis.Redis, user: str, needs: Sequence[_acl.Need]) -> _Answers | None:
    """``ACL DRYRUN`` of every command; None if DRYRUN itself is refused."""
    with client.pipeline(transaction=False) as pipe:
        for need in needs:
            pipe.acl_dryrun(user, *need.call)
        replies = pipe.execute(raise_on_error=False)
    if all(isinstance(r, Exception) for r in replies):
        return None  # DRYRUN not permitted to this user: try another way
    return {need.command: _answer(reply) for need, reply in zip(needs, replies, strict=True)}


def _get_user(client: redis.Redis, user: str, needs: Sequence[_acl.Need]) -> _Answers | None:
    """Redis 6.2's rules for ``user`` (``ACL GETUSER``) and the commands' categories
    (``COMMAND INFO``), evaluated; None if either is refused or unreadable."""
    with client.pipeline(transaction=False) as pipe:
        pipe.execute_command("ACL", "GETUSER", user)  # type: ignore[no-untyped-call]
        pipe.execute_command("COMMAND", "INFO", *(n.command for n in needs))  # type: ignore[no-untyped-call]
        described, commands = pipe.execute(raise_on_error=False)
    rules = _pairs(described)
    if rules is None or isinstance(commands, Exception):
        return None
    flags = {str(f) for f in rules.get("flags") or []}
    rule_text = rules.get("commands")
    if not isinstance(rule_text, str):
        return None  # not 6.2's shape (Redis >= 7 answers DRYRUN instead)
    keys = None if "allkeys" in flags else [str(k) for k in rules.get("keys") or []]
    channels = None if "allchannels" in flags else [str(c) for c in rules.get("channels") or []]
    answers: _Answers = {}
    for need in needs:
        categories = _categories(commands, need.command)
        if categories is None:
            return None
        answers[need.command] = _acl.permitted_by_rules(need, rule_text, categories, keys, channels)
    return answers


def _probe(client: redis.Redis, needs: Sequence[_acl.Need]) -> _Answers:
    """Run every command for real, harmlessly: the scripts' commands inside one probe
    script (so a refusal there is what a lock script would meet), the others directly,
    ``SUBSCRIBE`` on a connection of its own."""
    scripted = [n for n in needs if n.where == "scripts"]
    argv: list[str] = []
    for need in scripted:
        argv += [str(len(need.call)), *need.call]
    direct = [n for n in needs if n.where != "scripts" and n.command not in ("EVAL", "SUBSCRIBE")]
    with client.pipeline(transaction=False) as pipe:
        pipe.eval(_PROBE_SCRIPT, 2, _acl.PROBE_KEY, _acl.PROBE_QUEUE, *argv)
        for need in direct:
            pipe.execute_command(*need.call)  # type: ignore[no-untyped-call]
        script_reply, *direct_replies = pipe.execute(raise_on_error=False)
    answers: _Answers = {}
    if isinstance(script_reply, Exception):
        answers["EVAL"] = _one_line(script_reply)
        for need in scripted:
            answers[need.command] = "the probe script could not run"
    elif isinstance(script_reply, list) and len(script_reply) == len(scripted):
        answers["EVAL"] = None
        for need, reply in zip(scripted, script_reply, strict=True):
            answers[need.command] = None if reply == "OK" else str(reply)
    else:
        answers["EVAL"] = f"unexpected reply to the probe script: {script_reply!r}"
    for need, reply in zip(direct, direct_replies, strict=True):
        answers[need.command] = _one_line(reply) if isinstance(reply, Exception) else None
    answers["SUBSCRIBE"] = _probe_subscribe(client)
    return answers


def _probe_subscribe(client: redis.Redis) -> str | None:
    conn = client.connection_pool.make_connection()
    try:
        conn.connect()  # type: ignore[no-untyped-call]
        conn.send_command("SUBSCRIBE", _acl.PROBE_CHANNEL)  # type: ignore[no-untyped-call]
        conn.read_response()
        return None
    except redis.ResponseError as exc:
        return _one_line(exc)
    finally:
        conn.disconnect()  # type: ignore[no-untyped-call]


_Answers = dict[str, "str | None"]


def _answer(reply: object) -> str | None:
    if isinstance(reply, Exception):
        return _one_line(reply)
    return None if str(reply) == "OK" else str(reply)


def _pairs(reply: object) -> dict[str, Any] | None:
    """``ACL GETUSER``'s reply as a dict (redis-py parses it into one, or not)."""
    if isinstance(reply, dict):
        return {str(k): v for k, v in reply.items()}
    if isinstance(reply, list) and len(reply) % 2 == 0:
        return {str(k): v for k, v in zip(reply[::2], reply[1::2], strict=True)}
    return None


def _categories(reply: object, command: str) -> list[str] | None:
    """A command's ACL categories from ``COMMAND INFO``'s parsed reply."""
    if not isinstance(reply, dict):
        return None
    entry = reply.get(command.lower())
    if not isinstance(entry, dict) or not isinstance(entry.get("acl_categories"), list):
        return None
    return [str(c) for c in entry["acl_categories"]]


def _refusal(exc: Exception, command: str) -> str:
    text = _one_line(exc)
    if _acl.denial(text) is not None:
        return f"{command} not permitted"
    return f"{command} failed: {text}"


def _flatten(info: Mapping[str, Any]) -> dict[str, str]:
    """redis-py's parsed INFO, back to text (``slave0`` and friends: ``k=v,k=v``)."""
    flat: dict[str, str] = {}
    for key, value in info.items():
        if isinstance(value, dict):
            flat[key] = ",".join(f"{k}={v}" for k, v in value.items())
        else:
            flat[key] = str(value)
    return flat


def _one_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


# --- the command -------------------------------------------------------------------------


def check(
    nodes: Sequence[str],
    *,
    max_ttl: float = _DEFAULT_MAX_TTL,
    node_timeout: float = 1.0,
    acl_user: str | None = None,
    as_json: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Inspect ``nodes``, print the findings (a table, or JSON), return the exit code.

    Args:
        nodes: node URLs.
        max_ttl: the longest lease TTL the clients use (the ``uptime`` check).
        node_timeout: seconds to wait for each node's reply.
        acl_user: check this ACL user's permissions instead of the login's own (the
            login must be allowed ``ACL DRYRUN`` or, on Redis 6.2, ``ACL GETUSER``), so
            that one admin login reads the settings and checks the clients' user.
        as_json: print a JSON list instead of a table.
        out: where the findings go (default stdout).
        err: where the majority-unreachable message goes (default stderr).

    Raises:
        ConfigurationError: no nodes, or a malformed URL.
    """
    stdout = sys.stdout if out is None else out
    stderr = sys.stderr if err is None else err
    if not nodes:
        raise ConfigurationError("--redis", "no Redis nodes given")
    addresses = [parse_node_url(url, f"--redis[{i}]") for i, url in enumerate(nodes)]
    with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
        facts = list(pool.map(lambda a: gather(a, node_timeout, acl_user), addresses))
    findings = evaluate(facts, max_ttl)
    code = exit_code(facts, findings)
    if as_json:
        json.dump([f.as_dict() for f in findings], stdout, indent=2)
        stdout.write("\n")
    else:
        _print_table(findings, stdout)
        print(_summary(facts, findings, code), file=stdout)
    stdout.flush()
    if code == EXIT_UNAVAILABLE:
        answered = sum(1 for f in facts if f.error is None)
        print(
            f"tenure check: only {answered} of {len(facts)} nodes answered; "
            f"a majority is {majority(len(facts))}",
            file=stderr,
            flush=True,
        )
    return code


def _print_table(findings: Sequence[Finding], out: TextIO) -> None:
    header = ("NODE", "CHECK", "LEVEL", "DETAIL")
    rows = [(f.node, f.check, f.level.value, f.detail) for f in findings]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[3]]), file=out)


def _summary(facts: Sequence[NodeFacts], findings: Sequence[Finding], code: int) -> str:
    counts = {level: sum(1 for f in findings if f.level is level) for level in Level}
    verdict = {
        EXIT_OK: "all OK",
        EXIT_WARN: "warnings",
        EXIT_UNSAFE: "UNSAFE",
        EXIT_UNAVAILABLE: "a majority of the nodes is unreachable",
    }[code]
    return (
        f"tenure check: {len(facts)} node(s), {counts[Level.OK]} OK, "
        f"{counts[Level.WARN]} WARN, {counts[Level.UNSAFE]} UNSAFE: {verdict} (exit {code})"
    )

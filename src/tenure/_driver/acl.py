"""What a lock node's ACL must allow, derived from what tenure sends, and how to judge it.

The commands are not a hand-kept list: the ones that run inside scripts are read from
the Lua sources of the lock scripts (every ``redis.call("CMD"`` / ``redis.pcall("CMD"``,
with ``--@include`` fragments pasted in), so a script that starts calling a new
command changes what ``tenure check`` demands and what the documented ACL says (a test
compares the two). The commands the drivers send themselves are listed in
:data:`DIRECT`; a test greps the drivers for every command they pack, so that list
cannot fall behind either.

Keys: every key a lock script touches starts with the client's key prefix
(``tenure:`` by default): ``tenure:{<name>}:...`` (the lock, its wait queue, places,
reservation) and ``tenure:node:...`` (the node's floor and warm-up marker):
``~tenure:*``. Channels: each client listens on ``tenure:wake:<random>``, and the
release script publishes there: ``&tenure:wake:*``. With another prefix, every pattern
and probe key here takes that prefix (the functions' ``prefix`` argument).

Besides the derivation, this module holds the pure judgement used by ``tenure check``:
what an ACL refusal looks like in each server version's words, Redis 6.2's ``ACL
GETUSER`` rules evaluated for a command (6.2 has no ``ACL DRYRUN``), and the ``ACL
SETUSER`` line that grants what is missing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

from .._core.config import DEFAULT_KEY_PREFIX
from .._core.sentinel import SWITCH_CHANNEL
from .._lua import expand

__all__ = [
    "CHANNEL_PATTERN",
    "DIRECT",
    "KEY_PATTERN",
    "NODE_KINDS",
    "NOT_ON_LOCK_NODES",
    "PROBE_CHANNEL",
    "PROBE_KEY",
    "PROBE_QUEUE",
    "UNGRANTED",
    "Need",
    "channel_pattern",
    "commands_in",
    "connect_needs",
    "denial",
    "fix_line",
    "glob_match",
    "key_pattern",
    "least_privilege_acl",
    "lock_scripts",
    "needs",
    "permitted_by_rules",
    "probe_keys",
    "script_commands",
    "sentinel_acl",
    "sentinel_fix",
    "sentinel_needs",
]


def key_pattern(prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """The ACL key pattern that covers every key of clients with ``prefix``."""
    return prefix + "*"


def channel_pattern(prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """The ACL channel pattern that covers every notification channel of ``prefix``."""
    return prefix + "wake:*"


def probe_keys(prefix: str = DEFAULT_KEY_PREFIX, tag: str = "check") -> tuple[str, str, str]:
    """What ``tenure check`` names in its questions (and, where it must try for real,
    uses: a string key with a 2 s TTL, a sorted set emptied at once, a channel nobody
    hears): the probe key, the probe queue, the probe channel.

    ``tag``: the keys' hash tag; on a member of a Redis Cluster, one of the slots that
    member serves (``T[s]``), so that the probe runs there rather than being redirected;
    the channel then carries it too (a sharded channel is hashed like a key).
    """
    channel = f"{prefix}wake:check-probe" if tag == "check" else f"{prefix}wake:{{{tag}}}:probe"
    return f"{prefix}{{{tag}}}:probe", f"{prefix}{{{tag}}}:probe:q", channel


KEY_PATTERN = key_pattern()
CHANNEL_PATTERN = channel_pattern()
PROBE_KEY, PROBE_QUEUE, PROBE_CHANNEL = probe_keys()
PROBE_TTL_MS = "2000"
# The probe's keys end so (the prefix holds no brace): how a key argument is told apart.
_PROBE_KEY_ENDS = ("}:probe", "}:probe:q")

# Scripts in tenure._lua that are not the lock's: the fenced Redis store, the idempotency
# keys and the streams run on whatever Redis the application gives them, and check_probe
# is how `tenure check` tries the lock's commands (any of them), not one the lock sends.
NOT_ON_LOCK_NODES = frozenset(
    {"fenced_write", "idem_claim", "idem_record", "idem_release", "check_probe"}
    | {"stream_take", "stream_read", "stream_ack", "stream_heartbeat"}
)

_CALL = re.compile(rb"""redis\.p?call\(\s*(["'])([A-Za-z]+)\1""")
_ANY_CALL = re.compile(rb"redis\.p?call\(")


@dataclass(frozen=True)
class Need:
    """One command tenure sends to a lock node, with arguments to ask about it.

    Attributes:
        command: the command, upper case.
        args: representative arguments: keys under the key prefix (``tenure:``),
            channels under ``<prefix>wake:``, so that asking about them also asks about the key and
            channel patterns. Harmless when run for real (``tenure check``'s probe).
        where: ``"scripts"``, ``"direct"``, ``"direct and scripts"``, or ``"connect"``
            (sent by redis-py on every new connection, because of the node's URL).
        only: when tenure sends it, if not always (e.g. ``"with wait_replicas > 0"``).
        subcommand: the subcommand granted alone (``CLUSTER SLOTS``), if any.
        instead: what else than granting it makes it unneeded (a ``"connect"`` command's
            cause: ``"use database 0 in the node's URL"``), if anything.
    """

    command: str
    args: tuple[str, ...]
    where: str
    only: str | None = None
    subcommand: str | None = None
    instead: str | None = None

    @property
    def name(self) -> str:
        """What an ACL rule grants: ``EVAL``, or ``CLUSTER|SLOTS`` for a subcommand
        (granted alone, ``+cluster|slots``, not the whole container command)."""
        return f"{self.command}|{self.subcommand}" if self.subcommand else self.command

    @property
    def call(self) -> tuple[str, ...]:
        return (self.command, *((self.subcommand,) if self.subcommand else ()), *self.args)


# What each kind of lock node needs beyond the lock's own commands, sent directly by the
# drivers (docs/cluster-and-sentinel.md): (command, subcommand, arguments, the oldest
# server version that is sent it or None, when it is sent). An argument "$KEY", "$QUEUE"
# or "$CHANNEL" stands for the probe key, queue or channel under the clients' prefix
# (``probe_keys``). One line per command: a new one is one more line here, e.g.
#     ("SSUBSCRIBE", None, ("$CHANNEL",), (7,), None),
# in "cluster" for sharded notifications, and the documented lines, `tenure check` (which
# subscribes on a connection of its own for any *SUBSCRIBE) and its fixing line follow.
# ``"plain"``: redis:// and unix://; ``"sentinel"``: the master a redis+sentinel:// node
# finds (every connection checks its ROLE); ``"cluster"``: every member of a
# redis+cluster:// node (the slot map, and ASKING before a command a migrating slot's
# ASK sends on).
_Extra = tuple[str, "str | None", tuple[str, ...], "tuple[int, ...] | None", "str | None"]
NODE_KINDS: dict[str, tuple[_Extra, ...]] = {
    "plain": (),
    "sentinel": (("ROLE", None, (), None, None),),
    "cluster": (
        ("ASKING", None, (), None, None),
        ("CLUSTER", "SLOTS", (), None, None),
        # Sharded notifications, on servers that have them (the release script's
        # SPUBLISH is left out of the lines derived from the scripts: CLUSTER_ONLY).
        ("SSUBSCRIBE", None, ("$CHANNEL",), (7,), None),
        ("SUNSUBSCRIBE", None, ("$CHANNEL",), (7,), None),
        ("SPUBLISH", None, ("$CHANNEL", "probe"), (7,), None),
    ),
}

# What the Sentinels of a redis+sentinel:// node are sent (the service is the argument).
_SENTINEL_COMMANDS: tuple[tuple[str, str], ...] = (("SENTINEL", "GET-MASTER-ADDR-BY-NAME"),)
# The clients' subscription to the Sentinels' announcements of a failover, and the
# question asked before it, whose configuration epoch tells a failover announced while
# no subscription was up (``sentinel_watch``): without them they follow a failover
# later, at the old master's demotion, so a Sentinel refusing them refuses no lock.
_SENTINEL_WATCH_COMMANDS = ("SENTINEL|MASTER", "SUBSCRIBE", "PING")


def _direct(prefix: str) -> dict[str, tuple[tuple[str, ...], str | None]]:
    key, _, channel = probe_keys(prefix)
    return {
        "EVAL": (("return 1", "1", key), None),
        "EXISTS": ((key,), None),  # Lock.locked()
        "SUBSCRIBE": ((channel,), None),  # release notifications (docs/waiting.md)
        "WAIT": (("0", "0"), "with wait_replicas > 0"),
    }


def _script_args(prefix: str) -> dict[str, tuple[str, ...]]:
    key, queue, channel = probe_keys(prefix)
    return {
        "SET": (key, "probe", "PX", PROBE_TTL_MS),
        "GET": (key,),
        "MGET": (key,),
        "PTTL": (key,),
        "PEXPIRE": (key, PROBE_TTL_MS),
        "EXISTS": (key,),
        "DEL": (key,),
        "ZADD": (queue, "0", "probe"),
        "ZRANGE": (queue, "0", "0"),
        "ZSCORE": (queue, "probe"),
        "ZREM": (queue, "probe"),
        "PUBLISH": (channel, "probe"),
        "SPUBLISH": (channel, "probe"),  # sharded notifications, when a script sends it
        "INFO": ("replication",),  # the node's replication ID (history.lua.inc)
    }


# Run by the scripts on a Redis Cluster node only (a sharded notification, 7.0 and later):
# never on the plain nodes `tenure check` inspects (docs/cluster-and-sentinel.md).
CLUSTER_ONLY = frozenset({"SPUBLISH"})

# Sent by the drivers themselves (tests/unit/test_acl.py greps the drivers for pack()).
# EVALSHA is optional (a node that refuses it is sent EVAL: docs/deployment.md). No
# INFO or CLIENT: redis-py's health checks and CLIENT SETINFO are switched off.
DIRECT = _direct(DEFAULT_KEY_PREFIX)

# Sent by the drivers, but needing no grant: the PING that a new connection to a node
# gone silent asks first (``_core.backoff``), which a refusal answers as well as a PONG.
UNGRANTED = frozenset({"PING"})

# Harmless arguments for the commands the scripts run. A command missing here (a script
# started calling something new) is still asked about, with the probe key alone, and a
# unit test fails until it gets a proper line.
_SCRIPT_ARGS = _script_args(DEFAULT_KEY_PREFIX)


def lock_scripts() -> tuple[str, ...]:
    """The names of the Lua scripts tenure runs on lock nodes (every ``*.lua`` but those
    of :data:`NOT_ON_LOCK_NODES`), sorted."""
    names = (
        entry.name.removesuffix(".lua")
        for entry in files("tenure._lua").iterdir()
        if entry.name.endswith(".lua")
    )
    return tuple(sorted(n for n in names if n not in NOT_ON_LOCK_NODES))


@cache
def script_commands() -> tuple[str, ...]:
    """Every command the lock scripts call, upper case, sorted.

    Raises:
        RuntimeError: as :func:`commands_in`.
    """
    found: set[str] = set()
    for name in lock_scripts():
        source = files("tenure._lua").joinpath(f"{name}.lua").read_bytes()
        found |= commands_in(f"{name}.lua", expand(source))
    return tuple(sorted(found))


def commands_in(name: str, source: bytes) -> set[str]:
    """The commands a Lua script calls (``redis.call("CMD"``, ``redis.pcall('CMD'``), upper
    case; comments are skipped.

    Raises:
        RuntimeError: the script calls ``redis.call`` with a computed command name, which
            this cannot see (write the name as a literal).
    """
    code = b"\n".join(line.split(b"--", 1)[0] for line in source.splitlines())
    literal = _CALL.findall(code)
    if len(literal) != len(_ANY_CALL.findall(code)):
        raise RuntimeError(
            f"{name} calls redis.call with a computed command name; tenure check derives "
            "the ACL from literal names only"
        )
    return {command.decode().upper() for _, command in literal}


def needs(
    prefix: str = DEFAULT_KEY_PREFIX,
    kind: str = "plain",
    version: tuple[int, ...] | None = None,
    tag: str = "check",
    *,
    db: int = 0,
    client_name: str | None = None,
) -> tuple[Need, ...]:
    """Everything tenure sends to a lock node: the direct commands, then the scripts';
    their key and channel arguments under ``prefix``; then what a node of ``kind``
    (:data:`NODE_KINDS`) needs besides, those a server of ``version`` is sent (None:
    every one); then what every connection sends as it opens (:func:`connect_needs`).

    ``tag``: the hash tag of the keys asked about (``probe_keys``).
    ``db``, ``client_name``: the connections' settings, as redis-py reads them from the
    node's URL.

    Raises:
        KeyError: an unknown ``kind``.
    """
    scripted = set(script_commands())
    direct, script_args = _direct(prefix), _script_args(prefix)
    if tag != "check":  # the same keys under another hash tag (a Cluster member's slot)
        old, new = probe_keys(prefix), probe_keys(prefix, tag)
        swap = dict(zip(old, new, strict=True))
        direct = {c: (tuple(swap.get(a, a) for a in args), o) for c, (args, o) in direct.items()}
        script_args = {c: tuple(swap.get(a, a) for a in args) for c, args in script_args.items()}
    out = [
        Need(command, args, "direct and scripts" if command in scripted else "direct", only)
        for command, (args, only) in direct.items()
    ]
    out += [
        Need(command, script_args.get(command, (probe_keys(prefix, tag)[0],)), "scripts")
        for command in sorted(scripted - direct.keys() - CLUSTER_ONLY)
    ]
    key, queue, channel = probe_keys(prefix, tag)
    named = {"$KEY": key, "$QUEUE": queue, "$CHANNEL": channel}
    out += [
        Need(command, tuple(named.get(a, a) for a in args), "direct", only, sub)
        for command, sub, args, since, only in NODE_KINDS[kind]
        if since is None or version is None or version >= since
    ]
    return (*out, *connect_needs(db, client_name))


def connect_needs(db: int = 0, client_name: str | None = None) -> tuple[Need, ...]:
    """What redis-py sends on every new connection after logging in, for a node whose URL
    (``/3``, ``?client_name=app``) sets a database other than 0 or a client name:
    ``CLIENT SETNAME``, then ``SELECT``. Not the lock's commands, so not in the
    least-privilege line; but a user refused either fails every connection to the node.
    """
    out = []
    if client_name:
        out.append(
            Need(
                "CLIENT",
                (client_name,),
                "connect",
                subcommand="SETNAME",
                instead="leave client_name out of the node's URL",
            )
        )
    if db:
        out.append(
            Need("SELECT", (str(db),), "connect", instead="use database 0 in the node's URL")
        )
    return tuple(out)


def sentinel_needs(service: str) -> tuple[Need, ...]:
    """What tenure sends the Sentinels of a node whose service is ``service``."""
    return tuple(Need(c, (service,), "direct", None, s) for c, s in _SENTINEL_COMMANDS)


def least_privilege_acl(
    user: str = "tenure",
    password: str = "PASSWORD",
    prefix: str = DEFAULT_KEY_PREFIX,
    kind: str = "plain",
    version: tuple[int, ...] | None = None,
) -> str:
    """The ``ACL SETUSER`` line that grants exactly what tenure needs on a lock node of
    ``kind`` (:data:`NODE_KINDS`: ``"plain"``, ``"sentinel"`` for the master of a
    Sentinel-managed node, ``"cluster"`` for every member of a Redis Cluster node), for
    clients whose key prefix is ``prefix``; for a server of ``version``, without what
    such a server is not sent (an older server refuses a rule naming a command it lacks).

    ``resetchannels`` is explicit because Redis 6.2's ``reset`` leaves the user every
    channel (``acl-pubsub-default allchannels``), after which a channel pattern is an error.
    """
    commands = " ".join(f"+{n.name.lower()}" for n in needs(prefix, kind, version))
    return (
        f"ACL SETUSER {user} reset on >{password} resetchannels ~{key_pattern(prefix)} "
        f"&{channel_pattern(prefix)} {commands}"
    )


def sentinel_acl(user: str = "tenure", password: str = "PASSWORD") -> str:
    """The ``ACL SETUSER`` line for the Sentinels of a Sentinel-managed node (when they
    ask for a login at all): asking for the master by service name, and the subscription
    to the announcements of a failover."""
    return f"ACL SETUSER {user} reset on >{password} {_sentinel_rules(question=True)}"


def sentinel_fix(user: str, *, question: bool = False) -> str:
    """The ``ACL SETUSER`` line that lets ``user`` subscribe to a Sentinel's
    announcements of a failover, and, with ``question``, ask for the master too: a
    Sentinel refusing the question would refuse the subscription next, and be named a
    second time."""
    return f"ACL SETUSER {user} {_sentinel_rules(question=question)}"


def _sentinel_rules(*, question: bool) -> str:
    # The user's channels reset: on a Sentinel it needs no other.
    asking = [n.name for n in sentinel_needs("SERVICE")] if question else []
    commands = " ".join(f"+{c.lower()}" for c in (*asking, *_SENTINEL_WATCH_COMMANDS))
    return f"resetchannels &{SWITCH_CHANNEL} {commands}"


# --- judging answers (pure) ---------------------------------------------------------------

# An ACL refusal, as each version words it (lower case).
_COMMAND_REFUSED = (
    "no permissions to run",  # 6.2 NOPERM, 7 NOPERM and DRYRUN, 7 scripts
    "can't run this command",  # 6.2 scripts
)
_KEY_REFUSED = (
    "no permissions to access one of the keys",  # 6.2 NOPERM
    "can't access at least one of the keys",  # 6.2 scripts
    "no permissions to access a key",  # 7 scripts
)
_CHANNEL_REFUSED = (
    "no permissions to access one of the channels",  # 6.2 NOPERM
    "can't publish to the channel",  # 6.2 scripts
    "no permissions to access a channel",  # 7 scripts
)
_KEY_NAMED = re.compile(r"no permissions to access the '.*' key")  # 7 NOPERM, DRYRUN
_CHANNEL_NAMED = re.compile(r"no permissions to access the '.*' channel")


def denial(text: str) -> str | None:
    """What an error text (or an ``ACL DRYRUN`` answer) refuses: ``"command"``,
    ``"key"``, ``"channel"``, or None if it is no ACL refusal."""
    lower = text.lower()
    if any(p in lower for p in _CHANNEL_REFUSED) or _CHANNEL_NAMED.search(lower):
        return "channel"
    if any(p in lower for p in _KEY_REFUSED) or _KEY_NAMED.search(lower):
        return "key"
    if any(p in lower for p in _COMMAND_REFUSED) or lower.startswith("noperm"):
        return "command"
    return None


def fix_line(user: str, refused: Mapping[str, str], prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """The ``ACL SETUSER`` line that grants ``refused`` (command -> what was refused,
    as :func:`denial` names it) to clients whose key prefix is ``prefix``."""
    parts = [f"+{c.lower()}" for c, kind in refused.items() if kind == "command"]
    if "key" in refused.values():
        parts.append(f"~{key_pattern(prefix)}")
    if "channel" in refused.values():
        parts.append(f"&{channel_pattern(prefix)}")
    return f"ACL SETUSER {user} {' '.join(parts)}"


def permitted_by_rules(
    need: Need,
    commands: str,
    categories: Iterable[str],
    keys: Sequence[str] | None,
    channels: Sequence[str] | None,
) -> str | None:
    """Whether a Redis 6.2 user may run ``need``, from its ``ACL GETUSER`` reply.

    Args:
        need: the command and its arguments (keys and channels as :func:`needs` gives).
        commands: the user's command rules, e.g. ``"+@all -publish"`` or ``"-@all +get"``;
            applied left to right, as Redis describes them.
        categories: the command's ACL categories (``COMMAND INFO``), e.g. ``["@write"]``.
        keys: the user's key patterns (``None``: all keys).
        channels: its channel patterns (``None``: all channels).

    Returns:
        None if permitted, else why not, in the words :func:`denial` recognises.
    """
    name = need.command.lower()
    # A rule ``+cmd|first`` grants the command with that subcommand (or, on 6.2 and for
    # a command without subcommands, that first argument: ``+info|replication``).
    first = need.call[1].lower() if len(need.call) > 1 else None
    cats = {c.lower().lstrip("@") for c in categories}
    allowed = False
    for word in commands.split():
        rule = {"allcommands": "+@all", "nocommands": "-@all"}.get(word.lower(), word)
        sign, body = rule[:1], rule[1:].lower()
        if sign not in "+-" or not body:
            continue
        if (
            body == "@all"
            or (body.startswith("@") and body[1:] in cats)
            or body == name
            or (first is not None and body == f"{name}|{first}")
        ):
            allowed = sign == "+"
    if not allowed:
        shown = need.name.lower()
        return f"no permissions to run the '{shown}' command (its rules: {commands})"
    if name in _CHANNEL_COMMANDS:
        channel = need.args[0]
        if channels is not None and not any(glob_match(p, channel) for p in channels):
            return f"no permissions to access the '{channel}' channel"
        return None
    if keys is not None:
        for arg in need.args:
            if arg.endswith(_PROBE_KEY_ENDS) and not any(glob_match(p, arg) for p in keys):
                return f"no permissions to access the '{arg}' key"
    return None


# The commands whose argument is a channel (checked against the channel patterns).
_CHANNEL_COMMANDS = frozenset({"publish", "subscribe", "spublish", "ssubscribe"})


def glob_match(pattern: str, text: str) -> bool:
    """Redis's glob (``stringmatchlen``): ``*``, ``?``, ``[...]`` with ``^`` and ranges,
    backslash escapes."""
    out, i = [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        elif ch == "\\" and i + 1 < len(pattern):
            i += 1
            out.append(re.escape(pattern[i]))
        elif ch == "[":
            end = pattern.find("]", i + 1)
            if end < 0:
                out.append(re.escape(ch))
            else:
                body = pattern[i + 1 : end]
                negate = body.startswith("^")
                body = body[1:] if negate else body
                inner = "".join("\\" + c if c in "\\]^[" else c for c in body)
                out.append(f"[{'^' if negate else ''}{inner}]" if inner else "(?!)")
                i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return re.fullmatch("".join(out), text, re.DOTALL) is not None

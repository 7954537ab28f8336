"""``tenure check``: inspect the lock nodes and say what threatens the lock's safety.

``tenure check [--redis URL ...] [--max-ttl SECONDS] [--acl-user NAME] [--json]``

Every node is read in parallel with a plain redis-py client (the same connection options
as ``tenure status``: no retries, RESP2, short timeouts). One pipelined round reads
``INFO``, ``CONFIG GET`` of the settings the rules read (``CONFIG_KEYS``), ``ACL
WHOAMI`` and a script that only declares two keys (``EVAL "return 1"``: can tenure's
scripts run here?); a second checks that the node lets tenure run its commands (``ACL DRYRUN`` on
Redis >= 7, ``ACL GETUSER`` on 6.2, where the user may use them; otherwise the real,
harmless operations on the probe keys ``tenure:{check}:probe``, which expires after 2 s
even if it cannot be deleted, and ``tenure:{check}:probe:q``, emptied at once). Nothing
else is written. With ``--key-prefix``, that prefix replaces ``tenure:`` in every key and
channel asked about or written.

This module is the gathering and the command: :func:`gather` turns a node into a
:class:`~tenure.cli.node_rules.NodeFacts` of plain strings and dicts, and :func:`check`
prints what :mod:`tenure.cli.node_rules` (pure: facts in, findings out, so every rule is
unit-tested without a server) finds in them. The levels and the checks are described
there.

Exit codes
----------
== ======================================================================================
0  every finding is OK
1  warnings, nothing UNSAFE
2  usage error (no nodes, a malformed URL or option); with ``--json``, stdout has it too
   (:func:`usage_json`: one row per problem, check ``usage``, level ``UNSAFE``)
3  at least one UNSAFE finding
69 fewer than a majority of the nodes answered (EX_UNAVAILABLE, as ``tenure status``)
== ======================================================================================
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO
from urllib.parse import unquote, urlsplit

import redis

from .._core.config import (
    DEFAULT_KEY_PREFIX,
    NodeAddress,
    check_key_prefix,
    check_one_server,
    host_port,
    node_keys,
    parse_node_url,
)
from .._core.diagnosis import refuses_connection
from .._core.quorum import majority
from .._core.slots import map_sources, slot_tag
from .._driver import acl as _acl
from .._driver.redis_compat import (
    NotRedis,
    check_connection_options,
    connection_kwargs,
    dropped,
    own_connection,
)
from .._errors import ConfigurationError
from .._lua import script
from ._parallel import budget, each, late_text
from ._text import failure_line, one_line
from ._topology import cluster_map, sentinel_master, sentinel_seconds
from .node_rules import (
    CONFIG_KEYS,
    DEFAULT_MAX_TTL,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_UNSAFE,
    EXIT_WARN,
    Finding,
    Level,
    NodeFacts,
    UserLogin,
    check_slots,
    evaluate,
    exit_code,
    parse_version,
)

__all__ = ["CHECK_EXIT_CODES", "check", "gather", "usage_json"]

# For --help: the levels and codes of node_rules (Level, EXIT_*), said for the user.
CHECK_EXIT_CODES = """\
levels:
  OK      nothing found that threatens safety
  WARN    safe only under a stated assumption, or could not be checked
  UNSAFE  mutual exclusion or fencing can break, or tenure cannot work on the node

exit codes:
  0   every finding is OK
  1   warnings, nothing UNSAFE
  2   usage error (no --redis/TENURE_REDIS, bad option or URL); with --json, one
      row per problem on stdout: {"node": "", "check": "usage", "level": "UNSAFE",
      "detail": the line said on stderr}
  3   at least one UNSAFE finding
  69  fewer than a majority of the nodes answered

Where neither ACL DRYRUN (Redis >= 7) nor ACL GETUSER (6.2) may be used, the ACL check
runs each command for real: it writes the probe keys tenure:{check}:probe (2 s TTL) and
tenure:{check}:probe:q, deletes them at once, and publishes to tenure:wake:check-probe
(with --key-prefix, under that prefix). Nothing else is written. See docs/deployment.md.
"""

# Runs each call given in ARGV and reports, per call, "OK" or the error; then deletes the
# probe keys (src/tenure/_lua/check_probe.lua).
_PROBE_SCRIPT = script("check_probe").wire.decode()

# --- gathering ---------------------------------------------------------------------------


def gather(
    address: NodeAddress,
    timeout: float,
    acl_user: str | None = None,
    key_prefix: str = DEFAULT_KEY_PREFIX,
    *,
    name: str | None = None,
    kind: str = "plain",
    tag: str = "check",
    replica: bool = False,
    listed: str | None = None,
    form: str | None = None,
) -> NodeFacts:
    """Read one server (two pipelined rounds); never raises for the server's own failures.

    ``acl_user``: whose permissions to check (default: the user this login is).
    ``key_prefix``: the clients' key prefix; the keys and channels asked about are under it.
    ``name``: the row's name (default: the server's URL without credentials). ``kind``,
    ``tag``, ``replica``, ``listed``: as :class:`NodeFacts` has them, for a server of a
    Sentinel-managed or Cluster node. ``form``: the URL form advice shows (the listed
    node's ``login_form``; default: the server's own).
    """
    facts = NodeFacts(
        node=name or address.display,
        key_prefix=key_prefix,
        kind=kind,
        tag=tag,
        replica=replica,
        listed=listed,
    )
    options = connection_kwargs(timeout, asyncio=False, unix=address.scheme == "unix")
    options["socket_timeout"] = timeout
    client = redis.Redis.from_url(address.url, decode_responses=True, **options)
    # What the URL has every connection send besides the lock's commands, as redis-py
    # reads it (the clients' connections are made from the same URL): the user may need
    # +select and +client|setname, which the login checking it for --acl-user has.
    settings = client.connection_pool.connection_kwargs
    facts.db = int(settings.get("db") or 0)
    facts.client_name = str(settings["client_name"]) if settings.get("client_name") else None
    try:
        try:
            _read_state(client, facts)
        except Exception as exc:  # anything the server did: its row says so, the rest go on
            facts.error = _failed(
                _refusal_behind(client, exc), key_prefix, form or address.login_form
            )
        if facts.error is None and facts.info is not None and "redis_version" not in facts.info:
            # Something that answers every command alike (an echo, ``+OK``, a stub): every
            # Redis and Valkey server names its version in INFO.
            facts.error = _failed(
                NotRedis("INFO answered without a redis_version"), key_prefix, address.login_form
            )
        if facts.error is not None:
            return facts
        if facts.user is None:
            facts.user = unquote(urlsplit(address.url).username or "") or None
        try:
            _read_access(client, facts, acl_user)
        except (redis.RedisError, OSError) as exc:
            facts.access_error = one_line(exc)
        except _PARSER_ERRORS as exc:  # a reply redis-py could not parse: not Redis's
            facts.access_error = f"an answer that is not Redis's ({type(exc).__name__}: {exc})"
    finally:
        client.close()
    return facts


# What redis-py's reply parsers (INFO, CONFIG GET, COMMAND INFO...) raise when fed a reply
# of another shape than the command's: what a server that is not Redis answers.
_PARSER_ERRORS = (AttributeError, IndexError, KeyError, TypeError, ValueError)


def _failed(exc: Exception, prefix: str, form: str) -> str:
    """Why a server could not be read (``failure_line``, its advice in URL ``form``); a
    reply redis-py could not parse comes from a server that is not Redis."""
    if isinstance(exc, _PARSER_ERRORS):
        exc = NotRedis(f"{type(exc).__name__}: {exc}")
    return failure_line(exc, prefix, form)


def _refusal_behind(client: redis.Redis, exc: Exception) -> Exception:
    """``exc``, or the node's refusal of the connection itself, which ``exc`` hides. A
    node that refuses a connection as it takes it (in protected mode, to a client of
    another machine) sends its refusal and closes: the pipeline reads the refusal as
    its first reply, then the close, which is what it raises ("Connection closed by
    server", and the advice of a TLS port). One command alone on a new connection gets
    the refusal as its answer: on a connection of its own, since redis-py's pool finds
    the refusal waiting as it hands a connection out, and raises "Connection not
    ready" instead (which the pipeline may have met too)."""
    if not dropped(exc) and "not ready" not in str(exc):
        return exc
    conn = own_connection(client.connection_pool)
    try:
        conn.connect()
        conn.send_command("PING")
        conn.read_response()
    except redis.ResponseError as refusal:
        if refuses_connection(str(refusal)):
            return refusal
    except Exception:  # not a refusal: the pipeline's failure says what happened
        pass
    finally:
        conn.disconnect()
    return exc


def _read_state(client: redis.Redis, facts: NodeFacts) -> None:
    with client.pipeline(transaction=False) as pipe:
        pipe.info()
        for key in CONFIG_KEYS:
            pipe.config_get(key)
        pipe.acl_whoami()
        # Whether tenure's scripts can run here at all: a script that does nothing but
        # declare a lock key and the node's floor, in two hash slots as every lock
        # script does (cluster mode refuses that; a server without Lua, EVAL).
        # On a Cluster member both are in a slot it serves, as the lock's keys and the
        # slot's floor are (a replica is not asked: it would redirect to its master).
        prefix = facts.key_prefix
        floor = (
            f"{prefix}{{{facts.tag}}}:floor" if facts.kind == "cluster" else node_keys(prefix)[0]
        )
        if not facts.replica:
            pipe.eval("return 1", 2, _acl.probe_keys(prefix, facts.tag)[0], floor)
        cluster_master = facts.kind == "cluster" and not facts.replica
        if cluster_master:
            pipe.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
        replies = pipe.execute(raise_on_error=False)
    if facts.replica:
        replies.append(None)
    if cluster_master:
        facts.cluster_state = _cluster_state(replies.pop())
    info, *configs, whoami, scripts = replies
    if isinstance(info, redis.AuthenticationError):
        raise info  # NOAUTH: a password is required
    if not isinstance(info, (dict, Exception)):
        raise NotRedis(f"INFO answered {repr(info)[:40]}")
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
    if scripts is not None:
        facts.scripts = _script_error(scripts) if isinstance(scripts, Exception) else "OK"


def _cluster_state(reply: object) -> str:
    """``cluster_state`` from ``CLUSTER INFO`` (parsed by redis-py or not): ``ok``,
    ``fail``, or why it is unknown."""
    if isinstance(reply, Exception):
        return _refusal(reply, "CLUSTER INFO")
    if isinstance(reply, str):
        reply = dict(line.partition(":")[::2] for line in reply.splitlines())
    if isinstance(reply, dict):
        return str(reply.get("cluster_state", "?")).strip()
    return "?"


def _read_access(client: redis.Redis, facts: NodeFacts, acl_user: str | None) -> None:
    """Ask the node what the user may run: ``ACL DRYRUN`` (Redis >= 7), else ``ACL
    GETUSER`` (6.2), else, where the user may use neither, try every command for real
    (only possible for the user this login is, not for ``acl_user``)."""
    info = facts.info or {}
    if info.get("role") in ("slave", "replica") and not facts.replica:
        return  # not probed (the probe writes); the role check already says UNSAFE
    if acl_user is not None:
        facts.user = acl_user
        # Permissions alone do not say whether clients can log in as the user at all.
        facts.login = _login(client, acl_user)
    user = facts.user or "default"
    version = parse_version(info.get("redis_version", "0"))
    needs = _acl.needs(
        facts.key_prefix, facts.kind, version, facts.tag, db=facts.db, client_name=facts.client_name
    )
    if version >= (7,):
        answers = _dry_run(client, user, needs)
        method = "ACL DRYRUN"
    else:
        answers = _get_user(client, user, needs)
        method = "ACL GETUSER"
    if answers is None and acl_user is not None:
        if _no_such_user(client, acl_user):
            # DRYRUN is refused for a user the node does not have, however privileged the
            # login: saying the login may not ask would send the operator after the wrong
            # user.
            facts.access_error = (
                f"the node has no ACL user {acl_user!r} (ACL GETUSER answers nothing; ACL "
                "USERS lists them): check the name given to --acl-user, or create that user"
            )
            return
        facts.access_error = (
            f"--acl-user needs a login that may run {method} (or log in as "
            f"{acl_user!r} and leave --acl-user out)"
        )
        return
    if answers is None and facts.replica:
        # A replica is not probed (the probe writes): say what could not be asked.
        facts.access_error = (
            f"this login may not run {method}, and a replica is not probed (the probe "
            "writes); check it with an admin login and --acl-user"
        )
        return
    if answers is None:
        answers = _probe(client, needs, facts.key_prefix, facts.tag)
        method = "probe"
    facts.access = answers
    facts.access_method = method


def _login(client: redis.Redis, user: str) -> UserLogin | None:
    """The flags and the number of passwords of ``user`` (``ACL GETUSER``); None if the
    login may not ask, or the node has no such user (the access check says so)."""
    try:
        reply = client.execute_command("ACL", "GETUSER", user)  # type: ignore[no-untyped-call]
    except redis.RedisError:
        return None
    rules = _pairs(reply)
    if rules is None:
        return None
    flags, passwords = rules.get("flags"), rules.get("passwords")
    if not isinstance(flags, list) or not isinstance(passwords, list):
        return None
    return UserLogin(tuple(str(f) for f in flags), len(passwords))


def _no_such_user(client: redis.Redis, user: str) -> bool:
    """Whether the node says it has no ACL user ``user`` (False when it cannot be asked)."""
    try:
        reply = client.execute_command("ACL", "GETUSER", user)  # type: ignore[no-untyped-call]
    except redis.RedisError:
        return False
    return reply is None


def _dry_run(client: redis.Redis, user: str, needs: Sequence[_acl.Need]) -> _Answers | None:
    """``ACL DRYRUN`` of every command; None if DRYRUN itself is refused."""
    with client.pipeline(transaction=False) as pipe:
        for need in needs:
            pipe.acl_dryrun(user, *need.call)
        replies = pipe.execute(raise_on_error=False)
    if all(isinstance(r, Exception) for r in replies):
        return None  # DRYRUN not permitted to this user: try another way
    return {need.name: _answer(reply) for need, reply in zip(needs, replies, strict=True)}


def _get_user(client: redis.Redis, user: str, needs: Sequence[_acl.Need]) -> _Answers | None:
    """Redis 6.2's rules for ``user`` (``ACL GETUSER``) and the commands' categories
    (``COMMAND INFO``), evaluated; None if either is refused or unreadable."""
    with client.pipeline(transaction=False) as pipe:
        pipe.execute_command("ACL", "GETUSER", user)  # type: ignore[no-untyped-call]
        asked = dict.fromkeys(n.command for n in needs)
        pipe.execute_command("COMMAND", "INFO", *asked)  # type: ignore[no-untyped-call]
        try:
            described, commands = pipe.execute(raise_on_error=False)
        except TypeError:
            # redis-py's parser of COMMAND INFO fails on the nil a server answers for a
            # command it does not have (EVAL renamed away, say): the probe says which.
            return None
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
        answers[need.name] = _acl.permitted_by_rules(need, rule_text, categories, keys, channels)
    return answers


def _probe(client: redis.Redis, needs: Sequence[_acl.Need], prefix: str, tag: str) -> _Answers:
    """Run every command for real, harmlessly: the scripts' commands inside one probe
    script (so a refusal there is what a lock script would meet), the others directly,
    each ``SUBSCRIBE`` (``SSUBSCRIBE``) on a connection of its own."""
    scripted = [n for n in needs if n.where == "scripts"]
    argv: list[str] = []
    for need in scripted:
        argv += [str(len(need.call)), *need.call]
    # Subscribing turns a connection into a subscriber's: each on a connection of its own.
    listen = [n for n in needs if n.where != "scripts" and n.command.endswith("SUBSCRIBE")]
    direct = [n for n in needs if n.where != "scripts" and n.command != "EVAL" and n not in listen]
    with client.pipeline(transaction=False) as pipe:
        key, queue, _ = _acl.probe_keys(prefix, tag)
        pipe.eval(_PROBE_SCRIPT, 2, key, queue, *argv)
        for need in direct:
            pipe.execute_command(*need.call)  # type: ignore[no-untyped-call]
        script_reply, *direct_replies = pipe.execute(raise_on_error=False)
    answers: _Answers = {}
    if isinstance(script_reply, Exception):
        answers["EVAL"] = one_line(script_reply)
        for need in scripted:
            answers[need.name] = "the probe script could not run"
    elif isinstance(script_reply, list) and len(script_reply) == len(scripted):
        answers["EVAL"] = None
        for need, reply in zip(scripted, script_reply, strict=True):
            answers[need.name] = None if reply == "OK" else str(reply)
    else:
        answers["EVAL"] = f"unexpected reply to the probe script: {script_reply!r}"
    for need, reply in zip(direct, direct_replies, strict=True):
        answers[need.name] = one_line(reply) if isinstance(reply, Exception) else None
    for need in listen:
        answers[need.name] = _probe_subscribe(client, need.call)
    return answers


def _probe_subscribe(client: redis.Redis, call: Sequence[str]) -> str | None:
    conn = client.connection_pool.make_connection()
    try:
        conn.connect()  # type: ignore[no-untyped-call]
        conn.send_command(*call)  # type: ignore[no-untyped-call]
        conn.read_response()
        return None
    except redis.ResponseError as exc:
        return one_line(exc)
    finally:
        conn.disconnect()  # type: ignore[no-untyped-call]


_Answers = dict[str, "str | None"]


def _answer(reply: object) -> str | None:
    if isinstance(reply, Exception):
        return one_line(reply)
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


# redis-py drops these error codes from the message, and the class is what says them.
_CLUSTER_CODES: tuple[tuple[type[Exception], str], ...] = (
    (redis.exceptions.ClusterCrossSlotError, "CROSSSLOT"),
    (redis.exceptions.MovedError, "MOVED"),
    (redis.exceptions.AskError, "ASK"),
    (redis.exceptions.ClusterDownError, "CLUSTERDOWN"),
)


def _script_error(exc: Exception) -> str:
    """The probe script's error as the server said it, its cluster error code included."""
    text = one_line(exc)
    for cls, code in _CLUSTER_CODES:
        if isinstance(exc, cls) and not text.upper().startswith(code):
            return f"{code} {text}"
    return text


def _refusal(exc: Exception, command: str) -> str:
    text = one_line(exc)
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


# --- the command -------------------------------------------------------------------------


def check(
    nodes: Sequence[str],
    *,
    max_ttl: float = DEFAULT_MAX_TTL,
    node_timeout: float = 1.0,
    acl_user: str | None = None,
    as_json: bool = False,
    key_prefix: str = DEFAULT_KEY_PREFIX,
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
        key_prefix: the clients' key prefix (their ``key_prefix``): the ACL is checked
            for keys and channels under it.
        out: where the findings go (default stdout).
        err: where the majority-unreachable message goes (default stderr).

    Raises:
        ConfigurationError: no nodes, a malformed URL, or a key prefix the clients
            would refuse.
    """
    stdout = sys.stdout if out is None else out
    stderr = sys.stderr if err is None else err
    if not nodes:
        raise ConfigurationError("--redis", "no Redis nodes given")
    addresses = [
        check_one_server(parse_node_url(url, f"--redis[{i}]"), f"--redis[{i}]", "tenure check")
        for i, url in enumerate(nodes)
    ]
    # A URL option redis-py refuses (``?socket_timeout=abc``) is the caller's to fix.
    check_connection_options(None, addresses, node_timeout, asyncio=False, listed="--redis")
    prefix = check_key_prefix(key_prefix, "--key-prefix")
    # Each node within its budget: a server that never ends a reply is not waited for.
    read = each(
        addresses,
        lambda a: _gather_node(a, node_timeout, acl_user, prefix),
        lambda a, seconds: ([_late(a, seconds, prefix)], None),
        lambda a: _budget(a, node_timeout),
    )
    facts = [f for node_facts, _ in read for f in node_facts]
    findings = evaluate(facts, max_ttl)
    # The rows about a listed node as a whole (a Cluster node's slots) after its servers'.
    for _, whole in read:
        if whole is not None:
            last = max(
                (i for i, f in enumerate(findings) if f.node.startswith(whole.node)),
                default=len(findings) - 1,
            )
            findings.insert(last + 1, whole)
    code = exit_code(facts, findings)
    if as_json:
        json.dump([f.as_dict() for f in findings], stdout, indent=2)
        stdout.write("\n")
    else:
        _print_table(findings, stdout)
        print(_summary(facts, findings, code), file=stdout)
    stdout.flush()
    if code == EXIT_UNAVAILABLE:
        down = {f.listed or f.node for f in facts if f.error is not None and not f.replica}
        answered = len(addresses) - len(down)
        print(
            f"tenure check: only {answered} of {len(addresses)} nodes answered; "
            f"a majority is {majority(len(addresses))}",
            file=stderr,
            flush=True,
        )
    return code


def usage_json(problems: Sequence[str]) -> str:
    """``tenure check --json``'s answer to a usage error: the findings' JSON list, with
    one row per problem, check ``usage``, node ``""``, level ``UNSAFE`` (nothing was
    checked: a reader that looks for UNSAFE rows, as one that looks for OK ones, must
    not take it for a pass) and the line said on stderr as its detail."""
    rows = [Finding("", "usage", Level.UNSAFE, problem).as_dict() for problem in problems]
    return json.dumps(rows, indent=2)


# The connections and replies ``gather`` waits for one after another, at most: connect,
# the state, three ACL questions, the probe, and each subscription command probed on a
# connection of its own (three on a Cluster member: connect, reply).
_GATHER_WAITS = 1 + 1 + 3 + 1 + 3 * 2


def _budget(address: NodeAddress, timeout: float) -> float:
    """The seconds reading a listed node is given (``_parallel.budget``), each of its
    connections and replies within the node timeout ``timeout`` (its servers are read
    side by side)."""
    if address.sentinel is not None:
        # Finding the master, bounded on its own (``sentinel_seconds``: the Sentinels
        # asked side by side, then the masters they name); then the master, then its
        # replicas.
        return sentinel_seconds(timeout) + budget(2 * _GATHER_WAITS, timeout)
    if address.seeds:
        # The slot map from each seed in turn, then the masters, then the replicas.
        waits = 2 * len(map_sources(address.seeds, None)) + 2 * _GATHER_WAITS
        return budget(waits, timeout)
    return budget(_GATHER_WAITS, timeout)


def _late(address: NodeAddress, seconds: float, prefix: str) -> NodeFacts:
    """The facts of a node still being read after its budget: it did not answer."""
    return NodeFacts(node=address.display, error=late_text(seconds), key_prefix=prefix)


def _gather_node(
    address: NodeAddress, timeout: float, acl_user: str | None, prefix: str
) -> tuple[list[NodeFacts], Finding | None]:
    """Every server a listed node stands for, read; and the finding about the node as a
    whole, if it has one (a Cluster node's slots).

    A Sentinel-managed node is the master its Sentinels name now, and that master's
    replicas (what a failover promotes); a Cluster node is every master and replica of its
    slot map. Each row names the node as listed and the server.
    """
    shown = address.display
    if address.sentinel is not None:
        try:
            master = sentinel_master(address, timeout)
        except LookupError as exc:
            return [NodeFacts(node=shown, error=str(exc), key_prefix=prefix)], None
        facts = gather(
            master.address,
            timeout,
            acl_user,
            prefix,
            name=f"{shown} (master {master.where})",
            kind="sentinel",
            listed=shown,
            form=address.login_form,
        )
        facts.sentinel_warnings = master.sentinel_warnings
        replicas = _replicas_of(facts)
        return [facts, *_each(address, replicas, timeout, acl_user, prefix, "sentinel")], None
    if address.seeds:
        try:
            slot_map = cluster_map(address, timeout)
        except LookupError as exc:
            return [NodeFacts(node=shown, error=str(exc), key_prefix=prefix)], None
        masters = slot_map.masters()
        first_slot = {}
        for slot, owner in enumerate(slot_map.owners):
            if owner is not None and owner not in first_slot:
                first_slot[owner] = slot
        read = each(
            masters,
            lambda m: gather(
                address.member(*m),
                timeout,
                acl_user,
                prefix,
                name=f"{shown} (master {host_port(*m)})",
                kind="cluster",
                tag=slot_tag(first_slot[m]),
                listed=shown,
                form=address.login_form,
            ),
        )
        others = [m for m in slot_map.members if m not in first_slot]
        read += _each(address, others, timeout, acl_user, prefix, "cluster")
        unserved = sum(1 for owner in slot_map.owners if owner is None)
        states = [f.cluster_state or "?" for f in read if not f.replica]
        return read, check_slots(shown, unserved, len(masters), states)
    return [gather(address, timeout, acl_user, prefix)], None


def _replicas_of(master: NodeFacts) -> list[tuple[str, int]]:
    """The replicas a master's ``INFO replication`` lists (``slave0:ip=...,port=...``)."""
    info = master.info or {}
    found = []
    for i in range(_int(info.get("connected_slaves"))):
        fields = dict(p.partition("=")[::2] for p in info.get(f"slave{i}", "").split(","))
        if fields.get("ip") and fields.get("port", "").isdigit():
            found.append((fields["ip"], int(fields["port"])))
    return found


def _int(text: str | None) -> int:
    return int(text) if text is not None and text.isdigit() else 0


def _each(
    address: NodeAddress,
    replicas: Sequence[tuple[str, int]],
    timeout: float,
    acl_user: str | None,
    prefix: str,
    kind: str,
) -> list[NodeFacts]:
    """The replicas of a Sentinel-managed or Cluster node, read in parallel, as servers
    with the node's credentials."""
    if not replicas:
        return []
    shown = address.display

    def one(where: tuple[str, int]) -> NodeFacts:
        server = address.server_at(*where)
        return gather(
            server,
            timeout,
            acl_user,
            prefix,
            name=f"{shown} (replica {host_port(*where)})",
            kind=kind,
            replica=True,
            listed=shown,
            form=address.login_form,
        )

    return each(replicas, one)


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
    listed = len({f.listed or f"{i}" for i, f in enumerate(facts)})
    servers = f" ({len(facts)} servers)" if listed != len(facts) else ""
    return (
        f"tenure check: {listed} node(s){servers}, {counts[Level.OK]} OK, "
        f"{counts[Level.WARN]} WARN, {counts[Level.UNSAFE]} UNSAFE: {verdict} (exit {code})"
    )

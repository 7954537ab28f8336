"""``tenure status``: what every node says about a lock.

``tenure status NAME [--redis URL ...] [--node-timeout SECONDS]``

One line per node, read in one transaction (a consistent snapshot of that node), all
nodes in parallel; exit 0 if a majority of the nodes answered, else 69 (EX_UNAVAILABLE,
as ``tenure run``). A Sentinel-managed node is read on the master its clients would use
now, a Cluster node on the master of the lock's slot, following its ``MOVED`` and ``ASK``
as the clients do; the line names that server. Every Sentinel is asked; each that says
something else than the one whose master the clients use (out of date, naming another
master or none, or not answering) is a warning on stderr, after the lines. A slot being
migrated whose keys cannot be read together (``TRYAGAIN``), or a cluster down
(``CLUSTERDOWN``), is an unreachable node.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, TextIO

import redis
from redis.exceptions import ResponseError

from .._core.config import (
    DEFAULT_KEY_PREFIX,
    LockKeys,
    NodeAddress,
    check_key_prefix,
    check_name,
    check_one_server,
    host_port,
    parse_node_url,
    refuse_twins,
)
from .._core.diagnosis import slot_unserved
from .._core.quorum import majority
from .._core.slots import MAX_REDIRECTS, Address, Redirect, key_slot, map_sources, redirect
from .._driver.redis_compat import (
    NotRedis,
    check_connection_options,
    connection_kwargs,
    own_connection,
    reply_text,
)
from .._errors import ConfigurationError
from ._parallel import budget, each, late_text
from ._text import failure_line
from ._topology import cluster_map, not_a_master, sentinel_master, sentinel_seconds
from .run import EXIT_UNAVAILABLE

__all__ = ["status"]


def status(
    name: str,
    nodes: Sequence[str],
    *,
    node_timeout: float = 0.5,
    key_prefix: str = DEFAULT_KEY_PREFIX,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Print one line per node about lock ``name``; 0 if a majority answered, else 69.

    Each line: the node (for a Sentinel-managed node, ``(master host:port)`` after it,
    the master its Sentinels name now; for a Cluster node, ``(slot s: master
    host:port)``, the master of the lock's slot, with ``, migrating to host:port`` when
    the slot is being migrated and the read followed its ``ASK`` there), then ``held
    token=<first 8 chars of the holder's token>`` or ``free token=-``, ``pttl=<ms>`` of
    the lock key, ``floor=<token>`` (the node's floor, the highest fencing token it
    granted for any lock: the next token it grants is above it; ``-``: the node is blank,
    never used or it lost its data), ``warm=<ms>`` (the warm-up left after a data loss, or ``-``),
    ``replid=<first 8 chars>`` (the replication ID the floor was written under, or
    ``-``); or ``unreachable: <error>``. The master of a Sentinel-managed node is the
    one the clients would use: the first named, in the order the Sentinels are listed,
    that answers ``ROLE`` as a master. Every Sentinel is asked, and each that says
    something else is a line ``tenure status: warning: <node>: Sentinel host:port ...``
    on ``err``, after the nodes' lines (``_core.sentinel.Survey``).

    The node keys are read where the clients keep them: when any node is a whole Redis
    Cluster, per hash slot on every node (``<prefix>{T[s]}:floor``...), as a client
    listing these nodes keeps them.

    ``key_prefix``: the prefix of the clients whose lock this is (their ``key_prefix``).

    Raises:
        ConfigurationError: an empty name, a malformed URL, or a key prefix the clients
            would refuse.
    """
    stdout = sys.stdout if out is None else out
    stderr = sys.stderr if err is None else err
    name = check_name(name)
    if not nodes:
        raise ConfigurationError("--redis", "no Redis nodes given")
    addresses = [
        check_one_server(parse_node_url(url, f"--redis[{i}]"), f"--redis[{i}]", "tenure status")
        for i, url in enumerate(nodes)
    ]
    # Counted twice, it would make a majority of answers out of one server's.
    refuse_twins(addresses, "--redis")
    # A URL option redis-py refuses (``?socket_timeout=abc``) is the caller's to fix,
    # not the node's failure.
    check_connection_options(None, addresses, node_timeout, asyncio=False, listed="--redis")
    prefix = check_key_prefix(key_prefix, "--key-prefix")
    # Where the clients keep the node keys: per slot on every node when one node is a
    # whole Redis Cluster (ClientConfig.per_slot).
    keys = LockKeys.of(name, prefix, per_slot=any(a.seeds for a in addresses))
    # Each node within its budget: a server that never ends a reply is not waited for.
    lines = each(
        addresses,
        lambda a: _listed_status(a, keys, node_timeout, prefix),
        lambda a, seconds: (a.display, False, late_text(seconds), ()),
        lambda a: _budget(a, node_timeout),
    )
    width = max(len(shown) for shown, _, _, _ in lines)
    answered = 0
    for shown, ok, text, _ in lines:
        answered += ok
        print(f"{shown:<{width}}  {text}", file=stdout)
    stdout.flush()
    for address, (_, _, _, warnings) in zip(addresses, lines, strict=True):
        for warning in warnings:
            print(f"tenure status: warning: {address.display}: {warning}", file=stderr)
    stderr.flush()
    needed = majority(len(addresses))
    if answered < needed:
        print(
            f"tenure status: only {answered} of {len(addresses)} nodes answered; "
            f"a majority is {needed}",
            file=stderr,
            flush=True,
        )
        return EXIT_UNAVAILABLE
    return 0


def _budget(address: NodeAddress, timeout: float) -> float:
    """The seconds reading a listed node is given (``_parallel.budget``), each of its
    connections and replies within the node timeout ``timeout``."""
    if address.sentinel is not None:
        # Finding the master, bounded on its own (``sentinel_seconds``: the Sentinels
        # asked side by side, then the masters they name); then, when none named can be
        # used, its ROLE again for the line (two); then the keys (two).
        return sentinel_seconds(timeout) + budget(2 + 2, timeout)
    if address.seeds:
        # The slot map from each seed in turn, then the keys on the master of the slot
        # and on each master a redirection names.
        waits = 2 * len(map_sources(address.seeds, None)) + 2 * (MAX_REDIRECTS + 1)
        return budget(waits, timeout)
    return budget(2, timeout)


def _listed_status(
    address: NodeAddress, keys: LockKeys, timeout: float, prefix: str
) -> tuple[str, bool, str, Sequence[str]]:
    """The line of one listed node: its name (and the server it stands for now), whether
    it answered, what it said, and the warnings about it (its Sentinels that differ)."""
    shown = address.display
    server = address
    try:
        if address.sentinel is not None:
            master = sentinel_master(address, timeout)
            server, shown = master.address, f"{shown} (master {master.where})"
        elif address.seeds:
            slot_map = cluster_map(address, timeout)
            slot = key_slot(keys.lock)
            owner = slot_map.owner(slot)
            if owner is None:
                return shown, False, f"unreachable: {slot_unserved(slot).detail}", ()
            return (*_slot_status(address, shown, slot, owner, keys, timeout, prefix), ())
    except LookupError as exc:
        return shown, False, f"unreachable: {exc}", ()
    warnings = master.sentinel_warnings if address.sentinel is not None else ()
    try:
        if address.sentinel is not None and not master.usable:
            # The clients lock on the server the Sentinels name only once it says it is
            # a master; a replica's copy of the keys is not what they would be granted on.
            stale = not_a_master(address, master, timeout)
            if stale is not None:
                return shown, False, f"unreachable: {stale}", warnings
        return shown, True, _snapshot(server, keys, timeout, prefix, asking=False), warnings
    except Exception as exc:  # anything the node did: that line says so, the rest go on
        return shown, False, failure_line(exc, prefix, address.login_form), warnings


def _slot_status(
    address: NodeAddress,
    shown: str,
    slot: int,
    owner: Address,
    keys: LockKeys,
    timeout: float,
    prefix: str,
) -> tuple[str, bool, str]:
    """The line of a Cluster node, read on ``owner``, the master of ``slot`` in its slot
    map, following the redirections the lock clients follow: a cluster member answers
    them to a node listed as a whole cluster, so they are never its configuration."""
    at, asking, hops = owner, False, 0
    form = address.login_form  # the form of URL its advice shows: the cluster's
    where = f"master {host_port(*owner)}"
    while True:
        try:
            text = _snapshot(address.server_at(*at), keys, timeout, prefix, asking=asking)
        except ResponseError as exc:
            hop = redirect(reply_text(exc), at)
            if hop is None:  # the member's own answer (an ACL refusal...), as for any node
                return f"{shown} (slot {slot}: {where})", False, failure_line(exc, prefix, form)
            if hop.to is None:
                return f"{shown} (slot {slot}: {where})", False, _unsettled(hop, slot, exc)
            if hops == MAX_REDIRECTS:
                # Redirected as many times as a client is within a round: the cluster keeps
                # pointing elsewhere (a migration or a failover in progress).
                return f"{shown} (slot {slot}: {where})", False, f"unreachable: {hop.detail()}"
            hops += 1
            if hop.kind == "moved":
                # The slot changed owner since the map was read: the line names the new
                # one, which holds the keys now.
                where = f"master {host_port(*hop.to)}"
            else:
                # Migrating, this lock's keys (some or all) moved to the importing
                # master, which serves them to a request sent after ASKING.
                where = f"master {host_port(*at)}, migrating to {host_port(*hop.to)}"
            at, asking = hop.to, hop.kind == "ask"
        except Exception as exc:  # anything the member did: that line says so
            return f"{shown} (slot {slot}: {where})", False, failure_line(exc, prefix, form)
        else:
            return f"{shown} (slot {slot}: {where})", True, text


def _unsettled(hop: Redirect, slot: int, exc: ResponseError) -> str:
    """A transient state of the cluster (``TRYAGAIN``, ``CLUSTERDOWN``), said as what it
    is: the node does not answer for the slot now, as an unreachable one does not."""
    said = reply_text(exc)  # one line, as every error reply is
    if hop.kind == "tryagain":
        return (
            f"unreachable: slot {slot} is being migrated between two masters, and this "
            "lock's keys cannot be read together until the migration ends (it answered "
            f"{said})"
        )
    return (
        f"unreachable: the cluster cannot serve slot {slot} now (it answered {said}): "
        "no lock of that slot can be taken on this node until it does"
    )


def _snapshot(
    server: NodeAddress, keys: LockKeys, timeout: float, prefix: str, *, asking: bool
) -> str:
    """What ``server`` holds of the lock, read in one transaction; ``asking``: sent after
    ``ASKING``, to the master importing the lock's slot.

    Raises:
        Exception: whatever the connection or the node raised.
    """
    options = connection_kwargs(timeout, asyncio=False, unix=server.scheme == "unix")
    options["socket_timeout"] = timeout
    commands: list[tuple[str, ...]] = [("ASKING",)] if asking else []
    commands += [
        ("MULTI",),  # one consistent snapshot
        ("TYPE", keys.lock),
        ("GET", keys.lock),
        ("PTTL", keys.lock),
        ("GET", keys.floor),
        ("PTTL", keys.warm),
        ("GET", keys.replid),
        ("EXEC",),
    ]
    pool = redis.ConnectionPool.from_url(server.url, **options)
    # Sent on one connection, as the member answers ASKING for the next command on that
    # connection only (MULTI...EXEC is one), and read without redis-py's pipeline, which
    # rewrites the error reply of a queued command ("Command # 1 (TYPE ...) of pipeline
    # caused error: MOVED ...") where a redirection is read (``own_connection``).
    conn = own_connection(pool)
    try:
        packed = conn.pack_commands(commands)
        conn.send_packed_command(packed)
        answers = [_answer(conn) for _ in commands]
    finally:
        conn.disconnect()
        pool.disconnect()
    replies = answers[-1]
    if isinstance(replies, Exception):  # EXECABORT: a command refused as it was queued
        raise next(a for a in answers if isinstance(a, Exception))
    refused = next((a for a in answers if isinstance(a, Exception)), None)
    if refused is not None:  # ASKING refused (an ACL), the transaction run without it
        raise refused
    _check_transaction(answers, len(commands) - 2 - asking)
    kind = _text(replies[0])
    if kind not in ("string", "none"):
        # Not a lock of tenure's: another application writes under its key prefix.
        # The node answered; what it holds there is for the operator to see.
        return (
            f"foreign: {keys.lock} holds a {kind}, not a tenure lock (another "
            f"application writes under the key prefix {prefix!r}): give tenure's "
            "clients a key_prefix of their own, or remove that key; no tenure client "
            "can lock this name on this node until then"
        )
    failed = next((r for r in replies if isinstance(r, Exception)), None)
    if failed is not None:
        raise failed
    _, holder, pttl, floor, warm, replid = replies
    floor_text = "-" if floor is None else _text(floor)
    warm_text = f"{warm}ms" if isinstance(warm, int) and warm > 0 else "-"
    replid_text = "-" if replid is None else _text(replid)[:8]
    if holder is None:
        state, token, pttl_text = "free", "-", "-"
    else:
        state, token = "held", _text(holder)[:8]
        pttl_text = f"{pttl}ms" if isinstance(pttl, int) and pttl >= 0 else "none"
    return (
        f"{state}  token={token:<8}  pttl={pttl_text:<7}  floor={floor_text}  warm={warm_text}"
        f"  replid={replid_text}"
    )


def _check_transaction(answers: list[Any], queued: int) -> None:
    """Raise ``NotRedis`` unless ``answers`` end as a Redis transaction's: ``OK`` to
    MULTI, ``QUEUED`` to each of the ``queued`` commands, and EXEC's list of their
    replies, the first (TYPE's) a status text.

    Something that answers every command alike (an echo service, a stub that says ``+OK``
    or ``:1``) is not a node whose keys were read, and a line saying what it "holds" would
    send the operator after another application instead of the URL's host and port.
    """
    *queueing, replies = answers[-queued - 2 :]
    if (
        [_text(a) for a in queueing] != ["OK", *["QUEUED"] * queued]
        or not isinstance(replies, list)
        or len(replies) != queued
        or not isinstance(replies[0], (str, bytes))
    ):
        raise NotRedis(f"a transaction answered {_text(replies)[:40]!r}")


def _answer(conn: redis.Connection) -> Any:
    """The next reply on ``conn``; an error reply as its exception, not raised."""
    try:
        return conn.read_response()
    except ResponseError as exc:
        return exc


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)

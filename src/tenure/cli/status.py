"""``tenure status``: what every node says about a lock.

``tenure status NAME [--redis URL ...] [--node-timeout SECONDS]``

One line per node, read in one transaction (a consistent snapshot of that node), all
nodes in parallel; exit 0 if a majority of the nodes answered, else 69 (EX_UNAVAILABLE,
as ``tenure run``). A Sentinel-managed node is read on the master its Sentinels name now,
a Cluster node on the master of the lock's slot; the line names that server.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TextIO

import redis

from .._core.config import (
    DEFAULT_KEY_PREFIX,
    LockKeys,
    NodeAddress,
    check_key_prefix,
    check_name,
    check_one_server,
    host_port,
    parse_node_url,
)
from .._core.diagnosis import for_prefix, slot_unserved
from .._core.quorum import Failure, majority
from .._core.slots import key_slot
from .._driver.redis_compat import check_connection_options, connection_kwargs, diagnose
from .._errors import ConfigurationError
from ._text import one_line
from ._topology import cluster_map, sentinel_master
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
    host:port)``, the master of the lock's slot), then ``held token=<first 8 chars of the
    holder's token>`` or ``free token=-``, ``pttl=<ms>`` of the lock key,
    ``floor=<token>`` (the node's floor, the highest fencing token it granted for any
    lock: the next token it grants is above it; ``-``: the node is blank, never used or
    it lost its data), ``warm=<ms>`` (the warm-up left after a data loss, or ``-``),
    ``replid=<first 8 chars>`` (the replication ID the floor was written under, or
    ``-``); or ``unreachable: <error>``.

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
    check_name(name)
    if not nodes:
        raise ConfigurationError("--redis", "no Redis nodes given")
    addresses = [
        check_one_server(parse_node_url(url, f"--redis[{i}]"), f"--redis[{i}]", "tenure status")
        for i, url in enumerate(nodes)
    ]
    # A URL option redis-py refuses (``?socket_timeout=abc``) is the caller's to fix,
    # not the node's failure.
    check_connection_options(None, addresses, node_timeout, asyncio=False, listed="--redis")
    prefix = check_key_prefix(key_prefix, "--key-prefix")
    # Where the clients keep the node keys: per slot on every node when one node is a
    # whole Redis Cluster (ClientConfig.per_slot).
    keys = LockKeys.of(name, prefix, per_slot=any(a.seeds for a in addresses))
    with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
        lines = list(pool.map(lambda a: _listed_status(a, keys, node_timeout, prefix), addresses))
    width = max(len(shown) for shown, _, _ in lines)
    answered = 0
    for shown, ok, text in lines:
        answered += ok
        print(f"{shown:<{width}}  {text}", file=stdout)
    stdout.flush()
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


def _listed_status(
    address: NodeAddress, keys: LockKeys, timeout: float, prefix: str
) -> tuple[str, bool, str]:
    """The line of one listed node: its name (and the server it stands for now), whether
    it answered, and what it said."""
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
                return shown, False, f"unreachable: {slot_unserved(slot).detail}"
            server = address.server_at(*owner)
            shown = f"{shown} (slot {slot}: master {host_port(*owner)})"
    except LookupError as exc:
        return shown, False, f"unreachable: {exc}"
    ok, text = _node_status(server.url, server.scheme == "unix", keys, timeout, prefix)
    return shown, ok, text


def _node_status(
    url: str, unix: bool, keys: LockKeys, timeout: float, prefix: str
) -> tuple[bool, str]:
    options = connection_kwargs(timeout, asyncio=False, unix=unix)
    options["socket_timeout"] = timeout
    client = redis.Redis.from_url(url, **options)
    try:
        with client.pipeline(transaction=True) as pipe:  # one consistent snapshot
            pipe.type(keys.lock)
            pipe.get(keys.lock)
            pipe.pttl(keys.lock)
            pipe.get(keys.floor)
            pipe.pttl(keys.warm)
            pipe.get(keys.replid)
            replies = pipe.execute(raise_on_error=False)
        kind = _text(replies[0])
        if kind not in ("string", "none"):
            # Not a lock of tenure's: another application writes under its key prefix.
            # The node answered; what it holds there is for the operator to see.
            return True, (
                f"foreign: {keys.lock} holds a {kind}, not a tenure lock (another "
                f"application writes under the key prefix {prefix!r}): give tenure's "
                "clients a key_prefix of their own, or remove that key; no tenure client "
                "can lock this name on this node until then"
            )
        failed = next((r for r in replies if isinstance(r, Exception)), None)
        if failed is not None:
            raise failed
        _, holder, pttl, floor, warm, replid = replies
    except Exception as exc:  # anything the node did: that line says so, the rest go on
        why = diagnose(exc)
        if why.failure is Failure.UNREACHABLE:
            return False, f"unreachable: {one_line(exc)}"
        # A fix it suggests (an ACL's key pattern) is for the clients of ``prefix``.
        return False, f"{why.failure.value}: {for_prefix(why.detail, prefix)}"
    finally:
        client.close()
    floor_text = "-" if floor is None else _text(floor)
    warm_text = f"{warm}ms" if isinstance(warm, int) and warm > 0 else "-"
    replid_text = "-" if replid is None else _text(replid)[:8]
    if holder is None:
        state, token, pttl_text = "free", "-", "-"
    else:
        state, token = "held", _text(holder)[:8]
        pttl_text = f"{pttl}ms" if isinstance(pttl, int) and pttl >= 0 else "none"
    return True, (
        f"{state}  token={token:<8}  pttl={pttl_text:<7}  floor={floor_text}  warm={warm_text}"
        f"  replid={replid_text}"
    )


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)

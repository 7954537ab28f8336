"""``tenure demo`` end to end on real redis-server processes and worker processes, and the
CLI basics."""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tenure import ConfigurationError, __version__
from tenure.cli import main
from tenure.cli.demo import MAX_DURATION, MAX_NODES, MAX_WORKERS, _check, run_demo
from tenure.cli.main import _build_parser
from tenure.verify.history import Grant, HistoryWriter, Release, Request, Write

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


def _rows(lines: list[str], start: int) -> dict[str, dict[str, str]]:
    """The table whose header is ``lines[start]``, as {first cell: {column: cell}};
    cells are 2+ spaces apart, the table ends at a blank line."""
    header = re.split(r"\s{2,}", lines[start].strip())
    rows: dict[str, dict[str, str]] = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = re.split(r"\s{2,}", line.strip())
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def _table(stdout: str) -> dict[str, dict[str, str]]:
    """The result table, by run label."""
    lines = stdout.splitlines()
    return _rows(lines, next(i for i, line in enumerate(lines) if line.startswith("run ")))


def _phases(stdout: str) -> list[dict[str, str]]:
    """The locked run's table of phases, in order."""
    lines = stdout.splitlines()
    start = lines.index("with lock, phase by phase:") + 1
    return list(_rows(lines, start).values())


# Once per run: these tests run on one pytest-xdist worker (the "worlds" group), and a
# session fixture is not torn down when that worker runs other modules' tests in between.
@pytest.fixture(scope="session")
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
        "overlaps",
        "lost updates",
    }
    assert rows["with lock"]["workers"] == rows["without lock"]["workers"] == "4"


def test_locked_run_is_exclusive_and_loses_nothing(
    quick_demo: subprocess.CompletedProcess[str],
) -> None:
    locked = _table(quick_demo.stdout)["with lock"]
    assert int(locked["cycles"]) > 0
    assert locked["max holders"] == "1"
    assert locked["overlaps"] == "0"
    assert locked["lost updates"] == "0"


def test_unlocked_run_loses_updates(quick_demo: subprocess.CompletedProcess[str]) -> None:
    unlocked = _table(quick_demo.stdout)["without lock"]
    assert int(unlocked["lost updates"]) > 0
    assert int(unlocked["max holders"]) > 1
    assert int(unlocked["overlaps"]) > 0


def test_quick_demo_reports_the_faults_with_their_proofs(
    quick_demo: subprocess.CompletedProcess[str],
) -> None:
    out = quick_demo.stdout
    # Read back from the run's history, each with the evidence the world observed.
    assert re.search(
        r"n2 paused \(SIGSTOP\), t=\S+ resumed \(SIGCONT\); "
        r"proof: state T in /proc/\d+/stat; PONG after SIGCONT",
        out,
    ), out
    assert re.search(r"n4 killed \(SIGKILL\); proof: pid \d+ gone: True", out), out
    # The progress display goes to stderr, one line a second when it is not a terminal.
    assert "cycles" in quick_demo.stderr


def test_quick_demo_accounts_for_every_phase(
    quick_demo: subprocess.CompletedProcess[str],
) -> None:
    phases = _phases(quick_demo.stdout)
    assert [p["faults in force"] for p in phases] == [
        "none",
        "n2 paused",
        "n2 paused, n4 killed",
        "n4 killed",
    ]
    # The phases cut the run without gap or overlap: their cycles are all the run's.
    total = int(_table(quick_demo.stdout)["with lock"]["cycles"])
    assert sum(int(p["cycles"]) for p in phases) == total
    assert [p["to"] for p in phases[:-1]] == [p["from"] for p in phases[1:]]


# --- the figures are the checker's -----------------------------------------------------------


def _plant(history_dir: Path) -> None:
    """Two overlapping leases and an acknowledged write missing from the counter, written
    before the run (a minute earlier on the shared monotonic clock) as a worker would."""
    history_dir.mkdir(parents=True)
    t0 = time.monotonic_ns() - 60 * 10**9
    with HistoryWriter(history_dir / "planted.jsonl") as out:
        for i, start in enumerate((t0, t0 + 50_000_000)):
            out.write(Request(f"P{i}", start - 1_000))
            out.write(Grant(f"P{i}", f"planted{i}", None, start - 1_000, start, start + 10**9))
            out.write(
                Release(f"P{i}", f"planted{i}", start + 100_000_000, start + 100_100_000, "ok")
            )
        out.write(Write("P0", "planted0", None, "P0.1", t0 + 10, t0 + 20, "ok", None))


def test_demo_figures_come_from_the_checker(tmp_path: Path) -> None:
    # One worker cannot race itself: whatever overlap or loss the demo reports here is
    # the planted one, found in the history by the checker like any other.
    _plant(tmp_path / "with-lock" / "history")
    _plant(tmp_path / "without-lock" / "history")
    out = io.StringIO()
    code = run_demo(workers=1, duration=1.0, out=out, progress=io.StringIO(), directory=tmp_path)
    rows = _table(out.getvalue())
    assert rows["without lock"]["max holders"] == "2"
    assert rows["without lock"]["overlaps"] == "1"
    assert rows["without lock"]["lost updates"] == "1"
    # In the locked run the same plant is a violation: the demo fails.
    assert int(rows["with lock"]["max holders"]) >= 2
    assert int(rows["with lock"]["overlaps"]) >= 1
    assert rows["with lock"]["lost updates"] == "1"
    assert code == 1
    assert "FAIL: the locked run was not clean" in out.getvalue()


def test_ctrl_c_stops_the_workers_and_the_nodes() -> None:
    # A terminal's Ctrl-C goes to the whole foreground process group.
    # ``with``: the pipes are closed whatever happens (left to the garbage collector, they
    # would fail a later test with a ResourceWarning).
    with subprocess.Popen(
        [sys.executable, "-m", "tenure.cli", "demo", "--duration", "60"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=_default_sigint,
    ) as proc:
        try:
            assert proc.stderr is not None
            for line in proc.stderr:  # the run is under way once cycles are counted
                if line.startswith("with lock:") and " cycles " in line:
                    break
            started = _descendants(proc.pid)
            assert len(started) >= 8 + 6  # workers, lock nodes, store
            os.killpg(proc.pid, signal.SIGINT)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 130, err
    assert "tenure: interrupted" in err
    assert "Traceback" not in err
    # Every process it started is gone (or a zombie about to be reaped by init).
    # multiprocessing's resource tracker leaves only once it reads EOF from the demo,
    # so it may still be on its way out (empty cmdline, reparented) when the demo has
    # exited: wait for it, as long as it takes, within the test's bound.
    deadline = time.monotonic() + 10
    while (alive := [pid for pid in started if _alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert alive == []


def _default_sigint() -> None:
    # A shell without job control starts background commands with SIGINT ignored, and a
    # child inherits that: the demo must get Ctrl-C however pytest itself was started.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = [pid]
    while todo:
        parent = todo.pop()
        # A thread (or a process) may end while it is read: it has no children then.
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for task in Path(f"/proc/{parent}/task").iterdir():
                with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                    children = (task / "children").read_text().split()
                    found += [int(c) for c in children]
                    todo += [int(c) for c in children]
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


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


@pytest.mark.parametrize("ttl", ["0.001", "0.106", "60.5", "1e9"])
def test_a_ttl_the_workers_would_refuse_is_a_usage_error_before_anything_starts(ttl: str) -> None:
    # It started the nodes and the workers, whose clients each refused the TTL, spent
    # the whole run on no cycle, and exited 1 ("the locked run was not clean").
    started = time.monotonic()
    result = _tenure("demo", "--quick", "--ttl", ttl, timeout=_DEMO_TIMEOUT)
    assert result.returncode == 2, result
    assert result.stdout == ""
    # Refused by the command line's type (the workers' clients' range), before run_demo's
    # own check of it (test_the_bounds_of_the_ttl_are_accepted).
    assert result.stderr.splitlines()[-1] == (
        "tenure demo: error: argument --ttl: must be a number of seconds from 0.107 to 60, "
        f"got {ttl} (the default is 2 s; e.g. --ttl 5)"
    ), result.stderr
    assert time.monotonic() - started < 10


@pytest.mark.parametrize("ttl", [0.107, 60.0])
def test_the_bounds_of_the_ttl_are_accepted(ttl: float) -> None:
    _check(1, 1.0, 1, ttl)


@pytest.mark.parametrize(
    ("option", "value", "said"),
    [
        (
            "--nodes",
            "1001",
            "must be an odd integer from 1 to 15, got 1001 (the default is 5; e.g. --nodes 7)",
        ),
        # Odd was left to run_demo, which said neither the option's syntax nor an example.
        (
            "--nodes",
            "4",
            "must be an odd integer from 1 to 15, got 4 (the default is 5; e.g. --nodes 7)",
        ),
        (
            "--workers",
            "100000",
            "must be an integer from 1 to 64, got 100000 (the default is 8, 4 with --quick; "
            "e.g. --workers 16)",
        ),
        (
            "--duration",
            "1e300",
            "must be a positive number of seconds, at most 3600, got 1e300 (the default is "
            "6 s, 3 s with --quick; e.g. --duration 10)",
        ),
        (
            "--duration",
            "nan",
            "must be a positive number of seconds, at most 3600, got nan (the default is 6 s, "
            "3 s with --quick; e.g. --duration 10)",
        ),
    ],
)
def test_demo_sizes_past_their_bounds_are_usage_errors(
    option: str, value: str, said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Parsed only: accepted, --nodes 1001 started 1001 servers, --workers 100000 as
    # many processes, and --duration 1e300 ran for ever.
    with pytest.raises(SystemExit) as exited:
        _build_parser().parse_args(["demo", "--quick", option, value])
    assert exited.value.code == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line == f"tenure demo: error: argument {option}: {said}", line


def test_the_demo_bounds_are_accepted_and_said_in_its_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    most = ["--workers", "64", "--nodes", "15", "--duration", "3600"]
    args = _build_parser().parse_args(["demo", *most])
    assert (args.workers, args.nodes, args.duration) == (MAX_WORKERS, MAX_NODES, MAX_DURATION)
    _check(MAX_WORKERS, MAX_DURATION, MAX_NODES, 2.0)
    with pytest.raises(SystemExit):
        _build_parser().parse_args(["demo", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for said in ("1 to 64", "1 to 15", "at most 3600", "0.107 to 60"):
        assert said in shown


@pytest.mark.parametrize(
    ("workers", "duration", "nodes", "parameter"),
    [(MAX_WORKERS + 1, 1.0, 5, "workers"), (1, 1e300, 5, "duration"), (1, 1.0, 1001, "nodes")],
)
def test_run_demo_refuses_sizes_past_their_bounds(
    workers: int, duration: float, nodes: int, parameter: str
) -> None:
    # The same bounds for a caller of run_demo, before anything starts.
    with pytest.raises(ConfigurationError) as info:
        _check(workers, duration, nodes, 2.0)
    assert info.value.parameter == parameter
    assert f"give --{parameter} in that range" in str(info.value)


def test_no_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "a command is required" in capsys.readouterr().err


def test_tenure_error_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    # A URL of another scheme is refused by the library (ConfigurationError) before any
    # node is asked. (It was an even --nodes, rejected by run_demo; the command line's
    # type refuses that now, a usage error: test_demo_sizes_past_their_bounds_...)
    assert main(["status", "x", "--redis", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("tenure: error: --redis[0]:")
    assert "Traceback" not in err

"""``tenure run`` and ``tenure status`` end to end: real processes on real redis-server nodes.

Every ``tenure`` here is a separate ``python -m tenure.cli`` process, and every command it
runs is a real ``sh``, so exit statuses, environment, process groups and signals are the
operating system's, not a simulation's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tenure
from tenure.cli.run import EXIT_LOST, EXIT_NOT_ACQUIRED, EXIT_UNAVAILABLE
from tenure.testing import LocalCluster

from .garbage import SPEAKS, GarbageServer

_TIMEOUT = 30  # seconds for any one tenure process; far above what each should take
# tenure run's own errors (documented in its --help): a literal, so that the tests pin it.
EXIT_TENURE_ERROR = 78
# A lock the test holds while a tenure process starts and runs must outlive it: a 10 s
# TTL once expired under a loaded machine before the process even queued.
_HELD_TTL = 2 * _TIMEOUT


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Three healthy nodes shared by the tests that inject no faults (names are per test)."""
    with LocalCluster(3) as c:
        yield c


@pytest.fixture
def faulty() -> Iterator[LocalCluster]:
    """Three fresh nodes a test may kill."""
    with LocalCluster(3) as c:
        yield c


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TENURE_REDIS"}
    env.update(extra)
    return env


def _redis(c: LocalCluster) -> list[str]:
    return [arg for url in c.urls for arg in ("--redis", url)]


# A tenure process whose wall clock is an hour behind: its first guess of a fencing
# token is then below every token issued before, and only the nodes' floors order them.
_CLOCK_AN_HOUR_BEHIND = (
    "import runpy, tenure._driver.client_base as c; w = c.wall_us; "
    "c.wall_us = lambda: w() - 3_600_000_000; "
    "runpy.run_module('tenure.cli', run_name='__main__', alter_sys=True)"
)


def _tenure(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = _TIMEOUT,
    prelude: str | None = None,
) -> subprocess.CompletedProcess[str]:
    how = ["-m", "tenure.cli"] if prelude is None else ["-c", prelude]
    command = [sys.executable, *how, *args]
    # faulthandler: a tenure that hangs past the timeout is sent SIGABRT, and the test's
    # failure shows where each of its threads was. Files, not pipes: a command it started
    # may hold pipes open after tenure itself is gone.
    environ = {**(_env() if env is None else env), "PYTHONFAULTHANDLER": "1"}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        with subprocess.Popen(command, stdout=out, stderr=err, text=True, env=environ) as proc:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGABRT)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                err.seek(0)
                pytest.fail(f"{command} still ran after {timeout} s; its stderr:\n{err.read()}")
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(command, proc.returncode, out.read(), err.read())


def _spawn(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tenure.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=_default_sigint,
    )


def _reap(proc: subprocess.Popen[str]) -> None:
    """Kill a spawned ``tenure run`` that a failed test left running."""
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def _default_sigint() -> None:
    # A shell without job control starts background commands with SIGINT and SIGQUIT
    # ignored, and tenure run keeps an ignored signal ignored (as nohup expects); the
    # tests that signal it must not depend on how pytest itself was started.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _wait_for_pids(path: Path, proc: subprocess.Popen[str]) -> list[int]:
    """The PIDs the command wrote to ``path`` (it writes them once it runs)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return [int(p) for p in path.read_text().split()]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    raise AssertionError(f"the command never wrote {path}")


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie waiting for init to reap it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def _all_gone(pids: list[int], within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while not all(_gone(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _status(c: LocalCluster, name: str) -> tuple[int, list[str]]:
    result = _tenure("status", name, *_redis(c))
    return result.returncode, result.stdout.splitlines()


def _no_key_left(c: LocalCluster, name: str) -> bool:
    key = f"tenure:{{{name}}}:lock"
    for node in c:
        with node.client() as r:
            if r.exists(key):
                return False
    return True


# --- the command's status, environment and arguments ----------------------------------


@pytest.mark.parametrize(
    ("script", "expected"),
    [("exit 0", 0), ("exit 7", 7), ("exit 255", 255), ("kill -TERM $$", 128 + 15)],
)
def test_exit_status_is_passed_through(
    cluster: LocalCluster, key: str, script: str, expected: int
) -> None:
    result = _tenure("run", key, *_redis(cluster), "--", "sh", "-c", script)
    assert result.returncode == expected, result.stderr
    assert result.stderr == ""
    assert _no_key_left(cluster, key)  # released


def test_env_has_token_and_name_and_tokens_increase(cluster: LocalCluster, key: str) -> None:
    script = 'echo "$TENURE_FENCING_TOKEN $TENURE_LOCK_NAME"'
    first = _tenure("run", key, *_redis(cluster), "--", "sh", "-c", script)
    # The second run takes its nodes from $TENURE_REDIS instead of --redis, and its
    # clock is behind the first's: its token is above only if the floors order it.
    second = _tenure(
        "run", key, "--", "sh", "-c", script,
        env=_env(TENURE_REDIS=",".join(cluster.urls)), prelude=_CLOCK_AN_HOUR_BEHIND,
    )  # fmt: skip
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    token1, name1 = first.stdout.split()
    token2, name2 = second.stdout.split()
    assert name1 == name2 == key
    assert int(token2) > int(token1) > 0


def test_everything_after_double_dash_is_the_commands(cluster: LocalCluster, key: str) -> None:
    script = 'printf "%s|" "$@"'
    result = _tenure(
        "run", key, *_redis(cluster), "--ttl", "5", "--", "sh", "-c", script, "sh",
        "--ttl", "x", "--", "--no-wait",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == "--ttl|x|--|--no-wait|"


def test_command_not_found_is_127_and_releases(cluster: LocalCluster, key: str) -> None:
    result = _tenure("run", key, *_redis(cluster), "--", "/nonexistent/tenure-test-command")
    assert result.returncode == 127
    assert "not found" in result.stderr
    assert _no_key_left(cluster, key)


# --- not acquired ---------------------------------------------------------------------


def test_no_wait_while_held_exits_75_at_once(
    cluster: LocalCluster, key: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    with tenure.Client(cluster.urls) as client, client.lock(key, ttl=_HELD_TTL):
        started = time.monotonic()
        result = _tenure(
            "run", key, *_redis(cluster), "--no-wait", "--", "sh", "-c", f"touch {marker}"
        )
        elapsed = time.monotonic() - started
        waited = _tenure(
            "run", key, *_redis(cluster), "--wait", "0.3", "--", "sh", "-c", f"touch {marker}"
        )
    assert result.returncode == EXIT_NOT_ACQUIRED == 75, result.stderr
    assert "held by another client" in result.stderr
    # No waiting: a run that waited would last until the holder let go, after both runs
    # (or until its lease's TTL of a minute). Interpreter start-up and one round trip
    # take well under a second, but over 3 s on a loaded 2-core machine.
    assert elapsed < _TIMEOUT / 3
    assert waited.returncode == 75, waited.stderr
    assert "after --wait=0.3s" in waited.stderr  # the option typed, not acquire's timeout
    assert not marker.exists()  # the command never ran


def test_sigint_while_waiting_exits_130_without_running(
    cluster: LocalCluster, key: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    with tenure.Client(cluster.urls) as client, client.lock(key, ttl=_HELD_TTL):
        proc = _spawn("run", key, *_redis(cluster), "--", "sh", "-c", f"touch {marker}")
        try:
            # Signal only once it waits for the lock (queued on the nodes): earlier, on a
            # loaded machine, the signal would land while the interpreter is still starting.
            deadline = time.monotonic() + _TIMEOUT
            with cluster[0].client() as r:
                while not r.zcard(f"tenure:{{{key}}}:q"):
                    assert proc.poll() is None, proc.communicate()
                    assert time.monotonic() < deadline, "tenure run never queued for the lock"
                    time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=_TIMEOUT)
        finally:
            _reap(proc)
    assert proc.returncode == 130, err
    assert not marker.exists()


# --- losing the lease -----------------------------------------------------------------


def test_lost_lease_kills_the_command_group_and_exits_79(
    faulty: LocalCluster, key: str, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    # Ignores SIGTERM (and so does its background child, which inherits that), so only the
    # SIGKILL escalation after --grace can stop them.
    script = f'trap "" TERM; sleep 30 & echo $$ $! > {pids}; wait; wait'
    # A TTL of 1.5 s: until the nodes are killed, the watchdog (every 0.5 s) may wake a
    # second late on a loaded machine without losing the lease as paused.
    ttl, grace = 1.5, 0.5
    proc = _spawn(
        "run", key, *_redis(faulty), "--ttl", str(ttl), "--grace", str(grace),
        "--", "sh", "-c", script,
    )  # fmt: skip
    try:
        shell, sleeper = _wait_for_pids(pids, proc)
        started = time.monotonic()
        faulty[0].kill()
        faulty[1].kill()
        _, err = proc.communicate(timeout=_TIMEOUT)
        elapsed = time.monotonic() - started
    finally:
        _reap(proc)
    assert proc.returncode == EXIT_LOST == 79, err
    # Found at the next extension (TTL/3 at most), then SIGTERM, --grace, SIGKILL; with
    # seconds to spare for a loaded machine (a command never killed would run 30 s).
    assert elapsed < ttl / 3 + grace + 3.0, elapsed
    assert elapsed >= grace  # it did wait the grace before SIGKILL
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert "extend failed" in lines[0]
    assert "terminating the command" in lines[0]
    assert _all_gone([shell, sleeper]), "the command outlived its lease"

    # tenure status: the dead nodes say so, and without a majority it exits 69.
    code, out = _status(faulty, key)
    assert code == EXIT_UNAVAILABLE == 69
    assert [line.split()[1] for line in out] == ["unreachable:", "unreachable:", "free"]
    # And tenure run refuses at once.
    refused = _tenure("run", key, *_redis(faulty), "--", "true")
    assert refused.returncode == 69, refused.stderr
    assert "unreachable" in refused.stderr


def test_a_killed_command_s_group_is_stopped_before_the_release(
    cluster: LocalCluster, key: str, tmp_path: Path
) -> None:
    """The command's leader killed (the OOM killer picks the shell) while the rest of its
    group works on: the lock was released at once, and a second ``tenure run`` of it ran
    beside the orphans. They are stopped first now (SIGTERM, SIGKILL after --grace)."""
    pids = tmp_path / "pids"
    proc = _spawn(
        "run", key, *_redis(cluster), "--grace", "0.5",
        "--", "sh", "-c", f"sleep 30 & echo $$ $! > {pids}; wait",
    )  # fmt: skip
    sleeper = 0
    try:
        shell, sleeper = _wait_for_pids(pids, proc)
        os.kill(shell, signal.SIGKILL)
        proc.wait(timeout=_TIMEOUT)  # (not its pipes: the sleeper holds them open)
        assert _gone(sleeper), "the lock was released while the command's group still ran"
        _, err = proc.communicate(timeout=_TIMEOUT)
    finally:
        _reap(proc)
        if sleeper and not _gone(sleeper):
            os.kill(sleeper, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGKILL, err
    assert "stopping the rest of its process group" in err
    assert _no_key_left(cluster, key)


def test_max_hold_ends_the_command(cluster: LocalCluster, key: str) -> None:
    # A TTL of 1.2 s: the watchdog, extending every 0.4 s, may wake 0.8 s late (a loaded
    # machine) before the lease is lost as paused rather than at the cap (with 0.6 s, 0.4
    # s late). Without the cap the command would run its 20 s: the bound is far below,
    # with room for an interpreter's start-up, over 3 s on a loaded 2-core machine.
    started = time.monotonic()
    result = _tenure(
        "run", key, *_redis(cluster), "--ttl", "1.2", "--max-hold", "2", "--grace", "0.2",
        "--", "sleep", "20",
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert result.returncode == 79, result.stderr
    assert "max_hold" in result.stderr
    assert elapsed < 10


def test_nodes_lost_after_the_command_ended_is_a_warning(faulty: LocalCluster, key: str) -> None:
    # The command itself crashes a majority of nodes, then exits 0 at once: it ended well
    # within the lease's validity, so its status stands; the failed release is a warning.
    pids = " ".join(str(faulty[i].pid) for i in (0, 1))
    result = _tenure("run", key, *_redis(faulty), "--", "sh", "-c", f"kill -9 {pids}; exit 0")
    assert result.returncode == 0, result.stderr
    assert "warning" in result.stderr
    assert "release confirmed by only" in result.stderr


# --- signals to tenure run itself -----------------------------------------------------


def _signal_the_command(
    cluster: LocalCluster,
    key: str,
    tmp_path: Path,
    sig: signal.Signals,
    script: str = "echo $$ > {pids}; exec sleep 30",
) -> tuple[int, str, int]:
    """``tenure run`` of a shell ``script`` (by default one that sleeps; it writes its pid
    to ``{pids}``), sent ``sig`` once the command runs: the exit code of ``tenure run``,
    its stderr and the command's pid."""
    pids = tmp_path / f"pids-{sig.name}"
    proc = _spawn("run", key, *_redis(cluster), "--", "sh", "-c", script.format(pids=pids))
    try:
        [command] = _wait_for_pids(pids, proc)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=_TIMEOUT)
    finally:
        _reap(proc)
    return proc.returncode, err, command


def test_sigterm_is_forwarded_waited_for_and_released(
    cluster: LocalCluster, key: str, tmp_path: Path
) -> None:
    seen = tmp_path / "seen"
    trap = f'trap "echo TERM > {seen}; exit 3" TERM; echo $$ > {{pids}}; sleep 30 & wait'
    code, err, shell = _signal_the_command(cluster, key, tmp_path, signal.SIGTERM, trap)
    assert code == 128 + signal.SIGTERM == 143, err
    assert seen.read_text() == "TERM\n"  # the command got it, exactly once
    assert _all_gone([shell])
    assert _no_key_left(cluster, key)


def test_sigquit_stops_the_command_like_sigterm(
    cluster: LocalCluster, key: str, tmp_path: Path
) -> None:
    # Ctrl-\ at the terminal reaches only tenure run (the command has its own session);
    # it killed tenure run by its default action and left the command running, unlocked.
    code, err, command = _signal_the_command(cluster, key, tmp_path, signal.SIGQUIT)
    assert code == 128 + signal.SIGQUIT == 131, err
    assert _all_gone([command])
    assert _no_key_left(cluster, key)


def test_other_signals_are_passed_on_and_the_command_decides(
    cluster: LocalCluster, key: str, tmp_path: Path
) -> None:
    # SIGUSR1 killed tenure run and left the command running, unlocked. It is passed on:
    # a command that handles it keeps running under the lock; one that dies of it ends
    # with its own status.
    pids, seen = tmp_path / "pids", tmp_path / "seen"
    # The command runs 2 s: 0.3 s after the signal it must still run, with room for a
    # loaded machine to read its PIDs and signal it late (1.2 s left 0.9 s).
    script = f'trap "echo USR1 >> {seen}" USR1; echo $$ > {pids}; sleep 1; sleep 1; exit 4'
    proc = _spawn("run", key, *_redis(cluster), "--", "sh", "-c", script)
    try:
        _wait_for_pids(pids, proc)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.3)
        assert proc.poll() is None  # still running, the lock still held
        assert not _no_key_left(cluster, key)
        _, err = proc.communicate(timeout=_TIMEOUT)
    finally:
        _reap(proc)
    assert proc.returncode == 4, err  # the command's own status
    assert seen.read_text() == "USR1\n"
    assert _no_key_left(cluster, key)
    code, err, command = _signal_the_command(cluster, key, tmp_path, signal.SIGALRM)
    assert code == 128 + signal.SIGALRM, err  # the command died of it
    assert _all_gone([command])
    assert _no_key_left(cluster, key)


# --- tenure status --------------------------------------------------------------------


def test_status_shows_holder_and_floor_then_free(cluster: LocalCluster, key: str) -> None:
    with tenure.Client(cluster.urls) as client:
        lease = client.acquire(key, ttl=_HELD_TTL)
        code, held = _status(cluster, key)
        lease.release()
    code_after, free = _status(cluster, key)
    assert code == code_after == 0
    assert len(held) == len(free) == 3
    for url, line in zip(cluster.urls, held, strict=True):
        fields = line.split()
        assert fields[0] == url
        assert fields[1] == "held"
        assert f"token={lease.token[:8]}" in fields
        floor = re.search(r"floor=(\d+)", line)
        assert floor is not None
        assert int(floor.group(1)) >= lease.fencing_token  # the node's highest token
        assert "warm=-" in fields
        pttl = re.search(r"pttl=(\d+)ms", line)
        assert pttl is not None
        assert 0 < int(pttl.group(1)) <= _HELD_TTL * 1000
    for line in free:
        fields = line.split()
        assert fields[1] == "free"
        assert "token=-" in fields
        floor = re.search(r"floor=(\d+)", line)
        assert floor is not None
        assert int(floor.group(1)) >= lease.fencing_token  # the floor outlives the lock


def test_status_of_a_lock_never_used(cluster: LocalCluster, key: str) -> None:
    code, lines = _status(cluster, key)
    assert code == 0
    for line in lines:
        fields = line.split()
        assert fields[1:4] == ["free", "token=-", "pttl=-"]
        assert fields[4].startswith("floor=")  # the node's, whatever other locks did
        assert fields[5] == "warm=-"


# --- usage errors ---------------------------------------------------------------------


def test_a_name_that_begins_with_a_dash_goes_after_double_dash(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    # tenure took the first "--" for itself, so no such name could be given at all.
    name = "-nightly"
    out = tmp_path / "out"
    result = _tenure(
        "run", *_redis(cluster), "--", name, "--", "sh", "-c", f'echo "$0 $1" > {out}', "--", "b"
    )
    assert result.returncode == 0, result.stderr
    assert out.read_text() == "-- b\n"  # the command's own "--" is kept
    # With NAME before "--", a command's "--" and "-x" words stay as they were given.
    given = _tenure(
        "run",
        "nightly",
        *_redis(cluster),
        "--",
        "sh",
        "-c",
        f'echo "$*" > {out}',
        "sh",
        "--",
        "-v",
        "--",
        "f",
    )
    assert given.returncode == 0, given.stderr
    assert out.read_text() == "-- -v -- f\n"
    with tenure.Client(cluster.urls) as client:
        lease = client.acquire(name, ttl=_HELD_TTL)
        status = _tenure("status", *_redis(cluster), "--", name)
        lease.release()
    assert status.returncode == 0, status.stderr
    assert all(line.split()[1] == "held" for line in status.stdout.splitlines())


@pytest.mark.parametrize("command", [["status", "x"], ["check"], ["check", "--json"]])
def test_a_reader_gone_is_no_traceback(cluster: LocalCluster, command: list[str]) -> None:
    # `tenure check | head -1`: a BrokenPipeError traceback, and exit 1 (check's
    # "warnings"). Now quiet, with the status of a process that SIGPIPE ended.
    proc = subprocess.Popen(
        [sys.executable, "-m", "tenure.cli", *command, *_redis(cluster)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    assert proc.stdout is not None
    proc.stdout.close()  # before it writes: it takes longer than this to reach the nodes
    try:
        _, err = proc.communicate(timeout=_TIMEOUT)
    finally:
        _reap(proc)
    assert "Traceback" not in err, err
    assert "BrokenPipe" not in err, err
    assert proc.returncode == 128 + signal.SIGPIPE


def test_status_and_run_name_a_foreign_key_where_the_lock_is_kept(
    cluster: LocalCluster, key: str
) -> None:
    # Another application's hash at tenure's lock key: status printed redis-py's raw
    # error cut mid-word and "only 0 of 3 nodes answered"; run said "error: on
    # @user_script:168." (Valkey words a script's error after its text).
    lock_key = f"tenure:{{{key}}}:lock"
    for node in cluster:
        with node.client() as c:
            c.hset(lock_key, "owner", "another-app")
    try:
        status = _tenure("status", key, *_redis(cluster))
        run = _tenure("run", key, "--no-wait", *_redis(cluster), "--", "true")
    finally:
        for node in cluster:
            with node.client() as c:
                c.delete(lock_key)
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert len(lines) == len(cluster.nodes)
    assert all(f"foreign: {lock_key} holds a hash" in line for line in lines), lines
    assert "WRONGTYPE Operation against a key holding the wrong kind of value" in run.stderr
    assert "key_prefix" in run.stderr
    assert "@user_script" not in run.stderr


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--ttl", "61"], "--ttl: 61.0s exceeds --max-ttl=60.0s"),
        (["--node-timeout", "61"], "--node-timeout: must be in [0.001, 60]"),
        (["--node-timeout", "1e-9"], "--node-timeout: must be in [0.001, 60]"),
        (["--max-ttl", "100000"], "--max-ttl:"),
        (["--ttl", "5", "--max-hold", "1"], "--max-hold: must be at least the lock's --ttl"),
        (["--redis", "redis://127.0.0.1:1"], "--redis: has 4 nodes"),
    ],
)
def test_run_errors_name_the_options_typed(
    cluster: LocalCluster, key: str, args: list[str], option: str
) -> None:
    # They named the library's parameters (ttl, node_timeout, nodes[0]) and told the user
    # to raise max_ttl, which tenure run had no option for.
    result = _tenure("run", key, *_redis(cluster), *args, "--", "true")
    assert result.returncode == EXIT_TENURE_ERROR
    assert f"tenure run: error: {option}" in result.stderr, result.stderr
    assert "allow_even" not in result.stderr  # (a library argument tenure run lacks)
    bad_url = _tenure("run", key, "--redis", "localhost:6379", "--", "true")
    assert "error: --redis[0]: " in bad_url.stderr, bad_url.stderr
    assert "redis+cluster://" in bad_url.stderr


# A library parameter's name, not inside another word or an option (--max-ttl's ttl).
_LIBRARY_NAME = re.compile(r"(?<![\w-])(max_hold|node_timeout|max_ttl|ttl|timeout=|nodes\[)")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--ttl", "5", "--max-hold", "1"], "raise --max-hold or lower --ttl"),
        (["--ttl", "0.01"], "for --node-timeout=0.05s"),
        (["--max-ttl", "0.01"], "but --node-timeout=0.05s"),
        (["--redis", "{0}", "--redis", "{0}", "--redis", "{1}"], "same server as --redis[0]"),
    ],
)
def test_run_error_messages_name_options_not_library_parameters(
    cluster: LocalCluster, key: str, args: list[str], said: str
) -> None:
    # The message after the option named the library's parameters: "--max-hold: ...
    # raise max_hold or lower ttl", "--redis[3]: ... the same server as nodes[0]".
    nodes = [] if "--redis" in args else _redis(cluster)
    args = [a.format(*cluster.urls) for a in args]
    result = _tenure("run", key, *nodes, *args, "--", "true")
    assert result.returncode == EXIT_TENURE_ERROR, result.stderr
    assert said in result.stderr, result.stderr
    assert not _LIBRARY_NAME.search(result.stderr), result.stderr


def test_run_reports_name_options_not_library_parameters(cluster: LocalCluster, key: str) -> None:
    # "held for max_hold=1.0s" (test_no_wait_while_held_exits_75_at_once: --wait).
    capped = _tenure(
        "run", key, *_redis(cluster), "--ttl", "1", "--max-hold", "1", "--", "sleep", "5"
    )
    assert capped.returncode == EXIT_LOST, capped.stderr
    assert "held for --max-hold=1.0s" in capped.stderr, capped.stderr
    assert not _LIBRARY_NAME.search(capped.stderr), capped.stderr


def test_run_takes_a_longer_max_ttl(cluster: LocalCluster, key: str) -> None:
    result = _tenure("run", key, *_redis(cluster), "--ttl", "61", "--max-ttl", "120", "--", "true")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("query", ["socket_timeout=abc", "ssl_cert_reqs=bogus"])
def test_status_names_a_url_option_redis_py_refuses(query: str) -> None:
    # It was a traceback and exit 1, or (ssl_cert_reqs) a node that "does not speak the
    # Redis protocol": a fault of the URL blamed on the server.
    result = _tenure("status", "some-lock", "--redis", f"redis://127.0.0.1:1?{query}")
    assert result.returncode == 2, result.stderr
    assert "--redis[0]" in result.stderr
    assert "Traceback" not in result.stderr


def test_status_refuses_a_node_listed_twice(cluster: LocalCluster) -> None:
    # Counted twice, one server's answers made a majority of the two listings (exit 0),
    # as a client would refuse to count them.
    url = cluster.urls[0]
    result = _tenure("status", "some-lock", "--redis", url, "--redis", f"{url}/0")
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert "--redis[1]:" in result.stderr
    assert "the same server as --redis[0]" in result.stderr


@pytest.mark.parametrize("seconds", ["61", "1e300", "1e-9"])
def test_status_takes_the_node_timeouts_the_clients_take(
    cluster: LocalCluster, seconds: str
) -> None:
    # 1e300 overflowed every node's socket deadline: each line "error: OverflowError:
    # timestamp out of range for platform time_t", exit 69 as if the nodes were down.
    result = _tenure("status", "some-lock", *_redis(cluster), "--node-timeout", seconds)
    assert result.returncode == 2, result
    assert result.stdout == ""
    assert result.stderr.splitlines()[-1] == (
        "tenure status: error: argument --node-timeout: must be a number of seconds from "
        f"0.001 to 60, got {seconds} (the default is 0.5 s; e.g. --node-timeout 1)"
    )


# What a refused number says: the option, the range, what was given, the default (or what
# leaving the option out does) and a value that works.
_NO_NODE = "redis://127.0.0.1:1"  # never reached: the command line is refused first


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["run", "x", "--ttl", "0"],
            "--ttl: must be a positive number of seconds, got 0 (the default is 10 s; "
            "e.g. --ttl 30)",
        ),
        (
            ["run", "x", "--wait", "-1"],
            "--wait: must be a number of seconds, 0 or more, got -1 (by default it waits "
            "for ever; e.g. --wait 60)",
        ),
        (
            ["run", "x", "--grace", "soon"],
            "--grace: must be a number of seconds, 0 or more, got 'soon', not a number (the "
            "default is 5 s; e.g. --grace 10)",
        ),
        (
            ["run", "x", "--max-hold", "inf"],
            "--max-hold: must be a positive number of seconds, got inf (by default the "
            "lease is held as long as the command runs; e.g. --max-hold 3600)",
        ),
        (
            ["run", "x", "--max-ttl", "0"],
            "--max-ttl: must be a positive number of seconds, got 0 (the default is 60 s; "
            "e.g. --max-ttl 120)",
        ),
        (
            ["run", "x", "--node-timeout", "nan"],
            "--node-timeout: must be a positive number of seconds, got nan (the default is "
            "0.05 s; e.g. --node-timeout 0.1)",
        ),
        (
            ["status", "x", "--node-timeout", "0"],
            "--node-timeout: must be a number of seconds from 0.001 to 60, got 0 (the "
            "default is 0.5 s; e.g. --node-timeout 1)",
        ),
    ],
)
def test_a_refused_number_says_its_range_the_value_the_default_and_an_example(
    args: list[str], said: str
) -> None:
    # "argument --ttl: must be a positive number, got 0.0": the range, the value as
    # tenure read it, and neither the default nor a value that works.
    command = args[0]
    tail = ["--", "true"] if command == "run" else []
    result = _tenure(*args, "--redis", _NO_NODE, *tail)
    assert result.returncode == (EXIT_TENURE_ERROR if command == "run" else 2), result
    assert result.stdout == ""
    usage, line = result.stderr.splitlines()[0], result.stderr.splitlines()[-1]
    assert usage.startswith(f"usage: tenure {command} "), result.stderr
    assert line == f"tenure {command}: error: argument {said}", result.stderr


_NAME_MISSING = (
    "tenure run: error: the following arguments are required: NAME (before the options: "
    "tenure run NAME [options] -- COMMAND ...; a NAME that begins with '-' after the "
    "options: tenure run [options] -- -NAME -- COMMAND ...)"
)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        # The command after "--" was there: only the NAME was missing, not "NAME, COMMAND".
        (["run", "--ttl", "5", "--", "true"], [_NAME_MISSING]),
        # Said the --ttl alone; the missing NAME came up only once --ttl was fixed.
        (
            ["run", "--ttl", "0", "--", "true"],
            [
                "tenure run: error: argument --ttl: must be a positive number of seconds, "
                "got 0 (the default is 10 s; e.g. --ttl 30)",
                _NAME_MISSING,
            ],
        ),
        (
            ["status", "--node-timeout", "0"],
            [
                "tenure status: error: argument --node-timeout: must be a number of seconds "
                "from 0.001 to 60, got 0 (the default is 0.5 s; e.g. --node-timeout 1)",
                "tenure status: error: the following arguments are required: NAME",
            ],
        ),
        (
            ["run", "x", "make", "--ttl", "0", "--max-ttl", "-", "--", "-j4"],
            [
                "tenure run: error: argument --ttl: must be a positive number of seconds, "
                "got 0 (the default is 10 s; e.g. --ttl 30)",
                "tenure run: error: argument --max-ttl: must be a positive number of "
                "seconds, got '-', not a number (the default is 60 s; e.g. --max-ttl 120)",
            ],
        ),
    ],
)
def test_every_problem_of_a_command_line_is_said_at_once(args: list[str], said: list[str]) -> None:
    result = _tenure(*args)
    assert result.returncode == (EXIT_TENURE_ERROR if args[0] == "run" else 2), result
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"usage: tenure {args[0]} "), result.stderr
    assert [line for line in lines if ": error: " in line] == said, result.stderr


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["run", "x", "--ttl", "5", "make", "all"], "unrecognized arguments: make all (the "),
        (["run", "x", "--bogus", "--", "true"], "unrecognized arguments: --bogus"),
        (["status", "x", "--bogus"], "unrecognized arguments: --bogus"),
        (["check", "--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_an_unknown_word_is_told_by_its_subcommand(args: list[str], said: str) -> None:
    # It was the top level's usage and "tenure: error:", even for `tenure run`'s command
    # given without its "--", with nothing said about the "--".
    result = _tenure(*args)
    assert result.returncode == (EXIT_TENURE_ERROR if args[0] == "run" else 2), result
    usage, error = result.stderr.splitlines()[0], result.stderr.splitlines()[-1]
    assert usage.startswith(f"usage: tenure {args[0]} "), result.stderr
    assert error.startswith(f"tenure {args[0]}: error: {said}"), result.stderr
    assert ('after "--"' in error) == (args[2:4] == ["--ttl", "5"]), error


@pytest.mark.parametrize("command", ["run", "status"])
def test_no_nodes_is_a_usage_error_naming_redis(command: str) -> None:
    args = [command, "some-lock"] + (["--", "true"] if command == "run" else [])
    result = _tenure(*args)
    assert result.returncode == (EXIT_TENURE_ERROR if command == "run" else 2)
    assert "--redis" in result.stderr
    assert "TENURE_REDIS" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["run", "x", "--redis", "redis://127.0.0.1:1"],  # no command
        ["run", "x", "--wait", "1", "--no-wait", "--redis", "redis://127.0.0.1:1", "--", "true"],
        ["run", "x", "--ttl", "0", "--redis", "redis://127.0.0.1:1", "--", "true"],
        ["run", "x", "--redis", "http://127.0.0.1:1", "--", "true"],
        ["run", "x", "--ttl", "0.01", "--redis", "redis://127.0.0.1:1", "--", "true"],
        ["run", "--redis", "redis://127.0.0.1:1"],  # no name
        ["demo", "--", "true"],  # only run takes a command
    ],
)
def test_bad_usage_is_tenures_own_error(args: list[str]) -> None:
    # `tenure run` never exits 2 for itself: 2 is what `make`, `grep` or a shell script
    # commonly return, and a caller must not take tenure's error for the command's.
    result = _tenure(*args)
    expected = EXIT_TENURE_ERROR if args[0] == "run" else 2
    assert result.returncode == expected, result.stderr
    assert "Traceback" not in result.stderr


def test_a_node_that_is_not_redis_does_not_stop_the_command(
    cluster: LocalCluster, key: str
) -> None:
    with GarbageServer("http") as garbage:
        # The lock's history on the two real nodes (a new lock waits for every node).
        with tenure.Client(cluster.urls[:2], allow_even=True) as two:
            two.acquire(key, ttl=1.0).release()
        nodes = ["--redis", cluster.urls[0], "--redis", garbage.url, "--redis", cluster.urls[1]]
        result = _tenure("run", key, *nodes, "--", "sh", "-c", "exit 3")
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    # At most one warning line, naming the node and what to check (a round decided by
    # the two real nodes before the garbage arrived has nothing to warn about).
    warnings = [line for line in result.stderr.splitlines() if garbage.url in line]
    assert len(warnings) <= 1, result.stderr
    assert all("does not speak the Redis protocol" in w for w in warnings)
    assert _no_key_left(cluster, key)


@pytest.mark.parametrize("speaks", SPEAKS)
def test_status_names_a_server_that_is_not_redis_and_the_fix(
    cluster: LocalCluster, key: str, speaks: str
) -> None:
    # A server answering every command alike (an echo, +OK, :1) was a line saying its
    # lock key "holds a EXEC" (or "a 79": the first byte of OK), "not a tenure lock",
    # sending the operator after another application, and it counted as answered.
    with GarbageServer(speaks) as garbage:
        result = _tenure("status", key, "--redis", garbage.url)
        majority = _tenure("status", key, *_redis(cluster)[:4], "--redis", garbage.url)
    assert result.returncode == EXIT_UNAVAILABLE, result
    assert "Traceback" not in result.stderr
    [line] = result.stdout.splitlines()
    assert line.startswith(f"{garbage.url}  misconfigured: does not speak the Redis protocol")
    assert "check the host and port" in line
    assert majority.returncode == 0, majority
    assert f"{garbage.url}  misconfigured: does not speak the Redis protocol" in majority.stdout


def test_a_misconfigured_node_is_tenures_own_error_in_one_line(
    faulty: LocalCluster, key: str, tmp_path: Path
) -> None:
    node = faulty[0]
    with node.client() as c:
        c.config_set("requirepass", "secret")
    ran = tmp_path / "ran"
    result = _tenure("run", key, "--redis", node.url, "--", "touch", str(ran))
    assert result.returncode == EXIT_TENURE_ERROR, result.stderr
    lines = result.stderr.strip().splitlines()
    # One line, as its exit code promises: no warning before it that "locks need a
    # majority of the other nodes" (there are none).
    assert len(lines) == 1, lines
    assert lines[-1].startswith("tenure run: error: node " + node.url), lines
    assert "requires a password" in lines[-1]
    assert "Traceback" not in result.stderr
    assert not ran.exists()


@pytest.mark.parametrize("kind", ["plain", "sentinel", "cluster"])
def test_status_gives_up_on_a_node_that_never_ends_its_answer(
    cluster: LocalCluster, key: str, kind: str
) -> None:
    # redis-py bounds each wait for bytes by the socket timeout, not a whole reply: a
    # server sending one byte at a time (a stalled proxy, a dying server) kept `tenure
    # status` reading it for ever, whatever --node-timeout said.
    with GarbageServer("slow") as slow:
        url = slow.as_node(kind)
        nodes = [*_redis(cluster)[:4], "--redis", url]
        result = _tenure("status", key, *nodes, "--node-timeout", "0.2")
    assert result.returncode == 0, result
    assert "Traceback" not in result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith(url)]
    if kind == "sentinel":
        # Every Sentinel is asked, each within a budget of its own: the one that never
        # ends its answer is named, the node found without a master.
        said = f"(127.0.0.1:{slow.port}: no complete answer within"
        assert f"unreachable: no Sentinel named a master for service 'locks' {said}" in line
        assert "check the Sentinel's host and port" in line, line
    else:
        assert "unreachable: no complete answer within" in line, line
        assert "check the node's host and port" in line, line


@pytest.mark.parametrize("command", ["status", "check"])
def test_sigterm_ends_a_command_still_reading_a_node(key: str, command: str) -> None:
    # SIGTERM (timeout(1), a CI job's time limit) was taken, then the command waited for
    # its threads still reading the node: it ran on until the node finished its answer.
    args = [key] if command == "status" else []
    with GarbageServer("slow") as slow:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tenure.cli",
                command,
                *args,
                "--redis",
                slow.url,
                "--node-timeout",
                "20",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        try:
            assert slow.connected.wait(_TIMEOUT), proc
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=_TIMEOUT)
        finally:
            _reap(proc)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "terminated (SIGTERM)" in err, err
    assert "Traceback" not in err

"""``tenure run``: run a command while holding a distributed lock (a distributed flock(1)).

``tenure run NAME [options] -- COMMAND [ARG ...]``

1. Acquire lock ``NAME`` on the nodes (Redlock when there are three or more), waiting as
   told (``--wait``, ``--no-wait``; by default forever).
2. Keep the lease alive with the watchdog (extended every TTL/3, up to ``--max-hold``).
3. Start the command in a new session (its own process group), with stdin, stdout and
   stderr inherited and two variables added to its environment:
   ``TENURE_FENCING_TOKEN`` (the lease's fencing token: pass it with every write to a
   fenced store) and ``TENURE_LOCK_NAME``.
4. Wait for it. If the lease is lost meanwhile (an extension failed, the watchdog woke
   after the validity ended, ``--max-hold`` ran out), print one line to stderr saying
   why, send SIGTERM to the command's process group (so every process of a shell
   pipeline gets it), SIGKILL the group ``--grace`` seconds later if anything in it is
   still alive, and exit 79.
5. Release the lease and exit with the command's status.

Exit codes
----------
====== ==========================================================================
0-255  the command's own exit status, passed through; a command killed by signal N
       gives 128+N, as shells report it
69     EX_UNAVAILABLE: so many nodes are unreachable that no majority can be reached;
       the command was not started (``tenure status``: fewer than a majority answered)
75     EX_TEMPFAIL: the lock is held by another client (at once with ``--no-wait``,
       or still after ``--wait`` seconds); the command was not started
78     EX_CONFIG: tenure's own error, never the command's: a usage error (no NAME or
       COMMAND, an unknown or malformed option), a bad value (no nodes given with
       ``--redis``/``TENURE_REDIS``, a malformed URL, a TTL too small), a node set up
       wrongly so that no majority is left (a read-only replica, a wrong or missing
       password, an ACL user without a permission tenure needs, not a Redis server), or
       an unexpected internal failure. One line on stderr says which (a usage error:
       the usage, then one line per problem of the command line), no traceback. The
       command was not started (or, had it started, it was killed before exiting)
79     the lease was lost while the command ran: the command was terminated (or had
       already ended after the lease's validity); it may have overlapped another holder
126    the command was found but could not be executed (permission denied)
127    the command was not found
128+N  ``tenure run`` itself received signal N (SIGHUP 129, SIGINT 130, SIGQUIT 131,
       SIGTERM 143): it was forwarded to the command's group, the command was waited
       for (SIGKILL after ``--grace`` seconds) and the lease released; before the
       command started, the acquisition is abandoned (so for any other signal that
       would end ``tenure run``, e.g. SIGUSR1 or SIGALRM)
====== ==========================================================================

The command's own status may also be 69, 75, 78 or 79; as with ``flock(1)``, a caller
that must tell them apart should have the command avoid those codes. None of them is a
code commands commonly use for their own failures (1, 2), so tenure failing is never
mistaken for the command failing: before 78 existed, tenure's own errors exited 2 (usage)
or 1 with a traceback, both of which ordinary commands return.

A node that fails for its configuration while the others still form a majority does not
stop ``tenure run``: the command runs, and one warning per such node is printed on stderr.

When is a run "lost" (79) rather than the command's status?
-----------------------------------------------------------
The deciding fact is whether the command ended while the lease could still be trusted:
not reported lost, and before its validity deadline (``Lease.valid_until``, on the
monotonic clock, as of the latest successful extension). The instant is taken when
``tenure run`` reaps the command, which is after it actually ended, so the test errs on
the side of 79.

* Ended in time, and releasing then succeeded: its status.
* Ended in time, but the release could not confirm a majority (``LeaseLost``: the key
  expired on, or could not be deleted from, a majority after the command finished, e.g.
  because nodes crashed just then): its status, plus a warning on stderr. Redlock's
  guarantee is that nobody else can acquire before the validity deadline (a node that
  restarts without data is kept out for ``max_ttl``), so the command ran protected; what
  failed is only the clean-up, and the keys left behind expire by their TTL.
* Ended after the lease was reported lost, or after its validity deadline (``tenure
  run`` itself was paused, so the watchdog could not extend): 79, with a line on stderr,
  even if the command exited 0: it may have run unprotected and must be treated so.
* Lost *and* interrupted by a signal: 79 wins over 128+N, because "this may have
  overlapped another holder" is the fact a caller most needs.

Signals
-------
SIGINT, SIGTERM, SIGHUP and SIGQUIT received by ``tenure run`` are forwarded to the
command's process group (the command runs in its own session, so a Ctrl-C or Ctrl-\\ at
the terminal reaches only ``tenure run``, which passes it on exactly once). If the
command is still running ``--grace`` seconds after the first one, its group gets
SIGKILL: ``tenure run`` never leaves a command running after it gives up the lease.
Every other signal whose default action would end ``tenure run`` (SIGUSR1, SIGUSR2,
SIGALRM, SIGVTALRM, SIGPROF, SIGPWR, the real-time signals) is passed on to the
command's group and nothing more: the command decides (one that handles SIGUSR1 keeps
running under the lock; one that dies of it ends with 128+N, its own status), and
``tenure run`` never dies of it, which would leave the command running unlocked. A
signal that was ignored when ``tenure run`` started (``nohup``, a background job) stays
ignored.

Limits, honestly
----------------------
* The watchdog lowers the risk of losing the lease but cannot stop a command that keeps
  writing while ``tenure run`` is frozen (SIGSTOP, a stalled VM): the command is a
  separate process and keeps running; it is terminated only once ``tenure run`` runs
  again and sees the loss. Pass ``$TENURE_FENCING_TOKEN`` with every write to a fenced
  store (``tenure.fencing``) so late writes are refused.
* If ``tenure run`` is killed with SIGKILL, its command keeps running, unprotected once
  the lease expires (it is not extended any more). Nothing in-process can prevent that.
* Because the command runs in a new session it has no controlling terminal: interactive
  programs that open ``/dev/tty`` or use job control will not work under it.
* Only the command's process group is signalled; a process that moved itself to another
  group or session (a daemon) is not reached. After a normal exit nothing is signalled:
  background processes the command left behind keep running, without the lock. A command
  killed by a signal (the OOM killer picking the shell) is another matter: the rest of
  its group may be doing its work, so it is stopped (SIGTERM, SIGKILL after ``--grace``)
  before the lock is released.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, TextIO

from .._core.config import DEFAULT_KEY_PREFIX, check_key_prefix
from .._errors import (
    ConfigurationError,
    LeaseLost,
    LockTimeout,
    QuorumUnreachable,
    TenureError,
)
from .._sync.client import Client, Lease
from ._text import one_line

__all__ = [
    "ENV_NODES",
    "EXIT_CANNOT_EXECUTE",
    "EXIT_LOST",
    "EXIT_NOT_ACQUIRED",
    "EXIT_NOT_FOUND",
    "EXIT_TENURE_ERROR",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "RUN_EXIT_CODES",
    "RunOptions",
    "nodes_from",
    "run",
]

EXIT_USAGE = 2
EXIT_UNAVAILABLE = 69  # EX_UNAVAILABLE (sysexits.h)
EXIT_NOT_ACQUIRED = 75  # EX_TEMPFAIL (sysexits.h)
EXIT_TENURE_ERROR = 78  # EX_CONFIG (sysexits.h): usage, configuration or internal error
EXIT_LOST = 79
EXIT_CANNOT_EXECUTE = 126
EXIT_NOT_FOUND = 127

ENV_NODES = "TENURE_REDIS"
ENV_KEY_PREFIX = "TENURE_KEY_PREFIX"
ENV_TOKEN = "TENURE_FENCING_TOKEN"
ENV_NAME = "TENURE_LOCK_NAME"

# For --help (kept next to the codes so the two cannot drift apart).
RUN_EXIT_CODES = """\
exit codes:
  0-255  the command's own status (killed by signal N: 128+N, as shells report it)
  69     nodes unreachable: no majority possible; the command was not started
  75     lock held elsewhere (--no-wait, or still after --wait); not started
  78     tenure's own error, never the command's: usage (no NAME or COMMAND, bad
         option), configuration (no --redis/TENURE_REDIS, bad URL or value, nodes
         set up wrongly: read-only replica, wrong password, ACL, not Redis) or an
         internal failure; one line on stderr per problem; the command was not started
  79     lease lost while the command ran: it was terminated (SIGTERM, SIGKILL after
         --grace) or had ended too late; it may have overlapped another holder
  126    the command could not be executed; 127: the command was not found
  128+N  tenure run got signal N (129 HUP, 130 INT, 131 QUIT, 143 TERM): forwarded
         to the command's process group, waited for (SIGKILL after --grace), lease
         released. Other signals (USR1, USR2, ALRM...) are only passed on to the group

The command gets TENURE_FENCING_TOKEN (pass it with every write to a fenced store)
and TENURE_LOCK_NAME in its environment. It runs in its own session and process
group; signals go to the whole group, so shell pipelines stop too. A NAME that begins
with "-" goes between two "--": tenure run [OPTIONS] -- -NAME -- COMMAND ...
"""

# Signals that stop the command: forwarded to its group, SIGKILL after --grace, 128+N.
_STOPPING = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})
# Every other signal whose default action ends a process (Linux: signal(7)), bar those
# the kernel sends for a fault of the process itself: passed on to the command's group
# and nothing more. Dying of one would leave the command running, unlocked.
_PASSED_ON = frozenset(
    {
        getattr(signal, name)
        for name in ("SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGPWR")
        if hasattr(signal, name)
    }
    | (
        set(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
        if hasattr(signal, "SIGRTMIN") and hasattr(signal, "SIGRTMAX")
        else set()
    )
)
_TICK = 0.05  # seconds between looks at pending signals (handlers only record them)
_PROG = "tenure run"


def nodes_from(urls: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> list[str]:
    """The node URLs: ``--redis`` values if any, else ``$TENURE_REDIS`` split on
    whitespace, and on commas followed by a URL's scheme (so that the hosts of a
    ``redis+sentinel://`` or ``redis+cluster://`` URL stay together).

    Raises:
        ConfigurationError: (``--redis``) neither gives a node.
    """
    if urls:
        return list(urls)
    env = os.environ if environ is None else environ
    # A comma separates URLs only before another URL's scheme: inside a Sentinel or
    # Cluster node's URL it separates that node's hosts.
    found = [
        url.strip(",")
        for word in env.get(ENV_NODES, "").split()
        for url in re.split(r",(?=[A-Za-z][A-Za-z0-9+.-]*://)", word)
        if url.strip(",")
    ]
    if not found:
        raise ConfigurationError(
            "--redis",
            f"no Redis nodes given: pass --redis URL (once per node) or set {ENV_NODES} "
            "(URLs separated by commas or spaces)",
        )
    return found


def key_prefix_from(value: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The key prefix: ``--key-prefix`` if given, else ``$TENURE_KEY_PREFIX``, else
    ``tenure:`` (the clients' default), checked as the clients check it.

    Raises:
        ConfigurationError: (``--key-prefix``) a prefix the clients would refuse.
    """
    env = os.environ if environ is None else environ
    chosen = value if value is not None else env.get(ENV_KEY_PREFIX, DEFAULT_KEY_PREFIX)
    return check_key_prefix(chosen, "--key-prefix")


@dataclass(frozen=True)
class RunOptions:
    """What ``tenure run`` was asked to do (validated by the CLI and by ``Client``)."""

    name: str
    command: tuple[str, ...]
    nodes: tuple[str, ...]
    ttl: float = 10.0
    wait: float | None = None  # None: forever (unless no_wait)
    no_wait: bool = False
    grace: float = 5.0
    max_hold: float | None = None
    node_timeout: float = 0.05
    key_prefix: str = DEFAULT_KEY_PREFIX
    max_ttl: float = 60.0


# The options of ``tenure run`` that set a ``Client`` or ``acquire`` parameter, by that
# parameter's name: an error of the library names the parameter, the user typed the option.
_OPTIONS = {
    "name": "NAME",
    "ttl": "--ttl",
    "timeout": "--wait",
    "max_hold": "--max-hold",
    "node_timeout": "--node-timeout",
    "key_prefix": "--key-prefix",
    "max_ttl": "--max-ttl",
    "nodes": "--redis",
}


def _as_typed(exc: ConfigurationError) -> ConfigurationError:
    """``exc`` naming the option the user typed (``--ttl``, ``--redis[0]``) rather than
    the library parameter it set; a node's own misconfiguration is left as it is."""
    if type(exc) is not ConfigurationError:
        return exc
    parameter = exc.parameter
    node = re.fullmatch(r"nodes\[(\d+)\](.*)", parameter)
    option = f"--redis[{node[1]}]{node[2]}" if node else _OPTIONS.get(parameter)
    if option is None:
        return exc
    message = str(exc).removeprefix(f"{parameter}: ")
    # (An even node count is allowed by a library argument only; tenure run has none.)
    message = message.replace(" (or pass allow_even=True)", "")
    return ConfigurationError(option, _typed_text(message))


# The library's parameters as a message of the library names them (``raise max_hold or
# lower ttl``, ``node_timeout=0.05s``, ``nodes[0]``), and the options that set them.
# ``(?<![\w-])``: not inside another name (``max_ttl``'s ttl) or an option already typed.
_PARAMETER_WORDS = re.compile(r"(?<![\w-])(max_hold|node_timeout|max_ttl|ttl)\b")
_NODE_WORDS = re.compile(r"(?<![\w-])nodes\[(\d+)\]")


def _typed_text(message: str, *, timeout: str | None = None) -> str:
    """``message`` with the library's parameter names replaced by the options typed;
    ``timeout``: the option that set an acquire's ``timeout=`` (``--wait``)."""
    message = _PARAMETER_WORDS.sub(lambda m: _OPTIONS[m[1]], message)
    message = _NODE_WORDS.sub(r"--redis[\1]", message)
    if timeout is not None:
        message = re.sub(r"(?<![\w-])timeout=", f"{timeout}=", message)
    return message


class _Interrupted(BaseException):
    """A forwarded signal arrived while acquiring (not an Exception: nothing swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Signals:
    """Handlers of the signals ``tenure run`` forwards: raise while acquiring (before the
    command starts, any of them ends ``tenure run``), only record afterwards.

    A handler must not touch locks or events (it may run while the main thread holds the
    very lock it would take), so in recording mode it only appends to a list, which the
    supervising loop drains every ``_TICK``.
    """

    def __init__(self) -> None:
        self.raising = True
        self.received: list[int] = []
        self._pending: list[int] = []
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.raising:
            self.received.append(signum)
            raise _Interrupted(signum)
        if signum in _STOPPING:
            self.received.append(signum)  # it decides the exit status: 128+N
        self._pending.append(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[_Signals]:
        if threading.current_thread() is threading.main_thread():
            for sig in sorted(_STOPPING | _PASSED_ON):
                previous = signal.getsignal(sig)
                if previous is signal.SIG_IGN:
                    continue  # ignored when we started (nohup, background job): keep it so
                self._previous[sig] = previous
                signal.signal(sig, self._handle)
        try:
            yield self
        finally:
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            self._previous.clear()

    def take(self) -> list[int]:
        """Signals received since the last call (recording mode)."""
        taken: list[int] = []
        while self._pending:
            taken.append(self._pending.pop(0))
        return taken

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None


class _Child:
    """The command's process, reaped by a thread that notes whether it ended in time."""

    def __init__(self, proc: subprocess.Popen[bytes], lease: Lease, wake: threading.Event):
        self.proc = proc
        self.pgid = proc.pid  # start_new_session: it leads its own session and group
        self.done = threading.Event()
        self.in_time = False  # ended before the lease was lost or its validity ran out
        self._lease = lease
        self._wake = wake
        self._thread = threading.Thread(target=self._reap, name="tenure-run-reaper", daemon=True)
        self._thread.start()

    def _reap(self) -> None:
        self.proc.wait()
        lease = self._lease
        self.in_time = not lease.lost.is_set() and time.monotonic() < lease.valid_until
        self.done.set()
        self._wake.set()

    @property
    def status(self) -> int:
        """The exit status as a shell reports it (killed by signal N: 128+N)."""
        code = self.proc.returncode
        assert code is not None
        return 128 - code if code < 0 else code

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the command's process group (members may outlive the leader)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def group_alive(self) -> bool:
        """Whether any process of the command's group is still alive (zombies aside)."""
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return _live_member(self.pgid)

    def join(self) -> None:
        self._thread.join()


def _live_member(pgid: int) -> bool:
    """Whether group ``pgid`` has a member that is not a zombie (Linux: from /proc).

    A zombie still counts for ``killpg(pgid, 0)``, and an orphan's zombie lingers until
    init gets round to reaping it, so without /proc every member counts as alive.
    """
    try:
        entries = os.scandir("/proc")
    except OSError:
        return True
    with entries:  # (its loop apart: docs/architecture.md, "A loop in a try or with block")
        return _has_live_member(entries, pgid)


def _has_live_member(entries: Iterator[os.DirEntry[str]], pgid: int) -> bool:
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # it exited meanwhile
        # The fields after the command name, which is in parentheses and may contain
        # ") ": state, ppid, pgrp, ...
        fields = stat.rpartition(b")")[2].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


def _say(err: TextIO, message: str) -> None:
    print(f"{_PROG}: {message}", file=err, flush=True)


def run(options: RunOptions, *, err: TextIO | None = None) -> int:
    """Run ``options.command`` under lock ``options.name``; return the exit code.

    See the module docstring for the exit codes and the rules behind them.

    Every error of tenure's own (a bad option, a misconfigured node, an unexpected
    failure) is reported in one line on ``err`` and returns ``EXIT_TENURE_ERROR``; only
    ``BaseException``s that are not errors (``KeyboardInterrupt``, ``SystemExit``) leave.
    """
    out = sys.stderr if err is None else err
    signals = _Signals()
    try:
        if not options.command:
            raise ConfigurationError("command", "no command given: tenure run NAME -- COMMAND ...")
        with (
            signals.installed(),
            _typed_options(),
            Client(
                list(options.nodes),
                node_timeout=options.node_timeout,
                key_prefix=options.key_prefix,
                max_ttl=options.max_ttl,
            ) as client,
        ):
            # The lease is kept alive once its loss is watched (``_hold_and_run``); the
            # arguments are checked here, before acquiring (``lock`` does no I/O).
            client.lock(options.name, options.ttl, watchdog=True, max_hold=options.max_hold)
            try:
                lease = client.acquire(
                    options.name,
                    options.ttl,
                    blocking=not options.no_wait,
                    timeout=None if options.no_wait else options.wait,
                )
            except LockTimeout as exc:
                _say(out, f"not acquired: {_typed_text(one_line(exc), timeout='--wait')}")
                return EXIT_NOT_ACQUIRED
            except QuorumUnreachable as exc:
                _say(out, f"nodes unreachable: {one_line(exc)}")
                return EXIT_UNAVAILABLE
            signals.raising = False
            return _hold_and_run(lease, options, signals, out)
    except _Interrupted as exc:
        # Interrupted while acquiring: the client released any partial grant. (A signal
        # in the instant between the grant and `raising = False` also lands here; that
        # lease is not kept alive and expires by its TTL.)
        return 128 + exc.signum
    except TenureError as exc:
        _say(out, f"error: {one_line(exc)}")
        return EXIT_TENURE_ERROR
    except Exception as exc:
        # A bug, or something no one foresaw: still one line and tenure's own code, not
        # a traceback and 1, which the caller would take for the command's failure.
        # (_hold_and_run killed the command on its way out, had it started.)
        _say(out, f"internal error: {type(exc).__name__}: {one_line(exc)}")
        return EXIT_TENURE_ERROR


@contextlib.contextmanager
def _typed_options() -> Iterator[None]:
    """Errors of bad values name the options typed (``_as_typed``)."""
    try:
        yield
    except ConfigurationError as exc:
        typed = _as_typed(exc)
        if typed is exc:
            raise
        raise typed from None


def _hold_and_run(lease: Lease, options: RunOptions, signals: _Signals, err: TextIO) -> int:
    wake = threading.Event()
    lease.on_lost(lambda _error: wake.set())
    child: _Child | None = None
    try:
        lease.keep_alive(max_hold=options.max_hold)
        if signals.first is not None:
            return 128 + signals.first
        try:
            lease.check()
        except LeaseLost as exc:
            _say(err, f"lease lost before the command started: {one_line(exc)}")
            return EXIT_LOST
        env = dict(os.environ)
        env[ENV_TOKEN] = str(lease.fencing_token)
        env[ENV_NAME] = options.name
        try:
            # No preexec_fn (e.g. for PR_SET_PDEATHSIG): it is unsafe with the watchdog
            # thread running, and it makes the child run Python's at-fork hooks, where
            # tenure marks kept-alive leases lost and runs their on_lost callbacks.
            proc = subprocess.Popen(list(options.command), env=env, start_new_session=True)
        except FileNotFoundError as exc:
            _say(err, f"{options.command[0]}: command not found ({exc.strerror})")
            return EXIT_NOT_FOUND
        except OSError as exc:
            _say(err, f"{options.command[0]}: cannot execute ({exc.strerror})")
            return EXIT_CANNOT_EXECUTE
        child = _Child(proc, lease, wake)
        lost_reported = _supervise(child, lease, signals, options.grace, wake, err)
        return _outcome(child, lease, signals, lost_reported, err)
    finally:
        if child is not None and not child.done.is_set():
            # Leaving early (an unexpected error): never leave the command running
            # without the lock.
            child.signal_group(signal.SIGKILL)
            child.join()
        if not lease.released:
            with contextlib.suppress(TenureError):
                lease.release()


def _supervise(
    child: _Child,
    lease: Lease,
    signals: _Signals,
    grace: float,
    wake: threading.Event,
    err: TextIO,
) -> bool:
    """Wait for the command, forwarding signals and stopping it if the lease is lost.

    Returns whether the loss was reported (the command was told to stop because of it).
    """
    kill_at: float | None = None  # when the group gets SIGKILL, once it is told to stop
    killed = False
    lost_reported = False
    while True:
        wake.clear()  # every condition below is re-read after this, so no wake-up is lost
        now = time.monotonic()
        stopping = False
        for sig in signals.take():
            child.signal_group(sig)
            stopping = stopping or sig in _STOPPING
        if lease.lost.is_set() and not lost_reported and not child.done.is_set():
            lost_reported = True
            stopping = True
            _say(
                err,
                f"{_typed_text(one_line(lease.lost_error or LeaseLost(lease.name, 'lost')))}; "
                f"terminating the command (SIGTERM, SIGKILL after {grace:g}s)",
            )
            child.signal_group(signal.SIGTERM)
        if (
            kill_at is None
            and child.done.is_set()
            and (child.proc.returncode or 0) < 0
            and child.group_alive()
        ):
            # The leader was killed while other processes of its group still run (a
            # pipeline's other members, a shell's child): they may be doing the
            # command's work, so stop them before the lease is released.
            _say(err, "the command was killed; stopping the rest of its process group")
            child.signal_group(signal.SIGTERM)
            stopping = True
        if stopping and kill_at is None:
            kill_at = now + grace
        if child.done.is_set():
            if kill_at is None or killed:
                return lost_reported
            # Told to stop, and the leader is gone: give the rest of its group (the other
            # processes of a pipeline) the same grace, then kill what is left.
            if not child.group_alive():
                return lost_reported
        if kill_at is not None and not killed and now >= kill_at:
            child.signal_group(signal.SIGKILL)
            killed = True
            continue
        timeout = _TICK if kill_at is None or killed else min(_TICK, max(kill_at - now, 0.0))
        if child.done.is_set():
            time.sleep(timeout)  # polling the group: nothing sets `wake` any more
        else:
            wake.wait(timeout)


def _outcome(
    child: _Child, lease: Lease, signals: _Signals, lost_reported: bool, err: TextIO
) -> int:
    """Release, and decide the exit code (rules in the module docstring)."""
    child.join()
    release_error: TenureError | None = None
    if not lease.released:  # a failed extension releases (and marks the lease lost) itself
        try:
            lease.release()
        except TenureError as exc:
            release_error = exc
    if not child.in_time:
        if not lost_reported:
            why = lease.lost_error or release_error
            reason = _typed_text(one_line(why)) if why is not None else "its validity ran out"
            _say(
                err,
                f"lease lost: {reason}; the command ended after that (status {child.status}) "
                "and may have overlapped another holder",
            )
        return EXIT_LOST
    if release_error is not None:
        _say(
            err,
            f"warning: {one_line(release_error)}; the command had ended within the "
            "lease's validity, so its status is returned",
        )
    if signals.first is not None:
        return 128 + signals.first
    return child.status

"""Worker processes that take a lock, use the register, and record what they did.

Theory of operation
-------------------
Each worker is a process of its own, forked from multiprocessing's fork server (spawned
where the platform has none): it inherits nothing of the scenario's process, and makes
its own lock client and store connection. It obeys commands from the scenario over a
pipe and appends every step to its own history file, one JSON line per event, flushed
at once: a worker may be SIGSTOPped or SIGKILLed at any instant, and what it recorded
up to then must survive.
All times are ``time.monotonic_ns()``, one clock for every process on the machine.

Commands are small steps, so a scenario can place a fault exactly between two of them:

``acquire(timeout)``  ->  Request, then Grant or Refused; answers ``"granted"``, or
                          ``"refused: <the lock's reason>"``
``read()``            ->  remembers the register's content
``write(delay)``      ->  checks its lease is still valid *by its own belief*, sleeps
                          ``delay`` (the window a scenario pauses the worker in: a GC
                          pause between check and write), then writes read + its op
``release()``         ->  Release
``loop(seconds, ...)``->  acquire / read / hold / write / release cycles until time is up

A worker never decides anything about safety; it does what a careful user's code does
(check validity before writing) and records it. The checker judges afterwards.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from ..testing.local import DIE_WITH_PARENT
from .history import Grant, HistoryWriter, Refused, Release, Request, Write
from .locks import Held, LockRecipe, make_lock
from .register import Register

if TYPE_CHECKING:
    from multiprocessing.context import ForkServerContext, SpawnContext
    from multiprocessing.process import BaseProcess

__all__ = ["Actor", "ActorSpec", "preload_workers"]

# A worker whose fork server did not import this module first (``preload_workers``)
# imports tenure and redis-py itself; a loaded CI box is slow.
_START_TIMEOUT = 60.0


# The platform has a fork server (not Windows); ``_fork_server_failed``: it could not be
# started in this process (``_start``), so workers are spawned from then on.
_HAS_FORK_SERVER = "forkserver" in multiprocessing.get_all_start_methods()
_fork_server_failed = False


def _context() -> ForkServerContext | SpawnContext:
    """How workers are started: forked from multiprocessing's fork server, a process that
    has run nothing but imports, or spawned where the platform has no fork server (or it
    would not start). Either way nothing of the scenario's process (threads,
    connections, locks) is inherited."""
    if _HAS_FORK_SERVER and not _fork_server_failed:
        return multiprocessing.get_context("forkserver")
    return multiprocessing.get_context("spawn")


def _start(spec: ActorSpec) -> tuple[Connection, BaseProcess]:
    """Start a worker for ``spec``: the scenario's end of its pipe, and its process."""
    global _fork_server_failed
    while True:
        ctx = _context()
        conn, child = ctx.Pipe()
        process = ctx.Process(
            target=_serve, args=(child, spec), name=f"tenure-verify-{spec.proc}", daemon=True
        )
        try:
            process.start()
        except OSError:
            conn.close()
            child.close()
            if ctx.get_start_method() != "forkserver":
                raise
            # The fork server listens on a unix socket under $TMPDIR, whose path may be
            # longer than such a path can be (about 100 bytes): every verification
            # ended in ERROR rows. Spawned workers need no socket.
            _fork_server_failed = True
            continue
        child.close()
        return conn, process


def preload_workers() -> None:
    """Have this process's fork server import the workers' code when it starts (with the
    first worker). Each worker then starts in milliseconds, where one that imports
    tenure and redis-py itself takes about half a second of CPU on a slow machine, a
    verification starting dozens. The list of modules to preload is the process's own
    (``multiprocessing.set_forkserver_preload``): this replaces it, so it is for a
    program's entry point (``tenure verify``, ``tenure demo``), and a server already
    running is left as it is."""
    if _HAS_FORK_SERVER:
        multiprocessing.get_context("forkserver").set_forkserver_preload([__name__])


@dataclass(frozen=True, slots=True)
class ActorSpec:
    proc: str
    lock: LockRecipe
    store_url: str
    fenced: bool
    history_path: str
    resource: str = "register"


class _Worker:
    """The worker's side: one lock, one register handle, one history file."""

    def __init__(self, spec: ActorSpec) -> None:
        self.spec = spec
        self.lock = make_lock(spec.lock)
        self.register = Register(spec.store_url, fenced=spec.fenced, resource=spec.resource)
        self.history = HistoryWriter(spec.history_path)
        self.held: Held | None = None
        self.seen: list[str] = []
        self.ops = 0

    def acquire(self, timeout: float) -> str:
        t_request = time.monotonic_ns()
        self.history.write(Request(self.spec.proc, t_request))
        result = self.lock.acquire(timeout)
        if isinstance(result, Held):
            self.held = result
            self.history.write(
                Grant(
                    self.spec.proc,
                    result.lease,
                    result.token,
                    t_request,
                    result.t,
                    result.valid_until,
                )
            )
            return "granted"
        self.history.write(Refused(self.spec.proc, t_request, time.monotonic_ns(), result))
        # The reason travels with the answer, so that a scenario whose step needed the
        # lock can say why it was refused (ChoreographyError).
        return f"refused: {result}"

    def read(self) -> int:
        self.seen = self.register.read()
        return len(self.seen)

    def write(self, delay: float = 0.0) -> str:
        held = self.held
        if held is None:
            return "not-held"
        if time.monotonic_ns() >= held.valid_until:
            return "expired"  # a careful holder does not write on an expired lease
        if delay:
            time.sleep(delay)
        self.ops += 1
        op = f"{self.spec.proc}.{self.ops}"
        t_start = time.monotonic_ns()
        outcome, seq = self.register.write([*self.seen, op], held.token)
        self.history.write(
            Write(
                self.spec.proc,
                held.lease,
                held.token,
                op,
                t_start,
                time.monotonic_ns(),
                outcome,
                seq,
            )
        )
        return outcome

    def release(self) -> str:
        held, self.held = self.held, None
        if held is None:
            return "not-held"
        t_start = time.monotonic_ns()
        outcome = self.lock.release()
        self.history.write(
            Release(self.spec.proc, held.lease, t_start, time.monotonic_ns(), outcome)
        )
        return outcome

    def loop(self, seconds: float, acquire_timeout: float, hold: float) -> int:
        """Cycles until ``seconds`` have passed; returns how many were granted."""
        end = time.monotonic() + seconds
        granted = 0
        while time.monotonic() < end:
            if self.acquire(acquire_timeout) != "granted":
                time.sleep(random.uniform(0.005, 0.02))
                continue
            granted += 1
            self.read()
            time.sleep(random.uniform(0, hold))
            self.write()
            self.release()
        return granted

    def fresh(self, count: int) -> dict[str, int]:
        """Names never used before, each locked twice (tenure's lock only)."""
        fresh = getattr(self.lock, "fresh", None)
        if fresh is None:
            raise ActorError(f"{type(self.lock).__name__} cannot lock fresh names")
        return dict(fresh(count))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.lock.close()
        self.register.close()
        self.history.close()


def _serve(conn: Connection, spec: ActorSpec) -> None:
    # Ctrl-C belongs to the parent, which stops us in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if DIE_WITH_PARENT is not None:
        DIE_WITH_PARENT()
    worker = _Worker(spec)
    commands: dict[str, Callable[..., object]] = {
        "acquire": worker.acquire,
        "read": worker.read,
        "write": worker.write,
        "release": worker.release,
        "loop": worker.loop,
        "fresh": worker.fresh,
    }
    conn.send(("ready", os.getpid()))
    try:
        while True:
            name, args = conn.recv()
            if name == "exit":
                break
            try:
                conn.send(("ok", commands[name](*args)))
            except Exception as exc:  # reported to the scenario, which fails loudly
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    except EOFError:
        pass
    finally:
        worker.close()


class ActorError(RuntimeError):
    """A worker failed to start, died unexpectedly, or a command raised."""


class Actor:
    """The scenario's handle on one worker process.

    Args:
        spec: what the worker runs.
        wait: wait here until the worker is ready; ``False`` returns as soon as the
            process is started (several then start side by side) and
            :meth:`wait_ready` must be called before any command.
    """

    def __init__(self, spec: ActorSpec, *, wait: bool = True) -> None:
        self.spec = spec
        self.name = spec.proc
        self._conn, self._process = _start(spec)
        self._pending = 0
        # Known from the start, so that close() can signal a worker that never got ready.
        assert self._process.pid is not None
        self.pid: int = self._process.pid
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Wait until the worker has built its lock and store connection.

        Raises:
            ActorError: it died or gave no sign within a minute.
        """
        status, pid = self._receive(_START_TIMEOUT)
        if status != "ready":
            raise ActorError(f"worker {self.name} did not start: {pid}")
        self.pid = pid

    def call(self, name: str, *args: Any, timeout: float = 30.0) -> Any:
        """Run a command and wait for its result."""
        self.send(name, *args)
        return self.result(timeout)

    def send(self, name: str, *args: Any) -> None:
        """Start a command without waiting (the worker may be paused meanwhile)."""
        self._conn.send((name, args))
        self._pending += 1

    def answered(self) -> bool:
        """Whether the command sent last has answered already (its reply is waiting)."""
        return self._conn.poll(0)

    def result(self, timeout: float = 30.0) -> Any:
        status, value = self._receive(timeout)
        self._pending -= 1
        if status != "ok":
            raise ActorError(f"worker {self.name}: {value}")
        return value

    def _receive(self, timeout: float) -> tuple[str, Any]:
        if not self._conn.poll(timeout):
            raise ActorError(f"worker {self.name} gave no answer within {timeout}s")
        try:
            reply: tuple[str, Any] = self._conn.recv()
        except EOFError:
            raise ActorError(f"worker {self.name} died") from None
        return reply

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL: a crash. What it recorded so far stays in its history file."""
        if self._process.is_alive():
            os.kill(self.pid, signal.SIGKILL)
        self._process.join(5)

    @property
    def alive(self) -> bool:
        return self._process.is_alive()

    def close(self) -> None:
        if self._process.is_alive():
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGCONT)
            with contextlib.suppress(OSError, BrokenPipeError):
                self._conn.send(("exit", ()))
            self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self._conn.close()

"""Child processes (servers) that die with the process that started them.

On Linux a child asks the kernel for a signal when its parent dies
(``PR_SET_PDEATHSIG``), so that a harness killed outright leaves no server behind.
The kernel's "parent", though, is the *thread* that forked the child: a node restarted
from a short-lived thread (a test's fault injector, a thread pool's worker) would be
killed as soon as that thread ended. So :func:`popen` forks from the main thread, or
else from one thread of its own that lives as long as the process.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["DIE_WITH_PARENT", "popen"]

_PR_SET_PDEATHSIG = 1

if sys.platform.startswith("linux"):
    # Resolve prctl in the parent: the child between fork and exec should do as little
    # as possible (no dlopen, no imports).
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
    _sigkill = int(signal.SIGKILL)

    def _die_with_parent() -> None:
        # Fires when the thread that forked the child exits, not only the process:
        # fork through ``popen``, which picks a thread that does not end first.
        _prctl(_PR_SET_PDEATHSIG, _sigkill)

    # (Documented where it is public: tenure.testing.local.)
    DIE_WITH_PARENT: Callable[[], None] | None = _die_with_parent
else:
    DIE_WITH_PARENT = None

_Job = tuple["Future[subprocess.Popen[Any]]", list[str], dict[str, Any]]
_jobs: queue.SimpleQueue[_Job] | None = None
_starting = threading.Lock()


def popen(args: list[str], **options: Any) -> subprocess.Popen[Any]:
    """``subprocess.Popen(args, preexec_fn=DIE_WITH_PARENT, **options)``, forked from a
    thread that lives as long as the process, whichever thread calls it."""
    if DIE_WITH_PARENT is None or threading.current_thread() is threading.main_thread():
        return subprocess.Popen(args, preexec_fn=DIE_WITH_PARENT, **options)
    done: Future[subprocess.Popen[Any]] = Future()
    _forker().put((done, args, options))
    return done.result()


def _forker() -> queue.SimpleQueue[_Job]:
    global _jobs
    with _starting:
        if _jobs is None:
            _jobs = queue.SimpleQueue()
            threading.Thread(target=_fork_for_others, args=(_jobs,), daemon=True).start()
        return _jobs


def _fork_for_others(jobs: queue.SimpleQueue[_Job]) -> None:
    while True:
        done, args, options = jobs.get()
        try:
            done.set_result(subprocess.Popen(args, preexec_fn=DIE_WITH_PARENT, **options))
        except BaseException as exc:  # the caller's to see, as if it had forked
            done.set_exception(exc)


def _forget_after_fork() -> None:
    # The forking thread is the parent's: a child that starts servers makes its own.
    global _jobs, _starting
    _jobs, _starting = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)

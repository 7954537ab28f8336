"""Evidence that a fault really happened, for the verifier's report.

A verifier that injects a fault and finds no violation has shown nothing unless it can
also show the fault took effect: that a paused process really was stopped (``T`` in
``/proc``), that a restarted node really is a new process (a new ``run_id``), that a
node's clock really moved (``TIME``, see :mod:`tenure.verify.clock`), that a partition
really dropped bytes (:attr:`tenure.verify.proxy.ProxyStats.bytes_dropped`). These are
the small readers for such evidence, and a way to wait for it with a deadline instead
of sleeping.

Process states come from ``/proc/<pid>/stat`` (Linux): ``R`` running, ``S`` sleeping,
``D`` disk wait, ``T`` stopped by a signal, ``t`` stopped by a tracer, ``Z`` zombie
(dead, not yet reaped). A PID with no ``/proc`` entry left is reported by
:func:`wait_for_state` as ``X``, the kernel's own letter for "dead".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import redis

from tenure._errors import TenureError

__all__ = [
    "FaultNotObserved",
    "info_field",
    "observed",
    "process_state",
    "run_id",
    "server_pid",
    "wait_for_state",
    "wait_until",
]

_POLL_INTERVAL = 0.001
_GONE = "X"

T = TypeVar("T")


class FaultNotObserved(TenureError, TimeoutError):
    """The evidence of a fault did not appear before the deadline (or, for evidence
    read once after the fault, such as a counter, was not there).

    Attributes:
        what: what was awaited, e.g. ``"pid 1234 in state T"``.
        last: the last value observed, as text.
    """

    def __init__(self, what: str, timeout: float | None, last: str) -> None:
        within = "" if timeout is None else f" within {timeout} s"
        super().__init__(f"{what}: not observed{within} (last seen: {last})")
        self.what = what
        self.last = last


def process_state(pid: int) -> str:
    """The state letter of a process, from ``/proc/<pid>/stat`` (Linux).

    Raises:
        ProcessLookupError: no such process (it exited and was reaped).
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        raise ProcessLookupError(pid, f"no process {pid}") from None
    # "pid (comm) S ...": comm may hold spaces and parentheses, but it is the only
    # free text, so the state is the first field after the *last* ")".
    return stat.rpartition(")")[2].split()[0]


def wait_for_state(pid: int, states: str, timeout: float) -> str:
    """Wait until a process is in one of ``states``, e.g. ``"Tt"`` after SIGSTOP.

    Args:
        pid: the process.
        states: acceptable state letters; include ``"X"`` (gone) and ``"Z"`` (zombie)
            to wait for a death.
        timeout: seconds.

    Returns:
        The state observed.

    Raises:
        FaultNotObserved: the process was not in any of ``states`` within ``timeout``.
    """

    def current() -> str:
        try:
            return process_state(pid)
        except ProcessLookupError:
            return _GONE

    return wait_until(current, lambda state: state in states, timeout, f"pid {pid} in {states}")


def wait_until(probe: Callable[[], T], accept: Callable[[T], bool], timeout: float, what: str) -> T:
    """Poll ``probe()`` until ``accept`` says yes; return the accepted value.

    Args:
        probe: reads the evidence (called at least once).
        accept: whether a value is the evidence awaited.
        timeout: seconds.
        what: a description for the error.

    Raises:
        FaultNotObserved: no accepted value within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if accept(value):
            return value
        if time.monotonic() >= deadline:
            raise FaultNotObserved(what, timeout, repr(value))
        time.sleep(_POLL_INTERVAL)


def observed(value: T, accept: Callable[[T], bool], what: str) -> T:
    """Evidence read once, after the fault (a counter it moved): ``value`` if ``accept``
    says it shows the fault took effect.

    Raises:
        FaultNotObserved: it does not; the run would test a fault that did not happen.
    """
    if not accept(value):
        raise FaultNotObserved(what, None, repr(value))
    return value


def info_field(client: redis.Redis, section: str, field: str) -> str | None:
    """One field of ``INFO <section>`` as text.

    Returns:
        The value, or ``None`` if the server has no such field (e.g.
        ``master_link_status`` on a master).
    """
    value = client.info(section).get(field)
    return None if value is None else str(value)


def run_id(client: redis.Redis) -> str:
    """The server's ``run_id``: a new one proves the server process restarted."""
    value = info_field(client, "server", "run_id")
    if value is None:
        raise redis.ResponseError("INFO server has no run_id")
    return value


def server_pid(client: redis.Redis) -> int:
    """The server's ``process_id`` from ``INFO server``, for :func:`process_state`."""
    value = info_field(client, "server", "process_id")
    if value is None:
        raise redis.ResponseError("INFO server has no process_id")
    return int(value)

"""Free-running workers race on the register while lock nodes fail: the run under ``tenure demo``.

Theory of operation
-------------------
One :class:`~tenure.verify.world.World` per run: its store node (never faulted) holds the
register, ``nodes`` lock nodes serve tenure's lock, and ``workers`` actor processes loop
on acquire / read / wait up to ``race_window`` / write / release for ``seconds``
(:meth:`Actor.loop <tenure.verify.actors.Actor>`). The register is the list of the
increments written into it, so it is a counter whose every lost increment is known by
name. Without nodes the workers run the ``no-lock`` baseline: every acquire is granted
at once, and their read-modify-writes race.

Meanwhile the parent applies the :class:`NodeFault` plan when each fault's share of the
run has passed, through the world, which records each fault in the history with its
proof (the kernel's ``T`` state of the paused node, then its ``PONG`` after
``SIGCONT``; the killed node's PID gone).

Nothing here counts anything itself: once the workers are done and the register's final
content is recorded, the histories are read back and judged by the checker
(:mod:`tenure.verify.checker`). Cycles are its leases granted, lost updates its C5,
overlaps its C1, holders its :func:`~tenure.verify.checker.max_holders`, and the lock's
availability per phase (each stretch of the run with one set of faults in force) is cut
from its :func:`~tenure.verify.checker.unavailable_stretches`.

If the parent is interrupted (Ctrl-C), the workers are SIGKILLed by their own handles at
once (they ignore SIGINT, and their loops would otherwise run to their end), then the
world closes its nodes.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..local import LocalNode
from .actors import ActorError
from .checker import Verdict, check, max_holders, unavailable_stretches
from .history import Fault, History, read_history
from .locks import LockRecipe
from .world import World

__all__ = [
    "NodeFault",
    "Phase",
    "RaceResult",
    "demo_faults",
    "phases",
    "race",
]

LOCK_NAME = "demo-counter"
# A blocking acquire gives up after this long and the worker simply asks again: short,
# so that a worker notices the end of its run soon.
ACQUIRE_TIMEOUT = 0.25
RACE_WINDOW = 0.001  # seconds: the longest wait between read and write, as real work
_TICK = 0.1  # seconds between fault checks and progress reports
_RESULT_GRACE = 60.0  # seconds past the run for a worker's last cycle and its answer

_VERBS = {"pause": "paused", "resume": "resumed", "kill": "killed"}


@dataclass(frozen=True)
class NodeFault:
    """At ``share`` of the run (0 to 1), ``action`` ("pause", "resume", "kill") the lock
    node ``node`` (its name, e.g. ``"n2"``)."""

    share: float
    action: str
    node: str

    @property
    def verb(self) -> str:
        """``"paused"``, as in "n2 paused"."""
        return _VERBS[self.action]


def demo_faults(nodes: int) -> tuple[NodeFault, ...]:
    """Pause node 2 at 1/3 and resume it at 0.85, kill node 4 at 1/2: as many of these as
    still leave a majority of ``nodes`` up. Resumed before the end, node 2 then runs the
    commands queued while it was frozen, and is not left stopped."""
    tolerable = (nodes - 1) // 2
    plan: list[NodeFault] = []
    if tolerable >= 1:
        plan += [NodeFault(1 / 3, "pause", "n2"), NodeFault(0.85, "resume", "n2")]
    if tolerable >= 2:
        plan.append(NodeFault(1 / 2, "kill", "n4"))
    return tuple(sorted(plan, key=lambda f: f.share))


@dataclass(frozen=True)
class Phase:
    """A stretch of a run with one set of faults in force, as the checker saw it.

    Attributes:
        faults: what was in force, e.g. ``("n2 paused", "n4 killed")``; empty: none.
        start, end: ``time.monotonic_ns()`` bounds.
        cycles: leases granted in it.
        refused: acquisitions that ended in it without a lease (timed out while others
            held the lock, or refused for want of a majority).
        longest_gap_ns: the longest stretch in it during which some worker waited for
            the lock and no lease was valid.
    """

    faults: tuple[str, ...]
    start: int
    end: int
    cycles: int
    refused: int
    longest_gap_ns: int

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / 1e9


@dataclass(frozen=True)
class RaceResult:
    """One run, judged by the checker.

    Attributes:
        locked: whether the workers used tenure's lock.
        workers: worker processes.
        start, end: ``time.monotonic_ns()`` when the workers were set loose and when the
            last one finished.
        history: the run's history, as the checker read it.
        verdict: the checker's verdict on it.
        max_holders: the most leases valid at one instant (checker).
        phases: the run cut at every fault's start and end.
        errors: what went wrong in the run itself (a worker that failed, a fault that
            could not be applied or proven); not the checker's findings.
    """

    locked: bool
    workers: int
    start: int
    end: int
    history: History
    verdict: Verdict
    max_holders: int
    phases: tuple[Phase, ...]
    errors: tuple[str, ...]

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / 1e9

    @property
    def clean(self) -> bool:
        """Work was done, one holder at a time, nothing lost, nothing went wrong."""
        v = self.verdict
        return (
            v.cycles > 0
            and self.max_holders == 1
            and v.safe
            and v.lost_updates == 0
            and not v.problems
            and not self.errors
        )


Progress = Callable[[float, int, Sequence[tuple[float, NodeFault]]], None]
"""Called about every 0.1 s: seconds elapsed, leases granted so far, faults applied
(each with the second it was applied at)."""


def race(
    directory: Path,
    *,
    workers: int,
    seconds: float,
    nodes: int,
    ttl: float,
    faults: Sequence[NodeFault] = (),
    progress: Progress | None = None,
) -> RaceResult:
    """Race ``workers`` processes on the register for ``seconds``, applying ``faults``.

    Args:
        directory: the run's directory (histories in ``history/``, nodes in ``nodes/``);
            history files already in ``history/`` are judged with the run's.
        workers: worker processes.
        seconds: how long the workers loop.
        nodes: lock nodes; 0 runs the workers without a lock.
        ttl: the lock's TTL in seconds.
        faults: faults on the lock nodes, by name (``"n1"`` is the first).
        progress: called while the run goes on.

    Returns:
        The checker's account of the run.

    Raises:
        LocalNodeError: a node failed to start.
        ActorError: a worker failed to start.
    """
    errors: list[str] = []
    with World(directory) as world:
        lock_nodes = {f"n{i}": world.node(f"n{i}") for i in range(1, nodes + 1)}
        if lock_nodes:
            recipe = LockRecipe("tenure", tuple(n.url for n in lock_nodes.values()), LOCK_NAME, ttl)
        else:
            recipe = LockRecipe("no-lock", (), LOCK_NAME, ttl)
        actors = world.actors([f"W{i}" for i in range(1, workers + 1)], recipe, fenced=False)
        tally = _GrantTally(directory / "history", [a.name for a in actors])
        start = time.monotonic_ns()
        try:
            for actor in actors:
                actor.send("loop", seconds, ACQUIRE_TIMEOUT, RACE_WINDOW)
            _drive(world, lock_nodes, faults, seconds, start, tally, progress, errors)
            for actor in actors:
                try:
                    actor.result(seconds + _RESULT_GRACE)
                except ActorError as exc:
                    errors.append(str(exc))
        except BaseException:
            # Ctrl-C or a failure of our own: the workers would loop on to their end.
            for actor in actors:
                actor.kill()
            raise
        end = time.monotonic_ns()
        # All wind down side by side (closing a lock client takes a moment); the world's
        # close then only joins them.
        for actor in actors:
            actor.send("exit")
        try:
            world.final()
        except Exception as exc:  # the verdict then says lost updates are unknown
            errors.append(f"reading the register: {type(exc).__name__}: {exc}")
    history = read_history(sorted((directory / "history").glob("*.jsonl")))
    return RaceResult(
        locked=bool(lock_nodes),
        workers=workers,
        start=start,
        end=end,
        history=history,
        verdict=check(history),
        max_holders=max_holders(history),
        phases=phases(history, start, end),
        errors=tuple(errors),
    )


def _drive(
    world: World,
    nodes: dict[str, LocalNode],
    faults: Sequence[NodeFault],
    seconds: float,
    start: int,
    tally: _GrantTally,
    progress: Progress | None,
    errors: list[str],
) -> None:
    """Wait out the run, applying each fault when its time comes."""
    pending = sorted(faults, key=lambda f: f.share)
    applied: list[tuple[float, NodeFault]] = []
    while True:
        elapsed = (time.monotonic_ns() - start) / 1e9
        while pending and elapsed >= pending[0].share * seconds:
            fault = pending.pop(0)
            try:
                _apply(world, nodes[fault.node], fault)
            except Exception as exc:  # reported; the run goes on without it
                errors.append(f"{fault.node} not {fault.verb}: {type(exc).__name__}: {exc}")
            applied.append((elapsed, fault))
        if progress is not None:
            progress(min(elapsed, seconds), tally.count(), applied)
        if elapsed >= seconds:
            return
        time.sleep(min(_TICK, seconds - elapsed))


def _apply(world: World, node: LocalNode, fault: NodeFault) -> None:
    if fault.action == "pause":
        world.pause_node(node)
    elif fault.action == "resume":
        world.resume_node(node)
    elif fault.action == "kill":
        world.kill_node(node)
    else:
        raise ValueError(f"unknown fault action {fault.action!r}")


class _GrantTally:
    """Leases granted so far, for the progress display: counted in the workers' history
    files as they grow (each event is one line, ``kind`` first), never judged from."""

    _MARK = b'{"kind":"grant"'

    def __init__(self, directory: Path, procs: Sequence[str]) -> None:
        self._paths = [directory / f"{p}.jsonl" for p in procs]
        self._offsets = [0] * len(self._paths)
        self._counts = [0] * len(self._paths)
        self._tails = [b""] * len(self._paths)

    def count(self) -> int:
        for i, path in enumerate(self._paths):
            try:
                with open(path, "rb") as f:
                    f.seek(self._offsets[i])
                    data = f.read()
            except FileNotFoundError:
                continue
            self._offsets[i] += len(data)
            # Only whole lines count; a line being written is kept for the next time.
            head, _, tail = (self._tails[i] + data).rpartition(b"\n")
            self._tails[i] = tail
            self._counts[i] += sum(1 for line in head.split(b"\n") if line.startswith(self._MARK))
        return sum(self._counts)


# --- phases ---------------------------------------------------------------------------------


def phases(history: History, start: int, end: int) -> tuple[Phase, ...]:
    """Cut ``[start, end)`` at the start and end of every fault in ``history``.

    A node kill lasts to the end of the run (the node is not restarted); any other fault
    lasts from its ``t_start`` to its ``t_end``.
    """
    spans = [
        (_label(f), f.t_start, end if f.name == "kill" or f.t_end is None else f.t_end)
        for f in history.faults
    ]
    cuts = sorted({start, end, *(t for _, a, b in spans for t in (a, b) if start < t < end)})
    gaps = unavailable_stretches(history)
    out = []
    for a, b in itertools.pairwise(cuts):
        in_force = tuple(label for label, s, e in spans if s <= a < e)
        cycles = sum(1 for g in history.grants if a <= g.t < b)
        refused = sum(1 for r in history.refusals if a <= r.t < b)
        longest = max((min(e, b) - max(s, a) for s, e in gaps if s < b and e > a), default=0)
        out.append(Phase(in_force, a, b, cycles, refused, longest))
    return tuple(out)


def _label(fault: Fault) -> str:
    verbs = {"pause": "paused", "kill": "killed"}
    return f"{fault.target} {verbs.get(fault.name, fault.name)}"

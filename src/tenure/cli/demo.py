"""``tenure demo``: watch the lock keep a racy counter exact while nodes fail.

Theory of operation
-------------------
The demo is a presentation of one run of the verifier's engine (``tenure verify``): the
same world of processes, the same fault injection with proofs, the same workers, the
same trusted checker. It counts nothing itself.

Five lock nodes and, apart from them, one *store* node that holds a shared counter and
is never faulted. Worker processes each loop on an unsafe read-modify-write of that
counter::

    value = GET counter        # read
    sleep(0..1 ms)             # widen the race window, as real work would
    SET counter value + 1      # write back, blind to anyone who wrote meanwhile

The counter is the verifier's register: the list of the increments written into it, so
its length is the counter's value and each lost increment is known by name. Only mutual
exclusion makes the loop correct: two workers inside at once both read the same value
and one increment is lost. Every worker appends each step (request, grant, write,
release) to its own history file, on the one monotonic clock all processes of a machine
share. After the run the checker reads the histories and reports the cycles (leases
granted), the lost updates (increments acknowledged by the store but missing from the
final counter), the overlaps (pairs of leases valid at the same time), the maximum
simultaneous holders, and, phase by phase, how available the lock stayed.

During the locked run the faults are injected on the lock nodes: at 1/3 of the run node
2 is paused (SIGSTOP: it accepts connections but answers nothing, like a frozen VM), at
1/2 node 4 is killed (SIGKILL: a crash), and near the end node 2 is resumed, and then
executes the commands queued while it was frozen. Each fault is recorded with its proof
(the kernel's ``T`` state, the node answering again, the PID gone). Three of five nodes
stay up, a majority, so the lock must stay both live and safe. The run is then repeated
for a third of the time *without* the lock, on a fresh counter, to show that the race
is real.

Workers are processes forked from multiprocessing's fork server, which imported their
code once (``tenure.verify.actors``): no state is inherited from the parent, each builds
its own tenure ``Client`` and redis connection. SIGINT is ignored there, so Ctrl-C
reaches only the parent, which kills them by their own handles and closes the nodes.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from .._core.config import ClientConfig, LockSpec, min_ttl
from .._errors import ConfigurationError
from ..verify.history import Fault
from ..verify.locks import LockRecipe
from ..verify.race import NodeFault, Progress, RaceResult, demo_faults, race

__all__ = ["MAX_DURATION", "MAX_NODES", "MAX_WORKERS", "run_demo", "ttl_range"]

_TICK = 0.1  # seconds between progress updates on a terminal
# The largest runs the demo makes (``--workers``, ``--nodes``, ``--duration``): each worker
# and node is a process of its own, and the demo is something to watch, not a soak.
MAX_WORKERS = 64
MAX_NODES = 15
MAX_DURATION = 3600.0
_QUICK_WORKERS = 4
_QUICK_DURATION = 3.0
_CONTRAST_SHARE = 1 / 3  # the unlocked run lasts this fraction of the locked one
_CONTRAST_MIN = 0.5
_EXAMPLE_CHARS = 400
_LABELS = ("with lock", "without lock")


# --- progress display -----------------------------------------------------------------


class _Progress:
    """One status line on a terminal (rewritten with ``\\r``), or a line a second otherwise."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = stream.isatty()
        self._interval = _TICK if self._tty else 1.0
        self._last = float("-inf")
        self._width = 0

    def update(self, text: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._interval:
            return
        self._last = now
        if self._tty:
            # A line longer than the terminal wraps, and "\r" would then rewrite only
            # its last row: cut it to fit.
            text = text[: shutil.get_terminal_size().columns - 1]
            self._stream.write("\r" + text.ljust(self._width))
            self._width = max(self._width, len(text))
        else:
            self._stream.write(text + "\n")
        self._stream.flush()

    def clear(self) -> None:
        """Erase the status line so that ordinary output starts on a clean line."""
        if self._tty and self._width:
            self._stream.write("\r" + " " * self._width + "\r")
            self._stream.flush()
        self._width = 0
        self._last = float("-inf")


def _reporter(label: str, duration: float, planned: bool, status: _Progress) -> Progress:
    def report(elapsed: float, cycles: int, applied: Sequence[tuple[float, NodeFault]]) -> None:
        # Short enough for one terminal line: "n2 paused@2.0s", no signal names.
        faults = ", ".join(f"{f.node} {f.verb}@{at:.1f}s" for at, f in applied)
        status.update(
            f"{label}: {elapsed:4.1f}/{duration:.1f} s  {cycles:7d} cycles  "
            f"faults: {faults or ('none yet' if planned else 'none')}",
            force=elapsed >= duration,
        )

    return report


# --- running --------------------------------------------------------------------------


def _run(
    label: str,
    directory: Path,
    status: _Progress,
    *,
    workers: int,
    duration: float,
    nodes: int,
    ttl: float,
    faults: Sequence[NodeFault],
) -> RaceResult:
    what = f"{nodes} lock nodes and {workers} workers" if nodes else f"{workers} workers"
    status.update(f"{label}: starting {what} ...", force=True)
    try:
        return race(
            directory,
            workers=workers,
            seconds=duration,
            nodes=nodes,
            ttl=ttl,
            faults=faults,
            progress=_reporter(label, duration, bool(faults), status),
        )
    finally:
        status.clear()


# --- the report -----------------------------------------------------------------------

_COLUMNS = ("run", "workers", "cycles", "cycles/s", "max holders", "overlaps", "lost updates")
_PHASE_COLUMNS = ("from", "to", "faults in force", "cycles", "cycles/s", "refused", "longest gap")


_LEGEND = """\
Every figure is the checker's, read from the workers' histories (as in tenure verify):
cycles are leases granted; max holders, the most leases valid at one instant; overlaps,
pairs of leases valid at the same time; lost updates, increments the store acknowledged
that are missing from the final counter; refused, acquisitions that gave up (busy lock,
or no majority); longest gap, the longest time a worker waited while nobody held the lock.
"""


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:.0f}" if seconds > 0 else "-"


def _align(rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    """Columns two spaces apart; the first ``left`` read left to right, numbers line up
    on their last digit."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


def _table(results: Sequence[tuple[str, RaceResult]]) -> list[str]:
    rows = [_COLUMNS] + [
        (
            label,
            str(r.workers),
            str(r.verdict.cycles),
            _rate(r.verdict.cycles, r.seconds),
            str(r.max_holders),
            str(r.verdict.overlaps),
            "?" if r.verdict.lost_updates is None else str(r.verdict.lost_updates),
        )
        for label, r in results
    ]
    return _align(rows)


def _phase_table(result: RaceResult) -> list[str]:
    def at(t: int) -> str:
        return f"{(t - result.start) / 1e9:.1f}s"

    rows = [_PHASE_COLUMNS] + [
        (
            at(p.start),
            at(p.end),
            ", ".join(p.faults) or "none",
            str(p.cycles),
            _rate(p.cycles, p.seconds),
            str(p.refused),
            f"{p.longest_gap_ns / 1e6:.0f} ms",
        )
        for p in result.phases
    ]
    return _align(rows, left=3)


# What each fault the world records did, and how (and what undid it, if anything).
_FAULTS = {"pause": ("paused (SIGSTOP)", "resumed (SIGCONT)"), "kill": ("killed (SIGKILL)", "")}


def _did(fault: Fault) -> str:
    """``"paused"`` for a pause: the verb alone."""
    return _FAULTS.get(fault.name, (fault.name, ""))[0].split(" (")[0]


def _fault_lines(result: RaceResult) -> list[str]:
    """Each fault as the history recorded it, with its proof."""

    def at(t: int) -> str:
        return f"t={(t - result.start) / 1e9:.1f}s"

    lines = []
    for f in result.verdict.faults:  # in the order they began
        did, undid = _FAULTS.get(f.name, (f.name, ""))
        what = f"{at(f.t_start)} {f.target} {did}"
        if undid and f.t_end is not None:
            what += f", {at(f.t_end)} {undid}"
        lines.append(f"  {what}; proof: {f.proof}")
    return lines


def _describe(label: str, result: RaceResult, out: TextIO) -> None:
    faults = "" if result.verdict.faults else "; no faults"
    print(f"{label}: {result.seconds:.1f} s, {result.verdict.cycles} cycles{faults}", file=out)
    for line in _fault_lines(result):
        print(line, file=out)
    out.flush()


def _notes(locked: RaceResult, unlocked: RaceResult) -> list[str]:
    notes = []
    unreachable = [r for r in locked.history.refusals if r.reason.startswith("QuorumUnreachable")]
    if unreachable:
        notes.append(f"acquisitions refused for want of a majority: {len(unreachable)}")
        notes.append(_example(unreachable[0].reason))
    elif locked.history.refusals and not locked.verdict.cycles:
        # Nothing granted, and not for want of a majority: say what the nodes answered.
        notes.append(f"acquisitions that gave up: {len(locked.history.refusals)}")
        notes.append(_example(locked.history.refusals[-1].reason))
    lost = sum(1 for r in locked.history.releases if r.outcome == "lost")
    if lost:
        notes.append(f"releases that found the lease already gone: {lost}")
    u = unlocked.verdict
    if u.cycles and not u.overlaps and not u.lost_updates:
        notes.append("the race did not show without the lock this time (try more workers)")
    for label, r in zip(_LABELS, (locked, unlocked), strict=True):
        notes += [f"error ({label}): {e}" for e in r.errors]
        notes += [f"history problem ({label}): {p}" for p in r.verdict.problems[:5]]
        if r.verdict.skipped_lines:
            notes.append(f"unreadable history lines ({label}): {r.verdict.skipped_lines}")
    return notes


def _example(text: str) -> str:
    """The first such error seen, cut short: enough to tell what the nodes said."""
    if len(text) > _EXAMPLE_CHARS:
        text = text[: _EXAMPLE_CHARS - 3] + "..."
    return f"  e.g. {text}"


def _verdict(locked: RaceResult, unlocked: RaceResult) -> str:
    v, u = locked.verdict, unlocked.verdict
    faults = [f"{f.target} {_did(f)}" for f in v.faults]
    through = f"through {', '.join(faults)}" if faults else "with no faults injected"
    if locked.clean:
        if u.cycles:
            contrast = (
                f"without it {u.lost_updates} of {u.writes_ok} updates were lost, with up to "
                f"{unlocked.max_holders} workers inside at once"
            )
        else:
            contrast = "the run without it did no work"
        return (
            f"PASS: with the lock the counter stayed exact ({v.cycles} cycles, at most one "
            f"holder at a time) {through}; {contrast}."
        )
    why = []
    if v.cycles == 0:
        why.append("no cycle completed")
    if locked.max_holders > 1:
        why.append(f"{locked.max_holders} holders at once")
    if v.lost_updates is None:
        why.append("the final counter is unknown")
    elif v.lost_updates:
        why.append(f"{v.lost_updates} lost updates")
    if not v.safe and v.overlaps == 0 and not v.lost_updates:
        why.append("the checker found a violation")
    if v.problems:
        why.append(f"{len(v.problems)} problems in the history")
    if locked.errors:
        why.append(f"{len(locked.errors)} errors")
    return f"FAIL: the locked run was not clean: {', '.join(why)}."


# --- entry point ----------------------------------------------------------------------


def ttl_range() -> tuple[float, float]:
    """The shortest and the longest TTL (seconds) the workers' clients accept."""
    recipe = LockRecipe("tenure", (), "demo", 2.0)
    config = ClientConfig.build(
        ["redis://127.0.0.1:6379"], node_timeout=recipe.node_timeout, max_ttl=recipe.max_ttl
    )
    return min_ttl(config), recipe.max_ttl


def _check(workers: int, duration: float, nodes: int, ttl: float) -> None:
    # Upper bounds too: 1001 nodes or 100000 workers started that many processes, and a
    # duration of 1e300 s ran for ever (the command line's types say the same first).
    if not 1 <= workers <= MAX_WORKERS:
        raise ConfigurationError(
            "workers",
            f"must be from 1 to {MAX_WORKERS}, got {workers}: give --workers in that range "
            "(default 8)",
        )
    if not 0 < duration <= MAX_DURATION:
        raise ConfigurationError(
            "duration",
            f"must be more than 0 and at most {MAX_DURATION:g} seconds, got {duration:g}: "
            "give --duration in that range (default 6)",
        )
    if not 1 <= nodes <= MAX_NODES or nodes % 2 == 0:
        raise ConfigurationError(
            "nodes",
            f"must be an odd number from 1 to {MAX_NODES}, got {nodes}: give --nodes in "
            "that range (default 5)",
        )
    if not ttl > 0:
        raise ConfigurationError("ttl", f"must be a positive number of seconds, got {ttl}")
    # The workers' clients would refuse a TTL out of their range, each of them, after the
    # nodes and workers had started and the whole run had been spent on no cycle at all:
    # the same rule is applied here, with their settings, before anything starts.
    recipe = LockRecipe("tenure", (), "demo", ttl)
    config = ClientConfig.build(
        ["redis://127.0.0.1:6379"], node_timeout=recipe.node_timeout, max_ttl=recipe.max_ttl
    )
    try:
        LockSpec.build(config, recipe.name, ttl)
    except ConfigurationError:
        raise ConfigurationError(
            "ttl",
            f"must be from {min_ttl(config):g} to {recipe.max_ttl:g} seconds (the workers' "
            f"clients have node_timeout={recipe.node_timeout:g}s and max_ttl="
            f"{recipe.max_ttl:g}s), got {ttl:g}: give --ttl in that range (default 2)",
        ) from None


def run_demo(
    workers: int = 8,
    duration: float = 6.0,
    nodes: int = 5,
    ttl: float = 2.0,
    quick: bool = False,
    out: TextIO | None = None,
    progress: TextIO | None = None,
    directory: Path | None = None,
) -> int:
    """Race worker processes on a counter with and without the lock, under faults.

    Args:
        workers: worker processes per run (1 to ``MAX_WORKERS``).
        duration: seconds of the locked run, at most ``MAX_DURATION`` (the unlocked one
            lasts a third of it).
        nodes: lock nodes, odd, at most ``MAX_NODES``; node 2 is paused and node 4
            killed while a majority would still remain.
        ttl: lock TTL in seconds.
        quick: a short run for CI: at most 4 workers and 3 seconds.
        out: where the report goes (default ``sys.stdout``).
        progress: where the live status line goes (default ``sys.stderr``).
        directory: keep the runs' files here (``with-lock/`` and ``without-lock/``, each
            with its ``history/`` and ``nodes/``) instead of in a temporary directory
            removed at the end; history files already there are judged with the run's.

    Returns:
        0 if the locked run was clean (cycles done, at most one holder at any instant,
        no lost update, every fault applied, nothing wrong in the run), else 1.

    Raises:
        ConfigurationError: a parameter is out of range, or no redis-server was found.
        LocalNodeError: a redis-server failed to start.
    """
    out = sys.stdout if out is None else out
    if quick:
        workers, duration = min(workers, _QUICK_WORKERS), min(duration, _QUICK_DURATION)
    _check(workers, duration, nodes, ttl)
    status = _Progress(sys.stderr if progress is None else progress)
    print(
        f"tenure demo: {workers} worker processes, lock on {nodes} node{'s' * (nodes > 1)} "
        f"(majority {nodes // 2 + 1}), ttl {ttl:g} s; counter on a separate node",
        file=out,
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        if directory is None:
            directory = Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="tenure-demo-"))
            )
        locked = _run(
            _LABELS[0],
            directory / "with-lock",
            status,
            workers=workers,
            duration=duration,
            nodes=nodes,
            ttl=ttl,
            faults=demo_faults(nodes),
        )
        _describe(_LABELS[0], locked, out)
        unlocked = _run(
            _LABELS[1],
            directory / "without-lock",
            status,
            workers=workers,
            duration=max(duration * _CONTRAST_SHARE, _CONTRAST_MIN),
            nodes=0,
            ttl=ttl,
            faults=(),
        )
        _describe(_LABELS[1], unlocked, out)
    print(file=out)
    for line in _table(list(zip(_LABELS, (locked, unlocked), strict=True))):
        print(line, file=out)
    print(file=out)
    print(f"{_LABELS[0]}, phase by phase:", file=out)
    for line in _phase_table(locked):
        print(f"  {line}", file=out)
    print(file=out)
    print(_LEGEND, file=out)
    for note in _notes(locked, unlocked):
        print(note if note.startswith(" ") else f"note: {note}", file=out)
    print(_verdict(locked, unlocked), file=out, flush=True)
    return 0 if locked.clean else 1

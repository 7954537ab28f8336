"""Run scenarios, check their histories, and report: a table, a verdict, timelines.

Each (scenario, configuration) pair runs in a fresh :class:`World` in its own directory
under the report directory, so its history files and node logs stay for inspection. The
checker reads the merged history; the configuration's expectations turn the counts into
PASS or FAIL. The whole verification passes only if every expectation holds: the
mitigated configurations show no violation, *and* every control shows the violation it
exists to show. A run that could not be carried out (a node that would not start, no
libfaketime, a worker that died) is an ERROR, not a FAIL: it says nothing about the lock,
unless what it saw before it broke off already breaks a limit (a mitigation's C1 = 0),
which is a FAIL whatever came after.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .checker import Verdict, check
from .history import Grant, History, Refused, Request, read_history
from .scenarios import SCENARIOS, Config, Scenario, at_least, unobserved
from .timeline import render_html
from .world import World

__all__ = ["Mode", "RunResult", "format_table", "run_scenarios"]

Mode = str  # "quick" | "standard" | "soak"
_STANDARD_CYCLES = 10


@dataclass(frozen=True)
class RunResult:
    scenario: Scenario
    config: Config
    figures: dict[str, float | int | None]
    verdict: Verdict
    failures: tuple[str, ...]
    seconds: float
    timeline: Path | None
    error: str | None = None
    extra_figures: tuple[str, ...] = ()
    broken: tuple[str, ...] = ()  # the failures that are limits broken by what was seen

    @property
    def passed(self) -> bool:
        return not self.failures and self.error is None

    @property
    def status(self) -> str:
        """``PASS``; ``FAIL``: an expectation did not hold; ``ERROR``: the run could not
        be carried out, and what it saw broke no limit."""
        if self.error is None:
            return "FAIL" if self.failures else "PASS"
        return "FAIL" if self.broken else "ERROR"

    @property
    def shown(self) -> dict[str, float | int | None]:
        """The figures as the table and summary.json give them. A run that broke off
        counted only part of what it was to run, so a zero it counted says nothing (no
        overlap seen in a run that never took the lock is not "no overlap"): shown as
        unknown (None). A count above zero is a finding however early the run stopped."""
        if self.error is None:
            return self.figures
        return {k: None if v == 0 else v for k, v in self.figures.items()}

    @property
    def why(self) -> str:
        """What went wrong, for a run that did not pass ("" for one that did)."""
        if self.error is None:
            return "expected " + ", ".join(self.failures) if self.failures else ""
        if self.broken:
            return f"expected {', '.join(self.broken)}; then the run broke off: {self.error}"
        return f"could not run: {self.error}"


def cycles_for(scenario: Scenario, mode: Mode) -> int:
    if mode == "quick":
        return scenario.quick_cycles
    if mode == "soak":
        return scenario.soak_cycles
    return _STANDARD_CYCLES


def run_scenarios(
    keys: Sequence[str],
    mode: Mode,
    report_dir: Path | None,
    progress: Callable[[RunResult], None] | None = None,
    cycles: int | None = None,
) -> list[RunResult]:
    """Run the named scenarios (all when empty); keep files under ``report_dir`` if given.

    ``cycles`` overrides the mode's number of cycles per configuration.
    """
    chosen = [s for s in SCENARIOS if not keys or s.key in keys or str(s.number) in keys]
    planned = [(s, c) for s in chosen for c in s.configs]
    root = report_dir or Path(tempfile.mkdtemp(prefix="tenure-verify-"))
    root.mkdir(parents=True, exist_ok=True)
    summary_md, summary_json = root / "summary.md", root / "summary.json"
    # A summary an earlier run left in the same directory describes runs whose
    # directories this one replaces: gone now, so that a stopped run never leaves one.
    summary_md.unlink(missing_ok=True)
    summary_json.unlink(missing_ok=True)
    results: list[RunResult] = []
    try:
        # (The loop apart from the ``try``: docs/architecture.md, "A loop in a try or
        # with block".)
        _run_each(planned, mode, cycles, root, results, progress)
        if report_dir is not None:
            summary_md.write_text(format_table(results) + "\n")
            summary_json.write_text(json.dumps(_as_json(results), indent=2) + "\n")
    finally:
        if report_dir is None:
            shutil.rmtree(root, ignore_errors=True)
        elif len(results) < len(planned):
            # Stopped (Ctrl-C, SIGTERM, an error of the verifier's own): the runs that
            # finished, and which did not. No summary.json: a tool reading it would
            # take the runs in it for the whole verification.
            left = ", ".join(f"{s.number} {c.name}" for s, c in planned[len(results) :])
            note = (
                f"INTERRUPTED: {len(results)} of {len(planned)} runs finished; not finished: {left}"
            )
            with contextlib.suppress(OSError):  # the reason we stopped matters more
                summary_md.write_text(format_table(results) + "\n\n" + note + "\n")
    return results


def _run_each(
    planned: list[tuple[Scenario, Config]],
    mode: Mode,
    cycles: int | None,
    root: Path,
    results: list[RunResult],
    progress: Callable[[RunResult], None] | None,
) -> None:
    """Run the ``planned`` configurations in turn, each result put in ``results``."""
    for scenario, config in planned:
        n = cycles or cycles_for(scenario, mode)
        result = run_config(scenario, config, n, root)
        results.append(result)
        if progress is not None:
            progress(result)


def run_config(scenario: Scenario, config: Config, cycles: int, root: Path) -> RunResult:
    directory = root / f"{scenario.number}-{scenario.key}" / _slug(config.name)
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    started = time.monotonic()
    error = None
    stats: dict[str, float] = {}
    try:
        # Inside the try: a store node that would not start is this run's error, like
        # any other node's, not the end of every run after it.
        with World(directory) as world:
            try:
                stats = config.run(world, cycles)
            except Exception as exc:  # the run is reported as failed, with what went wrong
                error = f"{type(exc).__name__}: {exc}"
            try:
                world.final()
            except Exception as exc:
                error = error or f"reading the register: {exc}"
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    history = read_history(sorted((directory / "history").glob("*.jsonl")))
    verdict = check(history)
    figures = _figures(verdict, stats, history)
    if error is None and (missing := unobserved(config.expect, figures)) is not None:
        error = f"{type(missing).__name__}: {missing}"
    # A run in which nobody ever held the lock proves nothing, whatever else it shows.
    expect = [at_least("cycles", 1), *config.expect]
    failures = tuple(e.label for e in expect if not e.holds(figures))
    broken = tuple(e.label for e in expect if e.broken(figures))
    timeline = directory / "timeline.html"
    title = f"Scenario {scenario.number}: {scenario.title} / {config.name}"
    timeline.write_text(render_html(history, verdict, title, broke_off=error))
    extra = tuple(k for k in stats if not k.startswith(("window:", "window_end:")))
    return RunResult(
        scenario,
        config,
        figures,
        verdict,
        failures,
        time.monotonic() - started,
        timeline,
        error,
        extra,
        broken,
    )


def _figures(
    verdict: Verdict, stats: dict[str, float], history: History
) -> dict[str, float | int | None]:
    figures: dict[str, float | int | None] = dict(verdict.summary())
    figures.update(
        C1=verdict.overlaps,
        C3=verdict.stale_accepted,
        C4=verdict.token_order,
        C5=verdict.lost_updates,
        takeover_s=None if verdict.takeover_ns is None else verdict.takeover_ns / 1e9,
    )
    grants = history.of_type(Grant)
    refusals = history.of_type(Refused)
    requests = history.of_type(Request)
    # A lease handed out already expired would be a lie the checker cannot see (its
    # interval is empty); count them on their own.
    figures["nonpositive_validity"] = sum(1 for g in grants if g.valid_until <= g.t)
    for key, value in stats.items():
        if key.startswith("window:"):
            name = key.removeprefix("window:").split("#")[0]
            start, end = int(value), int(stats["window_end:" + key.removeprefix("window:")])
            # Requested and granted inside the window: an answer already on its way when
            # the fault began does not count against it.
            inside = sum(1 for g in grants if g.t_request >= start and g.t <= end)
            figures[f"grants_in_{name}"] = int(figures.get(f"grants_in_{name}") or 0) + inside
            unreachable = sum(
                1 for r in refusals if start <= r.t <= end and _blames_nodes(r.reason)
            )
            key_u = f"unreachable_in_{name}"
            figures[key_u] = int(figures.get(key_u) or 0) + unreachable
            # Acquires begun inside the window, answered or not: none means the fault
            # met no request, and its grants_in_ = 0 would say nothing.
            asked = sum(1 for q in requests if start <= q.t <= end)
            key_a = f"attempts_in_{name}"
            figures[key_a] = int(figures.get(key_a) or 0) + asked
        elif not key.startswith("window_end:"):
            figures[key] = value
    return figures


# "3 of 5 nodes failed": QuorumUnreachable's message, and LockTimeout's when its last
# attempt heard too few nodes.
_FAILED = re.compile(r"(\d+) of (\d+) nodes failed")


def _blames_nodes(reason: str) -> bool:
    """Whether a refusal says that too few nodes answered for a majority: a
    ``QuorumUnreachable``, or a ``LockTimeout`` whose last attempt's failures ruled out
    a majority. Which of the two a client cut off from a majority raises depends on
    whether its acquire's timeout runs out before its failures add up to
    ``QuorumUnreachable``, a race a loaded machine tips toward the timeout; both are
    the honest answer."""
    if reason.startswith("QuorumUnreachable"):
        return True
    failed = _FAILED.search(reason)
    if not reason.startswith("LockTimeout") or failed is None:
        return False
    down, n = int(failed[1]), int(failed[2])
    return n - down <= n // 2


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


_COLUMNS = (
    ("cycles", "cycles"),
    ("faults", "faults"),
    ("C1", "C1 overlaps"),
    ("C3", "stale acc."),
    ("stale_rejected", "stale rej."),
    ("C4", "C4 order"),
    ("C5", "C5 lost"),
    ("longest_unavailable_ms", "max unavail ms"),
)


def format_table(results: Sequence[RunResult]) -> str:
    """One row per scenario x configuration (a Markdown table, aligned for a terminal),
    then a line per run that failed, saying why. A run that broke off shows ``-`` where
    it counted nothing (:attr:`RunResult.shown`)."""
    head = ["#", "configuration", "kind", *(title for _, title in _COLUMNS), "result", "details"]
    rows = []
    for r in results:
        cells = [_cell(r.shown.get(key)) for key, _ in _COLUMNS]
        kind = "mitigated" if r.config.mitigated else "control"
        rows.append([str(r.scenario.number), r.config.name, kind, *cells, r.status, _details(r)])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    lines = [_line(head, widths), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [_line(row, widths) for row in rows]
    for r in results:
        if not r.passed:
            lines.append(f"{r.status} {r.scenario.number} {r.config.name}: {r.why}")
    return "\n".join(lines)


def _details(r: RunResult) -> str:
    """The figures this configuration's expectations speak of, beyond the columns."""
    shown = {key for key, _ in _COLUMNS}
    names = []
    for e in r.config.expect:
        name = e.label.split()[0]
        if name not in shown and name not in names:
            names.append(name)
    for name in r.extra_figures:
        if name not in names:
            names.append(name)
    return ", ".join(f"{n} {_cell(r.shown.get(n))}" for n in names)


def format_proofs(results: Sequence[RunResult]) -> str:
    lines = []
    for r in results:
        seen: dict[str, str] = {}
        for f in r.verdict.faults:
            seen.setdefault(f"{f.name} {f.target}", f.proof)
        proofs = "; ".join(f"{k}: {v}" for k, v in list(seen.items())[:4])
        lines.append(f"{r.scenario.number} {r.config.name}: {proofs or 'no faults'}")
    return "\n".join(lines)


def _line(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"


def _cell(value: float | int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if value >= 10 else f"{value:.2f}"
    return str(value)


def _as_json(results: Sequence[RunResult]) -> list[dict[str, object]]:
    return [
        {
            "scenario": r.scenario.number,
            "key": r.scenario.key,
            "config": r.config.name,
            "mitigated": r.config.mitigated,
            "what happens": r.config.note,
            "passed": r.passed,
            "status": r.status,
            "failures": list(r.failures),
            "error": r.error,
            "seconds": round(r.seconds, 2),
            "figures": r.shown,
            "faults": [
                {"name": f.name, "target": f.target, "proof": f.proof} for f in r.verdict.faults
            ],
        }
        for r in results
    ]

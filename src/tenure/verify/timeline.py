"""A history drawn as one self-contained HTML page: leases, writes and faults over time.

Theory of operation
-------------------
Time runs left to right, in milliseconds from the history's first event; each process
has a row. What a reader should see at a glance is the checker's verdict, so the picture
draws exactly the checker's notions (:mod:`tenure.verify.checker`):

* a lease is a coloured bar over its *valid* interval, labelled with its fencing token;
  if its holder let go only after the deadline (paused, slow), the stretch between the
  deadline and the release is hatched: held, but no longer valid;
* a thin grey line before a bar is the wait from request to grant; a refused attempt is
  a thin dashed line ending in a tick;
* writes are marks above the bars: accepted (green tick), refused as stale (grey cross),
  accepted although stale (red tick, a C3 violation), unknown outcome (orange ring); an
  accepted op missing from the final register (C5) is circled in red;
* faults are shaded bands across all rows, named with their target; stretches where two
  leases were valid at once (C1) are red bands, and the bars involved get a red outline.

The page is one string with inline CSS and one inline SVG, no script and nothing
fetched, so it can be attached to a CI run or mailed. A history with more than
``MAX_LEASES`` leases is drawn only in a window of about that many leases, placed around
the first violation, else the first fault, else at the start; the header says so.
"""

from __future__ import annotations

import html
import os
import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from .checker import LeaseSpan, Verdict, lease_spans
from .history import History

__all__ = ["MAX_LEASES", "render_html", "render_svg", "write_html"]

MAX_LEASES = 2000
"""Beyond this many leases, only a window of the history is drawn."""

_LEFT = 140  # room for process names
_RIGHT = 30
_TOP = 58  # room for fault labels (two lanes) and notes
_ROW = 30
_AXIS = 34
_PX_PER_LEASE = 14  # so that one lease's bar and its token label stay legible
_MIN_WIDTH = 1000
_MAX_WIDTH = 28000

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _esc(text: object) -> str:
    # The SVG part must be well-formed XML: escape markup and drop control characters
    # that XML 1.0 forbids (a torn or binary error text could carry them).
    return html.escape(_CONTROL.sub("?", str(text)), quote=True)


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f}".rstrip("0").rstrip(".")


@dataclass(frozen=True, slots=True)
class _View:
    t0: int  # time origin of the labels: the history's first event
    start: int  # drawn window
    end: int
    x0: float
    width: float
    note: str | None  # why only a window is drawn, or None

    def x(self, t: int) -> float:
        span = max(self.end - self.start, 1)
        clamped = min(max(t, self.start), self.end)
        return self.x0 + (clamped - self.start) * self.width / span

    def shows(self, a: int, b: int) -> bool:
        return b >= self.start and a <= self.end


def _first_violation(history: History, verdict: Verdict) -> tuple[int, str] | None:
    found: list[tuple[int, str]] = []
    if verdict.overlap_windows:
        found.append((verdict.overlap_windows[0][0], "the first overlap (C1)"))
    found += [(w.t, "the first stale write accepted (C3)") for w in verdict.stale_accepted_writes]
    found += [(b.t, "the first token-order violation (C4)") for _, b in verdict.token_order_pairs]
    if verdict.lost_ops:
        lost = set(verdict.lost_ops)
        found += [(w.t, "the first lost update (C5)") for w in history.writes if w.op in lost]
    return min(found, default=None)


def _view(history: History, verdict: Verdict, spans: list[LeaseSpan]) -> tuple[_View, int]:
    """The window to draw and how many leases it shows."""
    ends = [history.end, *(s.end for s in spans)]
    full_end = max(ends) if spans else history.end
    note = None
    start, end, shown = history.start, full_end, len(spans)
    if len(spans) > MAX_LEASES:
        focus = _first_violation(history, verdict)
        if focus is None and history.faults:
            focus = (history.faults[0].t_start, "the first fault")
        at, why = focus if focus is not None else (history.start, "the start")
        starts = [s.start for s in spans]
        i = bisect_left(starts, at)
        lo = max(0, min(i - MAX_LEASES // 4, len(spans) - MAX_LEASES))
        hi = lo + MAX_LEASES
        window = spans[lo:hi]
        start = min(at, min(s.grant.t_request for s in window))
        end = max(at, max(s.end for s in window))
        shown = len(window)
        note = (
            f"Long history: showing {_ms(start - history.start)}–{_ms(end - history.start)} ms "
            f"of {_ms(full_end - history.start)} ms ({shown} of {len(spans)} leases), "
            f"around {why}."
        )
    width = min(max(shown * _PX_PER_LEASE, _MIN_WIDTH), _MAX_WIDTH)
    return _View(history.start, start, max(end, start + 1), _LEFT, width, note), shown


def _ticks(view: _View) -> list[int]:
    """Axis ticks at a 1-2-5 step of nanoseconds, about every 100 px."""
    target = (view.end - view.start) * 100 / view.width
    decade = 1
    while decade * 10 <= target:
        decade *= 10
    step = next(decade * m for m in (1, 2, 5, 10) if decade * m >= target)
    first = view.t0 + -(-(view.start - view.t0) // step) * step
    return list(range(first, view.end + 1, step))


def _tick_mark(x: float, y: float, cls: str, size: float = 4.0) -> str:
    return (
        f'<path class="{cls}" d="M{x - size:.1f},{y:.1f} l{size * 0.7:.1f},{size * 0.8:.1f} '
        f'l{size * 1.5:.1f},{-size * 1.8:.1f}"/>'
    )


def _cross(x: float, y: float, cls: str, size: float = 3.0) -> str:
    return (
        f'<path class="{cls}" d="M{x - size:.1f},{y - size:.1f} l{2 * size:.1f},{2 * size:.1f} '
        f'M{x - size:.1f},{y + size:.1f} l{2 * size:.1f},{-2 * size:.1f}"/>'
    )


def _in_windows(a: int, b: int, windows: tuple[tuple[int, int], ...], starts: list[int]) -> bool:
    """Whether [a, b) meets one of the sorted, disjoint ``windows``."""
    i = bisect_right(starts, b) - 1  # the last window starting before b
    return i >= 0 and windows[i][1] > a and windows[i][0] < b


def _svg(history: History, verdict: Verdict, spans: list[LeaseSpan], view: _View) -> str:
    procs = list(history.processes) or ["(none)"]
    row_of = {p: i for i, p in enumerate(procs)}
    height = _TOP + _ROW * len(procs) + _AXIS
    total_width = _LEFT + view.width + _RIGHT
    rows_top, rows_bottom = _TOP, _TOP + _ROW * len(procs)
    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_width:.0f}" height="{height}" '
        f'viewBox="0 0 {total_width:.0f} {height}" role="img">',
        "<defs>"
        '<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)"><rect width="6" height="6" fill="#ffffff" '
        'fill-opacity="0.55"/><line x1="0" y1="0" x2="0" y2="6" stroke="#444" '
        'stroke-width="2"/></pattern>'
        "</defs>",
    ]

    # Rows and their names.
    out.append('<g id="rows">')
    for i, proc in enumerate(procs):
        y = rows_top + i * _ROW
        cls = "row-odd" if i % 2 else "row-even"
        out.append(
            f'<rect class="{cls}" x="{_LEFT}" y="{y}" width="{view.width:.1f}" height="{_ROW}"/>'
        )
        out.append(
            f'<text class="proc" x="{_LEFT - 8}" y="{y + _ROW / 2 + 4:.1f}" '
            f'text-anchor="end">{_esc(proc)}</text>'
        )
    out.append("</g>")

    # Axis: grid lines and labels in ms from the first event.
    out.append('<g id="axis">')
    for t in _ticks(view):
        x = view.x(t)
        out.append(
            f'<line class="grid" x1="{x:.1f}" y1="{rows_top}" x2="{x:.1f}" y2="{rows_bottom}"/>'
        )
        out.append(
            f'<text class="tick" x="{x:.1f}" y="{rows_bottom + 16}" '
            f'text-anchor="middle">{_ms(t - view.t0)}</text>'
        )
    out.append(
        f'<text class="tick" x="{_LEFT + view.width:.1f}" y="{rows_bottom + 30}" '
        'text-anchor="end">time (ms since the first event)</text>'
    )
    out.append("</g>")

    # Faults: bands across every row, named at the top.
    out.append('<g id="faults">')
    lanes = [float("-inf"), float("-inf")]  # where each label lane is free again
    for f in history.faults:
        end = view.end if f.t_end is None else f.t_end
        if not view.shows(f.t_start, end):
            continue
        x1, x2 = view.x(f.t_start), view.x(end)
        label = f"{f.name} {f.target}".strip()
        lane = next((i for i, free in enumerate(lanes) if free <= x1), 0)
        lanes[lane] = x1 + 7 * len(label) + 8
        tip = f"{label}: {_ms(f.t_start - view.t0)}–" + (
            "end" if f.t_end is None else f"{_ms(f.t_end - view.t0)} ms"
        )
        out.append(
            f'<g class="fault"><title>{_esc(tip)}; proof: {_esc(f.proof)}</title>'
            f'<rect class="fault-band" x="{x1:.1f}" y="{rows_top - 28}" '
            f'width="{max(x2 - x1, 1.5):.1f}" height="{rows_bottom - rows_top + 28}"/>'
            f'<text class="fault-label" x="{x1 + 2:.1f}" y="{rows_top - 4 - 13 * lane}">'
            f"{_esc(label)}</text>"
            "</g>"
        )
    out.append("</g>")

    # C1: stretches with two valid leases, across every row.
    windows = verdict.overlap_windows
    window_starts = [a for a, _ in windows]
    shown_windows = [(a, b) for a, b in windows if view.shows(a, b)]
    if shown_windows:
        out.append('<g id="violations">')
        for a, b in shown_windows:
            x1, x2 = view.x(a), view.x(b)
            out.append(
                f'<rect class="c1-overlap" x="{x1:.1f}" y="{rows_top}" '
                f'width="{max(x2 - x1, 2.0):.1f}" height="{rows_bottom - rows_top}">'
                f"<title>C1: two leases valid from {_ms(a - view.t0)} to "
                f"{_ms(b - view.t0)} ms</title></rect>"
            )
        out.append("</g>")

    # Leases: wait line, valid bar, hatched held-but-invalid continuation.
    bad_tokens = {b.lease for _, b in verdict.token_order_pairs}
    out.append('<g id="leases">')
    for n, s in enumerate(spans):
        g = s.grant
        held = s.held_until
        last = max(s.end, held if held is not None else s.end)
        if not view.shows(g.t_request, last):
            continue
        y = rows_top + row_of[g.proc] * _ROW
        bar_y, bar_h = y + 11, _ROW - 15
        # Golden-angle hues tell neighbours apart; reds are left out, they mean "violation".
        hue = 40 + (n * 137.508) % 280
        colour = f"hsl({hue:.0f},62%,58%)"
        tip = (
            f"{g.proc} lease {g.lease} token {g.token}: requested "
            f"{_ms(g.t_request - view.t0)}, granted {_ms(g.t - view.t0)}, valid until "
            f"{_ms(s.deadline - view.t0)}"
            + ("" if s.stop is None else f", released {_ms(s.stop - view.t0)}")
            + ("" if s.crashed is None else f", killed {_ms(s.crashed - view.t0)}")
            + " ms"
        )
        parts = [f"<title>{_esc(tip)}</title>"]
        if g.t > g.t_request:
            xa, xb = view.x(g.t_request), view.x(g.t)
            mid = bar_y + bar_h / 2
            parts.append(
                f'<line class="wait" x1="{xa:.1f}" y1="{mid:.1f}" x2="{xb:.1f}" y2="{mid:.1f}"/>'
            )
        if s.valid:
            x1, x2 = view.x(s.start), view.x(s.end)
            overlapping = bool(windows) and _in_windows(s.start, s.end, windows, window_starts)
            cls = "bar overlapping" if overlapping else "bar"
            if g.lease in bad_tokens:
                cls += " bad-token"
            parts.append(
                f'<rect class="{cls}" x="{x1:.1f}" y="{bar_y}" width="{max(x2 - x1, 1.0):.1f}" '
                f'height="{bar_h}" fill="{colour}"/>'
            )
            label = "–" if g.token is None else f"#{g.token}"
            if x2 - x1 >= 7 * len(label) + 4:
                parts.append(
                    f'<text class="token" x="{x1 + 3:.1f}" y="{bar_y + bar_h - 3}">'
                    f"{_esc(label)}</text>"
                )
        if held is not None and held > s.deadline:
            x1, x2 = view.x(s.deadline), view.x(held)
            parts.append(
                f'<rect class="held" x="{x1:.1f}" y="{bar_y}" width="{max(x2 - x1, 1.0):.1f}" '
                f'height="{bar_h}" fill="{colour}" fill-opacity="0.45"/>'
                f'<rect x="{x1:.1f}" y="{bar_y}" width="{max(x2 - x1, 1.0):.1f}" '
                f'height="{bar_h}" fill="url(#hatch)"/>'
            )
        out.append(f'<g class="lease">{"".join(parts)}</g>')
    out.append("</g>")

    # Refused attempts.
    out.append('<g id="refusals">')
    for r in history.refusals:
        if not view.shows(r.t_request, r.t) or r.proc not in row_of:
            continue
        y = rows_top + row_of[r.proc] * _ROW + _ROW - 6
        xa, xb = view.x(r.t_request), view.x(r.t)
        out.append(
            f'<g class="refused"><title>{_esc(r.proc)} refused at {_ms(r.t - view.t0)} ms: '
            f"{_esc(r.reason)}</title>"
            f'<line x1="{xa:.1f}" y1="{y}" x2="{xb:.1f}" y2="{y}"/>'
            f'<line x1="{xb:.1f}" y1="{y - 4}" x2="{xb:.1f}" y2="{y + 2}"/></g>'
        )
    out.append("</g>")

    # Writes above the bars.
    stale_ok = {(w.proc, w.op, w.t) for w in verdict.stale_accepted_writes}
    lost = set(verdict.lost_ops)
    out.append('<g id="writes">')
    for w in history.writes:
        if not view.shows(w.t, w.t) or w.proc not in row_of:
            continue
        x, y = view.x(w.t), rows_top + row_of[w.proc] * _ROW + 6
        tip = (
            f"{w.proc} write {w.op} token {w.token} seq {w.seq}: {w.outcome} at "
            f"{_ms(w.t - view.t0)} ms"
        )
        if w.outcome == "ok" and (w.proc, w.op, w.t) in stale_ok:
            mark, tip = _tick_mark(x, y, "w-stale-accepted", 5.0), tip + " (stale, accepted: C3)"
        elif w.outcome == "ok":
            mark = _tick_mark(x, y, "w-ok")
        elif w.outcome == "stale":
            mark = _cross(x, y, "w-stale")
        else:
            mark = f'<circle class="w-error" cx="{x:.1f}" cy="{y}" r="2.5"/>'
        if w.outcome == "ok" and w.op in lost:
            mark += f'<circle class="w-lost" cx="{x:.1f}" cy="{y}" r="5.5"/>'
            tip += " (missing from the final register: C5)"
        out.append(f"<g><title>{_esc(tip)}</title>{mark}</g>")
    out.append("</g>")

    # Crashes and notes.
    out.append('<g id="crashes">')
    for c in history.crashes:
        if not view.shows(c.t, c.t) or c.proc not in row_of:
            continue
        x, y = view.x(c.t), rows_top + row_of[c.proc] * _ROW
        out.append(
            f'<g class="crash"><title>{_esc(c.proc)} SIGKILLed at {_ms(c.t - view.t0)} ms</title>'
            f'<line x1="{x:.1f}" y1="{y + 2}" x2="{x:.1f}" y2="{y + _ROW - 2}"/>'
            f"{_cross(x, y + _ROW / 2, 'crash-x', 5.0)}</g>"
        )
    for note in history.notes:
        if not view.shows(note.t, note.t):
            continue
        x = view.x(note.t)
        text = note.text[:40]
        # Near the right edge the label goes to the left of its line, not off the page.
        right = x + 7 * len(text) > view.x0 + view.width
        anchor, tx = ("end", x - 2) if right else ("start", x + 2)
        out.append(
            f'<g class="note"><title>{_esc(note.text)}</title>'
            f'<line x1="{x:.1f}" y1="{rows_top - 52}" x2="{x:.1f}" y2="{rows_bottom}"/>'
            f'<text x="{tx:.1f}" y="{rows_top - 44}" text-anchor="{anchor}">{_esc(text)}</text>'
            "</g>"
        )
    out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


_CSS = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; }
h1 { font-size: 18px; margin: 0 0 8px; }
.badge { display: inline-block; padding: 2px 8px; border-radius: 4px; color: #fff;
  font-weight: 600; margin-left: 8px; }
.badge.safe { background: #2e7d32; } .badge.unsafe { background: #c62828; }
.badge.error { background: #6d6d6d; }
table.counts { border-collapse: collapse; margin: 8px 0; }
table.counts td, table.counts th { border: 1px solid #ddd; padding: 2px 8px; text-align: right; }
table.counts th { background: #f4f4f4; font-weight: 600; }
td.bad { background: #ffebee; color: #b71c1c; font-weight: 600; }
.window-note { background: #fff8e1; border: 1px solid #ffe082; padding: 4px 8px; }
.legend span.item { margin-right: 14px; white-space: nowrap; }
.sw { display: inline-block; width: 18px; height: 10px; vertical-align: middle;
  margin-right: 4px; border: 1px solid #999; }
.sw-valid { background: hsl(200,62%,58%); }
.sw-held { background: repeating-linear-gradient(45deg, hsl(200,62%,78%) 0 3px, #444 3px 5px); }
.sw-fault { background: rgba(123,31,162,0.15); }
.sw-c1 { background: rgba(229,57,53,0.35); border-color: #e53935; }
.mk { display: inline-block; width: 12px; text-align: center; font-weight: 700; }
.plot { overflow-x: auto; border: 1px solid #ddd; margin: 8px 0; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
svg .row-even { fill: #fafafa; } svg .row-odd { fill: #f0f0f0; }
svg .grid { stroke: #ddd; stroke-width: 1; }
svg .proc { font-weight: 600; }
svg .fault-band { fill: #7b1fa2; fill-opacity: 0.12; stroke: #7b1fa2; stroke-opacity: 0.4; }
svg .fault-label { fill: #4a148c; font-weight: 600; }
svg .c1-overlap { fill: #e53935; fill-opacity: 0.28; }
svg .bar { stroke: #333; stroke-width: 0.5; }
svg .bar.overlapping { stroke: #d50000; stroke-width: 2.5; }
svg .bar.bad-token { stroke: #d50000; stroke-dasharray: 3 2; stroke-width: 2; }
svg .held { stroke: #555; stroke-width: 0.5; stroke-dasharray: 2 2; }
svg .token { font-size: 10px; fill: #111; }
svg .wait { stroke: #9e9e9e; stroke-width: 1; }
svg .refused line { stroke: #757575; stroke-width: 1; stroke-dasharray: 2 2; }
svg .w-ok { stroke: #2e7d32; stroke-width: 1.6; fill: none; }
svg .w-stale { stroke: #757575; stroke-width: 1.4; fill: none; }
svg .w-stale-accepted { stroke: #d50000; stroke-width: 2.4; fill: none; }
svg .w-error { fill: none; stroke: #ef6c00; stroke-width: 1.4; }
svg .w-lost { fill: none; stroke: #d50000; stroke-width: 1.4; }
svg .crash line { stroke: #000; stroke-width: 1.5; }
svg .crash-x { stroke: #000; stroke-width: 2; fill: none; }
svg .note line { stroke: #1565c0; stroke-dasharray: 1 3; }
svg .note text { fill: #1565c0; }
"""

_VIOLATIONS = (
    "overlaps",
    "stale_accepted",
    "token_order",
    "lost_updates",
    "early_takeover",
    "unrecovered_crashes",
    "problems",
    "skipped_lines",
)


def _counts_table(verdict: Verdict) -> str:
    summary = verdict.summary()
    keys = [k for k in summary if not k.endswith("_ns")]
    head = "".join(f"<th>{_esc(k)}</th>" for k in keys)
    cells = []
    for k in keys:
        v = summary[k]
        text = "–" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))
        bad = k in _VIOLATIONS and isinstance(v, int) and v > 0
        cells.append(f'<td class="bad">{text}</td>' if bad else f"<td>{text}</td>")
    return f'<table class="counts"><tr>{head}</tr><tr>{"".join(cells)}</tr></table>'


def _fault_table(history: History) -> str:
    if not history.faults:
        return "<p>No faults injected.</p>"
    rows = []
    for f in history.faults:
        end = "end" if f.t_end is None else _ms(f.t_end - history.start)
        rows.append(
            f"<tr><td>{_esc(f.name)}</td><td>{_esc(f.target)}</td>"
            f"<td>{_ms(f.t_start - history.start)}</td><td>{end}</td>"
            f'<td style="text-align:left">{_esc(f.proof)}</td></tr>'
        )
    return (
        '<table class="counts"><tr><th>fault</th><th>target</th><th>from (ms)</th>'
        f"<th>to (ms)</th><th>proof</th></tr>{''.join(rows)}</table>"
    )


def _list(title: str, items: Iterable[str], limit: int = 20) -> str:
    shown = list(items)
    if not shown:
        return ""
    more = f"<li>… and {len(shown) - limit} more</li>" if len(shown) > limit else ""
    body = "".join(f"<li>{_esc(i)}</li>" for i in shown[:limit])
    return f"<h2>{_esc(title)}</h2><ul>{body}{more}</ul>"


_LEGEND = (
    '<div class="legend">'
    '<span class="item"><span class="sw sw-valid"></span>valid lease (#token)</span>'
    '<span class="item"><span class="sw sw-held"></span>held past its deadline</span>'
    '<span class="item"><span class="sw sw-fault"></span>fault</span>'
    '<span class="item"><span class="sw sw-c1"></span>two leases valid (C1)</span>'
    '<span class="item"><span class="mk" style="color:#2e7d32">✓</span>write accepted</span>'
    '<span class="item"><span class="mk" style="color:#757575">✕</span>write refused '
    "(stale token)</span>"
    '<span class="item"><span class="mk" style="color:#d50000">✓</span>stale write '
    "accepted (C3)</span>"
    '<span class="item"><span class="mk" style="color:#ef6c00">○</span>write outcome '
    "unknown</span>"
    '<span class="item"><span class="mk" style="color:#d50000">◯</span>update lost (C5)</span>'
    '<span class="item"><span class="mk">┊</span>refused attempt; grey line: waiting</span>'
    '<span class="item"><span class="mk">✕</span>SIGKILL</span>'
    "</div>"
)


def render_html(
    history: History, verdict: Verdict, title: str, *, broke_off: str | None = None
) -> str:
    """The history as a self-contained HTML page (inline CSS and SVG, no script).

    Args:
        history: what happened.
        verdict: what :func:`tenure.verify.checker.check` made of it.
        title: the page's heading, e.g. the scenario's name.
        broke_off: why the run could not be carried out, if it could not: the page
            then claims no safety for it (what it saw is only part of the run).

    Returns:
        The whole page.
    """
    spans = sorted(lease_spans(history), key=lambda s: s.start)
    view, _ = _view(history, verdict, spans)
    # "safe" only for a whole run that granted something: a run that broke off, or in
    # which nobody got the lock, showed nothing the lock could have broken.
    if not verdict.safe:
        badge = '<span class="badge unsafe">UNSAFE</span>'
    elif broke_off is not None:
        badge = '<span class="badge error">broke off</span>'
    elif verdict.cycles == 0:
        badge = '<span class="badge error">no lease granted</span>'
    else:
        badge = '<span class="badge safe">safe</span>'
    note = f'<p class="window-note">{_esc(view.note)}</p>' if view.note else ""
    if broke_off is not None:
        note = (
            f'<p class="window-note">The run broke off: {_esc(broke_off)}. What is shown '
            "happened before; a count of 0 here is no evidence of safety.</p>" + note
        )
    examples = [
        f"C1: {a.proc} lease {a.lease} (#{a.token}) and {b.proc} lease {b.lease} (#{b.token})"
        for a, b in verdict.overlap_pairs
    ]
    examples += [
        f"C3: {w.proc} wrote {w.op} with token {w.token} at seq {w.seq}"
        for w in verdict.stale_accepted_writes
    ]
    examples += [
        f"C4: {b.proc} got token {b.token} after {a.proc} had {a.token}"
        for a, b in verdict.token_order_pairs
    ]
    examples += [f"C5: op {op} lost" for op in verdict.lost_ops]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{_esc(title)}</title>",
            f"<style>{_CSS}</style></head><body>",
            f"<h1>{_esc(title)}{badge}</h1>",
            _counts_table(verdict),
            note,
            _LEGEND,
            '<div class="plot">',
            _svg(history, verdict, spans, view),
            "</div>",
            "<h2>Faults</h2>",
            _fault_table(history),
            _list("Violations", examples),
            _list("Problems in the history", verdict.problems),
            _list(
                "Skipped lines (torn writes)",
                (f"{s.path}:{s.line}: {s.text}" for s in history.skipped),
            ),
            "</body></html>",
        ]
    )


def write_html(
    path: str | os.PathLike[str], history: History, verdict: Verdict, title: str
) -> None:
    """Write :func:`render_html` of the arguments to ``path`` (UTF-8)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(history, verdict, title))


def render_svg(history: History, verdict: Verdict, title: str) -> str:
    """The timeline alone, as a standalone SVG image with its styles inside.

    For documents that embed pictures but not HTML (a README): the same drawing as in
    :func:`render_html`, with the title as the image's accessible name.
    """
    spans = sorted(lease_spans(history), key=lambda s: s.start)
    view, _ = _view(history, verdict, spans)
    svg = _svg(history, verdict, spans, view)
    head_end = svg.index(">") + 1
    # A white background: the image may be shown on a dark page.
    return (
        svg[:head_end]
        + f"<title>{_esc(title)}</title><style>{_CSS}</style>"
        + '<rect width="100%" height="100%" fill="#ffffff"/>'
        + svg[head_end:]
    )

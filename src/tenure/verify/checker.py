"""Read a merged history and judge it: safety violations, fencing, lost updates, liveness.

Theory of operation
-------------------
A lease is *valid* from the moment its holder got it until its validity deadline, or
until the holder began to release it if that came first::

    valid(lease) = [grant.t, min(release.t_start, deadline))

``deadline`` is the grant's ``valid_until``, moved later by every successful extension
begun before the deadline it extends. The deadline, not the TTL on the nodes nor the
moment the holder finally let go, bounds the interval because it is the lock's whole
promise: until then, nobody else holds the lock. A holder that keeps going past its
deadline (paused, slow) is no longer a valid holder, and whatever it then writes is the
store's business, judged by C3. A crashed holder's lease stays valid until its deadline,
since the other processes cannot tell a crash from a pause. An empty interval (a lease
released the instant it was granted) holds nothing and overlaps nothing.

The checks
----------
cycles
    The number of leases granted (distinct ``lease`` ids).
C1 ``overlaps`` (mutual exclusion)
    Pairs of distinct leases whose valid intervals overlap: ``a.end > b.start`` and
    ``b.end > a.start``. Touching intervals (one ends exactly when the next begins) do
    not overlap. Counted in O(n log n) as all pairs minus the pairs where one interval
    ends before the other begins. ``overlap_windows`` are the stretches of time during
    which two or more leases were valid.
C3 ``stale_accepted`` (fencing)
    Among the writes the store accepted (``"ok"``) that carry a token and a store order
    number ``seq``, taken in ``seq`` order: those whose token is lower than the highest
    token accepted before them. An equal token is the same lease writing again.
    ``stale_rejected`` counts the writes the store refused (``"stale"``): fencing at work.
C4 ``token_order`` (monotonic tokens)
    Pairs of leases with tokens where ``a`` was granted before ``b`` was even requested
    (``a.t < b.t_request``), so ``b``'s token must be greater, and is not. Counted with a
    Fenwick tree over token ranks, O(n log n).
C5 ``lost_updates``
    Ops the store accepted (``"ok"``) that are missing from the register's final content
    (the last ``Final`` event); ``None`` when there is no ``Final``.

Liveness
--------
A process has a *pending request* from its ``Request`` until its next ``Grant`` or
``Refused`` (or its ``Crash``, or the end of the history). ``longest_unavailable_ns``
is the longest stretch during which some request was pending and no lease was valid:
the lock was free in the sense that nobody could rely on it, yet nobody got it;
:func:`unavailable_stretches` lists every such stretch, for an account by phase.

For each ``Crash`` of a process that held a lease (granted and not released before the
crash, valid or not), ``takeover_ns`` is the time from the crash to the next grant to any
other process; the maximum over such crashes is reported, ``None`` without one. A crash
after which no other process is ever granted the lock is an ``unrecovered_crash``. A
grant to another process after the crash but before the crashed lease's deadline is an
``early_takeover``; it is also a C1 overlap, named here because it is the typical way a
lock forgets its holder (a node restarted without its data, a failover).

Assumptions: all times come from one monotonic clock (one machine); a ``lease`` id is
unique per acquisition (a repeated id is reported under ``problems`` and its later
grants ignored); a process has at most one request pending at a time.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from dataclasses import dataclass

from .history import Crash, Fault, Grant, History, Refused, Request, Write

__all__ = [
    "MAX_LISTED",
    "LeaseSpan",
    "Verdict",
    "check",
    "lease_spans",
    "max_holders",
    "unavailable_stretches",
]

MAX_LISTED = 1000
"""At most this many offending items are listed per check; the counts stay exact."""


@dataclass(frozen=True, slots=True)
class LeaseSpan:
    """One lease's life as the checker sees it.

    Attributes:
        grant: the grant that made the lease.
        deadline: ``grant.valid_until``, or later after successful extensions.
        stop: when the holder began to release it (the earliest release), or None.
        crashed: when the holder was SIGKILLed while holding it, or None.
    """

    grant: Grant
    deadline: int
    stop: int | None
    crashed: int | None

    @property
    def start(self) -> int:
        """When the lease became valid: the grant's reply."""
        return self.grant.t

    @property
    def end(self) -> int:
        """When the lease stopped being valid: the deadline, or the release if earlier."""
        return self.deadline if self.stop is None else min(self.stop, self.deadline)

    @property
    def held_until(self) -> int | None:
        """Until when the holder still had it (released or crashed); None if unknown."""
        return self.stop if self.stop is not None else self.crashed

    @property
    def valid(self) -> bool:
        """Whether the valid interval is not empty."""
        return self.end > self.start


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`check` found. Counts are exact; the lists hold at most ``MAX_LISTED``.

    Attributes:
        cycles: leases granted.
        overlaps: C1, pairs of leases valid at the same time.
        stale_accepted: C3, writes the store accepted with a token below one it had
            already accepted.
        stale_rejected: writes the store refused as stale.
        token_order: C4, pairs (a, b) with ``a`` granted before ``b`` was requested and
            ``token(b) <= token(a)``.
        lost_updates: C5, accepted ops missing from the final register; None without a
            ``Final`` event.
        writes_ok: writes the store accepted.
        longest_unavailable_ns: longest stretch with a request pending and no valid lease.
        takeover_ns: longest time from a holder's crash to the next grant to another
            process; None if no holder crashed (or none was taken over).
        early_takeover: grants to another process after a holder's crash but before the
            crashed lease's deadline.
        unrecovered_crashes: holder crashes never followed by a grant to another process.
        overlap_pairs: C1 pairs (earlier start first).
        overlap_windows: stretches ``(start, end)`` with two or more valid leases.
        stale_accepted_writes: C3 offenders.
        token_order_pairs: C4 offenders ``(a, b)``; ``a`` is the highest-token lease
            granted before ``b`` was requested (one pair per offending ``b``).
        lost_ops: C5 offenders, in the order they were accepted.
        early_takeover_grants: the early takeovers.
        unavailable_window: the stretch behind ``longest_unavailable_ns``, or None.
        takeovers: per holder crash, the next grant to another process (or None).
        faults: the nemesis's actions, for the report's proof column.
        problems: things in the history that break its own rules (duplicate lease ids,
            releases of unknown leases, ...), which make the verdict less trustworthy.
        skipped_lines: torn or unreadable lines the reader skipped.
    """

    cycles: int
    overlaps: int
    stale_accepted: int
    stale_rejected: int
    token_order: int
    lost_updates: int | None
    writes_ok: int
    longest_unavailable_ns: int
    takeover_ns: int | None
    early_takeover: int
    unrecovered_crashes: int
    overlap_pairs: tuple[tuple[Grant, Grant], ...]
    overlap_windows: tuple[tuple[int, int], ...]
    stale_accepted_writes: tuple[Write, ...]
    token_order_pairs: tuple[tuple[Grant, Grant], ...]
    lost_ops: tuple[str, ...]
    early_takeover_grants: tuple[Grant, ...]
    unavailable_window: tuple[int, int] | None
    takeovers: tuple[tuple[Crash, Grant | None], ...]
    faults: tuple[Fault, ...]
    problems: tuple[str, ...]
    skipped_lines: int

    @property
    def safe(self) -> bool:
        """No C1, C3, C4 or C5 violation."""
        return (
            self.overlaps == 0
            and self.stale_accepted == 0
            and self.token_order == 0
            and not self.lost_updates
        )

    def summary(self) -> dict[str, int | float | None]:
        """The counts and durations, flat, for tables and JSON."""
        return {
            "cycles": self.cycles,
            "overlaps": self.overlaps,
            "stale_accepted": self.stale_accepted,
            "stale_rejected": self.stale_rejected,
            "token_order": self.token_order,
            "lost_updates": self.lost_updates,
            "writes_ok": self.writes_ok,
            "longest_unavailable_ns": self.longest_unavailable_ns,
            "longest_unavailable_ms": self.longest_unavailable_ns / 1e6,
            "takeover_ns": self.takeover_ns,
            "takeover_ms": None if self.takeover_ns is None else self.takeover_ns / 1e6,
            "early_takeover": self.early_takeover,
            "unrecovered_crashes": self.unrecovered_crashes,
            "faults": len(self.faults),
            "problems": len(self.problems),
            "skipped_lines": self.skipped_lines,
        }


# --- lease spans ---------------------------------------------------------------------------


def lease_spans(history: History) -> list[LeaseSpan]:
    """Every lease's span, in grant order (``problems`` of the history are ignored)."""
    return _spans(history, [])


def _spans(history: History, problems: list[str]) -> list[LeaseSpan]:
    grants: dict[str, Grant] = {}
    for g in history.grants:
        if g.lease in grants:
            problems.append(f"lease id {g.lease!r} granted twice (to {g.proc} at {g.t})")
        else:
            grants[g.lease] = g
    stops: dict[str, int] = {}
    for r in history.releases:
        if r.lease not in grants:
            problems.append(f"{r.proc} released unknown lease {r.lease!r} at {r.t}")
        elif r.lease not in stops or r.t_start < stops[r.lease]:
            stops[r.lease] = r.t_start
    deadlines = {lease: g.valid_until for lease, g in grants.items()}
    # Extensions in the order they were begun: one begun after the deadline cannot have
    # kept the lease alive (the scripts refuse to resurrect an expired key).
    for x in sorted(history.extends, key=lambda x: x.t_start):
        if x.lease not in grants:
            problems.append(f"{x.proc} extended unknown lease {x.lease!r} at {x.t}")
        elif x.outcome == "ok" and x.valid_until is not None and x.t_start <= deadlines[x.lease]:
            deadlines[x.lease] = max(deadlines[x.lease], x.valid_until)
    crashes: dict[str, list[int]] = {}
    for c in history.crashes:
        crashes.setdefault(c.proc, []).append(c.t)
    spans = []
    for lease, g in grants.items():
        stop = stops.get(lease)
        crashed = next(
            (t for t in crashes.get(g.proc, ()) if t >= g.t and (stop is None or t < stop)),
            None,
        )
        spans.append(LeaseSpan(g, deadlines[lease], stop, crashed))
    return spans


# --- C1 ------------------------------------------------------------------------------------


def _overlaps(
    spans: list[LeaseSpan],
) -> tuple[int, list[tuple[Grant, Grant]], list[tuple[int, int]]]:
    valid = sorted((s for s in spans if s.valid), key=lambda s: (s.start, s.end))
    n = len(valid)
    # Every pair either overlaps or has one interval ending at or before the other's
    # start (never both, as no interval is empty): count the second kind by bisection.
    ends = sorted(s.end for s in valid)
    apart = sum(bisect_right(ends, s.start) for s in valid)
    count = n * (n - 1) // 2 - apart

    pairs: list[tuple[Grant, Grant]] = []
    if count:
        active: list[tuple[int, int]] = []  # (end, index into valid): a min-heap by end
        for i, b in enumerate(valid):
            while active and active[0][0] <= b.start:
                heapq.heappop(active)
            for _, j in active:
                if len(pairs) >= MAX_LISTED:
                    break
                pairs.append((valid[j].grant, b.grant))
            heapq.heappush(active, (b.end, i))

    windows: list[tuple[int, int]] = []
    if count:
        # At one instant, ends before starts: touching intervals do not overlap.
        points = sorted([(s.start, 1) for s in valid] + [(s.end, -1) for s in valid])
        depth, opened = 0, 0
        for t, step in points:
            depth += step
            if step == 1 and depth == 2:
                opened = t
            elif step == -1 and depth == 1 and t > opened:
                if windows and windows[-1][1] == opened:
                    windows[-1] = (windows[-1][0], t)
                else:
                    windows.append((opened, t))
    return count, pairs, windows


# --- C3 ------------------------------------------------------------------------------------


def _stale_accepted(writes: Iterable[Write]) -> tuple[int, list[Write]]:
    accepted = sorted(
        (w for w in writes if w.outcome == "ok" and w.token is not None and w.seq is not None),
        key=lambda w: w.seq or 0,
    )
    highest: int | None = None
    count = 0
    listed: list[Write] = []
    for w in accepted:
        assert w.token is not None
        if highest is not None and w.token < highest:
            count += 1
            if len(listed) < MAX_LISTED:
                listed.append(w)
        else:
            highest = w.token
    return count, listed


# --- C4 ------------------------------------------------------------------------------------


class _Fenwick:
    """Counts of inserted ranks, with prefix sums, both O(log n)."""

    __slots__ = ("_tree",)

    def __init__(self, size: int) -> None:
        self._tree = [0] * (size + 1)

    def add(self, rank: int) -> None:
        i = rank + 1
        while i < len(self._tree):
            self._tree[i] += 1
            i += i & -i

    def below(self, rank: int) -> int:
        """How many inserted ranks are < ``rank``."""
        i, total = rank, 0
        while i > 0:
            total += self._tree[i]
            i -= i & -i
        return total


def _token_order(spans: list[LeaseSpan]) -> tuple[int, list[tuple[Grant, Grant]]]:
    fenced = [s.grant for s in spans if s.grant.token is not None]
    tokens = sorted({g.token for g in fenced if g.token is not None})
    ranks = {tok: r for r, tok in enumerate(tokens)}
    by_grant = sorted(fenced, key=lambda g: g.t)
    by_request = sorted(fenced, key=lambda g: g.t_request)
    tree = _Fenwick(len(ranks))
    inserted = 0
    best: Grant | None = None  # highest token among the inserted
    count = 0
    pairs: list[tuple[Grant, Grant]] = []
    i = 0
    for b in by_request:
        while i < len(by_grant) and by_grant[i].t < b.t_request:
            a = by_grant[i]
            assert a.token is not None
            tree.add(ranks[a.token])
            inserted += 1
            if best is None or a.token > (best.token or 0):
                best = a
            i += 1
        assert b.token is not None
        # Leases granted before b was requested whose token is not below b's.
        bad = inserted - tree.below(ranks[b.token])
        if b.t < b.t_request:  # a malformed grant: b itself is among them
            bad -= 1
        if bad > 0:
            count += bad
            if best is not None and best is not b and len(pairs) < MAX_LISTED:
                pairs.append((best, b))
    return count, pairs


# --- C5 ------------------------------------------------------------------------------------


def _lost(history: History) -> tuple[int | None, list[str]]:
    if history.final is None:
        return None, []
    present = set(history.final.ops)
    lost = [w.op for w in history.writes if w.outcome == "ok" and w.op not in present]
    return len(lost), lost[:MAX_LISTED]


# --- liveness ------------------------------------------------------------------------------


def _pending(history: History, problems: list[str]) -> list[tuple[int, int]]:
    """The intervals during which each process waited for an acquire."""
    open_since: dict[str, int] = {}
    intervals: list[tuple[int, int]] = []
    for e in history.events:
        if isinstance(e, Request):
            if e.proc in open_since:
                problems.append(f"{e.proc} requested at {e.t} with a request already pending")
            else:
                open_since[e.proc] = e.t
        elif isinstance(e, Grant | Refused | Crash):
            since = open_since.pop(e.proc, None)
            if since is not None:
                intervals.append((since, e.t))
    intervals.extend((since, history.end) for since in open_since.values())
    return intervals


def _unavailable_stretches(
    pending: list[tuple[int, int]], spans: list[LeaseSpan]
) -> list[tuple[int, int]]:
    """The maximal stretches ``(start, end)`` with a request pending and no valid lease."""
    # Per instant: (+/-1 pending, +/-1 valid). Between two change points the state is
    # constant; stretches where some request waits and no lease is valid are joined.
    changes: dict[int, list[int]] = {}
    for start, end in pending:
        if end > start:
            changes.setdefault(start, [0, 0])[0] += 1
            changes.setdefault(end, [0, 0])[0] -= 1
    for s in spans:
        if s.valid:
            changes.setdefault(s.start, [0, 0])[1] += 1
            changes.setdefault(s.end, [0, 0])[1] -= 1
    waiting = holding = 0
    run_start: int | None = None
    stretches: list[tuple[int, int]] = []
    for t in sorted(changes):
        dw, dh = changes[t]
        waiting += dw
        holding += dh
        if waiting > 0 and holding == 0:
            if run_start is None:
                run_start = t
        elif run_start is not None:
            stretches.append((run_start, t))
            run_start = None
    # Every pending interval and every valid span ends at a change point, so the last
    # change point leaves nobody waiting: no stretch is left open here.
    return stretches


def _unavailable(
    pending: list[tuple[int, int]], spans: list[LeaseSpan]
) -> tuple[int, tuple[int, int] | None]:
    # max() keeps the first of equally long stretches: the earliest one is reported.
    best = max(_unavailable_stretches(pending, spans), key=lambda s: s[1] - s[0], default=None)
    return (0 if best is None else best[1] - best[0]), best


def unavailable_stretches(history: History) -> list[tuple[int, int]]:
    """Every stretch ``(start, end)`` during which a request was pending and no lease was
    valid, in time order: the liveness check's raw material, for a per-phase account
    (``Verdict.longest_unavailable_ns`` is the longest of them)."""
    return _unavailable_stretches(_pending(history, []), _spans(history, []))


def max_holders(history: History) -> int:
    """The largest number of leases valid at one instant (0 without a valid lease).

    Valid intervals as for C1: touching intervals (one ends exactly when the next
    begins) are not held together, so this is 1 exactly when C1 finds no overlap and
    some lease was valid.
    """
    valid = [s for s in _spans(history, []) if s.valid]
    # At one instant, ends (-1) sort before starts (+1).
    points = sorted([(s.start, 1) for s in valid] + [(s.end, -1) for s in valid])
    depth = highest = 0
    for _, step in points:
        depth += step
        highest = max(highest, depth)
    return highest


def _takeovers(
    history: History, spans: list[LeaseSpan]
) -> tuple[list[tuple[Crash, Grant | None]], list[Grant]]:
    by_proc: dict[str, list[LeaseSpan]] = {}
    for s in spans:
        by_proc.setdefault(s.grant.proc, []).append(s)
    grants = sorted((s.grant for s in spans), key=lambda g: g.t)
    grant_times = [g.t for g in grants]
    takeovers: list[tuple[Crash, Grant | None]] = []
    early: dict[str, Grant] = {}
    for c in history.crashes:
        held = [s for s in by_proc.get(c.proc, ()) if s.crashed == c.t]
        if not held:
            continue
        first = bisect_left(grant_times, c.t)
        nxt = next((g for g in grants[first:] if g.proc != c.proc), None)
        takeovers.append((c, nxt))
        deadline = max(s.deadline for s in held)
        for g in grants[first : bisect_left(grant_times, deadline)]:
            if g.proc != c.proc:
                early.setdefault(g.lease, g)
    return takeovers, list(early.values())


# --- the verdict ---------------------------------------------------------------------------


def check(history: History) -> Verdict:
    """Judge ``history``: see the module docstring for every check's definition."""
    problems: list[str] = []
    spans = _spans(history, problems)
    overlaps, overlap_pairs, windows = _overlaps(spans)
    stale_accepted, stale_writes = _stale_accepted(history.writes)
    token_order, token_pairs = _token_order(spans)
    lost_updates, lost_ops = _lost(history)
    longest, window = _unavailable(_pending(history, problems), spans)
    takeovers, early = _takeovers(history, spans)
    times = [g.t - c.t for c, g in takeovers if g is not None]
    return Verdict(
        cycles=len(spans),
        overlaps=overlaps,
        stale_accepted=stale_accepted,
        stale_rejected=sum(1 for w in history.writes if w.outcome == "stale"),
        token_order=token_order,
        lost_updates=lost_updates,
        writes_ok=sum(1 for w in history.writes if w.outcome == "ok"),
        longest_unavailable_ns=longest,
        takeover_ns=max(times) if times else None,
        early_takeover=len(early),
        unrecovered_crashes=sum(1 for _, g in takeovers if g is None),
        overlap_pairs=tuple(overlap_pairs),
        overlap_windows=tuple(windows),
        stale_accepted_writes=tuple(stale_writes),
        token_order_pairs=tuple(token_pairs),
        lost_ops=tuple(lost_ops),
        early_takeover_grants=tuple(early[:MAX_LISTED]),
        unavailable_window=window,
        takeovers=tuple(takeovers[:MAX_LISTED]),
        faults=history.faults,
        problems=tuple(problems[:MAX_LISTED]),
        skipped_lines=len(history.skipped),
    )

"""The verifier's history format and checker: correct histories pass, planted faults are found.

Valid histories come from a sequential schedule (``Cycle``s): each lease is granted no
earlier than the previous one stopped being valid, tokens increase with grants, writes
carry increasing store order numbers, and the final register holds every accepted op.
Each plant breaks exactly one rule, and the matching count must see it (exactly, where
the planted number is known). The sweep-based counts are also compared with brute force
on arbitrary interval sets.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure.verify.checker import (
    MAX_LISTED,
    Verdict,
    check,
    lease_spans,
    max_holders,
    unavailable_stretches,
)
from tenure.verify.history import (
    Crash,
    Event,
    Extend,
    Fault,
    Final,
    Grant,
    History,
    HistoryError,
    HistoryWriter,
    Note,
    Refused,
    Release,
    Request,
    Write,
    dumps,
    loads,
    read_history,
    write_history,
)

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=100)
FEW = settings(SETTINGS, max_examples=25)

PROCS = ("p0", "p1", "p2", "p3")


# --- a schedule of lease cycles, rendered to events ----------------------------------------


@dataclass
class WriteSpec:
    op: str
    t_start: int
    t: int
    outcome: str
    seq: int | None


@dataclass
class Cycle:
    proc: str
    lease: str
    token: int | None
    t_request: int
    t: int
    valid_until: int
    stop: int | None  # release begun (None: never released)
    release_t: int | None
    writes: list[WriteSpec] = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.valid_until if self.stop is None else min(self.stop, self.valid_until)


def render(cycles: list[Cycle], final: bool = True, drop: str | None = None) -> list[Event]:
    """The events of ``cycles``; a Final with every accepted op (except ``drop``)."""
    events: list[Event] = []
    ok_ops: list[tuple[int, str]] = []
    for c in cycles:
        events.append(Request(c.proc, c.t_request))
        events.append(Grant(c.proc, c.lease, c.token, c.t_request, c.t, c.valid_until))
        for w in c.writes:
            events.append(Write(c.proc, c.lease, c.token, w.op, w.t_start, w.t, w.outcome, w.seq))
            if w.outcome == "ok":
                ok_ops.append((w.seq or 0, w.op))
        if c.stop is not None:
            assert c.release_t is not None
            outcome = "ok" if c.stop <= c.valid_until else "lost"
            events.append(Release(c.proc, c.lease, c.stop, c.release_t, outcome))
    if final:
        end = max((e.time for e in events), default=0) + 1
        events.append(Final(end, tuple(op for _, op in sorted(ok_ops) if op != drop)))
    return events


@st.composite
def schedules(draw: st.DrawFn, min_cycles: int = 1, max_cycles: int = 25) -> list[Cycle]:
    """A correct sequential schedule; every cycle makes at least one accepted write."""
    n = draw(st.integers(min_cycles, max_cycles), label="cycles")
    cycles: list[Cycle] = []
    cursor = 1_000  # the previous lease's valid end: the next grant may start there
    busy_until = dict.fromkeys(PROCS, 0)  # a process does one thing at a time
    token = draw(st.integers(1, 50))
    seq = 0
    for i in range(n):
        proc = draw(st.sampled_from(PROCS))
        # A waiter may request while the previous lease is still valid.
        t_request = max(busy_until[proc] + 1, cursor - draw(st.integers(0, 5_000)))
        t = max(cursor, t_request + 1) + draw(st.integers(0, 1_000))
        ttl = draw(st.integers(1_000, 50_000))
        valid_until = t + ttl
        how = draw(st.sampled_from(["early", "late", "never"]))
        stop: int | None
        if how == "early":
            stop = t + draw(st.integers(1, ttl))
        elif how == "late":  # held past the deadline: no longer valid, fencing's business
            stop = valid_until + draw(st.integers(1, 5_000))
        else:
            stop = None
        c = Cycle(proc, f"L{i}", token, t_request, t, valid_until, stop, None)
        # Accepted writes inside the valid interval, in store order.
        end = c.end
        points = sorted(draw(st.lists(st.integers(t, end), min_size=2, max_size=6)))
        for k in range(0, len(points) - 1, 2):
            seq += 1
            c.writes.append(WriteSpec(f"op{i}.{k}", points[k], points[k + 1], "ok", seq))
        if draw(st.booleans()):  # an unknown outcome: not an accepted op
            c.writes.append(WriteSpec(f"op{i}.err", end, end, "error", None))
        if how == "late" and draw(st.booleans()):  # a late write, refused by the store
            assert stop is not None
            c.writes.append(WriteSpec(f"op{i}.late", stop - 1, stop, "stale", None))
        last = max([t, *(w.t for w in c.writes)])
        if stop is not None:
            c.release_t = max(stop, last) + draw(st.integers(0, 500))
            last = c.release_t
        # A holder that never releases just lets the lease expire; it may ask again.
        busy_until[proc] = last
        cycles.append(c)
        cursor = end + draw(st.sampled_from([0, 0, 1, 100]))  # 0: touching intervals
        token += draw(st.integers(1, 3))
    return cycles


def verdict_of(events: list[Event]) -> Verdict:
    return check(History(events))


def assert_clean(v: Verdict) -> None:
    assert v.overlaps == 0, v.overlap_pairs
    assert v.stale_accepted == 0, v.stale_accepted_writes
    assert v.token_order == 0, v.token_order_pairs
    assert v.lost_updates == 0, v.lost_ops
    assert v.early_takeover == 0
    assert v.safe


# --- valid histories -----------------------------------------------------------------------


@SETTINGS
@given(schedules())
def test_valid_history_has_no_violation(cycles: list[Cycle]) -> None:
    v = verdict_of(render(cycles))
    assert_clean(v)
    assert v.cycles == len(cycles)
    assert v.problems == ()
    assert v.writes_ok == sum(w.outcome == "ok" for c in cycles for w in c.writes)
    assert v.stale_rejected == sum(w.outcome == "stale" for c in cycles for w in c.writes)
    assert v.overlap_windows == ()


@FEW
@given(schedules())
def test_valid_history_survives_the_jsonl_round_trip(
    tmp_path_factory: pytest.TempPathFactory, cycles: list[Cycle]
) -> None:
    events = render(cycles)
    directory = tmp_path_factory.mktemp("hist")
    # Split over several files (one per process, like the workers), then merge.
    paths = []
    for proc in (*PROCS, None):
        path = directory / f"{proc}.jsonl"
        write_history(path, [e for e in events if getattr(e, "proc", None) == proc])
        paths.append(path)
    history = read_history(paths)
    assert sorted(map(dumps, history.events)) == sorted(map(dumps, events))
    assert check(history) == check(History(events))


# --- planted violations --------------------------------------------------------------------


@SETTINGS
@given(schedules(min_cycles=2), st.data())
def test_planted_overlap_is_found(cycles: list[Cycle], data: st.DataObject) -> None:
    i = data.draw(st.integers(1, len(cycles) - 1), label="shifted")
    prev, c = cycles[i - 1], cycles[i]
    # Start lease i one nanosecond before lease i-1 stops being valid.
    shift = c.t - (prev.end - 1)
    c.t -= shift
    c.t_request = min(c.t_request, c.t - 1)
    c.valid_until -= shift
    for w in c.writes:
        w.t_start, w.t = w.t_start - shift, w.t - shift
    if c.stop is not None:
        c.stop -= shift
        assert c.release_t is not None
        c.release_t -= shift
    v = verdict_of(render(cycles))
    assert v.overlaps == 1
    assert [(a.lease, b.lease) for a, b in v.overlap_pairs] == [(prev.lease, c.lease)]
    assert v.overlap_windows == ((c.t, prev.end),)
    assert v.stale_accepted == v.token_order == v.lost_updates == 0
    assert not v.safe


@SETTINGS
@given(schedules(min_cycles=2), st.data())
def test_planted_stale_accepted_write_is_found(cycles: list[Cycle], data: st.DataObject) -> None:
    accepted = sorted(
        (w for c in cycles for w in c.writes if w.outcome == "ok"), key=lambda w: w.seq or 0
    )
    token_of = {w.op: c.token for c in cycles for w in c.writes}
    # Two neighbours in store order with different tokens: swap their places.
    changes = [
        k
        for k in range(len(accepted) - 1)
        if token_of[accepted[k].op] != token_of[accepted[k + 1].op]
    ]
    k = data.draw(st.sampled_from(changes), label="swapped")
    a, b = accepted[k], accepted[k + 1]
    a.seq, b.seq = b.seq, a.seq
    v = verdict_of(render(cycles))
    assert v.stale_accepted == 1
    assert [w.op for w in v.stale_accepted_writes] == [a.op]
    assert v.overlaps == v.token_order == v.lost_updates == 0


@SETTINGS
@given(schedules(min_cycles=2), st.data())
def test_planted_lower_token_is_found(cycles: list[Cycle], data: st.DataObject) -> None:
    i = data.draw(st.integers(1, len(cycles) - 1), label="lowered")
    c = cycles[i]
    # Requested after lease i-1 was granted (so it must get a greater token), yet it
    # gets one below every other.
    c.t_request = max(c.t_request, cycles[i - 1].t + 1)
    assert c.t_request <= c.t
    c.token = 0
    expected = sum(1 for a in cycles if a is not c and a.t < c.t_request)
    v = verdict_of(render(cycles))
    assert v.token_order == expected >= 1
    assert [b.lease for _, b in v.token_order_pairs] == [c.lease]
    assert v.overlaps == v.lost_updates == 0


@SETTINGS
@given(schedules(), st.data())
def test_planted_lost_update_is_found(cycles: list[Cycle], data: st.DataObject) -> None:
    ops = [w.op for c in cycles for w in c.writes if w.outcome == "ok"]
    dropped = data.draw(st.sampled_from(ops), label="dropped")
    v = verdict_of(render(cycles, drop=dropped))
    assert v.lost_updates == 1
    assert v.lost_ops == (dropped,)
    assert v.overlaps == v.stale_accepted == v.token_order == 0


@FEW
@given(schedules())
def test_no_final_means_lost_updates_unknown(cycles: list[Cycle]) -> None:
    v = verdict_of(render(cycles, final=False))
    assert v.lost_updates is None
    assert v.summary()["lost_updates"] is None


# --- the sweeps against brute force --------------------------------------------------------


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.integers(0, 60),  # t_request
            st.integers(0, 20),  # wait
            st.integers(0, 30),  # validity
            st.one_of(st.none(), st.integers(0, 40)),  # release after grant
            st.one_of(st.none(), st.integers(0, 8)),  # token
        ),
        max_size=30,
    )
)
def test_overlap_and_token_counts_match_brute_force(
    raw: list[tuple[int, int, int, int | None, int | None]],
) -> None:
    events: list[Event] = []
    for i, (req, wait, validity, release, token) in enumerate(raw):
        proc, lease = f"p{i}", f"L{i}"
        g = Grant(proc, lease, token, req, req + wait, req + wait + validity)
        events.append(g)
        if release is not None:
            events.append(Release(proc, lease, g.t + release, g.t + release, "ok"))
    spans = {s.grant.lease: s for s in lease_spans(History(events))}
    ivs = [(s.start, s.end) for s in spans.values() if s.end > s.start]
    overlaps = sum(
        1 for i, (a0, a1) in enumerate(ivs) for b0, b1 in ivs[i + 1 :] if a1 > b0 and b1 > a0
    )
    grants = [s.grant for s in spans.values() if s.grant.token is not None]
    bad = sum(
        1
        for a in grants
        for b in grants
        if a is not b and a.t < b.t_request and (b.token or 0) <= (a.token or 0)
    )
    v = verdict_of(events)
    assert v.overlaps == overlaps
    assert v.token_order == bad
    assert len(v.overlap_pairs) == min(overlaps, MAX_LISTED)
    # The windows are exactly the instants covered by two or more valid intervals.
    for t in range(140):
        depth = sum(1 for a, b in ivs if a <= t < b)
        assert (depth >= 2) == any(a <= t < b for a, b in v.overlap_windows), t
    # Integer end points: the deepest integer instant is the deepest instant.
    deepest = max((sum(1 for a, b in ivs if a <= t < b) for t in range(140)), default=0)
    assert max_holders(History(events)) == deepest
    assert (max_holders(History(events)) <= 1) == (v.overlaps == 0)


@SETTINGS
@given(st.lists(st.tuples(st.integers(1, 6), st.booleans()), max_size=40))
def test_stale_accepted_matches_brute_force(raw: list[tuple[int, bool]]) -> None:
    writes: list[Event] = [
        Write("p", f"L{tok}", tok, f"op{i}", i, i, "ok", i if has_seq else None)
        for i, (tok, has_seq) in enumerate(raw)
    ]
    in_order = [tok for tok, has_seq in raw if has_seq]
    expected = sum(1 for k, tok in enumerate(in_order) if any(t > tok for t in in_order[:k]))
    assert verdict_of(writes).stale_accepted == expected


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.integers(0, 60),  # t_request
            st.integers(0, 20),  # wait
            st.booleans(),  # granted (else refused after the wait)
            st.integers(0, 30),  # validity
            st.one_of(st.none(), st.integers(0, 40)),  # release after grant
        ),
        max_size=20,
    )
)
def test_unavailable_stretches_match_brute_force(
    raw: list[tuple[int, int, bool, int, int | None]],
) -> None:
    events: list[Event] = []
    waits: list[tuple[int, int]] = []
    for i, (req, wait, granted, validity, release) in enumerate(raw):
        proc, lease = f"p{i}", f"L{i}"
        events.append(Request(proc, req))
        waits.append((req, req + wait))
        if not granted:
            events.append(Refused(proc, req, req + wait, "timeout"))
            continue
        g = Grant(proc, lease, None, req, req + wait, req + wait + validity)
        events.append(g)
        if release is not None:
            events.append(Release(proc, lease, g.t + release, g.t + release, "ok"))
    history = History(events)
    valid = [(s.start, s.end) for s in lease_spans(history)]
    stretches = unavailable_stretches(history)
    for t in range(140):
        waiting = any(a <= t < b for a, b in waits)
        holding = any(a <= t < b for a, b in valid)
        assert (waiting and not holding) == any(a <= t < b for a, b in stretches), t
    # In time order, each maximal: none touches the next.
    assert all(a < b for a, b in stretches)
    assert all(e < s for (_, e), (s, _) in itertools.pairwise(stretches))
    # The verdict's longest stretch is the earliest of the longest of them.
    v = check(history)
    longest = max(stretches, key=lambda s: s[1] - s[0], default=None)
    assert v.unavailable_window == longest
    assert v.longest_unavailable_ns == (0 if longest is None else longest[1] - longest[0])


# --- tables --------------------------------------------------------------------------------


def grant(proc: str, lease: str, t: int, until: int, token: int | None = None) -> Grant:
    return Grant(proc, lease, token, t, t, until)


@pytest.mark.parametrize(
    ("b_start", "expected"), [(10, 0), (11, 0), (9, 1), (0, 1), (19, 0), (20, 1), (29, 1), (30, 0)]
)
def test_overlap_table(b_start: int, expected: int) -> None:
    # a is valid on [0, 10) (deadline 10), c on [20, 30): b = [b_start, b_start + 1).
    v = verdict_of(
        [
            grant("a", "A", 0, 10),
            grant("b", "B", b_start, b_start + 1),
            grant("c", "C", 20, 30),
        ]
    )
    assert v.overlaps == expected


def test_touching_intervals_do_not_overlap() -> None:
    v = verdict_of([grant("a", "A", 0, 10), grant("b", "B", 10, 20), grant("c", "C", 20, 30)])
    assert v.overlaps == 0
    assert v.overlap_windows == ()


def test_release_before_deadline_shortens_the_interval() -> None:
    a, b = grant("a", "A", 0, 100), grant("b", "B", 60, 200)
    assert verdict_of([a, b]).overlaps == 1
    assert verdict_of([a, b, Release("a", "A", 50, 55, "ok")]).overlaps == 0
    # The release *began* at 70: the holder still relied on the lease until then.
    assert verdict_of([a, b, Release("a", "A", 70, 75, "ok")]).overlaps == 1


def test_release_after_deadline_does_not_lengthen_the_interval() -> None:
    a, b = grant("a", "A", 0, 50), grant("b", "B", 60, 200)
    v = verdict_of([a, b, Release("a", "A", 80, 85, "lost")])
    assert v.overlaps == 0
    (span,) = lease_spans(History([a, Release("a", "A", 80, 85, "lost")]))
    assert (span.start, span.end, span.held_until) == (0, 50, 80)


def test_the_earliest_release_counts() -> None:
    events: list[Event] = [
        grant("a", "A", 0, 100),
        Release("a", "A", 70, 75, "error"),
        Release("a", "A", 30, 35, "error"),
        grant("b", "B", 40, 200),
    ]
    assert verdict_of(events).overlaps == 0


def test_an_empty_interval_overlaps_nothing() -> None:
    events: list[Event] = [
        grant("a", "A", 0, 100),
        grant("b", "B", 50, 150),
        Release("b", "B", 50, 50, "ok"),
    ]
    assert verdict_of(events).overlaps == 0


def test_extension_moves_the_deadline() -> None:
    a, b = grant("a", "A", 0, 100, 1), grant("b", "B", 150, 300, 2)
    assert verdict_of([a, b]).overlaps == 0
    extended = Extend("a", "A", 90, 95, 200, "ok")
    assert verdict_of([a, b, extended]).overlaps == 1
    # Begun after the deadline: it cannot have kept the lease alive.
    too_late = Extend("a", "A", 101, 105, 200, "ok")
    assert verdict_of([a, b, too_late]).overlaps == 0
    failed = Extend("a", "A", 90, 95, None, "lost")
    assert verdict_of([a, b, failed]).overlaps == 0


def test_same_lease_writing_twice_with_an_equal_token_is_fine() -> None:
    events: list[Event] = [
        Write("a", "A", 5, "op1", 0, 1, "ok", 1),
        Write("a", "A", 5, "op2", 2, 3, "ok", 2),
        Write("b", "B", 6, "op3", 4, 5, "ok", 3),
        Write("b", "B", 6, "op4", 6, 7, "ok", 4),
    ]
    v = verdict_of(events)
    assert v.stale_accepted == 0
    assert v.writes_ok == 4


def test_stale_write_accepted_after_a_newer_token() -> None:
    events: list[Event] = [
        Write("b", "B", 6, "op3", 4, 5, "ok", 1),
        Write("a", "A", 5, "op1", 0, 9, "ok", 2),  # late: store order decides, not time
        Write("a", "A", 5, "op2", 10, 11, "stale", None),
        Write("a", "A", 5, "op5", 12, 13, "ok", None),  # no seq: cannot be placed
        Write("c", "C", None, "op6", 14, 15, "ok", 3),  # no token: not fenced
    ]
    v = verdict_of(events)
    assert v.stale_accepted == 1
    assert [w.op for w in v.stale_accepted_writes] == ["op1"]
    assert v.stale_rejected == 1


def test_token_order_table() -> None:
    a = Grant("a", "A", 5, 0, 10, 20)
    b_concurrent = Grant("b", "B", 5, 5, 20, 30)  # requested before a was granted: any token
    c_after = Grant("c", "C", 5, 11, 30, 40)  # requested after a was granted: needs > 5
    d_after = Grant("d", "D", 9, 11, 40, 50)
    e_untokened = Grant("e", "E", None, 50, 50, 60)
    v = verdict_of([a, b_concurrent, c_after, d_after, e_untokened])
    assert v.token_order == 1
    assert [(x.lease, y.lease) for x, y in v.token_order_pairs] == [("A", "C")]


def test_lost_updates_use_the_last_final() -> None:
    events: list[Event] = [
        Write("a", "A", 1, "op1", 0, 1, "ok", 1),
        Write("a", "A", 1, "op2", 2, 3, "ok", 2),
        Write("a", "A", 1, "op3", 4, 5, "error", None),
        Final(10, ("op1",)),
        Final(20, ("op1", "op2")),
    ]
    v = verdict_of(events)
    assert v.lost_updates == 0


# --- liveness ------------------------------------------------------------------------------


def test_unavailability_is_waiting_without_a_valid_lease() -> None:
    events: list[Event] = [
        Request("a", 0),
        Grant("a", "A", 1, 0, 100, 1_000),
        Release("a", "A", 500, 510, "ok"),
        Request("b", 200),  # waits while A is valid: not unavailable
        Grant("b", "B", 2, 200, 800, 2_000),  # 500..800 free while b waits
        Release("b", "B", 900, 910, "ok"),
        Request("c", 1_000),
        Refused("c", 1_000, 1_300, "timeout"),  # 1000..1300
        Request("c", 1_400),
        Refused("c", 1_400, 1_450, "timeout"),
    ]
    v = verdict_of(events)
    assert v.longest_unavailable_ns == 300
    assert v.unavailable_window in {(500, 800), (1_000, 1_300)}
    assert unavailable_stretches(History(events)) == [
        (0, 100),  # a waits for its first grant
        (500, 800),
        (1_000, 1_300),
        (1_400, 1_450),
    ]


def test_unavailability_joins_overlapping_waits() -> None:
    events: list[Event] = [
        Request("a", 0),
        Request("b", 50),
        Refused("a", 0, 100, "timeout"),
        Refused("b", 50, 180, "timeout"),
    ]
    v = verdict_of(events)
    assert v.longest_unavailable_ns == 180
    assert v.unavailable_window == (0, 180)


def test_a_crash_ends_the_wait_and_an_open_request_lasts_to_the_end() -> None:
    events: list[Event] = [Request("a", 0), Crash("a", 40), Request("b", 100), Note(400, "end")]
    v = verdict_of(events)
    assert v.longest_unavailable_ns == 300
    assert v.takeover_ns is None  # a held nothing when it was killed


def test_takeover_after_a_holder_crash() -> None:
    events: list[Event] = [
        Request("a", 0),
        Grant("a", "A", 1, 0, 10, 1_000),
        Request("b", 20),
        Crash("a", 300),
        Grant("b", "B", 2, 20, 1_050, 2_000),
    ]
    v = verdict_of(events)
    assert v.takeover_ns == 750
    assert v.early_takeover == 0
    assert v.overlaps == 0
    assert v.longest_unavailable_ns == 50  # 1000..1050: A expired, b still waiting
    assert v.unrecovered_crashes == 0


def test_early_takeover_is_named_and_is_an_overlap() -> None:
    events: list[Event] = [
        Grant("a", "A", 1, 0, 10, 1_000),
        Crash("a", 300),
        Grant("b", "B", 2, 20, 400, 2_000),
    ]
    v = verdict_of(events)
    assert v.takeover_ns == 100
    assert v.early_takeover == 1
    assert [g.lease for g in v.early_takeover_grants] == ["B"]
    assert v.overlaps == 1


def test_crash_never_taken_over() -> None:
    v = verdict_of([Grant("a", "A", 1, 0, 10, 1_000), Crash("a", 300)])
    assert v.takeover_ns is None
    assert v.unrecovered_crashes == 1
    # A crash after release is not a holder's crash.
    events: list[Event] = [
        Grant("a", "A", 1, 0, 10, 1_000),
        Release("a", "A", 100, 110, "ok"),
        Crash("a", 300),
    ]
    assert verdict_of(events).unrecovered_crashes == 0


def test_problems_are_reported() -> None:
    events: list[Event] = [
        Grant("a", "A", 1, 0, 10, 100),
        Grant("b", "A", 2, 0, 200, 300),
        Release("c", "Z", 5, 6, "ok"),
        Request("d", 1),
        Request("d", 2),
    ]
    v = verdict_of(events)
    assert v.cycles == 1
    assert len(v.problems) == 3
    assert v.summary()["problems"] == 3


def test_summary_and_faults() -> None:
    fault = Fault("pause", "n3", 5, 50, "state T in /proc/1234/stat")
    v = verdict_of([grant("a", "A", 0, 10), fault])
    s = v.summary()
    assert s["cycles"] == 1
    assert s["faults"] == 1
    assert v.faults == (fault,)
    assert all(isinstance(x, int | float) or x is None for x in s.values())
    assert {"overlaps", "stale_accepted", "token_order", "lost_updates"} <= set(s)
    assert {"longest_unavailable_ns", "takeover_ns", "early_takeover"} <= set(s)


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([], 0),
        ([(0, 10)], 1),
        ([(0, 10), (10, 20)], 1),  # touching intervals are not held together
        ([(0, 10), (5, 20), (6, 7)], 3),
        ([(0, 10), (11, 20), (12, 13), (30, 40)], 2),
        ([(0, 10), (5, 5)], 1),  # an empty interval holds nothing
    ],
)
def test_max_holders_table(intervals: list[tuple[int, int]], expected: int) -> None:
    events: list[Event] = [grant(f"p{i}", f"L{i}", a, b) for i, (a, b) in enumerate(intervals)]
    assert max_holders(History(events)) == expected


def test_empty_history() -> None:
    v = check(History([]))
    assert v.cycles == 0
    assert v.longest_unavailable_ns == 0
    assert v.lost_updates is None


def test_scales_to_100k_grants() -> None:
    events: list[Event] = []
    for i in range(100_000):
        t = i * 100
        events.append(Request(f"p{i % 8}", t - 50))
        events.append(Grant(f"p{i % 8}", f"L{i}", i + 1, t - 50, t, t + 100))
        events.append(Write(f"p{i % 8}", f"L{i}", i + 1, f"op{i}", t, t + 10, "ok", i))
    events.append(Final(10**8, tuple(f"op{i}" for i in range(100_000))))
    # The process's own CPU time, not the wall clock: a loaded machine (CPU hogs beside
    # the tests) stretched the wall clock past the bound. Quadratic work would not fit.
    began = time.process_time()
    v = verdict_of(events)
    assert time.process_time() - began < 15
    assert_clean(v)
    assert v.cycles == 100_000


# --- the history format --------------------------------------------------------------------

ONE_OF_EACH: list[Event] = [
    Request("p1", 1),
    Grant("p1", "L1", 7, 1, 2, 30),
    Grant("p2", "L2", None, 1, 2, 30),
    Refused("p2", 3, 4, "QuorumUnreachable: 1 of 3 nodes"),
    Release("p1", "L1", 5, 6, "lost"),
    Extend("p1", "L1", 3, 4, 40, "ok"),
    Extend("p1", "L1", 3, 4, None, "error"),
    Write("p1", "L1", 7, "op-ü", 3, 4, "stale", None),
    Write("p1", "L1", None, "op2", 3, 4, "ok", 12),
    Final(9, ("op2", "op3")),
    Final(9, ()),
    Fault("pause", "n3", 1, None, "state T in /proc/1234/stat"),
    Fault("kill", "n1", 1, 8, 'said "bye"\n'),
    Crash("p2", 5),
    Note(5, "<b>&</b>"),
]


@pytest.mark.parametrize("event", ONE_OF_EACH, ids=lambda e: e.kind)
def test_every_event_round_trips_through_one_json_line(event: Event) -> None:
    line = dumps(event)
    assert "\n" not in line
    record = json.loads(line)
    assert record["kind"] == event.kind
    assert set(record) == {"kind"} | {f.name for f in dataclasses.fields(event)}
    assert loads(line) == event


@pytest.mark.parametrize(
    "line",
    [
        '{"kind":"nope","t":1}',
        '{"t":1}',
        "[1, 2]",
        '{"kind":"crash","proc":"a"}',
        '{"kind":"crash","proc":"a","t":1,"extra":2}',
        '{"kind":"crash","proc":"a","t":"1"}',
        '{"kind":"crash","proc":"a","t":true}',
        '{"kind":"final","t":1,"ops":"abc"}',
        '{"kind":"release","proc":"a","lease":"L","t_start":1,"t":2,"outcome":"fine"}',
    ],
)
def test_json_that_is_not_an_event_is_refused(line: str) -> None:
    with pytest.raises(HistoryError):
        loads(line, "f:1")


def test_bad_outcomes_fail_where_the_event_is_made() -> None:
    with pytest.raises(HistoryError):
        Write("a", "L", 1, "op", 0, 1, "accepted", 1)
    with pytest.raises(HistoryError):
        Extend("a", "L", 0, 1, None, "ok")


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    with HistoryWriter(path) as w:
        w.write(Request("a", 1))
        w.write(Grant("a", "L", 1, 1, 2, 10))
    with open(path, "a", encoding="utf-8") as f:
        f.write(dumps(Write("a", "L", 1, "op", 3, 4, "ok", 1))[:25])  # killed mid-line
    history = read_history(path)
    assert [e.kind for e in history] == ["request", "grant"]
    assert len(history.skipped) == 1
    assert history.skipped[0].line == 3
    assert check(history).skipped_lines == 1


def test_a_writer_reopening_a_torn_file_starts_a_new_line(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    write_history(path, [Request("a", 1)])
    with open(path, "ab") as f:
        f.write(b'{"kind":"grant","pr\xc3')  # torn, inside a multi-byte character
    write_history(path, [Crash("a", 5), Note(6, "restarted")])
    history = read_history([path])
    assert [e.kind for e in history] == ["request", "crash", "note"]
    assert len(history.skipped) == 1


def test_reader_merges_files_in_time_order(tmp_path: Path) -> None:
    write_history(tmp_path / "a.jsonl", [Request("a", 5), Crash("a", 20)])
    write_history(tmp_path / "b.jsonl", [Request("b", 1), Note(10, "x"), Request("c", 30)])
    (tmp_path / "c.jsonl").write_text("\n\n", encoding="utf-8")
    history = read_history(sorted(tmp_path.glob("*.jsonl")))
    assert [e.time for e in history] == [1, 5, 10, 20, 30]
    assert history.processes == ("b", "a", "c")
    assert (history.start, history.end) == (1, 30)
    assert history.skipped == ()


def test_history_start_and_end_cover_every_time_field() -> None:
    history = History(
        [Grant("a", "A", 1, 3, 10, 999), Fault("pause", "n1", 5, 50, ""), Note(20, "")]
    )
    assert (history.start, history.end) == (3, 50)
    assert history.final is None
    assert len(history) == 3


def test_writer_refuses_after_close(tmp_path: Path) -> None:
    w = HistoryWriter(tmp_path / "x.jsonl")
    w.close()
    w.close()
    with pytest.raises(ValueError, match="closed"):
        w.write(Note(1, "x"))

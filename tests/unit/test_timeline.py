"""The timeline page: well-formed SVG, self-contained, and it shows what the checker found."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tenure.verify.checker import check
from tenure.verify.history import (
    Crash,
    Event,
    Fault,
    Final,
    Grant,
    History,
    Note,
    Refused,
    Release,
    Request,
    Write,
)
from tenure.verify.timeline import MAX_LEASES, render_html, write_html

SVG = "{http://www.w3.org/2000/svg}"
MS = 1_000_000


def clean_events() -> list[Event]:
    return [
        Request("w1", 0),
        Grant("w1", "L1", 1, 0, 1 * MS, 50 * MS),
        Write("w1", "L1", 1, "op1", 2 * MS, 3 * MS, "ok", 1),
        Request("w2", 5 * MS),
        Release("w1", "L1", 20 * MS, 21 * MS, "ok"),
        Grant("w2", "L2", 2, 5 * MS, 22 * MS, 70 * MS),
        Write("w2", "L2", 2, "op2", 23 * MS, 24 * MS, "ok", 2),
        Request("w3", 25 * MS),
        Refused("w3", 25 * MS, 40 * MS, "LockTimeout <after 15 ms> & gave up"),
        Release("w2", "L2", 80 * MS, 81 * MS, "lost"),  # held past its deadline
        Write("w2", "L2", 2, "op3", 78 * MS, 79 * MS, "stale", None),
        Crash("w3", 90 * MS),
        Note(91 * MS, "orchestrator: done"),
        Final(100 * MS, ("op1", "op2")),
    ]


def violating_events() -> list[Event]:
    return [
        Grant("w1", "L1", 1, 0, 1 * MS, 50 * MS),
        Grant("w2", "L2", 2, 10 * MS, 30 * MS, 80 * MS),  # overlaps L1 on [30, 50) ms
        Write("w2", "L2", 2, "op2", 31 * MS, 32 * MS, "ok", 1),
        Write("w1", "L1", 1, "op1", 33 * MS, 34 * MS, "ok", 2),  # stale, accepted
        Fault("pause", "w1", 5 * MS, 29 * MS, "state T in /proc/1234/stat"),
        Fault("kill", "n3", 40 * MS, None, "pid 99 gone"),
        Final(100 * MS, ("op2",)),  # op1 lost
    ]


def svg_of(page: str) -> ET.Element:
    found = re.findall(r"<svg\b.*?</svg>", page, flags=re.DOTALL)
    assert len(found) == 1
    return ET.fromstring(found[0])


def by_class(root: ET.Element, cls: str) -> list[ET.Element]:
    return [e for e in root.iter() if cls in (e.get("class") or "").split()]


def render(events: list[Event], title: str = "scenario") -> tuple[str, ET.Element]:
    history = History(events)
    page = render_html(history, check(history), title)
    return page, svg_of(page)


def assert_self_contained(page: str) -> None:
    without_ns = page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "http://" not in without_ns
    assert "https://" not in without_ns
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#)""", page)
    assert "@import" not in page
    assert "url(" not in page.replace("url(#hatch)", "")


def test_clean_history() -> None:
    page, svg = render(clean_events(), "clean <run> & co")
    assert_self_contained(page)
    assert page.startswith("<!DOCTYPE html>")
    assert "clean &lt;run&gt; &amp; co" in page
    assert svg.find(f".//{SVG}g[@id='violations']") is None
    assert by_class(svg, "c1-overlap") == []
    assert by_class(svg, "overlapping") == []
    assert len(by_class(svg, "bar")) == 2
    assert len(by_class(svg, "held")) == 1  # L2, released after its deadline
    assert len(by_class(svg, "w-ok")) == 2
    assert len(by_class(svg, "w-stale")) == 1
    assert by_class(svg, "w-stale-accepted") == []
    assert len(by_class(svg, "refused")) == 1
    assert len(by_class(svg, "crash")) == 1
    assert "orchestrator: done" in page
    assert sorted(t.text or "" for t in by_class(svg, "token")) == ["#1", "#2"]
    assert "No faults injected" in page
    assert 'class="badge safe"' in page
    texts = [t.text for t in svg.iter(f"{SVG}text")]
    for proc in ("w1", "w2", "w3"):
        assert proc in texts


def test_violations_and_faults_are_shown() -> None:
    page, svg = render(violating_events())
    assert_self_contained(page)
    bands = by_class(svg, "c1-overlap")
    assert len(bands) == 1
    assert len(by_class(svg, "overlapping")) == 2
    assert len(by_class(svg, "w-stale-accepted")) == 1
    assert len(by_class(svg, "w-lost")) == 1
    faults = by_class(svg, "fault")
    assert len(faults) == 2
    labels = " ".join(t.text or "" for t in svg.iter(f"{SVG}text"))
    assert "pause w1" in labels
    assert "kill n3" in labels
    assert "state T in /proc/1234/stat" in page  # the proof, in the fault table
    assert 'class="badge unsafe"' in page


def test_a_run_that_broke_off_or_granted_nothing_is_not_badged_safe() -> None:
    """The timeline of a run that could not be carried out (no libfaketime: no node,
    no lease) was headed by the green "safe" badge, the page a user opens to see why."""
    history = History([Note(5, "orchestrator: starting")])
    page = render_html(history, check(history), "t", broke_off="ConfigurationError: x & y")
    assert 'class="badge safe"' not in page
    assert 'class="badge error">broke off' in page
    assert "ConfigurationError: x &amp; y" in page
    assert "no evidence" in page
    page = render_html(history, check(history), "t")
    assert 'class="badge safe"' not in page
    assert "no lease granted" in page
    # A violation seen before the run broke off is still a violation.
    history = History(violating_events())
    page = render_html(history, check(history), "t", broke_off="RuntimeError: later")
    assert 'class="badge unsafe"' in page


def test_write_html(tmp_path: Path) -> None:
    history = History(violating_events())
    path = tmp_path / "timeline.html"
    write_html(path, history, check(history), "t")
    assert path.read_text(encoding="utf-8") == render_html(history, check(history), "t")


@pytest.mark.parametrize(
    "events",
    [
        [],
        [Note(5, "only a note")],
        [Request("a", 0)],
        [Fault("pause", "n1", 0, None, "")],
        [Grant("a", "A", None, 0, 0, 10)],  # no token, one instant
    ],
    ids=["empty", "note", "request", "fault", "instant"],
)
def test_degenerate_histories_render(events: list[Event]) -> None:
    page, _ = render(events)
    assert_self_contained(page)


def test_hostile_text_stays_well_formed() -> None:
    events: list[Event] = [
        Grant('a"<x>', "L&1", 1, 0, 0, 10 * MS),
        Refused("b", 0, 1, "bad \x00\x07 bytes ]]> <!-- -->"),
        Fault("<pause>", "n'1", 0, 5 * MS, "proof & </svg>"),
        Note(2, "</svg><script>alert(1)</script>"),
    ]
    page, svg = render(events)
    assert "<script" not in page
    assert svg is not None


def test_long_history_draws_a_window_around_the_first_violation() -> None:
    events: list[Event] = []
    n = MAX_LEASES * 3
    for i in range(n):
        t = i * MS
        events.append(Grant(f"w{i % 4}", f"L{i}", i + 1, t, t, t + MS))
    bad = 2 * MAX_LEASES + 100
    events.append(Grant("w9", "X", n + 1, bad * MS, bad * MS + MS // 2, bad * MS + 3 * MS))
    page, svg = render(events)
    assert "Long history" in page
    assert "the first overlap (C1)" in page
    assert f"of {n + 1} leases" in page
    bars = by_class(svg, "bar")
    assert 0 < len(bars) <= MAX_LEASES + 10
    assert len(by_class(svg, "c1-overlap")) == 1


def test_long_history_without_violation_starts_at_the_first_fault() -> None:
    events: list[Event] = []
    n = MAX_LEASES + 500
    for i in range(n):
        t = i * MS
        events.append(Grant("w", f"L{i}", i + 1, t, t, t + MS))
    events.append(Fault("partition", "n2", 2_400 * MS, 2_410 * MS, "iptables"))
    page, svg = render(events)
    assert "around the first fault" in page
    assert "partition n2" in " ".join(t.text or "" for t in svg.iter(f"{SVG}text"))


def test_short_history_draws_everything() -> None:
    page, svg = render([Grant("w", f"L{i}", i, i * MS, i * MS, i * MS + MS) for i in range(50)])
    assert "Long history" not in page
    assert len(by_class(svg, "bar")) == 50

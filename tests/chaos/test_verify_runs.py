"""``tenure verify``, every scenario on real nodes: it passes only if every mitigated
configuration shows no violation *and* every control shows the violation it exists to
show, each fault with its proof."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tenure.cli import main
from tenure.verify.scenarios import SCENARIOS, Scenario


def _verify(args: list[str], report: Path, capsys: pytest.CaptureFixture[str]) -> list[Any]:
    """Run ``tenure verify`` with ``args``; its runs (summary.json), once it exited 0."""
    code = main(["verify", *args, "--report", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    runs: list[Any] = json.loads((report / "summary.json").read_text())
    return runs


def _check(runs: list[Any], scenarios: tuple[Scenario, ...], report: Path) -> None:
    expected = {(s.number, c.name) for s in scenarios for c in s.configs}
    assert {(r["scenario"], r["config"]) for r in runs} == expected
    for run in runs:
        assert run["passed"], run
        # Every run injected its fault, and each fault says how we know it happened.
        assert run["faults"], run
        assert all(f["proof"] for f in run["faults"]), run
    # The controls ran: a verifier that finds nothing where it must is broken.
    assert any(not r["mitigated"] for r in runs) == any(
        not c.mitigated for s in scenarios for c in s.configs
    )
    for scenario in scenarios:
        timelines = list(report.glob(f"{scenario.number}-{scenario.key}/*/timeline.html"))
        assert len(timelines) == len(scenario.configs)
    assert "C1 overlaps" in (report / "summary.md").read_text()


# One cycle per configuration is enough for every control to show its violation and
# every fault its proof; more cycles add confidence, not coverage (the slow run below).
@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: f"{s.number}-{s.key}")
def test_one_cycle_of_each_scenario_holds_every_expectation(
    scenario: Scenario, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = _verify([scenario.key, "--cycles", "1"], tmp_path, capsys)
    _check(runs, (scenario,), tmp_path)
    if scenario.key == "failover":
        _check_sentinel_rows(runs)


def _check_sentinel_rows(runs: list[Any]) -> None:
    """The failover rows on a real Sentinel deployment: the replica frozen and cut off,
    the master killed and the Sentinels' promotion, each proven; the control shows the
    overlap, tenure refuses B while the promoted node warms up."""
    rows = {r["config"]: r for r in runs if "Sentinel" in r["config"]}
    assert set(rows) == {"plain lock, Sentinel failover", "tenure, Sentinel failover"}
    for run in rows.values():
        names = {f["name"] for f in run["faults"]}
        assert names == {"pause", "replication cut", "kill", "promotion"}, run
        promotion = next(f for f in run["faults"] if f["name"] == "promotion")
        assert "3 Sentinels name port" in promotion["proof"]
        assert "role master" in promotion["proof"]
    assert rows["plain lock, Sentinel failover"]["figures"]["C1"] > 0
    assert rows["tenure, Sentinel failover"]["figures"]["C1"] == 0
    assert rows["tenure, Sentinel failover"]["figures"]["b_refused"] >= 1
    assert rows["tenure, Sentinel failover"]["figures"]["b_after_warmup"] == 1


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_quick_verification_holds_every_expectation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    runs = _verify(["--quick"], tmp_path, capsys)
    _check(runs, SCENARIOS, tmp_path)
    assert [r for r in runs if not r["mitigated"]]

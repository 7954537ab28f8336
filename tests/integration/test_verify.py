"""``tenure verify --quick``: every scenario, on real nodes, in CI.

The run passes only if every mitigated configuration shows no violation *and* every
control shows the violation it exists to show, each fault with its proof.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tenure.cli import main
from tenure.verify.scenarios import SCENARIOS

pytestmark = pytest.mark.timeout(900)


def test_quick_verification_holds_every_expectation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["verify", "--quick", "--report", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    runs = json.loads((tmp_path / "summary.json").read_text())
    expected = {(s.number, c.name) for s in SCENARIOS for c in s.configs}
    assert {(r["scenario"], r["config"]) for r in runs} == expected
    for run in runs:
        assert run["passed"], run
        # Every run injected its fault, and each fault says how we know it happened.
        assert run["faults"], run
        assert all(f["proof"] for f in run["faults"]), run
    # The controls ran: a verifier that finds nothing where it must is broken.
    assert [r for r in runs if not r["mitigated"]]
    for scenario in SCENARIOS:
        timelines = list(tmp_path.glob(f"{scenario.number}-{scenario.key}/*/timeline.html"))
        assert len(timelines) == len(scenario.configs)
    assert "C1 overlaps" in (tmp_path / "summary.txt").read_text()


def test_unknown_scenario_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "nonsense"]) == 2
    err = capsys.readouterr().err
    assert "unknown scenario 'nonsense'" in err
    assert "1/failover" in err


def test_quick_and_soak_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", "--quick", "--soak"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err

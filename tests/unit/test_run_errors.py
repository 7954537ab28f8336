"""``tenure run`` reports every error of its own in one line with exit 78, never a traceback
and 1 (or 2), which the command it runs could return for itself.

An unexpected failure inside tenure cannot be provoked from outside, so a stand-in client
that fails is put in place of ``Client``; no node is involved (the unit conftest forbids
the network). The failures real nodes cause are tested in tests/integration/test_cli_run.py.
"""

from __future__ import annotations

import io
from typing import Any

import pytest

from tenure import cli
from tenure.cli import run
from tenure.cli.run import EXIT_TENURE_ERROR, RunOptions


class _Failing:
    """A client whose acquire fails in a way nobody foresaw."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> _Failing:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def lock(self, *args: Any, **kwargs: Any) -> None:
        """Its arguments are fine (checked before acquiring)."""

    def acquire(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("something internal\nwith a second line")


def test_an_internal_failure_is_one_line_and_78(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "Client", _Failing)
    err = io.StringIO()
    options = RunOptions(name="x", command=("true",), nodes=("redis://127.0.0.1:1",))
    assert run.run(options, err=err) == EXIT_TENURE_ERROR
    lines = err.getvalue().splitlines()
    assert lines == ["tenure run: internal error: RuntimeError: something internal"]


def test_a_configuration_error_is_one_line_and_78() -> None:
    err = io.StringIO()
    options = RunOptions(name="x", command=(), nodes=("redis://127.0.0.1:1",))
    assert run.run(options, err=err) == EXIT_TENURE_ERROR
    assert err.getvalue().splitlines() == [
        "tenure run: error: command: no command given: tenure run NAME -- COMMAND ..."
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["run"],
        ["run", "x", "--ttl", "abc", "--", "true"],
        ["run", "x", "--", "true"],  # no nodes
        ["run", "x", "--redis", "http://h", "--", "true"],
        ["run", "x", "--redis", "redis://h", "--ttl", "0.01", "--", "true"],
    ],
)
def test_the_cli_never_exits_2_for_run(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TENURE_REDIS", raising=False)
    assert cli.main(argv) == EXIT_TENURE_ERROR
    assert "Traceback" not in capsys.readouterr().err


def test_other_commands_keep_2_for_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status"]) == 2
    assert cli.main(["run", "--help"]) == 0
    capsys.readouterr()

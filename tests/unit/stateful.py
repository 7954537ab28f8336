"""What the hypothesis state machines of this suite share."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test as _run_state_machine_untyped

# Older hypothesis releases (6.155 and before) ship this function without annotations, and
# mypy --strict refuses to call it from typed code; a typed alias keeps the tests independent of
# the installed release.
run_state_machine_as_test: Callable[..., None] = _run_state_machine_untyped


def model_settings(max_examples: int, stateful_step_count: int) -> settings:
    """A model's default run: derandomized (the same examples every run), no example
    database, no deadline (a step may wait on a slow machine)."""
    return settings(
        derandomize=True,
        database=None,
        deadline=None,
        max_examples=max_examples,
        stateful_step_count=stateful_step_count,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def find_settings(model: settings, max_examples: int) -> settings:
    """How long a planted bug may take to be found: generation only, first bug only."""
    return settings(
        model, max_examples=max_examples, phases=[Phase.generate], report_multiple_bugs=False
    )

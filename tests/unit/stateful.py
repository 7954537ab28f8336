"""What the hypothesis state machines of this suite share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test as _run_state_machine_untyped

# Older hypothesis releases (6.155 and before) ship this function without annotations, and
# mypy --strict refuses to call it from typed code; a typed alias keeps the tests independent of
# the installed release.
_run: Callable[..., None] = _run_state_machine_untyped

# Internal to hypothesis, so looked up with care: a release that moved or renamed
# them only makes the searches depend on the imports again.
try:
    from hypothesis.internal.conjecture import providers as _providers
    from hypothesis.internal.constants_ast import Constants as _Constants
except ImportError:  # pragma: no cover
    _providers = None  # type: ignore[assignment]


def run_state_machine_as_test(machine: Callable[[], Any], *, settings: settings) -> None:
    """Run ``machine``'s search, the same one whatever else this process imported.

    Hypothesis draws now and then from the constants it finds in every local module
    already imported (``src/tenure`` among them), so a derandomized search changes with
    the tests a worker happened to run first: a planted bug found in 8 examples (0.2 s)
    alone took 24 s of CPU in a full run. The models search without that pool, so the examples a
    model explores, and how long it takes, are the same alone, in a full run and on CI.
    """
    cache = getattr(_providers, "CONSTANTS_CACHE", None)
    if cache is None or not hasattr(_providers, "_get_local_constants"):
        _run(machine, settings=settings)
        return
    cache.cache.clear()  # the pools drawn from before, by other tests
    try:
        with mock.patch.object(_providers, "_get_local_constants", _Constants):
            _run(machine, settings=settings)
    finally:
        cache.cache.clear()


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

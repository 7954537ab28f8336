"""Retry back-off policies: bounds, determinism, and parameter validation."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure import ConfigurationError
from tenure._core.policy import RetryPolicy, wait_random, wait_random_exponential

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=300)

delays = st.floats(0, 60, allow_nan=False, allow_infinity=False)


@SETTINGS
@given(a=delays, b=delays, attempt=st.integers(-5, 10**6), seed=st.integers(0, 2**32))
def test_wait_random_within_bounds(a: float, b: float, attempt: int, seed: int) -> None:
    lo, hi = min(a, b), max(a, b)
    policy = wait_random(minimum=lo, maximum=hi)
    rng = random.Random(seed)
    for _ in range(5):
        assert lo <= policy.delay(attempt, rng) <= hi


def test_wait_random_with_equal_bounds_is_constant() -> None:
    policy = wait_random(minimum=0.25, maximum=0.25)
    assert policy.delay(1, random.Random(1)) == 0.25


@SETTINGS
@given(
    initial=st.floats(1e-6, 10),
    maximum=delays,
    attempt=st.integers(1, 10**6),
    seed=st.integers(0, 2**32),
)
def test_wait_random_exponential_within_cap(
    initial: float, maximum: float, attempt: int, seed: int
) -> None:
    policy = wait_random_exponential(initial=initial, maximum=maximum)
    rng = random.Random(seed)
    # initial * 2**(attempt-1), computed without overflow (inf when it would not fit).
    exponent = attempt - 1
    growth = math.inf if exponent > 1000 else initial * 2.0**exponent
    cap = min(maximum, growth)
    d = policy.delay(attempt, rng)
    assert math.isfinite(d)
    assert 0.0 <= d <= cap


@pytest.mark.parametrize("attempt", [1, 2, 10, 60, 61, 1023, 1024, 1025, 10**4, 10**6])
def test_wait_random_exponential_never_overflows(attempt: int) -> None:
    policy = wait_random_exponential(initial=1.0, maximum=30.0)
    d = policy.delay(attempt, random.Random(0))
    assert 0.0 <= d <= min(30.0, 2.0 ** min(attempt - 1, 60))


def test_wait_random_exponential_first_attempts_are_small() -> None:
    policy = wait_random_exponential(initial=0.01, maximum=100.0)
    rng = random.Random(42)
    for attempt, cap in [(1, 0.01), (2, 0.02), (3, 0.04), (4, 0.08)]:
        for _ in range(50):
            assert 0.0 <= policy.delay(attempt, rng) <= cap


@pytest.mark.parametrize(
    "policy",
    [wait_random(0.0, 1.0), wait_random_exponential(0.001, 1.0)],
    ids=["wait_random", "wait_random_exponential"],
)
def test_policies_are_deterministic_with_a_seeded_rng(policy: RetryPolicy) -> None:
    a = [policy.delay(i, random.Random(7)) for i in range(1, 20)]
    b = [policy.delay(i, random.Random(7)) for i in range(1, 20)]
    assert a == b
    rng1, rng2 = random.Random(99), random.Random(99)
    assert [policy.delay(3, rng1) for _ in range(10)] == [policy.delay(3, rng2) for _ in range(10)]
    # And actually random: a run of draws is not constant.
    rng = random.Random(5)
    assert len({policy.delay(5, rng) for _ in range(10)}) > 1


def test_defaults_are_valid() -> None:
    assert wait_random().maximum >= wait_random().minimum
    assert wait_random_exponential().initial > 0


@pytest.mark.parametrize(
    ("make", "parameter"),
    [
        (lambda: wait_random(minimum=-0.1), "minimum"),
        (lambda: wait_random(minimum=math.nan), "minimum"),
        (lambda: wait_random(minimum=math.inf, maximum=math.inf), "minimum"),
        (lambda: wait_random(maximum=-1.0), "maximum"),
        (lambda: wait_random(maximum=math.inf), "maximum"),
        (lambda: wait_random(maximum=math.nan), "maximum"),
        (lambda: wait_random(minimum=2.0, maximum=1.0), "maximum"),
        (lambda: wait_random(minimum="1", maximum=2.0), "minimum"),  # type: ignore[arg-type]
        (lambda: wait_random_exponential(initial=0.0), "initial"),
        (lambda: wait_random_exponential(initial=-1.0), "initial"),
        (lambda: wait_random_exponential(initial=math.nan), "initial"),
        (lambda: wait_random_exponential(initial=math.inf), "initial"),
        (lambda: wait_random_exponential(maximum=-0.5), "maximum"),
        (lambda: wait_random_exponential(maximum=math.inf), "maximum"),
        (lambda: wait_random_exponential(maximum=None), "maximum"),  # type: ignore[arg-type]
        # Above the longest retry delay: it would fail an acquire once the back-off grew.
        (lambda: wait_random_exponential(maximum=86_400.001), "maximum"),
        (lambda: wait_random_exponential(initial=1e9), "initial"),
        (lambda: wait_random(maximum=1e9), "maximum"),
        # Ints beyond a float's range: refused by name, not an OverflowError.
        (lambda: wait_random(maximum=2**1100), "maximum"),
        (lambda: wait_random_exponential(initial=2**1100), "initial"),
    ],
)
def test_bad_parameters_are_refused_by_name(make: object, parameter: str) -> None:
    assert callable(make)
    with pytest.raises(ConfigurationError) as info:
        make()
    assert info.value.parameter == parameter
    assert str(info.value).startswith(f"{parameter}:")
    assert isinstance(info.value, ValueError)


def test_maximum_below_initial_caps_every_delay() -> None:
    policy = wait_random_exponential(initial=1.0, maximum=0.1)
    rng = random.Random(3)
    assert all(0.0 <= policy.delay(a, rng) <= 0.1 for a in range(1, 100))
    zero = wait_random_exponential(initial=1.0, maximum=0.0)
    assert zero.delay(10, rng) == 0.0

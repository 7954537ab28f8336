"""The reconnect back-off both drivers share (``_core/backoff.py``)."""

from __future__ import annotations

import pytest

from tenure._core.backoff import BACKOFF_MAX, BACKOFF_MIN, Reconnect


def test_a_fresh_connection_may_connect_at_once() -> None:
    assert Reconnect().left(0.0) == 0.0


def test_each_failure_doubles_the_wait_up_to_the_bound() -> None:
    reconnect, now, delays = Reconnect(), 100.0, []
    for _ in range(10):
        delays.append(reconnect.failed(now))
        assert reconnect.left(now) == pytest.approx(delays[-1])
        assert reconnect.left(now + delays[-1]) == 0.0
    assert delays[:3] == [BACKOFF_MIN, 2 * BACKOFF_MIN, 4 * BACKOFF_MIN]
    assert max(delays) == delays[-1] == BACKOFF_MAX


def test_a_connection_that_came_up_resets_the_wait() -> None:
    reconnect = Reconnect()
    for _ in range(5):
        reconnect.failed(0.0)
    reconnect.succeeded()
    assert reconnect.failed(10.0) == BACKOFF_MIN


def test_only_a_connection_given_up_as_stalled_makes_the_next_one_probe() -> None:
    reconnect, probes = Reconnect(), []
    reconnect.failed(0.0)  # refused, reset...: the next connection is used as it comes up
    probes.append(reconnect.probe)
    reconnect.failed(1.0, stalled=True)
    probes.append(reconnect.probe)
    reconnect.failed(2.0)  # the probe unanswered: the next one probes again
    probes.append(reconnect.probe)
    reconnect.succeeded()  # the probe answered
    probes.append(reconnect.probe)
    assert probes == [False, True, True, False]

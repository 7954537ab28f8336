"""The blocking driver's Event and Condition: what ``threading``'s do, and a Ctrl-C at any
instant leaves them unlocked and raises as itself (``tenure._driver.events``).

The interrupts are real signals: a timer's handler raising in a loop of the operation.
The standard library's ``Event`` and ``Condition`` fail these tests (their lock left
held, or a ``RuntimeError`` raised in place of the interrupt) in tens of runs of each
hundred.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from functools import partial

import pytest

from tenure._driver.events import Condition, Event
from tenure._driver.guard import Guard

from ..locks import free_to_another_thread
from ..signals import (
    Interrupt,
    interrupt,
    main_thread_signals,
    raising_at_return,
    raising_on_alarm,
)


def _in_thread(fn: Callable[[], object]) -> threading.Thread:
    thread = threading.Thread(target=fn, daemon=True)
    thread.start()
    return thread


def test_an_event_is_a_threading_event() -> None:
    event = Event()
    assert isinstance(event, threading.Event)
    assert not event.is_set()
    assert not event.wait(0)
    assert not event.wait(0.01)
    event.set()
    assert event.is_set()
    assert event.wait(0)
    assert event.wait()
    event.clear()
    assert not event.is_set()
    assert not event._waiters  # the timed-out waits did not stay listed


def test_set_wakes_every_waiting_thread() -> None:
    event = Event()
    woken: list[bool] = []
    waiting = [_in_thread(lambda: woken.append(event.wait(10))) for _ in range(3)]
    while len(event._waiters) < 3:
        threading.Event().wait(0.001)
    assert woken == []
    event.set()
    for thread in waiting:
        thread.join(5)
    assert woken == [True, True, True]
    assert event._waiters == []


def test_a_wait_that_times_out_as_set_takes_its_waiter_out_is_not_an_error() -> None:
    # The waiter is released once, by set(), whether or not it is still waited on.
    for _ in range(200):
        event = Event()
        thread = _in_thread(partial(event.wait, 0.0005))
        event.set()
        thread.join(5)
        assert not thread.is_alive()


def test_condition_wait_for_gives_the_guard_up_while_it_waits() -> None:
    guard = Guard()
    condition = Condition(guard)
    state = {"ready": False}

    def make_ready() -> None:
        with guard:  # taken while the other thread waits: given up meanwhile
            state["ready"] = True
            condition.notify_all()

    with guard:
        assert not condition.wait_for(lambda: state["ready"], 0.01)
        thread = _in_thread(make_ready)
        assert condition.wait_for(lambda: state["ready"], 10)
        assert guard._is_owned()
    thread.join(5)
    assert condition._waiters == []
    assert free_to_another_thread(guard, timeout=0.2)


def test_notify_all_wakes_every_waiter() -> None:
    guard = Guard()
    condition = Condition(guard)
    woken: list[bool] = []

    def wait() -> None:
        with guard:
            woken.append(condition.wait(10))

    waiting = [_in_thread(wait) for _ in range(3)]
    while True:
        with guard:
            if len(condition._waiters) == 3:
                condition.notify_all()
                break
        threading.Event().wait(0.001)
    for thread in waiting:
        thread.join(5)
    assert woken == [True, True, True]


class _Waking:
    """Two threads waiting on an ``Event`` (``set``) or a ``Condition``
    (``notify_all``), and the wake that ends their waits."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.guard = Guard()
        self.event, self.condition = Event(), Condition(self.guard)
        self.woken: list[bool] = []
        self.threads = [_in_thread(self._wait) for _ in range(2)]
        while len(self.waiters) < 2:
            threading.Event().wait(0.001)

    @property
    def waiters(self) -> list[threading.Lock]:
        return self.event._waiters if self.kind == "set" else self.condition._waiters

    def _wait(self) -> None:
        if self.kind == "set":
            self.woken.append(self.event.wait(10))
        else:
            with self.guard:
                self.woken.append(self.condition.wait(10))

    def wake(self) -> None:
        if self.kind == "set":
            self.event.set()
        else:
            with self.guard:
                self.condition.notify_all()


@pytest.mark.parametrize("kind", ["set", "notify_all"])
def test_a_wake_interrupted_as_any_call_returns_wakes_all_its_waiters_or_none(
    kind: str,
) -> None:
    interrupted_at = []
    for k in range(1, 100):
        waking = _Waking(kind)
        listed = list(waking.waiters)
        sys.setprofile(raising_at_return(k))
        try:
            waking.wake()
        except Interrupt:
            interrupted_at.append(k)
        finally:
            sys.setprofile(None)
        if interrupted_at[-1:] == [k] and waking.waiters:
            # None woken: all still listed, and held (a waiter's lock is released to
            # wake it).
            assert waking.waiters == listed
            assert all(w.locked() for w in listed)
            assert not waking.event.is_set()
            waking.wake()
        for thread in waking.threads:
            thread.join(5)
        assert waking.woken == [True, True]
        if interrupted_at[-1:] != [k]:
            break
    assert interrupted_at  # (the guard's exit, at least: a C call's return)


@main_thread_signals
@pytest.mark.parametrize("operation", ["wait", "set", "set and clear"])
def test_an_interrupt_anywhere_in_an_event_leaves_it_usable(operation: str) -> None:
    # threading.Event: wait(0) left its lock held 28 times of 200 on 3.11 and raised a
    # RuntimeError for the interrupt 14 times; set() left it held 67 times.
    with raising_on_alarm():
        for _ in range(100):
            _interrupt_and_use(Event(), operation)


def _interrupt_and_use(event: Event, operation: str) -> None:
    def set_and_clear() -> None:
        event.set()
        event.clear()

    if operation == "wait":
        interrupt(lambda: event.wait(0), 0.0005)
    else:
        interrupt(event.set if operation == "set" else set_and_clear, 0.0005)
    assert free_to_another_thread(event._guard, timeout=0.2)
    event.clear()
    waiter = _in_thread(lambda: event.wait(10))
    _in_thread(event.set).join(5)
    waiter.join(5)
    assert event.is_set()
    assert not waiter.is_alive()


@main_thread_signals
def test_an_interrupt_anywhere_in_a_condition_wait_leaves_its_guard_to_the_with() -> None:
    # threading.Condition over an RLock: 15 times of 200 on 3.11 the interrupt came after
    # wait() gave the lock up and before its try; the with's exit then raised a
    # RuntimeError ("cannot release un-acquired lock") in its place.
    guard = Guard()
    condition = Condition(guard)

    def wait() -> None:
        with guard:
            condition.wait(0)
            assert guard._is_owned()

    with raising_on_alarm():
        for _ in range(100):
            interrupt(wait, 0.0005)
            assert not guard._is_owned()
            assert free_to_another_thread(guard, timeout=0.2)

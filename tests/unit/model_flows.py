"""What the model tests need to drive the shipped flows (``tenure._core.flows``).

A model client holds the suspended flow of its current call in a ``Stepper`` and
carries out each operation the flow yields when the model's rules say it completes,
the way ``flows.drive`` would (the same rule: while an interrupt propagates, only
``flows.INSTANT`` operations). ``ModelLease`` is the lease the flows read and change,
``ModelInbox`` the notification slot a ``Listen`` gives, and ``decode`` reads back a
packed command so that the model's nodes can run it.
"""

from __future__ import annotations

from typing import Any

from tenure._core.acquire import LeaseState
from tenure._core.config import LockSpec
from tenure._core.flows import Flow, Flows, Op, check_instant
from tenure._core.waiting import Wake
from tenure._errors import LeaseLost
from tenure.testing.fake import script_call

__all__ = ["Interrupt", "ModelFlows", "ModelInbox", "ModelLease", "Stepper", "decode"]


class Interrupt(BaseException):
    """Thrown into a flow: what asyncio's ``CancelledError`` or a ``KeyboardInterrupt``
    does to a driver (a ``BaseException``, so the flow must answer with instant cleanup)."""


class Stepper:
    """One flow, suspended at the operation it yielded last (``op``), resumed by hand.

    ``done`` once it returned (``result``) or raised (``error``). An exception that
    comes out of the model itself (a failed check, ``check_instant``) is not caught.
    """

    def __init__(self, flow: Flow[Any]) -> None:
        self.flow = flow
        self.op: Op | None = None
        self.unwinding = False
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None

    def start(self) -> Op | None:
        return self._step(None, None)

    def send(self, value: object = None) -> Op | None:
        assert not self.done
        return self._step(value, None)

    def throw(self, exc: BaseException) -> Op | None:
        assert not self.done
        self.unwinding = self.unwinding or not isinstance(exc, Exception)
        return self._step(None, exc)

    def abandon(self) -> None:
        """The process died: let the flow unwind (its cleanup is never carried out), so
        that no suspended generator is left to be closed by the garbage collector."""
        if self.done:
            return
        op = self.throw(Interrupt("the process died"))
        while op is not None:
            op = self.send(None)

    def _step(self, value: object, exc: BaseException | None) -> Op | None:
        try:
            if exc is not None:
                op = self.flow.throw(exc)
            elif self.op is None:
                op = next(self.flow)
            else:
                op = self.flow.send(value)
        except StopIteration as stop:
            self.done, self.result, self.op = True, stop.value, None
            return None
        except Exception as error:  # the call's own outcome (LeaseLost, QuorumUnreachable)
            self.done, self.error, self.op = True, error, None
            return None
        except Interrupt as error:
            self.done, self.error, self.op = True, error, None
            return None
        if self.unwinding:
            try:
                check_instant(self.flow, op)  # closes the flow and raises: the model fails
            except RuntimeError:
                self.done, self.op = True, None
                raise
        self.op = op
        return op


class ModelFlows(Flows):
    """A model process's flows: the shipped ones; the tests that check a model has teeth
    plant a broken core through ``acquisition_type``."""


class ModelLease:
    """The lease the flows act on (``flows.WatchedLease``)."""

    def __init__(self, state: LeaseState, spec: LockSpec) -> None:
        self._state = state
        self._spec = spec
        self._first_started = state.started
        self._released = False
        self.loss: LeaseLost | None = None

    @property
    def released(self) -> bool:
        return self._released

    @property
    def token(self) -> str:
        return self._state.token

    @property
    def lost_error(self) -> LeaseLost | None:
        return self.loss

    def _set_released(self) -> None:
        self._released = True

    def _mark_lost(self, error: LeaseLost) -> None:
        if self.loss is None:
            self.loss = error

    def _stop_watching(self) -> None:
        pass  # no watchdog in the models


class ModelInbox:
    """The notification slot of one waiter (``Slot`` of the drivers, without threads)."""

    def __init__(self, waiter: str, need: int) -> None:
        self.waiter = waiter
        self.need = need
        self.wakes: list[tuple[int, Wake]] = []
        self.nudged = False

    def put(self, node: int, wake: Wake) -> None:
        self.wakes.append((node, wake))

    def ready(self) -> bool:
        """A majority of nodes notified: the listener wakes the waiter."""
        return len({i for i, _ in self.wakes}) >= self.need

    def take(self) -> list[tuple[int, Wake]]:
        self.nudged = False
        wakes, self.wakes = self.wakes, []
        return wakes


def _items(packed: bytes) -> list[bytes]:
    """The bulk strings of one RESP array (what ``commands.pack`` writes)."""
    assert packed[:1] == b"*"
    end = packed.index(b"\r\n")
    count, pos, items = int(packed[1:end]), end + 2, []
    for _ in range(count):
        end = packed.index(b"\r\n", pos)
        size = int(packed[pos + 1 : end])
        items.append(packed[end + 2 : end + 2 + size])
        pos = end + 4 + size
    assert pos == len(packed), "one command only (no WAIT in the models)"
    return items


def decode(packed: bytes) -> tuple[str, list[str], list[str]]:
    """(script name, KEYS, ARGV) of a packed ``EVAL`` or ``EVALSHA``; ("exists", its keys, [])
    for the ``EXISTS`` of ``Flows.locked``."""
    items = _items(packed)
    if items[0] == b"EXISTS":
        return "exists", [x.decode() for x in items[1:]], []
    return script_call(packed)

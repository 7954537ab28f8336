"""ProcessGroup (tenure.testing._group): close() and ``with`` leave no member behind.

The members here are stand-ins that record what the group asks of them and fail where a
test says, so that every way a stop can fail is tried without a process; the real
servers are stopped through the same base in tests/integration/test_local.py and
tests/integration/test_topologies.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tenure.testing._group import ProcessGroup


class _Member:
    """A process stand-in: records each step into the group's log, raises if told."""

    def __init__(self, name: str, log: list[str], fail: dict[str, BaseException]) -> None:
        self.name = name
        self._log = log
        self._fail = fail

    def _step(self, step: str) -> None:
        self._log.append(f"{step} {self.name}")
        failure = self._fail.get(f"{step} {self.name}")
        if failure is not None:
            raise failure

    def _terminate(self) -> None:
        self._step("terminate")

    def _reap(self) -> None:
        self._step("reap")

    def _retire(self) -> None:
        self._step("retire")


class _Group(ProcessGroup):
    """Three members a, b, c; ``start()`` starts them in turn (``fail`` may stop it)."""

    def __init__(
        self, fail: dict[str, BaseException] | None = None, base_dir: Path | None = None
    ) -> None:
        super().__init__(base_dir, "tenure-test-group-")
        self.log: list[str] = []
        self.members = [_Member(name, self.log, fail or {}) for name in "abc"]

    def _processes(self) -> list[_Member]:
        return self.members

    def start(self) -> None:
        for member in self.members:
            member._step("start")


# A temporary directory is removed, so the members are then retired; a base_dir is kept.
STOP_KEEPING = ["terminate a", "terminate b", "terminate c", "reap a", "reap b", "reap c"]
EVERY_STOP = [*STOP_KEEPING, "retire a", "retire b", "retire c"]


def test_close_asks_all_then_reaps_all_then_removes_the_directory() -> None:
    group = _Group()
    with group:
        assert group.directory.is_dir()
    assert group.log == ["start a", "start b", "start c", *EVERY_STOP]
    assert not group.directory.exists()


def test_close_stops_every_member_even_when_stopping_some_fails() -> None:
    refused = PermissionError("refused")
    group = _Group({"terminate a": refused, "reap b": TimeoutError("stuck")})
    with pytest.raises(PermissionError) as info:
        group.close()
    assert group.log == EVERY_STOP
    assert not group.directory.exists()
    assert info.value is refused  # the first failure


def test_an_interrupt_while_stopping_is_raised_after_the_others_are_stopped() -> None:
    group = _Group({"terminate c": OSError("refused"), "reap a": KeyboardInterrupt()})
    with pytest.raises(KeyboardInterrupt):  # never hidden behind an error
        group.close()
    assert group.log == EVERY_STOP
    assert not group.directory.exists()


@pytest.mark.parametrize("failure", [RuntimeError("no PONG"), KeyboardInterrupt()])
def test_a_start_that_fails_part_way_stops_what_it_started(failure: BaseException) -> None:
    group = _Group({"start b": failure})
    with pytest.raises(type(failure)), group:
        pytest.fail("the body runs only after a start that succeeded")
    # a started, b failed: every member is still stopped, for start() may have spawned it.
    assert group.log == ["start a", "start b", *EVERY_STOP]
    assert not group.directory.exists()


def test_a_base_dir_is_created_and_kept(tmp_path: Path) -> None:
    where = tmp_path / "deep" / "group"
    group = _Group(base_dir=where)
    assert where.is_dir()
    group.close()
    group.close()  # the members are asked again (a no-op for a reaped process)
    assert group.log == STOP_KEEPING * 2  # none retired: the group may start again
    assert where.is_dir()

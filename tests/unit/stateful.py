"""What the hypothesis state machines of this suite share."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis.stateful import run_state_machine_as_test as _run_state_machine_untyped

# Older hypothesis releases (6.155 and before) ship this function without annotations, and
# mypy --strict refuses to call it from typed code; a typed alias keeps the tests independent of
# the installed release.
run_state_machine_as_test: Callable[..., None] = _run_state_machine_untyped

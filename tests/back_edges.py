"""Loops that a Ctrl-C can leave without their cleanup, as this interpreter compiles them.

CPython raises a pending signal's exception (Ctrl-C's ``KeyboardInterrupt``) at a
loop's back-edge, among other places. CPython 3.13 compiles the back-edge of some loops
(a ``while <condition>:`` loop's; a loop's whose body ends in an ``if``) outside the
exception table's range of the ``try`` or ``with`` block around the loop, so an
exception raised there leaves the function at once: the ``finally``, the ``with``
block's ``__exit__`` and the ``except BaseException`` are skipped. (Shown with real
signals: a ``while i < n:`` loop in a ``try``/``finally``, a timer's signal raising in
it, skipped the ``finally`` 20 times of 20 on 3.13.0, never on 3.11 or 3.12, whose
interpreters take the exception's place from the instruction before the jump. CPython's
tracker has it as "KeyboardInterrupt not handled while evaluating a tight while loop
condition on Python 3.13".) A lock's ``with`` left so stays locked for good; a
``finally`` skipped so leaves what it was there to undo.

This finds every such loop in a tree of Python files, compiled by the interpreter that
runs it: a back-edge (``JUMP_BACKWARD``; ``JUMP_BACKWARD_NO_INTERRUPT`` takes no signal)
that the exception table does not give the handler it gives the loop's first
instruction, in a loop that a ``with``, a ``try`` with a ``finally``, or a ``try`` whose
``except`` takes ``BaseException`` or ``KeyboardInterrupt`` encloses within its
function. (A narrower ``except`` would not take the interrupt anyway.) The remedy is to
move the loop into a function of its own: its back-edges then have no handler to miss,
and the interrupt comes out of the call, which the caller's handler covers.

It speaks for CPython 3.13 and later only: 3.11 and 3.12 place such an exception at
the instruction before the back-edge, inside the block, where this check does not look
(on 3.12 it finds back-edges of the ``await`` machinery that no signal can leave by).
3.13.18 still compiles the loops so; 3.14.10 compiles the back-edge inside the block
(its ``finally`` sample is not found, and the test skips there).
Standard library only, so that ``tests/test_back_edges.py`` can run it under every
interpreter the machine has: ``python back_edges.py <dir>`` prints a JSON object.
"""

from __future__ import annotations

import ast
import dis
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

# Shapes whose verdicts show the check at work where the interpreter has the flaw
# (``samples``): a loop in a ``try``/``finally`` is found; one in a ``try`` whose
# ``except`` is narrower than an interrupt, and one moved into a function of its own
# (the remedy), are not.
SAMPLES = {
    "finally": """
def sample(n, log):
    try:
        i = 0
        while i < n:
            i += 1
    finally:
        log.append(n)
""",
    "narrow except": """
def sample(n, log):
    try:
        i = 0
        while i < n:
            i += 1
    except ValueError:
        log.append(n)
""",
    "apart": """
def sample(n, log):
    try:
        count(n)
    finally:
        log.append(n)

def count(n):
    i = 0
    while i < n:
        i += 1
""",
}

_LOOPS = (ast.For, ast.While, ast.AsyncFor)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.Module)
_INTERRUPTS = {"BaseException", "KeyboardInterrupt"}


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _takes_interrupts(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types_ = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    names = {t.id if isinstance(t, ast.Name) else getattr(t, "attr", "") for t in types_}
    return bool(names & _INTERRUPTS)


def _cleanups(loop: ast.AST, parents: dict[ast.AST, ast.AST]) -> list[str]:
    """What encloses ``loop`` within its function that an interrupt must not skip."""
    found = []
    node = loop
    while not isinstance(node, _SCOPES) and node in parents:
        parent = parents[node]
        if isinstance(parent, (ast.With, ast.AsyncWith)) and node in parent.body:
            found.append("with")
        elif isinstance(parent, ast.Try) and node in parent.body:
            if parent.finalbody:
                found.append("finally")
            if any(_takes_interrupts(h) for h in parent.handlers):
                found.append("except BaseException")
        node = parent
    return found


class _Entry(Protocol):
    """A row of a code object's exception table (``dis.Bytecode.exception_entries``)."""

    start: int
    end: int
    target: int


def _handler(entries: list[_Entry], offset: int) -> int | None:
    """Where the exception table sends an exception raised at ``offset``."""
    return next((e.target for e in entries if e.start <= offset < e.end), None)


def findings_in(source: str, name: str) -> list[str]:
    """``name:line function (what it skips)`` for each loop in ``source`` whose back-edge
    an interrupt would leave by, skipping a cleanup."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    loops = [node for node in ast.walk(tree) if isinstance(node, _LOOPS)]
    found = []
    for code in _codes(compile(source, name, "exec")):
        bytecode = dis.Bytecode(code)
        # (Not in typeshed's stubs; every CPython since 3.11 has it.)
        entries: list[_Entry] = bytecode.exception_entries  # type: ignore[attr-defined]
        instructions = list(bytecode)
        for jump in instructions:
            if jump.opname != "JUMP_BACKWARD":
                continue
            covering = _handler(entries, jump.argval)
            if covering is None or _handler(entries, jump.offset) == covering:
                continue
            line = next(
                (
                    i.positions.lineno
                    for i in instructions
                    if i.offset >= jump.argval and i.positions and i.positions.lineno
                ),
                None,
            )
            if line is None:
                continue
            around = [n for n in loops if n.lineno <= line <= (n.end_lineno or n.lineno)]
            if not around:
                continue
            loop = max(around, key=lambda n: n.lineno)
            skipped = _cleanups(loop, parents)
            if skipped:
                found.append(f"{name}:{loop.lineno} {code.co_qualname} ({', '.join(skipped)})")
    return sorted(set(found))


def findings(root: Path) -> list[str]:
    """``findings_in`` every ``.py`` file under ``root``, named relative to it."""
    out: list[str] = []
    for path in sorted(root.rglob("*.py")):
        out += findings_in(path.read_text(encoding="utf-8"), str(path.relative_to(root)))
    return out


def samples() -> dict[str, bool]:
    """Whether each of ``SAMPLES`` is found, as this interpreter compiles it."""
    return {shape: bool(findings_in(source, "sample.py")) for shape, source in SAMPLES.items()}


if __name__ == "__main__":
    print(
        json.dumps(
            {
                "version": list(sys.version_info[:3]),
                "samples": samples(),
                "findings": findings(Path(sys.argv[1])),
            }
        )
    )

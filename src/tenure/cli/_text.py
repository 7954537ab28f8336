"""Text helpers shared by the ``tenure`` subcommands."""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name if it has none): the
    commands report errors on one line each, without a traceback."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__

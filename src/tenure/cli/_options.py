"""The ``tenure`` command line's parser: numeric options refused in one wording, and every
problem of a command line told at once.

argparse stops at the first problem, and what it said of a bad number was the range at
best: ``tenure run --ttl 0 -- true`` said "argument --ttl: must be a positive number, got
0.0", neither the default nor a value that works, and nothing of the NAME that was missing
too, which only the next attempt found. Here:

* :func:`add_seconds` and :func:`add_count` declare a numeric option from its range, its
  default (or what leaving it out does) and an example, and its refusal says them all,
  with what was given, in one wording for every option of every subcommand::

      argument --ttl: must be a positive number of seconds, got 0 (the default is 10 s;
      e.g. --ttl 30)

* :class:`Parser` notes a refused value and parses on, so that the command line's other
  problems (a missing argument, an unknown word, another refused value) are told with
  it; :meth:`Parser.fail` prints the usage and one ``error:`` line per problem on stderr
  and raises :class:`UsageError` (a ``SystemExit(2)`` carrying the lines, for
  ``tenure check --json`` to print them as JSON as well).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

__all__ = ["REFUSED", "Parser", "UsageError", "add_count", "add_seconds"]

EXIT_USAGE = 2

_Number = TypeVar("_Number", int, float)


class UsageError(SystemExit):
    """The command line could not be used; the usage and ``problems`` (one line each,
    without the ``prog: error:`` prefix) are on stderr already.

    A ``SystemExit(2)``, as argparse's own error is, so that a caller of ``parse_args``
    sees what it always saw."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__(EXIT_USAGE)
        self.problems = tuple(problems)


class _Refused:
    """What a refused option holds until the parse ends in :meth:`Parser.fail`; never a
    usable value (the option's default would let a caller that looks only at the
    namespace run with it, as if the value had been left out)."""

    def __repr__(self) -> str:
        return "<refused>"


REFUSED: Any = _Refused()


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that tells every problem of a command line, not the first.

    Subparsers made by ``add_subparsers`` are of this class too (argparse makes them of
    the parent's). A value its type refuses is noted in :attr:`refused` and stands as
    :data:`REFUSED` while the parse goes on; whoever ends the parse (argparse, for a
    problem of its own, or the caller, through :meth:`fail`) reports the noted ones first.
    A caller of ``parse_known_args`` must therefore check :attr:`refused` of the parser
    that parsed (the subcommand's) and call :meth:`fail` if it is not empty.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused: list[str] = []

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as exc:
            self.refused.append(str(exc))
            return REFUSED

    def parse_args(self, *args: Any, **kwargs: Any) -> Any:
        """argparse's, which never returns a namespace with a problem in it: a refused
        value fails here, as its first problem did in argparse. (``main`` parses with
        ``parse_known_args``, to add the problems it finds itself.)"""
        namespace = super().parse_args(*args, **kwargs)
        parsed: Parser = getattr(namespace, "parser", self)  # the subcommand's, if any
        if parsed.refused:
            parsed.fail([])
        return namespace

    def error(self, message: str) -> NoReturn:
        self.fail([message])

    def fail(self, problems: Sequence[str]) -> NoReturn:
        """Print the usage, then one line per problem (the refused values first), on
        stderr; raise :class:`UsageError`."""
        lines = [*self.refused, *problems]
        self.print_usage(sys.stderr)
        for line in lines:
            print(f"{self.prog}: error: {line}", file=sys.stderr)
        raise UsageError(lines)


# --- numeric options ---------------------------------------------------------------------


def add_seconds(
    parser: argparse._ActionsContainer,
    flag: str,
    *,
    low: float = 0.0,
    high: float = math.inf,
    open_low: bool = False,
    default: float | None = None,
    left_out: str = "",
    example: float,
    help: str,
    metavar: str = "SECONDS",
) -> None:
    """Add option ``flag``: a number of seconds from ``low`` (excluded if ``open_low``) to
    ``high``, always finite.

    Args:
        default: the option's value when left out, said in a refusal; ``None`` for an
            option whose absence means something else (say what in ``left_out``).
        left_out: what leaving the option out does, said instead of the default ("by
            default it waits for ever", "the default is 6 s, 3 s with --quick").
        example: a value the option takes, shown in a refusal (checked here).
    """
    lo, hi = f"{low:g}", f"{high:g}"
    if math.isinf(high):
        if low == 0:
            words = "a positive number of seconds" if open_low else "a number of seconds, 0 or more"
        else:
            words = f"more than {lo} seconds" if open_low else f"at least {lo} seconds"
    elif not open_low:
        words = f"a number of seconds from {lo} to {hi}"
    elif low == 0:
        words = f"a positive number of seconds, at most {hi}"
    else:
        words = f"more than {lo} and at most {hi} seconds"

    def accepted(value: float) -> bool:
        above = low < value if open_low else low <= value
        return above and value <= high and math.isfinite(value)

    told = f"the default is {default:g} s" if default is not None else left_out
    kind = _checked(flag, float, "a number", accepted, words, told, example)
    parser.add_argument(flag, type=kind, default=default, metavar=metavar, help=help)


def add_count(
    parser: argparse._ActionsContainer,
    flag: str,
    *,
    low: int,
    high: int,
    odd: bool = False,
    default: int | None = None,
    left_out: str = "",
    example: int,
    help: str,
    metavar: str | None = None,
) -> None:
    """Add option ``flag``: an integer from ``low`` to ``high`` (odd if ``odd``). Bounded
    above as well: a ``--cycles`` of 10**23 ran for ever, 1001 ``--nodes`` started 1001
    servers. ``default``, ``left_out`` and ``example`` as for :func:`add_seconds`."""
    words = f"{'an odd' if odd else 'an'} integer from {low} to {high}"

    def accepted(value: int) -> bool:
        return low <= value <= high and (value % 2 == 1 or not odd)

    told = f"the default is {default}" if default is not None else left_out
    kind = _checked(flag, int, "an integer", accepted, words, told, example)
    parser.add_argument(flag, type=kind, default=default, metavar=metavar, help=help)


def _checked(
    flag: str,
    convert: Callable[[str], _Number],
    noun: str,
    accepted: Callable[[_Number], bool],
    words: str,
    told: str,
    example: _Number,
) -> Callable[[str], _Number]:
    """The option's type: ``convert`` the text, refuse it unless ``accepted``, in the one
    wording of every numeric option (see the module docstring)."""
    if not told:
        raise ValueError(f"{flag}: say the default, or what leaving the option out does")
    fix = f"({told}; e.g. {flag} {example:g})"

    def kind(text: str) -> _Number:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be {words}, got {text!r}, not {noun} {fix}"
            ) from None
        if not accepted(value):
            raise argparse.ArgumentTypeError(f"must be {words}, got {text} {fix}")
        return value

    # The example is shown to every user who gets the range wrong: it had better be right.
    kind(f"{example:g}")
    return kind

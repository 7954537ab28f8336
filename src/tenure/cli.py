"""The ``tenure`` command line.

Each subcommand is one small pair of functions: ``_add_<name>(subparsers)`` declares its
options and sets ``handler``; ``_cmd_<name>(args) -> int`` runs it and returns the exit
code. To add a subcommand, write that pair and list ``_add_<name>`` in ``_SUBCOMMANDS``.

Exit codes: 0 success, 1 the command ran but its check failed (for ``demo``: the locked
run was not clean), 2 usage errors and errors reported by tenure (``TenureError``: a bad
parameter, no redis-server, a node that would not start), 130 interrupted by Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from . import __version__
from ._errors import TenureError

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tenure`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = _build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version and usage errors: argparse has printed
        return _exit_code(exc)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: a command is required", file=sys.stderr)
        return EXIT_USAGE
    try:
        return handler(args)
    except TenureError as exc:
        # Expected failures (bad parameter, missing server): one line, no traceback.
        print(f"{parser.prog}: error: {_first_line(exc)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        # The command has cleaned up on its way out (its finally blocks ran).
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tenure",
        description="Distributed locks on Redis that stay correct under real faults.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(subparsers)
    return parser


# --- demo -----------------------------------------------------------------------------


def _add_demo(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "demo",
        help="race worker processes on a counter, with and without the lock, under faults",
        description=(
            "Start local redis-server nodes, run worker processes doing an unsafe "
            "read-modify-write on a shared counter under the lock while one node is paused "
            "and another killed, then the same without the lock. Exit 0 only if the locked "
            "run was clean (one holder at a time, no lost update)."
        ),
    )
    p.add_argument(
        "--workers", type=_positive_int, help="worker processes (default 8; 4 with --quick)"
    )
    p.add_argument(
        "--duration",
        type=_positive_float,
        help="seconds of the locked run (default 6; 3 with --quick)",
    )
    p.add_argument("--nodes", type=_positive_int, default=5, help="lock nodes, odd (default 5)")
    p.add_argument(
        "--ttl", type=_positive_float, default=2.0, help="lock TTL in seconds (default 2)"
    )
    p.add_argument("--quick", action="store_true", help="a short run, for CI")
    p.set_defaults(handler=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:
    # Imported here: the demo pulls in multiprocessing and tenure.local, which other
    # subcommands do not need.
    from .demo import run_demo

    # --quick only changes the defaults: an explicit --workers or --duration wins.
    quick: bool = args.quick
    workers: int = args.workers or (4 if quick else 8)
    duration: float = args.duration or (3.0 if quick else 6.0)
    return run_demo(workers=workers, duration=duration, nodes=args.nodes, ttl=args.ttl)


# --- helpers --------------------------------------------------------------------------


_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]] = [
    _add_demo,
]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value}")
    return value


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else EXIT_USAGE


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())

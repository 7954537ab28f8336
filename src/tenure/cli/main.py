"""The ``tenure`` command line.

Each subcommand is one small pair of functions: ``_add_<name>(subparsers)`` declares its
options and sets ``handler``; ``_cmd_<name>(args) -> int`` runs it and returns the exit
code. To add a subcommand, write that pair and list ``_add_<name>`` in ``_SUBCOMMANDS``.
A subcommand that runs another command (``run``) declares a ``command`` positional and
sets ``takes_command=True``: everything after the first ``--`` on the command line is
then appended to it verbatim, never parsed as tenure's options.

Exit codes: 0 success, 1 the command ran but its check failed (for ``demo``: the locked
run was not clean), 2 usage errors and errors reported by tenure (``TenureError``: a bad
parameter, no redis-server, a node that would not start), 130 interrupted by Ctrl-C,
128+N stopped by signal N (SIGTERM or SIGHUP: ``timeout``, a CI job's time limit, a
closed terminal), after the same clean-up as for Ctrl-C. A usage error says every problem
of the command line at once, one line each under the usage (``tenure.cli._options``);
``tenure check --json`` also prints them on stdout, as JSON rows of check ``usage``.
``tenure run`` passes its command's status through and adds 69 (nodes unreachable), 75
(lock held elsewhere), 78 (tenure's own error: usage, configuration, a misconfigured
node, an internal failure; never 2 or 1, which its command could return), 79 (lease lost
while the command ran), 126/127 (cannot execute / not found) and 128+N (got signal N);
``tenure status`` exits 69 when fewer than a majority of nodes answered. See
``tenure.cli.run`` for the details. ``tenure check`` exits 0 (all OK), 1 (warnings only),
3 (something UNSAFE) or 69 (a majority unreachable); see ``tenure.cli.node_check``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType

from .. import __version__
from .._core.config import NODE_TIMEOUT_LOW
from .._errors import TenureError
from ._options import Parser, UsageError, add_count, add_seconds
from ._text import one_line
from .node_check import CHECK_EXIT_CODES, check, usage_json
from .node_rules import DEFAULT_MAX_TTL
from .run import EXIT_TENURE_ERROR, RUN_EXIT_CODES, RunOptions, key_prefix_from, nodes_from, run
from .status import status

__all__ = ["main"]

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace], int]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tenure`` with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = _build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    # argparse mangles a trailing command (it drops every "--" and parses the command's
    # options as ours), so for `tenure run` everything after the first "--" is set aside
    # and handed over verbatim as the command. The other subcommands take no command:
    # their "--" goes to argparse, which ends the options there (`tenure status --
    # -nightly`, a name that begins with "-").
    tail: list[str] | None = None
    if words[:1] == ["run"] and "--" in words:
        cut = words.index("--")
        words, tail = words[:cut], words[cut + 1 :]
    # `tenure run` reports every error of its own with one code that its command would not
    # return for itself (see tenure.cli.run); the other subcommands keep argparse's 2.
    error_exit = EXIT_TENURE_ERROR if words[:1] == ["run"] else EXIT_USAGE
    _log_warnings(parser.prog)
    try:
        args, extra = parser.parse_known_args(words)
        # Every problem is said at once (tenure.cli._options), each by the subcommand's
        # parser, with its usage, not the top level's: a refused value, then these.
        sub: Parser = getattr(args, "parser", parser)
        takes_command = getattr(args, "takes_command", False)
        if takes_command:
            args.name, args.command = (args.words[0], args.words[1:]) if args.words else (None, [])
        problems = []
        if extra:
            # For `tenure run` without a "--", a word after its options is most likely
            # the command.
            hint = (
                ' (the command goes after "--": tenure run NAME [options] -- COMMAND ...)'
                if takes_command and tail is None
                else ""
            )
            problems.append(f"unrecognized arguments: {' '.join(extra)}{hint}")
        if takes_command and args.name is None:
            # No NAME before "--": `tenure run [OPTIONS] -- -NAME -- COMMAND`, for a name
            # that begins with "-" (argparse would take it for an option).
            named = tail or []
            if len(named) >= 2 and named[1] == "--":
                args.name, tail = named[0], named[2:]  # no COMMAND: run() says so
            else:
                # Words after one "--" are the command (`tenure run --ttl 5 -- make`):
                # what is missing is the NAME alone, which goes first.
                problems.append(_NO_NAME if named else _NO_NAME_NOR_COMMAND)
        if problems or sub.refused:
            sub.fail(problems)
        if tail is not None:
            if not takes_command:
                parser.error(f"unrecognized arguments: -- {' '.join(tail)}")
            # Words before "--" (``tenure run NAME make -- -j4``) start the command.
            args.command = [*args.command, "--", *tail] if args.command else tail
    except UsageError as exc:
        # A script reading `tenure check --json` gets the problems as JSON too, in the
        # findings' shape, not an empty stdout.
        if _asks_for_json(words):
            print(usage_json(exc.problems), flush=True)
        return error_exit
    except SystemExit as exc:  # --help and --version: argparse has printed
        code = _exit_code(exc)
        return error_exit if code == EXIT_USAGE else code
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: a command is required", file=sys.stderr)
        return EXIT_USAGE
    try:
        # `tenure run` forwards these signals to its command itself.
        with contextlib.nullcontext() if getattr(args, "takes_command", False) else _stopping():
            return handler(args)
    except BrokenPipeError:
        # The reader of our output went away (`tenure check | head -1`): nothing more can
        # be said there, and a traceback would be noise. Exit as a process killed by
        # SIGPIPE is reported, as other command-line tools do; further writes (Python's
        # own flush at exit) go nowhere.
        with contextlib.suppress(OSError, ValueError):  # a stdout without a descriptor
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except TenureError as exc:
        # Expected failures (bad parameter, missing server): one line, no traceback.
        print(f"{parser.prog}: error: {one_line(exc)}", file=sys.stderr)
        if getattr(args, "json", False):
            # `tenure check --json` refused its nodes' URLs or found none: a usage error
            # (exit 2), told on stdout as one for the options is (tenure check raises
            # before it prints anything).
            print(usage_json([one_line(exc)]), flush=True)
        return error_exit
    except KeyboardInterrupt:
        # The command has cleaned up on its way out (its finally blocks ran).
        print(f"{parser.prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except _Stopped as exc:
        # Cleaned up on the way out, as for Ctrl-C.
        print(f"{parser.prog}: terminated ({exc.signal.name})", file=sys.stderr)
        return 128 + exc.signal


_USAGE_FORMS = (
    "tenure run NAME [options] -- COMMAND ...; a NAME that begins with '-' after the "
    "options: tenure run [options] -- -NAME -- COMMAND ..."
)
_NO_NAME = f"the following arguments are required: NAME (before the options: {_USAGE_FORMS})"
_NO_NAME_NOR_COMMAND = f"the following arguments are required: NAME, COMMAND ({_USAGE_FORMS})"


def _asks_for_json(words: Sequence[str]) -> bool:
    """Whether the command line is ``tenure check``'s with ``--json`` (or a prefix
    argparse takes for it) anywhere. The shape is check's; no other subcommand has one."""
    command = next((w for w in words if not w.startswith("-")), None)
    flags = ("--j", "--js", "--jso", "--json")
    return command == "check" and any(w.split("=", 1)[0] in flags for w in words)


class _Stopped(BaseException):
    """SIGTERM or SIGHUP arrived. A BaseException, like KeyboardInterrupt, so that no
    ``except Exception`` on the way (a verifier run that records a failed choreography
    and goes on to the next) takes it for an error of the command's own."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signal = signal.Signals(signum)


# Stopped by these, a command cleans up as for Ctrl-C instead of dying where it stands:
# Python's default for them ends the process without running a finally block, which left
# `tenure verify`'s and `tenure demo`'s temporary directories (nodes' data, histories)
# behind. Their servers and workers die with us in any case (PR_SET_PDEATHSIG).
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def _stopping() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into :class:`_Stopped` in the main thread while the
    command runs; the previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers (main() called from a thread)
        return
    stopping = False

    def handle(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return  # a repeat must not cut the clean-up the first one started short
        stopping = True
        raise _Stopped(signum)

    previous = {}
    for sig in _STOP_SIGNALS:
        before = signal.getsignal(sig)
        if before is signal.SIG_IGN:
            continue  # nohup's SIGHUP, or an ignored SIGTERM: the caller's choice stands
        previous[sig] = before
        signal.signal(sig, handle)
    try:
        yield
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)


def _log_warnings(prog: str) -> None:
    """Show the library's warnings (a misconfigured node the lock does without) as one
    line each on stderr, unless the program has set up logging itself."""
    logger = logging.getLogger("tenure")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prog}: %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)


def _build_parser() -> Parser:
    parser = Parser(
        prog="tenure",
        description="Distributed locks on Redis that stay correct under real faults.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND")
    for add in _SUBCOMMANDS:
        add(subparsers)
    return parser


# --- demo -----------------------------------------------------------------------------


def _add_demo(subparsers: argparse._SubParsersAction[Parser]) -> None:
    # Imported here, as the verifier's scenarios are by _add_verify: the demo pulls in
    # multiprocessing and tenure.testing, which importing tenure.cli alone does not.
    from .demo import MAX_DURATION, MAX_NODES, MAX_WORKERS, ttl_range

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
    # Left out, --workers and --duration are None: --quick picks their defaults.
    add_count(
        p,
        "--workers",
        low=1,
        high=MAX_WORKERS,
        left_out="the default is 8, 4 with --quick",
        example=16,
        help=f"worker processes, 1 to {MAX_WORKERS} (default 8; 4 with --quick)",
    )
    add_seconds(
        p,
        "--duration",
        open_low=True,
        high=MAX_DURATION,
        left_out="the default is 6 s, 3 s with --quick",
        example=10,
        help=f"seconds of the locked run, at most {MAX_DURATION:g} (default 6; 3 with --quick)",
    )
    add_count(
        p,
        "--nodes",
        low=1,
        high=MAX_NODES,
        odd=True,
        default=5,
        example=7,
        help=f"lock nodes, odd, 1 to {MAX_NODES} (default 5)",
    )
    # The range of the workers' clients (run_demo checks it too, for its other callers).
    shortest, longest = ttl_range()
    add_seconds(
        p,
        "--ttl",
        low=shortest,
        high=longest,
        default=2.0,
        example=5,
        help=f"lock TTL in seconds, {shortest:g} to {longest:g} (default 2)",
    )
    p.add_argument("--quick", action="store_true", help="a short run, for CI")
    p.set_defaults(handler=_cmd_demo, parser=p)


def _cmd_demo(args: argparse.Namespace) -> int:
    from ..verify.actors import preload_workers
    from .demo import run_demo

    preload_workers()

    # --quick only changes the defaults: an explicit --workers or --duration wins.
    quick: bool = args.quick
    workers: int = args.workers or (4 if quick else 8)
    duration: float = args.duration or (3.0 if quick else 6.0)
    return run_demo(workers=workers, duration=duration, nodes=args.nodes, ttl=args.ttl)


# --- run ------------------------------------------------------------------------------


def _add_node_timeout_option(
    p: argparse.ArgumentParser, default: float, what: str, *, checked_later: bool = False
) -> None:
    """The range of Client(node_timeout=...), so that ``tenure status`` and ``tenure
    check`` take what the clients they inspect could have (a --node-timeout of 1e300
    overflowed the socket's deadline on every node, reported as each node's error); or,
    ``checked_later``, any positive number, left to the Client to refuse (``tenure run``:
    one message for the node timeout and the TTL together)."""
    add_seconds(
        p,
        "--node-timeout",
        low=0 if checked_later else NODE_TIMEOUT_LOW,
        open_low=checked_later,
        high=math.inf if checked_later else 60,
        default=default,
        example=2 * default,
        help=f"wait at most this long {what} (default {default:g})",
    )


def _add_nodes_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--redis",
        metavar="URL",
        action="append",
        help=(
            "a lock node (redis://host:port[/db], rediss://..., unix:///path, "
            "redis+sentinel://host:port[,host:port...]/service[/db], "
            "redis+cluster://host:port[,host:port...]); repeat for each node (3 or more "
            "independent masters: Redlock). Default: $TENURE_REDIS, URLs separated by "
            "spaces (or commas between URLs)"
        ),
    )


def _add_key_prefix_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--key-prefix",
        metavar="PREFIX",
        help=(
            "the key prefix your clients use (their key_prefix): what every lock key and "
            "notification channel starts with. Default: $TENURE_KEY_PREFIX, else tenure:"
        ),
    )


def _add_run(subparsers: argparse._SubParsersAction[Parser]) -> None:
    p = subparsers.add_parser(
        "run",
        help="run a command while holding a lock (a distributed flock)",
        usage="tenure run NAME [options] -- COMMAND [ARG ...]",
        description=(
            "Acquire lock NAME, keep it alive with the watchdog while COMMAND runs, and "
            "release it when COMMAND ends. If the lock is lost meanwhile, COMMAND's "
            "process group gets SIGTERM, then SIGKILL after --grace seconds."
        ),
        epilog=RUN_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # NAME, then the words right after it, which start COMMAND (`tenure run NAME make --
    # -j4`); main() splits them. One positional, not NAME and COMMAND apart: the argparse
    # of Python 3.14 and of later 3.13 releases (3.13.18; not 3.13.0) gives a second one
    # the words after the options too (`tenure run NAME --ttl 5 make` would run make).
    # Optional for argparse only: a NAME that begins with "-" comes after "--" (main()).
    p.add_argument("words", metavar="NAME", nargs="*", help="the lock's name")
    _add_nodes_option(p)
    # Their upper bounds (and --max-hold's lower one) are the Client's to check: one
    # message for --ttl, --max-ttl, --max-hold and --node-timeout together.
    add_seconds(
        p,
        "--ttl",
        open_low=True,
        default=10.0,
        example=30,
        help="lease TTL; the watchdog extends it every TTL/3 (default 10)",
    )
    waiting = p.add_mutually_exclusive_group()
    add_seconds(
        waiting,
        "--wait",
        left_out="by default it waits for ever",
        example=60,
        help="give up (exit 75) if the lock is still held after this long (default: forever)",
    )
    waiting.add_argument(
        "--no-wait", action="store_true", help="give up at once (exit 75) if the lock is held"
    )
    add_seconds(
        p,
        "--grace",
        default=5.0,
        example=10,
        help="between SIGTERM and SIGKILL when the command must stop (default 5)",
    )
    add_seconds(
        p,
        "--max-hold",
        open_low=True,
        left_out="by default the lease is held as long as the command runs",
        example=3600,
        help="stop extending after holding this long: the lease then runs out and the "
        "command is terminated (exit 79). Default: no cap",
    )
    add_seconds(
        p,
        "--max-ttl",
        open_low=True,
        default=60.0,
        example=120,
        help="the longest TTL a lease may have, the same on every client of these nodes "
        "(their max_ttl): a node that lost its data sits out this long. --ttl is at most "
        "this (default 60)",
    )
    _add_node_timeout_option(p, 0.05, "for any one node in a round", checked_later=True)
    _add_key_prefix_option(p)
    p.set_defaults(handler=_cmd_run, takes_command=True, parser=p)


def _cmd_run(args: argparse.Namespace) -> int:
    options = RunOptions(
        name=args.name,
        command=tuple(args.command),
        nodes=tuple(nodes_from(args.redis)),
        ttl=args.ttl,
        wait=args.wait,
        no_wait=args.no_wait,
        grace=args.grace,
        max_hold=args.max_hold,
        node_timeout=args.node_timeout,
        key_prefix=key_prefix_from(args.key_prefix),
        max_ttl=args.max_ttl,
    )
    return run(options)


# --- status ---------------------------------------------------------------------------


def _add_status(subparsers: argparse._SubParsersAction[Parser]) -> None:
    p = subparsers.add_parser(
        "status",
        help="show what every node says about a lock",
        description=(
            "One line per node: held (with the first 8 characters of the holder's token) or "
            "free, the lock key's PTTL, the node's floor (the highest fencing token it "
            "granted; - if the node is blank), the warm-up left after a data loss (- if "
            "none), the replication ID the floor was written under, or unreachable. A "
            "Sentinel-managed node is read on the master its clients would use now (each "
            "Sentinel naming another, or none, or not answering is warned of on stderr), a "
            "Cluster "
            "node on the master of the lock's slot (each line names it); with a Cluster "
            "node listed, every node's floor is the lock's slot's, as the clients keep it. "
            "Exit 0 if a majority of nodes answered, else 69."
        ),
    )
    p.add_argument(
        "name", metavar="NAME", help="the lock's name (one that begins with '-': after '--')"
    )
    _add_nodes_option(p)
    _add_node_timeout_option(p, 0.5, "for each node")
    _add_key_prefix_option(p)
    p.set_defaults(handler=_cmd_status, parser=p)


def _cmd_status(args: argparse.Namespace) -> int:
    return status(
        args.name,
        nodes_from(args.redis),
        node_timeout=args.node_timeout,
        key_prefix=key_prefix_from(args.key_prefix),
    )


# --- check ----------------------------------------------------------------------------


def _add_check(subparsers: argparse._SubParsersAction[Parser]) -> None:
    p = subparsers.add_parser(
        "check",
        help="inspect the lock nodes: what threatens the lock's safety",
        description=(
            "Read every node's persistence, eviction policy, role, replication IDs, uptime, "
            "version and ACL permissions, and say per node what threatens the lock's "
            "safety: one row per node and check (OK, WARN or UNSAFE) and a summary line. "
            "A Sentinel-managed node is checked on the master its clients would use (plus "
            "min-replicas-to-write/-max-lag, and a WARN per Sentinel naming another master, "
            "or none, or not answering) and "
            "its replicas; a Cluster node on every "
            "master and replica of its slot map, plus whether every slot has a master. "
            "The ACL check covers what each kind of node is sent (ROLE; ASKING, CLUSTER "
            "SLOTS)."
        ),
        epilog=CHECK_EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_nodes_option(p)
    # The range of Client(max_ttl=...).
    add_seconds(
        p,
        "--max-ttl",
        low=0.001,
        high=86_400,
        default=DEFAULT_MAX_TTL,
        example=120,
        help="the longest lease TTL your clients use (their max_ttl); a node started "
        "less than this long ago is reported (default 60)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the findings as a JSON list of {node, check, level, detail}; a usage "
        'error too (exit 2): one row per problem, check "usage", level UNSAFE',
    )
    p.add_argument(
        "--acl-user",
        metavar="NAME",
        help="check the permissions of ACL user NAME (the one your clients log in as) "
        "instead of the user the URLs log in as; needs a login allowed ACL DRYRUN (Redis "
        ">= 7) or ACL GETUSER (6.2), e.g. an admin, which can also read the settings a "
        "least-privilege user may not (docs/deployment.md)",
    )
    _add_node_timeout_option(p, 1.0, "for each node's reply")
    _add_key_prefix_option(p)
    p.set_defaults(handler=_cmd_check, parser=p)


def _cmd_check(args: argparse.Namespace) -> int:
    return check(
        nodes_from(args.redis),
        max_ttl=args.max_ttl,
        node_timeout=args.node_timeout,
        acl_user=args.acl_user,
        as_json=args.json,
        key_prefix=key_prefix_from(args.key_prefix),
    )


# --- verify ---------------------------------------------------------------------------


def _add_verify(subparsers: argparse._SubParsersAction[Parser]) -> None:
    from ..verify.scenarios import MAX_CYCLES, SCENARIOS

    catalogue = "\n".join(f"  {s.number} {s.key:<9} {s.title}" for s in SCENARIOS)
    p = subparsers.add_parser(
        "verify",
        help="reproduce failure scenarios on local nodes and check the histories",
        description=(
            "Start local redis-server nodes, run worker processes that take the lock and\n"
            "read-modify-write a register on a store kept out of the faults, inject each\n"
            "scenario's fault, and check the recorded history: overlapping valid leases\n"
            "(C1), stale writes the store accepted (C3), token order (C4), lost updates\n"
            "(C5), and unavailability. Every scenario runs a control configuration that\n"
            "must show its violation and mitigated ones that must show none."
        ),
        epilog=f"scenarios (by number or name; default all):\n{catalogue}\n\n{VERIFY_EXIT_CODES}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="scenarios to run")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="a few cycles each (CI, about 2 min)")
    size.add_argument("--soak", action="store_true", help="hundreds of cycles each (long)")
    add_count(
        p,
        "--cycles",
        low=1,
        high=MAX_CYCLES,
        left_out="the default is 10, 3 with --quick, up to 200 with --soak",
        example=50,
        metavar="N",
        help=f"cycles per configuration, 1 to {MAX_CYCLES}, overriding --quick/--soak (default 10)",
    )
    p.add_argument(
        "--report",
        metavar="DIR",
        help=(
            "keep histories, node logs, timelines (timeline.html) and summary.md/json here "
            "(a stopped run leaves summary.md with the runs that finished, no summary.json)"
        ),
    )
    p.set_defaults(handler=_cmd_verify, parser=p)


VERIFY_EXIT_CODES = (
    "results: PASS, FAIL (an expectation did not hold), ERROR (the run could not be "
    "carried out: a node that would not start, no libfaketime; it says nothing about the "
    "lock)\n"
    "exit codes: 0 every expectation held, 1 some did not (a mitigation failed, or a "
    "control showed no violation), 2 usage, or a run was an ERROR and none FAILed, "
    "130 Ctrl-C, 143 SIGTERM"
)


def _cmd_verify(args: argparse.Namespace) -> int:
    import tempfile
    from pathlib import Path

    from ..verify.actors import preload_workers
    from ..verify.runner import format_proofs, format_table, run_scenarios
    from ..verify.scenarios import SCENARIOS

    known = {s.key for s in SCENARIOS} | {str(s.number) for s in SCENARIOS}
    unknown = [s for s in args.scenarios if s not in known]
    if unknown:
        names = ", ".join(f"{s.number}/{s.key}" for s in SCENARIOS)
        print(
            f"tenure: error: unknown scenario {unknown[0]!r}; choose from {names}", file=sys.stderr
        )
        return EXIT_USAGE
    mode = "quick" if args.quick else "soak" if args.soak else "standard"
    if args.report == "":
        # Refused, not taken for "no --report": the run kept nothing and said nothing of
        # it, which a caller who asked for a report finds out only when looking for it.
        print(
            "tenure: error: --report: an empty path; give a directory path that can be "
            "written, or leave --report out to keep nothing",
            file=sys.stderr,
        )
        return EXIT_USAGE
    report = None if args.report is None else Path(args.report)
    if report is not None:
        # Made now, not after the first scenario ran: a path that cannot be a directory
        # (a file, a place without permission) is the caller's error, said in one line.
        try:
            report.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            print(
                f"tenure: error: --report: cannot make the directory {str(report)!r} "
                f"({exc.strerror or exc}); give a directory path that can be written",
                file=sys.stderr,
            )
            return EXIT_USAGE
        # A directory that exists but takes no new entries (read-only) passes mkdir:
        # try making one, as every run will.
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".tenure-verify-", dir=report))
        except OSError as exc:
            print(
                f"tenure: error: --report: cannot write in the directory {str(report)!r} "
                f"({exc.strerror or exc}); give a directory path that can be written",
                file=sys.stderr,
            )
            return EXIT_USAGE

    def progress(result: object) -> None:
        from ..verify.runner import RunResult

        assert isinstance(result, RunResult)
        mark = {"PASS": "ok  ", "FAIL": "FAIL"}.get(result.status, "ERR ")
        print(
            f"{mark} {result.scenario.number} {result.scenario.key:<9} {result.config.name}"
            f"  ({result.seconds:.1f}s)",
            flush=True,
        )

    preload_workers()
    results = run_scenarios(args.scenarios, mode, report, progress, args.cycles)
    print()
    print(format_table(results))
    print()
    print("proof of each fault:")
    print(format_proofs(results))
    if report is not None:
        print(f"\nreport: {report}/summary.md, timelines: {report}/*/*/timeline.html")
    statuses = {r.status for r in results}
    # A failed expectation outweighs a run that could not be carried out: it is a finding.
    return 1 if "FAIL" in statuses else EXIT_USAGE if "ERROR" in statuses else 0


# --- helpers --------------------------------------------------------------------------


_SUBCOMMANDS: list[Callable[[argparse._SubParsersAction[Parser]], None]] = [
    _add_demo,
    _add_run,
    _add_status,
    _add_check,
    _add_verify,
]


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    return exc.code if isinstance(exc.code, int) else EXIT_USAGE

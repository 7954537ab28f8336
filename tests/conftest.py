"""Suite-wide options: long runs are opt-in.

``slow``: runs that take tens of seconds or more (the full ``tenure verify --quick``,
ten seconds of watchdog extensions, the models' slowest searches for planted bugs, 15 s
to minutes each). The default run keeps a short version of each (for a search: the
attack it finds, replayed step by step), so CI still covers the behaviour; ``pytest
--slow -m slow`` runs only the long ones. ``soak``: the much longer model searches
(``pytest --soak``).
"""

from __future__ import annotations

import multiprocessing
import subprocess

import pytest

from tenure._errors import ConfigurationError
from tenure.testing import find_server_binary

_WORLDS = (
    "tests/chaos/test_verify_runs.py",
    "tests/integration/test_demo.py",
)

# The stateful models: about a minute of CPU in all (hypothesis searches), and nothing
# else: no server, no waiting. They run one at a time behind the verifier's worlds, on
# the same worker: the middle of a run waits on failovers and timeouts with the cores
# half idle, and that is where they land. At the end, where their place in the tree has
# them, they ran on every worker at once and ended the run last; at the start, beside
# the two chains, they slowed both twice over. The file with the longest test first.
_MODELS = (
    "tests/unit/test_watchdog_model.py",
    "tests/unit/test_model.py",
    "tests/unit/test_quorum_fair_model.py",
    "tests/unit/test_fair_model.py",
)


# Tests start worker processes from multiprocessing's fork server, and so does the
# verifier (tenure.verify.actors). Each would otherwise import tenure, redis-py and its
# test module anew: about half a second of CPU per process on a machine slow at Python,
# over a second in a full run. Forked from a server that imported them once, it starts in
# milliseconds. Only takes effect before the server starts (with the first process a test
# starts), and `tenure verify` or `tenure demo` run in-process set their own list
# (``preload_workers``): a module missing from the list is imported per process, as
# before.
multiprocessing.get_context("forkserver").set_forkserver_preload(
    [
        "tenure.verify.actors",
        *(
            f"tests.integration.{module}"
            for module in (
                "test_fencing_e2e",
                "test_fencing_redis",
                "test_idempotency",
                "test_optimistic",
                "test_processes",
                "test_streams",
                "test_waiting",
            )
        ),
    ]
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak", action="store_true", default=False, help="also run the long soak tests"
    )
    parser.addoption(
        "--slow", action="store_true", default=False, help="also run the slow end-to-end tests"
    )


# Before pytest-xdist's own hook, which reads the groups into each test's id (loadgroup):
# a group marked after it is ignored.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Chains of heavy work, each on one worker, one test at a time: whole verifier
    # worlds (nodes, proxies, worker processes, faults) with liveness expectations ("some
    # grants while a minority is cut off"), then the models; and each other server's pass
    # (the integration core and the verifier's scenarios on Redis 6.2, and on Redis 8,
    # each a run of its own in a subprocess). A parallel run so never stacks more than one
    # of each on the same cores. They are the longest work of the run: first, so that they
    # do not start last.
    def group(item: pytest.Item) -> str | None:
        if "second_server" in item.keywords:
            callspec = getattr(item, "callspec", None)
            return f"second_server-{callspec.params['server'] if callspec else ''}"
        return "worlds" if item.nodeid.startswith(_WORLDS + _MODELS) else None

    def rank(item: pytest.Item) -> tuple[int, int]:
        for i, model in enumerate(_MODELS):
            if item.nodeid.startswith(model):
                return 0, 1 + i  # behind the worlds, in their chain
        if group(item) is not None:
            return 0, 0
        return (2 if item.nodeid.startswith("tests/unit/") else 1), 0

    items.sort(key=rank)
    for item in items:
        if (name := group(item)) is not None:
            item.add_marker(pytest.mark.xdist_group(name))
    for marker in ("soak", "slow"):
        if config.getoption(f"--{marker}"):
            continue
        skip = pytest.mark.skip(reason=f"{marker} test: run with --{marker}")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)


def pytest_report_header(config: pytest.Config) -> str:
    """Which server the suite starts (TENURE_SERVER=redis|valkey|PATH picks another)."""
    try:
        binary = find_server_binary()
    except ConfigurationError as exc:
        return f"server: none ({exc})"
    try:
        said = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.split()
    except OSError as exc:
        return f"server: {binary} (--version failed: {exc})"
    # "Valkey server v=9.1.2 sha=..." / "Redis server v=6.2.14 sha=..."
    version = next((w[2:] for w in said if w.startswith("v=")), "?")
    name = said[0] if said else "?"
    return f"server: {name} {version} ({binary})"

"""Suite-wide options: long runs are opt-in.

``slow``: end-to-end runs that take tens of seconds or more (the full ``tenure verify
--quick``, ten seconds of watchdog extensions). The default run keeps a short version
of each, so CI still covers the behaviour; ``pytest --slow -m slow`` runs only the long
ones. ``soak``: the much longer model searches (``pytest --soak``).
"""

from __future__ import annotations

import subprocess

import pytest

from tenure._errors import ConfigurationError
from tenure.testing import find_server_binary

_WORLDS = (
    "tests/chaos/test_verify_runs.py",
    "tests/integration/test_demo.py",
    "tests/test_redis_6_2.py::test_verify_",
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
    # The second server's pass is the longest work of the run, in subprocesses: first,
    # so that a parallel run (pytest-xdist) does not start it last.
    items.sort(key=lambda item: "second_server" not in item.keywords)
    # Whole verifier worlds (nodes, proxies, worker processes, faults) with liveness
    # expectations ("some grants while a minority is cut off") run one at a time, on one
    # worker; so do the pieces of the second server's integration core (each a test run
    # of its own in a subprocess), on another: a parallel run never stacks several of
    # either on the same cores.
    for item in items:
        if item.nodeid.startswith(_WORLDS):
            item.add_marker(pytest.mark.xdist_group("worlds"))
        elif "second_server" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("second_server"))
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

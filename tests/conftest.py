"""Suite-wide options: long runs are opt-in.

``slow``: end-to-end runs that take tens of seconds or more (the full ``tenure verify
--quick``, ten seconds of watchdog extensions). The default run keeps a short version
of each, so CI still covers the behaviour; ``pytest --slow -m slow`` runs only the long
ones. ``soak``: the much longer model searches (``pytest --soak``).
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--soak", action="store_true", default=False, help="also run the long soak tests"
    )
    parser.addoption(
        "--slow", action="store_true", default=False, help="also run the slow end-to-end tests"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for marker in ("soak", "slow"):
        if config.getoption(f"--{marker}"):
            continue
        skip = pytest.mark.skip(reason=f"{marker} test: run with --{marker}")
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)

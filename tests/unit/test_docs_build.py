"""The API reference (docs/api, Sphinx autodoc) builds from the docstrings without a warning.

Warnings are errors (``-W``) and every cross-reference must resolve (``nitpicky`` in
docs/api/conf.py), so a docstring that no longer renders, or that names something gone,
fails here. The build runs in this process, under the unit tests' no-network guard, and
writes only to a temporary directory. Every name in the ``__all__`` of a documented
module must appear in the built pages: a new public name needs its docstring.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from warnings import catch_warnings, simplefilter

import pytest
from sphinx.cmd.build import build_main  # in the test extra: a missing Sphinx fails here

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "api"

# The modules the reference documents (docs/api/*.rst).
DOCUMENTED = [
    "tenure",
    "tenure.fencing",
    "tenure.fencing.http",
    "tenure.fencing.redis_store",
    "tenure.fencing.sql",
    "tenure.patterns",
    "tenure.patterns.idempotency",
    "tenure.patterns.optimistic",
    "tenure.patterns.streams",
    "tenure.testing",
    "tenure.testing.fake",
]


# One build per run: these tests run on one pytest-xdist worker, and a session fixture
# is not torn down when that worker runs other modules' tests in between.
pytestmark = pytest.mark.xdist_group("docs_build")


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the reference once; fail with Sphinx's warnings if there are any."""
    out = tmp_path_factory.mktemp("api")
    warnings = out / "warnings.txt"
    args = ["-W", "--keep-going", "-q", "-E", "-b", "html", "-w", str(warnings)]
    with catch_warnings():
        # Deprecations inside Sphinx and its extensions are theirs to fix, not a fault of
        # the docs (the suite turns Python warnings into errors); Sphinx's own warnings
        # about the docs go through its logging, which -W makes errors.
        simplefilter("ignore", DeprecationWarning)
        simplefilter("ignore", PendingDeprecationWarning)
        status = build_main([*args, "-d", str(out / "doctrees"), str(DOCS), str(out / "html")])
    text = warnings.read_text() if warnings.exists() else ""
    assert status == 0, f"sphinx-build failed:\n{text}"
    assert text == ""
    return out / "html"


def documented_names(html: Path) -> set[str]:
    """The full names of the objects the built pages describe (their anchors)."""
    names: set[str] = set()
    for page in html.glob("*.html"):
        names.update(re.findall(r'id="(tenure[\w.]*)"', page.read_text()))
    return names


def test_the_reference_builds_without_warnings(built: Path) -> None:
    assert (built / "index.html").exists()


@pytest.mark.parametrize("module", DOCUMENTED)
def test_every_public_name_is_documented(built: Path, module: str) -> None:
    names = documented_names(built)
    depth = module.count(".")

    def documented(name: str) -> bool:
        # Under the module itself, or under one of its submodules (tenure.patterns
        # documents each name where it is defined: tenure.patterns.optimistic.optimistic).
        return f"{module}.{name}" in names or any(
            n.startswith(f"{module}.") and n.endswith(f".{name}") and n.count(".") == depth + 2
            for n in names
        )

    missing = [n for n in importlib.import_module(module).__all__ if not documented(n)]
    assert missing == [], f"{module}: in __all__ but not in the API reference"


def test_a_missing_name_is_noticed(built: Path) -> None:
    assert "tenure.Client" in documented_names(built)
    assert "tenure.NoSuchClass" not in documented_names(built)

"""The library never imports the ``tenure`` command's applications.

``tenure.cli`` (``tenure run | status | check``, the argument parsing) sits on top of the
library and uses it as any program would; nothing below may depend on it, or the library
would drag the command along (and a change to a command could break a lock). The check
is static, like tests/unit/test_purity.py: every module outside ``tenure/cli/`` is parsed
with ``ast`` and each import, absolute or relative, resolved to the module it names, so
an import inside a function or an ``if TYPE_CHECKING`` block counts too.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

# The command's applications.
APPLICATIONS = ("tenure.cli",)
# Calls that import by name at run time (their first argument, when a literal, is checked).
DYNAMIC_IMPORTS = frozenset({"__import__", "import_module"})


def _package_dir() -> Path:
    # find_spec of a top-level name locates it without executing tenure/__init__.py.
    spec = importlib.util.find_spec("tenure")
    assert spec is not None
    assert spec.origin is not None
    return Path(spec.origin).parent


def library_modules() -> list[tuple[str, Path]]:
    """(dotted name, path) of every module of the package outside the applications."""
    root = _package_dir()
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = ["tenure", *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if not _is_application(name):
            found.append((name, path))
    assert found, "found no library modules"
    return found


def _is_application(module: str) -> bool:
    return any(module == app or module.startswith(app + ".") for app in APPLICATIONS)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    package = module.split(".") if is_package else module.split(".")[:-1]
    if level > 1:
        package = package[: len(package) - (level - 1)]
    return ".".join([*package, target] if target else package)


def application_imports(source: str, module: str, is_package: bool = False) -> list[str]:
    """Every import in ``source`` (the text of ``module``) that reaches an application."""
    bad: list[str] = []
    for node in ast.walk(ast.parse(source)):
        named: list[str] = []
        if isinstance(node, ast.Import):
            named = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (
                _resolve(module, is_package, node.level, node.module)
                if node.level
                else node.module or ""
            )
            # `from tenure import cli` names the module tenure.cli; `from tenure.cli import
            # main` names tenure.cli itself. Both are checked.
            named = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name in DYNAMIC_IMPORTS and node.args:
                first = node.args[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    named = [first.value]
        hits = sorted({n for n in named if _is_application(n)})
        if hits:
            bad.append(f"line {getattr(node, 'lineno', '?')}: {', '.join(hits)}")
    return bad


@pytest.mark.parametrize("module", [name for name, _ in library_modules()])
def test_the_library_never_imports_the_command(module: str) -> None:
    path = dict(library_modules())[module]
    source = path.read_text(encoding="utf-8")
    violations = application_imports(source, module, path.name == "__init__.py")
    assert violations == [], f"{module} imports the command's applications: {violations}"


def test_the_applications_are_there() -> None:
    """The check means something only if the package it keeps out exists."""
    assert (_package_dir() / "cli" / "__init__.py").exists()
    assert all(not _is_application(name) for name, _ in library_modules())


# --- the checker itself must catch what it claims to catch --------------------------------


@pytest.mark.parametrize(
    ("source", "module", "is_package"),
    [
        ("import tenure.cli", "tenure.fencing.http", False),
        ("import tenure.cli.run as r", "tenure.fencing.http", False),
        ("from tenure import cli", "tenure.fencing.http", False),
        ("from tenure.cli import main", "tenure.fencing.http", False),
        ("from tenure.cli.node_rules import Level", "tenure._core.acquire", False),
        ("from .cli import main", "tenure.local", False),
        ("from . import cli", "tenure", True),
        ("from .. import cli", "tenure.fencing.http", False),
        ("from ..cli.run import run", "tenure.patterns.streams", False),
        ("from ...cli import status", "tenure._core.x.y", False),
        ("def f():\n    from ..cli import main\n", "tenure.verify.world", False),
        ("if TYPE_CHECKING:\n    from tenure.cli.run import RunOptions\n", "tenure.x", False),
        ("importlib.import_module('tenure.cli.main')", "tenure.x", False),
        ("__import__('tenure.cli')", "tenure.x", False),
    ],
)
def test_checker_notices_an_import_of_the_command(
    source: str, module: str, is_package: bool
) -> None:
    assert application_imports(source, module, is_package) != []


@pytest.mark.parametrize(
    ("source", "module", "is_package"),
    [
        ("import tenure", "tenure.fencing.http", False),
        ("from tenure import Client", "tenure.fencing.http", False),
        ("from tenure.client_line import x", "tenure.fencing.http", False),
        ("from . import client", "tenure.fencing", True),
        ("from .cli import x", "tenure.fencing.http", False),  # tenure.fencing.cli
        ("from .. import _errors", "tenure.fencing.http", False),
        ("from ..testing.local import LocalNode", "tenure.verify.world", False),
        ("import clicks", "tenure.x", False),
    ],
)
def test_checker_accepts_library_imports(source: str, module: str, is_package: bool) -> None:
    assert application_imports(source, module, is_package) == []

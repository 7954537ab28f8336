"""The layers import in one direction only: ``_core`` <- ``_driver`` <- drivers <- the rest.

``_core`` is pure (``test_purity.py`` checks what it may not import from outside);
``_driver`` is the glue both drivers share and may use only the core; the blocking
driver (``_sync``) and the asyncio driver (``_async``) build on both and never on each
other; none of these four reaches up into the modules built on them (the public API,
``fencing``, ``patterns``, ``verify``, the command). Every module is parsed with ``ast``,
so an import inside a function or an ``if TYPE_CHECKING`` block counts too.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

# What each lower layer may import from inside the package (besides itself).
BASE = {"tenure._errors", "tenure._lua"}
ALLOWED: dict[str, set[str]] = {
    "_core": BASE | {"tenure._core"},
    "_driver": BASE | {"tenure._core", "tenure._driver"},
    "_sync": BASE | {"tenure._core", "tenure._driver", "tenure._sync"},
    "_async": BASE | {"tenure._core", "tenure._driver", "tenure._async"},
}


def _package_dir() -> Path:
    spec = importlib.util.find_spec("tenure")
    assert spec is not None
    assert spec.origin is not None
    return Path(spec.origin).parent


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(source: str, module: str, is_package: bool = False) -> set[str]:
    """The absolute names of every ``tenure`` module ``source`` (module ``module``) imports."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if node.module is None or target in {"tenure", *ALLOWED_PREFIXES}:
                # ``from . import x`` / ``from tenure import _core``: the names are modules.
                found.update(f"{target}.{a.name}" for a in node.names)
            else:
                found.add(target)
    return {name for name in found if name == "tenure" or name.startswith("tenure.")}


ALLOWED_PREFIXES = {f"tenure.{layer}" for layer in ALLOWED}


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``module`` that go the wrong way across the layers."""
    layer = module.split(".")[1] if module.count(".") >= 1 else ""
    if layer not in ALLOWED:
        return []
    allowed = ALLOWED[layer]
    return sorted(
        name
        for name in imported(source, module, is_package)
        if not any(name == ok or name.startswith(ok + ".") for ok in allowed)
    )


def _layer_modules() -> list[Path]:
    root = _package_dir()
    files = [p for layer in ALLOWED for p in sorted((root / layer).rglob("*.py"))]
    assert len(files) > 20, "found too few modules: has the layout changed?"
    return files


@pytest.mark.parametrize("path", _layer_modules(), ids=lambda p: p.parent.name + "/" + p.name)
def test_each_layer_imports_only_the_layers_below_it(path: Path) -> None:
    root = _package_dir()
    module = _module_name(path, root)
    bad = violations(path.read_text(), module, path.name == "__init__.py")
    assert not bad, f"{module} imports {bad} across the layers"


@pytest.mark.parametrize(
    ("module", "source", "bad"),
    [
        ("tenure._core.x", "from .._driver.clock import monotonic", ["tenure._driver.clock"]),
        ("tenure._core.x", "from .. import _sync", ["tenure._sync"]),
        ("tenure._driver.x", "from .._sync.links import LinkSet", ["tenure._sync.links"]),
        ("tenure._driver.x", "import tenure.fencing", ["tenure.fencing"]),
        ("tenure._sync.x", "from .._async.drive import adrive", ["tenure._async.drive"]),
        (
            "tenure._async.x",
            "def f():\n    from tenure._sync import client",
            ["tenure._sync.client"],
        ),
        ("tenure._sync.x", "from ..patterns import streams", ["tenure.patterns"]),
        ("tenure._sync.x", "from .._core.flows import drive\nfrom .links import X", []),
        ("tenure._driver.x", "from .._core import flows\nfrom .clock import wall_us", []),
    ],
)
def test_the_check_finds_a_planted_violation(module: str, source: str, bad: list[str]) -> None:
    assert violations(source, module) == bad

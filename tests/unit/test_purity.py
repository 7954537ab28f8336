"""The core does no I/O: it imports nothing that talks to the network, the clock or the OS.

The real check is static: every module of ``tenure._core`` is parsed with ``ast`` and its
imports compared with a deny list, so a forbidden import fails the suite even inside a
function body or an ``if TYPE_CHECKING`` block. A runtime check backs it up: a fresh
interpreter imports the core modules *without* running ``tenure/__init__.py`` (which pulls
in the drivers) and reports which I/O modules got loaded.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

FORBIDDEN = frozenset(
    {"redis", "socket", "asyncio", "time", "threading", "select", "selectors", "subprocess", "os"}
)
# What a core module may reach outside ``_core`` (relative ``..X`` or absolute ``tenure.X``).
ALLOWED_OUTSIDE = frozenset({"_errors", "_lua"})
# Calls that import by name at run time, which the static check could not see through.
DYNAMIC_IMPORTS = frozenset({"__import__", "import_module"})


def _package_dir() -> Path:
    # find_spec of a top-level name locates it without executing tenure/__init__.py.
    spec = importlib.util.find_spec("tenure")
    assert spec is not None
    assert spec.origin is not None
    return Path(spec.origin).parent


def core_modules() -> list[Path]:
    files = sorted((_package_dir() / "_core").rglob("*.py"))
    assert files, "found no modules in tenure._core"
    return files


def _outside_target(level: int, module: str | None, names: list[str]) -> list[str]:
    """For a relative import from a ``_core`` module, what it names outside ``_core``."""
    if level == 1:
        return []  # inside _core
    if level >= 3:
        return [f"{'.' * level}{module or ''}"]  # beyond the tenure package
    if module is None:  # from .. import x, y
        return names
    return [module]


def import_violations(source: str, filename: str = "<string>") -> list[str]:
    """Every import in ``source`` that a pure-core module must not make."""
    tree = ast.parse(source, filename=filename)
    bad: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in FORBIDDEN or (top == "tenure" and not _absolute_allowed(alias.name)):
                    bad.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            where = f"line {node.lineno}: from {'.' * node.level}{node.module or ''} import"
            if node.level == 0:
                assert node.module is not None
                top = node.module.split(".")[0]
                if top in FORBIDDEN:
                    bad.append(f"{where} {', '.join(names)}")
                elif top == "tenure":
                    if node.module == "tenure":
                        outside = [n for n in names if n not in ALLOWED_OUTSIDE | {"_core"}]
                        if outside:
                            bad.append(f"{where} {', '.join(outside)}")
                    elif not _absolute_allowed(node.module):
                        bad.append(f"{where} {', '.join(names)}")
            else:
                for target in _outside_target(node.level, node.module, names):
                    if target.split(".")[0] not in ALLOWED_OUTSIDE:
                        bad.append(f"{where} ... (reaches {target!r} outside _core)")
        elif isinstance(node, ast.Call):
            func = node.func
            name = (
                func.id
                if isinstance(func, ast.Name)
                else func.attr
                if isinstance(func, ast.Attribute)
                else None
            )
            if name in DYNAMIC_IMPORTS:
                bad.append(f"line {node.lineno}: dynamic import via {name}()")
    return bad


def _absolute_allowed(module: str) -> bool:
    parts = module.split(".")
    return len(parts) >= 2 and (parts[1] == "_core" or parts[1] in ALLOWED_OUTSIDE)


@pytest.mark.parametrize("path", core_modules(), ids=lambda p: p.name)
def test_core_module_imports_no_io(path: Path) -> None:
    violations = import_violations(path.read_text(encoding="utf-8"), str(path))
    assert violations == [], f"{path.name} imports I/O or non-core modules: {violations}"


@pytest.mark.parametrize("relative", ["_errors.py", "_lua/__init__.py"])
def test_modules_the_core_depends_on_import_no_network(relative: str) -> None:
    path = _package_dir() / relative
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            pytest.fail(f"{relative} imports relatively ({node.module}); keep it a leaf module")
    assert not imported & FORBIDDEN, f"{relative} imports {sorted(imported & FORBIDDEN)}"


# --- the checker itself must catch what it claims to catch --------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "import redis",
        "import redis.asyncio",
        "import socket",
        "import asyncio as aio",
        "import time",
        "import threading",
        "import select",
        "import selectors",
        "import subprocess",
        "import os",
        "import os.path",
        "from time import monotonic",
        "from os import environ",
        "from redis.exceptions import ResponseError",
        "from asyncio import sleep",
        "def f():\n    import socket\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import redis\n",
        "from .. import _sync",
        "from .. import _errors, _sync",
        "from .._sync import client",
        "from .._async.client import AsyncClient",
        "from ..local import LocalCluster",
        "from ... import anything",
        "from ...x import y",
        "import tenure._sync.client",
        "from tenure import Client",
        "from tenure._sync import client",
        "import tenure",
        "__import__('socket')",
        "import importlib\nimportlib.import_module('redis')",
    ],
)
def test_checker_rejects_forbidden_import(source: str) -> None:
    assert import_violations(source) != []


@pytest.mark.parametrize(
    "source",
    [
        "import math\nimport random\nimport enum",
        "from dataclasses import dataclass",
        "from urllib.parse import urlsplit",
        "from . import quorum",
        "from .quorum import Round",
        "from .._errors import ConfigurationError",
        "from .._lua import script",
        "from .. import _errors, _lua",
        "from tenure._errors import LockError",
        "from tenure._core.quorum import majority",
        "import tenure._core.quorum",
        "import timeit_is_not_time",
        "from ostrich import feather",
    ],
)
def test_checker_accepts_pure_imports(source: str) -> None:
    assert import_violations(source) == []


# --- runtime cross-check -----------------------------------------------------------------

_PROBE = """
import importlib.util, json, sys, types
# (threading is left out: the stdlib's zipfile, used by importlib.resources, imports it)
io = {"redis", "socket", "asyncio", "selectors", "select", "ssl", "subprocess"}
before = {m for m in sys.modules if m.split(".")[0] in io}
spec = importlib.util.find_spec("tenure")
stub = types.ModuleType("tenure")  # stands in for tenure/__init__.py, which loads drivers
stub.__path__ = list(spec.submodule_search_locations)
sys.modules["tenure"] = stub
import tenure._core.acquire, tenure._core.commands, tenure._core.config
import tenure._core.lease, tenure._core.policy, tenure._core.quorum
import pkgutil
for info in pkgutil.iter_modules(sys.modules["tenure._core"].__path__):
    importlib.import_module("tenure._core." + info.name)
tenure._core.commands.release("k", "t")  # loads the Lua scripts too
after = {m for m in sys.modules if m.split(".")[0] in io}
print(json.dumps(sorted(after - before)))
"""


def test_importing_the_core_loads_no_io_module() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []


# --- the network guard of conftest.py -----------------------------------------------------


def test_network_guard_blocks_create_connection() -> None:
    with pytest.raises(pytest.fail.Exception, match="must not use the network"):
        socket.create_connection(("127.0.0.1", 6379), timeout=0.01)


def test_network_guard_blocks_socket_connect() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        with pytest.raises(pytest.fail.Exception, match="must not use the network"):
            s.connect(("127.0.0.1", 6379))
        with pytest.raises(pytest.fail.Exception, match="must not use the network"):
            s.connect_ex(("127.0.0.1", 6379))


def _connect_swallowing_exceptions() -> bool:
    """What a careless driver does: True if ``except Exception`` caught the guard."""
    try:
        socket.create_connection(("127.0.0.1", 6379))
    except Exception:
        return True
    return False


def test_network_guard_is_not_swallowed_by_except_exception() -> None:
    with pytest.raises(pytest.fail.Exception):
        _connect_swallowing_exceptions()

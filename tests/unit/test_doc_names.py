"""The names that the docs and the module headers put in backticks exist in the code.

The READMEs and docs/*.md write code as `name`, module docstrings as ``name``; either goes
stale when the code it describes is renamed or removed. This collects every backticked
token that looks like a Python name (``Round.set_up_wait``, ``LinkSet``, ``fence()``,
``tests/unit/test_x.py::test_y``) and checks it against what the repository has:

* a test name (``test_...``) must be a test function in tests/;
* a dotted name starting with ``tenure.`` must import and resolve;
* a CamelCase name must be defined, imported or used in the code of src/, tests/ or
  benchmarks/ (a builtin counts; a word inside a string does not);
* any other name must appear there (in code, or in a string such as a CLI option or a
  JSON field), or among the few outside names below.

ALL-CAPS tokens (Redis commands, signals, environment variables) and file names are not
checked: they are not Python names.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "tenure"
TESTS = ROOT / "tests"
BENCHMARKS = ROOT / "benchmarks"

# Names from outside the repository that the prose uses in backticks: redis-py's TLS
# options, and the shell's.
OUTSIDE = frozenset({"ssl_certfile", "ssl_keyfile", "ssl_check_hostname", "grep"})

IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(\(\))?$")
FILE = re.compile(r"\.(py|md|h|lua|inc|json|toml|txt|html|svg|sh)$")
CAPS = re.compile(r"^[A-Z0-9_]+$")
CAMEL = re.compile(r"^_?[A-Z][a-z0-9]+[A-Za-z0-9]*$")


def _python_files(*roots: Path) -> Iterator[Path]:
    for root in roots:
        # Not this file: its examples of missing names would count as present.
        yield from (p for p in sorted(root.rglob("*.py")) if p != Path(__file__).resolve())


@cache
def _names() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(code, mentioned, tests) for src/, tests/ and benchmarks/.

    code: the names the code defines, imports or uses; mentioned: those and every word in
    its strings and Lua scripts; tests: the test functions.
    """
    defined: set[str] = set(dir(builtins))
    mentioned: set[str] = set()
    tests: set[str] = set()
    for path in _python_files(SRC, TESTS, BENCHMARKS):
        defined.add(path.stem)
        defined.update(p.name for p in path.parents)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
                if node.name.startswith("test_") and path.is_relative_to(TESTS):
                    tests.add(node.name)
                if not isinstance(node, ast.ClassDef):
                    args = node.args
                    defined.update(a.arg for a in args.posonlyargs + args.args)
                    defined.update(a.arg for a in args.kwonlyargs)
            elif isinstance(node, ast.Name):
                defined.add(node.id)
            elif isinstance(node, ast.Attribute):
                defined.add(node.attr)
            elif isinstance(node, ast.keyword) and node.arg:
                defined.add(node.arg)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    defined.update(alias.name.split("."))
                    defined.add(alias.asname or alias.name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                # CLI options, JSON fields, Lua: words inside strings count as mentioned.
                mentioned.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", node.value))
    for path in sorted(SRC.rglob("*.lua*")):
        mentioned.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text()))
    return frozenset(defined), frozenset(mentioned | defined), frozenset(tests)


def _backticked(text: str, double: bool) -> Iterator[str]:
    if not double:
        text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # code blocks: examples
    pattern = r"``([^`\n]+)``" if double else r"(?<!`)`([^`\n]+)`(?!`)"
    for match in re.finditer(pattern, text):
        token = match.group(1)
        if node := re.match(r"^[\w/.-]+\.py::(\w+)$", token):  # tests/x.py::test_y
            yield node.group(1)
        elif IDENT.match(token) and not FILE.search(token) and not CAPS.match(token):
            yield token


def _sources() -> Iterator[tuple[str, str]]:
    """(where, token) for every backticked name in the README, docs/*.md, benchmarks'
    README and the module docstrings."""
    pages = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
    for path in pages + sorted((ROOT / "docs").glob("*.md")):
        for token in _backticked(path.read_text(), double=False):
            yield str(path.relative_to(ROOT)), token
    for path in _python_files(SRC):
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path)))
        for token in _backticked(doc or "", double=True):
            yield str(path.relative_to(ROOT)), token


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def unknown(token: str) -> str | None:
    """Why ``token`` names nothing in the repository, or None when it does."""
    defined, mentioned, tests = _names()
    name = token.removesuffix("()")
    if name.startswith("test_"):
        return None if name in tests else "no test function of that name in tests/"
    if name.startswith("tenure.") and not name.startswith("tenure.key"):  # a stream field
        return None if _resolves(name) else "does not import"
    for part in name.split("."):
        if part in OUTSIDE or CAPS.match(part):
            continue
        if CAMEL.match(part) and part not in defined:
            return f"{part!r} is not defined, imported or used in the code"
        if part not in mentioned:
            return f"{part!r} appears nowhere in the code"
    return None


def test_every_backticked_name_exists() -> None:
    stale = sorted(
        {f"{where}: `{token}`: {why}" for where, token in _sources() if (why := unknown(token))}
    )
    assert not stale, "names in the docs that the code no longer has:\n" + "\n".join(stale)


@pytest.mark.parametrize(
    "token",
    [
        "LinkSet.run",
        "Round.set_up_wait",
        "tenure.fencing.FencedStore",
        "fence()",
        "test_" + "mutual_exclusion_across_processes",
    ],
)
def test_names_that_exist_pass(token: str) -> None:
    assert unknown(token) is None


@pytest.mark.parametrize(
    "token",
    ["ReaderTask", "Channel.read_forever", "tenure.fencing.Nothing", "test_" + "no_such_test"],
)
def test_names_that_do_not_exist_are_caught(token: str) -> None:
    assert unknown(token) is not None

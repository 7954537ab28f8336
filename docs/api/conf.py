"""Sphinx configuration of the API reference, built from the docstrings.

Build it with ``sphinx-build -W -b html docs/api build/api`` (warnings are errors); the
unit test tests/unit/test_docs_build.py builds it the same way on every test run, so a
docstring that no longer renders, or a cross-reference to a name that is gone, fails CI.
Nothing here reaches the network: no intersphinx, no themes to fetch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# The tree being documented, not whatever tenure is installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

project = "tenure"
author = "tenure developers"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]

# The docstrings are Google style (Args/Returns/Raises/Attributes) with reST inside.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # Attributes: as fields, not as objects that autodoc adds again
napoleon_use_rtype = False

autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": True}
autodoc_typehints = "signature"
autodoc_preserve_defaults = True

html_theme = "alabaster"  # ships with Sphinx
html_static_path: list[str] = []
exclude_patterns = ["_build"]

# Every cross-reference must resolve, except to what this reference does not document:
# other libraries (no intersphinx: the build stays offline), tenure's private modules
# (they show up in signatures), type variables, and names that the docstrings' modules
# import only for type checking (they reach the signatures unqualified).
nitpicky = True
_OUTSIDE = (
    "_thread|asyncio|collections|concurrent|contextlib|datetime|enum|http|httpx|os|"
    "pathlib|random|redis|socket|sqlalchemy|subprocess|threading|types|typing"
)
nitpick_ignore_regex = [
    (r"py:(class|exc|obj|data|func|meth)", rf"({_OUTSIDE})(\..+)?"),
    (r"py:(class|exc|obj|data|func|meth|mod)", r"tenure\.(.+\.)?_\w+(\..+)?"),
    (r"py:(class|obj)", r"(tenure\.[\w.]+\.)?[A-Z]"),  # TypeVars: T, R, P
    (r"py:class", r"Connection|Session|Table|MetaData|ColumnElement|Scope|datetime"),
]


def _resolve_by_suffix(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve ``:class:`Lease``` written in a module where the name is not defined: a
    package's docstring naming what it re-exports, a submodule's naming what its package
    documents. The one documented object whose full name ends with the target wins; none
    or several leave the reference unresolved (a warning, so an error)."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    domain = env.get_domain("py")
    found = [n for n in domain.objects if n == target or n.endswith("." + target)]
    if len(found) != 1:
        return None
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], found[0], node, contnode
    )


def _dataclass_factories(
    app: Any, what: str, name: str, obj: Any, options: Any, signature: Any, annotation: Any
) -> Any:
    """Show a dataclass field's ``default_factory`` default as ``...``: Python renders it
    ``<factory>``, which is not Python, so Sphinx cannot parse the signature and splits
    it at every comma, inside ``list[tuple[str, str]]`` too (a warning, so an error)."""
    if signature and "<factory>" in signature:
        return signature.replace("<factory>", "..."), annotation
    return None


def setup(app: Any) -> None:
    app.connect("missing-reference", _resolve_by_suffix)
    app.connect("autodoc-process-signature", _dataclass_factories)

"""docs/architecture.md's map of the package (the block under "Layers") is the real tree.

Every module, package and script the map names exists under src/tenure, and every one
that exists is named in the map, so a module added, moved or removed fails here until
the map says so. The map's format: one entry a line, indented two spaces a level under
its folder (``name/``), names first (several separated by ", "), then two or more spaces
and what they hold; a line indented to the description column or beyond continues the
description above.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
PACKAGE = ROOT / "src" / "tenure"
# Lines indented this far or more continue a description; entries stand left of it.
DESCRIPTION_COLUMN = 20
# What the map counts as a module of the tree (package __init__.py files go without saying).
MAPPED = ("*.py", "*.lua", "*.lua.inc")


def layers_block(markdown: str) -> str:
    """The first fenced block after the "## Layers" heading."""
    after = markdown.split("\n## Layers\n", 1)[1]
    match = re.search(r"^```\n(.*?)^```", after, flags=re.M | re.S)
    assert match is not None, "no fenced block under ## Layers"
    return match.group(1)


def map_entries(block: str) -> list[str]:
    """The paths the map names, relative to its root line (``src/tenure/``); folders end
    with ``/``."""
    lines = block.splitlines()
    assert lines, "the map is empty"
    assert lines[0].startswith("src/tenure/"), "the map starts at src/tenure/"
    folders: list[str] = []  # the folder open at each depth
    entries: list[str] = []
    for line in lines[1:]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" "))
        if indent >= DESCRIPTION_COLUMN:
            continue  # a description continued
        assert indent % 2 == 0, f"odd indentation: {line!r}"
        assert indent >= 2, f"an entry outside src/tenure/: {line!r}"
        depth = indent // 2
        assert depth <= len(folders) + 1, f"deeper than its folder: {line!r}"
        del folders[depth - 1 :]
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        parent = "".join(folders)
        for name in (n.strip() for n in names.split(",")):
            entries.append(parent + name)
        if names.endswith("/"):
            folders.append(names)
    return entries


def missing_from_tree(entries: list[str], root: Path) -> list[str]:
    """The entries that name nothing under ``root``."""
    return [
        e for e in entries if not ((root / e).is_dir() if e.endswith("/") else (root / e).is_file())
    ]


def missing_from_map(entries: list[str], root: Path) -> list[str]:
    """The modules and scripts under ``root`` that the map does not name."""
    named = set(entries)
    found = {
        str(path.relative_to(root))
        for pattern in MAPPED
        for path in root.rglob(pattern)
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    }
    return sorted(found - named)


def test_every_path_in_the_map_exists() -> None:
    entries = map_entries(layers_block(DOC.read_text(encoding="utf-8")))
    assert missing_from_tree(entries, PACKAGE) == [], (
        "docs/architecture.md names modules that do not exist"
    )


def test_every_module_is_in_the_map() -> None:
    entries = map_entries(layers_block(DOC.read_text(encoding="utf-8")))
    assert missing_from_map(entries, PACKAGE) == [], "docs/architecture.md's map misses these"

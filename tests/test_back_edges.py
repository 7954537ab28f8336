"""No loop in tenure's code can be left by a Ctrl-C without its cleanup (``back_edges``).

Run under this interpreter and under every CPython 3.13 or later the machine has (on
PATH as ``python3.N``, or installed by pyenv), since the flaw it guards against is in
how 3.13 compiles loops and the tests may run on an earlier one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHECK = Path(__file__).resolve().parent / "back_edges.py"


def _version(python: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None  # (a pyenv shim for a version not selected fails: not an interpreter)
    return int(out[0]), int(out[1])


def _interpreters() -> list[Any]:
    """This interpreter, and the other CPythons 3.13 or later found here."""
    found: list[Any] = [pytest.param(sys.executable, id="this interpreter")]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    candidates = [shutil.which(f"python3.{minor}") for minor in range(13, 20)]
    if pyenv.is_dir():
        for installed in sorted(pyenv.iterdir()):
            match = re.fullmatch(r"3\.(\d+)\.\d+", installed.name)
            if match and int(match[1]) >= 13:
                candidates.append(str(installed / "bin" / "python3"))
    seen = {os.path.realpath(sys.executable)}
    for python in candidates:
        if python is None or os.path.realpath(python) in seen or not os.access(python, os.X_OK):
            continue
        version = _version(python)
        if version is not None and version >= (3, 13):
            seen.add(os.path.realpath(python))
            found.append(pytest.param(python, id=f"python{version[0]}.{version[1]} ({python})"))
    return found


@pytest.mark.parametrize("python", _interpreters())
def test_no_loop_leaves_its_cleanup_to_an_interrupt(python: str) -> None:
    result = subprocess.run(
        [python, str(CHECK), str(ROOT / "src" / "tenure")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    version = tuple(report["version"])
    if version < (3, 13):
        pytest.skip(f"Python {version[0]}.{version[1]} raises at a back-edge inside its block")
    if not report["samples"]["finally"]:
        pytest.skip(f"Python {'.'.join(map(str, version))} compiles back-edges inside their block")
    # The check at work: what it must find, found; what it must not, not.
    assert report["samples"] == {"finally": True, "narrow except": False, "apart": False}
    assert report["findings"] == [], "\n".join(report["findings"])

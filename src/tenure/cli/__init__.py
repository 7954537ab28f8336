"""The ``tenure`` command's applications: ``tenure run | status | check | demo | verify``.

Nothing in the library imports this package: it sits on top, using the library as any
program would (a unit test, tests/unit/test_layers.py, enforces that). ``main`` is the
console entry point (``tenure = "tenure.cli:main"``); ``python -m tenure.cli`` runs it
too.
"""

from __future__ import annotations

from .main import main

__all__ = ["main"]

"""``python -m tenure.cli``: the ``tenure`` command."""

from __future__ import annotations

import sys

from .main import main

# Guarded: tools that import every module (pkgutil.walk_packages) must not run it.
if __name__ == "__main__":
    sys.exit(main())

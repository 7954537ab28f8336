"""The old path of :mod:`tenure.testing.local`, kept working: import from there instead."""

from __future__ import annotations

from tenure.testing.local import (
    DIE_WITH_PARENT,
    LocalCluster,
    LocalNode,
    LocalNodeError,
    Persistence,
    find_server_binary,
)

__all__ = [
    "DIE_WITH_PARENT",
    "LocalCluster",
    "LocalNode",
    "LocalNodeError",
    "Persistence",
    "find_server_binary",
]

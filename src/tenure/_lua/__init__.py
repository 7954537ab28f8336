"""Lua scripts shipped as package data, loaded once per process as plain values.

A ``Script`` is its source and SHA1, not bound to any client: drivers call it with
EVALSHA and, on ``NOSCRIPT`` (a node restarted or ran SCRIPT FLUSH), resend the source
with EVAL on the same connection within the same round's deadline.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib.resources import files

__all__ = ["Script", "script"]


@dataclass(frozen=True)
class Script:
    name: str
    source: bytes
    sha1: str


@cache
def script(name: str) -> Script:
    """The script ``<name>.lua`` from this package."""
    source = files(__name__).joinpath(f"{name}.lua").read_bytes()
    return Script(name=name, source=source, sha1=hashlib.sha1(source).hexdigest())

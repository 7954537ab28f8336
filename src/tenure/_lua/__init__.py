"""Lua scripts shipped as package data, loaded once per process as plain values.

A ``Script`` is its name and source, not bound to any client. Drivers send it with EVAL
(see ``_core.commands`` for why not EVALSHA); Redis caches the compiled script by its
SHA1 either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files

__all__ = ["Script", "script"]


@dataclass(frozen=True)
class Script:
    name: str
    source: bytes


@cache
def script(name: str) -> Script:
    """The script ``<name>.lua`` from this package."""
    source = files(__name__).joinpath(f"{name}.lua").read_bytes()
    return Script(name=name, source=source)

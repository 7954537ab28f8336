"""Lua scripts shipped as package data, loaded once per process as plain values.

A ``Script`` is its name and source, not bound to any client. Drivers send it with EVAL
(see ``_core.commands`` for why not EVALSHA); Redis caches the compiled script by its
SHA1 either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files

__all__ = ["Script", "expand", "script"]


@dataclass(frozen=True)
class Script:
    """``source`` is the file as written; ``wire`` is what is sent: the same code, with its
    ``--@include`` fragments pasted in, without its comment lines (a third of the bytes
    to send and for the server to hash per call)."""

    name: str
    source: bytes
    wire: bytes


def expand(source: bytes) -> bytes:
    """Replace each ``--@include NAME`` line with the fragment ``NAME.lua.inc`` (shared Lua
    functions: Redis scripts cannot import one another)."""
    out = []
    for line in source.splitlines():
        if line.startswith(b"--@include "):
            name = line.split()[1].decode()
            out.append(files(__name__).joinpath(f"{name}.lua.inc").read_bytes().rstrip())
        else:
            out.append(line)
    return b"\n".join(out)


@cache
def script(name: str) -> Script:
    """The script ``<name>.lua`` from this package."""
    source = files(__name__).joinpath(f"{name}.lua").read_bytes()
    wire = b"\n".join(
        line for line in expand(source).splitlines() if not line.lstrip().startswith(b"--")
    ).strip()
    return Script(name=name, source=source, wire=wire)

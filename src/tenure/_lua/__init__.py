"""Lua scripts shipped as package data, loaded once per process as plain values.

A ``Script`` is its name and source, not bound to any client. Drivers send it by EVALSHA
or by EVAL (``_core.commands`` says which, and why); Redis caches the compiled script by
its SHA1 either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib.resources import files

__all__ = ["Script", "expand", "script", "wire_form"]


@dataclass(frozen=True)
class Script:
    """``source`` is the file as written; ``wire`` is what is sent: the same code, with its
    ``--@include`` fragments pasted in, without its comment lines, blank lines and
    indentation (Redis hashes the whole body of every EVAL: the wire form of
    ``acquire.lua`` is half the bytes of its expanded source)."""

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


def wire_form(source: bytes) -> bytes:
    """``source`` as sent: its code lines only (``--@include`` expanded), each stripped.

    Stripping is safe because a Lua line break between tokens is whitespace like any
    other, and our scripts have no token that spans lines (a long string or comment
    ``[[...]]``, a backslash-continued string): those are refused here rather than
    silently changed.
    """
    code = []
    for line in expand(source).splitlines():
        text = line.strip()
        # A long bracket opens with [[ or [=...[ (in code or after --, a block comment).
        if b"[[" in text or b"[=" in text or text.endswith(b"\\"):
            raise ValueError(f"a Lua token spans lines here, keep its indentation: {text!r}")
        if text and not text.startswith(b"--"):
            code.append(text)
    return b"\n".join(code)


@cache
def script(name: str) -> Script:
    """The script ``<name>.lua`` from this package."""
    source = files(__name__).joinpath(f"{name}.lua").read_bytes()
    return Script(name=name, source=source, wire=wire_form(source))

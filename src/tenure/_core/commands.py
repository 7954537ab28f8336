"""The Redis commands of each round, packed once per round, and what their replies mean.

Both drivers send these exact bytes to every node (the command is the same on each) and
classify each reply with the same functions, so the protocol lives here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from .._lua import script

__all__ = ["Command", "acquire", "exists", "extend", "pack", "release"]


def pack(*args: bytes | str | int) -> bytes:
    """Encode one command in RESP (an array of bulk strings)."""
    return b"*%d\r\n" % len(args) + _bulk(args)


def _bulk(args: tuple[bytes | str | int, ...]) -> bytes:
    out = []
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


@cache
def _eval_head(name: str, argc: int) -> bytes:
    # The script source is the bulk of every EVAL: encode it once, not per call.
    return b"*%d\r\n" % (argc + 3) + _bulk(("EVAL", script(name).source, 1))


@dataclass(frozen=True)
class Command:
    """A round's command, already packed."""

    packed: bytes

    def is_yes(self, reply: object) -> bool:
        # SET NX answers OK or nil; the scripts answer 1 or 0; EXISTS answers 1 or 0.
        return reply == b"OK" or reply == 1 or reply == "OK"


def _eval(name: str, key: str, *args: bytes | str | int) -> Command:
    # EVAL with the source, not EVALSHA. A release is sent to every node but only a
    # majority of replies is awaited; after SCRIPT FLUSH or a restart, EVALSHA on a node
    # nobody waits for would answer NOSCRIPT and its follow-up EVAL would never be sent,
    # leaving our key there until its TTL. EVAL cannot fail that way, and costs the same
    # on the server (it hashes the body and reuses the compiled script): measured equal
    # within noise on loopback, see docs/architecture.md.
    return Command(_eval_head(name, len(args) + 1) + _bulk((key, *args)))


def acquire(key: str, token: str, ttl_ms: int) -> Command:
    return Command(pack("SET", key, token, "NX", "PX", ttl_ms))


def release(key: str, token: str) -> Command:
    return _eval("release", key, token)


def extend(key: str, token: str, ttl_ms: int) -> Command:
    return _eval("extend", key, token, ttl_ms)


def exists(key: str) -> Command:
    return Command(pack("EXISTS", key))

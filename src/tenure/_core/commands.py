"""The Redis commands of each round, packed once per round, and what their replies mean.

Both drivers send these exact bytes to every node (the command is the same on each) and
classify each reply with the same functions, so the protocol lives here once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, lru_cache

from .._lua import script
from .config import LockKeys

__all__ = ["Command", "acquire", "exists", "extend", "pack", "release", "seed"]


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
def _eval_head(name: str, numkeys: int, argc: int) -> bytes:
    # The script source is the bulk of every EVAL: encode it once, not per call.
    return b"*%d\r\n" % (3 + argc) + _bulk(("EVAL", script(name).wire, numkeys))


def _eval(name: str, keys: tuple[str, ...], *args: bytes | str | int) -> bytes:
    # EVAL with the source, not EVALSHA. A release is sent to every node but only a
    # majority of replies is awaited; after SCRIPT FLUSH or a restart, EVALSHA on a node
    # nobody waits for would answer NOSCRIPT and its follow-up EVAL would never be sent,
    # leaving our key there until its TTL. EVAL cannot fail that way, and costs the same
    # on the server (it hashes the body and reuses the compiled script): measured equal
    # within noise on loopback, see docs/architecture.md.
    return _eval_head(name, len(keys), len(keys) + len(args)) + _bulk((*keys, *args))


Info = tuple[int, int] | None


def _yes_if_one(reply: object) -> tuple[bool, Info]:
    # The release/extend/seed scripts and EXISTS answer 1 or 0.
    return reply == 1, None


def _acquire_reply(reply: object) -> tuple[bool, Info]:
    # acquire.lua answers {status, number}; status 1 is a grant.
    if isinstance(reply, list) and len(reply) == 2:
        status, number = int(reply[0]), int(reply[1])
        return status == 1, (status, number)
    return False, None


@dataclass(frozen=True)
class Command:
    """A round's command, already packed, and how to read a node's reply to it."""

    packed: bytes
    parse: Callable[[object], tuple[bool, Info]] = _yes_if_one

    def is_yes(self, reply: object) -> bool:
        return self.parse(reply)[0]


@lru_cache(maxsize=4096)
def _acquire_head(keys: LockKeys) -> bytes:
    # Everything but the per-attempt arguments, encoded once per lock name.
    return _eval_head("acquire", 3, 8) + _bulk((keys.lock, keys.fence, keys.warm))


def acquire(
    keys: LockKeys, token: str, ttl_ms: int, proposal: int, mark: int, mark_ms: int
) -> Command:
    args = (token, ttl_ms, proposal, mark, mark_ms)
    return Command(_acquire_head(keys) + _bulk(args), _acquire_reply)


def seed(keys: LockKeys, counter: int, warm_ms: int, marks: frozenset[int]) -> Command:
    return Command(_eval("seed", (keys.fence, keys.warm), counter, warm_ms, *sorted(marks)))


def release(key: str, token: str) -> Command:
    return Command(_eval("release", (key,), token))


def extend(key: str, token: str, ttl_ms: int) -> Command:
    return Command(_eval("extend", (key,), token, ttl_ms))


def exists(key: str) -> Command:
    return Command(pack("EXISTS", key))

"""A fake Redis node for the model tests: the lock's keys, their expiry, and the scripts.

Only what tenure's scripts touch is imitated, on an integer-millisecond clock passed in
by the caller (the model's fake time), with Redis's own rules:

* a key set with ``PX ttl`` at ``t`` expires when ``now > t + ttl`` (``keyIsExpired``:
  ``now > when``), so it still exists at ``t + ttl`` itself;
* ``PTTL`` answers -2 for a missing key, -1 for a key without expiry, and otherwise the
  milliseconds left, never below 0;
* a script runs atomically, at one instant.

Each ``*_lua`` function below follows its script in ``src/tenure/_lua`` line by line, so a
reader can check one against the other; ``tests/unit/test_fake_node.py`` pins every
return branch. A node that restarts without its data is ``wipe()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tenure._core.config import LockKeys

__all__ = [
    "Bus",
    "FakeNode",
    "acquire_lua",
    "acquire_wait_lua",
    "extend_lua",
    "handoff_lua",
    "release_lua",
    "release_wait_lua",
    "seed_lua",
]


@dataclass
class FakeNode:
    """Keys -> (value, absolute expiry in ms or None), read at the caller's ``now``."""

    data: dict[str, tuple[str, int | None]] = field(default_factory=dict)

    def _live(self, key: str, now: int) -> tuple[str, int | None] | None:
        entry = self.data.get(key)
        if entry is not None and entry[1] is not None and now > entry[1]:
            del self.data[key]  # Redis expires lazily on access (or actively; same answers)
            return None
        return entry

    def get(self, key: str, now: int) -> str | None:
        entry = self._live(key, now)
        return None if entry is None else entry[0]

    def exists(self, key: str, now: int) -> int:
        return int(self._live(key, now) is not None)

    def set(self, key: str, value: str | int, now: int, px: int | None = None) -> None:
        """SET key value [PX px]: a plain SET drops any previous expiry."""
        assert px is None or px > 0, "Redis refuses PX <= 0"
        self.data[key] = (str(value), None if px is None else now + px)

    def pttl(self, key: str, now: int) -> int:
        entry = self._live(key, now)
        if entry is None:
            return -2
        if entry[1] is None:
            return -1
        return max(entry[1] - now, 0)

    def pexpire(self, key: str, ms: int, now: int) -> int:
        entry = self._live(key, now)
        if entry is None:
            return 0
        self.data[key] = (entry[0], now + ms)
        return 1

    def delete(self, key: str, now: int) -> int:
        existed = self._live(key, now) is not None
        self.data.pop(key, None)
        return int(existed)

    def incr(self, key: str, now: int) -> int:
        """INCR (only the naive scheme the model rejects uses it)."""
        entry = self._live(key, now)
        value = int(entry[0]) + 1 if entry is not None else 1
        self.data[key] = (str(value), entry[1] if entry is not None else None)
        return value

    def wipe(self) -> None:
        """Restart without persistence: every key is gone."""
        self.data.clear()

    def counter(self, keys: LockKeys, now: int) -> int | None:
        value = self.get(keys.fence, now)
        return None if value is None else int(value)


def acquire_lua(
    node: FakeNode,
    keys: LockKeys,
    token: str,
    ttl_ms: int,
    proposal: int,
    now: int,
    mark: int = 1,
    mark_ms: int = 60_000,
) -> list[int]:
    """``acquire.lua``: KEYS lock, fence, warm; ARGV token, ttl_ms, proposal, mark, mark_ms."""
    counter = node.get(keys.fence, now)
    if counter is None:
        existing = node.get(keys.warm, now)
        if existing is None:
            node.set(keys.warm, mark, now, px=mark_ms)
            existing = str(mark)
        return [-2, int(existing)]
    warm = node.pttl(keys.warm, now)
    if warm > 0:
        return [-3, warm]
    number = int(counter)
    if node.exists(keys.lock, now) == 1:
        return [0, number]
    if proposal <= number:
        return [-1, number]
    node.set(keys.lock, token, now, px=ttl_ms)
    node.set(keys.fence, proposal, now)
    return [1, proposal]


def seed_lua(
    node: FakeNode,
    keys: LockKeys,
    counter: int,
    warm_ms: int,
    now: int,
    marks: frozenset[int] | None = None,
) -> int:
    """``seed.lua``: KEYS fence, warm; ARGV counter, warm_ms, marks...

    ``marks=None`` stands for "the mark the node holds now" (tests that seed directly).
    """
    if node.exists(keys.fence, now) == 1:
        return 0
    mark = node.get(keys.warm, now)
    if marks is not None and (mark is None or int(mark) not in marks):
        return -1
    node.set(keys.fence, counter, now)
    if warm_ms > 0:
        node.set(keys.warm, "1", now, px=warm_ms)
    else:
        node.delete(keys.warm, now)
    return 1


def release_lua(node: FakeNode, key: str, token: str, now: int) -> int:
    """``release.lua``: compare-and-delete."""
    if node.get(key, now) == token:
        return node.delete(key, now)
    return 0


def extend_lua(node: FakeNode, key: str, token: str, ttl_ms: int, now: int) -> int:
    """``extend.lua``: compare-and-expire (never re-creates an expired key)."""
    if node.get(key, now) == token:
        return node.pexpire(key, ttl_ms, now)
    return 0


# --- waiting (handoff.lua.inc, and the waiting paths of acquire.lua and release.lua) ---
#
# ``published`` collects (channel, message) for the caller; ``listening`` says which
# channels have a subscriber (PUBLISH's receiver count). Nodes of a quorum each have
# their own Bus (a message is known by the node that sent it), and may share one
# ``listening`` set: a process subscribes on every node at once.


@dataclass
class Bus:
    listening: set[str] = field(default_factory=set)
    published: list[tuple[str, str]] = field(default_factory=list)

    def publish(self, channel: str, message: str) -> int:
        if channel not in self.listening:
            return 0
        self.published.append((channel, message))
        return 1


def _zset(node: FakeNode, key: str, now: int) -> list[tuple[float, str]]:
    raw = node.get(key, now)
    if not raw:
        return []
    return sorted((float(s), m) for s, m in (item.split("|", 1) for item in raw.split(";")))


def _zstore(node: FakeNode, key: str, items: list[tuple[float, str]], now: int) -> None:
    if items:
        node.set(key, ";".join(f"{s}|{m}" for s, m in sorted(items)), now)
    else:
        node.delete(key, now)


def handoff_lua(
    node: FakeNode, bus: Bus, keys: LockKeys, mode: str, me: str, arg: int, now: int
) -> int:
    """``handoff.lua.inc``: pass a free lock on to the head of the queue.

    ``mode`` and ``arg`` as in the script: "f" hands over with counter + 1, "q" with
    ``arg`` (only above the counter; otherwise it wakes the head), "n" wakes the head
    and reserves the lock for it for ``arg`` ms.
    """
    while True:
        queue = _zset(node, keys.queue, now)
        if not queue:
            return 0
        head = queue[0][1]
        if head == me:
            return 2
        pkey = f"{keys.queue}:{head}"
        place = node.get(pkey, now)
        if place is not None:
            channel, ttl = place.split(" ")
            token: int | None = None
            if mode == "f":
                token = int(node.get(keys.fence, now) or 0) + 1
            elif mode == "q":
                fence = node.get(keys.fence, now)
                if fence is not None and arg > int(fence):
                    token = arg
            if token is not None:
                if bus.publish(channel, f"G {head} {token}") > 0:
                    node.set(keys.lock, head, now, px=int(ttl))
                    node.set(keys.fence, token, now)
                    _zstore(node, keys.queue, queue[1:], now)
                    node.delete(pkey, now)
                    return 1
            elif bus.publish(channel, f"W {head}") > 0:
                if mode == "n":
                    node.set(f"{keys.queue}:next", head, now, px=arg)
                return 1
            node.delete(pkey, now)
        _zstore(node, keys.queue, queue[1:], now)


def acquire_wait_lua(
    node: FakeNode,
    bus: Bus,
    keys: LockKeys,
    token: str,
    ttl_ms: int,
    proposal: int,
    mode: str,
    waiter: str,
    channel: str,
    place_ms: int,
    now: int,
    ticket: int = 0,
) -> list[int]:
    """``acquire.lua`` with ARGV[6..10] (the node has a counter and is not warming up)."""
    counter = int(node.get(keys.fence, now) or 0)
    holder: object = node.get(keys.lock, now)
    pttl: int | None = None
    if mode == "f" and holder == token:
        node.pexpire(keys.lock, ttl_ms, now)
        return [1, counter]
    if mode == "q" and (holder == token or holder is None) and proposal <= counter:
        return [-1, counter]
    if mode == "q" and holder == token:
        node.pexpire(keys.lock, ttl_ms, now)
        node.set(keys.fence, proposal, now)
        return [1, proposal]
    if (
        holder is None
        and mode != "n"
        and handoff_lua(node, bus, keys, mode, waiter, proposal, now) == 1
    ):
        holder = True
        counter = int(node.get(keys.fence, now) or 0)
    if holder is None and mode == "n":
        nxt = node.get(f"{keys.queue}:next", now)
        if nxt is not None and nxt != waiter:
            holder, pttl = True, -1
    if holder is not None:
        if place_ms != 0:
            queue = _zset(node, keys.queue, now)
            if mode == "q":
                if waiter not in [m for _, m in queue]:  # ZADD NX: a waiter keeps its ticket
                    _zstore(node, keys.queue, [*queue, (float(ticket), waiter)], now)
            elif waiter not in [m for _, m in queue]:
                tail = queue[-1][0] + 1 if queue else 0
                _zstore(node, keys.queue, [*queue, (tail, waiter)], now)
            node.set(f"{keys.queue}:{waiter}", f"{channel} {ttl_ms}", now, px=place_ms)
        return [0, counter, pttl if pttl is not None else node.pttl(keys.lock, now)]
    if proposal <= counter:
        return [-1, counter]
    node.set(keys.lock, token, now, px=ttl_ms)
    node.set(keys.fence, proposal, now)
    queue = _zset(node, keys.queue, now)
    _zstore(node, keys.queue, [(s, m) for s, m in queue if m != waiter], now)
    node.delete(f"{keys.queue}:{waiter}", now)
    node.delete(f"{keys.queue}:next", now)
    return [1, proposal]


def release_wait_lua(
    node: FakeNode,
    bus: Bus,
    keys: LockKeys,
    token: str,
    mode: str,
    arg: int,
    now: int,
    cleanup: bool = False,
) -> int:
    """``release.lua`` with ARGV[2..4] (a lease's release, a waiter giving up, or with
    ``cleanup`` the release of a failed attempt's grants, "c")."""
    released = 0
    if node.get(keys.lock, now) == token:
        node.delete(keys.lock, now)
        released = 1
    reserved = f"{keys.queue}:next"
    if not cleanup:
        queue = _zset(node, keys.queue, now)
        _zstore(node, keys.queue, [(s, m) for s, m in queue if m != token], now)
        node.delete(f"{keys.queue}:{token}", now)
        if node.get(reserved, now) == token:
            node.delete(reserved, now)
    if node.exists(keys.lock, now) == 0 and node.exists(reserved, now) == 0:
        handoff_lua(node, bus, keys, mode, token if cleanup else "", arg, now)
    return released

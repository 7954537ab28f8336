"""A fake Redis node in pure Python that runs tenure's server scripts, for model tests.

:class:`FakeNode` holds the keys tenure's scripts touch, with their expiry, on an
integer-millisecond clock that the caller passes in (a model's fake time, so a test
decides every instant). Each ``*_lua`` function mirrors one script of ``tenure/_lua``
line by line (``commit_lua`` and ``handoff_lua`` the fragments of ``handoff.lua.inc``),
so a reader can check one against the other (the scripts' short ways for a free lock
nobody waits for decide what their long ways decide, and the fake takes the long way),
and :func:`eval_packed` runs a command exactly as the client packs it. Use it to drive
the real pure core (``tenure._core``) against many nodes, faults and clock jumps in one
process, with no server and no sleeping.

It follows Redis's own rules for what the scripts use:

* a key set with ``PX ttl`` at ``t`` expires when ``now > t + ttl`` (``keyIsExpired``:
  ``now > when``), so it still exists at ``t + ttl`` itself;
* ``PTTL`` answers -2 for a missing key, -1 for a key without expiry, and otherwise the
  milliseconds left, never below 0;
* ``SET`` drops a key's expiry unless given one; ``PEXPIRE``, ``ZADD`` and ``ZREM`` keep
  it, and a sorted set emptied by ``ZREM`` is gone;
* a script runs atomically, at one instant.

One ``FakeNode`` is one Redis server, shared by every lock name: it holds every lock's
keys (``tenure:{name}:lock``, the wait queue) and the node's own three
(``tenure:node:floor``, ``tenure:node:warm``, ``tenure:node:replid``). A node that
restarts without its data is :meth:`FakeNode.wipe`; ``FLUSHALL`` is
:meth:`FakeNode.flush` (the same keys are gone; what differs, the connections, is the
model's business).

Replication is imitated only as far as the scripts see it: a node has a replication ID
(``master_replid``) and a second one (``master_replid2``, all zeros unless it was
promoted). :meth:`FakeNode.replicate` is what an asynchronous replica holds at that
instant, :meth:`FakeNode.promote` puts such a copy in the node's place with a new ID
(a failover that lost every write made since the copy), and :meth:`FakeNode.restart`
and :meth:`FakeNode.wipe` start a new ID as a real server does on every start.

Limits: only tenure's keys and scripts are imitated, nothing else of Redis (no other
commands, no connections, no replication stream, no persistence modes, no memory
limits);
pub/sub is the :class:`Bus`, which delivers to whoever listens at the instant of
publishing. It is checked against the real scripts by tenure's own tests (every return
branch, and the waiting paths step by step against a real ``redis-server``), but it
describes the scripts of the tenure version it ships with only: it is a test double,
versioned with the package, not a Redis.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from dataclasses import dataclass, field
from typing import Any

from tenure._core.config import LockKeys
from tenure._core.config import replid_key as _replid_key

__all__ = [
    "RETENTION_MS",
    "ZERO_ID",
    "Bus",
    "FakeNode",
    "LockKeys",
    "acquire_listed",
    "acquire_lua",
    "acquire_wait_lua",
    "commit_lua",
    "eval_packed",
    "extend_lua",
    "handoff_lua",
    "history_lua",
    "observed_lua",
    "record_lua",
    "release_lua",
    "release_wait_lua",
    "script_call",
    "seed_lua",
]

#: The client's default retention (``ClientConfig.retention_ms``), in milliseconds.
RETENTION_MS = 3_600_000

#: ``master_replid2`` of a server that was never promoted.
ZERO_ID = "0" * 40

_ids = itertools.count(1)


def _new_id() -> str:
    """A replication ID no node of this process has had (40 hex digits, as Redis's)."""
    return f"{next(_ids):040x}"


@dataclass
class FakeNode:
    """Keys -> (value, absolute expiry in ms or None), read at the caller's ``now``;
    ``replid`` and ``replid2``: ``master_replid`` and ``master_replid2``."""

    data: dict[str, tuple[str, int | None]] = field(default_factory=dict)
    replid: str = field(default_factory=_new_id)
    replid2: str = ZERO_ID

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
        """Restart without persistence: every key is gone, under a new history."""
        self.data.clear()
        self.restart()

    def restart(self) -> None:
        """Restart with every key kept (``appendfsync always``): a server starts a new
        replication history on every start (Redis 6.2 and Valkey 9 alike)."""
        self.replid, self.replid2 = _new_id(), ZERO_ID

    def replicate(self) -> dict[str, tuple[str, int | None]]:
        """What a replica of this node holds now: a copy of its keys (expiry times are
        absolute, as replication makes them)."""
        return dict(self.data)

    def promote(self, copy: dict[str, tuple[str, int | None]]) -> None:
        """A failover: a replica holding ``copy`` (from :meth:`replicate`, made earlier)
        takes this node's place. Every write since the copy is lost; the replica keeps
        this node's ID as its second one and starts a new history."""
        self.data = dict(copy)
        self.replid2, self.replid = self.replid, _new_id()

    def flush(self) -> None:
        """FLUSHALL: every key is gone (the node stays up, its connections too)."""
        self.data.clear()

    def floor_of(self, keys: LockKeys, now: int) -> int | None:
        """This node's floor, None if it is blank."""
        value = self.get(keys.floor, now)
        return None if value is None else int(value)


def commit_lua(node: FakeNode, keys: LockKeys, token: int, retention_ms: int, now: int) -> int:
    """``commit`` of ``handoff.lua.inc``: floor := max(floor, token), kept for
    ``retention_ms`` from now, and its stored replication ID with it."""
    value = token
    old = int(node.get(keys.floor, now) or 0)
    if value > old:
        node.set(keys.floor, token, now, px=retention_ms)
    else:
        node.pexpire(keys.floor, retention_ms, now)
    node.pexpire(keys.replid, retention_ms, now)
    return value


# --- history.lua.inc ------------------------------------------------------------------------


def history_lua(node: FakeNode) -> tuple[str, bool]:
    """``history``: the node's replication ID, and whether it was promoted."""
    return node.replid, node.replid2 != ZERO_ID


def record_lua(node: FakeNode, floor: str, rid: str, retention_ms: int, now: int) -> None:
    """``record``: store ``rid`` as the floor's history, for at least as long as the floor."""
    ttl = node.pttl(floor, now)
    if ttl == -1:
        node.set(_replid_key(floor), rid, now)
    else:
        node.set(_replid_key(floor), rid, now, px=max(ttl, retention_ms))


def observed_lua(node: FakeNode, warm: str, mark: int, mark_ms: int, rid: str, now: int) -> int:
    """``observed``: the node's observation mark under history ``rid``, or ``mark``."""
    kept = _mark_of(node.get(warm, now), rid)
    if kept is not None:
        return kept
    node.set(warm, f"{mark} {rid}", now, px=mark_ms)
    return mark


def _mark_of(seen: str | None, rid: str) -> int | None:
    # Lua's string.match(seen, "^(%d+) " .. id .. "$").
    found = re.fullmatch(r"(\d+) " + re.escape(rid), seen or "")
    return None if found is None else int(found.group(1))


def acquire_listed(reply: object) -> list[Any]:
    """An answer of ``acquire.lua`` (the script's, as a client read it, or
    ``acquire_lua``'s) as a list: a grant answered with its token alone as ``[1, token,
    token]``, for a test that reads the status first."""
    if isinstance(reply, int):
        return [1, reply, reply]
    assert isinstance(reply, list), reply
    return reply


def acquire_lua(
    node: FakeNode,
    keys: LockKeys,
    token: str,
    ttl_ms: int,
    proposal: int,
    now: int,
    mark: int = 1,
    mark_ms: int = 60_000,
    retention_ms: int = RETENTION_MS,
    *,
    bus: Bus | None = None,
    mode: str | None = None,
    waiter: str = "",
    channel: str = "",
    place_ms: int = 0,
    ticket: int = 0,
) -> list[int | str] | int:
    """``acquire.lua``: KEYS lock, floor, warm[, queue]; ARGV token, ttl_ms,
    proposal, mark, mark_ms, retention_ms[, mode, waiter, channel, place_ms, ticket].
    A grant with ``proposal`` as its token answers ``proposal`` alone, as the script does.

    ``mode`` None is the plain acquire (no ARGV[7..]); with a mode, ``bus`` carries the
    hand-off notifications (see ``acquire_wait_lua``).
    """
    floor_raw = node.get(keys.floor, now)
    rid, promoted = history_lua(node)
    if floor_raw is None:
        seen = observed_lua(node, keys.warm, mark, mark_ms, rid, now)
        return [-2, seen, 0, rid] if promoted else [-2, seen, 0]
    floor = int(floor_raw)
    stored = node.get(keys.replid, now)
    if stored is None and not promoted:
        record_lua(node, keys.floor, rid, retention_ms, now)
    elif stored != rid:
        return [-4, observed_lua(node, keys.warm, mark, mark_ms, rid, now), floor, rid]
    warm = node.pttl(keys.warm, now)
    if warm > 0:
        return [-3, warm, floor]
    retention = retention_ms
    if mode is None:
        if node.exists(keys.lock, now) == 1:
            return [0, floor, floor]
    else:
        assert bus is not None
        queue, me = keys.queue, waiter
        holder: object = node.get(keys.lock, now)
        pttl: int | None = None
        if mode == "f" and holder == token:
            node.pexpire(keys.lock, ttl_ms, now)
            node.pexpire(keys.floor, retention, now)
            node.pexpire(keys.replid, retention, now)
            return [1, floor, floor]
        if mode == "q" and (holder == token or holder is None) and proposal <= floor:
            return [-1, floor, floor]
        if mode == "q" and holder == token:
            node.pexpire(keys.lock, ttl_ms, now)
            return commit_lua(node, keys, proposal, retention, now)
        if (
            holder is None
            and mode != "n"
            and handoff_lua(node, bus, keys, mode, me, proposal, now, retention) == 1
        ):
            holder = True
            floor = int(node.get(keys.floor, now) or 0)
        if holder is None and mode == "n":
            nxt = node.get(f"{queue}:next", now)
            if nxt is not None and nxt != me:
                holder, pttl = True, -1
        if holder is not None:
            place = place_ms
            if place != 0:
                items = _zset(node, queue, now)
                if mode == "q":
                    if me not in [m for _, m in items]:  # ZADD NX: a waiter keeps its ticket
                        _zstore(node, queue, [*items, (float(ticket), me)], now)
                elif me not in [m for _, m in items]:
                    tail = items[-1][0] + 1 if items else 0
                    _zstore(node, queue, [*items, (tail, me)], now)
                node.set(f"{queue}:{me}", f"{channel} {ttl_ms}", now, px=place)
                # The queue outlives its longest-lived place, and no more.
                if node.pttl(queue, now) < place:
                    node.pexpire(queue, place, now)
            return [0, floor, floor, pttl if pttl is not None else node.pttl(keys.lock, now)]
    if proposal <= floor:
        return [-1, floor, floor]
    node.set(keys.lock, token, now, px=ttl_ms)
    commit_lua(node, keys, proposal, retention, now)
    if mode is not None:
        items = _zset(node, keys.queue, now)
        _zstore(node, keys.queue, [(s, m) for s, m in items if m != waiter], now)
        node.delete(f"{keys.queue}:{waiter}", now)
        node.delete(f"{keys.queue}:next", now)
    return proposal


def seed_lua(
    node: FakeNode,
    keys: LockKeys,
    floor: int,
    warm_ms: int,
    now: int,
    marks: frozenset[int] | None = None,
    retention_ms: int = RETENTION_MS,
) -> int:
    """``seed.lua``: KEYS floor, warm; ARGV floor, warm_ms, retention_ms, marks...

    ``marks=None`` stands for "the mark the node holds now" (tests that seed directly).
    """
    rid, changed = history_lua(node)
    current = node.get(keys.floor, now)
    if current is not None:
        stored = node.get(keys.replid, now)
        if stored == rid or (stored is None and not changed):
            return 0
        changed = True
    mark = _mark_of(node.get(keys.warm, now), rid)
    if marks is not None and (mark is None or mark not in marks):
        return -1
    if changed and warm_ms <= 0:
        return -1
    start = max(floor, int(current)) if current is not None else floor
    node.set(keys.floor, start, now, px=retention_ms)
    node.set(keys.replid, rid, now, px=retention_ms)
    if warm_ms > 1:
        node.set(keys.warm, "1", now, px=warm_ms)
    else:
        node.delete(keys.warm, now)
    return 1


def release_lua(node: FakeNode, key: str, token: str, now: int) -> int:
    """``release.lua`` without waiting (KEYS lock; ARGV token): compare-and-delete."""
    if node.get(key, now) == token:
        return node.delete(key, now)
    return 0


def extend_lua(
    node: FakeNode,
    key: str,
    token: str,
    ttl_ms: int,
    now: int,
    floor: str | None = None,
    retention_ms: int = RETENTION_MS,
) -> int:
    """``extend.lua``: KEYS lock[, floor]; ARGV token, ttl_ms[, retention_ms].
    Compare-and-expire (never re-creates an expired key); with ``floor``, an extension
    also keeps the node's floor and its stored replication ID for another retention
    (recording the ID if the floor has none)."""
    if node.get(key, now) == token:
        if floor is not None:
            kept = node.pexpire(floor, retention_ms, now)
            if node.pexpire(_replid_key(floor), retention_ms, now) == 0 and kept == 1:
                rid, promoted = history_lua(node)
                if not promoted:
                    record_lua(node, floor, rid, retention_ms, now)
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
    """Pub/sub across a model's nodes: who listens now, and what was published to them."""

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
    """Write a sorted set back: ZADD and ZREM keep the key's expiry; empty, it is gone."""
    if items:
        entry = node._live(key, now)
        expiry = entry[1] if entry is not None else None
        node.data[key] = (";".join(f"{s}|{m}" for s, m in sorted(items)), expiry)
    else:
        node.delete(key, now)


def handoff_lua(
    node: FakeNode,
    bus: Bus,
    keys: LockKeys,
    mode: str,
    me: str,
    arg: int,
    now: int,
    retention_ms: int = RETENTION_MS,
) -> int:
    """``handoff`` of ``handoff.lua.inc``: pass a free lock on to the head of the queue.

    ``mode`` and ``arg`` as in the script: "f" hands over with floor + 1, "q" with
    ``arg`` (only above the floor; otherwise it wakes the head), "n" wakes the head
    and reserves the lock for it for ``arg`` ms; a blank node only wakes the head.
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
            raw = node.get(keys.floor, now)
            top = None if raw is None else int(raw)
            if top is not None and mode == "f":
                token = top + 1
            elif top is not None and mode == "q" and arg > top:
                token = arg
            if token is not None:
                if bus.publish(channel, f"G {head} {token}") > 0:
                    node.set(keys.lock, head, now, px=int(ttl))
                    commit_lua(node, keys, token, retention_ms, now)
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
    retention_ms: int = RETENTION_MS,
) -> list[int | str] | int:
    """``acquire.lua`` with ARGV[7..11] (mode, waiter, channel, place_ms, ticket)."""
    return acquire_lua(
        node, keys, token, ttl_ms, proposal, now, 1, 60_000, retention_ms,
        bus=bus, mode=mode, waiter=waiter, channel=channel, place_ms=place_ms, ticket=ticket,
    )  # fmt: skip


def release_wait_lua(
    node: FakeNode,
    bus: Bus,
    keys: LockKeys,
    token: str,
    mode: str,
    arg: int,
    now: int,
    cleanup: bool = False,
    retention_ms: int = RETENTION_MS,
    fencing: int = 0,
    place: tuple[int, str, int] | None = None,
    late: bool = False,
) -> int:
    """``release.lua`` with KEYS lock, floor, queue and ARGV[2..9] (a lease's
    release, a waiter giving up, or with ``cleanup`` the release of a failed attempt's
    grants, "c", and ``place`` its ticket, place record and place's life, ARGV[7..9]).
    ``fencing``: the lease's token, to which the floor of a node without our key is
    raised (0: no lease); with ``late`` ("l"), of every node."""
    released = 0
    if node.get(keys.lock, now) == token:
        node.delete(keys.lock, now)
        released = 1
    if cleanup and place is not None:
        ticket, record, place_ms = place
        items = _zset(node, keys.queue, now)
        if all(m != token for _, m in items):
            _zstore(node, keys.queue, [*items, (float(ticket), token)], now)
        node.set(f"{keys.queue}:{token}", record, now, px=place_ms)
        if node.pttl(keys.queue, now) < place_ms:
            node.pexpire(keys.queue, place_ms, now)
    if (released == 0 or late) and fencing:
        floor = node.get(keys.floor, now)
        if floor is not None and int(floor) < fencing:
            commit_lua(node, keys, fencing, retention_ms, now)
    reserved = f"{keys.queue}:next"
    if not cleanup:
        queue = _zset(node, keys.queue, now)
        _zstore(node, keys.queue, [(s, m) for s, m in queue if m != token], now)
        node.delete(f"{keys.queue}:{token}", now)
        if node.get(reserved, now) == token:
            node.delete(reserved, now)
    if node.exists(keys.lock, now) == 0 and node.exists(reserved, now) == 0:
        handoff_lua(node, bus, keys, mode, token if cleanup else "", arg, now, retention_ms)
    return released


# --- the commands as packed by tenure._core.commands -------------------------------------


def _items(packed: bytes) -> list[bytes]:
    """The bulk strings of one RESP array (what ``commands.pack`` writes)."""
    assert packed[:1] == b"*"
    end = packed.index(b"\r\n")
    count, pos, items = int(packed[1:end]), end + 2, []
    for _ in range(count):
        end = packed.index(b"\r\n", pos)
        assert packed[pos : pos + 1] == b"$"
        size = int(packed[pos + 1 : end])
        items.append(packed[end + 2 : end + 2 + size])
        pos = end + 4 + size
    assert pos == len(packed), "one command only"
    return items


def script_call(packed: bytes) -> tuple[str, list[str], list[str]]:
    """(script name, KEYS, ARGV) of an ``EVAL`` or ``EVALSHA`` packed by
    ``tenure._core.commands``, the script known by its body or by that body's SHA1."""
    from tenure._lua import script

    items = _items(packed)
    names = ("acquire", "seed", "extend", "release")
    if items[0] == b"EVALSHA":
        name = next(
            n for n in names if hashlib.sha1(script(n).wire).hexdigest().encode() == items[1]
        )
    else:
        assert items[0] == b"EVAL", items[0]
        name = next(n for n in names if script(n).wire == items[1])
    numkeys = int(items[2])
    words = [x.decode() for x in items[3:]]
    return name, words[:numkeys], words[numkeys:]


def eval_packed(
    node: FakeNode, packed: bytes, now: int, bus: Bus | None = None
) -> list[int | str] | int:
    """Run a command packed by ``tenure._core.commands`` (an ``EVAL`` or ``EVALSHA`` of
    acquire, seed, extend or release) on the fake: KEYS and ARGV are read by position, as
    the scripts' headers number them, so a command whose layout drifts from its script
    fails here."""
    name, keys, args = script_call(packed)
    numkeys = len(keys)
    if name == "acquire":
        lock = LockKeys(lock=keys[0], floor=keys[1], warm=keys[2])
        token, ttl, proposal, mark, mark_ms, retention = args[:6]
        common = (node, lock, token, int(ttl), int(proposal), now, int(mark), int(mark_ms))
        if numkeys == 3:
            assert len(args) == 6
            return acquire_lua(*common, int(retention))
        assert numkeys == 4
        assert len(args) == 11
        assert bus is not None
        lock = LockKeys(lock=keys[0], floor=keys[1], warm=keys[2], queue=keys[3])
        mode, waiter, channel, place, ticket = args[6:]
        return acquire_lua(
            node, lock, token, int(ttl), int(proposal), now, int(mark), int(mark_ms),
            int(retention), bus=bus, mode=mode, waiter=waiter, channel=channel,
            place_ms=int(place), ticket=int(ticket),
        )  # fmt: skip
    if name == "seed":
        assert numkeys == 2
        seeded = LockKeys(lock="", floor=keys[0], warm=keys[1])
        marks = frozenset(int(m) for m in args[3:])
        return seed_lua(node, seeded, int(args[0]), int(args[1]), now, marks, int(args[2]))
    if name == "extend":
        if numkeys == 1:
            assert len(args) == 2
            return extend_lua(node, keys[0], args[0], int(args[1]), now)
        assert numkeys == 2
        assert len(args) == 3
        return extend_lua(node, keys[0], args[0], int(args[1]), now, keys[1], int(args[2]))
    if numkeys == 1:
        assert len(args) == 1
        return release_lua(node, keys[0], args[0], now)
    assert numkeys == 3
    assert len(args) in (5, 6, 9)
    assert bus is not None
    lock = LockKeys(lock=keys[0], floor=keys[1], queue=keys[2])
    cleanup = args[5:6] == ["c"]
    late = args[5:6] == ["l"]
    assert cleanup or len(args) == 5 or (late and len(args) == 6)
    requeue = (int(args[6]), args[7], int(args[8])) if len(args) == 9 else None
    return release_wait_lua(
        node, bus, lock, args[0], args[1], int(args[2]), now, cleanup, int(args[3]), int(args[4]),
        requeue, late,
    )  # fmt: skip

"""Redis Cluster as one lock node: hash slots, the per-slot tags, the slot map, redirections.

Pure: the drivers hand in replies and error texts and act on what comes back.

* ``key_slot``: the slot of a key, CRC16 (XMODEM) of its hash tag modulo 16384, as the
  server computes it (``CLUSTER KEYSLOT``).
* ``slot_tag``: ``T[s]``, the fixed string that hashes to slot ``s``: the first string of
  digits and lower-case letters, in order of length and then of alphabet, whose CRC16
  modulo 16384 is ``s``. A Cluster node keeps its floor and warm-up marker per slot, under
  ``<prefix>{T[s]}:floor`` (docs/cluster-and-sentinel.md, "One floor per slot"). The table
  is generated once (``scripts/gen_slot_tags.py``) into ``_slot_tags.py`` and checked by a
  unit test.
* ``SlotMap``: ``CLUSTER SLOTS`` parsed into slot -> master address.
* ``cluster_url``: the parts of a ``redis+cluster://`` node URL (``config`` builds the node).
* ``redirect``: what a cluster error reply asks of the client (``MOVED``, ``ASK``,
  ``TRYAGAIN``, ``CLUSTERDOWN``), and what a node that could not vote says of it.
* ``MapDoubt``: when a member's network failure has the slot map loaded again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from ._slot_tags import TAGS
from .caching import text_cache
from .hosts import REDIS_PORT, parse_host
from .resp import as_text

__all__ = [
    "MAP_RECHECK",
    "MAX_REDIRECTS",
    "SLOTS",
    "MapDoubt",
    "Redirect",
    "SlotMap",
    "cluster_url",
    "crc16",
    "hash_tag",
    "key_slot",
    "map_load_bound",
    "map_sources",
    "redirect",
    "routed_slot",
    "slot_tag",
]

SLOTS = 16384

# Redirections one node may take within one round (MOVED, then ASK, say): the round's
# deadline bounds them all anyway; this bounds a slot map that keeps pointing elsewhere.
MAX_REDIRECTS = 2

# Seconds between two loads of a slot map that only a member's network failure put in
# doubt: a master killed and its replica promoted sends no MOVED (nobody answers at the
# old address), so the map is asked again, but a master down for good, or still within
# the cluster's own failure detection, costs one CLUSTER SLOTS per interval, not one per
# round of every thread.
MAP_RECHECK = 0.5


def _table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
        table.append(crc & 0xFFFF)
    return tuple(table)


_CRC = _table()


def crc16(data: bytes) -> int:
    """CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), Redis Cluster's hash."""
    crc = 0
    table = _CRC
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ table[(crc >> 8) ^ byte]
    return crc


def hash_tag(key: str | bytes) -> bytes | None:
    """``key``'s hash tag: the text between its first ``{`` and the next ``}``, if that
    is not empty; None when Redis Cluster hashes the whole key (no such pair, or ``{}``)."""
    data = key.encode("utf-8", "surrogatepass") if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            return data[start + 1 : end]
    return None


def key_slot(key: str | bytes) -> int:
    """The hash slot of ``key``: of its hash tag when it has one, of the whole key
    otherwise."""
    tag = hash_tag(key)
    if tag is None:
        tag = key.encode("utf-8", "surrogatepass") if isinstance(key, str) else key
    return crc16(tag) % SLOTS


def map_sources(
    seeds: Sequence[Address], known: SlotMap | None, first: Sequence[Address] = ()
) -> list[Address]:
    """Whom to ask for a Cluster node's slot map, in order: ``first`` (members known to
    have seen the change the load is for), the members of the map known so far (a seed
    may have left the cluster since), then the seeds."""
    members = known.members if known is not None else ()
    return list(dict.fromkeys([*first, *members, *seeds]))


def map_load_bound(sources: int, connect_timeout: float) -> float:
    """How long a first load of a slot map from ``sources`` addresses is waited for at
    most. Each address is asked in turn and given ``connect_timeout`` for its whole
    answer, connecting included (as the asyncio client's load gives it): a later one
    still gives the map when the first hangs. One ``connect_timeout`` more, so that a
    load ending on time is told by what it found; a load still under way then (a name
    lookup that hangs, a handshake answered a byte at a time) is given up, and the node
    has no slot map (``diagnosis.slot_map_late``)."""
    return (sources + 1) * connect_timeout


@text_cache(maxsize=4096)
def routed_slot(key: str) -> int:
    """``key_slot`` of a command's routing key, remembered for the names in use (but
    long ones): the drivers ask it at every round, and CRC16 in Python costs a few
    microseconds."""
    return key_slot(key)


def slot_tag(slot: int) -> str:
    """``T[slot]``: the first string of ``[0-9a-z]`` (shortest first, then in alphabetical
    order) whose CRC16 modulo 16384 is ``slot``; at most four characters."""
    return TAGS[slot]


Address = tuple[str, int]


@dataclass(frozen=True)
class SlotMap:
    """Which master serves each slot, as one node of the cluster said (``CLUSTER SLOTS``).

    ``owners[s]`` is the master's (host, port), or None when no master serves ``s``;
    ``nodes`` every address the reply named, replicas included (a replica is what a
    failover promotes, so connecting to it early lets a ``MOVED`` be followed at once);
    ``source`` the member that gave it (None: not known).
    """

    owners: tuple[Address | None, ...]
    nodes: tuple[Address, ...]
    source: Address | None = None

    @classmethod
    def parse(cls, reply: object, asked: Address) -> SlotMap:
        """Parse a ``CLUSTER SLOTS`` reply given by the node at ``asked``.

        An empty or ``?`` host (Redis 7 with ``cluster-preferred-endpoint-type`` unknown
        or hidden) means the address the client reached that node at.

        Raises:
            ValueError: not a ``CLUSTER SLOTS`` reply.
        """
        if not isinstance(reply, list):
            raise ValueError(f"CLUSTER SLOTS answered {reply!r}, not a list of slot ranges")
        owners: list[Address | None] = [None] * SLOTS
        nodes: dict[Address, None] = {}
        for entry in reply:
            if not isinstance(entry, list) or len(entry) < 3:
                raise ValueError(f"CLUSTER SLOTS gave a range of the wrong shape: {entry!r}")
            start, end = int(entry[0]), int(entry[1])
            if not 0 <= start <= end < SLOTS:
                raise ValueError(f"CLUSTER SLOTS gave slots {start}-{end}, not in 0..16383")
            members = [_address(node, asked) for node in entry[2:]]
            for slot in range(start, end + 1):
                owners[slot] = members[0]
            for member in members:
                nodes[member] = None
        return cls(tuple(owners), tuple(nodes), asked)

    def owner(self, slot: int) -> Address | None:
        return self.owners[slot]

    def masters(self) -> list[Address]:
        """Every address serving at least one slot, in order of first slot."""
        return list(self._masters)

    @cached_property
    def _masters(self) -> tuple[Address, ...]:
        # Asked at every round: the 16384 owners are scanned once per map, not per round.
        return tuple(dict.fromkeys(a for a in self.owners if a is not None))

    @cached_property
    def members(self) -> tuple[Address, ...]:
        """Every address the map names, the masters first: the replicas too, since a
        failover promotes one, and a ``MOVED`` to it is then followed on a connection
        already up."""
        return tuple(dict.fromkeys([*self._masters, *self.nodes]))

    def moved(self, slot: int, to: Address) -> SlotMap:
        """This map with ``slot`` served by ``to`` (what a ``MOVED`` says; the whole map
        is reloaded before the next round, since the rest of the shard moved too)."""
        owners = list(self.owners)
        owners[slot] = to
        nodes = self.nodes if to in self.nodes else (*self.nodes, to)
        return SlotMap(tuple(owners), nodes, self.source)


class MapDoubt:
    """When a network failure of a member (a refused or reset connection, a member in
    its reconnect back-off) has the slot map loaded again: at most once per
    ``MAP_RECHECK``, counted from the start of the last load, whatever began it."""

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0.0

    def loading(self, now: float) -> None:
        """A load of the map begins at ``now``."""
        self._next = now + MAP_RECHECK

    def failed(self, now: float) -> bool:
        """A member failed at ``now``: whether the map is to be loaded again for it."""
        return now >= self._next


def _address(node: object, asked: Address) -> Address:
    if not isinstance(node, list) or len(node) < 2:
        raise ValueError(f"CLUSTER SLOTS gave a node of the wrong shape: {node!r}")
    host = as_text(node[0])
    if host in ("", "?"):
        host = asked[0]
    return host, int(node[1])


@dataclass(frozen=True)
class Redirect:
    """What a cluster error reply asks of the client.

    ``kind``: "moved" (the slot has a new owner: update the map, send there again),
    "ask" (the slot is migrating and the keys are at ``to``: send ``ASKING`` and the
    command there, once, the map unchanged), "tryagain" (a migration split the script's
    keys), "down" (``CLUSTERDOWN``: the cluster cannot serve the slot now). The last two
    are no vote in this round, never an error of the node's configuration.
    """

    kind: str
    slot: int = -1
    to: Address | None = None

    @property
    def follows(self) -> bool:
        """Whether the command is sent again within the round (to ``to``)."""
        return self.to is not None

    def detail(self, node: str = "") -> str:
        """What the node's silence in this round means, for its diagnosis."""
        where = f" ({node})" if node else ""
        if self.kind == "moved":
            return (
                f"slot {self.slot} moved to {_shown(self.to)}{where} and could not be "
                "followed within the round; the slot map is reloaded for the next round"
            )
        if self.kind == "ask":
            return (
                f"slot {self.slot} is migrating to {_shown(self.to)}{where} and the "
                "command could not be sent there within the round"
            )
        if self.kind == "tryagain":
            return (
                "a slot migration split this lock's keys between two masters (TRYAGAIN): "
                "no vote until it ends"
            )
        return "the cluster cannot serve this slot now (CLUSTERDOWN): no vote this round"


def _shown(to: Address | None) -> str:
    if to is None:
        return "?"
    host, port = to
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def redirect(error: str, replied: Address | None = None) -> Redirect | None:
    """What the error reply ``error`` (code first, as the node sent it) asks of the
    client; None when it is not a cluster redirection (then it is the node's answer, a
    configuration failure or any other error). ``replied``: the address of the node that
    answered, standing for an empty host in ``MOVED 12 :7001`` (Redis 7)."""
    word, _, rest = error.partition(" ")
    word = word.upper()
    if word in ("MOVED", "ASK"):
        slot_text, _, where = rest.strip().partition(" ")
        host, _, port_text = where.strip().rpartition(":")
        try:
            slot, port = int(slot_text), int(port_text)
        except ValueError:
            return None
        if not host and replied is not None:
            host = replied[0]
        if not 0 <= slot < SLOTS or not host or not 0 < port < 65536:
            return None
        return Redirect("moved" if word == "MOVED" else "ask", slot, (host, port))
    if word == "TRYAGAIN":
        return Redirect("tryagain")
    if word == "CLUSTERDOWN":
        return Redirect("down")
    return None


CLUSTER_FORM = (
    "redis+cluster://[user:password@]host:port[,host:port...] (rediss+cluster:// for TLS), "
    "the listed nodes being seeds of one cluster's slot map"
)


def cluster_url(url: str) -> tuple[str, str, tuple[Address, ...], str]:
    """Split a ``redis+cluster://`` or ``rediss+cluster://`` URL.

    Returns:
        (``redis`` or ``rediss``, the user part up to and with its ``@`` or "", the
        seeds as (host, port) in the order given without repeats, the query after ``?``
        or "").

    Raises:
        ValueError: why it is malformed, without quoting the URL (the caller does, with
            its password hidden).
    """
    scheme, _, rest = url.partition("://")
    base = scheme.lower().partition("+")[0]
    at = rest.rfind("@")
    user, after = rest[: at + 1], rest[at + 1 :]
    end = min((i for i in (after.find(c) for c in "/?#") if i >= 0), default=len(after))
    hosts, tail = after[:end], after[end:]
    path, _, query = tail.partition("?")
    if "#" in query or "#" in path:
        raise ValueError("a fragment ('#') has no meaning in a node URL")
    if path.strip("/") not in ("", "0"):
        raise ValueError(
            f"database {path.strip('/')!r}: a Redis Cluster has database 0 only; "
            "leave the /db part out"
        )
    seeds: dict[Address, None] = {}
    for item in hosts.split(","):
        seeds[parse_host(item.strip(), REDIS_PORT)] = None
    return base, user, tuple(seeds), query

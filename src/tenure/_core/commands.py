"""The Redis commands of each round, packed once per round, and what their replies mean.

Both drivers send these exact bytes to every node (the command is the same on each) and
classify each reply with the same functions, so the protocol lives here once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import cache, lru_cache, partial
from typing import NamedTuple

from .._lua import script
from .caching import by_length
from .config import LockSpec
from .slots import MAX_REDIRECTS, Address, Redirect
from .waiting import SHARDED

__all__ = [
    "ASKING",
    "CLUSTER_SLOTS",
    "HISTORY_CHANGED",
    "NO_HISTORY",
    "PING",
    "Command",
    "Hop",
    "Item",
    "ScriptCache",
    "WaitArgs",
    "acked_by_replicas",
    "acquire",
    "alone_form",
    "batch",
    "behind_marker",
    "dequeue",
    "evalsha_refused",
    "exists",
    "extend",
    "next_hop",
    "pack",
    "release",
    "release_waking",
    "script_missing",
    "seed",
    "split_batch",
]


def pack(*args: bytes | str | int) -> bytes:
    """Encode one command in RESP (an array of bulk strings)."""
    return b"*%d\r\n" % len(args) + _bulk(args)


def _bulk(args: tuple[bytes | str | int, ...]) -> bytes:
    # The arguments of a round are short ASCII text and integers (tokens, TTLs, modes):
    # format them as one str and encode once, which is a third cheaper than encoding
    # each. The length of an ASCII str is its length in bytes; anything else (bytes, or
    # text that is not ASCII, where they differ) takes the general path.
    parts = []
    for arg in args:
        if arg.__class__ is bytes:
            break
        text = str(arg)
        parts.append(f"${len(text)}\r\n{text}\r\n")
    else:
        text = "".join(parts)
        if text.isascii():
            return text.encode()
    out = []
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


@cache
def _eval_head(name: str, argc: int) -> bytes:
    # The script source is the bulk of every EVAL: encoded once per script and argument
    # count, so that only the keys and arguments after it are encoded per call.
    body = script(name).wire
    return b"*%d\r\n$4\r\nEVAL\r\n$%d\r\n%s\r\n" % (3 + argc, len(body), body)


def _encode_keys(keys: tuple[str, ...]) -> tuple[bytes, bytes]:
    # numkeys and the keys, and the keys alone (for a batch, ``Item``).
    listed = _bulk(keys)
    return _bulk((len(keys),)) + listed, listed


# The same for every call on one lock name, and small, so a few thousand names' worth
# are kept; a long name's are not (``caching``). The hot callers pick between the cache
# and the encoding by ``LockSpec.cached``, an attribute, rather than through ``_keys``'s
# Python-level check of the length; one cache serves both.
_cached_keys = lru_cache(maxsize=4096)(_encode_keys)
_keys = by_length(_cached_keys, _encode_keys)


@cache
def _evalsha_head(name: str, argc: int) -> bytes:
    sha = hashlib.sha1(script(name).wire).hexdigest()
    return b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n" % (3 + argc, sha.encode())


def _eval(name: str, keys: tuple[str, ...], *args: bytes | str | int) -> bytes:
    # EVAL with the source, for a script whose every run must happen: only a majority of
    # replies is awaited, and after SCRIPT FLUSH or a restart, EVALSHA on a node nobody
    # waits for would answer NOSCRIPT when nobody listens. EVAL cannot fail that way. The
    # acquire goes by EVALSHA (``acquire``), and so do a lease's release (sent again by
    # EVAL after a late NOSCRIPT) and an extension on one node (``_by_sha``):
    # docs/architecture.md, "EVALSHA where a NOSCRIPT is always answered".
    return b"".join((_eval_head(name, len(keys) + len(args)), _keys(keys)[0], _bulk(args)))


# An argument that changes from call to call (a token, a proposal), in a ``_frame``.
_VARIES = None


@lru_cache(maxsize=1024)
def _frame(args: tuple[str | int | None, ...]) -> tuple[bytes, tuple[str, ...]]:
    """A hot script call's arguments with all but the varying ones (``_VARIES``) encoded
    once: (the arguments before the first varying one, the arguments after each varying
    one). ``_fill`` completes them.

    An acquire has 11 arguments of which 5 change per call, a release 4 of which 2; the
    others (TTL, retention, mode, channel...) are the same for every lock of a client, so
    a few frames serve every name (the keys are encoded apart, ``_keys``; on a Redis
    Cluster the channel is the slot's, a frame per slot in use). The arguments
    after a varying one are kept as text, one character per byte (latin-1), so that
    ``_fill`` encodes once.
    """
    chunks: list[bytes] = []
    fixed: list[str | int] = []
    for arg in args:
        if arg is _VARIES:
            chunks.append(_bulk(tuple(fixed)) if fixed else b"")
            fixed = []
        else:
            fixed.append(arg)
    chunks.append(_bulk(tuple(fixed)) if fixed else b"")
    return chunks[0], tuple(chunk.decode("latin-1") for chunk in chunks[1:])


def _fill(rest: tuple[str, ...], values: tuple[str | int, ...]) -> bytes:
    """The varying arguments ``values``, each followed by the fixed ones after it."""
    parts = []
    for value, after in zip(values, rest, strict=True):
        text = str(value)
        parts.append(f"${len(text)}\r\n{text}\r\n{after}")
    filled = "".join(parts)
    if filled.isascii():
        # Tokens and numbers, and nearly always the fixed text: one byte per character,
        # so each length counted in characters is the length in bytes (checked once for
        # the whole, not per value).
        return filled.encode()
    # Text that is not ASCII somewhere: each value encoded as UTF-8 on its own, its
    # length counted in bytes.
    return b"".join(_bulk((v,)) + a.encode("latin-1") for v, a in zip(values, rest, strict=True))


def script_missing(error: str) -> bool:
    """A node answered EVALSHA with ``error`` because its script cache lacks the script
    (restarted, ``SCRIPT FLUSH``): the EVAL form runs it, and caches it again."""
    return error.startswith("NOSCRIPT")


def evalsha_refused(error: str) -> bool:
    """A node's ACL refused EVALSHA (a user granted ``+eval`` only): send it EVAL from now
    on. Redis and Valkey name the refused command in the reply, quoted."""
    return error.startswith("NOPERM") and "'evalsha'" in error.lower()


def about_scripts(error: str) -> bool:
    """``error`` is the node's script cache speaking (``script_missing``,
    ``evalsha_refused``): ``ScriptCache`` answers it, by EVAL, and it says nothing wrong
    of the node's configuration, even when it comes after its round."""
    return script_missing(error) or evalsha_refused(error)


# (status, number, floor) of an acquire reply, and the lock's PTTL when it carries it.
Info = tuple[int, ...] | None


# The answers of the commands whose reply is a yes or a no, made once: one per reply.
_YES: tuple[bool, Info] = (True, None)
_NO: tuple[bool, Info] = (False, None)


def _yes_if_one(reply: object) -> tuple[bool, Info]:
    # The release/extend/seed scripts answer 1 or 0 (seed also -1). Anything that is not
    # an integer cannot come from them, but from a service that answers in RESP and is
    # not Redis (an echo, "+OK" to everything): raised, so that the drivers take the node
    # for one that does not speak the Redis protocol (misconfigured), not for a "no".
    if type(reply) is int:  # not isinstance: a bool is not what Redis sends
        return _YES if reply == 1 else _NO
    return _YES if _integer(reply, "a script") == 1 else _NO


def _exists_reply(reply: object) -> tuple[bool, Info]:
    # EXISTS names the lock's key twice (``exists``) and counts it twice: 2 or 0. A
    # service that answers every command alike, ":1" or ":0", cannot pass then for a node
    # that has, or has not, the key: ``Lock.locked()`` would answer for it.
    if type(reply) is not int:
        reply = _integer(reply, "EXISTS")
    if reply == 0:
        return _NO
    if reply == 2:
        return _YES
    raise ValueError(f"a reply that is not EXISTS's for a key named twice: {reply}")


# acquire.lua's statuses that carry the server's replication ID when it has one to
# tell (acquire.py): a blank node of a promoted server, a node whose history changed.
NO_HISTORY, HISTORY_CHANGED = -2, -4


def _acquire_reply(proposal: int, reply: object) -> tuple[bool, Info]:
    # acquire.lua answers a grant of the proposal with the proposal alone, read here as
    # (1, proposal, proposal); else {status, number, floor}, or, held while waiting,
    # {0, floor, floor, pttl}, or, blank on a promoted server or history changed,
    # {-2 or -4, mark, floor, replication ID} (the ID read as the number its hex digits
    # spell, so that an Info stays integers); status 1 is a grant. Anything else cannot
    # come from it: raised, as in ``_yes_if_one``, so that the node is told
    # misconfigured at once, not counted as one where the lock is held elsewhere; so is
    # an integer other than the proposal (a service that answers every command with
    # ":1" grants nothing). The integers are checked one by one, not read by int(): a
    # third of the cost (a parse per node of every attempt).
    if type(reply) is int:
        if reply == proposal:
            return True, (1, proposal, proposal)
    elif type(reply) is list:
        if len(reply) == 3:
            status, number, floor = reply
            if (
                type(status) is int
                and type(number) is int
                and type(floor) is int
                and status != HISTORY_CHANGED
            ):
                return status == 1, (status, number, floor)
        elif len(reply) == 4:
            status, number, floor, pttl = reply
            if (
                status == 0
                and type(status) is int
                and type(number) is int
                and type(floor) is int
                and type(pttl) is int
            ):
                return False, (0, number, floor, pttl)
    return _acquire_reply_read(proposal, reply)


def _acquire_reply_read(proposal: int, reply: object) -> tuple[bool, Info]:
    """``_acquire_reply`` for the rest: integers a reader left as their digits, a
    changed history's ID, or ValueError for a reply that is not acquire.lua's."""
    if isinstance(reply, (bytes, str)):
        try:
            granted = _integer(reply, "acquire.lua") == proposal
        except ValueError:
            pass
        else:
            if granted:
                return True, (1, proposal, proposal)
    elif isinstance(reply, list) and 3 <= len(reply) <= 4:
        try:
            head = tuple(_integer(value, "acquire.lua") for value in reply[:3])
            if len(reply) == 4 and head[0] in (NO_HISTORY, HISTORY_CHANGED):
                return False, (*head, _replication_id(reply[3]))
            info = head if len(reply) == 3 else (*head, _integer(reply[3], "acquire.lua"))
        except ValueError:
            pass
        else:
            # A PTTL only comes with "held", and a changed history with its ID.
            if (len(info) == 3 and info[0] != HISTORY_CHANGED) or info[0] == 0:
                return info[0] == 1, info
    raise ValueError(f"a reply that is not acquire.lua's: {_shown(reply)}")


def _replication_id(reply: object) -> int:
    """A replication ID (40 hex digits, as bytes or text) as the number they spell; else
    ValueError."""
    text = reply.decode("ascii", "replace") if isinstance(reply, bytes) else reply
    if isinstance(text, str) and len(text) == 40:
        try:
            return int(text, 16)
        except ValueError:
            pass
    raise ValueError(f"a reply that is not a replication ID: {_shown(reply)}")


def _integer(reply: object, what: str) -> int:
    """``reply`` read as an integer reply of ``what``: an int, or one a reader left as its
    digits (bytes or text); else ValueError, as for bytes that are not RESP."""
    if isinstance(reply, (bytes, str)):
        try:
            return int(reply)
        except ValueError:
            pass
    elif type(reply) is int:
        return reply
    raise ValueError(f"a reply that is not {what}'s integer: {_shown(reply)}")


def _shown(reply: object) -> str:
    """``reply`` in a diagnosis: a scalar as it came, cut short; an array by its size
    (an echo's holds the command: key names and tokens, not for a log line)."""
    if isinstance(reply, list):
        return f"an array of {len(reply)}"
    return repr(reply)[:40]


# What a batch script needs of one command it runs (``Command.item``): the batch script
# (acquire_batch or release_batch), the keys encoded and how many, the arguments encoded
# and how many. A plain tuple: one is made per acquire and per release.
Item = tuple[str, bytes, int, bytes, int]


class Command:
    """A round's command, already packed, and how to read a node's reply to it.

    ``parse`` answers (yes, info); yes is None for "no, but our key may be there", so the
    node is cleaned up after a failed attempt. ``replies`` is how many replies the packed
    bytes produce; when more than one, ``parse`` receives them as a list, and at a
    round's deadline it also judges a node from the replies that came so far (at least
    one): a node that answered only part is not silent.

    ``fallback``: the same command by EVAL when ``packed`` is an EVALSHA of the script
    ``script``, what a node that cannot run that is sent instead (``ScriptCache``);
    None: ``packed`` runs on any node. It may be given as its two parts, (the head with
    the script's source, the rest), joined only if a node needs it: the source is 5 KB,
    and nearly every acquire goes out by EVALSHA alone. ``key``: a key of the command,
    which a Redis Cluster node sends it to the master of its slot. ``item``: what a
    batch of such commands needs of it (``batch``, ``Item``); None for a command that
    never goes in a batch. ``alone``: (the lock key, the token) of a lease's release,
    whose ``alone_form`` a Redis Cluster node sends when a slot migration splits its
    keys (``TRYAGAIN``). ``undo``: the command gives back what earlier ones may have
    taken (a release, a failed attempt's cleanup, a dequeue), so it must run after them
    on the node: it is written even to a connection found stalled, behind them, before
    that connection is let go (``_async.channels.Channel._let_go``,
    ``_sync.links.Link._let_go``).

    A plain class with slots, not a dataclass: two are made per acquire and release, and
    a frozen dataclass's ``__init__`` costs a call per field. What it says never changes.
    """

    __slots__ = (
        "_fallback",
        "alone",
        "by_sha",
        "item",
        "key",
        "packed",
        "parse",
        "replies",
        "resend_late",
        "script",
        "undo",
    )

    def __init__(
        self,
        packed: bytes,
        parse: Callable[[object], tuple[bool | None, Info]] = _yes_if_one,
        replies: int = 1,
        fallback: bytes | tuple[bytes, bytes] | None = None,
        key: str = "",
        item: Item | None = None,
        script: str = "",
        resend_late: bool = False,
        alone: tuple[str, str] | None = None,
        undo: bool = False,
    ) -> None:
        self.packed = packed
        self.parse = parse
        self.replies = replies
        self._fallback = fallback
        self.by_sha = fallback is not None  # ``packed`` is an EVALSHA with an EVAL form
        self.key = key
        self.item = item
        self.script = script
        # A NOSCRIPT that comes after the round ended still gets the EVAL form: a
        # release, whose work must reach every node (the asyncio driver sends it when the
        # NOSCRIPT comes, the blocking one at the end of the round that read it). Never
        # an acquire: its grant would be a lock nobody waits for.
        self.resend_late = resend_late
        self.alone = alone
        self.undo = undo

    @property
    def fallback(self) -> bytes | None:
        parts = self._fallback
        if isinstance(parts, tuple):
            parts = self._fallback = b"".join(parts)
        return parts

    def is_yes(self, reply: object) -> bool:
        return self.parse(reply)[0] is True

    def __repr__(self) -> str:
        return f"Command({self.packed[:60]!r}..., replies={self.replies}, key={self.key!r})"


# The scripts that go by EVALSHA, with their EVAL form as the fallback: after one
# NOSCRIPT the node may lack any of them (a flush or a restart empties the whole cache).
BY_SHA = frozenset({"acquire", "acquire_batch", "release", "release_batch", "extend"})


def _by_sha(
    name: str,
    argc: int,
    tail: bytes,
    parse: Callable[[object], tuple[bool | None, Info]] = _yes_if_one,
    *,
    item: Item | None = None,
    key: str = "",
    resend_late: bool = False,
    alone: tuple[str, str] | None = None,
    undo: bool = False,
) -> Command:
    """``name``'s script with its keys and arguments ``tail``, by EVALSHA, with its EVAL
    form as the fallback (``ScriptCache``). For a script whose NOSCRIPT must not go
    unanswered, only where the round reads every node's reply (an extension on one node:
    ``Flows.reads_all``) or the drivers answer a late one (a release:
    ``Command.resend_late``)."""
    return Command(
        _evalsha_head(name, argc) + tail,
        parse,
        fallback=(_eval_head(name, argc), tail),
        key=key,
        item=item,
        script=name,
        resend_late=resend_late,
        alone=alone,
        undo=undo,
    )


# What a driver sends a Redis Cluster node besides the scripts: ASKING before a command
# an ASK redirection sends to a slot's importing master, and the slot map's query.
ASKING = Command(pack("ASKING"))
CLUSTER_SLOTS = pack("CLUSTER", "SLOTS")
# What a new connection to a node gone silent asks before it is used (``backoff``): any
# answer, a refusal too, says the node answers; so it needs no grant (``_driver.acl``).
PING = pack("PING")


def behind_marker(nonce: str) -> bytes:
    """A script that returns ``nonce``, written behind a command sent without waiting on
    a connection whose replies are no longer counted (a round an interrupt cut short):
    the reply read just before the nonce is that command's, whatever came before it.
    By EVAL, with no key, which a node's ACL allows already (ECHO it might not), and
    which any master of a Redis Cluster runs."""
    return pack("EVAL", "return ARGV[1]", 0, nonce)


class ScriptCache:
    """What a client knows of one node's script cache, from its answers to EVALSHA.

    A node that answers an acquire's EVALSHA with NOSCRIPT (restarted, ``SCRIPT
    FLUSH``) granted nothing. Within the round it is sent the EVAL form at once, on the
    same connection (``answered`` returns it), which runs the script and caches it
    again; a NOSCRIPT that comes after the round ended (a node outside the first
    majority) makes the *next* acquire go to it by EVAL (a release, which must run there,
    is sent again by EVAL: ``resend_late``).
    Either way the node is never left refusing every acquire, silently lowering how many
    failures a quorum survives. After a NOSCRIPT every script of ``BY_SHA`` goes once by
    EVAL, each caching itself again: the whole cache went. A script not sent within the
    next ``MARK_LIFE`` commands by EVALSHA to the node is one this client does not use
    (a blocking client never sends the batch scripts): its mark is dropped, so that the
    drivers go back to their fast path (``as_packed``), and should it come after all,
    its EVALSHA's NOSCRIPT is answered as any (by EVAL, within the round or after it). A
    node whose ACL refuses EVALSHA (a user granted ``+eval`` only) is sent EVAL from
    then on.
    """

    __slots__ = ("_left", "as_packed", "eval_only", "missing")

    # A mark saves the round trip of a NOSCRIPT answered by EVAL, for a script sent soon
    # after; one sent later pays it once, as on a node it never used. A lock's cycle
    # sends two commands by EVALSHA, so the marks live 16 cycles at most: the drivers
    # are soon back on their fast path.
    MARK_LIFE = 32

    def __init__(self) -> None:
        self.eval_only = False  # its ACL refused EVALSHA
        # The scripts not sent by EVAL since it last answered NOSCRIPT.
        self.missing: set[str] = set()
        self._left = 0  # commands by EVALSHA until the marks in ``missing`` are dropped
        # Every command goes as it was packed (neither of the above): what a driver
        # looks at before it asks ``packed``, a call on every node of every round.
        self.as_packed = True

    def packed(self, command: Command) -> bytes:
        """The bytes of ``command`` for this node."""
        if not command.by_sha:
            return command.packed
        if self.eval_only or command.script in self.missing:
            self._sent_by_eval(command.script)
            fallback = command.fallback
            assert fallback is not None  # it has one: by_sha
            return fallback
        if self.missing:
            self._left -= 1
            if self._left <= 0:
                self.missing.clear()
                self.as_packed = True  # not eval_only: answered above
        return command.packed

    def answered(self, error: str, command: Command | None) -> Command | None:
        """Note the node's error reply ``error`` to ``command`` (None: to a command whose
        round is over); return what to write to it within the round, or None (then the
        error is the node's answer)."""
        if evalsha_refused(error):
            self.eval_only = True
        elif script_missing(error):
            self.missing = set(BY_SHA)
            self._left = self.MARK_LIFE
        else:
            return None
        self.as_packed = False
        if command is None or command.fallback is None:
            return None
        self._sent_by_eval(command.script)
        return Command(command.fallback, command.parse, command.replies, key=command.key)

    def _sent_by_eval(self, script: str) -> None:
        self.missing.discard(script)  # the EVAL form caches the script again
        self.as_packed = not (self.missing or self.eval_only)


def acked_by_replicas(command: Command, replicas: int, timeout_ms: int) -> Command:
    """``command``, then ``WAIT replicas timeout_ms`` on the same connection.

    Redis answers ``WAIT`` with the number of replicas that acknowledged every write this
    connection made before it, so a "yes" to ``command`` stands only when that number
    reaches ``replicas``. Below it the node's answer becomes None: not a vote, and the
    key we may have set there is released with the rest of a failed attempt (fail closed).
    A ``WAIT`` not answered by the round's deadline counts as no acknowledgement: Redis
    times a blocked ``WAIT`` out only on its cron tick (every 100 ms at the default
    ``hz 10``), so with an absent replica its answer often comes just too late.
    """
    inner = command.parse

    def parse(replies: object) -> tuple[bool | None, Info]:
        # The drivers hand over the replies as a list: both, or the first alone when the
        # WAIT was still blocked at the round's deadline.
        assert isinstance(replies, list)
        assert replies
        reply, acked = replies[0], replies[1] if len(replies) > 1 else None
        yes, info = inner(reply)
        if yes and not (isinstance(acked, int) and acked >= replicas):
            return None, info
        return yes, info

    wait = pack("WAIT", replicas, timeout_ms)
    # By EVAL: a NOSCRIPT followed by WAIT's reply would have to be resent with its WAIT.
    return Command(
        (command.fallback or command.packed) + wait,
        parse,
        command.replies + 1,
        key=command.key,
    )


class WaitArgs(NamedTuple):
    """What queues a blocked acquirer (acquire.lua ARGV[6..10]).

    ``mode`` is "n" (notified waiting), "f" (fair, one node) or "q" (fair on a quorum);
    ``waiter`` the waiter id, stable over one acquire call; ``channel`` where its
    process listens; ``place_ms`` how long its place lives unless renewed (0: a
    non-blocking attempt, never queued); ``ticket`` ("q") its place in the queue, the
    same on every node (the wall clock in µs when the acquire call began); ``sharded``
    the channel is a Cluster slot's, notified by SPUBLISH (``waiting.ShardSubs``).
    A named tuple: one is made per attempt, at a third of a frozen dataclass's cost.
    """

    mode: str
    waiter: str
    channel: str
    place_ms: int
    ticket: int = 0
    sharded: bool = False


def acquire(
    spec: LockSpec,
    token: str,
    proposal: int,
    mark: int,
    mark_ms: int,
    wait: WaitArgs | None = None,
) -> Command:
    """acquire.lua: take ``spec``'s lock with fencing token ``proposal`` (``mark``: the
    observation mark a blank node keeps for ``mark_ms``); ``wait`` queues the caller."""
    keys = spec.keys
    # token, TTL, proposal, mark, the mark's life, retention (acquire.lua's ARGV)
    args: tuple[str | int | None, ...] = (
        _VARIES,
        spec.ttl_ms,
        _VARIES,
        _VARIES,
        mark_ms,
        spec.retention_ms,
    )
    values: tuple[str | int, ...] = (token, proposal, mark)
    if wait is None:
        node_keys: tuple[str, ...] = (keys.lock, keys.floor, keys.warm)
    else:
        node_keys = (keys.lock, keys.floor, keys.warm, keys.queue)
        # mode, waiter id, channel, place's life, ticket[, sharded]
        args += (wait.mode, _VARIES, wait.channel, wait.place_ms, _VARIES)
        if wait.sharded:
            args += (SHARDED,)
        values += (wait.waiter, wait.ticket)
    start, rest = _frame(args)
    argc = len(node_keys) + len(args)
    arguments = start + _fill(rest, values)
    counted, listed = (_cached_keys if spec.cached else _encode_keys)(node_keys)
    # By EVALSHA: the server need not hash the 3.5 KB body each time, and a node that
    # cannot run it answers without granting anything (``ScriptCache``).
    item: Item = ("acquire_batch", listed, len(node_keys), arguments, len(args))
    parse = partial(_acquire_reply, proposal)
    return _by_sha("acquire", argc, counted + arguments, parse, item=item, key=keys.lock)


# The last batch packed: a command of a round goes to every node, so in one turn each
# node's connection is most often given the very same batch (the same commands, in the
# same order) to pack; the first packs it, the others take it from here. Commands hash
# and compare by identity, so a hit is the same objects.
@lru_cache(maxsize=1)
def batch(commands: tuple[Command, ...]) -> Command:
    """``commands`` (all of one batch script, ``Item``'s first field) in one run of it.
    acquire_batch.lua goes by EVALSHA with its EVAL form as the fallback, as ``acquire``;
    release_batch.lua likewise when each of its releases goes by EVALSHA, else by EVAL
    (``release_waking``). Its reply is the list of theirs, in order (``split_batch``)."""
    keys: list[bytes] = []
    parts: list[bytes] = []
    nkeys = argc = 0
    name = ""
    for command in commands:
        item = command.item
        assert item is not None  # one that goes in a batch
        name, listed, count, arguments, nargs = item
        nkeys += count
        argc += nargs
        keys.append(listed)
        parts.append(_counts(count, nargs))
        parts.append(arguments)
    argc += nkeys + 2 * len(commands)
    tail = b"".join((_bulk((nkeys,)), *keys, *parts))
    if name == "release_batch" and not all(command.by_sha for command in commands):
        return Command(_eval_head(name, argc) + tail)
    # By EVALSHA: acquires, and releases that may go so (``release_waking``). A NOSCRIPT
    # reaches every command of the batch, and each one's round resends it alone by EVAL.
    return _by_sha(name, argc, tail)


def split_batch(reply: object, size: int) -> list[object] | None:
    """The replies of the ``size`` commands of a ``batch`` in its reply ``reply``, in
    order; None when ``reply`` is not that (an error for the whole batch)."""
    if isinstance(reply, list) and len(reply) == size:
        return reply
    return None


@cache
def _counts(nkeys: int, nargs: int) -> bytes:
    # A command's numbers of keys and of arguments in a batch: a few pairs in all.
    return _bulk((nkeys, nargs))


def seed(spec: LockSpec, floor: int, warm_ms: int, marks: frozenset[int]) -> Command:
    """seed.lua: give a blank node the floor ``floor`` and a warm-up of ``warm_ms``."""
    keys = spec.keys
    return Command(
        _eval("seed", (keys.floor, keys.warm), floor, warm_ms, spec.retention_ms, *sorted(marks)),
        key=keys.floor,
    )


def release(key: str, token: str) -> Command:
    """Compare-and-delete that wakes nobody (cleanup of an attempt that failed)."""
    return Command(_eval("release", (key,), token), key=key, undo=True)


def release_waking(
    spec: LockSpec,
    token: str,
    mode: str,
    arg: int,
    fencing: int = 0,
    *,
    cleanup: bool = False,
    by_sha: bool = False,
    place: WaitArgs | None = None,
    late: bool = False,
) -> Command:
    """A lease's release: compare-and-delete, then pass the lock on to the next waiter
    (``mode`` as in ``WaitArgs``): "n" wakes it and reserves the lock for it for ``arg``
    ms; "f" hands the lock over; "q" hands it over with the fencing token ``arg``.
    ``fencing``: the lease's token, to which a node that no longer (or not yet) holds the
    key raises its floor (release.lua); 0 for no lease (a cleanup, a waiter giving up).
    ``late``: an attempt of the lease's call may still reach some node, proposing up to
    ``fencing``: every node raises its floor to it, its key there or not ("l").
    ``cleanup``: releasing a failed attempt's grants, the caller keeps its place;
    ``place`` (fair on a quorum, a waiter that queues): its place is set again first,
    at its ticket (release.lua ARGV[7..9]).
    ``by_sha``: by EVALSHA (a lease's release), a NOSCRIPT answered by EVAL within the
    round or, late, by the drivers (``Command.resend_late``); else by EVAL (``_eval``)."""
    keys = spec.keys
    queue_keys = (keys.lock, keys.floor, keys.queue)
    extra: tuple[str | int | None, ...] = ("c",) if cleanup else ("l",) if late else ()
    values: tuple[str | int, ...] = (token, arg, fencing)
    if cleanup and place is not None and place.place_ms:
        record = f"{place.channel} {spec.ttl_ms}" + (f" {SHARDED}" if place.sharded else "")
        extra = ("c", _VARIES, record, place.place_ms)
        values += (place.ticket,)
    args = (_VARIES, mode, _VARIES, spec.retention_ms, _VARIES, *extra)
    start, rest = _frame(args)
    argc = len(queue_keys) + len(args)
    arguments = start + _fill(rest, values)
    counted, listed = (_cached_keys if spec.cached else _encode_keys)(queue_keys)
    item: Item = ("release_batch", listed, len(queue_keys), arguments, len(args))
    if by_sha:
        tail = counted + arguments
        alone = None if cleanup else (keys.lock, token)
        return _by_sha(
            "release",
            argc,
            tail,
            item=item,
            key=keys.lock,
            resend_late=True,
            alone=alone,
            undo=True,
        )
    return Command(
        _eval_head("release", argc) + counted + arguments,
        key=keys.lock,
        item=item,
        alone=None if cleanup else (keys.lock, token),
        undo=True,
    )


def alone_form(command: Command) -> Command | None:
    """What a Redis Cluster node sends instead of a lease's release when a slot
    migration split its keys between two masters (``TRYAGAIN``: one master has some of
    them, and a key that does not exist, such as the queue while nobody waits, is at
    neither): the compare-and-delete of the lock key alone, sent to the master that
    answered, which has the lock key if anyone does. Without it the lease could not be
    released until the migration ended, and its key held the lock for its TTL. It wakes
    nobody (a waiter re-checks at its fallback bound) and raises no floor: the key was
    ours, and its grant raised the floor (only an acquire still on its way to another
    node of a Redlock could land after it there, and hold that node until its TTL). None
    for any other command: an acquire needs its node's keys, and fails closed until the
    migration ends."""
    if command.alone is None:
        return None
    key, token = command.alone
    return release(key, token)


class Hop(NamedTuple):
    """Where a Redis Cluster node's error reply sends a command again: ``command`` (the
    one answered, or its ``alone_form``) to the member at ``to``, after ``ASKING`` if
    ``asking``. ``moved``: the slot that ``to`` now serves (a ``MOVED``), else -1."""

    command: Command
    to: Address
    asking: bool
    moved: int = -1


def next_hop(
    command: Command, hop: Redirect, replied: Address, asking: bool, hops: int
) -> Hop | None:
    """What follows the cluster redirection ``hop`` that the member at ``replied``
    answered to ``command`` (sent there after ``ASKING`` if ``asking``), ``hops``
    redirections followed so far; None: nothing, the node gives no answer to it.

    ``MOVED`` and ``ASK`` send the command where they name (``ASK`` after ``ASKING``);
    ``TRYAGAIN`` sends a lease's release as its lock key alone to the member that
    answered, as it was sent there (``alone_form``); ``CLUSTERDOWN``, and anything once
    ``MAX_REDIRECTS`` were followed, nothing. The same rule for a round's request and
    for a command sent without waiting (a release or a cleanup written behind an
    interrupted round), whose redirections the drivers follow after its round."""
    if hops >= MAX_REDIRECTS:
        return None
    if hop.kind == "tryagain":
        alone = alone_form(command)
        return None if alone is None else Hop(alone, replied, asking)
    if hop.to is None:
        return None
    if hop.kind == "moved":
        return Hop(command, hop.to, False, hop.slot)
    return Hop(command, hop.to, True)


def dequeue(release: Command) -> Command:
    """A waiter gives up its place: ``release_waking`` with its waiter id (which also
    passes on a fair hand-off that crossed the give-up); any answer will do, so it goes
    by EVAL (a NOSCRIPT would be an answer). Its ``alone_form`` deletes a lock handed to
    the waiter (its id is the key's token) where a slot migration split the keys."""
    return Command(
        release.fallback or release.packed,
        _any_reply,
        key=release.key,
        alone=release.alone,
        undo=True,
    )


def _any_reply(reply: object) -> tuple[bool, Info]:
    return isinstance(reply, int), None


def extend(spec: LockSpec, token: str, *, by_sha: bool = False) -> Command:
    """extend.lua: a new TTL for our key, and another retention for the node's floor.
    ``by_sha``: by EVALSHA, only where the round reads every node's reply (``_by_sha``)."""
    keys = spec.keys
    node_keys = (keys.lock, keys.floor)
    args = (token, spec.ttl_ms, spec.retention_ms)
    if by_sha:
        tail = _keys(node_keys)[0] + _bulk(args)
        return _by_sha("extend", len(node_keys) + len(args), tail, key=keys.lock)
    return Command(_eval("extend", node_keys, *args), key=keys.lock)


def exists(key: str) -> Command:
    """``Lock.locked()``'s question: is ``key`` there? The key is named twice, so that the
    answer (2 or 0) is EXISTS's own (``_exists_reply``)."""
    return Command(pack("EXISTS", key, key), _exists_reply, key=key)

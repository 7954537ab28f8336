"""RESP packing, reply classification, and the shipped Lua scripts."""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from importlib.resources import files

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure._core import commands
from tenure._core.acquire import GRANTED, HELD, TOO_LOW, WARMING
from tenure._core.caching import CACHED_CHARS
from tenure._core.commands import NO_HISTORY, Command, pack
from tenure._core.config import ClientConfig, LockKeys, LockSpec
from tenure._core.slots import key_slot, routed_slot
from tenure._core.waiting import SHARDED
from tenure._lua import Script, expand, script, wire_form

SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=300)


def parse_command(data: bytes) -> tuple[list[bytes], bytes]:
    """Parse one RESP array of bulk strings; return its items and what follows it."""

    def line(at: int) -> tuple[bytes, int]:
        end = data.index(b"\r\n", at)
        return data[at:end], end + 2

    header, pos = line(0)
    assert header[:1] == b"*", header
    count = int(header[1:])
    assert count >= 0
    items: list[bytes] = []
    for _ in range(count):
        size_line, pos = line(pos)
        assert size_line[:1] == b"$", size_line
        assert re.fullmatch(rb"\$(0|[1-9][0-9]*)", size_line), size_line
        size = int(size_line[1:])
        items.append(data[pos : pos + size])
        assert len(items[-1]) == size, "bulk string shorter than its length"
        assert data[pos + size : pos + size + 2] == b"\r\n"
        pos += size + 2
    return items, data[pos:]


def test_pack_exact_bytes() -> None:
    assert pack("SET", "k", "v") == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n"
    assert pack("PX", 1500) == b"*2\r\n$2\r\nPX\r\n$4\r\n1500\r\n"
    assert pack(b"\x00\r\n", "") == b"*2\r\n$3\r\n\x00\r\n\r\n$0\r\n\r\n"
    assert pack() == b"*0\r\n"


def test_pack_encodes_text_as_utf8() -> None:
    assert pack("é") == b"*1\r\n$2\r\n\xc3\xa9\r\n"


arguments = st.lists(
    st.one_of(st.binary(max_size=40), st.text(max_size=20), st.integers(-(2**63), 2**63)),
    max_size=8,
)


def _as_bytes(arg: bytes | str | int) -> bytes:
    return arg if isinstance(arg, bytes) else str(arg).encode()


@SETTINGS
@given(arguments)
def test_pack_round_trips_through_a_resp_parser(args: list[bytes | str | int]) -> None:
    packed = pack(*args)
    items, rest = parse_command(packed)
    assert rest == b""
    assert items == [_as_bytes(a) for a in args]


@SETTINGS
@given(arguments, arguments)
def test_packed_commands_concatenate(
    a: list[bytes | str | int], b: list[bytes | str | int]
) -> None:
    # Pipelined commands are just concatenated; each one parses back on its own.
    first, rest = parse_command(pack(*a) + pack(*b))
    second, tail = parse_command(rest)
    assert (first, second, tail) == ([_as_bytes(x) for x in a], [_as_bytes(x) for x in b], b"")


# --- the commands of each round -----------------------------------------------------------


SPEC = LockSpec.build(ClientConfig.build(["redis://a", "redis://b", "redis://c"]), "r", 1.5)
KEYS = SPEC.keys
RETENTION = b"3600000"  # the default retention, in ms


def test_acquire_command_evals_acquire_lua_with_three_keys() -> None:
    cmd = commands.acquire(SPEC, "tok", 1_700_000_000_000_123, 77, 60_000)
    items, rest = parse_command(cmd.packed)
    assert rest == b""
    # By EVALSHA, with the EVAL form (the same arguments after the body) as its fallback.
    assert cmd.fallback is not None
    fallback, rest = parse_command(cmd.fallback)
    assert rest == b""
    assert fallback[:2] == [b"EVAL", script("acquire").wire]
    assert fallback[2:] == items[2:]
    assert items == [
        b"EVALSHA",
        hashlib.sha1(script("acquire").wire).hexdigest().encode(),
        b"3",
        b"tenure:{r}:lock",
        b"tenure:node:floor",
        b"tenure:node:warm",
        b"tok",
        b"1500",
        b"1700000000000123",
        b"77",
        b"60000",
        RETENTION,
    ]


def test_waiting_acquire_command_adds_the_queue_and_the_waiter() -> None:
    wait = commands.WaitArgs("q", "w1", "ch:1", 3000, 42)
    items, rest = parse_command(commands.acquire(SPEC, "w1", 99, 5, 9, wait).packed)
    assert rest == b""
    assert items[2:] == [
        b"4",
        b"tenure:{r}:lock",
        b"tenure:node:floor",
        b"tenure:node:warm",
        b"tenure:{r}:q",
        b"w1",
        b"1500",
        b"99",
        b"5",
        b"9",
        RETENTION,
        b"q",
        b"w1",
        b"ch:1",
        b"3000",
        b"42",
    ]


def test_seed_command_evals_seed_lua_with_the_node_keys() -> None:
    items, rest = parse_command(commands.seed(SPEC, 42, 60_000, frozenset({9, 3})).packed)
    assert rest == b""
    assert items == [
        b"EVAL",
        script("seed").wire,
        b"2",
        b"tenure:node:floor",
        b"tenure:node:warm",
        b"42",
        b"60000",
        RETENTION,
        b"3",
        b"9",
    ]


def test_the_retention_is_the_clients() -> None:
    config = ClientConfig.build(["redis://a"], max_ttl=2.0, retention=7.5)
    spec = LockSpec.build(config, "r", 1.0)
    assert spec.retention_ms == 7_500
    for cmd in (
        commands.acquire(spec, "t", 5, 1, 1),
        commands.seed(spec, 0, 0, frozenset({1})),
        commands.extend(spec, "t"),
        commands.release_waking(spec, "t", "f", 0),
    ):
        assert b"7500" in parse_command(cmd.packed)[0]


@SETTINGS
@given(
    name=st.text(min_size=1, max_size=20),
    token=st.text(alphabet="0123456789abcdef", min_size=1, max_size=32),
    ttl_ms=st.integers(1, 86_400_000),
    proposal=st.integers(0, 2**53 - 1),
)
def test_acquire_command_round_trips(name: str, token: str, ttl_ms: int, proposal: int) -> None:
    spec = replace(SPEC, name=name, keys=LockKeys.of(name), ttl_ms=ttl_ms)
    keys = spec.keys
    items, rest = parse_command(commands.acquire(spec, token, proposal, 5, 9).packed)
    assert rest == b""
    assert items[2:] == [
        b"3",
        keys.lock.encode(),
        b"tenure:node:floor",
        b"tenure:node:warm",
        token.encode(),
        str(ttl_ms).encode(),
        str(proposal).encode(),
        b"5",
        b"9",
        RETENTION,
    ]


@pytest.mark.parametrize(
    ("make", "name", "keys", "extra"),
    [
        (lambda: commands.release("K", "T"), "release", [b"K"], [b"T"]),
        (
            lambda: commands.extend(SPEC, "T"),
            "extend",
            [b"tenure:{r}:lock", b"tenure:node:floor"],
            [b"T", b"1500", RETENTION],
        ),
        (
            lambda: commands.release_waking(SPEC, "T", "q", 77, 76),
            "release",
            [b"tenure:{r}:lock", b"tenure:node:floor", b"tenure:{r}:q"],
            [b"T", b"q", b"77", RETENTION, b"76"],
        ),
        (
            lambda: commands.release_waking(SPEC, "T", "n", 100, cleanup=True),
            "release",
            [b"tenure:{r}:lock", b"tenure:node:floor", b"tenure:{r}:q"],
            [b"T", b"n", b"100", RETENTION, b"0", b"c"],
        ),
    ],
)
def test_script_commands_send_the_source_with_eval(
    make: object, name: str, keys: list[bytes], extra: list[bytes]
) -> None:
    assert callable(make)
    cmd = make()
    assert isinstance(cmd, Command)
    items, rest = parse_command(cmd.packed)
    assert rest == b""
    assert items == [b"EVAL", script(name).wire, str(len(keys)).encode(), *keys, *extra]


def test_exists_command() -> None:
    cmd = commands.exists("K")
    # The key twice: EXISTS answers 2 or 0, which a service answering ":1" does not.
    assert parse_command(cmd.packed)[0] == [b"EXISTS", b"K", b"K"]


# --- reading replies ----------------------------------------------------------------------

YES_NO_COMMANDS = [
    commands.release("k", "t"),
    commands.extend(SPEC, "t"),
    commands.seed(SPEC, 0, 0, frozenset({1})),
]


@pytest.mark.parametrize(
    ("reply", "yes"),
    [
        (1, True),
        (0, False),
        (2, False),
        (-1, False),  # seed.lua: a floor already there
        (b"1", True),  # a reader that left an integer as its digits
        (b"0", False),
        ("1", True),
    ],
)
def test_yes_no_replies(reply: object, yes: bool) -> None:
    for cmd in YES_NO_COMMANDS:
        assert cmd.is_yes(reply) is yes
        assert cmd.parse(reply) == (yes, None)


# What a service that speaks RESP but is not Redis answers (an echo of the command, "+OK"
# or nil to everything): no script of ours answers so. Raised (ValueError, as for bytes
# that are not RESP), so that the drivers take the node for misconfigured at once
# (docs/errors.md), not for a node that said "no".
NOT_REDIS_REPLIES = [
    None,
    b"",
    b"OK",
    "OK",
    b"1.5",
    1.0,
    True,  # no RESP2 reply is a bool (hiredis reads RESP3's "#t" as one)
    [1, 1],
    [],
    [b"EVALSHA", b"0123", b"3", b"k", b"f", b"w"],
    {b"a": 1},
]


@pytest.mark.parametrize("reply", NOT_REDIS_REPLIES)
def test_yes_no_replies_that_are_not_redis_raise(reply: object) -> None:
    for cmd in YES_NO_COMMANDS:
        with pytest.raises(ValueError, match="not a script's integer"):
            cmd.parse(reply)


@pytest.mark.parametrize(("reply", "yes"), [(2, True), (0, False), (b"2", True), (b"0", False)])
def test_exists_replies(reply: object, yes: bool) -> None:
    # The key is named twice, and counted twice: 2 when it is there.
    assert commands.exists("k").parse(reply) == (yes, None)


@pytest.mark.parametrize("reply", [1, -1, 3, *NOT_REDIS_REPLIES])
def test_exists_replies_that_are_not_redis_raise(reply: object) -> None:
    # A service answering ":1" to everything must not pass for a node holding the lock.
    with pytest.raises(ValueError, match="EXISTS"):
        commands.exists("k").parse(reply)


@pytest.mark.parametrize(
    ("reply", "parsed"),
    [
        (
            [1, 1_700_000_000_000_000, 1_700_000_000_000_000],
            (True, (GRANTED, 1_700_000_000_000_000, 1_700_000_000_000_000)),
        ),
        ([1, 17, 40], (True, (GRANTED, 17, 40))),  # a lock below another's floor
        ([0, 17, 20], (False, (HELD, 17, 20))),
        ([0, 17, 20, 900], (False, (HELD, 17, 20, 900))),  # held, while waiting: its PTTL
        ([0, 17, 20, -1], (False, (HELD, 17, 20, -1))),  # reserved for a woken waiter
        ([-1, 99, 99], (False, (TOO_LOW, 99, 99))),
        ([-2, 12345, 0], (False, (NO_HISTORY, 12345, 0))),
        ([-3, 59_000, 7], (False, (WARMING, 59_000, 7))),
        # A history that changed, with the node's replication ID (read as a number).
        ([-4, 12345, 7, b"ab" * 20], (False, (-4, 12345, 7, int("ab" * 20, 16)))),
        ([-4, 12345, 0, "0f" * 20], (False, (-4, 12345, 0, int("0f" * 20, 16)))),
        ([b"1", b"5", b"5"], (True, (GRANTED, 5, 5))),  # RESP2 readers may leave bytes
        ([b"0", b"5", b"5", b"900"], (False, (HELD, 5, 5, 900))),
        ([1, b"5", "5"], (True, (GRANTED, 5, 5))),
        # A grant of the proposal (5 here), answered with the proposal alone.
        (5, (True, (GRANTED, 5, 5))),
        (b"5", (True, (GRANTED, 5, 5))),
    ],
)
def test_acquire_replies(reply: object, parsed: tuple[bool, tuple[int, ...] | None]) -> None:
    cmd = commands.acquire(SPEC, "t", 5, 1, 10)
    assert cmd.parse(reply) == parsed
    assert cmd.is_yes(reply) is parsed[0]


@pytest.mark.parametrize(
    "reply",
    [
        *NOT_REDIS_REPLIES,
        1,  # ":1" to everything
        0,
        4,  # an integer is a grant only as the proposal, 5 here
        6,
        -1,
        b"6",
        "4",
        True,
        5.0,
        [1],
        [1, 2],
        [0, 2],
        [1, 2, 3, 4],  # a pttl only comes with "held"
        [-1, 2, 3, 4],
        [b"1", 2, 3, 4],
        [0, 1, 2, 3, 4],
        (1, 5, 5),
        [1, 5, None],
        [1, 5, [5]],
        [True, 5, 5],
        [1.0, 5, 5],
        [b"OK", b"OK", b"OK"],
        [b"1", b"5", b"x"],
        [-4, 12345, 7],  # a changed history comes with its ID
        [-4, 12345, 7, 8],
        [-4, 12345, 7, b"ab" * 19],
        [-4, 12345, 7, b"xy" * 20],
        [0, 12345, 7, b"ab" * 20],  # an ID only comes with a changed history
    ],
)
def test_acquire_replies_that_are_not_redis_raise(reply: object) -> None:
    # Not a "no" (held elsewhere): a blocking acquire would wait forever on such nodes.
    with pytest.raises(ValueError, match=r"acquire\.lua"):
        commands.acquire(SPEC, "t", 5, 1, 10).parse(reply)


def test_a_reply_in_a_diagnosis_shows_no_array_contents() -> None:
    # An echo's array holds the command: key names and the owner token.
    with pytest.raises(ValueError, match="an array of 2") as info:
        commands.acquire(SPEC, "secret-token", 5, 1, 10).parse([b"EVALSHA", b"secret-token"])
    assert "secret-token" not in str(info.value)


@SETTINGS
@given(
    status=st.integers(-3, 1),
    number=st.integers(0, 2**53 - 1),
    floor=st.integers(0, 2**53 - 1),
)
def test_acquire_reply_status_one_is_the_only_yes(status: int, number: int, floor: int) -> None:
    ok, info = commands.acquire(SPEC, "t", 5, 1, 10).parse([status, number, floor])
    assert ok is (status == GRANTED)
    assert info == (status, number, floor)


@SETTINGS
@given(proposal=st.integers(1, 2**53 - 1), reply=st.integers(-(2**63), 2**63 - 1))
def test_an_integer_reply_grants_only_as_the_proposal(proposal: int, reply: int) -> None:
    # A service that answers every command with one integer must not pass for a node
    # granting the lock: only the proposal the acquire sent is a grant (with it as token).
    parse = commands.acquire(SPEC, "t", proposal, 1, 10).parse
    assert parse(proposal) == (True, (GRANTED, proposal, proposal))
    if reply != proposal:
        with pytest.raises(ValueError, match=r"acquire\.lua"):
            parse(reply)


# --- Lua scripts --------------------------------------------------------------------------

SCRIPT_NAMES = sorted(
    p.name.removesuffix(".lua") for p in files("tenure._lua").iterdir() if p.name.endswith(".lua")
)


def test_expected_scripts_ship() -> None:
    assert {"acquire", "seed", "release", "extend"} <= set(SCRIPT_NAMES)


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_script_loads(name: str) -> None:
    s = script(name)
    assert isinstance(s, Script)
    assert s.name == name
    assert s.source == files("tenure._lua").joinpath(f"{name}.lua").read_bytes()
    assert s.source.decode("utf-8")  # Redis takes the body as text
    assert b"redis.call" in expand(s.source)  # its code may be in the fragments it includes
    assert script(name) is s  # loaded once per process


@pytest.mark.parametrize("name", SCRIPT_NAMES)
def test_script_opens_with_a_comment_block_naming_keys_and_argv(name: str) -> None:
    text = script(name).source.decode("utf-8")
    lines = text.splitlines()
    assert lines[0].startswith("--"), "a script opens with its comment block"
    header: list[str] = []
    for line in lines:
        if not line.startswith("--"):
            break
        header.append(line)
    block = "\n".join(header)
    used_keys = set(re.findall(r"KEYS\[(\d+)\]", text))
    used_argv = set(re.findall(r"ARGV\[(\d+)\]", text))
    for i in used_keys:
        assert f"KEYS[{i}]" in block, f"KEYS[{i}] is used but not documented"
    for i in used_argv:
        assert f"ARGV[{i}]" in block, f"ARGV[{i}] is used but not documented"
    assert "KEYS" in block
    assert "ARGV" in block
    assert "Returns" in block


def test_unknown_script_raises() -> None:
    with pytest.raises(OSError, match="no-such-script"):
        script("no-such-script")


@pytest.mark.parametrize("name", ["acquire", "seed", "release", "extend"])
def test_wire_form_is_the_code_without_its_comments(name: str) -> None:
    s = script(name)
    code = [line for line in expand(s.source).splitlines() if not line.lstrip().startswith(b"--")]
    assert s.wire.splitlines() == [line.strip() for line in code if line.strip()]
    assert b"--" not in s.wire
    # Redis hashes the whole body of every EVAL: no comment, blank line or indentation.
    assert all(line and line == line.strip() for line in s.wire.splitlines())
    assert len(s.wire) < len(expand(s.source)) * 0.6


@pytest.mark.parametrize(
    "source",
    [
        b"local s = [[two\n    lines]]\nreturn s",
        b"local s = [==[two\n  lines]==]",
        b"--[[ a block\n  comment ]]\nreturn 1",
        b'local s = "two\\\n  lines"',
    ],
)
def test_wire_form_refuses_tokens_that_span_lines(source: bytes) -> None:
    # Stripping the indentation inside a long string would change the string, and the
    # lines of a block comment would be sent as code.
    with pytest.raises(ValueError, match="spans lines"):
        wire_form(source)


def test_wire_form_keeps_the_code_of_each_line() -> None:
    source = b"-- about\nlocal x = 1\n\n    if x then\n        return x -- one\n    end\n"
    assert wire_form(source) == b"local x = 1\nif x then\nreturn x -- one\nend"


@SETTINGS
@given(arguments)
def test_the_text_path_encodes_as_the_general_one(args: list[bytes | str | int]) -> None:
    # _bulk formats ASCII text and integers as one str; anything else byte by byte.
    general = b"".join(b"$%d\r\n%s\r\n" % (len(_as_bytes(a)), _as_bytes(a)) for a in args)
    assert commands._bulk(tuple(args)) == general
    text_only = tuple(a for a in args if not isinstance(a, bytes))
    assert commands._bulk(text_only) == b"".join(
        b"$%d\r\n%s\r\n" % (len(_as_bytes(a)), _as_bytes(a)) for a in text_only
    )


_texts = st.text(max_size=12)
_numbers = st.integers(0, 2**53)


@SETTINGS
@given(
    token=_texts,
    numbers=st.tuples(_numbers, _numbers, _numbers, _numbers),
    waiting=st.none() | st.tuples(st.sampled_from("nfq"), _texts, _texts, _numbers, st.booleans()),
    name=st.text(min_size=1, max_size=8),
    cleanup=st.booleans(),
)
def test_the_hot_commands_carry_exactly_their_arguments(
    token: str,
    numbers: tuple[int, int, int, int],
    waiting: tuple[str, str, str, int, bool] | None,
    name: str,
    cleanup: bool,
) -> None:
    # The acquire and the release are packed from a frame encoded once per lock and
    # settings, filled per call (``_frame``, ``_fill``): whatever the text (ASCII or not,
    # in the token, the waiter id, the channel or the lock's name), a node must read
    # the very arguments acquire.lua and release.lua document, in their order.
    spec = replace(SPEC, name=name, keys=LockKeys(f"tenure:{{{name}}}:lock", queue=f"q{name}"))
    proposal, mark, mark_ms, ticket = numbers
    wait = None
    if waiting is not None:
        mode, waiter, channel, place_ms, sharded = waiting
        wait = commands.WaitArgs(mode, waiter, channel, place_ms, ticket, sharded)
    cmd = commands.acquire(spec, token, proposal, mark, mark_ms, wait)
    items, rest = parse_command(cmd.packed)
    assert rest == b""
    keys = [spec.keys.lock, spec.keys.floor, spec.keys.warm]
    args: list[str | int] = [token, spec.ttl_ms, proposal, mark, mark_ms, spec.retention_ms]
    if wait is not None:
        keys.append(spec.keys.queue)
        args += [wait.mode, wait.waiter, wait.channel, wait.place_ms, wait.ticket]
        args += [SHARDED] if wait.sharded else []
    sha = hashlib.sha1(script("acquire").wire).hexdigest().encode()
    expected = [str(len(keys)).encode(), *map(_as_bytes, keys), *map(_as_bytes, args)]
    assert items == [b"EVALSHA", sha, *expected]
    assert cmd.fallback is not None
    assert parse_command(cmd.fallback) == ([b"EVAL", script("acquire").wire, *expected], b"")

    release = commands.release_waking(spec, token, "q", proposal, mark, cleanup=cleanup)
    items, rest = parse_command(release.packed)
    keys = [spec.keys.lock, spec.keys.floor, spec.keys.queue]
    args = [token, "q", proposal, spec.retention_ms, mark, *(["c"] if cleanup else [])]
    assert (items, rest) == (
        [b"EVAL", script("release").wire, b"3", *map(_as_bytes, keys), *map(_as_bytes, args)],
        b"",
    )


@SETTINGS
@given(
    acquires=st.lists(
        st.tuples(
            st.text(min_size=1, max_size=8),
            _texts,
            _numbers,
            st.none() | st.tuples(st.sampled_from("nfq"), _texts, _numbers, st.booleans()),
        ),
        min_size=2,
        max_size=6,
    )
)
def test_a_batch_carries_each_acquire_exactly(
    acquires: list[tuple[str, str, int, tuple[str, str, int, bool] | None]],
) -> None:
    # acquire_batch.lua and release_batch.lua read, for each call in turn, its number of
    # keys and of arguments and then the arguments; the keys of all come first, in order.
    cmds, releases = [], []
    for name, token, proposal, waiting in acquires:
        spec = replace(SPEC, name=name, keys=LockKeys(f"tenure:{{{name}}}:lock", queue=f"q{name}"))
        wait = None
        if waiting is not None:
            mode, waiter, place_ms, sharded = waiting
            wait = commands.WaitArgs(mode, waiter, "ch", place_ms, proposal, sharded)
        cmds.append(commands.acquire(spec, token, proposal, 1, 2, wait))
        releases.append(commands.release_waking(spec, token, "q", proposal, proposal))
    for group, name in ((cmds, "acquire_batch"), (releases, "release_batch")):
        batch = commands.batch(tuple(group))
        keys: list[bytes] = []
        args: list[bytes] = []
        for cmd in group:
            one = parse_command(cmd.packed)[0][2:]  # numkeys, keys, arguments
            nkeys = int(one[0])
            keys += one[1 : 1 + nkeys]
            own = one[1 + nkeys :]
            args += [str(nkeys).encode(), str(len(own)).encode(), *own]
        body = script(name).wire
        evaled = ([b"EVAL", body, str(len(keys)).encode(), *keys, *args], b"")
        if name == "release_batch":  # by EVAL, as a release alone
            assert parse_command(batch.packed) == evaled
            assert batch.fallback is None
            continue
        sha = hashlib.sha1(body).hexdigest().encode()
        assert parse_command(batch.packed) == ([b"EVALSHA", sha, *evaled[0][2:]], b"")
        assert batch.fallback is not None
        assert parse_command(batch.fallback) == evaled
    assert commands.split_batch([[1, 2, 3]] * len(cmds), len(cmds)) is not None
    assert commands.split_batch([[1, 2, 3]], len(cmds)) is None  # not one reply per call


def test_a_batch_is_packed_once_for_every_node_and_anew_for_other_commands() -> None:
    # Each node's connection packs its own batch, most often of the very same commands.
    cmds = tuple(commands.acquire(SPEC, f"t{i}", 7 + i, 1, 1) for i in range(3))
    first = commands.batch(cmds)
    assert commands.batch(tuple(cmds)) is first
    # Other commands, even ones that say the same, are packed anew; never a stale batch.
    again = tuple(commands.acquire(SPEC, f"t{i}", 7 + i, 1, 1) for i in range(3))
    assert commands.batch(again) is not first
    assert commands.batch(again).packed == first.packed
    other = (*cmds[:2], commands.acquire(SPEC, "t9", 9, 1, 1))
    assert commands.batch(other).packed != first.packed


def test_only_a_plain_acquire_or_a_leases_release_joins_a_batch() -> None:
    acquire = commands.acquire(SPEC, "tok", 7, 1, 1)
    assert acquire.item is not None
    assert acquire.item[0] == "acquire_batch"
    release = commands.release_waking(SPEC, "tok", "q", 7)
    assert release.item is not None
    assert release.item[0] == "release_batch"
    assert commands.acked_by_replicas(acquire, 1, 100).item is None  # its WAIT follows it
    for cmd in (
        commands.release("k", "tok"),
        commands.dequeue(release),  # any answer will do: not a release's
        commands.extend(SPEC, "tok"),
        commands.seed(SPEC, 7, 100, frozenset({1})),
        commands.exists("k"),
    ):
        assert cmd.item is None


def test_the_script_source_is_encoded_once_not_per_call() -> None:
    # Only the per-call arguments are encoded per call: the head (with the source) and
    # the keys come from caches, and two calls send the very same head object's bytes.
    wait = commands.WaitArgs("q", "w1", "ch:1", 3000, 42)
    first = commands.acquire(SPEC, "t1", 7, 1, 1, wait).fallback
    hits = commands._eval_head.cache_info().hits
    second = commands.acquire(SPEC, "t2", 8, 1, 1, wait).fallback
    assert first is not None
    assert second is not None
    assert commands._eval_head.cache_info().hits == hits + 1
    body = script("acquire").wire
    assert first.index(body) == second.index(body)


def test_the_keys_of_long_names_are_encoded_per_call_not_kept() -> None:
    # A cache of 4,096 entries keyed by names of up to 64 KiB held gigabytes.
    short = ("tenure:{r}:lock", "tenure:node:floor")
    assert commands._keys(short) is commands._keys(short)
    long = ("tenure:{" + "x" * CACHED_CHARS + "}:lock", "tenure:node:floor")
    first, again = commands._keys(long), commands._keys(long)
    assert first == again
    assert first is not again
    assert first[1] == pack(*long)[len(b"*2\r\n") :]
    assert routed_slot(long[0]) == key_slot(long[0])
    # The hot path's own pick: a long name's acquire and release leave nothing behind.
    spec = replace(SPEC, name="x" * (CACHED_CHARS + 1))
    assert not spec.cached
    assert SPEC.cached
    kept = commands._cached_keys.cache_info().currsize
    wait = commands.WaitArgs("q", "w1", "ch:1", 3000, 42)
    commands.acquire(spec, "t1", 7, 1, 1, wait)
    commands.release_waking(spec, "t1", "q", 0)
    assert commands._cached_keys.cache_info().currsize == kept


_NOSCRIPT = "NOSCRIPT No matching script. Please use EVAL."
_NOPERM_EVALSHA = "NOPERM User app has no permissions to run the 'evalsha' command"


def test_a_node_without_the_script_is_sent_eval_within_the_round() -> None:
    cmd = commands.acquire(SPEC, "tok", 7, 1, 1)
    cache = commands.ScriptCache()
    assert cache.packed(cmd) == cmd.packed  # EVALSHA
    retry = cache.answered(_NOSCRIPT, cmd)
    assert retry is not None
    assert retry.packed == cmd.fallback
    assert retry.parse is cmd.parse
    assert retry.fallback is None  # once: an EVAL never answers NOSCRIPT
    assert cache.packed(cmd) == cmd.packed  # that EVAL cached the script again


def test_a_late_noscript_makes_the_next_acquire_go_by_eval() -> None:
    # The node answered after its round ended (outside the first majority): nothing is
    # resent, but it must not refuse every acquire from then on.
    cmd = commands.acquire(SPEC, "tok", 7, 1, 1)
    cache = commands.ScriptCache()
    assert cache.answered(_NOSCRIPT, None) is None
    assert cache.packed(cmd) == cmd.fallback
    assert cache.packed(cmd) == cmd.packed


def test_after_a_noscript_each_script_in_use_goes_once_by_eval() -> None:
    # The whole cache went: the release goes by EVAL too, though only the acquire was
    # refused, and so does the batch script should it come soon.
    acquire = commands.acquire(SPEC, "tok", 7, 1, 1)
    release = commands.release_waking(SPEC, "tok", "q", 7, 5, by_sha=True)
    batch = commands.batch(tuple(commands.acquire(SPEC, f"t{i}", 7 + i, 1, 1) for i in range(2)))
    cache = commands.ScriptCache()
    assert cache.answered(_NOSCRIPT, acquire) is not None  # resent by EVAL in the round
    assert cache.packed(release) == release.fallback
    assert cache.packed(release) == release.packed
    assert cache.packed(acquire) == acquire.packed
    assert cache.packed(batch) == batch.fallback


def test_marks_of_scripts_not_sent_soon_after_a_noscript_are_dropped() -> None:
    # A client that never sends some scripts (the batches, an extension on one node)
    # must not keep its drivers off their fast path (``as_packed``) for good.
    acquire = commands.acquire(SPEC, "tok", 7, 1, 1)
    release = commands.release_waking(SPEC, "tok", "q", 7, 5, by_sha=True)
    cache = commands.ScriptCache()
    cache.answered(_NOSCRIPT, None)
    assert cache.packed(acquire) == acquire.fallback
    assert cache.packed(release) == release.fallback
    for n in range(commands.ScriptCache.MARK_LIFE):
        assert not cache.as_packed, n
        cmd = acquire if n % 2 else release
        assert cache.packed(cmd) == cmd.packed  # by EVALSHA: sent by EVAL above
    assert cache.as_packed
    assert not cache.missing
    # Come after all, an unmarked script goes by EVALSHA; its NOSCRIPT is answered as any,
    # and marks every script again.
    batch = commands.batch(tuple(commands.acquire(SPEC, f"t{i}", 7 + i, 1, 1) for i in range(2)))
    assert cache.packed(batch) == batch.packed
    retry = cache.answered(_NOSCRIPT, batch)
    assert retry is not None
    assert retry.packed == batch.fallback
    # Marked again: the drivers leave their fast path (``as_packed``) for ``packed``.
    assert cache.missing == set(commands.BY_SHA) - {"acquire_batch"}
    assert cache.packed(acquire) == acquire.fallback


def test_a_node_refusing_evalsha_is_sent_eval_from_then_on() -> None:
    cmd = commands.acquire(SPEC, "tok", 7, 1, 1)
    cache = commands.ScriptCache()
    retry = cache.answered(_NOPERM_EVALSHA, cmd)
    assert retry is not None
    assert retry.packed == cmd.fallback
    assert [cache.packed(cmd) for _ in range(3)] == [cmd.fallback] * 3
    late = commands.ScriptCache()
    assert late.answered(_NOPERM_EVALSHA, None) is None
    assert late.packed(cmd) == cmd.fallback


@pytest.mark.parametrize(
    "error",
    [
        "NOPERM User app has no permissions to run the 'eval' command",
        "ERR Error running script (call to f_...): @user_script:12: OOM",
        "READONLY You can't write against a read only replica.",
        "BUSY Redis is busy running a script.",
    ],
)
def test_other_errors_are_the_nodes_answer(error: str) -> None:
    cmd = commands.acquire(SPEC, "tok", 7, 1, 1)
    cache = commands.ScriptCache()
    assert cache.answered(error, cmd) is None
    assert cache.packed(cmd) == cmd.packed


@settings(max_examples=200, derandomize=True, database=None)
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["send", _NOSCRIPT, _NOPERM_EVALSHA, "ERR other"]),
            st.sampled_from(["acquire", "release"]),
            st.booleans(),  # an error read within the round (with its command) or late
        ),
        max_size=12,
    )
)
def test_as_packed_says_when_every_command_goes_as_packed(
    steps: list[tuple[str, str, bool]],
) -> None:
    # The drivers skip ``packed`` while ``as_packed`` holds: it must never hold while
    # some command would go in its other form.
    by_sha = {
        "acquire": commands.acquire(SPEC, "tok", 7, 1, 1),
        "release": commands.release_waking(SPEC, "tok", "q", 7, 5, by_sha=True),
    }
    cache = commands.ScriptCache()
    for what, name, in_round in steps:
        cmd = by_sha[name]
        if what == "send":
            cache.packed(cmd)
        else:
            cache.answered(what, cmd if in_round else None)
        if cache.as_packed:
            assert all(cache.packed(c) == c.packed for c in by_sha.values())
        else:
            assert cache.missing or cache.eval_only


def test_only_the_acquire_goes_by_evalsha() -> None:
    # A release or an extension is awaited from a majority only: a NOSCRIPT on a node
    # nobody waits for would never be followed by its EVAL.
    cache = commands.ScriptCache()
    for cmd in (
        commands.release("k", "tok"),
        commands.release_waking(SPEC, "tok", "q", 7),
        commands.extend(SPEC, "tok"),
        commands.seed(SPEC, 7, 100, frozenset({1})),
    ):
        assert parse_command(cmd.packed)[0][0] == b"EVAL"
        assert cmd.fallback is None
        assert cache.answered(_NOSCRIPT, cmd) is None


def test_a_replicated_acquire_goes_by_eval() -> None:
    # Its WAIT's reply follows the script's: a NOSCRIPT would need the pair resent.
    cmd = commands.acked_by_replicas(commands.acquire(SPEC, "tok", 7, 1, 1), 1, 100)
    assert parse_command(cmd.packed)[0][0] == b"EVAL"
    assert cmd.fallback is None

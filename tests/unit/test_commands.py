"""RESP packing, reply classification, and the shipped Lua scripts."""

from __future__ import annotations

import re
from importlib.resources import files

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure._core import commands
from tenure._core.acquire import GRANTED, HELD, NO_HISTORY, TOO_LOW, WARMING
from tenure._core.commands import Command, pack
from tenure._core.config import LockKeys
from tenure._lua import Script, expand, script

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


KEYS = LockKeys.of("r")


def test_acquire_command_evals_acquire_lua_with_three_keys() -> None:
    cmd = commands.acquire(KEYS, "tok", 1500, 1_700_000_000_000_123, 77, 60_000)
    items, rest = parse_command(cmd.packed)
    assert rest == b""
    assert items == [
        b"EVAL",
        script("acquire").wire,
        b"3",
        b"tenure:{r}:lock",
        b"tenure:{r}:fence",
        b"tenure:{r}:warm",
        b"tok",
        b"1500",
        b"1700000000000123",
        b"77",
        b"60000",
    ]


def test_seed_command_evals_seed_lua_with_two_keys() -> None:
    items, rest = parse_command(commands.seed(KEYS, 42, 60_000, frozenset({9, 3})).packed)
    assert rest == b""
    assert items == [
        b"EVAL",
        script("seed").wire,
        b"2",
        b"tenure:{r}:fence",
        b"tenure:{r}:warm",
        b"42",
        b"60000",
        b"3",
        b"9",
    ]


@SETTINGS
@given(
    name=st.text(min_size=1, max_size=20),
    token=st.text(alphabet="0123456789abcdef", min_size=1, max_size=32),
    ttl_ms=st.integers(1, 86_400_000),
    proposal=st.integers(0, 2**53 - 1),
)
def test_acquire_command_round_trips(name: str, token: str, ttl_ms: int, proposal: int) -> None:
    keys = LockKeys.of(name)
    items, rest = parse_command(commands.acquire(keys, token, ttl_ms, proposal, 5, 9).packed)
    assert rest == b""
    assert items[2:] == [
        b"3",
        keys.lock.encode(),
        keys.fence.encode(),
        keys.warm.encode(),
        token.encode(),
        str(ttl_ms).encode(),
        str(proposal).encode(),
        b"5",
        b"9",
    ]


@pytest.mark.parametrize(
    ("make", "name", "extra"),
    [
        (lambda: commands.release("K", "T"), "release", [b"T"]),
        (lambda: commands.extend("K", "T", 2500), "extend", [b"T", b"2500"]),
    ],
)
def test_script_commands_send_the_source_with_eval(
    make: object, name: str, extra: list[bytes]
) -> None:
    assert callable(make)
    cmd = make()
    assert isinstance(cmd, Command)
    items, rest = parse_command(cmd.packed)
    assert rest == b""
    assert items == [b"EVAL", script(name).wire, b"1", b"K", *extra]


def test_exists_command() -> None:
    cmd = commands.exists("K")
    assert parse_command(cmd.packed)[0] == [b"EXISTS", b"K"]


# --- reading replies ----------------------------------------------------------------------

YES_NO_COMMANDS = [
    commands.release("k", "t"),
    commands.extend("k", "t", 10),
    commands.seed(KEYS, 0, 0, frozenset({1})),
    commands.exists("k"),
]


@pytest.mark.parametrize(
    ("reply", "yes"),
    [
        (1, True),
        (0, False),
        (None, False),
        (b"", False),
        (b"OK", False),  # nothing answered by these commands is a status reply
        ("OK", False),
        (b"1", False),
        (2, False),
        (-1, False),
        ([1, 1], False),
    ],
)
def test_yes_no_replies(reply: object, yes: bool) -> None:
    for cmd in YES_NO_COMMANDS:
        assert cmd.is_yes(reply) is yes
        assert cmd.parse(reply) == (yes, None)


@pytest.mark.parametrize(
    ("reply", "parsed"),
    [
        ([1, 1_700_000_000_000_000], (True, (GRANTED, 1_700_000_000_000_000))),
        ([0, 17], (False, (HELD, 17))),
        ([-1, 99], (False, (TOO_LOW, 99))),
        ([-2, 0], (False, (NO_HISTORY, 0))),
        ([-3, 59_000], (False, (WARMING, 59_000))),
        ([b"1", b"5"], (True, (GRANTED, 5))),  # RESP2 readers may leave integers as bytes
        # Anything that is not {status, number} says nothing: a "no" without info.
        (1, (False, None)),
        (b"OK", (False, None)),
        (None, (False, None)),
        ([1], (False, None)),
        ([1, 2, 3], (False, None)),
        ((1, 5), (False, None)),
    ],
)
def test_acquire_replies(reply: object, parsed: tuple[bool, tuple[int, int] | None]) -> None:
    cmd = commands.acquire(KEYS, "t", 10, 5, 1, 10)
    assert cmd.parse(reply) == parsed
    assert cmd.is_yes(reply) is parsed[0]


@SETTINGS
@given(status=st.integers(-3, 1), number=st.integers(0, 2**53 - 1))
def test_acquire_reply_status_one_is_the_only_yes(status: int, number: int) -> None:
    ok, info = commands.acquire(KEYS, "t", 10, 5, 1, 10).parse([status, number])
    assert ok is (status == GRANTED)
    assert info == (status, number)


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
    assert b"redis.call" in s.source
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
    assert s.wire.splitlines() == b"\n".join(code).strip().splitlines()
    assert b"--" not in s.wire
    assert len(s.wire) < len(expand(s.source)) * 0.7

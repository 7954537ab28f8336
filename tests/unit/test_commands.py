"""RESP packing, reply classification, and the shipped Lua scripts."""

from __future__ import annotations

import re
from importlib.resources import files

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure._core import commands
from tenure._core.commands import Command, pack
from tenure._lua import Script, script

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


def test_acquire_command() -> None:
    cmd = commands.acquire("tenure:{r}:lock", "tok", 1500)
    assert cmd.packed == pack("SET", "tenure:{r}:lock", "tok", "NX", "PX", 1500)
    assert parse_command(cmd.packed)[0] == [
        b"SET",
        b"tenure:{r}:lock",
        b"tok",
        b"NX",
        b"PX",
        b"1500",
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
    assert items == [b"EVAL", script(name).source, b"1", b"K", *extra]


def test_exists_command() -> None:
    cmd = commands.exists("K")
    assert parse_command(cmd.packed)[0] == [b"EXISTS", b"K"]


@pytest.mark.parametrize(
    ("reply", "yes"),
    [
        (b"OK", True),
        ("OK", True),
        (1, True),
        (0, False),
        (None, False),
        (b"", False),
        (b"ok", False),
        (b"QUEUED", False),
        (2, False),
        (-1, False),
    ],
)
def test_is_yes(reply: object, yes: bool) -> None:
    for cmd in (commands.acquire("k", "t", 10), commands.release("k", "t"), commands.exists("k")):
        assert cmd.is_yes(reply) is yes


# --- Lua scripts --------------------------------------------------------------------------

SCRIPT_NAMES = sorted(
    p.name.removesuffix(".lua") for p in files("tenure._lua").iterdir() if p.name.endswith(".lua")
)


def test_expected_scripts_ship() -> None:
    assert {"release", "extend"} <= set(SCRIPT_NAMES)


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

"""Hash slots, the per-slot tags T[s], the slot map and the redirections (``_core/slots.py``).

The tag table is checked against a fresh generation from its definition; a real
cluster's ``CLUSTER KEYSLOT`` checks a sample of it in
tests/integration/test_cluster_lock.py. Run this file as a script to write the table
(``python tests/unit/test_slots.py``).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tenure._core import commands, slots
from tenure._core._slot_tags import TAGS
from tenure._core.commands import Hop, next_hop
from tenure._core.config import ClientConfig, LockSpec
from tenure._core.slots import (
    MAX_REDIRECTS,
    SLOTS,
    Redirect,
    SlotMap,
    crc16,
    key_slot,
    redirect,
    slot_tag,
)

ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"


def generate() -> list[str]:
    """T[s] from its definition: every string of ``ALPHABET`` in order of length, then
    of alphabet, its CRC16 extended one character at a time (so 1.7 million strings take
    well under a second); the first to reach a slot is its tag."""
    table = slots._CRC
    found: list[str | None] = [None] * SLOTS
    left = SLOTS
    level = [("", 0)]
    while left:
        longer = []
        for text, crc in level:
            for ch in ALPHABET:
                c = ((crc << 8) & 0xFFFF) ^ table[(crc >> 8) ^ ord(ch)]
                word = text + ch
                slot = c % SLOTS
                if found[slot] is None:
                    found[slot] = word
                    left -= 1
                longer.append((word, c))
        level = longer
    return [t for t in found if t is not None]


def test_the_stored_table_is_the_definition() -> None:
    assert list(TAGS) == generate()


def test_every_tag_hashes_to_its_slot_and_is_short() -> None:
    assert len(TAGS) == SLOTS
    assert slot_tag(0) == "1bz"
    for s in range(SLOTS):
        tag = slot_tag(s)
        assert 1 <= len(tag) <= 4
        assert set(tag) <= set(ALPHABET)
        assert crc16(tag.encode()) % SLOTS == s
        # As a key's hash tag, it puts the key in that slot.
        assert key_slot(f"tenure:{{{tag}}}:floor") == s


def test_crc16_is_xmodem() -> None:
    # The check value of CRC-16/XMODEM, and Redis Cluster's own example.
    assert crc16(b"123456789") == 0x31C3
    assert crc16(b"") == 0


@pytest.mark.parametrize(
    ("key", "hashed"),
    [
        ("foo", "foo"),
        ("{user1000}.following", "user1000"),
        ("foo{}{bar}", "foo{}{bar}"),  # empty tag: the whole key
        ("foo{{bar}}zap", "{bar"),
        ("foo{bar}{zap}", "bar"),
        ("{", "{"),
        ("tenure:{}x}:lock", "tenure:{}x}:lock"),
    ],
)
def test_key_slot_follows_the_hash_tag_rules(key: str, hashed: str) -> None:
    assert key_slot(key) == crc16(hashed.encode()) % SLOTS
    assert key_slot(key.encode()) == key_slot(key)


def _slots_reply() -> list[object]:
    return [
        [0, 5460, [b"127.0.0.1", 7000, b"id0"], [b"127.0.0.1", 7003, b"id3"]],
        [5461, 10922, [b"", 7001, b"id1"]],
        [10923, 16383, [b"?", 7002, b"id2", []], [b"10.0.0.9", 7005, b"id5"]],
    ]


def test_a_slot_map_is_parsed_from_cluster_slots() -> None:
    m = SlotMap.parse(_slots_reply(), ("h", 9))
    assert m.owner(0) == ("127.0.0.1", 7000)
    assert m.owner(5460) == ("127.0.0.1", 7000)
    assert m.owner(5461) == ("h", 7001)  # an empty host: the address asked
    assert m.owner(16383) == ("h", 7002)
    assert m.masters() == [("127.0.0.1", 7000), ("h", 7001), ("h", 7002)]
    assert ("127.0.0.1", 7003) in m.nodes
    assert ("10.0.0.9", 7005) in m.nodes
    assert m.source == ("h", 9)  # the member that gave it
    moved = m.moved(7, ("127.0.0.1", 7003))
    assert moved.owner(7) == ("127.0.0.1", 7003)
    assert moved.source == ("h", 9)
    assert m.owner(7) == ("127.0.0.1", 7000)


def test_a_map_is_asked_first_of_the_members_named_then_of_the_map_then_of_the_seeds() -> None:
    m = SlotMap.parse(_slots_reply(), ("h", 9))
    seeds = [("h", 9), ("127.0.0.1", 7000)]
    sources = slots.map_sources(seeds, m)
    assert sources[0] == m.members[0]
    assert sources[-1] == ("h", 9)
    assert len(sources) == len(set(sources))  # each asked once
    first = ("h", 7002)
    assert slots.map_sources(seeds, m, (first,)) == [first, *(a for a in sources if a != first)]
    assert slots.map_sources(seeds, None) == seeds


def test_unserved_slots_have_no_owner() -> None:
    m = SlotMap.parse([[0, 99, [b"a", 1]]], ("h", 9))
    assert m.owner(99) == ("a", 1)
    assert m.owner(100) is None
    assert m.masters() == [("a", 1)]


@pytest.mark.parametrize(
    "reply",
    [b"ERR", [[0]], [[5, 2, [b"a", 1]]], [[0, 16384, [b"a", 1]]], [[0, 1, [b"a"]]]],
)
def test_a_reply_that_is_no_slot_map_is_refused(reply: object) -> None:
    with pytest.raises(ValueError):  # noqa: PT011  # the driver turns it into a diagnosis
        SlotMap.parse(reply, ("h", 9))


def test_redirections_are_read() -> None:
    assert redirect("MOVED 3999 127.0.0.1:6381") == Redirect("moved", 3999, ("127.0.0.1", 6381))
    assert redirect("ASK 1 ::1:7000") == Redirect("ask", 1, ("::1", 7000))
    assert redirect("MOVED 12 :7001", ("10.0.0.1", 7000)) == Redirect(
        "moved", 12, ("10.0.0.1", 7001)
    )
    assert redirect("TRYAGAIN Multiple keys request during rehashing of slot") == Redirect(
        "tryagain"
    )
    assert redirect("CLUSTERDOWN The cluster is down") == Redirect("down")
    for other in ("NOSCRIPT No matching script", "CROSSSLOT Keys", "MOVED x y", "ERR"):
        assert redirect(other) is None
    assert Redirect("moved", 1, ("h", 1)).follows
    assert not Redirect("tryagain").follows


def test_what_follows_a_redirection_is_the_same_for_rounds_and_commands_sent_behind() -> None:
    # ``next_hop``: one rule for a round's request and for a release written behind an
    # interrupted round (the blocking client's ``_follow``), and for both drivers.
    spec = LockSpec.build(ClientConfig.build(["redis+cluster://h:7000"]), "n", 1.0)
    here, there = ("10.0.0.1", 7000), ("10.0.0.2", 7001)
    for by_sha in (True, False):
        release = commands.release_waking(spec, "tok", "n", 0, by_sha=by_sha)
        moved = next_hop(release, Redirect("moved", 9, there), here, True, 0)
        assert moved == Hop(release, there, False, 9)  # MOVED: no ASKING, the map learns
        asked = next_hop(release, Redirect("ask", 9, there), here, False, 1)
        assert asked == Hop(release, there, True)
        # TRYAGAIN: the lock key alone, where it was sent, as it was sent there.
        again = next_hop(release, Redirect("tryagain"), there, True, 1)
        assert again is not None
        assert (again.to, again.asking) == (there, True)
        assert again.command.key == spec.keys.lock
        assert not again.command.by_sha
        assert next_hop(release, Redirect("ask", 9, there), here, False, MAX_REDIRECTS) is None
        assert next_hop(release, Redirect("down"), here, False, 0) is None
    # A dequeue (a waiter's id as the token) goes alone too; an acquire never does.
    dequeue = commands.dequeue(commands.release_waking(spec, "waiter", "n", 0))
    assert next_hop(dequeue, Redirect("tryagain"), here, False, 0) is not None
    cleanup = commands.release_waking(spec, "tok", "n", 0, cleanup=True)
    assert next_hop(cleanup, Redirect("tryagain"), here, False, 0) is None
    acquire = commands.exists(spec.keys.lock)
    assert next_hop(acquire, Redirect("tryagain"), here, False, 0) is None


def test_what_a_silent_node_says_names_the_slot_and_the_cause() -> None:
    moved = Redirect("moved", 5, ("127.0.0.1", 7001))
    assert "slot 5 moved to 127.0.0.1:7001" in moved.detail()
    assert "TRYAGAIN" in Redirect("tryagain").detail()
    assert "CLUSTERDOWN" in Redirect("down").detail()


def test_random_keys_agree_with_a_reference_crc() -> None:
    # A bit-by-bit CRC16, independent of the table.
    def reference(data: bytes) -> int:
        crc = 0
        for byte in data:
            crc ^= byte << 8
            for _ in range(8):
                crc = ((crc << 1) ^ 0x1021) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
        return crc

    rng = random.Random(7)
    for _ in range(500):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(40)))
        assert crc16(data) == reference(data)


if __name__ == "__main__":
    tags = generate()
    lines: list[str] = []
    line = ""
    for tag in tags:
        if len(line) + len(tag) + 1 > 96:
            lines.append(line)
            line = tag
        else:
            line = f"{line} {tag}" if line else tag
    lines.append(line)
    body = "\n".join(lines)
    target = Path(__file__).parents[2] / "src" / "tenure" / "_core" / "_slot_tags.py"
    target.write_text(
        '"""T[s] for every hash slot s: generated by tests/unit/test_slots.py (``python\n'
        "tests/unit/test_slots.py``), which also checks it; do not edit by hand.\n\n"
        "``TAGS[s]`` is the first string of digits and lower-case letters, shortest first "
        "and then\nin alphabetical order, whose CRC16 modulo 16384 is ``s`` "
        '(``slots.slot_tag``).\n"""\n\n'
        f'TAGS: tuple[str, ...] = tuple(\n    """\n{body}\n""".split()  # noqa: SIM905\n)\n'
    )


def test_a_first_load_waits_for_every_seed_given_its_whole_connect_timeout() -> None:
    # Each seed in turn may take the whole connect_timeout (a later one still gives the
    # map when the first hangs), and one more tells a load that ended on time from one
    # still under way, which is given up then.
    assert slots.map_load_bound(1, 0.5) == 1.0
    assert slots.map_load_bound(3, 1.0) == 4.0

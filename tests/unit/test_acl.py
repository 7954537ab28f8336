"""What a lock node's ACL must allow (``tenure._driver.acl``): derived from the code, judged purely.

The derivation is checked against the code it stands for: every command the drivers pack
is in ``DIRECT``, every key of a lock matches ``tenure:*``, every notification channel
matches ``tenure:wake:*``, and docs/deployment.md shows the line the derivation makes. The
refusal texts in the tables are the replies of Redis 6.2.14 and Valkey 9.1.2 (which
answers as Redis 7.2), copied from real servers.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tenure._core.config import LockKeys
from tenure._core.waiting import channel_name
from tenure._driver import acl as _acl

SRC = Path(_acl.__file__).parent.parent
ROOT = SRC.parent.parent


def test_script_commands_are_read_from_the_lock_scripts() -> None:
    assert set(_acl.lock_scripts()) >= {"acquire", "extend", "release", "seed"}
    assert not set(_acl.lock_scripts()) & _acl.NOT_ON_LOCK_NODES
    commands = set(_acl.script_commands())
    # What the scripts call today, handoff.lua.inc (pasted into release.lua) included.
    assert commands >= {"GET", "SET", "DEL", "PEXPIRE", "PTTL", "EXISTS", "PUBLISH", "ZADD"}
    assert "PUBLISH" in commands  # only in the included fragment


def test_a_new_command_in_a_script_is_picked_up() -> None:
    source = b"""
-- redis.call("FLUSHALL") in a comment is not a call
local floor = redis.call("GET", KEYS[1])
redis.call('pexpire', KEYS[2], ARGV[1])  -- trailing comment
return redis.pcall( "PTTL", KEYS[2])
"""
    assert _acl.commands_in("x.lua", source) == {"GET", "PEXPIRE", "PTTL"}


def test_a_computed_command_name_is_refused() -> None:
    message = re.escape("x.lua calls redis.call with a computed command")
    with pytest.raises(RuntimeError, match=message):
        _acl.commands_in("x.lua", b"local cmd = 'GET'\nreturn redis.call(cmd, KEYS[1])")


def test_every_script_command_has_harmless_probe_arguments() -> None:
    # A command without a line in _SCRIPT_ARGS is still checked, with the probe key alone;
    # give it real arguments so that DRYRUN and the probe ask the right question.
    missing = set(_acl.script_commands()) - set(_acl._SCRIPT_ARGS)
    assert not missing, f"add arguments for {sorted(missing)} to tenure._driver.acl._SCRIPT_ARGS"


def test_every_command_the_drivers_send_is_a_need() -> None:
    driver_files = [
        *sorted((SRC / "_sync").glob("*.py")),
        *sorted((SRC / "_async").glob("*.py")),
        SRC / "_core" / "commands.py",
    ]
    packed: set[str] = set()
    for path in driver_files:
        text = path.read_text()
        packed |= {m.upper() for m in re.findall(r"""pack\(\s*["']([A-Za-z]+)["']""", text)}
        if re.search(r"_eval(_head)?\(", text):
            packed.add("EVAL")
        assert not re.search(r"execute_command|send_command", text), path
    assert packed, "found no packed commands: has the driver layout changed?"
    # What only some kinds of node are sent (ASKING and CLUSTER SLOTS to a whole Redis
    # Cluster) is in the per-kind table.
    by_kind = {extra[0] for extras in _acl.NODE_KINDS.values() for extra in extras}
    needed = packed - _acl.UNGRANTED
    assert needed <= set(_acl.DIRECT) | by_kind, needed - set(_acl.DIRECT) - by_kind


def test_each_kind_of_node_adds_its_commands() -> None:
    plain = {n.name for n in _acl.needs()}
    assert {n.name for n in _acl.needs(kind="sentinel")} - plain == {"ROLE"}
    assert {n.name for n in _acl.needs(kind="cluster")} - plain == {
        "ASKING",
        "CLUSTER|SLOTS",
        "SSUBSCRIBE",
        "SUNSUBSCRIBE",
        "SPUBLISH",
    }
    assert {n.name for n in _acl.needs(kind="cluster", version=(6, 2))} - plain == {
        "ASKING",
        "CLUSTER|SLOTS",
    }
    [slots] = [n for n in _acl.needs(kind="cluster") if n.subcommand]
    assert slots.call == ("CLUSTER", "SLOTS")
    assert _acl.least_privilege_acl(kind="cluster", version=(6, 2)).endswith(
        " +asking +cluster|slots"
    )
    assert _acl.least_privilege_acl(kind="sentinel").endswith(" +role")
    assert _acl.sentinel_acl() == (
        "ACL SETUSER tenure reset on >PASSWORD resetchannels &+switch-master "
        "+sentinel|get-master-addr-by-name +sentinel|master +subscribe +ping"
    )


def test_a_command_sent_from_a_version_on_is_asked_of_those_servers_only() -> None:
    """A command for newer servers (SSUBSCRIBE on Cluster nodes of servers >= 7) is one
    line of ``NODE_KINDS``: older servers are not asked about it."""
    assert "SSUBSCRIBE" in {n.name for n in _acl.needs(kind="cluster", version=(7, 2))}
    assert "SSUBSCRIBE" not in {n.name for n in _acl.needs(kind="cluster", version=(6, 2))}
    assert "+ssubscribe" in _acl.least_privilege_acl(kind="cluster")
    assert "+ssubscribe" not in _acl.least_privilege_acl(kind="cluster", version=(6, 2, 14))
    [need] = [n for n in _acl.needs("app1:", "cluster", tag="1bz") if n.command == "SSUBSCRIBE"]
    assert need.args == ("app1:wake:{1bz}:probe",)  # the member's slot, the clients' prefix
    answer = _acl.permitted_by_rules(need, "+@all", ["@pubsub"], None, ["app1:other:*"])
    assert answer is not None
    assert _acl.denial(answer) == "channel"


def test_a_cluster_members_probe_keys_take_its_slots_tag() -> None:
    for need in _acl.needs(kind="cluster", tag="1bz"):
        assert "{check}" not in " ".join(need.args), need
    assert _acl.probe_keys(tag="1bz")[:2] == ("tenure:{1bz}:probe", "tenure:{1bz}:probe:q")


def test_every_lock_key_and_channel_matches_the_patterns() -> None:
    keys = LockKeys.of("orders:{7}")
    values = [v for v in dataclasses.asdict(keys).values() if isinstance(v, str) and v]
    assert len(values) >= 4
    # The scripts derive the places and the reservation from the queue's name.
    values += [f"{keys.queue}:next", f"{keys.queue}:0123abcd"]
    for key in values:
        assert _acl.glob_match(_acl.KEY_PATTERN, key), key
    assert _acl.glob_match(_acl.KEY_PATTERN, _acl.PROBE_KEY)
    assert _acl.glob_match(_acl.CHANNEL_PATTERN, channel_name("0123456789abcdef"))
    assert _acl.glob_match(_acl.CHANNEL_PATTERN, _acl.PROBE_CHANNEL)


@pytest.mark.parametrize("kind", sorted(_acl.NODE_KINDS))
def test_the_documented_acl_is_the_derived_one(kind: str) -> None:
    line = _acl.least_privilege_acl(kind=kind)
    assert line.startswith("ACL SETUSER tenure reset on >PASSWORD resetchannels ~tenure:* ")
    for need in _acl.needs(kind=kind):
        assert f" +{need.name.lower()}" in line
    page = (ROOT / "docs" / "deployment.md").read_text()
    assert f"\n{line}\n" in page, f"docs/deployment.md must show:\n{line}"
    old = _acl.least_privilege_acl(kind=kind, version=(6, 2, 14))
    assert f"\n{old}\n" in page, f"docs/deployment.md must show, for Redis 6.2:\n{old}"


def test_the_documented_sentinel_acl_is_the_derived_one() -> None:
    page = (ROOT / "docs" / "deployment.md").read_text()
    assert f"\n{_acl.sentinel_acl()}\n" in page


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        # Redis 6.2
        ("this user has no permissions to run the 'eval' command or its subcommand", "command"),
        ("NOPERM this user has no permissions to run the 'wait' command", "command"),
        ("this user has no permissions to access one of the keys used as arguments", "key"),
        ("this user has no permissions to access one of the channels used as arguments", "channel"),
        (
            "@user_script: 4: The user executing the script can't run this command or subcommand",
            "command",
        ),
        (
            "@user_script: 1: The user executing the script can't access at least one of the "
            "keys mentioned in the command arguments",
            "key",
        ),
        (
            "@user_script: 4: The user executing the script can't publish to the channel "
            "mentioned in the command",
            "channel",
        ),
        # Redis 7 / Valkey: NOPERM, DRYRUN answers, scripts
        ("User u1 has no permissions to run the 'zadd' command", "command"),
        ("User u1 has no permissions to access the 'other' key", "key"),
        ("User u has no permissions to access the 'tenure:wake:x' channel", "channel"),
        (
            "ERR ACL failure in script: User u has no permissions to run the 'publish' command",
            "command",
        ),
        ("ACL failure in script: No permissions to access a key", "key"),
        ("ERR ACL failure in script: No permissions to access a channel", "channel"),
        # not ACL refusals
        ("OOM command not allowed when used memory > 'maxmemory'", None),
        ("WRONGTYPE Operation against a key holding the wrong kind of value", None),
        ("wrong number of arguments for 'zadd' command", None),
    ],
)
def test_denial_names_what_was_refused(text: str, kind: str | None) -> None:
    assert _acl.denial(text) == kind


def test_fix_line_grants_exactly_what_was_refused() -> None:
    assert _acl.fix_line("app", {"ZADD": "command"}) == "ACL SETUSER app +zadd"
    assert (
        _acl.fix_line("app", {"PUBLISH": "command", "GET": "key", "SUBSCRIBE": "channel"})
        == "ACL SETUSER app +publish ~tenure:* &tenure:wake:*"
    )


def _need(command: str) -> _acl.Need:
    return next(n for n in _acl.needs() if n.command == command)


_WRITE = ["@write", "@sortedset", "@fast"]  # ZADD's categories (COMMAND INFO)


@pytest.mark.parametrize(
    ("rules", "keys", "allowed"),
    [
        ("+@all", None, True),
        ("allcommands", None, True),
        ("+@all -zadd", None, False),
        ("+@all -@write", None, False),
        ("+@all -@write +zadd", None, True),
        ("-@all +get +set", None, False),
        ("-@all +zadd", None, True),
        ("-@all +@sortedset", None, True),
        ("-@all +@sortedset -zadd", None, False),
        ("-@all +client|id", None, False),
        ("-@all +zadd", ["tenure:*"], True),
        ("-@all +zadd", ["app:*", "tenure:{*"], True),
        ("-@all +zadd", ["app:*"], False),
    ],
)
def test_redis62_rules_for_a_command(rules: str, keys: list[str] | None, allowed: bool) -> None:
    answer = _acl.permitted_by_rules(_need("ZADD"), rules, _WRITE, keys, None)
    assert (answer is None) is allowed, answer
    if answer is not None:
        assert _acl.denial(answer) == ("key" if "+zadd" in rules else "command")


@pytest.mark.parametrize(
    ("name", "rules", "allowed"),
    [
        ("CLUSTER|SLOTS", "-@all +cluster|slots", True),
        ("CLUSTER|SLOTS", "-@all +cluster", True),
        ("CLUSTER|SLOTS", "-@all +cluster|nodes", False),
        ("CLUSTER|SLOTS", "+@all -cluster|slots", False),
        ("CLUSTER|SLOTS", "-@all +cluster -cluster|slots", False),
        ("ASKING", "-@all +asking", True),
        # INFO replication in the scripts: a first-argument rule, as 6.2 takes it.
        ("INFO", "-@all +info|replication", True),
        ("INFO", "-@all +info|server", False),
    ],
)
def test_redis62_subcommand_rules(name: str, rules: str, allowed: bool) -> None:
    [need] = [n for n in _acl.needs(kind="cluster") if n.name == name]
    answer = _acl.permitted_by_rules(need, rules, ["@slow"], None, None)
    assert (answer is None) is allowed, answer
    if answer is not None:
        assert _acl.denial(answer) == "command"
        assert f"'{name.lower()}'" in answer


@pytest.mark.parametrize(
    ("command", "channels", "allowed"),
    [
        ("PUBLISH", None, True),
        ("PUBLISH", ["tenure:wake:*"], True),
        ("PUBLISH", ["tenure:*"], True),
        ("SUBSCRIBE", ["other"], False),
        ("PUBLISH", [], False),
    ],
)
def test_redis62_rules_for_a_channel(
    command: str, channels: list[str] | None, allowed: bool
) -> None:
    answer = _acl.permitted_by_rules(_need(command), "+@all", ["@pubsub"], None, channels)
    assert (answer is None) is allowed, answer
    if answer is not None:
        assert _acl.denial(answer) == "channel"


@pytest.mark.parametrize(
    ("pattern", "text", "match"),
    [
        ("tenure:*", "tenure:{a}:lock", True),
        ("tenure:*", "tenurex", False),
        ("*", "", True),
        ("t?n*", "tenure", True),
        ("tenure:[ab]*", "tenure:b1", True),
        ("tenure:[^ab]*", "tenure:b1", False),
        ("tenure:[a-c]", "tenure:b", True),
        ("a\\*b", "a*b", True),
        ("a\\*b", "axb", False),
        ("a.b", "axb", False),
    ],
)
def test_glob_match_is_redis_glob(pattern: str, text: str, match: bool) -> None:
    assert _acl.glob_match(pattern, text) is match

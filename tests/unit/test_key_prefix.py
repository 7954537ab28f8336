"""The key prefix: validated, the default keeps every key as it was, another prefix moves
every key and channel (and what ``tenure check`` asks about) under it, and two prefixes
never share a key."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tenure
from tenure import ConfigurationError
from tenure._core.acquire import round_errors
from tenure._core.config import (
    ClientConfig,
    LockKeys,
    LockSpec,
    check_key_prefix,
    key_prefix_of,
    lock_key,
)
from tenure._core.diagnosis import error_reply
from tenure._core.quorum import Failure, Round
from tenure._driver import acl as _acl
from tenure.cli.node_rules import Level, NodeFacts, check_access

NODES = ["redis://127.0.0.1:7001"]


def _keys(keys: LockKeys) -> list[str]:
    """Every key a lock's scripts may touch, the places and reservation included."""
    values = [v for v in dataclasses.asdict(keys).values() if v]
    return [*values, f"{keys.queue}:next", f"{keys.queue}:0123abcd"]


@pytest.mark.parametrize("name", ["orders:42", "}x", "a{b}c", "é"])
def test_the_default_prefix_keeps_every_key_as_it_was(name: str) -> None:
    default = ClientConfig.build(NODES)
    assert default.key_prefix == "tenure:"
    spec = LockSpec.build(default, name, 1.0)
    assert spec.keys == LockKeys.of(name)
    assert (spec.keys.floor, spec.keys.warm) == ("tenure:node:floor", "tenure:node:warm")
    if name.startswith("}"):
        assert spec.key.startswith("tenure:#{")
        assert spec.key.endswith(f"}}:{name}:lock")
    else:
        assert spec.key == f"tenure:{{{name}}}:lock"
        assert spec.keys.queue == f"tenure:{{{name}}}:q"
    assert default.channel_prefix == "tenure:wake:"


def test_another_prefix_moves_every_key_and_channel() -> None:
    config = ClientConfig.build(NODES, key_prefix="app1:")
    spec = LockSpec.build(config, "orders:42", 1.0)
    assert spec.key == "app1:{orders:42}:lock" == lock_key("orders:42", "app1:")
    assert spec.keys.queue == "app1:{orders:42}:q"
    assert (spec.keys.floor, spec.keys.warm) == ("app1:node:floor", "app1:node:warm")
    assert config.channel_prefix == "app1:wake:"
    assert LockSpec.build(config, "}x", 1.0).key.startswith("app1:#{")
    for key in _keys(spec.keys):
        assert _acl.glob_match(_acl.key_pattern("app1:"), key), key
        assert not _acl.glob_match(_acl.KEY_PATTERN, key), key


@pytest.mark.parametrize(
    ("prefix", "says"),
    [
        ("", "non-empty str"),
        (b"app:", "non-empty str"),
        (None, "non-empty str"),
        ("app{1}:", "hash tag"),
        ("app}:", "hash tag"),
        ("app#", "'#{' marks"),
        ("app*:", "glob characters"),
        ("a[1]:", "glob characters"),
        ("a\\b", "glob characters"),
        ("my app:", "whitespace"),
        ("app\n", "whitespace"),
        ("x" * 129, "at most 128"),
    ],
)
def test_a_bad_prefix_is_refused_saying_why(prefix: object, says: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        ClientConfig.build(NODES, key_prefix=prefix)  # type: ignore[arg-type]
    assert info.value.parameter == "key_prefix"
    assert says in str(info.value)


@pytest.mark.parametrize("cls", [tenure.Client, tenure.AsyncClient])
def test_the_clients_take_the_prefix(cls: type[tenure.Client]) -> None:
    client = cls(NODES, key_prefix="app1:")
    assert client.config.key_prefix == "app1:"
    with pytest.raises(ConfigurationError, match="key_prefix"):
        cls(NODES, key_prefix="a{b")


_PREFIX = st.text(st.sampled_from("ab:#{}*é-_"), min_size=1, max_size=5).filter(
    lambda p: not any(c in p for c in "{}#*")
)
_NAME = st.text(st.sampled_from("ab:}{#"), min_size=1, max_size=6)


@settings(max_examples=400, deadline=None)
@given(_PREFIX, _NAME, _PREFIX, _NAME)
def test_two_prefixes_never_share_a_key(p: str, a: str, q: str, b: str) -> None:
    if (p, a) == (q, b):
        return
    ka, kb = LockKeys.of(a, p), LockKeys.of(b, q)
    lock_a = {ka.lock, ka.queue, f"{ka.queue}:next", f"{ka.queue}:w"}
    lock_b = {kb.lock, kb.queue, f"{kb.queue}:next", f"{kb.queue}:w"}
    assert not lock_a & lock_b  # a lock's keys are its own
    assert not lock_a & {kb.floor, kb.warm}  # nor are they any prefix's node keys
    if p != q:
        assert {ka.floor, ka.warm}.isdisjoint({kb.floor, kb.warm})


def test_check_key_prefix_names_the_option_it_was_given_as() -> None:
    with pytest.raises(ConfigurationError) as info:
        check_key_prefix("a b", "--key-prefix")
    assert info.value.parameter == "--key-prefix"


def test_the_acl_follows_the_prefix() -> None:
    line = _acl.least_privilege_acl("app", "pw", prefix="app1:")
    assert " ~app1:* &app1:wake:* " in line
    assert "tenure:" not in line
    assert _acl.fix_line("app", {"GET": "key", "PUBLISH": "channel"}, "app1:") == (
        "ACL SETUSER app ~app1:* &app1:wake:*"
    )
    for need in _acl.needs("app1:"):
        assert not any(arg.startswith("tenure:") for arg in need.args), need
    # a user allowed the prefix's keys only may run what clients of that prefix send
    for need in _acl.needs("app1:"):
        assert _acl.permitted_by_rules(need, "+@all", [], ["app1:*"], ["app1:wake:*"]) is None
    refused = [
        n.command
        for n in _acl.needs()
        if _acl.permitted_by_rules(n, "+@all", [], ["app1:*"], ["app1:wake:*"])
    ]
    assert "EVAL" in refused  # the default prefix's keys are outside that pattern
    assert "SUBSCRIBE" in refused


def test_tenure_checks_verdict_names_the_prefixs_patterns() -> None:
    refused: dict[str, str | None] = {need.command: None for need in _acl.needs("app1:")}
    refused["GET"] = "no permissions to access a key"
    facts = NodeFacts(
        node="redis://h:1", user="app", access=refused, access_method="probe", key_prefix="app1:"
    )
    [finding] = check_access(facts)
    assert finding.level is Level.UNSAFE
    assert "GET on keys app1:*" in finding.detail
    assert finding.detail.endswith("Fix: ACL SETUSER app ~app1:*")
    facts = dataclasses.replace(facts, access={n.command: None for n in _acl.needs("app1:")})
    [finding] = check_access(facts)
    assert finding.level is Level.OK
    assert "keys app1:* and channels app1:wake:*" in finding.detail


@settings(max_examples=300, deadline=None)
@given(_PREFIX, st.text(min_size=1, max_size=8))
def test_a_locks_key_tells_its_prefix(prefix: str, name: str) -> None:
    # How the release of a lease (which carries its key, not its client's settings)
    # names the client's prefix in an ACL fix.
    keys = LockKeys.of(name, prefix)
    assert key_prefix_of(keys.lock) == prefix
    assert key_prefix_of(keys.queue) == prefix


def test_round_errors_name_the_clients_prefix() -> None:
    # The per-node texts of QuorumUnreachable and LeaseLost, as ServerUnsupported's.
    rnd = Round(3, 2, 0.0)
    refused = error_reply("NOPERM No permissions to access a key")
    rnd.fail(1, refused.failure, refused.detail)
    rnd.fail(2, Failure.ERROR, "WRONGTYPE")
    [default] = [e for e in round_errors(rnd, ["a", "b", "c"]).values() if "ACL" in e]
    assert "~tenure:*" in default
    assert "`tenure check`" in default
    errors = round_errors(rnd, ["a", "b", "c"], "app1:")
    assert errors["c"] == "error: WRONGTYPE"
    assert "~app1:*" in errors["b"]
    assert "&app1:wake:*" in errors["b"]
    assert "`tenure check --key-prefix app1:`" in errors["b"]
    assert "tenure:" not in errors["b"]

"""The fenced Redis store's keys: a resource's value and token share one Redis Cluster slot
whatever the resource and namespace, and ordinary resources keep the keys they always had
(so data written before stays readable)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenure.fencing.redis_store import fenced_keys

from .test_config import SETTINGS, key_slot

# Text rich in braces, ``:`` and ``#``, where tags and prefixes could go wrong.
BRACY = st.text(alphabet="{}:#qa", min_size=1, max_size=8)
TEXT = st.one_of(st.text(min_size=1), BRACY)
ODD = ["}", "}}", "}x", "}{x}", "{}", "{}x", "x}", "a}b", "{x}", "x{y}z", "#", "}:q", "{", "x{"]


def _hash_tag(key: str) -> str | None:
    start = key.find("{")
    end = key.find("}", start + 1) if start >= 0 else -1
    return key[start + 1 : end] if end > start + 1 else None


@pytest.mark.parametrize("namespace", ["tenure", "app", "x{", "{app}", "x{}", "{}"])
@pytest.mark.parametrize("resource", ODD)
def test_odd_resources_keep_their_keys_in_one_slot(resource: str, namespace: str) -> None:
    value, token = fenced_keys(resource, namespace)
    assert key_slot(value) == key_slot(token), (value, token)
    assert _hash_tag(value) is not None


@SETTINGS
@given(TEXT, st.one_of(st.just("tenure"), TEXT))
def test_a_resources_two_keys_always_share_one_slot(resource: str, namespace: str) -> None:
    value, token = fenced_keys(resource, namespace)
    assert key_slot(value) == key_slot(token), (value, token)
    assert value != token


@SETTINGS
@given(TEXT.filter(lambda r: not r.startswith("}")), st.text(alphabet="abc:-_.", min_size=1))
def test_ordinary_resources_keep_their_keys(resource: str, namespace: str) -> None:
    assert fenced_keys(resource, namespace) == (
        f"{namespace}:{{{resource}}}:value",
        f"{namespace}:{{{resource}}}:token",
    )


@SETTINGS
@given(TEXT, TEXT, st.sampled_from(["tenure", "app", "x{}"]))
def test_different_resources_share_no_key(a: str, b: str, namespace: str) -> None:
    assert bool(set(fenced_keys(a, namespace)) & set(fenced_keys(b, namespace))) == (a == b)


def test_a_resource_starting_with_a_brace_gets_a_tag_of_its_own() -> None:
    value, token = fenced_keys("}x")
    assert re.fullmatch(r"tenure:#\{[0-9a-f]{16}\}:\}x:value", value)
    assert token == value.removesuffix(":value") + ":token"
    assert key_slot(value) != key_slot(fenced_keys("}y")[0])  # spread, not one slot

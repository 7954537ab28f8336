"""The key prefix on real servers, both APIs: the default keeps today's keys and channels
exactly, two prefixes on the same nodes are two independent sets of locks, and an ACL
user confined to one prefix's keys and channels can lock under that prefix (which
``tenure check --key-prefix`` confirms, and ``tenure status --key-prefix`` reads)."""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import logging
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

import tenure
from tenure._driver import acl as _acl
from tenure.cli.node_check import check
from tenure.cli.status import status
from tenure.testing import LocalCluster

from .conftest import Api, Synced, logged_in_as

TTL = 5.0
_USERS = itertools.count()


def _keys(cluster: LocalCluster, pattern: str) -> set[bytes]:
    """The keys matching ``pattern`` on the first three nodes."""
    found: set[bytes] = set()
    for node in list(cluster)[:3]:
        with node.client() as c:
            found |= set(c.scan_iter(pattern))
    return found


def _named(cluster: LocalCluster, name: str) -> set[bytes]:
    """The keys holding ``name`` on the first three nodes (not a glob: names hold [])."""
    return {k for k in _keys(cluster, "*") if name.encode() in k}


def _channels(cluster: LocalCluster, pattern: str) -> set[bytes]:
    with cluster[0].client() as c:
        return set(c.pubsub_channels(pattern))


def _own_channel_subscribed(api: Api, cluster: LocalCluster, client: Any, prefix: str) -> None:
    """Until ``client``'s notification channel, ``<prefix>wake:`` and 16 hex digits, is
    subscribed at the first node. The listener subscribes on its own: on a busy machine
    the subscription may come up after the wait gave up. Its own channel, not a count of
    new ones: another client's listener coming back meanwhile (a test before this one
    killed the pub/sub connections) would be counted too."""
    # An AsyncClient's listener is the one of the event loop it last waited in (its
    # ``_listener`` property needs a running loop).
    sync = not isinstance(client, Synced)
    listener = client._listener if sync else client.target._listener_
    channel: str = listener.channel
    assert re.fullmatch(re.escape(prefix) + "wake:[0-9a-f]{16}", channel), channel
    # 30 s: once in a full parallel run on a loaded 2-core machine, the blocking client's
    # subscription at the first node was still not there after 10 s (not understood yet;
    # in isolation it is there at once). A listener that never subscribes still fails.
    api.wait_until(
        lambda: channel.encode() in _channels(cluster, channel),
        30.0,
        what=f"{channel} subscribed",
    )


def _wait_in_vain(client: object, key: str) -> None:
    """A blocking acquire that queues and subscribes, then times out."""
    with pytest.raises(tenure.LockTimeout):
        client.acquire(key, ttl=TTL, timeout=0.2)  # type: ignore[attr-defined]


def test_the_default_prefix_keeps_todays_keys_and_channels(
    api: Api, shared5: LocalCluster, key: str
) -> None:
    urls = shared5.urls[:3]
    holder = api.client(urls)
    explicit = api.client(urls, key_prefix="tenure:")  # the same as leaving it out
    lease = holder.acquire(key, ttl=TTL)
    assert lease.key == f"tenure:{{{key}}}:lock"
    assert _named(shared5, key) == {f"tenure:{{{key}}}:lock".encode()}
    assert _keys(shared5, "tenure:node:*") >= {b"tenure:node:floor"}
    _wait_in_vain(explicit, key)
    _own_channel_subscribed(api, shared5, explicit, "tenure:")  # its channel, as before
    lease.release()
    assert _named(shared5, key) == set()


def test_two_prefixes_do_not_see_each_others_locks(
    api: Api, shared5: LocalCluster, key: str
) -> None:
    urls = shared5.urls[:3]
    app1, app1_again = api.client(urls, key_prefix="app1:"), api.client(urls, key_prefix="app1:")
    default = api.client(urls)
    mine = app1.acquire(key, ttl=TTL)
    assert mine.key == f"app1:{{{key}}}:lock"
    # The same name under the default prefix is another lock, free.
    assert not default.lock(key, ttl=TTL).locked()
    theirs = default.acquire(key, ttl=TTL, blocking=False)
    assert theirs.key == f"tenure:{{{key}}}:lock"
    # Under the same prefix it is the same lock: held.
    assert app1_again.lock(key, ttl=TTL).locked()
    with pytest.raises(tenure.LockTimeout):
        app1_again.acquire(key, ttl=TTL, blocking=False)
    # Each prefix has its own floor, so its own fencing history.
    assert _keys(shared5, "app1:node:*") >= {b"app1:node:floor"}
    _wait_in_vain(app1_again, key)
    _own_channel_subscribed(api, shared5, app1_again, "app1:")
    mine.release()
    assert default.lock(key, ttl=TTL).locked()  # untouched by the other prefix's release
    app1_again.acquire(key, ttl=TTL, blocking=False).release()
    theirs.release()
    assert _named(shared5, key) == set()


@contextlib.contextmanager
def _confined_user(cluster: LocalCluster, prefix: str) -> Iterator[list[str]]:
    """An ACL user with exactly what docs/deployment.md grants clients of ``prefix``;
    yields URLs logging in as it."""
    name = f"tenure-prefix-{next(_USERS)}"
    _confine(cluster, name, prefix)
    with logged_in_as(cluster, name) as urls:
        yield urls


def _confine(cluster: LocalCluster, name: str, prefix: str) -> None:
    """Set ACL user ``name`` to what clients of ``prefix`` need, on every node (its
    connections already logged in are held to it from their next command)."""
    rules = _acl.least_privilege_acl(name, "pw", prefix=prefix).split()[3:]
    for node in cluster:
        with node.client() as c:
            c.execute_command("ACL", "SETUSER", name, *rules)


def _acl_finding(urls: list[str], *prefix: str) -> dict[str, str]:
    out, err = io.StringIO(), io.StringIO()
    if prefix:
        check(urls, as_json=True, out=out, err=err, key_prefix=prefix[0])
    else:
        check(urls, as_json=True, out=out, err=err)  # the default prefix
    findings: list[dict[str, str]] = json.loads(out.getvalue())
    [finding] = [f for f in findings if f["check"] == "acl"]
    return finding


def test_a_user_confined_to_a_prefix_locks_under_it(
    api: Api, shared5: LocalCluster, key: str
) -> None:
    with _confined_user(shared5, "app2:") as urls:
        client = api.client(urls[:3], key_prefix="app2:")
        lease = client.acquire(key, ttl=TTL)
        waiter = api.client(urls[:3], key_prefix="app2:")
        _wait_in_vain(waiter, key)
        _own_channel_subscribed(api, shared5, waiter, "app2:")  # SUBSCRIBE allowed
        lease.release()
        # The default prefix's keys are outside the user's pattern.
        with pytest.raises(tenure.NodeMisconfigured):
            api.client(urls[:3]).acquire(key, ttl=TTL, blocking=False)


def test_an_acl_refusal_names_the_clients_prefix(
    api: Api, shared5: LocalCluster, key: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A user confined to the default prefix, and clients of another: the fix they are
    # told names their own keys and channels, and how to check them.
    says = ("~app4:*", "&app4:wake:*", "`tenure check --key-prefix app4:`")
    with _confined_user(shared5, "tenure:") as urls:
        # One such node of three: logged once, and the other two lock.
        api.client(shared5.urls[1:3], key_prefix="app4:", allow_even=True).acquire(
            key, ttl=TTL
        ).release()  # the prefix's history on those two
        with caplog.at_level(logging.WARNING, logger="tenure"):
            client = api.client([urls[0], *shared5.urls[1:3]], key_prefix="app4:")
            # A round is decided at its first majority: node 0's refusal may come after
            # the other two granted, and is then heard in a later round.
            for _ in range(100):
                client.acquire(key, ttl=TTL).release()
                if any(r.name == "tenure" for r in caplog.records):
                    break
        [told] = [r.getMessage() for r in caplog.records if r.name == "tenure"]
        # All three: no majority, raised at once.
        with pytest.raises(tenure.ServerUnsupported) as info:
            api.client(urls[:3], key_prefix="app4:").acquire(key, ttl=TTL)
        for text in (told, str(info.value)):
            for words in says:
                assert words in text, text
            assert "~tenure:*" not in text, text


def test_tenure_check_and_status_follow_the_prefix(shared5: LocalCluster, key: str) -> None:
    with _confined_user(shared5, "app3:") as urls:
        ok = _acl_finding(urls[:1], "app3:")
        assert ok["level"] == "OK", ok
        assert "keys app3:* and channels app3:wake:*" in ok["detail"]
        refused = _acl_finding(urls[:1])
        assert refused["level"] == "UNSAFE", refused
        assert "~tenure:*" in refused["detail"]
        with tenure.Client(urls[:1], key_prefix="app3:") as client:
            lease = client.acquire(key, ttl=TTL)
            lines = io.StringIO()  # (status reads in MULTI: not granted to clients)
            assert status(key, shared5.urls[:1], key_prefix="app3:", out=lines) == 0
            assert f"held  token={lease.token[:8]}" in lines.getvalue()
            lines = io.StringIO()
            assert status(key, shared5.urls[:1], out=lines) == 0
            assert "free  token=-" in lines.getvalue()
            lease.release()


def _says_the_prefix(text: str, prefix: str) -> None:
    for words in (f"~{prefix}*", f"&{prefix}wake:*", f"`tenure check --key-prefix {prefix}`"):
        assert words in text, text
    assert "~tenure:*" not in text, text
    assert "`tenure check`" not in text, text


def test_a_refused_extend_and_release_name_the_clients_prefix(
    api: Api, shared5: LocalCluster, key: str
) -> None:
    # Leases taken while the user may use app5:'s keys, then the user confined to the
    # default prefix's: the extend is refused on every node (LeaseLost, each node's
    # message in it) and so is the release (ServerUnsupported); both name app5:'s fix.
    with _confined_user(shared5, "app5:") as urls:
        client = api.client(urls[:3], key_prefix="app5:")
        extended, released = client.acquire(key, ttl=TTL), client.acquire(key + "-2", ttl=TTL)
        _confine(shared5, urlsplit(urls[0]).username or "", "tenure:")
        with pytest.raises(tenure.LeaseLost) as lost:
            extended.extend()
        assert len(lost.value.node_errors) >= 2, lost.value  # decided at 2 of 3 refusals
        for text in (str(lost.value), *lost.value.node_errors.values()):
            _says_the_prefix(text, "app5:")
        with pytest.raises(tenure.ServerUnsupported) as refused:
            released.release()
        _says_the_prefix(str(refused.value), "app5:")


def test_tenure_status_names_the_prefixs_acl_fix(shared5: LocalCluster, key: str) -> None:
    # A user confined to the default prefix, asked about app7:'s lock: each node's line
    # says what app7:'s clients need, not what the default prefix's would.
    with _confined_user(shared5, "tenure:") as urls:
        lines = io.StringIO()
        assert status(key, urls[:3], key_prefix="app7:", out=lines, err=io.StringIO()) != 0
        told = lines.getvalue().splitlines()
        assert len(told) == 3, told
        for line in told:
            assert "unsupported: refused by ACL" in line, line
            _says_the_prefix(line, "app7:")

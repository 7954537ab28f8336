"""TLS nodes (``rediss://``, certificates verified) and slow connection set-up, both APIs.

The embedded redis-server has no TLS: each node here is a real redis-server behind a
TLS-terminating proxy (``tls_proxy.py``) whose certificate is issued by a CA the test
makes; clients verify it (redis-py's default: certificate required, host name checked)
against that CA, passed as ``ssl_ca_certs``.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis

import tenure
from tenure._core.config import LockKeys
from tenure.testing import LocalCluster, LocalNode

from .conftest import Api, holders
from .tls_proxy import CertificateAuthority, TLSProxy

# The asyncio half again on uvloop (uvicorn's default loop): tests/integration/conftest.py.
ALSO_ON_UVLOOP = True

TTL = 5.0
# Several times the default node timeout (50 ms): a handshake this slow used to be
# charged to the first round, which then failed.
SLOW_HANDSHAKE = 0.25


@pytest.fixture
def ca(tmp_path: Path) -> CertificateAuthority:
    return CertificateAuthority(tmp_path / "ca")


@pytest.fixture
def proxies() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


def _proxy(
    stack: ExitStack,
    cluster: LocalCluster,
    i: int,
    ca: CertificateAuthority,
    names: list[str],
    delay: float = 0.0,
) -> TLSProxy:
    node = cluster[i]
    assert node.port is not None
    proxy = TLSProxy((node.host, node.port), ca.issue(names), handshake_delay=delay)
    return stack.enter_context(proxy)


def _verified(ca: CertificateAuthority) -> dict[str, str]:
    return {"ssl_ca_certs": str(ca.ca_file)}


def _while_running(api: Api, wait: Callable[..., bool], *args: object) -> bool:
    """``wait(*args)``, with the asyncio client's event loop running meanwhile (the
    wrapped client runs it only inside its calls), so that its connections progress."""
    return api.run_blocking(wait, *args)


def _used_before(api: Api, cluster: LocalCluster, key: str, n: int) -> None:
    """Acquire and release ``key`` on the first ``n`` nodes directly: a lock with a
    history, so that an attempt is decided by a majority (a new lock must hear every
    node: docs/fencing.md)."""
    api.client(cluster.urls[:n]).acquire(key, ttl=TTL).release()


@pytest.mark.parametrize("n", [1, 3])
def test_slow_handshake_does_not_fail_the_first_acquire(
    api: Api,
    shared5: LocalCluster,
    key: str,
    ca: CertificateAuthority,
    proxies: ExitStack,
    n: int,
) -> None:
    # Handshakes twice as long as the node timeout: charged to the round, they would fail
    # it. Not the default 50 ms, which one attempt's round trips through the proxies, once
    # set up, could miss on a loaded machine: 0.5 s, and handshakes of 1 s (within a
    # connect_timeout of 5 s, not the default 1 s).
    timeout = 0.5
    nodes = [_proxy(proxies, shared5, i, ca, ["127.0.0.1"], 2 * timeout) for i in range(n)]
    client = api.client(
        [p.url for p in nodes],
        connection_options=_verified(ca),
        node_timeout=timeout,
        connect_timeout=5.0,
    )
    # One attempt, on connections not yet set up: the handshakes are not charged to it.
    lease = client.acquire(key, ttl=TTL, blocking=False)
    assert len(lease.nodes) >= n // 2 + 1
    assert sum(p.handshakes for p in nodes) >= n // 2 + 1  # over TLS, certificate verified
    values = holders(shared5, lease.key)[:n]
    assert values.count(lease.token.encode()) >= n // 2 + 1
    lease.release()


@pytest.mark.parametrize(
    ("names", "trust", "says"),
    [
        (["other-node.tenure.test"], True, "does not match the host"),
        (["127.0.0.1"], False, "not signed by a CA this client trusts"),
    ],
    ids=["wrong-host-name", "unknown-ca"],
)
@pytest.mark.parametrize("blocking", [False, True])
def test_certificate_failure_is_a_clear_error(
    api: Api,
    shared5: LocalCluster,
    key: str,
    ca: CertificateAuthority,
    proxies: ExitStack,
    names: list[str],
    trust: bool,
    says: str,
    blocking: bool,
) -> None:
    proxy = _proxy(proxies, shared5, 0, ca, names)
    client = api.client([proxy.url], connection_options=_verified(ca) if trust else {})
    with pytest.raises(tenure.TLSCertificateError) as info:
        client.acquire(key, ttl=TTL, blocking=blocking, timeout=10.0 if blocking else None)
    error = info.value
    assert isinstance(error, tenure.ConfigurationError)
    assert not isinstance(error, tenure.QuorumUnreachable)
    assert error.node == proxy.url
    message = str(error)
    assert message.startswith(f"node {proxy.url}: its TLS certificate ")
    assert says in message
    assert "impossible until they recover" not in message
    assert proxy.wait_handshakes(0, rejected=1)  # the client broke the handshake off
    assert proxy.handshakes == 0
    assert holders(shared5, f"tenure:{{{key}}}:lock")[0] is None


def test_one_bad_certificate_among_three_nodes_costs_only_its_vote(
    api: Api,
    shared5: LocalCluster,
    key: str,
    ca: CertificateAuthority,
    proxies: ExitStack,
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = [_proxy(proxies, shared5, i, ca, ["127.0.0.1"]) for i in range(2)]
    bad = _proxy(proxies, shared5, 2, ca, ["other-node.tenure.test"])
    _used_before(api, shared5, key, 3)
    # A node timeout of 1 s: on a loaded machine a good node's reply through its proxy
    # may take longer than the default 50 ms, and one attempt (blocking=False) that hears
    # only one good node fails, which is not what this test is about. A connect_timeout
    # of 5 s for the same reason: the handshakes through the proxies took over a second.
    client = api.client(
        [p.url for p in [*good, bad]],
        connection_options=_verified(ca),
        node_timeout=1.0,
        connect_timeout=5.0,
    )

    def told() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.name == "tenure"]

    def cycle() -> None:
        lease = client.acquire(key, ttl=TTL, blocking=False)
        assert set(lease.nodes) == {p.url for p in good}
        lease.release()

    with caplog.at_level(logging.WARNING, logger="tenure"):
        # The handshake's failure is known to the round that begins after it ended: on a
        # loaded machine the first rounds may begin while it is still going on (a node
        # still connecting costs its vote and is no configuration fault). Rounds go on
        # until it is told, then a few more, which must not tell it again.
        cycle()
        assert _while_running(api, lambda: bad.wait_handshakes(0, rejected=1))
        deadline = time.monotonic() + 10.0
        while not told() and time.monotonic() < deadline:
            cycle()
        for _ in range(3):
            cycle()
    # Nothing raised, so the client says it once, as for any misconfigured node.
    assert len(told()) == 1, told()
    assert told()[0].startswith(f"node {bad.url}: its TLS certificate does not match the host")


@pytest.mark.parametrize("delay", [0.0, SLOW_HANDSHAKE])
def test_a_new_clients_first_acquire_asks_every_node(
    api: Api,
    shared5: LocalCluster,
    key: str,
    ca: CertificateAuthority,
    proxies: ExitStack,
    delay: float,
) -> None:
    # Set-ups that end a little apart: the round waits for the last one (for up to a
    # node timeout once the others could decide it), so every node is asked and the
    # lease is on every node, as it would be on connections already set up. (The round
    # is decided by the first two answers, so lease.nodes may name only those.) A node
    # timeout of 1 s: on a loaded machine, handshakes through these proxies can end
    # more than the default 50 ms apart (and three proxy threads, woken 0.2-0.5 s late,
    # more than 0.5 s apart), and the round then rightly begins without the last one.
    nodes = [_proxy(proxies, shared5, i, ca, ["127.0.0.1"], delay) for i in range(3)]
    _used_before(api, shared5, key, 3)
    client = api.client([p.url for p in nodes], connection_options=_verified(ca), node_timeout=1.0)
    lease = client.acquire(key, ttl=TTL, blocking=False)

    def on_every_node() -> bool:
        deadline = time.monotonic() + 10.0  # a hang guard: the third SET is on its way
        while holders(shared5, lease.key)[:3] != [lease.token.encode()] * 3:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    assert _while_running(api, on_every_node)
    lease.release()


@pytest.mark.timeout(40)  # a hang guard only: were the set-up waited for, 60 s
def test_a_node_whose_handshake_hangs_does_not_hold_up_the_others(
    api: Api, shared5: LocalCluster, key: str, ca: CertificateAuthority, proxies: ExitStack
) -> None:
    nodes = [_proxy(proxies, shared5, i, ca, ["127.0.0.1"]) for i in range(3)]
    nodes[2].hold()  # its handshake does not even start until released
    _used_before(api, shared5, key, 3)
    client = api.client(
        [p.url for p in nodes], connection_options=_verified(ca), connect_timeout=60.0
    )
    # Two nodes can decide the round: it begins without the third, whose set-up goes on.
    lease = client.acquire(key, ttl=TTL, blocking=False)
    assert set(lease.nodes) == {nodes[0].url, nodes[1].url}
    assert nodes[2].handshakes == 0
    nodes[2].release()
    assert _while_running(api, nodes[2].wait_handshakes, 1)
    lease.release()

    # No key of ours is left anywhere once the third node is up (the asyncio client
    # sends it the acquire when it connects, and the release right behind it).
    def cleaned_up() -> bool:
        deadline = time.monotonic() + 10.0
        while holders(shared5, lease.key)[:3] != [None] * 3:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    assert _while_running(api, cleaned_up)


def test_waiters_are_notified_over_slow_tls(
    api: Api, shared5: LocalCluster, key: str, ca: CertificateAuthority, proxies: ExitStack
) -> None:
    # The notification subscription is set up under connect_timeout too: a slow handshake
    # must not keep a waiter from hearing the release (it would then wait out the
    # holder's TTL, far past this acquire's timeout). The fallback re-check comes after
    # 30 s at the earliest, and the last attempt, at the timeout (30 s), would find the
    # lock free: only the notification ends the wait within 5 s of the release (timed).
    proxy = _proxy(proxies, shared5, 0, ca, ["127.0.0.1"], SLOW_HANDSHAKE)
    # The holder is released from another thread: a blocking client, whatever the waiter.
    holder_client = tenure.Client(shared5.urls[:1])
    proxies.callback(holder_client.close)
    holder = holder_client.acquire(key, ttl=60.0)
    with shared5[0].client() as c:
        before = set(c.pubsub_channels("tenure:wake:*"))
    waiter = api.client([proxy.url], connection_options=_verified(ca), recheck=60.0)
    queue = LockKeys.of(key).queue
    released = threading.Event()
    released_at: list[float] = []

    def release_once_the_waiter_listens() -> None:
        deadline = time.monotonic() + 20.0
        with shared5[0].client() as c:
            while not (set(c.pubsub_channels("tenure:wake:*")) - before and c.zcard(queue)):
                if time.monotonic() > deadline:
                    return  # never subscribed: the waiter times out, and the test fails
                time.sleep(0.005)
        released_at.append(time.monotonic())
        holder.release()
        released.set()

    thread = threading.Thread(target=release_once_the_waiter_listens)
    thread.start()
    try:
        lease = waiter.acquire(key, ttl=TTL, timeout=30.0)
        got = time.monotonic()
    finally:
        thread.join()
    assert released.is_set()
    lease.release()
    took = got - released_at[0]
    assert took < 5.0, f"woken {took:.1f} s after the release: not by its notification"


def test_connect_timeout_is_validated(api: Api, shared5: LocalCluster) -> None:
    for bad in (0, -1, 61, float("nan"), "1"):
        with pytest.raises(tenure.ConfigurationError) as info:
            api.client(shared5.urls[:1], connect_timeout=bad)
        assert info.value.parameter == "connect_timeout"
        assert "(0, 60] seconds" in str(info.value) or "finite number" in str(info.value)


def _encrypted_key(path: Path, passphrase: bytes) -> Path:
    """A copy of the PEM key at ``path``, encrypted with ``passphrase``."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    out = path.with_suffix(".encrypted.key")
    out.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(passphrase),
        )
    )
    return out


def test_tls_files_that_cannot_be_loaded_are_refused_at_construction(
    api: Api, shared5: LocalCluster, ca: CertificateAuthority, proxies: ExitStack, tmp_path: Path
) -> None:
    """redis-py loads the TLS files only when it connects: a missing or wrong one failed
    every connection, and the first acquire raised ``QuorumUnreachable`` as for nodes
    that are down. The client is refused at construction instead, naming the option, the
    node and the fix; the nodes are never asked."""
    proxy = _proxy(proxies, shared5, 0, ca, ["127.0.0.1"])
    client_cert = ca.issue(["tenure-client"])
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("not a certificate\n")
    encrypted = _encrypted_key(client_cert.key, b"s3cret-passphrase")
    cases: list[tuple[dict[str, object], str, str]] = [
        ({"ssl_ca_certs": str(tmp_path / "missing.pem")}, "ssl_ca_certs", "does not exist"),
        ({"ssl_ca_certs": str(not_pem)}, "ssl_ca_certs", "holds no CA certificate"),
        ({"ssl_ca_data": "not a certificate"}, "ssl_ca_data", "holds no CA certificate"),
        ({"ssl_ca_path": str(not_pem)}, "ssl_ca_path", "is not a directory"),
        (
            {"ssl_certfile": str(tmp_path / "missing.pem"), "ssl_keyfile": str(client_cert.key)},
            "ssl_certfile",
            "does not exist",
        ),
        (
            {"ssl_certfile": str(client_cert.cert), "ssl_keyfile": str(tmp_path / "x.key")},
            "ssl_keyfile",
            "does not exist",
        ),
        ({"ssl_keyfile": str(client_cert.key)}, "ssl_keyfile", "without ssl_certfile"),
        ({"ssl_certfile": str(not_pem)}, "ssl_certfile", "cannot be loaded"),
        (
            {"ssl_certfile": str(client_cert.cert), "ssl_keyfile": str(encrypted)},
            "ssl_keyfile",
            "is encrypted and ssl_password is not set",
        ),
        (
            {
                "ssl_certfile": str(client_cert.cert),
                "ssl_keyfile": str(encrypted),
                "ssl_password": "wrong",
            },
            "ssl_certfile",
            "cannot be loaded",
        ),
    ]
    for options, key, says in cases:
        with pytest.raises(tenure.ConfigurationError) as info:
            api.client([proxy.url], connection_options={**_verified(ca), **options})
        error = info.value
        assert error.parameter == f"connection_options[{key!r}]", options
        assert says in str(error), (options, str(error))
        assert f"{proxy.url} (nodes[0])" in str(error)
        assert "Pass " in str(error)
        assert "s3cret-passphrase" not in str(error)
    # In the node URL's query, the node is named.
    with pytest.raises(tenure.ConfigurationError) as info:
        api.client([f"{proxy.url}?ssl_ca_certs={tmp_path / 'missing.pem'}"])
    assert info.value.parameter == "nodes[0]"
    assert "ssl_ca_certs" in str(info.value)
    assert proxy.handshakes == 0
    # The right files, the key encrypted and its passphrase given: a client certificate
    # is loaded and the node is used.
    client = api.client(
        [proxy.url],
        connection_options={
            **_verified(ca),
            "ssl_certfile": str(client_cert.cert),
            "ssl_keyfile": str(encrypted),
            "ssl_password": "s3cret-passphrase",
        },
    )
    client.acquire("tls-files", ttl=TTL).release()
    assert proxy.handshakes >= 1


def test_a_frozen_node_over_tls_is_silent_not_broken(
    api: Api, key: str, ca: CertificateAuthority, proxies: ExitStack
) -> None:
    # One node behind TLS, frozen (SIGSTOP). The blocking client waits for a lone
    # node's reply in recv itself, bounded by the socket's timeout; over TLS that must be
    # Python's own (the kernel's would make the ssl module retry the read for ever, and
    # this acquire hung). The silence is a timeout, as over plain TCP: the connection
    # is kept with its reply owed, and once the node wakes the next acquire goes
    # through on it at once, with no reconnection and no back-off.
    with LocalCluster(1) as one:
        node = _proxy(proxies, one, 0, ca, ["127.0.0.1"])
        client = api.client([node.url], connection_options=_verified(ca), node_timeout=0.1)
        client.acquire(key, ttl=TTL).release()
        one[0].pause()
        try:
            with pytest.raises(tenure.QuorumUnreachable, match="no reply before the deadline"):
                client.acquire(key, ttl=TTL, blocking=False)
        finally:
            one[0].resume()
        lease = client.acquire(key, ttl=TTL, blocking=False)
        lease.release()
        assert node.handshakes == 1


def _status(*urls: str) -> subprocess.CompletedProcess[str]:
    nodes = [arg for url in urls for arg in ("--redis", url)]
    env = {k: v for k, v in os.environ.items() if k != "TENURE_REDIS"}
    command = [sys.executable, "-m", "tenure.cli", "status", "tls-status", *nodes]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)


def test_status_of_a_rediss_url_at_a_plain_port_says_tls_may_not_match() -> None:
    # A plain Redis reads the TLS hello as the start of an inline command and waits for
    # its end, so the handshake times out: the line names the node and the likely fix,
    # not only "Timeout connecting to server". A plain node that is merely silent (here,
    # stopped) times out too, without the hint: the hint is for the handshake alone.
    with LocalCluster(2) as two:
        plain = two.urls[0].replace("redis://", "rediss://", 1)
        two[1].pause()
        try:
            result = _status(plain, two.urls[1])
        finally:
            two[1].resume()
    lines = dict(line.split(None, 1) for line in result.stdout.splitlines())
    assert lines[plain] == (
        "unreachable: Timeout connecting to server (the TLS handshake timed out: the node "
        "may not speak TLS; use redis:// for a plain port)"
    ), result
    assert lines[two.urls[1]].startswith("unreachable: "), result
    assert "TLS" not in lines[two.urls[1]], result


# Short, as a plain port never answers a TLS hello: the set-up ends at this bound
# whatever the machine's load, and no race decides what is said.
PLAIN_PORT_CONNECT_TIMEOUT = 0.3


@pytest.mark.parametrize("given", ["url", "redis-py object"])
def test_an_acquire_at_a_plain_port_over_tls_says_the_node_may_not_speak_tls(
    api: Api, key: str, given: str
) -> None:
    # A plain Redis reads the client's TLS hello as the start of an inline command and
    # waits for its end, so the handshake never ends; the client's own timer, which
    # bounds the whole set-up, runs out first. Its per-node failure names the likely
    # cause and the fix, as `tenure status` does (test above), not only "not connected
    # within connect_timeout"; for a TLS node given as a URL or as a redis-py object with
    # ssl=True alike. (The blocking client's set-up thread may time the handshake out
    # itself, if the round looks late: that says the same, in redis-py's words.)
    with LocalCluster(1) as one:
        node = one[0]
        assert node.port is not None
        tls_url = one.urls[0].replace("redis://", "rediss://", 1)
        nodes: list[Any] = (
            [tls_url] if given == "url" else [redis.Redis(host=node.host, port=node.port, ssl=True)]
        )
        message = _refused_at_once(api, nodes, key)
        assert f"[{tls_url}: unreachable: " in message, message
        assert "the node may not speak TLS" in message, message
        assert "use redis:// for a plain port" in message, message
        # A plain node whose set-up times out (frozen: its SELECT is never answered) is
        # only unreachable: the hint is for TLS nodes alone.
        silent = f"{one.urls[0]}/1"
        message = _refused_while_frozen(api, node, silent, key)
        assert f"[{silent}: unreachable: " in message, message
        assert "TLS" not in message, message


def test_a_cluster_seed_at_a_plain_port_over_tls_says_the_node_may_not_speak_tls(
    api: Api, key: str
) -> None:
    # A rediss+cluster:// seed at a plain port never answers the TLS hello, so the asyncio
    # client's slot map load ran out its connect_timeout and said only "no slot map
    # within connect_timeout (X s)". It names the likely cause and the fix now, as a
    # plain node's set-up does (test above). (The blocking client's connection to the
    # seed times the handshake out itself, just before, and says so in redis-py's words,
    # with the hint too.) No cluster is needed: any plain node leaves the hello unanswered.
    with LocalCluster(1) as one:
        node = one[0]
        seed = f"{node.host}:{node.port}"
        url = f"rediss+cluster://{seed}"
        message = _refused_at_once(api, [url], key)
        assert f"[{url}: unreachable: rediss://{seed}: " in message, message
        assert "the node may not speak TLS" in message, message
        # From the slot map's timer or from redis-py's handshake timeout alike: the
        # seed's connection is a member's (rediss://), the fix the node's kind.
        assert "use redis+cluster:// for a plain port" in message, message
        assert "use redis:// " not in message, message
        # A plain seed that never answers (frozen) is only unreachable.
        plain = f"redis+cluster://{seed}"
        message = _refused_while_frozen(api, node, plain, key)
        assert f"[{plain}: unreachable: redis://{seed}: " in message, message
        assert "TLS" not in message, message


@pytest.mark.parametrize("kind", ["redis", "redis with a password", "redis+cluster"])
def test_a_plain_url_at_a_tls_port_says_the_node_may_speak_tls(
    api: Api, key: str, ca: CertificateAuthority, proxies: ExitStack, kind: str
) -> None:
    # A TLS port drops a connection whose first bytes are a command: the client said
    # only "Connection reset by peer". It names the likely cause and the fix, in the
    # URL's own kind, whether the first command was the lock's, AUTH in the set-up, or
    # a Cluster seed's CLUSTER SLOTS; `tenure status` says the same.
    with LocalCluster(1) as one:
        proxy = _proxy(proxies, one, 0, ca, ["127.0.0.1"])
        at = f"127.0.0.1:{proxy.port}"
        url, shown, secure = {
            "redis": (f"redis://{at}", f"redis://{at}", "rediss"),
            "redis with a password": (f"redis://:secret@{at}", f"redis://{at}", "rediss"),
            "redis+cluster": (f"redis+cluster://{at}", f"redis+cluster://{at}", "rediss+cluster"),
        }[kind]
        hint = f"the node may speak TLS; use {secure}:// for a TLS port)"
        message = _refused_at_once(api, [url], key)
        assert f"[{shown}: unreachable: " in message, message
        assert hint in message, message
        assert proxy.handshakes == 0
        result = _status(url)
        (line,) = result.stdout.splitlines()
        assert line.split(None, 1) == [shown, line.split(None, 1)[1]], result
        assert line.split(None, 1)[1].startswith("unreachable: "), result
        assert line.endswith(hint), result


def _refused_at_once(api: Api, nodes: list[Any], key: str) -> str:
    """The ``QuorumUnreachable`` of a non-blocking acquire on ``nodes`` whose set-up or
    slot map never comes: what it says."""
    timeouts = {"connect_timeout": PLAIN_PORT_CONNECT_TIMEOUT, "node_timeout": 0.2}
    with pytest.raises(tenure.QuorumUnreachable) as info:
        api.client(nodes, **timeouts).acquire(key, ttl=TTL, blocking=False)
    return str(info.value)


def _refused_while_frozen(api: Api, node: LocalNode, url: str, key: str) -> str:
    """``_refused_at_once`` on ``url``, a plain node or seed at ``node``, frozen meanwhile."""
    node.pause()
    try:
        return _refused_at_once(api, [url], key)
    finally:
        node.resume()

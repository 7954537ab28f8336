"""The verifier's fault injectors against real redis-server processes, each with its proof.

Proxy faults (delay, blackhole, reset, lost replies), wall-clock jumps with libfaketime,
process-state evidence from /proc, and the tenure.testing additions they rely on.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tenure._errors import ConfigurationError
from tenure.testing import LocalCluster, LocalNode, find_server_binary
from tenure.verify.clock import NodeClock, faketime_library, server_time
from tenure.verify.proof import (
    FaultNotObserved,
    info_field,
    process_state,
    run_id,
    server_pid,
    wait_for_state,
    wait_until,
)
from tenure.verify.proxy import Proxy, ProxyMode

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, LD_PRELOAD")


@pytest.fixture(scope="module")
def node() -> Iterator[LocalNode]:
    """One node that proxy tests put proxies in front of; the node itself is never hurt."""
    with LocalCluster(1) as cluster:
        yield cluster[0]


@pytest.fixture
def proxy(node: LocalNode) -> Iterator[Proxy]:
    assert node.port is not None
    with Proxy(node.host, node.port, name=node.name) as p:
        yield p


def _client(url: str, timeout: float = 2.0) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=timeout, retry=Retry(NoBackoff(), 0))


def _rtt(c: redis.Redis, n: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(n):
        c.ping()
    return (time.perf_counter() - start) / n


def _connect(proxy: Proxy) -> socket.socket:
    return socket.create_connection(proxy.address, timeout=2.0)


def _raw_ping(s: socket.socket) -> bytes:
    """PING on a raw socket; a closed connection raises, like a reset one."""
    s.sendall(b"PING\r\n")
    reply = s.recv(100)
    if not reply:
        raise ConnectionResetError("closed")
    return reply


def _read_exactly(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


# -- proxy -------------------------------------------------------------------------------


def test_pass_forwards_and_counts(proxy: Proxy) -> None:
    assert proxy.url == f"redis://127.0.0.1:{proxy.address[1]}"
    with _client(proxy.url) as c:
        assert c.ping() is True
        c.set("pass", "v")
        assert c.get("pass") == b"v"
    stats = proxy.stats
    assert stats.mode is ProxyMode.PASS
    assert stats.connections == 1
    assert stats.bytes_up > 0
    assert stats.bytes_down > 0
    assert stats.bytes_dropped == 0
    assert stats.resets == 0


def test_blackhole_times_out_drops_bytes_and_heal_restores(proxy: Proxy) -> None:
    idle = _connect(proxy)  # open, but sends nothing while the partition lasts
    with _client(proxy.url, timeout=0.3) as c:
        assert c.ping() is True
        proxy.blackhole()
        with _client(proxy.url, timeout=0.3) as fresh, pytest.raises(redis.TimeoutError):
            fresh.ping()  # new connections are swallowed too
        with pytest.raises(redis.TimeoutError):
            c.ping()
        assert proxy.stats.bytes_dropped > 0
        assert proxy.stats.mode == "blackhole"
        proxy.heal()
        with _client(proxy.url) as after:
            assert after.ping() is True
    # A connection that lost data is reset at heal; one that was idle carries on.
    assert proxy.stats.resets >= 1
    assert _raw_ping(idle) == b"+PONG\r\n"
    idle.close()


def test_heal_resets_a_connection_whose_reply_was_dropped(proxy: Proxy) -> None:
    s = _connect(proxy)
    proxy.blackhole()
    s.sendall(b"PING\r\n")
    wait_until(lambda: proxy.stats.bytes_dropped, lambda n: n >= 6, 2.0, "PING discarded")
    proxy.heal()
    # Resuming would hand this client the next command's reply as PING's: it is reset.
    with pytest.raises(ConnectionResetError):
        _raw_ping(s)
    s.close()


def test_reset_refuses_existing_and_new_connections(proxy: Proxy) -> None:
    with _client(proxy.url) as c:
        assert c.ping() is True
        proxy.reset()
        assert proxy.stats.resets >= 1
        with pytest.raises(redis.ConnectionError):
            c.ping()
        with _client(proxy.url) as fresh, pytest.raises(redis.ConnectionError):
            fresh.ping()
        proxy.heal()
        assert c.ping() is True  # redis-py reconnects


def test_drop_replies_runs_the_command_but_the_reply_never_comes(
    proxy: Proxy, node: LocalNode
) -> None:
    with node.client() as direct:
        direct.delete("ambiguous")
    with _client(proxy.url, timeout=0.3) as c:
        assert c.ping() is True
        proxy.drop_replies()
        with pytest.raises(redis.TimeoutError):
            c.set("ambiguous", "v")
    with node.client() as direct:
        assert wait_until(lambda: direct.get("ambiguous"), bool, 2.0, "SET ran") == b"v"
    assert proxy.stats.bytes_dropped > 0


def test_blackhole_discards_chunks_held_by_a_delay(proxy: Proxy) -> None:
    s = _connect(proxy)
    assert _raw_ping(s) == b"+PONG\r\n"
    proxy.delay(5)
    s.sendall(b"PING\r\n")
    time.sleep(0.05)  # the proxy reads the second PING and holds it back
    assert proxy.stats.bytes_up == 6  # only the first PING reached the server
    proxy.blackhole()  # the held PING was in flight on a link that is now cut: lost
    # (Had a loaded machine kept the proxy from reading it before, blackhole mode now
    # reads and drops it: the same 6 bytes lost either way.)
    wait_until(lambda: proxy.stats.bytes_dropped, lambda n: n == 6, 2.0, "the PING dropped")
    proxy.heal()
    with pytest.raises(ConnectionResetError):
        _raw_ping(s)
    s.close()


def test_delay_slows_each_direction_and_heal_delivers_in_order(proxy: Proxy) -> None:
    with _client(proxy.url) as c:
        assert c.ping() is True
        proxy.delay(0.2)
        assert proxy.stats.delay == 0.2
        assert _rtt(c) >= 0.4  # 0.2 s out, 0.2 s back
        # Held-back chunks are delivered at heal, before anything newer, in order.
        s = _connect(proxy)
        s.sendall(b"".join(b"ECHO %d\r\n" % i for i in range(50)))
        wait_until(lambda: proxy.stats.bytes_up, bool, 2.0, "bytes sent before heal")
        proxy.heal()
        expected = b"".join(b"$%d\r\n%d\r\n" % (len(str(i)), i) for i in range(50))
        assert _read_exactly(s, len(expected)) == expected
        s.close()
        # Healed: well under the 0.4 s of one delayed round trip. The best of three, so
        # that a loaded machine's stall in one of them does not decide it (delayed, every
        # round trip would take 0.4 s).
        assert min(_rtt(c) for _ in range(3)) < 0.2


def test_negative_delay_is_refused(proxy: Proxy) -> None:
    with pytest.raises(ConfigurationError) as info:
        proxy.delay(-1)
    assert info.value.parameter == "seconds"


def test_many_connections_at_once(proxy: Proxy) -> None:
    sockets = [_connect(proxy) for _ in range(150)]
    try:
        for i, s in enumerate(sockets):
            s.sendall(b"ECHO %03d\r\n" % i)
        for i, s in enumerate(sockets):
            expected = b"$3\r\n%03d\r\n" % i
            assert _read_exactly(s, len(expected)) == expected
        assert proxy.stats.open_connections == 150
    finally:
        for s in sockets:
            s.close()
    wait_until(lambda: proxy.stats.open_connections, lambda n: n == 0, 5.0, "links closed")


def test_half_close_delivers_the_reply_then_eof(proxy: Proxy) -> None:
    s = _connect(proxy)
    s.sendall(b"PING\r\n")
    s.shutdown(socket.SHUT_WR)
    assert _read_exactly(s, 100) == b"+PONG\r\n"  # then EOF
    s.close()


def test_target_death_closes_clients_and_a_restart_is_reached_again() -> None:
    with LocalCluster(1) as cluster:
        target = cluster[0]
        assert target.port is not None
        with Proxy(target.host, target.port) as p, _client(p.url) as c:
            assert c.ping() is True
            target.kill()
            with pytest.raises(redis.ConnectionError):
                c.ping()
            with _client(p.url) as fresh, pytest.raises(redis.ConnectionError):
                fresh.ping()  # connect refused -> the proxy resets the client
            target.start()
            assert c.ping() is True


def test_blackhole_hides_a_dead_target_until_heal() -> None:
    with LocalCluster(1) as cluster:
        target = cluster[0]
        assert target.port is not None
        with Proxy(target.host, target.port) as p, _client(p.url, timeout=0.3) as c:
            assert c.ping() is True
            p.blackhole()
            target.kill()
            with pytest.raises(redis.TimeoutError):  # not ConnectionError: partitioned
                c.ping()
            s = _connect(p)
            p.heal()
            with pytest.raises(ConnectionResetError):
                _raw_ping(s)
            s.close()


def test_replica_through_proxy_misses_writes_while_blackholed_and_catches_up() -> None:
    with LocalCluster(2) as cluster:
        master, replica = cluster
        assert master.port is not None
        with Proxy(master.host, master.port, name="link") as link, master.client() as m:
            replica.replicate_from(link.address)
            replica.wait_replication_link(10)
            assert replica.master_link_status() == "up"
            assert master.master_link_status() is None
            m.set("before", "1")
            assert m.execute_command("WAIT", 1, 5000) == 1
            link.blackhole()
            m.set("during", "1")
            assert m.execute_command("WAIT", 1, 300) == 0  # no replica acknowledged it
            with replica.client() as r:
                assert r.get("before") == b"1"
                assert r.get("during") is None
            assert link.stats.bytes_dropped > 0
            link.heal()
            with replica.client() as r:
                wait_until(lambda: r.get("during"), bool, 10.0, "replica caught up")
            assert m.execute_command("WAIT", 1, 5000) == 1


def test_pass_mode_forwards_without_waiting(proxy: Proxy, node: LocalNode) -> None:
    # Medians, so that a busy machine's scheduling hiccups do not decide the result. The
    # bound is functional, not a performance figure: a proxy that held chunks for a timer
    # or polled its sockets would add tens of milliseconds; its real cost (a few hundred
    # µs on an idle machine) is no business of a test.
    with node.client() as direct, _client(proxy.url) as proxied:
        added = statistics.median(_rtt(proxied) for _ in range(200)) - statistics.median(
            _rtt(direct) for _ in range(200)
        )
    assert added < 0.02, f"the proxy adds {added * 1e6:.0f} µs per round trip"


def test_replicate_from_refuses_a_remote_address(node: LocalNode) -> None:
    with pytest.raises(ConfigurationError) as info:
        node.replicate_from(("10.0.0.1", 6379))
    assert info.value.parameter == "other"


def test_proxy_refuses_a_remote_target() -> None:
    with pytest.raises(ConfigurationError):
        Proxy("10.0.0.1", 6379)


# -- node environment and clocks ---------------------------------------------------------


def test_node_env_reaches_the_server_and_survives_restart(tmp_path: Path) -> None:
    # redis-server overwrites its environ block with its process title, so a wrapper
    # script records the environment it was started with before exec'ing the server.
    seen = tmp_path / "seen"
    wrapper = tmp_path / "redis-wrapper"
    wrapper.write_text(
        f'#!/bin/sh\necho "$TENURE_TEST_MARK" >> "{seen}"\nexec "{find_server_binary()}" "$@"\n'
    )
    wrapper.chmod(0o755)
    node = LocalNode("n1", tmp_path / "n1", binary=wrapper, env={"TENURE_TEST_MARK": "yes"})
    try:
        node.start()
        node.restart()
        with node.client() as c:
            assert c.ping() is True
    finally:
        node.stop()
    assert seen.read_text().split() == ["yes", "yes"]


@linux_only
def test_clock_jump_expires_keys_on_one_node_only(tmp_path: Path) -> None:
    clock = NodeClock(tmp_path / "clock")
    assert clock.path.read_text().strip() in ("+0", "+0.000000")
    with LocalCluster(2, env_for=lambda i: clock.env() if i == 0 else None) as cluster:
        faked, honest = cluster
        with faked.client() as f, honest.client() as h:
            assert abs(server_time(f) - time.time()) < 2
            f.set("lock", "a", px=10_000)
            h.set("lock", "a", px=10_000)
            assert f.pttl("lock") > 0
            clock.jump(60)
            assert clock.offset == 60
            assert clock.wait_seen(f) >= 59  # Valkey shows it a moment later
            assert server_time(f) - time.time() >= 59
            assert f.get("lock") is None  # expired by the jump
            assert abs(server_time(h) - time.time()) < 2
            assert h.get("lock") == b"a"
        faked.restart()
        with faked.client() as f:
            assert server_time(f) - time.time() >= 59  # still wrong after a restart
            clock.jump(-60)
            assert abs(clock.wait_seen(f)) < 2
            assert abs(server_time(f) - time.time()) < 2


def test_faketime_library_is_found_without_importing_it() -> None:
    path = faketime_library()
    assert path.name == "libfaketime.so.1"
    assert path.is_file()
    assert "libfaketime" not in sys.modules


def test_faketime_library_missing_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TENURE_LIBFAKETIME", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigurationError, match=r"tenure\[verify\]") as info:
        faketime_library()
    assert info.value.parameter == "libfaketime"


def test_faketime_library_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TENURE_LIBFAKETIME", os.fspath(tmp_path / "missing.so"))
    with pytest.raises(ConfigurationError, match="TENURE_LIBFAKETIME"):
        faketime_library()


# -- proof -------------------------------------------------------------------------------


@linux_only
def test_process_state_follows_pause_resume_and_kill() -> None:
    with LocalCluster(1) as cluster:
        target = cluster[0]
        pid = target.pid
        assert pid is not None
        with target.client() as c:
            assert server_pid(c) == pid
            before = run_id(c)
        assert process_state(pid) in "RS"
        target.pause()
        assert wait_for_state(pid, "Tt", 2.0) in "Tt"
        target.resume()
        assert wait_for_state(pid, "RS", 2.0) in "RS"
        target.restart()
        assert wait_for_state(pid, "XZ", 2.0) == "X"
        with pytest.raises(ProcessLookupError):
            process_state(pid)
        with target.client() as c:
            assert run_id(c) != before
            assert info_field(c, "replication", "role") == "master"
            assert info_field(c, "replication", "master_link_status") is None


@linux_only
def test_process_state_parses_a_name_with_parentheses(tmp_path: Path) -> None:
    odd = tmp_path / "a) R (b"
    odd.symlink_to(Path(sys.executable))
    with subprocess.Popen(
        [os.fspath(odd), "-c", "import time; time.sleep(30)"], stdin=subprocess.DEVNULL
    ) as child:
        try:
            child.send_signal(signal.SIGSTOP)
            assert wait_for_state(child.pid, "T", 2.0) == "T"
        finally:
            child.kill()
            child.wait()


@linux_only
def test_wait_for_state_times_out_with_the_last_state() -> None:
    with pytest.raises(FaultNotObserved) as info:
        wait_for_state(os.getpid(), "T", 0.05)
    assert isinstance(info.value, TimeoutError)
    assert info.value.last.strip("'") in "RS"

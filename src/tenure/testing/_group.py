"""A group of local server processes: one directory, stopped together, none left behind.

:class:`~tenure.testing.local.LocalCluster`, the deployments of
:mod:`tenure.testing.topologies` and the test suite's PostgreSQL are each a few child
processes in one directory. What they share is here: the directory (a temporary one,
removed on close, or one given and kept), :meth:`ProcessGroup.close`, and the context
manager.

``close()`` asks every process to stop, then reaps every one: two passes, so that the
processes shut down side by side rather than one grace period after another. A process
that fails to stop (a signal refused, an interrupt while waiting) spares none of the
others: every process is still asked, every one reaped (killed after its grace), the
directory removed, and then the first failure is raised. Once a temporary directory is
removed its processes can never start again, so each is then retired: it lets go of what
it holds beyond the directory (a node's claimed port, :mod:`tenure.testing._ports`).
``with group:`` closes on the way out, and also when ``start()`` fails part way, because
the processes it launched before the failure are running and nobody else holds them.

Each process is stopped through its own ``subprocess.Popen``, by the PID of a child we
spawned and have not reaped yet (:func:`kill_and_reap`), never by name or process group.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol, TypeVar

from tenure._errors import ConfigurationError

__all__ = ["Member", "ProcessGroup", "kill_and_reap", "make_directory", "removed"]

G = TypeVar("G", bound="ProcessGroup")


def kill_and_reap(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` and reap it: a member's last resort, and its finalizer."""
    # Popen.kill() is a no-op once the child has been reaped, so a recycled PID is never
    # signalled.
    proc.kill()
    proc.wait()


def removed(group: str, directory: Path) -> str:
    """Why a process of a closed ``group`` cannot start again, and what to do instead:
    said alike by the group and by each of its processes."""
    return (
        f"its temporary directory {directory} was removed with it: make a new {group}"
        " (or give base_dir, which close keeps, to start one again after close)"
    )


class Member(Protocol):
    """One process of a group, as :meth:`ProcessGroup.close` stops it."""

    def _terminate(self) -> None:
        """Ask the process to exit (its shutdown signal), without waiting."""

    def _reap(self) -> None:
        """Wait out the process's grace period, kill it if it is still there, reap it."""

    def _retire(self) -> None:
        """Let go of what the process holds beyond its directory (a claimed port): the
        directory is gone, so it never starts again. Raises nothing."""


class ProcessGroup:
    """Processes sharing a directory, stopped together by :meth:`close` (a base class).

    A subclass creates its processes after calling ``__init__`` and names them in
    :meth:`_processes`, and implements :meth:`start`.

    Args:
        base_dir: where the processes' directories go, created if missing and kept on
            close; ``None``: a temporary directory, removed on close.
        prefix: the temporary directory's name prefix.

    Raises:
        ConfigurationError: (``base_dir``) it cannot be made: a file is in the way, or
            it is not writable.
    """

    def __init__(self, base_dir: str | os.PathLike[str] | None, prefix: str) -> None:
        if base_dir is None:
            self.directory = Path(tempfile.mkdtemp(prefix=prefix))
            # Registered before the processes' finalizers, so at exit it runs after them.
            self._cleanup: weakref.finalize[Any, Any] | None = weakref.finalize(
                self, shutil.rmtree, self.directory, ignore_errors=True
            )
        else:
            self.directory = Path(base_dir).resolve()
            make_directory(
                self.directory,
                "base_dir",
                f"the directory {self.directory}",
                "give a directory this process may write in, or None for a temporary one",
            )
            self._cleanup = None
        self._removed = False

    def _require_directory(self) -> None:
        """Refuse to start once :meth:`close` removed the temporary directory: the
        processes' configs, logs and data lived there (a ``base_dir`` is kept, so such a
        group starts again)."""
        if self._removed:
            # Imported here: local.py imports this module.
            from .local import LocalNodeError

            name = type(self).__name__
            raise LocalNodeError(name, f"closed, and {removed(name, self.directory)}")

    def _abandon(self) -> None:
        """Undo ``__init__`` after a subclass's own ``__init__`` failed part way: remove
        the temporary directory now, rather than when the half-made group is collected
        (the exception's traceback keeps it alive meanwhile)."""
        if self._cleanup is not None:
            self._cleanup()

    def _processes(self) -> Sequence[Member]:
        """Every process of the group, in the order they are asked to stop."""
        raise NotImplementedError

    def start(self) -> None:
        """Start every process (a subclass calls :meth:`_require_directory` first)."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop every process and remove the temporary directory (a ``base_dir`` is kept).

        Every process is asked to exit first (a server: SIGTERM), then each is reaped,
        killed (SIGKILL) if it outlives its grace period (a server: 5 s). A failure to
        stop one spares none of the others: all are still stopped and the directory
        removed, then the first failure is raised (an interrupt, such as
        ``KeyboardInterrupt``, before any error). A temporary directory removed, every
        process is retired (``Member._retire``: a node gives up its claimed port).
        Closing again does nothing more.
        """
        processes = list(self._processes())
        failures: list[BaseException] = []
        for step in [p._terminate for p in processes] + [p._reap for p in processes]:
            try:
                step()
            except BaseException as exc:  # raised below, once every process is stopped
                failures.append(exc)
        if self._cleanup is not None:
            self._cleanup()  # rmtree(ignore_errors=True): raises nothing
            self._removed = True
            for process in processes:
                process._retire()
        if failures:
            interrupts = [f for f in failures if not isinstance(f, Exception)]
            raise (interrupts or failures)[0]

    def __enter__(self: G) -> G:
        try:
            self.start()
        except BaseException:
            # What started before the failure runs, and the caller gets no handle on it.
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def make_directory(path: Path, parameter: str, named: str, fix: str) -> None:
    """Make ``path`` (and its parents) unless it exists; one that cannot be made (a file
    in the way, no permission, a read-only disk) is a ConfigurationError of ``parameter``
    saying so (``named``) and the ``fix``."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigurationError(
            parameter, f"cannot make {named}: {exc.strerror or exc}; {fix}"
        ) from None

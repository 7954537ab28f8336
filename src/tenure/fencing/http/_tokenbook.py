"""The token book: the highest fencing token seen per resource, in memory or in a file.

Part of :mod:`tenure.fencing.http` (its module docstring is the theory of operation).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path

from tenure._errors import ConfigurationError

# Tokens must be below this; documented, and exported, by tenure.fencing.http.
GATE_TOKEN_LIMIT = 2**63

_BOOK_VERSION = 1


class TokenBook:
    """The highest fencing token seen per resource; thread-safe and asyncio-safe.

    ``admit`` is a check-and-raise under one ``threading.Lock`` with no ``await`` inside,
    so neither threads nor coroutines can interleave between the check and the update.
    Memory is not bounded: one entry per resource ever admitted, kept forever (dropping
    an entry would let a stale writer of that resource through).

    Args:
        path: optional JSON file to persist to. It is read now if it exists, and
            rewritten atomically (temp file in the same directory, then ``os.replace``)
            each time a resource's highest token rises, before ``admit`` returns.
        fsync: flush the file (and its directory) to disk before replacing, so the
            book also survives a power loss, not only a process restart.

    Raises:
        ConfigurationError: ``path`` is no path, or exists but is not a token book.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, fsync: bool = True) -> None:
        self._lock = threading.Lock()
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise ConfigurationError(
                "path",
                f"must be a file path (str or pathlib.Path) or None (in memory), got {path!r}",
            )
        self._path = None if path is None else Path(path)
        self._fsync = fsync
        self._highest: dict[str, int] = {} if self._path is None else _load_book(self._path)

    @property
    def path(self) -> Path | None:
        """The file the book persists to, or None for an in-memory book."""
        return self._path

    def admit(self, resource: str, token: int) -> int | None:
        """Admit ``token`` for ``resource`` if no newer token was seen, and record it.

        Args:
            resource: the fenced resource's name.
            token: the writer's fencing token, 0 <= token < GATE_TOKEN_LIMIT.

        Returns:
            None when admitted (``token`` is now the highest for ``resource``), else the
            highest token seen, which is greater than ``token``.

        Raises:
            ConfigurationError: ``token`` is not an int in range, or ``resource`` not a str.
            OSError: the book could not be persisted; nothing was recorded then.
        """
        _check_token(token)
        if not isinstance(resource, str):
            # A persisted book keys resources by text: another type would be admitted
            # now and unmatched after a reload.
            raise ConfigurationError("resource", f"must be a str, got {resource!r}")
        with self._lock:
            highest = self._highest.get(resource)
            if highest is not None and token < highest:
                return highest
            if highest != token:
                self._record(resource, token)
            return None

    def highest(self, resource: str) -> int | None:
        """The highest token admitted for ``resource``, or None if none was."""
        with self._lock:
            return self._highest.get(resource)

    def _record(self, resource: str, token: int) -> None:
        # Persist first: if writing fails the request is refused and memory still agrees
        # with the file, so a restart cannot resurrect a smaller highest token.
        if self._path is not None:
            _write_book(self._path, {**self._highest, resource: token}, fsync=self._fsync)
        self._highest[resource] = token

    def __repr__(self) -> str:
        where = "memory" if self._path is None else str(self._path)
        return f"TokenBook({where}, resources={len(self._highest)})"


def _check_token(token: object) -> None:
    # bool is an int subclass; True as a token is a bug, not a 1.
    if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < GATE_TOKEN_LIMIT:
        raise ConfigurationError("token", f"must be an int in [0, 2**63), got {token!r}")


def _load_book(path: Path) -> dict[str, int]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as exc:
        # A directory, an unreadable file, a parent that is a file: the book could never
        # be read back, so refuse it now rather than let a raw OSError out of __init__.
        reason = exc.strerror or str(exc)
        raise ConfigurationError(
            "path",
            f"cannot read {path} as a token book ({reason}): pass the path of a JSON file "
            "this process may read and write, or of one not yet created",
        ) from exc
    except UnicodeDecodeError as exc:
        raise ConfigurationError("path", f"{path} is not a tenure token book: {exc}") from exc
    try:
        document = json.loads(text)
        entries = document["highest"]
        if document.get("version") != _BOOK_VERSION or not isinstance(entries, dict):
            raise TypeError("unknown layout")
        for resource, token in entries.items():
            _check_token(token)
            if not isinstance(resource, str):  # pragma: no cover - JSON keys are strings
                raise TypeError("resource names must be strings")
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ConfigurationError("path", f"{path} is not a tenure token book: {exc}") from exc
    return dict(entries)


def _write_book(path: Path, highest: dict[str, int], *, fsync: bool) -> None:
    data = json.dumps({"version": _BOOK_VERSION, "highest": highest}, sort_keys=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(data)
            file.flush()
            if fsync:
                os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    if fsync:
        _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    # Makes the rename itself durable. Not possible on Windows, where it is not needed.
    if os.name != "posix":  # pragma: no cover
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""The history of a verifier run: typed events, one JSON object per line, and a reader.

Theory of operation
-------------------
Every worker process, the nemesis and the orchestrator write their own history file;
the checker reads the files merged. The writers can be SIGKILLed at any instant, so the
format is append-only JSONL: one event per line, each line handed to the kernel in one
``write`` and never buffered in the process. A kill can then lose at most the event
being written, and can leave its line torn (no final newline). The reader skips lines
that are not JSON (and says which, in :attr:`History.skipped`); it refuses valid JSON
that is not one of our events, which is a bug rather than an accident of a kill.

Times are ``time.monotonic_ns()`` integers. All processes run on one machine, so their
monotonic clocks are one clock and times from different files compare directly. Each
event has one *main* time (:attr:`time`: when it happened, or ended for the ones that
span an interval, except a fault, which is placed where it began); :class:`History`
holds the events sorted by it, ties kept in file order.

The events (their field names are a contract: workers and the checker both use them):

``Request(proc, t)``
    ``proc`` begins an acquire. A blocking acquire that retries is one request.
``Grant(proc, lease, token, t_request, t, valid_until)``
    The acquire begun at ``t_request`` returned a lease at ``t``, valid until
    ``valid_until``. ``lease`` is unique per acquisition; ``token`` is the fencing token,
    ``None`` for a lock without tokens.
``Refused(proc, t_request, t, reason)``
    The acquire begun at ``t_request`` ended at ``t`` without a lease.
``Release(proc, lease, t_start, t, outcome)``
    A release begun at ``t_start`` (the holder stopped using the lease then) ended at
    ``t``: ``"ok"``, ``"lost"`` (the lease was already gone), ``"error"``.
``Extend(proc, lease, t_start, t, valid_until, outcome)``
    An extension (watchdog or explicit) begun at ``t_start``; ``"ok"`` moves the lease's
    deadline to ``valid_until``; ``"lost"`` or ``"error"`` leave it (``valid_until`` None).
``Write(proc, lease, token, op, t_start, t, outcome, seq)``
    A write of operation ``op`` to the shared register: ``"ok"`` (the store took it),
    ``"stale"`` (the store refused the token), ``"error"`` (unknown outcome). ``seq`` is
    the store's own order number for the write, taken atomically with it, or None.
``Final(t, ops)``
    The register's content at the end: the op ids it holds, in order.
``Fault(name, target, t_start, t_end, proof)``
    A nemesis action; ``t_end`` None if it lasted to the end; ``proof`` says how the
    nemesis saw that the fault took effect (e.g. ``"state T in /proc/1234/stat"``).
``Crash(proc, t)``
    The orchestrator SIGKILLed ``proc``.
``Note(t, text)``
    Free text for the timeline.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar, Literal, TypeAlias, TypeVar

__all__ = [
    "RELEASE_OUTCOMES",
    "WRITE_OUTCOMES",
    "Crash",
    "Event",
    "Extend",
    "Fault",
    "Final",
    "Grant",
    "History",
    "HistoryError",
    "HistoryWriter",
    "Note",
    "Refused",
    "Release",
    "Request",
    "SkippedLine",
    "Write",
    "dumps",
    "loads",
    "read_history",
    "write_history",
]

# Outcomes are typed ``str`` (workers pass what their driver reported) and checked when
# an event is made, so a worker's typo fails in the worker, not in the checker later.
RELEASE_OUTCOMES = frozenset({"ok", "lost", "error"})
"""Outcomes of :class:`Release` and :class:`Extend`."""
WRITE_OUTCOMES = frozenset({"ok", "stale", "error"})
"""Outcomes of :class:`Write`."""


class HistoryError(ValueError):
    """A history line is JSON but not an event of this format (or an event is malformed).

    Attributes:
        where: ``"path:line"`` of the offending line, or ``""`` when not read from a file.
        detail: what is wrong with it.
    """

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(f"{where}: {detail}" if where else detail)
        self.where = where
        self.detail = detail


def _check_outcome(kind: str, outcome: str, allowed: frozenset[str]) -> None:
    if outcome not in allowed:
        raise HistoryError("", f"{kind}.outcome must be one of {sorted(allowed)}, got {outcome!r}")


@dataclass(frozen=True, slots=True)
class Request:
    """``proc`` begins an acquire at ``t`` (a blocking acquire spanning retries is one)."""

    kind: ClassVar[Literal["request"]] = "request"
    proc: str
    t: int

    @property
    def time(self) -> int:
        return self.t


@dataclass(frozen=True, slots=True)
class Grant:
    """The acquire ``proc`` began at ``t_request`` got lease ``lease`` at ``t``."""

    kind: ClassVar[Literal["grant"]] = "grant"
    proc: str
    lease: str
    token: int | None
    t_request: int
    t: int
    valid_until: int

    @property
    def time(self) -> int:
        return self.t


@dataclass(frozen=True, slots=True)
class Refused:
    """The acquire ``proc`` began at ``t_request`` ended at ``t`` without a lease."""

    kind: ClassVar[Literal["refused"]] = "refused"
    proc: str
    t_request: int
    t: int
    reason: str

    @property
    def time(self) -> int:
        return self.t


@dataclass(frozen=True, slots=True)
class Release:
    """``proc`` stopped using ``lease`` at ``t_start``; the release call ended at ``t``."""

    kind: ClassVar[Literal["release"]] = "release"
    proc: str
    lease: str
    t_start: int
    t: int
    outcome: str

    def __post_init__(self) -> None:
        _check_outcome("Release", self.outcome, RELEASE_OUTCOMES)

    @property
    def time(self) -> int:
        return self.t


@dataclass(frozen=True, slots=True)
class Extend:
    """An extension of ``lease`` begun at ``t_start``; when ``"ok"``, valid to ``valid_until``."""

    kind: ClassVar[Literal["extend"]] = "extend"
    proc: str
    lease: str
    t_start: int
    t: int
    valid_until: int | None
    outcome: str

    def __post_init__(self) -> None:
        _check_outcome("Extend", self.outcome, RELEASE_OUTCOMES)
        if self.outcome == "ok" and self.valid_until is None:
            raise HistoryError("", "Extend with outcome 'ok' needs valid_until")

    @property
    def time(self) -> int:
        return self.t


@dataclass(frozen=True, slots=True)
class Write:
    """A write of operation ``op`` to the register, made under ``lease``."""

    kind: ClassVar[Literal["write"]] = "write"
    proc: str
    lease: str
    token: int | None
    op: str
    t_start: int
    t: int
    outcome: str
    seq: int | None

    def __post_init__(self) -> None:
        _check_outcome("Write", self.outcome, WRITE_OUTCOMES)

    @property
    def time(self) -> int:
        return self.t


@dataclass(frozen=True, slots=True)
class Final:
    """The register's content read at ``t`` at the end of the run: its op ids, in order."""

    kind: ClassVar[Literal["final"]] = "final"
    t: int
    ops: tuple[str, ...]

    @property
    def time(self) -> int:
        return self.t


@dataclass(frozen=True, slots=True)
class Fault:
    """A nemesis action on ``target`` from ``t_start`` to ``t_end`` (None: to the end)."""

    kind: ClassVar[Literal["fault"]] = "fault"
    name: str
    target: str
    t_start: int
    t_end: int | None
    proof: str

    @property
    def time(self) -> int:
        return self.t_start


@dataclass(frozen=True, slots=True)
class Crash:
    """The orchestrator SIGKILLed worker ``proc`` at ``t``."""

    kind: ClassVar[Literal["crash"]] = "crash"
    proc: str
    t: int

    @property
    def time(self) -> int:
        return self.t


@dataclass(frozen=True, slots=True)
class Note:
    """Free text shown on the timeline at ``t``."""

    kind: ClassVar[Literal["note"]] = "note"
    t: int
    text: str

    @property
    def time(self) -> int:
        return self.t


Event: TypeAlias = (
    Request | Grant | Refused | Release | Extend | Write | Final | Fault | Crash | Note
)

_CLASSES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (Request, Grant, Refused, Release, Extend, Write, Final, Fault, Crash, Note)
}


# --- JSON ----------------------------------------------------------------------------------


def _int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"expected an int, got {value!r}")


def _opt_int(value: object) -> int | None:
    return None if value is None else _int(value)


def _str(value: object) -> str:
    if isinstance(value, str):
        return value
    raise TypeError(f"expected a string, got {value!r}")


def _str_tuple(value: object) -> tuple[str, ...]:
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError(f"expected a list of strings, got {value!r}")


# By annotation text: the module uses postponed annotations, so these are strings.
_CONVERTERS: dict[str, Callable[[object], object]] = {
    "int": _int,
    "int | None": _opt_int,
    "str": _str,
    "tuple[str, ...]": _str_tuple,
}

_FIELDS: dict[str, tuple[tuple[str, Callable[[object], object]], ...]] = {
    kind: tuple((f.name, _CONVERTERS[str(f.type)]) for f in fields(cls))
    for kind, cls in _CLASSES.items()
}


def dumps(event: Event) -> str:
    """``event`` as one line of JSON (no newline), ``kind`` first."""
    record: dict[str, Any] = {"kind": event.kind}
    for name, _ in _FIELDS[event.kind]:
        value = getattr(event, name)
        record[name] = list(value) if isinstance(value, tuple) else value
    return json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads(line: str, where: str = "") -> Event:
    """The event in one JSON line.

    Raises:
        json.JSONDecodeError: ``line`` is not JSON (a torn line, for instance).
        HistoryError: it is JSON but not a well-formed event; ``where`` names the line.
    """
    record = json.loads(line)
    if not isinstance(record, dict):
        raise HistoryError(where, f"expected a JSON object, got {type(record).__name__}")
    kind = record.get("kind")
    if not isinstance(kind, str) or kind not in _CLASSES:
        raise HistoryError(where, f"unknown event kind {kind!r}")
    spec = _FIELDS[kind]
    extra = set(record) - {"kind"} - {name for name, _ in spec}
    if extra:
        raise HistoryError(where, f"{kind}: unknown fields {sorted(extra)}")
    values: dict[str, object] = {}
    for name, convert in spec:
        if name not in record:
            raise HistoryError(where, f"{kind}: missing field {name!r}")
        try:
            values[name] = convert(record[name])
        except TypeError as exc:
            raise HistoryError(where, f"{kind}.{name}: {exc}") from None
    try:
        return _CLASSES[kind](**values)  # type: ignore[arg-type]
    except HistoryError as exc:
        raise HistoryError(where, exc.detail) from None


# --- writing -------------------------------------------------------------------------------


class HistoryWriter:
    """Appends events to a JSONL file, one ``write`` system call per event.

    Nothing is buffered in the process, so a SIGKILL loses at most the event being
    written. Opening a file whose last line is torn (a previous writer was killed
    mid-line) first ends that line, so the torn bytes stay one skipped line instead of
    swallowing the next event. Safe to share between threads. Use as a context manager
    or call :meth:`close`.

    Args:
        path: the file; created if missing, appended to if it exists.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if self._ends_mid_line():
            self._write_all(b"\n")

    def _ends_mid_line(self) -> bool:
        with open(self.path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            if size == 0:
                return False
            f.seek(size - 1)
            return f.read(1) != b"\n"

    def _write_all(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:  # a regular file takes it all at once; the loop is for the odd case
            view = view[os.write(self._fd, view) :]

    def write(self, event: Event) -> None:
        """Append ``event`` as one line.

        Raises:
            ValueError: the writer is closed.
        """
        data = (dumps(event) + "\n").encode()
        with self._lock:
            if self._fd is None:
                raise ValueError(f"HistoryWriter({str(self.path)!r}) is closed")
            self._write_all(data)

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def write_history(path: str | os.PathLike[str], events: Iterable[Event]) -> None:
    """Append ``events`` to ``path`` (a convenience for tests and tools)."""
    with HistoryWriter(path) as writer:
        for event in events:
            writer.write(event)


# --- reading -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SkippedLine:
    """A line the reader skipped because it is not JSON (a torn write, most likely)."""

    path: str
    line: int
    text: str


E = TypeVar("E", bound=Event)


class History:
    """Events sorted by their main time (ties in the order given), with lookups.

    Args:
        events: in any order.
        skipped: lines the reader could not parse, kept for the report.
    """

    __slots__ = (
        "crashes",
        "end",
        "events",
        "extends",
        "faults",
        "final",
        "grants",
        "notes",
        "processes",
        "refusals",
        "releases",
        "requests",
        "skipped",
        "start",
        "writes",
    )

    def __init__(self, events: Iterable[Event], skipped: Sequence[SkippedLine] = ()) -> None:
        ordered = sorted(events, key=lambda e: e.time)  # stable: ties keep file order
        self.events: tuple[Event, ...] = tuple(ordered)
        self.skipped: tuple[SkippedLine, ...] = tuple(skipped)
        self.requests: tuple[Request, ...] = self.of_type(Request)
        self.grants: tuple[Grant, ...] = self.of_type(Grant)
        self.refusals: tuple[Refused, ...] = self.of_type(Refused)
        self.releases: tuple[Release, ...] = self.of_type(Release)
        self.extends: tuple[Extend, ...] = self.of_type(Extend)
        self.writes: tuple[Write, ...] = self.of_type(Write)
        self.faults: tuple[Fault, ...] = self.of_type(Fault)
        self.crashes: tuple[Crash, ...] = self.of_type(Crash)
        self.notes: tuple[Note, ...] = self.of_type(Note)
        finals = self.of_type(Final)
        # The orchestrator reads the register once; if it read it twice, the last counts.
        self.final: Final | None = finals[-1] if finals else None
        seen: dict[str, None] = {}
        for e in ordered:
            proc = getattr(e, "proc", None)
            if proc is not None:
                seen.setdefault(proc, None)
        # Process names in order of their first event.
        self.processes: tuple[str, ...] = tuple(seen)
        # The earliest and latest instants any event mentions (0 for an empty history).
        # Validity deadlines are promises, not events, so they do not stretch the span.
        times = [t for e in ordered for t in _times(e)]
        self.start: int = min(times, default=0)
        self.end: int = max(times, default=0)

    def of_type(self, cls: type[E]) -> tuple[E, ...]:
        """The events of class ``cls``, in time order."""
        return tuple(e for e in self.events if isinstance(e, cls))

    def __len__(self) -> int:
        return len(self.events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events)

    def __repr__(self) -> str:
        return f"History({len(self.events)} events, {len(self.skipped)} skipped lines)"


def _times(e: Event) -> tuple[int, ...]:
    if isinstance(e, Grant | Refused):
        return (e.t_request, e.t)
    if isinstance(e, Release | Extend | Write):
        return (e.t_start, e.t)
    if isinstance(e, Fault):
        return (e.t_start,) if e.t_end is None else (e.t_start, e.t_end)
    return (e.t,)


def read_history(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
) -> History:
    """Read and merge history files (one path, or several).

    Lines that are not JSON are skipped and listed in :attr:`History.skipped`: a writer
    killed mid-line leaves one torn line at the end of its file. Blank lines are ignored.

    Raises:
        HistoryError: a line is JSON but not an event; ``where`` is ``"path:line"``.
        OSError: a file cannot be read.
    """
    if isinstance(paths, str | os.PathLike):
        paths = [paths]  # not the characters of one path name
    events: list[Event] = []
    skipped: list[SkippedLine] = []
    for path in paths:
        name = os.fspath(path)
        # errors="replace": a kill can tear a multi-byte character too.
        with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
            for number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    events.append(loads(line, f"{name}:{number}"))
                except json.JSONDecodeError:
                    skipped.append(SkippedLine(name, number, line.rstrip("\n")[:200]))
    return History(events, skipped)

"""The locks a verifier worker can run: tenure's, and the unsafe baselines it is compared with.

Every lock answers the same two questions, so the checker can judge them all alike:
``acquire(timeout)`` returns a :class:`Held` (what the holder *believes*: its fencing
token, and until when on ``time.monotonic_ns()`` it thinks it may act) or the reason it
got nothing; ``release()`` says whether the release found the lease still there.

A baseline's belief is computed the way that pattern computes it, flaws included: the
checker then shows where the belief and reality part. Baselines live only here, labelled
``UNSAFE`` in their names and docstrings; nothing in the library uses them.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from dataclasses import dataclass
from typing import Any, Protocol

import redis
import redis.sentinel

from .._errors import AcquireError, LeaseLost, OwnershipError, TenureError
from .._sync.client import Client, Lease

__all__ = [
    "BASELINES",
    "Held",
    "LockRecipe",
    "LockUnderTest",
    "TenureLock",
    "make_lock",
]

FOREVER_NS = 2**62
"""``valid_until`` of a lock that never expires (SETNX without a TTL)."""


@dataclass(frozen=True, slots=True)
class Held:
    """What a holder believes after acquiring."""

    lease: str
    token: int | None
    t: int  # monotonic ns when the reply arrived
    valid_until: int  # monotonic ns until which the holder thinks it may act


class LockUnderTest(Protocol):
    def acquire(self, timeout: float) -> Held | str:
        """Acquire within ``timeout`` seconds (0: one attempt); a Held, or why not."""
        ...

    def release(self) -> str:
        """Release the held lock: "ok", "lost" (someone else's now) or "error"."""
        ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class LockRecipe:
    """A picklable recipe for a lock, built inside the worker process."""

    kind: str  # "tenure" or a key of BASELINES
    urls: tuple[str, ...]
    name: str
    ttl: float
    node_timeout: float = 0.05
    max_ttl: float = 60.0
    wait_replicas: int = 0


def _lease_id() -> str:
    return secrets.token_hex(6)


def _connect(url: str, timeout: float) -> redis.Redis:
    """A baseline's client for ``url``: a node, or ``redis+sentinel://h:p[,h:p]/service``,
    the master the Sentinels name (asked again on every new connection, so a baseline
    follows a failover the way a Sentinel-aware application does)."""
    if not url.startswith("redis+sentinel://"):
        return redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    hosts, _, service = url.removeprefix("redis+sentinel://").partition("/")
    addresses = [(h, int(p)) for h, _, p in (a.rpartition(":") for a in hosts.split(","))]
    manager = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call,unused-ignore]
        addresses, sentinel_kwargs={"socket_timeout": 1.0, "socket_connect_timeout": 1.0}
    )
    master: redis.Redis = manager.master_for(  # type: ignore[no-untyped-call,unused-ignore]
        service, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    return master


class TenureLock:
    """tenure's own lock, through the public blocking API."""

    def __init__(self, spec: LockRecipe) -> None:
        options: dict[str, Any] = {}
        if spec.wait_replicas:
            options["wait_replicas"] = spec.wait_replicas
        self._client = Client(
            list(spec.urls), node_timeout=spec.node_timeout, max_ttl=spec.max_ttl, **options
        )
        self._spec = spec
        self._lease: Lease | None = None

    def acquire(self, timeout: float) -> Held | str:
        try:
            lease = self._client.acquire(
                self._spec.name, self._spec.ttl, blocking=timeout > 0, timeout=timeout or None
            )
        except AcquireError as exc:  # held elsewhere, or no majority: a refusal
            return f"{type(exc).__name__}: {exc}"
        t = time.monotonic_ns()
        self._lease = lease
        return Held(_lease_id(), lease.fencing_token, t, int(lease.valid_until * 1e9))

    def release(self) -> str:
        lease, self._lease = self._lease, None
        if lease is None:
            return "error"
        try:
            lease.release()
        except (LeaseLost, OwnershipError):
            return "lost"
        except TenureError:
            return "error"
        return "ok"

    def fresh(self, count: int) -> dict[str, int]:
        """Lock ``count`` names never used before, twice each: a lock per entity. Nobody
        else holds them, so each acquire may take a retry or two (a node that timed out
        on a loaded machine), never a wait: refused if not granted within 2 s. Counts
        the refusals and any second token not above the first."""
        granted = refused = disorder = 0
        for _ in range(count):
            name = f"{self._spec.name}:entity:{secrets.token_hex(8)}"
            tokens = []
            for _ in range(2):
                try:
                    lease = self._client.acquire(name, self._spec.ttl, timeout=2.0)
                except AcquireError:
                    refused += 1
                    continue
                granted += 1
                tokens.append(lease.fencing_token)
                with contextlib.suppress(TenureError):
                    lease.release()
            disorder += len(tokens) == 2 and tokens[1] <= tokens[0]
        return {"fresh_granted": granted, "fresh_refused": refused, "fresh_disorder": disorder}

    def close(self) -> None:
        self._client.close()


class _SingleKeyBaseline:
    """Shared plumbing of the one-node baselines: a client with short timeouts."""

    def __init__(self, spec: LockRecipe) -> None:
        self._spec = spec
        self._key = f"baseline:{spec.name}"
        self._ttl_ms = max(1, int(spec.ttl * 1000))
        self._r = _connect(spec.urls[0], spec.node_timeout)
        self._token = ""

    def acquire(self, timeout: float) -> Held | str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                held = self._try()
            except redis.RedisError as exc:
                held = f"{type(exc).__name__}: {exc}"
            if isinstance(held, Held) or time.monotonic() >= deadline:
                return held
            time.sleep(0.005)

    def _try(self) -> Held | str:
        raise NotImplementedError

    def release(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        self._r.close()


class SetNxNoTtl(_SingleKeyBaseline):
    """UNSAFE baseline: ``SETNX`` with no expiry, ``DEL`` to release.

    Mutual exclusion holds, but a holder that crashes holds the lock forever: every other
    client waits until an operator deletes the key.
    """

    def _try(self) -> Held | str:
        token = _lease_id()
        if self._r.setnx(self._key, token):
            self._token = token
            return Held(token, None, time.monotonic_ns(), FOREVER_NS)
        return "held"

    def release(self) -> str:
        return "ok" if self._r.delete(self._key) else "lost"


class SetNxGetSet(_SingleKeyBaseline):
    """UNSAFE baseline: the ``SETNX`` + ``GETSET`` expiry trick (the old Redis manual's recipe).

    The value is the wall-clock time the lock expires. A client that finds it expired
    ``GETSET``s a new expiry and wins if the old value it got back is the expired one. The
    release is a plain ``DEL``. It trusts synchronised wall clocks, and a holder paused past
    its expiry deletes the lock of whoever took over when it resumes and releases.
    """

    def _try(self) -> Held | str:
        now = time.time()
        expires = now + self._spec.ttl
        lease = _lease_id()
        believed = time.monotonic_ns() + int(self._spec.ttl * 1e9)
        if self._r.setnx(self._key, repr(expires)):
            return Held(lease, None, time.monotonic_ns(), believed)
        current = self._r.get(self._key)
        if current is not None and float(current) < now:
            old = self._r.getset(self._key, repr(expires))
            if old is not None and float(old) < now:
                return Held(lease, None, time.monotonic_ns(), believed)
        return "held"

    def release(self) -> str:
        return "ok" if self._r.delete(self._key) else "lost"


class NoOwnerCheck(_SingleKeyBaseline):
    """UNSAFE baseline: ``SET NX PX`` to acquire, but ``DEL`` without checking the owner.

    A holder that outlived its TTL (paused, slow) deletes the next holder's lock on
    release, and a third client walks in while the second still works.
    """

    def _try(self) -> Held | str:
        sent = time.monotonic_ns()
        if self._r.set(self._key, "x", nx=True, px=self._ttl_ms):
            return Held(_lease_id(), None, time.monotonic_ns(), sent + self._ttl_ms * 1_000_000)
        return "held"

    def release(self) -> str:
        return "ok" if self._r.delete(self._key) else "lost"


class NaiveValidity(_SingleKeyBaseline):
    """UNSAFE baseline: owner-checked ``SET NX PX``, but validity counted from the reply.

    It believes it holds the lock for the full TTL after the reply arrives, forgetting that
    the key's TTL started when the server executed the command: a slow reply eats into a
    lease the holder thinks it still has.
    """

    def _try(self) -> Held | str:
        token = _lease_id()
        if self._r.set(self._key, token, nx=True, px=self._ttl_ms):
            self._token = token
            t = time.monotonic_ns()
            return Held(token, None, t, t + self._ttl_ms * 1_000_000)
        return "held"

    def release(self) -> str:
        released = self._r.eval(_COMPARE_AND_DELETE, 1, self._key, self._token)
        return "ok" if released else "lost"


class PlainRedlock:
    """UNSAFE baseline: Redlock as first published, without delayed restarts or fencing.

    ``SET NX PX`` on every node, a majority and positive validity (TTL - elapsed - drift)
    to win, compare-and-delete everywhere to release. Correct while no node forgets a lock
    it granted; a node restarted without persistence breaks it (verifier scenario 2).
    """

    def __init__(self, spec: LockRecipe) -> None:
        self._spec = spec
        self._key = f"baseline:{spec.name}"
        self._ttl_ms = max(1, int(spec.ttl * 1000))
        self._nodes = [_connect(u, spec.node_timeout) for u in spec.urls]
        self._token = ""

    def acquire(self, timeout: float) -> Held | str:
        deadline = time.monotonic() + timeout
        while True:
            held = self._try()
            if isinstance(held, Held) or time.monotonic() >= deadline:
                return held
            time.sleep(0.005 + secrets.randbelow(20) / 1000)

    def _try(self) -> Held | str:
        token = _lease_id()
        start = time.monotonic_ns()
        answers = [self._set(node, token) for node in self._nodes]
        votes = answers.count(True)
        now = time.monotonic_ns()
        drift = int(self._ttl_ms * 0.01 * 1e6) + 2_000_000
        valid_until = start + self._ttl_ms * 1_000_000 - drift
        n = len(self._nodes)
        if votes > n // 2 and valid_until > now:
            self._token = token
            return Held(token, None, now, valid_until)
        self._token = token
        self.release()
        # Who did not answer, in the words of tenure's LockTimeout: a scenario tells a
        # refusal by the nodes (the lock it tests) from one by a slow machine (its
        # nodes timed out: the cycle tested nothing, scenarios.unheard).
        reason = f"{votes} of {n} votes"
        if silent := answers.count(None):
            reason += f"; {silent} of {n} nodes failed or did not answer"
        if votes > n // 2:
            reason += f"; validity spent after {(now - start) / 1e6:.0f} ms"
        return reason

    def _set(self, node: redis.Redis, token: str) -> bool | None:
        """The node's vote, or None if it failed or did not answer in time."""
        try:
            return bool(node.set(self._key, token, nx=True, px=self._ttl_ms))
        except redis.RedisError:
            return None

    def release(self) -> str:
        released = 0
        for node in self._nodes:
            with contextlib.suppress(redis.RedisError):
                released += int(node.eval(_COMPARE_AND_DELETE, 1, self._key, self._token))
        return "ok" if released > len(self._nodes) // 2 else "lost"

    def close(self) -> None:
        for node in self._nodes:
            node.close()


class NoLock:
    """UNSAFE baseline: no lock at all. Every acquire is granted at once, for ever.

    The control of the counter race (``tenure demo``): with nothing to exclude them, the
    workers' critical sections overlap and their read-modify-writes lose updates.
    """

    def __init__(self, spec: LockRecipe) -> None:
        self._spec = spec

    def acquire(self, timeout: float) -> Held | str:
        return Held(_lease_id(), None, time.monotonic_ns(), FOREVER_NS)

    def release(self) -> str:
        return "ok"

    def close(self) -> None:
        pass


_COMPARE_AND_DELETE = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)

BASELINES: dict[str, type[_SingleKeyBaseline] | type[PlainRedlock] | type[NoLock]] = {
    "setnx-no-ttl": SetNxNoTtl,
    "setnx-getset": SetNxGetSet,
    "no-owner-check": NoOwnerCheck,
    "naive-validity": NaiveValidity,
    "plain-redlock": PlainRedlock,
    "no-lock": NoLock,
}


def make_lock(spec: LockRecipe) -> LockUnderTest:
    """Build the lock ``spec`` describes (in the process that will use it)."""
    if spec.kind == "tenure":
        return TenureLock(spec)
    return BASELINES[spec.kind](spec)

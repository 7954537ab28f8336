"""Results and the protocol ``idempotent`` needs: codecs, ``Once``, the store, the checks.

Part of :mod:`tenure.patterns.idempotency` (its module docstring is the theory of
operation).
"""

from __future__ import annotations

import functools
import inspect
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, ParamSpec, Protocol, TypeVar, cast

from ..._core.config import check_name
from ..._core.numbers import is_finite
from ..._errors import ConfigurationError

T = TypeVar("T")
P = ParamSpec("P")


@dataclass(frozen=True)
class Codec:
    """How results are stored: ``dumps(result) -> bytes`` and ``loads(bytes) -> result``.

    ``None`` is stored without the codec (as "no result"), so a codec need not handle it.
    """

    dumps: Callable[[Any], bytes]
    loads: Callable[[bytes], Any]


def _json_dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


JSON = Codec(dumps=_json_dumps, loads=json.loads)
"""The default codec. Results must be JSON-serialisable; tuples come back as lists, and
dict keys as strings."""


class Once(Protocol):
    """One attempt at an idempotent operation, as ``store.once(key)`` yields it."""

    @property
    def done(self) -> bool:
        """True if a previous attempt finished (skip the effect, answer ``result``)."""

    @property
    def result(self) -> Any:
        """The recorded result (when ``done``), or what this attempt recorded."""

    def record(self, result: Any) -> None:
        """Record this attempt's result: later duplicates will get it."""


class IdempotencyStore(Protocol):
    """Anything :func:`idempotent` can use: ``with store.once(key) as once: ...``."""

    def once(self, key: str) -> AbstractContextManager[Once]: ...


# The claim of the @idempotent handler running in this context (thread or task): set
# around the handler's call only, so a handler it calls in turn sees its own.
_CLAIM: ContextVar[Once | None] = ContextVar("tenure_idempotent_claim", default=None)


def current_claim() -> Any:
    """The claim of the :func:`idempotent` handler running now, or ``None``.

    For a handler whose effect may outlast the store's lease: it calls
    ``current_claim().extend()`` (:meth:`RedisOnce.extend`) between its steps, as a
    ``with store.once(key)`` block would. The innermost handler's claim, in the
    handler's own thread or task (a thread the handler starts does not see it).

    Returns:
        What ``store.once(key)`` yielded for this call (a :class:`RedisOnce` for a
        :class:`RedisIdempotency`); ``None`` outside a decorated handler, or in one
        running without idempotency (its key function returned ``None``).
    """
    return _CLAIM.get()


def idempotent(
    store: IdempotencyStore, *, key: Callable[P, str | None]
) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Make a request handler run at most once per idempotency key; duplicates get its result.

    Args:
        store: where keys are claimed and results recorded, e.g. :class:`RedisIdempotency`.
        key: computes the idempotency key from the handler's arguments; ``None`` (e.g.
            the request carries no key) runs the handler without idempotency.

    Returns:
        A decorator. The wrapped handler claims the key, runs, records what it returns,
        and returns it; a duplicate returns the recorded result without running. If the
        handler raises, nothing is recorded and the claim is released. While it runs,
        :func:`current_claim` gives the handler its claim (to extend it).

    Raises:
        ConfigurationError: (when decorating) ``handler`` is a coroutine function: the
            stores are blocking, and would record the un-awaited coroutine, not its
            result; or ``store.once`` needs more than the key (``SqlIdempotency.once``
            takes the transaction's connection: use it in a ``with`` block instead).

    Example::

        @idempotent(store, key=lambda request: request.headers.get("Idempotency-Key"))
        def deduct_points(request: Request) -> dict[str, int]:
            balance = ledger.deduct(request.user, request.json["points"])
            return {"balance": balance}
    """

    _check_store(store)

    def decorate(handler: Callable[P, T]) -> Callable[P, T]:
        if inspect.iscoroutinefunction(handler) or inspect.isasyncgenfunction(handler):
            # Called, it would return a coroutine at once: the effect would not have run,
            # and the store would try to record the coroutine itself.
            raise ConfigurationError(
                "handler",
                f"{getattr(handler, '__qualname__', handler)!r} is an async function; "
                "idempotent() wraps blocking handlers (the stores are blocking): decorate "
                "a blocking function, or use store.once(key) in a thread of its own",
            )

        @functools.wraps(handler)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
            name = key(*args, **kwargs)
            if name is None:
                return handler(*args, **kwargs)
            with store.once(name) as once:
                if once.done:
                    return cast("T", once.result)
                claim = _CLAIM.set(once)
                try:
                    result = handler(*args, **kwargs)
                finally:
                    _CLAIM.reset(claim)
                once.record(result)
                return result

        return wrapper

    return decorate


def _check_store(store: object) -> None:
    """Refuse a store whose ``once`` cannot be called with the key alone."""
    once = getattr(store, "once", None)
    if not callable(once):
        raise ConfigurationError(
            "store", f"must have a once(key) method (e.g. RedisIdempotency), got {store!r}"
        )
    try:
        inspect.signature(once).bind("key")
    except TypeError:
        raise ConfigurationError(
            "store",
            f"{type(store).__name__}.once cannot be called with the key alone; "
            "idempotent() needs a store such as RedisIdempotency. For SqlIdempotency, "
            "use `with keys.once(connection, key) as once:` inside the effect's transaction",
        ) from None
    except ValueError:  # no signature to read (a builtin): let the call say what it says
        pass


def _encoded(codec: Codec, result: Any) -> bytes:
    """``codec.dumps(result)``, or a ConfigurationError naming ``result`` and the codec."""
    try:
        encoded = codec.dumps(result)
    except Exception as exc:
        raise ConfigurationError(
            "result",
            f"{type(result).__name__} value cannot be stored by the codec ({exc!r}): "
            "return something the codec encodes (JSON by default: dicts, lists, str, "
            "numbers, bool), or pass a Codec that handles it",
        ) from exc
    if not isinstance(encoded, (bytes, bytearray)):
        raise ConfigurationError(
            "result", f"the codec's dumps returned {type(encoded).__name__}, not bytes"
        )
    return bytes(encoded)


def _decoded(codec: Codec, encoded: bytes, key: str, forget: str) -> Any:
    """``codec.loads(encoded)``, the record of ``key``; a ConfigurationError if it cannot.

    A record found but unreadable is never taken as no record: that would run the effect
    again. It was written by another codec (a deploy changed it) or by hand, so the
    error names the codec. The message leaves the record out (results may be private:
    a payment's receipt); its ``__cause__`` is the codec's own exception.
    """
    try:
        return codec.loads(encoded)
    except Exception as exc:
        raise ConfigurationError(
            "codec",
            f"idempotency key {key!r} holds a record the codec cannot read "
            f"({type(exc).__name__}, {len(encoded):,} bytes): it was written by another "
            f"codec or by hand. Read it with the codec that wrote it; or, to forget the "
            f"request (a retry then runs the effect again), {forget}",
        ) from exc


def _check_codec(codec: object) -> Codec:
    if not (callable(getattr(codec, "dumps", None)) and callable(getattr(codec, "loads", None))):
        raise ConfigurationError(
            "codec", f"must be a Codec(dumps=..., loads=...) (default JSON), got {codec!r}"
        )
    return cast(Codec, codec)


def _check_key(key: object) -> str:
    return check_name(key, "key")


# The longest lease or retention (about 100 years): Redis takes expiry times up to
# 2**63 ms from the epoch, and refused larger ones only at the first use, raw.
MAX_SECONDS = 3_153_600_000.0


def _seconds_to_ms(parameter: str, seconds: float) -> int:
    if not (is_finite(seconds) and 0.001 <= seconds <= MAX_SECONDS):
        raise ConfigurationError(
            parameter,
            f"must be a number of seconds in [0.001, {MAX_SECONDS:,.0f}], got {seconds!r}",
        )
    return round(seconds * 1000)


def _check_wait(wait: float) -> float:
    if not (is_finite(wait) and wait >= 0):
        raise ConfigurationError("wait", f"must be a finite number of seconds >= 0, got {wait!r}")
    return float(wait)

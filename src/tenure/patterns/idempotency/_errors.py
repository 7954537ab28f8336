"""The errors of idempotency keys: a key in progress, a claim lost, a record unclaimed.

Part of :mod:`tenure.patterns.idempotency` (its module docstring is the theory of
operation).
"""

from __future__ import annotations

from ..._errors import TenureError


class InProgress(TenureError, RuntimeError):
    """Another attempt holds the idempotency key and has not finished (HTTP: 409, retry later).

    Attributes:
        key: the idempotency key.
        retry_after: seconds left on the holder's lease when last seen (after it, a
            crashed holder is taken over), or None if unknown.
        waited: how long this attempt waited before giving up, in seconds.
    """

    def __init__(
        self, key: str, retry_after: float | None, waited: float, message: str | None = None
    ) -> None:
        hint = "" if retry_after is None else f"; its lease ends in {retry_after:.3f} s"
        super().__init__(
            message
            or f"idempotency key {key!r}: another attempt is in progress{hint} "
            f"(waited {waited:.3f} s)"
        )
        self.key = key
        self.retry_after = retry_after
        self.waited = waited


class ClaimLost(TenureError, RuntimeError):
    """Our claim on an idempotency key ended (its lease ran out) and another attempt took it.

    From :meth:`RedisOnce.record`: our effect happened, and the attempt that took over
    may do it again: it was not exactly once (see the module's theory of operation).
    From :meth:`RedisOnce.apply`: nothing of ours was applied. From
    :meth:`RedisOnce.extend`: the claim is gone, and the attempt that took over may do
    the effect as well as ours.

    Attributes:
        key: the idempotency key.
        holder: what the key holds now: ``"claim"`` (another attempt in progress) or
            ``"record"`` (another attempt finished).
    """

    def __init__(self, key: str, holder: str, message: str) -> None:
        super().__init__(f"idempotency key {key!r}: {message}")
        self.key = key
        self.holder = holder


class NotClaimed(TenureError, RuntimeError):
    """``record`` or ``apply`` on an attempt that holds no claim.

    The attempt found the key ``done`` (answer its ``result`` instead), or it has
    recorded already, or its claim was lost.

    Attributes:
        key: the idempotency key.
    """

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"idempotency key {key!r}: {message}")
        self.key = key

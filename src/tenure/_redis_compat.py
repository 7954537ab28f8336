"""The few places where tenure depends on how redis-py (>= 5) is put together.

Kept in one module so that a change in redis-py breaks one file, and tests/integration
exercise every function here against the installed version.
"""

from __future__ import annotations

import inspect
import socket
import ssl
import struct
from typing import Any

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.exceptions import NoPermissionError, ResponseError

from ._core.quorum import Failure

__all__ = ["classify_error", "connection_kwargs", "kernel_timeouts", "set_up_failure"]


def _accepts(cls: type, name: str) -> bool:
    """Whether ``cls(...)`` takes keyword ``name`` anywhere along its MRO."""
    return any(
        name in inspect.signature(c.__dict__["__init__"]).parameters
        for c in cls.__mro__
        if "__init__" in c.__dict__
    )


# redis-py 5-7 name the CLIENT SETINFO handshake lib_name/lib_version; 8 deprecates them
# for driver_info. Either way we switch it off: it costs two round trips per connect and
# would block a reconnect to a frozen node for the whole socket timeout.
_NO_SETINFO: dict[str, Any] = (
    {"driver_info": None}
    if _accepts(redis.Connection, "driver_info")
    else {"lib_name": None, "lib_version": None}
)


def connection_kwargs(
    node_timeout: float, *, asyncio: bool, unix: bool, connect_timeout: float | None = None
) -> dict[str, Any]:
    """Options for every connection tenure opens.

    redis-py's own retries are off: it would re-send ``SET NX`` after a timeout and stall
    for seconds, while tenure owns retries and time. Health checks are off for the same
    reason (they are a hidden round trip). The async driver reads replies in a background
    task, so it waits without a socket timeout and enforces deadlines itself.
    ``connect_timeout`` (default: ``node_timeout``) bounds the TCP connect; the clients'
    drivers bound the rest of the set-up (TLS handshake, AUTH) by it too.
    """
    retry_cls = redis.asyncio.retry.Retry if asyncio else redis.retry.Retry
    options: dict[str, Any] = {
        "socket_timeout": None if asyncio else node_timeout,
        "socket_connect_timeout": node_timeout if connect_timeout is None else connect_timeout,
        "retry": retry_cls(NoBackoff(), 0),
        "health_check_interval": 0,
        # RESP2: redis-py 8 defaults to RESP3, whose HELLO handshake is a blocking round
        # trip on every connect; our replies (OK, nil, integers) read the same in both.
        "protocol": 2,
        **_NO_SETINFO,
    }
    if not unix:
        # TCP keepalive lets the kernel notice a peer that vanished without a reset.
        options["socket_keepalive"] = True
    return options


def set_up_failure(exc: BaseException) -> tuple[Failure, str]:
    """Why setting up a connection failed, and how to say it.

    A TLS certificate that failed verification is a configuration problem that no retry
    fixes, so it is told apart (``Failure.CERTIFICATE``) and said plainly; redis-py wraps
    the ``ssl`` error in its ConnectionError, so the chain is searched. Anything else
    means the node could not be reached.
    """
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return Failure.CERTIFICATE, _certificate_problem(seen)
        seen = seen.__cause__ or seen.__context__
    return Failure.UNREACHABLE, str(exc) or type(exc).__name__


# OpenSSL's X509_V_ERR_* codes, as ssl.SSLCertVerificationError.verify_code reports them.
_NAME_MISMATCH = frozenset({62, 63, 64})  # host name, e-mail, IP address
_UNTRUSTED = frozenset({18, 19, 20, 21})  # self-signed, unknown issuer, unverifiable
_EXPIRED, _NOT_YET_VALID = 10, 9


def _certificate_problem(exc: ssl.SSLCertVerificationError) -> str:
    code = getattr(exc, "verify_code", None)
    said = (getattr(exc, "verify_message", None) or str(exc)).rstrip(".")
    if code in _NAME_MISMATCH:
        return (
            f"its TLS certificate does not match the host in the node's URL ({said}); "
            "use the name or address the certificate was issued for in the URL"
        )
    if code in _UNTRUSTED:
        return (
            f"its TLS certificate is not signed by a CA this client trusts ({said}); "
            "pass the CA certificate in connection_options={'ssl_ca_certs': path}"
        )
    if code in (_EXPIRED, _NOT_YET_VALID):
        return f"its TLS certificate is outside its validity period ({said}); renew it"
    return f"its TLS certificate failed verification ({said})"


def classify_error(exc: ResponseError) -> Failure:
    """An error reply: the node refusing the command (ACL, missing command) or another error."""
    text = str(exc)
    if isinstance(exc, NoPermissionError) or text.startswith(("NOPERM", "ERR unknown command")):
        return Failure.UNSUPPORTED
    # A command denied by ACL inside one of our scripts (Redis 6.2 wording; 7 says NOPERM).
    if "can't run this command" in text or "no permissions" in text.lower():
        return Failure.UNSUPPORTED
    return Failure.ERROR


def kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Make ``sock`` blocking, with its timeouts enforced by the kernel instead.

    A Python-level socket timeout costs a ``poll()`` before every send and every recv.
    The sync driver already ``select()``s before reading, so that poll is pure overhead
    on the hot path. ``SO_RCVTIMEO``/``SO_SNDTIMEO`` keep the safety net (a reply cut in
    half by a node freezing mid-write cannot hang us: the recv fails after ``seconds``,
    and redis-py reports it as a ConnectionError) at no per-call cost.
    """
    whole = int(seconds)
    timeval = struct.pack("ll", whole, int((seconds - whole) * 1_000_000) or 1)
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)

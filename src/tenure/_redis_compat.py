"""The few places where tenure depends on how redis-py (>= 5) is put together.

Kept in one module so that a change in redis-py breaks one file, and tests/integration
exercise every function here against the installed version.
"""

from __future__ import annotations

import inspect
import socket
import struct
from typing import Any

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.exceptions import NoPermissionError, ResponseError

from ._acl import denial
from ._core.quorum import Failure

__all__ = ["classify_error", "connection_kwargs", "kernel_timeouts"]


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


def connection_kwargs(node_timeout: float, *, asyncio: bool, unix: bool) -> dict[str, Any]:
    """Options for every connection tenure opens.

    redis-py's own retries are off: it would re-send ``SET NX`` after a timeout and stall
    for seconds, while tenure owns retries and time. Health checks are off for the same
    reason (they are a hidden round trip). The async driver reads replies in a background
    task, so it waits without a socket timeout and enforces deadlines itself.
    """
    retry_cls = redis.asyncio.retry.Retry if asyncio else redis.retry.Retry
    options: dict[str, Any] = {
        "socket_timeout": None if asyncio else node_timeout,
        "socket_connect_timeout": node_timeout,
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


def classify_error(exc: ResponseError) -> Failure:
    """An error reply: the node refusing the command (ACL, missing command) or another error."""
    text = str(exc)
    if isinstance(exc, NoPermissionError) or text.startswith(("NOPERM", "ERR unknown command")):
        return Failure.UNSUPPORTED
    # A command, key or channel refused by ACL inside one of our scripts: each Redis
    # version words it differently, and none of them starts the reply with NOPERM.
    if denial(text) is not None:
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

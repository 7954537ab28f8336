"""The gate: ASGI middleware that admits a write only with a current fencing token.

Part of :mod:`tenure.fencing.http` (its module docstring is the theory of operation).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from typing import Any

from tenure._errors import ConfigurationError

from ._tokenbook import GATE_TOKEN_LIMIT, TokenBook

# ASGI 3 callables, spelled as httpx's ASGITransport spells them so the two type-check.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# The methods a gate guards unless told otherwise; documented, and exported, by
# tenure.fencing.http.
GUARDED_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_DIGITS = re.compile(r"[0-9]+")
# RFC 9110 token characters: what a header name may be made of.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class _ClientGone(Exception):
    """The client disconnected before its request body arrived."""


class _Refusal(Exception):
    """A request the gate answers itself, with ``status`` and a JSON ``payload``."""

    def __init__(self, status: int, payload: dict[str, object]) -> None:
        super().__init__(status, payload)
        self.status = status
        self.payload = payload


@dataclass
class _Turn:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class _Turns:
    """One asyncio lock per resource, dropped again when nobody waits for it."""

    def __init__(self) -> None:
        self._turns: dict[str, _Turn] = {}

    @contextlib.asynccontextmanager
    async def take(self, resource: str) -> AsyncIterator[None]:
        turn = self._turns.setdefault(resource, _Turn())
        turn.users += 1
        try:
            async with turn.lock:
                yield
        finally:
            turn.users -= 1
            if turn.users == 0:
                del self._turns[resource]


class FencingGate:
    """ASGI middleware that refuses writes carrying a stale fencing token.

    For a request whose method is in ``methods``:

    - no token header: ``428 Precondition Required`` if ``require_token``, else passed on;
    - a token that is not a decimal integer in [0, 2**63), or a repeated header: ``400``;
    - a path that is the resource (no resource header, no ``resource`` callable) but not
      canonical (empty, ``.`` or ``..`` segments, a trailing ``/``): ``400``, since the
      store behind may serve it as another spelling of a path fenced under a newer token;
    - with ``max_body``, a body longer than it (declared in ``Content-Length``, or found
      so while reading it): ``413``;
    - a token smaller than the highest seen for the resource: ``409 Conflict`` with
      ``{"error": "stale fencing token", "resource": ..., "token": ..., "highest": ...}``;
    - otherwise the token is recorded and the request goes to ``app``, once no other
      request for the same resource is in the app (see the module docstring).

    All other requests, and non-HTTP scopes (lifespan, websocket), pass through untouched.

    The resource's turn is held until the app has answered. Without ``max_body`` the
    app reads the request body inside it, so a client that uploads slowly holds up every
    other writer of its resource for as long as its upload lasts. With ``max_body`` the
    gate reads the whole body first, outside the turn (a body over the bound is refused
    before anything is recorded, and a client that leaves mid-upload records nothing),
    and hands it to the app as one ``http.request`` message.

    Args:
        app: the ASGI application to protect.
        header: the request header carrying the token.
        resource_header: the request header naming the resource (the lock's name), or
            None to ignore it; it wins over ``resource`` and the path.
        resource: derives the resource from the ASGI scope when the header is absent;
            by default the request path (percent-decoded, without the query) is the
            resource.
        methods: the methods to guard (case-insensitive).
        require_token: refuse guarded requests that carry no token.
        tokens: the book of highest tokens; a fresh in-memory one by default. Share one
            book between gates only if they run in the same process.
        max_body: read the body of a request carrying a token, of at most this many
            bytes, before taking the resource's turn; None (the default) leaves the body
            to the app.

    Raises:
        ConfigurationError: a header name or method is not a valid HTTP token, or
            ``max_body`` is not None or an int >= 0.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        header: str = "Fencing-Token",
        resource_header: str | None = "Fencing-Resource",
        resource: Callable[[Scope], str] | None = None,
        methods: frozenset[str] = GUARDED_METHODS,
        require_token: bool = True,
        tokens: TokenBook | None = None,
        max_body: int | None = None,
    ) -> None:
        self.app = app
        self.header = _check_header_name("header", header)
        self.resource_header = (
            None
            if resource_header is None
            else _check_header_name("resource_header", resource_header)
        )
        self.resource = resource
        self.methods = _check_methods(methods)
        self.require_token = require_token
        self.tokens = TokenBook() if tokens is None else tokens
        self.max_body = None if max_body is None else check_max_body(max_body)
        self._turns = _Turns()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"].upper() not in self.methods:
            await self.app(scope, receive, send)
            return
        try:
            token = self._token(scope)
            if token is None:  # no token, and none required
                await self.app(scope, receive, send)
                return
            resource = self._resource(scope)
            if self.max_body is not None:
                # Read before the turn: a slow upload then holds up no other writer, and
                # one that is too big, or never ends, is dropped before it is admitted.
                body = await read_body(scope, receive, self.max_body)
                receive = _replay(body, receive)
            await self._fenced(resource, token, scope, receive, send)
        except _Refusal as refusal:
            await _send_json(send, refusal.status, refusal.payload)
        except _ClientGone:
            pass  # nobody to answer; nothing was recorded

    async def _fenced(
        self, resource: str, token: int, scope: Scope, receive: Receive, send: Send
    ) -> None:
        async with self._turns.take(resource):
            highest = await self._admit(resource, token)
            if highest is None:
                await self.app(scope, receive, send)
                return
        # Answered outside the turn: a refused writer need not hold up the next one.
        raise _Refusal(
            409,
            {
                "error": "stale fencing token",
                "resource": resource,
                "token": token,
                "highest": highest,
            },
        )

    async def _admit(self, resource: str, token: int) -> int | None:
        try:
            if self.tokens.path is None:
                return self.tokens.admit(resource, token)
            # Persisting fsyncs a file; keep that off the event loop. The turn is held,
            # so this resource's order is unaffected.
            return await asyncio.to_thread(self.tokens.admit, resource, token)
        except OSError as exc:
            # Fail closed: a token that could not be recorded is not admitted.
            raise _Refusal(
                503, {"error": "fencing gate cannot record the token", "detail": str(exc)}
            ) from exc

    def _token(self, scope: Scope) -> int | None:
        values = _header_values(scope, self.header)
        if not values:
            if self.require_token:
                raise _Refusal(428, {"error": "fencing token required", "header": self.header})
            return None
        return _parse_token(self.header, values)

    def _resource(self, scope: Scope) -> str:
        if self.resource_header is not None:
            values = _header_values(scope, self.resource_header)
            if values:
                return _parse_resource(self.resource_header, values)
        if self.resource is not None:
            resource: object = self.resource(scope)
            if not isinstance(resource, str):
                # A setup error, not the request's: fail closed, and say what to fix.
                # (An int, say, would be recorded in a persisted book as a string and
                # compared as an int until a restart.)
                raise _Refusal(
                    500,
                    {
                        "error": "fencing gate misconfigured",
                        "detail": f"resource() returned {resource!r}, not a str: have it "
                        "return the resource's name as text",
                    },
                )
            return resource
        return self._path_resource(scope["path"])

    def _path_resource(self, path: str) -> str:
        # The path is the resource only in the spelling the gate receives, and servers
        # serve one object under several ("//a", "/a/", "/./a" and "/b/../a" are often
        # "/a"): a stale writer using a spelling no newer token was admitted under would
        # get in. So a path that is the resource must be in the one spelling every
        # server reads alike. (The path is percent-decoded already: "/%2E/a" is "/./a".)
        canonical = _canonical_path(path)
        if path == canonical:
            return path
        named = (
            f"name the resource in the {self.resource_header} header"
            if self.resource_header is not None
            else "derive the resource with a resource callable"
        )
        raise _Refusal(
            400,
            {
                "error": "request path not in canonical form",
                "path": path,
                "detail": "a path that names the fenced resource may not hold empty, '.' "
                f"or '..' segments or end in '/': send {canonical!r}, or, if the store "
                f"tells such paths apart, {named}",
            },
        )


def check_max_body(max_body: object) -> int:
    # bool is an int subclass; max_body=True is a bug, not a 1-byte bound.
    if isinstance(max_body, bool) or not isinstance(max_body, int) or max_body < 0:
        raise ConfigurationError(
            "max_body",
            f"must be a number of bytes, an int >= 0, got {max_body!r}: pass the largest "
            "request body the store should receive, e.g. 512 * 2**20",
        )
    return max_body


async def read_body(scope: Scope, receive: Receive, max_body: int) -> bytes:
    """The request's whole body, refused with 413 past ``max_body`` bytes.

    Raises:
        _Refusal: 413, the body is declared, or found while reading, to be too large.
        _ClientGone: the client disconnected before the body ended.
    """
    # A declared length is refused before any of the body is read (and, with "Expect:
    # 100-continue", before the client sends it). The server has checked the header's
    # form; one it passed on that is not digits is left to the read below.
    for declared in _header_values(scope, "content-length"):
        text = declared.strip()
        if text.isdigit() and int(text) > max_body:
            raise _Refusal(413, _too_large(max_body, f"Content-Length is {int(text)}"))
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > max_body:
            raise _Refusal(413, _too_large(max_body, f"the body ran past {max_body} bytes"))
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(max_body: int, found: str) -> dict[str, object]:
    return {
        "error": "request body too large",
        "max_body": max_body,
        "detail": f"{found}; send at most {max_body} bytes",
    }


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that gives ``body`` as one message, then defers to ``receive`` (so the
    app still learns of a disconnect)."""
    pending = True

    async def replayed() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def _canonical_path(path: str) -> str:
    """``path`` with empty and '.' segments dropped, '..' resolved, no trailing '/'."""
    segments: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if segments:
                segments.pop()
        elif segment not in ("", "."):
            segments.append(segment)
    return "/" + "/".join(segments)


def _check_header_name(parameter: str, name: str) -> str:
    if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
        raise ConfigurationError(parameter, f"must be an HTTP header name, got {name!r}")
    return name


def _check_methods(methods: Iterable[str]) -> frozenset[str]:
    if isinstance(methods, str) or not isinstance(methods, Iterable):
        raise ConfigurationError(
            "methods", f"must be a set of method names, e.g. {{'PUT', 'POST'}}, got {methods!r}"
        )
    normalised = frozenset(_check_header_name("methods", m).upper() for m in methods)
    if not normalised:
        raise ConfigurationError("methods", "must name at least one method")
    return normalised


def _header_values(scope: Scope, name: str) -> list[bytes]:
    # ASGI servers lower-case header names; compare case-insensitively all the same.
    wanted = name.lower().encode("ascii")
    return [value for key, value in scope["headers"] if key.lower() == wanted]


def _parse_token(header: str, values: list[bytes]) -> int:
    # Two tokens on one request is ambiguous (a client bug, or a proxy appending one);
    # picking either could admit a write that should have been refused.
    if len(values) != 1:
        raise _Refusal(400, _malformed(header, "the header must appear exactly once"))
    # Strictly ASCII digits: int() would also take "+5", "1_000", " 7" and other scripts'
    # digits, which other fenced stores would read differently or not at all.
    text = values[0].decode("latin-1").strip(" \t")
    if not _DIGITS.fullmatch(text):
        raise _Refusal(400, _malformed(header, "must be a non-negative decimal integer"))
    # Past 19 significant digits a token is out of range; don't make int() chew on it.
    digits = text.lstrip("0") or "0"
    token = int(digits) if len(digits) <= 19 else GATE_TOKEN_LIMIT
    if token >= GATE_TOKEN_LIMIT:
        raise _Refusal(400, _malformed(header, "must be less than 2**63"))
    return token


def _parse_resource(header: str, values: list[bytes]) -> str:
    if len(values) != 1:
        raise _Refusal(400, _malformed(header, "the header must appear exactly once"))
    try:
        resource = values[0].decode("utf-8").strip(" \t")
    except UnicodeDecodeError:
        raise _Refusal(400, _malformed(header, "must be UTF-8")) from None
    if not resource:
        raise _Refusal(400, _malformed(header, "must not be empty"))
    return resource


def _malformed(header: str, detail: str) -> dict[str, object]:
    return {"error": f"malformed {header} header", "header": header, "detail": detail}


async def _send_json(send: Send, status: int, payload: dict[str, object]) -> None:
    body = json.dumps(payload).encode("utf-8")
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

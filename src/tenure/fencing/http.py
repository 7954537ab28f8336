"""An HTTP gate that enforces fencing tokens for stores that cannot check them themselves.

Theory of operation
-------------------

A fencing token is an int minted with every lock acquisition, strictly increasing in the
order the locks for one resource were granted. A store that remembers the highest token
it has seen per resource and refuses writes carrying a smaller one makes a superseded
holder harmless, however long it paused. Many stores (an object store, a legacy
HTTP service) cannot do that, so :class:`FencingGate` does it in front of them::

    A (token 5)  acquires ... GC pause / lease expires .............. resumes ─ PUT t=5 ─▶ 409
    B (token 6)                           acquires ─ PUT t=6 ─▶ admitted, book[r] = 6
    store                                                    ◀── B's write   (A's never arrives)

For a request with a guarded method the gate reads the token header and the resource
(the ``Fencing-Resource`` header, else a callable on the ASGI scope, else the path), then
asks its :class:`TokenBook`: a token >= the highest seen for that resource is admitted
and becomes the highest (equal means the same lease writing again); a smaller one is
answered ``409 Conflict`` and never reaches the app. Other methods pass through.

Ordering. Checking tokens in order is not enough: two admitted requests (5, then 6) could
still overtake each other on their way to the store, and the store would apply 6 and then
5. So the gate serialises the requests *for one resource*: each waits for its turn, is
checked, and holds the turn until the app has answered. The store therefore receives one
resource's writes one at a time, with tokens that never decrease. Writes of a resource by
its rightful holder are sequential anyway; only the fault case queues. A hung app holds
its resource's turn for as long as it hangs, so bound it (FencingProxy has a timeout).

What the gate cannot do. The token is recorded as soon as the gate admits the request,
before the app runs. If the app then fails halfway, the gate cannot undo a partial write;
it only orders writers. A retry by the same holder with the same token is still
admitted, and every older holder stays locked out. The gate protects against slow or
paused holders, not malicious ones: a client that lies about its token or (with the
resource header) names another resource is not stopped, which is why
``resource_header=None`` exists.

Assumptions. One gate process owns a set of resources: every writer of a resource goes
through it, and it runs in one process with one event loop (an ASGI server with several
worker processes gives each its own book and breaks fencing). The book keeps one int per
resource ever seen and never forgets one, since forgetting would let a stale writer in;
its memory is not bounded. Without ``path`` it lives in memory and a restarted gate
starts empty, admitting any token once; with ``path`` every new highest token is written
to a JSON file (temp file, fsync, ``os.replace``) *before* the request is admitted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from tenure._errors import ConfigurationError

if TYPE_CHECKING:
    import httpx

__all__ = [
    "GATE_TOKEN_LIMIT",
    "GUARDED_METHODS",
    "FencingGate",
    "FencingProxy",
    "TokenBook",
]

# ASGI 3 callables, spelled as httpx's ASGITransport spells them so the two type-check.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Tokens must be below this. They are non-negative and fit a signed 64-bit integer, like
#: Redis ``INCR`` counters and SQL ``BIGINT`` columns. (The Redis fenced store's own
#: limit, ``tenure.fencing.MAX_TOKEN``, is lower because Lua numbers are doubles.)
GATE_TOKEN_LIMIT = 2**63

#: The methods a gate guards unless told otherwise (the ones that write).
GUARDED_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_BOOK_VERSION = 1
_DIGITS = re.compile(r"[0-9]+")
# RFC 9110 token characters: what a header name may be made of.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# RFC 9110 section 7.6.1, plus Proxy-Connection which old clients still send.
_HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
# Recomputed by the proxy for the upstream: Host names the upstream, the body is buffered
# (so its length is known and there is nothing to wait for with 100-continue).
_REQUEST_ONLY = frozenset({b"host", b"content-length", b"expect"})


# ---------------------------------------------------------------------------------------
# The token book


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
        ConfigurationError: ``path`` exists but is not a token book.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, fsync: bool = True) -> None:
        self._lock = threading.Lock()
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
            ConfigurationError: ``token`` is not an int in range.
            OSError: the book could not be persisted; nothing was recorded then.
        """
        _check_token(token)
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


# ---------------------------------------------------------------------------------------
# The gate


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
    - a token smaller than the highest seen for the resource: ``409 Conflict`` with
      ``{"error": "stale fencing token", "resource": ..., "token": ..., "highest": ...}``;
    - otherwise the token is recorded and the request goes to ``app``, once no other
      request for the same resource is in the app (see the module docstring).

    All other requests, and non-HTTP scopes (lifespan, websocket), pass through untouched.

    Args:
        app: the ASGI application to protect.
        header: the request header carrying the token.
        resource_header: the request header naming the resource (the lock's name), or
            None to ignore it; it wins over ``resource`` and the path.
        resource: derives the resource from the ASGI scope when the header is absent;
            by default the request path is the resource.
        methods: the methods to guard (case-insensitive).
        require_token: refuse guarded requests that carry no token.
        tokens: the book of highest tokens; a fresh in-memory one by default. Share one
            book between gates only if they run in the same process.

    Raises:
        ConfigurationError: a header name or method is not a valid HTTP token.
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
            await self._fenced(self._resource(scope), token, scope, receive, send)
        except _Refusal as refusal:
            await _send_json(send, refusal.status, refusal.payload)

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
            return self.resource(scope)
        path: str = scope["path"]
        return path


def _check_header_name(parameter: str, name: str) -> str:
    if not isinstance(name, str) or not _HEADER_NAME.fullmatch(name):
        raise ConfigurationError(parameter, f"must be an HTTP header name, got {name!r}")
    return name


def _check_methods(methods: Iterable[str]) -> frozenset[str]:
    if isinstance(methods, str):
        raise ConfigurationError("methods", f"must be a set of method names, got {methods!r}")
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


# ---------------------------------------------------------------------------------------
# The reverse proxy


class FencingProxy(FencingGate):
    """A :class:`FencingGate` whose app forwards admitted requests to an upstream server.

    Run it under any ASGI server (one worker process). Method, path, query, headers
    (minus hop-by-hop ones and Host) and body are forwarded; the upstream's status,
    headers and body come back unchanged. Request bodies are buffered in memory;
    response bodies are streamed. An upstream that cannot be reached, or fails at the
    HTTP level, is answered ``502``, and a timeout ``504``; in both cases the token stays
    recorded (see the module docstring).

    Args:
        upstream: base URL of the store, ``http://host:port[/prefix]``; request paths
            are appended to it.
        client: an ``httpx.AsyncClient`` to forward with; the caller keeps ownership.
            By default the proxy makes one and closes it in ``aclose()`` or at ASGI
            lifespan shutdown.
        timeout: seconds for each forwarded request when the proxy makes the client.
        header, resource_header, resource, methods, require_token, tokens: as for
            :class:`FencingGate`.

    Raises:
        ImportError: httpx is not installed (``pip install httpx``).
        ConfigurationError: ``upstream`` is not an http(s) URL without query or fragment.
    """

    def __init__(
        self,
        upstream: str,
        *,
        client: httpx.AsyncClient | None = None,
        timeout: float = 10.0,
        header: str = "Fencing-Token",
        resource_header: str | None = "Fencing-Resource",
        resource: Callable[[Scope], str] | None = None,
        methods: frozenset[str] = GUARDED_METHODS,
        require_token: bool = True,
        tokens: TokenBook | None = None,
    ) -> None:
        self.forwarder = _Forwarder(upstream, client, timeout)
        super().__init__(
            self.forwarder,
            header=header,
            resource_header=resource_header,
            resource=resource,
            methods=methods,
            require_token=require_token,
            tokens=tokens,
        )

    async def aclose(self) -> None:
        """Close the HTTP client, if the proxy made it."""
        await self.forwarder.aclose()

    async def __aenter__(self) -> FencingProxy:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _require_httpx() -> None:
    try:
        import httpx  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            "FencingProxy forwards requests with httpx, which is not installed: pip install httpx",
            name="httpx",
        ) from exc


class _ClientGone(Exception):
    """The client disconnected before its request body arrived."""


class _Forwarder:
    """The ASGI app behind a FencingProxy's gate: relays a request to the upstream."""

    def __init__(self, upstream: str, client: httpx.AsyncClient | None, timeout: float) -> None:
        _require_httpx()
        import httpx

        self.upstream = _check_upstream(upstream)
        self._owns_client = client is None
        self._client = httpx.AsyncClient(timeout=timeout) if client is None else client

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            with contextlib.suppress(_ClientGone):
                await self._forward(scope, receive, send)
        else:
            raise RuntimeError(f"FencingProxy does not handle {scope['type']!r} connections")

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _forward(self, scope: Scope, receive: Receive, send: Send) -> None:
        import httpx

        request = httpx.Request(
            scope["method"],
            self._url(scope),
            headers=_forwardable(scope["headers"], drop=_REQUEST_ONLY),
            content=await _read_body(receive),
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TimeoutException as exc:
            await _send_json(send, 504, {"error": "upstream timed out", "detail": str(exc)})
            return
        except httpx.TransportError as exc:
            # Refused connection, reset, or a request h11 would not send.
            detail = f"{type(exc).__name__}: {exc}"
            await _send_json(send, 502, {"error": "upstream request failed", "detail": detail})
            return
        try:
            await _relay(response, send)
        finally:
            await response.aclose()

    def _url(self, scope: Scope) -> httpx.URL:
        raw_path: bytes | None = scope.get("raw_path")
        path = raw_path if raw_path else quote(scope["path"]).encode("ascii")
        query: bytes = scope.get("query_string", b"")
        target = self.upstream.raw_path.rstrip(b"/") + path + (b"?" + query if query else b"")
        return self.upstream.copy_with(raw_path=target)


def _check_upstream(upstream: str) -> httpx.URL:
    import httpx

    try:
        url = httpx.URL(upstream)
    except (httpx.InvalidURL, TypeError) as exc:
        raise ConfigurationError("upstream", f"not a URL: {upstream!r} ({exc})") from exc
    if url.scheme not in ("http", "https") or not url.host or url.query or url.fragment:
        raise ConfigurationError(
            "upstream", f"must be http(s)://host[:port][/prefix] with no query, got {upstream!r}"
        )
    return url


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _relay(response: httpx.Response, send: Send) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": _forwardable(response.headers.raw),
        }
    )
    # Raw bytes: the body keeps its Content-Encoding and Content-Length, so the client
    # receives exactly what the upstream sent.
    async for chunk in response.aiter_raw():
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _forwardable(
    headers: Iterable[tuple[bytes, bytes]], *, drop: frozenset[bytes] = frozenset()
) -> list[tuple[bytes, bytes]]:
    """The end-to-end headers: hop-by-hop ones, and those Connection names, removed."""
    pairs = [(name.lower(), value) for name, value in headers]
    named = {
        option.strip().lower().encode("latin-1")
        for name, value in pairs
        if name == b"connection"
        for option in value.decode("latin-1").split(",")
    }
    excluded = _HOP_BY_HOP | named | drop
    return [(name, value) for name, value in pairs if name not in excluded]

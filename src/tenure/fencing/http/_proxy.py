"""The reverse proxy: a fencing gate in front of an upstream HTTP server (needs httpx).

Part of :mod:`tenure.fencing.http` (its module docstring is the theory of operation).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import quote

from tenure._core.numbers import is_finite
from tenure._errors import ConfigurationError, TenureError

from ._gate import (
    GUARDED_METHODS,
    FencingGate,
    Message,
    Receive,
    Scope,
    Send,
    _ClientGone,
    _Refusal,
    _send_json,
    check_max_body,
    read_body,
)
from ._tokenbook import TokenBook

if TYPE_CHECKING:
    import httpx

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

# The default bound on a request body, which the proxy holds in memory whole.
_MAX_BODY = 512 * 2**20
# The default bound, in seconds, on the time an answer's relay may spend waiting for its
# client. A client reading at any usable pace takes a fenced write's answer (usually a
# few bytes to a few KiB) in far less; one that has not taken it in a minute has stopped
# reading, and every other writer of the resource has waited that minute already.
_RELAY_TIMEOUT = 60.0


class FencingProxy(FencingGate):
    """A :class:`FencingGate` whose app forwards admitted requests to an upstream server.

    Run it under any ASGI server (one worker process). Method, path, query, headers
    (minus hop-by-hop ones and Host) and body are forwarded; the upstream's status,
    headers and body come back unchanged. Request bodies are read whole into memory,
    up to ``max_body`` bytes, before the gate takes the resource's turn: a slow upload
    holds up no other writer, and a body over the bound is answered ``413`` (as soon as
    ``Content-Length`` declares it, or as the body runs past it), with nothing recorded
    and nothing forwarded; a client that leaves mid-upload records nothing either.
    Response bodies are streamed, and a fenced request keeps its resource's turn until
    its answer's body has been relayed whole: the upstream's status and headers do not
    say the write is applied (a store may send them first and apply it while its body
    is still coming), so a client that reads a large answer slowly holds up the
    resource's other writers for as long as it does, up to ``relay_timeout`` seconds of
    waiting for the client in all. Past that the proxy stops relaying, still reads the
    upstream's answer to its end (only that end says the store is done with the
    write), closes it, hands the turn on and raises :class:`RelayTimeout` to the ASGI
    server, which closes the client's connection; the token stays recorded. An
    upstream that cannot be reached, or fails at the HTTP level before its answer's
    body begins, is answered ``502``, and a timeout ``504``; in both cases the token
    stays recorded (see the module docstring). One that fails later, once its status
    was relayed, raises :class:`UpstreamInterrupted` to the ASGI server, which closes
    the client's connection: the client sees the answer cut short. A request target
    that cannot be made into an upstream URL (an unescaped ``#``, say), or that holds a
    ``.`` or ``..`` segment (which would be resolved, so the upstream would write
    another path than the one fenced), is answered ``400`` before the gate sees the
    request, so its token is not recorded.

    Args:
        upstream: base URL of the store, ``http://host:port[/prefix]``; request paths
            are appended to it.
        client: an ``httpx.AsyncClient`` to forward with; the caller keeps ownership.
            By default the proxy makes one and closes it in ``aclose()`` or at ASGI
            lifespan shutdown.
        timeout: seconds for each forwarded request when the proxy makes the client.
        max_body: the largest request body, in bytes, the proxy reads (and holds in
            memory) for one request, of any method; 512 MiB by default.
        relay_timeout: seconds one answer's relay may spend, in all, waiting for the
            client to take its head and body (the ASGI ``send`` blocks while the client
            does not read); 60 by default, None for no bound. Only the client's pace
            counts: the upstream's is bounded by ``timeout`` (or the client's own).
        header, resource_header, resource, methods, require_token, tokens: as for
            :class:`FencingGate`.

    Raises:
        ImportError: httpx is not installed (``pip install httpx``).
        ConfigurationError: ``upstream`` is not an http(s) URL without query or fragment,
            ``timeout`` not a finite number > 0, ``relay_timeout`` neither that nor None,
            or ``max_body`` not an int >= 0.
    """

    def __init__(
        self,
        upstream: str,
        *,
        client: httpx.AsyncClient | None = None,
        timeout: float = 10.0,
        max_body: int = _MAX_BODY,
        relay_timeout: float | None = _RELAY_TIMEOUT,
        header: str = "Fencing-Token",
        resource_header: str | None = "Fencing-Resource",
        resource: Callable[[Scope], str] | None = None,
        methods: frozenset[str] = GUARDED_METHODS,
        require_token: bool = True,
        tokens: TokenBook | None = None,
    ) -> None:
        self.forwarder = _Forwarder(
            upstream, client, timeout, check_max_body(max_body), relay_timeout
        )
        super().__init__(
            self.forwarder,
            header=header,
            resource_header=resource_header,
            resource=resource,
            methods=methods,
            require_token=require_token,
            tokens=tokens,
            max_body=max_body,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The target is checked before the gate, not when forwarding: the gate records a
        # guarded request's token as it admits it, before the app runs, and a recorded
        # token cannot be taken back (other requests may already have been refused by
        # it). So a request that could never be forwarded is answered here, and leaves
        # the book as it found it.
        if scope["type"] == "http":
            try:
                self.forwarder.url(scope)
            except _Unforwardable as exc:
                await _send_unforwardable(send, exc)
                return
        await super().__call__(scope, receive, send)

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


class UpstreamInterrupted(TenureError, ConnectionError):
    """A :class:`FencingProxy`'s upstream broke off its answer after the proxy had relayed
    its status (a reset, a closed connection, a timeout mid-body).

    Raised out of the proxy to the ASGI server, which then closes the client's
    connection: the client sees the answer cut short (and fails on it), never as a whole
    answer. The upstream's error is the ``__cause__``. An upstream that fails before its
    body begins is answered ``502`` (``504`` for a timeout) instead.
    """


class RelayTimeout(TenureError, TimeoutError):
    """A :class:`FencingProxy`'s client did not take an answer within the proxy's
    ``relay_timeout`` (it stopped reading, so the ASGI ``send`` waited).

    Raised out of the proxy to the ASGI server, which then closes the client's
    connection, once the proxy has read the upstream's answer to its end and handed the
    resource's turn on: a client that does not read holds up the resource's other
    writers for that long at most. The write reached the store, so its token stays
    recorded; its holder may retry with the same token.
    """


class _Unforwardable(Exception):
    """The request target cannot be made into an upstream URL; the message says why and
    what to send instead (it is the 400 answer's detail)."""


class _Forwarder:
    """The ASGI app behind a FencingProxy's gate: relays a request to the upstream."""

    def __init__(
        self,
        upstream: str,
        client: httpx.AsyncClient | None,
        timeout: float,
        max_body: int,
        relay_timeout: float | None = _RELAY_TIMEOUT,
    ) -> None:
        _require_httpx()
        import httpx

        self.upstream = _check_upstream(upstream)
        if not (is_finite(timeout) and timeout > 0):
            # httpx takes any value, and then every request fails (nan raises, 0 and
            # less time out at once), each after its token was recorded.
            raise ConfigurationError(
                "timeout", f"must be a finite number of seconds > 0, got {timeout!r}"
            )
        if relay_timeout is not None and not (is_finite(relay_timeout) and relay_timeout > 0):
            # 0 or less would cut every answer off; nan would never compare as spent.
            raise ConfigurationError(
                "relay_timeout",
                f"must be a finite number of seconds > 0, or None for no bound, got "
                f"{relay_timeout!r}",
            )
        self.relay_timeout = relay_timeout
        self.max_body = max_body
        self._owns_client = client is None
        self._client = httpx.AsyncClient(timeout=timeout) if client is None else client
        self._timeout_said = f"{timeout:g} s" if client is None else "the client's timeout"

    async def aclose(self) -> None:
        if self._owns_client:
            await self._client.aclose()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "http":
            try:
                await self._forward(scope, receive, send)
            except _Refusal as refusal:  # a body over max_body
                await _send_json(send, refusal.status, refusal.payload)
            except _ClientGone:
                pass
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

        try:
            url = self.url(scope)
        except _Unforwardable as exc:
            # Only reached when the forwarder runs behind another gate than its proxy's,
            # which checks the target first; answered the same way.
            await _send_unforwardable(send, exc)
            return
        # A fenced request's body was read (and bounded) by the gate before its turn,
        # and comes as one message; any other request's is bounded here.
        request = httpx.Request(
            scope["method"],
            url,
            headers=_forwardable(scope["headers"], drop=_REQUEST_ONLY),
            content=await read_body(scope, receive, self.max_body),
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.RequestError as exc:
            # Refused connection, reset, a timeout, a request h11 would not send, or (a
            # caller's client that follows redirects) too many redirects.
            await self._send_failure(send, exc)
            return
        try:
            body = response.aiter_raw()
            try:
                # The first chunk is awaited before the status is relayed: an upstream
                # that breaks off before its body can still be answered 502 (or 504).
                first = await anext(body, b"")
            except httpx.RequestError as exc:
                await self._send_failure(send, exc)
                return
            await _relay(response, first, body, _ClientWait(send, self.relay_timeout))
        finally:
            await response.aclose()

    async def _send_failure(self, send: Send, exc: httpx.RequestError) -> None:
        """Answer the client for an upstream that failed before any of its body came."""
        import httpx

        if isinstance(exc, httpx.TimeoutException):
            # httpx's timeouts mostly carry no message: say which ran out, and after what.
            detail = f"{type(exc).__name__}: {str(exc) or 'no answer'} within {self._timeout_said}"
            await _send_json(send, 504, {"error": "upstream timed out", "detail": detail})
        else:
            detail = f"{type(exc).__name__}: {exc}"
            await _send_json(send, 502, {"error": "upstream request failed", "detail": detail})

    def url(self, scope: Scope) -> httpx.URL:
        """The upstream URL for an HTTP scope; raises _Unforwardable if there is none."""
        import httpx

        raw_path: bytes | None = scope.get("raw_path")
        segments = str(scope["path"]).split("/")
        if "." in segments or ".." in segments:
            # httpx resolves dot segments as it builds the URL ("/a/./b" is sent as
            # "/a/b", and "/.." climbs out of the upstream's prefix), and servers
            # resolve them, percent-encoded or not: the gate would fence one resource
            # (the path as received) while another is written, so a stale writer
            # spelling the path differently would be admitted.
            shown = raw_path.decode("latin-1") if raw_path else scope["path"]
            raise _Unforwardable(
                f"{shown!r} holds a '.' or '..' segment, which would be resolved to "
                "another path than the one fenced; send the path with them resolved"
            )
        path = raw_path if raw_path else quote(scope["path"]).encode("ascii")
        query: bytes = scope.get("query_string", b"")
        target = self.upstream.raw_path.rstrip(b"/") + path + (b"?" + query if query else b"")
        # h11 accepts any visible ASCII in a target ("#" included) and other servers may
        # pass on non-ASCII bytes; httpx refuses both.
        try:
            return self.upstream.copy_with(raw_path=target)
        except (httpx.InvalidURL, UnicodeDecodeError) as exc:
            shown = (path + (b"?" + query if query else b"")).decode("latin-1")
            raise _Unforwardable(
                f"{shown!r}: {exc}; percent-encode '#' and non-ASCII characters in the path "
                "and query"
            ) from exc


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


async def _send_unforwardable(send: Send, exc: _Unforwardable) -> None:
    detail = str(exc)
    await _send_json(send, 400, {"error": "request target cannot be forwarded", "detail": detail})


class _ClientWait:
    """An ASGI ``send`` that may wait for the client ``bound`` seconds in all (None: no
    bound) over every message it sends; past that it raises asyncio.TimeoutError."""

    def __init__(self, send: Send, bound: float | None) -> None:
        self._send = send
        self.bound = bound
        self._left = bound

    async def __call__(self, message: Message) -> None:
        if self._left is None:
            await self._send(message)
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            # A timer on this task: wait_for would make a task per message.
            async with asyncio.timeout(max(self._left, 0.0)):
                await self._send(message)
        finally:
            self._left -= loop.time() - started


async def _relay(
    response: httpx.Response, first: bytes, rest: AsyncIterator[bytes], send: _ClientWait
) -> None:
    try:
        await _relay_within(response, first, rest, send)
    except TimeoutError as exc:
        # The client stopped taking the answer. The turn is still not let go before the
        # store's answer ends (its head does not say the write is applied), so the rest
        # is read and dropped; its pace is the upstream's, bounded by httpx's timeouts.
        import httpx

        try:
            async for _ in rest:
                pass
        except httpx.RequestError:
            pass  # the upstream's answer ended all the same
        request = response.request
        raise RelayTimeout(
            f"FencingProxy: the client did not take the answer to {request.method} "
            f"{request.url} ({response.status_code}) within relay_timeout={send.bound:g} s "
            "of waiting for it; the client's connection is closed so that it sees the "
            "answer cut short, and the resource's turn was handed on once the upstream's "
            "answer had ended. The write reached the store: the token stays recorded, and "
            "its holder may retry with the same token. Have clients read fenced writes' "
            "answers promptly, or raise relay_timeout"
        ) from exc


async def _relay_within(
    response: httpx.Response, first: bytes, rest: AsyncIterator[bytes], send: Send
) -> None:
    import httpx

    await send(
        {
            "type": "http.response.start",
            "status": response.status_code,
            "headers": _forwardable(response.headers.raw),
        }
    )
    # Raw bytes: the body keeps its Content-Encoding and Content-Length, so the client
    # receives exactly what the upstream sent.
    relayed = 0
    try:
        if first:
            await send({"type": "http.response.body", "body": first, "more_body": True})
            relayed += len(first)
        async for chunk in rest:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            relayed += len(chunk)
    except httpx.RequestError as exc:
        # The status is out: the only way left to tell the client the answer is cut
        # short is to end its connection, which the ASGI server does for an error out of
        # the app. Ending the body instead would pass a truncated answer off as whole.
        request = response.request
        raise UpstreamInterrupted(
            f"FencingProxy: the upstream broke off its answer to {request.method} "
            f"{request.url} ({response.status_code}) after {relayed} bytes of the body "
            f"({type(exc).__name__}: {exc}); the client's connection is closed so that "
            "it sees the answer cut short. The write may have been applied: the token "
            "stays recorded, and its holder may retry with the same token"
        ) from exc
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

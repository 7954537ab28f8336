"""The HTTP fencing gate, in front of a real (loopback) HTTP store that checks nothing.

The store is a ``ThreadingHTTPServer`` on 127.0.0.1 that applies every write it receives
and records them in arrival order: a stand-in for a store that cannot check tokens. The
gate and proxy run in-process, driven through ``httpx.ASGITransport``; the proxy then
talks real HTTP to the store.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from tenure._errors import ConfigurationError
from tenure.fencing.http import (
    GATE_TOKEN_LIMIT,
    FencingGate,
    FencingProxy,
    Message,
    Receive,
    RelayTimeout,
    Scope,
    Send,
    TokenBook,
    UpstreamInterrupted,
)

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


# ---------------------------------------------------------------------------------------
# The store that cannot check tokens


@dataclass(frozen=True)
class Write:
    method: str
    path: str
    token: int | None
    body: bytes


class Store:
    """Records every write in arrival order; GET returns a path's last written body."""

    def __init__(self, *, jitter: float = 0.0) -> None:
        self.writes: list[Write] = []
        self.values: dict[str, bytes] = {}
        self.jitter = jitter
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        # A short poll interval keeps shutdown() (and so every test's teardown) quick.
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def tokens(self) -> list[int | None]:
        with self._lock:
            return [write.token for write in self.writes]

    def apply(self, write: Write) -> None:
        if self.jitter:
            # Widens the window in which two forwarded writes could overtake each other.
            time.sleep(random.uniform(0, self.jitter))
        with self._lock:
            self.writes.append(write)
            if write.method == "DELETE":
                self.values.pop(write.path, None)
            else:
                self.values[write.path] = write.body

    def __enter__(self) -> Store:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _handler_for(store: Store) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.partition("?")[0]
            with store._lock:
                value = store.values.get(path)
            if value is None:
                self._reply(404, b"")
            else:
                self._reply(200, value)

        def do_PUT(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            if body == b"!503":  # a store that fails a write without applying it
                self._reply(503, b"overloaded")
                return
            raw_token = self.headers.get("Fencing-Token")
            token = None if raw_token is None else int(raw_token)
            store.apply(Write(self.command, self.path.partition("?")[0], token, body))
            # Echo what arrived, so tests can see what the proxy forwarded.
            echo = {
                "method": self.command,
                "target": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body.decode(),
            }
            self._reply(201, json.dumps(echo).encode(), {"X-Store": "recorded"})

        do_POST = do_PUT
        do_PATCH = do_PUT
        do_DELETE = do_PUT

        def _reply(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output clean

    return Handler


@pytest.fixture
def store() -> Iterator[Store]:
    with Store() as server:
        yield server


@asynccontextmanager
async def through(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client whose requests go to the ASGI ``app`` in-process."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gate.invalid") as client:
        yield client


@asynccontextmanager
async def proxied(store: Store, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with FencingProxy(store.url, **options) as proxy, through(proxy) as client:
        yield client


def fenced(token: int | str) -> dict[str, str]:
    return {"Fencing-Token": str(token)}


class Recorder:
    """An in-process ASGI app that answers 200 and remembers each request's method."""

    def __init__(self, *, fail_first: int = 0) -> None:
        self.seen: list[str] = []
        self.fail_first = fail_first

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.seen.append(scope["method"])
        if self.fail_first:
            self.fail_first -= 1
            raise RuntimeError("the store fell over mid-write")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


# ---------------------------------------------------------------------------------------
# Admission


def test_newer_and_equal_tokens_pass(store: Store) -> None:
    async def scenario() -> list[int]:
        async with proxied(store) as client:
            statuses = []
            for token in (3, 3, 7, GATE_TOKEN_LIMIT - 1):
                response = await client.put("/doc", content=b"v", headers=fenced(token))
                statuses.append(response.status_code)
            return statuses

    assert run(scenario()) == [201, 201, 201, 201]
    assert store.tokens() == [3, 3, 7, GATE_TOKEN_LIMIT - 1]


def test_older_token_is_refused_with_409_and_never_reaches_the_store(store: Store) -> None:
    async def scenario() -> httpx.Response:
        async with proxied(store) as client:
            await client.put("/doc", content=b"new", headers=fenced(7))
            return await client.put("/doc", content=b"old", headers=fenced(5))

    response = run(scenario())
    assert response.status_code == 409
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "error": "stale fencing token",
        "resource": "/doc",
        "token": 5,
        "highest": 7,
    }
    assert store.tokens() == [7]
    assert store.values == {"/doc": b"new"}


@pytest.mark.parametrize(
    "value",
    ["abc", "-1", "1.5", "", "  ", "+5", "1_000", "0x10", "5 6", "9223372036854775808", "9" * 80],
)
def test_malformed_token_is_400_naming_the_header(store: Store, value: str) -> None:
    async def scenario() -> httpx.Response:
        async with proxied(store) as client:
            return await client.put("/doc", headers=fenced(value))

    response = run(scenario())
    assert response.status_code == 400
    assert response.json()["header"] == "Fencing-Token"
    assert "Fencing-Token" in response.json()["error"]
    assert store.writes == []


def test_repeated_token_header_is_400(store: Store) -> None:
    async def scenario() -> httpx.Response:
        async with proxied(store) as client:
            headers = [("Fencing-Token", "5"), ("Fencing-Token", "9")]
            return await client.put("/doc", headers=headers)

    response = run(scenario())
    assert response.status_code == 400
    assert "exactly once" in response.json()["detail"]
    assert store.writes == []


def test_token_with_leading_zeros_is_read_as_decimal(store: Store) -> None:
    async def scenario() -> int:
        async with proxied(store) as client:
            await client.put("/doc", headers=fenced(11))
            response = await client.put("/doc", headers=fenced("0" * 90 + "12"))
            return response.status_code

    assert run(scenario()) == 201


def test_missing_token_is_428(store: Store) -> None:
    async def scenario() -> httpx.Response:
        async with proxied(store) as client:
            return await client.post("/doc", content=b"x")

    response = run(scenario())
    assert response.status_code == 428
    assert response.json() == {"error": "fencing token required", "header": "Fencing-Token"}
    assert store.writes == []


def test_missing_token_passes_through_when_not_required(store: Store) -> None:
    async def scenario() -> list[int]:
        async with proxied(store, require_token=False) as client:
            untokened = await client.post("/doc", content=b"x")
            await client.post("/doc", headers=fenced(4))
            stale = await client.post("/doc", headers=fenced(3))
            return [untokened.status_code, stale.status_code]

    # Not requiring a token does not stop checking the tokens that are sent.
    assert run(scenario()) == [201, 409]
    assert store.tokens() == [None, 4]


def test_get_passes_without_a_token(store: Store) -> None:
    async def scenario() -> httpx.Response:
        async with proxied(store) as client:
            await client.put("/doc", content=b"value", headers=fenced(1))
            return await client.get("/doc")

    response = run(scenario())
    assert response.status_code == 200
    assert response.content == b"value"


def test_unguarded_methods_are_not_even_parsed() -> None:
    app = Recorder()

    async def scenario() -> list[int]:
        async with through(FencingGate(app, methods=frozenset({"put"}))) as client:
            post = await client.post("/doc", headers=fenced("garbage"))
            put = await client.put("/doc")
            return [post.status_code, put.status_code]

    assert run(scenario()) == [200, 428]
    assert app.seen == ["POST"]


def test_resources_are_independent(store: Store) -> None:
    async def scenario() -> list[int]:
        async with proxied(store) as client:
            return [
                (await client.put(path, headers=fenced(token))).status_code
                for path, token in [("/a", 9), ("/b", 2), ("/a", 2), ("/b", 3), ("/a", 9)]
            ]

    assert run(scenario()) == [201, 201, 409, 201, 201]
    assert [(w.path, w.token) for w in store.writes] == [("/a", 9), ("/b", 2), ("/b", 3), ("/a", 9)]


def test_resource_header_groups_paths_under_one_lock(store: Store) -> None:
    # One lock guards an order and its lines: a stale write to any of them is refused.
    async def scenario() -> httpx.Response:
        async with proxied(store) as client:
            lock = {"Fencing-Resource": "order-17"}
            await client.put("/orders/17", headers={**fenced(6), **lock})
            return await client.put("/orders/17/lines/1", headers={**fenced(5), **lock})

    response = run(scenario())
    assert response.status_code == 409
    assert response.json()["resource"] == "order-17"


def test_resource_callable_is_used_when_the_header_is_absent() -> None:
    def by_tenant(scope: Scope) -> str:
        return str(scope["path"]).split("/")[1]

    gate = FencingGate(Recorder(), resource=by_tenant, resource_header=None)

    async def scenario() -> list[int]:
        async with through(gate) as client:
            first = await client.put("/acme/x", headers=fenced(8))
            # resource_header=None: a client cannot escape its resource by naming another.
            headers = {**fenced(7), "Fencing-Resource": "elsewhere"}
            second = await client.put("/acme/y", headers=headers)
            return [first.status_code, second.status_code]

    assert run(scenario()) == [200, 409]
    assert gate.tokens.highest("acme") == 8
    assert gate.tokens.highest("elsewhere") is None


def test_a_resource_callable_that_returns_no_str_fails_closed() -> None:
    # A setup error (an account id as an int): refused with what to fix, nothing
    # recorded; a persisted book would have keyed it as text, and refused every write of
    # it after a restart with a raw TypeError.
    gate = FencingGate(Recorder(), resource=lambda scope: 42, resource_header=None)  # type: ignore[arg-type, return-value]

    async def scenario() -> tuple[int, object]:
        async with through(gate) as client:
            response = await client.put("/acme/x", headers=fenced(8))
            return response.status_code, response.json()

    status, body = run(scenario())
    assert status == 500
    assert body == {
        "error": "fencing gate misconfigured",
        "detail": "resource() returned 42, not a str: have it return the resource's name as text",
    }
    assert gate.tokens.highest("42") is None


@pytest.mark.parametrize("timeout", [math.nan, 0, -1.0, "5", True, math.inf])
def test_proxy_timeout_must_be_a_number_of_seconds(timeout: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        FencingProxy("http://127.0.0.1:1", timeout=timeout)  # type: ignore[arg-type]
    assert info.value.parameter == "timeout"


def test_non_http_scopes_pass_through() -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    async def receive() -> Message:
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:
        pass

    run(FencingGate(app)({"type": "lifespan"}, receive, send))
    assert seen == ["lifespan"]


# ---------------------------------------------------------------------------------------
# Ordering under concurrency and failure


def test_concurrent_shuffled_tokens_reach_the_store_in_nondecreasing_order() -> None:
    rng = random.Random(11)
    tokens = [rng.randrange(1, 100) for _ in range(150)]

    async def scenario(store: Store) -> list[httpx.Response]:
        async with proxied(store) as client:
            return await asyncio.gather(
                *(client.put("/hot", content=b"%d" % t, headers=fenced(t)) for t in tokens)
            )

    with Store(jitter=0.004) as store:
        responses = run(scenario(store))
        accepted = [token for token in store.tokens() if token is not None]

    assert len(accepted) == len(store.writes)
    assert accepted == sorted(accepted), "the store applied an older token after a newer one"
    assert accepted[-1] == max(tokens)
    assert sorted(accepted + [r.json()["token"] for r in responses if r.status_code == 409]) == (
        sorted(tokens)
    )
    for response in responses:
        if response.status_code == 409:
            assert response.json()["highest"] > response.json()["token"]
        else:
            assert response.status_code == 201


def test_slow_and_fast_uploads_of_one_resource_reach_the_store_in_token_order() -> None:
    # The gate reads each body before its turn: writers are admitted in the order their
    # uploads end, not begin, and the store must still see tokens that never decrease.
    rng = random.Random(23)
    plans = [(rng.randrange(1, 60), rng.choice([0.0, 0.0, 0.002, 0.01])) for _ in range(80)]

    async def upload(token: int, pause: float) -> AsyncIterator[bytes]:
        for part in (b"%d" % token, b"-", b"body"):
            await asyncio.sleep(pause)
            yield part

    async def scenario(store: Store) -> list[httpx.Response]:
        async with proxied(store) as client:
            return await asyncio.gather(
                *(client.put("/hot", content=upload(t, p), headers=fenced(t)) for t, p in plans)
            )

    with Store(jitter=0.002) as store:
        responses = run(scenario(store))
        accepted = [token for token in store.tokens() if token is not None]
        bodies = [write.body for write in store.writes]

    assert accepted == sorted(accepted), "the store applied an older token after a newer one"
    assert bodies == [b"%d-body" % t for t in accepted]  # whole, and every write tokened
    refused = [r.json() for r in responses if r.status_code == 409]
    assert len(accepted) + len(refused) == len(plans)
    assert all(r["highest"] > r["token"] for r in refused)


def test_a_store_failing_a_write_leaves_its_token_recorded(store: Store) -> None:
    # The gate cannot tell a failure that applied nothing from one that applied part:
    # the token stays recorded, its holder retries with it, older ones stay out.
    async def scenario() -> list[int]:
        async with proxied(store) as client:
            return [
                (await client.put("/doc", content=body, headers=fenced(token))).status_code
                for token, body in [(6, b"!503"), (5, b"stale"), (6, b"retried")]
            ]

    assert run(scenario()) == [503, 409, 201]
    assert store.values == {"/doc": b"retried"}


def test_holder_paused_past_its_lease_cannot_overwrite_its_successor(store: Store) -> None:
    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with proxied(store) as client:
            # A acquired the lock with token 5, then paused (GC, VM freeze) before writing.
            # Its lease expired; B acquired token 6 and wrote.
            b_write = await client.put("/accounts/1", content=b"B", headers=fenced(6))
            # A resumes, still believing it holds the lock.
            a_write = await client.put("/accounts/1", content=b"A", headers=fenced(5))
            return b_write, a_write

    b_write, a_write = run(scenario())
    assert b_write.status_code == 201
    assert a_write.status_code == 409
    assert a_write.json()["highest"] == 6
    assert store.values == {"/accounts/1": b"B"}
    assert store.tokens() == [6]


def test_token_stays_recorded_when_the_app_fails_and_its_holder_may_retry() -> None:
    app = Recorder(fail_first=1)
    gate = FencingGate(app)

    async def scenario() -> list[int]:
        async with through(gate) as client:
            with pytest.raises(RuntimeError, match="fell over"):
                await client.put("/doc", headers=fenced(5))
            retry = await client.put("/doc", headers=fenced(5))
            older = await client.put("/doc", headers=fenced(4))
            return [retry.status_code, older.status_code]

    assert run(scenario()) == [200, 409]
    assert app.seen == ["PUT", "PUT"]
    assert gate.tokens.highest("/doc") == 5


# ---------------------------------------------------------------------------------------
# The proxy


def test_proxy_forwards_method_path_query_headers_and_body(store: Store) -> None:
    async def scenario() -> httpx.Response:
        async with proxied(store) as client:
            headers = {
                **fenced(1),
                "X-Trace": "t-1",
                "Connection": "X-Private",
                "X-Private": "secret for the next hop only",
                "Keep-Alive": "timeout=5",
                "TE": "trailers",
            }
            return await client.patch(
                "/files/a%20b", params={"q": "1 2"}, content=b"payload", headers=headers
            )

    response = run(scenario())
    assert response.status_code == 201
    assert response.headers["x-store"] == "recorded"
    echo = response.json()
    assert echo["method"] == "PATCH"
    assert echo["target"] == "/files/a%20b?q=1+2"
    assert echo["body"] == "payload"
    assert echo["headers"]["x-trace"] == "t-1"
    assert echo["headers"]["fencing-token"] == "1"
    host, port = store.url.removeprefix("http://").split(":")
    assert echo["headers"]["host"] == f"{host}:{port}"
    for hop_by_hop in ("x-private", "keep-alive", "te"):
        assert hop_by_hop not in echo["headers"]


def test_proxy_appends_paths_to_the_upstream_prefix(store: Store) -> None:
    async def scenario() -> httpx.Response:
        async with FencingProxy(store.url + "/v1/") as proxy, through(proxy) as client:
            return await client.put("/doc", headers=fenced(1))

    assert run(scenario()).json()["target"] == "/v1/doc"


def test_unreachable_upstream_is_502() -> None:
    with Store() as closed:
        url = closed.url  # a loopback port nobody listens on once the store is closed

    async def scenario() -> httpx.Response:
        async with FencingProxy(url) as proxy, through(proxy) as client:
            return await client.put("/doc", headers=fenced(1))

    response = run(scenario())
    assert response.status_code == 502
    assert response.json()["error"] == "upstream request failed"
    assert "ConnectError" in response.json()["detail"]


def test_an_upstream_that_does_not_answer_is_504_saying_so() -> None:
    # A listening socket nobody reads: the connection is made, the reply never comes.
    # httpx's timeout carries no message, and the 504's detail was empty.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"

        async def scenario() -> httpx.Response:
            async with FencingProxy(url, timeout=0.3) as proxy, through(proxy) as client:
                return await client.put("/doc", headers=fenced(1))

        response = run(scenario())
    assert response.status_code == 504
    assert response.json()["error"] == "upstream timed out"
    assert "ReadTimeout" in response.json()["detail"]
    assert "0.3 s" in response.json()["detail"]


@contextmanager
def breaking_upstream(reply: bytes) -> Iterator[str]:
    """A loopback server that reads each request's head, sends ``reply`` (a status line,
    headers and part of a body) and closes the connection: it breaks off mid-answer."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.02)  # closing a socket does not wake a thread in accept()
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(5)
            with conn:
                # Read the body too: closing a socket with unread bytes resets the
                # connection, and the proxy would see a reset, not an answer broken off.
                _read_request(conn)
                conn.sendall(reply)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        done.set()
        thread.join(5)
        listener.close()


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n",
        b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n",
    ],
    ids=["content-length", "chunked"],
)
def test_an_upstream_that_breaks_off_before_the_body_is_502(reply: bytes) -> None:
    # The answer's head came, then the connection closed: httpx's RemoteProtocolError
    # escaped the proxy raw (the ASGI server answered 500, or dropped the connection).
    async def scenario(url: str) -> tuple[httpx.Response, httpx.Response, FencingProxy]:
        async with FencingProxy(url) as proxy, through(proxy) as client:
            broken = await client.put("/doc", headers=fenced(5))
            retry = await client.put("/doc", headers=fenced(5))  # the turn was handed back
            return broken, retry, proxy

    with breaking_upstream(reply) as url:
        broken, retry, proxy = run(scenario(url))
    for response in (broken, retry):
        assert response.status_code == 502
        assert response.json()["error"] == "upstream request failed"
        assert "RemoteProtocolError" in response.json()["detail"]
    assert proxy.tokens.highest("/doc") == 5
    assert proxy._turns._turns == {}


def test_an_upstream_that_breaks_off_mid_body_closes_the_clients_connection() -> None:
    # Part of the body was relayed under the upstream's status: the client must see the
    # answer cut short, which only an error out of the app makes the ASGI server do. It
    # was httpx's raw RemoteProtocolError, which named no upstream.
    reply = b"HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n0123456789"

    async def scenario(url: str) -> tuple[list[Message], FencingProxy]:
        sent: list[Message] = []

        async def send(message: Message) -> None:
            sent.append(message)

        async def receive() -> Message:
            return {"type": "http.request", "body": b"v", "more_body": False}

        scope: Scope = {
            "type": "http",
            "method": "PUT",
            "path": "/doc",
            "raw_path": b"/doc",
            "query_string": b"",
            "headers": [(b"fencing-token", b"5")],
        }
        async with FencingProxy(url) as proxy:
            with pytest.raises(UpstreamInterrupted) as caught:
                await proxy(scope, receive, send)
        error = caught.value
        assert isinstance(error, ConnectionError)
        assert isinstance(error.__cause__, httpx.RemoteProtocolError)
        assert f"PUT {url}/doc" in str(error)
        assert "201" in str(error)
        assert "after 10 bytes" in str(error)
        assert "retry" in str(error)
        return sent, proxy

    with breaking_upstream(reply) as url:
        sent, proxy = run(scenario(url))
    assert sent[0]["status"] == 201
    assert [m.get("more_body") for m in sent[1:]] == [True]  # never said complete
    assert proxy.tokens.highest("/doc") == 5
    assert proxy._turns._turns == {}


def _read_request(conn: socket.socket) -> bytes:
    """Read one HTTP request from ``conn``, its body too (by its Content-Length); return
    its head."""
    received = b""
    while b"\r\n\r\n" not in received:
        received += conn.recv(65536)
    head, _, body = received.partition(b"\r\n\r\n")
    declared = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    while declared and len(body) < int(declared[1]):
        body += conn.recv(65536)
    return head


@contextmanager
def head_first_upstream(applied: list[int]) -> Iterator[tuple[str, threading.Event]]:
    """A loopback store that answers a write carrying token 5 the way S3 answers
    CompleteMultipartUpload: the head (``200``, chunked) and a chunk of white space at
    once, the write applied only later, then the rest of the body. Any other write is
    applied and answered ``201`` at once. ``applied`` gets each write's token in the
    order the store applied them; the event is set once token 5's head is out. It
    closes each connection after its answer, and says so (``Connection: close``): the
    proxy must not send the next write on a connection it is closing."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.02)  # closing a socket does not wake a thread in accept()
    done = threading.Event()
    head_sent = threading.Event()
    other_arrived = threading.Event()
    lock = threading.Lock()

    def handle(conn: socket.socket) -> None:
        with conn:
            head = _read_request(conn)
            found = re.search(rb"(?im)^fencing-token:\s*(\d+)", head)
            assert found is not None
            token = int(found[1])
            if token != 5:
                other_arrived.set()
                with lock:
                    applied.append(token)
                conn.sendall(
                    b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                )
                return
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n"
                b"\r\n1\r\n \r\n"
            )
            head_sent.set()
            # Still applying: a writer let through now would be applied first. The wait
            # ends at once if one is; otherwise it only bounds the test.
            other_arrived.wait(0.5)
            with lock:
                applied.append(token)
            conn.sendall(b"4\r\ndone\r\n0\r\n\r\n")

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            conn.settimeout(5)
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", head_sent
    finally:
        done.set()
        thread.join(5)
        listener.close()


def test_the_turn_is_held_until_the_stores_answer_ends_not_only_its_head() -> None:
    # A store may send its status before it has applied the write (S3 answers
    # CompleteMultipartUpload 200 at once, then white space while it works). Were the
    # turn let go at the head, a newer writer would reach the store, and be applied,
    # before the older write it queued behind: the store would end on the older token.
    applied: list[int] = []

    async def scenario(url: str, head_sent: threading.Event) -> tuple[bytes, int]:
        async with FencingProxy(url) as proxy, through(proxy) as client:

            async def a() -> bytes:
                answer = await client.post("/doc", content=b"A", headers=fenced(5))
                return answer.content

            async def b() -> int:
                await asyncio.to_thread(head_sent.wait, 5)  # A's head was relayed
                return (await client.put("/doc", content=b"B", headers=fenced(6))).status_code

            return await asyncio.wait_for(asyncio.gather(a(), b()), 10)

    with head_first_upstream(applied) as (url, head_sent):
        a_body, b_status = run(scenario(url, head_sent))
    assert (a_body, b_status) == (b" done", 201)
    assert applied == [5, 6]


def test_a_client_that_never_reads_its_answer_holds_the_turn_only_relay_timeout() -> None:
    # The turn is held until the store's whole answer is relayed, and relaying waits on
    # the client: one that kept its connection open and never read (its ASGI send
    # blocked for ever under backpressure) held the resource's turn for ever, and every
    # other writer of it waited for ever. The store's answer must still be read to its
    # end before the turn goes: this store applies token 5's write only after its head.
    applied: list[int] = []
    scope: Scope = {
        "type": "http",
        "method": "PUT",
        "path": "/doc",
        "raw_path": b"/doc",
        "query_string": b"",
        "headers": [(b"fencing-token", b"5")],
    }

    async def scenario(url: str) -> tuple[BaseException | None, int, FencingProxy]:
        head_relayed = asyncio.Event()
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.request", "body": b"A", "more_body": False}

        async def send(message: Message) -> None:
            sent.append(message)
            if message["type"] == "http.response.start":
                head_relayed.set()
                return
            await asyncio.Event().wait()  # the client never reads the body

        async with FencingProxy(url, relay_timeout=0.3) as proxy, through(proxy) as client:

            async def a() -> BaseException | None:
                try:
                    await proxy(scope, receive, send)
                except RelayTimeout as exc:
                    return exc
                return None

            async def b() -> int:
                await head_relayed.wait()
                return (await client.put("/doc", content=b"B", headers=fenced(6))).status_code

            error, status = await asyncio.wait_for(asyncio.gather(a(), b()), 5)
        assert [m["type"] for m in sent][:1] == ["http.response.start"]
        return error, status, proxy

    with head_first_upstream(applied) as (url, _):
        error, b_status, proxy = run(scenario(url))
    assert b_status == 201
    assert applied == [5, 6]  # the turn went only once the store's answer had ended
    assert isinstance(error, TimeoutError)
    assert "relay_timeout=0.3 s" in str(error)
    assert f"PUT {url}/doc" in str(error)
    assert proxy.tokens.highest("/doc") == 6
    assert proxy._turns._turns == {}


@pytest.mark.parametrize("relay_timeout", [math.nan, 0, -1.0, "60", True, math.inf])
def test_proxy_relay_timeout_must_be_a_number_of_seconds_or_none(relay_timeout: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        FencingProxy("http://127.0.0.1:1", relay_timeout=relay_timeout)  # type: ignore[arg-type]
    assert info.value.parameter == "relay_timeout"
    assert "None" in str(info.value)


@pytest.mark.parametrize(
    ("method", "raw_path", "query"),
    [
        ("PUT", b"/doc#1", b""),  # h11 accepts '#' in a target; httpx will not send it
        ("PUT", b"/doc", b"v=1#top"),
        ("PUT", b"/caf\xc3\xa9", b""),  # non-ASCII, as servers other than h11 may pass
        ("GET", b"/doc#1", b""),  # unguarded: answered all the same, not raised
    ],
)
def test_a_target_the_proxy_cannot_forward_is_400_and_records_no_token(
    store: Store, method: str, raw_path: bytes, query: bytes
) -> None:
    # Driven with a raw ASGI scope: httpx, as a client, would strip or escape the target.
    path = raw_path.decode("utf-8")
    scope: Scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": raw_path,
        "query_string": query,
        "headers": [(b"fencing-token", b"7"), (b"host", b"gate.invalid")],
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"v", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    async def scenario() -> FencingProxy:
        async with FencingProxy(store.url) as proxy:
            await proxy(scope, receive, send)
        return proxy

    proxy = run(scenario())
    assert sent[0]["status"] == 400
    answer = json.loads(sent[1]["body"])
    assert answer["error"] == "request target cannot be forwarded"
    assert "percent-encode" in answer["detail"]
    assert proxy.tokens.highest(path) is None
    assert store.writes == []


@pytest.mark.parametrize(
    ("raw_path", "path"),
    [
        (b"/v1/./doc", "/v1/./doc"),
        (b"/v1/old/../doc", "/v1/old/../doc"),
        (b"/v1/%2E%2E/v1/doc", "/v1/../v1/doc"),  # servers resolve these too
        (b"/../v1/doc", "/../v1/doc"),  # would climb out of the upstream's prefix
    ],
)
def test_a_stale_writer_cannot_spell_the_path_with_dot_segments(
    store: Store, raw_path: bytes, path: str
) -> None:
    # The gate fences the path as received, and httpx resolves '.' and '..' as it builds
    # the upstream URL: "/v1/./doc" was fenced as a resource of its own, and then written
    # to "/v1/doc" over the newer holder's value (and "/../v1/doc" escaped the prefix).
    scope: Scope = {
        "type": "http",
        "method": "PUT",
        "path": path,
        "raw_path": raw_path,
        "query_string": b"",
        "headers": [(b"fencing-token", b"5"), (b"host", b"gate.invalid")],
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"stale", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    async def scenario() -> FencingProxy:
        async with FencingProxy(store.url + "/base") as proxy:
            async with through(proxy) as client:
                newer = await client.put("/v1/doc", headers=fenced(6), content=b"newer")
                assert newer.status_code == 201
            await proxy(scope, receive, send)
        return proxy

    proxy = run(scenario())
    assert store.values == {"/base/v1/doc": b"newer"}
    assert [write.token for write in store.writes] == [6]
    assert sent[0]["status"] == 400
    answer = json.loads(sent[1]["body"])
    assert answer["error"] == "request target cannot be forwarded"
    assert "'.' or '..' segment" in answer["detail"]
    assert proxy.tokens.highest(path) is None


class LenientStore:
    """An ASGI store that serves one object under several spellings of its path, as
    many servers do: empty segments merged, '.' and '..' resolved, a trailing slash
    dropped (Express's default routing, nginx's merge_slashes, Flask's
    strict_slashes=False)."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        segments: list[str] = []
        for segment in str(scope["path"]).split("/"):
            if segment == "..":
                segments = segments[:-1]
            elif segment not in ("", "."):
                segments.append(segment)
        message = await receive()
        self.values["/" + "/".join(segments)] = message.get("body", b"")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def call(
    app: Any, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, dict[str, Any]]:
    """One request driven through ``app`` as an ASGI server would, with ``path`` as sent
    (an HTTP client would resolve dot segments first); the status and a JSON answer."""
    scope: Scope = {
        "type": "http",
        "method": method,
        "path": path,
        "raw_path": path.encode("utf-8"),
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    content = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], json.loads(content) if content.startswith(b"{") else {}


@pytest.mark.parametrize(
    "spelling",
    ["//doc", "/doc/", "/./doc", "/v/../doc", "/doc/.", "///doc//", "/doc/x/.."],
)
def test_a_stale_writer_cannot_spell_the_path_another_way(spelling: str) -> None:
    # The gate fenced the path as received, so each spelling was a resource of its own,
    # never written by the newer holder: the stale token was admitted, and the store,
    # which serves all of them as "/doc", overwrote the newer holder's value.
    store = LenientStore()
    gate = FencingGate(store)

    async def scenario() -> tuple[int, dict[str, Any]]:
        assert (await call(gate, "PUT", "/doc", fenced(6), b"newer"))[0] == 200
        return await call(gate, "PUT", spelling, fenced(5), b"stale")

    status, answer = run(scenario())
    assert store.values == {"/doc": b"newer"}
    assert status == 400
    assert answer["error"] == "request path not in canonical form"
    assert answer["path"] == spelling
    assert "'/doc'" in answer["detail"]
    assert "Fencing-Resource" in answer["detail"]
    assert gate.tokens.highest(spelling) is None


def test_a_resource_named_by_header_may_have_any_path() -> None:
    # Only a path that is the resource must be canonical: with the resource named, the
    # path's spelling does not decide what is fenced.
    store = LenientStore()
    gate = FencingGate(store)

    async def scenario() -> list[int]:
        named = {"Fencing-Resource": "folder"}
        return [
            (await call(gate, "PUT", "/folder/", {**fenced(6), **named}))[0],
            (await call(gate, "PUT", "//folder", {**fenced(5), **named}))[0],
            (await call(gate, "PUT", "/", fenced(1)))[0],  # the root is canonical
        ]

    assert run(scenario()) == [200, 409, 200]
    assert gate.tokens.highest("folder") == 6


def test_proxy_refuses_a_non_canonical_path_before_recording(store: Store) -> None:
    async def scenario() -> list[int]:
        async with FencingProxy(store.url) as proxy:
            return [
                (await call(proxy, "PUT", path, fenced(token)))[0]
                for path, token in [("/doc", 6), ("//doc", 5), ("/doc/", 5), ("/doc//", 7)]
            ]

    assert run(scenario()) == [201, 400, 400, 400]
    assert store.tokens() == [6]


def test_proxy_closes_its_client_at_lifespan_shutdown(store: Store) -> None:
    proxy = FencingProxy(store.url)
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    sent: list[str] = []

    async def receive() -> Message:
        return next(messages)

    async def send(message: Message) -> None:
        sent.append(message["type"])

    run(proxy({"type": "lifespan"}, receive, send))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert proxy.forwarder._client.is_closed


def test_proxy_leaves_a_callers_client_open(store: Store) -> None:
    async def scenario() -> bool:
        async with httpx.AsyncClient() as mine:
            async with FencingProxy(store.url, client=mine) as proxy, through(proxy) as client:
                await client.put("/doc", headers=fenced(1))
            return mine.is_closed

    assert run(scenario()) is False
    assert store.tokens() == [1]


def test_proxy_without_httpx_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(ImportError, match="pip install httpx"):
        FencingProxy("http://127.0.0.1:9")


@pytest.mark.parametrize(
    "upstream", ["ftp://127.0.0.1/", "http:///nohost", "http://127.0.0.1/?a=1", "http://h/#f"]
)
def test_proxy_rejects_a_bad_upstream(upstream: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        FencingProxy(upstream)
    assert caught.value.parameter == "upstream"


@pytest.mark.parametrize(
    ("options", "parameter"),
    [
        ({"header": "Bad Header"}, "header"),
        ({"resource_header": ""}, "resource_header"),
        ({"methods": frozenset()}, "methods"),
        ({"methods": "PUT"}, "methods"),
        ({"methods": None}, "methods"),  # a raw TypeError, before
    ],
)
def test_gate_rejects_bad_configuration(options: dict[str, Any], parameter: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        FencingGate(Recorder(), **options)
    assert caught.value.parameter == parameter


# ---------------------------------------------------------------------------------------
# Request bodies: bounded, and read before the resource's turn


async def trickle(*chunks: bytes, until: asyncio.Event | None = None) -> AsyncIterator[bytes]:
    """A request body sent chunk by chunk; with ``until``, the last chunk waits for it
    (a slow client, still uploading)."""
    for index, chunk in enumerate(chunks):
        if until is not None and index == len(chunks) - 1:
            await until.wait()
        yield chunk


@pytest.mark.parametrize("max_body", [-1, 1.5, True, "10", None])
def test_proxy_max_body_must_be_a_byte_count(max_body: object) -> None:
    with pytest.raises(ConfigurationError) as caught:
        FencingProxy("http://127.0.0.1:1", max_body=max_body)  # type: ignore[arg-type]
    assert caught.value.parameter == "max_body"
    assert "bytes" in str(caught.value)


def test_gate_max_body_must_be_a_byte_count_or_none() -> None:
    with pytest.raises(ConfigurationError) as caught:
        FencingGate(Recorder(), max_body=-5)
    assert caught.value.parameter == "max_body"
    assert FencingGate(Recorder()).max_body is None
    assert FencingProxy("http://127.0.0.1:1").max_body == 512 * 2**20


def test_a_body_declared_over_max_body_is_413_and_records_no_token(store: Store) -> None:
    async def scenario() -> tuple[httpx.Response, httpx.Response, FencingProxy]:
        async with FencingProxy(store.url, max_body=10) as proxy, through(proxy) as client:
            over = await client.put("/doc", content=b"x" * 11, headers=fenced(5))
            at = await client.put("/doc", content=b"x" * 10, headers=fenced(4))
            return over, at, proxy

    over, at, proxy = run(scenario())
    assert over.status_code == 413
    assert over.json()["error"] == "request body too large"
    assert over.json()["max_body"] == 10
    assert "11" in over.json()["detail"]
    # Token 5 was never recorded: the older 4, within the bound, is still admitted.
    assert at.status_code == 201
    assert store.tokens() == [4]
    assert proxy.tokens.highest("/doc") == 4


def test_a_chunked_body_over_max_body_is_413_and_records_no_token(store: Store) -> None:
    async def scenario() -> tuple[httpx.Response, FencingProxy]:
        async with FencingProxy(store.url, max_body=10) as proxy, through(proxy) as client:
            # No Content-Length: the body is streamed, and only reading it finds it too big.
            body = trickle(b"x" * 6, b"x" * 6)
            return await client.put("/doc", content=body, headers=fenced(5)), proxy

    response, proxy = run(scenario())
    assert response.status_code == 413
    assert response.json()["max_body"] == 10
    assert proxy.tokens.highest("/doc") is None
    assert store.writes == []


def test_an_unguarded_request_is_bounded_too(store: Store) -> None:
    async def scenario() -> list[int]:
        async with proxied(store, max_body=4, methods=frozenset({"PUT"})) as client:
            post = await client.post("/doc", content=trickle(b"abc", b"de"))
            small = await client.post("/doc", content=b"abcd")
            return [post.status_code, small.status_code]

    assert run(scenario()) == [413, 201]
    assert [w.body for w in store.writes] == [b"abcd"]


def test_a_gate_with_max_body_hands_the_app_the_whole_body() -> None:
    got: list[bytes] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        message = await receive()
        assert message["more_body"] is False
        got.append(message["body"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    async def scenario() -> list[int]:
        async with through(FencingGate(app, max_body=8)) as client:
            whole = await client.put("/doc", content=trickle(b"ab", b"cd"), headers=fenced(1))
            over = await client.put("/doc", content=trickle(b"abcde", b"fghi"), headers=fenced(2))
            return [whole.status_code, over.status_code]

    assert run(scenario()) == [200, 413]
    assert got == [b"abcd"]


@pytest.mark.parametrize("kind", ["proxy", "gate"])
def test_a_slow_uploader_does_not_hold_up_the_resources_other_writers(
    store: Store, kind: str
) -> None:
    # A (token 5) starts its write first and uploads slowly; B (token 6) writes the same
    # resource meanwhile. The gate took A's turn before A's body was read, so B waited
    # for A's upload to end, however long: one slow client stalled every writer of the
    # resource (here A waits for B, so they waited for each other).
    async def scenario() -> tuple[int, int]:
        # As a gate: the proxy behind it fences nothing.
        proxy = FencingProxy(store.url, methods=frozenset({"NONE" if kind == "gate" else "PUT"}))
        app = proxy if kind == "proxy" else FencingGate(proxy, max_body=64)
        b_done = asyncio.Event()
        async with proxy, through(app) as client:

            async def a() -> httpx.Response:
                body = trickle(b"A-part-1 ", b"A-part-2", until=b_done)
                return await client.put("/doc", content=body, headers=fenced(5))

            async def b() -> httpx.Response:
                await asyncio.sleep(0.05)  # A is well into its upload
                try:
                    return await client.put("/doc", content=b"B", headers=fenced(6))
                finally:
                    b_done.set()

            a_answer, b_answer = await asyncio.wait_for(asyncio.gather(a(), b()), 5)
        return a_answer.status_code, b_answer.status_code

    a_status, b_status = run(scenario())
    assert (a_status, b_status) == (409, 201)
    assert store.tokens() == [6]
    assert store.values == {"/doc": b"B"}


def test_a_client_that_leaves_mid_upload_records_no_token(store: Store) -> None:
    # The token was recorded as the gate admitted the request, before the body was read:
    # a client gone halfway through its upload still locked out every older token.
    messages: Iterator[Message] = iter(
        [
            {"type": "http.request", "body": b"half", "more_body": True},
            {"type": "http.disconnect"},
        ]
    )
    sent: list[Message] = []

    async def receive() -> Message:
        return next(messages)

    async def send(message: Message) -> None:
        sent.append(message)

    async def scenario() -> FencingProxy:
        async with FencingProxy(store.url) as proxy:
            scope: Scope = {
                "type": "http",
                "method": "PUT",
                "path": "/doc",
                "raw_path": b"/doc",
                "query_string": b"",
                "headers": [(b"fencing-token", b"5")],
            }
            await proxy(scope, receive, send)
            return proxy

    proxy = run(scenario())
    assert sent == []
    assert proxy.tokens.highest("/doc") is None
    assert proxy._turns._turns == {}
    assert store.writes == []


# ---------------------------------------------------------------------------------------
# The token book


def test_token_book_admits_newer_and_equal_and_reports_the_highest() -> None:
    book = TokenBook()
    assert book.highest("r") is None
    assert book.admit("r", 5) is None
    assert book.admit("r", 5) is None
    assert book.admit("r", 4) == 5
    assert book.admit("r", 0) == 5
    assert book.admit("other", 0) is None
    assert book.highest("r") == 5


@pytest.mark.parametrize("token", [-1, GATE_TOKEN_LIMIT, True, 1.0, "5"])
def test_token_book_rejects_tokens_out_of_range(token: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        TokenBook().admit("r", token)
    assert caught.value.parameter == "token"


@pytest.mark.parametrize("path", [b"tokens.json", 3, ["tokens.json"]])
def test_token_book_refuses_what_is_no_path(path: Any) -> None:
    # Each was a raw TypeError from pathlib.
    with pytest.raises(ConfigurationError, match="must be a file path") as caught:
        TokenBook(path)
    assert caught.value.parameter == "path"


def test_token_book_is_thread_safe() -> None:
    book = TokenBook()
    rng = random.Random(3)
    tokens = [rng.randrange(1000) for _ in range(4000)]

    def admit(token: int) -> tuple[int, int | None]:
        return token, book.admit("r", token)

    with ThreadPoolExecutor(max_workers=8) as pool:
        verdicts = list(pool.map(admit, tokens, chunksize=50))

    assert book.highest("r") == max(tokens)
    assert all(highest > token for token, highest in verdicts if highest is not None)
    assert max(tokens) in {token for token, highest in verdicts if highest is None}


def test_token_book_persists_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    first = TokenBook(path)
    assert first.admit("a", 6) is None
    assert first.admit("b", 2) is None
    assert first.admit("a", 3) == 6

    again = TokenBook(path)
    assert again.highest("a") == 6
    assert again.highest("b") == 2
    assert again.admit("a", 5) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokens.json"]  # no temp files left


def test_restarted_gate_still_refuses_the_paused_holder(store: Store, tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"

    async def write(token: int, value: bytes) -> int:
        async with proxied(store, tokens=TokenBook(path, fsync=False)) as client:
            return (
                await client.put("/accounts/1", content=value, headers=fenced(token))
            ).status_code

    assert run(write(6, b"B")) == 201
    assert run(write(5, b"A")) == 409  # a new gate process, same book file
    assert store.values == {"/accounts/1": b"B"}


def test_token_book_refuses_a_file_that_is_not_a_book(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    for text in ["not json", "[]", '{"version": 1, "highest": {"a": -3}}', '{"highest": {}}']:
        path.write_text(text)
        with pytest.raises(ConfigurationError, match="not a tenure token book"):
            TokenBook(path)


def test_token_book_refuses_a_path_it_cannot_read(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot read") as caught:
        TokenBook(tmp_path)  # a directory
    assert caught.value.parameter == "path"
    assert "JSON file" in str(caught.value)


def test_token_book_refuses_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_bytes(b"\xff\xfe{}")
    with pytest.raises(ConfigurationError, match="not a tenure token book") as caught:
        TokenBook(path)
    assert caught.value.parameter == "path"


def test_unpersistable_token_is_not_admitted_and_the_gate_answers_503(tmp_path: Path) -> None:
    book = TokenBook(tmp_path / "missing-directory" / "tokens.json")
    with pytest.raises(OSError, match="missing-directory"):
        book.admit("r", 1)
    assert book.highest("r") is None

    app = Recorder()

    async def scenario() -> httpx.Response:
        async with through(FencingGate(app, tokens=book)) as client:
            return await client.put("/doc", headers=fenced(1))

    response = run(scenario())
    assert response.status_code == 503
    assert app.seen == []

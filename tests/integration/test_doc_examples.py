"""The Python examples of the README and docs/*.md run, against real local nodes.

An example is what a reader copies. Each is a fragment of the reader's own code: it
uses names their code would have (``client``, ``engine``, ``request``) and the addresses
of their servers. ``EXAMPLES`` says, per example, what it needs around it here: a
prelude that makes those names, the addresses it takes the place of, a function to wrap
it in where it ``return``s or ``await``s, and what to check once it ran. An example
shown with a deployment's addresses (Sentinel, Cluster, TLS hosts) is not run, since
nothing may be sent beyond loopback here; its node URLs must parse and the options it
passes must be parameters of what it calls (the forms themselves run in the Sentinel,
Cluster and TLS tests).

A new example, or an edited first line, has no entry and fails
``test_every_example_has_an_entry``: say there how it runs.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

import tenure
from tenure._core.config import parse_node_url
from tenure.testing import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Example:
    """How one example runs (``run=False``: it is only parsed and checked)."""

    run: bool = True
    prelude: str = ""
    # Text of the example -> text in its place (``{url}``, ``{urls}``: local nodes).
    swap: dict[str, str] = field(default_factory=dict)
    wrap: str = ""  # a ``def``/``async def`` line the example becomes the body of
    then: str = ""  # run after it, in its namespace: calls and asserts
    why_not: str = ""


# Keyed by page and the beginning of the example's first line.
EXAMPLES: dict[tuple[str, str], Example] = {
    ("README.md", "import tenure"): Example(
        swap={
            # The three masters' URLs, on one line of the example.
            '"redis://10.0.0.1:6379", "redis://10.0.0.2:6379", '
            '"redis://10.0.0.3:6379",': "*{urls},",
        },
        then="assert lease.released and lock.locked() is False",
    ),
    ("README.md", "async with tenure.AsyncClient(urls) as client:"): Example(
        prelude="import tenure\nurls = {urls}\nseen = []",
        swap={"        ...": "        seen.append(lease.fencing_token)"},
        wrap="async def main() -> None:",
        then="asyncio.run(main())\nassert len(seen) == 1 and seen[0] > 0",
    ),
    ("README.md", "from tenure.fencing import FencedStore"): Example(
        prelude=(
            "import redis, tenure\n"
            "client = tenure.Client({urls})\n"
            "def read_balance() -> int:\n"
            "    return 100"
        ),
        swap={"redis.Redis(...)": "redis.Redis.from_url({url})"},
        then="assert store.read('account:7')[0] == b'90'",
    ),
    ("docs/cluster-and-sentinel.md", 'tenure.Client(["redis+sentinel://'): Example(
        run=False, why_not="a deployment's Sentinels and Cluster"
    ),
    ("docs/cluster-and-sentinel.md", 'tenure.Client(["redis+sentinel://app:'): Example(
        run=False, why_not="a deployment's Sentinels"
    ),
    ("docs/connections.md", "client = tenure.Client("): Example(
        run=False, why_not="a deployment's TLS hosts"
    ),
    ("docs/connections.md", 'app_redis = redis.Redis(host="redis-a.internal"'): Example(
        run=False, why_not="a deployment's TLS hosts"
    ),
    ("docs/patterns.md", "import redis"): Example(
        swap={"redis.Redis()": "redis.Redis.from_url({url})"},
        prelude="import redis\nredis.Redis.from_url({url}).set('stock:sku-42', 3)",
        then="assert left == 2 and stats.attempts == 1",
    ),
    ("docs/patterns.md", "from sqlalchemy import select"): Example(
        prelude=(
            "import sqlalchemy as sa\n"
            "engine = sa.create_engine('sqlite://')\n"
            "items = sa.Table('items', sa.MetaData(), sa.Column('id', sa.Integer,"
            " primary_key=True), sa.Column('stock', sa.Integer),"
            " sa.Column('version', sa.Integer))\n"
            "items.metadata.create_all(engine)\n"
            "with engine.begin() as conn:\n"
            "    conn.execute(items.insert().values(id=1, stock=2, version=1))\n"
            "class SoldOut(Exception):\n"
            "    pass"
        ),
        # (Disposed: Python 3.13 warns of a SQLite connection left to the collector.)
        then="assert sell(1) == 1 and sell(1) == 0\nengine.dispose()",
    ),
    ("docs/patterns.md", "with store.once(key) as once:"): Example(
        prelude=(
            "import redis\n"
            "from tenure.patterns import RedisIdempotency\n"
            "store = RedisIdempotency(redis.Redis.from_url({url}), lease=30)\n"
            "effects = []\n"
            "def do_the_effect() -> str:\n"
            "    effects.append(1)\n"
            "    return 'done'"
        ),
        wrap="def handle(key: str) -> object:",
        then="assert handle('k1') == handle('k1') == 'done' and effects == [1]",
    ),
    ("docs/patterns.md", "with store.once(key) as once:             # RedisIdempotency"): Example(
        prelude=(
            "import redis\n"
            "from tenure.patterns import RedisIdempotency\n"
            "store = RedisIdempotency(redis.Redis.from_url({url}), lease=30)\n"
            "batches, exported = [1, 2, 3], []\n"
            "export = exported.append"
        ),
        wrap="def handle(key: str) -> object:",
        then="handle('k2')\nassert handle('k2') == 'exported' and exported == [1, 2, 3]",
    ),
    ("docs/patterns.md", "from tenure.patterns import RedisIdempotency, idempotent"): Example(
        prelude=(
            "import redis, types\n"
            "deducted = []\n"
            "class Ledger:\n"
            "    def deduct(self, user: str, points: int, idempotency_key: str) -> int:\n"
            "        deducted.append((user, points, idempotency_key))\n"
            "        return 900\n"
            "ledger = Ledger()\n"
            "request = types.SimpleNamespace(user='u1', headers={{'Idempotency-Key': 'r1'}})"
        ),
        swap={"redis.Redis()": "redis.Redis.from_url({url})"},
        then=(
            "assert deduct_points(request) == deduct_points(request) == 900\n"
            "assert deducted == [('u1', 100, 'r1')]"
        ),
    ),
    ("docs/patterns.md", "store = RedisIdempotency(r, lease=10, wait=5)"): Example(
        prelude=(
            "import redis, types\n"
            "from tenure.patterns import Plan, Reads, RedisIdempotency\n"
            "r = redis.Redis.from_url({url})\n"
            "r.set('coupon:SPRING:left', 5)\n"
            "class CouponExhausted(Exception):\n"
            "    pass\n"
            "request = types.SimpleNamespace(headers={{'Idempotency-Key': 'c1'}})"
        ),
        then=(
            "assert handle(request) == handle(request) == {{'coupon': 'SPRING', 'left': 4}}\n"
            "assert r.get('coupon:SPRING:left') == b'4'"
        ),
    ),
    ("docs/patterns.md", "from sqlalchemy import update"): Example(
        prelude=(
            "import sqlalchemy as sa, types\n"
            "engine = sa.create_engine('sqlite://')\n"
            "accounts = sa.Table('accounts', sa.MetaData(), sa.Column('id', sa.String,"
            " primary_key=True), sa.Column('points', sa.Integer))\n"
            "accounts.metadata.create_all(engine)\n"
            "with engine.begin() as conn:\n"
            "    conn.execute(accounts.insert().values(id='u1', points=500))\n"
            "request = types.SimpleNamespace(user='u1', headers={{'Idempotency-Key': 's1'}})"
        ),
        then=(
            "assert deduct_points(request) == deduct_points(request) == {{'deducted': 100}}\n"
            "with engine.connect() as conn:\n"
            "    assert conn.execute(sa.select(accounts.c.points)).scalar() == 400\n"
            "engine.dispose()"
        ),
    ),
    ("docs/patterns.md", "import tenure"): Example(
        prelude=(
            "import redis, threading\n"
            "from tenure.patterns.streams import StreamProducer\n"
            "r = redis.Redis.from_url({url})\n"
            "stop_event = threading.Event()\n"
            "applied = []\n"
            "class Ledger:\n"
            "    def apply_once(self, key, payload, token, partition) -> None:\n"
            "        applied.append((key, payload['op'], token > 0, partition))\n"
            "        stop_event.set()\n"
            "ledger = Ledger()\n"
            "StreamProducer(r, 'points', partitions=8).append('user:9', {{'op': 'add'}})"
        ),
        swap={
            '["redis://lock1:6379", "redis://lock2:6379", "redis://lock3:6379"]': "{urls}",
        },
        then="assert applied == [('user:9', b'add', True, partition_of('user:9'))]",
    ),
    ("docs/waiting.md", 'client = tenure.Client(["redis://127.0.0.1:6379"])'): Example(
        prelude="import tenure",
        swap={'["redis://127.0.0.1:6379"]': "[{url}]"},
    ),
}

# Two examples of patterns.md open with ``import redis``: the optimistic one (above) and
# the stream producer's, told apart by their second line.
PRODUCER = Example(
    swap={"redis.Redis()": "redis.Redis.from_url({url})"},
    then="assert r.xlen(producer.stream_of('user:42')) >= 1",
)


def _examples() -> Iterator[tuple[str, int, str]]:
    """(page, line, code) for every ```python block of the README and docs/*.md."""
    for path in PAGES:
        text = path.read_text()
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.M | re.S):
            line = text.count("\n", 0, match.start()) + 2
            yield str(path.relative_to(ROOT)), line, match.group(1)


def _entry(page: str, code: str) -> Example | None:
    first = code.splitlines()[0].rstrip()
    if page == "docs/patterns.md" and first == "import redis" and "StreamProducer" in code:
        return PRODUCER
    # The longest key that begins the first line: two examples may begin alike.
    keys = [k for k in EXAMPLES if k[0] == page and first.startswith(k[1])]
    return EXAMPLES[max(keys, key=lambda k: len(k[1]))] if keys else None


ALL = list(_examples())


def test_every_example_has_an_entry() -> None:
    missing = [f"{page}:{line}" for page, line, code in ALL if _entry(page, code) is None]
    assert not missing, f"examples with no entry in EXAMPLES (say how each runs): {missing}"
    assert len(ALL) >= 17


def _tenure_calls(tree: ast.AST) -> Iterator[tuple[Any, ast.Call]]:
    """The calls of the example that name a class or function of tenure's, with it."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        target = getattr(tenure, name, None)
        if target is None:
            for module in ("tenure.fencing", "tenure.patterns", "tenure.patterns.streams"):
                target = getattr(__import__(module, fromlist=[name]), name, None)
                if target is not None:
                    break
        if callable(target) and (inspect.isclass(target) or inspect.isfunction(target)):
            yield target, node


@pytest.mark.parametrize(("page", "line", "code"), ALL, ids=[f"{p}:{n}" for p, n, _ in ALL])
def test_an_example_names_real_parameters_and_node_urls(page: str, line: int, code: str) -> None:
    """What is not run is checked: the keyword arguments it gives tenure's classes and
    functions are their parameters, and its node URLs parse."""
    tree = ast.parse(textwrap.dedent(code).replace("async with", "with"))
    for target, call in _tenure_calls(tree):
        accepted = inspect.signature(target).parameters
        if any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
            continue
        for keyword in call.keywords:
            assert keyword.arg is None or keyword.arg in accepted, (
                f"{page}:{line}: {target.__name__} has no parameter {keyword.arg!r}"
            )
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.match(r"^(redis|rediss|unix)(\+\w+)?://", node.value)
        ):
            parse_node_url(node.value.replace("PASSWORD", "pw"))


@pytest.fixture(scope="module")
def nodes() -> Iterator[LocalCluster]:
    with LocalCluster(3) as cluster:
        yield cluster


def _runnable() -> list[tuple[str, int, str]]:
    return [(p, n, c) for p, n, c in ALL if (e := _entry(p, c)) is not None and e.run]


@pytest.mark.parametrize(
    ("page", "line", "code"), _runnable(), ids=[f"{p}:{n}" for p, n, _ in _runnable()]
)
def test_an_example_runs(nodes: LocalCluster, page: str, line: int, code: str) -> None:
    example = _entry(page, code)
    assert example is not None
    for client in (redis.Redis.from_url(url) for url in nodes.urls):
        with client:
            client.flushall()
    local = {"url": repr(nodes.urls[0]), "urls": repr(list(nodes.urls))}
    for old, new in example.swap.items():
        assert old in code, f"{page}:{line}: the example no longer holds {old!r}"
        code = code.replace(old, new.format(**local))
    if example.wrap:
        code = f"{example.wrap}\n{textwrap.indent(code, '    ')}"
    namespace: dict[str, Any] = {"asyncio": asyncio, "threading": threading}
    timer = None
    if "worker.run(stop_event)" in code:
        # A worker runs until stopped: the prelude's handler stops it; a timer bounds it.
        code = code.replace("worker.run(stop_event)", "_timer.start()\nworker.run(stop_event)")
        namespace["_timer"] = timer = threading.Timer(20.0, lambda: namespace["stop_event"].set())
    source = "\n".join(
        part for part in (example.prelude.format(**local), code, example.then.format()) if part
    )
    try:
        exec(compile(source, f"{page}:{line}", "exec"), namespace)
    finally:
        if timer is not None:
            timer.cancel()
        for value in list(namespace.values()):
            if isinstance(value, tenure.Client):
                value.close()

"""The public names are pinned: adding or removing one is a decision, made here.

Each public module (what the README and docs/ show being imported) defines ``__all__``,
pinned below. Every public class or function a public module defines, or takes from a
private module, is in its ``__all__`` or listed as deliberately private. A new module
without a leading underscore must be added here as public or as a command's
implementation.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re

import pytest

import tenure
from tenure import _errors

# The public modules but ``tenure`` itself (pinned in test_public_names), each with its
# ``__all__`` (sorted here; the module's own order is free).
PINNED: dict[str, list[str]] = {
    "tenure.fencing": [
        "AsyncFencedStore",
        "FencedStore",
        "FencingGate",
        "FencingProxy",
        "MAX_TOKEN",
        "TokenBook",
        "fenced_keys",
        "fenced_write_args",
    ],
    "tenure.fencing.http": [
        "FencingGate",
        "FencingProxy",
        "GATE_TOKEN_LIMIT",
        "GUARDED_METHODS",
        "RelayTimeout",
        "TokenBook",
        "UpstreamInterrupted",
    ],
    "tenure.fencing.redis_store": [
        "AsyncFencedStore",
        "FencedStore",
        "MAX_TOKEN",
        "fenced_keys",
        "fenced_write_args",
    ],
    "tenure.fencing.sql": [
        "FencedMixin",
        "MAX_SQL_TOKEN",
        "fence",
        "fenced_execute",
        "fenced_update",
    ],
    "tenure.patterns": [
        "ClaimLost",
        "Codec",
        "ConflictError",
        "Handler",
        "IdempotencyStore",
        "InProgress",
        "JSON",
        "KEY_FIELD",
        "NotClaimed",
        "Once",
        "OptimisticStats",
        "Partitioner",
        "Plan",
        "Reads",
        "RedisIdempotency",
        "RedisOnce",
        "RowMissing",
        "SqlIdempotency",
        "SqlOnce",
        "StaleVersion",
        "StopSignal",
        "StreamProducer",
        "StreamWorker",
        "WorkerStats",
        "aoptimistic",
        "aretry_optimistic",
        "current_claim",
        "fair_share",
        "idempotency_table",
        "idempotent",
        "optimistic",
        "partition_lock_name",
        "partition_stream",
        "retry_optimistic",
        "versioned_update",
    ],
    "tenure.patterns.idempotency": [
        "ClaimLost",
        "Codec",
        "IdempotencyStore",
        "InProgress",
        "JSON",
        "NotClaimed",
        "Once",
        "RedisIdempotency",
        "RedisOnce",
        "SqlIdempotency",
        "SqlOnce",
        "current_claim",
        "idempotency_table",
        "idempotent",
    ],
    "tenure.patterns.optimistic": [
        "ConflictError",
        "DEFAULT_BACKOFF",
        "DEFAULT_RETRIES",
        "OptimisticStats",
        "Plan",
        "Reads",
        "RowMissing",
        "StaleVersion",
        "Writes",
        "aoptimistic",
        "aretry_optimistic",
        "optimistic",
        "retry_optimistic",
        "versioned_update",
    ],
    "tenure.patterns.streams": [
        "Handler",
        "KEY_FIELD",
        "Partitioner",
        "StopSignal",
        "StreamProducer",
        "StreamWorker",
        "WorkerStats",
        "fair_share",
        "partition_lock_name",
        "partition_stream",
    ],
    "tenure.testing": [
        "ClusterNodeView",
        "DIE_WITH_PARENT",
        "EMBEDDED_SERVERS",
        "LocalCluster",
        "LocalNode",
        "LocalNodeError",
        "LocalRedisCluster",
        "LocalSentinelSet",
        "NodeNotAnswering",
        "Persistence",
        "SlotMigration",
        "find_server_binary",
        "server_version",
    ],
    "tenure.testing.topologies": [
        "ClusterNodeView",
        "LocalRedisCluster",
        "LocalSentinelSet",
        "SlotMigration",
        "server_version",
    ],
    "tenure.testing.local": [
        "DIE_WITH_PARENT",
        "EMBEDDED_SERVERS",
        "LocalCluster",
        "LocalNode",
        "LocalNodeError",
        "NodeNotAnswering",
        "Persistence",
        "find_server_binary",
    ],
    "tenure.testing.fake": [
        "Bus",
        "FakeNode",
        "LockKeys",
        "RETENTION_MS",
        "ZERO_ID",
        "acquire_listed",
        "acquire_lua",
        "acquire_wait_lua",
        "commit_lua",
        "eval_packed",
        "extend_lua",
        "handoff_lua",
        "history_lua",
        "observed_lua",
        "record_lua",
        "release_lua",
        "release_wait_lua",
        "script_call",
        "seed_lua",
    ],
    # The old path of tenure.testing.local, kept working.
    "tenure.local": [
        "DIE_WITH_PARENT",
        "LocalCluster",
        "LocalNode",
        "LocalNodeError",
        "Persistence",
        "find_server_binary",
    ],
    # The verifier is a command; its modules are its implementation (see its docstring).
    "tenure.verify": [],
}
PUBLIC = ["tenure", *PINNED]

# Public-looking names a public module defines but deliberately does not export, with
# the reason. Empty today: an entry here is a decision, like a name in __all__.
DELIBERATELY_PRIVATE: dict[str, set[str]] = {}

# Modules without a leading underscore that are a command's implementation, not an API:
# the CLI and the verifier's modules.
COMMANDS = re.compile(r"tenure\.(cli(\.\w+)*|demo|verify\.\w+)")


def test_public_names() -> None:
    assert tenure.__all__ == [
        "AcquireError",
        "AsyncClient",
        "AsyncLease",
        "AsyncLock",
        "Client",
        "ClientClosed",
        "ConfigurationError",
        "EventLoopConflict",
        "InheritedLease",
        "Lease",
        "LeaseExpired",
        "LeaseLost",
        "Lock",
        "LockError",
        "LockTimeout",
        "NodeMisconfigured",
        "NotHeld",
        "OwnershipError",
        "QuorumUnreachable",
        "RetryPolicy",
        "SelfDeadlock",
        "ServerUnsupported",
        "StaleToken",
        "StoreError",
        "StoreRefused",
        "StoreUnavailable",
        "TLSCertificateError",
        "TenureError",
        "wait_random",
        "wait_random_exponential",
    ]
    for name in tenure.__all__:
        assert getattr(tenure, name) is not None


def test_every_error_is_exported() -> None:
    assert set(_errors.__all__) <= set(tenure.__all__)
    for name in _errors.__all__:
        assert issubclass(getattr(tenure, name), tenure.TenureError)


@pytest.mark.parametrize("module", PINNED)
def test_pinned_all(module: str) -> None:
    names = importlib.import_module(module).__all__
    assert sorted(names) == PINNED[module]
    assert len(set(names)) == len(names), "a name listed twice"


@pytest.mark.parametrize("module", PUBLIC)
def test_every_name_in_all_exists(module: str) -> None:
    mod = importlib.import_module(module)
    assert [n for n in mod.__all__ if not hasattr(mod, n)] == []


def _unexported(module: str) -> list[str]:
    """Public classes and functions of ``module`` missing from its ``__all__``: those it
    defines, and those it takes from a private module (``tenure._sync.client.Client`` in
    ``tenure``) unless ``tenure`` exports them. What it takes from a public module is that
    module's to export."""
    mod = importlib.import_module(module)
    exported_by_tenure = {id(getattr(tenure, n)) for n in tenure.__all__}
    missing = []
    for name, obj in vars(mod).items():
        if name.startswith("_") or not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        home = getattr(obj, "__module__", "") or ""
        private_home = (
            home.startswith("tenure.")
            and any(part.startswith("_") for part in home.split("."))
            and (module == "tenure" or id(obj) not in exported_by_tenure)
        )
        if (home == module or private_home) and name not in mod.__all__:
            missing.append(name)
    return sorted(set(missing) - DELIBERATELY_PRIVATE.get(module, set()))


@pytest.mark.parametrize("module", PUBLIC)
def test_every_public_definition_is_exported(module: str) -> None:
    assert _unexported(module) == [], f"{module}: public but not in __all__"


def test_an_unexported_definition_is_noticed(monkeypatch: pytest.MonkeyPatch) -> None:
    def spare() -> None:
        """Not in ``tenure.testing.local.__all__``."""

    spare.__module__ = "tenure.testing.local"
    monkeypatch.setattr("tenure.testing.local.spare", spare, raising=False)
    assert _unexported("tenure.testing.local") == ["spare"]


def test_every_public_module_is_pinned() -> None:
    """A new module without a leading underscore is an API decision: make it here."""
    undecided = [
        m.name
        for m in pkgutil.walk_packages(tenure.__path__, "tenure.")
        if not any(part.startswith("_") for part in m.name.split("."))
        and m.name not in PINNED
        and not COMMANDS.fullmatch(m.name)
    ]
    assert undecided == []

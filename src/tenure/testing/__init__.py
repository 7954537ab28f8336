"""Test harnesses for code that uses tenure: real local servers and a fake node.

Two tools, versioned with the package (their behaviour follows tenure's releases):

* :mod:`tenure.testing.local` starts, stops, pauses, kills and restarts real
  ``redis-server`` processes on loopback (:class:`LocalNode`, :class:`LocalCluster`),
  for integration tests with real faults. Its public names are re-exported here.
* :mod:`tenure.testing.topologies` starts whole deployments from the same servers: a
  master with replicas under Sentinel (:class:`LocalSentinelSet`) and a Redis Cluster
  (:class:`LocalRedisCluster`), with their faults: failovers, crashes, slot migrations.
  Its public names are re-exported here.
* :mod:`tenure.testing.fake` is a pure-Python node that runs tenure's server scripts on
  a clock the test controls, for model tests of many nodes in one process. Import it
  from its module (``from tenure.testing.fake import FakeNode``): it is a separate tool,
  and its names say what they mirror only next to their module's name.

``tenure.local`` is the old path of :mod:`tenure.testing.local`, kept working.
"""

from __future__ import annotations

from .local import (
    DIE_WITH_PARENT,
    EMBEDDED_SERVERS,
    LocalCluster,
    LocalNode,
    LocalNodeError,
    NodeNotAnswering,
    Persistence,
    find_server_binary,
)
from .topologies import (
    ClusterNodeView,
    LocalRedisCluster,
    LocalSentinelSet,
    SlotMigration,
    server_version,
)

__all__ = [
    "DIE_WITH_PARENT",
    "EMBEDDED_SERVERS",
    "ClusterNodeView",
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
]

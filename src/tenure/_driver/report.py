"""Telling people once about a node that is misconfigured, while locking goes on without it.

A node that fails for its configuration (``_core.diagnosis``) fails every round until
someone fixes it. When the other nodes still form a majority, nothing raises, so the one
place it shows is the ``tenure`` logger: one warning per node and kind of problem, per
client, naming the node and the fix. When such nodes leave no majority, the round's
caller raises ``NodeMisconfigured`` naming them all instead, and nothing is logged: a
warning that "locks need a majority of the other nodes" would be untrue there, and
``tenure run`` promises one line on stderr for its own errors.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from .._core.config import DEFAULT_KEY_PREFIX
from .._core.diagnosis import Diagnosis, naming
from .._core.quorum import Failure, Round

__all__ = ["NodeReporter"]

log = logging.getLogger("tenure")


class NodeReporter:
    """Logs each misconfigured node of one client once (per node and kind of failure)."""

    __slots__ = ("_names", "_prefix", "_told")

    def __init__(self, names: Sequence[str], prefix: str = DEFAULT_KEY_PREFIX) -> None:
        self._names = list(names)
        self._prefix = prefix  # the client's key prefix, for an ACL fix
        self._told: set[tuple[int, Failure, bool]] = set()

    def round(self, rnd: Round) -> None:
        """Note the configuration failures of a finished round."""
        if not rnd.failed:
            return  # nearly every round: nothing to look at
        if rnd.misconfigured_blocks_quorum():
            return  # the error raised names them (told once a round goes on without them)
        for i, r in enumerate(rnd.results):
            if r is not None and r.failure is not None and r.failure.configuration:
                self.note(i, r.failure, r.detail)

    def late(self, node: int, why: Diagnosis) -> None:
        """An error reply that came after its round was over: a configuration failure is
        told all the same. A misconfigured node that is also slow may answer every round
        late, and its problem would otherwise never be told."""
        if why.failure.configuration:
            self.note(node, why.failure, why.detail)

    def note(self, node: int, failure: Failure, detail: str, notifications: bool = False) -> None:
        """Warn about ``node`` unless this client already did for this kind of failure
        (of its ``notifications`` connection, or of its lock commands)."""
        key = (node, failure, notifications)
        if key in self._told:
            return
        # A set's add is atomic; two threads racing here at worst both warn once.
        self._told.add(key)
        # A subscription refused (an ACL without the channel) costs only the wake-ups:
        # the node still locks, and its lock commands' own failures are told apart.
        log.warning(
            "%s (notifications); until it is fixed, waiters re-check for locks it releases"
            if notifications
            else "%s; until it is fixed, locks need a majority of the other nodes",
            naming(self._names[node], failure, detail, self._prefix),
        )

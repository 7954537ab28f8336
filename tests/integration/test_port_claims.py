"""Port claims (tenure.testing._ports): a local node's port is not handed to another
process's harness while the node may start again, and no claim outlives its process.

The other process is a real child Python process claiming through the same module, as
another pytest-xdist worker would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tenure.testing import LocalCluster
from tenure.testing._ports import _directory, claim, claim_free_port, claim_free_port_pair

HOST = "127.0.0.1"

# Claims the ports given as arguments, says whether it could, and holds them until its
# stdin closes.
_CLAIMER = textwrap.dedent(
    """
    import sys
    from tenure.testing._ports import claim
    held = claim(*map(int, sys.argv[1:]))
    print("claimed" if held is not None else "refused", flush=True)
    sys.stdin.read()
    """
)


@contextmanager
def _elsewhere(*ports: int) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Another process trying to claim ``ports``: what it said, and the process (which
    holds what it claimed until the block ends)."""
    child = subprocess.Popen(
        [sys.executable, "-c", _CLAIMER, *map(str, ports)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        yield child.stdout.readline().strip(), child
    finally:
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.close()  # it exits, and lets go of its claim on the way out
        try:
            child.wait(timeout=30)
        finally:
            child.kill()  # a no-op once it has been reaped
            child.stdout.close()


def _claimable_elsewhere(*ports: int) -> bool:
    with _elsewhere(*ports) as (said, _):
        assert said in ("claimed", "refused"), said
        return said == "claimed"


def test_a_killed_nodes_port_is_not_handed_out_until_its_cluster_closes() -> None:
    with LocalCluster(1) as cluster:
        node = cluster[0]
        assert node.port is not None
        port = node.port
        node.kill()  # nothing listens there now: the kernel would hand the port out
        assert not _claimable_elsewhere(port)
        node.start()  # and the node comes back on it
        assert node.port == port
    assert _claimable_elsewhere(port)  # closed: its directory is gone, it never restarts


def test_a_claim_dies_with_its_process_however_it_dies() -> None:
    mine = claim_free_port(HOST)
    port = mine.port
    mine.release()
    with _elsewhere(port) as (said, child):
        assert said == "claimed"
        assert claim(port) is None
        child.send_signal(signal.SIGKILL)  # no Python runs: the kernel drops the lock
        child.wait()
        taken = claim(port)
        assert taken is not None
        taken.release()


def test_a_pair_claimed_elsewhere_is_never_picked() -> None:
    free = claim_free_port_pair(HOST, 10000, 20000, 55535)
    port = free.port
    free.release()
    with _elsewhere(port + 10000) as (said, _):  # only the bus port is held
        assert said == "claimed"
        with pytest.raises(OSError, match="found no free pair"):
            claim_free_port_pair(HOST, 10000, port, port + 1)
    taken = claim_free_port_pair(HOST, 10000, port, port + 1)
    assert taken.ports == (port, port + 10000)
    taken.release()


def test_claims_are_all_or_none_and_released_claims_leave_no_file() -> None:
    held = claim_free_port(HOST)
    assert claim(held.port) is None  # one process, two claims: refused all the same
    spare = claim_free_port(HOST)
    free = spare.port
    spare.release()
    assert claim(free, held.port) is None
    assert _claimable_elsewhere(free)  # the refusal kept none of the ports it asked for
    assert not _claimable_elsewhere(held.port)  # nor gave up the one held before it
    held.release()
    held.release()  # a no-op
    again = claim(held.port)
    assert again is not None
    directory = _directory()
    assert directory is not None
    assert (directory / str(held.port)).exists()
    again.release()
    assert not (directory / str(held.port)).exists()
    assert not (directory / str(free)).exists()


def test_a_forked_child_leaves_its_parents_claims_alone() -> None:
    mine = claim_free_port(HOST)
    pid = os.fork()
    if pid == 0:  # the child runs the claim's finalizer, as its normal exit would
        mine.release()
        os._exit(0)  # (and skips the exit handlers, which would run pytest's)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not _claimable_elsewhere(mine.port)  # the parent's lock and file are intact
    directory = _directory()
    assert directory is not None
    assert (directory / str(mine.port)).exists()
    mine.release()
    assert _claimable_elsewhere(mine.port)


def test_a_new_process_sweeps_the_files_of_dead_claimers_and_keeps_live_ones() -> None:
    directory = _directory()
    assert directory is not None
    spares = [claim_free_port(HOST) for _ in range(2)]
    dead, live = (spare.port for spare in spares)
    for spare in spares:
        spare.release()
    with _elsewhere(dead) as (said, child):
        assert said == "claimed"
        child.send_signal(signal.SIGKILL)  # no Python runs: its file stays behind
        child.wait()
    assert (directory / str(dead)).exists()
    with _elsewhere(live) as (said, _):
        assert said == "claimed"
        sweep = "from tenure.testing._ports import _directory; _directory()"
        subprocess.run([sys.executable, "-c", sweep], check=True, timeout=60)
        assert not (directory / str(dead)).exists()
        assert (directory / str(live)).exists()
        assert claim(live) is None  # still held, through the sweep

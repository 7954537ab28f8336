"""A process with more than 1024 files open.

``select()`` takes descriptors below 1024 only, and a server process with many clients
of its own opens every connection of ours above that. Both clients work there: rounds
on several nodes, a fair waiter woken by the release (the notification sockets), and the
looks at a socket that do not wait.
"""

from __future__ import annotations

import os
import resource
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tenure._driver.ready import ready
from tenure._driver.redis_compat import has_unread
from tenure.testing import LocalCluster

from .conftest import Api
from .test_waiting import _queued_on_a_majority, _release_raw, _wait_until

BOUND = 1024  # select()'s FD_SETSIZE on Linux
NEEDED = 2048  # open files the test needs: the bound, and room above it


@pytest.fixture
def crowded() -> Iterator[None]:
    """Files held open until the next descriptor is above ``select()``'s bound."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < NEEDED:
        pytest.skip(f"the hard limit of open files is {hard}; the test needs {NEEDED}")
    if soft != resource.RLIM_INFINITY and soft < NEEDED:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NEEDED, hard))
    held: list[int] = []
    try:
        while not held or held[-1] <= BOUND:
            held.append(os.open(os.devnull, os.O_RDONLY))
        yield
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_locks_on_three_nodes_with_every_socket_above_select_bound(
    crowded: None, api: Api, shared5: LocalCluster, key: str
) -> None:
    """The blocking client's rounds raised ``ValueError`` from ``select()``."""
    urls = shared5.urls[:3]
    holder = api.client(urls).acquire(key, ttl=10.0)
    waiter = api.client(urls, recheck=20.0, node_timeout=0.9)
    released_at: list[float] = []

    def release_once_waiting() -> None:
        _wait_until(lambda: _queued_on_a_majority(shared5, 3, key))
        released_at.append(time.monotonic())
        _release_raw(shared5, 3, key, holder, fair=True)

    thread = threading.Thread(target=release_once_waiting)
    thread.start()
    lease = waiter.acquire(key, ttl=2.0, timeout=15.0)
    got = time.monotonic()
    thread.join()
    # Woken by the release's notification, far before the 20 s re-check.
    assert got - released_at[0] < 2.0
    assert lease.fencing_token > holder.fencing_token
    lease.release()


def test_a_look_that_does_not_wait_sees_what_waits_above_select_bound(crowded: None) -> None:
    """``has_unread`` said "nothing" of such a socket (``select()`` refused it, taken
    for a socket closed meanwhile): a client that ran late blamed its nodes."""
    ours, node = socket.socketpair()
    try:
        assert ours.fileno() > BOUND
        assert not has_unread(ours)
        node.sendall(b"+OK\r\n")
        assert has_unread(ours)
        assert ready((), (ours,), 0) == [ours]  # what the flusher waits for: room to write
        ours.close()
        assert not has_unread(ours)
    finally:
        ours.close()
        node.close()

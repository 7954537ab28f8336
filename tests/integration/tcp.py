"""What the kernel's table of TCP sockets (/proc/net/tcp) says of a local node's connections."""

from __future__ import annotations

from collections.abc import Iterator

from tenure.testing import LocalNode

__all__ = ["connections_held_to", "unread"]


def _sockets() -> Iterator[list[str]]:
    """The fields of every TCP socket's line (IPv4 and IPv6): local and remote address,
    state, queues, ..., inode."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            next(lines)  # the header
            for line in lines:
                yield line.split()


def unread(node: LocalNode) -> int:
    """Bytes clients wrote to ``node`` that it has not read yet: the receive queues of its
    connections. A frozen node's queue grows with every command sent to it."""
    port = f":{node.port:04X}"
    total = 0
    for fields in _sockets():
        local, state, queues = fields[1], fields[3], fields[4]
        if local.endswith(port) and state == "01":  # ESTABLISHED, on the node's side
            total += int(queues.split(":")[1], 16)
    return total


def connections_held_to(node: LocalNode, *, shut: bool = False) -> int:
    """Connections to ``node`` that a process holds open (a socket with an inode; one
    closed and waiting out its end has none), ``shut`` for writing only (FIN_WAIT1 or
    FIN_WAIT2: lingering). The node's own are to other ports, and a frozen node's not
    yet accepted have none."""
    port = f":{node.port:04X}"
    held = 0
    for fields in _sockets():
        remote, state, inode = fields[2], fields[3], fields[9]
        if remote.endswith(port) and inode != "0":
            held += not shut or state in ("04", "05")
    return held

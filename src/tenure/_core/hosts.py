"""One ``host[:port]`` of a node URL's host list: a Redis Cluster's seeds, the Sentinels."""

from __future__ import annotations

__all__ = ["REDIS_PORT", "parse_host"]

REDIS_PORT = 6379  # a Redis server's port when a URL names none


def parse_host(item: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``, as ``(host, port)``.

    Raises:
        ValueError: it is not one of those; the text says why.
    """
    if not item:
        raise ValueError("names an empty host (nothing between two commas, or none at all)")
    if item.startswith("["):
        close = item.find("]")
        if close < 0:
            raise ValueError(f"host {item!r}: an IPv6 address needs its closing ']'")
        host, port_text = item[1:close], item[close + 1 :]
        if port_text and not port_text.startswith(":"):
            raise ValueError(f"host {item!r}: expected ':port' after ']'")
        port_text = port_text[1:]
    else:
        host, colon, port_text = item.rpartition(":")
        if not colon:
            host, port_text = item, ""
        if ":" in host:
            raise ValueError(f"host {item!r}: write an IPv6 address in brackets ([::1]:7000)")
    if not host:
        raise ValueError(f"{item!r} names no host")
    if "@" in host or any(c.isspace() for c in host):
        raise ValueError(f"{item!r} is not a host name or address")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise ValueError(f"{item!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"{item!r}: port must be in 1..65535")
    return host, port

"""The shared register the verifier's workers read-modify-write, on a store kept out of faults.

The register is the list of operation ids that were written into it: a worker reads the
list, appends its own operation id, and writes the list back. A write that started from
a stale read drops whatever was appended meanwhile, so the final list shows every lost
update by name (C5).

Each write is one ``MULTI``/``EXEC`` transaction of two commands: the write itself, and
an ``INCR`` of a sequence counter. ``EXEC`` runs them back to back with nothing in
between, so the counter numbers the store's writes in the order the store applied them:
the store's own log, which C3 reads. In *fenced* mode the write is
``tenure.fencing``'s own fenced-write script (refused when the token is older than the
highest seen); in *unfenced* mode it is a plain ``SET``, which accepts anything.
"""

from __future__ import annotations

import redis

from ..fencing.redis_store import fenced_keys, fenced_write_args

__all__ = ["Register", "WriteResult"]

WriteResult = tuple[str, int | None]
"""``(outcome, seq)``: outcome "ok", "stale" or "error"; seq the store's order number."""


class Register:
    """A worker's handle on the register.

    Args:
        url: the store node.
        fenced: refuse writes whose token is older than the highest accepted.
        resource: the register's name (several registers may share a store).
        timeout: socket timeout in seconds; the store is never faulted, so this only
            bounds a worker that would otherwise hang.
    """

    def __init__(self, url: str, *, fenced: bool, resource: str, timeout: float = 5.0) -> None:
        self.fenced = fenced
        self.resource = resource
        self._value_key, _ = fenced_keys(resource, "verify")
        self._seq_key = f"verify:{{{resource}}}:seq"
        self._r = redis.Redis.from_url(url, socket_timeout=timeout)

    def read(self) -> list[str]:
        raw = self._r.get(self._value_key)
        return decode(raw)

    def write(self, ops: list[str], token: int | None) -> WriteResult:
        value = ",".join(ops)
        try:
            with self._r.pipeline(transaction=True) as pipe:
                if self.fenced:
                    if token is None:
                        raise ValueError("a fenced register needs a fencing token")
                    pipe.eval(*fenced_write_args(self.resource, token, value, "verify"))
                else:
                    pipe.set(self._value_key, value)
                pipe.incr(self._seq_key)
                reply, seq = pipe.execute()
        except redis.RedisError:
            return "error", None
        if self.fenced and not int(reply[0]):
            return "stale", int(seq)
        return "ok", int(seq)

    def close(self) -> None:
        self._r.close()


def decode(raw: bytes | str | None) -> list[str]:
    if not raw:
        return []
    text = raw.decode() if isinstance(raw, bytes) else raw
    return text.split(",")

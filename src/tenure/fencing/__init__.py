"""Fencing tokens enforced at the storage: writes from superseded leases are refused.

A lease's fencing token increases with every grant of its lock. A fenced store keeps,
per resource, the highest token that has written it and accepts a write only if its
token is **greater than or equal to** that (equal: the same lease writing again); an
older token raises :class:`tenure.StaleToken` and writes nothing.

* :class:`FencedStore` / :class:`AsyncFencedStore`: values on Redis, checked by a Lua
  script (:mod:`tenure.fencing.redis_store`).
* SQL databases through SQLAlchemy (``pip install 'tenure[sql]'``): import
  :mod:`tenure.fencing.sql` (``fenced_update``, ``fenced_execute``, ``FencedMixin``,
  ``fence``); it is not imported here, so this package does not need SQLAlchemy.
* Stores that cannot check tokens themselves: :class:`FencingGate`, ASGI middleware that
  answers 409 to an older token, and :class:`FencingProxy`, the same in front of an
  upstream HTTP server (:mod:`tenure.fencing.http`; the proxy needs ``httpx``).
"""

from .http import FencingGate, FencingProxy, TokenBook
from .redis_store import MAX_TOKEN, AsyncFencedStore, FencedStore, fenced_keys, fenced_write_args

__all__ = [
    "MAX_TOKEN",
    "AsyncFencedStore",
    "FencedStore",
    "FencingGate",
    "FencingProxy",
    "TokenBook",
    "fenced_keys",
    "fenced_write_args",
]

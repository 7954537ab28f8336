"""Objects that wrap this process's live connections: shared by copy, never pickled.

A client, a fenced store, an idempotency store, a stream producer or worker holds
sockets, threads and locks of the process that made it. Copying a structure holding one
(``copy.deepcopy`` of a settings object, say) shares it, as copying a structure holding
a ``threading.Lock`` would want to: a second object would share the first one's
connections but not its state. Pickling one, as a process pool or a spawned Process does
with its arguments, failed deep inside on redis-py's ``cannot pickle '_thread.RLock'
object``, which named neither the object nor what to do instead; it now says both.
"""

from __future__ import annotations

from typing import NoReturn, TypeVar

__all__ = ["ProcessBound"]

P = TypeVar("P", bound="ProcessBound")


class ProcessBound:
    """Mixin: a copy is the object itself; pickling it raises a ``TypeError`` saying what
    to make in the worker instead (``_remade_from``)."""

    __slots__ = ()

    def __copy__(self: P) -> P:
        return self

    def __deepcopy__(self: P, memo: object) -> P:
        return self

    def _remade_from(self) -> tuple[str, str]:
        """What a worker makes its own one from, and what to pass it rather than this
        object: ``("the same nodes", "the node URLs rather than the client")``."""
        raise NotImplementedError

    def __reduce__(self) -> NoReturn:
        kind = type(self).__name__
        source, instead = self._remade_from()
        raise TypeError(
            f"a {kind} belongs to the process that made it and cannot be pickled (as the "
            f"argument of a process pool's task or of a spawned Process is); make a {kind} "
            f"in the worker from {source}: at module level, or in the pool's initializer, "
            f"and pass {instead}"
        )

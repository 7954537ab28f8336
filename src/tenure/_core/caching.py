"""What the client's caches keep: the text of names up to ``CACHED_CHARS`` characters.

The caches that make a round cheap are keyed by lock names (their keys, their slot, their
spec) and bounded by a count of entries. Names may be up to 64 KiB, so a count alone
would let a few thousand long names hold gigabytes, for the life of the process. Entity
names are short; a long one is encoded again at each use instead, which costs its
length in time, not the process its length times the cache's size in memory.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import TypeVar

__all__ = ["CACHED_CHARS", "by_length", "text_cache"]

CACHED_CHARS = 1024

Text = TypeVar("Text", bound=str | tuple[str, ...])
R = TypeVar("R")


def by_length(cached: Callable[[Text], R], function: Callable[[Text], R]) -> Callable[[Text], R]:
    """``cached`` (a cache of ``function``) for a text or a tuple of texts up to
    ``CACHED_CHARS`` in all, ``function`` itself, afresh at each call, for a longer one."""

    def call(arg: Text) -> R:
        size = len(arg) if isinstance(arg, str) else sum(map(len, arg))
        return function(arg) if size > CACHED_CHARS else cached(arg)

    call.__doc__ = function.__doc__
    return call


def text_cache(maxsize: int) -> Callable[[Callable[[Text], R]], Callable[[Text], R]]:
    """``lru_cache(maxsize)`` for a function of a text or a tuple of texts, but for one
    longer than ``CACHED_CHARS`` in all (``by_length``)."""

    def wrap(function: Callable[[Text], R]) -> Callable[[Text], R]:
        return by_length(lru_cache(maxsize=maxsize)(function), function)

    return wrap

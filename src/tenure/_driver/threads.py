"""Starting the drivers' helper threads, also while the interpreter ends.

Python 3.12 refuses to start a thread once the interpreter has begun to end ("can't
create new thread at interpreter shutdown"), and that includes the time it waits for the
program's non-daemon threads to finish. The blocking client's cleanup thread is one such
thread (a program that ends of a Ctrl-C waits for the release it sends), and the
connection it may need is set up in a thread of its own: refused, the release was lost,
the lock then held until its TTL. (3.11 and 3.13 start it.) So a helper thread that
cannot be started says so, and its caller does the work itself, in the thread it is in,
or goes without.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["start_thread"]


def start_thread(
    target: Callable[[], object], name: str, *, daemon: bool = True
) -> threading.Thread | None:
    """Run ``target`` in a new thread named ``name`` (a daemon unless told otherwise),
    and return it; None (nothing started) if Python refuses a new thread: the
    interpreter is ending, or the process is out of threads."""
    thread = threading.Thread(target=target, name=name, daemon=daemon)
    try:
        thread.start()
    except RuntimeError:
        return None
    return thread

"""Which acquires written to one connection in one go may run as one script on the node.

The asyncio client writes the commands that its tasks make in one turn of the event loop
to each node in one write. The acquires among them can run as one script run
(acquire_batch.lua): the node then spends one command's overhead, and one look at its
replication history, on all of them instead of on each (``commands.acquire_batch``).

A batch sits where its first acquire was written; the acquires that join it move ahead
of whatever was written between. That is safe for acquires of other locks: the tasks of
one event loop write in whatever order they happen to run, so any order of their
commands is one they could have been written in. It is not safe for a command on the
same lock: a cancelled acquire's cleanup release is written right behind its acquire,
and an acquire that overtook it would be released by it. So an acquire joins only if
nothing written since the batch opened has its key, and a command whose key is not known
(none given) closes the batch. Every command keeps its order with the others of its own
lock, which is all a task relies on.

Only for a plain node: the keys of one script run must share a Cluster slot, and the
locks of a batch do not.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from .commands import Command, acquire_batch

__all__ = ["Batch"]

Callback = TypeVar("Callback")


class Batch(Generic[Callback]):
    """Acquires to write as one command, with the callback of each (opaque here)."""

    __slots__ = ("_closed", "_passed", "callbacks", "commands")

    def __init__(self) -> None:
        self.commands: list[Command] = []
        self.callbacks: list[Callback] = []
        self._passed: set[str] = set()  # keys of commands written since it opened, not in it
        self._closed = False

    def join(self, command: Command, callback: Callback) -> bool:
        """Add the acquire ``command``, written now, if it may join; False if not."""
        if self._closed or command.key in self._passed:
            return False
        self.commands.append(command)
        self.callbacks.append(callback)
        return True

    def passed(self, command: Command) -> None:
        """``command`` was written after the batch opened, outside it: a later acquire of
        its lock must not overtake it."""
        if command.key:
            self._passed.add(command.key)
        else:
            self._closed = True

    def command(self) -> Command:
        """What to write: the one acquire itself, or all of them as one script run."""
        commands = self.commands
        return commands[0] if len(commands) == 1 else acquire_batch(commands)

"""Which commands written to one connection in one go may run as one script on the node.

The asyncio client writes the commands that its tasks make in one turn of the event loop
to each node in one write. The acquires among them can run as one script run
(acquire_batch.lua), and so can the releases (release_batch.lua): the node then spends
one command's overhead on all of them instead of on each, the acquires one look at the
node's own keys, the releases one read and hash of the script's body
(``commands.batch``).

A batch sits where its first command was written; the commands that join it move ahead
of whatever was written between. That is safe for the commands of other locks: the tasks
of one event loop write in whatever order they happen to run, so any order of their
commands is one they could have been written in. It is not safe for a command on the
same lock: a cancelled acquire's cleanup release is written right behind its acquire,
and an acquire that overtook it would be released by it. So a command joins only if
nothing written since the batch opened has its key, and a command whose key is not known
(none given) closes the batch. Every command keeps its order with the others of its own
lock, which is all a task relies on. (An acquire and a release are never in one batch:
they run different scripts; each kind has its own batch, and to each the other's
commands are commands written between.)

Only for a plain node: the keys of one script run must share a Cluster slot, and the
locks of a batch do not.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from .commands import Command, batch

__all__ = ["MAX_BATCH", "Batch", "Batches"]

# The most commands in one batch. A script run holds the node: nothing else runs there
# until it ends, every other client waits. 64 acquires take the node about 0.4 ms on
# Valkey 9 (6.5 µs each); a busier turn opens another batch.
MAX_BATCH = 64

Callback = TypeVar("Callback")


class Batch(Generic[Callback]):
    """Commands of one batch script (their ``Command.item``'s first field) to write as one
    command, with the callback of each (opaque here)."""

    __slots__ = ("_closed", "_passed", "callbacks", "commands", "script")

    def __init__(self, script: str) -> None:
        self.script = script
        self.commands: list[Command] = []
        self.callbacks: list[Callback] = []
        self._passed: set[str] = set()  # keys of commands written since it opened, not in it
        self._closed = False

    def passed(self, command: Command) -> None:
        """``command`` was written after the batch opened, outside it: a later command of
        its lock must not overtake it."""
        if command.key:
            self._passed.add(command.key)
        else:
            self._closed = True

    @property
    def alone(self) -> bool:
        """A batch of one goes as that command: its own form, its own reply."""
        return len(self.commands) == 1

    def command(self) -> Command:
        """What to write: the one command itself, or all of them as one script run."""
        return self.commands[0] if self.alone else batch(tuple(self.commands))


class Batches(Generic[Callback]):
    """The batches open in one turn of writes to a connection: at most one per batch
    script, each where its first command was written."""

    __slots__ = ("open",)

    def __init__(self) -> None:
        self.open: dict[str, Batch[Callback]] = {}  # by batch script

    def join(self, command: Command, callback: Callback) -> Batch[Callback] | None:
        """Put ``command`` (one with an ``item``), written now, into its script's batch.

        Returns the batch it opened, for the caller to place in the order of writes
        here; None when it joined one already placed. To the other script's batch it is
        a command written between.
        """
        # Batch.passed written out, and the only test of who may join: this runs for
        # every command of a busy asyncio client (a method call each cost 2% of its
        # instructions per cycle, callgrind).
        item = command.item
        assert item is not None
        script, key = item[0], command.key
        batches = self.open
        current = batches.get(script)
        if len(batches) > (current is not None):
            for other in batches.values():
                if other is not current:
                    if key:
                        other._passed.add(key)
                    else:
                        other._closed = True
        if (
            current is not None
            and not current._closed
            and key not in current._passed
            and len(current.commands) < MAX_BATCH
        ):
            current.commands.append(command)
            current.callbacks.append(callback)
            return None
        opened = batches[script] = Batch(script)
        opened.commands.append(command)
        opened.callbacks.append(callback)
        return opened

    def passed(self, command: Command) -> None:
        """``command`` was written alone: no open batch's command may overtake it."""
        for open_batch in self.open.values():
            open_batch.passed(command)

    def clear(self) -> None:
        """The turn's writes went out: the next command opens new batches."""
        self.open.clear()

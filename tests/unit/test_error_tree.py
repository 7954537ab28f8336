"""The exception tree drawn in ``tenure._errors``'s docstring is the real one.

Every ``TenureError`` subclass anywhere in the package (after importing every module)
appears in the drawing, under its real parent and with its built-in base; and every
class drawn exists. A new error class, or one moved in the hierarchy, fails here until
the drawing says so.
"""

from __future__ import annotations

import copy
import importlib
import pickle
import pkgutil
import re
import threading

import pytest

import tenure
from tenure import _errors

# A node of the drawing: its tree prefix, its name, and its built-in base in parentheses.
NODE = re.compile(r"^(?P<prefix>[ │├└─]*)(?P<name>[A-Z]\w+)(?: \((?P<builtin>\w+)\))?")


def drawn_tree(doc: str) -> dict[str, tuple[str | None, str | None]]:
    """name -> (drawn parent, drawn built-in base) for each class in the drawing."""
    block = doc.split("::", 1)[1]
    lines = []
    for line in block.splitlines()[1:]:
        if line and not line.startswith("    "):
            break  # the end of the literal block
        lines.append(line[4:])
    tree: dict[str, tuple[str | None, str | None]] = {}
    stack: list[str] = []  # the last class seen at each depth
    for line in lines:
        node = NODE.match(line)
        if node is None:
            continue  # a description continued, a section heading, a blank line
        depth = len(node["prefix"]) // 4
        del stack[depth:]
        assert len(stack) == depth, f"{node['name']!r} is drawn under no parent"
        assert node["name"] not in tree, f"{node['name']!r} is drawn twice"
        tree[node["name"]] = (stack[-1] if stack else None, node["builtin"])
        stack.append(node["name"])
    return tree


def real_tree() -> dict[str, tuple[str | None, str | None]]:
    """name -> (parent, built-in base) for TenureError and every subclass in the package."""
    for module in pkgutil.walk_packages(tenure.__path__, "tenure."):
        importlib.import_module(module.name)
    tree: dict[str, tuple[str | None, str | None]] = {"TenureError": (None, None)}
    todo = [tenure.TenureError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            ours = [b.__name__ for b in sub.__bases__ if issubclass(b, tenure.TenureError)]
            builtins = [b.__name__ for b in sub.__bases__ if b.__module__ == "builtins"]
            assert len(ours) == 1, f"{sub} has bases {sub.__bases__}"
            assert len(builtins) <= 1, f"{sub} has bases {sub.__bases__}"
            assert sub.__name__ not in tree, f"two error classes named {sub.__name__}"
            tree[sub.__name__] = (ours[0], builtins[0] if builtins else None)
            todo.append(sub)
    return tree


def test_every_error_class_is_drawn_in_place() -> None:
    assert _errors.__doc__ is not None
    drawn, real = drawn_tree(_errors.__doc__), real_tree()
    assert sorted(set(real) - set(drawn)) == [], "error classes missing from the drawing"
    assert sorted(set(drawn) - set(real)) == [], "classes drawn that do not exist"
    for name, (parent, builtin) in real.items():
        assert drawn[name] == (parent, builtin), (
            f"{name}: drawn under {drawn[name][0]} ({drawn[name][1]}), is a {parent} ({builtin})"
        )


@pytest.mark.parametrize(
    ("drawing", "parsed"),
    [
        (
            "::\n\n    RootError\n    ├── AError (ValueError)   text\n    │   └── BError\n"
            "    │                text (C)\n    │\n    │   heading\n    └── DError\n\nAfter.",
            {
                "RootError": (None, None),
                "AError": ("RootError", "ValueError"),
                "BError": ("AError", None),
                "DError": ("RootError", None),
            },
        ),
    ],
)
def test_the_drawing_is_read_as_drawn(
    drawing: str, parsed: dict[str, tuple[str | None, str | None]]
) -> None:
    assert drawn_tree(drawing) == parsed


@pytest.mark.parametrize(
    "error",
    [
        tenure.ConfigurationError("ttl", "must be > 0, got 0"),
        tenure.NodeMisconfigured("redis://a:1", "is a read-only replica", {"redis://b:2": "x"}),
        tenure.ServerUnsupported("redis://a:1", "refused EVALSHA"),
        tenure.StaleToken("account:7", 3, 5),
        tenure.ClientClosed("acquire", "orders:42"),
        tenure.EventLoopConflict("acquire", "orders:42"),
        tenure.EventLoopConflict("keep it alive", "orders:42", no_loop=True),
        tenure.LockTimeout("orders:42", "granted by 0 of 3 nodes", {"redis://a:1": "held"}),
        tenure.QuorumUnreachable("orders:42", "2 of 3 nodes failed"),
        tenure.SelfDeadlock("orders:42", "this thread holds it", threading.Lock()),
        tenure.NotHeld("orders:42", "already released"),
        tenure.LeaseLost("orders:42", "extend failed"),
        tenure.LeaseExpired("orders:42", "its validity ended"),
        tenure.InheritedLease("orders:42", "release", 1234),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_error_survives_pickle_and_copy(error: tenure.TenureError) -> None:
    """A process pool's worker sends its error back by pickle: one that cannot be made
    again (its ``__init__`` does not take its ``args``) broke the whole pool."""
    for back in (pickle.loads(pickle.dumps(error)), copy.deepcopy(error)):
        assert type(back) is type(error)
        assert str(back) == str(error)
        for key, value in vars(error).items():
            if key == "holder":  # a lock, or a lease: only its description can cross
                assert vars(back)[key] == repr(value)
            else:
                assert vars(back)[key] == value
    # Within the process a copy keeps each attribute itself (a SelfDeadlock's lease).
    shallow = copy.copy(error)
    assert type(shallow) is type(error)
    assert str(shallow) == str(error)
    assert vars(shallow).keys() == vars(error).keys()
    assert all(vars(shallow)[key] is value for key, value in vars(error).items())

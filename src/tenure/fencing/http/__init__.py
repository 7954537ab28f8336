"""An HTTP gate that enforces fencing tokens for stores that cannot check them themselves.

Theory of operation
-------------------

A fencing token is an int minted with every lock acquisition, strictly increasing in the
order the locks for one resource were granted. A store that remembers the highest token
it has seen per resource and refuses writes carrying a smaller one makes a superseded
holder harmless, however long it paused. Many stores (an object store, a legacy
HTTP service) cannot do that, so :class:`FencingGate` does it in front of them::

    A (token 5)  acquires ... GC pause / lease expires .............. resumes ─ PUT t=5 ─▶ 409
    B (token 6)                           acquires ─ PUT t=6 ─▶ admitted, book[r] = 6
    store                                                    ◀── B's write   (A's never arrives)

For a request with a guarded method the gate reads the token header and the resource
(the ``Fencing-Resource`` header, else a callable on the ASGI scope, else the path, which
must then be canonical: see :class:`FencingGate`), then
asks its :class:`TokenBook`: a token >= the highest seen for that resource is admitted
and becomes the highest (equal means the same lease writing again); a smaller one is
answered ``409 Conflict`` and never reaches the app. Other methods pass through.

Ordering. Checking tokens in order is not enough: two admitted requests (5, then 6) could
still overtake each other on their way to the store, and the store would apply 6 and then
5. So the gate serialises the requests *for one resource*: each waits for its turn, is
checked, and holds the turn until the app has answered. The store therefore receives one
resource's writes one at a time, with tokens that never decrease. Writes of a resource by
its rightful holder are sequential anyway; only the fault case queues. A hung app holds
its resource's turn for as long as it hangs, so bound it (FencingProxy has a timeout).
So does a slow client uploading its body while the app reads it: with ``max_body``
(always set on FencingProxy) the gate reads the body whole before taking the turn, and
refuses one over the bound with ``413`` before anything is recorded.

What the gate cannot do. The token is recorded as soon as the gate admits the request,
before the app runs. If the app then fails halfway, the gate cannot undo a partial write;
it only orders writers. A retry by the same holder with the same token is still
admitted, and every older holder stays locked out. The gate protects against slow or
paused holders, not malicious ones: a client that lies about its token or (with the
resource header) names another resource is not stopped, which is why
``resource_header=None`` exists.

Assumptions. One gate process owns a set of resources: every writer of a resource goes
through it, and it runs in one process with one event loop (an ASGI server with several
worker processes gives each its own book and breaks fencing). The book keeps one int per
resource ever seen and never forgets one, since forgetting would let a stale writer in;
its memory is not bounded. Without ``path`` it lives in memory and a restarted gate
starts empty, admitting any token once; with ``path`` every new highest token is written
to a JSON file (temp file, fsync, ``os.replace``) *before* the request is admitted.
"""

from __future__ import annotations

import inspect

from . import _gate, _tokenbook
from ._gate import ASGIApp as ASGIApp
from ._gate import FencingGate
from ._gate import Message as Message
from ._gate import Receive as Receive
from ._gate import Scope as Scope
from ._gate import Send as Send
from ._proxy import FencingProxy, RelayTimeout, UpstreamInterrupted
from ._tokenbook import TokenBook

__all__ = [
    "GATE_TOKEN_LIMIT",
    "GUARDED_METHODS",
    "FencingGate",
    "FencingProxy",
    "RelayTimeout",
    "TokenBook",
    "UpstreamInterrupted",
]

# The pieces live in _tokenbook, _gate and _proxy. The ASGI 3 types of the signatures
# (ASGIApp, Message, Receive, Scope, Send) stay importable from here, outside __all__ as
# before; the constants are documented here, where they are public.

#: Tokens must be below this. They are non-negative and fit a signed 64-bit integer, like
#: Redis ``INCR`` counters and SQL ``BIGINT`` columns. (The Redis fenced store's own
#: limit, ``tenure.fencing.MAX_TOKEN``, is lower because Lua numbers are doubles.)
GATE_TOKEN_LIMIT = _tokenbook.GATE_TOKEN_LIMIT

#: The methods a gate guards unless told otherwise (the ones that write).
GUARDED_METHODS = _gate.GUARDED_METHODS

# The classes keep this public module as their home (in reprs, pickles and the API
# reference), as before the module was split; where they are defined is an inner detail.
for _name in __all__:
    _public = globals()[_name]
    if inspect.isclass(_public):  # not the constants
        _public.__module__ = __name__
del _name, _public

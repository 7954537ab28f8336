"""Idempotency keys: a repeated request is recognised, and its effect is not applied twice.

A client that sends "deduct 100 points", times out and sends it again cannot know
whether the first one happened. If both requests carry the same idempotency key, the
server applies the effect for the first and answers the second with the first one's
recorded result. The hard part is the word *atomically*: the record that says "done"
must appear together with the effect, or a crash between them either loses the record
(the effect repeats) or keeps a record of an effect that never happened.

Theory of operation: Redis
--------------------------

One key per idempotency key, ``<namespace>:{<key>}``, holding one of::

    p:<owner>    claimed by one attempt, in progress; PX = the claim's lease
    d:<result>   done; the encoded result; PX = the retention (default one day)
    n:           done, with no result (None); PX = the retention

and next to it ``<namespace>:{<key>}:receipt`` (the same hash slot), holding the
``p:<owner>`` of the attempt that stored the record with :meth:`RedisOnce.record`; PX =
the lease, or the retention if shorter. Both share the hash tag ``{<key>}``, so a
Cluster puts them in one slot; a key starting with ``}`` would leave the tag empty, and
is refused before anything is claimed.

An attempt runs ``idem_claim.lua``: if the key is absent it sets ``p:<owner>`` with the
lease (``SET NX PX``, the owner random per attempt) and the attempt proceeds (so it does
if the key holds this attempt's own claim: the client lost the reply and ran the script
again, as redis-py does by default); if it holds a record, that is the answer; if it
holds another claim, the attempt waits (polls with jittered back-off, never past the
holder's lease) up to ``wait`` seconds, then raises :class:`InProgress`. A claim whose
holder crashed simply expires with its lease, and the next attempt takes the key over.
When the effect is done, ``idem_record.lua`` replaces our claim by the record, only if
the key still holds *our* claim (or nothing): a compare-and-set, so an attempt whose
lease ran out cannot overwrite the attempt that took over. It writes the receipt too: a
retried record (its first reply lost) that finds its own record *and* the receipt naming
this attempt has succeeded, while the same value recorded by an attempt that took over
(``n:`` for every ``None``) is still :class:`ClaimLost`. If the block raises,
``idem_release.lua`` deletes our claim, so a retry need not wait for the lease.

**What is atomic with what.** That depends on where the effect lives:

* Effect in this Redis: :meth:`RedisOnce.apply`. The effect's writes and the record are
  queued in **one** ``MULTI``/``EXEC``, under ``WATCH`` of the idempotency key and of the
  keys the effect reads (:func:`~tenure.patterns.optimistic.optimistic`), after checking
  that the key still holds our claim. ``EXEC`` applies all of them or none: a crash
  before it leaves no effect and an expiring claim (the retry applies the effect once);
  a crash after it leaves effect and record (the retry gets the record); a takeover in
  between makes ``EXEC`` fail, and the late attempt writes nothing
  (:class:`ClaimLost`). Exactly once. (As with any ``MULTI``, a command that fails
  inside ``EXEC``, e.g. on a key of the wrong type, does not roll back the others.)
* Effect anywhere else (an API call, another database): :meth:`RedisOnce.record` after
  the effect. Claim, effect and record are three steps, and there is a window::

      attempt 1  claim ---- effect ---- (crash) ................................
      attempt 2                              wait ... lease ends: claim, effect, record

  An effect done just before a crash is done again after the takeover: at least once.
  The same happens if the lease ends while attempt 1 is still working; attempt 1's
  record then raises :class:`ClaimLost` to say so if the key holds the other attempt's
  claim or record (if that attempt left nothing, having failed or crashed too, the
  record is stored and the double effect goes unreported). Such an effect should be
  idempotent itself (pass the idempotency key on, e.g. to a payment API), or live in the
  same SQL transaction as its record (below). The lease must exceed the effect's
  longest duration, or the attempt must call :meth:`RedisOnce.extend` while it works
  (``idem_claim.lua`` again, with our marker: it renews our claim's lease, and changes
  nothing if another attempt's claim or record is there).

Theory of operation: SQL
------------------------

A table ``idempotency_keys(key PRIMARY KEY, response, created_at)``
(:func:`idempotency_table`). :meth:`SqlIdempotency.once` inserts the key **in the
caller's transaction**, the effect's writes go in the same transaction, and the result
is written to the row before commit: effect and record commit together or roll back
together, and a crash at any point leaves both or neither. Exactly once, by the
database's unique constraint.

A concurrent duplicate's INSERT meets the first one's uncommitted row. PostgreSQL and
SQLite make it wait (the row lock; SQLite's single writer) until the first transaction
ends: committed, the duplicate reads the recorded response; rolled back, the duplicate
is the first. The INSERT is ``INSERT ... ON CONFLICT (key) DO NOTHING`` there, so the
duplicate's transaction stays usable. Other databases (or ``on_conflict="savepoint"``)
insert inside a SAVEPOINT and take an ``IntegrityError`` as "already there": roll back
to the savepoint, read the response. (Not on SQLite: pysqlite's SAVEPOINT opening a
transaction commits it at RELEASE.) Under REPEATABLE READ or SERIALIZABLE, the waiting
duplicate gets a serialization failure instead; retry its transaction.

The API
-------

``with store.once(key) as once:`` gives an attempt: if ``once.done`` a previous attempt
finished and ``once.result`` is its result; otherwise this attempt holds the key, does
the effect and records the result (leaving the block normally without recording
records ``None``). :func:`idempotent` wraps a request handler in exactly that. Results
are encoded with a :class:`Codec` (JSON by default). SQLAlchemy is imported only by the
SQL half, on first use.
"""

from __future__ import annotations

import inspect

from ._errors import ClaimLost, InProgress, NotClaimed
from ._protocol import JSON as _JSON
from ._protocol import Codec, IdempotencyStore, Once, current_claim, idempotent
from ._redis import DEFAULT_POLL as DEFAULT_POLL
from ._redis import RedisIdempotency, RedisOnce
from ._sql import SqlIdempotency, SqlOnce, idempotency_table

__all__ = [
    "JSON",
    "ClaimLost",
    "Codec",
    "IdempotencyStore",
    "InProgress",
    "NotClaimed",
    "Once",
    "RedisIdempotency",
    "RedisOnce",
    "SqlIdempotency",
    "SqlOnce",
    "current_claim",
    "idempotency_table",
    "idempotent",
]

# The pieces live in _errors, _protocol, _redis and _sql; what they define keeps this
# public module as its home (in reprs, pickles and the API reference), as before the
# module was split. DEFAULT_POLL stays importable from here, outside __all__ as before.

JSON = _JSON
"""The default codec. Results must be JSON-serialisable; tuples come back as lists, and
dict keys as strings."""

for _name in __all__:
    _public = globals()[_name]
    if inspect.isclass(_public) or inspect.isfunction(_public):  # not JSON, a Codec
        _public.__module__ = __name__
del _name, _public

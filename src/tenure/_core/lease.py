"""Extending and releasing a lease: when each succeeds, and what failure means.

Extend is compare-and-expire on every node: a node extends only while it still holds
our token, so an expired key is never re-created. The new validity is measured from the
start of the extend round, exactly as for acquisition, and a majority is required again;
anything less means another client may be able to win a majority, so the lease is lost.

Release is compare-and-delete on every node. A node that still held our token at
release held it without interruption since it granted it (tokens are never reused), so
if a majority still held it, nobody else can have held a majority meanwhile, barring
nodes that lost their data or had their clock jump. If fewer did, the lock expired
somewhere during the critical section and the caller is told: it may have overlapped
another holder.
"""

from __future__ import annotations

import re
from dataclasses import replace

from .._errors import LeaseExpired, LeaseLost, QuorumUnreachable, ServerUnsupported
from .._lua import script
from .acquire import LeaseState, round_errors, unreachable
from .config import DEFAULT_KEY_PREFIX, LockSpec, key_prefix_of
from .diagnosis import check_command, configuration_error, for_prefix
from .quorum import Failure, Round

__all__ = [
    "begin_extend",
    "conclude_extend",
    "conclude_locked",
    "conclude_release",
    "worth_another_try",
]


def begin_extend(lease: LeaseState, spec: LockSpec, now: float) -> Round:
    """Start an extend round, refusing (without I/O) a lease whose validity already ended."""
    if now >= lease.valid_until:
        raise LeaseExpired(
            lease.name,
            f"cannot extend: its validity ended {now - lease.valid_until:.3f}s ago; "
            "another client may hold the lock now, so acquire it again",
        )
    return Round(spec.n_nodes, spec.quorum, now)


def conclude_extend(
    lease: LeaseState, spec: LockSpec, rnd: Round, now: float, names: list[str]
) -> LeaseState | LeaseLost:
    """The extended lease, or the reason it is lost (the driver then releases everywhere)."""
    validity = rnd.validity(now, spec.ttl, spec.drift)
    dropped = [names[i] for i in _dropped(lease, rnd)]
    if dropped:
        # A node that granted us said "not yours" before our validity ended: it restarted
        # without its data, evicted the key, failed over to a replica that had not
        # received it, or its clock jumped. Whatever it was, the assumptions behind this
        # lease broke; do not keep using it.
        return LeaseLost(
            lease.name,
            f"node(s) {', '.join(dropped)} no longer hold it before its validity ended "
            "(restarted without data, evicted it, failed over to a replica that had not "
            "received it, or a clock jump)",
            round_errors(rnd, names, key_prefix_of(lease.key)),
        )
    if rnd.succeeded and validity > 0:
        return replace(
            lease,
            ttl=spec.ttl,
            started=rnd.started,
            valid_until=rnd.started + spec.ttl - spec.drift,
            granted=rnd.granted(),
        )
    if rnd.succeeded:
        why = f"the extend round took too long (validity {validity * 1000:.1f} ms)"
    else:
        failed = len(rnd.failures())
        why = (
            f"confirmed by {rnd.yes} of {spec.n_nodes} nodes before a majority of "
            f"{spec.quorum} became impossible ({failed} failed to answer)"
        )
    return LeaseLost(
        lease.name, f"extend failed: {why}", round_errors(rnd, names, key_prefix_of(lease.key))
    )


def worth_another_try(lease: LeaseState, rnd: Round) -> bool:
    """Whether an extension that failed (``conclude_extend`` gave a ``LeaseLost``) left
    the lease as it was, so that another try while its validity lasts may keep it.

    Yes unless a node that granted it said "not ours": then the lease broke (above). A
    round that failed for nodes that did not answer, or that took too long, changed
    nothing the lease relies on: the granting nodes keep our token until the validity
    ends, whether or not they ran the extension (an extension that shortens the keys
    lowered the validity before its round began, ``Flows.extend``).
    """
    return not _dropped(lease, rnd)


def _dropped(lease: LeaseState, rnd: Round) -> list[int]:
    """The nodes that granted ``lease`` and said in ``rnd`` that they do not hold it."""
    return [i for i in lease.granted if (r := rnd.results[i]) is not None and r.ok is False]


def conclude_release(
    lease: LeaseState, n_nodes: int, quorum: int, rnd: Round, now: float, names: list[str]
) -> LeaseLost | ServerUnsupported | None:
    """None if a majority still held the lease at release; otherwise why it was lost, or
    ``ServerUnsupported`` if a node refused the release (ACL): a configuration error,
    which says nothing about the lease."""
    if rnd.yes >= quorum:
        return None
    # The fixes said name the client's key prefix: the one the lease's key was made under.
    prefix = key_prefix_of(lease.key)
    for i, r in rnd.failures().items():
        if r.failure is Failure.UNSUPPORTED:
            # The release script stops at the refused command, but Redis keeps what the
            # script wrote before it: with PUBLISH refused, the lock key is already gone
            # when the hand-off to a waiter fails. Not a lost lease: a node set up wrong.
            return ServerUnsupported(
                names[i],
                f"refused {_script_command('release', r.detail)} in the release of lock "
                f"{lease.name!r} ({for_prefix(r.detail, prefix)}); "
                "the script may have deleted the lock there before the refused command, "
                f"and the key expires by its TTL in any case. `{check_command(prefix)}` "
                "prints the ACL SETUSER line that fixes it",
            )
    expired = now >= lease.valid_until
    failed = len(rnd.failures())
    # A "no" proves the key gone only from a node that granted it; one that never did
    # (the lease was granted by a majority without it) says nothing of the lease.
    dropped = any((said := rnd.results[i]) is not None and said.ok is False for i in lease.granted)
    if rnd.yes + failed >= quorum or not dropped:
        # Not proven lost, but not proven held either: say which nodes could not answer.
        unheard = rnd.unheard
        silent = f"{failed} did not answer" + (
            f" and {unheard} were not heard before the others decided it" if unheard else ""
        )
        message = (
            f"release confirmed by only {rnd.yes} of {n_nodes} nodes ({quorum} needed); "
            f"{silent}, so it cannot be shown that the lease held to the end "
            "(keys left on them expire by their TTL)"
        )
    else:
        held = f"only {rnd.yes} of {n_nodes} nodes still held it"
        # The refusals decided the round before every node answered: the nodes not heard
        # may still have held it, and are not counted as if they said no.
        unheard = rnd.unheard
        if unheard:
            held = (
                f"only {rnd.yes} of the {n_nodes - unheard} nodes that answered still held it "
                f"({unheard} more not heard before the others decided it)"
            )
        message = (
            f"released, but {held} ({quorum} needed): "
            "the lock expired during the critical section and another client may have held it"
        )
    error_type = LeaseExpired if expired else LeaseLost
    return error_type(lease.name, message, round_errors(rnd, names, prefix))


_LINE = re.compile(r"user_script: ?(\d+)")
_CALL = re.compile(rb"""redis\.p?call\(\s*["']([A-Za-z]+)["']""")
_NAMED = re.compile(r"run the '([a-z|]+)' command")


def _script_command(name: str, error: str) -> str:
    """The command a script error points at ("PUBLISH"), or "a command".

    The release runs its waiting part under ``pcall`` (release.lua.inc), and an error it
    raises again is placed at that line, not at the refused call. So: the command the
    message names (Redis 7 and Valkey: "run the 'publish' command"); a channel refused,
    which only PUBLISH touches in tenure's scripts; else the line of the refused call,
    the last one the message gives (6.2 says only "can't run this command", with the
    call's line inside the line of the raise).
    """
    named = _NAMED.search(error)
    if named is not None:
        return named.group(1).split("|")[0].upper()
    if "access a channel" in error:
        return "PUBLISH"
    found = _LINE.findall(error)
    lines = script(name).wire.splitlines()
    if not found or not 0 < int(found[-1]) <= len(lines):
        return "a command"
    called = _CALL.findall(lines[int(found[-1]) - 1])
    return called[0].decode().upper() if len(called) == 1 else "a command"


def conclude_locked(
    rnd: Round, name: str, names: list[str], prefix: str = DEFAULT_KEY_PREFIX
) -> bool:
    """``Lock.locked()``: whether a majority of nodes hold lock ``name``'s key (for
    anyone).

    The answer is given only when the nodes that answered settle it: a majority holding
    the key (True), or more nodes without it than a majority can spare (False).

    Raises:
        NodeMisconfigured: misconfigured nodes alone leave too few for a majority, so
            the answer would say nothing about the lock.
        QuorumUnreachable: the nodes that failed (down, silent) decide it. Either they
            leave too few answers for a majority, or those that answered split: of
            three, one down, one holding the key and one not, the lock is held if the
            one down holds it too (a lease granted by it and the one holding, still
            valid, which no acquire could take from its holder). "Not locked" would be
            a guess, as an acquire would refuse to make.
    """
    if rnd.misconfigured_blocks_quorum():
        error = configuration_error(rnd, names, prefix)
        assert error is not None
        raise error
    if rnd.succeeded:
        return True
    n = len(rnd.results)
    if rnd.refused > n - rnd.needed:
        return False
    if rnd.unreachable_blocks_quorum():
        raise unreachable(rnd, name, names, prefix)
    misconfigured = configuration_error(rnd, names, prefix)
    if misconfigured is not None:
        raise misconfigured  # (one of the nodes that decide it, whose fix is known)
    raise QuorumUnreachable(
        name,
        f"{rnd.failed} of {n} nodes failed, and of those that answered {rnd.yes} hold the "
        f"lock and {rnd.refused} do not: whether a majority of {rnd.needed} holds it "
        "depends on the failed nodes",
        round_errors(rnd, names, prefix),
    )

"""The failure scenarios, each with the configuration that fails and the one that survives.

A scenario is a choreography: workers take steps (acquire, read, write, release) and the
nemesis places a fault exactly between two steps, so the race that breaks a lock happens
on every cycle instead of once in a blue moon. Each configuration runs the *same*
choreography with a different lock, store or server setting, and states what the checker
must find: zero for the checks a mitigation guarantees, a violation for the control (a
verifier that finds nothing where it must is broken).

Timings are chosen so that every step fits comfortably inside the leases involved on a
loaded 2-core machine: a worker's reply arrives in milliseconds, leases last a second or
more, and a pause lasts past the lease by a clear margin.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import redis

from ..testing.local import Persistence
from .actors import Actor
from .locks import LockRecipe
from .proof import FaultNotObserved, observed
from .proxy import Proxy
from .world import World

__all__ = ["MAX_CYCLES", "SCENARIOS", "Config", "Expect", "Scenario"]

Stats = dict[str, float]
"""Figures a choreography measures itself, beside the checker's (e.g. "grants_in_cut")."""

NAME = "verify-lock"
MAX_TTL = 2.0  # seconds: every tenure client here; a restarted node sits out this long


@dataclass(frozen=True)
class Expect:
    """One thing the run must show, e.g. ``C1 = 0`` or ``C1 > 0``.

    ``bound``: for a limit on a figure (``= 0``, ``<=``), that figure's name. What the
    run saw breaks a limit however early the run stopped; an expectation of something
    to show (``> 0``, ``>=``) may just not have been reached by a run that could not be
    carried out.

    ``premise``: for a figure that shows the fault was tested at all (the workers asked
    for the lock while it lasted), what it shows. Unmet, the run tested nothing: it is
    an ERROR (:func:`unobserved`), not a FAIL of the mitigation, and never a PASS.
    """

    label: str
    holds: Callable[[dict[str, float | int | None]], bool]
    bound: str | None = None
    premise: tuple[str, str] | None = None

    def broken(self, figures: dict[str, float | int | None]) -> bool:
        """Whether the figures measured break this limit (never for an expectation of
        something to show, nor for a figure the run did not get to measure)."""
        return (
            self.bound is not None
            and figures.get(self.bound) is not None
            and not self.holds(figures)
        )


def zero(*checks: str) -> list[Expect]:
    return [_zero(c) for c in checks]


def _zero(check: str) -> Expect:
    return Expect(f"{check} = 0", lambda f: f.get(check) == 0, bound=check)


def violated(check: str) -> Expect:
    return Expect(f"{check} > 0", lambda f: (f.get(check) or 0) > 0)


def at_least(stat: str, n: float) -> Expect:
    return Expect(f"{stat} >= {n:g}", lambda f: (f.get(stat) or 0) >= n)


def at_most(stat: str, n: float) -> Expect:
    return Expect(
        f"{stat} <= {n:g}",
        lambda f: f.get(stat) is not None and (f.get(stat) or 0) <= n,
        bound=stat,
    )


def premise(stat: str, n: float, what: str) -> Expect:
    """A premise: ``stat >= n``, or the run is an ERROR saying ``what`` was not seen."""
    return Expect(f"{stat} >= {n:g}", lambda f: (f.get(stat) or 0) >= n, premise=(stat, what))


def unobserved(
    expect: Sequence[Expect], figures: dict[str, float | int | None]
) -> FaultNotObserved | None:
    """The first premise the figures do not meet, as the error of the run (a run whose
    fault met no request tested nothing, whatever its safety checks say)."""
    for e in expect:
        if e.premise is not None and not e.holds(figures):
            stat, what = e.premise
            return FaultNotObserved(what, None, f"{stat} = {figures.get(stat) or 0}")
    return None


SAFE = ("C1", "C3", "C4", "C5")


@dataclass(frozen=True)
class Config:
    name: str
    mitigated: bool
    run: Callable[[World, int], Stats]
    expect: Sequence[Expect]
    note: str = ""


@dataclass(frozen=True)
class Scenario:
    key: str
    number: int
    title: str
    configs: Sequence[Config]
    quick_cycles: int = 3
    soak_cycles: int = 200


MAX_CYCLES = 1000
"""The most cycles per configuration ``tenure verify --cycles`` runs: five times the
longest soak (a soak of every scenario takes about 45 minutes on 2 cores, so this is
hours), where a larger number ran for ever."""


# --- shared steps ------------------------------------------------------------------------


def tenure(
    urls: Sequence[str], ttl: float, *, node_timeout: float = 0.05, wait_replicas: int = 0
) -> LockRecipe:
    return LockRecipe(
        "tenure",
        tuple(urls),
        NAME,
        ttl,
        node_timeout=node_timeout,
        max_ttl=MAX_TTL,
        wait_replicas=wait_replicas,
    )


def baseline(
    kind: str, urls: Sequence[str], ttl: float, *, node_timeout: float = 0.05
) -> LockRecipe:
    return LockRecipe(kind, tuple(urls), NAME, ttl, node_timeout=node_timeout)


def use_and_release(actor: Actor) -> None:
    """The rest of a normal critical section: read, write, release."""
    actor.call("read")
    actor.call("write")
    actor.call("release")


class ChoreographyError(RuntimeError):
    """A step the scenario's race needs did not happen (the holder was refused the lock
    the fault is meant to take from it, or the fault missed the window it was placed
    in): the cycle would test nothing, so the run could not be carried out. A cycle that
    tested nothing must never count as one that held (a PASS the fault never tested)."""


class MissedWindow(ChoreographyError):
    """A fault placed by time (a sleep between two workers' steps) landed outside its
    window, which a loaded machine can do: the cycle is set up again, a few times at
    most (:func:`retried`), before the run gives up."""


SETUP_ATTEMPTS = 3
"""How many times a cycle whose fault missed its window is set up before the run is an
ERROR: a loaded machine misses one now and then, a broken choreography every time."""


def require_grant(who: str, outcome: str, step: str, consequence: str) -> None:
    """Check the answer of an acquire the cycle's race needs.

    Args:
        who: the worker.
        outcome: its answer, ``"granted"`` or ``"refused: <the lock's reason>"``.
        step: where in the choreography, e.g. ``"before the failover"``.
        consequence: what the cycle would then not test.

    Raises:
        ChoreographyError: refused; the message names the worker, the step, the lock's
            reason and what the cycle would not test.
    """
    if outcome != "granted":
        reason = outcome.removeprefix("refused: ")
        raise ChoreographyError(f"{who} was refused the lock {step} ({reason}): {consequence}")


# "2 of 5 nodes failed or did not answer": tenure's LockTimeout, and the baselines'
# refusals (locks.PlainRedlock), name the nodes the last attempt did not hear.
_UNHEARD = re.compile(r"(\d+) of \d+ nodes failed")


def unheard(outcome: str) -> int:
    """How many nodes the last attempt of a refused acquire did not hear (failed, or did
    not answer in time), as its reason says; 0 for a grant or a reason naming none."""
    found = _UNHEARD.search(outcome)
    return 0 if found is None else int(found[1])


def require_heard(who: str, outcome: str, cut_off: int, step: str) -> None:
    """Check that a refusal the cycle judges came from the nodes the fault left the
    worker, not from a loaded machine.

    A refusal is the mitigation's answer only if every node ``who`` could reach
    answered: one that timed out on them (50 ms each) says nothing about the lock, and
    counting it would be a PASS the fault never tested, or a control's FAIL for want
    of a violation the lock never had the chance to show. A refusal that spent the
    majority's validity before it was counted is the machine's too.

    Args:
        who: the worker.
        outcome: its answer, ``"granted"`` or ``"refused: <the lock's reason>"``.
        cut_off: how many nodes the choreography cut off from it (never heard).
        step: where in the choreography, e.g. ``"on n3, n4, n5 after node 3 restarted"``.

    Raises:
        MissedWindow: more nodes than ``cut_off`` went unheard, or the votes were won
            too late: the cycle is set up again (:func:`retried`).
    """
    if outcome == "granted":
        return
    reason = outcome.removeprefix("refused: ")
    if unheard(outcome) > cut_off or "validity spent" in reason:
        raise MissedWindow(
            f"{who} was refused the lock {step} without hearing in time every node it "
            f"could reach ({reason}): the machine decided, not the lock, and the cycle "
            "tested nothing"
        )


def hold(actor: Actor, timeout: float, step: str, consequence: str) -> None:
    """Acquire a lock ``actor`` must hold for the cycle to test anything.

    ``timeout`` is long enough that a loaded machine does not run it out: only a real
    refusal (someone holds the lock, the nodes refuse) is an error, not a slow reply.
    A blocking acquire returns at its grant, so the margin costs nothing.

    Raises:
        ChoreographyError: refused (:func:`require_grant`).
    """
    require_grant(actor.name, actor.call("acquire", timeout), step, consequence)


def retried(world: World, cycle: Callable[[], None], attempts: int = SETUP_ATTEMPTS) -> None:
    """Run ``cycle``; set it up again if its fault missed its window (noted in the
    history), up to ``attempts`` times in all.

    Raises:
        MissedWindow: the window was missed every time.
    """
    for attempt in range(1, attempts + 1):
        try:
            cycle()
            return
        except MissedWindow as exc:
            if attempt == attempts:
                raise MissedWindow(f"{exc} (in each of {attempts} attempts)") from None
            world.note(f"cycle set up again: {exc}")


def wait_until(deadline_ns: int) -> None:
    delay = (deadline_ns - time.monotonic_ns()) / 1e9
    if delay > 0:
        time.sleep(delay)


def split_around_node3(
    world: World, proxies: Sequence[Proxy], a: Actor, b: Actor, fault: Callable[[], None]
) -> str:
    """Five nodes: A wins {1,2,3} while 4 and 5 are cut off, ``fault`` strikes node 3, and
    B tries {3,4,5} while 1 and 2 are cut off; then A, who still believes, writes.

    Returns:
        B's answer on {3,4,5} (``"granted"`` or ``"refused: <reason>"``): where the
        fault is one that must let B in (a clock jump), a cycle in which B lost made no
        late write for the store to judge; whatever the fault, a refusal that did not
        hear n3, n4 and n5 tested nothing (:func:`require_heard`).

    Raises:
        ChoreographyError: A was refused: the fault would strike while nobody held the
            lock, and a cycle that tests nothing must not count as one that held.
        MissedWindow: A's lease had run out by its own clock when it came to write (a
            loaded machine: the steps between took longer than its TTL). A wrote
            nothing, and B's grant, if any, came after A's lease: no late write for a
            store to refuse, no overlap for a control to show.
    """
    cut = world.cut(proxies[3:])
    try:
        hold(
            a,
            2.0,
            "on n1, n2, n3 before the fault",
            "the fault would strike while nobody held the lock, and test nothing",
        )
    except ChoreographyError:
        world.heal(cut)
        raise
    a.call("read")
    world.heal(cut)
    fault()
    cut = world.cut(proxies[:2])
    outcome: str = b.call("acquire", 0.3)
    if outcome == "granted":
        use_and_release(b)
    world.heal(cut)
    wrote = a.call("write")
    a.call("release")
    if wrote == "expired":
        raise MissedWindow(
            "A's lease ran out before its write: no late write, and no overlap with B's "
            "grant, for the cycle to judge"
        )
    return outcome


# --- 1. failover --------------------------------------------------------------------------


# A refusal of wait_replicas that found the replica cut off (the lock's LockTimeout).
_UNREPLICATED = "fewer of their replicas than wait_replicas acknowledged it"


def failover_single(
    world: World, cycles: int, wait_replicas: int = 0, kind: str = "tenure"
) -> Stats:
    """One master, one async replica fed through a proxy; cut the feed, lock, fail over.
    ``kind``: tenure's lock, or a baseline that does not check the replication history.

    A must hold the lock when the master dies, or the failover has nothing to lose
    (ChoreographyError), except where ``wait_replicas`` finds the replica cut off: that
    refusal is the mitigation (``fail_closed``), and a grant there is its failure
    (``granted_unreplicated``)."""
    refused = unreplicated = 0
    fenced = kind == "tenure"

    def recipe(urls: list[str], replicas: int = 0) -> LockRecipe:
        if fenced:
            return tenure(urls, 2.0, wait_replicas=replicas)
        return baseline(kind, urls, 2.0)

    for c in range(cycles):
        master = world.node(f"m{c}")
        replica = world.node(f"r{c}")
        feed = world.proxy(master)
        world.replicate(replica, feed)
        lock = recipe([master.url], wait_replicas)
        a = world.actor(f"A{c}", lock, fenced=fenced)
        # B is what a client sees after a failover: the same lock, served by the replica.
        b = world.actor(f"B{c}", recipe([replica.url]), fenced=fenced)
        # Every other cycle the replica keeps up: the failover then loses nothing, and
        # wait_replicas must not stand in the way of a grant it could safely make.
        cut = world.cut([feed]) if c % 2 == 0 else []
        if wait_replicas and cut:
            # Attempts until the timeout, each failing closed: the last one's reason is
            # WAIT's, not that of a reply a loaded machine made late.
            outcome = a.call("acquire", 1.0)
            if outcome == "granted":
                unreplicated += 1
                a.call("read")
            elif _UNREPLICATED in outcome:
                refused += 1
            else:
                world.heal(cut, "replication cut")
                require_grant(
                    a.name,
                    outcome,
                    "with the replica cut off",
                    "its grant was to fail closed for want of the replica's acknowledgement",
                )
        else:
            hold(
                a,
                2.0,
                "before the failover",
                "the failover would have no lock to lose, and test nothing",
            )
            a.call("read")
        world.kill_node(master)
        world.heal(cut, "replication cut")
        world.promote(replica)
        got = b.call("acquire", 1.0) == "granted"
        if got:
            use_and_release(b)
        a.call("write")
        a.call("release")
        # The promoted node sat out max_ttl (its history changed); after that B gets
        # the lock: the check costs availability for max_ttl, no more.
        if fenced and not got and b.call("acquire", MAX_TTL + 1.0) == "granted":
            use_and_release(b)
        a.close()
        b.close()
    if wait_replicas:
        return {"fail_closed": refused, "granted_unreplicated": unreplicated}
    return {}


def failover_redlock(world: World, cycles: int) -> Stats:
    """Three independent masters; the first has a replica that takes its place."""
    for c in range(cycles):
        masters = [world.node(f"m{c}.{i}") for i in range(1, 4)]
        replica = world.node(f"r{c}.1")
        feed = world.proxy(masters[0])
        world.replicate(replica, feed)
        a = world.actor(f"A{c}", tenure([m.url for m in masters], 2.0), fenced=True)
        urls = [replica.url, masters[1].url, masters[2].url]
        b = world.actor(f"B{c}", tenure(urls, 2.0), fenced=True)
        cut = world.cut([feed])
        try:
            hold(
                a,
                2.0,
                "on the three masters before the failover",
                "the failover would have no lock to lose, and test nothing",
            )
        except ChoreographyError:
            world.heal(cut, "replication cut")
            raise
        a.call("read")
        world.kill_node(masters[0])
        world.heal(cut, "replication cut")
        world.promote(replica)
        if b.call("acquire", 0.5) == "granted":
            use_and_release(b)
        a.call("write")
        a.call("release")
        # Once A is gone, B gets the lock: the mitigation costs no liveness.
        if b.call("acquire", 2.0) == "granted":
            use_and_release(b)
        a.close()
        b.close()
    return {}


SENTINEL_TTL = 8.0  # seconds: outlasts a Sentinel failover (down_after 1 s + election)


def failover_sentinel(kind: str) -> Callable[[World, int], Stats]:
    """A real Sentinel deployment (master, one replica, three Sentinels); every client
    reaches it through ``redis+sentinel://.../service``. The replica is frozen and its
    link closed before A locks, so it misses A's grant for certain; the master dies, the
    Sentinels promote the replica, and B asks the new master while A still believes."""
    fenced = kind == "tenure"

    def run(world: World, cycles: int) -> Stats:
        refused = after_warmup = 0
        for c in range(cycles):
            # A fresh deployment per cycle: the promoted node would otherwise carry the
            # last cycle's warm-up and leases into the next.
            sentinels = world.sentinel_set(f"s{c}")
            if fenced:
                lock = LockRecipe(
                    "tenure", (sentinels.url,), NAME, SENTINEL_TTL, max_ttl=SENTINEL_TTL
                )
            else:
                lock = baseline(kind, [sentinels.url], SENTINEL_TTL)
            a, b = world.actors([f"A{c}", f"B{c}"], lock, fenced=fenced)
            master = sentinels.master()
            replica = sentinels.replicas()[0]
            world.pause_node(replica)
            world.drop_replicas(master)
            try:
                hold(
                    a,
                    4.0,
                    "from the Sentinels' master before the failover",
                    "the failover would have no lock to lose, and test nothing",
                )
            except ChoreographyError:
                world.resume_node(replica)
                raise
            a.call("read")
            world.kill_node(master)
            world.resume_node(replica)
            world.wait_for_promotion(sentinels, master)
            if b.call("acquire", 1.0) == "granted":
                use_and_release(b)
            else:
                refused += 1
            a.call("write")
            a.call("release")
            # Once the warm-up is over, B gets the lock: the failover costs max_ttl of
            # liveness, no more (once per run: it waits out a whole warm-up).
            if fenced and c == 0 and b.call("acquire", SENTINEL_TTL + 5.0) == "granted":
                after_warmup += 1
                use_and_release(b)
            a.close()
            b.close()
            sentinels.close()
        return {"b_refused": refused, **({"b_after_warmup": after_warmup} if fenced else {})}

    return run


# --- 2. restart without persistence -------------------------------------------------------


def restart(persistence: Persistence, kind: str) -> Callable[[World, int], Stats]:
    def run(world: World, cycles: int) -> Stats:
        nodes = [world.node(f"n{i}", persistence=persistence) for i in range(1, 6)]
        proxies = [world.proxy(n) for n in nodes]
        urls = [p.url for p in proxies]
        fenced = kind == "tenure"
        lock = tenure(urls, MAX_TTL) if fenced else baseline(kind, urls, MAX_TTL)
        a = world.actor("A", lock, fenced=fenced)
        b = world.actor("B", lock, fenced=fenced)

        def cycle() -> None:
            # Steady state first: each client takes the lock on {1,2,3} alone, as A
            # will in the split, so that tenure seeds node 3 (restarted in the last
            # cycle) and each client sits out its own warm-up of it here. With every
            # node up, {1,2,4,5} granted without node 3 and left that warm-up to A's
            # acquire in the split, which ran out waiting: nobody held the lock when
            # the fault struck (ChoreographyError now).
            cut = world.cut(proxies[3:])
            for w in (a, b):
                w.call("acquire", 2 * MAX_TTL + 1.0)
                w.call("release")
            world.heal(cut, "steady state on n1..n3")
            outcome = split_around_node3(world, proxies, a, b, lambda: world.restart_node(nodes[2]))
            # B's 0.3 s are a few attempts of 50 ms per node, two of them cut off: on a
            # loaded machine n3, n4 or n5 can miss each one. Such a refusal is neither
            # the control's missing overlap nor a mitigation's answer: set up again.
            require_heard("B", outcome, 2, "on n3, n4, n5 after node 3 restarted")

        for _ in range(cycles):
            retried(world, cycle)
        return {}

    return run


# --- 3. client pause ----------------------------------------------------------------------


def client_pause(fenced: bool) -> Callable[[World, int], Stats]:
    def run(world: World, cycles: int) -> Stats:
        nodes = [world.node(f"n{i}") for i in range(1, 4)]
        lock = tenure([n.url for n in nodes], 0.5)
        a = world.actor("A", lock, fenced=fenced)
        b = world.actor("B", lock, fenced=fenced)

        def cycle() -> None:
            hold(a, 2.0, "before its pause", "the pause would take no lock from it")
            a.call("read")
            # A checks its lease is valid, then stalls before writing: the pause lands
            # between check and write, where no library can see it coming.
            a.send("write", 0.4)
            time.sleep(0.1)
            world.pause_worker(a)
            wrote_early = a.answered()
            time.sleep(0.6)  # past A's lease
            hold(b, 3.0, "after A's lease ran out", "nobody would write after A")
            use_and_release(b)
            world.resume_worker(a)
            wrote = a.result()
            a.call("release")
            # Placed by a sleep, the pause may miss the window on a loaded machine: set
            # the cycle up again rather than count one in which A's write was not late.
            if wrote_early:
                raise MissedWindow("A wrote before it was paused, within its lease")
            if wrote in ("expired", "not-held"):
                raise MissedWindow(
                    "A was paused before its validity check, and wrote nothing after it"
                )

        for _ in range(cycles):
            retried(world, cycle)
        return {}

    return run


# --- 4. clock jump ------------------------------------------------------------------------


def clock_jump(fenced: bool) -> Callable[[World, int], Stats]:
    def run(world: World, cycles: int) -> Stats:
        nodes = [world.node(f"n{i}", fake_clock=(i == 3)) for i in range(1, 6)]
        proxies = [world.proxy(n) for n in nodes]
        lock = tenure([p.url for p in proxies], 1.2)
        a = world.actor("A", lock, fenced=fenced)
        b = world.actor("B", lock, fenced=fenced)
        a.call("acquire", 2.0)
        a.call("release")

        def cycle() -> None:
            # Node 3's jump expires A's key there, so B wins {3,4,5} and A's write comes
            # after B's: the race both rows are about. B has 0.3 s for it, which a loaded
            # machine can run out (the jump itself is proven by TIME): a cycle in which
            # B lost has no late write and no overlap, so it is set up again.
            outcome = split_around_node3(
                world, proxies, a, b, lambda: world.jump_clock(nodes[2], 10.0)
            )
            if outcome != "granted":
                raise MissedWindow(
                    "B was refused the lock on n3, n4, n5 after node 3's clock jumped: "
                    "A's write came after nobody's"
                )

        for _ in range(cycles):
            retried(world, cycle)
        return {}

    return run


# --- 5. partitions and slow nodes ---------------------------------------------------------


def slow_reply(kind: str) -> Callable[[World, int], Stats]:
    """A reply delayed by 400 ms, then a fast competitor after the key expired."""

    def run(world: World, cycles: int) -> Stats:
        node = world.node("n1")
        proxy = world.proxy(node)
        ttl, delay = 1.5, 0.4
        # The round trip takes `delay`; the node timeout leaves a loaded machine 300 ms
        # more before A's one attempt counts the node as silent (ChoreographyError), and
        # the TTL is the shortest tenure accepts with it (twice node timeout + drift).
        if kind == "tenure":
            lock = tenure([proxy.url], ttl, node_timeout=0.7)
        else:
            lock = baseline(kind, [proxy.url], ttl, node_timeout=0.7)
        a = world.actor("A", lock, fenced=False)
        b = world.actor("B", lock, fenced=False)
        for w in (a, b):  # connect (and seed blank nodes) before the slow network
            w.call("acquire", 2.0)
            w.call("release")
        for _ in range(cycles):
            t = time.monotonic_ns()
            proxy.delay(delay / 2)  # each way: the round trip takes `delay`
            sent = time.monotonic_ns()
            outcome = a.call("acquire", 0.0)
            proxy.heal()
            world.fault(
                "delay", proxy.name, t, f"round trip {(time.monotonic_ns() - sent) / 1e6:.0f} ms"
            )
            require_grant(
                "A",
                outcome,
                "through the slow link",
                "no holder for the slow reply to mislead, and the cycle would test nothing",
            )
            # The key was set when the request reached the server, ~delay/2 after sent.
            wait_until(sent + int((ttl + 0.05) * 1e9))
            hold(b, 2.0, "after A's key expired", "nobody could take over from A")
            use_and_release(b)
            a.call("write")
            a.call("release")
        return {}

    return run


def slow_round_trip(probe: redis.Redis, through: str, ttl: float) -> str:
    """The proof of a delay longer than the TTL: a PING through a delayed proxy, on a
    client connected before the delay (so it times the delay, not a handshake), had no
    reply within ``ttl`` (its socket timeout).

    Raises:
        FaultNotObserved: the reply came sooner; the slow phase would test nothing.
    """
    sent = time.monotonic()
    try:
        probe.ping()
    except redis.TimeoutError:
        return f"a PING through {through} had no reply within {ttl:g} s"
    finally:
        # A connection that timed out has a late reply on its way: drop it.
        probe.connection_pool.disconnect()
    took = time.monotonic() - sent
    observed(
        took,
        lambda s: s >= ttl,
        f"a round trip through {through} slower than the {ttl:g} s TTL",
    )
    return f"a PING through {through} took {took * 1000:.0f} ms"


def partitions(world: World, cycles: int) -> Stats:
    """Free-running workers on five nodes while the network misbehaves."""
    nodes = [world.node(f"n{i}") for i in range(1, 6)]
    proxies = [world.proxy(n) for n in nodes]
    # Every reply crosses a proxy of this process; on a loaded machine 50 ms through them
    # is tighter than what this run tests (liveness with a minority cut off, safety in
    # every phase), so the nodes get 200 ms, well inside the 1 s TTL.
    ttl = 1.0
    lock = tenure([p.url for p in proxies], ttl, node_timeout=0.2)
    workers = [world.actor(f"W{i}", lock, fenced=True) for i in range(1, 4)]
    # Each fault lasts this long: enough for the workers to see it and, in the minority
    # cut, to be granted even on a loaded machine (one window in a quick run).
    phase = 2.0
    rounds = max(1, cycles // 3)
    seconds = phase * 6 * rounds
    for w in workers:
        w.send("loop", seconds, 0.5, 0.01)
    spans: Stats = {}

    def hold(name: str, r: int, during: Callable[[], str] | None = None) -> str:
        """Let the fault just started last one phase; note when (for grants_in_<name>).
        ``during``: reads the fault's evidence inside the phase; its text is returned."""
        start = time.monotonic_ns()
        evidence = "" if during is None else during()
        wait_until(start + int(phase * 1e9))
        spans[f"window:{name}#{r}"] = start
        spans[f"window_end:{name}#{r}"] = time.monotonic_ns()
        return evidence

    probe = redis.Redis.from_url(proxies[0].url, socket_timeout=ttl)
    try:
        for r in range(rounds):
            time.sleep(phase / 2)
            cut = world.cut(proxies[:2])
            hold("minority_cut", r)
            world.heal(cut, "minority cut")
            cut = world.cut(proxies[:3])
            hold("majority_cut", r)
            world.heal(cut, "majority cut")
            t, dropped = time.monotonic_ns(), sum(p.stats.bytes_dropped for p in proxies[3:])
            for p in proxies[3:]:
                p.drop_replies()
            hold("dropped_replies", r)
            for p in proxies[3:]:
                p.heal()
            dropped = sum(p.stats.bytes_dropped for p in proxies[3:]) - dropped
            world.fault("drop replies", "n4,n5", t, f"{dropped} reply bytes dropped by the proxies")
            t, resets = time.monotonic_ns(), sum(p.stats.resets for p in proxies[:2])
            for p in proxies[:2]:
                p.reset()
            hold("resets", r)
            for p in proxies[:2]:
                p.heal()
            resets = sum(p.stats.resets for p in proxies[:2]) - resets
            world.fault("reset", "n1,n2", t, f"{resets} connections reset by the proxies")
            probe.connection_pool.disconnect()  # the resets may have closed it
            probe.ping()  # connected before the delay
            t = time.monotonic_ns()
            for p in proxies:
                p.delay(1.5)
            try:
                proof = hold("slow", r, lambda: slow_round_trip(probe, proxies[0].name, ttl))
            finally:
                for p in proxies:
                    p.heal()
            world.fault("delay 1.5s", "n1..n5", t, proof)
    except Exception:
        # The run broke off: let the workers finish before the register is read, or
        # their writes still to come would count as lost updates (C5).
        for w in workers:
            with contextlib.suppress(Exception):
                w.result(seconds + 60)
        raise
    finally:
        probe.close()
    for w in workers:
        w.result(seconds + 60)
    return spans


def fresh_names(world: World, cycles: int) -> Stats:
    """A lock per entity: workers lock names never used before while a minority of the
    five nodes is down (frozen, killed, cut off): every one must be granted at once."""
    nodes = [world.node(f"n{i}") for i in range(1, 6)]
    proxies = [world.proxy(n) for n in nodes]
    lock = tenure([p.url for p in proxies], 1.0)
    workers = [world.actor(f"W{i}", lock, fenced=False) for i in range(1, 3)]
    for w in workers:  # the node set is in use before the faults
        w.call("acquire", 2.0)
        w.call("release")
    totals: Stats = {"fresh_granted": 0, "fresh_refused": 0, "fresh_disorder": 0}

    def lock_fresh_names() -> None:
        for w in workers:
            w.send("fresh", 20)
        for w in workers:
            for k, v in w.result(60).items():
                totals[k] += v

    for _ in range(max(1, cycles)):
        world.pause_node(nodes[0])  # its proof: the kernel's T state, then PONG
        lock_fresh_names()
        world.resume_node(nodes[0])
        time.sleep(1.0)  # the clients' reconnect back-off from the frozen node runs out
        world.kill_node(nodes[1])
        cut = world.cut(proxies[2:3])
        lock_fresh_names()
        world.heal(cut, "cut off")
        nodes[1].start()  # back empty: blank, seeded, warming up (a minority)
    return totals


# --- 6. holder crash ----------------------------------------------------------------------


def holder_crash(kind: str) -> Callable[[World, int], Stats]:
    def run(world: World, cycles: int) -> Stats:
        nodes = [world.node(f"n{i}") for i in range(1, 4 if kind == "tenure" else 2)]
        ttl = 1.0
        urls = [n.url for n in nodes]
        lock = tenure(urls, ttl) if kind == "tenure" else baseline(kind, urls, ttl)
        b = world.actor("B", lock, fenced=False)
        stuck = 0
        for c in range(cycles):
            a = world.actor(f"A{c}", lock, fenced=False)
            hold(a, 2.0, "before its crash", "the crash would leave no lock for B to wait out")
            a.call("read")
            world.crash_worker(a)
            if b.call("acquire", ttl + 2.0) == "granted":
                use_and_release(b)
            else:
                stuck += 1
                with nodes[0].client() as r:  # an operator deletes the orphan by hand
                    r.delete(f"baseline:{NAME}")
                world.note("operator deleted the orphaned lock key")
        return {"deadlocks": stuck}

    return run


# --- 7. legacy patterns -------------------------------------------------------------------


def pause_then_release(kind: str) -> Callable[[World, int], Stats]:
    """A pauses past its TTL, B takes over, A wakes and releases, C walks in."""

    def run(world: World, cycles: int) -> Stats:
        node = world.node("n1")
        ttl = 0.5
        lock = tenure([node.url], ttl) if kind == "tenure" else baseline(kind, [node.url], ttl)
        a, b, c = (world.actor(p, lock, fenced=False) for p in "ABC")
        for _ in range(cycles):
            hold(a, 2.0, "before its pause", "its release would have no lock to misjudge")
            world.pause_worker(a)
            time.sleep(ttl + 0.2)
            hold(b, 2.0, "after A's lease ran out", "A's release would find no one's lock")
            b.call("read")
            world.resume_worker(a)
            a.call("release")
            if c.call("acquire", 0.2) == "granted":
                use_and_release(c)
            b.call("write")
            b.call("release")
        return {}

    return run


# --- 8. eviction and script loss ----------------------------------------------------------


def memory_pressure(policy: str, evicted: int, refused: int) -> str:
    """The proof that a fill ran the node out of memory: keys evicted, or under
    ``noeviction`` writes refused with OOM.

    Raises:
        FaultNotObserved: neither (e.g. ``maxmemory`` not in force): the lock key was
            never at risk, and the cycle would test nothing.
    """
    want = "writes refused (OOM)" if policy == "noeviction" else "keys evicted"
    observed(
        refused if policy == "noeviction" else evicted,
        lambda n: n > 0,
        f"memory pressure under maxmemory-policy {policy}: {want}",
    )
    return f"{evicted} keys evicted, {refused} writes refused (OOM)"


def eviction(policy: str, min_cycles: int = 1) -> Callable[[World, int], Stats]:
    """Fill a 4 MB node with 8 MB while A holds the lock, then let B try.
    ``min_cycles``: for policies that evict the lock key only some of the time, so that
    even a single cycle's run shows what they do. LRU idle times have a 1 s resolution,
    so the key is one of many equally idle candidates: about 2 cycles in 3.
    ``volatile-ttl`` evicts the shortest TTL among keys it samples at random, and misses
    the lock key in about 1 cycle of 100 (seen once in a full test run on Redis 6.2).
    A fill that evicted nothing (under ``noeviction``: had no write refused) is
    FaultNotObserved (:func:`memory_pressure`)."""

    def run(world: World, cycles: int) -> Stats:
        cycles = max(cycles, min_cycles)
        node = world.node("n1", extra_config={"maxmemory": "4mb", "maxmemory-policy": policy})
        lock = tenure([node.url], MAX_TTL)
        a = world.actor("A", lock, fenced=False)
        b = world.actor("B", lock, fenced=False)
        refused_fill = 0
        for c in range(cycles):
            hold(a, 2.0, "before the memory pressure", "there would be no lock key at risk")
            a.call("read")
            t = time.monotonic_ns()
            refused = 0
            with node.client() as r:
                before = int(r.info("stats")["evicted_keys"])
                payload = b"x" * 10_000
                for i in range(800):
                    try:
                        r.set(f"fill:{c}:{i}", payload, px=600_000)
                    except redis.ResponseError:
                        refused += 1
                evicted = int(r.info("stats")["evicted_keys"]) - before
                r.delete(*[f"fill:{c}:{i}" for i in range(800)])
            world.fault("memory pressure", node.name, t, memory_pressure(policy, evicted, refused))
            refused_fill += refused
            if b.call("acquire", 0.2) == "granted":
                use_and_release(b)
            a.call("write")
            a.call("release")
        return {"oom_refusals": refused_fill}

    return run


def script_flush(world: World, cycles: int) -> Stats:
    nodes = [world.node(f"n{i}") for i in range(1, 4)]
    lock = tenure([n.url for n in nodes], 1.0)
    workers = [world.actor(f"W{i}", lock, fenced=True) for i in range(1, 4)]
    seconds = 0.3 * cycles if cycles > 10 else 1.0 * cycles
    for w in workers:
        w.send("loop", seconds, 0.5, 0.002)
    stop = time.monotonic() + seconds
    t = time.monotonic_ns()
    clients = [n.client() for n in nodes]
    try:
        flushes = _flush_until(clients, stop)
        end = time.monotonic_ns()
        cached = sum(int(r.info("memory").get("number_of_cached_scripts", 0)) for r in clients)
    finally:
        for r in clients:
            r.close()
    world.fault(
        "SCRIPT FLUSH", "n1..n3", t, f"{flushes} flushes; {cached} scripts cached at the end"
    )
    for w in workers:
        w.result(seconds + 60)
    # grants_in_flushing: the grants asked for and made while the caches were flushed,
    # which the row requires (a run whose workers got nothing then tested nothing).
    return {"flushes": flushes, "window:flushing#0": t, "window_end:flushing#0": end}


def _flush_until(clients: list[redis.Redis], stop: float) -> int:
    """Flush every node's script cache every 20 ms until ``stop``; how many flushes
    (a loop apart from the caller's ``try``: docs/architecture.md, "A loop in a try or
    with block")."""
    flushes = 0
    while time.monotonic() < stop:
        for r in clients:
            r.script_flush()
            flushes += 1
        time.sleep(0.02)
    return flushes


# --- the catalogue ------------------------------------------------------------------------

_STORE_SAFE = ("C3", "C4", "C5")

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "failover",
        1,
        "Failover to an async replica that missed the lock",
        (
            Config(
                "plain Redlock, 1 master + async replica",
                False,
                lambda world, cycles: failover_single(world, cycles, kind="plain-redlock"),
                [violated("C1")],
                "the replica never saw A's lock; promoted, it grants B the same lock",
            ),
            Config(
                "tenure, 1 master + async replica",
                True,
                failover_single,
                zero(*SAFE),
                "the promoted node's replication history changed: it sits out max_ttl",
            ),
            Config(
                "1 master + replica, wait_replicas=1",
                True,
                lambda world, cycles: failover_single(world, cycles, wait_replicas=1),
                [*zero(*SAFE), at_least("fail_closed", 1), at_most("granted_unreplicated", 0)],
                "WAIT finds the replica cut off: A's grant fails closed and is released",
            ),
            Config(
                "Redlock, 3 independent masters",
                True,
                failover_redlock,
                zero(*SAFE),
                "the promoted replica is one vote of three; B cannot win a majority",
            ),
            Config(
                "plain lock, Sentinel failover",
                False,
                failover_sentinel("plain-redlock"),
                [violated("C1")],
                "3 Sentinels promote the replica that missed A's lock; B gets it from them",
            ),
            Config(
                "tenure, Sentinel failover",
                True,
                failover_sentinel("tenure"),
                [*zero(*SAFE), at_least("b_refused", 1), at_least("b_after_warmup", 1)],
                "the node the Sentinels promote has a new replication history: it warms up",
            ),
        ),
        soak_cycles=100,
    ),
    Scenario(
        "restart",
        2,
        "A lock node restarts without persistence",
        (
            Config(
                "plain Redlock, no persistence",
                False,
                restart(Persistence.NONE, "plain-redlock"),
                [violated("C1")],
                "node 3 forgets A's lock; B wins {3,4,5}",
            ),
            Config(
                "plain Redlock, AOF always",
                True,
                restart(Persistence.AOF_ALWAYS, "plain-redlock"),
                zero("C1", "C5"),
                "node 3 comes back with A's lock",
            ),
            Config(
                "tenure, no persistence (delayed restart)",
                True,
                restart(Persistence.NONE, "tenure"),
                zero(*SAFE),
                "node 3 lost its data, so it sits out max_ttl before voting again",
            ),
        ),
        soak_cycles=60,
    ),
    Scenario(
        "pause",
        3,
        "The holder pauses past its lease between check and write",
        (
            Config(
                "unfenced store",
                False,
                client_pause(False),
                [violated("C3"), violated("C5")],
                "A's late write lands on top of B's",
            ),
            Config(
                "fenced store",
                True,
                client_pause(True),
                [*zero(*SAFE), at_least("stale_rejected", 1)],
                "the store refuses A's older token",
            ),
        ),
        soak_cycles=200,
    ),
    Scenario(
        "clock",
        4,
        "A node's wall clock jumps forward (Kleppmann's five-node case)",
        (
            Config(
                "Redlock, unfenced store",
                False,
                clock_jump(False),
                [violated("C1"), violated("C3")],
                "node 3 expires A's key early; B wins {3,4,5}; A's write lands late",
            ),
            Config(
                "Redlock, fenced store (store safe, lock not)",
                True,
                clock_jump(True),
                [violated("C1"), *zero(*_STORE_SAFE), at_least("stale_rejected", 1)],
                "the lock is broken (honestly: Redlock trusts clocks), the store is not",
            ),
        ),
        soak_cycles=200,
    ),
    Scenario(
        "network",
        5,
        "Partitions, resets, dropped replies and slow nodes",
        (
            Config(
                "validity counted from the reply",
                False,
                slow_reply("naive-validity"),
                [violated("C1")],
                "a slow reply eats into a lease the holder thinks it still has",
            ),
            Config(
                "tenure, slow reply",
                True,
                slow_reply("tenure"),
                zero(*SAFE, "nonpositive_validity"),
                "validity = TTL - elapsed - drift, measured from the send",
            ),
            Config(
                "tenure, 5 nodes, faults",
                True,
                partitions,
                [
                    *zero(*SAFE, "nonpositive_validity"),
                    at_least("grants_in_minority_cut", 1),
                    # Refusals that say too few nodes answered: QuorumUnreachable, or a
                    # LockTimeout naming the failed nodes (runner._blames_nodes).
                    at_least("unreachable_in_majority_cut", 1),
                    # Each fault lasts 2 s; the lock must come back soon after each one.
                    at_most("longest_unavailable_ms", 10_000),
                    at_most("grants_in_majority_cut", 0),
                    at_most("grants_in_slow", 0),
                    # ... which says something only if the workers asked while slow.
                    premise("attempts_in_slow", 1, "acquires begun while every node was slow"),
                ],
                "a minority cut stays live, a majority cut refuses, late replies grant nothing",
            ),
            Config(
                "tenure, 5 nodes, new names through a minority outage",
                True,
                fresh_names,
                [
                    *zero(*SAFE),
                    at_least("fresh_granted", 80),
                    at_most("fresh_refused", 0),
                    at_most("fresh_disorder", 0),
                ],
                "a lock per entity: every name never used before is granted at once while "
                "a majority is up, its tokens in order",
            ),
        ),
        quick_cycles=3,
        soak_cycles=90,
    ),
    Scenario(
        "crash",
        6,
        "The holder crashes mid-hold",
        (
            Config(
                "SETNX without TTL",
                False,
                holder_crash("setnx-no-ttl"),
                [at_least("deadlocks", 1)],
                "nobody takes over until an operator deletes the key, itself unsafe (C1)",
            ),
            Config(
                "tenure",
                True,
                holder_crash("tenure"),
                [*zero("C1", "C4", "C5", "early_takeover"), at_most("takeover_s", 3.5)],
                "nobody before the lease ends; someone within TTL + back-off",
            ),
        ),
        soak_cycles=100,
    ),
    Scenario(
        "legacy",
        7,
        "Legacy lock patterns under a pause",
        (
            Config(
                "SETNX + GETSET expiry trick",
                False,
                pause_then_release("setnx-getset"),
                [violated("C1")],
                "A wakes and DELetes B's lock; C walks in beside B",
            ),
            Config(
                "SET NX PX, DEL without owner check",
                False,
                pause_then_release("no-owner-check"),
                [violated("C1")],
                "A wakes and DELetes B's lock; C walks in beside B",
            ),
            Config(
                "tenure",
                True,
                pause_then_release("tenure"),
                zero(*SAFE),
                "release is compare-and-delete: A's release finds B's token and leaves it",
            ),
        ),
        soak_cycles=150,
    ),
    Scenario(
        "eviction",
        8,
        "Memory eviction and script loss",
        (
            Config(
                "maxmemory-policy volatile-ttl",
                False,
                eviction("volatile-ttl", min_cycles=3),
                [violated("C1")],
                "every lock key has a TTL; this policy evicts the shortest TTL first",
            ),
            Config(
                "maxmemory-policy volatile-lru",
                False,
                eviction("volatile-lru", min_cycles=10),
                [violated("C1")],
                "every lock key has a TTL, so any volatile-* policy may evict a held lock",
            ),
            Config(
                "maxmemory-policy allkeys-lru",
                False,
                eviction("allkeys-lru", min_cycles=10),
                [violated("C1")],
                "allkeys-* policies evict any key, held locks included",
            ),
            Config(
                "maxmemory-policy noeviction",
                True,
                eviction("noeviction"),
                [*zero(*SAFE), at_least("oom_refusals", 1)],
                "writes fail with OOM instead; locks stay",
            ),
            Config(
                "tenure under SCRIPT FLUSH",
                True,
                script_flush,
                [*zero(*SAFE), premise("grants_in_flushing", 1, "grants while SCRIPT FLUSH ran")],
                "EVAL carries the script; a flushed cache costs nothing",
            ),
        ),
        soak_cycles=200,
    ),
)


def by_key() -> dict[str, Scenario]:
    return {s.key: s for s in SCENARIOS}

"""The servers behind a Sentinel-managed node or a whole Redis Cluster node, for
``tenure check`` and ``tenure status``.

Both commands read servers one by one; a ``redis+sentinel://`` node is the master its
Sentinels name now (every Sentinel asked, side by side, as the clients ask each one:
``_driver.sentinel.Locator``; the master picked as the clients' connections end up
picking it, and every Sentinel that says otherwise reported: ``_core.sentinel.Survey``), and a
``redis+cluster://`` node is every server of its slot map (``CLUSTER SLOTS`` from the
seeds in turn, parsed by ``_core.slots.SlotMap`` as the clients parse it). Each server is
then a plain node with the listed node's credentials, TLS and query settings.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

import redis

from .._core.config import NodeAddress, host_port
from .._core.diagnosis import Diagnosis, no_slot_map, not_a_cluster
from .._core.quorum import Failure
from .._core.sentinel import Heard, Survey, question_refused, role_of, watch_refused
from .._core.sentinel import not_a_master as sentinel_not_a_master
from .._core.slots import SlotMap, map_sources
from .._driver import acl as _acl
from .._driver.redis_compat import before_first_reply, connection_kwargs, diagnose, reply_text
from .._driver.sentinel import Locator
from .._driver.sentinel_watch import refusal
from ._parallel import budget, each, late_detail

__all__ = ["Resolved", "cluster_map", "not_a_master", "sentinel_master", "sentinel_seconds"]


# How many connections and replies, each within the node timeout, finding a Sentinel
# node's master waits for one after another at most: each Sentinel asked (connect,
# reply; again without credentials after refusing them), all side by side; then each
# master named checked with ROLE (connect, reply), all side by side. Each step has its
# own budget (``_parallel.budget``), so one Sentinel or master that never ends its reply
# is reported as such, not waited for: ``sentinel_seconds`` is their sum.
_ASK_WAITS = 4
_ROLE_WAITS = 2
# Then each Sentinel that answered is asked for the clients' subscription to its
# announcements of a failover, as the clients subscribe (connect, reply; again without
# credentials after refusing them; SENTINEL MASTER; SUBSCRIBE; PING), all side by side.
_WATCH_WAITS = 6


def sentinel_seconds(timeout: float) -> float:
    """The most ``sentinel_master`` takes with ``timeout`` per connection and reply."""
    return (
        budget(_ASK_WAITS, timeout) + budget(_ROLE_WAITS, timeout) + budget(_WATCH_WAITS, timeout)
    )


@dataclass(frozen=True)
class Resolved:
    """A server a listed node stands for now: ``address`` (a plain node with the listed
    node's settings) and ``where``, its ``host:port``; for a Sentinel-managed node, the
    Sentinel that named it (``named_by``), whether it answered ``ROLE`` as a master
    (``usable``), and what to say of each other Sentinel that named another master, or
    none, and of each Sentinel that refuses the clients' subscription to its
    announcements of a failover, or the question they ask before it
    (``sentinel_warnings``: worded by ``Survey``, ``watch_refused`` and
    ``question_refused``)."""

    address: NodeAddress
    where: str
    named_by: tuple[str, int] | None = None
    usable: bool = False
    sentinel_warnings: tuple[str, ...] = ()


def sentinel_master(address: NodeAddress, timeout: float) -> Resolved:
    """The master the clients of ``address`` would use now: the first master named, in
    the order the Sentinels are listed, that answers ``ROLE`` as a master, as a client's
    connections find it (``Survey``); when none can be used, the first named (``usable``
    False). Every Sentinel is asked, side by side, each within ``timeout`` per connection
    and reply, and every master named is checked so, so that each Sentinel that disagrees,
    names no master, or cannot be asked is reported, wherever it is listed; then each
    Sentinel that answered is asked for the clients' subscription to its announcements
    of a failover (and the question they ask before it), and one whose ACL refuses
    either is reported with the rule that grants it; the whole takes at most
    ``sentinel_seconds(timeout)``.

    Raises:
        LookupError: no Sentinel named a master: the service and what each Sentinel said
            (and, where a Sentinel refused the question by its ACL, the rule that grants it).
    """
    assert address.sentinel is not None
    spec = address.sentinel
    settings = redis.ConnectionPool.from_url(address.redis_url).connection_kwargs
    # The clients give each Sentinel a share of connect_timeout; here each gets `timeout`.
    locator = Locator(address, settings, timeout * (len(spec.sentinels) + 1), asyncio=False)
    heard = each(
        list(dict.fromkeys(spec.sentinels)),
        locator.hear,
        lambda sentinel, seconds: Heard(
            sentinel, why=Diagnosis(Failure.UNREACHABLE, late_detail(seconds, "Sentinel's"))
        ),
        lambda _: budget(_ASK_WAITS, timeout),
    )
    survey = Survey(spec.service, heard)
    masters = survey.named()
    unusable = each(
        masters,
        lambda master: _unusable(address.server_at(*master), timeout),
        lambda _, seconds: "failed: " + late_detail(seconds, "server's"),
        lambda _: budget(_ROLE_WAITS, timeout),
    )
    pick = survey.pick(dict(zip(masters, unusable, strict=True)))
    user = settings.get("username") or "default"
    if pick is None:
        text = str(locator.no_master(heard))
        if _acl.denial(text) == "command":
            text += f". Fix (on each Sentinel): {_acl.sentinel_fix(user, question=True)}"
        raise LookupError(text)
    answered = [h.sentinel for h in heard if h.master is not None or h.answered]
    refused = each(
        answered,
        lambda sentinel: refusal(locator, sentinel),
        lambda _, seconds: None,  # it answered the question: its ACL is not in doubt
        lambda _: budget(_WATCH_WAITS, timeout),
    )
    watch = tuple(
        f"{(question_refused if no.question else watch_refused)(spec.service, sentinel, no.said)}"
        f". Fix (on that Sentinel): {_acl.sentinel_fix(user)}"
        for sentinel, no in zip(answered, refused, strict=True)
        if no is not None and _acl.denial(no.said) is not None
    )
    return Resolved(
        address.server_at(*pick.master),
        host_port(*pick.master),
        pick.by,
        pick.usable,
        pick.warnings + watch,
    )


def _unusable(server: NodeAddress, timeout: float) -> str | None:
    """Why the clients could not use ``server`` as the master (it says it is not a
    master, or does not answer ``ROLE``), as "which ..." continues it; None when they
    could."""
    options = connection_kwargs(timeout, asyncio=False, unix=False)
    options["socket_timeout"] = timeout
    try:
        with redis.Redis.from_url(server.url, **options) as client:
            role = role_of(client.execute_command("ROLE"))
    except redis.RedisError as exc:
        return f"failed: {diagnose(exc).detail.rstrip('.')}"
    return None if role == "master" else f"is a {role}"


def not_a_master(address: NodeAddress, master: Resolved, timeout: float) -> str | None:
    """Why ``master``, named by the Sentinels of ``address``, is not the node's master
    now (it answers ``ROLE`` with another role: a failover under way, or Sentinels whose
    view is stale), in the clients' words; None when it is a master.

    The clients check every connection so and use no other server (the node is
    unreachable to them meanwhile), so a command that reads the node as they do checks
    it too, rather than report a replica's data as the master's.

    Raises:
        redis.RedisError: the server did not answer ``ROLE``.
    """
    assert address.sentinel is not None
    options = connection_kwargs(timeout, asyncio=False, unix=False)
    options["socket_timeout"] = timeout
    with redis.Redis.from_url(master.address.url, **options) as client:
        reply = client.execute_command("ROLE")
    role = role_of(reply)
    if role == "master":
        return None
    at = master.address
    assert at.host is not None
    assert at.port is not None
    service = address.sentinel.service
    return sentinel_not_a_master(
        service, (at.host, at.port), role, master.named_by, "run the command again"
    )


def cluster_map(address: NodeAddress, timeout: float) -> SlotMap:
    """The slot map of Cluster node ``address`` (``CLUSTER SLOTS``, from the seeds in
    turn, each under ``timeout``).

    Raises:
        LookupError: no seed gave it; why, as the clients diagnose it.
    """
    failures: list[Diagnosis] = []
    for host, port in map_sources(address.seeds, None):
        member = address.member(host, port)
        name = host_port(host, port)
        options = connection_kwargs(timeout, asyncio=False, unix=False)
        client = redis.Redis.from_url(member.url, **options)
        conn = client.connection_pool.make_connection()
        try:
            conn.connect()  # type: ignore[no-untyped-call]
            conn.send_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
            return SlotMap.parse(conn.read_response(), (host, port))
        except redis.ResponseError as exc:
            failures.append(not_a_cluster(name, reply_text(exc)))
        except ValueError as exc:
            failures.append(Diagnosis(Failure.ERROR, f"{name}: {exc}"))
        except Exception as exc:  # not BaseException: an interrupt is no node's failure
            why = before_first_reply(diagnose(exc, plain="redis+cluster"), exc, member.login_form)
            failures.append(Diagnosis(why.failure, f"{name}: {why.detail}"))
        finally:
            with contextlib.suppress(Exception):
                conn.disconnect()  # type: ignore[no-untyped-call]
            client.close()
    why = no_slot_map(failures)
    text = f"no slot map: {why.failure.value}: {why.detail}"
    if any(_acl.denial(f.detail) == "command" for f in failures):
        # What the slot map needs of the URL's user on every member: CLUSTER SLOTS.
        user = unquote(urlsplit(address.member(*address.seeds[0]).url).username or "")
        rules = " ".join(
            f"+{n.name.lower()}" for n in _acl.needs(kind="cluster") if n.name == "CLUSTER|SLOTS"
        )
        text += f". Fix (on each member): ACL SETUSER {user or 'default'} {rules}"
    raise LookupError(text)

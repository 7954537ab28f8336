"""A Sentinel-managed node: which Sentinel to ask, what its answers mean (pure).

A node given as ``redis+sentinel://`` is the master the Sentinels know by a service name.
Every connection to it (a round's, the notification listener's) starts by asking the
Sentinels ``SENTINEL GET-MASTER-ADDR-BY-NAME <service>``, one after the other, each under
a short timeout (``ask_timeout``), then checks with ``ROLE`` that the server named is a
master before anything else is sent. The drivers' connections do the asking
(``_driver.sentinel``); this module decides the order, reads the replies and words the
failures. A connection that fails, and a master that answers ``READONLY`` (it was
demoted: ``demoted``), make the next connection ask again, so the node follows a
failover; meanwhile it is silent, like any node that does not answer. A failover the
Sentinels announce (``SWITCH_CHANNEL``), or that their configuration epoch shows once a
subscription is made again (``sentinel_watch``), ends the connections to every other
server at once (``_driver.sentinel_watch``): ``switched_to`` reads the announcement, and
``moved_meanwhile`` refuses a connection set up from an answer it overtook.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .config import host_port
from .diagnosis import Diagnosis
from .quorum import Failure
from .resp import as_text

__all__ = [
    "SWITCH_CHANNEL",
    "Heard",
    "Pick",
    "SentinelBook",
    "Survey",
    "ask_timeout",
    "auth_refused",
    "demoted",
    "fallback_failed",
    "login_fix",
    "master_reply",
    "moved_meanwhile",
    "no_master",
    "not_a_master",
    "question_refused",
    "role_of",
    "sentinel_login",
    "switched_to",
    "watch_refused",
]

Address = tuple[str, int]


UNKNOWN_SERVICE = "does not know the service (check the service name in the node URL)"

# The channel on which every Sentinel announces that it moved a service to a new master
# (a failover's end, as it updates its own view): "<service> <old host> <old port> <new
# host> <new port>".
SWITCH_CHANNEL = "+switch-master"


def _where(address: Address) -> str:
    return host_port(*address)


class SentinelBook:
    """One node's Sentinels, in the order they are asked, and what they said.

    The Sentinel that answered last is asked first next time: it is known to be up and
    to know the service, so one round trip usually suffices. The master it named is kept
    (``master``) for when no Sentinel answers at all (``candidates``). A Sentinel whose
    master could not be used (``misled``) is asked last instead: Sentinels may disagree,
    and one whose view is out of date (cut off from the others, or left monitoring a
    server that is a replica now) must not be the only one heard while the others name
    the master.
    """

    __slots__ = ("_announced", "_no_auth", "_order", "master")

    def __init__(self, sentinels: Sequence[Address]) -> None:
        self._order = list(dict.fromkeys(sentinels))
        self._no_auth: set[Address] = set()
        self.master: Address | None = None
        self._announced: Address | None = None

    def order(self) -> list[Address]:
        """The Sentinels in the order to ask them."""
        return list(self._order)

    def announced(self, master: Address) -> None:
        """A Sentinel announced ``master`` as the service's new master (``switched_to``)."""
        self.master = self._announced = master

    def answered(self, sentinel: Address, master: Address) -> bool:
        """``sentinel`` named ``master``: whether to connect to it (then ``sentinel`` is
        asked first from now on).

        Not when a failover to another master was announced: ``sentinel`` has not learnt
        of it yet (the others learn of it from the Sentinel that carried it out within
        seconds), or was cut off from the others, and names the old master, which stays
        a master until the Sentinels demote it. It is asked last (``misled``), and the
        next one is asked.
        """
        if self._announced is not None and master != self._announced:
            self.misled(sentinel)
            return False
        if sentinel in self._order:
            self._order.remove(sentinel)
            self._order.insert(0, sentinel)
        self.master = master
        return True

    def only_others(self, sentinel: Address, master: Address) -> None:
        """Every Sentinel that answered named another master than the one announced
        (``sentinel``, ``master``: the first of them): they learnt of a later failover,
        or those that know of the announced one do not answer. Their answer is used, as
        it would have been without the announcement, which is forgotten."""
        self._announced = None
        self.answered(sentinel, master)

    def misled(self, sentinel: Address) -> None:
        """The master ``sentinel`` named could not be used (its connection failed, or
        ``ROLE`` says it is not a master): ask it last from now on.

        Asked first again, it would name the same server at every connection, and the
        node would stay unreachable for as long as that one Sentinel's view is out of
        date, however many of the others name the master. Asked last, it is heard only
        when the others do not answer; during a failover every Sentinel names the old
        master for a moment, and moving them around then costs nothing.
        """
        if sentinel in self._order:
            self._order.remove(sentinel)
            self._order.append(sentinel)

    def without_auth(self, sentinel: Address) -> bool:
        """Whether ``sentinel`` is asked without credentials (it refused them once and
        answered without: ``auth_refused``)."""
        return sentinel in self._no_auth

    def takes_no_auth(self, sentinel: Address) -> None:
        self._no_auth.add(sentinel)

    def candidates(self, found: Address | None) -> Address | None:
        """Where to connect: the master a Sentinel named now, or, when none answered,
        the one named last (still checked with ``ROLE``): a Sentinel outage alone does
        not take a healthy master out of the lock."""
        return found if found is not None else self.master


class Heard(NamedTuple):
    """What one Sentinel said when asked for the master: the master it named, or why it
    named none (``why``); ``answered``: it answered, naming none (it does not know the
    service, or answered nonsense); ``login``: it refused the login (``sentinel_login``)."""

    sentinel: Address
    master: Address | None = None
    why: Diagnosis | None = None
    answered: bool = False
    login: bool = False


@dataclass(frozen=True)
class Pick:
    """The master the clients would use (``master``, named by Sentinel ``by``), whether
    it can be used (``usable``), and what to say of each Sentinel whose answer differs
    (``warnings``, worded, in the order listed)."""

    master: Address
    by: Address
    usable: bool
    warnings: tuple[str, ...] = ()


class Survey:
    """A command's look at one node's Sentinels (``tenure check``, ``tenure status``):
    every Sentinel's answer (``Heard``, in the order listed), the master the clients
    would use, and each Sentinel whose answer differs from it.

    A client finds that master over several connections: each asks the Sentinels in
    the book's order and takes the first master named; when it cannot be used (a failed
    connection, or ``ROLE`` says it is not a master), that Sentinel is asked last from
    then on (``SentinelBook.misled``), so the next connection hears the next one. The
    clients so end on the master named by the first Sentinel listed whose master can be
    used (``pick``); when none can, the first named is reported (a failover under way,
    or every Sentinel out of date). The clients stop at that Sentinel; a command asks
    every one (side by side, each under its own timeout), since an operator wants to
    know of each Sentinel that is out of date, does not know the service, or cannot be
    asked, not only of those listed before the one the clients heard: each leaves the
    clients one Sentinel fewer than listed to find the master with.
    """

    __slots__ = ("heard", "service")

    def __init__(self, service: str, heard: Sequence[Heard]) -> None:
        self.service = service
        self.heard = list(heard)

    def named(self) -> list[Address]:
        """Every master named, once, in the order listed: each to check with ``ROLE``."""
        return list(dict.fromkeys(h.master for h in self.heard if h.master is not None))

    def pick(self, unusable: Mapping[Address, str | None]) -> Pick | None:
        """The master the clients would use, ``unusable`` saying why each master named
        cannot be used ("is a slave", "failed: connection refused": read after
        "which"), None where it can; None when no Sentinel named a master."""
        named = [(h.sentinel, h.master) for h in self.heard if h.master is not None]
        if not named:
            return None
        usable = [(by, master) for by, master in named if unusable[master] is None]
        by, master = usable[0] if usable else named[0]
        return Pick(master, by, bool(usable), tuple(self._warnings(master, by, unusable)))

    def _warnings(
        self, master: Address, by: Address, unusable: Mapping[Address, str | None]
    ) -> list[str]:
        service = self.service
        # When no master named can be used, the node's own line (or row) says so, and
        # each warning says only what the Sentinel said.
        used = (
            f"the clients use {_where(master)}, named by Sentinel {_where(by)}"
            if unusable[master] is None
            else ""
        )
        view = f"(check that Sentinel's view: SENTINEL MASTER {service} on it)"
        out = []
        for heard in self.heard:
            if heard.sentinel == by or heard.master == master:
                continue  # it agrees
            who = f"Sentinel {_where(heard.sentinel)}"
            named = heard.master
            if named is None:
                assert heard.why is not None
                fewer = f"; {used}, and find it through one Sentinel fewer" if used else ""
                if heard.answered:
                    said = heard.why.detail
                    said = "it does not know it" if said == UNKNOWN_SERVICE else said
                    out.append(
                        f"{who} names no master of service {service!r}: {said}{fewer} {view}"
                    )
                else:
                    said = heard.why.detail.rstrip(".")
                    out.append(
                        f"{who} cannot be asked for the master of service {service!r}: "
                        f"{said}{fewer}"
                    )
            elif (why := unusable[named]) is not None:
                text = f"names {_where(named)} master of service {service!r}, which {why}"
                if used:  # as worded when only the Sentinels before ``by`` were reported
                    out.append(
                        f"{who} is out of date: it {text}; the clients ask it last and use "
                        f"{_where(master)}, named by Sentinel {_where(by)} {view}"
                    )
                else:
                    out.append(f"{who} {text} {view}")
            else:
                # Another server that says it is a master (listed after ``by``, or it
                # would be the one picked): the clients lock on it whenever this Sentinel
                # is the first they hear, the ones before it down.
                out.append(
                    f"{who} disagrees: it names {_where(named)} master of service "
                    f"{service!r}, which answers ROLE as a master too; {used}, and would "
                    f"use {_where(named)} whenever this Sentinel is the first they hear: "
                    "two servers say they are the master (check the Sentinels' view, "
                    f"SENTINEL MASTER {service} on each, and ROLE on both servers)"
                )
        return out


def ask_timeout(connect_timeout: float, sentinels: int) -> float:
    """How long one Sentinel is given to answer: a share of ``connect_timeout`` such
    that asking every Sentinel in turn leaves one share for connecting to the master."""
    return connect_timeout / (sentinels + 1)


def master_reply(reply: object) -> Address | None:
    """The master in a reply to ``SENTINEL GET-MASTER-ADDR-BY-NAME``; None if the
    Sentinel does not know the service (a nil reply).

    Raises:
        ValueError: a reply of another shape (not a Sentinel's).
    """
    if reply is None:
        return None
    if isinstance(reply, (list, tuple)) and len(reply) == 2:
        host, port = reply
        if isinstance(host, bytes):
            host = host.decode("utf-8", "replace")
        if isinstance(port, bytes):
            port = port.decode("ascii", "replace")
        if isinstance(host, str) and host and str(port).isdigit() and 0 < int(port) < 65536:
            return host, int(port)
    raise ValueError(f"not a master's address: {reply!r:.80}")


def switched_to(service: str, message: object) -> Address | None:
    """The new master in a ``SWITCH_CHANNEL`` message (``message``, its payload), if it
    moved ``service``; None for another service's, or a payload of another shape (a
    subscriber learns nothing from it, and keeps its connections)."""
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    if not isinstance(message, str):
        return None
    parts = message.split()
    if len(parts) != 5 or parts[0] != service:
        return None
    host, port = parts[3], parts[4]
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


def watch_refused(service: str, sentinel: Address, said: str) -> str:
    """What ``tenure check`` and ``tenure status`` say of a Sentinel whose ACL refuses the
    clients' subscription to ``SWITCH_CHANNEL`` (``said``: its refusal)."""
    return (
        f"Sentinel {_where(sentinel)} refuses the clients' subscription to its "
        f"announcements of a failover ({SWITCH_CHANNEL}: {said.strip()[:100]}): the clients "
        "subscribe on another Sentinel, and where none lets them, they follow a failover "
        f"of service {service!r} only once the old master is demoted, seconds after it is "
        "announced, locking on the old master meanwhile"
    )


def question_refused(service: str, sentinel: Address, said: str) -> str:
    """What ``tenure check`` and ``tenure status`` say of a Sentinel whose ACL lets the
    clients subscribe but refuses ``SENTINEL MASTER``, which they ask before subscribing
    (``said``: its refusal)."""
    return (
        f"Sentinel {_where(sentinel)} refuses the clients' question for the master's "
        f"configuration (SENTINEL MASTER {service}: {said.strip()[:100]}), asked before "
        "they subscribe to its announcements of a failover: a failover announced while "
        "their subscriptions were down is followed only once the old master is demoted, "
        "locking on the old master meanwhile"
    )


def moved_meanwhile(service: str, master: Address, new: Address) -> str:
    """Why a connection to ``master`` is not used: the Sentinels announced ``new`` as
    the master of ``service`` after the Sentinel was asked that named ``master``."""
    return (
        f"{_where(master)} was named master of service {service!r}, and the Sentinels "
        f"have announced {_where(new)} since; the node is asked again after its back-off"
    )


def role_of(reply: object) -> str:
    """The role in a reply to ``ROLE``: ``master``, ``slave``, ``sentinel``, or what it
    is when the reply is not a role (quoted, for a message)."""
    if isinstance(reply, (list, tuple)) and reply:
        return as_text(reply[0])
    return repr(reply)[:40]


def auth_refused(text: str) -> bool:
    """Whether an error reply to a Sentinel's handshake refuses the credentials (sent
    because the node's URL has them): such a Sentinel is asked again without any, as
    Sentinels are often run without a password while their masters have one."""
    lower = text.lower()
    return (
        "called without any password configured" in lower
        or "wrongpass" in lower
        or "invalid password" in lower
        or "invalid username-password" in lower
    )


def sentinel_login(text: str, *, sent_credentials: bool, own_settings: bool) -> Diagnosis | None:
    """A Sentinel's refusal of the login (``text``, its error reply, code first), worded
    for a Sentinel; None when ``text`` refuses no login. ``no_master`` then adds the fix
    (``login_fix``) once.

    A node URL carries one user and password, the master's, and the Sentinels are asked
    with them or, when they refuse them, without any (``auth_refused``). So a Sentinel
    that still asks for a login wants credentials of its own, which the URL cannot hold
    beside the master's: the generic advice ("give it in the node URL") would send the
    reader back to the URL that already has the only password it can hold. A
    ``master_for()`` client's Sentinels are asked with its Sentinel object's
    ``sentinel_kwargs`` (``own_settings``) instead.
    """
    upper, lower = text.upper(), text.lower()
    required = (
        upper.startswith("NOAUTH")
        or "authentication required" in lower
        or "unauthenticated" in lower
    )
    if not required and not auth_refused(text):
        return None
    said = text.strip()[:80]
    if own_settings:
        if sent_credentials:
            why = (
                "refused the user and password of sentinel_kwargs, and a request without "
                f"any ({said})"
            )
        else:
            why = f"requires a password ({said}), and sentinel_kwargs has none"
        return Diagnosis(Failure.MISCONFIGURED, why)
    if sent_credentials:
        why = (
            f"requires a login of its own ({said}): it refused the node's user and "
            "password, which are the master's, and a request without any"
        )
    else:
        why = f"requires a password ({said}), and the node has none"
    return Diagnosis(Failure.MISCONFIGURED, why)


def login_fix(*, own_settings: bool) -> str:
    """How to give Sentinels that refused the login (``sentinel_login``) what they ask."""
    if own_settings:
        return (
            "the Sentinels are asked with the sentinel_kwargs of the redis.sentinel.Sentinel "
            "object the master_for() client came from (its other settings are the "
            "master's): give the Sentinels' user and password there"
        )
    return (
        "the node's user and password are used for the master and the Sentinels alike: "
        "give the Sentinels the master's (redis+sentinel://user:password@host:port"
        "[,host:port...]/service_name), or give the node as a redis-py master_for() client "
        "whose Sentinel object has the Sentinels' own in sentinel_kwargs"
    )


def no_master(service: str, said: Sequence[tuple[Address, Diagnosis]], fix: str = "") -> Diagnosis:
    """Why no master was found, as the node's failure: every Sentinel asked, and what
    each said.

    The node is unreachable, unless every Sentinel failed for its configuration: a data
    server listed as a Sentinel (it will never name a master), a certificate rejected,
    credentials refused. Then the node is misconfigured, and an acquire says so at once
    (``NodeMisconfigured``) instead of waiting for it to recover. A Sentinel that does
    not know the service yet, or is down, leaves the node unreachable: it may come."""
    each = "; ".join(f"{_where(s)}: {why.detail}" for s, why in said)
    detail = f"no Sentinel named a master for service {service!r} ({each})"
    if fix:
        detail += f"; {fix}"
    kinds = {why.failure for _, why in said}
    if kinds and all(kind.configuration for kind in kinds):
        # Read after the node's name ("node redis+sentinel://... cannot be found: ...").
        return Diagnosis(
            kinds.pop() if len(kinds) == 1 else Failure.MISCONFIGURED,
            f"cannot be found: {detail}",
        )
    return Diagnosis(Failure.UNREACHABLE, detail)


def fallback_failed(
    service: str, said: Sequence[tuple[Address, Diagnosis]], master: Address, why: Diagnosis
) -> Diagnosis:
    """No Sentinel answered (``said``: what each did), so a connection went to the master
    they named last, and that failed too (``why``): the node's failure.

    Unreachable, it names the Sentinels as well as the master: the master's failure alone
    ("connection refused") reads as a master that is down, which the Sentinels will
    replace, when no Sentinel is there to replace it. A master that refuses for its
    configuration (credentials, TLS) is named as it is: no Sentinel changes that.
    """
    if why.failure is not Failure.UNREACHABLE:
        return why
    each = "; ".join(f"{_where(s)}: {d.detail}" for s, d in said)
    return Diagnosis(
        Failure.UNREACHABLE,
        f"no Sentinel answered for service {service!r} ({each}), and the master they "
        f"named last, {_where(master)}, failed too: {why.detail}",
    )


def not_a_master(
    service: str,
    master: Address,
    role: str,
    by: Address | None,
    then: str = "the node is asked again after its back-off",
) -> str:
    """The server the Sentinels named answered ``ROLE`` with another role; ``then``: what
    happens next (a client asks again; a command is run again)."""
    who = f"Sentinel {_where(by)}" if by is not None else "the last Sentinel that answered"
    return (
        f"{_where(master)}, named master of service {service!r} by {who}, is a {role}: "
        f"a failover is under way, or the Sentinels' view is out of date; {then}"
    )


def demoted(why: Diagnosis) -> Diagnosis:
    """A Sentinel node's failure as it should count: a ``READONLY`` reply means its
    master was demoted (the Sentinels moved the service), not that the node is set up
    wrong. The node is then silent until its next connection finds the new master."""
    if why.failure is Failure.MISCONFIGURED and "read-only replica" in why.detail:
        return Diagnosis(
            Failure.UNREACHABLE,
            "its master was demoted to a replica (it answered READONLY); the Sentinels are "
            "asked for the new one",
        )
    return why

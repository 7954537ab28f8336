"""What a node's failure means, and what to tell the person who has to fix it (pure).

A node can fail because it is down (refused, reset, silent: it may come back) or because
of how it is set up: a read-only replica listed instead of its master, a wrong or missing
password, an ACL user lacking a permission, something that is not Redis at that address,
a TLS certificate the client cannot accept.
The second kind does not pass with time, so tenure says which node and what to change,
rather than "impossible until they recover".

The drivers turn every exception of a node into a ``Diagnosis`` (``_driver.redis_compat``) and
record it in the round as a per-node failure; nothing a node says escapes raw. Whether
such failures end an acquire is decided in ``Acquisition.conclude``: at once when the
misconfigured nodes alone leave no majority (retrying cannot help), otherwise the lock
goes on with the other nodes and the client logs each misconfigured node once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .._errors import NodeMisconfigured, ServerUnsupported, TLSCertificateError
from .backoff import STALL
from .config import DEFAULT_KEY_PREFIX, NodeAddress
from .quorum import Failure, Round

__all__ = [
    "ACL_HINT",
    "BackingOff",
    "Diagnosis",
    "acl_hint",
    "acl_refused",
    "being_probed",
    "certificate_rejected",
    "check_command",
    "closed_before_answering",
    "cluster_node",
    "configuration_error",
    "error_reply",
    "for_prefix",
    "in_url_form",
    "naming",
    "not_connected_in_time",
    "not_redis",
    "silent_since_stall",
    "store_problem",
    "tls_handshake_timed_out",
    "wrong_type",
]

# How long a quoted server reply may be in a message (a garbage-speaking server may send
# kilobytes; the first few bytes say what it is).
_QUOTE = 80
_STORE_QUOTE = 400


def check_command(prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """The ``tenure check`` command line that checks a node for clients of ``prefix``."""
    if prefix == DEFAULT_KEY_PREFIX:
        return "tenure check"
    return f"tenure check --key-prefix {prefix}"


def acl_hint(prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """What to grant an ACL user so that clients with key prefix ``prefix`` can lock."""
    return (
        "give its ACL user EVAL, EXISTS, WAIT, SUBSCRIBE and the commands tenure's scripts "
        f"call, on keys ~{prefix}* and channels &{prefix}wake:* (`{check_command(prefix)}` "
        "names what is refused)"
    )


# The hint under the default prefix. The drivers diagnose a node's reply without knowing
# the client's prefix (a reply is the node's, not the client's), so a diagnosis carries
# this one; ``for_prefix`` turns it into the client's where a message is made for people.
ACL_HINT = acl_hint()


def for_prefix(detail: str, prefix: str) -> str:
    """``detail`` as said to a client whose key prefix is ``prefix``: an ACL hint in it
    names that prefix's keys and channels rather than the default's."""
    if prefix == DEFAULT_KEY_PREFIX or ACL_HINT not in detail:
        return detail
    return detail.replace(ACL_HINT, acl_hint(prefix))


@dataclass(frozen=True)
class Diagnosis:
    """Why a node gave no usable answer: the kind of failure, and a message for people.

    For a configuration failure ``detail`` reads after the node's name: "is a read-only
    replica: list its master instead (READONLY ...)".
    """

    failure: Failure
    detail: str


class BackingOff(Exception):
    """A node in its reconnect back-off: not even tried. Both drivers raise it.

    It is reported as backing off, unless it was dropped for its configuration: then it
    is still that failure, whose message says what to fix.
    """

    def __init__(self, wait: float, last: Diagnosis | None = None) -> None:
        self.failure = Failure.BACKING_OFF
        self.detail = f"not retried until the back-off ends ({wait:.3f}s)"
        if last is not None and last.failure.configuration:
            self.failure = last.failure
            self.detail = last.detail
        elif last is not None:
            # The cause, or an error read later says only "backing off" and a user
            # cannot tell a refused connection from a node that stopped answering.
            self.detail += f" after it failed: {last.failure.value}: {last.detail}"
        super().__init__(self.detail)


def rule_out(
    rnd: Round, order: Sequence[int], backing_off: Callable[[int], tuple[float, Diagnosis | None]]
) -> list[int] | None:
    """The "send nothing if hopeless" check before an acquire round.

    ``backing_off(i)`` is node ``i``'s reconnect back-off (seconds left, 0 if none) and
    why it last failed. Those nodes are recorded in ``rnd`` as not tried. Returns the
    nodes still to ask, or None when the round is already decided or impossible: an
    acquire that cannot win would only leave keys to clean up, and replies to owe, on
    the nodes that are up.
    """
    for i in order:
        wait, last = backing_off(i)
        if wait:
            down = BackingOff(wait, last)
            rnd.fail(i, down.failure, down.detail)
    if rnd.decided or rnd.impossible:
        return None
    return [i for i in order if rnd.results[i] is None]


def _quote(text: str, limit: int = _QUOTE) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _essence(text: str) -> str:
    """The node's own words in an error raised inside a script, without the wrapping.

    Redis 6.2 wraps them before ("ERR Error running script (call to f_<sha>):
    @user_script:1: @user_script: 1: -READONLY You can't write ...", or "...:
    @user_script:1: WRONGTYPE Operation ..."), Valkey and Redis 7 after ("WRONGTYPE
    Operation against a key ... script: on @user_script:168."); the script's hash and
    line say nothing to the reader.
    """
    if "script" not in text:
        return text
    code = re.search(r": -([A-Z]+ .*)$", text)
    if code:
        return code.group(1)
    said, cut, _ = text.rpartition(" script: ")
    if cut and said:
        return said
    return text.rsplit(": ", 1)[-1]


def acl_refused(text: str) -> Diagnosis:
    """A command, key or channel refused by the node's ACL (``text``, the whole reply).

    ``CLIENT SETNAME`` and ``SELECT`` are not tenure's: redis-py sends them on every new
    connection when the node's URL, ``connection_options`` or redis-py object sets
    ``client_name``, or a database other than 0, and the least-privilege ACL line does
    not grant them. The fix is that one permission, not the lock's commands the user
    already has.
    """
    lower = text.lower()
    # Redis 6.2 names the command alone ("... to run the 'client' command or its
    # subcommand"): SETNAME is the only CLIENT subcommand tenure's connections send.
    if "client|setname" in lower or "'client' command" in lower:
        return Diagnosis(
            Failure.UNSUPPORTED,
            f"refused by ACL ({text}): every connection names itself (client_name) with "
            "CLIENT SETNAME; grant its ACL user +client|setname, or leave client_name out",
        )
    # "... to run the 'select' command" (Redis 6.2 adds "or its subcommand").
    if "'select'" in lower:
        return Diagnosis(
            Failure.UNSUPPORTED,
            f"refused by ACL ({text}): every connection selects the node's database (the "
            "/db of its URL, or the db of its redis-py object) with SELECT; grant its ACL "
            "user +select, or use database 0",
        )
    return Diagnosis(Failure.UNSUPPORTED, f"refused by ACL ({text}): {ACL_HINT}")


def at_connection_limit(text: str) -> bool:
    """Whether an error reply is a node refusing the connection itself, at its
    ``maxclients``: it sends that instead of an answer to whatever comes first, and
    closes the connection. Nothing ran (redis-py raises ``ConnectionError`` for it).
    A cluster node counts its cluster bus's connections too, and says so ("max number
    of clients + cluster connections reached")."""
    lower = text.lower()
    return "max number of clients" in lower and "reached" in lower


def refuses_connection(text: str) -> bool:
    """Whether an error reply is a node refusing the connection itself, sent as it takes
    it, before any request, and followed by its close: at its connection limit
    (``at_connection_limit``), or in protected mode to a client on another machine
    (``DENIED``; redis-py raises it as a ``ResponseError``)."""
    return at_connection_limit(text) or text.upper().startswith("DENIED")


def error_reply(text: str) -> Diagnosis:
    """Classify a node's error reply, given as Redis sent it ("READONLY You can't ...").

    An error raised inside one of tenure's scripts arrives wrapped ("ERR Error running
    script ...: -READONLY ..."), so codes are looked for anywhere in the text.
    """
    essence = _essence(text)
    said = _quote(essence)
    code = essence.upper()  # the reply's own code first (an error a script raised, too)
    upper = text.upper()
    # Redis 6.2 quotes a command name with backquotes ("unknown command `SENTINEL`"),
    # Redis 7 and Valkey with single quotes: matched alike.
    lower = text.lower().replace("`", "'")
    if "READONLY" in upper:
        return _misconfigured(f"is a read-only replica: list its master instead ({said})")
    if code.startswith("DENIED"):
        # Sent only to clients of other machines (never on loopback), as the connection
        # is taken, and the connection closed: the node takes no client from elsewhere
        # until it is set up otherwise.
        return _misconfigured(
            "refused the connection: it runs in protected mode (no password set), and "
            "takes clients of its own machine only; set a password for its default user "
            "(requirepass) and give it in the node URL, or, on a network you trust, set "
            f"protected-mode no there ({said})"
        )
    if at_connection_limit(text):
        # An outage while it lasts: it passes as other clients leave.
        return Diagnosis(
            Failure.UNREACHABLE,
            f"refused the connection: it has as many clients as it allows ({said}); raise "
            "its maxclients, or have fewer connections to it",
        )
    if (
        upper.startswith("NOAUTH")
        or "authentication required" in lower
        # Redis closes an unauthenticated connection that sends a large request (a
        # script) with this instead of NOAUTH.
        or "unauthenticated" in lower
    ):
        return _misconfigured(
            f"{_PASSWORD_REQUIRED}{_LOGIN_FORM}), in connection_options, or to the redis-py "
            f"client given as the node ({said})"
        )
    if (
        "WRONGPASS" in upper
        or "invalid password" in lower
        or "invalid username-password" in lower
        or "called without any password configured" in lower
    ):
        return _misconfigured(
            "refused the credentials (authentication failed): check the user name and "
            "password in the node URL, connection_options, or the redis-py client given as "
            f"the node ({said})"
        )
    if (
        upper.startswith("NOPERM")
        or "no permissions" in lower
        or "can't run this command" in lower
        or "can't access at least one of the keys" in lower
    ):
        return Diagnosis(
            Failure.UNSUPPORTED,
            f"refused a command tenure needs (ACL: {said}): {ACL_HINT}",
        )
    if "unknown command 'sentinel'" in lower:
        return _misconfigured(
            f"is not a Sentinel ({said}): a redis+sentinel:// URL lists the Sentinels "
            "(usually on port 26379), not the data servers"
        )
    if "unknown command 'evalsha'" in lower or "unknown command 'cluster'" in lower:
        # What a Sentinel answers every data command: name that mistake before a version.
        return Diagnosis(
            Failure.UNSUPPORTED,
            f"refused a command tenure needs ({said}): if this address is a Sentinel, "
            "list it as redis+sentinel://host:port/<service>; otherwise tenure needs "
            "Redis >= 6.2 or Valkey >= 7.2, with Lua scripting",
        )
    if "unknown command" in lower:
        return Diagnosis(
            Failure.UNSUPPORTED,
            f"refused a command tenure needs ({said}): tenure needs Redis >= 6.2 or Valkey "
            ">= 7.2, with Lua scripting",
        )
    if code.startswith(_CLUSTER_CODES):
        return cluster_node(said)
    if code.startswith("WRONGTYPE"):
        # One key, not the node: its other locks go on (not a configuration failure,
        # which would set the whole node aside).
        return Diagnosis(
            Failure.ERROR,
            f"holds a key of another type where tenure keeps this lock's data ({said}): "
            "another application writes under tenure's key prefix; give tenure's "
            "clients a key_prefix of their own, or remove that key",
        )
    for refusal, why in _REFUSING_WRITES:
        if code.startswith(refusal):
            # Not a configuration failure: each passes without a change to the node
            # list (memory freed, a snapshot that succeeds, a script that ends), so the
            # node is an outage meanwhile. Its words say what happened, but not what
            # to do, and MISCONF's are cut before the end of the first sentence.
            return Diagnosis(Failure.ERROR, f"{why} ({said})")
    if "db index is out of range" in lower or "invalid db index" in lower:
        return _misconfigured(
            f"has no such database ({said}): check the /db part of the node URL (or the db "
            "of the redis-py client given as the node)"
        )
    return Diagnosis(Failure.ERROR, said)


# Error replies of a node that refuses writes (or every command) for a state that
# passes, and what to do about it, as said after the node's name.
_REFUSING_WRITES = (
    (
        "OOM ",
        "is full: it refuses writes at its maxmemory, so it grants nothing until memory "
        "is freed there or its maxmemory raised (locks held there stay; keep "
        "maxmemory-policy noeviction, since an evicting policy drops lock keys)",
    ),
    (
        "MISCONF ",
        "refuses writes since its last RDB snapshot failed (stop-writes-on-bgsave-error "
        "yes): fix what its log says of the failed save (a full disk, a directory it "
        "cannot write), and it accepts writes once a snapshot succeeds",
    ),
    (
        # Also what a min-replicas-to-write above the replicas it has answers forever.
        "NOREPLICAS ",
        "refuses writes: fewer replicas are connected to it, within min-replicas-max-lag "
        "seconds, than its min-replicas-to-write asks for (a replica reconnecting, a "
        "master cut off or demoted in a failover, which is what the setting is for); it "
        "grants again once they are back. If it has fewer replicas than that setting, "
        "lower min-replicas-to-write or add replicas (tenure check shows both)",
    ),
    (
        # A (re)started node reading its AOF or RDB file: minutes for a large data set.
        "LOADING ",
        "is loading its data set into memory after a start, and answers nothing else "
        "until it is done (the longer, the more data it keeps: INFO persistence shows "
        "how far it is); it takes part again once loaded",
    ),
    (
        "BUSY ",
        "is running a script or function that has not ended, and answers nothing else "
        "until it does: end it (SCRIPT KILL, FUNCTION KILL) and find the application "
        "that runs it",
    ),
)

# The replies only a server in cluster mode gives: a key's slot served elsewhere (MOVED),
# a slot being migrated (ASK, TRYAGAIN), a cluster without a majority of its masters or
# with slots unserved (CLUSTERDOWN), and one command's keys in different slots (CROSSSLOT:
# what nearly every acquire meets, since a node's floor and a lock's keys hash apart).
_CLUSTER_CODES = ("MOVED ", "ASK ", "TRYAGAIN", "CLUSTERDOWN", "CROSSSLOT")


# The advice of a node that requires a password, and the URL form it shows until
# ``in_url_form`` gives the node's own.
_PASSWORD_REQUIRED = "requires a password: give it in the node URL ("
_LOGIN_FORM = "redis://user:password@host:port"


def in_url_form(why: Diagnosis, form: str) -> Diagnosis:
    """``why``, its advice to give a password in the node URL showing ``form``
    (``NodeAddress.login_form``): the form of the URL the user wrote, where the reader
    of a ``redis+sentinel://`` node's failure would otherwise be shown a ``redis://``
    URL, which names one server rather than the Sentinels and the service."""
    if not why.detail.startswith(_PASSWORD_REQUIRED + _LOGIN_FORM):
        return why
    return Diagnosis(why.failure, why.detail.replace(_LOGIN_FORM, form, 1))


def store_problem(why: Diagnosis, reply: str | None) -> str:
    """What a fenced store's or a pattern's own Redis meant by failing a command, and the
    fix, from its diagnosis as a lock node (``why``) and its error reply, if it sent one.

    The classification is the lock client's; the words change where its fix is a lock
    node's (a key prefix, tenure's scripts, lock keys): a store is given its redis-py
    client and its keys' namespace by the application.
    """
    # Longer than a node's quote: a store's replies name its keys, which the
    # application chose, and a script's refusal says what is wrong after the key.
    said = _quote(_essence(reply), _STORE_QUOTE) if reply is not None else why.detail
    if wrong_type(reply):
        return (
            f"a key it uses holds another type of value ({said}): another application "
            "writes under its keys; give it a namespace (or prefix) of its own, or remove "
            "that key"
        )
    if ACL_HINT in why.detail:
        return (
            f"the Redis's ACL refused it ({said}): grant the client's ACL user the "
            "commands it names, on the keys this store uses"
        )
    if reply is not None and _essence(reply).upper().startswith("OOM "):
        return (
            f"the Redis is full: it refuses writes at its maxmemory ({said}); free memory "
            "there or raise its maxmemory (with maxmemory-policy noeviction: an evicting "
            "policy can drop what the store keeps, a fencing token or a claim)"
        )
    if "READONLY" in (reply or "").upper():
        return f"the Redis is a read-only replica ({said}): give the store a client of its master"
    if why.failure.configuration and "password" in why.detail:
        return (
            f"the Redis refused the client's credentials ({said}): check the user name and "
            "password the redis-py client was made with"
        )
    if why.detail == _quote(_essence(reply or "")):
        return f"the Redis answered with an error: {said}"
    return f"the Redis {why.detail}"


def wrong_type(reply: str | None) -> bool:
    """Whether an error reply (as Redis sent it, code first) is ``WRONGTYPE``, raised by
    a command or inside a script."""
    return reply is not None and _essence(reply).upper().startswith("WRONGTYPE")


def cluster_node(said: str) -> Diagnosis:
    """A node listed as a plain one that is a Redis Cluster node (``said``: its reply).

    A configuration failure, not an outage: the node answers the same for a lock name
    until the node list changes, whichever way the slots move.
    """
    return _misconfigured(
        f"is a Redis Cluster node (cluster mode; it answered {said}), listed as a plain "
        "node, whose commands are not routed by slot, so it cannot lock there. List the "
        "whole cluster as one node, redis+cluster://host:port[,host:port...] "
        "(docs/cluster-and-sentinel.md), or independent masters that are not in cluster "
        "mode (redis://host:port)"
    )


def not_a_cluster(seed: str, said: str) -> Diagnosis:
    """A ``redis+cluster://`` node's seed ``seed`` answered ``CLUSTER SLOTS`` with the
    error ``said``: a server not in cluster mode (a configuration failure naming the
    fix), or a refusal read as any error reply is."""
    if "cluster support disabled" in said.lower():
        return _misconfigured(
            f"lists {seed}, which is not in cluster mode (it answered {_quote(_essence(said))}):"
            " a redis+cluster:// node must list nodes of one Redis Cluster; list a "
            "standalone server as a plain node instead (redis://host:port)"
        )
    why = error_reply(said)
    return Diagnosis(why.failure, f"{seed} (asked for the slot map): {why.detail}")


def reply_ends_link(why: Diagnosis) -> bool:
    """Whether a node's error reply, diagnosed as ``why``, ends its connection: a refusal
    for its configuration (it would refuse again, so the node is left alone for a
    back-off), or a Sentinel node's master demoted (``sentinel.demoted``: unreachable,
    and the next connection asks the Sentinels for the new one). Any other error reply
    leaves the connection in step."""
    return why.failure.configuration or why.failure is Failure.UNREACHABLE


def slot_map_late(seed: NodeAddress, connect_timeout: float) -> Diagnosis:
    """A ``redis+cluster://`` node's seed ``seed`` (a member's address) gave no whole
    answer to ``CLUSTER SLOTS`` within ``connect_timeout`` (connecting included): a host
    that does not answer, or one that answers a byte at a time (a stalled proxy, a
    server dying slowly, something that is not Redis), which no socket timeout ends.
    Over TLS (``rediss+cluster://``), a plain port is named as the likely cause, as
    ``not_connected_in_time`` names it (``_may_not_speak_tls``): it never answers the
    TLS hello, so the handshake takes the whole time."""
    return Diagnosis(
        Failure.UNREACHABLE,
        f"{seed.display}: no slot map within connect_timeout ({connect_timeout} s)"
        + _may_not_speak_tls(seed, "cluster"),
    )


def no_slot_map(failures: Sequence[Diagnosis]) -> Diagnosis:
    """Why no seed of a Cluster node gave its slot map, from each one's ``failures`` (at
    least one): a configuration failure (a seed not in cluster mode) says the most, and
    names the fix; otherwise the first seed's."""
    return next((f for f in failures if f.failure.configuration), failures[0])


def slot_unserved(slot: int) -> Diagnosis:
    """No master of a Cluster node serves ``slot``, as far as its slot map says."""
    return Diagnosis(
        Failure.UNREACHABLE,
        f"no master of the cluster serves slot {slot} (its slot map gives it none: a "
        "master down without a replica to take over, or slots never assigned); no vote "
        "for the locks of that slot until one does",
    )


def not_redis(what: str) -> Diagnosis:
    """A node whose bytes are not the Redis protocol (an HTTP server, a wrong port)."""
    return _misconfigured(
        f"does not speak the Redis protocol ({_quote(what)}): check the host and port of "
        "its URL, and rediss:// for a TLS port"
    )


def tls_handshake_timed_out(said: str, plain: str = "redis") -> Diagnosis:
    """A ``rediss://`` node that took the TCP connection and then let the TLS handshake
    time out: what a plain Redis does, reading the client's hello as the start of a
    command and waiting for its end. Still unreachable (a slow TLS server times out the
    same way), but the likelier cause is named with its fix: ``plain``, the scheme of
    the node's URL without TLS (``redis+cluster`` for a Cluster node's seed)."""
    return Diagnosis(
        Failure.UNREACHABLE,
        f"{said} (the TLS handshake timed out: the node may not speak TLS; "
        f"use {plain}:// for a plain port)",
    )


def closed_before_answering(why: Diagnosis, form: str) -> Diagnosis:
    """``why``, for a node that took a new connection and then closed or reset it before
    its first reply, said with the likelier cause and its fix when the node's URL
    (``form``: its ``login_form``) is plain TCP. A TLS port does that to a client that
    does not speak TLS: it reads the client's first command as a broken TLS hello and
    drops the connection, which the client reads as a reset, as it would a node killed
    at that moment. Still unreachable, and only a "may": a server dying, or a proxy with
    no server behind it, closes the same way. The fix keeps the URL's kind
    (``rediss+sentinel://``, ``rediss+cluster://``); nothing is added for a ``rediss``
    or ``unix`` URL."""
    scheme = form.partition("://")[0]  # redis, redis+sentinel, redis+cluster; rediss...
    plain = scheme.startswith("redis") and not scheme.startswith("rediss")
    if why.failure is not Failure.UNREACHABLE or not plain:
        return why
    secure = "rediss" + scheme[len("redis") :]
    return Diagnosis(
        why.failure,
        f"{why.detail} (closed before its first reply: the node may speak TLS; "
        f"use {secure}:// for a TLS port)",
    )


def not_connected_in_time(address: NodeAddress, connect_timeout: float) -> Diagnosis:
    """A connection to the node at ``address`` whose set-up (TCP connect, then TLS
    handshake, AUTH, SELECT) did not end within ``connect_timeout``, as the clients'
    own timer found it. Over TLS, the likelier cause is named with its fix, as
    ``tls_handshake_timed_out`` does for a handshake redis-py timed out: a plain port
    reads the client's TLS hello as the start of an inline command and waits for its
    end, so it never answers, and the clients' timer (started before the TCP connect)
    runs out before the handshake's own. Only a "may": a TLS server that is slow, or
    a TCP connect that hangs, times out the same way."""
    said = f"not connected within connect_timeout ({connect_timeout} s)"
    return Diagnosis(Failure.UNREACHABLE, said + _may_not_speak_tls(address))


def being_probed() -> Diagnosis:
    """A node whose last connection was given up as stalled, while a new connection's
    PING waits for its answer (``_core.backoff``): rounds do not wait for it (it sits
    them out, as in its back-off), lest each wait the connect timeout for a node that
    was silent a moment ago."""
    return Diagnosis(
        Failure.UNREACHABLE,
        f"silent since its last connection went {STALL} s without a reply; "
        "asked again once it answers a PING on a new connection",
    )


def silent_since_stall(connect_timeout: float) -> Diagnosis:
    """A connection to a node whose last one was given up as stalled, set up, but its
    PING unanswered within ``connect_timeout`` (``_core.backoff``): the node accepts
    connections and answers nothing, as a frozen or starved server does."""
    return Diagnosis(
        Failure.UNREACHABLE,
        f"connected, but no answer to PING within connect_timeout ({connect_timeout} s), "
        f"as none came on its last connection for {STALL} s: a frozen or starved server",
    )


def _may_not_speak_tls(address: NodeAddress, kind: str = "") -> str:
    """What the clients' own timers add, for a TLS node (``rediss://``,
    ``rediss+cluster://``...) whose set-up outlasted them: the likely cause and its fix
    (``not_connected_in_time``, ``slot_map_late``); nothing for a plain node. The fix
    keeps the URL's kind: ``redis+sentinel://`` for a ``rediss+sentinel://`` node, and
    ``redis+cluster://`` for a Cluster node's seed (``kind``: a member's own address is
    ``rediss://``)."""
    tls, own = address.scheme.partition("+")[::2]  # "rediss+cluster"; a Sentinel's "rediss"
    if tls != "rediss":
        return ""
    kind = kind or ("sentinel" if address.sentinel is not None else own)
    plain = f"redis+{kind}" if kind else "redis"
    return (
        ": the node may not speak TLS (a plain port never answers a TLS hello); "
        f"use {plain}:// for a plain port"
    )


def socket_path_not_a_directory(said: str) -> Diagnosis:
    """A unix socket path with a component that is not a directory: a database number
    written as a path (``unix:///run/redis.sock/2``), say. No wait will fix it."""
    return _misconfigured(
        f"its socket path is wrong ({_quote(said)}): a part of it before the last is not "
        "a directory; a database number goes as ?db=N (unix:///run/redis.sock?db=2)"
    )


# OpenSSL's X509_V_ERR_* codes, as the ssl module reports them (``verify_code``).
_NAME_MISMATCH = frozenset({62, 63, 64})  # host name, e-mail, IP address
_UNTRUSTED = frozenset({18, 19, 20, 21})  # self-signed, unknown issuer, unverifiable
_OUT_OF_DATE = frozenset({9, 10})  # not yet valid, expired


def certificate_rejected(code: int | None, said: str) -> Diagnosis:
    """A node whose TLS certificate failed verification (OpenSSL's ``code`` and words).

    A configuration failure, not an outage: the handshake fails the same way until the
    certificate, the node's URL or the CAs the client trusts change. ``detail`` reads
    after the node's name and a colon: "its TLS certificate does not match ...".
    """
    said = _quote(said.rstrip("."))
    if code in _NAME_MISMATCH:
        detail = (
            f"its TLS certificate does not match the host in the node's URL ({said}); "
            "use the name or address the certificate was issued for in the URL"
        )
    elif code in _UNTRUSTED:
        detail = (
            f"its TLS certificate is not signed by a CA this client trusts ({said}); "
            "pass the CA certificate in connection_options={'ssl_ca_certs': path}"
        )
    elif code in _OUT_OF_DATE:
        detail = f"its TLS certificate is outside its validity period ({said}); renew it"
    else:
        detail = f"its TLS certificate failed verification ({said})"
    return Diagnosis(Failure.CERTIFICATE, detail)


def _misconfigured(detail: str) -> Diagnosis:
    return Diagnosis(Failure.MISCONFIGURED, detail)


_ERRORS: dict[Failure, type[NodeMisconfigured]] = {
    Failure.UNSUPPORTED: ServerUnsupported,
    Failure.CERTIFICATE: TLSCertificateError,
}


def naming(node: str, failure: Failure, detail: str, prefix: str = DEFAULT_KEY_PREFIX) -> str:
    """A configuration failure's ``detail`` said of ``node``, as its error would say it:
    "node X is a read-only replica: ...", "node X: its TLS certificate ...", to a client
    whose key prefix is ``prefix``."""
    return str(_ERRORS.get(failure, NodeMisconfigured)(node, for_prefix(detail, prefix)))


def configuration_error(
    rnd: Round, names: list[str], prefix: str = DEFAULT_KEY_PREFIX
) -> NodeMisconfigured | None:
    """The error naming the first node of ``rnd``, in the order the nodes are listed, that
    failed for its configuration (not the first to answer: the same setup is named the
    same way however the replies raced).

    ``ServerUnsupported`` for a refused command (ACL, too old), ``TLSCertificateError``
    for a certificate that failed verification, ``NodeMisconfigured`` for the rest; each
    carries every failed node's message, said to a client whose key prefix is ``prefix``.
    """
    failures = rnd.failures()
    for i in sorted(failures):
        r = failures[i]
        if r.failure is not None and r.failure.configuration:
            errors = {
                names[j]: for_prefix(
                    f"{f.failure.value}: {f.detail}" if f.failure else f.detail, prefix
                )
                for j, f in failures.items()
            }
            kind = _ERRORS.get(r.failure, NodeMisconfigured)
            return kind(names[i], for_prefix(r.detail, prefix), errors, parameter=f"nodes[{i}]")
    return None

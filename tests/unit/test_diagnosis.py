"""What a node's failure means: error replies and exceptions as per-node failures, and when
misconfigured nodes end an acquire (pure core, plus the redis-py glue that feeds it)."""

from __future__ import annotations

import random
import ssl

import pytest
from redis import exceptions as rx

import tenure
from tenure._core.acquire import GRANTED, Acquisition, GiveUp, Granted, Retry
from tenure._core.config import ClientConfig, LockSpec, parse_node_url
from tenure._core.diagnosis import (
    BackingOff,
    Diagnosis,
    certificate_rejected,
    closed_before_answering,
    configuration_error,
    error_reply,
    naming,
    not_connected_in_time,
    not_redis,
    refuses_connection,
    slot_map_late,
)
from tenure._core.lease import conclude_locked
from tenure._core.policy import wait_random_exponential
from tenure._core.quorum import Failure, Round
from tenure._driver.redis_compat import (
    ClosedByNode,
    NotRedis,
    before_first_reply,
    diagnose,
    dropped,
)

WRAPPED_READONLY = (
    "ERR Error running script (call to f_131b5f2ed4a6e4f431cc21897ae043d687859f08): "
    "@user_script:1: @user_script: 1: -READONLY You can't write against a read only replica."
)


# What a Redis Cluster node listed as a plain node answers, and what tenure says of it.
CLUSTER_REPLIES = [
    "MOVED 3999 127.0.0.1:6381",
    "ASK 3999 127.0.0.1:6381",
    "TRYAGAIN Multiple keys request during rehashing of slot",
    "CLUSTERDOWN Hash slot not served",
    "CROSSSLOT Keys in request don't hash to the same slot",
]
CLUSTER_SAYS = [
    "is a Redis Cluster node (cluster mode",
    "listed as a plain node, whose commands are not routed by slot",
    "redis+cluster://host:port[,host:port...]",
    "independent masters that are not in cluster mode",
    "docs/cluster-and-sentinel.md",
]


@pytest.mark.parametrize(
    ("text", "failure", "says"),
    [
        ("READONLY You can't write against a read only replica.", Failure.MISCONFIGURED,
         ["read-only replica", "list its master instead", "READONLY You can't"]),
        (WRAPPED_READONLY, Failure.MISCONFIGURED,
         ["read-only replica", "(READONLY You can't write against a read only replica.)"]),
        ("NOAUTH Authentication required.", Failure.MISCONFIGURED,
         ["requires a password", "node URL", "connection_options"]),
        ("ERR Protocol error: unauthenticated multibulk length", Failure.MISCONFIGURED,
         ["requires a password"]),
        ("WRONGPASS invalid username-password pair or user is disabled.", Failure.MISCONFIGURED,
         ["authentication failed", "password in the node URL"]),
        ("ERR invalid password", Failure.MISCONFIGURED, ["authentication failed"]),
        ("ERR AUTH <password> called without any password configured for the default user.",
         Failure.MISCONFIGURED, ["authentication failed"]),
        ("NOPERM this user has no permissions to run the 'eval' command", Failure.UNSUPPORTED,
         ["ACL", "~tenure:*", "&tenure:wake:*", "tenure check"]),
        ("ERR Error running script (call to f_ab): @user_script:1: @user_script: 1: The user "
         "executing the script can't run this command or subcommand", Failure.UNSUPPORTED,
         ["ACL: The user executing the script can't run this command"]),
        ("ERR unknown command 'EVAL'", Failure.UNSUPPORTED,
         ["Redis >= 6.2 or Valkey >= 7.2", "Lua scripting"]),
        # A Sentinel listed as a data node, or as a cluster's seed: say that first.
        ("ERR unknown command 'EVALSHA', with args beginning with: 'ab12'", Failure.UNSUPPORTED,
         ["if this address is a Sentinel", "redis+sentinel://host:port/<service>"]),
        ("ERR unknown command 'CLUSTER', with args beginning with: 'SLOTS'",
         Failure.UNSUPPORTED, ["if this address is a Sentinel"]),
        # A data server listed as a Sentinel.
        ("ERR unknown command 'SENTINEL', with args beginning with: 'GET-MASTER-ADDR-BY-NAME'",
         Failure.MISCONFIGURED, ["is not a Sentinel", "usually on port 26379"]),
        # Redis 6.2 quotes the command with backquotes.
        ("ERR unknown command `SENTINEL`, with args beginning with: `GET-MASTER-ADDR-BY-NAME`",
         Failure.MISCONFIGURED, ["is not a Sentinel", "usually on port 26379"]),
        ("ERR unknown command `EVALSHA`, with args beginning with: `ab12`", Failure.UNSUPPORTED,
         ["if this address is a Sentinel", "redis+sentinel://host:port/<service>"]),
        ("ERR max number of clients reached", Failure.UNREACHABLE,
         ["refused the connection", "maxclients"]),
        *[
            (reply, Failure.MISCONFIGURED, [f"it answered {reply}", *CLUSTER_SAYS])
            for reply in CLUSTER_REPLIES
        ],
        ("ERR DB index is out of range", Failure.MISCONFIGURED, ["/db"]),
        ("LOADING Redis is loading the dataset in memory", Failure.ERROR,
         ["(LOADING Redis is loading", "loading its data set", "INFO persistence"]),
        # Protected mode, as Valkey 9 and Redis 6.2 word it (sent to clients of other
        # machines only, as the connection is taken).
        ("DENIED Running in protected mode because protected mode is enabled and no "
         "password is set for the default user. In this mode connections are only "
         "accepted from the loopback interface.", Failure.MISCONFIGURED,
         ["(DENIED Running in protected mode", "runs in protected mode", "requirepass",
          "protected-mode no"]),
        ("DENIED Redis is running in protected mode because protected mode is enabled, no "
         "bind address was specified, no authentication password is requested to clients.",
         Failure.MISCONFIGURED, ["(DENIED Redis is running", "requirepass"]),
        ("BUSY Redis is busy running a script", Failure.ERROR,
         ["BUSY", "running a script", "SCRIPT KILL"]),
        ("BUSYKEY Target key name already exists.", Failure.ERROR, ["BUSYKEY"]),
        ("MISCONF Valkey is configured to save RDB snapshots, but it's currently unable to "
         "persist to disk. Commands that may modify the data set are disabled, because ...",
         Failure.ERROR, ["MISCONF Valkey", "last RDB snapshot failed", "a full disk"]),
        ("ERR Error running script (call to f_ab): @user_script:1: @user_script: 1: -MISCONF "
         "Redis is configured to save RDB snapshots", Failure.ERROR,
         ["(MISCONF Redis is configured", "stop-writes-on-bgsave-error"]),
        # Errors raised inside a script, as Valkey and Redis 7 word them (the node's own
        # words came out as "on @user_script:151.") and as Redis 6.2 does.
        ("NOREPLICAS Not enough good replicas to write. script: on @user_script:151.",
         Failure.ERROR, ["NOREPLICAS Not enough good replicas to write."]),
        ("OOM command not allowed when used memory > 'maxmemory'. script: on @user_script:42.",
         Failure.ERROR, ["OOM command not allowed", "is full", "maxmemory raised"]),
        ("WRONGTYPE Operation against a key holding the wrong kind of value script: on "
         "@user_script:168.", Failure.ERROR,
         ["(WRONGTYPE Operation against a key holding the wrong kind of value)",
          "another application writes under tenure's key prefix", "key_prefix"]),
        ("Error running script (call to f_d3c2): @user_script:1: WRONGTYPE Operation against "
         "a key holding the wrong kind of value", Failure.ERROR,
         ["(WRONGTYPE Operation against a key holding the wrong kind of value)"]),
    ],
)  # fmt: skip
def test_error_replies(text: str, failure: Failure, says: list[str]) -> None:
    why = error_reply(text)
    assert why.failure is failure
    for words in says:
        assert words in why.detail, why.detail


def test_long_replies_are_quoted_short() -> None:
    why = not_redis("Protocol Error: " + "x" * 10_000)
    assert why.failure is Failure.MISCONFIGURED
    assert len(why.detail) < 300
    assert "check the host and port" in why.detail


@pytest.mark.parametrize(
    ("exc", "failure", "says"),
    [
        (rx.InvalidResponse("Protocol Error: b'HTTP/1.1 400 Bad Request'"),
         Failure.MISCONFIGURED, "does not speak the Redis protocol"),
        (ValueError("invalid literal for int() with base 10: b'\\x8e'"),
         Failure.MISCONFIGURED, "does not speak the Redis protocol"),
        (NotRedis("not a RESP2 reply: b'HTTP/1.1'"), Failure.MISCONFIGURED, "Redis protocol"),
        # redis-py strips the code off the errors it maps to classes (and keeps it as
        # status_code only since version 6): the code is put back either way.
        (rx.ReadOnlyError("You can't write against a read only replica."),
         Failure.MISCONFIGURED, "READONLY You can't"),
        (rx.AuthenticationError("Authentication required."), Failure.MISCONFIGURED,
         "requires a password"),
        (rx.AuthenticationError("invalid username-password pair or user is disabled."),
         Failure.MISCONFIGURED, "authentication failed"),
        (rx.NoPermissionError("this user has no permissions to access one of the keys"),
         Failure.UNSUPPORTED, "NOPERM this user"),
        (rx.ResponseError("ERR something else"), Failure.ERROR, "ERR something else"),
        # The cluster replies redis-py maps to classes, code stripped: put back too.
        (rx.MovedError("3999 127.0.0.1:6381"), Failure.MISCONFIGURED, "answered MOVED 3999"),
        (rx.AskError("3999 127.0.0.1:6381"), Failure.MISCONFIGURED, "answered ASK 3999"),
        (rx.TryAgainError("Multiple keys request during rehashing of slot"),
         Failure.MISCONFIGURED, "answered TRYAGAIN Multiple keys"),
        (rx.ClusterDownError("The cluster is down"), Failure.MISCONFIGURED,
         "answered CLUSTERDOWN The cluster is down"),
        (rx.ClusterCrossSlotError("Keys in request don't hash to the same slot"),
         Failure.MISCONFIGURED, "answered CROSSSLOT Keys"),
        (rx.ConnectionError("Connection refused."), Failure.UNREACHABLE, "refused"),
        (rx.TimeoutError("Timeout reading from socket"), Failure.UNREACHABLE, "Timeout"),
        (ConnectionResetError(104, "reset"), Failure.UNREACHABLE, "reset"),
        (RuntimeError("what"), Failure.ERROR, "RuntimeError: what"),
    ],
)  # fmt: skip
def test_any_exception_of_a_node_is_a_diagnosis(
    exc: Exception, failure: Failure, says: str
) -> None:
    why = diagnose(exc)
    assert why.failure is failure
    assert says in why.detail, why.detail


def test_configuration_failures() -> None:
    assert Failure.MISCONFIGURED.configuration
    assert Failure.UNSUPPORTED.configuration
    assert Failure.CERTIFICATE.configuration
    for other in (Failure.UNREACHABLE, Failure.BACKING_OFF, Failure.CONNECTING, Failure.ERROR):
        assert not other.configuration


def test_misconfigured_blocks_quorum_counts_configuration_failures_only() -> None:
    rnd = Round(3, 2, started=0.0)
    rnd.fail(0, Failure.MISCONFIGURED, "read-only")
    rnd.fail(1, Failure.UNREACHABLE, "refused")
    assert rnd.unreachable_blocks_quorum()
    assert not rnd.misconfigured_blocks_quorum()  # the down node may come back
    rnd = Round(3, 2, started=0.0)
    rnd.fail(0, Failure.MISCONFIGURED, "read-only")
    rnd.fail(2, Failure.UNSUPPORTED, "NOPERM")
    assert rnd.misconfigured_blocks_quorum()


def _acquisition(n: int = 3) -> Acquisition:
    cfg = ClientConfig.build([f"redis://h{i}" for i in range(n)])
    return Acquisition(
        LockSpec.build(cfg, "res", 10.0),
        wait_random_exponential(),
        random.Random(0),
        blocking=True,
        timeout=None,
        now=0.0,
        node_names=[f"redis://h{i}:6379" for i in range(n)],
        max_ttl_ms=60_000,
    )


def test_a_misconfigured_minority_does_not_stop_an_acquire() -> None:
    acq = _acquisition()
    rnd = acq.begin(0.0)
    proposal = acq.proposal(1_000)
    rnd.fail(0, *_readonly())
    rnd.record(1, True, (GRANTED, proposal, proposal))  # {status, token, floor}
    rnd.record(2, True, (GRANTED, proposal, proposal))
    assert isinstance(acq.conclude(rnd, "t", 0.001), Granted)


def test_a_misconfigured_majority_gives_up_at_once_even_blocking() -> None:
    acq = _acquisition()
    rnd = acq.begin(0.0)
    acq.proposal(1_000)
    rnd.fail(0, *_readonly())
    rnd.fail(1, Failure.MISCONFIGURED, "requires a password: give it in the node URL")
    step = acq.conclude(rnd, "t", 0.001)
    assert isinstance(step, GiveUp)
    error = step.error
    assert isinstance(error, tenure.NodeMisconfigured)
    assert not isinstance(error, tenure.ServerUnsupported)
    assert isinstance(error, tenure.ConfigurationError)
    assert isinstance(error, ValueError)
    assert error.node == "redis://h0:6379"
    assert error.parameter == "nodes[0]"
    assert str(error).startswith("node redis://h0:6379 is a read-only replica: list its master")
    assert "redis://h1:6379: misconfigured: requires a password" in str(error)
    assert set(error.node_errors) == {"redis://h0:6379", "redis://h1:6379"}


def test_an_outage_next_to_a_misconfigured_node_is_retried_then_named() -> None:
    acq = _acquisition()
    for k in range(3):
        rnd = acq.begin(k * 0.1)
        acq.proposal(1_000)
        rnd.fail(0, *_readonly())
        rnd.fail(1, Failure.UNREACHABLE, "refused")
        step = acq.conclude(rnd, "t", k * 0.1 + 0.001)
        if k < 2:
            assert isinstance(step, Retry)
    assert isinstance(step, GiveUp)
    assert isinstance(step.error, tenure.NodeMisconfigured)
    assert step.error.node == "redis://h0:6379"


def test_configuration_error_is_server_unsupported_for_a_refused_command() -> None:
    rnd = Round(3, 2, started=0.0)
    why = error_reply("NOPERM no permissions to run the 'eval' command")
    rnd.fail(2, why.failure, why.detail)
    error = configuration_error(rnd, ["a", "b", "c"])
    assert isinstance(error, tenure.ServerUnsupported)
    assert isinstance(error, tenure.NodeMisconfigured)
    assert error.node == "c"
    assert configuration_error(Round(3, 2, started=0.0), ["a", "b", "c"]) is None


def test_locked_refuses_to_answer_when_misconfigured_nodes_leave_no_majority() -> None:
    rnd = Round(3, 2, started=0.0)
    rnd.record(0, True)
    rnd.fail(1, *_readonly())
    rnd.fail(2, *_readonly())
    with pytest.raises(tenure.NodeMisconfigured):
        conclude_locked(rnd, "res", ["a", "b", "c"])
    rnd = Round(3, 2, started=0.0)
    rnd.record(0, True)
    rnd.record(1, True)
    rnd.fail(2, *_readonly())
    assert conclude_locked(rnd, "res", ["a", "b", "c"]) is True


def test_locked_refuses_to_answer_when_nodes_down_leave_no_majority() -> None:
    # Two of three silent: the one that answered "not held" says nothing of the two
    # that may hold it.
    for held in (False, True):
        rnd = Round(3, 2, started=0.0)
        rnd.record(0, held)
        rnd.fail(1, Failure.UNREACHABLE, "refused")
        rnd.fail(2, Failure.UNREACHABLE, "no reply before the deadline")
        with pytest.raises(tenure.QuorumUnreachable) as info:
            conclude_locked(rnd, "res", ["a", "b", "c"])
        assert info.value.node_errors == {
            "b": "unreachable: refused",
            "c": "unreachable: no reply before the deadline",
        }
    # One down: the two that answered decide when they agree.
    for held in (False, True):
        rnd = Round(3, 2, started=0.0)
        rnd.record(0, held)
        rnd.record(1, held)
        rnd.fail(2, Failure.UNREACHABLE, "refused")
        assert conclude_locked(rnd, "res", ["a", "b", "c"]) is held


@pytest.mark.parametrize(("n", "holding", "without"), [(3, 1, 1), (5, 2, 2), (5, 1, 2), (5, 2, 1)])
def test_locked_refuses_to_answer_when_the_nodes_down_decide_it(
    n: int, holding: int, without: int
) -> None:
    # A lease granted by the node down and those holding is valid, and no acquire could
    # take it from its holder: "not locked" would be a guess, and so would "locked".
    rnd = Round(n, n // 2 + 1, started=0.0)
    for i in range(holding):
        rnd.record(i, True)
    for i in range(holding, holding + without):
        rnd.record(i, False)
    for i in range(holding + without, n):
        rnd.fail(i, Failure.UNREACHABLE, "refused")
    names = [f"n{i}" for i in range(n)]
    with pytest.raises(tenure.QuorumUnreachable) as info:
        conclude_locked(rnd, "res", names)
    assert f"{holding} hold the lock and {without} do not" in str(info.value)
    assert set(info.value.node_errors) == set(names[holding + without :])


def test_locked_answers_when_enough_nodes_lack_the_key_whatever_the_rest() -> None:
    rnd = Round(5, 3, started=0.0)
    rnd.record(0, False)
    rnd.record(1, False)
    rnd.record(2, False)
    rnd.record(3, True)
    rnd.fail(4, Failure.UNREACHABLE, "refused")
    assert conclude_locked(rnd, "res", list("abcde")) is False


def _readonly() -> tuple[Failure, str]:
    why = error_reply("READONLY You can't write against a read only replica.")
    return why.failure, why.detail


# --- TLS certificates ------------------------------------------------------------------


def _wrapped(cause: ssl.SSLError) -> rx.ConnectionError:
    """A TLS failure as redis-py raises it: its ConnectionError, the ``ssl`` module's
    error behind it."""
    try:
        raise rx.ConnectionError(f"Error 1 connecting to h0:6380. {cause}") from cause
    except rx.ConnectionError as exc:
        return exc


def _verify_error(code: int, message: str) -> rx.ConnectionError:
    cause = ssl.SSLCertVerificationError(1, f"[SSL: CERTIFICATE_VERIFY_FAILED] {message}")
    cause.verify_code = code
    cause.verify_message = message
    return _wrapped(cause)


@pytest.mark.parametrize(
    ("code", "message", "says"),
    [
        (64, "IP address mismatch, certificate is not valid for '10.0.0.7'.",
         ["does not match the host in the node's URL", "(IP address mismatch",
          "use the name or address the certificate was issued for"]),
        (62, "Hostname mismatch, certificate is not valid for 'redis-a'.",
         ["does not match the host"]),
        (20, "unable to get local issuer certificate",
         ["not signed by a CA this client trusts", "ssl_ca_certs"]),
        (10, "certificate has expired", ["outside its validity period", "renew it"]),
        (50, "application verification failure", ["failed verification"]),
    ],
)  # fmt: skip
def test_a_certificate_failure_is_a_configuration_failure_with_the_fix(
    code: int, message: str, says: list[str]
) -> None:
    why = diagnose(_verify_error(code, message))
    assert why == certificate_rejected(code, message)
    assert why.failure is Failure.CERTIFICATE
    assert why.detail.startswith("its TLS certificate ")
    for words in says:
        assert words in why.detail, why.detail


def test_other_tls_failures_are_an_outage() -> None:
    handshake = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    assert diagnose(_wrapped(handshake)).failure is Failure.UNREACHABLE


def test_a_tls_handshake_redis_py_timed_out_names_the_plain_scheme_it_is_given() -> None:
    # redis-py reports the ssl module's handshake timeout only as "Timeout connecting to
    # server", its cause kept in the chain. The connection knows no URL: a Cluster
    # node's seed says which scheme the fix is (it said redis:// for rediss+cluster://).
    try:
        try:
            raise TimeoutError("_ssl.c:989: The handshake operation timed out")
        except TimeoutError as cause:
            raise rx.TimeoutError("Timeout connecting to server") from cause
    except rx.TimeoutError as exc:
        timed_out = exc
    for plain in ("redis", "redis+cluster"):
        why = diagnose(timed_out, plain) if plain != "redis" else diagnose(timed_out)
        assert why.failure is Failure.UNREACHABLE
        assert why.detail == (
            "Timeout connecting to server (the TLS handshake timed out: the node may not "
            f"speak TLS; use {plain}:// for a plain port)"
        )
    # Any other timeout says nothing of TLS.
    assert "TLS" not in diagnose(rx.TimeoutError("Timeout reading from socket")).detail


def test_a_connection_limit_redis_py_raises_as_a_connection_error_says_the_fix() -> None:
    # redis-py raises a node's refusal at its maxclients as a ConnectionError, with the
    # reply's words alone; it is classified as the reply is, with the code put back.
    why = diagnose(rx.ConnectionError("max number of clients reached"))
    assert why == error_reply("ERR max number of clients reached")
    assert why.failure is Failure.UNREACHABLE
    assert "(ERR max number of clients reached); raise its maxclients" in why.detail
    # Any other lost connection is told in its own words.
    assert diagnose(rx.ConnectionError("Connection closed by server.")) == Diagnosis(
        Failure.UNREACHABLE, "Connection closed by server."
    )


def test_a_loading_reply_redis_py_raises_without_its_code_says_the_fix() -> None:
    # redis-py raises LOADING as a ConnectionError (BusyLoadingError) without its code.
    why = diagnose(rx.BusyLoadingError("Valkey is loading the dataset in memory"))
    assert why == error_reply("LOADING Valkey is loading the dataset in memory")
    assert "is loading its data set into memory after a start" in why.detail


@pytest.mark.parametrize(
    ("url", "plain"),
    [
        ("rediss://h1:6380/2", "redis"),
        ("rediss+sentinel://s1:26379/primary", "redis+sentinel"),
        ("rediss+cluster://c1:7000", "redis+cluster"),
    ],
)
def test_a_tls_set_up_not_done_in_time_names_a_plain_port_as_the_likely_cause(
    url: str, plain: str
) -> None:
    # A plain port never answers a TLS hello; the clients' timer runs out first. Still an
    # outage (a slow TLS server times out the same way), the likely fix named, in the
    # URL's own kind.
    why = not_connected_in_time(parse_node_url(url), 0.5)
    assert why == Diagnosis(
        Failure.UNREACHABLE,
        "not connected within connect_timeout (0.5 s): the node may not speak TLS (a plain "
        f"port never answers a TLS hello); use {plain}:// for a plain port",
    )


@pytest.mark.parametrize(
    "url", ["redis://h1:6379", "unix:///run/redis.sock", "redis+sentinel://s1:26379/primary"]
)
def test_a_plain_set_up_not_done_in_time_is_only_unreachable(url: str) -> None:
    assert not_connected_in_time(parse_node_url(url), 1.0) == Diagnosis(
        Failure.UNREACHABLE, "not connected within connect_timeout (1.0 s)"
    )


@pytest.mark.parametrize(
    ("url", "hint"),
    [("rediss+cluster://c1:7000,c2:7001", True), ("redis+cluster://c1:7000", False)],
)
def test_a_cluster_seed_with_no_slot_map_in_time_over_tls_names_a_plain_port(
    url: str, hint: bool
) -> None:
    # The same words as a TLS node's set-up not done in time (above), from one place.
    seed = parse_node_url(url).member("c1", 7000)
    said = slot_map_late(seed, 0.5)
    late = "no slot map within connect_timeout (0.5 s)"
    assert said.failure is Failure.UNREACHABLE
    if hint:
        # The fix is the Cluster node's kind of URL, though the seed's own is rediss://.
        tls = not_connected_in_time(parse_node_url(url), 0.5).detail.partition(")")[2]
        assert tls.startswith(": the node may not speak TLS"), tls
        assert tls.endswith("use redis+cluster:// for a plain port"), tls
        assert said.detail == f"rediss://c1:7000: {late}{tls}"
    else:
        assert said.detail == f"redis://c1:7000: {late}"


@pytest.mark.parametrize(
    ("url", "secure"),
    [
        ("redis://h1:6379/2", "rediss"),
        ("redis+sentinel://s1:26379/primary", "rediss+sentinel"),
        ("redis+cluster://c1:7000", "rediss+cluster"),
        ("rediss://h1:6380", None),
        ("rediss+cluster://c1:7000", None),
        ("unix:///run/redis.sock", None),
    ],
)
def test_a_plain_node_that_closed_before_answering_names_a_tls_port(
    url: str, secure: str | None
) -> None:
    # A TLS port drops a connection whose first bytes are a command, not a TLS hello:
    # still an outage (a dying server closes the same way), the likely fix named in the
    # URL's own kind; a Cluster member's in the Cluster node's. Not for a TLS or unix URL.
    reset = Diagnosis(Failure.UNREACHABLE, "[Errno 104] Connection reset by peer")
    address = parse_node_url(url)
    forms = [address.login_form]
    if address.seeds:
        forms.append(address.member("c1", 7000).login_form)
    for form in forms:
        said = closed_before_answering(reset, form)
        if secure is None:
            assert said == reset
        else:
            assert said == Diagnosis(
                Failure.UNREACHABLE,
                "[Errno 104] Connection reset by peer (closed before its first reply: the "
                f"node may speak TLS; use {secure}:// for a TLS port)",
            )
    # A node that said why it closed (at its connection limit, protected mode) was heard.
    refused = Diagnosis(Failure.MISCONFIGURED, "ERR max number of clients reached")
    assert closed_before_answering(refused, "redis://h1:6379") == refused


def test_only_a_close_or_reset_by_the_node_is_a_drop() -> None:
    def raised(exc: Exception, cause: BaseException) -> Exception:
        try:
            try:
                raise cause
            except BaseException as inner:
                raise exc from inner
        except Exception as outer:
            return outer

    reset = ConnectionResetError(104, "Connection reset by peer")
    dropped_ones = [
        reset,
        BrokenPipeError(32, "Broken pipe"),
        ClosedByNode("Connection closed by server."),
        rx.ConnectionError("Connection closed by server."),  # redis-py's own, in a set-up
        raised(rx.ConnectionError("Error while reading from h1:6379 : (104, ...)"), reset),
    ]
    others = [
        ConnectionRefusedError(111, "Connection refused"),
        rx.ConnectionError("Error 111 connecting to h1:6379. Connection refused."),
        rx.TimeoutError("Timeout reading from socket"),
        rx.ResponseError("ERR max number of clients reached"),
        NotRedis("not RESP"),
    ]
    assert [dropped(exc) for exc in dropped_ones] == [True] * len(dropped_ones)
    assert [dropped(exc) for exc in others] == [False] * len(others)
    why = diagnose(reset)
    assert "may speak TLS" in before_first_reply(why, reset, "redis://h1:6379").detail
    refused = others[0]
    assert before_first_reply(diagnose(refused), refused, "redis://h1") == diagnose(refused)


def test_configuration_error_is_a_tls_certificate_error_naming_the_node() -> None:
    rnd = Round(3, 2, started=0.0)
    why = certificate_rejected(64, "IP address mismatch")
    rnd.fail(1, why.failure, why.detail)
    rnd.fail(2, Failure.UNREACHABLE, "refused")
    error = configuration_error(rnd, ["a", "rediss://h1:6380", "c"])
    assert isinstance(error, tenure.TLSCertificateError)
    assert isinstance(error, tenure.NodeMisconfigured)
    assert not isinstance(error, tenure.ServerUnsupported)
    assert error.node == "rediss://h1:6380"
    assert error.parameter == "nodes[1]"
    assert str(error).startswith("node rediss://h1:6380: its TLS certificate does not match")
    assert "c: unreachable: refused" in str(error)
    # The warning logged when the others lock on says it the same way.
    assert naming("rediss://h1:6380", why.failure, why.detail) == (
        f"node rediss://h1:6380: {why.detail}"
    )
    assert naming("h0", Failure.MISCONFIGURED, "is a read-only replica") == (
        "node h0 is a read-only replica"
    )


def test_an_acl_hint_follows_the_clients_key_prefix() -> None:
    # The drivers diagnose with the default prefix's hint; what a client says names its
    # own keys and channels (the error, its node_errors, and the warning's text).
    why = error_reply("NOPERM this user has no permissions to access one of the keys")
    denied = diagnose(rx.ResponseError("ERR ACL failure in script: No permissions to access a key"))
    rnd = Round(3, 2, started=0.0)
    rnd.fail(0, why.failure, why.detail)
    rnd.fail(1, denied.failure, denied.detail)
    names = ["a", "b", "c"]
    error = configuration_error(rnd, names, "app1:")
    assert error is not None
    texts = [str(error), *error.node_errors.values(), naming("a", why.failure, why.detail, "app1:")]
    for text in texts:
        assert "~app1:* and channels &app1:wake:*" in text, text
        assert "`tenure check --key-prefix app1:`" in text, text
        assert "tenure:" not in text, text
    default = configuration_error(rnd, names)
    assert default is not None
    assert "~tenure:* and channels &tenure:wake:* (`tenure check` names" in str(default)


def test_a_node_backing_off_says_why_it_failed() -> None:
    # Without the cause, every round after the first failure read "backing off" alone,
    # and a refused connection looked like a node that stopped answering.
    refused = Diagnosis(Failure.UNREACHABLE, "Error 111 connecting to 127.0.0.1:7000.")
    down = BackingOff(0.02, refused)
    assert down.failure is Failure.BACKING_OFF
    assert down.detail == (
        "not retried until the back-off ends (0.020s) after it failed: "
        "unreachable: Error 111 connecting to 127.0.0.1:7000."
    )
    assert BackingOff(0.02).detail == "not retried until the back-off ends (0.020s)"
    wrong = Diagnosis(Failure.MISCONFIGURED, "is a read-only replica")
    assert (BackingOff(0.02, wrong).failure, BackingOff(0.02, wrong).detail) == (
        Failure.MISCONFIGURED,
        "is a read-only replica",
    )


@pytest.mark.parametrize(
    ("reply", "refusal"),
    [
        ("DENIED Running in protected mode because protected mode is enabled", True),
        ("DENIED Redis is running in protected mode", True),
        ("ERR max number of clients reached", True),
        ("max number of clients + cluster connections reached", True),
        ("NOAUTH Authentication required.", False),
        ("ERR unknown command 'DENIED'", False),
        ("LOADING Valkey is loading the dataset in memory", False),
    ],
)
def test_a_node_refusing_the_connection_itself_is_told_apart(reply: str, refusal: bool) -> None:
    # Sent as the node takes the connection, before any request, and followed by its
    # close: the asyncio client takes it for the reason the connection ends, not an
    # answer (and ``tenure check`` asks again to see it).
    assert refuses_connection(reply) is refusal

"""Sentinel-managed nodes: the ``redis+sentinel://`` form, and the pure decisions of
``tenure._core.sentinel`` (which Sentinel to ask, what its replies mean)."""

from __future__ import annotations

import pytest

import tenure
from tenure import ConfigurationError
from tenure._core.config import ClientConfig, parse_node_url
from tenure._core.diagnosis import Diagnosis, error_reply
from tenure._core.quorum import Failure
from tenure._core.sentinel import (
    UNKNOWN_SERVICE,
    Heard,
    SentinelBook,
    Survey,
    ask_timeout,
    auth_refused,
    demoted,
    fallback_failed,
    master_reply,
    moved_meanwhile,
    no_master,
    role_of,
    switched_to,
)


@pytest.mark.parametrize(
    ("url", "display", "sentinels", "service", "db", "redis_url"),
    [
        ("redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/locks", "redis+sentinel://10.0.0.1:26379,10.0.0.2:26380/locks",
         (("10.0.0.1", 26379), ("10.0.0.2", 26380)), "locks", 0, "redis://sentinel-master.invalid:6379/0"),
        ("rediss+sentinel://app:p%40ss@s1,[::1]:5000/locks/3", "rediss+sentinel://s1:26379,[::1]:5000/locks/3",
         (("s1", 26379), ("::1", 5000)), "locks", 3, "rediss://app:p%40ss@sentinel-master.invalid:6379/3"),
        ("REDIS+SENTINEL://s1/my-svc?db=2", "redis+sentinel://s1:26379/my-svc/2",
         (("s1", 26379),), "my-svc", 2, "redis://sentinel-master.invalid:6379/2?db=2"),
    ],
)  # fmt: skip
def test_the_sentinel_url_form(
    url: str,
    display: str,
    sentinels: tuple[tuple[str, int], ...],
    service: str,
    db: int,
    redis_url: str,
) -> None:
    address = parse_node_url(url)
    assert address.display == display
    assert address.sentinel is not None
    assert address.sentinel.sentinels == sentinels
    assert address.sentinel.service == service
    assert address.db == db
    assert address.redis_url == redis_url
    assert address.sentinel.tls == url.lower().startswith("rediss")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+sentinel://:Zq9xWv7k@h1:26379", "names no service"),
        ("redis+sentinel://:Zq9xWv7k@h1:26379/", "names no service"),
        ("redis+sentinel://:Zq9xWv7k@/locks", "names no Sentinel"),
        ("redis+sentinel://:Zq9xWv7k@h1:0/locks", "port must be in 1..65535"),
        ("redis+sentinel://:Zq9xWv7k@h1:abc/locks", "is not host:port"),
        ("redis+sentinel://:Zq9xWv7k@h1,,h2/locks", "is not host:port"),
        ("redis+sentinel://:Zq9xWv7k@h1/locks/x", "database must be an integer >= 0"),
        ("redis+sentinel://:Zq9xWv7k@h1/locks/1/2", "/service_name or /service_name/db"),
        ("redis+sentinel://:Zq9x/Wv7k@h1/locks", "percent-encode"),
        ("redis+sentinel://:Zq9xWv7k@h1/my%20locks", "whitespace"),
    ],
)
def test_a_malformed_sentinel_url_names_the_node_the_form_and_hides_the_password(
    url: str, says: str
) -> None:
    for make in (tenure.Client, tenure.AsyncClient):
        with pytest.raises(ConfigurationError) as info:
            make(["redis://a", url, "redis://c"])
        text = str(info.value)
        assert info.value.parameter == "nodes[1]"
        assert says in text, text
        assert "Zq9x" not in text, text
        assert "Wv7k" not in text, text
        assert "sentinel" in text.lower()


def test_the_same_service_through_the_same_sentinels_is_listed_once() -> None:
    with pytest.raises(ConfigurationError, match=r"nodes\[1\]: .*same server as nodes\[0\]"):
        ClientConfig.build(
            ["redis+sentinel://a:1,b:2/locks", "redis+sentinel://b:2,a:1/locks", "redis://c"]
        )
    # Another service, or another database, is another node.
    ClientConfig.build(
        ["redis+sentinel://a:1,b:2/locks", "redis+sentinel://a:1,b:2/other", "redis://c"]
    )


def test_a_sentinel_node_is_one_vote() -> None:
    config = ClientConfig.build(["redis+sentinel://a:1,b:2,c:3/locks"])
    assert len(config.nodes) == 1
    assert config.quorum == 1


def test_the_sentinel_that_answered_is_asked_first() -> None:
    a, b, c = ("a", 1), ("b", 2), ("c", 3)
    book = SentinelBook([a, b, c, a])
    assert book.order() == [a, b, c]
    assert book.candidates(None) is None  # nothing named yet
    book.answered(c, ("m", 6379))
    assert book.order() == [c, a, b]
    assert book.master == ("m", 6379)
    assert book.candidates(None) == ("m", 6379)
    assert book.candidates(("n", 6380)) == ("n", 6380)
    book.answered(b, ("n", 6380))
    assert book.order() == [b, c, a]
    assert not book.without_auth(a)
    book.takes_no_auth(a)
    assert book.without_auth(a)


def test_after_an_announced_failover_a_sentinel_naming_another_master_is_passed_over() -> None:
    # It has not learnt of the failover yet, or it was cut off from the others: it names
    # the old master, which is a master still, until the Sentinels demote it.
    a, b, c = ("a", 1), ("b", 2), ("c", 3)
    old, new = ("old", 6379), ("new", 6380)
    book = SentinelBook([a, b, c])
    assert book.answered(a, old)
    book.announced(new)
    assert book.master == new  # the one to fall back on, should no Sentinel answer
    assert not book.answered(a, old)
    assert book.order() == [b, c, a]  # asked last from now on
    assert book.master == new
    assert book.answered(b, new)
    assert book.order() == [b, c, a]
    # Every Sentinel that answers names another (a later failover, not heard): the
    # first one's answer is taken, and the announcement no longer passes any over.
    assert not book.answered(b, ("later", 6381))
    book.only_others(c, ("later", 6381))
    assert book.order() == [c, a, b]
    assert book.master == ("later", 6381)
    assert book.answered(a, old)


def test_a_sentinel_whose_master_cannot_be_used_is_asked_last() -> None:
    # Its view is out of date (it names a replica, or a server that is gone): asked
    # first, it would name that server at every connection.
    a, b, c = ("a", 1), ("b", 2), ("c", 3)
    book = SentinelBook([a, b, c])
    book.answered(a, ("replica", 6380))
    book.misled(a)
    assert book.order() == [b, c, a]
    book.answered(b, ("gone", 6381))
    book.misled(b)
    assert book.order() == [c, a, b]
    book.answered(c, ("m", 6379))
    assert book.order() == [c, a, b]
    book.misled(("unknown", 4))  # not one of the node's Sentinels: nothing to move
    assert book.order() == [c, a, b]


def test_a_master_named_last_that_fails_too_names_the_sentinels() -> None:
    said = [(("s1", 26379), Diagnosis(Failure.UNREACHABLE, "Connection refused"))]
    down = Diagnosis(Failure.UNREACHABLE, "Error 111 connecting to m:6379")
    why = fallback_failed("locks", said, ("m", 6379), down)
    assert why.failure is Failure.UNREACHABLE
    assert why.detail == (
        "no Sentinel answered for service 'locks' (s1:26379: Connection refused), and the "
        "master they named last, m:6379, failed too: Error 111 connecting to m:6379"
    )
    # A master that refuses for its own configuration says so: no Sentinel changes it.
    refused = Diagnosis(Failure.MISCONFIGURED, "refused the credentials")
    assert fallback_failed("locks", said, ("m", 6379), refused) is refused


def test_asking_every_sentinel_leaves_a_share_for_the_master() -> None:
    assert ask_timeout(1.0, 3) == 0.25
    assert ask_timeout(1.0, 1) == 0.5


def test_replies() -> None:
    assert master_reply([b"10.0.0.5", b"6380"]) == ("10.0.0.5", 6380)
    assert master_reply(None) is None
    for garbage in ([b"h"], [b"h", b"x"], b"OK", [b"h", b"0"]):
        with pytest.raises(ValueError, match="not a master's address"):
            master_reply(garbage)
    assert role_of([b"master", 0, []]) == "master"
    assert role_of([b"slave", b"h", 1, b"connected", 5]) == "slave"
    assert role_of(b"OK") == "b'OK'"


def test_a_sentinel_without_a_password_is_recognised() -> None:
    assert auth_refused(
        "AUTH <password> called without any password configured for the default user."
    )
    assert auth_refused("WRONGPASS invalid username-password pair or user is disabled.")
    assert not auth_refused("Error 111 connecting to 127.0.0.1:26379. Connection refused.")


def test_a_demoted_master_is_unreachable_not_misconfigured() -> None:
    readonly = error_reply("READONLY You can't write against a read only replica.")
    assert readonly.failure is Failure.MISCONFIGURED  # a plain node: listed wrong
    why = demoted(readonly)
    assert why.failure is Failure.UNREACHABLE
    assert "demoted" in why.detail
    other = Diagnosis(Failure.MISCONFIGURED, "requires a password")
    assert demoted(other) is other


def test_no_master_names_the_service_and_each_sentinel() -> None:
    refused = Diagnosis(Failure.UNREACHABLE, "connection refused")
    silent = Diagnosis(Failure.UNREACHABLE, "timed out")
    why = no_master("locks", [(("a", 1), refused), (("::1", 2), silent)])
    assert why == Diagnosis(
        Failure.UNREACHABLE,
        "no Sentinel named a master for service 'locks' "
        "(a:1: connection refused; [::1]:2: timed out)",
    )


def test_no_master_from_sentinels_that_are_all_misconfigured_is_misconfigured() -> None:
    """A data server listed as a Sentinel will never name a master: the node is
    misconfigured (an acquire says so at once), not unreachable until it recovers."""
    data_server = error_reply("ERR unknown command 'SENTINEL', with args beginning with: ")
    assert data_server.failure is Failure.MISCONFIGURED
    why = no_master("locks", [(("a", 1), data_server), (("b", 2), data_server)])
    assert why.failure is Failure.MISCONFIGURED
    assert "a:1: is not a Sentinel" in why.detail
    assert "b:2: is not a Sentinel" in why.detail
    # One Sentinel down or not knowing the service yet: it may come, so unreachable.
    down = Diagnosis(Failure.UNREACHABLE, "connection refused")
    assert no_master("locks", [(("a", 1), data_server), (("b", 2), down)]).failure is (
        Failure.UNREACHABLE
    )
    # Configuration failures of different kinds: misconfigured.
    rejected = Diagnosis(Failure.CERTIFICATE, "certificate rejected")
    assert no_master("locks", [(("a", 1), data_server), (("b", 2), rejected)]).failure is (
        Failure.MISCONFIGURED
    )


def test_the_server_a_sentinel_names_keeps_the_node_s_settings() -> None:
    node = parse_node_url(
        "rediss+sentinel://app:pw@s1:26379,s2:26380/orders/3?ssl_cert_reqs=none", "nodes"
    )
    server = node.server_at("10.0.0.7", 6380)
    assert server.sentinel is None
    assert (server.host, server.port, server.db) == ("10.0.0.7", 6380, 3)
    assert server.url == "rediss://app:pw@10.0.0.7:6380/3?ssl_cert_reqs=none"
    assert parse_node_url("redis://h:1", "nodes").server_at("x", 2).url == "redis://h:1"


S1, S2, S3, S4, S5 = ((f"10.0.0.{i}", 26379) for i in range(1, 6))
REPLICA, GONE, MASTER = ("10.0.1.2", 6379), ("10.0.1.9", 6379), ("10.0.1.1", 6379)
OTHER = ("10.0.2.1", 6379)
_DOWN = Diagnosis(
    Failure.UNREACHABLE, "Error 111 connecting to 10.0.0.5:26379. Connection refused."
)


def test_a_survey_picks_the_master_the_clients_end_on_and_names_the_sentinels_before_it() -> None:
    """``tenure check`` and ``tenure status`` pick the master as the clients' successive
    connections do: the first named, in the order listed, that can be used; each
    Sentinel before it that named one that cannot is out of date."""
    survey = Survey(
        "locks", [Heard(S1, REPLICA), Heard(S2, GONE), Heard(S3, MASTER), Heard(S4, MASTER)]
    )
    assert survey.named() == [REPLICA, GONE, MASTER]
    pick = survey.pick({REPLICA: "is a slave", GONE: "failed: Connection refused", MASTER: None})
    assert pick is not None
    assert (pick.master, pick.by, pick.usable) == (MASTER, S3, True)
    first, second = pick.warnings  # S4 agrees
    assert first.startswith("Sentinel 10.0.0.1:26379 is out of date: it names 10.0.1.2:6379")
    assert "which is a slave" in first
    assert (
        "the clients ask it last and use 10.0.1.1:6379, named by Sentinel 10.0.0.3:26379" in first
    )
    assert second.startswith("Sentinel 10.0.0.2:26379 is out of date: it names 10.0.1.9:6379")
    assert "failed: Connection refused" in second


def test_a_survey_names_the_sentinels_listed_after_the_one_the_clients_hear() -> None:
    """The clients stop at the first Sentinel naming a usable master; a command asks
    every one, and names each after it that is out of date, does not know the service,
    names another master, or cannot be asked."""
    unknown = Diagnosis(Failure.UNREACHABLE, UNKNOWN_SERVICE)
    heard = [
        Heard(S1, MASTER),
        Heard(S2, why=unknown, answered=True),
        Heard(S3, REPLICA),
        Heard(S4, OTHER),
        Heard(S5, why=_DOWN),
    ]
    pick = Survey("locks", heard).pick({MASTER: None, REPLICA: "is a slave", OTHER: None})
    assert pick is not None
    assert (pick.master, pick.by, pick.usable) == (MASTER, S1, True)
    used = "the clients use 10.0.1.1:6379, named by Sentinel 10.0.0.1:26379"
    view = "(check that Sentinel's view: SENTINEL MASTER locks on it)"
    assert list(pick.warnings) == [
        f"Sentinel 10.0.0.2:26379 names no master of service 'locks': it does not know it; "
        f"{used}, and find it through one Sentinel fewer {view}",
        "Sentinel 10.0.0.3:26379 is out of date: it names 10.0.1.2:6379 master of service "
        "'locks', which is a slave; the clients ask it last and use 10.0.1.1:6379, named by "
        f"Sentinel 10.0.0.1:26379 {view}",
        "Sentinel 10.0.0.4:26379 disagrees: it names 10.0.2.1:6379 master of service 'locks', "
        f"which answers ROLE as a master too; {used}, and would use 10.0.2.1:6379 whenever "
        "this Sentinel is the first they hear: two servers say they are the master (check "
        "the Sentinels' view, SENTINEL MASTER locks on each, and ROLE on both servers)",
        "Sentinel 10.0.0.5:26379 cannot be asked for the master of service 'locks': Error 111 "
        f"connecting to 10.0.0.5:26379. Connection refused; {used}, and find it through one "
        "Sentinel fewer",
    ]


def test_a_survey_with_no_usable_master_picks_the_first_named() -> None:
    """No master named can be used (a failover under way): the first named is the
    node's (unusable); the others are named without a master the clients use."""
    heard = [Heard(S1, why=_DOWN), Heard(S2, REPLICA), Heard(S3, GONE), Heard(S4, REPLICA)]
    pick = Survey("locks", heard).pick({REPLICA: "is a slave", GONE: "failed: timeout"})
    assert pick is not None
    assert (pick.master, pick.by, pick.usable) == (REPLICA, S2, False)
    assert list(pick.warnings) == [
        "Sentinel 10.0.0.1:26379 cannot be asked for the master of service 'locks': Error 111 "
        "connecting to 10.0.0.5:26379. Connection refused",
        "Sentinel 10.0.0.3:26379 names 10.0.1.9:6379 master of service 'locks', which failed: "
        "timeout (check that Sentinel's view: SENTINEL MASTER locks on it)",
    ]
    assert Survey("locks", [Heard(S1, why=_DOWN)]).pick({}) is None


@pytest.mark.parametrize(
    ("message", "moved_to"),
    [
        (b"locks 10.0.1.1 6379 10.0.1.2 6380", ("10.0.1.2", 6380)),
        ("locks 10.0.1.1 6379 ::1 6380", ("::1", 6380)),
        (b"other 10.0.1.1 6379 10.0.1.2 6380", None),  # another service's
        (b"locks 10.0.1.1 6379 10.0.1.2", None),  # another shape
        (b"locks 10.0.1.1 6379 10.0.1.2 port", None),
        (b"locks 10.0.1.1 6379 10.0.1.2 0", None),
        (b"locks 10.0.1.1 6379 10.0.1.2 65536", None),
        (b"locksmith 10.0.1.1 6379 10.0.1.2 6380", None),
        (7, None),
    ],
)
def test_an_announced_failover_is_read_for_its_own_service_only(
    message: object, moved_to: tuple[str, int] | None
) -> None:
    assert switched_to("locks", message) == moved_to


def test_a_connection_overtaken_by_an_announced_failover_says_so() -> None:
    assert moved_meanwhile("locks", ("10.0.1.1", 6379), ("::1", 6380)) == (
        "10.0.1.1:6379 was named master of service 'locks', and the Sentinels have announced "
        "[::1]:6380 since; the node is asked again after its back-off"
    )

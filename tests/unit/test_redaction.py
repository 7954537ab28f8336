"""No password of a node URL in any error message, repr or log line.

Every refusal of a node URL quotes it through one helper (``redact_url``), which shows
``redis://user:***@host:port``: the malformed, the host-less, a bad port or database, an
unknown or planned scheme, the URL given where a list was expected, the CLI's one-line
errors. Passwords holding the characters that end a URL's host part (``/ ? #``) are the
hard case: urllib then reads part of the password as the host or port.
"""

from __future__ import annotations

import contextlib
import logging
import re
import warnings
from collections.abc import Callable, Iterator
from urllib.parse import quote

import pytest

import tenure
from tenure._core.config import ClientConfig, parse_node_url, redact_url
from tenure.cli.main import main

# Passwords whose pieces are unlike any word of a message, so that finding one of them
# in a message can only mean the password leaked (in full or in part).
PASSWORDS = ("Zq9xWv7kJm4", "Zq9x?Wv7k#Jm4", "Zq9x/Wv7k", "Zq9x@Wv7k:Jm4")

# Each kind of refusal, the password put where the user part of the URL is.
CASES = {
    "malformed port": "redis://app:{pw}@host:abc",
    "malformed IPv6 host": "redis://app:{pw}@[::1",
    "malformed under NFKC": "redis://app:{pw}\uff0f@host",
    "no host": "redis://app:{pw}@:6379",
    "no host, a db": "redis://app:{pw}@/0",
    "no socket path": "unix://app:{pw}@",
    "bad db": "redis://app:{pw}@host/abc",
    "bad db in the query": "redis://app:{pw}@host?db=-1",
    "bad unix db": "unix://app:{pw}@/tmp/r.sock?db=x",
    "port 0": "redis://app:{pw}@host:0",
    "port out of range": "redis://app:{pw}@host:99999",
    "unknown scheme": "http://app:{pw}@host:6379",
    "sentinel URL, no service": "redis+sentinel://app:{pw}@10.0.0.1:26379",
    "sentinel URL, bad port": "redis+sentinel://app:{pw}@10.0.0.1:263x9,h2/locks",
    "sentinel URL, bad db": "rediss+sentinel://app:{pw}@10.0.0.1/locks/x",
    "malformed cluster, no user": "rediss+cluster://:{pw}@h1:6379,,h2:6379",
    "cluster with a db": "redis+cluster://app:{pw}@h1:6379/2",
}


def _pieces(password: str) -> list[str]:
    """The password, and every part of it urllib might quote alone (it splits on these)."""
    return [password, *(p for p in re.split(r"[/?#@:]", password) if len(p) >= 3)]


def _assert_hidden(password: str, *texts: str) -> None:
    for text in texts:
        for piece in _pieces(password):
            assert piece not in text, text


@contextlib.contextmanager
def _every_log_line() -> Iterator[list[str]]:
    """Whatever the library logs (any level) or warns while the block runs."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    keep = Keep(logging.DEBUG)
    root = logging.getLogger()
    old = root.level
    root.addHandler(keep)
    root.setLevel(logging.DEBUG)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield lines
        lines.extend(str(w.message) for w in caught)
    finally:
        root.removeHandler(keep)
        root.setLevel(old)


def _refusals(url: str) -> list[Callable[[], object]]:
    return [
        lambda: parse_node_url(url, "nodes[1]"),
        lambda: ClientConfig.build(["redis://a", url, "redis://c"]),
        lambda: tenure.Client(["redis://a", url, "redis://c"]),
        lambda: tenure.AsyncClient(["redis://a", url, "redis://c"]),
    ]


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_refused_url_shows_its_password(case: str, password: str) -> None:
    url = CASES[case].format(pw=password)
    with _every_log_line() as logged:
        for refuse in _refusals(url):
            with pytest.raises(tenure.ConfigurationError) as info:
                refuse()
            assert info.value.parameter == "nodes[1]", info.value
            _assert_hidden(password, str(info.value), repr(info.value))
            # The message still shows which URL it is about, without the password.
            assert redact_url(url) in str(info.value), info.value
    _assert_hidden(password, *logged)


@pytest.mark.parametrize("password", PASSWORDS)
@pytest.mark.parametrize("command", ["status", "check", "run"])
def test_the_commands_do_not_print_a_refused_urls_password(
    command: str, password: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for url in (c.format(pw=password) for c in CASES.values()):
        argv = {
            "status": ["status", "a-lock", "--redis", url],
            "check": ["check", "--redis", url],
            "run": ["run", "a-lock", "--redis", url, "--", "true"],
        }[command]
        assert main(argv) != 0
        out, err = capsys.readouterr()
        assert "error" in err
        _assert_hidden(password, out, err)


def _list_refusals(nodes: object) -> list[Callable[[], object]]:
    return [
        lambda: ClientConfig.build(nodes),
        lambda: tenure.Client(nodes),  # type: ignore[arg-type]
        lambda: tenure.AsyncClient(nodes),  # type: ignore[arg-type]
        lambda: parse_node_url(nodes if not isinstance(nodes, str) else [nodes]),
    ]


@pytest.mark.parametrize("password", PASSWORDS)
def test_a_url_where_a_list_belongs_is_refused_without_its_password(password: str) -> None:
    url = f"redis://app:{password}@host:6379"
    for nodes in (url, {url}, url.encode(), [url.encode()]):
        for refuse in _list_refusals(nodes):
            with pytest.raises(tenure.ConfigurationError) as info:
                refuse()
            _assert_hidden(password, str(info.value), repr(info.value))


def test_a_node_address_repr_hides_the_password() -> None:
    address = parse_node_url("redis://app:Zq9xWv7kJm4@host:6390/2")
    config = ClientConfig.build(["redis://app:Zq9xWv7kJm4@host:6390/2"])
    for text in (repr(address), repr(config), str(config)):
        assert "Zq9xWv7kJm4" not in text, text
        assert "app:***@host:6390/2" in text, text


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://u:pw@host:6379/0", "redis://u:***@host:6379/0"),
        ("redis://:pw@host", "redis://:***@host"),
        ("rediss://u@host", "rediss://u@host"),  # a user alone is no secret
        ("redis://host:6379", "redis://host:6379"),
        ("unix://u:pw@/tmp/r.sock?db=1", "unix://u:***@/tmp/r.sock?db=1"),
        ("unix:///tmp/a@b.sock", "unix:///tmp/a@b.sock"),
        ("redis://u:p@ss@host", "redis://u:***@host"),
        ("redis://u:pa?ss#x@host", "redis://u:***@host"),
        ("redis://u:pa/ss@host/0", "redis://u:***@host/0"),
        # Text holding URLs (a repr): every password in it is covered.
        ("['redis://a:x1@h1', 'redis://b:y2@h2']", "['redis://a:***@h2']"),
        ("b'redis://u:pw@h'", "b'redis://u:***@h'"),
        ("no url here: a:b@c", "no url here: a:b@c"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


@pytest.mark.parametrize(
    "password",
    [
        "Zq9x/Wv7k",
        "Zq9x?Wv7k",
        "Zq9x#Wv7k",
        # With an '@' before the cut, urllib finds an '@' in the host part all the same,
        # and reads the host and port from inside the password: quoted as a bad port,
        # or another server ("Zq9x@Wv7k:1234?..." is host "wv7k", port 1234).
        "Zq9x@Wv7k:Jm4/Ab3",
        "Zq9x@Wv7k:1234?Jm4",
        "Zq9x@Wv7k:1234#Jm4",
        "Zq9x@Wv7k:1234/Jm4",
    ],
)
def test_a_password_that_cuts_the_host_part_is_refused_with_the_fix(password: str) -> None:
    # urllib (and redis-py) would read "redis://app:Zq9x/..." as host "app", port "Zq9x":
    # another server, and a password shown as a port. Percent-encoded, it is accepted.
    url = f"redis://app:{password}@host:6379"
    with pytest.raises(tenure.ConfigurationError) as info:
        parse_node_url(url, "nodes[0]")
    message = str(info.value)
    _assert_hidden(password, message)
    assert "percent-encode" in message, message
    assert "%2F" in message, message
    encoded = f"redis://app:{quote(password, safe='@:')}@host:6379"
    address = parse_node_url(encoded)
    assert (address.host, address.port) == ("host", 6379)

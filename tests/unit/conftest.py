"""Unit tests exercise the pure core only: any attempt to open a connection fails the test.

The guard raises ``pytest.fail``'s outcome exception, which is a ``BaseException``: a
driver's ``except Exception`` / ``except OSError`` cannot swallow it and turn an
accidental network call into a quiet "node unreachable".
"""

from __future__ import annotations

import socket
from typing import NoReturn

import pytest


def _forbidden(what: str) -> NoReturn:
    pytest.fail(f"unit tests must not use the network ({what} was called)", pytrace=True)


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every way of opening a connection fail the test loudly."""

    def connect(self: socket.socket, address: object) -> NoReturn:
        _forbidden(f"socket.connect({address!r})")

    def connect_ex(self: socket.socket, address: object) -> NoReturn:
        _forbidden(f"socket.connect_ex({address!r})")

    def create_connection(address: object, *args: object, **kwargs: object) -> NoReturn:
        _forbidden(f"socket.create_connection({address!r})")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "create_connection", create_connection)

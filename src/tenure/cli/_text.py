"""Text helpers shared by the ``tenure`` subcommands."""

from __future__ import annotations

from .._core.diagnosis import for_prefix, in_url_form
from .._core.quorum import Failure
from .._driver.redis_compat import before_first_reply, diagnose

__all__ = ["failure_line", "one_line"]


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name if it has none): the
    commands report errors on one line each, without a traceback."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def failure_line(exc: Exception, prefix: str, form: str | None = None) -> str:
    """The line of a node whose read failed, as the clients diagnose that failure (a
    server that is not Redis, a password refused, an ACL...), with what to fix; a URL
    it shows is in ``form`` (the node's ``login_form``) when given."""
    why = diagnose(exc)
    if form is not None:
        # The commands read each node on a connection of their own, so a close or reset
        # comes before its first reply: at a TLS port, most likely.
        why = before_first_reply(in_url_form(why, form), exc, form)
    if why.failure is Failure.UNREACHABLE:
        # The diagnosis, not the exception alone: it may add the likely cause (a
        # rediss:// URL at a plain port times out in the TLS handshake).
        lines = why.detail.strip().splitlines()
        return f"unreachable: {lines[0] if lines else one_line(exc)}"
    # A fix it suggests (an ACL's key pattern) is for the clients of ``prefix``.
    return f"{why.failure.value}: {for_prefix(why.detail, prefix)}"

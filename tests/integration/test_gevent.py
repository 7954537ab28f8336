"""The blocking client in a process gevent has patched (gunicorn's and Celery's gevent
workers): its rounds, set-ups and notification listener wait through gevent's select
and threads, so a greenlet waiting for a lock or a reply leaves the others running.

Patching is for a whole process, so the client runs in a fresh interpreter
(``gevent_run.py``), on nodes it starts itself, and reports what it saw.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("gevent")

RUN = Path(__file__).with_name("gevent_run.py")


def test_the_blocking_client_under_gevent() -> None:
    done = subprocess.run(
        [sys.executable, str(RUN)], capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    # 8 greenlets x 10 critical sections on one name, each yielding inside: one at a
    # time, and every one done.
    assert seen["most_inside"] == 1, seen
    assert seen["done"] == 80, seen
    # An acquire that waits out its timeout on a held lock: the other greenlets ran
    # meanwhile (a ticker every 10 ms ticked through the second), so the wait went to
    # gevent's hub rather than blocking the process.
    assert seen["timed_out"] is True, seen
    assert seen["waited"] >= 1.0, seen
    assert seen["ticks"] >= 20, seen
    # Woken by the release's notification, not by the 2.5-5 s recheck.
    assert seen["woken_after"] is not None, seen
    assert seen["woken_after"] < 1.5, seen
    assert seen["failed_with_a_frozen_node"] == 0, seen
    assert seen["watched_valid"] is True, seen

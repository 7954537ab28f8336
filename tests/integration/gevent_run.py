"""The blocking client in a gevent-patched process (gunicorn's gevent workers, say):
run by ``test_gevent.py`` in a fresh interpreter, as patching is for the whole process.

It prints one JSON object of what it saw; the test says what each must be.
"""

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402  (after patching, as a gevent program must)
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402

import tenure  # noqa: E402
from tenure.testing import LocalCluster  # noqa: E402


def main() -> None:
    seen: dict[str, object] = {}
    with LocalCluster(5) as nodes:
        # recheck: a waiter that polls would wake seconds late; one notified, at once.
        client = tenure.Client(nodes.urls, recheck=5.0, node_timeout=0.2)
        client.acquire("gevent:warm", ttl=5.0).release()

        # Greenlets contending for one name: one holder at a time, none lost.
        inside = {"now": 0, "most": 0, "done": 0}

        def contend() -> None:
            for _ in range(10):
                with client.lock("gevent:shared", ttl=5.0):
                    inside["now"] += 1
                    inside["most"] = max(inside["most"], inside["now"])
                    gevent.sleep(0.001)  # yield inside the critical section
                    inside["now"] -= 1
                    inside["done"] += 1

        gevent.joinall([gevent.spawn(contend) for _ in range(8)], timeout=60)
        seen["most_inside"], seen["done"] = inside["most"], inside["done"]

        # A blocked acquire leaves the hub free: another greenlet keeps ticking.
        held = client.acquire("gevent:held", ttl=30.0)
        ticks = [0]

        def tick() -> None:
            while True:
                gevent.sleep(0.01)
                ticks[0] += 1

        ticker = gevent.spawn(tick)
        waited = time.monotonic()
        seen["timed_out"] = client.lock("gevent:held", ttl=5.0).acquire(timeout=1.0) is False
        seen["waited"] = time.monotonic() - waited
        ticker.kill()
        seen["ticks"] = ticks[0]

        # A waiter in another greenlet is woken by the release's notification.
        woke: list[float] = []

        def wait() -> None:
            lease = client.acquire("gevent:held", ttl=5.0, timeout=10.0)
            woke.append(time.monotonic())
            lease.release()

        waiter = gevent.spawn(wait)
        gevent.sleep(0.5)  # queued by then, on a quiet or loaded machine alike
        released = time.monotonic()
        held.release()
        waiter.join(15)
        seen["woken_after"] = woke[0] - released if woke else None

        # A frozen node costs its vote only.
        nodes[4].pause()
        failed = 0
        for i in range(20):
            try:
                client.acquire(f"gevent:frozen:{i}", ttl=5.0, blocking=False).release()
            except tenure.LockError:
                failed += 1
        nodes[4].resume()
        seen["failed_with_a_frozen_node"] = failed

        # The watchdog keeps a lease past its TTL while its holder sleeps.
        with client.acquire("gevent:watched", ttl=1.0, watchdog=True) as lease:
            gevent.sleep(2.5)
            seen["watched_valid"] = lease.valid
        client.close()
    json.dump(seen, sys.stdout)


if __name__ == "__main__":
    main()

"""The pure core: every lock decision, no I/O.

Nothing in this package imports redis, socket, asyncio, time or threading (a unit test
enforces it). Time is always passed in, as seconds on the caller's monotonic clock, and
randomness comes from a ``random.Random`` the caller owns, so the sync and asyncio drivers
carry out exactly the same algorithm and the tests can drive it with a fake clock.
"""

"""Glue both drivers share: settings, the lease view, redis-py quirks, clocks, reports.

It imports only ``_core`` (and redis-py); ``_sync`` and ``_async`` build on it, and the
public API on them (a layering test enforces the order).
"""

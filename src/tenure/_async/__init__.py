"""The asyncio driver."""

"""The blocking driver."""

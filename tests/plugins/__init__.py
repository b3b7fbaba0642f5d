"""Shared pytest fixtures, one module per part of the system; loaded by tests/conftest.py."""

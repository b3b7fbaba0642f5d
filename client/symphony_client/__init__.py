"""Python client for the Symphony HTTP API."""

from symphony_client.client import ApiError, Client, Event

__all__ = ["ApiError", "Client", "Event"]

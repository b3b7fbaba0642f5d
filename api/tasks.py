"""Celery tasks of the control plane. Tasks stay thin: business logic lives in api/services."""

from celery import shared_task


@shared_task(name="api.ping")
def ping(payload: str = "pong") -> dict[str, str]:
    """Round-trip probe used by health checks and tests to prove a worker consumes the broker."""
    import socket

    return {"payload": payload, "hostname": socket.gethostname()}

"""Django project of the Symphony control plane (settings, URLs, ASGI, Celery app)."""

from web.celery import app as celery_app

__all__ = ["celery_app"]

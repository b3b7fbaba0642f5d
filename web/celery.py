"""Celery application wired to Django settings (``CELERY_*`` keys).

Celery is orchestration only: its tasks talk to the gpu_worker's admin socket and start
sandboxes; it never loads a model.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")

app = Celery("symphony")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

"""ASGI entry point (served by uvicorn so many SSE clients can stream at once)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "web.settings")

application = get_asgi_application()

from django.apps import AppConfig


class ApiConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "api"
    verbose_name = "Symphony API"

    def ready(self) -> None:
        from api import (
            checks,  # noqa: F401 - registers the system checks (plans against the workers' pools)
            schema,  # noqa: F401 - registers the OpenAPI auth extension
            tasks,  # noqa: F401 - registers the tasks api/dispatch.py looks up by name
        )

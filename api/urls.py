from django.urls import path

from api.health import HealthView

urlpatterns = [
    path("health", HealthView.as_view(), name="health"),
]

"""The foundation works through real services: PostgreSQL, Redis, a Celery worker process."""

import pytest
from django.db import connection

from api.tasks import ping

pytestmark = pytest.mark.integration


@pytest.mark.django_db
def test_database_is_postgresql():
    assert connection.vendor == "postgresql"
    with connection.cursor() as cursor:
        cursor.execute("SELECT version()")
        assert "PostgreSQL" in cursor.fetchone()[0]


@pytest.mark.django_db
def test_health_endpoint_reports_real_dependencies(client):
    response = client.get("/api/v1/health")
    assert response.status_code == 200, response.content
    assert response.json() == {"status": "ok", "checks": {"database": "ok", "redis": "ok"}}


def test_celery_task_round_trip_through_real_broker(celery_worker_process):
    result = ping.apply_async(args=["hello"], queue=celery_worker_process)
    value = result.get(timeout=60)
    assert value["payload"] == "hello"
    assert value["hostname"]


@pytest.mark.django_db
def test_openapi_schema_is_served(client):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    assert "/api/v1/health" in response.json()["paths"]


@pytest.mark.django_db
def test_health_answers_load_balancer_probes_by_ip_but_other_paths_check_the_host(client, settings):
    settings.ALLOWED_HOSTS = ["symphony.example.com"]
    probe = client.get("/api/v1/health", HTTP_HOST="10.0.3.17:8000")
    assert probe.status_code == 200 and probe.json()["checks"]["database"] == "ok"
    assert client.get("/api/v1/quota", HTTP_HOST="10.0.3.17:8000").status_code == 400

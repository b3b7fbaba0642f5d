"""Swagger UI at /api/docs/ loads its script and styles from this server, so an offline
deployment (no route to a CDN) still shows the API's documentation."""

from __future__ import annotations

import re
from urllib.parse import urlsplit

import pytest
from django.contrib.staticfiles import finders

pytestmark = pytest.mark.django_db


def test_swagger_ui_references_no_external_host(client):
    page = client.get("/api/docs/")
    assert page.status_code == 200
    html = page.content.decode()
    references = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert any(ref.endswith("swagger-ui-bundle.js") for ref in references), references
    external = [ref for ref in references if urlsplit(ref).netloc or ref.startswith("//")]
    assert external == [], external
    for ref in references:
        if ref.startswith("/static/"):
            assert finders.find(ref.removeprefix("/static/")), f"{ref} is not a static file this server has"


def test_the_documented_run_events_are_the_events_a_run_streams():
    """docs/API.md's list of event types is the contract's (``gpu_worker.contracts``): a type
    added to the stream (``channel`` was missing) fails here until the docs name it."""
    from pathlib import Path

    from gpu_worker.contracts import EVENT_CLASSES

    api_md = (Path(__file__).resolve().parents[2] / "docs" / "API.md").read_text()
    listed = re.search(r"`event:\s*([a-z|]+)`", api_md)
    assert listed, "docs/API.md no longer lists the event types as `event: a|b|...`"
    assert set(listed.group(1).split("|")) == set(EVENT_CLASSES), (listed.group(1), sorted(EVENT_CLASSES))

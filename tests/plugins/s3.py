"""A real S3-compatible server over HTTP for the KV store tests: moto in server mode
(``ThreadedMotoServer``, its Flask app under Werkzeug) on 127.0.0.1 and a free port, started
once per session. Clients reach it through boto3 with an endpoint URL, exactly as a worker
configured with ``SYMPHONY_KV_S3_ENDPOINT_URL`` reaches MinIO or Ceph, so requests go through
HTTP, signing, conditional headers and ETags rather than moto's in-process patching."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

#: Dummy credentials: the server accepts any, boto3 insists on some.
CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """The endpoint URL (``http://127.0.0.1:<port>``) of a running S3 server.

    It runs in a process of its own: moto's server imports Flask, whose ``current_app`` proxy
    raises when vLLM (loaded later in the same test process) inspects every loaded module."""
    from tests.plugins.browser import free_port

    port = free_port()
    log = open(Path(tempfile.mkdtemp(prefix="moto-")) / "moto.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log
    )
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto server did not start (log: {log.name})")
            time.sleep(0.2)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        log.close()


@pytest.fixture
def s3_bucket(s3_server: str, monkeypatch) -> Iterator[tuple[object, str]]:
    """A boto3 client of the server and a fresh bucket (deleted with its objects afterwards)."""
    import boto3

    for var, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
        monkeypatch.setenv(var, value)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("SYMPHONY_KV_S3_ENDPOINT_URL", s3_server)
    client = boto3.client("s3", endpoint_url=s3_server, **CREDENTIALS)
    bucket = f"kv-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    try:
        yield client, bucket
    finally:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                client.delete_object(Bucket=bucket, Key=obj["Key"])
        client.delete_bucket(Bucket=bucket)


@pytest.fixture(params=["directory", "s3"])
def kv_store(request, tmp_path):
    """Each KV store kind in turn: a directory, and an S3 bucket on the real HTTP server. A
    second ``store_from_location`` of the same location is another worker's view of it."""
    from gpu_worker.kvfs import store_from_location

    if request.param == "directory":
        location = str(tmp_path / "kvstore")
    else:
        _client, bucket = request.getfixturevalue("s3_bucket")
        location = f"s3://{bucket}/symphony/kv"
    store = store_from_location(location)
    store.location = location  # type: ignore[attr-defined]
    return store

"""Oversized request bodies are refused before the web process takes them in, through a real
uvicorn: 200 MB streamed from a generator, with a declared ``Content-Length`` and chunked, as a
program upload (multipart), a run's JSON and an OpenAI request, each get a 413 ``too_large`` in
their route's error envelope while the server's peak resident memory (``VmHWM`` of
/proc/<pid>/status) grows by less than a small bound; a program file past its own limit inside
an acceptable body is refused while it streams; another tenant's upload succeeds afterwards."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from django.conf import settings

from tests.plugins.browser import child_env_for_test_db, start_uvicorn, stop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.integration, pytest.mark.timeout(180)]

MIB = 1 << 20
ATTACK_MIB = 200
#: What the server's peak memory may grow by while it refuses the attacks.
RSS_BOUND = 32 * MIB
BOUNDARY = "symphony-test-boundary"
PROGRAM = b"def main(args):\n    return args\n"


@pytest.fixture
def server() -> Iterator[tuple[str, int]]:
    proc, url = start_uvicorn(child_env_for_test_db())
    yield url, proc.pid
    stop(proc, timeout=10)


def _peak_rss(pid: int) -> int:
    """The process's peak resident set so far (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def _multipart_head(name: str) -> bytes:
    return (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="name"\r\n\r\n{name}\r\n'
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.py"\r\n'
        "Content-Type: text/x-python\r\n\r\n"
    ).encode()


TAIL = f"\r\n--{BOUNDARY}--\r\n".encode()


def _stream(head: bytes, mib: int, tail: bytes) -> Iterator[bytes]:
    """``head``, ``mib`` MiB of a Python comment, ``tail``: generated, never held whole."""
    chunk = b"#" * (MIB - 1) + b"\n"
    yield head
    for _ in range(mib):
        yield chunk
    yield tail


def _send(url: str, path: str, secret: str, head: bytes, tail: bytes, content_type: str, declared: bool):
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": content_type}
    if declared:
        headers["Content-Length"] = str(len(head) + ATTACK_MIB * MIB + len(tail))
    return httpx.post(url + path, content=_stream(head, ATTACK_MIB, tail), headers=headers, timeout=60)


def _upload(url: str, secret: str, name: str, content: bytes) -> httpx.Response:
    return httpx.post(
        f"{url}/api/v1/programs",
        data={"name": name},
        files={"file": ("p.py", content, "text/x-python")},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    )


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_oversized_bodies_are_refused_without_the_server_taking_them_in(server, api_tenant_a, api_tenant_b, declared):
    url, pid = server
    secret = api_tenant_a.key_secret
    assert _upload(url, secret, "warm-up", PROGRAM).status_code == 201  # imports and pools settle
    before = _peak_rss(pid)

    program = _send(
        url,
        "/api/v1/programs",
        secret,
        _multipart_head("big"),
        TAIL,
        f"multipart/form-data; boundary={BOUNDARY}",
        declared,
    )
    run = _send(url, "/api/v1/runs", secret, b'{"program": 1, "args": {"x": "', b'"}}', "application/json", declared)
    chat_head = b'{"model": "m", "messages": [{"role": "user", "content": "'
    chat = _send(url, "/v1/chat/completions", secret, chat_head, b'"}]}', "application/json", declared)

    grown = _peak_rss(pid) - before
    assert grown < RSS_BOUND, f"the server's peak memory grew by {grown / MIB:.0f} MiB"

    for response in (program, run):
        assert response.status_code == 413, response.text[:500]
        error = response.json()["error"]
        assert error["code"] == "too_large" and "SYMPHONY_MAX_REQUEST_BYTES" in error["message"]
    assert chat.status_code == 413, chat.text[:500]
    assert chat.json()["error"]["type"] == "invalid_request_error" and chat.json()["error"]["code"] == "too_large"

    started = time.monotonic()
    canary = _upload(url, api_tenant_b.key_secret, "canary", PROGRAM)
    assert canary.status_code == 201, canary.text
    assert time.monotonic() - started < 10


def test_a_program_file_over_its_limit_is_refused_while_it_streams(server, api_tenant_a, api_tenant_b):
    url, _ = server
    limit = settings.SYMPHONY_MAX_PROGRAM_BYTES
    assert limit + 64 * 1024 < settings.DATA_UPLOAD_MAX_MEMORY_SIZE  # the body as a whole is acceptable
    response = _upload(url, api_tenant_a.key_secret, "big", PROGRAM + b"#" * (limit - len(PROGRAM) + 1))
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "too_large" and "SYMPHONY_MAX_PROGRAM_BYTES" in error["message"]
    exact = _upload(url, api_tenant_b.key_secret, "at-the-limit", PROGRAM + b"#" * (limit - len(PROGRAM)))
    assert exact.status_code == 201, exact.text


def test_a_file_over_its_limit_in_a_form_outside_the_api_is_a_400_not_a_500(db):
    """The admin's forms are parsed by Django, not DRF: the same refusal is Django's 400."""
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.test import Client

    big = SimpleUploadedFile("big.py", b"#" * (settings.SYMPHONY_MAX_PROGRAM_BYTES + 1))
    response = Client().post("/admin/login/", {"username": "x", "password": "y", "file": big})
    assert response.status_code == 400

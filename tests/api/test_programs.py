"""Program upload validation (py syntax + main, zip traversal/bomb/entry) and versioning."""

from __future__ import annotations

import io
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from api.models import Program
from api.services.programs import ProgramInvalid, validate_upload
from api.services.runs import create_run

GOOD = b"def main(args):\n    return {'ok': True}\n"


def _zip(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buf.getvalue()


def test_python_source_needs_valid_syntax_and_main():
    assert validate_upload("p.py", GOOD) == "py"
    with pytest.raises(ProgramInvalid, match="syntax"):
        validate_upload("p.py", b"def main(:\n")
    with pytest.raises(ProgramInvalid, match="main"):
        validate_upload("p.py", b"def other():\n    pass\n")
    with pytest.raises(ProgramInvalid, match=r"\.py"):
        validate_upload("p.txt", GOOD)


def test_zip_checks_traversal_bomb_and_entry(settings):
    assert validate_upload("p.zip", _zip({"__main__.py": GOOD, "lib/util.py": b"X = 1\n"})) == "zip"
    with pytest.raises(ProgramInvalid, match="unsafe path"):
        validate_upload("p.zip", _zip({"__main__.py": GOOD, "../evil.py": b"x"}))
    with pytest.raises(ProgramInvalid, match="no __main__"):
        validate_upload("p.zip", _zip({"other.py": GOOD}))
    with pytest.raises(ProgramInvalid, match="ratio"):
        validate_upload("p.zip", _zip({"__main__.py": GOOD, "zeros.bin": b"\0" * 2_000_000}))
    settings.SYMPHONY_MAX_PROGRAM_BYTES = 10
    with pytest.raises(ProgramInvalid, match="larger"):
        validate_upload("p.py", GOOD)


@pytest.mark.django_db
def test_upload_versions_and_source_over_http(api_tenant_a):
    client = api_tenant_a.key_client()
    response = client.post(
        "/api/v1/programs", {"name": "hello", "file": SimpleUploadedFile("hello.py", GOOD)}, format="multipart"
    )
    assert response.status_code == 201, response.content
    pid = response.json()["id"]
    bad = client.post(
        f"/api/v1/programs/{pid}/versions", {"file": SimpleUploadedFile("v.py", b"nope(")}, format="multipart"
    )
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_program"
    v2 = GOOD + b"# v2\n"
    assert (
        client.post(
            f"/api/v1/programs/{pid}/versions", {"file": SimpleUploadedFile("v.py", v2)}, format="multipart"
        ).json()["number"]
        == 2
    )
    assert [v["number"] for v in client.get(f"/api/v1/programs/{pid}/versions").json()] == [1, 2]
    assert client.get(f"/api/v1/programs/{pid}/versions/2/source").content == v2


@pytest.mark.django_db
def test_program_with_runs_cannot_be_deleted(api_tenant_a):
    client = api_tenant_a.key_client()
    pid = client.post(
        "/api/v1/programs", {"name": "x", "file": SimpleUploadedFile("x.py", GOOD)}, format="multipart"
    ).json()["id"]
    create_run(api_tenant_a.tenant, Program.objects.get(pk=pid), None, {}, {})
    response = client.delete(f"/api/v1/programs/{pid}")
    assert response.status_code == 409 and response.json()["error"]["code"] == "conflict"
    unused = client.post(
        "/api/v1/programs", {"name": "y", "file": SimpleUploadedFile("y.py", GOOD)}, format="multipart"
    ).json()["id"]
    assert client.delete(f"/api/v1/programs/{unused}").status_code == 204

"""Program upload validation (py syntax + main, zip traversal/bomb/entry) and versioning."""

from __future__ import annotations

import io
import zipfile

import pytest
import redis
from django.conf import settings
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from api.models import Program, Run
from api.services import billing
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


def test_uploading_the_latest_versions_bytes_again_makes_no_new_version(api_tenant_a):
    client = api_tenant_a.key_client()
    pid = client.post(
        "/api/v1/programs", {"name": "same", "file": SimpleUploadedFile("same.py", GOOD)}, format="multipart"
    ).json()["id"]

    def upload(content: bytes):
        return client.post(
            f"/api/v1/programs/{pid}/versions", {"file": SimpleUploadedFile("v.py", content)}, format="multipart"
        )

    again = upload(GOOD)
    assert again.status_code == 200 and again.json()["number"] == 1
    changed = upload(GOOD + b"# changed\n")
    assert changed.status_code == 201 and changed.json()["number"] == 2
    back = upload(GOOD)  # an older version's bytes become the newest version
    assert back.status_code == 201 and back.json()["number"] == 3
    assert [v["number"] for v in client.get(f"/api/v1/programs/{pid}/versions").json()] == [1, 2, 3]


@pytest.mark.django_db
def test_deleting_a_program_takes_its_finished_runs_and_waits_for_unfinished_ones(
    api_tenant_a, api_tenant_b, django_capture_on_commit_callbacks
):
    """A program with runs can be deleted once they are over (before, any run blocked it for
    good); their usage stays billed. While one is queued, running or still recording its usage
    the answer is 409 and nothing is deleted."""
    from api.models import UsageRecord
    from api.services.runs import RunOutcome, cancel_run, finish_run, publish_event, start_run
    from gpu_worker.contracts import TokenEvent

    client = api_tenant_a.key_client()
    pid = client.post(
        "/api/v1/programs", {"name": "x", "file": SimpleUploadedFile("x.py", GOOD)}, format="multipart"
    ).json()["id"]
    program = Program.objects.get(pk=pid)
    done, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(done.pk), "local")
    finish_run(str(done.pk), RunOutcome(status="succeeded", result=1, usage={"decode_tokens": 7}))
    running, _ = create_run(api_tenant_a.tenant, program, None, {}, {})
    start_run(str(running.pk), "local")

    refused = client.delete(f"/api/v1/programs/{pid}")
    assert refused.status_code == 409 and "1 run(s) not finished" in refused.json()["error"]["message"]
    cancel_run(running)  # cancelled, but its executor has not recorded its usage yet
    assert client.delete(f"/api/v1/programs/{pid}").status_code == 409
    assert Program.objects.filter(pk=pid).exists() and Run.objects.filter(pk=done.pk).exists()
    assert api_tenant_b.key_client().delete(f"/api/v1/programs/{pid}").status_code == 404

    finish_run(str(running.pk), RunOutcome(status="failed", error="cancelled", usage={"decode_tokens": 2}))
    publish_event(str(done.pk), TokenEvent("x"))
    with django_capture_on_commit_callbacks(execute=True):
        assert client.delete(f"/api/v1/programs/{pid}").status_code == 204
    assert not redis.Redis.from_url(settings.REDIS_URL).exists(f"run:{done.pk}")  # its event stream too
    assert not Program.objects.filter(pk=pid).exists()
    assert not Run.objects.filter(pk__in=[done.pk, running.pk]).exists()
    usage = UsageRecord.objects.filter(tenant=api_tenant_a.tenant)
    assert sorted(u.decode_tokens for u in usage) == [2, 7]  # still billed
    # ...and still counted as runs, apart from the storage meter's rows.
    UsageRecord.objects.create(tenant=api_tenant_a.tenant, kv_gib_hours=0.5)
    tenant, month = api_tenant_a.tenant, timezone.now().strftime("%Y-%m")
    assert billing.invoice(tenant, month)["runs"] == 2
    assert sum(day["runs"] for day in billing.usage_by_day(tenant)) == 2
    groups = {g["kind"]: g for g in billing.usage_by_group(tenant, "program")}
    assert set(groups) == {"deleted", "storage"}
    assert (groups["deleted"]["runs"], groups["deleted"]["decode_tokens"]) == (2, 9)
    assert (groups["storage"]["runs"], groups["storage"]["kv_gib_hours"]) == (0, 0.5)

"""Deployment files: docker-compose.yml, deploy/ (entrypoint, units, cloud-init), infra/terraform.

Fast structural tests of what the stack relies on, plus one test that runs the full offline
check (scripts/check_infra.sh: compose config, terraform fmt/validate, checkov). That script is
also `make check-infra`, a prerequisite of `make test`, so here it normally finds its stamp and
returns at once.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
import pytest
import redis
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
TF = ROOT / "infra" / "terraform"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


# --- entrypoint: URLs from parts ---------------------------------------------------------------------

NASTY = "p@ss:w/rd?#%&=+ x"


def test_entrypoint_builds_database_url_that_round_trips_any_password():
    ep = _load(DEPLOY / "entrypoint.py", "symphony_entrypoint")
    env = {
        "DATABASE_HOST": "db.internal",
        "DATABASE_PORT": "5432",
        "DATABASE_NAME": "symphony",
        "DATABASE_USER": "symphony",
        "DATABASE_PASSWORD": NASTY,
        "DATABASE_SSLMODE": "require",
    }
    url = ep.derive(env)["DATABASE_URL"]
    cfg = dj_database_url.parse(url)
    assert cfg["HOST"] == "db.internal" and cfg["PORT"] == 5432 and cfg["NAME"] == "symphony"
    assert cfg["USER"] == "symphony" and cfg["PASSWORD"] == NASTY
    assert cfg["OPTIONS"]["sslmode"] == "require"


def test_entrypoint_builds_tls_redis_urls_and_keeps_explicit_ones():
    ep = _load(DEPLOY / "entrypoint.py", "symphony_entrypoint")
    env = {
        "REDIS_HOST": "cache.internal",
        "REDIS_AUTH_TOKEN": NASTY,
        "REDIS_TLS": "1",
        "CELERY_BROKER_URL": "redis://x/9",
    }
    out = ep.derive(env)
    assert "CELERY_BROKER_URL" not in out  # an explicit setting wins
    kwargs = redis.connection.parse_url(out["REDIS_URL"])
    assert kwargs["host"] == "cache.internal" and kwargs["password"] == NASTY and kwargs["db"] == 0
    assert kwargs["connection_class"] is redis.SSLConnection
    assert urlsplit(out["CELERY_RESULT_BACKEND"]).path == "/2"
    assert "ssl_cert_reqs=required" in out["CELERY_RESULT_BACKEND"]


def test_entrypoint_without_parts_changes_nothing():
    ep = _load(DEPLOY / "entrypoint.py", "symphony_entrypoint")
    assert ep.derive({"DATABASE_URL": "postgres://a@b/c"}) == {}


# --- docker-compose.yml --------------------------------------------------------------------------------


def test_compose_has_the_stack(compose):
    services = compose["services"]
    for name in ("postgres", "redis", "migrate", "web", "celery-gpu0", "gpu0-cpu", "gpu0-cuda"):
        assert name in services, name
    assert "web.asgi:application" in services["web"]["command"]
    celery = services["celery-gpu0"]["command"]
    assert celery[celery.index("-Q") + 1].split(",")[-1] == "worker.gpu0"
    assert {"pgdata", "kvstore", "gpu0-run", "sessions"} <= set(compose["volumes"])


def test_compose_worker_variants_and_health(compose):
    services = compose["services"]
    for name in ("gpu0-cpu", "gpu0-cuda"):
        svc = services[name]
        assert svc["healthcheck"]["test"][1:4] == ["python", "-m", "gpu_worker"]
        assert "health" in svc["healthcheck"]["test"]
        assert svc["build"]["dockerfile"] == "deploy/Dockerfile.worker"
    assert services["gpu0-cpu"]["profiles"] == ["cpu"]
    assert services["gpu0-cuda"]["profiles"] == ["gpu"]
    devices = services["gpu0-cuda"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"] and devices[0]["device_ids"] == ["0"]
    assert "/api/v1/health" in (DEPLOY / "healthcheck.py").read_text()


def test_compose_scaleout_profile_adds_a_second_worker_on_the_same_store(compose):
    services = compose["services"]
    worker, celery = services["gpu1-cpu"], services["celery-gpu1"]
    assert worker["profiles"] == celery["profiles"] == ["scaleout"]
    assert worker["environment"]["SYMPHONY_WORKER_NAME"] == celery["environment"]["SYMPHONY_WORKER_NAME"] == "gpu1"
    assert "--name gpu1" in worker["command"][-1]
    assert celery["command"][celery["command"].index("-Q") + 1] == "worker.gpu1"  # not the shared queue
    # One store for both workers: the same volume and the same default path as gpu0's.
    assert worker["environment"]["SYMPHONY_KV_STORE"] == services["gpu0-cpu"]["environment"]["SYMPHONY_KV_STORE"]
    assert "kvstore:/var/lib/symphony/kv" in worker["volumes"]
    # Its own admin socket volume, shared only with its own executor.
    run_volume = "gpu1-run:/var/lib/symphony/run"
    assert run_volume in worker["volumes"] and run_volume in celery["volumes"]
    assert worker["environment"]["SYMPHONY_SESSIONS_DIR"].endswith("/sessions/gpu1")


def test_compose_celery_reaches_dockerd_and_shares_sockets_with_its_worker(compose):
    services = compose["services"]
    celery_vols = services["celery-gpu0"]["volumes"]
    assert "/var/run/docker.sock:/var/run/docker.sock" in celery_vols
    for vol in ("gpu0-run:", "sessions:"):
        assert any(v.startswith(vol) for v in celery_vols)
        assert any(v.startswith(vol) for v in services["gpu0-cpu"]["volumes"])
    # Session sockets sit at the same path on the host and in the containers (dockerd binds them).
    sessions = next(v for v in celery_vols if v.startswith("sessions:"))
    assert sessions.split(":", 1)[1] == compose["volumes"]["sessions"]["driver_opts"]["device"]


def test_every_required_compose_variable_is_in_env_example():
    text = (ROOT / "docker-compose.yml").read_text()
    required = set(re.findall(r"\$\{([A-Z0-9_]+):\?", text))
    example = {
        line.split("=", 1)[0]
        for line in (DEPLOY / "env.example").read_text().splitlines()
        if line and not line.startswith("#") and "=" in line
    }
    assert required and required <= example, required - example


MAIL_SETTINGS = ("SYMPHONY_EMAIL_URL", "SYMPHONY_EMAIL_FROM", "SYMPHONY_PUBLIC_URL")


def test_mail_settings_reach_every_compose_app_container_and_env_example(compose):
    app_env = compose["x-app-env"]
    example = (DEPLOY / "env.example").read_text()
    for name in MAIL_SETTINGS:
        # Optional: the stack starts without them (an empty SYMPHONY_EMAIL_URL writes files).
        assert app_env[name].startswith(f"${{{name}:-"), app_env[name]
        assert re.search(rf"^{name}=", example, re.M), f"{name} missing from deploy/env.example"
        for service in ("migrate", "web", "celery-gpu0", "gpu0-cpu", "gpu0-cuda"):
            assert name in compose["services"][service]["environment"], (service, name)
    # Django reads a variable set to "" as "": From and the link base need real defaults.
    for name in ("SYMPHONY_EMAIL_FROM", "SYMPHONY_PUBLIC_URL"):
        assert not app_env[name].endswith(":-}"), app_env[name]
    # The file backend needs somewhere writable under the read-only root: the sender has it.
    assert "mail:/app/var/mail" in compose["services"]["celery-gpu0"]["volumes"]
    assert "/app/var/mail" in (DEPLOY / "Dockerfile.web").read_text()


def test_mail_settings_reach_the_ecs_tasks_through_terraform():
    ecs = (TF / "ecs.tf").read_text()
    mail = (TF / "mail.tf").read_text()
    assert re.search(r'SYMPHONY_PUBLIC_URL\s*=\s*"https://\$\{var\.domain_name\}"', ecs)
    assert re.search(r"SYMPHONY_EMAIL_FROM\s*=", ecs)
    # The SMTP URL is a KMS-encrypted secret, readable by the ECS execution role.
    assert re.search(r'name = "SYMPHONY_EMAIL_URL", valueFrom = aws_secretsmanager_secret_version\.email_url\.arn', ecs)
    assert "kms_key_id  = aws_kms_key.main.arn" in mail
    assert "aws_secretsmanager_secret.email_url.arn" in (TF / "iam.tf").read_text()
    url = re.search(r'secret_string = "(smtp\+tls://[^"]+)"', mail).group(1)
    assert "urlencode(aws_iam_access_key.ses_smtp.id)" in url
    assert "urlencode(aws_iam_access_key.ses_smtp.ses_smtp_password_v4)" in url and url.endswith(":587")
    # Only the sender (control-plane Celery) may open SMTP connections.
    sg = (TF / "security_groups.tf").read_text()
    smtp = re.findall(r'resource "aws_vpc_security_group_egress_rule" "(\w+)" \{[^}]*from_port\s*=\s*587[^}]*\}', sg)
    assert smtp == ["celery_smtp"] and "security_group_id = aws_security_group.celery.id" in sg


# --- host runtime: runsc, systemd, cloud-init -----------------------------------------------------------


@pytest.mark.parametrize("name", ["daemon.json", "daemon.gpu.json"])
def test_daemon_json_registers_runsc(name):
    runtimes = json.loads((DEPLOY / "docker" / name).read_text())["runtimes"]
    assert runtimes["runsc"]["runtimeArgs"] == ["--network=none", "--host-uds=open"]


def test_systemd_units_run_one_worker_and_one_queue_per_gpu():
    worker = (DEPLOY / "systemd" / "symphony-gpu-worker@.service").read_text()
    celery = (DEPLOY / "systemd" / "symphony-celery@.service").read_text()
    assert "--gpus device=%i" in worker and "python -m gpu_worker --name ${SYMPHONY_HOST_ID}-gpu%i" in worker
    assert "-Q worker.${SYMPHONY_HOST_ID}-gpu%i" in celery and "/var/run/docker.sock" in celery
    assert "BindsTo=symphony-gpu-worker@%i.service" in celery


def test_terraform_layout_and_hardening_markers():
    files = {p.name for p in TF.glob("*.tf")}
    for name in (
        "network.tf",
        "database.tf",
        "storage.tf",
        "ecs.tf",
        "gpu.tf",
        "iam.tf",
        "alb.tf",
        "security_groups.tf",
        "variables.tf",
        "outputs.tf",
        "versions.tf",
        "mail.tf",
    ):
        assert name in files, name
    assert (TF / "backend.tf.example").is_file()
    gpu = (TF / "gpu.tf").read_text()
    assert 'http_tokens                 = "required"' in gpu and "encrypted             = true" in gpu
    # Only the ALB accepts traffic from anywhere, and only on 443.
    sg = (TF / "security_groups.tf").read_text()
    open_rules = re.findall(r'resource "aws_vpc_security_group_ingress_rule" "(\w+)" \{[^}]*0\.0\.0\.0/0[^}]*\}', sg)
    assert open_rules == ["alb_https_v4"]
    # Every checkov skip carries a reason.
    for path in list(TF.glob("*.tf")) + list(DEPLOY.glob("Dockerfile.*")):
        for skip in re.findall(r"checkov:skip=(\S+)", path.read_text()):
            assert re.match(r"CKV2?_[A-Z]+_\d+:\S", skip), f"{path.name}: skip without reason: {skip}"


# --- the full offline check ----------------------------------------------------------------------------


def test_check_infra_script_passes():
    proc = subprocess.run(
        [str(ROOT / "scripts" / "check_infra.sh")], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "OK" in proc.stdout

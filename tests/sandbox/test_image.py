"""The sandbox image: content-hash tag, the protocol copied verbatim, a non-root user."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sandbox import image

ROOT = Path(__file__).resolve().parents[2]


def test_tag_is_stable_and_follows_the_sdk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tag = image.image_tag()
    assert tag == image.image_tag()
    assert tag.startswith("symphony-sandbox:")
    sdk = tmp_path / "symphony"
    shutil.copytree(image.SDK_DIR, sdk, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(image, "SDK_DIR", sdk)
    assert image.image_tag() == tag
    (sdk / "api.py").write_text((sdk / "api.py").read_text() + "\n# changed\n")
    assert image.image_tag() != tag


def test_protocol_is_copied_not_duplicated() -> None:
    files = image.sdk_files()
    assert files[f"{image.SDK_TARGET}/_protocol.py"] == (ROOT / "gpu_worker" / "protocol.py").read_bytes()
    # The checkout itself holds no copy that could drift.
    assert not (image.SDK_DIR / "_protocol.py").exists()


def test_mirror_comes_from_apt_sources() -> None:
    assert image.debian_mirror().startswith("http")


@pytest.mark.integration
@pytest.mark.docker
def test_image_runs_python_as_non_root_with_the_sdk(docker_client, sandbox_image: str) -> None:
    script = (
        "import os, symphony, symphony._protocol as p, msgpack;"
        "print(os.getuid(), p.PROTOCOL_VERSION, symphony.__file__)"
    )
    out = docker_client.containers.run(
        sandbox_image,
        ["python3", "-I", "-c", script],
        runtime="runsc",
        network_mode="none",
        remove=True,
        user=f"{image.LIP_UID}:{image.LIP_UID}",
    )
    uid, version, path = out.decode().split()
    assert uid == str(image.LIP_UID)
    assert version == "1"
    assert path.startswith("/usr/lib/python3/dist-packages/symphony/")


@pytest.mark.integration
@pytest.mark.docker
def test_ensure_is_a_no_op_when_the_tag_exists(sandbox_image: str) -> None:
    logs: list[str] = []
    assert image.ensure(log=logs.append) == sandbox_image
    assert logs == []

"""The sandbox image: content-hash tag, the protocol copied verbatim, a non-root user."""

from __future__ import annotations

import shutil
import sys
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


def test_sdk_bytecode_is_valid_for_its_source() -> None:
    """Each SDK module ships an unchecked hash-based pyc (PEP 552) of exactly its source, so a
    cold sandbox imports the SDK without compiling it."""
    import importlib.util
    import marshal

    if not image.ships_bytecode():
        pytest.skip(f"this Python ({sys.implementation.cache_tag}) cannot compile for the image's")
    files = image.sdk_files()
    sources = {name: data for name, data in files.items() if name.endswith(".py")}
    for name, data in sources.items():
        folder, _, file = name.rpartition("/")
        pyc = files[f"{folder}/__pycache__/{file[:-3]}.{image.IMAGE_PYTHON_CACHE_TAG}.pyc"]
        assert pyc[:4] == importlib.util.MAGIC_NUMBER
        assert int.from_bytes(pyc[4:8], "little") == 0b01  # hash-based, not checked
        assert pyc[8:16] == importlib.util.source_hash(data)
        assert marshal.loads(pyc[16:]).co_filename == f"/{name}"


def test_mirror_comes_from_apt_sources() -> None:
    assert image.debian_mirror().startswith("http")


@pytest.mark.integration
@pytest.mark.docker
def test_image_runs_python_as_non_root_with_the_sdk(docker_client, sandbox_image: str) -> None:
    script = (
        "import os, symphony, symphony._protocol as p, msgpack;"
        "print(os.getuid(), p.PROTOCOL_VERSION, symphony.__file__, os.path.exists(symphony.__cached__))"
    )
    out = docker_client.containers.run(
        sandbox_image,
        ["python3", "-I", "-c", script],
        runtime="runsc",
        network_mode="none",
        remove=True,
        user=f"{image.LIP_UID}:{image.LIP_UID}",
    )
    uid, version, path, cached = out.decode().split()
    assert uid == str(image.LIP_UID)
    assert version == "1"
    assert path.startswith("/usr/lib/python3/dist-packages/symphony/")
    assert cached == str(image.ships_bytecode())  # precompiled: a cold start compiles nothing


@pytest.mark.integration
@pytest.mark.docker
def test_ensure_is_a_no_op_when_the_tag_exists(sandbox_image: str) -> None:
    logs: list[str] = []
    assert image.ensure(log=logs.append) == sandbox_image
    assert logs == []

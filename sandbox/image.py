"""Build the sandbox image: a Debian minbase rootfs with python3 + msgpack + the SDK.

``python -m sandbox.image ensure`` is idempotent: the image tag is a hash of the build recipe,
the SDK sources and ``gpu_worker/protocol.py``, so an unchanged tree is a no-op (one docker
API call) and any SDK change produces a new tag. The slow part, ``debootstrap``, depends only
on the recipe; its tarball is cached under ``var/sandbox/`` so SDK edits rebuild in seconds.
No registry is involved: the tarball is loaded with ``docker import``.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import importlib.util
import io
import json
import marshal
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SDK_DIR = Path(__file__).resolve().parent / "symphony"
PROTOCOL_SOURCE = ROOT / "gpu_worker" / "protocol.py"
CACHE_DIR = ROOT / "var" / "sandbox"
REPOSITORY = "symphony-sandbox"
#: Where the SDK lands inside the rootfs (Debian's python3 searches it by default).
SDK_TARGET = "usr/lib/python3/dist-packages/symphony"
#: Unprivileged user the LIP runs as (also passed as ``user=`` by the launcher).
LIP_UID = 10001
LIP_USER = "lip"
DEFAULT_MIRROR = "http://deb.debian.org/debian"


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the base rootfs; its hash names the cached tarball."""

    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = ("python3-minimal", "python3-msgpack")
    uid: int = LIP_UID
    user: str = LIP_USER
    #: Trimmed after debootstrap: never needed at run time, ~60% of the rootfs.
    prune: tuple[str, ...] = (
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
        "var/cache/apt",
        "var/lib/apt/lists",
        "var/cache/debconf",
        "var/log",
    )
    version: int = 1
    changes: tuple[str, ...] = field(
        default=(f"USER {LIP_UID}:{LIP_UID}", "WORKDIR /tmp", "ENV HOME=/tmp", 'CMD ["/usr/bin/python3"]')
    )

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()


RECIPE = Recipe()
#: ``sys.implementation.cache_tag`` of the recipe's python3 (bookworm ships 3.11): the SDK's
#: bytecode is precompiled only by a host Python with the same tag.
IMAGE_PYTHON_CACHE_TAG = "cpython-311"


def sdk_sources() -> dict[str, bytes]:
    """The SDK's source files in the image, keyed by their path inside it.

    ``gpu_worker/protocol.py`` is copied as ``symphony/_protocol.py``: the protocol has one
    source of truth and the SDK imports the copy only inside the image.
    """
    files: dict[str, bytes] = {}
    for path in sorted(SDK_DIR.rglob("*.py")):
        rel = path.relative_to(SDK_DIR).as_posix()
        if rel == "_protocol.py" or "__pycache__" in rel:
            continue
        files[f"{SDK_TARGET}/{rel}"] = path.read_bytes()
    files[f"{SDK_TARGET}/_protocol.py"] = PROTOCOL_SOURCE.read_bytes()
    return files


def sdk_files() -> dict[str, bytes]:
    """Files added on top of the base rootfs: the SDK's sources and, where this host can
    compile them for the image's Python, their bytecode."""
    sources = sdk_sources()
    return {**sources, **(_bytecode(sources) if ships_bytecode() else {})}


def ships_bytecode() -> bool:
    return sys.implementation.cache_tag == IMAGE_PYTHON_CACHE_TAG


def _bytecode(sources: dict[str, bytes]) -> dict[str, bytes]:
    """``__pycache__`` files for the SDK, so a cold sandbox does not compile it on every start
    (~100 ms of a gVisor cold start: the rootfs is read-only, nothing is ever cached there).

    Compiled here, by the host's Python, only when its bytecode is the image's (same minor
    version: bytecode is stable within one, see :func:`ships_bytecode`); otherwise the image
    ships sources alone. Unchecked hash-based pycs (PEP 552): valid whatever the files' mtimes,
    and the image never changes under them.
    """
    out: dict[str, bytes] = {}
    for name, data in sources.items():
        folder, _, file = name.rpartition("/")
        code = compile(data, f"/{name}", "exec", dont_inherit=True, optimize=0)
        source_hash = importlib.util.source_hash(data)
        flags = (0b01).to_bytes(4, "little")  # hash-based, unchecked (PEP 552)
        pyc = importlib.util.MAGIC_NUMBER + flags + source_hash + marshal.dumps(code)
        out[f"{folder}/__pycache__/{file[:-3]}.{IMAGE_PYTHON_CACHE_TAG}.pyc"] = pyc
    return out


def image_tag(recipe: Recipe = RECIPE) -> str:
    """``symphony-sandbox:<hash>`` of recipe + SDK + protocol (what the launcher runs)."""
    h = hashlib.sha256(recipe.digest().encode())
    for name, data in sdk_sources().items():
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    # The bytecode follows from the sources: hashing whether it ships is enough, and compiling
    # here would cost every launch (the launcher asks for the tag per run) tens of ms.
    if ships_bytecode():
        h.update(b"bytecode:" + IMAGE_PYTHON_CACHE_TAG.encode())
    return f"{REPOSITORY}:{h.hexdigest()[:16]}"


def debian_mirror() -> str:
    """The apt mirror this machine uses (the only Debian source reachable here)."""
    env = os.environ.get("SYMPHONY_DEBIAN_MIRROR")
    if env:
        return env
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for src in sources:
        try:
            text = src.read_text()
        except OSError:
            continue
        for m in re.finditer(r"(?:URIs:|^deb(?:\s+\[[^\]]*\])?)\s+(\S+)", text, re.MULTILINE):
            uri = m.group(1).rstrip("/")
            if not uri.endswith("-security") and uri.startswith(("http://", "https://")):
                return uri
    return DEFAULT_MIRROR


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One builder at a time (parallel test processes may all call ensure)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def base_tarball(recipe: Recipe = RECIPE, log=print) -> Path:
    """The cached base rootfs tarball, built with debootstrap if missing."""
    out = CACHE_DIR / f"base-{recipe.digest()[:16]}.tar"
    if out.exists():
        return out
    if shutil.which("debootstrap") is None:
        raise RuntimeError("debootstrap is not installed (scripts/bootstrap.sh system installs it)")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rootfs-", dir=CACHE_DIR) as tmp:
        rootfs = Path(tmp) / "rootfs"
        mirror = debian_mirror()
        log(f"sandbox.image: debootstrap {recipe.variant} {recipe.suite} from {mirror}")
        t0 = time.monotonic()
        subprocess.run(
            [
                "debootstrap",
                f"--variant={recipe.variant}",
                f"--include={','.join(recipe.packages)}",
                recipe.suite,
                str(rootfs),
                mirror,
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for rel in recipe.prune:
            target = rootfs / rel
            if target.is_dir():
                shutil.rmtree(target)
                target.mkdir(mode=0o755)
        with open(rootfs / "etc/passwd", "a") as fh:
            fh.write(f"{recipe.user}:x:{recipe.uid}:{recipe.uid}:LIP:/tmp:/usr/sbin/nologin\n")
        with open(rootfs / "etc/group", "a") as fh:
            fh.write(f"{recipe.user}:x:{recipe.uid}:\n")
        partial = out.with_suffix(".tar.partial")
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."], check=True)
        partial.rename(out)
        log(f"sandbox.image: base rootfs {out.stat().st_size >> 20} MiB in {time.monotonic() - t0:.0f}s")
    return out


def _add(tar: tarfile.TarFile, name: str, data: bytes | None, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    if data is None:
        info.type = tarfile.DIRTYPE
        info.mode = mode
        tar.addfile(info)
    else:
        info.size = len(data)
        info.mode = mode
        tar.addfile(info, io.BytesIO(data))


def build_rootfs_tar(dest: Path, recipe: Recipe = RECIPE, log=print) -> None:
    """Base tarball + SDK + mount points, written to ``dest``."""
    shutil.copyfile(base_tarball(recipe, log), dest)
    with tarfile.open(dest, "a") as tar:
        files = sdk_files()
        for folder in sorted({SDK_TARGET} | {name.rpartition("/")[0] for name in files}):
            _add(tar, folder, None, 0o755)
        for name, data in files.items():
            _add(tar, name, data, 0o644)
        # Mount points for the launcher: the LIP dir and the session socket.
        _add(tar, "lip", None, 0o755)
        _add(tar, "run/symphony", None, 0o755)
        _add(tar, "run/symphony/session.sock", b"", 0o644)


def _docker():
    import docker

    try:
        client = docker.from_env(timeout=300)
        client.ping()
    except Exception as exc:
        raise RuntimeError(f"dockerd is not reachable ({exc}); run `make bootstrap`") from exc
    return client


def image_exists(client, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        return False
    return True


def ensure(log=print) -> str:
    """Build and ``docker import`` the image unless its tag already exists; returns the tag."""
    tag = image_tag()
    client = _docker()
    if image_exists(client, tag):
        return tag
    with _locked(CACHE_DIR / ".lock"):
        if image_exists(client, tag):
            return tag
        t0 = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="image-", dir=CACHE_DIR) as tmp:
            tar_path = Path(tmp) / "rootfs.tar"
            build_rootfs_tar(tar_path, log=log)
            repo, _, version = tag.partition(":")
            client.api.import_image_from_file(str(tar_path), repository=repo, tag=version, changes=list(RECIPE.changes))
        client.images.get(tag).tag(REPOSITORY, "latest")
        log(f"sandbox.image: imported {tag} in {time.monotonic() - t0:.1f}s")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.image", description=__doc__)
    parser.add_argument("command", choices=["ensure", "tag"])
    args = parser.parse_args(argv)
    if args.command == "tag":
        print(image_tag())
        return 0
    print(ensure(log=lambda m: print(m, file=sys.stderr)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

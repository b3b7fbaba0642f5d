"""Program upload validation and versioning. Uploads are checked before storage: size limit,
Python syntax with a top-level ``def main``, and for zips no path traversal, no zip bomb, and a
``__main__.py`` or ``main.py`` entry module."""

from __future__ import annotations

import ast
import hashlib
import io
import zipfile

from django.conf import settings
from django.db import transaction

from api.models import Program, ProgramVersion, Run
from api.services.quotas import plan_limits
from api.services.runs import RunConflict, delete_runs, unsettled

MAX_ZIP_RATIO = 100
MAX_ZIP_TOTAL = 16 * 1024 * 1024
ENTRY_MODULES = ("__main__.py", "main.py")


class ProgramInvalid(ValueError):
    """The upload is not a runnable program; the message says why."""


@transaction.atomic
def delete_program(program: Program) -> int:
    """Delete a program, its versions and its finished runs (their usage stays billed);
    returns how many runs went with it. Refused (RunConflict, 409) while any of its runs is
    queued, running or still recording its usage: cancel them, or wait for them to end."""
    program = Program.objects.select_for_update().select_related("tenant").get(pk=program.pk)
    runs = Run.objects.filter(program_version__program=program)
    busy = unsettled(runs, plan_limits(program.tenant).max_run_seconds).count()
    if busy:
        raise RunConflict(
            f"program {program.name!r} has {busy} run(s) not finished yet: cancel them or wait for them to end"
        )
    deleted = delete_runs(runs)
    program.delete()
    return deleted


def _check_python(source: bytes, name: str, need_main: bool) -> None:
    try:
        tree = ast.parse(source, filename=name)
    except (SyntaxError, ValueError) as exc:
        raise ProgramInvalid(f"{name}: syntax error: {exc}") from exc
    if need_main and not any(
        isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "main" for n in tree.body
    ):
        raise ProgramInvalid(f"{name}: no top-level `def main`")


def _check_zip(content: bytes) -> None:
    try:
        archive = zipfile.ZipFile(io.BytesIO(content))
    except zipfile.BadZipFile as exc:
        raise ProgramInvalid("not a valid zip archive") from exc
    total = 0
    names = set()
    for info in archive.infolist():
        parts = info.filename.replace("\\", "/").split("/")
        if info.filename.startswith(("/", "\\")) or ".." in parts or ":" in parts[0]:
            raise ProgramInvalid(f"unsafe path in archive: {info.filename!r}")
        total += info.file_size
        if info.compress_size and info.file_size / info.compress_size > MAX_ZIP_RATIO:
            raise ProgramInvalid(f"compression ratio too high for {info.filename!r}")
        if total > MAX_ZIP_TOTAL:
            raise ProgramInvalid(f"archive expands beyond {MAX_ZIP_TOTAL} bytes")
        names.add(info.filename)
    entry = next((n for n in ENTRY_MODULES if n in names), None)
    if entry is None:
        raise ProgramInvalid("archive has no __main__.py or main.py")
    _check_python(archive.read(entry), entry, need_main=True)


def validate_upload(filename: str, content: bytes) -> str:
    """Return the program kind ("py" or "zip") or raise ProgramInvalid."""
    if len(content) > settings.SYMPHONY_MAX_PROGRAM_BYTES:
        raise ProgramInvalid(f"file larger than {settings.SYMPHONY_MAX_PROGRAM_BYTES} bytes")
    if filename.endswith(".zip"):
        _check_zip(content)
        return "zip"
    if filename.endswith(".py"):
        _check_python(content, filename, need_main=True)
        return "py"
    raise ProgramInvalid("file must be a .py source or a .zip archive")


@transaction.atomic
def add_version(program: Program, filename: str, content: bytes) -> ProgramVersion:
    """Validate and append the next version (numbers start at 1, never reused)."""
    kind = validate_upload(filename, content)
    Program.objects.select_for_update().get(pk=program.pk)
    last = program.versions.order_by("-number").values_list("number", flat=True).first() or 0
    return ProgramVersion.objects.create(
        program=program,
        number=last + 1,
        kind=kind,
        content=content,
        sha256=hashlib.sha256(content).hexdigest(),
        size=len(content),
    )

"""Program upload validation and versioning. Uploads are checked before storage: size limit,
Python that compiles with a top-level ``def main``, and for zips no path traversal, no zip bomb,
every member readable (CRC, no encryption, a compression method Python reads) and a
``__main__.py`` or ``main.py`` entry module. Whatever the upload holds, a failure here is a
ProgramInvalid naming the problem (400), never an exception escaping as a 500."""

from __future__ import annotations

import ast
import hashlib
import io
import json
import lzma
import zipfile
import zlib

from django.conf import settings
from django.db import transaction

from api.models import Program, ProgramVersion, Run
from api.services.quotas import plan_limits
from api.services.runs import RunConflict, delete_runs, unsettled

MAX_ZIP_RATIO = 100
MAX_ZIP_TOTAL = 16 * 1024 * 1024
ENTRY_MODULES = ("__main__.py", "main.py")
#: What reading a zip member raises for a damaged or unsupported one: bad CRC or truncated data
#: (BadZipFile, EOFError, zlib/lzma/bz2 errors), encryption (RuntimeError), an unknown
#: compression method (NotImplementedError).
_MEMBER_ERRORS = (zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError, OSError, RuntimeError, NotImplementedError)
_READ_CHUNK = 1 << 20


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
    """Parse and compile ``source`` as the sandbox will. Deeply nested expressions make the
    parser or compiler give up with RecursionError or MemoryError (``-`` repeated 100,000
    times, ``a[0][0]...``); those are the program's problem, reported as such."""
    try:
        tree = ast.parse(source, filename=name)
        compile(tree, name, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        raise ProgramInvalid(f"{name}: syntax error: {exc}") from None
    except (RecursionError, MemoryError):
        raise ProgramInvalid(f"{name}: too deeply nested or complex for Python to compile") from None
    if need_main and not any(
        isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == "main" for n in tree.body
    ):
        raise ProgramInvalid(f"{name}: no top-level `def main`")


def _check_zip(content: bytes) -> None:
    try:
        archive = zipfile.ZipFile(io.BytesIO(content))
    except (*_MEMBER_ERRORS, ValueError) as exc:
        raise ProgramInvalid(f"not a valid zip archive: {exc}") from None
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
    sources = {info.filename: _read_member(archive, info, keep=info.filename == entry) for info in archive.infolist()}
    _check_python(sources[entry], entry, need_main=True)


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, keep: bool) -> bytes:
    """A member read to its end, so its CRC is checked (its size was bounded before); its bytes
    when ``keep``, else nothing."""
    chunks = []
    try:
        with archive.open(info) as member:
            while chunk := member.read(_READ_CHUNK):
                if keep:
                    chunks.append(chunk)
    except _MEMBER_ERRORS as exc:
        raise ProgramInvalid(f"cannot read {info.filename!r} from the archive: {exc}") from None
    return b"".join(chunks)


#: The line of a LIP's module docstring that declares arguments to try it with, e.g.
#: ``Example args: {"prompt": "Once upon a time", "max_tokens": 24}`` (one JSON object, one line).
EXAMPLE_ARGS_PREFIX = "example args:"


def declared_example_args(source: bytes) -> dict | None:
    """The JSON object of the source's ``Example args:`` docstring line, if it declares one that
    parses; anything else (no docstring, bad JSON, not an object, not Python) is ``None``."""
    try:
        docstring = ast.get_docstring(ast.parse(source)) or ""
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for line in docstring.splitlines():
        stripped = line.strip()
        if stripped.lower().startswith(EXAMPLE_ARGS_PREFIX):
            try:
                value = json.loads(stripped[len(EXAMPLE_ARGS_PREFIX) :].strip().strip("`"))
            except (ValueError, RecursionError):
                return None
            return value if isinstance(value, dict) else None
    return None


def declared_description(source: bytes) -> str:
    """The first paragraph of the source's module docstring on one line (``""`` without one,
    or for a file that is not Python)."""
    try:
        docstring = ast.get_docstring(ast.parse(source)) or ""
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ""
    first = docstring.strip().split("\n\n", 1)[0]
    return " ".join(first.replace("\x00", "").split())


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


@transaction.atomic
def add_version_if_changed(program: Program, filename: str, content: bytes) -> tuple[ProgramVersion, bool]:
    """The program's latest version when ``content`` is byte for byte that version (re-uploading
    the same file is a no-op, not a new number), else a new version; and whether it is new.
    Only the latest is compared: uploading an older version's bytes again makes them the newest."""
    Program.objects.select_for_update().get(pk=program.pk)
    latest = program.versions.order_by("-number").first()
    if latest is not None and latest.sha256 == hashlib.sha256(content).hexdigest() and bytes(latest.content) == content:
        return latest, False
    return add_version(program, filename, content), True

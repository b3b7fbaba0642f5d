"""Staging: a run's program and args copied where its sandbox reads them (``/lip``), the same
for a fresh cold-path dir and a warm pool slot's ``lip/`` dir."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

from sandbox.spec import SandboxSpec


def stage_program(spec: SandboxSpec, lip: Path) -> str:
    """Copy the program and write args into ``lip`` (read-only for the sandbox); returns the
    program's file name there (``program.py`` or ``program.zip``)."""
    src = Path(spec.program_path)
    if not src.is_file():
        raise FileNotFoundError(f"program {src} does not exist")
    name = "program.zip" if zipfile.is_zipfile(src) else "program.py"
    shutil.copyfile(src, lip / name)
    (lip / "args.json").write_text(json.dumps(spec.args if spec.args is not None else {}))
    staged = [lip / name, lip / "args.json"]
    if spec.entry:  # a spawned run: what it executes of the bundle ("module:function")
        (lip / "entry.json").write_text(json.dumps(spec.entry))
        staged.append(lip / "entry.json")
    for f in staged:
        f.chmod(0o444)
    return name

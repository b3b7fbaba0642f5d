"""Every repository path the documentation names exists, so a newcomer following
docs/ARCHITECTURE.md (or any README) to a file finds it there.

A path is a backticked token whose first component is a top-level entry of the repository
(``gpu_worker/ops/pred.py``, ``api/services/``); docs/SECURITY.md's test tables name tests
relative to ``tests/``. Paths created at run time (``var/``, ``bench/out/``, the built ``frontend/dist``) are not
checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted({ROOT / "README.md", ROOT / "CONTRIBUTING.md", *ROOT.glob("docs/*.md"), *ROOT.glob("*/README.md")})
#: Made when the stack, a build or a benchmark runs, not in a checkout.
RUNTIME = ("var/", "bench/out/", "frontend/dist")
TOKEN = re.compile(r"`([A-Za-z0-9_.*/-]+)`")


def _paths(text: str) -> set[str]:
    found = set()
    for token in TOKEN.findall(text):
        path = token.split("::")[0].rstrip("/")
        if "/" not in path or path.startswith(("/", ".", "-")) or "//" in path:
            continue
        if (ROOT / path.split("/")[0]).exists() and not token.startswith(RUNTIME):
            found.add(path)
    return found


def _exists(path: str) -> bool:
    return any((base / path).exists() or any(base.glob(path)) for base in (ROOT, ROOT / "tests"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_exists(doc: Path) -> None:
    missing = sorted(p for p in _paths(doc.read_text()) if not _exists(p))
    assert not missing, f"{doc.relative_to(ROOT)} names paths that are not in the repository: {missing}"


def test_the_check_sees_paths() -> None:
    """The pattern finds the kind of reference it guards (so the test above cannot pass vacuously)."""
    assert {"gpu_worker/ops", "api/services/runs.py"} <= _paths("see `gpu_worker/ops/` and `api/services/runs.py`")
    assert not _exists("gpu_worker/no_such_module.py")


def test_nothing_cites_issue_numbers() -> None:
    """The repository is its own truth: code and docs explain themselves rather than point at an
    issue tracker the reader may not have (an issue's number, with or without a hash)."""
    import subprocess

    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    cite = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    found = []
    for name in files:
        if not name.endswith((".py", ".md", ".ts", ".tsx", ".yml", ".toml", ".tf", ".sh")):
            continue
        path = ROOT / name
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if cite.search(line):
                found.append(f"{name}:{number}: {line.strip()[:100]}")
    assert not found, "issue numbers cited:\n" + "\n".join(found)

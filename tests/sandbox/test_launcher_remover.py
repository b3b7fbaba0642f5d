"""The cold launcher's background removal (no docker needed: a stand-in container records it)."""

from __future__ import annotations

import threading
import time

from sandbox import cold
from sandbox.cold import SandboxLauncher


class RecordingContainer:
    def __init__(self, name: str) -> None:
        self.name = name
        self.removed = threading.Event()

    def remove(self, force: bool = False) -> None:
        assert force
        self.removed.set()


def test_containers_are_removed_and_the_remover_thread_ends_when_idle(monkeypatch) -> None:
    """The Celery executor makes a launcher per run: its remover thread must not outlive the
    work, and a container queued after it ended starts a new one."""
    monkeypatch.setattr(cold, "REMOVER_IDLE_S", 0.05)
    launcher = SandboxLauncher(client=object())
    first = [RecordingContainer(f"symphony-lip-{i}") for i in range(3)]
    for c in first:
        launcher._remove_later(c)
    assert all(c.removed.wait(5) for c in first)
    until = time.monotonic() + 5
    while launcher._remover is not None and time.monotonic() < until:
        time.sleep(0.01)
    assert launcher._remover is None, "the remover thread outlived its work"
    again = RecordingContainer("symphony-lip-again")
    launcher._remove_later(again)
    assert again.removed.wait(5)

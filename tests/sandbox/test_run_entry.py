"""``sandbox.run(spec)``: the one entry point tries the warm pool, then the cold path (no docker
needed: the two paths are stand-ins that record what they were asked)."""

from __future__ import annotations

from typing import Any

import pytest

import sandbox
from sandbox import cold, pool
from sandbox.spec import SandboxResult, SandboxSpec

SPEC = SandboxSpec("p.py", {}, "/nonexistent.sock", "token", "run-1", "tenant", image="symphony-sandbox:test")


class StandInPool:
    def __init__(self, answer: SandboxResult | None) -> None:
        self.answer = answer
        self.asked: list[SandboxSpec] = []

    def run(self, spec: SandboxSpec) -> SandboxResult | None:
        self.asked.append(spec)
        return self.answer


@pytest.fixture
def cold_runs(monkeypatch) -> list[SandboxSpec]:
    runs: list[SandboxSpec] = []

    class StandInLauncher:
        def run(self, spec: SandboxSpec) -> SandboxResult:
            runs.append(spec)
            return SandboxResult(status="succeeded", container="cold")

    monkeypatch.setattr(cold, "SandboxLauncher", StandInLauncher)
    return runs


def _with_pool(monkeypatch, the_pool: Any) -> list[str | None]:
    images: list[str | None] = []

    def shared_pool(image: str | None = None) -> Any:
        images.append(image)
        return the_pool

    monkeypatch.setattr(pool, "shared_pool", shared_pool)
    return images


def test_without_a_pool_the_run_is_cold(monkeypatch, cold_runs) -> None:
    images = _with_pool(monkeypatch, None)
    assert sandbox.run(SPEC).container == "cold"
    assert cold_runs == [SPEC]
    assert images == [SPEC.image], "the pool is asked for the spec's image"


def test_a_warm_slot_serves_the_run_and_the_cold_path_is_not_taken(monkeypatch, cold_runs) -> None:
    warm = StandInPool(SandboxResult(status="succeeded", container="warm"))
    _with_pool(monkeypatch, warm)
    assert sandbox.run(SPEC).container == "warm"
    assert warm.asked == [SPEC] and cold_runs == []


def test_a_run_the_pool_declines_takes_the_cold_path(monkeypatch, cold_runs) -> None:
    declining = StandInPool(None)
    _with_pool(monkeypatch, declining)
    assert sandbox.run(SPEC).container == "cold"
    assert declining.asked == [SPEC] and cold_runs == [SPEC]

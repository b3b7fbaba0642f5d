"""The reaper against containers that vanish while it walks them (no docker needed: stand-in
containers). A launcher removes its container when a run ends, so any reaper pass may list a
container that is gone by the time it is inspected; that must skip it, not fail the whole pass."""

from __future__ import annotations

import time

import docker.errors

from sandbox.reaper import reap
from sandbox.spec import LABEL, LABEL_EXPIRES


class StandInContainer:
    def __init__(self, name: str, expires: float, vanishes: bool = False) -> None:
        self.name = name
        self.labels = {LABEL: "1", LABEL_EXPIRES: str(expires)}
        self.status = "running"
        self.attrs: dict = {}
        self.vanishes = vanishes
        self.removed = False

    def reload(self) -> None:
        if self.vanishes:
            raise docker.errors.NotFound(f"No such container: {self.name}")

    def remove(self, force: bool = False) -> None:
        self.removed = True


class StandInContainers:
    def __init__(self, containers: list[StandInContainer]) -> None:
        self._containers = containers
        self.list_kwargs: dict = {}

    def list(self, **kwargs) -> list[StandInContainer]:
        self.list_kwargs = kwargs
        return list(self._containers)


class StandInClient:
    def __init__(self, containers: list[StandInContainer]) -> None:
        self.containers = StandInContainers(containers)


def test_a_container_removed_between_listing_and_inspection_is_skipped() -> None:
    past = time.time() - 60
    gone = StandInContainer("symphony-lip-gone", expires=past, vanishes=True)
    expired = StandInContainer("symphony-lip-expired", expires=past)
    live = StandInContainer("symphony-lip-live", expires=time.time() + 600)
    client = StandInClient([gone, expired, live])

    removed = reap(client)

    assert removed == ["symphony-lip-expired"]
    assert expired.removed and not live.removed and not gone.removed
    assert client.containers.list_kwargs["sparse"] is True, "a full listing inspects, and fails, on its own"

"""Host side of the LIP sandbox. Nothing here imports Django or the worker's engine; the SDK
that runs *inside* the sandbox is the ``symphony`` package next to this file.

- :func:`run`: the one entry point: a run goes to a warm slot when the pool has one that fits,
  else to a fresh container;
- :mod:`sandbox.spec`: what a run is (spec, limits, result) and the labels and in-sandbox paths;
- :mod:`sandbox.cold`: the cold path, one fresh gVisor container per run;
- :mod:`sandbox.pool`: the warm pool of pre-started containers;
- :mod:`sandbox.containers`: the docker side both paths share (isolation config, attach, wait);
- :mod:`sandbox.staging`, :mod:`sandbox.output`, :mod:`sandbox.outcome`: program staging,
  output capture, and the classification of a finished run;
- :mod:`sandbox.reaper`: removes containers nobody will remove;
- :mod:`sandbox.image`: builds the sandbox image.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandbox.spec import SandboxResult, SandboxSpec


def run(spec: SandboxSpec) -> SandboxResult:
    """Run ``spec`` to its end: in a warm slot of this process's pool (``SYMPHONY_SANDBOX_POOL_SIZE``
    > 0) when one enforces exactly its limits, otherwise, or when the pool declines the run, in a
    fresh container. Raises :class:`~sandbox.spec.SandboxUnavailable` when dockerd, runsc or the
    image is missing.

    The paths are imported here, not at the top: importing any ``sandbox`` module (the image
    builder, the spec) must not load the docker machinery."""
    from sandbox.cold import SandboxLauncher
    from sandbox.pool import shared_pool

    pool = shared_pool(spec.image)
    return (pool.run(spec) if pool is not None else None) or SandboxLauncher().run(spec)

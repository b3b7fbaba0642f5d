"""The wire protocol, from its single source of truth.

Inside the sandbox image the build copies ``gpu_worker/protocol.py`` to ``symphony/_protocol.py``
(the image has no ``gpu_worker``). On a host checkout (tests, benchmarks) the SDK imports the
worker's module directly. Either way there is exactly one definition of the framing and codes.
"""

from __future__ import annotations

try:  # inside the sandbox image
    from symphony import _protocol as protocol  # type: ignore[attr-defined]
except ImportError:  # host checkout: the worker package is importable
    from gpu_worker import protocol

__all__ = ["protocol"]

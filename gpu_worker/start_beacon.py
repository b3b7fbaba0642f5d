"""The worker says it is starting until it answers (contracts: ``starting_key``).

A worker process takes seconds to load the model and, the first time on a machine, minutes to
compile it. Until its admin socket exists an executor cannot tell a worker that is coming from
one that died, and failed runs over to other workers (or failed them, with none) within a few
seconds: every request sent during a fresh ``make up`` got a 500. The beacon SETs the key from
a thread of its own, since the event loop's thread is free but the engine's build holds the
GIL in long stretches; the key expires by itself if the process dies while starting.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from gpu_worker import contracts

log = logging.getLogger(__name__)


class StartBeacon:
    """Keeps ``symphony:worker-starting:<name>`` set while the worker starts; :meth:`ready`
    deletes it. A Redis that cannot be reached only costs the wait the key would have given."""

    def __init__(self, redis_url: str, name: str) -> None:
        self._url = redis_url
        self._key = contracts.starting_key(name)
        self._since = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="start-beacon", daemon=True)
        self._client: Any = None

    def start(self) -> StartBeacon:
        self._thread.start()
        return self

    def ready(self) -> None:
        """The worker answers on its admin socket now: stop saying it is starting."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self._connect().delete(self._key)
        except Exception as exc:  # it expires after HEARTBEAT_TTL_S anyway
            log.warning("event=start_beacon_not_cleared error=%s", exc)

    def _connect(self) -> Any:
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(self._url, socket_timeout=2, socket_connect_timeout=1)
        return self._client

    def _run(self) -> None:
        warned = False
        while not self._stop.is_set():
            try:
                self._connect().set(self._key, f"{self._since:.3f}", ex=contracts.HEARTBEAT_TTL_S)
            except Exception as exc:
                if not warned:
                    log.warning("event=start_beacon_unwritable error=%s", exc)
                    warned = True
            self._stop.wait(contracts.STARTING_EVERY_S)

"""``Client``: typed calls over the REST API plus an SSE reader for run events."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from symphony_client.output import plural
from symphony_client.types import TERMINAL_STATUSES, Program, ProgramVersion, Pushed, Run, RunLogs, RunTrace


def describe_detail(detail: object, prefix: str = "") -> list[str]:
    """The error envelope's ``detail`` as ``field: message`` lines (nested fields dotted), so a
    400 says which field was wrong instead of the envelope's generic "request failed"."""
    if isinstance(detail, dict):
        return [line for key, value in detail.items() for line in describe_detail(value, f"{prefix}{key}.")]
    if isinstance(detail, list) and all(isinstance(item, str) for item in detail):
        return [f"{prefix.rstrip('.')}: {' '.join(detail)}" if prefix else " ".join(detail)]
    if isinstance(detail, list):
        return [line for i, item in enumerate(detail) for line in describe_detail(item, f"{prefix}{i}.")]
    if detail is None:
        return []
    return [f"{prefix.rstrip('.')}: {detail}" if prefix else str(detail)]


class ApiError(Exception):
    """A non-2xx answer; carries the API's error code, message and ``detail`` (per-field
    messages for a 400 ``invalid``), which the string form spells out."""

    def __init__(self, status: int, code: str, message: str, detail: object = None) -> None:
        super().__init__(f"{status} {code}: {_spelled_out(message, detail)}")
        self.status, self.code, self.message, self.detail = status, code, message, detail


def _spelled_out(message: str, detail: object) -> str:
    """The message with the fields ``detail`` names; the fields alone in place of the
    envelope's generic "request failed"; DRF's ``{"detail": message}`` adds nothing."""
    if isinstance(detail, dict) and str(detail.get("detail")) == message:
        detail = {k: v for k, v in detail.items() if k != "detail"}
    fields = "; ".join(describe_detail(detail))
    if not fields:
        return message
    return fields if message == "request failed" else f"{message} ({fields})"


class StreamLost(ApiError):
    """A run's event stream that had been open broke off and could not be resumed: the run may
    well go on (``status`` 0: no HTTP answer says so)."""

    def __init__(self, run_id: str, reconnects: int, waited: float) -> None:
        message = (
            f"the events stream of run {run_id} broke off and {plural(reconnects, 'reconnection')}"
            f" over {waited:.0f} s failed"
        )
        super().__init__(0, "stream_lost", message)
        self.run_id = run_id


@dataclass(frozen=True)
class Event:
    id: str
    type: str
    data: object


class _AfterEnd(Exception):
    """The events endpoint's 204: the caller already had the run's ``end``."""


class _Throttled(Exception):
    """The events endpoint's 429 for the tenant's request rate: retry after ``seconds``."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"retry in {seconds} s")
        self.seconds = seconds


def _throttled_for(response: httpx.Response) -> float | None:
    """Seconds to wait when the API refused the request unprocessed for its rate (429
    ``throttled`` with ``Retry-After``); ``None`` for any other answer, ``quota_exceeded`` included
    (a plan limit that waiting may never lift)."""
    if response.status_code != 429:
        return None
    try:
        code = response.json()["error"]["code"]
        wait = float(response.headers["Retry-After"])
    except (ValueError, KeyError, TypeError):
        return None
    return wait if code == "throttled" and wait >= 0 else None


class Client:
    """``throttle_wait_s``: how long one call may wait in all for the tenant's request rate
    (429 ``throttled`` is answered before the request is processed, so it is safe to resend);
    0 raises the 429 at once. ``transport``: httpx's, e.g. a proxy's or a test's."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        timeout: float = 30.0,
        throttle_wait_s: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(
            base_url=base_url.rstrip("/") + "/api/v1/",
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout,
            transport=transport,
        )
        self.throttle_wait_s = throttle_wait_s

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        """The decoded JSON answer (``None`` for an empty body); each public method's return
        annotation names its shape."""
        waited = 0.0
        while True:
            response = self._http.request(method, path, **kwargs)
            wait = _throttled_for(response)
            if wait is None or waited + wait > self.throttle_wait_s:
                break
            time.sleep(wait)
            waited += wait
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                raise ApiError(response.status_code, error["code"], error["message"], error.get("detail"))
            except (ValueError, KeyError):
                raise ApiError(response.status_code, "http_error", response.text[:500]) from None
        return response.json() if response.content else None

    def _all(self, path: str, most: int | None = None, **params: object) -> list[Any]:
        """Every item of a paginated listing (the first ``most`` when given)."""
        items: list[Any] = []
        offset = 0
        while most is None or len(items) < most:
            size = 200 if most is None else min(200, most - len(items))
            page = self._call("GET", path, params={**params, "limit": size, "offset": offset})
            items.extend(page["results"])
            if not page.get("next"):
                break
            offset += len(page["results"])
        return items

    def me(self) -> dict:
        return self._call("GET", "auth/me")

    def upload_program(self, path: str | Path, name: str, description: str = "") -> Program:
        path = Path(path)
        files = {"file": (path.name, path.read_bytes())}
        return self._call("POST", "programs", data={"name": name, "description": description}, files=files)

    def list_programs(self) -> list[Program]:
        return self._all("programs")

    def add_version(self, program: int, path: str | Path) -> ProgramVersion:
        path = Path(path)
        return self._call("POST", f"programs/{program}/versions", files={"file": (path.name, path.read_bytes())})

    def list_versions(self, program: int) -> list[ProgramVersion]:
        return self._call("GET", f"programs/{program}/versions")

    def push_program(self, path: str | Path, name: str | None = None) -> Pushed:
        """Upload ``path`` as a new program, or as the next version of the program of that
        name; returns ``Pushed(program, version)`` (a tuple: ``program, version = ...``). A file
        whose bytes equal the latest version's (same SHA-256) is not uploaded again, so ``symphony
        run prog.py`` repeated does not mint a version per run."""
        path = Path(path)
        name = name or path.stem
        existing = next((p for p in self.list_programs() if p["name"] == name), None)
        if existing is None:
            program = self.upload_program(path, name)
            first = program["latest_version"]
            assert first is not None, "the API answers an upload with the version it created"
            return Pushed(program, first)
        versions = self.list_versions(existing["id"])
        if versions and versions[-1]["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest():
            return Pushed(existing, versions[-1]["number"])
        version = self.add_version(existing["id"], path)
        return Pushed(existing, version["number"])

    def list_kv_files(self) -> list[dict]:
        return self._all("kv-files")

    def delete_program(self, ref: int | str) -> Program:
        """Delete a program (by id, or by name) with its versions and finished runs; returns it.
        The API refuses (409) while one of its runs is not finished."""
        programs = self.list_programs()
        match = next((p for p in programs if str(p["id"]) == str(ref) or p["name"] == ref), None)
        if match is None:
            raise ApiError(404, "not_found", f"no program named or numbered {ref!r}")
        self._call("DELETE", f"programs/{match['id']}")
        return match

    def delete_kv_file(self, name: str) -> None:
        match = next((kv for kv in self.list_kv_files() if kv["name"] == name), None)
        if match is None:
            raise ApiError(404, "not_found", f"no KV file named {name!r}")
        self._call("DELETE", f"kv-files/{match['id']}")

    def usage(self, group_by: str | None = None) -> dict:
        """``{days}``; with ``group_by`` ("program" or "api_key") also ``groups``: the usage
        summed per program or per API key."""
        return self._call("GET", "usage", params={"group_by": group_by} if group_by else None)

    def quota(self) -> dict:
        return self._call("GET", "quota")

    def create_run(
        self, program: int, args: dict | None = None, limits: dict | None = None, idempotency_key: str | None = None
    ) -> Run:
        """A new queued run; with ``idempotency_key``, the run that key made earlier with the same
        arguments (another body under the same key is a 422 ``idempotency_mismatch``)."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        body = {"program": program, "args": args or {}, "limits": limits or {}}
        return self._call("POST", "runs", json=body, headers=headers)

    def list_runs(
        self, status: str | None = None, program: int | None = None, limit: int | None = None, parent: str | None = None
    ) -> list[Run]:
        """The tenant's runs, newest first; ``status``/``program``/``parent`` (the run that
        spawned them) filter them, ``limit`` keeps the newest ``limit`` (all when ``None``)."""
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1, not {limit}")
        pairs = (("status", status), ("program", program), ("parent", parent))
        params = {k: v for k, v in pairs if v is not None}
        return self._all("runs", most=limit, **params)

    def get_run(self, run_id: str) -> Run:
        return self._call("GET", f"runs/{run_id}")

    def wait(self, run: str | Run, timeout: float | None = None, poll_s: float = 0.5) -> Run:
        """Block until the run has ended and return it (``status`` in ``TERMINAL_STATUSES``).
        Polls ``GET /runs/<id>``, backing off from ``poll_s`` to 5 s; raises ``TimeoutError``
        once ``timeout`` seconds have passed with the run still queued or running."""
        run_id = run if isinstance(run, str) else run["id"]
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            current = self.get_run(run_id)
            if current["status"] in TERMINAL_STATUSES:
                return current
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"run {run_id} is still {current['status']} after {timeout} s")
            pause = poll_s if deadline is None else min(poll_s, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            poll_s = min(5.0, poll_s * 1.5)

    def cancel_run(self, run_id: str) -> Run:
        return self._call("POST", f"runs/{run_id}/cancel")

    def run_logs(self, run_id: str) -> RunLogs:
        """``{id, status, stdout, stderr, truncated}``: what the program printed (once it ended)."""
        return self._call("GET", f"runs/{run_id}/logs")

    def run_trace(self, run_id: str) -> RunTrace:
        """Where the run's time went: its span tree (``complete`` once the run has ended)."""
        return self._call("GET", f"runs/{run_id}/trace")

    def run_trace_chrome(self, run_id: str) -> dict[str, Any]:
        """The run's trace in the Chrome trace-event format (open it in Perfetto)."""
        return self._call("GET", f"runs/{run_id}/trace", params={"format": "chrome"})

    def events(self, run_id: str, last_event_id: str | None = None, reconnects: int = 5) -> Iterator[Event]:
        """Yield the run's events until ``end``. A server that cannot be reached raises httpx's
        error at once, like every other call. Once the stream has been open, one that breaks or
        closes before ``end`` (server restart, Redis failover past the server's own retries) is
        resumed with ``Last-Event-ID``, so no event is lost or repeated: up to ``reconnects``
        times in a row, waiting 1, 2, 4, 8, 8 s before them (23 s in all for the default 5),
        then :class:`StreamLost`. Resuming after the run's ``end`` yields nothing (the server
        answers 204)."""
        failures, throttled, waited = 0, 0.0, 0.0
        opened: list[bool] = []  # the stream answered 200 once: failures from then on are retried
        while True:
            try:
                for event in self._event_stream(run_id, last_event_id, opened):
                    failures, waited = 0, 0.0
                    last_event_id = event.id or last_event_id
                    yield event
                    if event.type == "end":
                        return
            except httpx.TransportError:
                if not opened:
                    raise
            except _AfterEnd:
                return
            except _Throttled as wait:
                if throttled + wait.seconds > self.throttle_wait_s:
                    message = f"the events of run {run_id} stayed refused for the tenant's request rate"
                    raise ApiError(429, "throttled", message) from None
                time.sleep(wait.seconds)
                throttled += wait.seconds
                continue
            if failures >= reconnects:
                raise StreamLost(run_id, failures, waited)
            failures += 1
            pause = min(8.0, 0.5 * 2**failures)
            time.sleep(pause)
            waited += pause

    def _event_stream(self, run_id: str, last_event_id: str | None, opened: list[bool]) -> Iterator[Event]:
        headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
        with self._http.stream("GET", f"runs/{run_id}/events", headers=headers, timeout=None) as response:
            if response.status_code == 204:
                raise _AfterEnd
            if response.status_code >= 400:
                response.read()
                wait = _throttled_for(response)
                if wait is not None:
                    raise _Throttled(wait)
                raise ApiError(response.status_code, "http_error", response.text[:500])
            opened[:] = [True]
            fields: dict[str, str] = {}
            for line in response.iter_lines():
                if line == "":
                    if "data" in fields:
                        yield Event(fields.get("id", ""), fields.get("event", "message"), json.loads(fields["data"]))
                    fields = {}
                elif not line.startswith(":") and ":" in line:
                    key, _, value = line.partition(":")
                    fields[key] = value.removeprefix(" ")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

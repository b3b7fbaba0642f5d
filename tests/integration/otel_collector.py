"""An OTLP/HTTP collector for tests: a plain HTTP server taking the protobuf POSTs on
/v1/traces, decoded with the protocol's own messages, keeping every span with its resource's
attributes (no SDK on the receiving side: what arrives is what any collector would read)."""

from __future__ import annotations

import contextlib
import gzip
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class Collector(ThreadingHTTPServer):
    """Keeps every span it is sent, with its resource's attributes."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[tuple[dict[str, Any], Any]] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def wait_for(
        self, match: Callable[[dict[str, Any], Any], bool], count: int = 1, timeout: float = 30
    ) -> list[tuple[dict[str, Any], Any]]:
        """The (resource, span) pairs ``match`` accepts, once there are at least ``count``."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                found = [(r, s) for r, s in self.spans if match(r, s)]
            if len(found) >= count or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    def run_spans(self, run_id: str, timeout: float = 30) -> tuple[dict[str, Any], list[Any]]:
        """The resource and the spans of the trace whose run span is ``run_id``'s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                for resource, span in self.spans:
                    if span.name == "run" and attrs(span).get("symphony.run.id") == run_id:
                        return resource, [s for _, s in self.spans if s.trace_id == span.trace_id]
            time.sleep(0.1)
        raise AssertionError(f"no run span of {run_id} reached the collector: {len(self.spans)} spans")


class _Handler(BaseHTTPRequestHandler):
    server: Collector

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        request = ExportTraceServiceRequest.FromString(body)
        with self.server.lock:
            self.server.paths.append(self.path)
            for resource_spans in request.resource_spans:
                resource = attrs(resource_spans.resource)
                for scope_spans in resource_spans.scope_spans:
                    self.server.spans.extend((resource, span) for span in scope_spans.spans)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, format: str, *args: Any) -> None:
        return


def attrs(item: Any) -> dict[str, Any]:
    """An OTLP message's attributes as a plain map."""
    out = {}
    for kv in item.attributes:
        value = kv.value
        out[kv.key] = getattr(value, value.WhichOneof("value"))
    return out


@contextlib.contextmanager
def running_collector() -> Iterator[Collector]:
    server = Collector()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()

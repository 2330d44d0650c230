"""Local stand-ins for the services W&B, Weave and Langfuse send to, and readers of what they got.

Everything runs on 127.0.0.1 and records what it receives, so a test can check what the
real libraries exported: spans as OTLP/HTTP protobufs (Langfuse), Weave's calls as its
trace server receives them, and W&B's offline run file as `wandb sync` would read it.
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Received:
    """What a stand-in server was sent: (method, path, headers, body) per request."""

    requests: list[tuple[str, str, dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""

    def bodies(self, path_part: str) -> list[bytes]:
        return [body for _, path, _, body in self.requests if path_part in path]


@contextmanager
def recording_server(answer: Any = None) -> Iterator[Received]:
    """An HTTP server on 127.0.0.1 that records every request and answers `answer(method, path, body)`.

    `answer` returns (status, JSON body); by default every request gets 200 and `{}`.
    """
    received = Received()

    class Handler(BaseHTTPRequestHandler):
        def _handle(self, method: str) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            received.requests.append((method, self.path, dict(self.headers), body))
            status, reply = answer(method, self.path, body) if answer else (200, {})
            payload = json.dumps(reply).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    received.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield received
    finally:
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    """The URL of a port on 127.0.0.1 that nothing listens on."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), BaseHTTPRequestHandler)
    port = server.server_address[1]
    server.server_close()
    return f"http://127.0.0.1:{port}"


def otlp_spans(bodies: list[bytes]) -> list[dict[str, Any]]:
    """The spans of OTLP/HTTP protobuf export requests: name, ids and attributes (decoded)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    spans = []
    for body in bodies:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                for span in scope.spans:
                    spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_id": span.parent_span_id.hex(),
                            "attributes": {a.key: _any_value(a.value) for a in span.attributes},
                        }
                    )
    return spans


def _any_value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_any_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def wandb_records(run_file: Path) -> Iterator[Any]:
    """The records of a W&B run file (`run-<id>.wandb`), as `wandb sync` reads them.

    The file is a LevelDB-style log: a 7-byte header (`:W&B`, magic 0xBEE1, version),
    then 32 KiB blocks of records, each a 7-byte header (CRC, length, kind) and a chunk
    of a protobuf `Record`: whole (1), or first (2), middle (3) and last (4) parts.
    """
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{run_file} is not a W&B run file"
    block, position, parts = 32768, 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:  # a block's tail too short for a header is padding
            position += block - position % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0 and length == 0:
            break
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts + chunk if kind == 4 else chunk)
            parts = b""
            yield record
        elif kind in (2, 3):
            parts += chunk


@dataclass
class WandbRunFile:
    run_id: str
    project: str
    name: str
    history: list[dict[str, Any]]


def read_wandb_run(run_file: Path) -> WandbRunFile:
    """A W&B offline run: its id, project, display name and history rows (values decoded)."""
    run_id = project = name = ""
    history = []
    for record in wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id, project, name = record.run.run_id, record.run.project, record.run.display_name
        elif kind == "history":
            history.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return WandbRunFile(run_id, project, name, history)


def run_python(
    code: str, env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with `art` from this tree and `env` on top of ours.

    A variable set to "" in `env` is removed instead.
    """
    full = {**os.environ, "PYTHONPATH": str(REPO)}
    for key, value in env.items():
        if value == "":
            full.pop(key, None)
        else:
            full[key] = value
    return subprocess.run(
        [sys.executable, "-c", code],
        env=full,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )

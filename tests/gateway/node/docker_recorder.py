"""A Docker Engine API endpoint that records what a real docker CLI sends it and refuses everything: the
oracle of what a `docker run` / `docker exec` argv *means* to docker (its parsed flags, mounts, image and
environment), without a daemon. Answers `/_ping`; every POST is recorded and answered 500."""

from __future__ import annotations

import http.server
import json
import socketserver
import threading
from pathlib import Path
from typing import Any


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def address_string(self) -> str:
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _reply(self, status: int, body: bytes = b"") -> None:
        self.send_response(status)
        self.send_header("Api-Version", "1.47")
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self) -> None:
        self._reply(200)

    def do_GET(self) -> None:
        self.server.recorder.requests.append(("GET", self.path, None))
        self._reply(200, b"OK" if self.path.endswith("/_ping") else b"{}")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        self.server.recorder.requests.append(("POST", self.path, json.loads(raw) if raw.strip() else None))
        self._reply(500, b'{"message":"refused by the recorder"}')


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    recorder: DockerRecorder


class DockerRecorder:
    """`with DockerRecorder(path) as daemon:` serves at `daemon.url` (unix://...) until the block ends."""

    def __init__(self, socket_path: Path) -> None:
        self.path = socket_path
        self.requests: list[tuple[str, str, Any]] = []
        self._server = _Server(str(socket_path), _Handler)
        self._server.recorder = self

    @property
    def url(self) -> str:
        return f"unix://{self.path}"

    def posts(self, suffix: str) -> list[Any]:
        """Bodies of the recorded POSTs whose path (without the query) ends with `suffix`."""
        return [
            body for method, path, body in self.requests if method == "POST" and path.split("?")[0].endswith(suffix)
        ]

    def __enter__(self) -> DockerRecorder:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self.path.unlink(missing_ok=True)

"""The real server for end-to-end tests: ``gpu-admission serve`` (gunicorn, TLS) on loopback, and a client that
verifies it the way kube-apiserver does (the CA bundle as the only trust root, server name ``<svc>.<ns>.svc``).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SERVICE, NAMESPACE = "gpu-admission", "gpu-admission"
SERVER_NAME = f"{SERVICE}.{NAMESPACE}.svc"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def issue_certs(directory: Path, days: int = 365, extra: Sequence[str] = ()) -> Path:
    """Development certificates through the project's own certs tool (``extra``: more of its flags)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "certs",
            "issue",
            "--dir",
            str(directory),
            "--service",
            SERVICE,
            "--namespace",
            NAMESPACE,
            "--days",
            str(days),
            *extra,
        ],
        check=True,
        capture_output=True,
        timeout=60,
        cwd=REPO,
    )
    return directory


class ApiserverClient:
    """HTTPS with keep-alive, verifying the server against ``ca`` under ``server_name``."""

    def __init__(
        self,
        port: int,
        ca: Path,
        server_name: str = SERVER_NAME,
        timeout: float = 10.0,
        tls_version: ssl.TLSVersion | None = None,
    ) -> None:
        self.context = ssl.create_default_context(cafile=str(ca))
        if tls_version is not None:
            self.context.minimum_version = self.context.maximum_version = tls_version
        self.port, self.server_name, self.timeout = port, server_name, timeout
        self.conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        raw = socket.create_connection(("127.0.0.1", self.port), timeout=self.timeout)
        tls = self.context.wrap_socket(raw, server_hostname=self.server_name)
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
        conn.sock = tls
        return conn

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json", raw: bytes | None = None
    ) -> tuple[int, Any]:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        for attempt in range(2):
            if self.conn is None:
                self.conn = self._connect()
            try:
                headers = {"Content-Type": content_type} if data is not None else {}
                self.conn.request(method, path, body=data, headers=headers)
                response = self.conn.getresponse()
                payload = response.read()
                if response.getheader("Connection", "").lower() == "close":
                    self.close()
                text = payload.decode() if payload else ""
                try:
                    return response.status, json.loads(text) if text else None
                except json.JSONDecodeError:
                    return response.status, text
            except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        return self.request("POST", path, body)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    certs: Path
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def ca(self) -> Path:
        return self.certs / "ca.crt"

    def client(self, **kwargs: Any) -> ApiserverClient:
        return ApiserverClient(self.port, self.ca, **kwargs)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self) -> str:
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=10)
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        conn.close()
        return text


def exchange(server: Server, data: bytes, timeout: float = 15.0) -> bytes:
    """Send raw bytes over TLS and read until the server closes the connection."""
    context = ssl.create_default_context(cafile=str(server.ca))
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    with context.wrap_socket(raw, server_hostname=SERVER_NAME) as tls:
        tls.sendall(data)
        got = b""
        with suppress(OSError):
            while chunk := tls.recv(65536):
                got += chunk
    return got


def wait_ready(server: Server, deadline_s: float = 30.0, path: str = "/readyz") -> None:
    deadline = time.monotonic() + deadline_s
    last: object = None
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise AssertionError(f"server exited with {server.proc.returncode}:\n{server.output()[-3000:]}")
        try:
            client = server.client(timeout=2)
            status, _ = client.request("GET", path)
            client.close()
            if status == 200:
                return
            last = status
        except (OSError, ssl.SSLError, http.client.HTTPException) as err:
            last = err
        time.sleep(0.1)
    raise AssertionError(f"server not ready in {deadline_s}s ({last}):\n{server.output()[-3000:]}")


@contextmanager
def serve(
    tmp: Path,
    nodes: Path | None = REPO / "examples" / "nodes.yaml",
    config: Path | None = None,
    workers: int = 1,
    env: dict[str, str] | None = None,
    certs: Path | None = None,
    wait: bool = True,
    extra_args: list[str] | None = None,
    command: tuple[str, ...] = ("webhook.cli", "serve"),
) -> Iterator[Server]:
    """Run ``gpu-admission serve`` (or another module taking its flags: ``command``) on free loopback ports until the
    block ends (then SIGTERM, then SIGKILL)."""
    certs = certs or issue_certs(tmp / "certs")
    port, metrics_port = free_port(), free_port()
    args = [
        sys.executable,
        "-m",
        *command,
        "--cert",
        str(certs / "tls.crt"),
        "--key",
        str(certs / "tls.key"),
        "--port",
        str(port),
        "--metrics-port",
        str(metrics_port),
        "--workers",
        str(workers),
        "--host",
        "127.0.0.1",
        *(extra_args or []),
    ]
    if nodes is not None:
        args += ["--nodes", str(nodes)]
    if config is not None:
        args += ["--config", str(config)]
    full_env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp / "metrics"), **(env or {})}
    (tmp / "metrics").mkdir(exist_ok=True)
    log = tmp / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=full_env, cwd=REPO)
    server = Server(proc, port, metrics_port, certs, log, full_env)
    try:
        if wait:
            wait_ready(server)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

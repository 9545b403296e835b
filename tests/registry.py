"""A real OCI registry for the tests: Debian's ``docker-registry`` (distribution 2.8) on loopback, behind Docker's
token protocol, with a token service of the tests' own that signs real JWTs (ES256, the certificate in ``x5c``) the
registry verifies against its ``rootcertbundle``. Anonymous pulls get a token for every repository but those under
``private/`` (Docker Hub's way: a token without access, then the registry's 401); the tests push with a token that
may push anywhere.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

from certs.issue import issue_ca
from tests.serving import free_port

SERVICE = "gpu-admission-test-registry"
ISSUER = "gpu-admission-test-tokens"
PUSHER = "Basic " + base64.b64encode(b"pusher:secret").decode()
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def binary() -> str:
    found = shutil.which("docker-registry") or "/usr/bin/docker-registry"
    if not Path(found).exists():
        raise AssertionError("docker-registry is not installed: run `make tools` (Debian's docker-registry package)")
    return found


@dataclass
class TokenService:
    """Issues the registry's bearer tokens; ``asked``: the scopes asked, with whether the asker was the pusher."""

    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    port: int = 0
    asked: list[tuple[str, bool]] = field(default_factory=list)

    def token(self, scope: str, pusher: bool) -> str:
        access = []
        for one in scope.split(" "):
            kind, _, rest = one.partition(":")
            name, _, actions = rest.rpartition(":")
            if kind != "repository" or not name:
                continue
            if pusher:
                access.append({"type": kind, "name": name, "actions": actions.split(",")})
            elif not name.startswith("private/"):
                access.append({"type": kind, "name": name, "actions": ["pull"]})
        now = int(time.time())
        der = self.cert.public_bytes(serialization.Encoding.DER)
        header = {"typ": "JWT", "alg": "ES256", "x5c": [base64.b64encode(der).decode()]}
        claims = {
            "iss": ISSUER,
            "sub": "pusher" if pusher else "",
            "aud": SERVICE,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": os.urandom(8).hex(),
            "access": access,
        }
        signing = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


def _token_handler(service: TokenService) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            scope = " ".join(query.get("scope", []))
            given = self.headers.get("Authorization")
            pusher = given == PUSHER
            if given is not None and not pusher:  # an account it does not know
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            service.asked.append((scope, pusher))
            body = json.dumps({"token": service.token(scope, pusher), "expires_in": 300}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@dataclass
class Registry:
    """A running registry: ``host`` (127.0.0.1:port) as an image names it."""

    host: str
    tokens: TokenService
    log: Path

    def _token(self, repository: str) -> str:
        url = f"http://127.0.0.1:{self.tokens.port}/token?service={SERVICE}&scope=repository:{repository}:pull,push"
        request = urllib.request.Request(url, headers={"Authorization": PUSHER})
        with urllib.request.urlopen(request, timeout=10) as answer:
            token: str = json.load(answer)["token"]
        return token

    def _call(self, method: str, url: str, token: str, body: bytes = b"", content_type: str = "") -> Any:
        headers = {"Authorization": f"Bearer {token}"}
        if content_type:
            headers["Content-Type"] = content_type
        request = urllib.request.Request(url, data=body if method != "GET" else None, headers=headers, method=method)
        try:
            return urllib.request.urlopen(request, timeout=10)
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{method} {url}: {err.code} {err.read()[:500]!r}") from err

    def blob(self, repository: str, data: bytes) -> str:
        """Upload ``data`` (monolithically); its digest."""
        token = self._token(repository)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        started = self._call("POST", f"http://{self.host}/v2/{repository}/blobs/uploads/", token)
        location = urllib.parse.urljoin(f"http://{self.host}/", started.headers["Location"])
        joiner = "&" if "?" in location else "?"
        self._call("PUT", f"{location}{joiner}digest={digest}", token, data, "application/octet-stream")
        return digest

    def manifest(self, repository: str, reference: str, body: dict[str, Any], media: str) -> str:
        data = json.dumps(body).encode()
        self._call(
            "PUT", f"http://{self.host}/v2/{repository}/manifests/{reference}", self._token(repository), data, media
        )
        return "sha256:" + hashlib.sha256(data).hexdigest()

    def image(
        self,
        repository: str,
        tag: str,
        env: Sequence[str],
        architecture: str = "amd64",
        media: str = OCI_MANIFEST,
    ) -> str:
        """Push a one-layer image whose config has ``env``; the manifest's digest."""
        config = {
            "architecture": architecture,
            "os": "linux",
            "config": {"Env": list(env), "Entrypoint": ["/bin/sh"]},
            "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(b"layer").hexdigest()]},
        }
        config_data = json.dumps(config).encode()
        layer = os.urandom(64)
        config_type = OCI_CONFIG if media == OCI_MANIFEST else DOCKER_CONFIG
        layer_type = (
            "application/vnd.oci.image.layer.v1.tar+gzip"
            if media == OCI_MANIFEST
            else "application/vnd.docker.image.rootfs.diff.tar.gzip"
        )
        manifest = {
            "schemaVersion": 2,
            "mediaType": media,
            "config": {
                "mediaType": config_type,
                "digest": self.blob(repository, config_data),
                "size": len(config_data),
            },
            "layers": [{"mediaType": layer_type, "digest": self.blob(repository, layer), "size": len(layer)}],
        }
        return self.manifest(repository, tag, manifest, media)

    def index(self, repository: str, tag: str, platforms: dict[str, Sequence[str]], attestation: bool = True) -> str:
        """Push one image per ``platforms`` entry ('amd64': its env) and an OCI index of them (first, when
        ``attestation``, an attestation manifest as BuildKit writes one: platform unknown/unknown)."""
        entries = []
        if attestation:
            digest = self.image(repository, f"{tag}-attestation", ["NVIDIA_REQUIRE_CUDA=cuda>=99.0"])
            entries.append(
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": digest,
                    "size": 1,
                    "platform": {"os": "unknown", "architecture": "unknown"},
                }
            )
        for architecture, env in platforms.items():
            digest = self.image(repository, f"{tag}-{architecture}", env, architecture)
            entries.append(
                {
                    "mediaType": OCI_MANIFEST,
                    "digest": digest,
                    "size": 1,
                    "platform": {"os": "linux", "architecture": architecture},
                }
            )
        return self.manifest(
            repository, tag, {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}, OCI_INDEX
        )


def _certificate(directory: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate, Path]:
    """The token service's signing certificate (the project's own CA builder: ECDSA P-256, for ES256), and the
    bundle the registry trusts it by."""
    cert, key = issue_ca(ISSUER, 1)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    bundle = directory / "tokens.crt"
    bundle.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, bundle


@contextmanager
def registry(tmp: Path) -> Iterator[Registry]:
    """Run the registry and its token service until the block ends."""
    tmp.mkdir(parents=True, exist_ok=True)
    key, cert, bundle = _certificate(tmp)
    tokens = TokenService(key, cert)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _token_handler(tokens))
    tokens.port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        for attempt in range(3):  # the port is free when picked, and bound by the registry a moment later
            try:
                with _serve(tmp, tokens, bundle) as running:
                    yield running
                break
            except PortTaken:
                if attempt == 2:
                    raise
    finally:
        server.shutdown()
        server.server_close()


class PortTaken(Exception):
    """The registry could not bind the port picked for it."""


@contextmanager
def _serve(tmp: Path, tokens: TokenService, bundle: Path) -> Iterator[Registry]:
    port = free_port()
    config = tmp / "config.yml"
    config.write_text(
        json.dumps(  # YAML is a superset of JSON
            {
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {"filesystem": {"rootdirectory": str(tmp / "storage")}},
                "http": {"addr": f"127.0.0.1:{port}"},
                "auth": {
                    "token": {
                        "realm": f"http://127.0.0.1:{tokens.port}/token",
                        "service": SERVICE,
                        "issuer": ISSUER,
                        "rootcertbundle": str(bundle),
                    }
                },
            }
        )
    )
    log = tmp / "registry.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([binary(), "serve", str(config)], stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait(port, proc, log)
        yield Registry(f"127.0.0.1:{port}", tokens, log)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _wait(port: int, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text()
            if "address already in use" in text:
                raise PortTaken(text[-500:])
            raise AssertionError(f"docker-registry exited: {text[-2000:]}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=1)
            return
        except urllib.error.HTTPError as err:
            if err.code == 401:  # up, and asking for a token
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"docker-registry not up in 20 s: {log.read_text()[-2000:]}")

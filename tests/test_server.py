"""End to end: the real gunicorn server over real TLS on loopback, verified the way kube-apiserver does."""

from __future__ import annotations

import base64
import contextlib
import glob
import json
import os
import re
import signal
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from tests.conftest import EXAMPLES, gpu_pod, review
from tests.serving import SERVER_NAME, Server, exchange, issue_certs, serve
from tests.test_admission import BAD
from webhook.server import ReloadingTLS


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(tmp_path_factory.mktemp("server"), config=EXAMPLES / "config.yaml", workers=2) as s:
        yield s


def test_certificate_verifies_as_the_apiserver_checks_it(server: Server) -> None:
    client = server.client()
    status, body = client.request("GET", "/healthz")
    assert status == 200 and body == {"status": "ok"}
    sock = client.conn.sock  # type: ignore[union-attr]
    assert isinstance(sock, ssl.SSLSocket)
    cert: Any = sock.getpeercert()
    sans = [value for _, value in cert["subjectAltName"]]
    assert SERVER_NAME in sans and f"{SERVER_NAME}.cluster.local" in sans
    assert sock.version() in ("TLSv1.2", "TLSv1.3")


def test_wrong_server_name_is_refused(server: Server) -> None:
    with pytest.raises(ssl.SSLCertVerificationError):
        server.client(server_name="other.default.svc").request("GET", "/healthz")


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1])
def test_old_tls_is_refused(server: Server, version: ssl.TLSVersion) -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        ctx.minimum_version = ctx.maximum_version = version
        ctx.set_ciphers("ALL:@SECLEVEL=0")
    except (ValueError, ssl.SSLError):
        pytest.fail("this Python cannot even offer the old TLS version")
    with (
        socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw,
        pytest.raises((ssl.SSLError, ConnectionResetError)),
    ):
        ctx.wrap_socket(raw, server_hostname=SERVER_NAME).do_handshake()


def test_plaintext_http_is_refused(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            data = s.recv(100)
        except ConnectionResetError:
            data = b""
    assert b"200 OK" not in data


def test_keep_alive_connection_is_reused(server: Server) -> None:
    """Every answer keeps the connection (it passed while the server closed each one: the client, closed after
    each answer, compared None with None; found when gunicorn was given as many threads as connections, which
    leaves it none to keep alive)."""
    client = server.client()
    client.request("GET", "/healthz")
    assert client.conn is not None and client.conn.sock is not None, "the server closed the connection"
    first = client.conn.sock
    for _ in range(5):
        status, _ = client.post("/validate", review(gpu_pod()))
        assert status == 200
    assert client.conn is not None and client.conn.sock is first


def test_example_review_from_readme(server: Server) -> None:
    body = json.loads((EXAMPLES / "admission-review.json").read_text())
    status, answer = server.client().post("/mutate", body)
    assert status == 200
    response = answer["response"]
    assert response["uid"] == body["request"]["uid"]
    assert response["allowed"] is True
    # What the README says the answer holds: the fraction became a MIG resource, spot tolerations, the reasons.
    pod = jsonpatch.apply_patch(body["request"]["object"], json.loads(base64.b64decode(response["patch"])))
    (limits,) = [c["resources"]["limits"] for c in pod["spec"]["containers"]]
    assert list(limits) == ["nvidia.com/mig-3g.40gb"]
    assert any(t["key"] == "cloud.google.com/gke-spot" for t in pod["spec"]["tolerations"])
    assert {"gpu-admission.io/mig", "gpu-admission.io/cuda", "gpu-admission.io/spot-applied"} <= set(
        pod["metadata"]["annotations"]
    )
    assert response["auditAnnotations"]["decision"] == "mutated"


def test_example_cuda13_pod_is_denied_with_what_to_change(server: Server) -> None:
    body = json.loads((EXAMPLES / "admission-review-cuda13.json").read_text())
    status, answer = server.client().post("/validate", body)
    assert status == 200
    response = answer["response"]
    assert response["allowed"] is False and "patch" not in response
    assert response["status"]["code"] == 403 and response["status"]["reason"] == "CUDAIncompatible"
    message = response["status"]["message"]
    for words in (
        "container trainer",
        "pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime",
        "CUDA 13.0",
        "from image tag",
        "driver 570.124.06",
        "To fix",
    ):
        assert words in message
    assert response["auditAnnotations"]["decision"] == "denied (CUDAIncompatible)"


def test_warn_mode_over_https_admits_with_short_warnings(tmp_path: Path) -> None:
    body = json.loads((EXAMPLES / "admission-review-cuda13.json").read_text())
    # with the variables the kubelet writes for a Service named gpu-admission (the release name the docs use),
    # which had stopped the server at start (found by a review)
    links = {"GPU_ADMISSION_SERVICE_HOST": "10.96.0.10", "GPU_ADMISSION_PORT_443_TCP_ADDR": "10.96.0.10"}
    env = {**links, "GPU_ADMISSION_CUDA__MODE": "warn"}
    with serve(tmp_path, config=EXAMPLES / "config.yaml", env=env) as s:
        status, answer = s.client().post("/validate", body)
    response = answer["response"]
    assert status == 200 and response["allowed"] is True
    assert response["warnings"] and all(len(w) < 120 for w in response["warnings"])
    assert any("CUDA 13.0" in w for w in response["warnings"])
    assert "cuda-would-deny" in response["auditAnnotations"]


@pytest.mark.parametrize(("raw", "content_type", "status", "words"), BAD)
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_every_bad_input_over_https(
    server: Server, path: str, raw: bytes, content_type: str, status: int, words: str
) -> None:
    # The same table as the app-level tests (test_admission.BAD), through gunicorn and TLS.
    client = server.client()
    code, body = client.request("POST", path, raw=raw, content_type=content_type)
    assert code == status and words in body["error"]
    status_after, _ = client.request("GET", "/healthz")  # the connection (or a fresh one) still serves
    assert status_after == 200


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/mutate", 405), ("PUT", "/validate", 405), ("DELETE", "/mutate", 405), ("GET", "/nope", 404)],
)
def test_wrong_method_or_path_over_https(server: Server, method: str, path: str, status: int) -> None:
    code, body = server.client().request(method, path)
    assert code == status and body["error"]


def test_body_over_7mib_is_413_over_https(server: Server) -> None:
    code, body = server.client().request("POST", "/validate", raw=b" " * (8 * 1024 * 1024))
    assert code == 413 and "limit" in body["error"]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_patch_only_from_mutate_and_it_applies(server: Server, path: str) -> None:
    pod = gpu_pod(annotations={"gpu-admission.io/cuda": "forged"})
    status, answer = server.client().post(path, review(pod))
    assert status == 200
    response: dict[str, Any] = answer["response"]
    if path == "/validate":
        assert "patch" not in response
    else:
        patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
        assert patched["metadata"].get("annotations", {}).get("gpu-admission.io/cuda") != "forged"


def test_server_log_has_decision_lines(server: Server) -> None:
    """The line is written after the answer, when the request thread stands by (``webhook.outbox``)."""
    server.client().post("/validate", review(gpu_pod(), uid="log-line-uid"))
    deadline = time.monotonic() + 5
    while True:
        lines = [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]
        if any(line.get("uid") == "log-line-uid" and line["endpoint"] == "validate" for line in lines):
            return
        assert time.monotonic() < deadline, "no decision log line for the request"
        time.sleep(0.02)


def test_server_log_lines_are_all_written(server: Server) -> None:
    """Every line the server logged was formatted: gunicorn's lines (which show the process id), ours, the relay's;
    a record missing a field its format shows is printed as a "Logging error" with a traceback instead."""
    assert server.client().post("/validate", review(gpu_pod()))[0] == 200
    output = server.output()
    assert "Booting worker" in output and "serving on https://" in output
    assert "Logging error" not in output and "Traceback" not in output


def test_unusable_nodes_file_fails_before_serving(tmp_path: Path) -> None:
    bad = tmp_path / "nodes.yaml"
    bad.write_text("kind: ConfigMap\n")
    with serve(tmp_path, nodes=bad, wait=False) as s:
        assert s.proc.wait(timeout=30) == 2
        assert "expected a Node" in s.output()


def test_a_certificate_that_is_not_its_keys_fails_before_serving(tmp_path: Path) -> None:
    """The CA's certificate given as --cert (or a provided Secret's mismatched pair): the server said "serving on"
    and failed every TLS handshake, each worker building its context at its first connection; under failurePolicy
    Fail, every GPU pod was refused (found by a review)."""
    certs = issue_certs(tmp_path / "certs")
    (certs / "tls.crt").write_bytes((certs / "ca.crt").read_bytes())
    with serve(tmp_path, certs=certs, wait=False) as s:
        assert s.proc.wait(timeout=30) == 2
        (said,) = [line for line in s.output().splitlines() if line.startswith("gpu-admission: ")]
        assert said.startswith(f"gpu-admission: --cert/--key ({certs}/tls.crt, {certs}/tls.key): [X509: KEY_VALUES")
        assert said.endswith(
            "give the serving certificate (tls.crt, not the CA's ca.crt) and the key it was issued for (tls.key)"
        )
        assert "serving on" not in s.output()


def test_a_metrics_port_that_cannot_be_bound_is_not_said_to_serve_metrics(tmp_path: Path) -> None:
    """The port taken (or --port's own): the log said "cannot serve metrics" and then "metrics on http://" that port
    (found by a review). The webhook serves on; its start line says metrics are not served."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with serve(tmp_path, extra_args=["--metrics-port", str(port)]) as server:
            output = server.output()
    refused = (
        f"ERROR gpu_admission.metrics: cannot serve metrics on 127.0.0.1:{port}: [Errno 98] Address already in use"
    )
    assert refused in output, output
    (started,) = [line for line in output.splitlines() if "serving on https://" in line]
    assert started.endswith(
        f"INFO gpu_admission.server: serving on https://127.0.0.1:{server.port} with 1 workers of 512 threads;"
        " metrics not served (see above)"
    ), started


TRICKLERS = 300
"""More clients that trickle a request than the old default of 16 request threads a worker."""


def _a_review_waited(server: Server) -> float:
    """Seconds a review took on a new connection (answered 200, allowed), as the apiserver sends one."""
    client = server.client(timeout=60)
    started = time.monotonic()
    status, body = client.post("/validate", review(gpu_pod()))
    waited = time.monotonic() - started
    client.close()
    assert status == 200 and body["response"]["allowed"] is True, body
    return waited


def test_clients_that_trickle_do_not_hold_up_the_reviews(tmp_path: Path) -> None:
    """Each trickling client holds a request thread until its request's deadline (10 s): with as many of them as a
    worker has threads, a review waited that long, past kube-apiserver's timeout. Threads are made only when every
    other one waits for a client, so the default has room for many (one worker: all connections reach it)."""
    import threading

    with serve(tmp_path, workers=1) as server:
        stop = threading.Event()
        connections = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(TRICKLERS)]

        def trickle() -> None:
            hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(32)  # a TLS ClientHello's start
            for at in range(len(hello)):
                for conn in connections:
                    with contextlib.suppress(OSError):
                        conn.sendall(hello[at : at + 1])
                if stop.wait(1.0):
                    return

        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        try:
            time.sleep(1.5)  # every trickler has its thread by now
            waited = _a_review_waited(server)
            assert waited < 4.0, f"the review waited {waited:.1f} s behind {TRICKLERS} trickling clients"
        finally:
            stop.set()
            sender.join()
            for conn in connections:
                conn.close()


BODY = (EXAMPLES / "admission-review.json").read_bytes()
HEAD = b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"


@pytest.mark.parametrize(
    "chunks",
    [
        pytest.param(b"zz\r\n" + BODY + b"\r\n0\r\n\r\n", id="size-not-hex"),
        pytest.param(b"-5\r\n" + BODY, id="negative-size"),
        pytest.param(b"%x\r\n" % len(BODY) + BODY + b"XX0\r\n\r\n", id="no-crlf-after-the-data"),
        pytest.param(b"%x;a=\x01\r\n" % len(BODY) + BODY + b"\r\n0\r\n\r\n", id="control-byte-in-an-extension"),
    ],
)
def test_chunked_framing_the_server_cannot_read_is_a_400(server: Server, chunks: bytes) -> None:
    """Found by a review that attacked the real server: gunicorn's framing errors were answered 500 with a
    traceback (the catch-all for bugs)."""
    answer = exchange(server, HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunks)
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 400"), answer[:300]
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error.startswith("the request body cannot be read: "), error
    assert "unexpected error" not in server.output()


def test_a_client_that_stops_mid_body_is_recorded_as_a_408_not_a_bug(server: Server) -> None:
    started = time.monotonic()
    answer = exchange(server, HEAD + b"Content-Length: %d\r\n\r\n" % (len(BODY) + 50) + BODY)
    assert 4.0 < time.monotonic() - started < 12.0 and answer == b""  # closed once silent for IO_TIMEOUT_S
    deadline = time.monotonic() + 10
    while '"status":408' not in server.output():
        assert time.monotonic() < deadline, server.output()[-2000:]
        time.sleep(0.1)
    assert "unexpected error" not in server.output() and '"status":500' not in server.output()
    counted = [line for line in server.metrics().splitlines() if line.startswith("gpu_admission_requests_total{")]
    assert any('decision="rejected"' in line for line in counted), counted
    assert not any('decision="error"' in line for line in counted), counted


def test_connections_that_send_nothing_are_closed_after_the_io_timeout(tmp_path: Path) -> None:
    """A connection that never sends its ClientHello waited on gunicorn's poller for the keep-alive's 100 s, so
    silent connections piled up to the worker's connection limit; each also held the worker's turn for 10 ms
    when accepted (found by a review that attacked the real server)."""
    from webhook.workers import IO_TIMEOUT_S

    with serve(tmp_path, workers=1) as server:
        silent = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(200)]
        client = server.client(timeout=30)
        started = time.monotonic()
        status, body = client.post("/validate", review(gpu_pod()))
        assert status == 200 and body["response"]["allowed"] is True
        assert time.monotonic() - started < 2.0
        client.close()
        time.sleep(IO_TIMEOUT_S + 2.0)
        for conn in silent:
            conn.settimeout(5)
            with contextlib.suppress(ConnectionResetError):
                assert conn.recv(1) == b"", "the server closes a silent connection"
            conn.close()


def test_a_connection_past_its_tls_handshake_waits_for_its_first_request_as_a_kept_alive_one(server: Server) -> None:
    """Go's HTTP client (kube-apiserver's) keeps a connection it dialled for a review that another connection
    served idle in its pool; held to IO_TIMEOUT_S as a stalled request is, it was closed after 5 s, and a review
    sent on it as it closed failed the call (a POST on a connection never used is not retried). Found by a review
    of the protocol."""
    from webhook.workers import IO_TIMEOUT_S

    context = ssl.create_default_context(cafile=str(server.ca))
    body = json.dumps(review(gpu_pod())).encode()
    logged = len(server.output())
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    with context.wrap_socket(raw, server_hostname=SERVER_NAME) as tls:  # the handshake, then nothing
        time.sleep(IO_TIMEOUT_S + 1.5)
        tls.sendall(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        tls.sendall(b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert "silent for" not in server.output()[logged:]


def test_a_client_that_stops_inside_its_first_tls_record_is_closed_after_the_io_timeout(server: Server) -> None:
    """The first read past the handshake that would wait took the connection for one awaiting its first request,
    even with half a TLS record of it in: a client that stopped there was held on the poller, its wait renewed by
    each byte (found by a review of this session's commits). Only a client that has sent nothing waits so."""
    from webhook.workers import IO_TIMEOUT_S

    context = ssl.create_default_context(cafile=str(server.ca))
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=SERVER_NAME)
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=30)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            raw.sendall(outgoing.read())
            incoming.write(raw.recv(65536))
    raw.sendall(outgoing.read())
    tls.write(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n")
    record = outgoing.read()
    raw.sendall(record[: len(record) // 2])
    started = time.monotonic()
    with contextlib.suppress(ConnectionResetError):
        while raw.recv(65536):
            pass
    assert time.monotonic() - started < IO_TIMEOUT_S + 3
    raw.close()


@pytest.mark.parametrize("host", ["", "[::]"])
def test_by_default_the_server_listens_over_ipv6_and_ipv4(tmp_path: Path, host: str) -> None:
    """The chart gives no --host: an IPv6-only cluster's kubelet and API server reach the pod by its IPv6 address,
    and the server listened on 0.0.0.0 alone (its probes refused, every GPU pod refused under failurePolicy Fail);
    an IPv6 address written as in a URL ('[::]') was handed to gunicorn as ':::port' and to prometheus unchanged."""
    from webhook.server import listen_addresses

    if listen_addresses("") != ["::"]:
        pytest.skip("this machine's IPv6 sockets do not take IPv4 connections (or it has no IPv6)")
    with serve(tmp_path, extra_args=["--host", host]) as server:  # ready: /readyz answered over 127.0.0.1
        context = ssl.create_default_context(cafile=str(server.ca))
        for address in ("::1", "127.0.0.1"):
            raw = socket.create_connection((address, server.port), timeout=10)
            with context.wrap_socket(raw, server_hostname=SERVER_NAME) as tls:
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: webhook\r\nConnection: close\r\n\r\n")
                assert tls.recv(64).startswith(b"HTTP/1.1 200"), address
            with socket.create_connection((address, server.metrics_port), timeout=10) as plain:
                plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: metrics\r\nConnection: close\r\n\r\n")
                assert plain.recv(64).startswith(b"HTTP/1.0 200"), address
        assert f"serving on https://[::]:{server.port} " in server.output()


def test_clients_that_neither_read_nor_close_do_not_hold_up_the_reviews(tmp_path: Path) -> None:
    """gunicorn closes a connection that is not kept alive on its worker's main thread, and waited there up to 2 s
    for the client to close its side (RFC 9112's graceful close): meanwhile the worker accepted nothing, and a
    client that asks for `Connection: close` and then reads nothing and never closes held every review of the
    worker 2 s, N of them 2N s (40: 49 s; gunicorn's arbiter killed the worker at times). Found by a review that
    attacked the real server."""
    with serve(tmp_path, workers=1) as server:
        context = ssl.create_default_context(cafile=str(server.ca))
        body = json.dumps(review(gpu_pod())).encode()
        ask = HEAD.replace(b"/mutate", b"/validate") + b"Content-Length: %d\r\n\r\n" % len(body) + body
        held = []
        for _ in range(10):
            raw = socket.create_connection(("127.0.0.1", server.port), timeout=30)
            tls = context.wrap_socket(raw, server_hostname=SERVER_NAME)
            tls.sendall(ask)  # its answer is never read, the connection never closed
            held.append(tls)
        try:
            time.sleep(0.5)
            waited = _a_review_waited(server)
            assert waited < 1.5, f"the review waited {waited:.1f} s behind 10 clients that did not close"
        finally:
            for tls in held:
                tls.close()


@pytest.mark.parametrize(
    ("v6only", "fails", "expected"),
    [(0, False, ["::"]), (1, False, ["0.0.0.0", "::"]), (0, True, ["0.0.0.0"])],
)
def test_every_address_is_listened_on_however_the_kernel_takes_ipv6(
    monkeypatch: pytest.MonkeyPatch, v6only: int, fails: bool, expected: list[str]
) -> None:
    """Where IPv6 sockets take IPv6 alone (net.ipv6.bindv6only=1), '::' alone left IPv4 clients out and 0.0.0.0
    alone IPv6 ones (an IPv6-only cluster): both are listened on then; without IPv6, 0.0.0.0."""
    from webhook import server as module

    class Probe:
        def __init__(self, *args: Any) -> None:
            if fails:
                raise OSError(97, "Address family not supported by protocol")

        def __enter__(self) -> Probe:
            return self

        def __exit__(self, *args: Any) -> None:
            pass

        def bind(self, address: Any) -> None:
            pass

        def getsockopt(self, *args: Any) -> int:
            return v6only

    monkeypatch.setattr(socket, "socket", Probe)  # the module's, as webhook.server reads it
    assert module.listen_addresses("") == expected
    assert module.listen_addresses("10.0.0.7") == ["10.0.0.7"]


def test_the_served_certificates_expiry_is_a_metric_and_told_when_near(tmp_path: Path) -> None:
    """A renewal that fails for weeks went unseen until every call failed: nothing read the served certificate's
    dates (found by a review of the certificates' lifecycle). Its expiry is a gauge, and the log says when it is
    near."""
    from cryptography import x509

    certs = issue_certs(tmp_path / "certs", days=5, extra=["--renew-within-days", "1"])
    expires = x509.load_pem_x509_certificate((certs / "tls.crt").read_bytes()).not_valid_after_utc.timestamp()
    with serve(tmp_path, certs=certs) as server:
        deadline = time.monotonic() + 10
        line = ""
        while time.monotonic() < deadline and not line:
            found = [
                row
                for row in server.metrics().splitlines()
                if row.startswith("gpu_admission_serving_certificate_expiry_timestamp_seconds ")
            ]
            line = found[0] if found else ""
            time.sleep(0.2)
        assert line and abs(float(line.split()[1]) - expires) < 1, line
        assert "expires in 5.0 days and has not been renewed" in server.output() or (
            "expires in 4.9 days and has not been renewed" in server.output()
        ), server.output()[-2000:]


def _expiry(server: Server, deadline_s: float = 15.0) -> float | None:
    """The serving certificate's expiry as /metrics says it, once it says it (within ``deadline_s``)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            for row in server.metrics().splitlines():
                if row.startswith("gpu_admission_serving_certificate_expiry_timestamp_seconds "):
                    return float(row.split()[1])
        time.sleep(0.2)
    return None


def test_the_certificates_expiry_is_a_metric_from_each_workers_start_before_any_connection(tmp_path: Path) -> None:
    """Found by the observability review: a worker set the gauge as it built its TLS context, at its first
    connection; after a start, and after a worker restarted (a dead worker's value leaves the sums), the documented
    expiry alert had no series until a client connected. No TLS connection is made here."""
    from cryptography import x509

    certs = issue_certs(tmp_path / "certs", days=90)
    expires = x509.load_pem_x509_certificate((certs / "tls.crt").read_bytes()).not_valid_after_utc.timestamp()
    with serve(tmp_path, certs=certs, wait=False) as server:
        assert _expiry(server) == pytest.approx(expires, abs=1), server.output()[-3000:]
        (victim,) = re.findall(r"Booting worker with pid: (\d+)", server.output())
        os.kill(int(victim), signal.SIGKILL)
        deadline = time.monotonic() + 15
        while glob.glob(str(tmp_path / "metrics" / f"*livemin*_{victim}.db")) or server.output().count("Booting") < 2:
            assert time.monotonic() < deadline, server.output()[-3000:]
            time.sleep(0.05)
        assert _expiry(server) == pytest.approx(expires, abs=1), server.output()[-3000:]


def _gauge(server: Server, name: str) -> float | None:
    for row in server.metrics().splitlines():
        if row.startswith(name + " "):
            return float(row.split()[1])
    return None


def _healthz(server: Server) -> int | str:
    client = server.client(timeout=5)
    try:
        return client.request("GET", "/healthz")[0]
    except OSError as err:  # ssl.SSLError among them
        return type(err).__name__
    finally:
        client.close()


@pytest.mark.parametrize("broken", ["removed", "garbage"])
def test_a_worker_that_starts_without_its_certificate_says_so_in_a_metric_and_one_line(
    tmp_path: Path, broken: str
) -> None:
    """Found by the observability review: the certificate file replaced or removed, a restarted worker loaded none;
    every handshake failed, the expiry gauge left /metrics, so the documented expiry alert stayed silent, and a
    removed file logged a 45-line traceback per connection. gpu_admission_serving_certificate_loaded says 0, and a
    warning says which files, once a check."""
    certs = issue_certs(tmp_path / "certs")
    cert = certs / "tls.crt"
    good = cert.read_bytes()
    with serve(tmp_path, certs=certs) as server:
        assert _gauge(server, "gpu_admission_serving_certificate_loaded") == 1.0, server.output()[-3000:]
        if broken == "removed":
            cert.unlink()
        else:
            cert.write_text("not a certificate\n")
        (victim,) = re.findall(r"Booting worker with pid: (\d+)", server.output())
        os.kill(int(victim), signal.SIGKILL)
        deadline = time.monotonic() + 15
        while _gauge(server, "gpu_admission_serving_certificate_loaded") != 0.0:
            assert time.monotonic() < deadline, server.output()[-3000:]
            time.sleep(0.1)
        failed = [_healthz(server) for _ in range(5)]
        assert all(isinstance(result, str) for result in failed), failed  # closed: an OSError on the client's side
        restarted = server.output().split("Booting worker with pid: ", 2)[2]
        assert "Traceback" not in restarted and "Socket error" not in restarted, restarted[-3000:]
        assert 1 <= restarted.count("no serving certificate loaded: cannot load " + str(cert)) <= 3, restarted
        cert.write_bytes(good)
        time.sleep(ReloadingTLS.CHECK_EVERY)
        assert _healthz(server) == 200
        assert _gauge(server, "gpu_admission_serving_certificate_loaded") == 1.0


def test_without_its_files_the_tls_context_closes_connections_and_warns_once_a_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A removed certificate raised FileNotFoundError at every connection, which gunicorn logged with its traceback
    (found by the observability review): now an SSL EOF (gunicorn closes the connection without a word) and one
    warning a check; the files back, the next check loads them."""
    tls = ReloadingTLS(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    for _ in range(20):
        with pytest.raises(ssl.SSLEOFError) as err:
            tls.context()
        assert err.value.args[0] == ssl.SSL_ERROR_EOF
    told = [r.getMessage() for r in caplog.records if "no serving certificate loaded" in r.getMessage()]
    assert len(told) == 1 and str(tmp_path / "tls.crt") in told[0] and "No such file" in told[0], told
    certs = issue_certs(tmp_path / "certs")
    for name in ("tls.crt", "tls.key"):
        (tmp_path / name).write_bytes((certs / name).read_bytes())
    time.sleep(ReloadingTLS.CHECK_EVERY)
    assert isinstance(tls.context(), ssl.SSLContext)


def test_an_encrypted_serving_key_fails_at_once_saying_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``serve --key`` an encrypted key: OpenSSL asked for a pass phrase on the terminal ("Enter PEM pass phrase:")
    and waited, and said '[Errno 22] Invalid argument' without one (found by a review). It fails at once, saying the
    key is encrypted and to decrypt it; a worker whose key is rotated to an encrypted one keeps serving."""
    from cryptography.hazmat.primitives import serialization

    from webhook.cli import check_serving_pair
    from webhook.errors import InputError

    certs = issue_certs(tmp_path / "certs")
    key = serialization.load_pem_private_key((certs / "tls.key").read_bytes(), None)
    encrypted = tmp_path / "tls.enc.key"
    encryption = serialization.BestAvailableEncryption(b"secret")
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    with pytest.raises(InputError) as raised:
        check_serving_pair(str(certs / "tls.crt"), str(encrypted))
    assert str(raised.value) == (
        f"--key ({encrypted}) is encrypted; the webhook cannot use an encrypted key: decrypt it"
        " (openssl pkey -in KEY -out DECRYPTED) and give --key the decrypted key"
    )
    tls = ReloadingTLS(str(certs / "tls.crt"), str(encrypted))
    with pytest.raises(ssl.SSLEOFError):
        tls.context()
    assert any("is encrypted" in r.getMessage() for r in caplog.records)

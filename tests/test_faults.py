"""Faults against the real server (issue 10): SIGTERM under load, and the certificate files replaced under load.

Both run ``gpu-admission serve`` (gunicorn gthread, TLS) on loopback with two workers and several client threads
that verify the server the way kube-apiserver does (``tests.serving.ApiserverClient``'s trust and server name).
The node-watch faults (dropped watch, 410, API server unreachable at start) are in ``tests/test_watch.py``.

What gunicorn's gthread worker does on SIGTERM (gunicorn/workers/gthread.py ``run``): it stops accepting, lets
requests in flight finish (up to ``graceful_timeout``), keeps idle keep-alive connections open for at most
``STOP_KEEPALIVE_LINGER`` (2 s) answering a request that arrives on one with ``Connection: close``, then closes the
rest. A client sees a kept-alive connection closed between requests, which the apiserver (Go net/http) notices and
redials; a request already sent is answered in full.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography import x509

from tests.serving import REPO, SERVER_NAME, Server, issue_certs, serve

NODES = REPO / "examples" / "nodes.yaml"


def heavy_review(containers: int = 600) -> bytes:
    """A pod whose review takes long enough (tens to hundreds of ms) to be caught in flight. Its annotation gets the
    request's uid (``Conn.send``), so every request is a new object and none gets a reused answer."""
    annotations = {"gpu-admission.io/spot": "tolerate", "faults.gpu-admission.io/request": "UID"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "heavy", "namespace": "default", "annotations": annotations},
        "spec": {
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "nvidia/cuda:12.2.2-base-ubuntu22.04",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
                for i in range(containers)
            ]
        },
    }
    return json.dumps(_review(pod)).encode()


def _review(obj: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "UID",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "default",
            "userInfo": {"username": "alice"},
            "object": obj,
        },
    }


def light_review() -> bytes:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "light"},
        "spec": {
            "containers": [
                {
                    "name": "t",
                    "image": "nvidia/cuda:12.2.2-base-ubuntu22.04",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }
    return json.dumps(_review(pod)).encode()


class Conn:
    """One keep-alive HTTPS connection verified as the apiserver does; records the peer certificate's serial."""

    def __init__(self, server: Server, timeout: float = 30.0) -> None:
        context = ssl.create_default_context(cafile=str(server.ca))
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
        self.sock = context.wrap_socket(raw, server_hostname=SERVER_NAME)
        der = self.sock.getpeercert(binary_form=True)
        assert der is not None
        self.serial = x509.load_der_x509_certificate(der).serial_number
        self.http = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
        self.http.sock = self.sock

    def send(self, body: bytes, path: str = "/mutate") -> str:
        uid = str(uuid.uuid4())
        self.http.request(
            "POST",
            path,
            body=body.replace(b'"UID"', json.dumps(uid).encode()),
            headers={"Content-Type": "application/json"},
        )
        return uid

    def answer(self, uid: str) -> tuple[int, str]:
        """Status and Connection header of a complete, valid answer to ``uid``; raises on anything less."""
        response = self.http.getresponse()
        payload = response.read()
        assert len(payload) == int(response.getheader("Content-Length", "-1")), "answer cut short"
        body = json.loads(payload)
        assert response.status == 200, body
        assert body["response"]["uid"] == uid
        return response.status, (response.getheader("Connection") or "").lower()

    def close(self) -> None:
        self.http.close()


def serial_of(path: Path) -> int:
    return x509.load_pem_x509_certificate(path.read_bytes()).serial_number


# -- SIGTERM under load ----------------------------------------------------------------------------------------------


@dataclass
class Load:
    """Client threads sending keep-alive requests until told to stop; every request sent is recorded."""

    server: Server
    body: bytes
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    sent: list[tuple[float, str]] = field(default_factory=list)
    """(time the request was fully written, uid)"""
    answered: dict[str, float] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    """Requests that were sent and not answered in full, with why."""

    def worker(self) -> None:
        conn = Conn(self.server)
        try:
            while not self.stop.is_set():
                uid = conn.send(self.body)
                sent_at = time.monotonic()
                with self.lock:
                    self.sent.append((sent_at, uid))
                    self.in_flight += 1
                try:
                    _, connection = conn.answer(uid)
                except Exception as err:
                    with self.lock:
                        self.failures.append(f"{uid}: {type(err).__name__}: {err}")
                    return
                finally:
                    with self.lock:
                        self.in_flight -= 1
                with self.lock:
                    self.answered[uid] = time.monotonic()
                if connection == "close":
                    return
        finally:
            conn.close()


def test_sigterm_under_load_completes_every_request_in_flight(tmp_path: Path) -> None:
    with serve(tmp_path, nodes=NODES, workers=2) as server:
        load = Load(server, heavy_review())
        threads = [threading.Thread(target=load.worker, daemon=True) for _ in range(6)]
        for t in threads:
            t.start()
        idle = [Conn(server) for _ in range(2)]  # kept-alive connections that are idle at SIGTERM
        for c in idle:
            c.answer(c.send(light_review()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (len(load.answered) < 12 or load.in_flight < 4):
            time.sleep(0.005)
        assert load.in_flight >= 4, f"no load in flight to test with ({len(load.answered)} answered)"
        term_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        load.stop.set()

        # An idle kept-alive connection used right after SIGTERM is still answered, with Connection: close. Sent
        # once the master has passed the signal on (a request quicker than that is answered by a worker that
        # has not heard of it yet), well inside the 2 s that a stopping worker keeps idle connections.
        signalled = time.monotonic() + 10
        while "Handling signal: term" not in server.output() and time.monotonic() < signalled:
            time.sleep(0.01)
        time.sleep(0.3)
        late = idle[0]
        status, connection = late.answer(late.send(light_review()))
        assert status == 200 and connection == "close"
        for t in threads:
            t.join(timeout=40)
        assert server.proc.wait(timeout=40) == 0, server.output()[-2000:]

        # An idle kept-alive connection left alone is closed by the server between requests (EOF, no bytes).
        quiet = idle[1]
        quiet.sock.settimeout(5)
        try:
            leftover = quiet.sock.recv(1)
        except (ssl.SSLError, ConnectionResetError, OSError):
            leftover = b""
        assert leftover == b""

    sent_before = [uid for at, uid in load.sent if at < term_at]
    in_flight_at_term = [uid for at, uid in load.sent if at < term_at and load.answered.get(uid, 1e18) > term_at]
    assert not load.failures, load.failures
    assert all(uid in load.answered for uid in sent_before), "a request sent before SIGTERM got no full answer"
    assert in_flight_at_term, "SIGTERM must have caught requests in flight"
    assert "Traceback" not in server.output()
    # Each answered request's decision log line was written by the worker before it exited (the last few ms of
    # them wait in webhook/outbox.py for the bursts after them).
    lines = [json.loads(line) for line in server.output().splitlines() if line.startswith("{")]
    missing = set(load.answered) - {line.get("uid") for line in lines if "decision" in line}
    assert not missing, f"{len(missing)} answered requests have no decision log line"


def test_a_connection_whose_handshake_ends_as_its_worker_stops_is_answered(tmp_path: Path) -> None:
    """A stopping worker keeps its kept-alive connections for gunicorn's linger and answers them with Connection:
    close; one past its handshake that has sent no request yet is kept so too. A change of this session closed it
    at once, and Go does not send a POST again on a connection it never used (found by a review of it)."""
    with serve(tmp_path, workers=1) as server:
        worker = int(re.findall(r"Booting worker with pid: (\d+)", server.output())[-1])
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        time.sleep(0.3)  # accepted: it waits for its ClientHello on the worker's poller
        os.kill(worker, signal.SIGTERM)  # the worker stops (the master starts another)
        time.sleep(0.3)
        context = ssl.create_default_context(cafile=str(server.ca))
        with context.wrap_socket(raw, server_hostname=SERVER_NAME) as tls:
            time.sleep(0.2)  # the request a moment after the handshake
            body = light_review()
            tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
            tls.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
            answer = tls.recv(65536)
        assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" in answer, answer[:300]


# -- certificate files replaced under load ---------------------------------------------------------------------------


def rotate(certs: Path) -> None:
    """Renew the serving certificate in place with the project's tool (atomic replace; the CA is kept)."""
    issue_certs(certs, days=400, extra=("--renew-within-days", "399"))


def test_certificate_files_replaced_under_load(tmp_path: Path) -> None:
    certs = issue_certs(tmp_path / "certs", days=60)
    old_serial = serial_of(certs / "tls.crt")
    with serve(tmp_path, nodes=NODES, workers=2, certs=certs) as server:
        stop = threading.Event()
        failures: list[str] = []
        handshakes: list[tuple[float, int]] = []
        kept_alive = [0]
        lock = threading.Lock()

        def fresh_connections() -> None:
            """A new TLS handshake for every request, as after the apiserver drops idle connections."""
            while not stop.is_set():
                try:
                    conn = Conn(server)
                    conn.answer(conn.send(light_review(), "/validate"))
                    conn.close()
                    with lock:
                        handshakes.append((time.monotonic(), conn.serial))
                except Exception as err:
                    failures.append(f"fresh: {type(err).__name__}: {err}")
                    return

        def keep_alive() -> None:
            """One connection for the whole test: the swap must not disturb it."""
            conn = Conn(server)
            try:
                while not stop.is_set():
                    conn.answer(conn.send(light_review()))
                    kept_alive[0] += 1
            except Exception as err:
                failures.append(f"keep-alive: {type(err).__name__}: {err}")
            finally:
                conn.close()

        threads = [
            threading.Thread(target=f, daemon=True)
            for f in (fresh_connections, fresh_connections, keep_alive, keep_alive)
        ]
        for t in threads:
            t.start()
        time.sleep(1.0)
        rotate(certs)
        rotated_at = time.monotonic()
        new_serial = serial_of(certs / "tls.crt")
        assert new_serial != old_serial, "the tool must have issued a new certificate"
        time.sleep(3.5)
        stop.set()
        for t in threads:
            t.join(timeout=30)

    assert not failures, failures
    before = [s for at, s in handshakes if at < rotated_at - 0.5]
    settled = [s for at, s in handshakes if at > rotated_at + 2.0]
    assert before and set(before) == {old_serial}
    assert len(settled) >= 5, "too few handshakes after the swap to judge"
    assert set(settled) == {new_serial}, "new handshakes must present the new certificate within ~2 s"
    assert kept_alive[0] > 10


def _closed_by_server(sock: socket.socket, within: float) -> bool:
    """True when the server closes ``sock`` within ``within`` seconds (EOF or reset), False if it is still open."""
    sock.settimeout(within)
    try:
        return sock.recv(1024) == b""
    except (ConnectionResetError, ssl.SSLError):
        return True
    except TimeoutError:
        return False


def test_a_body_over_the_limit_gets_its_413_and_the_connection_closes_at_once(tmp_path: Path) -> None:
    """A body announced at more than DRAIN_FACTOR times the limit gets its 413 unread, and gunicorn would wait 5 s
    for the rest to drain it (a request thread held by a client that said it sends 64 MiB and stopped); the worker
    waits DATA_WAIT_S, then closes the connection."""
    from webhook.app import DRAIN_FACTOR
    from webhook.config import Settings
    from webhook.workers import DATA_WAIT_S

    announced = 64 << 20
    assert announced > DRAIN_FACTOR * Settings().max_body_bytes

    with serve(tmp_path, nodes=NODES, workers=1) as server:
        context = ssl.create_default_context(cafile=str(server.ca))
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        sock = context.wrap_socket(raw, server_hostname=SERVER_NAME)
        head = "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        sock.sendall((head % announced).encode() + b" " * 1024)
        began = time.monotonic()
        sock.settimeout(2.0)
        answer = b""
        while chunk := sock.recv(4096):  # to the end: the server closes the connection
            answer += chunk
        closed = time.monotonic() - began
        assert answer.startswith(b"HTTP/1.1 413 ") and b"over the limit" in answer
        assert closed < 1.0, f"the connection stayed open {closed:.1f} s (DATA_WAIT_S is {DATA_WAIT_S} s)"
        sock.close()
        status, _ = server.client().post("/mutate", json.loads(light_review()))
        assert status == 200


def test_clients_that_stall_hold_no_review_up_and_are_disconnected(tmp_path: Path) -> None:
    """One worker, whose request threads take turns: a client that connects and sends nothing, one that stops
    halfway through the TLS handshake, one that completes it and sends no request (as Go's HTTP client does with a
    connection it dialled for a request that another connection took), and one that stops halfway through a
    request. A review sent behind them is answered at once, by another thread; the server closes the two that
    stopped halfway after IO_TIMEOUT_S (gunicorn alone would wait for ever) and logs each in one line. The one
    past its handshake waits on the poller as a kept-alive connection does (KEEPALIVE_S): closed at
    IO_TIMEOUT_S, a review Go sent on it as it closed failed the call (a review of the protocol)."""
    from webhook.workers import IO_TIMEOUT_S

    with serve(tmp_path, nodes=NODES, workers=1) as server:
        context = ssl.create_default_context(cafile=str(server.ca))

        def tls() -> ssl.SSLSocket:
            raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            return context.wrap_socket(raw, server_hostname=SERVER_NAME)

        idle = socket.create_connection(("127.0.0.1", server.port))
        half_hello = socket.create_connection(("127.0.0.1", server.port))
        half_hello.sendall(bytes.fromhex("160301020001"))  # a ClientHello's record header and a byte of it
        no_request = tls()
        half_request = tls()
        half_request.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
        time.sleep(0.3)
        for _ in range(3):
            started = time.monotonic()
            client = server.client(timeout=4 * IO_TIMEOUT_S)
            status, body = client.post("/mutate", json.loads(light_review()))
            waited = time.monotonic() - started
            client.close()
            assert status == 200 and body["response"]["allowed"] is True
            assert waited < 1.0, f"the review waited {waited:.1f} s behind the stalled clients"
        # while the server closes them (about IO_TIMEOUT_S after they went quiet), reviews keep their pace
        steady, slowest, stop = server.client(timeout=4 * IO_TIMEOUT_S), [0.0], threading.Event()

        def keep_reviewing() -> None:
            while not stop.is_set():
                began = time.monotonic()
                assert steady.post("/mutate", json.loads(light_review()))[0] == 200
                slowest[0] = max(slowest[0], time.monotonic() - began)
                time.sleep(0.02)

        reviewer = threading.Thread(target=keep_reviewing, daemon=True)
        reviewer.start()
        for stalled in (half_hello, half_request):
            assert _closed_by_server(stalled, IO_TIMEOUT_S + 2)
        assert not _closed_by_server(no_request, 0.5)
        body = light_review()
        head = b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
        no_request.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
        no_request.settimeout(10)
        assert no_request.recv(64).startswith(b"HTTP/1.1 200")
        no_request.close()
        time.sleep(0.5)
        stop.set()
        reviewer.join(10)
        steady.close()
        assert slowest[0] < 1.0, f"a review took {slowest[0]:.1f} s while the stalled clients were closed"
        idle.close()
        assert server.output().count(f"silent for {IO_TIMEOUT_S:g} s") == 2
        assert "Traceback" not in server.output()

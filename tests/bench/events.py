"""What one Event costs the process that sends it: CPU time of the sending thread per Event, per sink.

Every GPU pod admitted at /validate gets an Event, sent by the Events relay process (``webhook/events.py``), so in
a cluster its CPU comes out of the pod's cores. The servers of the bench log their Events (``LogSink``: there is no
apiserver here to post them to); this measures the API's way too, with the real ``kubernetes`` client's
configuration, over TLS (as in a cluster) and plain HTTP to ``tests/kubeapi.py`` in this process
(``time.thread_time`` counts only the sending thread, not the server's threads). The client is configured as in a
cluster (a bearer token, no kubeconfig re-read per request).
"""

from __future__ import annotations

import dataclasses
import fcntl
import http.client
import itertools
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kubernetes import client

from tests.kubeapi import KubeAPI
from tests.serving import issue_certs
from webhook.admission import subject_of
from webhook.events import (
    PIPE_BYTES,
    SENDING_AT_ONCE,
    ApiSink,
    EventPipe,
    LogSink,
    Sender,
    _Direct,
    event_body,
    run_relay,
)
from webhook.model import JSON, Event

POD: JSON = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "triton-7c9f5d8b6d-x2x8k", "namespace": "default", "uid": "5f8c1d2e-7a4b-4c3d-9e2f-01"},
}
EVENT = Event(
    "CUDAChecked",
    "container triton (image nvcr.io/nvidia/tritonserver:24.05-py3) needs CUDA 12.4 (from the image's tag): "
    "the eligible nodes' drivers support it (550.54.15 on 12 nodes)",
)


_PODS = itertools.count()
"""Numbers the pods of the Events sent: one pod's report again is its Event's count raised, not a create."""


def _body() -> JSON:
    pod = {**POD, "metadata": {**POD["metadata"], "uid": f"5f8c1d2e-7a4b-4c3d-9e2f-{next(_PODS):012x}"}}
    return event_body(subject_of(pod), "default", "triton-7c9f5d8b6d-x2x8k", EVENT, "bench")


def _per_event_us(send: Callable[[JSON], object], count: int) -> float:
    for _ in range(max(count // 10, 3)):
        send(_body())
    began = time.thread_time()
    for _ in range(count):
        send(_body())
    return (time.thread_time() - began) / count * 1e6


def _devnull_logger() -> logging.Logger:
    logger = logging.getLogger("gpu_admission.bench.events")
    if not logger.handlers:
        logger.addHandler(logging.FileHandler(os.devnull))
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


class _HttpClientDirect(_Direct):
    """``_Direct`` as it was before ``webhook.http1``: ``http.client``'s kept-alive connection (the row to compare
    with)."""

    old: http.client.HTTPConnection | None = None

    def request(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, str, bytes, dict[bytes, bytes]]:
        if self.old is None:
            self.old = (
                http.client.HTTPSConnection(self.address, self.port, timeout=self.timeout, context=self.tls)
                if self.tls is not None
                else http.client.HTTPConnection(self.address, self.port, timeout=self.timeout)
            )
        self.old.request(method, self.prefix + path, body=body, headers=headers)
        response = self.old.getresponse()
        head = {k.lower().encode("latin-1"): v.encode("latin-1") for k, v in response.getheaders()}
        return response.status, response.reason, response.read(), head


def _configured(api: KubeAPI, ca: str | None = None) -> client.ApiClient:
    configuration = client.Configuration(host=api.url, api_key={"authorization": "test-token"})
    configuration.api_key_prefix = {"authorization": "Bearer"}
    configuration.ssl_ca_cert = ca
    return client.ApiClient(configuration)


def _with_http_client(sink: ApiSink) -> ApiSink:
    direct = _HttpClientDirect.of(sink.server.client.configuration, sink.timeout)
    sink.server = dataclasses.replace(sink.server, direct=direct)
    return sink


def event_costs(count: int = 200) -> list[tuple[str, float]]:
    """(sink, microseconds of the sending thread's CPU per Event), building the Event body included: over TLS, as
    in a cluster, and over plain HTTP (the client's own paths, which cost the same TLS on top)."""
    out: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="gpu-admission-bench-events-") as tmp:
        certs = issue_certs(Path(tmp))
        tls_api = KubeAPI(tls=(str(certs / "tls.crt"), str(certs / "tls.key")), ca=str(certs / "ca.crt")).start()
        try:
            ca = str(certs / "ca.crt")
            out += [
                (
                    "TLS: the webhook's ApiSink (`webhook/http1.py`, one kept-alive connection per sending thread)",
                    _per_event_us(ApiSink(_configured(tls_api, ca)).send, count),
                ),
                (
                    "TLS: the same over `http.client`'s connection (before)",
                    _per_event_us(_with_http_client(ApiSink(_configured(tls_api, ca))).send, count),
                ),
            ]
        finally:
            tls_api.stop()
    api = KubeAPI().start()
    try:
        api_client = _configured(api)
        generated = client.CoreV1Api(api_client)
        client_path = ApiSink(api_client)
        client_path.server = dataclasses.replace(
            client_path.server, direct=None
        )  # as for a configuration only the client honours (a proxy, ...)
        return [
            *out,
            ("HTTP: the webhook's ApiSink", _per_event_us(ApiSink(api_client).send, count)),
            (
                "HTTP: the same over `http.client`'s connection (before)",
                _per_event_us(_with_http_client(ApiSink(api_client)).send, count),
            ),
            (
                "HTTP: the client's param_serialize and call_api (urllib3; before that, and where a proxy is set)",
                _per_event_us(client_path.send, count),
            ),
            (
                "HTTP: the generated CoreV1Api.create_namespaced_event (before that; pydantic models both ways)",
                # the client's models accept the plain dict (pydantic validates it into a CoreV1Event)
                _per_event_us(lambda body: generated.create_namespaced_event("default", body), count),  # type: ignore[arg-type]
            ),
            ("LogSink (the bench's servers; a JSON log line)", _per_event_us(LogSink(_devnull_logger()).send, count)),
        ]
    finally:
        api.stop()


def relay_rates(round_trip_s: float = 0.005, count: int = 400) -> list[tuple[str, float]]:
    """(how, Events a second) the relay (``run_relay``) sends to an API server that takes ``round_trip_s`` to
    answer each create, ``count`` Events written to its pipe at once: one at a time, and as it sends them."""
    out = []
    ways = (("one at a time (before)", 1), (f"{SENDING_AT_ONCE} at once (the relay now)", SENDING_AT_ONCE))
    for how, at_once in ways:
        api = KubeAPI().start()
        try:
            api.create_delay = round_trip_s
            sink = ApiSink(_configured(api))
            sink.concurrency = at_once
            sender = Sender(sink)
            read_fd, write_fd = os.pipe()
            fcntl.fcntl(write_fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)  # as start_relay does
            pipe = EventPipe(write_fd)
            for n in range(count):
                pipe.submit(event_body(subject_of(POD), "default", f"pod-{n}", EVENT, "bench"))
            os.close(write_fd)
            began = time.monotonic()
            relay = threading.Thread(target=run_relay, args=(read_fd, sender))
            relay.start()
            relay.join(120)
            seconds = time.monotonic() - began
            if sender.sent != count:
                raise RuntimeError(f"the relay sent {sender.sent} of {count} Events ({sender.failed} failed)")
            out.append((how, count / seconds))
        finally:
            api.stop()
    return out

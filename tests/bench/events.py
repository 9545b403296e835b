"""What one Event costs the process that sends it: CPU time of the sending thread per Event, per sink.

Every GPU pod admitted at /validate gets an Event, sent by the Events relay process (``webhook/events.py``), so in
a cluster its CPU comes out of the pod's cores. The servers of the bench log their Events (``LogSink``: there is no
apiserver here to post them to); this measures the API's way too, through the real ``kubernetes`` client over
HTTP to ``tests/kubeapi.py`` in this process (``time.thread_time`` counts only the sending thread, not the server's
threads). The client is configured as in a cluster (a bearer token, no kubeconfig re-read per request).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Callable

from kubernetes import client

from tests.kubeapi import KubeAPI
from webhook.admission import subject_of
from webhook.events import PIPE_BYTES, SENDING_AT_ONCE, ApiSink, EventPipe, LogSink, Sender, event_body, run_relay
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


def _per_event_us(send: Callable[[JSON], object], count: int) -> float:
    for _ in range(max(count // 10, 3)):
        send(event_body(subject_of(POD), "default", "triton-7c9f5d8b6d-x2x8k", EVENT, "bench"))
    began = time.thread_time()
    for _ in range(count):
        send(event_body(subject_of(POD), "default", "triton-7c9f5d8b6d-x2x8k", EVENT, "bench"))
    return (time.thread_time() - began) / count * 1e6


def _devnull_logger() -> logging.Logger:
    logger = logging.getLogger("gpu_admission.bench.events")
    if not logger.handlers:
        logger.addHandler(logging.FileHandler(os.devnull))
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def event_costs(count: int = 200) -> list[tuple[str, float]]:
    """(sink, microseconds of the sending thread's CPU per Event), building the Event body included."""
    api = KubeAPI().start()
    try:
        configuration = client.Configuration(host=api.url, api_key={"authorization": "test-token"})
        configuration.api_key_prefix = {"authorization": "Bearer"}
        api_client = client.ApiClient(configuration)
        generated = client.CoreV1Api(api_client)
        client_path = ApiSink(api_client)
        client_path.direct = None  # as for a configuration only the client honours (a proxy, ...)
        return [
            (
                "the webhook's ApiSink (one kept-alive http.client connection, the client's configuration)",
                _per_event_us(ApiSink(api_client).send, count),
            ),
            (
                "the client's param_serialize and call_api (urllib3; before, and where a proxy is set)",
                _per_event_us(client_path.send, count),
            ),
            (
                "the generated CoreV1Api.create_namespaced_event (before that; pydantic models both ways)",
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
            configuration = client.Configuration(host=api.url, api_key={"authorization": "test-token"})
            configuration.api_key_prefix = {"authorization": "Bearer"}
            sink = ApiSink(client.ApiClient(configuration))
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

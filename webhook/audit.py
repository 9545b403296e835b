"""Where decisions are reported: the JSON decision log, Events on pods, Prometheus metrics.

The HTTP edge calls ``recorder.record(...)`` once per request, whatever the outcome. :class:`Reporter` fans that
out to the three, and a failure in any of them is logged, never raised into the request. :func:`build_recorder`
chooses the Event sink in one place: an ApiClient given, or cluster credentials found (in-cluster, else kubeconfig),
send Events to the API; otherwise (``make run`` with a node file, no cluster access) Events go to the log.

What goes where and why is written up in ``docs/observability.md``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TextIO

from webhook import metrics as _metrics
from webhook import outbox
from webhook.admission import ReviewRequest
from webhook.cluster import ClusterSource
from webhook.config import Settings
from webhook.events import (
    NAME_LIMIT,
    ApiSink,
    EventPipe,
    EventQueue,
    EventSink,
    LogSink,
    Relay,
    Sender,
    api_sink_from_environment,
    pipe_runs,
    start_relay,
)
from webhook.events import instance_name as _instance_name
from webhook.metrics import Metrics
from webhook.model import compact_json
from webhook.pipeline import Result

log = logging.getLogger("gpu_admission.decision")

AUDIT_KEY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
AUDIT_KEY_LIMIT = 63


def valid_audit_key(key: str) -> bool:
    """An auditAnnotations key the apiserver keeps: the name part of a qualified name (it prefixes the webhook's
    name itself), at most 63 characters. Any other key is dropped from the audit log."""
    return len(key) <= AUDIT_KEY_LIMIT and AUDIT_KEY.match(key) is not None


class Recorder(Protocol):
    """What the HTTP edge tells about every request it answered."""

    def record(
        self,
        endpoint: str,
        review: ReviewRequest | None,
        result: Result | None,
        status: int,
        seconds: float,
        error: str = "",
    ) -> None: ...


@dataclass(frozen=True)
class Recorded:
    """One request as the HTTP edge told it (``Recorder.record``), and when."""

    at: float
    endpoint: str
    review: ReviewRequest | None
    result: Result | None
    status: int
    seconds: float
    error: str = ""


_STRING = json.encoder.encode_basestring_ascii
"""A str as ``compact_json`` writes it."""
ERROR_LIMIT = 1024
"""Bytes of the line's ``error`` (a request's other strings get ``NAME_LIMIT``): all the fields at their limits
leave the line well below the 4096 bytes a pipe write keeps whole (``DecisionLog.write``)."""


def _encoded(text: str, limit: int = NAME_LIMIT) -> str:
    """``text`` as the line writes it (``_STRING``), cut to at most ``limit`` bytes between its quotes. A limit in
    characters let a name of 253 emoji through as 3 kB (each is written as 12 bytes, ``\\ud83d\\ude00``; any other
    non-ASCII character as 6), so that a line passed 4096 bytes (found by a review)."""
    text = text[:limit]
    encoded = _STRING(text)
    if len(encoded) - 2 <= limit:
        return encoded
    size = 0
    for end, char in enumerate(text):
        size += len(_STRING(char)) - 2
        if size > limit:
            text = text[:end]
            break
    return _STRING(text)


def clip(text: str, limit: int = NAME_LIMIT) -> str:
    """``text`` as the decision line keeps it (``_encoded``)."""
    return str(json.loads(_encoded(text, limit)))


def decision_line(r: Recorded) -> dict[str, object]:
    """One JSON-able line: names, codes and sizes only; never env values, secrets, messages or whole objects."""
    review, result = r.review, r.result
    line: dict[str, object] = {
        "ts": round(r.at, 3),
        "endpoint": r.endpoint,
        "status": r.status,
        "latency_ms": round(r.seconds * 1000, 3),
    }
    if review:
        line.update(
            uid=clip(review.uid),  # as the names: a client's 5 MiB uid went whole into every line
            namespace=clip(review.namespace),
            name=clip(review.name or review.subject.name),  # names are checked after mutating admission
            generateName=clip(review.subject.generate_name),
            kind=clip(review.kind),
            operation=review.operation,
            dryRun=review.dry_run,
            user=clip(review.username),
        )
    if result:
        line.update(
            decision=result.decision,
            # each once, in order: one per container made a line past the 4096 bytes a pipe write keeps whole
            reasons=list(dict.fromkeys(result.outcome.reasons)),
            mutations=list(dict.fromkeys(result.outcome.mutations)),
            patchOps=result.ops,
            patchBytes=len(result.patch_bytes()) if result.ops else 0,
            warnings=len(result.warnings),
        )
        if result.skipped:
            line["skipped"] = clip(result.skipped)  # it may name the request's kind, of any length
        if result.reused:
            line["reused"] = True
        if result.replayed:
            line["replayed"] = True
    if r.error:
        line["error"] = clip(r.error, ERROR_LIMIT)  # a 415's names the Content-Type the client sent
    return line


RESULT_PARTS_KEPT = 256
"""Stored answers whose part of the line is kept written (``decision_text``)."""
_result_parts: dict[int, tuple[Result, str]] = {}
_HEAD = frozenset(("ts", "endpoint", "status", "latency_ms"))
"""The keys of the line that come before the request's."""


def decision_text(r: Recorded) -> str:
    """``compact_json(decision_line(r))``, written from pieces (``tests/test_audit.py`` holds them equal): the
    request's strings each by the C encoder, and the result's part once per stored answer, which every replica of a
    workload shares (``webhook.decisions``; read only). Under load a line built as a dict cost 27 µs a request in the
    server against 5 in a loop (the caches are cold between requests); this touches a fraction of that."""
    review, result = r.review, r.result
    text = (
        f'{{"ts":{round(r.at, 3)!r},"endpoint":{_STRING(r.endpoint)},"status":{int(r.status)},'
        f'"latency_ms":{round(r.seconds * 1000, 3)!r}'
    )
    if review:
        subject = review.subject
        text += (
            f',"uid":{_encoded(review.uid)},"namespace":{_encoded(review.namespace)},'
            f'"name":{_encoded(review.name or subject.name)},"generateName":{_encoded(subject.generate_name)},'
            f'"kind":{_encoded(review.kind)},"operation":{_STRING(review.operation)},'
            f'"dryRun":{"true" if review.dry_run else "false"},"user":{_encoded(review.username)}'
        )
    if result:
        text += _result_part(result)
    if r.error:
        text += f',"error":{_encoded(r.error, ERROR_LIMIT)}'
    return text + "}"


def _result_part(result: Result) -> str:
    """``,"decision":...`` to the end of the result's keys; kept for a stored (shared, read only) answer."""
    kept = _result_parts.get(id(result)) if result.reused else None
    if kept is not None and kept[0] is result:
        return kept[1]
    fields = decision_line(Recorded(0.0, "", None, result, 0, 0.0))
    part = "," + compact_json({k: v for k, v in fields.items() if k not in _HEAD})[1:-1]
    if result.reused:
        if len(_result_parts) >= RESULT_PARTS_KEPT:
            _result_parts.clear()
        _result_parts[id(result)] = (result, part)
    return part


class DecisionLog:
    """Writes one JSON line per request to stderr (or a given stream)."""

    def __init__(self, settings: Settings, stream: TextIO | None = None) -> None:
        self.enabled = settings.audit.decision_log
        self.stream = stream

    def record(
        self,
        endpoint: str,
        review: ReviewRequest | None,
        result: Result | None,
        status: int,
        seconds: float,
        error: str = "",
    ) -> None:
        self.record_all([Recorded(time.time(), endpoint, review, result, status, seconds, error)])

    def record_all(self, requests: list[Recorded]) -> None:
        """The lines of ``requests``, in as few writes as keep each whole on a pipe that several workers share
        (``pipe_runs``): a longer write, its pipe full, is cut where the kernel likes and the lines interleave."""
        if not self.enabled or not requests:
            return
        for run in pipe_runs([decision_text(r) + "\n" for r in requests]):
            self.write("".join(run))

    def write(self, text: str) -> None:
        out = self.stream or sys.stderr
        out.write(text)
        out.flush()


def request_decision(result: Result | None, status: int) -> str:
    """The ``decision`` label: the pipeline's decision, else ``rejected`` (4xx, bad request) or ``error`` (5xx)."""
    if result is not None:
        return result.decision
    return "error" if status >= 500 else _metrics.REJECTED


def denial_actions(result: Result) -> list[tuple[str, str]]:
    """(reason, action) of the request's refusals, each once (a pod of 8 containers refused for one reason is one
    denial, as its answer and its audit ``decision`` say): ``denied`` when enforced, ``warned`` when warn mode
    admitted it.

    Warn mode shows as the ``<policy>-would-deny`` audit annotation the pipeline writes (its ``again-`` copy,
    ``pipeline.AGAIN``, comes with it, and counts nothing more); a refusal neither enforced nor warned (its policy is
    off) is not counted.
    """
    out: dict[tuple[str, str], None] = {}
    for d in result.outcome.denials:
        if f"{d.policy}-would-deny" in result.audit:
            out[(d.reason, "warned")] = None
        elif not result.allowed:
            out[(d.reason, "denied")] = None
    return list(out)


class Reporter:
    """The recorder the app uses: decision log, metrics, and (from /validate) Events."""

    def __init__(
        self,
        decisions: DecisionLog,
        metrics: Metrics,
        events: EventQueue | EventPipe | None = None,
        instance: str = "",
    ) -> None:
        self.decisions = decisions
        self.metrics = metrics
        self.events = events
        self.instance = instance or _instance_name()

    def start(self) -> None:
        """Background work that must run in the worker (after the fork): the cluster gauges' refresh."""
        self.metrics.start()

    def record(
        self,
        endpoint: str,
        review: ReviewRequest | None,
        result: Result | None,
        status: int,
        seconds: float,
        error: str = "",
    ) -> None:
        """Report a request: at once, or (in the server) with the others of its burst (``report``). What waits does
        not hold the objects (a burst of 64 full-field pods held 30 MB more at its peak): reporting reads neither."""
        if review is not None and (review.object is not None or review.old_object is not None):
            review = dataclasses.replace(review, object=None, old_object=None)
        if result is not None and result.object is not None:
            result = dataclasses.replace(result, object=None)
        outbox.later(self, self.report, Recorded(time.time(), endpoint, review, result, status, seconds, error))

    def report(self, requests: list[Recorded]) -> None:
        """Report ``requests``, in order, each part for all of them at once: the decision log's lines, the
        metrics, the Events of the /validate ones; lines and Events in as few pipe writes as keep each atomic.

        ``record`` hands them here through ``webhook.outbox``: under the server, after the answers went out, when
        the request thread gives its turn up (together with the bursts of the last ``outbox.LINGER_S``). Each write
        is a system call, around which CPython lets the GIL go to gunicorn's main thread, and the request thread
        then waits to get it back: one decision log line cost 40-70 µs of CPU in the server that way, against 1 µs
        in a loop; and what runs between requests runs with cold caches (the line built from a dict: 27 µs there,
        5 in a loop). Done for a burst at once, both go (``docs/benchmarks.md``, 35.)."""
        try:
            self.decisions.record_all(requests)
        except Exception:
            log.exception("cannot write the decision log line")
        for r in requests:
            try:
                self._count(r.endpoint, r.result, r.status, r.seconds)
            except Exception:
                log.exception("cannot update the metrics")
        validated = [(r.review, r.result) for r in requests if r.endpoint == "validate"]
        if validated and self.events is not None:
            try:
                self.events.send_all(validated, self.instance)
            except Exception:
                log.exception("cannot queue events")

    def _count(self, endpoint: str, result: Result | None, status: int, seconds: float) -> None:
        m = self.metrics
        m.request(endpoint, request_decision(result, status), seconds)
        if result is not None:
            if result.reused:
                m.reused(endpoint)
            if endpoint == "mutate" and result.allowed and result.ops:
                for kind in dict.fromkeys(result.outcome.mutations):  # once per request, as denials are
                    m.mutation(kind)
            for reason, action in denial_actions(result):
                m.denial(endpoint, reason, action)


def _sink(api_client: Any | None, discover: bool) -> EventSink:
    """Where Events go: the API when a client is given; with ``discover``, the API of the credentials found
    (in-cluster, else kubeconfig), to the log until they load (``events.AwaitingCredentials``); else the log."""
    if api_client is not None:
        return ApiSink(api_client)
    return api_sink_from_environment() if discover else LogSink()


def build_recorder(
    settings: Settings,
    cluster: ClusterSource | None = None,
    api_client: Any | None = None,
    discover: bool = False,
    sink: EventSink | None = None,
    stream: TextIO | None = None,
    relay_fd: int | None = None,
) -> Reporter:
    """The one place that decides where Events go.

    ``relay_fd`` given (``gpu-admission serve``): to the relay process, through its pipe (``start_event_relay``
    chose the sink). Else ``sink`` given: that one (tests). Else as ``_sink`` says, from a queue in this process.
    ``settings.audit.events: false``: no Events at all. Build it in the worker (gunicorn's app factory runs after
    the fork); nothing here starts a thread before it is needed.
    """
    metrics = Metrics(cluster)
    events: EventQueue | EventPipe | None = None
    if settings.audit.events:
        if relay_fd is not None:
            events = EventPipe(relay_fd, counted=metrics.event)
        else:
            events = EventQueue(sink or _sink(api_client, discover), settings.audit.event_queue_size, metrics.event)
    reporter = Reporter(DecisionLog(settings, stream), metrics, events)
    if metrics.multiprocess:
        reporter.start()
    return reporter


def start_event_relay(settings: Settings, discover: bool) -> Relay | None:
    """Fork the Events relay (``events.start_relay``) for ``gpu-admission serve``; None when Events are off. The
    sink is chosen, and the Events counted, in the relay (``_sink``)."""
    if not settings.audit.events:
        return None

    def sender() -> Sender:
        return Sender(_sink(None, discover), _metrics.event_counter())

    return start_relay(sender)


def start_metrics_server(port: int, addrs: Sequence[str] = ("0.0.0.0",)) -> list[str]:
    """Serve Prometheus text on ``port`` of each address (plain HTTP) from the gunicorn master, aggregating every
    worker; the addresses it listens on."""
    return _metrics.start_metrics_server(port, addrs)


def worker_exited(pid: int) -> None:
    """A gunicorn worker died: drop its live gauges from the aggregation."""
    _metrics.worker_exited(pid)

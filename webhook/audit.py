"""Where decisions are reported: the JSON decision log, Events on pods, Prometheus metrics.

The HTTP edge calls ``recorder.record(...)`` once per request, whatever the outcome. :class:`Reporter` fans that
out to the three, and a failure in any of them is logged, never raised into the request. :func:`build_recorder`
chooses the Event sink in one place: an ApiClient given, or cluster credentials found (in-cluster, else kubeconfig),
send Events to the API; otherwise (``make run`` with a node file, no cluster access) Events go to the log.

What goes where and why is written up in ``docs/observability.md``.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from typing import Any, Protocol, TextIO

from webhook import metrics as _metrics
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
    api_client_from_environment,
    start_relay,
)
from webhook.events import instance_name as _instance_name
from webhook.metrics import Metrics
from webhook.model import compact_json
from webhook.pipeline import Result

log = logging.getLogger("gpu_admission.decision")

AUDIT_KEY = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
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


def decision_line(
    endpoint: str, review: ReviewRequest | None, result: Result | None, status: int, seconds: float, error: str = ""
) -> dict[str, object]:
    """One JSON-able line: names, codes and sizes only; never env values, secrets, messages or whole objects."""
    line: dict[str, object] = {
        "ts": round(time.time(), 3),
        "endpoint": endpoint,
        "status": status,
        "latency_ms": round(seconds * 1000, 3),
    }
    if review:
        line.update(
            uid=review.uid,
            namespace=review.namespace,
            name=(review.name or review.subject.name)[:NAME_LIMIT],  # names are checked after mutating admission
            generateName=review.subject.generate_name[:NAME_LIMIT],
            kind=review.kind,
            operation=review.operation,
            dryRun=review.dry_run,
            user=review.username,
        )
    if result:
        line.update(
            decision=result.decision,
            reasons=list(result.outcome.reasons),
            mutations=list(result.outcome.mutations),
            patchOps=len(result.patch),
            patchBytes=len(result.patch_text()) if result.patch else 0,
            warnings=len(result.warnings),
        )
        if result.skipped:
            line["skipped"] = result.skipped
        if result.reused:
            line["reused"] = True
        if result.replayed:
            line["replayed"] = True
    if error:
        line["error"] = error
    return line


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
        if not self.enabled:
            return
        text = compact_json(decision_line(endpoint, review, result, status, seconds, error))
        out = self.stream or sys.stderr
        out.write(text + "\n")
        out.flush()


def request_decision(result: Result | None, status: int) -> str:
    """The ``decision`` label: the pipeline's decision, else ``rejected`` (4xx, bad request) or ``error`` (5xx)."""
    if result is not None:
        return result.decision
    return "error" if status >= 500 else "rejected"


def denial_actions(result: Result) -> list[tuple[str, str]]:
    """(reason, action) per policy refusal: ``denied`` when enforced, ``warned`` when warn mode admitted it.

    Warn mode shows as the ``<policy>-would-deny`` audit annotation the pipeline writes; a refusal neither enforced
    nor warned (its policy is off) is not counted.
    """
    out: list[tuple[str, str]] = []
    for d in result.outcome.denials:
        if f"{d.policy}-would-deny" in result.audit:
            out.append((d.reason, "warned"))
        elif not result.allowed:
            out.append((d.reason, "denied"))
    return out


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
        try:
            self.decisions.record(endpoint, review, result, status, seconds, error)
        except Exception:
            log.exception("cannot write the decision log line")
        try:
            self._count(endpoint, result, status, seconds)
        except Exception:
            log.exception("cannot update the metrics")
        if endpoint == "validate" and self.events is not None:
            try:
                self.events.send_for(review, result, self.instance)
            except Exception:
                log.exception("cannot queue events")

    def _count(self, endpoint: str, result: Result | None, status: int, seconds: float) -> None:
        m = self.metrics
        m.request(endpoint, request_decision(result, status), seconds)
        if result is not None:
            if result.reused:
                m.reused(endpoint)
            if endpoint == "mutate" and result.allowed and result.patch:
                for kind in result.outcome.mutations:
                    m.mutation(kind)
            for reason, action in denial_actions(result):
                m.denial(endpoint, reason, action)


def _sink(api_client: Any | None, discover: bool) -> EventSink:
    """Where Events go: the API when a client is given, or ``discover`` finds credentials (in-cluster, else
    kubeconfig); else the log."""
    client = api_client if api_client is not None else (api_client_from_environment() if discover else None)
    return ApiSink(client) if client is not None else LogSink()


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


def start_metrics_server(port: int, addr: str = "0.0.0.0") -> None:
    """Serve Prometheus text on ``addr:port`` (plain HTTP) from the gunicorn master, aggregating every worker."""
    _metrics.start_metrics_server(port, addr)


def worker_exited(pid: int) -> None:
    """A gunicorn worker died: drop its live gauges from the aggregation."""
    _metrics.worker_exited(pid)

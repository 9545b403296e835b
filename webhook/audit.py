"""Where decisions are reported: the JSON decision log, Events on pods, Prometheus metrics.

(First version: the decision log. Events and metrics arrive with the audit issue.)
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Protocol, TextIO

from webhook.admission import ReviewRequest
from webhook.config import Settings
from webhook.model import as_dict, as_str
from webhook.pipeline import Result

log = logging.getLogger("gpu_admission.decision")


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
    """One JSON-able line: never env values, secrets or whole objects."""
    meta = as_dict(as_dict(review.object if review else None).get("metadata"))
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
            name=review.name or as_str(meta.get("name")),
            generateName=as_str(meta.get("generateName")),
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
        )
        if result.skipped:
            line["skipped"] = result.skipped
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
        text = json.dumps(decision_line(endpoint, review, result, status, seconds, error), separators=(",", ":"))
        out = self.stream or sys.stderr
        print(text, file=out, flush=True)


def start_metrics_server(port: int) -> None:
    """Serve Prometheus text on ``port`` (plain HTTP), aggregating every worker (placeholder until metrics land)."""


def worker_exited(pid: int) -> None:
    """A gunicorn worker died: drop its live gauges from the aggregation (placeholder)."""

"""The Flask app, built by a factory; routes stay thin: parse, run the pipeline, answer, record.

Nothing is bound, started or read at import time (gunicorn forks workers after importing).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flask import Flask, Response, jsonify, request
from werkzeug.exceptions import HTTPException

from webhook import decisions, pipeline
from webhook.admission import ReviewRequest, error_body, parse_review
from webhook.audit import Recorder, build_recorder
from webhook.cluster import ClusterSource, StaticCluster, build_view
from webhook.config import Settings
from webhook.cuda_version import gpu_arches
from webhook.errors import BadRequest, PayloadTooLarge
from webhook.model import Context
from webhook.registry import PLATFORMS, ImageConfigs, platform_order


@dataclass
class Runtime:
    """The collaborators a request uses, hung on ``app.extensions["gpu_admission"]``."""

    settings: Settings
    cluster: ClusterSource
    recorder: Recorder
    unsynced_workers: Callable[[], list[int]] = list
    """The pids of this server's other workers that have not listed the nodes yet (set by ``webhook.server``)."""
    images: ImageConfigs | None = None
    """The image configs read from registries (``cuda.registry``), this worker's; None when that is off."""


DRAIN_FACTOR = 4
"""An oversized body is read (and dropped) up to this many times the limit before answering 413, so the client,
still sending, gets the answer instead of a reset connection; beyond that the connection is cut."""


def read_body(limit: int) -> bytes:
    """The request body, at most ``limit`` bytes; PayloadTooLarge (413) beyond it. A body that cannot be read is the
    client's doing, answered 400 (framing the server cannot read: a chunk size that is no hex number, a chunk
    without its CRLF) or 408 (a client that stopped sending: ``workers.ClientSilent``; the answer goes nowhere, but
    it is recorded as what it was, not as a bug with a traceback)."""
    try:
        return _read_body(limit)
    except BadRequest:
        raise
    except OSError as err:
        raise BadRequest(f"the request body did not arrive: {err.strerror or type(err).__name__}", 408) from err
    except Exception as err:
        raise BadRequest(f"the request body cannot be read: {type(err).__name__}: {err}"[:300]) from err


def _read_body(limit: int) -> bytes:
    if request.content_length is not None and request.content_length > DRAIN_FACTOR * limit:
        raise PayloadTooLarge(f"body of {request.content_length} bytes is over the limit of {limit}")
    if request.content_length is not None and request.content_length <= limit:
        return request.stream.read()  # the stream ends at Content-Length: one read
    chunks: list[bytes] = []
    size = 0
    while chunk := request.stream.read(64 * 1024):
        size += len(chunk)
        if size <= limit:
            chunks.append(chunk)
        elif size > DRAIN_FACTOR * limit:
            break
    if size > limit:
        raise PayloadTooLarge(f"body of {size} bytes or more is over the limit of {limit}")
    return b"".join(chunks)


def _request_of(body: bytes, limit: int) -> ReviewRequest | None:
    """The request in ``body`` when it reads (for the decision log of a request that failed), else None."""
    try:
        return parse_review(body, limit)
    except Exception:
        return None


def _platform_order(cluster: ClusterSource) -> Callable[[], tuple[tuple[str, str], ...]]:
    """The order the cluster's GPU nodes read a multi-platform image's configs in (``registry.platform_order``),
    worked out once per view: it is asked at each image looked up."""
    last: list[tuple[Any, tuple[tuple[str, str], ...]]] = [(None, PLATFORMS)]

    def order() -> tuple[tuple[str, str], ...]:
        view, known = cluster.snapshot(), last[0]
        if known[0] is not view:
            known = last[0] = (view, platform_order(gpu_arches(view)))  # one assignment: a pair never mixed
        return known[1]

    return order


def create_app(
    settings: Settings | None = None,
    cluster: ClusterSource | None = None,
    recorder: Recorder | None = None,
    images: ImageConfigs | None = None,
    images_shared: Path | None = None,
) -> Flask:
    """``images``: the image configs read from registries; by default this app's own where ``cuda.registry`` is
    on (its reader threads start with the first image asked, in the process that asks), sharing what it reads
    through the directory ``images_shared`` (the server's workers')."""
    settings = settings or Settings()
    cluster = cluster or StaticCluster(build_view([], settings, source="settings", known=False))
    recorder = recorder or build_recorder(settings, cluster)
    if images is None and settings.cuda.registry.enabled:
        metrics = getattr(recorder, "metrics", None)  # a Reporter's; a test's recorder may count nothing
        count = metrics.image_config if metrics is not None else None
        images = ImageConfigs(
            settings.cuda.registry,
            count=count,
            shared=images_shared,
            platforms=_platform_order(cluster),
        )
    runtime = Runtime(settings, cluster, recorder, images=images)
    app = Flask("gpu_admission")
    app.json.sort_keys = False  # type: ignore[attr-defined]
    app.extensions["gpu_admission"] = runtime

    def review_route(endpoint: str, step: Callable[[Any, Context], pipeline.Result]) -> tuple[Response, int]:
        started = time.perf_counter()
        body = b""
        try:
            encoding = request.headers.get("Content-Encoding", "").strip().lower()
            if encoding not in ("", "identity"):
                raise BadRequest(f"Content-Encoding {encoding[:40]!r} is not accepted: send the body unencoded", 415)
            body = read_body(settings.max_body_bytes)
            review, result, answer = decisions.decide(
                endpoint, step, body, request.content_type, settings, cluster.snapshot(), images
            )
        except BadRequest as err:
            runtime.recorder.record(endpoint, None, None, err.status, time.perf_counter() - started, str(err))
            return jsonify(error_body(str(err), err.status)), err.status
        except Exception as err:
            # A bug, not the caller's fault: answer in JSON and say so (the failurePolicy decides); the decision log
            # names the request (its uid, to find it in the apiserver's audit log) and its real latency.
            seconds = time.perf_counter() - started
            app.logger.exception("unexpected error while reviewing")
            known = _request_of(body, settings.max_body_bytes)
            runtime.recorder.record(endpoint, known, None, 500, seconds, f"internal: {type(err).__name__}")
            return jsonify(error_body(f"internal error ({type(err).__name__}); see the webhook's log", 500)), 500
        runtime.recorder.record(endpoint, review, result, 200, time.perf_counter() - started)
        return app.response_class(answer, mimetype="application/json"), 200

    @app.post("/mutate")
    def mutate() -> tuple[Response, int]:
        return review_route("mutate", pipeline.mutate)

    @app.post("/validate")
    def validate() -> tuple[Response, int]:
        return review_route("validate", pipeline.validate)

    @app.get("/healthz")
    def healthz() -> tuple[Response, int]:
        return jsonify({"status": "ok"}), 200

    @app.get("/readyz")
    def readyz() -> tuple[Response, int]:
        problem = cluster.problem()
        if not cluster.ready():
            error = "the node list has not synced yet" + (f": {problem}" if problem else "")
            return jsonify({"status": "not ready", "error": error}), 503
        if waiting := runtime.unsynced_workers():
            which = f"workers {', '.join(map(str, waiting))}" if len(waiting) > 1 else f"worker {waiting[0]}"
            error = f"the node list has not synced yet in {which} of this server (its reviews are not checked)"
            return jsonify({"status": "not ready", "error": error}), 503
        view = cluster.snapshot()
        # ready all the same: failing readiness on every replica at once would block every GPU pod in the cluster
        warning = {"warning": problem} if problem else {}
        return jsonify({"status": "ready", "nodes": view.node_count, "source": view.source} | warning), 200

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> tuple[Response, int]:
        code = err.code or 500
        messages = {
            404: f"no such endpoint {request.path}: use POST /mutate, POST /validate, GET /healthz, GET /readyz",
            405: f"method {request.method} is not allowed on {request.path}",
            413: f"body is over the limit of {settings.max_body_bytes} bytes",
        }
        return jsonify(error_body(messages.get(code, err.description or err.name), code)), code

    @app.errorhandler(Exception)
    def unexpected(err: Exception) -> tuple[Response, int]:
        # A bug, not the caller's fault: still answer in JSON, and say so; the failurePolicy decides.
        app.logger.exception("unexpected error while reviewing")
        runtime.recorder.record(request.path.strip("/"), None, None, 500, 0.0, f"internal: {type(err).__name__}")
        return jsonify(error_body(f"internal error ({type(err).__name__}); see the webhook's log", 500)), 500

    return app

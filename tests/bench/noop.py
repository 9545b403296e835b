"""The no-op baseline: Flask on the webhook's own gunicorn/TLS stack, answering every review ``allowed: true``.

It does the least any webhook must (read the body, parse the JSON, echo the uid), so the ratio of the real
webhook's figures to these is the price of the policies and their plumbing, not of HTTP, TLS or gunicorn.

    python -m tests.bench.noop --cert tls.crt --key tls.key --port 8444 --metrics-port 9091 --workers 2
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any

from flask import Flask, Response, jsonify, request

from webhook.cli import check_serving_pair
from webhook.cluster import ClusterSource, StaticCluster, build_view
from webhook.config import Settings
from webhook.errors import InputError
from webhook.server import GunicornServer, ServeOptions, prepare_metrics_dir


def create_noop_app() -> Flask:
    app = Flask("noop")

    def answer() -> tuple[Response, int]:
        try:
            review = json.loads(request.get_data(cache=False))
            uid = review["request"]["uid"]
        except (ValueError, KeyError, TypeError):
            return jsonify({"error": "not an AdmissionReview"}), 400
        response = {"uid": uid, "allowed": True}
        return jsonify({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}), 200

    app.add_url_rule("/mutate", "mutate", answer, methods=["POST"])
    app.add_url_rule("/validate", "validate", answer, methods=["POST"])
    app.add_url_rule("/healthz", "healthz", lambda: (jsonify({"status": "ok"}), 200))
    app.add_url_rule("/readyz", "readyz", lambda: (jsonify({"status": "ready"}), 200))
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.noop", description=__doc__)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    ServeOptions.add_arguments(parser, port=8444, metrics_port=9091, host="127.0.0.1")
    args = parser.parse_args(argv)
    try:  # what serve refuses (its metrics port on its own port, a certificate not there), told as serve tells it
        options = ServeOptions.from_args(args)
        check_serving_pair(args.cert, args.key)
    except InputError as err:
        parser.error(str(err))
    prepare_metrics_dir("noop-metrics-")

    def factory() -> tuple[Any, ClusterSource]:
        return create_noop_app(), StaticCluster(build_view([], Settings(), source="none"))

    GunicornServer(options, factory).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

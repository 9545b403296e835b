"""`gpu-admission selftest`: send a dry-run pod through the installed webhook and check that it answered.

The chart's `helm test` hook runs it in-cluster. The probe pod is created with ``dryRun=All``: admission runs in full
(the webhook sees ``dryRun: true`` and writes no Event), nothing is stored. The webhook answered when

- the returned pod carries a ``gpu-admission.io/`` annotation the probe did not set (the mutating webhook wrote it), or
- the request was denied and the message names one of the webhooks (``admission webhook "<name>" denied ...``);
  the fraction probe's denial by the mutating webhook ends admission before the validating one, so the spot probe,
  which both admit, is sent after it and must pass too.

Anything else fails with a message saying what to check: Kubernetes' own validation rejecting the fraction means
the webhook was never called (selectors, matchConditions); "failed calling webhook" means it was called and could not
be reached (TLS, caBundle, Service, pods).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PREFIX = "gpu-admission.io/"
DEFAULT_WEBHOOKS = ("mutate.gpu-admission.io", "validate.gpu-admission.io")
PROBES = ("fraction", "spot")
PROBE_IMAGE = "registry.k8s.io/pause:3.10"


@dataclass(frozen=True)
class Answer:
    """What the API server said to the dry-run create: the returned object, or an error status and body."""

    obj: dict[str, Any] | None = None
    status: int = 0
    body: str = ""


Create = Callable[[str, dict[str, Any]], Answer]
"""Creates a pod with dryRun=All in a namespace and returns the API server's answer."""


def probe_pod(probe: str) -> dict[str, Any]:
    """The probe pod: restricted-profile compliant, so Pod Security admission does not reject it first."""
    annotations: dict[str, str] = {}
    resources: dict[str, Any] = {}
    if probe == "fraction":
        # Kubernetes itself rejects a fractional extended resource: only the webhook's conversion (or its denial,
        # where no MIG profile fits) can answer this pod.
        resources = {"limits": {"nvidia.com/gpu": "0.5"}, "requests": {"nvidia.com/gpu": "0.5"}}
    else:
        annotations[PREFIX + "spot"] = "tolerate"
    container: dict[str, Any] = {
        "name": "probe",
        "image": PROBE_IMAGE,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "runAsUser": 65532,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    }
    if resources:
        container["resources"] = resources
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "gpu-admission-selftest-",
            "labels": {"app.kubernetes.io/name": "gpu-admission-selftest"},
            "annotations": annotations,
        },
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }


def _message(body: str) -> str:
    try:
        data = json.loads(body)
    except ValueError:
        return body.strip()
    if isinstance(data, dict) and isinstance(data.get("message"), str):
        return str(data["message"])
    return body.strip()


def judge(sent: dict[str, Any], answer: Answer, webhooks: tuple[str, ...] = DEFAULT_WEBHOOKS) -> tuple[bool, str]:
    """Did the webhook answer ``sent``? Returns (ok, a message saying what happened and what to check)."""
    if answer.obj is not None:
        metadata = answer.obj.get("metadata")
        got = metadata.get("annotations") if isinstance(metadata, dict) else None
        mine = sent["metadata"].get("annotations") or {}
        written = {
            str(k): str(v)
            for k, v in (got if isinstance(got, dict) else {}).items()
            if str(k).startswith(PREFIX) and k not in mine
        }
        if written:
            lines = "; ".join(f"{k}: {v}" for k, v in sorted(written.items()))
            return True, f"ok: the webhook mutated the dry-run pod ({lines})"
        return False, (
            "the dry-run pod was admitted without any gpu-admission.io/ annotation: the webhook did not act on it. "
            "Check that the namespace is not excluded (label gpu-admission.io/ignore, release namespace, "
            "exemptions) and kubectl get mutatingwebhookconfiguration -o yaml"
        )
    message = _message(answer.body)
    for name in webhooks:
        if f'admission webhook "{name}" denied' in message:
            return True, f"ok: the webhook answered (denied, as expected without a fitting MIG profile): {message}"
    if "failed calling webhook" in message:
        return False, (
            f"the API server could not call the webhook: {message}. Check the webhook pods are ready, the Service "
            "endpoints, and that caBundle matches the serving certificate (the certs Job or cert-manager)"
        )
    return False, (
        f"the dry-run pod was rejected, but not by the webhook (HTTP {answer.status}): {message}. "
        "If Kubernetes rejected the fraction itself, the webhook was never called: check its namespaceSelector, "
        "objectSelector and matchConditions"
    )


def kubernetes_create() -> Create:
    """A Create backed by the kubernetes client: in-cluster credentials, else the local kubeconfig."""
    import kubernetes

    # The client's annotations are partial and its models are not used here (raw JSON in and out): keep it Any.
    k8s: Any = kubernetes
    client, config = k8s.client, k8s.config
    try:
        config.load_incluster_config()
    except config.ConfigException:
        # The client reads KUBECONFIG once, at import: pass it explicitly.
        config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    api = client.CoreV1Api()

    def create(namespace: str, pod: dict[str, Any]) -> Answer:
        try:
            response = api.create_namespaced_pod(namespace, pod, dry_run="All", _preload_content=False)
        except client.ApiException as err:
            body = err.body.decode() if isinstance(err.body, bytes) else str(err.body or err.reason)
            return Answer(status=int(err.status or 0), body=body)
        data = json.loads(response.data)
        return Answer(obj=data if isinstance(data, dict) else {})

    return create


def run(args: argparse.Namespace, create: Create | None = None) -> int:
    """Send the probe, print the verdict; 0 when the webhook answered, 1 otherwise."""
    webhooks = tuple(args.webhook or DEFAULT_WEBHOOKS)
    pod = probe_pod(args.probe)
    try:
        send = create or kubernetes_create()
        answer = send(args.namespace, pod)
    except Exception as err:  # no credentials, no network: say so instead of a traceback
        print(f"selftest: cannot reach the Kubernetes API: {err}", file=sys.stderr)
        return 1
    ok, message = judge(pod, answer, webhooks)
    if ok and answer.obj is None and args.probe == "fraction":
        # A denial (no MIG profile fits, the usual case without MIG) ends admission at the mutating webhook: the
        # validating one was never called. The spot probe, which both admit, calls it.
        spot = probe_pod("spot")
        try:
            ok, second = judge(spot, send(args.namespace, spot), webhooks)
        except Exception as err:
            ok, second = False, f"cannot reach the Kubernetes API: {err}"
        message = f"{message}; and the spot probe: {second}" if ok else f"the spot probe: {second}"
    print(("selftest passed: " if ok else "selftest FAILED: ") + message, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


def register(subparsers: Any) -> None:
    """Add the ``selftest`` subcommand to an argparse subparsers object."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "selftest", help="send a dry-run pod through the installed webhook and check that it answered"
    )
    parser.add_argument("--namespace", required=True, help="namespace the webhook covers (not its own)")
    parser.add_argument(
        "--probe",
        choices=PROBES,
        default="fraction",
        help="fraction: nvidia.com/gpu 0.5 (converted or denied); spot: gpu-admission.io/spot: tolerate",
    )
    parser.add_argument(
        "--webhook",
        action="append",
        help=f"a webhook name whose denial counts as an answer (repeatable; default: {', '.join(DEFAULT_WEBHOOKS)})",
    )
    parser.set_defaults(func=run)

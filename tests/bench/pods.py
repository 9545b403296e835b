"""The pods the benchmark sends, each wrapped in an AdmissionReview as the apiserver sends it.

- ``small``: an inference pod of a Deployment (one container, one GPU, CUDA in the image tag);
- ``training``: a training pod of a Job with three containers (trainer with 8 GPUs, two sidecars) and an init
  container, the CUDA version in the environment, spot preferred;
- ``fixture``: the full-field Pod from ``../shared/fixtures/kubernetes-api/core.v1.Pod.json`` (every field set,
  about 60 kB), as it is;
- ``pinned(node)``: a GPU DaemonSet's pod, bound to one node by ``matchFields`` (node rules evaluated per node);
- ``containers(n)``: a pod of ``n`` containers (the first eight ask for a GPU each, the rest are sidecars).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bench import nodes as node_lists
from tests.conftest import FIXTURES, review

SEQ_ANNOTATION = "bench.gpu-admission.io/seq"
SEQ_TOKEN = "SEQ-0000000000"
"""wrk/review.lua writes a number of its own (``seq-TTNNNNNNNN``, the same width) over every copy of this token on
every request."""
UID_PREFIX = "bench-7f1c2e9a-5b1d-4c3e-"
UID = UID_PREFIX + SEQ_TOKEN
"""The request's uid: a new one on every request under load, as the apiserver gives each admission request."""
ECHOED = UID_PREFIX + "seq-"
"""What the load script looks for in every answer: a renumbered uid echoed."""
CREATED = "2026-12-01T10:00:00Z"

RESOURCES_SMALL = {
    "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
    "limits": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "1"},
}


def _meta(name: str, namespace: str, owner_kind: str, owner: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "generateName": f"{name}-",
        "namespace": namespace,
        "labels": labels,
        "annotations": {"kubectl.kubernetes.io/default-container": name.split("-")[0]},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1" if owner_kind == "ReplicaSet" else "batch/v1",
                "kind": owner_kind,
                "name": owner,
                "uid": "0c5b7f2e-1a2b-4c3d-9e8f-7a6b5c4d3e2f",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def _container(
    name: str, image: str, resources: dict[str, Any], env: dict[str, str] | None = None, ports: list[int] | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "resources": resources,
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "volumeMounts": [
            {"name": "kube-api-access", "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
        ],
    }
    if env:
        out["env"] = [{"name": k, "value": v} for k, v in env.items()]
    if ports:
        out["ports"] = [{"containerPort": p, "protocol": "TCP"} for p in ports]
    return out


def _spec(containers: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {
        "containers": containers,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": "default-scheduler",
        "securityContext": {},
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
        "priority": 0,
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        "volumes": [
            {
                "name": "kube-api-access",
                "projected": {
                    "defaultMode": 420,
                    "sources": [
                        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    ],
                },
            }
        ],
        **extra,
    }


def small() -> dict[str, Any]:
    labels = {"app": "triton", "pod-template-hash": "7c9f5d8b6d"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta("triton-7c9f5d8b6d", "inference", "ReplicaSet", "triton-7c9f5d8b6d", labels),
        "spec": _spec(
            [_container("triton", "nvcr.io/nvidia/tritonserver:24.05-py3", RESOURCES_SMALL, ports=[8000, 8001, 8002])]
        ),
    }


def training() -> dict[str, Any]:
    labels = {
        "batch.kubernetes.io/job-name": "llama-ft",
        "job-name": "llama-ft",
        "batch.kubernetes.io/controller-uid": "0c5b7f2e-1a2b-4c3d-9e8f-7a6b5c4d3e2f",
    }
    meta = _meta("llama-ft", "research", "Job", "llama-ft", labels)
    meta["annotations"]["gpu-admission.io/spot"] = "prefer"
    gpus = {
        "requests": {"cpu": "90", "memory": "900Gi", "nvidia.com/gpu": "8"},
        "limits": {"cpu": "90", "memory": "900Gi", "nvidia.com/gpu": "8"},
    }
    sidecar = {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"cpu": "500m", "memory": "512Mi"}}
    spec = _spec(
        [
            _container(
                "trainer",
                "ghcr.io/example/llama-trainer:2024.05",
                gpus,
                env={
                    "NVIDIA_REQUIRE_CUDA": "cuda>=12.2 brand=tesla,driver>=470,driver<471",
                    "NCCL_DEBUG": "WARN",
                    "MASTER_PORT": "29500",
                },
                ports=[29500],
            ),
            _container("log-shipper", "fluent/fluent-bit:3.0.4", sidecar),
            _container(
                "dcgm-metrics", "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5-3.4.1-ubuntu22.04", sidecar, ports=[9400]
            ),
        ],
        restartPolicy="Never",
        initContainers=[
            _container(
                "fetch-data", "amazon/aws-cli:2.15.50", sidecar, env={"DATASET": "s3://example-datasets/llama-ft/"}
            )
        ],
    )
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def fixture() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "core.v1.Pod.json").read_text())
    return data


def containers(n: int) -> dict[str, Any]:
    labels = {"app": "multi", "pod-template-hash": "5d8f7c6b9a"}
    one = {
        "requests": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "1"},
    }
    sidecar = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "200m", "memory": "256Mi"}}
    items = [
        _container(f"worker-{i}", "nvidia/cuda:12.2.2-runtime-ubuntu22.04", one, env={"RANK": str(i)})
        if i < 8
        else _container(f"sidecar-{i}", "busybox:1.36", sidecar, env={"ROLE": "sidecar"})
        for i in range(n)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta("multi-5d8f7c6b9a", "default", "ReplicaSet", "multi-5d8f7c6b9a", labels),
        "spec": _spec(items),
    }


def pinned(node_name: str) -> dict[str, Any]:
    """A GPU DaemonSet's pod: bound to one node by ``matchFields`` on ``metadata.name``, as the DaemonSet controller
    writes it (rules on node names are evaluated per node, not per group)."""
    pod = small()
    pod["metadata"] = _meta("gpu-check", "gpu-operator", "DaemonSet", "gpu-check", {"app": "gpu-check"})
    pod["spec"]["containers"][0].update(name="gpu-check", image="nvidia/cuda:12.2.2-base-ubuntu22.04")
    pod["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
                ]
            }
        }
    }
    pod["spec"]["tolerations"].append({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
    return pod


PODS: dict[str, Callable[[], dict[str, Any]]] = {"small": small, "training": training, "fixture": fixture}
DESCRIPTIONS = {
    "small": "inference pod: 1 container, 1 GPU, CUDA from the image tag",
    "training": "training pod: 3 containers + 1 init container, 8 GPUs, CUDA from the env, spot preferred",
    "fixture": "full-field fixture core.v1.Pod.json (every field set, 60 kB)",
    "pinned": "a GPU DaemonSet's pod, bound to one node by matchFields on metadata.name",
}


def named(name: str) -> dict[str, Any]:
    """The pod a bench row names (``PODS``, ``pinned`` to the first generated node, ``containers-N``); ``NAME+new``:
    that pod with an annotation the load script renumbers on every request, so that each request is an object the
    webhook has not answered before; ``NAME+indexed``: that pod as an Indexed Job's, its index renumbered on every
    request where the Job controller writes it (``indexed``)."""
    base, _, variant = name.partition("+")
    if base.startswith("containers-"):
        pod = containers(int(base.split("-")[1]))
    elif base == "pinned":
        pod = pinned(node_lists.node_name(1))
    else:
        pod = PODS[base]()
    if variant == "new":
        pod.setdefault("metadata", {}).setdefault("annotations", {})[SEQ_ANNOTATION] = SEQ_TOKEN
    elif variant == "indexed":
        pod = indexed(pod)
    return pod


def indexed(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as the Job controller writes an Indexed Job's pod, with ``SEQ_TOKEN`` for its index: in a label and an
    annotation (``batch.kubernetes.io/job-completion-index``), its hostname and its generated name; owned by the
    Job (kubernetes.io/docs/concepts/workloads/controllers/job/#completion-mode)."""
    out = copy.deepcopy(pod)
    meta, spec = out.setdefault("metadata", {}), out.setdefault("spec", {})
    job = "train"
    meta["generateName"] = f"{job}-{SEQ_TOKEN}-"
    meta.pop("name", None)
    labels = meta.setdefault("labels", {})
    labels.pop("pod-template-hash", None)  # a Deployment's; the Job controller writes its own labels
    labels["batch.kubernetes.io/job-completion-index"] = SEQ_TOKEN
    meta.setdefault("annotations", {})["batch.kubernetes.io/job-completion-index"] = SEQ_TOKEN
    meta["ownerReferences"] = _meta(job, meta.get("namespace", ""), "Job", job, {})["ownerReferences"]
    spec["hostname"] = f"{job}-{SEQ_TOKEN}"
    return out


def stored(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as /validate sees it: between the mutating and the validating webhooks the apiserver generates the
    name from ``generateName`` and sets the uid and the creation time. Name and uid carry the load script's token,
    so that every request is a pod of its own, as the replicas of a workload are (their Events name each one)."""
    out = copy.deepcopy(pod)
    meta = out.setdefault("metadata", {})
    if not meta.get("name"):
        meta["name"] = meta.get("generateName", "pod-") + SEQ_TOKEN
    meta.setdefault("uid", "5f8c1d2e-7a4b-4c3d-9e2f-" + SEQ_TOKEN)
    meta.setdefault("creationTimestamp", CREATED)
    return out


def admission_review(pod: dict[str, Any]) -> dict[str, Any]:
    namespace = pod.get("metadata", {}).get("namespace") or "default"
    body = review(pod, namespace=namespace, uid=UID)
    body["request"]["name"] = pod.get("metadata", {}).get("name", "")
    return body


def write_body(path: Path, pod: dict[str, Any]) -> Path:
    """Write the AdmissionReview for ``pod`` as compact JSON (the apiserver sends no whitespace)."""
    path.write_text(json.dumps(admission_review(pod), separators=(",", ":")))
    return path

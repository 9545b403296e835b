"""Shared by the hardening tests (fuzz, nasty corpus, trust): a realistic mixed GPU cluster, settings that switch
every policy on, and one checker for the AdmissionReview contract (the Kubernetes docs' "Dynamic Admission Control";
kubernetes/apiserver ``pkg/admission/plugin/webhook/``).
"""

from __future__ import annotations

import base64
import json
import os
import re
import uuid
from typing import Any

import jsonpatch

from tests.conftest import gpu_node
from webhook.app import create_app
from webhook.audit import DecisionLog
from webhook.cluster import ClusterView, StaticCluster, build_view
from webhook.config import Settings, build

GKE_SPOT_TAINT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
AKS_SPOT_TAINT = {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}


def cluster_nodes() -> list[dict[str, Any]]:
    """H100 on 550 (CUDA 12.4), A100 MIG mixed on 535, A100 MIG single on 570, GKE spot T4 without GFD,
    AKS spot A10 on 525, and a CPU node."""
    mixed = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-3g.40gb.memory": "40192",
        "nvidia.com/mig-1g.10gb.memory": "9728",
        "nvidia.com/cuda.driver-version.full": "535.104.05",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "2",
    }
    single = {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
        "nvidia.com/gpu.memory": "4864",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/cuda.driver-version.full": "570.86.10",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "8",
    }
    aks = {
        "nvidia.com/gpu.product": "NVIDIA-A10",
        "nvidia.com/gpu.memory": "23028",
        "nvidia.com/cuda.driver-version.full": "525.60.13",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "0",
        "kubernetes.azure.com/scalesetpriority": "spot",
        "kubernetes.azure.com/agentpool": "a10spot",
    }
    gke_spot: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gke-t4-spot-1",
            "labels": {
                "kubernetes.io/hostname": "gke-t4-spot-1",
                "cloud.google.com/gke-nodepool": "t4-spot",
                "cloud.google.com/gke-spot": "true",
                "cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
            },
        },
        "spec": {"taints": [GKE_SPOT_TAINT, {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {"allocatable": {"cpu": "8", "memory": "30Gi", "nvidia.com/gpu": "1"}},
    }
    cpu: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "cpu-1", "labels": {"kubernetes.io/hostname": "cpu-1"}},
        "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}},
    }
    return [
        gpu_node("h100-a"),
        gpu_node("h100-b"),
        gpu_node(
            "a100-mixed-1", mixed, {"nvidia.com/gpu": "0", "nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "3"}
        ),
        gpu_node("a100-single-1", single, {"nvidia.com/gpu": "56"}),
        gpu_node("aks-a10-spot-1", aks, {"nvidia.com/gpu": "1"}, [AKS_SPOT_TAINT]),
        gke_spot,
        cpu,
    ]


SETTINGS_DATA: dict[str, Any] = {
    "cuda": {"mode": "enforce", "namespaceModes": {"warn-ns": "warn"}},
    "spot": {"default": "off", "namespaceDefaults": {"batch": "tolerate"}, "ownerDefaults": {"Job": "tolerate"}},
    "exemptions": {
        "namespaces": ["kube-system", "gpu-admission"],
        "users": ["system:admin"],
        "groups": ["platform-admins"],
    },
    "cluster": {
        "pools": [
            {
                "name": "t4-spot",
                "nodeSelector": {"cloud.google.com/gke-nodepool": "t4-spot"},
                "driverVersion": "535.104.05",
                "gpuProduct": "Tesla-T4",
                "spot": True,
            }
        ]
    },
}


def hardening_settings(**overrides: Any) -> Settings:
    data = json.loads(json.dumps(SETTINGS_DATA))
    for area, values in overrides.items():
        data.setdefault(area, {}).update(values)
    return build(Settings, data)


def cluster_view(settings: Settings) -> ClusterView:
    return build_view(cluster_nodes(), settings)


def quiet_app(settings: Settings) -> Any:
    """The Flask app over the realistic cluster; the decision log still runs (to /dev/null)."""
    stream = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the app
    return create_app(
        settings, cluster=StaticCluster(cluster_view(settings)), recorder=DecisionLog(settings, stream=stream)
    )


def wrap(obj: Any, operation: str = "CREATE", namespace: str = "default", **request: Any) -> dict[str, Any]:
    kind = obj.get("kind") if isinstance(obj, dict) and isinstance(obj.get("kind"), str) else "Pod"
    body: dict[str, Any] = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": kind},
            "operation": operation,
            "namespace": namespace,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj,
        },
    }
    body["request"].update(request)
    return body


NAME_PART = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def check_answer(status: int, body: Any, uid: Any, mutating: bool) -> dict[str, Any] | None:
    """Assert the contract; return the response of a 200, None for a 4xx."""
    assert status < 500, f"server error {status}: {body}"
    assert isinstance(body, dict), f"answer is not a JSON object: {body!r}"
    if status != 200:
        assert 400 <= status < 500, status
        assert isinstance(body.get("error"), str) and body["error"], body
        return None
    assert body.get("apiVersion") == "admission.k8s.io/v1" and body.get("kind") == "AdmissionReview", body
    response = body["response"]
    assert response["uid"] == uid
    assert isinstance(response["allowed"], bool)
    assert ("patch" in response) == ("patchType" in response), response
    if "patch" in response:
        assert mutating, "a validating answer must carry no patch"
        assert response["allowed"] is True
        assert response["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(response["patch"], validate=True))
        assert isinstance(ops, list) and ops, "a patch is sent only when there is a change"
    if not response["allowed"]:
        assert response["status"]["code"] >= 400 and response["status"]["message"], response
    warnings = response.get("warnings", [])
    assert isinstance(warnings, list)
    for w in warnings:
        assert isinstance(w, str) and 0 < len(w) < 120, w
    assert sum(len(w) for w in warnings) <= 4096
    for key, value in response.get("auditAnnotations", {}).items():
        assert len(key) <= 63 and NAME_PART.match(key), f"audit annotation key {key!r} would be dropped"
        assert isinstance(value, str)
    result: dict[str, Any] = response
    return result


def patch_of(response: dict[str, Any]) -> list[Any]:
    if "patch" not in response:
        return []
    ops: list[Any] = json.loads(base64.b64decode(response["patch"]))
    return ops


def apply(obj: Any, ops: list[Any]) -> Any:
    """Apply as the apiserver does (RFC 6902; an op that does not apply raises)."""
    for op in ops:
        path = op.get("path", "")
        assert not re.search(r"/-\d", path), f"negative index in {path}"
    return jsonpatch.apply_patch(obj, ops)


def post(client: Any, path: str, body: Any, content_type: str = "application/json") -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = client.post(path, data=data, content_type=content_type)
    return r.status_code, r.get_json(silent=True)

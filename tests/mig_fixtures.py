"""Small builders for the mig tests: GPU nodes per MIG strategy, pods, workloads from the API fixtures, a runner."""

from __future__ import annotations

import base64
import copy
import json
from dataclasses import dataclass, field, replace
from typing import Any, cast

import jsonpatch

from tests.conftest import FIXTURES
from webhook import pipeline
from webhook.app import create_app
from webhook.cluster import StaticCluster, build_view
from webhook.config import ClusterSettings, CudaSettings, MigSettings, PoolSettings, Settings
from webhook.model import Context, Event

POOL = "cloud.google.com/gke-nodepool"
WORKLOAD_FILES = {
    "Deployment": "apps.v1.Deployment.json",
    "StatefulSet": "apps.v1.StatefulSet.json",
    "DaemonSet": "apps.v1.DaemonSet.json",
    "ReplicaSet": "apps.v1.ReplicaSet.json",
    "Job": "batch.v1.Job.json",
    "CronJob": "batch.v1.CronJob.json",
}
TEMPLATE = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


def _node(
    name: str, labels: dict[str, str], allocatable: dict[str, str], taints: list[Any] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels}},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {"cpu": "96", "memory": "1000Gi", **allocatable}},
    }


def mixed_node(
    name: str,
    product: str,
    profiles: dict[str, int],
    pool: str,
    memory_mib: int = 0,
    usable: dict[str, int] | None = None,
    gpus: int = 0,
    extra_labels: dict[str, str] | None = None,
    taints: list[Any] | None = None,
) -> dict[str, Any]:
    """A node under the mixed strategy: allocatable nvidia.com/mig-<p>, labels nvidia.com/mig-<p>.memory."""
    labels = {
        POOL: pool,
        "nvidia.com/gpu.product": product,
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.capable": "true",
        **(extra_labels or {}),
    }
    if memory_mib:
        labels["nvidia.com/gpu.memory"] = str(memory_mib)
    for p, mib in (usable or {}).items():
        labels[f"nvidia.com/mig-{p}.memory"] = str(mib)
        labels[f"nvidia.com/mig-{p}.count"] = str(profiles.get(p, 0))
    allocatable = {"nvidia.com/gpu": str(gpus), **{f"nvidia.com/mig-{p}": str(n) for p, n in profiles.items()}}
    return _node(name, labels, allocatable, taints)


def single_node(name: str, product: str, profile: str, count: int, pool: str, memory_mib: int = 0) -> dict[str, Any]:
    """A node under the single strategy: nvidia.com/gpu counts MIG devices, the product names the profile."""
    labels = {POOL: pool, "nvidia.com/gpu.product": f"{product}-MIG-{profile}", "nvidia.com/mig.strategy": "single"}
    if memory_mib:
        labels["nvidia.com/gpu.memory"] = str(memory_mib)
    return _node(name, labels, {"nvidia.com/gpu": str(count)})


def gke_node(name: str, accelerator: str, partition: str, count: int, pool: str) -> dict[str, Any]:
    """A GKE MIG node: no GFD, the partition size label and nvidia.com/gpu per partition."""
    labels = {
        POOL: pool,
        "cloud.google.com/gke-accelerator": accelerator,
        "cloud.google.com/gke-gpu-partition-size": partition,
    }
    taints = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    return _node(name, labels, {"nvidia.com/gpu": str(count)}, taints)


def whole_node(
    name: str, product: str, count: int, pool: str, sharing: str = "", shared_resource: int = 0
) -> dict[str, Any]:
    labels = {POOL: pool, "nvidia.com/gpu.product": product}
    allocatable = {"nvidia.com/gpu": str(count)}
    if sharing:
        labels["nvidia.com/gpu.sharing-strategy"] = sharing
    if shared_resource:
        allocatable = {"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": str(shared_resource)}
    return _node(name, labels, allocatable)


def container(
    name: str = "trainer", limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None, **extra: Any
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "ghcr.io/example/train:1"}
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    if resources:
        c["resources"] = resources
    c.update(extra)
    return c


def pod(
    *containers: dict[str, Any],
    init: list[dict[str, Any]] | None = None,
    annotations: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": list(containers) or [container()], **spec},
    }
    if init:
        obj["spec"]["initContainers"] = init
    if annotations:
        obj["metadata"]["annotations"] = dict(annotations)
    return obj


def workload(kind: str, template_pod: dict[str, Any]) -> dict[str, Any]:
    """The API fixture of ``kind`` with its pod template's spec replaced by ``template_pod``'s (metadata kept)."""
    obj = json.loads((FIXTURES / WORKLOAD_FILES[kind]).read_text())
    node = obj
    for key in TEMPLATE[kind]:
        node = node[key]
    node["spec"] = copy.deepcopy(template_pod["spec"])
    annotations = template_pod["metadata"].get("annotations")
    if annotations:
        node["metadata"].setdefault("annotations", {}).update(annotations)
    obj["metadata"]["namespace"] = "ml"
    return cast(dict[str, Any], obj)


def template_of(obj: dict[str, Any]) -> dict[str, Any]:
    node = obj
    for key in TEMPLATE.get(obj["kind"], ()):
        node = node[key]
    return node


def settings(pools: list[PoolSettings] | None = None, **mig: Any) -> Settings:
    """Settings with the CUDA check off, so that these tests see the MIG policy alone."""
    return replace(
        Settings(),
        cuda=CudaSettings(mode="off"),
        mig=MigSettings(**mig),
        cluster=ClusterSettings(pools=pools or []),
    )


def context(nodes: list[dict[str, Any]], s: Settings | None = None) -> Context:
    s = s or settings()
    return Context(settings=s, cluster=build_view(nodes, s), namespace="ml")


def review(obj: dict[str, Any], nodes: list[dict[str, Any]], s: Settings | None = None) -> pipeline.Result:
    """mutate + validate; asserts that the patch, applied, gives the object the pipeline returned."""
    ctx = context(nodes, s)
    result = pipeline.review(obj, ctx)
    if result.allowed and not result.skipped:
        assert jsonpatch.apply_patch(obj, result.patch) == result.object
    return result


def mutate_twice(
    obj: dict[str, Any], nodes: list[dict[str, Any]], s: Settings | None = None
) -> tuple[pipeline.Result, list[Any]]:
    """The first mutation, and the patch a second mutation of its result gives (must be empty)."""
    ctx = context(nodes, s)
    first = pipeline.mutate(obj, ctx)
    assert first.allowed, first.message
    patched = jsonpatch.apply_patch(obj, first.patch)
    second = pipeline.mutate(patched, ctx)
    return first, second.patch


def resources_of(obj: dict[str, Any], name: str = "trainer") -> dict[str, Any]:
    spec = template_of(obj)["spec"]
    for list_name in ("initContainers", "containers"):
        for c in spec.get(list_name, []):
            if c.get("name") == name:
                return cast(dict[str, Any], c.get("resources", {}))
    raise KeyError(name)


def mig_annotation(obj: dict[str, Any]) -> str | None:
    annotations: dict[str, Any] = template_of(obj)["metadata"].get("annotations") or {}
    value = annotations.get("gpu-admission.io/mig")
    return value if isinstance(value, str) else None


@dataclass
class Answered:
    """What the Flask app answered to a pod's /mutate, then to /validate of its mutated object."""

    object: dict[str, Any]
    warnings: list[str]
    """Of /mutate, then of /validate."""
    events: list[Event] = field(default_factory=list)
    """The Events the app raised."""


class _Events:
    """A recorder that keeps the Events of every result the app recorded."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def record(self, endpoint: str, review: Any, result: pipeline.Result | None, *rest: Any, **kw: Any) -> None:
        self.events += result.outcome.events if result is not None else []


def through_app(obj: dict[str, Any], nodes: list[dict[str, Any]], s: Settings | None = None) -> Answered:
    """``obj`` sent to the Flask app's /mutate, its patch applied, then the result sent to /validate."""
    s = s or settings()
    recorder = _Events()
    client = create_app(s, cluster=StaticCluster(build_view(nodes, s)), recorder=recorder).test_client()
    group, _, version = obj["apiVersion"].rpartition("/")
    warnings: list[str] = []
    for path in ("/mutate", "/validate"):
        request = {
            "uid": f"uid{path}",
            "kind": {"group": group, "version": version, "kind": obj["kind"]},
            "operation": "CREATE",
            "namespace": "ml",
            "userInfo": {"username": "alice"},
            "object": obj,
        }
        answer = client.post(
            path, json={"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
        )
        assert answer.status_code == 200, answer.data
        response = answer.get_json()["response"]
        assert response["allowed"], response
        warnings += response.get("warnings", [])
        if "patch" in response:
            obj = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
    return Answered(obj, warnings, recorder.events)

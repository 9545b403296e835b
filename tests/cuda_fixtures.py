"""Small builders for the CUDA tests: GPU nodes as ``kubectl get node -o yaml`` shows them, pods, contexts."""

from __future__ import annotations

from typing import Any

from webhook.cluster import ClusterView, build_view
from webhook.config import CudaSettings, Settings, build
from webhook.drivers import builtin_table, parse_version, show
from webhook.model import Context

POOL_LABEL = "eks.amazonaws.com/nodegroup"
A100 = "NVIDIA-A100-SXM4-80GB"


def gpu_node(
    name: str,
    pool: str,
    driver: str | None,
    *,
    gfd: str = "new",
    cuda: str | None = None,
    product: str = A100,
    compute: tuple[str, str] = ("8", "0"),
    gpus: str = "8",
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
    allocatable: dict[str, str] | None = None,
    pool_label: str = POOL_LABEL,
    runtime_labels: bool = True,
) -> dict[str, Any]:
    """A GPU node; ``gfd``: 'new' (cuda.driver-version.full, cuda.runtime-version.*), 'old' (cuda.driver.*,
    cuda.runtime.*) or 'none' (no GFD labels at all, as on GKE). The CUDA label is derived from the driver through
    the reference table unless ``cuda`` is given; ``runtime_labels=False`` leaves it out (the webhook then derives
    it from the driver itself)."""
    node_labels: dict[str, str] = {"kubernetes.io/hostname": name, pool_label: pool}
    if gfd != "none":
        node_labels.update(
            {
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": gpus,
                "nvidia.com/gpu.memory": "81920",
                "nvidia.com/gpu.compute.major": compute[0],
                "nvidia.com/gpu.compute.minor": compute[1],
            }
        )
        if driver is not None:
            version = parse_version(driver)
            assert version is not None
            runtime = cuda or show(builtin_table().cuda_for_driver(version) or (0, 0))
            major, minor = runtime.split(".")
            if gfd == "new":
                node_labels["nvidia.com/cuda.driver-version.full"] = driver
                if runtime_labels:
                    node_labels["nvidia.com/cuda.runtime-version.major"] = major
                    node_labels["nvidia.com/cuda.runtime-version.minor"] = minor
                    node_labels["nvidia.com/cuda.runtime-version.full"] = runtime
            else:
                parts = driver.split(".")
                node_labels["nvidia.com/cuda.driver.major"] = parts[0]
                node_labels["nvidia.com/cuda.driver.minor"] = parts[1]
                node_labels["nvidia.com/cuda.driver.rev"] = parts[2] if len(parts) > 2 else ""
                if runtime_labels:
                    node_labels["nvidia.com/cuda.runtime.major"] = major
                    node_labels["nvidia.com/cuda.runtime.minor"] = minor
    node_labels.update(labels or {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": node_labels},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {"cpu": "96", "memory": "1000Gi", "nvidia.com/gpu": gpus, **(allocatable or {})}},
    }


def container(
    name: str = "trainer",
    image: str = "nvidia/cuda:12.4.1-runtime-ubuntu22.04",
    gpu: str | None = "1",
    env: dict[str, str] | None = None,
    resources: dict[str, str] | None = None,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": image}
    limits = dict(resources or {})
    if gpu is not None:
        limits["nvidia.com/gpu"] = gpu
    if limits:
        c["resources"] = {"limits": limits}
    if env:
        c["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return c


def pod(
    *containers: dict[str, Any],
    init: list[dict[str, Any]] | None = None,
    annotations: dict[str, str] | None = None,
    affinity: dict[str, Any] | None = None,
    node_selector: dict[str, str] | None = None,
    name: str = "train",
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers) or [container()]}
    if init:
        spec["initContainers"] = init
    if affinity is not None:
        spec["affinity"] = affinity
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    metadata: dict[str, Any] = {"name": name, "namespace": "ml"}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def settings(cuda: dict[str, Any] | None = None, **sections: Any) -> Settings:
    data: dict[str, Any] = dict(sections)
    if cuda is not None:
        data["cuda"] = cuda
    return build(Settings, data)


def context(nodes: list[dict[str, Any]], s: Settings | None = None, namespace: str = "ml") -> Context:
    s = s or Settings()
    view: ClusterView = build_view(nodes, s)
    return Context(settings=s, cluster=view, namespace=namespace, username="alice")


def cuda_settings(**kw: Any) -> CudaSettings:
    return CudaSettings(**kw)


def deployment(spec: dict[str, Any], name: str = "w") -> dict[str, Any]:
    """A Deployment in namespace ml whose pod template has ``spec``."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {}, "spec": spec}},
    }

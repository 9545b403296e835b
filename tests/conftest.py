"""Shared fixtures: settings, a small GPU cluster, the Flask app and a test client, AdmissionReview builders."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from webhook.app import create_app
from webhook.cluster import StaticCluster, build_view
from webhook.config import Settings

if TYPE_CHECKING:
    from tests.kubeapi import KubeAPI

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures" / "kubernetes-api"
EXAMPLES = REPO / "examples"


def gpu_node(
    name: str,
    labels: dict[str, str] | None = None,
    allocatable: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A GPU node as `kubectl get node -o json` shows it (GFD labels, 8 GPUs, driver 550.54.15 / CUDA 12.4)."""
    base = {
        "kubernetes.io/hostname": name,
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/cuda.driver-version.full": "550.54.15",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "4",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {**base, **(labels or {})}},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {"cpu": "96", "memory": "1000Gi", "nvidia.com/gpu": "8", **(allocatable or {})}},
    }


def review(
    obj: Any,
    operation: str = "CREATE",
    namespace: str = "default",
    dry_run: bool = False,
    uid: str | None = None,
    **request: Any,
) -> dict[str, Any]:
    """Wrap an object in an AdmissionReview request as the apiserver sends it."""
    kind = obj.get("kind", "Pod") if isinstance(obj, dict) else "Pod"
    body: dict[str, Any] = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid or str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": kind.lower() + "s"},
            "operation": operation,
            "namespace": namespace,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": obj,
            "dryRun": dry_run,
        },
    }
    body["request"].update(request)
    return body


def gpu_pod(
    name: str = "trainer",
    limits: dict[str, str] | None = None,
    image: str = "nvidia/cuda:12.2.2-base-ubuntu22.04",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "containers": [{"name": name, "image": image, "resources": {"limits": limits or {"nvidia.com/gpu": "1"}}}]
        },
    }
    if annotations:
        pod["metadata"]["annotations"] = annotations
    return pod


def load_fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


@pytest.fixture
def settings() -> Settings:
    return Settings()


@pytest.fixture
def cluster(settings: Settings) -> StaticCluster:
    return StaticCluster(build_view([gpu_node("h100-a"), gpu_node("h100-b")], settings))


@pytest.fixture
def app(settings: Settings, cluster: StaticCluster) -> Any:
    return create_app(settings, cluster=cluster)


@pytest.fixture
def client(app: Any) -> Any:
    return app.test_client()


@pytest.fixture
def tls_api(tmp_path: Path) -> Iterator[KubeAPI]:
    """The API stand-in (tests/kubeapi.py) over HTTPS; its kubeconfig names the CA that signed its certificate."""
    from tests.kubeapi import KubeAPI
    from tests.serving import issue_certs

    certs = issue_certs(tmp_path / "certs")
    api = KubeAPI(tls=(str(certs / "tls.crt"), str(certs / "tls.key")), ca=str(certs / "ca.crt")).start()
    yield api
    api.stop()

"""The headline: what the webhook decided shows in the real ``kubectl describe pod``.

The webhook mutates a GPU pod, the pod is stored in the in-test API server (tests/kubeapi.py) as the apiserver would
store it (name generated, uid assigned), the validating call is answered, and the webhook's event worker creates the
Events there through the ``kubernetes`` client. Then ``kubectl describe pod`` (the binary the Makefile installs in
``.tools``) must show the webhook's annotations and Events.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
from kubernetes import config as kube_config

from tests.conftest import REPO, gpu_node, gpu_pod, review
from tests.kubeapi import KubeAPI
from webhook.app import create_app
from webhook.audit import build_recorder
from webhook.cluster import StaticCluster, build_view
from webhook.config import CudaSettings, Settings
from webhook.events import EventQueue

KUBECTL = REPO / ".tools" / "kubectl"
SPOT_TAINT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}

pytestmark = pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl not installed in .tools (run: make tools)")


@pytest.fixture
def kubeapi() -> Any:
    api = KubeAPI().start()
    yield api
    api.stop()


def admit(api: KubeAPI, kubeconfig: str, settings: Settings, pod: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Mutate, store as the apiserver would, validate; return the stored pod and the /validate answer."""
    cluster = StaticCluster(
        build_view(
            [
                gpu_node("h100-a"),
                gpu_node("spot-a", labels={"cloud.google.com/gke-spot": "true"}, taints=[SPOT_TAINT]),
            ],
            settings,
        )
    )
    recorder = build_recorder(settings, cluster, api_client=kube_config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]
    client = create_app(settings, cluster=cluster, recorder=recorder).test_client()
    mutated = client.post("/mutate", json=review(pod)).get_json()["response"]
    assert mutated["allowed"] is True
    patch = json.loads(base64.b64decode(mutated["patch"])) if "patch" in mutated else []
    obj = jsonpatch.apply_patch(pod, patch)
    if not obj["metadata"].get("name"):
        obj["metadata"]["name"] = obj["metadata"]["generateName"] + "x7k2p"  # the apiserver names it
    stored = api.put("v1", "pods", obj)  # and gives it a uid
    answer = client.post("/validate", json=review(stored, name=stored["metadata"]["name"])).get_json()["response"]
    assert isinstance(recorder.events, EventQueue) and recorder.events.drain(10)
    assert recorder.events.failed == 0
    return stored, answer


def describe(kubeconfig: str, name: str) -> str:
    out = subprocess.run(
        [str(KUBECTL), "--kubeconfig", kubeconfig, "describe", "pod", name, "--namespace", "default"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def events_section(text: str) -> list[list[str]]:
    """The rows under ``Events:`` split into Type, Reason, Age, From, Message."""
    rows = text.split("\nEvents:", 1)[1].splitlines()[3:]
    return [row.split(None, 4) for row in rows if row.strip()]


def test_describe_shows_annotations_and_events(kubeapi: KubeAPI, tmp_path: Path) -> None:
    kubeconfig = kubeapi.kubeconfig(str(tmp_path / "kubeconfig"))
    pod = gpu_pod(annotations={"gpu-admission.io/spot": "tolerate"})
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "trainer-"
    stored, answer = admit(kubeapi, kubeconfig, Settings(), pod)
    assert answer["allowed"] is True

    text = describe(kubeconfig, stored["metadata"]["name"])
    assert f"Name:         {stored['metadata']['name']}" in text
    assert "gpu-admission.io/spot-applied: tolerate (asked by annotation); tolerates cloud.google.com/gke-spot" in text
    assert "gpu-admission.io/cuda:" in text
    assert "Tolerations:           cloud.google.com/gke-spot=true:NoSchedule" in text
    rows = {row[1]: row for row in events_section(text)}
    assert set(rows) == {"SpotTolerated", "CUDAChecked"}, text
    for row in rows.values():
        assert row[0] == "Normal"
        assert row[3] == "gpu-admission"
    assert rows["SpotTolerated"][4].startswith("spot tolerate (asked by annotation); tolerates cloud.google.com/")
    assert "CUDA 12.2" in rows["CUDAChecked"][4]


def test_describe_shows_a_warn_mode_incompatibility_as_a_warning(kubeapi: KubeAPI, tmp_path: Path) -> None:
    kubeconfig = kubeapi.kubeconfig(str(tmp_path / "kubeconfig"))
    settings = Settings(cuda=CudaSettings(mode="warn"))
    _, answer = admit(kubeapi, kubeconfig, settings, gpu_pod(image="pytorch/pytorch-nightly:2700000-cu12.8"))
    assert answer["allowed"] is True
    assert any("would be denied (CUDAIncompatible)" in w for w in answer["warnings"])
    assert "cuda-would-deny" in answer["auditAnnotations"]

    rows = events_section(describe(kubeconfig, "trainer"))
    assert [(r[0], r[1], r[3]) for r in rows] == [("Warning", "CUDAIncompatible", "gpu-admission")]
    assert "needs CUDA 12.8" in rows[0][4]


def test_describe_shows_no_webhook_events_after_a_dry_run(kubeapi: KubeAPI, tmp_path: Path) -> None:
    kubeconfig = kubeapi.kubeconfig(str(tmp_path / "kubeconfig"))
    settings = Settings()
    cluster = StaticCluster(build_view([gpu_node("h100-a")], settings))
    recorder = build_recorder(settings, cluster, api_client=kube_config.new_client_from_config(config_file=kubeconfig))  # type: ignore[no-untyped-call]
    client = create_app(settings, cluster=cluster, recorder=recorder).test_client()
    stored = kubeapi.put("v1", "pods", gpu_pod())
    assert client.post("/validate", json=review(stored, name="trainer", dry_run=True)).status_code == 200
    assert isinstance(recorder.events, EventQueue) and recorder.events.drain(10)
    assert kubeapi.list("v1", "events", "default") == []
    assert re.search(r"^Events:\s+<none>$", describe(kubeconfig, "trainer"), re.M)
    # the same request for real does leave its Event
    assert client.post("/validate", json=review(stored, name="trainer")).status_code == 200
    assert recorder.events.drain(10)
    assert [r[1] for r in events_section(describe(kubeconfig, "trainer"))] == ["CUDAChecked"]

"""Every object in shared/fixtures/kubernetes-api gets a valid answer from both endpoints and from `review`."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from tests.conftest import FIXTURES, review

OBJECTS = sorted(p.name for p in FIXTURES.glob("*.json") if not p.name.startswith("admission."))


def test_the_shared_fixtures_are_there() -> None:
    # Everything below is parametrised over them: a missing shared/ folder must fail, not collect nothing.
    assert len(OBJECTS) >= 9, f"expected the API fixtures in {FIXTURES}"


REVIEWABLE = {"Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob"}


def _fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / name).read_text())
    return data


@pytest.mark.parametrize("name", OBJECTS)
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_fixture_gets_valid_answers(client: Any, name: str, operation: str) -> None:
    obj = _fixture(name)
    for path in ("/mutate", "/validate"):
        body = review(obj, operation=operation, uid=f"uid-{name}")
        r = client.post(path, data=json.dumps(body), content_type="application/json")
        assert r.status_code == 200, r.get_json()
        answer = r.get_json()
        assert answer["kind"] == "AdmissionReview" and answer["apiVersion"] == "admission.k8s.io/v1"
        response = answer["response"]
        assert response["uid"] == f"uid-{name}"
        assert isinstance(response["allowed"], bool)
        if not response["allowed"]:
            assert response["status"]["message"]
        if path == "/validate":
            assert "patch" not in response
        if "patch" in response:
            assert response["patchType"] == "JSONPatch"
            patched = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
            again = review(patched, operation=operation)
            r2 = client.post("/mutate", data=json.dumps(again), content_type="application/json").get_json()
            assert "patch" not in r2["response"], "mutating the result again must change nothing"
        for warning in response.get("warnings", []):
            assert len(warning) < 120


def test_admission_review_fixture_is_answered(client: Any) -> None:
    body = _fixture("admission.k8s.io.v1.AdmissionReview.json")
    body["request"]["operation"] = "CREATE"
    r = client.post("/mutate", data=json.dumps(body), content_type="application/json")
    assert r.status_code == 200
    assert r.get_json()["response"]["uid"] == "uidValue"


def test_admission_review_fixture_with_its_odd_operation_is_refused_clearly(client: Any) -> None:
    body = _fixture("admission.k8s.io.v1.AdmissionReview.json")
    r = client.post("/validate", data=json.dumps(body), content_type="application/json")
    assert r.status_code == 400 and "operationValue" in r.get_json()["error"]


@pytest.mark.parametrize("name", [n for n in OBJECTS if _fixture(n)["kind"] in REVIEWABLE])
def test_fixture_through_review_cli(name: str, tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": [_fixture("core.v1.Node.json")]}))
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook.cli",
            "review",
            "-f",
            str(FIXTURES / name),
            "--nodes",
            str(nodes),
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode in (0, 1), run.stderr
    out = json.loads(run.stdout)
    workload = _fixture(name)["kind"] != "Pod"  # a workload's says too whether its pods would be admitted
    pods = ["podsAllowed", "podsRefused", "podsPending", "podsWithoutGpu"] if workload else []
    assert set(out) == {"allowed", "message", "warnings", "patch", "object", *pods}
    broken = out.get("podsPending") or out.get("podsWithoutGpu")
    assert (run.returncode == 0) == (out["allowed"] and out.get("podsAllowed", True) and not broken)
    if out["allowed"]:
        assert jsonpatch.apply_patch(_fixture(name), out["patch"]) == out["object"]

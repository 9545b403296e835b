"""Trust (issue 10): a pod cannot write the webhook's output annotations, opt itself out, or exempt itself; nothing
secret reaches the logs; plaintext is refused; the chart runs the server as non-root on a read-only root filesystem.

Basic TLS checks (TLS 1.0/1.1 refused, plaintext GET refused, the apiserver's verification) are in test_server.py.
"""

from __future__ import annotations

import copy
import json
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.hardening_fixtures import (
    SETTINGS_DATA,
    apply,
    check_answer,
    cluster_nodes,
    hardening_settings,
    patch_of,
    post,
    quiet_app,
    wrap,
)
from tests.serving import REPO, serve
from webhook import PREFIX
from webhook.model import is_input_annotation

CUDA12 = "nvidia/cuda:12.2.2-base-ubuntu22.04"
CUDA13 = "pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime"
"""No node of the hardening cluster supports CUDA 13: a pod with this image is denied whenever it is reviewed."""


def pod(
    image: str = CUDA12,
    limits: dict[str, str] | None = None,
    annotations: dict[str, Any] | None = None,
    labels: dict[str, Any] | None = None,
    namespace: str = "default",
) -> dict[str, Any]:
    p: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": namespace},
        "spec": {
            "containers": [
                {"name": "trainer", "image": image, "resources": {"limits": limits or {"nvidia.com/gpu": "1"}}}
            ]
        },
    }
    if annotations is not None:
        p["metadata"]["annotations"] = annotations
    if labels is not None:
        p["metadata"]["labels"] = labels
    return p


def deployment(template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "default"},
        "spec": {"replicas": 1, "template": {"metadata": template["metadata"], "spec": template["spec"]}},
    }


@pytest.fixture(scope="module")
def client() -> Any:
    return quiet_app(hardening_settings()).test_client()


def mutated(client: Any, obj: dict[str, Any], **request: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(response, the object after the patch)"""
    body = wrap(obj, **request)
    status, answer = post(client, "/mutate", body)
    response = check_answer(status, answer, body["request"]["uid"], mutating=True)
    assert response is not None
    return response, apply(copy.deepcopy(obj), patch_of(response))


def outputs(obj: dict[str, Any]) -> dict[str, Any]:
    """The webhook's output annotations on the pod (or the workload's template)."""
    meta = obj["metadata"] if obj["kind"] == "Pod" else obj["spec"]["template"]["metadata"]
    annotations = meta.get("annotations") or {}
    return {k: v for k, v in annotations.items() if k.startswith(PREFIX) and not is_input_annotation(k)}


# -- forged output annotations ---------------------------------------------------------------------------------------

FORGED_KEYS = ["cuda", "mig", "spot-applied", "decision", "cuda-would-deny", "approved", "anything.else"]
SUBJECTS = [
    pytest.param(pod(), id="whole-gpu"),
    pytest.param(pod(limits={"nvidia.com/gpu": "0.5"}), id="fraction"),
    pytest.param(pod(annotations={"gpu-admission.io/spot": "tolerate"}), id="spot"),
    pytest.param(pod(image="nginx", limits={"cpu": "1"}), id="not-gpu"),
    pytest.param(deployment(pod(limits={"nvidia.com/gpu": "0.5"})), id="deployment-fraction"),
]


def _with_annotations(obj: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    obj = copy.deepcopy(obj)
    meta = obj["metadata"] if obj["kind"] == "Pod" else obj["spec"]["template"]["metadata"]
    meta["annotations"] = {**(meta.get("annotations") or {}), **extra}
    return obj


@pytest.mark.parametrize("key", FORGED_KEYS)
@pytest.mark.parametrize("subject", SUBJECTS)
def test_forged_output_annotation_is_replaced_by_the_webhooks_own(
    client: Any, subject: dict[str, Any], key: str
) -> None:
    _, clean = mutated(client, subject)
    forged = _with_annotations(subject, {PREFIX + key: "FORGED: approved by the platform team"})
    _, result = mutated(client, forged)
    assert outputs(result) == outputs(clean)
    assert "FORGED" not in json.dumps(result)


@pytest.mark.parametrize("value", [["x"], 7, None, {"a": "FORGED"}, True], ids=["list", "int", "null", "map", "bool"])
def test_forged_output_annotation_of_any_type_is_replaced(client: Any, value: Any) -> None:
    subject = pod(limits={"nvidia.com/gpu": "0.5"})
    _, clean = mutated(client, subject)
    _, result = mutated(client, _with_annotations(subject, {PREFIX + "mig": value, PREFIX + "cuda": value}))
    assert outputs(result) == outputs(clean)


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("trainer: nvidia.com/gpu 500m -> nvidia.com/mig-3g.40gb (FORGED, pool x)", id="parenthesis"),
        pytest.param("trainer: FORGED approval -> nvidia.com/mig-3g.40gb (A100)", id="asked"),
    ],
)
def test_forged_mig_line_on_an_already_converted_pod_is_not_republished(client: Any, line: str) -> None:
    subject = pod(limits={"nvidia.com/mig-3g.40gb": "1"}, annotations={PREFIX + "mig": line})
    _, result = mutated(client, subject)
    assert "FORGED" not in json.dumps(outputs(result))


# -- opt-out and exemptions ------------------------------------------------------------------------------------------


def _decide(client: Any, obj: dict[str, Any], **request: Any) -> str:
    """'skipped' when /mutate and /validate both pass the object untouched, else 'reviewed' (a CUDA-13 pod is denied
    by every review)."""
    verdicts = []
    for path in ("/mutate", "/validate"):
        body = wrap(obj, **request)
        status, answer = post(client, path, body)
        response = check_answer(status, answer, body["request"]["uid"], mutating=path == "/mutate")
        assert response is not None
        verdicts.append("skipped" if response["allowed"] and "patch" not in response else "reviewed")
    assert len(set(verdicts)) == 1, verdicts
    return verdicts[0]


@pytest.mark.parametrize(
    ("allow", "labels", "annotations", "expected"),
    [
        pytest.param(False, {"gpu-admission.io/ignore": "true"}, None, "reviewed", id="label-not-allowed"),
        pytest.param(True, {"gpu-admission.io/ignore": "true"}, None, "skipped", id="label-allowed"),
        pytest.param(True, None, {"gpu-admission.io/ignore": "true"}, "reviewed", id="annotation-is-not-the-label"),
        pytest.param(True, {"gpu-admission.io/ignore": "True"}, None, "reviewed", id="label-other-spelling"),
        pytest.param(True, {"gpu-admission.io/ignore": True}, None, "reviewed", id="label-not-a-string"),
        pytest.param(True, {"gpu-admission.io/ignored": "true"}, None, "reviewed", id="other-label"),
        pytest.param(
            False,
            None,
            {"gpu-admission.io/ignore": "true", "gpu-admission.io/exempt": "true"},
            "reviewed",
            id="annotations-not-allowed",
        ),
    ],
)
def test_opt_out_label_only_where_configuration_allows(
    allow: bool, labels: dict[str, Any] | None, annotations: dict[str, Any] | None, expected: str
) -> None:
    client = quiet_app(hardening_settings(exemptions={"allowOptOutLabel": allow})).test_client()
    assert _decide(client, pod(image=CUDA13, labels=labels, annotations=annotations)) == expected


def test_opt_out_label_on_a_workload_template_only_where_allowed() -> None:
    workload = deployment(pod(image=CUDA13, labels={"gpu-admission.io/ignore": "true"}))
    workload["metadata"]["labels"] = {"gpu-admission.io/ignore": "true"}
    for allow, expected in ((False, "reviewed"), (True, "skipped")):
        client = quiet_app(hardening_settings(exemptions={"allowOptOutLabel": allow})).test_client()
        assert _decide(client, workload) == expected, allow


ALICE = {"username": "alice", "groups": ["system:authenticated"]}
EXEMPTIONS = [
    pytest.param({"namespace": "kube-system"}, {}, "skipped", id="exempt-namespace"),
    pytest.param({"namespace": "gpu-admission"}, {}, "skipped", id="webhooks-own-namespace"),
    pytest.param({"userInfo": {"username": "system:admin"}}, {}, "skipped", id="exempt-user"),
    pytest.param(
        {"userInfo": {"username": "bob", "groups": ["devs", "platform-admins"]}}, {}, "skipped", id="exempt-group"
    ),
    pytest.param({}, {"namespace": "kube-system"}, "reviewed", id="object-claims-exempt-namespace"),
    pytest.param(
        {},
        {"annotations": {"gpu-admission.io/exempt": "true", "kubernetes.io/username": "system:admin"}},
        "reviewed",
        id="annotations-claim-exemption",
    ),
    pytest.param(
        {},
        {
            "labels": {
                "gpu-admission.io/exempt": "true",
                "group": "platform-admins",
                "kubernetes.io/metadata.name": "kube-system",
            }
        },
        "reviewed",
        id="labels-claim-exemption",
    ),
    pytest.param(
        {},
        {"managedFields": [{"manager": "system:admin", "operation": "Update"}]},
        "reviewed",
        id="managed-fields-name-exempt-user",
    ),
    pytest.param(
        {"userInfo": {**ALICE, "extra": {"groups": ["platform-admins"], "username": ["system:admin"]}}},
        {},
        "reviewed",
        id="userinfo-extra-is-not-identity",
    ),
    pytest.param(
        {"userInfo": {"username": "alice", "groups": "platform-admins"}}, {}, "reviewed", id="groups-not-a-list"
    ),
    pytest.param({"userInfo": {"username": "System:Admin"}}, {}, "reviewed", id="user-other-case"),
    pytest.param(
        {"userInfo": {"username": "alice", "groups": ["platform-admins-not"]}}, {}, "reviewed", id="group-prefix"
    ),
    pytest.param({"namespace": "kube-system-x"}, {}, "reviewed", id="namespace-prefix"),
    pytest.param({"dryRun": True}, {}, "reviewed", id="dry-run-is-reviewed"),
]


@pytest.mark.parametrize(("request_fields", "metadata", "expected"), EXEMPTIONS)
def test_exemptions_come_only_from_configuration_and_userinfo(
    client: Any, request_fields: dict[str, Any], metadata: dict[str, Any], expected: str
) -> None:
    obj = pod(image=CUDA13)
    obj["metadata"].update(metadata)
    fields = {"namespace": "default", "userInfo": ALICE, **request_fields}
    assert _decide(client, obj, **fields) == expected


# -- nothing secret in the logs --------------------------------------------------------------------------------------

SECRET = "s3cr3t-Value-7f1d9c0b2a"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.tokenbody-a8c3e1"


def _secret_pods() -> list[dict[str, Any]]:
    env = [
        {"name": "DB_PASSWORD", "value": SECRET},
        {"name": "API_TOKEN", "value": TOKEN},
        {"name": "CUDA_VERSION", "value": "12.2"},
    ]
    notes = {"vault.hashicorp.com/agent-token": TOKEN, "config": json.dumps({"password": SECRET})}
    out = []
    for image, limits, extra in [
        (CUDA12, {"nvidia.com/gpu": "1"}, {}),
        (CUDA13, {"nvidia.com/gpu": "1"}, {}),
        (CUDA12, {"nvidia.com/gpu": "0.5"}, {"gpu-admission.io/spot": "tolerate"}),
        (CUDA12, {"nvidia.com/gpu": "1.5"}, {}),
        ("busybox", {"nvidia.com/gpu": "1"}, {}),
    ]:
        p = pod(image=image, limits=limits, annotations={**notes, **extra})
        p["spec"]["containers"][0]["env"] = env
        p["spec"]["containers"][0]["args"] = ["--password", SECRET]
        out.append(p)
    return out


def test_no_env_values_secrets_or_objects_in_the_server_log(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": cluster_nodes()}))
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps(SETTINGS_DATA))
    with serve(tmp_path, nodes=nodes, config=config, workers=1) as server:
        client = server.client()
        answered = 0
        for obj in _secret_pods():
            for namespace in ("default", "warn-ns", "kube-system"):
                for path in ("/mutate", "/validate"):
                    status, _ = client.post(path, wrap(obj, namespace=namespace))
                    assert status == 200
                    answered += 1
        bad = json.dumps(wrap(_secret_pods()[0])).replace('"kind": "Pod"', '"kind": "Pod", "kind": "Pod"', 1)
        status, _ = client.request("POST", "/mutate", raw=bad.encode())
        assert status == 400
        status, _ = client.request("POST", "/validate", raw=bad.encode()[: len(bad) // 2])
        assert status == 400
        client.close()
    log = server.output()
    lines = [line for line in log.splitlines() if line.strip()]
    assert sum('"uid"' in line for line in lines) >= answered, "the decision log must have run"
    for needle in (SECRET, TOKEN, "DB_PASSWORD", "agent-token", "--password"):
        assert needle not in log, f"{needle!r} is in the server's log"
    for line in lines:
        assert '"containers"' not in line and '"spec"' not in line, f"an object in the log: {line[:200]}"
        assert len(line) < 4096, f"a log line of {len(line)} characters"


# -- transport -------------------------------------------------------------------------------------------------------


def test_plaintext_review_is_not_processed(tmp_path: Path) -> None:
    """Beyond test_server's plaintext GET: a plaintext POST with a review gets no AdmissionReview back."""
    body = json.dumps(wrap(pod())).encode()
    with serve(tmp_path, workers=1) as server, socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        s.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        try:
            data = s.recv(4096)
        except (ConnectionResetError, TimeoutError):
            data = b""
    assert b"AdmissionReview" not in data and b"200 OK" not in data


# -- the chart: non-root, read-only root filesystem ------------------------------------------------------------------

CHART = REPO / "charts" / "gpu-admission"


def _helm() -> str | None:
    local = REPO / ".tools" / "helm"
    return str(local) if local.is_file() else shutil.which("helm")


def render(*values: str) -> list[dict[str, Any]]:
    helm = _helm()
    if helm is None or not CHART.is_dir():
        pytest.skip("helm or the chart is not there (make test installs helm)")
    args = [helm, "template", "t", str(CHART), "--namespace", "gpu-admission"]
    for v in values:
        args += ["--set", v]
    out = subprocess.run(args, check=True, capture_output=True, text=True, timeout=60).stdout
    return [d for d in yaml.safe_load_all(out) if isinstance(d, dict)]


def pod_specs(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    specs = []
    for d in docs:
        kind, name = d.get("kind"), d.get("metadata", {}).get("name")
        if kind == "Pod":
            specs.append((f"Pod/{name}", d["spec"]))
        elif kind in ("Deployment", "Job", "DaemonSet", "StatefulSet"):
            specs.append((f"{kind}/{name}", d["spec"]["template"]["spec"]))
        elif kind == "CronJob":
            specs.append((f"CronJob/{name}", d["spec"]["jobTemplate"]["spec"]["template"]["spec"]))
    return specs


@pytest.mark.parametrize(
    "values", [pytest.param((), id="defaults"), pytest.param(("certs.mode=certManager",), id="cert-manager")]
)
def test_chart_runs_every_container_non_root_on_a_read_only_root(values: tuple[str, ...]) -> None:
    specs = pod_specs(render(*values))
    assert any(name.startswith("Deployment/") for name, _ in specs)
    for name, spec in specs:
        pod_ctx = spec.get("securityContext") or {}
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            ctx = {**pod_ctx, **(c.get("securityContext") or {})}
            where = f"{name} container {c['name']}"
            assert ctx.get("runAsNonRoot") is True, where
            assert ctx.get("runAsUser", 0) != 0, where
            assert ctx.get("readOnlyRootFilesystem") is True, where
            assert ctx.get("allowPrivilegeEscalation") is False, where
            assert "ALL" in (ctx.get("capabilities") or {}).get("drop", []), where
            assert not (ctx.get("privileged") or False), where


def test_chart_server_has_a_writable_tmp_and_read_only_secrets() -> None:
    """A read-only root needs an emptyDir for gunicorn's worker heartbeat files and the metrics directory."""
    (deployment_spec,) = [s for n, s in pod_specs(render()) if n.startswith("Deployment/")]
    (server,) = [c for c in deployment_spec["containers"] if "serve" in c.get("args", [])]
    mounts = {m["mountPath"]: m for m in server.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in deployment_spec.get("volumes", [])}
    assert "/tmp" in mounts and "emptyDir" in volumes[mounts["/tmp"]["name"]]
    env = {e["name"]: e.get("value") for e in server.get("env", [])}
    assert env.get("PROMETHEUS_MULTIPROC_DIR", "/tmp").startswith("/tmp")
    for path, mount in mounts.items():
        if "secret" in volumes[mount["name"]] or "configMap" in volumes[mount["name"]]:
            assert mount.get("readOnly") is True, path


def test_chart_never_sends_its_own_namespace_or_kube_system() -> None:
    docs = render()
    configs = [d for d in docs if d.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")]
    assert len(configs) == 2
    for config in configs:
        for hook in config["webhooks"]:
            excluded = [
                e
                for e in hook["namespaceSelector"]["matchExpressions"]
                if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"
            ]
            assert excluded and {"gpu-admission", "kube-system"} <= set(excluded[0]["values"])
            assert hook["failurePolicy"] in ("Fail", "Ignore")
            assert 1 <= hook["timeoutSeconds"] <= 30
            assert hook["sideEffects"] in ("None", "NoneOnDryRun")


def test_chart_defaults_let_no_pod_opt_itself_out() -> None:
    docs = render()
    config = next(d for d in docs if d.get("kind") == "ConfigMap" and "config.yaml" in d.get("data", {}))
    settings = yaml.safe_load(config["data"]["config.yaml"]) or {}
    allowed = bool((settings.get("exemptions") or {}).get("allowOptOutLabel"))
    for d in docs:
        if d.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for hook in d["webhooks"]:
                keys = [e["key"] for e in (hook.get("objectSelector") or {}).get("matchExpressions", [])]
                assert allowed or "gpu-admission.io/ignore" not in keys, hook["name"]

"""The webhooks' matchConditions (CEL), evaluated with cel-python against a table of objects.

In the apiserver `object` is untyped in matchConditions: reading an absent field is an error, and an error under
failurePolicy Fail rejects the request. So every case also checks that evaluation does not error.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import celpy
import pytest
from celpy.adapter import json_to_cel

from tests.conftest import FIXTURES
from tests.test_chart import find, render_values

KINDS = {
    "Pod": ("", "v1"),
    "Deployment": ("apps", "v1"),
    "StatefulSet": ("apps", "v1"),
    "DaemonSet": ("apps", "v1"),
    "ReplicaSet": ("apps", "v1"),
    "Job": ("batch", "v1"),
    "CronJob": ("batch", "v1"),
}


def conditions(value_set: str) -> list[list[str]]:
    """Per webhook, its matchConditions expressions (the apiserver sends a request only when all are true)."""
    objects = render_values(value_set)
    out = []
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        for hook in find(objects, kind)["webhooks"]:
            if hook["name"] not in (PROTECT, UNGATE):  # pod updates only: tested below
                out.append([c["expression"] for c in hook["matchConditions"]])
    return out


def expressions(value_set: str) -> list[str]:
    """Per webhook, its gpu-related expression."""
    return [exprs[0] for exprs in conditions(value_set)]


PROTECT = "protect-annotations.gpu-admission.io"
UNGATE = "ungate.gpu-admission.io"


def program(value_set: str) -> list[Any]:
    per_hook = conditions(value_set)
    assert all(exprs == per_hook[0] for exprs in per_hook), "both webhooks must select the same objects"
    env = celpy.Environment()
    return [env.program(env.compile(e)) for e in per_hook[0]]


def sent(programs: list[Any], obj: dict[str, Any], namespace: str = "team", old: dict[str, Any] | None = None) -> bool:
    kind = str(obj.get("kind", "Pod"))
    group, version = KINDS.get(kind, ("", "v1"))
    request = {
        "kind": {"group": group, "version": version, "kind": kind},
        "namespace": namespace,
        "operation": "CREATE" if old is None else "UPDATE",
    }
    activation = {"object": json_to_cel(obj), "oldObject": json_to_cel(old), "request": json_to_cel(request)}
    results = []
    for prog in programs:
        result = prog.evaluate(activation)
        assert isinstance(result, celpy.celtypes.BoolType), f"CEL did not give a bool: {result!r}"
        results.append(bool(result))
    return all(results)


def container(
    name: str = "main",
    limits: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    env: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"}
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    if resources:
        c["resources"] = resources
    if env is not None:
        c["env"] = env
    return c


def pod(
    *containers: dict[str, Any],
    annotations: dict[str, str] | None = None,
    init: list[dict[str, Any]] | None = None,
    **meta: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = init
    metadata: dict[str, Any] = {"name": "p", **meta}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def workload(kind: str, template_pod: dict[str, Any]) -> dict[str, Any]:
    template = {"metadata": template_pod["metadata"], "spec": template_pod["spec"]}
    if kind == "CronJob":
        spec: dict[str, Any] = {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}
    else:
        spec = {"template": template}
    group, version = KINDS[kind]
    return {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": {"name": "w"}, "spec": spec}


GPU = {"nvidia.com/gpu": "1"}
CPU = {"cpu": "1", "memory": "1Gi"}

CASES = [
    pytest.param(pod(container(limits=GPU)), True, id="gpu-pod-sent"),
    pytest.param(pod(container(requests=GPU)), True, id="gpu-in-requests-only-sent"),
    pytest.param(pod(container(limits={"nvidia.com/gpu": "500m"})), True, id="fraction-pod-sent"),
    pytest.param(pod(container(limits={"nvidia.com/mig-3g.40gb": "1"})), True, id="mig-resource-sent"),
    pytest.param(pod(container(limits={"nvidia.com/gpu.shared": "1"})), True, id="time-sliced-resource-sent"),
    pytest.param(pod(container(limits={"gpu-admission.io/gpu-memory": "20Gi"})), True, id="gpu-memory-pod-sent"),
    pytest.param(pod(container(limits=CPU)), False, id="cpu-pod-not-sent"),
    pytest.param(pod(container(limits=CPU), annotations={"example.com/x": "1"}), False, id="other-annotation-not-sent"),
    pytest.param(
        pod(container(limits=CPU), annotations={"gpu-admission.io/spot": "tolerate"}), True, id="spot-pod-sent"
    ),
    pytest.param(
        pod(container(), annotations={"gpu-admission.io/gpu-fraction": "0.25"}), True, id="fraction-annotation-sent"
    ),
    pytest.param(
        pod(container(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}])), True, id="visible-devices-env-sent"
    ),
    pytest.param(
        pod(container(env=[{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])),
        False,
        id="env-without-value-not-sent",
    ),
    pytest.param(pod(container(limits=CPU), init=[container("init", limits=GPU)]), True, id="gpu-init-container-sent"),
    pytest.param(pod(container("a", limits=CPU), container("b", limits=GPU)), True, id="second-container-gpu-sent"),
    pytest.param(
        workload("Deployment", pod(container(limits={"nvidia.com/gpu": "0.5"}))),
        True,
        id="deployment-with-fraction-sent",
    ),
    pytest.param(workload("Deployment", pod(container(limits=CPU))), False, id="cpu-deployment-not-sent"),
    pytest.param(
        workload("Deployment", pod(container(), annotations={"gpu-admission.io/spot": "prefer"})),
        True,
        id="deployment-template-spot-annotation-sent",
    ),
    pytest.param(workload("StatefulSet", pod(container(limits=GPU))), True, id="gpu-statefulset-sent"),
    pytest.param(workload("DaemonSet", pod(container(limits=GPU))), True, id="gpu-daemonset-sent"),
    pytest.param(workload("ReplicaSet", pod(container(limits=GPU))), True, id="gpu-replicaset-sent"),
    pytest.param(workload("Job", pod(container(limits={"nvidia.com/gpu": "0.5"}))), True, id="job-fraction-sent"),
    pytest.param(
        workload("CronJob", pod(container(limits={"gpu-admission.io/gpu-memory": "20Gi"}))),
        True,
        id="cronjob-with-gpu-memory-sent",
    ),
    pytest.param(workload("CronJob", pod(container(limits=CPU))), False, id="cpu-cronjob-not-sent"),
    # Absent fields: must evaluate (to false), never error.
    pytest.param({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}, False, id="pod-without-spec"),
    pytest.param({"kind": "Pod"}, False, id="pod-without-metadata-or-spec"),
    pytest.param({"kind": "Pod", "metadata": {}, "spec": {}}, False, id="pod-without-containers"),
    pytest.param(pod({"name": "c"}), False, id="container-without-resources"),
    pytest.param(pod({"name": "c", "resources": {}}), False, id="resources-without-limits"),
    pytest.param(pod({"name": "c", "env": [{"value": "x"}]}), False, id="env-entry-without-name"),
    pytest.param(
        {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {}}},
        False,
        id="template-without-metadata-or-spec",
    ),
    pytest.param(
        {"kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": {"metadata": {}}}},
        False,
        id="template-metadata-without-annotations",
    ),
    pytest.param(
        {"kind": "CronJob", "metadata": {"name": "c"}, "spec": {"jobTemplate": {}}},
        False,
        id="cronjob-without-job-spec",
    ),
    pytest.param(
        {"kind": "CronJob", "metadata": {"name": "c"}, "spec": {"jobTemplate": {"spec": {}}}},
        False,
        id="cronjob-without-pod-template",
    ),
]


@pytest.fixture(scope="module")
def default_program() -> Any:
    return program("defaults")


@pytest.mark.parametrize(("obj", "expected"), CASES)
def test_match_conditions(default_program, obj, expected):
    assert sent(default_program, obj) is expected


def _fixtures() -> list[Any]:
    """The upstream round-trip objects of the kinds the webhook receives."""
    paths = sorted(FIXTURES.glob("*.json"))
    return [pytest.param(p, id=p.stem) for p in paths if json.loads(p.read_text()).get("kind") in KINDS]


def _pod_spec(obj: dict[str, Any]) -> Any:
    if obj["kind"] == "Pod":
        return obj["spec"]
    if obj["kind"] == "CronJob":
        return obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    return obj["spec"]["template"]["spec"]


@pytest.mark.parametrize("path", _fixtures())
def test_fixtures_with_every_field_set_evaluate_without_error(default_program, path):
    obj = json.loads(path.read_text())
    assert sent(default_program, obj) is False  # placeholder keys: no GPU resource, no gpu-admission.io/ key
    gpu = copy.deepcopy(obj)
    _pod_spec(gpu)["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1"
    assert sent(default_program, gpu) is True


@pytest.mark.parametrize(
    ("obj", "namespace", "expected"),
    [
        pytest.param(pod(container(limits=CPU)), "batch", True, id="namespace-with-spot-default-sent"),
        pytest.param(pod(container(limits=CPU)), "interactive", False, id="namespace-spot-default-off-not-sent"),
        pytest.param(pod(container(limits=CPU)), "team", False, id="other-namespace-cpu-pod-not-sent"),
        pytest.param(workload("Job", pod(container(limits=CPU))), "team", True, id="owner-kind-default-sent"),
        pytest.param(
            workload("CronJob", pod(container(limits=CPU))), "team", True, id="cronjob-whose-jobs-have-a-default-sent"
        ),
        pytest.param(workload("Deployment", pod(container(limits=CPU))), "team", True, id="deployment-default-sent"),
        pytest.param(
            pod(
                container(limits=CPU),
                labels={"pod-template-hash": "5d8f9c7b6"},
                ownerReferences=[{"kind": "ReplicaSet", "name": "d-5d8f9c7b6"}],
            ),
            "team",
            True,
            id="pod-of-a-deployments-replicaset-sent",
        ),
        pytest.param(
            pod(container(limits=CPU), ownerReferences=[{"kind": "ReplicaSet", "name": "rs"}]),
            "team",
            False,
            id="pod-of-a-bare-replicaset-not-sent",
        ),
        pytest.param(workload("StatefulSet", pod(container(limits=CPU))), "team", False, id="no-default-not-sent"),
        pytest.param(
            pod(container(limits=CPU), ownerReferences=[{"kind": "Job", "name": "j"}]),
            "team",
            True,
            id="pod-of-a-cronjobs-job-sent",
        ),
        pytest.param(
            pod(container(limits=CPU), ownerReferences=[{"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob"}]),
            "team",
            True,
            id="pod-of-a-kind-named-with-its-group-sent",
        ),
        pytest.param(
            pod(container(limits=CPU), ownerReferences=[{"apiVersion": "example.com/v1", "kind": "PyTorchJob"}]),
            "team",
            False,
            id="pod-of-that-kind-in-another-group-not-sent",
        ),
        pytest.param(
            pod(container(limits=CPU), ownerReferences=[{"kind": "PyTorchJob"}]),
            "team",
            False,
            id="pod-of-that-kind-without-apiversion-not-sent",
        ),
        pytest.param(
            pod(container(limits=CPU), ownerReferences=[{"name": "no-kind"}]),
            "team",
            False,
            id="owner-reference-without-kind",
        ),
        pytest.param(pod(container(limits=GPU)), "team", True, id="gpu-pod-still-sent"),
    ],
)
def test_spot_defaults_widen_the_match(obj, namespace, expected):
    assert sent(program("all-on"), obj, namespace) is expected


def _deployment_update(change: str) -> tuple[dict[str, Any], dict[str, Any]]:
    old = workload("Deployment", pod(container(limits={"nvidia.com/gpu": "0.5"})))
    new = copy.deepcopy(old)
    if change == "metadata":
        new["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "2"}
    elif change == "template":
        new["spec"]["template"]["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/cuda:12.8.0-base-ubuntu24.04"
    elif change == "template-annotations":
        new["spec"]["template"]["metadata"] = {"annotations": {"gpu-admission.io/spot": "tolerate"}}
    elif change == "replicas":
        new["spec"]["replicas"] = 0
    return new, old


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        pytest.param("metadata", False, id="controller-metadata-update-not-sent"),
        pytest.param("nothing", False, id="no-op-update-not-sent"),
        pytest.param("template", True, id="template-update-sent"),
        pytest.param("template-annotations", True, id="template-metadata-update-sent"),
        pytest.param("replicas", False, id="scale-not-sent"),
    ],
)
def test_workload_updates_are_sent_only_when_the_template_changed(default_program, change, expected):
    new, old = _deployment_update(change)
    assert sent(default_program, new, old=old) is expected


@pytest.mark.parametrize(
    ("owners", "expected"),
    [
        pytest.param([{"kind": "Deployment", "name": "d", "uid": "u", "controller": True}], False, id="deployments"),
        pytest.param([{"kind": "Deployment", "name": "d", "uid": "u"}], True, id="owned-not-controlled"),
        pytest.param([{"kind": "MyOperator", "name": "o", "uid": "u", "controller": True}], True, id="an-operators"),
        pytest.param(None, True, id="bare"),
    ],
)
def test_a_deployments_replicaset_is_not_sent(default_program, owners, expected):
    """Its template is the Deployment's, reviewed there; changed at its create, it would make the Deployment
    controller create ReplicaSets without end (found by a review of workload flows)."""
    rs = workload("ReplicaSet", pod(container(limits={"nvidia.com/gpu": "1"})))
    if owners is not None:
        rs["metadata"]["ownerReferences"] = owners
    assert sent(default_program, rs) is expected
    assert sent(default_program, rs, old=copy.deepcopy(rs) | {"spec": {"template": {}}}) is expected


@pytest.mark.parametrize(("change", "expected"), [("suspend", False), ("template", True)])
def test_a_cronjob_update_is_sent_only_when_its_job_template_changed(default_program, change, expected):
    old = workload("CronJob", pod(container(limits={"nvidia.com/gpu": "0.5"})))
    new = copy.deepcopy(old)
    if change == "suspend":
        new["spec"]["suspend"] = True
    else:
        new["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["image"] = "nvidia/cuda:12.8.0-base"
    assert sent(default_program, new, old=old) is expected


@pytest.mark.parametrize("kind", ["Deployment", "CronJob"])
@pytest.mark.parametrize(
    ("old_words", "expected"),
    [
        pytest.param({"gpu-admission.io/spot-applied": "require (annotation); ..."}, True, id="webhook-words-on-old"),
        pytest.param({"team": "ml"}, False, id="other-annotations-on-old"),
        pytest.param(None, False, id="no-annotations-on-old"),
    ],
)
def test_an_update_that_drops_the_gpu_and_the_webhooks_words_is_sent(default_program, kind, old_words, expected):
    """Found by a generative review: a workload moved off spot require in the edit that drops its GPU ask keeps
    the spot tolerations and affinity for good: kubectl takes the template's whole annotations map away, and the
    update matched no condition. Its stored template's words send it, so that what the webhook wrote comes out."""
    old = workload(kind, pod(container(limits=GPU), annotations=old_words))
    new = workload(kind, pod(container(limits=CPU)))
    new_template = new["spec"]["jobTemplate"]["spec"]["template"] if kind == "CronJob" else new["spec"]["template"]
    new_template["metadata"].pop("annotations", None)
    assert sent(default_program, new, old=old) is expected
    assert sent(default_program, new) is False, "a create of such a workload is not sent"


def test_cluster_wide_spot_default_sends_every_pod():
    assert expressions("spot-default") == ["true", "true"]
    assert sent(program("spot-default"), pod(container(limits=CPU))) is True


# cel-python forgives more than the apiserver's cel-go: it answers has(a.b.c) with false when a.b is absent, where
# cel-go fails with "no such key: b". So the guards are also checked on the text: every field read, and the operand
# of every has(), must be guarded by an earlier has() of itself (or be a variable or an always-present request field).
_PATH = re.compile(r"(has\()?\b([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(\s*\()?")
_ALWAYS_PRESENT = ("request.",)  # oldObject is null on CREATE: guarded by request.operation


def unguarded_reads(expression: str) -> list[str]:
    text = re.sub(r"'[^']*'", "''", expression)
    problems = []
    for m in _PATH.finditer(text):
        in_has, path, call = m.group(1), m.group(2), m.group(3)
        parts = path.split(".")
        if call and not in_has:
            parts = parts[:-1]  # x.exists(...), r.startsWith(...): a method, not a field
        if in_has:
            parts = parts[:-1]  # has(a.b.c) reads a.b; it tests only c
        if len(parts) < 2 or path.startswith(_ALWAYS_PRESENT):
            continue
        for n in range(2, len(parts) + 1):
            read = ".".join(parts[:n])
            if f"has({read})" not in text[: m.start()]:
                problems.append(f"{read} (at {m.start()}: {text[m.start() : m.end() + 20]})")
    return problems


@pytest.mark.parametrize("value_set", ["defaults", "all-on"])
def test_every_field_read_is_guarded_by_has(value_set):
    for expression in conditions(value_set)[0]:
        assert unguarded_reads(expression) == []


@pytest.mark.parametrize(
    ("expression", "bad"),
    [
        pytest.param("has(object.spec) && has(object.spec.containers)", [], id="guarded-chain"),
        pytest.param("has(object.spec.containers)", ["object.spec"], id="has-of-unguarded-parent"),
        pytest.param(
            "object.spec.containers.exists(c, true)", ["object.spec", "object.spec.containers"], id="unguarded-read"
        ),
        pytest.param("has(c.env) && c.env.exists(e, e.name == 'A.B')", ["e.name"], id="unguarded-item-field"),
        pytest.param("request.kind.kind in ['Job']", [], id="request-always-present"),
    ],
)
def test_guard_checker(expression, bad):
    assert [p.split(" ")[0] for p in unguarded_reads(expression)] == bad


def _protect_program() -> list[Any]:
    (hook,) = [
        h for h in find(render_values("defaults"), "MutatingWebhookConfiguration")["webhooks"] if h["name"] == PROTECT
    ]
    assert [r["operations"] for r in hook["rules"]] == [["UPDATE"]] and hook["rules"][0]["resources"] == ["pods"]
    env = celpy.Environment()
    return [env.program(env.compile(c["expression"])) for c in hook["matchConditions"]]


def _annotated(annotations: dict[str, str] | None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    obj = pod(container(limits={"nvidia.com/mig-3g.40gb": "1"}))
    if annotations is not None:
        obj["metadata"]["annotations"] = annotations
    if labels:
        obj["metadata"]["labels"] = labels
    return obj


MIG_LINE = {"gpu-admission.io/mig": "trainer: nvidia.com/gpu 500m -> nvidia.com/mig-3g.40gb (A100, pool a)"}


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(MIG_LINE, {"gpu-admission.io/mig": "forged"}, True, id="changed"),
        pytest.param(None, {"gpu-admission.io/cuda": "forged"}, True, id="added-to-a-pod-without-annotations"),
        pytest.param({"team": "ml"}, {"team": "ml", "gpu-admission.io/cuda": "forged"}, True, id="added"),
        pytest.param(MIG_LINE, {}, True, id="removed"),
        pytest.param(MIG_LINE, None, True, id="annotations-dropped"),
        pytest.param(MIG_LINE, MIG_LINE, False, id="unchanged"),
        pytest.param({"team": "ml"}, {"team": "ai"}, False, id="other-annotation-changed"),
        pytest.param(None, None, False, id="no-annotations"),
    ],
)
def test_pod_updates_are_sent_only_when_they_touch_the_webhooks_annotations(old, new, expected):
    programs = _protect_program()
    assert sent(programs, _annotated(new, labels={"changed": "yes"}), old=_annotated(old)) is expected


def _ungate_hook(value_set: str = "defaults") -> Any:
    (hook,) = [
        h for h in find(render_values(value_set), "ValidatingWebhookConfiguration")["webhooks"] if h["name"] == UNGATE
    ]
    return hook


def _gated(*gates: str, gpu: bool = True) -> dict[str, Any]:
    obj = pod(container(limits=GPU if gpu else CPU))
    if gates:
        obj["spec"]["schedulingGates"] = [{"name": g} for g in gates]
    return obj


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(_gated("kueue.x-k8s.io/admission"), _gated(), True, id="last-gate-taken-away"),
        pytest.param(_gated("a", "b"), _gated("b"), False, id="one-of-two-gates-taken-away"),
        pytest.param(_gated("a"), _gated("a"), False, id="still-gated"),
        pytest.param(_gated(), _gated(), False, id="never-gated"),
        pytest.param(_gated("a", gpu=False), _gated(gpu=False), False, id="not-a-gpu-pod"),
    ],
)
def test_a_pod_update_is_sent_to_the_ungate_check_only_when_it_takes_the_last_gate_away(old, new, expected):
    hook = _ungate_hook()
    assert [r["operations"] for r in hook["rules"]] == [["UPDATE"]] and hook["rules"][0]["resources"] == ["pods"]
    assert hook["clientConfig"]["service"]["path"] == "/validate"
    env = celpy.Environment()
    programs = [env.program(env.compile(c["expression"])) for c in hook["matchConditions"]]
    assert sent(programs, new, old=old) is expected
    if "schedulingGates" not in new["spec"]:
        emptied = copy.deepcopy(new)
        emptied["spec"]["schedulingGates"] = []  # taken away as an empty list
        assert sent(programs, emptied, old=old) is expected


@pytest.mark.parametrize("value_set", ["defaults", "all-on"])
def test_the_ungate_check_selects_the_gpu_pods_the_other_webhooks_select(value_set):
    hook = _ungate_hook(value_set)
    (validating,) = [
        h
        for h in find(render_values(value_set), "ValidatingWebhookConfiguration")["webhooks"]
        if h["name"] == "validate.gpu-admission.io"
    ]
    assert hook["matchConditions"][0] == validating["matchConditions"][0]
    assert hook["namespaceSelector"] == validating["namespaceSelector"]
    assert hook.get("objectSelector") == validating.get("objectSelector")
    for field in ("failurePolicy", "sideEffects", "matchPolicy", "timeoutSeconds", "admissionReviewVersions"):
        assert hook[field] == validating[field], field
    for condition in hook["matchConditions"]:
        assert unguarded_reads(condition["expression"]) == []

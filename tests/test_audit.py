"""The decision log (one JSON line per request, nothing secret in it), auditAnnotations keys and warnings as the
apiserver takes them, the Reporter's fan-out, and where build_recorder sends Events."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
import select
import time
from collections.abc import Callable
from typing import Any, cast
from unittest import mock

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import REPO, gpu_node, gpu_pod, review
from tests.kubeapi import KubeAPI
from tests.mig_fixtures import mixed_node
from webhook import audit, budget, pipeline
from webhook.admission import ReviewRequest, Subject
from webhook.app import create_app
from webhook.audit import (
    DecisionLog,
    Recorded,
    Reporter,
    build_recorder,
    decision_line,
    denial_actions,
    valid_audit_key,
)
from webhook.cluster import StaticCluster, build_view
from webhook.config import AuditSettings, CudaSettings, Settings
from webhook.events import NAME_LIMIT, EventQueue
from webhook.metrics import Metrics
from webhook.model import Context, Outcome, compact_json, is_output_annotation
from webhook.pipeline import Result

SECRET = "hunter2-s3cr3t-value"
SPOT_TAINT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}


def cluster_of(settings: Settings) -> StaticCluster:
    nodes = [
        gpu_node("h100-a"),
        gpu_node("spot-a", labels={"cloud.google.com/gke-spot": "true"}, taints=[SPOT_TAINT]),
    ]
    return StaticCluster(build_view(nodes, settings))


def logged_app(settings: Settings | None = None) -> tuple[Any, io.StringIO]:
    settings = settings or Settings()
    stream = io.StringIO()
    cluster = cluster_of(settings)
    recorder = build_recorder(settings, cluster, stream=stream)
    return create_app(settings, cluster=cluster, recorder=recorder), stream


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def secret_pod(generate: bool = False) -> dict[str, Any]:
    """A GPU pod full of things that must never reach a log: env values, a secret-looking annotation, args."""
    pod = gpu_pod(annotations={"gpu-admission.io/spot": "tolerate", "example.com/api-token": SECRET})
    container = pod["spec"]["containers"][0]
    container["env"] = [
        {"name": "HF_TOKEN", "value": SECRET},
        {"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": SECRET}}},
        {"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=12.2 brand=tesla,driver>=470,driver<471"},
        {"name": "EXTRA", "value": f"x{SECRET}"},
    ]
    container["args"] = ["--token", SECRET]
    pod["metadata"]["labels"] = {"team": SECRET}
    if generate:
        del pod["metadata"]["name"]
        pod["metadata"]["generateName"] = "trainer-"
    return pod


# -- decision log --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("endpoint", "generate", "dry_run"),
    [
        pytest.param("/mutate", False, False, id="mutate"),
        pytest.param("/mutate", True, False, id="mutate-generateName"),
        pytest.param("/validate", False, False, id="validate"),
        pytest.param("/validate", False, True, id="validate-dry-run"),
    ],
)
def test_decision_line_fields_and_nothing_secret(
    endpoint: str, generate: bool, dry_run: bool, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    app, stream = logged_app()
    pod = secret_pod(generate)
    if endpoint == "/validate":  # as the apiserver sends it: mutated, named, with a uid
        settings = Settings()
        pod = pipeline.mutate(pod, Context(settings=settings, cluster=cluster_of(settings).snapshot())).object
        pod["metadata"]["uid"] = "pod-uid-1"
    body = review(pod, dry_run=dry_run, uid="uid-1")
    response = app.test_client().post(endpoint, json=body)
    assert response.status_code == 200
    recorder = app.extensions["gpu_admission"].recorder
    if recorder.events is not None:
        recorder.events.drain(5)
    text = stream.getvalue()
    assert SECRET not in text
    assert SECRET not in caplog.text, "nor in the event log lines"
    if endpoint == "/validate" and not dry_run:
        assert '"event":"SpotTolerated"' in caplog.text, "events went to the log (no cluster access)"
    (line,) = lines(stream)
    assert line["uid"] == "uid-1"
    assert line["endpoint"] == endpoint.strip("/")
    assert line["namespace"] == "default"
    assert (line["name"], line["generateName"]) == (("", "trainer-") if generate else ("trainer", ""))
    assert (line["kind"], line["operation"], line["dryRun"]) == ("Pod", "CREATE", dry_run)
    assert line["decision"] in ("patched", "allowed")
    assert isinstance(line["reasons"], list) and line["reasons"]
    assert line["latency_ms"] >= 0
    if endpoint == "/mutate":
        assert line["patchOps"] > 0 and line["patchBytes"] > 0
        assert "spot-toleration" in line["mutations"]


_TEXT = st.text(st.characters(codec="utf-8"), max_size=20) | st.sampled_from(["", "Pod", "default", "trainer-"])


@st.composite
def _decisions(draw: st.DrawFn) -> Recorded:
    review_ = None
    if draw(st.booleans()):
        subject = Subject("v1", "Pod", draw(_TEXT), draw(_TEXT), draw(_TEXT), draw(_TEXT))
        review_ = ReviewRequest(
            draw(_TEXT), draw(_TEXT), draw(_TEXT), draw(_TEXT), draw(_TEXT), draw(_TEXT), (), draw(st.booleans()),
            None, None, subject,
        )  # fmt: skip
    result = None
    if draw(st.booleans()):
        outcome = Outcome(reasons=draw(st.lists(_TEXT, max_size=3)), mutations=draw(st.lists(_TEXT, max_size=3)))
        result = Result(
            allowed=draw(st.booleans()),
            warnings=draw(st.lists(_TEXT, max_size=2)),
            patch=draw(st.lists(st.fixed_dictionaries({"op": st.just("add"), "path": _TEXT}), max_size=2)),
            outcome=outcome,
            skipped=draw(st.sampled_from(["", "exempt namespace"])),
            reused=draw(st.booleans()),
            replayed=draw(st.booleans()),
        )
    status = draw(st.sampled_from([200, 400, 413, 500]))
    seconds = draw(st.floats(0, 10, allow_nan=False) | st.sampled_from([0, 0.0012, 1e-7]))
    at = draw(st.floats(0, 4e9, allow_nan=False) | st.just(1796000000.1234567))
    endpoint = "mutate" if draw(st.booleans()) else "validate"
    return Recorded(at, endpoint, review_, result, status, seconds, draw(_TEXT))


@given(_decisions())
def test_decision_text_is_the_line_as_compact_json(decision: Recorded) -> None:
    text = audit.decision_text(decision)
    assert text == compact_json(decision_line(decision))
    assert json.loads(text)["ts"] == round(decision.at, 3)


def test_a_stored_answers_part_of_the_line_is_written_once_and_only_for_it() -> None:
    settings = Settings()
    ctx = Context(settings=settings, cluster=cluster_of(settings).snapshot(), namespace="default")
    stored = dataclasses.replace(pipeline.mutate(gpu_pod(), ctx), object=None, reused=True)
    first = audit.decision_text(Recorded(1.0, "mutate", None, stored, 200, 0.001))
    assert audit._result_parts[id(stored)][0] is stored
    with mock.patch.object(audit, "decision_line", side_effect=AssertionError("built again")):
        assert audit.decision_text(Recorded(1.0, "mutate", None, stored, 200, 0.001)) == first
    computed = pipeline.mutate(gpu_pod(limits={"nvidia.com/gpu": "1.5"}), ctx)  # not stored: written each time
    assert json.loads(audit.decision_text(Recorded(1.0, "mutate", None, computed, 200, 0.0)))["decision"] == "denied"
    assert id(computed) not in audit._result_parts
    other = dataclasses.replace(stored, replayed=True)  # another stored answer, perhaps at a reused id
    audit._result_parts[id(other)] = (stored, "stale")
    assert json.loads(audit.decision_text(Recorded(1.0, "mutate", None, other, 200, 0.0)))["replayed"] is True


class Writes(io.StringIO):
    """A stream that keeps each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: list[str] = []

    def write(self, text: str) -> int:
        self.texts.append(text)
        return super().write(text)


def test_a_burst_of_lines_goes_in_writes_a_pipe_keeps_whole() -> None:
    """Found by the observability review: a burst's 64 lines (25 kB) went in one write, which Linux cuts where it
    likes on a full pipe (it keeps a write whole only up to PIPE_BUF), so the lines of workers sharing stderr
    interleaved and stopped being JSON. Now whole lines, at most PIPE_BUF bytes a write; a longer line alone."""
    stream = Writes()
    review_ = ReviewRequest("u" * 36, "CREATE", "n" * 63, "p" * 253, "Pod", "alice", (), False, None, None, Subject())
    burst = [Recorded(1.0, "mutate", review_, None, 200, 0.001) for _ in range(64)]
    many = Result(outcome=Outcome(reasons=[f"Reason{i}" for i in range(600)]))  # none such yet: 6 kB
    burst[30] = Recorded(1.0, "mutate", None, many, 200, 0.001)
    DecisionLog(Settings(), stream).record_all(burst)
    sizes = [len(text.encode()) for text in stream.texts]
    assert len(stream.texts) > 1 and all(text.endswith("\n") for text in stream.texts)
    assert [size > select.PIPE_BUF for size in sizes].count(True) == 1
    assert stream.texts[[size > select.PIPE_BUF for size in sizes].index(True)].count("\n") == 1, "alone"
    assert len(lines(stream)) == 64


def test_a_skipped_requests_reason_is_cut_as_the_requests_strings_are() -> None:
    """Found by the observability review: ``skipped`` names the object's kind, which went whole into the line (a
    3 MB kind, a 3 MB line)."""
    app, stream = logged_app()
    obj = {"apiVersion": "v1", "kind": "K" * 300_000, "metadata": {"name": "x", "namespace": "default"}}
    assert app.test_client().post("/mutate", json=review(obj)).status_code == 200
    (line,) = lines(stream)
    assert line["skipped"] == ("kind " + "K" * 300_000)[:NAME_LIMIT]
    assert len(stream.getvalue()) < 2000


def test_bad_request_is_logged_with_its_error() -> None:
    app, stream = logged_app()
    response = app.test_client().post("/validate", data=b"{", content_type="application/json")
    assert response.status_code == 400
    (line,) = lines(stream)
    assert line["status"] == 400
    assert "not valid JSON" in line["error"]
    assert "uid" not in line


def test_an_internal_error_is_logged_with_its_request_and_its_latency(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in a policy: the answer is a 500 in JSON, and the decision log line names the request (uid, name,
    kind) and how long it took, as operations.md asks a report to give (it had neither; found by a review)."""

    def broken(obj: Any, ctx: Context) -> Result:
        time.sleep(0.05)
        raise KeyError("boom")

    monkeypatch.setattr(pipeline, "validate", broken)
    app, stream = logged_app()
    body = review(gpu_pod(), uid="9f1c2d3e-0000-4000-8000-000000000001", name="trainer-0")
    response = app.test_client().post("/validate", json=body)
    assert response.status_code == 500 and "internal error (KeyError)" in response.get_json()["error"]
    (line,) = lines(stream)
    assert (line["status"], line["error"], line["uid"]) == (500, "internal: KeyError", body["request"]["uid"])
    assert line["kind"] == "Pod" and line["latency_ms"] >= 50


def test_decision_log_can_be_turned_off() -> None:
    app, stream = logged_app(Settings(audit=AuditSettings(decision_log=False)))
    assert app.test_client().post("/validate", json=review(gpu_pod())).status_code == 200
    assert stream.getvalue() == ""


def test_decision_line_of_a_denial() -> None:
    settings = Settings()
    ctx = Context(settings=settings, cluster=cluster_of(settings).snapshot(), namespace="default")
    result = pipeline.mutate(gpu_pod(limits={"nvidia.com/gpu": "1.5"}), ctx)
    line = decision_line(Recorded(1.0, "mutate", None, result, 200, 0.0012))
    assert line["decision"] == "denied"
    assert line["reasons"] == ["MIGInvalidFraction"]
    assert line["latency_ms"] == 1.2
    assert "1.5" not in json.dumps(line), "messages are for the user, not the log"


# -- what the apiserver takes: auditAnnotations keys, warnings ----------------------------------------------------
TORCH_128 = "pytorch/pytorch-nightly:2700000-cu12.8"
"""CUDA 12.8 without the forward-compatibility libraries: denied on the 550 driver of the test nodes."""
POLICY_PODS = [
    pytest.param(gpu_pod(), Settings(), id="cuda-compatible"),
    pytest.param(gpu_pod(image=TORCH_128), Settings(), id="cuda-denied"),
    pytest.param(gpu_pod(image=TORCH_128), Settings(cuda=CudaSettings(mode="warn")), id="cuda-warn"),
    pytest.param(gpu_pod(image="example.com/private/trainer:v3"), Settings(), id="cuda-unknown"),
    pytest.param(gpu_pod(annotations={"gpu-admission.io/spot": "require"}), Settings(), id="spot-require"),
    pytest.param(gpu_pod(limits={"nvidia.com/gpu": "0.5"}), Settings(), id="mig-fraction-nothing-offered"),
    pytest.param(gpu_pod(limits={"nvidia.com/gpu": "1.5"}), Settings(), id="mig-impossible"),
]


@pytest.mark.parametrize(("pod", "settings"), POLICY_PODS)
@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
def test_audit_keys_and_warnings_are_what_the_apiserver_keeps(pod: Any, settings: Settings, endpoint: str) -> None:
    app, _ = logged_app(settings)
    answer = app.test_client().post(endpoint, json=review(pod)).get_json()["response"]
    audit = answer.get("auditAnnotations", {})
    assert audit, "every reviewed pod leaves its decision in the audit log"
    bad = [k for k in audit if not valid_audit_key(k)]
    assert bad == [], f"the apiserver drops these auditAnnotations keys: {bad}"
    assert all(isinstance(v, str) for v in audit.values())
    for warning in answer.get("warnings", []):
        assert len(warning) < 120, warning
        assert not warning.lower().startswith("warning:")
    assert sum(len(w) for w in answer.get("warnings", [])) <= 4096


def test_every_audit_key_and_fixed_decision_is_documented() -> None:
    """Found by the observability review: the key ``restored`` and the decisions that put the webhook's annotations
    back were missing from the auditAnnotations table."""
    keys: set[str] = set()
    decisions: set[str] = set()
    for source in (REPO / "webhook").rglob("*.py"):
        text = source.read_text()
        keys |= set(re.findall(r'audit\["([a-z][-a-z]*)"\]', text))
        for literal in re.findall(r"audit\s*=\s*\{([^\n]*)", text):  # audit={"decision": ..., "key": ...}
            keys |= set(re.findall(r'"([a-z][-a-z]*)": ', literal))
            decisions |= set(re.findall(r'"decision": "([^"]+)"', literal))
    assert {"decision", "reason", "restored", "mig", "cuda-decision"} <= keys
    assert "restored the webhook's annotations" in decisions
    docs = (REPO / "docs" / "observability.md").read_text()
    table = docs.split("## Warnings and auditAnnotations", 1)[1].split("\n## ", 1)[0]
    assert sorted(k for k in keys if f"| `{k}`" not in table and f", `{k}` |" not in table) == []
    assert sorted(d for d in decisions if f"`{d}`" not in table) == []


def apiserver_audit(answers: list[dict[str, Any]]) -> tuple[dict[str, str], list[str]]:
    """The audit annotations kube-apiserver keeps from the answers of one request's calls, and the keys it refused:
    a key keeps its first value; another value for it is refused and only logged (k8s.io/apiserver pkg/admission
    ``attributesRecord.AddAnnotation``, called by the mutating dispatcher for each key of each answer)."""
    kept: dict[str, str] = {}
    refused: list[str] = []
    for answer in answers:
        for key, value in answer.get("auditAnnotations", {}).items():
            if kept.setdefault(key, value) != value:
                refused.append(key)
    return kept, refused


def _apply(pod: dict[str, Any], answer: dict[str, Any]) -> dict[str, Any]:
    ops = json.loads(base64.b64decode(answer["patch"])) if "patch" in answer else []
    return cast(dict[str, Any], jsonpatch.apply_patch(pod, ops))


def _another_fraction(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"].append(
        {"name": "helper", "image": "ghcr.io/example/helper:1", "resources": {"limits": {"nvidia.com/gpu": "0.25"}}}
    )


def _a_fraction(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "0.5"


def _a_label(pod: dict[str, Any]) -> None:
    pod["metadata"]["labels"] = {"sidecar.istio.io/inject": "true"}


def mig_client(*nodes: dict[str, Any]) -> Any:
    """The webhook (CUDA check off) on an A100 node of MIG profiles, and ``nodes``."""
    settings = dataclasses.replace(Settings(), cuda=CudaSettings(mode="off"))
    a100 = mixed_node("a100-a", "NVIDIA-A100-SXM4-80GB", {"1g.10gb": 7, "3g.40gb": 2}, "a100", memory_mib=81920)
    return create_app(settings, cluster=StaticCluster(build_view([a100, *nodes], settings))).test_client()


def reinvoked(
    client: Any, pod: dict[str, Any], later: Callable[[dict[str, Any]], None]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The mutating webhook's answers to the two calls of one request, the pod changed between them by a later
    webhook (``later``), and the pod as the second call leaves it; each call with a new uid, as the apiserver's.
    Checks the audit rule: the second call, on a pod that carries the webhook's annotations, writes each key also
    under ``again-``, and those hold what it decided; only the plain keys of the first call keep their values."""
    first = client.post("/mutate", json=review(pod)).get_json()["response"]
    passed = _apply(pod, first)
    later(passed)
    second = client.post("/mutate", json=review(passed)).get_json()["response"]
    kept, refused = apiserver_audit([first, second])
    said, before = second.get("auditAnnotations", {}), first.get("auditAnnotations", {})
    plain = {k: v for k, v in said.items() if not k.startswith(pipeline.AGAIN)}
    if any(is_output_annotation(k) for k in passed["metadata"].get("annotations", {})):
        assert said == {**plain, **{pipeline.AGAIN + k: v for k, v in plain.items()}}, said
    assert {k: kept[k] for k in said if k.startswith(pipeline.AGAIN)} == {
        k: v for k, v in said.items() if k.startswith(pipeline.AGAIN)
    }, f"the apiserver keeps another call's again- keys: {first} then {second}"
    assert refused == [k for k in plain if before.get(k, plain[k]) != plain[k]], refused
    assert all(valid_audit_key(k) for k in said), said
    return first, second, _apply(passed, second)


@pytest.mark.parametrize(
    ("limits", "later", "changed"),
    [
        pytest.param({"nvidia.com/gpu": "0.5"}, _another_fraction, True, id="converted-then-converted-again"),
        pytest.param({"nvidia.com/gpu": "1"}, _a_fraction, True, id="unchanged-then-converted"),
        pytest.param({"nvidia.com/gpu": "0.5"}, _a_label, False, id="converted-then-nothing-to-do"),
    ],
)
def test_a_reinvocation_leaves_what_it_decided_in_the_audit_log(
    limits: dict[str, str], later: Callable[[dict[str, Any]], None], changed: bool
) -> None:
    """The apiserver calls the mutating webhook again when a later webhook changed the pod (reinvocationPolicy
    IfNeeded) and keeps an audit key's first value: a second call that converted another fraction, or converted
    one where the first had said "unchanged", was refused its "mig" and "decision", and the audit log told of the
    first call's pod, not the one admitted. A call on an object that carries the webhook's words writes each key
    twice, plain and under "again-": the plain ones keep what the first call said (where operators look), the
    "again-" ones what the last call decided; a call that changes nothing says nothing (the validating webhook's
    decision stands)."""
    first, second, final = reinvoked(mig_client(), gpu_pod(limits=limits), later)
    assert ("patch" in second) is changed
    kept, _ = apiserver_audit([first, second])
    mig = final["metadata"]["annotations"]["gpu-admission.io/mig"]
    assert kept["decision"] == "mutated", kept  # the first call's, or the second's where the first said nothing
    said = {k: kept.get(pipeline.AGAIN + k, kept.get(k)) for k in ("decision", "mig")}
    assert said == {"decision": "mutated", "mig": mig}, kept
    if changed and "auditAnnotations" in first:
        assert kept[pipeline.AGAIN + "mig"] == mig != kept["mig"] == first["auditAnnotations"]["mig"], kept


SPOT_NODE = gpu_node("spot-a", labels={"cloud.google.com/gke-spot": "true"}, taints=[SPOT_TAINT])


def _containers(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"] += [{"name": f"c{i}", "image": "busybox"} for i in range(pipeline.MAX_CONTAINERS)]


def _tolerations(pod: dict[str, Any], n: int = pipeline.MAX_PLACEMENT["tolerations"] + 1) -> None:
    pod["spec"]["tolerations"] = [{"key": f"k{i}", "operator": "Exists"} for i in range(n)]


def _tolerations_and_spot(pod: dict[str, Any]) -> None:
    _tolerations(pod, pipeline.MAX_PLACEMENT["tolerations"])  # at the cap; the webhook's spot toleration passes it
    pod["metadata"]["annotations"]["gpu-admission.io/spot"] = "tolerate"


def _a_blob(pod: dict[str, Any]) -> None:
    key = "example.com/blob"
    pod["metadata"]["annotations"][key] = "x" * (pipeline.ANNOTATIONS_LIMIT - len(key))


def _past_the_budget(monkeypatch: pytest.MonkeyPatch) -> Callable[[dict[str, Any]], None]:
    def later(pod: dict[str, Any]) -> None:
        _another_fraction(pod)
        monkeypatch.setattr(budget, "REVIEW_CPU_SECONDS", 0.0)  # for the second call
        monkeypatch.setattr(budget, "EVERY", 1)

    return later


def _impossible_fraction(pod: dict[str, Any]) -> None:
    _another_fraction(pod)
    pod["spec"]["containers"][-1]["resources"]["limits"]["nvidia.com/gpu"] = "1.5"


@pytest.mark.parametrize(
    ("later", "reason", "words"),
    [
        pytest.param(_containers, "TooManyContainers", "has 251 containers", id="oversized-containers"),
        pytest.param(_tolerations, "TooManyNodeRules", "has 1025 tolerations", id="oversized-as-written"),
        pytest.param(_tolerations_and_spot, "TooManyNodeRules", "with what gpu-admission adds", id="grown-past-a-cap"),
        pytest.param(_a_blob, "AnnotationsTooLong", "the pod's annotations would hold", id="annotations-too-long"),
        pytest.param(None, "TooComplex", "gave up reviewing", id="past-the-cpu-budget"),
        pytest.param(_impossible_fraction, "MIGInvalidFraction", "1.5", id="a-policy"),
    ],
)
def test_a_reinvocation_refused_leaves_its_refusal_under_again_keys(
    later: Callable[[dict[str, Any]], None] | None, reason: str, words: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a review: the refusals made outside the policies (a pod too big, its review past the CPU budget)
    kept their plain keys on a second call, so the audit log of a pod the apiserver refused kept only the first
    call's "decision: mutated". Every refusal path of a second call writes its keys under "again-" too."""
    first, second, _ = reinvoked(
        mig_client(SPOT_NODE), gpu_pod(limits={"nvidia.com/gpu": "0.5"}), later or _past_the_budget(monkeypatch)
    )
    assert not second["allowed"] and second["status"]["reason"] == reason, second["status"]
    assert words in second["status"]["message"], second["status"]
    kept, refused = apiserver_audit([first, second])
    assert refused == ["decision"]
    assert kept["decision"] == "mutated" and kept[pipeline.AGAIN + "decision"] == f"denied ({reason})", kept
    assert kept[pipeline.AGAIN + "reason"] == kept["reason"] == second["auditAnnotations"]["reason"]


def _made_from_a_reviewed_template(limits: dict[str, str]) -> dict[str, Any]:
    """A ReplicaSet's pod: its template was reviewed, so it comes with the webhook's words on it."""
    pod = gpu_pod(limits=limits, annotations={"gpu-admission.io/cuda": "decision: not checked"})
    pod["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "trainer-7d9", "uid": "u", "controller": True}
    ]
    return pod


@pytest.mark.parametrize(
    ("limits", "decision"),
    [
        pytest.param({"nvidia.com/gpu": "0.5"}, "mutated", id="converted"),
        pytest.param({"nvidia.com/gpu": "1.5"}, "denied (MIGInvalidFraction)", id="refused"),
    ],
)
def test_a_pod_made_from_a_reviewed_template_says_its_first_decision_under_the_plain_keys(
    limits: dict[str, str], decision: str
) -> None:
    """Found by a review: a workload's pod comes with its template's words on it, so its first call wrote only
    "again-" keys, and an audit query or alert on "decision" missed every Deployment's, Job's and ReplicaSet's pod
    refused. The plain keys are written too, as for any first call."""
    response = mig_client().post("/mutate", json=review(_made_from_a_reviewed_template(limits))).get_json()
    said = response["response"]["auditAnnotations"]
    assert said["decision"] == said[pipeline.AGAIN + "decision"] == decision, said
    assert all(valid_audit_key(k) for k in said), said


@pytest.mark.parametrize(
    ("key", "valid"),
    [
        pytest.param("decision", True, id="word"),
        pytest.param("cuda-would-deny", True, id="dashes"),
        pytest.param("mig.profile_1", True, id="dot-underscore"),
        pytest.param("a" * 63, True, id="63"),
        pytest.param("a" * 64, False, id="64"),
        pytest.param("gpu-admission.io/decision", False, id="prefixed"),
        pytest.param("cuda-", False, id="trailing-dash"),
        pytest.param("-cuda", False, id="leading-dash"),
        pytest.param("", False, id="empty"),
        pytest.param("cuda decision", False, id="space"),
    ],
)
def test_valid_audit_key(key: str, valid: bool) -> None:
    assert valid_audit_key(key) is valid


# -- the Reporter --------------------------------------------------------------------------------------------------
def test_denial_actions() -> None:
    settings = Settings(cuda=CudaSettings(mode="warn"))
    ctx = Context(settings=settings, cluster=cluster_of(settings).snapshot(), namespace="default")
    warned = pipeline.validate(gpu_pod(image="pytorch/pytorch-nightly:2700000-cu12.8"), ctx)
    assert denial_actions(warned) == [("CUDAIncompatible", "warned")]
    denied = pipeline.mutate(gpu_pod(limits={"nvidia.com/gpu": "1.5"}), ctx)
    assert denial_actions(denied) == [("MIGInvalidFraction", "denied")]
    assert denial_actions(pipeline.Result(outcome=Outcome())) == []


@pytest.mark.parametrize("words", [{}, {"gpu-admission.io/mig": "trainer: an earlier review's"}])
def test_a_request_counts_each_of_its_denial_reasons_once(words: dict[str, str]) -> None:
    """Found by the observability review: gpu_admission_denials_total counted once per container, so a pod of 8
    containers refused once read 8. A pod that carries the webhook's words has its audit keys written twice
    (``pipeline.AGAIN``), and its denial still counted once."""
    pod = gpu_pod(limits={"nvidia.com/gpu": "1.5"}, annotations=words)
    pod["spec"]["containers"] = [dict(pod["spec"]["containers"][0], name=f"c{i}") for i in range(8)]
    app, _ = logged_app()
    response = app.test_client().post("/mutate", json=review(pod)).get_json()["response"]
    assert response["status"]["reason"] == "MIGInvalidFraction"
    assert (pipeline.AGAIN + "decision" in response["auditAnnotations"]) is bool(words)
    metrics = app.extensions["gpu_admission"].recorder.metrics
    labels = {"endpoint": "mutate", "reason": "MIGInvalidFraction", "action": "denied"}
    assert metrics.registry.get_sample_value("gpu_admission_denials_total", labels) == 1


@pytest.mark.parametrize(
    ("ask", "count", "decision", "reasons", "mutations"),
    [("0.1", 56, "patched", ["MIGConverted"], ["mig"]), ("1.5", 250, "denied", ["MIGInvalidFraction"], [])],
    ids=["converted", "refused"],
)
def test_the_decision_log_names_each_reason_and_change_once(
    ask: str, count: int, decision: str, reasons: list[str], mutations: list[str]
) -> None:
    """Found by the observability review: a reason (and a kind of change) was logged once per container, so a pod
    of 250 refused for one reason made a line of 4.6 kB, past the 4096 bytes a pipe write keeps whole, cut among
    the other workers' lines. Each is named once, in order, as gpu_admission_denials_total counts each once (56:
    the most MIG devices one pod may ask, ``mig.MAX_ASKS``)."""
    settings = dataclasses.replace(Settings(), cuda=CudaSettings(mode="off"))
    a100 = mixed_node("a100-a", "NVIDIA-A100-SXM4-80GB", {"1g.10gb": count}, "a100", memory_mib=81920)
    stream = io.StringIO()
    cluster = StaticCluster(build_view([a100], settings))
    app = create_app(settings, cluster=cluster, recorder=build_recorder(settings, cluster, stream=stream))
    pod = gpu_pod(limits={"nvidia.com/gpu": ask})
    pod["spec"]["containers"] = [dict(pod["spec"]["containers"][0], name=f"c{i}") for i in range(count)]
    app.test_client().post("/mutate", json=review(pod))
    text = stream.getvalue()
    (line,) = lines(stream)
    assert (line["decision"], line["reasons"], line["mutations"]) == (decision, reasons, mutations)
    assert len(text.encode()) <= select.PIPE_BUF


def _refused_by_the_pipeline(reason: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    pod = gpu_pod()
    if reason == "TooManyContainers":
        pod["spec"]["containers"] = [dict(pod["spec"]["containers"][0], name=f"c{i}") for i in range(251)]
    elif reason == "TooManyNodeRules":
        pod["spec"]["tolerations"] = [{"key": f"k{i}", "operator": "Exists"} for i in range(1100)]
    else:

        def costly(*args: Any, **kwargs: Any) -> Result:
            raise budget.TooComplex

        monkeypatch.setattr(pipeline, "_mutate", costly)
    return pod


@pytest.mark.parametrize("reason", ["TooManyContainers", "TooManyNodeRules", "TooComplex"])
def test_a_refusal_the_pipeline_makes_itself_is_said_alike_everywhere(
    reason: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by the observability review: the refusals made outside the policies were never counted in
    gpu_admission_denials_total and their decision-log reasons were []."""
    app, stream = logged_app()
    answer = app.test_client().post("/mutate", json=review(_refused_by_the_pipeline(reason, monkeypatch)))
    response = answer.get_json()["response"]
    assert response["allowed"] is False and response["status"]["reason"] == reason
    assert response["auditAnnotations"]["decision"] == f"denied ({reason})"
    assert response["auditAnnotations"]["reason"] == response["status"]["message"]
    assert lines(stream)[-1]["reasons"] == [reason]
    metrics = app.extensions["gpu_admission"].recorder.metrics
    labels = {"endpoint": "mutate", "reason": reason, "action": "denied"}
    assert metrics.registry.get_sample_value("gpu_admission_denials_total", labels) == 1


class Broken(DecisionLog):
    def write(self, text: str) -> None:
        raise OSError("stderr closed")


class BrokenMetrics(Metrics):
    def request(self, endpoint: str, decision: str, seconds: float) -> None:
        raise ValueError("bad label")


def test_reporting_failures_never_fail_a_request(caplog: pytest.LogCaptureFixture) -> None:
    settings = Settings()
    cluster = cluster_of(settings)
    recorder = Reporter(Broken(settings), BrokenMetrics(cluster), None, "i")
    app = create_app(settings, cluster=cluster, recorder=recorder)
    response = app.test_client().post("/validate", json=review(gpu_pod()))
    assert response.status_code == 200
    assert response.get_json()["response"]["allowed"] is True
    assert "cannot write the decision log line" in caplog.text
    assert "cannot update the metrics" in caplog.text


@pytest.fixture
def no_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))


@pytest.mark.usefixtures("no_credentials")
@pytest.mark.parametrize(
    ("how", "expected"),
    [
        pytest.param("plain", "log", id="default-log"),
        pytest.param("discover-nothing", "log", id="no-credentials-log"),
        pytest.param("discover-kubeconfig", "api", id="kubeconfig-api"),
        pytest.param("client", "api", id="client-given-api"),
        pytest.param("disabled", None, id="events-off"),
    ],
)
def test_build_recorder_chooses_the_sink(
    how: str, expected: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    settings = Settings(audit=AuditSettings(events=how != "disabled"))
    api = KubeAPI()  # not started: only its kubeconfig is needed
    api.port = 1
    kw: dict[str, Any] = {}
    if how == "discover-kubeconfig":
        monkeypatch.setenv("KUBECONFIG", api.kubeconfig(str(tmp_path / "kubeconfig")))
    if how.startswith("discover"):
        kw["discover"] = True
    if how == "client":
        from kubernetes import config

        kw["api_client"] = config.new_client_from_config(config_file=api.kubeconfig(str(tmp_path / "kc")))  # type: ignore[no-untyped-call]
    recorder = build_recorder(settings, cluster_of(settings), **kw)
    assert (recorder.events.sink.name if isinstance(recorder.events, EventQueue) else None) == expected


def test_the_decision_log_keeps_names_to_their_limit() -> None:
    """The apiserver checks a name after the mutating webhooks: a name of megabytes must not make a log line of
    megabytes."""
    app = create_app(Settings(), recorder=build_recorder(Settings(), stream=(log := io.StringIO())))
    pod = gpu_pod(name="n" * 100_000)
    pod["metadata"]["namespace"] = "s" * 100_000
    body = review(pod, uid="u" * 5_000_000, namespace="s" * 100_000)  # a client's 5 MiB uid (found by a review)
    body["request"]["userInfo"]["username"] = "a" * 100_000
    body["request"]["kind"]["kind"] = "Pod" + "d" * 100_000
    assert app.test_client().post("/mutate", json=body).status_code == 200
    assert len(log.getvalue()) < 4000
    line = json.loads(log.getvalue())
    assert line["name"] == "n" * 253 and line["uid"] == "u" * 253 and line["namespace"] == "s" * 253
    assert line["user"] == "a" * 253


EMOJI = "\U0001f600"


def test_a_decision_line_fits_a_pipe_write_whatever_the_names() -> None:
    """Found by the observability review: the request's strings were cut at 253 characters, but the line writes an
    emoji as 12 bytes (``\\ud83d\\ude00``), so a pod, generateName and user of 253 of them made a line of 6-9 kB,
    past the 4096 bytes a pipe write keeps whole; and a 415's error named the whole Content-Type (7,000 characters:
    a 7 kB line). Each string is cut by the bytes it takes in the line."""
    settings = Settings()
    stream = io.StringIO()
    cluster = StaticCluster(build_view([gpu_node("a100-a")], settings))
    app = create_app(settings, cluster=cluster, recorder=build_recorder(settings, cluster, stream=stream))
    pod = gpu_pod()
    pod["metadata"].update(name=EMOJI * 253, generateName=EMOJI * 253, uid=EMOJI * 253)
    body = review(pod, namespace=EMOJI * 253, name=EMOJI * 253, uid=EMOJI * 253)
    body["request"]["userInfo"]["username"] = EMOJI * 253
    client = app.test_client()
    assert client.post("/mutate", json=body).status_code == 200
    assert client.post("/mutate", data=b"{}", content_type="text/" + "p" * 7000).status_code == 415
    sizes = [len(text.encode()) for text in stream.getvalue().splitlines()]
    assert len(sizes) == 2 and max(sizes) < select.PIPE_BUF, sizes
    named = lines(stream)[0]
    assert named["name"] == named["user"] == EMOJI * (NAME_LIMIT // 12), "as many as fit, none split"
    worst = Recorded(
        1.0,
        "mutate",
        ReviewRequest(
            EMOJI * 300, "CREATE", "é" * 300, "\x01" * 300, EMOJI * 300, EMOJI * 300, (), False, None, None,
            Subject("v1", "Pod", EMOJI * 300, '"' * 300),
        ),
        None,
        500,
        0.0,
        EMOJI * 5000,
    )  # fmt: skip
    text = audit.decision_text(worst)
    assert text == compact_json(decision_line(worst))
    assert len(text.encode()) < select.PIPE_BUF, len(text.encode())

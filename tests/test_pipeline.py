"""The pipeline's own rules: audit keys, warning limits, enforcement modes, forged annotations, exemptions."""

from __future__ import annotations

import copy
import dataclasses
import json
import re
import unicodedata
from typing import Any

import pytest

from tests.conftest import gpu_node, gpu_pod
from webhook import pipeline
from webhook.cluster import build_view
from webhook.config import CudaSettings, ExemptionSettings, MigSettings, Settings
from webhook.model import Context, copy_json

QUALIFIED_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


@pytest.mark.parametrize(
    "key", ["cuda-decision", "x" * 80, "-lead", "trail.", "sp ace/slash", "", "__", "a" * 62 + "-b"]
)
def test_audit_keys_are_valid_qualified_names(key: str) -> None:
    out = pipeline.audit_key(key)
    assert QUALIFIED_NAME.match(out) and len(out) <= 63


def _ctx(settings: Settings, **kw: object) -> Context:
    return Context(settings=settings, cluster=build_view([gpu_node("n1")], settings), **kw)  # type: ignore[arg-type]


def test_cuda_13_image_is_denied_in_enforce_and_warned_in_warn_mode() -> None:
    pod = gpu_pod(image="pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime")
    denied = pipeline.review(pod, _ctx(Settings(), namespace="ml"))
    assert not denied.allowed and denied.reason == "CUDAIncompatible"
    warned = pipeline.review(pod, _ctx(Settings(cuda=CudaSettings(namespace_modes={"ml": "warn"})), namespace="ml"))
    assert warned.allowed
    assert any(w.startswith("would be denied (CUDAIncompatible) in enforce mode: ") for w in warned.warnings)
    assert "cuda-would-deny" in warned.audit
    assert all(len(w) < 120 for w in warned.warnings)


def test_warn_mode_audits_every_containers_denial() -> None:
    pod = gpu_pod(image="pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime")
    second = copy.deepcopy(pod["spec"]["containers"][0])
    second.update(name="worker", image="pytorch/pytorch-nightly:2800000-cu12.9")
    pod["spec"]["containers"].append(second)
    warned = pipeline.review(pod, _ctx(Settings(cuda=CudaSettings(mode="warn")), namespace="ml"))
    assert warned.allowed
    lines = warned.audit["cuda-would-deny"].split("\n")
    assert [line.split(" (image", 1)[0] for line in lines] == ["container trainer", "container worker"]


def test_the_decision_names_each_reason_once_within_the_audit_limit() -> None:
    """200 containers denied for one reason: the decision says it once, and within the audit value limit."""
    pod = gpu_pod(image="pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime")
    first = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [{**copy.deepcopy(first), "name": f"c{i}"} for i in range(200)]
    settings = Settings()
    view = build_view([gpu_node("n1", allocatable={"nvidia.com/gpu": "256"})], settings)
    denied = pipeline.review(pod, Context(settings=settings, cluster=view, namespace="ml"))
    assert not denied.allowed
    assert denied.audit["decision"] == "denied (CUDAIncompatible)"
    assert all(len(v) <= pipeline.AUDIT_VALUE_LIMIT for v in denied.audit.values())


def test_a_second_call_on_the_mutated_pod_sends_no_other_decision() -> None:
    # The apiserver calls a mutating webhook again when a later one changed the pod (reinvocationPolicy
    # IfNeeded); it keeps an audit annotation's first value and logs a warning for each different one
    ctx = _ctx(Settings(), namespace="default")
    first = pipeline.mutate(gpu_pod(), ctx)
    assert first.patch and first.audit["decision"] in ("mutated", "annotated")
    again = copy.deepcopy(first.object)
    again["metadata"]["labels"] = {"sidecar.istio.io/inject": "true"}  # what the later webhook wrote
    second = pipeline.mutate(again, ctx)
    assert second.patch == [] and "decision" not in second.audit
    assert all(first.audit.get(k) == v for k, v in second.audit.items())


def test_the_mode_follows_the_pods_namespace_when_the_request_names_none() -> None:
    """`gpu-admission review` of a file: no request namespace, the pod's own decides its mode, for the policy's
    words and for the enforcement alike."""
    pod = gpu_pod(image="pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime")
    pod["metadata"]["namespace"] = "ml"
    warned = pipeline.review(pod, _ctx(Settings(cuda=CudaSettings(namespace_modes={"ml": "warn"})), namespace=""))
    assert warned.allowed and "cuda-would-deny" in warned.audit


@pytest.mark.parametrize(
    ("exemptions", "ctx"),
    [
        pytest.param(ExemptionSettings(namespaces=["ml"]), {"namespace": "ml"}, id="namespace"),
        pytest.param(ExemptionSettings(users=["ci-bot"]), {"username": "ci-bot"}, id="user"),
        pytest.param(ExemptionSettings(groups=["platform"]), {"groups": ("a", "platform")}, id="group"),
    ],
)
def test_exemptions_come_from_settings_only(exemptions: ExemptionSettings, ctx: dict[str, object]) -> None:
    pod = gpu_pod(image="pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime")
    result = pipeline.review(pod, _ctx(Settings(exemptions=exemptions), **ctx))
    assert result.allowed and result.skipped and result.patch == []


@pytest.mark.parametrize("allowed", [True, False])
def test_opt_out_label_only_where_settings_allow_it(allowed: bool) -> None:
    pod = gpu_pod(image="pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime")
    pod["metadata"]["labels"] = {"gpu-admission.io/ignore": "true"}
    settings = Settings(exemptions=ExemptionSettings(allow_opt_out_label=allowed))
    result = pipeline.review(pod, _ctx(settings, namespace="ml"))
    assert result.allowed is allowed
    assert bool(result.skipped) is allowed
    # where the label is not honoured, its owner is told so, not left to take the pod for exempt (found by a review)
    said = "label gpu-admission.io/ignore=true not honoured: opt-out labels are off here (exemptions.allowOptOutLabel)"
    assert any(w.startswith(said) for w in result.warnings) is not allowed, result.warnings


def test_a_pod_cannot_exempt_itself_by_annotation() -> None:
    pod = gpu_pod(
        image="pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime",
        annotations={"gpu-admission.io/ignore": "true", "gpu-admission.io/exempt": "true"},
    )
    assert not pipeline.review(pod, _ctx(Settings(), namespace="ml")).allowed


def test_forged_output_annotations_are_replaced_by_the_webhooks_own() -> None:
    pod = gpu_pod(
        annotations={
            "gpu-admission.io/cuda": "all fine, trust me",
            "gpu-admission.io/anything": "x",
            "gpu-admission.io/spot": "never",
        }
    )
    result = pipeline.mutate(pod, _ctx(Settings(), namespace="ml"))
    annotations = result.object["metadata"]["annotations"]
    assert annotations["gpu-admission.io/cuda"] != "all fine, trust me"
    assert "gpu-admission.io/anything" not in annotations
    assert annotations["gpu-admission.io/spot"] == "never", "input annotations are the user's and stay"
    assert result.warnings == ["gpu-admission.io/anything taken off: no gpu-admission key"]


def test_the_keys_the_policies_write_are_the_output_keys() -> None:
    """Only these are taken off a pod as forged, and kept as they were by a pod update: a policy writing another
    would see it kept from a forged annotation."""
    from webhook.model import OUTPUT_ANNOTATIONS
    from webhook.policies import cuda, mig_record, spot

    assert sorted([cuda.POLICY, mig_record.ANNOTATION, spot.APPLIED]) == sorted(OUTPUT_ANNOTATIONS)


def test_a_misspelt_input_annotation_taken_off_is_named() -> None:
    """A misspelt input (gpu-memroy, cuda-verison) was taken off as a forged output without a word, and a memory
    size written as an annotation gave the pod no GPU (found by a review): each is named, with the key meant."""
    pod = gpu_pod(
        annotations={
            "gpu-admission.io/cuda-verison": "12.4",
            "gpu-admission.io/gpu-memroy": "20Gi",
            "gpu-admission.io/gpu-memory": "20Gi",
            "gpu-admission.io/cuda": "forged",
        }
    )
    result = pipeline.mutate(pod, _ctx(Settings(), namespace="ml"))
    assert list(result.object["metadata"]["annotations"]) == ["gpu-admission.io/cuda"]
    assert result.warnings[:3] == [
        "gpu-admission.io/cuda-verison taken off: no gpu-admission key; did you mean gpu-admission.io/cuda-version?",
        "gpu-admission.io/gpu-memroy taken off: no gpu-admission key; did you mean the resource "
        "gpu-admission.io/gpu-memory?",
        "gpu-admission.io/gpu-memory taken off: it is a resource, not an annotation; set it in a container's "
        "resources.limits",
    ], result.warnings
    assert not any("gpu-admission.io/cuda " in w for w in result.warnings), "its own outputs are replaced unsaid"


def test_non_gpu_pod_passes_untouched() -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
    }
    result = pipeline.review(pod, _ctx(Settings(), namespace="ml"))
    assert result.allowed and result.patch == [] and not result.warnings
    assert result.object == pod


@pytest.mark.parametrize("count", [pipeline.MAX_CONTAINERS, pipeline.MAX_CONTAINERS + 1])
def test_pods_with_absurd_numbers_of_containers_are_refused_quickly(count: int) -> None:
    containers = [
        {"name": f"c{i}", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}} for i in range(count)
    ]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": containers}}
    result = pipeline.mutate(pod, _ctx(Settings(), namespace="ml"))
    if count > pipeline.MAX_CONTAINERS:
        assert not result.allowed and result.reason == "TooManyContainers"
        assert f"{count} containers" in result.message and "split" in result.message
    else:
        assert result.allowed


def test_spot_runs_first_because_its_tolerations_decide_where_mig_and_cuda_look() -> None:
    # The only MIG nodes are spot nodes behind a spot taint: only after spot has added its toleration can MIG find
    # a profile and CUDA find a compatible node. In any other order the pod would be refused.
    spot_mig = gpu_node(
        "spot-mig",
        labels={
            "cloud.google.com/gke-spot": "true",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig-3g.40gb.memory": "40192",
        },
        allocatable={"nvidia.com/gpu": "0", "nvidia.com/mig-3g.40gb": "4"},
        taints=[{"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}],
    )
    settings = Settings()
    ctx = Context(settings=settings, cluster=build_view([spot_mig], settings), namespace="ml")
    pod = gpu_pod(limits={"nvidia.com/gpu": "0.5"}, annotations={"gpu-admission.io/spot": "tolerate"})
    result = pipeline.review(pod, ctx)
    assert result.allowed, result.message
    limits = result.object["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {"nvidia.com/mig-3g.40gb": "1"}
    assert "supported by" in result.object["metadata"]["annotations"]["gpu-admission.io/cuda"]
    assert [name for name, _ in pipeline.MUTATORS] == ["mig", "cuda", "spot", "mig", "cuda"]
    assert [step.__name__ for _, step in pipeline.MUTATORS][:2] == ["forget", "forget"]


MIG_LINE = "trainer: nvidia.com/gpu 500m -> nvidia.com/mig-3g.40gb (NVIDIA-A100-SXM4-80GB, pool a100)"


@pytest.mark.parametrize(
    ("old", "new", "restored"),
    [
        pytest.param(
            {"gpu-admission.io/mig": MIG_LINE}, {"gpu-admission.io/mig": "approved by me"}, True, id="changed"
        ),
        pytest.param({}, {"gpu-admission.io/cuda": "all fine"}, True, id="added"),
        pytest.param({"gpu-admission.io/mig": MIG_LINE}, {}, True, id="removed"),
        pytest.param(
            {"gpu-admission.io/mig": MIG_LINE},
            {"gpu-admission.io/mig": MIG_LINE, "x": "y"},
            False,
            id="other-annotation",
        ),
        pytest.param({}, {"gpu-admission.io/spot": "tolerate"}, False, id="input-annotation"),
    ],
)
def test_a_pod_update_cannot_rewrite_the_webhooks_annotations(
    old: dict[str, str], new: dict[str, str], restored: bool
) -> None:
    import jsonpatch

    before, after = gpu_pod(annotations=old or None), gpu_pod(annotations=new or None)
    ctx = Context(
        settings=Settings(), cluster=build_view([], Settings()), namespace="ml", operation="UPDATE", old_object=before
    )
    result = pipeline.mutate(after, ctx)
    assert result.allowed
    if not restored:
        assert result.patch == [] and result.skipped
        return
    final = jsonpatch.apply_patch(after, result.patch)
    outputs = {k: v for k, v in (final["metadata"].get("annotations") or {}).items() if k != "gpu-admission.io/spot"}
    assert {k: v for k, v in outputs.items() if k.startswith("gpu-admission.io/")} == old
    assert any("can only be written by the webhook" in w for w in result.warnings)
    assert result.audit["decision"] == "restored the webhook's annotations"


def test_exempt_users_may_update_them() -> None:
    before, after = gpu_pod(), gpu_pod(annotations={"gpu-admission.io/cuda": "set by the platform team"})
    settings = Settings(exemptions=ExemptionSettings(users=["platform-bot"]))
    ctx = Context(
        settings=settings,
        cluster=build_view([], settings),
        namespace="ml",
        operation="UPDATE",
        old_object=before,
        username="platform-bot",
    )
    assert pipeline.mutate(after, ctx).patch == []


def _objects_for_invariants() -> list[Any]:
    from tests.conftest import FIXTURES

    objects: list[Any] = [json.loads(p.read_text()) for p in sorted(FIXTURES.glob("*.json"))]
    objects += [
        gpu_pod(),
        gpu_pod(limits={"nvidia.com/gpu": "0.5"}, annotations={"gpu-admission.io/spot": "require"}),
        gpu_pod(image="pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime"),
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "d"},
            "spec": {
                "template": {
                    "spec": {
                        "containers": [{"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "500m"}}}]
                    }
                }
            },
        },
    ]
    return objects


@pytest.mark.parametrize("step", [pipeline.mutate, pipeline.validate, pipeline.review], ids=lambda s: s.__name__)
def test_the_pipeline_never_changes_its_input(step: Any) -> None:
    # validate reads the object in place (no copy) and mutate copies only metadata and spec: neither may write
    # into what it was given.
    settings = Settings()
    nodes = [
        gpu_node("a"),
        gpu_node(
            "spot",
            labels={"cloud.google.com/gke-spot": "true"},
            taints=[{"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}],
        ),
    ]
    ctx = Context(settings=settings, cluster=build_view(nodes, settings), namespace="ml")
    for obj in _objects_for_invariants():
        before = copy.deepcopy(obj)
        step(obj, ctx)
        assert obj == before, obj.get("kind")


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param({"a": 1}, {"a": 1}, id="same"),
        pytest.param({"a": 1}, {"a": 2}, id="replace"),
        pytest.param({"a": 1, "b": 2}, {"a": 1}, id="remove"),
        pytest.param({"x/y~z": 1}, {"x/y~z": 2, "n/ew": {"k": [1]}}, id="escaped-keys"),
        pytest.param({"l": [1, 2]}, {"l": [1, 2, 3, 4]}, id="append"),
        pytest.param({"l": [1, 2, 3]}, {"l": [1]}, id="shrink"),
        pytest.param({"l": [1, 2]}, {"l": [3, 1, 2]}, id="prepend"),
        pytest.param({"l": [{"a": 1}, {"b": 2}]}, {"l": [{"a": 1}, {"b": 3, "c": []}]}, id="nested"),
        pytest.param({"a": [1]}, {"a": {"0": 1}}, id="list-to-map"),
        pytest.param({"a": "1"}, {"a": [1]}, id="string-to-list"),
    ],
)
@pytest.mark.parametrize("part", ["metadata", "spec"])
def test_make_patch_turns_before_into_after(before: dict[str, Any], after: dict[str, Any], part: str) -> None:
    import jsonpatch

    obj = {"kind": "Pod", part: before, "status": {"phase": "Pending"}}
    target = {"kind": "Pod", part: after, "status": {"phase": "Pending"}}
    ops = pipeline.make_patch(obj, target)
    assert json.dumps(jsonpatch.apply_patch(obj, ops)) == json.dumps(target)
    assert (ops == []) is (json.dumps(before) == json.dumps(after))
    assert all(not op["path"].startswith("/status") for op in ops)


def test_a_denial_names_each_pool_once_with_all_its_drivers() -> None:
    pool = {"eks.amazonaws.com/nodegroup": "inference"}
    old = gpu_node(
        "a",
        labels={
            **pool,
            "nvidia.com/cuda.driver-version.full": "535.104.05",
            "nvidia.com/cuda.runtime-version.minor": "2",
        },
    )
    newer = gpu_node("b", labels=pool)  # 550.54.15, CUDA 12.4
    settings = Settings()
    ctx = Context(settings=settings, cluster=build_view([old, newer], settings), namespace="ml")
    result = pipeline.review(gpu_pod(image="pytorch/pytorch-nightly:2710000-cu12.8"), ctx)
    assert not result.allowed
    assert "pool inference (drivers 535.104.05 or 550.54.15, CUDA 12.2 or 12.4)" in result.message
    assert result.message.count("pool inference (") == 1


def test_warnings_past_the_apiservers_limit_are_counted_not_dropped_unsaid() -> None:
    """Sixty containers whose CUDA is unknown each get a warning; the apiserver keeps 4096 characters of them."""
    pod = gpu_pod(image="registry.example/team/model:latest")
    first = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [{**first, "name": f"worker-{n:02d}"} for n in range(60)]
    result = pipeline.review(pod, _ctx(Settings(cuda=CudaSettings(unknown_version="warn")), namespace="ml"))
    assert result.allowed
    unknown = [w for w in result.outcome.warnings if "CUDA version unknown" in w]
    assert len(unknown) == 60
    shown, last = result.warnings[:-1], result.warnings[-1]
    assert len(shown) < 60 and sum(map(len, result.warnings)) <= pipeline.WARNINGS_TOTAL
    assert (
        last
        == f"{len(result.outcome.warnings) - len(shown)} more warnings not shown (an answer keeps to 1800 characters;"
        " gpu-admission review shows them all)"
    )
    assert shown == [pipeline._short(w) for w in result.outcome.warnings[: len(shown)]]


def test_both_answers_warnings_fit_the_apiservers_one_budget_what_would_be_denied_first() -> None:
    """The apiserver keeps 4096 characters of warnings for the whole API request, both webhooks' and PodSecurity's
    together, and drops what comes past it unsaid: at 4000 each, a /validate after a full /mutate lost all but its
    first warning; and the would-deny line came after 45 containers' own, where the cut falls first (found by a
    review of what the webhook reports)."""
    pod = gpu_pod(image="pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime")
    first = pod["spec"]["containers"][0]
    pod["spec"]["containers"] = [
        {**first, "name": f"worker-{n:02d}", "image": f"registry.example/team/m{n}:latest"} for n in range(45)
    ]
    pod["spec"]["containers"][44]["image"] = first["image"]
    settings = Settings(cuda=CudaSettings(namespace_modes={"ml": "warn"}, unknown_version="warn"))
    view = build_view([gpu_node("n1", allocatable={"nvidia.com/gpu": "64"})], settings)
    ctx = Context(settings=settings, cluster=view, namespace="ml")
    mutated = pipeline.mutate(copy.deepcopy(pod), ctx)
    validated = pipeline.validate(mutated.object, ctx)
    assert validated.allowed
    assert validated.warnings[0].startswith("would be denied (CUDAIncompatible) in enforce mode"), validated.warnings[0]
    assert validated.warnings[-1].endswith(pipeline.NOT_SHOWN)
    together = sum(map(len, mutated.warnings)) + sum(map(len, validated.warnings))
    assert together <= 2 * pipeline.WARNINGS_TOTAL <= 4096 - 400  # room for PodSecurity's


def test_a_warnings_control_characters_are_written_out() -> None:
    """Found by the observability review: a warning that quoted a user's value with a newline in it was dropped by
    the apiserver, unsaid (it refuses a warning with any control character)."""
    pod = gpu_pod(annotations={"gpu-admission.io/gpu-fraction": "0.5\nplease\x85\x7f"})
    result = pipeline.mutate(pod, _ctx(Settings(mig=MigSettings(enabled=False)), namespace="ml"))
    (warning,) = [w for w in result.warnings if "gpu-fraction" in w]
    assert "0.5\\nplease\\x85\\x7f not converted" in warning
    assert not any(unicodedata.category(ch) == "Cc" for w in result.warnings for ch in w)


def test_the_warnings_of_a_misplaced_annotation_are_within_the_same_limit() -> None:
    """A Deployment whose own metadata holds an input annotation for each of 45 containers: each is warned of, and
    with the rest they stay within the limit (they were put in front after it was applied; found by a review)."""
    pod = gpu_pod(image="registry.example/team/model:latest")
    first = pod["spec"]["containers"][0]
    containers = [{**first, "name": f"worker-{n:02d}"} for n in range(45)]
    annotations = {f"gpu-admission.io/cuda-version.{c['name']}": "12.4" for c in containers}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ml", "annotations": annotations},
        "spec": {"template": {"metadata": {}, "spec": {**pod["spec"], "containers": containers}}},
    }
    result = pipeline.mutate(deployment, _ctx(Settings(cuda=CudaSettings(unknown_version="warn")), namespace="ml"))
    assert sum(map(len, result.warnings)) <= pipeline.WARNINGS_TOTAL
    assert result.warnings[0].startswith("gpu-admission.io/cuda-version.worker-00 is on the Deployment")
    assert result.warnings[-1].endswith(pipeline.NOT_SHOWN)


# -- a workload UPDATE that leaves its pod template as it was -----------------------------------------------------
OLD_DRIVER = {
    "nvidia.com/cuda.driver-version.full": "535.183.01",
    "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "2",
}


def _deployment(image: str = "nvidia/cuda:12.2.2-base-ubuntu22.04") -> dict[str, Any]:
    template = gpu_pod(image=image)
    del template["apiVersion"], template["kind"]
    template["metadata"] = {"labels": {"app": "infer"}}
    spec = {"replicas": 2, "selector": {"matchLabels": {"app": "infer"}}, "template": template}
    meta = {"name": "infer", "namespace": "ml"}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


def _on(labels: dict[str, str] | None, **kw: Any) -> Context:
    settings = Settings()
    return Context(settings=settings, cluster=build_view([gpu_node("n1", labels)], settings), namespace="ml", **kw)


def _stored_deployment() -> dict[str, Any]:
    """The Deployment as the apiserver stores it, reviewed against nodes on driver 535 (CUDA 12.2)."""
    stored: dict[str, Any] = pipeline.mutate(_deployment(), _on(OLD_DRIVER)).object
    assert "driver-535.183.01" in stored["spec"]["template"]["metadata"]["annotations"]["gpu-admission.io/cuda"]
    return stored


def test_an_update_that_leaves_the_template_as_it_was_does_not_roll_its_pods() -> None:
    """Found by review: after the nodes' driver was upgraded, a change of replicas alone (kubectl apply, Argo CD)
    rewrote the template's gpu-admission.io/cuda line with the new driver: the Deployment rolled every pod."""
    stored = _stored_deployment()
    scaled = copy.deepcopy(stored)
    scaled["spec"]["replicas"] = 5
    ctx = _on(None, operation="UPDATE", old_object=stored)  # the nodes now on driver 550 (CUDA 12.4)
    for step in (pipeline.mutate, pipeline.validate):
        result = step(scaled, ctx)
        assert result.allowed and not result.patch and result.skipped == pipeline.TEMPLATE_KEPT
    # A change to the template itself is reviewed with what the cluster says now.
    edited = copy.deepcopy(scaled)
    edited["spec"]["template"]["spec"]["containers"][0]["image"] = "nvidia/cuda:12.2.0-base-ubuntu22.04"
    result = pipeline.mutate(edited, ctx)
    assert not result.skipped
    assert "driver-550.54.15" in result.object["spec"]["template"]["metadata"]["annotations"]["gpu-admission.io/cuda"]


def test_an_update_that_drops_the_webhooks_annotations_gets_them_back_as_they_were() -> None:
    """A server-side apply whose manager did not write them drops them; put back as stored, the template is as it
    was and its pods do not roll."""
    stored = _stored_deployment()
    applied = copy.deepcopy(stored)
    del applied["spec"]["template"]["metadata"]["annotations"]
    applied["spec"]["replicas"] = 3
    result = pipeline.mutate(applied, _on(None, operation="UPDATE", old_object=stored))
    assert result.allowed and result.patch and result.audit["decision"] == "kept the pod template's review"
    assert result.object["spec"]["template"] == stored["spec"]["template"]
    assert json.loads(json.dumps(result.object))["spec"]["replicas"] == 3


def test_an_update_that_changes_what_the_user_asks_of_the_template_is_reviewed() -> None:
    stored = _stored_deployment()
    asked = copy.deepcopy(stored)
    asked["spec"]["template"]["metadata"]["annotations"]["gpu-admission.io/spot"] = "tolerate"
    assert not pipeline.mutate(asked, _on(OLD_DRIVER, operation="UPDATE", old_object=stored)).skipped
    relabelled = copy.deepcopy(stored)
    relabelled["spec"]["template"]["metadata"]["labels"]["tier"] = "gold"
    assert not pipeline.mutate(relabelled, _on(OLD_DRIVER, operation="UPDATE", old_object=stored)).skipped


def test_the_pods_of_a_kept_template_are_still_checked_as_they_are_created() -> None:
    """The update that left the template as it was is not denied when the cluster can no longer run it (the
    nodes back on an older driver): its pods are, each as it is created, with the reason."""
    stored = pipeline.mutate(_deployment("nvidia/cuda:12.4.1-base-ubuntu22.04"), _on(None)).object
    scaled = copy.deepcopy(stored)
    scaled["spec"]["replicas"] = 4
    assert pipeline.validate(scaled, _on(OLD_DRIVER, operation="UPDATE", old_object=stored)).allowed
    pod = {"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(stored["spec"]["template"])}
    pod["metadata"]["name"] = "infer-7d9c-abcde"
    denied = pipeline.review(pod, _on(OLD_DRIVER))
    assert not denied.allowed and denied.reason == "CUDAIncompatible"


def _exactly(a: Any, b: Any) -> bool:
    """Equal, with the same types all the way down (1 is not 1.0 nor True, a tuple not a list)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_exactly(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_exactly(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


@pytest.mark.parametrize(
    "value",
    [
        gpu_pod(),
        {"a": [1, 1.0, True, None, -0.0, 1.5e308, "é\u2028", {"": []}], "b": {"c": {"d": [[]]}}},
        {"big": 2**64, "n": [-(2**63) - 1]},  # past 64 bits: orjson will not write it
        {"s": "x\ud800"},  # a lone surrogate (read from an escape): neither
        {"t": __import__("datetime").datetime(2026, 12, 1, 10, 0)},  # YAML's timestamp (the CLI): deepcopy
    ],
)
def test_a_json_copy_is_exact_and_shares_nothing(value: Any) -> None:
    copied = copy_json(value)
    assert _exactly(copied, value)
    stack: list[tuple[Any, Any]] = [(copied, value)]
    while stack:  # no container of the copy is one of the value's
        a, b = stack.pop()
        if isinstance(a, dict | list):
            assert a is not b
            stack.extend(zip(a.values(), b.values(), strict=True) if isinstance(a, dict) else zip(a, b, strict=True))


def _replicaset(owners: list[dict[str, Any]] | None) -> dict[str, Any]:
    template = gpu_pod(image="pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime", limits={"nvidia.com/gpu": "0.5"})
    rs: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": "web-5d4f", "namespace": "ml"},
        "spec": {"template": {"metadata": template["metadata"], "spec": template["spec"]}},
    }
    if owners is not None:
        rs["metadata"]["ownerReferences"] = owners
    return rs


def test_a_deployments_replicaset_is_left_to_the_deployment_and_its_pods() -> None:
    """Found by a review of workload flows: a Deployment passed untouched (its creator exempt, or the opt-out label
    on its own metadata, or a node list that changed since) had its ReplicaSet's template patched, and the
    Deployment controller, which finds its ReplicaSet by comparing templates, created ReplicaSets without end."""
    owner = [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u", "controller": True}]
    for step in (pipeline.mutate, pipeline.validate):
        result = step(_replicaset(owner), _ctx(Settings(), namespace="ml"))
        assert result.allowed and result.skipped == pipeline.DEPLOYMENTS_REPLICASET and result.patch == []
    # a bare ReplicaSet, or one an operator controls, is reviewed as any workload
    for owners in (None, [{**owner[0], "kind": "MyOperator"}], [{**owner[0], "controller": False}]):
        assert not pipeline.review(_replicaset(owners), _ctx(Settings(), namespace="ml")).skipped


@pytest.mark.parametrize(
    ("part", "build"),
    [
        pytest.param(
            "required node affinity terms",
            lambda n: {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "k", "operator": "NotIn", "values": [f"v{i}"]}]}
                                for i in range(n)
                            ]
                        }
                    }
                }
            },
            id="terms",
        ),
        pytest.param(
            "tolerations",
            lambda n: {"tolerations": [{"key": f"k{i}", "operator": "Exists"} for i in range(n)]},
            id="tol",
        ),
        pytest.param(
            "node affinity values",
            lambda n: {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["a"] * n}
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            id="values",
        ),
    ],
)
def test_pods_with_absurd_numbers_of_node_rules_are_refused(part: str, build: Any) -> None:
    """Found by a review that grew each part of a pod: thousands of terms or tolerations took seconds to tens of
    seconds to review (each judged against every pool, the terms combined with the policies' own)."""
    limit = pipeline.MAX_PLACEMENT[part]
    for n, refused in ((limit, False), (limit + 1, True)):
        pod = gpu_pod(image="nvidia/cuda:12.4.1-base-ubuntu22.04")
        pod["spec"].update(build(n))
        result = pipeline.review(pod, _ctx(Settings(), namespace="ml"))
        assert (result.reason == "TooManyNodeRules") is refused, result.reason
        if refused:
            assert not result.allowed and result.message.startswith(f"the pod has {n} {part}; gpu-admission reviews")


def test_a_pod_the_policies_would_take_past_a_cap_is_refused_by_the_mutating_webhook() -> None:
    """Found by a review of the last session's diff: the caps were checked on the pod as it came, so a pod just
    under one was admitted by /mutate with what the policies add (spot require ANDs one alternative per spot label
    key into every term; spot tolerate adds tolerations), then refused on reinvocation and by /validate as if the
    user had written that many. /mutate now refuses it, naming what the webhook added."""
    nodes = [
        gpu_node("spot", labels={"eks.amazonaws.com/capacityType": "SPOT", "karpenter.sh/capacity-type": "spot"}),
        gpu_node("on-demand", labels={"eks.amazonaws.com/capacityType": "ON_DEMAND"}),
    ]
    settings = Settings()
    ctx = Context(settings=settings, cluster=build_view(nodes, settings), namespace="ml")
    limit = pipeline.MAX_PLACEMENT["required node affinity terms"]
    for n, refused in ((limit // 2, False), (limit // 2 + 1, True)):
        pod = gpu_pod(image="nvidia/cuda:12.4.1-base-ubuntu22.04", annotations={"gpu-admission.io/spot": "require"})
        pod["spec"]["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "example.com/rack", "operator": "NotIn", "values": [f"r{i}"]}]}
                        for i in range(n)
                    ]
                }
            }
        }
        mutated = pipeline.mutate(copy.deepcopy(pod), ctx)
        assert mutated.allowed is not refused, mutated.message
        if refused:
            assert mutated.reason == "TooManyNodeRules" and mutated.code == 422  # as the pod as written would be
            assert mutated.message.startswith(
                f"with what gpu-admission adds (spot-affinity) the pod would have {2 * n} required"
                " node affinity terms; gpu-admission reviews pods of at most 512: write fewer"
            ), mutated.message
            assert mutated.patch == [] and mutated.object == pod
        else:  # what it admits passes again, and at the validating webhook
            assert pipeline.mutate(mutated.object, ctx).allowed and pipeline.validate(mutated.object, ctx).allowed
    tolerations = [{"key": f"k{i}", "operator": "Exists"} for i in range(pipeline.MAX_PLACEMENT["tolerations"])]
    pod = gpu_pod(annotations={"gpu-admission.io/spot": "tolerate"})
    pod["spec"]["tolerations"] = tolerations
    unknown = Context(settings=settings, cluster=build_view([], settings), namespace="ml")  # the presets' tolerations
    answer = pipeline.mutate(pod, unknown)
    assert answer.reason == "TooManyNodeRules" and "(spot-toleration) the pod would have 10" in answer.message


def test_an_apply_that_drops_the_templates_annotations_map_still_undoes_what_the_webhook_wrote() -> None:
    """Found by a generative review of the policies together: client-side kubectl apply of a manifest whose
    template lost its only annotation (gpu-admission.io/spot) deletes the whole map, the webhook's own keys with
    it; the webhook no longer knew what it had written: the spot tolerations and affinity stayed, and a converted
    fraction back beside its MIG device was refused. The stored template's words stand in for the dropped ones."""
    from dataclasses import replace

    labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig-3g.40gb.memory": "40192",
        "nvidia.com/gpu.memory": "81920",
    }
    mig = {"nvidia.com/gpu": "0", "nvidia.com/mig-3g.40gb": "2"}
    spot_taint = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
    nodes = [
        gpu_node("spot", {**labels, "cloud.google.com/gke-spot": "true"}, mig, [spot_taint]),
        gpu_node("od", labels, mig),
    ]
    settings = Settings()
    ctx = Context(settings=settings, cluster=build_view(nodes, settings), namespace="ml")
    for limits in ({"nvidia.com/gpu": "1"}, {"nvidia.com/gpu": "0.5"}):
        container = {"name": "c", "image": "nvidia/cuda:12.4.1-runtime-ubuntu22.04", "resources": {"limits": limits}}
        template = {
            "metadata": {"annotations": {"gpu-admission.io/spot": "require"}},
            "spec": {"containers": [container]},
        }
        manifest: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w"}}
        manifest["spec"] = {"selector": {"matchLabels": {"a": "b"}}, "template": template}
        live = pipeline.mutate(copy.deepcopy(manifest), ctx).object
        assert live["spec"]["template"]["spec"]["tolerations"]
        sent = copy.deepcopy(live)
        del sent["spec"]["template"]["metadata"]["annotations"]  # the merge deletes the map the manifest lost
        sent["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"].update(limits)  # as the manifest has
        update = replace(ctx, operation="UPDATE", old_object=live)
        result = pipeline.mutate(sent, update)
        assert result.allowed, result.message
        spec = result.object["spec"]["template"]["spec"]
        assert "tolerations" not in spec and "affinity" not in spec, spec
        assert pipeline.mutate(copy.deepcopy(result.object), update).patch == []


def test_a_workload_moved_to_never_is_judged_without_the_earlier_reviews_mig_pin() -> None:
    """Found by a generative review of the policies together: a Deployment converted to a GKE partition on a spot
    pool under require, then applied with never: the spot policy, first, judged it under the partition pin (the
    mig policy then took the pin out and converted afresh), added no NotIn, and the new MIG device was on an
    untainted EKS spot pool. What an earlier review wrote is taken out before any policy judges the template."""
    from dataclasses import replace

    gke_spot = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
    mixed = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}
    mixed["nvidia.com/mig.strategy"] = "mixed"
    partition = "cloud.google.com/gke-gpu-partition-size"
    part = {"cloud.google.com/gke-nodepool": "part-spot", "cloud.google.com/gke-spot": "true", partition: "1g.10gb"}
    part["cloud.google.com/gke-accelerator"] = "nvidia-a100-80gb"
    nodes: list[dict[str, Any]] = [
        {"metadata": {"name": "p", "labels": part}, "spec": {"taints": [gke_spot]}},
        {"metadata": {"name": "s", "labels": {**mixed, "eks.amazonaws.com/capacityType": "SPOT"}}},
        {"metadata": {"name": "o", "labels": {**mixed, "eks.amazonaws.com/capacityType": "ON_DEMAND"}}},
    ]
    allocatable = [{"nvidia.com/gpu": "7"}, {"nvidia.com/mig-3g.40gb": "2"}, {"nvidia.com/mig-7g.80gb": "1"}]
    for n, alloc in zip(nodes, allocatable, strict=True):
        n.update(apiVersion="v1", kind="Node", status={"allocatable": {"cpu": "96", **alloc}})
    settings = Settings(cuda=CudaSettings(mode="off"))
    ctx = Context(settings=settings, cluster=build_view(nodes, settings), namespace="ml")
    container = {"name": "c", "image": "ghcr.io/x/train:1", "resources": {"limits": {"nvidia.com/gpu": "125m"}}}
    template = {"metadata": {"annotations": {"gpu-admission.io/spot": "require"}}, "spec": {"containers": [container]}}
    manifest: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w"}}
    manifest["spec"] = {"selector": {"matchLabels": {"a": "b"}}, "template": template}
    live = pipeline.mutate(copy.deepcopy(manifest), ctx).object
    assert live["spec"]["template"]["spec"]["nodeSelector"] == {partition: "1g.10gb"}
    sent = copy.deepcopy(live)  # kubectl apply of the manifest with never: the fraction back, live-only fields kept
    sent["spec"]["template"]["metadata"]["annotations"]["gpu-admission.io/spot"] = "never"
    sent["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "125m"}
    result = pipeline.mutate(sent, replace(ctx, operation="UPDATE", old_object=live))
    assert result.allowed, result.message
    moved = result.object["spec"]["template"]["spec"]
    fresh = copy.deepcopy(manifest)
    fresh["spec"]["template"]["metadata"]["annotations"]["gpu-admission.io/spot"] = "never"
    created = pipeline.mutate(fresh, ctx).object["spec"]["template"]["spec"]
    assert (
        moved["containers"][0]["resources"]
        == created["containers"][0]["resources"]
        == {"limits": {"nvidia.com/mig-7g.80gb": "1"}}
    )
    assert moved["affinity"] == created["affinity"] and "nodeSelector" not in moved


def test_an_annotations_map_that_held_only_the_webhooks_words_goes_with_them() -> None:
    """Found by a generative review: the map an earlier review made was left behind, empty, once nothing was to be
    said (the GPU ask removed), while a fresh create of the same manifest has none."""
    settings = Settings()
    ctx = Context(settings=settings, cluster=build_view([gpu_node("h100-a")], settings), namespace="ml")
    container = {
        "name": "c",
        "image": "nvidia/cuda:12.2.2-base-ubuntu22.04",
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    template = {"metadata": {"labels": {"app": "d"}}, "spec": {"containers": [container]}}
    spec = {"selector": {"matchLabels": {"app": "d"}}, "template": template}
    live = pipeline.mutate(
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": spec}, ctx
    ).object
    assert live["spec"]["template"]["metadata"]["annotations"]
    sent = copy.deepcopy(live)
    sent["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    result = pipeline.mutate(sent, dataclasses.replace(ctx, operation="UPDATE", old_object=live))
    assert result.object["spec"]["template"]["metadata"] == {"labels": {"app": "d"}}


@pytest.mark.parametrize("old", [None, [], "pod"])
def test_a_pod_update_without_the_stored_pod_keeps_its_annotations(old: Any) -> None:
    """Found by a review of this session's commits: an UPDATE whose oldObject is missing or not an object (the
    apiserver always sends one) had the webhook's annotations patched away, as if the stored pod had none."""
    after = gpu_pod(annotations={"gpu-admission.io/cuda": "trainer: CUDA 12.2 ..."})
    ctx = Context(
        settings=Settings(), cluster=build_view([], Settings()), namespace="ml", operation="UPDATE", old_object=old
    )
    result = pipeline.mutate(after, ctx)
    assert result.allowed and result.patch == [] and result.skipped


def _annotations_size(obj: dict[str, Any]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in obj["metadata"].get("annotations", {}).items())


def test_the_webhooks_annotations_keep_the_pod_within_the_apiservers_limit() -> None:
    """The apiserver takes at most 256 KiB of an object's annotations: a pod near it was admitted with the webhook's
    words added, and then refused in words that do not name the webhook (found by a review). The container lines,
    which only people read, go first; past that the pod is refused, saying whose bytes are whose."""
    ctx = _ctx(Settings(), namespace="ml")
    clean = pipeline.mutate(gpu_pod(), ctx)
    words = clean.object["metadata"]["annotations"]["gpu-admission.io/cuda"]
    decision = words.split("\n")[-1]
    assert decision.startswith("decision: ") and len(words) > len(decision) + 100
    key = "example.com/blob"
    room = pipeline.ANNOTATIONS_LIMIT - len(key) - len("gpu-admission.io/cuda")
    fits = gpu_pod(annotations={key: "x" * (room - len(words) - 1)})
    assert pipeline.mutate(fits, ctx).object["metadata"]["annotations"]["gpu-admission.io/cuda"] == words
    short = f"(1 {pipeline.LEFT_OUT}; gpu-admission review shows them)\n{decision}"
    assert len(short) < len(words)
    near = gpu_pod(annotations={key: "x" * (room - len(short))})
    cut = pipeline.mutate(near, ctx)
    assert cut.allowed and _annotations_size(cut.object) == pipeline.ANNOTATIONS_LIMIT
    assert cut.object["metadata"]["annotations"]["gpu-admission.io/cuda"] == short
    assert pipeline.mutate(copy.deepcopy(cut.object), ctx).patch == []
    full = gpu_pod(annotations={key: "x" * room})
    refused = pipeline.mutate(full, ctx)
    assert not refused.allowed and refused.reason == "AnnotationsTooLong"
    assert f"its own {pipeline.ANNOTATIONS_LIMIT - len('gpu-admission.io/cuda')}, gpu-admission's" in refused.message
    # the CUDA check off: no gpu-admission.io/cuda to shorten, and none made up (refused for the bytes it has)
    off = _ctx(Settings(cuda=CudaSettings(mode="off")), namespace="ml")
    plain = pipeline.mutate(gpu_pod(annotations={key: "x" * room, "gpu-admission.io/spot": "tolerate"}), off)
    assert plain.reason == "AnnotationsTooLong" and "(spot-applied " in plain.message, plain.message
    assert re.search(r"gpu-admission's [0-9]+ \(spot-applied [0-9]+\)", plain.message), plain.message


HUGE_KEY = "gpu-admission.io/" + "k" * 200_000
MISSPELT = {f"gpu-admission.io/typo-{n:04d}": "v" for n in range(3000)}


def _pod_update() -> tuple[Any, Context]:
    """A pod UPDATE that writes 3,000 misspelt keys and one of 200,000 characters (``protect_outputs``)."""
    before = gpu_pod(annotations={"gpu-admission.io/mig": MIG_LINE})
    after = gpu_pod(annotations={"gpu-admission.io/mig": MIG_LINE, HUGE_KEY: "v", **MISSPELT})
    settings = Settings()
    return after, Context(
        settings=settings, cluster=build_view([], settings), namespace="ml", operation="UPDATE", old_object=before
    )


def _workload_update() -> tuple[Any, Context]:
    """A Deployment UPDATE that keeps its template and drops its annotations, one of which (written before the
    webhook was installed) is 200,000 characters long, and brings 3,000 misspelt keys (``_keep_review``)."""
    stored = _stored_deployment()
    stored["spec"]["template"]["metadata"]["annotations"][HUGE_KEY] = "v"
    applied = copy.deepcopy(stored)
    applied["spec"]["template"]["metadata"]["annotations"] = dict(MISSPELT)
    return applied, _on(None, operation="UPDATE", old_object=stored)


@pytest.mark.parametrize("update", [_pod_update, _workload_update], ids=["pod", "workload-template-kept"])
def test_every_answer_keeps_to_the_audit_value_and_warning_limits(update: Any) -> None:
    """Found by the observability review: the answers to a pod UPDATE (the webhook's annotations put back) and to
    a workload UPDATE that keeps its template's review were built apart from the others and sent whole: audit
    values of 200,000 characters each ('restored' and 'again-restored'), and 3,000 warnings."""
    obj, ctx = update()
    result = pipeline.mutate(obj, ctx)
    assert result.allowed and result.patch and "restored" in result.audit
    assert all(len(v) <= pipeline.AUDIT_VALUE_LIMIT for v in result.audit.values()), {
        k: len(v) for k, v in result.audit.items()
    }
    assert sum(map(len, result.warnings)) <= pipeline.WARNINGS_TOTAL
    assert result.warnings[-1].endswith(pipeline.NOT_SHOWN)
    assert all(len(w) < 120 for w in result.warnings)


def test_a_misspelt_key_written_by_an_update_is_named_not_called_the_webhooks() -> None:
    """`kubectl annotate pod p gpu-admission.io/cuda-verison=12.4` was told the key 'can only be written by the
    webhook', which writes no such key (found by a review of this session's commits)."""
    before = gpu_pod(annotations={"gpu-admission.io/mig": MIG_LINE})
    after = gpu_pod(annotations={"gpu-admission.io/mig": "approved", "gpu-admission.io/cuda-verison": "12.4"})
    ctx = Context(
        settings=Settings(), cluster=build_view([], Settings()), namespace="ml", operation="UPDATE", old_object=before
    )
    result = pipeline.mutate(after, ctx)
    assert result.warnings == [
        "gpu-admission.io/mig can only be written by the webhook; put back as it was",
        "gpu-admission.io/cuda-verison taken off: no gpu-admission key; did you mean gpu-admission.io/cuda-version?",
    ]


def test_the_key_meant_is_said_whole() -> None:
    """The longest input key was cut off the end of its own suggestion (found by a review of this session's
    commits); the user's key is shortened instead. The opt-out written as an annotation is told it is a label."""
    long = "gpu-admission.io/gpu-fraction-containr-for-the-trainer"
    pod = gpu_pod(annotations={long: "trainer", "gpu-admission.io/ignore": "true"})
    warnings = pipeline.mutate(pod, _ctx(Settings(), namespace="ml")).warnings
    assert warnings[0].endswith("; did you mean gpu-admission.io/gpu-fraction-container?"), warnings
    assert len(warnings[0]) <= 119 and "…" in warnings[0]
    assert warnings[1] == (
        "gpu-admission.io/ignore taken off: no gpu-admission key; the opt-out is a label (where the settings allow it)"
    )


def test_a_workloads_template_labelled_to_opt_out_is_told_where_the_settings_do_not_allow_it() -> None:
    """The warning read the object's own labels: a Deployment whose template (its pods' labels) opted out was not
    told, and one whose own metadata did (which no pod carries) was (found by a review of this session's
    commits)."""
    template = gpu_pod()
    template["metadata"]["labels"] = {"gpu-admission.io/ignore": "true"}
    workload = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": template},
    }
    result = pipeline.mutate(workload, _ctx(Settings(), namespace="ml"))
    assert any(w.startswith("label gpu-admission.io/ignore=true not honoured") for w in result.warnings)


def test_a_misspelt_key_applied_again_is_said_again() -> None:
    """An update that leaves a template as stored keeps its review; a misspelt key applied again with it was taken
    off without a word (said only when the workload was made; found by a review of this session's commits)."""
    workload = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": gpu_pod(annotations={"gpu-admission.io/x": "1"})},
    }
    ctx = _ctx(Settings(), namespace="ml")
    made = pipeline.mutate(copy.deepcopy(workload), ctx)
    said = "gpu-admission.io/x taken off: no gpu-admission key"
    assert said in made.warnings
    live = made.object
    sent = copy.deepcopy(live)
    sent["spec"]["template"]["metadata"]["annotations"]["gpu-admission.io/x"] = "1"
    again = pipeline.mutate(sent, dataclasses.replace(ctx, operation="UPDATE", old_object=live))
    assert again.patch == [{"op": "remove", "path": "/spec/template/metadata/annotations/gpu-admission.io~1x"}]
    assert said in again.warnings


def test_a_pod_the_steering_would_take_past_what_etcd_keeps_is_refused_by_the_mutating_webhook() -> None:
    """A term of 3,000 host names (153 kB) copied into each term the spot require made took the pod past the
    1.5 MiB etcd keeps of an object, refused by the apiserver in words that do not name the webhook (found by a
    review): the values are bounded as terms and expressions are, and the advice is to select by a label."""
    nodes = [
        gpu_node("spot", labels={"eks.amazonaws.com/capacityType": "SPOT", "karpenter.sh/capacity-type": "spot"}),
        gpu_node("on-demand", labels={"eks.amazonaws.com/capacityType": "ON_DEMAND"}),
    ]
    settings = Settings()
    ctx = Context(settings=settings, cluster=build_view(nodes, settings), namespace="ml")
    hosts = [
        f"ip-10-0-{i // 250}-{i % 250}.ec2.internal"
        for i in range(pipeline.MAX_PLACEMENT["node affinity values"] // 2 + 1)
    ]
    pod = gpu_pod(image="nvidia/cuda:12.4.1-base-ubuntu22.04", annotations={"gpu-admission.io/spot": "require"})
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": hosts}]}
    pod["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    }
    mutated = pipeline.mutate(copy.deepcopy(pod), ctx)
    assert not mutated.allowed and mutated.reason == "TooManyNodeRules"
    assert mutated.message.startswith(
        f"with what gpu-admission adds (spot-affinity) the pod would have {2 * len(hosts) + 2} node affinity values;"
    ), mutated.message
    assert mutated.message.endswith(
        "select the nodes by a label they share rather than listing them (the steering"
        " copies a term's list into each term it writes)"
    )
    term["matchExpressions"][0]["values"] = hosts[: len(hosts) - 2]  # each term: the hosts and the spot place's value
    assert pipeline.mutate(copy.deepcopy(pod), ctx).allowed


def test_a_workload_update_that_keeps_its_template_warns_of_a_misplaced_annotation_once() -> None:
    """An UPDATE that annotates the Deployment itself (kubectl annotate deployment) and carries its template's words
    as a fresh review writes them, the stored ones being stale (the apiserver calling again): the template's review
    ran again, warned of the annotation, and the kept template's answer warned of it once more."""
    from tests.conftest import review
    from webhook.app import create_app
    from webhook.cluster import StaticCluster

    settings = Settings()
    view = build_view([gpu_node("h100-a")], settings)
    template = {"metadata": {"labels": {"app": "web"}}, "spec": gpu_pod()["spec"]}
    spec = {"replicas": 1, "selector": {"matchLabels": {"app": "web"}}, "template": template}
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "ml"}}
    reviewed = pipeline.review({**deployment, "spec": spec}, Context(settings=settings, cluster=view, namespace="ml"))
    old = copy.deepcopy(reviewed.object)
    words = old["spec"]["template"]["metadata"]["annotations"]
    words["gpu-admission.io/cuda"] += " (stale)"
    new = copy.deepcopy(reviewed.object)
    new["metadata"]["annotations"] = {"gpu-admission.io/cuda-version": "12.2"}
    body = review(new, operation="UPDATE", namespace="ml", oldObject=old, name="web")
    answer = create_app(settings, cluster=StaticCluster(view)).test_client().post("/mutate", json=body).get_json()
    assert answer["response"]["allowed"] is True
    assert answer["response"]["warnings"] == [
        "gpu-admission.io/cuda-version is on the Deployment, not its pod template, so its pods never see it: move it"
        " there"
    ]

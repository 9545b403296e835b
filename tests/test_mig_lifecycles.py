"""A converted workload's later updates, as each client sends them: found by a generative review of MIG template
lifecycles on clusters of several GPU models (30,000 seeded lifecycles: Helm 3's three-way merge, client-side
kubectl apply, kubectl replace, and edits of the live object)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any, cast

import pytest

from tests.mig_fixtures import (
    container,
    context,
    gke_node,
    mig_annotation,
    mixed_node,
    pod,
    single_node,
    template_of,
    whole_node,
    workload,
)
from webhook import pipeline
from webhook.model import Context

GPU = "nvidia.com/gpu"
A40 = "NVIDIA-A100-SXM4-40GB"
A80 = "NVIDIA-A100-SXM4-80GB"
PARTITION = "cloud.google.com/gke-gpu-partition-size"
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def deployment(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    obj = workload("Deployment", pod(*containers, **spec))
    obj["metadata"].pop("annotations", None)
    template_of(obj)["metadata"].pop("annotations", None)
    return obj


def created(ctx: Context, manifest: dict[str, Any], by_kubectl: bool = False) -> dict[str, Any]:
    obj = copy.deepcopy(manifest)
    if by_kubectl:
        obj["metadata"].setdefault("annotations", {})[LAST_APPLIED] = json.dumps(manifest)
    result = pipeline.mutate(obj, ctx)
    assert result.allowed, result.message
    return cast(dict[str, Any], result.object)


def kubectl_applied(live: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """What client-side `kubectl apply` sends for the first container's limits: its three-way merge deletes what
    the last manifest had and this one has not, sets what this one has, keeps what only the live object has; the
    manifest becomes the last-applied-configuration."""
    before = json.loads(live["metadata"]["annotations"][LAST_APPLIED])
    sent = copy.deepcopy(live)
    limits = template_of(sent)["spec"]["containers"][0]["resources"]["limits"]
    new = template_of(manifest)["spec"]["containers"][0]["resources"].get("limits", {})
    for key in template_of(before)["spec"]["containers"][0]["resources"].get("limits", {}):
        if key not in new:
            limits.pop(key, None)
    limits.update(new)
    sent["metadata"]["annotations"][LAST_APPLIED] = json.dumps(manifest)
    return sent


def updated(ctx: Context, sent: dict[str, Any], live: dict[str, Any]) -> pipeline.Result:
    """The update reviewed as the apiserver sends it; checked to be admitted, let through by the validating
    webhook, and left as it is by a second pass."""
    update = replace(ctx, operation="UPDATE", old_object=live)
    result = pipeline.mutate(copy.deepcopy(sent), update)
    assert result.allowed, result.message
    assert pipeline.validate(result.object, update).allowed
    # the apiserver calling again in the same update (reinvocation): an update whose template is as stored is not
    # reviewed at all, so old_object stays the live object here
    assert pipeline.mutate(copy.deepcopy(result.object), update).patch == [], "a second pass changes nothing"
    return result


def spec_of(result: pipeline.Result) -> dict[str, Any]:
    return cast(dict[str, Any], template_of(result.object)["spec"])


def limits_of(result: pipeline.Result, index: int = 0) -> dict[str, Any]:
    return cast(dict[str, Any], spec_of(result)["containers"][index]["resources"]["limits"])


def line_of(obj: dict[str, Any]) -> str:
    line = mig_annotation(obj)
    assert line is not None
    return line


@pytest.mark.parametrize("name", ["trainer", "trainer\n\u202ex"], ids=["dns-label", "escaped-in-its-line"])
def test_kubectl_apply_that_drops_a_fraction_takes_the_device_out_though_the_template_is_as_stored(name: str) -> None:
    """The live template never had the fraction (the device stood in its place), so kubectl's merge, which deletes
    it, sends the template as stored: the update was taken for one that leaves the template alone (replicas,
    strategy) and not reviewed, and the device stayed, also through the next apply of a new image. A name that its
    line writes escaped is found in the manifest too."""
    ctx = context([mixed_node("m", A80, {"3g.40gb": 2}, "a100", 81920)])
    live = created(ctx, deployment(container(name, limits={"cpu": "1", GPU: "0.5"})), by_kubectl=True)
    result = updated(ctx, kubectl_applied(live, deployment(container(name, limits={"cpu": "1"}))), live)
    assert not result.skipped
    assert limits_of(result) == {"cpu": "1"}
    assert "gpu-admission.io/mig" not in template_of(result.object)["metadata"].get("annotations", {})


def test_kubectl_apply_that_makes_a_gke_fraction_a_whole_gpu_takes_the_partition_pin_out() -> None:
    """0.25 converted on GKE is nvidia.com/gpu 1 on a 1g.20gb partition; the manifest's whole 1 sent the template
    as stored, and a whole-GPU ask stayed on MIG slices."""
    ctx = context([gke_node("g", "nvidia-a100-80gb", "1g.20gb", 4, "gke-mig"), whole_node("w", A80, 8, "whole")])
    live = created(ctx, deployment(container(limits={"cpu": "1", GPU: "0.25"})), by_kubectl=True)
    assert spec_of_obj(live)["nodeSelector"] == {PARTITION: "1g.20gb"}
    result = updated(ctx, kubectl_applied(live, deployment(container(limits={"cpu": "1", GPU: "1"}))), live)
    assert limits_of(result) == {"cpu": "1", GPU: "1"}
    assert "nodeSelector" not in spec_of(result)


def test_kubectl_apply_that_changes_only_the_replicas_still_keeps_the_review() -> None:
    """The other side: a manifest whose template is unchanged leaves the template's review as stored."""
    ctx = context([mixed_node("m", A80, {"3g.40gb": 2}, "a100", 81920)])
    manifest = deployment(container(limits={"cpu": "1", GPU: "0.5"}))
    live = created(ctx, manifest, by_kubectl=True)
    scaled = copy.deepcopy(manifest)
    scaled["spec"]["replicas"] = 7
    sent = copy.deepcopy(live)
    sent["spec"]["replicas"] = 7
    sent["metadata"]["annotations"][LAST_APPLIED] = json.dumps(scaled)
    result = pipeline.mutate(sent, replace(ctx, operation="UPDATE", old_object=live))
    assert result.skipped and result.patch == []


def spec_of_obj(obj: dict[str, Any]) -> dict[str, Any]:
    return cast(dict[str, Any], template_of(obj)["spec"])


def test_a_helm_upgrade_that_drops_a_single_strategy_fraction_takes_the_mig_product_pin_out() -> None:
    """Helm's merge deletes the limit its last manifest had (the webhook's 1 stood there) and leaves the
    nodeSelector on the MIG product, which no line named any more: a CPU-only template stayed pinned to MIG nodes,
    and a later whole 2 GPUs was sent to MIG slices."""
    ctx = context([single_node("s", A80, "3g.40gb", 2, "a100-mig", 81920), whole_node("w", A80, 8, "whole")])
    live = created(ctx, deployment(container(limits={"cpu": "1", GPU: "0.5"})))
    assert spec_of_obj(live)["nodeSelector"] == {"nvidia.com/gpu.product": f"{A80}-MIG-3g.40gb"}
    sent = copy.deepcopy(live)
    del template_of(sent)["spec"]["containers"][0]["resources"]["limits"][GPU]
    result = updated(ctx, sent, live)
    assert limits_of(result) == {"cpu": "1"}
    assert "nodeSelector" not in spec_of(result)


def _two_fractions(ctx: Context) -> dict[str, Any]:
    manifest = deployment(
        container(limits={"cpu": "1", GPU: "0.25"}), container("sidecar", limits={"cpu": "1", GPU: "0.25"})
    )
    return created(ctx, manifest)


def _a100s() -> Context:
    """1g.10gb is 1/4 of the 40 GB A100s and 1/8 of the 80 GB ones: a 0.25 there is pinned to the 40 GB A100s."""
    return context(
        [
            mixed_node("a40", A40, {"1g.10gb": 4}, "a100-40", 40960),
            mixed_node("a80", A80, {"1g.10gb": 7, "1g.20gb": 4, "3g.40gb": 2}, "a100-80", 81920),
        ]
    )


@pytest.mark.parametrize("changed", [0, 1], ids=["trainer-whose-line-names-the-pin", "sidecar"])
def test_a_fraction_changed_beside_a_pinned_conversion_converts_both_afresh(changed: int) -> None:
    """The trainer's and the sidecar's 0.25 each took 1g.10gb, under the trainer's pin to the 40 GB A100s; one of
    them replaced by 0.5 by hand. The trainer's: the pin went with its conversion, and the sidecar's 1g.10gb could
    land on an 80 GB A100, with 1/8 where it asked 1/4. The sidecar's: refused under the trainer's pin, which the
    same template new does without. Both are converted afresh now, on the 80 GB A100s."""
    ctx = _a100s()
    live = _two_fractions(ctx)
    assert spec_of_obj(live)["nodeSelector"] == {"nvidia.com/gpu.product": A40}
    sent = copy.deepcopy(live)
    template_of(sent)["spec"]["containers"][changed]["resources"] = {"limits": {"cpu": "1", GPU: "0.5"}}
    result = updated(ctx, sent, live)
    assert limits_of(result, changed) == {"cpu": "1", "nvidia.com/mig-3g.40gb": "1"}
    assert limits_of(result, 1 - changed) == {"cpu": "1", "nvidia.com/mig-1g.20gb": "1"}
    assert "nodeSelector" not in spec_of(result)
    asked = [line.split(" -> ")[0] for line in line_of(result.object).split("; ")]
    assert asked[1 - changed].endswith(": nvidia.com/gpu 0.25"), "the ask put back as its line said"


def test_a_gke_partition_two_conversions_share_is_not_taken_from_the_one_left() -> None:
    """Both 0.25 took one GPU of a 1g.20gb partition; the sidecar's replaced by 0.5 by hand: the partition pin
    went with it, and the trainer's GPU, converted, became a whole GPU. Now the trainer is converted afresh too."""
    ctx = context(
        [
            gke_node("g1", "nvidia-a100-80gb", "1g.20gb", 4, "p1"),
            gke_node("g3", "nvidia-a100-80gb", "3g.40gb", 2, "p3"),
        ]
    )
    live = _two_fractions(ctx)
    assert spec_of_obj(live)["nodeSelector"] == {PARTITION: "1g.20gb"}
    sent = copy.deepcopy(live)
    template_of(sent)["spec"]["containers"][1]["resources"] = {"limits": {"cpu": "1", GPU: "0.5"}}
    result = updated(ctx, sent, live)
    assert spec_of(result)["nodeSelector"] == {PARTITION: "3g.40gb"}
    assert limits_of(result, 0) == limits_of(result, 1) == {"cpu": "1", GPU: "1"}
    lines = line_of(result.object).split("; ")
    assert [line.split(" -> ")[0] for line in lines] == ["trainer: nvidia.com/gpu 0.25", "sidecar: nvidia.com/gpu 0.5"]


def test_a_conversion_line_outlives_a_change_of_where_the_pod_lands() -> None:
    """Helm 3 cannot take out a device whose fraction its manifest dropped (known); when a pool was added at that
    upgrade, the line became 'as found on the object', losing what was asked, and the fraction brought back by the
    next upgrade was refused as a second device. The line is reworded with where the pod lands now."""
    first = [mixed_node("a", A80, {"3g.40gb": 2, "1g.20gb": 4}, "a100-a", 81920)]
    ctx = context(first)
    live = created(ctx, deployment(container(limits={"cpu": "1", GPU: "0.5"})))
    ctx = context([*first, mixed_node("b", A80, {"3g.40gb": 2, "1g.20gb": 4}, "a100-b", 81920)])
    sent = copy.deepcopy(live)
    template_of(sent)["spec"]["containers"][0]["image"] = "img:2"
    result = updated(ctx, sent, live)
    assert line_of(result.object) == (
        f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.40gb ({A80}, pools a100-a, a100-b)"
    )
    live = result.object
    sent = copy.deepcopy(live)
    template_of(sent)["spec"]["containers"][0]["resources"]["limits"][GPU] = "0.25"
    result = updated(ctx, sent, live)
    assert limits_of(result) == {"cpu": "1", "nvidia.com/mig-1g.20gb": "1"}


def test_the_pods_own_partition_selector_is_not_taken_for_the_conversions() -> None:
    """A template selecting a GKE partition size itself (3g.40gb) with 0.5: the line named that selector as what
    the conversion wrote, and Helm's 0.5 made 0.25 replaced it by 1g.20gb; a whole 2 dropped it. The line says it
    is the pod's own, and it stays."""
    ctx = context(
        [
            gke_node("g3", "nvidia-a100-80gb", "3g.40gb", 2, "p3"),
            gke_node("g1", "nvidia-a100-80gb", "1g.20gb", 4, "p1"),
        ]
    )
    live = created(ctx, deployment(container(limits={"cpu": "1", GPU: "0.5"}), nodeSelector={PARTITION: "3g.40gb"}))
    assert "the pod's own nodeSelector" in line_of(live)
    sent = copy.deepcopy(live)
    template_of(sent)["spec"]["containers"][0]["resources"]["limits"][GPU] = "0.25"
    result = updated(ctx, sent, live)
    assert spec_of(result)["nodeSelector"] == {PARTITION: "3g.40gb"}
    assert limits_of(result) == {"cpu": "1", GPU: "1"}


def test_a_helm_upgrade_to_a_mig_device_of_its_own_takes_the_conversions_out() -> None:
    """0.5 converted to 3g.40gb, then the manifest asks nvidia.com/mig-1g.20gb itself: Helm's merge left the
    conversion's device beside it, the validating webhook refused two devices, and every later upgrade too. The
    webhook writes no second MIG device, so the other one is the user's, and the conversion's goes."""
    ctx = context([mixed_node("m", A80, {"3g.40gb": 2, "1g.20gb": 4}, "a100", 81920)])
    live = created(ctx, deployment(container(limits={"cpu": "1", GPU: "0.5"})))
    sent = copy.deepcopy(live)
    limits = template_of(sent)["spec"]["containers"][0]["resources"]["limits"]
    limits["nvidia.com/mig-1g.20gb"] = "1"
    result = updated(ctx, sent, live)
    assert limits_of(result) == {"cpu": "1", "nvidia.com/mig-1g.20gb": "1"}
    assert result.warnings == ["trainer: took out the earlier conversion's nvidia.com/mig-3g.40gb"]


def test_a_containers_first_fraction_beside_a_conversion_that_pinned_the_template_converts_both_afresh() -> None:
    """A sidecar that asked no GPU now asks 0.5 beside the trainer's 0.25, pinned to the 40 GB A100s: refused
    under that pin, though the same template new is admitted (both on the 80 GB A100s)."""
    ctx = _a100s()
    live = created(ctx, deployment(container(limits={"cpu": "1", GPU: "0.25"}), container("sidecar")))
    assert spec_of_obj(live)["nodeSelector"] == {"nvidia.com/gpu.product": A40}
    sent = copy.deepcopy(live)
    template_of(sent)["spec"]["containers"][1]["resources"] = {"limits": {GPU: "0.5"}}
    result = updated(ctx, sent, live)
    assert limits_of(result, 0) == {"cpu": "1", "nvidia.com/mig-1g.20gb": "1"}
    assert limits_of(result, 1) == {"nvidia.com/mig-3g.40gb": "1"}
    assert "nodeSelector" not in spec_of(result)


def test_a_memory_size_in_a_template_does_not_convert_its_other_fractions_afresh_at_every_update() -> None:
    """A template's memory size waits for its pods, so its container never has a line: it was taken for a
    container's first fraction at every update, and the trainer's conversion was made afresh (an image changed,
    a pool added: its GPU moved to the new pool's 3g.20gb)."""
    first = [single_node("s", A80, "4g.40gb", 2, "p0", 81920)]
    manifest = deployment(
        container(limits={"cpu": "1", GPU: "0.5"}),
        container("sidecar", limits={"cpu": "1", "gpu-admission.io/gpu-memory": "10Gi"}),
    )
    live = created(context(first), manifest)
    ctx = context([*first, mixed_node("m", A40, {"3g.20gb": 2}, "p1", 40960)])
    sent = copy.deepcopy(live)
    template_of(sent)["spec"]["containers"][0]["image"] = "ghcr.io/example/train:2"
    result = updated(ctx, sent, live)
    assert limits_of(result) == {"cpu": "1", GPU: "1"}
    assert spec_of(result)["nodeSelector"] == {"nvidia.com/gpu.product": f"{A80}-MIG-4g.40gb"}


def test_a_forged_pin_the_object_confirms_is_not_kept_to_take_its_selector_out_later() -> None:
    """A line forged into a new template, naming its own nodeSelector (team=ml, set by its author or another
    admission controller) as the conversion's pin, was confirmed by the object and kept: stored so, the next
    change of the ask took team=ml out. A pin is read only on a key the webhook pins by."""
    nodes = [
        mixed_node("a80", A80, {"3g.40gb": 2, "1g.20gb": 4}, "a100-80", 81920, extra_labels={"team": "ml"}),
        mixed_node("b80", A80, {"3g.40gb": 2, "1g.20gb": 4}, "b100-80", 81920),
    ]
    ctx = context(nodes)
    obj = deployment(container(limits={"nvidia.com/mig-3g.40gb": "1"}), nodeSelector={"team": "ml"})
    forged = f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.40gb (pinned to team=ml, {A80}, pool a100-80)"
    template_of(obj)["metadata"]["annotations"] = {"gpu-admission.io/mig": forged}
    live = created(ctx, obj)
    assert line_of(live) != forged
    sent = copy.deepcopy(live)
    template_of(sent)["spec"]["containers"][0]["resources"]["limits"] = {GPU: "0.25"}
    result = pipeline.mutate(sent, replace(ctx, operation="UPDATE", old_object=live))
    assert spec_of(result)["nodeSelector"] == {"team": "ml"}


def test_a_mig_resource_at_zero_is_not_taken_for_a_device_of_the_users_own() -> None:
    """A chart writing a MIG resource at 0 (templated off) beside its fraction: at the next upgrade (an image
    changed) the conversion's device was taken out as if the user's own device stood beside it, and the container
    was left with no GPU."""
    ctx = context([mixed_node("m", A80, {"3g.40gb": 2, "1g.10gb": 7}, "a100", 81920)])
    live = created(ctx, deployment(container(limits={"cpu": "1", GPU: "0.5", "nvidia.com/mig-1g.10gb": "0"})))
    sent = copy.deepcopy(live)
    template_of(sent)["spec"]["containers"][0]["image"] = "img:2"
    result = updated(ctx, sent, live)
    assert limits_of(result) == {"cpu": "1", "nvidia.com/mig-1g.10gb": "0", "nvidia.com/mig-3g.40gb": "1"}


def test_kubectl_apply_that_changes_only_a_defaulted_field_of_the_manifest_keeps_the_review() -> None:
    """A manifest that writes out a field the live template already holds (imagePullPolicy, the apiserver's
    default) sends the template as stored: reviewed because the manifest's template changed, the template's
    annotations were rewritten with what the cluster says now (a pool added), and every pod rolled."""
    ctx = context([mixed_node("m", A80, {"3g.40gb": 2}, "a100", 81920)])
    manifest = deployment(container(limits={"cpu": "1", GPU: "0.5"}))
    live = created(ctx, manifest, by_kubectl=True)
    template_of(live)["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    written = copy.deepcopy(manifest)
    template_of(written)["spec"]["containers"][0]["imagePullPolicy"] = "IfNotPresent"
    sent = copy.deepcopy(live)
    sent["metadata"]["annotations"][LAST_APPLIED] = json.dumps(written)
    later = context([mixed_node("m", A80, {"3g.40gb": 2}, "a100", 81920), mixed_node("n", A80, {}, "new", 81920)])
    result = pipeline.mutate(sent, replace(later, operation="UPDATE", old_object=live))
    assert result.skipped and result.patch == []


def test_the_warning_names_only_what_the_update_took_out() -> None:
    """kubectl apply drops a GKE fraction whose partition size the template selects itself: the webhook's GPU goes,
    the selector stays, and the warning said both were taken out."""
    ctx = context(
        [
            gke_node("g3", "nvidia-a100-80gb", "3g.40gb", 2, "p3"),
            gke_node("g1", "nvidia-a100-80gb", "1g.20gb", 4, "p1"),
        ]
    )
    manifest = deployment(container(limits={"cpu": "1", GPU: "0.5"}), nodeSelector={PARTITION: "3g.40gb"})
    live = created(ctx, manifest, by_kubectl=True)
    dropped = deployment(container(limits={"cpu": "1"}), nodeSelector={PARTITION: "3g.40gb"})
    sent = copy.deepcopy(live)  # the webhook's 1 left in the live object (by an edit after the last apply)
    sent["metadata"]["annotations"][LAST_APPLIED] = json.dumps(dropped)
    result = updated(ctx, sent, live)
    assert limits_of(result) == {"cpu": "1"}
    assert spec_of(result)["nodeSelector"] == {PARTITION: "3g.40gb"}
    assert result.warnings == ["trainer: took out the earlier conversion's nvidia.com/gpu 1"]


def test_no_warning_names_what_a_conversion_made_afresh_wrote_again() -> None:
    """The trainer's and the sidecar's fractions share a GKE partition pin; the trainer's dropped: its pin went,
    the sidecar was converted afresh onto the same partition, and the warning said the partition was taken out
    while the template still selected it."""
    ctx = context([gke_node("g3", "nvidia-a100-80gb", "3g.40gb", 2, "gke3")])
    live = created(
        ctx,
        deployment(container(limits={"cpu": "1", GPU: "0.5"}), container("sidecar", limits={"cpu": "1", GPU: "0.25"})),
    )
    sent = copy.deepcopy(live)
    template_of(sent)["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    result = updated(ctx, sent, live)
    assert spec_of(result)["nodeSelector"] == {PARTITION: "3g.40gb"}
    assert result.warnings == []


TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def _tainted_cluster() -> Context:
    node = mixed_node("n", A80, {"3g.40gb": 2, "1g.10gb": 2}, "a100", 81920)
    node["spec"]["taints"] = [TAINT]
    return context([node])


def test_a_dropped_fraction_takes_the_gpu_toleration_its_conversion_wrote_with_it() -> None:
    """The conversion tolerates the MIG nodes' GPU taint (ExtendedResourceToleration sees no nvidia.com/gpu ask
    any more) and its line says so; when kubectl apply drops the fraction, a CPU-only Deployment kept the
    toleration, and its pods could take the GPU nodes."""
    ctx = _tainted_cluster()
    live = created(ctx, deployment(container(limits={GPU: "0.5"})), by_kubectl=True)
    assert template_of(live)["spec"]["tolerations"] == [GPU_TOLERATION]
    assert "the GPU taint tolerated" in (mig_annotation(live) or "")
    result = updated(ctx, kubectl_applied(live, deployment(container(limits={"cpu": "1"}))), live)
    assert "tolerations" not in template_of(result.object)["spec"]
    assert result.warnings == [
        "trainer: took out the earlier conversion's nvidia.com/mig-3g.40gb and its toleration of the GPU taint"
    ]


def test_the_gpu_toleration_stays_while_a_container_still_asks_a_gpu_or_the_manifest_writes_it() -> None:
    ctx = _tainted_cluster()
    two = deployment(container(limits={GPU: "0.5"}), container("sidecar", limits={GPU: "0.1"}))
    live = created(ctx, two, by_kubectl=True)
    one = deployment(container(limits={"cpu": "1"}), container("sidecar", limits={GPU: "0.1"}))
    result = updated(ctx, kubectl_applied(live, one), live)
    assert template_of(result.object)["spec"]["tolerations"] == [GPU_TOLERATION]  # the sidecar's device needs it
    own = deployment(container(limits={GPU: "0.5"}), tolerations=[GPU_TOLERATION])
    live = created(ctx, own, by_kubectl=True)
    assert "the GPU taint tolerated" not in (mig_annotation(live) or "")  # the manifest's own
    cpu = deployment(container(limits={"cpu": "1"}), tolerations=[GPU_TOLERATION])
    result = updated(ctx, kubectl_applied(live, cpu), live)
    assert template_of(result.object)["spec"]["tolerations"] == [GPU_TOLERATION]

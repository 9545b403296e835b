"""The spot policy through the pipeline: per provider and mode, existing tolerations, affinity, defaults, narrowing,
idempotency, review and validate."""

from __future__ import annotations

import copy
import dataclasses
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonpatch
import pytest

from tests.mig_fixtures import through_app
from webhook import pipeline
from webhook.cluster import build_view
from webhook.config import ClusterSettings, CudaSettings, MigSettings, PoolSettings, Settings, SpotSettings, TaintSpec
from webhook.model import Context
from webhook.policies import spot

ANNOTATION = "gpu-admission.io/spot"
APPLIED = "gpu-admission.io/spot-applied"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"

GKE_SPOT = "cloud.google.com/gke-spot"
GKE_PREEMPTIBLE = "cloud.google.com/gke-preemptible"
AKS_SCALESET = "kubernetes.azure.com/scalesetpriority"
AKS_PRIORITY = "kubernetes.azure.com/priority"
OKE = "oci.oraclecloud.com/oke-is-preemptible"
EKS = "eks.amazonaws.com/capacityType"
KARPENTER = "karpenter.sh/capacity-type"
NODE_GROUP = "eks.amazonaws.com/nodegroup"
USER_KEY = "example.com/spot"


# ---------------------------------------------------------------------------------------------------------------
# Builders


def taint(text: str) -> dict[str, str]:
    """'key=value:Effect' or 'key:Effect' -> a Node taint."""
    head, _, effect = text.rpartition(":")
    key, _, value = head.partition("=")
    out = {"key": key, "effect": effect}
    if value:
        out["value"] = value
    return out


def node(name: str, labels: dict[str, str] | None = None, taints: tuple[str, ...] = (), gpus: int = 1) -> Any:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-L4", **(labels or {})}},
        "spec": {"taints": [taint(t) for t in taints]},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}},
    }


def equal(key: str, value: str, effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": key, "operator": "Equal", "value": value, "effect": effect}


def exists(key: str, effect: str = "NoSchedule") -> dict[str, str]:
    return {"key": key, "operator": "Exists", "effect": effect}


def expr(key: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": "In", "values": list(values)}


def pod(
    mode: str | None = None,
    *,
    annotations: dict[str, Any] | None = None,
    tolerations: Any = None,
    affinity: Any = None,
    owner: str | None = None,
    gpu: str | None = "1",
    namespace: str = "ml",
) -> Any:
    meta: dict[str, Any] = {"name": "trainer", "namespace": namespace}
    notes = dict(annotations or {})
    if mode is not None:
        notes[ANNOTATION] = mode
    if notes:
        meta["annotations"] = notes
    if owner:
        version = {"Job": "batch/v1", "ReplicaSet": "apps/v1", "StatefulSet": "apps/v1"}.get(owner, "example.com/v1")
        meta["ownerReferences"] = [{"apiVersion": version, "kind": owner, "name": "x", "uid": "u", "controller": True}]
    container: dict[str, Any] = {"name": "main", "image": "pytorch/pytorch-nightly:2400000-cu12.4"}
    if gpu is not None:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpu}}
    spec: dict[str, Any] = {"containers": [container]}
    if tolerations is not None:
        spec["tolerations"] = tolerations
    if affinity is not None:
        spec["affinity"] = affinity
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def workload(kind: str, mode: str | None = None) -> Any:
    template = pod(mode)
    template.pop("apiVersion")
    template.pop("kind")
    template["metadata"].pop("namespace")
    if kind == "CronJob":
        spec: dict[str, Any] = {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}}
    else:
        spec = {"template": template}
    api = {"Deployment": "apps/v1", "Job": "batch/v1", "CronJob": "batch/v1"}[kind]
    return {"apiVersion": api, "kind": kind, "metadata": {"name": "w", "namespace": "ml"}, "spec": spec}


def volcano_pod(kind: str = "Job", version: str = "batch.volcano.sh/v1alpha1") -> Any:
    """A pod of another controller whose kind is named as a built-in one's may be."""
    obj = pod()
    owner = {"apiVersion": version, "kind": kind, "name": "tf", "uid": "u", "controller": True}
    obj["metadata"]["ownerReferences"] = [owner]
    return obj


def _with_hash(obj: Any) -> Any:
    """A Deployment's ReplicaSet's pod: the label its ReplicaSet gives it."""
    obj["metadata"].setdefault("labels", {})["pod-template-hash"] = "5d8f9c7b6"
    return obj


def context(
    nodes: list[Any] | None = None,
    namespace: str = "ml",
    providers: tuple[str, ...] = ("all",),
    pools: tuple[PoolSettings, ...] = (),
    **spot_settings: Any,
) -> Context:
    settings = Settings(
        spot=SpotSettings(**spot_settings),
        cluster=ClusterSettings(providers=list(providers), pools=list(pools)),
        # These tests look at spot alone; the pipeline with every policy is tested in test_e2e_policies.py.
        cuda=CudaSettings(mode="off"),
        mig=MigSettings(enabled=False),
    )
    return Context(settings=settings, cluster=build_view(nodes or [], settings), namespace=namespace)


def mutate(obj: Any, ctx: Context) -> pipeline.Result:
    """Mutate, check the patch turns the input into the output, and that a second pass changes nothing."""
    before = copy.deepcopy(obj)
    result = pipeline.mutate(obj, ctx)
    assert obj == before, "the pipeline must not change its input"
    assert jsonpatch.apply_patch(obj, result.patch) == result.object
    again = pipeline.mutate(result.object, ctx)
    assert again.patch == [], f"second pass must be a no-op, got {again.patch}"
    assert again.outcome.annotations == result.outcome.annotations
    for warning in result.warnings:
        assert len(warning) < 120, warning
    return result


def tolerations_of(obj: Any) -> Any:
    return obj["spec"].get("tolerations", [])


def preferred_of(obj: Any) -> Any:
    return (
        obj["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("preferredDuringSchedulingIgnoredDuringExecution", [])
    )


def required_of(obj: Any) -> list[Any] | None:
    node_affinity = obj["spec"].get("affinity", {}).get("nodeAffinity", {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    return None if required is None else required["nodeSelectorTerms"]


def applied(result: pipeline.Result) -> str | None:
    """The spot-applied annotation on the pod (or the workload's pod template)."""
    view = pipeline.pod_view(result.object, "")
    assert view is not None
    value = view.annotations.get(APPLIED)
    return value if isinstance(value, str) else None


# ---------------------------------------------------------------------------------------------------------------
# Per provider preset and mode

ON_DEMAND = node("on-demand")

PROVIDERS: dict[str, tuple[list[Any], dict[str, Any], list[Any], list[Any]]] = {
    # name: (spot nodes, extra settings, expected tolerations, expected label expressions)
    "gke": (
        [
            node(
                "gke-spot",
                {GKE_SPOT: "true", "cloud.google.com/gke-nodepool": "spot-l4"},
                (f"{GKE_SPOT}=true:NoSchedule",),
            )
        ],
        {},
        [equal(GKE_SPOT, "true")],
        [expr(GKE_SPOT, "true")],
    ),
    "gke-preemptible": (
        [node("gke-old", {GKE_PREEMPTIBLE: "true"}, (f"{GKE_PREEMPTIBLE}=true:NoSchedule",))],
        {},
        [equal(GKE_PREEMPTIBLE, "true")],
        [expr(GKE_PREEMPTIBLE, "true")],
    ),
    "aks": (
        [node("aks-spot", {AKS_PRIORITY: "spot", AKS_SCALESET: "spot"}, (f"{AKS_SCALESET}=spot:NoSchedule",))],
        {},
        [equal(AKS_SCALESET, "spot")],
        [expr(AKS_PRIORITY, "spot"), expr(AKS_SCALESET, "spot")],
    ),
    "oke": (
        # the taint's value is not documented: tolerated with Exists whatever it is
        [node("oke-pre", {OKE: "true"}, (f"{OKE}=true:NoSchedule",))],
        {},
        [exists(OKE)],
        [expr(OKE, "true")],
    ),
    "eks": ([node("eks-spot", {EKS: "SPOT"})], {}, [], [expr(EKS, "SPOT"), expr(KARPENTER, "spot")]),
    "karpenter": ([node("kp-spot", {KARPENTER: "spot"})], {}, [], [expr(KARPENTER, "spot")]),
    "user-defined": (
        [node("k3s-spot", {USER_KEY: "yes"}, (f"{USER_KEY}=yes:NoExecute",))],
        {"extra_taints": [TaintSpec(USER_KEY, "yes", "NoExecute")], "extra_labels": {USER_KEY: "yes"}},
        [equal(USER_KEY, "yes", "NoExecute")],
        [expr(USER_KEY, "yes")],
    ),
}


def expected_affinity(mode: str, labels: list[Any]) -> tuple[list[Any], list[Any] | None]:
    if mode == "prefer":
        return [{"weight": 100, "preference": {"matchExpressions": [e]}} for e in labels], None
    if mode == "require":
        return [], [{"matchExpressions": [e]} for e in labels]
    return [], None


@pytest.mark.parametrize("mode", ["tolerate", "true", "prefer", "require", "Require "])
@pytest.mark.parametrize("provider", list(PROVIDERS))
def test_provider_and_mode(provider: str, mode: str) -> None:
    spot_nodes, extra, want_tolerations, labels = PROVIDERS[provider]
    ctx = context([ON_DEMAND, *spot_nodes], **extra)
    result = mutate(pod(mode), ctx)
    assert tolerations_of(result.object) == want_tolerations
    normal = {"true": "tolerate", "Require ": "require"}.get(mode, mode)
    want_preferred, want_required = expected_affinity(normal, labels)
    assert preferred_of(result.object) == want_preferred
    assert required_of(result.object) == want_required
    text = applied(result)
    assert text is not None and text.startswith(f"{normal} (asked by annotation)")
    assert ("spot-toleration" in result.outcome.mutations) == bool(want_tolerations)
    assert ("spot-affinity" in result.outcome.mutations) == (normal != "tolerate")
    assert result.warnings == []


@pytest.mark.parametrize(
    "value",
    [pytest.param("never", id="never"), pytest.param("false", id="false"), pytest.param(None, id="not-asked")],
)
def test_no_spot_changes_nothing(value: str | None) -> None:
    spot_nodes = PROVIDERS["aks"][0]
    obj = pod(value, tolerations=[{"key": "x", "operator": "Exists"}])
    result = mutate(obj, context(spot_nodes))
    assert result.patch == []
    assert result.outcome.annotations == {}
    assert result.outcome.mutations == []


# ---------------------------------------------------------------------------------------------------------------
# Existing tolerations of every shape (AKS cluster: wants scalesetpriority=spot:NoSchedule)

AKS_WANT = equal(AKS_SCALESET, "spot")


@pytest.mark.parametrize(
    ("existing", "added"),
    [
        pytest.param([], True, id="none"),
        pytest.param([{"key": AKS_SCALESET, "operator": "Exists"}], False, id="same-key-exists-any-effect"),
        pytest.param([exists(AKS_SCALESET)], False, id="same-key-exists-same-effect"),
        pytest.param([exists(AKS_SCALESET, "NoExecute")], True, id="same-key-exists-other-effect"),
        pytest.param([{"operator": "Exists"}], False, id="empty-key-exists"),
        pytest.param([{"key": "", "operator": "Exists", "effect": "NoSchedule"}], False, id="empty-key-exists-effect"),
        pytest.param([{"operator": "Exists", "effect": "NoExecute"}], True, id="empty-key-exists-other-effect"),
        pytest.param([{"key": AKS_SCALESET, "operator": "Equal", "value": "spot"}], False, id="equal-empty-effect"),
        pytest.param([{"key": AKS_SCALESET, "value": "spot", "effect": "NoSchedule"}], False, id="operator-omitted"),
        pytest.param([dict(AKS_WANT)], False, id="exact-duplicate"),
        pytest.param([equal(AKS_SCALESET, "regular")], True, id="different-value"),
        pytest.param([equal("other", "spot")], True, id="different-key"),
        pytest.param([{"key": AKS_SCALESET, "operator": "Bogus"}], True, id="unknown-operator"),
        pytest.param(["garbage", None, 3], True, id="garbage-entries"),
        pytest.param(
            [{**exists(AKS_SCALESET, "NoSchedule"), "tolerationSeconds": 30}], False, id="exists-with-seconds"
        ),
    ],
)
def test_existing_tolerations(existing: list[Any], added: bool) -> None:
    result = mutate(pod("tolerate", tolerations=copy.deepcopy(existing)), context(PROVIDERS["aks"][0]))
    # the user's tolerations stay first and unchanged; ours come after, only when not covered
    assert tolerations_of(result.object) == [*existing, AKS_WANT] if added else existing
    assert ("spot-toleration" in result.outcome.mutations) == added
    assert pipeline.validate(result.object, context(PROVIDERS["aks"][0])).outcome.events[0].reason == "SpotTolerated"


@pytest.mark.parametrize(
    ("existing", "added"),
    [
        # the taint on the cluster is OKE=true:NoSchedule: the pod's own Equal tolerates it, and got a second,
        # broader toleration beside it (found by a review of the spot policy)
        pytest.param([equal(OKE, "true")], False, id="equal-of-the-clusters-value-covers-exists"),
        pytest.param([equal(OKE, "false")], True, id="equal-of-another-value"),
        pytest.param([{"key": OKE, "operator": "Exists"}], False, id="exists-covers-exists"),
        pytest.param([{"operator": "Exists"}], False, id="empty-key-exists-covers-exists"),
        pytest.param([exists(OKE, "NoExecute")], True, id="exists-other-effect"),
    ],
)
def test_existing_tolerations_against_exists(existing: list[Any], added: bool) -> None:
    ctx = context(PROVIDERS["oke"][0])
    result = mutate(pod("tolerate", tolerations=copy.deepcopy(existing)), ctx)
    assert tolerations_of(result.object) == ([*existing, exists(OKE)] if added else existing)
    own = "" if added else f"; its own: {OKE}:NoSchedule"
    assert applied(result) == f"tolerate (asked by annotation); tolerates {OKE}:NoSchedule (taints on the cluster){own}"
    assert [e.reason for e in pipeline.validate(result.object, ctx).outcome.events] == ["SpotTolerated"]


def test_an_equal_covers_exists_only_for_the_values_on_the_cluster() -> None:
    """Two values of OKE's taint on the cluster: a toleration of one does not cover the Exists; with no preemptible
    node now (the spot nodes to come, of a value not known), neither does one of the value there was."""
    nodes = [
        node("o1", {OKE: "true"}, (f"{OKE}=true:NoSchedule",)),
        node("o2", {OKE: "yes"}, (f"{OKE}=yes:NoSchedule",)),
    ]
    two = mutate(pod("tolerate", tolerations=[equal(OKE, "true")]), context(nodes))
    assert tolerations_of(two.object) == [equal(OKE, "true"), exists(OKE)]
    both = [equal(OKE, "true"), equal(OKE, "yes")]
    assert tolerations_of(mutate(pod("tolerate", tolerations=copy.deepcopy(both)), context(nodes)).object) == both
    on_demand = node("oke-od")
    on_demand["metadata"]["annotations"] = {"oci.oraclecloud.com/node-pool-id": "ocid1.nodepool.oc1.od"}
    at_zero = mutate(pod("require", tolerations=[equal(OKE, "true")]), context([on_demand]))
    assert tolerations_of(at_zero.object) == [equal(OKE, "true"), exists(OKE)]


def test_tolerations_not_a_list_are_left_alone() -> None:
    result = mutate(pod("tolerate", tolerations="oops"), context(PROVIDERS["aks"][0]))
    assert result.object["spec"]["tolerations"] == "oops"
    assert "not a list" in (applied(result) or "")
    assert pipeline.validate(result.object, context(PROVIDERS["aks"][0])).outcome.events == []


# ---------------------------------------------------------------------------------------------------------------
# Affinity merging

ZONE_A = {"matchExpressions": [expr("topology.kubernetes.io/zone", "a")]}
ZONE_B = {"matchExpressions": [expr("topology.kubernetes.io/zone", "b")]}
HOST = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}
PREF = {"weight": 7, "preference": {"matchExpressions": [expr("gpu", "fast")]}}


def with_terms(*terms: Any) -> Any:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def and_(term: Any, *exprs: Any) -> Any:
    out = copy.deepcopy(term)
    out.setdefault("matchExpressions", []).extend(exprs)
    return out


@pytest.mark.parametrize(
    ("provider", "affinity", "want_required"),
    [
        pytest.param("gke", with_terms(ZONE_A), [and_(ZONE_A, expr(GKE_SPOT, "true"))], id="one-term"),
        pytest.param(
            "gke",
            with_terms(ZONE_A, ZONE_B),
            [and_(ZONE_A, expr(GKE_SPOT, "true")), and_(ZONE_B, expr(GKE_SPOT, "true"))],
            id="into-every-term",
        ),
        pytest.param(
            "aks",
            with_terms(ZONE_A, ZONE_B),
            [
                and_(ZONE_A, expr(AKS_PRIORITY, "spot")),
                and_(ZONE_A, expr(AKS_SCALESET, "spot")),
                and_(ZONE_B, expr(AKS_PRIORITY, "spot")),
                and_(ZONE_B, expr(AKS_SCALESET, "spot")),
            ],
            id="several-keys-or-per-term",
        ),
        pytest.param("gke", with_terms(HOST), [and_(HOST, expr(GKE_SPOT, "true"))], id="match-fields-term-kept"),
        pytest.param(
            "gke",
            with_terms(and_(ZONE_A, expr(GKE_SPOT, "true"))),
            [and_(ZONE_A, expr(GKE_SPOT, "true"))],
            id="already-required",
        ),
    ],
)
def test_require_merges_into_existing_terms(provider: str, affinity: Any, want_required: list[Any]) -> None:
    ctx = context([ON_DEMAND, *PROVIDERS[provider][0]])
    obj = pod("require", affinity=copy.deepcopy(affinity))
    obj["spec"]["affinity"]["podAntiAffinity"] = {"x": 1}
    result = mutate(obj, ctx)
    assert required_of(result.object) == want_required
    assert result.object["spec"]["affinity"]["podAntiAffinity"] == {"x": 1}


def test_require_over_several_clouds_is_an_or() -> None:
    ctx = context([node("g", {GKE_SPOT: "true"}), node("k", {KARPENTER: "spot"})])
    result = mutate(pod("require"), ctx)
    assert required_of(result.object) == [
        {"matchExpressions": [expr(GKE_SPOT, "true")]},
        {"matchExpressions": [expr(KARPENTER, "spot")]},
    ]
    assert "requires cloud.google.com/gke-spot=true or karpenter.sh/capacity-type=spot" in (applied(result) or "")


@pytest.mark.parametrize(
    "terms",
    [
        pytest.param([{}], id="empty-term"),
        pytest.param([{"matchExpressions": [], "matchFields": []}], id="empty-lists"),
    ],
)
def test_require_keeps_a_term_that_matches_nothing(terms: list[Any]) -> None:
    # "A null or empty node selector term matches no objects" (core/v1 NodeSelectorTerm): ANDing the spot label
    # into it must not make it match the spot nodes
    ctx = context([ON_DEMAND, *PROVIDERS["gke"][0]])
    obj = pod("require", affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}})
    obj["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] = (
        copy.deepcopy(terms)
    )
    result = mutate(obj, ctx)
    assert required_of(result.object) == terms
    assert ctx.cluster.eligible(result.object["spec"]) == []
    # beside a term that matches, the empty one stays as it is and the other is narrowed
    obj["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] = [
        *copy.deepcopy(terms),
        copy.deepcopy(ZONE_A),
    ]
    result = mutate(obj, ctx)
    assert required_of(result.object) == [*terms, and_(ZONE_A, expr(GKE_SPOT, "true"))]


AKS_POOL = "kubernetes.azure.com/agentpool"
AKS_ON_DEMAND = node("aks-od", {AKS_POOL: "gpuod"})


def test_a_spot_pool_without_gpus_is_no_spot_capacity_for_a_gpu_pod() -> None:
    """An AKS cluster with an on-demand GPU pool and a spot pool of CPU nodes: a GPU pod that required spot was
    told that its own nodeSelector, affinity or tolerations kept it off every spot pool (cpu-spot), though it had
    none, and was not given the taint of the GPU spot nodes to come (found by a review of provider journeys)."""
    cpu_spot = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "cpu-1", "labels": {AKS_POOL: "cpuspot", AKS_SCALESET: "spot", AKS_PRIORITY: "spot"}},
        "spec": {"taints": [taint(f"{AKS_SCALESET}=spot:NoSchedule")]},
        "status": {"allocatable": {"cpu": "8"}},
    }
    result = mutate(pod("require"), context([AKS_ON_DEMAND, cpu_spot], providers=("aks",)))
    assert result.warnings == [
        "spot require: no GPU node or pool is spot capacity now; Pending until a GPU spot node joins"
    ]
    assert tolerations_of(result.object) == [equal(AKS_SCALESET, "spot")]
    assert mutate(pod("require", gpu=None), context([AKS_ON_DEMAND, cpu_spot], providers=("aks",))).warnings == []


@pytest.mark.parametrize("providers", [("aks",), ("all",)])
def test_require_with_no_spot_node_now(providers: tuple[str, ...]) -> None:
    # An AKS spot pool scaled to zero: only on-demand nodes are listed. The spot nodes the autoscaler adds for the
    # pod carry AKS's taint (added to every spot node), so the pod must tolerate it now, or it never lands there;
    # other clouds' taints are not added (the nodes show the cluster is AKS).
    result = mutate(pod("require"), context([AKS_ON_DEMAND], providers=providers))
    assert tolerations_of(result.object) == [equal(AKS_SCALESET, "spot")]
    assert required_of(result.object) == [
        {"matchExpressions": [expr(AKS_PRIORITY, "spot")]},
        {"matchExpressions": [expr(AKS_SCALESET, "spot")]},
    ]
    assert result.warnings == [
        "spot require: no GPU node or pool is spot capacity now; Pending until a GPU spot node joins"
    ]
    text = applied(result) or ""
    assert f"tolerates {AKS_SCALESET}=spot:NoSchedule (provider presets: no spot node on the cluster now)" in text
    # the spot node that joins takes it, the on-demand one does not
    joined = node("aks-spot", {AKS_POOL: "gpuspot", AKS_PRIORITY: "spot", AKS_SCALESET: "spot"})
    joined["spec"]["taints"] = [taint(f"{AKS_SCALESET}=spot:NoSchedule")]
    later = context([AKS_ON_DEMAND, joined], providers=providers)
    names = {n for c in later.cluster.eligible(result.object["spec"]) for n in c.nodes}
    assert names == {"aks-spot"}


@pytest.mark.parametrize("mode", ["tolerate", "prefer"])
@pytest.mark.parametrize("providers", [("aks",), ("all",)])
def test_tolerate_and_prefer_with_no_spot_node_now(mode: str, providers: tuple[str, ...]) -> None:
    """An AKS spot pool scaled to zero: tolerate and prefer took only the taints there are, none, and Cluster
    Autoscaler never scaled the pool up for the pod, whose template node carries AKS's taint (found by a review of
    the spot policy). They get the taint of the spot nodes to come, as require does; on a cluster that shows no
    cloud (k3s), no cloud's. Prefer prefers their labels too, as require requires them: it said "no spot capacity
    label on the cluster to prefer", and nothing favoured the spot nodes once they came (found by a review)."""
    result = mutate(pod(mode), context([AKS_ON_DEMAND], providers=providers))
    assert tolerations_of(result.object) == [equal(AKS_SCALESET, "spot")]
    assert result.warnings == []
    preferred = [expr(AKS_PRIORITY, "spot"), expr(AKS_SCALESET, "spot")] if mode == "prefer" else []
    assert preferred_of(result.object) == [{"weight": 100, "preference": {"matchExpressions": [e]}} for e in preferred]
    prefers = (
        f"; prefers {AKS_PRIORITY}=spot or {AKS_SCALESET}=spot{spot.NOT_ON_CLUSTER} (weight 100)"
        if mode == "prefer"
        else ""
    )
    assert applied(result) == (
        f"{mode} (asked by annotation); tolerates {AKS_SCALESET}=spot:NoSchedule (provider presets: no spot node on"
        f" the cluster now){prefers}"
    )
    joined = node("aks-spot", {AKS_POOL: "gpuspot", AKS_PRIORITY: "spot", AKS_SCALESET: "spot"})
    joined["spec"]["taints"] = [taint(f"{AKS_SCALESET}=spot:NoSchedule")]
    later = context([AKS_ON_DEMAND, joined], providers=providers)
    names = {n for c in later.cluster.eligible(result.object["spec"]) for n in c.nodes}
    assert names == {"aks-od", "aks-spot"}
    k3s = mutate(pod(mode), context([ON_DEMAND]))
    assert tolerations_of(k3s.object) == [] and preferred_of(k3s.object) == []
    nothing = "; no spot capacity label on the cluster to prefer" if mode == "prefer" else ""
    assert applied(k3s) == (
        f"{mode} (asked by annotation); no spot taint on the cluster's nodes or pools to tolerate{nothing}"
    )


GKE_OD = node("gke-od", {"cloud.google.com/gke-nodepool": "l4-od"})


def _self_managed(name: str, labels: dict[str, str] | None = None) -> Any:
    """A node of an EKS self-managed node group: EKS's kubelet version, none of its labels."""
    out = node(name, labels)
    out["status"]["nodeInfo"] = {"kubeletVersion": "v1.30.4-eks-a737599"}
    return out


@pytest.mark.parametrize(
    ("nodes", "providers", "labels"),
    [
        pytest.param([GKE_OD], ("all",), [expr(GKE_SPOT, "true"), expr(GKE_PREEMPTIBLE, "true")], id="gke-shown"),
        pytest.param([ON_DEMAND], ("gke",), [expr(GKE_SPOT, "true"), expr(GKE_PREEMPTIBLE, "true")], id="gke-named"),
        pytest.param(
            [node("eks-od", {NODE_GROUP: "gpu-od"})],
            ("all",),
            [expr(EKS, "SPOT"), expr(KARPENTER, "spot")],
            id="eks-node-group-and-karpenter",
        ),
        pytest.param([_self_managed("sm-1")], ("all",), [expr(KARPENTER, "spot")], id="eks-self-managed-karpenter"),
        pytest.param([ON_DEMAND], ("all",), [], id="k3s-nothing"),
        pytest.param([], ("coreweave",), [], id="no-preset-labels-spot-nodes"),
    ],
)
def test_prefer_with_no_spot_node_now_prefers_the_spot_labels_of_the_providers_seen(
    nodes: list[Any], providers: tuple[str, ...], labels: list[Any]
) -> None:
    """Prefer with no spot node now (a spot pool at zero) prefers the spot labels of the providers whose spot nodes
    may come, as require requires them (``_spot_places``): harmless where no node carries them, and the scheduler
    (and Karpenter, which tries a pod's preferences first) favours the spot nodes once they come. Not every cloud's
    where no cloud shows (k3s); where no preset labels spot nodes, it says it prefers nothing (it said "prefers
    (weight 100)", naming no place)."""
    result = mutate(pod("prefer"), context(nodes, providers=providers))
    assert preferred_of(result.object) == [{"weight": 100, "preference": {"matchExpressions": [e]}} for e in labels]
    assert result.warnings == []
    shown = " or ".join(f"{e['key']}={e['values'][0]}" for e in labels)
    said = (applied(result) or "").split("; ")[-1]
    known = spot.NOT_ON_CLUSTER if nodes else ""
    assert said == (
        f"prefers {shown}{known} (weight 100)" if labels else "no spot capacity label on the cluster to prefer"
    )


@pytest.mark.parametrize("later", ["never", "off"])
def test_a_deployment_that_prefers_spot_at_zero_keeps_its_words_true(later: str) -> None:
    """A prefer Deployment reviewed while the AKS spot pool is at zero prefers AKS's spot labels; an update that
    leaves its template as it was, once a spot node is there, changes nothing (its pods do not roll); the pods made
    from it, and its next edit, say what is true then (the labels on the cluster's nodes); moved to never or off, it
    loses exactly the affinity prefer added."""
    spot_node = node("aks-spot", {AKS_POOL: "gpuspot", AKS_PRIORITY: "spot", AKS_SCALESET: "spot"})
    spot_node["spec"]["taints"] = [taint(f"{AKS_SCALESET}=spot:NoSchedule")]
    at_zero, scaled = context([AKS_ON_DEMAND]), context([AKS_ON_DEMAND, spot_node])
    first = mutate(workload("Deployment", "prefer"), at_zero).object
    preferred = [
        {"weight": 100, "preference": {"matchExpressions": [expr(AKS_PRIORITY, "spot")]}},
        {"weight": 100, "preference": {"matchExpressions": [expr(AKS_SCALESET, "spot")]}},
    ]
    places = f"prefers {AKS_PRIORITY}=spot or {AKS_SCALESET}=spot"
    assert preferred_of(_template(first)) == preferred
    assert _template(first)["metadata"]["annotations"][APPLIED] == (
        f"prefer (asked by annotation); tolerates {AKS_SCALESET}=spot:NoSchedule (provider presets: no spot node on"
        f" the cluster now); {places}{spot.NOT_ON_CLUSTER} (weight 100)"
    )
    unchanged = pipeline.mutate(copy.deepcopy(first), dataclasses.replace(scaled, operation="UPDATE", old_object=first))
    assert unchanged.patch == []
    now = f"prefer (asked by annotation); tolerates {AKS_SCALESET}=spot:NoSchedule (taints on the cluster); {places}"

    def made_from(live: Any) -> Any:  # a pod its ReplicaSet makes from the template
        made = _with_hash({"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(_template(live))})
        made["metadata"]["namespace"] = "ml"
        made["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w-5d8f9c7b6", "uid": "u", "controller": True}
        ]
        return made

    made = made_from(first)
    made_pod = mutate(made, scaled)
    assert made_pod.object["spec"] == made["spec"]
    assert applied(made_pod) == f"{now} (weight 100)"
    edited = copy.deepcopy(first)
    _template(edited)["spec"]["containers"][0]["image"] = "nvidia/cuda:12.4.1-base-ubuntu22.04"
    update = dataclasses.replace(scaled, operation="UPDATE", old_object=first)
    again = mutate(edited, update)
    assert _template(again.object)["spec"] == _template(edited)["spec"]
    assert applied(again) == f"{now} (weight 100)"

    def switched(live: Any) -> Any:
        out = _switched(live, later)
        if later == "off":  # the annotation taken out: the default, off
            del _template(out)["metadata"]["annotations"][ANNOTATION]
        return out

    moved = mutate(switched(first), dataclasses.replace(at_zero, operation="UPDATE", old_object=first))
    assert _template(moved.object)["spec"] == _template(workload("Deployment"))["spec"]
    why = "asked by annotation" if later == "never" else "global default"
    assert applied(moved) == (
        f"{later} ({why}); removed what prefer had added: tolerations {AKS_SCALESET}=spot:NoSchedule, its preferred"
        " spot affinity"
    )
    # GKE's words at zero name both its labels; once a gke-spot node is there, only that one is a place: the other
    # is read back from the words, and goes from the pods made then, and with the mode
    gke_first = mutate(workload("Deployment", "prefer"), context([GKE_OD])).object
    gke_scaled = context([GKE_OD, *PROVIDERS["gke"][0]])
    gke_pod = mutate(made_from(gke_first), gke_scaled)
    assert preferred_of(gke_pod.object) == [
        {"weight": 100, "preference": {"matchExpressions": [expr(GKE_SPOT, "true")]}}
    ]
    assert (applied(gke_pod) or "").endswith(f"; prefers {GKE_SPOT}=true (weight 100)")
    gke_moved = mutate(switched(gke_first), dataclasses.replace(gke_scaled, operation="UPDATE", old_object=gke_first))
    assert _template(gke_moved.object)["spec"] == _template(workload("Deployment"))["spec"]


@pytest.mark.parametrize("later", ["never", "off"])
def test_spot_tolerations_added_at_zero_stay_named_and_go_with_the_mode(later: str) -> None:
    """A tolerate Deployment reviewed while the GKE spot pool was at zero got GKE's spot tolerations; reviewed again
    once an untainted spot node was there, it wanted none, its words named none, and moved to never or off it kept
    them for good (found by a review of the spot policy). They are named on while the pod carries them, and go
    with the mode."""
    gke_pool = "cloud.google.com/gke-nodepool"
    on_demand = node("gke-od", {gke_pool: "l4-od"})
    at_zero = context([on_demand])
    scaled = context([on_demand, node("gke-spot", {GKE_SPOT: "true", gke_pool: "spot-l4"})])
    first = mutate(workload("Deployment", "tolerate"), at_zero).object
    added = [equal(GKE_SPOT, "true"), equal(GKE_PREEMPTIBLE, "true")]
    assert tolerations_of(_template(first)) == added
    edited = mutate(first, scaled)
    assert tolerations_of(_template(edited.object)) == added
    assert applied(edited) == (
        "tolerate (asked by annotation); no spot taint on the cluster's nodes or pools to tolerate; still tolerates "
        f"{GKE_SPOT}=true:NoSchedule, {GKE_PREEMPTIBLE}=true:NoSchedule (added by an earlier review: taken out when "
        "the spot mode changes)"
    )
    moved = mutate(_switched(edited.object, later), scaled)
    assert "tolerations" not in _template(moved.object)["spec"]
    assert (
        f"removed what tolerate had added: tolerations {GKE_SPOT}=true:NoSchedule, {GKE_PREEMPTIBLE}=true:NoSchedule"
        in (applied(moved) or "")
    )
    # the pod's own toleration of the same taint is never named as added, nor taken out
    own = workload("Deployment", "tolerate")
    _template(own)["spec"]["tolerations"] = [equal(GKE_SPOT, "true")]
    kept = mutate(mutate(own, at_zero).object, scaled)
    assert applied(kept) == (
        "tolerate (asked by annotation); no spot taint on the cluster's nodes or pools to tolerate; still tolerates "
        f"{GKE_PREEMPTIBLE}=true:NoSchedule (added by an earlier review: taken out when the spot mode changes)"
    )
    assert tolerations_of(_template(mutate(_switched(kept.object, later), scaled).object)) == [equal(GKE_SPOT, "true")]


def test_require_where_no_provider_shows_is_refused_saying_how_to_declare_spot_pools() -> None:
    """Nodes that show no cloud's labels (k3s, self-managed): require added every cloud's spot labels and taints,
    and the pod stayed Pending for good, told only to wait for a spot node (found by a review of the docs against
    the code). It is refused with how to declare the spot pools; a cluster.providers that names the cloud keeps
    the old way (its autoscaler may add spot nodes: the pod waits for them)."""
    result = pipeline.mutate(pod("require"), context([ON_DEMAND]))
    assert not result.allowed and result.reason == "SpotRequireUnplaceable"
    assert "no node or pool shows a cloud provider's labels (k3s or self-managed nodes" in result.message
    assert "cluster.pools[] with name, nodeSelector {<a label of the pool's nodes>: <pool>} and spot: true" in (
        result.message
    )
    named = mutate(pod("require"), context([ON_DEMAND], providers=("gke",)))
    assert tolerations_of(named.object) == [equal(GKE_SPOT, "true"), equal("cloud.google.com/gke-preemptible", "true")]
    assert "Pending" in named.warnings[0]
    declared = PoolSettings(name="spot", node_selector={"pool": "spot"}, spot=True)
    assert mutate(pod("require"), context([ON_DEMAND], pools=(declared,))).allowed


def test_an_oke_cluster_with_no_preemptible_node_shows_oke_by_its_pool_annotation() -> None:
    """OKE names a node's pool by an annotation, which the cluster model reads to tell OKE; the spot policy read the
    labels alone, and refused require on an OKE cluster with no preemptible node now as on k3s (found by a review
    of the spot policy)."""
    on_demand = node("oke-od", taints=("nvidia.com/gpu=present:NoSchedule",))
    on_demand["metadata"]["annotations"] = {"oci.oraclecloud.com/node-pool-id": "ocid1.nodepool.oc1..gpu"}
    ctx = context([on_demand])
    assert ctx.cluster.providers == {"oke"}
    result = mutate(pod("require"), ctx)
    assert result.allowed, result.message
    assert tolerations_of(result.object) == [exists(OKE)]
    assert required_of(result.object) == [{"matchExpressions": [expr(OKE, "true")]}]
    assert result.warnings == [
        "spot require: no GPU node or pool is spot capacity now; Pending until a GPU spot node joins"
    ]


CW_POOL = "compute.coreweave.com/node-pool"
CW_POOLS = (
    PoolSettings("h100-spot", {CW_POOL: "h100-spot"}, gpu_product="NVIDIA-H100-80GB-HBM3", gpu_count=8, spot=True),
    PoolSettings("h100-od", {CW_POOL: "h100-od"}, gpu_product="NVIDIA-H100-80GB-HBM3", gpu_count=8),
)


@pytest.mark.parametrize("providers", [("coreweave",), ("all",)])
def test_declared_spot_pools_are_spot_capacity(providers: tuple[str, ...]) -> None:
    # CoreWeave's spot pools carry no spot label or taint: a pool declared spot: true is where spot capacity is
    ctx = context([], providers=providers, pools=CW_POOLS)
    result = mutate(pod("require"), ctx)
    assert required_of(result.object) == [{"matchExpressions": [expr(CW_POOL, "h100-spot")]}]
    assert [c.group.pool for c in ctx.cluster.eligible(result.object["spec"])] == ["h100-spot"]
    assert result.warnings == []
    assert f"requires pool h100-spot ({CW_POOL}=h100-spot)" in (applied(result) or "")
    preferred = mutate(pod("prefer"), ctx)
    assert preferred_of(preferred.object) == [
        {"weight": 100, "preference": {"matchExpressions": [expr(CW_POOL, "h100-spot")]}}
    ]


def test_require_where_the_pods_constraints_exclude_every_spot_pool() -> None:
    pool = "cloud.google.com/gke-nodepool"
    nodes = [node("od", {pool: "od-new"}), *PROVIDERS["gke"][0]]
    obj = pod("require")
    obj["spec"]["nodeSelector"] = {pool: "od-new"}
    result = mutate(obj, context(nodes, providers=("gke",)))
    assert result.warnings == [
        "spot require: its nodeSelector, affinity or tolerations exclude every spot pool (pool spot-l4)"
    ]
    assert mutate(pod("require"), context(nodes, providers=("gke",))).warnings == []


def _long_eks_node(name: str, group: str, capacity: str, driver: str) -> Any:
    major = driver.split(".")[0]
    cuda = {"535": ("12", "2"), "570": ("12", "8")}[major]
    labels = {
        NODE_GROUP: group,
        EKS: capacity,
        "nvidia.com/cuda.driver-version.full": driver,
        "nvidia.com/cuda.driver-version.major": major,
        "nvidia.com/cuda.runtime-version.full": ".".join(cuda),
        "nvidia.com/cuda.runtime-version.major": cuda[0],
        "nvidia.com/cuda.runtime-version.minor": cuda[1],
    }
    return node(name, labels)


LONG_EKS = [
    _long_eks_node(f"ip-10-0-{i}-1", f"ml-prod-a100-80gb-{kind}-use1{zone}-20250101", capacity, driver)
    for i, (kind, capacity, driver, zone) in enumerate(
        [
            (k, c, d, z)
            for k, c, d in (("ondemand", "ON_DEMAND", "535.161.08"), ("spot", "SPOT", "570.124.06"))
            for z in "ab"
        ]
    )
]


@pytest.mark.parametrize(
    ("mode", "major", "warnings"),
    [
        pytest.param(
            "never",
            "570",
            [
                "spot never, yet its nodeSelector, affinity or tolerations leave it only spot pools "
                "ml-prod-a100-80gb-spot-u… and 1 more"
            ],
            id="never-only-spot",
        ),
        pytest.param(
            "require",
            "535",
            [
                "spot require: its nodeSelector, affinity or tolerations exclude every spot pool "
                "(pools ml-prod-a100-80gb-s… and 1 more)",
                "cuda: no known GPU node matches (the spot capacity it requires excludes pools ml-prod-a100-80g… "
                "and 1 more; and 1 more)",
            ],
            id="require-on-demand",
        ),
    ],
)
def test_warnings_naming_long_node_groups_cut_a_name_only_with_a_mark(
    mode: str, major: str, warnings: list[str]
) -> None:
    """EKS node groups have long names: the warnings that list them were cut at 119 characters in the middle of a
    name ('... (ml-prod-a100-80gb-spot-use1a-20250…', '... excludes pools ml-prod-a100-80gb-o…'), which read as
    a pool of that name, and the pools after it went unsaid. A name is now cut with a '…' and the rest counted."""
    settings = Settings(cluster=ClusterSettings(providers=["eks"]), mig=MigSettings(enabled=False))
    ctx = Context(settings=settings, cluster=build_view(LONG_EKS, settings), namespace="ml")
    obj = pod(mode)
    obj["spec"]["containers"][0]["image"] = "nvidia/cuda:12.8.0-runtime-ubuntu22.04"
    obj["spec"]["nodeSelector"] = {"nvidia.com/cuda.driver-version.major": major}
    result = pipeline.review(obj, ctx)
    assert result.allowed, result.message
    assert result.warnings == warnings


LONG_SPOT_GROUPS = [
    "ml-training-gpu-spot-a10g-use1a",
    "ml-training-gpu-spot-a10g-use1b",
    "ml-inference-gpu-spot-a10g-use1c",
]


@pytest.mark.parametrize("tainted", [False, True])
def test_warnings_naming_spot_pools_count_them_where_no_name_fits(tainted: bool) -> None:
    """Three spot node groups of long names: where the first name, cut to MIN_NAME characters, did not fit with the
    count, the prefer warning lost its count and its ')' ('(pools ml-infe… and …') and the gated never one the end
    of its advice (a review's). The pools are counted instead, and the warning stays whole."""
    taints = ("spot=true:NoSchedule",) if tainted else ()
    spots = [node(f"s-{i}", {EKS: "SPOT", NODE_GROUP: g}, taints) for i, g in enumerate(LONG_SPOT_GROUPS)]
    on_demand = node("od", {EKS: "ON_DEMAND", NODE_GROUP: "gpu-ondemand-a10g"})
    if tainted:
        gated = pod("never")
        gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
        said = "spot never, yet only 3 spot pools can offer what it asks: once ungated, Pending until on-demand ones do"
        assert mutate(gated, context(spots, providers=("eks",))).warnings == [said]
    else:
        prefer = pod("prefer")
        prefer["spec"]["nodeSelector"] = {NODE_GROUP: "gpu-ondemand-a10g"}
        said = (
            "spot prefer: its nodeSelector, affinity or tolerations exclude every spot pool: it runs on demand "
            "(3 pools)"
        )
        assert mutate(prefer, context([*spots, on_demand], providers=("eks",))).warnings == [said]


def test_spot_pools_that_are_cordoned_are_said_so_not_excluded_by_the_pods_tolerations() -> None:
    """Every spot node cordoned (a drain) or not ready: the warning blamed the pod's tolerations, and no pod should
    tolerate a drain or a broken node (found by a review of the cluster model)."""
    pool = "cloud.google.com/gke-nodepool"
    spot_taint = f"{GKE_SPOT}=true:NoSchedule"
    nodes = [
        node("od", {pool: "od-new"}),
        node("a", {GKE_SPOT: "true", pool: "spot-l4"}, (spot_taint, "node.kubernetes.io/unschedulable:NoSchedule")),
        node("b", {GKE_SPOT: "true", pool: "spot-a100"}, (spot_taint, "node.kubernetes.io/not-ready:NoExecute")),
    ]
    why = "the spot nodes it can use are all cordoned and not ready now"
    assert mutate(pod("require"), context(nodes, providers=("gke",))).warnings == [
        f"spot require: {why} (pools spot-a100, spot-l4)"
    ]
    result = mutate(pod("prefer"), context(nodes, providers=("gke",)))
    assert result.warnings == [f"spot prefer: {why}: it runs on demand (pools spot-a100, spot-l4)"]
    assert (applied(result) or "").endswith(f"; {why} (spot-a100, spot-l4)")


@pytest.mark.parametrize(
    ("preferred", "want"),
    [
        pytest.param(
            [PREF],
            [PREF, {"weight": 100, "preference": {"matchExpressions": [expr(GKE_SPOT, "true")]}}],
            id="appended-after-existing",
        ),
        pytest.param(
            [{"weight": 5, "preference": {"matchExpressions": [expr(GKE_SPOT, "true")]}}],
            [{"weight": 5, "preference": {"matchExpressions": [expr(GKE_SPOT, "true")]}}],
            id="equal-term-not-duplicated",
        ),
    ],
)
def test_prefer_with_existing_preferred_terms(preferred: list[Any], want: list[Any]) -> None:
    affinity = with_terms(ZONE_A)
    affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = copy.deepcopy(preferred)
    result = mutate(pod("prefer", affinity=affinity), context(PROVIDERS["gke"][0]))
    assert preferred_of(result.object) == want
    assert required_of(result.object) == [ZONE_A], "prefer leaves required affinity alone"


def test_karpenter_on_demand_only_still_counts_as_a_key() -> None:
    # Karpenter labels every node with its capacity type; it can launch spot nodes for a pod that requires them
    result = mutate(pod("require"), context([node("od", {KARPENTER: "on-demand"})]))
    assert required_of(result.object) == [{"matchExpressions": [expr(KARPENTER, "spot")]}]
    # no spot node now: said (the pod is Pending until Karpenter adds one), and Karpenter's spot nodes carry no
    # taint: the other clouds' spot tolerations are not added
    assert result.warnings == [
        "spot require: no GPU node or pool is spot capacity now; Pending until a GPU spot node joins"
    ]
    assert tolerations_of(result.object) == []


# ---------------------------------------------------------------------------------------------------------------
# Defaults and precedence

SPOT_AKS = PROVIDERS["aks"][0]


@pytest.mark.parametrize(
    ("obj", "settings", "namespace", "want"),
    [
        pytest.param(pod(), {}, "ml", None, id="global-default-off"),
        pytest.param(pod(), {"default": "tolerate"}, "ml", "tolerate (global default)", id="global-default"),
        pytest.param(
            pod(),
            {"namespace_defaults": {"ml": "prefer"}},
            "ml",
            "prefer (default for namespace ml)",
            id="namespace-default",
        ),
        pytest.param(pod(), {"namespace_defaults": {"other": "prefer"}}, "ml", None, id="other-namespace"),
        pytest.param(
            pod(owner="Job"),
            {"owner_defaults": {"Job": "tolerate"}},
            "ml",
            "tolerate (default for Job pods)",
            id="owner-default",
        ),
        pytest.param(
            pod(owner="Job"),
            {"owner_defaults": {"Job": "require"}, "namespace_defaults": {"ml": "tolerate"}, "default": "prefer"},
            "ml",
            "require (default for Job pods)",
            id="owner-over-namespace",
        ),
        pytest.param(
            pod(owner="ReplicaSet"),
            {"owner_defaults": {"Job": "require"}, "namespace_defaults": {"ml": "tolerate"}},
            "ml",
            "tolerate (default for namespace ml)",
            id="namespace-when-owner-has-none",
        ),
        # a Volcano Job (batch.volcano.sh) is not a Job: a gang-scheduled job's pods got the default for Job pods
        pytest.param(
            volcano_pod(),
            {"owner_defaults": {"Job": "require"}, "namespace_defaults": {"ml": "off"}},
            "ml",
            None,
            id="not-a-batch-job",
        ),
        pytest.param(  # ... but may be named with its API group
            volcano_pod(),
            {"owner_defaults": {"Job": "require", "Job.batch.volcano.sh": "tolerate"}},
            "ml",
            "tolerate (default for Job.batch.volcano.sh pods)",
            id="a-volcano-job-by-its-group",
        ),
        pytest.param(  # a kind with its group comes before its name alone
            pod(owner="Job"),
            {"owner_defaults": {"Job": "require", "Job.batch": "tolerate", "Job.batch.volcano.sh": "prefer"}},
            "ml",
            "tolerate (default for Job.batch pods)",
            id="a-batch-job-by-its-group",
        ),
        pytest.param(
            volcano_pod(kind="PyTorchJob", version="kubeflow.org/v1"),
            {"owner_defaults": {"PyTorchJob.example.com": "require", "PyTorchJob.kubeflow.org": "tolerate"}},
            "ml",
            "tolerate (default for PyTorchJob.kubeflow.org pods)",
            id="a-crd-kind-by-its-group",
        ),
        pytest.param(
            _with_hash(volcano_pod(kind="ReplicaSet", version="extensions/v1beta1")),
            {"owner_defaults": {"Deployment.extensions": "tolerate", "Deployment.apps": "require"}},
            "ml",
            "tolerate (default for Deployment.extensions pods)",
            id="an-old-deployment-by-its-group",
        ),
        pytest.param(
            volcano_pod(kind="ReplicaSet", version="extensions/v1beta1"),
            {"owner_defaults": {"ReplicaSet": "tolerate"}},
            "ml",
            "tolerate (default for ReplicaSet pods)",
            id="an-old-group-of-a-built-in-kind",
        ),
        pytest.param(
            volcano_pod(kind="PyTorchJob", version="kubeflow.org/v1"),
            {"owner_defaults": {"PyTorchJob": "tolerate"}},
            "ml",
            "tolerate (default for PyTorchJob pods)",
            id="a-crd-kind-in-any-group",
        ),
        pytest.param(
            pod(),
            {"namespace_defaults": {"ml": "off"}, "default": "tolerate"},
            "ml",
            None,
            id="namespace-off-over-global",
        ),
        pytest.param(
            pod(owner="Job"),
            {"owner_defaults": {"Job": "off"}, "namespace_defaults": {"ml": "tolerate"}},
            "ml",
            None,
            id="owner-off-over-namespace",
        ),
        pytest.param(
            pod("prefer", owner="Job"),
            {"owner_defaults": {"Job": "require"}},
            "ml",
            "prefer (asked by annotation)",
            id="annotation-over-owner",
        ),
        pytest.param(
            pod("never", owner="Job"),
            {"owner_defaults": {"Job": "require"}, "namespace_defaults": {"ml": "tolerate"}, "default": "prefer"},
            "ml",
            None,
            id="never-over-every-default",
        ),
        pytest.param(
            pod("false"),
            {"default": "require"},
            "ml",
            None,
            id="false-over-global",
        ),
        pytest.param(
            workload("Deployment"),
            {"owner_defaults": {"ReplicaSet": "tolerate"}},
            "ml",
            "tolerate (default for ReplicaSet pods)",
            id="deployment-template-owner-replicaset",
        ),
        pytest.param(
            workload("Deployment"),
            {"owner_defaults": {"Deployment.apps": "prefer", "Deployment": "require"}},
            "ml",
            "prefer (default for Deployment.apps pods)",
            id="deployment-template-by-its-group",
        ),
        pytest.param(
            workload("CronJob"),
            {"owner_defaults": {"Job": "prefer"}},
            "ml",
            "prefer (default for Job pods)",
            id="cronjob-template-owner-job",
        ),
        pytest.param(
            workload("Job"),
            {"owner_defaults": {"Job": "tolerate"}},
            "ml",
            "tolerate (default for Job pods)",
            id="job-template",
        ),
        pytest.param(
            workload("Deployment", "never"),
            {"owner_defaults": {"ReplicaSet": "tolerate"}},
            "ml",
            None,
            id="template-never",
        ),
        pytest.param(
            pod(namespace="batch"),
            {"namespace_defaults": {"batch": "tolerate"}},
            "",
            "tolerate (default for namespace batch)",
            id="namespace-from-object",
        ),
    ],
)
def test_defaults_and_precedence(obj: Any, settings: dict[str, Any], namespace: str, want: str | None) -> None:
    result = mutate(obj, context(SPOT_AKS, namespace=namespace, **settings))
    text = applied(result)
    if want is None:
        assert result.patch == []
        assert text is None
    else:
        assert text is not None and text.startswith(want + ";"), text
        view = pipeline.pod_view(result.object, "ml")
        assert view is not None
        assert view.spec["tolerations"] == [AKS_WANT]


@pytest.mark.parametrize(
    ("value", "settings", "want_mode"),
    [
        pytest.param("yes", {}, None, id="unknown-nothing"),
        pytest.param("always", {"namespace_defaults": {"ml": "tolerate"}}, "tolerate", id="unknown-defaults-apply"),
        pytest.param("x" * 300, {}, None, id="long-value"),
        pytest.param("", {}, None, id="empty"),
        pytest.param(True, {}, "tolerate", id="yaml-boolean-true"),
        pytest.param(7, {}, None, id="number"),
    ],
)
def test_unknown_values_warn(value: Any, settings: dict[str, Any], want_mode: str | None) -> None:
    obj = pod(annotations={ANNOTATION: value})
    result = pipeline.mutate(obj, context(SPOT_AKS, **settings))
    text = applied(result)
    assert text is not None
    assert text.split(" ", 1)[0] == (want_mode or "off")
    if value is True:
        assert result.warnings == []
        return
    # the pod says what became of its value, where kubectl describe shows it (a controller's pod has no warnings)
    why = "default for namespace ml" if settings else "global default"
    assert text.startswith(f"{want_mode or 'off'} ({why}); {ANNOTATION} "), text
    assert ": ignored" in text.split("; ")[1]
    assert len(result.warnings) == 1
    warning = result.warnings[0]
    assert len(warning) < 120
    assert ANNOTATION in warning and "tolerate" in warning and "never" in warning
    if isinstance(value, str) and len(value) < 20:
        assert repr(value) in warning


# ---------------------------------------------------------------------------------------------------------------
# Narrowing to the cluster's taints


ALL_PRESET_TOLERATIONS = [
    equal(GKE_SPOT, "true"),
    equal(GKE_PREEMPTIBLE, "true"),
    equal(AKS_SCALESET, "spot"),
    exists(OKE),
]


@pytest.mark.parametrize(
    ("nodes", "kwargs", "want"),
    [
        pytest.param(SPOT_AKS, {}, [AKS_WANT], id="aks-only-not-other-clouds"),
        pytest.param([], {}, ALL_PRESET_TOLERATIONS, id="unknown-cluster-all-presets"),
        pytest.param(SPOT_AKS, {"only_cluster_taints": False}, ALL_PRESET_TOLERATIONS, id="narrowing-off"),
        pytest.param([], {"providers": ("aks",)}, [AKS_WANT], id="unknown-cluster-one-provider"),
        pytest.param(
            [ON_DEMAND, *PROVIDERS["gke"][0]],
            {"providers": ("aks",)},
            [AKS_WANT],  # no AKS spot node now: those to come carry AKS's taint
            id="taint-of-a-provider-not-configured",
        ),
        pytest.param([ON_DEMAND], {}, [], id="no-spot-taint-on-cluster"),
        pytest.param(
            [node("o", {}, (f"{OKE}=yes:NoExecute", f"{OKE}=yes:NoSchedule"))],
            {},
            [exists(OKE, "NoExecute"), exists(OKE, "NoSchedule")],
            id="undocumented-value-cluster-effects",
        ),
        pytest.param([node("g", {}, (f"{GKE_SPOT}=false:NoSchedule",))], {}, [], id="documented-value-mismatch"),
        pytest.param(
            [node("g", {}, (f"{GKE_SPOT}=true:NoExecute",))],
            {},
            [equal(GKE_SPOT, "true", "NoExecute")],
            id="cluster-effect-used",
        ),
        pytest.param(
            [node("a", {}, (f"{AKS_SCALESET}=spot:NoSchedule",)), node("b", {}, (f"{GKE_SPOT}=true:NoSchedule",))],
            {},
            [equal(GKE_SPOT, "true"), AKS_WANT],
            id="two-clouds-preset-order",
        ),
        pytest.param(
            [ON_DEMAND],
            {
                "pools": (
                    PoolSettings(
                        name="spot-zero",
                        node_selector={AKS_SCALESET: "spot"},
                        taints=[TaintSpec(AKS_SCALESET, "spot", "NoSchedule")],
                        spot=True,
                    ),
                )
            },
            [AKS_WANT],
            id="declared-pool-scaled-to-zero",
        ),
        pytest.param(
            [ON_DEMAND, *SPOT_AKS],
            {"extra_taints": [TaintSpec(USER_KEY, "", "NoSchedule")]},
            [AKS_WANT],
            id="user-taint-not-on-cluster",
        ),
        pytest.param(
            [ON_DEMAND],
            {"extra_taints": [TaintSpec(USER_KEY, "", "NoSchedule")]},
            [exists(USER_KEY)],  # the spot nodes to come carry it
            id="user-taint-no-spot-node-now",
        ),
        pytest.param(
            [],
            {"extra_taints": [TaintSpec(USER_KEY, "", "NoSchedule")], "providers": ("eks",)},
            [exists(USER_KEY)],
            id="user-taint-unknown-cluster-exists",
        ),
    ],
)
def test_narrowing(nodes: list[Any], kwargs: dict[str, Any], want: list[Any]) -> None:
    result = mutate(pod("tolerate"), context(nodes, **kwargs))
    assert tolerations_of(result.object) == want
    text = applied(result) or ""
    if want:
        assert "tolerates " in text
    else:
        assert "no spot taint" in text and "spec" in result.object and "tolerations" not in result.object["spec"]


@pytest.mark.parametrize(
    ("nodes", "providers", "mode", "want_required", "warned"),
    [
        pytest.param(
            [ON_DEMAND],
            ("gke",),
            "require",
            [{"matchExpressions": [expr(GKE_SPOT, "true")]}, {"matchExpressions": [expr(GKE_PREEMPTIBLE, "true")]}],
            True,
            id="require-no-label-still-added",
        ),
        pytest.param([ON_DEMAND], ("all",), "prefer", None, False, id="prefer-no-provider-nothing"),
        pytest.param(
            [],
            ("eks", "karpenter"),
            "require",
            [{"matchExpressions": [expr(EKS, "SPOT")]}, {"matchExpressions": [expr(KARPENTER, "spot")]}],
            False,
            id="unknown-cluster-all-labels",
        ),
    ],
)
def test_spot_labels(
    nodes: list[Any], providers: tuple[str, ...], mode: str, want_required: list[Any] | None, warned: bool
) -> None:
    result = mutate(pod(mode), context(nodes, providers=providers))
    assert required_of(result.object) == want_required
    if mode == "prefer":
        assert preferred_of(result.object) == []
        assert "no spot capacity label" in (applied(result) or "")
    assert any("Pending" in w for w in result.warnings) == warned


# ---------------------------------------------------------------------------------------------------------------
# GPU taint presets

SKU = equal("sku", "gpu")
AKS_GPU_NODES = [node("aks-gpu", {AKS_SCALESET: "spot"}, (f"{AKS_SCALESET}=spot:NoSchedule", "sku=gpu:NoSchedule"))]


@pytest.mark.parametrize(
    ("presets", "gpu", "nodes", "want"),
    [
        pytest.param([], "1", AKS_GPU_NODES, [AKS_WANT], id="off-by-default"),
        pytest.param(["aks-sku-gpu"], "1", AKS_GPU_NODES, [AKS_WANT, SKU], id="gpu-pod"),
        pytest.param(["aks-sku-gpu"], "500m", AKS_GPU_NODES, [AKS_WANT, SKU], id="fractional-gpu-pod"),
        pytest.param(["aks-sku-gpu"], None, AKS_GPU_NODES, [AKS_WANT], id="cpu-pod"),
        pytest.param(["aks-sku-gpu"], "1", SPOT_AKS, [AKS_WANT], id="cluster-without-sku-taint"),
        pytest.param(["aks-sku-gpu"], "1", [], [*ALL_PRESET_TOLERATIONS, SKU], id="unknown-cluster"),
    ],
)
def test_gpu_taint_presets(presets: list[str], gpu: str | None, nodes: list[Any], want: list[Any]) -> None:
    result = mutate(pod("tolerate", gpu=gpu), context(nodes, gpu_taint_presets=presets))
    assert tolerations_of(result.object) == want


def test_require_names_the_untolerated_gpu_taint_of_every_spot_pool_and_its_setting() -> None:
    """Every AKS spot pool tainted sku=gpu:NoSchedule (ExtendedResourceToleration does not cover it): require was
    told that "its nodeSelector, affinity or tolerations exclude every spot pool" (found by a review of the spot
    policy). The taint is named, with the setting that tolerates it; with that setting, nothing is said."""
    spot_pool = node(
        "aks-spot",
        {AKS_POOL: "gpuspot", AKS_SCALESET: "spot"},
        (f"{AKS_SCALESET}=spot:NoSchedule", "sku=gpu:NoSchedule"),
    )
    result = mutate(pod("require"), context([AKS_ON_DEMAND, spot_pool]))
    assert result.warnings == [
        "spot require: untolerated sku=gpu:NoSchedule (set spot.gpuTaintPresets: [aks-sku-gpu]) (pool gpuspot)"
    ]
    assert mutate(pod("require"), context([AKS_ON_DEMAND, spot_pool], gpu_taint_presets=["aks-sku-gpu"])).warnings == []
    # prefer's warning, cut at 119 characters, lost the pool and that the pod runs on demand (found by a review):
    # the whole of it fits, and the annotation says it in full
    preferred = mutate(pod("prefer"), context([AKS_ON_DEMAND, spot_pool]))
    assert preferred.warnings == [
        "spot prefer: untolerated sku=gpu:NoSchedule (set spot.gpuTaintPresets: [aks-sku-gpu]): it runs on demand"
        " (pool gpuspot)"
    ]
    assert (applied(preferred) or "").endswith(
        "; untolerated taint sku=gpu:NoSchedule (spot.gpuTaintPresets: [aks-sku-gpu] tolerates it) (gpuspot)"
    )


def test_gpu_taint_presets_not_for_non_spot_pods() -> None:
    result = mutate(pod(), context(AKS_GPU_NODES, gpu_taint_presets=["aks-sku-gpu"]))
    assert result.patch == []


# ---------------------------------------------------------------------------------------------------------------
# Warnings, review, validate


@pytest.mark.parametrize(
    ("mode", "evict", "warned"),
    [
        pytest.param("require", "false", True, id="require"),
        pytest.param("tolerate", "false", True, id="tolerate"),
        pytest.param("tolerate", "true", False, id="safe-to-evict-true"),
        pytest.param("never", "false", False, id="never"),
    ],
)
def test_safe_to_evict_warning(mode: str, evict: str, warned: bool) -> None:
    result = mutate(pod(mode, annotations={SAFE_TO_EVICT: evict}), context(SPOT_AKS))
    hits = [w for w in result.warnings if SAFE_TO_EVICT in w]
    assert bool(hits) == warned
    assert all(len(w) < 120 for w in hits)


@pytest.mark.parametrize("provider", list(PROVIDERS))
@pytest.mark.parametrize("mode", ["tolerate", "prefer", "require"])
def test_review(provider: str, mode: str) -> None:
    spot_nodes, extra, want_tolerations, _ = PROVIDERS[provider]
    ctx = context([ON_DEMAND, *spot_nodes], **extra)
    obj = pod(mode)
    result = pipeline.review(obj, ctx)
    assert result.allowed
    assert jsonpatch.apply_patch(obj, result.patch) == result.object
    assert tolerations_of(result.object) == want_tolerations
    events = [e for e in result.outcome.events if e.reason == "SpotTolerated"]
    # an Event says a toleration was added; EKS and Karpenter spot nodes carry no taint, so nothing to tell
    assert len(events) == bool(want_tolerations)
    assert all(e.message == f"spot {applied(result)}" for e in events)
    # the pod now schedules onto the spot nodes, and for require only there
    names = {n for c in ctx.cluster.eligible(result.object["spec"]) for n in c.nodes}
    spot_names = {n["metadata"]["name"] for n in spot_nodes}
    assert names == spot_names if mode == "require" else names == spot_names | {"on-demand"}
    again = pipeline.review(result.object, ctx)
    assert again.patch == [] and again.object == result.object


def test_review_of_a_pod_that_does_not_ask() -> None:
    result = pipeline.review(pod(), context(SPOT_AKS))
    assert result.patch == [] and result.outcome.events == [] and result.warnings == []


@pytest.mark.parametrize(
    ("obj", "events"),
    [
        pytest.param(
            pod(annotations={APPLIED: f"tolerate (x); tolerates {AKS_SCALESET}=spot:NoSchedule"}),
            0,
            id="named-toleration-missing",
        ),
        pytest.param(
            pod(
                annotations={APPLIED: f"tolerate (x); tolerates {AKS_SCALESET}=spot:NoSchedule (y)"},
                tolerations=[{"operator": "Exists"}],
            ),
            1,
            id="named-toleration-covered",
        ),
        pytest.param(pod(annotations={APPLIED: "tolerate (x); tolerates ???"}), 0, id="unreadable"),
        pytest.param(pod(annotations={APPLIED: "prefer (x); prefers a=b (weight 100)"}), 0, id="names-none"),
        pytest.param(pod(), 0, id="no-annotation"),
    ],
)
def test_validate_event(obj: Any, events: int) -> None:
    result = pipeline.validate(obj, context(SPOT_AKS))
    assert result.allowed
    assert [e.reason for e in result.outcome.events] == ["SpotTolerated"] * events


def test_forged_applied_annotation_is_rewritten() -> None:
    obj = pod(annotations={APPLIED: "require (forged)"})
    result = mutate(obj, context(SPOT_AKS))
    assert applied(result) is None


@pytest.mark.parametrize(
    "text",
    [
        "tolerate (asked by annotation); tolerates a=b:NoSchedule, c:NoExecute (taints on the cluster)",
        "tolerate (global default); no spot taint on the cluster's nodes or pools to tolerate",
        "tolerate (global default); tolerates a=b:NoSchedule (taints on the cluster); still tolerates c:NoExecute"
        " (added by an earlier review: taken out when the spot mode changes)",
        "tolerate (global default); tolerates a=b:NoSchedule (taints on the cluster); still tolerates c:NoExecute"
        + spot.STILL_WHY_DAEMONSET,
    ],
)
def test_named_tolerations_round_trip(text: str) -> None:
    named = spot.named_tolerations(text)
    assert named is not None
    assert [str(w) for w in named] == (["a=b:NoSchedule", "c:NoExecute"] if "tolerates" in text else [])


# ---------------------------------------------------------------------------------------------------------------
# Real objects with every field set

FIXTURES = next(
    (
        p
        for p in (Path(__file__).resolve().parents[1] / "shared", Path(__file__).resolve().parents[2] / "shared")
        if (p / "fixtures" / "kubernetes-api").is_dir()
    ),
    None,
)
FIXTURE_FILES = [
    "core.v1.Pod.json",
    "core.v1.PodTemplate.json",
    "apps.v1.Deployment.json",
    "apps.v1.StatefulSet.json",
    "apps.v1.DaemonSet.json",
    "apps.v1.ReplicaSet.json",
    "batch.v1.Job.json",
    "batch.v1.CronJob.json",
]


@pytest.mark.parametrize("name", FIXTURE_FILES)
@pytest.mark.parametrize("mode", ["tolerate", "prefer", "require"])
def test_fixtures(name: str, mode: str) -> None:
    if FIXTURES is None:
        pytest.skip("shared/fixtures/kubernetes-api is not in this checkout")
    obj = json.loads((FIXTURES / "fixtures" / "kubernetes-api" / name).read_text())
    view = pipeline.pod_view(obj, "ml")
    assert view is not None
    view.set_annotation(ANNOTATION, mode)
    before = copy.deepcopy(view.spec.get("tolerations"))
    result = mutate(obj, context([ON_DEMAND, *SPOT_AKS]))
    out = pipeline.pod_view(result.object, "ml")
    assert out is not None
    assert out.spec["tolerations"][: len(before or [])] == (before or [])
    assert AKS_WANT in out.spec["tolerations"]


@pytest.mark.parametrize(
    ("obj", "applies"),
    [
        pytest.param("deployment-pod", True, id="pod-of-a-deployment"),
        pytest.param("deployment-template", True, id="deployment-template"),
        pytest.param("bare-replicaset-pod", False, id="replicaset-without-deployment"),
        pytest.param("job-pod", False, id="job-pod"),
    ],
)
def test_deployment_owner_default_reaches_its_pods(obj: str, applies: bool) -> None:
    # Pods are owned by the Deployment's ReplicaSet; the pod-template-hash label says a Deployment made it.
    if obj == "deployment-template":
        target = workload("Deployment")
    else:
        target = pod(owner="Job" if obj == "job-pod" else "ReplicaSet")
        if obj == "deployment-pod":
            target["metadata"]["labels"] = {"pod-template-hash": "5d8f9c7b6"}
    result = mutate(target, context(PROVIDERS["gke"][0], owner_defaults={"Deployment": "tolerate"}))
    assert bool(result.patch) is applies
    if applies:
        assert "default for Deployment pods" in result.outcome.annotations["spot-applied"]


def test_review_warns_of_an_annotation_on_the_workload_not_its_template() -> None:
    # kubectl annotate deployment puts it on the Deployment, whose pods get only the template's metadata
    obj = workload("Deployment")
    obj["metadata"]["annotations"] = {ANNOTATION: "require", "example.com/other": "x"}
    result = pipeline.review(obj, context(SPOT_AKS))
    assert result.warnings == [
        f"{ANNOTATION} is on the Deployment, not its pod template, so its pods never see it: move it there"
    ]
    assert applied(result) is None
    obj["spec"]["template"]["metadata"]["annotations"] = {ANNOTATION: "require"}
    assert pipeline.review(obj, context(SPOT_AKS)).warnings == []


def test_mutate_warns_of_an_annotation_on_the_workload_when_it_is_made_or_changed() -> None:
    """The server's answer says it too (kubectl annotate deployment is an UPDATE that reaches only the server):
    when the workload is created, and on an update that changes its own annotations, not on every other update."""
    obj = workload("Deployment")
    obj["metadata"]["annotations"] = {ANNOTATION: "require"}
    warning = f"{ANNOTATION} is on the Deployment, not its pod template, so its pods never see it: move it there"
    assert warning in pipeline.mutate(obj, context(SPOT_AKS)).warnings
    old = copy.deepcopy(obj)
    scaled = copy.deepcopy(obj)
    scaled["spec"]["replicas"] = 5
    update = dataclasses.replace(context(SPOT_AKS), operation="UPDATE", old_object=old)
    assert warning not in pipeline.mutate(scaled, update).warnings
    del old["metadata"]["annotations"]
    assert warning in pipeline.mutate(obj, dataclasses.replace(update, old_object=old)).warnings
    assert pipeline.review(obj, context(SPOT_AKS)).warnings.count(warning) == 1


# ---------------------------------------------------------------------------------------------------------------
# Judged on the final pod (found by the spot review): the policies after this one can leave it no spot pool

NODEPOOL = "cloud.google.com/gke-nodepool"


def test_prefer_says_so_when_the_mig_profile_it_gets_is_on_no_spot_pool() -> None:
    """A 0.5 GPU becomes 3g.20gb, which only the on-demand A100-40GB pool offers; the spot pool has whole GPUs."""
    from tests.mig_fixtures import mixed_node

    spot_node = node("spot-0", {GKE_SPOT: "true", NODEPOOL: "spot-h100"}, (f"{GKE_SPOT}=true:NoSchedule",), gpus=8)
    profiles = {"1g.5gb": 7, "3g.20gb": 2}
    od_node = mixed_node("od-0", "NVIDIA-A100-SXM4-40GB", profiles, "a100-od", 40960)
    settings = Settings(cuda=CudaSettings(mode="off"), cluster=ClusterSettings(providers=["gke"]))
    ctx = Context(settings=settings, cluster=build_view([spot_node, od_node], settings), namespace="ml")
    result = mutate(pod("prefer", gpu="0.5"), ctx)
    assert result.object["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-3g.20gb": "1"}
    why = "no spot pool offers its nvidia.com/mig-3g.20gb"
    assert f"spot prefer: {why}: it runs on demand (pool spot-h100)" in result.warnings
    assert (applied(result) or "").endswith(f"; {why} (spot-h100)")
    # With the profile on the spot pool too, nothing is said.
    spot_mig = mixed_node(
        "spot-1", "NVIDIA-A100-SXM4-40GB", profiles, "spot-a100", 40960, extra_labels={GKE_SPOT: "true"}
    )
    ctx = Context(settings=settings, cluster=build_view([spot_mig, od_node], settings), namespace="ml")
    assert not [w for w in mutate(pod("prefer", gpu="0.5"), ctx).warnings if "spot" in w]


def test_a_mig_refusal_under_require_names_the_spot_requirement() -> None:
    """A 0.5 GPU under require, whose profile only an on-demand pool offers, was refused for "its node affinity",
    and told to change its nodeSelector, node affinity or tolerations: the affinity was the webhook's own (found by
    a review of the spot policy). It is named, and the advice is the spot mode, as the CUDA refusal words it."""
    from tests.mig_fixtures import mixed_node

    spot_node = node("spot-0", {GKE_SPOT: "true", NODEPOOL: "spot-l4"}, (f"{GKE_SPOT}=true:NoSchedule",), gpus=8)
    od_node = mixed_node("od-0", "NVIDIA-A100-SXM4-40GB", {"1g.5gb": 7, "3g.20gb": 2}, "a100-od", 40960)
    settings = Settings(cuda=CudaSettings(mode="off"), cluster=ClusterSettings(providers=["gke"]))
    ctx = Context(settings=settings, cluster=build_view([spot_node, od_node], settings), namespace="ml")
    result = pipeline.mutate(pod("require", gpu="0.5"), ctx)
    assert not result.allowed
    assert "a100-od (1g.5gb, 3g.20gb; the spot capacity it requires (gpu-admission.io/spot: require))" in (
        result.message
    )
    assert result.message.endswith(
        "Ask for gpu-admission.io/spot: prefer (or tolerate) to let it run on demand there, or for a whole GPU"
        " (nvidia.com/gpu: 1)."
    )


@pytest.mark.parametrize("mode", [None, "never", "tolerate"])
def test_a_mig_refusal_names_spot_require_only_under_it(mode: str | None) -> None:
    """A pod that is not under require, whose own affinity keeps it to gke-spot, was told it was kept off the
    on-demand MIG pool by "the spot capacity it requires (gpu-admission.io/spot: require)", and to ask for prefer
    (found by a review of the spot policy): its own node affinity is named, and the advice is to change it."""
    from tests.mig_fixtures import mixed_node

    spot_node = node("spot-0", {GKE_SPOT: "true", NODEPOOL: "spot-l4"}, (f"{GKE_SPOT}=true:NoSchedule",), gpus=8)
    od_node = mixed_node("od-0", "NVIDIA-A100-SXM4-40GB", {"1g.5gb": 7, "3g.20gb": 2}, "a100-od", 40960)
    settings = Settings(cuda=CudaSettings(mode="off"), cluster=ClusterSettings(providers=["gke"]))
    ctx = Context(settings=settings, cluster=build_view([spot_node, od_node], settings), namespace="ml")
    own = with_terms({"matchExpressions": [expr(GKE_SPOT, "true")]})
    result = pipeline.mutate(pod(mode, gpu="0.5", affinity=own, tolerations=[equal(GKE_SPOT, "true")]), ctx)
    assert not result.allowed
    assert "a100-od (1g.5gb, 3g.20gb; its node affinity)" in result.message
    assert "spot: require" not in result.message and "spot: prefer" not in result.message


def test_prefer_warns_when_cuda_steering_leaves_it_no_spot_pool() -> None:
    """The spot pool's driver is too old for the image's CUDA 12.4; the cuda policy, after this one, steers the pod
    off it. Before, nothing said that the preference could not be met."""
    old = {"nvidia.com/cuda.driver-version.full": "525.105.17"}
    new = {"nvidia.com/cuda.driver-version.full": "550.54.15"}
    spot_node = node("spot-0", {GKE_SPOT: "true", NODEPOOL: "spot-l4", **old}, (f"{GKE_SPOT}=true:NoSchedule",))
    od_node = node("od-0", {NODEPOOL: "od-l4", **new})
    settings = Settings(mig=MigSettings(enabled=False), cluster=ClusterSettings(providers=["gke"]))
    ctx = Context(settings=settings, cluster=build_view([spot_node, od_node], settings), namespace="ml")
    obj = pod("prefer")
    obj["spec"]["containers"][0]["image"] = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    result = mutate(obj, ctx)
    why = "its nodeSelector, affinity or tolerations exclude every spot pool"
    assert f"spot prefer: {why}: it runs on demand (pool spot-l4)" in result.warnings
    steering = "as the webhook leaves them (its steering: gpu-admission.io/cuda, gpu-admission.io/mig)"
    assert (applied(result) or "").endswith(f"; {why}, {steering} (spot-l4)")
    assert "keeps it off pool spot-l4" in result.object["metadata"]["annotations"]["gpu-admission.io/cuda"]
    # A newer spot driver: nothing said.
    spot_node["metadata"]["labels"].update(new)
    ctx = Context(settings=settings, cluster=build_view([spot_node, od_node], settings), namespace="ml")
    assert not [w for w in mutate(obj, ctx).warnings if w.startswith("spot")]


GPU_TAINT = "nvidia.com/gpu=present:NoSchedule"


def _gke_gpu_pools(*spot_gpus: int) -> list[Any]:
    """A GKE cluster as its GPU pools come: an on-demand pool of 8 GPUs a node, and a spot pool of ``n`` GPUs a
    node for each ``n``, every GPU node with GKE's GPU taint."""
    spots = [_gke_spot_node(f"spot-{i}", f"spot-{n}x", n) for i, n in enumerate(spot_gpus)]
    return [node("od-0", {NODEPOOL: "h100"}, (GPU_TAINT,), gpus=8), *spots]


def _gke_spot_node(name: str, pool: str, gpus: int, *taints: str) -> Any:
    """A node of GKE spot pool ``pool`` of ``gpus`` GPUs, with GKE's spot and GPU taints and ``taints``."""
    return node(
        name, {GKE_SPOT: "true", NODEPOOL: pool}, (f"{GKE_SPOT}=true:NoSchedule", GPU_TAINT, *taints), gpus=gpus
    )


def _asking_gpus(mode: str, *gpus: str) -> Any:
    """A pod of one container per item of ``gpus``, each asking that many nvidia.com/gpu."""
    obj = pod(mode, gpu=gpus[0])
    for i, count in enumerate(gpus[1:]):
        obj["spec"]["containers"].append(
            {"name": f"side-{i}", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": count}}}
        )
    return obj


@pytest.mark.parametrize("gpus", [("2",), ("1", "1")], ids=["one-container", "two-containers"])
def test_a_pod_that_asks_more_gpus_than_a_spot_node_has_is_told_so(gpus: tuple[str, ...]) -> None:
    """A GKE spot pool of 1 GPU a node beside an on-demand one of 8: a pod that asks 2 (one container, or two of 1)
    was told that "no spot pool offers its nvidia.com/gpu" (under prefer: "...: it runs on demand (pool l4-spot)",
    which read as if the spot pool were on demand), and the spot pool offers it, 1 a node (found by a review of user
    journeys). The words say how many it asks, how many a spot node has, and what to change."""
    ctx = context(_gke_gpu_pools(1), providers=("gke",))
    said = "no spot node has 2 nvidia.com/gpu"
    # two app containers run together: their sum is what exceeds (a review: "ask at most 1" read as met), and the
    # pool then has no room in the warning
    where, pool = (" in main and side-0 together", "") if len(gpus) > 1 else ("", " (pool spot-1x: 1 per node)")
    assert mutate(_asking_gpus("require", *gpus), ctx).warnings == [
        f"spot require: {said}; ask at most 1{where} or add bigger spot nodes{pool}"
    ]
    result = mutate(_asking_gpus("prefer", *gpus), ctx)
    assert result.warnings == [f"spot prefer: {said}: it runs on demand; ask at most 1{where} for spot{pool}"]
    assert (applied(result) or "").endswith(f"; {said}; ask at most 1{where} for spot (spot-1x: 1 per node)")
    # spot pools of 1 and 4 GPUs a node: both named, with what their nodes have
    wide = context(_gke_gpu_pools(1, 4), providers=("gke",))
    assert mutate(_asking_gpus("require", "6"), wide).warnings == [
        "spot require: no spot node has 6 nvidia.com/gpu; ask at most 4 or add bigger spot nodes "
        "(pools spot-1x, spot-4x)"
    ]
    assert mutate(_asking_gpus("require", "4"), wide).warnings == []


def test_prefer_says_it_runs_on_demand_only_where_an_on_demand_pool_takes_it() -> None:
    """A spot and an on-demand pool of 1 GPU a node, a pod that asks 2 under prefer: it was told "no spot node has 2
    nvidia.com/gpu: it runs on demand", and no on-demand node has 2 either (found by a review: the cuda policy's
    warning said it stays Pending). So too where an untolerated sku=gpu taint and its count keep it off every pool.
    "It runs on demand" is said only where an on-demand pool its rules reach takes what it asks."""
    small = context([node("od-0", {NODEPOOL: "h100"}, (GPU_TAINT,)), _gke_spot_node("s", "spot-1x", 1)])
    assert mutate(_asking_gpus("prefer", "2"), small).warnings == [
        "spot prefer: no spot node has 2 nvidia.com/gpu; ask at most 1 for spot (pool spot-1x: 1 per node)"
    ]
    tainted = (f"{AKS_SCALESET}=spot:NoSchedule", "sku=gpu:NoSchedule")
    aks = [
        node("aks-od", {AKS_POOL: "gpuod"}, ("sku=gpu:NoSchedule",)),
        node("aks-spot", {AKS_POOL: "gpuspot", AKS_SCALESET: "spot"}, tainted),
    ]
    why = "spot prefer: its nodeSelector, affinity or tolerations exclude every spot pool"
    assert mutate(pod("prefer", gpu="4"), context(aks)).warnings == [f"{why} (pool gpuspot)"]
    # an on-demand pool that takes it: it runs there; so too a Karpenter NodePool, which launches a node of 4
    taken = mutate(pod("prefer", gpu="1"), context([AKS_ON_DEMAND, aks[1]])).warnings
    assert taken[0].endswith(": it runs on demand (pool gpuspot)")
    spot_group = node("s", {EKS: "SPOT", NODE_GROUP: "g5-spot"})
    karpenter = node("k", {"karpenter.sh/nodepool": "gpu", KARPENTER: "on-demand"})
    launched = context([spot_group, karpenter], providers=("eks", "karpenter"))
    assert mutate(pod("prefer", gpu="4"), launched).warnings == [
        "spot prefer: no spot node has 4 nvidia.com/gpu: it runs on demand; ask at most 1 for spot "
        "(pool g5-spot: 1 per node)"
    ]


def test_the_too_few_words_are_worked_out_once_per_snapshot_and_pod_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the reached spot pools say of the GPUs a pod asks is kept per snapshot (``ClusterView.policy_memo``), by
    the pod's node rules and amounts: it read every reached spot group on every request (4.1 ms a pod at 3,000 spot
    groups, against 1.4 ms before the too-few words; found by a review). A workload's replicas ask it again."""
    found: list[str] = []
    work = spot._too_few

    def counted(gpus: Any, reached: Any) -> Any:
        found.append("once")
        return work(gpus, reached)

    monkeypatch.setattr(spot, "_too_few", counted)
    ctx = context(_gke_gpu_pools(1), providers=("gke",))
    said = mutate(_asking_gpus("prefer", "2"), ctx).warnings
    once = len(found)
    assert once and said
    for _ in range(2):
        assert mutate(_asking_gpus("prefer", "2"), ctx).warnings == said
    assert len(found) == once, "worked out once for each shape of the pod"
    assert mutate(_asking_gpus("prefer", "3"), ctx).warnings != said  # another amount: its own words


def test_the_spot_pools_a_warning_names_are_sorted_once_per_snapshot() -> None:
    """A pod that reaches no spot pool (every CPU pod where spot.default is prefer and the spot pools are GPU pools)
    had the names of every spot pool sorted, and every spot group read, at each request: work growing with the
    cluster (found by a review). They are kept per snapshot (``ClusterView.policy_memo``), the same for each pod."""
    ctx = context(_gke_gpu_pools(4, 1), providers=("gke",))
    said = mutate(_asking_gpus("prefer", "8"), ctx).warnings
    assert said and spot._spot_pools(ctx) == (("spot-1x", "spot-4x"), True), spot._spot_pools(ctx)
    kept = spot._spot_pools(ctx)
    assert mutate(_asking_gpus("prefer", "8"), ctx).warnings == said
    assert spot._spot_pools(ctx) is kept, "made again for the same snapshot"


def test_the_too_few_words_name_the_container_that_asks_the_most() -> None:
    """An init container that asks 4 GPUs beside an app container of 1, spot nodes of 1: "ask at most 1" read as
    met, the app container asking 1 (found by a review). The words name the container that asks more than a spot
    node has; the pools are counted, or left to the annotation, where the words leave no room for their names."""
    ctx = context(_gke_gpu_pools(1), providers=("gke",))
    obj = _asking_gpus("require", "1")
    obj["spec"]["initContainers"] = [
        {"name": "warm", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
    ]
    said = "no spot node has 4 nvidia.com/gpu"
    assert mutate(obj, ctx).warnings == [
        f"spot require: {said}; ask at most 1 in init container warm or add bigger spot nodes (1 pool)"
    ]
    obj["metadata"]["annotations"][ANNOTATION] = "prefer"
    result = mutate(obj, ctx)
    assert result.warnings == [f"spot prefer: {said}: it runs on demand; ask at most 1 in init container warm for spot"]
    assert (applied(result) or "").endswith(
        f"; {said}; ask at most 1 in init container warm for spot (spot-1x: 1 per node)"
    )


def test_the_too_few_warning_keeps_the_pool_name_whole_before_its_gpus_a_node() -> None:
    """A spot pool named gpu-l4-spot-pool: prefer's too-few warning cut it to "gpu-l4-sp…" to keep ": 1 per node"
    (found by a review), and a cut name reads as another pool's. The GPUs a node go first (the annotation keeps
    them, and "ask at most 1" says them)."""
    spot_node = node("s", {GKE_SPOT: "true", NODEPOOL: "gpu-l4-spot-pool"}, (f"{GKE_SPOT}=true:NoSchedule", GPU_TAINT))
    ctx = context([_gke_gpu_pools()[0], spot_node], providers=("gke",))
    result = mutate(_asking_gpus("prefer", "2"), ctx)
    assert result.warnings == [
        "spot prefer: no spot node has 2 nvidia.com/gpu: it runs on demand; ask at most 1 for spot "
        "(pool gpu-l4-spot-pool)"
    ]
    assert (applied(result) or "").endswith("(gpu-l4-spot-pool: 1 per node)")


def test_a_pod_whose_rules_exclude_the_bigger_spot_pool_is_told_which_it_can_use() -> None:
    """Spot pools of 1 and 8 GPUs a node, a pod that selects the pool of 1 and asks 2: it was told "no spot node has
    2 nvidia.com/gpu; ask at most 1 or add bigger spot nodes", and spot-8x has them (found by a review): its own
    rules keep it off them. The words say no spot node it can use has 2, and name the pool that has."""
    ctx = context(_gke_gpu_pools(1, 8), providers=("gke",))
    said = "no spot node it can use has 2 nvidia.com/gpu"
    own = _asking_gpus("require", "2")
    own["spec"]["nodeSelector"] = {NODEPOOL: "spot-1x"}
    assert mutate(own, ctx).warnings == [f"spot require: {said}; ask at most 1 or use pool spot-8x"]
    own["metadata"]["annotations"][ANNOTATION] = "prefer"
    result = mutate(own, ctx)
    assert result.warnings == [f"spot prefer: {said}; ask at most 1 or use pool spot-8x"]  # it selects spot-1x
    assert (applied(result) or "").endswith(f"; {said} (spot-1x: 1 per node); ask at most 1 or use spot-8x")


@pytest.mark.parametrize("mode", ["prefer", "require"])
def test_the_bigger_spot_pool_is_named_whole_and_only_where_its_nodes_take_pods(mode: str) -> None:
    """A pod that selects a spot pool of 1 GPU a node and asks 2, the bigger spot pool of an ordinary name: under
    prefer the words cut it ("...or let it use pool ml-prod…"), and with a container named lost it ("...warm or …"),
    and a bigger pool whose nodes are all cordoned was offered (found by a review). The pool is named whole (under
    prefer, "it runs on demand" goes first: "no spot node it can use" says it), and a cordoned pool is not named."""
    cordoned = _gke_spot_node("spot-c", "a8-spot-draining", 8, "node.kubernetes.io/unschedulable:NoSchedule")
    cordoned["spec"]["unschedulable"] = True
    said = f"spot {mode}: no spot node it can use has 2 nvidia.com/gpu"
    for big, gpus, containers in (
        ("ml-prod-h100-spot-us-central1", ("2",), ""),
        ("h100-spot", ("1",), " in init container warm"),
    ):
        ctx = context([*_gke_gpu_pools(1), _gke_spot_node("spot-8", big, 8), cordoned], providers=("gke",))
        obj = _asking_gpus(mode, *gpus)
        obj["spec"]["nodeSelector"] = {NODEPOOL: "spot-1x"}
        if containers:
            obj["spec"]["initContainers"] = [
                {"name": "warm", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "2"}}}
            ]
        assert mutate(obj, ctx).warnings == [f"{said}; ask at most 1{containers} or use pool {big}"]


def test_the_prefer_annotation_names_six_pools_and_counts_the_rest() -> None:
    """Under prefer the spot-applied annotation named every spot pool it speaks of: at 3,000 spot pools, 2,250 bigger
    ones (15 kB) beside a pod that selects a pool of too few GPUs, and every pool beside a CPU pod kept off GPU pools
    (20 kB; found by a review). Six are named, the rest counted, as the warnings do."""
    big = [_gke_spot_node(f"b{i}", f"big-{i:02}", 8) for i in range(10)]
    ctx = context([*_gke_gpu_pools(1), *big], providers=("gke",))
    obj = _asking_gpus("prefer", "2")
    obj["spec"]["nodeSelector"] = {NODEPOOL: "spot-1x"}
    six = ", ".join(f"big-{i:02}" for i in range(6))
    assert (applied(mutate(obj, ctx)) or "").endswith(f"; ask at most 1 or use {six} and 4 more")
    said = "every spot pool is a GPU pool and it asks no GPU"
    assert (applied(mutate(pod("prefer", gpu=None), ctx)) or "").endswith(f"; {said} ({six} and 5 more)")


@pytest.mark.parametrize("mode", ["prefer", "require"])
def test_a_karpenter_nodepool_is_not_said_to_have_too_few_gpus_a_node(mode: str) -> None:
    """A Karpenter NodePool launches the instance type a pod needs: its spot nodes of 1 GPU now say nothing of the
    next one. A pod that asked 4 was told "no spot node has 4 nvidia.com/gpu; ask at most 1" (found by a review),
    and the NodePool would launch a spot node of 4. No words of amounts for such a pool."""

    def launched(name: str, capacity: str, gpus: int) -> Any:
        labels = {
            "karpenter.sh/nodepool": "gpu",
            KARPENTER: capacity,
            "karpenter.k8s.aws/instance-gpu-count": str(gpus),
            "node.kubernetes.io/instance-type": {1: "g5.xlarge", 8: "p4d.24xlarge"}[gpus],
        }
        return node(name, labels, gpus=gpus)

    ctx = context([launched("k1", "spot", 1), launched("k2", "on-demand", 8)], providers=("eks", "karpenter"))
    assert mutate(_asking_gpus(mode, "4"), ctx).warnings == []
    # Pinned to the instance type of 1 GPU (or its GPU count), it launches no node of 4: it was Pending for good,
    # not warned (found by a review)
    said = f"spot {mode}: no spot node has 4 nvidia.com/gpu; ask at most 1 or choose a bigger instance type"
    for pin in (
        {"nodeSelector": {"node.kubernetes.io/instance-type": "g5.xlarge"}},
        {"affinity": with_terms({"matchExpressions": [expr("karpenter.k8s.aws/instance-gpu-count", "1")]})},
    ):
        obj = _asking_gpus(mode, "4")
        obj["spec"].update(pin)
        # no on-demand node of 4 either (the pin keeps it off those to come): not "it runs on demand" (a review)
        assert mutate(obj, ctx).warnings == [f"{said} (pool gpu: 1 per node)"], pin
    # rules that let it onto a type of 4 or more, or a type no node of the pool has shown (the NodePool may launch
    # it), pin no small instance: they were told to choose a bigger instance type (found by a review)
    count = "karpenter.k8s.aws/instance-gpu-count"
    for rule in (
        expr("node.kubernetes.io/instance-type", "g5.xlarge", "g5.12xlarge"),
        expr(count, "1", "4"),
        {"key": count, "operator": "Lt", "values": ["9"]},
        {"key": count, "operator": "Gt", "values": ["3"]},
    ):
        obj = _asking_gpus(mode, "4")
        obj["spec"]["affinity"] = with_terms({"matchExpressions": [rule]})
        assert not any("instance type" in w for w in mutate(obj, ctx).warnings), rule


# ---------------------------------------------------------------------------------------------------------------
# A workload whose spot mode changes (found by the spot review): the webhook's earlier additions are taken out

GKE_NODES = [node("gke-spot", {GKE_SPOT: "true"}, (f"{GKE_SPOT}=true:NoSchedule",)), node("od")]


def _template(obj: Any) -> Any:
    return obj["spec"]["template"]


def _switched(obj: Any, mode: str) -> Any:
    """The workload as the apiserver has it, its template's spot annotation changed by the user."""
    changed = copy.deepcopy(obj)
    _template(changed)["metadata"]["annotations"][ANNOTATION] = mode
    return changed


@pytest.mark.parametrize("later", ["never", "tolerate"])
def test_a_workload_moved_off_require_no_longer_requires_spot(later: str) -> None:
    ctx = context(GKE_NODES, providers=("gke",))
    first = mutate(workload("Deployment", "require"), ctx).object
    assert required_of(_template(first)) == [{"matchExpressions": [expr(GKE_SPOT, "true")]}]
    result = mutate(_switched(first, later), ctx)
    template = _template(result.object)
    assert "affinity" not in template["spec"]
    said = template["metadata"]["annotations"][APPLIED]
    if later == "never":
        assert "removed what require had added: tolerations cloud.google.com/gke-spot=true:NoSchedule, its" in said
        assert "tolerations" not in template["spec"]
    else:
        # tolerate adds it again: not said to be removed (found by a review of the spot policy)
        assert "removed what require had added: its required spot affinity;" in said
        assert tolerations_of(template) == [equal(GKE_SPOT, "true")]
    # As the fresh workload of that mode would be, but for the words.
    fresh = _template(mutate(workload("Deployment", later), ctx).object)
    assert template["spec"] == fresh["spec"]


def test_what_was_taken_out_is_said_in_its_update_and_its_reinvocation_only() -> None:
    """The words stayed in the template's spot-applied for as long as the mode did: every later edit of the
    Deployment said again that require's additions were removed."""
    ctx = context(GKE_NODES, providers=("gke",))
    first = mutate(workload("Deployment", "require"), ctx).object
    switch = dataclasses.replace(ctx, operation="UPDATE", old_object=first)
    moved = mutate(_switched(first, "never"), switch).object
    said = _template(moved)["metadata"]["annotations"][APPLIED]
    assert "removed what require had added" in said
    assert mutate(copy.deepcopy(moved), switch).object == moved  # the apiserver calling again: the same answer
    edited = copy.deepcopy(moved)
    _template(edited)["spec"]["containers"][0]["image"] = "nvidia/cuda:12.4.1-base-ubuntu22.04"
    later = mutate(edited, dataclasses.replace(ctx, operation="UPDATE", old_object=moved))
    assert APPLIED not in _template(later.object)["metadata"]["annotations"]
    assert _template(later.object)["spec"] == _template(edited)["spec"]


def test_the_users_own_terms_stay_when_the_spot_ones_go() -> None:
    ctx = context(GKE_NODES, providers=("gke",))
    obj = workload("Deployment", "require")
    _template(obj)["spec"]["affinity"] = with_terms(ZONE_A, ZONE_B)
    _template(obj)["spec"]["tolerations"] = [equal("dedicated", "ml")]
    first = mutate(obj, ctx).object
    assert len(required_of(_template(first)) or []) == 2  # each zone ANDed with spot
    prefer = mutate(_switched(first, "prefer"), ctx).object
    assert required_of(_template(prefer)) == [ZONE_A, ZONE_B]
    assert preferred_of(_template(prefer)) == [
        {"weight": 100, "preference": {"matchExpressions": [expr(GKE_SPOT, "true")]}}
    ]
    assert "removed what require had added" in _template(prefer)["metadata"]["annotations"][APPLIED]
    _template(prefer)["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"].insert(
        0, PREF
    )
    never = _template(mutate(_switched(prefer, "never"), ctx).object)
    assert required_of(never) == [ZONE_A, ZONE_B] and preferred_of(never) == [PREF]
    assert tolerations_of(never) == [equal("dedicated", "ml")]
    assert "removed what prefer had added" in never["metadata"]["annotations"][APPLIED]


def test_a_pods_forged_earlier_mode_takes_nothing_out() -> None:
    obj = pod(
        "never",
        tolerations=[equal(GKE_SPOT, "true")],
        affinity=with_terms({"matchExpressions": [expr(GKE_SPOT, "true")]}),
    )
    obj["metadata"]["annotations"][APPLIED] = (
        "require (asked by annotation); tolerates cloud.google.com/gke-spot=true:NoSchedule"
    )
    result = mutate(obj, context(GKE_NODES, providers=("gke",)))
    assert tolerations_of(result.object) == [equal(GKE_SPOT, "true")]
    assert required_of(result.object) == [{"matchExpressions": [expr(GKE_SPOT, "true")]}]


@pytest.mark.parametrize(
    ("nodes", "extra", "kept"),
    [
        pytest.param(
            [node("o1", {OKE: "true"}, (f"{OKE}=true:NoSchedule",))],
            TaintSpec(OKE, "true", "NoSchedule"),
            f"{OKE}:NoSchedule",
            id="oke-preset-exists-covers-a-setting-with-a-value",
        ),
        pytest.param(
            [node("a1", {AKS_SCALESET: "spot", AKS_PRIORITY: "spot"}, (f"{AKS_SCALESET}=spot:NoSchedule",))],
            TaintSpec(AKS_SCALESET, "", "NoSchedule"),
            f"{AKS_SCALESET}:NoSchedule",
            id="a-setting-without-value-covers-the-aks-preset",
        ),
    ],
)
def test_a_toleration_another_covers_is_not_added(nodes: list[Any], extra: TaintSpec, kept: str) -> None:
    """A setting that names a preset's taint key in another form: one toleration for the taint, the one that
    covers the other, and the annotation names only it."""
    obj = pod("tolerate")
    result = pipeline.mutate(copy.deepcopy(obj), context(nodes, extra_taints=[extra]))
    assert jsonpatch.apply_patch(copy.deepcopy(obj), result.patch) == result.object
    tolerations = result.object["spec"]["tolerations"]
    assert [spot.Wanted(t["key"], t.get("value"), t["effect"]) for t in tolerations] == [spot.parse_wanted(kept)]
    assert f"tolerates {kept} (" in (applied(result) or "")


def test_a_template_whose_gpu_is_left_to_its_pods_is_not_warned_of_unreachable_spot() -> None:
    """A gpu-memory request stays in the template (its pods are converted): it names no GPU resource there, so the
    spot pools' GPU taint would seem to keep it off them; whether its pods reach spot is told on the pods (found by a
    review of the policies together)."""
    obj = workload("Deployment", "require")
    container = obj["spec"]["template"]["spec"]["containers"][0]
    container["resources"] = {"limits": {"gpu-admission.io/gpu-memory": "20Gi"}}
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    spot_gpu = node("s1", {AKS_SCALESET: "spot", AKS_PRIORITY: "spot"}, (f"{AKS_SCALESET}=spot:NoSchedule",))
    spot_gpu["spec"]["taints"].append(gpu_taint)
    result = pipeline.mutate(obj, context([spot_gpu]))
    assert not [w for w in result.warnings if "exclude every spot pool" in w], result.warnings


COREWEAVE_POOL = "compute.coreweave.com/node-pool"


@pytest.mark.parametrize("providers", [("coreweave",), ("all",)])
def test_require_where_nothing_tells_spot_nodes_apart_is_denied_with_how_to_declare_them(
    providers: tuple[str, ...],
) -> None:
    """CoreWeave's spot pools carry no spot label (nor taint): with no pool declared spot, require had no label to
    require. Found by a review of provider journeys: with providers [coreweave] the pod was admitted with no
    affinity and ran on demand ("requires  (none of these labels ...)"); with [all], every other cloud's spot
    labels were required, which CoreWeave nodes never carry: Pending for good."""
    nodes = [node("g1", {COREWEAVE_POOL: "h100-reserved"}), node("g2", {COREWEAVE_POOL: "h100-spot"})]
    result = pipeline.mutate(pod("require"), context(nodes, providers=providers))
    assert not result.allowed
    assert result.reason == "SpotRequireUnplaceable"
    assert "nothing tells this cluster's spot nodes apart: the coreweave preset labels no spot node" in result.message
    assert f"nodeSelector {{{COREWEAVE_POOL}: <pool>}} and spot: true" in result.message
    declared = PoolSettings(name="h100-spot", node_selector={COREWEAVE_POOL: "h100-spot"}, spot=True)
    result = mutate(pod("require"), context(nodes, providers=providers, pools=(declared,)))
    assert result.allowed
    assert required_of(result.object) == [{"matchExpressions": [expr(COREWEAVE_POOL, "h100-spot")]}]
    assert result.warnings == []


NOT_EKS_SPOT = [
    {"key": EKS, "operator": "NotIn", "values": ["SPOT"]},
    # Karpenter makes nodes on EKS, from zero: kept off its spot label too, which no node carries here
    {"key": KARPENTER, "operator": "NotIn", "values": ["spot"]},
]
EKS_SPOT_TEXT = f"{EKS}=SPOT or {KARPENTER}=spot"


@pytest.mark.parametrize("value", ["never", "false"])
def test_never_keeps_off_spot_nodes_that_carry_no_taint(value: str) -> None:
    """EKS (and Karpenter, CoreWeave) spot nodes carry no taint, so a pod that said never was as free to land there
    as any other; the MIG policy even chose a spot pool's profile for it (found by a review of provider journeys)."""
    nodes = [node("spot", {EKS: "SPOT"}), node("on-demand", {EKS: "ON_DEMAND"})]
    result = mutate(pod(value), context(nodes))
    assert required_of(result.object) == [{"matchExpressions": NOT_EKS_SPOT}]
    assert applied(result) == (
        "never (asked by annotation); keeps off spot capacity, whose nodes it would tolerate: requires none of"
        f" {EKS_SPOT_TEXT}"
    )
    assert result.outcome.mutations == ["spot-affinity"] and result.warnings == []
    # a template moved to tolerate loses it again, and is as a fresh workload of that mode
    ctx = context(nodes)
    first = mutate(workload("Deployment", value), ctx).object
    assert required_of(_template(first)) == [{"matchExpressions": NOT_EKS_SPOT}]
    moved = _template(mutate(_switched(first, "tolerate"), ctx).object)
    assert "affinity" not in moved["spec"]
    assert (
        "removed what never had added: its required affinity off spot capacity"
        in (moved["metadata"]["annotations"][APPLIED])
    )


@pytest.mark.parametrize("provider", ["aks", "oke"])
def test_never_adds_nothing_for_spot_nodes_that_always_come_tainted(provider: str) -> None:
    """AKS and OKE taint every spot node they make: with no spot node now, never added NotIn on their spot labels to
    every pod all the same, where it had added nothing (found by a review of the spot policy: a never default would
    have rolled every Deployment on its next edit). A pod that tolerates those taints is still kept off them."""
    if provider == "aks":
        on_demand = node("aks-od", {"kubernetes.azure.com/agentpool": "gpuod"})
        key, value = AKS_SCALESET, "spot"
    else:
        on_demand = node("oke-od")
        on_demand["metadata"]["annotations"] = {"oci.oraclecloud.com/node-pool-id": "ocid1.nodepool.oc1.od"}
        key, value = OKE, "true"
    ctx = context([on_demand])
    assert ctx.cluster.providers == {provider}
    assert mutate(pod("never"), ctx).patch == []
    assert mutate(workload("Deployment", "never"), ctx).patch == []
    tolerant = mutate(pod("never", tolerations=[equal(key, value)]), ctx)
    assert {"key": key, "operator": "NotIn", "values": [value]} in (required_of(tolerant.object) or [{}])[0][
        "matchExpressions"
    ]
    assert (applied(tolerant) or "").startswith(f"never (asked by annotation); {spot.KEPT_OFF_UNREACHED}")


def test_never_adds_nothing_for_a_declared_spot_pool_whose_taints_keep_the_pod_off() -> None:
    """An AKS spot pool declared at zero carries AKS's spot taint: never gave a pod that does not tolerate it NotIn
    on the pool and on AKS's spot labels all the same, noise in its affinity. A pool's own declared taint counts
    too, beside an EKS cluster's untainted spot nodes, whose label is still kept off; a pod that tolerates the
    taints is kept off them all."""
    aks_pool = PoolSettings(name="gpuspot", node_selector={AKS_POOL: "gpuspot"}, spot=True)
    ctx = context([AKS_ON_DEMAND], providers=("aks",), pools=(aks_pool,))
    assert mutate(pod("never"), ctx).patch == []
    tolerant = mutate(pod("never", tolerations=[equal(AKS_SCALESET, "spot")]), ctx)
    assert [e["key"] for e in (required_of(tolerant.object) or [{}])[0]["matchExpressions"]] == [
        AKS_PRIORITY,
        AKS_SCALESET,
        AKS_POOL,
    ]
    eks_pool = PoolSettings(
        name="tainted", node_selector={NODE_GROUP: "tainted"}, spot=True, taints=[TaintSpec("dedicated", "spot")]
    )
    ctx = context([node("od", {EKS: "ON_DEMAND", NODE_GROUP: "od"})], pools=(eks_pool,))
    result = mutate(pod("never"), ctx)
    assert required_of(result.object) == [{"matchExpressions": NOT_EKS_SPOT}]
    assert (applied(result) or "").endswith(f"requires none of {EKS_SPOT_TEXT}")
    tolerant = mutate(pod("never", tolerations=[exists("dedicated")]), ctx)
    assert (applied(tolerant) or "").endswith(f"{EKS_SPOT_TEXT} or pool tainted ({NODE_GROUP}=tainted)")


def test_a_gated_never_pod_is_kept_off_a_spot_pool_whose_taint_its_ungating_may_tolerate() -> None:
    """Kueue takes a pod's gate away and may add its ResourceFlavor's tolerations and nodeSelector in the same update:
    a gated never pod got no NotIn where an AKS spot pool was declared at zero (its taint was taken to keep the pod
    off), and once ungated onto the pool's tolerations and selector it ran on spot."""
    aks_pool = PoolSettings(name="gpuspot", node_selector={AKS_POOL: "gpuspot"}, spot=True)
    ctx = context([AKS_ON_DEMAND], providers=("aks",), pools=(aks_pool,))
    gated = pod("never")
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    result = mutate(gated, ctx)
    keys = [e["key"] for e in (required_of(result.object) or [{}])[0].get("matchExpressions", [])]
    assert keys == [AKS_PRIORITY, AKS_SCALESET, AKS_POOL]
    assert mutate(pod("never"), ctx).patch == []  # not gated: the taint keeps it off


def test_a_gated_never_pod_whose_only_gpu_pool_is_tainted_spot_is_kept_off_it_and_told_why_it_may_wait() -> None:
    """The gated pod is judged to tolerate every taint (Kueue may add its spot flavor's), and that leaked into the
    words: it was told its own rules left it only spot pools, and got no NotIn. Kept off them, and told the truth:
    only spot pools offer it, so once ungated it waits for on-demand capacity; the words say what it reaches now."""
    tainted = node("aks-spot", {AKS_POOL: "gpuspot", AKS_SCALESET: "spot"}, (f"{AKS_SCALESET}=spot:NoSchedule",))
    gated = pod("never")
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    result = mutate(gated, context([tainted], providers=("aks",)))
    assert required_of(result.object) == [{"matchExpressions": [{**expr(AKS_SCALESET, "spot"), "operator": "NotIn"}]}]
    assert (applied(result) or "").endswith(f"{spot.KEPT_OFF_UNREACHED}{AKS_SCALESET}=spot")
    assert result.warnings == [
        "spot never, yet only spot pool gpuspot can offer what it asks: once ungated, Pending until on-demand ones do"
    ]


def test_never_keeps_off_aks_spot_nodes_whose_spot_taint_was_taken_off() -> None:
    """AKS taints every spot node, but a node-taint manager may take the taint off: never trusted the preset over
    the nodes, added no NotIn, and the scheduler put the pod on spot. The nodes there now say it; where they carry
    the taint, nothing is added still."""
    spot_node = node("aks-spot", {AKS_POOL: "gpuspot", AKS_SCALESET: "spot"})
    result = mutate(pod("never"), context([AKS_ON_DEMAND, spot_node], providers=("aks",)))
    assert required_of(result.object) == [{"matchExpressions": [{**expr(AKS_SCALESET, "spot"), "operator": "NotIn"}]}]
    assert (applied(result) or "").endswith(f"{spot.KEPT_OFF}{AKS_SCALESET}=spot")
    tainted = node("aks-spot", {AKS_POOL: "gpuspot", AKS_SCALESET: "spot"}, (f"{AKS_SCALESET}=spot:NoSchedule",))
    assert mutate(pod("never"), context([AKS_ON_DEMAND, tainted], providers=("aks",))).patch == []


@pytest.mark.parametrize(
    "leaving",
    [
        pytest.param({"unschedulable": True}, id="cordoned"),
        pytest.param({"taints": [taint("node.kubernetes.io/not-ready:NoSchedule")]}, id="not-ready"),
    ],
)
def test_never_keeps_off_an_untainted_aks_spot_node_that_is_cordoned_or_not_ready(leaving: dict[str, Any]) -> None:
    """An AKS spot node whose spot taint was taken off, cordoned or not ready now, seemed out of the pod's reach:
    no NotIn was added, and once the node took pods again the never pod could land on spot."""
    spot_node = node("aks-spot", {AKS_POOL: "gpuspot", AKS_SCALESET: "spot"})
    spot_node["spec"].update(leaving)
    result = mutate(pod("never"), context([AKS_ON_DEMAND, spot_node], providers=("aks",)))
    assert required_of(result.object) == [{"matchExpressions": [{**expr(AKS_SCALESET, "spot"), "operator": "NotIn"}]}]
    assert (applied(result) or "").endswith(f"{spot.KEPT_OFF_UNREACHED}{AKS_SCALESET}=spot")


@pytest.mark.parametrize(("key", "on_demand", "spot"), [(EKS, "ON_DEMAND", "SPOT"), (KARPENTER, "on-demand", "spot")])
def test_never_keeps_off_the_spot_nodes_an_autoscaler_may_add(key: str, on_demand: str, spot: str) -> None:
    """On a cluster whose nodes are all on demand now, never added nothing: Karpenter (spot first where its NodePool
    allows both) or an EKS spot node group scaled up from zero could then start an untainted spot node for the pod.
    Every node there carries the capacity-type label, so the pod is kept off its spot value all the same; a cluster
    that shows no provider (k3s) names no spot label, and nothing is added there."""
    nodes = [node("on-demand", {key: on_demand})]
    result = mutate(pod("never"), context(nodes))
    want = [{"key": key, "operator": "NotIn", "values": [spot]}]
    if key == EKS:  # Karpenter makes nodes on EKS: kept off its label too
        want.append({"key": KARPENTER, "operator": "NotIn", "values": ["spot"]})
    assert required_of(result.object) == [{"matchExpressions": want}]
    assert (applied(result) or "").endswith(f"requires none of {key}={spot}" + (f" or {KARPENTER}=spot" * (key == EKS)))
    again = mutate(result.object, context(nodes))
    assert again.patch == [] and applied(again) == applied(result)  # the second pass says the same
    assert mutate(pod("never"), context([ON_DEMAND])).patch == []  # no provider shows: no spot label to keep off


EVERY_SPOT_PLACE = [
    (GKE_SPOT, "true"),
    (GKE_PREEMPTIBLE, "true"),
    (EKS, "SPOT"),
    (KARPENTER, "spot"),
    (AKS_PRIORITY, "spot"),
    (AKS_SCALESET, "spot"),
    (OKE, "true"),
]
NOT_EVERY_SPOT_PLACE = [{"key": k, "operator": "NotIn", "values": [v]} for k, v in EVERY_SPOT_PLACE]


def test_never_keeps_off_every_spot_place_where_the_cluster_is_not_known() -> None:
    """With no node list yet and no pool declared, never did nothing and said nothing, while require was kept to
    every provider's spot labels: an EKS, Karpenter or CoreWeave spot node, untainted, took the pod (found by a
    review of the spot policy). It is kept off them all; a NotIn on a label no node carries harms no node."""
    result = mutate(pod("never"), context([]))
    assert required_of(result.object) == [{"matchExpressions": NOT_EVERY_SPOT_PLACE}]
    assert applied(result) == "never (asked by annotation); " + spot.KEPT_OFF_UNKNOWN + " or ".join(
        f"{k}={v}" for k, v in EVERY_SPOT_PLACE
    )
    assert result.outcome.mutations == ["spot-affinity"] and result.warnings == []
    # once the nodes are known, the pod keeps it, said as the cluster is now
    nodes = [node("spot", {EKS: "SPOT"}), node("on-demand", {EKS: "ON_DEMAND"})]
    known = mutate(result.object, context(nodes))
    assert required_of(known.object) == [{"matchExpressions": NOT_EVERY_SPOT_PLACE}]
    assert (applied(known) or "").startswith(f"never (asked by annotation); {KEPT_OFF}{GKE_SPOT}=true or ")
    # a template moved to tolerate loses it, whatever the view shows then
    first = mutate(workload("Deployment", "never"), context([])).object
    for view in ([], nodes):
        moved = _template(mutate(_switched(first, "tolerate"), context(view)).object)
        assert "affinity" not in moved["spec"]
        assert (
            "removed what never had added: its required affinity off spot capacity"
            in (moved["metadata"]["annotations"][APPLIED])
        )


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        pytest.param(
            {"nodeSelector": {GKE_SPOT: "true"}}, "its nodeSelector or affinity pins it to spot capacity", id="selector"
        ),
        pytest.param(
            {"affinity": with_terms({"matchExpressions": [expr(KARPENTER, "spot")]}, and_(ZONE_A, expr(EKS, "SPOT")))},
            "its nodeSelector or affinity pins it to spot capacity",
            id="every-term",
        ),
        pytest.param({"nodeName": "n1"}, "it is bound to a node", id="bound"),
        pytest.param({"affinity": with_terms(HOST)}, "it is bound to a node", id="bound-by-match-fields"),
        pytest.param({"nodeSelector": {NODE_GROUP: "gpu-spot"}}, "its nodeSelector chooses its place", id="node-group"),
        pytest.param(
            {"nodeSelector": {"kubernetes.io/hostname": "n1"}}, "its nodeSelector chooses its place", id="host-selector"
        ),
        pytest.param(
            {"affinity": with_terms({"matchExpressions": [expr(NODE_GROUP, "gpu-spot")]})},
            "its node affinity chooses its place",
            id="node-group-term",
        ),
        pytest.param(
            {"affinity": with_terms(and_(ZONE_A, expr(NODE_GROUP, "gpu-spot", "gpu-od")), HOST)},
            "its node affinity chooses its place",
            id="node-group-and-host-terms",
        ),
        pytest.param({"affinity": with_terms({"matchExpressions": [expr(KARPENTER, "spot")]}, ZONE_A)}, "", id="free"),
        pytest.param({"affinity": with_terms(HOST, ZONE_A)}, "", id="one-term-unbound"),
        pytest.param(
            {"affinity": with_terms({"matchExpressions": [expr(NODE_GROUP, "gpu-spot")]}, ZONE_A)},
            "",
            id="one-term-free-of-node-groups",
        ),
        pytest.param({"nodeSelector": {"kubernetes.io/os": "linux"}}, "", id="os-selector"),
        pytest.param({"nodeSelector": {"beta.kubernetes.io/arch": "amd64"}}, "", id="beta-arch-selector"),
        pytest.param({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}, "", id="gpu-selector"),
        pytest.param({"nodeSelector": {"node.kubernetes.io/instance-type": "p4d.24xlarge"}}, "", id="instance-type"),
        # eksctl's node group label, and one of the user's own, choose a place too (found by a review: a list of the
        # presets' pool labels narrowed them, and a pod on an eksctl spot node group was Pending for good)
        pytest.param(
            {"nodeSelector": {"alpha.eksctl.io/nodegroup-name": "gpu-spot"}},
            "its nodeSelector chooses its place",
            id="eksctl-node-group",
        ),
        pytest.param(
            {"affinity": with_terms({"matchExpressions": [expr("node.kubernetes.io/lifecycle", "spot")]})},
            "its node affinity chooses its place",
            id="own-label-term",
        ),
        pytest.param({"nodeSelector": {"topology.kubernetes.io/zone": "us-east-1a"}}, "", id="zone-selector"),
        # Karpenter on AWS's instance properties and zone id say nothing of capacity, as the instance type does (found
        # by a review: a pod selecting an L4 by karpenter.k8s.aws/instance-gpu-name was left on spot capacity); its
        # EC2NodeClass and a capacity reservation choose a place
        pytest.param({"nodeSelector": {"karpenter.k8s.aws/instance-gpu-name": "l4"}}, "", id="karpenter-gpu-name"),
        pytest.param(
            {"affinity": with_terms({"matchExpressions": [expr("karpenter.k8s.aws/instance-family", "g6", "g6e")]})},
            "",
            id="karpenter-instance-family-term",
        ),
        pytest.param({"nodeSelector": {"topology.k8s.aws/zone-id": "use1-az1"}}, "", id="aws-zone-id"),
        # the same of EKS Auto Mode's and Karpenter on Azure's (found by the last read: only AWS's were known)
        pytest.param({"nodeSelector": {"eks.amazonaws.com/instance-gpu-name": "l4"}}, "", id="eks-auto-gpu-name"),
        pytest.param({"nodeSelector": {"karpenter.azure.com/sku-gpu-name": "A100"}}, "", id="azure-sku-gpu-name"),
        pytest.param(
            {"nodeSelector": {"karpenter.k8s.aws/ec2nodeclass": "gpu"}},
            "its nodeSelector chooses its place",
            id="karpenter-node-class",
        ),
        pytest.param(
            {"nodeSelector": {"karpenter.k8s.aws/capacity-reservation-id": "cr-0123"}},
            "its nodeSelector chooses its place",
            id="karpenter-capacity-reservation",
        ),
    ],
)
def test_never_where_the_cluster_is_not_known_leaves_a_pod_pinned_to_spot_as_it_is(spec: Any, why: str) -> None:
    """Where no node tells where its own rules lead, a pod they pin to spot capacity, a bound one (by nodeName, or
    by matchFields in every term, as the DaemonSet controller binds its pods), or one whose nodeSelector or every
    required term chooses its place (an EKS node group, which may be spot; a node) is not kept off every spot
    place: that would leave it no node (on a known cluster, its rules leaving it only spot pools are warned of
    instead, as here; a DaemonSet's pod for a spot node, and a pod selecting a spot node group, were Pending for
    good, not warned of: found by a review of the spot policy; one selecting it by its affinity still was, found by
    a review of that fix). One term free of them is narrowed as any pod, and so is a nodeSelector on what says
    nothing of capacity (the OS, the architecture, a GPU model, an instance type: those were left on spot capacity,
    found by the same review)."""
    obj = pod("never")
    obj["spec"].update(copy.deepcopy(spec))
    result = mutate(obj, context([]))
    if why:
        assert result.patch == []
        assert result.warnings == [f"spot never, yet {why}: not kept off spot capacity (no node known yet)"]
        return
    assert result.warnings == []
    terms = required_of(obj) or [{}]  # each of its own terms, or one where it has none, ANDed with every NotIn
    assert required_of(result.object) == [and_(t, *NOT_EVERY_SPOT_PLACE) for t in terms]


def test_never_keeps_off_a_gke_spot_pool_at_zero() -> None:
    """GKE labels only its spot nodes, and taints them only where the pool was made so: with no spot node now,
    never added nothing, and the autoscaler could scale up an untainted spot pool for the pod (found by a review of
    the spot policy). The cluster shows GKE: the pod is kept off its spot labels, which harms no node. Where GKE's
    spot nodes are there now, tainted, their taint keeps the pod off, and nothing is added."""
    on_demand = node("gke-od", {"cloud.google.com/gke-nodepool": "l4-od"})
    result = mutate(pod("never"), context([on_demand]))
    assert required_of(result.object) == [
        {
            "matchExpressions": [
                {"key": GKE_SPOT, "operator": "NotIn", "values": ["true"]},
                {"key": GKE_PREEMPTIBLE, "operator": "NotIn", "values": ["true"]},
            ]
        }
    ]
    assert (applied(result) or "").endswith(f"requires none of {GKE_SPOT}=true or {GKE_PREEMPTIBLE}=true")
    assert mutate(pod("never"), context([on_demand, *PROVIDERS["gke"][0]])).patch == []


@pytest.mark.parametrize("providers", [("eks", "karpenter"), ("all",)])
def test_a_karpenter_nodepool_at_zero_is_kept_off_and_required_by_its_label(providers: tuple[str, ...]) -> None:
    """An EKS managed node group on demand beside a Karpenter GPU NodePool at zero: no node carries Karpenter's
    capacity-type label, and only EKS's was kept, so never let Karpenter launch an untainted spot node for the pod,
    and require named a label Karpenter cannot launch a node for: Pending for good (found by a review of the spot
    policy). The labels of providers the settings name, or that make nodes from zero where their cloud shows, are
    kept: a NotIn on a label no node carries, or one more alternative of the OR, harms no node."""
    on_demand = node("eks-od", {EKS: "ON_DEMAND", "eks.amazonaws.com/nodegroup": "gpu-od"})
    on_demand["status"]["nodeInfo"] = {"kubeletVersion": "v1.30.4-eks-a737599"}
    ctx = context([on_demand], providers=providers)
    never = mutate(pod("never"), ctx)
    assert required_of(never.object) == [{"matchExpressions": NOT_EKS_SPOT}]
    assert (applied(never) or "").endswith(f"requires none of {EKS_SPOT_TEXT}")
    required = mutate(pod("require"), ctx)
    assert required_of(required.object) == [
        {"matchExpressions": [expr(EKS, "SPOT")]},
        {"matchExpressions": [expr(KARPENTER, "spot")]},
    ]
    assert tolerations_of(required.object) == []  # neither taints its spot nodes
    # Karpenter's label is no guess where no cloud it runs on shows (a k3s cluster is still refused)
    assert not pipeline.mutate(pod("require"), context([ON_DEMAND])).allowed


def test_a_provider_shown_by_its_kubelets_alone_names_no_spot_place() -> None:
    """An EKS cluster of self-managed node groups shows EKS by its kubelet versions alone: its spot nodes carry no
    eks.amazonaws.com/capacityType (only managed node groups set it; these are labelled lifecycle=spot by their
    owner). require was admitted requiring EKS's label, Pending for good (found by a review of the spot policy).
    Karpenter's label is kept (``test_karpenter_runs_on_a_cloud_shown_by_its_kubelets_alone``). The kubelet
    version still counts for the tolerations (and ExtendedResourceToleration)."""
    nodes = [_self_managed("sm-od"), _self_managed("sm-spot", {"node.kubernetes.io/lifecycle": "spot"})]
    ctx = context(nodes)
    assert ctx.cluster.providers == {"eks"} and ctx.cluster.extended_resource_toleration
    places = required_of(mutate(pod("require"), ctx).object)
    assert places == [{"matchExpressions": [expr(KARPENTER, "spot")]}]  # not EKS's
    assert EKS not in str(required_of(mutate(pod("never"), ctx).object))
    # declared as the settings say, it is required so
    declared = context(nodes, extra_labels={"node.kubernetes.io/lifecycle": "spot"})
    required = mutate(pod("require"), declared)
    assert required_of(required.object) == [
        {"matchExpressions": [expr(KARPENTER, "spot")]},
        {"matchExpressions": [expr("node.kubernetes.io/lifecycle", "spot")]},
    ]
    # the settings naming EKS (its managed node groups at zero) keep its label
    assert required_of(mutate(pod("require"), context(nodes, providers=("eks",))).object) == [
        {"matchExpressions": [expr(EKS, "SPOT")]}
    ]


def test_karpenter_runs_on_a_cloud_shown_by_its_kubelets_alone() -> None:
    """A self-managed EKS cluster (EKS shown by its kubelet versions alone) with a Karpenter NodePool at zero: read
    from the providers shown by their labels, Karpenter's spot label was dropped with EKS's, never added nothing
    (Karpenter could launch a spot node for the pod) and require was refused, where it had been admitted (found by
    a review of the spot policy). Karpenter runs on EKS, however EKS shows: its label is kept, and require, on it
    alone, says that the pod runs only where Karpenter is installed (a cluster without it: Pending, not refused)."""
    ctx = context([_self_managed("sm-1"), _self_managed("sm-2")])
    required = mutate(pod("require"), ctx)
    assert required.allowed, required.message
    assert required_of(required.object) == [{"matchExpressions": [expr(KARPENTER, "spot")]}]
    assert required.warnings == [
        "spot require: no GPU node or pool is spot capacity now; Pending until karpenter (if installed) adds a GPU"
        " spot node"
    ]
    assert (applied(required) or "").endswith(f"requires {KARPENTER}=spot{spot.NOT_ON_CLUSTER}")
    never = mutate(pod("never"), ctx)
    assert required_of(never.object) == [
        {"matchExpressions": [{"key": KARPENTER, "operator": "NotIn", "values": ["spot"]}]}
    ]
    assert (applied(never) or "").endswith(f"requires none of {KARPENTER}=spot")
    # where a managed node group shows EKS by its labels, the pod may wait for either: no word of Karpenter
    managed = node("eks-od", {EKS: "ON_DEMAND", "eks.amazonaws.com/nodegroup": "gpu-od"})
    both = mutate(pod("require"), context([managed, _self_managed("sm-1")]))
    assert both.warnings == [
        "spot require: no GPU node or pool is spot capacity now; Pending until a GPU spot node joins"
    ]


def test_never_says_the_same_on_a_second_pass_where_the_spot_nodes_are_out_of_reach() -> None:
    """EKS on-demand GPU nodes beside Karpenter spot nodes of CPUs: the first pass kept the pod off the EKS label's
    spot value only, and a second (reinvocation; a Deployment's pods) added the Karpenter one, rewriting the words
    (found by a review of this session's commits)."""
    cpu_spot = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "cpu-spot", "labels": {KARPENTER: "spot"}},
        "spec": {"taints": []},
        "status": {"allocatable": {"cpu": "8"}},
    }
    ctx = context([node("gpu-od", {EKS: "ON_DEMAND"}), cpu_spot])
    for obj in (pod("never"), workload("Deployment", "never")):
        first = mutate(obj, ctx)
        second = mutate(first.object, ctx)
        assert required_of(first.object if obj["kind"] == "Pod" else _template(first.object)) is not None
        assert second.patch == [] and applied(second) == applied(first), second.patch


def test_never_adds_nothing_where_the_spot_nodes_taint_keeps_the_pod_off() -> None:
    tainted = [*PROVIDERS["gke"][0], ON_DEMAND]
    assert mutate(pod("never"), context(tainted)).patch == []
    # unless the pod tolerates that taint itself: then its never needs the affinity
    tolerant = pod("never", tolerations=[{"operator": "Exists"}])
    assert required_of(mutate(tolerant, context(tainted)).object) == [
        {"matchExpressions": [{"key": GKE_SPOT, "operator": "NotIn", "values": ["true"]}]}
    ]
    # and where its own rules leave it only spot pools, it is told, not left matching no node
    only_spot = pod("never", tolerations=[{"operator": "Exists"}])
    only_spot["spec"]["nodeSelector"] = {GKE_SPOT: "true"}
    result = mutate(only_spot, context(tainted))
    assert required_of(result.object) is None
    assert result.warnings == [
        "spot never, yet its nodeSelector, affinity or tolerations leave it only spot pool spot-l4"
    ]


KEPT_OFF = "keeps off spot capacity, whose nodes it would tolerate: requires none of "


def test_never_keeps_its_affinity_on_a_second_pass_after_the_cuda_steering() -> None:
    """The cuda policy steers a never pod, after the spot policy, to the pools whose driver runs it; the spot pool's
    is too old. Judged again on reinvocation (or at a workload's next review) with that steering on, the pod seemed
    to reach no spot pool, and the second pass took the annotation away (found by a review of the session's diff):
    the affinity an earlier pass says it added stays, with the same words."""
    from tests.cuda_fixtures import container, gpu_node
    from tests.cuda_fixtures import context as cuda_context
    from tests.cuda_fixtures import pod as cuda_pod

    nodes = [
        gpu_node("s1", "spot-old", "535.104.05", labels={EKS: "SPOT"}),
        gpu_node("n1", "on-demand-new", "570.124.06", labels={EKS: "ON_DEMAND"}),
        gpu_node("o1", "on-demand-old", "535.104.05", labels={EKS: "ON_DEMAND"}),
    ]
    ctx = cuda_context(nodes)
    image = "pytorch/pytorch-nightly:2700000-cu12.8"  # CUDA 12.8: driver 570 runs it, 535 does not
    result = mutate(cuda_pod(container(image=image), annotations={ANNOTATION: "never"}), ctx)
    terms = required_of(result.object) or []
    assert terms and all(NOT_EKS_SPOT[0] in t["matchExpressions"] for t in terms)
    assert "cuda-affinity" in result.outcome.mutations
    assert applied(result) == f"never (asked by annotation); {KEPT_OFF}{EKS_SPOT_TEXT}"
    # a Deployment applied again (the stored template carries both policies' terms) keeps them and the words
    deployment = workload("Deployment", "never")
    _template(deployment)["spec"]["containers"] = [container(image=image)]
    first = mutate(deployment, ctx).object
    again = pipeline.mutate(copy.deepcopy(first), ctx)
    assert again.patch == [] and applied(again) == applied(result)


def _declared_spot_pool() -> PoolSettings:
    return PoolSettings(
        name="a100.spot", node_selector={"example.com/pool": "a100-spot", "example.com/zone": "b"}, spot=True
    )


@pytest.mark.parametrize("later", ["tolerate", "require"])
def test_a_workload_moved_off_never_loses_its_affinity_whatever_the_view_shows_now(later: str) -> None:
    """What never added is read from its words on the template, not from today's view of the cluster: an empty
    view (a webhook not yet synced, every node gone) removed nothing, and a template moved to require kept
    NotIn SPOT beside In SPOT, matching no node (found by a review of the session's diff)."""
    nodes = [node("spot", {EKS: "SPOT"}), node("on-demand", {EKS: "ON_DEMAND"})]
    first = mutate(workload("Deployment", "never"), context(nodes)).object
    assert required_of(_template(first)) == [{"matchExpressions": NOT_EKS_SPOT}]
    moved = mutate(_switched(first, later), context([]))
    template = _template(moved.object)
    assert "removed what never had added" in template["metadata"]["annotations"][APPLIED]
    for term in required_of(template) or []:
        assert NOT_EKS_SPOT[0] not in term["matchExpressions"], term


def test_a_workload_moved_off_require_loses_the_affinity_to_a_pool_no_longer_declared() -> None:
    ctx = context([node("on-demand", {EKS: "ON_DEMAND"})], pools=(_declared_spot_pool(),))
    first = mutate(workload("Deployment", "require"), ctx).object
    assert {"key": "example.com/pool", "operator": "In", "values": ["a100-spot"]} in (
        required_of(_template(first)) or [{}]
    )[-1]["matchExpressions"]
    moved = _template(mutate(_switched(first, "tolerate"), context([node("on-demand", {EKS: "ON_DEMAND"})])).object)
    assert "affinity" not in moved["spec"], moved["spec"]["affinity"]


def test_the_places_in_the_words_read_back_as_the_terms_they_name() -> None:
    """Every form ``_spot_places`` writes: one value, several values of one key, a declared pool of two labels
    (whose name holds a dot)."""
    nodes = [node("spot", {EKS: "SPOT", KARPENTER: "spot"}), node("on-demand", {EKS: "ON_DEMAND"})]
    ctx = context(nodes, pools=(_declared_spot_pool(),), extra_labels={KARPENTER: "preemptible"})
    terms, shown, _ = spot._spot_places(ctx)
    assert len(terms) == 3 and " in (" in shown and "pool a100.spot (" in shown
    assert spot._read_places(shown) == terms
    assert spot.KEPT_OFF == KEPT_OFF
    assert spot._said_off_spot(f"never (asked by annotation); {KEPT_OFF}{shown}", ctx) == spot._off_spot(ctx)[0]
    assert spot._said_off_spot("never (asked by annotation)", ctx) == []
    assert spot._said_off_spot(f"never (x); {KEPT_OFF}not a place", ctx) is None
    # words that name no spot place are not the webhook's
    assert spot._said_off_spot(f"never (x); {KEPT_OFF}example.com/team=ml", ctx) is None
    assert spot._said_off_spot(f"never (x); {KEPT_OFF}pool p (example.com/pool=a100-spot)", ctx) is None


def test_the_spot_places_are_worked_out_once_per_snapshot_and_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_spot_places`` is kept per snapshot and settings (``ClusterView.policy_memo``): the pods of a workload ask
    it of the same snapshot again and again. Other settings over the same snapshot, or the same settings over a
    snapshot whose nodes changed, are not told the places kept for another."""
    nodes = [node("spot", {EKS: "SPOT"}), node("on-demand", {EKS: "ON_DEMAND"})]
    ctx = context(nodes)
    found: list[Context] = []
    work = spot._find_spot_places

    def counted(c: Context) -> spot.Places:
        found.append(c)
        return work(c)

    monkeypatch.setattr(spot, "_find_spot_places", counted)
    for _ in range(3):
        assert mutate(pod("require"), ctx).allowed
    assert len(found) == 1, "worked out once for the snapshot and settings"
    shown = spot._spot_places(ctx)[1]
    assert shown == f"{EKS}=SPOT or {KARPENTER}=spot", shown
    # other settings over the same snapshot: their own extra label; then the first settings again, as they were
    extra = context(nodes, extra_labels={USER_KEY: "true"}).settings
    assert spot._spot_places(dataclasses.replace(ctx, settings=extra))[1] == f"{shown} or {USER_KEY}=true"
    assert spot._spot_places(ctx)[1] == shown
    # the same settings over a snapshot whose nodes changed: a GKE spot node came
    grown = dataclasses.replace(ctx, cluster=build_view([*nodes, node("g", {GKE_SPOT: "true"})], ctx.settings))
    assert spot._spot_places(grown)[1] == f"{GKE_SPOT}=true or {shown}"
    assert len(found) == 4


def test_forged_words_on_a_pod_are_not_said_again_as_the_webhooks() -> None:
    """A pod created with a spot-applied annotation that says never kept it off a place, and the NotIn to match:
    the webhook kept both and said the words again as its own (found by a review of this change). Words naming a
    place that is no spot place are judged afresh; a copied pod whose words are true keeps them."""
    nodes = [node("spot", {EKS: "SPOT"}), node("on-demand", {EKS: "ON_DEMAND"})]
    team = {"key": "example.com/team", "operator": "NotIn", "values": ["ml"]}
    forged = pod(
        "never",
        annotations={APPLIED: f"never (asked by annotation); {KEPT_OFF}example.com/team=ml"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [team]}]}
            }
        },
    )
    result = mutate(forged, context(nodes))
    assert applied(result) == f"never (asked by annotation); {KEPT_OFF}{EKS_SPOT_TEXT}"
    assert required_of(result.object) == [{"matchExpressions": [team, *NOT_EKS_SPOT]}]


def test_the_pods_of_a_never_template_are_kept_off_a_spot_pool_declared_since() -> None:
    """The pods carry the template's words and NotIn; a pool declared spot after the template's review was not
    kept off (the words held, so nothing else was judged: found by a review of this change). It is now, and
    named after the places the words name; a second pass says the same."""
    nodes = [node("spot", {EKS: "SPOT"}), node("on-demand", {EKS: "ON_DEMAND"}), node("cw", {"example.com/pool": "a"})]
    live = mutate(workload("Deployment", "never"), context(nodes)).object
    template = _template(live)
    owner = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w-1", "uid": "u", "controller": True}]
    made = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **copy.deepcopy(template["metadata"]),
            "name": "w-1-x",
            "namespace": "ml",
            "ownerReferences": owner,
        },
        "spec": copy.deepcopy(template["spec"]),
    }
    declared = PoolSettings(name="cw-spot", node_selector={"example.com/pool": "a"}, spot=True)
    result = mutate(made, context(nodes, pools=(declared,)))
    assert required_of(result.object) == [
        {"matchExpressions": [*NOT_EKS_SPOT, {"key": "example.com/pool", "operator": "NotIn", "values": ["a"]}]}
    ]
    assert applied(result) == (
        f"never (asked by annotation); {KEPT_OFF}{EKS_SPOT_TEXT} or pool cw-spot (example.com/pool=a)"
    )
    # words of an earlier release, written anew for the place added: in the words of now
    made["metadata"]["annotations"][APPLIED] = made["metadata"]["annotations"][APPLIED].replace(
        KEPT_OFF, spot.KEPT_OFF_BEFORE
    )
    assert applied(mutate(made, context(nodes, pools=(declared,)))) == applied(result)


def test_a_never_template_given_a_spot_pools_selector_is_warned_that_it_matches_no_node() -> None:
    """Applied again with a nodeSelector for the spot pool, the template keeps the NotIn it carries (live-only):
    no node matches it. The warning of a first review is given again (found by a review of this change)."""
    nodes = [node("spot", {EKS: "SPOT"}), node("on-demand", {EKS: "ON_DEMAND"})]
    live = mutate(workload("Deployment", "never"), context(nodes)).object
    _template(live)["spec"]["nodeSelector"] = {EKS: "SPOT"}
    result = pipeline.mutate(live, context(nodes))
    only_spot = "spot never, yet its nodeSelector, affinity or tolerations leave it only spot pool"
    assert f"{only_spot} NVIDIA-L4/driver-unknown" in result.warnings


@pytest.mark.parametrize("mode", ["require", "prefer"])
def test_a_spot_pool_replaced_by_another_is_the_one_a_workload_and_its_pods_ask_for(mode: str) -> None:
    """Found by a review of day-2 journeys: the spot pool a was retired and b declared; the template applied again
    (and the pods made from it) kept requiring pool a, ANDed with b: no node matched, while the annotation named
    only b."""
    key = "example.com/pool"
    nodes = [node("od", {key: "od"}), node("b-1", {key: "b"})]
    a = PoolSettings(name="spot-a", node_selector={key: "a"}, spot=True)
    b = PoolSettings(name="spot-b", node_selector={key: "b"}, spot=True)
    live = mutate(
        workload("Deployment", mode), context([node("od", {key: "od"}), node("a-1", {key: "a"})], pools=(a,))
    ).object
    result = mutate(live, context(nodes, pools=(b,)))
    template = _template(result.object)
    node_affinity = template["spec"]["affinity"]["nodeAffinity"]
    if mode == "require":
        assert required_of(template) == [{"matchExpressions": [expr(key, "b")]}]
    else:
        assert node_affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
            {"weight": 100, "preference": {"matchExpressions": [expr(key, "b")]}}
        ]
    assert "pool spot-a" not in (applied(result) or "")


def test_never_judges_a_gpu_memory_pod_as_the_device_it_becomes() -> None:
    """Found by a generative review of the policies together: a never pod asking gpu-admission.io/gpu-memory was
    judged, on the first pass, as tolerating no GPU taint (ExtendedResourceToleration covers nvidia.com/
    resources only): the GPU-tainted node seemed out of reach, so no NotIn was added; the second pass, with the
    nvidia.com/gpu the mig policy gave it, added it. Judged as the device it becomes on both."""
    nodes = [node("n1", taints=("nvidia.com/gpu:NoSchedule",))]
    declared = PoolSettings(name="zero-spot", node_selector={"karpenter.sh/nodepool": "zero-spot"}, spot=True)
    settings = Settings(
        cluster=ClusterSettings(pools=[declared]), cuda=CudaSettings(mode="off"), mig=MigSettings(fallback="whole")
    )
    ctx = Context(settings=settings, cluster=build_view(nodes, settings), namespace="ml")
    asks = pod("never", gpu=None)
    asks["spec"]["containers"][0]["resources"] = {"limits": {"gpu-admission.io/gpu-memory": "20Gi"}}
    result = mutate(asks, ctx)
    assert required_of(result.object) == [
        {
            "matchExpressions": [
                {"key": KARPENTER, "operator": "NotIn", "values": ["spot"]},  # the pool shows Karpenter
                {"key": "karpenter.sh/nodepool", "operator": "NotIn", "values": ["zero-spot"]},
            ]
        }
    ]


def test_a_workload_moved_off_tolerate_keeps_the_toleration_its_manifest_writes() -> None:
    """Found by a review of this session's commits: the undo took out a toleration the user's manifest writes
    itself, equal to one the webhook had added (kubectl's last-applied-configuration tells them apart)."""
    own = {"key": GKE_SPOT, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    ctx = context(GKE_NODES, providers=("gke",))
    manifest = workload("Deployment", "tolerate")
    _template(manifest)["spec"]["tolerations"] = [own]
    live = mutate(manifest, ctx).object
    moved = _switched(live, "off")
    written = copy.deepcopy(manifest)
    del _template(written)["metadata"]["annotations"][ANNOTATION]
    moved["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(written)}
    template = _template(pipeline.mutate(moved, context(GKE_NODES, providers=("gke",))).object)
    assert template["spec"]["tolerations"] == [own]


def _applied(manifest: Any) -> Any:
    """``manifest`` as client-side ``kubectl apply`` sends it: with itself in the last-applied annotation."""
    sent = copy.deepcopy(manifest)
    sent["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": json.dumps(manifest)}
    return sent


@pytest.mark.parametrize("field", ["required", "preferred"])
def test_the_users_own_affinity_on_a_spot_place_outlives_the_webhooks_passes(field: str) -> None:
    """Found by a generative review: a Deployment whose own term was a spot place (Karpenter's spot capacity) with
    spot require lost it to a reinvocation, which then required every provider's spot place, and lost it for good
    when moved off require (prefer: the user's preferred term of the webhook's weight). The manifest kubectl
    applied tells the user's expressions from the webhook's."""
    own = [expr(KARPENTER, "spot")]
    nodes = [node("k-spot", {KARPENTER: "spot"}), node("gke-spot", {GKE_SPOT: "true"}), node("od")]
    ctx = context(nodes)
    manifest = workload("Deployment", "require" if field == "required" else "prefer")
    node_affinity = (
        {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": own}]}}
        if field == "required"
        else {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": own}}
            ]
        }
    )
    _template(manifest)["spec"]["affinity"] = {"nodeAffinity": node_affinity}
    live = mutate(_applied(manifest), ctx).object  # mutate() checks that a second pass (a reinvocation) changes nothing
    if field == "required":
        assert required_of(_template(live)) == [{"matchExpressions": own}], "a Karpenter spot node is a spot place"
    off = copy.deepcopy(manifest)
    del _template(off)["metadata"]["annotations"][ANNOTATION]
    moved = copy.deepcopy(live)
    del _template(moved)["metadata"]["annotations"][ANNOTATION]
    moved["metadata"]["annotations"] = _applied(off)["metadata"]["annotations"]
    result = pipeline.mutate(moved, dataclasses.replace(ctx, operation="UPDATE", old_object=live))
    assert _template(result.object)["spec"]["affinity"] == {"nodeAffinity": node_affinity}


def test_a_workload_that_drops_its_gpu_and_its_spot_mode_in_one_edit_loses_what_the_webhook_added() -> None:
    """Found by a generative review: kubectl takes the template's whole annotations map away (the webhook's words
    with it); the chart now sends such an update (its stored template's words), and the words read from the
    stored template say what to take out."""
    ctx = context(GKE_NODES, providers=("gke",))
    live = mutate(workload("Deployment", "require"), ctx).object
    assert tolerations_of(_template(live)) and required_of(_template(live))
    sent = copy.deepcopy(live)
    del _template(sent)["metadata"]["annotations"]
    _template(sent)["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}
    result = pipeline.mutate(sent, dataclasses.replace(ctx, operation="UPDATE", old_object=live))
    assert result.allowed
    template = _template(result.object)
    assert "tolerations" not in template["spec"] and "affinity" not in template["spec"], template["spec"]
    assert "removed what require had added" in template["metadata"]["annotations"][APPLIED]


KARPENTER_SPOT_TERM = {"matchExpressions": [expr(KARPENTER, "spot")]}
GKE_SPOT_TERM = {"matchExpressions": [expr(GKE_SPOT, "true")]}
NOT_ZONE_C = {"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": ["c"]}
TWO_PLACES = [node("k-spot", {KARPENTER: "spot"}), node("gke-spot", {GKE_SPOT: "true"}), node("od")]
KARPENTER_ONLY = [node("k-spot", {KARPENTER: "spot"}), node("k-od", {KARPENTER: "on-demand"})]


@pytest.mark.parametrize(
    ("nodes", "own", "required"),
    [
        pytest.param(TWO_PLACES, [KARPENTER_SPOT_TERM], [KARPENTER_SPOT_TERM], id="its-term-a-spot-place"),
        pytest.param(
            TWO_PLACES,
            [KARPENTER_SPOT_TERM, ZONE_A],
            [KARPENTER_SPOT_TERM, and_(ZONE_A, expr(GKE_SPOT, "true")), and_(ZONE_A, expr(KARPENTER, "spot"))],
            id="beside-a-term-narrowed",
        ),
        pytest.param(
            TWO_PLACES,
            [KARPENTER_SPOT_TERM, GKE_SPOT_TERM, ZONE_A],
            [
                KARPENTER_SPOT_TERM,
                GKE_SPOT_TERM,
                and_(ZONE_A, expr(GKE_SPOT, "true")),
                and_(ZONE_A, expr(KARPENTER, "spot")),
            ],
            id="its-terms-every-spot-place-beside-one-narrowed",
        ),
        pytest.param(
            TWO_PLACES,
            [and_(GKE_SPOT_TERM, expr(KARPENTER, "spot")), ZONE_A],
            [
                and_(GKE_SPOT_TERM, expr(KARPENTER, "spot")),
                and_(ZONE_A, expr(GKE_SPOT, "true")),
                and_(ZONE_A, expr(KARPENTER, "spot")),
            ],
            id="its-term-two-spot-places-at-once",
        ),
        pytest.param(
            KARPENTER_ONLY,
            [and_(KARPENTER_SPOT_TERM, NOT_ZONE_C), ZONE_A],
            [and_(KARPENTER_SPOT_TERM, NOT_ZONE_C), and_(ZONE_A, expr(KARPENTER, "spot"))],
            id="the-one-spot-place-first-in-its-term",
        ),
    ],
)
@pytest.mark.parametrize("kind", ["Deployment", "CronJob"])
def test_the_users_own_term_on_a_spot_place_outlives_the_passes_without_a_manifest(
    kind: str, nodes: list[Any], own: list[Any], required: list[Any]
) -> None:
    """Found among the last session's fuzz leftovers (as 'a CronJob's Job gets a reordering patch'): a workload
    without kubectl's last-applied manifest (a Helm release, a server-side apply, the Job a CronJob makes from its
    template) whose own required term is one provider's spot place (Karpenter's) lost it on the webhook's next pass:
    the words of require name every spot place of the cluster, and that pass took each out of every term and wrote
    them again, so the pods then required any provider's spot capacity (the CronJob's Jobs each got that patch),
    and lost it for good when moved off require. A term narrow kept as it was (it implied a spot place on its own)
    is the pod's own: the terms the webhook made from one term hold every spot place between them, each after that
    term's own expressions (a generative review of these passes found the last three cases)."""
    ctx = context(nodes)
    sent = workload(kind, "require")
    spec = sent["spec"]["jobTemplate"]["spec"] if kind == "CronJob" else sent["spec"]
    spec["template"]["spec"]["affinity"] = with_terms(*copy.deepcopy(own))
    live = mutate(sent, ctx).object  # mutate() checks that a second pass (a reinvocation) changes nothing
    made = live["spec"]["jobTemplate"]["spec"] if kind == "CronJob" else live["spec"]
    assert required_of(made["template"]) == required
    if kind == "CronJob":  # the Job its controller makes from the job template, as it is
        job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "w-1", "namespace": "ml"}, "spec": made}
        assert pipeline.mutate(copy.deepcopy(job), ctx).patch == []
        return
    moved = copy.deepcopy(live)
    del _template(moved)["metadata"]["annotations"][ANNOTATION]
    result = pipeline.mutate(moved, dataclasses.replace(ctx, operation="UPDATE", old_object=live))
    assert required_of(_template(result.object)) == own


@pytest.mark.parametrize(
    ("mode", "then"),
    [("tolerate", "never"), ("tolerate", None), ("require", "tolerate"), ("require", "never"), ("require", None)],
)
def test_the_users_own_spot_toleration_outlives_the_mode_without_a_manifest(mode: str, then: str | None) -> None:
    """Found by a generative review of workload updates without kubectl's manifest (a Helm release, a server-side
    apply): a chart's own toleration of GKE's spot taint, written as the webhook writes it, was named in the words
    as one the webhook added, and went with the mode. The words now name the pod's own apart; what the webhook
    added still goes."""
    ctx = context(GKE_NODES, providers=("gke",))
    own = equal(GKE_SPOT, "true")
    sent = workload("Deployment", mode)
    _template(sent)["spec"]["tolerations"] = [copy.deepcopy(own)]
    live = mutate(sent, ctx).object  # mutate() checks that a second pass (a reinvocation) changes nothing
    words = _template(live)["metadata"]["annotations"][APPLIED]
    assert f"tolerates {GKE_SPOT}=true:NoSchedule" in words and f"its own: {GKE_SPOT}=true:NoSchedule" in words
    update = dataclasses.replace(ctx, operation="UPDATE", old_object=live)
    again = pipeline.mutate(copy.deepcopy(live), update)
    assert again.patch == [], "an update of the template as stored changes nothing"
    moved = copy.deepcopy(live)
    if then is None:
        del _template(moved)["metadata"]["annotations"][ANNOTATION]
    else:
        _template(moved)["metadata"]["annotations"][ANNOTATION] = then
    result = pipeline.mutate(moved, update)
    assert result.allowed, result.message
    assert own in tolerations_of(_template(result.object)), "the pod's own toleration stays"
    # a toleration the webhook added goes, as before
    added = workload("Deployment", mode)
    live = mutate(added, ctx).object
    assert own in tolerations_of(_template(live))
    moved = copy.deepcopy(live)
    del _template(moved)["metadata"]["annotations"][ANNOTATION]
    result = pipeline.mutate(moved, dataclasses.replace(ctx, operation="UPDATE", old_object=live))
    assert own not in tolerations_of(_template(result.object))


@pytest.mark.parametrize("mode", ["require", "prefer", "never", ""])
def test_only_the_pools_the_spot_places_alone_keep_a_pod_off_are_blamed_on_require(mode: str) -> None:
    """``spot.kept_off_by_require``, which the cuda and mig policies both ask: of the on-demand pools, the one the
    pod's own nodeSelector also excludes is its own rules' doing, the other the spot places'; and nothing is blamed
    on require for a pod that is not under it, though its affinity holds the same places."""
    nodes = [
        node("spot", {GKE_SPOT: "true", NODEPOOL: "l4-spot"}, (f"{GKE_SPOT}=true:NoSchedule",)),
        node("od-a", {NODEPOOL: "l4-a", "example.com/team": "ml"}),
        node("od-b", {NODEPOOL: "l4-b"}),
    ]
    ctx = context(nodes, providers=("gke",))
    obj = pod("require")
    obj["spec"]["nodeSelector"] = {"example.com/team": "ml"}
    spec = mutate(obj, ctx).object["spec"]
    assert required_of({"spec": spec}) == [{"matchExpressions": [expr(GKE_SPOT, "true")]}]
    on_demand = [g for g in ctx.cluster.gpu_groups if not g.spot]
    kept_off = spot.kept_off_by_require(mode, spec, on_demand, ctx, {"nvidia.com/gpu": Decimal(1)})
    assert [g.pool for g in kept_off] == (["l4-a"] if mode == "require" else [])


def _gke_cpu_spot_node() -> Any:
    """A GKE spot node of a CPU pool, labelled and tainted as GKE does."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "cpu-1", "labels": {"cloud.google.com/gke-nodepool": "cpu-spot", GKE_SPOT: "true"}},
        "spec": {"taints": [taint(f"{GKE_SPOT}=true:NoSchedule")]},
        "status": {"allocatable": {"cpu": "8"}},
    }


def test_a_pod_without_gpus_is_not_warned_that_it_runs_on_demand_where_every_spot_pool_is_a_gpu_pool() -> None:
    """Under spot.default: prefer every CPU pod and workload of a cluster whose only spot pool is a GPU pool was
    warned that "its nodeSelector, affinity or tolerations exclude every spot pool: it runs on demand": it was the
    GPU pool's taint, and spot capacity of GPUs it does not ask for (found by a review of user journeys). Not
    warned under prefer (the annotation says why it got none); under require, where it stays Pending, the real
    cause is said, and what to change. A CPU spot pool its own nodeSelector excludes is still warned of."""
    gpu_cluster = context(_gke_gpu_pools(1), providers=("gke",))
    result = mutate(pod("prefer", gpu=None), gpu_cluster)
    assert result.warnings == []
    assert (applied(result) or "").endswith("; every spot pool is a GPU pool and it asks no GPU (spot-1x)")
    assert mutate(pod("require", gpu=None), gpu_cluster).warnings == [
        "spot require: every spot pool is a GPU pool and it asks no GPU; add a CPU spot pool or use spot: prefer "
        "(pool spot-1x)"
    ]
    cpu_od = {**_gke_cpu_spot_node(), "metadata": {"name": "cpu-od", "labels": {NODEPOOL: "default-pool"}}, "spec": {}}
    own = pod("prefer", gpu=None)
    own["spec"]["nodeSelector"] = {NODEPOOL: "default-pool"}
    with_cpu_spot = context([*_gke_gpu_pools(1), _gke_cpu_spot_node(), cpu_od], providers=("gke",))
    assert mutate(own, with_cpu_spot).warnings == [
        "spot prefer: its nodeSelector, affinity or tolerations exclude every spot pool: it runs on demand (2 pools)"
    ]
    assert mutate(pod("prefer", gpu=None), with_cpu_spot).warnings == []


def _eks_node(name: str, group: str, capacity: str, gpus: int, labels: dict[str, str] | None = None) -> Any:
    """An EKS managed node group's node, untainted as EKS leaves GPU nodes; a CPU node where ``gpus`` is 0."""
    obj = node(name, {NODE_GROUP: group, EKS: capacity, **(labels or {})}, gpus=gpus)
    if not gpus:
        del obj["metadata"]["labels"]["nvidia.com/gpu.product"]
        obj["status"]["allocatable"] = {"cpu": "8"}
    return obj


def _cordoned_gke_spot_node() -> Any:
    obj = _gke_gpu_pools(1)[1]
    obj["spec"]["unschedulable"] = True
    obj["spec"]["taints"].append(taint("node.kubernetes.io/unschedulable:NoSchedule"))
    return obj


_OWN_RULES = "its nodeSelector, affinity or tolerations exclude every spot pool"


@pytest.mark.parametrize(
    ("cluster", "selector", "tolerations", "why"),
    [
        ("gke", {NODEPOOL: "default-pool"}, None, _OWN_RULES),
        ("eks", {"role": "system"}, None, _OWN_RULES),
        (
            "cordoned",
            None,
            [exists("nvidia.com/gpu"), exists(GKE_SPOT)],
            "the spot nodes it can use are all cordoned now",
        ),
    ],
    ids=["gke-pinned-to-default-pool", "eks-untainted-gpu-group", "tolerates-the-gpu-taint-spot-node-cordoned"],
)
def test_a_pod_without_gpus_kept_off_gpu_spot_pools_by_more_than_their_taint_is_told_what(
    cluster: str, selector: Any, tolerations: Any, why: str
) -> None:
    """ "Every spot pool is a GPU pool and it asks no GPU; add a CPU spot pool" was said wherever every spot pool was
    a GPU pool, the GPU taint keeping the pod off or not: an EKS GPU node group untainted beside a pod that selects
    role=system, a pod pinned to GKE's default-pool, a pod that tolerates the GPU taint and whose one spot node is
    cordoned (found by a review): the pod's own rules or the drain keep it off, and a CPU spot pool would not help.
    Said only where tolerating the GPU taint would let it onto a spot pool; else the words that say what does."""
    cpu_od = {**_gke_cpu_spot_node(), "metadata": {"name": "cpu-od", "labels": {NODEPOOL: "default-pool"}}, "spec": {}}
    nodes, providers, pools = {
        "gke": ([*_gke_gpu_pools(1), cpu_od], ("gke",), "spot-1x"),
        "eks": (
            [_eks_node("g1", "gpu-spot", "SPOT", 4), _eks_node("c1", "system", "ON_DEMAND", 0, {"role": "system"})],
            ("eks",),
            "gpu-spot",
        ),
        "cordoned": ([_gke_gpu_pools(1)[0], _cordoned_gke_spot_node(), cpu_od], ("gke",), "spot-1x"),
    }[cluster]
    ctx = context(nodes, providers=providers)
    for mode in ("require", "prefer"):
        obj = pod(mode, gpu=None, tolerations=tolerations)
        if selector:
            obj["spec"]["nodeSelector"] = selector
        ran = ": it runs on demand" if mode == "prefer" else ""
        assert mutate(obj, ctx).warnings == [f"spot {mode}: {why}{ran} (pool {pools})"]


@pytest.mark.parametrize("leaving", ["unschedulable", "not-ready"])
def test_a_pod_without_gpus_kept_off_a_leaving_gpu_spot_pool_by_its_taint_is_told_of_the_gpu_pool(
    leaving: str,
) -> None:
    """A plain CPU pod whose only spot pool is a GPU pool, its nodes cordoned or not ready: the GPU taint keeps it
    off whatever the drain, and the trial that tolerates the GPU taints did not pass the drain's taint, so a pod of
    no rules was told "its nodeSelector, affinity or tolerations exclude every spot pool" (found by a review). The
    GPU-pool words are said; under prefer only in the annotation, as of a GPU pool whose nodes are ready."""
    leaving_node = _gke_gpu_pools(1)[1]
    leaving_node["spec"]["taints"].append(taint(f"node.kubernetes.io/{leaving}:NoSchedule"))
    cpu_od = {**_gke_cpu_spot_node(), "metadata": {"name": "cpu-od", "labels": {NODEPOOL: "default-pool"}}, "spec": {}}
    ctx = context([_gke_gpu_pools()[0], leaving_node, cpu_od], providers=("gke",))
    said = "every spot pool is a GPU pool and it asks no GPU"
    assert mutate(pod("require", gpu=None), ctx).warnings == [
        f"spot require: {said}; add a CPU spot pool or use spot: prefer (pool spot-1x)"
    ]
    result = mutate(pod("prefer", gpu=None), ctx)
    assert result.warnings == []
    assert (applied(result) or "").endswith(f"; {said} (spot-1x)")


def test_the_cuda_words_name_the_spot_requirement_not_the_pods_own_rules() -> None:
    """A GPU pod that requires spot where only a CPU pool is spot: the cuda policy said that "its nodeSelector/
    affinity excludes" the on-demand GPU pool, and the pod had written none (found by a review of the docs against
    the code)."""
    cpu_spot = _gke_cpu_spot_node()
    driver = {"nvidia.com/cuda.driver-version.full": "570.124.06", "cloud.google.com/gke-nodepool": "l4-od"}
    gpu = node("gpu-1", driver)

    def pod_of_cuda() -> Any:
        obj = pod("require")
        obj["spec"]["containers"][0]["image"] = "nvidia/cuda:12.4.1-base-ubuntu22.04"
        return obj

    every = Settings()  # every policy on
    ctx = Context(settings=every, cluster=build_view([gpu, cpu_spot], every), namespace="ml")
    said = pipeline.review(pod_of_cuda(), ctx).object["metadata"]["annotations"]["gpu-admission.io/cuda"]
    assert "(the spot capacity it requires excludes pool l4-od)" in said, said
    # the pod's own rules are still named as its own
    own = pod_of_cuda()
    own["spec"]["nodeSelector"] = {"cloud.google.com/gke-nodepool": "elsewhere"}
    said = pipeline.review(own, ctx).object["metadata"]["annotations"]["gpu-admission.io/cuda"]
    assert "(its nodeSelector/affinity excludes pool l4-od)" in said, said
    # a pod that asks no spot mode and writes the spot place itself: its own rules (it had been told spot: require
    # kept it off; found by a review of the spot policy)
    written = pod_of_cuda()
    del written["metadata"]["annotations"][ANNOTATION]
    written["spec"]["affinity"] = with_terms(
        {"matchExpressions": [{"key": GKE_SPOT, "operator": "In", "values": ["true"]}]}
    )
    written["spec"]["tolerations"] = [equal(GKE_SPOT, "true")]
    said = pipeline.review(written, ctx).object["metadata"]["annotations"]["gpu-admission.io/cuda"]
    assert "(its nodeSelector/affinity excludes pool l4-od)" in said and "spot capacity it requires" not in said, said


@pytest.mark.parametrize("earlier", ["forged require on a pod", "tolerate on the stored template"])
def test_the_cuda_words_read_the_spot_mode_of_this_pass_not_the_earlier_words(earlier: str) -> None:
    """The cuda policy names spot: require as what keeps a pod off a pool by the mode the spot policy decided in
    this pass, not by the spot-applied words the object came with (``Context.prior``, the last review's or a user's):
    a pod that asks nothing is not blamed on a require its forged words name, and a workload moved to require is
    told so on the update that moves it."""
    cpu_spot = _gke_cpu_spot_node()
    gpu = node("gpu-1", {"nvidia.com/cuda.driver-version.full": "570.124.06", "cloud.google.com/gke-nodepool": "l4-od"})
    every = Settings()
    ctx = Context(settings=every, cluster=build_view([gpu, cpu_spot], every), namespace="ml")
    image = "nvidia/cuda:12.4.1-base-ubuntu22.04"
    if earlier == "forged require on a pod":
        obj = pod(
            tolerations=[equal(GKE_SPOT, "true")], affinity=with_terms({"matchExpressions": [expr(GKE_SPOT, "true")]})
        )
        obj["metadata"]["annotations"] = {APPLIED: f"require (asked by annotation); requires {GKE_SPOT}=true"}
        obj["spec"]["containers"][0]["image"] = image
        result = pipeline.review(obj, ctx)
        said = result.object["metadata"]["annotations"]["gpu-admission.io/cuda"]
        assert "(its nodeSelector/affinity excludes pool l4-od)" in said, said
        assert not any("spot capacity it requires" in w for w in result.warnings), result.warnings
    else:
        deployment = workload("Deployment", "tolerate")
        _template(deployment)["spec"]["containers"][0]["image"] = image
        stored = pipeline.review(deployment, ctx).object
        assert (applied(pipeline.review(stored, ctx)) or "").startswith("tolerate ("), (
            "the words the update starts from"
        )
        update = dataclasses.replace(ctx, operation="UPDATE", old_object=stored)
        result = pipeline.review(_switched(stored, "require"), update)
        said = _template(result.object)["metadata"]["annotations"]["gpu-admission.io/cuda"]
        assert "(the spot capacity it requires excludes pool l4-od)" in said, said


def test_never_as_a_default_keeps_a_namespaces_pods_off_untainted_spot_nodes() -> None:
    """never was accepted on a pod only: a namespace of production inference on EKS could not be kept off the
    untainted spot nodes there but pod by pod (found by a review of the docs against the code)."""
    nodes = [node("spot", {EKS: "SPOT"}), node("on-demand", {EKS: "ON_DEMAND"})]
    every: list[dict[str, Any]] = [{"namespace_defaults": {"ml": "never"}}, {"owner_defaults": {"Job": "never"}}]
    for defaults in every:
        result = mutate(pod(owner="Job"), context(nodes, **defaults))
        assert required_of(result.object) == [{"matchExpressions": NOT_EKS_SPOT}], defaults
        assert (applied(result) or "").startswith("never (default for "), applied(result)
    asked = mutate(pod("tolerate", owner="Job"), context(nodes, owner_defaults={"Job": "never"}))
    assert (applied(asked) or "").startswith("tolerate (asked by annotation)")  # the pod's own ask comes first
    assert required_of(asked.object) is None


def test_a_never_default_leaves_daemonsets_and_bound_pods_alone() -> None:
    """A global never default reached the GPU Operator's device plugin DaemonSet: its pods kept off spot nodes, those
    nodes offered no GPU (found by a review of this session's commits). A pod that asks never itself still gets it."""
    nodes = [node("spot", {EKS: "SPOT"}), node("on-demand", {EKS: "ON_DEMAND"})]
    ctx = context(nodes, default="never")
    plugin = pod(gpu=None)
    plugin["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "nvidia-device-plugin", "uid": "u", "controller": True}
    ]
    assert required_of(mutate(plugin, ctx).object) is None
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "nvidia-device-plugin", "namespace": "gpu-operator"},
        "spec": {"template": {"metadata": {}, "spec": {"containers": [{"name": "p", "image": "x"}]}}},
    }
    assert mutate(daemonset, ctx).patch == []
    bound = pod()
    bound["spec"]["nodeName"] = "spot"
    assert required_of(mutate(bound, ctx).object) is None
    assert required_of(mutate(pod(), ctx).object) == [{"matchExpressions": NOT_EKS_SPOT}]  # others: kept off
    asked = copy.deepcopy(plugin)
    asked["metadata"]["annotations"] = {ANNOTATION: "never"}
    assert required_of(mutate(asked, ctx).object) == [{"matchExpressions": NOT_EKS_SPOT}]


def _daemon_pod(**kwargs: Any) -> Any:
    """A DaemonSet's pod, bound to node on-demand by matchFields as the DaemonSet controller binds it."""
    host = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["on-demand"]}]}
    daemon = pod(affinity=with_terms(host), **kwargs)
    daemon["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u", "controller": True}
    ]
    return daemon


def _daemonset(template: Any) -> Any:
    """A DaemonSet of the pod ``template`` (a pod: its metadata and spec)."""
    spec = copy.deepcopy(template["spec"])
    metadata = {k: v for k, v in template["metadata"].items() if k == "annotations"}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "ml"},
        "spec": {"template": {"metadata": metadata, "spec": spec}},
    }


@pytest.mark.parametrize("where", ["namespace_defaults", "owner_defaults", "default"])
def test_a_tolerate_default_reaches_a_daemonsets_pods_and_template(where: str) -> None:
    """A tolerate default left DaemonSets alone too, and spot.ownerDefaults {DaemonSet: tolerate}, accepted before,
    failed the settings at start (found by a review of the spot policy): the GPU Operator's and DCGM's DaemonSets
    are meant to land on tainted spot nodes. A tolerate default reaches a DaemonSet's pods and template again, and
    a template it gave the toleration keeps it."""
    defaults: Any = {"namespace_defaults": {"ml": "tolerate"}, "owner_defaults": {"DaemonSet": "tolerate"}}
    ctx = context([ON_DEMAND, *PROVIDERS["gke"][0]], **{where: defaults.get(where, "tolerate")})
    result = mutate(_daemon_pod(), ctx)
    assert tolerations_of(result.object) == [equal(GKE_SPOT, "true")]
    assert (applied(result) or "").startswith("tolerate (")
    template = mutate(_daemonset(_daemon_pod()), ctx)
    assert tolerations_of(_template(template.object)) == [equal(GKE_SPOT, "true")]
    later = copy.deepcopy(template.object)  # edited by its owner: reviewed again
    _template(later)["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5"
    again = mutate(later, dataclasses.replace(ctx, operation="UPDATE", old_object=template.object))
    assert tolerations_of(_template(again.object)) == [equal(GKE_SPOT, "true")]
    assert not any(spot.UNDONE in part for part in (applied(again) or "").split("; "))


@pytest.mark.parametrize("mode", ["prefer", "require"])
def test_no_default_but_tolerate_reaches_a_daemonsets_pods_or_template(mode: str) -> None:
    """Only a never default left DaemonSets alone: a namespace's require default ANDed gke-spot into the affinity of
    a DaemonSet's pod bound to an on-demand node by matchFields, which was then never schedulable, and its template
    stopped covering on-demand nodes (found by a review of the spot policy). A prefer or require default leaves them
    alone; the DaemonSet's own annotation still counts."""
    ctx = context([ON_DEMAND, *PROVIDERS["gke"][0]], namespace_defaults={"ml": mode})
    host = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["on-demand"]}]}
    daemon = pod(affinity=with_terms(host))
    daemon["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "u", "controller": True}
    ]
    result = mutate(daemon, ctx)
    assert result.patch == [] and result.outcome.reasons == []
    daemonset: Any = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "agent", "namespace": "ml"},
        "spec": {"template": {"metadata": {}, "spec": copy.deepcopy(daemon["spec"])}},
    }
    assert mutate(daemonset, ctx).patch == []
    asked = copy.deepcopy(daemonset)
    asked["spec"]["template"]["metadata"]["annotations"] = {ANNOTATION: mode}
    assert (applied(mutate(asked, ctx)) or "").startswith(f"{mode} (asked by annotation)")
    # a template that a default reached before is given back the affinity it added, and told why; its tolerations
    # stay (``test_a_default_that_leaves_a_daemonset_alone_keeps_its_templates_tolerations``)
    earlier = copy.deepcopy(asked)
    earlier["spec"]["template"]["metadata"]["annotations"] = {}
    earlier_result = mutate(asked, context([ON_DEMAND, *PROVIDERS["gke"][0]]))
    earlier["spec"]["template"] = copy.deepcopy(_template(earlier_result.object))
    del earlier["spec"]["template"]["metadata"]["annotations"][ANNOTATION]
    words = earlier["spec"]["template"]["metadata"]["annotations"][APPLIED]  # as a default of an earlier release
    earlier["spec"]["template"]["metadata"]["annotations"][APPLIED] = words.replace(
        "asked by annotation", "default for namespace ml"
    )
    undone = mutate(earlier, ctx)
    assert _template(undone.object)["spec"] == {**daemon["spec"], "tolerations": [equal(GKE_SPOT, "true")]}
    assert (applied(undone) or "").startswith(f"off (default for namespace ml {mode}, which leaves a DaemonSet's pods")


DAEMON_TOLERATES = " (a DaemonSet's pods run on the nodes they tolerate)"


@pytest.mark.parametrize("earlier", ["tolerate", "require"])
def test_a_default_that_leaves_a_daemonset_alone_keeps_its_templates_tolerations(earlier: str) -> None:
    """A DaemonSet's template that a tolerate default gave gke-spot's toleration (or that an earlier release steered
    under a require default), edited after the default became prefer, which leaves DaemonSets alone, lost the
    toleration: at its next rollout the DaemonSet controller made no pod for its tainted spot nodes (the GPU
    plugin's, DCGM's; found by a review of the spot policy). Its tolerations are kept, and said so; only the
    affinity the earlier mode added goes. A later annotation of the DaemonSet's own still counts."""
    nodes = [ON_DEMAND, *PROVIDERS["gke"][0]]
    if earlier == "tolerate":
        made = mutate(_daemonset(pod()), context(nodes, namespace_defaults={"ml": "tolerate"})).object
    else:  # as the earlier release steered it: by a require default, in the words of now
        made = mutate(_daemonset(pod("require")), context(nodes)).object
        del _template(made)["metadata"]["annotations"][ANNOTATION]
        words = _template(made)["metadata"]["annotations"][APPLIED].replace("asked by annotation", "default for")
        _template(made)["metadata"]["annotations"][APPLIED] = words.replace(" for)", " for namespace ml)")
        assert required_of(_template(made)) is not None
    ctx = context(nodes, namespace_defaults={"ml": "prefer"})
    later = copy.deepcopy(made)  # edited by its owner: reviewed again
    _template(later)["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5"
    update = dataclasses.replace(ctx, operation="UPDATE", old_object=made)
    result = mutate(later, update)
    assert tolerations_of(_template(result.object)) == [equal(GKE_SPOT, "true")]
    assert required_of(_template(result.object)) is None
    removed = "removed what require had added: its required spot affinity; " if earlier == "require" else ""
    assert applied(result) == (
        "off (default for namespace ml prefer, which leaves a DaemonSet's pods alone); "
        f"{removed}kept what {earlier} had added: tolerations {GKE_SPOT}=true:NoSchedule{DAEMON_TOLERATES}"
    )
    # its pods keep them too, and say so; the next edit says nothing more, and changes nothing
    made_pod = _daemon_pod(annotations=dict(_template(result.object)["metadata"]["annotations"]))
    made_pod["spec"]["tolerations"] = tolerations_of(_template(result.object))
    assert mutate(made_pod, ctx).patch == []
    next_edit = copy.deepcopy(result.object)
    _template(next_edit)["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.6"
    quiet = mutate(next_edit, dataclasses.replace(ctx, operation="UPDATE", old_object=result.object))
    assert tolerations_of(_template(quiet.object)) == [equal(GKE_SPOT, "true")]
    assert applied(quiet) is None
    # the DaemonSet's own never: kept off the spot nodes it tolerates
    asked = copy.deepcopy(quiet.object)
    _template(asked)["metadata"].setdefault("annotations", {})[ANNOTATION] = "never"
    never = mutate(asked, dataclasses.replace(ctx, operation="UPDATE", old_object=quiet.object))
    off_spot = [{"key": GKE_SPOT, "operator": "NotIn", "values": ["true"]}]
    assert required_of(_template(never.object)) == [{"matchExpressions": off_spot}]


def test_a_daemonsets_spot_tolerations_added_at_zero_are_said_to_stay_where_a_default_leaves_it_alone() -> None:
    """A DaemonSet's template that a tolerate default gave GKE's spot tolerations while the spot pool was at zero,
    edited once an untainted spot node was there, was told they would be taken out when its spot mode changed; the
    default then became prefer, which leaves DaemonSets alone: its mode became off and they were kept (found by a
    review of the spot policy). Its words say so; a DaemonSet whose own annotation asked keeps the plain words."""
    gke_pool = "cloud.google.com/gke-nodepool"
    on_demand = node("gke-od", {gke_pool: "l4-od"})
    nodes = [on_demand, node("gke-spot", {GKE_SPOT: "true", gke_pool: "spot-l4"})]
    added = [equal(GKE_SPOT, "true"), equal(GKE_PREEMPTIBLE, "true")]
    shown = f"{GKE_SPOT}=true:NoSchedule, {GKE_PREEMPTIBLE}=true:NoSchedule"
    made = mutate(_daemonset(pod()), context([on_demand], namespace_defaults={"ml": "tolerate"})).object
    assert tolerations_of(_template(made)) == added
    later = copy.deepcopy(made)  # edited by its owner once the spot node is there
    _template(later)["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5"
    ctx = context(nodes, namespace_defaults={"ml": "tolerate"})
    edited = mutate(later, dataclasses.replace(ctx, operation="UPDATE", old_object=made))
    assert applied(edited) == (
        "tolerate (default for namespace ml); no spot taint on the cluster's nodes or pools to tolerate; still "
        f"tolerates {shown} (added by an earlier review: taken out when the spot mode changes, kept where a default "
        "comes to leave the DaemonSet alone)"
    )
    # the default becomes prefer: kept, as the words said
    moved = copy.deepcopy(edited.object)
    _template(moved)["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.6"
    prefer = context(nodes, namespace_defaults={"ml": "prefer"})
    kept = mutate(moved, dataclasses.replace(prefer, operation="UPDATE", old_object=edited.object))
    assert tolerations_of(_template(kept.object)) == added
    assert applied(kept) == (
        "off (default for namespace ml prefer, which leaves a DaemonSet's pods alone); "
        f"kept what tolerate had added: tolerations {shown}{DAEMON_TOLERATES}"
    )
    # asked by its own annotation: taking it back takes them out, whatever the default (the plain words)
    own = mutate(_daemonset(pod("tolerate")), context([on_demand])).object
    own_later = copy.deepcopy(own)
    _template(own_later)["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.5"
    own_edited = mutate(own_later, dataclasses.replace(context(nodes), operation="UPDATE", old_object=own))
    assert (applied(own_edited) or "").endswith(f"still tolerates {shown}{spot.STILL_WHY}")


def test_a_daemonset_that_takes_its_own_tolerate_back_loses_the_tolerations_whatever_the_default() -> None:
    """A DaemonSet whose own annotation asked tolerate, the annotation then taken out under a prefer default (which
    leaves DaemonSets alone), kept the toleration, said to be kept; under the default off it went (found by a review
    of this session's commits). The owner took the request back: what it added goes."""
    nodes = [ON_DEMAND, *PROVIDERS["gke"][0]]
    ctx = context(nodes, namespace_defaults={"ml": "prefer"})
    made = mutate(_daemonset(pod("tolerate")), ctx).object
    assert tolerations_of(_template(made)) == [equal(GKE_SPOT, "true")]
    later = copy.deepcopy(made)
    del _template(later)["metadata"]["annotations"][ANNOTATION]
    result = mutate(later, dataclasses.replace(ctx, operation="UPDATE", old_object=made))
    assert tolerations_of(_template(result.object)) == []
    assert "removed what tolerate had added: tolerations" in (applied(result) or ""), applied(result)


@pytest.mark.parametrize("mode", ["prefer", "require"])
def test_a_daemonsets_pod_steered_by_an_earlier_default_loses_that_affinity(mode: str) -> None:
    """A DaemonSet's pod made from a template that an earlier release steered under a require default (the template
    is not reviewed again until it changes) lost only its spot-applied words: its required spot places stayed ANDed
    with the matchFields that binds it to an on-demand node, never schedulable, and nothing said why (found by a
    review of the spot policy). What that mode added to its affinity goes, with words that say so; its tolerations
    stay (the DaemonSet controller chose its node by the template's)."""
    nodes = [ON_DEMAND, *PROVIDERS["gke"][0]]
    earlier = mutate(_daemon_pod(mode=mode), context(nodes)).object  # as the earlier release steered it
    del earlier["metadata"]["annotations"][ANNOTATION]
    assert earlier["spec"]["affinity"] != _daemon_pod()["spec"]["affinity"]
    result = mutate(earlier, context(nodes, namespace_defaults={"ml": mode}))
    assert result.object["spec"]["affinity"] == _daemon_pod()["spec"]["affinity"]
    assert tolerations_of(result.object) == [equal(GKE_SPOT, "true")]
    said = "its required spot affinity" if mode == "require" else "its preferred spot affinity"
    assert applied(result) == (
        f"off (default for namespace ml {mode}, which leaves a DaemonSet's pods alone); removed what {mode} had"
        f" added: {said}; kept what {mode} had added: tolerations {GKE_SPOT}=true:NoSchedule{DAEMON_TOLERATES}"
    )
    other = copy.deepcopy(earlier)  # another owner's pod is left alone: its mode cannot change
    other["metadata"]["ownerReferences"][0]["kind"] = "StatefulSet"
    assert mutate(other, context(nodes, namespace_defaults={"ml": "off"})).object["spec"] == earlier["spec"]


@pytest.mark.parametrize("mode", ["require", "prefer"])
def test_a_pod_bound_to_a_node_gets_no_spot_affinity(mode: str) -> None:
    """A pod created with spec.nodeName (a custom scheduler, a controller that places its pods) got the required
    affinity of require, and the kubelet refuses a bound pod whose node fails it (found by a review of this
    session's commits); nothing is left to prefer either. Its tolerations stay."""
    nodes = [node("spot", {EKS: "SPOT"}), node("on-demand", {EKS: "ON_DEMAND"})]
    bound = pod(mode)
    bound["spec"]["nodeName"] = "on-demand"
    result = mutate(bound, context(nodes))
    assert "affinity" not in result.object["spec"]
    assert "bound to node on-demand: no affinity" in (applied(result) or "")
    told = [w for w in result.warnings if "bound to node on-demand, which is not spot capacity" in w]
    assert bool(told) is (mode == "require"), result.warnings


def test_never_reads_the_words_earlier_releases_wrote() -> None:
    """ "requires not A or B" read as "(not A) or B" (a review of the docs against the code): the words are now
    "requires none of A or B", and a pod or template that carries the earlier words keeps them and its affinity."""
    nodes = [node("spot", {EKS: "SPOT"}), node("on-demand", {EKS: "ON_DEMAND"})]
    ctx = context(nodes)
    first = mutate(pod("never"), ctx).object
    earlier = applied(pipeline.mutate(first, ctx)) or ""
    assert earlier.endswith(f"{KEPT_OFF}{EKS_SPOT_TEXT}")
    written = earlier.replace(KEPT_OFF, spot.KEPT_OFF_BEFORE)
    first["metadata"]["annotations"][APPLIED] = written
    again = pipeline.mutate(first, context(nodes))
    assert again.patch == [] and applied(again) == written
    assert required_of(again.object) == [{"matchExpressions": NOT_EKS_SPOT}]


def test_never_says_whose_nodes_it_would_tolerate_only_where_it_reaches_them() -> None:
    """never said "keeps off spot capacity, whose nodes it would tolerate" where the pod reached no spot node: every
    node carries a capacity label, or a k3s spot node is tainted by extraTaints (found by a review of the spot
    policy). There it says it reaches none now; the earlier words are still read back, the affinity kept, and said
    in the words of now."""
    k3s = [
        node("spot", {USER_KEY: "yes"}, (f"{USER_KEY}=yes:NoExecute",)),
        node("on-demand", {USER_KEY: "no"}),
    ]
    extra: dict[str, Any] = {
        "extra_taints": [TaintSpec(USER_KEY, "yes", "NoExecute")],
        "extra_labels": {USER_KEY: "yes"},
    }
    unreached = "never (asked by annotation); keeps off spot capacity, none of which it reaches now: requires none of"
    cases: list[tuple[list[Any], dict[str, Any], str]] = [
        ([node("on-demand", {EKS: "ON_DEMAND"})], {}, EKS_SPOT_TEXT),
        (k3s, extra, f"{USER_KEY}=yes"),
    ]
    for nodes, settings, place in cases:
        ctx = context(nodes, **settings)
        result = mutate(pod("never"), ctx)
        assert applied(result) == f"{unreached} {place}"
        # words an earlier release wrote on this path are read back: the affinity is kept, and they say it now
        earlier = copy.deepcopy(result.object)
        earlier["metadata"]["annotations"][APPLIED] = f"never (asked by annotation); {KEPT_OFF}{place}"
        again = mutate(earlier, ctx)
        assert applied(again) == applied(result) and again.object["spec"] == result.object["spec"]
    tolerant = mutate(pod("never", tolerations=[{"operator": "Exists"}]), context(k3s, **extra))
    assert applied(tolerant) == f"never (asked by annotation); {KEPT_OFF}{USER_KEY}=yes"


def test_never_says_whether_it_tolerates_spot_nodes_as_the_cluster_is_now() -> None:
    """never's words were kept as they stood where the pod carried them: a template's "none of which it reaches now"
    on the pods made from it once an EKS spot node group had scaled up, and "whose nodes it would tolerate" on those
    made once it had scaled down; an earlier release's words, rewritten as a place was added, said "whose nodes it
    would tolerate" with no spot node (found by a review of the spot policy). Their beginning is said as the cluster
    is now, and a second pass says the same."""
    on_demand = node("eks-od", {EKS: "ON_DEMAND", "eks.amazonaws.com/nodegroup": "gpu-od"})
    spot_node = node("eks-spot", {EKS: "SPOT", "eks.amazonaws.com/nodegroup": "gpu-spot"})
    unreached = f"never (asked by annotation); {spot.KEPT_OFF_UNREACHED}{EKS_SPOT_TEXT}"
    reached = f"never (asked by annotation); {KEPT_OFF}{EKS_SPOT_TEXT}"
    for before, after, said in [
        ([on_demand], [on_demand, spot_node], reached),
        ([on_demand, spot_node], [on_demand], unreached),
    ]:
        template = _template(mutate(workload("Deployment", "never"), context(before)).object)
        made = _with_hash({"apiVersion": "v1", "kind": "Pod", **copy.deepcopy(template)})
        made["metadata"]["namespace"] = "ml"
        made["metadata"]["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w-5d8f9c7b6", "uid": "u", "controller": True}
        ]
        result = mutate(made, context(after))
        assert applied(result) == said and result.object["spec"] == made["spec"]
    # an earlier release's words, one place short, with no spot node: rewritten, in the words of now
    earlier = pod("never", affinity=with_terms({"matchExpressions": [NOT_EKS_SPOT[0]]}))
    earlier["metadata"]["annotations"][APPLIED] = f"never (asked by annotation); {spot.KEPT_OFF_BEFORE}{EKS}=SPOT"
    result = mutate(earlier, context([on_demand]))
    assert applied(result) == unreached
    assert required_of(result.object) == [{"matchExpressions": NOT_EKS_SPOT}]


@pytest.mark.parametrize("mode", ["require", "prefer"])
def test_a_pod_bound_after_a_pass_loses_the_affinity_that_pass_added(mode: str) -> None:
    """A first pass added spot affinity; a later webhook bound the pod (spec.nodeName) and the reinvocation wrote
    "bound to node ...: no affinity" over the words that named it, leaving the affinity, which no pass could then
    take out, and the kubelet refused the pod (found by a review of this session's commits)."""
    nodes = [node("spot", {EKS: "SPOT"}), node("on-demand", {EKS: "ON_DEMAND"})]
    ctx = context(nodes)
    first = mutate(pod(mode), ctx).object
    assert "affinity" in first["spec"]
    first["spec"]["nodeName"] = "on-demand"
    again = mutate(first, context(nodes, **{}))
    assert "affinity" not in again.object["spec"], again.object["spec"]
    assert "bound to node on-demand: no affinity" in (applied(again) or "")


def _cpu_node(name: str, labels: dict[str, str]) -> Any:
    out = node(name, labels, gpus=0)
    del out["metadata"]["labels"]["nvidia.com/gpu.product"]
    return out


@pytest.mark.parametrize(
    "nodes",
    [
        pytest.param([], id="unknown"),
        pytest.param([ON_DEMAND], id="on-demand"),
        pytest.param([ON_DEMAND, *PROVIDERS["gke"][0]], id="gke-spot"),
        pytest.param([_cpu_node("cpu-spot", {KARPENTER: "spot"}), node("eks-od", {EKS: "ON_DEMAND"})], id="cpu-spot"),
    ],
)
def test_the_view_says_once_what_the_spot_policy_asks_of_every_request(nodes: list[Any]) -> None:
    """Whether spot capacity is there now, and the label keys of on-demand groups, were worked out from the groups on
    every request (found by a review): the view carries them, built with it, as the groups say."""
    view = context(nodes).cluster
    assert view.spot_now is any(g.spot for g in view.groups)
    assert view.gpu_spot_now is any(g.spot and g.has_gpu for g in view.groups)
    assert view.on_demand_keys == {k for g in view.groups if not g.spot for k in g.labels}


@pytest.mark.parametrize("own_zone", [False, True], ids=["spot-alone", "own-zone-too"])
def test_the_cuda_refusal_blames_require_only_where_the_spot_places_alone_keep_the_pod_off(own_zone: bool) -> None:
    """The refusal's advice (target the on-demand pool that runs its CUDA) names spot: require as what keeps the pod
    off that pool only where the spot places alone do: a pod whose own zone rule kept it off too was told to leave
    require, which would not have let it run there (found by the last read of a session's change)."""
    from tests.cuda_fixtures import container, context, gpu_node
    from tests.cuda_fixtures import pod as cuda_pod

    zone = "topology.kubernetes.io/zone"
    spot_taint = {"key": GKE_SPOT, "value": "true", "effect": "NoSchedule"}
    old_spot = gpu_node("old-2", "old-spot", "535.104.05", taints=[spot_taint], labels={GKE_SPOT: "true", zone: "z1"})
    on_demand = gpu_node("od-1", "od-new", "570.124.06", labels={zone: "z2"})
    rule = {"nodeSelectorTerms": [{"matchExpressions": [expr(zone, "z1")]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": rule}} if own_zone else None
    image = "pytorch/pytorch-nightly:2700000-cu12.8"  # CUDA 12.8, no forward compatibility
    obj = cuda_pod(container(image=image), annotations={ANNOTATION: "require"}, affinity=affinity)
    result = pipeline.review(obj, context([old_spot, on_demand]))
    assert not result.allowed
    advice = next(line for line in result.message.split("\n") if "target pool od-new" in line)
    assert "its required node affinity keeps it off that pool too" in advice, advice
    assert (spot.KEPT_OFF_BY_REQUIRE in advice) != own_zone, advice


def test_the_tolerate_hint_is_given_only_where_every_taint_is_a_spot_taint_tolerate_reaches() -> None:
    """The cuda and mig policies' advice adds "(or annotation gpu-admission.io/spot: tolerate)" to the taints that
    keep a pod off a pool only where tolerate would tolerate them all: the presets' spot taints and extra_taints."""
    from webhook.cluster import Taint

    spot_taint, gpu = Taint(GKE_SPOT, "true", "NoSchedule"), Taint("sku", "gpu", "NoSchedule")
    own = Taint("example.com/cheap", "yes", "NoSchedule")
    plain = Context(settings=Settings(), cluster=build_view([], Settings()), namespace="ml")
    extra = Settings(spot=SpotSettings(extra_taints=[TaintSpec("example.com/cheap", "yes", "NoSchedule")]))
    with_extra = Context(settings=extra, cluster=build_view([], extra), namespace="ml")
    assert spot.tolerate_hint([spot_taint], plain) == " (or annotation gpu-admission.io/spot: tolerate)"
    assert spot.tolerate_hint([spot_taint, gpu], plain) == ""  # tolerate would leave sku=gpu untolerated
    assert spot.tolerate_hint([own], plain) == ""
    assert spot.tolerate_hint([own, spot_taint], with_extra) != ""
    assert spot.tolerate_hint([], plain) == ""


@pytest.mark.parametrize("gated", [False, True], ids=["created", "gated"])
def test_the_cuda_warning_names_never_not_the_pods_own_rules_where_only_never_keeps_it_off_a_pool(gated: bool) -> None:
    """A never pod that selects an A100 only a spot pool has: the cuda policy's "no known GPU node matches" said
    "its nodeSelector/affinity excludes pool gpuspot" of the NotIn the spot policy wrote, which the user did not
    write and could not find in the manifest (found on a gated pod, which is kept off every spot pool)."""
    from tests.cuda_fixtures import container, context, gpu_node
    from tests.cuda_fixtures import pod as cuda_pod

    accelerator = "cloud.google.com/gke-accelerator"
    spot_taint = {"key": GKE_SPOT, "value": "true", "effect": "NoSchedule"}
    a100 = {GKE_SPOT: "true", accelerator: "nvidia-a100-80gb"}
    spot_pool = gpu_node("spot-1", "gpuspot", "570.124.06", taints=[spot_taint], labels=a100)
    on_demand = gpu_node("od-1", "l4", "570.124.06", labels={accelerator: "nvidia-l4"})
    obj = cuda_pod(
        container(image="pytorch/pytorch-nightly:2700000-cu12.8"),
        annotations={ANNOTATION: "never"},
        node_selector={accelerator: "nvidia-a100-80gb"},
    )
    if gated:
        obj["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    result = pipeline.review(obj, context([spot_pool, on_demand]))
    assert result.allowed, result.message
    said = [w for w in result.warnings if w.startswith("cuda: no known GPU node")]
    assert said == [f"cuda: no known GPU node matches ({spot.KEPT_OFF_BY_NEVER} excludes pool gpuspot; and 1 more)"], (
        result.warnings
    )
    decision = result.object["metadata"]["annotations"]["gpu-admission.io/cuda"].split("\ndecision: ")[1]
    whole = f"({spot.KEPT_OFF_BY_NEVER} excludes pool gpuspot; its nodeSelector/affinity excludes pool l4)"
    assert whole in decision, decision


def test_a_mig_refusal_under_never_names_its_notin_not_the_pods_node_affinity() -> None:
    """A never pod's 0.5 GPU, whose profile only an untainted spot pool offers: the NotIn the spot policy wrote keeps
    it off that pool, and the mig policy's refusal said "its node affinity", rules the user did not write (found by
    a review of the spot policy). Through the webhook's /mutate."""
    from tests.conftest import review
    from tests.mig_fixtures import mixed_node
    from webhook.app import create_app
    from webhook.cluster import StaticCluster

    spot_mig = mixed_node(
        "spot-1", "NVIDIA-A100-SXM4-40GB", {"3g.20gb": 2}, "spot-a100", 40960, {}, 0, {GKE_SPOT: "true"}
    )
    od_node = mixed_node("od-0", "NVIDIA-A100-SXM4-40GB", {"1g.5gb": 7}, "a100-od", 40960)
    settings = Settings(cuda=CudaSettings(mode="off"), cluster=ClusterSettings(providers=["gke"]))
    app = create_app(settings, cluster=StaticCluster(build_view([spot_mig, od_node], settings)))
    answer = app.test_client().post("/mutate", json=review(pod("never", gpu="0.5"), namespace="ml")).get_json()
    message = answer["response"]["status"]["message"]
    assert f"MIG pools this pod cannot use: spot-a100 (3g.20gb; {spot.KEPT_OFF_BY_NEVER})." in message, message


def test_the_spot_policy_imports_what_it_reads_of_the_cuda_steering_at_module_level() -> None:
    """Found by a review: the spot policy imported the cuda policy inside a function (the cuda policy imports this
    one) for the keys the CUDA steering writes; those now live in ``webhook.policies.steering``, which both import,
    and no import of the spot policy is hidden in a function."""
    import ast

    tree = ast.parse(Path(spot.__file__).read_text())
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    hidden = [i for f in functions for i in ast.walk(f) if isinstance(i, ast.Import | ast.ImportFrom)]
    assert [ast.unparse(i) for i in hidden] == []


def test_the_spot_annotation_and_its_event_write_the_pods_node_name_escaped() -> None:
    """A pod's spec.nodeName is the user's text, which the webhook sees before the apiserver validates it: a newline
    and a right-to-left override in it were written into gpu-admission.io/spot-applied and its SpotTolerated Event as
    they are, which ``kubectl describe`` shows as stored (a line of its own, a reordered line), as ``escaped`` writes
    them now (the cuda annotation's way). Through the webhook's /mutate and /validate; a second pass keeps them."""
    nodes = [
        node("spot-1", {GKE_SPOT: "true"}, (f"{GKE_SPOT}=true:NoSchedule",)),
        node("od-1", {"cloud.google.com/gke-nodepool": "l4"}),
    ]
    bound = pod("require")
    bound["spec"]["nodeName"] = "od-1\n\u202ex"
    answered = through_app(bound, nodes, Settings())
    said = "; bound to node od-1\\n\\u202ex: no affinity"
    assert answered.object["metadata"]["annotations"][APPLIED].endswith(said), answered.object["metadata"]
    events = [e.message for e in answered.events if e.reason == "SpotTolerated"]
    assert len(events) == 1 and events[0].endswith(said), answered.events
    assert through_app(answered.object, nodes, Settings()).object == answered.object

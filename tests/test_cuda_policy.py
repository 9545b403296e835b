"""The cuda policy through the pipeline: deny, steer, admit, annotate, warn; idempotent mutation."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
from decimal import Decimal
from typing import Any

import pytest

from tests.conftest import FIXTURES
from tests.cuda_fixtures import A100, POOL_LABEL, container, context, deployment, gpu_node, pod, settings
from tests.mig_fixtures import through_app
from webhook import pipeline
from webhook.cluster import build_view
from webhook.config import Settings
from webhook.model import LAST_APPLIED, Context
from webhook.policies import cuda, steering

CUDA_KEY = "gpu-admission.io/cuda"
NEW_MAJOR, NEW_MINOR = "nvidia.com/cuda.runtime-version.major", "nvidia.com/cuda.runtime-version.minor"
OLD_MAJOR, OLD_MINOR = "nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor"

IMAGE_128 = "pytorch/pytorch-nightly:2700000-cu12.8"  # CUDA 12.8, no forward compatibility (no compat package)
DRIVER_128 = "570.26"  # the reference table's CUDA 12.8 GA row: the policy judges 12.8.1 as major.minor
IMAGE_124 = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"

# Pools: gpu-a on R535 (CUDA 12.2), gpu-b on R560 (CUDA 12.6), gpu-c on R570 (CUDA 12.8).
H100 = "NVIDIA-H100-80GB-HBM3"
RTX = "NVIDIA-GeForce-RTX-4090"
A = gpu_node("a-1", "gpu-a", "535.104.05")
B = gpu_node("b-1", "gpu-b", "560.35.03")
C = gpu_node("c-1", "gpu-c", "570.124.06")
# A k3s-like cluster: GPU VMs whose pools a label of the user's own names (cluster.poolLabelKeys), no provider's, so
# no autoscaler builds their nodes from a template: the steering writes terms on GFD's CUDA labels there.
K3S_POOL = "example.com/pool"


def k3s_node(name: str, pool: str, driver: str, **kw: Any) -> dict[str, Any]:
    return gpu_node(name, pool, driver, pool_label=K3S_POOL, **kw)


def from_cuda(major: int, minor: int) -> list[dict[str, Any]]:
    """The steering's GFD range terms: CUDA ``major.minor`` and up (``nvidia.com/cuda.runtime-version``)."""
    return [
        {
            "matchExpressions": [
                {"key": NEW_MAJOR, "operator": "In", "values": [str(major)]},
                {"key": NEW_MINOR, "operator": "Gt", "values": [str(minor - 1)]},
            ]
        },
        {"matchExpressions": [{"key": NEW_MAJOR, "operator": "Gt", "values": [str(major)]}]},
    ]


def k3s_context(nodes: list[dict[str, Any]]) -> Context:
    return context(nodes, settings(cluster={"poolLabelKeys": [K3S_POOL]}))


K3S_A, K3S_C = k3s_node("a-1", "gpu-a", "535.104.05"), k3s_node("c-1", "gpu-c", "570.124.06")


def required_terms(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"] if obj.get("kind") == "Pod" else obj["spec"]["template"]["spec"]
    node = spec.get("affinity", {}).get("nodeAffinity", {})
    terms: list[dict[str, Any]] = node.get("requiredDuringSchedulingIgnoredDuringExecution", {}).get(
        "nodeSelectorTerms", []
    )
    return terms


def not_in(key: str, *values: str) -> dict[str, Any]:
    """A nodeSelectorTerm: ``key`` NotIn ``values``."""
    return {"matchExpressions": [{"key": key, "operator": "NotIn", "values": list(values)}]}


def annotation_of(obj: dict[str, Any]) -> str:
    meta = obj["metadata"] if obj.get("kind") == "Pod" else obj["spec"]["template"]["metadata"]
    text: str = meta.get("annotations", {}).get(CUDA_KEY, "")
    return text


def assert_idempotent(result: pipeline.Result, ctx: Context) -> None:
    again = pipeline.mutate(copy.deepcopy(result.object), ctx)
    assert again.patch == [], again.patch
    assert pipeline.validate(result.object, ctx).allowed


# ---------------------------------------------------------------------------------------------------------------
# Which containers are GPU containers


@pytest.mark.parametrize(
    ("c", "gpu"),
    [
        pytest.param(container(gpu="1"), True, id="nvidia-gpu"),
        pytest.param(container(gpu=None, resources={"nvidia.com/mig-3g.40gb": "1"}), True, id="mig-resource"),
        pytest.param(container(gpu=None, resources={"gpu-admission.io/gpu-memory": "20Gi"}), True, id="gpu-memory"),
        pytest.param(container(gpu="500m"), True, id="fraction"),
        pytest.param(container(gpu="half"), True, id="garbage-amount-still-asks"),
        pytest.param(container(gpu="0"), False, id="zero"),
        pytest.param(container(gpu=None, env={"NVIDIA_VISIBLE_DEVICES": "all"}), True, id="visible-devices-all"),
        pytest.param(container(gpu=None, env={"NVIDIA_VISIBLE_DEVICES": "void"}), False, id="visible-devices-void"),
        pytest.param(container(gpu=None, env={"NVIDIA_VISIBLE_DEVICES": "none"}), False, id="visible-devices-none"),
        pytest.param(container(gpu=None), False, id="cpu-only"),
    ],
)
def test_gpu_containers(c: dict[str, Any], gpu: bool) -> None:
    assert cuda.is_gpu_container(c) is gpu


def test_fraction_counts_as_some_gpu_for_eligibility() -> None:
    spec = pod(container(gpu="500m"), container("side", gpu=None, resources={"nvidia.com/mig-1g.10gb": "2"}))["spec"]
    assert cuda.gpu_resources(spec) == {"nvidia.com/gpu": Decimal(0), "nvidia.com/mig-1g.10gb": Decimal(2)}


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(pod(container(gpu=None, image=IMAGE_128)), id="cpu-pod"),
        pytest.param(pod(container(gpu=None, image=IMAGE_128, env={"NVIDIA_VISIBLE_DEVICES": "void"})), id="void"),
    ],
)
def test_non_gpu_pods_pass_untouched(obj: dict[str, Any]) -> None:
    result = pipeline.review(obj, context([A]))
    assert result.allowed and result.patch == [] and result.warnings == []
    assert not result.outcome.events
    assert "cuda-decision" not in result.audit


# ---------------------------------------------------------------------------------------------------------------
# The reference table's boundaries: a driver exactly at a minor's minimum and one below


@pytest.mark.parametrize(
    ("driver", "image", "allowed"),
    [
        pytest.param("570.26", "pytorch/pytorch-nightly:2700000-cu12.8", True, id="12.8-at-minimum"),
        pytest.param("570.25", "pytorch/pytorch-nightly:2700000-cu12.8", False, id="12.8-one-below"),
        pytest.param("550.54.14", "nvidia/cuda:12.4.1-base-ubuntu22.04", True, id="12.4-at-minimum"),
        pytest.param("550.54.13", "nvidia/cuda:12.4.1-base-ubuntu22.04", False, id="12.4-one-below"),
        pytest.param("535.54.03", "nvidia/cuda:12.2.2-base-ubuntu22.04", True, id="12.2-at-minimum"),
        pytest.param("535.54.02", "nvidia/cuda:12.2.2-base-ubuntu22.04", False, id="12.2-one-below"),
        pytest.param("580.65.06", "pytorch/pytorch:2.9.1-cuda13.0-cudnn9-runtime", True, id="13.0-at-minimum-ga-row"),
        pytest.param("580.65.05", "pytorch/pytorch:2.9.1-cuda13.0-cudnn9-runtime", False, id="13.0-one-below"),
        pytest.param("520.61.05", "nvidia/cuda:11.8.0-base-ubuntu22.04", True, id="11.8-at-minimum"),
        pytest.param("520.61.04", "nvidia/cuda:11.8.0-base-ubuntu22.04", False, id="11.8-one-below"),
        pytest.param("610.43.02", "nvidia/cuda:13.3.0-base-ubuntu24.04", True, id="13.3-secondary-row"),
        pytest.param("999.1", "nvidia/cuda:13.9.0-base-ubuntu24.04", False, id="release-newer-than-table"),
        # NGC 24.06 is built on CUDA 12.5.0: a CUDA 12.4 (R550) driver does not run it, R555 does
        # (its forward compatibility, R470, R535 and R550 on amd64 nodes, is not counted on a node of no known CPU
        # architecture: these have no kubernetes.io/arch label)
        pytest.param("550.54.14", "nvcr.io/nvidia/pytorch:24.06-py3", False, id="ngc-24.06-on-12.4-driver"),
        pytest.param("555.42.02", "nvcr.io/nvidia/pytorch:24.06-py3", True, id="ngc-24.06-at-12.5-minimum"),
    ],
)
@pytest.mark.parametrize("runtime_labels", [True, False], ids=["gfd-cuda-label", "cuda-from-driver-table"])
def test_table_boundaries(driver: str, image: str, allowed: bool, runtime_labels: bool) -> None:
    ctx = context([gpu_node("n", "pool-x", driver, runtime_labels=runtime_labels)])
    result = pipeline.review(pod(container(image=image)), ctx)
    assert result.allowed is allowed, result.message
    if not allowed:
        assert result.reason == "CUDAIncompatible"


def test_an_ngc_release_of_a_cuda_without_a_driver_row_is_not_refused_on_a_driver_newer_than_every_row() -> None:
    """NGC 26.08-26.10 are CUDA 13.4 (Triton release notes), which the driver table has no row for. Read so, such a
    tag is refused on a pool whose CUDA the webhook works out from its driver (a declared pool, a node with no
    cuda.runtime-version label) whatever the driver: R620 is told "CUDA 13.3", the newest row it meets. Until 13.4
    has a row those tags read no CUDA, and the pod is admitted with the warning that asks for its version."""
    ctx = context([gpu_node("n", "pool-x", "620.10.01", runtime_labels=False)])
    result = pipeline.review(pod(container(image="nvcr.io/nvidia/pytorch:26.10-py3")), ctx)
    assert result.allowed, result.message
    assert any("CUDA version unknown" in w for w in result.warnings), result.warnings


# ---------------------------------------------------------------------------------------------------------------
# Decisions


def test_all_compatible_admits_without_changing_placement() -> None:
    ctx = context([B, C])
    result = pipeline.review(pod(container(image=IMAGE_124)), ctx)
    assert result.allowed and result.warnings == []
    assert required_terms(result.object) == []
    text = annotation_of(result.object)
    assert text.startswith("trainer: CUDA 12.4 from image tag, nvidia/cuda 12.4.1-runtime-ubuntu22.04; supported by")
    assert "decision: admitted: every pool the pod can land on supports its CUDA" in text
    assert [e.reason for e in result.outcome.events] == ["CUDAChecked"]
    assert result.audit["cuda-decision"] == "compatible (pools gpu-b, gpu-c)"
    assert_idempotent(result, ctx)


def test_none_compatible_denies_with_an_actionable_message() -> None:
    # gpu-c could run it, but the pod's nodeSelector keeps it on gpu-a / gpu-b.
    nodes = [A, B, gpu_node("c-1", "gpu-c", "570.124.06", labels={"tier": "prod"})]
    ctx = context(nodes)
    obj = pod(container(image=IMAGE_128))
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}]
            }
        }
    }
    result = pipeline.review(obj, ctx)
    assert not result.allowed and result.reason == "CUDAIncompatible" and result.code == 403
    msg = result.message
    for part in (
        "container trainer",  # which container
        f"image {IMAGE_128}",  # which image
        "needs CUDA 12.8",  # which version
        "from image tag, pytorch nightly 2700000-cu12.8",  # where it came from
        "pool gpu-a (driver 535.104.05, CUDA 12.2)",  # the pools with driver and CUDA
        "pool gpu-b (driver 560.35.03, CUDA 12.6)",
        "Use an image built for CUDA <= 12.6",  # what to do
        "target pool gpu-c (driver 570.124.06, CUDA 12.8) with nodeSelector eks.amazonaws.com/nodegroup: gpu-c",
        "upgrade the driver to >= 570.26 on pools gpu-a, gpu-b",
    ):
        assert part in msg, (part, msg)
    assert result.patch == [] and result.object == obj
    assert result.audit["decision"].startswith("denied (CUDAIncompatible")
    assert not result.outcome.events  # the pod will not exist: nothing to attach an event to


def test_a_pool_known_by_its_old_driver_labels_is_advised_with_them() -> None:
    """A pool with no provider pool label (a k3s box), grouped by its product and driver, carries only GFD's older
    driver labels: the advice selects it by those (it had no nodeSelector to give)."""
    box = gpu_node("box-1", "ignored", "570.124.06", gfd="old", pool_label="example.com/rack")
    obj = pod(container(image=IMAGE_128))
    obj["spec"]["nodeSelector"] = {POOL_LABEL: "gpu-a"}
    result = pipeline.review(obj, context([A, box]))
    assert not result.allowed
    selector = "nodeSelector nvidia.com/cuda.driver.major: 570, nvidia.com/cuda.driver.minor: 124"
    assert f"{selector}, nvidia.com/cuda.driver.rev: 06" in result.message, result.message


def test_a_pool_whose_nodes_offer_no_gpu_is_not_advised() -> None:
    """A pool new enough whose nodes have no GPU to give (allocatable nvidia.com/gpu 0: the device plugin down) is
    no place to send the pod: the denial does not say to target it."""
    empty = gpu_node("c-1", "gpu-c", "570.124.06")
    empty["status"]["allocatable"]["nvidia.com/gpu"] = "0"
    result = pipeline.review(pod(container(image=IMAGE_128)), context([A, empty]))
    assert not result.allowed
    assert "target pool gpu-c" not in result.message
    assert "upgrade the driver to >= 570.26 on pool gpu-a" in result.message


def test_some_compatible_steers_on_gfd_cuda_labels() -> None:
    """On a k3s-like cluster (an EKS one is steered by its node groups: see
    test_node_groups_an_autoscaler_makes_from_zero_are_steered_to_by_their_pool_label)."""
    ctx = k3s_context([K3S_A, k3s_node("b-1", "gpu-b", "560.35.03"), K3S_C])
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed, result.message
    assert required_terms(result.object) == from_cuda(12, 8)
    text = annotation_of(result.object)
    assert "supported by pool gpu-c (driver 570.124.06, CUDA 12.8)" in text
    # the affinity that keeps it off them is the webhook's, and said so (a user-journey review: a Pod's line read
    # as if the user had written it); said again as it stands when the apiserver calls again (reinvocation)
    assert text.endswith(
        "required node affinity keeps it off pool gpu-a (driver 535.104.05, CUDA 12.2), "
        "pool gpu-b (driver 560.35.03, CUDA 12.6); the steering gpu-admission added is what keeps it off pools gpu-a,"
        " gpu-b"
    )
    assert "cuda-steered" in result.audit and "to pool gpu-c" in result.audit["cuda-steered"]
    assert [c.group.pool for c in ctx.cluster.eligible(result.object["spec"])] == ["gpu-c"]
    assert_idempotent(result, ctx)
    # its own affinity keeps it off gpu-b: only gpu-a is the steering's
    own = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [not_in(K3S_POOL, "gpu-b")]}}
    result = pipeline.review(pod(container(image=IMAGE_128), affinity={"nodeAffinity": own}), ctx)
    assert annotation_of(result.object).endswith(
        "CUDA 12.6); the steering gpu-admission added is what keeps it off pool gpu-a"
    )
    assert_idempotent(result, ctx)
    # a pod whose own affinity alone keeps it off them is not told the webhook's steering did
    on_c = {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": K3S_POOL, "operator": "In", "values": ["gpu-c"]}]}]
        }
    }
    obj = pipeline.review(pod(container(image=IMAGE_128), affinity={"nodeAffinity": on_c}), ctx).object
    text = annotation_of(obj)
    assert text.endswith("pool gpu-b (driver 560.35.03, CUDA 12.6)"), text
    # an earlier pass's clause is kept only where its pools are those this review finds the steering's: one written
    # by hand was kept verbatim, control characters and all (a review)
    assert annotation_of(forged(obj, text + f"; {cuda.STEERED_OFF}pool gpu-a", ctx)) == text
    steered_text = annotation_of(result.object)
    plain = steered_text.rpartition(f"; {cuda.STEERED_OFF}")[0]  # this review's words, its own clause not said
    assert annotation_of(forged(result.object, steered_text + "\r\x1b[2Kdecision: denied", ctx)) == plain


def forged(obj: dict[str, Any], words: str, ctx: Context) -> dict[str, Any]:
    """``obj`` mutated again with ``words`` in place of its gpu-admission.io/cuda (a user's, or a forger's)."""
    obj = copy.deepcopy(obj)
    obj["metadata"]["annotations"][CUDA_KEY] = words
    again: dict[str, Any] = pipeline.mutate(obj, ctx).object
    return again


def test_steering_keeps_future_newer_nodes_eligible() -> None:
    """Where GFD's labels are steered on (k3s-like); pools an autoscaler makes nodes for are named instead, and a
    pool added later is not in the terms until the workload's template is updated."""
    old, new = K3S_A, k3s_node("b-1", "gpu-b", "560.35.03")
    result = pipeline.review(pod(container(image=IMAGE_124)), k3s_context([old, new]))
    later = k3s_context([old, new, k3s_node("d-1", "gpu-d", "580.95.05")])  # a CUDA 13.0 pool added afterwards
    assert {c.group.pool for c in later.cluster.eligible(result.object["spec"])} == {"gpu-b", "gpu-d"}


def test_steering_with_old_gfd_labels() -> None:
    nodes = [k3s_node("a-1", "gpu-a", "535.104.05", gfd="old"), k3s_node("c-1", "gpu-c", "570.26", gfd="old")]
    ctx = k3s_context(nodes)
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed
    keys = {e["key"] for t in required_terms(result.object) for e in t["matchExpressions"]}
    assert keys == {OLD_MAJOR, OLD_MINOR}
    assert "pool gpu-c (driver 570.26, CUDA 12.8)" in annotation_of(result.object)
    assert_idempotent(result, ctx)


def test_steering_with_old_and_new_labels_mixed() -> None:
    nodes = [A, gpu_node("c-1", "gpu-c", "570.124.06", gfd="old"), gpu_node("d-1", "gpu-d", "575.51.03")]
    ctx = context(nodes)
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed
    assert {c.group.pool for c in ctx.cluster.eligible(result.object["spec"])} == {"gpu-c", "gpu-d"}
    assert_idempotent(result, ctx)


def test_exact_values_when_a_newer_pool_is_blocked() -> None:
    # gpu-c has the newest CUDA but compute capability 7.0, which the arch condition rules out: no range works.
    nodes = [K3S_A, k3s_node("b-1", "gpu-b", "520.61.05"), k3s_node("c-1", "gpu-c", "570.124.06", compute=("7", "0"))]
    ctx = k3s_context(nodes)
    obj = pod(container(image="ubuntu:22.04", env={"NVIDIA_REQUIRE_CUDA": "cuda>=11.8,arch>=8.0"}))
    result = pipeline.review(obj, ctx)
    assert result.allowed
    assert {c.group.pool for c in ctx.cluster.eligible(result.object["spec"])} == {"gpu-a", "gpu-b"}
    assert required_terms(result.object) == [
        {
            "matchExpressions": [
                {"key": NEW_MAJOR, "operator": "In", "values": ["11"]},
                {"key": NEW_MINOR, "operator": "In", "values": ["8"]},
            ]
        },
        {
            "matchExpressions": [
                {"key": NEW_MAJOR, "operator": "In", "values": ["12"]},
                {"key": NEW_MINOR, "operator": "In", "values": ["2"]},
            ]
        },
    ]
    assert_idempotent(result, ctx)


ZONE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z1"]}]},
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z2"]}]},
            ]
        }
    },
    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
}


@pytest.mark.parametrize(
    ("kind", "wrap"),
    [
        pytest.param("Pod", lambda p: p, id="pod"),
        pytest.param(
            "Deployment",
            lambda p: {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "d", "namespace": "ml"},
                "spec": {"template": {"metadata": p["metadata"], "spec": p["spec"]}},
            },
            id="deployment-template",
        ),
    ],
)
def test_steering_merges_into_existing_affinity(kind: str, wrap: Any) -> None:
    zoned = [
        k3s_node(f"{p}-{z}", f"gpu-{p}", d, labels={"topology.kubernetes.io/zone": z})
        for p, d in (("a", "535.104.05"), ("c", "570.124.06"))
        for z in ("z1", "z2", "z3")
    ]
    ctx = k3s_context(zoned)
    obj = wrap(pod(container(image=IMAGE_128), affinity=copy.deepcopy(ZONE_AFFINITY)))
    result = pipeline.review(obj, ctx)
    assert result.allowed and result.object["kind"] == kind
    terms = required_terms(result.object)
    assert len(terms) == 4  # each zone term ANDed with each CUDA alternative
    for term in terms:
        keys = [e["key"] for e in term["matchExpressions"]]
        assert keys[0] == "topology.kubernetes.io/zone" and NEW_MAJOR in keys
    spec = result.object["spec"] if kind == "Pod" else result.object["spec"]["template"]["spec"]
    assert "podAntiAffinity" in spec["affinity"]
    assert {(c.group.pool, c.group.labels["topology.kubernetes.io/zone"]) for c in ctx.cluster.eligible(spec)} == {
        ("gpu-c", "z1"),
        ("gpu-c", "z2"),
    }
    assert_idempotent(result, ctx)


def test_gke_pools_without_gfd_steer_by_declared_pool_selector() -> None:
    s = settings(
        cluster={
            "pools": [
                {
                    "name": "t4-old",
                    "nodeSelector": {"cloud.google.com/gke-nodepool": "t4-old"},
                    "driverVersion": "535.104.05",
                    "gpuProduct": "Tesla-T4",
                },
                {
                    "name": "l4-new",
                    "nodeSelector": {"cloud.google.com/gke-nodepool": "l4-new"},
                    "driverVersion": "570.124.06",
                    "gpuProduct": "NVIDIA-L4",
                },
            ]
        }
    )
    gke = [
        gpu_node("gke-t4-1", "t4-old", None, gfd="none", pool_label="cloud.google.com/gke-nodepool"),
        gpu_node("gke-l4-1", "l4-new", None, gfd="none", pool_label="cloud.google.com/gke-nodepool"),
    ]
    ctx = context(gke, s)
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed, result.message
    assert required_terms(result.object) == [
        {"matchExpressions": [{"key": "cloud.google.com/gke-nodepool", "operator": "In", "values": ["l4-new"]}]}
    ]
    assert "pool l4-new (driver 570.124.06, CUDA 12.8)" in annotation_of(result.object)
    assert_idempotent(result, ctx)
    # Pinned to the old pool: denied, naming the driver declared in settings and the pool that would do.
    pinned = pod(container(image=IMAGE_128), node_selector={"cloud.google.com/gke-nodepool": "t4-old"})
    denied = pipeline.review(pinned, ctx)
    assert not denied.allowed
    assert "pool t4-old (driver 535.104.05, CUDA 12.2)" in denied.message
    assert (
        "target pool l4-new (driver 570.124.06, CUDA 12.8) with nodeSelector cloud.google.com/gke-nodepool: "
        "l4-new" in denied.message
    )


def test_declared_pool_scaled_to_zero_is_eligible() -> None:
    s = settings(
        cluster={
            "pools": [
                {
                    "name": "h100",
                    "nodeSelector": {"pool": "h100"},
                    "driverVersion": "580.95.05",
                    "gpuProduct": "NVIDIA-H100-80GB-HBM3",
                    "gpuCount": 8,
                }
            ]
        }
    )
    ctx = context([A], s)
    result = pipeline.review(pod(container(image="pytorch/pytorch:2.9.1-cuda13.0-cudnn9-runtime")), ctx)
    assert result.allowed
    assert required_terms(result.object) == [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["h100"]}]}
    ]
    assert_idempotent(result, ctx)


GKE_POOL, GKE_ACCELERATOR = "cloud.google.com/gke-nodepool", "cloud.google.com/gke-accelerator"


@pytest.mark.parametrize(
    ("node", "old", "new", "selector"),
    [
        pytest.param(
            gpu_node("a-1", "gpu-a", "535.104.05", labels={"kubernetes.io/os": "linux"}),
            [],
            {"eks.amazonaws.com/nodegroup": "h100"},
            {"kubernetes.io/os": "linux"},
            id="helm-chart-os",
        ),
        pytest.param(
            gpu_node("gke-1", "old", None, gfd="none", pool_label=GKE_POOL, labels={GKE_ACCELERATOR: "nvidia-l4"}),
            [
                {
                    "name": "old",
                    "nodeSelector": {GKE_POOL: "old"},
                    "driverVersion": "535.104.05",
                    "gpuProduct": "NVIDIA-L4",
                }
            ],
            {GKE_POOL: "h100"},
            {GKE_ACCELERATOR: "nvidia-l4"},
            id="gke-accelerator",
        ),
    ],
)
def test_a_pod_that_selects_a_label_of_a_declared_pool_at_zero_is_steered_there(
    node: dict[str, Any], old: list[dict[str, Any]], new: dict[str, str], selector: dict[str, str]
) -> None:
    """The pool at zero carries the labels its nodes are certain to (the kubelet's OS, GKE's accelerator type of
    its gpuProduct): a pod that selects one was refused, only the running pool of the old driver left to it, and
    the advice to select the pool at zero then said its pool was not known."""
    declared = {"name": "h100", "nodeSelector": new, "driverVersion": "580.95.05", "gpuProduct": "NVIDIA-L4"}
    ctx = context([node], settings(cluster={"pools": [*old, declared]}))
    obj = pod(container(image="pytorch/pytorch:2.9.1-cuda13.0-cudnn9-runtime"), node_selector=selector)
    result = pipeline.review(obj, ctx)
    assert result.allowed, result.message
    assert result.object["spec"]["nodeSelector"] == selector
    ((key, value),) = new.items()
    assert required_terms(result.object) == [{"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}]
    assert_idempotent(result, ctx)


# ---------------------------------------------------------------------------------------------------------------
# Expressions: forward compatibility, invalid ones, minor-version compatibility

FORWARD = "cuda>=12.8 brand=tesla,driver>=535,driver<536 brand=tesla,driver>=570,driver<571"


@pytest.mark.parametrize(
    ("node", "cuda_settings", "allowed"),
    [
        pytest.param(A, None, True, id="tesla-on-listed-branch"),
        pytest.param(
            gpu_node("g", "geforce", "535.104.05", product="NVIDIA-GeForce-RTX-4090"),
            None,
            False,
            id="geforce-not-accepted",
        ),
        pytest.param(B, None, False, id="branch-not-listed"),
        pytest.param(A, {"forwardCompatibility": False}, False, id="forward-compat-switched-off"),
    ],
)
def test_forward_compatibility_alternatives(
    node: dict[str, Any], cuda_settings: dict[str, Any] | None, allowed: bool
) -> None:
    ctx = context([node], settings(cuda_settings))
    obj = pod(container(image="vllm/vllm-openai:v0.10.1", env={"NVIDIA_REQUIRE_CUDA": FORWARD}))
    result = pipeline.review(obj, ctx)
    assert result.allowed is allowed, result.message
    if allowed:
        assert "forward compatibility on pool gpu-a" in annotation_of(result.object)
    else:
        assert "env NVIDIA_REQUIRE_CUDA" in result.message and "needs CUDA 12.8" in result.message


# nvidia/cuda 12.8's NVIDIA_REQUIRE_CUDA, one branch of it: every brand may use the compat package, as far as the
# runtime's check goes.
EVERY_BRAND = "cuda>=12.8 " + " ".join(
    f"brand={b},driver>=535,driver<536"
    for b in ("tesla", "unknown", "nvidia", "nvidiartx", "geforce", "geforcertx", "quadro", "quadrortx", "titan")
)


def test_forward_compatibility_only_on_data_center_gpus() -> None:
    """The runtime's check passes on a GeForce GPU too, and the CUDA application then fails with error 804: denied,
    saying so; on an H100 of the same driver it is admitted as forward compatibility."""
    geforce = gpu_node("g", "geforce", "535.104.05", product="NVIDIA-GeForce-RTX-4090")
    image = "pytorch/pytorch-nightly:2800000-cu12.8"
    obj = pod(container(image=image, env={"NVIDIA_REQUIRE_CUDA": EVERY_BRAND}))
    denied = pipeline.review(obj, context([geforce]))
    assert not denied.allowed
    assert "match the driver of pool geforce, but forward compatibility works only on data-center GPUs" in (
        denied.message
    )
    assert "NVIDIA-GeForce-RTX-4090" in denied.message and "error 804" in denied.message
    admitted = pipeline.review(copy.deepcopy(obj), context([A]))
    assert admitted.allowed and "forward compatibility on pool gpu-a" in annotation_of(admitted.object)
    unknown = gpu_node("u", "gpu-u", "535.104.05", product="NVIDIA-Graphics-Device")
    unsure = pipeline.review(copy.deepcopy(obj), context([unknown]))
    assert not unsure.allowed and "(its GPU: NVIDIA-Graphics-Device, of a brand not known;" in unsure.message


def test_an_expression_without_cuda_is_no_forward_compatibility() -> None:
    result = pipeline.review(pod(container(env={"NVIDIA_REQUIRE_CUDA": "arch>=8.0"})), context([A]))
    assert result.allowed
    assert "supported by pool gpu-a" in annotation_of(result.object)
    assert "compatibility" not in annotation_of(result.object)


@pytest.mark.parametrize(
    ("requirement", "nodes", "fails", "targets"),
    [
        pytest.param("cuda>=12.0,driver<560", [C], "driver<560 does not hold", "", id="driver-upper-bound"),
        pytest.param("cuda>=12.0,arch>=9.0", [A], "arch>=9.0 does not hold", "", id="architecture"),
        pytest.param("cuda>=12.8,driver<560", [B], "cuda>=12.8 and driver<560 do not hold", "", id="both"),
        pytest.param(
            "cuda>=12.0,driver<560", [C, A], "driver<560 does not hold", "target pool gpu-a", id="another-pool-meets-it"
        ),
    ],
)
def test_a_requirement_beyond_cuda_is_named_with_what_fails(
    requirement: str, nodes: list[dict[str, Any]], fails: str, targets: str
) -> None:
    """A term that asks more than a CUDA floor: the denial names the whole requirement and what does not hold on
    each pool, and advises no driver upgrade or older image that could not help (a newer driver never meets
    driver<560)."""
    obj = pod(container(env={"NVIDIA_REQUIRE_CUDA": requirement}))
    if targets:
        obj["spec"]["nodeSelector"] = {POOL_LABEL: "gpu-c"}
    result = pipeline.review(obj, context(nodes))
    assert not result.allowed and result.reason == "CUDAIncompatible"
    msg = result.message
    assert f"needs requirement {requirement} (from env NVIDIA_REQUIRE_CUDA)" in msg, msg
    assert f", {fails}." in msg, msg
    fix = msg.split("To fix: ")[1].lower()
    assert "drop driver<560 from the requirement (from env nvidia_require_cuda)" in fix or "drop arch>=9.0" in fix
    assert "upgrade the driver" not in fix, "a newer driver cannot meet the rest of the term"
    assert ("use an image built for cuda <= 12.6" in fix) is requirement.startswith("cuda>=12.8"), msg
    assert (targets in fix) if targets else "target pool" not in fix, msg


def test_forward_alternatives_named_in_the_denial() -> None:
    result = pipeline.review(pod(container(env={"NVIDIA_REQUIRE_CUDA": FORWARD})), context([B]))
    assert "forward-compatibility alternatives (driver branches 535, 570) do not match" in result.message


@pytest.mark.parametrize(
    ("annotations", "env", "fix"),
    [
        pytest.param({}, {"NVIDIA_REQUIRE_CUDA": "cuda>=12.4 brnd=tesla"}, "(e.g. cuda>=12.4)", id="unknown-key"),
        pytest.param({}, {"NVIDIA_REQUIRE_CUDA": "cuda=>12.4"}, "(e.g. cuda>=12.4)", id="bad-operator"),
        pytest.param({}, {"CUDA_VERSION": "twelve"}, '(e.g. "12.4.1")', id="bad-cuda-version"),
        pytest.param({"gpu-admission.io/cuda-version.trainer": "12.4-ish"}, {}, '(e.g. "12.4")', id="bad-annotation"),
    ],
)
def test_invalid_declarations_are_denied(annotations: dict[str, str], env: dict[str, str], fix: str) -> None:
    result = pipeline.review(
        pod(container(image="registry.example/team/trainer:1", env=env), annotations=annotations), context([C])
    )  # an image whose own env sets no NVIDIA_REQUIRE_CUDA (an nvidia/cuda image's would decide over CUDA_VERSION)
    assert not result.allowed and result.reason == "CUDARequirementInvalid"
    assert "container trainer (image registry.example/team/trainer:1)" in result.message
    assert "To fix: write" in result.message and fix in result.message, "the remedy fits where it was written"


def test_minor_compatibility_mode() -> None:
    obj = pod(container(image=IMAGE_128))
    assert not pipeline.review(obj, context([A])).allowed
    result = pipeline.review(obj, context([A], settings({"compatibility": "minor"})))
    assert result.allowed
    assert "minor-version compatibility on pool gpu-a" in annotation_of(result.object)


def test_minor_compatibility_mode_advises_the_majors_floor() -> None:
    """CUDA 12.8 on a CUDA 11.8 driver (520): in minor mode any 12.x runs from 525.60.13, not only from 570.26."""
    r520 = gpu_node("r-1", "r520", "520.61.05")
    result = pipeline.review(pod(container(image=IMAGE_128)), context([r520], settings({"compatibility": "minor"})))
    assert not result.allowed
    assert "upgrade the driver to >= 525.60.13 on pool r520" in result.message
    strict = pipeline.review(pod(container(image=IMAGE_128)), context([r520]))
    assert "upgrade the driver to >= 570.26 on pool r520" in strict.message


def test_a_strict_lower_bound_needs_the_next_minor() -> None:
    """cuda>12.4 (compared at major.minor, as every bound is) is not met by a CUDA 12.4 driver: the denial asks for
    12.5 and its driver, not for what the node already has."""
    result = pipeline.review(
        pod(container(env={"NVIDIA_REQUIRE_CUDA": "cuda>12.4"})), context([gpu_node("r", "r550", "550.54.15")])
    )
    assert not result.allowed
    assert "needs CUDA 12.5" in result.message and ">= 555.42.02" in result.message


# ---------------------------------------------------------------------------------------------------------------
# Containers: every source, init containers, several containers


@pytest.mark.parametrize(
    ("c", "annotations", "source"),
    [
        pytest.param(
            container(image="ubuntu:22.04"),
            {"gpu-admission.io/cuda-version.trainer": "12.8"},
            "annotation gpu-admission.io/cuda-version.trainer",
            id="container-annotation",
        ),
        pytest.param(
            container(image="ubuntu:22.04"),
            {"gpu-admission.io/cuda-version": "12.8"},
            "annotation gpu-admission.io/cuda-version",
            id="pod-annotation",
        ),
        pytest.param(
            container(image="ubuntu:22.04", env={"NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}),
            {},
            "env NVIDIA_REQUIRE_CUDA",
            id="require-cuda",
        ),
        pytest.param(
            container(image="ubuntu:22.04", env={"CUDA_VERSION": "12.8.1"}), {}, "env CUDA_VERSION", id="cuda-version"
        ),
        pytest.param(
            container(image="pytorch/pytorch-nightly:2800000-cu12.8"),
            {},
            "image tag, pytorch nightly 2800000-cu12.8",
            id="image",
        ),
    ],
)
def test_every_source_reaches_the_denial(c: dict[str, Any], annotations: dict[str, str], source: str) -> None:
    result = pipeline.review(pod(c, annotations=annotations), context([A]))
    assert not result.allowed
    assert f"needs CUDA 12.8 (from {source})" in result.message


def test_disable_require_turns_off_every_requirement_of_the_environment() -> None:
    """The runtime checks none of NVIDIA_REQUIRE_CUDA or CUDA_VERSION then (reference: "true disables all
    requirements"); the webhook's own annotation still says what the container needs."""
    env = {"NVIDIA_DISABLE_REQUIRE": "true", "NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "CUDA_VERSION": "12.8.1"}
    result = pipeline.review(pod(container(image=IMAGE_128, env=env)), context([A]))
    assert result.allowed
    assert "disabled by env NVIDIA_DISABLE_REQUIRE" in annotation_of(result.object)
    declared = pod(container(image=IMAGE_128, env=env), annotations={"gpu-admission.io/cuda-version": "12.8"})
    assert not pipeline.review(declared, context([A])).allowed


def test_disable_require_is_not_checked() -> None:
    obj = pod(container(image=IMAGE_128, env={"NVIDIA_DISABLE_REQUIRE": "true"}))
    result = pipeline.review(obj, context([A]))
    assert result.allowed and result.warnings == []
    assert "CUDA requirement disabled by env NVIDIA_DISABLE_REQUIRE; not checked" in annotation_of(result.object)


def test_init_containers_are_checked() -> None:
    obj = pod(container(image=IMAGE_124), init=[container("warmup", image=IMAGE_128)])
    result = pipeline.review(obj, context([A, B]))
    assert not result.allowed
    assert f"container warmup (init) (image {IMAGE_128}) needs CUDA 12.8" in result.message
    ok = pipeline.review(obj, context([A, B, C]))
    assert ok.allowed and "warmup (init): CUDA 12.8" in annotation_of(ok.object)


def test_multi_container_pod_steers_to_what_all_can_run() -> None:
    obj = pod(
        container("a", image=IMAGE_124),
        container("b", image="ubuntu:22.04", env={"CUDA_VERSION": "12.6.3"}),
        container("sidecar", image="busybox", gpu=None),
    )
    ctx = context([A, B, C])
    result = pipeline.review(obj, ctx)
    assert result.allowed
    assert {c.group.pool for c in ctx.cluster.eligible(result.object["spec"])} == {"gpu-b", "gpu-c"}
    lines = annotation_of(result.object).splitlines()
    assert lines[0].startswith("a: CUDA 12.4 from image tag")
    assert lines[1].startswith("b: CUDA 12.6 from env CUDA_VERSION")
    assert not any(line.startswith("sidecar") for line in lines)  # not a GPU container
    assert_idempotent(result, ctx)


def test_containers_without_a_common_pool_are_denied() -> None:
    obj = pod(
        container("old", image="ubuntu:22.04", env={"NVIDIA_REQUIRE_CUDA": "cuda>=12.0,cuda<12.3"}),
        container("new", image=IMAGE_128),
    )
    result = pipeline.review(obj, context([A, C]))
    assert not result.allowed
    assert "no pool in common" in result.message
    assert "runs on pool gpu-a" in result.message and "runs on pool gpu-c" in result.message
    # each container with its image, and an expression whole: its upper bound is what keeps it off gpu-c
    assert "old (image ubuntu:22.04: requirement cuda>=12.0,cuda<12.3 from env NVIDIA_REQUIRE_CUDA)" in result.message
    assert f"new (image {IMAGE_128}: CUDA 12.8 from image tag" in result.message


# ---------------------------------------------------------------------------------------------------------------
# Unknowns


def test_unknown_version_warns_how_to_declare_it() -> None:
    obj = pod(container(image="registry.example.com/team/train:v3"))
    result = pipeline.review(obj, context([A]))
    assert result.allowed
    assert result.warnings == [
        'cuda: trainer: CUDA version unknown; set pod annotation gpu-admission.io/cuda-version.trainer: "X.Y"'
    ]
    assert all(len(w) < 120 for w in result.warnings)
    assert "trainer: CUDA version unknown (image registry.example.com/team/train:v3); not checked" in annotation_of(
        result.object
    )


def test_unknown_version_can_be_denied() -> None:
    result = pipeline.review(pod(container(image="team/train:v3")), context([A], settings({"unknownVersion": "deny"})))
    assert not result.allowed and result.reason == "CUDAVersionUnknown"
    assert 'gpu-admission.io/cuda-version.trainer: "<major.minor>"' in result.message


@pytest.mark.parametrize("length", [30, 51, 63])
def test_the_declaration_advised_for_a_long_container_name_is_one_the_apiserver_accepts(length: int) -> None:
    """cuda-version.<name> is an annotation name of 63 characters at most: past 50 characters of container name
    the pod-wide key is advised; in a warning, wherever its own would not fit on kubectl's line."""
    name = "t" * length
    obj = pod(container(name=name, image="registry.example.com/team/train:v3"))
    (warning,) = pipeline.review(obj, context([A])).warnings
    assert len(warning) < 120 and warning.endswith('"X.Y"'), warning
    assert f"cuda-version.{name}" not in warning and 'annotation gpu-admission.io/cuda-version: "X.Y"' in warning
    denied = pipeline.review(obj, context([A], settings({"unknownVersion": "deny"})))
    own = f'gpu-admission.io/cuda-version.{name}: "<major.minor>"'
    assert (own in denied.message) is (length <= 50), denied.message
    assert (length <= 50) or 'the pod annotation gpu-admission.io/cuda-version: "<major.minor>"' in denied.message


def test_unknown_version_can_be_allowed_silently() -> None:
    result = pipeline.review(pod(container(image="team/train:v3")), context([A], settings({"unknownVersion": "allow"})))
    assert result.allowed and result.warnings == []


NO_DRIVER = gpu_node("x-1", "gpu-x", None)  # GFD labels but no driver label


@pytest.mark.parametrize(
    ("setting", "allowed", "warned"),
    [
        pytest.param("warn", True, True, id="warn"),
        pytest.param("allow", True, False, id="allow"),
        pytest.param("deny", False, False, id="deny"),
    ],
)
def test_unknown_driver(setting: str, allowed: bool, warned: bool) -> None:
    ctx = context([NO_DRIVER], settings({"unknownDriver": setting}))
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed is allowed
    warning = "cuda: driver of pool gpu-x unknown; declare cluster.pools[].driverVersion or run GFD"
    assert (warning in result.warnings) is warned
    if allowed:  # the decision line says what was not checked, never "every pool ... supports its CUDA"
        decision = annotation_of(result.object).splitlines()[-1]
        assert decision == (
            "decision: admitted, unchecked on pool gpu-x, whose driver is unknown: run GPU Feature Discovery there or "
            "declare cluster.pools[].driverVersion"
        )
    if not allowed:
        assert result.reason == "CUDADriverUnknown"
        assert "the driver of every node it can run on is unknown: pool gpu-x" in result.message
        assert "Declare the driver of pool gpu-x in settings (cluster.pools[].driverVersion)" in result.message


def test_unknown_driver_pool_is_kept_when_steering() -> None:
    ctx = context([A, C, NO_DRIVER])
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed
    assert {c.group.pool for c in ctx.cluster.eligible(result.object["spec"])} == {"gpu-c", "gpu-x"}
    assert "decision: admitted, unchecked on pool gpu-x, whose driver is unknown" in annotation_of(result.object)
    assert_idempotent(result, ctx)


def test_no_eligible_node_is_not_checked() -> None:
    result = pipeline.review(pod(container(image=IMAGE_128), node_selector={"pool": "nowhere"}), context([A]))
    assert result.allowed
    assert "decision: not checked: no known GPU node matches" in annotation_of(result.object)
    # what keeps it off each pool is said, on the pod and in kubectl (found by a review of provider journeys: a pod
    # without AKS's documented sku=gpu toleration was admitted silently and sat Pending)
    because = "its nodeSelector/affinity excludes pool gpu-a"
    assert f"matches the pod's scheduling constraints ({because}); it stays Pending until" in annotation_of(
        result.object
    )
    assert f"cuda: no known GPU node matches ({because})" in result.warnings


def test_no_eligible_node_names_the_taint_it_does_not_tolerate() -> None:
    sku = {"key": "sku", "value": "gpu", "effect": "NoSchedule"}
    nodes = [gpu_node("t-1", "t4pool", "550.54.15", taints=[sku]), gpu_node("o-1", "other", "550.54.15")]
    obj = pod(container(image=IMAGE_124), node_selector={POOL_LABEL: "t4pool"})
    result = pipeline.review(obj, context(nodes))
    assert result.allowed
    assert result.warnings == [
        "cuda: no known GPU node matches (untolerated sku=gpu:NoSchedule of pool t4pool; and 1 more)"
    ]
    because = "untolerated sku=gpu:NoSchedule of pool t4pool; its nodeSelector/affinity excludes pool other"
    # long pools' names: no name cut unmarked at the warning's end, the taints past the first counted
    long = [gpu_node(f"t-{z}", f"a100-80gb-reserved-capacity-us-east-1{z}", "550.54.15", taints=[sku]) for z in "abc"]
    assert pipeline.review(pod(container(image=IMAGE_124)), context(long)).warnings == [
        "cuda: no known GPU node matches (untolerated sku=gpu:NoSchedule of pools a100-80gb-reserved-capacity-us-ea…"
        " and 2 more)"
    ]
    # a taint of a pool's own cut short kept 3 characters of the pool's name ('of pool a1…; and 1 more'): the pools
    # of one taint are named together, and a reason too long for a name counts its pools
    gpu = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    team = {"key": "example.com/reserved-for-team", "value": "ml-research-platform", "effect": "NoSchedule"}
    own = [gpu_node("a-1", "a100-mig", "550.54.15", taints=[gpu]), gpu_node("h-1", "h100", "550.54.15", taints=[gpu])]
    assert pipeline.review(pod(container(image=IMAGE_124)), context(own)).warnings == [
        "cuda: no known GPU node matches (untolerated dedicated=ml:NoSchedule of pools a100-mig, h100)"
    ]
    own[1]["spec"]["taints"] = [team]
    assert pipeline.review(pod(container(image=IMAGE_124)), context(own)).warnings == [
        "cuda: no known GPU node matches (untolerated dedicated=ml:NoSchedule of pool a100-mig; and 1 more)"
    ]
    own[0]["spec"]["taints"] = [{**gpu, "value": "ml-gpu-reserved-capacity-of-the-research-platform"}]
    assert pipeline.review(pod(container(image=IMAGE_124)), context(own)).warnings == [
        "cuda: no known GPU node matches (untolerated dedicated=ml-gpu-reserved-capaci…latform:NoSchedule of 1 pool;"
        " and 1 more)"
    ]
    assert f"constraints ({because}); it stays Pending" in annotation_of(result.object)
    asks = pod(container(image=IMAGE_124, gpu=None, resources={"nvidia.com/mig-1g.5gb": "1"}))
    result = pipeline.review(asks, context(nodes))
    assert "cuda: no known GPU node matches (no known pool offers nvidia.com/mig-1g.5gb)" in (result.warnings)
    result = pipeline.review(pod(container(image=IMAGE_124)), context(nodes))
    assert not any("no known GPU node matches" in w for w in result.warnings), "a pod that matches is not told so"


RTX_A6000 = "NVIDIA-RTX-A6000"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
AUTOSCALED = "(an autoscaled pool: declare it in cluster.pools to have it checked)"
AKS_POOL = "kubernetes.azure.com/agentpool"


def k3s_gpu_vm(**kw: Any) -> dict[str, Any]:
    """A k3s GPU VM as the NVIDIA GPU Operator leaves it: no pool label (its pool is named by its GPU and driver),
    the GPU's taint, and no provider's labels, so ExtendedResourceToleration is taken as off."""
    return gpu_node("gpu-vm-1", "unused", "550.127.05", product=RTX_A6000, taints=[GPU_TAINT], pool_label="x", **kw)


def test_a_pod_kept_off_every_pool_by_a_taint_is_told_the_toleration_not_to_declare_a_pool() -> None:
    """A k3s pod without the GPU taint's toleration (found by a user-journey review: it was told to declare an
    autoscaled pool in cluster.pools, the pool it could not land on being known already, and the kubectl warning cut
    that pool's name to 'NVIDIA-RTX-A60…')."""
    result = pipeline.review(pod(container(image=IMAGE_124)), context([k3s_gpu_vm()]))
    assert result.allowed
    pool = f"pool {RTX_A6000}/driver-550.127.05"
    assert result.warnings == [
        f"cuda: no known GPU node matches (untolerated nvidia.com/gpu=true:NoSchedule of {pool})"
    ]
    text = annotation_of(result.object)
    assert AUTOSCALED not in text
    assert (
        f"(untolerated nvidia.com/gpu=true:NoSchedule of {pool}); it stays Pending: to land on {pool}, add the "
        'toleration {key: nvidia.com/gpu, operator: Equal, value: "true", effect: NoSchedule} (or, where the API '
        "server runs ExtendedResourceToleration, set cluster.extendedResourceToleration: on)"
    ) in text
    # AKS: the documented sku=gpu taint, which the plugin does not cover, and a spot pool's taint besides
    sku = {"key": "sku", "value": "gpu", "effect": "NoSchedule"}
    spot = {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}
    nodes = [
        gpu_node("g-1", "gpu", "550.54.15", taints=[sku]),
        gpu_node("s-1", "gpuspot", "550.54.15", taints=[sku, spot], labels={spot["key"]: "spot"}),
    ]
    text = annotation_of(pipeline.review(pod(container(image=IMAGE_124)), context(nodes)).object)
    assert AUTOSCALED not in text
    assert (
        'it stays Pending: to land on pool gpu, add the toleration {key: sku, operator: Equal, value: "gpu", effect:'
        " NoSchedule}; to land on pool gpuspot, add the tolerations {key: kubernetes.azure.com/scalesetpriority,"
        ' operator: Equal, value: "spot", effect: NoSchedule} and {key: sku, operator: Equal, value: "gpu", effect:'
        " NoSchedule}"
    ) in text
    # under spot: require, the spot capacity keeping it off the on-demand pool is what it asked: the taint is the cause
    required = pod(container(image=IMAGE_124), annotations={"gpu-admission.io/spot": "require"})
    text = annotation_of(pipeline.review(required, context(nodes)).object)
    assert AUTOSCALED not in text
    assert (
        "(untolerated sku=gpu:NoSchedule of pool gpuspot; the spot capacity it requires excludes pool gpu); it stays"
        ' Pending: to land on pool gpuspot, add the toleration {key: sku, operator: Equal, value: "gpu", effect:'
        " NoSchedule}"
    ) in text
    # under spot: never, the spot taint is what never keeps it off, not a toleration to add (a review: it was told to)
    # (AKS's own pool label: the spot policy writes nothing there, the spot taint keeping the pod off)
    never = pod(container(image=IMAGE_124), annotations={"gpu-admission.io/spot": "never"})
    aks = [
        gpu_node("g-1", "gpu", "550.54.15", taints=[sku], pool_label=AKS_POOL),
        gpu_node("s-1", "gpuspot", "550.54.15", taints=[sku, spot], labels={spot["key"]: "spot"}, pool_label=AKS_POOL),
    ]
    text = annotation_of(pipeline.review(never, context(aks)).object)
    assert (
        "(untolerated sku=gpu:NoSchedule of pool gpu; its spot: never excludes pool gpuspot); it stays Pending: to"
        ' land on pool gpu, add the toleration {key: sku, operator: Equal, value: "gpu", effect: NoSchedule}'
    ) in text, text
    assert "scalesetpriority, operator" not in text
    text = annotation_of(pipeline.review(never, context(aks[1:])).object)
    assert text.endswith("constraints (its spot: never excludes pool gpuspot); it stays Pending"), text
    # no spot pool known (scaled to zero): the spot pool it requires is one the webhook does not know
    ondemand = gpu_node("od-1", "ondemand", "550.54.15", labels={"eks.amazonaws.com/capacityType": "ON_DEMAND"})
    text = annotation_of(pipeline.review(required, context([ondemand])).object)
    assert (
        "(the spot capacity it requires excludes pool ondemand); it stays Pending until a node it matches joins"
        f" {AUTOSCALED}"
    ) in text, text


def test_a_pod_asking_more_gpus_than_a_node_has_is_told_the_count() -> None:
    """Two GPUs asked of a pool of one-GPU nodes: said as that, not as no pool offering nvidia.com/gpu, nor with the
    advice to declare an autoscaled pool (found by a user-journey review)."""
    nodes = [gpu_node("a-1", "gpu-a", "550.54.15", gpus="1"), gpu_node("b-1", "gpu-b", "550.54.15", gpus="1")]
    result = pipeline.review(pod(container(image=IMAGE_124, gpu="2")), context(nodes))
    assert result.allowed
    assert result.warnings == [
        "cuda: no known GPU node matches (its 2 nvidia.com/gpu exceed a node of pools gpu-a, gpu-b)"
    ]
    text = annotation_of(result.object)
    assert AUTOSCALED not in text
    assert (
        "(its 2 nvidia.com/gpu exceed a node of pools gpu-a, gpu-b); it stays Pending: to land on pools gpu-a, gpu-b,"
        " ask at most 1 nvidia.com/gpu"
    ) in text
    # its own nodeSelector names another pool: that is what keeps it off, the count of a pool it does not select
    # is no reason, and the pool it selects may be one at zero the webhook does not know
    result = pipeline.review(
        pod(container(image=IMAGE_124, gpu="2"), node_selector={POOL_LABEL: "big"}), context(nodes)
    )
    text = annotation_of(result.object)
    because = "its nodeSelector/affinity excludes pools gpu-a, gpu-b"
    assert f"({because}); it stays Pending until a node it matches joins {AUTOSCALED}" in text


def test_the_count_advice_names_the_container_that_asks_the_most() -> None:
    """An init container of 4 GPUs beside an app container of 1, nodes of 1: "to land on pool gpu-a, ask at most 1
    nvidia.com/gpu" read as met, the app container asking 1 (found by a review; the spot policy named the container).
    The advice names it, as the spot policy's does; a pod of one container is told the count alone (above)."""
    nodes = [gpu_node("a-1", "gpu-a", "550.54.15", gpus="1")]
    obj = pod(container(image=IMAGE_124), init=[container(name="prep", image=IMAGE_124, gpu="4")])
    text = annotation_of(pipeline.review(obj, context(nodes)).object)
    assert text.endswith(
        "(its 4 nvidia.com/gpu exceed a node of pool gpu-a); it stays Pending: to land on pool gpu-a, ask at most 1"
        " nvidia.com/gpu in init container prep"
    ), text
    # app containers run together: their GPUs add up, and what exceeds is their sum (found by a review: two of 1 each
    # were told "ask at most 1", which read as met; two of 2, "ask at most 1 in container a")
    for gpus in ("1", "2"):
        both = pod(container(name="a", image=IMAGE_124, gpu=gpus), container(name="b", image=IMAGE_124, gpu=gpus))
        text = annotation_of(pipeline.review(both, context(nodes)).object)
        assert text.endswith("ask at most 1 nvidia.com/gpu in a and b together"), text


def test_a_pod_bound_by_node_name_is_told_the_kubelet_rejects_it_not_that_it_stays_pending() -> None:
    """A pod whose nodeName names a node without the GPUs it asks skips the scheduler: that node's kubelet rejects
    it (OutOfnvidia.com/gpu). It was told "it stays Pending until a node it matches joins (an autoscaled pool ...)",
    its nodeName taken for its own nodeSelector/affinity (a review)."""
    cpu = gpu_node("server-1", "cpu", None, gfd="none", gpus="0")
    nodes = [gpu_node("a-1", "gpu-a", "550.54.15", gpus="1"), gpu_node("b-1", "gpu-b", "550.54.15", gpus="1"), cpu]
    bound = pod(container(image=IMAGE_124))
    bound["spec"]["nodeName"] = "server-1"
    result = pipeline.review(bound, context(nodes))
    assert result.allowed
    assert result.warnings == ["cuda: no known GPU node matches (its nodeName server-1 excludes pools gpu-a, gpu-b)"]
    assert annotation_of(result.object).endswith(
        "constraints (its nodeName server-1 excludes pools gpu-a, gpu-b); the kubelet of node server-1 rejects it"
        " (OutOfnvidia.com/gpu)"
    ), annotation_of(result.object)
    bound["spec"]["nodeName"] = "gone-1"
    assert annotation_of(pipeline.review(bound, context(nodes)).object).endswith(
        "; no node gone-1 is known (the pod garbage collector deletes a pod bound to a node that is not there)"
    )
    # bound to a node of a pool with fewer GPUs than it asks
    bound["spec"]["nodeName"] = "a-1"
    bound["spec"]["containers"] = [container(image=IMAGE_124, gpu="2")]
    text = annotation_of(pipeline.review(bound, context(nodes)).object)
    assert text.endswith(
        "constraints (its 2 nvidia.com/gpu exceed a node of pool gpu-a; its nodeName a-1 excludes pool gpu-b); the"
        " kubelet of node a-1 rejects it (OutOfnvidia.com/gpu): to land on pool gpu-a, ask at most 1 nvidia.com/gpu"
    ), text


def test_a_pool_both_too_small_and_tainted_is_told_both_and_fixes_past_six_are_counted() -> None:
    """A pool whose nodes have fewer GPUs than the pod asks and a taint it does not tolerate was told the count
    alone: asking fewer, it stayed Pending for the taint. Past six fixes, the rest were dropped unsaid (a review)."""
    sku = {"key": "sku", "value": "gpu", "effect": "NoSchedule"}
    nodes = [gpu_node("g-1", "gpu", "550.54.15", gpus="1", taints=[sku])]
    text = annotation_of(pipeline.review(pod(container(image=IMAGE_124, gpu="2")), context(nodes)).object)
    assert text.endswith(
        "(its 2 nvidia.com/gpu exceed a node of pool gpu; untolerated sku=gpu:NoSchedule of pool gpu); it stays"
        " Pending: to land on pool gpu, ask at most 1 nvidia.com/gpu; to land on pool gpu, add the toleration {key:"
        ' sku, operator: Equal, value: "gpu", effect: NoSchedule}'
    ), text
    teams = [gpu_node(f"t-{i}", f"team-{i}", "550.54.15", taints=[{**sku, "value": f"team-{i}"}]) for i in range(8)]
    text = annotation_of(pipeline.review(pod(container(image=IMAGE_124)), context(teams)).object)
    assert text.count("to land on pool team-") == 6
    assert text.endswith('value: "team-5", effect: NoSchedule}; and 2 more'), text


def test_a_pool_of_nodes_of_any_size_is_not_the_count_of_its_gpus() -> None:
    """A Karpenter NodePool launches a bigger instance for a pod that asks more GPUs than its nodes now have: its
    count is no cause, and the pod is not told to ask fewer (a review: a 4-GPU pod was told "it stays Pending: ...
    ask at most 1" of a NodePool). The count of a node group of one instance type still is."""
    karpenter = gpu_node("k-1", "gpu-spot", "570.124.06", gpus="1", pool_label="karpenter.sh/nodepool")
    ondemand = gpu_node("a-1", "a10g-ondemand", "570.124.06", gpus="1")
    result = pipeline.review(pod(container(image=IMAGE_124, gpu="4")), context([karpenter, ondemand]))
    assert result.allowed
    text = annotation_of(result.object)
    assert (
        "(its 4 nvidia.com/gpu exceed a node of pool a10g-ondemand; its 4 nvidia.com/gpu exceed the nodes now in pool"
        f" gpu-spot); it stays Pending until a node it matches joins {AUTOSCALED}; to land on pool a10g-ondemand, ask"
        " at most 1 nvidia.com/gpu"
    ) in text, text
    text = annotation_of(pipeline.review(pod(container(image=IMAGE_124, gpu="4")), context([karpenter])).object)
    assert f"now in pool gpu-spot); it stays Pending until a node it matches joins {AUTOSCALED}" in text, text
    assert "ask at most" not in text


def test_without_a_node_list_it_says_so_not_that_no_node_matches() -> None:
    """A worker serving before its live watch's first list (the API server unreachable when it started)."""
    ctx = context([])
    ctx = dataclasses.replace(
        ctx, cluster=build_view([], ctx.settings, source="live watch (not synced yet)", known=False)
    )
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed
    assert "decision: not checked: the webhook has no node list yet" in annotation_of(result.object)
    assert result.audit["cuda-decision"] == "not checked (no node list yet)"


def test_before_the_first_node_list_the_declared_pools_do_not_stand_for_the_cluster() -> None:
    """Found by a review of day-2 journeys: a live watch not synced yet, with one pool declared (scaled to zero,
    an old driver), judged pods against that pool alone: a pod whose CUDA the nodes running now support was denied
    ('upgrade the driver on pool ...'), and spot tolerations narrowed to the declared pool's taints. Until the
    first list the view is unknown, declared pools and all; a source that lists no nodes at all (settings only)
    still has its declared pools describe the cluster."""
    declared = {"name": "old", "nodeSelector": {POOL_LABEL: "old"}, "driverVersion": "535.104.05", "gpuCount": 8}
    s = settings(cluster={"pools": [declared]})
    unsynced = build_view([], s, source="live watch (not synced yet)", synced=False)
    assert not unsynced.known and unsynced.groups == ()
    result = pipeline.review(pod(container(image=IMAGE_128)), Context(settings=s, cluster=unsynced, namespace="ml"))
    assert result.allowed, result.message
    assert result.audit["cuda-decision"] == "not checked (no node list yet)"
    described = build_view([], s, source="settings", known=False)
    assert described.known and [g.pool for g in described.groups] == ["old"]
    assert not pipeline.review(pod(container(image=IMAGE_128)), Context(settings=s, cluster=described)).allowed


UNKNOWN_IMAGE = "vllm/vllm-openai:latest"  # no CUDA in its tag


@pytest.mark.parametrize(
    ("obj", "nodes", "cuda_settings", "event"),
    [
        pytest.param(
            pod(container("vllm", image=UNKNOWN_IMAGE)),
            [A],
            {},
            ("Warning", f"vllm: CUDA version unknown (image {UNKNOWN_IMAGE}); not checked"),
            id="version-unknown",
        ),
        pytest.param(
            pod(container("vllm", image=UNKNOWN_IMAGE)),
            [A],
            {"unknownVersion": "allow"},
            ("Normal", f"vllm: CUDA version unknown (image {UNKNOWN_IMAGE}); not checked"),
            id="version-unknown-allowed",
        ),
        pytest.param(
            pod(container(image=IMAGE_124)),
            [],
            {},
            (
                "Warning",
                f"trainer: CUDA 12.4 from image tag, {IMAGE_124.replace(':', ' ')}; not checked (no eligible GPU node)",
            ),
            id="no-node",
        ),
        pytest.param(
            pod(container("vllm", image=UNKNOWN_IMAGE)),
            [],
            {},
            ("Warning", f"vllm: CUDA version unknown (image {UNKNOWN_IMAGE}); not checked (no eligible GPU node)"),
            id="version-unknown-no-node",
        ),
        pytest.param(
            pod(container(image=IMAGE_124, env={"NVIDIA_DISABLE_REQUIRE": "true"})),
            [C],
            {},
            ("Normal", "trainer: CUDA requirement disabled by env NVIDIA_DISABLE_REQUIRE; not checked"),
            id="requirement-disabled",
        ),
        pytest.param(
            pod(container(image=IMAGE_124), container("vllm", image=UNKNOWN_IMAGE)),
            [C],
            {},
            (
                "Warning",
                f"trainer: CUDA 12.4 from image tag, {IMAGE_124.replace(':', ' ')}; supported by pool gpu-c (driver "
                f"570.124.06, CUDA 12.8); vllm: CUDA version unknown (image {UNKNOWN_IMAGE}); not checked; the "
                "containers checked: compatible (pool gpu-c)",
            ),
            id="one-container-unknown",
        ),
    ],
)
def test_a_pod_not_checked_has_no_cuda_checked_event(
    obj: dict[str, Any], nodes: list[dict[str, Any]], cuda_settings: dict[str, Any], event: tuple[str, str]
) -> None:
    """Found by a review: a pod whose CUDA was not checked had a Normal CUDAChecked Event ("every GPU container's
    CUDA is supported", docs/observability.md), its message "not checked (not checked (CUDA version unknown))"."""
    result = pipeline.review(obj, context(nodes, settings(cuda_settings)))
    assert result.allowed, result.message
    assert [(e.reason, e.type, e.message) for e in result.outcome.events] == [("CUDANotChecked", *event)]
    assert "CUDAChecked" not in result.outcome.reasons and "CUDANotChecked" in result.outcome.reasons


# ---------------------------------------------------------------------------------------------------------------
# Enforcement modes


def test_warn_mode_warns_of_every_container_with_the_driver_to_upgrade_to() -> None:
    """Found by the reporting review: the warning led with the image fix and was cut at kubectl's line length before
    the driver version, and two containers' warnings, cut alike, read as one."""
    ctx = context([A], settings({"mode": "warn"}))
    obj = pod(container(image=IMAGE_128), container("eval", image="pytorch/pytorch-nightly:2600000-cu12.6"))
    result = pipeline.review(obj, ctx)
    assert result.allowed
    would = [w for w in result.warnings if w.startswith("would be denied (CUDAIncompatible) in enforce mode: ")]
    assert [w.split(": ")[1] for w in would] == ["trainer", "eval"]
    assert f"to >= {DRIVER_128} on pool gpu-a;" in would[0] and "to >= 560.28.03 on pool gpu-a;" in would[1]
    assert all(len(w) < 120 for w in result.warnings)


def test_warn_mode_admits_with_warning_event_and_audit() -> None:
    ctx = context([A], settings({"mode": "warn"}))
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed
    assert (
        f"would be denied (CUDAIncompatible) in enforce mode: trainer: upgrade the driver to >= {DRIVER_128} on pool "
        "gpu-a; or use an image built for CUDA <= 12.2"
    )[:118] + "…" in result.warnings
    assert any(DRIVER_128 in w for w in result.warnings if w.startswith("would be denied")), "the version shows"
    assert "needs CUDA 12.8" in result.audit["cuda-would-deny"]
    assert result.audit["cuda-decision"] == "would be denied (CUDAIncompatible)"
    assert "cuda: trainer needs CUDA 12.8; it can land only on CUDA <= 12.2 (pool gpu-a)" in result.warnings
    assert all(len(w) < 120 for w in result.warnings)
    assert [(e.reason, e.type) for e in result.outcome.events] == [("CUDAIncompatible", "Warning")]
    assert "would be denied (cuda mode warn)" in annotation_of(result.object)
    assert_idempotent(result, ctx)


@pytest.mark.parametrize(
    ("nodes", "obj", "reasons"),
    [
        pytest.param([A], pod(container(image="team/train:v3")), ["CUDAVersionUnknown"], id="version-unknown"),
        pytest.param([NO_DRIVER], pod(container(image=IMAGE_128)), ["CUDADriverUnknown"], id="driver-unknown"),
        pytest.param(
            [A],
            pod(container(image=IMAGE_128), annotations={"gpu-admission.io/cuda-version.trainer": "twelve"}),
            ["CUDARequirementInvalid"],
            id="requirement-invalid",
        ),
        pytest.param(
            [A],
            pod(container(image=IMAGE_128), container("eval", image="team/train:v3")),
            ["CUDAVersionUnknown", "CUDAIncompatible"],
            id="two-reasons",
        ),
    ],
)
def test_warn_mode_event_carries_its_denials_reason(nodes: list[Any], obj: dict[str, Any], reasons: list[str]) -> None:
    """Found by the observability review: every warn-mode Event read CUDAIncompatible, whatever the denial that enforce
    mode would have made, while the decision log named the right one."""
    ctx = context(nodes, settings({"mode": "warn", "unknownVersion": "deny", "unknownDriver": "deny"}))
    result = pipeline.review(obj, ctx)
    assert result.allowed
    assert [(e.reason, e.type) for e in result.outcome.events] == [(r, "Warning") for r in reasons]
    assert sorted(set(result.outcome.reasons)) == sorted(reasons)


def test_warn_mode_event_says_containers_refused_alike_once_as_the_answer_and_the_audit_do() -> None:
    """Found by a review of the reporting: two containers of one image with an unusable CUDA annotation are one denial
    in enforce mode's answer and in warn mode's audit (``each of containers trainer and eval ...``), and warn mode's
    Event said the refusal twice, once per container. The Event says the same words as the audit."""
    obj = pod(container(image=IMAGE_128), container("eval", image=IMAGE_128))
    obj["metadata"]["annotations"] = {"gpu-admission.io/cuda-version": "12.x"}
    enforced = pipeline.review(copy.deepcopy(obj), context([A], settings({"mode": "enforce"})))
    assert not enforced.allowed and enforced.message.startswith("each of containers trainer and eval (image ")
    warned = pipeline.review(obj, context([A], settings({"mode": "warn"})))
    (event,) = [e for e in warned.outcome.events if e.reason == "CUDARequirementInvalid"]
    assert event.message == enforced.message == warned.audit["cuda-would-deny"], event.message


def test_warn_mode_does_not_steer_but_says_where_it_may_fail() -> None:
    ctx = context([A, C], settings({"mode": "enforce", "namespaceModes": {"ml": "warn"}}))
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed and required_terms(result.object) == []
    assert "cuda: trainer (CUDA 12.8) cannot run on pool gpu-a, where it may land; target pool gpu-c" in result.warnings
    assert "admitted, but the pod may land on pool gpu-a, which cannot run it" in annotation_of(result.object)


def test_off_mode_does_nothing() -> None:
    ctx = context([A], settings({"mode": "off"}))
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed and result.patch == [] and result.warnings == [] and not result.outcome.events


def test_namespace_override_enforces() -> None:
    ctx = context([A], settings({"mode": "warn", "namespaceModes": {"ml": "enforce"}}))
    assert not pipeline.review(pod(container(image=IMAGE_128)), ctx).allowed


def test_steering_can_be_switched_off() -> None:
    ctx = context([A, C], settings({"steer": False}))
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed and required_terms(result.object) == []
    assert any("cannot run on pool gpu-a" in w for w in result.warnings)


# ---------------------------------------------------------------------------------------------------------------
# Idempotency and robustness


def test_forged_annotation_is_rewritten() -> None:
    ctx = context([C])
    obj = pod(container(image=IMAGE_124), annotations={CUDA_KEY: "all fine, trust me"})
    result = pipeline.mutate(obj, ctx)
    assert annotation_of(result.object).startswith("trainer: CUDA 12.4")
    assert_idempotent(result, ctx)


def test_mutate_then_validate_separately_match_review() -> None:
    ctx = context([A, B, C])
    obj = pod(container(image=IMAGE_128))
    mutated = pipeline.mutate(obj, ctx)
    validated = pipeline.validate(mutated.object, ctx)
    assert validated.allowed and validated.warnings == []
    assert [e.reason for e in validated.outcome.events] == ["CUDAChecked"]


@pytest.mark.parametrize("name", ["core.v1.Pod.json", "apps.v1.Deployment.json", "batch.v1.CronJob.json"])
def test_full_objects_do_not_crash(name: str) -> None:
    obj = json.loads((FIXTURES / name).read_text())
    ctx = context([A, C])
    result = pipeline.review(obj, ctx)
    assert isinstance(result.allowed, bool)


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"containers": "nope"}, id="containers-not-a-list"),
        pytest.param(
            {"containers": [None, 3, {"name": 7, "image": ["x"], "env": "x", "resources": []}]}, id="garbage-containers"
        ),
        pytest.param(
            {
                "containers": [
                    {
                        "name": "t",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                        "env": [{"name": "NVIDIA_REQUIRE_CUDA", "value": 12.4}],
                    }
                ],
                "affinity": "x",
            },
            id="garbage-env-and-affinity",
        ),
    ],
)
def test_garbage_never_crashes(spec: dict[str, Any]) -> None:
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "g"}, "spec": spec}
    result = pipeline.review(obj, context([A, C]))
    assert isinstance(result.allowed, bool)


def test_pool_label_used_for_hints() -> None:
    assert POOL_LABEL in cuda.pool_selector(context([A]).cluster.groups[0], context([A]))


def test_after_mig_conversion_the_mig_resource_decides_eligibility() -> None:
    labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig-3g.40gb.count": "2",
        "nvidia.com/mig-3g.40gb.memory": "40192",
    }
    offers = {"nvidia.com/mig-3g.40gb": "2"}
    nodes = [
        gpu_node("a", "gpu-a", "535.104.05", labels=labels, allocatable=offers, gpus="0"),
        gpu_node("c", "gpu-c", "570.124.06", labels=labels, allocatable=offers, gpus="0"),
        gpu_node("w", "whole", "535.104.05"),
    ]
    ctx = context(nodes)
    obj = pod(container(gpu=None, image=IMAGE_128, resources={"nvidia.com/mig-3g.40gb": "1"}))
    result = pipeline.review(obj, ctx)
    assert result.allowed, result.message
    assert [c.group.pool for c in ctx.cluster.eligible(result.object["spec"])] == ["gpu-c"]
    assert "whole" not in annotation_of(result.object)  # offers no MIG device: never eligible, never named
    assert_idempotent(result, ctx)


def test_cluster_size_does_not_change_the_work() -> None:
    nodes = [gpu_node(f"a-{i}", "gpu-a", "535.104.05") for i in range(300)]
    nodes += [gpu_node(f"c-{i}", "gpu-c", "570.124.06") for i in range(300)]
    ctx = context(nodes)
    assert len(ctx.cluster.groups) == 2  # 600 nodes, two groups: the policy evaluates two
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed and "pool gpu-c (driver 570.124.06, CUDA 12.8)" in annotation_of(result.object)


# ---------------------------------------------------------------------------------------------------------------
# What a denial and the annotation say, at the apiserver's limits


def test_pool_lists_are_capped_so_the_annotations_stay_far_below_the_apiservers_limit() -> None:
    # 1,000 pools whose driver is unknown, 10 GPU containers: each container's line named every pool, 290 kB of
    # annotations, past the apiserver's 256 KiB for all of an object's (apimachinery TotalAnnotationSizeLimitB)
    nodes = [gpu_node(f"n{i}", f"pool-{i:04}", None, gpus="16") for i in range(1000)]
    obj = pod(*[container(f"c{i}") for i in range(10)])
    result = pipeline.mutate(obj, context(nodes, settings({"unknownDriver": "allow"})))
    assert result.allowed
    annotations = result.object["metadata"]["annotations"]
    assert sum(len(k) + len(v) for k, v in annotations.items()) < 16_000
    assert (
        "pools pool-0000, pool-0001, pool-0002, pool-0003, pool-0004, pool-0005 and 994 more" in annotations[CUDA_KEY]
    )
    denied = pipeline.validate(obj, context(nodes, settings({"unknownDriver": "deny"})))
    assert not denied.allowed and len(denied.message) <= pipeline.MESSAGE_LIMIT


SPOT_TAINT = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("taints", "cordoned", "state"),
    [
        pytest.param([], True, "cordoned", id="cordoned"),
        pytest.param(
            [{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}], False, "not ready", id="not-ready"
        ),
        pytest.param(
            [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}],
            True,
            "cordoned and unreachable",
            id="cordoned-unreachable",
        ),
        # the other conditions' taints and a non-graceful shutdown's (found by a review of the whole change)
        pytest.param(
            [{"key": "node.kubernetes.io/disk-pressure", "effect": "NoSchedule"}],
            False,
            "under disk pressure",
            id="disk-pressure",
        ),
        pytest.param(
            [{"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}],
            False,
            "out of service",
            id="out-of-service",
        ),
    ],
)
def test_the_advice_never_says_to_tolerate_a_cordon_or_a_node_not_ready(
    taints: list[dict[str, str]], cordoned: bool, state: str
) -> None:
    """The only pool that runs the pod is cordoned (a drain) or not ready: the refusal stands (the pod would land on
    the old pool, and fail), but the advice said "and a toleration of node.kubernetes.io/unschedulable:NoSchedule",
    which bypasses a drain, or lands the pod on a broken node (found by a review of the cluster model)."""
    new = gpu_node("new-1", "new", "570.124.06", taints=taints)
    new["spec"]["unschedulable"] = cordoned
    message = pipeline.validate(pod(container(image=IMAGE_128)), context([A, new])).message
    assert message.endswith(
        f"To fix: Use an image built for CUDA <= 12.2; or target pool new (driver 570.124.06, CUDA 12.8) with"
        f" nodeSelector {POOL_LABEL}: new (its nodes are {state} now: the pod waits until one takes pods again); or"
        " upgrade the driver to >= 570.26 on pool gpu-a."
    ), message
    # a pod kept to that pool: not checked, and what keeps it off in words
    result = pipeline.review(pod(container(image=IMAGE_128), node_selector={POOL_LABEL: "new"}), context([A, new]))
    assert result.allowed
    because = f"nodes {state} now in pool new; its nodeSelector/affinity excludes pool gpu-a"
    assert f"constraints ({because}); it stays Pending" in annotation_of(result.object)
    # a pool one of whose nodes takes pods is advised as that node, not also as cordoned
    kept_off = pod(container(image=IMAGE_128), node_selector={POOL_LABEL: "gpu-a"})
    message = pipeline.validate(kept_off, context([A, new, gpu_node("new-2", "new", "570.124.06")])).message
    assert f"or target pool new (driver 570.124.06, CUDA 12.8) with nodeSelector {POOL_LABEL}: new; or" in message
    assert message.count("target pool new") == 1, message


def test_the_advice_to_target_a_pool_says_what_else_reaching_it_takes() -> None:
    # Following "target pool X with nodeSelector ..." must give a pod that can land there: the pool's spot taint
    # needs a toleration, and a pod that requires spot capacity cannot go to an on-demand pool by a selector
    old = gpu_node("old-1", "old", "535.104.05")
    spot = gpu_node("spot-1", "spot-new", "570.124.06", taints=[SPOT_TAINT], labels={SPOT_TAINT["key"]: "true"})
    ondemand = gpu_node("od-1", "od-new", "570.124.06")
    obj = pod(container(image=IMAGE_128), node_selector={POOL_LABEL: "old"})
    message = pipeline.validate(obj, context([old, spot, ondemand])).message
    assert (
        f"target pool spot-new (driver 570.124.06, CUDA 12.8) with nodeSelector {POOL_LABEL}: spot-new and a "
        "toleration of cloud.google.com/gke-spot=true:NoSchedule (or annotation gpu-admission.io/spot: tolerate)"
    ) in message
    assert f"target pool od-new (driver 570.124.06, CUDA 12.8) with nodeSelector {POOL_LABEL}: od-new;" in message
    # what it advises works: with the selector and the toleration the pod lands on spot-new, and is admitted
    obj["spec"]["nodeSelector"] = {POOL_LABEL: "spot-new"}
    obj["spec"]["tolerations"] = [{**SPOT_TAINT, "operator": "Equal"}]
    assert pipeline.review(obj, context([old, spot, ondemand])).allowed

    required = {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": SPOT_TAINT["key"], "operator": "In", "values": ["true"]}]}]
    }
    old_spot = gpu_node("old-2", "old-spot", "535.104.05", taints=[SPOT_TAINT], labels={SPOT_TAINT["key"]: "true"})
    obj = pod(
        container(image=IMAGE_128),
        affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}},
    )
    obj["spec"]["tolerations"] = [{**SPOT_TAINT, "operator": "Equal"}]
    message = pipeline.validate(obj, context([old_spot, ondemand])).message
    # the pod's own affinity, not spot: require (it had been named so; found by a review of the spot policy)
    assert (
        f"target pool od-new (driver 570.124.06, CUDA 12.8) with nodeSelector {POOL_LABEL}: od-new (its required "
        "node affinity keeps it off that pool too)"
    ) in message
    required_by_us = pod(container(image=IMAGE_128), annotations={"gpu-admission.io/spot": "require"})
    message = pipeline.review(required_by_us, context([old_spot, ondemand])).message
    assert (
        f"target pool od-new (driver 570.124.06, CUDA 12.8) with nodeSelector {POOL_LABEL}: od-new (its required "
        "node affinity keeps it off that pool too: the spot capacity it requires (gpu-admission.io/spot: require))"
    ) in message, message


def test_a_pod_bound_to_a_node_by_node_name_is_told_so_not_that_its_affinity_keeps_it_off() -> None:
    """A pod whose spec.nodeName binds it to a GeForce node its CUDA does not run on was told to target the H100
    pool "(its required node affinity keeps it off that pool too)": it has no affinity; nodeName binds it (a
    review of the policies). Reaching that pool by its selector takes nodeName out, and so its taints too."""
    rtx = gpu_node("rtx-a", "rtx", "550.120", product=RTX)
    h100 = gpu_node("h100-a", "h100", "570.124.06", product=H100, taints=[SPOT_TAINT])
    obj = pod(container(image=IMAGE_128))
    obj["spec"]["nodeName"] = "rtx-a"
    message = pipeline.validate(obj, context([rtx, h100])).message
    assert (
        f"target pool h100 (driver 570.124.06, CUDA 12.8) with nodeSelector {POOL_LABEL}: h100 and a toleration of "
        "cloud.google.com/gke-spot=true:NoSchedule (or annotation gpu-admission.io/spot: tolerate) (the pod is bound "
        "to node rtx-a by spec.nodeName: remove it, or set it to a node of that pool);"
    ) in message, message
    assert "Use an image built for CUDA <= 12.4" in message
    assert "node affinity" not in message
    # bound and kept off by its own affinity too: both are said
    obj["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["rtx-a"]}]}
                ]
            }
        }
    }
    message = pipeline.validate(obj, context([rtx, h100])).message
    assert "set it to a node of that pool) (its required node affinity keeps it off that pool too)" in message, message


@pytest.mark.parametrize("gfd", ["new", "old"])
def test_a_pool_whose_nodes_run_two_drivers_is_steered_by_driver_label(gfd: str) -> None:
    # No CUDA runtime labels (an older GFD, or a node labeller of its own): the pool label selects both drivers'
    # nodes, so it alone cannot keep the pod off the old one; the driver labels tell them apart
    old = gpu_node("mixed-old", "mixed", "535.104.05", gfd=gfd, runtime_labels=False)
    new = gpu_node("mixed-new", "mixed", "570.124.06", gfd=gfd, runtime_labels=False)
    ctx = context([old, new])
    result = pipeline.mutate(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed
    names = {n for c in ctx.cluster.eligible(result.object["spec"]) for n in c.nodes}
    assert names == {"mixed-new"}
    keys = [e["key"] for e in required_terms(result.object)[0]["matchExpressions"]]
    assert keys[0] == POOL_LABEL and all(k.startswith("nvidia.com/cuda.driver") for k in keys[1:])
    assert "CUDASteered" in result.outcome.reasons
    assert_idempotent(result, ctx)


def test_a_pool_the_pods_other_node_selector_keeps_it_off_is_not_advised() -> None:
    """A fraction converted on GKE gets a partition-size nodeSelector; the denial advised a new-driver pool without
    partitions, where following it met a MIG refusal (found by a review of provider journeys). A key that selects
    a pool is what the advice replaces; another one stays, and the pools it excludes are no target."""
    partition = "cloud.google.com/gke-gpu-partition-size"
    old_mig = gpu_node("a-1", "gpu-a", "535.104.05", labels={partition: "3g.20gb"})
    obj = pod(container(image=IMAGE_128))
    obj["spec"]["nodeSelector"] = {partition: "3g.20gb"}
    result = pipeline.review(obj, context([old_mig, C]))
    assert not result.allowed
    assert "target pool gpu-c" not in result.message, result.message
    assert "upgrade the driver to >= 570.26 on pool gpu-a" in result.message
    obj["spec"]["nodeSelector"] = {POOL_LABEL: "gpu-a"}  # a pool's own key: replaced by the advice
    assert "target pool gpu-c" in pipeline.review(obj, context([old_mig, C])).message


def _deployment(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ml"},
        "spec": {"template": {"metadata": p["metadata"], "spec": p["spec"]}},
    }


def test_a_workloads_steering_is_planned_afresh_when_its_image_changes() -> None:
    """Found by a review of workload flows: `kubectl apply` of an older image kept the affinity the webhook wrote
    for the newer one (live-only fields stay), and the annotation said every pool supported the pod while that
    affinity kept it off the older pools."""
    ctx = context([A, C])
    live = pipeline.mutate(_deployment(pod(container(image=IMAGE_128))), ctx).object
    assert required_terms(live), "steered to gpu-c"
    older = copy.deepcopy(live)
    older["spec"]["template"]["spec"]["containers"][0]["image"] = "nvidia/cuda:12.2.2-base-ubuntu22.04"
    update = dataclasses.replace(ctx, operation="UPDATE", old_object=live)
    result = pipeline.mutate(older, update)
    assert result.allowed and required_terms(result.object) == []
    assert "affinity" not in result.object["spec"]["template"]["spec"]
    assert annotation_of(result.object).endswith("decision: admitted: every pool the pod can land on supports its CUDA")
    assert pipeline.mutate(result.object, update).patch == []
    again = pipeline.mutate(copy.deepcopy(live), update)  # the same image: the same steering, no change
    assert again.patch == [], again.patch


def _driver_labels(driver: str) -> dict[str, str]:
    major, minor, revision = driver.split(".")
    base = "nvidia.com/cuda.driver-version"
    return {f"{base}.major": major, f"{base}.minor": minor, f"{base}.revision": revision}


def test_a_pool_of_two_drivers_is_steered_to_its_upgraded_nodes_and_those_upgraded_later() -> None:
    """A pool whose nodes run two drivers (an upgrade rolling through it) is told apart by GFD's driver labels
    where the nodes carry no CUDA label: an exact version pinned a template's pods to it, and they stayed Pending
    once the pool moved on to the next driver (found by a review of day-2 journeys). From the lowest allowed
    driver of the pool up now; the exact version where the labels give no major and minor."""

    def node(name: str, pool: str, driver: str, labels: bool = True) -> dict[str, Any]:
        extra = _driver_labels(driver) if labels else {}
        return gpu_node(name, pool, driver, runtime_labels=False, labels=extra)

    ctx = context([node("a-0", "a", "570.124.06"), node("a-1", "a", "535.104.05"), node("b-0", "b", "535.104.05")])
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed, result.message
    base = "nvidia.com/cuda.driver-version"
    assert required_terms(result.object) == [
        {
            "matchExpressions": [
                {"key": POOL_LABEL, "operator": "In", "values": ["a"]},
                {"key": f"{base}.major", "operator": "In", "values": ["570"]},
                {"key": f"{base}.minor", "operator": "Gt", "values": ["123"]},
            ]
        },
        {
            "matchExpressions": [
                {"key": POOL_LABEL, "operator": "In", "values": ["a"]},
                {"key": f"{base}.major", "operator": "Gt", "values": ["570"]},
            ]
        },
    ]
    assert_idempotent(result, ctx)
    later = context([node("a-0", "a", "570.133.20"), node("a-1", "a", "580.65.06"), node("b-0", "b", "535.104.05")])
    assert sorted(c.group.pool for c in later.cluster.eligible(result.object["spec"])) == ["a", "a"]
    # only the full version: told apart by it
    exact = context([node("a-0", "a", "570.124.06", False), node("a-1", "a", "535.104.05", False), B])
    result = pipeline.review(pod(container(image=IMAGE_128)), exact)
    assert {"key": f"{base}.full", "operator": "In", "values": ["570.124.06"]} in (
        required_terms(result.object)[0]["matchExpressions"]
    )


def test_a_workload_steered_by_pool_is_steered_afresh_when_applied_again() -> None:
    """Found by two reviews (day-2 journeys, a generative one): steering by a pool's selector (GKE, declared pools:
    no GFD labels) was kept as the user's own: a Deployment steered to l4-new for CUDA 12.8 stayed there when its
    image went back to 12.2, while the annotation said every pool supported it. The annotation names the terms
    the steering wrote; the next review takes them out and plans afresh, and the pods made from the template
    do not carry them (no later review reads a pod's, and they could be a forged annotation's)."""
    gke = "cloud.google.com/gke-nodepool"

    def pools(old_driver: str) -> Settings:
        declared = [
            {"name": "l4-old", "nodeSelector": {gke: "l4-old"}, "driverVersion": old_driver, "gpuCount": 1},
            {"name": "l4-new", "nodeSelector": {gke: "l4-new"}, "driverVersion": "570.124.06", "gpuCount": 1},
        ]
        return settings(cluster={"pools": declared})

    ctx = context([], pools("535.104.05"))
    deployment: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "w", "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"a": "b"}}, "template": {"metadata": {}, "spec": pod()["spec"]}},
    }
    deployment["spec"]["template"]["spec"]["containers"][0]["image"] = IMAGE_128
    live = pipeline.mutate(copy.deepcopy(deployment), ctx).object
    steered = [{"matchExpressions": [{"key": gke, "operator": "In", "values": ["l4-new"]}]}]
    assert required_terms(live) == steered
    assert f"\n{cuda.STEERING}{gke} In (l4-new)" in annotation_of(live)
    # the pods made from it say the same, and a second pass changes nothing
    made = {"apiVersion": "v1", "kind": "Pod", "metadata": copy.deepcopy(live["spec"]["template"]["metadata"])}
    made["metadata"].update(name="w-1", namespace="ml")
    made["spec"] = copy.deepcopy(live["spec"]["template"]["spec"])
    result = pipeline.review(made, ctx)
    assert annotation_of(result.object) == annotation_of(live).split(f"\n{cuda.STEERING}")[0]  # no review reads it
    assert pipeline.mutate(copy.deepcopy(result.object), ctx).patch == []
    for image, old_driver in (("nvidia/cuda:12.2.2-runtime-ubuntu22.04", "535.104.05"), (IMAGE_128, "570.124.06")):
        sent = copy.deepcopy(live)  # applied again: the image changed, or the old pool was upgraded
        sent["spec"]["template"]["spec"]["containers"][0]["image"] = image
        sent["spec"]["template"]["metadata"].setdefault("labels", {})["rev"] = image[-8:]
        update = dataclasses.replace(context([], pools(old_driver)), operation="UPDATE", old_object=live)
        result = pipeline.mutate(sent, update)
        assert result.allowed, result.message
        assert required_terms(result.object) == [], required_terms(result.object)
        assert cuda.STEERING not in annotation_of(result.object)
        assert pipeline.mutate(copy.deepcopy(result.object), update).patch == []


def test_a_steering_line_naming_other_keys_is_not_said_again() -> None:
    """Words that name terms the steering never writes (a forged annotation) are not republished as the
    webhook's; the terms it writes read back as written."""
    alternatives = [
        [{"key": NEW_MAJOR, "operator": "In", "values": ["12"]}, {"key": NEW_MINOR, "operator": "Gt", "values": ["7"]}],
        [{"key": POOL_LABEL, "operator": "In", "values": ["gpu-c", "gpu-d"]}],
    ]
    text = f"decision: x\n{cuda.STEERING}{cuda._steering_text(alternatives)}"
    assert cuda._said_steering(text) == (alternatives, True)
    earlier = f"decision: x\n{cuda.STEERING_BEFORE}{cuda._steering_text(alternatives)}"  # an earlier version's line
    assert cuda._said_steering(earlier) == (alternatives, False)
    ctx = context([A, C])
    assert steering.could_steer(alternatives, ctx)
    assert not steering.could_steer([[{"key": "example.com/team", "operator": "In", "values": ["ml"]}]], ctx)
    forged = pod(
        container(image=IMAGE_124),
        annotations={CUDA_KEY: f"decision: x\n{cuda.STEERING}example.com/team In (ml)"},
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "example.com/team", "operator": "In", "values": ["ml"]}]}
                    ]
                }
            }
        },
    )
    assert cuda.STEERING not in annotation_of(pipeline.review(forged, ctx).object)


def _spot_required_on_two_declared_pools() -> tuple[Context, dict[str, Any]]:
    """A Deployment for CUDA 12.8 with spot require, created on two declared spot pools, one on a 550 driver (CUDA
    12.4) and one whose driver is unknown: its template requires either place and is steered by the second's pool
    selector, which is also the spot place require wrote."""
    declared = [
        {"name": "cw-spot", "nodeSelector": {"example.com/pool": "cw-spot"}, "spot": True, "driverVersion": "550.54"},
        {"name": "zero-spot", "nodeSelector": {"karpenter.sh/nodepool": "zero-spot"}, "spot": True},
    ]
    ctx = context([], settings(cluster={"pools": declared}))
    template = {"metadata": {"annotations": {"gpu-admission.io/spot": "require"}}, "spec": pod()["spec"]}
    template["spec"]["containers"][0]["image"] = IMAGE_128
    deployment: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w"}}
    deployment["spec"] = {"selector": {"matchLabels": {"a": "b"}}, "template": template}
    return ctx, pipeline.mutate(copy.deepcopy(deployment), ctx).object


def test_the_next_review_takes_out_only_the_steering_not_the_spot_places_nor_the_users_pin() -> None:
    """Found by a review of this session's commits: the steering by pool selector can write the very expression
    the spot policy's require wrote (or the user's manifest does); taking out every expression the steering line
    names left a template requiring spot only on a pool whose driver is too old, and dropped a user's own pin."""
    ctx, live = _spot_required_on_two_declared_pools()
    terms = required_terms(live)
    assert {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["zero-spot"]} in terms[-1]["matchExpressions"]
    assert pipeline.mutate(copy.deepcopy(live), ctx).patch == [], "a reinvocation changes nothing"
    update = dataclasses.replace(ctx, operation="UPDATE", old_object=live)
    sent = copy.deepcopy(live)
    sent["spec"]["template"]["metadata"]["labels"] = {"rev": "2"}
    assert required_terms(pipeline.mutate(sent, update).object) == terms


@pytest.mark.parametrize("mode", ["tolerate", "prefer", None])
def test_a_template_moved_off_require_keeps_only_the_steering_it_needs(mode: str | None) -> None:
    """The steering by a pool selector that is also a spot place require wrote: the CUDA policy's ``forget`` leaves
    that expression to the spot policy, which takes its own places out only from the terms its narrowing made
    (``affinity.unnarrow``'s ``narrowed``). Taken out by ``forget`` first, the term narrowing made for the other
    place looked like the user's own and stayed: the template kept requiring the pool whose driver is too old."""
    ctx, live = _spot_required_on_two_declared_pools()
    sent = copy.deepcopy(live)
    notes = sent["spec"]["template"]["metadata"]["annotations"]
    if mode is None:
        del notes["gpu-admission.io/spot"]
    else:
        notes["gpu-admission.io/spot"] = mode
    result = pipeline.mutate(sent, dataclasses.replace(ctx, operation="UPDATE", old_object=live))
    assert result.allowed, result.message
    zero = {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["zero-spot"]}
    assert required_terms(result.object) == [{"matchExpressions": [zero]}]
    update = dataclasses.replace(ctx, operation="UPDATE", old_object=result.object)
    assert pipeline.mutate(copy.deepcopy(result.object), update).patch == [], "a reinvocation changes nothing"


def test_a_cuda_label_term_the_manifest_writes_stays_at_the_next_review() -> None:
    """Terms on GFD's CUDA labels in a reviewed template are the webhook's steering, unless the manifest kubectl
    applied writes them itself (its last-applied-configuration): then they are the user's, and stay. Without a
    manifest, only what the annotation's words name is the steering's (the next test)."""
    own = {"key": NEW_MAJOR, "operator": "Gt", "values": ["11"]}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [own]}]}
        }
    }
    template = {"metadata": {}, "spec": pod(container(image=IMAGE_124), affinity=affinity)["spec"]}
    deployment: dict[str, Any] = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w"}}
    deployment["spec"] = {"selector": {"matchLabels": {"a": "b"}}, "template": template}
    ctx = context([A, B, C])
    live = pipeline.mutate(copy.deepcopy(deployment), ctx).object
    for written in (True, False):
        sent = copy.deepcopy(live)
        sent["spec"]["template"]["metadata"]["labels"] = {"rev": "2"}
        if written:
            sent["metadata"]["annotations"] = {
                "kubectl.kubernetes.io/last-applied-configuration": json.dumps(deployment)
            }
        update = dataclasses.replace(ctx, operation="UPDATE", old_object=live)
        terms = required_terms(pipeline.mutate(sent, update).object)
        assert any(own in t["matchExpressions"] for t in terms), terms


def test_a_cronjobs_jobs_keep_the_users_own_terms_on_the_cuda_labels() -> None:
    """Found by a generative review: with no kubectl manifest on the object (the CronJob controller writes none on
    the Jobs it makes; kubectl edit, Helm), every term on GFD's CUDA labels was taken for the webhook's steering,
    so each Job of a CronJob lost the user's own required affinity. Without a manifest only what the words name
    is the steering's."""
    own = {"key": NEW_MAJOR, "operator": "Gt", "values": ["11"]}
    spec = pod(container(image=IMAGE_124))["spec"]
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [own]}]}
        }
    }
    cron: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "ml"},
        "spec": {"schedule": "0 1 * * *", "jobTemplate": {"spec": {"template": {"metadata": {}, "spec": spec}}}},
    }
    ctx = context([B, C])  # CUDA 12.6 and 12.8
    stored = pipeline.mutate(copy.deepcopy(cron), ctx).object
    template = stored["spec"]["jobTemplate"]["spec"]["template"]
    assert required_terms({"spec": {"template": template}}) == [{"matchExpressions": [own]}]
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": "nightly-29000000",
            "namespace": "ml",
            "ownerReferences": [{"kind": "CronJob", "name": "nightly", "controller": True}],
        },
        "spec": {"template": copy.deepcopy(template)},
    }
    result = pipeline.mutate(job, ctx)
    assert result.allowed and result.patch == [], result.patch
    # the steering the words name is still planned afresh: a Job of a CronJob steered for CUDA 12.8
    spec["containers"][0]["image"] = IMAGE_128
    steered = pipeline.mutate(copy.deepcopy(cron), ctx).object
    assert cuda.STEERING in annotation_of({"spec": steered["spec"]["jobTemplate"]["spec"]})
    job["spec"]["template"] = copy.deepcopy(steered["spec"]["jobTemplate"]["spec"]["template"])
    job["spec"]["template"]["spec"]["containers"][0]["image"] = IMAGE_124  # the words' steering outlived its image
    again = pipeline.mutate(job, ctx).object
    assert required_terms(again) == [{"matchExpressions": [own]}], required_terms(again)


@pytest.mark.parametrize(
    ("image", "driver", "product", "platform", "allowed"),
    [
        # an image read from its tag runs where its compat libraries do (forward compatibility, data-center GPUs)
        pytest.param("nvidia/cuda:12.8.0-base-ubuntu22.04", "550.54.15", H100, "amd64", True, id="cuda-12.8-r550"),
        pytest.param("nvidia/cuda:12.8.0-base-ubuntu22.04", "550.54.15", RTX, "amd64", False, id="geforce"),
        pytest.param("nvidia/cuda:12.8.0-base-ubuntu22.04", "555.42.06", H100, "amd64", False, id="branch-not-named"),
        pytest.param("nvidia/cuda:12.4.1-base-ubuntu22.04", "535.104.05", A100, "amd64", True, id="cuda-12.4-amd64"),
        pytest.param("nvidia/cuda:12.4.1-base-ubuntu22.04", "535.104.05", A100, "arm64", False, id="cuda-12.4-arm64"),
        # the device plugin's own e2e Job on a T4 of R470 (its image: nvidia/cuda 11.7.1's compat libraries)
        pytest.param(
            "nvcr.io/nvidia/k8s/cuda-sample:nbody-cuda11.7.1", "470.256.02", "Tesla-T4", "amd64", True, id="t4"
        ),
        # NGC 24.12 (CUDA 12.6.3): the branches CUDA 12.6's compat package runs on, R470, R535 and R550
        pytest.param("nvcr.io/nvidia/pytorch:24.12-py3", "535.230.02", H100, "amd64", True, id="ngc-24.12-r535"),
        pytest.param("nvcr.io/nvidia/pytorch:24.12-py3", "550.54.15", H100, "amd64", True, id="ngc-24.12-r550"),
        pytest.param("nvcr.io/nvidia/pytorch:24.12-py3", "545.29.06", H100, "amd64", False, id="ngc-24.12-r545"),
        # images built on nvidia/cuda whose tag names only the minor release: vLLM's -cuNNN (its Dockerfile's final
        # stage is FROM nvidia/cuda devel and registers the compat libraries), pytorch's devel images; a runtime
        # image of pytorch (FROM ubuntu) has no compat package; 12.5's releases differ, so a 12.5 tag has none
        pytest.param("vllm/vllm-openai:nightly-cu129", "570.124.06", H100, "amd64", True, id="vllm-cu129-r570"),
        pytest.param("vllm/vllm-openai:nightly-cu129", "570.124.06", RTX, "amd64", False, id="vllm-geforce"),
        pytest.param("vllm/vllm-openai:v0.10.1-cu126", "535.230.02", A100, "arm64", True, id="vllm-cu126-arm64"),
        pytest.param("pytorch/pytorch:2.7.0-cuda12.8-cudnn9-devel", "550.127.05", H100, "amd64", True, id="pt-devel"),
        pytest.param("pytorch/pytorch-nightly:2700000-cu12.8", "550.127.05", H100, "amd64", False, id="pt-rt"),
        pytest.param("pytorch/pytorch:2.4.0-cuda12.5-cudnn9-devel", "535.230.02", H100, "arm64", False, id="pt-12.5"),
        # Triton's TensorRT-LLM 25.10 is CUDA 12.9.1, not the release's 13.0: NVIDIA lists it with 575.57.08
        pytest.param("nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3", "575.57.08", H100, "amd64", True, id="trt"),
        pytest.param("nvcr.io/nvidia/tritonserver:25.10-py3", "560.35.03", H100, "amd64", False, id="triton-13.0"),
    ],
)
def test_an_image_read_from_its_tag_runs_where_its_forward_compatibility_says(
    image: str, driver: str, product: str, platform: str, allowed: bool
) -> None:
    """A pod of the nvidia/cuda:12.8.0 image was refused on H100s of driver 550 (CUDA 12.4), where the image's own
    NVIDIA_REQUIRE_CUDA accepts R550 and its compat package runs CUDA 12.8 (a review of real manifests: the same
    pod with that variable in its env was admitted); an NGC 24.12 pod on R535 likewise (its release notes)."""
    node = gpu_node("n", "pool-x", driver, product=product, labels={"kubernetes.io/arch": platform})
    result = pipeline.review(pod(container(image=image)), context([node]))
    assert result.allowed is allowed, result.message
    if allowed:  # said where forward compatibility is what admits it (the TensorRT-LLM pool runs its CUDA itself)
        assert ("forward compatibility" in annotation_of(result.object)) is ("trtllm" not in image)
    else:
        assert result.reason == "CUDAIncompatible"


ON_DEMAND_TOO = "cuda: for on-demand too, upgrade the driver of pool on-demand or use an image built for CUDA <= 12.2"
SPOT_ALONE = ["cuda: only spot pools run its CUDA, steered there (it may be preempted): pool spot-new", ON_DEMAND_TOO]
PREFERRED_ALONE = [
    "cuda: spot prefer, yet only spot runs its CUDA: steered to preemptible pool spot-new",
    ON_DEMAND_TOO,
]


@pytest.mark.parametrize(
    ("mode", "said"),
    [("tolerate", SPOT_ALONE), ("prefer", PREFERRED_ALONE), ("require", []), ("prefer-deployment", PREFERRED_ALONE)],
)
def test_a_pod_steered_to_spot_pools_alone_is_told_it_may_be_preempted(mode: str, said: list[str]) -> None:
    """Only a spot pool's driver runs the pod's CUDA: the steering sends a pod that merely tolerates spot to
    preemptible capacity alone, which only the annotation said (a review of real manifests: a Kueue Job). Under
    prefer too, which allows on-demand capacity: a Deployment so written was steered to the spot pool alone without
    a word (a user-journey review); what would let it run on-demand is said."""
    old = gpu_node("old-1", "on-demand", "535.104.05")
    spot = gpu_node("spot-1", "spot-new", "570.124.06", taints=[SPOT_TAINT], labels={SPOT_TAINT["key"]: "true"})
    obj = pod(container(image=IMAGE_128), annotations={"gpu-admission.io/spot": mode.removesuffix("-deployment")})
    if mode.endswith("-deployment"):
        obj = deployment(obj["spec"])
        obj["spec"]["template"]["metadata"]["annotations"] = {"gpu-admission.io/spot": "prefer"}
    result = pipeline.review(obj, context([old, spot]))
    assert result.allowed, result.message
    assert [w for w in result.warnings if w.startswith("cuda:")] == said, result.warnings
    both = pipeline.review(obj, context([old, spot, gpu_node("od-1", "od-new", "570.124.06")]))
    assert not any("only spot" in w for w in both.warnings)  # an on-demand pool runs it too


def test_a_prefer_pod_steered_off_a_pool_of_unknown_driver_is_told_to_declare_it_not_to_upgrade_it() -> None:
    """Under unknownDriver: deny, an on-demand pool whose driver is unknown is no place for the pod: it was said to
    need its driver upgraded, and an image "built for an older CUDA" (a review); the denial's own words say what to
    do, declare that driver."""
    spot = gpu_node("spot-1", "spot-new", "570.124.06", taints=[SPOT_TAINT], labels={SPOT_TAINT["key"]: "true"})
    unknown = gpu_node("od-1", "od-nodriver", None)
    obj = pod(container(image=IMAGE_128), annotations={"gpu-admission.io/spot": "prefer"})
    ctx = context([unknown, spot], settings({"unknownDriver": "deny"}))
    said = [w for w in pipeline.review(obj, ctx).warnings if w.startswith("cuda:")]
    assert said[1:] == [
        "cuda: for on-demand too, declare the driver of pool od-nodriver (cluster.pools[].driverVersion)"
    ]
    old = gpu_node("old-1", "on-demand", "535.104.05")
    said = [w for w in pipeline.review(obj, context([old, unknown, spot], ctx.settings)).warnings if "cuda:" in w]
    assert said[1:] == [
        "cuda: for on-demand too, upgrade the driver of pool on-demand or use an image built for CUDA <= 12.2",
        "cuda: for on-demand too, declare the driver of pool od-nodriver (cluster.pools[].driverVersion)",
    ]


def test_a_prefer_pod_steered_to_spot_pools_alone_is_told_each_of_them_named_whole_or_counted() -> None:
    """EKS's long node group names: the prefer warning's head left 23 characters, the first spot pool was cut and a
    second one lost unsaid ('pools ml-l4-spot-us-ea…': a review)."""
    capacity = "eks.amazonaws.com/capacityType"
    nodes = [
        gpu_node("n1", "ml-a10g-ondemand-us-east-1a", "535.216.03", labels={capacity: "ON_DEMAND"}),
        gpu_node("n3", "ml-l40s-spot-us-east-1a", "570.124.06", labels={capacity: "SPOT"}),
        gpu_node("n4", "ml-l4-spot-us-east-1c", "570.124.06", labels={capacity: "SPOT"}),
    ]
    obj = pod(container(image=IMAGE_128), annotations={"gpu-admission.io/spot": "prefer"})
    warnings = [w for w in pipeline.review(obj, context(nodes)).warnings if w.startswith("cuda:")]
    assert warnings[0] == (
        "cuda: spot prefer, yet only spot runs its CUDA: steered to preemptible pools ml-l4-spot-us-east-1c and 1 more"
    )
    warnings = [w for w in pipeline.review(obj, context(nodes[:2])).warnings if w.startswith("cuda:")]
    assert warnings[0].endswith("steered to preemptible pool ml-l40s-spot-us-east-1a")


def test_a_declared_aks_spot_pool_at_zero_is_reached_only_with_the_toleration_of_its_spot_taint() -> None:
    """AKS taints every spot node: its spot pool at zero was taken as untainted, and a pod that does not tolerate
    the taint was steered there alone ("only spot pools run its CUDA") and stayed Pending for good; refused as with
    a node of it there, the advice naming the toleration."""
    aks = "kubernetes.azure.com/agentpool"
    old = gpu_node("aks-gpu-1", "gpu", "535.104.05", product=RTX, pool_label=aks)
    spot = {"name": "spotgpu", "nodeSelector": {aks: "spotgpu"}, "driverVersion": "570.124.06", "spot": True}
    ctx = context([old], settings(cluster={"pools": [{**spot, "gpuProduct": RTX}]}))
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert not result.allowed and result.reason == "CUDAIncompatible"
    assert required_terms(result.object) == []
    assert (
        "target pool spotgpu (driver 570.124.06, CUDA 12.8) with nodeSelector kubernetes.azure.com/agentpool: spotgpu"
        " and a toleration of kubernetes.azure.com/scalesetpriority=spot:NoSchedule (or annotation"
        " gpu-admission.io/spot: tolerate)"
    ) in result.message
    tolerating = pipeline.review(
        pod(container(image=IMAGE_128), annotations={"gpu-admission.io/spot": "tolerate"}), ctx
    )
    assert tolerating.allowed, tolerating.message
    assert tolerating.object["spec"]["tolerations"] == [
        {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}
    ]
    assert required_terms(tolerating.object) == [
        {"matchExpressions": [{"key": aks, "operator": "In", "values": ["spotgpu"]}]}
    ]


@pytest.mark.parametrize(
    ("platform", "theirs"),
    [
        ("arm64", "arm64"),
        (None, "not known: no kubernetes.io/arch label, which a declared pool may give in its nodeSelector"),
    ],
)
def test_a_forward_branch_of_another_cpu_architecture_is_named_as_such(platform: str | None, theirs: str) -> None:
    """nvidia/cuda 12.4.1's Ubuntu arm64 image has no compat package: on an arm64 H100 of R535 the refusal said its
    forward-compatibility branches (470, 525, 535) 'do not match either', of a driver of branch 535."""
    labels = {"kubernetes.io/arch": platform} if platform else None
    node = gpu_node("n", "pool-x", "535.104.05", product=H100, labels=labels)
    result = pipeline.review(pod(container(image="nvidia/cuda:12.4.1-base-ubuntu22.04")), context([node]))
    assert not result.allowed
    assert (
        "(driver branches 470, 525, 535) match the driver of pool pool-x, but the image carries its compat libraries"
        f" only for amd64 nodes (theirs: {theirs})."
    ) in result.message


def test_a_refusal_gives_each_pool_its_own_reason_its_forward_branches_do_not_help() -> None:
    """A GeForce of a branch the image names is told of error 804 whatever its CPU architecture (it was told to
    label an amd64 node); an arm64 H100 of such a branch of the architecture; a pool of another branch that its
    driver does not match: each said, where one reason stood for all."""
    geforce = gpu_node("g", "geforce", "535.104.05", product=RTX, labels={"kubernetes.io/arch": "arm64"})
    arm = gpu_node("a", "grace", "535.104.05", product=H100, labels={"kubernetes.io/arch": "arm64"})
    other = gpu_node("o", "r545", "545.29.06", product=H100, labels={"kubernetes.io/arch": "amd64"})
    result = pipeline.review(
        pod(container(image="nvidia/cuda:12.4.1-base-ubuntu22.04")), context([geforce, arm, other])
    )
    assert not result.allowed
    message = result.message
    assert "match the driver of pool geforce, but forward compatibility works only on data-center GPUs" in message
    assert "They match the driver of pool grace, but the image carries its compat libraries only for amd64" in message
    assert "They do not match the driver of pool r545." in message


def _gke_pool(name: str, product: str, driver: str = "535.230.02", **selector: str) -> dict[str, Any]:
    """A GKE pool declared in settings: GKE's own driver installer gives no GPU feature discovery labels."""
    node_selector = {"cloud.google.com/gke-nodepool": name, **selector}
    return {"name": name, "nodeSelector": node_selector, "driverVersion": driver, "gpuProduct": product}


def _gke(driver: str) -> Context:
    """A GKE pool of H100s on GKE's own driver installer (no GPU feature discovery: the driver from settings)."""
    s = settings(cluster={"pools": [_gke_pool("h100", H100, driver)]})
    node = gpu_node("gke-h100-1", "h100", None, gfd="none", pool_label="cloud.google.com/gke-nodepool")
    node["metadata"]["labels"].update({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb", PLATFORM: "amd64"})
    return context([node], s)


PLATFORM = "kubernetes.io/arch"


@pytest.mark.parametrize(
    ("image", "command", "allowed"),
    [
        ("nvidia/cuda:12.8.0-base-ubuntu22.04", None, False),  # the toolkit would load its compat libraries: none
        ("nvcr.io/nvidia/pytorch:24.12-py3", None, True),  # its entrypoint loads them itself
        ("nvcr.io/nvidia/pytorch:24.12-py3", ["python", "train.py"], False),  # a command replaces that entrypoint
        ("nvidia/cuda:12.2.2-base-ubuntu22.04", None, True),  # the driver's own CUDA: nothing forward needed
    ],
)
def test_forward_compatibility_on_gkes_driver_installer(image: str, command: list[str] | None, allowed: bool) -> None:
    """GKE's driver installer and device plugin use no NVIDIA Container Toolkit, so nothing loads an image's compat
    libraries: an nvidia/cuda:12.8 pod was admitted onto GKE H100s of R535 through forward compatibility and
    crashes there ("CUDA driver version is insufficient"; docs/install.md said so, the policy did not: found by a
    review of the docs against the code). NGC's entrypoint loads them itself, where the container keeps it."""
    c = container(image=image)
    if command:
        c["command"] = command
    result = pipeline.review(pod(c), _gke("535.230.02"))
    assert result.allowed is allowed, result.message
    if not allowed:
        assert "GKE's own driver installer loads no image's compat libraries" in result.message
        assert ("so keep it (no command:" in result.message) is image.startswith("nvcr.io")
    # where the GPU Operator's feature discovery says the driver (its toolkit loads them), forward compatibility holds
    node = gpu_node(
        "gke-op-1", "h100", "535.230.02", product=H100, pool_label="cloud.google.com/gke-nodepool",
        labels={PLATFORM: "amd64"},
    )  # fmt: skip
    assert pipeline.review(pod(c), context([node])).allowed


def test_gkes_gpu_operator_pools_keep_their_forward_compatibility_and_an_rtx_is_told_its_own_reason() -> None:
    """With the GPU Operator on GKE (its toolkit loads compat libraries), a pool scaled to zero was taken for GKE's
    driver installer; its nodeSelector naming a label of GPU feature discovery says otherwise. On a GKE pool of
    RTX GPUs the words blamed the driver installer, where forward compatibility is not known to work on the GPU
    at all (found by a review of this session's commits)."""
    image = "nvidia/cuda:12.8.0-base-ubuntu22.04"
    operator = _gke_pool("h100", H100, **{"nvidia.com/gpu.present": "true"})
    at_zero = context([], settings(cluster={"pools": [operator]}))
    assert pipeline.review(pod(container(image=image)), at_zero).allowed
    # GKE's own driver installer, its pool at zero: refused (the view's own gpu.product label on a declared pool
    # made every one of them count as the GPU Operator's: found re-reading this change)
    installer = context([], settings(cluster={"pools": [_gke_pool("h100", H100)]}))
    refused = pipeline.review(pod(container(image=image)), installer)
    assert not refused.allowed and "GKE's own driver installer" in refused.message, refused.message
    rtx = settings(cluster={"pools": [_gke_pool("g4", "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition")]})
    denied = pipeline.review(pod(container(image="nvcr.io/nvidia/pytorch:24.12-py3")), context([], rtx))
    assert not denied.allowed
    assert "GKE's own driver installer" not in denied.message, denied.message
    assert "forward compatibility works only on data-center GPUs" in denied.message, denied.message


def test_steering_a_pool_of_many_groups_works_out_each_selector_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups of one pool whose drivers differ were compared pairwise: 3,000 groups (a label of each node's own)
    took past the 1 s budget and every GPU pod of the cluster was refused (found by a review of the cluster model).
    The view is made of one group per node here, as before labels of each node's own were found."""
    from webhook import cluster

    monkeypatch.setattr(cluster, "MANY_GROUPS", 10_000)
    nodes = [
        gpu_node(
            f"n-{i}",
            "a3",
            "550.54.15" if i % 2 else "535.104.05",
            gfd="old",
            runtime_labels=False,
            labels={"example.com/rack-slot": f"h-{i}"},
        )
        for i in range(400)
    ]
    ctx = context(nodes)
    assert len(ctx.cluster.groups) == 400
    calls = []
    selector = cuda.pool_selector

    def counted(group: Any, c: Context) -> Any:
        calls.append(group)
        return selector(group, c)

    monkeypatch.setattr(cuda, "pool_selector", counted)
    result = pipeline.review(pod(container(image=IMAGE_124)), ctx)
    assert result.allowed and required_terms(result.object)
    assert {c.group.driver_text for c in ctx.cluster.eligible(result.object["spec"])} == {"550.54.15"}
    assert len(calls) <= 4 * len(nodes), len(calls)


def _template_node(labels: dict[str, str]) -> dict[str, Any]:
    """The node Cluster Autoscaler imagines for a node group at zero: the group's own labels (its pool label, the
    instance type), a GPU, and none of GFD's labels, which GFD writes after the node boots."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "template-node-for-new", "labels": labels},
        "spec": {},
        "status": {"allocatable": {"cpu": "96", "memory": "1000Gi", "nvidia.com/gpu": "8"}},
    }


@pytest.mark.parametrize(
    ("pool_label", "also"),
    [
        pytest.param("eks.amazonaws.com/nodegroup", {}, id="eks"),
        pytest.param("cloud.google.com/gke-nodepool", {}, id="gke"),
        pytest.param("kubernetes.azure.com/agentpool", {"agentpool": "new"}, id="aks"),
        pytest.param("compute.coreweave.com/node-pool", {}, id="coreweave"),
    ],
)
def test_node_groups_an_autoscaler_makes_from_zero_are_steered_to_by_their_pool_label(
    pool_label: str, also: dict[str, str]
) -> None:
    """Cluster Autoscaler scales a node group up from zero only where the node it builds from the group's definition
    (EKS: the managed nodegroup's labels and the ASG's node-template tags; GKE: the node pool's labels; AKS: the
    agent pool's labels and VMSS tags) matches the pod's rules, and GFD's labels are never on it: a Deployment steered
    by GFD's CUDA labels to a GPU group scaled to zero stayed Pending for good ("node(s) didn't match Pod's node
    affinity" in CA's NotTriggerScaleUp Events). Such groups are steered to by their pool label."""
    nodes = [
        gpu_node("old-1", "old", "535.104.05", pool_label=pool_label, labels={k: "old" for k in also}),
        gpu_node("new-1", "new", "570.124.06", pool_label=pool_label, labels=also),
    ]
    ctx = context(nodes)
    result = pipeline.review(deployment(pod(container(image=IMAGE_128))["spec"]), ctx)
    assert result.allowed, result.message
    assert required_terms(result.object) == [
        {"matchExpressions": [{"key": pool_label, "operator": "In", "values": ["new"]}]}
    ]
    assert "supported by pool new (driver 570.124.06, CUDA 12.8)" in annotation_of(result.object)
    assert_idempotent(result, ctx)
    spec = result.object["spec"]["template"]["spec"]
    at_zero = build_view([_template_node({pool_label: "new", **also})], Settings())
    assert at_zero.eligible(spec), "the template node of the group at zero matches the steered pods"
    old_at_zero = build_view([_template_node({pool_label: "old", **{k: "old" for k in also}})], Settings())
    assert not old_at_zero.eligible(spec), "nor is the old group scaled up for them"


def test_a_k3s_box_keeps_gfd_steering_beside_an_eks_node_group() -> None:
    """GPU VMs joined with k3s carry no provider's pool label and no autoscaler builds their nodes from a template:
    the steering keeps GFD's range for them (a box upgraded later to a newer driver stays eligible), and names the
    EKS node group beside them."""
    box = gpu_node("box-1", "ignored", "575.51.03", pool_label="example.com/none")
    nodes = [gpu_node("old-1", "old", "535.104.05"), gpu_node("new-1", "new", "570.124.06"), box]
    ctx = context(nodes)
    result = pipeline.review(deployment(pod(container(image=IMAGE_128))["spec"]), ctx)
    assert result.allowed, result.message
    assert required_terms(result.object) == [
        *from_cuda(12, 9),
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": ["new"]}]},
    ]
    assert_idempotent(result, ctx)
    spec = result.object["spec"]["template"]["spec"]
    assert build_view([_template_node({POOL_LABEL: "new"})], Settings()).eligible(spec)
    upgraded = gpu_node("box-1", "ignored", "580.95.05", pool_label="example.com/none")  # CUDA 13.0
    assert build_view([upgraded], Settings()).eligible(spec)


def test_a_declared_pool_of_eks_nodes_is_steered_to_by_its_declared_selector() -> None:
    """A pool declared by another label than its nodes' node group (the instance type, an ASG's node-template label)
    is still a node group Cluster Autoscaler scales up from zero on a template node without GFD's labels: it is
    named by its declared nodeSelector while its nodes are up too, not by GFD's CUDA labels (found by a review)."""
    pools = [
        {"name": p, "nodeSelector": {"node.kubernetes.io/instance-type": f"p5-{p}"}, "driverVersion": d}
        for p, d in (("old", "535.104.05"), ("new", "570.124.06"))
    ]
    nodes = [
        gpu_node(f"{p}-1", p, d, labels={"node.kubernetes.io/instance-type": f"p5-{p}"})
        for p, d in (("old", "535.104.05"), ("new", "570.124.06"))
    ]
    ctx = context(nodes, settings(cluster={"pools": pools}))
    result = pipeline.review(deployment(pod(container(image=IMAGE_128))["spec"]), ctx)
    assert result.allowed, result.message
    assert required_terms(result.object) == [
        {"matchExpressions": [{"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5-new"]}]}
    ]
    assert_idempotent(result, ctx)
    at_zero = build_view(
        [_template_node({POOL_LABEL: "new", "node.kubernetes.io/instance-type": "p5-new"})], Settings()
    )
    assert at_zero.eligible(result.object["spec"]["template"]["spec"])


@pytest.mark.parametrize(
    ("key", "pool_label_keys", "gke"),
    [
        pytest.param("nodepool", [], False, id="ovh-nodepool"),
        pytest.param("agentpool", [], False, id="bare-agentpool"),
        pytest.param("nodepool", ["nodepool"], False, id="nodepool-listed"),
        pytest.param("kubernetes.azure.com/agentpool", ["kubernetes.azure.com/agentpool"], False, id="aks-key-listed"),
        # the nodes carry GKE's pool label too, but the user's key names the pool (a review of the fix)
        pytest.param("team.example.com/pool", ["team.example.com/pool"], True, id="own-key-beside-gke-nodepool"),
    ],
)
def test_generic_or_listed_pool_labels_keep_gfd_steering(key: str, pool_label_keys: list[str], gke: bool) -> None:
    """A k3s or kubeadm cluster's own nodes labelled with a generic name (OVH's nodepool, AKS's legacy bare
    agentpool), or with a key the user lists in cluster.poolLabelKeys even where a provider's is spelled alike, are
    no pool an autoscaler builds from a template: GFD's range terms, which a box upgraded later still matches (found
    by a review: under the default providers [all] they were named by their pool label)."""
    nodes = [
        gpu_node(f"{p}-1", f"gpu-{p}", d, pool_label=key, labels={"cloud.google.com/gke-nodepool": p} if gke else None)
        for p, d in (("a", "535.104.05"), ("c", "570.124.06"))
    ]
    ctx = context(nodes, settings(cluster={"poolLabelKeys": pool_label_keys}))
    result = pipeline.review(deployment(pod(container(image=IMAGE_128))["spec"]), ctx)
    assert result.allowed, result.message
    assert required_terms(result.object) == from_cuda(12, 8)
    upgraded = gpu_node("a-1", "gpu-a", "580.95.05", pool_label=key)  # CUDA 13.0
    assert build_view([upgraded], Settings()).eligible(result.object["spec"]["template"]["spec"])


@pytest.mark.parametrize(
    ("key", "pool_label_keys"),
    [
        pytest.param("agentpool", [], id="bare-agentpool"),
        pytest.param("agentpool", ["agentpool"], id="agentpool-listed"),
    ],
)
def test_a_generic_or_listed_pool_label_shows_no_cloud_whose_apiserver_tolerates_the_gpu_taint(
    key: str, pool_label_keys: list[str]
) -> None:
    """k3s runs no ExtendedResourceToleration (off upstream): a k3s cluster whose pools are labelled agentpool counted
    as AKS, the taint nvidia.com/gpu was taken as tolerated, and a pod was steered to the only pool that runs it, whose
    taint it does not tolerate: Pending for good. A generic pool label, listed in cluster.poolLabelKeys or not, shows
    no provider: the refusal names the toleration (found by a review of the cluster model)."""
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    nodes = [
        gpu_node("old-1", "old", "535.104.05", pool_label=key),
        gpu_node("new-1", "new", "570.124.06", pool_label=key, taints=[gpu_taint]),
    ]
    ctx = context(nodes, settings(cluster={"poolLabelKeys": pool_label_keys}))
    assert (ctx.cluster.providers, ctx.cluster.extended_resource_toleration) == (frozenset(), False)
    obj = pod(container(image=IMAGE_128))
    assert required_terms(pipeline.mutate(obj, ctx).object) == []
    message = pipeline.validate(obj, ctx).message
    assert message.endswith(
        "To fix: Use an image built for CUDA <= 12.2; or target pool new (driver 570.124.06, CUDA 12.8) with"
        f" nodeSelector {key}: new and a toleration of nvidia.com/gpu=present:NoSchedule; or upgrade the driver to"
        " >= 570.26 on pool old."
    ), message


def test_aks_nodes_are_steered_by_their_agentpool_label_not_the_bare_one() -> None:
    """An AKS node carries kubernetes.azure.com/agentpool and the legacy bare agentpool: only the former is AKS's own,
    and names its pool (bare agentpool alone is generic: test_generic_or_listed_pool_labels_keep_gfd_steering)."""
    nodes = [
        gpu_node(f"{p}-1", p, d, pool_label="kubernetes.azure.com/agentpool", labels={"agentpool": p})
        for p, d in (("old", "535.104.05"), ("new", "570.124.06"))
    ]
    ctx = context(nodes)
    assert "agentpool" not in ctx.cluster.presets.pool_steered
    result = pipeline.review(deployment(pod(container(image=IMAGE_128))["spec"]), ctx)
    assert required_terms(result.object) == [
        {"matchExpressions": [{"key": "kubernetes.azure.com/agentpool", "operator": "In", "values": ["new"]}]}
    ]


def test_karpenter_pools_are_steered_to_by_their_nodepool_label() -> None:
    """Karpenter makes a node only for labels its NodePools define or it knows: a required term on GFD's CUDA
    labels left the pod Pending for good once the compatible nodes were busy or consolidated away (found by a review
    of real clusters). Its pools are named by karpenter.sh/nodepool; pools no autoscaler makes (k3s-like) keep the
    CUDA labels."""
    nodes = [
        gpu_node("old-1", "old", "535.104.05", pool_label="karpenter.sh/nodepool"),
        gpu_node("new-1", "new", "570.124.06", pool_label="karpenter.sh/nodepool"),
    ]
    ctx = context(nodes)
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed
    assert required_terms(result.object) == [
        {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["new"]}]}
    ]
    assert_idempotent(result, ctx)
    k3s = k3s_context([k3s_node("old-1", "old", "535.104.05"), k3s_node("new-1", "new", "570.124.06")])
    steered = pipeline.review(pod(container(image=IMAGE_128)), k3s)
    # the range from CUDA 12.8 up, not a pool (a subset test passed whatever was steered, or nothing)
    assert required_terms(steered.object) == from_cuda(12, 8)


def test_a_gke_pool_whose_gpu_product_nothing_declares_is_known_by_its_accelerator() -> None:
    """No GFD and no gpuProduct declared: the denial blamed the GPU's brand ('not known (no nvidia.com/gpu.product
    label)') on GKE's data-center GPUs, where the reason is GKE's driver installer (found by a review of real
    clusters)."""
    s = settings(cluster={"pools": [_gke_pool("h100", "", "535.230.02")]})
    node = gpu_node("gke-h100-1", "h100", None, gfd="none", pool_label="cloud.google.com/gke-nodepool")
    node["metadata"]["labels"].update({"cloud.google.com/gke-accelerator": "nvidia-h100-80gb", PLATFORM: "amd64"})
    result = pipeline.review(pod(container(image="nvidia/cuda:12.8.0-base-ubuntu22.04")), context([node], s))
    assert not result.allowed
    assert "GKE's own driver installer loads no image's compat libraries" in result.message, result.message
    assert "brand" not in result.message and "gpu.product" not in result.message


def test_an_unlabelled_pool_is_steered_to_by_its_gpu_not_its_exact_driver() -> None:
    """k3s nodes name no pool: steering pinned a Deployment's template to driver-version.full 570.124.06, and its
    pods stayed Pending for good once the boxes were upgraded to 580, a driver strictly better (found by a review of
    real clusters)."""
    nodes = [
        gpu_node("h100", "k3s", "570.124.06", product=H100, pool_label="node.kubernetes.io/instance-type"),
        gpu_node("rtx", "k3s", "570.26", product=RTX, pool_label="node.kubernetes.io/instance-type"),
    ]
    ctx = context(nodes)
    result = pipeline.review(pod(container(image="nvidia/cuda:13.0.0-base-ubuntu22.04")), ctx)
    assert result.allowed, result.message
    assert required_terms(result.object) == [
        {"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]}]}
    ]
    assert_idempotent(result, ctx)


def test_karpenter_and_other_pools_each_get_their_own_terms() -> None:
    """A Karpenter NodePool's groups are named by their pool label while pools no autoscaler makes (k3s-like) keep
    GFD's ranges, which move up with a driver upgrade; and a NodePool named as an EKS node group is (gpu@karpenter)
    is still named by its label's value, not by an exact driver (found by a review of this session's commits)."""
    karpenter = gpu_node("k-1", "gpu", "570.124.06", pool_label="karpenter.sh/nodepool")
    same_name = pipeline.review(
        pod(container(image=IMAGE_128)), context([gpu_node("e-1", "gpu", "535.104.05"), karpenter])
    )
    assert required_terms(same_name.object) == [
        {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu"]}]}
    ]
    nodes = [karpenter, k3s_node("e-2", "a", "570.124.06"), k3s_node("e-3", "old", "535.104.05")]
    mixed = pipeline.review(pod(container(image=IMAGE_128)), k3s_context(nodes))
    keys = [[e["key"] for e in t["matchExpressions"]] for t in required_terms(mixed.object)]
    assert ["karpenter.sh/nodepool"] in keys and [NEW_MAJOR, NEW_MINOR] in keys, keys


def test_a_templates_steering_by_gpu_product_is_taken_out_when_no_longer_needed() -> None:
    """A Deployment steered to an unlabelled pool by its GPU product kept the term when its image moved to a CUDA
    every pool runs, and from then on took it for the user's own (found by a review of this session's commits).
    Applied by kubectl, its manifest tells the user's own terms from the steering's (without it, a product term is
    left: it may be the user's, in the same words)."""
    nodes = [
        gpu_node("h100", "k3s", "570.124.06", product=H100, pool_label="node.kubernetes.io/instance-type"),
        gpu_node("rtx", "k3s", "570.26", product=RTX, pool_label="node.kubernetes.io/instance-type"),
    ]
    ctx = context(nodes)
    workload = deployment(pod(container(image="nvidia/cuda:13.0.0-base-ubuntu22.04"))["spec"])
    workload["metadata"]["annotations"] = {LAST_APPLIED: json.dumps(workload)}
    live = pipeline.mutate(copy.deepcopy(workload), ctx).object
    assert [e["key"] for t in required_terms(live) for e in t["matchExpressions"]] == ["nvidia.com/gpu.product"]
    sent = copy.deepcopy(live)
    sent["spec"]["template"]["spec"]["containers"][0]["image"] = IMAGE_124
    applied = copy.deepcopy(workload)
    applied["spec"]["template"]["spec"]["containers"][0]["image"] = IMAGE_124
    sent["metadata"]["annotations"] = {LAST_APPLIED: json.dumps(applied)}
    after = pipeline.mutate(sent, dataclasses.replace(ctx, operation="UPDATE", old_object=live)).object
    assert required_terms(after) == []


def test_a_gpu_product_that_a_labelled_blocked_pool_has_too_is_not_steered_to_by_it() -> None:
    """An unlabelled H100 on R570 beside an EKS node group of H100s on R535: steering by the product selected both,
    was refused, and the pod was admitted to land where it cannot run (found by a review of this session's
    commits); the exact driver tells them apart, and the advice says the same."""
    nodes = [
        gpu_node("new", "k3s", "570.124.06", product=H100, pool_label="node.kubernetes.io/instance-type"),
        gpu_node("old-1", "old", "535.104.05", product=H100),
    ]
    for n in nodes:
        for k in [k for k in n["metadata"]["labels"] if k.startswith("nvidia.com/cuda.runtime")]:
            del n["metadata"]["labels"][k]
    ctx = context(nodes)
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed
    assert {c.group.pool for c in ctx.cluster.eligible(result.object["spec"])} == {f"{H100}/driver-570.124.06"}


def test_a_declared_karpenter_pool_is_steered_to_by_its_nodepool_label() -> None:
    """A pool declared in settings whose selector names a Karpenter NodePool got terms on GFD's labels (found by a
    review of this session's commits)."""
    declared = {"name": "gpu", "nodeSelector": {"karpenter.sh/nodepool": "gpu"}, "driverVersion": "570.124.06"}
    nodes = [
        gpu_node("k-1", "gpu", "570.124.06", pool_label="karpenter.sh/nodepool"),
        gpu_node("old-1", "old", "535.104.05"),
    ]
    ctx = context(nodes, settings(cluster={"pools": [declared]}))
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert required_terms(result.object) == [
        {"matchExpressions": [{"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu"]}]}
    ]


def test_the_advice_names_an_unlabelled_pool_by_its_gpu_product() -> None:
    """The denial's advice still named the exact driver the steering no longer writes (found by a review)."""
    nodes = [
        gpu_node("h100", "k3s", "570.124.06", product=H100, pool_label="example.com/none"),
        gpu_node("old", "k3s", "535.104.05", product=RTX, pool_label="example.com/none"),
    ]
    obj = pod(container(image=IMAGE_128), node_selector={"nvidia.com/cuda.driver-version.full": "535.104.05"})
    result = pipeline.review(obj, context(nodes))
    assert not result.allowed
    assert f"with nodeSelector nvidia.com/gpu.product: {H100}" in result.message, result.message


def test_a_users_own_product_terms_stay_where_no_manifest_tells_them_from_the_steerings() -> None:
    """A Helm-rendered Deployment whose user wrote [product H100] or [product RTX]: the steering to H100 said the
    same words, and a second pass took the user's H100 term out, leaving the RTX pool that cannot run it (found by a
    review of this session's commits)."""
    none = "example.com/none"
    nodes = [
        gpu_node("h100", "x", "570.124.06", product=H100, pool_label=none, runtime_labels=False),
        gpu_node("rtx", "x", "535.104.05", product=RTX, pool_label=none, runtime_labels=False),
    ]
    ctx = context(nodes)
    terms = [[{"key": "nvidia.com/gpu.product", "operator": "In", "values": [v]}] for v in (H100, RTX)]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": t} for t in terms]
            }
        }
    }
    first = pipeline.mutate(deployment(pod(container(image=IMAGE_128), affinity=affinity)["spec"]), ctx)
    assert first.allowed
    assert pipeline.mutate(copy.deepcopy(first.object), ctx).patch == []


def test_a_helm_templates_steering_by_gpu_product_is_taken_out_when_no_longer_needed() -> None:
    """No kubectl manifest (Helm, a CronJob's Jobs): the product term the steering wrote was kept for good, since
    the line named it in the same words as a user's own, and the template stayed on one GPU after its image no
    longer needed it. The line now names only what the steering added; the user's own product term stays."""
    nodes = [
        gpu_node("h100", "k3s", "570.124.06", product=H100, pool_label="node.kubernetes.io/instance-type"),
        gpu_node("rtx", "k3s", "570.26", product=RTX, pool_label="node.kubernetes.io/instance-type"),
    ]
    ctx = context(nodes)
    product = {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]}
    zone = {"key": "kubernetes.io/hostname", "operator": "In", "values": ["h100", "rtx"]}
    for own in ([], [zone], [product], [zone, product]):
        affinity = (
            {"nodeAffinity": {cuda.REQUIRED: {"nodeSelectorTerms": [{"matchExpressions": own}]}}} if own else None
        )
        workload = deployment(pod(container(image="nvidia/cuda:13.0.0-base-ubuntu22.04"), affinity=affinity)["spec"])
        live = pipeline.mutate(copy.deepcopy(workload), ctx).object
        steered = own if product in own else [*own, product]
        assert [e for t in required_terms(live) for e in t["matchExpressions"]] == steered
        assert (f"\n{cuda.STEERING}" in annotation_of(live)) == (product not in own), annotation_of(live)
        assert pipeline.mutate(copy.deepcopy(live), ctx).patch == []
        sent = copy.deepcopy(live)  # upgraded by Helm: the image moved to a CUDA every pool runs
        sent["spec"]["template"]["spec"]["containers"][0]["image"] = IMAGE_124
        update = dataclasses.replace(ctx, operation="UPDATE", old_object=live)
        after = pipeline.mutate(sent, update).object
        assert [e for t in required_terms(after) for e in t["matchExpressions"]] == own, own
        assert pipeline.mutate(copy.deepcopy(after), update).patch == []


def test_a_users_own_term_holding_the_steering_keeps_it_without_a_manifest() -> None:
    """A Helm chart's terms [zone a, product H100] or [zone b]: the steering added the product to the second term.
    Taking the line's product out of every term that looks made by it took the user's own H100 out of the first,
    and the RTX in zone a could run the pod (found by a review of this session's commits). With no manifest and a
    term that held an expression the steering writes, that expression is not named, and stays (a term narrow
    multiplied keeps it too: the known limit, see the cuda policy's ``_added``)."""
    nodes = [
        gpu_node("h100-a", "k3s", "570.124.06", product=H100, labels={"topology.kubernetes.io/zone": "a"}),
        gpu_node("rtx-a", "k3s", "570.26", product=RTX, labels={"topology.kubernetes.io/zone": "a"}),
        gpu_node("h100-b", "k3s", "570.124.06", product=H100, labels={"topology.kubernetes.io/zone": "b"}),
        gpu_node("rtx-b", "k3s", "570.26", product=RTX, labels={"topology.kubernetes.io/zone": "b"}),
    ]
    for n in nodes:
        n["metadata"]["labels"]["node.kubernetes.io/instance-type"] = n["metadata"]["labels"].pop(POOL_LABEL, "x")
    ctx = context(nodes)
    product = {"key": "nvidia.com/gpu.product", "operator": "In", "values": [H100]}
    zone_a = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    zone_b = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["b"]}
    own = [{"matchExpressions": [zone_a, product]}, {"matchExpressions": [zone_b]}]
    affinity = {"nodeAffinity": {cuda.REQUIRED: {"nodeSelectorTerms": copy.deepcopy(own)}}}
    workload = deployment(pod(container(image="nvidia/cuda:13.0.0-base-ubuntu22.04"), affinity=affinity)["spec"])
    live = pipeline.mutate(copy.deepcopy(workload), ctx).object
    assert required_terms(live) == [own[0], {"matchExpressions": [zone_b, product]}]
    sent = copy.deepcopy(live)
    sent["spec"]["template"]["spec"]["containers"][0]["image"] = IMAGE_124
    update = dataclasses.replace(ctx, operation="UPDATE", old_object=live)
    after = pipeline.mutate(sent, update).object
    assert own[0] in required_terms(after), required_terms(after)
    assert pipeline.mutate(copy.deepcopy(after), update).patch == []


def test_an_earlier_versions_steering_line_keeps_a_product_term_without_a_manifest() -> None:
    """A template steered by an earlier version, whose line named every expression: without kubectl's manifest its
    product term may be the user's own, and stays, as before."""
    nodes = [
        gpu_node("h100", "k3s", "570.124.06", product=H100, pool_label="node.kubernetes.io/instance-type"),
        gpu_node("rtx", "k3s", "570.26", product=RTX, pool_label="node.kubernetes.io/instance-type"),
    ]
    ctx = context(nodes)
    workload = deployment(pod(container(image="nvidia/cuda:13.0.0-base-ubuntu22.04"))["spec"])
    live = pipeline.mutate(copy.deepcopy(workload), ctx).object
    meta = live["spec"]["template"]["metadata"]
    meta["annotations"][CUDA_KEY] = meta["annotations"][CUDA_KEY].replace(cuda.STEERING, cuda.STEERING_BEFORE)
    sent = copy.deepcopy(live)
    sent["spec"]["template"]["spec"]["containers"][0]["image"] = IMAGE_124
    after = pipeline.mutate(sent, dataclasses.replace(ctx, operation="UPDATE", old_object=live)).object
    assert [e["key"] for t in required_terms(after) for e in t["matchExpressions"]] == ["nvidia.com/gpu.product"]


def test_a_taken_product_is_steered_to_with_its_driver() -> None:
    """An unlabelled H100 and RTX on one driver, a labelled H100 pool blocked on another: the driver alone selected
    the RTX too, nothing was steered, and the pod could land on it (found by a review of this session's commits)."""
    forward = "cuda>=12.8 brand=tesla,driver>=535,driver<536 brand=tesla,driver>=570,driver<571"
    arch = {"kubernetes.io/arch": "amd64"}
    nodes = [
        gpu_node("h100-k3s", "x", "535.104.05", product=H100, pool_label="example.com/none", labels=arch),
        gpu_node("rtx-k3s", "x", "535.104.05", product=RTX, pool_label="example.com/none", labels=arch),
        gpu_node("h100-eks", "old-h100", "560.35.03", product=H100, labels=arch),
    ]
    ctx = context(nodes)
    vllm = container(image="vllm/vllm-openai:v0.10.1", env={"NVIDIA_REQUIRE_CUDA": forward})
    result = pipeline.review(pod(vllm), ctx)
    assert result.allowed
    assert {c.group.pool for c in ctx.cluster.eligible(result.object["spec"])} == {f"{H100}/driver-535.104.05"}


RUNTIME_124 = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"


def test_a_pytorch_runtime_image_runs_on_any_driver_of_its_major_by_minor_version_compatibility() -> None:
    """pytorch/pytorch's runtime images are built FROM ubuntu with PyTorch's CUDA libraries and set no CUDA
    variable: nothing checks them at start, and minor-version compatibility runs a 12.x build on any driver from
    525.60.13. Under strict they were refused on driver 535 (CUDA 12.2), the most common image on the most common
    driver (found by a review of real images). Strict still holds for images that the runtime checks."""
    nodes = [gpu_node("old", "old", "535.104.05", product=H100), gpu_node("new", "new", "570.124.06", product=H100)]
    ctx = context(nodes)
    result = pipeline.review(pod(container(image=RUNTIME_124)), ctx)
    assert result.allowed, result.message
    assert required_terms(result.object) == []  # both pools run it: nothing steered
    said = annotation_of(result.object)
    assert said.split("\n")[0].endswith("CUDA 12.2) (minor-version compatibility on pool old)"), said
    strict = pipeline.review(pod(container(image="pytorch/pytorch-nightly:2510000-cu12.4")), ctx)  # no rule says so
    assert required_terms(strict.object) == [  # steered to the EKS node group that runs it
        {"matchExpressions": [{"key": POOL_LABEL, "operator": "In", "values": ["new"]}]}
    ]
    below = pipeline.review(pod(container(image=RUNTIME_124)), context([gpu_node("r470", "r470", "470.256.02")]))
    assert not below.allowed and "or upgrade the driver to >= 525.60.13 on pool r470" in below.message, below.message
    thirteen = pipeline.review(pod(container(image="pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime")), ctx)
    assert not thirteen.allowed and "needs CUDA 13.0" in thirteen.message  # its major's floor is 580.65.06
    # the version restated in the annotation: nothing checks it still (it was held to strict; found by a review)
    restated = pod(container(image=RUNTIME_124), annotations={"gpu-admission.io/cuda-version": "12.4"})
    assert pipeline.review(restated, context([nodes[0]])).allowed
    checked = pod(container(image=RUNTIME_124, env={"CUDA_VERSION": "12.4"}))
    assert not pipeline.review(checked, context([nodes[0]])).allowed  # the runtime checks the pod's own CUDA_VERSION


def test_the_image_command_says_where_minor_version_compatibility_runs_an_image() -> None:
    from webhook import cli

    out = io.StringIO()
    thirteen = "pytorch/pytorch:2.9.0-cuda13.0-cudnn9-runtime"  # 13.x's floor is 13.0's own driver: nothing more
    with contextlib.redirect_stdout(out):
        assert cli.main(["image", RUNTIME_124, "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel", thirteen]) == 0
    runtime, devel, newest = out.getvalue().splitlines()
    assert runtime.endswith("; also on drivers >= 525.60.13 (minor-version compatibility)"), runtime
    assert "minor-version" not in devel and "(forward compatibility)" in devel, devel
    assert "also on" not in newest, newest


A10G = "NVIDIA-A10G"


def test_a_declared_version_keeps_the_forward_compatibility_its_image_carries() -> None:
    """The 'CUDA version unknown' warning asks for the annotation, and the annotation was a bare cuda>=X.Y: an
    nvidia/cuda:12.4.1 image restated in it was refused on an A10G of R535, which its compat package runs (and which
    admitted the same image without the annotation; found by a review). A version above the tag's is one its compat
    libraries do not bring; an image no rule reads is told how to say what its own requirement says."""
    ctx = context([gpu_node("a", "a10g", "535.183.01", product=A10G, labels={"kubernetes.io/arch": "amd64"})])
    image = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    assert pipeline.review(pod(container(image=image)), ctx).allowed
    restated = pipeline.review(pod(container(image=image), annotations={"gpu-admission.io/cuda-version": "12.4"}), ctx)
    assert restated.allowed, restated.message
    lower = pipeline.review(pod(container(image=image), annotations={"gpu-admission.io/cuda-version": "12.3"}), ctx)
    assert lower.allowed, lower.message
    above = pipeline.review(pod(container(image=image), annotations={"gpu-admission.io/cuda-version": "12.6"}), ctx)
    assert not above.allowed and "needs CUDA 12.6 (from annotation gpu-admission.io/cuda-version)" in above.message
    unread = pod(container(image="vllm/vllm-openai:v0.6.3"), annotations={"gpu-admission.io/cuda-version": "12.4"})
    refused = pipeline.review(unread, ctx)
    assert not refused.allowed
    assert refused.message.endswith(
        "; or if the image is built on nvidia/cuda, write its NVIDIA_REQUIRE_CUDA (docker inspect) as the"
        " container's env instead of the annotation: its compat libraries may run it on these drivers."
    ), refused.message
    geforce = context([gpu_node("g", "rtx", "535.183.01", product=RTX)])  # no compat libraries run there
    assert "NVIDIA_REQUIRE_CUDA (docker inspect)" not in pipeline.review(unread, geforce).message


def test_a_declared_pool_at_zero_without_an_architecture_is_told_to_declare_one() -> None:
    """A declared pool at zero whose nodeSelector names no kubernetes.io/arch refused an image whose compat
    libraries are amd64's alone, which its running nodes admit: the refusal offered a downgrade or a driver upgrade,
    not the one line of settings (found by a review)."""
    selector = {"eks.amazonaws.com/nodegroup": "epool"}
    pool: dict[str, Any] = {"name": "epool", "nodeSelector": selector, "driverVersion": "535.183.01"}
    result = pipeline.review(
        pod(container(image="nvidia/cuda:12.4.1-runtime-ubuntu22.04")),
        context([], settings(cluster={"pools": [{**pool, "gpuProduct": A10G, "gpuCount": 1}]})),
    )
    assert not result.allowed
    assert (
        "To fix: Give pool epool the nodeSelector kubernetes.io/arch: amd64 in settings (cluster.pools[].nodeSelector)"
        " if its nodes are amd64; or use an image built for CUDA <= 12.2"
    ) in result.message, result.message
    declared = {**pool, "nodeSelector": {**selector, "kubernetes.io/arch": "amd64"}}
    fixed = context([], settings(cluster={"pools": [{**declared, "gpuProduct": A10G, "gpuCount": 1}]}))
    assert pipeline.review(pod(container(image="nvidia/cuda:12.4.1-runtime-ubuntu22.04")), fixed).allowed


def test_a_providers_own_pool_label_listed_in_pool_label_keys_still_shows_it() -> None:
    """An AKS user may list kubernetes.azure.com/agentpool in cluster.poolLabelKeys (tried first, to name pools): the
    cluster stopped counting as AKS, lost ExtendedResourceToleration, and refused a pod the scheduler places on the
    tainted pool that runs it (found by a review of the fix that made generic labels show no cloud). Listed, the key
    is not steered by (GFD's terms), but it still shows its provider."""
    aks = "kubernetes.azure.com/agentpool"
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    nodes = [
        gpu_node("old-1", "old", "535.104.05", pool_label=aks, labels={"agentpool": "old"}),
        gpu_node("new-1", "new", "570.124.06", pool_label=aks, labels={"agentpool": "new"}, taints=[gpu_taint]),
    ]
    ctx = context(nodes, settings(cluster={"poolLabelKeys": [aks]}))
    assert (ctx.cluster.providers, ctx.cluster.extended_resource_toleration) == (frozenset({"aks"}), True)
    result = pipeline.review(pod(container(image=IMAGE_128)), ctx)
    assert result.allowed, result.message
    assert required_terms(result.object) == from_cuda(12, 8)


def test_the_annotations_require_cuda_advice_is_not_given_where_the_tag_is_read_older() -> None:
    """The webhook reads nvidia/cuda:12.2.2's tag: an annotation of 12.4 is above what its compat libraries bring, so
    writing the image's own NVIDIA_REQUIRE_CUDA would admit the pod on R470-R535 where a 12.4 build fails (found by
    a review of the advice)."""
    ctx = context([gpu_node("a", "p", "535.183.01", product=H100, labels={"kubernetes.io/arch": "amd64"})])
    obj = pod(
        container(image="nvidia/cuda:12.2.2-runtime-ubuntu22.04"), annotations={"gpu-admission.io/cuda-version": "12.4"}
    )
    result = pipeline.review(obj, ctx)
    assert not result.allowed
    assert result.message.endswith(
        "To fix: Use an image built for CUDA <= 12.2; or upgrade the driver to >= 550.54.14 on pool p."
    ), result.message


@pytest.mark.parametrize(
    ("image", "mode", "reason", "line"),
    [
        pytest.param(
            "nvidia/cuda:12.2.2-base-ubuntu22.04",
            "enforce",
            "CUDAChecked",
            "CUDA 12.2 from image tag, nvidia/cuda 12.2.2-base-ubuntu22.04; supported by pool gpu-a",
            id="checked",
        ),
        pytest.param(
            "ghcr.io/example/train:1\u202e",
            "enforce",
            "CUDANotChecked",
            "CUDA version unknown (image ghcr.io/example/train:1\\u202e); not checked",
            id="not-checked",
        ),
        pytest.param(IMAGE_128, "warn", "CUDAIncompatible", "needs CUDA 12.8", id="would-be-denied"),
    ],
)
def test_a_pods_cuda_events_write_a_users_container_name_and_image_escaped(
    image: str, mode: str, reason: str, line: str
) -> None:
    """The pod's CUDA Event carried its container's line as it is, where the annotation escapes it: a newline and a
    right-to-left override in a container's name (the webhook sees a pod before its validation) or its image
    started a line of their own in ``kubectl describe`` and reordered it. Through the webhook's /mutate and
    /validate, as the Events are raised."""
    forged = "main\nforged line\u202ex"
    answered = through_app(pod(container(forged, image=image)), [A], settings({"mode": mode}))
    [said] = [e.message for e in answered.events if e.reason == reason]
    assert "main\\nforged line\\u202ex" in said and line in said, said
    assert "\n" not in said and "\u202e" not in said, said

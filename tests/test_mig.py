"""The mig policy through the pipeline: fractions and GPU-memory requests become MIG devices, or are refused."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from typing import Any, Literal

import jsonpatch
import pytest

from tests.conftest import FIXTURES
from tests.mig_fixtures import (
    POOL,
    WORKLOAD_FILES,
    container,
    context,
    gke_node,
    mig_annotation,
    mixed_node,
    mutate_twice,
    pod,
    resources_of,
    review,
    settings,
    single_node,
    template_of,
    through_app,
    whole_node,
    workload,
)
from webhook import cluster, pipeline
from webhook.cluster import GKE_SHARING_LABEL
from webhook.config import CudaSettings, PoolSettings
from webhook.model import Outcome
from webhook.policies import cuda
from webhook.policies.mig import SHARING_LABEL

GPU = "nvidia.com/gpu"
MEM = "gpu-admission.io/gpu-memory"
SPOT = "gpu-admission.io/spot"
A100_40 = "NVIDIA-A100-SXM4-40GB"
A100_80 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
A100_40_ALL = {"1g.5gb": 7, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1}
A100_40_USABLE = {
    "1g.5gb": 4864,
    "1g.10gb": 9856,
    "2g.10gb": 9856,
    "3g.20gb": 19968,
    "4g.20gb": 19968,
    "7g.40gb": 40192,
}


def a100_mig_pool(
    key: str, strategy: Literal["single", "mixed"] = "single", profiles: dict[str, int] | None = None
) -> PoolSettings:
    """A declared A100-80GB pool a100-mig, selected by ``key``, with a MIG ``strategy`` and layout (3g.40gb by
    default): at zero unless nodes carry its label."""
    return PoolSettings(
        name="a100-mig",
        node_selector={key: "a100-mig"},
        gpu_product=A100_80,
        gpu_memory_mib=81920,
        gpu_count=8,
        mig_strategy=strategy,
        mig_profiles=profiles or {"3g.40gb": 16},
    )


def mig(profile: str) -> dict[str, Any]:
    """What a converted mixed-strategy container holds."""
    return {"limits": {f"nvidia.com/mig-{profile}": "1"}, "requests": {f"nvidia.com/mig-{profile}": "1"}}


def mig_limits(profile: str) -> dict[str, Any]:
    """What a converted mixed-strategy container of a template holds when its limits alone asked: its pods'
    requests default to their limits, and the webhook writes no request that no manifest has."""
    return {"limits": {f"nvidia.com/mig-{profile}": "1"}}


def frac(value: object, name: str = "trainer") -> dict[str, Any]:
    return pod(container(name, limits={GPU: value}))


def memreq(value: str, name: str = "trainer") -> dict[str, Any]:
    return pod(container(name, limits={MEM: value}))


def a100_40(**kw: Any) -> dict[str, Any]:
    return mixed_node("a100-40-0", A100_40, dict(A100_40_ALL), "a100-40", 40960, A100_40_USABLE, **kw)


# ---------------------------------------------------------------------------------------------------------------
# Every GPU model in the reference, mixed strategy: (product, GPU MiB, profiles, half by memory, half by compute,
# an eighth, a memory request and what covers it).

MODELS = [
    ("NVIDIA-A30", 24576, ["1g.6gb", "2g.12gb", "4g.24gb"], "2g.12gb", "2g.12gb", "1g.6gb", ("12Gi", "2g.12gb")),
    (A100_40, 40960, list(A100_40_ALL), "3g.20gb", "4g.20gb", "1g.5gb", ("20Gi", "3g.20gb")),
    (
        A100_80,
        81920,
        ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        "3g.40gb",
        "4g.40gb",
        "1g.10gb",
        ("20Gi", "1g.20gb"),
    ),
    (
        H100,
        81559,
        ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"],
        "3g.40gb",
        "4g.40gb",
        "1g.10gb",
        ("40Gi", "3g.40gb"),
    ),
    (
        "NVIDIA-H100-NVL",
        95830,
        ["1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"],
        "3g.47gb",
        "4g.47gb",
        "1g.12gb",
        ("24Gi", "1g.24gb"),
    ),
    (
        "NVIDIA-H20",
        97871,
        ["1g.12gb", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"],
        "3g.48gb",
        "4g.48gb",
        "1g.12gb",
        ("48Gi", "3g.48gb"),
    ),
    (
        "NVIDIA-GH200-144G-HBM3e",
        146000,
        ["1g.18gb", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"],
        "3g.72gb",
        "4g.72gb",
        "1g.18gb",
        ("100Gi", "7g.144gb"),
    ),
    (
        "NVIDIA-H200",
        143771,
        ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"],
        "3g.71gb",
        "4g.71gb",
        "1g.18gb",
        ("35Gi", "1g.35gb"),
    ),
    (
        "NVIDIA-B200",
        183359,
        ["1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"],
        "3g.90gb",
        "4g.90gb",
        "1g.23gb",
        ("23Gi", "1g.23gb"),
    ),
    (
        "NVIDIA-GB200",
        189471,
        ["1g.23gb", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"],
        "3g.93gb",
        "4g.93gb",
        "1g.23gb",
        ("50Gi", "3g.93gb"),
    ),
    (
        "NVIDIA-B300-SXM6-AC",
        275040,
        ["1g.34gb", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"],
        "3g.135gb",
        "4g.135gb",
        "1g.34gb",
        ("135Gi", "3g.135gb"),
    ),
    (
        "NVIDIA-GB300",
        284208,
        ["1g.35gb", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb"],
        "3g.139gb",
        "4g.139gb",
        "1g.35gb",
        ("200Gi", "7g.278gb"),
    ),
    (
        "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
        97887,
        ["1g.24gb", "2g.48gb", "4g.96gb"],
        "2g.48gb",
        "2g.48gb",
        "1g.24gb",
        ("48Gi", "2g.48gb"),
    ),
]


def model_node(product: str, memory: int, profiles: list[str]) -> dict[str, Any]:
    return mixed_node("n0", product, dict.fromkeys(profiles, 1), "pool-0", memory)


@pytest.mark.parametrize("row", MODELS, ids=[r[0] for r in MODELS])
@pytest.mark.parametrize(
    ("ask", "coverage", "pick"),
    [
        pytest.param({GPU: "0.5"}, "memory", 3, id="half-by-memory"),
        pytest.param({GPU: "500m"}, "compute", 4, id="half-by-compute"),
        pytest.param({GPU: "125m"}, "memory", 5, id="an-eighth"),
        pytest.param("memory-request", "memory", 6, id="memory-request"),
    ],
)
def test_every_reference_model_mixed(row, ask, coverage, pick):
    product, memory, profiles = row[0], row[1], row[2]
    if ask == "memory-request":
        ask, expected = {MEM: row[6][0]}, row[6][1]
    else:
        expected = row[pick]
    result = review(pod(container(limits=ask)), [model_node(product, memory, profiles)], settings(coverage=coverage))
    assert result.allowed, result.message
    assert resources_of(result.object) == mig(expected)
    assert mig_annotation(result.object) == (
        f"trainer: {next(f'{k} {v}' for k, v in ask.items())} -> nvidia.com/mig-{expected} ({product}, pool pool-0)"
    )


@pytest.mark.parametrize("row", MODELS, ids=[r[0] for r in MODELS])
def test_every_reference_model_single_strategy(row):
    # Single strategy: each node carries one profile for all its GPUs; the pod gets nvidia.com/gpu: 1 and a
    # nodeSelector on the <product>-MIG-<profile> product. Offer every profile on its own node: the smallest that
    # holds half the memory wins, as with mixed.
    product, _, profiles, half = row[0], row[1], row[2], row[3]
    nodes = [single_node(f"n{i}", product, p, 7, f"pool-{p}") for i, p in enumerate(profiles)]
    result = review(pod(container(limits={GPU: "0.5"})), nodes)
    assert result.allowed, result.message
    assert resources_of(result.object) == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    assert result.object["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == f"{product}-MIG-{half}"


# ---------------------------------------------------------------------------------------------------------------
# Coverage and boundaries on one A100-40GB (reference: "half a GPU" by memory is 3g.20gb, by compute 4g.20gb)


@pytest.mark.parametrize(
    ("value", "coverage", "expected"),
    [
        pytest.param("0.5", "memory", "3g.20gb", id="half-memory"),
        pytest.param("0.5", "compute", "4g.20gb", id="half-compute"),
        pytest.param("0.5", "both", "4g.20gb", id="half-both"),
        pytest.param("0.25", "memory", "1g.10gb", id="quarter-memory-equal-to-2/8"),
        pytest.param("0.25", "compute", "2g.10gb", id="quarter-compute"),
        pytest.param("0.25", "both", "2g.10gb", id="quarter-both"),
        pytest.param("0.125", "memory", "1g.5gb", id="eighth-equal-to-1g.5gb"),
        pytest.param("126m", "memory", "1g.10gb", id="just-above-an-eighth"),
        pytest.param("0.428", "compute", "3g.20gb", id="just-under-3/7"),
        pytest.param("0.43", "compute", "4g.20gb", id="just-above-3/7"),
        pytest.param("0.51", "memory", "7g.40gb", id="just-above-half"),
        pytest.param("999m", "both", "7g.40gb", id="almost-whole"),
        pytest.param(0.5, "memory", "3g.20gb", id="a-number-not-a-string"),
    ],
)
def test_fraction_coverage_and_boundaries(value, coverage, expected):
    result = review(frac(value), [a100_40()], settings(coverage=coverage))
    assert result.allowed, result.message
    assert resources_of(result.object) == mig(expected)


@pytest.mark.parametrize(
    ("value", "expected", "warning"),
    [
        pytest.param("20Gi", "3g.20gb", "19968 MiB usable, less than the 20Gi asked", id="20Gi-is-3g.20gb-not-7g"),
        pytest.param("5Gi", "1g.5gb", "4864 MiB usable", id="equal-to-1g.5gb"),
        pytest.param("4Gi", "1g.5gb", None, id="below-usable"),
        pytest.param("10G", "1g.10gb", None, id="decimal-gigabytes"),
        pytest.param("21G", "3g.20gb", "19968 MiB usable, less than the 20028Mi asked", id="decimal-said-in-whole-MiB"),
        pytest.param("21Gi", "7g.40gb", None, id="above-20"),
        pytest.param("40Gi", "7g.40gb", "40192 MiB usable", id="equal-to-7g.40gb"),
        pytest.param("19968Mi", "3g.20gb", None, id="exactly-usable"),
    ],
)
def test_memory_request_boundaries(value, expected, warning):
    result = review(memreq(value), [a100_40()])
    assert result.allowed, result.message
    assert resources_of(result.object) == mig(expected)
    if warning:
        assert any(warning in w for w in result.warnings), result.warnings
        assert all(len(w) < 120 for w in result.warnings)
    else:
        assert not result.warnings


@pytest.mark.parametrize(
    ("product", "profiles", "value", "expected", "warning"),
    [
        pytest.param(A100_80, {"3g.40gb": 2}, "40Gi", "3g.40gb", "mig-3g.40gb holds about 40 GB", id="a100-80"),
        pytest.param(A100_80, {"3g.40gb": 2}, "37Gi", "3g.40gb", None, id="a100-80-within"),
        pytest.param(A100_80, {"7g.79gb": 1}, "80Gi", "7g.79gb", "mig-7g.79gb holds about 79 GB", id="7g.79gb"),
    ],
)
def test_a_memory_ask_past_a_profile_whose_usable_memory_is_not_known_is_told_so(
    product, profiles, value, expected, warning
):
    """No memory label on the node and no usable figure in the table (A100 80GB, H100): 40Gi on a 3g.40gb and 80Gi
    on a 7g.79gb went unsaid (found by a review of MIG)."""
    result = review(memreq(value), [mixed_node("n0", product, profiles, "a100", 81920)])
    assert result.allowed, result.message
    assert resources_of(result.object) == mig(expected)
    said = [w for w in result.warnings if "GB, less than the" in w]
    assert (warning in said[0]) if warning else not said, result.warnings


@pytest.mark.parametrize(("value", "warned"), [("5Gi", True), ("4Gi", False)])
def test_a_workload_whose_pods_get_less_memory_than_asked_is_told_so(value, warned):
    """A Deployment's gpu-memory 5Gi: its pods got a 1g.5gb of 4864 MiB, said only to each pod, whose warning
    goes to the ReplicaSet controller (a review of real manifests): the template's review says it to whoever
    applies the workload."""
    result = review(workload("Deployment", memreq(value)), [a100_40()])
    assert result.allowed, result.message
    said = [w for w in result.warnings if "its pods' nvidia.com/mig-1g.5gb has 4864 MiB usable" in w]
    assert bool(said) is warned, result.warnings
    assert all(len(w) < 120 for w in result.warnings)


def test_stale_zero_capacity_profiles_are_ignored():
    node = mixed_node("n0", A100_80, {"3g.40gb": 0, "1g.10gb": 0, "7g.80gb": 1}, "a100", 81920)
    result = review(frac("0.25"), [node])
    assert resources_of(result.object) == mig("7g.80gb")


def test_mixed_strategy_without_feature_discovery_is_read_from_the_offered_profiles():
    """Only the device plugin (mixed mode), no GPU feature discovery: no nvidia.com/mig.strategy label, no GPU
    product; the nvidia.com/mig-<profile> resources are what the node offers, and a fraction is turned into one."""
    node = mixed_node("n0", A100_80, {"3g.40gb": 2, "1g.10gb": 1}, "a100")
    labels = node["metadata"]["labels"]
    for key in ("nvidia.com/mig.strategy", "nvidia.com/mig.capable", "nvidia.com/gpu.product"):
        del labels[key]
    result = review(frac("0.25"), [node])
    assert result.allowed, result.message
    assert resources_of(result.object) == mig("3g.40gb")


@pytest.mark.parametrize(
    ("ask", "expected"),
    [
        pytest.param({GPU: "0.9"}, "7g.79gb", id="fraction"),
        pytest.param({MEM: "79Gi"}, "7g.79gb", id="memory-79"),
        pytest.param({MEM: "80Gi"}, "7g.79gb", id="memory-80-is-the-same-row"),
    ],
)
def test_7g_79gb_name_is_taken_from_the_node(ask, expected):
    node = mixed_node("n0", "NVIDIA-A100-80GB-PCIe", {"7g.79gb": 1, "3g.40gb": 2}, "a100", 81920, {"7g.79gb": 80128})
    result = review(pod(container(limits=ask)), [node])
    assert result.allowed, result.message
    assert resources_of(result.object) == mig(expected)


def test_media_extension_variant_is_used_only_when_it_is_the_only_fit():
    node = mixed_node("n0", H100, {"1g.10gb": 1, "1g.10gb.me": 1}, "h100", 81559)
    assert resources_of(review(frac("0.1"), [node]).object) == mig("1g.10gb")
    node = mixed_node("n0", H100, {"1g.10gb.me": 1, "7g.80gb": 1}, "h100", 81559)
    assert resources_of(review(frac("0.1"), [node]).object) == mig("1g.10gb.me")


# ---------------------------------------------------------------------------------------------------------------
# Strategies: single, GKE, declared pools


def test_single_strategy_gives_a_gpu_and_a_product_selector():
    nodes = [
        single_node("s0", A100_40, "1g.5gb", 7, "small", 4864),
        single_node("s1", A100_40, "3g.20gb", 2, "half", 19968),
    ]
    result = review(frac("500m"), nodes)
    assert result.allowed, result.message
    assert resources_of(result.object) == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    assert result.object["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": f"{A100_40}-MIG-3g.20gb"}
    assert mig_annotation(result.object) == (
        f"trainer: nvidia.com/gpu 500m -> nvidia.com/gpu 1 with nodeSelector nvidia.com/gpu.product="
        f"{A100_40}-MIG-3g.20gb ({A100_40}, pool half)"
    )
    small = review(frac("0.1"), nodes)
    assert small.object["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": f"{A100_40}-MIG-1g.5gb"}


def test_single_strategy_gh200_144gb_is_told_from_the_96gb_part_by_its_profile():
    """GH200 is a 96 GB and a 144 GB part, and a single-strategy node reports no memory: its 1g.18gb (an eighth of
    144 GB; NVIDIA's MIG user guide) is a fraction of 0.125, not the quarter it would be of 96 GB."""
    node = single_node("g0", "NVIDIA-GH200-480GB", "1g.18gb", 7, "gh200")
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-GH200-MIG-1g.18gb"
    assert not review(frac("0.25"), [node]).allowed
    result = review(frac("0.1"), [node])
    assert result.allowed and resources_of(result.object)["limits"] == {"nvidia.com/gpu": "1"}


def test_single_strategy_second_container_lands_on_the_same_profile():
    nodes = [single_node("s0", A100_40, "1g.5gb", 7, "small"), single_node("s1", A100_40, "3g.20gb", 2, "half")]
    obj = pod(container("a", limits={GPU: "0.5"}), container("b", limits={GPU: "0.1"}))
    result = review(obj, nodes)
    assert result.allowed, result.message
    assert result.object["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": f"{A100_40}-MIG-3g.20gb"}
    assert resources_of(result.object, "b") == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}


@pytest.mark.parametrize(
    ("nodes", "init"),
    [
        pytest.param(
            [single_node("s", A100_40, "3g.20gb", 4, "a100-single"), whole_node("w", A100_40, 8, "a100-whole")],
            False,
            id="single",
        ),
        pytest.param(
            [gke_node("g", "nvidia-tesla-a100", "3g.20gb", 16, "a100-3g"), whole_node("w", A100_40, 8, "a100-whole")],
            True,
            id="gke-init-container",
        ),
    ],
)
def test_a_whole_gpu_beside_a_fraction_is_never_made_a_mig_slice(nodes, init):
    """Found by the MIG review: under the single strategy and on GKE every nvidia.com/gpu of a MIG node is a MIG
    device, so the pod-wide product (or partition) selector would give container b a slice, not its whole GPU."""
    whole = container("b", limits={GPU: "1"})
    obj = (
        pod(container("a", limits={GPU: "0.5"}), init=[whole])
        if init
        else pod(container("a", limits={GPU: "0.5"}), whole)
    )
    result = review(obj, nodes)
    assert not result.allowed and result.reason == "MIGNoProfile"
    pool = nodes[0]["metadata"]["labels"][POOL]
    b = "init container b" if init else "container b"
    assert f"Pool {pool} (" in result.message
    assert f"{b} (nvidia.com/gpu 1) would get a MIG slice" in result.message
    assert "pod of their own" in result.message
    assert "cannot use (selectors" not in result.message  # the pod's own rules do not keep it off that pool
    # Mixed-strategy nodes offer whole GPUs and MIG devices side by side: there the pod is served.
    mixed = a100_40(gpus=2)
    result = review(obj, [*nodes, mixed])
    assert result.allowed, result.message
    assert resources_of(result.object, "a") == mig("3g.20gb")
    assert resources_of(result.object, "b") == {"limits": {GPU: "1"}}
    assert "nodeSelector" not in result.object["spec"]


def test_a_pod_that_selects_a_single_strategy_product_itself_still_gets_its_fraction_there():
    nodes = [single_node("s", A100_40, "3g.20gb", 4, "a100-single")]
    obj = pod(container("a", limits={GPU: "0.5"}), container("b", limits={GPU: "1"}))
    obj["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": f"{A100_40}-MIG-3g.20gb"}
    result = review(obj, nodes)
    assert result.allowed, result.message
    assert resources_of(result.object, "a") == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}


WHOLE_ON_SLICES = "MIGWholeOnSlices"


def _whole_on_slices(result: pipeline.Result) -> tuple[list[str], list[str]]:
    """The warnings and the Event messages that say a whole-GPU ask may get a MIG slice."""
    warned = [w for w in result.warnings if f"{GPU} is MIG " in w]
    said = [e.message for e in result.outcome.events if e.reason == WHOLE_ON_SLICES]
    return warned, said


@pytest.mark.parametrize(
    ("slices", "profile"),
    [
        pytest.param(single_node("s", A100_40, "1g.5gb", 56, "a100mig", 4864), "1g.5gb", id="single"),
        pytest.param(gke_node("g", "nvidia-tesla-a100", "1g.5gb", 7, "a100mig"), "1g.5gb", id="gke"),
    ],
)
def test_a_whole_gpu_that_may_land_on_a_pool_of_mig_slices_is_told(slices, profile):
    """Found by a review (c10): a pod asking nvidia.com/gpu: 1 beside a single-strategy (or GKE) MIG pool and a pool
    of whole GPUs was admitted without a word, and the scheduler could give it a 1g.5gb slice. It is warned, not
    steered: the pool, the slice and what to change are said; its decision log's reasons name it."""
    whole = whole_node("w", H100, 8, "h100")
    obj = pod(container("main", limits={GPU: "1"}))
    result = review(obj, [slices, whole])
    assert result.allowed, result.message
    assert resources_of(result.object, "main") == {"limits": {GPU: "1"}}  # warned, not steered
    (warned,), (said,) = _whole_on_slices(result)
    assert warned.startswith("mig: main: ") and "pool a100mig" in warned and profile in warned
    assert "select" in warned and "fraction" in warned and len(warned) < 120
    assert "container main (nvidia.com/gpu 1)" in said and f"pool a100mig (MIG {profile})" in said
    assert "pool h100" in said and f"nvidia.com/gpu.product: {H100}" in said  # what selects the whole GPUs
    assert "ask for a fraction" in said
    assert WHOLE_ON_SLICES in result.outcome.reasons
    # a pool whose nodes are groups of their own is named once
    twin = copy.deepcopy(slices)
    twin["metadata"]["name"] = twin["metadata"]["labels"]["kubernetes.io/hostname"] = "s2"
    twin["metadata"]["labels"]["example.com/rack"] = "r2"
    (_,), (said,) = _whole_on_slices(review(pod(container("main", limits={GPU: "1"})), [slices, twin, whole]))
    assert said.count("pool a100mig (") == 1, said
    # a workload's template is told as it is applied; each container is named in the Event, the first in the warning
    template = pod(container("main", limits={GPU: "2"}), init=[container("i", limits={GPU: "1"})])
    (warned,), (said,) = _whole_on_slices(review(workload("Deployment", template), [slices, whole]))
    assert warned.startswith(f"mig: i and 1 more: {GPU} is MIG {profile} on pool a100mig: ")
    assert said.startswith("init container i (nvidia.com/gpu 1), container main (nvidia.com/gpu 2) ask for whole")
    assert "there each gets one such slice per GPU it asks, not whole GPUs" in said, said
    # the pod that selects the whole GPUs, or a cluster of MIG slices alone: nothing to say
    obj["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": H100}
    assert _whole_on_slices(review(obj, [slices, whole])) == ([], [])
    assert _whole_on_slices(review(pod(container("main", limits={GPU: "1"})), [slices])) == ([], [])
    # nor one whose whole GPU is beside a fraction: that pod is kept off such pools already
    mixed = review(
        pod(container("a", limits={GPU: "0.5"}), container("main", limits={GPU: "1"})), [a100_40(gpus=2), slices, whole]
    )
    assert mixed.allowed and _whole_on_slices(mixed) == ([], [])


@pytest.mark.parametrize("key", ["eks.amazonaws.com/nodegroup", "karpenter.sh/nodepool"])
def test_a_whole_gpu_beside_mig_slices_is_told_the_label_of_a_whole_gpu_pool_at_zero(key: str) -> None:
    """Found by a review: where the whole-GPU pool was an EKS nodegroup or a Karpenter NodePool at zero, the Event
    said to select nvidia.com/gpu.product, a GFD label that the node its autoscaler plans lacks: the pod that
    followed it stayed Pending. Its pool's label is named, as for every other pin."""
    slices = single_node("s", A100_40, "1g.5gb", 56, "a100mig", 4864)
    slices["metadata"]["labels"][key] = "a100mig"
    h100 = PoolSettings(name="h100", node_selector={key: "h100"}, gpu_product=H100, gpu_memory_mib=81559, gpu_count=8)
    result = review(pod(container("main", limits={GPU: "1"})), [slices], settings([h100]))
    (_,), (said,) = _whole_on_slices(result)
    assert f"use nodeSelector {key}: h100;" in said, said


def test_a_whole_gpu_beside_slices_of_the_same_model_is_told_to_select_the_pool() -> None:
    """Found by a review: beside a partitioned GKE A100 pool, a pool of whole A100s is told apart by its pool alone,
    yet the warning said 'select the whole-GPU model', which the slices share."""
    whole = gke_node("gw", "nvidia-tesla-a100", "", 8, "a100whole")
    del whole["metadata"]["labels"]["cloud.google.com/gke-gpu-partition-size"]
    slices = gke_node("g", "nvidia-tesla-a100", "1g.5gb", 7, "a100mig")
    (warned,), (said,) = _whole_on_slices(review(pod(container("main", limits={GPU: "1"})), [slices, whole]))
    assert warned.endswith(": select the whole-GPU pool or model, or ask a fraction") and len(warned) < 120, warned
    assert "use nodeSelector cloud.google.com/gke-nodepool: a100whole;" in said, said


def test_a_whole_gpu_beside_slices_is_told_what_each_pool_gives_and_how_many_slices() -> None:
    """Found by a review: a time-sliced pool was said to give whole GPUs, and nvidia.com/gpu: 8 was told it gets
    'that slice' on the MIG pool, where it gets 8 of them."""
    slices = single_node("s", A100_40, "1g.5gb", 56, "a100mig", 4864)
    shared = whole_node("ts", H100, 8, "h100ts", sharing="time-slicing")
    (_,), (said,) = _whole_on_slices(review(pod(container("main", limits={GPU: "8"})), [slices, shared]))
    assert "pool h100ts, where each nvidia.com/gpu is a share of a GPU (time-slicing), and on pool a100mig" in said
    assert "whole GPUs, and on" not in said and "there it gets 8 such slices, not 8 whole GPUs" in said, said
    assert f"To keep it off the MIG slices, use nodeSelector nvidia.com/gpu.product: {H100};" in said
    whole = whole_node("w", H100, 8, "h100")
    (_,), (said,) = _whole_on_slices(review(pod(container("main", limits={GPU: "1"})), [slices, shared, whole]))
    assert "pool h100, which gives whole GPUs, pool h100ts, where each nvidia.com/gpu is a share of a GPU" in said
    assert "there it gets one such slice, not a whole GPU" in said, said


def _on_driver(node: dict[str, Any], version: str) -> dict[str, Any]:
    """``node`` with GFD's full driver version label."""
    node["metadata"]["labels"]["nvidia.com/cuda.driver-version.full"] = version
    return node


def test_a_whole_gpu_steered_by_its_cuda_to_a_pool_of_mig_slices_alone_is_told() -> None:
    """Found by a review: the whole-GPU pool's driver (535: CUDA 12.2) is too old for the image's CUDA 12.4, the MIG
    pool's (550) is not; the cuda policy steered nvidia.com/gpu: 2 to the MIG pool alone, and the pod was admitted
    without a word, to get two 1g.5gb slices. Only MIG pools reach it because of the webhook's own steering, not the
    pod's: it is told, with what gives it whole GPUs again (an older CUDA, or the whole-GPU pool's driver)."""
    slices = _on_driver(single_node("s", A100_40, "1g.5gb", 56, "a100mig", 4864), "550.54.15")
    whole = _on_driver(whole_node("w", H100, 8, "h100whole"), "535.104.05")
    s = replace(settings(), cuda=CudaSettings())
    image = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    for obj in (
        pod(container("main", limits={GPU: "2"}, image=image)),
        workload("Deployment", pod(container("main", limits={GPU: "2"}, image=image))),
    ):
        result = review(obj, [slices, whole], s)
        affinity = json.dumps(template_of(result.object)["spec"].get("affinity"))
        assert result.allowed and '"values": ["a100mig"]' in affinity, (result.message, affinity)  # steered
        (warned,), (said,) = _whole_on_slices(result)
        assert warned.startswith(f"mig: main: {GPU} is MIG 1g.5gb on pool a100mig") and len(warned) < 120, warned
        assert "CUDA" in warned, warned
        assert "container main (nvidia.com/gpu 2)" in said and "2 such slices" in said, said
        assert "only pool a100mig runs its CUDA" in said and "pool h100whole (driver 535.104.05, CUDA 12.2)" in said
        assert "an image for CUDA 12.2 or older" in said and "upgrade the driver of pool h100whole" in said, said
        assert "nodeSelector" not in said, said  # selecting the whole GPUs would be denied: their CUDA is too old
    # the pod that selects the MIG pool itself is not steered there, and has nothing to be told
    own = pod(container("main", limits={GPU: "2"}, image=image))
    own["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": POOL, "operator": "In", "values": ["a100mig"]}]}]
            }
        }
    }
    result = review(own, [slices, whole], s)
    assert result.allowed and result.object["spec"]["affinity"] == own["spec"]["affinity"], result.message
    assert _whole_on_slices(result) == ([], [])


def test_a_whole_gpu_on_mig_slices_by_its_own_affinity_is_not_told_the_steering_keeps_it_there() -> None:
    """Found by a review: the user's own pool selection (two MIG pools, the steering keeping one, too old, out) or
    a cuda line forged to name the steering was taken out with the steering's, and the pod was told the steering
    keeps it off a whole-GPU pool whose driver runs its CUDA ('use an image for CUDA 12.4 or older'): false. Only
    whole-GPU pools its CUDA cannot run on are the steering's doing, and the user's own expressions stay."""
    image = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
    s = replace(settings(), cuda=CudaSettings())
    slices = _on_driver(single_node("s", A100_40, "1g.5gb", 56, "a100mig", 4864), "550.54.15")
    old_slices = _on_driver(single_node("o", A100_40, "1g.5gb", 56, "oldmig", 4864), "535.104.05")

    def on(pools: list[str]) -> dict[str, Any]:
        p = pod(container("main", limits={GPU: "2"}, image=image))
        term = {"matchExpressions": [{"key": POOL, "operator": "In", "values": pools}]}
        p["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
        return p

    new_whole = _on_driver(whole_node("w", H100, 8, "h100whole"), "550.54.15")
    result = review(on(["a100mig", "oldmig"]), [slices, old_slices, new_whole], s)
    line = result.object["metadata"]["annotations"]["gpu-admission.io/cuda"]
    assert cuda.STEERED_OFF + "pool oldmig" in line, line  # the steering took oldmig out, not h100whole
    assert _whole_on_slices(result) == ([], []), result.warnings
    forged = on(["a100mig"])
    forged["metadata"]["annotations"] = {"gpu-admission.io/cuda": f"x; {cuda.STEERED_OFF}pool x"}
    assert _whole_on_slices(review(forged, [slices, new_whole], s)) == ([], [])
    # the user's own expression, in the manifest kubectl applied, stays: the old whole-GPU pool is the user's choice
    old_whole = _on_driver(whole_node("w", H100, 8, "h100whole"), "535.104.05")
    applied = on(["a100mig", "oldmig"])
    applied["metadata"]["annotations"] = {LAST_APPLIED: json.dumps(on(["a100mig", "oldmig"]))}
    assert _whole_on_slices(review(applied, [slices, old_slices, old_whole], s)) == ([], [])


def test_gke_partition_size_selector():
    nodes = [
        gke_node("g0", "nvidia-tesla-a100", "1g.5gb", 7, "mig-small"),
        gke_node("g1", "nvidia-tesla-a100", "3g.20gb", 2, "mig-half"),
    ]
    result = review(frac("0.5"), nodes)
    assert result.allowed, result.message
    assert resources_of(result.object) == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    assert result.object["spec"]["nodeSelector"] == {"cloud.google.com/gke-gpu-partition-size": "3g.20gb"}
    assert "tolerations" not in result.object["spec"]  # ExtendedResourceToleration adds nvidia.com/gpu's
    assert mig_annotation(result.object) == (
        "trainer: nvidia.com/gpu 0.5 -> nvidia.com/gpu 1 with nodeSelector cloud.google.com/gke-gpu-partition-size="
        "3g.20gb (nvidia-tesla-a100, pool mig-half)"
    )


def test_gke_pins_the_accelerator_when_the_partition_name_means_less_elsewhere():
    nodes = [
        gke_node("g0", "nvidia-tesla-a100", "1g.10gb", 4, "a100-40"),
        gke_node("g1", "nvidia-a100-80gb", "1g.10gb", 7, "a100-80"),
    ]
    result = review(frac("0.25"), nodes)  # 1g.10gb is 2/8 of an A100-40GB, 1/8 of an A100-80GB
    assert result.object["spec"]["nodeSelector"] == {
        "cloud.google.com/gke-gpu-partition-size": "1g.10gb",
        "cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
    }


@pytest.mark.parametrize(
    ("ask", "partition"),
    [
        pytest.param("0.25", "1g.24gb", id="quarter"),
        pytest.param("0.5", "2g.48gb", id="half"),
    ],
)
def test_gke_rtx_pro_6000_partitions_are_read_as_quarters(ask, partition):
    # GKE G4 (RTX PRO 6000, accelerator nvidia-rtx-pro-6000): 4 compute slices, 1g.24gb a quarter, 2g.48gb a half.
    # Read off the names as 7-slice profiles, 1g.24gb would be 1/7 of the compute and 2g.48gb 2/7.
    nodes = [
        gke_node("g0", "nvidia-rtx-pro-6000", "1g.24gb", 4, "rtx-quarter"),
        gke_node("g1", "nvidia-rtx-pro-6000", "2g.48gb", 2, "rtx-half"),
        gke_node("g2", "nvidia-rtx-pro-6000", "4g.96gb", 1, "rtx-whole"),
    ]
    result = review(frac(ask), nodes)
    assert result.allowed, result.message
    assert resources_of(result.object) == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    assert result.object["spec"]["nodeSelector"]["cloud.google.com/gke-gpu-partition-size"] == partition


@pytest.mark.parametrize(
    ("product", "memory", "offered", "ask", "expected"),
    [
        pytest.param("NVIDIA-RTX-PRO-5000-Blackwell", 48000, ["1g.24gb", "2g.48gb"], "0.5", "1g.24gb", id="5000"),
        pytest.param("NVIDIA-RTX-PRO-4500-Blackwell", 32000, ["1g.16gb", "2g.32gb"], "0.5", "1g.16gb", id="4500"),
        pytest.param("NVIDIA-RTX-PRO-5000-Blackwell", 48000, ["1g.24gb", "2g.48gb"], "0.6", "2g.48gb", id="0.6"),
        pytest.param(
            "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition", 97000, ["1g.24gb", "2g.48gb"], "0.5", "2g.48gb", id="6000"
        ),
    ],
)
def test_two_slice_rtx_pro_profiles_are_halves(product, memory, offered, ask, expected):
    """RTX PRO 5000 and 4500 Blackwell have two compute slices: 1g.24gb (1g.16gb) is half the GPU there, a quarter
    on RTX PRO 6000 (MIG user guide, supported profiles). Read as 7-slice profiles, 0.5 took the whole GPU."""
    nodes = [mixed_node("r0", product, dict.fromkeys(offered, 2), "rtx", memory)]
    result = review(frac(ask), nodes)
    assert result.allowed, result.message
    assert resources_of(result.object) == mig(expected)


@pytest.mark.parametrize(
    ("strategy", "expected_resources", "expected_selector"),
    [
        pytest.param("mixed", mig("3g.40gb"), None, id="mixed"),
        pytest.param(
            "single",
            {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
            {"pool": "a100", "nvidia.com/gpu.product": f"{A100_80}-MIG-3g.40gb"},
            id="single",
        ),
        pytest.param(
            "gke",
            {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
            {"pool": "a100", "cloud.google.com/gke-gpu-partition-size": "3g.40gb"},
            id="gke",
        ),
    ],
)
def test_declared_pool_without_nodes(strategy, expected_resources, expected_selector):
    pools = [
        PoolSettings(
            name="a100",
            node_selector={"pool": "a100"},
            gpu_product=A100_80,
            mig_strategy=strategy,
            mig_profiles={"3g.40gb": 2},
        )
    ]
    obj = frac("0.5")
    obj["spec"]["nodeSelector"] = {"pool": "a100"}
    result = review(obj, [], settings(pools=pools))
    assert result.allowed, result.message
    assert resources_of(result.object) == expected_resources
    assert result.object["spec"]["nodeSelector"] == (expected_selector or {"pool": "a100"})
    assert "pool a100" in (mig_annotation(result.object) or "")


@pytest.mark.parametrize(
    ("key", "cpu_node_labels"),
    [
        pytest.param("eks.amazonaws.com/nodegroup", {"eks.amazonaws.com/nodegroup": "system"}, id="eks"),
        pytest.param("kubernetes.azure.com/agentpool", {"kubernetes.azure.com/agentpool": "system"}, id="aks"),
    ],
)
def test_a_pool_at_zero_that_an_autoscaler_makes_is_pinned_by_its_own_label(
    key: str, cpu_node_labels: dict[str, str]
) -> None:
    """Cluster Autoscaler builds an EKS or AKS group at zero from its definition, whose template node carries none
    of GFD's labels: a pod pinned by nvidia.com/gpu.product stayed Pending. Pinned by the pool's label, as on GKE."""
    pools = [
        PoolSettings(name=name, node_selector={key: name}, gpu_product=product, gpu_count=1, gpu_memory_mib=memory)
        for name, product, memory in (("a10g", "NVIDIA-A10G", 23028), ("h100", H100, 81559))
    ]
    cpu = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu", "labels": cpu_node_labels}}
    result = review(memreq("60Gi"), [cpu], settings(pools, fallback="whole"))
    assert result.allowed, result.message
    assert result.object["spec"]["nodeSelector"] == {key: "h100"}
    assert f"pinned to {key}=h100" in (mig_annotation(result.object) or "")


@pytest.mark.parametrize("key", ["eks.amazonaws.com/nodegroup", "karpenter.sh/nodepool"])
def test_a_single_strategy_pool_at_zero_that_an_autoscaler_makes_is_pinned_by_its_own_label(key: str) -> None:
    """A single-strategy MIG pool at zero (an EKS node group, a Karpenter NodePool) beside a whole-GPU pool: the pod
    was given nodeSelector nvidia.com/gpu.product=...-MIG-1g.10gb, which the node the autoscaler imagines from the
    pool's definition never carries, and it stayed Pending. Pinned by the pool's label instead, none of GFD's."""
    pools = [
        PoolSettings(
            name="a100-mig",
            node_selector={key: "a100-mig"},
            gpu_product=A100_80,
            gpu_memory_mib=81920,
            gpu_count=8,
            mig_strategy="single",
            mig_profiles={"1g.10gb": 56},
        ),
        PoolSettings(name="h100", node_selector={key: "h100"}, gpu_product=H100, gpu_memory_mib=81559, gpu_count=8),
    ]
    cpu = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "cpu", "labels": {"eks.amazonaws.com/nodegroup": "system"}},
    }
    result, again = mutate_twice(memreq("10Gi"), [cpu], settings(pools, fallback="whole"))
    assert result.allowed, result.message
    assert resources_of(result.object) == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    assert result.object["spec"]["nodeSelector"] == {key: "a100-mig"}
    assert "affinity" not in result.object["spec"]
    assert f"pinned to {key}=a100-mig" in (mig_annotation(result.object) or "")
    assert again == []


@pytest.mark.parametrize("key", ["eks.amazonaws.com/nodegroup", "karpenter.sh/nodepool"])
def test_a_single_strategy_pool_at_zero_beside_cpu_nodes_alone_is_pinned_by_its_own_label(key: str) -> None:
    """The same pool at zero where the cluster otherwise has CPU nodes only: with no other GPU pool to fence off,
    the pod was given nvidia.com/gpu 1 with no pin at all, and any GPU node (a whole GPU an autoscaler brings up for
    another NodePool) could take it. Pinned by the pool's label, as beside a whole-GPU pool."""
    pool = a100_mig_pool(key)
    cpu = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu", "labels": {key: "system"}}}
    result, again = mutate_twice(frac("0.4"), [cpu], settings([pool]))
    assert result.allowed, result.message
    assert resources_of(result.object) == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    assert result.object["spec"]["nodeSelector"] == {key: "a100-mig"}
    assert mig_annotation(result.object) == (
        f"trainer: nvidia.com/gpu 0.4 -> nvidia.com/gpu 1 (MIG 3g.40gb, pinned to {key}=a100-mig, {A100_80}, pool"
        " a100-mig)"
    )
    assert again == []


@pytest.mark.parametrize(
    ("key", "running", "expected"),
    [
        pytest.param(
            "eks.amazonaws.com/nodegroup",
            False,
            [
                "mig: pool a100-mig at zero needs ASG tag k8s.io/cluster-autoscaler/node-template/resources/"
                "nvidia.com/mig-3g.40gb=16"
            ],
            id="eks-at-zero",
        ),
        pytest.param("eks.amazonaws.com/nodegroup", True, [], id="eks-a-node-offers-it"),
        pytest.param("cloud.google.com/gke-nodepool", False, [], id="not-an-asg"),
    ],
)
def test_a_mixed_pool_at_zero_on_an_asg_is_told_the_tag_cluster_autoscaler_needs(
    key: str, running: bool, expected: list[str]
) -> None:
    """Cluster Autoscaler's template node for an EKS group at zero has only the extended resources its ASG's
    node-template/resources tags name: a pod given nvidia.com/mig-3g.40gb of a mixed pool at zero stayed Pending,
    and nothing said why. The tag to set is said, once for the pod."""
    pool = a100_mig_pool(key, "mixed")
    nodes = [mixed_node("a100-0", A100_80, {"3g.40gb": 2}, "a100-run", 81920)] if running else []
    two = pod(container("a", limits={GPU: "0.4"}), container("b", limits={GPU: "0.4"}))
    result = review(two, nodes, settings([pool]))
    assert result.allowed, result.message
    assert resources_of(result.object, "b") == mig("3g.40gb")
    assert result.warnings == expected


def _eks_mixed_pool(name: str) -> PoolSettings:
    return PoolSettings(
        name=name,
        node_selector={"eks.amazonaws.com/nodegroup": name},
        gpu_product=A100_80,
        gpu_memory_mib=81920,
        gpu_count=8,
        mig_strategy="mixed",
        mig_profiles={"3g.40gb": 16},
    )


TAG = "k8s.io/cluster-autoscaler/node-template/resources/nvidia.com/mig-3g.40gb=16"


@pytest.mark.parametrize(
    "template",
    [
        pytest.param(pod(container(limits={MEM: "30Gi"})), id="gpu-memory"),
        pytest.param(pod(container(), annotations={"gpu-admission.io/gpu-fraction": "0.4"}), id="fraction-annotation"),
    ],
)
def test_the_pods_of_a_workload_converted_for_a_pool_at_zero_on_an_asg_get_the_tag_in_an_event(
    template: dict[str, Any],
) -> None:
    """A gpu-memory ask or a fraction annotation is converted on each pod its controller creates: the ASG tag that
    Cluster Autoscaler needs to scale the pool up was said only in the pod's warning, which only the controller
    gets. Each pod gets a Warning Event naming the pool and the tag with its value, the same for every pod."""
    s = settings([_eks_mixed_pool("a100-mig")])
    cpu = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "c", "labels": {"eks.amazonaws.com/nodegroup": "s"}},
    }
    live = through_app(workload("Deployment", template), [cpu], s).object
    made = [_pod_of(live) for _ in range(2)]
    made[1]["metadata"]["name"] = "trainer-2"
    events = [[e for e in through_app(p, [cpu], s).events if e.reason == "MIGUntagged"] for p in made]
    (first,), (second,) = events
    assert first == second and first.type == "Warning"
    assert "pool a100-mig at zero offers it" in first.message and f"(pool a100-mig: {TAG})" in first.message


def test_the_asg_tag_warning_and_event_name_long_pools_whole() -> None:
    """A long pool's name was cut to 13 characters in the warning, two were only counted: the warning keeps one
    pool's name whole (its fixed words shortened, the tag left to the Event), the Event names every pool whole."""
    long = "gpu-a100-mig-mixed-us-east-1a-production-nodegroup-2024-v2"
    alone = through_app(frac("0.4"), [], settings([_eks_mixed_pool(long)]))
    assert alone.warnings == [f"mig: pool {long} at zero: ASG tag needed (MIGUntagged Event)"]
    other = long.replace("1a", "1b")
    two = through_app(frac("0.4"), [], settings([_eks_mixed_pool(long), _eks_mixed_pool(other)]))
    (event,) = [e for e in two.events if e.reason == "MIGUntagged"]
    assert f"(pools {long}, {other}: {TAG})" in event.message


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(pod(container(limits={"nvidia.com/mig-3g.40gb": "1"})), id="mig-device"),
        pytest.param(frac("0.4"), id="fraction"),
    ],
)
def test_no_asg_tag_is_asked_where_a_karpenter_pool_at_zero_offers_the_device_too(obj: dict[str, Any]) -> None:
    """An EKS nodegroup and a Karpenter NodePool at zero both offer the MIG device: Karpenter needs no ASG tag and
    gives the pod a node, and the pod was told, in a warning and a MIGUntagged Event, it stays Pending without the
    tag on the nodegroup's Auto Scaling group."""
    karpenter = replace(_eks_mixed_pool("a100-kp"), node_selector={"karpenter.sh/nodepool": "a100-kp"})
    cpu = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "c", "labels": {"eks.amazonaws.com/nodegroup": "s"}},
    }
    answered = through_app(obj, [cpu], settings([_eks_mixed_pool("a100-eks"), karpenter]))
    assert resources_of(answered.object)["limits"] == {"nvidia.com/mig-3g.40gb": "1"}
    assert [w for w in answered.warnings if "ASG tag" in w] == []
    assert [e.message for e in answered.events if e.reason == "MIGUntagged"] == []


def test_single_strategy_pools_at_zero_under_different_pool_labels_are_not_pinned_by_gfd_product() -> None:
    """An EKS nodegroup and a Karpenter NodePool, both single-strategy A100-80GB pools at zero, beside a CPU node:
    no one pool label holds both, and the pod was pinned by nvidia.com/gpu.product, which neither autoscaler's
    template node carries: it was never given a node. Left unpinned, as with nothing to fence off before."""
    answered = through_app(frac("0.4"), [_EKS_CPU], settings(_EKS_AND_KARPENTER))
    assert resources_of(answered.object) == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    assert "nodeSelector" not in answered.object["spec"] and "affinity" not in answered.object["spec"]
    assert mig_annotation(answered.object) == (
        f"trainer: nvidia.com/gpu 0.4 -> nvidia.com/gpu 1 (MIG 3g.40gb, {A100_80}, pools a100-eks, a100-kp)"
    )


def _single_pool(name: str, key: str, profiles: dict[str, int]) -> PoolSettings:
    return PoolSettings(
        name=name,
        node_selector={key: name},
        gpu_product=A100_80,
        gpu_memory_mib=81920,
        gpu_count=8,
        mig_strategy="single",
        mig_profiles=profiles,
    )


EKS = "eks.amazonaws.com/nodegroup"
_EKS_AND_KARPENTER = [
    _single_pool("a100-eks", EKS, {"3g.40gb": 16}),
    _single_pool("a100-kp", "karpenter.sh/nodepool", {"3g.40gb": 16}),
]
_EKS_CPU = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu", "labels": {EKS: "system"}}}


@pytest.mark.parametrize(
    ("fence", "nodes", "obj", "asked"),
    [
        pytest.param([], [whole_node("w1", A100_80, 8, "whole")], frac("0.4"), f"{GPU} 0.4", id="running-whole-node"),
        pytest.param(
            [_single_pool("small-eks", EKS, {"1g.10gb": 56})],
            [],
            pod(container(limits={MEM: "30Gi"})),
            f"{MEM} 30Gi",
            id="smaller-pool-at-zero",
        ),
    ],
)
def test_single_strategy_pools_at_zero_under_different_labels_beside_a_group_to_fence_off_pin_one_label(
    fence: list[PoolSettings], nodes: list[dict[str, Any]], obj: dict[str, Any], asked: str
) -> None:
    """An EKS nodegroup and a Karpenter NodePool at zero, both offering 3g.40gb, beside a GPU group the pod must be
    kept off: no one label holds both pools, and the pod was refused (MIGNoProfile) as if no pool offered a profile
    that covers it, naming the 3g.40gb that does. It is pinned to the pools of the label that keeps it off the other
    group, and its line names only those."""
    answered = through_app(obj, [_EKS_CPU, *nodes], settings([*_EKS_AND_KARPENTER, *fence]))
    assert resources_of(answered.object)["limits"] == {GPU: "1"}
    assert answered.object["spec"]["nodeSelector"] == {EKS: "a100-eks"}
    assert mig_annotation(answered.object) == (
        f"trainer: {asked} -> nvidia.com/gpu 1 (MIG 3g.40gb, pinned to {EKS}=a100-eks, {A100_80}, pool a100-eks)"
    )


@pytest.mark.parametrize(
    ("eks", "image"),
    [
        pytest.param({"driver_version": "535.183.01"}, "nvcr.io/nvidia/pytorch:24.05-py3", id="driver-too-old"),
        pytest.param({"spot": True}, "", id="spot-alone"),
    ],
)
def test_pools_at_zero_under_different_labels_are_pinned_to_the_one_that_serves_the_pod(
    eks: dict[str, Any], image: str
) -> None:
    """Where the pod is pinned to the pools of one label, the label listed first was taken on a tie: the pod went to
    the EKS pool whose driver is too old for its CUDA (then refused by the cuda policy), or to the EKS pool of spot
    capacity it did not ask for, beside the Karpenter pool that served it (found by a review)."""
    pools = [replace(_EKS_AND_KARPENTER[0], **eks), replace(_EKS_AND_KARPENTER[1], driver_version="560.35.03")]
    obj = frac("0.4")
    if image:
        obj["spec"]["containers"][0]["image"] = image
    checked = replace(settings(pools), cuda=CudaSettings(mode="enforce"))
    answered = through_app(obj, [_EKS_CPU, whole_node("w1", A100_80, 8, "whole")], checked)
    assert answered.object["spec"]["nodeSelector"] == {"karpenter.sh/nodepool": "a100-kp"}


def _one_nodepool_pools() -> list[PoolSettings]:
    """Two single-strategy pools of one Karpenter NodePool at zero, told apart by instance type alone."""
    kp, it = "karpenter.sh/nodepool", "node.kubernetes.io/instance-type"
    return [
        replace(_single_pool(name, kp, profiles), node_selector={kp: "gpu", it: instance})
        for name, instance, profiles in (
            ("a100-kp", "p4d.24xlarge", {"3g.40gb": 16}),
            ("small-kp", "p4de.24xlarge", {"1g.10gb": 56}),
        )
    ]


def test_pools_at_zero_that_no_label_pins_off_a_group_to_avoid_are_named_in_the_refusal() -> None:
    """Two pools of one Karpenter NodePool at zero, told apart by instance type alone: a100-kp offers 3g.40gb,
    small-kp only 1g.10gb. Every label the webhook pins by names both, and the pod was refused saying no eligible
    node offers a profile that covers it, which a100-kp does (a Deployment's gpu-memory ask, to ask for less than
    the 3g.40gb that holds it). It is told which pool offers it, why the pod cannot be pinned there, and what to
    change; the nodeSelector it is told of converts it."""
    kp, it = "karpenter.sh/nodepool", "node.kubernetes.io/instance-type"
    pools = _one_nodepool_pools()
    result = review(frac("0.4"), [_EKS_CPU], settings(pools))
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert "no eligible node offers" not in result.message
    assert (
        "pool a100-kp offers MIG 3g.40gb, which covers it, but the pod cannot be pinned to it: every label the"
        f" webhook pins a pod by that its nodes carry ({kp}=gpu) names pool small-kp too" in result.message
    )
    assert f"a nodeSelector that only its nodes match ({it}, say)" in result.message
    deployment = review(workload("Deployment", memreq("30Gi")), [_EKS_CPU], settings(pools))
    assert f"{MEM} 30Gi: no label pins them to pool a100-kp off other pools, so its pods are refused" in " ".join(
        deployment.warnings
    )
    answered = through_app(
        pod(container(limits={GPU: "0.4"}), nodeSelector={it: "p4d.24xlarge"}), [_EKS_CPU], settings(pools)
    )
    assert resources_of(answered.object)["limits"] == {GPU: "1"}
    assert "MIG 3g.40gb" in str(mig_annotation(answered.object))


@pytest.mark.parametrize("fallback", ["deny", "whole"])
@pytest.mark.parametrize("ask", [frac("0.4"), memreq("30Gi")], ids=["fraction", "memory"])
def test_pools_at_zero_that_no_label_pins_offering_no_whole_gpu_are_not_told_to_ask_for_one(
    ask: dict[str, Any], fallback: str
) -> None:
    """The refusal where no label pins the pod to the pool that offers its profile told it to ask for a whole GPU
    (nvidia.com/gpu: 1), though every pool it reaches gives its GPUs as MIG devices (single strategy): asked so, it
    got a MIG slice, 1g.10gb of small-kp as likely as not (a review of MIG). The advice is left out."""
    result = review(ask, [_EKS_CPU], settings(_one_nodepool_pools(), fallback=fallback))
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert "pool a100-kp offers MIG 3g.40gb, which covers it, but the pod cannot be pinned to it" in result.message
    assert (
        "Give that pool a pool label of its own (a NodePool or node group of its own), or add to the pod a"
        " nodeSelector that only its nodes match (node.kubernetes.io/instance-type, say)." in result.message
    )
    assert "whole GPU" not in result.message


def _mixed_nodepool_pools() -> list[PoolSettings]:
    """Two mixed-strategy pools of one Karpenter NodePool at zero, told apart by instance type alone: the
    A100-40GB's 1g.10gb holds 2/8 of its memory, the A100-80GB's 1/8."""
    kp, it = "karpenter.sh/nodepool", "node.kubernetes.io/instance-type"
    return [
        PoolSettings(
            name=name,
            node_selector={kp: "gpu", it: instance},
            gpu_product=product,
            gpu_memory_mib=memory,
            gpu_count=8,
            mig_strategy="mixed",
            mig_profiles={"1g.10gb": count},
        )
        for name, instance, product, memory, count in (
            ("a40-kp", "p4d.24xlarge", A100_40, 40960, 32),
            ("a80-kp", "p4de.24xlarge", A100_80, 81920, 56),
        )
    ]


def _changing_layout() -> dict[str, Any]:
    """An A100-80GB node MIG Manager is giving the all-3g.40gb layout (pending): none of its devices offered yet."""
    extra = {"nvidia.com/mig.config": "all-3g.40gb", "nvidia.com/mig.config.state": "pending"}
    return mixed_node("m", A100_80, {"3g.40gb": 0}, "a100", 81920, extra_labels=extra)


@pytest.mark.parametrize(
    ("pools", "node", "obj", "fact"),
    [
        pytest.param(
            _one_nodepool_pools(),
            _changing_layout(),
            frac("0.4"),
            " The MIG layout of pool a100 (nvidia.com/mig.config=all-3g.40gb, pending) is changing: its MIG devices are"
            " offered again once MIG Manager has applied it.",
            id="layout-changing",
        ),
        pytest.param(
            _mixed_nodepool_pools(),
            mixed_node("m", A100_40, {"1g.10gb": 1}, "small", 40960),
            pod(container("a", limits={GPU: "0.2"}), container("b", limits={"nvidia.com/mig-1g.10gb": "1"})),
            " Pool small offers 1g.10gb, 1 a node, but with its other containers, this pod would need 2"
            " nvidia.com/mig-1g.10gb on one node.",
            id="too-few-for-its-other-containers",
        ),
    ],
)
def test_the_refusal_where_no_label_pins_the_pod_still_says_what_else_keeps_it_from_a_profile(
    pools: list[PoolSettings], node: dict[str, Any], obj: dict[str, Any], fact: str
) -> None:
    """Where no label pins the pod to the pools at zero that offer a covering profile, the refusal said only that:
    a pool whose MIG layout is changing, or one with too few devices a node for the pod's other containers, which the
    refusal says elsewhere, went unsaid (a review of MIG). Said after why the pod cannot be pinned, before what to
    change."""
    result = review(obj, [_EKS_CPU, node], settings(pools))
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert (
        f"but the pod cannot be pinned to it: every label the webhook pins a pod by that its nodes carry"
        f" (karpenter.sh/nodepool=gpu) names pool {pools[1].name} too, where it would get another device or none.{fact}"
        " Give that pool a pool label of its own" in result.message
    ), result.message


def test_the_whole_fallback_for_pools_at_zero_under_different_labels_pins_one_label() -> None:
    """The whole fallback for whole-GPU pools at zero under an EKS and a Karpenter label, beside a single-strategy
    EKS pool of smaller profiles it must be kept off: no one label holds both whole pools, and the pod was refused,
    the fallback said to find no GPU. It is pinned to the whole pool of the label that keeps it off the MIG pool."""
    whole = [
        replace(p, name=f"{p.name}-w", node_selector={k: f"{v}-w" for k, v in p.node_selector.items()})
        for p in _EKS_AND_KARPENTER
    ]
    whole = [replace(p, mig_strategy="none", mig_profiles={}) for p in whole]
    s = settings([*whole, _single_pool("small-eks", EKS, {"1g.10gb": 56})], fallback="whole")
    answered = through_app(frac("0.4"), [_EKS_CPU], s)
    assert answered.object["spec"]["nodeSelector"] == {EKS: "a100-eks-w"}
    assert mig_annotation(answered.object) == (
        "trainer: nvidia.com/gpu 0.4 -> nvidia.com/gpu 1 (whole GPU: no MIG profile covers it,"
        f" pinned to {EKS}=a100-eks-w, {A100_80}, pool a100-eks-w)"
    )


# ---------------------------------------------------------------------------------------------------------------
# Several GPU models: deterministic choice, pinning only when the profile alone does not say enough


CUDA_124_IMAGE = "nvidia/cuda:12.4.1-runtime-ubuntu22.04"
A100_80_ALL = {"1g.10gb": 7, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}


def driver(version: str) -> dict[str, str]:
    return {"nvidia.com/cuda.driver-version.full": version}


@pytest.mark.parametrize(
    ("mode", "new_profiles", "allowed", "expected"),
    [
        pytest.param("enforce", A100_80_ALL, True, "3g.40gb", id="enforce-prefers-the-new-driver"),
        pytest.param("warn", A100_80_ALL, True, "3g.20gb", id="warn-keeps-the-smallest"),
        pytest.param("enforce", {"1g.10gb": 7}, False, "3g.20gb", id="nothing-fits-there-cuda-denies"),
    ],
)
def test_profile_is_chosen_where_the_driver_runs_the_pods_cuda(mode, new_profiles, allowed, expected):
    """Found by the MIG review: 3g.20gb (smallest) is only on a pool whose driver is too old for CUDA 12.4, while
    3g.40gb on a pool with a new enough driver fits; the pod was denied by the cuda policy."""
    nodes = [
        mixed_node("old-0", A100_40, dict(A100_40_ALL), "a100-old", 40960, extra_labels=driver("525.105.17")),
        mixed_node("new-0", A100_80, new_profiles, "a100-new", 81920, extra_labels=driver("550.54.15")),
    ]
    s = replace(settings(), cuda=CudaSettings(mode=mode))
    obj = pod(container(limits={GPU: "0.5"}, image=CUDA_124_IMAGE))
    mutated = pipeline.mutate(copy.deepcopy(obj), context(nodes, s))
    assert resources_of(mutated.object)["limits"] == {f"nvidia.com/mig-{expected}": "1"}
    result = review(obj, nodes, s)
    assert result.allowed is allowed, result.message
    if not allowed:
        assert result.reason == "CUDAIncompatible" and "pool a100-old" in result.message


def test_smallest_gpu_wins_across_models():
    nodes = [a100_40(), mixed_node("h0", H100, {"3g.40gb": 2}, "h100", 81559)]
    result = review(frac("0.5"), nodes)
    assert resources_of(result.object) == mig("3g.20gb")
    assert "nodeSelector" not in result.object["spec"]  # only A100-40GB offers 3g.20gb


def test_pins_the_model_when_a_profile_name_covers_less_on_another_gpu():
    nodes = [
        mixed_node("a0", A100_40, {"1g.10gb": 4}, "a100-40", 40960),
        mixed_node("a1", A100_80, {"1g.10gb": 7}, "a100-80", 81920),
    ]
    result = review(frac("0.25"), nodes)
    assert resources_of(result.object) == mig("1g.10gb")
    assert result.object["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": A100_40}
    assert (
        mig_annotation(result.object)
        == f"trainer: nvidia.com/gpu 0.25 -> nvidia.com/mig-1g.10gb (pinned to nvidia.com/gpu.product={A100_40}, "
        f"{A100_40}, pool a100-40)"
    )


def test_pins_several_products_with_required_affinity():
    nodes = [
        mixed_node("a0", A100_80, {"1g.20gb": 4, "1g.10gb": 7}, "sxm", 81920),
        mixed_node("a1", "NVIDIA-A100-80GB-PCIe", {"1g.20gb": 4}, "pcie", 81920),
        mixed_node("a2", A100_40, {"1g.20gb": 0, "1g.10gb": 4}, "a100-40", 40960),
    ]
    # 0.2: 1g.10gb covers on A100-40GB (2/8) only; 1g.10gb is also on A100-80GB: pin to A100-40GB.
    result = review(frac("0.2"), nodes)
    assert result.object["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": A100_40}
    # A profile both A100-80GB products offer with the same share needs no pin and names both.
    result = review(frac("0.25"), nodes[:2])
    assert resources_of(result.object) == mig("1g.20gb")
    assert "nodeSelector" not in result.object["spec"] and "affinity" not in result.object["spec"]
    assert mig_annotation(result.object) == (
        f"trainer: nvidia.com/gpu 0.25 -> nvidia.com/mig-1g.20gb (NVIDIA-A100-80GB-PCIe, pool pcie or {A100_80}, "
        f"pool sxm)"
    )


def test_affinity_pin_for_two_products():
    nodes = [
        mixed_node("a0", A100_40, {"1g.10gb": 4}, "p1", 40960),
        mixed_node("a1", "NVIDIA-A100-PCIE-40GB", {"1g.10gb": 4}, "p2", 40960),
        mixed_node("a2", A100_80, {"1g.10gb": 7}, "p3", 81920),
    ]
    result = review(frac("0.25"), nodes)
    terms = result.object["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-A100-PCIE-40GB", A100_40]}
            ]
        }
    ]


def test_user_selector_narrows_the_choice():
    nodes = [a100_40(), mixed_node("h0", H100, {"3g.40gb": 2}, "h100", 81559)]
    obj = frac("0.5")
    obj["spec"]["nodeSelector"] = {"cloud.google.com/gke-nodepool": "h100"}
    result = review(obj, nodes)
    assert resources_of(result.object) == mig("3g.40gb")


def test_tainted_pool_needs_a_toleration():
    taint = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    nodes = [
        mixed_node("a0", A100_40, {"3g.20gb": 2}, "tainted", 40960, taints=taint),
        mixed_node("h0", H100, {"3g.40gb": 2}, "h100", 81559),
    ]
    assert resources_of(review(frac("0.5"), nodes).object) == mig("3g.40gb")
    obj = frac("0.5")
    obj["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists"}]
    assert resources_of(review(obj, nodes).object) == mig("3g.20gb")


def test_mig_resource_taint_is_tolerated_by_extended_resource_toleration():
    taint = [{"key": "nvidia.com/mig-3g.20gb", "effect": "NoSchedule"}]
    nodes = [mixed_node("a0", A100_40, {"3g.20gb": 2}, "a100", 40960, taints=taint)]
    result = review(frac("0.5"), nodes)
    assert resources_of(result.object) == mig("3g.20gb")
    assert "tolerations" not in result.object["spec"]


@pytest.mark.parametrize("strategy", ["single", "mixed"])
def test_a_tainted_mig_pool_gets_its_toleration_where_no_plugin_gives_it(strategy: str) -> None:
    """Without ExtendedResourceToleration (k3s), a single-strategy pool's nvidia.com/gpu was taken as tolerated by
    it: the fraction was refused as out of reach ('its node affinity', of a pod with none) while a mixed pool's MIG
    device got the toleration (found by a review of this session's commits)."""
    from webhook.config import ClusterSettings, Settings

    if strategy == "single":
        node = single_node("box", A100_40, "3g.20gb", 4, "a100", 20096)
    else:
        node = mixed_node("box", A100_40, {"3g.20gb": 2}, "a100", 40960)
    node["spec"]["taints"] = [{"key": GPU, "value": "present", "effect": "NoSchedule"}]
    off = Settings(cluster=ClusterSettings(extended_resource_toleration="off"))
    result = review(frac("0.5"), [node], off)
    assert result.allowed, result.message
    assert result.object["spec"]["tolerations"] == [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
    view = context([node], off).cluster
    assert [c.nodes for c in view.eligible(result.object["spec"], set(resources_of(result.object)["limits"]))] == [
        ("box",)
    ]
    on = review(frac("0.5"), [node], Settings(cluster=ClusterSettings(extended_resource_toleration="on")))
    assert ("tolerations" in on.object["spec"]) is (strategy == "mixed")  # the plugin tolerates nvidia.com/gpu


# ---------------------------------------------------------------------------------------------------------------
# Containers: each on its own; init containers; whole numbers untouched


def test_multi_container_and_init_containers():
    obj = pod(
        container("trainer", limits={GPU: "0.5"}, requests={GPU: "500m"}),
        container("sidecar"),
        container("whole", limits={GPU: "1"}),
        container("embed", limits={MEM: "20Gi"}),
        init=[container("warmup", limits={GPU: "0.25"})],
    )
    node = mixed_node("n0", A100_80, {"1g.10gb": 7, "1g.20gb": 4, "3g.40gb": 2}, "a100", 81920, gpus=2)
    result = review(obj, [node])
    assert result.allowed, result.message
    assert resources_of(result.object, "trainer") == mig("3g.40gb")
    assert resources_of(result.object, "warmup") == mig("1g.20gb")
    assert resources_of(result.object, "embed") == mig("1g.20gb")
    assert resources_of(result.object, "whole") == {"limits": {GPU: "1"}}
    assert "resources" not in next(c for c in result.object["spec"]["containers"] if c["name"] == "sidecar")
    assert mig_annotation(result.object) == "; ".join(
        [
            f"warmup: nvidia.com/gpu 0.25 -> nvidia.com/mig-1g.20gb ({A100_80}, pool a100)",
            f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.40gb ({A100_80}, pool a100)",
            f"embed: gpu-admission.io/gpu-memory 20Gi -> nvidia.com/mig-1g.20gb ({A100_80}, pool a100)",
        ]
    )


def test_containers_must_fit_on_one_node():
    # The whole GPU of the other container is only on the A100-80GB node, so the fraction goes there too.
    nodes = [a100_40(), mixed_node("n1", A100_80, {"3g.40gb": 2}, "a100-80", 81920, gpus=4)]
    obj = pod(container("whole", limits={GPU: "1"}), container("trainer", limits={GPU: "0.5"}))
    assert resources_of(review(obj, nodes).object) == mig("3g.40gb")


def test_other_resource_keys_are_kept():
    obj = pod(container(limits={GPU: "0.5", "cpu": "2", "memory": "8Gi"}, requests={"cpu": "1", GPU: "0.5"}))
    result = review(obj, [a100_40()])
    assert resources_of(result.object) == {
        "limits": {"cpu": "2", "memory": "8Gi", "nvidia.com/mig-3g.20gb": "1"},
        "requests": {"cpu": "1", "nvidia.com/mig-3g.20gb": "1"},
    }


@pytest.mark.parametrize(
    "limits",
    [
        pytest.param({GPU: "1"}, id="one"),
        pytest.param({GPU: 2}, id="two-as-number"),
        pytest.param({GPU: "1.0"}, id="one-point-zero"),
        pytest.param({GPU: "0"}, id="zero"),
        pytest.param({"nvidia.com/mig-3g.20gb": "1"}, id="mig-asked-directly"),
        pytest.param({"cpu": "500m"}, id="no-gpu"),
    ],
)
def test_whole_numbers_and_direct_mig_requests_are_untouched(limits):
    obj = pod(container(limits=limits))
    result = review(obj, [a100_40(gpus=2), whole_node("w", A100_80, 8, "whole")])
    assert result.allowed, result.message
    assert result.patch == []


# ---------------------------------------------------------------------------------------------------------------
# The annotation syntax


@pytest.mark.parametrize(
    ("annotations", "target"),
    [
        pytest.param({"gpu-admission.io/gpu-fraction": "0.5"}, "first", id="first-container"),
        pytest.param(
            {"gpu-admission.io/gpu-fraction": "500m", "gpu-admission.io/gpu-fraction-container": "second"},
            "second",
            id="named-container",
        ),
    ],
)
def test_fraction_annotation(annotations, target):
    obj = pod(container("first"), container("second"), annotations=annotations)
    result = review(obj, [a100_40()])
    assert result.allowed, result.message
    assert resources_of(result.object, target) == mig("3g.20gb")
    value = annotations["gpu-admission.io/gpu-fraction"]
    assert mig_annotation(result.object) == (
        f"{target}: gpu-admission.io/gpu-fraction {value} -> nvidia.com/mig-3g.20gb ({A100_40}, pool a100-40)"
    )


# ---------------------------------------------------------------------------------------------------------------
# Workload kinds: a fraction in the template is converted (Kubernetes would reject it there); the memory resource
# and the annotation leave templates unchanged.


@pytest.mark.parametrize("kind", sorted(WORKLOAD_FILES))
def test_workload_template_fraction_is_converted(kind):
    obj = workload(kind, frac("0.5"))
    result = review(obj, [a100_40()])
    assert result.allowed, result.message
    assert resources_of(result.object) == mig_limits("3g.20gb")
    assert (
        mig_annotation(result.object)
        == f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb ({A100_40}, pool a100-40)"
    )
    assert template_of(result.object)["metadata"]["annotations"]["annotationsKey"] == "annotationsValue"
    # A pod made from the converted template arrives converted and passes unchanged.
    template = template_of(result.object)
    made = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": copy.deepcopy(template["metadata"]),
        "spec": copy.deepcopy(template["spec"]),
    }
    made["metadata"]["namespace"] = "ml"
    assert pipeline.mutate(made, context([a100_40()])).patch == []


@pytest.mark.parametrize("kind", sorted(WORKLOAD_FILES))
@pytest.mark.parametrize(
    "template",
    [
        pytest.param(memreq("20Gi"), id="memory"),
        pytest.param(pod(container(), annotations={"gpu-admission.io/gpu-fraction": "0.5"}), id="annotation"),
    ],
)
def test_workload_template_memory_and_annotation_stay(kind, template):
    obj = workload(kind, template)
    result = review(obj, [a100_40()])
    assert result.allowed, result.message
    assert result.patch == []
    # ... and the pods made from it are converted when they are created.
    made = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": copy.deepcopy(template_of(obj)["metadata"]),
        "spec": copy.deepcopy(template_of(obj)["spec"]),
    }
    made["metadata"]["namespace"] = "ml"
    assert resources_of(review(made, [a100_40()]).object) == mig("3g.20gb")


DAEMON_NODES = [
    mixed_node("n1", A100_40, {"3g.20gb": 2, "1g.10gb": 4}, "a100-40", 40960),
    mixed_node("n2", A100_80, {"3g.40gb": 2, "1g.10gb": 7}, "a100-80", 81920),
]


@pytest.mark.parametrize(
    ("ask", "line", "selector", "warning"),
    [
        pytest.param(
            "0.5",
            f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb ({A100_40}, pool a100-40, its pods on pool "
            "a100-80 stay Pending)",
            None,
            "mig: DaemonSet pods Pending on pool a100-80 (no such device): use annotation "
            "gpu-admission.io/gpu-fraction",
            id="pending",
        ),
        pytest.param(
            "0.25",
            f"trainer: nvidia.com/gpu 0.25 -> nvidia.com/mig-1g.10gb (pinned to nvidia.com/gpu.product={A100_40}, "
            f"{A100_40}, pool a100-40)",
            {"nvidia.com/gpu.product": A100_40},
            "mig: no DaemonSet pod on pool a100-80 (pinned off): use annotation gpu-admission.io/gpu-fraction",
            id="pinned-off",
        ),
    ],
)
def test_a_daemonset_template_converted_for_one_gpu_model_says_where_its_pods_get_no_device(
    ask, line, selector, warning
):
    """A DaemonSet makes a pod for every node it selects, whatever its template asks: converted to the A100-40GB's
    3g.20gb, its pods on the A100-80GB nodes (3g.40gb) stayed Pending, and pinned to the A100-40GB (1g.10gb is 1/8
    of an A100-80GB), it ran on no A100-80GB node, both without a word (found by a review of MIG)."""
    obj = workload("DaemonSet", frac(ask))
    result = review(copy.deepcopy(obj), DAEMON_NODES)
    assert result.allowed, result.message
    assert mig_annotation(result.object) == line
    assert template_of(result.object)["spec"].get("nodeSelector") == selector
    assert result.warnings == [warning]
    assert mutate_twice(obj, DAEMON_NODES)[1] == []
    # a Deployment's pods go where the device is: nothing to say
    deployment = review(workload("Deployment", frac(ask)), DAEMON_NODES)
    assert deployment.allowed and deployment.warnings == []


@pytest.mark.parametrize(
    ("pools", "named"),
    [
        pytest.param(["a80-w1", "a80-w2", "a80-w3"], "pools a80-w1 and 2 more", id="fewer-names"),
        pytest.param(
            [f"a100-80gb-{z}-reserved-capacity" for z in "abc"], "pools a100-80… and 2 more", id="no-name-fits"
        ),
        pytest.param(["A100-SXM4-80GB/driver-535.183.01"], "pool A100-SXM4-80GB/driv…", id="one-name-too-long"),
    ],
)
def test_a_warning_naming_long_pools_is_cut_at_a_name_and_keeps_its_advice(pools, named):
    """Pools named in a warning were cut with it at 119 characters: in the middle of a name, which then read as
    another pool's, and the advice after them was lost. As many names as fit are given, the rest counted; where not
    even one fits, the first is cut with a '…' (it said '1 pool', which named none: a k3s pool's name is its
    product and driver)."""
    nodes = [DAEMON_NODES[0], *(mixed_node(f"n{i}", A100_80, {"3g.40gb": 2}, p, 81920) for i, p in enumerate(pools))]
    result = review(workload("DaemonSet", frac("0.5")), nodes)
    assert result.allowed, result.message
    assert result.warnings == [
        f"mig: DaemonSet pods Pending on {named} (no such device): use annotation gpu-admission.io/gpu-fraction"
    ]


def test_workload_template_memory_that_nothing_covers_warns():
    result = review(workload("Deployment", memreq("500Gi")), [a100_40()])
    assert result.allowed and result.patch == []
    assert any("500Gi" in w and "refused" in w for w in result.warnings), result.warnings


def test_workload_template_fraction_that_nothing_covers_is_denied():
    result = review(workload("Job", frac("0.5")), [mixed_node("n0", A100_80, {"1g.10gb": 7}, "small", 81920)])
    assert not result.allowed and result.reason == "MIGNoProfile"


# ---------------------------------------------------------------------------------------------------------------
# Refusals, never silent rounding


@pytest.mark.parametrize(
    ("obj", "reason", "words"),
    [
        pytest.param(frac("1.5"), "MIGInvalidFraction", ["trainer", "nvidia.com/gpu 1.5", "(1 or 2)"], id="above-one"),
        pytest.param(frac("2500m"), "MIGInvalidFraction", ["2500m", "(2 or 3)"], id="above-one-milli"),
        pytest.param(frac("-0.5"), "MIGInvalidFraction", ["above 0"], id="negative"),
        pytest.param(frac("-1"), "MIGInvalidFraction", ["above 0"], id="negative-whole"),
        pytest.param(frac("half"), "MIGInvalidRequest", ["'half' is not a quantity"], id="not-a-quantity"),
        pytest.param(
            pod(container(limits={GPU: "0.5"}, requests={GPU: "0.25"})),
            "MIGRequestLimitMismatch",
            ["request 0.25 and limit 0.5", "must be equal"],
            id="request-not-limit",
        ),
        pytest.param(
            pod(container(limits={MEM: "20Gi"}, requests={MEM: "10Gi"})),
            "MIGRequestLimitMismatch",
            ["gpu-admission.io/gpu-memory"],
            id="memory-request-not-limit",
        ),
        pytest.param(
            pod(container(limits={GPU: "0.5", MEM: "20Gi"})),
            "MIGConflictingRequest",
            ["nvidia.com/gpu 0.5", "gpu-admission.io/gpu-memory 20Gi", "not both"],
            id="fraction-and-memory",
        ),
        pytest.param(
            pod(container(limits={GPU: "1", MEM: "20Gi"})), "MIGConflictingRequest", ["not both"], id="whole-and-memory"
        ),
        pytest.param(
            memreq("20GB"),
            "MIGInvalidRequest",
            ["'20GB' is not a quantity; GB is not a Kubernetes suffix (no B): write 20Gi (powers of 1024) or 20G"],
            id="memory-in-gb",
        ),
        pytest.param(
            memreq("lots"),
            "MIGInvalidRequest",
            ["'lots' is not a quantity; write a memory size, e.g. 20Gi"],
            id="memory-not-a-quantity",
        ),
        pytest.param(memreq("0"), "MIGInvalidRequest", ["positive whole number of bytes"], id="memory-zero"),
        pytest.param(memreq("500m"), "MIGInvalidRequest", ["positive whole number of bytes"], id="memory-milli"),
        pytest.param(  # a resource no node offers: admitted, it stayed Pending without a word (found by a review)
            pod(container(limits={"gpu-admission.io/gpu-memroy": "20Gi"})),
            "MIGInvalidRequest",
            ["container trainer asks for gpu-admission.io/gpu-memroy, a resource no node offers", "gpu-memory"],
            id="misspelt-resource",
        ),
        pytest.param(
            pod(container(limits={GPU: "0.5", "nvidia.com/mig-1g.5gb": "1"})),
            "MIGMultipleDevices",
            ["one MIG device"],
            id="fraction-and-mig",
        ),
        pytest.param(
            pod(container(), annotations={"gpu-admission.io/gpu-fraction": "1.5"}),
            "MIGInvalidFraction",
            ["at most 1"],
            id="annotation-above-one",
        ),
        pytest.param(
            pod(container(), annotations={"gpu-admission.io/gpu-fraction": "0"}),
            "MIGInvalidFraction",
            ["above 0"],
            id="annotation-zero",
        ),
        pytest.param(
            pod(container(), annotations={"gpu-admission.io/gpu-fraction": "lots"}),
            "MIGInvalidFraction",
            ["not a number"],
            id="annotation-garbage",
        ),
        pytest.param(
            pod(
                container(),
                annotations={"gpu-admission.io/gpu-fraction": "0.5", "gpu-admission.io/gpu-fraction-container": "nope"},
            ),
            "MIGUnknownContainer",
            ["'nope'", "containers: trainer"],
            id="annotation-unknown-container",
        ),
        pytest.param(
            pod(container(limits={GPU: "1"}), annotations={"gpu-admission.io/gpu-fraction": "0.5"}),
            "MIGConflictingRequest",
            ["by annotation"],
            id="annotation-and-whole-gpu",
        ),
        pytest.param(
            memreq("41Gi"),
            "MIGNoProfile",
            [
                "asks for gpu-admission.io/gpu-memory 41Gi",
                "at least 41Gi",
                f"pool a100-40 ({A100_40}, mixed): 1g.5gb, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb",
            ],
            id="memory-too-big",
        ),
    ],
)
def test_refusals(obj, reason, words):
    result = review(obj, [a100_40()])
    assert not result.allowed
    assert result.reason == reason
    assert result.patch == []
    for word in words:
        assert word in result.message, result.message


@pytest.mark.parametrize(
    ("nodes", "words"),
    [
        pytest.param(
            [mixed_node("n0", A100_80, {"1g.10gb": 7, "2g.20gb": 0}, "small", 81920)],
            [
                "memory share is at least 0.5",
                "pool small (NVIDIA-A100-SXM4-80GB, mixed): 1g.10gb (1/8 memory, 1/7 compute)",
            ],
            id="only-small-profiles",
        ),
        pytest.param(
            [whole_node("w", "Tesla-T4", 4, "t4")],
            ["Eligible GPU nodes offer no MIG profiles: pool t4 (1 node, Tesla-T4"],
            id="no-mig-at-all",
        ),
        pytest.param([], ["does not know the cluster's nodes"], id="no-cluster"),
        pytest.param(
            [{"kind": "Node", "metadata": {"name": "cpu"}, "status": {"allocatable": {"cpu": "8"}}}],
            ["No GPU node matches"],
            id="no-gpu-nodes",
        ),
    ],
)
def test_nothing_covers(nodes, words):
    result = review(frac("0.5"), nodes)
    assert not result.allowed and result.reason == "MIGNoProfile"
    for word in words:
        assert word in result.message, result.message


def test_pools_without_mig_are_counted_by_their_nodes_and_the_rest_said():
    """Found by a review (scale2): where each node is a group of its own, a 75-node pool was said as 'pool pool0 (1
    node, ...)', and 4 of 40 pools were listed with no word of the others."""
    nodes = []
    for p in range(8):
        for i in range(3):
            node = whole_node(f"t{p}-{i}", "Tesla-T4", 4, f"t4-{p}")
            node["metadata"]["labels"]["example.com/rack"] = f"r{p}-{i}"  # a group a node
            nodes.append(node)
    result = review(frac("0.5"), nodes)
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert "Eligible GPU nodes offer no MIG profiles: pool t4-0 (3 nodes, Tesla-T4, driver" in result.message
    assert "1 node" not in result.message
    assert "pool t4-3 (3 nodes" in result.message and "pool t4-4" not in result.message
    assert " and 4 more." in result.message
    # so is a MIG pool out of reach: once, not once a node
    taint = [{"key": "example.com/team", "value": "a", "effect": "NoSchedule"}]
    for i in range(3):
        nodes.append(mixed_node(f"a{i}", A100_80, {"3g.40gb": 2}, "a100", 81920, taints=taint))
        nodes[-1]["metadata"]["labels"]["example.com/rack"] = f"a{i}"
    result = review(frac("0.5"), nodes)
    assert result.message.count("a100 (3g.40gb; untolerated taint") == 1, result.message


def _zoned_mig_pool() -> list[dict[str, Any]]:
    """A tainted MIG pool over two zones and two racks, its first node in neither us-east-1a nor rack r2."""
    taint = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    places = [("us-east-1b", "r1", {}), ("us-east-1a", "r2", {"example.com/opt": "v0"}), ("us-east-1b", "r2", {})]
    return [
        mixed_node(
            f"a{i}",
            A100_80,
            {"3g.40gb": 2},
            "a100",
            81920,
            extra_labels={"topology.kubernetes.io/zone": zone, "example.com/rack": rack, **extra},
            taints=taint,
        )
        for i, (zone, rack, extra) in enumerate(places)
    ]


@pytest.mark.parametrize(
    ("obj", "kept_off"),
    [
        pytest.param(
            pod(container(limits={GPU: "0.5"}), nodeSelector={"topology.kubernetes.io/zone": "us-east-1a"}),
            "untolerated taint dedicated=ml:NoSchedule)",
            id="a-node-in-the-zone",
        ),
        pytest.param(
            pod(container(limits={GPU: "0.5"}), nodeSelector={"topology.kubernetes.io/zone": "us-west-2a"}),
            "untolerated taint dedicated=ml:NoSchedule; its nodeSelector topology.kubernetes.io/zone: us-west-2a)",
            id="no-node-in-the-zone",
        ),
        pytest.param(
            pod(
                container(limits={GPU: "0.5"}),
                nodeSelector={"topology.kubernetes.io/zone": "us-east-1a", "example.com/rack": "r1"},
            ),
            "untolerated taint dedicated=ml:NoSchedule; its nodeSelector example.com/rack: r1)",
            id="no-node-in-both-the-nearest-named",
        ),
        pytest.param(
            pod(
                container(limits={GPU: "0.5"}),
                container("sidecar", limits={GPU: "1"}),
                nodeSelector={"example.com/opt": "v0"},
            ),
            "untolerated taint dedicated=ml:NoSchedule; container sidecar (nvidia.com/gpu 1) asks whole GPUs, none"
            " offered there)",
            id="whole-gpus-not-the-selector",
        ),
    ],
)
def test_a_mig_pool_out_of_reach_is_told_the_same_where_labels_are_read_node_by_node(
    obj: dict[str, Any], kept_off: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MANY_GROUPS a zone or a rack is volatile, out of the group's labels and read node by node: the refusal
    named 'its nodeSelector topology.kubernetes.io/zone: us-east-1a' of a pool with nodes there, and a pool whose
    whole GPUs kept the pod off as kept off by its nodeSelector (a review of the groups at scale). The pool is told
    what keeps the pod off its nearest node, as where each node is a group of its own."""
    monkeypatch.setattr(cluster, "MANY_GROUPS", 1)
    volatile = context(_zoned_mig_pool()).cluster
    assert {"topology.kubernetes.io/zone", "example.com/rack"} <= volatile.volatile_labels
    refused = review(obj, _zoned_mig_pool())
    monkeypatch.setattr(cluster, "MANY_GROUPS", 10_000)  # a group of each node
    grouped = review(obj, _zoned_mig_pool())
    assert not refused.allowed and refused.message == grouped.message
    assert f"MIG pools this pod cannot use: a100 (3g.40gb; {kept_off}." in refused.message, refused.message


def test_the_profiles_offered_are_listed_within_bounds_and_the_advice_stays():
    """Found by a review: over 450 pools offering 1g.10gb, 'Eligible nodes offer: ...' had no limit, and the refusal
    was cut at its 8,000 characters with its advice lost."""
    nodes = [mixed_node(f"n{i}", A100_80, {"1g.10gb": 7}, f"small-{i:03}", 81920) for i in range(150)]
    result = review(frac("0.5"), nodes)
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert "Eligible nodes offer: pool small-000 (NVIDIA-A100-SXM4-80GB, mixed): 1g.10gb (1/8 memory" in result.message
    assert "pool small-006 (" not in result.message and " and 144 more." in result.message
    assert result.message.endswith(
        " Ask for at most what a profile offered here holds, or for a whole GPU (nvidia.com/gpu: 1)."
    )


@pytest.mark.parametrize(
    ("product", "said"),
    [
        pytest.param(
            "",
            "if the GPUs of pool a100 are MIG-partitioned, set migStrategy (mixed, single or gke) and migProfiles on it"
            " in cluster.pools.",
            id="model-unknown",
        ),
        pytest.param(
            A100_80,
            "where the GPUs of pool a100 (NVIDIA-A100-SXM4-80GB, which support MIG) are MIG-partitioned, set"
            " migStrategy (mixed, single or gke) and migProfiles on it in cluster.pools (3g.40gb covers it).",
            id="mig-model",
        ),
        pytest.param("NVIDIA-L4", "", id="no-mig-model"),
    ],
)
def test_a_declared_pool_without_mig_is_told_to_declare_its_layout(product, said):
    """Found by a review: install.md's example pool a100 (declared, no migStrategy) was told to 'add MIG-partitioned
    nodes (or declare their pool)', a pool it had declared; the keys to set on it are named where its GPU model
    supports MIG, or may (not known), and not for a GPU without MIG."""
    pool = PoolSettings(name="a100", node_selector={POOL: "a100"}, driver_version="550.54.15", gpu_product=product)
    result = review(frac("0.5"), [], settings([pool]))
    assert not result.allowed and result.reason == "MIGNoProfile"
    if said:
        assert result.message.endswith(" Ask for a whole GPU (nvidia.com/gpu: 1), or, " + said), result.message
        assert "declare their pool" not in result.message
    else:
        assert "migStrategy" not in result.message
        assert result.message.endswith(" or add MIG-partitioned nodes (or declare their pool)."), result.message


def test_a_declared_pool_whose_model_has_no_profile_for_the_ask_is_not_told_to_declare_its_layout() -> None:
    """Found by a review: gpu-memory 100Gi on a declared A100-80GB pool, which no MIG profile of it holds, was told to
    set migStrategy and migProfiles on it; where one of two models has such a profile, that model's pool alone."""
    a100 = PoolSettings(name="a100", node_selector={POOL: "a100"}, gpu_product=A100_80, gpu_memory_mib=81920)
    result = review(pod(container("main", limits={MEM: "100Gi"})), [], settings([a100]))
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert "migStrategy" not in result.message
    assert result.message.endswith(" or add MIG-partitioned nodes (or declare their pool)."), result.message
    a100_40 = replace(a100, name="a100-40", node_selector={POOL: "a100-40"}, gpu_product=A100_40, gpu_memory_mib=40960)
    h100 = replace(a100, name="h100", node_selector={POOL: "h100"}, gpu_product=H100, gpu_memory_mib=81559)
    result = review(pod(container("main", limits={MEM: "50Gi"})), [], settings([a100_40, h100]))
    assert (
        "where the GPUs of pool h100 (NVIDIA-H100-80GB-HBM3, which support MIG) are MIG-partitioned" in result.message
    )
    assert "a100-40" not in result.message.partition("Ask for")[2], result.message


@pytest.mark.parametrize(
    ("product", "said"),
    [
        pytest.param(
            "", "if the GPUs of pool a100 are MIG-partitioned, set migStrategy (mixed or single)", id="unknown"
        ),
        pytest.param(
            A100_80, "are MIG-partitioned, set migStrategy (mixed or single) and migProfiles on it", id="a100"
        ),
    ],
)
def test_a_declared_pool_off_gke_is_not_told_the_gke_strategy(product: str, said: str) -> None:
    """Found by a review: an EKS nodegroup declared without MIG was told 'set migStrategy (mixed, single or gke)':
    gke (GKE's partition-size label) is named for GKE's pools alone."""
    eks = {"eks.amazonaws.com/nodegroup": "a100"}
    pool = PoolSettings(name="a100", node_selector=eks, driver_version="550.54.15", gpu_product=product)
    result = review(frac("0.5"), [], settings([pool]))
    assert not result.allowed and said in result.message, result.message
    assert "gke" not in result.message


def test_the_same_refusal_of_several_containers_is_one_paragraph_naming_them_all() -> None:
    """Four containers refused alike read as four paragraphs that differed only in the name: one names them all,
    where the first was, and a refusal said of one alone stays whole, in its place."""
    small = [mixed_node("n0", A100_80, {"1g.10gb": 7}, "small", 81920)]
    asks = {"a": "0.5", "b": "0.25", "c": "0.5", "d": "0.5"}
    result = pipeline.mutate(pod(*(container(n, limits={GPU: v}) for n, v in asks.items())), context(small))
    assert not result.allowed and result.reason == "MIGNoProfile"
    first, second = result.message.split("\n")
    assert first.startswith("each of containers a, c and d asks for nvidia.com/gpu 0.5; no eligible node offers a")
    assert second.startswith("container b asks for nvidia.com/gpu 0.25; no eligible node offers a MIG profile")
    assert first.endswith(", or for a whole GPU (nvidia.com/gpu: 1).")  # whole, as a refusal of one container is
    assert first.partition(" asks")[2] == second.replace("0.25", "0.5").partition(" asks")[2]
    left = pipeline.validate(pod(*(container(n, limits={GPU: "0.5"}) for n in "xyz")), context(small))
    assert not left.allowed and left.reason == "MIGUnconverted"
    assert left.message.startswith("each of containers x, y and z still asks for nvidia.com/gpu 0.5: the mutating")
    assert "\n" not in left.message


def test_a_refusal_said_again_of_a_container_names_it_once() -> None:
    """One outcome merged into another (a pass of the mig policy) that said the same refusal of the same container:
    it is named once, not 'each of containers a, b and a'."""
    said = Outcome()
    for name in ("a", "b"):
        said.deny("mig", "MIGNoProfile", f"container {name} asks for nvidia.com/gpu 0.5; none.", container=name)
    again = Outcome()
    again.deny("mig", "MIGNoProfile", "container a asks for nvidia.com/gpu 0.5; none.", container="a")
    said.merge(again)
    assert [d.message for d in said.denials] == ["each of containers a and b asks for nvidia.com/gpu 0.5; none."]


# ---------------------------------------------------------------------------------------------------------------
# Fallbacks


def test_fallback_whole_gpu_pins_away_from_mig_single_nodes():
    nodes = [whole_node("w", A100_80, 8, "whole"), single_node("s", A100_80, "1g.10gb", 7, "single")]
    result = review(frac("0.5"), nodes, settings(fallback="whole"))
    assert result.allowed, result.message
    assert resources_of(result.object) == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    assert result.object["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": A100_80}
    assert mig_annotation(result.object) == (
        f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/gpu 1 (whole GPU: no MIG profile covers it, pinned to "
        f"nvidia.com/gpu.product={A100_80}, {A100_80}, pool whole)"
    )
    assert any("whole GPU" in w for w in result.warnings)
    assert "MIGFallback" in pipeline.mutate(frac("0.5"), context(nodes, settings(fallback="whole"))).outcome.reasons


def test_a_pod_of_whole_gpus_and_a_fraction_is_told_what_helps() -> None:
    """A mixed pool of MIG devices only, out of reach for the pod's whole-GPU container: it was told to change its
    nodeSelector (no selector helps); and single-strategy pools barred for its whole GPUs were also said to offer
    no MIG profiles (found by a review of MIG)."""
    obj = pod(container("a", limits={GPU: "1"}), container("b", limits={GPU: "0.5"}))
    mixed = mixed_node("m", A100_40, {"1g.5gb": 7, "3g.20gb": 2}, "a40", 40960)
    result = review(copy.deepcopy(obj), [whole_node("w", A100_40, 8, "whole"), mixed])
    assert not result.allowed
    assert "Run the whole-GPU containers in a pod of their own" in result.message, result.message
    assert "Change the pod's nodeSelector" not in result.message
    singles = [single_node("s1", A100_40, "1g.5gb", 7, "sp1"), single_node("s3", A100_40, "3g.20gb", 2, "sp3")]
    barred = review(copy.deepcopy(obj), singles)
    assert not barred.allowed and "offer no MIG profiles" not in barred.message, barred.message
    assert "Pool sp3 (single, 3g.20gb) would cover it" in barred.message


def test_a_pod_without_placement_rules_kept_off_by_its_whole_gpu_is_not_told_they_match_no_node() -> None:
    """A mixed node of MIG devices and no whole GPU: the pod's whole-GPU container keeps it off, but the refusal
    said no GPU node matched its nodeSelector, node affinity and tolerations, which it has none of (found by a
    review of MIG)."""
    obj = pod(container("a", limits={GPU: "0.5"}), container("b", limits={GPU: "1"}))
    result = review(obj, [mixed_node("n", A100_40, {"3g.20gb": 2}, "p", 40960)])
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert result.message == (
        "container a asks for nvidia.com/gpu 0.5; no eligible node offers a MIG profile whose memory share is at "
        "least 0.5. The GPU nodes its nodeSelector, node affinity and tolerations reach do not offer the other "
        "resources the pod asks for. MIG pools this pod cannot use: p (3g.20gb; container b (nvidia.com/gpu 1) asks "
        "whole GPUs, none offered there). Run the whole-GPU containers in a pod of their own, ask for a fraction in "
        "them too, or add mixed-strategy MIG nodes that offer whole GPUs beside MIG devices."
    )


def test_too_few_of_a_covering_profile_is_said_beside_smaller_ones() -> None:
    """Two 0.5 containers and one 3g.20gb a node: with a 1g.5gb offered too, the pod was told to ask for what a
    1g.5gb holds, not that it needs two 3g.20gb on one node (found by a review of MIG)."""
    node = mixed_node("m", A100_40, {"1g.5gb": 7, "3g.20gb": 1}, "a40", 40960)
    result = review(pod(container("a", limits={GPU: "0.5"}), container("b", limits={GPU: "0.5"})), [node])
    assert not result.allowed
    assert "would need 2 nvidia.com/mig-3g.20gb on one node" in result.message, result.message
    assert "Split the containers into pods of their own" in result.message


def test_a_mig_device_of_its_own_comes_before_a_time_shared_one_which_is_said() -> None:
    """A time-sliced mixed pool came before a dedicated single-strategy one, and a time-shared device was given
    without a word, though its memory is shared with the other pods on it (found by a review of MIG)."""
    shared = mixed_node("m", A100_40, {"3g.20gb": 8}, "mts", 40960)
    shared["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
    dedicated = single_node("s", A100_40, "3g.20gb", 2, "dedicated")
    result = review(frac("0.5"), [shared, dedicated])
    assert result.object["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": f"{A100_40}-MIG-3g.20gb"}
    assert not [w for w in result.warnings if "time-slicing" in w]
    alone = review(frac("0.5"), [shared])
    assert resources_of(alone.object) == mig("3g.20gb")
    # the smallest that covers it first all the same: a 0.1 was given a whole 7g.80gb over a time-shared 1g.10gb
    small = mixed_node("ts", A100_80, {"1g.10gb": 7}, "small", 81920)
    small["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
    big = mixed_node("d", A100_80, {"7g.80gb": 1}, "big", 81920)
    assert resources_of(review(frac("0.1"), [small, big]).object) == mig("1g.10gb")
    assert any("nvidia.com/mig-3g.20gb is time-slicing there: shared with other pods" in w for w in alone.warnings)


def _time_shared(node: dict[str, Any], gke: bool = False) -> dict[str, Any]:
    labels = node["metadata"]["labels"]
    if gke:
        labels.update({GKE_SHARING_LABEL: "time-sharing", "cloud.google.com/gke-max-shared-clients-per-gpu": "2"})
    else:
        labels.update({SHARING_LABEL: "time-slicing", "nvidia.com/gpu.replicas": "4"})
    return node


@pytest.mark.parametrize(
    ("nodes", "selector", "line"),
    [
        pytest.param(
            [
                mixed_node("d", A100_40, {"3g.20gb": 2}, "ded", 40960),
                _time_shared(mixed_node("s", A100_40, {"3g.20gb": 8}, "ts", 40960)),
            ],
            {POOL: "ded"},
            f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb (pinned to {POOL}=ded, {A100_40}, pool ded)",
            id="mixed-same-resource",
        ),
        pytest.param(
            [
                mixed_node("d", A100_40, {"3g.20gb": 2}, "ded", 40960, extra_labels={SHARING_LABEL: "none"}),
                _time_shared(mixed_node("s", A100_40, {"3g.20gb": 8}, "ts", 40960)),
            ],
            {SHARING_LABEL: "none"},
            f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb (pinned to {SHARING_LABEL}=none, {A100_40}, "
            "pool ded)",
            id="mixed-gfd-sharing-label",
        ),
        pytest.param(
            [
                gke_node("g1", "nvidia-tesla-a100", "3g.20gb", 2, "gded"),
                _time_shared(gke_node("g2", "nvidia-tesla-a100", "3g.20gb", 4, "gts"), gke=True),
            ],
            {"cloud.google.com/gke-gpu-partition-size": "3g.20gb", POOL: "gded"},
            "trainer: nvidia.com/gpu 0.5 -> nvidia.com/gpu 1 with nodeSelector cloud.google.com/gke-gpu-partition-size="
            f"3g.20gb (pinned to {POOL}=gded, nvidia-tesla-a100, pool gded)",
            id="gke-time-sharing-partition",
        ),
    ],
)
def test_a_fraction_is_pinned_to_its_own_device_where_time_shared_pools_offer_the_same_one(nodes, selector, line):
    """Without renameByDefault a time-sliced mixed pool offers the same nvidia.com/mig-3g.20gb as a dedicated one,
    and a GKE time-sharing partition has the same partition size: both in one option, 0.5 could land on a
    3g.20gb shared four ways without a word (found by a review of MIG)."""
    result = review(frac("0.5"), nodes)
    assert result.allowed, result.message
    assert result.object["spec"]["nodeSelector"] == selector
    assert mig_annotation(result.object) == line
    assert not [w for w in result.warnings if "time-s" in w], result.warnings
    assert mutate_twice(frac("0.5"), nodes)[1] == []


def test_a_time_shared_pool_no_label_tells_from_a_dedicated_one_is_said() -> None:
    """Dedicated and time-sliced nodes of one pool offering the same device, no label telling them apart: not
    pinned, and the sharing is said (it was said only where every place shared the device: a review of MIG)."""
    nodes = [
        mixed_node("d", A100_40, {"3g.20gb": 2}, "mixed", 40960),
        _time_shared(mixed_node("s", A100_40, {"3g.20gb": 8}, "mixed", 40960)),
    ]
    result = review(frac("0.5"), nodes)
    assert result.allowed, result.message
    assert "nodeSelector" not in result.object["spec"]
    assert result.warnings == [
        "trainer: nvidia.com/mig-3g.20gb is time-slicing on pool mixed: shared with other pods, its memory not its own"
    ]


@pytest.mark.parametrize("dedicated", [{}, {SHARING_LABEL: "none"}], ids=["by-pool", "by-sharing-label"])
def test_a_daemonset_fraction_is_not_pinned_off_the_time_shared_pools(dedicated: dict[str, str]) -> None:
    """A DaemonSet makes a pod for every node it selects: pinned to the dedicated pool, its next rollout took its
    pods off every time-sliced node, where the shared device served them, with only a warning at its apply (found
    by a review of MIG). Not pinned: the shared pool is named, as where no label tells the pools apart."""
    nodes = [
        mixed_node("d", A100_40, {"3g.20gb": 2}, "ded", 40960, extra_labels=dedicated),
        _time_shared(mixed_node("s", A100_40, {"3g.20gb": 8}, "ts", 40960)),
    ]
    obj = workload("DaemonSet", frac("0.5"))
    result = review(copy.deepcopy(obj), nodes)
    assert result.allowed, result.message
    assert "nodeSelector" not in template_of(result.object)["spec"]
    assert mig_annotation(result.object) == (
        f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb ({A100_40}, pools ded, ts)"
    )
    assert result.warnings == [
        "trainer: nvidia.com/mig-3g.20gb is time-slicing on pool ts: shared with other pods, its memory not its own"
    ]
    assert mutate_twice(obj, nodes)[1] == []


SPOT_DEDICATED_NODES = [
    mixed_node("d", A100_40, {"3g.20gb": 2}, "ded-spot", 40960, extra_labels={"cloud.google.com/gke-spot": "true"}),
    _time_shared(mixed_node("s", A100_40, {"3g.20gb": 8}, "ts-od", 40960)),
]
SHARED_ON_TS_OD = (
    "trainer: nvidia.com/mig-3g.20gb is time-slicing on pool ts-od: shared with other pods, its memory not its own"
)


@pytest.mark.parametrize("kind", ["Pod", "Deployment"])
@pytest.mark.parametrize("spot", [None, "tolerate"])
def test_a_fraction_is_not_pinned_to_its_own_device_on_spot_pools_alone(kind: str, spot: str | None) -> None:
    """Untainted spot nodes (EKS, Karpenter, CoreWeave, GKE without the taint) take every pod: the pin to the pool
    that gave the device undivided sent a pod that did not ask for spot capacity to a spot pool alone, off the
    on-demand pool that time-shared it, without a word (found by a review of MIG). Not pinned: the shared pool is
    named, as where no label tells the pools apart."""
    obj = frac("0.5") if spot is None else pod(container(limits={GPU: "0.5"}), annotations={SPOT: spot})
    obj = obj if kind == "Pod" else workload(kind, obj)
    result = review(copy.deepcopy(obj), SPOT_DEDICATED_NODES)
    assert result.allowed, result.message
    assert "nodeSelector" not in template_of(result.object)["spec"]
    assert "affinity" not in template_of(result.object)["spec"]
    assert mig_annotation(result.object) == (
        f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb ({A100_40}, pools ded-spot, ts-od)"
    )
    assert result.warnings == [SHARED_ON_TS_OD]
    assert mutate_twice(obj, SPOT_DEDICATED_NODES)[1] == []


def test_a_fraction_is_not_pinned_to_a_declared_spot_pool_at_zero_beside_a_running_shared_one() -> None:
    """A spot pool declared at zero that would give the device undivided: the pin made a pod that did not ask for
    spot capacity wait for its scale-up, while a running on-demand node time-shared the device (found by a review
    of MIG)."""
    declared = PoolSettings(
        name="ded-spot",
        node_selector={POOL: "ded-spot"},
        spot=True,
        gpu_product=A100_40,
        gpu_memory_mib=40960,
        mig_strategy="mixed",
        mig_profiles={"3g.20gb": 2},
    )
    nodes = [_time_shared(mixed_node("s", A100_40, {"3g.20gb": 8}, "ts-od", 40960))]
    result = review(frac("0.5"), nodes, settings([declared]))
    assert result.allowed, result.message
    assert "nodeSelector" not in result.object["spec"]
    assert mig_annotation(result.object) == (
        f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb ({A100_40}, pools ded-spot, ts-od)"
    )
    assert result.warnings == [SHARED_ON_TS_OD]


def test_a_fraction_is_pinned_to_its_own_devices_spot_ones_too_where_one_is_on_demand() -> None:
    """Not spot capacity alone: the pin takes every dedicated pool, the spot one too (the pod may run there, as
    without the webhook), and none of the shared pool."""
    nodes = [*SPOT_DEDICATED_NODES, mixed_node("o", A100_40, {"3g.20gb": 2}, "ded-od", 40960)]
    result = review(frac("0.5"), nodes)
    assert result.allowed, result.message
    assert result.object["spec"]["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": POOL, "operator": "In", "values": ["ded-od", "ded-spot"]}]}
                ]
            }
        }
    }
    assert mig_annotation(result.object) == (
        f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb (pinned to {POOL}=ded-od or ded-spot, {A100_40}, "
        "pools ded-od, ded-spot)"
    )
    assert result.warnings == []


@pytest.mark.parametrize(
    ("spot", "line", "warnings"),
    [
        pytest.param(
            "prefer",
            f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb ({A100_40}, pools ded-spot, ts-od)",
            [SHARED_ON_TS_OD],
            id="prefer-leans-there",
        ),
        pytest.param(
            "require",  # its spot affinity keeps it off the on-demand pool
            f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb ({A100_40}, pool ded-spot)",
            [],
            id="require-kept-there",
        ),
    ],
)
def test_a_fraction_that_asks_for_spot_is_not_pinned_to_a_spot_pool_alone_either(
    spot: str, line: str, warnings: list[str]
) -> None:
    """The pin to spot pools alone does not hang on the spot mode: under prefer a hard pin made the preference a
    requirement (Pending after a reclaim, an on-demand pool idle), and a workload whose mode an UPDATE then changed
    kept the pin its conversion was not redone for (found by a review). Prefer's own preferred affinity leans to
    the spot pool; require's keeps it there."""
    obj = pod(container(limits={GPU: "0.5"}), annotations={SPOT: spot})
    result = review(obj, SPOT_DEDICATED_NODES)
    assert result.allowed, result.message
    assert "nodeSelector" not in result.object["spec"]
    assert mig_annotation(result.object) == line
    assert result.warnings == warnings
    assert mutate_twice(obj, SPOT_DEDICATED_NODES)[1] == []


def test_a_fraction_is_not_pinned_to_its_own_device_where_only_a_time_shared_pool_runs_its_cuda() -> None:
    """The pin to dedicated pools never goes where the pod's CUDA cannot run: it would be refused there, while the
    cuda policy steers it to the time-shared pool that runs it (where the sharing is said)."""
    from tests.cuda_fixtures import container as cuda_container
    from tests.cuda_fixtures import gpu_node
    from tests.cuda_fixtures import pod as cuda_pod

    mig_labels = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.capable": "true"}
    device = {"nvidia.com/mig-3g.40gb": "2"}
    nodes = [
        gpu_node("a-0", "old", "535.104.05", labels=mig_labels, gpus="0", allocatable=device),
        gpu_node(
            "b-0",
            "new",
            "570.124.06",
            labels={**mig_labels, SHARING_LABEL: "time-slicing"},
            gpus="0",
            allocatable=device,
        ),
    ]
    wanted = cuda_pod(cuda_container(image="pytorch/pytorch-nightly:2710000-cu12.8", gpu="0.5"))
    result = review(wanted, nodes, replace(settings(), cuda=CudaSettings()))
    assert result.allowed, result.message
    assert resources_of(result.object) == mig("3g.40gb")
    assert "nodeSelector" not in result.object["spec"]
    assert "nvidia.com/mig-3g.40gb is time-slicing on pool new: shared with other pods" in " ".join(result.warnings)


@pytest.mark.parametrize("fallback", ["whole", "shared"])
def test_a_fallback_gives_a_memory_ask_no_gpu_of_less_memory(fallback: str) -> None:
    """30Gi with a whole or shared fallback went to a T4 of 15 GiB, pinned nowhere (found by a review of MIG)."""
    t4 = whole_node("t", "Tesla-T4", 4, "t4", sharing="time-slicing" if fallback == "shared" else "")
    a100 = whole_node("a", A100_80, 8, "a100", sharing="time-slicing" if fallback == "shared" else "")
    for node, mib in ((t4, "15360"), (a100, "81920")):
        node["metadata"]["labels"]["nvidia.com/gpu.memory"] = mib
    result = review(memreq("30Gi"), [t4, a100], settings(fallback=fallback))
    assert result.allowed, result.message
    assert result.object["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": A100_80}
    alone = review(memreq("30Gi"), [t4], settings(fallback=fallback))
    assert not alone.allowed and f"The {fallback} fallback found no GPU of 30Gi or more either" in alone.message


def _gke_time_shared(name: str, pool: str, sharing: str) -> dict[str, Any]:
    """A GKE node of a pool created with GPU sharing: no GFD, GKE's own labels."""
    node = whole_node(name, "", 1, pool)
    del node["metadata"]["labels"]["nvidia.com/gpu.product"]
    node["metadata"]["labels"]["cloud.google.com/gke-accelerator"] = "nvidia-l4"
    if sharing:
        node["metadata"]["labels"]["cloud.google.com/gke-gpu-sharing-strategy"] = sharing
        node["metadata"]["labels"]["cloud.google.com/gke-max-shared-clients-per-gpu"] = "4"
    return node


@pytest.mark.parametrize(
    ("nodes", "resources", "selector"),
    [
        pytest.param(
            [_gke_time_shared("g", "l4-shared", "time-sharing"), _gke_time_shared("o", "l4", "")],
            {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
            {"cloud.google.com/gke-gpu-sharing-strategy": "time-sharing"},
            id="gke-time-sharing",
        )
    ],
)
def test_fallback_shared_gpu_on_gke(nodes, resources, selector):
    """GKE's own sharing label was not read: with mig.fallback shared, 0.5 was denied ('The shared fallback found no
    GPU either') on a time-sharing pool (found by a review of provider journeys)."""
    test_fallback_shared_gpu(nodes, resources, selector)
    from webhook.cluster import build_view

    (shared,) = [g for g in build_view(nodes, settings()).gpu_groups if g.pool == "l4-shared"]
    assert shared.sharing == "time-slicing" and shared.gpu_replicas == 4


@pytest.mark.parametrize(
    ("nodes", "resources", "selector"),
    [
        pytest.param(
            [whole_node("t", A100_80, 0, "ts", "time-slicing", shared_resource=4)],
            {"limits": {"nvidia.com/gpu.shared": "1"}, "requests": {"nvidia.com/gpu.shared": "1"}},
            None,
            id="renamed-shared-resource",
        ),
        pytest.param(
            [whole_node("t", A100_80, 4, "ts", "time-slicing"), whole_node("w", A100_80, 8, "whole")],
            {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
            {"nvidia.com/gpu.sharing-strategy": "time-slicing"},
            id="time-slicing",
        ),
    ],
)
def test_fallback_shared_gpu(nodes, resources, selector):
    result = review(frac("0.5"), nodes, settings(fallback="shared"))
    assert result.allowed, result.message
    assert resources_of(result.object) == resources
    assert result.object["spec"].get("nodeSelector") == selector
    _, second = mutate_twice(frac("0.5"), nodes, settings(fallback="shared"))
    assert second == []


@pytest.mark.parametrize(
    ("fallback", "node"),
    [
        ("whole", whole_node("w", A100_80, 4, "whole")),
        ("shared", whole_node("t", A100_80, 4, "ts", "time-slicing")),
    ],
)
@pytest.mark.parametrize("where", ["containers", "init-and-app"])
def test_every_ask_no_profile_covers_gets_the_fallback(fallback, node, where):
    """Not only the first: each container left without a MIG profile gets a GPU of the fallback, and none is
    refused while the nodes have GPUs to give."""
    if where == "containers":
        obj = pod(container("a", limits={GPU: "0.5"}), container("b", limits={GPU: "0.5"}))
    else:
        obj = pod(container("b", limits={GPU: "0.5"}), init=[container("a", limits={GPU: "0.5"})])
    result = review(obj, [node], settings(fallback=fallback))
    assert result.allowed, result.message
    names = [
        c["name"] for c in [*result.object["spec"].get("initContainers", []), *result.object["spec"]["containers"]]
    ]
    assert names == ["a", "b"]
    for c in [*result.object["spec"].get("initContainers", []), *result.object["spec"]["containers"]]:
        assert c["resources"] == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}, c
    assert [w.split(":")[0] for w in result.warnings if "no MIG profile covers it" in w] == ["a", "b"]
    _, second = mutate_twice(obj, [node], settings(fallback=fallback))
    assert second == []


@pytest.mark.parametrize("fallback", ["whole", "shared"])
def test_fallback_without_a_gpu_to_give_denies(fallback):
    nodes = [mixed_node("n0", A100_80, {"1g.10gb": 7}, "small", 81920)]
    result = review(frac("0.5"), nodes, settings(fallback=fallback))
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert f"The {fallback} fallback found no GPU either" in result.message


def test_fallback_does_not_round_invalid_requests():
    result = review(frac("1.5"), [whole_node("w", A100_80, 8, "whole")], settings(fallback="whole"))
    assert not result.allowed and result.reason == "MIGInvalidFraction"


def test_disabled_changes_nothing():
    result = review(frac("0.5"), [a100_40()], settings(enabled=False))
    assert result.patch == []


@pytest.mark.parametrize(
    ("obj", "warning"),
    [
        pytest.param(frac("0.5"), "trainer: nvidia.com/gpu 0.5 not converted", id="fraction"),
        pytest.param(memreq("10Gi"), "trainer: gpu-admission.io/gpu-memory 10Gi not converted", id="memory"),
        pytest.param(
            pod(container(), annotations={"gpu-admission.io/gpu-fraction": "0.5"}),
            "gpu-admission.io/gpu-fraction 0.5 not converted",
            id="annotation",
        ),
    ],
)
def test_disabled_says_what_it_does_not_convert(obj, warning):
    result = review(obj, [a100_40()], settings(enabled=False))
    assert result.patch == []
    full = f"{warning} (MIG conversion is off here): ask for a MIG resource"
    assert full in result.warnings, result.warnings
    assert not review(frac("1"), [a100_40()], settings(enabled=False)).warnings


# ---------------------------------------------------------------------------------------------------------------
# Idempotency: mutating the result again gives an empty patch


IDEMPOTENT = [
    pytest.param(frac("500m"), [a100_40()], {}, id="mixed"),
    pytest.param(memreq("20Gi"), [a100_40()], {}, id="memory-with-warning"),
    pytest.param(frac("0.5"), [single_node("s", A100_40, "3g.20gb", 2, "half")], {}, id="single"),
    pytest.param(frac("0.5"), [gke_node("g", "nvidia-tesla-a100", "3g.20gb", 2, "half")], {}, id="gke"),
    pytest.param(
        frac("0.25"),
        [
            mixed_node("a0", A100_40, {"1g.10gb": 4}, "p1", 40960),
            mixed_node("a1", "NVIDIA-A100-PCIE-40GB", {"1g.10gb": 4}, "p2", 40960),
            mixed_node("a2", A100_80, {"1g.10gb": 7}, "p3", 81920),
        ],
        {},
        id="affinity-pin",
    ),
    pytest.param(
        pod(
            container("a", limits={GPU: "0.5"}),
            container("b", limits={MEM: "5Gi"}),
            init=[container("i", limits={GPU: "0.1"})],
        ),
        [a100_40()],
        {},
        id="multi-container",
    ),
    pytest.param(
        pod(container(), annotations={"gpu-admission.io/gpu-fraction": "0.25"}), [a100_40()], {}, id="annotation"
    ),
    pytest.param(
        frac("0.5"),
        [whole_node("w", A100_80, 8, "whole"), single_node("s", A100_80, "1g.10gb", 7, "s")],
        {"fallback": "whole"},
        id="fallback-whole",
    ),
    pytest.param(
        pod(container(), annotations={"gpu-admission.io/gpu-fraction": "0.9"}),
        [whole_node("w", A100_80, 8, "whole")],
        {"fallback": "whole"},
        id="fallback-whole-annotation",
    ),
    pytest.param(workload("CronJob", frac("0.5")), [a100_40()], {}, id="cronjob"),
]


@pytest.mark.parametrize(("obj", "nodes", "mig_settings"), IDEMPOTENT)
def test_mutating_twice_equals_once(obj, nodes, mig_settings):
    first, second = mutate_twice(obj, nodes, settings(**mig_settings))
    assert first.patch, "the first pass converts"
    assert second == []


def test_a_stale_prior_line_is_replaced_by_the_state():
    obj = pod(
        container(limits={"nvidia.com/mig-1g.5gb": "1"}),
        annotations={"gpu-admission.io/mig": "trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-7g.40gb (x, pool y)"},
    )
    first, second = mutate_twice(obj, [a100_40()])
    assert mig_annotation(first.object) == "trainer: nvidia.com/mig-1g.5gb (as found on the object)"
    assert second == []


def test_a_forged_prior_line_for_an_unconverted_container_is_dropped():
    obj = pod(
        container(limits={GPU: "1"}),
        container("other"),
        annotations={"gpu-admission.io/mig": "other: nvidia.com/gpu 0.5 -> nvidia.com/mig-7g.40gb (x, pool y)"},
    )
    result = review(obj, [a100_40(gpus=1)])
    assert mig_annotation(result.object) is None


def test_a_prior_line_is_reused_only_for_the_resource_it_names():
    converted = review(frac("0.5"), [a100_40()]).object
    line = mig_annotation(converted)
    edited = copy.deepcopy(converted)
    edited["spec"]["containers"][0]["resources"] = mig("4g.20gb")
    result = review(edited, [a100_40()])
    assert mig_annotation(result.object) == "trainer: nvidia.com/mig-4g.20gb (as found on the object)" != line


# ---------------------------------------------------------------------------------------------------------------
# validate: leftovers and two devices; the MIGAssigned event


@pytest.mark.parametrize(
    ("obj", "reason", "word"),
    [
        pytest.param(frac("0.5"), "MIGUnconverted", "still asks for nvidia.com/gpu 0.5", id="fraction-left"),
        pytest.param(memreq("20Gi"), "MIGUnconverted", "gpu-admission.io/gpu-memory 20Gi", id="memory-left"),
        pytest.param(
            pod(container(limits={"nvidia.com/mig-1g.5gb": "1", "nvidia.com/mig-3g.20gb": "1"})),
            "MIGMultipleDevices",
            "nvidia.com/mig-1g.5gb and nvidia.com/mig-3g.20gb",
            id="two-mig",
        ),
        pytest.param(
            pod(container(), annotations={"gpu-admission.io/gpu-fraction": "0.5"}),
            "MIGUnconverted",
            "no MIG device",
            id="annotation-left",
        ),
        pytest.param(
            workload("Deployment", frac("0.5")), "MIGUnconverted", "nvidia.com/gpu 0.5", id="template-fraction-left"
        ),
    ],
)
def test_validate_denies_leftovers(obj, reason, word):
    result = pipeline.validate(obj, context([a100_40()]))
    assert not result.allowed and result.reason == reason
    assert word in result.message


def test_validate_lets_a_template_keep_its_memory_request():
    assert pipeline.validate(workload("Deployment", memreq("20Gi")), context([a100_40()])).allowed


def test_validate_reports_a_verified_assignment():
    converted = review(frac("0.5"), [a100_40()]).object
    result = pipeline.validate(converted, context([a100_40()]))
    assert result.allowed
    events = [e for e in result.outcome.events if e.reason == "MIGAssigned"]
    assert len(events) == 1 and "nvidia.com/mig-3g.20gb" in events[0].message
    forged = pod(
        container(limits={GPU: "1"}),
        annotations={"gpu-admission.io/mig": "trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb (x)"},
    )
    assert not [e for e in pipeline.validate(forged, context([a100_40()])).outcome.events if e.reason == "MIGAssigned"]


# ---------------------------------------------------------------------------------------------------------------
# Bad input never crashes


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param({"containers": "nope"}, id="containers-not-a-list"),
        pytest.param({"containers": [None, 3, {"name": "c", "resources": []}]}, id="garbage-containers"),
        pytest.param(
            {"containers": [{"name": "c", "resources": {"limits": "0.5", "requests": None}}]}, id="limits-not-a-map"
        ),
        pytest.param({"containers": [{"resources": {"limits": {GPU: "0.5"}}}]}, id="no-name"),
        pytest.param({"containers": [{"name": "c", "resources": {"limits": {GPU: True}}}]}, id="bool-quantity"),
        pytest.param(
            {
                "containers": [{"name": "c", "resources": {"limits": {GPU: "0.5"}}}],
                "nodeSelector": "x",
                "affinity": [],
                "tolerations": {},
            },
            id="garbage-scheduling",
        ),
    ],
)
def test_garbage_does_not_crash(spec):
    obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "annotations": {"gpu-admission.io/mig": 5, "gpu-admission.io/gpu-fraction-container": ["x"]},
        },
        "spec": spec,
    }
    result = pipeline.review(obj, context([a100_40()]))
    if result.allowed:
        assert jsonpatch.apply_patch(obj, result.patch) == result.object


@pytest.mark.parametrize("name", ["core.v1.Pod.json", *WORKLOAD_FILES.values()])
def test_api_fixtures_pass_through(name):
    import json

    obj = json.loads((FIXTURES / name).read_text())
    result = pipeline.review(obj, context([a100_40()]))
    assert result.allowed or result.reason.startswith(("MIG", "CUDA", "Spot")), result.message


# ---------------------------------------------------------------------------------------------------------------
# Taints keyed by nvidia.com/gpu: a pod converted to nvidia.com/mig-<p> no longer gets that toleration from
# ExtendedResourceToleration, so the conversion carries it over where the chosen nodes carry the taint.


GPU_TAINT = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_conversion_keeps_the_gpu_taint_toleration_its_gpu_request_had():
    nodes = [mixed_node("n0", A100_80, {"3g.40gb": 16}, "a100-spot", 81920, taints=GPU_TAINT)]
    obj = workload("Deployment", frac("0.5"))
    result = review(obj, nodes)
    assert result.allowed, result.message
    spec = template_of(result.object)["spec"]
    assert resources_of(result.object) == mig_limits("3g.40gb")
    assert spec["tolerations"].count(GPU_TOLERATION) == 1
    assert spec["tolerations"][: len(template_of(obj)["spec"].get("tolerations", []))] == template_of(obj)["spec"].get(
        "tolerations", []
    ), "the user's tolerations stay first and unchanged"
    _, again = mutate_twice(obj, nodes)
    assert again == []


def test_bare_pod_with_the_plugins_toleration_gets_no_duplicate():
    nodes = [mixed_node("n0", A100_80, {"3g.40gb": 16}, "a100-spot", 81920, taints=GPU_TAINT)]
    obj = frac("0.5")
    obj["spec"]["tolerations"] = [dict(GPU_TOLERATION)]  # ExtendedResourceToleration ran before the webhook
    result = review(obj, nodes)
    assert result.allowed and resources_of(result.object) == mig("3g.40gb")
    assert result.object["spec"]["tolerations"] == [GPU_TOLERATION]


def test_no_gpu_toleration_where_the_nodes_have_no_gpu_taint():
    nodes = [mixed_node("n0", A100_80, {"3g.40gb": 16}, "a100", 81920)]
    result = review(frac("0.5"), nodes)
    assert result.allowed and "tolerations" not in result.object["spec"]


def test_other_taints_still_need_the_users_toleration():
    nodes = [
        mixed_node(
            "n0",
            A100_80,
            {"3g.40gb": 16},
            "a100-spot",
            81920,
            taints=[*GPU_TAINT, {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}],
        )
    ]
    result = review(workload("Deployment", frac("0.5")), nodes)
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert "dedicated=ml:NoSchedule" in result.message


# ---------------------------------------------------------------------------------------------------------------
# The patched objects are valid Kubernetes objects (schema) with whole-number GPU resources


def _minimal(kind: str, template: dict[str, Any]) -> dict[str, Any]:
    template = {"metadata": {"labels": {"app": "x"}, **template["metadata"]}, "spec": template["spec"]}
    template["metadata"].pop("name", None)
    template["metadata"].pop("namespace", None)
    spec: dict[str, Any] = {"selector": {"matchLabels": {"app": "x"}}, "template": template}
    api = "apps/v1"
    if kind == "StatefulSet":
        spec["serviceName"] = "x"
    if kind in ("Job", "CronJob"):
        api = "batch/v1"
        template["spec"]["restartPolicy"] = "Never"
        spec = {"template": template}
    if kind == "CronJob":
        spec = {"schedule": "0 * * * *", "jobTemplate": {"spec": spec}}
    return {"apiVersion": api, "kind": kind, "metadata": {"name": "x", "namespace": "ml"}, "spec": spec}


@pytest.mark.parametrize("kind", ["Pod", *sorted(WORKLOAD_FILES)])
def test_patched_objects_are_schema_valid(kind):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    base = pod(container("a", limits={GPU: "0.5"}), container("b", limits={GPU: "250m"}, requests={GPU: "250m"}))
    obj = base if kind == "Pod" else _minimal(kind, base)
    result = review(obj, [a100_40()])
    assert result.allowed, result.message
    kubernetes_validate.validate(result.object, "1.34.0", strict=True)
    spec = template_of(result.object)["spec"]
    for c in spec["containers"]:
        for values in c["resources"].values():
            assert all(v == "1" for k, v in values.items() if k.startswith("nvidia.com/")), values
        # a request where one was asked (a pod's are defaulted from its limits before the webhook sees it)
        if c["name"] == "b" or kind == "Pod":
            assert c["resources"]["limits"] == c["resources"]["requests"]
        else:
            assert "requests" not in c["resources"], "a template's limits alone asked: no request no manifest has"


@pytest.mark.parametrize(
    ("nodes", "mig_settings", "event"),
    [
        pytest.param([a100_40()], {}, True, id="mixed"),
        pytest.param([single_node("s", A100_40, "3g.20gb", 2, "half")], {}, True, id="single"),
        pytest.param([gke_node("g", "nvidia-tesla-a100", "3g.20gb", 2, "half")], {}, True, id="gke"),
        pytest.param([whole_node("w", A100_80, 8, "whole")], {"fallback": "whole"}, False, id="whole-is-not-mig"),
    ],
)
def test_mig_assigned_event_only_for_mig_devices(nodes, mig_settings, event):
    s = settings(**mig_settings)
    result = review(frac("0.5"), nodes, s)
    assert result.allowed, result.message
    events = [e for e in result.outcome.events if e.reason == "MIGAssigned"]
    assert bool(events) is event


def test_no_state_line_for_a_plain_whole_gpu():
    obj = pod(
        container(limits={GPU: "1"}),
        annotations={"gpu-admission.io/mig": "trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-7g.40gb (x, pool y)"},
    )
    assert mig_annotation(review(obj, [a100_40(gpus=1)]).object) is None


def test_refusal_on_gpu_tainted_whole_gpu_nodes_names_them_and_what_to_change():
    # The pod's nodeSelector picks GPU nodes (tainted nvidia.com/gpu, as GKE/OKE/DOKS do) that offer no MIG;
    # the MIG pool it cannot reach is named, and so is the change that would let it.
    l4 = whole_node("l4", "NVIDIA-L4", 1, "inference")
    l4["spec"]["taints"] = GPU_TAINT
    nodes = [l4, mixed_node("m0", A100_80, {"3g.40gb": 2}, "a100", 81920)]
    obj = frac("0.5")
    obj["spec"]["nodeSelector"] = {POOL: "inference"}
    obj["spec"]["tolerations"] = [dict(GPU_TOLERATION)]
    result = review(obj, nodes)
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert "Eligible GPU nodes offer no MIG profiles: pool inference" in result.message
    assert "No GPU node matches" not in result.message
    # what keeps it off that pool, not every taint the pool has (found by a review of provider journeys)
    assert f"MIG pools this pod cannot use: a100 (3g.40gb; its nodeSelector {POOL}: inference)." in result.message
    assert "Change the pod's nodeSelector, node affinity or tolerations" in result.message


def test_template_with_a_memory_request_nothing_covers_warns_with_the_largest_offer():
    # Templates keep memory requests (Kubernetes accepts them); the warning says now what the pods will be told.
    obj = workload("Deployment", memreq("300Gi"))
    result = review(obj, [a100_40()])
    assert result.allowed and resources_of(result.object)["limits"] == {MEM: "300Gi"}
    (warning,) = [w for w in result.warnings if "300Gi" in w]
    assert "largest offered is 7g.40gb" in warning and "ask for less" in warning and len(warning) < 120


@pytest.mark.parametrize(
    ("node", "second", "resource"),
    [
        pytest.param(
            mixed_node("a0", A100_40, {"3g.20gb": 1}, "a100", 40960), {GPU: "0.5"}, "nvidia.com/mig-3g.20gb", id="mixed"
        ),
        pytest.param(single_node("s0", A100_40, "3g.20gb", 1, "a100"), {GPU: "0.5"}, GPU, id="single"),
        pytest.param(
            mixed_node("a0", A100_40, {"3g.20gb": 1}, "a100", 40960),
            {"nvidia.com/mig-3g.20gb": "1"},
            "nvidia.com/mig-3g.20gb",
            id="beside-an-explicit-device",
        ),
    ],
)
def test_too_few_devices_on_a_node_for_the_whole_pod_is_said_so(node, second, resource):
    """The pool offers the profile, but fewer a node than the pod's containers need together: the refusal says
    that, not that the pool offers no MIG or that the pod's selectors keep it off the pool."""
    obj = pod(container("a", limits={GPU: "0.5"}), container("b", limits=second))
    result = review(obj, [node])
    assert not result.allowed and result.reason == "MIGNoProfile"
    msg = result.message
    assert f"Pool a100 offers 3g.20gb, 1 a node, but with its other containers, this pod would need 2 {resource}" in msg
    assert "offer no MIG profiles" not in msg and "cannot use (selectors" not in msg, msg
    assert "Split the containers into pods of their own" in msg


@pytest.mark.parametrize(
    ("asks", "offers", "need"),
    [
        pytest.param(["0.5", "0.5", "0.5"], {"3g.40gb": 1, "1g.10gb": 4}, 3, id="three-of-one-a-node"),
        pytest.param(["0.5", "0.5", "0.5", "0.5"], {"3g.40gb": 2, "1g.10gb": 4}, 4, id="four-of-two-a-node"),
        pytest.param(["0.5", "0.5", "0.1"], {"3g.40gb": 1, "1g.10gb": 4}, 2, id="a-smaller-profile-covers-one"),
        pytest.param(["0.5", "0.5", "0.5"], {"3g.40gb": 1}, 3, id="no-smaller-profile-offered"),
    ],
)
def test_too_few_devices_on_a_node_counts_every_container_of_the_pod(
    asks: list[str], offers: dict[str, int], need: int
) -> None:
    """The pod's total: the containers still to be converted count too (three 0.5 asks, one 3g.40gb a node, were
    told 'would need 2', the containers converted before the one refused; a review of MIG). One that a smaller
    profile offered there covers takes that one, and is not counted."""
    nodes = [mixed_node(f"n{i}", A100_80, offers, "a80", 81920) for i in range(2)]
    obj = pod(*[container(name, limits={GPU: value}) for name, value in zip("abcd", asks, strict=False)])
    result = review(obj, nodes)
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert (
        f" Pool a80 offers 3g.40gb, {offers['3g.40gb']} a node, but with its other containers, this pod would need"
        f" {need} nvidia.com/mig-3g.40gb on one node. Split the containers into pods of their own"
    ) in result.message, result.message


def test_too_few_devices_is_said_once_a_pool() -> None:
    """A pool whose nodes come in two shapes (one 3g.40gb a node; two beside a 1g.10gb the 0.1 takes) is one line,
    with the larger count: it was said twice, 'would need 4' and 'would need 3' (a review of MIG)."""
    nodes = [
        mixed_node("n0", A100_80, {"3g.40gb": 1}, "a80", 81920),
        mixed_node("n1", A100_80, {"3g.40gb": 2, "1g.10gb": 1}, "a80", 81920),
    ]
    asks = {"a": "0.5", "b": "0.5", "c": "0.5", "d": "0.1"}
    result = review(pod(*(container(n, limits={GPU: v}) for n, v in asks.items())), nodes)
    assert not result.allowed and result.reason == "MIGNoProfile", result.message
    assert result.message.count("Pool a80 offers") == 1, result.message
    assert (
        " Pool a80 offers 3g.40gb, 1 a node, but with its other containers, this pod would need 4"
        " nvidia.com/mig-3g.40gb on one node. Split the containers"
    ) in result.message, result.message


@pytest.mark.parametrize(
    ("offers", "asks", "blocker", "advice"),
    [
        pytest.param(
            {"3g.40gb": 1},
            {"w": {GPU: "1"}, "a": {GPU: "0.5"}, "b": {GPU: "0.5"}},
            "a80 (3g.40gb; container w (nvidia.com/gpu 1) asks whole GPUs, none offered there)",
            " Run the whole-GPU containers in a pod of their own",
            id="a-whole-gpu-not-offered",
        ),
        pytest.param(
            {"7g.80gb": 2, "4g.40gb": 1},
            {"a": {GPU: "0.75"}, "b": {GPU: "0.75"}, "c": {MEM: "20Gi"}, "d": {"nvidia.com/mig-1g.10gb": "1"}},
            "a80 (4g.40gb, 7g.80gb; its other containers' nvidia.com/mig-1g.10gb, not offered there)",
            " Run the containers that ask nvidia.com/mig-1g.10gb in a pod of their own",
            id="a-named-profile-not-offered",
        ),
    ],
)
def test_too_few_devices_is_not_said_of_a_pool_the_pods_other_resources_keep_it_off(
    offers: dict[str, int], asks: dict[str, dict[str, str]], blocker: str, advice: str
) -> None:
    """A pool that lacks what another container asks (a whole GPU on nodes whose GPUs are all MIG, a MIG profile it
    does not offer) is out of reach whatever the count: the refusal names that blocker and its advice, not a number
    of devices the pod would need there, which the count's check of the one device had said (and, for c: 20Gi, a
    count of the 7g.80gb that a and b take, not of the 4g.40gb c would take; a review of MIG)."""
    nodes = [mixed_node(f"n{i}", A100_80, offers, "a80", 81920) for i in range(2)]
    result = review(pod(*(container(name, limits=limits) for name, limits in asks.items())), nodes)
    assert not result.allowed and result.reason == "MIGNoProfile", result.message
    assert "would need" not in result.message, result.message
    assert f"MIG pools this pod cannot use: {blocker}.{advice}" in result.message, result.message


@pytest.mark.parametrize("per_node", [1, 2])
def test_a_whole_gpu_beside_fractions_on_a_single_strategy_pool_is_no_count_of_devices(per_node: int) -> None:
    """There every nvidia.com/gpu is a MIG device: the whole GPU would get a slice however many a node has, so the
    refusal says that, not a number of devices that counts the whole GPU as one (one a node: 'would need 2'; a
    review of MIG found 'would need 3' with two a node once the waiting containers were counted)."""
    nodes = [single_node(f"s{i}", A100_80, "3g.40gb", per_node, "sp") for i in range(2)]
    obj = pod(*(container(n, limits={GPU: v}) for n, v in (("a", "1"), ("b", "0.5"), ("c", "0.5"))))
    result = review(obj, nodes)
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert "would need" not in result.message, result.message
    assert (
        "Pool sp (single, 3g.40gb) would cover it, but there every nvidia.com/gpu is a MIG device, and container a"
        " (nvidia.com/gpu 1) would get a MIG slice there"
    ) in result.message, result.message
    assert "Run the whole-GPU containers in a pod of their own" in result.message


def test_too_few_devices_over_many_pools_is_counted_within_the_review_budget() -> None:
    """Counting every waiting container stays within a review's CPU: 16 asks of 0.5 over 450 one-node pools (one or
    two 3g.40gb a node) were 'too complex to review' when each refusal counted them anew (a review of MIG)."""
    nodes = [mixed_node(f"n{i}", A100_80, {"3g.40gb": 1 + i % 2}, f"p{i}", 81920) for i in range(450)]
    obj = pod(*[container(f"c{i}", limits={GPU: "0.5"}) for i in range(16)])
    result = review(obj, nodes)
    assert not result.allowed and result.reason == "MIGNoProfile", result.message
    assert "this pod would need 16 nvidia.com/mig-3g.40gb on one node" in result.message, result.message


def test_the_largest_offer_is_the_most_memory_not_the_most_compute():
    """A 4g.20gb has more compute slices than a 3g.40gb, half its memory: for a memory request the largest offer
    is the 3g.40gb."""
    nodes = [
        mixed_node("n40", A100_40, {"4g.20gb": 1}, "a100-40", 40960),
        mixed_node("n80", A100_80, {"3g.40gb": 2}, "a100-80", 81920),
    ]
    result = review(workload("Deployment", memreq("50Gi")), nodes)
    (warning,) = [w for w in result.warnings if "50Gi" in w]
    assert "largest offered is 3g.40gb" in warning, warning


@pytest.mark.parametrize("value", [2.6320846924304052e-136, "1e-3", 0.125], ids=["float-repr", "exponent", "float"])
def test_any_quantity_spelling_is_idempotent(value):
    # Found by the fuzzer: the line written on the first pass must be recognised on the next, whatever the spelling.
    obj = pod({"resources": {"limits": {GPU: value}}})
    nodes = [single_node("s0", A100_40, "1g.5gb", 7, "a100-single")]
    first, again = mutate_twice(obj, nodes)
    assert first.allowed and again == []


def test_a_node_tainted_for_another_extended_resource_the_pod_asks_for_still_counts() -> None:
    """ExtendedResourceToleration gives a pod asking for rdma/hca a toleration for the rdma/hca taint: MIG's
    choice must count the node the pod can land on, as the scheduler will."""
    taint = {"key": "rdma/hca", "value": "present", "effect": "NoSchedule"}
    node = a100_40(taints=[taint])
    node["status"]["allocatable"]["rdma/hca"] = "4"
    result = review(pod(container(limits={GPU: "0.5", "rdma/hca": "1"})), [node])
    assert result.allowed, result.message
    assert resources_of(result.object)["limits"] == {"nvidia.com/mig-3g.20gb": "1", "rdma/hca": "1"}


def test_single_strategy_with_time_slicing_is_offered():
    # GFD names a time-sliced MIG device's product <product>-MIG-<profile>-SHARED (NVIDIA/k8s-device-plugin
    # internal/lm/)
    node = single_node("s0", A100_40, "3g.20gb", 2, "half", 19968)
    node["metadata"]["labels"]["nvidia.com/gpu.product"] += "-SHARED"
    node["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "4"
    node["status"]["allocatable"]["nvidia.com/gpu"] = "8"
    result = review(frac("500m"), [node])
    assert result.allowed, result.message
    assert result.object["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": f"{A100_40}-MIG-3g.20gb-SHARED"}


@pytest.mark.parametrize("value", ["0.25 ", " 0.25", "0.25\t", "0.2500000000000000000000000000000000000000000001"])
def test_a_fraction_annotation_as_written_gives_a_stable_line(value):
    nodes = [mixed_node("m0", A100_40, {"1g.5gb": 7, "1g.10gb": 4, "3g.20gb": 2}, "a100")]
    obj = pod(container(limits={}), annotations={"gpu-admission.io/gpu-fraction": value})
    first, second = mutate_twice(obj, nodes)
    assert second == []
    assert (mig_annotation(first.object) or "").startswith(f"trainer: gpu-admission.io/gpu-fraction {value.strip()} ->")


# ---------------------------------------------------------------------------------------------------------------
# The lines name where the final pod lands (found by the MIG review: they named where each choice was made)


def test_the_line_names_the_pools_left_after_cuda_steering_and_a_second_pass_keeps_it():
    """Two A100 pools offer 3g.20gb; the cuda policy, run after this one, keeps the pod off the pool whose driver is
    too old for CUDA 12.4. The line said both pools, so the second pass (reinvocation) rewrote it "as found on the
    object" and the validating webhook, finding it unconfirmed, sent no MIGAssigned Event."""
    nodes = [
        mixed_node(
            "old-0", A100_40, dict(A100_40_ALL), "a100-old", 40960, A100_40_USABLE, extra_labels=driver("525.105.17")
        ),
        mixed_node(
            "new-0", A100_40, dict(A100_40_ALL), "a100-new", 40960, A100_40_USABLE, extra_labels=driver("550.54.15")
        ),
    ]
    s = replace(settings(), cuda=CudaSettings(mode="enforce"))
    obj = pod(container(limits={GPU: "0.5"}, image=CUDA_124_IMAGE))
    first, second = mutate_twice(obj, nodes, s)
    line = f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb ({A100_40}, pool a100-new)"
    assert mig_annotation(first.object) == line
    assert first.audit["mig"] == line
    assert second == []
    result = review(obj, nodes, s)
    assert result.allowed, result.message
    assert [e.message for e in result.outcome.events if e.reason == "MIGAssigned"] == [f"MIG devices: {line}"]


def test_an_earlier_containers_line_names_the_pool_a_later_container_narrowed_it_to():
    """The first container's 1g.10gb is on both pools; the second's 7g.40gb only on the A100-40GB pool, so the pod
    lands there: both lines say so, whatever order the containers come in."""
    nodes = [
        mixed_node("a0", A100_40, {"1g.10gb": 4, "7g.40gb": 1}, "a100-40", 40960),
        mixed_node("a1", A100_80, {"1g.10gb": 7, "7g.80gb": 1}, "a100-80", 81920),
    ]
    where = f"({A100_40}, pool a100-40)"
    for order in ((0, 1), (1, 0)):
        both = [container("small", limits={MEM: "8Gi"}), container("large", limits={GPU: "0.5"})]
        obj = pod(*(both[i] for i in order))
        first, second = mutate_twice(obj, nodes)
        assert resources_of(first.object, "small")["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
        assert resources_of(first.object, "large")["limits"] == {"nvidia.com/mig-7g.40gb": "1"}
        lines = (mig_annotation(first.object) or "").split("; ")
        assert len(lines) == 2 and all(line.endswith(where) for line in lines), lines
        assert second == []


@pytest.mark.parametrize(
    ("limits", "held"),
    [
        pytest.param({"nvidia.com/mig-1g.5gb": "1"}, "nvidia.com/mig-1g.5gb", id="mig"),
        pytest.param({"nvidia.com/gpu.shared": "1"}, "nvidia.com/gpu.shared 1", id="shared"),
    ],
)
@pytest.mark.parametrize("kind", ["Pod", "Deployment"])
def test_a_fraction_annotation_beside_a_device_of_its_own_is_not_dropped_silently(limits, held, kind):
    obj = pod(container(limits=limits), annotations={"gpu-admission.io/gpu-fraction": "0.5"})
    result = review(obj if kind == "Pod" else workload(kind, obj), [a100_40()])
    assert result.allowed and result.patch == []
    words = f"trainer: gpu-admission.io/gpu-fraction 0.5 ignored, it has {held}: remove one of the two"
    assert words in result.warnings, result.warnings
    # A pod the webhook converted from the annotation is not warned about on a second pass.
    converted = review(pod(container(), annotations={"gpu-admission.io/gpu-fraction": "0.5"}), [a100_40()])
    assert not review(converted.object, [a100_40()]).warnings


@pytest.mark.parametrize("kind", ["Pod", "Deployment"])
def test_a_fraction_container_without_a_fraction_is_not_dropped_silently(kind):
    obj = pod(container(), annotations={"gpu-admission.io/gpu-fraction-container": "trainer"})
    result = review(obj if kind == "Pod" else workload(kind, obj), [a100_40()])
    assert result.allowed and result.patch == []
    words = "gpu-admission.io/gpu-fraction-container 'trainer' is set without gpu-admission.io/gpu-fraction: add the"
    words += " fraction"
    assert words in result.warnings, result.warnings


def test_a_fraction_annotation_naming_an_init_container_says_so():
    obj = pod(
        container("main"),
        init=[container("setup")],
        annotations={"gpu-admission.io/gpu-fraction": "0.5", "gpu-admission.io/gpu-fraction-container": "setup"},
    )
    result = review(obj, [a100_40()])
    assert not result.allowed and result.reason == "MIGUnknownContainer"
    assert "names init container 'setup'" in result.message, result.message
    assert "does not have" not in result.message
    assert "To fix, name one of the containers, or ask for the fraction in the init container's own limits" in (
        result.message
    )
    assert "(nvidia.com/gpu: 0.5)" in result.message


@pytest.mark.parametrize("kind", sorted(WORKLOAD_FILES))
def test_workload_template_memory_in_requests_only_is_denied_with_the_fix(kind):
    # Kubernetes refuses an extended resource without a limit in a pod template ("Limit must be set for non
    # overcommitable resources"), and the webhook leaves memory requests in templates: say so and what to write.
    result = review(workload(kind, pod(container(requests={MEM: "10Gi"}))), [a100_40()])
    assert not result.allowed and result.reason == "MIGRequestWithoutLimit"
    for words in ("container trainer", "gpu-admission.io/gpu-memory 10Gi in resources.requests only", kind):
        assert words in result.message, result.message
    assert "To fix, set it in resources.limits (gpu-admission.io/gpu-memory: 10Gi)" in result.message
    # In limits (and requests alike) the template stays; a bare pod with it in requests only is converted.
    both = pod(container(limits={MEM: "10Gi"}, requests={MEM: "10Gi"}))
    assert review(workload(kind, both), [a100_40()]).allowed
    assert resources_of(review(pod(container(requests={MEM: "10Gi"})), [a100_40()]).object) == mig("1g.10gb")


def test_workload_template_memory_with_no_mig_node_does_not_say_ask_for_less():
    result = review(workload("Deployment", memreq("10Gi")), [whole_node("w", A100_80, 8, "whole")])
    assert result.allowed and result.patch == []
    words = "trainer: gpu-admission.io/gpu-memory 10Gi: no eligible node offers MIG now, so its pods are refused"
    assert words in result.warnings, result.warnings


LONG_POOL = "a100-mig-3g40gb-single"


@pytest.mark.parametrize(
    ("nodes", "pools", "name"),
    [
        pytest.param([single_node("s-0", A100_80, "3g.40gb", 16, "a100", 81920)], [], "a100", id="running"),
        pytest.param(
            [_EKS_CPU], [_single_pool("a100", "karpenter.sh/nodepool", {"3g.40gb": 16})], "a100", id="at-zero"
        ),
        pytest.param([single_node("s-0", A100_80, "3g.40gb", 16, LONG_POOL, 81920)], [], LONG_POOL, id="long-name"),
    ],
)
def test_workload_template_memory_beside_a_whole_gpu_names_the_pool_that_would_hold_it(
    nodes: list[dict[str, Any]], pools: list[PoolSettings], name: str
) -> None:
    """A Deployment whose gpu-memory ask only single-strategy pools hold, beside a container asking a whole GPU
    (every nvidia.com/gpu there is a MIG device): each pod is refused, named the pool and why; the Deployment was
    told no eligible node offers MIG now (a review of MIG). It is told the pool and the reason too."""
    two = pod(container(limits={MEM: "30Gi"}), container("side", limits={GPU: "1"}))
    refused = review(two, nodes, settings(pools))
    assert not refused.allowed and f"Pool {name} (single, 3g.40gb) would cover it" in refused.message
    result = review(workload("Deployment", two), nodes, settings(pools))
    assert result.allowed
    # the pool's whole name within the warning's 119 characters (a review: a name past 11 characters was cut)
    words = f"trainer: {MEM} 30Gi: held by pool {name}, not beside whole GPUs: pods refused"
    assert result.warnings == [words]


# ---------------------------------------------------------------------------------------------------------------
# The order of the containers


def split_models() -> list[dict[str, Any]]:
    """An A100-40GB pool with only 1g.10gb (2/8) and an A100-80GB pool with 1g.20gb (2/8) and 3g.40gb (4/8)."""
    return [
        mixed_node("n40", A100_40, {"1g.10gb": 4}, "a100-40", 40960),
        mixed_node("n80", A100_80, {"1g.20gb": 4, "3g.40gb": 2}, "a100-80", 81920),
    ]


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")], ids=["small-first", "large-first"])
def test_the_order_of_the_containers_does_not_decide_admission(order):
    # Taken in turn, a: 0.25 first took the A100-40GB's 1g.10gb (the smallest cover), and b: 0.5 then found no 4/8
    # profile on that model: the pod was denied, while b, a fit both on the A100-80GB.
    asks = {"a": "0.25", "b": "0.5"}
    obj = pod(*(container(name, limits={GPU: asks[name]}) for name in order))
    result = review(obj, split_models())
    assert result.allowed, result.message
    assert resources_of(result.object, "a") == mig("1g.20gb")
    assert resources_of(result.object, "b") == mig("3g.40gb")
    lines = {
        "a": f"a: nvidia.com/gpu 0.25 -> nvidia.com/mig-1g.20gb ({A100_80}, pool a100-80)",
        "b": f"b: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.40gb ({A100_80}, pool a100-80)",
    }
    assert mig_annotation(result.object) == "; ".join(lines[name] for name in order)
    assert result.warnings == []
    assert mutate_twice(obj, split_models())[1] == []


def test_a_refusal_names_the_other_resource_that_keeps_a_pod_off_a_mig_pool():
    """A sidecar asking nvidia.com/gpu.shared, which the MIG pool does not offer: the refusal said its node
    affinity (it had none) kept it off, and told it to wait for the pool's nodes to take pods."""
    obj = pod(container("a", limits={GPU: "0.5"}), container("b", limits={"nvidia.com/gpu.shared": "1"}))
    result = review(obj, [mixed_node("m1", A100_80, {"3g.40gb": 2}, "a100")])
    assert not result.allowed
    assert result.message.endswith(
        " MIG pools this pod cannot use: a100 (3g.40gb; its other containers' nvidia.com/gpu.shared, not offered"
        " there). Run the containers that ask nvidia.com/gpu.shared in a pod of their own, or ask for a whole GPU"
        " (nvidia.com/gpu: 1)."
    ), result.message


def test_a_refusal_advises_a_pod_of_their_own_where_every_mig_pool_lacks_the_other_resource_some_out_of_reach():
    """A tainted spot pool lacks nvidia.com/gpu.shared too: the refusal advised tolerations (or spot) to reach it,
    where it would refuse the pod all the same."""
    obj = pod(container("a", limits={GPU: "0.5"}), container("b", limits={"nvidia.com/gpu.shared": "1"}))
    spot_taint = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
    nodes = [
        mixed_node("m1", A100_80, {"3g.40gb": 2}, "a100"),
        mixed_node("m2", A100_80, {"3g.40gb": 2}, "a100-spot", taints=[spot_taint]),
    ]
    result = review(obj, nodes)
    assert not result.allowed
    assert result.message.endswith(
        " Run the containers that ask nvidia.com/gpu.shared in a pod of their own, or ask for a whole GPU"
        " (nvidia.com/gpu: 1)."
    ), result.message


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")], ids=["small-first", "large-first"])
def test_the_order_of_the_containers_does_not_decide_admission_under_the_single_strategy(order):
    # The first pass's product nodeSelector (a on the 1g.10gb nodes) is undone before the other order is tried.
    nodes = [
        single_node("s40", A100_40, "1g.10gb", 4, "a100-40", 9856),
        single_node("s80", A100_80, "3g.40gb", 2, "a100-80", 40448),
    ]
    asks = {"a": "0.25", "b": "0.5"}
    result = review(pod(*(container(name, limits={GPU: asks[name]}) for name in order)), nodes)
    assert result.allowed, result.message
    assert result.object["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": f"{A100_80}-MIG-3g.40gb"}
    for name in order:
        assert resources_of(result.object, name) == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}


def test_a_pod_no_order_fits_is_refused_as_its_own_order_refuses_it():
    # c: 0.75 fits nowhere, whatever the order; the refusal is the one the containers' own order gives.
    obj = pod(*(container(n, limits={GPU: v}) for n, v in (("a", "0.25"), ("b", "0.5"), ("c", "0.75"))))
    result = review(obj, split_models())
    assert not result.allowed and result.reason == "MIGNoProfile"
    offered = " Eligible nodes offer: pool a100-40 (NVIDIA-A100-SXM4-40GB, mixed): 1g.10gb (2/8 memory, 1/7 compute)."
    advice = " Ask for at most what a profile offered here holds, or for a whole GPU (nvidia.com/gpu: 1)."
    elsewhere = (
        " MIG pools this pod cannot use: a100-80 (1g.20gb, 3g.40gb; its other containers' nvidia.com/mig-1g.10gb,"
        " not offered there)."
    )
    assert result.message == "\n".join(
        [
            "container b asks for nvidia.com/gpu 0.5; no eligible node offers a MIG profile whose memory share is"
            " at least 0.5." + offered + elsewhere + advice,
            # the A100-80GB's 3g.40gb holds 0.5, not 0.75: no use reaching it
            "container c asks for nvidia.com/gpu 0.75; no eligible node offers a MIG profile whose memory share is"
            " at least 0.75." + offered + advice,
        ]
    )
    assert result.warnings == []


def test_another_order_is_tried_in_a_workload_template_too():
    obj = workload("Deployment", pod(container("a", limits={GPU: "0.25"}), container("b", limits={GPU: "0.5"})))
    result = review(obj, split_models())
    assert result.allowed, result.message
    assert resources_of(result.object, "a") == mig_limits("1g.20gb")
    assert resources_of(result.object, "b") == mig_limits("3g.40gb")


# ---------------------------------------------------------------------------------------------------------------
# A whole GPU and a MIG device in one container


@pytest.mark.parametrize("kind", ["Pod", "Deployment"])
@pytest.mark.parametrize(
    ("limits", "init", "warning"),
    [
        pytest.param(
            {GPU: "1", "nvidia.com/mig-1g.10gb": "1"},
            False,
            "trainer: nvidia.com/gpu 1 and nvidia.com/mig-1g.10gb give it a whole GPU and a MIG device: remove one of"
            " them",
            id="one-gpu",
        ),
        pytest.param(
            {GPU: 2, "nvidia.com/mig-3g.40gb": 1},
            True,
            "trainer: nvidia.com/gpu 2 and nvidia.com/mig-3g.40gb give it whole GPUs and a MIG device: remove one of"
            " them",
            id="two-gpus-init",
        ),
    ],
)
def test_a_whole_gpu_and_a_mig_device_in_one_container_is_warned(limits, init, warning, kind):
    # The mixed strategy offers both resources side by side and gives the container both; seldom what is meant.
    node = mixed_node("n0", A100_80, {"1g.10gb": 7, "3g.40gb": 2}, "a100", 81920, gpus=4)
    asking = container(limits=limits)
    obj = pod(container("app"), init=[asking]) if init else pod(asking)
    obj = obj if kind == "Pod" else workload(kind, obj)
    result = review(obj, [node])
    assert result.allowed and result.patch == []
    assert result.warnings == [warning]


@pytest.mark.parametrize(
    "limits",
    [{GPU: "1"}, {"nvidia.com/mig-1g.10gb": "1"}, {GPU: "0", "nvidia.com/mig-1g.10gb": "1"}],
    ids=["whole-gpu", "mig-device", "zero-gpus"],
)
def test_a_whole_gpu_or_a_mig_device_alone_is_not_warned(limits):
    node = mixed_node("n0", A100_80, {"1g.10gb": 7}, "a100", 81920, gpus=4)
    assert review(pod(container(limits=limits)), [node]).warnings == []


# ---------------------------------------------------------------------------------------------------------------
# An ask far below the profile it gets


@pytest.mark.parametrize(
    ("limits", "coverage", "warning"),
    [
        pytest.param({GPU: "1e-9"}, "memory", "nvidia.com/gpu 1e-9 gets 1g.5gb (1/8 memory)", id="1e-9"),
        pytest.param({GPU: "30m"}, "memory", "nvidia.com/gpu 30m gets 1g.5gb (1/8 memory)", id="0.03"),
        pytest.param({GPU: "0.03"}, "compute", "nvidia.com/gpu 0.03 gets 1g.5gb (1/7 compute)", id="compute"),
        pytest.param({GPU: "0.03"}, "both", "nvidia.com/gpu 0.03 gets 1g.5gb (1/8 memory)", id="both"),
        pytest.param({MEM: "20Mi"}, "memory", "gpu-admission.io/gpu-memory 20Mi gets 1g.5gb (5GB)", id="20Mi"),
        pytest.param({MEM: "1Gi"}, "memory", "gpu-admission.io/gpu-memory 1Gi gets 1g.5gb (5GB)", id="1Gi"),
    ],
)
def test_an_ask_far_below_its_profile_is_warned(limits, coverage, warning):
    # 1e-9 of a GPU, or 20Mi meant as 20Gi, got the smallest profile without a word.
    result = review(pod(container(limits=limits)), [a100_40()], settings(coverage=coverage))
    assert result.allowed, result.message
    fix = {"memory": "check it or ask for 0.125", "compute": "check it or ask for 0.142"}.get(coverage, "")
    fix = "check the unit or ask for 5Gi" if MEM in limits else fix or "check it or ask for 0.125"
    assert result.warnings == [f"trainer: {warning}, over 4x the ask: {fix}"]


def test_an_annotation_far_below_its_profile_is_warned():
    obj = pod(container(), annotations={"gpu-admission.io/gpu-fraction": "1e-9"})
    assert review(obj, [a100_40()]).warnings == [
        "trainer: gpu-admission.io/gpu-fraction 1e-9 gets 1g.5gb (1/8 memory), over 4x the ask: check it or ask for"
        " 0.125"
    ]


@pytest.mark.parametrize(
    ("limits", "coverage"),
    [
        ({GPU: "0.1"}, "memory"),  # 1/8: 1.25x
        ({GPU: "0.3"}, "memory"),  # 4/8: 1.7x
        ({GPU: "0.125"}, "both"),
        ({GPU: "0.0625"}, "memory"),  # 1/8: 2x
        ({MEM: "2Gi"}, "memory"),  # 5GB: 2.5x
        ({MEM: "16Gi"}, "memory"),  # 3g.20gb
    ],
    ids=["0.1", "0.3", "0.125-both", "0.0625", "2Gi", "16Gi"],
)
def test_plain_rounding_up_is_not_warned(limits, coverage):
    result = review(pod(container(limits=limits)), [a100_40()], settings(coverage=coverage))
    assert result.allowed and result.warnings == [], result.warnings


# ---------------------------------------------------------------------------------------------------------------
# Warnings for a container name of 63 characters

LONG = "data-loader-" + "x" * 40 + "-worker-0001"  # 63 characters, the most Kubernetes allows


@pytest.mark.parametrize(
    ("obj", "nodes", "mig_settings", "advice"),
    [
        pytest.param(
            pod(container(LONG, limits={GPU: "1e-9"})),
            None,
            {},
            "over 4x the ask: check it or ask for 0.125",
            id="oversized",
        ),
        pytest.param(
            pod(container(LONG, limits={GPU: "1", "nvidia.com/mig-1g.10gb": "1"})),
            None,
            {},
            "give it a whole GPU and a MIG device: remove one of them",
            id="whole-and-mig",
        ),
        pytest.param(
            pod(container(LONG, limits={MEM: "20Gi"})),
            None,
            {},
            "nvidia.com/mig-3g.20gb has 19968 MiB usable, less than the 20Gi asked",
            id="usable",
        ),
        pytest.param(
            pod(
                container(LONG, limits={"nvidia.com/mig-1g.10gb": "1"}),
                annotations={"gpu-admission.io/gpu-fraction": "0.5"},
            ),
            None,
            {},
            "ignored, it has nvidia.com/mig-1g.10gb: remove one of the two",
            id="annotation-beside-a-device",
        ),
        pytest.param(
            pod(container(LONG), annotations={"gpu-admission.io/gpu-fraction-container": LONG}),
            None,
            {},
            "is set without gpu-admission.io/gpu-fraction: add the fraction",
            id="fraction-container-alone",
        ),
        pytest.param(
            workload("Deployment", pod(container(LONG, limits={MEM: "100Gi"}))),
            None,
            {},
            "largest offered is 7g.40gb; ask for less or its pods are refused",
            id="template-too-large",
        ),
        pytest.param(
            workload("Deployment", pod(container(LONG, limits={MEM: "10Gi"}))),
            [whole_node("w", A100_80, 8, "whole")],
            {},
            "no eligible node offers MIG now, so its pods are refused",
            id="template-no-mig",
        ),
        pytest.param(
            pod(container(LONG, limits={GPU: "0.5"})),
            [whole_node("w", A100_80, 8, "whole")],
            {"fallback": "whole"},
            "-> nvidia.com/gpu 1 (whole GPU: no MIG profile covers it)",
            id="fallback",
        ),
        pytest.param(
            pod(container(LONG, limits={GPU: "0.5"})),
            None,
            {"enabled": False},
            "not converted (MIG conversion is off here): ask for a MIG resource",
            id="disabled",
        ),
    ],
)
def test_a_long_container_name_is_shortened_so_the_warning_keeps_its_advice(obj, nodes, mig_settings, advice):
    # Cut at 119 characters, the warning lost what to do once the name took 63 of them.
    nodes = nodes or [a100_40(gpus=2)]
    result = review(obj, nodes, settings(**mig_settings))
    assert len(result.warnings) == 1, result.warnings
    (warning,) = result.warnings
    assert len(warning) <= 119 and warning.endswith(advice), warning
    shortened = re.search(r"([\w-]+)…([\w-]+)", warning)
    assert shortened and LONG not in warning, warning
    head, tail = shortened.groups()
    assert LONG.startswith(head) and LONG.endswith(tail) and min(len(head), len(tail)) >= 4, warning


def test_a_short_container_name_is_kept_whole():
    result = review(pod(container("trainer", limits={GPU: "1e-9"})), [a100_40()])
    assert result.warnings[0].startswith("trainer: nvidia.com/gpu 1e-9 gets")


@pytest.mark.parametrize("steer", [True, False])
def test_a_profile_on_a_pool_whose_driver_runs_the_pods_cuda_comes_first_steering_or_not(steer):
    """1g.10gb covers 0.25 only on the A100-40GB, whose driver (535: CUDA 12.2) is too old for CUDA 12.4; the
    A100-80GB (570) offers 2g.20gb. With cuda.steer off the cuda policy still enforces: the profile it would deny
    must not be chosen (found by a review of the policies together)."""
    old = {"nvidia.com/cuda.driver-version.full": "535.104.05"}
    new = {"nvidia.com/cuda.driver-version.full": "570.124.06"}
    nodes = [
        mixed_node("a40", A100_40, {"1g.10gb": 4, "3g.20gb": 2}, "a100-40", 40960, extra_labels=old),
        mixed_node("a80", A100_80, {"1g.10gb": 7, "2g.20gb": 3}, "a100-80", 81920, extra_labels=new),
    ]
    obj = pod(container(limits={GPU: "0.25"}, image="nvidia/cuda:12.4.1-runtime-ubuntu22.04"))
    s = replace(settings(), cuda=CudaSettings(steer=steer))
    result = review(obj, nodes, s)
    assert result.allowed, result.message
    assert resources_of(result.object) == mig("2g.20gb")


def test_a_template_whose_gpu_is_left_to_its_pods_is_checked_on_its_pods():
    """A Deployment asking gpu-memory: the template keeps the request, so where it would run is not known from it
    (no nvidia.com resource, so not even the GPU taint ExtendedResourceToleration covers): the CUDA check waits for
    its pods, which are converted and then checked. The template was denied, though its pods are admitted (found
    by a review of the policies together)."""
    old = {"nvidia.com/cuda.driver-version.full": "535.104.05"}
    new = {"nvidia.com/cuda.driver-version.full": "570.124.06"}
    taint = [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    nodes = [
        mixed_node("a40", A100_40, {"1g.10gb": 14}, "old-mig", 40960, extra_labels=old),
        mixed_node("a80", A100_80, {"3g.40gb": 4}, "new-mig", 81920, extra_labels=new, taints=taint),
    ]
    s = replace(settings(), cuda=CudaSettings())
    template_pod = pod(container(limits={MEM: "20Gi"}, image="nvidia/cuda:12.4.1-runtime-ubuntu22.04"))
    deployment = review(workload("Deployment", template_pod), nodes, s)
    assert deployment.allowed, deployment.message
    assert template_of(deployment.object)["metadata"]["annotations"]["gpu-admission.io/cuda"].startswith(
        "checked on each pod as it is created"
    )
    created = review(template_pod, nodes, s)
    assert created.allowed and resources_of(created.object) == mig("3g.40gb")
    # the gpu-fraction annotation's template says so too: its container asks for no GPU yet (found by a review of
    # provider journeys: a Job so written got no word of its CUDA check)
    by_annotation = pod(
        container("sidecar", limits={}, image="busybox"),
        container("eval", limits={}, image="nvidia/cuda:12.4.1-runtime-ubuntu22.04"),
        annotations={"gpu-admission.io/gpu-fraction": "0.25", "gpu-admission.io/gpu-fraction-container": "eval"},
    )
    job = review(workload("Job", by_annotation), nodes, s)
    assert job.allowed, job.message
    assert template_of(job.object)["metadata"]["annotations"]["gpu-admission.io/cuda"].startswith(
        "checked on each pod as it is created"
    )


def test_more_asks_than_a_node_can_hold_are_refused_at_once():
    """999 containers of 0.5 took 68 s (each ask's choice checks the others'), the worker answering nothing else;
    containers are capped at pipeline.MAX_CONTAINERS, asks well below that."""
    import time

    from webhook.policies import mig

    node = mixed_node("a0", A100_40, {"3g.20gb": 2}, "a100", 40960)
    many = pod(*(container(f"c{i}", limits={GPU: "0.5"}) for i in range(200)))
    started = time.process_time()
    result = review(many, [node])
    assert time.process_time() - started < 5.0
    assert not result.allowed and result.reason == "MIGTooManyDevices"
    assert result.message.startswith("200 containers ask for a fraction or a memory size of a GPU") and (
        f"more than the {mig.MAX_ASKS} a node can offer at most" in result.message
    )
    at_most = pod(*(container(f"c{i}", limits={GPU: "0.5"}) for i in range(mig.MAX_ASKS)))
    assert review(at_most, [node]).reason != "MIGTooManyDevices"


def test_a_mig_pool_kept_off_by_a_spot_taint_is_named_with_that_taint_only():
    """The refusal listed every taint of the pools it could not use, the GPU's own (which the webhook or
    ExtendedResourceToleration tolerates) among them, and never said a spot taint could be tolerated by annotation
    (found by a review of provider journeys)."""
    spot_taint = {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}
    gpu_taint = {"key": GPU, "value": "present", "effect": "NoSchedule"}
    nodes = [
        whole_node("l4", "NVIDIA-L4", 1, "inference"),
        mixed_node("m0", A100_40, {"3g.20gb": 2}, "a100-spot", 40960, taints=[spot_taint, gpu_taint]),
    ]
    result = review(frac("0.5"), nodes)
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert (
        "MIG pools this pod cannot use: a100-spot (3g.20gb; untolerated taint cloud.google.com/gke-spot=true:NoSchedule"
        " (or annotation gpu-admission.io/spot: tolerate))." in result.message
    ), result.message
    assert "present" not in result.message


def test_a_cordoned_mig_pool_is_said_to_be_so_not_a_taint_to_tolerate() -> None:
    """The only MIG pool is cordoned (a drain): the refusal said "untolerated taint
    node.kubernetes.io/unschedulable:NoSchedule" and told the pod to change its tolerations, which bypasses the drain
    (found by a review of the cluster model)."""
    cordon = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    nodes = [
        whole_node("l4", "NVIDIA-L4", 1, "inference"),
        mixed_node("m0", A100_40, {"3g.20gb": 2}, "a100", 40960, taints=[cordon]),
    ]
    result = review(frac("0.5"), nodes)
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert result.message.endswith(
        "MIG pools this pod cannot use: a100 (3g.20gb; its nodes are cordoned now). Create the pod again once those"
        " pools' nodes take pods (a workload's controller retries by itself), or ask for a whole GPU"
        " (nvidia.com/gpu: 1)."
    ), result.message
    # a taint it may tolerate is still named, and the advice to change its tolerations stays
    nodes[1] = mixed_node("m0", A100_40, {"3g.20gb": 2}, "a100", 40960, taints=[cordon, {**cordon, "key": "team"}])
    result = review(frac("0.5"), nodes)
    assert result.message.endswith(
        "MIG pools this pod cannot use: a100 (3g.20gb; untolerated taint team:NoSchedule; its nodes are cordoned"
        " now). Change the pod's nodeSelector, node affinity or tolerations so it can reach one of those pools, or"
        " ask for a whole GPU (nvidia.com/gpu: 1)."
    ), result.message


def _applied(live: dict[str, Any], limits: dict[str, str]) -> dict[str, Any]:
    """What `kubectl apply` (client-side) sends for a manifest whose container asks ``limits``: its three-way merge
    sets what the manifest has and the live object lacks or holds otherwise, and keeps what only the live object
    has (the webhook's device, its requests, its nodeSelector)."""
    sent = copy.deepcopy(live)
    template_of(sent)["spec"]["containers"][0]["resources"]["limits"].update(limits)
    return sent


@pytest.mark.parametrize(
    ("nodes", "asks", "want"),
    [
        pytest.param(
            [mixed_node("m", A100_80, {"1g.20gb": 4, "3g.40gb": 2}, "a100", 81920)],
            ["0.5", "0.25", "0.5"],
            ["3g.40gb", "1g.20gb", "3g.40gb"],
            id="mixed",
        ),
        pytest.param(
            [
                gke_node("g3", "nvidia-a100-80gb", "3g.40gb", 2, "p3"),
                gke_node("g1", "nvidia-a100-80gb", "1g.20gb", 4, "p1"),
            ],
            ["0.5", "0.25"],
            ["3g.40gb", "1g.20gb"],
            id="gke",
        ),
    ],
)
def test_kubectl_apply_of_a_converted_workload_converts_the_ask_afresh(nodes, asks, want):
    """Found by a review of workload flows: client-side `kubectl apply` brings the fraction back beside what the
    webhook wrote (live-only fields stay), changed or not, and it was refused as a second MIG device ('remove one
    of them', naming a resource the user never wrote) or, on GKE, as a request of 1 unequal to the limit."""
    ctx = context(nodes)
    live = pipeline.mutate(workload("Deployment", pod(container(limits={GPU: asks[0]}))), ctx).object
    for ask, profile in zip(asks[1:], want[1:], strict=True):
        sent = _applied(live, {GPU: ask})
        update = replace(ctx, operation="UPDATE", old_object=live)
        result = pipeline.mutate(sent, update)
        assert result.allowed, result.message
        template = template_of(result.object)
        resources = template["spec"]["containers"][0]["resources"]
        if "cloud.google.com/gke-gpu-partition-size" in nodes[0]["metadata"]["labels"]:
            assert resources == {"limits": {GPU: "1"}}
            assert template["spec"]["nodeSelector"]["cloud.google.com/gke-gpu-partition-size"] == profile
        else:
            assert resources == mig_limits(profile)
        assert template["metadata"]["annotations"]["gpu-admission.io/mig"].startswith(f"trainer: {GPU} {ask} -> ")
        assert pipeline.validate(result.object, update).allowed
        assert pipeline.mutate(result.object, update).patch == [], "a second pass changes nothing"
        live = result.object


def test_kubectl_apply_of_a_whole_gpu_over_a_converted_fraction_drops_the_device():
    nodes = [mixed_node("m", A100_80, {"3g.40gb": 2}, "a100", 81920), whole_node("w", A100_80, 8, "whole")]
    ctx = context(nodes)
    live = pipeline.mutate(workload("Deployment", pod(container(limits={GPU: "0.5"}))), ctx).object
    result = pipeline.mutate(_applied(live, {GPU: "1"}), replace(ctx, operation="UPDATE", old_object=live))
    assert result.allowed
    assert result.warnings == ["trainer: took out the earlier conversion's nvidia.com/mig-3g.40gb"]
    assert template_of(result.object)["spec"]["containers"][0]["resources"] == {"limits": {GPU: "1"}}


def test_a_template_left_to_its_pods_whose_cuda_no_pool_supports_is_warned():
    """Its pods are checked each as it is created, and every one would be denied: said to whoever applies it, not
    only in the ReplicaSet's FailedCreate Events (found by a review of workload flows)."""
    old = {"nvidia.com/cuda.driver-version.full": "535.104.05"}
    nodes = [mixed_node("a40", A100_40, {"1g.10gb": 14}, "old-mig", 40960, extra_labels=old)]
    s = replace(settings(), cuda=CudaSettings())
    template_pod = pod(container(limits={MEM: "5Gi"}, image="pytorch/pytorch-nightly:2710000-cu12.8"))
    deployment = review(workload("Deployment", template_pod), nodes, s)
    assert deployment.allowed
    assert "cuda: trainer needs CUDA 12.8: each pod will be denied, no pool its pods can reach supports it (pool" in (
        " ".join(deployment.warnings)
    )
    assert not review(template_pod, nodes, s).allowed, "as its pods are"
    fine = pod(container(limits={MEM: "5Gi"}, image="nvidia/cuda:12.2.0-runtime-ubuntu22.04"))
    assert not any("each pod will be denied" in w for w in review(workload("Deployment", fine), nodes, s).warnings)


def test_kubectl_apply_keeps_a_partition_the_manifest_itself_selects():
    """Found by a review of the last session's diff: the converted fraction back on apply took out the nodeSelector
    on the GKE partition size that the conversion's line names, the user's own pin to that partition too, and the
    ask was converted afresh to a smaller partition than the manifest selects. What the manifest writes (kubectl's
    last-applied-configuration) stays; the webhook's own selector still goes."""
    nodes = [
        gke_node("g3", "nvidia-a100-80gb", "3g.40gb", 2, "p3"),
        gke_node("g1", "nvidia-a100-80gb", "1g.20gb", 4, "p1"),
    ]
    ctx = context(nodes)
    partition = "cloud.google.com/gke-gpu-partition-size"
    manifest = workload("Deployment", pod(container(limits={GPU: "0.25"}), nodeSelector={partition: "3g.40gb"}))
    for pinned, want in ((True, "3g.40gb"), (False, "1g.20gb")):
        written = copy.deepcopy(manifest)
        if not pinned:  # the manifest has no selector: 0.5 took a 3g.40gb partition, the webhook's selector
            del template_of(written)["spec"]["nodeSelector"]
            first = workload("Deployment", pod(container(limits={GPU: "0.5"})))
        else:
            first = manifest
        live = pipeline.mutate(copy.deepcopy(first), ctx).object
        assert template_of(live)["spec"]["nodeSelector"] == {partition: "3g.40gb"}
        sent = _applied(live, {GPU: "0.25"})
        sent["metadata"].setdefault("annotations", {})["kubectl.kubernetes.io/last-applied-configuration"] = json.dumps(
            written
        )
        result = pipeline.mutate(sent, replace(ctx, operation="UPDATE", old_object=live))
        assert result.allowed, result.message
        assert template_of(result.object)["spec"]["nodeSelector"] == {partition: want}


def _pod_of(workload_obj: dict[str, Any]) -> dict[str, Any]:
    """A pod the ReplicaSet controller makes from a Deployment's template (its metadata and spec)."""
    template = copy.deepcopy(template_of(workload_obj))
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "w-1", "uid": "u1", "controller": True}
    meta = {**template["metadata"], "name": "w-1-x", "namespace": "ml", "ownerReferences": [owner]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def _unoffered_events(result: pipeline.Result) -> list[Any]:
    return [e for e in result.outcome.events if e.reason == "MIGUnoffered"]


def _daemon_pod_told(ctx: Any, told: bool) -> Any:
    """A DaemonSet's pod for node n2, its template's 0.1 converted: where ``told``, warned that it stays Pending,
    with one MIGUnoffered Event (returned); else nothing said and its template's line kept (None)."""
    live = pipeline.mutate(workload("DaemonSet", frac("0.1")), ctx).object
    result = _as_created(_daemon_pod_of(live, "n2"), ctx)
    if told:
        assert result.warnings == [
            "mig: trainer asks nvidia.com/mig-1g.10gb, which no node it can run on offers now: it stays Pending"
        ]
        (event,) = _unoffered_events(result)
        return event
    assert result.warnings == [] and _unoffered_events(result) == []
    assert mig_annotation(result.object) == mig_annotation(live)
    return None


def _as_created(pod_obj: dict[str, Any], ctx: Any) -> pipeline.Result:
    """The pod through the mutating webhook, then the validating one, as the apiserver calls them."""
    mutated = pipeline.mutate(copy.deepcopy(pod_obj), ctx)
    assert mutated.allowed, mutated.message
    assert pipeline.mutate(copy.deepcopy(mutated.object), ctx).patch == [], "a second pass changes nothing"
    validated = pipeline.validate(mutated.object, ctx)
    validated.warnings = [*mutated.warnings, *validated.warnings]
    return validated


def test_a_pod_asking_a_profile_no_node_offers_now_is_told_and_how_to_convert_afresh():
    """A Deployment converted to 3g.40gb, then the GPUs given another MIG layout: its pods asked for a device no
    node offers and stayed Pending with only the scheduler's 'Insufficient nvidia.com/mig-3g.40gb'. The pod now
    gets a warning and a Warning Event that names the profiles offered and, from the conversion's line (which the
    mutating webhook keeps on the pod, saying it lands nowhere now), what the device was converted from and that
    applying the workload again converts it afresh (found by a review of day-2 journeys: the mutating webhook
    had rewritten the line 'as found on the object', and the Event lost the hint)."""
    before = context([mixed_node("m", A100_80, {"3g.40gb": 2}, "a100", 81920)])
    live = pipeline.mutate(workload("Deployment", pod(container(limits={GPU: "0.5"}))), before).object
    assert template_of(live)["spec"]["containers"][0]["resources"] == mig_limits("3g.40gb")
    after = context([mixed_node("m", A100_80, {"1g.10gb": 7}, "a100", 81920)])
    result = _as_created(_pod_of(live), after)
    assert result.allowed
    assert result.warnings == [
        "mig: trainer asks nvidia.com/mig-3g.40gb, which no node or pool offers now: it stays Pending"
    ]
    (event,) = _unoffered_events(result)
    assert event.type == "Warning"
    assert event.message == (
        "container trainer asks for nvidia.com/mig-3g.40gb, which no node or declared pool offers (MIG profiles "
        "offered now: nvidia.com/mig-1g.10gb); the pod stays Pending until one does. It was converted from "
        "nvidia.com/gpu 0.5 "
        "(gpu-admission.io/mig) before the GPUs had today's layout: apply its workload again to convert it to a "
        "profile offered now, or to be told why none fits."
    )
    # where it is offered, while a layout is changing, or where no node is known: nothing said
    changing = mixed_node(
        "m", A100_80, {"1g.10gb": 7}, "a100", 81920, extra_labels={"nvidia.com/mig.config.state": "pending"}
    )
    for ctx in (before, context([changing]), context([])):
        quiet = _as_created(_pod_of(live), ctx)
        assert not _unoffered_events(quiet) and not [w for w in quiet.warnings if "offers now" in w]


def test_a_gke_partition_no_pool_has_now_is_told_too():
    """On GKE (and under the single strategy) the converted device is a whole nvidia.com/gpu on the nodes the
    webhook's nodeSelector names: a partition size no pool has any more left the pods Pending unexplained."""
    before = context([gke_node("g3", "nvidia-a100-80gb", "3g.40gb", 2, "p3")])
    live = pipeline.mutate(workload("Deployment", pod(container(limits={GPU: "0.5"}))), before).object
    after = context([gke_node("g1", "nvidia-a100-80gb", "1g.10gb", 7, "p1")])
    result = _as_created(_pod_of(live), after)
    (event,) = _unoffered_events(result)
    assert event.message.startswith(
        "container trainer asks for nvidia.com/gpu 1 with nodeSelector cloud.google.com/gke-gpu-partition-size="
        "3g.40gb, which no node or declared pool offers (MIG profiles offered now: 1g.10gb as nvidia.com/gpu (gke "
        "strategy)); the pod stays Pending until one does. It was converted from nvidia.com/gpu 0.5"
    ), event.message
    assert not _unoffered_events(_as_created(_pod_of(live), before))


def test_a_fraction_converted_for_a_single_strategy_pool_at_zero_is_checked_once_the_pool_has_nodes():
    """A single-strategy pool at zero that an autoscaler makes from its definition gives nvidia.com/gpu 1 pinned by
    the pool's own label; its line did not name the profile, was not taken for a MIG line, and a replica ran
    silently on the 1g.10gb of a pool that came up with another layout, 1/8 of the GPU for a 0.4 (a review's).
    The line names the profile, and the pod is checked against the pool's layout once it has nodes."""
    group = "eks.amazonaws.com/nodegroup"
    pools = [a100_mig_pool(group)]
    s = settings(pools)
    a10g = whole_node("a10g", "NVIDIA-A10G", 1, "gpu-od")
    a10g["metadata"]["labels"][group] = "gpu-od"

    def up(profile: str) -> dict[str, Any]:
        node = single_node("a100", A100_80, profile, 8, "a100-mig")
        node["metadata"]["labels"][group] = "a100-mig"
        return node

    live = pipeline.mutate(workload("Deployment", pod(container(limits={GPU: "0.4"}))), context([a10g], s)).object
    line = mig_annotation(live)
    assert line == (
        "trainer: nvidia.com/gpu 0.4 -> nvidia.com/gpu 1 (MIG 3g.40gb, pinned to eks.amazonaws.com/nodegroup="
        "a100-mig, NVIDIA-A100-SXM4-80GB, pool a100-mig)"
    )
    other = _as_created(_pod_of(live), context([a10g, up("1g.10gb")], s))
    assert other.allowed
    assert other.warnings == [
        "mig: trainer: pool a100-mig gives MIG 1g.10gb as nvidia.com/gpu now: it gets that, not MIG 3g.40gb"
    ]
    (event,) = _unoffered_events(other)
    assert event.type == "Warning"
    assert event.message == (
        "container trainer was converted from nvidia.com/gpu 0.4 to MIG 3g.40gb (gpu-admission.io/mig), "
        "nvidia.com/gpu 1 pinned to its pool while the pool had no nodes; pool a100-mig gives MIG 1g.10gb as "
        "nvidia.com/gpu now, and it gets that instead. Apply its workload again to convert it to a profile offered "
        "now, or to be told why none fits."
    )
    assert not [e for e in other.outcome.events if e.reason == "MIGAssigned"]
    lands = _as_created(_pod_of(live), context([a10g, up("3g.40gb")], s))
    assert lands.warnings == [] and not _unoffered_events(lands)
    assert [e.message for e in lands.outcome.events if e.reason == "MIGAssigned"] == [f"MIG devices: {line}"]


def _a100_mig_at_zero(**declared: Any) -> tuple[Any, dict[str, Any], Any]:
    """The settings of a single-strategy pool a100-mig at zero (3g.40gb), a whole-GPU node of another pool, and a
    node of a100-mig as it comes up with ``profile``'s layout."""
    group = "eks.amazonaws.com/nodegroup"
    fields: dict[str, Any] = dict(
        name="a100-mig",
        node_selector={group: "a100-mig"},
        gpu_product=A100_80,
        gpu_memory_mib=81920,
        gpu_count=8,
        mig_strategy="single",
        mig_profiles={"3g.40gb": 16},
    )
    s = settings([PoolSettings(**{**fields, **declared})])
    a10g = whole_node("a10g", "NVIDIA-A10G", 1, "gpu-od")
    a10g["metadata"]["labels"][group] = "gpu-od"

    def up(profile: str, name: str = "a100") -> dict[str, Any]:
        node = single_node(name, A100_80, profile, 8, "a100-mig")
        node["metadata"]["labels"][group] = "a100-mig"
        return node

    return s, a10g, up


OLD_BY_POOL_LINE = (
    "trainer: nvidia.com/gpu 0.4 -> nvidia.com/gpu 1 (pinned to eks.amazonaws.com/nodegroup=a100-mig, "
    "NVIDIA-A100-SXM4-80GB, pool a100-mig)"
)
"""The line of a fraction converted for a single-strategy pool at zero as versions before its profile wrote it."""


def _with_old_line(live: dict[str, Any]) -> dict[str, Any]:
    old = copy.deepcopy(live)
    template_of(old)["metadata"]["annotations"]["gpu-admission.io/mig"] = OLD_BY_POOL_LINE
    return old


def test_an_unchanged_manifest_applied_after_an_upgrade_keeps_a_line_an_earlier_version_wrote():
    """A template converted by a version before the line named its profile carries the line without 'MIG
    3g.40gb, '; applying the unchanged manifest again rewrote it, the template changed, and every such Deployment
    rolled out on its next apply or GitOps sync (a review's). The line is kept as written."""
    s, a10g, _ = _a100_mig_at_zero()
    ctx = context([a10g], s)
    live = _with_old_line(pipeline.mutate(workload("Deployment", pod(container(limits={GPU: "0.4"}))), ctx).object)
    update = replace(ctx, operation="UPDATE", old_object=live)
    result = pipeline.mutate(_applied(live, {GPU: "0.4"}), update)
    assert result.allowed, result.message
    assert result.object == live, result.patch
    assert pipeline.validate(result.object, update).allowed


def test_a_line_an_earlier_version_wrote_for_a_pool_at_zero_is_checked_by_the_profile_its_pool_declares():
    """The kept line names no profile: its pods are checked against the profile the pool declares, and where the
    pools its pin names declare none (or several), they are told that what they get is not checked."""
    s, a10g, up = _a100_mig_at_zero()
    live = _with_old_line(
        pipeline.mutate(workload("Deployment", pod(container(limits={GPU: "0.4"}))), context([a10g], s)).object
    )
    other = _as_created(_pod_of(live), context([a10g, up("1g.10gb")], s))
    assert other.warnings == [
        "mig: trainer: pool a100-mig gives MIG 1g.10gb as nvidia.com/gpu now: it gets that, not MIG 3g.40gb"
    ]
    assert len(_unoffered_events(other)) == 1
    lands = _as_created(_pod_of(live), context([a10g, up("3g.40gb")], s))
    assert lands.warnings == [] and not _unoffered_events(lands)
    assigned = [e.message for e in lands.outcome.events if e.reason == "MIGAssigned"]
    assert assigned == [f"MIG devices: {OLD_BY_POOL_LINE}"]
    undeclared, _, _ = _a100_mig_at_zero(mig_profiles={})
    unknown = _as_created(_pod_of(live), context([a10g, up("1g.10gb")], undeclared))
    assert unknown.warnings == [
        "mig: trainer: MIG profile not checked on pool a100-mig (an earlier version's line names none): apply its"
        " workload again"
    ]
    assert not _unoffered_events(unknown)


def test_a_line_an_earlier_version_wrote_that_is_not_checked_raises_a_warning_event() -> None:
    """The pods of a Deployment whose old line is not checked were told so in a warning alone, which no one reads for
    a pod a controller creates; the other warnings of a line's check raise a Warning Event. So does this one."""
    s, a10g, up = _a100_mig_at_zero()
    live = _with_old_line(
        pipeline.mutate(workload("Deployment", pod(container(limits={GPU: "0.4"}))), context([a10g], s)).object
    )
    declared, _, _ = _a100_mig_at_zero(mig_profiles={})
    result = _as_created(_pod_of(live), context([a10g, up("1g.10gb")], declared))
    (event,) = [e for e in result.outcome.events if e.reason == "MIGNotChecked"]
    assert event.type == "Warning"
    assert event.message == (
        "container trainer was converted from nvidia.com/gpu 0.4 to nvidia.com/gpu 1 (gpu-admission.io/mig) by an "
        "earlier version, pinned to its pool while the pool had no nodes, and its line names no MIG profile; pool "
        "a100-mig has nodes now and declares no MIG profile that holds it, so the device it gets there is not checked. "
        "Apply its workload again "
        "to convert it to a profile offered now, or to be told why none fits."
    )


def test_a_line_an_earlier_version_wrote_is_not_checked_by_a_profile_declared_since_that_does_not_hold_its_ask():
    """The pool's declared profile changed after the conversion (3g.40gb made 1g.10gb, which does not hold 0.4): the
    old line was checked against it, so a replica on a 1g.10gb passed without a word and one on the 3g.40gb it was
    converted for was told it gets 'not MIG 1g.10gb' (a review's finding). It is said to be not checked."""
    s, a10g, up = _a100_mig_at_zero()
    live = _with_old_line(
        pipeline.mutate(workload("Deployment", pod(container(limits={GPU: "0.4"}))), context([a10g], s)).object
    )
    changed, _, _ = _a100_mig_at_zero(mig_profiles={"1g.10gb": 56})
    not_checked = [
        "mig: trainer: MIG profile not checked on pool a100-mig (an earlier version's line names none): apply its"
        " workload again"
    ]
    for layout in ("1g.10gb", "3g.40gb"):
        result = _as_created(_pod_of(live), context([a10g, up(layout)], changed))
        assert result.warnings == not_checked, layout


def test_a_fraction_converted_for_a_single_strategy_pool_at_zero_that_came_up_mixed_is_told_it_stays_pending():
    """The pool came up with the mixed strategy: its nodes offer nvidia.com/mig-3g.40gb and no nvidia.com/gpu, and
    the replica, pinned by the pool's label, stayed Pending without a word: its line names no nodeSelector, and only
    the pools giving nvidia.com/gpu were looked at (a review's). It is told, and how to convert it afresh."""
    s, a10g, _ = _a100_mig_at_zero()
    live = pipeline.mutate(workload("Deployment", pod(container(limits={GPU: "0.4"}))), context([a10g], s)).object
    mixed = mixed_node("a100", A100_80, {"3g.40gb": 16}, "a100-mig", 81920)
    mixed["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] = "a100-mig"
    result = _as_created(_pod_of(live), context([a10g, mixed], s))
    assert result.allowed
    assert result.warnings == [
        "mig: trainer asks MIG 3g.40gb as nvidia.com/gpu, which no node or pool offers now: it stays Pending"
    ]
    (event,) = _unoffered_events(result)
    assert event.type == "Warning"
    assert "(MIG profiles offered now: nvidia.com/mig-3g.40gb)" in event.message, event.message
    assert "the pod stays Pending until one does" in event.message
    assert "apply its workload again to convert it to a profile offered now" in event.message


def test_the_may_get_warning_keeps_the_profile_converted_to_when_the_name_and_the_list_are_long() -> None:
    """A container name of 63 characters and three other layouts made the warning over 119 characters: its middle
    was cut, and with it the profile the pod was converted to ('besides MIG 3g.…dia.com/gpu'). It comes first."""
    s, a10g, up = _a100_mig_at_zero()
    name = "t" * 63
    live = pipeline.mutate(workload("Deployment", pod(container(name, limits={GPU: "0.4"}))), context([a10g], s))
    nodes = [up(p, f"n{i}") for i, p in enumerate(["1g.10gb", "2g.20gb", "7g.80gb", "3g.40gb"])]
    (warning,) = _as_created(_pod_of(live.object), context([a10g, *nodes], s)).warnings
    assert len(warning) <= 119
    assert " gives MIG 3g.40gb but also MIG 1g.10gb or MIG 2g.20gb" in warning
    assert warning.endswith(" now: it may get that")


def test_a_fraction_converted_for_a_single_strategy_pool_at_zero_that_came_up_with_two_layouts_may_get_either():
    """The pool came up with nodes of 3g.40gb and nodes of 1g.10gb: the pod was told it gets the 1g.10gb, though the
    scheduler may place it on a 3g.40gb (a review's). It is told it may, with both devices named; a pod bound to a
    node is told what that node gives."""
    s, a10g, up = _a100_mig_at_zero()
    live = pipeline.mutate(workload("Deployment", pod(container(limits={GPU: "0.4"}))), context([a10g], s)).object
    ctx = context([a10g, up("3g.40gb", "n3"), up("1g.10gb", "n1")], s)
    result = _as_created(_pod_of(live), ctx)
    assert result.warnings == [
        "mig: trainer: pool a100-mig gives MIG 3g.40gb but also MIG 1g.10gb as nvidia.com/gpu now: it may get that"
    ]
    (event,) = _unoffered_events(result)
    assert "pool a100-mig gives MIG 1g.10gb besides MIG 3g.40gb as nvidia.com/gpu now, and it may get that instead" in (
        event.message
    )
    bound = _pod_of(live)
    bound["spec"]["nodeName"] = "n1"
    assert _as_created(bound, ctx).warnings == [
        "mig: trainer: pool a100-mig gives MIG 1g.10gb as nvidia.com/gpu now: it gets that, not MIG 3g.40gb"
    ]


def test_a_long_container_name_is_shortened_before_the_pools_get_their_room():
    """The room for the pools' names was worked out from the container's whole name, which the warning then
    shortens: the pool was counted ('1 pool') where its name fitted (a review's)."""
    s, a10g, up = _a100_mig_at_zero()
    name = "pytorch-distributed-trainer-01"
    live = pipeline.mutate(workload("Deployment", pod(container(name, limits={GPU: "0.4"}))), context([a10g], s))
    result = _as_created(_pod_of(live.object), context([a10g, up("1g.10gb")], s))
    assert result.warnings == [
        "mig: pytorch-distri…ed-trainer-01: pool a100-mig gives MIG 1g.10gb as nvidia.com/gpu now: it gets that, not"
        " MIG 3g.40gb"
    ]


def test_a_warning_too_long_for_its_pools_count_keeps_the_end_of_its_words():
    """pool_names gives no less than the count ('1 pool'), past a room smaller than that: the warning's cut then
    took the end, the profile the pod should have had ('not MIG 3g.4…': a review's). The words after the pools are
    cut in their middle instead."""
    s, a10g, up = _a100_mig_at_zero()
    name = "x" * 40
    live = pipeline.mutate(workload("Deployment", pod(container(name, limits={GPU: "0.4"}))), context([a10g], s))
    whole = whole_node("w", A100_80, 8, "a100-mig")
    whole["metadata"]["labels"]["eks.amazonaws.com/nodegroup"] = "a100-mig"
    result = _as_created(_pod_of(live.object), context([a10g, up("1g.10gb", "n1"), up("2g.20gb", "n2"), whole], s))
    (warning,) = result.warnings
    assert len(warning) <= 119
    assert warning.startswith("mig: xxxx…xxxx: 1 pool gives MIG 1g.10gb or MIG 2g.20gb or ")
    assert warning.endswith(": it gets that, not MIG 3g.40gb"), warning


def _daemon_pod_of(workload_obj: dict[str, Any], node: str) -> dict[str, Any]:
    """The pod the DaemonSet controller makes from its template for ``node`` (matchFields on metadata.name)."""
    made = _pod_of(workload_obj)
    made["metadata"]["ownerReferences"][0].update({"kind": "DaemonSet", "name": "d"})
    on_node = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    made["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": on_node}}
    }
    return made


def test_a_pod_no_node_it_can_run_on_offers_its_device_is_told_though_another_pool_offers_it():
    """A DaemonSet's pod for an A100-80GB node asked the 3g.20gb its template was converted to on the A100-40GB:
    Pending for good, and told nothing, since some pool offered that device (found by a review of MIG). Now the
    pods no node they can run on serves are told, and so is a pod of another owner that its own nodeSelector
    keeps off the pools that offer its device."""
    ctx = context(DAEMON_NODES)
    live = pipeline.mutate(workload("DaemonSet", frac("0.5")), ctx).object
    result = _as_created(_daemon_pod_of(live, "n2"), ctx)
    assert result.allowed
    assert result.warnings == [
        "mig: trainer asks nvidia.com/mig-3g.20gb, which no node it can run on offers now: it stays Pending"
    ]
    (event,) = _unoffered_events(result)
    assert event.type == "Warning"
    assert event.message == (
        "container trainer asks for nvidia.com/mig-3g.20gb, which no node it can run on offers (pool a100-40 offers "
        "it, out of the pod's nodeSelector, node affinity or tolerations); the pod stays Pending until one does. Its "
        "DaemonSet's template asks this one device of every node it selects: give pool a100-80 a MIG layout that "
        "offers it, keep the DaemonSet off it (a nodeSelector or node affinity), or ask the fraction by annotation "
        "gpu-admission.io/gpu-fraction, which is converted on each pod for its node."
    )
    served = _as_created(_daemon_pod_of(live, "n1"), ctx)
    assert served.warnings == [] and not _unoffered_events(served)
    kept_off = pod(container(limits=mig("3g.20gb")["limits"]), nodeSelector={POOL: "a100-80"})
    (event,) = _unoffered_events(_as_created(kept_off, ctx))
    assert event.message == (
        "container trainer asks for nvidia.com/mig-3g.20gb, which no node it can run on offers (pool a100-40 offers "
        "it, out of the pod's nodeSelector, node affinity or tolerations); the pod stays Pending until one does."
    )


@pytest.mark.parametrize(
    "joining",
    [
        pytest.param(None, id="not-seen-yet"),
        pytest.param(whole_node("n3", A100_40, 0, "a100-40"), id="no-device-yet"),
        pytest.param(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n3", "labels": {POOL: "a100-40"}}},
            id="no-gfd-yet",
        ),
    ],
)
def test_a_daemonset_pod_for_a_node_joining_is_not_told_its_device_is_unoffered(joining):
    """The DaemonSet controller makes a pod for a node as it joins, before the webhook's watch has seen the node or
    while its device plugin offers nothing yet (GFD's labels up, no device): the pod for a new A100-40GB node was
    told that no node it can run on offers its 3g.20gb and to give its node's pool a MIG layout that offers it,
    which the pool had; it runs once the plugin advertises the device (found by a review of MIG). Its line stays
    its template's: it was reworded 'no node it can run on offers it now'. The pod for a node that offers devices,
    but not this one, is still told."""
    ctx = context(DAEMON_NODES)
    live = pipeline.mutate(workload("DaemonSet", frac("0.5")), ctx).object
    joined = context([*DAEMON_NODES, joining] if joining else DAEMON_NODES)
    result = _as_created(_daemon_pod_of(live, "n3"), joined)
    assert result.allowed
    assert result.warnings == [] and _unoffered_events(result) == []
    assert mig_annotation(pipeline.mutate(_daemon_pod_of(live, "n3"), joined).object) == mig_annotation(live)
    (event,) = _unoffered_events(_as_created(_daemon_pod_of(live, "n2"), joined))
    assert event.message.startswith(
        "container trainer asks for nvidia.com/mig-3g.20gb, which no node it can run on offers (pool a100-40 offers "
        "it, out of the pod's nodeSelector, node affinity or tolerations)"
    ), event.message


def test_a_daemonset_pod_for_the_first_node_of_a_declared_pool_joining_is_not_told_its_device_is_unoffered():
    """The first node of a declared pool, joined with neither GFD's labels nor a device yet, was taken for a CPU
    node: its DaemonSet pod was told it stays Pending, its line rewritten, and a MIGUnoffered Event sent, at every
    scale-up of the pool (a review's)."""
    declared = PoolSettings(
        name="new",
        node_selector={POOL: "new"},
        gpu_product=A100_40,
        gpu_memory_mib=40960,
        mig_strategy="mixed",
        mig_profiles={"3g.20gb": 2},
    )
    s = settings([declared])
    live = pipeline.mutate(workload("DaemonSet", frac("0.5")), context(DAEMON_NODES[1:], s)).object
    joining = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n3", "labels": {POOL: "new"}}}
    joined = context([*DAEMON_NODES[1:], joining], s)
    result = _as_created(_daemon_pod_of(live, "n3"), joined)
    assert result.warnings == [] and _unoffered_events(result) == []
    assert mig_annotation(result.object) == mig_annotation(live)


def test_a_daemonset_pod_for_a_seen_cpu_node_is_told_no_node_it_can_run_on_offers_its_device():
    """A DaemonSet with no nodeSelector makes a pod for every node, a CPU node's too: that node is seen and offers
    no device, and none will come to it. The pod was treated as one for a node not seen yet (only GPU nodes were
    counted), kept its template's line and was told nothing (found by a review)."""
    cpu = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-1", "labels": {POOL: "default-pool"}}}
    ctx = context([*DAEMON_NODES, cpu])
    live = pipeline.mutate(workload("DaemonSet", frac("0.5")), ctx).object
    result = _as_created(_daemon_pod_of(live, "cpu-1"), ctx)
    assert result.warnings == [
        "mig: trainer asks nvidia.com/mig-3g.20gb, which no node it can run on offers now: it stays Pending"
    ]
    assert len(_unoffered_events(result)) == 1
    assert mig_annotation(result.object) == (
        "trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb (no node it can run on offers it now)"
    )


def _nodepool_node(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    """A node of the Karpenter NodePool 'default', which holds CPU and GPU instance types."""
    meta = {"name": name, "labels": {"karpenter.sh/nodepool": "default", **labels}}
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "status": {"allocatable": allocatable}}


@pytest.mark.parametrize(
    ("labels", "told"),
    [
        pytest.param({"node.kubernetes.io/instance-type": "m5.2xlarge"}, True, id="cpu-instance"),
        pytest.param(
            {
                "node.kubernetes.io/instance-type": "p4de.24xlarge",
                "karpenter.k8s.aws/instance-gpu-name": "a100",
                "karpenter.k8s.aws/instance-gpu-count": "8",
            },
            False,
            id="gpu-instance-joining",
        ),
        pytest.param(  # Karpenter on Azure (AKS node auto-provisioning) gives every node its sku-gpu-count
            {"node.kubernetes.io/instance-type": "Standard_D8s_v5", "karpenter.azure.com/sku-gpu-count": "0"},
            True,
            id="azure-cpu-instance",
        ),
        pytest.param(
            {
                "node.kubernetes.io/instance-type": "Standard_NC24ads_A100_v4",
                "karpenter.azure.com/sku-gpu-count": "1",
                "karpenter.azure.com/sku-gpu-name": "A100",
                "karpenter.azure.com/sku-gpu-manufacturer": "nvidia",
            },
            False,
            id="azure-gpu-instance-joining",
        ),
    ],
)
def test_a_daemonset_pod_for_a_node_of_a_nodepool_with_gpu_and_cpu_instances_is_told_by_the_nodes_labels(labels, told):
    """A Karpenter NodePool holds CPU and GPU instance types alike: its CPU nodes, which offer no device, were taken
    for GPU nodes joining since the pool has GPU nodes, for good, and a DaemonSet's pod made for one was never told
    it stays Pending (a review's). A node is a GPU node joining where Karpenter's labels of a GPU instance say so."""
    gpu = _nodepool_node(
        "gpu-1",
        {"nvidia.com/gpu.product": A100_80, "nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.memory": "81920"},
        {"nvidia.com/mig-1g.10gb": "56"},
    )
    ctx = context([gpu, _nodepool_node("n2", labels, {"cpu": "8"})])
    _daemon_pod_told(ctx, told)


_NAP = {"kubernetes.azure.com/agentpool": "default"}  # AKS's node auto-provisioning (Karpenter on Azure)


@pytest.mark.parametrize(
    ("providers", "own", "labels", "told"),
    [
        pytest.param(
            ["eks"],
            {},
            {"eks.amazonaws.com/instance-gpu-name": "a100", "eks.amazonaws.com/instance-gpu-count": "8"},
            False,
            id="eks-auto-mode-gpu-joining",
        ),
        pytest.param(
            ["aks"],
            _NAP,
            {  # the first node of its NodePool
                "kubernetes.azure.com/agentpool": "a100",
                "karpenter.azure.com/sku-gpu-count": "1",
                "karpenter.azure.com/sku-gpu-manufacturer": "nvidia",
            },
            False,
            id="aks-nap-nvidia-joining",
        ),
        pytest.param(["aks"], _NAP, {"karpenter.azure.com/sku-gpu-count": "0"}, True, id="aks-nap-cpu"),
    ],
)
def test_a_daemonset_pod_is_told_by_its_nodes_labels_whatever_providers_the_cluster_names(
    providers: list[str], own: dict[str, str], labels: dict[str, str], told: bool
) -> None:
    """What a node's labels say it is (a GPU node from its start, a pool of CPU and GPU instance types alike) was
    read only for the providers ``cluster.providers`` names: on an EKS Auto Mode cluster that named eks alone, or an
    AKS cluster with node auto-provisioning that named aks alone (both Karpenter), a DaemonSet's pod for a GPU node
    joining was told it stays Pending, and the pod for a CPU node of an agent pool with GPU nodes was taken for one
    joining and told nothing (a review of the cluster model)."""
    gpu_labels = {
        "nvidia.com/gpu.product": A100_80,
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/gpu.memory": "81920",
    }
    gpu = _nodepool_node("gpu-1", {**own, **gpu_labels}, {"nvidia.com/mig-1g.10gb": "56"})
    s = settings()
    s = replace(s, cluster=replace(s.cluster, providers=providers))
    ctx = context([gpu, _nodepool_node("n2", {**own, **labels}, {"cpu": "8"})], s)
    _daemon_pod_told(ctx, told)


_AWS_CPU = {  # Karpenter on AWS labels every node with its instance type's facts, a GPU's among them
    "node.kubernetes.io/instance-type": "m5.2xlarge",
    "karpenter.k8s.aws/instance-family": "m5",
    "karpenter.k8s.aws/instance-cpu": "8",
}
_EKS_AUTO_CPU = {"node.kubernetes.io/instance-type": "m5.2xlarge", "eks.amazonaws.com/instance-family": "m5"}
_CAPI_NODE = {  # Cluster API's Karpenter: the instance type is a MachineDeployment; no label of the node says GPU
    "node.kubernetes.io/instance-type": "md-a100-0",
    "karpenter.sh/capacity-type": "on-demand",
    "capacity.karpenter.cluster.x-k8s.io/cpu": "96",
}
_AWS_AMD = {  # aws/karpenter-provider-aws labels.go: instance-gpu-manufacturer, "nvidia" on an NVIDIA GPU type
    "node.kubernetes.io/instance-type": "g4ad.xlarge",
    "karpenter.k8s.aws/instance-family": "g4ad",
    "karpenter.k8s.aws/instance-gpu-name": "radeon-pro-v520",
    "karpenter.k8s.aws/instance-gpu-manufacturer": "amd",
    "karpenter.k8s.aws/instance-gpu-count": "1",
}
_EKS_AUTO_AMD = {
    "node.kubernetes.io/instance-type": "g4ad.xlarge",
    "eks.amazonaws.com/instance-gpu-manufacturer": "amd",
    "eks.amazonaws.com/instance-gpu-count": "1",
}


def _other_maker(domain: str, key: str = "instance-gpu-manufacturer") -> str:
    """What a DaemonSet's pod for an AMD node is told: no MIG layout nor annotation gives it an NVIDIA device, and
    the 'give its pool a MIG layout, or ask by annotation' advice led to a refusal (found by a review of MIG)."""
    return (
        "Its DaemonSet's template asks this one device of every node it selects, and this pod's node has another"
        f" maker's GPUs ({domain}/{key}: amd), which NVIDIA's device plugin does not offer: keep the DaemonSet off it"
        f" (a nodeSelector or node affinity, such as {domain}/{key}: nvidia)."
    )


_HAS_NO_GPU = (
    "Its DaemonSet's template asks this one device of every node it selects, and this pod's node has no GPU: keep the"
    " DaemonSet off nodes without GPUs (a nodeSelector or node affinity on its GPU nodes' labels)."
)
_NONE_SEEN = (
    "Its DaemonSet's template asks this one device of every node it selects, and no NVIDIA GPU device is seen on"
    " this pod's node: where it has NVIDIA GPUs, give its node's pool a MIG layout that offers it; else keep the"
    " DaemonSet off it (a nodeSelector or node affinity), or ask the fraction by annotation"
    " gpu-admission.io/gpu-fraction, which is converted on each pod for its node."
)


@pytest.mark.parametrize(
    ("labels", "hint"),
    [
        pytest.param(_AWS_CPU, _HAS_NO_GPU, id="aws-cpu-instance"),
        pytest.param(_EKS_AUTO_CPU, _HAS_NO_GPU, id="eks-auto-mode-cpu-instance"),
        pytest.param({"karpenter.azure.com/sku-gpu-count": "0"}, _HAS_NO_GPU, id="azure-cpu-instance"),
        pytest.param(_CAPI_NODE, _NONE_SEEN, id="cluster-api-node"),
        pytest.param({"node.kubernetes.io/instance-type": "m5.2xlarge"}, _NONE_SEEN, id="no-provider-label"),
        # an AMD GPU instance type, up or joining: was taken for an NVIDIA GPU node joining, for good (its
        # instance-gpu-count), and its pod was told nothing (found by a review of MIG)
        pytest.param(_AWS_AMD, _other_maker("karpenter.k8s.aws"), id="aws-amd-instance"),
        pytest.param(_AWS_AMD, _other_maker("karpenter.k8s.aws"), id="aws-amd-instance-up"),
        pytest.param(_EKS_AUTO_AMD, _other_maker("eks.amazonaws.com"), id="eks-auto-mode-amd-instance"),
    ],
)
def test_a_daemonset_pod_on_a_node_of_a_nodepool_is_told_its_node_has_no_gpu_only_where_its_labels_say_so(
    labels: dict[str, str], hint: str, request: pytest.FixtureRequest
) -> None:
    """The pod a DaemonSet makes for a CPU node of a Karpenter NodePool was told to give its node's pool a MIG
    layout that offers its device, or to ask by annotation: neither gives a CPU node a GPU. It is told to keep the
    DaemonSet off nodes without GPUs where its Karpenter provider labels every node with its instance type's GPUs
    (AWS, EKS Auto Mode, Azure) and this one has none. A node of another Karpenter provider (Cluster API's labels no
    GPU) that offers no device yet may be a GPU node joining: it was told its node has no GPU; it is told no NVIDIA
    GPU device is seen there, and what to do either way."""
    gpu = _nodepool_node(
        "gpu-1",
        {"nvidia.com/gpu.product": A100_80, "nvidia.com/mig.strategy": "mixed", "nvidia.com/gpu.memory": "81920"},
        {"nvidia.com/mig-1g.10gb": "56"},
    )
    up = {"amd.com/gpu": "1"} if request.node.callspec.id.endswith("-up") else {}
    ctx = context([gpu, _nodepool_node("n2", labels, {"cpu": "8", **up})])
    live = pipeline.mutate(workload("DaemonSet", frac("0.1")), ctx).object
    (event,) = _unoffered_events(_as_created(_daemon_pod_of(live, "n2"), ctx))
    assert event.message.endswith(f"the pod stays Pending until one does. {hint}"), event.message


@pytest.mark.parametrize(
    ("instance_type", "told"),
    [
        pytest.param("md-a100-0", False, id="gpu-node-joining"),
        pytest.param("md-cpu-0", True, id="cpu-node"),
    ],
)
def test_a_daemonset_pod_for_a_cluster_api_nodepool_node_of_its_gpu_nodes_instance_type_is_not_told(
    instance_type: str, told: bool
) -> None:
    """Cluster API's Karpenter gives a node no label of its GPUs: a DaemonSet's pod for a node of the NodePool joining
    with the instance type of its GPU nodes, its device plugin not up yet, was told it stays Pending, and its Event
    that the pool offers the device and to give the pool a MIG layout (a review of MIG). Nothing is said, as for a
    node of an EKS nodegroup joining; a node of another instance type of the pool is still told."""
    it = "node.kubernetes.io/instance-type"
    gpu_labels = {it: "md-a100-0", "nvidia.com/gpu.product": A100_80, "nvidia.com/mig.strategy": "mixed"}
    gpu = _nodepool_node("gpu-1", {**gpu_labels, "nvidia.com/gpu.memory": "81920"}, {"nvidia.com/mig-1g.10gb": "56"})
    ctx = context([gpu, _nodepool_node("n2", {**_CAPI_NODE, it: instance_type}, {"cpu": "96"})])
    if (event := _daemon_pod_told(ctx, told)) is not None:
        assert event.message.endswith(f"the pod stays Pending until one does. {_NONE_SEEN}"), event.message


def _azure_amd_node(gpus: dict[str, str]) -> dict[str, Any]:
    """A node Karpenter on Azure made of an AMD GPU SKU, offering ``gpus`` besides its CPUs."""
    labels = {
        "karpenter.sh/nodepool": "default",
        "kubernetes.azure.com/agentpool": "default",  # an AKS node's, which shows the cluster as AKS
        "karpenter.azure.com/sku-gpu-count": "8",
        "karpenter.azure.com/sku-gpu-manufacturer": "amd",
    }
    return {"metadata": {"name": "n2", "labels": labels}, "status": {"allocatable": {"cpu": "96", **gpus}}}


@pytest.mark.parametrize(
    "node",
    [
        pytest.param(  # no GFD label, no GPU allocatable yet; an EKS nodegroup's label says nothing of its GPUs
            {"metadata": {"name": "n2", "labels": {"eks.amazonaws.com/nodegroup": "h100"}}, "status": {}},
            id="eks-gpu-node-joining",
        ),
        pytest.param(_azure_amd_node({"amd.com/gpu": "8"}), id="amd-node"),  # a GPU node, of another maker
        # the same before its device plugin is up: its SKU's labels say it has GPUs, AMD's
        pytest.param(_azure_amd_node({}), id="amd-node-joining"),
    ],
)
@pytest.mark.parametrize("providers", [["all"], ["aks"]])
def test_a_daemonset_pod_on_a_node_not_known_to_be_a_cpu_node_is_not_told_its_node_has_no_gpu(node, providers):
    """A DaemonSet's pod made for a GPU node that has just joined (no GFD label nor GPU allocatable yet, and no label
    of its provider says it has GPUs), or for an AMD node, was told its node has no GPU and to keep the DaemonSet off
    nodes without GPUs. It is told that no NVIDIA GPU device is seen there, and the layout advice; on an AMD node,
    that its GPUs are another maker's, by the label that says so. Whatever the providers named: an AKS cluster that
    named aks alone read no karpenter.azure.com/sku-gpu-count, and took an AMD node of its node auto-provisioning,
    joining, for a CPU node (found by a review)."""
    s = settings()
    s = replace(s, cluster=replace(s.cluster, providers=providers))
    gpu = mixed_node("gpu-1", A100_80, {"1g.10gb": 56}, "a100", 81920)
    nodes = [gpu, {"apiVersion": "v1", "kind": "Node", **node}]
    live = through_app(workload("DaemonSet", frac("0.1")), nodes, s).object
    (event,) = [e for e in through_app(_daemon_pod_of(live, "n2"), nodes, s).events if e.reason == "MIGUnoffered"]
    hint = _other_maker("karpenter.azure.com", "sku-gpu-manufacturer") if "amd" in str(node) else _NONE_SEEN
    assert event.message.endswith(hint), event.message


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        pytest.param([], "pool a100-40, its pods on pool a100-80 stay Pending", id="pending-elsewhere"),
        pytest.param(
            [mixed_node("n3", A100_40, {"3g.20gb": 2}, "a100-40b", 40960)],
            "pools a100-40, a100-40b, its pods on pool a100-80 stay Pending",
            id="several-pools",
        ),
    ],
)
def test_a_daemonset_pod_where_its_device_is_keeps_its_templates_line_and_is_told_assigned(extra, where):
    """A DaemonSet's template line names every pool it serves and those its pods stay Pending on, where the pod its
    controller makes for a node reaches that node's pool alone: the pod on an A100-40GB node, which runs, had its
    line made 'trainer: nvidia.com/mig-3g.20gb (as found on the object)' and got no MIGAssigned Event (found by a
    review of MIG)."""
    ctx = context([*DAEMON_NODES, *extra])
    live = pipeline.mutate(workload("DaemonSet", frac("0.5")), ctx).object
    line = f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb ({A100_40}, {where})"
    assert mig_annotation(live) == line
    mutated = pipeline.mutate(_daemon_pod_of(live, "n1"), ctx)
    assert mutated.allowed and mutated.patch == [] and mutated.warnings == []
    validated = pipeline.validate(mutated.object, ctx)
    assert validated.warnings == []
    assert [(e.reason, e.message) for e in validated.outcome.events] == [("MIGAssigned", f"MIG devices: {line}")]


def test_a_refusal_while_a_mig_layout_is_changing_says_so_and_when_to_try_again():
    """MIG Manager withholds a node's devices while it applies a layout: the refusal said the eligible nodes offer
    no MIG profiles and to add MIG-partitioned nodes (found by a review of day-2 journeys)."""
    changing = _changing_layout()
    result = review(frac("0.5"), [changing])
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert (
        "The MIG layout of pool a100 (nvidia.com/mig.config=all-3g.40gb, pending) is changing: its MIG devices are"
        " offered again once MIG Manager has applied it. Create the pod again once the layout is applied"
    ) in result.message, result.message
    assert "add MIG-partitioned nodes" not in result.message
    # a pod its own rules keep on another pool is not told to wait for this one (found by a review of the change)
    other = whole_node("h", A100_80, 8, "h100")
    pinned = frac("0.5")
    pinned["spec"]["nodeSelector"] = {POOL: "h100"}
    result = review(pinned, [changing, other])
    assert not result.allowed and "is changing" not in result.message, result.message


def test_the_fallback_goes_before_a_profile_on_a_driver_too_old_for_the_pod():
    """Found by a review of day-2 journeys: mid-upgrade, only the old-driver pool was MIG-partitioned; with
    mig.fallback whole, a 0.5 GPU pod whose CUDA only the new driver runs got the old pool's profile and was
    denied, though a whole GPU on the new pool could run it."""
    from tests.cuda_fixtures import container as cuda_container
    from tests.cuda_fixtures import gpu_node
    from tests.cuda_fixtures import pod as cuda_pod

    mig_labels = {
        "nvidia.com/mig.strategy": "mixed",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig-3g.40gb.memory": "40192",
    }
    nodes = [
        gpu_node("a-0", "a", "535.104.05", labels=mig_labels, gpus="0", allocatable={"nvidia.com/mig-3g.40gb": "2"}),
        gpu_node("b-0", "b", "570.124.06"),
    ]
    wanted = cuda_pod(cuda_container(image="pytorch/pytorch-nightly:2710000-cu12.8", gpu="0.5"))
    s = replace(settings(fallback="whole"), cuda=CudaSettings())
    result = review(copy.deepcopy(wanted), nodes, s)
    assert result.allowed, result.message
    assert result.object["spec"]["containers"][0]["resources"]["limits"] == {GPU: "1"}
    assert "whole GPU: no MIG profile covers it" in (result.object["metadata"]["annotations"]["gpu-admission.io/mig"])
    denied = review(copy.deepcopy(wanted), nodes, replace(settings(), cuda=CudaSettings()))  # no fallback: as before
    assert not denied.allowed and denied.reason == "CUDAIncompatible"


@pytest.mark.parametrize("sections", [("requests",), ("limits", "requests")])
@pytest.mark.parametrize("gke", [False, True])
def test_kubectl_apply_converts_afresh_an_ask_written_in_requests_too(sections, gke):
    """Found by a generative review of the policies together: only a fraction in limits alone was seen coming
    back. Written in requests only, every later apply was refused ('already has nvidia.com/mig-3g.40gb'; on
    GKE 'request 0.5 and limit 1'); written in both (the usual shape), the GKE partition pin of the earlier
    conversion stayed."""
    if gke:
        nodes = [
            gke_node("g3", "nvidia-a100-80gb", "3g.40gb", 2, "p3"),
            gke_node("g1", "nvidia-a100-80gb", "1g.20gb", 4, "p1"),
        ]
    else:
        nodes = [mixed_node("m", A100_80, {"1g.20gb": 4, "3g.40gb": 2}, "a100", 81920)]
    ctx = context(nodes)
    asked: dict[str, Any] = {section: {GPU: "0.5"} for section in sections}
    live = pipeline.mutate(
        workload("Deployment", pod(container(limits=asked.get("limits"), requests=asked.get("requests")))), ctx
    ).object
    sent = copy.deepcopy(live)  # the manifest now asks a quarter, in the same sections: merged into the live one
    resources = template_of(sent)["spec"]["containers"][0]["resources"]
    for section in sections:
        resources.setdefault(section, {})[GPU] = "0.25"
    update = replace(ctx, operation="UPDATE", old_object=live)
    result = pipeline.mutate(sent, update)
    assert result.allowed, result.message
    template = template_of(result.object)
    if gke:
        assert template["spec"]["nodeSelector"] == {"cloud.google.com/gke-gpu-partition-size": "1g.20gb"}
        assert template["spec"]["containers"][0]["resources"] == {"limits": {GPU: "1"}, "requests": {GPU: "1"}}
    else:
        assert template["spec"]["containers"][0]["resources"] == mig("1g.20gb")
    assert pipeline.mutate(copy.deepcopy(result.object), update).patch == []


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def _hardening_context() -> Any:
    """The hardening fixtures' cluster (mixed and single-strategy MIG pools, drivers 535 to 570) in namespace ml."""
    from tests.hardening_fixtures import cluster_nodes, hardening_settings
    from webhook.cluster import build_view
    from webhook.model import Context

    settings = hardening_settings()
    return Context(settings=settings, cluster=build_view(cluster_nodes(), settings), namespace="ml")


def _infer(limits: dict[str, str]) -> dict[str, Any]:
    """A Deployment of one container 'server' with these limits."""
    container = {"name": "server", "image": "nvidia/cuda:12.2.2-base-ubuntu22.04", "resources": {"limits": limits}}
    template = {"metadata": {"labels": {"app": "infer"}}, "spec": {"containers": [container]}}
    spec = {"selector": {"matchLabels": {"app": "infer"}}, "template": template}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "infer", "namespace": "ml"},
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("fraction", "now"),
    [
        pytest.param("0.5", {"cpu": "1"}, id="mixed-strategy-no-gpu-now"),
        pytest.param("0.125", {"cpu": "1"}, id="single-strategy-no-gpu-now"),
        pytest.param("0.125", {"cpu": "1", "nvidia.com/gpu": "1"}, id="single-strategy-a-whole-gpu-now"),
    ],
)
def test_a_conversion_whose_ask_the_manifest_drops_is_taken_out(fraction: str, now: dict[str, str]) -> None:
    """Found by a generative review: a Deployment applied with a fraction and then without any GPU ask kept its MIG
    device (mixed strategy), or, on single-strategy nodes, the webhook's request of one GPU without the limit that
    kubectl took out (the apiserver refused the apply) and the partition pin; one that asks a whole GPU now was
    kept on MIG instances by the pin. What the conversion wrote goes, what the manifest writes stays."""
    ctx = _hardening_context()

    def applied(written: dict[str, Any]) -> dict[str, Any]:
        sent = copy.deepcopy(written)
        sent["metadata"]["annotations"] = {LAST_APPLIED: json.dumps(written)}
        return sent

    first = _infer({"cpu": "1", "nvidia.com/gpu": fraction})
    live = pipeline.mutate(applied(first), ctx).object
    converted = live["spec"]["template"]["metadata"]["annotations"]["gpu-admission.io/mig"]
    assert f"nvidia.com/gpu {fraction} -> " in converted
    # kubectl's three-way merge: the limit it applied goes, the rest of the live template stays; a label changed
    # with it (a template left as it was is not sent, README: that case, and only the fraction gone, stay)
    edited = _infer(now)
    edited["spec"]["template"]["metadata"]["labels"]["rev"] = "2"
    sent = copy.deepcopy(live)
    sent["metadata"]["annotations"] = applied(edited)["metadata"]["annotations"]
    sent["spec"]["template"]["metadata"]["labels"]["rev"] = "2"
    resources = sent["spec"]["template"]["spec"]["containers"][0]["resources"]
    resources["limits"].pop("nvidia.com/gpu", None)
    resources["limits"].update(now)
    result = pipeline.mutate(sent, replace(ctx, operation="UPDATE", old_object=live))
    assert result.allowed, result.message
    template = result.object["spec"]["template"]
    assert template["spec"]["containers"][0]["resources"] == {"limits": now}
    assert "nodeSelector" not in template["spec"]
    assert "gpu-admission.io/mig" not in template["metadata"].get("annotations", {})
    again = pipeline.mutate(copy.deepcopy(result.object), replace(ctx, operation="UPDATE", old_object=live))
    assert again.patch == []
    # the manifest unchanged (the fraction as before): the conversion stays as it is
    kept = copy.deepcopy(live)
    kept["spec"]["template"]["metadata"]["labels"]["rev"] = "2"
    result = pipeline.mutate(kept, replace(ctx, operation="UPDATE", old_object=live))
    assert result.object["spec"]["template"]["spec"] == live["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    ("containers", "said"),
    [
        pytest.param(
            [("embed", "pytorch/pytorch-nightly:2710000-cu12.8", {"gpu-admission.io/gpu-memory": "40Gi"})],
            "gpu-admission.io/gpu-memory 40Gi: its pods are refused: only a driver too old for their CUDA offers it",
            id="held-only-on-too-old-a-driver",
        ),
        pytest.param(
            [
                ("embed", "nvidia/cuda:12.4.1-runtime-ubuntu22.04", {"gpu-admission.io/gpu-memory": "10Gi"}),
                ("sidecar", "nvidia/cuda:12.4.1-runtime-ubuntu22.04", {"nvidia.com/gpu": "0.125"}),
            ],
            "gpu-admission.io/gpu-memory 10Gi: largest offered is 1g.5gb; ask for less or its pods are refused",
            id="a-later-containers-pin-takes-every-profile-away",
        ),
    ],
)
def test_a_template_whose_pods_will_all_be_refused_for_a_deferred_ask_says_so(
    containers: list[tuple[str, str, dict[str, str]]], said: str
) -> None:
    """Found by a generative review: a Deployment asking a memory size (converted on each pod) was admitted
    without a word, and every pod then refused: the only profile holding 40Gi is on a driver too old for CUDA
    12.8; a sidecar's fraction, converted in the template and pinned to a single-strategy product, left no
    profile of 10Gi."""
    ctx = _hardening_context()
    spec = {"containers": [{"name": n, "image": i, "resources": {"limits": limits}} for n, i, limits in containers]}
    template = {"metadata": {"labels": {"app": "embed"}}, "spec": spec}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "embed", "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"app": "embed"}}, "template": template},
    }
    result = pipeline.review(deployment, ctx)
    assert result.allowed
    assert any(w.startswith(f"embed: {said}") for w in result.warnings), result.warnings
    made = copy.deepcopy(result.object["spec"]["template"])
    made["metadata"].update(name="embed-1", namespace="ml")
    for c in made["spec"]["containers"]:
        c["resources"]["requests"] = dict(c["resources"]["limits"])
    assert not pipeline.review({"apiVersion": "v1", "kind": "Pod", **made}, ctx).allowed, "as the warning says"


def test_an_updates_review_called_again_keeps_its_own_words() -> None:
    """Found by a generative review: 0.5 made 0.4 (the same profile) wrote a template equal to the stored one with
    new words; the apiserver's second call (reinvocation, after another webhook's change) took the update for one
    that leaves the template as stored and put the stale words back. Words edited by hand still are."""
    ctx = _hardening_context()

    live = pipeline.mutate(_infer({"nvidia.com/gpu": "0.5"}), ctx).object
    sent = copy.deepcopy(live)  # kubectl apply of 0.4: the fraction back beside the device
    sent["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "0.4"
    update = replace(ctx, operation="UPDATE", old_object=live)
    first = pipeline.mutate(sent, update)
    words = first.object["spec"]["template"]["metadata"]["annotations"]["gpu-admission.io/mig"]
    assert words.startswith("server: nvidia.com/gpu 0.4 -> nvidia.com/mig-3g.40gb")
    assert first.object["spec"]["template"]["spec"] == live["spec"]["template"]["spec"]
    assert pipeline.mutate(copy.deepcopy(first.object), update).patch == []
    forged = copy.deepcopy(live)
    forged["spec"]["template"]["metadata"]["annotations"]["gpu-admission.io/mig"] = "server: fine (trust me)"
    kept = pipeline.mutate(forged, update)
    assert kept.object["spec"]["template"] == live["spec"]["template"], "put back as stored"


@pytest.mark.parametrize("queued", [True, False])
@pytest.mark.parametrize(
    ("limits", "annotations", "said"),
    [
        pytest.param(
            {"gpu-admission.io/gpu-memory": "20Gi"}, {}, "Kueue sees it as written, in no ClusterQueue", id="memory"
        ),
        pytest.param(
            {"cpu": "1"}, {"gpu-admission.io/gpu-fraction": "0.5"}, "Kueue charges no GPU for it", id="annotation"
        ),
    ],
)
def test_a_kueue_workloads_ask_left_for_its_pods_is_said_to_escape_its_quota(
    queued: bool, limits: dict[str, str], annotations: dict[str, str], said: str
) -> None:
    """Found by a review of the webhook with Kueue: Kueue reckons a Job's quota from its template, where a memory
    size (a resource no ClusterQueue lists: the Job waits for ever) or the fraction annotation (no GPU charged) is
    left for the pods to convert."""
    ctx = _hardening_context()
    container = {"name": "embed", "image": "nvidia/cuda:12.2.2-base-ubuntu22.04", "resources": {"limits": limits}}
    template = {"metadata": {"annotations": annotations}, "spec": {"restartPolicy": "Never", "containers": [container]}}
    labels = {"kueue.x-k8s.io/queue-name": "user-queue"} if queued else {}
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "embed", "namespace": "ml", "labels": labels},
        "spec": {"suspend": True, "template": template},
    }
    result = pipeline.review(job, ctx)
    assert result.allowed
    assert any(said in w for w in result.warnings) is queued, result.warnings


def test_a_conversion_stays_where_kubectls_manifest_is_older_than_the_ask() -> None:
    """Found by a review of this session's commits: the manifest in last-applied-configuration is written by
    client-side kubectl apply alone; a fraction set later by kubectl edit (converted) lost its device at the next
    update (a rollout restart), read against the stale manifest's whole GPU. Only a manifest that asked the fraction
    before, and asks none now, drops it."""
    ctx = _hardening_context()
    container: dict[str, Any] = {"name": "server", "image": "nvidia/cuda:12.2.2-base-ubuntu22.04"}
    container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    template = {"metadata": {"labels": {"app": "infer"}}, "spec": {"containers": [container]}}
    manifest: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "infer", "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"app": "infer"}}, "template": template},
    }
    applied = copy.deepcopy(manifest)
    applied["metadata"]["annotations"] = {LAST_APPLIED: json.dumps(manifest)}
    live = pipeline.mutate(applied, ctx).object
    edited = copy.deepcopy(live)  # kubectl edit: the fraction, the manifest as it was
    edited["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "0.5"}}
    live = pipeline.mutate(edited, replace(ctx, operation="UPDATE", old_object=live)).object
    assert "nvidia.com/mig-3g.40gb" in live["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    restarted = copy.deepcopy(live)
    restarted["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = (
        "2026-12-04T20:00:00Z"
    )
    result = pipeline.mutate(restarted, replace(ctx, operation="UPDATE", old_object=live))
    kept = result.object["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert kept == live["spec"]["template"]["spec"]["containers"][0]["resources"], kept


@pytest.mark.parametrize("gated", [True, False])
def test_a_gated_fraction_may_take_a_profile_on_a_tainted_pool(gated: bool) -> None:
    """Found by a review of this session's commits: the CUDA policy judges a gated pod with any toleration added
    (what takes its gate away may add them: Kueue's flavors), the MIG policy did not, and a gated fraction whose
    only MIG pool is tainted was refused at its create."""
    taint = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    nodes = [mixed_node("a0", A100_40, {"3g.20gb": 2}, "tainted", 40960, taints=taint)]
    obj = frac("0.5")
    if gated:
        obj["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    result = review(obj, nodes)
    assert result.allowed is gated, result.message
    if gated:
        assert resources_of(result.object)["limits"] == {"nvidia.com/mig-3g.20gb": "1"}


@pytest.mark.parametrize("where", ["job-template", "cronjob"])
def test_a_cronjobs_queue_is_read_where_its_jobs_get_it(where: str) -> None:
    """Kueue queues the Jobs a CronJob makes by the label on its job template (the Jobs get that metadata, not the
    CronJob's own)."""
    ctx = _hardening_context()
    container: dict[str, Any] = {"name": "embed", "image": "nvidia/cuda:12.2.2-base-ubuntu22.04"}
    container["resources"] = {"limits": {"gpu-admission.io/gpu-memory": "20Gi"}}
    template = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    labels = {"kueue.x-k8s.io/queue-name": "user-queue"}
    job_template: dict[str, Any] = {"spec": {"template": template}}
    cron: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "ml"},
    }
    cron["spec"] = {"schedule": "0 1 * * *", "jobTemplate": job_template}
    if where == "job-template":
        job_template["metadata"] = {"labels": labels}
    else:
        cron["metadata"]["labels"] = labels
    result = pipeline.review(cron, ctx)
    assert any("Kueue sees it as written" in w for w in result.warnings) is (where == "job-template"), result.warnings


CUDA_12_8 = "pytorch/pytorch-nightly:2710000-cu12.8"
DRIVER_535 = {"nvidia.com/cuda.driver-version.full": "535.104.05"}
DRIVER_570 = {"nvidia.com/cuda.driver-version.full": "570.124.06"}
KARPENTER_SPOT = {"karpenter.sh/capacity-type": "spot"}
FRACTION_SPOT_NEVER = {"gpu-admission.io/gpu-fraction": "0.5", "gpu-admission.io/spot": "never"}
GKE_SPOT = {"cloud.google.com/gke-spot": "true"}
GKE_SPOT_TAINT = [{"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"}]
DEDICATED_TAINT = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]


def _old_and_new(labels: dict[str, str] | None, taints: list[Any] | None) -> list[dict[str, Any]]:
    """An on-demand A100 pool on 535 (CUDA 12.2) and, when ``labels`` is not None, another on 570 with them."""
    old = mixed_node("a100-od-1", A100_80, {"3g.40gb": 2}, "a100-od", 81920, extra_labels=DRIVER_535)
    if labels is None:
        return [old]
    new = {**DRIVER_570, **labels}
    return [old, mixed_node("a100-new-1", A100_80, {"3g.40gb": 2}, "a100-new", 81920, extra_labels=new, taints=taints)]


@pytest.mark.parametrize(
    ("annotations", "limits", "nodes", "to_fix"),
    [
        pytest.param(
            FRACTION_SPOT_NEVER,
            {},
            _old_and_new(KARPENTER_SPOT, None),
            "target pool a100-new",
            id="annotation-spot-never-keeps-them-off-the-new-driver",
        ),
        pytest.param(
            FRACTION_SPOT_NEVER,
            {},
            _old_and_new(GKE_SPOT, GKE_SPOT_TAINT),
            "target pool a100-new",
            id="annotation-spot-never-the-new-driver-is-a-tainted-spot-pool",
        ),
        pytest.param(
            {"gpu-admission.io/gpu-fraction": "0.5"},
            {},
            _old_and_new({}, DEDICATED_TAINT),
            "target pool a100-new",
            id="annotation-the-new-driver-is-tainted",
        ),
        pytest.param(
            {"gpu-admission.io/gpu-fraction": "0.5", "gpu-admission.io/gpu-fraction-container": "trainer"},
            {},
            _old_and_new(None, None),
            "Use an image built for CUDA <= 12.2; or upgrade the driver to >= 570.26 on pool a100-od.",
            id="annotation-naming-its-container-no-new-driver-at-all",
        ),
        pytest.param(
            {"gpu-admission.io/spot": "never"},
            {MEM: "40Gi"},
            _old_and_new(KARPENTER_SPOT, None),
            "target pool a100-new",
            id="memory-spot-never-keeps-them-off-the-new-driver",
        ),
    ],
)
def test_a_template_whose_pods_are_all_refused_for_their_cuda_says_so_whatever_the_ask(
    annotations: dict[str, str], limits: dict[str, str], nodes: list[dict[str, Any]], to_fix: str
) -> None:
    """Found by a generative review of workload lifecycles: a Deployment with the gpu-fraction annotation, spot
    never and an image for CUDA 12.8 was admitted without a word, and each of its pods refused: spot never keeps
    them off the only pool whose driver runs CUDA 12.8. Spot never was not the cause (a memory size so kept off
    was warned of): the container the annotation gives its fraction to asks for no GPU in the template, so the
    CUDA its pods need was not known where the template's ask was judged; a tainted pool or none at all did the
    same. The pod's own refusal is as it was."""
    s = replace(settings(), cuda=CudaSettings())
    # the annotation gives its fraction to the container it names (here after one asking no GPU), else the first
    first = [container("log", image="busybox:1.36")] if "gpu-fraction-container" in annotations else []
    template_pod = pod(*first, container(limits=limits, image=CUDA_12_8), annotations=annotations)
    deployment = review(workload("Deployment", template_pod), nodes, s)
    assert deployment.allowed, deployment.message
    asked = "gpu-admission.io/gpu-fraction 0.5" if not limits else f"{MEM} 40Gi"
    said = f"trainer: {asked}: its pods are refused: only a driver too old for their CUDA offers it"
    assert any(w.startswith(said) for w in deployment.warnings), deployment.warnings
    cuda = (
        "cuda: trainer needs CUDA 12.8: each pod will be denied, no pool its pods can reach supports it (pool a100-od)"
    )
    assert cuda in deployment.warnings
    made = copy.deepcopy(template_of(deployment.object))
    made["metadata"].update(name="trainer-1", namespace="ml")
    created = review({"apiVersion": "v1", "kind": "Pod", **made}, nodes, s)
    assert not created.allowed, "as the warning says"
    assert "needs CUDA 12.8" in created.message and "no node it can run on supports it: pool a100-od" in created.message
    assert to_fix in created.message


@pytest.mark.parametrize("ask", [{MEM: "40Gi"}, {}], ids=["memory", "annotation"])
def test_a_pod_given_its_fraction_by_annotation_takes_a_profile_on_a_driver_that_runs_its_cuda(
    ask: dict[str, str],
) -> None:
    """Found with the case above: a pod given 0.5 by the annotation took the smaller 3g.40gb of a 535 pool, and was
    refused for its CUDA 12.8, where a memory size of 40Gi took the 4g.40gb of the 570 pool: the CUDA of the
    container the annotation names was not known when its profile was chosen."""
    nodes = [
        mixed_node("a100-od-1", A100_80, {"3g.40gb": 2}, "a100-od", 81920, extra_labels=DRIVER_535),
        mixed_node("a100-new-1", A100_80, {"4g.40gb": 1}, "a100-new", 81920, extra_labels=DRIVER_570),
    ]
    annotations = {} if ask else {"gpu-admission.io/gpu-fraction": "0.5"}
    result = review(
        pod(container(limits=ask, image=CUDA_12_8), annotations=annotations),
        nodes,
        replace(settings(), cuda=CudaSettings()),
    )
    assert result.allowed, result.message
    assert resources_of(result.object) == mig("4g.40gb")


@pytest.mark.parametrize("requested", [False, True], ids=["limits-only", "limits-and-requests"])
def test_a_helm_upgrade_from_a_fraction_to_whole_gpus_takes_the_conversion_out(requested: bool) -> None:
    """Found by a generative review of workload updates without kubectl's manifest (Helm 3 merges the change from
    its last release's manifest into the live object; server-side apply keeps fields its manifest never had): a
    fraction converted on GKE to one GPU of a partition (its request of 1, its partition pin), then the manifest's
    0.5 made 2. The request the webhook wrote, in no manifest, stayed and the update was refused ('request 1 and
    limit 2') on every upgrade; where the manifest had a request too, the pin stayed and 2 GPUs were sent to a
    3g.40gb partition. Now a template's limits alone get the converted GPU, as they alone asked (its pods' requests
    default to their limits), and a whole count other than the conversion's 1 takes the conversion out."""
    nodes = [gke_node("g", "nvidia-a100-80gb", "3g.40gb", 2, "gke-mig"), whole_node("w", A100_80, 8, "a100")]
    ctx = context(nodes)
    asked = {GPU: "0.5"}
    live = pipeline.mutate(
        workload("Deployment", pod(container(limits=asked, requests=asked if requested else None))), ctx
    ).object
    converted = template_of(live)["spec"]
    assert converted["containers"][0]["resources"] == (
        {"limits": {GPU: "1"}, "requests": {GPU: "1"}} if requested else {"limits": {GPU: "1"}}
    )
    assert converted["nodeSelector"] == {"cloud.google.com/gke-gpu-partition-size": "3g.40gb"}
    sent = copy.deepcopy(live)  # the manifest's 0.5 made 2 in the limits, its request (if any) taken out
    resources = template_of(sent)["spec"]["containers"][0]["resources"]
    resources["limits"][GPU] = "2"
    resources.pop("requests", None)
    update = replace(ctx, operation="UPDATE", old_object=live)
    result = pipeline.mutate(sent, update)
    assert result.allowed, result.message
    spec = template_of(result.object)["spec"]
    assert spec["containers"][0]["resources"] == {"limits": {GPU: "2"}}
    assert "nodeSelector" not in spec, "the partition pin went with the conversion"
    assert result.warnings == [
        "trainer: took out the earlier conversion's cloud.google.com/gke-gpu-partition-size=3g.40gb"
    ]
    assert pipeline.validate(result.object, update).allowed
    assert pipeline.mutate(copy.deepcopy(result.object), update).patch == [], "a second pass changes nothing"


A100_40_PCIE = "NVIDIA-A100-PCIE-40GB"
_PINNED_NODES = {
    "nodeSelector": [
        mixed_node("a40", A100_40, {"1g.10gb": 4}, "a100-40", 40960),
        mixed_node("a80", A100_80, {"1g.10gb": 7, "3g.40gb": 2}, "a100-80", 81920),
    ],
    "affinity": [
        mixed_node("a40", A100_40, {"1g.10gb": 4}, "a100-40", 40960),
        mixed_node("p40", A100_40_PCIE, {"1g.10gb": 4}, "pcie-40", 40960),
        mixed_node("a80", A100_80, {"1g.10gb": 7, "3g.40gb": 2}, "a100-80", 81920),
    ],
}


@pytest.mark.parametrize("form", list(_PINNED_NODES))
@pytest.mark.parametrize("client", ["helm", "kubectl", "edit"])
def test_a_changed_fraction_takes_the_model_pin_of_the_earlier_conversion_out(form: str, client: str) -> None:
    """Found by a generative review of workload updates: a template's 0.25 took 1g.10gb, which covers 0.25 only on
    the 40 GB A100s, so the template was pinned to them (a nodeSelector, or required affinity for two products);
    the line did not name the pin, so when the fraction became 0.5 the device went but the pin stayed, and the
    3g.40gb that the 80 GB A100s offer was out of reach: the update was refused. The line names the pin now, and a
    new conversion takes it out with the device (Helm 3, kubectl apply, or the device replaced by hand)."""
    nodes = _PINNED_NODES[form]
    ctx = context(nodes)
    live = pipeline.mutate(workload("Deployment", frac("0.25")), ctx).object
    spec = template_of(live)["spec"]
    products = sorted({n["metadata"]["labels"]["nvidia.com/gpu.product"] for n in nodes[:-1]})
    if form == "nodeSelector":
        assert spec["nodeSelector"] == {"nvidia.com/gpu.product": A100_40}
    else:
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == products
    line = template_of(live)["metadata"]["annotations"]["gpu-admission.io/mig"]
    assert line.startswith(
        f"trainer: nvidia.com/gpu 0.25 -> nvidia.com/mig-1g.10gb (pinned to nvidia.com/gpu.product="
        f"{' or '.join(products)}, "
    ), line
    again = pipeline.mutate(copy.deepcopy(live), replace(ctx, operation="UPDATE", old_object=live))
    assert again.patch == [], "a second pass republishes the line as it is"
    sent = copy.deepcopy(live)  # the manifest's 0.25 made 0.5
    resources = template_of(sent)["spec"]["containers"][0]["resources"]
    if client == "edit":  # by hand: the device replaced by the new fraction, the pin left
        resources["limits"] = {GPU: "0.5"}
    else:  # Helm 3 and kubectl apply merge their manifests' change into the live object: the device stays
        resources["limits"][GPU] = "0.5"
    if client == "kubectl":  # its last-applied manifest, which has no pin
        manifest = workload("Deployment", frac("0.5"))
        manifest["metadata"].pop("annotations", None)
        sent["metadata"].setdefault("annotations", {})["kubectl.kubernetes.io/last-applied-configuration"] = json.dumps(
            manifest
        )
    update = replace(ctx, operation="UPDATE", old_object=live)
    result = pipeline.mutate(sent, update)
    assert result.allowed, result.message
    spec = template_of(result.object)["spec"]
    assert spec["containers"][0]["resources"] == mig_limits("3g.40gb")
    assert "nodeSelector" not in spec and "affinity" not in spec, "the pin went with the conversion"
    assert mig_annotation(result.object) == (
        f"trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.40gb ({A100_80}, pool a100-80)"
    )
    assert pipeline.validate(result.object, update).allowed
    assert pipeline.mutate(copy.deepcopy(result.object), update).patch == [], "a second pass changes nothing"


@pytest.mark.parametrize(
    "given",
    ["nvidia.com/mig-3g.40gb (pinned to team=ml, ", "nvidia.com/gpu 1 with nodeSelector team=ml ("],
    ids=["model-pin", "partition-pin"],
)
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_a_forged_line_cannot_take_a_templates_own_selector_out(operation: str, given: str) -> None:
    """A conversion line naming a pin is the webhook's only as stored by an earlier review: one written into the
    object (on create, or by the update itself) that names the template's own selector as a pin takes nothing out
    (it would free a template of a key another admission controller set)."""
    nodes = [
        mixed_node("a80", A100_80, {"3g.40gb": 2}, "a100-80", 81920, extra_labels={"team": "ml"}),
        mixed_node("b80", A100_80, {"3g.40gb": 2}, "b100-80", 81920),
    ]
    ctx = context(nodes)
    obj = workload("Deployment", frac("0.5"))
    template_of(obj)["spec"]["nodeSelector"] = {"team": "ml"}
    stored = pipeline.mutate(copy.deepcopy(obj), ctx).object
    forged = f"trainer: nvidia.com/gpu 0.5 -> {given}{A100_80}, pool a100-80)"
    template_of(obj)["metadata"].setdefault("annotations", {})["gpu-admission.io/mig"] = forged
    if operation == "UPDATE":
        ctx = replace(ctx, operation="UPDATE", old_object=stored)
        sent = copy.deepcopy(stored)
        resources = template_of(sent)["spec"]["containers"][0]["resources"]
        resources["limits"] = {GPU: "0.5"}  # the device replaced by the fraction: converted afresh
        template_of(sent)["metadata"]["annotations"]["gpu-admission.io/mig"] = forged
        obj = sent
    result = pipeline.mutate(obj, ctx)
    assert result.allowed, result.message
    assert template_of(result.object)["spec"]["nodeSelector"] == {"team": "ml"}
    assert template_of(result.object)["spec"]["containers"][0]["resources"] == mig_limits("3g.40gb")


def test_a_refusal_names_the_other_containers_device_that_keeps_the_pod_off_a_pool() -> None:
    """Two 0.5 asks, one 3g.20gb an A100-40GB node, one 3g.40gb an A100-80GB node: the trainer's took the
    3g.20gb, and the refusal said the 80 GB pool was kept off by 'its node affinity', for a pod with none. It names
    the trainer's device, which that pool does not offer."""
    nodes = [
        mixed_node("a40", A100_40, {"3g.20gb": 1}, "a100-40", 40960),
        mixed_node("a80", A100_80, {"3g.40gb": 1}, "a100-80", 81920),
    ]
    obj = pod(container(limits={GPU: "0.5"}), container("sidecar", limits={GPU: "0.5"}))
    result = review(obj, nodes)
    assert not result.allowed
    assert "a100-80 (3g.40gb; its other containers' nvidia.com/mig-3g.20gb, not offered there)" in result.message


def test_a_refusal_names_the_whole_gpu_that_keeps_the_pod_off_a_single_strategy_pool() -> None:
    """The trainer's whole GPU is a MIG device on a single-strategy pool, so the sidecar's 0.5 cannot go there:
    the refusal blamed 'its node affinity', for a pod with none."""
    nodes = [single_node("s", A100_80, "3g.40gb", 2, "s", 81920), whole_node("w", A100_80, 8, "whole")]
    obj = pod(container(limits={GPU: "1"}), container("sidecar", limits={GPU: "0.5"}), nodeSelector={POOL: "whole"})
    result = review(obj, nodes)
    assert not result.allowed
    assert (
        "s (3g.40gb; its nodeSelector cloud.google.com/gke-nodepool: whole; container trainer (nvidia.com/gpu 1)"
        " asks whole GPUs, which are MIG devices there)" in result.message
    )


def test_a_refusal_sends_the_pod_only_to_pools_whose_profiles_hold_it() -> None:
    """0.5 was told to change its nodeSelector to reach a pool of 1g.5gb (an eighth), and refused there once it
    did (a review of real manifests): a pool out of reach is named as one to reach only where a profile covers the
    ask; the others as too small."""
    nodes = [mixed_node("m", A100_40, {"1g.5gb": 7}, "a100-mig", 40960), whole_node("l", "NVIDIA-L4", 1, "l4")]
    obj = pod(container(limits={GPU: "0.5"}), nodeSelector={POOL: "l4"})
    result = review(obj, nodes)
    assert not result.allowed and result.reason == "MIGNoProfile"
    assert "MIG pools this pod cannot use" not in result.message
    assert result.message.endswith(
        "MIG pools whose profiles are all smaller than it asks: a100-mig (1g.5gb; out of reach too: its nodeSelector"
        " cloud.google.com/gke-nodepool: l4). Ask for at most what those profiles hold and let the pod reach them, or"
        " ask for a whole GPU (nvidia.com/gpu: 1)."
    )
    reachable = review(pod(container(limits={GPU: "0.1"}), nodeSelector={POOL: "l4"}), nodes)
    assert "MIG pools this pod cannot use: a100-mig (1g.5gb; its nodeSelector" in reachable.message


@pytest.mark.parametrize("kind", ["Pod", "Deployment"])
def test_asks_whose_smallest_profiles_are_on_different_models_are_converted_on_one(kind: str) -> None:
    """Two 0.5: the smallest profile of each is the A100-40GB's 3g.20gb, one a node, so the second found none in any
    order, while the A100-80GB offers two 3g.40gb: refused (a generative review). Every ask is tried on one model
    when no order fits them, and the pod is pinned to it (named by the first line)."""
    nodes = [
        mixed_node("a40", A100_40, {"3g.20gb": 1}, "a100-40", 40960),
        mixed_node("a80", A100_80, {"3g.40gb": 2}, "a100-80", 81920),
    ]
    obj = pod(container(limits={GPU: "0.5"}), container("sidecar", limits={GPU: "0.5"}))
    result = review(obj if kind == "Pod" else workload(kind, obj), nodes)
    assert result.allowed, result.message
    spec = template_of(result.object)["spec"]
    assert [c["resources"]["limits"] for c in spec["containers"]] == [{"nvidia.com/mig-3g.40gb": "1"}] * 2
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": A100_80}
    assert (mig_annotation(result.object) or "").startswith(
        "trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.40gb (the pod's fractions fit together only there, "
        f"pinned to nvidia.com/gpu.product={A100_80}, "
    )


@pytest.mark.parametrize(
    ("nodes", "asks", "device", "selector"),
    [
        pytest.param(
            [
                mixed_node("a30", "NVIDIA-A30", {"1g.6gb": 1}, "a30", 24576),
                mixed_node("a40", A100_40, {"1g.10gb": 4}, "a100-40", 40960),
                mixed_node("a80", A100_80, {"1g.10gb": 7}, "a100-80", 81920),
            ],
            ("0.25", "0.25"),
            "1g.10gb",
            ("nvidia.com/gpu.product", A100_40),
            id="model",
        ),
        pytest.param(
            [
                mixed_node("p1", A100_80, {"4g.40gb": 1}, "p1", 81920),
                mixed_node("p0", A100_80, {"7g.80gb": 2}, "p0", 81920),
            ],
            ("0.5", "0.3"),
            "7g.80gb",
            (POOL, "p0"),
            id="pool",
        ),
    ],
)
def test_asks_no_order_fits_are_converted_on_one_model_or_pool_and_pinned_to_it(nodes, asks, device, selector):
    """model: two 0.25, each one's smallest profile the A30's 1g.6gb, one a node, so no order fits both; on the
    next model, the A100-40GB, both take 1g.10gb, which the A100-80GB offers too with 1/8. pool: 0.5 and 0.3 on two
    pools of one model, one 4g.40gb a node on one, two 7g.80gb on the other; each ask's smallest profile is the
    4g.40gb, and the model pass cannot tell the pools apart (a generative review: 100 of 30,045 refusals of plain
    Pods would fit on one pool). The pin is written, and named by the first line (a later change of the asks takes
    it out)."""
    obj = pod(container(limits={GPU: asks[0]}), container("sidecar", limits={GPU: asks[1]}))
    result = review(obj, nodes)
    assert result.allowed, result.message
    spec = result.object["spec"]
    assert [c["resources"]["limits"] for c in spec["containers"]] == [{f"nvidia.com/mig-{device}": "1"}] * 2
    assert spec["nodeSelector"] == dict([selector])
    lines = (mig_annotation(result.object) or "").split("; ")
    assert lines[0].startswith(
        f"trainer: nvidia.com/gpu {asks[0]} -> nvidia.com/mig-{device} (the pod's fractions fit together only "
        f"there, pinned to {selector[0]}={selector[1]}, "
    )
    assert "pinned" not in lines[1]


def test_asks_converted_on_one_single_strategy_model_keep_its_selector() -> None:
    """The model pass's pin on a single-strategy pool is the conversions' own nodeSelector (its product holds the
    profile's name): it was taken out as needless, and each container was left a bare nvidia.com/gpu 1, free to
    land on a GKE partition of 4g.20gb (1/2 of a 40 GB A100, below the 0.5 of an 80 GB one) or on whole GPUs."""
    nodes = [
        single_node("s", A100_80, "4g.40gb", 2, "p0", 81920),
        gke_node("g", "nvidia-tesla-a100", "4g.20gb", 1, "d1"),
        whole_node("w", A100_80, 8, "whole"),
    ]
    obj = pod(container(limits={"cpu": "1", GPU: "0.5"}), container("sidecar", limits={"cpu": "1", GPU: "0.2"}))
    ctx = context(nodes)
    result = pipeline.mutate(copy.deepcopy(obj), ctx)
    assert result.allowed, result.message
    spec = result.object["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": f"{A100_80}-MIG-4g.40gb"}
    assert [c["resources"]["limits"] for c in spec["containers"]] == [{"cpu": "1", GPU: "1"}] * 2
    assert "pinned to" not in (mig_annotation(result.object) or "pinned to")
    assert pipeline.validate(result.object, ctx).allowed
    assert pipeline.mutate(copy.deepcopy(result.object), ctx).patch == [], "a second pass changes nothing"


def test_a_refusal_names_the_whole_gpu_a_mixed_pool_has_none_of() -> None:
    """A mixed pool whose GPUs are all cut into MIG devices offers no whole nvidia.com/gpu: the trainer's keeps the
    pod off it, and the refusal blamed 'its node affinity'."""
    nodes = [mixed_node("m", A100_40, {"7g.40gb": 1}, "p0", 40960)]
    result = review(pod(container(limits={GPU: "1"}), container("sidecar", limits={GPU: "0.5"})), nodes)
    assert not result.allowed
    assert "p0 (7g.40gb; container trainer (nvidia.com/gpu 1) asks whole GPUs, none offered there)" in result.message


def test_a_model_pin_that_a_conversions_own_selector_implies_is_not_written() -> None:
    """The model pass's pin to an A100-80GB of two single-strategy layouts is required affinity on both products;
    the conversions' own nodeSelector on the 4g.40gb product implies it, and a line said 'with nodeSelector X
    (pinned to X or Y, ...)'."""
    nodes = [
        mixed_node("a40", A100_40, {"3g.20gb": 1}, "a100-40", 40960),
        single_node("s4", A100_80, "4g.40gb", 2, "s4", 81920),
        single_node("s1", A100_80, "1g.10gb", 7, "s1", 81920),
    ]
    result = review(pod(container(limits={GPU: "0.5"}), container("sidecar", limits={GPU: "0.5"})), nodes)
    assert result.allowed, result.message
    spec = result.object["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": f"{A100_80}-MIG-4g.40gb"}
    assert "affinity" not in spec
    assert "pinned to" not in (mig_annotation(result.object) or "pinned to")


def test_a_pool_that_is_no_model_is_tried_though_pools_are_as_many_as_models() -> None:
    """Two pools and two models, but pool p1 holds an 80 GB node and a 40 GB one: the pool pass was skipped (as many
    pools as models), and 0.5 + 0.3 refused though pool p0's node holds both."""
    nodes = [
        mixed_node("a", A100_80, {"4g.40gb": 1}, "p1", 81920),
        mixed_node("b", A100_80, {"7g.80gb": 2}, "p0", 81920),
        mixed_node("c", A100_40, {"1g.5gb": 1}, "p1", 40960),
    ]
    result = review(pod(container(limits={GPU: "0.5"}), container("sidecar", limits={GPU: "0.3"})), nodes)
    assert result.allowed, result.message
    assert result.object["spec"]["nodeSelector"] == {POOL: "p0"}


def test_the_mig_annotation_and_event_write_a_users_container_name_escaped_and_read_it_back() -> None:
    """A container's name is a DNS label in a valid pod, but the webhook sees a pod before its validation: one with a
    newline and a right-to-left override in its name was written into gpu-admission.io/mig as it is, which
    ``kubectl describe`` shows as stored (a forged line of its own, a reordered line); the cuda annotation escapes
    it. Read back by the escaped name, a second pass keeps the line, and the MIGAssigned Event names it escaped."""
    forged = "main\nforged line\u202ex"
    first = through_app(pod(container(forged, limits={GPU: "0.5"})), [a100_40()])
    line = (
        "main\\nforged line\\u202ex: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb (NVIDIA-A100-SXM4-40GB, pool a100-40)"
    )
    assert mig_annotation(first.object) == line
    assert [e.message for e in first.events if e.reason == "MIGAssigned"] == [f"MIG devices: {line}"]
    again = through_app(first.object, [a100_40()])
    assert again.object == first.object
    assert [e.message for e in again.events if e.reason == "MIGAssigned"] == [f"MIG devices: {line}"]

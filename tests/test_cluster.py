"""The cluster model: GPU facts from node labels, pools, declared pools, node-list files, the pools view."""

from __future__ import annotations

import dataclasses
import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import FIXTURES
from tests.cuda_fixtures import container, gpu_node
from tests.cuda_fixtures import pod as cuda_pod
from tests.test_cuda_policy import IMAGE_124, IMAGE_128
from webhook import budget, cluster, pipeline
from webhook.cluster import (
    MANY_GROUPS,
    MIN_NAME,
    ClusterView,
    MigOffer,
    Node,
    NodeGroup,
    Taint,
    build_view,
    cluster_from_file,
    format_pools,
    parse_node,
    pool_names,
    read_node_file,
    same_node,
)
from webhook.config import ClusterSettings, PoolSettings, Settings, TaintSpec, load_settings
from webhook.errors import InputError
from webhook.model import Context
from webhook.pipeline import Result

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def node(
    name: str = "n1",
    labels: dict[str, str] | None = None,
    alloc: dict[str, Any] | None = None,
    taints: list[Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": annotations or {},
        },
        "spec": {"taints": taints or []},
        "status": {"allocatable": {"cpu": "8", **(alloc if alloc is not None else {"nvidia.com/gpu": "1"})}},
    }


def one(
    labels: dict[str, str], alloc: dict[str, Any] | None = None, settings: Settings | None = None, **kw: Any
) -> NodeGroup:
    view = build_view([node(labels=labels, alloc=alloc, **kw)], settings or Settings())
    (group,) = view.groups
    return group


# ---------------------------------------------------------------------------------------------------------------
# The example cluster: GKE, EKS, AKS, Karpenter, k3s


@pytest.fixture(scope="module")
def example() -> ClusterView:
    settings = load_settings(EXAMPLES / "config-cluster.yaml", environ={})
    return cluster_from_file(EXAMPLES / "nodes.yaml", settings).snapshot()


def pool_json(view: ClusterView) -> dict[str, dict[str, Any]]:
    return {p.name: p.as_json() for p in view.pools}


EXPECTED: dict[str, dict[str, Any]] = {
    "a100-spot": {
        "nodes": 2,
        "gpu": "NVIDIA-A100-SXM4-80GB",
        "driver": "550.90.07",
        "cuda": "12.4",
        "migStrategy": "gke",
        "migProfiles": {"3g.40gb": 32},
        "spot": True,
    },
    "h100-mixed": {
        "nodes": 1,
        "gpu": "NVIDIA-H100-80GB-HBM3",
        "driver": "570.124.06",
        "cuda": "12.8",
        "migStrategy": "mixed",
        "migProfiles": {"1g.10gb": 14, "3g.40gb": 4},
        "spot": False,
    },
    "a100mig": {
        "nodes": 1,
        "gpu": "NVIDIA-A100-80GB-PCIe",
        "driver": "535.161.08",
        "cuda": "12.2",
        "migStrategy": "single",
        "migProfiles": {"1g.10gb": 7},
        "spot": True,
    },
    "inference": {
        "nodes": 2,
        "gpu": "NVIDIA-L4, Tesla-T4",
        "driver": "550.127.05, 560.35.03",
        "cuda": "12.6",
        "migStrategy": "none",
        "migProfiles": {},
        "spot": True,
    },
    "NVIDIA-GeForce-RTX-4090/driver-535.183.01": {
        "nodes": 1,
        "gpu": "NVIDIA-GeForce-RTX-4090",
        "driver": "535.183.01",
        "cuda": "12.2",
        "migStrategy": "none",
        "migProfiles": {},
        "spot": False,
    },
    "h200-spot": {
        "nodes": 0,
        "gpu": "NVIDIA-H200",
        "driver": "570.133.20",
        "cuda": "12.8",
        "migStrategy": "none",
        "migProfiles": {},
        "spot": True,
    },
    "default-pool": {
        "nodes": 1,
        "gpu": None,
        "driver": None,
        "cuda": None,
        "migStrategy": "none",
        "migProfiles": {},
        "spot": False,
    },
}


@pytest.mark.parametrize("name", list(EXPECTED), ids=list(EXPECTED))
def test_example_pools(example: ClusterView, name: str) -> None:
    assert pool_json(example)[name] == {"name": name, **EXPECTED[name]}


def test_example_has_exactly_these_pools(example: ClusterView) -> None:
    assert set(pool_json(example)) == set(EXPECTED)
    assert example.node_count == 8


@pytest.mark.parametrize(
    ("pool", "driver_source", "cuda_source"),
    [
        pytest.param("a100-spot", "settings (pool a100-spot)", "driver 550.90.07 via the CUDA/driver table", id="gke"),
        pytest.param(
            "h100-mixed", "nvidia.com/cuda.driver-version.full", "nvidia.com/cuda.runtime-version.*", id="eks-new-gfd"
        ),
        pytest.param("a100mig", "nvidia.com/cuda.driver.*", "nvidia.com/cuda.runtime.*", id="aks-old-gfd"),
        pytest.param(
            "NVIDIA-GeForce-RTX-4090/driver-535.183.01",
            "nvidia.com/cuda.driver.*",
            "nvidia.com/cuda.runtime.*",
            id="k3s-old-gfd",
        ),
    ],
)
def test_example_sources(example: ClusterView, pool: str, driver_source: str, cuda_source: str) -> None:
    (group,) = [g for g in example.groups if g.pool == pool]
    assert (group.driver_source, group.cuda_source) == (driver_source, cuda_source)


def test_example_facts(example: ClusterView) -> None:
    groups = {(g.pool, g.gpu_product): g for g in example.groups}
    h100 = groups["h100-mixed", "NVIDIA-H100-80GB-HBM3"]
    assert h100.mig_profiles == {"1g.10gb": MigOffer(14, 9984), "3g.40gb": MigOffer(4, 40448)}
    assert "7g.80gb" not in h100.mig_profiles, "allocatable 0 is stale and offered nowhere"
    assert h100.mig_capable and h100.mig_config_state == "success" and h100.gpu_count == 8
    aks = groups["a100mig", "NVIDIA-A100-80GB-PCIe"]
    assert aks.mig_profiles == {"1g.10gb": MigOffer(7, 9728)} and aks.spot
    t4 = groups["inference", "Tesla-T4"]
    assert (t4.sharing, t4.gpu_replicas, t4.spot) == ("time-slicing", 4, False)
    l4 = groups["inference", "NVIDIA-L4"]
    assert (l4.sharing, l4.spot) == ("none", True)
    gke = groups["a100-spot", "NVIDIA-A100-SXM4-80GB"]
    assert gke.mig_profiles == {"3g.40gb": MigOffer(16)} and len(gke.nodes) == 2, "hostnames are volatile"
    assert groups["h200-spot", "NVIDIA-H200"].declared


def test_format_pools_table(example: ClusterView) -> None:
    text = format_pools(example)
    lines = text.splitlines()
    assert lines[0].split() == ["POOL", "NODES", "GPU", "DRIVER", "CUDA", "MIG", "SPOT"]
    row = next(line for line in lines if line.startswith("a100-spot"))
    assert "550.90.07 (config)" in row and "gke: 3g.40gb x32" in row and row.endswith("yes")
    assert any(line.startswith("h200-spot") and "0 (declared)" in line for line in lines)
    assert "Tesla-T4 (time-slicing)" in text
    assert "8 nodes from node list" in text


# ---------------------------------------------------------------------------------------------------------------
# GPU facts from labels


@pytest.mark.parametrize(
    ("labels", "driver", "cuda"),
    [
        pytest.param({"nvidia.com/cuda.driver-version.full": "550.107.02"}, "550.107.02", "12.4", id="new-full"),
        pytest.param(
            {"nvidia.com/cuda.driver-version.major": "570", "nvidia.com/cuda.driver-version.minor": "26"},
            "570.26",
            "12.8",
            id="new-parts",
        ),
        pytest.param(
            {
                "nvidia.com/cuda.driver.major": "570",
                "nvidia.com/cuda.driver.minor": "26",
                "nvidia.com/cuda.driver.rev": "",
            },
            "570.26",
            "12.8",
            id="old-two-part-empty-rev",
        ),
        pytest.param(
            {
                "nvidia.com/cuda.driver.major": "535",
                "nvidia.com/cuda.driver.minor": "104",
                "nvidia.com/cuda.driver.rev": "05",
            },
            "535.104.05",
            "12.2",
            id="old-three-part",
        ),
        pytest.param(
            {"nvidia.com/cuda.driver-version.full": "580.65.06", "nvidia.com/cuda.runtime-version.full": "13.0"},
            "580.65.06",
            "13.0",
            id="runtime-label",
        ),
        pytest.param({"nvidia.com/cuda.driver-version.full": "525.85.12"}, "525.85.12", "12.0", id="table-12.0"),
        pytest.param(
            {
                "nvidia.com/cuda.driver-version.full": "unknown.unknown.unknown",
                "nvidia.com/cuda.driver-version.major": "unknown",
            },
            "unknown",
            "unknown",
            id="tegra",
        ),
        pytest.param({"nvidia.com/cuda.driver-version.full": "garbage"}, "unknown", "unknown", id="garbage"),
        pytest.param({}, "unknown", "unknown", id="no-labels"),
    ],
)
def test_driver_and_cuda(labels: dict[str, str], driver: str, cuda: str) -> None:
    group = one({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", **labels})
    assert (group.driver_text, group.cuda_text) == (driver, cuda)
    if driver == "unknown":
        assert any(n.startswith("driver unknown") for n in group.notes)


@pytest.mark.parametrize(
    "labels",
    [
        pytest.param({"cuda.driver.major": "550", "cuda.driver.rev": "15"}, id="minor-missing"),
        pytest.param({"cuda.driver-version.major": "550"}, id="only-major"),
        pytest.param({"cuda.driver-version.minor": "54", "cuda.driver-version.revision": "15"}, id="major-missing"),
    ],
)
def test_a_driver_label_with_a_part_missing_is_no_driver(labels: dict[str, str]) -> None:
    """No driver is made up of the parts there are (550.15 would read as CUDA 12.3 and deny CUDA 12.4 pods)."""
    group = one(
        {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", **{f"nvidia.com/{k}": v for k, v in labels.items()}}
    )
    assert (group.driver_text, group.cuda_text) == ("unknown", "unknown")
    assert any(n.startswith("driver unknown") and "not a driver version" in n for n in group.notes)


def test_tegra_note_says_why() -> None:
    group = one({"nvidia.com/gpu.product": "Orin", "nvidia.com/cuda.driver-version.full": "unknown.unknown.unknown"})
    assert "Tegra" in group.notes[0] and group.driver is None and group.pool == "Orin/driver-unknown"


def test_tegra_with_declared_driver_uses_settings() -> None:
    pool = PoolSettings(name="jetson", node_selector={"jetson": "yes"}, driver_version="540.4.0")
    group = one(
        {"jetson": "yes", "nvidia.com/cuda.driver-version.full": "unknown.unknown.unknown"},
        settings=Settings(cluster=ClusterSettings(pools=[pool])),
    )
    assert (group.pool, group.driver_text, group.driver_source) == ("jetson", "540.4.0", "settings (pool jetson)")


@pytest.mark.parametrize(
    ("labels", "alloc", "product", "sharing", "replicas"),
    [
        pytest.param(
            {"nvidia.com/gpu.product": "Tesla-T4-SHARED", "nvidia.com/gpu.replicas": "4"},
            {"nvidia.com/gpu": "4"},
            "Tesla-T4",
            "time-slicing",
            4,
            id="shared-suffix-old-gfd",
        ),
        pytest.param(
            {
                "nvidia.com/gpu.product": "NVIDIA-L4",
                "nvidia.com/gpu.sharing-strategy": "mps",
                "nvidia.com/gpu.replicas": "2",
            },
            {"nvidia.com/gpu.shared": "2"},
            "NVIDIA-L4",
            "mps",
            2,
            id="mps-renamed",
        ),
        pytest.param(
            {"nvidia.com/gpu.product": "NVIDIA-L4"},
            {"nvidia.com/gpu.shared": "4"},
            "NVIDIA-L4",
            "time-slicing",
            0,
            id="shared-resource-only",
        ),
        pytest.param(
            {
                "nvidia.com/gpu.product": "NVIDIA-L4",
                "nvidia.com/gpu.sharing-strategy": "none",
                "nvidia.com/gpu.replicas": "1",
            },
            {"nvidia.com/gpu": "1"},
            "NVIDIA-L4",
            "none",
            0,
            id="none",
        ),
        pytest.param(
            {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED", "nvidia.com/mig.strategy": "single"},
            {"nvidia.com/gpu": "28"},
            "NVIDIA-A100-SXM4-40GB",
            "time-slicing",
            0,
            id="single-mig-shared",
        ),
    ],
)
def test_sharing(labels: dict[str, str], alloc: dict[str, str], product: str, sharing: str, replicas: int) -> None:
    group = one(labels, alloc)
    assert (group.gpu_product, group.sharing, group.gpu_replicas) == (product, sharing, replicas)
    assert group.has_gpu


def test_mig_mixed_offers_only_allocatable_profiles_with_memory() -> None:
    group = one(
        {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mig-1g.5gb.memory": "4864",
            "nvidia.com/mig-3g.20gb.memory": "19968",
        },
        {
            "nvidia.com/gpu": "0",
            "nvidia.com/mig-1g.5gb": "7",
            "nvidia.com/mig-3g.20gb": "0",
            "nvidia.com/mig-1g.5gb.me": "1",
        },
    )
    assert group.mig_profiles == {"1g.5gb": MigOffer(7, 4864), "1g.5gb.me": MigOffer(1, 0)}
    assert group.pool == "NVIDIA-A100-SXM4-40GB/driver-unknown/mig-mixed-1g.5gb-1g.5gb.me"


def test_a_gpu_node_without_feature_discovery_is_no_no_gpu_pool() -> None:
    """It offers nvidia.com/gpu but carries no GFD label and no pool label: messages name it as a GPU pool whose
    driver is unknown (they said "declare the driver of pool no-gpu")."""
    view = build_view([node(labels={}, alloc={"nvidia.com/gpu": "8"})], Settings())
    (group,) = view.groups
    assert group.pool == "gpu/driver-unknown"
    cpu = build_view([node(labels={}, alloc={})], Settings())
    assert cpu.groups[0].pool == "no-gpu"
    # the device plugin's time-slicing renameByDefault: its GPUs are only nvidia.com/gpu.shared
    shared = build_view([node(labels={}, alloc={"nvidia.com/gpu.shared": "16"})], Settings())
    assert shared.groups[0].pool == "gpu/driver-unknown" and shared.groups[0].has_gpu


@pytest.mark.parametrize(
    ("labels", "joining"),
    [
        pytest.param({"eks.amazonaws.com/nodegroup": "gpu"}, True, id="node-group-with-gpu-nodes"),
        pytest.param({"eks.amazonaws.com/nodegroup": "cpu"}, False, id="node-group-without-gpu-nodes"),
        pytest.param({"karpenter.sh/nodepool": "gpu"}, False, id="nodepool-cpu-instance"),
        pytest.param(
            {"karpenter.sh/nodepool": "gpu", "karpenter.k8s.aws/instance-gpu-count": "8"}, True, id="nodepool-gpu"
        ),
        pytest.param(  # EKS Auto Mode's Karpenter labels its nodes under its own group (a review's)
            {"karpenter.sh/nodepool": "gpu", "eks.amazonaws.com/instance-gpu-count": "1"}, True, id="auto-mode-gpu"
        ),
        pytest.param(
            {"cloud.google.com/gke-nodepool": "cpu", "cloud.google.com/gke-accelerator": "nvidia-l4"}, True, id="gke"
        ),
        pytest.param(
            {"kubernetes.azure.com/agentpool": "cpu", "kubernetes.azure.com/accelerator": "nvidia"}, True, id="aks"
        ),
        pytest.param({"kubernetes.azure.com/agentpool": "cpu", "accelerator": "nvidia"}, True, id="aks-legacy"),
    ],
)
def test_a_node_without_a_device_is_a_gpu_node_joining_where_its_labels_or_its_pool_say_it_has_gpus(
    labels: dict[str, str], joining: bool
) -> None:
    """A node whose device plugin is not up offers no device; it is a GPU node joining where its provider's labels
    of a GPU node say so, or where its pool has GPU nodes, but for a Karpenter NodePool, which holds CPU and GPU
    instance types alike: its CPU nodes were taken for GPU nodes joining, for good (a review's)."""
    key = next(iter(labels))
    gpu = node("gpu-1", labels={key: "gpu", "nvidia.com/gpu.product": "NVIDIA-L4"}, alloc={"nvidia.com/gpu": "1"})
    view = build_view([gpu, node("new", labels=labels, alloc={})], Settings())
    (new,) = [g for g in view.groups if "new" in g.nodes]
    assert view.joining(new) is joining
    assert not any(view.joining(g) for g in view.groups if g is not new)


@pytest.mark.parametrize(
    ("pool", "instance_type", "joining"),
    [
        pytest.param("gpu", "md-a100-0", True, id="instance-type-of-the-pools-gpu-nodes"),
        pytest.param("gpu", "md-cpu-0", False, id="cpu-instance-type"),
        pytest.param("other", "md-a100-0", False, id="another-nodepool"),
    ],
)
def test_a_nodepool_node_no_label_says_has_gpus_is_joining_where_its_instance_type_is_its_pools_gpu_nodes(
    pool: str, instance_type: str, joining: bool
) -> None:
    """Cluster API's Karpenter labels no GPU on a node: a node of a NodePool of CPU and GPU instance types alike that
    offers no device yet was never a GPU node joining, and a DaemonSet's pod for one was told it stays Pending (a
    review of MIG). It is one where a node of its NodePool with GPUs has its instance type."""
    kp, it = "karpenter.sh/nodepool", "node.kubernetes.io/instance-type"
    gpu_labels = {kp: "gpu", it: "md-a100-0", "nvidia.com/gpu.product": "NVIDIA-L4"}
    gpu = node("gpu-1", labels=gpu_labels, alloc={"nvidia.com/gpu": "1"})
    view = build_view([gpu, node("new", labels={kp: pool, it: instance_type}, alloc={})], Settings())
    (new,) = [g for g in view.groups if "new" in g.nodes]
    assert view.joining(new) is joining


def test_the_pools_with_gpus_are_worked_out_when_the_view_is_built() -> None:
    """What ``joining`` reads of a node of a pool of one kind of node: a field set with the view, as
    ``gpu_instance_types`` is, not worked out lazily by the first request after each rebuild. Pools whose groups
    have GPUs (one GPU node beside a CPU node is enough; a declared pool's nodes have its GPU by settings), not
    those of CPU nodes alone."""
    ng = "eks.amazonaws.com/nodegroup"
    nodes = [
        node("g1", {ng: "gpu", "nvidia.com/gpu.product": "NVIDIA-L4"}),
        node("g2", {ng: "gpu"}, alloc={}),
        node("c1", {ng: "cpu"}, alloc={}),
    ]
    view = build_view(nodes, Settings(cluster=ClusterSettings(pools=[TRAIN])))
    assert "gpu_pools" in {f.name for f in dataclasses.fields(ClusterView)}
    assert view.gpu_pools == {"gpu", "train"}
    (joining,) = [g for g in view.groups if "g2" in g.nodes]
    assert view.joining(joining) and not any(view.joining(g) for g in view.groups if "c1" in g.nodes)


def test_a_nodepool_node_of_its_gpu_nodes_instance_type_is_joining_among_many_instance_types() -> None:
    """A NodePool of many instance types, a node or two each (Karpenter chooses among all it allows): the instance
    type was taken for a node's own label and dropped from the groups, and the node joining with its GPU nodes'
    instance type was no longer told apart (a review of MIG)."""
    kp, it = "karpenter.sh/nodepool", "node.kubernetes.io/instance-type"
    gpu = node(
        "gpu-1", labels={kp: "p", it: "md-a100-0", "nvidia.com/gpu.product": "NVIDIA-L4"}, alloc={"nvidia.com/gpu": "1"}
    )
    cpus = [node(f"cpu-{i}", labels={kp: "p", it: f"md-cpu-{i}"}, alloc={}) for i in range(66)]
    view = build_view([gpu, node("new", labels={kp: "p", it: "md-a100-0"}, alloc={}), *cpus], Settings())
    assert it not in view.volatile_labels
    (new,) = [g for g in view.groups if "new" in g.nodes]
    (cpu,) = [g for g in view.groups if "cpu-7" in g.nodes]
    assert view.joining(new) and not view.joining(cpu)


@pytest.mark.parametrize(
    ("providers", "labels", "gpu"),
    [
        pytest.param(["eks"], {"karpenter.k8s.aws/instance-gpu-count": "8"}, True, id="karpenter-on-eks"),
        pytest.param(["aks"], {"karpenter.azure.com/sku-gpu-manufacturer": "nvidia"}, True, id="karpenter-on-aks"),
        pytest.param(["eks"], {"cloud.google.com/gke-accelerator": "nvidia-l4"}, True, id="gke-accelerator"),
        pytest.param(["eks"], {"kubernetes.azure.com/accelerator": "nvidia"}, True, id="aks-accelerator"),
        pytest.param(["aks"], {"accelerator": "nvidia"}, True, id="aks-legacy-on-aks"),
        pytest.param(["eks"], {"accelerator": "nvidia"}, False, id="bare-key-elsewhere-the-users-own"),
    ],
)
def test_a_nodes_gpu_labels_are_read_whatever_providers_the_cluster_names(
    providers: list[str], labels: dict[str, str], gpu: bool
) -> None:
    """A label that says a node has GPUs means the same on any cluster: read whatever ``cluster.providers`` names
    (it was read for the providers named alone), but for an unprefixed key, the user's own off its provider's
    clusters."""
    assert build_view([], Settings(cluster=ClusterSettings(providers=providers))).presets.gpu_labelled(labels) is gpu


def _host_nodes(count: int, key: str = "cloud.google.com/gce-topology-host") -> list[dict[str, Any]]:
    """A pool of ``count`` GPU nodes, each with its own value of ``key``, two drivers."""
    return [
        node(
            f"gpu-{i}",
            labels={
                "cloud.google.com/gke-nodepool": "a3",
                key: f"host-{i}",
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/cuda.driver-version.full": "550.54.15" if i % 2 else "535.104.05",
            },
            alloc={"nvidia.com/gpu": "8"},
        )
        for i in range(count)
    ]


def test_a_label_of_each_nodes_own_makes_no_group_of_every_node() -> None:
    """GKE's compact placement labels each node with its host: a group per node, and the policies' work grows with
    the groups (3,000 nodes: past the 1 s budget, every GPU pod refused; found by a review of the cluster model)."""
    key = "example.com/rack-slot"  # GKE's own host label is volatile by default
    view = build_view(_host_nodes(200, key), Settings())
    assert len(view.groups) == 2 and sum(len(g.nodes) for g in view.groups) == 200
    assert key in view.volatile_labels
    # a rule that names it is still decided node by node
    found = view.eligible({"nodeSelector": {key: "host-7"}}, {"nvidia.com/gpu"})
    assert [(c.group.driver_text, c.nodes) for c in found] == [("550.54.15", ("gpu-7",))]
    # few groups: as they are
    few = build_view(_host_nodes(40, key), Settings())
    assert len(few.groups) == 40 and key not in few.volatile_labels
    # the keys known to be a node's own are volatile whatever the count, and a pool's notes are said once
    known = build_view(_host_nodes(40), Settings())
    assert len(known.groups) == 2
    unknown = _host_nodes(40, key)
    for n in unknown:
        del n["metadata"]["labels"]["nvidia.com/cuda.driver-version.full"]
    table = format_pools(build_view(unknown, Settings()))
    assert table.count("driver unknown") == 1 and "(gpu-0, gpu-1, gpu-10 ...): driver unknown" in table, table


NETWORK_LAYERS = {
    "topology.k8s.aws/network-node-layer-1": 200,
    "topology.k8s.aws/network-node-layer-2": 60,
    "topology.k8s.aws/network-node-layer-3": 20,
    "topology.k8s.aws/capacity-block-id": 30,
}
"""Label keys of moderate cardinality an EKS cluster's nodes carry, with their count of values at 9,000 nodes."""
OLD_DRIVER, NEW_DRIVER = "535.104.05", "570.124.06"


def _karpenter_nodes(count: int) -> list[dict[str, Any]]:
    """``count`` GPU nodes as Karpenter on EKS labels them: 4 NodePools (pool-0 and pool-2 of the old driver, pool-1
    and pool-3 of the new one), two capacity types, two instance types and four zones (64 groups), and the
    ``NETWORK_LAYERS`` (node i's layer-1 is nn-<i % 200>: of the pool of i % 4)."""
    nodes = []
    for i in range(count):
        zone = f"us-east-1{'abcd'[i // 16 % 4]}"
        labels = {
            "karpenter.sh/capacity-type": ("on-demand", "spot")[i // 4 % 2],
            "node.kubernetes.io/instance-type": ("p5.48xlarge", "p4d.24xlarge")[i // 8 % 2],
            "topology.kubernetes.io/zone": zone,
            "topology.ebs.csi.aws.com/zone": zone,
            **{key: f"nn{n}-{i * (n + 1) % values}" for n, (key, values) in enumerate(NETWORK_LAYERS.items())},
        }
        driver = (OLD_DRIVER, NEW_DRIVER)[i % 2]
        nodes.append(gpu_node(f"ip-{i}", f"pool-{i % 4}", driver, labels=labels, pool_label="karpenter.sh/nodepool"))
    return nodes


def test_labels_of_moderate_cardinality_make_no_group_of_nearly_every_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """EKS's network layers (about 200, 60 and 20 values at 9,000 nodes) are no node's own, and with the zones made
    a group of nearly every node: a review's work grew with the nodes, 0.86 s of the 1 s budget for a pod of 5 GPU
    containers at 9,000 (found by a review of the policies at scale). They are volatile, the keys of the most values
    first, until the groups are MANY_GROUPS or fewer: here the zones, of the fewest, are kept, and a review does as
    much work at 1,000 nodes as at 9,000."""
    checks: list[int] = []
    monkeypatch.setattr(budget, "check", lambda: checks.append(1))
    containers = [container(f"c{n}", image) for n, image in enumerate([IMAGE_128, IMAGE_124] * 3)]
    work = []
    for count in (1_000, 9_000):
        view = build_view(_karpenter_nodes(count), Settings())
        assert len(view.groups) == MANY_GROUPS and sum(len(g.nodes) for g in view.groups) == count
        assert set(NETWORK_LAYERS) <= view.volatile_labels
        assert "topology.kubernetes.io/zone" not in view.volatile_labels
        checks.clear()
        result = _review(cuda_pod(*containers), view)
        assert result.allowed, result.message
        work.append(len(checks))
    assert work[0] == work[1], f"a review's budget checks at 1,000 nodes and at 9,000: {work}"


@pytest.mark.parametrize(
    "key",
    [
        "node.kubernetes.io/instance-type",
        "kubernetes.io/arch",
        "karpenter.sh/nodepool",
        "karpenter.sh/capacity-type",
        "karpenter.k8s.aws/instance-family",
        "karpenter.k8s.aws/instance-gpu-count",
        "nvidia.com/gpu-driver-upgrade-state",
        "cloud.google.com/gke-placement-group",
    ],
)
def test_a_label_the_webhook_reads_is_never_made_volatile_for_fewer_groups(key: str) -> None:
    """Past MANY_GROUPS, the keys the webhook reads stay (``_Builder.reads``) though their groups stay many too: a
    key of the user's own is made volatile, and 100 groups are left."""
    nodes = [node(f"n-{i}", labels={key: f"v-{i % 100}", "example.com/rack": f"r-{i % 7}"}) for i in range(300)]
    view = build_view(nodes, Settings())
    assert len(view.groups) == 100 and "example.com/rack" in view.volatile_labels
    assert key not in view.volatile_labels


def _review(obj: dict[str, Any], view: ClusterView) -> Result:
    return pipeline.review(obj, Context(settings=Settings(), cluster=view, namespace="ml"))


@pytest.mark.parametrize(
    ("values", "allowed", "steered"),
    [
        pytest.param(["nn0-1"], True, False, id="new-driver-nodes-admitted"),
        pytest.param(["nn0-2"], False, False, id="old-driver-nodes-refused"),
        pytest.param(["nn0-2", "nn0-1"], True, True, id="both-steered-to-the-new-driver"),
    ],
)
def test_a_pod_whose_affinity_names_a_label_made_volatile_is_decided_as_by_groups_of_each_value(
    values: list[str], allowed: bool, steered: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A network layer made volatile (``_splitting_keys``) is read node by node for a pod whose affinity names it:
    admitted, refused and steered as where the view kept a group of each of its values."""
    key = "topology.k8s.aws/network-node-layer-1"
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In", "values": values}]}]
            }
        }
    }
    nodes = _karpenter_nodes(1_000)

    def review(view: ClusterView) -> tuple[Any, ...]:
        result = _review(cuda_pod(container(image=IMAGE_128), affinity=affinity), view)
        return result.allowed, result.message, result.warnings, result.patch

    view = build_view(nodes, Settings())
    assert key in view.volatile_labels
    landed = {n for c in view.eligible({"affinity": affinity}, {"nvidia.com/gpu"}) for n in c.nodes}
    assert landed == {f"ip-{i}" for i in range(len(nodes)) if f"nn0-{i % 200}" in values}
    decided = review(view)
    monkeypatch.setattr(cluster, "MANY_GROUPS", len(nodes))  # a group of each node, as before
    grouped = build_view(nodes, Settings())
    assert key not in grouped.volatile_labels and len(grouped.groups) == len(nodes)
    assert decided == review(grouped)
    assert decided[0] is allowed and any(op["path"].startswith("/spec") for op in decided[3]) is steered, decided


def test_a_pool_label_is_never_taken_for_a_nodes_own() -> None:
    """A hundred pools of one node each stay a hundred pools."""
    view = build_view(_host_nodes(100, key="cloud.google.com/gke-nodepool"), Settings())
    assert len({g.pool for g in view.groups}) == 100


def test_mig_profiles_offered_without_a_strategy_label_are_the_mixed_strategy() -> None:
    """The device plugin in mixed mode without GPU feature discovery: only the nvidia.com/mig-<profile> resources
    say so (the plugin offers them in no other mode)."""
    group = one(
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, {"nvidia.com/gpu": "0", "nvidia.com/mig-1g.10gb": "7"}
    )
    assert group.mig_strategy == "mixed" and group.mig_profiles == {"1g.10gb": MigOffer(7, 0)}


@pytest.mark.parametrize("state", ["pending", "rebooting"])
def test_mig_layout_changing_withholds_mig_offers(state: str) -> None:
    group = one(
        {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/mig.config": "all-1g.10gb",
            "nvidia.com/mig.config.state": state,
        },
        {"nvidia.com/gpu": "2", "nvidia.com/mig-3g.40gb": "4"},
    )
    assert group.mig_profiles == {} and "nvidia.com/mig-3g.40gb" not in group.allocatable
    assert group.mig_changing and "all-1g.10gb" in group.notes[0]
    view = build_view(
        [
            node(
                labels={"nvidia.com/mig.config.state": state, "nvidia.com/mig.strategy": "mixed"},
                alloc={"nvidia.com/mig-3g.40gb": "4"},
            )
        ],
        Settings(),
    )
    assert view.eligible({}, ["nvidia.com/mig-3g.40gb"]) == []


def test_mig_failed_state_keeps_offers_with_a_note() -> None:
    group = one(
        {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig.config.state": "failed"}, {"nvidia.com/mig-3g.40gb": "4"}
    )
    assert group.mig_profiles == {"3g.40gb": MigOffer(4)} and "failed" in group.notes[0]


def test_single_strategy_product_and_profile() -> None:
    group = one(
        {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
            "nvidia.com/mig.strategy": "single",
            "nvidia.com/gpu.memory": "4864",
        },
        {"nvidia.com/gpu": "56"},
    )
    assert (group.gpu_product, group.mig_profiles) == ("NVIDIA-A100-SXM4-40GB", {"1g.5gb": MigOffer(56, 4864)})


GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"


def test_gke_without_declared_pool_notes_the_driver() -> None:
    group = one(
        {
            "cloud.google.com/gke-nodepool": "l4",
            "cloud.google.com/gke-accelerator": "nvidia-l4",
            "cloud.google.com/gke-gpu-driver-version": "latest",
        }
    )
    assert group.pool == "l4" and group.driver is None and "declare driverVersion" in group.notes[0]
    assert group.gpu_count == 1 and group.has_gpu


def test_a_gke_pool_shows_its_accelerator_as_its_gpu() -> None:
    """`pools` showed GPU '-' for GKE nodes (no GFD product label) (found by a review of provider journeys)."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "g", "labels": {"cloud.google.com/gke-nodepool": "l4", GKE_ACCELERATOR: "nvidia-l4"}},
        "status": {"allocatable": {"nvidia.com/gpu": "1"}},
    }
    (pool,) = build_view([node], Settings()).pools
    assert pool.as_json()["gpu"] == "nvidia-l4"


@pytest.mark.parametrize(
    ("labels", "annotations", "taints", "pool", "spot"),
    [
        pytest.param(
            {"cloud.google.com/gke-nodepool": "p", "cloud.google.com/gke-spot": "true"},
            {},
            [],
            "p",
            True,
            id="gke-spot-label",
        ),
        pytest.param(
            {"cloud.google.com/gke-nodepool": "p"},
            {},
            [{"key": "cloud.google.com/gke-preemptible", "value": "true", "effect": "NoSchedule"}],
            "p",
            True,
            id="gke-preemptible-taint",
        ),
        pytest.param(
            {"eks.amazonaws.com/nodegroup": "g", "eks.amazonaws.com/capacityType": "SPOT"}, {}, [], "g", True, id="eks"
        ),
        pytest.param(
            {"eks.amazonaws.com/nodegroup": "g", "eks.amazonaws.com/capacityType": "ON_DEMAND"},
            {},
            [],
            "g",
            False,
            id="eks-on-demand",
        ),
        pytest.param(
            {"karpenter.sh/nodepool": "k", "karpenter.sh/capacity-type": "spot"}, {}, [], "k", True, id="karpenter"
        ),
        pytest.param(
            {"kubernetes.azure.com/agentpool": "a"},
            {},
            [{"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}],
            "a",
            True,
            id="aks-taint",
        ),
        pytest.param({"agentpool": "legacy"}, {}, [], "legacy", False, id="aks-legacy"),
        pytest.param(
            {"oci.oraclecloud.com/oke-is-preemptible": "true"},
            {"oci.oraclecloud.com/node-pool-id": "ocid1.nodepool.oc1.x"},
            [],
            "ocid1.nodepool.oc1.x",
            True,
            id="oke-annotation",
        ),
        pytest.param(
            {},
            {},
            [{"key": "oci.oraclecloud.com/oke-is-preemptible", "effect": "NoSchedule"}],
            "NVIDIA-L4/driver-unknown",
            True,
            id="oke-taint-any-value",
        ),
        pytest.param({"compute.coreweave.com/node-pool": "cw"}, {}, [], "cw", False, id="coreweave"),
        pytest.param({"doks.digitalocean.com/node-pool": "do"}, {}, [], "do", False, id="doks"),
        pytest.param({"vke.vultr.com/node-pool": "vk"}, {}, [], "vk", False, id="vke"),
        pytest.param({"lke.linode.com/pool-id": "12345"}, {}, [], "12345", False, id="lke"),
        pytest.param({"k8s.scaleway.com/pool-name": "sc"}, {}, [], "sc", False, id="scaleway"),
        pytest.param({"nodepool": "ovh"}, {}, [], "ovh", False, id="ovh"),
        pytest.param({"kubernetes.civo.com/civo-node-pool": "civo"}, {}, [], "civo", False, id="civo"),
        pytest.param({"mk8s.nebius.com/node-group-id": "neb"}, {}, [], "neb", False, id="nebius"),
    ],
)
def test_pool_identity_and_spot(
    labels: dict[str, str], annotations: dict[str, str], taints: list[Any], pool: str, spot: bool
) -> None:
    group = one({"nvidia.com/gpu.product": "NVIDIA-L4", **labels}, annotations=annotations, taints=taints)
    assert (group.pool, group.spot) == (pool, spot)


def test_pool_label_keys_from_settings_come_first() -> None:
    settings = Settings(cluster=ClusterSettings(pool_label_keys=["example.com/pool"]))
    group = one({"example.com/pool": "mine", "nodepool": "ovh"}, settings=settings)
    assert (group.pool, group.pool_source) == ("mine", "label example.com/pool")


def test_unlabelled_nodes_group_by_product_driver_and_mig_layout() -> None:
    base = {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/cuda.driver-version.full": "550.54.15"}
    view = build_view(
        [
            node("a", base),
            node("b", base),
            node("c", {**base, "nvidia.com/cuda.driver-version.full": "535.54.03"}),
            node("d", {"role": "cpu"}, alloc={}),
        ],
        Settings(),
    )
    pools = {p.name: p.as_json()["nodes"] for p in view.pools}
    assert pools == {"NVIDIA-L4/driver-550.54.15": 2, "NVIDIA-L4/driver-535.54.03": 1, "no-gpu": 1}
    assert len(view.gpu_groups) == 2


def test_declared_pool_refined_by_live_nodes() -> None:
    pool = PoolSettings(
        name="train",
        node_selector={"pool": "train"},
        gpu_product="NVIDIA-A100-SXM4-80GB",
        driver_version="535.54.03",
        spot=True,
        taints=[TaintSpec("dedicated", "train")],
    )
    settings = Settings(cluster=ClusterSettings(pools=[pool]))
    declared_only = build_view([], settings, known=False)
    (g,) = declared_only.groups
    assert g.declared and g.nodes == () and g.driver_text == "535.54.03" and declared_only.known
    live = build_view([node("x", {"pool": "train", "nvidia.com/cuda.driver-version.full": "550.54.15"})], settings)
    (g,) = live.groups
    assert (g.pool, g.declared, g.nodes, g.driver_text, g.spot) == ("train", False, ("x",), "550.54.15", True)
    assert g.gpu_product == "NVIDIA-A100-SXM4-80GB", "a fact the node lacks comes from the declaration"


@pytest.mark.parametrize(
    ("spec", "taint"),
    [
        pytest.param({"unschedulable": True}, None, id="cordoned"),
        pytest.param({}, {"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}, id="not-ready"),
        pytest.param(
            {}, {"key": "ToBeDeletedByClusterAutoscaler", "value": "1", "effect": "NoSchedule"}, id="scale-down"
        ),
        pytest.param({}, {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}, id="karpenter"),
        # Karpenter v0.32-v0.37 (its v1beta1 API), and a node Karpenter has not registered yet
        pytest.param(
            {},
            {"key": "karpenter.sh/disruption", "value": "disrupting", "effect": "NoSchedule"},
            id="karpenter-v1beta1",
        ),
        pytest.param({}, {"key": "karpenter.sh/unregistered", "effect": "NoExecute"}, id="karpenter-unregistered"),
    ],
)
def test_a_declared_pool_stays_beside_nodes_that_take_no_new_pod(spec: dict[str, Any], taint: Any) -> None:
    """Its only node cordoned, failing or going away: the autoscaler still adds nodes to the pool for a Pending pod,
    so the declaration stands beside it (it vanished with them, and a fraction it offers was denied)."""
    pool = PoolSettings(name="a100", node_selector={"pool": "a100"}, driver_version="550.54.15")
    settings = Settings(cluster=ClusterSettings(pools=[pool]))
    leaving = node("x", {"pool": "a100"}, taints=[taint] if taint else [])
    leaving["spec"].update(spec)
    view = build_view([leaving], settings)
    assert sorted((g.declared, g.nodes) for g in view.groups) == [(False, ("x",)), (True, ())]
    assert [g.declared for g in build_view([node("x", {"pool": "a100"})], settings).groups] == [False]


def test_declared_mixed_pool_offers_its_profiles() -> None:
    pool = PoolSettings(
        name="zero",
        node_selector={"pool": "zero"},
        mig_strategy="mixed",
        mig_profiles={"3g.40gb": 2, "1g.10gb": 0},
        driver_version="570.26",
    )
    view = build_view([], Settings(cluster=ClusterSettings(pools=[pool])))
    (c,) = view.eligible({"nodeSelector": {"pool": "zero"}}, ["nvidia.com/mig-3g.40gb"])
    assert c.nodes == () and c.group.mig_profiles == {"3g.40gb": MigOffer(2)}
    assert view.eligible({}, ["nvidia.com/mig-1g.10gb"]) == []


def test_unknown_view_without_sources() -> None:
    assert not build_view([], Settings(), known=False).known


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(None, id="none"),
        pytest.param([], id="list"),
        pytest.param({"metadata": {}}, id="no-name"),
        pytest.param({"metadata": {"name": 5}}, id="name-not-str"),
    ],
)
def test_unusable_node_objects_are_skipped(obj: Any) -> None:
    assert parse_node(obj) is None
    assert build_view([obj, node("ok")], Settings()).node_count == 1


def test_garbage_fields_do_not_crash() -> None:
    weird = {
        "metadata": {"name": "w", "labels": {"a": 1, "nvidia.com/gpu.count": "x"}, "annotations": []},
        "spec": {"taints": [{"key": 3}, "x", {"key": "k", "effect": None}]},
        "status": {"allocatable": {"nvidia.com/gpu": "lots", "nvidia.com/mig-1g.5gb": "0.5"}},
    }
    view = build_view([weird], Settings())
    (g,) = view.groups
    assert g.gpu_count == 0 and g.mig_profiles == {} and [str(t) for t in g.taints] == ["k:"]


def test_the_api_fixture_node_reads() -> None:
    fixture = json.loads((FIXTURES / "core.v1.Node.json").read_text())
    view = build_view([fixture], Settings())
    assert view.node_count == 1
    view.eligible({"tolerations": [{"operator": "Exists"}]}, gpu_only=False)
    format_pools(view)


# ---------------------------------------------------------------------------------------------------------------
# Node-list files


def write(tmp_path: Path, text: str, name: str = "nodes.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "count"),
    [
        pytest.param("apiVersion: v1\nkind: Node\nmetadata: {name: a}\n", 1, id="node"),
        pytest.param(
            "apiVersion: v1\nkind: NodeList\nitems:\n- metadata: {name: a}\n- metadata: {name: b}\n", 2, id="nodelist"
        ),
        pytest.param("apiVersion: v1\nkind: List\nitems: []\n", 0, id="empty-list"),
        pytest.param(
            json.dumps({"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "a"}}]}), 1, id="json"
        ),
        pytest.param("kind: Node\nmetadata: {name: a}\n---\nkind: Node\nmetadata: {name: b}\n", 2, id="multi-doc"),
    ],
)
def test_read_node_file(tmp_path: Path, text: str, count: int) -> None:
    assert len(read_node_file(write(tmp_path, text))) == count
    assert cluster_from_file(write(tmp_path, text), Settings()).snapshot().node_count == count


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param("kind: Pod\nmetadata: {name: p}\n", "found kind 'Pod'", id="pod"),
        pytest.param("- a\n- b\n", "found list", id="yaml-list"),
        pytest.param("kind: List\nitems:\n- kind: Pod\n  metadata: {name: p}\n", r"items\[0\]", id="pod-in-list"),
        pytest.param("kind: List\nitems: 5\n", "items must be a list", id="items-not-list"),
        pytest.param("kind: Node\nmetadata: {}\n", "metadata.name", id="no-name"),
        pytest.param("kind: Node\n  bad: [\n", "not valid YAML", id="bad-yaml"),
    ],
)
def test_unusable_node_file(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        read_node_file(write(tmp_path, text))


def test_missing_node_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="cannot read"):
        read_node_file(tmp_path / "absent.yaml")


def test_binary_node_file(tmp_path: Path) -> None:
    path = tmp_path / "bin"
    path.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(InputError, match="UTF-8"):
        read_node_file(path)


STAMP = "nvidia.com/gfd.timestamp"
STAMPS = frozenset({STAMP})
HELD = Node("gpu-1", {STAMP: "1764576000", "pool": "h100"}, (), {})


@pytest.mark.parametrize(
    ("new", "same"),
    [
        (HELD, True),
        (Node("gpu-1", {"pool": "h100", STAMP: "1764576060"}, (), {}), True),
        (Node("gpu-1", {STAMP: "1764576060", "pool": "a100"}, (), {}), False),
        (Node("gpu-1", {"pool": "h100"}, (), {}), False),
        (Node("gpu-1", {**HELD.labels, "nvidia.com/gpu.count": "8"}, (), {}), False),
        (Node("gpu-1", {**HELD.labels, STAMP: "1"}, (Taint("spot", "", "NoSchedule"),), {}), False),
        (Node("gpu-1", {**HELD.labels, STAMP: "1"}, (), {"nvidia.com/gpu": Decimal(8)}), False),
        (Node("gpu-1", {**HELD.labels, STAMP: "1"}, (), {}, {"pool": "x"}), False),
    ],
    ids=["equal", "timestamp", "and-a-label", "timestamp-gone", "label-added", "taint", "allocatable", "annotation"],
)
def test_a_node_is_the_same_but_for_its_timestamp_labels(new: Node, same: bool) -> None:
    assert same_node(HELD, new, STAMPS) is same
    if new != HELD:
        assert not same_node(HELD, new, frozenset()), "with no timestamp labels, any difference is a change"


# -- declared pools and the nodes they get (found by a review of the cluster model) ---------------------------------

TRAIN = PoolSettings(name="train", node_selector={"pool": "train-spot"}, driver_version="550.90.07", gpu_count=8)


def test_a_declared_pool_is_matched_by_its_selector_not_by_a_name_another_label_carries() -> None:
    """A node pool labelled with the declared pool's name (eks nodegroup 'train') is another pool: the declaration
    stays, and keeps its selector to itself."""
    settings = Settings(cluster=ClusterSettings(pools=[TRAIN]))
    other = node("o1", {"eks.amazonaws.com/nodegroup": "train", "nvidia.com/cuda.driver-version.full": "570.124.06"})
    view = build_view([other], settings)
    assert sorted((g.pool, g.declared, g.nodes) for g in view.groups) == [
        ("train", False, ("o1",)),
        ("train", True, ()),
    ]
    (c,) = view.eligible({"nodeSelector": {"pool": "train-spot"}}, ["nvidia.com/gpu"])
    assert c.group.declared and c.group.driver_text == "550.90.07"


@pytest.mark.parametrize(
    ("labels", "alloc"),
    [
        pytest.param({}, {}, id="joining-no-device-plugin-yet"),
        pytest.param({"nvidia.com/mig.config.state": "pending"}, {"nvidia.com/gpu": "0"}, id="mig-layout-changing"),
    ],
)
def test_a_declared_pools_node_that_offers_no_gpu_yet_leaves_the_declaration_standing(
    labels: dict[str, str], alloc: dict[str, str]
) -> None:
    settings = Settings(cluster=ClusterSettings(pools=[TRAIN]))
    view = build_view([node("j1", {"pool": "train-spot", **labels}, alloc)], settings)
    declared = [g for g in view.groups if g.declared]
    assert [g.pool for g in declared] == ["train"] and declared[0].allocatable["nvidia.com/gpu"] == 8
    ready = build_view([node("r1", {"pool": "train-spot"}, {"nvidia.com/gpu": "8"})], settings)
    assert [g.declared for g in ready.groups] == [False], "a node that serves replaces the declaration"


def test_a_declared_pool_at_zero_carries_the_labels_its_nodes_are_certain_to() -> None:
    """Its nodeSelector's, the kubelet's OS labels, and where the selector names GKE's pool, GKE's accelerator type
    of its gpuProduct; GFD's product label only where GFD runs (not on GKE's own device plugin); nothing else (a
    pod that selected another label was refused where the pool ran its CUDA)."""
    pools = [
        PoolSettings(name="l4", node_selector={"cloud.google.com/gke-nodepool": "l4"}, gpu_product="NVIDIA-L4"),
        PoolSettings(
            name="l4-operator",
            node_selector={"cloud.google.com/gke-nodepool": "l4-operator", "nvidia.com/gpu.present": "true"},
            gpu_product="NVIDIA-L4",
        ),
        PoolSettings(name="k3s", node_selector={"pool": "k3s", "kubernetes.io/os": "linux"}, gpu_product="NVIDIA-L4"),
    ]
    view = build_view([], Settings(cluster=ClusterSettings(pools=pools)))
    assert {g.pool: dict(g.labels) for g in view.groups} == {
        "l4": {
            "cloud.google.com/gke-nodepool": "l4",
            "cloud.google.com/gke-accelerator": "nvidia-l4",
            "kubernetes.io/os": "linux",
            "beta.kubernetes.io/os": "linux",
        },
        "l4-operator": {
            "cloud.google.com/gke-nodepool": "l4-operator",
            "nvidia.com/gpu.present": "true",
            "cloud.google.com/gke-accelerator": "nvidia-l4",
            "kubernetes.io/os": "linux",
            "beta.kubernetes.io/os": "linux",
            "nvidia.com/gpu.product": "NVIDIA-L4",
        },
        "k3s": {
            "pool": "k3s",
            "kubernetes.io/os": "linux",
            "beta.kubernetes.io/os": "linux",
            "nvidia.com/gpu.product": "NVIDIA-L4",
        },
    }


@pytest.mark.parametrize(
    ("gfd", "selector", "takes"),
    [
        pytest.param(False, {"workload": "l4-burst"}, False, id="gke-own-plugin-user-label"),
        pytest.param(True, {"cloud.google.com/gke-nodepool": "l4-burst"}, True, id="gke-gpu-operator"),
    ],
)
def test_whether_a_declared_pool_at_zero_carries_gfds_product_is_what_the_providers_gpu_nodes_show(
    gfd: bool, selector: dict[str, str], takes: bool
) -> None:
    """Decided from the selector's keys alone, a pool declared by the user's own label on a GKE cluster with no GFD
    carried the product (a pod selecting it was sent there, and stayed Pending), and a GKE pool of a cluster running
    the GPU Operator lost it (the pod was not sent where it would run). The cluster's GPU nodes of that provider
    say it where they show it."""
    labels = {
        "cloud.google.com/gke-nodepool": "l4",
        "cloud.google.com/gke-accelerator": "nvidia-l4",
        **({"nvidia.com/gpu.product": "NVIDIA-L4"} if gfd else {}),
    }
    gpu_node = {
        "metadata": {"name": "gke-l4-1", "labels": labels},
        "status": {"allocatable": {"nvidia.com/gpu": "1"}},
    }
    pool = PoolSettings(name="l4-burst", node_selector=selector, gpu_product="NVIDIA-L4")
    view = build_view([gpu_node], Settings(cluster=ClusterSettings(pools=[pool])))
    selects = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-L4"}}
    assert ("l4-burst" in {c.group.pool for c in view.eligible(selects)}) is takes
    # and the GPU Operator's toolkit loads an image's CUDA compat libraries there: a GKE pool of a cluster running it
    # was taken as GKE's own plugin, which loads none (forward compatibility refused there)
    (declared,) = [g for g in view.groups if g.pool == "l4-burst"]
    if gfd:
        assert declared.compat_wired


def test_a_declared_gke_pool_at_zero_takes_no_pod_that_selects_gfds_product() -> None:
    """GKE's own device plugin writes no GFD label: a pod that selected nvidia.com/gpu.product was sent to a GKE
    pool at zero whose nodes never carry it, and stayed Pending there. A pool declared with the GPU Operator's MIG
    strategy runs GFD, and takes it."""
    selects = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}}
    gke = PoolSettings(
        name="a100", node_selector={"cloud.google.com/gke-nodepool": "a100"}, gpu_product="NVIDIA-A100-SXM4-40GB"
    )
    view = build_view([], Settings(cluster=ClusterSettings(pools=[gke])))
    assert view.eligible(selects) == []
    mixed = dataclasses.replace(gke, mig_strategy="mixed", mig_profiles={"3g.20gb": 2})
    view = build_view([], Settings(cluster=ClusterSettings(pools=[mixed])))
    assert [c.group.pool for c in view.eligible(selects)] == ["a100"]


AKS_ACCELERATOR = "kubernetes.azure.com/accelerator"


@pytest.mark.parametrize(
    ("selector", "nodes", "carries"),
    [
        pytest.param({"kubernetes.azure.com/agentpool": "gpu"}, [], True, id="aks-pool-label"),
        pytest.param({"kubernetes.azure.com/scalesetpriority": "spot"}, [], True, id="aks-spot-label"),
        pytest.param(
            {"agentpool": "gpu"}, [node("aks-cpu", {"kubernetes.azure.com/agentpool": "cpu"})], True, id="aks-shown"
        ),
        pytest.param({"agentpool": "gpu"}, [node("k3s-cpu", {"agentpool": "cpu"})], False, id="k3s-agentpool"),
        pytest.param({"cloud.google.com/gke-nodepool": "gpu"}, [], False, id="gke"),
    ],
)
@pytest.mark.parametrize("key", [AKS_ACCELERATOR, "accelerator"])
def test_a_declared_aks_pool_at_zero_carries_aks_accelerator_label(
    selector: dict[str, str], nodes: list[Any], carries: bool, key: str
) -> None:
    """AKS labels every NVIDIA GPU node kubernetes.azure.com/accelerator: nvidia, and Cluster Autoscaler's template
    node for a pool at zero carries it and the legacy accelerator: nvidia: a pod that selected either was kept off
    an AKS pool at zero, and refused there. Not a k3s pool whose nodes carry the bare agentpool label AKS's nodes
    carry too."""
    pool = PoolSettings(name="gpu-pool", node_selector=selector, driver_version="550.90.07")
    view = build_view(nodes, Settings(cluster=ClusterSettings(pools=[pool])))
    (group,) = [g for g in view.groups if g.declared]
    assert (group.labels.get(key) == "nvidia") is carries
    selects = {"nodeSelector": {key: "nvidia"}, "tolerations": [{"operator": "Exists"}]}
    assert [c.group.pool for c in view.eligible(selects)] == (["gpu-pool"] if carries else [])


AKS_SPOT = "kubernetes.azure.com/scalesetpriority"


@pytest.mark.parametrize(
    ("selector", "spot", "taints", "taints_now"),
    [
        pytest.param(
            {"kubernetes.azure.com/agentpool": "spotgpu"}, True, [], [f"{AKS_SPOT}=spot:NoSchedule"], id="aks"
        ),
        pytest.param({AKS_SPOT: "spot"}, False, [], [f"{AKS_SPOT}=spot:NoSchedule"], id="aks-spot-label"),
        pytest.param({"kubernetes.azure.com/agentpool": "gpu"}, False, [], [], id="aks-on-demand"),
        pytest.param({"agentpool": "spotgpu"}, True, [], [], id="generic-agentpool-a-k3s-node-may-carry"),
        pytest.param(
            {"kubernetes.azure.com/agentpool": "spotgpu"},
            True,
            [TaintSpec(AKS_SPOT, "spot", "NoExecute"), TaintSpec("sku", "gpu")],
            [f"{AKS_SPOT}=spot:NoExecute", f"{AKS_SPOT}=spot:NoSchedule", "sku=gpu:NoSchedule"],
            id="aks-with-its-own",
        ),
        pytest.param(
            {"oci.oraclecloud.com/oke-is-preemptible": "true"},
            False,
            [],
            ["oci.oraclecloud.com/oke-is-preemptible:NoSchedule"],
            id="oke-undocumented-value",
        ),
        pytest.param(
            {"oci.oraclecloud.com/oke-is-preemptible": "true"},
            False,
            [TaintSpec("oci.oraclecloud.com/oke-is-preemptible", "true")],
            ["oci.oraclecloud.com/oke-is-preemptible=true:NoSchedule"],
            id="oke-declared-value-kept",
        ),
        pytest.param({"cloud.google.com/gke-nodepool": "spot"}, True, [], [], id="gke-taints-only-pools-made-so"),
    ],
)
def test_a_declared_spot_pool_at_zero_carries_the_spot_taints_its_provider_gives_every_spot_node(
    selector: dict[str, str], spot: bool, taints: list[TaintSpec], taints_now: list[str]
) -> None:
    """AKS taints every spot node (OKE every preemptible one): a pool at zero that its selector shows to be one was
    taken as untainted, and a pod was steered there with no toleration, Pending for good."""
    pool = PoolSettings(name="p", node_selector=selector, driver_version="580.65.06", spot=spot, taints=taints)
    (g,) = build_view([], Settings(cluster=ClusterSettings(pools=[pool]))).groups
    assert g.spot is (spot or bool(taints_now))
    assert sorted(str(t) for t in g.taints) == taints_now


def test_a_declared_pool_without_a_gpu_count_takes_a_pod_of_any_count() -> None:
    pool = PoolSettings(name="h100", node_selector={"pool": "h100"}, driver_version="550.90.07")
    view = build_view([], Settings(cluster=ClusterSettings(pools=[pool])))
    selector = {"nodeSelector": {"pool": "h100"}}
    for count in ("1", "8"):
        assert [c.group.pool for c in view.eligible(selector, {"nvidia.com/gpu": Decimal(count)})] == ["h100"], count
    counted = dataclasses.replace(pool, gpu_count=4)
    view = build_view([], Settings(cluster=ClusterSettings(pools=[counted])))
    assert view.eligible(selector, {"nvidia.com/gpu": Decimal(8)}) == [], "4 GPUs a node take no pod of 8"
    assert view.eligible(selector, {"nvidia.com/gpu": Decimal(4)}) != []


def test_a_cordoned_node_is_unschedulable_before_its_taint_comes() -> None:
    cordoned = node("c1", {"pool": "p"})
    cordoned["spec"]["unschedulable"] = True
    view = build_view([cordoned], Settings())
    assert view.eligible({"containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}]}) == []
    tolerating = {
        "tolerations": [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [{"resources": {"limits": {"nvidia.com/gpu": "1"}}}],
    }
    assert [c.nodes for c in view.eligible(tolerating)] == [("c1",)]


def test_pools_named_alike_by_two_providers_are_told_apart() -> None:
    """An EKS node group and a Karpenter NodePool both called gpu were one pool: spot, though half of it is on
    demand, and a message said a pod was supported by pool gpu and kept off pool gpu."""
    view = build_view(
        [
            node("a", {"eks.amazonaws.com/nodegroup": "gpu"}),
            node("b", {"karpenter.sh/nodepool": "gpu", "karpenter.sh/capacity-type": "spot"}),
            node("c", {"kubernetes.azure.com/agentpool": "other"}),
            node("d", {"agentpool": "other"}),  # AKS's legacy key: the same provider, the same pool
        ],
        Settings(),
    )
    assert sorted((p.name, p.as_json()["spot"]) for p in view.pools) == [
        ("gpu@eks", False),
        ("gpu@karpenter", True),
        ("other", False),
    ]


def test_pools_named_alike_by_generic_pool_labels_are_told_apart_by_the_label_where_no_provider_shows() -> None:
    """A k3s cluster's own pools, labelled agentpool and nodepool (the generic names AKS's and OVH's nodes carry
    too) and both called gpu, were named gpu@aks and gpu@ovh: the label the user wrote names them instead."""
    view = build_view([node("a", {"agentpool": "gpu"}), node("b", {"nodepool": "gpu"})], Settings())
    assert sorted(p.name for p in view.pools) == ["gpu@agentpool", "gpu@nodepool"]
    eks = build_view([node("a", {"agentpool": "gpu"}), node("b", {"eks.amazonaws.com/nodegroup": "gpu"})], Settings())
    assert sorted(p.name for p in eks.pools) == ["gpu@agentpool", "gpu@eks"]


def test_the_gpu_operators_default_single_strategy_on_whole_gpus_is_no_mig() -> None:
    """The GPU Operator writes nvidia.com/mig.strategy=single on every GPU node by default, MIG or not: only the
    product's -MIG-<profile> makes its GPUs MIG devices. Read as MIG, every GFD pool showed 'single: nothing offered'
    and the whole fallback found no GPU in a cluster of them (found by a review of real clusters)."""
    labels = {
        "nvidia.com/gpu.product": "Tesla-T4",
        "nvidia.com/mig.strategy": "single",
        "nvidia.com/mig.capable": "false",
        "nvidia.com/cuda.driver-version.full": "550.54.15",
    }
    group = one(labels, alloc={"nvidia.com/gpu": "4"})
    assert (group.mig_strategy, group.mig_capable, group.mig_profiles, group.pool) == (
        "none",
        False,
        {},
        "Tesla-T4/driver-550.54.15",
    )
    single = one({**labels, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-3g.20gb"}, {"nvidia.com/gpu": "2"})
    assert (single.mig_strategy, list(single.mig_profiles)) == ("single", ["3g.20gb"])
    # a layout asked of MIG Manager whose product label is not rewritten yet, or failed: still MIG (56 devices
    # of 8 GPUs); a layout of another name that leaves MIG off (one device a GPU): whole GPUs
    capable = {**labels, "nvidia.com/mig.capable": "true", "nvidia.com/gpu.count": "8"}
    for state in ("success", "failed"):
        asked = {**capable, "nvidia.com/mig.config": "all-1g.10gb", "nvidia.com/mig.config.state": state}
        assert one(asked, {"nvidia.com/gpu": "56"}).mig_strategy == "single"
    custom = {**capable, "nvidia.com/mig.config": "custom-no-mig", "nvidia.com/mig.config.state": "success"}
    assert one(custom, {"nvidia.com/gpu": "8"}).mig_strategy == "none"
    # one MIG device a GPU under MIG Manager's own layout: MIG all the same
    big = {**capable, "nvidia.com/mig.config": "all-4g.40gb", "nvidia.com/mig.config.state": "success"}
    assert one(big, {"nvidia.com/gpu": "8"}).mig_strategy == "single"
    # a pool declared single, whose nodes GFD does not label so: still MIG
    pool = PoolSettings(name="a100", node_selector={"pool": "a100"}, mig_strategy="single", gpu_product="X")
    declared = one({"pool": "a100"}, {"nvidia.com/gpu": "2"}, Settings(cluster=ClusterSettings(pools=[pool])))
    assert declared.mig_strategy == "single"


@pytest.mark.parametrize(
    ("aks_nodes", "taints_now"), [(True, [f"{AKS_SPOT}=spot:NoSchedule"]), (False, [])], ids=["aks-cluster", "k3s"]
)
def test_a_spot_pool_declared_by_the_legacy_agentpool_label_on_an_aks_cluster_carries_its_spot_taint(
    aks_nodes: bool, taints_now: list[str]
) -> None:
    """Every AKS node carries the bare agentpool label too, and a user may declare a pool by it: on a cluster whose
    nodes show AKS, such a spot pool at zero was taken as untainted, and a pod was steered there with no toleration,
    Pending for good (found by a review of the fix above). On a cluster that shows no AKS it names no provider."""
    labels = {"kubernetes.azure.com/agentpool": "cpu", "agentpool": "cpu"} if aks_nodes else {"agentpool": "cpu"}
    pool = PoolSettings(name="spot", node_selector={"agentpool": "spot"}, driver_version="580.65.06", spot=True)
    view = build_view([node("cpu-1", labels)], Settings(cluster=ClusterSettings(pools=[pool])))
    (g,) = [g for g in view.groups if g.pool == "spot"]
    assert sorted(str(t) for t in g.taints) == taints_now


@pytest.mark.parametrize(
    ("shown", "taints_now"),
    [
        pytest.param({"kubernetes.azure.com/agentpool": "cpu"}, [f"{AKS_SPOT}=spot:NoSchedule"], id="aks"),
        pytest.param(
            {"oci.oraclecloud.com/oke-is-preemptible": "false"},
            ["oci.oraclecloud.com/oke-is-preemptible:NoSchedule"],
            id="oke",
        ),
        # a provider whose spot nodes may carry no taint shows too: nothing is added on a guess
        pytest.param(
            {"kubernetes.azure.com/agentpool": "cpu", "karpenter.sh/nodepool": "default"}, [], id="aks-and-karpenter"
        ),
        pytest.param({"eks.amazonaws.com/nodegroup": "cpu"}, [], id="eks"),
        pytest.param({}, [], id="k3s"),
    ],
)
def test_a_spot_pool_declared_by_the_users_own_label_carries_the_spot_taint_of_a_cluster_that_taints_every_one(
    shown: dict[str, str], taints_now: list[str]
) -> None:
    """OKE names its pools by an annotation, so a preemptible pool is declared by a label of the user's own, and AKS
    pools are often labelled so too: such a spot pool at zero was taken as untainted on a cluster whose every spot
    node is tainted, and a pod was steered there alone and stayed Pending (found by a review of the whole change)."""
    pool = PoolSettings(
        name="spot", node_selector={"team.example.com/pool": "spot"}, driver_version="580.65.06", spot=True
    )
    view = build_view([node("cpu-1", shown)], Settings(cluster=ClusterSettings(pools=[pool])))
    (g,) = [g for g in view.groups if g.pool == "spot"]
    assert sorted(str(t) for t in g.taints) == taints_now


def test_a_declared_pool_beside_a_node_under_pressure_stands() -> None:
    """A node under disk pressure takes no new pod: a declared pool whose only node was so vanished, and the pod was
    refused where the pool's autoscaler would add a node that runs it (found by a review of the whole change)."""
    pool = PoolSettings(name="new", node_selector={"pool": "new"}, driver_version="580.65.06")
    pressed = node("new-1", {"pool": "new", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    pressed["spec"]["taints"] = [{"key": "node.kubernetes.io/disk-pressure", "effect": "NoSchedule"}]
    view = build_view([pressed], Settings(cluster=ClusterSettings(pools=[pool])))
    assert sorted((g.pool, g.nodes) for g in view.groups) == [("new", ()), ("new", ("new-1",))]


@pytest.mark.parametrize("count", [1, 2, 3, 7])
def test_pool_names_stay_within_their_room_and_never_cut_a_name_short(count: int) -> None:
    """A warning's pools: where the first name at MIN_NAME characters did not fit with its count, pool_names went
    past its room, and the warning's own cut took the count and what followed ('(pools ml-infe… and …': a
    review's). Within the room always: the names that fit, the first cut (no shorter than MIN_NAME) with a '…',
    else the pools counted."""
    groups = [
        NodeGroup(f"ml-inference-gpu-spot-a10g-use1{i}", {}, (), {}, ("n",), {}, "NVIDIA-A10G") for i in range(count)
    ]
    counted = f"{count} pool{'s' if count > 1 else ''}"
    for room in range(len(counted), 120):
        text = pool_names(groups, room=room)
        assert len(text) <= room, (room, text)
        assert text == counted or all(len(name) >= MIN_NAME for name in re.findall(r"(?:^| )([^ ,]+…)", text)), text
    assert pool_names(groups, room=len(counted)) == counted
    assert pool_names(groups[:1], room=12, what="spot pool") == "1 spot pool"

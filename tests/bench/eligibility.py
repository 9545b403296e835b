"""Cost of the cluster model: ``build_view`` and ``ClusterView.eligible`` at 10 and 5,000 nodes.

Run: ``python -m tests.bench.eligibility``. The nodes are a realistic mix (8 pools of GKE, EKS, AKS, Karpenter and
k3s shapes with GFD labels, per-node hostname and GFD timestamp labels). Prints a Markdown table; the figures are
recorded in docs/cluster.md.

``ClusterView.eligible`` keeps its answers per snapshot by the pod's scheduling constraints, so the same call made
again is a lookup: each timed call here starts from an empty store (:func:`first_ask`), and measures the work of the
first pod of a shape to ask.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from webhook.cluster import MEMO_SIZE, Candidate, ClusterView, Memo, build_view
from webhook.config import Settings

POOLS: list[tuple[str, dict[str, str], dict[str, str], list[dict[str, str]]]] = [
    (
        "gke",
        {
            "cloud.google.com/gke-nodepool": "a100-spot",
            "cloud.google.com/gke-spot": "true",
            "cloud.google.com/gke-gpu-partition-size": "3g.40gb",
        },
        {"nvidia.com/gpu": "16"},
        [
            {"key": "cloud.google.com/gke-spot", "value": "true", "effect": "NoSchedule"},
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
        ],
    ),
    (
        "eks",
        {
            "eks.amazonaws.com/nodegroup": "h100",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/cuda.driver-version.full": "570.124.06",
        },
        {"nvidia.com/gpu": "8"},
        [],
    ),
    (
        "eks-mig",
        {
            "eks.amazonaws.com/nodegroup": "h100-mixed",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/mig.strategy": "mixed",
            "nvidia.com/cuda.driver-version.full": "570.124.06",
        },
        {"nvidia.com/gpu": "4", "nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "4"},
        [],
    ),
    (
        "aks",
        {
            "kubernetes.azure.com/agentpool": "a100mig",
            "kubernetes.azure.com/scalesetpriority": "spot",
            "nvidia.com/gpu.product": "NVIDIA-A100-80GB-PCIe-MIG-1g.10gb",
            "nvidia.com/mig.strategy": "single",
            "nvidia.com/cuda.driver.major": "535",
            "nvidia.com/cuda.driver.minor": "161",
        },
        {"nvidia.com/gpu": "7"},
        [
            {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"},
            {"key": "sku", "value": "gpu", "effect": "NoSchedule"},
        ],
    ),
    (
        "karpenter-l4",
        {
            "karpenter.sh/nodepool": "inference",
            "karpenter.sh/capacity-type": "spot",
            "nvidia.com/gpu.product": "NVIDIA-L4",
            "nvidia.com/cuda.driver-version.full": "560.35.03",
        },
        {"nvidia.com/gpu": "1"},
        [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
    ),
    (
        "karpenter-t4",
        {
            "karpenter.sh/nodepool": "inference",
            "karpenter.sh/capacity-type": "on-demand",
            "nvidia.com/gpu.product": "Tesla-T4-SHARED",
            "nvidia.com/cuda.driver-version.full": "550.127.05",
        },
        {"nvidia.com/gpu": "4"},
        [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}],
    ),
    (
        "k3s",
        {
            "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090",
            "nvidia.com/cuda.driver.major": "535",
            "nvidia.com/cuda.driver.minor": "183",
            "nvidia.com/cuda.driver.rev": "01",
        },
        {"nvidia.com/gpu": "1"},
        [],
    ),
    ("cpu", {"cloud.google.com/gke-nodepool": "default-pool"}, {}, []),
]

COMMON = {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "topology.kubernetes.io/region": "r1"}


def make_nodes(count: int) -> list[dict[str, Any]]:
    nodes = []
    for i in range(count):
        _, labels, alloc, taints = POOLS[i % len(POOLS)]
        name = f"node-{i:05d}"
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": {
                        **COMMON,
                        **labels,
                        "kubernetes.io/hostname": name,
                        "nvidia.com/gfd.timestamp": str(1747000000 + i),
                        "topology.kubernetes.io/zone": f"z{i % 3}",
                    },
                },
                "spec": {"taints": taints},
                "status": {"allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110", **alloc}},
            }
        )
    return nodes


GPU_POD: dict[str, Any] = {
    "containers": [
        {
            "name": "c",
            "image": "nvidia/cuda:12.4.1-runtime-ubuntu22.04",
            "resources": {"limits": {"nvidia.com/gpu": "1"}},
        }
    ],
    "tolerations": [{"key": "cloud.google.com/gke-spot", "operator": "Exists"}],
}
SPECS: dict[str, tuple[dict[str, Any], dict[str, Decimal]]] = {
    "GPU pod, tolerations": (GPU_POD, {"nvidia.com/gpu": Decimal(1)}),
    "nodeSelector + affinity In/DoesNotExist": (
        {
            **GPU_POD,
            "nodeSelector": {"karpenter.sh/nodepool": "inference"},
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["z0", "z1"]},
                                    {"key": "nvidia.com/gfd.missing", "operator": "DoesNotExist"},
                                ]
                            }
                        ]
                    }
                }
            },
        },
        {"nvidia.com/gpu": Decimal(1)},
    ),
    "MIG resource": (GPU_POD, {"nvidia.com/mig-3g.40gb": Decimal(1)}),
    "hostname affinity (per node)": (
        {
            **GPU_POD,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-00001"]}
                                ]
                            }
                        ]
                    }
                }
            },
        },
        {"nvidia.com/gpu": Decimal(1)},
    ),
    "nodeName": ({**GPU_POD, "nodeName": "node-00009"}, {"nvidia.com/gpu": Decimal(1)}),
}


def timed(fn: Callable[[], object], budget: float = 0.5) -> float:
    """Median seconds per call over batches filling about ``budget`` seconds."""
    fn()
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    per_batch = max(1, int(budget / 5 / once))
    samples = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(per_batch):
            fn()
        samples.append((time.perf_counter() - start) / per_batch)
    return statistics.median(samples)


def first_ask(view: ClusterView, spec: dict[str, Any], resources: dict[str, Decimal]) -> list[Candidate]:
    """``view.eligible`` as the first pod of its shape asks it: the view's store of answers emptied first (a fresh
    store, as a new snapshot has), so the call does the whole work and does not return a kept answer."""
    object.__setattr__(view, "_memo", Memo(MEMO_SIZE))  # the view is a frozen dataclass
    return view.eligible(spec, resources)


def fmt(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs" if seconds < 1e-3 else f"{seconds * 1e3:.1f} ms"


def main() -> int:
    settings = Settings()
    sizes = (10, 5000)
    views: dict[int, ClusterView] = {}
    build: dict[int, float] = {}
    for n in sizes:
        nodes = make_nodes(n)
        build[n] = timed(lambda nodes=nodes: build_view(nodes, settings), budget=2.0)  # type: ignore[misc]
        views[n] = build_view(nodes, settings)
    print(f"Python {platform.python_version()} on {platform.machine()} ({platform.processor() or 'cpu'})\n")
    print("| measure | " + " | ".join(f"{n:,} nodes" for n in sizes) + " |")
    print("|---|" + "---|" * len(sizes))
    print("| groups | " + " | ".join(str(len(views[n].groups)) for n in sizes) + " |")
    print("| build_view | " + " | ".join(fmt(build[n]) for n in sizes) + " |")
    for label, (spec, resources) in SPECS.items():
        cells = []
        for n in sizes:
            view = views[n]
            cost = timed(lambda view=view, spec=spec, resources=resources: first_ask(view, spec, resources))  # type: ignore[misc]
            cells.append(fmt(cost))
        print(f"| eligible(): {label} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Node lists for the benchmark: an EKS + Karpenter cluster of GPU pools as ``kubectl get nodes -o json`` prints it.

Six pools (H100 on demand and spot, A100 with MIG, L4 for inference, T4 on an old driver with old GFD labels, and
CPU nodes), spread over three zones. Every node carries the labels GPU Feature Discovery and Karpenter write,
its own ``kubernetes.io/hostname`` and ``nvidia.com/gfd.timestamp``, and a status with capacity, allocatable,
conditions, addresses and nodeInfo. Images are left out of the status (the webhook ignores them; they only make
the file bigger).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}


@dataclass(frozen=True)
class PoolShape:
    name: str
    weight: float
    instance: str
    capacity_type: str = "on-demand"
    gpu: dict[str, str] = field(default_factory=dict)
    """GFD labels (without the ``nvidia.com/`` prefix)."""
    allocatable: dict[str, str] = field(default_factory=dict)
    cpu: str = "96"
    memory: str = "1998Gi"
    taints: tuple[dict[str, str], ...] = ()


def _gfd(product: str, memory: int, count: int, family: str, compute: str, driver: str, cuda: str) -> dict[str, str]:
    major, minor, rev = [*driver.split("."), ""][:3]
    cmajor, cminor = cuda.split(".")
    return {
        "gpu.product": product,
        "gpu.memory": str(memory),
        "gpu.count": str(count),
        "gpu.family": family,
        "gpu.compute.major": compute.split(".")[0],
        "gpu.compute.minor": compute.split(".")[1],
        "gpu.machine": "HVM-domU",
        "gpu.replicas": "1",
        "gpu.sharing-strategy": "none",
        "gpu.deploy.device-plugin": "true",
        "gpu.deploy.gpu-feature-discovery": "true",
        "gpu.deploy.dcgm-exporter": "true",
        "gpu.present": "true",
        "mig.capable": "false",
        "cuda.driver-version.full": driver,
        "cuda.driver-version.major": major,
        "cuda.driver-version.minor": minor,
        "cuda.driver-version.revision": rev,
        "cuda.runtime-version.full": cuda,
        "cuda.runtime-version.major": cmajor,
        "cuda.runtime-version.minor": cminor,
    }


H100 = _gfd("NVIDIA-H100-80GB-HBM3", 81559, 8, "hopper", "9.0", "550.54.15", "12.4")
A100_MIG = {
    **_gfd("NVIDIA-A100-SXM4-80GB", 81920, 8, "ampere", "8.0", "535.161.08", "12.2"),
    "mig.capable": "true",
    "mig.strategy": "mixed",
    "mig.config": "all-balanced",
    "mig.config.state": "success",
    "mig-3g.40gb.count": "8",
    "mig-3g.40gb.memory": "40192",
    "mig-3g.40gb.multiprocessors": "42",
    "mig-2g.20gb.count": "8",
    "mig-2g.20gb.memory": "19968",
    "mig-2g.20gb.multiprocessors": "28",
    "mig-1g.10gb.count": "16",
    "mig-1g.10gb.memory": "9728",
    "mig-1g.10gb.multiprocessors": "14",
}
L4 = _gfd("NVIDIA-L4", 23034, 1, "ada-lovelace", "8.9", "535.183.01", "12.2")
# GFD before v0.15 wrote the short, now deprecated, driver and runtime labels.
T4_OLD = {
    k: v
    for k, v in _gfd("Tesla-T4", 15360, 1, "turing", "7.5", "470.182.03", "11.4").items()
    if not k.startswith("cuda.")
} | {
    "cuda.driver.major": "470",
    "cuda.driver.minor": "182",
    "cuda.driver.rev": "03",
    "cuda.runtime.major": "11",
    "cuda.runtime.minor": "4",
}

POOLS: tuple[PoolShape, ...] = (
    PoolShape(
        "h100-train", 0.25, "p5.48xlarge", gpu=H100, allocatable={"nvidia.com/gpu": "8"}, cpu="192", taints=(GPU_TAINT,)
    ),
    PoolShape(
        "h100-spot",
        0.15,
        "p5.48xlarge",
        "spot",
        gpu={
            **H100,
            "cuda.driver-version.full": "550.90.07",
            "cuda.driver-version.minor": "90",
            "cuda.driver-version.revision": "07",
        },
        allocatable={"nvidia.com/gpu": "8"},
        cpu="192",
        taints=(GPU_TAINT,),
    ),
    PoolShape(
        "a100-mig",
        0.10,
        "p4de.24xlarge",
        gpu=A100_MIG,
        cpu="96",
        taints=(GPU_TAINT,),
        allocatable={
            "nvidia.com/gpu": "0",
            "nvidia.com/mig-3g.40gb": "8",
            "nvidia.com/mig-2g.20gb": "8",
            "nvidia.com/mig-1g.10gb": "16",
        },
    ),
    PoolShape(
        "l4-inference",
        0.30,
        "g6.2xlarge",
        gpu=L4,
        allocatable={"nvidia.com/gpu": "1"},
        cpu="8",
        memory="32Gi",
        taints=(GPU_TAINT,),
    ),
    PoolShape(
        "t4-legacy", 0.05, "g4dn.xlarge", gpu=T4_OLD, allocatable={"nvidia.com/gpu": "1"}, cpu="4", memory="16Gi"
    ),
    PoolShape("general", 0.15, "m6i.4xlarge", cpu="16", memory="64Gi"),
)


def pool_sizes(count: int) -> list[int]:
    """``count`` nodes over the pools by weight (largest remainder), at least one per pool when there are enough."""
    floor = 1 if count >= len(POOLS) else 0
    rest = count - floor * len(POOLS)
    shares = [p.weight * rest for p in POOLS]
    sizes = [floor + int(s) for s in shares]
    order = sorted(range(len(POOLS)), key=lambda i: shares[i] - int(shares[i]), reverse=True)
    for i in order[: count - sum(sizes)]:
        sizes[i] += 1
    return sizes


def _quantity_ki(memory: str) -> str:
    number, unit = memory[:-2], memory[-2:]
    scale = {"Gi": 1024 * 1024, "Mi": 1024}[unit]
    return f"{int(number) * scale}Ki"


def node(index: int, pool: PoolShape, zone: str) -> dict[str, Any]:
    ip = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
    name = node_name(index)
    labels = {
        "beta.kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/instance-type": pool.instance,
        "beta.kubernetes.io/os": "linux",
        "failure-domain.beta.kubernetes.io/region": "us-east-1",
        "failure-domain.beta.kubernetes.io/zone": zone,
        "k8s.io/cloud-provider-aws": "a94967527effcefb5f5829f529c0a1b9",
        "karpenter.k8s.aws/instance-category": pool.instance[0],
        "karpenter.k8s.aws/instance-family": pool.instance.split(".")[0],
        "karpenter.k8s.aws/instance-size": pool.instance.split(".")[1],
        "karpenter.sh/capacity-type": pool.capacity_type,
        "karpenter.sh/initialized": "true",
        "karpenter.sh/nodepool": pool.name,
        "karpenter.sh/registered": "true",
        "kubernetes.io/arch": "amd64",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "node.kubernetes.io/instance-type": pool.instance,
        "topology.k8s.aws/zone-id": f"use1-az{ZONES.index(zone) + 1}",
        "topology.kubernetes.io/region": "us-east-1",
        "topology.kubernetes.io/zone": zone,
    }
    if pool.gpu:
        labels.update({"nvidia.com/" + k: v for k, v in pool.gpu.items()})
        labels["nvidia.com/gfd.timestamp"] = str(1_716_000_000 + index * 7)
        labels["karpenter.k8s.aws/instance-gpu-name"] = pool.gpu["gpu.product"].split("-")[1].lower()
        labels["karpenter.k8s.aws/instance-gpu-count"] = pool.gpu["gpu.count"]
    allocatable = {
        "cpu": f"{int(pool.cpu) - 1}900m",
        "ephemeral-storage": "95491281146",
        "memory": _quantity_ki(pool.memory),
        "pods": "110",
        **pool.allocatable,
    }
    capacity = {**allocatable, "cpu": pool.cpu, "ephemeral-storage": "104845292Ki"}
    conditions = [
        {
            "type": t,
            "status": "False",
            "reason": f"KubeletHas{r}",
            "message": m,
            "lastHeartbeatTime": "2024-05-18T09:12:44Z",
            "lastTransitionTime": "2024-05-11T02:03:11Z",
        }
        for t, r, m in (
            ("MemoryPressure", "SufficientMemory", "kubelet has sufficient memory available"),
            ("DiskPressure", "NoDiskPressure", "kubelet has no disk pressure"),
            ("PIDPressure", "SufficientPID", "kubelet has sufficient PID available"),
        )
    ] + [
        {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": "2024-05-18T09:12:44Z",
            "lastTransitionTime": "2024-05-11T02:04:01Z",
        }
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"7d0c1e52-{index:04x}-4b2a-9d1e-{index:012x}",
            "resourceVersion": str(48_000_000 + index),
            "creationTimestamp": "2024-05-11T02:02:37Z",
            "labels": labels,
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": ip,
                "karpenter.k8s.aws/ec2nodeclass-hash": "15616957348189460630",
                "karpenter.sh/nodepool-hash": "6821555240767823861",
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "providerID": f"aws:///{zone}/i-0{index:016x}",
            **({"taints": [dict(t) for t in pool.taints]} if pool.taints else {}),
        },
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "InternalDNS", "address": name},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": f"b1f0{index:08x}-2c6e-4d8e-9f0a-5a3c1e7d9b42",
                "containerRuntimeVersion": "containerd://1.7.11",
                "kernelVersion": "5.10.215-203.850.amzn2.x86_64",
                "kubeProxyVersion": "v1.29.3-eks-ae9a62a",
                "kubeletVersion": "v1.29.3-eks-ae9a62a",
                "machineID": f"ec2{index:029x}",
                "operatingSystem": "linux",
                "osImage": "Amazon Linux 2",
                "systemUUID": f"ec2{index:05x}-1d2c-3b4a-5f6e-7d8c9b0a1f2e",
            },
        },
    }


def node_name(index: int) -> str:
    """The name of the node numbered ``index`` (from 1; node 1 is in the first pool at every count)."""
    ip = f"10.{(index >> 16) & 255}.{(index >> 8) & 255}.{index & 255}"
    return f"ip-{ip.replace('.', '-')}.ec2.internal"


def node_list(count: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    index = 1
    for pool, size in zip(POOLS, pool_sizes(count), strict=True):
        for _ in range(size):
            items.append(node(index, pool, ZONES[index % len(ZONES)]))
            index += 1
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}


def write_nodes(path: Path, count: int) -> Path:
    """Write a node list of ``count`` nodes as JSON (which is also YAML) and return the path."""
    path.write_text(json.dumps(node_list(count)))
    return path

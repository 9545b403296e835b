"""The cluster as the policies see it: GPU node groups and pools, and where a pod could be scheduled.

Nodes come from a live watch (``webhook.watch``), a node-list file (``cluster_from_file``), or pools declared in
settings. Whenever the node set changes, nodes are folded into *groups*: nodes with the same labels (ignoring
per-node ones such as the hostname), taints and GPU resources look the same to every scheduling rule, so a request is
evaluated against each group once, and its cost does not grow with the number of nodes. Groups belong to *pools* (a
declared pool, a provider's node pool named by a label or annotation, or else the nodes that share GPU product,
driver and MIG layout).

Scheduling rules evaluated, as k8s.io/component-helpers ``scheduling/corev1`` and the scheduler's plugins do:
``nodeName`` (which bypasses the scheduler: the kubelet then checks only NoExecute taints), ``nodeSelector``,
required node affinity (terms ORed, expressions ANDed; In NotIn Exists DoesNotExist Gt Lt; ``matchFields`` only on
``metadata.name`` with In/NotIn and one value), NoSchedule/NoExecute taints against tolerations (Equal, Exists, and
the numeric Lt/Gt of the TaintTolerationComparisonOperators gate), the ExtendedResourceToleration admission plugin,
and whether the node offers the extended resources asked for. A rule that the apiserver would reject (unknown
operator, malformed value, wrong type) matches nothing and never raises.
"""

from __future__ import annotations

import functools
import marshal
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any, Protocol, TypeVar

from webhook import budget
from webhook.config import PoolSettings, Settings
from webhook.documents import numbered, read_documents
from webhook.drivers import DriverTable, Version, builtin_table, parse_version, show, show_driver
from webhook.errors import InputError
from webhook.mig_profiles import load_table
from webhook.model import JSON, as_dict, as_list, as_str, clipped, is_label_value, is_qualified_name
from webhook.presets import Presets, load_presets
from webhook.quantity import QuantityError, parse_quantity

GFD = "nvidia.com/"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_TAINT_TOLERATION: JSON = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
"""What tolerates the GPU taint of GPU nodes (``nvidia.com/gpu``, as GKE, AKS and the GPU Operator's docs write it)."""
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GPU_VENDOR_PREFIX = "nvidia.com/"
"""What the NVIDIA device plugin names its resources with (whole GPUs, shared GPUs, MIG devices)."""
GKE_PARTITION_LABEL = "cloud.google.com/gke-gpu-partition-size"
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
PRODUCT_LABEL = GFD + "gpu.product"
GKE_LABELS = "cloud.google.com/gke-"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
"""The node's instance type, as the kubelet (or its cloud provider, or Karpenter) labels it (kubernetes.io "Well-Known
Labels, Annotations and Taints")."""
PLATFORM_LABEL = "kubernetes.io/arch"
NODE_OS_LABELS: Mapping[str, str] = {"kubernetes.io/os": "linux", "beta.kubernetes.io/os": "linux"}
"""What the kubelet labels a Linux node with (the beta key too), as Cluster Autoscaler's template node for a group at
zero carries them (its generic labels): every GPU node runs Linux (NVIDIA's device plugin, which offers
nvidia.com/gpu, runs on nothing else)."""


def is_gpu_device(resource: str) -> bool:
    """Whether an extended resource is a GPU device of NVIDIA's device plugin: a whole GPU, a shared one, a MIG
    device (not any nvidia.com/ resource: the Network Operator's nvidia.com/hostdev is a network function)."""
    return resource in (GPU_RESOURCE, SHARED_GPU_RESOURCE) or resource.startswith(MIG_RESOURCE_PREFIX)


def compat_wired(labels: Mapping[str, str], driver_source: str) -> bool:
    """Whether a group's container runtime loads an image's CUDA compat libraries: not on GKE's own driver installer
    and device plugin (a GKE label, and no label of GPU feature discovery, which comes with the GPU Operator and its
    toolkit; a declared pool scaled to zero shows one where its nodeSelector names one, nvidia.com/gpu.present).
    There a container sees the node's libcuda first (nvidia/cuda's LD_LIBRARY_PATH names GKE's /usr/local/nvidia),
    and an image newer than the driver fails "CUDA driver version is insufficient". Worked out once per group, when
    the view is built."""
    if driver_source.startswith(GFD):
        return True  # GPU feature discovery's labels: the GPU Operator, and its toolkit, run the GPUs
    return not gke_own_plugin(labels)


def gke_own_plugin(labels: Mapping[str, str]) -> bool:
    """Whether nodes of ``labels`` run GKE's own driver installer and device plugin: a GKE label, and no label of
    GPU feature discovery (which comes with the GPU Operator). Their nodes carry none of GFD's labels."""
    return any(key.startswith(GKE_LABELS) for key in labels) and not any(key.startswith(GFD) for key in labels)


GKE_DRIVER_LABEL = "cloud.google.com/gke-gpu-driver-version"
GKE_SHARING_LABEL = "cloud.google.com/gke-gpu-sharing-strategy"
"""GKE's GPU sharing on a node pool (GPUSharingConfig: ``time-sharing`` or ``mps``), with the most clients a GPU
takes in ``cloud.google.com/gke-max-shared-clients-per-gpu`` (GKE docs, "About GPU sharing solutions in GKE")."""
GKE_SHARED_CLIENTS_LABEL = "cloud.google.com/gke-max-shared-clients-per-gpu"
GKE_SHARING = {"time-sharing": "time-slicing", "mps": "mps"}
MIG_CONFIG_LABEL = GFD + "mig.config"
MIG_CONFIG_STATE_LABEL = GFD + "mig.config.state"
MIG_CHANGING_STATES = frozenset({"pending", "rebooting"})
"""MIG Manager states (the GPU Operator's, which writes the label) in which the node's MIG layout is being replaced."""
SHARED_SUFFIX = "-SHARED"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class MigOffer:
    """A MIG profile a node offers: how many devices and their usable memory (MiB, 0 when not labelled)."""

    count: int
    memory_mib: int = 0


@dataclass(frozen=True)
class Node:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]
    allocatable: Mapping[str, Decimal]
    """Extended resources only (names with a '/')."""
    annotations: Mapping[str, str] = field(default_factory=dict)
    provider: str = ""
    """The provider its kubelet version names (``Presets.kubelet_versions``: EKS, GKE), else ""."""


@dataclass(frozen=True)
class NodeGroup:
    """Nodes that every scheduling rule treats alike, with the GPU facts the policies need."""

    pool: str
    labels: Mapping[str, str]
    """Labels shared by every node of the group (volatile per-node labels removed)."""
    taints: tuple[Taint, ...]
    allocatable: Mapping[str, Decimal]
    """Extended resources each node offers (MIG resources withheld while the MIG layout is changing)."""
    nodes: tuple[str, ...]
    """Node names; empty for a pool declared in settings that has no node now (scaled to zero)."""
    node_labels: Mapping[str, Mapping[str, str]]
    """Per-node volatile labels (hostname ...), by node name."""
    gpu_product: str = ""
    """GPU product as GFD names it, without the ``-SHARED`` and ``-MIG-<profile>`` suffixes."""
    gpu_memory_mib: int = 0
    """``nvidia.com/gpu.memory`` (under the single MIG strategy GFD describes the MIG device), else settings."""
    gpu_count: int = 0
    driver: Version | None = None
    driver_source: str = ""
    """Where the driver version came from: a label name, or 'settings (pool <name>)'."""
    cuda: Version | None = None
    """Newest CUDA major.minor the driver supports."""
    cuda_source: str = ""
    mig_strategy: str = "none"
    """none, single, mixed (NVIDIA device plugin) or gke (cloud.google.com/gke-gpu-partition-size)."""
    mig_profiles: Mapping[str, MigOffer] = field(default_factory=dict)
    """MIG profiles each node offers now (allocatable > 0)."""
    sharing: str = "none"
    """none, time-slicing or mps."""
    spot: bool = False
    declared: bool = False
    """A pool declared in settings with no node now: what its nodes will look like."""
    mig_capable: bool = False
    """``nvidia.com/mig.capable=true``, a MIG strategy in use, or a declared MIG pool."""
    mig_config: str = ""
    """MIG Manager's ``nvidia.com/mig.config`` (the layout asked for, e.g. all-1g.10gb)."""
    mig_config_state: str = ""
    """MIG Manager's ``nvidia.com/mig.config.state``: success, pending, rebooting, failed ('' when absent)."""
    gpu_replicas: int = 0
    """Time-slicing / MPS replicas per GPU (``nvidia.com/gpu.replicas``), 0 when not shared or unknown."""
    pool_source: str = ""
    """What named the pool: 'settings', 'label <key>', 'annotation <key>', or 'GPU product, driver and MIG layout'."""
    counts_known: bool = True
    """False for a declared pool without ``gpuCount``: its nvidia.com/gpu count (1) means some, not how many."""
    notes: tuple[str, ...] = ()
    """Facts a user should know about the group, in words (unknown driver, MIG layout changing ...)."""
    driver_version_text: str = ""
    """The driver version as the node or settings wrote it: the fact itself (Tegra's 540.4.0 has no padded part)."""
    compat_wired: bool = True
    """The nodes' container runtime loads an image's CUDA compat libraries (``compat_wired``)."""

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_product) or any(is_gpu_device(k) for k, v in self.allocatable.items() if v > 0)

    @property
    def offers_gpu(self) -> bool:
        """A GPU device (whole, shared or MIG) is offered now (allocatable > 0 of an ``nvidia.com/`` resource): not
        so on a node that has joined before its device plugin advertises one."""
        return any(v > 0 for k, v in self.allocatable.items() if k.startswith(GPU_VENDOR_PREFIX))

    @property
    def driver_text(self) -> str:
        return self.driver_version_text or show_driver(self.driver)

    @property
    def cuda_text(self) -> str:
        return show(self.cuda) if self.cuda else "unknown"

    @property
    def mig_changing(self) -> bool:
        """MIG Manager is replacing the layout (pending / rebooting): its MIG devices are not offered."""
        return self.mig_config_state in MIG_CHANGING_STATES

    def describe(self) -> str:
        """'pool a100 (2 nodes, NVIDIA-A100-SXM4-80GB, driver 550.54.15, CUDA 12.4)'"""
        size = f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''}" if self.nodes else "no nodes now"
        gpu = f", {self.gpu_product}" if self.gpu_product else ""
        return f"pool {self.pool} ({size}{gpu}, driver {self.driver_text}, CUDA {self.cuda_text})"


@dataclass(frozen=True)
class Candidate:
    """A group the pod could land on, and which of its nodes (all of them unless a per-node rule narrowed it)."""

    group: NodeGroup
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Pool:
    """What ``gpu-admission pools`` shows: the groups of one pool taken together."""

    name: str
    groups: tuple[NodeGroup, ...]

    def mig_profile_counts(self) -> dict[str, int]:
        """Offered MIG devices per profile over the pool's nodes (a declared pool with no node: per node)."""
        profiles: dict[str, int] = {}
        for g in self.groups:
            per_node = max(len(g.nodes), 1)
            for p, offer in g.mig_profiles.items():
                profiles[p] = profiles.get(p, 0) + offer.count * per_node
        return dict(sorted(profiles.items()))

    def as_json(self) -> JSON:
        gs = self.groups
        drivers = sorted({(g.driver, g.driver_text) for g in gs if g.driver})
        cudas = sorted({g.cuda for g in gs if g.cuda})
        # GKE's nodes have no GFD product label: the accelerator label names the model there
        products = sorted({p for g in gs if (p := g.gpu_product or g.labels.get(GKE_ACCELERATOR_LABEL, ""))})
        strategies = sorted({g.mig_strategy for g in gs})
        return {
            "name": self.name,
            "nodes": sum(len(g.nodes) for g in gs),
            "gpu": ", ".join(products) or None,
            "driver": ", ".join(dict.fromkeys(text for _, text in drivers)) or None,
            "cuda": show(cudas[-1]) if cudas else None,
            "migStrategy": strategies[0] if len(strategies) == 1 else ", ".join(strategies),
            "migProfiles": self.mig_profile_counts(),
            "spot": any(g.spot for g in gs),
        }


T = TypeVar("T")


class Memo:
    """A store of answers computed against one snapshot, bounded by entries and by the bytes of its keys (or the
    sizes given); emptied when full. Shared by a worker's threads: each step is one dict operation, and a count off
    by a request or two under a race only moves the moment it is emptied."""

    def __init__(self, entries: int, key_bytes: int = 0) -> None:
        self.entries, self.key_bytes = entries, key_bytes
        self._data: dict[Any, Any] = {}
        self._sizes: dict[Any, int] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: Any) -> Any:
        return self._data.get(key)

    def put(self, key: Any, value: Any, size: int | None = None) -> None:
        """``size``: the bytes it counts against ``key_bytes`` (the key's length when not given). A key put again
        counts its new size in place of its old one. An entry of more than a quarter of ``key_bytes`` is not kept:
        each pod of megabytes emptied the store for every other one."""
        size = (len(key) if size is None else size) if self.key_bytes else 0
        if size > self.key_bytes // 4:  # and what the key held goes: a value grown in place is never held uncounted
            self._data.pop(key, None)
            self._bytes -= self._sizes.pop(key, 0)
            return
        entries = len(self._data) + (key not in self._data)
        before = self._sizes.get(key, 0)
        if entries > self.entries or (self.key_bytes and self._bytes - before + size > self.key_bytes):
            self._data, self._sizes, self._bytes, before = {}, {}, 0, 0
        self._data[key] = value
        if self.key_bytes:
            self._sizes[key] = size
        self._bytes += size - before

    def per_settings(self, key: Any, settings: object, make: Callable[[], T], size: Callable[[T], int]) -> T:
        """``make()``, kept under ``key`` with the settings it was made for (a snapshot outlives a settings reload:
        made again for other settings), counted as ``size(value)``. The value is shared between requests: read
        only."""
        stored = self._data.get(key)
        if stored is not None and stored[0] is settings:
            kept: T = stored[1]
            return kept
        made = make()
        self.put(key, (settings, made), size=size(made))
        return made


@dataclass(frozen=True)
class ClusterView:
    """An immutable snapshot of the cluster; rebuilt off the request path whenever nodes change."""

    groups: tuple[NodeGroup, ...] = ()
    node_count: int = 0
    built_at: float = field(default_factory=time.monotonic)
    source: str = "settings"
    presets: Presets = field(default_factory=load_presets)
    extended_resource_toleration: bool = True
    volatile_labels: frozenset[str] = frozenset()
    known: bool = True
    """False when no source has described the cluster (no nodes listed yet and no pool declared)."""
    providers: frozenset[str] = frozenset()
    """The providers of the presets in force that the cluster shows (``shown_providers``)."""
    labelled_providers: frozenset[str] = frozenset()
    """Those of ``providers`` the cluster shows by their labels or OKE's pool annotation, not by a kubelet version
    alone (``labelled_providers``): an EKS cluster of self-managed node groups shows EKS by its kubelets, and its
    spot nodes carry no EKS label."""
    spot_now: bool = False
    """A group is spot capacity now (its labels or taints, or a pool declared ``spot: true``)."""
    gpu_spot_now: bool = False
    """A group with GPUs is spot capacity now."""
    on_demand_keys: frozenset[str] = frozenset()
    """The label keys of the groups that are not spot capacity. These three are read by the spot policy on every
    request, and were worked out there from the groups each time (found by a review)."""
    gpu_pools: frozenset[str] = frozenset()
    """The pools with GPUs (one of their groups has them; a declared pool's nodes have its GPU by settings): what
    ``joining`` reads of a node of any other pool, worked out when the view is built (a lazy cached_property before:
    the first request after each rebuild paid for it)."""
    gpu_instance_types: frozenset[tuple[str, str]] = frozenset()
    """(pool, instance type) of the groups with GPUs (``INSTANCE_TYPE_LABEL``): what ``joining`` reads of a node of a
    pool of CPU and GPU instance types alike, worked out when the view is built."""
    _memo: Memo = field(
        default_factory=lambda: Memo(MEMO_SIZE, 4 << 20), init=False, compare=False, repr=False, hash=False
    )
    """Answers of ``eligible`` by what they depend on: a request asks several times, and replicas of one workload
    ask the same; dropped with the view when nodes change. At most 4 MiB of keys (a pod's affinity may be MBs)."""
    decisions: Memo = field(
        default_factory=lambda: Memo(DECISIONS_SIZE, DECISIONS_BYTES), init=False, compare=False, repr=False, hash=False
    )
    """The pipeline's answers against this snapshot, by object shape (``webhook.decisions``)."""
    replays: Memo = field(
        default_factory=lambda: Memo(DECISIONS_SIZE, DECISIONS_BYTES), init=False, compare=False, repr=False, hash=False
    )
    """Templates of replicas' bodies, by endpoint and body length, for the answers above (``webhook.replay``)."""
    policy_memo: Memo = field(
        default_factory=lambda: Memo(MEMO_SIZE, 4 << 20), init=False, compare=False, repr=False, hash=False
    )
    """What a policy planned against this snapshot, by what the plan depends on (the cuda policy's steering); at
    most 4 MiB of keys, each put with its size."""

    @property
    def gpu_groups(self) -> tuple[NodeGroup, ...]:
        return tuple(g for g in self.groups if g.has_gpu)

    @property
    def pools(self) -> tuple[Pool, ...]:
        by_name: dict[str, list[NodeGroup]] = {}
        for g in self.groups:
            by_name.setdefault(g.pool, []).append(g)
        return tuple(Pool(name, tuple(gs)) for name, gs in sorted(by_name.items()))

    @property
    def age_seconds(self) -> float:
        return time.monotonic() - self.built_at

    def taints(self) -> frozenset[Taint]:
        return self._taints

    def label_values(self, key: str) -> frozenset[str]:
        return self._label_values.get(key, frozenset())

    def joining(self, group: NodeGroup) -> bool:
        """Whether the group's nodes are GPU nodes joining, their device plugin (and GFD) not up yet: they offer no
        GPU device now, and GFD's labels, the labels their provider gives a GPU node from its start
        (``Presets.gpu_labelled``), or their pool's other nodes (``gpu_pools``) say they have GPUs. Of a pool that
        may hold CPU and GPU instance types alike (a Karpenter NodePool: ``Presets.mixed_pool_labels``), only a node
        of an instance type that a node of the pool with GPUs has: its CPU nodes were taken for GPU nodes joining,
        for good (a review's), and where no label says GPU (Cluster API's Karpenter) a GPU node joining was told it
        stays Pending (a review of MIG)."""
        if group.offers_gpu:
            return False
        if group.has_gpu or self.presets.gpu_labelled(group.labels):
            return True
        if self.presets.mixed_pool_labels.isdisjoint(group.labels):
            return group.pool in self.gpu_pools
        return (group.pool, group.labels.get(INSTANCE_TYPE_LABEL, "")) in self.gpu_instance_types

    @functools.cached_property
    def _taints(self) -> frozenset[Taint]:
        return frozenset(t for g in self.groups for t in g.taints)

    @functools.cached_property
    def _label_values(self) -> dict[str, frozenset[str]]:
        values: dict[str, set[str]] = {}
        for g in self.groups:
            for key, value in g.labels.items():
                values.setdefault(key, set()).add(value)
        return {k: frozenset(v) for k, v in values.items()}

    def eligible(
        self, spec: JSON, resources: Mapping[str, Decimal] | Iterable[str] = (), gpu_only: bool = True
    ) -> list[Candidate]:
        """The groups (and nodes) a pod with this spec could be scheduled on.

        ``resources`` are the extended resources to check the nodes offer (with amounts when a mapping);
        ``gpu_only`` keeps only groups with GPUs. A candidate of a declared pool without nodes has ``nodes == ()``.
        """
        if not isinstance(spec, dict):
            return []
        wanted = _wanted(resources)
        key = eligibility_key(spec, wanted, gpu_only)
        if key is not None:
            cached = self._memo.get(key)
            if cached is not None:
                return list(cached)
        found = self._eligible(spec, wanted, gpu_only)
        if key is not None:
            self._memo.put(key, tuple(found))
        return found

    def _eligible(self, spec: JSON, wanted: Mapping[str, Decimal], gpu_only: bool) -> list[Candidate]:
        rules = _Rules.of(spec, self.volatile_labels)
        if rules.impossible:
            return []
        tolerated_by_plugin = extended_resource_names(spec) if self.extended_resource_toleration else frozenset()
        out: list[Candidate] = []
        for group in self.groups:
            budget.check()
            if gpu_only and not group.has_gpu:
                continue
            if not offers(group, wanted):
                continue
            if not _tolerates(group.taints, rules.tolerations, tolerated_by_plugin, rules.node_name is not None):
                continue
            nodes = rules.nodes_of(group)
            if nodes is None:
                continue
            out.append(Candidate(group, nodes))
        return out


MEMO_SIZE = 512
DECISIONS_SIZE = 1024
"""Answers kept per snapshot (a workload's replicas come in bursts: the store is emptied when full)."""
DECISIONS_BYTES = 16 << 20
"""And at most this many bytes of keys (a 60 kB pod's shape is about 37 kB)."""


def eligibility_key(spec: JSON, wanted: Mapping[str, Decimal], gpu_only: bool) -> bytes | None:
    """Everything of a spec that ``eligible`` reads, as bytes (``marshal``: equal bytes only from equal values; a
    fifth of ``json.dumps``'s cost); None when it cannot be written down."""
    try:
        return marshal.dumps(
            (
                spec.get("nodeName"),
                spec.get("nodeSelector"),
                spec.get("affinity"),
                spec.get("tolerations"),
                tuple(sorted(extended_resource_names(spec))),
                tuple(sorted((k, str(v)) for k, v in wanted.items())),
                gpu_only,
            )
        )
    except ValueError:
        return None


class ClusterSource(Protocol):
    """Where a ClusterView comes from: a file, settings, or the live watch."""

    def snapshot(self) -> ClusterView: ...

    def ready(self) -> bool: ...

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds to be ready; whether it is."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def problem(self) -> str | None:
        """What keeps the view from being current (the live watch's last error, and since when), for /readyz; None
        when nothing does."""
        ...

    @property
    def snapshot_age_seconds(self) -> float:
        """How far behind the cluster the snapshot may be: for the live watch, 0 while its watch is open, else the
        time since its nodes were last known current; for a node file, the time since it was read."""
        ...


class StaticCluster:
    """A fixed snapshot (node-list file, declared pools, tests)."""

    def __init__(self, view: ClusterView) -> None:
        self._view = view

    def snapshot(self) -> ClusterView:
        return self._view

    def ready(self) -> bool:
        return True

    def wait_ready(self, timeout: float) -> bool:
        return True

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def problem(self) -> str | None:
        return None

    @property
    def snapshot_age_seconds(self) -> float:
        return self._view.age_seconds

    @property
    def node_count(self) -> int:
        return self._view.node_count


# ---------------------------------------------------------------------------------------------------------------
# Requests

_INT64 = re.compile(r"^[+-]?[0-9]+\Z")


def parse_int64(text: object) -> int | None:
    """strconv.ParseInt(text, 10, 64): an optional sign and decimal digits, within int64; else None."""
    if not isinstance(text, str) or not _INT64.match(text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def is_extended_resource_name(name: object) -> bool:
    """pkg/apis/core/helper IsExtendedResourceName: has a '/', outside ``*kubernetes.io/``, not ``requests.*``."""
    if not isinstance(name, str) or "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    return is_qualified_name("requests." + name)


def requested_resources(spec: JSON) -> dict[str, Decimal]:
    """Effective extended-resource request of a pod, as the scheduler computes it (k8s.io/component-helpers
    ``resource.PodRequests``): the larger of (app containers + restartable init containers, i.e. sidecars) and, for
    each regular init container, its own request plus the sidecars started before it. Values that are not
    quantities are left out; limits stand in for absent requests (as Kubernetes defaults them).
    """
    if not isinstance(spec, dict):
        return {}
    total: dict[str, Decimal] = {}
    for c in as_list(spec.get("containers")):
        budget.check()
        if isinstance(c, dict):
            for k, v in container_resources(c).items():
                total[k] = total.get(k, Decimal(0)) + v
    sidecars: dict[str, Decimal] = {}
    init_peak: dict[str, Decimal] = {}
    for c in as_list(spec.get("initContainers")):
        budget.check()
        if not isinstance(c, dict):
            continue
        amounts = container_resources(c)
        if c.get("restartPolicy") == "Always":
            for k, v in amounts.items():
                sidecars[k] = sidecars.get(k, Decimal(0)) + v
                init_peak[k] = max(init_peak.get(k, Decimal(0)), sidecars[k])
        else:
            # its own resources: for the sidecars' alone, their peak is kept as they start (a loop over them too
            # was quadratic in a pod's resources: a review that measured the costliest pods)
            for k, v in amounts.items():
                init_peak[k] = max(init_peak.get(k, Decimal(0)), v + sidecars.get(k, Decimal(0)))
    for k, v in sidecars.items():
        total[k] = total.get(k, Decimal(0)) + v
    for k, v in init_peak.items():
        total[k] = max(total.get(k, Decimal(0)), v)
    return {k: v for k, v in total.items() if v > 0}


def asking_most(spec: JSON, name: str, have: Decimal) -> str:
    """Where the pod's ask of ``name`` is more than ``have`` and not one container's alone, the containers to change:
    " in init container <name>" where an init container asks the most, " in <a> and <b> together" where
    the app containers' sum does (they run together: their asks add up, the init containers' one at a time); '' where
    neither is more than ``have``. An init container of 4 GPUs beside an app container of 1 was told "ask at most 1",
    and two app containers of 1 each the same, which read as met (found by reviews). A loop over the containers."""
    apps = [(a, as_str(c.get("name"))) for c in as_list(spec.get("containers")) if (a := _asks(c, name)) > 0]
    inits = [(a, as_str(c.get("name"))) for c in as_list(spec.get("initContainers")) if (a := _asks(c, name)) > 0]
    together = sum((a for a, _ in apps), Decimal(0))
    most = max(inits, key=lambda a: a[0], default=(Decimal(0), ""))
    if len(apps) + len(inits) < 2 or max(together, most[0]) <= have:
        return ""
    if most[0] >= together:
        return f" in init container {most[1]}"
    if len(apps) == 1:
        return f" in container {apps[0][1]}"
    others = apps[1][1] if len(apps) == 2 else f"{len(apps) - 1} more"
    return f" in {apps[0][1]} and {others} together"  # "in containers" left out: the spot warning's 119 characters


def _asks(container: object, name: str) -> Decimal:
    return container_resources(as_dict(container)).get(name, Decimal(0))


def container_resources(container: JSON) -> dict[str, Decimal]:
    """A container's extended resources (limits, else requests), as Decimals; unparseable values skipped."""
    if not isinstance(container, dict):
        return {}
    resources = as_dict(container.get("resources"))
    merged = dict(as_dict(resources.get("requests")))
    merged.update(as_dict(resources.get("limits")))
    out: dict[str, Decimal] = {}
    for name, value in merged.items():
        if not is_extended_resource_name(name):
            continue
        try:
            out[name] = parse_quantity(value)
        except QuantityError:
            continue
    return out


def extended_resource_names(spec: JSON) -> frozenset[str]:
    """Extended resources named in any container's or init container's requests or limits, whatever the amount:
    the ones the ExtendedResourceToleration admission plugin adds ``<name>:NoSchedule Exists`` tolerations for."""
    names: set[str] = set()
    for list_name in ("containers", "initContainers"):
        for c in as_list(spec.get(list_name)):
            resources = as_dict(as_dict(c).get("resources"))
            for part in ("requests", "limits"):
                names.update(n for n in as_dict(resources.get(part)) if is_extended_resource_name(n))
    return frozenset(names)


def _wanted(resources: Mapping[str, Decimal] | Iterable[str]) -> dict[str, Decimal]:
    if isinstance(resources, Mapping):
        return {str(k): v if isinstance(v, Decimal) else Decimal(0) for k, v in resources.items()}
    if isinstance(resources, str):
        return {resources: Decimal(0)}
    return {str(r): Decimal(0) for r in resources}


def offers(group: NodeGroup, wanted: Mapping[str, Decimal]) -> bool:
    """Each wanted resource is offered (> 0); a whole amount must fit on one node (when the group's counts are
    known: a declared pool without ``gpuCount`` says it has GPUs, not how many)."""
    for name, amount in wanted.items():
        have = group.allocatable.get(name, Decimal(0))
        if have <= 0:
            return False
        whole = amount.is_finite() and amount == amount.to_integral_value()
        if whole and have < amount and (group.counts_known or name != GPU_RESOURCE):
            return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# Taints and tolerations

_TAINT_EFFECTS = frozenset({"NoSchedule", "PreferNoSchedule", "NoExecute"})


def toleration_tolerates(tol: JSON, taint: Taint) -> bool:
    """v1.Toleration.ToleratesTaint (k8s.io/component-helpers ``scheduling/corev1``): an empty effect matches every
    effect; an empty key with Exists matches every key; Equal (the default) compares values, an absent value being
    ''; Lt/Gt compare the taint's value with the toleration's as int64 (TaintTolerationComparisonOperators: the
    apiserver accepted the pod, so the gate is on). Anything the apiserver would reject (an empty key without Exists,
    non-string fields, unknown operators, malformed numbers) tolerates nothing.
    """
    if not isinstance(tol, dict):
        return False
    effect, key, operator, value = (tol.get(k) for k in ("effect", "key", "operator", "value"))
    if any(v is not None and not isinstance(v, str) for v in (effect, key, operator, value)):
        return False
    effect, key, operator, value = effect or "", key or "", operator or "Equal", value or ""
    if effect and effect != taint.effect:
        return False
    if key:
        if key != taint.key:
            return False
    elif operator != "Exists":
        return False
    if operator == "Exists":
        return True
    if operator == "Equal":
        return value == taint.value
    if operator in ("Lt", "Gt"):
        bound, have = parse_int64(value), parse_int64(taint.value)
        if bound is None or have is None:
            return False
        return have < bound if operator == "Lt" else have > bound
    return False


def _untolerated(
    taints: Sequence[Taint], tolerations: Sequence[JSON], extended: frozenset[str], bound_to_node: bool
) -> Iterator[Taint]:
    """The NoSchedule/NoExecute taints left untolerated. A pod with ``nodeName`` skips the scheduler: the kubelet
    then checks only NoExecute taints. ExtendedResourceToleration adds ``key=<resource>, operator=Exists,
    effect=NoSchedule`` for each extended resource the pod names: it covers NoSchedule taints only."""
    for taint in taints:
        if taint.effect == "NoExecute":
            pass
        elif taint.effect == "NoSchedule":
            if bound_to_node or taint.key in extended:
                continue
        else:
            continue  # PreferNoSchedule and unknown effects do not filter
        if not any(toleration_tolerates(t, taint) for t in tolerations):
            yield taint


def _tolerates(
    taints: Sequence[Taint], tolerations: Sequence[JSON], extended: frozenset[str], bound_to_node: bool
) -> bool:
    return next(_untolerated(taints, tolerations, extended, bound_to_node), None) is None


def untolerated(group: NodeGroup, spec: JSON, extended_resource_toleration: bool = True) -> list[Taint]:
    """The taints of ``group`` that keep a pod with ``spec`` off it (what it would have to tolerate)."""
    rules = _Rules.of(spec, frozenset())
    extended = extended_resource_names(spec) if extended_resource_toleration else frozenset()
    return list(_untolerated(group.taints, rules.tolerations, extended, rules.node_name is not None))


# ---------------------------------------------------------------------------------------------------------------
# Node selection rules

_LABEL_OPERATORS = frozenset({"In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"})


@dataclass(frozen=True)
class _Requirement:
    """One parsed NodeSelectorRequirement on labels (labels.NewRequirement has accepted it)."""

    key: str
    operator: str
    values: frozenset[str]
    bound: int = 0

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.operator == "In":
            return value is not None and value in self.values
        if self.operator == "NotIn":
            return value is None or value not in self.values
        if self.operator == "Exists":
            return value is not None
        if self.operator == "DoesNotExist":
            return value is None
        have = parse_int64(value)
        if have is None:
            return False
        return have > self.bound if self.operator == "Gt" else have < self.bound


def _requirement(expr: object) -> _Requirement | None:
    """Parse one matchExpressions entry; None when the apiserver or the scheduler would reject it."""
    if not isinstance(expr, dict):
        return None
    key, operator, raw = expr.get("key"), expr.get("operator"), expr.get("values")
    if not is_qualified_name(key) or not isinstance(operator, str) or operator not in _LABEL_OPERATORS:
        return None
    values = [] if raw is None else raw
    if not isinstance(values, list) or not all(is_label_value(v) for v in values):
        return None
    assert isinstance(key, str) and isinstance(operator, str)
    if operator in ("In", "NotIn"):
        return _Requirement(key, operator, frozenset(values)) if values else None
    if operator in ("Exists", "DoesNotExist"):
        return None if values else _Requirement(key, operator, frozenset())
    bound = parse_int64(values[0]) if len(values) == 1 else None
    return None if bound is None else _Requirement(key, operator, frozenset(values), bound)


def _field_requirement(expr: object) -> tuple[bool, str] | None:
    """Parse one matchFields entry: (is In, node name); only ``metadata.name`` with In/NotIn and one value."""
    if not isinstance(expr, dict) or expr.get("key") != "metadata.name":
        return None
    values = expr.get("values")
    if expr.get("operator") not in ("In", "NotIn") or not isinstance(values, list) or len(values) != 1:
        return None
    if not isinstance(values[0], str):
        return None
    return expr.get("operator") == "In", values[0]


@dataclass(frozen=True)
class _Term:
    requirements: tuple[_Requirement, ...]
    fields: tuple[tuple[bool, str], ...]

    def matches(self, labels: Mapping[str, str], name: str | None) -> bool:
        """``name`` None: a declared pool without nodes now, whose nodes to come carry names of their own, none a rule
        names now: ``metadata.name In`` fails, ``NotIn`` holds (every field rule failed, and a NotIn of a node gone
        bad kept the pod off every declared pool at zero; found by a review of the cluster model)."""
        for is_in, value in self.fields:
            if (name == value) != is_in:
                return False
        return all(r.matches(labels) for r in self.requirements)

    def names(self) -> frozenset[str] | None:
        """The only node names this term can match (from ``metadata.name In``), None when not narrowed."""
        named = [value for is_in, value in self.fields if is_in]
        return frozenset(named[:1]) if len(set(named)) == 1 else (frozenset() if named else None)


def _term(raw: object) -> _Term | None:
    """One nodeSelectorTerm; None when it matches no node (empty, or any part the scheduler could not parse)."""
    budget.check()
    if not isinstance(raw, dict):
        return None
    expressions, fields = raw.get("matchExpressions"), raw.get("matchFields")
    if expressions is None:
        expressions = []
    if fields is None:
        fields = []
    if not isinstance(expressions, list) or not isinstance(fields, list) or not (expressions or fields):
        return None
    requirements = [_requirement(e) for e in expressions]
    field_reqs = [_field_requirement(f) for f in fields]
    if any(r is None for r in requirements) or any(f is None for f in field_reqs):
        return None
    return _Term(tuple(r for r in requirements if r), tuple(f for f in field_reqs if f))


@dataclass(frozen=True)
class _Rules:
    node_name: str | None
    selector: Mapping[str, str]
    terms: tuple[_Term, ...] | None
    """None: no required affinity; (): required affinity that matches no node."""
    tolerations: tuple[JSON, ...]
    volatile: frozenset[str]
    per_node: bool
    impossible: bool = False
    """The spec asks for something no node can satisfy (a rule the apiserver would reject)."""

    @staticmethod
    def of(spec: JSON, volatile: frozenset[str]) -> _Rules:
        impossible = False
        raw_name = spec.get("nodeName")
        node_name = raw_name if isinstance(raw_name, str) and raw_name else None
        if raw_name is not None and not isinstance(raw_name, str):
            impossible = True
        raw_selector = spec.get("nodeSelector")
        selector: dict[str, str] = {}
        if isinstance(raw_selector, dict):
            for k, v in raw_selector.items():
                if isinstance(k, str) and isinstance(v, str):
                    selector[k] = v
                else:
                    impossible = True  # a value that is not a string never equals a label
        elif raw_selector is not None:
            impossible = True
        terms: tuple[_Term, ...] | None = None
        affinity = spec.get("affinity")
        node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
        required = (
            node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
            if isinstance(node_affinity, dict)
            else None
        )
        if any(v is not None and not isinstance(v, dict) for v in (affinity, node_affinity, required)):
            impossible = True
        elif isinstance(required, dict):
            parsed = [_term(t) for t in as_list(required.get("nodeSelectorTerms"))]
            terms = tuple(t for t in parsed if t is not None)
        tolerations = tuple(t for t in as_list(spec.get("tolerations")) if isinstance(t, dict))
        per_node = (
            node_name is not None
            or any(k in volatile for k in selector)
            or any(t.fields or any(r.key in volatile for r in t.requirements) for t in terms or ())
        )
        return _Rules(node_name, selector, terms, tolerations, volatile, per_node, impossible)

    def _match(self, labels: Mapping[str, str], name: str | None) -> bool:
        for k, v in self.selector.items():
            if labels.get(k) != v:
                return False
        if self.terms is None:
            return True
        return any(t.matches(labels, name) for t in self.terms)

    def _names(self, group: NodeGroup) -> Iterable[str]:
        """The group's nodes worth checking one by one (narrowed by nodeName and matchFields ``In``)."""
        if self.node_name is not None:
            return (self.node_name,) if has_node(group, self.node_name) else ()
        if self.terms:
            narrowed = [t.names() for t in self.terms]
            if all(n is not None for n in narrowed):
                wanted = frozenset().union(*(n for n in narrowed if n is not None))
                return tuple(n for n in sorted(wanted) if has_node(group, n))
        return group.nodes

    def nodes_of(self, group: NodeGroup) -> tuple[str, ...] | None:
        """The group's nodes these rules allow; None when none. A declared group without nodes is judged on the
        labels its nodes will have (per-node labels unknown: absent)."""
        if not self.per_node or not group.nodes:
            if self.node_name is not None and not group.nodes:
                return None
            return group.nodes if self._match(group.labels, None) else None
        # Per-node rules: what the group's shared labels decide is decided once; only the volatile labels (and the
        # name) are looked at node by node.
        for k, v in self.selector.items():
            if k not in self.volatile and group.labels.get(k) != v:
                return None
        node_selector = [(k, v) for k, v in self.selector.items() if k in self.volatile]
        terms: list[tuple[tuple[_Requirement, ...], tuple[tuple[bool, str], ...]]] | None = None
        if self.terms is not None:
            terms = []
            for t in self.terms:
                if all(r.matches(group.labels) for r in t.requirements if r.key not in self.volatile):
                    terms.append((tuple(r for r in t.requirements if r.key in self.volatile), t.fields))
            if not terms:
                return None
        kept = []
        for n in self._names(group):
            budget.check()
            own = group.node_labels.get(n, {})
            if any(own.get(k) != v for k, v in node_selector):
                continue
            if terms is not None and not any(
                all((n == value) == is_in for is_in, value in fields) and all(r.matches(own) for r in reqs)
                for reqs, fields in terms
            ):
                continue
            kept.append(n)
        return tuple(kept) or None


def has_node(group: NodeGroup, name: str) -> bool:
    """``name`` is a node of ``group``."""
    return name in group.node_labels if group.node_labels else name in group.nodes


# ---------------------------------------------------------------------------------------------------------------
# Node objects and node-list files


@functools.cache
def _pool_annotation_keys() -> frozenset[str]:
    return frozenset(load_presets(("all",)).pool_annotations)


@functools.lru_cache(maxsize=1)
def _kubelet_patterns() -> tuple[tuple[re.Pattern[str], str], ...]:
    return tuple((re.compile(mark), p) for mark, p in load_presets(("all",)).kubelet_versions)


def _kubelet_provider(version: str) -> str:
    return next((p for pattern, p in _kubelet_patterns() if pattern.search(version)), "")


def same_node(held: Node, new: Node, timestamp_labels: frozenset[str]) -> bool:
    """Whether ``new`` tells nothing ``held`` does not, but for the values of ``timestamp_labels`` (which a labeller
    rewrites with the time on every run): a label of them added or removed is a change."""
    if held == new:
        return True
    if not timestamp_labels or held.labels.keys() != new.labels.keys():
        return False
    stamps = {k: held.labels[k] for k in timestamp_labels if k in held.labels}
    if not stamps:
        return False
    return replace(new, labels={**new.labels, **stamps}) == held


UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


def parse_node(obj: object) -> Node | None:
    """A Node object (as the API returns it) to a Node; None when it is not a usable Node.

    Only what the model reads is kept (labels, taints, extended allocatable resources, the annotations that name a
    pool), so a snapshot of 10,000 nodes stays a few MB: sources keep Nodes, not the API's objects."""
    if isinstance(obj, Node):
        return obj
    if not isinstance(obj, dict):
        return None
    meta = as_dict(obj.get("metadata"))
    name = as_str(meta.get("name"))
    if not name:
        return None
    labels = {k: v for k, v in as_dict(meta.get("labels")).items() if isinstance(k, str) and isinstance(v, str)}
    keep = _pool_annotation_keys()
    annotations = {k: v for k, v in as_dict(meta.get("annotations")).items() if k in keep and isinstance(v, str)}
    spec = as_dict(obj.get("spec"))
    taints = {
        Taint(t["key"], as_str(t.get("value")), as_str(t.get("effect")))
        for t in as_list(spec.get("taints"))
        if isinstance(t, dict) and isinstance(t.get("key"), str) and t.get("key")
    }
    if spec.get("unschedulable") is True:
        # kube-scheduler's NodeUnschedulable filter reads the field as this taint (the node lifecycle controller adds
        # it a moment after a cordon): a pod passes only by tolerating it
        taints.add(Taint(UNSCHEDULABLE_TAINT, "", "NoSchedule"))
    allocatable: dict[str, Decimal] = {}
    for key, value in as_dict(as_dict(obj.get("status")).get("allocatable")).items():
        if isinstance(key, str) and "/" in key:
            try:
                allocatable[key] = parse_quantity(value)
            except QuantityError:
                continue
    ordered = tuple(sorted(taints, key=lambda t: (t.key, t.effect, t.value)))
    kubelet = as_str(as_dict(as_dict(obj.get("status")).get("nodeInfo")).get("kubeletVersion"))
    return Node(name, labels, ordered, allocatable, annotations, _kubelet_provider(kubelet) if kubelet else "")


def nodes_from_document(doc: object) -> list[JSON]:
    """Node objects from a Node, a NodeList or a ``kind: List`` (as ``kubectl get nodes -o yaml`` prints)."""
    if not isinstance(doc, dict):
        return []
    if doc.get("kind") == "Node":
        return [doc]
    return [i for i in as_list(doc.get("items")) if isinstance(i, dict) and i.get("kind", "Node") == "Node"]


def read_node_file(path: str | Path) -> list[JSON]:
    """The Node objects of a file as ``kubectl get nodes -o yaml|json`` writes it (a Node, a NodeList or a
    ``kind: List``; several YAML documents allowed). Raises InputError saying what is wrong."""
    where = str(path)
    documents = numbered(read_documents(path), where)
    if not documents and where == "-":  # not "> -": standard input is piped, not written (a review's finding)
        raise InputError(
            "-: standard input held no node list (pipe one in: kubectl get nodes -o yaml | gpu-admission ... --nodes -)"
        )
    if not documents:
        raise InputError(f"{where}: the node list is empty (make one with: kubectl get nodes -o yaml > {where})")
    nodes: list[JSON] = []
    for at, doc in documents:
        if not isinstance(doc, dict):
            raise InputError(f"{at}: expected a Node, a NodeList or a List of Nodes (found {type(doc).__name__})")
        kind = doc.get("kind")
        if kind == "Node":
            items: list[Any] = [doc]
        elif kind in ("NodeList", "List") or (kind is None and "items" in doc):
            raw = doc.get("items")
            if raw is not None and not isinstance(raw, list):
                raise InputError(f"{at}: items must be a list of Nodes (found {type(raw).__name__})")
            items = raw or []
        else:
            raise InputError(f"{at}: expected a Node, a NodeList or a List of Nodes (found kind {kind!r})")
        for index, item in enumerate(items):
            label = at if item is doc else f"{at}: items[{index}]"
            item_kind = item.get("kind", "Node") if isinstance(item, dict) else type(item).__name__
            if item_kind != "Node":
                raise InputError(f"{label}: expected a Node (found {item_kind!r}); list only nodes: kubectl get nodes")
            if parse_node(item) is None:
                raise InputError(f"{label}: a Node needs metadata.name")
            nodes.append(item)
    return nodes


def cluster_from_file(path: str | Path, settings: Settings) -> StaticCluster:
    """A fixed cluster from a node-list file plus the pools declared in settings (``--nodes``)."""
    return StaticCluster(build_view(read_node_file(path), settings, source=f"node list {path}"))


# ---------------------------------------------------------------------------------------------------------------
# GPU facts from labels


def _int_label(labels: Mapping[str, str], key: str) -> int:
    value = parse_int64(labels.get(key))
    return value if value is not None and value > 0 else 0


DRIVER_LABELS = (
    (GFD + "cuda.driver-version.full",),
    (GFD + "cuda.driver-version.major", GFD + "cuda.driver-version.minor", GFD + "cuda.driver-version.revision"),
    (GFD + "cuda.driver.major", GFD + "cuda.driver.minor", GFD + "cuda.driver.rev"),
)
"""GPU feature discovery's driver version labels, newest first (NVIDIA/k8s-device-plugin ``internal/lm/``), as
``_driver_from_labels`` reads them: also what tells apart the groups of one pool that differ in their driver alone."""
CUDA_LABEL_PREFIXES = ("cuda.runtime-version", "cuda.runtime")
"""GFD's labels for the newest CUDA the driver supports (``<prefix>.major``, ``<prefix>.minor``): current first, then
the deprecated ones."""


def _driver_from_labels(labels: Mapping[str, str]) -> tuple[Version | None, str, str, str]:
    """(driver, its text, the label it came from, a note when a label is there but is not a version, e.g. Tegra's
    'unknown.unknown.unknown')."""
    candidates: list[tuple[str, str]] = []
    full = labels.get(GFD + "cuda.driver-version.full")
    if full is not None:
        candidates.append((full, GFD + "cuda.driver-version.full"))
    for prefix, rev_key, source in (
        ("cuda.driver-version", "revision", GFD + "cuda.driver-version.*"),
        ("cuda.driver", "rev", GFD + "cuda.driver.*"),
    ):
        major, minor = labels.get(f"{GFD}{prefix}.major"), labels.get(f"{GFD}{prefix}.minor")
        if major is not None or minor is not None:
            rev = labels.get(f"{GFD}{prefix}.{rev_key}", "")  # empty for a two-part driver (570.26)
            parts = (major or "?", minor or "?", *([rev] if rev else []))  # a part missing: no version made up
            candidates.append((".".join(parts), source))
    for text, source in candidates:
        version = parse_version(text)
        if version:
            return version, text.strip(), source, ""
    if candidates:
        text, source = candidates[0]
        hint = " (Tegra / Jetson: GFD cannot read the driver)" if "unknown" in text else ""
        return None, "", "", f"label {source} is {text!r}, not a driver version{hint}"
    return None, "", "", ""


def _cuda_from_labels(labels: Mapping[str, str]) -> tuple[Version | None, str]:
    for prefix in CUDA_LABEL_PREFIXES:
        major, minor = labels.get(f"{GFD}{prefix}.major"), labels.get(f"{GFD}{prefix}.minor")
        version = parse_version(f"{major}.{minor}") if major and minor else None
        if version:
            return version, f"{GFD}{prefix}.*"
    version = parse_version(labels.get(GFD + "cuda.runtime-version.full"))
    if version:
        return version[:2], GFD + "cuda.runtime-version.full"
    return None, ""


def _mig_profiles(labels: Mapping[str, str], allocatable: Mapping[str, Decimal]) -> dict[str, MigOffer]:
    """Mixed strategy: each ``nvidia.com/mig-<p>`` resource with allocatable > 0 (stale zeros linger after a
    reconfiguration, kubernetes#92396), with usable memory from ``nvidia.com/mig-<p>.memory``."""
    offers: dict[str, MigOffer] = {}
    for resource, amount in allocatable.items():
        if resource.startswith(MIG_RESOURCE_PREFIX) and amount >= 1:
            profile = resource[len(MIG_RESOURCE_PREFIX) :]
            offers[profile] = MigOffer(int(amount), _int_label(labels, f"{GFD}mig-{profile}.memory"))
    return dict(sorted(offers.items()))


def _single_profile(product: str) -> tuple[str, str]:
    """'NVIDIA-A100-SXM4-40GB-MIG-1g.5gb' -> ('NVIDIA-A100-SXM4-40GB', '1g.5gb')."""
    base, sep, profile = product.partition("-MIG-")
    return (base, profile) if sep else (product, "")


MIG_LAYOUT = re.compile(r"all-(?:[0-9]+g\.[0-9]+gb.*|balanced|enabled)")
"""nvidia.com/mig.config values of MIG Manager's own configs that enable MIG (its default config file)."""


def _mig_off(labels: Mapping[str, str], devices: int) -> bool:
    """The node's GPUs are whole GPUs though GFD's product names no MIG profile: not MIG-capable; or no layout
    being applied, and none asked of MIG Manager (nvidia.com/mig.config unset, or the GPU Operator's default
    all-disabled) or one device a GPU offered (a layout of another name that leaves MIG off: a custom-no-mig was
    read as MIG offering nothing, found by a review)."""
    if labels.get(GFD + "mig.capable") == "false":
        return True
    if labels.get(MIG_CONFIG_STATE_LABEL, "") in MIG_CHANGING_STATES:
        return False
    count = labels.get(GFD + "gpu.count", "")
    layout = labels.get(MIG_CONFIG_LABEL, "all-disabled")
    if layout == "all-disabled":
        return True
    # MIG Manager's own layouts name MIG (all-1g.10gb, all-7g.80gb: one device a GPU, all-balanced, all-enabled)
    return not MIG_LAYOUT.fullmatch(layout) and count.isdigit() and devices == int(count)


def _whole(amount: Decimal | None) -> int:
    return int(amount) if amount is not None and amount.is_finite() and amount >= 1 else 0


class _Builder:
    def __init__(self, settings: Settings) -> None:
        cs = settings.cluster
        self.settings = settings
        self.presets = load_presets(
            cs.providers,
            cs.pool_label_keys,
            [(t.key, t.value, t.effect) for t in settings.spot.extra_taints],
            settings.spot.extra_labels,
        )
        self.table: DriverTable = builtin_table().with_rows(settings.cuda.driver_table)
        self.volatile = frozenset(cs.volatile_labels)
        self.pools = cs.pools
        presets = self.presets
        self.read_keys = frozenset(
            {
                *presets.pool_labels,
                *(k for k, _, _ in presets.spot_labels),
                *(k for keys in presets.shown_by.values() for k in keys),
                *presets.gpu_label_keys,
                *(k for k, _ in presets.gpu_label_values),
                *presets.gpu_count_labels,
                *presets.gpu_maker_labels,
                *(k for labels in presets.gpu_node_labels.values() for k in labels),
                *(key for key, _ in presets.accelerator_labels.values()),
                *presets.resource_tags,
                *(k for pool in self.pools for k in pool.node_selector),
                INSTANCE_TYPE_LABEL,
                PLATFORM_LABEL,
            }
        )
        self.read_prefixes = (GFD, GKE_LABELS, *(f"{domain}/" for domain in sorted(presets.instance_label_domains)))

    def reads(self, key: str) -> bool:
        """Whether the webhook reads the label key off a group's labels, which is then never volatile: GFD's and
        GKE's labels, the presets' pool, spot and GPU labels (a Karpenter provider's instance labels among them),
        a declared pool's selector, the instance type (``ClusterView.joining``), the architecture."""
        return key in self.read_keys or key.startswith(self.read_prefixes)

    def declared_pool(self, labels: Mapping[str, str]) -> PoolSettings | None:
        for pool in self.pools:
            if pool.node_selector and all(labels.get(k) == v for k, v in pool.node_selector.items()):
                return pool
        return None

    def pool_name(
        self,
        node: Node,
        declared: PoolSettings | None,
        product: str,
        driver: Version | None,
        driver_text: str,
        strategy: str,
        profiles: Mapping[str, MigOffer],
    ) -> tuple[str, str]:
        """(pool name, what named it)."""
        if declared:
            return declared.name, "settings"
        for key in self.presets.pool_labels:
            if node.labels.get(key):
                return node.labels[key], f"label {key}"
        for key in self.presets.pool_annotations:
            if node.annotations.get(key):
                return node.annotations[key], f"annotation {key}"
        gpus = (_whole(node.allocatable.get(r)) for r in (GPU_RESOURCE, SHARED_GPU_RESOURCE))
        if not product and not profiles and not any(gpus):
            return "no-gpu", "no GPU"  # a GPU node without GPU feature discovery is "gpu/driver-unknown"
        parts = [product or "gpu", f"driver-{driver_text}" if driver else "driver-unknown"]
        if strategy != "none":
            parts.append("mig-" + "-".join([strategy, *profiles]))
        return "/".join(parts), "GPU product, driver and MIG layout"

    def is_spot(self, labels: Mapping[str, str], taints: Iterable[Taint]) -> bool:
        if any(labels.get(k) == v for k, v, _ in self.presets.spot_labels):
            return True
        return any(
            t.key == p.key and (p.value is None or p.value == t.value) for t in taints for p in self.presets.spot_taints
        )

    def group(self, members: list[Node]) -> NodeGroup:
        first = members[0]
        labels = {k: v for k, v in first.labels.items() if k not in self.volatile}
        declared = self.declared_pool(first.labels)
        notes: list[str] = []
        allocatable = dict(first.allocatable)

        product = labels.get(PRODUCT_LABEL, "")
        sharing = labels.get(GFD + "gpu.sharing-strategy", "")
        shared_hint = product.endswith(SHARED_SUFFIX) or allocatable.get(SHARED_GPU_RESOURCE, Decimal(0)) > 0
        if product.endswith(SHARED_SUFFIX):
            product = product[: -len(SHARED_SUFFIX)]
        if not sharing:
            sharing = GKE_SHARING.get(labels.get(GKE_SHARING_LABEL, ""), "")
        if not sharing:
            # GFD before v0.15 wrote no sharing-strategy label, and MPS came with that version: time-slicing.
            sharing = "time-slicing" if shared_hint else (declared.sharing if declared else "none")

        strategy = labels.get(GFD + "mig.strategy", "none")
        profiles = _mig_profiles(labels, allocatable)
        if first.labels.get(GKE_PARTITION_LABEL):
            strategy = "gke"
        elif strategy == "none" and declared and declared.mig_strategy != "none":
            strategy = declared.mig_strategy
        elif strategy == "none" and profiles:
            strategy = "mixed"  # the device plugin offers nvidia.com/mig-<profile> only in mixed mode; no GFD label
        if strategy == "single":
            product, profile = _single_profile(product)
            devices = _whole(allocatable.get(GPU_RESOURCE))
            if profile and devices:
                profiles = {profile: MigOffer(devices, _int_label(labels, GFD + "gpu.memory"))}
            elif not profile and labels.get(GFD + "mig.strategy") == "single" and _mig_off(labels, devices):
                # The GPU Operator's default strategy is single, written on every GPU node, MIG or not (a T4, an
                # A100 with MIG off): only the product's -MIG-<profile> says its GPUs are MIG devices; without it,
                # and with no MIG layout asked of MIG Manager, they are whole GPUs (read as MIG, the whole fallback
                # found none in a cluster of them; found by a review of real clusters). A declared single pool, or
                # a node given a layout whose product label is not rewritten yet, stays MIG.
                strategy = "none"
        elif strategy == "gke":
            devices = _whole(allocatable.get(GPU_RESOURCE))
            profile = first.labels.get(GKE_PARTITION_LABEL, "")
            if profile and devices:
                profiles = {profile: MigOffer(devices)}
        if not product and declared:
            product = declared.gpu_product
        mig_capable = labels.get(GFD + "mig.capable") == "true" or strategy != "none" or bool(profiles)

        state = labels.get(MIG_CONFIG_STATE_LABEL, "")
        if state in MIG_CHANGING_STATES and (profiles or strategy in ("mixed", "single")):
            target = labels.get(MIG_CONFIG_LABEL, "")
            notes.append(
                f"MIG layout is changing ({MIG_CONFIG_STATE_LABEL}={state}"
                + (f", to {target}" if target else "")
                + "): its MIG devices are not offered until MIG Manager reports success"
            )
            profiles = {}
            allocatable = {k: v for k, v in allocatable.items() if not k.startswith(MIG_RESOURCE_PREFIX)}
        elif state == "failed":
            notes.append(
                f"MIG Manager failed to apply {labels.get(MIG_CONFIG_LABEL, 'the layout')}: offers as reported"
            )

        driver, driver_text, driver_source, driver_note = _driver_from_labels(labels)
        if driver is None and declared and parse_version(declared.driver_version):
            driver, driver_source = parse_version(declared.driver_version), f"settings (pool {declared.name})"
            driver_text = declared.driver_version.strip()
        elif driver is None:
            if driver_note:
                notes.append(f"driver unknown: {driver_note}")
            elif labels.get(GKE_DRIVER_LABEL) or labels.get(GKE_ACCELERATOR_LABEL):
                notes.append(
                    "driver unknown: GKE runs no GPU Feature Discovery; declare driverVersion in cluster.pools"
                )
            elif product or profiles or allocatable.get(GPU_RESOURCE, Decimal(0)) > 0:
                notes.append("driver unknown: no nvidia.com/cuda.driver* label and no declared pool")
        cuda, cuda_source = _cuda_from_labels(labels)
        if cuda is None and driver is not None:
            cuda = self.table.cuda_for_driver(driver)
            cuda_source = f"driver {driver_text} via the CUDA/driver table" if cuda else ""

        gpu_count = _int_label(labels, GFD + "gpu.count") or (declared.gpu_count if declared else 0)
        if not gpu_count and strategy == "none" and sharing == "none":
            gpu_count = _whole(allocatable.get(GPU_RESOURCE))
        pool, pool_source = self.pool_name(first, declared, product, driver, driver_text, strategy, profiles)
        return NodeGroup(
            pool=pool,
            labels=labels,
            taints=first.taints,
            allocatable=allocatable,
            nodes=tuple(sorted(n.name for n in members)),
            node_labels={n.name: {k: v for k, v in n.labels.items() if k in self.volatile} for n in members},
            gpu_product=product,
            gpu_memory_mib=_int_label(labels, GFD + "gpu.memory") or (declared.gpu_memory_mib if declared else 0),
            gpu_count=gpu_count,
            driver=driver,
            driver_source=driver_source,
            driver_version_text=driver_text if driver else "",
            compat_wired=compat_wired(labels, driver_source),
            cuda=cuda,
            cuda_source=cuda_source,
            mig_strategy=strategy,
            mig_profiles=profiles,
            sharing=sharing,
            spot=self.is_spot(first.labels, first.taints) or bool(declared and declared.spot),
            mig_capable=mig_capable,
            mig_config=labels.get(MIG_CONFIG_LABEL, ""),
            mig_config_state=state,
            gpu_replicas=(
                (_int_label(labels, GFD + "gpu.replicas") or _int_label(labels, GKE_SHARED_CLIENTS_LABEL))
                if sharing != "none"
                else 0
            ),
            pool_source=pool_source,
            notes=tuple(notes),
        )

    def declared_group(
        self, pool: PoolSettings, shown: frozenset[str] = frozenset(), gfd_runs: Mapping[str, bool] | None = None
    ) -> NodeGroup:
        """A group for a declared pool that has no node now: what its nodes will look like (``shown``: the providers
        the cluster's nodes show, whose generic pool labels then name them too; ``gfd_runs``: whether GFD labels
        the GPU nodes of each provider, ``gfd_by_provider``)."""
        labels = {**certain_labels(pool, self.presets, shown), **pool.node_selector}
        allocatable: dict[str, Decimal] = {}
        count = pool.gpu_count or 1
        product = pool.gpu_product
        profiles = {p: MigOffer(n) for p, n in sorted(pool.mig_profiles.items()) if n > 0}
        if pool.mig_strategy == "mixed":
            allocatable.update({MIG_RESOURCE_PREFIX + p: Decimal(o.count) for p, o in profiles.items()})
            allocatable[GPU_RESOURCE] = Decimal(0)
        else:
            allocatable[GPU_RESOURCE] = Decimal(sum(o.count for o in profiles.values()) if profiles else count)
        # GFD's product label only where GFD runs: a declared single or mixed strategy is the GPU Operator's, but
        # GKE's own device plugin writes none (a GKE pool at zero took a pod selecting it, pinned the pod to it,
        # and its nodes never matched: found by a review of the cluster model)
        gfd = pool.mig_strategy in ("single", "mixed") or self._gfd_runs(pool, shown, gfd_runs or {})
        if pool.mig_strategy == "single" and len(profiles) == 1 and product:
            labels.setdefault(PRODUCT_LABEL, f"{product}-MIG-{next(iter(profiles))}")
        elif pool.mig_strategy == "gke" and len(profiles) == 1:
            labels.setdefault(GKE_PARTITION_LABEL, next(iter(profiles)))
        elif product and gfd:
            labels.setdefault(PRODUCT_LABEL, product)
        if pool.mig_strategy in ("mixed", "single"):
            labels.setdefault(GFD + "mig.strategy", pool.mig_strategy)
        declared = {Taint(t.key, t.value, t.effect) for t in pool.taints}
        spot = pool.spot or self.is_spot(labels, declared)
        # its nodes carry the spot taints of the provider its selector names where that provider taints every spot
        # node (AKS): taken as untainted, a pod was steered there without the toleration, and stayed Pending for good
        # (found by a review of the cluster model). One of undocumented value (OKE's) is tolerated by Exists.
        added = {
            Taint(t.key, t.value or "", t.effect)
            for t in (self.presets.tainted_spot_taints(pool.node_selector, shown) if spot else ())
            if not any(d.key == t.key and d.effect == t.effect for d in declared)
        }
        taints = tuple(sorted(declared | added, key=lambda t: (t.key, t.effect)))
        driver = parse_version(pool.driver_version)
        cuda = self.table.cuda_for_driver(driver) if driver else None
        notes = () if driver else (f"driver unknown: pool {pool.name} declares no driverVersion",)
        return NodeGroup(
            pool=pool.name,
            labels=labels,
            taints=taints,
            allocatable=allocatable,
            nodes=(),
            node_labels={},
            gpu_product=product,
            gpu_memory_mib=pool.gpu_memory_mib,
            gpu_count=pool.gpu_count,
            driver=driver,
            driver_source=f"settings (pool {pool.name})" if driver else "",
            # GFD where the GPU Operator, and its toolkit, run (``_gfd_runs``: as the provider's GPU nodes show; a GKE
            # pool of a cluster running it was taken as GKE's own plugin by its selector); else by its selector
            compat_wired=gfd or compat_wired(pool.node_selector, ""),
            driver_version_text=pool.driver_version.strip() if driver else "",
            cuda=cuda,
            cuda_source=f"driver {show_driver(driver)} via the CUDA/driver table" if cuda and driver else "",
            mig_strategy=pool.mig_strategy,
            mig_profiles=profiles,
            sharing=pool.sharing,
            spot=spot,
            declared=True,
            mig_capable=pool.mig_strategy != "none",
            pool_source="settings",
            counts_known=bool(pool.gpu_count) or (pool.mig_strategy != "none" and bool(profiles)),
            notes=notes,
        )

    def _gfd_runs(self, pool: PoolSettings, shown: frozenset[str], gfd_runs: Mapping[str, bool]) -> bool:
        """Whether GFD will label the nodes of a declared pool: as the GPU nodes of its provider (the one its selector
        names, else those the cluster shows) say where they all say one thing (``gfd_by_provider``), else by its
        selector (a GKE label and no nvidia.com/ one: GKE's own device plugin). By the selector alone, a pool of a
        GKE cluster running the GPU Operator lost the product its nodes carry, and one declared by the user's own
        label on a GKE cluster with no GFD was given it (found by a review of the cluster model)."""
        told = {gfd_runs[p] for p in self.presets.named_by(pool.node_selector, shown) or shown if p in gfd_runs}
        return told.pop() if len(told) == 1 else not gke_own_plugin(pool.node_selector)


def gfd_by_provider(nodes: Iterable[Node], presets: Presets, shown: frozenset[str]) -> dict[str, bool]:
    """Per provider whose GPU nodes all say it alike, whether they carry GFD's labels (the GPU Operator's) or none
    (GKE's own device plugin): what a declared pool of it at zero will carry (``_Builder._gfd_runs``). Worked out
    once per snapshot; a provider with no GPU node, or whose GPU nodes differ, is left out."""
    seen: dict[str, set[bool]] = {}
    for node in nodes:
        gfd = any(key.startswith(GFD) for key in node.labels)
        if (
            not gfd
            and GKE_ACCELERATOR_LABEL not in node.labels
            and not any(v > 0 for k, v in node.allocatable.items() if k.startswith(GPU_VENDOR_PREFIX))
        ):
            continue  # no GPU node
        for provider in presets.named_by(node.labels, shown) | ({node.provider} if node.provider else set()):
            seen.setdefault(provider, set()).add(gfd)
    return {p: next(iter(told)) for p, told in seen.items() if len(told) == 1}


def certain_labels(pool: PoolSettings, presets: Presets, shown: frozenset[str] = frozenset()) -> dict[str, str]:
    """The labels every node of a declared pool carries beyond its nodeSelector, which a pod may select on (many
    Helm charts' kubernetes.io/os: linux; GKE's documented cloud.google.com/gke-accelerator): the kubelet's OS labels
    (``NODE_OS_LABELS``), and of a provider the selector names (``Presets.named_by``; ``shown``: the providers the
    cluster's nodes show, whose generic pool labels then name them too) the labels it gives every GPU node
    (``Presets.gpu_node_labels``: AKS's kubernetes.azure.com/accelerator) and its accelerator label where the
    pool's gpuProduct is or names one accelerator type. Cluster Autoscaler's template node for the group carries
    them too. What a declaration cannot know (the CPU architecture, the zone, the instance type) stays absent: a pod
    that selects it is not sent to the pool on a guess. With its selector's labels alone, a pool at zero matched no
    such pod, which was refused where the pool ran its CUDA (found by a review of the cluster model)."""
    labels = dict(NODE_OS_LABELS)
    for provider in sorted(presets.named_by(pool.node_selector, shown)):
        labels.update(presets.gpu_node_labels.get(provider, {}))
        if provider in presets.accelerator_labels:
            key, by_product = presets.accelerator_labels[provider]
            names = _accelerator_names(pool.gpu_product, key, by_product)
            if len(names) == 1:
                labels[key] = next(iter(names))
    return labels


def _accelerator_names(product: str, key: str, by_product: Mapping[str, str]) -> frozenset[str]:
    """The accelerator types (of label ``key``) a declared gpuProduct names: itself where it is one; else the one
    providers.yaml gives the product, or those of the MIG GPU models that match it (mig-profiles.yaml's
    gke_accelerators, for GKE's label)."""
    if not product:
        return frozenset()
    models = load_table().models if key == GKE_ACCELERATOR_LABEL else ()
    if product in {*by_product.values(), *(a for m in models for a in m.gke_accelerators)}:
        return frozenset({product})
    if product in by_product:
        return frozenset({by_product[product]})
    return frozenset(a for m in models if m.matches(product) for a in m.gke_accelerators)


def build_view(
    node_objects: Iterable[object],
    settings: Settings,
    source: str = "node list",
    known: bool = True,
    synced: bool = True,
) -> ClusterView:
    """Fold Node objects and the pools declared in settings into a ClusterView (objects that are not usable Nodes
    are skipped). ``known``: False where no source describes the nodes (the declared pools, if any, then describe
    the cluster); ``synced``: False for a node source that has not listed the nodes yet, whose view is unknown,
    declared pools and all (judged against the declared pools alone, a pod whose CUDA only the nodes running now
    support was denied, and tolerations narrowed to the declared pools' taints: found by a review of day-2
    journeys)."""
    builder = _Builder(settings)
    nodes = [node for node in map(parse_node, node_objects) if node is not None]
    count = len(nodes)
    buckets = _buckets(nodes, builder)
    if len(buckets) > MANY_GROUPS and (own := _per_node_keys(nodes, builder)):
        builder.volatile |= own
        buckets = _buckets(nodes, builder)
    if len(buckets) > MANY_GROUPS and (splitting := _splitting_keys(buckets, builder)):
        builder.volatile |= splitting
        buckets = _buckets(nodes, builder)
    groups = [builder.group(members) for members in buckets.values()]
    shown = shown_providers(nodes, labelled_providers(nodes, groups, builder.presets), builder.presets)
    groups = _told_apart(groups, builder.presets, shown)
    # A declared pool is what its nodes will be until one of them is: a node of it that offers no GPU yet (joining:
    # no device plugin, no GFD labels; its MIG layout changing) leaves the declaration standing beside it. Matched by
    # its selector, never by a name another pool's label happens to carry.
    serving = {key[4] for key, g in zip(buckets, groups, strict=True) if key[4] is not None and _serves(g)}
    if synced and (declared := [p for p in builder.pools if p.name not in serving]):
        gfd_runs = gfd_by_provider(nodes, builder.presets, shown)
        groups += [builder.declared_group(p, shown, gfd_runs) for p in declared]
    groups.sort(key=lambda g: (g.pool, g.nodes))
    labelled = labelled_providers(nodes, groups, builder.presets)
    providers = shown_providers(nodes, labelled, builder.presets)
    return ClusterView(
        groups=tuple(groups),
        node_count=count,
        source=source,
        presets=builder.presets,
        extended_resource_toleration=_extended_resource_toleration(providers, builder),
        volatile_labels=builder.volatile,
        known=synced and (known or bool(groups)),
        providers=providers,
        labelled_providers=labelled,
        spot_now=any(g.spot for g in groups),
        gpu_spot_now=any(g.spot and g.has_gpu for g in groups),
        on_demand_keys=frozenset(key for g in groups if not g.spot for key in g.labels),
        gpu_pools=frozenset(g.pool for g in groups if g.has_gpu),
        gpu_instance_types=frozenset(
            (g.pool, kind) for g in groups if g.has_gpu and (kind := g.labels.get(INSTANCE_TYPE_LABEL))
        ),
    )


def shown_providers(nodes: Sequence[Node], labelled: frozenset[str], presets: Presets) -> frozenset[str]:
    """The providers (of the presets in force) the cluster shows: ``labelled`` (their pool or spot labels on a node
    or a declared pool, OKE's pool annotation on a node: ``labelled_providers``, worked out once), or an EKS or GKE
    kubelet version. The one place
    that says how a provider shows: the spot policy read only the labels, and took an OKE cluster with no
    preemptible node for k3s (found by a review of the spot policy)."""
    keys = presets.shown_by
    return labelled | frozenset(n.provider for n in nodes if n.provider in keys)


def labelled_providers(nodes: Sequence[Node], groups: Sequence[NodeGroup], presets: Presets) -> frozenset[str]:
    """The providers (of the presets in force) whose pool or spot labels a node or a declared pool carries, or whose
    pool annotation a node does (OKE's): not those shown by a kubelet version alone, whose nodes may carry none of
    the provider's labels (an EKS self-managed node group's spot nodes carry no capacityType: required, a pod stayed
    Pending for good; found by a review of the spot policy). Only by the keys only its nodes carry
    (``Presets.shown_by``): not a generic pool label such as agentpool."""
    keys = presets.shown_by
    carried = {k for g in groups for k in g.labels} | {k for n in nodes for k in n.annotations}
    return frozenset(name for name, names in keys.items() if not carried.isdisjoint(names))


def _extended_resource_toleration(providers: frozenset[str], builder: _Builder) -> bool:
    """``cluster.extendedResourceToleration``; auto: on where the cluster shows a provider whose API servers run the
    plugin (``Presets.plugin_providers``: its pool or spot labels on a node or a declared pool, OKE's pool
    annotation, an EKS or GKE kubelet version), or the settings name such providers. Taken on for a self-managed
    cluster (k3s), a pod was steered to nodes whose nvidia.com/gpu taint it does not tolerate, and stayed Pending
    (found by a review of the cluster model); an EKS self-managed node group carries no EKS label, only its
    kubelet's version."""
    setting = builder.settings.cluster.extended_resource_toleration
    if setting != "auto":
        return setting == "on"
    plugin = builder.presets.plugin_providers
    if "all" not in builder.settings.cluster.providers:
        return bool(plugin)
    return not plugin.isdisjoint(providers)


PROVIDER_MARK = "@"
"""Between a pool's label value and its provider, where two providers' pools are named alike (no label value
holds it)."""


def pool_label_value(pool: str) -> str:
    """The pool label's value a pool's name is made of (``_told_apart``): gpu@karpenter -> gpu."""
    return pool.partition(PROVIDER_MARK)[0]


def _told_apart(groups: list[NodeGroup], presets: Presets, shown: frozenset[str]) -> list[NodeGroup]:
    """Groups named alike by the pool labels of two providers (an EKS node group and a Karpenter NodePool both
    called gpu) get the provider after the name (gpu@eks, gpu@karpenter): taken for one pool, the on-demand and
    the spot half were one spot pool, and a message said a pod was supported by pool gpu and kept off pool gpu
    (found by a review of the cluster model). A generic pool label (AKS's bare agentpool, OVH's nodepool) names its
    provider only where the cluster's nodes show it (``shown``), else the label itself: a k3s cluster's own
    agentpool and nodepool pools were called gpu@aks and gpu@ovh (found by a review of the cluster model)."""
    provider = {
        k: name
        for name, keys in presets.node_label_keys.items()
        for k in keys
        if name in shown or k in presets.shown_by.get(name, ())
    }

    def source(g: NodeGroup) -> str:
        key = g.pool_source.removeprefix("label ")
        return provider.get(key, key) if g.pool_source.startswith("label ") else g.pool_source

    sources: dict[str, set[str]] = {}
    for g in groups:
        sources.setdefault(g.pool, set()).add(source(g))
    return [
        replace(g, pool=f"{g.pool}{PROVIDER_MARK}{source(g)}")
        if len(sources[g.pool]) > 1 and g.pool_source.startswith("label ")
        else g
        for g in groups
    ]


def _buckets(nodes: Iterable[Node], builder: _Builder) -> dict[Any, list[Node]]:
    """The nodes by what tells their groups apart: labels but the volatile ones, taints, allocatable, pool."""
    buckets: dict[Any, list[Node]] = {}
    for node in nodes:
        declared = builder.declared_pool(node.labels)
        key = (
            frozenset((k, v) for k, v in node.labels.items() if k not in builder.volatile),
            node.taints,
            frozenset(node.allocatable.items()),
            frozenset((k, node.annotations[k]) for k in builder.presets.pool_annotations if k in node.annotations),
            declared.name if declared else None,
        )
        buckets.setdefault(key, []).append(node)
    return buckets


MANY_GROUPS = 64
"""Past this many groups, labels whose value is each node's own are looked for (``_per_node_keys``), then those
that split the groups most (``_splitting_keys``)."""
PER_NODE_VALUES = 32
"""A label key with at least this many values, on at most two nodes each on average, is a node's own."""


def _per_node_keys(nodes: Sequence[Node], builder: _Builder) -> frozenset[str]:
    """Label keys whose value is each node's own, like the hostname (GKE's cloud.google.com/gce-topology-host on
    compact placement, k3s's k3s.io/hostname): they made a group of every node, and the policies' work grows with
    the groups (3,000 nodes of one pool took past the 1 s budget; found by a review of the cluster model). They are
    then volatile: a pod's rule that names one is still decided node by node. Never a key the webhook reads
    (``_Builder.reads``)."""
    values: dict[str, set[str]] = {}
    carried: dict[str, int] = {}
    for node in nodes:
        for k, v in node.labels.items():
            if k not in builder.volatile:
                values.setdefault(k, set()).add(v)
                carried[k] = carried.get(k, 0) + 1
    return frozenset(
        k
        for k, vs in values.items()
        if len(vs) >= PER_NODE_VALUES and 2 * len(vs) >= carried[k] and not builder.reads(k)
    )


def _splitting_keys(buckets: Mapping[Any, list[Node]], builder: _Builder) -> frozenset[str]:
    """Label keys that still split the groups past ``MANY_GROUPS`` once the per-node keys are volatile: on an EKS
    cluster of Karpenter nodes, topology.k8s.aws/network-node-layer-1, -2 and -3 (about 200, 60 and 20 values at
    9,000 nodes), with the zones and capacity blocks, made a group of nearly every node, and a pod of 5 GPU
    containers took 0.86 s of the 1 s budget (found by a review of the policies at scale). The rule: the keys that
    tell groups apart, but those the webhook reads (``_Builder.reads``), are made volatile one after the other, the
    key of the most values first (then by name), until the groups are ``MANY_GROUPS`` or fewer, or none is left.
    Not by what dropping each alone merges: each network layer alone merged nothing, the others still told the
    nodes apart. A pod's rule that names one is still decided node by node. Worked out on ``buckets`` (``_buckets``'
    keys), not on the nodes: each a row of what else tells it apart and its values of the keys; a key made volatile
    is a column dropped, and the rows left alike merge."""
    values: dict[str, set[str]] = {}
    carried: dict[str, int] = {}
    for labels, *_ in buckets:
        for k, v in labels:
            values.setdefault(k, set()).add(v)
            carried[k] = carried.get(k, 0) + 1
    ways = {k: len(vs) + (carried[k] < len(buckets)) for k, vs in values.items()}  # absent from some: one more
    keys = sorted((k for k, n in ways.items() if n > 1 and not builder.reads(k)), key=lambda k: (-ways[k], k))
    candidates = frozenset(keys)
    others: dict[Any, int] = {}
    rows: set[tuple[Any, ...]] = set()
    for labels, *rest in buckets:
        own = dict(labels)
        other = (frozenset((k, v) for k, v in labels if k not in candidates), *rest)
        rows.add((others.setdefault(other, len(others)), *(own.get(k) for k in keys)))
    dropped = 0
    while dropped < len(keys) and len(rows) > MANY_GROUPS:
        dropped += 1
        rows = {row[:1] + row[2:] for row in rows}
    return frozenset(keys[:dropped])


LEAVING_TAINTS: Mapping[str, str] = {
    UNSCHEDULABLE_TAINT: "cordoned",  # kubectl drain, a surge upgrade
    "node.kubernetes.io/not-ready": "not ready",  # the node lifecycle controller (kubernetes.io: taint-and-toleration)
    "node.kubernetes.io/unreachable": "unreachable",
    "node.kubernetes.io/network-unavailable": "without network",
    # the other node conditions' taints (kubernetes.io: taint-and-toleration, "Taint Nodes by Condition"), and the one
    # for a non-graceful node shutdown (kubernetes.io: node-shutdown); a refusal told the pod to tolerate disk
    # pressure, and a declared pool whose only node was under it vanished (found by a review of the whole change)
    "node.kubernetes.io/memory-pressure": "under memory pressure",
    "node.kubernetes.io/disk-pressure": "under disk pressure",
    "node.kubernetes.io/pid-pressure": "under PID pressure",
    "node.kubernetes.io/out-of-service": "out of service",
    "node.cloudprovider.kubernetes.io/uninitialized": "joining",  # the cloud controller has not set it up
    "node.cloudprovider.kubernetes.io/shutdown": "shut down",
    "ToBeDeletedByClusterAutoscaler": "being removed by Cluster Autoscaler",  # its scale-down (its FAQ)
    # Karpenter's (kubernetes-sigs/karpenter pkg/apis/v1/taints.go): v1's disrupted, v0.32-v0.37's (v1beta1)
    # karpenter.sh/disruption=disrupting:NoSchedule, which v1 still reads as its own (IsDisruptingTaint), and
    # unregistered:NoExecute, on a node until Karpenter has registered it
    "karpenter.sh/disrupted": "being removed by Karpenter",
    "karpenter.sh/disruption": "being removed by Karpenter",
    "karpenter.sh/unregistered": "joining",
}
"""Taints that say a node takes no new pod for now (joining, cordoned, failing, going away), not what it is; with
what each says of the node, in words."""
LEAVING_TOLERATIONS = tuple({"key": key, "operator": "Exists"} for key in LEAVING_TAINTS)
"""Tolerations of ``LEAVING_TAINTS``: only to ask what else keeps a pod off a pool (never written to a pod)."""
TOLERATES_ALL = {"operator": "Exists"}
"""A toleration of every taint (an empty key with Exists): what a gated pod (``spec.schedulingGates``) is judged
with, since what takes its gate away may add tolerations (Kueue: its ResourceFlavor's; ``gated_spec``)."""


def gated_spec(spec: JSON) -> JSON:
    """``spec`` as a pod's placement is judged: a gated one's (``spec.schedulingGates``) tolerating every taint."""
    if as_list(spec.get("schedulingGates")):
        return {**spec, "tolerations": [*as_list(spec.get("tolerations")), TOLERATES_ALL]}
    return spec


def device_spec(spec: JSON) -> JSON:
    """``spec`` as its pods are placed once the mig policy gives its gpu-memory or gpu-fraction ask an nvidia.com/
    device (a template's is left for each pod to convert): the GPU's taint tolerated, by ExtendedResourceToleration
    for nvidia.com/gpu, else by the mig policy itself. Judged without it, a workload was said to have each pod
    denied where its only pool that runs its CUDA carries that taint, and each pod was admitted there (a review)."""
    return {**spec, "tolerations": [*as_list(spec.get("tolerations")), GPU_TAINT_TOLERATION]}


def split_leaving(taints: Iterable[Taint]) -> tuple[list[Taint], str]:
    """``taints`` (those that keep a pod off a group: ``untolerated``) as advice gives them: the ones a pod may be
    told to tolerate, and what the ``LEAVING_TAINTS`` among them say of the nodes, in words ('cordoned', 'not ready
    and unreachable'; '' for none). Told to tolerate node.kubernetes.io/unschedulable, a user bypassed a drain, and
    one told to tolerate not-ready landed on a broken node; the pod waits for such nodes to take pods again (found by
    a review of the cluster model)."""
    taints = list(taints)
    keys = {t.key for t in taints}
    words = " and ".join(dict.fromkeys(w for key, w in LEAVING_TAINTS.items() if key in keys))
    return [t for t in taints if t.key not in LEAVING_TAINTS], words


def leaving(group: NodeGroup) -> bool:
    """The group's nodes take no new pod for now (a ``LEAVING_TAINTS`` taint that filters)."""
    return any(t.key in LEAVING_TAINTS and t.effect in ("NoSchedule", "NoExecute") for t in group.taints)


def _serves(group: NodeGroup) -> bool:
    """The group's nodes offer a GPU now, in a settled MIG layout, and take new pods: a declared pool whose only
    nodes are cordoned, not ready or going away is still what the autoscaler adds nodes to (before, it vanished
    with them, and a fraction it offers was denied: found by a review of the cluster model)."""
    return group.offers_gpu and not leaving(group) and group.mig_config_state not in MIG_CHANGING_STATES


MAX_LISTED = 6
"""Pools named in one sentence; the rest are counted."""
MIN_NAME = 8
"""The fewest characters of a pool's name that ``pool_names`` shows, its '…' included."""


def pool_names(
    groups: Iterable[NodeGroup], limit: int = MAX_LISTED, room: int | None = None, what: str = "pool"
) -> str:
    """'pool a' or 'pools a, b', or 'pools a, b, ... and 994 more' past ``limit`` (an annotation line per
    container: all of them together must stay far below the apiserver's 256 KiB for an object's annotations). In
    at most ``room`` characters where given (a warning's): fewer names, the rest counted; where not even the first
    name fits whole, it is cut at its end, the cut shown by '…' ('pool NVIDIA-GeForce-RT…', 'pools ml-prod-a1… and
    1 more'), never to fewer than MIN_NAME characters: a name cut without the '…' read as another pool's. Where not
    even that fits, the pools are counted ('3 pools'): a name past the room was cut by the warning's own end, with
    its count and what followed it (a review's). The count is the least it gives, room or not (room 0 measures
    it): a caller that leaves less makes the room from its own words (``mig._pool_warning`` cuts its tail in the
    middle), or its warning's cut takes what follows the pools. ``what`` names them ('spot pool': 'spot pools a,
    b', '3 spot pools')."""
    return names_listed(sorted({g.pool for g in groups}), limit, room, what)


def names_listed(names: Sequence[str], limit: int = MAX_LISTED, room: int | None = None, what: str = "pool") -> str:
    """``pool_names`` of the pools named ``names``, sorted and each once: a caller that keeps them per snapshot reads
    no group and sorts no name per request (thousands at 3,000 spot groups). At most ``limit`` names are joined."""
    if not names:
        return f"no {what}"
    head = f"{what} " if len(names) == 1 else f"{what}s "
    texts = [
        head + ", ".join(names[:count]) + (f" and {len(names) - count} more" if len(names) > count else "")
        for count in range(min(limit, len(names)), 0, -1)
    ]
    if room is None:
        return texts[0]
    for text in texts:
        if len(text) <= room:
            return text
    rest = text[len(head) + len(names[0]) :]  # the first name alone, cut to what is left of the room
    if room - len(head) - len(rest) >= MIN_NAME:
        return head + clipped(names[0], room - len(head) - len(rest)) + rest
    return f"{len(names)} {head.strip()}"


# ---------------------------------------------------------------------------------------------------------------
# The pools view (``gpu-admission pools``)


def _driver_cell(groups: Sequence[NodeGroup]) -> str:
    cells = []
    for g in groups:
        text = g.driver_text
        if g.driver and g.driver_source.startswith("settings"):
            text += " (config)"
        if text not in cells:
            cells.append(text)
    return ", ".join(cells)


def _mig_cell(pool: Pool) -> str:
    strategies = sorted({g.mig_strategy for g in pool.groups} - {"none"})
    if not strategies:
        return "-"
    counts = pool.mig_profile_counts()
    offered = ", ".join(f"{p} x{n}" for p, n in counts.items()) or "nothing offered now"
    return f"{'/'.join(strategies)}: {offered}"


def format_pools(view: ClusterView) -> str:
    """A readable table of the pools as the webhook sees them, with notes (unknown drivers, MIG changes)."""
    headers = ("POOL", "NODES", "GPU", "DRIVER", "CUDA", "MIG", "SPOT")
    rows: list[tuple[str, ...]] = []
    notes: list[str] = []
    for pool in view.pools:
        data = pool.as_json()
        size = str(data["nodes"]) if data["nodes"] or not any(g.declared for g in pool.groups) else "0 (declared)"
        sharing = sorted({g.sharing for g in pool.groups} - {"none"})
        gpu = str(data["gpu"] or "-") + (f" ({', '.join(sharing)})" if sharing else "")
        rows.append(
            (
                pool.name,
                size,
                gpu,
                _driver_cell(pool.groups) if any(g.has_gpu for g in pool.groups) else "-",
                str(data["cuda"] or "-"),
                _mig_cell(pool),
                "yes" if data["spot"] else "no",
            )
        )
        noted: dict[str, list[str]] = {}  # each note once a pool, with the nodes of every group it is of
        for g in pool.groups:
            for n in g.notes:
                noted.setdefault(n, []).extend(g.nodes or ("declared",))
        for n, nodes in noted.items():
            notes.append(f"  {pool.name} ({', '.join(nodes[:3])}{' ...' if len(nodes) > 3 else ''}): {n}")
    widths = [max(len(r[i]) for r in (headers, *rows)) for i in range(len(headers))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in (headers, *rows)]
    lines.append(f"{view.node_count} node{'s' if view.node_count != 1 else ''} from {view.source}")
    plugin = "on" if view.extended_resource_toleration else "off"
    lines.append(f"ExtendedResourceToleration: {plugin} (cluster.extendedResourceToleration)")
    if not view.known:
        lines.append("the cluster is not known yet: no node list has synced and no pool is declared")
    if notes:
        lines += ["notes:", *notes]
    return "\n".join(lines)

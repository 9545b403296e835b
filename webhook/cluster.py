"""The cluster as the policies see it: GPU node groups and pools, and where a pod could be scheduled.

Nodes come from a live watch (``webhook.watch``), a node-list file, or pools declared in settings. Whenever the node
set changes, nodes are folded into *groups*: nodes with the same labels (ignoring per-node ones such as the
hostname), taints and GPU resources look the same to every scheduling rule, so a request is evaluated against each
group once, and its cost does not grow with the number of nodes. Groups belong to *pools* (a provider's node pool,
a declared pool, or the nodes that share GPU product, driver and MIG layout).

Scheduling rules evaluated (k8s.io/component-helpers ``scheduling/corev1``): ``nodeName``, ``nodeSelector``,
required node affinity (terms ORed, expressions ANDed; In NotIn Exists DoesNotExist Gt Lt; ``matchFields`` on
``metadata.name``), NoSchedule/NoExecute taints against tolerations, the ExtendedResourceToleration admission
plugin, and whether the node offers the extended resources asked for.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Protocol

from webhook.config import PoolSettings, Settings
from webhook.drivers import DriverTable, Version, builtin_table, parse_version, show
from webhook.model import JSON, as_dict, as_list, as_str
from webhook.presets import Presets, load_presets
from webhook.quantity import QuantityError, parse_quantity

GFD = "nvidia.com/"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
GKE_PARTITION_LABEL = "cloud.google.com/gke-gpu-partition-size"


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


@dataclass(frozen=True)
class NodeGroup:
    """Nodes that every scheduling rule treats alike, with the GPU facts the policies need."""

    pool: str
    labels: Mapping[str, str]
    """Labels shared by every node of the group (volatile per-node labels removed)."""
    taints: tuple[Taint, ...]
    allocatable: Mapping[str, Decimal]
    nodes: tuple[str, ...]
    """Node names; empty for a pool declared in settings that has no node now (scaled to zero)."""
    node_labels: Mapping[str, Mapping[str, str]]
    """Per-node volatile labels (hostname ...), by node name."""
    gpu_product: str = ""
    gpu_memory_mib: int = 0
    gpu_count: int = 0
    driver: Version | None = None
    driver_source: str = ""
    """Where the driver version came from: a label name, or 'settings (pool <name>)'."""
    cuda: Version | None = None
    """Newest CUDA major.minor the driver supports."""
    cuda_source: str = ""
    mig_strategy: str = "none"
    mig_profiles: Mapping[str, MigOffer] = field(default_factory=dict)
    sharing: str = "none"
    spot: bool = False
    declared: bool = False

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu_product) or any(
            k == GPU_RESOURCE or k.startswith(MIG_RESOURCE_PREFIX) or k == GPU_RESOURCE + ".shared"
            for k, v in self.allocatable.items()
            if v > 0
        )

    @property
    def driver_text(self) -> str:
        return show(self.driver) if self.driver else "unknown"

    @property
    def cuda_text(self) -> str:
        return show(self.cuda) if self.cuda else "unknown"

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

    def as_json(self) -> JSON:
        gs = self.groups
        profiles: dict[str, int] = {}
        for g in gs:
            per_node = max(len(g.nodes), 1)
            for p, offer in g.mig_profiles.items():
                profiles[p] = profiles.get(p, 0) + offer.count * per_node
        drivers = sorted({g.driver for g in gs if g.driver})
        cudas = sorted({g.cuda for g in gs if g.cuda})
        products = sorted({g.gpu_product for g in gs if g.gpu_product})
        strategies = sorted({g.mig_strategy for g in gs})
        return {
            "name": self.name,
            "nodes": sum(len(g.nodes) for g in gs),
            "gpu": ", ".join(products) or None,
            "driver": ", ".join(show(d) for d in drivers) or None,
            "cuda": show(cudas[-1]) if cudas else None,
            "migStrategy": strategies[0] if len(strategies) == 1 else ", ".join(strategies),
            "migProfiles": dict(sorted(profiles.items())),
            "spot": any(g.spot for g in gs),
        }


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
        return frozenset(t for g in self.groups for t in g.taints)

    def label_values(self, key: str) -> frozenset[str]:
        return frozenset(g.labels[key] for g in self.groups if key in g.labels)

    def eligible(
        self, spec: JSON, resources: Mapping[str, Decimal] | Iterable[str] = (), gpu_only: bool = True
    ) -> list[Candidate]:
        """The groups (and nodes) a pod with this spec could be scheduled on.

        ``resources`` are the extended resources to check the nodes offer (with amounts when a mapping);
        ``gpu_only`` keeps only groups with GPUs.
        """
        wanted = dict(resources) if isinstance(resources, Mapping) else {r: Decimal(0) for r in resources}
        requested_extended = set(requested_resources(spec))
        rules = _Rules.of(spec, self.volatile_labels)
        out: list[Candidate] = []
        for group in self.groups:
            if gpu_only and not group.has_gpu:
                continue
            if not _offers(group, wanted):
                continue
            if not _tolerates(group.taints, rules.tolerations, requested_extended, self.extended_resource_toleration):
                continue
            nodes = rules.nodes_of(group)
            if nodes is None:
                continue
            out.append(Candidate(group, nodes))
        return out


class ClusterSource(Protocol):
    """Where a ClusterView comes from: a file, settings, or the live watch."""

    def snapshot(self) -> ClusterView: ...

    def ready(self) -> bool: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...


class StaticCluster:
    """A fixed snapshot (node-list file, declared pools, tests)."""

    def __init__(self, view: ClusterView) -> None:
        self._view = view

    def snapshot(self) -> ClusterView:
        return self._view

    def ready(self) -> bool:
        return True

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


# ---------------------------------------------------------------------------------------------------------------
# Requests


def requested_resources(spec: JSON) -> dict[str, Decimal]:
    """Effective extended-resource request of a pod: max(largest init container, sum of app containers plus
    restartable init containers), as the scheduler computes it (k8s.io/component-helpers resource helpers).
    Values that are not quantities are left out; limits stand in for absent requests (as Kubernetes defaults them).
    """
    app: dict[str, Decimal] = {}
    init_max: dict[str, Decimal] = {}
    sidecars: dict[str, Decimal] = {}
    for list_name in ("initContainers", "containers"):
        for c in as_list(spec.get(list_name)):
            if not isinstance(c, dict):
                continue
            amounts = container_resources(c)
            if list_name == "containers":
                target = app
            elif c.get("restartPolicy") == "Always":
                target = sidecars
            else:
                for k, v in amounts.items():
                    init_max[k] = max(init_max.get(k, Decimal(0)), v)
                continue
            for k, v in amounts.items():
                target[k] = target.get(k, Decimal(0)) + v
    total = {k: app.get(k, Decimal(0)) + sidecars.get(k, Decimal(0)) for k in set(app) | set(sidecars)}
    for k, v in init_max.items():
        total[k] = max(total.get(k, Decimal(0)), v)
    return {k: v for k, v in total.items() if v > 0}


def container_resources(container: JSON) -> dict[str, Decimal]:
    """A container's extended resources (limits, else requests), as Decimals; unparseable values skipped."""
    resources = as_dict(container.get("resources"))
    merged = dict(as_dict(resources.get("requests")))
    merged.update(as_dict(resources.get("limits")))
    out: dict[str, Decimal] = {}
    for name, value in merged.items():
        if not isinstance(name, str) or "/" not in name or name.startswith("kubernetes.io/"):
            continue
        try:
            out[name] = parse_quantity(value)
        except QuantityError:
            continue
    return out


def _offers(group: NodeGroup, wanted: Mapping[str, Decimal]) -> bool:
    for name, amount in wanted.items():
        have = group.allocatable.get(name, Decimal(0))
        if have <= 0 or (amount == amount.to_integral_value() and have < amount):
            return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# Taints and tolerations


def toleration_tolerates(tol: JSON, taint: Taint) -> bool:
    """v1.Toleration.ToleratesTaint: effect empty matches all; empty key with Exists matches all keys."""
    effect = tol.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = tol.get("key") or ""
    operator = tol.get("operator") or "Equal"
    if key != taint.key and not (key == "" and operator == "Exists"):
        return False
    if operator == "Exists":
        return True
    if operator == "Equal":
        return as_str(tol.get("value")) == taint.value
    return False


def _tolerates(taints: Sequence[Taint], tolerations: Sequence[JSON], requested: set[str], extended_rule: bool) -> bool:
    for taint in taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        if extended_rule and taint.effect == "NoSchedule" and taint.key in requested:
            continue  # ExtendedResourceToleration adds key=<resource>, operator=Exists, effect=NoSchedule
        if not any(toleration_tolerates(t, taint) for t in tolerations):
            return False
    return True


# ---------------------------------------------------------------------------------------------------------------
# Node selection rules


@dataclass(frozen=True)
class _Rules:
    node_name: str | None
    selector: Mapping[str, str]
    terms: tuple[JSON, ...] | None
    """None: no required affinity; () : required affinity that matches nothing."""
    tolerations: tuple[JSON, ...]
    volatile: frozenset[str]
    per_node: bool

    @staticmethod
    def of(spec: JSON, volatile: frozenset[str]) -> _Rules:
        node_name = spec.get("nodeName") if isinstance(spec.get("nodeName"), str) and spec.get("nodeName") else None
        selector = {str(k): v for k, v in as_dict(spec.get("nodeSelector")).items()}
        required = as_dict(
            as_dict(as_dict(spec.get("affinity")).get("nodeAffinity")).get(
                "requiredDuringSchedulingIgnoredDuringExecution"
            )
        )
        terms: tuple[JSON, ...] | None = None
        if required and isinstance(required.get("nodeSelectorTerms"), list):
            terms = tuple(t if isinstance(t, dict) else {} for t in required["nodeSelectorTerms"])
        tolerations = tuple(t for t in as_list(spec.get("tolerations")) if isinstance(t, dict))
        per_node = (
            node_name is not None
            or any(k in volatile for k in selector)
            or any(
                bool(as_list(t.get("matchFields")))
                or any(isinstance(e, dict) and e.get("key") in volatile for e in as_list(t.get("matchExpressions")))
                for t in terms or ()
            )
        )
        return _Rules(node_name, selector, terms, tolerations, volatile, per_node)

    def _match(self, labels: Mapping[str, str], name: str | None) -> bool:
        for k, v in self.selector.items():
            if labels.get(k) != v:
                return False
        if self.terms is None:
            return True
        return any(_term_matches(t, labels, name) for t in self.terms)

    def nodes_of(self, group: NodeGroup) -> tuple[str, ...] | None:
        """The group's nodes these rules allow; None when none."""
        if not self.per_node:
            return group.nodes if self._match(group.labels, None) else None
        if self.node_name is not None and self.node_name not in group.node_labels:
            return None
        names = (self.node_name,) if self.node_name is not None else group.nodes
        kept = tuple(n for n in names if self._match({**group.labels, **group.node_labels.get(n, {})}, n))
        return kept or None


def _term_matches(term: JSON, labels: Mapping[str, str], name: str | None) -> bool:
    expressions = as_list(term.get("matchExpressions"))
    fields = as_list(term.get("matchFields"))
    if not expressions and not fields:
        return False  # an empty term matches no node
    for e in expressions:
        if not isinstance(e, dict) or not _expression_matches(e, labels.get(as_str(e.get("key")))):
            return False
    for f in fields:
        if not isinstance(f, dict) or f.get("key") != "metadata.name":
            return False
        if name is None:
            return False  # a group without a concrete node cannot satisfy a field selector
        if not _expression_matches(f, name):
            return False
    return True


def _expression_matches(expr: JSON, value: str | None) -> bool:
    """One NodeSelectorRequirement; unknown operators and malformed values match nothing."""
    operator = expr.get("operator")
    values = [v for v in as_list(expr.get("values")) if isinstance(v, str)]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


# ---------------------------------------------------------------------------------------------------------------
# Building the view


def parse_node(obj: object) -> Node | None:
    """A Node object (as the API returns it) to a Node; None when it is not a usable Node."""
    if not isinstance(obj, dict):
        return None
    meta = as_dict(obj.get("metadata"))
    name = as_str(meta.get("name"))
    if not name:
        return None
    labels = {str(k): v for k, v in as_dict(meta.get("labels")).items() if isinstance(v, str)}
    annotations = {str(k): v for k, v in as_dict(meta.get("annotations")).items() if isinstance(v, str)}
    taints = tuple(
        Taint(as_str(t.get("key")), as_str(t.get("value")), as_str(t.get("effect")))
        for t in as_list(as_dict(obj.get("spec")).get("taints"))
        if isinstance(t, dict) and t.get("key")
    )
    allocatable: dict[str, Decimal] = {}
    for key, value in as_dict(as_dict(obj.get("status")).get("allocatable")).items():
        if isinstance(key, str) and "/" in key:
            try:
                allocatable[key] = parse_quantity(value)
            except QuantityError:
                continue
    return Node(name, labels, taints, allocatable, annotations)


def nodes_from_document(doc: object) -> list[JSON]:
    """Node objects from a Node, a NodeList or a ``kind: List`` (as ``kubectl get nodes -o yaml`` prints)."""
    if not isinstance(doc, dict):
        return []
    if doc.get("kind") == "Node":
        return [doc]
    return [i for i in as_list(doc.get("items")) if isinstance(i, dict) and i.get("kind", "Node") == "Node"]


def _int_label(labels: Mapping[str, str], key: str) -> int:
    try:
        return int(labels.get(key, "0"))
    except ValueError:
        return 0


def _driver_from_labels(labels: Mapping[str, str]) -> tuple[Version | None, str]:
    full = labels.get(GFD + "cuda.driver-version.full")
    version = parse_version(full)
    if version:
        return version, GFD + "cuda.driver-version.full"
    major, minor = labels.get(GFD + "cuda.driver.major"), labels.get(GFD + "cuda.driver.minor")
    if major and minor:
        rev = labels.get(GFD + "cuda.driver.rev", "")
        version = parse_version(".".join(p for p in (major, minor, rev) if p))
        if version:
            return version, GFD + "cuda.driver.*"
    return None, ""


def _cuda_from_labels(labels: Mapping[str, str]) -> tuple[Version | None, str]:
    for prefix in ("cuda.runtime-version", "cuda.runtime"):
        major, minor = labels.get(f"{GFD}{prefix}.major"), labels.get(f"{GFD}{prefix}.minor")
        version = parse_version(f"{major}.{minor}") if major and minor else None
        if version:
            return version, f"{GFD}{prefix}.*"
    version = parse_version(labels.get(GFD + "cuda.runtime-version.full"))
    if version:
        return version[:2], GFD + "cuda.runtime-version.full"
    return None, ""


def _mig_profiles(labels: Mapping[str, str], allocatable: Mapping[str, Decimal]) -> dict[str, MigOffer]:
    offers: dict[str, MigOffer] = {}
    for resource, amount in allocatable.items():
        if resource.startswith(MIG_RESOURCE_PREFIX) and amount > 0:
            profile = resource[len(MIG_RESOURCE_PREFIX) :]
            memory = _int_label(labels, f"{GFD}mig-{profile}.memory")
            offers[profile] = MigOffer(int(amount), memory)
    return offers


def _single_profile(product: str) -> tuple[str, str]:
    """'NVIDIA-A100-SXM4-40GB-MIG-1g.5gb' -> ('NVIDIA-A100-SXM4-40GB', '1g.5gb')."""
    base, sep, profile = product.partition("-MIG-")
    return (base, profile) if sep else (product, "")


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

    def declared_pool(self, labels: Mapping[str, str]) -> PoolSettings | None:
        for pool in self.pools:
            if pool.node_selector and all(labels.get(k) == v for k, v in pool.node_selector.items()):
                return pool
        return None

    def pool_name(
        self, node: Node, declared: PoolSettings | None, product: str, driver: Version | None, strategy: str
    ) -> str:
        if declared:
            return declared.name
        for key in self.presets.pool_labels:
            if node.labels.get(key):
                return node.labels[key]
        for key in self.presets.pool_annotations:
            if node.annotations.get(key):
                return node.annotations[key]
        if not product:
            return "no-gpu"
        parts = [product, f"driver-{show(driver)}" if driver else "driver-unknown"]
        if strategy != "none":
            parts.append(f"mig-{strategy}")
        return "/".join(parts)

    def is_spot(self, labels: Mapping[str, str], taints: Iterable[Taint]) -> bool:
        if any(labels.get(k) == v for k, v, _ in self.presets.spot_labels):
            return True
        spot_keys = {t.key for t in self.presets.spot_taints}
        return any(t.key in spot_keys for t in taints)

    def group(self, members: list[Node]) -> NodeGroup:
        first = members[0]
        labels = {k: v for k, v in first.labels.items() if k not in self.volatile}
        declared = self.declared_pool(first.labels)
        product = labels.get(GFD + "gpu.product", "") or (declared.gpu_product if declared else "")
        strategy = labels.get(GFD + "mig.strategy", "none")
        if declared and declared.mig_strategy != "none" and strategy == "none":
            strategy = declared.mig_strategy
        if first.labels.get(GKE_PARTITION_LABEL):
            strategy = "gke"
        profiles = _mig_profiles(first.labels, first.allocatable)
        if strategy == "single":
            product, profile = _single_profile(product)
            gpus = int(first.allocatable.get(GPU_RESOURCE, Decimal(0)))
            if profile and gpus > 0:
                profiles = {profile: MigOffer(gpus, _int_label(labels, GFD + "gpu.memory"))}
        elif strategy == "gke":
            gpus = int(first.allocatable.get(GPU_RESOURCE, Decimal(0)))
            profile = first.labels.get(GKE_PARTITION_LABEL, "")
            if profile and gpus > 0:
                profiles = {profile: MigOffer(gpus)}
        driver, driver_source = _driver_from_labels(first.labels)
        if driver is None and declared and parse_version(declared.driver_version):
            driver, driver_source = parse_version(declared.driver_version), f"settings (pool {declared.name})"
        cuda, cuda_source = _cuda_from_labels(first.labels)
        if cuda is None and driver is not None:
            cuda = self.table.cuda_for_driver(driver)
            cuda_source = f"driver {show(driver)} via the CUDA/driver table" if cuda else ""
        return NodeGroup(
            pool=self.pool_name(first, declared, product, driver, strategy),
            labels=labels,
            taints=first.taints,
            allocatable=first.allocatable,
            nodes=tuple(sorted(n.name for n in members)),
            node_labels={n.name: {k: v for k, v in n.labels.items() if k in self.volatile} for n in members},
            gpu_product=product,
            gpu_memory_mib=_int_label(labels, GFD + "gpu.memory") or (declared.gpu_memory_mib if declared else 0),
            gpu_count=_int_label(labels, GFD + "gpu.count") or (declared.gpu_count if declared else 0),
            driver=driver,
            driver_source=driver_source,
            cuda=cuda,
            cuda_source=cuda_source,
            mig_strategy=strategy,
            mig_profiles=profiles,
            sharing=labels.get(GFD + "gpu.sharing-strategy", declared.sharing if declared else "none"),
            spot=self.is_spot(first.labels, first.taints) or bool(declared and declared.spot),
        )

    def declared_group(self, pool: PoolSettings) -> NodeGroup:
        """A group for a declared pool that has no node now: what its nodes will look like."""
        labels = dict(pool.node_selector)
        allocatable: dict[str, Decimal] = {}
        count = pool.gpu_count or 1
        product = pool.gpu_product
        profiles = {p: MigOffer(n) for p, n in pool.mig_profiles.items() if n > 0}
        if pool.mig_strategy == "mixed":
            allocatable.update({MIG_RESOURCE_PREFIX + p: Decimal(o.count) for p, o in profiles.items()})
            allocatable[GPU_RESOURCE] = Decimal(0)
        else:
            allocatable[GPU_RESOURCE] = Decimal(sum(o.count for o in profiles.values()) if profiles else count)
        if pool.mig_strategy == "single" and len(profiles) == 1 and product:
            labels.setdefault(GFD + "gpu.product", f"{product}-MIG-{next(iter(profiles))}")
        elif pool.mig_strategy == "gke" and len(profiles) == 1:
            labels.setdefault(GKE_PARTITION_LABEL, next(iter(profiles)))
        elif product:
            labels.setdefault(GFD + "gpu.product", product)
        if pool.mig_strategy in ("mixed", "single"):
            labels.setdefault(GFD + "mig.strategy", pool.mig_strategy)
        taints = tuple(Taint(t.key, t.value, t.effect) for t in pool.taints)
        driver = parse_version(pool.driver_version)
        cuda = self.table.cuda_for_driver(driver) if driver else None
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
            cuda=cuda,
            cuda_source=f"driver {show(driver)} via the CUDA/driver table" if cuda and driver else "",
            mig_strategy=pool.mig_strategy,
            mig_profiles=profiles,
            sharing=pool.sharing,
            spot=pool.spot or self.is_spot(labels, taints),
            declared=True,
        )


def build_view(
    node_objects: Iterable[object], settings: Settings, source: str = "node list", known: bool = True
) -> ClusterView:
    """Fold Node objects and the pools declared in settings into a ClusterView."""
    builder = _Builder(settings)
    buckets: dict[Any, list[Node]] = {}
    count = 0
    for obj in node_objects:
        node = parse_node(obj)
        if node is None:
            continue
        count += 1
        key = (
            frozenset((k, v) for k, v in node.labels.items() if k not in builder.volatile),
            node.taints,
            frozenset(node.allocatable.items()),
            frozenset((k, node.annotations[k]) for k in builder.presets.pool_annotations if k in node.annotations),
        )
        buckets.setdefault(key, []).append(node)
    groups = [builder.group(members) for members in buckets.values()]
    seen_pools = {g.pool for g in groups}
    groups += [builder.declared_group(p) for p in builder.pools if p.name not in seen_pools]
    groups.sort(key=lambda g: (g.pool, g.nodes))
    return ClusterView(
        groups=tuple(groups),
        node_count=count,
        source=source,
        presets=builder.presets,
        extended_resource_toleration=settings.cluster.extended_resource_toleration,
        volatile_labels=builder.volatile,
        known=known or bool(groups),
    )

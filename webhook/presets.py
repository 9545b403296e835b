"""Provider presets (data: ``data/providers.yaml``): pool label keys, spot labels and taints, GPU taints."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

from webhook.errors import ConfigError

NVIDIA = "nvidia"
"""How a provider's label names NVIDIA as a GPU's maker (``Presets.gpu_maker_labels``)."""


@dataclass(frozen=True)
class TaintPreset:
    key: str
    value: str | None
    """None: the value is not documented; tolerate with operator Exists."""
    effect: str
    provider: str


@dataclass(frozen=True)
class Presets:
    """The presets in force: those of the configured providers, plus the user's own from settings."""

    pool_labels: tuple[str, ...]
    pool_annotations: tuple[str, ...]
    spot_labels: tuple[tuple[str, str, str], ...]
    """(key, value, provider)"""
    spot_taints: tuple[TaintPreset, ...]
    gpu_taints: Mapping[str, TaintPreset]
    node_label_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Per provider, the node label (and annotation) keys it names pools and spot nodes by (pool and spot labels,
    OKE's pool annotation), generic ones included: whose pool a group is."""
    shown_by: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Per provider, those of its ``node_label_keys`` that only its nodes carry: how a cluster's provider shows. Not a
    generic pool label (``generic_pool_labels`` in providers.yaml: AKS's bare agentpool, OVH's nodepool): a k3s
    cluster labelled agentpool counted as AKS and took ExtendedResourceToleration on (found by a review of the
    cluster model). A provider's own key listed in ``cluster.poolLabelKeys`` (tried first, to name pools) still shows
    it: an AKS cluster that listed kubernetes.azure.com/agentpool lost the plugin and its spot presets, and refused
    pods it ran (found by a review of that fix)."""
    plugin_providers: frozenset[str] = frozenset()
    """The providers whose API servers run ExtendedResourceToleration."""
    kubelet_versions: tuple[tuple[str, str], ...] = ()
    """(what a provider's kubelet version carries, the provider)."""
    pool_steered: frozenset[str] = frozenset()
    """Pool label keys of providers whose autoscaler makes a pool's nodes from the pool's own definition, which never
    carries GFD's labels (Karpenter's NodePools; Cluster Autoscaler's template node for a group at zero on GKE, EKS,
    AKS, ...: ``steer_by_pool`` in providers.yaml): the CUDA steering names such a pool by its label. Never a
    generic pool label (AKS's bare agentpool: ``generic_pool_labels``), nor a key the user lists in
    ``cluster.poolLabelKeys``: that names the user's own pools (a k3s cluster's nodepool or agentpool label, spelled
    as OVH's or AKS's), which the README keeps on GFD's terms."""
    runs_on: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Per provider that makes nodes from zero (Karpenter), the providers on whose clusters it runs (EKS): where one of
    them shows, its spot label is kept though no node carries it (a NodePool at zero shows nothing)."""
    spot_tainted: frozenset[str] = frozenset()
    """The providers that give every spot node their spot taints (AKS, OKE; GKE only where the pool was made so)."""
    accelerator_labels: Mapping[str, tuple[str, Mapping[str, str]]] = field(default_factory=dict)
    """Per provider that labels every GPU node with its accelerator type (GKE): the label, and the types of the GPUs
    without MIG by the product GFD names them (``accelerator_label``, ``accelerators`` in providers.yaml)."""
    gpu_node_labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """Per provider, the labels it gives every NVIDIA GPU node whatever its GPU (AKS's
    ``kubernetes.azure.com/accelerator: nvidia``; ``gpu_node_labels`` in providers.yaml)."""
    gpu_label_keys: frozenset[str] = frozenset()
    """Label keys a provider gives a node with GPUs, whatever the value, from its start, before the device plugin
    runs (Karpenter's ``karpenter.k8s.aws/instance-gpu-count``, GKE's accelerator label: ``gpu_label_keys`` and
    ``accelerator_label`` in providers.yaml). Read whatever ``cluster.providers`` names (``_node_keys``)."""
    gpu_label_values: frozenset[tuple[str, str]] = frozenset()
    """Labels (key, value) a provider gives a node with NVIDIA GPUs from its start, where the key alone says nothing
    (Karpenter on Azure's ``karpenter.azure.com/sku-gpu-manufacturer: nvidia``, its ``sku-gpu-count`` being on
    every node; AKS's ``kubernetes.azure.com/accelerator: nvidia``: ``gpu_label_values`` and ``gpu_node_labels`` in
    providers.yaml). Read whatever ``cluster.providers`` names (``_node_keys``)."""
    gpu_count_labels: frozenset[str] = frozenset()
    """Label keys a provider gives every node, whose value is how many GPUs of any maker its instance type has ("0"
    on a CPU type: Karpenter on Azure's ``karpenter.azure.com/sku-gpu-count``; ``gpu_count_labels`` in
    providers.yaml). Read whatever ``cluster.providers`` names (``_node_keys``)."""
    mixed_pool_labels: frozenset[str] = frozenset()
    """Pool label keys whose pools may hold CPU and GPU instance types alike (a Karpenter NodePool:
    ``mixed_pools`` in providers.yaml): that such a pool has GPU nodes says nothing of one node. Read whatever
    ``cluster.providers`` names (``_node_keys``)."""
    instance_label_domains: frozenset[str] = frozenset()
    """Label domains under which a provider of pools of CPU and GPU instance types alike (``mixed_pool_labels``)
    labels every node it makes with its instance type's facts, a GPU's among them (Karpenter on AWS's
    karpenter.k8s.aws, on Azure's karpenter.azure.com: ``instance_label_domains`` in providers.yaml): a node of such
    a pool is known to be a CPU node only where it carries one (another provider's, Cluster API's, labels no GPU).
    Read whatever ``cluster.providers`` names."""
    resource_tags: Mapping[str, str] = field(default_factory=dict)
    """Per pool label key, the prefix of the tag that gives Cluster Autoscaler's template node of such a group at zero
    an extended resource (EKS's ASG tag ``k8s.io/cluster-autoscaler/node-template/resources/<name>``:
    ``resource_tag`` in providers.yaml)."""
    gpu_maker_labels: frozenset[str] = frozenset()
    """Label keys a provider gives a GPU node from its start whose value names its GPU's maker (Karpenter on AWS's
    ``karpenter.k8s.aws/instance-gpu-manufacturer``: ``gpu_maker_labels`` in providers.yaml): a node where one names
    another maker than NVIDIA (``amd``) has no GPU an NVIDIA device plugin will offer. Read whatever
    ``cluster.providers`` names."""

    def gpu_labelled(self, labels: Mapping[str, str]) -> bool:
        """Whether a node's labels say it has GPUs before its device plugin runs (``gpu_label_keys``,
        ``gpu_label_values``: AKS's accelerator, or its legacy one, among them)."""
        if self.other_maker(labels):
            return False  # another maker's GPUs (an AMD node of Karpenter on AWS): was taken for NVIDIA's, joining
        return not self.gpu_label_keys.isdisjoint(labels) or any(labels.get(k) == v for k, v in self.gpu_label_values)

    def other_maker(self, labels: Mapping[str, str]) -> tuple[str, str] | None:
        """The label (key, value) by which a node's provider says its GPUs are another maker's than NVIDIA
        (``gpu_maker_labels``: ``karpenter.k8s.aws/instance-gpu-manufacturer: amd``), or None."""
        for k in sorted(self.gpu_maker_labels & labels.keys()):
            if labels[k].strip().lower() not in (NVIDIA, ""):
                return k, labels[k]
        return None

    def named_by(self, keys: Collection[str], shown: Collection[str] = ()) -> frozenset[str]:
        """The providers a declared pool's nodeSelector of ``keys`` names by a label only their nodes carry
        (``shown_by``: AKS's kubernetes.azure.com/agentpool, not the bare agentpool a k3s cluster's own nodes may
        carry too), or, of the providers the cluster's nodes show (``shown``), by any of their keys: an AKS spot pool
        declared by its legacy agentpool label was taken as untainted on an AKS cluster (found by a review)."""
        own = frozenset(p for p, names in self.shown_by.items() if any(k in names for k in keys))
        return own | frozenset(p for p in shown if any(k in self.node_label_keys.get(p, ()) for k in keys))

    def spotting(self, shown: Collection[str]) -> frozenset[str]:
        """Those of the ``shown`` providers that make spot nodes (a spot label or taint of theirs is known)."""
        makers = {p for _, _, p in self.spot_labels} | {t.provider for t in self.spot_taints}
        return frozenset(p for p in shown if p in makers)

    def tainted_spot_taints(self, keys: Collection[str], shown: Collection[str] = ()) -> tuple[TaintPreset, ...]:
        """The spot taints of the providers that give every spot node theirs (``spot_tainted``: AKS, OKE) and that a
        declared pool's nodeSelector of ``keys`` names (``named_by``): what the nodes of such a pool, spot, carry."""
        named = self.named_by(keys, shown)
        if not named and (spotting := self.spotting(shown)) and spotting <= self.spot_tainted:
            # a pool the user's own label selects, on a cluster whose every provider that makes spot nodes taints
            # them all (AKS, OKE: OKE's pools are an annotation, so a custom label is the usual way to declare one):
            # taken as untainted, a pod was steered there alone and stayed Pending (found by a review)
            named = spotting
        named &= self.spot_tainted
        return tuple(t for t in self.spot_taints if t.provider in named)


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    text = resources.files("webhook.data").joinpath("providers.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return data


def known_providers() -> tuple[str, ...]:
    return tuple(_raw())


def check_providers(names: Sequence[str]) -> None:
    """Raise ConfigError naming the providers ``cluster.providers`` gives that have no presets (nor are ``all``).
    Run when the settings load: met only by the cluster view each worker builds at boot, a typo (coreweav) passed
    ``gpu-admission check-config`` and the chart's hook, and every worker then failed to boot behind the webhook
    configurations (found by a review)."""
    if unknown := [n for n in names if n != "all" and n not in _raw()]:
        raise ConfigError(
            f"cluster.providers: unknown provider {', '.join(map(repr, unknown))}: give those whose presets the"
            f" webhook has (all, {', '.join(_raw())})"
        )


def gpu_taint_preset_names() -> frozenset[str]:
    """The names ``spot.gpuTaintPresets`` may give: every provider's GPU taint presets."""
    return frozenset(name for entry in _raw().values() for name in (entry or {}).get("gpu_taints", {}))


def _own_pool_labels(entry: Mapping[str, Any]) -> list[str]:
    """A provider's pool labels that only its nodes carry: not a generic name like AKS's bare agentpool, which other
    clusters' nodes carry too (``generic_pool_labels``)."""
    generic = entry.get("generic_pool_labels", ())
    return [k for k in entry.get("pool_labels", ()) if k not in generic]


def _gpu_label_keys(entry: Mapping[str, Any]) -> list[str]:
    """The label keys a provider gives a GPU node whatever the value: its ``gpu_label_keys`` and its accelerator
    label (GKE's ``cloud.google.com/gke-accelerator``)."""
    return [*entry.get("gpu_label_keys", ()), *([entry["accelerator_label"]] if entry.get("accelerator_label") else [])]


def _node_keys(name: str, names: Collection[str], keys: Iterable[str]) -> list[str]:
    """Of provider ``name``'s label keys that say what a node is (a GPU node from its start, its GPU count, a pool
    that holds CPU and GPU instance types alike), those read: every one, whatever ``cluster.providers`` names
    (``names``), since such a label means the same on any cluster. An AKS cluster that named aks alone took its node
    auto-provisioning's (Karpenter on Azure's) NVIDIA and AMD nodes, joining, for CPU nodes, and an EKS Auto Mode
    cluster that named eks alone its GPU nodes (found by reviews). But an unprefixed key (AKS's legacy accelerator)
    is the user's own off its provider's clusters (kubernetes.io, Labels and Selectors; ``generic_pool_labels``):
    read only where its provider is named."""
    return [k for k in keys if name in names or "/" in k]


def load_presets(
    providers: Sequence[str] = ("all",),
    extra_pool_labels: Sequence[str] = (),
    extra_spot_taints: Sequence[tuple[str, str, str]] = (),
    extra_spot_labels: Mapping[str, str] | None = None,
) -> Presets:
    raw = _raw()
    check_providers(providers)
    names = list(raw) if "all" in providers else list(providers)
    pool_labels: list[str] = list(extra_pool_labels)
    pool_annotations: list[str] = []
    spot_labels: list[tuple[str, str, str]] = []
    spot_taints: list[TaintPreset] = [TaintPreset(k, v or None, e, "settings") for k, v, e in extra_spot_taints]
    gpu_taints: dict[str, TaintPreset] = {}
    label_keys: dict[str, tuple[str, ...]] = {}
    shown_by: dict[str, tuple[str, ...]] = {}
    for name in names:
        entry = raw[name] or {}
        label_keys[name] = (
            *entry.get("pool_labels", []),
            *entry.get("spot_labels", {}),
            *entry.get("pool_annotations", []),
        )
        shown_by[name] = (*_own_pool_labels(entry), *entry.get("spot_labels", {}), *entry.get("pool_annotations", []))
        pool_labels += [k for k in entry.get("pool_labels", []) if k not in pool_labels]
        pool_annotations += entry.get("pool_annotations", [])
        spot_labels += [(k, str(v), name) for k, v in entry.get("spot_labels", {}).items()]
        spot_taints += [
            TaintPreset(t["key"], None if t.get("value") is None else str(t["value"]), t["effect"], name)
            for t in entry.get("spot_taints", [])
        ]
        for preset, t in entry.get("gpu_taints", {}).items():
            gpu_taints[preset] = TaintPreset(t["key"], t.get("value"), t["effect"], name)
    spot_labels += [(k, v, "settings") for k, v in (extra_spot_labels or {}).items()]
    return Presets(
        tuple(pool_labels),
        tuple(pool_annotations),
        tuple(spot_labels),
        tuple(spot_taints),
        gpu_taints,
        label_keys,
        shown_by,
        frozenset(n for n in names if (raw[n] or {}).get("extended_resource_toleration")),
        tuple((mark, n) for n in names for mark in (raw[n] or {}).get("kubelet_versions", ())),
        frozenset(k for n in names if (raw[n] or {}).get("steer_by_pool") for k in _own_pool_labels(raw[n]))
        - set(extra_pool_labels),
        {n: frozenset(raw[n]["runs_on"]) for n in names if (raw[n] or {}).get("runs_on")},
        frozenset(n for n in names if (raw[n] or {}).get("spot_tainted")),
        {
            n: (raw[n]["accelerator_label"], {str(k): str(v) for k, v in (raw[n].get("accelerators") or {}).items()})
            for n in names
            if (raw[n] or {}).get("accelerator_label")
        },
        {
            n: {str(k): str(v) for k, v in raw[n]["gpu_node_labels"].items()}
            for n in names
            if (raw[n] or {}).get("gpu_node_labels")
        },
        frozenset(k for n, e in raw.items() for k in _node_keys(n, names, _gpu_label_keys(e or {}))),
        frozenset(
            (k, str(values[k]))
            for n, e in raw.items()
            for values in ((e or {}).get("gpu_label_values") or {}, (e or {}).get("gpu_node_labels") or {})
            for k in _node_keys(n, names, values)
        ),
        frozenset(k for n, e in raw.items() for k in _node_keys(n, names, (e or {}).get("gpu_count_labels", ()))),
        frozenset(
            k for n, e in raw.items() if (e or {}).get("mixed_pools") for k in _node_keys(n, names, _own_pool_labels(e))
        ),
        frozenset(d for e in raw.values() for d in (e or {}).get("instance_label_domains", ())),
        {
            k: str(raw[n]["resource_tag"])
            for n in names
            if (raw[n] or {}).get("resource_tag")
            for k in _own_pool_labels(raw[n])
        },
        frozenset(k for n, e in raw.items() for k in _node_keys(n, names, (e or {}).get("gpu_maker_labels", ()))),
    )

"""One typed settings object, loaded from a YAML file and/or the environment and validated at start.

Every area has its own frozen dataclass with a docstring per field. Keys may be written in camelCase (as Helm values
are) or snake_case. Unknown keys and mistyped values are errors that name the key, e.g.
``cuda.mode: must be one of enforce, warn, off (got 'block')``.

Environment overrides: ``GPU_ADMISSION_<SECTION>__<FIELD>=value`` for scalar fields, e.g.
``GPU_ADMISSION_CUDA__MODE=warn``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin, get_type_hints

import yaml

from webhook.drivers import parse_version
from webhook.errors import ConfigError
from webhook.mig_profiles import parse_name
from webhook.model import is_label_value, is_qualified_name
from webhook.presets import check_providers, gpu_taint_preset_names, known_providers

Mode = Literal["enforce", "warn", "off"]
Effect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


class _Unplaced(ConfigError):
    """An error of a value that does not know where it stands (a taint: in pools and in spot); ``build`` names it."""


@dataclass(frozen=True)
class TaintSpec:
    """A taint as it stands on nodes: ``key[=value]:effect``."""

    key: str
    value: str = ""
    effect: Effect = "NoSchedule"

    def __post_init__(self) -> None:
        # an empty key tolerates every taint of the effect; a key the API refuses fails every pod it is written into
        if not is_qualified_name(self.key):
            raise _Unplaced(
                f"taint key {self.key!r} is not a taint key: [prefix/]name, the name 1 to 63 letters, digits, '-', '_'"
                " or '.' (e.g. cloud.example.com/spot); a toleration of an empty key would tolerate every taint"
            )
        if not is_label_value(self.value):
            raise _Unplaced(f"taint {self.key}: value {self.value!r} is not a label value")


POOL_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
"""A declared pool's name: a label value, as the pools of nodes are named (a node pool label's value)."""


def _node_labels(labels: Mapping[str, str], where: str, effect: str) -> None:
    """Raise naming the first of ``labels`` no node can carry, and what that would do (``effect``)."""
    for key, value in labels.items():
        if not is_qualified_name(key) or not is_label_value(value):
            raise ConfigError(
                f"{where} {key}: {value!r} is not a node label (a key [prefix/]name and a value of up to 63 letters,"
                f" digits, '-', '_' or '.'): no node carries it, and {effect}"
            )


@dataclass(frozen=True)
class PoolSettings:
    """A node pool declared in configuration, for pools that scale to zero or carry no GFD labels (GKE)."""

    name: str = field(metadata={"schema": {"pattern": f"^{POOL_NAME.pattern}$"}})
    """The pool's name, as it shows in messages and in ``gpu-admission pools``: a label value."""
    node_selector: dict[str, str] = field(metadata={"schema": {"minProperties": 1}})
    """Node labels that select the pool's nodes (and that steering and spot affinity use); required, and not
    empty: a pool no node can match would take pods that then land on other nodes."""
    taints: list[TaintSpec] = field(default_factory=list)
    """Taints the pool's nodes carry."""
    gpu_product: str = ""
    """GPU product as GFD names it, e.g. NVIDIA-A100-SXM4-80GB."""
    gpu_memory_mib: int = 0
    """Memory of one GPU in MiB (0: unknown)."""
    gpu_count: int = 0
    """GPUs per node."""
    driver_version: str = ""
    """NVIDIA driver version on the pool's nodes, e.g. 550.54.15 (needed on GKE, which runs no GFD)."""
    mig_strategy: Literal["none", "single", "mixed", "gke"] = "none"
    """How MIG devices are exposed: none, single, mixed (NVIDIA device plugin) or gke (partition-size label)."""
    mig_profiles: dict[str, int] = field(default_factory=dict)
    """MIG profiles offered per node and how many, e.g. {3g.40gb: 2}."""
    sharing: Literal["none", "time-slicing", "mps"] = "none"
    """GPU sharing strategy (time-slicing or MPS replicas)."""
    spot: bool = False
    """The pool is spot / preemptible capacity."""

    def __post_init__(self) -> None:
        if not POOL_NAME.fullmatch(self.name):
            raise ConfigError(
                f"cluster.pools: pool name {self.name!r} is not a label value: 1 to 63 letters, digits, '-', '_' or"
                " '.', beginning and ending with a letter or digit (the pools its nodes show are named by a label;"
                " the annotations the webhook writes name pools in these words, and read them back)"
            )
        if not self.node_selector:
            raise ConfigError(
                f"cluster.pools: pool {self.name!r} has no nodeSelector: give the node labels that select its nodes"
                " (e.g. {cloud.google.com/gke-nodepool: <pool>}); a pool that selects no node would be offered to"
                " pods that then run elsewhere"
            )
        where = f"cluster.pools: pool {self.name!r}"
        _node_labels(self.node_selector, f"{where}: nodeSelector", "pods steered to the pool would match no node")
        if self.driver_version and parse_version(self.driver_version) is None:
            raise ConfigError(
                f"{where}: driverVersion {self.driver_version!r} is not a driver version (e.g. 550.54.15, as"
                " nvidia-smi shows it)"
            )
        for name in ("gpu_count", "gpu_memory_mib"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{where}: {_camel(name)} {getattr(self, name)} is below 0")
        # nvidia-smi writes a variant 1g.10gb+me, the device plugin's resource and GFD's label 1g.10gb.me ('+' is
        # no character of a resource name or a label value): the pool offers it as the plugin names it
        object.__setattr__(self, "mig_profiles", {k.replace("+", "."): v for k, v in self.mig_profiles.items()})
        for profile, count in self.mig_profiles.items():
            if parse_name(profile) is None or count < 0:
                raise ConfigError(
                    f"{where}: migProfiles {profile}: {count}: give a MIG profile as nvidia-smi names it (e.g."
                    " 3g.40gb, 1g.10gb+me or 1g.10gb.me) and how many a node offers (0 or more)"
                )
        from webhook.presets import load_presets  # the providers' data, not a setting

        if annotated := sorted(set(self.node_selector) & set(load_presets(("all",)).pool_annotations)):
            raise ConfigError(
                f"{where}: nodeSelector key {annotated[0]} is a node annotation (OKE names its node pools so), not a"
                " label: no nodeSelector can match it, and pods steered to the pool would match no node. Give the"
                " pool's nodes a label (on OKE, the node pool's initial node labels) and select by it"
            )
        if self.mig_strategy in ("single", "gke") and len(self.mig_profiles) > 1:
            raise ConfigError(
                f"{where} has migStrategy {self.mig_strategy} and {len(self.mig_profiles)} migProfiles: every GPU of"
                " such a node carries one profile (a GKE node pool has one partition size); give one, or declare"
                " migStrategy mixed"
            )
        if self.mig_strategy == "single" and self.mig_profiles and not self.gpu_product:
            raise ConfigError(
                f"{where} has migStrategy single and no gpuProduct: the pods are sent to its nodes by the product"
                " label <gpuProduct>-MIG-<profile> (e.g. gpuProduct: NVIDIA-A100-SXM4-40GB)"
            )
        if self.gpu_product and not is_label_value(self.gpu_product):
            raise ConfigError(
                f"{where}: gpuProduct {self.gpu_product!r} is not GFD's label value (letters, digits, '-', '_' and '.',"
                " up to 63: NVIDIA-A100-SXM4-80GB, not nvidia-smi's 'NVIDIA A100-SXM4-80GB'): pods steered by it"
                " would be refused by the apiserver"
            )
        for profile in self.mig_profiles if self.mig_strategy == "single" else ():
            if not is_label_value(product := f"{self.gpu_product}-MIG-{profile}"):
                raise ConfigError(
                    f"{where}: gpuProduct {self.gpu_product!r} with migProfiles {profile} makes the product label"
                    f" {product} ({len(product)} characters), past a label value's 63, which the apiserver refuses"
                    " in a nodeSelector; give gpuProduct as the pool's MIG nodes show it in nvidia.com/gpu.product"
                    " (without its -MIG- part)"
                )


@dataclass(frozen=True)
class ExemptionSettings:
    """Who is never reviewed. Exemptions come only from configuration, never from the pod itself."""

    namespaces: list[str] = field(default_factory=lambda: ["kube-system", "kube-node-lease", "kube-public"])
    """Namespaces whose objects pass untouched."""
    users: list[str] = field(default_factory=list)
    """User names (request userInfo.username) whose requests pass untouched."""
    groups: list[str] = field(default_factory=list)
    """Groups (request userInfo.groups) whose requests pass untouched."""
    allow_opt_out_label: bool = False
    """Honour the label gpu-admission.io/ignore=true on the object itself."""


@dataclass(frozen=True)
class ClusterSettings:
    """How the cluster is seen: node sources, pool identity, declared pools."""

    pools: list[PoolSettings] = field(default_factory=list)
    """Pools declared here; live or listed nodes that match a pool's nodeSelector add to and refine it."""
    providers: list[str] = field(
        default_factory=lambda: ["all"], metadata={"schema": {"items": {"enum": ["all", *known_providers()]}}}
    )
    """Provider presets to use for pool labels and spot taints/labels (gke, eks, karpenter, aks, oke, ...; all)."""
    pool_label_keys: list[str] = field(default_factory=list)
    """Extra node label keys that name a node's pool (tried before the presets), e.g. for k3s clusters."""
    volatile_labels: list[str] = field(
        default_factory=lambda: [
            "kubernetes.io/hostname",
            "nvidia.com/gfd.timestamp",
            "cloud.google.com/gce-topology-host",  # GKE compact placement: a node's host
            "alpha.eksctl.io/instance-id",  # eksctl: a node's EC2 instance
            "k3s.io/hostname",
            "k3s.io/internal-ip",
        ]
    )
    """Per-node label keys that do not make nodes different for scheduling purposes (grouping ignores them)."""
    timestamp_labels: list[str] = field(default_factory=lambda: ["nvidia.com/gfd.timestamp"])
    """Label keys a labeller rewrites with the time on every run (GPU feature discovery: each minute): a node change
    in their values alone makes no new view of the cluster; the view keeps the values it has."""
    extended_resource_toleration: Literal["auto", "on", "off"] = field(
        default="auto", metadata={"schema": {"enum": ["auto", "on", "off", True, False]}}
    )
    """Whether the apiserver runs the ExtendedResourceToleration plugin, by which taints keyed by a requested
    extended resource (nvidia.com/gpu:NoSchedule) count as tolerated. auto: on where the cluster shows a provider
    that enables it (GKE, EKS, AKS, OKE: its pool or spot labels, OKE's pool annotation, an EKS or GKE kubelet
    version; not a generic pool label such as agentpool), or ``providers`` names
    one; off on self-managed clusters (k3s, kubeadm: off upstream). true or false:
    on or off. ``gpu-admission pools`` prints what it took."""
    resync_seconds: int = field(default=300, metadata={"schema": {"minimum": 30}})
    """Relist Nodes at least this often, whatever the watch says (30 or more: each relist lists every Node, in
    every worker)."""

    def __post_init__(self) -> None:
        check_providers(self.providers)
        names = [p.name for p in self.pools]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ConfigError(
                f"cluster.pools: pool {twice[0]!r} is declared twice: give each pool its own name (the webhook's"
                " messages and annotations tell pools by name)"
            )
        if self.resync_seconds < 30:
            raise ConfigError(
                f"cluster.resyncSeconds: {self.resync_seconds} is below 30: each relist lists every Node, in every"
                " worker"
            )


_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_HOST = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*(?::[0-9]{{1,5}})?\Z")


@dataclass(frozen=True)
class RegistrySettings:
    """Reading a GPU container's image config (its env) from its registry, when nothing else tells its CUDA."""

    enabled: bool = False
    """Read the config of an image whose CUDA neither the pod nor the image's name tells (vLLM, TGI, a private
    build ...): the NVIDIA_REQUIRE_CUDA / CUDA_VERSION its base image set. In the background, never while a pod
    waits: the first pods of an image not read yet are "CUDA unknown" (unknownVersion), the later ones checked. The
    webhook's pods reach the registries (HTTPS; anonymously, or with credentialsFile's account: a private image
    without one stays unread); the workers of one pod share what they read."""
    registries: list[str] = field(default_factory=list)
    """The registries read (host or host:port as images name them; docker.io for Docker Hub); empty: any."""
    plain_http: list[str] = field(default_factory=list)
    """Registries reached over plain HTTP (an in-cluster registry without TLS), as host or host:port."""
    timeout_seconds: float = field(default=5.0, metadata={"schema": {"exclusiveMinimum": 0, "maximum": 60}})
    """Connect and read timeout of each request to a registry."""
    refresh_seconds: int = field(default=21600, metadata={"schema": {"minimum": 60}})
    """A tag's config is read again after this (a tag may be pushed anew); one named by digest never changes."""
    retry_seconds: int = field(default=600, metadata={"schema": {"minimum": 10}})
    """A config that could not be read (no such image, a private one, the registry unreachable) is tried again
    after this."""
    max_images: int = field(default=2000, metadata={"schema": {"minimum": 1}})
    """Images remembered per worker; past it the longest-known are forgotten first."""
    credentials_file: str = ""
    """A Docker config file with read credentials for private registries (the ``.dockerconfigjson`` of a
    kubernetes.io/dockerconfigjson Secret: its ``auths`` by registry host, each with ``auth`` or
    ``username``/``password``), sent only to the registry named and the token service it names. Read again when it
    changes; the chart's ``registryCredentials.secretName`` mounts one and sets this."""
    ca_file: str = ""
    """A PEM file of CA certificates trusted besides the system's, for registries whose certificate a private CA
    signed (Harbor, an in-cluster registry); the chart's ``registryCA.configMapName`` mounts one and sets this.
    Read when a worker starts (a changed CA is trusted after a restart)."""
    ecr: bool = True
    """Read private Amazon ECR images (<account>.dkr.ecr.<region>.amazonaws.com) with a pull login the ECR API gives
    the webhook's own AWS credentials (EKS Pod Identity, IRSA; its role needs ecr:GetAuthorizationToken,
    ecr:BatchGetImage and ecr:GetDownloadUrlForLayer), asked for again before it expires (12 hours). A
    credentialsFile entry for the registry comes first."""

    def __post_init__(self) -> None:
        if not 0 < self.timeout_seconds <= 60:
            raise ConfigError(f"cuda.registry.timeoutSeconds: {self.timeout_seconds} must be above 0 and at most 60")
        for name, low in (("refreshSeconds", 60), ("retrySeconds", 10), ("maxImages", 1)):
            value = getattr(self, _snake(name))
            if value < low:
                raise ConfigError(f"cuda.registry.{name}: {value} is below its least value, {low}")
        for key, hosts in (("registries", self.registries), ("plainHttp", self.plain_http)):
            for host in hosts:
                if not _HOST.match(host):
                    raise ConfigError(
                        f"cuda.registry.{key}: {host!r} is not a registry host as an image names it (lower case"
                        " host or host:port, e.g. docker.io, nvcr.io, registry.internal:5000)"
                    )


@dataclass(frozen=True)
class CudaSettings:
    """The CUDA-versus-driver check."""

    mode: Mode = "enforce"
    """enforce: deny incompatible pods; warn: admit with warnings and audit annotations; off: do nothing."""
    namespace_modes: dict[str, Mode] = field(default_factory=dict)
    """Per-namespace override of ``mode``."""
    compatibility: Literal["strict", "minor"] = "strict"
    """strict: the driver must support the pod's major.minor; minor: NVIDIA minor-version compatibility."""
    unknown_version: Literal["warn", "deny", "allow"] = "warn"
    """What to do with a GPU container whose CUDA version cannot be found."""
    unknown_driver: Literal["warn", "deny", "allow"] = "warn"
    """What to do when an eligible pool's driver version is unknown."""
    steer: bool = True
    """Narrow required node affinity to compatible nodes when only some are compatible."""
    driver_table: dict[str, str] = field(default_factory=dict)
    """Extra rows for the CUDA -> minimum driver table, e.g. {"13.4": "620.10.01"}."""
    forward_compatibility: bool = True
    """Honour forward compatibility on data-center GPUs: the alternatives (driver branch and brand) of a container's
    NVIDIA_REQUIRE_CUDA, and the branches an image read from its tag documents (nvidia/cuda, NGC: its compat
    package). Off where the compat libraries are not wired in (a container runtime set up without the NVIDIA
    Container Toolkit's compat handling)."""
    image_references: bool = True
    """Read the CUDA version from well-known image references (nvidia/cuda, pytorch, NGC ...) when nothing says it."""
    registry: RegistrySettings = field(default_factory=RegistrySettings)
    """The image's config in its registry: the last source of a container's CUDA (off by default)."""

    def __post_init__(self) -> None:
        for cuda, driver in self.driver_table.items():
            if parse_version(cuda) is None or parse_version(driver) is None:
                raise ConfigError(
                    f"cuda.driverTable: {cuda!r}: {driver!r} is not a CUDA version and the oldest driver for it"
                    ' (e.g. "13.4": "620.10.01")'
                )


@dataclass(frozen=True)
class MigSettings:
    """Fractional and GPU-memory requests turned into MIG profiles."""

    enabled: bool = True
    """Convert fractions and memory requests at all."""
    coverage: Literal["memory", "compute", "both"] = "memory"
    """A fraction f is covered by a profile whose memory share (eighths), compute share (sevenths) or both is >= f."""
    fallback: Literal["deny", "whole", "shared"] = "deny"
    """When no offered profile fits: deny, give a whole GPU, or a time-sliced shared GPU where one exists."""


@dataclass(frozen=True)
class SpotSettings:
    """Spot / preemptible tolerations on request."""

    default: Literal["off", "tolerate", "prefer", "require", "never"] = "off"
    """What a pod gets when it does not ask (off: nothing; never: kept off spot capacity, as the annotation's)."""
    namespace_defaults: dict[str, Literal["off", "tolerate", "prefer", "require", "never"]] = field(
        default_factory=dict
    )
    """Per-namespace default."""
    owner_defaults: dict[str, Literal["off", "tolerate", "prefer", "require", "never"]] = field(default_factory=dict)
    """Per owner kind default (Job, ReplicaSet, StatefulSet, ...: the kind of the pod's controller, from its
    ownerReference; Deployment reaches the pods of its ReplicaSets). A built-in kind's name means the built-in
    controller only (Job: batch/v1, not a Volcano Job); another kind is matched in any API group. ``Kind.group``
    names a kind of one API group only (Job.batch.volcano.sh: a Volcano Job's pods; PyTorchJob.kubeflow.org), and
    comes before the same kind's bare name (the direct owner's keys come before those of a Deployment above it).
    DaemonSet takes only tolerate (or off): a default prefer, require or never leaves a DaemonSet's pods alone."""
    extra_taints: list[TaintSpec] = field(default_factory=list)
    """Spot taints beyond the provider presets (e.g. a k3s cluster's own)."""
    extra_labels: dict[str, str] = field(default_factory=dict)
    """Spot capacity labels beyond the presets, for prefer/require."""
    gpu_taint_presets: list[str] = field(
        default_factory=list, metadata={"schema": {"items": {"enum": sorted(gpu_taint_preset_names())}}}
    )
    """Also tolerate documented GPU taints that ExtendedResourceToleration does not cover (e.g. aks-sku-gpu)."""
    only_cluster_taints: bool = True
    """Add only the spot tolerations whose taints the cluster actually has, when the cluster is known."""

    def __post_init__(self) -> None:
        _node_labels(
            self.extra_labels, "spot.extraLabels:", "the apiserver would refuse every pod given affinity on it"
        )
        if "CronJob" in self.owner_defaults or "CronJob.batch" in self.owner_defaults:
            raise ConfigError(
                "spot.ownerDefaults: CronJob owns no pod (its Jobs own them): a default for CronJob would never"
                " apply; use Job (the pods of every Job, a CronJob's included)"
            )
        for kind, mode in self.owner_defaults.items():
            if mode in ("prefer", "require", "never") and kind.split(".", 1)[0] == "DaemonSet":  # tolerate applies
                raise ConfigError(
                    f"spot.ownerDefaults: {kind}: {mode}: a default {mode} leaves a DaemonSet's pods alone (they run on"
                    " every node they may, spot nodes' GPU plugins among them), so it would never apply; annotate the"
                    f" DaemonSet's template gpu-admission.io/spot: {mode} to ask it"
                )
            if kind.startswith("ReplicationController."):
                raise ConfigError(
                    "spot.ownerDefaults: ReplicationController is of the core API group, which has no name: write"
                    " ReplicationController"
                )
            if not _KIND.fullmatch(kind):
                kinds = {k.lower(): k for k in OWNER_KINDS}
                hint = f": did you mean {kinds[kind.lower()]!r}?" if kind.lower() in kinds else ""
                raise ConfigError(
                    f"spot.ownerDefaults: {kind!r} is not a kind as a pod's ownerReferences name it (CamelCase,"
                    f" from a capital letter: Job, ReplicaSet, Deployment, StatefulSet, ...), nor one with its API"
                    f" group (Job.batch.volcano.sh){hint}"
                )
        known = sorted(gpu_taint_preset_names())
        unknown = [name for name in self.gpu_taint_presets if name not in known]
        if unknown:
            raise ConfigError(
                f"spot.gpuTaintPresets: unknown preset {', '.join(map(repr, unknown))} (known: {', '.join(known)})"
            )


_KIND = re.compile(r"[A-Z][A-Za-z0-9]*(?:\.[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?)*")
"""An owner kind (CamelCase), or one with its API group (``Job.batch.volcano.sh``: the group a DNS name)."""
OWNER_KINDS = ("Job", "ReplicaSet", "Deployment", "StatefulSet", "DaemonSet", "ReplicationController")
"""Kinds whose pods a ``spot.ownerDefaults`` entry names most often (any other controller's kind is accepted)."""


@dataclass(frozen=True)
class AuditSettings:
    """Where decisions are reported."""

    events: bool = True
    """Create Events on pods (from the validating side)."""
    event_queue_size: int = 1000
    """Bounded queue of Events waiting to be sent from the app's own process (the app embedded or tested); a full
    queue drops and counts. Under ``gpu-admission serve`` the relay's pipe (1 MiB) holds them instead."""
    decision_log: bool = True
    """Write one JSON line per request to stderr."""


@dataclass(frozen=True)
class Settings:
    """All settings of gpu-admission."""

    exemptions: ExemptionSettings = field(default_factory=ExemptionSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    cuda: CudaSettings = field(default_factory=CudaSettings)
    mig: MigSettings = field(default_factory=MigSettings)
    spot: SpotSettings = field(default_factory=SpotSettings)
    audit: AuditSettings = field(default_factory=AuditSettings)
    max_body_bytes: int = field(default=7 * 1024 * 1024, metadata={"schema": {"minimum": 1024}})
    """Largest AdmissionReview accepted (controller-runtime's limit); larger bodies get 413."""

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024:
            raise ConfigError(
                f"maxBodyBytes: {self.max_body_bytes} would refuse every AdmissionReview (413): give at least 1024"
                " (the default, 7340032, is controller-runtime's limit)"
            )


T = TypeVar("T")
_SCALARS: dict[Any, tuple[type, ...]] = {int: (int,), float: (int, float), str: (str, int, float)}
_CAMEL = re.compile(r"(?<!^)(?=[A-Z])")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _snake(key: str) -> str:
    return _CAMEL.sub("_", key).lower()


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(tp))
    if origin in (list, dict):
        return "a list" if origin is list else "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {str: "a string", int: "an integer", bool: "true or false", float: "a number"}.get(tp, str(tp))


def _convert(tp: Any, value: Any, path: str) -> Any:
    origin = get_origin(tp)
    if origin is Literal:
        if value in get_args(tp) and not isinstance(value, bool):
            return value
        if isinstance(value, bool):  # YAML 1.1 reads an unquoted off / on (no, yes) as a boolean
            if (word := "on" if value else "off") in get_args(tp):
                return word
            raise ConfigError(
                f"{path}: must be {_describe(tp)} (got {str(value).lower()}: YAML reads an unquoted yes, no, on or"
                " off as true or false; quote the value)"
            )
        raise ConfigError(f"{path}: must be {_describe(tp)} (got {value!r})")
    if origin in (types.UnionType, typing.Union):
        options = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(options[0], value, path)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: must be a list (got {type(value).__name__})")
        (item,) = get_args(tp)
        return [_convert(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path}: must be a mapping (got {type(value).__name__})")
        _, item = get_args(tp)
        for k in value:
            if not isinstance(k, str):  # YAML reads 13.10 as the number 13.1, yes as true: the text is gone
                raise ConfigError(f"{path}: the key {k!r} is not a string: YAML read it as a {yaml_type(k)}; quote it")
        return {k: _convert(item, v, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return build(tp, value, path)
    if tp is str and isinstance(value, float):  # 550.90 read as 550.9: a version or a label would change
        raise ConfigError(f"{path}: must be a string (got {value!r}: YAML read it as a number; quote it)")
    accepted = _SCALARS.get(tp)
    if (accepted is not None and isinstance(value, accepted) and not isinstance(value, bool)) or (
        tp is bool and isinstance(value, bool)
    ):
        return tp(value)
    raise ConfigError(f"{path}: must be {_describe(tp)} (got {value!r})")


def yaml_type(value: object) -> str:
    """What YAML read a value as, in words ('number', 'boolean'), for a message that asks to quote it."""
    return {bool: "boolean", int: "number", float: "number"}.get(type(value), type(value).__name__)


def build(cls: type[T], data: Any, path: str = "") -> T:
    """Build dataclass ``cls`` from a mapping, strictly: unknown keys and wrong types raise ConfigError."""
    where = path or "settings"
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: must be a mapping (got {type(data).__name__})")
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for raw_key, raw_value in data.items():
        key = _snake(str(raw_key))
        sub = f"{path}.{raw_key}" if path else str(raw_key)
        if key not in fields:
            known = ", ".join(sorted(_camel(f) for f in fields))
            raise ConfigError(f"{sub}: unknown setting (known here: {known})")
        values[key] = _convert(hints[key], raw_value, sub)
    missing = [
        n
        for n, f in fields.items()
        if n not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{where}: missing required setting {', '.join(map(_camel, missing))}")
    try:
        return cls(**values)
    except _Unplaced as err:
        raise ConfigError(f"{where}: {err}") from None


ENV_PREFIX = "GPU_ADMISSION_"
SERVICE_LINK = re.compile(
    r"[A-Z0-9_]+_(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_[0-9]+_(TCP|UDP|SCTP)(_PROTO|_PORT|_ADDR)?)?)\Z"
)
"""The variables the kubelet writes for each Service of the pod's namespace (``<NAME>_SERVICE_HOST``,
``<NAME>_PORT_443_TCP_ADDR``, ...: kubernetes pkg/kubelet/envvars), a Service named ``gpu-admission`` (the chart's
under the release name the docs use) giving ``GPU_ADMISSION_SERVICE_HOST``: read as a setting, it stopped the
server at start (found by a review). A setting's variable names a section with ``__``, which these never hold."""


def _env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[tuple[str, ...], str]]:
    """The settings the environment gives, as a tree of snake_case keys, and the variable that gave each path."""
    tree: dict[str, Any] = {}
    named: dict[tuple[str, ...], str] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX) or ("__" not in name and SERVICE_LINK.match(name)):
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__") if p]
        if not parts:
            continue
        named[tuple(parts)] = name
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{name}: conflicts with another variable")
        try:
            node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
        except (yaml.YAMLError, ValueError) as err:
            raise ConfigError(
                f"{name}: not a YAML value ({err}); quote a string that YAML would read otherwise"
            ) from err
    return tree, named


def _from_variable(err: ConfigError, named: Mapping[tuple[str, ...], str]) -> ConfigError:
    """``err`` naming the environment variable that set the value it is about, where one did: the path alone
    (``cuda.mode``) sent the user looking for a value the settings file does not hold."""
    path = str(err).split(": ", 1)[0]
    parts = tuple(_snake(re.sub(r"\[[^\]]*\]", "", p)) for p in path.split("."))
    for end in range(len(parts), 0, -1):
        if parts[:end] in named:
            return ConfigError(f"{err} (set by the environment variable {named[parts[:end]]})")
    under = sorted(name for key, name in named.items() if key[: len(parts)] == parts)  # an unknown section's
    if under:
        return ConfigError(f"{err} (set by the environment: {', '.join(under)})")
    return err


def _merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``extra`` (the environment's keys: snake_case) over ``base`` (the file's, as written: an error names them so)."""
    out = dict(base)
    written = {_snake(str(k)): k for k in out}
    for key, value in extra.items():
        k = written.get(_snake(str(key)), key)
        if isinstance(value, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = _merge(dict(out[k]), value)
        else:
            out[k] = value
    return out


def load_settings(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Settings:
    """Load settings from ``path`` (YAML) and the environment; raise ConfigError naming the bad key, and the file
    or the variable that set it."""
    data: dict[str, Any] = {}
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as err:
            raise ConfigError(f"{path}: cannot read settings file: {err.strerror}") from err
        except UnicodeDecodeError as err:
            raise ConfigError(f"{path}: the settings file is not UTF-8 text") from err
        try:
            loaded = yaml.safe_load(text)
        except (yaml.YAMLError, ValueError) as err:  # ValueError: a tagged value YAML cannot build (!!int abc)
            raise ConfigError(f"{path}: not valid YAML: {err}") from err
        if loaded is not None and not isinstance(loaded, Mapping):
            raise ConfigError(f"{path}: must hold a mapping of settings")
        data = dict(loaded or {})
    env, named = _env_overrides(os.environ if environ is None else environ)
    try:
        return build(Settings, _merge(data, env))
    except ConfigError as err:
        told = _from_variable(err, named)
        if told is err and path:  # the file's own value: named with the file, as its read errors are (a review's)
            raise ConfigError(f"{path}: {err}") from None
        raise told from None

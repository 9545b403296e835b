"""The mig policy: fractional GPU and GPU-memory requests become MIG profile resources. Pure: (pod, context).

What users write, per container (DESIGN "What users write"):

- a fraction of a GPU, ``nvidia.com/gpu: 0.5`` (or ``500m``), in limits and/or requests;
- a memory size, ``gpu-admission.io/gpu-memory: 20Gi`` (a whole number of bytes, so valid in every workload kind);
- the pod annotation ``gpu-admission.io/gpu-fraction: "0.25"`` for the container named in
  ``gpu-admission.io/gpu-fraction-container``, else the first container.

Kubernetes validates a workload's pod template when the workload is created and rejects a fraction there, so a
fractional ``nvidia.com/gpu`` is converted in Deployment, StatefulSet, DaemonSet, ReplicaSet, Job and CronJob
templates too. The memory resource and the annotation leave templates unchanged (what GitOps users prefer: the
manifest in git stays what the cluster holds); the pods are converted when they are created, and the template only
gets a warning when nothing offered now would cover the request. A DaemonSet's converted template is told which
pools get no pod (pinned off) or a Pending one (``_warn_daemonset``): its controller makes a pod for every node it
selects, whatever the device its template asks.

How a profile is chosen, per container (init containers included), each on its own:

1. The options are the MIG profiles that the pod's eligible nodes actually offer (allocatable > 0; stale
   zero-capacity resources are ignored) or that declared pools declare, under the strategy of their nodes: mixed
   (``nvidia.com/mig-<p>``), single (``nvidia.com/gpu`` + the ``<product>-MIG-<p>`` product label) or GKE
   (``nvidia.com/gpu`` + ``cloud.google.com/gke-gpu-partition-size``). Names are taken from the nodes
   (``7g.79gb`` stays ``7g.79gb``). Eligibility is the pod's own rules (nodeSelector, affinity, tolerations,
   ExtendedResourceToleration) with the rewritten request, so a mixed node's ``nvidia.com/gpu: 0`` does not hide it.
   Single-strategy and GKE options are not offered to a pod that also asks for a whole ``nvidia.com/gpu`` (in any
   container, init containers included): every ``nvidia.com/gpu`` of such a node is a MIG device.
2. A profile covers a fraction f when its memory share (eighths) is >= f (``mig.coverage: memory``, the default),
   its compute share (sevenths, or quarters on 4-slice GPUs) is >= f (``compute``) or both (``both``); it covers a
   memory request when its nominal size (the name's GB, read as GiB) is >= the request.
3. Among covering profiles the smallest wins, across GPU models too: least nominal memory, then fewest compute
   slices, then mixed before single before GKE, plain before variants (``.me``), then by name. So the choice is
   deterministic and spends the least GPU. When the cuda policy enforces, the profiles offered on groups whose
   driver supports the pod's CUDA come first (``cuda.supported_groups``); the others only when none of those fits,
   and not over ``mig.fallback``'s whole or shared GPU where a supported driver offers it.
   A pod that prefers spot capacity (the spot policy ran first) takes, among profiles of one size, one a spot pool
   offers first.
4. When the same profile name is also offered by eligible nodes of another GPU model on which it does not cover the
   request (``1g.10gb`` is 2/8 of an A100-40GB but 1/8 of an A100-80GB), the pod is pinned to the covering GPU
   model(s) on ``nvidia.com/gpu.product`` (or the GKE accelerator, or the pool label). So is a profile that pools
   which time-share it offer under the same name as dedicated ones (a time-sliced mixed pool without
   renameByDefault, a GKE time-sharing partition): pinned to the dedicated ones (their sharing label, GPU model or
   pool), where one runs the pod's CUDA (not a DaemonSet, whose pods on the shared pools the pin would take away;
   not to spot pools alone beside an on-demand pool that shares the device, whatever the spot mode); where no label
   tells them apart, for a DaemonSet, or on spot pools alone, the shared pools are named in a warning.
5. The containers are taken in turn, each choice narrowing where the next can land. When that leaves one without
   a profile, other orders are tried (the largest asks first, the reverse, every order of up to 4 asks), and the
   first that converts every ask is kept; so whether a pod is admitted does not depend on the order its
   containers are written in. When no order does, every ask is tried on one GPU model, model by model (the
   smaller first), then on one pool, and the pod is pinned there (``_on_one``). The lines still name each
   container, in the pod's order.

Each line of ``gpu-admission.io/mig`` names what its conversion wrote (``mig_record``: the line's one format): the
device, the nodeSelector of a single-strategy product or GKE partition size (``the pod's own nodeSelector`` where
the template had it before), any pin to GPU models (``pinned to <key>=<values>``). A workload's later update
(``mig_update.forget``, before every policy) takes out what a conversion wrote where its ask came back, changed or
went (the stored lines only take placement out: ``Context.stored``), and converts the template's fractions afresh
together.

Nothing is rounded silently: a fraction above 1 that is not whole, request != limit, a value <= 0, a fraction
together with a memory request, or nothing offered that covers it, are denied from the mutating side (so the user
reads this message, not Kubernetes' "must be an integer"). ``mig.fallback`` may instead give a whole GPU
(``whole``) or a time-sliced shared GPU (``shared``) when nothing covers the request.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import ROUND_CEILING, ROUND_DOWN, Decimal
from typing import Literal

from webhook import PREFIX, budget
from webhook.affinity import expression, manifest_expressions, unnarrow
from webhook.cluster import (
    GFD,
    GKE_PARTITION_LABEL,
    GKE_SHARING_LABEL,
    GPU_RESOURCE,
    GPU_TAINT_TOLERATION,
    INSTANCE_TYPE_LABEL,
    LEAVING_TOLERATIONS,
    MAX_LISTED,
    MIG_CONFIG_LABEL,
    MIG_RESOURCE_PREFIX,
    PRODUCT_LABEL,
    SHARED_SUFFIX,
    TOLERATES_ALL,
    Candidate,
    NodeGroup,
    device_spec,
    is_extended_resource_name,
    offers,
    pool_names,
    requested_resources,
    split_leaving,
    toleration_tolerates,
    untolerated,
)
from webhook.config import PoolSettings
from webhook.mig_profiles import Profile, derive, load_table, parse_name
from webhook.model import (
    GPU_MEMORY_RESOURCE,
    JSON,
    WARNING_LIMIT,
    Context,
    Outcome,
    PodView,
    as_dict,
    as_list,
    as_str,
    copy_json,
    escaped,
    fit_warning,
    middle_clipped,
    shown_name,
)
from webhook.policies import cuda, spot
from webhook.policies import mig_record as record
from webhook.policies.mig_record import Line, Pin
from webhook.policies.steering import steered
from webhook.presets import NVIDIA
from webhook.quantity import QuantityError, format_quantity, parse_quantity

POLICY = "mig"
SHARING_LABEL = GFD + "gpu.sharing-strategy"
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
SHARED_RESOURCE = GPU_RESOURCE + ".shared"
FRACTION_ANNOTATION = PREFIX + "gpu-fraction"
GIB = Decimal(2**30)
MIB = 2**20
STRATEGY_ORDER = {"mixed": 0, "single": 1, "gke": 2}
SLICING = ("single", "gke")
"""The MIG strategies under which every ``nvidia.com/gpu`` of a node is a MIG device."""

Kind = Literal["fraction", "memory"]


@dataclass
class Ask:
    """What one container asks for, before conversion."""

    list_name: str
    name: str
    container: JSON
    kind: Kind
    amount: Decimal
    """The fraction f, or the memory in bytes."""
    asked: str
    """As the user wrote it: 'nvidia.com/gpu 500m', 'gpu-admission.io/gpu-memory 20Gi'."""
    source: Literal["resource", "annotation"] = "resource"


@dataclass(frozen=True)
class Option:
    """One way to give a container a device: a profile under a strategy, or a fallback."""

    strategy: str
    """mixed, single, gke; whole or shared for fallbacks."""
    profile: str
    resource: str
    selector: tuple[str, str] | None = None

    @property
    def by_pool(self) -> bool:
        """A single-strategy device of pools at zero that an autoscaler makes from the pool's own definition
        (``_made_from_pool``): no nodeSelector on GFD's product, which their template node lacks; the pod is pinned
        to those pools by their own label (``_choose``)."""
        return self.strategy == "single" and self.selector is None

    @property
    def given(self) -> str:
        """How the annotation names what the container got (checked against the object on a later pass)."""
        if self.strategy == "mixed":
            return self.resource
        if self.selector:
            return f"{self.resource} 1{record.WITH_SELECTOR}{self.selector[0]}={self.selector[1]}"
        return f"{self.resource} 1"


@dataclass
class Placement:
    group: NodeGroup
    profile: Profile | None
    covers: bool
    usable_mib: int = 0


@dataclass
class Choice:
    option: Option
    places: list[Placement]
    pin: Pin | None = None
    note: str = ""
    tolerated: bool = False
    """The conversion wrote the toleration of the GPU taint (``_keep_gpu_toleration``)."""


@dataclass
class _Request:
    """Per-request memo: options and profile facts are computed once."""

    ctx: Context
    options: list[Option] = field(default_factory=list)
    profiles: dict[tuple[int, str], Profile | None] = field(default_factory=dict)
    whole: list[str] = field(default_factory=list)
    """The containers that ask for whole GPUs, in words ('container b (nvidia.com/gpu 1)')."""
    spot_first: bool = False
    """The spot policy, before this one, made the pod prefer spot capacity (``SpotPrefer``)."""
    spot_mode: str = ""
    """The spot mode the spot policy, before this one, decided for the pod (``spot.decided_mode``)."""
    supported: frozenset[int] | None = None
    """Ids of the groups whose driver supports the pod's CUDA (``cuda.supported_groups``); None: not known."""
    smallest: dict[tuple[int, str, Decimal], Profile | None] = field(default_factory=dict)
    """The smallest profile a group offers that covers an ask of a kind and amount (``_smallest_covering``)."""


# ---------------------------------------------------------------------------------------------------------------
# Reading what the containers ask for


def sections(container: JSON) -> tuple[dict[str, object], dict[str, object]]:
    resources = as_dict(container.get("resources"))
    return as_dict(resources.get("limits")), as_dict(resources.get("requests"))


def raw_text(value: object) -> str:
    return value if isinstance(value, str) else str(value)


@dataclass
class _Read:
    amount: Decimal | None = None
    text: str = ""
    error: tuple[str, str] | None = None


def _read(container: JSON, key: str, name: str) -> _Read | None:
    """The amount of ``key`` the container asks for (limit and request must agree); None when it asks none."""
    limits, requests = sections(container)
    values = [(s, v) for s, v in (("limit", limits.get(key)), ("request", requests.get(key))) if v is not None]
    if not values:
        return None
    parsed: list[Decimal] = []
    for _, value in values:
        try:
            parsed.append(parse_quantity(value))
        except QuantityError:
            return _Read(
                text=raw_text(value),
                error=(
                    "MIGInvalidRequest",
                    f"container {name}: {key} {raw_text(value)!r} is not a quantity; {_quantity_hint(key, value)}",
                ),
            )
    if len(parsed) == 2 and parsed[0] != parsed[1]:
        limit, request = raw_text(values[0][1]), raw_text(values[1][1])
        return _Read(
            text=limit,
            error=(
                "MIGRequestLimitMismatch",
                f"container {name} asks for {key} with request {request} and limit {limit}: they must be equal "
                f"(extended resources cannot be overcommitted); set both to {limit} or both to {request}.",
            ),
        )
    return _Read(amount=parsed[0], text=raw_text(values[0][1]))


_BYTES_UNIT = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([kmgtpe])i?b\s*", re.IGNORECASE)
"""A memory size with a byte unit (20GB, 512MiB, 1.5gb): what people write, and Kubernetes does not."""


def _quantity_hint(key: str, value: object) -> str:
    """What to write instead: found by a review, a gpu-memory of '20GB' was told 'write e.g. 0.5, 500m or 1'."""
    if key != GPU_MEMORY_RESOURCE:
        return "write e.g. 0.5, 500m or 1."
    if found := _BYTES_UNIT.fullmatch(raw_text(value)):
        number, letter = found.group(1), found.group(2).upper()
        binary, decimal = f"{number}{letter}i", f"{number}{'k' if letter == 'K' else letter}"
        unit = raw_text(value).strip().lstrip("0123456789. ")
        return (
            f"{unit} is not a Kubernetes suffix (no B): write {binary} (powers of 1024) or {decimal} (powers of 1000)."
        )
    return "write a memory size, e.g. 20Gi (powers of 1024) or 20G (powers of 1000)."


def _fraction_error(name: str, asked: str, amount: Decimal) -> tuple[str, str] | None:
    if amount <= 0:
        return (
            "MIGInvalidFraction",
            f"container {name} asks for {asked}: a GPU fraction must be above 0 (e.g. 0.5 or 500m).",
        )
    if amount > 1:
        low = int(amount)
        return (
            "MIGInvalidFraction",
            f"container {name} asks for {asked}: a fraction above 1 cannot be given (a container gets at most "
            f"one MIG device, and a MIG device is at most one GPU); ask for a whole number of GPUs ({low} or "
            f"{low + 1}) or a fraction up to 1.",
        )
    return None


def mig_resources(container: JSON) -> list[str]:
    limits, requests = sections(container)
    found = set()
    for key, value in [*limits.items(), *requests.items()]:
        if isinstance(key, str) and key.startswith(MIG_RESOURCE_PREFIX):
            try:
                if parse_quantity(value) > 0:
                    found.add(key)
            except QuantityError:
                continue
    return sorted(found)


def _state_tokens(container: JSON, spec: JSON) -> list[str]:
    """How the annotation may name what the container has now (most specific first)."""
    limits, requests = sections(container)
    merged = {**requests, **limits}
    tokens: list[str] = []

    def one(key: str) -> bool:
        try:
            return key in merged and parse_quantity(merged[key]) == 1
        except QuantityError:
            return False

    tokens += [r for r in mig_resources(container) if one(r)]
    if one(SHARED_RESOURCE):
        tokens.append(f"{SHARED_RESOURCE} 1")
    if one(GPU_RESOURCE):
        selector = as_dict(spec.get("nodeSelector"))
        for key in (PRODUCT_LABEL, GKE_PARTITION_LABEL, SHARING_LABEL):
            value = selector.get(key)
            if isinstance(value, str) and (key != PRODUCT_LABEL or "-MIG-" in value):
                tokens.append(f"{GPU_RESOURCE} 1{record.WITH_SELECTOR}{key}={value}")
        tokens.append(f"{GPU_RESOURCE} 1")
    return tokens


def _assigned(container: JSON, spec: JSON) -> bool:
    """The container has a MIG device (or a shared GPU) as its GPU: nothing left to convert."""
    return any(t != f"{GPU_RESOURCE} 1" for t in _state_tokens(container, spec))


def holds_given(line: str | None, container: JSON, spec: JSON) -> bool:
    """Whether the container holds what ``line`` says it was given (a device, one GPU with its nodeSelector)."""
    return bool(line) and record.given_of(line or "") in _state_tokens(container, spec)


def _where_now(pod: PodView, ctx: Context) -> str:
    """Where the pod, as it stands, can get its GPU: the words a line written by ``_line`` ends with; for a
    DaemonSet's template, with the pools where its pods stay Pending (``_daemon_pending``)."""
    served = _served(pod, ctx)
    where = _where([Placement(g, None, True) for g in served])
    pending = _daemon_pending(pod, ctx, served) if where else []
    return f"{where}, {DAEMON_PENDING.format(pools=_pools(pending))}" if pending else where


def _served(pod: PodView, ctx: Context) -> list[NodeGroup]:
    """The groups where the pod, as it stands, can get every GPU device its containers ask."""
    return [c.group for c in _eligible(ctx, _trial(pod, [], None, None, ctx.cluster.extended_resource_toleration))]


DAEMON_PENDING = "its pods on {pools} stay Pending"
"""What a DaemonSet's line adds where the pods it makes on some pools get no device there."""


def _daemon_nodes(pod: PodView, ctx: Context) -> list[NodeGroup]:
    """The GPU groups a DaemonSet makes a pod for (none for other kinds): those its template's nodeSelector, node
    affinity and tolerations reach. Its controller checks no resource, and gives no toleration for the resources
    asked, as ExtendedResourceToleration gives the pods (kubernetes pkg/controller/daemon ``predicates``)."""
    if pod.kind != "DaemonSet":
        return []
    rules: JSON = {k: pod.spec[k] for k in ("nodeSelector", "affinity", "tolerations") if k in pod.spec}
    return [c.group for c in ctx.cluster.eligible(rules, gpu_only=True)]


def _daemon_pending(pod: PodView, ctx: Context, served: Sequence[NodeGroup]) -> list[NodeGroup]:
    """The groups a DaemonSet makes a pod for whose nodes do not offer what its template asks (``served``: those
    that do): one template asks one device of every node, and its pods there stay Pending for good (a fraction
    converted to an A100-40GB's 3g.20gb, and the A100-80GB nodes offering 3g.40gb: a review of MIG)."""
    kept = {id(g) for g in served}
    return [g for g in _daemon_nodes(pod, ctx) if id(g) not in kept]


def _confirmed(text: str | None, container: JSON, pod: PodView, pin_keys: Sequence[str]) -> Line | None:
    """A prior conversion's line, a request in one of the forms the webhook writes, where the container has what
    it was given; its pin, read only on ``pin_keys``, kept where the pod still holds it. None for any other line.
    Only the amount once asked is taken on trust (it is a bare number)."""
    if not text or not holds_given(text, container, pod.spec):
        return None
    line = record.parse(text, pin_keys)
    if not line.conversion:
        return None
    return line if line.pin is None or record.carries(pod, line.pin) else replace(line, pin=None)


def _republishable(
    text: str | None, container: JSON, pod: PodView, where_now: str, pin_keys: Sequence[str], unseen: bool = False
) -> bool:
    """A prior line that says nothing the object and the cluster do not confirm (``_confirmed``, the pin it names,
    and where such a pod can land now: ``_lands_as_said``, unless its node is not seen yet: ``_node_unseen``):
    written again, it is the same text. A user's own words are never republished."""
    line = _confirmed(text, container, pod, pin_keys)
    return line is not None and str(line) == text and (unseen or _lands_as_said(pod, line.where, where_now))


def _node_unseen(pod: PodView, ctx: Context, text: str) -> bool:
    """A DaemonSet's pod made for a node the webhook has not seen yet, or whose device plugin offers nothing yet
    (``_reaches_devices``, but for the nodeSelector of the device of ``text``, its line): where it gets its GPU is
    not known, and its template's line stands (it was reworded 'no node it can run on offers it now', the device
    its node's pool offers: found by a review of MIG)."""
    if pod.owner_kind != "DaemonSet":
        return False
    line = record.parse(text)
    return not _reaches_devices(pod, ctx, line.selector if _is_mig(line) else None)


_DAEMON_PENDING_WORDS = re.compile(re.escape(", " + DAEMON_PENDING).replace(re.escape("{pools}"), "pools? .+") + "$")
_PLACE = re.compile(r"(.+?), pools? (.+)")
_MORE = re.compile(r" and [0-9]+ more$")


def _lands_as_said(pod: PodView, said: str, where_now: str) -> bool:
    """Whether a line's words of where the pod gets its GPU (``said``) hold for it as it stands (``where_now``). A
    pod's line was written on its template: a DaemonSet's names the pools its pods stay Pending on
    (``DAEMON_PENDING``), and every pool it serves, where the pod its controller makes for a node reaches that
    node's alone; its pods lost their line (made 'as found on the object') and their MIGAssigned Event (found by a
    review of MIG). Those are confirmed where the places it reaches are among those said."""
    if said == where_now:
        return True
    if pod.is_template or not where_now:
        return False
    served = _DAEMON_PENDING_WORDS.sub("", said)
    if served == where_now:
        return True
    if pod.owner_kind != "DaemonSet":
        return False
    named, reached = _places_said(served), _places_said(where_now)
    if named is None or reached is None:
        return False
    return all(pools <= named.get(product, set()) for product, pools in reached.items())


def _places_said(where: str) -> dict[str, set[str]] | None:
    """The pools by GPU model that ``_where``'s words name; None where they do not name all ('and 2 more')."""
    places: dict[str, set[str]] = {}
    for part in where.split(" or "):
        found = _PLACE.fullmatch(part)
        if found is None or _MORE.search(found[2]):
            return None
        places.setdefault(found[1], set()).update(found[2].split(", "))
    return places


def _reworded(text: str | None, container: JSON, pod: PodView, where_now: str, pin_keys: Sequence[str]) -> str | None:
    """A prior conversion line (``_confirmed``) reworded to say where the pod lands now, or that it lands nowhere:
    what it was converted from stays on the pod (the validating webhook's warning tells how to convert it afresh;
    a workload's next update brings the ask back beside the device), where a line 'as found on the object' lost
    it, and the ask that came back was refused as a second device (a pool added at a Helm upgrade that dropped the
    fraction: a generative review)."""
    line = _confirmed(text, container, pod, pin_keys)
    return None if line is None else str(replace(line, where=where_now or record.NOWHERE_NOW))


def named(pod: PodView) -> Iterator[tuple[str, str, JSON]]:
    """(list name, container name, container); a container without a name is called by its position (#0 ...). The
    name as the policy's lines and words write it, ``escaped``: the webhook sees a pod before its validation, and a
    newline or a bidirectional control in a name was written into the annotation as it was (found by a review); a
    line is read back by it (``record.lines_of``)."""
    for index, (list_name, container) in enumerate(pod.containers()):
        yield list_name, escaped(as_str(container.get("name"))) or f"#{index}", container


def _unknown_resource(container: JSON) -> str | None:
    """A resource under PREFIX other than ``gpu-admission.io/gpu-memory`` (misspelt: ``gpu-memroy``): no node
    offers it, and the pod was admitted to stay Pending without a word (found by a review)."""
    limits, requests = sections(container)
    for key in (*limits, *requests):
        if isinstance(key, str) and key.startswith(PREFIX) and key != GPU_MEMORY_RESOURCE:
            return key
    return None


def _has_a_device_already(out: Outcome, name: str, asked: str, container: JSON) -> bool:
    """A container that asks for a fraction or a memory size and already has a MIG device: refused (one each)."""
    devices = mig_resources(container)
    if devices:
        out.deny(
            POLICY,
            "MIGMultipleDevices",
            f"container {name} asks for {asked} and already has {devices[0]}: a container can use one MIG device; "
            "remove one of them.",
            container=name,
        )
    return bool(devices)


def _warn_whole_and_mig(out: Outcome, name: str, whole: _Read, container: JSON) -> None:
    """A container asking for whole GPUs and a MIG device at once: the mixed strategy, the only one that offers
    both, gives it both (single-strategy and GKE nodes have no ``nvidia.com/mig-*``), which is seldom meant: most
    often one of the two was left over from an edit. Not refused: a container may mean to use both."""
    devices = mig_resources(container)
    if devices:
        gpus = "a whole GPU" if whole.amount == 1 else "whole GPUs"
        said = f"{GPU_RESOURCE} {whole.text} and {devices[0]} give it {gpus} and a MIG device: remove one of them"
        out.warn(fit_warning(f"{name}: {said}", name))


def _collect(pod: PodView, ctx: Context, out: Outcome) -> list[Ask]:
    """The asks of every container; refusals of malformed asks go to ``out`` as denials."""
    asks: list[Ask] = []
    for list_name, name, container in named(pod):
        if unknown := _unknown_resource(container):
            out.deny(
                POLICY,
                "MIGInvalidRequest",
                f"container {name} asks for {unknown}, a resource no node offers: the pod would stay Pending; "
                f"gpu-admission reads {GPU_MEMORY_RESOURCE} (a memory size, e.g. 20Gi).",
                container=name,
            )
            continue
        gpu = _read(container, GPU_RESOURCE, name)
        memory = _read(container, GPU_MEMORY_RESOURCE, name)
        for read in (gpu, memory):
            if read is not None and read.error:
                out.deny(POLICY, *read.error, container=name)
        if (gpu and gpu.error) or (memory and memory.error):
            continue
        fraction = None
        if (
            gpu is not None
            and gpu.amount is not None
            and (gpu.amount != gpu.amount.to_integral_value() or gpu.amount < 0)
        ):
            fraction = gpu
        has_whole = gpu is not None and gpu.amount is not None and gpu.amount > 0 and fraction is None
        if has_whole and gpu is not None and gpu.amount is not None:
            _warn_whole_and_mig(out, name, gpu, container)
        if memory is not None and memory.amount is not None:
            asked = f"{GPU_MEMORY_RESOURCE} {memory.text}"
            if fraction is not None or has_whole:
                out.deny(
                    POLICY,
                    "MIGConflictingRequest",
                    f"container {name} asks for both {GPU_RESOURCE} {gpu.text if gpu else ''} and {asked}: "
                    f"ask for a fraction or a memory size, not both.",
                    container=name,
                )
                continue
            if memory.amount <= 0 or memory.amount != memory.amount.to_integral_value():
                out.deny(
                    POLICY,
                    "MIGInvalidRequest",
                    f"container {name} asks for {asked}: GPU memory must be a positive whole number of bytes "
                    f"(e.g. 20Gi or 10G).",
                    container=name,
                )
                continue
            if pod.is_template and GPU_MEMORY_RESOURCE not in sections(container)[0]:
                # Kept in the template for the pods (see mutate), where Kubernetes refuses a requests-only one.
                out.deny(
                    POLICY,
                    "MIGRequestWithoutLimit",
                    f"container {name} asks for {asked} in resources.requests only: Kubernetes refuses an extended "
                    f"resource without a limit in the {pod.kind}'s pod template, and the webhook converts "
                    f"{GPU_MEMORY_RESOURCE} only in the pods made from it. To fix, set it in resources.limits "
                    f"({GPU_MEMORY_RESOURCE}: {memory.text}); requests may keep the same value or drop it.",
                    container=name,
                )
                continue
            if _has_a_device_already(out, name, asked, container):
                continue
            asks.append(Ask(list_name, name, container, "memory", memory.amount, asked))
        elif fraction is not None and fraction.amount is not None:
            asked = f"{GPU_RESOURCE} {fraction.text}"
            error = _fraction_error(name, asked, fraction.amount)
            if error:
                out.deny(POLICY, *error, container=name)
                continue
            if _has_a_device_already(out, name, asked, container):
                continue
            asks.append(Ask(list_name, name, container, "fraction", fraction.amount, asked))
    annotated = _annotation_ask(pod, ctx, out, asks)
    if annotated is not None:
        asks.append(annotated)
    return asks


def _annotation_ask(pod: PodView, ctx: Context, out: Outcome, asks: Sequence[Ask]) -> Ask | None:
    raw = pod.annotation("gpu-fraction")
    target_name = pod.annotation("gpu-fraction-container")
    if raw is None:
        if target_name:
            text = f"{FRACTION_ANNOTATION}-container {target_name!r} is set without {FRACTION_ANNOTATION}: add the"
            out.warn(fit_warning(text + " fraction", repr(target_name)))
        return None
    containers = [c for _, c in pod.containers(init=False)]
    if target_name:
        matching = [c for c in containers if c.get("name") == target_name]
        if not matching:
            names = ", ".join(as_str(c.get("name")) for c in containers) or "none"
            init = any(n == "initContainers" and c.get("name") == target_name for n, c in pod.containers())
            what = (
                f"init container {target_name!r}; the annotation gives its fraction to one of the containers only"
                if init
                else f"container {target_name!r}, which the pod does not have"
            )
            advice = (
                f" To fix, name one of the containers, or ask for the fraction in the init container's own limits "
                f"({GPU_RESOURCE}: {raw.strip()})."
                if init
                else " To fix, name one of the containers."
            )
            out.deny(
                POLICY,
                "MIGUnknownContainer",
                f"annotation {PREFIX}gpu-fraction-container names {what} (containers: {names}).{advice}",
            )
            return None
        target = matching[0]
    elif containers:
        target = containers[0]
    else:
        return None
    name = next(n for _, n, c in named(pod) if c is target)
    asked = f"{FRACTION_ANNOTATION} {raw.strip()}"  # as a second pass reads it back (the line is checked)
    if holds_given(record.lines_of(ctx).get(name), target, pod.spec):
        return None  # converted on an earlier pass
    if _assigned(target, pod.spec):
        # The user's own MIG resource (or shared GPU) wins, as before; the annotation is not silently dropped.
        held = _state_tokens(target, pod.spec)[0].split(" with ", 1)[0]
        out.warn(fit_warning(f"{name}: {asked} ignored, it has {held}: remove one of the two", name))
        return None
    try:
        amount = parse_quantity(raw)
    except QuantityError:
        out.deny(
            POLICY,
            "MIGInvalidFraction",
            f'annotation {FRACTION_ANNOTATION} {raw!r} is not a number; write e.g. "0.25" or "250m".',
        )
        return None
    if amount <= 0 or amount > 1:
        out.deny(
            POLICY,
            "MIGInvalidFraction",
            f"annotation {FRACTION_ANNOTATION} {raw!r} must be above 0 and at most 1 (for whole GPUs, request "
            f"{GPU_RESOURCE}: 1 or more in the container's limits).",
        )
        return None
    own = _read(target, GPU_RESOURCE, name)
    memory = _read(target, GPU_MEMORY_RESOURCE, name)
    if any(a.container is target for a in asks) or (own and own.amount != 0) or memory is not None:
        out.deny(
            POLICY,
            "MIGConflictingRequest",
            f"container {name} is given {asked} by annotation but also requests {GPU_RESOURCE} or "
            f"{GPU_MEMORY_RESOURCE} itself: use one of them.",
        )
        return None
    return Ask("containers", name, target, "fraction", amount, asked, "annotation")


# ---------------------------------------------------------------------------------------------------------------
# What the cluster offers


def _options(ctx: Context) -> list[Option]:
    seen: dict[Option, None] = {}
    steered = ctx.cluster.presets.pool_steered
    for group in ctx.cluster.gpu_groups:
        strategy = group.mig_strategy
        for profile, offer in sorted(group.mig_profiles.items()):
            if offer.count <= 0 or parse_name(profile) is None:
                continue
            if strategy == "mixed":
                seen[Option("mixed", profile, MIG_RESOURCE_PREFIX + profile.replace("+", "."))] = None
            elif strategy == "single":
                label = group.labels.get(PRODUCT_LABEL, "")
                if label.removesuffix(SHARED_SUFFIX).endswith("-MIG-" + profile):  # -SHARED: time-sliced too
                    selector = None if _made_from_pool(group, steered) else (PRODUCT_LABEL, label)
                    seen[Option("single", profile, GPU_RESOURCE, selector)] = None
            elif strategy == "gke" and group.labels.get(GKE_PARTITION_LABEL) == profile:
                seen[Option("gke", profile, GPU_RESOURCE, (GKE_PARTITION_LABEL, profile))] = None
    return list(seen)


def _profile(req: _Request, group: NodeGroup, name: str) -> Profile | None:
    key = (id(group), name)
    if key not in req.profiles:
        memory = group.gpu_memory_mib if group.mig_strategy != "single" else 0
        model = load_table().model_for(
            group.gpu_product, group.labels.get(GKE_ACCELERATOR_LABEL, ""), memory, group.mig_profiles
        )
        found = model.lookup(name) if model else None
        if found is None:
            full_gb = model.memory_gb if model else memory / 1024
            found = derive(name, full_gb, model.compute_slices if model else 0)
        req.profiles[key] = found
    return req.profiles[key]


def _covers(ask: Ask, profile: Profile, coverage: str) -> bool:
    if ask.kind == "memory":
        return Decimal(profile.gb) * GIB >= ask.amount
    by_memory = Decimal(profile.eighths) >= ask.amount * 8
    by_compute = Decimal(profile.slices) >= ask.amount * profile.total_slices
    return {"memory": by_memory, "compute": by_compute}.get(coverage, by_memory and by_compute)


def _gpu_only(resources: Mapping[str, Decimal]) -> dict[str, Decimal]:
    return {k: v for k, v in resources.items() if k.startswith("nvidia.com/")}


def _trial(
    pod: PodView, pending: Iterable[Ask], ask: Ask | None, option: Option | None, plugin: bool, also: Iterable[Ask] = ()
) -> JSON:
    """A slim copy of the spec for eligibility: the pending asks stripped, ``ask`` (and those in ``also``) given
    ``option`` (and the GPU taint's toleration ``_keep_gpu_toleration`` would write; ``plugin``: the cluster runs
    ExtendedResourceToleration)."""
    spec = pod.spec
    trial: JSON = {k: spec[k] for k in ("nodeName", "affinity", "tolerations") if k in spec}
    if ask is not None and option is not None and (option.resource != GPU_RESOURCE or not plugin):
        trial["tolerations"] = [*as_list(spec.get("tolerations")), GPU_TAINT_TOLERATION]
    if as_list(spec.get("schedulingGates")):  # what takes the gate away may add tolerations (cuda._eligible)
        trial["tolerations"] = [*as_list(trial.get("tolerations")), TOLERATES_ALL]
    selector = dict(as_dict(spec.get("nodeSelector")))
    if option is not None and option.selector:
        selector[option.selector[0]] = option.selector[1]
    if selector:
        trial["nodeSelector"] = selector
    stripped = {id(a.container) for a in pending}
    given = {id(a.container) for a in ([ask, *also] if ask is not None and option is not None else ())}
    for list_name, container in pod.containers():
        limits, requests = sections(container)
        # Every extended resource stays: the ExtendedResourceToleration plugin tolerates the taints named after them.
        merged = {k: v for k, v in {**requests, **limits}.items() if is_extended_resource_name(k)}
        if id(container) in stripped:
            merged.pop(GPU_RESOURCE, None)
        if option is not None and id(container) in given:
            merged.pop(GPU_RESOURCE, None)
            merged[option.resource] = "1"
        if not merged:
            continue  # asks for no extended resource: adds nothing to the sums, names no taint
        slim: JSON = {"resources": {"limits": merged}}
        if container.get("restartPolicy") == "Always":
            slim["restartPolicy"] = "Always"
        trial.setdefault(list_name, []).append(slim)
    return trial


def _eligible(ctx: Context, trial: JSON) -> list[Candidate]:
    return ctx.cluster.eligible(trial, resources=_gpu_only(requested_resources(trial)), gpu_only=True)


def _pin_keys(ctx: Context) -> list[str]:
    return [PRODUCT_LABEL, GKE_ACCELERATOR_LABEL, *ctx.cluster.presets.pool_labels]


def all_pin_keys(ctx: Context) -> list[str]:
    """The keys the webhook pins a pod by: the GPU model's and the pools' (``_pin_keys``), and a fallback's
    sharing labels."""
    return [SHARING_LABEL, GKE_SHARING_LABEL, *_pin_keys(ctx)]


def _made_from_pool(group: NodeGroup, steered: frozenset[str]) -> bool:
    """A pool at zero that an autoscaler makes from the pool's own definition (it carries a key of ``steered``,
    ``Presets.pool_steered``): Cluster Autoscaler's template node for an EKS or AKS group at zero, or the node a
    Karpenter NodePool imagines, carries none of GFD's labels, and a pod that selects one is never given a node."""
    return not group.nodes and not steered.isdisjoint(group.labels)


def _pin(
    good: Sequence[NodeGroup], bad: Sequence[NodeGroup], keys: Sequence[str], steered: frozenset[str] = frozenset()
) -> Pin | None:
    """A label whose values on the good groups exclude every bad group; None when there is none. Where a good group
    is a pool at zero that an autoscaler makes from the pool's own definition (``_made_from_pool``), its pool label
    first: a pod pinned by nvidia.com/gpu.product stayed Pending (a review's). Where every good group is such a
    pool, never by GFD's labels, which no node the autoscaler imagines for them carries (an EKS nodegroup and a
    Karpenter NodePool at zero, with no pool label in common, were pinned by gpu.product: a review of MIG)."""
    if all(_made_from_pool(g, steered) for g in good):
        keys = [k for k in keys if not k.startswith(GFD)]
    if any(_made_from_pool(g, steered) for g in good):
        keys = sorted(keys, key=lambda k: k not in steered)  # stable: the pools' labels in their order first
    for key in keys:
        values = {g.labels.get(key) for g in good}
        if None in values or "" in values or not values:  # an empty value could not be named in a line
            continue
        if any(g.labels.get(key) in values for g in bad):
            continue
        return key, tuple(sorted(v for v in values if v is not None))
    return None


def _pin_most(
    req: _Request, good: Sequence[NodeGroup], bad: Sequence[NodeGroup], keys: Sequence[str], steered: frozenset[str]
) -> tuple[Pin, list[NodeGroup]] | None:
    """Where no one label pins every good group (``_pin``): a label that pins some of them off every bad group, with
    the good groups it reaches; None when none does. Pools at zero under different pool labels (an EKS nodegroup
    beside a Karpenter NodePool) beside a GPU group to fence off were refused as if no profile covered the ask (a
    review of MIG): the pod goes to the pools of one label. Of those labels, first one that reaches a pool whose
    driver runs the pod's CUDA, then one that does not leave the pod on spot pools alone where on-demand ones serve
    it (``_spot_alone``), then the one that reaches the most: the pools of the label listed first were taken on a
    tie, and a pod was pinned to the pool whose driver was too old for its CUDA, or to spot capacity it did not ask
    for, beside a pool that served it (found by a review)."""
    best: tuple[tuple[bool, bool, int], Pin, list[NodeGroup]] | None = None
    for key in keys:
        some = [g for g in good if g.labels.get(key)]
        pin = _pin(some, bad, [key], steered) if some else None
        if pin is None:
            continue
        runs = req.supported is None or any(id(g) in req.supported for g in some)
        rank = (runs, not _spot_alone(some, good), len(some))
        if best is None or rank > best[0]:
            best = rank, pin, some
    return None if best is None else (best[1], best[2])


def _rank(option: Option, places: Sequence[Placement]) -> tuple[object, ...]:
    covering = [p.profile for p in places if p.covers and p.profile]
    smallest = min(((p.gb, p.slices) for p in covering), default=(1 << 30, 99))
    variant = (parse_name(option.profile) or (0, 0, "?"))[2]
    return (
        *smallest,
        STRATEGY_ORDER.get(option.strategy, 9),
        option.by_pool,  # a pool whose nodes run now before one at zero
        variant != "",
        option.profile,
        option.selector or ("", ""),
    )


def _whole_gpus(pod: PodView, asks: Iterable[JSON]) -> list[str]:
    """The containers (init containers and sidecars too) that ask for whole ``nvidia.com/gpu``, in words, but the
    containers of ``asks`` (what is converted). Under the single strategy and on GKE every ``nvidia.com/gpu`` of a
    MIG node is a MIG device, so such nodes cannot serve them (unless the pod itself already selects a MIG product
    or partition size: then its GPUs are MIG devices)."""
    selector = as_dict(pod.spec.get("nodeSelector"))
    if "-MIG-" in as_str(selector.get(PRODUCT_LABEL)) or GKE_PARTITION_LABEL in selector:
        return []
    asking = {id(a) for a in asks}
    out: list[str] = []
    for list_name, name, container in named(pod):
        read = _read(container, GPU_RESOURCE, name)
        if id(container) in asking or read is None or read.amount is None:
            continue
        if read.amount >= 1 and read.amount == read.amount.to_integral_value():
            what = "init container" if list_name == "initContainers" else "container"
            out.append(f"{what} {name} ({GPU_RESOURCE} {read.text})")
    return out


Unpinned = list[tuple[list[Placement], list[NodeGroup]]]
"""Covering placements that no label pins the pod to, each with the groups to fence off (for the refusal)."""


def _choose(
    req: _Request, pod: PodView, pending: Sequence[Ask], ask: Ask
) -> tuple[Choice | None, list[Placement], list[Placement], Unpinned]:
    """The smallest covering option (and any pin it needs), every placement seen, the covering placements on
    single-strategy and GKE nodes that the pod's whole GPUs bar, and the covering ones no label pins the pod to off
    the groups it must avoid (all three for the refusal message)."""
    ctx = req.ctx
    coverage = ctx.settings.mig.coverage
    seen: list[Placement] = []
    barred: list[Placement] = []
    ranked: list[tuple[tuple[object, ...], Option, list[Placement], list[NodeGroup]]] = []
    selector = as_dict(pod.spec.get("nodeSelector"))
    steered = ctx.cluster.presets.pool_steered
    for option in req.options:
        budget.check()
        if option.selector and selector.get(option.selector[0], option.selector[1]) != option.selector[1]:
            continue  # another container (or the user) already chose a different profile or product
        places: list[Placement] = []
        fenced: list[NodeGroup] = []  # with no selector of its own, a by_pool device is pinned off every other group
        for cand in _eligible(ctx, _trial(pod, pending, ask, option, ctx.cluster.extended_resource_toleration)):
            group = cand.group
            if option.profile not in group.mig_profiles or (option.by_pool and not _made_from_pool(group, steered)):
                fenced += [group] if option.by_pool else []
                continue
            profile = _profile(req, group, option.profile)
            if profile is None:
                continue
            usable = group.mig_profiles[option.profile].memory_mib or profile.usable_mib
            places.append(Placement(group, profile, _covers(ask, profile, coverage), usable))
        if req.whole and option.strategy in SLICING:
            barred += [p for p in places if p.covers]
            continue
        seen += places
        if any(p.covers for p in places):
            # Offers on groups whose driver runs the pod's CUDA first; the others only when none fits (the cuda
            # policy's denial then says why).
            runs = req.supported is None or any(p.covers and id(p.group) in req.supported for p in places)
            gb, slices, *rest = _rank(option, places)
            # a pod that prefers spot capacity: among profiles of one size, one a spot pool offers first
            spot = req.spot_first and any(p.covers and p.group.spot for p in places)
            # of one size, a device of its own before one time-shared with other pods (its memory is theirs
            # too): a time-sliced mixed pool had come before a dedicated single-strategy one (a review of MIG);
            # the smallest that covers the ask first all the same (a 0.1 was given a whole 7g.80gb)
            shared = not any(p.covers and p.group.sharing == "none" for p in places)
            ranked.append(((not runs, gb, slices, shared, not spot, *rest), option, places, fenced))
    ranked.sort(key=lambda r: r[0])
    unpinned: Unpinned = []
    for _, option, places, fenced in ranked:
        good = [p for p in places if p.covers]
        bad = [p.group for p in places if not p.covers] + fenced
        if pod.owner_kind != "DaemonSet" and (own := _own_devices(req, option, good, bad)):
            return own, seen, barred, []
        pin = None
        if bad or option.by_pool:  # a by_pool device has no selector of its own: pinned to its pools whatever else
            pin = _pin([p.group for p in good], bad, _pin_keys(ctx), ctx.cluster.presets.pool_steered)
            if pin is None and bad:
                most = _pin_most(req, [p.group for p in good], bad, _pin_keys(ctx), ctx.cluster.presets.pool_steered)
                if most is None:
                    unpinned.append((good, bad))
                    continue
                pin, reached = most
                good = [p for p in good if any(p.group is g for g in reached)]  # the line names only these
            # with nothing to fence off and no one pool label on all its pools (an EKS nodegroup beside a Karpenter
            # NodePool), a by_pool device goes unpinned: a pin by GFD's labels gave the pod no node
        return Choice(option, good, pin), seen, barred, []
    return None, seen, barred, unpinned


def _own_devices(req: _Request, option: Option, good: Sequence[Placement], bad: Sequence[NodeGroup]) -> Choice | None:
    """The choice pinned to the pools where the device is the pod's own, where pools that time-share it offer it
    under the same name too (a time-sliced mixed pool without renameByDefault, a GKE time-sharing partition): one
    option, so the ranking's 'a device of its own first' never told them apart, and 0.5 was given a 3g.20gb shared
    four ways without a word (a review of MIG). None where no dedicated pool whose driver runs the pod's CUDA
    offers it, or no label tells those pools from the others (``_warn_shared`` then says the sharing). Not asked
    for a DaemonSet (``_choose``): its controller makes a pod for every node it selects, and the pin took its pods
    off every time-sliced node, where the shared device served them (found by a review of MIG); the shared pools
    are named as where no label tells them apart. The pin is a nodeSelector, not a preference: a pod that may take
    a shared device where the dedicated ones are full asks the device by its name (``nvidia.com/mig-<profile>``),
    which no conversion pins. Nor where it would narrow the pod to spot capacity it did not ask for
    (``_spot_alone``)."""
    own = [p for p in good if p.group.sharing == "none"]
    if len(own) == len(good) or not any(req.supported is None or id(p.group) in req.supported for p in own):
        return None
    shared = [p.group for p in good if p.group.sharing != "none"]
    if _spot_alone([p.group for p in own], shared):
        return None
    pin = _pin([p.group for p in own], [*bad, *shared], all_pin_keys(req.ctx), req.ctx.cluster.presets.pool_steered)
    return Choice(option, own, pin) if pin else None


def _spot_alone(own: Sequence[NodeGroup], shared: Sequence[NodeGroup]) -> bool:
    """Whether the pin to the dedicated pools ``own`` would leave the pod on spot pools alone, off ``shared`` pools
    that are on demand. EKS, Karpenter, CoreWeave and untainted GKE spot nodes take every pod: a Deployment that
    asked nothing was pinned to a spot pool that gave the device undivided, beside an on-demand pool that time-shared
    it, without a word, or made to wait for a declared spot pool at zero while a running node served it (found by a
    review of MIG). The CUDA steering goes to spot pools alone only where no other pool runs the pod's CUDA (and
    says so); a device of its own is not worth that: the shared pools are named in a warning (``_warn_shared``).
    Whatever the spot mode: under prefer the pin made the preference a requirement, and a workload whose mode an
    UPDATE changed kept a pin its conversion was not redone for (found by a review); prefer's own preferred affinity
    leans to the spot pool, require's keeps the pod there."""
    return all(g.spot for g in own) and not all(g.spot for g in shared)


def _runs(req: _Request, choice: Choice) -> bool:
    """The choice lands the pod where a driver supports its CUDA (or that is not known)."""
    return req.supported is None or any(id(p.group) in req.supported for p in choice.places)


def _fallback(req: _Request, pod: PodView, pending: Sequence[Ask], ask: Ask) -> Choice | None:
    ctx = req.ctx
    mode = ctx.settings.mig.fallback
    if mode == "whole":
        option = Option("whole", "", GPU_RESOURCE)
        cands = _eligible(ctx, _trial(pod, pending, ask, option, ctx.cluster.extended_resource_toleration))
        good = [c.group for c in cands if c.group.mig_strategy in ("none", "mixed")]
        bad = [c.group for c in cands if c.group.mig_strategy not in ("none", "mixed")]
        note = record.WHOLE_NOTE
    elif mode == "shared":
        option = Option("shared", "", SHARED_RESOURCE)
        cands = _eligible(ctx, _trial(pod, pending, ask, option, ctx.cluster.extended_resource_toleration))
        good, bad = [c.group for c in cands], []
        if not good:
            option = Option("shared", "", GPU_RESOURCE)
            cands = _eligible(ctx, _trial(pod, pending, ask, option, ctx.cluster.extended_resource_toleration))
            good = [c.group for c in cands if c.group.sharing == "time-slicing"]
            bad = [c.group for c in cands if c.group.sharing != "time-slicing"]
        note = record.SHARED_NOTE
    else:
        return None
    if ask.kind == "memory":  # a GPU of less memory than asked is no fallback (30Gi went to a T4 of 15 GiB)
        small = {id(g) for g in good if g.gpu_memory_mib and g.gpu_memory_mib * MIB < ask.amount}
        bad += [g for g in good if id(g) in small]
        good = [g for g in good if id(g) not in small]
    if not good:
        return None
    pin = _pin(good, bad, all_pin_keys(ctx), ctx.cluster.presets.pool_steered) if bad else None
    if bad and pin is None:
        most = _pin_most(req, good, bad, all_pin_keys(ctx), ctx.cluster.presets.pool_steered)
        if most is None:
            return None
        pin, good = most
    return Choice(option, [Placement(g, None, True) for g in good], pin, note)


# ---------------------------------------------------------------------------------------------------------------
# Rewriting and explaining


"""What ExtendedResourceToleration gives a pod that requests nvidia.com/gpu. GPU nodes are commonly tainted
``nvidia.com/gpu:NoSchedule`` (GKE, OKE, DOKS, the GPU Operator's docs); a container whose ask for "a GPU" became
``nvidia.com/mig-<p>`` no longer gets it from the plugin (a pod made from a converted template never had it), so the
conversion carries it over, only where the chosen nodes carry that taint and nothing tolerates it yet."""


def _keep_gpu_toleration(pod: PodView, choice: Choice, plugin: bool) -> bool:
    """Tolerate the GPU taint of the nodes a MIG device is on (ExtendedResourceToleration sees no nvidia.com/gpu
    ask any more), or any device where the cluster runs no such plugin (a single-strategy pool's nvidia.com/gpu on
    k3s was refused as out of reach while a mixed one's MIG device got its toleration); whether it was written
    here."""
    if choice.option.resource == GPU_RESOURCE and plugin:
        return False  # the plugin still sees nvidia.com/gpu
    taints = {t for p in choice.places for t in p.group.taints if t.key == GPU_RESOURCE and t.effect == "NoSchedule"}
    if not taints:
        return False
    tolerations = pod.spec.get("tolerations")
    if tolerations is None:
        tolerations = pod.spec["tolerations"] = []
    if not isinstance(tolerations, list):
        return False
    existing = [t for t in tolerations if isinstance(t, dict)]
    if all(any(toleration_tolerates(t, taint) for t in existing) for taint in taints):
        return False
    tolerations.append(dict(GPU_TAINT_TOLERATION))
    return True


def _apply(pod: PodView, ask: Ask, choice: Choice, plugin: bool) -> Choice:
    """Write the choice into the pod; the choice as written (whether it wrote the GPU taint's toleration)."""
    container = ask.container
    tolerated = _keep_gpu_toleration(pod, choice, plugin)
    resources = container.get("resources")
    if not isinstance(resources, dict):
        resources = container["resources"] = {}
    for section in ("limits", "requests"):
        values = resources.get(section)
        if section == "requests" and pod.is_template and not (isinstance(values, dict) and _held(values)):
            # limits alone asked it: its pods' requests default to their limits, and a request written here would
            # be in no manifest (a Helm release keeps it: a later whole "2" met the webhook's "1", refused)
            continue
        if not isinstance(values, dict):
            values = resources[section] = {}
        values.pop(GPU_RESOURCE, None)
        values.pop(GPU_MEMORY_RESOURCE, None)
        values[choice.option.resource] = "1"
    if choice.option.selector:
        key, value = choice.option.selector
        pod.spec_dict("nodeSelector")[key] = value
    if choice.pin:
        record.write_pin(pod, choice.pin)
    return replace(choice, tolerated=True) if tolerated else choice


def _held(section: JSON) -> bool:
    """Whether a resources section asks what a conversion replaces: a GPU count or a GPU-memory size."""
    return GPU_RESOURCE in section or GPU_MEMORY_RESOURCE in section


def _product(group: NodeGroup) -> str:
    return group.gpu_product or group.labels.get(GKE_ACCELERATOR_LABEL, "") or "GPU model unknown"


def _where(places: Sequence[Placement]) -> str:
    """'NVIDIA-A100-SXM4-80GB, pool a100' or 'A, pools p, q or B, pool r'."""
    pools: dict[str, list[str]] = {}
    for p in places:
        names = pools.setdefault(_product(p.group), [])
        if p.group.pool not in names:
            names.append(p.group.pool)
    parts = []
    for product, names in sorted(pools.items()):
        shown = ", ".join(sorted(names)[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{product}, pool{'s' if len(names) > 1 else ''} {shown}")
    return " or ".join(parts).replace(record.SEPARATOR, ", ")


def _line(ask: Ask, choice: Choice, where_now: str, own: Mapping[str, object], earlier: str | None) -> str:
    """'trainer: nvidia.com/gpu 0.5 -> nvidia.com/mig-3g.20gb (NVIDIA-A100-SXM4-40GB, pool a100)': where the pod
    lands as it leaves the mutating webhook (``where_now``), or, when it lands nowhere, where the choice was made.
    ``own``: the pod's nodeSelector before any conversion. ``earlier``: the container's line on the object, kept
    as written where it is this one as versions before ``Line.profile`` wrote it (without 'MIG 3g.40gb, '):
    rewritten, the template changed on an unchanged manifest's apply, and every such Deployment rolled out after
    an upgrade of the webhook (a review's). ``_read_line`` reads its profile back."""
    selector = choice.option.selector
    own_selector = selector is not None and own.get(selector[0]) == selector[1]
    where = where_now or _where(choice.places)
    option = choice.option
    profile = option.profile if option.by_pool else ""
    line = Line(ask.name, ask.asked, option.given, choice.note, own_selector, choice.pin, where, choice.tolerated)
    if profile and earlier == str(line):
        return earlier
    return str(replace(line, profile=profile))


def _plain(amount: Decimal) -> str:
    """0.5 -> '0.5' (a fraction as people write it)."""
    text = format(amount.normalize(), "f")
    return text


def _gib(amount: Decimal) -> str:
    """A memory amount as a message says it: whole GiB, else whole MiB (rounded up: 21G is 20028Mi, not
    20027.16064453125Mi)."""
    gib = amount / GIB
    if gib == gib.to_integral_value():
        return f"{format_quantity(gib)}Gi"
    return f"{format_quantity((amount / MIB).to_integral_value(rounding=ROUND_CEILING))}Mi"


def _offered(places: Sequence[Placement], ask: Ask) -> str:
    """'pool a (NVIDIA-A100-SXM4-40GB, mixed): 1g.10gb (2/8 memory, 1/7 compute); pool b ... and 3 more'."""
    by_pool: dict[str, list[str]] = {}
    for p in sorted(
        places, key=lambda p: (p.profile.gb, p.profile.slices, p.profile.name) if p.profile else (0, 0, "")
    ):
        if p.profile is None:
            continue
        label = f"{p.group.pool} ({_product(p.group)}, {p.group.mig_strategy})"
        shares = f"{p.profile.memory_share} memory, {p.profile.compute_share} compute"
        text = f"{p.profile.name} ({shares})" if ask.kind == "fraction" else f"{p.profile.name}"
        if text not in by_pool.setdefault(label, []):
            by_pool[label].append(text)
    listed = [f"pool {k}: {', '.join(v)}" for k, v in sorted(by_pool.items())]
    # bounded: over 450 pools the refusal was cut at its MESSAGE_LIMIT, its advice lost (a review of MIG)
    more = len(listed) - MAX_LISTED
    return "; ".join(listed[:MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def _refusal(
    req: _Request,
    pod: PodView,
    pending: Sequence[Ask],
    ask: Ask,
    seen: Sequence[Placement],
    barred: Sequence[Placement] = (),
    unpinned: Unpinned | None = None,
) -> str:
    ctx = req.ctx
    coverage = ctx.settings.mig.coverage
    declare = ""  # how to declare the MIG layout of declared pools at zero the pod reaches (``_declare_layout``)
    # where pools offer a covering profile that no label pins the pod to, their words and advice, and what else is
    # said all the same (a MIG layout changing, too few devices for its other containers: left out, a review's)
    unpinned_advice = ""
    if unpinned:
        head, unpinned_advice = _unpinned_words(req, ask, *unpinned[0], whole=_whole_gpu_covers(req, pod, pending, ask))
    else:
        if ask.kind == "fraction":
            rule = {"memory": "memory share", "compute": "compute share", "both": "memory and compute shares"}[coverage]
            wanted = f"a MIG profile whose {rule} is at least {_plain(ask.amount)}"
        else:
            wanted = f"a MIG profile of at least {_gib(ask.amount)}"
        head = f"container {ask.name} asks for {ask.asked}; no eligible node offers {wanted}."
        if not ctx.cluster.known or not ctx.cluster.groups:
            return head + " The webhook does not know the cluster's nodes yet (none listed, no pool declared)."
    # too few of a covering profile for the pod's containers together, beside smaller ones offered too: said, or
    # the pod was told to ask for what the smaller hold (found by a review of MIG)
    short, full = _too_few(req, pod, pending, ask)
    barred = [*barred, *(p for p in full if all(p.group is not b.group for b in barred))]
    barred_groups = {id(p.group) for p in barred}
    short_groups = {id(g) for g, _ in short}
    if seen:
        tail = "" if unpinned else f" Eligible nodes offer: {_offered(seen, ask)}."
        tail += _too_few_words(short)
    else:
        trial = _trial(pod, [*pending, ask], None, None, ctx.cluster.extended_resource_toleration)
        # Without its GPU request the trial lost the toleration ExtendedResourceToleration gave it: keep it.
        trial["tolerations"] = [*as_list(trial.get("tolerations")), GPU_TAINT_TOLERATION]
        # a MIG pool barred for the pod's whole GPUs is named below, not as a pool that offers no profile
        gpus = [
            c
            for c in _eligible(ctx, trial)
            if id(c.group) not in barred_groups | short_groups and not c.group.mig_profiles
        ]
        if short:
            tail = _too_few_words(short)
        elif gpus:
            tail = f" Eligible GPU nodes offer no MIG profiles: {_described(gpus)}."
            declare = _declare_layout(req, ask, [c.group for c in gpus])
        elif barred:
            tail = ""
        elif ctx.cluster.eligible(trial, gpu_only=True):
            # its placement rules reach GPU nodes: what its other requests ask keeps it off them, not those rules
            # (a pod with none was told its nodeSelector, node affinity and tolerations matched no GPU node: a
            # review of MIG)
            tail = (
                " The GPU nodes its nodeSelector, node affinity and tolerations reach do not offer the other"
                " resources the pod asks for."
            )
        else:
            tail = " No GPU node matches the pod's nodeSelector, node affinity and tolerations."
    if barred:
        pools = sorted(
            {f"{p.group.pool} ({p.group.mig_strategy}, {p.profile.name if p.profile else '?'})" for p in barred}
        )
        tail += (
            f" Pool{'s' if len(pools) > 1 else ''} {', '.join(pools[:3])} would cover it, but there every"
            f" {GPU_RESOURCE} is a MIG device, and {', '.join(req.whole[:3])} would get a MIG slice there instead"
            " of the whole GPU it asks for: one pod cannot mix whole GPUs and such slices."
        )
    # MIG Manager withholds a node's devices while it applies a layout: the pool offers them again when it is done
    reachable = _reachable(pod, ctx)
    changing = sorted(
        {
            f"{g.pool} ({MIG_CONFIG_LABEL}={g.mig_config or '?'}, {g.mig_config_state})"
            for g in ctx.cluster.gpu_groups
            if g.mig_changing and id(g) in reachable  # a pool its own rules keep it off is no reason to wait
        }
    )
    if changing:
        tail += (
            f" The MIG layout of pool{'s' if len(changing) > 1 else ''} {', '.join(changing[:3])} is changing: its"
            " MIG devices are offered again once MIG Manager has applied it."
        )
    seen_groups = {id(p.group) for p in seen} | barred_groups | short_groups
    others = [g for g in ctx.cluster.gpu_groups if g.mig_profiles and id(g) not in seen_groups]
    # a pool out of reach is worth reaching only where a profile covers the ask (a review of real manifests: 0.5
    # was told to change its nodeSelector for a pool of 1g.5gb, and then refused there)
    elsewhere = [g for g in others if any(_covers(ask, p, coverage) for p in _profiles_of(req, g))]
    if elsewhere:
        tail += f" MIG pools this pod cannot use: {_each_pool(elsewhere, lambda g: _kept_off(g, pod, req))}."
    reachable_if = {id(g) for g in elsewhere}
    # and what keeps the pod off them too: the advice to ask less is followed by a refusal naming it otherwise
    too_small = [g for g in others if id(g) not in reachable_if]
    if too_small and not seen:
        listed = _each_pool(too_small, lambda g: f"out of reach too: {_kept_off(g, pod, req)}")
        tail += f" MIG pools whose profiles are all smaller than it asks: {listed}."
    if unpinned:
        advice = unpinned_advice
    elif changing and not seen:
        advice = (
            " Create the pod again once the layout is applied (a workload's controller retries by itself), or ask"
            " for a whole GPU (nvidia.com/gpu: 1)."
        )
    elif short:
        advice = (
            " Split the containers into pods of their own, ask for a smaller profile in some of them, or for a"
            " whole GPU (nvidia.com/gpu: 1)."
        )
    elif seen:
        advice = " Ask for at most what a profile offered here holds, or for a whole GPU (nvidia.com/gpu: 1)."
    elif barred:
        advice = (
            " Run the whole-GPU containers in a pod of their own, ask for a fraction in them too, or add"
            " mixed-strategy MIG nodes (whole GPUs and MIG devices side by side)."
        )
    elif elsewhere and req.whole and all(_only_whole_gpus_keep_off(g, pod, ctx) for g in elsewhere):
        # no nodeSelector reaches them: their nodes offer no whole GPU for the pod's other containers (a review
        # of MIG: the pod was told to change its placement rules)
        advice = (
            " Run the whole-GPU containers in a pod of their own, ask for a fraction in them too, or add"
            " mixed-strategy MIG nodes that offer whole GPUs beside MIG devices."
        )
    elif elsewhere and all(_unoffered(g, pod) for g in elsewhere):
        # every one lacks what its other containers ask, whatever else keeps it off some: reaching them would not
        # do (a review of MIG: it was told to tolerate a spot pool that lacks nvidia.com/gpu.shared too)
        advice = _own_pod_advice(elsewhere, pod)
    elif _kept_off_by_spot(elsewhere, pod, req):
        advice = (
            f" Ask for {PREFIX}spot: prefer (or tolerate) to let it run on demand there, or for a whole GPU"
            " (nvidia.com/gpu: 1)."
        )
    elif _only_leaving_keeps_off(elsewhere, pod, ctx):
        advice = (
            " Create the pod again once those pools' nodes take pods (a workload's controller retries by itself), or"
            " ask for a whole GPU (nvidia.com/gpu: 1)."
        )
    elif elsewhere and all(id(g) in reachable for g in elsewhere):
        # no rule of the pod's keeps it off them: what its other containers ask (found by a review of MIG: it was
        # told to change its nodeSelector, node affinity or tolerations)
        advice = _own_pod_advice(elsewhere, pod)
    elif elsewhere:
        advice = (
            " Change the pod's nodeSelector, node affinity or tolerations so it can reach one of those pools, or ask"
            " for a whole GPU (nvidia.com/gpu: 1)."
        )
    elif too_small:
        advice = (
            " Ask for at most what those profiles hold and let the pod reach them, or ask for a whole GPU"
            " (nvidia.com/gpu: 1)."
        )
    elif declare:
        advice = f" Ask for a whole GPU (nvidia.com/gpu: 1), or, {declare}"
    else:
        advice = " Ask for a whole GPU (nvidia.com/gpu: 1), or add MIG-partitioned nodes (or declare their pool)."
    if ctx.settings.mig.fallback != "deny":
        of = f" of {_gib(ask.amount)} or more" if ask.kind == "memory" else ""
        advice = f" The {ctx.settings.mig.fallback} fallback found no GPU{of} either." + advice
    return head + tail + advice


def _each_pool(groups: Sequence[NodeGroup], why: Callable[[NodeGroup], str]) -> str:
    """'a100 (3g.40gb; why), b (...) and 5 more': the first 3 pools by name, each once (where each node is a group of
    its own, a pool was named once a node), by its nearest group (the fewest words of why: its first group's was
    told, a pool with nodes in the zone the pod selects told its zone where its first node was elsewhere; a review
    of the groups at scale), the rest counted."""
    by_pool: dict[str, list[NodeGroup]] = {}
    for g in groups:
        by_pool.setdefault(g.pool, []).append(g)
    shown = []
    for pool, members in sorted(by_pool.items())[:3]:
        reason, g = min(((why(g), g) for g in members), key=lambda told: (len(told[0]), told[0]))
        shown.append(f"{pool} ({', '.join(sorted(g.mig_profiles))}; {reason})")
    return ", ".join(shown) + (f" and {len(by_pool) - 3} more" if len(by_pool) > 3 else "")


LISTED_POOLS = 4
"""Pools a refusal describes one by one; the rest are counted."""


def _described(candidates: Sequence[Candidate]) -> str:
    """'pool t4 (75 nodes, Tesla-T4, driver 550.54.15, CUDA 12.4), ... and 36 more': each pool once, its eligible
    nodes counted over its groups (where each node is a group of its own, a 75-node pool was said to have 1 node,
    and 4 of 40 pools were named with no word of the others: a review of MIG)."""
    by_pool: dict[str, list[Candidate]] = {}
    for c in candidates:
        by_pool.setdefault(c.group.pool, []).append(c)
    texts = []
    for pool, members in sorted(by_pool.items())[:LISTED_POOLS]:
        count = sum(len(c.nodes) for c in members)
        size = f"{count} node{'s' if count != 1 else ''}" if count else "no nodes now"
        products = sorted({c.group.gpu_product for c in members if c.group.gpu_product})
        drivers = list(dict.fromkeys(c.group.driver_text for c in sorted(members, key=lambda c: c.group.driver or ())))
        cudas = list(dict.fromkeys(c.group.cuda_text for c in sorted(members, key=lambda c: c.group.cuda or ())))
        gpu = "".join(f", {p}" for p in products[:2])
        plural = "s" if len(drivers) > 1 else ""
        texts.append(
            f"pool {pool} ({size}{gpu}, driver{plural} {' or '.join(drivers[:3])}, CUDA {' or '.join(cudas[:3])})"
        )
    more = len(by_pool) - LISTED_POOLS
    return ", ".join(texts) + (f" and {more} more" if more > 0 else "")


def _declare_layout(req: _Request, ask: Ask, groups: Sequence[NodeGroup]) -> str:
    """The advice for the pools declared in settings, at zero, without MIG (no ``migStrategy``) among ``groups``:
    where their GPU model has a MIG profile that covers ``ask`` (or is not declared), to set ``migStrategy`` and
    ``migProfiles`` on them, naming that profile; '' where none is such a pool (a model without MIG, or whose profiles
    all hold less: gpu-memory 100Gi on an A100-80GB was told to set them, a review's). install.md's pool a100 was
    told to 'add MIG-partitioned nodes (or declare their pool)', a pool it had declared (a review of MIG)."""
    table, coverage = load_table(), req.ctx.settings.mig.coverage
    unknown: list[NodeGroup] = []
    capable: dict[str, list[NodeGroup]] = {}
    covering: set[str] = set()
    for g in groups:
        if not g.declared or g.mig_strategy != "none":
            continue
        accelerator = g.labels.get(GKE_ACCELERATOR_LABEL, "")
        if not g.gpu_product and not accelerator:
            unknown.append(g)
        elif (model := table.model_for(g.gpu_product, accelerator, g.gpu_memory_mib)) and (
            fits := [p for p in model.profiles.values() if _covers(ask, p, coverage)]
        ):
            capable.setdefault(_product(g), []).append(g)
            covering.add(min(fits, key=lambda p: (p.gb, p.slices)).name)
    if capable:
        pools = [g for gs in capable.values() for g in gs]
        models = ", ".join(sorted(capable)[:2])
        one = len({g.pool for g in pools}) == 1
        return (
            f"where the GPUs of {_pools(pools)} ({models}, which support MIG) are MIG-partitioned, set migStrategy"
            f" {_strategies(req.ctx, pools)} and migProfiles on {'it' if one else 'them'} in cluster.pools"
            f" ({' or '.join(sorted(covering))} covers it)."
        )
    if unknown:
        one = len({g.pool for g in unknown}) == 1
        return (
            f"if the GPUs of {_pools(unknown)} are MIG-partitioned, set migStrategy {_strategies(req.ctx, unknown)}"
            f" and migProfiles on {'it' if one else 'them'} in cluster.pools."
        )
    return ""


def _strategies(ctx: Context, groups: Iterable[NodeGroup]) -> str:
    """The MIG strategies the declared pools ``groups`` can be given, in words: gke (GKE's partition-size label)
    only where one of them is a GKE pool (GKE's accelerator label, or a label of GKE's presets, names it); mixed and
    single anywhere, GKE's pools run by the GPU Operator too. An EKS nodegroup was told gke (a review of MIG)."""
    gke = any(GKE_ACCELERATOR_LABEL in g.labels or "gke" in ctx.cluster.presets.named_by(g.labels) for g in groups)
    return "(mixed, single or gke)" if gke else "(mixed or single)"


def _whole_gpu_covers(req: _Request, pod: PodView, pending: Sequence[Ask], ask: Ask) -> bool:
    """Whether a whole ``nvidia.com/gpu: 1`` in the ask's stead gets a whole GPU that covers it wherever the pod can
    land: some pool it reaches offers one, and none it reaches gives a MIG device as nvidia.com/gpu (single
    strategy, GKE) or a GPU of less memory than asked (left unpinned, such an ask lands on any of them)."""
    option = Option("whole", "", GPU_RESOURCE)
    groups = [
        c.group
        for c in _eligible(req.ctx, _trial(pod, pending, ask, option, req.ctx.cluster.extended_resource_toleration))
    ]
    if not groups or any(g.mig_strategy not in ("none", "mixed") for g in groups):
        return False
    return ask.kind != "memory" or all(g.gpu_memory_mib * MIB >= ask.amount for g in groups)


def _unpinned_words(
    req: _Request, ask: Ask, good: Sequence[Placement], bad: Sequence[NodeGroup], whole: bool
) -> tuple[str, str]:
    """``_refusal``'s head and advice where pools offer a profile that covers the ask but no label pins the pod to
    them off the groups it must avoid (every pool label of the pools at zero names one of those too: two pools of one
    Karpenter NodePool): the pod was told no eligible node offers a profile that covers it (a review of MIG).
    ``whole``: a whole GPU covers it wherever the pod lands (``_whole_gpu_covers``); only then is it told to ask for
    one (it was told so where the pools offered no whole GPU, or where a smaller one took it: a review of MIG)."""
    groups = [p.group for p in good]
    profiles = " and ".join(sorted({p.profile.name for p in good if p.profile}))
    keys = _pin_keys(req.ctx)
    shared = sorted(
        {
            f"{k}={g.labels[k]}"
            for g in groups
            for k in keys
            if g.labels.get(k) and any(b.labels.get(k) == g.labels[k] for b in bad)
        }
    )
    others = [
        b for b in bad if any(b.labels.get(k) == g.labels.get(k) for g in groups for k in keys if g.labels.get(k))
    ]
    one = len({g.pool for g in groups}) == 1
    labels = (
        f"every label the webhook pins a pod by that {'its' if one else 'their'} nodes carry ({', '.join(shared[:3])})"
        f" names {_pools(others or bad)} too"
        if shared
        else f"{'its' if one else 'their'} nodes carry no label the webhook pins a pod by that {_pools(bad)} lack"
    )
    head = (
        f"container {ask.name} asks for {ask.asked}; {_pools(groups)} {'offers' if one else 'offer'} MIG {profiles},"
        f" which covers it, but the pod cannot be pinned to {'it' if one else 'them'}: {labels}, where it would get"
        " another device or none."
    )
    advice = (
        f" Give {'that pool a pool label' if one else 'those pools pool labels'} of"
        f" {'its' if one else 'their'} own (a NodePool or node group of {'its' if one else 'their'} own)"
        f"{',' if whole else ', or'} add to the pod a nodeSelector that only {'its' if one else 'their'} nodes match"
        f" ({INSTANCE_TYPE_LABEL}, say){f', or ask for a whole GPU ({GPU_RESOURCE}: 1)' if whole else ''}."
    )
    return head, advice


def _only_whole_gpus_keep_off(group: NodeGroup, pod: PodView, ctx: Context) -> bool:
    """The pod's placement rules reach ``group``, whose nodes offer no whole GPU for its whole-GPU containers."""
    return group.allocatable.get(GPU_RESOURCE, Decimal(0)) <= 0 and id(group) in _reachable(pod, ctx)


def _only_leaving_keeps_off(groups: Sequence[NodeGroup], pod: PodView, ctx: Context) -> bool:
    """The pod's placement rules reach every one of ``groups`` but for the taints that say their nodes take no pod
    now (``LEAVING_TAINTS``: cordoned, not ready): no rule of its own to change, and no toleration of a drain or a
    broken node to add (found by a review of the cluster model: it was told to change its tolerations). Not where
    they reach them without (the pod's other resources keep it off: it was told to wait for nodes that take pods)."""
    rules = _placement_rules(pod)
    rules["tolerations"] = [*rules["tolerations"], *LEAVING_TOLERATIONS]
    reached = {id(c.group) for c in _eligible(ctx, rules)}
    before = _reachable(pod, ctx)
    return bool(groups) and all(id(g) in reached and id(g) not in before for g in groups)


def _reachable(pod: PodView, ctx: Context) -> set[int]:
    """The ids of the groups the pod's placement rules alone (``_placement_rules``: no resource asked) reach."""
    return {id(c.group) for c in _eligible(ctx, _placement_rules(pod))}


def _own_pod_advice(groups: Sequence[NodeGroup], pod: PodView) -> str:
    """The advice where what the pod's other containers ask keeps it off ``groups``: those containers apart."""
    devices = sorted({r for g in groups for r in _unoffered(g, pod)})
    return (
        f" Run the containers that ask {', '.join(devices[:3]) or 'the other resources'} in a pod of their own,"
        " or ask for a whole GPU (nvidia.com/gpu: 1)."
    )


def _unoffered(group: NodeGroup, pod: PodView) -> list[str]:
    """The NVIDIA resources but nvidia.com/gpu (whose whole GPUs ``_kept_off`` names apart) the pod asks more of
    than ``group``'s nodes offer: MIG devices, shared GPUs, any other the device plugin names."""
    return sorted(
        r
        for r, n in _gpu_only(requested_resources(pod.spec)).items()
        if r != GPU_RESOURCE and group.allocatable.get(r, Decimal(0)) < n
    )


def _placement_rules(pod: PodView) -> JSON:
    """The pod's placement rules alone (no container, so no resource asked), the GPU taint tolerated."""
    return {**device_spec(pod.spec), "containers": [], "initContainers": []}


def _profiles_of(req: _Request, group: NodeGroup) -> list[Profile]:
    return [p for name in group.mig_profiles if (p := _profile(req, group, name)) is not None]


def _kept_off(group: NodeGroup, pod: PodView, req: _Request) -> str:
    """What keeps the pod off a MIG pool, in words: the taints it does not tolerate (not the GPU's own taint, which
    the webhook or ExtendedResourceToleration tolerates for a MIG device; not a cordon or a not-ready node's, which
    no pod should tolerate: what they say of its nodes instead, ``split_leaving``), the nodeSelector keys the pool's
    nodes do not match, the MIG devices its other containers have that the pool does not offer, and on
    single-strategy and GKE pools its containers' whole GPUs (``req.whole``: each GPU there is a MIG device) (found
    by a generative review: 'its node affinity' was said of a pod with none; so it was of one whose other container
    asked nvidia.com/gpu.shared, found by a review of MIG), else its node affinity: the spot
    capacity it requires where the pod is under ``spot: require`` and that alone keeps it off
    (``_kept_off_by_spot``), or the webhook's affinity off spot capacity where it is under ``spot: never`` and that
    alone keeps it off a spot pool (``spot.kept_off_by_never``)."""
    ctx, whole = req.ctx, req.whole
    spec = device_spec(pod.spec)
    taints, state = split_leaving(untolerated(group, spec, ctx.cluster.extended_resource_toleration))
    selector = as_dict(pod.spec.get("nodeSelector"))
    unmatched = _unmatched(group, selector, ctx.cluster.volatile_labels)
    devices = _unoffered(group, pod)
    parts = []
    if taints:
        hint = spot.tolerate_hint(taints, ctx)
        parts.append(f"untolerated taint{'s' if len(taints) > 1 else ''} {', '.join(map(str, taints[:3]))}{hint}")
    if state:  # not a taint to tolerate: a drain, a broken node (``split_leaving``)
        parts.append(f"its nodes are {state} now")
    if unmatched:
        parts.append(f"its nodeSelector {unmatched}")
    if devices:
        parts.append(f"its other containers' {', '.join(devices[:3])}, not offered there")
    if whole and group.mig_strategy in SLICING:
        parts.append(f"{whole[0]} asks whole GPUs, which are MIG devices there")
    elif whole and group.allocatable.get(GPU_RESOURCE, Decimal(0)) < 1:
        parts.append(f"{whole[0]} asks whole GPUs, none offered there")
    if not parts and _kept_off_by_spot([group], pod, req):
        parts.append(spot.KEPT_OFF_BY_REQUIRE)
    elif not parts and spot.kept_off_by_never(req.spot_mode, _placement_rules(pod), [group], ctx):
        parts.append(spot.KEPT_OFF_BY_NEVER)  # a spot pool: "its node affinity" named rules the user did not write
    return "; ".join(parts) or "its node affinity"


def _unmatched(group: NodeGroup, selector: Mapping[str, str], volatile: frozenset[str]) -> str:
    """The nodeSelector pairs the group's nodes do not match, in words ('k: v, ...'; '' where one matches them all).
    A volatile key (``ClusterView.volatile_labels``: a zone, a rack, in a big cluster) is no label of the group but
    each node's own (``group.node_labels``): the pairs its nearest node misses (the fewest words), as where each node
    is a group of its own. It was named of every group, none of whose labels has it: a pool with nodes in the zone
    was told 'its nodeSelector topology.kubernetes.io/zone: us-east-1a' (a review of the groups at scale). A pool
    declared at zero is judged on its labels, as ``eligible`` judges it. Work: the group's nodes, where the selector
    names a volatile key."""

    def words(keys: Iterable[str]) -> str:
        return ", ".join(f"{k}: {selector[k]}" for k in sorted(keys)[:3])

    shared = [k for k, v in selector.items() if k not in volatile and group.labels.get(k) != v]
    own = [(k, v) for k, v in selector.items() if k in volatile]
    if not own or not group.nodes:
        return words([*shared, *(k for k, v in own if group.labels.get(k) != v)])
    nearest: str | None = None
    for labels in group.node_labels.values():
        budget.check()
        text = words([*shared, *(k for k, v in own if labels.get(k) != v)])
        if nearest is None or (len(text), text) < (len(nearest), nearest):
            nearest = text
    return nearest or ""


def _kept_off_by_spot(groups: Sequence[NodeGroup], pod: PodView, req: _Request) -> bool:
    """Whether only the spot places ``spot: require`` ANDed into the pod's affinity keep it off every one of
    ``groups``, on-demand pools (``spot.kept_off_by_require``): "its node affinity" named the pod's own rules, and
    the advice was to change them, for the webhook's own requirement (found by a review of the spot policy)."""
    if not groups or any(g.spot for g in groups):
        return False
    return len(spot.kept_off_by_require(req.spot_mode, _placement_rules(pod), groups, req.ctx)) == len(groups)


def _too_few(
    req: _Request, pod: PodView, pending: Sequence[Ask], ask: Ask
) -> tuple[list[tuple[NodeGroup, tuple[str, str, int, int]]], list[Placement]]:
    """Groups the pod can reach whose profile would cover ``ask`` but whose nodes have too few such devices for
    the pod's containers together (two 0.5 asks, one 3g.20gb a node): (profile, resource, devices a node, devices
    the pod would need), for the refusal (not 'no MIG profiles', not 'selectors'). Every container still waiting
    counts where that profile is the smallest there that covers it: only those converted before ``ask`` were
    counted (three 0.5 asks, one 3g.40gb a node: 'would need 2'; a review of MIG). Each need is worked out once per
    option and set of waiting sizes that take it, not per group (16 asks over 450 pools spent a review's CPU:
    99bec69). And apart, the single-strategy and GKE groups that would cover ``ask`` where the pod's whole GPUs
    (``_whole_gpus``) would be MIG devices too: no number of devices serves it there (counted, the whole GPU was one
    more device: 99bec69); the refusal names them with ``_choose``'s barred ones."""
    out: list[tuple[NodeGroup, tuple[str, str, int, int]]] = []
    full: list[Placement] = []
    known: set[int] = set()
    plugin = req.ctx.cluster.extended_resource_toleration
    coverage = req.ctx.settings.mig.coverage
    sizes = {(a.kind, a.amount): a for a in pending}
    needs: dict[tuple[Option, frozenset[tuple[str, Decimal]]], Decimal] = {}
    for option in req.options:
        if option.strategy not in ("mixed", "single", "gke"):
            continue
        barred = bool(req.whole) and option.strategy in SLICING
        trial = _trial(pod, pending, ask, option, plugin)
        # one device of the option, beside all else the pod asks (another container's whole GPU or named profile)
        wanted = {**_gpu_only(requested_resources(trial)), option.resource: Decimal(1)}
        for cand in req.ctx.cluster.eligible(trial, resources=wanted, gpu_only=True):
            budget.check()
            group = cand.group
            if id(group) in known or option.profile not in group.mig_profiles:
                continue
            profile = _profile(req, group, option.profile)
            have = group.allocatable.get(option.resource, Decimal(0))
            if profile is None or have <= 0 or not _covers(ask, profile, coverage):
                continue
            if not barred and profile != _smallest_covering(req, group, ask):
                continue  # the ask takes its smallest covering profile there: counted under that one alone
            if barred:
                known.add(id(group))
                full.append(Placement(group, profile, True))
                continue
            taken = frozenset(k for k, a in sizes.items() if _smallest_covering(req, group, a) == profile)
            if (option, taken) not in needs:
                taking = [a for a in pending if (a.kind, a.amount) in taken]
                needs[option, taken] = requested_resources(_trial(pod, pending, ask, option, plugin, taking)).get(
                    option.resource, Decimal(0)
                )
            need = needs[option, taken]
            if have < need:
                known.add(id(group))
                out.append((group, (option.profile, option.resource, int(have), int(need))))
    return out, full


def _too_few_words(short: Sequence[tuple[NodeGroup, tuple[str, str, int, int]]]) -> str:
    """``_too_few``'s groups in words, one line a pool: of its groups, the one that needs the most (a pool of two
    node shapes was said twice, with two counts: a review of MIG)."""
    by_pool: dict[str, tuple[str, str, int, int]] = {}
    for group, entry in short:
        if group.pool not in by_pool or entry[3] > by_pool[group.pool][3]:
            by_pool[group.pool] = entry
    return "".join(
        f" Pool {pool} offers {profile}, {have} a node, but with its other containers, this pod would need {need}"
        f" {resource} on one node."
        for pool, (profile, resource, have, need) in list(by_pool.items())[:3]
    )


def _smallest_covering(req: _Request, group: NodeGroup, ask: Ask) -> Profile | None:
    """The smallest profile the group's nodes offer that covers ``ask`` (as ``_rank`` orders them): the one it would
    take there. Of a group, it depends on the ask's kind and amount alone: worked out once per request."""
    key = (id(group), ask.kind, ask.amount)
    if key not in req.smallest:
        coverage = req.ctx.settings.mig.coverage
        covering = [
            p
            for name, offer in group.mig_profiles.items()
            if offer.count > 0 and (p := _profile(req, group, name)) and _covers(ask, p, coverage)
        ]
        req.smallest[key] = min(covering, key=lambda p: (p.gb, p.slices), default=None)
    return req.smallest[key]


def _warn_usable(out: Outcome, ask: Ask, choice: Choice, whose: str = "") -> None:
    """A memory ask given a device with less usable memory than asked (a 5 GB profile holds 4864 MiB): said, as
    ``whose`` device ('its pods' ', for a template whose pods are converted when created: ``Outcome.tell_pods``)."""
    if ask.kind != "memory":
        return
    warn = out.tell_pods if whose else out.warn
    given = choice.option.resource if choice.option.strategy == "mixed" else choice.option.profile
    usable = [p.usable_mib for p in choice.places if p.usable_mib]
    if usable and min(usable) * MIB < ask.amount:
        said = f"{whose}{given} has {min(usable)} MiB usable, less than the {_gib(ask.amount)} asked"
        warn(fit_warning(f"{ask.name}: {said}", ask.name))
    elif not usable:
        # Neither the node's label nor the table says its usable memory (A100 80GB, H100): the name's GB is
        # decimal, and below every usable figure known (mig.md); 40Gi on a 3g.40gb went unsaid (a review of MIG)
        named = [parsed[1] for p in choice.places if p.profile and (parsed := parse_name(p.profile.name))]
        if named and min(named) * 10**9 < ask.amount:
            said = f"{whose}{given} holds about {min(named)} GB, less than the {_gib(ask.amount)} asked"
            warn(fit_warning(f"{ask.name}: {said}", ask.name))


def _warn_shared(out: Outcome, ask: Ask, choice: Choice) -> None:
    """A device that a pool it may land on time-shares (GPU sharing on MIG devices: GFD's -SHARED product, a GKE
    time-sharing partition, a sharing-strategy label): said, since its memory and compute are shared with the
    other pods given the same device; where dedicated pools offer it too and no label pins the pod to them
    (``_own_devices``), the shared pools are named (it was said only where every pool shared it: a review of
    MIG)."""
    if not choice.places or choice.option.strategy in ("whole", "shared"):
        return  # no MIG device, or a fallback whose note says it
    shared = [p.group for p in choice.places if p.group.sharing != "none"]
    if not shared:
        return
    given = choice.option.resource if choice.option.strategy == "mixed" else choice.option.profile
    sharing = "/".join(sorted({g.sharing for g in shared}))
    head, tail = f"{ask.name}: {given} is {sharing} ", ": shared with other pods, its memory not its own"
    if len(shared) == len(choice.places):
        out.warn(fit_warning(f"{head}there{tail}", ask.name))
    else:
        out.warn(_pool_warning(f"{head}on ", shared, tail, ask.name))


def _pools(groups: Iterable[NodeGroup], room: int | None = None) -> str:
    """'pool a' or 'pools a, b, c and 2 more', in at most ``room`` characters where given (``pool_names``;
    never the lines' separator)."""
    return pool_names(groups, 3, room).replace(record.SEPARATOR, ", ")


def _pool_warning(head: str, groups: Sequence[NodeGroup], tail: str, name: str = "") -> str:
    """``fit_warning`` of ``head``, the pools and ``tail``: as many pool names as the room leaves, the rest counted
    ('pools a, b and 3 more'), so that the advice after them stays whole and no name is cut in its middle (a long
    pool's name, cut at 119 characters, read as another pool's: found by a review of MIG)."""
    if name:  # the room the pools get is what is left by the container's name as the warning shows it
        head = head.replace(name, shown_name(head + _pools(groups) + tail, name), 1)
    least = len(_pools(groups, 0))  # the pools counted ('3 pools'): pool_names gives no less
    if len(head) + least + len(tail) > WARNING_LIMIT:  # the tail makes the room, its end (what to do) kept
        tail = middle_clipped(tail, max(WARNING_LIMIT - len(head) - least, 16))
    return fit_warning(head + _pools(groups, WARNING_LIMIT - len(head) - len(tail)) + tail, name)


OVERSIZED = 4
"""A profile holding more than this many times the ask is said: a unit slip (``1e-9``, ``20Mi`` for ``20Gi``) reads
the same as a real ask, and the container holds the whole profile. Plain rounding stays under it: 0.1 -> 1/8
(1.25x), 0.3 -> 4/8 (1.7x); 0.03 -> 1/8 (4.2x) is said (ask for 0.125 to say that is meant)."""


def _warn_oversized(out: Outcome, ask: Ask, choice: Choice, coverage: str) -> None:
    profiles = [p.profile for p in choice.places if p.covers and p.profile]
    if not profiles:
        return  # a fallback: its note says it
    if ask.kind == "memory":
        gb = min(p.gb for p in profiles)
        if Decimal(gb) * GIB <= OVERSIZED * ask.amount:
            return
        what, suggest, check = f"{gb}GB", f"{gb}Gi", "the unit"
    else:

        def share(p: Profile) -> Decimal:
            memory, compute = Decimal(p.eighths) / 8, Decimal(p.slices) / p.total_slices
            return {"memory": memory, "compute": compute}.get(coverage, min(memory, compute))

        smallest = min(profiles, key=share)
        if share(smallest) <= OVERSIZED * ask.amount:
            return
        memory = Decimal(smallest.eighths) / 8 <= Decimal(smallest.slices) / smallest.total_slices
        by_memory = coverage == "memory" or (coverage == "both" and memory)
        what = f"{smallest.memory_share} memory" if by_memory else f"{smallest.compute_share} compute"
        suggest, check = _plain(share(smallest).quantize(Decimal("0.001"), ROUND_DOWN)), "it"
    said = f"gets {choice.option.profile} ({what}), over {OVERSIZED}x the ask: check {check} or ask for {suggest}"
    out.warn(fit_warning(f"{ask.name}: {ask.asked} {said}", ask.name))


def _warn_untagged(out: Outcome, choice: Choice, ctx: Context) -> None:
    """A mixed-strategy device that only pools at zero offer, some of them groups whose Cluster Autoscaler template
    node has only the extended resources their tags name (EKS's ASG: ``Presets.resource_tags``): the tag to set is
    said, once for the pod, whatever its containers. Without it the autoscaler never scales the group up for a pod
    asking ``nvidia.com/mig-<profile>``, and the pod stays Pending (its NotTriggerScaleUp Event the only word)."""
    if choice.option.strategy != "mixed":
        return
    for tags in _untagged(choice.option.resource, [p.group for p in choice.places], ctx):
        groups = [g for _, gs in tags for g in gs]
        full = f"mig: {_pools(groups)} at zero {'needs' if len(groups) == 1 else 'need'} ASG tag {tags[0][0]}"
        if len(tags) == 1 and len(full) <= WARNING_LIMIT:
            out.warn(full)
        else:  # the pools' names kept whole, the tag (too long beside them) in the pod's Event
            out.warn(_pool_warning("mig: ", groups, f" at zero: ASG tag needed ({UNTAGGED} Event)"))


UNTAGGED = "MIGUntagged"


def _untagged(resource: str, offering: Sequence[NodeGroup], ctx: Context) -> list[list[tuple[str, list[NodeGroup]]]]:
    """Where only pools at zero offer ``resource`` (``nvidia.com/mig-<profile>``), per tag key, the tags to set on
    those whose Cluster Autoscaler template node has only the extended resources their tags name (EKS's ASG:
    ``Presets.resource_tags``), each with its pools: the resource's tag, valued the devices one node gives (the
    Cluster Autoscaler AWS README: the tag's value is the amount). None where a pool offering it needs no tag (a
    Karpenter NodePool at zero beside the EKS nodegroup): the pod gets a node there, and it was told it stays
    Pending (a review of MIG)."""
    profile = resource.removeprefix(MIG_RESOURCE_PREFIX)
    tagged = ctx.cluster.presets.resource_tags.keys()
    if profile == resource or not offering or any(g.nodes or tagged.isdisjoint(g.labels) for g in offering):
        return []
    out: list[list[tuple[str, list[NodeGroup]]]] = []
    for key, prefix in sorted(ctx.cluster.presets.resource_tags.items()):
        by_tag: dict[str, list[NodeGroup]] = {}
        for g in sorted((g for g in offering if key in g.labels), key=lambda g: g.pool):
            offer = g.mig_profiles.get(profile)
            by_tag.setdefault(f"{prefix}{resource}" + (f"={offer.count}" if offer else ""), []).append(g)
        if by_tag:
            out.append(sorted(by_tag.items()))
    return out


def _say_untagged(out: Outcome, name: str, resource: str, reached: Sequence[NodeGroup], ctx: Context) -> None:
    """``_warn_untagged``'s advice as a Warning Event on the pod, every pool named whole: a pod its controller
    creates (a gpu-memory ask or a fraction annotation, converted on each pod) had it in a warning no one reads.
    Its words name no pod, so that the Events of a workload's pods are one."""
    for tags in _untagged(resource, reached, ctx):
        groups = [g for _, gs in tags for g in gs]
        values = "; ".join(f"{pool_names(gs, len(gs))}: {tag}" for tag, gs in tags)
        out.event(
            UNTAGGED,
            f"container {name} asks for {resource}; {pool_names(groups, len(groups))} at zero"
            f" {'offers' if len(groups) == 1 else 'offer'} it, and Cluster Autoscaler scales such a node group up"
            " for it only where its Auto Scaling group carries the tag naming the resource, valued the devices one"
            f" node gives ({values}); without it the pod stays Pending. Add the tag to the Auto Scaling group.",
            "Warning",
        )


def _state_line(name: str, container: JSON, spec: JSON) -> str | None:
    """What a container with a MIG device (or shared GPU) holds, when its prior line no longer says it."""
    tokens = _state_tokens(container, spec)
    if not tokens or not _assigned(container, spec):
        return None
    return f"{name}: {tokens[0]} (as found on the object)"


def _is_mig(line: Line) -> bool:
    """Whether the line names a MIG device: a mixed-strategy resource, the nodeSelector of a single-strategy
    product or a GKE partition size, or the profile of a single-strategy pool at zero (``Line.profile``)."""
    given = line.given
    return (
        bool(line.profile) or given.startswith(MIG_RESOURCE_PREFIX) or "-MIG-" in given or GKE_PARTITION_LABEL in given
    )


def _given_instead(pod: PodView, ctx: Context, line: Line) -> list[NodeGroup]:
    """For a line of a single-strategy pool at zero (``Line.profile``): the groups with nodes the pod reaches whose
    ``nvidia.com/gpu`` is another device, now that the pool has nodes. Its pin to the pool's own label takes any
    device the pool gives (a 3g.40gb's pod ran on the 1g.10gb, 1/8 of the GPU, of a pool that came up with another
    layout, without a word: a review of MIG)."""
    return [g for g in _reached_now(pod, ctx) if _single_profile(g) != line.profile]


def _reached_now(pod: PodView, ctx: Context) -> list[NodeGroup]:
    """The groups with nodes now where the pod, as it stands, gets its ``nvidia.com/gpu``."""
    rules = _trial(pod, [], None, None, ctx.cluster.extended_resource_toleration)
    reached = ctx.cluster.eligible(rules, resources={GPU_RESOURCE: Decimal(1)}, gpu_only=True)
    return [c.group for c in reached if c.group.nodes]


def _read_line(ctx: Context, text: str) -> Line:
    """A container's line, its pin read (``all_pin_keys``); a line of a single-strategy pool at zero as versions
    before ``Line.profile`` wrote it (and ``_line`` keeps) given the profile its pool declares, where the pools its
    pin names declare one (``_declared_profiles``): its pods are checked as the newer line's are."""
    line = record.parse(text, all_pin_keys(ctx))
    declared = _declared_profiles(ctx, line)
    return replace(line, profile=declared.pop()) if declared is not None and len(declared) == 1 else line


def _declared_profiles(ctx: Context, line: Line) -> set[str] | None:
    """For a line of a single-strategy pool at zero that names no profile, as versions before ``Line.profile``
    wrote it ('nvidia.com/gpu 0.4 -> nvidia.com/gpu 1 (pinned to eks.amazonaws.com/nodegroup=a100-mig, ...)': no
    other conversion gives a plain ``nvidia.com/gpu 1`` without a fallback's note): the MIG profiles that the
    declared single-strategy pools its pin names declare now; None for any other line."""
    if line.profile or not line.conversion or line.given != f"{GPU_RESOURCE} 1" or line.pin is None:
        return None
    if line.note in (record.WHOLE_NOTE, record.SHARED_NOTE):
        return None
    key, values = line.pin
    pools = [p for p in ctx.settings.cluster.pools if p.mig_strategy == "single" and p.node_selector.get(key) in values]
    ask = _line_ask(line)
    return {
        name
        for p in pools
        for name, count in p.mig_profiles.items()
        if count > 0 and ask is not None and _declared_covers(p, name, ask, ctx.settings.mig.coverage)
    }


def _line_ask(line: Line) -> Ask | None:
    """The ask a conversion's line records ('nvidia.com/gpu 0.4', 'gpu-admission.io/gpu-memory 20Gi'); None where
    it cannot be read back."""
    resource, _, amount = line.asked.partition(" ")
    try:
        value = parse_quantity(amount)
    except QuantityError:
        return None
    kind: Kind = "fraction" if resource == GPU_RESOURCE else "memory"
    return Ask("", line.name, {}, kind, value, line.asked)


def _declared_covers(pool: PoolSettings, name: str, ask: Ask, coverage: str) -> bool:
    """Whether the profile ``name`` a declared pool offers holds ``ask`` as a conversion would have judged it: a
    profile declared after the conversion (3g.40gb made 1g.10gb) is not taken for the one the line was converted
    to (a review's: a pod converted for 3g.40gb was said to get 'not MIG 1g.10gb', and one on a 1g.10gb passed)."""
    model = load_table().model_for(pool.gpu_product, "", pool.gpu_memory_mib, pool.mig_profiles)
    profile = model.lookup(name) if model else None
    return profile is not None and _covers(ask, profile, coverage)


def _single_profile(group: NodeGroup) -> str:
    """The MIG profile a single-strategy group's nvidia.com/gpu is ('' for a whole GPU)."""
    return group.labels.get(PRODUCT_LABEL, "").removesuffix(SHARED_SUFFIX).partition("-MIG-")[2]


# ---------------------------------------------------------------------------------------------------------------
# The policy


def _say_off(pod: PodView, out: Outcome) -> None:
    """With ``mig.enabled`` false nothing is converted: a pod that asks for a fraction, a memory size or the annotation
    is told so (else the annotation is dropped without a word, and a memory request waits for a node forever)."""
    off = "not converted (MIG conversion is off here): ask for a MIG resource"
    for _, name, container in named(pod):
        for key in (GPU_RESOURCE, GPU_MEMORY_RESOURCE):
            read = _read(container, key, name)
            whole = read is not None and read.amount is not None and read.amount == read.amount.to_integral_value()
            if read is not None and not (key == GPU_RESOURCE and whole):
                out.warn(fit_warning(f"{name}: {key} {read.text} {off}", name))
    raw = pod.annotation("gpu-fraction")
    if raw is not None:
        out.warn(fit_warning(f"{FRACTION_ANNOTATION} {raw.strip()} {off}", ""))


@dataclass
class _Pass:
    """One pass over the asks in one order: what it says (merged into the request's outcome once it is the pass
    kept), what it converted (by container id), and whether every ask got a MIG profile."""

    said: Outcome = field(default_factory=Outcome)
    converted: dict[int, tuple[Ask, Choice]] = field(default_factory=dict)
    complete: bool = True
    failed: tuple[int, ...] = ()
    """The ids of the asks up to the first one left without a profile: every order that starts so fails too."""


def _convert(req: _Request, pod: PodView, asks: Sequence[Ask], stop: bool = False, retried: bool = False) -> _Pass:
    """Choose and apply a profile for each ask in this order; ``stop``: give up at the first ask without one;
    ``retried``: at such an ask past the first, where other orders are tried then (``mutate``) and this pass is
    done again if none fits: its refusals would be thrown away, each worked out over every pool."""
    done = _Pass()
    out = done.said
    pending = list(asks)
    deferred_asks: list[Ask] = []
    for index, ask in enumerate(asks):
        pending.remove(ask)
        # what PodView.defers_gpu says of the whole template, for this ask
        deferred = pod.is_template and (ask.kind == "memory" or ask.source == "annotation")
        choice, seen, barred, unpinned = _choose(req, pod, pending, ask)
        if choice is not None and not _runs(req, choice):
            # a whole (or shared) GPU whose driver runs the pod's CUDA, over a profile where none does
            fallback = _fallback(req, pod, pending, ask)
            if fallback is not None and _runs(req, fallback):
                choice = fallback
        if choice is None:
            if done.complete:
                done.complete = False
                done.failed = tuple(id(a) for a in asks[: index + 1])
                if stop or (retried and index > 0):
                    return done
            choice = _fallback(req, pod, pending, ask)  # every ask left without a profile, not the first alone
        if deferred:
            # Templates keep memory and annotation requests (Kubernetes accepts them); the pods get converted.
            pending.append(ask)
            deferred_asks.append(ask)
            continue
        if choice is None:
            refusal = _refusal(req, pod, pending, ask, seen, barred, unpinned)
            out.deny(POLICY, "MIGNoProfile", refusal, container=ask.name)
            pending.append(ask)
            continue
        choice = _apply(pod, ask, choice, req.ctx.cluster.extended_resource_toleration)
        done.converted[id(ask.container)] = (ask, choice)
        _warn_usable(out, ask, choice)
        _warn_shared(out, ask, choice)
        _warn_oversized(out, ask, choice, req.ctx.settings.mig.coverage)
        _warn_untagged(out, choice, req.ctx)
        if choice.note:
            out.warn(fit_warning(f"{ask.name}: {ask.asked} -> {choice.option.given} ({choice.note})", ask.name))
        out.mutated("mig")
        out.reasons.append("MIGConverted" if not choice.note else "MIGFallback")
    for ask in deferred_asks:
        _warn_deferred(req, pod, [a for a in deferred_asks if a is not ask], ask, out)
    return done


KUEUE_TEMPLATE_KINDS = frozenset({"Job", "CronJob"})
"""The workloads whose quota Kueue reckons from their pod template; a queued Deployment's or StatefulSet's is
reckoned from each pod, converted by then (Kueue's pod integration)."""
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
"""The label that puts a Job in a Kueue LocalQueue (on a CronJob: on its job template, which its Jobs get)."""


def _kueue_queue(pod: PodView) -> str:
    """The Kueue queue a Job or CronJob is in ('' when none): Kueue reckons its quota from its template, where a
    memory size or the fraction annotation is left for the pods to convert: Kueue then finds the memory resource in
    no ClusterQueue (the workload waits for ever) or charges no GPU for the annotation (a review of the webhook with
    Kueue). A fraction of ``nvidia.com/gpu`` is converted in the template."""
    job = as_dict(as_dict(pod.root.get("spec")).get("jobTemplate")) if pod.kind == "CronJob" else pod.root
    queue = as_dict(as_dict(job.get("metadata")).get("labels")).get(KUEUE_QUEUE)
    return queue if isinstance(queue, str) else ""


def _warn_deferred(req: _Request, pod: PodView, others: Sequence[Ask], ask: Ask, out: Outcome) -> None:
    """A template's ask left for its pods to convert: judged where the template leaves them, after the other
    containers' conversions (a sidecar's pin to a single-strategy product took every profile that held it away),
    and said now where every pod would be refused: no profile holds it, or only where the driver is too old for the
    pod's CUDA (found by a generative review: the template was admitted without a word, and each pod refused)."""
    if pod.kind in KUEUE_TEMPLATE_KINDS and _kueue_queue(pod):  # Kueue reckons quota from the template as written
        said = "Kueue sees it as written, in no ClusterQueue" if ask.kind == "memory" else "Kueue charges no GPU for it"
        out.warn(fit_warning(f"{ask.name}: {ask.asked}: {said}; ask a nvidia.com/gpu fraction", ask.name))
    choice, seen, barred, unpinned = _choose(req, pod, others, ask)
    if choice is not None and _runs(req, choice):
        # said to whoever applies the workload: the pods' own warning goes to their controller, unread (a review
        # of real manifests: a Deployment's 5Gi got a 1g.5gb of 4864 MiB without a word)
        _warn_usable(out, ask, choice, "its pods' ")
        return
    # as ``_convert`` gives each pod: the fallback (mig.fallback) where no profile covers the ask, or only where the
    # driver is too old for the pod's CUDA (found by a review: with fallback whole, a workload's 60Gi was said to
    # have its pods refused, each of which got a whole GPU)
    fallback = _fallback(req, pod, others, ask)
    if fallback is not None and _runs(req, fallback):
        given = f"{ask.name}: {ask.asked}: its pods get {fallback.option.given} ({fallback.note})"
        out.tell_pods(fit_warning(given, ask.name))
        return
    held = choice if choice is not None else fallback  # what each pod gets, as ``_convert`` gives it
    if held is not None:
        # refused for their CUDA, not for the size: no advice to ask for less (found by a review: with fallback
        # whole, a CUDA 13 workload's 60Gi was told so, and each pod got a whole GPU, refused for its CUDA). The
        # reason before the places; where the products and pools do not fit, the pools alone, cut at a name
        head = f"{ask.name}: {ask.asked}: its pods are refused: only a driver too old for their CUDA offers it ("
        text = f"{head}{_where(held.places)})"
        groups = [p.group for p in held.places]
        out.refuse_pods(text if len(text) <= WARNING_LIMIT else _pool_warning(head, groups, ")", ask.name))
        return
    largest = max(
        (p.profile for p in seen if p.profile),
        key=lambda p: (p.gb if ask.kind == "memory" else p.eighths, p.slices),  # what the ask measures
        default=None,
    )
    if unpinned:  # a profile covers it: asking for less is no help (``_unpinned_words``)
        said = f"no label pins them to {_pools(p.group for p in unpinned[0][0])} off other pools, so"
    elif barred:
        # pools that cover it give every nvidia.com/gpu as a MIG device, and other containers ask whole GPUs: the
        # pods' refusal names them (``_refusal``); the workload was told no eligible node offers MIG (a review)
        # the tail short, as the pools' names are what the warning is for (a review: a name past 11 characters cut)
        tail = ", not beside whole GPUs: pods refused"
        out.refuse_pods(_pool_warning(f"{ask.name}: {ask.asked}: held by ", [p.group for p in barred], tail, ask.name))
        return
    elif seen:
        said = f"largest offered is {largest.name if largest else 'no MIG profile'}; ask for less or"
    else:
        said = "no eligible node offers MIG now, so"
    out.refuse_pods(fit_warning(f"{ask.name}: {ask.asked}: {said} its pods are refused", ask.name))


def _orders(asks: Sequence[Ask]) -> Iterator[list[Ask]]:
    """The other orders worth a pass, at most 26: the largest asks first (memory sizes, then fractions), the
    reverse, and for up to 4 asks every order (from the largest-first one, so that what is found does not depend on
    the order the containers are written in)."""
    largest = sorted(asks, key=lambda a: (a.kind != "memory", -a.amount, a.list_name, a.name))
    tried = {tuple(id(a) for a in asks)}
    more = itertools.permutations(largest) if len(asks) <= 4 else ()
    for order in itertools.chain([largest, list(reversed(asks))], more):
        key = tuple(id(a) for a in order)
        if key not in tried:
            tried.add(key)
            yield list(order)


MAX_POOLS_TRIED = 16
"""The most pools the pool pass tries one by one (``_on_one``): a refusal's work stays bounded on large clusters."""


def _on_one(
    req: _Request, pod: PodView, asks: Sequence[Ask], saved: Sequence[tuple[JSON, str, object]]
) -> _Pass | None:
    """A pass in which every ask is converted on one GPU model, tried model by model (the smaller first), then on
    one pool, pool by pool, where no order of the asks found each a profile: each ask's smallest profile can be on
    different models or pools, and the first took the only place where the next finds none (two 0.5: an
    A100-40GB's one 3g.20gb a node, while an A100-80GB offers two 3g.40gb; 0.5 and 0.3: a pool of one 4g.40gb a
    node, another of two 7g.80gb; generative reviews). The pin stays (each choice was made for that place alone:
    a single-strategy or GKE GPU is a bare nvidia.com/gpu elsewhere), named by the first conversion's line, unless
    a conversion's own nodeSelector implies it. None where no place fits all."""
    mig_groups = [g for g in req.ctx.cluster.gpu_groups if g.mig_profiles]
    models: dict[str, list[NodeGroup]] = {}
    pools: dict[str, list[NodeGroup]] = {}
    for group in mig_groups:
        models.setdefault(_product(group), []).append(group)
        pools.setdefault(group.pool, []).append(group)

    def smaller_first(place: tuple[str, list[NodeGroup]]) -> tuple[int, str]:
        return min(g.gpu_memory_mib or 1 << 30 for g in place[1]), place[0]  # memory unknown: last

    places = sorted(models.items(), key=smaller_first) if len(models) > 1 else []
    known = {frozenset(map(id, groups)) for groups in models.values()}  # a pool that is a model was tried as one
    places += [p for p in sorted(pools.items(), key=smaller_first) if frozenset(map(id, p[1])) not in known][
        :MAX_POOLS_TRIED
    ]
    for _, groups in places:
        budget.check()
        done = _converted_on(req, pod, asks, saved, groups, [g for g in mig_groups if all(g is not m for m in groups)])
        if done is not None:
            return done
    return None


def _converted_on(
    req: _Request,
    pod: PodView,
    asks: Sequence[Ask],
    saved: Sequence[tuple[JSON, str, object]],
    groups: Sequence[NodeGroup],
    others: Sequence[NodeGroup],
) -> _Pass | None:
    """Every ask converted with the pod pinned to ``groups`` (off ``others``); None where that fails."""
    pin = _pin(groups, others, _pin_keys(req.ctx), req.ctx.cluster.presets.pool_steered)
    if pin is None:
        return None
    _restore(saved)
    key, values = pin
    if len(values) == 1 and as_dict(pod.spec.get("nodeSelector")).get(key, values[0]) != values[0]:
        return None
    record.write_pin(pod, pin)
    done = _convert(req, pod, asks, stop=True)
    first = next((done.converted[id(a.container)] for a in asks if id(a.container) in done.converted), None)
    if not done.complete or first is None or first[1].pin is not None:
        return None
    ask, choice = first
    selectors = {c.option.selector for _, c in done.converted.values() if c.option.selector}
    implied = [s for s in selectors if s[0] == key and s[1] in values]
    if not implied:  # the note is only for the line: the choice was converted, not a fallback
        done.converted[id(ask.container)] = (ask, replace(choice, pin=pin, note=choice.note or record.TOGETHER))
    elif len(values) > 1:  # a conversion's own nodeSelector holds the pod to one of the place's values
        unnarrow(pod, [[expression(key, "In", values)]])
    return done


_ABSENT = object()


def _saved(pod: PodView, asks: Sequence[Ask]) -> list[tuple[JSON, str, object]]:
    """A copy of what a pass may change, to undo it: each asking container's resources, and the spec's
    nodeSelector, tolerations and affinity (``_apply``, ``_keep_gpu_toleration``, ``affinity.require``)."""
    places = [(a.container, "resources") for a in asks]
    places += [(pod.spec, key) for key in ("nodeSelector", "tolerations", "affinity")]
    return [(where, key, copy_json(where[key]) if key in where else _ABSENT) for where, key in places]


def _restore(saved: Sequence[tuple[JSON, str, object]]) -> None:
    for where, key, value in saved:
        if value is _ABSENT:
            where.pop(key, None)
        else:
            where[key] = copy_json(value)


MAX_ASKS = 56
"""The most MIG devices a pod may ask for: a GPU holds at most 7 instances, a node 8 GPUs. Choosing a device per ask
checks the others' choices each time, so the work grows with the square of the asks: 999 asks took 68 s, during
which the worker answered no other review (found by a review that attacked the real server)."""


def mutate(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Turn each container's fraction or memory request into a MIG device, or refuse it with a reason."""
    if not ctx.settings.mig.enabled:
        _say_off(pod, out)
        return
    asks = _collect(pod, ctx, out)
    if len(asks) > MAX_ASKS:
        out.deny(
            POLICY,
            "MIGTooManyDevices",
            f"{len(asks)} containers ask for a fraction or a memory size of a GPU, each to become a MIG device of "
            f"its own: more than the {MAX_ASKS} a node can offer at most (8 GPUs of 7 instances). Give several of "
            "them one device (one container), or ask for whole GPUs.",
        )
        return
    prior = record.lines_of(ctx)
    if not asks:  # the lines of an earlier pass (or of the workload's template) are said again, or reworded
        if prior:
            out.finish.append(lambda: _describe(pod, ctx, out, prior, {}, {}))
        return
    req = _Request(ctx)
    req.options = _options(ctx)
    req.whole = _whole_gpus(pod, [a.container for a in asks])
    supported = cuda.supported_groups(pod, ctx)
    req.supported = None if supported is None else frozenset(id(g) for g in supported)
    req.spot_first = "SpotPrefer" in out.reasons
    req.spot_mode = spot.decided_mode(out)
    own = dict(as_dict(pod.spec.get("nodeSelector")))
    daemons = _daemon_nodes(pod, ctx)  # before the conversion's pins
    saved = _saved(pod, asks) if len(asks) > 1 else None
    done = _convert(req, pod, asks, retried=saved is not None)
    if not done.complete and saved is not None and len(done.failed) > 1:
        # Each container takes the smallest profile that covers it, in turn, so an earlier container can take a
        # profile only a GPU model offers where a later one finds nothing (a: 0.25 takes an A100-40GB's 1g.10gb,
        # b: 0.5 then has no 3g there), while the other order fits both on an A100-80GB. Other orders are tried
        # only here, once the containers' own order left one without a profile. Passes are deterministic, and a
        # converted ask only takes nodes away from the others: an order that starts as a failed one did fails
        # too, and an ask without a profile while it comes first has none in any order. None fitting, the
        # refusal is the one the containers' own order gives.
        failed = {done.failed}
        for order in _orders(asks):
            ids = tuple(id(a) for a in order)
            if any(ids[:n] in failed for n in range(1, len(ids))):
                continue
            _restore(saved)
            done = _convert(req, pod, order, stop=True)
            if done.complete or len(done.failed) == 1:
                break
            failed.add(done.failed)
        if not done.complete:
            done = _on_one(req, pod, asks, saved) or done
        if not done.complete:
            _restore(saved)
            done = _convert(req, pod, asks)
    out.merge(done.said)
    converted = done.converted
    if converted or prior:
        out.finish.append(lambda: _describe(pod, ctx, out, prior, converted, own))
    if converted and daemons:
        after = {id(g) for g in _daemon_nodes(pod, ctx)}
        pinned_off = [g for g in daemons if id(g) not in after]
        out.finish.append(lambda: _warn_daemonset(pod, ctx, out, pinned_off))


def _warn_daemonset(pod: PodView, ctx: Context, out: Outcome, pinned_off: Sequence[NodeGroup]) -> None:
    """A DaemonSet runs a pod on every node it selects, and its template was converted to one device for all of
    them: the pools its pods get none on are said, those the conversion's pin or nodeSelector keeps it off (no
    pod) and those that do not offer the device (a Pending pod for good). One template cannot ask each node for its
    own profile; the fraction annotation, converted on each pod for its node, can (a review of MIG: its pods on
    another GPU model stayed Pending, or the DaemonSet was shrunk to one model, without a word)."""
    advice = f"use annotation {FRACTION_ANNOTATION}"  # the pools first: a long pool name cuts the advice
    if pinned_off:
        out.warn(_pool_warning("mig: no DaemonSet pod on ", pinned_off, f" (pinned off): {advice}"))
    if pending := _daemon_pending(pod, ctx, _served(pod, ctx)):
        out.warn(_pool_warning("mig: DaemonSet pods Pending on ", pending, f" (no such device): {advice}"))


def _describe(
    pod: PodView,
    ctx: Context,
    out: Outcome,
    prior: Mapping[str, str],
    converted: Mapping[int, tuple[Ask, Choice]],
    own: Mapping[str, object],
) -> None:
    """Write the annotation's lines once every mutating policy has run: each names where the final pod can get its
    GPU (the cuda policy's steering, after this policy, can narrow it), so that a second pass, and the validating
    webhook's Event, find the same words."""
    where_now = _where_now(pod, ctx)
    keys = all_pin_keys(ctx)
    lines: list[str] = []
    for _, name, container in named(pod):
        unseen = not where_now and name in prior and _node_unseen(pod, ctx, prior[name])
        if id(container) in converted:
            lines.append(_line(*converted[id(container)], where_now, own, prior.get(name)))
        elif _republishable(prior.get(name), container, pod, where_now, keys, unseen):
            lines.append(prior[name])
        elif (not where_now or record.stored(ctx, prior.get(name, ""))) and (
            reworded := _reworded(prior.get(name), container, pod, where_now, keys)
        ):
            lines.append(reworded)
        elif name in prior:
            state = _state_line(name, container, pod.spec)
            if state:
                lines.append(state)
    if lines:
        text = escaped(record.SEPARATOR.join(lines))  # a resource name a line names is the user's too
        out.annotate(record.ANNOTATION, text)
        if converted:
            out.audit["mig"] = text


def validate(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Refuse what the mutator could not convert, and two MIG devices in one container; report assignments."""
    if not ctx.settings.mig.enabled:
        return
    confirmed: list[str] = []
    prior = record.lines_of(ctx)
    where_now: str | None = None
    for _, name, container in named(pod):
        gpu = _read(container, GPU_RESOURCE, name)
        if gpu and gpu.amount is not None and gpu.amount != gpu.amount.to_integral_value():
            out.deny(
                POLICY,
                "MIGUnconverted",
                f"container {name} still asks for {GPU_RESOURCE} {gpu.text}: the mutating webhook did not turn "
                f"it into a MIG profile (was it bypassed?); ask for a whole GPU or a MIG resource such as "
                f"{MIG_RESOURCE_PREFIX}3g.40gb.",
                container=name,
            )
        memory = _read(container, GPU_MEMORY_RESOURCE, name)
        if memory is not None and not pod.is_template:
            out.deny(
                POLICY,
                "MIGUnconverted",
                f"container {name} still asks for {GPU_MEMORY_RESOURCE} {memory.text}: the mutating webhook did "
                f"not turn it into a MIG profile, and no node offers that resource; ask for a MIG resource.",
                container=name,
            )
        migs = mig_resources(container)
        if len(migs) > 1:
            out.deny(
                POLICY,
                "MIGMultipleDevices",
                f"container {name} asks for {' and '.join(migs)}: a container can use one MIG device "
                f"(k8s-device-plugin#728); split the work over containers or ask for one profile.",
                container=name,
            )
        line = prior.get(name)
        parsed = _read_line(ctx, line or "")
        if line and _is_mig(parsed):
            where_now = where_now if where_now is not None else _where_now(pod, ctx)
            lands = not parsed.profile or not _given_instead(pod, ctx, parsed)
            if lands and _republishable(line, container, pod, where_now, all_pin_keys(ctx)):
                confirmed.append(line)
    if not pod.is_template and pod.annotation("gpu-fraction") is not None:
        target = pod.fraction_container()
        if (
            target is not None
            and not _assigned(target, pod.spec)
            and not holds_given(prior.get(escaped(as_str(target.get("name")))), target, pod.spec)
        ):
            out.deny(
                POLICY,
                "MIGUnconverted",
                f"annotation {FRACTION_ANNOTATION} asks for a GPU fraction for container "
                f"{as_str(target.get('name'))}, but it has no MIG device: the mutating webhook did not convert "
                f"it.",
            )
    if confirmed:
        out.event("MIGAssigned", "MIG devices: " + record.SEPARATOR.join(confirmed))
    _warn_whole_on_slices(pod, ctx, out, prior)
    if not pod.is_template:
        _warn_unoffered(pod, ctx, out, prior)


WHOLE_ON_SLICES = "MIGWholeOnSlices"


def _warn_whole_on_slices(pod: PodView, ctx: Context, out: Outcome, prior: Mapping[str, str]) -> None:
    """A pod whose whole ``nvidia.com/gpu`` (no fraction: ``_whole_gpus``, its converted containers aside) can land
    both on whole GPUs and on pools where every ``nvidia.com/gpu`` is a MIG device (single strategy, GKE
    partitions): the scheduler may give it a slice there (a 1g.5gb of 4.8 GiB for an H100 asked; it was admitted
    without a word, its cuda line naming the MIG pool as one that supports it: a review of MIG). Warned, not
    steered (the lead's decision): a warning, a Warning Event and the reason in the decision log, naming the pools,
    the slice and what to change. Nothing where only such pools reach it (the cluster's GPUs are slices), unless the
    cuda policy's steering is what keeps it off the whole GPUs (``_steered_off_whole``): then the pools' CUDA is
    said, with what gives it whole GPUs again. Its cost: the groups of MIG slices, kept per snapshot; where there are
    some, one eligibility of the pod (memoized by the view), over groups, not nodes, and, for a pod that only slices
    reach and whose cuda line says the steering keeps it off pools, one cuda assessment (groups by containers)."""
    slicing = ctx.cluster.policy_memo.per_settings(
        (POLICY, "slicing"),
        ctx.settings,
        lambda: tuple(g for g in ctx.cluster.gpu_groups if g.mig_strategy in SLICING),
        lambda _: 16,
    )
    if not slicing:
        return
    converted = [c for _, name, c in named(pod) if holds_given(prior.get(name), c, pod.spec)]
    whole = _whole_gpus(pod, converted)
    if not whole:
        return
    served = _served(pod, ctx)
    slices = [g for g in served if g.mig_strategy in SLICING]
    gpus = [g for g in served if g.mig_strategy not in SLICING]
    too_old = _steered_off_whole(pod, ctx) if slices and not gpus else []
    gpus = gpus or too_old
    if not slices or not gpus:
        return
    profiles = sorted({_slice_of(g) for g in slices})
    named_first, _, amount = whole[0].removesuffix(")").rpartition(f" ({GPU_RESOURCE} ")  # 'container b (.. 2)'
    first = named_first.removeprefix("init ").removeprefix("container ")
    who = first if len(whole) == 1 else f"{first} and {len(whole) - 1} more"
    head = f"mig: {who}: {GPU_RESOURCE} is MIG {', '.join(profiles[:2])}{'…' if len(profiles) > 2 else ''} on "
    by_pool: dict[str, set[str]] = {}  # each pool once: where each node is a group of its own too
    for g in slices:
        by_pool.setdefault(g.pool, set()).add(_slice_of(g))
    shown = "; ".join(f"pool {p} (MIG {', '.join(sorted(s))})" for p, s in sorted(by_pool.items())[:3])
    more = f" and {len(by_pool) - 3} more" if len(by_pool) > 3 else ""
    if too_old:  # selecting the whole GPUs would be denied: their driver is too old for its CUDA
        out.warn(_pool_warning(head, slices, ": alone runs its CUDA; use older CUDA or a newer driver", first))
        newest = max((g for g in too_old if g.cuda), key=lambda g: g.cuda or (), default=None)
        image = f"an image for CUDA {newest.cuda_text} or older" if newest else "an image for an older CUDA"
        lands = (
            f"only {_pools(slices)} {'runs' if len(by_pool) == 1 else 'run'} its CUDA (the steering gpu-admission"
            f" added keeps it off {cuda.listing(too_old)}): {shown}{more}"
        )
        change = f"To get whole GPUs, use {image}, or upgrade the driver of {_pools(too_old)}"
    else:
        out.warn(_pool_warning(head, slices, ": select the whole-GPU pool or model, or ask a fraction", first))
        lands = f"the pod can land on {', '.join(_gives(gpus))}, and on {shown}{more}"
        change = f"To keep it off the MIG slices, use {_selection(gpus, slices, ctx)}"
    count = int(parse_quantity(amount))  # a whole number (``_whole_gpus``), written 2 or 2000m
    if len(whole) > 1:
        gets = "each gets one such slice per GPU it asks, not whole GPUs"
    elif count == 1:
        gets = "it gets one such slice, not a whole GPU"
    else:
        gets = f"it gets {count} such slices, not {count} whole GPUs"
    out.event(
        WHOLE_ON_SLICES,
        f"{', '.join(whole[:3])}{' and more' if len(whole) > 3 else ''} {'asks' if len(whole) == 1 else 'ask'} for"
        f" whole GPUs, and {lands}, where every {GPU_RESOURCE} is a MIG device: there {gets}, as the scheduler places"
        f" it. {change}; to get a slice on purpose, ask for a fraction ({GPU_RESOURCE}: 0.5) or a memory size"
        f" ({GPU_MEMORY_RESOURCE}).",
        "Warning",
    )
    out.reasons.append(WHOLE_ON_SLICES)


def _steered_off_whole(pod: PodView, ctx: Context) -> list[NodeGroup]:
    """The whole-GPU groups (not MIG slices) that the cuda policy's steering keeps the pod off: those it reaches once
    the expressions the steering could have written (``steered``) are taken out, where its cuda line says the
    steering keeps it off pools (``cuda.STEERED_OFF``; a pod whose own affinity reads the same has no such words),
    and that its CUDA cannot run on (``cuda.assess``'s blocked groups). The expressions of the manifest kubectl
    applied stay, as ``cuda.forget`` keeps them. A review found a pod steered to a MIG pool alone, its whole GPUs
    given as slices without a word; a later one, a pod told the steering kept it off a pool whose driver runs its
    CUDA, the user's own pool selection taken out (or a cuda line forged to name the steering)."""
    found = steered(pod.spec, ctx) if cuda.STEERED_OFF in ctx.prior.get(cuda.POLICY, "") else []
    trial = replace(pod, spec=copy_json(pod.spec))  # unnarrow edits the terms in place
    if not found or not unnarrow(trial, [[e] for e in found], keep=manifest_expressions(pod)):
        return []
    blocked = cuda.assess(cuda.checks_of(pod, ctx), trial.spec, ctx, "").blocked_groups
    return [g for g in blocked if g.mig_strategy not in SLICING]


def _gives(gpus: Sequence[NodeGroup]) -> list[str]:
    """What the pools of ``gpus`` give: whole GPUs, or shares of one."""
    gives: list[str] = []
    if owned := [g for g in gpus if g.sharing == "none"]:  # time-sliced or MPS replicas are no whole GPUs
        gives.append(f"{_pools(owned)}, which {'gives' if len({g.pool for g in owned}) == 1 else 'give'} whole GPUs")
    if shared := [g for g in gpus if g.sharing != "none"]:
        ways = ", ".join(sorted({g.sharing for g in shared}))
        gives.append(f"{_pools(shared)}, where each {GPU_RESOURCE} is a share of a GPU ({ways})")
    return gives


def _selection(gpus: Sequence[NodeGroup], slices: Sequence[NodeGroup], ctx: Context) -> str:
    """The nodeSelector or node affinity that keeps a pod on ``gpus``, off ``slices``."""
    pin = _pin(gpus, slices, _pin_keys(ctx), ctx.cluster.presets.pool_steered)
    if pin is None:
        return f"a nodeSelector or node affinity on a label of {_pools(gpus)} alone"
    if len(pin[1]) == 1:
        return f"nodeSelector {pin[0]}: {pin[1][0]}"
    return f"node affinity {pin[0]} In {', '.join(pin[1][:3])}{' and more' if len(pin[1]) > 3 else ''}"


def _slice_of(group: NodeGroup) -> str:
    """The MIG profile every ``nvidia.com/gpu`` of a single-strategy or GKE group is."""
    named = _single_profile(group) if group.mig_strategy == "single" else group.labels.get(GKE_PARTITION_LABEL, "")
    return named or ", ".join(sorted(group.mig_profiles)) or "?"  # a declared pool at zero: what it declares


def _warn_unoffered(pod: PodView, ctx: Context, out: Outcome, prior: Mapping[str, str]) -> None:
    """A pod asking for a MIG device that no node it can run on (its nodeSelector, node affinity, matchFields and
    tolerations) offers now: it stays Pending, and the scheduler says only 'Insufficient nvidia.com/mig-3g.40gb' (or,
    for a device of a single-strategy or GKE node, that no node matches its nodeSelector). Most often its workload's
    fraction was converted before the GPUs were given another MIG layout: the template keeps the old profile, and
    applying the workload again converts it afresh. A DaemonSet's pod is made for each node its template selects,
    whatever the device its template asks (its pod for an A100-80GB node asked the 3g.20gb of the A100-40GB its
    template was converted for, and was told nothing, since another pool offered it: a review of MIG). Said as a
    warning and a Warning Event (the pods of a controller have no one to read a warning). Not while a MIG layout is
    changing (MIG Manager withholds the devices then), nor where the webhook knows no node or pool, nor where a pool
    offers the device and the pod reaches no node that offers any device now (``_reaches_devices``: a node joining)."""
    groups = ctx.cluster.groups
    if not groups or any(g.mig_changing for g in groups):
        return
    rules = _trial(pod, [], None, None, ctx.cluster.extended_resource_toleration)
    for _, name, container in named(pod):
        text = prior.get(name, "")
        line = _read_line(ctx, text)
        given = line.given if line.conversion and holds_given(text, container, pod.spec) else ""
        asks: list[tuple[str, dict[str, Decimal], Pin | None]] = [
            (r, {r: Decimal(1)}, None) for r in mig_resources(container)
        ]
        if given and line.selector and _is_mig(line):  # the pin to a single-strategy product or a GKE partition size
            asks.append((given, {GPU_RESOURCE: Decimal(1)}, line.selector))
        for what, wanted, selector in asks:
            offering = [g for g in groups if offers(g, wanted) and (selector is None or _labelled(g, selector))]
            reached = {id(c.group) for c in ctx.cluster.eligible(rules, resources=wanted, gpu_only=True)}
            if reachable := [g for g in offering if id(g) in reached]:
                if selector is None:
                    _say_untagged(out, name, what, reachable, ctx)
                continue
            if offering and not _reaches_devices(pod, ctx, selector):
                continue  # its node is not known yet, or offers no device yet: the device may come with the plugin
            _say_unoffered(pod, ctx, out, name, what, line if what == given else None, offering)
        if given and line.profile:
            _check_by_pool(pod, ctx, out, name, line, rules)
        elif given and (declared := _declared_profiles(ctx, line)) is not None and (up := _reached_now(pod, ctx)):
            _say_unchecked(out, name, line, declared, up)


def _say_unchecked(out: Outcome, name: str, line: Line, declared: set[str], up: Sequence[NodeGroup]) -> None:
    """``_warn_unoffered``'s words for a line of a single-strategy pool at zero as versions before ``Line.profile``
    wrote it, where the pools its pin names declare no profile, or several, that holds its ask: which device the pod
    gets on their nodes is not checked. A warning and a Warning Event, as ``_say_unoffered``'s: the pods of a
    controller have no one to read a warning (this one had no Event: a review of MIG)."""
    tail = " (an earlier version's line names none): apply its workload again"
    out.warn(_pool_warning(f"mig: {name}: MIG profile not checked on ", up, tail, name))
    one = len({g.pool for g in up}) == 1
    declare = "declares" if one else "declare"
    which = f"{declare} {' and '.join(sorted(declared))}" if declared else f"{declare} no MIG profile that holds it"
    out.event(
        "MIGNotChecked",
        f"container {name} was converted from {line.asked} to {GPU_RESOURCE} 1 ({PREFIX}{record.ANNOTATION}) by an"
        f" earlier version, pinned to its pool while the pool had no nodes, and its line names no MIG profile;"
        f" {_pools(up)} {'has' if one else 'have'} nodes now and {which}, so the device"
        " it gets there is not checked. Apply its workload again to convert it to a profile offered now, or to be"
        " told why none fits.",
        "Warning",
    )


def _check_by_pool(pod: PodView, ctx: Context, out: Outcome, name: str, line: Line, rules: JSON) -> None:
    """``_warn_unoffered`` for a line of a single-strategy pool at zero (``Line.profile``) once the pool has nodes:
    they give another device as ``nvidia.com/gpu`` (``_given_instead``), or none (a pool that came up with the mixed
    strategy offers nvidia.com/mig-3g.40gb): the pod stays Pending, and was told nothing, its line pinned by the
    pool's label naming no nodeSelector to check (a review's)."""
    if instead := _given_instead(pod, ctx, line):
        _say_given_instead(out, name, line, instead, _reached_now(pod, ctx))
        return
    wanted = {GPU_RESOURCE: Decimal(1)}
    if ctx.cluster.eligible(rules, resources=wanted, gpu_only=True) or not _reaches_devices(pod, ctx, None):
        return  # it gets its GPU (its profile, or the pool still at zero), or its node is joining
    offering = [g for g in ctx.cluster.groups if offers(g, wanted) and _single_profile(g) == line.profile]
    _say_unoffered(pod, ctx, out, name, f"MIG {line.profile} as {GPU_RESOURCE}", line, offering)


def _reaches_devices(pod: PodView, ctx: Context, selector: Pin | None) -> bool:
    """Whether the pod's placement rules reach a node that offers GPU devices now, or a declared pool (what its
    nodes will offer), but for ``selector`` (the nodeSelector of the conversion's device, which is what is asked).
    A DaemonSet's pod is made for a node as it joins, before the webhook's watch has seen it or while its device
    plugin and GFD are not up: it reaches none, and the device its template asks may come with the plugin (a pod on
    a new A100-40GB node was told its 3g.20gb is offered by no node it can run on, and to give its pool a MIG
    layout that offers it, which the pool had: found by a review of MIG). A seen CPU node counts: no device comes to
    it (a pod made for one kept its template's line, as if its node were not seen: a review); a GPU node joining
    (``ClusterView.joining``) does not (a GPU node mid-join was taken for a CPU node, and its DaemonSet pod told it
    stays Pending: a review)."""
    rules = _placement_rules(pod)
    if selector is not None:
        rules["nodeSelector"] = {k: v for k, v in as_dict(rules.get("nodeSelector")).items() if k != selector[0]}
    return any(not ctx.cluster.joining(c.group) for c in ctx.cluster.eligible(rules, gpu_only=False))


def _labelled(group: NodeGroup, selector: Pin) -> bool:
    key, (value,) = selector
    return group.labels.get(key) == value


def _say_unoffered(
    pod: PodView, ctx: Context, out: Outcome, name: str, what: str, line: Line | None, offering: Sequence[NodeGroup]
) -> None:
    """``_warn_unoffered``'s words: no node or declared pool offers the device, or none the pod can run on (the
    pools that do named); from the conversion's ``line``, what it was converted from and how to convert it afresh,
    or for a DaemonSet's pod, what helps (applying it again converts its template to the same device)."""
    groups = ctx.cluster.groups
    if not offering:
        warned = f"mig: {name} asks {what}, which no node or pool offers now: it stays Pending"
        said = f"which no node or declared pool offers ({_offered_now(groups)})"
    else:
        warned = f"mig: {name} asks {what}, which no node it can run on offers now: it stays Pending"
        offer = "offers" if len({g.pool for g in offering}) == 1 else "offer"
        said = (
            f"which no node it can run on offers ({_pools(offering)} {offer} it, out of the pod's nodeSelector, node"
            " affinity or tolerations)"
        )
    out.warn(fit_warning(warned, name))
    hint = ""
    if offering and pod.owner_kind == "DaemonSet":
        if targets := [c.group for c in ctx.cluster.eligible(_placement_rules(pod), gpu_only=True)]:
            hint = (
                f" Its DaemonSet's template asks this one device of every node it selects: give {_pools(targets)} a"
                f" MIG layout that offers it, keep the DaemonSet off it (a nodeSelector or node affinity), or ask the"
                f" fraction by annotation {FRACTION_ANNOTATION}, which is converted on each pod for its node."
            )
        elif (reached := ctx.cluster.eligible(_placement_rules(pod), gpu_only=False)) and all(
            makers := [ctx.cluster.presets.other_maker(c.group.labels) for c in reached]
        ):
            key, value = next(m for m in makers if m)
            hint = (  # no MIG layout or annotation gives another maker's GPUs an NVIDIA device (a review of MIG)
                " Its DaemonSet's template asks this one device of every node it selects, and this pod's node has"
                f" another maker's GPUs ({escaped(key)}: {escaped(value)}), which NVIDIA's device plugin does not"
                " offer: keep the DaemonSet off it (a nodeSelector or node affinity, such as"
                f" {escaped(key)}: {NVIDIA})."
            )
        elif all(_known_cpu(c.group, ctx) for c in reached):
            hint = (  # no MIG layout or annotation gives a CPU node a GPU
                " Its DaemonSet's template asks this one device of every node it selects, and this pod's node has no"
                " GPU: keep the DaemonSet off nodes without GPUs (a nodeSelector or node affinity on its GPU nodes'"
                " labels)."
            )
        else:  # a GPU node joining that no label says is one (an EKS nodegroup's, k3s), or another maker's GPUs
            hint = (
                " Its DaemonSet's template asks this one device of every node it selects, and no NVIDIA GPU device"
                " is seen on this pod's node: where it has NVIDIA GPUs, give its node's pool a MIG layout that"
                " offers it; else keep the DaemonSet off it (a nodeSelector or node affinity), or ask the fraction"
                f" by annotation {FRACTION_ANNOTATION}, which is converted on each pod for its node."
            )
    elif line is not None:
        hint = (
            f" It was converted from {line.asked} ({PREFIX}{record.ANNOTATION}) before the GPUs had"
            " today's layout: apply its workload again to convert it to a profile offered now, or to be told"
            " why none fits."
        )
    out.event(
        "MIGUnoffered",
        f"container {name} asks for {what}, {said}; the pod stays Pending until one does.{hint}",
        "Warning",
    )


def _known_cpu(group: NodeGroup, ctx: Context) -> bool:
    """Whether the group's nodes are known to have no GPU: no device of any maker is offered (``amd.com/gpu``), and
    their provider labels every GPU node as such from its start (``Presets.gpu_labelled``: a GKE or AKS node, a
    Karpenter NodePool's node on AWS or Azure, ``Presets.instance_label_domains``) and has not labelled these. A node
    of an EKS nodegroup or a k3s cluster may be a GPU node whose device plugin is not up yet (a DaemonSet's pod made
    for one was told its node has no GPU: a review of MIG), and so may a NodePool's node of a Karpenter provider that
    labels no GPU (Cluster API's: it was told so too, a NodePool's label taken for one of a provider that does)."""
    presets = ctx.cluster.presets
    offered = group.has_gpu or any(v > 0 for k, v in group.allocatable.items() if k.endswith("/gpu"))  # amd.com/gpu
    if offered or presets.gpu_labelled(group.labels):
        return False
    if any(group.labels.get(k, "0").strip() not in ("", "0") for k in presets.gpu_count_labels):
        return False  # a GPU SKU of any maker (an AMD node, its device plugin not up yet: a review of MIG)
    if not presets.gpu_maker_labels.isdisjoint(group.labels):
        return False  # another maker's GPU instance type (Karpenter on AWS's AMD node: a review of MIG)
    labelling = [*presets.accelerator_labels, *presets.gpu_node_labels]
    shown = {k for p in labelling for k in presets.shown_by.get(p, ())}
    if not shown.isdisjoint(group.labels):
        return True
    instance_labelled = any(k.partition("/")[0] in presets.instance_label_domains for k in group.labels)
    return instance_labelled and not presets.mixed_pool_labels.isdisjoint(group.labels)


def _say_given_instead(
    out: Outcome, name: str, line: Line, instead: Sequence[NodeGroup], reached: Sequence[NodeGroup]
) -> None:
    """``_warn_unoffered``'s words for a line of a single-strategy pool at zero whose pool came up with another
    device (``_given_instead``): the pod is not Pending, it runs on that device; where nodes it reaches
    (``reached``) give its own profile too, it may, as the scheduler places it (it was told it gets the other, and
    may well have landed on its own: a review's)."""
    other = " or ".join(sorted(f"MIG {p}" if p else "a whole GPU" for p in {_single_profile(g) for g in instead}))
    give = "gives" if len({g.pool for g in reached}) == 1 else "give"
    if any(_single_profile(g) == line.profile for g in reached):  # each device named once: a long list was cut
        gives = f"{give} {other} besides MIG {line.profile} as {GPU_RESOURCE} now"
        gets = "it may get that instead, as the scheduler places it"
        # its own profile first: the warning's tail is cut in its middle, and a long name or list cut it out
        tail = f" {give} MIG {line.profile} but also {other} as {GPU_RESOURCE} now: it may get that"
    else:
        gives = f"{give} {other} as {GPU_RESOURCE} now"
        tail, gets = f" {gives}: it gets that, not MIG {line.profile}", "it gets that instead"
    out.warn(_pool_warning(f"mig: {name}: ", reached, tail, name))
    out.event(
        "MIGUnoffered",
        f"container {name} was converted from {line.asked} to MIG {line.profile} ({PREFIX}{record.ANNOTATION}),"
        f" {GPU_RESOURCE} 1 pinned to its pool while the pool had no nodes; {_pools(reached)} {gives}, and {gets}."
        " Apply its workload again to convert it to a profile offered now, or to be told why none fits.",
        "Warning",
    )


def _offered_now(groups: Sequence[NodeGroup]) -> str:
    """'MIG profiles offered now: nvidia.com/mig-1g.10gb, 3g.40gb as nvidia.com/gpu (single strategy)': each with
    the resource it is offered as (a bare '3g.40gb' read as the device a pod asking 'MIG 3g.40gb as nvidia.com/gpu'
    was told no node offers: a review's)."""
    shown = sorted(
        {
            f"{MIG_RESOURCE_PREFIX}{p}"
            if g.mig_strategy == "mixed"
            else f"{p} as {GPU_RESOURCE} ({g.mig_strategy} strategy)"
            for g in groups
            for p, offer in g.mig_profiles.items()
            if offer.count > 0
        }
    )
    return f"MIG profiles offered now: {', '.join(shown)}" if shown else "no node offers MIG devices now"

"""The cuda policy: a pod whose CUDA needs a newer driver than every node it can land on is denied; one that some
eligible nodes cannot run is steered (required node affinity narrowed) to those that can.

``steer`` runs last of the mutators (after spot and MIG, whose changes decide where the pod may land) and writes the
``gpu-admission.io/cuda`` annotation; ``validate`` checks the final object, denies, warns and records events.

Both describe the pod as it stands, never the change made: after steering, the annotation is written from the
steered pod, so a second mutation finds every eligible pool compatible and writes the same text (empty patch).
Nodes are evaluated per node group (``ClusterView.eligible``), never per node.

In ``warn`` mode nothing is steered (a safe roll-out changes no pod); would-be denials become warnings.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import marshal
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Literal, TypeVar

from webhook import PREFIX
from webhook.affinity import (
    Expression,
    expression,
    holds,
    json_key,
    manifest_expressions,
    narrow,
    required_terms,
    unnarrow,
)
from webhook.cluster import (
    CUDA_LABEL_PREFIXES,
    DRIVER_LABELS,
    GFD,
    GPU_RESOURCE,
    MAX_LISTED,
    MIG_RESOURCE_PREFIX,
    MIN_NAME,
    PRODUCT_LABEL,
    TOLERATES_ALL,
    NodeGroup,
    Taint,
    asking_most,
    device_spec,
    extended_resource_names,
    gated_spec,
    has_node,
    leaving,
    offers,
    pool_label_value,
    pool_names,
    requested_resources,
    split_leaving,
    untolerated,
)
from webhook.config import CudaSettings
from webhook.cuda_version import (
    Declared,
    NodeFacts,
    Requirement,
    accepted_by,
    declared_cuda,
    env_values,
    evaluate,
    facts_of,
    forward_barred,
    forward_branches,
    forward_off_platform,
    forward_possible,
    gpu_name,
    image_cuda,
    is_minor_compatible,
    show_mm,
    unmet,
)
from webhook.drivers import DriverTable, Version, builtin_table, show, show_driver
from webhook.model import (
    GPU_MEMORY_RESOURCE,
    JSON,
    WARNING_LIMIT,
    Context,
    Denial,
    EventType,
    Outcome,
    PodView,
    applied_by_kubectl,
    as_dict,
    as_list,
    as_str,
    clipped,
    copy_json,
    escaped,
    fit_warning,
    middle_clipped,
)
from webhook.policies import spot
from webhook.policies.steering import could_steer, steered
from webhook.quantity import QuantityError, parse_quantity

POLICY = "cuda"
GPU_RESOURCES = (GPU_RESOURCE, GPU_RESOURCE + ".shared", GPU_MEMORY_RESOURCE)
NO_DEVICES = ("", "void", "none")
"""NVIDIA_VISIBLE_DEVICES values that expose no GPU (nvidia-container-toolkit)."""
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"

Status = Literal["ok", "old", "unknown"]
"""Of a container on a node group: supported; not supported; the group's driver is unknown."""


# ---------------------------------------------------------------------------------------------------------------
# What the pod asks


def is_gpu_container(container: JSON) -> bool:
    """Asks for nvidia.com/gpu, nvidia.com/mig-*, gpu-admission.io/gpu-memory (or nvidia.com/gpu.shared), or sets
    NVIDIA_VISIBLE_DEVICES to devices."""
    resources = as_dict(container.get("resources"))
    for section in ("limits", "requests"):
        for name, value in as_dict(resources.get(section)).items():
            if not isinstance(name, str) or not (name in GPU_RESOURCES or name.startswith(MIG_RESOURCE_PREFIX)):
                continue
            try:
                if parse_quantity(value) > 0:
                    return True
            except QuantityError:
                return True  # an amount that is not a quantity still asks for a GPU (MIG reports it)
    devices = env_values(container).get("NVIDIA_VISIBLE_DEVICES")
    return devices is not None and devices.strip() not in NO_DEVICES


def gpu_resources(spec: JSON) -> dict[str, Decimal]:
    """The pod's nvidia.com/* requests for eligibility; a fraction still left counts as 'some GPU'."""
    return {
        k: (v if v == v.to_integral_value() else Decimal(0))
        for k, v in requested_resources(spec).items()
        if k.startswith("nvidia.com/")
    }


@lru_cache(maxsize=8)
def _table(extra: tuple[tuple[str, str], ...]) -> DriverTable:
    return builtin_table().with_rows(dict(extra))


def driver_table(cs: CudaSettings) -> DriverTable:
    return _table(tuple(sorted(cs.driver_table.items())))


def mode_of(ctx: Context) -> str:
    cs = ctx.settings.cuda
    return cs.namespace_modes.get(ctx.namespace, cs.mode)


# ---------------------------------------------------------------------------------------------------------------
# The assessment: every GPU container against every eligible group


@dataclass(frozen=True)
class Check:
    declared: Declared
    init: bool
    requirement: Requirement | None
    """The requirement in force (forward-compatibility terms dropped when settings say so)."""

    @property
    def label(self) -> str:
        name = self.declared.container or "(unnamed)"
        return f"{name} (init)" if self.init else name


@dataclass(frozen=True)
class Assessment:
    checks: tuple[Check, ...]
    eligible: tuple[NodeGroup, ...]
    status: tuple[tuple[Status, ...], ...]
    """status[i][j]: check i on eligible group j (only checks with a requirement are meaningful)."""
    unknown_driver_ok: bool
    resources: Mapping[str, Decimal]
    """The pod's GPU requests that eligibility checks (steering changes where a pod may land, not what it asks)."""
    synced: bool = True
    """The cluster view knows the nodes (the live watch has listed them): else nothing is eligible, for want of a
    node list, not of a node."""
    spec: JSON | None = None
    """The spec assessed (read, never changed): what a denial's advice checks its targets against."""
    spot_mode: str = ""
    """The spot mode the spot policy decided for the pod (``spot.decided_mode`` in ``steer``, the final pod's words in
    ``validate``): the words name ``spot: require`` as what keeps the pod off a pool only under it, not for a pod
    whose own affinity names spot capacity (found by a review of the spot policy; the MIG refusal's the same)."""

    @functools.cached_property
    def known(self) -> tuple[int, ...]:
        """Indexes of the checks with a requirement."""
        return tuple(i for i, c in enumerate(self.checks) if c.requirement is not None)

    def allowed(self, status: Status) -> bool:
        return status == "ok" or (status == "unknown" and self.unknown_driver_ok)

    @functools.cached_property
    def _pod_allowed(self) -> tuple[bool, ...]:
        return tuple(all(self.allowed(self.status[i][j]) for i in self.known) for j in range(len(self.eligible)))

    def pod_allowed(self, j: int) -> bool:
        return self._pod_allowed[j]

    @functools.cached_property
    def allowed_groups(self) -> tuple[NodeGroup, ...]:
        return tuple(g for g, ok in zip(self.eligible, self._pod_allowed, strict=True) if ok)

    @functools.cached_property
    def blocked_groups(self) -> tuple[NodeGroup, ...]:
        return tuple(g for g, ok in zip(self.eligible, self._pod_allowed, strict=True) if not ok)

    def status_of(self, i: int, group: NodeGroup) -> Status | None:
        """Check i's status on ``group`` when the group was eligible here; None when it was not."""
        j = self._index.get(id(group))
        return None if j is None else self.status[i][j]

    @functools.cached_property
    def _index(self) -> dict[int, int]:
        return {id(g): j for j, g in enumerate(self.eligible)}

    @functools.cached_property
    def targets_found(self) -> dict[Requirement, list[str]]:
        """``_targets``' answers for this assessment, by requirement."""
        return {}


def _eligible(spec: JSON, ctx: Context, resources: Mapping[str, Decimal] | None = None) -> tuple[NodeGroup, ...]:
    """The GPU groups a pod with ``spec`` can land on. A gated pod (``spec.schedulingGates``) is not placed yet, and
    what takes its gate away may add tolerations (Kueue: its ResourceFlavor's): it can land on a tainted group too.
    It was refused where the only group its CUDA runs on is tainted for a Kueue flavor, which Kueue would have
    admitted it to (a review of the webhook with Kueue); the update that takes the gate away is checked with the
    tolerations it has then (``pipeline.ungated``)."""
    spec = gated_spec(spec)
    seen: set[int] = set()
    out: list[NodeGroup] = []
    for candidate in ctx.cluster.eligible(spec, gpu_resources(spec) if resources is None else resources):
        if id(candidate.group) not in seen:
            seen.add(id(candidate.group))
            out.append(candidate.group)
    return tuple(out)


def _status(requirement: Requirement, group: NodeGroup, ctx: Context, facts: NodeFacts | None = None) -> Status:
    cs = ctx.settings.cuda
    verdict = evaluate(requirement, facts or facts_of(group), driver_table(cs), cs.compatibility)
    if verdict is True:
        return "ok"
    if verdict is None and group.driver is None and group.cuda is None:
        return "unknown"
    return "old"  # not satisfied, or undecidable on a known driver (brand or arch unknown): not trusted


def checks_of(pod: PodView, ctx: Context) -> tuple[Check, ...]:
    cs = ctx.settings.cuda
    out: list[Check] = []
    # The container the gpu-fraction annotation gives its fraction to asks for no GPU until the mig policy converts
    # it on each pod, yet its CUDA is what decides where that pod may run: the profile chosen for it, and a
    # template's ask judged for its pods, must know it (found by a generative review of workload lifecycles: a
    # Deployment so written, with spot never, was admitted without a word, and each pod refused for its CUDA).
    given = pod.fraction_container() if ctx.settings.mig.enabled else None
    configs = ctx.images.lookup if ctx.images is not None and cs.registry.enabled else None
    for list_name, container in pod.containers():
        if not is_gpu_container(container) and container is not given:
            continue
        declared = declared_cuda(container, pod.annotations, cs.image_references, configs)
        requirement = declared.requirement
        if requirement is not None and not cs.forward_compatibility:
            requirement = requirement.without_forward()
        out.append(Check(declared, list_name == "initContainers", requirement))
    return tuple(out)


def assess(
    checks: tuple[Check, ...], spec: JSON, ctx: Context, spot_mode: str, before: Assessment | None = None
) -> Assessment:
    """Every check against every group ``spec`` may land on, for a pod under ``spot_mode``; statuses ``before`` (the
    same checks, before the spec was narrowed) are taken over rather than evaluated again."""
    resources = gpu_resources(spec) if before is None else before.resources
    eligible = _eligible(spec, ctx, resources) if ctx.cluster.known else ()
    facts = [facts_of(g) for g in eligible]  # once per group, not once per container and group
    rows: list[tuple[Status, ...]] = []
    for i, c in enumerate(checks):
        row: list[Status] = []
        for g, f in zip(eligible, facts, strict=True):
            known = before.status_of(i, g) if before is not None else None
            row.append(known or (_status(c.requirement, g, ctx, f) if c.requirement else "ok"))
        rows.append(tuple(row))
    unknown_driver_ok = ctx.settings.cuda.unknown_driver != "deny"
    return Assessment(checks, eligible, tuple(rows), unknown_driver_ok, resources, ctx.cluster.known, spec, spot_mode)


def _without_required(spec: JSON) -> JSON | None:
    """``spec`` (a shallow copy) without its required node affinity; None when it has none."""
    node_affinity = as_dict(as_dict(spec.get("affinity")).get("nodeAffinity"))
    if REQUIRED not in node_affinity:
        return None
    loose = dict(spec)
    loose["affinity"] = {
        **as_dict(spec.get("affinity")),
        "nodeAffinity": {k: v for k, v in node_affinity.items() if k != REQUIRED},
    }
    return loose


def _kept_off(a: Assessment, spec: JSON, ctx: Context) -> tuple[NodeGroup, ...]:
    """Incompatible groups the pod could land on but for its required node affinity (steering's, or its own)."""
    loose = _without_required(spec)
    if loose is None or not a.known:
        return ()
    now = {id(g) for g in a.eligible}
    out: list[NodeGroup] = []
    for g in _eligible(loose, ctx, a.resources):
        if id(g) in now:
            continue
        requirements = [r for r in (a.checks[i].requirement for i in a.known) if r is not None]
        if not all(a.allowed(_status(r, g, ctx)) for r in requirements):
            out.append(g)
    return tuple(out)


# ---------------------------------------------------------------------------------------------------------------
# Words


def describe(group: NodeGroup) -> str:
    return f"pool {group.pool} (driver {group.driver_text}, CUDA {group.cuda_text})"


def listing(groups: Iterable[NodeGroup], limit: int = MAX_LISTED) -> str:
    """'pool a (driver 535.104.05, CUDA 12.2), pool b (drivers 550.54.15 or 560.35.03, CUDA 12.4 or 12.6)'."""
    by_pool: dict[str, list[NodeGroup]] = {}
    for g in groups:
        by_pool.setdefault(g.pool, []).append(g)
    texts = []
    for pool, members in sorted(by_pool.items()):
        drivers = list(dict.fromkeys(g.driver_text for g in sorted(members, key=lambda g: g.driver or ())))
        cudas = list(dict.fromkeys(g.cuda_text for g in sorted(members, key=lambda g: g.cuda or ())))
        plural = "s" if len(drivers) > 1 else ""
        texts.append(f"pool {pool} (driver{plural} {' or '.join(drivers)}, CUDA {' or '.join(cudas)})")
    if len(texts) > limit:
        return ", ".join(texts[:limit]) + f" and {len(texts) - limit} more"
    return ", ".join(texts)


def _source(d: Declared) -> str:
    return f"from {d.source}" if d.source else ""


NOT_CHECKED = "; not checked"
"""How a container line (``_found``) ends when the container's CUDA is not checked."""


def _found(c: Check) -> str:
    d = c.declared
    if d.error:
        return f"{c.label}: {d.source} unusable: {d.error}"
    if d.disabled:
        return f"{c.label}: CUDA requirement disabled by {d.source}{NOT_CHECKED}"
    if c.requirement is None:
        why = f"{d.source}" if d.source else f"image {d.image or '(none)'}"
        return f"{c.label}: CUDA version unknown ({why}){NOT_CHECKED}"
    return f"{c.label}: {d.version_text} {_source(d)}"


def _container_line(a: Assessment, i: int, ctx: Context) -> str:
    c = a.checks[i]
    line = _found(c)
    if c.requirement is None or not a.eligible:
        return line
    table = driver_table(ctx.settings.cuda)
    parts: list[str] = []
    ok = [g for j, g in enumerate(a.eligible) if a.status[i][j] == "ok"]
    if ok:
        accepted = [(g, accepted_by(c.requirement, facts_of(g), table)) for g in ok]  # once per group
        forward = [g for g, how in accepted if how == "forward"]
        minor = [g for g, how in accepted if how == "minor"]
        text = f"supported by {listing(ok)}"
        if forward:
            text += f" (forward compatibility on {pool_names(forward)})"
        if minor:
            text += f" (minor-version compatibility on {pool_names(minor)})"
        parts.append(text)
    old = [g for j, g in enumerate(a.eligible) if a.status[i][j] == "old"]
    if old:
        parts.append(f"not supported by {listing(old)}")
    unknown = [g for j, g in enumerate(a.eligible) if a.status[i][j] == "unknown"]
    if unknown:
        parts.append(f"driver unknown on {pool_names(unknown)}")
    return "; ".join([line, *parts])


def _forward_but_for_wiring(facts: NodeFacts) -> bool:
    return forward_possible(dataclasses.replace(facts, compat_wired=True)) is True


@dataclass(frozen=True)
class Unmatched:
    """Why the known GPU pools are no place for a pod none of them matches (``unmatched``)."""

    reasons: list[tuple[str, list[NodeGroup]]]
    """Each reason, and the pools it keeps the pod off: the reason first, its pools together ('untolerated
    sku=gpu:NoSchedule of pools a, b')."""
    fixes: list[str]
    """What the pod would need to land on the pools a taint or the count of its GPUs keeps it off."""
    elsewhere: bool
    """Its own nodeSelector or required node affinity keeps it off a pool, or no pool offers what it asks, or a pool
    of nodes of any size has none big enough now, or no pool of the spot capacity it requires is known: it may be
    meant for a pool the webhook does not know, an autoscaled one with no node now, or a bigger node (not where the
    spot policy's places keep it off what its spot mode says it does not want)."""
    rejected: str = ""
    """Where its nodeName binds it to a node, what that node's kubelet does with it: it is never Pending for a node
    to join (nor told to declare a pool)."""

    def text(self, room: int | None = None) -> str:
        """The reasons with their pools; in at most ``room`` characters where given (``_fitted``)."""
        if len(self.reasons) == 1 and not self.reasons[0][1]:  # no pool offers what it asks
            return self.reasons[0][0]
        if room is not None:
            return _fitted(self.reasons, room)
        shown = [label + pool_names(groups) for label, groups in self.reasons[:MAX_LISTED]]
        more = len(self.reasons) - MAX_LISTED
        return "; ".join(shown + [f"and {more} more"] * (more > 0))

    @property
    def advice(self) -> str:
        """What then: that it stays Pending, and what would change that."""
        pending = self.rejected or "it stays Pending"
        if self.elsewhere:
            pending += (
                " until a node it matches joins (an autoscaled pool: declare it in cluster.pools to have it checked)"
            )
        more = len(self.fixes) - MAX_LISTED
        fixes = "; ".join(self.fixes[:MAX_LISTED] + [f"and {more} more"] * (more > 0))
        return f"{pending}{'; ' if self.elsewhere else ': '}{fixes}" if fixes else pending


def unmatched(a: Assessment, ctx: Context) -> Unmatched | None:
    """Why the known GPU pools are no place for a pod none of them matches, by pool: its nodeSelector and required
    node affinity (or the spot policy's); a node's GPUs fewer than it asks; a taint it does not tolerate; or that no
    pool offers what it asks. None when the cluster knows no GPU pool. The advice to declare an autoscaled pool is
    given only where the pod may be meant for one: told to every pod, one a taint of a known pool kept off (k3s's
    nvidia.com/gpu, AKS's sku=gpu) or one that asked more GPUs than a node has was sent to declare a pool already
    known (a user-journey review)."""
    if a.spec is None or not ctx.cluster.gpu_groups:
        return None
    some = {name: Decimal(0) for name in a.resources}  # offered at all, whatever the amount
    offering = [g for g in ctx.cluster.gpu_groups if offers(g, some)]
    if not offering:
        return Unmatched([(f"no known pool offers {', '.join(sorted(a.resources)) or 'a GPU'}", [])], [], True)
    tolerant = {**a.spec, "tolerations": [*as_list(a.spec.get("tolerations")), TOLERATES_ALL]}
    selected = {id(g) for g in _eligible(tolerant, ctx, some)}
    first: dict[str, tuple[list[str], NodeGroup]] = {}
    short_of: dict[tuple[str, Decimal], list[NodeGroup]] = {}
    tolerate: dict[tuple[Taint, ...], list[NodeGroup]] = {}
    ruled_out: list[NodeGroup] = []
    node = as_str(a.spec.get("nodeName"))  # it skips the scheduler: no other node, no node to come (a review)
    off_node = {id(g) for g in offering if node and not has_node(g, node)}
    coming = False  # a node it matches may join: a bigger one of a pool of any size; spot capacity not known now
    for g in offering:
        if id(g) in off_node:
            continue
        if id(g) not in selected:
            ruled_out.append(g)
            continue
        # a cordoned or not-ready pool in words, not as a taint to tolerate (``split_leaving``)
        tolerable, state = split_leaving(untolerated(g, a.spec, ctx.cluster.extended_resource_toleration))
        whys: list[str] = []  # each cause: the count alone was said of a pool tainted too (a review)
        if a.spot_mode == "never" and any(spot.is_spot_taint(t, ctx) for t in tolerable):
            # what never keeps it off, not a toleration to add (a review: a never pod was told to add it)
            whys.append("its spot: never excludes ")
            tolerable, state = [], ""
        elif (short := _too_few(g, a.resources)) and not _sized(g, ctx):
            whys.append(f"its {short[1]} {short[0]} exceed the nodes now in ")
            coming = True
        elif short:
            whys.append(f"its {short[1]} {short[0]} exceed a node of ")
            short_of.setdefault(short, []).append(g)
        if tolerable or state:
            whys.append(f"untolerated {tolerable[0]} of " if tolerable else f"nodes {state} now in ")
            if tolerable:
                tolerate.setdefault(tuple(tolerable), []).append(g)
        if whys:
            first.setdefault(g.pool, (whys, g))
    # the reason before the pools, their pools together: a warning is cut at 119 characters, and pool names are long
    # (a review of real manifests: only the pools were left; a pool's own reason, cut, kept 3 characters of its name)
    reasons: dict[str, list[NodeGroup]] = {}
    for _, (whys, g) in sorted(first.items()):
        for why in whys:
            reasons.setdefault(why, []).append(g)
    excluded = list(reasons.items())
    if off := [g for g in offering if id(g) in off_node and g.pool not in first]:
        excluded.append((f"its nodeName {node} excludes ", off))
    rest: list[NodeGroup] = []
    if ruled_out := [g for g in ruled_out if g.pool not in first]:
        if by_spot := spot.kept_off_by_require(a.spot_mode, tolerant, ruled_out, ctx, some):
            excluded.append((f"{spot.REQUIRED_CAPACITY} excludes ", by_spot))
            # no spot pool it selects is known: the one it requires may be at zero (a review: it was told no more)
            coming = coming or not any(g.spot for g in offering if id(g) in selected)
        elif by_spot := spot.kept_off_by_never(a.spot_mode, tolerant, ruled_out, ctx, some, steered(a.spec, ctx)):
            excluded.append((f"{spot.KEPT_OFF_BY_NEVER} excludes ", by_spot))
        if rest := [g for g in ruled_out if g not in by_spot]:
            excluded.append(("its nodeSelector/affinity excludes ", rest))
    advice: list[str] = []
    for (name, _), groups in short_of.items():  # the container that asks it named where another asks it too
        most = _most(groups, name)
        advice.append(f"to land on {pool_names(groups)}, ask at most {most} {name}{asking_most(a.spec, name, most)}")
    advice += [f"to land on {pool_names(groups)}, {_tolerations(t, a.spec, ctx)}" for t, groups in tolerate.items()]
    return Unmatched(excluded, advice, (bool(rest) or coming) and not node, _rejected(node, offering, a, ctx))


def _rejected(node: str, offering: Sequence[NodeGroup], a: Assessment, ctx: Context) -> str:
    """What the kubelet of ``node``, the pod's nodeName, does with a pod no known GPU node matches ('' without one):
    it rejects it, the resource it lacks named as its reason says (OutOfnvidia.com/gpu); a node not known is none
    a kubelet runs."""
    if not node:
        return ""
    if not any(has_node(g, node) for g in ctx.cluster.groups):
        return f"no node {node} is known (the pod garbage collector deletes a pod bound to a node that is not there)"
    own = next((g for g in offering if has_node(g, node)), None)
    if own is None and not a.resources:  # its GPUs through NVIDIA_VISIBLE_DEVICES alone: nothing to reject it for
        return f"it runs on node {node}, where no known GPU is"
    short = _too_few(own, a.resources) if own is not None else min(a.resources.items())
    return f"the kubelet of node {node} rejects it" + (f" (OutOf{short[0]})" if short else "")


def _sized(group: NodeGroup, ctx: Context) -> bool:
    """A node of ``group`` has the size its nodes now have: not so in a pool of instance types of every size (a
    Karpenter NodePool: ``Presets.mixed_pool_labels``), which launches a bigger node for a pod that asks more (a
    review: a 4-GPU pod was told to ask at most 1 of one)."""
    return ctx.cluster.presets.mixed_pool_labels.isdisjoint(group.labels)


def _most(groups: Iterable[NodeGroup], name: str) -> Decimal:
    """The most of ``name`` a node of ``groups`` has."""
    return max(g.allocatable.get(name, Decimal(0)) for g in groups)


def _too_few(group: NodeGroup, resources: Mapping[str, Decimal]) -> tuple[str, Decimal] | None:
    """The first resource of which the pod asks more than a node of ``group`` has, and the amount asked."""
    for name, amount in sorted(resources.items()):
        if not offers(group, {name: amount}):
            return name, amount
    return None


def _tolerations(taints: Sequence[Taint], spec: JSON, ctx: Context) -> str:
    """The tolerations of ``taints`` to add, as a pod's YAML writes them, with the other ways to the same."""
    shown = " and ".join(
        f"{{key: {t.key}, operator: Equal, value: {json.dumps(t.value)}, effect: {t.effect}}}"
        if t.value
        else f"{{key: {t.key}, operator: Exists, effect: {t.effect}}}"
        for t in taints[:3]
    )
    text = f"add the toleration{'s' * (len(taints) > 1)} {shown}" + (f" and {len(taints) - 3} more" * (len(taints) > 3))
    asked = extended_resource_names(spec)
    if not ctx.cluster.extended_resource_toleration and any(
        t.key in asked and t.effect == "NoSchedule" for t in taints
    ):
        # k3s and kubeadm run no such plugin by default (``cluster.extendedResourceToleration``: auto is off there)
        text += (
            " (or, where the API server runs ExtendedResourceToleration, set cluster.extendedResourceToleration: on)"
        )
    return text + spot.tolerate_hint(taints, ctx)


def _fitted(reasons: list[tuple[str, list[NodeGroup]]], room: int) -> str:
    """``unmatched``'s words in at most ``room`` characters: each reason with the pools it keeps the pod off, as
    many reasons as fit with their pools at least counted ('2 pools', ``pool_names``), sharing the room left, the
    rest counted ('and 2 more'); a reason too long alone (a taint's long key) cut in its middle, marked. No pool's
    name is cut to fewer than MIN_NAME characters."""
    least = [len(label) + len(pool_names(groups, 2, 0)) for label, groups in reasons]
    # more reasons only where the first (a taint or the count of a pool the pod selects) keeps its first pool named
    # whole: '... of 1 pool; ... excludes 1 pool' named none a user could act on
    to_name = max(0, len(reasons[0][0]) + len(pool_names(reasons[0][1], 1)) - least[0])
    fit = len(reasons)

    def over(n: int) -> int:
        tail = len(f"; and {len(reasons) - n} more") if n < len(reasons) else 0
        return sum(least[:n]) + 2 * (n - 1) + tail - room

    while fit > 1 and over(fit) + to_name > 0:
        fit -= 1
    spare = -over(fit)
    parts = []
    for i, (label, groups) in enumerate(reasons[:fit]):
        counted = least[i] - len(label)  # its pools' least words ('2 pools')
        if spare < 0:  # one reason alone too long: its words cut in the middle, its pools counted
            label = middle_clipped(label, max(len(label) + spare, MIN_NAME))
            spare = 0
        named = pool_names(groups, 2, counted + spare // (fit - i))
        spare -= len(named) - counted  # what it did not take, for the reasons after it
        parts.append(label + named)
    if fit < len(reasons):
        parts.append(f"and {len(reasons) - fit} more")
    return "; ".join(parts)


STEERED_OFF = "the steering gpu-admission added is what keeps it off "
"""How the decision line ends where the required node affinity that keeps a pod off pools is the steering's."""


def _decision(
    a: Assessment, kept_off: Sequence[NodeGroup], mode: str, ctx: Context, by_steering: Sequence[NodeGroup] = ()
) -> str:
    if not a.checks:
        return ""
    if not a.synced:
        text = "not checked: the webhook has no node list yet (see its /readyz and its log)"
    elif not a.eligible:
        text = "not checked: no known GPU node matches the pod's scheduling constraints"
        if (why := unmatched(a, ctx)) is not None:
            text += f" ({why.text()}); {why.advice}"
    elif not a.known:
        text = "not checked: no CUDA requirement known"
    elif not a.allowed_groups:
        verb = "would be denied (cuda mode warn)" if mode == "warn" else "denied"
        text = f"{verb}: no pool the pod can land on supports its CUDA"
    elif a.blocked_groups:
        text = f"admitted, but the pod may land on {pool_names(a.blocked_groups)}, which cannot run it"
    elif unknown := [g for j, g in enumerate(a.eligible) if any(a.status[i][j] == "unknown" for i in a.known)]:
        text = (
            f"admitted, unchecked on {pool_names(unknown)}, whose driver is unknown: run GPU Feature Discovery "
            "there or declare cluster.pools[].driverVersion"
        )
    else:
        text = "admitted: every pool the pod can land on supports its CUDA"
    if kept_off:
        text += f"; required node affinity keeps it off {listing(kept_off)}"
    if by_steering:
        text += f"; {STEERED_OFF}{pool_names(by_steering)}"
    return f"decision: {text}"


def annotation(
    a: Assessment, kept_off: Sequence[NodeGroup], ctx: Context, mode: str, by_steering: Sequence[NodeGroup] = ()
) -> str:
    """The ``gpu-admission.io/cuda`` text: a line per container, then the decision; ``by_steering``: those of
    ``kept_off`` that the steering's affinity, not the pod's own, keeps it off."""
    lines = [_container_line(a, i, ctx) for i in range(len(a.checks))]
    lines.append(_decision(a, kept_off, mode, ctx, by_steering))
    # a line each: a user's newline (in an image, a container's name) is escaped, so that it cannot start a line of
    # its own, such as a steering line that ``_said_steering`` reads back
    return "\n".join(escaped(line) for line in lines if line)


# ---------------------------------------------------------------------------------------------------------------
# Steering


def _cuda_labels(group: NodeGroup) -> dict[str, Version]:
    out: dict[str, Version] = {}
    for prefix in CUDA_LABEL_PREFIXES:
        major, minor = group.labels.get(f"{GFD}{prefix}.major", ""), group.labels.get(f"{GFD}{prefix}.minor", "")
        if major.isdigit() and minor.isdigit():
            out[prefix] = (int(major), int(minor))
    return out


def pool_selector(group: NodeGroup, ctx: Context) -> dict[str, str]:
    """Node labels that select the group's pool: a declared pool's nodeSelector, else a provider pool label."""
    for pool in ctx.settings.cluster.pools:
        if pool.name == group.pool and pool.node_selector and group.pool_source == "settings":
            return dict(pool.node_selector)  # not a pool another label names alike
    name = pool_label_value(group.pool)  # gpu@karpenter: two providers' pools named alike
    for key in ctx.cluster.presets.pool_labels:
        if group.labels.get(key) == name:
            return {key: name}
    for keys in DRIVER_LABELS:  # the driver's labels, as the group's nodes carry them (older GFD: major/minor/rev)
        if all(k in group.labels for k in keys):
            return {k: group.labels[k] for k in keys}
    return {}


def _steering_selector(group: NodeGroup, ctx: Context, taken: AbstractSet[str] = frozenset()) -> dict[str, str]:
    """``pool_selector``, but a group no pool label names (k3s) by its GPU product rather than its exact driver: a
    Deployment's template pinned to driver-version.full 570.124.06 left its pods Pending for good once the nodes
    were upgraded to 580 (found by a review of real clusters); the driver range ``_by_pool`` adds where the same
    product is blocked on an older driver moves up with them. Not a product of ``taken``: one that groups it must
    not select carry under another selector (a pool label), which the product would select too."""
    selector = pool_selector(group, ctx)
    product = group.labels.get(PRODUCT_LABEL)
    if product and _by_driver(selector):
        # a product a labelled blocked pool has too: with the driver (alone, it also selected other GPUs on it)
        return {PRODUCT_LABEL: product, **selector} if product in taken else {PRODUCT_LABEL: product}
    return selector


def _by_driver(selector: Mapping[str, str]) -> bool:
    return any(k in selector for keys in DRIVER_LABELS for k in keys)


def _taken_products(groups: Iterable[NodeGroup], ctx: Context) -> frozenset[str]:
    """The GPU products of ``groups`` whose selectors are no driver labels (pools a label or settings name)."""
    return frozenset(g.labels.get(PRODUCT_LABEL, "") for g in groups if not _by_driver(pool_selector(g, ctx))) - {""}


def _range(prefix: str, lowest: Version) -> list[list[Expression]]:
    major, minor = f"{GFD}{prefix}.major", f"{GFD}{prefix}.minor"
    if lowest[1] == 0:
        return [[expression(major, "Gt", [str(lowest[0] - 1)])]]
    return [
        [expression(major, "In", [str(lowest[0])]), expression(minor, "Gt", [str(lowest[1] - 1)])],
        [expression(major, "Gt", [str(lowest[0])])],
    ]


def _by_cuda_labels(a: Assessment, ctx: Context) -> list[list[Expression]]:
    """ORed terms on GFD's CUDA labels for the allowed groups that carry them, pool terms for the others, and for
    the groups of a pool an autoscaler makes nodes for from the pool's own definition (``Presets.pool_steered``: a
    Karpenter NodePool, whose nodes are made only for labels Karpenter knows; a GKE, EKS or AKS node group, which
    Cluster Autoscaler scales up from zero on a template node with its labels and none of GFD's). A term on GFD's
    labels left such a workload's pods Pending for good once the nodes there were busy, consolidated away or scaled
    to zero (found by reviews of real clusters). The price: a pool added later is not in the terms until the
    workload's template is updated.

    A range (``>= lowest allowed``) when no blocked group carries a value in it, so that nodes added later with a
    newer driver stay eligible; else the exact values."""
    values: dict[str, set[Version]] = {}
    rest: list[NodeGroup] = []
    steered = ctx.cluster.presets.pool_steered
    for g in a.allowed_groups:
        # its selector names such a pool, or its nodes carry such a pool's label though a declared pool's selector
        # is another of theirs (an instance type, an ASG's node-template label): named by that selector all the same.
        # Not a pool named by a key of cluster.poolLabelKeys: those keep GFD's terms (a review found them pinned by
        # the user's key where the nodes carried GKE's pool label too)
        declared = g.pool_source == "settings"
        if not steered.isdisjoint(pool_selector(g, ctx)) or (declared and not steered.isdisjoint(g.labels)):
            rest.append(g)
            continue
        labels = _cuda_labels(g)
        prefix = next((p for p in CUDA_LABEL_PREFIXES if p in labels), "")
        if prefix:
            values.setdefault(prefix, set()).add(labels[prefix])
        else:
            rest.append(g)
    alternatives: list[list[Expression]] = []
    for prefix in CUDA_LABEL_PREFIXES:
        if prefix not in values:
            continue
        lowest = min(values[prefix])
        blocked = [_cuda_labels(b).get(prefix) for b in a.blocked_groups]
        if all(v is None or v < lowest for v in blocked):
            alternatives += _range(prefix, lowest)
            continue
        for major in sorted({v[0] for v in values[prefix]}):
            minors = sorted({v[1] for v in values[prefix] if v[0] == major})
            alternatives.append(
                [
                    expression(f"{GFD}{prefix}.major", "In", [str(major)]),
                    expression(f"{GFD}{prefix}.minor", "In", [str(m) for m in minors]),
                ]
            )
    return alternatives + _by_pool(rest, ctx, a.blocked_groups)


def _by_pool(groups: Iterable[NodeGroup], ctx: Context, blocked: Sequence[NodeGroup] = ()) -> list[list[Expression]]:
    """A term per group on its pool's selector; and on its driver labels too where a blocked group has the same
    selector (a pool whose nodes run two drivers), when it carries them: the range from the lowest allowed driver
    of the pool up where its blocked drivers are all below it and the labels give the major and minor (a node
    upgraded later stays eligible: an exact version left the pods of a template Pending for good once the pool
    moved on to the next driver, found by a review of day-2 journeys), else the exact values."""
    taken = _taken_products(blocked, ctx)
    shared: dict[tuple[tuple[str, str], ...], list[NodeGroup]] = {}
    for b in blocked:
        shared.setdefault(tuple(sorted(_steering_selector(b, ctx, taken).items())), []).append(b)
    # each group's selector worked out once, and the groups by it: compared pairwise, a pool of 3,000 groups (a
    # label of each node's own) took past the budget
    by_selector: dict[tuple[tuple[str, str], ...], list[NodeGroup]] = {}
    for g in groups:
        by_selector.setdefault(tuple(sorted(_steering_selector(g, ctx, taken).items())), []).append(g)
    alternatives: list[list[Expression]] = []
    seen: set[object] = set()
    for key, allowed_here in by_selector.items():
        if not key:
            continue
        selector = dict(key)
        base = [expression(k, "In", [v]) for k, v in key]
        if key not in shared:
            alts = [base]
        else:
            ranges = _driver_ranges(allowed_here, shared[key])
            alts = [[*base, *extra] for g in allowed_here for extra in _driver_terms(g, ranges, selector)]
        for alt in alts:
            if (written := json_key(alt)) not in seen:
                seen.add(written)
                alternatives.append(alt)
    return alternatives


def _driver_ranges(allowed: Sequence[NodeGroup], blocked: Sequence[NodeGroup]) -> dict[str, list[list[Expression]]]:
    """By driver-label prefix, the terms from the lowest allowed driver of a pool up, where its blocked drivers are
    all below it (see ``_by_pool``): once per pool, not once per group."""
    ranges: dict[str, list[list[Expression]]] = {}
    for prefix in ("cuda.driver-version", "cuda.driver"):
        major, minor = f"{GFD}{prefix}.major", f"{GFD}{prefix}.minor"
        drivers = [h.driver for h in allowed if major in h.labels and minor in h.labels and h.driver]
        if not drivers:
            continue
        lowest = min(drivers)
        if len(lowest) >= 2 and all(b.driver is not None and b.driver[:2] < lowest[:2] for b in blocked):
            if lowest[1] == 0:
                ranges[prefix] = [[expression(major, "Gt", [str(lowest[0] - 1)])]]
            else:
                ranges[prefix] = [
                    [expression(major, "In", [str(lowest[0])]), expression(minor, "Gt", [str(lowest[1] - 1)])],
                    [expression(major, "Gt", [str(lowest[0])])],
                ]
    return ranges


def _driver_terms(
    g: NodeGroup, ranges: Mapping[str, list[list[Expression]]], selector: Mapping[str, str]
) -> list[list[Expression]]:
    """The driver-label terms that tell ``g`` apart from the blocked groups of its pool: the pool's range where
    ``g`` carries its labels, else ``g``'s exact driver labels."""
    for prefix, terms in ranges.items():
        if f"{GFD}{prefix}.major" in g.labels and f"{GFD}{prefix}.minor" in g.labels:
            return terms
    keys = next((keys for keys in DRIVER_LABELS if all(k in g.labels for k in keys)), ())
    return [[expression(k, "In", [g.labels[k]]) for k in keys if k not in selector]]


def _narrowed(pod: PodView, a: Assessment, ctx: Context) -> tuple[list[list[Expression]], JSON] | None:
    """The first alternatives (by CUDA labels, else by pool) that keep the pod landing somewhere, and only on
    allowed groups, with the spec they narrow it to; None when none does, or the pod already asks that much."""
    allowed = {id(g) for g in a.allowed_groups}
    for alternatives in (_by_cuda_labels(a, ctx), _by_pool(a.allowed_groups, ctx, a.blocked_groups)):
        if not alternatives:
            continue
        trial = PodView(pod.kind, {}, copy_json(pod.spec), pod.namespace, pod.owner_kind)
        changed = narrow(trial, alternatives)
        groups = _eligible(trial.spec, ctx, a.resources)
        if groups and all(id(g) in allowed for g in groups):
            return (alternatives, trial.spec) if changed else None
    return None


def _keys(alternatives: list[list[Expression]]) -> str:
    return ", ".join(sorted({as_str(e.get("key")) for alt in alternatives for e in alt}))


@dataclass(frozen=True)
class Steering:
    """What ``steer`` does to a pod: the narrowing (None: none), its audit line, and the annotation it writes."""

    alternatives: list[list[Expression]] | None
    audit: str
    annotation: str
    spot_only: tuple[NodeGroup, ...] = ()
    """The pools steered to, when every one of them is spot capacity and a pool it is steered away from is not."""
    on_demand: tuple[NodeGroup, ...] = ()
    """Then, the on-demand pools it is steered away from."""
    steered_off: str = ""
    """Not steered now: the pools that the expressions the steering could have written (``steered``) keep it off,
    named as ``STEERED_OFF`` names them: what an earlier pass's words must name to be kept (``_as_steered``)."""


def plan_steering(pod: PodView, mode: str, checks: tuple[Check, ...], ctx: Context, spot_mode: str) -> Steering:
    """Decide the steering without changing ``pod``: the annotation describes the pod as it will stand."""
    a = assess(checks, pod.spec, ctx, spot_mode)
    if mode == "enforce" and ctx.settings.cuda.steer and a.allowed_groups and a.blocked_groups:
        narrowed = _narrowed(pod, a, ctx)
        if narrowed is not None:
            alternatives, spec = narrowed
            audit = (
                f"to {pool_names(a.allowed_groups)}, away from {pool_names(a.blocked_groups)} "
                f"(required node affinity on {_keys(alternatives)})"
            )
            steered = assess(checks, spec, ctx, spot_mode, before=a)
            kept_off = _kept_off(steered, spec, ctx)
            own = {id(g) for g in _kept_off(a, pod.spec, ctx)}  # what its own affinity kept it off before
            words = annotation(steered, kept_off, ctx, mode, [g for g in kept_off if id(g) not in own])
            if all(g.spot for g in a.allowed_groups) and not all(g.spot for g in a.blocked_groups):
                on_demand = tuple(g for g in a.blocked_groups if not g.spot)
                return Steering(alternatives, audit, words, a.allowed_groups, on_demand)
            return Steering(alternatives, audit, words)
    kept_off = _kept_off(a, pod.spec, ctx)
    return Steering(None, "", annotation(a, kept_off, ctx, mode), steered_off=_steered_off(a, kept_off, ctx))


def _steered_off(a: Assessment, kept_off: Sequence[NodeGroup], ctx: Context) -> str:
    """Of ``kept_off``, the pools the pod lands on once the expressions of its required node affinity that the
    steering could have written (``steered``) are taken out, named (escaped, as the annotation's lines are); '' for
    none. One eligibility pass more, only for a pod kept off pools that has such expressions."""
    found = steered(a.spec, ctx) if kept_off and a.spec is not None else []
    trial = PodView("Pod", {}, copy_json(a.spec or {}), "")  # unnarrow edits the terms in place
    if not found or not unnarrow(trial, [[e] for e in found]):
        return ""
    freed = {id(g) for g in _eligible(trial.spec, ctx, a.resources)}
    return escaped(pool_names(g for g in kept_off if id(g) in freed)) if freed & {id(g) for g in kept_off} else ""


def _plan_key(
    step: str, pod: PodView, mode: str, checks: tuple[Check, ...], spot_mode: str
) -> tuple[str, str, str, tuple[Check, ...], bytes, str] | None:
    """What the policy's plan for a pod depends on besides settings and snapshot: the mode, the checks (what each
    GPU container declares) and all that eligibility reads of the spec: the scheduling fields, and the containers'
    resources and init containers' restartPolicy as written (from which the scheduler's sums and the extended
    resources named follow). None when it cannot be written down."""
    spec = pod.spec
    try:
        placement = marshal.dumps(
            (
                spec.get("nodeName"),
                spec.get("nodeSelector"),
                spec.get("affinity"),
                spec.get("tolerations"),
                bool(as_list(spec.get("schedulingGates"))),
                [as_dict(c).get("resources") for c in as_list(spec.get("containers"))],
                [
                    (as_dict(c).get("resources"), as_dict(c).get("restartPolicy"))
                    for c in as_list(spec.get("initContainers"))
                ],
            )
        )
    except ValueError:
        return None
    return (POLICY, step, mode, checks, placement, spot_mode)


P = TypeVar("P")


def _planned(
    step: str, pod: PodView, ctx: Context, spot_mode: str, make: Callable[[str, tuple[Check, ...]], P]
) -> P | None:
    """``make(mode, checks)``, kept per snapshot and settings (``ClusterView.policy_memo``) for the pods that
    declare the same CUDA, ask to land in the same places and are under the same ``spot_mode`` (the words name spot:
    require only under it); None when the check is off or no container asks for a GPU."""
    mode = mode_of(ctx)
    if mode == "off" or pod.defers_gpu:  # its pods are checked when their MIG profile, and so their place, is chosen
        return None
    checks = checks_of(pod, ctx)
    if not checks:
        return None
    key = _plan_key(step, pod, mode, checks, spot_mode)
    if key is None:
        return make(mode, checks)
    # counted by what it holds: the placement's bytes, and the checks' texts (images, ...), worked out once made
    return ctx.cluster.policy_memo.per_settings(
        key, ctx.settings, lambda: make(mode, checks), lambda _: len(key[4]) + len(repr(checks))
    )


def forget(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Before any policy runs: a workload this webhook reviewed before has its steering planned afresh, not kept
    from the last review (`kubectl apply` keeps live-only fields: the affinity for an image's newer CUDA outlived
    the image), and the other policies judge it without that steering: the terms its annotation says the webhook
    added (by pool and driver labels too: a Deployment steered to a GKE pool stayed there after every pool was
    upgraded, found by two reviews), and any on GFD's CUDA labels; what the manifest kubectl applied writes stays."""
    if not pod.is_template or POLICY not in ctx.prior:
        return
    said, added_only = _said_steering(ctx.prior[POLICY]) or ([], True)
    written = [e for alt in said for e in alt] if could_steer(said, ctx) else []
    if not added_only and not applied_by_kubectl(pod):
        # an earlier version's line named every expression of the steering, those the template held already too: a
        # term on the GPU product may then be the user's own, the same words (a Helm chart's, a CronJob's Job), and
        # without kubectl's manifest to tell them apart it stays (a second pass took the user's H100 term out, and
        # the Job was left only the pool that cannot run it; found by a review)
        written = [e for e in written if as_str(e.get("key")) != PRODUCT_LABEL]
    # Without kubectl's manifest nothing tells the user's own terms on GFD's CUDA labels from the steering's but
    # the words: a CronJob's Jobs (the CronJob controller writes none) lost the user's own (a generative review)
    ours = [*_steering_of(pod), *written] if applied_by_kubectl(pod) else written
    if not ours:
        return
    # not what the manifest itself writes, nor a place the spot policy's require wrote (it may be the same pool
    # selector): that policy takes its own out and writes them again in order (``spot.required_places``)
    spot_places = frozenset(json_key(e) for e in spot.required_places(ctx.prior.get(spot.APPLIED, "")))
    unnarrow(pod, [[e] for e in ours], keep=manifest_expressions(pod) | spot_places)


def steer(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Narrow required node affinity to the compatible nodes when only some are; write ``gpu-admission.io/cuda``.

    Pods that declare the same CUDA and ask to land in the same places get the same steering: planned once per
    snapshot and settings, applied to each. A template's annotation names the terms the steering wrote
    (``STEERING``), for its next review to take out (``forget``); a pod's, which no later review reads, does not
    (the words, said again on a pod steered already, could be a forged annotation's)."""
    spot_mode = spot.decided_mode(out) or spot.asked_mode(pod, ctx)  # under never, AKS's spot taints may say nothing
    plan = _planned("steer", pod, ctx, spot_mode, lambda mode, checks: plan_steering(pod, mode, checks, ctx, spot_mode))
    held = _held(pod) if pod.is_template and plan is not None and plan.alternatives else frozenset()
    if plan is None:
        if pod.defers_gpu and mode_of(ctx) != "off":  # a gpu-memory ask, or the gpu-fraction annotation
            out.annotate(POLICY, DEFERRED)
            _warn_deferred(pod, ctx, out)
        return
    if plan.alternatives and narrow(pod, plan.alternatives):
        out.mutated("cuda-affinity")
        out.reasons.append("CUDASteered")
        out.audit["cuda-steered"] = plan.audit
    if plan.spot_only and "SpotRequire" not in out.reasons:
        # sent to preemptible capacity alone, said with what would give on-demand back: a pod that only tolerates
        # spot (a review of real manifests: a Kueue Job was steered to a spot pool, its only compatible one, without
        # a word in kubectl), and one under prefer, which allows on-demand capacity (a user-journey review: a
        # Deployment so written was steered to its spot pool alone without a word); the pools named whole or
        # counted: a longer head left 23 characters, and a second pool was lost (a review)
        warning = (
            "cuda: spot prefer, yet only spot runs its CUDA: steered to preemptible "
            if "SpotPrefer" in out.reasons
            else "cuda: only spot pools run its CUDA, steered there (it may be preempted): "
        )
        out.warn(clipped(warning + pool_names(plan.spot_only, room=WARNING_LIMIT - len(warning)), WARNING_LIMIT))
        for line in _on_demand_too(plan.on_demand):
            out.warn(line)
    steered = _added(plan.alternatives, held) if pod.is_template and plan.alternatives else None
    if pod.is_template and not steered:  # what ``forget`` kept, the manifest writing it too
        said = _said_steering(ctx.prior.get(POLICY, ""))
        steered = said[0] if said and could_steer(said[0], ctx) and holds(pod, said[0]) else None
    words = plan.annotation if plan.alternatives else _as_steered(plan, ctx)
    out.annotate(POLICY, words + (f"\n{STEERING}{_steering_text(steered)}" if steered else ""))


def _as_steered(plan: Steering, ctx: Context) -> str:
    """The plan's words with the pools the steering keeps the pod off named (``STEERED_OFF``), where an earlier pass
    wrote them so: a pod called again (reinvocation), or made from a steered template, and a template whose steering
    its manifest keeps, carry the affinity that pass added, which this one finds as if the pod's own. Only where the
    earlier words name the pools this review finds (``Steering.steered_off``): they were kept whatever they named,
    control characters too (a review). Else the plan's words."""
    prior = ctx.prior.get(POLICY, "").split(f"\n{STEERING}")[0]  # a template's line of the terms the steering added
    words = f"{plan.annotation}; {STEERED_OFF}{plan.steered_off}"
    return words if plan.steered_off and prior == words else plan.annotation


def _on_demand_too(groups: Sequence[NodeGroup]) -> list[str]:
    """What would let a pod steered to spot pools alone run on ``groups`` (on-demand ones) too: their driver, or
    an image of a CUDA they run; for those whose driver is unknown (unknownDriver: deny), a line of its own to declare
    it, as the denial says (they were told to upgrade it: a review); the pools in the room each line leaves
    (``pool_names``)."""
    unknown = [g for g in groups if g.driver is None and g.cuda is None]  # ``_status``'s "unknown"
    known = [g for g in groups if g not in unknown]
    newest = max((g.cuda for g in known if g.cuda), default=None)
    image = f"an image built for CUDA <= {show_mm(newest)}" if newest else "an image built for an older CUDA"
    ways = [("upgrade the driver of ", known, f" or use {image}")] if known else []
    ways += [("declare the driver of ", unknown, " (cluster.pools[].driverVersion)")] if unknown else []
    head = "cuda: for on-demand too, "
    return [
        clipped(
            head + before + pool_names(pools, room=WARNING_LIMIT - len(head + before + after)) + after, WARNING_LIMIT
        )
        for before, pools, after in ways
    ]


STEERING = "steering added by gpu-admission (required node affinity): "
"""How the annotation's line naming the expressions the steering added begins; read back by ``_said_steering``."""
STEERING_BEFORE = "steering written by gpu-admission (required node affinity): "
"""How an earlier version's line began: it named every expression of the steering, those the template held too."""


def _held(pod: PodView) -> frozenset[object]:
    """The ``json_key``s of the expressions in the template's required terms before the steering narrows them."""
    return frozenset(json_key(e) for t in required_terms(pod) for e in as_list(t.get("matchExpressions")))


def _added(alternatives: Sequence[Sequence[Expression]], held: frozenset[object]) -> list[list[Expression]]:
    """Of the steering's alternatives, the expressions no term of the template held before: those the steering
    added, the only ones its next review takes out. One a term held is the template's own (a Helm chart's
    ``gpu.product In (H100)``, in the steering's words), and is left where it is, though narrow added it to
    another term: with no manifest to tell them apart, taking it out had left a Job only a pool that cannot run
    it, and leaving every product term alone had kept a template on one GPU after its image no longer needed it
    (found by two reviews). The known limit: where one term held it and narrow added it to another, it stays in
    both after the image no longer needs it (a stale restriction, never a user's lost). Taking it out of the terms
    that look made by narrow instead took a user's own [zone a, product H100] apart (found by a review): telling
    them apart needs the line to name, per term, what narrow kept whole."""
    kept = [[e for e in alt if json_key(e) not in held] for alt in alternatives]
    return [alt for alt in kept if alt]


_EXPRESSION_TEXT = re.compile(r"(\S+) (In|NotIn|Gt|Lt|Exists|DoesNotExist)(?: \(([^()]*)\))?")


def _steering_text(alternatives: Sequence[Sequence[Expression]]) -> str:
    """'k In (a, b) and m Gt (3) or ...': label keys and values hold no spaces, commas or parentheses."""

    def one(e: Expression) -> str:
        values = e.get("values")
        return f"{e.get('key')} {e.get('operator')}" + (f" ({', '.join(values)})" if isinstance(values, list) else "")

    return " or ".join(" and ".join(one(e) for e in alt) for alt in alternatives)


def _said_steering(text: str) -> tuple[list[list[Expression]], bool] | None:
    """The alternatives an annotation's steering line names, and whether it names only what the steering added
    (``STEERING``; not an earlier version's ``STEERING_BEFORE``); None when it has none or it cannot be read."""
    line = next((part for part in text.split("\n") if part.startswith((STEERING, STEERING_BEFORE))), None)
    if line is None:
        return None
    added_only = line.startswith(STEERING)
    alternatives = []
    for alt in line[len(STEERING if added_only else STEERING_BEFORE) :].split(" or "):
        term = []
        for part in alt.split(" and "):
            found = _EXPRESSION_TEXT.fullmatch(part)
            if found is None:
                return None
            key, operator, values = found.groups()
            term.append(expression(key, operator, values.split(", ") if values is not None else ()))
        alternatives.append(term)
    return alternatives, added_only


def _warn_deferred(pod: PodView, ctx: Context, out: Outcome) -> None:
    """A template whose pods are checked each as it is created: where no GPU pool it can reach, whatever MIG
    profile its pods get, supports a container's CUDA, every pod will be denied; said now, to whoever applies it
    (found by a review of workload flows: only the ReplicaSet's FailedCreate Events told)."""
    checks = checks_of(pod, ctx)
    if not checks:
        return
    # its pods' device tolerates the GPU's taint where the mig policy converts their ask (with it off, no pod gets one:
    # judged as tolerating it, a workload was said ADMITTED whose pods were each denied; a review's finding)
    spec = device_spec(pod.spec) if ctx.settings.mig.enabled else pod.spec
    a = assess(checks, spec, ctx, spot.decided_mode(out))
    if not a.known or not a.eligible or a.allowed_groups:
        return
    for i in a.known:
        if not any(a.allowed(st) for st in a.status[i]):
            c = a.checks[i]
            enforced = mode_of(ctx) == "enforce"
            fate = "denied" if enforced else "warned of it (cuda mode warn)"
            text = clipped(
                f"cuda: {c.label} needs {c.declared.version_text}: each pod will be {fate}, no pool its pods can "
                f"reach supports it ({pool_names(a.eligible)})",
                WARNING_LIMIT,
            )
            if enforced:
                out.refuse_pods(text)
            else:
                out.warn(text)


DEFERRED = (
    "checked on each pod as it is created: its MIG profile, chosen then for its gpu-memory or gpu-fraction, decides"
    " where it runs"
)


def supported_groups(pod: PodView, ctx: Context) -> tuple[NodeGroup, ...] | None:
    """For the mig policy, which chooses before ``steer`` runs: the GPU groups whose driver supports the CUDA of
    every GPU container of ``pod`` (as ``Assessment.allowed`` judges a group), where steering would keep it. None
    when this policy does not enforce (it then denies nothing, so any pool will do) or no GPU container says its
    CUDA. With steering off it still enforces: a profile offered only where the driver is too old would be denied,
    where another would be admitted. Judged per group, not per node, once per snapshot and settings for the same
    requirements."""
    if mode_of(ctx) != "enforce":
        return None
    requirements = tuple(c.requirement for c in checks_of(pod, ctx) if c.requirement is not None)
    if not requirements:
        return None
    unknown_ok = ctx.settings.cuda.unknown_driver != "deny"

    def runs(group: NodeGroup) -> bool:
        facts = facts_of(group)
        statuses = [_status(r, group, ctx, facts) for r in requirements]
        return all(st == "ok" or (st == "unknown" and unknown_ok) for st in statuses)

    return ctx.cluster.policy_memo.per_settings(
        (POLICY, "supported", requirements),
        ctx.settings,
        lambda: tuple(g for g in ctx.cluster.gpu_groups if runs(g)),
        lambda _: len(repr(requirements)),
    )


# ---------------------------------------------------------------------------------------------------------------
# Validation


def _upgrade(c: Check, groups: Sequence[NodeGroup], ctx: Context) -> str:
    version = c.declared.version
    known = [g for g in groups if g.driver is not None]
    if version is None or not known:
        return ""
    table = driver_table(ctx.settings.cuda)
    need = table.minimum_driver(version)
    minor = ctx.settings.cuda.compatibility == "minor" or is_minor_compatible(c.requirement)
    floor = table.minor_floor.get(version[0]) if minor else None
    if floor is not None and (need is None or floor < need):
        need = floor  # minor-version compatibility: any <major>.x runs on the major's floor
    newer = f"one that supports CUDA {show(version)} (newer than the table knows)"
    target = f">= {show_driver(need)}" if need else newer
    return f"upgrade the driver to {target} on {pool_names(known)}"  # the version first: a warning is cut short


MIG_SELECTOR_KEYS = frozenset({"cloud.google.com/gke-gpu-partition-size", PRODUCT_LABEL})
"""The nodeSelector keys the mig policy writes (GKE's partition size, a single-strategy MIG product)."""


def _targets(c: Check, a: Assessment, ctx: Context) -> list[str]:
    """Compatible pools the pod's own constraints keep it from, with the selector that reaches them; found once per
    requirement of the pod (each pool's reach is an eligibility pass over the pod: per container, it grew with the
    containers squared)."""
    assert c.requirement is not None
    found = a.targets_found.get(c.requirement)
    if found is None:
        found = a.targets_found[c.requirement] = _find_targets(c, a, ctx)
    return found


def _find_targets(c: Check, a: Assessment, ctx: Context) -> list[str]:
    assert c.requirement is not None
    eligible = {id(g) for g in a.eligible}
    own = as_dict(a.spec.get("nodeSelector")) if a.spec is not None else {}
    pool_keys = {k for keys in DRIVER_LABELS for k in keys} | set(ctx.cluster.presets.pool_labels)
    pool_keys |= {k for pool in ctx.settings.cluster.pools for k in pool.node_selector}
    out: list[str] = []
    ok = {id(g) for g in ctx.cluster.gpu_groups if _status(c.requirement, g, ctx) == "ok"}
    # an unlabelled pool advised by its GPU product (no exact driver to go stale) where no other group of that
    # product is left out, for any container of the pod (found by reviews of this session's commits)
    other = _left_out_products(tuple(r for i in a.known if (r := a.checks[i].requirement) is not None), ctx)
    # a pool whose nodes offer none of what the pod asks is no place to send it
    groups = [g for g in ctx.cluster.gpu_groups if id(g) not in eligible and offers(g, a.resources) and id(g) in ok]
    # a pool some of whose nodes take pods is advised as those, not also as cordoned (``_reach``)
    taking = {g.pool for g in groups if not leaving(g)}
    for g in groups:
        if g.pool in taking and leaving(g):
            continue
        selector = _steering_selector(g, ctx, other)
        if any(g.labels.get(k) != v for k, v in own.items() if k in MIG_SELECTOR_KEYS and k not in pool_keys):
            continue  # the MIG partition the mig policy chose keeps it off (other keys: the user's, to change)
        hint = f" with nodeSelector {', '.join(f'{k}: {v}' for k, v in sorted(selector.items()))}" if selector else ""
        text = f"target {describe(g)}{hint}{_reach(g, selector, a, ctx)}"
        if text not in out:
            out.append(text)
    return sorted(out)[:3]


def _left_out_products(requirements: tuple[Requirement, ...], ctx: Context) -> frozenset[str]:
    """The GPU products of the groups that some of ``requirements`` does not run on: the advice names an unlabelled
    pool by its product only where no such group has it. Once per snapshot and settings for the same requirements
    (it had been worked out over every GPU group for each container of a refused pod; found by a read of the
    whole change)."""
    return ctx.cluster.policy_memo.per_settings(
        (POLICY, "left-out", requirements),
        ctx.settings,
        lambda: frozenset(
            g.labels.get(PRODUCT_LABEL, "")
            for g in ctx.cluster.gpu_groups
            if not all(_status(r, g, ctx) == "ok" for r in requirements)
        ),
        lambda _: len(repr(requirements)),
    )


def _reach(group: NodeGroup, selector: Mapping[str, str], a: Assessment, ctx: Context) -> str:
    """What else the pod needs to land on ``group`` once it selects it: tolerations of its taints (not of those
    that say its nodes take no pod now, cordoned or not ready: what they say instead), no spec.nodeName that binds
    it to another node, or required node affinity that lets it (spot: require keeps a pod off on-demand pools)."""
    if a.spec is None:
        return ""
    # the advice: select that pool (instead of others) for the scheduler, with no spec.nodeName binding it to a node
    # (nor skipping NoSchedule taints): a pod so bound had been told its required node affinity kept it off (a review)
    trial = {k: v for k, v in a.spec.items() if k != "nodeName"} | {"nodeSelector": dict(selector)}
    taints, state = split_leaving(untolerated(group, trial, ctx.cluster.extended_resource_toleration))
    text = ""
    bound = as_str(a.spec.get("nodeName"))
    if taints:
        shown = ", ".join(str(t) for t in taints[:3]) + (f" and {len(taints) - 3} more" if len(taints) > 3 else "")
        text = f" and a toleration of {shown}{spot.tolerate_hint(taints, ctx)}"
    if state:  # no toleration of a drain or a broken node: the pod waits for the pool (``split_leaving``)
        text += f" (its nodes are {state} now: the pod waits until one takes pods again)"
    if bound and not has_node(group, bound):
        text += (
            f" (the pod is bound to node {bound[:80]} by spec.nodeName: remove it, or set it to a node of that pool)"
        )
    if taints or state:
        trial["tolerations"] = [*as_list(a.spec.get("tolerations")), TOLERATES_ALL]  # affinity alone
    if not any(g is group for g in _eligible(trial, ctx, a.resources)):
        # named only where the spot places alone keep it off (not where its own rules do too: a review found the
        # advice to leave require given to a pod whose own zone rule kept it off as well)
        by_spot = bool(spot.kept_off_by_require(a.spot_mode, trial, [group], ctx, a.resources))
        why = f": {spot.KEPT_OFF_BY_REQUIRE}" if by_spot else ""
        text += f" (its required node affinity keeps it off that pool too{why})"
    return text


def incompatible_message(c: Check, a: Assessment, i: int, ctx: Context) -> tuple[str, str]:
    """What a user reads when the pod is denied (container, image, version and source, pools, what to do), and
    its one-line summary for warn mode's kubectl warning: the container and its fixes, the driver to upgrade to
    first (the warning is cut at kubectl's line length; the other line of warn mode says the CUDA each side)."""
    d = c.declared
    assert c.requirement is not None
    blocked = [g for j, g in enumerate(a.eligible) if not a.allowed(a.status[i][j])]
    unknown = [g for g in blocked if g.driver is None and g.cuda is None]
    why = (
        "the driver of every node it can run on is unknown"
        if len(unknown) == len(blocked)
        else ("no node it can run on supports it")
    )
    needs = d.version_text
    table = driver_table(ctx.settings.cuda)
    beyond = _beyond_cuda(c.requirement)
    failing = {id(g): unmet(c.requirement, facts_of(g), table, ctx.settings.cuda.compatibility) for g in blocked}
    if beyond:  # more than a CUDA floor: name the whole requirement, and what fails where
        needs = f"requirement {c.requirement.text}"
    head = f"container {c.label} (image {d.image or '(none)'}) needs {needs} ({_source(d)}), but {why}: "
    head += f"{listing(blocked)}."
    if beyond:
        by_failing: dict[tuple[str, ...], list[NodeGroup]] = {}
        for g in blocked:
            if failing[id(g)]:
                by_failing.setdefault(tuple(failing[id(g)]), []).append(g)
        for conditions, groups in by_failing.items():
            verb = "does not hold" if len(conditions) == 1 else "do not hold"
            head += f" On {pool_names(groups)}, {' and '.join(conditions)} {verb}."
    # a pool that fails only the requirement's CUDA bounds is one a newer driver or an older image helps
    on_cuda = [g for g in blocked if all(u.startswith("cuda") for u in failing[id(g)])]
    others = sorted({u for g in blocked for u in failing[id(g)] if not u.startswith("cuda")})
    branches = forward_branches(c.requirement)
    off: list[NodeGroup] = []
    if branches and ctx.settings.cuda.forward_compatibility:
        named = f"Its forward-compatibility alternatives (driver branches {', '.join(branches)})"
        # each pool's own reason: a GeForce's (error 804), an architecture the image has no compat libraries for,
        # or a driver of another branch
        barred = [g for g in blocked if forward_barred(c.requirement, facts_of(g), table)]
        told = {id(g) for g in barred}
        off = [g for g in blocked if id(g) not in told and forward_off_platform(c.requirement, facts_of(g), table)]
        told |= {id(g) for g in off}
        rest = [g for g in blocked if id(g) not in told]
        # GKE's driver installer where forward compatibility would hold but for it (a data-center GPU); an RTX's
        # or a GeForce's reason is its GPU's, wherever it runs
        unwired = [g for g in barred if not facts_of(g).compat_wired and _forward_but_for_wiring(facts_of(g))]
        barred = [g for g in barred if g not in unwired]
        if unwired:
            found = image_cuda(d.image) if d.image else None
            keep = (
                "; this image's entrypoint does, so keep it (no command: of the container's own)"
                if found is not None and found.rule.forward_by_entrypoint
                else ""
            )
            head += (
                f" {named} match the driver of {pool_names(unwired)}, but GKE's own driver installer loads no image's"
                f" compat libraries (no NVIDIA Container Toolkit: the container finds the node's libcuda first){keep}."
            )
            named = "They"
        if barred:
            gpus = ", ".join(sorted({_gpu_brand(g) for g in barred}))
            head += (
                f" {named} match the driver of {pool_names(barred)}, but forward compatibility works only on"
                f" data-center GPUs (its GPU: {gpus}; elsewhere CUDA fails with error 804)."
            )
        barred += unwired
        if off:
            platform = forward_off_platform(c.requirement, facts_of(off[0]), table)
            no_label = "not known: no kubernetes.io/arch label, which a declared pool may give in its nodeSelector"
            theirs = sorted({facts_of(g).platform or no_label for g in off})
            head += (
                f" {named if not barred else 'They'} match the driver of {pool_names(off)}, but the image carries"
                f" its compat libraries only for {platform} nodes (theirs: {', '.join(theirs)})."
            )
        if rest and (barred or off):
            head += f" They do not match the driver of {pool_names(rest)}."
        elif rest:
            head += f" {named} do not match either."
    remedies: list[str] = []
    if off and (undeclared := [g for g in off if not facts_of(g).platform and g.pool_source == "settings"]):
        # the one-line fix where the pool is at zero: its nodes would have said their architecture (found by a
        # review: a declared pool refused at zero what its running nodes admit)
        platform = forward_off_platform(c.requirement, facts_of(undeclared[0]), table)
        remedies.append(
            f"give {pool_names(undeclared)} the nodeSelector kubernetes.io/arch: {platform} in settings"
            f" (cluster.pools[].nodeSelector) if its nodes are {platform}"
        )
    newest = sorted(g.cuda for g in a.eligible if g.cuda)
    cuda_fails = not others or any(u.startswith("cuda") for g in blocked for u in failing[id(g)])
    image = f"use an image built for CUDA <= {show_mm(newest[-1])}" if newest and d.version and cuda_fails else ""
    if image:
        remedies.append(image)
    remedies += _targets(c, a, ctx)
    upgrade = _upgrade(c, [g for g in on_cuda if g not in unknown], ctx)
    if upgrade:
        remedies.append(upgrade)
    if others:
        remedies.append(f"drop {', '.join(others)} from the requirement ({_source(d)}) if the image does not need it")
    if unknown:
        remedies.append(f"declare the driver of {pool_names(unknown)} in settings (cluster.pools[].driverVersion)")
    if (
        d.source.startswith("annotation ")
        and not forward_branches(c.requirement)
        and (not d.image or image_cuda(d.image) is None)  # a tag read older than the annotation: its compat won't
        and any(forward_possible(facts_of(g)) for g in on_cuda)
    ):
        # the annotation is a bare cuda>=X.Y: an image built on nvidia/cuda carries compat libraries that run it on
        # these data-center GPUs, which only its own requirement says (the webhook reads no rule for this image;
        # found by a review: the annotation the 'CUDA version unknown' warning asks for refused such images)
        remedies.append(
            "if the image is built on nvidia/cuda, write its NVIDIA_REQUIRE_CUDA (docker inspect) as the container's"
            " env instead of the annotation: its compat libraries may run it on these drivers"
        )
    if not remedies:
        remedies.append("declare the CUDA version the image really needs (annotation gpu-admission.io/cuda-version)")
    text = "; or ".join(remedies)
    first = [r for r in (upgrade, image) if r]
    summary = f"{c.label}: " + "; or ".join(first + [r for r in remedies if r not in first])
    return f"{head} To fix: {text[0].upper()}{text[1:]}.", summary


def _beyond_cuda(requirement: Requirement) -> bool:
    """A term of the requirement's own (not a forward-compatibility alternative) asks more than the CUDA."""
    forward = requirement.forward_terms
    return any(c.key != "cuda" for t in requirement.terms if t not in forward for c in t)


def _more_than_a_floor(requirement: Requirement) -> bool:
    """The requirement's own terms (its forward-compatibility alternatives aside) say more than one CUDA floor."""
    forward = requirement.forward_terms
    return sum(len(t) for t in requirement.terms if t not in forward) > 1


def _gpu_brand(group: NodeGroup) -> str:
    """The GPU as a forward-compatibility denial names it: its product, and whether its brand is known."""
    name = gpu_name(group)
    if not name:
        return "not known (no nvidia.com/gpu.product label)"
    return name if facts_of(group).brands else f"{name}, of a brand not known"


def _no_common_pool(a: Assessment) -> str:
    parts = []
    for i in a.known:
        c = a.checks[i]
        ok = [g for j, g in enumerate(a.eligible) if a.allowed(a.status[i][j])]
        d = c.declared
        needs = d.version_text
        if d.requirement is not None and _more_than_a_floor(d.requirement):
            needs = f"requirement {d.requirement.text}"  # more than a CUDA floor: the rest decides too (driver<550)
        parts.append(f"{c.label} (image {d.image or '(none)'}: {needs} {_source(d)}) runs on {pool_names(ok)}")
    return (
        "the GPU containers of this pod have no pool in common that supports all of them: "
        + "; ".join(parts)
        + ". To fix: Use images built for the same CUDA, or one that the pools' drivers all support."
    )


def _invalid_message(c: Check) -> str:
    d = c.declared
    if "annotation" in d.source:
        fix = 'write the CUDA version the image needs as major.minor (e.g. "12.4"), or remove the annotation.'
    elif "NVIDIA_REQUIRE_CUDA" in d.source:
        fix = "write it as the NVIDIA runtime reads it (e.g. cuda>=12.4), or remove it: the runtime refuses it too."
    else:
        fix = 'write the version as the image has it (e.g. "12.4.1"), or remove the variable.'
    return f"container {c.label} (image {d.image or '(none)'}): {d.source} is unusable: {d.error}. To fix: {fix}"


def _unknown_message(c: Check) -> str:
    d = c.declared
    why = (
        d.source
        if d.source
        else "no annotation, no NVIDIA_REQUIRE_CUDA or CUDA_VERSION in its env, and the image reference matches no"
        " known pattern"
    )
    if _own_key_fits(d.container):
        declare = f'the pod annotation {PREFIX}cuda-version.{d.container}: "<major.minor>"'
    else:
        declare = (
            f"the pod annotation {PREFIX}cuda-version: \"<major.minor>\" (every GPU container's; this one's own key"
            f" cuda-version.<name> would be over the 63 characters of an annotation name)"
        )
    if d.pending:  # its controller creates it again: by then the config is read
        return (
            f"container {c.label} (image {d.image or '(none)'}): its CUDA version is unknown ({why}). "
            f"To fix: Create the pod again in a few seconds (a controller does so by itself), or declare it with"
            f" {declare}."
        )
    return (
        f"container {c.label} (image {d.image or '(none)'}): its CUDA version is unknown ({why}). "
        f"To fix: Declare it with {declare}."
    )


def _own_key_fits(container: str) -> bool:
    """``cuda-version.<container>`` is an annotation name (63 characters at most after the prefix)."""
    return len(f"cuda-version.{container}") <= 63


def _denials(a: Assessment, ctx: Context) -> list[Denial]:
    """The pod's denials, each of the container its message begins with (none where it names several), with a
    summary for warn mode's warning where the message's own fix is too long for it."""
    cs = ctx.settings.cuda
    out: list[Denial] = []
    for c in a.checks:
        if c.declared.error:
            out.append(Denial(POLICY, "CUDARequirementInvalid", _invalid_message(c), containers=(c.label,)))
        elif c.requirement is None and not c.declared.disabled and cs.unknown_version == "deny":
            out.append(Denial(POLICY, "CUDAVersionUnknown", _unknown_message(c), containers=(c.label,)))
    if not a.eligible:
        return out
    single = False
    for i in a.known:
        if not any(a.allowed(s) for s in a.status[i]):
            blocked_only_unknown = all(s == "unknown" for s in a.status[i])
            reason = "CUDADriverUnknown" if blocked_only_unknown else "CUDAIncompatible"
            out.append(Denial(POLICY, reason, *incompatible_message(a.checks[i], a, i, ctx), (a.checks[i].label,)))
            single = True
    if not single and a.known and not a.allowed_groups:
        out.append(Denial(POLICY, "CUDAIncompatible", _no_common_pool(a)))
    return out


def _warnings(a: Assessment, ctx: Context, denied: bool) -> list[str]:
    cs = ctx.settings.cuda
    out: list[str] = []
    for c in a.checks:
        if c.requirement is None and not c.declared.error and not c.declared.disabled and cs.unknown_version == "warn":
            name = c.declared.container
            own = f'cuda: {c.label}: CUDA version unknown; set pod annotation {PREFIX}cuda-version.{name}: "X.Y"'
            # kubectl shows a warning on one line: where this one's own key would not fit, the pod-wide one (the
            # container's name shortened in the middle when even that is too long)
            pod_wide = f'cuda: {c.label}: CUDA version unknown; set annotation {PREFIX}cuda-version: "X.Y"'
            out.append(own if _own_key_fits(name) and len(own) <= WARNING_LIMIT else fit_warning(pod_wide, c.label))
    head = "cuda: no known GPU node matches ("  # short: pool names are long, and a user acts on them
    if a.synced and not a.eligible and (why := unmatched(a, ctx)) is not None:
        out.append(clipped(f"{head}{why.text(WARNING_LIMIT - len(head) - 1)})", WARNING_LIMIT))
    unknown = [g for j, g in enumerate(a.eligible) if any(a.status[i][j] == "unknown" for i in a.known)]
    if cs.unknown_driver == "warn":
        for pool in sorted({g.pool for g in unknown}):
            out.append(f"cuda: driver of pool {pool} unknown; declare cluster.pools[].driverVersion or run GFD")
    if not denied and a.allowed_groups and a.blocked_groups:
        for i in a.known:
            bad = [g for j, g in enumerate(a.eligible) if not a.allowed(a.status[i][j])]
            if bad:
                c = a.checks[i]
                out.append(
                    f"cuda: {c.label} ({c.declared.version_text}) cannot run on {pool_names(bad)}, "
                    f"where it may land; target {pool_names(a.allowed_groups)}"
                )
    return out


def _audit_decision(a: Assessment, denials: Sequence[Denial], mode: str) -> str:
    if denials:
        verb = "would be denied" if mode == "warn" else "denied"
        return f"{verb} (" + ", ".join(sorted({d.reason for d in denials})) + ")"
    if not a.synced:
        return "not checked (no node list yet)"
    if not a.eligible:
        return "not checked (no eligible GPU node)"
    if not a.known:
        return "not checked (CUDA version unknown)"
    if a.blocked_groups:
        return f"admitted, may land on incompatible {pool_names(a.blocked_groups)}"
    return f"compatible ({pool_names(a.eligible)})"


def validate(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Deny what no eligible node can run; warn about unknowns; record the check as an event.

    Decided once per snapshot and settings for pods that declare the same CUDA and ask for the same places, as
    ``steer`` is."""
    ungated = pod.kind == "Pod" and ctx.operation == "UPDATE"  # the only pod update reviewed (pipeline.ungated)
    # the final pod's words; under never, AKS's spot taints may have left none
    spot_mode = spot.mode_of(as_str(pod.annotations.get(PREFIX + spot.APPLIED))) or spot.asked_mode(pod, ctx)
    decided = _planned(
        "ungated" if ungated else "validate",
        pod,
        ctx,
        spot_mode,
        lambda mode, checks: _validated(assess(checks, pod.spec, ctx, spot_mode), mode, ctx, ungated),
    )
    if decided is not None:
        out.merge(decided)


UNPLACEABLE = (
    " Its required node affinity (the steering written at its create, or its own) keeps it off those pools, so it "
    "would stay Pending."
)
"""Said of a pod that its gate was taken away from, where what the update placed it on (a queue's flavor: its
node labels, its tolerations) is only where its CUDA does not run, and where the steering written at its create
keeps it off: Kueue matches a pod's affinity with a flavor's labels only on the keys the flavor names, and GFD's
CUDA labels are seldom among them (README, 'Kueue and scheduling gates')."""


def _steering_of(pod: PodView) -> list[Expression]:
    """The required node affinity expressions on GFD's CUDA labels, as ``steer`` writes them."""
    keys = tuple(f"{GFD}{prefix}." for prefix in CUDA_LABEL_PREFIXES)
    found: list[Expression] = []
    seen: set[object] = set()
    for term in required_terms(pod):
        for e in as_list(term.get("matchExpressions")):
            if isinstance(e, dict) and as_str(e.get("key")).startswith(keys) and (k := json_key(e)) not in seen:
                seen.add(k)
                found.append(e)
    return found


def _validated(a: Assessment, mode: str, ctx: Context, ungated: bool = False) -> Outcome:
    """``_validate``; for a pod's ungating that leaves no node it matches, judged where it would land but for its
    required node affinity: refused when its CUDA runs on none of those (``UNPLACEABLE``)."""
    out = Outcome()
    note = ""
    if ungated and a.synced and not a.eligible and a.known and a.spec is not None:
        loose = _without_required(a.spec)
        unplaced = assess(a.checks, loose, ctx, a.spot_mode) if loose is not None else None
        if unplaced is not None and unplaced.eligible and _denials(unplaced, ctx):
            a, note = unplaced, UNPLACEABLE
    _validate(a, mode, ctx, out, note)
    return out


def _validate(a: Assessment, mode: str, ctx: Context, out: Outcome, note: str = "") -> None:
    noted = ("CUDAIncompatible", "CUDADriverUnknown")
    denials = [dataclasses.replace(d, message=d.message + note) if d.reason in noted else d for d in _denials(a, ctx)]
    for d in denials:
        out.deny(POLICY, d.reason, d.message, d.summary, d.containers[0] if d.containers else "")
    for warning in _warnings(a, ctx, bool(denials)):
        out.warn(warning)
    decision = _audit_decision(a, denials, mode)
    out.audit["cuda-decision"] = decision
    if denials:
        if mode == "warn":
            # The pipeline's "would be denied" warning is cut at kubectl's line length: say the gist in one line.
            for i in a.known:
                if not any(a.allowed(st) for st in a.status[i]):
                    c = a.checks[i]
                    newest = sorted(g.cuda for g in a.eligible if g.cuda)
                    reach = f"CUDA <= {show_mm(newest[-1])}" if newest else "unknown drivers"
                    out.warn(
                        f"cuda: {c.label} needs {c.declared.version_text}; it can land only on {reach} "
                        f"({pool_names(a.eligible)})"
                    )
            # one Event per reason, in the order denied, of the denials as the answer and the audit say them: the
            # same refusal of several containers once, naming them all (``Outcome.deny``), not once per container
            for reason in dict.fromkeys(d.reason for d in out.denials):
                out.event(reason, " ".join(escaped(d.message) for d in out.denials if d.reason == reason), "Warning")
        return
    # the user's text escaped, as in the annotation (``annotation``): kubectl describe shows an Event's message as
    # it is, and a newline or a bidirectional control in a container's name or image started a line of its own, or
    # reordered the line, there (found by a review)
    lines = [escaped(_container_line(a, i, ctx)) for i in range(len(a.checks))]
    if a.synced and a.eligible and len(a.known) == len(a.checks):
        out.reasons.append("CUDAChecked")
        out.event("CUDAChecked", "; ".join(lines) + f" ({decision})")
        return
    # Found by a review: a pod whose CUDA (or one container's) was not checked had a Normal CUDAChecked Event, which
    # operators read as "validated", and its message said "not checked (not checked (...))".
    out.reasons.append("CUDANotChecked")
    out.event("CUDANotChecked", _unchecked_message(a, lines, decision), _unchecked_type(a, ctx))


def _unchecked_message(a: Assessment, lines: Sequence[str], decision: str) -> str:
    """The container lines and, once, why they were not checked: for the whole pod (no node list, no node it can
    land on) in place of each line's own "not checked"; beside the decision on the containers that were checked."""
    if not a.synced or not a.eligible:
        return "; ".join(line.removesuffix(NOT_CHECKED) for line in lines) + f"; {decision}"
    if not a.known:  # every line says "not checked" already, and why
        return "; ".join(lines)
    return "; ".join(lines) + f"; the containers checked: {decision}"


def _unchecked_type(a: Assessment, ctx: Context) -> EventType:
    """Warning where nobody chose to leave the pod unchecked: no node list, no node it can land on, or a CUDA
    version unknown under ``cuda.unknownVersion: warn`` (the create had a warning too). Normal where a pod's own
    ``NVIDIA_DISABLE_REQUIRE`` or ``cuda.unknownVersion: allow`` left it so."""
    if not a.synced or not a.eligible:
        return "Warning"
    warned = ctx.settings.cuda.unknown_version == "warn"
    unknown = any(c.requirement is None and not c.declared.disabled for c in a.checks)
    return "Warning" if warned and unknown else "Normal"

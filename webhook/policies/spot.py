"""The spot policy: tolerations for spot / preemptible capacity, and node affinity to it, for pods that ask.

Asking. The pod (or pod template) annotation ``gpu-admission.io/spot`` says what the pod wants:

    tolerate | true   may run on spot capacity: the spot taints are tolerated
    prefer            tolerated, and a preferred node affinity (weight 100) on spot capacity labels
    require           tolerated, and a required node affinity on spot capacity labels, ANDed into every existing
                      term; with several label keys (clouds) the requirement is an OR of one alternative per key
    never | false     no toleration, whatever the defaults say; where the pod could land on a spot pool of the
                      known cluster all the same (EKS, Karpenter and CoreWeave spot nodes carry no taint, or it
                      tolerates the taint itself), a required node affinity off the spot labels (``NotIn``); so
                      too where the cluster labels every node with its capacity type (Karpenter, EKS), or no node
                      carries a place's labels (a GKE spot pool at zero), whose autoscaler may add spot nodes for
                      the pod when none is there now; not for a provider that taints every spot node (AKS, OKE)
                      unless a spot node of its there now lacks the taint (a taint manager took it off), nor for
                      a pool declared spot whose nodes carry taints (its own, or its provider's), where the pod
                      does not tolerate those taints (a gated pod is judged to tolerate every taint: what takes
                      its gate away may add tolerations). Where the cluster is not known (no node list yet, no
                      pool declared), off every spot place, as ``require`` is kept to them all; not where
                      its own nodeSelector or affinity pins it to one, its nodeSelector or each required term
                      chooses its place (any label but the spot labels and those that say nothing of capacity:
                      GFD's, NFD's, an instance type's (Karpenter's instance properties too), a zone's, the
                      OS's, the architecture's), or it is bound to a node (nodeName, a DaemonSet's matchFields):
                      a warning instead

When the pod does not ask (or asks with a value not listed above, which is warned about and ignored), the first
configured default that applies wins, most specific first (``SpotSettings``):

    1. the annotation on the pod
    2. ``owner_defaults[<owner kind>]``: the kind of the pod's controller (Job, ReplicaSet, ...) or, for a workload's
       template, of the pods' future owner (Deployment -> ReplicaSet, CronJob -> Job, Job -> Job); a default for
       Deployment also reaches the pods of its ReplicaSets (they carry ``pod-template-hash``)
    3. ``namespace_defaults[<namespace>]``
    4. ``default`` (off unless configured)

The owner kind goes before the namespace because it says what the workload is (a batch Job survives an eviction by
being retried), while a namespace groups unrelated workloads; an explicit ``off`` at a more specific level turns a
broader default off. A default prefer, require or never leaves a DaemonSet's pods and template alone (a DaemonSet
runs on every node it may: kept off spot nodes, those would offer no GPU plugin; kept to them, its pods on other nodes
would never run); only its annotation asks that. A default tolerate reaches them: tolerating the spot taints lets the
GPU Operator's and DCGM's DaemonSets run on tainted spot nodes too. The spot tolerations an earlier mode gave a
DaemonSet's template stay once such a default leaves it alone; only that mode's affinity goes (``_undo_earlier``).

Which taints. The spot taints of the provider presets in force (``ctx.cluster.presets``) plus ``extra_taints``.
When the cluster is known (it has groups: nodes or declared pools) and ``only_cluster_taints`` is on, only the taints
the cluster actually carries are tolerated, exactly as they stand there (a preset with an undocumented value matches
any value; the cluster's effect is used), so a pod does not collect tolerations for clouds it is not on. With no
knowledge of the cluster the presets' own tolerations are added; so they are, beside those of the taints there now,
when no node or pool is spot capacity now (a spot pool scaled to zero): the spot nodes the pod may run on are yet to
come, and carry their provider's taints (AKS and OKE taint every spot node), not those of the nodes there now; an
autoscaler scales a pool up from zero only for a pod that tolerates them. Those are the presets of the providers
the cluster shows (``ClusterView.providers``: their labels, OKE's pool annotation, a kubelet version) or the
settings name, and ``extra_taints``; for ``require`` every preset's when it shows none (tolerate and prefer would
collect tolerations for clouds the cluster is not on). ``gpu_taint_presets`` (off by default) adds documented GPU
taints that ExtendedResourceToleration does not cover (AKS ``sku=gpu:NoSchedule``), to GPU pods that get spot
tolerations, narrowed the same way. The tolerations an earlier pass of the mode added and it no longer wants (those
of a spot pool at zero, once an untainted spot node is there) stay on the pod, named as ``still tolerates``: a
change of mode takes them out, but on a DaemonSet that a default gave them and another default comes to leave alone.

Which places (prefer / require, and never). The spot capacity labels of the presets plus ``extra_labels``, and the
nodeSelector of each pool declared with ``spot: true`` (CoreWeave's spot pools carry no spot label). On a known
cluster, the keys its nodes or pools carry (by key, not value: a Karpenter cluster whose nodes are all on-demand still
has ``karpenter.sh/capacity-type``, and Karpenter can launch spot nodes for the pod), and every label of a provider
whose spot nodes may come though none of its labels is there now: one the cluster shows by its labels or OKE's pool
annotation (not by a kubelet version alone: an EKS self-managed node group's spot nodes carry no EKS label), one the
settings name (not the default ``[all]``), or one that makes nodes from zero where its cloud shows, by a kubelet
version too (``runs_on``: Karpenter on EKS, self-managed node groups included; ``require`` on its label alone warns
that the pod runs only if it is installed); a ``NotIn`` on a label no node carries, or one more alternative of the OR,
harms no node.
``require`` on a known cluster with no place is denied, with how to declare the spot pools: the providers shown label
no spot node, as CoreWeave's, or no provider shows by its labels and ``cluster.providers`` is the default ``[all]``
(a k3s or self-managed cluster, whose spot nodes no cloud's label tells apart). Where no node carries the labels it
names, ``require`` is applied all the same: it is a hard constraint the user chose (typically to never pay for
on-demand GPUs), a Pending pod is visible and easy to fix, while silently dropping the requirement would run it on
capacity it refused; and the view may lag an autoscaler that is about to add spot nodes. So is ``prefer`` (a spot
pool at zero: the labels of the providers whose spot nodes may come, none where no provider shows), so that the
scheduler favours the spot nodes once they come; both say that no node carries them now. ``require`` warns when no
node or pool is spot capacity now, and when the pod's own constraints (nodeSelector, affinity, tolerations) leave it
no spot pool to run on; ``prefer`` warns of the latter too (it runs on demand, where an on-demand pool takes it), but
not a pod that asks no GPU where every spot pool is a GPU pool: capacity it does not ask for, whose GPU taint keeps it
off (``_warn_unplaceable``).

Manners. A user's toleration is never removed or changed; a wanted toleration that an existing one already covers
(an Exists on the same key, an empty-key Exists, an empty effect, an equal value; for the Exists of a preset of
undocumented value, tolerations of each value its taints carry on the cluster) is not added. Affinity is edited
through ``webhook.affinity``, which is idempotent. The annotation ``gpu-admission.io/spot-applied`` describes the
resulting state and the decision, never the delta, so a second pass writes the same text and an empty patch.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from webhook import PREFIX
from webhook.affinity import (
    Expression,
    expression,
    holds,
    json_key,
    manifest_expressions,
    narrow,
    prefer,
    required_terms,
    unnarrow,
    unprefer,
)
from webhook.cluster import (
    GPU_TAINT_TOLERATION,
    INSTANCE_TYPE_LABEL,
    LEAVING_TOLERATIONS,
    NodeGroup,
    Taint,
    asking_most,
    device_spec,
    eligibility_key,
    gated_spec,
    leaving,
    names_listed,
    offers,
    pool_names,
    requested_resources,
    split_leaving,
    toleration_tolerates,
)
from webhook.config import PoolSettings
from webhook.model import (
    BUILTIN_GROUPS,
    GPU_MEMORY_RESOURCE,
    JSON,
    TEMPLATE_PATHS,
    WARNING_LIMIT,
    Context,
    Outcome,
    PodView,
    as_dict,
    as_list,
    as_str,
    clipped,
    copy_json,
    escaped,
    manifest_template_spec,
)
from webhook.policies.steering import steered
from webhook.presets import TaintPreset
from webhook.quantity import format_quantity

REQUEST = "spot"
APPLIED = "spot-applied"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"

MODES = {
    "tolerate": "tolerate",
    "true": "tolerate",
    "prefer": "prefer",
    "require": "require",
    "never": "never",
    "false": "never",
}
ACCEPTED = "tolerate, true, prefer, require, never or false"
SPOT_MODES = ("tolerate", "prefer", "require")
DAEMONSETS_LEFT_ALONE = ("prefer", "require", "never")
"""The defaults that leave a DaemonSet's pods and template alone (``_asked``); ``SpotSettings`` refuses them in
``ownerDefaults`` for DaemonSet, where they would never apply."""
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
PREFERRED_WEIGHT = 100
UNDONE = "removed what "
"""How the spot-applied part that says what an earlier mode's additions were taken out begins."""
KEPT = "kept what "
"""How the spot-applied part that says what an earlier mode's tolerations were left on a DaemonSet begins."""
TOLERATES = "tolerates "
"""How the spot-applied part that names the tolerations the mode wants begins."""
STILL_TOLERATES = "still tolerates "
"""How the part begins that names the tolerations an earlier pass of the same mode added, which the pod still
carries and the mode no longer wants (``_still_carried``); read back with the others (``named_tolerations``)."""
STILL_WHY = " (added by an earlier review: taken out when the spot mode changes)"
STILL_WHY_DAEMONSET = (
    " (added by an earlier review: taken out when the spot mode changes, kept where a default comes to leave the"
    " DaemonSet alone)"
)
"""The same words for a DaemonSet whose mode a default gave: a default that leaves it alone makes its mode off and
keeps them (``_undo_earlier``, ``KEPT``); "taken out when the spot mode changes" was not true there (found by a
review of the spot policy)."""
ASKED = "asked by annotation"
"""Where the mode came from when the pod's own annotation asked it (``_asked``), as the words say it."""
NVIDIA_RESOURCES = "nvidia.com/"
OWN_TOLERATIONS = "its own: "
"""How the spot-applied part begins that names the tolerations the pod had itself (``_own_tolerations``)."""
KEPT_OFF = "keeps off spot capacity, whose nodes it would tolerate: requires none of "
"""How the spot-applied part that says what ``never`` added begins where the pod reaches a spot pool now; the places
follow (``_said_off_spot``)."""
KEPT_OFF_UNREACHED = "keeps off spot capacity, none of which it reaches now: requires none of "
"""The same where it reaches none now (spot nodes an autoscaler may add; a spot node whose taint it does not
tolerate): "whose nodes it would tolerate" was said there too, and was not true (found by a review of the spot
policy)."""
KEPT_OFF_UNKNOWN = "keeps off spot capacity, the cluster's nodes not known yet: requires none of "
"""The same where the cluster is not known (no node list yet, no pool declared): every spot place is kept off."""
KEPT_OFF_BEFORE = "keeps off spot capacity, whose nodes it would tolerate: requires not "
"""The same words as earlier releases wrote them ("requires not A or B" read as "(not A) or B"): still read."""
KEPT_OFF_WORDS = (KEPT_OFF, KEPT_OFF_UNREACHED, KEPT_OFF_UNKNOWN, KEPT_OFF_BEFORE)
"""Every beginning of the part that says what ``never`` added, read back."""


@dataclass(frozen=True)
class Wanted:
    """A toleration the policy wants the pod to carry."""

    key: str
    value: str | None
    """None: operator Exists (any value)."""
    effect: str
    on_cluster: frozenset[str] = field(default=frozenset(), compare=False)
    """An Exists's: the values the cluster's taints of its key and effect carry (``_cluster_values``), each of
    which a pod's own toleration of may tolerate instead (``covered``)."""

    def toleration(self) -> JSON:
        if self.value is None:
            return {"key": self.key, "operator": "Exists", "effect": self.effect}
        return {"key": self.key, "operator": "Equal", "value": self.value, "effect": self.effect}

    def __str__(self) -> str:
        """``key=value:Effect`` (Equal) or ``key:Effect`` (Exists); read back by ``parse_wanted``."""
        return f"{self.key}={self.value}:{self.effect}" if self.value is not None else f"{self.key}:{self.effect}"


def parse_wanted(text: str) -> Wanted | None:
    """The inverse of ``str(Wanted)``; None for text that is not one."""
    head, sep, effect = text.rpartition(":")
    if not sep or not head or effect not in EFFECTS:
        return None
    key, eq, value = head.partition("=")
    if not key or (eq and not value):
        return None
    return Wanted(key, value if eq else None, effect)


def covered(tolerations: Iterable[object], wanted: Wanted) -> bool:
    """Whether an existing toleration already tolerates everything ``wanted`` would; for an Exists, or the taints of
    its key and effect on the cluster (``Wanted.on_cluster``): OKE's, of undocumented value, tolerated by the pod's
    own Equal, got a second, broader toleration (found by a review of the spot policy)."""
    own = [tol for tol in tolerations if isinstance(tol, dict)]
    if wanted.value is None and wanted.on_cluster:
        taints = [Taint(wanted.key, v, wanted.effect) for v in wanted.on_cluster]
        if all(any(toleration_tolerates(tol, t) for tol in own) for t in taints):
            return True
    for tol in own:
        if wanted.value is not None:
            if toleration_tolerates(tol, Taint(wanted.key, wanted.value, wanted.effect)):
                return True
            continue
        # wanted is an Exists: only an Exists on the same key (or an empty-key Exists) covers every value
        if (tol.get("operator") or "Equal") != "Exists":
            continue
        if (tol.get("key") or "") not in ("", wanted.key):
            continue
        if (tol.get("effect") or "") in ("", wanted.effect):
            return True
    return False


# ---------------------------------------------------------------------------------------------------------------
# Deciding


def _owner_kinds(pod: PodView) -> tuple[str, ...]:
    """The owner kinds a default may name, in order: the direct controller with its API group
    (``Job.batch.volcano.sh``), then by its name alone; then Deployment (``Deployment.apps``) for the pods of its
    ReplicaSets (they carry the ``pod-template-hash`` label; a Deployment's own template counts too). A built-in
    kind's name alone counts only in its own API group: a Volcano Job's pods (batch.volcano.sh, gang-scheduled) got
    the default for Job pods, spot tolerations with it (a review of real manifests)."""
    owner, group = pod.owner_kind, pod.owner_group
    if not owner:
        return ()
    builtin = group in BUILTIN_GROUPS.get(owner, (group,))  # or a kind of no built-in name
    kinds = ((f"{owner}.{group}",) if group else ()) + ((owner,) if builtin else ())
    if builtin and (pod.kind == "Deployment" or (owner == "ReplicaSet" and "pod-template-hash" in pod.labels)):
        kinds += (f"Deployment.{group if group == 'extensions' else 'apps'}", "Deployment")
    return kinds


def _asked(pod: PodView, ctx: Context, out: Outcome) -> tuple[str, str, str]:
    """(mode, where it came from, what was ignored); mode is tolerate, prefer, require, never or off; the last is
    '' unless the pod's annotation holds a value that is not one of ``ACCEPTED`` (also warned about)."""
    raw = pod.annotations.get(PREFIX + REQUEST)
    if isinstance(raw, bool):  # an unquoted YAML boolean in an offline manifest
        raw = "true" if raw else "false"
    ignored = ""
    if isinstance(raw, str):
        mode = MODES.get(raw.strip().lower())
        if mode:
            return mode, ASKED, ""
        shown = raw if len(raw) <= 24 else raw[:23] + "…"
        ignored = f"{PREFIX}{REQUEST} {shown!r} is not {ACCEPTED}: ignored"
        out.warn(f"{PREFIX}{REQUEST}: {shown!r} is not {ACCEPTED}; ignored")
    elif raw is not None:
        ignored = f"{PREFIX}{REQUEST} is not a string: ignored"
        out.warn(f"{PREFIX}{REQUEST}: not a string; ignored (use {ACCEPTED})")
    mode, why = _default(pod, ctx)
    if _leaves_alone(pod, mode):  # its pods, and a DaemonSet's template
        # a DaemonSet runs on every node it may, the GPU Operator's device plugin and feature discovery among them:
        # kept off spot nodes by a default, those nodes would offer no GPU; kept to them by a require (or prefer)
        # default, its pod bound to an on-demand node by matchFields was never schedulable, and its template no
        # longer covered on-demand nodes (found by a review of the spot policy). Only its own annotation counts.
        # A tolerate default still reaches it: it only lets the DaemonSet run on tainted spot nodes too, which a
        # GPU Operator's or DCGM's is meant to (found by a review: refusing ownerDefaults DaemonSet: tolerate made
        # settings that loaded before crash-loop the webhook on upgrade).
        return "off", f"{why} {mode}, which leaves a DaemonSet's pods alone", ignored
    if mode == "never" and pod.spec.get("nodeName"):  # placed already
        return "off", f"{why} never, which leaves pods bound to a node alone", ignored
    return mode, why, ignored


def _leaves_alone(pod: PodView, default: str) -> bool:
    """Whether a ``default`` mode leaves the pod, a DaemonSet's or its template, alone (``DAEMONSETS_LEFT_ALONE``)."""
    return default in DAEMONSETS_LEFT_ALONE and pod.owner_kind == "DaemonSet"


def _default(pod: PodView, ctx: Context) -> tuple[str, str]:
    """The configured default that applies to a pod that does not ask, and where it came from."""
    settings = ctx.settings.spot
    for owner in _owner_kinds(pod):
        if owner in settings.owner_defaults:
            return settings.owner_defaults[owner], f"default for {owner} pods"
    namespace = ctx.namespace or pod.namespace
    if namespace and namespace in settings.namespace_defaults:
        return settings.namespace_defaults[namespace], f"default for namespace {namespace}"
    return settings.default, "global default"


def _spot_presets(ctx: Context) -> list[TaintPreset]:
    presets = list(ctx.cluster.presets.spot_taints)
    presets += [TaintPreset(t.key, t.value or None, t.effect, "settings") for t in ctx.settings.spot.extra_taints]
    return list(dict.fromkeys(presets))


def _providers_shown(ctx: Context, labelled: bool = False) -> set[str]:
    """The providers the cluster shows (``ClusterView.providers``: their labels, OKE's pool annotation, a kubelet
    version). Read from the labels alone, an OKE cluster with no preemptible node showed no provider: require was
    refused as on k3s (found by a review of the spot policy). ``labelled``: not those a kubelet version alone shows
    (``ClusterView.labelled_providers``), for the spot places: an EKS cluster of self-managed node groups, whose
    spot nodes carry no EKS label, was made to require eks.amazonaws.com/capacityType=SPOT, and its pods stayed
    Pending for good, where require was refused with how to declare the spot pools (found by a review)."""
    return set(ctx.cluster.labelled_providers if labelled else ctx.cluster.providers)


def _providers_coming(ctx: Context, labelled: bool = False) -> set[str]:
    """The providers whose spot nodes may come to the cluster though none is there now: those it shows (``labelled``:
    by their labels, ``_providers_shown``), those the settings name (not the default ``[all]``), and those that
    make nodes from zero where one of these shows (``_makers_from_zero``: Karpenter on EKS). Their spot labels are
    kept where no node carries them: a Karpenter NodePool at zero beside an EKS node group got only EKS's label,
    kept off or required, and Karpenter launched a spot node for a never pod, or none for a require one (found by a
    review of the spot policy)."""
    return _providers_shown(ctx, labelled) | _providers_named(ctx) | _makers_from_zero(ctx)


def _providers_named(ctx: Context) -> set[str]:
    """The providers the settings name (none for the default ``[all]``)."""
    named = ctx.settings.cluster.providers
    return set() if "all" in named else set(named)


def _makers_from_zero(ctx: Context) -> set[str]:
    """The providers that make nodes from zero (``Presets.runs_on``) where a cloud they run on shows, by a kubelet
    version too, or the settings name it. Read from the providers shown by their labels alone
    (``_providers_coming(labelled=True)``), a self-managed EKS cluster, which shows EKS by its kubelets, lost
    Karpenter's spot label with EKS's: never let Karpenter launch a spot node for the pod, and require was refused
    where it had been admitted (found by a review of the spot policy). On such a cluster without Karpenter, never
    adds a ``NotIn`` on a label no node carries, harmless, and require is admitted on Karpenter's label alone and
    stays Pending, which its warning says (``_warn_unplaceable``): refusing it would refuse it where a NodePool at
    zero waits for it."""
    hosts = _providers_shown(ctx) | _providers_named(ctx)
    return {name for name, on in ctx.cluster.presets.runs_on.items() if not on.isdisjoint(hosts)}


def _providers_seen(presets: Sequence[TaintPreset], ctx: Context, every: bool = True) -> list[TaintPreset]:
    """The presets of the providers whose spot nodes may come (``_providers_coming``; all of them when none may,
    if ``every``), and those from settings."""
    seen = _providers_coming(ctx)
    return [p for p in presets if (every and not seen) or p.provider in seen or p.provider == "settings"]


def _gpu_presets(ctx: Context) -> list[TaintPreset]:
    known = ctx.cluster.presets.gpu_taints
    return [known[name] for name in dict.fromkeys(ctx.settings.spot.gpu_taint_presets) if name in known]


def _narrowed(presets: Sequence[TaintPreset], ctx: Context, cluster: bool = True) -> tuple[list[Wanted], bool]:
    """The tolerations for ``presets``, and whether they were narrowed to the cluster's taints (never when not
    ``cluster``)."""
    if cluster and ctx.cluster.groups and ctx.settings.spot.only_cluster_taints:
        have = sorted(ctx.cluster.taints(), key=lambda t: (t.key, t.value, t.effect))
        wanted: list[Wanted] = []
        for p in presets:
            for t in have:
                if t.key != p.key or t.effect not in EFFECTS:
                    continue
                if p.value is None:
                    wanted.append(Wanted(t.key, None, t.effect, _cluster_values(t.key, t.effect, ctx)))
                elif t.value == p.value:
                    wanted.append(Wanted(t.key, t.value, t.effect))
        return list(dict.fromkeys(wanted)), True
    return list(dict.fromkeys(Wanted(p.key, p.value, p.effect) for p in presets)), False


def _cluster_values(key: str, effect: str, ctx: Context) -> frozenset[str]:
    """The values the cluster's taints of ``key`` and ``effect`` carry (``Wanted.on_cluster``)."""
    return frozenset(t.value for t in ctx.cluster.taints() if t.key == key and t.effect == effect)


def _is_gpu_pod(pod: PodView, requested: Mapping[str, Decimal] | None = None) -> bool:
    if pod.annotation("gpu-fraction") is not None:
        return True
    return any(
        name == GPU_MEMORY_RESOURCE or name.startswith(NVIDIA_RESOURCES)  # gpu, gpu.shared, mig-<profile>
        for name in (requested_resources(pod.spec) if requested is None else requested)
    )


Places = tuple[list[list[Expression]], str, bool]
_PLACES = ("spot", "places")
"""``_spot_places``' key in ``ClusterView.policy_memo``."""


def _spot_places(ctx: Context) -> Places:
    """``_find_spot_places``, worked out once per snapshot and settings (``ClusterView.policy_memo``): they depend on
    nothing else, and a request asked for them several times (this policy's steps, the cuda and mig policies' words
    on spot: require), each pod of a workload again. Shared between requests: read only."""
    return ctx.cluster.policy_memo.per_settings(
        _PLACES, ctx.settings, lambda: _find_spot_places(ctx), lambda found: len(found[1])
    )


def _find_spot_places(ctx: Context) -> Places:
    """Where spot capacity is, as ORed terms for prefer / require, their text, and whether the cluster has any.

    The spot capacity labels of the presets and ``extra_labels``, one term per key (its values ORed), in preset
    order; then the nodeSelector of each declared pool with ``spot: true``. When the cluster is known, only the
    keys its nodes or pools carry, and every label of a provider whose spot nodes may come (``_providers_coming``;
    not one a kubelet version alone shows: an EKS self-managed node group's spot nodes carry no EKS label, though
    Karpenter's, which runs on it, are kept),
    or of ``extra_labels``, none of which is there now (a GKE cluster whose spot nodes carry gke-spot is not given
    the older gke-preemptible): a ``NotIn`` on a label no node carries, or one more alternative of the OR, harms
    no node. None at all where the providers shown label no spot node (CoreWeave's spot pools
    carry no spot label), nor where no provider shows (k3s, self-managed nodes) and the settings name none (the
    default ``[all]``): no cloud's autoscaler adds nodes to such a cluster, and every cloud's labels would leave a
    pod that requires them Pending for good. The cluster has some when a node or pool carries one of the labels,
    or a pool is declared ``spot: true``, or it is not known.
    """
    pairs = [(k, v) for k, v, _ in ctx.cluster.presets.spot_labels]
    pairs += list(ctx.settings.spot.extra_labels.items())
    by_key: dict[str, list[str]] = {}
    for key, value in pairs:
        values = by_key.setdefault(key, [])
        if value not in values:
            values.append(value)
    labels = list(by_key.items())
    on_cluster = not ctx.cluster.groups or any(ctx.cluster.label_values(k) for k, _ in labels)
    if ctx.cluster.groups:
        keys: dict[str, list[str]] = {}  # per provider coming, and for settings
        coming = _providers_coming(ctx, labelled=True)
        for key, _, provider in ctx.cluster.presets.spot_labels:
            if provider in coming:
                keys.setdefault(provider, []).append(key)
        keys["settings"] = list(ctx.settings.spot.extra_labels)
        kept = {k for ks in keys.values() if not any(map(ctx.cluster.label_values, ks)) for k in ks}
        labels = [(k, vs) for k, vs in labels if k in kept or ctx.cluster.label_values(k)]
    terms = [[expression(k, "In", vs)] for k, vs in labels]
    shown = [_label_text(k, vs) for k, vs in labels]
    for pool in ctx.settings.cluster.pools:
        if pool.spot:
            on_cluster = True
            term = _pool_term(pool)
            if term not in terms:
                terms.append(term)
                shown.append(
                    f"pool {pool.name} ({', '.join(f'{k}={v}' for k, v in sorted(pool.node_selector.items()))})"
                )
    return terms, " or ".join(shown), on_cluster


REQUIRED_CAPACITY = "the spot capacity it requires"
"""How the cuda and mig policies name what keeps a pod off a pool where only the spot places ``require`` ANDed into
its required node affinity do (``kept_off_by_require``): so in the cuda policy's words that a kubectl warning
repeats (cut at 119 characters, it would lose the pools named after the annotation), else as
``KEPT_OFF_BY_REQUIRE``."""
KEPT_OFF_BY_REQUIRE = f"{REQUIRED_CAPACITY} ({PREFIX}spot: require)"
KEPT_OFF_BY_NEVER = "the webhook's spot: never affinity"
"""How the cuda and mig policies name what keeps a pod off a pool where only the ``NotIn`` that ``never`` ANDed into its
required node affinity does (``kept_off_by_never``): "its nodeSelector/affinity" named rules the user did not
write (found by a review of a gated pod's warning)."""


def tolerate_hint(taints: Sequence[Taint], ctx: Context) -> str:
    """The advice's hint that this policy's tolerate would do, "(or annotation gpu-admission.io/spot: tolerate)",
    where every one of ``taints`` is a spot taint it tolerates (the presets' and ``extra_taints``): one place for the
    cuda and mig policies' advice on a pool they keep a pod off; '' otherwise."""
    return f" (or annotation {PREFIX}spot: tolerate)" if taints and all(is_spot_taint(t, ctx) for t in taints) else ""


def is_spot_taint(taint: Taint, ctx: Context) -> bool:
    """``taint`` is a spot taint, which tolerate tolerates and never does not (the presets' and ``extra_taints``)."""
    return any(p.key == taint.key for p in _spot_presets(ctx))


def kept_off_by_require(
    mode: str,
    spec: JSON,
    groups: Iterable[NodeGroup],
    ctx: Context,
    resources: Mapping[str, Decimal] | Iterable[str] = (),
) -> list[NodeGroup]:
    """Those of ``groups`` that a pod with ``spec`` is kept off only by the spot places ``require`` ANDed into its
    required node affinity: with them taken out (``unnarrow``), it lands there (``ClusterView.eligible`` for
    ``resources``). The cuda and mig policies then name this policy's requirement, not the pod's own rules, which
    the user did not write (found by a review of the spot policy). [] for a pod not under require (``mode``, this
    policy's decision): the same places written by the user, with no spot annotation or under never, were blamed on
    it too (found by a review)."""
    return _freed(spec, _spot_places(ctx)[0], groups, ctx, resources) if mode == "require" else []


def kept_off_by_never(
    mode: str,
    spec: JSON,
    groups: Iterable[NodeGroup],
    ctx: Context,
    resources: Mapping[str, Decimal] | Iterable[str] = (),
    steering: Sequence[Expression] = (),
) -> list[NodeGroup]:
    """Those of ``groups`` that a pod with ``spec`` is kept off only by the ``NotIn`` off spot places that ``never``
    ANDed into its required node affinity (``kept_off_by_require``'s counterpart), or by it and the cuda policy's
    ``steering`` expressions: planned once spot capacity was kept off, these name no spot pool, and the spot pools
    the ``NotIn`` alone does not free stayed blamed on "its nodeSelector/affinity" (found by a review of a gated
    pod's warning). [] for a pod not under never."""
    if mode != "never":
        return []
    off = [alt for alternatives in _off_spot(ctx)[0] for alt in alternatives]
    freed = _freed(spec, off, groups, ctx, resources)
    rest = [g for g in groups if g.spot and g not in freed]
    with_steering = _freed(spec, [*off, *([e] for e in steering)], rest, ctx, resources) if steering else []
    return [g for g in groups if g in freed or g in with_steering]


def _freed(
    spec: JSON,
    places: Sequence[Sequence[Expression]],
    groups: Iterable[NodeGroup],
    ctx: Context,
    resources: Mapping[str, Decimal] | Iterable[str],
) -> list[NodeGroup]:
    """Those of ``groups`` a pod with ``spec`` lands on once ``places``' expressions are taken out of its required
    node affinity (``unnarrow``); [] where it holds none of them."""
    trial = PodView("Pod", {}, copy_json(spec), "")  # unnarrow edits the terms in place
    if not places or not unnarrow(trial, places):
        return []
    freed = {id(c.group) for c in ctx.cluster.eligible(trial.spec, resources)}
    return [g for g in groups if id(g) in freed]


def _off_spot(ctx: Context) -> tuple[list[list[list[Expression]]], str]:
    """What keeps a pod off the cluster's spot places, as narrowings for ``narrow`` (one per place: the negation of
    its term, an OR of ``NotIn`` per expression), and their text (read back by ``_said_off_spot``). The places no
    node carries are among them (a GKE spot pool at zero: found by a review of the spot policy); where the cluster
    is not known, every one (``_spot_places``), as require is kept to them all: never did nothing there, and an
    EKS, Karpenter or CoreWeave spot node, untainted, took the pod unsaid (found by a review of the spot policy)."""
    terms, shown, _ = _spot_places(ctx)
    return _negated(terms), shown


_POOL_TEXT = re.compile(r"pool .* \(([^()]*)\)")
_IN_TEXT = re.compile(r"(\S+) in \(([^()]*)\)")
_EQUAL_TEXT = re.compile(r"([^\s=]+)=(\S+)")
REQUIRES = "requires "
PREFERS = "prefers "
NOT_ON_CLUSTER = " (none of these labels is on the cluster's nodes or pools)"
WEIGHT_TEXT = f" (weight {PREFERRED_WEIGHT})"
"""How the part that says what ``prefer`` added ends; ``NOT_ON_CLUSTER`` before it where no node carries them."""


def _read_places(shown: str) -> list[list[Expression]] | None:
    """The terms of places as ``_spot_places`` writes them ('k=v', 'k in (a, b)', 'pool p (k=v, ...)', joined by
    ' or '); None when they cannot be read."""
    terms = []
    for place in shown.split(" or "):
        if (pool := _POOL_TEXT.fullmatch(place)) and all("=" in p for p in pool[1].split(", ")):
            terms.append([expression(k, "In", [v]) for k, _, v in (p.partition("=") for p in pool[1].split(", "))])
        elif labels := _IN_TEXT.fullmatch(place):
            terms.append([expression(labels[1], "In", labels[2].split(", "))])
        elif label := _EQUAL_TEXT.fullmatch(place):
            terms.append([expression(label[1], "In", [label[2]])])
        else:
            return None
    return terms


def _said_places(text: str, head: str, *tails: str) -> list[list[Expression]] | None:
    """The spot places the part of a spot-applied text that begins with ``head`` names (each of ``tails`` in turn,
    if it ends so, left out); [] when no part does, None when they cannot be read. Read back from the words, not
    from today's view of the cluster, which may no longer show the places the webhook wrote (a spot pool scaled to
    zero) or may show others."""
    part = next((p for p in text.split("; ") if p.startswith(head)), None)
    if part is None:
        return []
    shown = part[len(head) :]
    for tail in tails:
        shown = shown[: -len(tail)] if shown.endswith(tail) else shown
    return _read_places(shown)


def mode_of(applied: str) -> str:
    """The spot mode an earlier pass's words (``APPLIED``'s text) begin with: 'require (asked by annotation); ...'.
    Over the final pod (``validate``), the mode this policy decided: what the cuda policy's refusal may read."""
    return applied.split(" (", 1)[0]


def decided_mode(out: Outcome) -> str:
    """The spot mode this policy decided for the pod in this pass, as its spot-applied words begin (tolerate, prefer,
    require, never, off; '' where it wrote none: a pod that asks nothing and no default reaches). For the later
    policies, which name ``spot: require`` as what keeps a pod off on-demand pools only where the pod is under it:
    the spot places of the cluster matched the pod's own affinity to spot capacity, and a pod that asked nothing was
    told to ask for prefer instead of require (found by a review of the spot policy)."""
    return mode_of(out.annotations.get(APPLIED, ""))


def asked_mode(pod: PodView, ctx: Context) -> str:
    """The spot mode the pod is under (its annotation, else its defaults) whatever this policy wrote: under never, it
    writes nothing where the spot taints alone keep the pod off spot capacity (AKS), yet the cuda policy must say that
    never, not a missing toleration, keeps it off a spot pool (found by a review: it was told to add the toleration)."""
    return _asked(pod, ctx, Outcome())[0]


def required_places(applied: str) -> list[Expression]:
    """The expressions of the spot places that an earlier pass's words (``APPLIED``'s text) say require wrote; []
    for another mode, or words that cannot be read. This policy takes them out itself (``_forget_places``,
    ``_undo_earlier``: from the terms it can have made, ``affinity.unnarrow``'s ``narrowed``), so the CUDA
    steering's ``forget`` before it leaves them, though its steering by a pool selector may have written one too:
    taken out there, the terms that narrow multiplied no longer showed what it made."""
    if mode_of(applied) != "require":
        return []
    return [e for term in _said_places(applied, REQUIRES, NOT_ON_CLUSTER) or () for e in term]


def _spot_place(term: Sequence[Expression], ctx: Context) -> bool:
    """Whether ``term`` is one the webhook writes for a spot place: a spot label of a preset or ``extra_labels``
    (whatever the cluster shows now), or a pool declared ``spot: true``. Words that name anything else are not the
    webhook's (a forged or edited annotation), and are not said again. (An undo acts on them all the same: on a
    template, only a user's own words could name a place the webhook never wrote, and a pool no longer declared
    was one it wrote.)"""
    if len(term) == 1 and term[0].get("operator") == "In":
        pairs = {(k, v) for k, v, _ in ctx.cluster.presets.spot_labels} | set(ctx.settings.spot.extra_labels.items())
        key = term[0].get("key")
        if all((key, v) in pairs for v in as_list(term[0].get("values"))):
            return True
    return any(list(term) == _pool_term(pool) for pool in ctx.settings.cluster.pools if pool.spot)


def _negated(terms: Sequence[Sequence[Expression]]) -> list[list[list[Expression]]]:
    """Narrowings off each term's places: for each, an OR of ``NotIn`` per expression."""
    return [[[expression(as_str(e["key"]), "NotIn", list(e["values"]))] for e in term] for term in terms]


def _said_off_spot(text: str, ctx: Context | None = None) -> list[list[list[Expression]]] | None:
    """The narrowings a spot-applied text says ``never`` added; [] when it says none, None when unreadable (or,
    given ``ctx``, when it names a place that is no spot place: words to be said again must be true)."""
    head = next((h for p in text.split("; ") for h in KEPT_OFF_WORDS if p.startswith(h)), "")
    terms = _said_places(text, head) if head else []
    if terms and ctx is not None and not all(_spot_place(t, ctx) for t in terms):
        return None
    return None if terms is None else _negated(terms)


def _keep_off_spot(pod: PodView, ctx: Context, out: Outcome) -> str:
    """``never`` where spot nodes carry no taint to keep the pod off (EKS, Karpenter, CoreWeave): a required node
    affinity off the spot places, when the pod could land on a spot pool of the known cluster (it tolerates its
    taints) and on another. Where its own rules leave it only spot pools, a warning instead: the affinity would
    leave it nowhere. Returns the words for the annotation, '' when nothing is added.

    A pod that carries the affinity an earlier pass says it added (reinvocation; the last review of a workload;
    the pods of a template reviewed so) keeps it, and those words: judged again, with the steering the later
    policies planned around it (the cuda policy's terms to supported pools, the mig policy's pin), it could seem
    to need it no more, and each pass would undo the last. The spot places the cluster shows now and the words do
    not name (a pool declared spot since) are kept off too, and named after them."""
    narrowings, shown = _off_spot(ctx)
    earlier = ctx.prior.get(APPLIED, "")
    said = _said_off_spot(earlier, ctx) or []
    kept = bool(said) and all(holds(pod, alternatives) for alternatives in said)
    texts = shown.split(" or ") if narrowings else []  # one per place: no pool name or label holds " or "
    if kept:
        fresh = [(n, text) for n, text in zip(narrowings, texts, strict=True) if n not in said]
        narrowings = [*said, *(n for n, _ in fresh)]
    elif not narrowings:
        return ""
    # judged without what an earlier pass added, so that a second pass says the same
    own = pod
    if required_terms(pod):
        trial = PodView(pod.kind, {}, copy_json(pod.spec), pod.namespace, pod.owner_kind)
        if unnarrow(trial, [alt for alternatives in narrowings for alt in alternatives]):
            own = trial
    judged = own.spec
    if GPU_MEMORY_RESOURCE in requested_resources(pod.spec) or pod.annotation("gpu-fraction") is not None:
        # the mig policy turns it into an nvidia.com/ device, whose GPU taint is then tolerated (by the device
        # plugin's ExtendedResourceToleration, or by the mig policy itself): judged so on the first pass too
        judged = device_spec(own.spec)
    # a gated pod is not placed yet: what takes its gate away may add tolerations (Kueue: its ResourceFlavor's), and
    # it then lands where they let it; judged as tolerating every taint, it keeps its NotIns (a Kueue-gated never
    # pod got none where an AKS spot pool was declared at zero, and after its ungating ran on spot: a review). Its
    # words are judged on its own tolerations (``ungated``): it tolerates no spot taint yet
    ungated, judged = judged, gated_spec(judged)
    gated = judged is not ungated
    if ctx.cluster.groups:
        # a place whose taints alone keep the pod off needs no NotIn: noise in its affinity (where the cluster is
        # not known, every place is kept off, as require is kept to them all)
        if kept:
            fresh = [(n, text) for n, text in fresh if not _taint_keeps_off(n, judged, pod, ctx)]
            narrowings = [*said, *(n for n, _ in fresh)]
        elif needed := [
            (n, t) for n, t in zip(narrowings, texts, strict=True) if not _taint_keeps_off(n, judged, pod, ctx)
        ]:
            narrowings, shown = [n for n, _ in needed], " or ".join(text for _, text in needed)
        else:
            return ""
    # a cordoned or not-ready node takes pods again: reached all the same (an untainted AKS spot node cordoned seemed
    # out of reach, and the never pod got no NotIn: found by a review)
    reach = {**judged, "tolerations": [*as_list(judged.get("tolerations")), *LEAVING_TOLERATIONS]}
    places = ctx.cluster.eligible(reach, (), gpu_only=_is_gpu_pod(pod))
    spot = [c.group for c in places if c.group.spot]
    if spot and all(c.group.spot for c in places) and gated:
        # its own tolerations are not final (Kueue may add its spot flavor's): kept off all the same, and told why
        # it may wait (it was told its own rules left it only spot pools, and got no NotIn: found by a review)
        head, tail = (
            "spot never, yet only ",
            " can offer what it asks: once ungated, Pending until on-demand ones do",
        )
        out.warn(head + pool_names(spot, room=WARNING_LIMIT - len(head) - len(tail), what="spot pool") + tail)
    elif spot and all(c.group.spot for c in places):  # its own rules: narrowing would leave it nowhere
        head = "spot never, yet its nodeSelector, affinity or tolerations leave it only "
        out.warn(head + pool_names(spot, room=WARNING_LIMIT - len(head), what="spot pool"))
        if not kept:
            return ""
    elif not spot and not kept:
        # no spot pool it reaches now; where the cluster labels every node with its capacity type (Karpenter, EKS
        # node groups), or no node carries a place's labels (a spot pool at zero: GKE's, untainted unless made so,
        # did nothing; found by a review of the spot policy), its autoscaler may add spot nodes for the pod,
        # untainted: kept off the spot places all the same (every one: a second pass, which reads them back, adds
        # any left out). Where the spot nodes there now carry the place's label, their taints keep the pod off.
        # Not where every spot node of the place's provider carries taints the pod does not tolerate (AKS, OKE):
        # those keep it off, as they do the spot nodes there now (found by a review: a never default edited every
        # pod of an AKS cluster with no spot node, and would have rolled every Deployment on its next edit).
        carried = ctx.cluster.on_demand_keys
        tolerations = as_list(judged.get("tolerations"))
        if not any(
            all(e["key"] in carried or not ctx.cluster.label_values(e["key"]) for alt in n for e in alt)
            and not _tainted_off({e["key"] for alt in n for e in alt}, tolerations, ctx)
            for n in narrowings
        ):
            return ""
        if not ctx.cluster.groups and (why := _unjudged(own.spec, narrowings, ctx)):
            # no node tells where its own rules lead: kept off every spot place, they could leave it nowhere
            out.warn(clipped(f"spot never, yet {why}: not kept off spot capacity (no node known yet)", WARNING_LIMIT))
            return ""
    changed = False
    for alternatives in narrowings:
        changed = narrow(pod, alternatives) or changed
    if changed:
        out.mutated("spot-affinity")
    out.reasons.append("SpotNever")
    if not ctx.cluster.groups:
        now = KEPT_OFF_UNKNOWN  # "none of which it reaches now" would not be known to be true
    else:
        now = KEPT_OFF if _tolerates_spot(ungated, pod, ctx) else KEPT_OFF_UNREACHED
    if kept:
        words = next(p for p in earlier.split("; ") if p.startswith(KEPT_OFF_WORDS))
        head = next(h for h in KEPT_OFF_WORDS if words.startswith(h))
        # The places are said again as they were, their beginning as the cluster is now: a template's "none of which
        # it reaches now" stayed on the pods made from it once a spot pool had scaled up, and the reverse; an earlier
        # release's words, rewritten, said "whose nodes it would tolerate" with no spot node (found by a review of the
        # spot policy). Those words are kept as they stand where they are still true and nothing is added.
        if fresh or head != KEPT_OFF_BEFORE or now != KEPT_OFF:
            words = now + words[len(head) :]
        return words + "".join(f" or {text}" for _, text in fresh)
    return now + shown


HOSTNAME_LABEL = "kubernetes.io/hostname"


CAPACITY_BLIND_LABELS = frozenset(
    {
        "kubernetes.io/os",
        "beta.kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/arch",
        "node.kubernetes.io/instance-type",
        "beta.kubernetes.io/instance-type",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "cloud.google.com/gke-accelerator",
        "kubernetes.azure.com/accelerator",
        "topology.k8s.aws/zone-id",
    }
)
"""Well-known node labels that say nothing of a node's capacity type (the OS, the architecture, the instance type,
the zone, a cloud's accelerator; kubernetes.io "Well-Known Labels, Annotations and Taints"; Karpenter on AWS's zone
id), and, by prefix (``CAPACITY_BLIND_PREFIXES``), GFD's, NFD's and Karpenter on AWS's instance properties: a pod
that selects by them alone is kept off spot places as any other where no node tells where spot capacity is."""
CAPACITY_BLIND_PREFIXES = (
    "nvidia.com/",
    "feature.node.kubernetes.io/",
    "karpenter.k8s.aws/instance-",
    "eks.amazonaws.com/instance-",
    "karpenter.azure.com/sku-",
)
"""``karpenter.k8s.aws/instance-``: the EC2 instance type's properties Karpenter labels its nodes with
(aws/karpenter-provider-aws ``pkg/apis/v1/labels.go``: instance-category, -family, -generation, -size, -cpu,
-memory, -gpu-name, -gpu-count, ...), which an instance type has on spot and on-demand capacity alike, as
``node.kubernetes.io/instance-type``; EKS Auto Mode's the same under its own group, and Karpenter on Azure's of the
VM size (Azure/karpenter-provider-azure ``pkg/apis/v1beta1/labels.go``: sku-family, -name, -cpu, -memory,
-gpu-name, ...). Not Karpenter on AWS's other labels: ``ec2nodeclass`` names its own nodes, as a NodePool does,
and ``capacity-reservation-id``/``-type`` a capacity reservation's."""


def _chooses_by(key: object, ctx: Context) -> bool:
    """A nodeSelector or ``In`` on ``key`` chooses the pod's place, which may be spot capacity and no node tells
    where the cluster is not known: any key but the well-known ones that say nothing of capacity
    (``CAPACITY_BLIND_LABELS``) and the spot labels themselves (which ``_unjudged`` reads as pinning, or not). A list
    of the keys that do (the presets' pool labels) missed eksctl's nodegroup-name and every label of the user's own:
    such pods were kept off every spot place, Pending for good on a spot node group, not warned of (found by a
    review)."""
    return (
        isinstance(key, str)
        and key not in CAPACITY_BLIND_LABELS
        and not key.startswith(CAPACITY_BLIND_PREFIXES)
        and all(key != k for k, _, _ in ctx.cluster.presets.spot_labels)
    )


def _unjudged(spec: JSON, narrowings: Sequence[Sequence[Sequence[Expression]]], ctx: Context) -> str:
    """Where the cluster is not known, why keeping a pod of ``spec`` off the spot places (``narrowings``) could
    leave it no node, in words; '' where it cannot: it is bound to a node (``nodeName``, or ``metadata.name In`` in
    each required term, as the DaemonSet controller binds its pods: the kubelet refuses a pod whose node fails its
    required affinity), its own nodeSelector or each of its required terms pins it to a spot place (a label ``In``
    values all of that place's, a nodeSelector's value one of them), as the known cluster's nodes tell
    (``_keep_off_spot``: "leave it only spot pools"), or its nodeSelector or each of its required terms chooses its
    place by a label that may say where spot capacity is (``_chooses_by``), or names its nodes (``_names_nodes``):
    which may be spot, and no node tells. A DaemonSet's pod for a spot node, and a pod selecting an EKS spot node
    group, were kept off every spot place, Pending for good and not warned of (found by a review of the spot
    policy); so was one selecting the node group by its required affinity, while one selecting a GPU model was
    left on spot capacity (found by a review of that fix)."""
    terms = required_terms(PodView("Pod", {}, spec, ""))
    if spec.get("nodeName") or (terms and all(_names_nodes(t) for t in terms)):
        return "it is bound to a node"
    selector = as_dict(spec.get("nodeSelector"))

    def pinned(term: JSON, off: Expression) -> bool:  # the term leaves ``off``'s key no value but those it excludes
        key, values = off["key"], off["values"]
        if key in selector:
            return selector[key] in values
        ins = [e for e in as_list(term.get("matchExpressions")) if isinstance(e, dict) and e.get("key") == key]
        return any(e.get("operator") == "In" and set(as_list(e.get("values"))) <= set(values) for e in ins)

    if all(any(all(any(pinned(t, e) for e in alt) for alt in n) for n in narrowings) for t in terms or [{}]):
        return "its nodeSelector or affinity pins it to spot capacity"
    if any(_chooses_by(key, ctx) for key in selector):
        return "its nodeSelector chooses its place"
    if terms and all(_names_nodes(t) or _chooses(t, ctx) for t in terms):
        return "its node affinity chooses its place"
    return ""


def _chooses(term: JSON, ctx: Context) -> bool:
    """The term holds only the nodes of the values it names of a key that chooses a place (``In``, ``_chooses_by``)."""
    return any(
        isinstance(e, dict)
        and _chooses_by(e.get("key"), ctx)
        and e.get("operator") == "In"
        and as_list(e.get("values"))
        for e in as_list(term.get("matchExpressions"))
    )


def _names_nodes(term: JSON) -> bool:
    """The term holds only the nodes it names (``matchFields`` ``metadata.name In``)."""
    return any(
        isinstance(f, dict) and f.get("key") == "metadata.name" and f.get("operator") == "In"
        for f in as_list(term.get("matchFields"))
    )


def _taint_keeps_off(narrowing: Sequence[Sequence[Expression]], judged: JSON, pod: PodView, ctx: Context) -> bool:
    """Whether taints the pod (of spec ``judged``) does not tolerate alone keep it off the place ``narrowing``
    negates, which then needs no NotIn: a spot label of providers that taint every spot node (``_tainted_off``), or
    a pool declared ``spot: true`` whose nodes all carry such a taint, or at zero will (its declared taints, and
    those of a provider its selector names: ``Presets.tainted_spot_taints``); not a cordon's or a node not ready's,
    which pass. An AKS spot pool declared at zero gave every never pod NotIn on its pool and on AKS's spot labels,
    whose taint kept the pod off already (found by a review of the spot policy)."""
    tolerations = as_list(judged.get("tolerations"))
    if _tainted_off({e["key"] for alt in narrowing for e in alt}, tolerations, ctx) and not _untainted_there(
        narrowing, judged, pod, ctx
    ):
        return True
    pool = next((p for p in ctx.settings.cluster.pools if p.spot and _negated([_pool_term(p)])[0] == narrowing), None)
    if pool is None:
        return False
    untied = {k: v for k, v in judged.items() if k not in ("affinity", "nodeSelector")}
    trial = {**untied, "nodeSelector": dict(pool.node_selector)}
    gpu_only = _is_gpu_pod(pod)
    anyway = {**trial, "tolerations": [{"operator": "Exists"}]}  # its nodes (or its declaration) are there
    trial["tolerations"] = [*tolerations, *LEAVING_TOLERATIONS]
    return bool(ctx.cluster.eligible(anyway, (), gpu_only)) and not ctx.cluster.eligible(trial, (), gpu_only)


def _untainted_there(narrowing: Sequence[Sequence[Expression]], judged: JSON, pod: PodView, ctx: Context) -> bool:
    """Whether a node there now in the place ``narrowing`` negates would take a pod of spec ``judged`` (its node
    affinity and nodeSelector aside, as ``_tolerates_spot``): the spot taint its provider gives every spot node
    (``_tainted_off``) was taken off (AKS's node-taint managers do), and the nodes, not the preset, say so. The
    preset speaks only for nodes yet to come (a pool at zero, the autoscaler's): an AKS cluster whose spot nodes
    had lost their taint got no NotIn for a never pod, which the scheduler then put on spot (found by a review).
    A cordon's or a node not ready's taint passes (``LEAVING_TOLERATIONS``, as in ``_taint_keeps_off``): such a node
    takes pods again, and one cordoned or not ready seemed out of reach and got no NotIn (found by a review)."""
    untied = {k: v for k, v in judged.items() if k not in ("affinity", "nodeSelector")}
    untied["tolerations"] = [*as_list(judged.get("tolerations")), *LEAVING_TOLERATIONS]
    place = [{"matchExpressions": [{**e, "operator": "In"} for alt in narrowing for e in alt]}]  # NotIn or NotIn
    trial = {
        **untied,
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": place}}},
    }
    return any(c.group.nodes for c in ctx.cluster.eligible(trial, (), gpu_only=_is_gpu_pod(pod)))


def _pool_term(pool: PoolSettings) -> list[Expression]:
    """The place of a pool declared ``spot: true``: its nodeSelector, as a term."""
    return [expression(k, "In", [v]) for k, v in sorted(pool.node_selector.items())]


def _tainted_off(keys: Iterable[str], tolerations: Sequence[object], ctx: Context) -> bool:
    """Whether each of ``keys`` is a spot label of providers that give every spot node their spot taints
    (``Presets.spot_tainted``), and the pod does not tolerate all of those taints: a spot node so labelled would
    never take it. A taint of undocumented value (OKE's) counts as tolerated by a toleration of any value."""
    presets = ctx.cluster.presets
    for key in keys:
        owners = {p for k, _, p in presets.spot_labels if k == key}
        if not owners or not owners <= presets.spot_tainted:
            return False
        for owner in owners:
            taints = [t for t in presets.spot_taints if t.provider == owner]
            if not taints or all(_may_tolerate(tolerations, t) for t in taints):
                return False
    return True


def _may_tolerate(tolerations: Sequence[object], preset: TaintPreset) -> bool:
    return any(
        isinstance(tol, dict)
        and toleration_tolerates(
            tol, Taint(preset.key, as_str(tol.get("value")) if preset.value is None else preset.value, preset.effect)
        )
        for tol in tolerations
    )


def _tolerates_spot(judged: JSON, pod: PodView, ctx: Context) -> bool:
    """Whether a pod of spec ``judged`` would tolerate the nodes of a spot pool there now, its node affinity and
    nodeSelector aside: what never's words say ("whose nodes it would tolerate", else "none of which it reaches
    now"), the same on every pass. Judged with them, a second pass saw the later policies' steering (the cuda
    policy's terms to the pools whose driver runs it) as the pod's own, and would say otherwise than the first."""
    untied = {k: v for k, v in judged.items() if k not in ("affinity", "nodeSelector")}
    return any(c.group.spot for c in ctx.cluster.eligible(untied, (), gpu_only=_is_gpu_pod(pod)))


def _spot_now(ctx: Context, gpu_pod: bool) -> bool:
    """Whether a node or pool of the known cluster is spot capacity now (its labels or taints, or ``spot: true``),
    one with GPUs for a GPU pod (a spot pool of CPU nodes is none for it)."""
    return ctx.cluster.gpu_spot_now if gpu_pod else ctx.cluster.spot_now


def _label_text(key: str, values: Sequence[str]) -> str:
    return f"{key}={values[0]}" if len(values) == 1 else f"{key} in ({', '.join(values)})"


# ---------------------------------------------------------------------------------------------------------------
# The policy


def mutate(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Add the spot tolerations (and affinity) the pod asks for, or its defaults give; nothing for other pods."""
    mode, why, ignored = _asked(pod, ctx, out)
    gpu_pod = _is_gpu_pod(pod)
    spot_now = _spot_now(ctx, gpu_pod)
    wanted, on_cluster, source = _wanted(ctx, mode, gpu_pod, spot_now) if mode in SPOT_MODES else ([], False, "")
    undone, changed = _undo_earlier(pod, ctx, mode, wanted)
    if changed:
        out.mutated("spot-undone")
    if undone:
        ignored = "; ".join(p for p in (ignored, undone) if p)
    if mode not in SPOT_MODES:
        kept_off = _keep_off_spot(pod, ctx, out) if mode == "never" else ""
        if ignored or kept_off:  # the pod asked for something: say on it what it got, for kubectl describe
            out.annotate(APPLIED, escaped("; ".join(p for p in (f"{mode} ({why})", ignored, kept_off) if p)))
        return
    if pod.annotations.get(SAFE_TO_EVICT) == "false":
        out.warn(f'spot {mode}, yet {SAFE_TO_EVICT}="false": spot nodes are reclaimed; use spot: never')
    parts = [f"{mode} ({why})"] + ([ignored] if ignored else [])
    known = bool(ctx.cluster.groups)
    current = pod.spec.get("tolerations")
    if current is not None and not isinstance(current, list):
        # the apiserver rejects such a pod anyway; rewriting the field would change the user's data
        parts.append("spec.tolerations is not a list: left as it is")
    elif wanted:
        parts.append(f"{TOLERATES}{', '.join(str(w) for w in wanted)} ({source})")
        if own := _own_tolerations(pod, ctx, mode, wanted):
            parts.append(OWN_TOLERATIONS + ", ".join(str(w) for w in own))
        if _tolerate(pod, wanted):
            out.mutated("spot-toleration")
    elif on_cluster:
        parts.append("no spot taint on the cluster's nodes or pools to tolerate")
    else:
        parts.append("no spot taint in the provider presets to tolerate")
    if isinstance(current, list) and (still := _still_carried(pod, ctx, mode, wanted)):
        why_still = STILL_WHY_DAEMONSET if pod.owner_kind == "DaemonSet" and why != ASKED else STILL_WHY
        parts.append(STILL_TOLERATES + ", ".join(map(str, still)) + why_still)

    bound = as_str(pod.spec.get("nodeName"))
    if mode in ("prefer", "require") and bound:
        # Placed already: the kubelet refuses a bound pod whose node fails its required affinity, and nothing is
        # left to prefer. Where its node is known and not spot capacity, require is told it is not met.
        parts.append(f"bound to node {bound[:80]}: no affinity")
        if _forget_places(pod, ctx, mode, []):  # what an earlier pass added before the pod was bound goes
            out.mutated("spot-affinity")
        node = next((g for g in ctx.cluster.groups if bound in g.nodes), None)
        if mode == "require" and node is not None and not node.spot:
            said = f"spot require: the pod is bound to node {bound}, which is not spot capacity"
            out.warn(clipped(said, WARNING_LIMIT))
    elif mode in ("prefer", "require"):
        terms, shown, on_cluster = _spot_places(ctx)
        changed = _forget_places(pod, ctx, mode, terms)
        if mode == "prefer" and terms:
            # Where no node carries them now (a spot pool at zero), the labels of the providers whose spot nodes
            # may come, as require's: with no preference, the scheduler had no reason to favour the spot nodes once
            # they came, nor Karpenter (which tries a pod's preferences first) to launch spot ones (found by a
            # review of the spot policy). None where the cluster shows no provider (k3s: ``_find_spot_places``).
            for term in terms:
                changed = prefer(pod, term, PREFERRED_WEIGHT) or changed
            parts.append(PREFERS + shown + ("" if on_cluster else NOT_ON_CLUSTER) + WEIGHT_TEXT)
        elif mode == "prefer":
            parts.append("no spot capacity label on the cluster to prefer")
        elif not terms:
            _deny_unplaceable(pod, ctx, out, why)
            return
        else:
            changed = narrow(pod, terms) or changed
            parts.append(REQUIRES + shown + ("" if on_cluster else NOT_ON_CLUSTER))
        if known:
            # Judged on the final pod: the mig policy's profile and pin and the cuda policy's steering, after this
            # policy, can leave it no spot pool.
            out.finish.append(lambda: _warn_unplaceable(pod, ctx, out, mode, spot_now))
        if changed:
            out.mutated("spot-affinity")
    out.reasons.append("Spot" + mode.capitalize())
    # the user's text escaped (spec.nodeName, the resources it asks), as the cuda annotation's: the webhook sees a pod
    # before its validation, and a newline in it started a line of its own in kubectl describe (found by a review)
    out.annotate(APPLIED, escaped("; ".join(parts)))


def _wanted(ctx: Context, mode: str, gpu_pod: bool, spot_now: bool) -> tuple[list[Wanted], bool, str]:
    """The tolerations a pod of ``mode`` (a spot mode) wants, whether they were narrowed to the cluster's taints,
    and where they come from, in words."""
    presets = _spot_presets(ctx)
    wanted, on_cluster = _narrowed(presets, ctx)
    source = "taints on the cluster" if on_cluster else "provider presets"
    if ctx.cluster.groups and on_cluster and not spot_now:
        # The spot nodes the pod may run on are yet to come (an autoscaler adds them): they will carry the presets'
        # taints (AKS and OKE taint every spot node), not the taints of the nodes there now; and an autoscaler
        # scales a spot pool up from zero only for a pod that tolerates its template node's taints. For tolerate and
        # prefer too: narrowed to the taints there now, they got none, and an AKS spot pool at zero was never
        # scaled up for them (found by a review of the spot policy). Not every cloud's where the cluster shows
        # none (k3s): they would be tolerations for clouds it is not on, where require's pod can run nowhere else.
        seen = _providers_seen(presets, ctx, every=mode == "require")
        coming = _narrowed(seen, ctx, cluster=False)[0]
        wanted += [w for w in coming if w not in wanted]
        source = "provider presets: no spot node on the cluster now"
    gpu_presets = _gpu_presets(ctx)
    if gpu_presets and gpu_pod:
        gpu_wanted, _ = _narrowed(gpu_presets, ctx)
        wanted += [w for w in gpu_wanted if w not in wanted]
    return _distinct(wanted), on_cluster, source


def _forget_places(pod: PodView, ctx: Context, mode: str, terms: Sequence[Sequence[Expression]]) -> bool:
    """Take out the spot places an earlier pass of the same mode named and the cluster no longer has (a spot pool
    retired, another declared): a template applied again, or the pods made from it, kept requiring the old place,
    ANDed with the new one, and matched no node while the annotation named only the new (found by a review of
    day-2 journeys). On a template, every place it named: they are written again in order, after the cuda
    policy's ``forget`` took out its steering, which may have written the same pool selector (found by a review
    of this session's commits). Whether the pod changed."""
    earlier = ctx.prior.get(APPLIED, "")
    if mode_of(earlier) != mode:
        return False
    if mode == "require":
        said = _said_places(earlier, REQUIRES, NOT_ON_CLUSTER) or []
        stale = [t for t in said if pod.is_template or t not in terms]
        return unnarrow(pod, stale, keep=manifest_expressions(pod), narrowed=True)
    said = _said_places(earlier, PREFERS, WEIGHT_TEXT, NOT_ON_CLUSTER) or []
    stale = [t for t in said if pod.is_template or t not in terms]
    return unprefer(pod, _not_preferred_by_manifest(pod, stale), PREFERRED_WEIGHT)


def _not_preferred_by_manifest(pod: PodView, places: Sequence[Sequence[Expression]]) -> list[Sequence[Expression]]:
    """``places`` but those the manifest kubectl applied prefers itself, with the webhook's weight: as the required
    places taken out leave the manifest's own expressions (``manifest_expressions``: a Deployment whose own term
    was a spot place, karpenter.sh/capacity-type In (spot), lost it to a reinvocation and then required every
    provider's spot place, and lost it for good when moved off require: a generative review)."""
    node_affinity = as_dict(as_dict(manifest_template_spec(pod).get("affinity")).get("nodeAffinity"))
    theirs = {json_key(p) for p in as_list(node_affinity.get("preferredDuringSchedulingIgnoredDuringExecution"))}
    return [
        p
        for p in places
        if json_key({"weight": PREFERRED_WEIGHT, "preference": {"matchExpressions": list(p)}}) not in theirs
    ]


def _spot_reachable(pod: PodView, ctx: Context, gpus: Mapping[str, Decimal] | tuple[()], gpu_pod: bool) -> bool:
    return any(c.group.spot for c in ctx.cluster.eligible(pod.spec, gpus, gpu_only=gpu_pod))


def _undo_earlier(pod: PodView, ctx: Context, mode: str, wanted: Sequence[Wanted] = ()) -> tuple[str, bool]:
    """A workload's template whose spot mode changed: take out what the webhook added for the earlier mode, which
    its spot-applied annotation names (the tolerations, and the places of the affinity terms; the cluster's spot
    places when the words cannot be read), so that a Deployment moved from require to never does not keep
    requiring spot. What is left of the user's own terms stays; a toleration of the user's equal to one the webhook
    named goes too, unless the manifest kubectl applied writes it (``manifest_template_spec``). Returns what was
    taken out, in words, and whether the template changed; a second pass of the same request finds the words in
    the annotation it wrote and says them again, and a later UPDATE, whose stored object already says them, drops
    them. Pods are left alone: their spot mode cannot change, but for a DaemonSet's, made from a template that an
    earlier release steered under a default that now leaves DaemonSets alone (the template is not reviewed again
    until it changes): the affinity that mode added goes, with words that say so (found by a review of the spot
    policy: only the words went, and its required spot places stayed ANDed with the matchFields that binds it to
    its node). Its tolerations stay: the DaemonSet controller chose its node by the template's. So do a DaemonSet
    template's, where the mode is off because a default leaves it alone (``_leaves_alone``): a tolerate default's
    toleration went at the template's next change, and its next rollout left out its pods on tainted spot nodes
    (the GPU plugin's, DCGM's; found by a review of the spot policy); the affinity goes. Those kept are said so
    (``KEPT``). The tolerations the new mode ``wanted`` are not said to be taken out: they are added again (found
    by a review of the spot policy: require moved to prefer said its toleration was removed, and the pod kept it)."""
    earlier_text = ctx.prior.get(APPLIED, "")
    earlier = mode_of(earlier_text)
    daemon = not pod.is_template and pod.owner_kind == "DaemonSet"
    if not pod.is_template and not daemon:
        return "", False
    if earlier == mode:
        stored = _stored_applied(pod, ctx).split("; ")
        words = [p for p in earlier_text.split("; ") if p.startswith((UNDONE, KEPT)) and p not in stored]
        return "; ".join(words), False
    # kept where a default put them, not where the DaemonSet's own annotation asked and now asks nothing: its owner
    # took the request back (found by a review of this session's commits)
    by_default = not earlier_text.startswith(f"{earlier} ({ASKED})")
    keep = daemon or (mode == "off" and by_default and _leaves_alone(pod, _default(pod, ctx)[0]))
    if earlier == "never":
        off = _said_off_spot(earlier_text)
        narrowings = off if off is not None else _off_spot(ctx)[0]
        off_places = [alt for alternatives in narrowings for alt in alternatives]
        if unnarrow(pod, off_places, keep=manifest_expressions(pod)):
            return f"{UNDONE}never had added: its required affinity off spot capacity", True
        return "", False
    if earlier not in SPOT_MODES:
        return "", False
    removed: list[str] = []
    held: list[Wanted] = []
    changed = False
    named = named_tolerations(earlier_text) or []
    tolerations = pod.spec.get("tolerations")
    if isinstance(tolerations, list) and named:
        manifest = as_list(manifest_template_spec(pod).get("tolerations"))  # the user's own, kubectl says
        own = _said_own(earlier_text)  # the user's own, the words say
        added = [w.toleration() for w in named if w not in own and w.toleration() not in manifest]
        kept = [t for t in tolerations if t not in added]
        if keep:
            held = [w for w in named if w.toleration() in added and w.toleration() in tolerations and w not in wanted]
        elif len(kept) != len(tolerations):
            changed = True
            if gone := [w for w in named if w.toleration() in added and w not in wanted]:
                removed.append("tolerations " + ", ".join(map(str, gone)))
            if kept:
                pod.spec["tolerations"] = kept
            else:
                del pod.spec["tolerations"]
    if earlier == "require":
        said = _said_places(earlier_text, REQUIRES, NOT_ON_CLUSTER)
        if unnarrow(pod, _spot_places(ctx)[0] if said is None else said, keep=manifest_expressions(pod), narrowed=True):
            removed.append("its required spot affinity")
    if earlier == "prefer":
        said = _said_places(earlier_text, PREFERS, WEIGHT_TEXT, NOT_ON_CLUSTER)
        places = _not_preferred_by_manifest(pod, said if said is not None else _spot_places(ctx)[0])
        if unprefer(pod, places, PREFERRED_WEIGHT):
            removed.append("its preferred spot affinity")
    words = [f"{UNDONE}{earlier} had added: {', '.join(removed)}"] if removed else []
    if held:  # the DaemonSet controller places its pods by them
        shown = ", ".join(map(str, held))
        words.append(
            f"{KEPT}{earlier} had added: tolerations {shown} (a DaemonSet's pods run on the nodes they tolerate)"
        )
    return "; ".join(words), changed or bool(removed)


def _stored_applied(pod: PodView, ctx: Context) -> str:
    """The spot-applied annotation of the template as the object was stored before this UPDATE; '' on a CREATE."""
    node: Any = ctx.old_object
    for key in TEMPLATE_PATHS.get(pod.kind, ()):
        node = node.get(key) if isinstance(node, dict) else None
    metadata = node.get("metadata") if isinstance(node, dict) else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return as_str(annotations.get(PREFIX + APPLIED)) if isinstance(annotations, dict) else ""


def _deny_unplaceable(pod: PodView, ctx: Context, out: Outcome, why: str) -> None:
    """``require`` where nothing tells spot capacity apart: no preset of the providers the cluster shows labels its
    spot nodes, no ``extra_labels``, no pool declared ``spot: true``. No affinity could keep the pod to spot nodes,
    and admitting it would run it on the on-demand capacity it refused."""
    seen = sorted(_providers_shown(ctx, labelled=True))
    keys = [k for name in seen for k in ctx.cluster.presets.node_label_keys.get(name, ())]
    pool_key = keys[0] if keys else "<a label of the pool's nodes>"
    if seen:
        providers = f"the {', '.join(seen)} preset{'s label' if len(seen) > 1 else ' labels'} no spot node"
    elif "all" in ctx.settings.cluster.providers:
        providers = "no node or pool shows a cloud provider's labels (k3s or self-managed nodes, whose spot nodes no"
        providers += " cloud's label tells apart; cluster.providers names the cloud where its autoscaler adds them)"
    else:
        providers = "no provider preset in force labels spot nodes"
    out.deny(
        "spot",
        "SpotRequireUnplaceable",
        f"{pod.kind.lower()} requires spot capacity ({why}), but nothing tells this cluster's spot nodes apart: "
        f"{providers}, spot.extraLabels is empty and no pool in cluster.pools is declared "
        f"spot: true. Declare the spot pools in the webhook's settings (cluster.pools[] with name, nodeSelector "
        f"{{{pool_key}: <pool>}} and spot: true), or ask for {PREFIX}spot: tolerate to run on any capacity.",
        "spot require: no spot label or spot pool is known",
    )


def _spot_pools(ctx: Context) -> tuple[tuple[str, ...], bool]:
    """The spot pools' names, sorted, and whether every spot group has GPUs: kept per snapshot (a pod kept off spot
    under prefer, every CPU pod where spot.default is prefer, sorted every spot pool's name at each request: work
    growing with the cluster, found by a review)."""

    def make() -> tuple[tuple[str, ...], bool]:
        spot = [g for g in ctx.cluster.groups if g.spot]
        return tuple(sorted({g.pool for g in spot})), all(g.has_gpu for g in spot)

    return ctx.cluster.policy_memo.per_settings(("spot", "pools"), ctx.settings, make, lambda v: len(v[0]) + 1)


def _warn_unplaceable(pod: PodView, ctx: Context, out: Outcome, mode: str, spot_now: bool) -> None:
    """Warn when a pod that requires or prefers spot capacity can land on none of it in the known cluster, and say
    what keeps it off: the GPU resource it asks for (a MIG profile no spot pool offers, or more GPUs than a spot
    node has), or its node rules as the webhook leaves them (its own, and the later policies' steering to a driver
    or GPU model: on a second pass those are the pod's own, so the words cannot tell them apart and stay the same)."""
    if not spot_now and mode == "require":
        gpu = "GPU " if _is_gpu_pod(pod) else ""
        joins = f"a {gpu}spot node joins"
        if makers := _only_makers_unseen(ctx):
            joins = f"{makers} (if installed) adds a {gpu}spot node"
        text = f"spot require: no {gpu}node or pool is spot capacity now; Pending until {joins}"
        out.warn(clipped(text, WARNING_LIMIT))
    if not spot_now or pod.defers_gpu:  # its pods learn their MIG resource, and so their place, when created
        return
    requested = requested_resources(pod.spec)
    gpus = {k: v for k, v in requested.items() if k.startswith(NVIDIA_RESOURCES)}
    gpu_pod = bool(gpus) or _is_gpu_pod(pod, requested)
    if _spot_reachable(pod, ctx, gpus, gpu_pod):
        return
    spot_pools, gpus_alone = _spot_pools(ctx)
    advice, per_node = "", ""
    listed: Sequence[str] = ()  # the pools' names, sorted: those of ``spot`` where no branch gives its own
    bigger: Sequence[str] = ()
    amounts = _amounts(pod, ctx, gpus, gpu_pod)
    if amounts.launched:
        return
    gpu_capacity_only = not gpu_pod and gpus_alone and _kept_off_by_gpu_taints(pod, ctx)
    if gpu_capacity_only:
        why = detail = "every spot pool is a GPU pool and it asks no GPU"
        advice = "; add a CPU spot pool or use spot: prefer" if mode == "require" else ""
    elif name := amounts.short:
        listed, have, bigger = amounts.listed, amounts.have, amounts.bigger
        why = detail = f"no spot node {'it can use ' if bigger else ''}has {format_quantity(gpus[name])} {name}"
        advice = f"; ask at most {format_quantity(have[-1])}{asking_most(pod.spec, name, have[-1])} "
        if bigger:
            advice += "or use "
        elif amounts.pinned:
            advice += "or choose a bigger instance type"
        else:
            advice += "for spot" if mode == "prefer" else "or add bigger spot nodes"
        per_node = f": {format_quantity(have[0])} per node" if len(have) == 1 else ""  # else "at most" says it
    elif amounts.reached:
        why = f"no spot pool offers its {', '.join(sorted(gpus))}"  # e.g. the MIG profile it was given
        detail = why
    elif taint := _untolerated_gpu_taint(pod, ctx, gpus, gpu_pod):
        why, detail = taint
    elif state := _spot_leaving(pod, ctx, gpus, gpu_pod):
        why = detail = f"the spot nodes it can use are all {state} now"
    else:
        why = "its nodeSelector, affinity or tolerations exclude every spot pool"
        detail = f"{why}, as the webhook leaves them (its steering: {PREFIX}cuda, {PREFIX}mig)"
    listed = listed or spot_pools
    ran = ": it runs on demand" if mode == "prefer" and _on_demand_takes(pod, ctx, gpus, gpu_pod) else ""
    if bigger and len(f"spot {mode}: {why}{ran}{advice}{names_listed(bigger, limit=1)}") > WARNING_LIMIT:
        ran = ""  # the pool to use named whole before these words: "no spot node it can use" says them (a review)
    head = f"spot {mode}: {why}{ran}"
    if mode == "prefer":
        # six pools named, the rest counted: every one was (15 kB of 2,250 bigger pools; a review)
        pools = f"{_names(listed)}{per_node}"
        if bigger:  # the pools it can use first: after the bigger ones they read as theirs
            out.annotations[APPLIED] += escaped(f"; {detail} ({pools}){advice}{_names(bigger)}")
        else:
            out.annotations[APPLIED] += escaped(f"; {detail}{advice} ({pools})")
        if gpu_capacity_only:
            # Not warned: the only spot capacity is GPUs it does not ask for (kept off by their taint, as a rule).
            # Under a spot.default of prefer every CPU pod and workload was warned that its own rules kept it off
            # spot and it ran on demand (found by a review of user journeys); the annotation says why, for describe.
            return
    if bigger:
        out.warn(
            clipped(
                f"{head}{advice}{names_listed(bigger, room=WARNING_LIMIT - len(head) - len(advice))}", WARNING_LIMIT
            )
        )
        return
    # the pools whole or cut with a '…' (a name cut at 119 characters read as another pool's: a review), their GPUs
    # a node left out first ("ask at most" says them; a name cut to keep them read as another pool's: a review)
    names = names_listed(listed)
    if len(head) + len(advice) + len(names) + len(per_node) + 3 > WARNING_LIMIT:
        per_node, names = "", names_listed(listed, room=WARNING_LIMIT - len(head) - len(advice) - 3)
    tail = f" ({names}{per_node})"
    if len(head) + len(advice) + len(tail) > WARNING_LIMIT:  # not even their count: the words say what to change
        tail = ""
    out.warn(clipped(f"{head}{advice}{tail}", WARNING_LIMIT))


def _on_demand_takes(pod: PodView, ctx: Context, gpus: Mapping[str, Decimal], gpu_pod: bool) -> bool:
    """Whether an on-demand pool its rules reach takes what the pod asks: a node of it has the amount, or it launches
    the instance type a pod needs (``_launched_to_fit``) and its rules pin none; a cordoned pool counts (it takes pods
    again). "It runs on demand" was said of a pod of 4 GPUs beside spot and on-demand pools of 1 a node, which stays
    Pending (found by a review). One ``eligible`` call, memoized per snapshot, on the warning's path alone."""
    reach = {**pod.spec, "tolerations": [*as_list(pod.spec.get("tolerations")), *LEAVING_TOLERATIONS]}
    some = {name: Decimal(0) for name in gpus}  # offered at all: a pool that launches to fit has none big enough now
    on_demand = [c.group for c in ctx.cluster.eligible(reach, some, gpu_only=gpu_pod) if not c.group.spot]
    return any(offers(g, gpus) for g in on_demand) or (
        _launched_to_fit(gpus, on_demand, ctx) and not _pins_instance(pod, gpus, on_demand)
    )


@dataclass(frozen=True)
class _Amounts:
    """What the spot pools a pod's rules reach say of the NVIDIA resources it asks (``_amounts``)."""

    reached: bool = False
    """Its rules (without the amounts) reach a spot pool."""
    launched: bool = False
    """One of them launches what the pod needs (``_launched_to_fit``)."""
    short: str = ""
    """The resource it asks more of than a node of them has (``_too_few``), else ''."""
    listed: tuple[str, ...] = ()
    """The reached spot pools that offer ``short``, their names sorted (kept: a request sorts none)."""
    have: tuple[Decimal, ...] = ()
    """What their nodes have of it, sorted."""
    bigger: tuple[str, ...] = ()
    """Spot pools that have the amount, kept off by its own rules or steering, their names sorted: "add bigger spot
    nodes" was said beside them (found by a review)."""
    pinned: bool = False
    """A reached pool launches the instance type a pod needs, but its rules pin the type (``_pins_instance``)."""


def _amounts(pod: PodView, ctx: Context, gpus: Mapping[str, Decimal], gpu_pod: bool) -> _Amounts:
    """``_Amounts`` of a pod that reaches no spot pool, kept per snapshot (``ClusterView.policy_memo``) by what it
    depends on (``eligibility_key``: the spec's node rules and the amounts): it read every reached spot group on
    every request (4.1 ms a pod at 3,000 spot groups against 1.4 before; found by a review)."""
    if not gpus:
        return _Amounts()
    key = eligibility_key(pod.spec, gpus, gpu_pod)
    memo_key = None if key is None else (REQUEST, "amounts", key)
    if memo_key is not None and isinstance(kept := ctx.cluster.policy_memo.get(memo_key), _Amounts):
        return kept
    reached = [c.group for c in ctx.cluster.eligible(pod.spec, (), gpu_only=gpu_pod) if c.group.spot]
    found = _Amounts(reached=bool(reached))
    launched = _launched_to_fit(gpus, reached, ctx)
    pinned = launched and _pins_instance(pod, gpus, reached)
    if launched and not pinned:
        found = replace(found, launched=True)
    elif short := _too_few(gpus, reached):
        name, listed = short
        bigger = {g.pool for g in ctx.cluster.groups if g.spot and not leaving(g) and offers(g, {name: gpus[name]})}
        have = tuple(sorted({g.allocatable[name] for g in listed}))
        pools = tuple(sorted({g.pool for g in listed}))
        found = replace(found, short=name, listed=pools, have=have, bigger=tuple(sorted(bigger)), pinned=pinned)
    if memo_key is not None:
        ctx.cluster.policy_memo.put(memo_key, found, len(key or b""))
    return found


def _names(pools: Sequence[str]) -> str:
    """The pools named ``pools`` (sorted) as the annotation says them: six named, the rest counted ('a, b, c, d, e,
    f and 2994 more'; ``names_listed`` without its word 'pools')."""
    return names_listed(pools).partition(" ")[2]


def _kept_off_by_gpu_taints(pod: PodView, ctx: Context) -> bool:
    """Whether tolerating the GPU taints (nvidia.com/gpu, and the documented ones ExtendedResourceToleration does
    not cover: AKS's sku=gpu) would let a pod that asks no GPU onto a spot pool: only then is it the GPU pools'
    taint that keeps it off. "Every spot pool is a GPU pool and it asks no GPU; add a CPU spot pool" was said of a
    pod its own nodeSelector kept off an untainted EKS GPU node group, and of one whose only spot node was cordoned
    (found by a review). A cordon's or a node not ready's taint passes in both trials (``LEAVING_TOLERATIONS``): a
    plain pod whose only spot pool, a GPU pool, was cordoned was told its own rules kept it off, and one that tolerates
    the GPU taint is kept off by the drain alone (found by a review). Two ``eligible`` calls, memoized per snapshot."""
    gpu_taints = [Wanted(p.key, p.value, p.effect).toleration() for p in ctx.cluster.presets.gpu_taints.values()]
    passing = [*as_list(pod.spec.get("tolerations")), *LEAVING_TOLERATIONS]

    def reaches_spot(tolerations: list[object]) -> bool:
        return any(c.group.spot for c in ctx.cluster.eligible({**pod.spec, "tolerations": tolerations}, gpu_only=False))

    return reaches_spot([*passing, GPU_TAINT_TOLERATION, *gpu_taints]) and not reaches_spot(passing)


def _launched_to_fit(gpus: Mapping[str, Decimal], reached: Sequence[NodeGroup], ctx: Context) -> bool:
    """Whether each NVIDIA resource the pod asks is offered by a spot pool it reaches that launches the instance
    type a pod needs (a Karpenter NodePool: ``Presets.mixed_pool_labels``): its nodes now say nothing of the next
    one's GPUs. "No spot node has 4 nvidia.com/gpu; ask at most 1" was said of a NodePool whose spot nodes had 1,
    and that would launch one of 4 (found by a review)."""
    mixed = ctx.cluster.presets.mixed_pool_labels
    return bool(gpus) and all(
        any(g.allocatable.get(name, Decimal(0)) > 0 and not mixed.isdisjoint(g.labels) for g in reached)
        for name in gpus
    )


INSTANCE_PINS = frozenset(
    {
        INSTANCE_TYPE_LABEL,
        "beta.kubernetes.io/instance-type",
        "karpenter.k8s.aws/instance-gpu-count",
        "eks.amazonaws.com/instance-gpu-count",
        "karpenter.azure.com/sku-name",
        "karpenter.azure.com/sku-gpu-count",
    }
)
"""Node labels whose value fixes a node's GPUs: the instance type (or VM size) and its GPU count, as Karpenter on AWS,
EKS Auto Mode and Karpenter on Azure label them (``CAPACITY_BLIND_PREFIXES``)."""


GPU_COUNT_PINS = frozenset(k for k in INSTANCE_PINS if k.endswith("-gpu-count"))
"""The ``INSTANCE_PINS`` labels whose value is the node's GPU count (the others name its instance type)."""


def _pins_instance(pod: PodView, gpus: Mapping[str, Decimal], groups: Sequence[NodeGroup]) -> bool:
    """Whether the pod's nodeSelector, or each of its required node affinity terms, keeps it on instances smaller than
    its ask: a pool that launches the instance type a pod needs (``_launched_to_fit``) launches none of more GPUs for
    it. A GPU count pins where every count it allows is below the ask (``In`` values, ``Lt``), an instance type where
    every type it allows is one ``groups``' nodes have (what they have is too little). A pod pinned to g5.xlarge (1
    GPU) that asked 4 was said nothing, Pending for good; one that allowed g5.12xlarge (4 GPUs), or counts below 9,
    was told to choose a bigger instance type (found by reviews). A loop over its rules and the groups."""
    amount = max(gpus.values(), default=Decimal(0))
    seen = {g.labels.get(k) for g in groups for k in INSTANCE_PINS - GPU_COUNT_PINS} - {None}

    def small(e: object) -> bool:
        e = as_dict(e)
        key, op, values = e.get("key"), e.get("operator"), [as_str(v) for v in as_list(e.get("values"))]
        if key in GPU_COUNT_PINS and values and all(v.isdigit() for v in values):
            counts = [Decimal(v) for v in values]
            return (op == "In" and max(counts) < amount) or (op == "Lt" and counts[0] <= amount)
        return key in INSTANCE_PINS - GPU_COUNT_PINS and op == "In" and bool(values) and set(values) <= seen

    selector = [{"key": k, "operator": "In", "values": [v]} for k, v in as_dict(pod.spec.get("nodeSelector")).items()]
    terms = required_terms(pod)
    return any(small(e) for e in selector) or (
        bool(terms) and all(any(small(e) for e in as_list(t.get("matchExpressions"))) for t in terms)
    )


def _too_few(gpus: Mapping[str, Decimal], reached: Sequence[NodeGroup]) -> tuple[str, list[NodeGroup]] | None:
    """The NVIDIA resource the pod asks more of than a node of any spot pool it reaches (``reached``) has (2 GPUs, 1
    a node), with the pools that offer it; None where one of its resources no such pool offers at all (the MIG
    profile it was given: its words say that), or each is offered in full by one of them. "No spot pool offers its
    nvidia.com/gpu" was said of a pool of 1 GPU a node (found by a review of user journeys). Per pool, from its
    allocatable per node: no node is looked at."""
    offering = {name: [g for g in reached if g.allocatable.get(name, Decimal(0)) > 0] for name in sorted(gpus)}
    if not offering or not all(offering.values()):
        return None
    for name, groups in offering.items():
        if not any(offers(g, {name: gpus[name]}) for g in groups):
            return name, groups
    return None


def _only_makers_unseen(ctx: Context) -> str:
    """The providers that make nodes from zero, shown by no node and named by no setting (``_makers_from_zero``:
    Karpenter on a self-managed EKS cluster), where the places ``require`` names are all their labels, in words;
    '' elsewhere. Nothing shows that such a provider is installed: the pod runs only if it is (found by a review of
    the spot policy)."""
    unseen = _makers_from_zero(ctx) - _providers_shown(ctx) - _providers_named(ctx)
    owners = {k: p for k, _, p in ctx.cluster.presets.spot_labels if p in unseen}
    terms = _spot_places(ctx)[0]
    if not terms or not all(len(t) == 1 and as_str(t[0].get("key")) in owners for t in terms):
        return ""
    return ", ".join(sorted({owners[as_str(t[0].get("key"))] for t in terms}))


def _spot_leaving(pod: PodView, ctx: Context, gpus: Mapping[str, Decimal], gpu_pod: bool) -> str:
    """Where only taints that say their nodes take no pod now (``LEAVING_TAINTS``: cordoned, not ready) keep the
    pod off every spot pool, what they say, in words; '' otherwise. Its tolerations were blamed, and no pod should
    tolerate a drain or a broken node: it waits for them (found by a review of the cluster model)."""
    trial = {**pod.spec, "tolerations": [*as_list(pod.spec.get("tolerations")), *LEAVING_TOLERATIONS]}
    groups = [c.group for c in ctx.cluster.eligible(trial, gpus, gpu_only=gpu_pod) if c.group.spot]
    return split_leaving(t for g in groups for t in g.taints)[1]


def _untolerated_gpu_taint(
    pod: PodView, ctx: Context, gpus: Mapping[str, Decimal], gpu_pod: bool
) -> tuple[str, str] | None:
    """Where a documented GPU taint that ExtendedResourceToleration does not cover, and no setting tolerates, keeps
    the pod off every spot pool (AKS's sku=gpu:NoSchedule), the words that name it and the setting that tolerates
    it: "its nodeSelector, affinity or tolerations" was said instead (found by a review of the spot policy). Short
    words for the warning, and those of the annotation: prefer's warning, cut at 119 characters, lost the pools and
    that the pod runs on demand (found by a review)."""
    off = {n: p for n, p in ctx.cluster.presets.gpu_taints.items() if n not in ctx.settings.spot.gpu_taint_presets}
    if not gpu_pod or not off:
        return None
    spec = {**pod.spec, "tolerations": as_list(pod.spec.get("tolerations"))}
    for name, p in sorted(off.items()):
        trial = {**spec, "tolerations": [*spec["tolerations"], Wanted(p.key, p.value, p.effect).toleration()]}
        if any(c.group.spot for c in ctx.cluster.eligible(trial, gpus, gpu_only=gpu_pod)):
            taint = Wanted(p.key, p.value, p.effect)
            return (
                f"untolerated {taint} (set spot.gpuTaintPresets: [{name}])",
                f"untolerated taint {taint} (spot.gpuTaintPresets: [{name}] tolerates it)",
            )
    return None


def _distinct(wanted: Sequence[Wanted]) -> list[Wanted]:
    """``wanted`` without those another one covers (``key:NoSchedule`` covers ``key=true:NoSchedule``: a setting
    that names a preset's key with a value of its own), in their order. Compared as tolerations, the cluster's
    values aside (``Wanted.on_cluster``): the broader one stays."""
    kept: list[Wanted] = []
    for w in wanted:
        if not any(covered([k.toleration()], replace(w, on_cluster=frozenset())) for k in kept):
            kept = [k for k in kept if not covered([w.toleration()], replace(k, on_cluster=frozenset()))] + [w]
    return kept


def _own_tolerations(pod: PodView, ctx: Context, mode: str, wanted: Sequence[Wanted]) -> list[Wanted]:
    """The wanted tolerations the pod has of its own: covered before this policy adds any, and none that an
    earlier pass in this mode added (its words name those). Moved off the mode, they stay (found by a generative
    review of updates without kubectl's manifest: a Helm chart's own toleration of GKE's spot taint, written as
    the webhook writes it, went with require)."""
    added = _added_earlier(ctx, mode)
    tolerations = as_list(pod.spec.get("tolerations"))
    return [w for w in wanted if w not in added and covered(tolerations, w)]


def _added_earlier(ctx: Context, mode: str) -> list[Wanted]:
    """The tolerations an earlier pass in ``mode`` says it added (named, and not the pod's own)."""
    earlier = ctx.prior.get(APPLIED, "")
    if mode_of(earlier) != mode:
        return []
    before = _said_own(earlier)
    return [w for w in named_tolerations(earlier) or () if w not in before]


def _still_carried(pod: PodView, ctx: Context, mode: str, wanted: Sequence[Wanted]) -> list[Wanted]:
    """The tolerations an earlier pass in this mode added that the pod still carries and the mode no longer wants:
    named on, so that a later change of mode takes them out (``_undo_earlier`` reads the names). A GKE spot pool at
    zero gave a tolerate Deployment its provider's spot tolerations; edited once an untainted spot node was there,
    its words named none, and moved to never or off, it kept them for good (found by a review of the spot policy).
    Left on the pod, as a change of mode does not take them out before it comes."""
    tolerations = as_list(pod.spec.get("tolerations"))
    return [w for w in _added_earlier(ctx, mode) if w not in wanted and w.toleration() in tolerations]


def _said_own(text: str) -> list[Wanted]:
    """The tolerations a ``spot-applied`` text says the pod had itself (``OWN_TOLERATIONS``)."""
    part = next((p for p in text.split("; ") if p.startswith(OWN_TOLERATIONS)), "")
    return [w for w in map(parse_wanted, part[len(OWN_TOLERATIONS) :].split(", ")) if w is not None]


def _tolerate(pod: PodView, wanted: Sequence[Wanted]) -> bool:
    """Append the wanted tolerations that nothing on the pod covers yet; whether any was added."""
    existing = pod.spec.get("tolerations")
    missing = [w for w in wanted if not covered(as_list(existing), w)]
    if not missing:
        return False
    if not isinstance(existing, list):
        existing = pod.spec["tolerations"] = []
    existing.extend(w.toleration() for w in missing)
    return True


def named_tolerations(text: str) -> list[Wanted] | None:
    """The tolerations a ``spot-applied`` text names (``TOLERATES``, ``STILL_TOLERATES``); None when a part of it
    cannot be read back."""
    named: list[Wanted] = []
    for part in text.split("; "):
        head = next((h for h in (TOLERATES, STILL_TOLERATES) if part.startswith(h)), "")
        if head:
            parsed = [parse_wanted(i) for i in part[len(head) :].split(" (", 1)[0].split(", ")]
            if not all(parsed):
                return None
            named += [w for w in parsed if w is not None]
    return named


def validate(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Refuse a ``never`` pod's ungating onto spot capacity (``_ungated_onto_spot``); record a SpotTolerated event
    when the final pod carries the tolerations its spot-applied annotation names (and it names some)."""
    _ungated_onto_spot(pod, ctx, out)
    text = as_str(pod.annotations.get(PREFIX + APPLIED))
    if not text:
        return
    named = named_tolerations(text)
    tolerations = pod.spec.get("tolerations", [])
    if not named or not isinstance(tolerations, list):
        return  # unreadable, or no toleration to speak of (EKS and Karpenter spot nodes carry no taint)
    named = [replace(w, on_cluster=_cluster_values(w.key, w.effect, ctx)) if w.value is None else w for w in named]
    if all(covered(tolerations, w) for w in named):
        out.event("SpotTolerated", f"spot {text}")


def _ungated_onto_spot(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Deny the update that takes a ``never`` pod's last scheduling gate away (the only pod update reviewed:
    ``pipeline.ungated``) where what ungates it (Kueue, with its ResourceFlavor's node labels and tolerations) sends
    it onto spot capacity. Its create left it without the ``NotIn`` off spot capacity (the mode was another then: a
    default changed since, or its annotation was edited while it was gated), and the update let it onto spot nodes
    unsaid (found by a review of the spot policy): a known spot pool, or a spot place no node carries now (a GKE
    spot pool or Karpenter's spot capacity at zero, which its autoscaler adds for the pod, as ``never`` keeps a pod
    off at its create: found by a review). A cordoned spot node counts: it takes pods again. Or it carries the
    ``NotIn``, and its nodeSelector now chooses spot capacity alone: it lands nowhere, Pending for good, where it
    would run on spot without the ``NotIn`` (found by a review). That last whatever its mode now: the ``NotIn``
    written at its create stays (an affinity cannot change), and a pod annotated ``spot: tolerate`` while gated was
    let through onto spot capacity it never reaches (found by a review)."""
    if pod.kind != "Pod" or ctx.operation != "UPDATE":
        return
    mode, why, _ = _asked(pod, ctx, Outcome())  # its warnings were given at the create
    if mode == "never" and (spot := _spot_reached(pod.spec, pod, ctx)):
        advice = _advice(pod, ctx, pending=False)
        out.deny(
            "spot",
            "SpotNeverUngated",
            f"pod {pod.namespace}/{pod.name} is under spot never ({why}), yet its nodeSelector, affinity and "
            f"tolerations now let it run on {spot}: what the webhook wrote at its create does not keep it off them "
            f"(its spot mode was another then, or they were not known as spot). {advice}",
            f"spot never: ungated onto {spot}",
            fix=advice,
        )
        return
    said = _said_off_spot(as_str(pod.annotations.get(PREFIX + APPLIED))) or []
    if not said or not all(holds(pod, alternatives) for alternatives in said) or _lands(pod.spec, pod, ctx):
        return
    if not _chooses_spot(pod.spec, ctx):
        return
    # judged without the NotIn and the cuda policy's steering planned around it (steered to the pools left once spot
    # capacity was kept off), as ``kept_off_by_never`` judges them: where its own terms keep it off the spot capacity
    # too, never is not what leaves it Pending (the whole required affinity was dropped, and a pod whose own In kept
    # it off the spot pool was told to recreate itself under tolerate: found by a review). Its own terms come before
    # the NotIn (``_before``): an In of its own on a pool label reads as the steering's
    notins = [alt for alternatives in said for alt in alternatives]
    freed = PodView("Pod", {}, copy_json(pod.spec), "")  # unnarrow edits the terms in place
    unnarrow(freed, [*notins, *([e] for e in steered(pod.spec, ctx))], keep=_before(pod, notins))
    if not (spot := _spot_reached(freed.spec, pod, ctx)):
        return
    under = f"is under spot never ({why})"
    if mode != "never":
        under = f"was created under spot never, and the spot {mode} it is under now ({why}) does not undo that"
    advice = _advice(pod, ctx, pending=True)
    out.deny(
        "spot",
        "SpotNeverUngatedPending",
        f"pod {pod.namespace}/{pod.name} {under}: the required node affinity the webhook wrote at its create keeps it "
        f"off spot capacity, yet its nodeSelector now sends it to {spot} alone: it would stay Pending for good. "
        f"{advice}",
        f"spot never: ungated onto {spot}, which its affinity keeps it off",
        fix=advice,
    )


KUEUE = "kueue.x-k8s.io/"
"""What Kueue's names on a pod begin with: its scheduling gate (``kueue.x-k8s.io/admission``), the queue-name label,
its annotations."""
PLACEMENT = ("nodeSelector", "affinity", "tolerations")
"""The fields of a gated pod's spec that what takes its gate away may change, and so where it lands."""


def _placed_by_ungating(pod: PodView, ctx: Context, *fields: str) -> bool:
    """Whether the update that takes the pod's gate away changes its ``fields`` (``PLACEMENT`` where none is named)."""
    old = as_dict(as_dict(ctx.old_object).get("spec"))
    return any(old.get(f) != pod.spec.get(f) for f in fields or PLACEMENT)


def _kueue(pod: PodView, ctx: Context) -> bool:
    """Whether Kueue queues the pod: a gate, label or annotation of Kueue's on it (its gate in the old object's, where
    this update takes it away), whichever update took its last gate away (Kueue's may go before another's, and its
    flavor's nodeSelector with it: found by a review)."""
    return _kueue_gate_gone(ctx) or any(k.startswith(KUEUE) for k in [*pod.labels, *pod.annotations])


def _kueue_gate_gone(ctx: Context) -> bool:
    """Whether the update that takes the pod's last gate away takes Kueue's (its admission of the pod)."""
    old = as_dict(as_dict(ctx.old_object).get("spec"))
    return any(as_str(as_dict(g).get("name")).startswith(KUEUE) for g in as_list(old.get("schedulingGates")))


def placed_by_kueue(pod: PodView, ctx: Context, fields: Sequence[str] = ("nodeSelector",)) -> bool:
    """Whether Kueue chose where the ungated pod lands: it queues the pod (``_kueue``), and the update that takes its
    last gate away takes Kueue's too or leaves its nodeSelector (``fields`` where named) as it was: the entries
    Kueue's own update wrote, before another gate went, choose the place, a toleration of the last update's own
    beside them or not (with one, Kueue's advice was lost: found by a review). Not where a user or controller changed
    the placement in an update that took no gate of Kueue's, Kueue having admitted the pod before (it was blamed for
    that placement: found by a review)."""
    return _kueue(pod, ctx) and (_kueue_gate_gone(ctx) or not _placed_by_ungating(pod, ctx, *fields))


FLAVOR = (
    "have Kueue admit it to a ResourceFlavor of on-demand nodes only, in a ClusterQueue whose flavors are not spot, "
    "then delete it and recreate it for Kueue to admit it again"
)


def _advice(pod: PodView, ctx: Context, pending: bool) -> str:
    """What to change, for a never pod its ungating sends onto spot capacity (``pending``: SpotNeverUngatedPending,
    whose affinity off spot capacity keeps it Pending there), after what chose the place. Where the nodeSelector
    entries that choose spot capacity (``_spot_choosing``) were there before this update, they are the pod's as
    created or were written while it was gated (by Kueue, or what took an earlier gate away), which the update does
    not tell: both are said, and to recreate it without those entries (recreated as it was, it was refused again; an
    entry of its own was missed where Kueue's flavor added another: found by reviews). Else what took its gate away
    placed it: Kueue (``placed_by_kueue``) with its ResourceFlavor, or whatever did (a user, another controller), with
    no word of Kueue (a pod whose own gate a user took away was told of Kueue's flavors: a review). Where Kueue queues
    the pod, recreating it goes with an on-demand flavor: recreated alone, Kueue admits it to the same spot flavor
    and it is refused again (found by a review)."""
    tolerate = f"{PREFIX}{REQUEST}: tolerate to let it run on spot"
    if pending:
        tolerate = f"delete it and recreate it annotated {tolerate} (a pod's affinity cannot change once created)."
    else:
        tolerate = f"annotate the pod {tolerate}."
    before = _spot_choosing(as_dict(as_dict(ctx.old_object).get("spec")), ctx)
    selector = as_dict(pod.spec.get("nodeSelector"))
    if before and all(as_str(selector.get(k)) == v for k, v in before.items()):
        entries = _entries(before)
        added = {k: v for k, v in _spot_choosing(pod.spec, ctx).items() if k not in before}
        without = f"without {entries} in its nodeSelector"
        if _kueue(pod, ctx):
            fix = f"{FLAVOR}, {without} where it was created with that"
        else:  # an entry set while it was gated stays (a gated pod's nodeSelector may only be added to)
            keeps = "" if pending else " (the webhook keeps it off spot)"
            fix = f"delete it and recreate it {without} where it was created with that, else with what set that "
            fix += f"while it was gated choosing on-demand nodes{keeps}"
        if added and not _kueue_gate_gone(ctx):
            fix = f"have what takes its gate away choose on-demand nodes, and {fix}"
        added_by = f", and the update that takes it away adds {_entries(added)}" if added else ""
        return (
            f"Its nodeSelector had {entries} (spot capacity) before its last gate was taken away, as created or as "
            f"set while it was gated{added_by}: {fix}; or {tolerate}"
        )
    # no spot entry before: a toleration the update adds may be what lets it onto spot, as much as a nodeSelector
    if placed_by_kueue(pod, ctx, PLACEMENT):
        return f"{FLAVOR[0].upper()}{FLAVOR[1:]}. Or {tolerate}"
    # else what took its gate away placed it, or what it had at its create or was given while it was gated lets it
    # there (the NotIn keeps it off)
    by = "Have what takes its gate away choose on-demand nodes. " if _placed_by_ungating(pod, ctx) else ""
    if pending:
        return f"{by}Or {tolerate}"
    return f"{by}Delete and recreate it (the webhook keeps it off spot), or {tolerate}"


def _entries(selector: Mapping[str, str]) -> str:
    """Entries of a nodeSelector, in words."""
    return ", ".join(f"{k}: {v}" for k, v in sorted(selector.items()))


def _before(pod: PodView, alternatives: Sequence[Sequence[Expression]]) -> frozenset[object]:
    """The ``json_key``s of the expressions that come before the first of ``alternatives``' in a required term of
    the pod: its own, which ``narrow`` keeps first (an ``In`` on a pool label of the user's, which reads as the CUDA
    steering's, written after the spot policy's ``NotIn``)."""
    narrowed = {json_key(e) for alt in alternatives for e in alt}
    own: set[object] = set()
    for term in required_terms(pod):
        for e in as_list(term.get("matchExpressions")):
            if (key := json_key(e)) in narrowed:
                break
            own.add(key)
    return frozenset(own)


def _lands(spec: JSON, pod: PodView, ctx: Context) -> bool:
    """Whether a pod of ``spec`` lands anywhere: a node or pool of the known cluster (a cordoned one counts), or a
    spot place no node carries now (``_spot_reached``)."""
    return bool(_reached(spec, pod, ctx)) or bool(_spot_reached(spec, pod, ctx))


def _reached(spec: JSON, pod: PodView, ctx: Context) -> list[NodeGroup]:
    """The node groups of the known cluster a pod of ``spec`` lands on, a cordoned one too (``LEAVING_TOLERATIONS``):
    it takes pods again."""
    requested = requested_resources(spec)
    gpus = {k: v for k, v in requested.items() if k.startswith(NVIDIA_RESOURCES)}
    reach = {**spec, "tolerations": [*as_list(spec.get("tolerations")), *LEAVING_TOLERATIONS]}
    return [c.group for c in ctx.cluster.eligible(reach, gpus, gpu_only=_is_gpu_pod(pod, requested))]


def _spot_reached(spec: JSON, pod: PodView, ctx: Context) -> str:
    """The spot capacity a pod of ``spec`` may run on, in words ('' for none): the known spot pools it reaches (a
    cordoned one counts: it takes pods again), and the spot places no node carries now (``_spot_places``: a GKE
    spot pool or Karpenter's spot capacity at zero) that its nodeSelector chooses, its required affinity allows
    and no spot taint of their provider keeps it off (``_tainted_off``), as ``never`` judges them at a create."""
    pools = [g for g in _reached(spec, pod, ctx) if g.spot]
    said = [pool_names(pools, what="spot pool")] if pools else []
    terms, shown, _ = _spot_places(ctx)
    texts = shown.split(" or ") if terms else []  # one per place: no pool name or label holds " or "
    selector = as_dict(spec.get("nodeSelector"))
    required = required_terms(PodView("Pod", {}, spec, ""))
    tolerations = as_list(spec.get("tolerations"))
    for term, text in zip(terms, texts, strict=True):
        labels = {e["key"]: as_str(selector.get(e["key"])) for e in term}
        if not all(labels[e["key"]] in e["values"] for e in term) or _carried(term, ctx):
            continue
        if required and not any(_allows(t, labels) for t in required):
            continue
        if not _tainted_off(labels, tolerations, ctx):
            said.append(f"spot capacity {text} (no node carries it now: its autoscaler adds nodes for the pod)")
    return ", ".join(said)


def _carried(term: Sequence[Expression], ctx: Context) -> bool:
    """Whether a node or pool of the known cluster carries the labels of the place ``term`` names (each of its
    values known by key: a pool declared spot is a group of the cluster, nodes or none)."""
    return all(ctx.cluster.label_values(as_str(e["key"])) & set(as_list(e["values"])) for e in term)


def _allows(term: JSON, labels: Mapping[str, str]) -> bool:
    """Whether no expression of a required ``term`` on the keys of ``labels`` refuses them (the term's other keys
    say nothing of a node no one has seen)."""
    for e in as_list(term.get("matchExpressions")):
        if not isinstance(e, dict) or e.get("key") not in labels:
            continue
        value, values, operator = labels[as_str(e["key"])], as_list(e.get("values")), e.get("operator")
        if (operator == "In" and value not in values) or (operator == "NotIn" and value in values):
            return False
        if operator == "DoesNotExist":
            return False
    return True


def _chooses_spot(spec: JSON, ctx: Context) -> bool:
    """Whether the pod's nodeSelector reaches nothing but spot capacity by what the webhook knows
    (``_spot_choosing``)."""
    return bool(_spot_choosing(spec, ctx))


def _spot_choosing(spec: JSON, ctx: Context) -> dict[str, str]:
    """The entries of the pod's nodeSelector that reach nothing but spot capacity by what the webhook knows: a spot
    label (``cloud.google.com/gke-spot=true``, ``karpenter.sh/capacity-type=spot``, one of ``spot.extraLabels``),
    every label of a pool declared spot, or the labels of a pool of a provider that gives each pool one capacity type
    (a GKE node pool, an EKS managed node group, an AKS node pool: ``Presets.pool_steered`` without the mixed pools,
    ``Presets.mixed_pool_labels``) whose nodes are all spot. Never a Karpenter NodePool, which launches on-demand
    capacity too where only spot nodes are up now, nor a label of the user's own, which may also be on an on-demand
    pool at zero (both were refused: found by a review)."""
    selector = {k: as_str(v) for k, v in as_dict(spec.get("nodeSelector")).items()}
    spot_labels = {(k, v) for k, v, _ in ctx.cluster.presets.spot_labels} | set(ctx.settings.spot.extra_labels.items())
    chosen = {k: v for k, v in selector.items() if (k, v) in spot_labels}
    for pool in ctx.settings.cluster.pools:
        if pool.spot and pool.node_selector and all(selector.get(k) == v for k, v in pool.node_selector.items()):
            chosen.update(pool.node_selector)
    fixed = ctx.cluster.presets.pool_steered - ctx.cluster.presets.mixed_pool_labels
    by_pool = {k: v for k, v in selector.items() if k in fixed}
    if by_pool:
        trial = {"nodeSelector": by_pool, "tolerations": [{"operator": "Exists"}]}
        groups = [c.group for c in ctx.cluster.eligible(trial, (), gpu_only=False)]
        if groups and all(g.spot for g in groups):
            chosen.update(by_pool)
    return chosen

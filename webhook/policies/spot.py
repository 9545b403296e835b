"""The spot policy: tolerations for spot / preemptible capacity, and node affinity to it, for pods that ask.

Asking. The pod (or pod template) annotation ``gpu-admission.io/spot`` says what the pod wants:

    tolerate | true   may run on spot capacity: the spot taints are tolerated
    prefer            tolerated, and a preferred node affinity (weight 100) on spot capacity labels
    require           tolerated, and a required node affinity on spot capacity labels, ANDed into every existing
                      term; with several label keys (clouds) the requirement is an OR of one alternative per key
    never | false     nothing, whatever the defaults say

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
broader default off.

Which taints. The spot taints of the provider presets in force (``ctx.cluster.presets``) plus ``extra_taints``.
When the cluster is known (it has groups: nodes or declared pools) and ``only_cluster_taints`` is on, only the taints
the cluster actually carries are tolerated, exactly as they stand there (a preset with an undocumented value matches
any value; the cluster's effect is used), so a pod does not collect tolerations for clouds it is not on. With no
knowledge of the cluster the presets' own tolerations are added. ``gpu_taint_presets`` (off by default) adds documented
GPU taints that ExtendedResourceToleration does not cover (AKS ``sku=gpu:NoSchedule``), to GPU pods that get spot
tolerations, narrowed the same way.

Which labels (prefer / require). The spot capacity labels of the presets plus ``extra_labels``, narrowed to the keys
that the cluster's nodes or pools carry when the cluster is known (by key, not value: a Karpenter cluster whose nodes
are all on-demand still has ``karpenter.sh/capacity-type``, and Karpenter can launch spot nodes for the pod).
``require`` on a known cluster with no spot capacity label at all is still applied, over every preset label, with a
warning: ``require`` is a hard constraint the user chose (typically to never pay for on-demand GPUs), a Pending pod is
visible and easy to fix, while silently dropping the requirement would run it on capacity it refused; and the view
may lag an autoscaler that is about to add spot nodes. ``prefer`` in that case adds no affinity (it could not help).

Manners. A user's toleration is never removed or changed; a wanted toleration that an existing one already covers
(an Exists on the same key, an empty-key Exists, an empty effect, an equal value) is not added. Affinity is edited
through ``webhook.affinity``, which is idempotent. The annotation ``gpu-admission.io/spot-applied`` describes the
resulting state and the decision, never the delta, so a second pass writes the same text and an empty patch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from webhook import PREFIX
from webhook.affinity import Expression, expression, narrow, prefer
from webhook.cluster import Taint, requested_resources, toleration_tolerates
from webhook.model import GPU_MEMORY_RESOURCE, JSON, Context, Outcome, PodView, as_list, as_str
from webhook.presets import TaintPreset

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
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
PREFERRED_WEIGHT = 100
NVIDIA_RESOURCES = "nvidia.com/"


@dataclass(frozen=True)
class Wanted:
    """A toleration the policy wants the pod to carry."""

    key: str
    value: str | None
    """None: operator Exists (any value)."""
    effect: str

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
    """Whether an existing toleration already tolerates everything ``wanted`` would."""
    for tol in tolerations:
        if not isinstance(tol, dict):
            continue
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
    """The owner kinds a default may name: the direct controller, and Deployment for the pods of its ReplicaSets
    (they carry the ``pod-template-hash`` label; a Deployment's own template counts too)."""
    owner = pod.owner_kind
    if not owner:
        return ()
    from_deployment = pod.kind == "Deployment" or (owner == "ReplicaSet" and "pod-template-hash" in pod.labels)
    return (owner, "Deployment") if from_deployment else (owner,)


def _asked(pod: PodView, ctx: Context, out: Outcome) -> tuple[str, str]:
    """(mode, where it came from); mode is tolerate, prefer, require, never or off."""
    raw = pod.annotations.get(PREFIX + REQUEST)
    if isinstance(raw, bool):  # an unquoted YAML boolean in an offline manifest
        raw = "true" if raw else "false"
    if isinstance(raw, str):
        mode = MODES.get(raw.strip().lower())
        if mode:
            return mode, "asked by annotation"
        shown = raw if len(raw) <= 24 else raw[:23] + "…"
        out.warn(f"{PREFIX}{REQUEST}: {shown!r} is not {ACCEPTED}; ignored")
    elif raw is not None:
        out.warn(f"{PREFIX}{REQUEST}: not a string; ignored (use {ACCEPTED})")
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


def _gpu_presets(ctx: Context) -> list[TaintPreset]:
    known = ctx.cluster.presets.gpu_taints
    return [known[name] for name in dict.fromkeys(ctx.settings.spot.gpu_taint_presets) if name in known]


def _narrowed(presets: Sequence[TaintPreset], ctx: Context) -> tuple[list[Wanted], bool]:
    """The tolerations for ``presets``, and whether they were narrowed to the cluster's taints."""
    if ctx.cluster.groups and ctx.settings.spot.only_cluster_taints:
        have = sorted(ctx.cluster.taints(), key=lambda t: (t.key, t.value, t.effect))
        wanted: list[Wanted] = []
        for p in presets:
            for t in have:
                if t.key != p.key or t.effect not in EFFECTS:
                    continue
                if p.value is None:
                    wanted.append(Wanted(t.key, None, t.effect))
                elif t.value == p.value:
                    wanted.append(Wanted(t.key, t.value, t.effect))
        return list(dict.fromkeys(wanted)), True
    return list(dict.fromkeys(Wanted(p.key, p.value, p.effect) for p in presets)), False


def _is_gpu_pod(pod: PodView) -> bool:
    if pod.annotation("gpu-fraction") is not None:
        return True
    return any(
        name == GPU_MEMORY_RESOURCE or name.startswith(NVIDIA_RESOURCES)  # gpu, gpu.shared, mig-<profile>
        for name in requested_resources(pod.spec)
    )


def _spot_labels(ctx: Context) -> tuple[list[tuple[str, list[str]]], bool]:
    """Spot capacity labels as (key, values) in preset order, and whether the cluster has any of them.

    Narrowed to the keys the cluster carries when it is known; all of them when it is not or has none.
    """
    pairs = [(k, v) for k, v, _ in ctx.cluster.presets.spot_labels]
    pairs += list(ctx.settings.spot.extra_labels.items())
    by_key: dict[str, list[str]] = {}
    for key, value in pairs:
        values = by_key.setdefault(key, [])
        if value not in values:
            values.append(value)
    every = list(by_key.items())
    if not ctx.cluster.groups:
        return every, True
    present = [(k, vs) for k, vs in every if ctx.cluster.label_values(k)]
    return (present, True) if present else (every, False)


def _label_text(key: str, values: Sequence[str]) -> str:
    return f"{key}={values[0]}" if len(values) == 1 else f"{key} in ({', '.join(values)})"


# ---------------------------------------------------------------------------------------------------------------
# The policy


def mutate(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Add the spot tolerations (and affinity) the pod asks for, or its defaults give; nothing for other pods."""
    mode, why = _asked(pod, ctx, out)
    if mode not in SPOT_MODES:
        return
    if pod.annotations.get(SAFE_TO_EVICT) == "false":
        out.warn(f'spot {mode}, yet {SAFE_TO_EVICT}="false": spot nodes are reclaimed; use spot: never')
    parts = [f"{mode} ({why})"]

    wanted, on_cluster = _narrowed(_spot_presets(ctx), ctx)
    gpu_presets = _gpu_presets(ctx)
    if gpu_presets and _is_gpu_pod(pod):
        gpu_wanted, _ = _narrowed(gpu_presets, ctx)
        wanted += [w for w in gpu_wanted if w not in wanted]
    current = pod.spec.get("tolerations")
    if current is not None and not isinstance(current, list):
        # the apiserver rejects such a pod anyway; rewriting the field would change the user's data
        parts.append("spec.tolerations is not a list: left as it is")
    elif wanted:
        source = "taints on the cluster" if on_cluster else "provider presets"
        parts.append(f"tolerates {', '.join(str(w) for w in wanted)} ({source})")
        if _tolerate(pod, wanted):
            out.mutated("spot-toleration")
    elif on_cluster:
        parts.append("no spot taint on the cluster's nodes or pools to tolerate")
    else:
        parts.append("no spot taint in the provider presets to tolerate")

    if mode in ("prefer", "require"):
        labels, on_cluster = _spot_labels(ctx)
        shown = " or ".join(_label_text(k, vs) for k, vs in labels)
        changed = False
        if mode == "prefer" and on_cluster:
            for key, values in labels:
                changed = prefer(pod, [expression(key, "In", values)], PREFERRED_WEIGHT) or changed
            parts.append(f"prefers {shown} (weight {PREFERRED_WEIGHT})")
        elif mode == "prefer":
            parts.append("no spot capacity label on the cluster to prefer")
        else:
            alternatives: list[list[Expression]] = [[expression(k, "In", vs)] for k, vs in labels]
            changed = narrow(pod, alternatives)
            if on_cluster:
                parts.append(f"requires {shown}")
            else:
                parts.append(f"requires {shown} (none of these labels is on the cluster's nodes or pools)")
                out.warn(
                    "spot require: no node or pool has a spot capacity label; the pod stays Pending until one does"
                )
        if changed:
            out.mutated("spot-affinity")
    out.reasons.append("Spot" + mode.capitalize())
    out.annotate(APPLIED, "; ".join(parts))


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
    """The tolerations a ``spot-applied`` text names; None when a part of it cannot be read back."""
    for part in text.split("; "):
        if part.startswith("tolerates "):
            items = part[len("tolerates ") :].split(" (", 1)[0].split(", ")
            parsed = [parse_wanted(i) for i in items]
            return [w for w in parsed if w is not None] if all(parsed) else None
    return []


def validate(pod: PodView, ctx: Context, out: Outcome) -> None:
    """Record a SpotTolerated event when the final pod carries the tolerations its spot-applied annotation names."""
    text = as_str(pod.annotations.get(PREFIX + APPLIED))
    if not text:
        return
    named = named_tolerations(text)
    tolerations = pod.spec.get("tolerations", [])
    if named is None or not isinstance(tolerations, list):
        return
    if all(covered(tolerations, w) for w in named):
        out.event("SpotTolerated", f"spot {text}")

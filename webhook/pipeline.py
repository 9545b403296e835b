"""One path for every object: guards, the policies over one working copy, one diff, the enforcement modes.

The same functions serve ``/mutate``, ``/validate`` and ``gpu-admission review``:

    mutate:   guards -> strip forged output annotations -> what an earlier review of a workload wrote taken out
              (mig_update.forget, cuda.forget) -> spot -> mig -> cuda.steer -> annotations -> one diff
    validate: guards -> spot.validate, mig.validate, cuda.validate over the final object -> allowed or denied

Spot runs first because the tolerations it adds change where the pod may land; MIG before CUDA because the MIG
resource it picks narrows the nodes that CUDA then checks.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from webhook import PREFIX, budget
from webhook.cluster import GPU_RESOURCE, is_gpu_device
from webhook.events import MESSAGE_BYTES, line_bytes
from webhook.events import MESSAGE_LIMIT as EVENT_LIMIT
from webhook.model import (
    BUILTIN_GROUPS,
    GPU_MEMORY_RESOURCE,
    IGNORE_LABEL,
    INPUT_ANNOTATIONS,
    JSON,
    LAST_APPLIED,
    POD_OWNER,
    TEMPLATE_PATHS,
    WARNING_LIMIT,
    Context,
    Denial,
    Event,
    Outcome,
    PodView,
    as_dict,
    as_list,
    as_str,
    clipped,
    copy_json,
    escaped,
    fit_warning,
    is_input_annotation,
    is_output_annotation,
    json_bytes,
    middle_clipped,
)
from webhook.policies import cuda, mig, mig_update, spot
from webhook.quantity import parse_quantity

Step = Callable[[PodView, Context, Outcome], None]

MUTATORS: tuple[tuple[str, Step], ...] = (
    ("mig", mig_update.forget),
    ("cuda", cuda.forget),
    ("spot", spot.mutate),
    ("mig", mig.mutate),
    ("cuda", cuda.steer),
)
VALIDATORS: tuple[tuple[str, Step], ...] = (("spot", spot.validate), ("mig", mig.validate), ("cuda", cuda.validate))

WARNINGS_TOTAL = 1800
"""The characters of warnings one answer sends. The apiserver keeps 4096 of them for the whole API request, its
mutating and validating webhooks' and PodSecurity's together; past it, it cuts each to 256 and then drops the rest
unsaid (k8s.io/apiserver endpoints/filters/warning.go). Each of the webhook's two answers takes under half, and the
rest is left to the others (at 4000 each, a /validate after a full /mutate lost all but its first warning)."""
NOT_SHOWN = (
    f"more warnings not shown (an answer keeps to {WARNINGS_TOTAL} characters; gpu-admission review shows them all)"
)
"""How the line ends that counts the warnings past ``WARNINGS_TOTAL`` (it had named the apiserver's 4096, which the
user then looked for in vain; found by a read of the whole change)."""
AUDIT_VALUE_LIMIT = 2000
MESSAGE_LIMIT = 8000
"""A denial's message (``status.message``: kubectl prints it whole after 'denied the request:'), all of its
policies' denials together; each lists at most a few pools, so only a pod of many containers comes near it."""


@dataclass
class Result:
    """What the pipeline decided for one object."""

    allowed: bool = True
    message: str = ""
    code: int = 200
    reason: str = ""
    warnings: list[str] = field(default_factory=list)
    audit: dict[str, str] = field(default_factory=dict)
    patch: list[JSON] = field(default_factory=list)
    object: Any = None
    """The object after mutation (the input itself on validate)."""
    outcome: Outcome = field(default_factory=Outcome)
    skipped: str = ""
    """Why the object was passed untouched (exempt, not handled, ...); empty when the policies ran."""
    reused: bool = False
    """The answer given earlier to an object of the same shape (``webhook.decisions``), shared between requests:
    read it, never change it. ``object`` is then None."""
    patch_json: bytes = b""
    """``patch`` as JSON (UTF-8), once written (``webhook.decisions`` writes it for every answer it stores); empty
    otherwise. Once it is written, ``patch`` is read only: the text would no longer say it. A stored answer keeps
    only the text (``patch`` empty, its length in ``patch_ops``): its objects took seven times the text's bytes."""
    patch_ops: int = 0
    """How many operations ``patch_json`` holds, where ``patch`` was dropped; 0 otherwise (see ``ops``)."""
    replayed: bool = False
    """A reused answer given to a body matched by its bytes, unparsed (``webhook.replay``)."""
    pods_refused: list[str] = field(default_factory=list)
    """A workload's ``Outcome.pods_refused``: why each of its pods would be refused though it is admitted."""

    def patch_bytes(self) -> bytes:
        """The patch as compact JSON, in UTF-8."""
        return self.patch_json or json_bytes(self.patch)

    @property
    def ops(self) -> int:
        """How many operations the patch has (0: no change), whether its objects are kept or only its text."""
        return len(self.patch) or self.patch_ops

    @property
    def decision(self) -> str:
        if self.skipped:
            return "skipped"
        if not self.allowed:
            return "denied"
        return "patched" if self.ops else "allowed"


def _pod_node(obj: JSON) -> JSON | None:
    """The pod, or the pod template of a workload, inside ``obj``: the mapping that holds its metadata and spec."""
    path = TEMPLATE_PATHS.get(as_str(obj.get("kind")))
    node: Any = obj if path is not None else None
    for key in path or ():
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else None


def pod_view(obj: JSON, namespace: str, writable: bool = True) -> PodView | None:
    """The pod, or the pod template of a workload, inside ``obj`` (live references); None for other objects.

    A template without metadata gets an empty one attached (so annotations can be written) unless not ``writable``.
    """
    kind = as_str(obj.get("kind"))
    node = _pod_node(obj)
    if node is None:
        return None
    if kind == "Pod" and not isinstance(obj.get("spec"), dict):
        return None
    if not isinstance(node.get("metadata"), dict):
        if kind == "Pod" or "metadata" in node:
            return None
        if writable:
            node["metadata"] = {}
    spec = node.get("spec")
    if not isinstance(spec, dict):
        return None
    metadata = node["metadata"] if isinstance(node.get("metadata"), dict) else {}
    if kind == "Pod":
        owners = [o for o in as_list(metadata.get("ownerReferences")) if isinstance(o, dict)]
        controller = next((o for o in owners if o.get("controller") is True), owners[0] if owners else {})
        owner = as_str(controller.get("kind"))
        version = controller.get("apiVersion")
        group = version.rpartition("/")[0] if isinstance(version, str) and version else None
    else:
        owner = POD_OWNER.get(kind, kind)
        group = BUILTIN_GROUPS.get(owner, ("",))[0]  # the template's future owner, of today's group
    ns = namespace or as_str(as_dict(obj.get("metadata")).get("namespace"))
    return PodView(kind=kind, metadata=metadata, spec=spec, namespace=ns, owner_kind=owner, owner_group=group, root=obj)


def _exempt(ctx: Context) -> str:
    """Why the request is exempt by settings (namespace, user, group), or ''."""
    ex = ctx.settings.exemptions
    if ctx.namespace and ctx.namespace in ex.namespaces:
        return f"namespace {ctx.namespace} is exempt"
    if ctx.username and ctx.username in ex.users:
        return f"user {ctx.username} is exempt"
    exempt_groups = set(ctx.groups) & set(ex.groups)
    if exempt_groups:
        return f"group {sorted(exempt_groups)[0]} is exempt"
    return ""


def _guard(obj: Any, ctx: Context) -> str:
    """Why this request is not reviewed, or '' to review it (gatekeeper's order: exemptions, kind, operation)."""
    if not isinstance(obj, dict):
        return "no object"
    exempt = _exempt(ctx)
    if exempt:
        return exempt
    kind = as_str(obj.get("kind"))
    if kind not in TEMPLATE_PATHS:
        return f"kind {kind or '(none)'} is not handled"
    if ctx.operation not in ("CREATE", "UPDATE"):
        return f"operation {ctx.operation} is not reviewed"
    if kind == "Pod" and ctx.operation == "UPDATE" and not ungated(obj, ctx):
        return POD_UPDATE
    if kind == "ReplicaSet" and _controlled_by(obj, "Deployment"):
        return DEPLOYMENTS_REPLICASET
    if _opts_out(as_dict(obj.get("metadata")), ctx):
        return f"label {IGNORE_LABEL}=true (opt-out allowed by settings)"
    return ""


def _opts_out(metadata: JSON, ctx: Context) -> bool:
    """Whether an object of this metadata opts out of the webhook: its label, where the settings honour it."""
    return ctx.settings.exemptions.allow_opt_out_label and as_dict(metadata.get("labels")).get(IGNORE_LABEL) == "true"


POD_CREATORS = {
    "ReplicaSet": "replicaset-controller",
    "ReplicationController": "replication-controller",
    "StatefulSet": "statefulset-controller",
    "DaemonSet": "daemon-set-controller",
    "Job": "job-controller",
}
"""The service account of kube-system that creates the pods of each built-in owner kind: kube-controller-manager
runs each controller as its own (``--use-service-account-credentials``, as kubeadm, GKE, EKS and AKS run it)."""
SERVICE_ACCOUNT_GROUPS = ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated")


def pod_creator(owner_kind: str, owner_group: str | None) -> str | None:
    """The user that the pods of a built-in controller of ``owner_kind`` (of API group ``owner_group``) are created
    by, its service account of kube-system (``POD_CREATORS``); None for another owner."""
    controller = POD_CREATORS.get(owner_kind)
    if controller is None or owner_group not in BUILTIN_GROUPS.get(owner_kind, ()):
        return None
    return f"system:serviceaccount:kube-system:{controller}"


def pods_pass(view: PodView, ctx: Context) -> str:
    """Why the pods its controller makes from a workload's template are each passed untouched as they are created
    ('' where they are reviewed): they are made in its namespace, with its template's labels, by the controller, so
    neither its creator's exemption nor its own labels are theirs; the controller's own user and groups are (found by
    a review: pods that an exempt replicaset-controller creates were said to be reviewed, and refused)."""
    namespace = view.namespace or ctx.namespace
    made = Context(settings=ctx.settings, cluster=ctx.cluster, namespace=namespace)
    if exempt := _exempt(made):
        return exempt
    exemptions = ctx.settings.exemptions
    if creator := pod_creator(view.owner_kind, view.owner_group) if view.is_template else None:
        # the setting to change first: a server warning is cut to a line (found by a review)
        if creator in exemptions.users:
            return f"exemptions.users has {creator}, their creator"
        if groups := sorted(set(SERVICE_ACCOUNT_GROUPS) & set(exemptions.groups)):
            return f"exemptions.groups has {groups[0]}, a group of their creator {creator}"
    if _opts_out(view.metadata, ctx):
        return f"label {IGNORE_LABEL}=true on its pod template"
    return ""


def _pods_passed(view: PodView, ctx: Context, outcome: Outcome) -> None:
    """Where a workload's pods each pass untouched, none is refused, nor given a MIG profile: what the policies said
    would refuse them is said as that, and what they would get is not said (found by reviews: a template labelled to
    opt out got 'its pods are refused', and review PODS DENIED; pods Pending for good were told the usable memory
    of 'its pods' nvidia.com/mig-1g.10gb')."""
    if not view.is_template or not (outcome.pods_refused or outcome.pods_get) or not (why := pods_pass(view, ctx)):
        return
    unsaid = {*outcome.pods_refused, *outcome.pods_get}
    outcome.warnings[:] = [w for w in outcome.warnings if w not in unsaid]
    outcome.pods_get.clear()
    if outcome.pods_refused:
        outcome.pods_refused.clear()
        outcome.warn(f"its pods pass untouched, none refused ({why})")


class Untouched(NamedTuple):
    """What becomes of a pod, or of a workload's pods, whose GPU ask is left unconverted (``left_unconverted``), each
    line whole."""

    pending: list[str]
    """A container's gpu-memory size: never converted, and no node offers the resource, so the pods stay Pending."""
    no_gpu: list[str]
    """The gpu-fraction annotation's container: never converted, so the pods run with no GPU at all."""


MIG_OFF = "MIG conversion is off here (mig.enabled: false)"


def left_unconverted(view: PodView, why: str, ctx: Context, reviewed: bool) -> Untouched:
    """Where a pod, or a workload's pods, pass untouched (``why``), or MIG conversion is off (``why`` ''), what the
    webhook converts on each pod as it is created (a gpu-memory size, the gpu-fraction annotation) is never
    converted (found by reviews: such a template was admitted without a word, its pods Pending for good, or running
    with no GPU; with MIG off, review said ADMITTED). ``reviewed``: the workload itself is, and a nvidia.com/gpu
    fraction is converted on its template (with ``mig.enabled``); else, as a fraction left in it is refused by the
    API server, the advice is a whole GPU or a MIG device. The remedy comes before the why, within a server
    warning's line (``WARNING_LIMIT``); the audit annotation has the whole."""
    mig_on = ctx.settings.mig.enabled
    if mig_on and not why:
        return Untouched([], [])
    if view.is_template:
        pods, stay, get, them, passes = "its pods", "stay", "get", "them", "they pass"
    else:
        pods, stay, get, them, passes = "the pod", "stays", "gets", "it", "it passes"
    if not why:
        reason = MIG_OFF
    elif mig_on:  # a review converts them only where MIG conversion is on
        reason = f"or let {them} be reviewed: {passes} untouched ({why})"
    else:
        reason = f"{passes} untouched ({why})"
    ask = "a nvidia.com/gpu fraction" if reviewed and mig_on else "a whole nvidia.com/gpu"
    advice = f"ask {ask} or nvidia.com/mig-<profile>: 1; {reason}"
    pending = []
    for _, container in view.containers():
        asks = _gpu_asks(container)
        if (asked := asks.get(GPU_MEMORY_RESOURCE)) is None:
            continue
        # one that asks a GPU device too is told to drop the size, not to ask the GPU it asks (found by a review),
        # each device it asks named (found by a review: only the first was); not to let it be reviewed, as a review
        # refuses a device and a size in one container; a MIG device for both only in place of one whole GPU (not of
        # a MIG device it asks, nor of two GPUs)
        what = advice
        if devices := [(k, v) for k, v in asks.items() if k != GPU_MEMORY_RESOURCE]:
            one_gpu = len(devices) == 1 and devices[0][0] == GPU_RESOURCE and _is_1(devices[0][1])
            both = ", or ask nvidia.com/mig-<profile>: 1 for both" if one_gpu else ""
            then = f"{passes} untouched ({why})" if why else MIG_OFF
            named = " and ".join(f"{k} {v}" for k, v in devices)
            what = f"drop it, as it asks {named} too{both}; {then}"
        pending.append(
            f"{container.get('name')}: {pods} {stay} Pending, gpu-memory {asked} unconverted: {what}; no node offers"
            f" {GPU_MEMORY_RESOURCE}"
        )
    no_gpu = []
    target = view.fraction_container()
    # a target that asks a GPU of its own gets it, the annotation unconverted or not (found by a review)
    if (raw := view.annotation("gpu-fraction")) is not None and not (target is not None and _gpu_asks(target)):
        name = target.get("name") if target is not None else "(no such container)"
        no_gpu.append(f"{name}: {pods} {get} no GPU, gpu-fraction {raw} unconverted: {advice}")
    return Untouched(pending, no_gpu)


def unconverted(view: PodView, ctx: Context, skipped: str) -> Untouched:
    """``left_unconverted`` of a pod or a workload the webhook admits, ``skipped`` saying why it passes it over (''
    where it reviews it): a workload's pods pass untouched where ``pods_pass`` says so, a pod where it is passed
    over."""
    why = pods_pass(view, ctx) if view.is_template else skipped
    # a Deployment's ReplicaSet's template is the Deployment's, reviewed (a fraction converted) there: told as it is
    reviewed = view.is_template and skipped in ("", DEPLOYMENTS_REPLICASET)
    return left_unconverted(view, why, ctx, reviewed=reviewed)


def _cuda_unchecked(view: PodView, why: str) -> list[str]:
    """Where a template leaves its CUDA check to each pod (``PodView.defers_gpu``) and its pods pass untouched
    (``why``), the containers that ask a GPU of their own: their CUDA is checked nowhere (found by a review: its line
    was dropped, and nothing said so). The remedy first, within a server warning's line."""
    return [
        f"{container.get('name')}: CUDA unchecked: let its pods be reviewed, or ask no gpu-memory or gpu-fraction,"
        f" which leave the check to each pod; they pass untouched ({why})"
        for _, container in view.containers()
        if any(k != GPU_MEMORY_RESOURCE for k in _gpu_asks(container))
    ]


def _gpu_asks(container: JSON) -> dict[str, Any]:
    """A container's GPU asks (a GPU device: nvidia.com/gpu, its shared form or a MIG device, of more than 0; a
    gpu-memory size), by resource: its limit, else its request. Not any nvidia.com/ resource: `nvidia.com/gpu: 0`
    (a chart's default) or the Network Operator's `nvidia.com/hostdev` asks no GPU (found by a review: the pods of
    a gpu-fraction annotation naming such a container were said to get its GPU, and get none)."""
    resources = as_dict(container.get("resources"))
    asks = {**as_dict(resources.get("requests")), **as_dict(resources.get("limits"))}
    return {k: v for k, v in asks.items() if k == GPU_MEMORY_RESOURCE or (is_gpu_device(str(k)) and _above_0(v))}


def _is_1(value: object) -> bool:
    """A quantity of exactly 1; one that does not read is not."""
    try:
        return parse_quantity(value) == 1
    except (ValueError, ArithmeticError):
        return False


def _above_0(value: object) -> bool:
    """A quantity above 0; one that does not read counts (the API server refuses it, and says why)."""
    try:
        return parse_quantity(value) > 0
    except (ValueError, ArithmeticError):
        return True


OPT_OUT_OFF = (
    f"label {IGNORE_LABEL}=true not honoured: opt-out labels are off here (exemptions.allowOptOutLabel); reviewed"
)


def _opt_out_refused(obj: Any, view: PodView, ctx: Context) -> list[str]:
    """A pod labelled to opt out where the settings do not allow it was reviewed without a word, its owner taking
    it for exempt (found by a review). Said by the mutating answer, which every reviewed object gets; for a
    workload, whose pods carry its template's labels, when either is labelled."""
    if ctx.settings.exemptions.allow_opt_out_label:
        return []
    for metadata in (as_dict(as_dict(obj).get("metadata")), view.metadata):
        if as_dict(metadata.get("labels")).get(IGNORE_LABEL) == "true":
            return [OPT_OUT_OFF]
    return []


POD_UPDATE = "a pod update is reviewed only when it takes the pod's last scheduling gate away"

DEPLOYMENTS_REPLICASET = "a Deployment's ReplicaSet: its template is the Deployment's, reviewed there"
"""Of the ReplicaSet alone: its pods may pass untouched (their creator exempt), and review says what becomes of them
(found by a review: this said they were reviewed, and the next line that they passed untouched).

The Deployment controller finds a Deployment's ReplicaSet by comparing templates (FindNewReplicaSet,
EqualIgnoreHash): a template changed at the ReplicaSet's create (annotations written from a newer node list, or a
creator or label the Deployment was exempt by) would make it create another, changed again, without end."""


def gates(pod: Any) -> list[str]:
    """The names of a pod's scheduling gates (``spec.schedulingGates``): while it has one, it is not scheduled."""
    spec = as_dict(as_dict(pod).get("spec"))
    return [as_str(as_dict(g).get("name")) or "(unnamed)" for g in as_list(spec.get("schedulingGates"))]


def ungated(obj: Any, ctx: Context) -> list[str]:
    """The gates a pod UPDATE takes away when it takes the last one: the update that lets the pod be scheduled.

    A gated pod's placement may still change (Kubernetes 1.27 on: nodeSelector added to, required affinity narrowed,
    tolerations added), and it does when a queue admits it: Kueue takes its gate ``kueue.x-k8s.io/admission``
    away and writes its ResourceFlavor's node labels and tolerations into the pod in the same update. The pod was
    reviewed at its create against every node it could land on then; this update is reviewed (``/validate``) against
    where it may land now. Tolerations added to a pod that was never gated are not reviewed."""
    if ctx.operation != "UPDATE" or as_str(as_dict(obj).get("kind")) != "Pod" or gates(obj):
        return []
    if not _output_annotations(ctx.old_object):
        return []  # not reviewed at its create (an exempt creator, made before the webhook): not at its ungating
    return gates(ctx.old_object)


GATE_TAKEN = "taking away the pod's last scheduling gate ({gates}{by})"
UNGATED = GATE_TAKEN + (
    " lets it be scheduled where its nodeSelector, affinity and tolerations now allow, and there: {message}"
)
KUEUE_ADVICE = (
    "Kueue chose this placement from the ResourceFlavor it admitted the workload to, and a flavor's node labels are "
    "all it matches the pod's nodeSelector and affinity with: give the flavors the labels the webhook steers on "
    "(README, 'Kueue and scheduling gates'), or keep the workload's queue off these nodes."
)
"""Said after a CUDA refusal of an ungating whose placement Kueue chose (``spot.placed_by_kueue``); not after a spot
one, whose advice names an on-demand flavor."""


def _ungate_refusal(result: Result, gone: Sequence[str], pod: PodView, ctx: Context) -> None:
    """Say which update is refused and why, and tell it on the pod (an Event: the updater is a controller, which
    only logs the refusal, and the pod stays gated). Kueue's advice beside an enforced CUDA refusal where Kueue
    chose the placement
    (``spot.placed_by_kueue``: its gate may go before another's, its flavor's nodeSelector with it, and the refusal
    of the last ungating lacked the advice, also where that update added a toleration of its own: found by
    reviews)."""
    gates, by = escaped(", ".join(gone)), escaped(f", by {ctx.username}" if ctx.username else "")
    enforced = [d for d in result.outcome.denials if _mode(d.policy, ctx) == "enforce"]
    advice = KUEUE_ADVICE if spot.placed_by_kueue(pod, ctx) and any(d.policy == cuda.POLICY for d in enforced) else ""
    message = UNGATED.format(gates=gates, by=by, message=result.message)
    # the advice kept whole, the refusals cut before it: cut at its end, an answer of many refusals lost it, which
    # the Event kept (found by a review)
    result.message = (
        f"{clipped(message, MESSAGE_LIMIT - len(advice) - 1)}\n{advice}" if advice else clipped(message, MESSAGE_LIMIT)
    )
    result.audit["reason"] = result.message
    result.outcome.events = [Event("UngateRefused", ungate_event(enforced, gates, by, advice), "Warning")]


EVENT_WHAT_LEAST = 80
"""The fewest characters of a refusal that a refused ungating's Event shows of it, its start: the container, its
image (cut in its middle) and the CUDA it needs; the pod and its spot mode (120 left Kueue's advice out: a review)."""
MAKINGS = 8
"""The most times a refused ungating's Event is made (``_in_bytes``): each time within 1/16 fewer characters than its
bytes a character let fit, as its parts do not shrink alike (the emoji names of a test fit at the third making)."""
EVENT_AFTER_IMAGE = 40
"""The characters after the image that a refusal's start keeps, its image and the list of containers alike cut for
them: the CUDA it needs and where that was read (``needs CUDA 12.8 (from image tag, pytorch``)."""
EVENT_NAMES = 100
"""The characters of names (the gates; the containers of one refusal, or of those left out) an Event lists, then
how many more."""
EVENT_WHOLE = "the update's answer says"
"""Where a refused ungating's Event is cut, its last line ends with where to read the whole: ``... says more``."""


class _Refusal(NamedTuple):
    reason: str
    policy: str
    text: str
    """The refusal as the Event says it: one container's, or several containers' alike, named in its start."""
    fix: str
    containers: list[str]


def ungate_event(denials: Sequence[Denial], gates: str, by: str, advice: str) -> str:
    """A refused ungating's ``UngateRefused`` Event, within ``events.MESSAGE_LIMIT`` characters and, in the relay's pipe
    line, ``events.MESSAGE_BYTES`` bytes (``_in_bytes``): every reason, the gate taken away, a line per refusal
    (containers refused alike on one line: ``_refusals``), Kueue's ``advice``; the updater where it fits (where it, or
    some of over ``EVENT_NAMES`` characters of gates, is left out, a last line says where the whole is read: they were
    left out unsaid, found by a review). Where that is too long, it is made up part by part, each where it fits with the
    others and a short last line (how many refusals are left out, or that it is cut, and where the whole is read): the
    first refusal's advice whole (from ``Denial.fix`` on); Kueue's advice whole, where that is a CUDA refusal's (one
    long CUDA refusal lost it to its start: found by a review); the start of each reason's first refusal, the first's
    too (``_start``: what was refused); Kueue's advice, if not said yet, beside the start of another reason's CUDA
    refusal; the other refusals, at least their start; the rest of the first; the containers left out. Where even the
    advice and the last line do not fit, the advice is cut in its middle. Found by reviews: the answer cut in its middle
    lost refusals whole; the last line was dropped where the advice was cut, and Kueue's advice said with no CUDA
    refusal, or left out where a shorter last line let it fit."""
    refusals = _refusals(denials)
    if not refusals:  # refused by no policy's denial: nothing to say but where to read why
        said = f"{GATE_TAKEN.format(gates=gates, by=by)} is refused: {EVENT_WHOLE} why"
        return _in_bytes(lambda limit: middle_clipped(said, limit))
    reasons = ", ".join(dict.fromkeys(r.reason for r in refusals))  # each once, as the audit's decision

    def head(by: str) -> str:
        return f"{reasons}: {GATE_TAKEN.format(gates=middle_clipped(gates, EVENT_NAMES), by=by)} is refused:"

    whole = [r.text for r in refusals] + ([advice] if advice else [])
    for told in dict.fromkeys((by, "")):  # with the updater, then without
        cut = told != by or len(gates) > EVENT_NAMES  # the updater or some gates left out: said where to read them
        message = "\n".join([head(told), *whole, *([_left_out([], False)] if cut else [])])
        if len(message) <= EVENT_LIMIT and line_bytes(message) <= MESSAGE_BYTES:
            return message
    return _in_bytes(lambda limit: _parts(refusals, head(""), advice, limit))


def _in_bytes(make: Callable[[int], str]) -> str:
    """The message ``make`` makes within a limit of characters, ``EVENT_LIMIT``, or fewer where its characters outside
    ASCII (names, an updater; each written ``\\uXXXX`` in the relay's pipe line, 6 bytes, an emoji 12) take it past
    ``events.MESSAGE_BYTES``: made again within as many characters as its bytes a character let fit, until it fits or
    ``MAKINGS`` are made (each as cheap as the first, on a refused ungating only; what still does not fit is cut by the
    relay, ``events.SHORT_MESSAGE``). Fitted in characters alone, an Event of 1,024
    characters of emoji or of 800 CJK ones was cut to its first 200 at the relay, its advice and last line lost (found
    by a review)."""
    limit, message = EVENT_LIMIT, make(EVENT_LIMIT)
    for _ in range(MAKINGS):
        if (size := line_bytes(message)) <= MESSAGE_BYTES or limit <= 1:
            break
        limit = max(min(len(message) * MESSAGE_BYTES // size, limit - 1) * 15 // 16, 1)  # fewer each time
        message = make(limit)
    return message


def _parts(refusals: Sequence[_Refusal], head: str, advice: str, limit: int) -> str:
    """A refused ungating's Event made up part by part within ``limit`` characters (``ungate_event``)."""
    first = refusals[0]
    at = max(first.text.find(first.fix), 0)
    before, fix = first.text[:at].rstrip(), first.text[at:]
    bare = f"… {fix}"
    shown = {0: bare if before else fix}  # by line: each refusal, then Kueue's advice

    def said(shown: Mapping[int, str], named: bool = False) -> str:
        left = [r for i, r in enumerate(refusals) if i not in shown]
        return "\n".join([head, *(shown[i] for i in sorted(shown)), _left_out(left, named)])

    def start(i: int, most: int) -> None:
        """Show refusal ``i`` by its start, within ``most`` and the room left, where that is at least its start."""
        text, end = (before, f" {fix}") if i == 0 else (refusals[i].text, "")
        room = limit - len(said({**shown, i: ""})) - len(end)
        if text and len(what := _start(text, max(min(most, room), min(len(text), EVENT_WHAT_LEAST)))) <= room:
            shown[i] = what + end

    def advise() -> None:
        """Kueue's advice whole, where it fits and a CUDA refusal is said (the first's advice alone counts)."""
        cuda_said = any(r.policy == cuda.POLICY for i, r in enumerate(refusals) if i in shown)
        if advice and cuda_said and len(said({**shown, len(refusals): advice})) <= limit:
            shown[len(refusals)] = advice

    advise()  # beside the first refusal's advice, where it is a CUDA refusal's
    for i in sorted({r.reason: i for i, r in reversed(list(enumerate(refusals)))}.values()):
        start(i, EVENT_WHAT_LEAST)  # each reason's first refusal
    advise()  # beside the start of another reason's CUDA refusal
    for i in [*range(1, len(refusals)), 0]:
        start(i, limit)
    named = len(said(shown, True)) <= limit
    if (over := len(said(shown, named)) - limit) > 0:  # the first advice and the last line alone too long
        shown[0] = middle_clipped(shown[0], max(len(shown[0]) - over, 1))
    return middle_clipped(said(shown, named), limit)  # a head over the limit alone


def _refusals(denials: Sequence[Denial]) -> list[_Refusal]:
    """Each refusal once, in its order: those of several containers that read the same but for the container's name
    (the same image refused the same way) on one line, ``container a (and b, c alike) (image ...)``."""
    alike: dict[tuple[str, str], list[Denial]] = {}
    for d in denials:  # those the policy said alike are one denial already (``Outcome.deny``), others not
        alike.setdefault((d.reason, d.said), []).append(d)
    out = []
    for (reason, rest), same in alike.items():
        names = list(dict.fromkeys(name for d in same for name in d.containers))
        text = same[0].message
        if len(names) > 1:
            text = f"container {names[0]} (and {_named(names[1:], EVENT_NAMES)} alike){rest}"
        out.append(_Refusal(reason, same[0].policy, escaped(text), escaped(same[0].fix), names))
    return out


def _named(names: Sequence[str], room: int, more: int = 0) -> str:
    """``names`` within ``room`` characters (at least one), then how many more (``more`` besides)."""
    shown = 1
    while shown < len(names) and len(", ".join(names[: shown + 1])) <= room:
        shown += 1
    more += len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more else "")


def _start(line: str, room: int) -> str:
    """``line`` within ``room``: whole where it fits, else its start, what was refused, cut at its end; the list of
    containers alike and the image of the container it opens with are shortened first, as far as needed for
    ``EVENT_AFTER_IMAGE`` characters after it to stay, past ``room`` where a long name leaves too little
    (``container trainer (image us-docker.pkg.dev/acm…abab) needs CUDA 12.8``, ``container a (and 11 more alike)
    (image …) needs CUDA 12.8``: the start of a refusal of an image pinned by its digest was all image, and of
    many containers all names, found by reviews)."""
    if len(line) <= room:
        return line
    before, opens, rest = line.partition(" (image ")
    image, closes, after = rest.partition(")")
    name, ands, others = before.partition(" (and ")
    keep = room - len(name) - len(opens) - len(closes) - EVENT_AFTER_IMAGE  # for the others alike and the image
    if closes and name.startswith("container ") and len(before) - len(name) + len(image) > keep:
        if ands and (alike := re.fullmatch(r"(.*?)(?: and (\d+) more)? alike\)", others)):  # b, c and 4 more alike)
            names, more = alike[1].split(", "), int(alike[2] or 0)
            share = max(keep - len(image), keep // 2) - len(" (and  and 999 more alike)")
            others = f"{_named(names, share, more) if share >= len(names[0]) else f'{len(names) + more} more'} alike)"
        image = middle_clipped(image, max(keep - len(ands) - len(others), 1))
        line = f"{name}{ands}{others}{opens}{image}{closes}{after}"
        room = max(room, len(line) - len(after) + EVENT_AFTER_IMAGE)  # a long name: over the room, not its CUDA
    return clipped(line, room)


def _left_out(left: Sequence[_Refusal], named: bool) -> str:
    """The Event's last line where it is cut: how many refusals are left out, and (``named``) of which containers."""
    if not left:
        return f"cut to fit: {EVENT_WHOLE} more"
    names = list(dict.fromkeys(escaped(name) for r in left for name in r.containers))
    of = f" (containers {_named(names, EVENT_NAMES)})" if names and named else ""
    return f"and {len(left)} more refusal{'s' if len(left) > 1 else ''}{of}: {EVENT_WHOLE} more"


def _controlled_by(obj: JSON, kind: str) -> bool:
    owners = as_dict(obj.get("metadata")).get("ownerReferences")
    return any(
        isinstance(o, dict) and o.get("kind") == kind and o.get("controller") is True
        for o in (owners if isinstance(owners, list) else ())
    )


MAX_CONTAINERS = 250
"""More containers than any real pod has. The policies' work grows with the containers times the pools (a denial
looks for the pools each container could be sent to) or the MIG asks times the containers: 1,000 took 8 to 9 s,
the worker answering no other review meanwhile (found by a review that grew each part of a pod)."""


MAX_PLACEMENT = {
    "required node affinity terms": 512,
    "node affinity match expressions": 4096,
    "preferred node affinity terms": 256,
    "tolerations": 1024,
    "node affinity values": 16384,
}
"""Far more than any real pod writes, with room for what the policies add (the spot and CUDA steering multiply a
pod's terms by their alternatives: a pod they steered must pass again on reinvocation and at the validating
webhook, and one they would take past a cap is refused by /mutate, ``_grown_past``); each is judged against every
pool, so tens of thousands took seconds to tens of seconds, the worker answering no other review meanwhile (found
by a review that grew each part of a pod). The values bound the bytes: a term's In list of 3,000 host names (153 kB)
copied into each of the 11 terms the spot and CUDA steering made took the pod to 1.7 MB, past the 1.5 MiB etcd keeps
of one object, and the apiserver refused it in words that do not name the webhook (found by a review)."""


def _placement_counts(spec: JSON) -> dict[str, int]:
    node = as_dict(as_dict(spec.get("affinity")).get("nodeAffinity"))
    terms = as_list(as_dict(node.get("requiredDuringSchedulingIgnoredDuringExecution")).get("nodeSelectorTerms"))
    preferred = as_list(node.get("preferredDuringSchedulingIgnoredDuringExecution"))
    lists = [
        *(as_list(as_dict(t).get(part)) for t in terms for part in ("matchExpressions", "matchFields")),
        *(as_list(as_dict(as_dict(p).get("preference")).get("matchExpressions")) for p in preferred),
    ]
    return {
        "required node affinity terms": len(terms),
        "node affinity match expressions": sum(len(exprs) for exprs in lists),
        "preferred node affinity terms": len(preferred),
        "tolerations": len(as_list(spec.get("tolerations"))),
        "node affinity values": sum(len(as_list(as_dict(e).get("values"))) for exprs in lists for e in exprs),
    }


FEWER = (
    "write fewer (one term's In takes a list of values; one toleration with operator Exists covers every value of a"
    " key)"
)


def _fewer(what: str) -> str:
    """What to do about too many of ``what`` (a ``MAX_PLACEMENT`` key)."""
    if what == "node affinity values":
        return (
            "select the nodes by a label they share rather than listing them (the steering copies a term's list into"
            " each term it writes)"
        )
    return FEWER


def _over_placement(spec: JSON) -> tuple[str, int] | None:
    """The first count of node rules past its cap, or None."""
    return next(((what, n) for what, n in _placement_counts(spec).items() if n > MAX_PLACEMENT[what]), None)


def _grown_past(spec: JSON, mutations: Sequence[str]) -> str:
    """Why the pod as the policies leave it is past a cap of ``MAX_PLACEMENT`` that it was within ('' when it is
    not): their affinity multiplies the pod's terms (the spot places, the CUDA steering's alternatives, the spot
    places kept off), and their tolerations add to its own. Admitted so, it would be refused on reinvocation and by
    the validating webhook, as if the user had written it."""
    over = _over_placement(spec)
    if over is None:
        return ""
    what, n = over
    added = ", ".join(dict.fromkeys(mutations)) or "its policies"
    return (
        f"with what gpu-admission adds ({added}) the pod would have {n} {what}; gpu-admission reviews pods of at most"
        f" {MAX_PLACEMENT[what]}: {_fewer(what)}"
    )


def _pod_spec(obj: Any) -> JSON:
    """The pod's spec, or its template's ({} when there is none)."""
    node: Any = obj
    for key in TEMPLATE_PATHS.get(as_str(as_dict(obj).get("kind")), ()):
        node = node.get(key) if isinstance(node, dict) else None
    return as_dict(as_dict(node).get("spec"))


def _oversized(obj: JSON) -> Result | None:
    """A denial for a pod (template) with more containers, or more node rules, than the webhook reviews, else
    None."""
    spec = _pod_spec(obj)
    count = len(as_list(spec.get("containers"))) + len(as_list(spec.get("initContainers")))
    if count > MAX_CONTAINERS:
        reason = "TooManyContainers"
        message = (
            f"the pod has {count} containers and init containers; gpu-admission reviews pods of at most "
            f"{MAX_CONTAINERS}: split the workload into smaller pods"
        )
    else:
        over = _over_placement(spec)
        if over is None:
            return None
        what, n = over
        reason = "TooManyNodeRules"
        message = f"the pod has {n} {what}; gpu-admission reviews pods of at most {MAX_PLACEMENT[what]}: {_fewer(what)}"
    return _refused(obj, reason, message)


def _refused(obj: Any, reason: str, message: str) -> Result:
    """A refusal the pipeline makes itself, before or after the policies (a pod too big or too costly to review):
    a denial as a policy's is, so that its reason is the same in the answer, the audit annotations, the decision log
    and ``gpu_admission_denials_total``."""
    outcome = Outcome()
    outcome.deny("pipeline", reason, message)
    audit = {"decision": f"denied ({reason})", "reason": message}
    return Result(allowed=False, code=422, reason=reason, message=message, object=obj, audit=audit, outcome=outcome)


def _prior_outputs(view: PodView) -> dict[str, str]:
    return {
        k[len(PREFIX) :]: v
        for k, v in view.annotations.items()
        if isinstance(k, str) and k.startswith(PREFIX) and not is_input_annotation(k) and isinstance(v, str)
    }


def _stored_outputs(view: PodView, ctx: Context) -> dict[str, str]:
    """On a workload's UPDATE, the webhook's annotations on its template as stored: what the earlier review wrote,
    for the policies to take out or keep (``Context.prior``) where the update dropped it. Client-side ``kubectl
    apply`` of a manifest whose template lost its last annotation deletes the whole map, the webhook's keys with
    it: a workload moved off spot require kept its tolerations and affinity, and a converted fraction back beside
    its MIG device was refused (found by a generative review of the policies together)."""
    if not view.is_template or ctx.operation != "UPDATE" or not isinstance(ctx.old_object, dict):
        return {}
    old = pod_view(ctx.old_object, ctx.namespace, writable=False)
    return _prior_outputs(old) if old is not None else {}


def _mode(policy: str, ctx: Context) -> str:
    """A policy's mode in the request's namespace: the cuda policy's (``cuda.mode_of``, its per-namespace rule in one
    place); every other policy's refusals are enforced."""
    return cuda.mode_of(ctx) if policy == cuda.POLICY else "enforce"


AGAIN = "again-"
"""The prefix of the second copy of each audit key a mutating call writes on an object that already carries the
webhook's annotations (``mutate``): the apiserver calling again (``reinvocationPolicy: IfNeeded``) after a later
webhook changed the pod, or a pod made from a template the webhook reviewed (its first call). kube-apiserver keeps
the first value an audit key gets in one request and only logs a warning for another (k8s.io/apiserver pkg/admission
``attributesRecord.AddAnnotation``: "admission annotations are not allowd to be overwritten"; the mutating dispatcher
logs "Failed to set admission audit annotation"): under the first call's keys alone, what the second one decided was
lost; under ``again-`` keys alone, a workload's pods' first calls were missing from a query on ``decision``."""

_AUDIT_KEY_BAD = re.compile(r"[^-A-Za-z0-9_.]+")


def audit_key(key: str) -> str:
    """A valid auditAnnotations key (the name part of a qualified name, <= 63 characters); the apiserver drops
    any other key from the audit log."""
    return _AUDIT_KEY_BAD.sub("-", key)[:63].strip("-_.") or "note"


def _short(text: str, limit: int = WARNING_LIMIT) -> str:
    """A warning as sent: its control characters escaped as Python writes them (a newline as ``\\n``), cut to
    ``limit`` characters."""
    return clipped(escaped(text), limit)


def _line(text: str, limited: bool, name: str = "") -> str:
    """A warning built apart from the policies': within a line where the answer keeps to the response limits
    (``fit_warning``: ``name``, the key it names, shortened first), else whole, for the offline review, which
    prints every warning whole (``Context.limited``; found by a review: a long key was cut there)."""
    return _short(fit_warning(text, name) if name else text) if limited else escaped(text)


def _finish(result: Result, ctx: Context, outcome: Outcome, steps: str) -> Result:
    """Apply enforcement modes to what the policies said; ``steps``: the audit ``decision`` of an allowed answer
    ('' to leave it to the caller). The response limits are applied by ``mutate`` and ``validate`` (``_limited``)."""
    enforced: list[Denial] = []
    others = len(outcome.warnings)
    for d in outcome.denials:
        mode = _mode(d.policy, ctx)
        if mode == "enforce":
            enforced.append(d)
        elif mode == "warn":
            _, has_fix, fix = d.message.partition(d.fix)
            # kubectl shows a warning on one line: lead with what to change (the Event has the whole message).
            head = f"would be denied ({d.reason}) in enforce mode"
            if d.summary:
                outcome.warn(f"{head}: {d.summary}")
            else:
                outcome.warn(f"{head}; to fix: {fix}" if has_fix else f"{head}: {d.message}")
            key = f"{d.policy}-would-deny"  # every container's, not the last one's
            result.audit[key] = f"{result.audit[key]}\n{d.message}" if key in result.audit else d.message
    # what enforce mode would deny first: past the budget, the per-container lines are what is left unsaid
    outcome.warnings[:] = [*outcome.warnings[others:], *outcome.warnings[:others]]
    result.warnings = list(outcome.warnings)
    result.pods_refused = list(outcome.pods_refused)
    result.outcome = outcome
    for key, value in outcome.audit.items():
        result.audit[audit_key(key)] = value
    if enforced:
        result.allowed = False
        result.code = 403
        result.reason = enforced[0].reason
        # a denial a line: a user's newline in one (a container's name, an image) is escaped, not a line of its own
        result.message = clipped("\n".join(escaped(d.message) for d in enforced), MESSAGE_LIMIT)
        reasons = ", ".join(dict.fromkeys(d.reason for d in enforced))  # each once: one per container repeats
        result.audit["decision"] = f"denied ({reasons})"
        result.audit["reason"] = result.message
    elif steps:
        result.audit["decision"] = steps
    return result


def _limited(result: Result, ctx: Context) -> Result:
    """``result`` within the response limits, applied once to every answer as it leaves ``mutate`` or
    ``validate``: its warnings capped (``_capped``), each audit value cut to ``AUDIT_VALUE_LIMIT``. The answers
    built apart from the policies' (a pod update's annotations put back, a workload's template review kept) were
    sent whole: a key of 200,000 characters made audit values as long, and 3,000 misspelt keys 3,000 warnings
    (found by a review of what the webhook reports). Not for the offline review (``Context.limited`` False), which the
    cut's last line names as where every warning is shown whole."""
    if not ctx.limited:
        return result
    result.warnings = _capped(result.warnings)
    result.audit = {key: clipped(value, AUDIT_VALUE_LIMIT) for key, value in result.audit.items()}
    return result


def _whole_lines(lines: Sequence[str], limit: int = AUDIT_VALUE_LIMIT) -> str:
    """``lines`` joined, as many whole as fit within ``limit`` (an audit value's), with how many more there are said
    last; a first line past it is cut (``_limited``). Found by a review: a value cut at its limit mid-line."""
    for shown in range(len(lines), 0, -1):
        more = (
            f"\n{len(lines) - shown} more, not shown: gpu-admission review shows them all" if shown < len(lines) else ""
        )
        text = "\n".join(lines[:shown]) + more
        if len(text) <= limit:
            return text
    return "\n".join(lines)


def _capped(lines: Sequence[str]) -> list[str]:
    """The warnings as sent: each shortened to a line, and all within WARNINGS_TOTAL, the rest counted."""
    warnings: list[str] = []
    total = 0
    for shown, w in enumerate(lines):
        w = _short(w)
        if total + len(w) > WARNINGS_TOTAL - 80:
            # said in the room kept for it, so that none is dropped unsaid
            warnings.append(f"{len(lines) - shown} {NOT_SHOWN}")
            break
        warnings.append(w)
        total += len(w)
    return warnings


def _context_for(
    ctx: Context, view: PodView, prior: Mapping[str, str], stored: Mapping[str, str] | None = None
) -> Context:
    return Context(
        settings=ctx.settings,
        cluster=ctx.cluster,
        namespace=view.namespace or ctx.namespace,
        operation=ctx.operation,
        username=ctx.username,
        groups=ctx.groups,
        dry_run=ctx.dry_run,
        old_object=ctx.old_object,
        prior=prior,
        stored=stored or {},
        images=ctx.images,
    )


EDITABLE = ("metadata", "spec", "template")
"""The parts of an object the policies may change (a pod's metadata and spec; a workload's spec, or a PodTemplate's
template, where the pod template lives); the rest (status, above all) is neither copied nor diffed."""


def _working_copy(obj: JSON) -> JSON:
    """A copy of ``obj`` that shares everything but the editable parts."""
    return {k: copy_json(v) if k in EDITABLE else v for k, v in obj.items()}


def _pointer(path: str, key: object) -> str:
    """RFC 6901: '~' is written '~0' and '/' is written '~1'."""
    return f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _diff(old: Any, new: Any, path: str, ops: list[JSON]) -> None:
    """Append the ops that turn ``old`` into ``new`` at ``path``: maps key by key, lists of the same length item by
    item, a list that only grew by appending at explicit indices; anything else is replaced whole. Every op applies
    as RFC 6902 says (no add under a missing parent, no negative index). Values Python holds equal (1, 1.0, True)
    count as unchanged: the policies write strings and maps, never retype a user's number."""
    if type(old) is type(new) and old == new:
        return
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": _pointer(path, key)})
        for key, value in new.items():
            if key in old:
                _diff(old[key], value, _pointer(path, key), ops)
            else:
                ops.append({"op": "add", "path": _pointer(path, key), "value": value})
        return
    if (
        isinstance(old, list)
        and isinstance(new, list)
        and (len(new) == len(old) or (len(new) > len(old) and new[: len(old)] == old))
    ):
        for index, (a, b) in enumerate(zip(old, new, strict=False)):
            _diff(a, b, f"{path}/{index}", ops)
        for index in range(len(old), len(new)):
            ops.append({"op": "add", "path": f"{path}/{index}", "value": new[index]})
        return
    ops.append({"op": "replace", "path": path, "value": new})


def make_patch(before: JSON, after: JSON) -> list[JSON]:
    """The JSON Patch from ``before`` to ``after`` (a ``_working_copy`` of it), over the editable parts only.

    Hand-written rather than ``jsonpatch.make_patch``: the policies only add and change fields and append to lists,
    so a plain structural diff says it in as few ops, at a fraction of the cost (no sequence matching)."""
    ops: list[JSON] = []
    for key in EDITABLE:
        if key in after or key in before:
            if key not in before:
                ops.append({"op": "add", "path": f"/{key}", "value": after[key]})
            elif key not in after:
                ops.append({"op": "remove", "path": f"/{key}"})
            else:
                _diff(before[key], after[key], f"/{key}", ops)
    return ops


def _working_view(
    obj: Any, ctx: Context, writable: bool = True, keep: bool = True
) -> tuple[Result | None, PodView | None]:
    """The guards in their fixed order, then the pod: inside a working copy when ``writable``, else inside ``obj``
    itself (validators only read). Returns (early answer, None) or (None, view)."""
    skipped = _guard(obj, ctx)
    if skipped:
        return Result(object=obj, skipped=skipped), None
    oversized = _oversized(obj)
    if oversized is not None:
        return oversized, None
    stored = _stored_template(obj, ctx) if keep else None
    if stored is not None:
        return _keep_review(obj, stored, ctx) if writable else Result(object=obj, skipped=TEMPLATE_KEPT), None
    view = pod_view(_working_copy(obj) if writable else obj, ctx.namespace, writable=writable)
    if view is None:
        return Result(object=obj, skipped="no pod spec to review"), None
    return None, view


TEMPLATE_KEPT = "the update leaves the pod template as it was: reviewed when written, its pods as they are created"


def _stored_template(obj: JSON, ctx: Context) -> PodView | None:
    """On a workload's UPDATE that leaves its pod template as it was (the webhook's own annotations aside: a
    server-side apply drops those its manager did not write), the template as stored; None otherwise.

    Such an update (its replicas, its strategy) is not reviewed again: a review would rewrite the template's
    annotations with what the cluster says now (a newer driver, another pool) and so roll every pod of the workload
    for nothing. Its pods are still reviewed, each as it is created. One whose manifest (client-side kubectl
    apply's) changed the template's GPU asks is reviewed: a fraction dropped from the manifest, or made a whole 1,
    leaves the template as stored (the device, the webhook's 1, stood in the fraction's place), and what the
    conversion wrote stayed (a generative review of MIG template lifecycles). Any other change of the manifest (a
    defaulted field written out) leaves the review as stored."""
    if ctx.operation != "UPDATE" or as_str(obj.get("kind")) == "Pod" or not isinstance(ctx.old_object, dict):
        return None
    new, old = pod_view(obj, ctx.namespace, writable=False), pod_view(ctx.old_object, ctx.namespace, writable=False)
    if new is None or old is None or new.spec != old.spec:
        return None
    if _users_metadata(new.metadata) != _users_metadata(old.metadata):
        return None
    if _last_applied(new) != _last_applied(old) and mig_update.manifest_asks(new) != mig_update.manifest_asks(old):
        return None
    return old


def _last_applied(view: PodView) -> object:
    return as_dict(as_dict(view.root.get("metadata")).get("annotations")).get(LAST_APPLIED)


def _users_metadata(metadata: JSON) -> JSON:
    """A template's metadata without the webhook's own annotations (and without an annotations map left empty)."""
    outputs = _output_annotations({"metadata": metadata})
    annotations = {k: v for k, v in as_dict(metadata.get("annotations")).items() if k not in outputs}
    out = {k: v for k, v in metadata.items() if k != "annotations"}
    return {**out, "annotations": annotations} if annotations else out


def _keep_review(obj: JSON, stored: PodView, ctx: Context) -> Result:
    """The template's review as stored: nothing when the update carries the webhook's annotations as they were,
    else a patch that puts them back (the template then is as stored, and its pods do not roll)."""
    working = _working_copy(obj)
    view = pod_view(working, ctx.namespace)
    before = _output_annotations({"metadata": stored.metadata})
    if view is None or _output_annotations({"metadata": view.metadata}) == before:
        return Result(object=obj, skipped=TEMPLATE_KEPT)
    if _output_annotations({"metadata": view.metadata}):
        # Words of its own that differ from the stored ones: the apiserver calling again (reinvocation) with this
        # update's review, which wrote a template equal to the stored one (0.5 made 0.4, the same profile) and
        # other words; put back, the stored words were stale (a generative review). Words a review would not
        # write (edited by hand) are put back as they were stored.
        again = _mutate(obj, ctx, keep=False)
        if again.allowed and not again.patch:
            return again
    arrived = _output_annotations({"metadata": view.metadata})
    brought = [k[len(PREFIX) :] for k in arrived if k not in before]
    for key in arrived:
        del view.metadata["annotations"][key]
    for key, value in before.items():
        view.set_annotation(key, value)
    if view.metadata.get("annotations") == {} and "annotations" not in stored.metadata:
        del view.metadata["annotations"]
    restored = ", ".join(sorted(k[len(PREFIX) :] for k in before))
    return Result(
        object=working,
        patch=make_patch(obj, working),
        warnings=_unknown_keys(brought, ctx.limited),  # a misspelt key applied again is said again (found by a review)
        audit={"decision": "kept the pod template's review", "restored": restored},
    )


def _output_annotations(obj: Any) -> dict[str, Any]:
    annotations = as_dict(as_dict(as_dict(obj).get("metadata")).get("annotations"))
    return {k: v for k, v in annotations.items() if k.startswith(PREFIX) and not is_input_annotation(k)}


def protect_outputs(obj: Any, old: Any, limited: bool = True) -> Result:
    """A pod UPDATE may not change the webhook's own annotations: put them back as they were on ``old``;
    ``limited``: its warnings within a line each (``Context.limited``)."""
    if not isinstance(old, dict):  # the apiserver always sends it; without it, nothing says what they were
        return Result(object=obj, skipped="pod update without the stored pod (oldObject)")
    before, now = _output_annotations(old), _output_annotations(obj)
    if before == now:
        return Result(object=obj, skipped="pod update leaves the webhook's annotations as they were")
    working = copy_json(obj)
    metadata = working.get("metadata")
    if not isinstance(metadata, dict):
        return Result(object=obj, skipped="pod update without metadata")
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        annotations = metadata["annotations"] = {}
    for key in now:
        del annotations[key]
    annotations.update(before)
    if not annotations and "annotations" not in as_dict(as_dict(obj).get("metadata")):
        del metadata["annotations"]
    changed = sorted(k[len(PREFIX) :] for k in set(before) | set(now) if before.get(k) != now.get(k))
    ours = [k for k in changed if is_output_annotation(PREFIX + k)]
    warnings = (
        [_line(f"{PREFIX}{', '.join(ours)} can only be written by the webhook; put back as it was", limited)]
        if ours
        else []
    )
    warnings += _unknown_keys([k for k in changed if k not in ours and PREFIX + k in now], limited)  # misspelt input
    return Result(
        object=working,
        patch=make_patch(obj, working),
        warnings=warnings,
        audit={"decision": "restored the webhook's annotations", "restored": ", ".join(changed)},
    )


def mutate(obj: Any, ctx: Context) -> Result:
    """Run the mutating policies over a copy of ``obj``; the patch turns ``obj`` into ``result.object``.

    On an object that already carries the webhook's annotations every audit key is written twice, as ``<key>`` and
    ``AGAIN + <key>``: a first call's plain keys are where an operator looks; where the apiserver calls again, the
    plain keys keep the first call's values and the ``AGAIN`` ones are set by this call, unless a first call on
    such an object (a pod made from a reviewed template) set them before."""
    again = _carries_outputs(obj)
    if ctx.operation == "UPDATE" and as_dict(obj).get("kind") == "Pod" and not _exempt(ctx):
        result = protect_outputs(obj, ctx.old_object, ctx.limited)
    else:
        result = _bounded(obj, lambda: _mutate(obj, ctx, keep=True))
    if again:
        result.audit.update({audit_key(AGAIN + key): value for key, value in result.audit.items()})
    return _limited(result, ctx)


def _carries_outputs(obj: Any) -> bool:
    """Whether the pod, or a workload's pod template, in ``obj`` carries any of the webhook's annotations."""
    view = pod_view(obj, "", writable=False) if isinstance(obj, dict) else None
    return view is not None and any(is_output_annotation(key) for key in view.annotations)


def _bounded(obj: Any, run: Callable[[], Result]) -> Result:
    """``run()`` within the review's CPU budget (``webhook.budget``), else a refusal that says what makes the pod
    costly to review."""
    try:
        return budget.within(run)
    except budget.TooComplex:
        kind = as_str(as_dict(obj).get("kind")) or "object"
        message = (
            f"gpu-admission gave up reviewing this {kind} after {budget.REVIEW_CPU_SECONDS:g} s of CPU, more than a "
            f"pod's review takes by far ({_sizes(obj)}): write a smaller pod (fewer containers, fewer MIG asks, "
            "fewer node affinity terms and values, fewer extended resources), or split the workload"
        )
        return _refused(obj, reason="TooComplex", message=message)


def _sizes(obj: Any) -> str:
    """What a pod is made of, in counts, for the TooComplex refusal."""
    spec = _pod_spec(obj)
    containers = [c for key in ("containers", "initContainers") for c in as_list(spec.get(key))]
    resources = {
        name
        for c in containers
        for section in ("limits", "requests")
        for name in as_dict(as_dict(as_dict(c).get("resources")).get(section))
    }
    counts = {
        "containers": len(containers),
        "resource names": len(resources),
        **{what: n for what, n in _placement_counts(spec).items() if n},
    }
    return ", ".join(f"{n} {what}" for what, n in counts.items())


def _mutate(obj: Any, ctx: Context, keep: bool) -> Result:
    """``mutate``; ``keep``: an update that leaves the template as stored keeps its review (``_stored_template``)."""
    early, view = _working_view(obj, ctx, keep=keep)
    if view is None:
        assert early is not None
        if early.skipped == TEMPLATE_KEPT or not early.skipped:
            # once: a kept template's review run again (``_keep_review``, reinvocation) has said them already
            early.warnings = list(dict.fromkeys([*_misplaced_now(obj, ctx), *early.warnings]))
        return early
    working = view.root
    prior = _prior_outputs(view)
    unknown = _unknown_keys(prior, ctx.limited)
    annotations = view.metadata.get("annotations")
    # a map that held only the webhook's words is the webhook's (an earlier review made it)
    had_annotations = isinstance(annotations, dict) and len(annotations) > len(prior)
    if isinstance(annotations, dict):
        for name in prior:
            del annotations[PREFIX + name]  # forged or stale: the policies write them afresh
    stored = _stored_outputs(view, ctx)
    pctx = _context_for(ctx, view, {**stored, **prior}, stored)
    outcome = Outcome()
    for _, step in MUTATORS:
        step(view, pctx, outcome)
    while outcome.finish:
        outcome.finish.pop(0)()
    if grown := _grown_past(view.spec, outcome.mutations):  # refused as the pod as written would be
        return _refused(obj, reason="TooManyNodeRules", message=grown)
    untouched: list[str] = []
    why = pods_pass(view, pctx) if view.is_template else ""
    if why:
        said = left_unconverted(view, why, pctx, reviewed=True)
        untouched = [*said.pending, *said.no_gpu]
    # no pod is checked as it is created, for the MIG profile chosen then: none is (found by reviews)
    if (why or not pctx.settings.mig.enabled) and outcome.annotations.get(cuda.POLICY) == cuda.DEFERRED:
        del outcome.annotations[cuda.POLICY]
        untouched += _cuda_unchecked(view, why) if why else []
    for name, text in sorted(outcome.annotations.items()):
        view.set_annotation(PREFIX + name, text)
    if not had_annotations and view.metadata.get("annotations") == {}:
        del view.metadata["annotations"]  # do not leave behind an empty map that we created
    if not view.metadata and "metadata" not in as_dict(_pod_node(obj)):
        # nor the template's metadata made for them (pod_view): its pods' CUDA line dropped where they pass
        # untouched, a CronJob was sent a patch adding an empty map (found by a review)
        del as_dict(_pod_node(working))["metadata"]
    outcome.warnings[:0] = [*_opt_out_refused(obj, view, ctx), *_misplaced_now(obj, ctx), *unknown]
    _pods_passed(view, pctx, outcome)
    result = Result(object=working)
    _finish(result, pctx, outcome, "")  # an allowed answer's decision follows from its patch, below
    if result.allowed and (too_long := _fit_annotations(view)):
        return _refused(obj, reason="AnnotationsTooLong", message=too_long)
    if result.allowed:
        result.warnings[:0] = untouched  # first, within the count sent; not where it is denied anyway
        result.patch = make_patch(obj, working)
        if result.patch:
            result.audit["decision"] = "mutated" if outcome.mutations else "annotated"
        else:
            # Nothing to say: the apiserver may call again after a later webhook's change (reinvocation), and that
            # call, changing the pod, would be lost under a first value of this one's; or this is that call, on a
            # pod as the webhook left it, whose first answer said "mutated". The validating webhook's decision stands.
            result.audit.clear()
        if untouched:  # whole lines: a warning is cut to a line
            result.audit["pods-untouched"] = _whole_lines(untouched) if ctx.limited else "\n".join(untouched)
    else:
        result.object = obj
    return result


def validate(obj: Any, ctx: Context) -> Result:
    """Run the validating policies over the final object; never changes it."""
    return _limited(_bounded(obj, lambda: _validate(obj, ctx)), ctx)


def _validate(obj: Any, ctx: Context) -> Result:
    early, view = _working_view(obj, ctx, writable=False)
    if view is None:
        assert early is not None
        return early
    pctx = _context_for(ctx, view, _prior_outputs(view))
    outcome = Outcome()
    for _, step in VALIDATORS:
        step(view, pctx, outcome)
    _pods_passed(view, pctx, outcome)
    result = _finish(Result(object=obj), pctx, outcome, "admitted")
    if not result.allowed and (gone := ungated(obj, ctx)):
        _ungate_refusal(result, gone, view, ctx)
    return result


def _misplaced(obj: Any, limited: bool) -> list[str]:
    """Warnings for the annotations a user writes that sit on a workload's own metadata, where its pods never see
    them (a pod gets its template's metadata), and not on its pod template; ``limited``: ``_line``'s."""
    kind = as_str(obj.get("kind")) if isinstance(obj, dict) else ""
    if kind == "Pod" or kind not in TEMPLATE_PATHS:
        return []
    view = pod_view(obj, "", writable=False)
    template = view.annotations if view is not None else {}
    own = _own_annotations(obj)
    return [
        _line(f"{key} is on the {kind}, not its pod template, so its pods never see it: move it there", limited)
        for key in own
        if isinstance(key, str) and is_input_annotation(key) and key not in template
    ]


ANNOTATIONS_LIMIT = 256 * 1024
"""The most bytes of keys and values an object's annotations may hold, a pod template's too (k8s.io/apimachinery
api/validation ValidateAnnotationsSize, TotalAnnotationSizeLimitB)."""
LEFT_OUT = "container lines left out: with them the pod's annotations would pass the apiserver's 256 KiB"


def _bytes(text: str) -> int:
    """The UTF-8 bytes of ``text`` as the apiserver counts them (a lone surrogate, which JSON may escape, as the
    three of the replacement character it becomes)."""
    return len(text.encode("utf-8", "surrogatepass"))


def _fit_annotations(view: PodView) -> str:
    """'' when the pod's annotations, the webhook's written, are within what the apiserver takes; else why they are
    not. Past it, the apiserver refused the pod that the webhook had admitted, in words that do not name the webhook
    (a pod of 249 GPU containers against 12 pools, or one whose own annotations were near the limit: found by a
    review). The container lines of ``gpu-admission.io/cuda``, which only people read, are left out first; what
    later reviews read back (its decision and steering lines, ``mig``, ``spot-applied``) is kept whole."""
    annotations = as_dict(view.metadata.get("annotations"))
    total = sum(_bytes(str(k)) + _bytes(str(v)) for k, v in annotations.items())
    if total <= ANNOTATIONS_LIMIT:
        return ""
    key = PREFIX + cuda.POLICY
    text = as_str(annotations.get(key))
    lines = text.split("\n")
    kept = [line for line in lines if line.startswith(("decision: ", cuda.STEERING))]
    if key in annotations and len(kept) < len(lines):
        short = "\n".join([f"({len(lines) - len(kept)} {LEFT_OUT}; gpu-admission review shows them)", *kept])
        annotations[key] = short
        total -= _bytes(text) - _bytes(short)
        if total <= ANNOTATIONS_LIMIT:
            return ""
    ours = {k: _bytes(k) + _bytes(str(v)) for k, v in annotations.items() if is_output_annotation(k)}
    theirs = total - sum(ours.values())
    said = ", ".join(f"{k[len(PREFIX) :]} {n}" for k, n in ours.items())
    return (
        f"the pod's annotations would hold {total} bytes, past the {ANNOTATIONS_LIMIT} the apiserver takes for an"
        f" object: its own {theirs}, gpu-admission's {sum(ours.values())} ({said}); shorten the pod's own"
        " annotations (or, where gpu-admission's are the most, give it fewer containers or simpler placement)"
    )


def _unknown_keys(names: Iterable[str], limited: bool) -> list[str]:
    """Warnings for the keys under PREFIX (``names``: what follows it) a pod arrives with, or an update writes, that
    the webhook neither reads nor writes: taken off as every key under PREFIX but the inputs is (a pod carries no
    word under PREFIX the webhook did not write), a misspelt input (``gpu-memroy``, ``cuda-verison``) had vanished
    without a word (found by a review). ``limited``: ``_line``'s."""
    warnings = []
    for key in (PREFIX + name for name in names):
        if is_output_annotation(key):
            continue
        if key == GPU_MEMORY_RESOURCE:
            said = f"{key} taken off: it is a resource, not an annotation; set it in a container's resources.limits"
        else:
            near = difflib.get_close_matches(key[len(PREFIX) :], [*INPUT_ANNOTATIONS, "gpu-memory"], 1, 0.7)
            said = f"{key} taken off: no gpu-admission key"
            if near == ["gpu-memory"]:
                said += f"; did you mean the resource {GPU_MEMORY_RESOURCE}?"
            elif near:
                said += f"; did you mean {PREFIX}{near[0]}?"
            elif key == IGNORE_LABEL:
                said += "; the opt-out is a label (where the settings allow it)"
        warnings.append(_line(said, limited, key))  # the key meant kept whole, the user's shortened
    return warnings


def _misplaced_now(obj: Any, ctx: Context) -> list[str]:
    """The ``_misplaced`` warnings, when the workload is made or its own annotations change on an update that
    reaches the webhook (the chart sends those that change the pod template too), not on every other update."""
    if ctx.old_object is None or _own_annotations(obj) != _own_annotations(ctx.old_object):
        return _misplaced(obj, ctx.limited)
    return []


def _own_annotations(obj: Any) -> Any:
    return as_dict(as_dict(as_dict(obj).get("metadata")).get("annotations"))


def review(obj: Any, ctx: Context) -> Result:
    """What the apiserver would end with: mutate, then validate the mutated object (the CLI's path)."""
    mutated = mutate(obj, ctx)
    if not mutated.allowed or mutated.skipped:
        return mutated
    checked = validate(mutated.object, ctx)
    warnings = list(dict.fromkeys(mutated.warnings + checked.warnings))
    checked.warnings = warnings
    checked.pods_refused = list(dict.fromkeys(mutated.pods_refused + checked.pods_refused))
    checked.patch = mutated.patch
    checked.object = mutated.object if checked.allowed else obj
    checked.audit = {**mutated.audit, **checked.audit}
    if not checked.allowed:
        checked.patch = []
    return checked

"""What every policy works on: the pod (or a workload's pod template), the request context, and the outcome.

Policies are pure: ``(PodView, Context, Outcome) -> None``. They change the PodView's dicts in place (the pipeline
hands them a working copy and diffs once at the end) and record what they did and why in the Outcome.
"""

from __future__ import annotations

import copy
import json
import marshal
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import orjson

from webhook import PREFIX

if TYPE_CHECKING:
    from webhook.cluster import ClusterView
    from webhook.config import Settings
    from webhook.registry import ImageLookup

JSON = dict[str, Any]

INPUT_ANNOTATIONS = ("spot", "gpu-fraction", "gpu-fraction-container", "cuda-version")
"""The keys under PREFIX users write (and ``cuda-version.<container>``)."""
OUTPUT_ANNOTATIONS = ("cuda", "mig", "spot-applied")
"""The keys under PREFIX the webhook writes (``Outcome.annotate``). Every key under PREFIX but the inputs is taken
off a pod as it arrives (forged or stale: a pod carries no word under PREFIX the webhook did not write), and kept
as it was by a pod update; one that is none of these is said to be taken off (``pipeline._unknown_keys``)."""
IGNORE_LABEL = PREFIX + "ignore"
GPU_MEMORY_RESOURCE = PREFIX + "gpu-memory"

# Where the pod template sits in each workload kind this webhook converts.
TEMPLATE_PATHS: Mapping[str, tuple[str, ...]] = {
    "Pod": (),
    "PodTemplate": ("template",),
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
# The kind that will own the pods a workload creates (for owner-kind defaults).
POD_OWNER = {"Deployment": "ReplicaSet", "CronJob": "Job"}
BUILTIN_GROUPS: dict[str, tuple[str, ...]] = {
    "Job": ("batch",),
    "ReplicaSet": ("apps", "extensions"),
    "Deployment": ("apps", "extensions"),
    "StatefulSet": ("apps",),
    "DaemonSet": ("apps", "extensions"),
    "ReplicationController": ("",),
}
"""The API groups of the built-in controllers a pod's owner kind may name, today's first (extensions/v1beta1:
objects of clusters before 1.16, still listed by some tools): a Volcano Job (batch.volcano.sh) is not a Job."""

LWS_PER_POD_LABELS = ("worker-index", "group-index", "group-key", "subgroup-index", "subgroup-key")
"""A LeaderWorkerSet's pod: its index in its group, its group's index and key, its subgroup's (sigs.k8s.io/lws,
api/leaderworkerset/v1/leaderworkerset_types.go)."""

PER_POD_LABELS = frozenset(
    (
        "statefulset.kubernetes.io/pod-name",  # StatefulSet: the pod's name
        "apps.kubernetes.io/pod-index",  # StatefulSet: its ordinal (Kubernetes 1.28+)
        "batch.kubernetes.io/job-completion-index",  # Indexed Job: its index (Kubernetes 1.28+)
        "batch.kubernetes.io/job-name",  # Job: the Job's name, and (below) its uid; the old keys too
        "job-name",
        "batch.kubernetes.io/controller-uid",
        "controller-uid",
        *(f"jobset.sigs.k8s.io/{key}" for key in ("job-index", "job-global-index", "job-group-index", "job-key")),
        *(f"leaderworkerset.sigs.k8s.io/{key}" for key in LWS_PER_POD_LABELS),
        "controller-revision-hash",  # a StatefulSet's revision, "<statefulset>-<hash>": an LWS group's is its own
        "training.kubeflow.org/replica-index",  # Kubeflow Training Operator v1 (PyTorchJob, TFJob, ...): its index
        "spark-exec-id",  # a Spark executor: its id in the application
    )
)
PER_POD_ANNOTATIONS = frozenset(
    (
        "batch.kubernetes.io/job-completion-index",  # Indexed Job: its index
        "batch.kubernetes.io/job-index-failure-count",  # backoffLimitPerIndex: the index's failures so far
        "batch.kubernetes.io/job-index-ignored-failure-count",  # the same, those a podFailurePolicy ignored
        *(f"jobset.sigs.k8s.io/{key}" for key in ("job-index", "job-global-index", "job-group-index", "job-key")),
        "leaderworkerset.sigs.k8s.io/leader-name",  # an LWS worker: its group's leader pod
    )
)
PER_POD_SPEC = frozenset(("hostname", "subdomain"))
PER_POD_OWNER = frozenset(("name", "uid"))
PER_POD_ENV = frozenset(("LWS_WORKER_INDEX", "LWS_LEADER_ADDRESS", "RANK", "TF_CONFIG", "SPARK_EXECUTOR_ID"))
"""What the controllers write differently into each pod of one workload, and no policy reads: labels, annotations,
spec fields, the fields of each ``ownerReferences`` entry, and the ``value`` of the env entries of these names in
each container and init container. A StatefulSet's or an Indexed Job's pods differ in their index (in labels, an
annotation, ``spec.hostname``: the pod's name for a StatefulSet, ``<job>-<index>`` for an Indexed Job); the child
Jobs of one JobSet in the Job's name and uid (labels, the owner reference) and their JobSet indexes. A
LeaderWorkerSet's groups are StatefulSets (a worker's group is named after its leader pod, and has a subdomain of
its own under ``UniquePerReplica``), and LWS writes each pod's worker index and its leader's address into every
container's environment (``LWS_WORKER_INDEX``, ``LWS_LEADER_ADDRESS``: sigs.k8s.io/lws, pkg/utils/pod
``AddLWSVariables``). The Kubeflow Training Operator v1 names each pod ``<job>-<type>-<index>``, labels it with its
index (``training.kubeflow.org/replica-index``) and writes its rank into every container's environment: ``RANK``
for a PyTorchJob or an XGBoostJob with a master (the master 0, worker n n + 1), ``TF_CONFIG`` for a TFJob (the
cluster and the pod's own task type and index, as JSON) (github.com/kubeflow/training-operator,
pkg/controller.v1/pytorch/envvar.go ``setPodEnv``, pkg/controller.v1/tensorflow/tensorflow.go). A Spark driver
creates each executor as a pod of its own (no controller between them), named ``<prefix>-exec-<id>`` with that name's
last 63 characters as its ``spec.hostname``, its id in the label ``spark-exec-id`` and in the env
``SPARK_EXECUTOR_ID`` (its name and IP come by ``valueFrom``, the same in every executor) (github.com/apache/spark,
resource-managers/kubernetes/core: ``Constants.scala``, ``features/BasicExecutorFeatureStep.scala``). So the pods
of one StatefulSet, Indexed Job, JobSet, LeaderWorkerSet, Kubeflow job's replica type or Spark application's
executors (of one resource profile) are replicas too; the CUDA policy
reads only CUDA's own variables (``cuda_version.declared_cuda``). Kubernetes' keys:
kubernetes.io/docs/reference/labels-annotations-taints/; JobSet's: sigs.k8s.io/jobset, api/jobset/v1alpha2."""


def is_per_pod_env(entry: object) -> bool:
    """An env entry whose value is one of ``PER_POD_ENV``'s (a name of the list, and a ``value``)."""
    name = entry.get("name") if isinstance(entry, dict) and "value" in entry else None
    return isinstance(name, str) and name in PER_POD_ENV


def per_pod_env(env: object) -> list[dict[str, Any]]:
    """The entries of a container's env whose values tell replicas apart (``is_per_pod_env``); none when a value
    refers to a variable (``$(NAME)``): the CUDA lookup expands references (``cuda_version``), so a per-pod value
    could reach what a policy reads (``CUDA_VERSION=$(RANK)``)."""
    if not isinstance(env, list):
        return []
    found = [e for e in env if is_per_pod_env(e)]
    if found and any(isinstance(e, dict) and "$(" in str(e.get("value") or "") for e in env):
        return []
    return found


def is_output_annotation(key: object) -> bool:
    """True for the annotation keys the webhook writes (``OUTPUT_ANNOTATIONS``)."""
    return isinstance(key, str) and key.startswith(PREFIX) and key[len(PREFIX) :] in OUTPUT_ANNOTATIONS


def is_input_annotation(key: str) -> bool:
    """True for the annotation keys a user writes (``gpu-admission.io/cuda-version.<container>`` included)."""
    if not key.startswith(PREFIX):
        return False
    name = key[len(PREFIX) :]
    return name in INPUT_ANNOTATIONS or name.startswith("cuda-version.")


_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*\Z")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")


def is_qualified_name(name: object) -> bool:
    """k8s.io/apimachinery IsQualifiedName: ``[prefix/]name``, the shape of label keys and resource names."""
    if not isinstance(name, str) or not name:
        return False
    prefix, sep, rest = name.rpartition("/")
    if sep and (not prefix or len(prefix) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(prefix)):
        return False
    return 0 < len(rest) <= 63 and bool(_QUALIFIED_NAME.fullmatch(rest))


def is_label_value(value: object) -> bool:
    """k8s.io/apimachinery IsValidLabelValue: empty, or up to 63 letters, digits, '-', '_', '.' from and to an
    alphanumeric."""
    return isinstance(value, str) and len(value) <= 63 and bool(_LABEL_VALUE.fullmatch(value))  # "$" takes a "\n"


def as_dict(value: object) -> dict[str, Any]:
    """The value if it is a mapping, else an empty dict (objects arrive with any shape)."""
    return value if isinstance(value, dict) else {}


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else []


def as_str(value: object) -> str:
    return value if isinstance(value, str) else ""


compact_json = json.JSONEncoder(separators=(",", ":")).encode
"""JSON text without spaces: the decision log's lines and the Events relay's lines."""


def json_bytes(value: Any) -> bytes:
    """``value`` as compact JSON in UTF-8: the answers and their patches. By orjson (a fifth of ``compact_json``'s
    time), but for what it refuses to write: a string with a lone surrogate and an integer past 64 bits, both of
    which a request's JSON can carry (``admission.decode_json``) into a patch or a message."""
    try:
        return orjson.dumps(value)
    except orjson.JSONEncodeError:
        return compact_json(value).encode()


@dataclass
class PodView:
    """A pod, or the pod template inside a workload, over the working copy (edits land in the object)."""

    kind: str
    """Kind of the admitted object (Pod, Deployment, ...)."""
    metadata: JSON
    """The pod's (or template's) metadata: a live reference into the working copy."""
    spec: JSON
    """The pod's (or template's) spec: a live reference into the working copy."""
    namespace: str
    owner_kind: str = ""
    """Kind of the pod's controller (from ownerReferences), or of the pods' future owner for a template."""
    owner_group: str | None = None
    """The API group of that controller ('batch', '' for the core group); None when its reference names none."""
    root: JSON = field(default_factory=dict, repr=False)
    """The whole admitted object (the working copy) that ``metadata`` and ``spec`` live in."""
    manifest: JSON | None = field(default=None, repr=False, compare=False)
    """``manifest_template_spec``'s answer, read once per request (the policies ask per container)."""

    @property
    def is_template(self) -> bool:
        return self.kind != "Pod"

    @property
    def name(self) -> str:
        return as_str(self.metadata.get("name")) or as_str(self.metadata.get("generateName"))

    @property
    def annotations(self) -> Mapping[str, Any]:
        """Read-only view of the annotations (use ``set_annotation`` to write)."""
        return as_dict(self.metadata.get("annotations"))

    @property
    def labels(self) -> Mapping[str, Any]:
        return as_dict(self.metadata.get("labels"))

    def annotation(self, name: str) -> str | None:
        """The value of ``gpu-admission.io/<name>`` if it is a string."""
        value = self.annotations.get(PREFIX + name)
        return value if isinstance(value, str) else None

    def set_annotation(self, key: str, value: str) -> None:
        if not isinstance(self.metadata.get("annotations"), dict):
            self.metadata["annotations"] = {}
        self.metadata["annotations"][key] = value

    @property
    def defers_gpu(self) -> bool:
        """A template whose GPU the mig policy leaves to each pod (a ``gpu-memory`` request, the ``gpu-fraction``
        annotation): where its pods run is decided when they are created, not by what the template asks now."""
        if not self.is_template:
            return False
        if self.annotation("gpu-fraction") is not None:
            return True
        for _, container in self.containers():
            resources = as_dict(container.get("resources"))
            if any(GPU_MEMORY_RESOURCE in as_dict(resources.get(k)) for k in ("limits", "requests")):
                return True
        return False

    def fraction_container(self) -> JSON | None:
        """The container the ``gpu-fraction`` annotation gives its fraction to: the one ``gpu-fraction-container``
        names, else the first (never an init container); None without the annotation or such a container."""
        if self.annotation("gpu-fraction") is None:
            return None
        named = self.annotation("gpu-fraction-container")
        return next((c for _, c in self.containers(init=False) if not named or c.get("name") == named), None)

    def containers(self, init: bool = True) -> Iterator[tuple[str, JSON]]:
        """(list name, container) for every container that is a mapping: initContainers first, then containers."""
        for list_name in ("initContainers", "containers") if init else ("containers",):
            for container in as_list(self.spec.get(list_name)):
                if isinstance(container, dict):
                    yield list_name, container

    def spec_dict(self, key: str) -> JSON:
        """``spec[key]`` as a dict, created in the working copy when absent or not a mapping."""
        value = self.spec.get(key)
        if not isinstance(value, dict):
            value = {}
            self.spec[key] = value
        return value


@dataclass(frozen=True)
class Context:
    """What a policy may know besides the pod: settings, the cluster snapshot, and the request's facts."""

    settings: Settings
    cluster: ClusterView
    namespace: str = ""
    operation: str = "CREATE"
    username: str = ""
    groups: tuple[str, ...] = ()
    dry_run: bool = False
    old_object: Any = None
    """request.oldObject (UPDATE only)."""
    prior: Mapping[str, str] = field(default_factory=dict)
    """The webhook's output annotations as they stood on the incoming object. Not trustworthy on their own (a user
    may have written them): a policy may reuse a prior line only after checking it against the object."""
    stored: Mapping[str, str] = field(default_factory=dict)
    """On a workload's UPDATE, the webhook's output annotations on its template as stored: an earlier review's own
    words (an update's forged ones are taken out before they are stored)."""
    images: ImageLookup | None = None
    """The image configs this worker has read from registries (``cuda.registry``), as this request sees them;
    None: none are read."""
    limited: bool = True
    """Whether the answer keeps to the response limits (warnings a line each within a total, audit values cut): the
    server's do; the offline review's (False) prints every warning whole, as the server's cut says it does."""


EventType = Literal["Normal", "Warning"]


@dataclass(frozen=True)
class Denial:
    policy: str
    """Which policy refused (cuda, mig, spot): enforcement modes apply per policy."""
    reason: str
    """Short CamelCase reason, used in metrics and audit annotations (CUDAIncompatible, MIGNoProfile, ...)."""
    message: str
    """What was wrong and what to change, in words a user can act on."""
    summary: str = ""
    """The container and what to change, in one line for warn mode's kubectl warning, where the message's own "To
    fix:" part runs past kubectl's line length and would lose what matters (the driver version to upgrade to)."""
    containers: tuple[str, ...] = ()
    """The containers the message is about, named where it opens (``subject``); () where it opens with none."""
    fix: str = "To fix: "
    """The words the message's advice begins with (a spot refusal's is its whole advice): where a refused
    ungating's Event cuts the message, it cuts what comes before them and keeps the advice whole."""

    @property
    def said(self) -> str:
        """The message past the containers it opens with: what is said of each of them."""
        return self.message[len(subject(self.containers)) :] if self.containers else self.message

    @property
    def refusal(self) -> tuple[str, str, str, str]:
        """What is the same in two denials that refuse their containers alike."""
        return self.policy, self.reason, self.summary, self.said


def subject(containers: tuple[str, ...]) -> str:
    """How a denial names the containers it is about: ``container a``, ``each of containers a, b and c``."""
    if len(containers) == 1:
        return f"container {containers[0]}"
    return f"each of containers {', '.join(containers[:-1])} and {containers[-1]}"


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    type: EventType = "Normal"


@dataclass
class Outcome:
    """What the policies decided, collected over one request."""

    annotations: dict[str, str] = field(default_factory=dict)
    """Output annotations by name under the prefix (``cuda`` -> ``gpu-admission.io/cuda``)."""
    warnings: list[str] = field(default_factory=list)
    denials: list[Denial] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    audit: dict[str, str] = field(default_factory=dict)
    """auditAnnotations (key: a qualified name part, <= 63 characters)."""
    mutations: list[str] = field(default_factory=list)
    """Kinds of change made (for metrics): spot-toleration, spot-affinity, mig, cuda-affinity, ..."""
    reasons: list[str] = field(default_factory=list)
    """Short reason codes of every decision, for the decision log."""
    pods_refused: list[str] = field(default_factory=list)
    """Why each pod made from a workload's template would be refused, where the template itself passes: its pods are
    reviewed each as it is created (a gpu-memory size or the gpu-fraction annotation is converted then). Each is a
    warning too; ``gpu-admission review`` exits 1 on any (a CI gate had let such a workload through)."""
    pods_get: list[str] = field(default_factory=list)
    """What each pod made from a workload's template is to get as it is created: the mig policy's words of the MIG
    profile, or the fallback, chosen then for its gpu-memory size or the gpu-fraction annotation. Each is a warning
    too; dropped where the pods pass untouched, none chosen for them (found by a review)."""
    finish: list[Callable[[], None]] = field(default_factory=list, repr=False, compare=False)
    """What a policy leaves to do once every mutating policy has run (the pipeline runs and empties it): words that
    must describe the final pod, which the later policies' changes shape (the mig policy's lines name where the pod
    lands, which the cuda policy's steering narrows; the spot policy says when no spot pool is left to it)."""
    _warned: set[str] = field(default_factory=set, repr=False)

    def annotate(self, name: str, text: str) -> None:
        self.annotations[name] = text

    def warn(self, text: str) -> None:
        if text not in self._warned:
            self._warned.add(text)
            self.warnings.append(text)

    def deny(
        self, policy: str, reason: str, message: str, summary: str = "", container: str = "", fix: str = "To fix: "
    ) -> None:
        """``container``: the container a message that opens with ``container <name>`` is about. The same refusal of
        several containers is one denial that names them all, where the first one was (a pod of four containers each
        asking for a 0.5 that no node offers was refused in four paragraphs that differed only in the name)."""
        named = bool(container) and message.startswith(subject((container,)))
        self._add(Denial(policy, reason, message, summary, (container,) if named else (), fix))
        self.reasons.append(reason)

    def _add(self, denial: Denial) -> None:
        for i, d in enumerate(self.denials):
            if d.containers and denial.containers and d.refusal == denial.refusal:
                containers = tuple(dict.fromkeys((*d.containers, *denial.containers)))  # each named once
                self.denials[i] = replace(d, message=subject(containers) + d.said, containers=containers)
                return
        self.denials.append(denial)

    def refuse_pods(self, text: str) -> None:
        """Warn that each pod of the workload would be refused (``pods_refused``)."""
        self.warn(text)
        self.pods_refused.append(text)

    def tell_pods(self, text: str) -> None:
        """Warn of what each pod of the workload gets as it is created (``pods_get``)."""
        self.warn(text)
        self.pods_get.append(text)

    def event(self, reason: str, message: str, type: EventType = "Normal") -> None:
        self.events.append(Event(reason, message, type))

    def mutated(self, kind: str) -> None:
        self.mutations.append(kind)

    def copy(self) -> Outcome:
        """An outcome apart from this one: its maps, lists and set copied; what they hold (strings, frozen
        ``Denial`` and ``Event``) is immutable and shared. 1.2 µs for a small outcome; ``copy.deepcopy`` took 30."""
        return Outcome(
            annotations=dict(self.annotations),
            warnings=list(self.warnings),
            denials=list(self.denials),
            events=list(self.events),
            audit=dict(self.audit),
            mutations=list(self.mutations),
            reasons=list(self.reasons),
            pods_refused=list(self.pods_refused),
            pods_get=list(self.pods_get),
            finish=list(self.finish),
            _warned=set(self._warned),
        )

    def merge(self, other: Outcome) -> None:
        """Add what ``other`` decided (one policy's part, decided apart): as if it had been said here."""
        self.annotations.update(other.annotations)
        for text in other.warnings:
            self.warn(text)
        for denial in other.denials:
            self._add(denial)
        self.events.extend(other.events)
        self.audit.update(other.audit)
        self.mutations.extend(other.mutations)
        self.reasons.extend(other.reasons)
        self.pods_refused.extend(other.pods_refused)
        self.pods_get.extend(other.pods_get)
        self.finish.extend(other.finish)


V = TypeVar("V")


WARNING_LIMIT = 119
"""kubectl shows each warning on a line of its own; the apiserver advises under 120 characters."""


_ESCAPED = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
"""Unicode's control characters (category Cc): the apiserver drops, unsaid, a warning that holds one (Go's
``net.NewWarningHeader`` refuses any ``unicode.IsControl`` rune); and the bidirectional controls (the Arabic letter
mark, the left-to-right and right-to-left marks, embeddings, overrides and isolates), which reorder a terminal's line
as it is shown ("Trojan Source", CVE-2021-42574); and the line and paragraph separators, which some viewers break a
line at (and Python's ``splitlines``). A user's value may bring any of them in."""


def escaped(text: str) -> str:
    """``text`` with its control and bidirectional control characters written as Python writes them (a newline as
    ``\\n``, U+202E as ``\\u202e``): what a user's value brings in cannot start a line, move the terminal's cursor
    or reorder the line where it is printed."""
    return _ESCAPED.sub(lambda m: repr(m.group())[1:-1], text)


def clipped(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, a cut shown by a closing '…'."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def middle_clipped(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters in its middle, the cut shown by '…': its start says what is wrong,
    its end what to do (a refusal's last line is its advice), and a cut at the end lost the
    advice of a long refusal (a review's finding). The end kept is the last line where it takes at most half of
    ``limit``, else the last third of ``limit``. Newlines at its end go first: the last line of a message that ends
    in one was that newline alone, and the advice was cut (found by a review)."""
    if len(text) <= limit:
        return text
    text = text.rstrip("\n")
    if len(text) <= limit:
        return text
    head, newline, last = text.rpartition("\n")
    end = newline + last if head and len(last) < limit // 2 else text[len(text) - limit // 3 :]
    return text[: limit - len(end) - 1] + "…" + end


def fit_warning(text: str, name: str) -> str:
    """``text`` in at most WARNING_LIMIT characters, its advice kept: a container name of up to 63 characters leaves
    too little room for it, so the name (its first appearance) is shortened in the middle ('train…r-0') first; only
    what still does not fit is cut at the end."""
    if name in text:
        text = text.replace(name, shown_name(text, name), 1)
    return clipped(text, WARNING_LIMIT)


def shown_name(text: str, name: str) -> str:
    """The container ``name`` as ``fit_warning`` shows it in ``text``: whole where the text fits, else shortened in
    the middle by what it is over, to no fewer than 8 characters and the '…'."""
    over = len(text) - WARNING_LIMIT
    if over <= 0:
        return name
    keep = max(len(name) - over - 1, 8)
    short = f"{name[: (keep + 1) // 2]}…{name[len(name) - keep // 2 :]}"
    return short if len(short) < len(name) else name


_COPY_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS
"""What orjson would write as a string (a date, a dataclass, a subclass of str or int) is refused instead."""


def copy_json(value: V) -> V:
    """A deep copy of a JSON value (dicts, lists, strings, numbers, booleans, None) written and read back by orjson
    in C: a sixth of ``copy.deepcopy``'s cost, half of ``marshal``'s round trip. What orjson will not write (an
    integer past 64 bits, a lone surrogate, a type JSON does not have) goes through ``marshal`` (a part used twice
    stays shared, as deepcopy keeps it), and what marshal cannot write through deepcopy. A tuple comes back a list,
    a NaN or an infinity null: the webhook's objects come from strict JSON, which has neither."""
    try:
        copied: V = orjson.loads(orjson.dumps(value, option=_COPY_OPTIONS))
    except orjson.JSONEncodeError:
        try:
            copied = marshal.loads(marshal.dumps(value))  # type: ignore[arg-type]
        except ValueError:
            return copy.deepcopy(value)
    return copied


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def manifest_template_spec(pod: PodView) -> JSON:
    """The pod (template) spec of the manifest client-side ``kubectl apply`` sent, as the user wrote it (kubectl
    keeps it in the ``last-applied-configuration`` annotation of the object): what of a workload's template is the
    user's own and not the webhook's; {} where there is none or it cannot be read. Not to be changed."""
    if pod.manifest is None:
        pod.manifest = _manifest_spec(pod)
    return pod.manifest


def applied_by_kubectl(pod: PodView) -> bool:
    """Whether the object carries the manifest client-side ``kubectl apply`` sent (``manifest_template_spec``)."""
    return isinstance(as_dict(as_dict(pod.root.get("metadata")).get("annotations")).get(LAST_APPLIED), str)


def _manifest_spec(pod: PodView) -> JSON:
    text = as_dict(as_dict(pod.root.get("metadata")).get("annotations")).get(LAST_APPLIED)
    if not isinstance(text, str):
        return {}
    try:
        node: object = orjson.loads(text)
    except orjson.JSONDecodeError:
        return {}
    for key in (*TEMPLATE_PATHS.get(pod.kind, ()), "spec"):
        node = node.get(key) if isinstance(node, dict) else None
    return node if isinstance(node, dict) else {}

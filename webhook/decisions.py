"""Answers per object shape: the replicas of one workload get the answer the first of them got.

A ReplicaSet, Job or StatefulSet creates pods that differ only in who they are (name, uid, creation time, managed
fields; a StatefulSet's or an Indexed Job's pod also its index, in labels, an annotation, its hostname and its
generated name; the child Jobs of a JobSet also their names, uids and indexes; a LeaderWorkerSet's pods also their
group, their index in it and their leader's address, in labels and in every container's env: ``model.PER_POD_*``).
The pipeline reads none of those, so for one cluster snapshot and one settings object its answer to each of them is
the same: ``answer`` computes it once and hands out the stored one to the next replica. What is stored is the
answer (patch, warnings, audit annotations, events to record); the Events and the decision log are still written
per request, with the request's own names.

The store hangs on the ``ClusterView`` it was computed against, so a new snapshot starts empty, and a request still
running against the old one cannot write into the new one's. UPDATEs (which read ``oldObject``) are not stored.
An answer that looked image configs up (``webhook.registry``) carries what it found, and is given anew once one of
those images reads otherwise (read anew and changed, or dropped); one that looked up an image not read yet is not
kept at all.

When the second replica of a shape comes, its body is compared with the first one's (``webhook.replay``): from the
third on, a body that differs from it only in identity strings is answered without being parsed (``decide``). A
template holds bodies of one length; the pods of a longer index learn one of their own.
"""

from __future__ import annotations

import dataclasses
import logging
import marshal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from webhook import replay
from webhook.admission import (
    ReviewRequest,
    answer_parts,
    check_content_type,
    encode_answer,
    parse_review,
)
from webhook.cluster import ClusterView
from webhook.config import Settings
from webhook.model import PER_POD_ANNOTATIONS, PER_POD_LABELS, PER_POD_OWNER, PER_POD_SPEC, Context, per_pod_env
from webhook.pipeline import Result

if TYPE_CHECKING:
    from webhook.registry import ImageConfigs, ImageLookup, Used

log = logging.getLogger("gpu_admission.decisions")

IDENTITY = frozenset(
    ("name", "generateName", "uid", "creationTimestamp", "resourceVersion", "generation", "managedFields", "selfLink")
)
"""Metadata that tells replicas apart and that no policy reads (an Indexed Job's pods: a ``generateName`` each,
``<job>-<index>-``)."""

Step = Callable[[Any, Context], Result]

REPLAYS_PER_LENGTH = 4
"""Templates kept for bodies of one length and endpoint (workloads whose bodies happen to be as long)."""


LEARNING_TRIES = 3
"""Comparisons per stored answer that make no template before it stops learning; each template learned (or
widened: replicas made in the same second share their creation time, a later one differs in one more string)
earns it these tries again. A widening adds a slot, so the learnings at one length are bounded too."""


@dataclass
class Stored:
    """An answer kept for a shape (``key``): shared, read only but for the learning (``_learn``). ``body``: a
    replica's body to compare the next one of its length with, counted in the store's bytes."""

    settings: Settings
    result: Result
    parts: tuple[bytes, bytes]
    body: bytes
    key: bytes
    template: replay.Template | None = None
    review: ReviewRequest | None = None
    """The request ``template``'s body came with (its objects left out): what a replayed request is, but for the
    template's slots."""
    tries: int = LEARNING_TRIES
    images: Used = ()
    """The images it looked up in the configs read from registries, each with what it found
    (``registry.ImageConfigs``): it is given again while each is found the same (``ImageLookup.holds``); none when
    its CUDA came from tags and env: no read changes it."""

    def size(self) -> int:
        """The bytes it holds, as the stores count them: its key, its body, its answer's parts and its patch."""
        return len(self.key) + len(self.body) + len(self.parts[0]) + len(self.parts[1]) + len(self.result.patch_json)


@dataclass(frozen=True)
class Replay:
    """What a body that matches ``template`` (``stored``'s) is answered with (``stored``'s answer, marked
    ``replayed``), and what the request was (its identity aside)."""

    template: replay.Template
    """``stored.template`` when this was kept (a widened template is kept anew), without its Optional."""
    stored: Stored
    review: ReviewRequest
    result: Result


def context_for(
    review: ReviewRequest, settings: Settings, view: ClusterView, images: ImageLookup | None = None
) -> Context:
    return Context(
        settings=settings,
        cluster=view,
        namespace=review.namespace,
        operation=review.operation,
        username=review.username,
        groups=review.groups,
        dry_run=review.dry_run,
        old_object=review.old_object,
        images=images,
    )


def shape(endpoint: str, obj: Any, ctx: Context) -> bytes | None:
    """Everything the pipeline reads from this request, as bytes; None when the answer must not be stored.

    ``marshal`` loads back to an equal object, so equal bytes come only from equal objects; equal objects give
    equal bytes when their values are shared alike (marshal writes a second use of one object as a reference),
    which two parses of the same JSON text are: a difference would only cost a miss. A sixth of ``json.dumps``'s
    cost. The bytes themselves are the key (a dict compares them on a hit): no digest to compute, none to
    collide."""
    if ctx.old_object is not None or not isinstance(obj, dict):
        return None
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        obj = {**obj, "metadata": _without_per_pod(meta)}
    spec = obj.get("spec")
    if isinstance(spec, dict) and (trimmed := _spec_without_per_pod(spec)) is not spec:
        obj = {**obj, "spec": trimmed}
    facts = (endpoint, ctx.namespace, ctx.operation, ctx.username, ctx.groups, ctx.dry_run, obj)
    try:
        return marshal.dumps(facts)
    except ValueError:  # nested deeper than marshal writes
        return None


def _without_per_pod(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` without what tells replicas apart (``IDENTITY``, ``model.PER_POD_*``)."""
    out = {k: v for k, v in meta.items() if k not in IDENTITY}
    for key, per_pod in (("labels", PER_POD_LABELS), ("annotations", PER_POD_ANNOTATIONS)):
        values = out.get(key)
        if isinstance(values, dict) and not per_pod.isdisjoint(values):
            out[key] = {k: v for k, v in values.items() if k not in per_pod}
    owners = out.get("ownerReferences")
    if isinstance(owners, list):
        out["ownerReferences"] = [
            {k: v for k, v in o.items() if k not in PER_POD_OWNER} if isinstance(o, dict) else o for o in owners
        ]
    return out


def _spec_without_per_pod(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` without ``model.PER_POD_SPEC`` and the values of the ``PER_POD_ENV`` entries in each container's
    and init container's env (each such entry kept, without its ``value``); ``spec`` itself when it has neither."""
    out = spec if PER_POD_SPEC.isdisjoint(spec) else {k: v for k, v in spec.items() if k not in PER_POD_SPEC}
    for key in ("initContainers", "containers"):
        containers = out.get(key)
        if isinstance(containers, list) and any(map(_has_per_pod_env, containers)):
            out = {**out, key: [_without_per_pod_env(c) for c in containers]}
    return out


def _has_per_pod_env(container: Any) -> bool:
    return bool(per_pod_env(container.get("env") if isinstance(container, dict) else None))


def _without_per_pod_env(container: Any) -> Any:
    per_pod = [id(e) for e in per_pod_env(container.get("env") if isinstance(container, dict) else None)]
    if not per_pod:
        return container
    env = [{k: v for k, v in e.items() if k != "value"} if id(e) in per_pod else e for e in container["env"]]
    return {**container, "env": env}


def decide(
    endpoint: str,
    step: Step,
    body: bytes,
    content_type: str | None,
    settings: Settings,
    view: ClusterView,
    images: ImageConfigs | None = None,
) -> tuple[ReviewRequest, Result, bytes]:
    """The request in ``body``, its answer, and the AdmissionReview answer's bytes: replayed (a known replica's
    bytes), reused (an object of a known shape) or computed. BadRequest when the body is not a usable review."""
    check_content_type(content_type)
    snapshot = images.snapshot() if images is not None else None
    known = _replayed(endpoint, body, settings, view, snapshot)
    if known is not None:
        return known
    review = parse_review(body, settings.max_body_bytes)
    ctx = context_for(review, settings, view, snapshot)
    result, stored = _answer(endpoint, step, review.object, ctx, body)
    if stored is None:
        return review, result, encode_answer(review.uid, answer_parts(result, mutating=endpoint == "mutate"))
    if stored.result is result:  # reused: a replica to learn from, or a template to keep again
        try:
            if stored.tries > 0:
                _learn(endpoint, stored, body, review, view)
            elif stored.template is not None and _kept(endpoint, stored, len(stored.template.body), view) is None:
                _keep(endpoint, stored, view)  # the replays' store was emptied since
        except Exception:  # learning is a saving, never a reason not to answer
            log.exception("cannot learn a template from the %s request %s", endpoint, review.uid[:64])
    return review, result, encode_answer(review.uid, stored.parts)


def answer(endpoint: str, step: Step, obj: Any, ctx: Context) -> Result:
    """``step(obj, ctx)``, or the answer stored for an object of the same shape.

    A stored answer is shared (``reused``: read it, never change it) and carries no ``object`` (the mutated
    object was the first replica's): the routes answer from the patch; ``gpu-admission review``, which prints the
    object, runs the pipeline itself."""
    return _answer(endpoint, step, obj, ctx)[0]


def _answer(endpoint: str, step: Step, obj: Any, ctx: Context, body: bytes = b"") -> tuple[Result, Stored | None]:
    """The answer, and what is stored for its shape (just stored, when it was computed); None when unstorable."""
    key = shape(endpoint, obj, ctx)
    if key is None:
        return step(obj, ctx), None
    store = ctx.cluster.decisions
    stored: Stored | None = store.get(key)
    if stored is not None and stored.settings is ctx.settings and _holds(stored, ctx.images):
        return stored.result, stored
    result = step(obj, ctx)
    if result.reason == "TooComplex":  # the clock's verdict, not the shape's: each replica is tried again
        return result, None
    if ctx.images is not None and ctx.images.waiting:  # an image not read yet: each replica asks, until it is
        return result, None
    if result.patch:  # written once: the answer, the stored answer and the decision log all read it
        result.patch_json = result.patch_bytes()
    kept = dataclasses.replace(
        result,
        object=None,
        reused=True,
        warnings=list(result.warnings),
        pods_refused=list(result.pods_refused),
        audit=dict(result.audit),
        patch=[],  # kept as its text: its objects share the working copy's and took 7 times the text's bytes
        patch_ops=len(result.patch),
        outcome=result.outcome.copy(),
    )
    # apart from ``result``: what its caller does to it stays its own
    used = ctx.images.used if ctx.images is not None else ()
    stored = Stored(ctx.settings, kept, answer_parts(kept, mutating=endpoint == "mutate"), body, key, images=used)
    store.put(key, stored, size=stored.size())
    return result, stored


def _learn(endpoint: str, stored: Stored, body: bytes, review: ReviewRequest, view: ClusterView) -> None:
    """Compare a replica's body that was not replayed with the one of its length kept (the template's, or the body
    kept to compare with); keep the template they make, widened by the slots of its template at that length (the
    one it has, or one the replays' store still holds). A body of another length is kept to compare the next ones
    with, counted in the store in place of the one before: the tenth pod of a StatefulSet, an Indexed Job or a
    LeaderWorkerSet group is a digit longer, and its pods from there on get a template of their own (the nine
    before keep theirs)."""
    before = stored.template
    if before is None or len(before.body) != len(body):
        before = _kept(endpoint, stored, len(body), view)
    kept = before.body if before else stored.body
    if len(body) != len(kept):
        stored.body = body
        view.decisions.put(stored.key, stored, size=stored.size())
        return
    if body == kept:
        return
    template = replay.learn(kept, body, before.slots if before else ())
    if template is None:
        stored.tries -= 1
        return
    stored.template, stored.body, stored.tries = template, b"", LEARNING_TRIES
    stored.review = dataclasses.replace(review, object=None, old_object=None)
    _keep(endpoint, stored, view)


def _kept(endpoint: str, stored: Stored, length: int, view: ClusterView) -> replay.Template | None:
    """``stored``'s template for bodies of ``length``, when the replays' store still holds it."""
    kept: tuple[Replay, ...] = view.replays.get((endpoint, length)) or ()
    return next((known.template for known in kept if known.stored is stored), None)


def _keep(endpoint: str, stored: Stored, view: ClusterView) -> None:
    """Put ``stored``'s template first among the templates of its body's length, with the request it was learned
    from (never the request that puts it back: its identity would name the replays)."""
    template, review = stored.template, stored.review
    if template is None or review is None:
        return
    replayed = dataclasses.replace(stored.result, replayed=True)  # shares the stored answer's lists: read only
    known = Replay(template, stored, review, replayed)
    key = (endpoint, len(template.body))
    others = [r for r in view.replays.get(key) or () if r.stored is not stored]
    kept = (known, *others[: REPLAYS_PER_LENGTH - 1])  # each holds its body and its answer, stored or not
    view.replays.put(key, kept, size=sum(len(r.template.body) + r.stored.size() for r in kept))


def _holds(stored: Stored, images: ImageLookup | None) -> bool:
    """Whether what ``stored`` found in the image configs still stands (it looked none up, or each is found the
    same: a config read anew, changed, or dropped gives its answers anew; one fallen due is queued by the look)."""
    return not stored.images or (images is not None and images.holds(stored.images))


def _replayed(
    endpoint: str, body: bytes, settings: Settings, view: ClusterView, images: ImageLookup | None
) -> tuple[ReviewRequest, Result, bytes] | None:
    for known in view.replays.get((endpoint, len(body))) or ():
        texts = known.template.match(body) if known.stored.settings is settings else None
        if texts is None or not _holds(known.stored, images):  # only the matching one's images are looked up
            continue
        facts = dict(zip(known.template.labels, texts, strict=True))
        base = known.review
        uid = facts.get("uid", base.uid)  # a slot is never empty: its learned text was not
        subject = dataclasses.replace(
            base.subject,
            name=facts.get("object.name", base.subject.name),
            generate_name=facts.get("object.generateName", base.subject.generate_name),
            uid=facts.get("object.uid", base.subject.uid),
        )
        review = dataclasses.replace(base, uid=uid, name=facts.get("name", base.name), subject=subject)
        return review, known.result, encode_answer(uid, known.stored.parts)
    return None

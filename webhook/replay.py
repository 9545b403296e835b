"""Replicas known by their bytes: a body that differs from a learned one only in who it is gets its answer unparsed.

``webhook.decisions`` reuses the answer given to an object of the same shape, but it parses every body to find the
shape (the JSON, its strict checks, the shape's bytes): that is most of what a reused answer costs for a small pod,
and nearly all of it for a 60 kB one. The replicas of a ReplicaSet or a Job come as bodies of one length that differ
in a few strings only: the request's uid, the pod's name (a generated name is its prefix and five characters), uid
and creation time, and the managed fields' times. So when a second replica comes, its body is compared with the
first one's, and where they differ (each difference widened to the JSON string it lies in) are the *slots* of a
:class:`Template`. The template is kept only when each slot is proved to be one of those identity strings
(:func:`learn`): the body is parsed again with a marker in every slot, and the markers must sit at the identity paths
and change nothing else.

A later body :meth:`Template.match`-es when it has the same length, the same bytes outside the slots, and in each
slot a plain string (no quote, backslash or control character, valid UTF-8). Such a body is valid, strict JSON that
parses to the learned object with other identity strings in the same places, so the answer stored for the learned
one is its answer. A body that does not match takes the whole way (parse, shape, pipeline): nothing is guessed.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from webhook.model import PER_POD_ANNOTATIONS, PER_POD_LABELS, PER_POD_OWNER, PER_POD_SPEC, per_pod_env

PLAIN = re.compile(rb'[^"\\\x00-\x1f]*')
"""A JSON string's content that needs no escape: put between quotes it parses to its UTF-8 text, and nothing else."""

Slot = tuple[int, int]

_MARK = "\x00"
"""Marks slot ``i`` as the text ``\\u0000`` + i: a plain slot cannot hold a NUL, so a mark is never a slot's own."""


@dataclass(frozen=True)
class Template:
    """A learned body and its slots: ``labels[i]`` names what slot ``i`` holds (see ``identity_strings``)."""

    body: bytes
    slots: tuple[Slot, ...]
    labels: tuple[str, ...]

    def match(self, body: bytes) -> list[str] | None:
        """The slots' texts when ``body`` is the learned one with other plain strings in its slots; else None."""
        learned = self.body
        if len(body) != len(learned):
            return None
        texts = []
        at = 0
        for start, end in self.slots:
            if body[at:start] != learned[at:start]:
                return None
            content = body[start:end]
            if PLAIN.fullmatch(content) is None:
                return None
            try:
                texts.append(content.decode("utf-8"))
            except UnicodeDecodeError:
                return None
            at = end
        return texts if body[at:] == learned[at:] else None


def identity_strings(review: Any) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(label, the dict, its key) for every place of an AdmissionReview where replicas differ and that no policy
    reads: the request's uid and name, the object's name, generateName, uid, creationTimestamp and resourceVersion,
    the managed fields' times, and what the controllers write differently into each pod of one workload
    (``model.PER_POD_LABELS``, ``PER_POD_ANNOTATIONS``, ``PER_POD_SPEC``, ``PER_POD_OWNER``, ``PER_POD_ENV``'s
    values in each container's and init container's env). Labels: ``uid``, ``name``, ``object.name``,
    ``object.generateName``, ``object.uid``; ``-`` for the rest."""
    request = review.get("request") if isinstance(review, dict) else None
    if not isinstance(request, dict):
        return
    yield "uid", request, "uid"
    yield "name", request, "name"
    obj = request.get("object")
    if not isinstance(obj, dict) or not isinstance(meta := obj.get("metadata"), dict):
        return
    yield "object.name", meta, "name"
    yield "object.generateName", meta, "generateName"
    yield "object.uid", meta, "uid"
    yield "-", meta, "creationTimestamp"
    yield "-", meta, "resourceVersion"
    fields = meta.get("managedFields")
    for entry in fields if isinstance(fields, list) else ():
        if isinstance(entry, dict):
            yield "-", entry, "time"
    owners = meta.get("ownerReferences")
    for where, keys in (
        (meta.get("labels"), PER_POD_LABELS),
        (meta.get("annotations"), PER_POD_ANNOTATIONS),
        (obj.get("spec"), PER_POD_SPEC),
        *((owner, PER_POD_OWNER) for owner in (owners if isinstance(owners, list) else ())),
    ):
        if isinstance(where, dict):
            for key in where:
                if key in keys:
                    yield "-", where, key
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return
    for kind in ("initContainers", "containers"):
        containers = spec.get(kind)
        for container in containers if isinstance(containers, list) else ():
            for entry in per_pod_env(container.get("env") if isinstance(container, dict) else None):
                yield "-", entry, "value"


MAX_SLOTS = 64
"""More slots than this and the body is not worth a template: matching would loop longer than a parse."""


DIFFERENT = re.compile(rb"[^\x00]+")
"""A run of differing bytes, in the XOR of two bodies."""


def differing_strings(first: bytes, second: bytes) -> list[Slot] | None:
    """The contents of the JSON strings in which two bodies of one length differ, as (start, end) in order; None
    when a difference is not inside a plain string of both. One search per slot: the next difference is looked for
    past the string of the one before (a string that differs at every other byte was a turn of this loop per
    byte, 0.7 s of CPU for two 6 MiB bodies, outside the review's budget)."""
    if len(first) != len(second):
        return None
    diff = (int.from_bytes(first, "big") ^ int.from_bytes(second, "big")).to_bytes(len(first), "big")
    slots: list[Slot] = []
    at = 0
    while (run := DIFFERENT.search(diff, at)) is not None:
        start = first.rfind(b'"', 0, run.start()) + 1
        end = first.find(b'"', run.end())
        if start == 0 or end < 0 or diff[end]:  # diff[end]: the string's closing quote differs too
            return None
        if PLAIN.fullmatch(first, start, end) is None or PLAIN.fullmatch(second, start, end) is None:
            return None
        slots.append((start, end))
        if len(slots) > MAX_SLOTS:
            return None
        at = end
    return slots


def learn(first: bytes, second: bytes, known: tuple[Slot, ...] = ()) -> Template | None:
    """The template of two bodies of one shape, or None unless every string they differ in is an identity string.
    ``known``: slots learned before (from ``first``'s template), kept whether or not these two differ in them.

    ``second`` is parsed twice: as it is, and with a mark in each slot. Every mark must be found at an identity path
    (``identity_strings``), once; put back to its slot's text there, the marked object must equal the plain one,
    so no slot lies anywhere else."""
    found = differing_strings(first, second)
    if found is None:
        return None
    slots = sorted({*found, *known})
    if not slots or len(slots) > MAX_SLOTS:
        return None
    for (_, end), (start, _) in itertools.pairwise(slots):
        if start <= end:
            return None
    if any(PLAIN.fullmatch(second, start, end) is None for start, end in slots):
        return None
    pieces, at = [], 0
    for i, (start, end) in enumerate(slots):
        pieces += [second[at:start], b"\\u0000%d" % i]
        at = end
    pieces.append(second[at:])
    try:
        plain, marked = json.loads(second), json.loads(b"".join(pieces))
    except ValueError:
        return None
    marks = {f"{_MARK}{i}": i for i in range(len(slots))}
    labels: dict[int, str] = {}
    for label, where, key in identity_strings(marked):
        value = where.get(key)
        mark = marks.get(value) if isinstance(value, str) else None
        if mark is None:
            continue
        if mark in labels:
            return None
        labels[mark] = label
        start, end = slots[mark]
        where[key] = second[start:end].decode("utf-8", "replace")
    if len(labels) != len(slots) or marked != plain:
        return None
    return Template(second, tuple(slots), tuple(labels[i] for i in range(len(slots))))

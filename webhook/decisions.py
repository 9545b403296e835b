"""Answers per object shape: the replicas of one workload get the answer the first of them got.

A ReplicaSet, Job or StatefulSet creates pods that differ only in who they are (name, uid, creation time, managed
fields). The pipeline reads none of those, so for one cluster snapshot and one settings object its answer to each of
them is the same: ``answer`` computes it once and hands out the stored one to the next replica. What is stored is
the answer (patch, warnings, audit annotations, events to record); the Events and the decision log are still written
per request, with the request's own names.

The store hangs on the ``ClusterView`` it was computed against, so a new snapshot starts empty, and a request still
running against the old one cannot write into the new one's. UPDATEs (which read ``oldObject``) are not stored.
"""

from __future__ import annotations

import copy
import dataclasses
import marshal
from collections.abc import Callable
from typing import Any

from webhook.model import Context
from webhook.pipeline import Result

IDENTITY = frozenset(("name", "uid", "creationTimestamp", "resourceVersion", "generation", "managedFields", "selfLink"))
"""Metadata that tells replicas apart and that no policy reads."""

Step = Callable[[Any, Context], Result]


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
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k not in IDENTITY}}
    facts = (endpoint, ctx.namespace, ctx.operation, ctx.username, ctx.groups, ctx.dry_run, obj)
    try:
        return marshal.dumps(facts)
    except ValueError:  # nested deeper than marshal writes
        return None


def answer(endpoint: str, step: Step, obj: Any, ctx: Context) -> Result:
    """``step(obj, ctx)``, or the answer stored for an object of the same shape.

    A stored answer is shared (``reused``: read it, never change it) and carries no ``object`` (the mutated
    object was the first replica's): the routes answer from the patch; ``gpu-admission review``, which prints the
    object, runs the pipeline itself."""
    key = shape(endpoint, obj, ctx)
    if key is None:
        return step(obj, ctx)
    store = ctx.cluster.decisions
    stored = store.get(key)
    if stored is not None and stored[0] is ctx.settings:
        reused: Result = stored[1]
        return reused
    result = step(obj, ctx)
    kept = dataclasses.replace(
        result,
        object=None,
        reused=True,
        patch_json=result.patch_text() if result.patch else "",
        warnings=list(result.warnings),
        audit=dict(result.audit),
        patch=list(result.patch),
        outcome=copy.deepcopy(result.outcome),
    )
    store.put(key, (ctx.settings, kept))  # apart from ``result``: what its caller does to it stays its own
    return result

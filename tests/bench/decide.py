"""What one decision costs at each node count, in one process: the webhook's own work, apart from the server.

A request's cost at 10,000 nodes against 10 is measured end to end by the bench's scaling rows, but those compare
three server processes, on two cores shared with wrk, a few seconds apart: a row moved by up to 0.4 between runs
while the work done was the same (a replica's answer reads no node). Here one process holds the three cluster views
and answers the same bodies against each in turn, a batch at a time (about 50 ms), in one order and then in the
other, round after round: what the machine's speed does to one batch it does to its neighbours. Measured:
``decisions.decide`` (the parse, the policies, the answer's bytes; what the route runs for a body), CPU time of
this thread per request, for replicas (the same body again: replayed), for the pods of an Indexed Job (the next index
on every request: replayed too) and for new objects (a number of its own in an annotation: the policies run every
time, over the view of that node count).
"""

from __future__ import annotations

import base64
import gc
import itertools
import json
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import jsonpatch

from tests.bench import nodes as node_lists
from tests.bench import pods
from webhook import decisions, pipeline
from webhook.cli import load_nodes
from webhook.cluster import ClusterView
from webhook.config import Settings, load_settings

REPLICA_BATCH = 1000
NEW_BATCH = 150
KINDS = {"replica": "replicas", "indexed": "Indexed Job pods", "new": "new objects"}
"""What each request is: the same body again (a ReplicaSet's pods), the next index of an Indexed Job (its index in
labels, an annotation, the hostname and the generated name), an object never answered before."""


@dataclass
class NodeCost:
    """One pod, endpoint and kind of request: µs of CPU per request at each node count (medians of the rounds),
    and each count's ratio to the fewest nodes (the median of the rounds' ratios)."""

    pod: str
    endpoint: str
    kind: str
    """'replica', 'indexed' or 'new'."""
    us: dict[int, float] = field(default_factory=dict)
    ratio: dict[int, float] = field(default_factory=dict)

    @property
    def requests(self) -> str:
        return KINDS[self.kind]


def _body(pod: dict[str, object], endpoint: str, view: ClusterView, settings: Settings) -> str:
    """The AdmissionReview text for ``endpoint``: /validate gets the pod as /mutate (against ``view``) left it, named
    and given a uid as the apiserver stores it."""
    if endpoint == "validate":
        text = json.dumps(pods.admission_review(pod)).encode()
        _, _, answer = decisions.decide("mutate", pipeline.mutate, text, "application/json", settings, view)
        patch = json.loads(answer).get("response", {}).get("patch")
        if patch:
            pod = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(patch)))
        pod = pods.stored(pod)
    return json.dumps(pods.admission_review(pod))


_NUMBERS = itertools.count(1)


def _batch(text: str, size: int) -> list[bytes]:
    """``size`` requests, each with a number of its own where ``SEQ_TOKEN`` stands, as the load script writes
    them: in the uid (a replica), and in an annotation too (a new object, ``pods.SEQ_ANNOTATION``)."""
    width = len(pods.SEQ_TOKEN)
    return [text.replace(pods.SEQ_TOKEN, f"{next(_NUMBERS):0{width}d}").encode() for _ in range(size)]


def _timed(endpoint: str, bodies: Sequence[bytes], settings: Settings, view: ClusterView) -> float:
    step = pipeline.mutate if endpoint == "mutate" else pipeline.validate
    began = time.thread_time()
    for body in bodies:
        decisions.decide(endpoint, step, body, "application/json", settings, view)
    return (time.thread_time() - began) / len(bodies) * 1e6


def node_costs(
    counts: Sequence[int], pod_names: Sequence[str], endpoints: Sequence[str], rounds: int, config: Path
) -> list[NodeCost]:
    settings = load_settings(str(config))
    with tempfile.TemporaryDirectory(prefix="gpu-admission-decide-") as tmp:
        views = {n: load_nodes(str(node_lists.write_nodes(Path(tmp) / f"{n}.json", n)), settings) for n in counts}
    gc.collect()
    gc.freeze()  # as the server does once its view is loaded (webhook/cli.py): no collection walks the nodes
    try:
        return _measure(views, settings, pod_names, endpoints, rounds)
    finally:
        gc.unfreeze()


def _measure(
    views: dict[int, ClusterView], settings: Settings, pod_names: Sequence[str], endpoints: Sequence[str], rounds: int
) -> list[NodeCost]:
    counts = sorted(views)
    out: list[NodeCost] = []
    for name in pod_names:
        for endpoint in endpoints:
            for kind in KINDS:
                pod = pods.named(name if kind == "replica" else f"{name}+{kind}")
                texts = {n: _body(pod, endpoint, views[n], settings) for n in counts}
                size = NEW_BATCH if kind == "new" else REPLICA_BATCH
                per: dict[int, list[float]] = {n: [] for n in counts}
                for turn in range(rounds + 1):  # the first round warms up (stores, templates, caches)
                    order = counts if turn % 2 == 0 else counts[::-1]  # a drift goes both ways
                    for n in order:
                        us = _timed(endpoint, _batch(texts[n], size), settings, views[n])
                        if turn:
                            per[n].append(us)
                low = counts[0]
                cost = NodeCost(name, endpoint, kind)
                for n in counts:
                    cost.us[n] = statistics.median(per[n])
                    cost.ratio[n] = statistics.median(a / b for a, b in zip(per[n], per[low], strict=True))
                out.append(cost)
                print(
                    f"  in one process: {name:8} /{endpoint:8} {kind:7} "
                    + "  ".join(f"{n} nodes {cost.us[n]:6.1f} us ({cost.ratio[n]:.2f})" for n in counts),
                    flush=True,
                )
    return out

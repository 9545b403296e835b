"""What the cuda policy's steering may write into a pod's required node affinity: terms on GPU feature discovery's
CUDA and driver labels, on the GPU product, and on the pools' selectors. One place for the cuda policy, which writes
the steering and takes it out again (``cuda.forget``), and the spot policy, which judges a ``never`` pod's ungating
without it; the cuda policy imports the spot policy, so neither can hold it for the other."""

from __future__ import annotations

from collections.abc import Sequence

from webhook.affinity import Expression, required_terms
from webhook.cluster import CUDA_LABEL_PREFIXES, DRIVER_LABELS, GFD, PRODUCT_LABEL
from webhook.model import JSON, Context, PodView, as_list, as_str


def could_steer(alternatives: Sequence[Sequence[Expression]], ctx: Context) -> bool:
    """Whether the steering could have written these terms: on GFD's CUDA and driver labels and the pools' selectors
    only (words naming anything else are not the webhook's, and are not said again)."""
    keys = {f"{GFD}{p}.{part}" for p in CUDA_LABEL_PREFIXES for part in ("major", "minor")}
    keys |= {k for group in DRIVER_LABELS for k in group} | set(ctx.cluster.presets.pool_labels)
    keys |= {k for pool in ctx.settings.cluster.pools for k in pool.node_selector}
    keys.add(PRODUCT_LABEL)  # an unlabelled pool's (``cuda._steering_selector``)
    return all(as_str(e.get("key")) in keys for alt in alternatives for e in alt)


def steered(spec: JSON, ctx: Context) -> list[Expression]:
    """The expressions of a pod's required node affinity that the steering could have written (``In`` on the pools'
    selectors, ``In`` and ``Gt`` on GFD's CUDA and driver labels: its ranges, ``cuda._range``; ``could_steer``): a
    pod's annotation does not name them, and a user's own on those labels reads the same. For the spot policy too
    (``spot.kept_off_by_never``, and a never pod's ungating onto spot capacity its NotIn keeps it off: a range left
    in, begun past a spot box's CUDA once never kept spot off, kept the pod off it as if the user had written it, and
    a pod Pending for good was let through; found by a review)."""
    terms = required_terms(PodView("Pod", {}, spec, ""))
    found = [e for t in terms for e in as_list(t.get("matchExpressions")) if isinstance(e, dict)]
    return [e for e in found if e.get("operator") in ("In", "Gt") and could_steer([[e]], ctx)]

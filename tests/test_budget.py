"""The review's CPU budget: past it, a pod is refused as too complex to review, not answered after the apiserver
gave up (found by a review that measured the costliest pods the limits let through: seconds to minutes each)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.hardening_fixtures import cluster_nodes, hardening_settings
from webhook import budget, pipeline
from webhook.cluster import build_view
from webhook.model import Context


def test_check_raises_only_inside_a_review_past_its_budget() -> None:
    for _ in range(budget.EVERY * 2):
        budget.check()  # outside a review: nothing

    def spin() -> int:
        began = time.thread_time()
        while time.thread_time() - began < 1.0:
            budget.check()
        return 0

    with pytest.raises(budget.TooComplex):
        budget.within(spin, seconds=0.01)
    assert budget.within(lambda: 7, seconds=0.01) == 7
    for _ in range(budget.EVERY * 2):
        budget.check()  # the budget ended with the review


def test_a_nested_review_keeps_the_outer_budget() -> None:
    def inner() -> None:
        began = time.thread_time()
        while time.thread_time() - began < 1.0:
            budget.check()

    with pytest.raises(budget.TooComplex):
        budget.within(lambda: budget.within(inner, seconds=60.0), seconds=0.01)


def costly_pod() -> dict[str, Any]:
    """56 MIG asks whose own order fails, 194 sidecars and 512 required terms of 8 expressions: seconds of CPU
    before the budget (17 s at 1,000 nodes), each of its parts within the webhook's limits."""
    asks = [
        {
            "name": f"a{i}",
            "image": "nvidia/cuda:12.2.2-runtime-ubuntu22.04",
            "resources": {"limits": {"nvidia.com/gpu": "0.125"}, "requests": {"nvidia.com/gpu": "0.125"}},
        }
        for i in range(56)
    ]
    sidecars = [
        {"name": f"s{i}", "image": "busybox:1.36", "resources": {"limits": {"cpu": "100m"}}} for i in range(194)
    ]
    terms = [
        {
            "matchExpressions": [
                {"key": f"example.com/k{j}", "operator": "NotIn", "values": [f"v{t}-{j}"]} for j in range(8)
            ]
        }
        for t in range(512)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "costly", "namespace": "ml"},
        "spec": {
            "containers": asks + sidecars,
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
            },
        },
    }


def costly_to_validate() -> dict[str, Any]:
    """250 GPU containers (NVIDIA_VISIBLE_DEVICES), each with an NVIDIA_REQUIRE_CUDA of 4,096 characters whose
    terms all fail on every pool: 25 s of /validate before the budget."""
    containers = []
    for i in range(250):
        terms, k = ["cuda>=99.0"], 0
        while len(" ".join(terms)) < 4080:
            terms.insert(0, f"driver>=999.{i}.{k}")
            k += 1
        env = [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_REQUIRE_CUDA", "value": " ".join(terms)},
        ]
        containers.append({"name": f"c{i}", "image": "nvidia/cuda:12.2.2-runtime-ubuntu22.04", "env": env})
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "costly", "namespace": "ml"},
        "spec": {"containers": containers},
    }


@pytest.mark.parametrize("step", [pipeline.mutate, pipeline.validate])
def test_a_pod_past_the_budget_is_refused_with_what_makes_it_costly(step: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(budget, "REVIEW_CPU_SECONDS", 0.05)
    settings = hardening_settings()
    ctx = Context(settings=settings, cluster=build_view(cluster_nodes(), settings), namespace="ml")
    pod = costly_pod() if step is pipeline.mutate else costly_to_validate()
    began = time.thread_time()
    result = step(pod, ctx)
    spent = time.thread_time() - began
    assert not result.allowed and result.reason == "TooComplex" and result.code == 422
    assert result.message.startswith("gpu-admission gave up reviewing this Pod after 0.05 s of CPU")
    assert "250 containers" in result.message
    assert result.audit["decision"] == "denied (TooComplex)"
    assert spent < 2.0, f"the review went on for {spent:.2f} s past its budget"


def test_a_real_pod_is_reviewed_well_within_the_budget() -> None:
    settings = hardening_settings()
    ctx = Context(settings=settings, cluster=build_view(cluster_nodes(), settings), namespace="ml")
    pod = costly_pod()
    pod["spec"]["containers"] = pod["spec"]["containers"][:2] + pod["spec"]["containers"][56:58]
    del pod["spec"]["affinity"]
    assert pipeline.review(pod, ctx).reason != "TooComplex"


def test_a_refusal_for_the_budget_is_not_kept_for_the_replicas() -> None:
    """Found by a review of this session's commits: the clock's verdict was stored as the shape's answer, and every
    replica got it for as long as the snapshot lived."""
    from webhook import decisions

    settings = hardening_settings()
    ctx = Context(settings=settings, cluster=build_view(cluster_nodes(), settings), namespace="ml")
    calls: list[int] = []

    def step(obj: Any, ctx: Context) -> pipeline.Result:
        calls.append(1)
        if len(calls) == 1:
            return pipeline.Result(allowed=False, code=422, reason="TooComplex", message="gave up", object=obj)
        return pipeline.mutate(obj, ctx)

    pod = costly_pod()
    pod["spec"]["containers"] = pod["spec"]["containers"][:1]
    del pod["spec"]["affinity"]
    assert decisions.answer("mutate", step, pod, ctx).reason == "TooComplex"
    again = decisions.answer("mutate", step, pod, ctx)
    assert again.reason != "TooComplex" and not again.reused and len(calls) == 2
    assert decisions.answer("mutate", step, pod, ctx).reused, "an answer of the shape is kept"

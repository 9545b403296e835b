"""Reused answers: the replicas of one workload get the first one's answer, and nothing else does."""

from __future__ import annotations

import copy
import dataclasses
import gc
import hashlib
import io
import json
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import gpu_node, gpu_pod, review
from tests.hardening_fixtures import cluster_view
from tests.test_events import Recording, app_with, stored_pod
from tests.test_fuzz import FUZZ, SETTINGS, VIEW, objects
from webhook import decisions, pipeline
from webhook.app import create_app
from webhook.audit import build_recorder
from webhook.cluster import DECISIONS_SIZE, Memo, StaticCluster, build_view
from webhook.config import CudaSettings, Settings
from webhook.events import EventQueue
from webhook.model import Context, Outcome

OLD_GPU = {"nvidia.com/cuda.driver-version.full": "535.104.05", "nvidia.com/cuda.runtime-version.minor": "2"}


def two_driver_view(settings: Settings) -> Any:
    """One pool on CUDA 12.4 and one on 12.2: a CUDA 12.3 pod is steered, so its answer has a patch to reuse."""
    nodes = [
        gpu_node("new-a", labels={"cloud.google.com/gke-nodepool": "new"}),
        gpu_node("old-a", labels={"cloud.google.com/gke-nodepool": "old", **OLD_GPU}),
    ]
    return build_view(nodes, settings)


def replica(pod: dict[str, Any], n: int) -> dict[str, Any]:
    """The pod as a ReplicaSet's n-th replica reaches the webhook: same template, its own identity."""
    out = copy.deepcopy(pod)
    meta = out.setdefault("metadata", {})
    meta.update(
        name=f"trainer-7d9f-{n:05d}",
        uid=f"00000000-0000-4000-8000-{n:012d}",
        creationTimestamp=f"2026-12-01T08:{n % 60:02d}:00Z",
        resourceVersion=str(1000 + n),
        generation=n,
        managedFields=[{"manager": "kube-controller-manager", "time": f"2026-12-01T08:{n % 60:02d}:00Z"}],
    )
    return out


def controlled(pod: dict[str, Any], n: int, kind: str) -> dict[str, Any]:
    """The pod as the n-th pod of a ReplicaSet (``replica``), or as an Indexed Job's or a StatefulSet's controller
    writes it (its index in labels, an annotation, its hostname and its generated name), as the pod of a JobSet's
    n-th child Job, or as a LeaderWorkerSet's n-th worker, its index and its leader's address in every container's
    env too (kubernetes.io/docs/reference/labels-annotations-taints/, sigs.k8s.io/jobset, sigs.k8s.io/lws)."""
    out = replica(pod, n)
    if kind == "ReplicaSet":
        return out
    meta, spec = out["metadata"], out.get("spec")
    labels, annotations = meta.setdefault("labels", {}), meta.setdefault("annotations", {})
    if not (isinstance(labels, dict) and isinstance(annotations, dict) and isinstance(spec, dict)):
        return out
    if kind == "Job":
        meta["generateName"] = f"train-{n}-"
        labels["batch.kubernetes.io/job-completion-index"] = str(n)
        annotations["batch.kubernetes.io/job-completion-index"] = str(n)
        annotations["batch.kubernetes.io/job-index-failure-count"] = str(n % 3)
        spec["hostname"] = f"train-{n}"
    elif kind == "StatefulSet":
        meta["name"] = f"web-{n}"
        labels["statefulset.kubernetes.io/pod-name"] = f"web-{n}"
        labels["apps.kubernetes.io/pod-index"] = str(n)
        spec["hostname"] = f"web-{n}"
    elif kind == "JobSet":  # the one pod of the JobSet's n-th child Job: another Job's name, uid and indexes
        job, uid = f"trainer-workers-{n}", f"7f3e9a1c-0000-4000-8000-{n:012d}"
        key = hashlib.sha256(f"default/{job}".encode()).hexdigest()
        meta["generateName"] = f"{job}-0-"
        meta["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid, "controller": True}
        ]
        indexes = {f"jobset.sigs.k8s.io/{k}": str(n) for k in ("job-index", "job-global-index", "job-group-index")}
        per_job = {**indexes, "jobset.sigs.k8s.io/job-key": key, "batch.kubernetes.io/job-completion-index": "0"}
        labels.update(per_job)
        for name in ("batch.kubernetes.io/job-name", "job-name"):
            labels[name] = job
        for name in ("batch.kubernetes.io/controller-uid", "controller-uid"):
            labels[name] = uid
        labels.update({"jobset.sigs.k8s.io/jobset-name": "trainer", "jobset.sigs.k8s.io/replicatedjob-name": "workers"})
        annotations.update(per_job)
        spec.update(hostname=f"{job}-0", subdomain="trainer")
    elif kind == "LeaderWorkerSet":  # worker n of group n % 2, a StatefulSet of its own; a subdomain per group
        group = n % 2
        leader = f"vllm-{group}"
        meta["name"] = spec["hostname"] = labels["statefulset.kubernetes.io/pod-name"] = f"{leader}-{n}"
        labels["apps.kubernetes.io/pod-index"] = str(n)
        labels["controller-revision-hash"] = f"{leader}-5d8f9c7b6d"
        lws = {"name": "vllm", "template-revision-hash": "6b7c9d8f4", "group-index": str(group), "worker-index": str(n)}
        lws["group-key"] = hashlib.sha1(f"default/{leader}".encode()).hexdigest()
        labels.update({f"leaderworkerset.sigs.k8s.io/{k}": v for k, v in lws.items()})
        annotations.update({"leaderworkerset.sigs.k8s.io/size": "4", "leaderworkerset.sigs.k8s.io/leader-name": leader})
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": leader, "uid": f"3c9e-{group}", "controller": True}
        ]
        spec["subdomain"] = leader
        env = {"LWS_LEADER_ADDRESS": f"{leader}.{leader}.default", "LWS_GROUP_SIZE": "4", "LWS_WORKER_INDEX": str(n)}
        for key in ("initContainers", "containers"):
            containers = spec.get(key)
            for container in containers if isinstance(containers, list) else ():
                if isinstance(container, dict):  # LWS puts its variables first (AddLWSVariables)
                    own = container.get("env")
                    lws_env = [{"name": k, "value": v} for k, v in env.items()]
                    container["env"] = lws_env + (own if isinstance(own, list) else [])
    elif kind in ("PyTorchJob", "TFJob"):  # worker n of a Kubeflow Training Operator v1 job, with a master or chief
        job = "bert"
        meta["name"] = f"{job}-worker-{n}"
        labels.update(
            {
                "training.kubeflow.org/job-name": job,
                "training.kubeflow.org/operator-name": f"{kind.lower()}-controller",
                "training.kubeflow.org/replica-type": "worker",
                "training.kubeflow.org/replica-index": str(n),
            }
        )
        meta["ownerReferences"] = [
            {"apiVersion": "kubeflow.org/v1", "kind": kind, "name": job, "uid": "5e1d-0a", "controller": True}
        ]
        if kind == "PyTorchJob":
            env = {"PYTHONUNBUFFERED": "0", "MASTER_PORT": "23456", "MASTER_ADDR": f"{job}-master-0"}
            env.update(WORLD_SIZE="17", RANK=str(n + 1))
        else:
            cluster = {"chief": [f"{job}-chief-0.default.svc:2222"]}
            cluster["worker"] = [f"{job}-worker-{i}.default.svc:2222" for i in range(16)]
            task = {"type": "worker", "index": n}
            env = {"TF_CONFIG": json.dumps({"cluster": cluster, "task": task, "environment": "cloud"})}
        for container in spec.get("containers") or ():
            if isinstance(container, dict):  # appended after the user's own (setPodEnv)
                own = container.get("env")
                container["env"] = (own if isinstance(own, list) else []) + [
                    {"name": k, "value": v} for k, v in env.items()
                ]
    elif (
        kind == "SparkExecutor"
    ):  # executor n of one Spark application, made by its driver pod (BasicExecutorFeatureStep)
        meta.pop("generateName", None)
        meta["name"] = spec["hostname"] = f"etl-3f2a9c1e8b7d6a54-exec-{n}"
        labels.update(
            {
                "spark-app-selector": "spark-0b7e5a9c2d1f4e3a",
                "spark-app-name": "etl",
                "spark-role": "executor",
                "spark-exec-id": str(n),
                "spark-exec-resourceprofile-id": "0",
            }
        )
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": "etl-driver", "uid": "9a8b-7c6d", "controller": True}
        ]
        spec["restartPolicy"] = "Never"
        spark_env: list[dict[str, Any]] = [
            {"name": "SPARK_USER", "value": "spark"},
            {"name": "SPARK_DRIVER_URL", "value": "spark://CoarseGrainedScheduler@etl-driver-svc.default.svc:7078"},
            {"name": "SPARK_EXECUTOR_CORES", "value": "4"},
            {"name": "SPARK_APPLICATION_ID", "value": "spark-0b7e5a9c2d1f4e3a"},
            {"name": "SPARK_EXECUTOR_ID", "value": str(n)},
            {"name": "SPARK_RESOURCE_PROFILE_ID", "value": "0"},
            {
                "name": "SPARK_EXECUTOR_POD_IP",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "status.podIP"}},
            },
            {
                "name": "SPARK_EXECUTOR_POD_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            },
        ]
        for container in spec.get("containers") or ():
            if isinstance(container, dict):  # the template's env first, then Spark's (addAllToEnv)
                own = container.get("env")
                container["env"] = (own if isinstance(own, list) else []) + copy.deepcopy(spark_env)
    return out


def ctx(settings: Settings, view: Any, **kw: Any) -> Context:
    return Context(settings=settings, cluster=view, namespace="default", username="alice", **kw)


def same_answer(a: pipeline.Result, b: pipeline.Result) -> None:
    assert (a.allowed, a.code, a.reason, a.message, a.skipped) == (b.allowed, b.code, b.reason, b.message, b.skipped)
    assert (a.ops, a.patch_bytes()) == (b.ops, b.patch_bytes())  # a stored answer keeps its patch as text
    assert a.warnings == b.warnings
    assert a.audit == b.audit
    assert a.outcome.events == b.outcome.events
    assert a.outcome.reasons == b.outcome.reasons
    assert a.decision == b.decision


STEERED_IMAGE = "nvidia/cuda:12.3.2-base-ubuntu22.04"
STEERED = gpu_pod(image=STEERED_IMAGE)


@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_the_second_replica_gets_the_first_ones_answer(endpoint: str) -> None:
    settings = Settings()
    view = two_driver_view(settings)
    step = pipeline.mutate if endpoint == "mutate" else pipeline.validate
    first = decisions.answer(endpoint, step, replica(STEERED, 1), ctx(settings, view))
    second = decisions.answer(endpoint, step, replica(STEERED, 2), ctx(settings, view))
    assert not first.reused and second.reused
    assert second.object is None
    same_answer(second, step(replica(STEERED, 2), ctx(settings, view)))
    if endpoint == "mutate":
        assert second.ops and "CUDASteered" in second.outcome.reasons
        assert json.loads(second.patch_bytes()) == first.patch


@pytest.mark.parametrize(
    "kind", ["Job", "StatefulSet", "JobSet", "LeaderWorkerSet", "PyTorchJob", "TFJob", "SparkExecutor"]
)
@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_the_pods_of_an_indexed_job_a_statefulset_or_a_jobset_are_replicas_too(endpoint: str, kind: str) -> None:
    """Their index (labels, an annotation, the hostname, the generated name) and a JobSet's child Job's name, uid
    and indexes are read by no policy: the second pod gets the first one's answer, and it is the answer the pipeline
    gives that pod afresh."""
    settings = Settings()
    view = two_driver_view(settings)
    step = pipeline.mutate if endpoint == "mutate" else pipeline.validate
    pods = [controlled(STEERED, n, kind) for n in (1, 2, 13)]
    assert pods[0]["spec"].get("hostname", 0) != pods[1]["spec"].get("hostname") and pods[0] != pods[1]
    answers = [decisions.answer(endpoint, step, pod, ctx(settings, view)) for pod in pods]
    assert [a.reused for a in answers] == [False, True, True] and len(view.decisions) == 1
    for pod, got in zip(pods, answers, strict=True):
        same_answer(got, step(copy.deepcopy(pod), ctx(settings, view)))
    if endpoint == "mutate":
        assert "CUDASteered" in answers[2].outcome.reasons
    other = controlled(STEERED, 3, kind)
    other["metadata"]["labels"]["app.kubernetes.io/instance"] = "another"  # no controller's: another workload
    assert not decisions.answer(endpoint, step, other, ctx(settings, view)).reused
    declared = controlled(STEERED, 4, kind)  # an env value the CUDA policy reads: another shape, its own answer
    declared["spec"]["containers"][0].setdefault("env", []).append({"name": "CUDA_VERSION", "value": "12.2.0"})
    got = decisions.answer(endpoint, step, declared, ctx(settings, view))
    assert not got.reused
    same_answer(got, step(copy.deepcopy(declared), ctx(settings, view)))


def test_what_the_first_replicas_caller_does_to_its_answer_stays_its_own() -> None:
    settings = Settings()
    view = two_driver_view(settings)
    first = decisions.answer("mutate", pipeline.mutate, replica(STEERED, 1), ctx(settings, view))
    assert first.patch and first.outcome.mutations
    changed: Any = first.outcome
    for name in ("warnings", "denials", "events", "mutations", "reasons"):
        getattr(changed, name).append("changed by the caller")
    changed.annotations["cuda"] = changed.audit["cuda"] = "changed by the caller"
    first.warnings.append("changed by the caller")
    first.audit["cuda"] = "changed by the caller"
    first.patch.append({"op": "remove", "path": "/spec"})
    second = decisions.answer("mutate", pipeline.mutate, replica(STEERED, 2), ctx(settings, view))
    fresh = pipeline.mutate(replica(STEERED, 2), ctx(settings, view))
    assert second.reused
    same_answer(second, fresh)
    assert second.patch_bytes() == fresh.patch_bytes()
    assert second.outcome.copy() == fresh.outcome


def test_an_outcomes_copy_holds_all_of_it_and_shares_no_container() -> None:
    outcome = Outcome()
    outcome.annotate("cuda", "12.3 from the image tag")
    outcome.warn("a warning")
    outcome.deny("cuda", "CUDAIncompatible", "no node runs CUDA 13.0")
    outcome.event("CUDASteered", "steered to the new pool")
    outcome.audit["cuda"] = "12.3"
    outcome.mutated("cuda-affinity")
    outcome.refuse_pods("main: gpu-admission.io/gpu-memory 900Gi: its pods are refused")
    outcome.tell_pods("main: gpu-admission.io/gpu-memory 60Gi: its pods get nvidia.com/gpu 1")
    outcome.finish.append(lambda: None)
    copied = outcome.copy()
    assert copied == outcome and copied._warned == outcome._warned
    for f in dataclasses.fields(Outcome):  # a field added to Outcome and not to copy() fails here
        value = getattr(outcome, f.name)
        assert value, f"fill {f.name} above"
        assert getattr(copied, f.name) == value and getattr(copied, f.name) is not value, f.name


def _changed(pod: dict[str, Any], where: str) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    if where == "image":
        out["spec"]["containers"][0]["image"] = "nvidia/cuda:12.4.1-base-ubuntu22.04"
    elif where == "annotation":
        out["metadata"]["annotations"] = {"gpu-admission.io/spot": "tolerate"}
    elif where == "label":
        out["metadata"]["labels"] = {"app": "other"}
    elif where == "nodeSelector":
        out["spec"]["nodeSelector"] = {"cloud.google.com/gke-nodepool": "new"}
    return out


@pytest.mark.parametrize("where", ["image", "annotation", "label", "nodeSelector"])
def test_any_other_difference_in_the_object_is_a_new_shape(where: str) -> None:
    settings = Settings()
    view = two_driver_view(settings)
    decisions.answer("mutate", pipeline.mutate, replica(STEERED, 1), ctx(settings, view))
    other = decisions.answer("mutate", pipeline.mutate, replica(_changed(STEERED, where), 2), ctx(settings, view))
    assert not other.reused
    same_answer(other, pipeline.mutate(replica(_changed(STEERED, where), 2), ctx(settings, view)))


@pytest.mark.parametrize(
    "request_facts",
    [
        {"namespace": "ml"},
        {"username": "bob"},
        {"groups": ("platform",)},
        {"dry_run": True},
        {"operation": "UPDATE"},
    ],
)
def test_a_difference_in_the_request_is_a_new_shape(request_facts: dict[str, Any]) -> None:
    settings = Settings()
    view = two_driver_view(settings)
    decisions.answer("mutate", pipeline.mutate, replica(STEERED, 1), ctx(settings, view))
    base = {"namespace": "default", "username": "alice"} | request_facts
    other_ctx = Context(settings=settings, cluster=view, **base)
    assert not decisions.answer("mutate", pipeline.mutate, replica(STEERED, 2), other_ctx).reused
    assert decisions.answer("mutate", pipeline.mutate, replica(STEERED, 3), other_ctx).reused


def test_answers_are_kept_per_endpoint() -> None:
    settings = Settings()
    view = two_driver_view(settings)
    decisions.answer("mutate", pipeline.mutate, replica(STEERED, 1), ctx(settings, view))
    assert not decisions.answer("validate", pipeline.validate, replica(STEERED, 2), ctx(settings, view)).reused


def test_a_new_snapshot_or_other_settings_start_afresh() -> None:
    settings = Settings()
    view = two_driver_view(settings)
    decisions.answer("mutate", pipeline.mutate, replica(STEERED, 1), ctx(settings, view))
    # The old pool's nodes are gone: the pod is no longer steered, and must not get the stored steering.
    newer = build_view([gpu_node("new-a", labels={"cloud.google.com/gke-nodepool": "new"})], settings)
    fresh = decisions.answer("mutate", pipeline.mutate, replica(STEERED, 2), ctx(settings, newer))
    assert not fresh.reused and "CUDASteered" not in fresh.outcome.reasons
    warn = Settings(cuda=CudaSettings(mode="warn"))
    warned = decisions.answer("mutate", pipeline.mutate, replica(STEERED, 3), ctx(warn, view))
    assert not warned.reused and "CUDASteered" not in warned.outcome.reasons


def test_updates_are_never_stored() -> None:
    settings = Settings()
    view = two_driver_view(settings)
    old = replica(STEERED, 1)
    for n in (2, 3):
        got = decisions.answer("mutate", pipeline.mutate, replica(STEERED, n), ctx(settings, view, old_object=old))
        assert not got.reused
    assert len(view.decisions) == 0


def test_the_store_is_bounded_by_entries() -> None:
    settings = Settings()
    view = two_driver_view(settings)
    for n in range(DECISIONS_SIZE + 5):
        pod = gpu_pod(image=f"nvidia/cuda:12.{n % 9}.0-base", annotations={"n": str(n)})
        decisions.answer("mutate", pipeline.mutate, pod, ctx(settings, view))
        assert len(view.decisions) <= DECISIONS_SIZE
    assert len(view.decisions) == 5


def test_the_store_is_bounded_by_bytes() -> None:
    memo = Memo(entries=100, key_bytes=1000)
    for n in range(6):
        memo.put(bytes([n]) * 250, n)
    assert len(memo) == 2  # 4 x 250 bytes fit; the fifth emptied the store, the sixth joined it
    assert memo.get(bytes([5]) * 250) == 5 and memo.get(bytes([0]) * 250) is None
    # one entry past a quarter of the bound is not kept: a pod of megabytes emptied the store for every other one
    memo.put(b"big", "big", size=251)
    assert len(memo) == 2 and memo.get(b"big") is None
    # put again past it, a key is no longer held: a stored answer whose body grew in place (a replica of another
    # length) stayed in the store, uncounted (20 pods: 100 MiB held, 38 kB counted)
    memo.put(bytes([5]) * 250, 5, size=251)
    assert len(memo) == 1 and memo.get(bytes([5]) * 250) is None and memo._bytes == 250


def test_the_store_counts_the_answers_it_holds() -> None:
    """Its byte bound counted each answer's key and body, not the answer: 300 steered pods of 15 kB held 229 MiB
    counted as 7.5 MiB (the patch kept three times: as objects sharing the working copy's, as JSON, and in base64
    in the answer's parts). It keeps the patch as its text only, and counts that and the answer's parts."""
    settings = Settings()
    view = two_driver_view(settings)

    def steered(n: int) -> bytes:  # every term narrowed: a patch of 84 kB
        pod = gpu_pod(image=STEERED_IMAGE)
        terms = [{"matchExpressions": [{"key": f"k{t}", "operator": "NotIn", "values": [f"v{n}"]}]} for t in range(200)]
        pod["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
        return json.dumps(review(pod)).encode()

    tracemalloc.start()
    try:
        for n in range(30):
            decisions.decide("mutate", pipeline.mutate, steered(n), "application/json", settings, view)
        gc.collect()
        with_store, counted = tracemalloc.get_traced_memory()[0], view.decisions._bytes
        assert len(view.decisions) == 30 and not view.replays._data
        view.decisions._data.clear()
        gc.collect()
        held = with_store - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 1.5 * counted  # was 30 times


def test_a_key_put_again_takes_its_own_place_in_the_store() -> None:
    """Put again (a template widened, another workload of one length), a key counts once, by its last size, and
    never empties a full store."""
    memo = Memo(entries=3, key_bytes=1000)
    for n in range(3):
        memo.put(bytes([n]) * 10, n, size=250)
    for _ in range(10):
        memo.put(bytes([0]) * 10, "again", size=250)  # the store is full by entries: it stays
    assert len(memo) == 3 and memo.get(bytes([1]) * 10) == 1 and memo.get(bytes([0]) * 10) == "again"
    memo.put(bytes([0]) * 10, "smaller", size=100)
    memo.put(b"new", "fits", size=0)  # 100 + 250 + 250 + 0 bytes, but a fourth entry: emptied
    assert len(memo) == 1
    memo = Memo(entries=2)  # by entries only
    memo.put("a", 1)
    memo.put("b", 2)
    memo.put("a", 3)
    assert (len(memo), memo.get("a"), memo.get("b")) == (2, 3, 2)


def test_a_value_kept_per_settings_is_made_once_for_each_settings_and_counted_by_its_size() -> None:
    """``Memo.per_settings``: the policies' answers that depend on the snapshot and the settings alone are made once
    per settings object (a reload makes them again), and counted as their ``size`` says (one too big is not kept)."""
    memo = Memo(entries=10, key_bytes=1000)
    made: list[str] = []

    def make(name: str) -> Callable[[], str]:
        def one() -> str:
            made.append(name)
            return name

        return one

    first, reloaded = Settings(), Settings()
    assert memo.per_settings("k", first, make("one"), len) == "one"
    assert memo.per_settings("k", first, make("two"), len) == "one"  # kept
    assert memo.per_settings("k", reloaded, make("three"), len) == "three"  # other settings: made again
    assert made == ["one", "three"]
    assert memo.per_settings("big", first, make("x" * 300), len) == "x" * 300  # past a quarter: not kept
    assert memo.get("big") is None and memo.get("k") is not None


def test_an_object_too_deep_for_marshal_is_answered_unstored() -> None:
    settings = Settings()
    view = two_driver_view(settings)
    deep: Any = "x"
    for _ in range(3000):
        deep = [deep]
    pod = replica(STEERED, 1)
    pod["status"] = {"deep": deep}  # deeper than the HTTP edge lets through; the pipeline does not copy status
    assert decisions.shape("mutate", pod, ctx(settings, view)) is None
    assert not decisions.answer("mutate", pipeline.mutate, pod, ctx(settings, view)).reused


@FUZZ
@given(
    obj=objects,
    n=st.integers(min_value=1, max_value=99),
    kind=st.sampled_from(["ReplicaSet", "Job", "StatefulSet", "JobSet", "LeaderWorkerSet", "PyTorchJob", "TFJob"]),
)
def test_identity_fields_never_change_an_answer(obj: Any, n: int, kind: str) -> None:
    """For any object the fuzzer makes: a replica's reused answer is the answer the pipeline gives it afresh."""
    if not isinstance(obj, dict) or not isinstance(obj.get("metadata", {}), dict):
        return
    view = VIEW
    for endpoint, step in (("mutate", pipeline.mutate), ("validate", pipeline.validate)):
        decisions.answer(endpoint, step, controlled(obj, n, kind), ctx(SETTINGS, view))
        got = decisions.answer(endpoint, step, controlled(obj, n + 1, kind), ctx(SETTINGS, view))
        same_answer(got, step(controlled(obj, n + 1, kind), ctx(SETTINGS, view)))


# -- what the policies plan once per snapshot ---------------------------------------------------------------------
@FUZZ
@given(obj=objects, before=st.lists(objects, max_size=3))
def test_a_snapshot_that_planned_before_answers_as_a_fresh_one(obj: Any, before: list[Any]) -> None:
    """Steering plans and eligibility answers kept from earlier pods never change a later pod's answer: the same
    pod gets the same patch, annotations and words from a snapshot that answered others first as from a new one."""
    warm = cluster_view(SETTINGS)
    for other in [*before, obj]:
        pipeline.mutate(copy.deepcopy(other), ctx(SETTINGS, warm))
    for step in (pipeline.mutate, pipeline.validate):
        got = step(copy.deepcopy(obj), ctx(SETTINGS, warm))
        fresh = step(copy.deepcopy(obj), ctx(SETTINGS, cluster_view(SETTINGS)))
        same_answer(got, fresh)
        assert got.object == fresh.object


def test_pods_of_one_cuda_and_placement_share_a_steering_and_others_do_not() -> None:
    settings = Settings()
    view = two_driver_view(settings)
    first = pipeline.mutate(gpu_pod(), ctx(settings, view))
    assert "CUDASteered" not in first.outcome.reasons  # CUDA 12.2 runs on both pools: nothing to steer

    def named(name: str, **labels: str) -> dict[str, Any]:
        pod = gpu_pod(image=STEERED_IMAGE)  # container "trainer" in each
        pod["metadata"].update(name=name, labels=labels)
        return pod

    steered = [pipeline.mutate(named(n, app=n), ctx(settings, view)) for n in ("b", "c")]
    assert len(view.policy_memo) == 2  # one plan for "a", one shared by "b" and "c"
    assert all("CUDASteered" in r.outcome.reasons for r in steered)
    assert steered[0].patch == steered[1].patch
    assert steered[0].audit == steered[1].audit
    pinned = named("d")
    pinned["spec"]["nodeSelector"] = {"cloud.google.com/gke-nodepool": "new"}
    alone = pipeline.mutate(pinned, ctx(settings, view))
    assert len(view.policy_memo) == 3 and "CUDASteered" not in alone.outcome.reasons


def test_a_sidecar_that_adds_to_the_gpu_request_is_a_new_placement() -> None:
    """An init container's restartPolicy decides whether its GPUs add to the pod's (a sidecar) or not: pods that
    differ only there can land on different nodes, and must not share a plan."""
    settings = Settings()
    view = two_driver_view(settings)

    def with_init(sidecar: bool) -> dict[str, Any]:
        pod = gpu_pod(image=STEERED_IMAGE)  # 1 GPU in the app container; the nodes have 8
        init = {"name": "warm", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
        if sidecar:
            init["restartPolicy"] = "Always"
        pod["spec"]["initContainers"] = [init]
        return pod

    plain = pipeline.mutate(with_init(False), ctx(settings, view))
    sidecar = pipeline.mutate(with_init(True), ctx(settings, view))  # 9 GPUs: no node has them
    assert "CUDASteered" in plain.outcome.reasons
    assert "CUDASteered" not in sidecar.outcome.reasons
    fresh = pipeline.mutate(with_init(True), ctx(settings, two_driver_view(settings)))
    same_answer(sidecar, fresh)


def test_what_a_snapshot_plans_is_bounded_by_bytes() -> None:
    """Eligibility answers and steering plans are kept by all they depend on: a pod's whole affinity, and the
    images its checks name. Distinct pods with MBs of them (dryRun ones too) grew a worker without bound (30 pods of
    3 MB: 72 -> 718 MiB, over the chart's 384Mi); each memo now keeps at most 4 MiB of keys."""
    settings = Settings()
    view = two_driver_view(settings)

    def costly(n: int) -> dict[str, Any]:
        pod = gpu_pod(image=STEERED_IMAGE)
        zones = [f"zone-{n:02d}-{i:06d}-" + "x" * 44 for i in range(8_000)]  # 0.5 MB, within the values' bound
        term = {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": zones}]}
        pod["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        }
        return pod

    tracemalloc.start()
    try:
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for n in range(12):
            assert "CUDASteered" in pipeline.mutate(costly(n), ctx(settings, view)).outcome.reasons
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 12 << 20  # was 35 MiB: about 3 MB a pod

    kept = len(view.policy_memo)
    image = "registry.example/team/" + "a" * (5 << 20) + ":12.3"  # a check holds its image
    pipeline.mutate(gpu_pod(image=image), ctx(settings, view))
    assert len(view.policy_memo) == kept  # 5 MiB: not kept, and what was kept stays


# -- through the app ----------------------------------------------------------------------------------------------
def test_replicas_through_the_app_log_and_count_each_request() -> None:
    settings = Settings()
    cluster = StaticCluster(two_driver_view(settings))
    log = io.StringIO()
    app = create_app(settings, cluster=cluster, recorder=build_recorder(settings, cluster, stream=log))
    client = app.test_client()
    answers = [
        client.post("/mutate", json=review(replica(STEERED, n), uid=f"uid-{n}")).get_json()["response"] for n in (1, 2)
    ]
    assert [a["uid"] for a in answers] == ["uid-1", "uid-2"]
    assert answers[0]["patch"] == answers[1]["patch"]
    assert answers[0]["auditAnnotations"] == answers[1]["auditAnnotations"]
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [line.get("reused", False) for line in lines] == [False, True]
    assert [line["name"] for line in lines] == ["trainer-7d9f-00001", "trainer-7d9f-00002"]
    assert lines[0]["patchBytes"] == lines[1]["patchBytes"] > 0
    text = app.extensions["gpu_admission"].recorder.metrics.text()
    assert 'gpu_admission_reused_answers_total{endpoint="mutate"} 1.0' in text


def test_each_replica_still_gets_its_own_event() -> None:
    sink = Recording()
    app, recorder = app_with(sink)
    client = app.test_client()
    for n in (1, 2, 3):
        pod = replica(stored_pod(), n)
        assert client.post("/validate", json=review(pod)).get_json()["response"]["allowed"]
    assert isinstance(recorder.events, EventQueue) and recorder.events.drain()
    names = [body["involvedObject"]["name"] for body in sink.bodies]
    uids = {body["involvedObject"]["uid"] for body in sink.bodies}
    assert sorted(set(names)) == ["trainer-7d9f-00001", "trainer-7d9f-00002", "trainer-7d9f-00003"]
    assert len(uids) == 3

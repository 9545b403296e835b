"""A pod's last scheduling gate taken away: the update that lets it be scheduled, checked against where it may land.

Kueue admits a pod it gated at create (``kueue.x-k8s.io/admission``) by taking the gate away and writing its
ResourceFlavor's node labels and tolerations into the pod in the same update (sigs.k8s.io/kueue, the pod
integration's ``Run``: ungate, then merge the pod set's node selector and tolerations). The create was checked
against every node the pod could land on then; here a CUDA 12.8 pod is let onto a tainted pool of driver 535 by
such an update.
"""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import os
import random
import re
import subprocess
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import jsonpatch
import pytest

from tests.conftest import gpu_node, gpu_pod, review
from tests.kubeapi import KubeAPI
from tests.test_events import Recording, configured, stored_pod
from webhook import events, pipeline
from webhook.admission import subject_of
from webhook.app import create_app
from webhook.audit import build_recorder
from webhook.cluster import StaticCluster, build_view
from webhook.config import AuditSettings, CudaSettings, PoolSettings, Settings, SpotSettings, TaintSpec
from webhook.events import EventQueue
from webhook.model import Context, Denial, Event, escaped
from webhook.policies import cuda, spot

POOL = "cloud.google.com/gke-nodepool"
LEGACY = {"key": "dedicated", "value": "legacy", "effect": "NoSchedule"}
DEDICATED = {"key": "dedicated", "value": "h100-new", "effect": "NoSchedule"}
KUEUE = "system:serviceaccount:kueue-system:kueue-controller-manager"
GATE = "kueue.x-k8s.io/admission"
IMAGE = "pytorch/pytorch-nightly:2710000-cu12.8"
CUT = f"cut to fit: {pipeline.EVENT_WHOLE} more"


def nodes(tainted: bool = True, new_tainted: bool = False) -> list[dict[str, Any]]:
    new = {
        POOL: "h100-new",
        "nvidia.com/cuda.driver-version.full": "570.124.06",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "8",
    }
    old = {
        POOL: "h100-old",
        "nvidia.com/cuda.driver-version.full": "535.104.05",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "2",
    }
    return [
        gpu_node("new-1", labels=new, taints=[DEDICATED] if new_tainted else None),
        gpu_node("old-1", labels=old, taints=[LEGACY] if tainted else None),
    ]


def app_with(
    settings: Settings | None = None, tainted: bool = True, over: list[dict[str, Any]] | None = None
) -> tuple[Any, Any, Recording]:
    """The webhook's app over ``nodes(tainted)``, or the nodes ``over``, its Events recorded."""
    settings = settings or Settings(audit=AuditSettings(event_queue_size=100))
    cluster = StaticCluster(build_view(nodes(tainted) if over is None else over, settings))
    sink = Recording()
    recorder = build_recorder(settings, cluster, sink=sink)
    return create_app(settings, cluster=cluster, recorder=recorder), recorder, sink


def created(
    *gates: str,
    tainted: bool = True,
    containers: Sequence[tuple[str, str]] = (("trainer", IMAGE),),
    init: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    """A CUDA 12.8 pod as stored after its create: gated, reviewed (only pool h100-new could take it then, or, the
    old pool untainted, steered to it). ``containers`` and ``init``: (name, image), each asking one GPU."""
    settings = Settings()
    gpu = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "ml", "labels": {"kueue.x-k8s.io/queue-name": "user-queue"}},
        "spec": {
            "schedulingGates": [{"name": g} for g in gates],
            "containers": [{"name": name, "image": image, **gpu} for name, image in containers],
        },
    }
    if init:
        pod["spec"]["initContainers"] = [{"name": name, "image": image, **gpu} for name, image in init]
    ctx = Context(settings=settings, cluster=build_view(nodes(tainted), settings), namespace="ml")
    result = pipeline.review(pod, ctx)
    assert result.allowed, result.message
    stored: dict[str, Any] = result.object
    stored["metadata"]["uid"] = str(uuid.uuid4())
    return stored


def admitted(pod: dict[str, Any], pool: str, *keep: str) -> dict[str, Any]:
    """What Kueue's update writes when it admits the pod to the flavor of ``pool``: its gate away (``keep``: the
    gates left), the flavor's node label and toleration."""
    out = copy.deepcopy(pod)
    out["spec"]["schedulingGates"] = [{"name": g} for g in keep]
    if not keep:
        del out["spec"]["schedulingGates"]
    out["spec"]["nodeSelector"] = {POOL: pool}
    out["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Equal", "value": "legacy", "effect": "NoSchedule"}]
    return out


def update(app: Any, endpoint: str, new: dict[str, Any], old: dict[str, Any], **request: Any) -> dict[str, Any]:
    user = request.pop("userInfo", {"username": KUEUE, "groups": ["system:serviceaccounts"]})
    body = review(new, operation="UPDATE", namespace="ml", oldObject=old, name="trainer", **request)
    body["request"]["userInfo"] = user
    response = app.test_client().post(endpoint, json=body)
    assert response.status_code == 200
    answer: dict[str, Any] = response.get_json()["response"]
    return answer


def sent(recorder: Any, sink: Recording) -> list[dict[str, Any]]:
    assert isinstance(recorder.events, EventQueue) and recorder.events.drain(5)
    return sink.bodies


def test_the_update_that_ungates_a_pod_onto_a_too_old_driver_is_refused_and_told_on_the_pod() -> None:
    app, recorder, sink = app_with()
    old = created(GATE)
    answer = update(app, "/validate", admitted(old, "h100-old"), old)
    assert answer["allowed"] is False
    assert answer["status"]["reason"] == "CUDAIncompatible"
    message = answer["status"]["message"]
    assert message.startswith(f"taking away the pod's last scheduling gate ({GATE}, by {KUEUE})"), message
    assert "needs CUDA 12.8 (from image tag" in message and "pool h100-old (driver 535.104.05, CUDA 12.2)" in message
    assert pipeline.KUEUE_ADVICE in message
    assert answer["auditAnnotations"]["decision"] == "denied (CUDAIncompatible)"
    (event,) = sent(recorder, sink)
    assert (event["type"], event["reason"]) == ("Warning", "UngateRefused")
    assert event["message"].startswith("CUDAIncompatible: taking away the pod's last scheduling gate")
    assert event["involvedObject"]["name"] == "trainer" and event["involvedObject"]["uid"] == old["metadata"]["uid"]


def test_a_refusal_over_the_events_limit_keeps_its_advice_in_the_event() -> None:
    """Found by a review of the reporting: the refusal (1085 characters) and its reason came to more than the Event's
    1024, and the cut at the end took Kueue's advice, which the gated pod's Event is the only place to read (the
    updater, a controller, only logs the refusal). The Event says the gate taken away in fewer words than the
    answer, and holds the refusal and the advice whole."""
    app, recorder, sink = app_with()
    old = created(GATE)
    answer = update(app, "/validate", admitted(old, "h100-old"), old)
    assert len(f"CUDAIncompatible: {answer['status']['message']}") > events.MESSAGE_LIMIT
    refusal, advice = answer["status"]["message"].split("and there: ", 1)[1].split("\n")
    (event,) = sent(recorder, sink)
    assert event["message"] == (
        f"CUDAIncompatible: taking away the pod's last scheduling gate ({GATE}, by {KUEUE}) is refused:\n"
        f"{refusal}\n{pipeline.KUEUE_ADVICE}"
    )
    assert "To fix: Use an image built for CUDA <= 12.2;" in refusal and advice == pipeline.KUEUE_ADVICE


def refusals_of(answer: dict[str, Any]) -> list[str]:
    """The lines of a refused ungating's answer after its words on the gate: a refusal each, then any advice."""
    lines: list[str] = answer["status"]["message"].split("and there: ", 1)[1].split("\n")
    return lines


def test_containers_refused_alike_are_one_line_of_the_event_that_names_them_all() -> None:
    """Found by a review of the reporting: two containers of one image, refused alike, made an answer of two
    refusals and Kueue's advice, and the Event, cut in its middle, kept the first's start and the advice, no word of
    the second container. The Event says the refusal once, naming both; the answer keeps a line each."""
    app, recorder, sink = app_with()
    old = created(GATE, containers=[("trainer", IMAGE), ("helper", IMAGE)])
    answer = update(app, "/validate", admitted(old, "h100-old"), old)
    trainer, helper, advice = refusals_of(answer)
    assert helper == trainer.replace("container trainer ", "container helper ", 1) and advice == pipeline.KUEUE_ADVICE
    (event,) = sent(recorder, sink)
    head, said, advice_said, tail = event["message"].split("\n")
    assert head == f"CUDAIncompatible: taking away the pod's last scheduling gate ({GATE}) is refused:", head
    assert said == trainer.replace("container trainer ", "container trainer (and helper alike) ", 1), said
    assert advice_said == pipeline.KUEUE_ADVICE and len(event["message"]) <= events.MESSAGE_LIMIT
    assert tail == CUT, tail  # the updater left out


def test_containers_refused_each_its_own_way_are_each_named_in_the_event() -> None:
    """Found by reviews of the reporting: two containers of images built for other CUDA versions made two refusals,
    and the Event, cut in its middle, named only the first container; then a last line of 140 characters left out
    the second. The first refusal's 'To fix' is whole, its start says the container, image and CUDA; Kueue's advice
    is whole; the second refusal is said by its start; the short last line says it is cut."""
    app, recorder, sink = app_with()
    old = created(GATE, containers=[("trainer", IMAGE), ("helper", "pytorch/pytorch-nightly:2710000-cu12.6")])
    answer = update(app, "/validate", admitted(old, "h100-old"), old)
    trainer, helper, _ = refusals_of(answer)
    (event,) = sent(recorder, sink)
    _, trainer_said, helper_said, advice, tail = event["message"].split("\n")
    fix = trainer[trainer.index("To fix: Use an image built for CUDA <= 12.2;") :]
    said = re.fullmatch(
        r"container trainer \(image (.+)…(.+)\) needs CUDA 12\.8 \(from image tag(.*)… (.*)", trainer_said
    )
    assert said is not None and IMAGE.startswith(said[1]) and IMAGE.endswith(said[2]) and said[4] == fix, trainer_said
    assert helper.startswith(helper_said.removesuffix("…")) and "needs CUDA 12.6" in helper_said, helper_said
    assert advice == pipeline.KUEUE_ADVICE and len(event["message"]) <= events.MESSAGE_LIMIT
    assert tail == CUT, tail


@pytest.mark.parametrize("alike", [True, False], ids=["one-image", "an-image-each"])
def test_the_event_of_forty_refused_containers_keeps_the_first_advice_and_says_how_many_more(alike: bool) -> None:
    """Found by reviews of the reporting: refusals of dozens of containers were cut, in the Event, to the first's
    start and Kueue's advice (or, given each a share of the room, to stubs of 16 characters that said nothing), and
    the start of a line of containers alike was all names, no word of the CUDA they need. Forty containers (init
    containers but one: a GPU at a time) of one image are one line naming some and counting the rest, and its
    start says the CUDA; of an image each, the last line counts those left out. The first refusal's advice and
    Kueue's are whole, what comes before the first's advice cut to the room left."""
    named = [(f"worker-{i:02}", IMAGE if alike else f"pytorch/pytorch-nightly:27100{i:02}-cu12.8") for i in range(40)]
    app, recorder, sink = app_with()
    old = created(GATE, containers=named[:1], init=named[1:])
    answer = update(app, "/validate", admitted(old, "h100-old"), old)
    first = refusals_of(answer)[0]
    (event,) = sent(recorder, sink)
    lines = event["message"].split("\n")
    assert len(event["message"]) <= events.MESSAGE_LIMIT and lines[0].startswith("CUDAIncompatible: taking away")
    fix = "To fix: " + first.split(" To fix: ")[1]
    assert lines[1].endswith(f"… {fix}") and lines[-2] == pipeline.KUEUE_ADVICE, lines
    if alike:
        said = re.match(
            r"container worker-01 \(init\) \(and (.*) and (\d+) more alike\) \(image .*\) needs CUDA 12.8", lines[1]
        )
        assert said is not None and len(said[1].split(", ")) + int(said[2]) == 39, lines[1]
        assert len(lines) == 4 and lines[-1] == CUT, lines
    else:
        said = re.match(r"container worker-01 \(init\) \(image (.+)…(.+)\) needs CUDA 12\.8", lines[1])
        assert said is not None and named[1][1].startswith(said[1]) and named[1][1].endswith(said[2]), lines[1]
        more = re.fullmatch(rf"and (\d+) more refusals: {pipeline.EVENT_WHOLE} more", lines[-1])
        assert more is not None and int(more[1]) == 40 - len(lines[1:-2]), lines


def test_a_refusal_retried_is_one_event_whose_count_goes_up() -> None:
    """Found by a review of the reporting: Kueue tries a refused ungating again and again (controller-runtime's
    backoff), and each refusal was an Event of its own: an identical Warning line per retry under the pod's Events,
    an object each in etcd. The same refusal is one Event whose count goes up, as client-go's recorder aggregates;
    another refusal of the same pod (another gate taken away with it) is another Event."""
    api = KubeAPI().start()
    try:
        settings = Settings(audit=AuditSettings(event_queue_size=100))
        cluster = StaticCluster(build_view(nodes(), settings))
        recorder = build_recorder(settings, cluster, api_client=configured(api))
        app = create_app(settings, cluster=cluster, recorder=recorder)
        old = created(GATE)
        for _ in range(3):
            assert update(app, "/validate", admitted(old, "h100-old"), old)["allowed"] is False
        two_gates = copy.deepcopy(old)
        two_gates["spec"]["schedulingGates"].append({"name": "example.com/quota"})
        assert update(app, "/validate", admitted(old, "h100-old"), two_gates)["allowed"] is False
        assert isinstance(recorder.events, EventQueue) and recorder.events.drain(10)
        told = api.list("v1", "events", "ml")
    finally:
        api.stop()
    assert {e["involvedObject"]["uid"] for e in told} == {old["metadata"]["uid"]}
    gates = "CUDAIncompatible: taking away the pod's last scheduling gate (kueue.x-k8s.io/admission"
    counts = sorted((e["count"], e["message"].split(") is refused:")[0].split(", by ")[0]) for e in told)
    assert counts == [(1, f"{gates}, example.com/quota"), (3, gates)]
    assert (recorder.events.sent, recorder.events.failed) == (4, 0)


def test_the_update_that_ungates_a_pod_onto_a_driver_that_runs_it_is_let_through_and_checked_again() -> None:
    app, recorder, sink = app_with()
    old = created(GATE)
    answer = update(app, "/validate", admitted(old, "h100-new"), old)
    assert answer["allowed"] is True
    assert answer["auditAnnotations"]["cuda-decision"] == "compatible (pool h100-new)"
    assert [(e["type"], e["reason"]) for e in sent(recorder, sink)] == [("Normal", "CUDAChecked")]


def test_an_ungating_onto_only_pools_the_steering_keeps_it_off_is_refused_for_its_cuda() -> None:
    """Kueue admits the pod to the old pool's flavor though the steering written at the create keeps it off that
    pool (a flavor is matched only on the keys it names: steering on GFD's CUDA labels Kueue never sees), and the pod
    would stay Pending for good. The GKE pools here are steered to by their pool label (Cluster Autoscaler scales a
    pool up from zero on a node built from the pool's definition, which carries no GFD label)."""
    app, recorder, sink = app_with(tainted=False)
    old = created(GATE, tainted=False)
    steering = old["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert steering["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": POOL, "operator": "In", "values": ["h100-new"]}]}
    ]
    answer = update(app, "/validate", admitted(old, "h100-old"), old)
    assert answer["allowed"] is False and answer["status"]["reason"] == "CUDAIncompatible"
    message = answer["status"]["message"]
    assert "pool h100-old (driver 535.104.05, CUDA 12.2)" in message
    assert cuda.UNPLACEABLE.strip() in message and pipeline.KUEUE_ADVICE in message
    assert [e["reason"] for e in sent(recorder, sink)] == ["UngateRefused"]
    answer = update(app, "/validate", admitted(old, "h100-new"), old)
    assert answer["allowed"] is True, "the steering and the flavor agree"


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(("a", GATE), ("a",), id="a-gate-left"),
        pytest.param((), (), id="never-gated"),
    ],
)
def test_other_pod_updates_are_not_reviewed(before: tuple[str, ...], after: tuple[str, ...]) -> None:
    app, recorder, sink = app_with()
    old = created(*before)
    answer = update(app, "/validate", admitted(old, "h100-old", *after), old)
    assert answer["allowed"] is True and "patch" not in answer
    assert sent(recorder, sink) == []
    view = build_view(nodes(), Settings())
    ctx = Context(settings=Settings(), cluster=view, namespace="ml", operation="UPDATE", old_object=old)
    assert pipeline.validate(admitted(old, "h100-old", *after), ctx).skipped == pipeline.POD_UPDATE


def test_another_gate_gets_no_word_of_kueue_and_a_dry_run_no_event() -> None:
    app, recorder, sink = app_with()
    old = created("example.com/quota")
    answer = update(app, "/validate", admitted(old, "h100-old"), old, dryRun=True)
    assert answer["allowed"] is False
    assert "(example.com/quota, by" in answer["status"]["message"]
    assert "Kueue" not in answer["status"]["message"]
    assert sent(recorder, sink) == []


def test_the_mutating_side_leaves_an_ungating_update_as_it_is() -> None:
    app, _, _ = app_with()
    old = created(GATE)
    answer = update(app, "/mutate", admitted(old, "h100-old"), old)
    assert answer["allowed"] is True and "patch" not in answer


def test_in_warn_mode_the_ungating_is_let_through_with_a_warning_event() -> None:
    settings = Settings(cuda=CudaSettings(mode="warn"), audit=AuditSettings(event_queue_size=100))
    app, recorder, sink = app_with(settings)
    old = created(GATE)
    answer = update(app, "/validate", admitted(old, "h100-old"), old)
    assert answer["allowed"] is True
    assert any(w.startswith("would be denied (CUDAIncompatible)") for w in answer["warnings"])
    assert [(e["type"], e["reason"]) for e in sent(recorder, sink)] == [("Warning", "CUDAIncompatible")]


def test_a_gated_pod_may_land_where_the_update_that_ungates_it_adds_a_toleration_for() -> None:
    """Found by a review of the webhook with Kueue: the only pool that runs the pod's CUDA is tainted, and a Kueue
    flavor's tolerations reach it (its 'automatic scheduling' pattern); the gated pod was refused at its create,
    though Kueue would have admitted it there. A gated pod is judged where it could land with any tolerations
    added, and steered there; the ungating is checked with the tolerations it has then."""
    settings = Settings(audit=AuditSettings(event_queue_size=100))
    view = build_view(nodes(tainted=False, new_tainted=True), settings)
    cluster = StaticCluster(view)
    recorder = build_recorder(settings, cluster, sink=Recording())
    app = create_app(settings, cluster=cluster, recorder=recorder)
    ctx = Context(settings=settings, cluster=view, namespace="ml")
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "trainer", "namespace": "ml", "uid": str(uuid.uuid4())},
        "spec": {
            "schedulingGates": [{"name": GATE}],
            "containers": [
                {
                    "name": "trainer",
                    "image": "pytorch/pytorch-nightly:2710000-cu12.8",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }
    ungated_now = copy.deepcopy(pod)
    del ungated_now["spec"]["schedulingGates"]
    assert not pipeline.review(ungated_now, ctx).allowed, "not gated, the pod can land only on the old pool"
    result = pipeline.review(copy.deepcopy(pod), ctx)
    assert result.allowed, result.message
    stored = result.object
    assert f'"{POOL}", "operator": "In", "values": ["h100-new"]' in json.dumps(stored["spec"]["affinity"]), "steered"
    to_new = copy.deepcopy(stored)
    del to_new["spec"]["schedulingGates"]
    to_new["spec"]["nodeSelector"] = {POOL: "h100-new"}
    to_new["spec"]["tolerations"] = [{**DEDICATED, "operator": "Equal"}]
    assert update(app, "/validate", to_new, stored)["allowed"] is True
    to_old = copy.deepcopy(stored)
    del to_old["spec"]["schedulingGates"]
    to_old["spec"]["nodeSelector"] = {POOL: "h100-old"}
    assert update(app, "/validate", to_old, stored)["allowed"] is False


def test_a_pod_not_reviewed_at_its_create_is_not_reviewed_at_its_ungating() -> None:
    """Found by a review of this session's commits: a pod whose create was exempt (its creator's user or group)
    was refused when Kueue's service account, not exempt, took its gate away, and stayed gated for good. The
    ungating is reviewed only for a pod that carries the webhook's words from its create."""
    app, recorder, sink = app_with()
    old = created(GATE)
    old["metadata"]["annotations"] = {}  # as an exempt creator's pod is stored
    answer = update(app, "/validate", admitted(old, "h100-old"), old)
    assert answer["allowed"] is True and sent(recorder, sink) == []


SPOT_LABEL = "cloud.google.com/gke-spot"


def spot_nodes() -> list[dict[str, Any]]:
    """Pool h100-new on demand and pool l4-spot (GKE spot: labelled and tainted), both of driver 570."""
    spot_labels = {**nodes()[0]["metadata"]["labels"], POOL: "l4-spot", SPOT_LABEL: "true"}
    taint = {"key": SPOT_LABEL, "value": "true", "effect": "NoSchedule"}
    return [nodes(tainted=False)[0], gpu_node("spot-1", labels=spot_labels, taints=[taint])]


@pytest.mark.parametrize(
    ("mode_at_create", "refused"),
    [("off", True), ("never", False)],
    ids=["created-under-another-mode", "created-under-never"],
)
def test_an_ungating_that_lets_a_never_pod_onto_spot_is_refused(mode_at_create: str, refused: bool) -> None:
    """A pod created gated while its namespace had no spot default got no affinity off spot capacity; the default
    is never by its ungating, and Kueue's update admits it to a spot flavor (its pool label and the spot taint's
    toleration). Created under never, the webhook's NotIn keeps it off the spot pool: Pending there for good."""
    never = Settings(spot=SpotSettings(namespace_defaults={"ml": "never"}), audit=AuditSettings(event_queue_size=9))
    at_create = never if mode_at_create == "never" else Settings()
    pod = gpu_pod("trainer", image="pytorch/pytorch-nightly:2710000-cu12.8")
    pod["metadata"] = {"name": "trainer", "namespace": "ml"}
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    result = pipeline.review(
        pod, Context(settings=at_create, cluster=build_view(spot_nodes(), at_create), namespace="ml")
    )
    assert result.allowed, result.message
    old = result.object
    cluster = StaticCluster(build_view(spot_nodes(), never))
    app = create_app(never, cluster=cluster)
    onto_spot = copy.deepcopy(old)
    del onto_spot["spec"]["schedulingGates"]
    onto_spot["spec"]["nodeSelector"] = {POOL: "l4-spot"}
    onto_spot["spec"]["tolerations"] = [
        {"key": SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    ]
    answer = update(app, "/validate", onto_spot, old)
    if refused:
        assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngated"
        message = answer["status"]["message"]
        assert message.startswith(f"taking away the pod's last scheduling gate ({GATE}, by {KUEUE})"), message
        assert "pod ml/trainer is under spot never (default for namespace ml)" in message
        assert "now let it run on spot pool l4-spot" in message and "spot: tolerate" in message
        assert "Have Kueue admit it to a ResourceFlavor of on-demand nodes only" in message, message
    else:  # kept off it by the NotIn: Pending for good (``test_a_never_pod_ungated_onto_a_spot_flavor_...``)
        assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngatedPending", answer
    on_demand = copy.deepcopy(onto_spot)
    on_demand["spec"]["nodeSelector"] = {POOL: "h100-new"}
    assert update(app, "/validate", on_demand, old)["allowed"] is True


NEVER = Settings(spot=SpotSettings(namespace_defaults={"ml": "never"}))
GKE_SPOT_TOLERATION = {"key": SPOT_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def created_through(app: Any, pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as stored after its create through ``app``'s /mutate (its patch applied) and /validate."""
    answer = app.test_client().post("/mutate", json=review(pod, namespace="ml")).get_json()["response"]
    assert answer["allowed"], answer
    stored = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(answer["patch"]))) if "patch" in answer else pod
    checked = app.test_client().post("/validate", json=review(stored, namespace="ml")).get_json()["response"]
    assert checked["allowed"], checked
    stored["metadata"]["uid"] = str(uuid.uuid4())
    return stored


def spot_app(settings: Settings) -> Any:
    """The webhook's Flask app under ``settings``, over ``spot_nodes``."""
    return create_app(settings, cluster=StaticCluster(build_view(spot_nodes(), settings)))


def gated_pod(**limits: str) -> dict[str, Any]:
    pod = gpu_pod("trainer", limits=limits or None, image="pytorch/pytorch-nightly:2710000-cu12.8")
    pod["metadata"] = {"name": "trainer", "namespace": "ml"}
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    return pod


def kueue_admits(stored: dict[str, Any], selector: dict[str, str], *tolerations: dict[str, str]) -> dict[str, Any]:
    """Kueue's ungating onto a flavor: its node labels and tolerations added."""
    out = copy.deepcopy(stored)
    del out["spec"]["schedulingGates"]
    out["spec"]["nodeSelector"] = {**(out["spec"].get("nodeSelector") or {}), **selector}
    out["spec"]["tolerations"] = [*(out["spec"].get("tolerations") or []), *tolerations]
    return out


def test_a_never_pod_ungated_onto_a_spot_flavor_its_notin_keeps_it_off_is_refused() -> None:
    """Found by a review of the spot policy: a never pod created gated got the webhook's NotIn off spot capacity (a
    gated pod is judged to tolerate every taint), and Kueue then admitted it to a spot flavor (its pool label and
    the spot taint's toleration): the ungating was allowed, and the pod stayed Pending for good, its NotIn and the
    flavor's nodeSelector never both holding. Refused, with what to change; an on-demand flavor passes."""
    app = spot_app(NEVER)
    stored = created_through(app, gated_pod())
    assert f'"{SPOT_LABEL}", "operator": "NotIn"' in json.dumps(stored["spec"]["affinity"]), "kept off spot"
    answer = update(app, "/validate", kueue_admits(stored, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION), stored)
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngatedPending", answer
    message = answer["status"]["message"]
    assert "pod ml/trainer is under spot never (default for namespace ml)" in message, message
    assert "its nodeSelector now sends it to spot pool l4-spot alone: it would stay Pending for good" in message
    assert "ResourceFlavor of on-demand nodes only" in message and "spot: tolerate" in message
    assert update(app, "/validate", kueue_admits(stored, {POOL: "h100-new"}), stored)["allowed"] is True


def test_the_cuda_warning_of_a_never_pod_ungated_onto_spot_names_never_not_its_own_rules() -> None:
    """A gated never pod whose CUDA steering was written at its create: the steering's In on the pools (planned once
    spot capacity was kept off) leaves out every spot pool too, and the cuda policy's words blamed the spot pool on
    "its nodeSelector/affinity", rules the user did not write (found by a review of the spot policy)."""
    app = create_app(NEVER, cluster=StaticCluster(build_view(spot_nodes() + nodes()[1:], NEVER)))
    stored = created_through(app, gated_pod())
    assert f'"{POOL}", "operator": "In", "values": ["h100-new"]' in json.dumps(stored["spec"]["affinity"]), "steered"
    answer = update(app, "/validate", kueue_admits(stored, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION), stored)
    said = [w for w in answer.get("warnings", []) if w.startswith("cuda: no known GPU node")]
    assert said == [f"cuda: no known GPU node matches ({spot.KEPT_OFF_BY_NEVER} excludes pool l4-spot; and 1 more)"], (
        answer
    )


@pytest.mark.parametrize(
    ("labels", "selector"),
    [
        ({}, {SPOT_LABEL: "true"}),
        ({"karpenter.sh/capacity-type": "on-demand"}, {"karpenter.sh/capacity-type": "spot"}),
    ],
    ids=["gke-spot-pool-at-zero", "karpenter-spot-at-zero"],
)
def test_an_ungating_onto_spot_capacity_no_node_carries_yet_is_refused_for_a_never_pod(
    labels: dict[str, str], selector: dict[str, str]
) -> None:
    """A pod created gated under another mode got no NotIn; by its ungating its namespace's default is never, and
    Kueue admits it to a flavor of spot capacity at zero (a GKE spot pool, Karpenter's spot capacity): only the
    spot pools in the node list were looked at, and its autoscaler added a spot node for it unsaid (found by a
    review of the spot policy). Judged as never judges such places at a create."""
    cluster_nodes = [gpu_node("new-1", labels={**nodes()[0]["metadata"]["labels"], **labels})]
    off = create_app(Settings(), cluster=StaticCluster(build_view(cluster_nodes, Settings())))
    stored = created_through(off, gated_pod())
    app = create_app(NEVER, cluster=StaticCluster(build_view(cluster_nodes, NEVER)))
    answer = update(app, "/validate", kueue_admits(stored, selector, GKE_SPOT_TOLERATION), stored)
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngated", answer
    place = "=".join(next(iter(selector.items())))
    assert f"now let it run on spot capacity {place} (no node carries it now" in answer["status"]["message"]
    assert update(app, "/validate", kueue_admits(stored, {POOL: "h100-new"}), stored)["allowed"] is True


KARPENTER_SPOT = {
    "karpenter.sh/nodepool": "gpu",
    "karpenter.sh/capacity-type": "spot",
    "karpenter.k8s.aws/instance-family": "g6",
    "karpenter.k8s.aws/instance-gpu-name": "l4",
}


@pytest.mark.parametrize(
    ("selector", "refused"),
    [
        ({"karpenter.sh/nodepool": "gpu"}, False),
        ({"karpenter.k8s.aws/instance-family": "g6"}, False),
        ({"karpenter.k8s.aws/instance-gpu-name": "l4"}, False),
        ({"karpenter.sh/nodepool": "gpu", "karpenter.sh/capacity-type": "spot"}, True),
    ],
    ids=["nodepool", "instance-family", "instance-gpu-name", "nodepool-and-spot-label"],
)
def test_a_never_pod_ungated_to_a_karpenter_nodepool_with_only_spot_nodes_up_is_let_through(
    selector: dict[str, str], refused: bool
) -> None:
    """Found by a review of the spot policy: a Karpenter NodePool may launch spot and on-demand capacity alike; with
    only its spot nodes up now, a never pod Kueue admitted to a flavor naming the NodePool (or an instance property)
    was refused as SpotNeverUngatedPending, though Karpenter launches an on-demand node for it. Only a selector
    naming the spot label itself sends it to spot capacity alone."""
    labels = {k: v for k, v in nodes()[0]["metadata"]["labels"].items() if k != POOL}
    cluster_nodes = [gpu_node("spot-1", labels={**labels, **KARPENTER_SPOT})]
    app = create_app(NEVER, cluster=StaticCluster(build_view(cluster_nodes, NEVER)))
    stored = created_through(app, gated_pod())
    assert '"karpenter.sh/capacity-type", "operator": "NotIn"' in json.dumps(stored["spec"]["affinity"])
    answer = update(app, "/validate", kueue_admits(stored, selector), stored)
    assert answer["allowed"] is not refused, answer
    if refused:
        assert answer["status"]["reason"] == "SpotNeverUngatedPending", answer


def test_a_never_pod_ungated_by_a_label_of_the_users_own_on_a_spot_pool_is_let_through() -> None:
    """Found by a review of the spot policy: a flavor's label of the user's own (team=ml) is on the nodes of a spot
    pool that is up and may be on an on-demand pool at zero, not declared, so not in the webhook's view; the never
    pod was refused as SpotNeverUngatedPending. Such a label never proves spot capacity alone; the spot pool's own
    label does (a GKE node pool has one capacity type)."""
    team = {"team": "ml"}
    spot_team = spot_nodes()
    spot_team[1]["metadata"]["labels"].update(team)
    app = create_app(NEVER, cluster=StaticCluster(build_view(spot_team, NEVER)))
    stored = created_through(app, gated_pod())
    assert update(app, "/validate", kueue_admits(stored, team, GKE_SPOT_TOLERATION), stored)["allowed"] is True
    answer = update(app, "/validate", kueue_admits(stored, {**team, POOL: "l4-spot"}, GKE_SPOT_TOLERATION), stored)
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngatedPending", answer


def test_a_never_pod_ungated_onto_spot_is_refused_only_where_never_keeps_it_off() -> None:
    """Found by a review of the spot policy: the pod was judged without its whole required affinity, its own terms
    too; a never pod whose own In (team=ml) kept it off a spot pool at zero, which Kueue admitted to that pool's
    flavor, was refused and told to recreate itself under spot: tolerate, which would not have let it there
    either. Only the webhook's NotIn and the CUDA steering written after it (planned once spot capacity was kept
    off) are taken out: a steered pod is still refused."""
    pool = PoolSettings(
        name="l4-spot",
        node_selector={POOL: "l4-spot"},
        spot=True,
        driver_version="570.124.06",
        taints=[TaintSpec(key=SPOT_LABEL, value="true", effect="NoSchedule")],
    )
    settings = dataclasses.replace(NEVER, cluster=dataclasses.replace(NEVER.cluster, pools=[pool]))
    cluster_nodes = nodes()
    cluster_nodes[0]["metadata"]["labels"]["team"] = "ml"
    app = create_app(settings, cluster=StaticCluster(build_view(cluster_nodes, settings)))
    steered = created_through(app, gated_pod())
    assert f'"{POOL}", "operator": "In", "values": ["h100-new"]' in json.dumps(steered["spec"]["affinity"])
    answer = update(app, "/validate", kueue_admits(steered, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION), steered)
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngatedPending", answer
    own = gated_pod()
    term = {"matchExpressions": [{"key": "team", "operator": "In", "values": ["ml"]}]}
    own["spec"]["affinity"] = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    }
    stored = created_through(app, own)
    assert f'"{POOL}", "operator": "NotIn", "values": ["l4-spot"]' in json.dumps(stored["spec"]["affinity"])
    answer = update(app, "/validate", kueue_admits(stored, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION), stored)
    assert answer["allowed"] is True, answer


def test_a_never_pod_whose_own_gate_is_taken_away_is_told_of_its_own_nodeselector_not_of_kueue() -> None:
    """Found by a review of the spot policy: a never pod created with its own gate and a nodeSelector on a spot
    pool, its gate taken away by its owner with nothing changed, was told to admit it to an on-demand Kueue
    ResourceFlavor; what sends it there is its own nodeSelector."""
    app = spot_app(NEVER)
    pod = gated_pod()
    pod["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    pod["spec"]["nodeSelector"] = {POOL: "l4-spot"}
    pod["spec"]["tolerations"] = [GKE_SPOT_TOLERATION]
    stored = created_through(app, pod)
    answer = update(app, "/validate", kueue_admits(stored, {}), stored, userInfo={"username": "alice"})
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngatedPending", answer
    message = answer["status"]["message"]
    assert "(example.com/hold, by alice)" in message, message
    assert f"delete it and recreate it without {POOL}: l4-spot in its nodeSelector where it was created" in message
    assert "ResourceFlavor" not in message and "Kueue" not in message, message


def test_a_never_pod_steered_by_a_cuda_range_and_ungated_onto_spot_alone_is_refused() -> None:
    """Found by a review of the spot policy: the CUDA steering writes ranges (``Gt``) besides ``In``s, planned once
    never's NotIn kept spot capacity off (so its range began past the spot box's CUDA), and only its ``In``s were
    taken out when judging an ungating: the range kept the pod off the spot box as if the user had written it, and a
    pod Pending for good was let through. k3s boxes with GFD's labels, spot by a label of the user's own."""
    settings = dataclasses.replace(NEVER, spot=dataclasses.replace(NEVER.spot, extra_labels={"lifecycle": "spot"}))

    def box(name: str, driver: str, cuda_version: str, **labels: str) -> dict[str, Any]:
        major, minor = cuda_version.split(".")
        return gpu_node(
            name,
            {
                "nvidia.com/gpu.product": "NVIDIA-GeForce-RTX-4090",
                "nvidia.com/cuda.driver-version.full": driver,
                "nvidia.com/cuda.runtime-version.major": major,
                "nvidia.com/cuda.runtime-version.minor": minor,
                **labels,
            },
        )

    boxes = [box("old", "470.223.02", "11.4"), box("new", "570.124.06", "12.8"), box("spot", "550.54.15", "12.4")]
    boxes[2]["metadata"]["labels"]["lifecycle"] = "spot"
    app = create_app(settings, cluster=StaticCluster(build_view(boxes, settings)))
    pod = gated_pod()
    pod["spec"]["containers"][0]["image"] = "pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime"
    stored = created_through(app, pod)
    assert '"operator": "Gt"' in json.dumps(stored["spec"]["affinity"]), stored["spec"]["affinity"]
    answer = update(app, "/validate", kueue_admits(stored, {"lifecycle": "spot"}), stored)
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngatedPending", answer


@pytest.mark.parametrize(
    ("ungating", "advice"),
    [
        pytest.param({POOL: "l4-spot"}, "Have what takes its gate away choose on-demand nodes. Delete", id="placed"),
        pytest.param({}, f"recreate it without {POOL}: l4-spot in its nodeSelector where it was", id="as-created"),
    ],
)
def test_a_never_pod_whose_own_gate_is_taken_away_onto_spot_gets_no_word_of_kueue(
    ungating: dict[str, str], advice: str
) -> None:
    """Found by a review of the spot policy: a pod gated by its own controller (no Kueue gate, label or annotation on
    it), created under another mode and so without the NotIn, its gate taken away by a user onto a spot pool, was
    refused as SpotNeverUngated and told to admit it to a flavor of on-demand nodes, Kueue's words. It is told to have
    what takes its gate away choose on-demand nodes where the update placed it, and only to recreate it where what
    it had at its create sends it there."""
    off = spot_app(Settings())
    pod = gated_pod()
    pod["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    if not ungating:  # on the spot pool by its own nodeSelector and toleration, as created
        pod["spec"]["nodeSelector"] = {POOL: "l4-spot"}
        pod["spec"]["tolerations"] = [GKE_SPOT_TOLERATION]
    stored = created_through(off, pod)
    app = spot_app(NEVER)
    onto_spot = kueue_admits(stored, ungating, *([GKE_SPOT_TOLERATION] if ungating else []))
    answer = update(app, "/validate", onto_spot, stored, userInfo={"username": "alice"})
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngated", answer
    message = answer["status"]["message"]
    assert "(example.com/hold, by alice)" in message and advice in message, message
    assert "flavor" not in message.lower() and "Kueue" not in message, message


def test_a_never_pod_whose_own_gate_is_taken_away_onto_spot_it_is_kept_off_gets_no_word_of_kueue() -> None:
    """The same for SpotNeverUngatedPending: a user who takes its own gate away and sends it to a spot pool its NotIn
    keeps it off was told "(Kueue: a ResourceFlavor of on-demand nodes only ...)"."""
    app = spot_app(NEVER)
    pod = gated_pod()
    pod["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    stored = created_through(app, pod)
    onto_spot = kueue_admits(stored, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION)
    answer = update(app, "/validate", onto_spot, stored, userInfo={"username": "alice"})
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngatedPending", answer
    message = answer["status"]["message"]
    assert "Have what takes its gate away choose on-demand nodes. Or delete it" in message, message
    assert "flavor" not in message.lower() and "Kueue" not in message, message


def _own_spot_pool_pod() -> tuple[Any, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """A pod with a gate of its own and a spot toleration, and the same with its own nodeSelector on the spot pool
    l4-spot, created under another spot mode: (the app under never, the pod, the one with the nodeSelector, that one
    as stored)."""
    pod = gated_pod()
    pod["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    pod["spec"]["tolerations"] = [GKE_SPOT_TOLERATION]
    own = copy.deepcopy(pod)
    own["spec"]["nodeSelector"] = {POOL: "l4-spot"}
    return spot_app(NEVER), pod, own, created_through(spot_app(Settings()), own)


def test_a_never_pod_whose_nodeselector_chose_spot_before_its_ungating_is_told_to_recreate_it_without_that() -> None:
    """Found by a review of the spot policy: a pod created under another mode with a nodeSelector and toleration of
    its own on a spot pool, its own gate taken away with nothing changed under never, was told to delete and
    recreate it; recreated as it was, the webhook's NotIn and its nodeSelector never both hold, and its ungating was
    refused again (SpotNeverUngatedPending). Recreated without that nodeSelector, it runs on demand."""
    app, pod, own, stored = _own_spot_pool_pod()
    answer = update(app, "/validate", kueue_admits(stored, {}), stored, userInfo={"username": "alice"})
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngated", answer
    assert f"without {POOL}: l4-spot in its nodeSelector where it was created with" in answer["status"]["message"]
    as_it_was = created_through(app, own)
    answer = update(app, "/validate", kueue_admits(as_it_was, {}), as_it_was, userInfo={"username": "alice"})
    assert answer["status"]["reason"] == "SpotNeverUngatedPending", "recreated as it was: refused again"
    without = created_through(app, pod)
    answer = update(app, "/validate", kueue_admits(without, {}), without, userInfo={"username": "alice"})
    assert answer["allowed"] is True, answer


def kueue_then_another(app: Any, stored: dict[str, Any]) -> dict[str, Any]:
    """Kueue takes its gate away first, writing its spot flavor's node label and toleration (another gate left, the
    update is not reviewed), then a controller of its own takes the last gate away with nothing else changed."""
    admitted = kueue_admits(stored, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION)
    admitted["spec"]["schedulingGates"] = [{"name": "example.com/data-ready"}]
    assert update(app, "/validate", admitted, stored)["allowed"] is True
    last = copy.deepcopy(admitted)
    del last["spec"]["schedulingGates"]
    return update(app, "/validate", last, admitted, userInfo={"username": "system:serviceaccount:data:ready"})


CREATED_UNDER = pytest.mark.parametrize(
    ("at_create", "reason"),
    [(Settings(), "SpotNeverUngated"), (NEVER, "SpotNeverUngatedPending")],
    ids=["created-under-another-mode", "created-under-never"],
)
"""A never pod created under another spot mode, or under never: the reason its ungating onto spot is refused for."""


@CREATED_UNDER
def test_a_never_pod_kueue_put_on_spot_before_another_gate_went_is_told_of_an_on_demand_flavor(
    at_create: Settings, reason: str
) -> None:
    """Found by a review of the spot policy: a Kueue pod (its queue-name label) with a gate of another controller
    besides Kueue's; Kueue admitted it to a spot flavor first, and the other gate went last, its placement left as
    it was. It was told its nodeSelector was its own as created (recreated, Kueue put it on the spot flavor again),
    or only to recreate it: the advice names an on-demand flavor whatever update took the last gate away, and does
    not claim the nodeSelector was its own."""
    pod = gated_pod()
    pod["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "user-queue"}
    pod["spec"]["schedulingGates"] = [{"name": GATE}, {"name": "example.com/data-ready"}]
    stored = created_through(spot_app(at_create), pod)
    answer = kueue_then_another(spot_app(NEVER), stored)
    assert answer["allowed"] is False and answer["status"]["reason"] == reason, answer
    message = answer["status"]["message"]
    assert "as created or as set while it was gated: have Kueue admit it to a ResourceFlavor of on-demand" in message
    assert "as created sends" not in message and pipeline.KUEUE_ADVICE not in message, message


@pytest.mark.parametrize("cuda_refused", [False, True], ids=["spot-alone", "spot-and-cuda"])
def test_kueues_ungating_onto_spot_gets_the_advice_on_the_cuda_steering_only_where_its_cuda_is_refused(
    cuda_refused: bool,
) -> None:
    """Found by a review of the spot policy: every refusal of an update that took Kueue's gate away ended with the
    advice for the CUDA steering (give the flavors the labels the webhook steers on), a spot refusal too, beside the
    point and against its own advice of an on-demand flavor. Only a CUDA refusal (here beside the spot one, the spot
    pool's driver 535) gets it."""
    settings = dataclasses.replace(NEVER, cuda=CudaSettings(mode="enforce"))
    cluster_nodes = spot_nodes()
    if cuda_refused:
        cluster_nodes[1]["metadata"]["labels"].update(nodes()[1]["metadata"]["labels"] | {POOL: "l4-spot"})
    app = create_app(settings, cluster=StaticCluster(build_view(cluster_nodes, settings)))
    stored = created_through(app, gated_pod())
    answer = update(app, "/validate", kueue_admits(stored, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION), stored)
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngatedPending", answer
    message = answer["status"]["message"]
    assert "ResourceFlavor of on-demand nodes only" in message, message
    assert ("needs CUDA 12.8" in message) is cuda_refused and (pipeline.KUEUE_ADVICE in message) is cuda_refused


def test_a_refusal_for_spot_and_cuda_says_both_in_the_event() -> None:
    """Found by a review of the reporting: an ungating refused for spot and CUDA both (an answer of 1638 characters)
    got an Event of the spot refusal cut mid-sentence, then Kueue's advice, which is about the CUDA one, and no word
    of the CUDA refusal, nor its reason. The Event names both reasons, the spot refusal's advice whole, the start of
    the CUDA one (its container, image and CUDA), Kueue's advice, and where to read the whole; the answer keeps its
    whole text."""
    settings = dataclasses.replace(NEVER, cuda=CudaSettings(mode="enforce"), audit=AuditSettings(event_queue_size=10))
    cluster_nodes = spot_nodes() + nodes(tainted=False)[1:]  # l4-spot's driver too old for CUDA 12.8
    cluster_nodes[1]["metadata"]["labels"].update(nodes()[1]["metadata"]["labels"] | {POOL: "l4-spot"})
    app, recorder, sink = app_with(settings, over=cluster_nodes)
    stored = created_through(app, gated_pod())
    stored["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "user-queue"}
    answer = update(app, "/validate", kueue_admits(stored, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION), stored)
    assert answer["auditAnnotations"]["decision"] == "denied (SpotNeverUngatedPending, CUDAIncompatible)", answer
    spot_refusal, cuda_refusal, advice = refusals_of(answer)
    assert advice == pipeline.KUEUE_ADVICE and len(answer["status"]["message"]) > events.MESSAGE_LIMIT
    (event,) = [e for e in sent(recorder, sink) if e["reason"] == "UngateRefused"]
    head, spot_said, cuda_said, advice_said, tail = event["message"].split("\n")
    assert head.startswith("SpotNeverUngatedPending, CUDAIncompatible: taking away") and len(event["message"]) <= 1024
    spot_advice = spot_refusal[spot_refusal.index("Have Kueue admit it") :]
    assert spot_said.startswith("pod ml/trainer is under spo") and spot_said.endswith(f"… {spot_advice}"), spot_said
    assert "recreate it annotated gpu-admission.io/spot: tolerate" in spot_said and advice_said == advice
    start = f"container trainer (image {IMAGE}) needs CUDA 12.8 (from image tag"
    assert cuda_said.startswith(start) and cuda_refusal.startswith(cuda_said.removesuffix("…")), cuda_said
    assert tail == CUT, tail


@pytest.mark.parametrize("length", [30, 40, 63])
def test_the_events_cut_of_a_long_spot_refusal_keeps_the_entries_it_names(length: int) -> None:
    """Found by a review of the reporting: the long advice of a pod created with its own spot nodeSelector, Kueue
    adding its pool label, came to 1065 characters, and the Event's middle cut took the entry it names ("adds
    cloud.google.com/gke-nodepool: l4-spot"), while 180 characters on the gate taken away were kept. The Event says
    the gate in fewer words, and where the refusal is too long, what comes before its advice is cut."""
    namespace, name = f"team-{'n' * 63}"[:length], f"trainer-{'p' * 63}"[:length]
    settings = Settings(spot=SpotSettings(namespace_defaults={namespace: "never"}), audit=AuditSettings())
    app, recorder, sink = app_with(settings, over=spot_nodes())
    pod = gated_pod()
    pod["metadata"] = {"name": name, "namespace": namespace, "labels": {"kueue.x-k8s.io/queue-name": "user-queue"}}
    pod["spec"]["tolerations"] = [GKE_SPOT_TOLERATION]
    pod["spec"]["nodeSelector"] = {SPOT_LABEL: "true"}
    created = spot_app(Settings()).test_client().post("/mutate", json=review(pod, namespace=namespace))
    stored = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(created.get_json()["response"]["patch"])))
    body = review(kueue_admits(stored, {POOL: "l4-spot"}), "UPDATE", namespace, oldObject=stored, name=name)
    body["request"]["userInfo"] = {"username": KUEUE}
    answer = app.test_client().post("/validate", json=body).get_json()["response"]
    assert answer["status"]["reason"] == "SpotNeverUngated", answer
    (refusal,) = refusals_of(answer)
    advice = refusal[refusal.index("Its nodeSelector had") :]
    assert len(f"SpotNeverUngated: {answer['status']['message']}") > events.MESSAGE_LIMIT
    (event,) = [e for e in sent(recorder, sink) if e["reason"] == "UngateRefused"]
    head, said, *tail = event["message"].split("\n")
    assert head.startswith("SpotNeverUngated: taking away") and len(event["message"]) <= events.MESSAGE_LIMIT
    assert said.startswith(f"pod {namespace}/{name} is under spot never") and said.endswith(advice), said
    assert f"adds {POOL}: l4-spot: have Kueue admit it to a ResourceFlavor of on-demand nodes only" in advice
    assert tail == ([] if said == refusal else [CUT]), tail


@CREATED_UNDER
def test_a_never_pod_whose_own_spot_label_kueue_added_to_is_told_to_recreate_it_without_its_own(
    at_create: Settings, reason: str
) -> None:
    """Found by a review of the spot policy: a Kueue pod created with a nodeSelector of its own on GKE's spot label
    (and its toleration), which Kueue's flavor added its pool label to at the ungating, was told only of an on-demand
    flavor: the advice to recreate it without its own spot label was given only where the whole nodeSelector was
    unchanged, and with its own label kept, no flavor lets it run. Only the entries that choose spot are compared."""
    app = spot_app(NEVER)
    pod = gated_pod()
    pod["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "user-queue"}
    pod["spec"]["tolerations"] = [GKE_SPOT_TOLERATION]
    own = copy.deepcopy(pod)
    own["spec"]["nodeSelector"] = {SPOT_LABEL: "true"}
    stored = created_through(spot_app(at_create), own)
    answer = update(app, "/validate", kueue_admits(stored, {POOL: "l4-spot"}), stored)
    assert answer["allowed"] is False and answer["status"]["reason"] == reason, answer
    message = answer["status"]["message"]
    assert f"Its nodeSelector had {SPOT_LABEL}: true (spot capacity) before its last gate was taken away" in message
    assert f"without {SPOT_LABEL}: true in its nodeSelector where it was created with that" in message, message
    without = created_through(app, pod)  # recreated without it, admitted by Kueue to an on-demand flavor
    assert update(app, "/validate", kueue_admits(without, {POOL: "h100-new"}), without)["allowed"] is True


def test_a_never_pod_kueue_put_on_spot_is_told_to_recreate_it_with_an_on_demand_flavor_not_alone() -> None:
    """Found by a review of the spot policy: a Kueue pod created under another mode, admitted by Kueue to a spot
    flavor under never, was told to admit it to an on-demand flavor or to delete and recreate it, as a fix of its
    own: recreated under never, Kueue admitted it to the same spot flavor and it was refused again. Recreating it is
    said as what goes with the on-demand flavor (Kueue admits the recreated pod again)."""
    off = spot_app(Settings())
    app = spot_app(NEVER)
    pod = gated_pod()
    pod["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "user-queue"}
    stored = created_through(off, pod)
    answer = update(app, "/validate", kueue_admits(stored, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION), stored)
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngated", answer
    message = answer["status"]["message"]
    assert "Delete and recreate it (the webhook keeps it off spot)" not in message, message
    flavor = "ResourceFlavor of on-demand nodes only, in a ClusterQueue whose flavors are not spot, then delete it and "
    assert f"{flavor}recreate it for Kueue to admit it again. Or annotate the pod" in message, message
    again = created_through(app, pod)
    answer = update(app, "/validate", kueue_admits(again, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION), again)
    assert answer["status"]["reason"] == "SpotNeverUngatedPending", "recreated alone, the same spot flavor: refused"
    assert update(app, "/validate", kueue_admits(again, {POOL: "h100-new"}), again)["allowed"] is True


@pytest.mark.parametrize("at_create", [Settings(), NEVER], ids=["created-under-another-mode", "created-under-never"])
def test_a_kueue_pod_a_user_puts_on_spot_after_kueue_admitted_it_is_not_told_of_kueue(at_create: Settings) -> None:
    """Found by a review of the spot policy: Kueue admitted the pod to an on-demand flavor (no node labels) while a
    gate of the user's was left; the user then added a nodeSelector and toleration of a spot pool and took their gate
    away, and was told to have Kueue admit it to an on-demand flavor, which Kueue had done. Where the update that
    places it takes no gate of Kueue's, what takes its gate away is told to choose on-demand nodes."""
    pod = gated_pod()
    pod["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "user-queue"}
    pod["spec"]["schedulingGates"] = [{"name": GATE}, {"name": "example.com/hold"}]
    stored = created_through(spot_app(at_create), pod)
    app = spot_app(NEVER)
    admitted = kueue_admits(stored, {})
    admitted["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]
    assert update(app, "/validate", admitted, stored)["allowed"] is True
    answer = update(
        app,
        "/validate",
        kueue_admits(admitted, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION),
        admitted,
        userInfo={"username": "alice"},
    )
    assert answer["allowed"] is False and answer["status"]["reason"].startswith("SpotNeverUngated"), answer
    message = answer["status"]["message"]
    assert (
        "(example.com/hold, by alice)" in message and "Have what takes its gate away choose on-demand nodes." in message
    )
    assert "Kueue" not in message and "flavor" not in message.lower(), message
    on_demand = kueue_admits(admitted, {POOL: "h100-new"})
    assert update(app, "/validate", on_demand, admitted, userInfo={"username": "alice"})["allowed"] is True


def test_the_cuda_refusal_of_a_pod_kueue_placed_before_another_gate_went_gets_kueues_advice() -> None:
    """Found by a review of the ungating: Kueue admitted the pod to the old pool's flavor while another controller's
    gate was left, and the refusal of that controller's ungating (its CUDA too new for the old pool's driver) lacked
    the advice on the flavors' labels, only the gates taken by the last update being looked at. Kueue's gate, label
    or annotation on the pod says Kueue placed it, as for the spot advice."""
    app, recorder, sink = app_with()
    old = created(GATE, "example.com/data-ready")
    admitted_old = admitted(old, "h100-old", "example.com/data-ready")
    assert update(app, "/validate", admitted_old, old)["allowed"] is True, "another gate left: not reviewed"
    last = copy.deepcopy(admitted_old)
    del last["spec"]["schedulingGates"]
    ready = {"username": "system:serviceaccount:data:ready"}
    answer = update(app, "/validate", last, admitted_old, userInfo=ready)
    assert answer["allowed"] is False and answer["status"]["reason"] == "CUDAIncompatible", answer
    assert "(example.com/data-ready, by system:serviceaccount:data:ready)" in answer["status"]["message"]
    assert answer["status"]["message"].endswith(f"\n{pipeline.KUEUE_ADVICE}"), answer["status"]["message"]
    (event,) = sent(recorder, sink)
    assert event["message"].endswith(f"\n{pipeline.KUEUE_ADVICE}"), event["message"]
    admitted_new = admitted(old, "h100-new", "example.com/data-ready")
    last = copy.deepcopy(admitted_new)
    del last["spec"]["schedulingGates"]
    assert update(app, "/validate", last, admitted_new, userInfo=ready)["allowed"] is True


READY = {"username": "system:serviceaccount:data:ready"}


def set_while_gated(stored: dict[str, Any], selector: dict[str, str], *tolerations: dict[str, str]) -> dict[str, Any]:
    """A controller's update of the gated pod that adds ``selector`` and ``tolerations`` and takes its first gate
    away, the second left (not reviewed)."""
    out = kueue_admits(stored, selector, *tolerations)
    out["spec"]["schedulingGates"] = stored["spec"]["schedulingGates"][1:]
    return out


def test_a_never_pod_annotated_tolerate_while_gated_is_still_refused_where_its_notin_keeps_it_off_spot() -> None:
    """Found by a review of the spot policy: a pod created gated under never got the webhook's NotIn off spot
    capacity; a controller sent it to a spot pool while it was gated, and the user, told so, annotated it
    spot: tolerate in place. Its ungating was let through: the NotIn stays (an affinity cannot change), and it was
    Pending for good. Refused whatever its mode now; recreated under tolerate, as the advice says, it runs on spot."""
    app = spot_app(NEVER)
    pod = gated_pod()
    pod["spec"]["schedulingGates"] = [{"name": "example.com/a"}, {"name": "example.com/b"}]
    stored = created_through(app, pod)
    gated = set_while_gated(stored, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION)
    assert update(app, "/validate", gated, stored, userInfo=READY)["allowed"] is True, "a gate left: not reviewed"
    annotated = copy.deepcopy(gated)
    annotated["metadata"]["annotations"]["gpu-admission.io/spot"] = "tolerate"
    assert update(app, "/validate", annotated, gated, userInfo={"username": "alice"})["allowed"] is True
    answer = update(app, "/validate", kueue_admits(annotated, {}), annotated, userInfo=READY)
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngatedPending", answer
    message = answer["status"]["message"]
    said = "was created under spot never, and the spot tolerate it is under now (asked by annotation) does not undo"
    assert said in message, message
    assert "recreate it annotated gpu-admission.io/spot: tolerate" in message, message
    pod["metadata"]["annotations"] = {"gpu-admission.io/spot": "tolerate"}
    again = created_through(app, pod)
    gated = set_while_gated(again, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION)
    assert update(app, "/validate", kueue_admits(gated, {}), gated, userInfo=READY)["allowed"] is True


def test_a_spot_entry_set_while_gated_is_told_to_be_left_out_of_the_recreated_pod_not_changed() -> None:
    """Found by a review of the spot policy: a controller sent a gated pod, created under another mode, to a spot
    pool while it was gated, and the ungating under never was told to "have what set it choose on-demand nodes": an
    entry set stays (a gated pod's nodeSelector may only be added to). It is told to recreate the pod, what set the
    entry choosing on-demand nodes then; done so, the ungating passes."""
    off = spot_app(Settings())
    app = spot_app(NEVER)
    pod = gated_pod()
    pod["spec"]["schedulingGates"] = [{"name": "example.com/a"}, {"name": "example.com/b"}]
    stored = created_through(off, pod)
    gated = set_while_gated(stored, {POOL: "l4-spot"}, GKE_SPOT_TOLERATION)
    answer = update(app, "/validate", kueue_admits(gated, {}), gated, userInfo=READY)
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngated", answer
    message = answer["status"]["message"]
    assert "have what set it choose on-demand nodes" not in message, message
    assert "else with what set that while it was gated choosing on-demand nodes" in message, message
    again = created_through(app, pod)  # recreated, what set the entry choosing on-demand nodes this time
    gated = set_while_gated(again, {POOL: "h100-new"})
    assert update(app, "/validate", kueue_admits(gated, {}), gated, userInfo=READY)["allowed"] is True


def test_a_spot_entry_the_ungating_adds_to_the_pods_own_is_named_beside_it() -> None:
    """Found by a review of the spot policy: a pod created with a nodeSelector of its own on a spot pool, whose
    ungating by a controller added GKE's spot label, was told only to recreate it without its own entry; recreated
    so, the controller's spot label sent it to spot again (SpotNeverUngatedPending). Both are named, and the
    controller told to choose on-demand nodes."""
    app, pod, _, stored = _own_spot_pool_pod()
    answer = update(app, "/validate", kueue_admits(stored, {SPOT_LABEL: "true"}), stored, userInfo=READY)
    assert answer["allowed"] is False and answer["status"]["reason"] == "SpotNeverUngated", answer
    message = answer["status"]["message"]
    assert f"Its nodeSelector had {POOL}: l4-spot (spot capacity) before its last gate" in message, message
    said = f"and the update that takes it away adds {SPOT_LABEL}: true: have what takes its gate away choose on-demand"
    assert said in message, message
    without = created_through(app, pod)
    answer = update(app, "/validate", kueue_admits(without, {SPOT_LABEL: "true"}), without, userInfo=READY)
    assert answer["status"]["reason"] == "SpotNeverUngatedPending", "the controller's entry alone: refused again"
    assert update(app, "/validate", kueue_admits(without, {POOL: "h100-new"}), without, userInfo=READY)["allowed"]


def test_kueues_advice_stays_where_the_last_ungating_adds_a_toleration_of_its_own() -> None:
    """Found by a review of the ungating: Kueue admitted the pod to the old pool's flavor while another controller's
    gate was left, and that controller took its gate away adding a toleration of its own: the refusal lacked the
    advice on the flavors' labels, any change to the tolerations reading as the controller's placement. Kueue's
    flavor chose the place (the nodeSelector the update leaves as it was); a flavor on the new pool passes."""
    app, _, _ = app_with()
    old = created(GATE, "example.com/data-ready")
    own = {"key": "example.com/data", "operator": "Exists", "effect": "NoSchedule"}
    for pool, allowed in (("h100-old", False), ("h100-new", True)):
        placed = admitted(old, pool, "example.com/data-ready")
        assert update(app, "/validate", placed, old)["allowed"] is True, "another gate left: not reviewed"
        last = copy.deepcopy(placed)
        del last["spec"]["schedulingGates"]
        last["spec"]["tolerations"].append(own)
        answer = update(app, "/validate", last, placed, userInfo=READY)
        assert answer["allowed"] is allowed, answer
        if not allowed:
            assert answer["status"]["reason"] == "CUDAIncompatible", answer
            assert answer["status"]["message"].endswith(f"\n{pipeline.KUEUE_ADVICE}"), answer["status"]["message"]


def spot_and_cuda_refused(image: str, annotations: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pod created on spot (its own nodeSelector and toleration) while only drivers of CUDA 12.8 were there, then
    ungated by Kueue onto spot pool l4-spot (driver 535) under spot never: refused for spot (the long advice of a
    pod created with its own spot nodeSelector) and for CUDA. The answer and the Event."""
    spot_taint = {"key": SPOT_LABEL, "value": "true", "effect": "NoSchedule"}
    new, old = nodes()
    h100_spot, l4_spot = copy.deepcopy(new), copy.deepcopy(old)
    h100_spot["metadata"]["name"], l4_spot["metadata"]["name"] = "spot-new", "spot-old"
    h100_spot["metadata"]["labels"].update({POOL: "h100-spot", SPOT_LABEL: "true"})
    l4_spot["metadata"]["labels"].update({POOL: "l4-spot", SPOT_LABEL: "true"})
    h100_spot["spec"]["taints"] = l4_spot["spec"]["taints"] = [spot_taint]
    pod = gated_pod()
    pod["spec"]["containers"][0]["image"] = image
    pod["metadata"] |= {"annotations": annotations, "labels": {"kueue.x-k8s.io/queue-name": "user-queue"}}
    pod["spec"] |= {"nodeSelector": {SPOT_LABEL: "true"}, "tolerations": [GKE_SPOT_TOLERATION]}
    at_create = Settings()
    result = pipeline.review(
        pod, Context(settings=at_create, cluster=build_view([new, h100_spot], at_create), namespace="ml")
    )
    assert result.allowed, result.message
    stored = result.object
    stored["metadata"]["uid"] = str(uuid.uuid4())
    settings = dataclasses.replace(NEVER, audit=AuditSettings(event_queue_size=10))
    app, recorder, sink = app_with(settings, over=[new, h100_spot, l4_spot])
    answer = update(app, "/validate", kueue_admits(stored, {POOL: "l4-spot"}), stored)
    assert answer["auditAnnotations"]["decision"] == "denied (SpotNeverUngated, CUDAIncompatible)", answer
    (event,) = [e for e in sent(recorder, sink) if e["reason"] == "UngateRefused"]
    return answer, event


def test_a_spot_refusals_advice_is_whole_in_the_event_beside_a_cuda_refusal() -> None:
    """Found by a review of the reporting: the spot refusal's advice was kept whole only where 120 characters before
    it still fitted, else the line was cut in its middle, the advice with it (a spot refusal and a CUDA one, the
    spot advice of 563 characters). The advice is whole; what comes before it is cut to the room left."""
    answer, event = spot_and_cuda_refused(IMAGE, {})
    spot_refusal = refusals_of(answer)[0]
    advice = spot_refusal[spot_refusal.index("Its nodeSelector had") :]
    assert len(event["message"]) <= events.MESSAGE_LIMIT
    _, spot_said, cuda_said, tail = event["message"].split("\n")
    assert spot_said.startswith("pod ml/trainer is under spot never") and spot_said.endswith(f"… {advice}"), spot_said
    assert cuda_said.startswith(f"container trainer (image {IMAGE}) needs CUDA 12.8"), cuda_said
    assert tail == CUT, tail


def test_the_start_of_a_cuda_refusal_of_an_image_pinned_by_digest_keeps_the_cuda_it_needs() -> None:
    """Found by a review of the reporting: a second reason's refusal was shown by its first 120 characters, and of
    an image pinned by its digest they were all image: no word of the CUDA it needs. The image is cut in its
    middle instead, and the start says the container, the image's ends and the CUDA."""
    image = f"us-docker.pkg.dev/acme-ml-prod/training/llm-finetune@sha256:{'ab' * 32}"
    answer, event = spot_and_cuda_refused(image, {"gpu-admission.io/cuda-version": "12.8"})
    cuda_refusal, cuda_said = refusals_of(answer)[1], event["message"].split("\n")[2]
    assert cuda_refusal.startswith(cuda_said.removesuffix("…")) and "needs CUDA 12.8" in cuda_said, cuda_said
    start = pipeline._start(cuda_refusal, pipeline.EVENT_WHAT_LEAST)
    said = re.fullmatch(r"container trainer \(image (.+)…(.+)\) needs CUDA 12\.8 \(from annotation .*", start)
    assert said is not None and image.startswith(said[1]) and image.endswith(said[2]), start
    assert len(start) <= pipeline.EVENT_WHAT_LEAST, start


@pytest.mark.parametrize(
    ("image", "suffix"),
    [("nvcr.io/nvidia/pytorch:25.01-py3", ""), (IMAGE, "-gpu-pool-us-central1")],
    ids=["forward-compatibility-said", "long-pool-names"],
)
def test_kueues_advice_stays_in_the_event_of_one_long_cuda_refusal(image: str, suffix: str) -> None:
    """Found by a review of the reporting: one CUDA refusal long enough (an NGC image's forward-compatibility
    words, or long pool names) left Kueue's advice out of the Event, the refusal kept whole in its stead. Kueue's
    advice and the refusal's own are whole; what comes before the refusal's advice is cut."""
    renamed = nodes()
    for node in renamed:
        node["metadata"]["labels"][POOL] += suffix
    settings = Settings(audit=AuditSettings(event_queue_size=10))
    app, recorder, sink = app_with(settings, over=renamed)
    pod = gpu_pod("trainer", image=image)
    pod["metadata"] = {"name": "trainer", "namespace": "ml", "labels": {"kueue.x-k8s.io/queue-name": "user-queue"}}
    pod["spec"]["schedulingGates"] = [{"name": GATE}]
    stored = created_through(app, pod)
    answer = update(app, "/validate", admitted(stored, "h100-old" + suffix), stored)
    refusal, advice = refusals_of(answer)
    assert advice == pipeline.KUEUE_ADVICE
    (event,) = [e for e in sent(recorder, sink) if e["reason"] == "UngateRefused"]
    _, said, advice_said, tail = event["message"].split("\n")
    fix = refusal[refusal.index("To fix: ") :]
    assert said.startswith("container trainer (image ") and said.endswith(f"… {fix}"), said
    assert advice_said == pipeline.KUEUE_ADVICE and len(event["message"]) <= events.MESSAGE_LIMIT
    assert tail == CUT, tail


def test_every_ungating_event_keeps_to_the_limit_with_the_first_advice_and_kueues_whole() -> None:
    """Found by reviews of the reporting: room set aside for the Event's last line, not the line written, made
    Events over 1024 characters, which the relay then cut in their middle, through the advice; then Kueue's advice
    was said with no CUDA refusal, or left out where it fitted. Seeded random containers (names, images, alike or
    not), gates and updaters: every Event is within the limit; it is the whole refusal or ends with a short last
    line saying it is cut; it holds the first refusal's advice whole; Kueue's advice only where the answer has it
    and a CUDA refusal's start is said, and always where the head, the first refusal's start and advice, Kueue's
    advice and the last line fit."""
    rng = random.Random(7)
    settings = Settings()
    view = build_view(nodes(), settings)

    def word(least: int, most: int) -> str:
        return "".join(rng.choice("abcdefghij0123456789-") for _ in range(rng.randint(least, most))).strip("-") or "x"

    images = [IMAGE, "nvcr.io/nvidia/pytorch:25.01-py3", "pytorch/pytorch-nightly:2710000-cu12.6"]
    refused_cases, cut_cases, kueue_cases = 0, 0, 0
    for case in range(2000):
        named = list(dict.fromkeys(f"c{word(0, 62)}"[:63] for _ in range(rng.randint(1, 6))))
        own = [f"registry.example.com/{word(1, 80)}:{word(1, 20)}-cu12.{rng.choice('4678')}" for _ in range(2)]
        gates = [f"example.com/{word(1, 50)}" for _ in range(rng.randint(0, 4))] + [GATE]
        pod = gpu_pod("x", image=IMAGE)
        pod["metadata"] = {"name": "trainer", "namespace": "ml", "labels": {"kueue.x-k8s.io/queue-name": "q"}}
        pod["spec"]["containers"] = [
            {**pod["spec"]["containers"][0], "name": n, "image": rng.choice(images + own)} for n in named
        ]
        pod["spec"]["schedulingGates"] = [{"name": g} for g in gates]
        result = pipeline.review(pod, Context(settings=settings, cluster=view, namespace="ml"))
        assert result.allowed, result.message
        old = result.object
        username = rng.choice([KUEUE, f"oidc:{word(1, 300)}@example.com"])
        ctx = Context(settings, view, "ml", "UPDATE", username, old_object=old)
        refused = pipeline.validate(admitted(old, "h100-old"), ctx)
        if refused.allowed:
            continue
        (event,) = [e for e in refused.outcome.events if e.reason == "UngateRefused"]
        refused_cases += 1
        first = escaped(refused.outcome.denials[0].message)
        fix = first[first.index("To fix: ") :]
        lines = event.message.split("\n")
        assert len(event.message) <= events.MESSAGE_LIMIT and lines[1].endswith(fix), (case, event.message)
        last = re.fullmatch(
            rf"(cut to fit|and \d+ more refusals?)( \(containers .*\))?: {pipeline.EVENT_WHOLE} more", lines[-1]
        )
        assert last is None or len(lines[-1]) - len(last[2] or "") <= 80, (case, lines[-1])
        # a cut says so, also of the gates or the updater
        assert last is not None or ("…" not in event.message and username in lines[0]), (case, event.message)
        kueue = pipeline.KUEUE_ADVICE in event.message
        first_cuda = refused.outcome.denials[0].policy == cuda.POLICY  # said by its advice at least
        assert not kueue or (pipeline.KUEUE_ADVICE in refused.message and (first_cuda or "needs CUDA" in event.message))
        tail = pipeline._left_out(pipeline._refusals(refused.outcome.denials)[1:], False)  # the short last line
        least = len(lines[0]) + len(f"… {fix}") + len(pipeline.KUEUE_ADVICE) + len(tail) + 3
        if pipeline.KUEUE_ADVICE in refused.message and first_cuda:
            assert kueue or least > events.MESSAGE_LIMIT, (case, event.message)
        cut_cases += last is not None
        kueue_cases += kueue
    # the cases reach what is asserted: refusals, Events cut, and Kueue's advice said (none did, the test passed)
    assert refused_cases > 1000 and cut_cases > 100 and kueue_cases > 100, (refused_cases, cut_cases, kueue_cases)


def cuda_denial(name: str, before: int, fix: int, image: str = IMAGE) -> Denial:
    """A CUDA refusal of container ``name`` whose words before its advice and whose advice run to about ``before``
    and ``fix`` characters (the pools it names)."""
    pools = "".join(f", pool legacy-{i:03} (driver 535.104.05, CUDA 12.2)" for i in range(before // 40))
    said = f" (image {image}) needs CUDA 12.8 (from image tag), but no node it can run on supports it{pools}."
    advice = (
        "To fix: Use an image built for CUDA <= 12.2; or upgrade the driver on pool " + "p" * max(fix - 80, 1) + "."
    )
    return Denial(cuda.POLICY, "CUDAIncompatible", f"container {name}{said} {advice}", containers=(name,))


SPOT_DENIAL = Denial(
    "spot",
    "SpotNeverUngatedPending",
    "pod ml/trainer is under spot never (default for namespace ml): the required node affinity the webhook wrote at "
    "its create keeps it off spot capacity, yet its nodeSelector now sends it to spot pool h100-old alone: it would "
    "stay Pending for good. Have Kueue admit it to a ResourceFlavor of on-demand nodes only, in a ClusterQueue whose "
    "flavors are not spot, then delete it and recreate it for Kueue to admit it again. Or delete it and recreate it "
    "annotated gpu-admission.io/spot: tolerate to let it run on spot (a pod's affinity cannot change once created).",
    fix="Have Kueue admit it",
)
MIG_DENIAL = Denial(
    "mig",
    "MIGUnconverted",
    "container trainer still asks for gpu-admission.io/gpu-memory 20Gi: the mutating webhook did not turn it into a "
    "MIG profile, and no node offers that resource; ask for a MIG resource.",
    containers=("trainer",),
    fix="",
)


def test_kueues_advice_is_in_the_event_only_beside_a_cuda_refusal_it_says() -> None:
    """Found by a review of the reporting: an ungating refused for spot, MIG and CUDA got an Event of the spot
    refusal, the MIG one's start and Kueue's advice on the CUDA refusal, which it left out ('and 1 more refusal').
    Each reason's first refusal is said by its start before Kueue's advice, which comes only beside a CUDA one."""
    message = pipeline.ungate_event([SPOT_DENIAL, MIG_DENIAL, cuda_denial("trainer", 40, 320)], GATE, "", "x" * 330)
    head, spot_said, mig_said, cuda_said, *rest = message.split("\n")
    assert head.startswith("SpotNeverUngatedPending, MIGUnconverted, CUDAIncompatible: taking away"), head
    assert spot_said.startswith("pod ml/trainer is under spot never") and spot_said.endswith(
        SPOT_DENIAL.message[SPOT_DENIAL.message.index("Have Kueue") :]
    )
    assert mig_said.startswith("container trainer still asks for gpu-admission.io/gpu-memory 20Gi"), mig_said
    assert cuda_said.startswith(f"container trainer (image {IMAGE}) needs CUDA 12.8"), cuda_said
    assert rest == [CUT] and len(message) <= events.MESSAGE_LIMIT, rest


@pytest.mark.parametrize("fix", [820, 950], ids=["advice-fits", "advice-too-long"])
def test_the_last_line_of_an_event_is_kept_where_the_first_advice_is_long(fix: int) -> None:
    """Found by a review of the reporting: two CUDA refusals whose advice named many pools (on-demand pools to
    target, legacy pools to upgrade) got an Event of the first's advice and no last line: no word of the second
    refusal nor that it was cut. The last line stays, and where the advice and it are too long, the advice is cut
    in its middle."""
    first = cuda_denial("trainer", 200, fix)
    helper = cuda_denial("helper", 200, fix, image="pytorch/pytorch-nightly:2710000-cu12.6")
    message = pipeline.ungate_event([first, helper], GATE, "", pipeline.KUEUE_ADVICE)
    head, said, tail = message.split("\n")
    advice = first.message[first.message.index("To fix: ") :]
    assert head.startswith("CUDAIncompatible: taking away") and len(message) <= events.MESSAGE_LIMIT, message
    assert tail.startswith("and 1 more refusal") and tail.endswith(f": {pipeline.EVENT_WHOLE} more"), tail
    if len(f"… {advice}") + len(head) + len(tail) + 2 <= events.MESSAGE_LIMIT:
        assert said == f"… {advice}" and tail == f"and 1 more refusal (containers helper): {pipeline.EVENT_WHOLE} more"
    else:
        start, end = said.split("…", 2)[1:]
        assert said.startswith("… To fix: ") and advice.startswith(start.strip()) and advice.endswith(end), said


def test_kueues_advice_fits_beside_a_long_cuda_refusal_with_the_short_last_line() -> None:
    """Found by a review of the reporting: a CUDA refusal whose advice named three legacy pools left Kueue's advice
    out of the Event, which the head, the refusal's start and advice, Kueue's and a short last line fitted: the last
    line was 140 characters, the start 120. Both are shorter, and Kueue's advice is whole."""
    message = pipeline.ungate_event([cuda_denial("trainer", 300, 460)], GATE, "", pipeline.KUEUE_ADVICE)
    _, said, advice, tail = message.split("\n")
    assert said.startswith("container trainer (image ") and "needs CUDA 12.8" in said and said.count("…") == 1, said
    assert advice == pipeline.KUEUE_ADVICE and tail == CUT and len(message) <= events.MESSAGE_LIMIT, message


def test_kueues_advice_goes_before_the_start_of_a_cuda_refusal_whose_advice_is_long() -> None:
    """Found by a review of the reporting: one CUDA refusal whose advice named many legacy pools lost Kueue's advice
    from the Event: the refusal's start was said first, and Kueue's advice only beside a start, where the head, the
    refusal's advice, Kueue's and the last line fitted. A CUDA refusal said by its advice alone gets Kueue's."""
    denial = cuda_denial("trainer", 300, 540)
    message = pipeline.ungate_event([denial], GATE, "", pipeline.KUEUE_ADVICE)
    _, said, advice, tail = message.split("\n")
    assert said == f"… {denial.message[denial.message.index('To fix: ') :]}", said
    assert advice == pipeline.KUEUE_ADVICE and tail == CUT and len(message) <= events.MESSAGE_LIMIT, message


def test_the_start_of_many_containers_alike_keeps_the_cuda_they_need() -> None:
    """Found by a review of the reporting: the start of a refusal of twelve containers alike was all their names,
    cut before the CUDA they need. The list of names is shortened as the image is, still counting them all."""
    names = [f"prefetch-{i} (init)" for i in range(4)] + [f"worker-{i}" for i in range(8)]
    message = pipeline.ungate_event(
        [SPOT_DENIAL, *(cuda_denial(n, 40, 320) for n in names)], GATE, "", pipeline.KUEUE_ADVICE
    )
    cuda_said = message.split("\n")[2]
    said = re.match(
        r"container prefetch-0 \(init\) \(and (.*) and (\d+) more alike\) \(image .*\) needs CUDA 12", cuda_said
    )
    assert said is not None and len(said[1].split(", ")) + int(said[2]) == 11, cuda_said
    start = pipeline._start(pipeline._refusals([cuda_denial(n, 40, 320) for n in names])[0].text, 80)
    assert (
        start == "container prefetch-0 (init) (and 11 more alike) (image …) needs CUDA 12.8 (from image tag), but …"
    ), start


def test_an_event_without_a_denial_and_names_with_newlines_are_said_in_one_line_each() -> None:
    """Found by a review of the reporting: an ungating refused with no denial raised IndexError (the webhook must
    never answer 500), and the last line named the containers left out unescaped, a newline in a name starting a
    line of its own."""
    assert pipeline.ungate_event([], GATE, "", "") == (
        f"taking away the pod's last scheduling gate ({GATE}) is refused: {pipeline.EVENT_WHOLE} why"
    )
    denials = [cuda_denial("trainer", 40, 850), cuda_denial("a\nb", 40, 100, image="other:1")]
    lines = pipeline.ungate_event(denials, GATE, "", "").split("\n")
    assert lines[-1] == f"and 1 more refusal (containers a\\nb): {pipeline.EVENT_WHOLE} more", lines


@pytest.mark.parametrize(
    ("gates", "by"),
    [(", ".join(f"example.com/gate-{i:02}" for i in range(8)), ""), (GATE, ", by oidc:" + "u" * 400)],
    ids=["gates-cut", "updater-left-out"],
)
def test_an_event_that_leaves_gates_or_the_updater_out_says_where_the_whole_is_read(gates: str, by: str) -> None:
    """Found by a review of the reporting: every refusal fitted, the Event cut the list of gates (at
    ``EVENT_NAMES``) or left the updater out with no last line saying so, nor where the whole is read."""
    denial = cuda_denial("trainer", 40, 320)
    message = pipeline.ungate_event([denial], gates, by, pipeline.KUEUE_ADVICE)
    head, said, advice, tail = message.split("\n")
    assert said == denial.message and advice == pipeline.KUEUE_ADVICE and tail == CUT, message
    assert "…" in head if gates != GATE else head.endswith(f"({GATE}) is refused:"), head


def relayed(message: str) -> str:
    """``message`` as the relay reads it: the UngateRefused Event of a pod of the longest name, in the longest
    namespace, from a replica of the longest name, written by a worker to the relay's pipe (``EventPipe``)."""
    read_fd, write_fd = os.pipe()
    event = Event("UngateRefused", message, "Warning")
    body = events.event_body(subject_of(stored_pod("p" * 253)), "n" * 63, "p" * 253, event, "i" * 253)
    try:
        assert events.EventPipe(write_fd).submit(body)
        return str(json.loads(os.read(read_fd, 1 << 16))["message"])
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_message_of_the_bytes_it_may_take_reaches_the_relay_whole_beside_the_longest_names() -> None:
    """``events.MESSAGE_BYTES`` leaves room in the relay's pipe line for the rest of an Event at its longest."""
    most = "é" * (events.MESSAGE_BYTES // 6)
    assert events.line_bytes(most) > events.MESSAGE_BYTES - 6 and relayed(most) == most


@pytest.mark.parametrize(
    ("names", "by", "advice"),
    [
        (["trainer"], "山田太郎" * 90, pipeline.KUEUE_ADVICE),
        (["trainer"], "🚀" * 200, pipeline.KUEUE_ADVICE),
        ([f"{'🚀' * 60}-{i}" for i in range(8)], "", ""),
    ],
    ids=["cjk-updater", "emoji-updater", "emoji-names"],
)
def test_an_event_of_names_outside_ascii_reaches_the_relay_with_its_advice_and_last_line(
    names: list[str], by: str, advice: str
) -> None:
    """Found by a review of the reporting: the relay's pipe line is JSON, each character outside ASCII written
    ``\\uXXXX`` (6 bytes, an emoji 12), and a worker writes at most ``select.PIPE_BUF`` bytes whole; an Event of
    1,024 characters, an updater or container names in CJK or emoji, was cut at the relay to its first 200
    characters, its advice and last line lost. It reaches the relay whole: the first refusal's advice, Kueue's, and a
    last line saying it is cut."""
    denials = [
        cuda_denial(name, 0, 100, image=f"pytorch/pytorch-nightly:27100{i:02}-cu12.8") for i, name in enumerate(names)
    ]
    message = pipeline.ungate_event(denials, GATE, escaped(f", by oidc:{by}" if by else ""), advice)
    assert relayed(message) == message and len(message) <= events.MESSAGE_LIMIT, message
    lines = message.split("\n")
    first = denials[0].message
    assert lines[1].endswith(first[first.index("To fix: ") :]) and (not advice or advice in lines), message
    assert re.fullmatch(rf"(cut to fit|and \d+ more refusals?): {pipeline.EVENT_WHOLE} more", lines[-1]), message


def test_a_refused_ungatings_event_is_made_where_a_pipe_takes_512_bytes_whole() -> None:
    """Found by a review of the reporting: where ``select.PIPE_BUF`` is 512 (macOS, the BSDs: ``make run`` there),
    ``events.MESSAGE_BYTES`` came out negative, no Event fitted, and making one never ended: the worker hung on every
    refused ungating. Run where a pipe takes 512 bytes whole, it is made, within the least the relay keeps."""
    script = (
        "import select; select.PIPE_BUF = 512\n"
        "from tests.test_ungate import GATE, cuda_denial\n"
        "from webhook import events, pipeline\n"
        "denials = [cuda_denial(f'c{i}', 40, 320) for i in range(3)]\n"
        "message = pipeline.ungate_event(denials, GATE, ', by kueue', pipeline.KUEUE_ADVICE)\n"
        "print(events.MESSAGE_BYTES, events.line_bytes(message))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    most, size = map(int, done.stdout.split())
    assert most == events.SHORT_MESSAGE and size <= most, done.stdout


def test_an_answer_cut_to_its_limit_keeps_kueues_advice_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by a review of the reporting: an answer of many refusals was cut at its end to its limit (8,000
    characters), and Kueue's advice, its last line, was lost there while the Event kept it. The refusals are cut
    before the advice; the advice stays whole."""
    monkeypatch.setattr(pipeline, "MESSAGE_LIMIT", 1500)
    app, _, _ = app_with()
    images = [f"pytorch/pytorch-nightly:27100{i:02}-cu12.{6 + i % 3}" for i in range(4)]
    old = created(GATE, containers=[(f"worker-{i}", image) for i, image in enumerate(images)])
    answer = update(app, "/validate", admitted(old, "h100-old"), old)
    message = answer["status"]["message"]
    assert len(message) <= 1500 and message.endswith(f"…\n{pipeline.KUEUE_ADVICE}"), message

"""Replicas answered from their bytes: the same answer as the whole way, for exactly the bodies that allow it."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as examples
from hypothesis import strategies as st

from tests.conftest import review
from tests.test_decisions import STEERED, controlled, two_driver_view
from tests.test_events import Recording, stored_pod
from tests.test_fuzz import FUZZ, objects
from webhook import decisions, model, pipeline, replay
from webhook.admission import parse_review
from webhook.app import create_app
from webhook.audit import build_recorder
from webhook.cluster import ClusterView, StaticCluster
from webhook.config import CudaSettings, Settings
from webhook.errors import BadRequest
from webhook.events import EventQueue

JSON_TYPE = "application/json"


def replica(pod: dict[str, Any], n: int, stored: bool = True) -> dict[str, Any]:
    """The AdmissionReview of a ReplicaSet's n-th pod as the apiserver sends it: a uid per request and, once stored
    (/validate), the pod's generated name, uid, creation time and managed fields' time, all of one length."""
    obj = copy.deepcopy(pod)
    meta = obj.setdefault("metadata", {})
    meta.pop("name", None)
    meta["generateName"] = "trainer-7d9f5c-"
    notes = meta.setdefault("annotations", {})
    if isinstance(notes, dict):
        notes.setdefault("team", "t0000")
    name = ""
    if stored:
        name = f"trainer-7d9f5c-{n:05d}"
        meta.update(
            name=name,
            uid=f"0d6f3c1e-2222-4a7b-9c55-{n:012d}",
            creationTimestamp=f"2026-12-01T08:{n % 60:02d}:00Z",
            managedFields=[{"manager": "kube-controller-manager", "time": f"2026-12-01T08:{n % 60:02d}:00Z"}],
        )
    return review(obj, uid=f"a1b2c3d4-0000-4000-8000-{n:012d}", name=name)


def controlled_review(pod: dict[str, Any], n: int, kind: str, stored: bool = True) -> dict[str, Any]:
    """The AdmissionReview of an Indexed Job's or a StatefulSet's n-th pod (``tests.test_decisions.controlled``);
    under ten, the bodies of one kind are of one length."""
    obj = controlled(pod, n, kind)
    meta = obj["metadata"]
    meta["labels"]["app"] = "trainer"
    del meta["generation"], meta["resourceVersion"]  # a number, and set once stored: a create's review has neither
    if kind in ("Job", "JobSet"):  # a generated name: none at /mutate, the prefix and five characters at /validate
        meta["name"] = f"{meta['generateName']}{n:05d}"
    if not stored:
        for key in ("uid", "creationTimestamp", "managedFields"):
            del meta[key]
        if kind in ("Job", "JobSet"):
            del meta["name"]
    return review(obj, uid=f"a1b2c3d4-0000-4000-8000-{n:012d}", name=meta.get("name", ""))


def body(rev: dict[str, Any], compact: bool = True) -> bytes:
    return json.dumps(rev, separators=(",", ":") if compact else None).encode()


def step(endpoint: str) -> decisions.Step:
    return pipeline.mutate if endpoint == "mutate" else pipeline.validate


def whole_way(endpoint: str, data: bytes, settings: Settings, view: ClusterView) -> Any:
    """What a webhook that keeps nothing answers: a fresh snapshot (empty stores) for every request."""
    try:
        _, result, answer = decisions.decide(endpoint, step(endpoint), data, JSON_TYPE, settings, fresh(view))
    except BadRequest as err:
        return ("error", err.status, str(err))
    return json.loads(answer), result.decision, result.outcome.events


def fresh(view: ClusterView) -> ClusterView:
    return dataclasses.replace(view)


def decide(endpoint: str, data: bytes, settings: Settings, view: ClusterView) -> Any:
    try:
        _, result, answer = decisions.decide(endpoint, step(endpoint), data, JSON_TYPE, settings, view)
    except BadRequest as err:
        return ("error", err.status, str(err))
    return json.loads(answer), result.decision, result.outcome.events


def learned() -> tuple[Settings, ClusterView]:
    """Settings and a snapshot that have seen two replicas of STEERED at /validate: a template is kept."""
    settings = Settings()
    view = two_driver_view(settings)
    for n in (1, 2):
        decide("validate", body(replica(STEERED, n)), settings, view)
    return settings, view


class Unparsed:
    """parse_review replaced by one that fails the test: what it answers came from the bytes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def refuse(*args: Any) -> Any:
            raise AssertionError("the body was parsed")

        monkeypatch.setattr(decisions, "parse_review", refuse)


# -- the template -------------------------------------------------------------------------------------------------
def test_every_identity_string_of_an_object_is_metadata_no_policy_reads() -> None:
    """A slot's string may differ between replicas only because no policy reads it: the object's places that
    ``identity_strings`` names are keys of ``decisions.IDENTITY`` (what the shape of an answer leaves out)."""
    rev = replica(STEERED, 1)
    meta = rev["request"]["object"]["metadata"]
    meta.update(creationTimestamp="2026-01-01T00:00:00Z", resourceVersion="7", managedFields=[{"time": "t"}])
    places = {(id(where), key) for _, where, key in replay.identity_strings(rev)}
    object_keys = {key for _, where, key in replay.identity_strings(rev) if where is meta}
    assert object_keys and object_keys <= decisions.IDENTITY
    managed = {key for _, where, key in replay.identity_strings(rev) if where is meta["managedFields"][0]}
    assert managed == {"time"} and "managedFields" in decisions.IDENTITY
    assert (id(rev["request"]), "uid") in places  # the request's own: not part of the object's shape at all
    indexed = controlled_review(STEERED, 1, "Job")
    obj = indexed["request"]["object"]
    per_pod = {(key, id(where)) for _, where, key in replay.identity_strings(indexed)}
    meta = obj["metadata"]
    assert {k for k, w in per_pod if w == id(meta["labels"])} == {"batch.kubernetes.io/job-completion-index"}
    assert {k for k, w in per_pod if w == id(meta["annotations"])} <= model.PER_POD_ANNOTATIONS
    assert {k for k, w in per_pod if w == id(obj["spec"])} == {"hostname"} < model.PER_POD_SPEC
    labels = controlled_review(STEERED, 1, "StatefulSet")["request"]["object"]["metadata"]["labels"]
    assert set(labels) - {"app"} == {"statefulset.kubernetes.io/pod-name", "apps.kubernetes.io/pod-index"}
    child = controlled_review(STEERED, 1, "JobSet")
    meta = child["request"]["object"]["metadata"]
    found = {(key, id(where)) for _, where, key in replay.identity_strings(child)}
    assert {k for k, w in found if w == id(meta["ownerReferences"][0])} == model.PER_POD_OWNER == {"name", "uid"}
    assert {k for k, w in found if w == id(meta["labels"])} == set(meta["labels"]) & model.PER_POD_LABELS
    assert {"jobset.sigs.k8s.io/jobset-name", "app"} <= set(meta["labels"]) - model.PER_POD_LABELS  # the JobSet's
    worker = controlled_review(STEERED, 1, "LeaderWorkerSet")
    obj = worker["request"]["object"]
    meta, spec = obj["metadata"], obj["spec"]
    found = {(key, id(where)) for _, where, key in replay.identity_strings(worker)}
    assert {k for k, w in found if w == id(spec)} == {"hostname", "subdomain"} == model.PER_POD_SPEC
    assert {k for k, w in found if w == id(meta["annotations"])} == {"leaderworkerset.sigs.k8s.io/leader-name"}
    lws_labels = {k for k, w in found if w == id(meta["labels"])}
    assert "leaderworkerset.sigs.k8s.io/worker-index" in lws_labels
    assert "leaderworkerset.sigs.k8s.io/name" in set(meta["labels"]) - lws_labels  # the LeaderWorkerSet's own
    env = spec["containers"][0]["env"]
    lws_env = {"LWS_WORKER_INDEX", "LWS_LEADER_ADDRESS"}
    assert {e["name"] for e in env if (id(e), "value") in {(w, k) for k, w in found}} == lws_env < model.PER_POD_ENV
    assert "LWS_GROUP_SIZE" in {e["name"] for e in env} - model.PER_POD_ENV
    for kind, rank in (("PyTorchJob", "RANK"), ("TFJob", "TF_CONFIG")):
        worker = controlled_review(STEERED, 1, kind)
        meta, spec = worker["request"]["object"]["metadata"], worker["request"]["object"]["spec"]
        found = {(key, id(where)) for _, where, key in replay.identity_strings(worker)}
        assert {k for k, w in found if w == id(meta["labels"])} == {"training.kubeflow.org/replica-index"}
        assert "training.kubeflow.org/replica-type" in set(meta["labels"]) - model.PER_POD_LABELS  # master, worker
        env = spec["containers"][0]["env"]
        assert {e["name"] for e in env if (id(e), "value") in {(w, k) for k, w in found}} == {rank}
        assert rank in model.PER_POD_ENV and "MASTER_ADDR" not in model.PER_POD_ENV
    executor = controlled_review(STEERED, 1, "SparkExecutor")
    meta, spec = executor["request"]["object"]["metadata"], executor["request"]["object"]["spec"]
    found = {(key, id(where)) for _, where, key in replay.identity_strings(executor)}
    assert {k for k, w in found if w == id(meta["labels"])} == {"spark-exec-id"}
    assert {k for k, w in found if w == id(spec)} == {"hostname"}
    env = spec["containers"][0]["env"]
    assert {e["name"] for e in env if (id(e), "value") in {(w, k) for k, w in found}} == {"SPARK_EXECUTOR_ID"}


def test_a_learning_that_fails_still_answers(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Learning is a saving: an exception in it is logged, and the request gets the answer it already has."""

    def broken(*args: Any) -> None:
        raise RuntimeError("learning broke")

    monkeypatch.setattr(replay, "learn", broken)
    settings = Settings()
    view = two_driver_view(settings)
    answers = [decide("validate", body(replica(STEERED, n)), settings, view) for n in (1, 2, 3)]
    assert [a[1] for a in answers] == ["allowed"] * 3
    assert answers[2] == whole_way("validate", body(replica(STEERED, 3)), settings, view)
    assert "cannot learn a template" in caplog.text and "learning broke" in caplog.text


def test_a_spent_template_is_kept_again_after_its_store_was_emptied(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replays' store empties when full (other workloads' templates): a template whose learning tries are spent
    is put back by the next replica that takes the whole way, and the one after is answered unparsed again."""
    settings, view = learned()
    data = body(replica(STEERED, 3))
    (known,) = view.replays.get(("validate", len(data)))
    known.stored.tries = 0  # widened as often as it may be
    for n in range(view.replays.entries):  # other workloads fill the store: it empties
        view.replays.put(("validate", -n), ())
    assert view.replays.get(("validate", len(data))) is None
    assert decide("validate", data, settings, view)[1] == "allowed"  # the whole way; the template is kept again
    assert view.replays.get(("validate", len(data)))[0].stored is known.stored
    Unparsed(monkeypatch)
    assert decide("validate", body(replica(STEERED, 4)), settings, view)[1] == "allowed"


def test_a_template_put_back_by_another_replica_still_names_its_replays_after_their_own_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One pod's request sent again (only the request's uid differs) makes a template of one slot. Put back by
    another replica's request once the replays' store emptied, its replays are what they are: that pod, not the
    replica that put it back (its Events and decision log line would name another pod)."""
    settings = Settings()
    view = two_driver_view(settings)
    sent = [replica(STEERED, 1) for _ in range(3)]
    for n, rev in enumerate(sent):
        rev["request"]["uid"] = f"a1b2c3d4-0000-4000-8000-{90 + n:012d}"
    for rev in sent[:2]:
        decide("validate", body(rev), settings, view)
    (known,) = view.replays.get(("validate", len(body(sent[0]))))
    assert known.template.labels == ("uid",)
    known.stored.tries = 0  # widened as often as it may be
    for n in range(view.replays.entries):  # other workloads fill the store: it empties
        view.replays.put(("validate", -n), ())
    decide("validate", body(replica(STEERED, 2)), settings, view)  # another pod of the shape: the template put back
    data = body(sent[2])
    expected, _, fresh_answer = decisions.decide("validate", step("validate"), data, JSON_TYPE, settings, fresh(view))
    Unparsed(monkeypatch)
    got, result, answer = decisions.decide("validate", step("validate"), data, JSON_TYPE, settings, view)
    assert result.replayed and answer == fresh_answer
    assert dataclasses.replace(got, object=None, old_object=None) == dataclasses.replace(expected, object=None)
    assert got.subject.name == "trainer-7d9f5c-00001"


@pytest.mark.parametrize("compact", [True, False])
@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_from_the_third_replica_on_the_body_is_not_parsed(
    endpoint: str, compact: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings()
    view = two_driver_view(settings)
    stored = endpoint == "validate"
    bodies = [body(replica(STEERED, n, stored), compact) for n in range(1, 6)]
    expected = [whole_way(endpoint, b, settings, view) for b in bodies]
    got = [decide(endpoint, b, settings, view) for b in bodies[:2]]
    assert len(view.replays) == 1
    Unparsed(monkeypatch)
    got += [decide(endpoint, b, settings, view) for b in bodies[2:]]
    assert got == expected
    assert [g[0]["response"]["uid"] for g in got] == [f"a1b2c3d4-0000-4000-8000-{n:012d}" for n in range(1, 6)]
    if endpoint == "mutate":
        assert got[4][0]["response"]["patch"]  # the steering patch, replayed


# A TFJob's pods are not among them: their TF_CONFIG is JSON inside a string (escaped quotes), which no slot holds;
# they are answered from their shape (tests/test_decisions.py), parsed each time.
@pytest.mark.parametrize("kind", ["Job", "StatefulSet", "JobSet", "LeaderWorkerSet", "PyTorchJob", "SparkExecutor"])
@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_the_pods_of_an_indexed_job_a_statefulset_or_a_jobset_are_replayed(
    endpoint: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Their index, in labels, an annotation, the hostname and the generated name (and a JobSet's child Job's name,
    uid and indexes), are more identity strings: from the third pod on, unparsed, with the answer the whole way
    gives, and logged under each pod's own names."""
    settings = Settings()
    view = two_driver_view(settings)
    cluster = StaticCluster(view)
    log = io.StringIO()
    client = create_app(settings, cluster=cluster, recorder=build_recorder(settings, cluster, stream=log)).test_client()
    stored = endpoint == "validate"
    bodies = [body(controlled_review(STEERED, n, kind, stored)) for n in range(1, 6)]
    assert len(set(map(len, bodies))) == 1
    expected = [whole_way(endpoint, b, settings, view)[0] for b in bodies]
    got = [client.post(f"/{endpoint}", data=b, content_type=JSON_TYPE).get_json() for b in bodies[:2]]
    Unparsed(monkeypatch)
    got += [client.post(f"/{endpoint}", data=b, content_type=JSON_TYPE).get_json() for b in bodies[2:]]
    assert got == expected
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [line.get("replayed", False) for line in lines] == [False, False, True, True, True]
    objects = [json.loads(b)["request"]["object"]["metadata"] for b in bodies]
    assert [line["name"] for line in lines] == [m.get("name", "") for m in objects]
    assert [line["generateName"] for line in lines] == [m.get("generateName", "") for m in objects]


def test_a_first_body_of_another_length_does_not_stop_the_learning(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings()
    view = two_driver_view(settings)
    decide("validate", body(replica(STEERED, 1), compact=False), settings, view)  # spaces: another length
    for n in (2, 3):
        decide("validate", body(replica(STEERED, n)), settings, view)
    Unparsed(monkeypatch)
    assert decide("validate", body(replica(STEERED, 4)), settings, view)[0]["response"]["allowed"]


def test_the_slots_are_the_identity_strings_and_named() -> None:
    first, second = body(replica(STEERED, 1)), body(replica(STEERED, 2))
    template = replay.learn(first, second)
    assert template is not None
    assert sorted(template.labels) == sorted(["uid", "name", "object.name", "object.uid", "-", "-"])
    texts = dict(zip(template.labels, template.match(body(replica(STEERED, 7))) or [], strict=True))
    assert texts["uid"] == "a1b2c3d4-0000-4000-8000-000000000007"
    assert texts["name"] == texts["object.name"] == "trainer-7d9f5c-00007"
    assert texts["object.uid"] == "0d6f3c1e-2222-4a7b-9c55-000000000007"


def _edit(rev: dict[str, Any], where: str, n: int) -> dict[str, Any]:
    """``rev`` with one more string made its own for replica ``n``, at the same length."""
    out = copy.deepcopy(rev)
    obj = out["request"]["object"]
    if where == "image":  # CUDA 12.3 as the replicas have it, or 12.4 or 12.5
        c = obj["spec"]["containers"][0]
        c["image"] = c["image"].replace("12.3", f"12.{2 + n % 4}")
    elif where == "annotation":
        obj["metadata"]["annotations"]["team"] = f"t{n:04d}"
    elif where == "username":
        out["request"]["userInfo"]["username"] = f"bob{n:02d}"
    elif where == "namespace":
        out["request"]["namespace"] = f"ns{n:05d}"
    return out


@pytest.mark.parametrize("where", ["image", "annotation", "username", "namespace"])
def test_bodies_that_differ_in_anything_else_learn_no_template(where: str) -> None:
    first, second = (body(_edit(replica(STEERED, n), where, n)) for n in (2, 3))
    assert len(first) == len(second)
    assert replay.learn(first, second) is None


def _without_uid(decided: Any) -> dict[str, Any]:
    """An answer's response without the uid it echoes."""
    return {k: v for k, v in decided[0]["response"].items() if k != "uid"}


@pytest.mark.parametrize("where", ["image", "annotation", "username", "namespace"])
def test_a_body_that_differs_elsewhere_is_answered_the_whole_way(where: str) -> None:
    settings = Settings()
    view = two_driver_view(settings)
    for endpoint in ("mutate", "validate"):
        stored = endpoint == "validate"
        for n in (1, 2):
            decide(endpoint, body(replica(STEERED, n, stored)), settings, view)
        other = body(_edit(replica(STEERED, 3, stored), where, 3))
        assert len(other) == len(body(replica(STEERED, 3, stored)))
        assert decide(endpoint, other, settings, view) == whole_way(endpoint, other, settings, view)
    assert len(view.replays) == 2
    if where == "image":  # CUDA 12.5 fits neither pool: another answer than the replicas' (steered to one)
        replicas = decide("mutate", body(replica(STEERED, 4, False)), settings, view)
        other = decide("mutate", body(_edit(replica(STEERED, 5, False), where, 3)), settings, view)
        assert _without_uid(other) != _without_uid(replicas)  # not only in the uid each echoes


def test_a_key_that_ends_like_an_identity_key_is_no_slot() -> None:
    """``"x\\"name":"..."`` holds the text ``"name":"`` but is another key: its value is no identity string."""
    revs = [replica(STEERED, n) for n in (1, 2)]
    for n, rev in enumerate(revs):
        rev["request"]["object"]["metadata"]["annotations"] = {'x"name': f"v{n}"}
    assert replay.learn(body(revs[0]), body(revs[1])) is None


def test_an_identity_string_that_looks_like_a_mark_proves_nothing() -> None:
    """Bodies that differ in an annotation only, whose pod uid is the text of slot 0's mark (``\\u00000``): the
    mark found at the uid is not the slot's own."""
    revs = [replica(STEERED, 1) for _ in (1, 2)]
    for n, rev in enumerate(revs):
        rev["request"]["object"]["metadata"]["uid"] = "\x000"
        rev["request"]["object"]["metadata"]["annotations"]["team"] = f"t{n:04d}"
    first, second = body(revs[0]), body(revs[1])
    assert b'"uid":"\\u00000"' in first
    assert replay.learn(first, second) is None


@pytest.mark.parametrize("name", ["\x00\u00b2", "\x00" + "9" * 5000])
def test_a_name_like_a_mark_that_is_no_number_is_just_a_name(name: str) -> None:
    """``\\u0000`` and then what ``str.isdigit`` takes but ``int`` does not: a name, answered as the whole way
    answers it (it was a 500)."""
    settings = Settings()
    view = two_driver_view(settings)
    revs = [replica(STEERED, n, stored=False) for n in (1, 2, 3)]
    for rev in revs:
        rev["request"]["object"]["metadata"]["name"] = name
    for rev in revs:
        data = body(rev)
        assert decide("mutate", data, settings, view) == whole_way("mutate", data, settings, view)


def test_strings_that_differ_at_every_other_byte_are_one_slot() -> None:
    """A long string (outside the shape) that differs all along: one slot, found in one pass (each difference
    searched for its string's quotes made this quadratic: seconds for a megabyte)."""
    revs = [replica(STEERED, n) for n in (1, 2)]
    for n, rev in enumerate(revs):
        rev["request"]["object"]["metadata"]["managedFields"][0]["time"] = ("ab" if n else "ac") * 100_000
    first, second = body(revs[0]), body(revs[1])
    slots = replay.differing_strings(first, second)
    assert slots is not None and len(slots) == 6
    assert max(end - start for start, end in slots) == 200_000


def test_a_string_that_differs_all_along_is_one_turn_of_the_loop() -> None:
    """Learning runs outside the review's CPU budget: a label that differed at every other byte was a turn of the
    loop per difference (0.7 s of CPU for two 6 MiB bodies, per replica that tried). Counted: the lines run."""
    revs = [replica(STEERED, n) for n in (1, 2)]
    for n, rev in enumerate(revs):
        rev["request"]["object"]["metadata"]["labels"] = {"controller-revision-hash": ("ab" if n else "ac") * 100_000}
    first, second = body(revs[0]), body(revs[1])
    lines = 0

    def count(frame: Any, event: str, arg: Any) -> Any:
        nonlocal lines
        lines += event == "line"
        return count

    code, before = replay.differing_strings.__code__, sys.gettrace()
    sys.settrace(lambda frame, event, arg: count if frame.f_code is code else None)
    try:
        slots = replay.differing_strings(first, second)
    finally:
        sys.settrace(before)
    assert slots is not None and max(end - start for start, end in slots) == 200_000  # one slot
    assert lines < 100  # was 400,000


def test_replicas_made_in_one_second_widen_the_template_later(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first two replicas share their creation time, so it is no slot of their template; a later replica,
    made in another second, misses it once and widens it."""
    settings = Settings()
    view = two_driver_view(settings)
    revs = [replica(STEERED, n) for n in range(1, 8)]
    for rev in revs[:2]:
        meta = rev["request"]["object"]["metadata"]
        meta["creationTimestamp"] = meta["managedFields"][0]["time"] = "2026-12-01T08:00:00Z"
    for rev in revs[:3]:
        decide("validate", body(rev), settings, view)
    Unparsed(monkeypatch)
    for rev in revs[3:]:
        assert decide("validate", body(rev), settings, view)[0]["response"]["uid"] == rev["request"]["uid"]


def test_a_body_of_another_length_is_kept_and_counted_in_place_of_the_one_before() -> None:
    """The store's bytes count the body kept to compare with, whichever length it has."""
    settings = Settings()
    view = two_driver_view(settings)
    first = replica(STEERED, 1)
    decide("validate", body(first), settings, view)
    longer = replica(STEERED, 2)
    longer["request"]["object"]["metadata"]["managedFields"][0]["manager"] = "m" * 10_000
    decide("validate", body(longer), settings, view)
    ((key, stored),) = view.decisions._data.items()
    assert stored.body == body(longer) and stored.key is key
    assert view.decisions._bytes == stored.size() > len(key) + len(body(longer))


def test_the_tenth_pod_of_an_indexed_workload_learns_a_template_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its index is a digit longer, so its body too: the pods of each length get a template (the two first of each
    take the whole way), and those of the lengths before are still answered unparsed."""
    settings = Settings()
    view = two_driver_view(settings)
    bodies = {n: body(controlled_review(STEERED, n, "StatefulSet")) for n in (1, 2, 3, 10, 11, 12, 4, 13)}
    later = (3, 12, 4, 13)
    expected = [whole_way("validate", bodies[n], settings, view) for n in later]
    for n in (1, 2, 10, 11):
        decide("validate", bodies[n], settings, view)
    Unparsed(monkeypatch)
    assert [decide("validate", bodies[n], settings, view) for n in later] == expected


def test_a_template_of_a_length_learned_before_is_widened_after_another_lengths(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A StatefulSet's first two pods made in one second learn no slot for their creation time; the pods from the
    tenth on learn a template of their own; the third pod, a second later, widens the first length's template (no
    fresh start at that length), and the fourth is answered unparsed."""
    settings = Settings()
    view = two_driver_view(settings)
    revs = {n: controlled_review(STEERED, n, "StatefulSet") for n in (1, 2, 3, 4, 10, 11)}
    for n in (1, 2):
        meta = revs[n]["request"]["object"]["metadata"]
        meta["creationTimestamp"] = meta["managedFields"][0]["time"] = "2026-12-01T08:00:00Z"
    expected = whole_way("validate", body(revs[4]), settings, view)
    for n in (1, 2, 10, 11, 3):
        decide("validate", body(revs[n]), settings, view)
    Unparsed(monkeypatch)
    assert decide("validate", body(revs[4]), settings, view) == expected


def test_a_number_that_differs_is_no_slot() -> None:
    revs = [replica(STEERED, n) for n in (1, 2)]
    for n, rev in enumerate(revs):
        rev["request"]["object"]["metadata"]["generation"] = n + 1
    assert replay.learn(body(revs[0]), body(revs[1])) is None


@pytest.mark.parametrize(
    "slot, why",
    [
        (b'a"bc', "a quote would end the string"),
        (b"a\\bc", "a backslash would start an escape"),
        (b"a\x01bc", "a control character is not JSON"),
        (b"a\xffbc", "not UTF-8"),
    ],
)
def test_a_slot_holds_only_a_plain_string(slot: bytes, why: str) -> None:
    first, second, third = (body(replica(STEERED, n)) for n in (1, 2, 3))
    template = replay.learn(first, second)
    assert template is not None
    start, end = template.slots[0]
    assert end - start >= 4
    bad = third[:start] + slot + third[start + len(slot) :]
    assert template.match(third) is not None and template.match(bad) is None, why


def test_a_bad_body_that_matches_the_template_but_for_its_slot_gets_its_error() -> None:
    settings, view = learned()
    third = body(replica(STEERED, 3))
    start = third.index(b"a1b2c3d4-0000-4000-8000-000000000003")
    bad = third[:start] + b"\xff" + third[start + 1 :]
    got = decide("validate", bad, settings, view)
    assert got == whole_way("validate", bad, settings, view)
    assert got[:2] == ("error", 400) and "UTF-8" in got[2]


def test_an_empty_uid_is_refused_as_the_whole_way_refuses_it() -> None:
    """A slot is never empty (its learned text was not), so a body with an empty uid is shorter than the template
    and takes the whole way, which names what is wrong."""
    settings = Settings()
    view = two_driver_view(settings)
    uids = ["a1b2c3d4", "e5f6a7b8"]
    revs = [replica(STEERED, n) for n in (1, 2)]
    for rev, uid in zip(revs, uids, strict=True):
        rev["request"]["uid"] = uid
    for rev in revs:
        decide("validate", body(rev), settings, view)
    third = replica(STEERED, 3)
    third["request"]["uid"] = ""
    data = body(third)
    assert len(data) < len(body(revs[0]))
    got = decide("validate", data, settings, view)
    assert got == whole_way("validate", data, settings, view)
    assert got[:2] == ("error", 400) and "uid" in got[2]


def test_the_content_type_is_checked_before_the_bytes() -> None:
    settings, view = learned()
    with pytest.raises(BadRequest) as err:
        decisions.decide("validate", pipeline.validate, body(replica(STEERED, 3)), "text/plain", settings, view)
    assert err.value.status == 415


def test_other_settings_or_a_new_snapshot_replay_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    settings, view = learned()
    parsed: list[int] = []
    real = parse_review

    def counting(*args: Any) -> Any:
        parsed.append(1)
        return real(*args)

    monkeypatch.setattr(decisions, "parse_review", counting)
    warn = Settings(cuda=CudaSettings(mode="warn"))
    decide("validate", body(replica(STEERED, 3)), warn, view)
    decide("validate", body(replica(STEERED, 4)), settings, fresh(view))
    assert len(parsed) == 2
    decide("validate", body(replica(STEERED, 5)), settings, view)
    assert len(parsed) == 2


def _templates_of_one_length(workloads: int) -> Any:
    """The replays' store after two replicas of each of ``workloads`` workloads whose bodies have one length."""
    settings = Settings()
    view = two_driver_view(settings)
    for workload in range(workloads):
        for n in (1, 2):
            rev = replica(STEERED, n)
            rev["request"]["object"]["metadata"]["labels"] = {"app": f"app-{workload}"}
            decide("validate", body(rev), settings, view)
    return view.replays


def test_templates_per_length_are_bounded() -> None:
    (kept,) = _templates_of_one_length(decisions.REPLAYS_PER_LENGTH + 2)._data.values()
    assert len(kept) == decisions.REPLAYS_PER_LENGTH


def test_the_replays_count_every_template_and_its_answer() -> None:
    """Up to four templates of one length are kept, each with its answer (held after the decisions' store drops
    it): the store counted the first one's body only."""
    replays = _templates_of_one_length(decisions.REPLAYS_PER_LENGTH)
    (kept,) = replays._data.values()
    assert len(kept) == decisions.REPLAYS_PER_LENGTH
    assert replays._bytes >= sum(len(r.template.body) + len(b"".join(r.stored.parts)) for r in kept)


# -- through the app ----------------------------------------------------------------------------------------------
def test_replayed_requests_are_logged_counted_and_get_their_own_events(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings()
    cluster = StaticCluster(two_driver_view(settings))
    sink, log = Recording(), io.StringIO()
    recorder = build_recorder(settings, cluster, sink=sink, stream=log)
    client = create_app(settings, cluster=cluster, recorder=recorder).test_client()
    pod = stored_pod()
    for n in (1, 2):
        client.post("/validate", data=body(replica(pod, n)), content_type=JSON_TYPE)
    Unparsed(monkeypatch)
    for n in (3, 4):
        answer = client.post("/validate", data=body(replica(pod, n)), content_type=JSON_TYPE).get_json()
        assert answer["response"]["uid"] == f"a1b2c3d4-0000-4000-8000-{n:012d}" and answer["response"]["allowed"]
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert [line["name"] for line in lines] == [f"trainer-7d9f5c-{n:05d}" for n in (1, 2, 3, 4)]
    assert [line["uid"] for line in lines][2:] == [f"a1b2c3d4-0000-4000-8000-{n:012d}" for n in (3, 4)]
    assert {line["generateName"] for line in lines} == {"trainer-7d9f5c-"}
    assert [line.get("reused", False) for line in lines] == [False, True, True, True]
    assert [line.get("replayed", False) for line in lines] == [False, False, True, True]  # unparsed: by its bytes
    assert isinstance(recorder.events, EventQueue) and recorder.events.drain()
    involved = [b["involvedObject"] for b in sink.bodies]
    pairs = [(i["name"], i["uid"]) for i in involved]
    each = [pairs.count((f"trainer-7d9f5c-{n:05d}", f"0d6f3c1e-2222-4a7b-9c55-{n:012d}")) for n in (1, 2, 3, 4)]
    assert each[0] > 0 and each == [each[0]] * 4 and len(pairs) == 4 * each[0]
    text = recorder.metrics.text()
    assert 'gpu_admission_reused_answers_total{endpoint="validate"} 3.0' in text


# -- the same answer as the whole way, for any object and any edit of its bytes ---------------------------------
@FUZZ
@given(
    obj=objects,
    edits=st.lists(
        st.tuples(st.integers(0, 10**6), st.sampled_from([b'"', b"\\", b"\x01", b"\xff", b"a", b"}", b"0"])),
        max_size=3,
    ),
)
def test_any_body_gets_the_answer_of_the_whole_way(obj: Any, edits: list[tuple[int, bytes]]) -> None:
    settings = Settings()
    view = two_driver_view(settings)
    pod = obj if isinstance(obj, dict) else {"kind": "Pod", "spec": obj}
    if not isinstance(pod.get("metadata"), dict):
        pod["metadata"] = {}
    for endpoint in ("mutate", "validate"):
        for n in (1, 2):
            decide(endpoint, body(replica(pod, n)), settings, view)
        third = bytearray(body(replica(pod, 3)))
        for at, byte in edits:
            third[at % len(third)] = byte[0]
        data = bytes(third)
        assert decide(endpoint, data, settings, view) == whole_way(endpoint, data, settings, view)
    assert len(view.replays) == 2  # a template per endpoint: the edits met one


Sent = tuple[str, int, int, int] | None
"""(workload kind, pod index, request variant, userInfo variant), or None: the replays' store empties."""

sequences = st.lists(
    st.one_of(
        st.none(),
        st.tuples(
            st.sampled_from(["ReplicaSet", "another", "indexed"]),
            st.sampled_from([1, 2, 3, 10, 11]),  # two lengths of an index
            st.integers(0, 1),
            st.integers(0, 1),
        ),
    ),
    min_size=1,
    max_size=40,
)


def sent_body(endpoint: str, indexed: str, sent: tuple[str, int, int, int]) -> bytes:
    """The body of one request of a sequence: a pod of a ReplicaSet (``another``: its template in another
    ReplicaSet, with a generated name of its own) or of the indexed workload, retried under another request uid, by
    another user uid."""
    kind, n, variant, user = sent
    stored = endpoint == "validate"
    if kind == "indexed":
        rev = controlled_review(STEERED, n, indexed, stored)
    else:
        rev = replica(STEERED, n, stored)
        if kind == "another":
            meta = rev["request"]["object"]["metadata"]
            meta["generateName"] = "serving-5b8c4d-"
            if stored:
                meta["name"] = rev["request"]["name"] = f"serving-5b8c4d-{n:05d}"
    rev["request"]["uid"] = f"a1b2c3d4-0000-4000-8000-{n * 10 + variant:012d}"
    rev["request"]["userInfo"]["uid"] = f"u-{user:04d}"
    return body(rev)


@examples(FUZZ, max_examples=400)
@given(
    endpoint=st.sampled_from(["mutate", "validate"]),
    indexed=st.sampled_from(["Job", "StatefulSet", "JobSet", "LeaderWorkerSet", "PyTorchJob", "TFJob"]),
    steps=sequences,
)
def test_any_sequence_of_requests_is_answered_and_named_as_the_whole_way(
    endpoint: str, indexed: str, steps: list[Sent]
) -> None:
    """Replicas, retries, other workloads of one shape, other users, the replays' store emptied at any point: each
    request gets the answer, decision and Events of a webhook that keeps nothing, and is told apart (named, logged,
    its Events addressed) as that webhook tells it."""
    settings = Settings()
    view = two_driver_view(settings)
    for sent in steps:
        if sent is None:
            for n in range(view.replays.entries):
                view.replays.put(("-", -n), ())
            continue
        data = sent_body(endpoint, indexed, sent)
        got = decisions.decide(endpoint, step(endpoint), data, JSON_TYPE, settings, view)
        want = decisions.decide(endpoint, step(endpoint), data, JSON_TYPE, settings, fresh(view))
        assert got[2] == want[2]
        assert (got[1].decision, got[1].outcome.events) == (want[1].decision, want[1].outcome.events)
        assert dataclasses.replace(got[0], object=None, old_object=None) == dataclasses.replace(
            want[0], object=None, old_object=None
        )


@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_a_per_pod_value_that_another_env_value_refers_to_tells_the_pods_apart(endpoint: str) -> None:
    """CUDA_VERSION=$(RANK): the kubelet expands the reference, so the per-pod value reaches the CUDA lookup; the
    pods are not replicas then, neither by shape nor by their bytes (found by a review of the edge)."""
    settings = Settings()
    view = two_driver_view(settings)  # CUDA 12.4 and 12.2
    pod = copy.deepcopy(STEERED)
    container = pod["spec"]["containers"][0]
    container["image"] = "registry.example/team/trainer:1"  # its env sets no NVIDIA_REQUIRE_CUDA (nvidia/cuda's would)
    for n, rank in enumerate(["12.2", "12.2", "12.2", "12.8"], start=1):
        container["env"] = [{"name": "RANK", "value": rank}, {"name": "CUDA_VERSION", "value": "$(RANK)"}]
        data = body(replica(pod, n))
        assert decide(endpoint, data, settings, view) == whole_way(endpoint, data, settings, view), rank
    if endpoint == "validate":
        assert decide(endpoint, data, settings, view)[1] == "denied"

"""Property-based fuzzing of both endpoints and of ``pipeline.review`` (issue 10).

Objects of random structure with type confusion at every level, and the full-field fixtures of
``shared/fixtures/kubernetes-api`` with random subtrees replaced, dropped or retyped, go through the Flask app over a
realistic cluster (MIG mixed and single, several drivers, spot taints). Properties: every answer is a valid
AdmissionReview or a 4xx with a JSON error, never a 5xx or an exception; every patch applies, and mutating the
patched object again gives no patch.

The hypothesis profile is fixed (derandomized, no example database) so CI sees the same examples every run; sized to
keep this module well under a minute on two cores. A crash found here goes into ``tests/nasty/`` as a file.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from tests.conftest import FIXTURES
from tests.hardening_fixtures import (
    apply,
    check_answer,
    cluster_view,
    hardening_settings,
    patch_of,
    post,
    quiet_app,
    wrap,
)
from webhook import pipeline
from webhook.model import Context

FUZZ = settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

SETTINGS = hardening_settings()
APP = quiet_app(SETTINGS)
CLIENT = APP.test_client()
VIEW = cluster_view(SETTINGS)

# -- random JSON and type confusion ----------------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def confused(strategy: st.SearchStrategy[Any], odds: int = 6) -> st.SearchStrategy[Any]:
    """The well-typed value ``odds`` times in ``odds + 1``, any JSON value (mostly of the wrong type) otherwise."""
    # (one_of would not do: it picks among distinct branches evenly, whatever their repetition.)
    return st.sampled_from([True] * odds + [False]).flatmap(lambda typed: strategy if typed else json_values)


def maybe_dict(required: dict[str, Any], optional: dict[str, Any]) -> st.SearchStrategy[Any]:
    return confused(st.fixed_dictionaries(required, optional=optional))


quantities = st.one_of(
    st.sampled_from(
        [
            "1",
            "2",
            "0.5",
            "500m",
            "0.25",
            "250m",
            "1.5",
            "0",
            "20Gi",
            "10Gi",
            "40Gi",
            "1e309",
            "-1",
            "NaN",
            "0.5Ki",
            "1e-400",
            "Infinity",
            "",
            "1" * 70,
            "9" * 30,
            "1e18",
            "+1",
            ".5",
            "1.",
            "0x10",
            "1 ",
            "１",
        ]
    ),
    st.integers(min_value=-(2**66), max_value=2**66),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=6),
)
resource_names = st.one_of(
    st.sampled_from(
        [
            "nvidia.com/gpu",
            "nvidia.com/mig-3g.40gb",
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-1g.5gb",
            "gpu-admission.io/gpu-memory",
            "nvidia.com/gpu.shared",
            "cpu",
            "memory",
            "amd.com/gpu",
        ]
    ),
    st.text(max_size=10),
)
gpu_quantities = st.sampled_from(["1", "2", "0.5", "500m", "0.25", "0.125", "1.5", "0", "3", "8"]) | quantities
memory_quantities = st.sampled_from(["5Gi", "10Gi", "20Gi", "40Gi", "80Gi", "100Gi", "0", "1"]) | quantities
resource_map = confused(
    st.one_of(
        st.fixed_dictionaries({"nvidia.com/gpu": gpu_quantities}, optional={"cpu": quantities}),
        st.fixed_dictionaries({"gpu-admission.io/gpu-memory": memory_quantities}),
        st.fixed_dictionaries(
            {}, optional={"nvidia.com/mig-3g.40gb": gpu_quantities, "nvidia.com/mig-1g.5gb": gpu_quantities}
        ),
        st.dictionaries(resource_names, quantities, max_size=3),
    )
)
resources = maybe_dict({}, {"limits": resource_map, "requests": resource_map, "claims": json_values})
env_names = st.sampled_from(
    ["NVIDIA_REQUIRE_CUDA", "CUDA_VERSION", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "HOME"]
)
env_values = st.sampled_from(
    [
        "cuda>=12.4",
        "cuda>=12.8",
        "cuda>=13.0",
        "12.2.2",
        "12.8",
        "13.0",
        "cuda>=12.0 brand=tesla,driver>=470,driver<471",
        "",
        "void",
        "all",
        "none",
        "12.x",
        "cuda>=",
        "cuda>=99999999999999999999.1",
    ]
) | st.text(max_size=10)
env = confused(
    st.lists(
        maybe_dict({}, {"name": confused(env_names), "value": confused(env_values), "valueFrom": json_values}),
        max_size=3,
    )
)
images = st.sampled_from(
    [
        "nvidia/cuda:12.2.2-base-ubuntu22.04",
        "nvidia/cuda:13.0.0-runtime-ubuntu24.04",
        "nvidia/cuda:12.8.0-devel",
        "nvcr.io/nvidia/pytorch:24.01-py3",
        "nvcr.io/nvidia/pytorch:25.03-py3",
        "pytorch/pytorch-nightly:2300000-cu12.1",
        "busybox",
        "",
        "nvidia/cuda",
        "nvidia/cuda:",
        "nvidia/cuda@sha256:" + "a" * 64,
        "registry:5000/x/y:z",
        ":::",
    ]
) | st.text(max_size=16)
containers = confused(
    st.lists(
        maybe_dict(
            {},
            {
                "name": confused(st.sampled_from(["trainer", "sidecar", "init", ""])),
                "image": confused(images),
                "resources": resources,
                "env": env,
                "envFrom": json_values,
            },
        ),
        min_size=1,
        max_size=3,
    )
)
label_keys = st.sampled_from(
    [
        "nvidia.com/gpu.product",
        "nvidia.com/mig.strategy",
        "cloud.google.com/gke-nodepool",
        "kubernetes.azure.com/scalesetpriority",
        "cloud.google.com/gke-spot",
        "kubernetes.io/hostname",
        "gpu-admission.io/ignore",
    ]
) | st.text(max_size=8)
label_values = st.sampled_from(
    ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "mixed", "single", "t4-spot", "spot", "true", "h100-a", ""]
) | st.text(max_size=8)
operators = st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Equal", ""]) | st.text(max_size=4)
match_expression = maybe_dict(
    {},
    {
        "key": confused(label_keys),
        "operator": confused(operators),
        "values": confused(st.lists(confused(label_values), max_size=3)),
    },
)
term = maybe_dict(
    {},
    {
        "matchExpressions": confused(st.lists(match_expression, max_size=2)),
        "matchFields": confused(st.lists(match_expression, max_size=1)),
    },
)
affinity = maybe_dict(
    {},
    {
        "nodeAffinity": maybe_dict(
            {},
            {
                "requiredDuringSchedulingIgnoredDuringExecution": maybe_dict(
                    {}, {"nodeSelectorTerms": confused(st.lists(term, max_size=2))}
                ),
                "preferredDuringSchedulingIgnoredDuringExecution": confused(
                    st.lists(maybe_dict({}, {"weight": confused(st.integers(-5, 200)), "preference": term}), max_size=2)
                ),
            },
        ),
        "podAffinity": json_values,
    },
)
toleration = maybe_dict(
    {},
    {
        "key": confused(
            st.sampled_from(
                ["cloud.google.com/gke-spot", "kubernetes.azure.com/scalesetpriority", "nvidia.com/gpu", ""]
            )
            | st.text(max_size=6)
        ),
        "operator": confused(st.sampled_from(["Exists", "Equal", "", "In"])),
        "value": confused(st.sampled_from(["true", "spot", "present", ""])),
        "effect": confused(st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule", ""])),
        "tolerationSeconds": json_values,
    },
)
annotation_keys = st.sampled_from(
    [
        "gpu-admission.io/spot",
        "gpu-admission.io/gpu-fraction",
        "gpu-admission.io/gpu-fraction-container",
        "gpu-admission.io/cuda-version",
        "gpu-admission.io/cuda-version.trainer",
        "gpu-admission.io/cuda",
        "gpu-admission.io/mig",
        "gpu-admission.io/spot-applied",
        "gpu-admission.io/anything",
        "team",
    ]
) | st.text(max_size=10)
annotation_values = st.sampled_from(
    [
        "tolerate",
        "true",
        "prefer",
        "require",
        "never",
        "false",
        "0.25",
        "0.5",
        "1e309",
        "12.4",
        "13.0",
        "12",
        "x",
        "trainer",
        "",
        "forged",
    ]
) | st.text(max_size=10)
owner_refs = confused(
    st.lists(
        maybe_dict(
            {},
            {
                "kind": confused(st.sampled_from(["Job", "ReplicaSet", "StatefulSet", ""])),
                "controller": json_values,
                "name": json_values,
            },
        ),
        max_size=2,
    )
)
metadata = maybe_dict(
    {},
    {
        "name": confused(st.sampled_from(["trainer", ""])),
        "generateName": json_values,
        "namespace": confused(st.sampled_from(["default", "batch", "warn-ns", "kube-system"])),
        "annotations": confused(st.dictionaries(annotation_keys, confused(annotation_values), max_size=4)),
        "labels": confused(st.dictionaries(label_keys, confused(label_values), max_size=3)),
        "ownerReferences": owner_refs,
    },
)
pod_spec = maybe_dict(
    {"containers": containers},
    {
        "initContainers": containers,
        "nodeName": confused(st.sampled_from(["h100-a", "a100-mixed-1", "gke-t4-spot-1", "nope", ""])),
        "nodeSelector": confused(st.dictionaries(label_keys, confused(label_values), max_size=2)),
        "affinity": affinity,
        "tolerations": confused(st.lists(toleration, max_size=3)),
        "runtimeClassName": json_values,
    },
)
pods = st.fixed_dictionaries(
    {"kind": st.just("Pod"), "metadata": metadata, "spec": pod_spec},
    optional={"apiVersion": confused(st.just("v1"))},
)
template = maybe_dict({"metadata": metadata, "spec": pod_spec}, {})
WORKLOADS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "ReplicationController")


@st.composite
def workloads(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from([*WORKLOADS, "CronJob", "PodTemplate"]))
    obj: dict[str, Any] = {"apiVersion": "apps/v1", "kind": kind, "metadata": draw(metadata)}
    if kind == "CronJob":
        obj["spec"] = draw(
            maybe_dict({"jobTemplate": maybe_dict({"spec": maybe_dict({"template": template}, {})}, {})}, {})
        )
    elif kind == "PodTemplate":
        obj["template"] = draw(template)
    else:
        obj["spec"] = draw(maybe_dict({"template": template}, {"replicas": json_values}))
    return obj


objects = st.one_of(pods, pods, pods, workloads(), workloads(), json_values)

reviews = st.fixed_dictionaries(
    {
        "apiVersion": st.just("admission.k8s.io/v1"),
        "kind": st.just("AdmissionReview"),
        "request": confused(
            st.fixed_dictionaries(
                {
                    "uid": confused(st.sampled_from(["uid-1", "0d7c1a9e-2f35-4a8d-9d59-1c1d2f4e5a6b"]), odds=20),
                    "object": objects,
                    "operation": confused(
                        st.sampled_from(["CREATE"] * 6 + ["UPDATE", "DELETE", "CONNECT", "PATCH"]), 20
                    ),
                },
                optional={
                    "namespace": confused(st.sampled_from(["default", "batch", "warn-ns", "kube-system", ""])),
                    "kind": maybe_dict({}, {"kind": confused(st.sampled_from(["Pod", "Deployment"]))}),
                    "userInfo": maybe_dict(
                        {},
                        {
                            "username": confused(st.sampled_from(["alice", "system:admin"])),
                            "groups": confused(
                                st.lists(confused(st.sampled_from(["platform-admins", "devs"])), max_size=2)
                            ),
                        },
                    ),
                    "dryRun": confused(st.booleans()),
                    "oldObject": objects,
                    "options": json_values,
                },
            ),
            odds=20,
        ),
    }
)

# -- mutations of the full-field fixtures ----------------------------------------------------------------------------

FIXTURE_OBJECTS = {
    p.name: json.loads(p.read_text())
    for p in sorted(FIXTURES.glob("*.json"))
    if not p.name.startswith("admission.") and "Node" not in p.name
}


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


def _retype(value: Any) -> Any:
    if isinstance(value, dict):
        return list(value.values())
    if isinstance(value, list):
        return {str(i): v for i, v in enumerate(value)}
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    return {}


def _gpu_containers(obj: dict[str, Any], limits: dict[str, Any]) -> None:
    """Give the fixture's containers a GPU request (they carry placeholder resources), so the policies engage."""
    for path in _paths(obj):
        if path and path[-1] == "resources":
            node: Any = obj
            for key in path[:-1]:
                node = node[key]
            if isinstance(node, dict) and "image" in node:
                node["resources"] = {"limits": dict(limits)}
                node["image"] = "nvidia/cuda:12.8.0-base-ubuntu22.04"


@st.composite
def mutated_fixtures(draw: st.DrawFn) -> dict[str, Any]:
    name = draw(st.sampled_from(sorted(FIXTURE_OBJECTS)))
    obj: dict[str, Any] = copy.deepcopy(FIXTURE_OBJECTS[name])
    if draw(st.booleans()):
        _gpu_containers(obj, draw(st.dictionaries(resource_names, quantities, min_size=1, max_size=2)))
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(obj) if p]
        path = draw(st.sampled_from(paths))
        parent: Any = obj
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "drop", "retype"]))
        if action == "drop":
            del parent[path[-1]]
        elif action == "retype":
            parent[path[-1]] = _retype(parent[path[-1]])
        else:
            parent[path[-1]] = draw(json_values)
    return obj


# -- the properties --------------------------------------------------------------------------------------------------


def _uid_of(body: Any) -> Any:
    request = body.get("request") if isinstance(body, dict) else None
    return request.get("uid") if isinstance(request, dict) else None


def exercise(body: dict[str, Any]) -> None:
    """Both endpoints; any patch applies and is idempotent."""
    uid = _uid_of(body)
    for path in ("/mutate", "/validate"):
        status, answer = post(CLIENT, path, body)
        response = check_answer(status, answer, uid, mutating=path == "/mutate")
        if currently_in_test_context():  # shown by --hypothesis-show-statistics
            event(
                f"{path}: "
                + (
                    "4xx"
                    if response is None
                    else "denied"
                    if not response["allowed"]
                    else "patched"
                    if "patch" in response
                    else "allowed"
                )
            )
        if response is None or path == "/validate":
            continue
        ops = patch_of(response)
        if not ops:
            continue
        obj = body["request"]["object"]
        patched = apply(copy.deepcopy(obj), ops)
        again = copy.deepcopy(body)
        again["request"]["object"] = patched
        again["request"]["uid"] = "again-" + str(uid)
        status2, answer2 = post(CLIENT, "/mutate", again)
        response2 = check_answer(status2, answer2, "again-" + str(uid), mutating=True)
        assert response2 is not None, "the mutated object must still be reviewable"
        assert patch_of(response2) == [], f"not idempotent: second patch {patch_of(response2)}"
        status3, answer3 = post(CLIENT, "/validate", again)
        check_answer(status3, answer3, "again-" + str(uid), mutating=False)


def direct(obj: Any, namespace: str = "default", operation: str = "CREATE") -> None:
    """``pipeline.review`` as the CLI runs it: no exception; its patch turns the object into its result."""
    ctx = Context(settings=SETTINGS, cluster=VIEW, namespace=namespace, operation=operation, username="alice")
    result = pipeline.review(copy.deepcopy(obj), ctx)
    assert isinstance(result.allowed, bool)
    if result.patch:
        assert result.allowed
        assert apply(copy.deepcopy(obj), result.patch) == result.object
        again = pipeline.mutate(copy.deepcopy(result.object), ctx)
        assert again.patch == [], f"not idempotent: {again.patch}"
    for w in result.warnings:
        assert len(w) < 120


@settings(FUZZ, max_examples=200)
@given(body=reviews)
def test_random_reviews_get_valid_answers(body: dict[str, Any]) -> None:
    exercise(body)


@FUZZ
@given(
    obj=objects,
    namespace=st.sampled_from(["default", "batch", "warn-ns"]),
    operation=st.sampled_from(["CREATE", "UPDATE"]),
)
def test_random_objects_through_pipeline_review(obj: Any, namespace: str, operation: str) -> None:
    direct(obj, namespace, operation)
    if isinstance(obj, dict):
        exercise(wrap(obj, operation=operation, namespace=namespace))


@settings(FUZZ, max_examples=100)
@given(obj=mutated_fixtures(), namespace=st.sampled_from(["default", "batch", "warn-ns"]))
def test_mutated_fixtures_get_valid_answers(obj: dict[str, Any], namespace: str) -> None:
    direct(obj, namespace)
    exercise(wrap(obj, namespace=namespace))


GPU_POD_LIMITS = [
    pytest.param({"nvidia.com/gpu": "1"}, id="whole"),
    pytest.param({"nvidia.com/gpu": "0.5"}, id="half"),
    pytest.param({"gpu-admission.io/gpu-memory": "20Gi"}, id="memory"),
    pytest.param({"nvidia.com/mig-3g.40gb": "1"}, id="mig"),
]


@pytest.mark.parametrize("limits", GPU_POD_LIMITS)
@pytest.mark.parametrize("name", sorted(FIXTURE_OBJECTS))
def test_full_fixture_with_gpu_request_is_idempotent(name: str, limits: dict[str, str]) -> None:
    """The unmutated fixtures with a GPU request: the seeds the fuzzer starts from must pass on their own."""
    obj = copy.deepcopy(FIXTURE_OBJECTS[name])
    _gpu_containers(obj, limits)
    for namespace in ("default", "batch", "warn-ns"):
        direct(obj, namespace)
        exercise(wrap(obj, namespace=namespace))

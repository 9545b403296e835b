"""Where a container's CUDA version comes from, the NVIDIA_REQUIRE_CUDA grammar, and its evaluation on node groups."""

from __future__ import annotations

import tracemalloc
from dataclasses import replace
from typing import Any

import pytest

from tests.cuda_fixtures import container
from webhook import cuda_version
from webhook.cuda_version import (
    Forward,
    NodeFacts,
    RequirementError,
    brands_of,
    compare,
    declared_cuda,
    evaluate,
    image_cuda,
    image_rules,
    parse_requirement,
    split_image,
)
from webhook.drivers import builtin_table, parse_version

TABLE = builtin_table()
DC = frozenset({"tesla", "nvidia"})


def facts(cuda: str | None, driver: str | None, brands: frozenset[str] = DC, arch: str | None = "8.0") -> NodeFacts:
    return NodeFacts(
        cuda=parse_version(cuda) if cuda else None,
        driver=parse_version(driver) if driver else None,
        brands=brands,
        arch=parse_version(arch) if arch else None,
    )


# Forward-compatibility alternatives as the nvidia/cuda 12.4.1 images carry them (abridged).
CUDA_124_REQUIRE = (
    "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=tesla,driver>=525,driver<526 "
    "brand=tesla,driver>=535,driver<536"
)


@pytest.mark.parametrize(
    ("expression", "node", "expected"),
    [
        pytest.param("cuda>=12.4", facts("12.4", "550.54.14"), True, id="cuda-equal"),
        pytest.param("cuda>=12.4", facts("12.3", "545.23.06"), False, id="cuda-below"),
        pytest.param("cuda>=12.4.1", facts("12.4", "550.54.14"), True, id="cuda-compared-at-major-minor"),
        pytest.param("CUDA>=12.4", facts("12.6", "560.35.03"), True, id="key-any-case"),
        pytest.param("cuda>=12.4  cuda>=99.0", facts("12.4", "550.54.14"), True, id="double-space-skipped"),
        pytest.param("cuda>12.4", facts("12.4", "550.54.14"), False, id="strictly-greater"),
        pytest.param("cuda<13", facts("12.8", "570.26"), True, id="upper-bound"),
        pytest.param("cuda=12.4.0", facts("12.4", "550.54.14"), True, id="trailing-zero-equal"),
        pytest.param("cuda!=12.4", facts("12.4", "550.54.14"), False, id="not-equal"),
        pytest.param(CUDA_124_REQUIRE, facts("12.2", "535.104.05"), True, id="forward-compat-tesla-535"),
        pytest.param(
            CUDA_124_REQUIRE,
            facts("12.2", "535.104.05", frozenset({"geforce"})),
            False,
            id="forward-compat-needs-brand",
        ),
        pytest.param(CUDA_124_REQUIRE, facts("12.3", "545.23.06"), False, id="forward-compat-branch-not-listed"),
        pytest.param(CUDA_124_REQUIRE, facts("11.4", "470.82.01"), True, id="forward-compat-470"),
        pytest.param(
            "cuda>=12.4 brand=geforce,driver>=535,driver<536",
            facts("12.2", "535.104.05", frozenset({"geforcertx", "geforce"})),
            False,
            id="forward-compat-never-on-geforce",
        ),
        pytest.param(
            "cuda>=12.4 brand=quadrortx,driver>=535,driver<536",
            facts("12.2", "535.104.05", frozenset({"quadrortx", "quadro"})),
            None,
            id="forward-compat-on-rtx-unknown",
        ),
        pytest.param(
            "driver>=535,brand=geforce",
            facts("12.2", "535.104.05", frozenset({"geforce"})),
            True,
            id="no-cuda-term-no-forward",
        ),
        pytest.param("driver>=470,driver<471", facts("11.5", "471.0"), False, id="driver-branch-upper-bound"),
        pytest.param("driver>=570.26", facts("12.8", "570.124.06"), True, id="driver-parts-numeric"),
        pytest.param("arch>=9.0", facts("12.4", "550.54.14", arch="8.0"), False, id="arch-below"),
        pytest.param("arch>=9.0", facts("12.4", "550.54.14", arch="9.0"), True, id="arch-equal"),
        pytest.param("brand!=geforce", facts("12.4", "550.54.14"), True, id="brand-not-equal"),
        pytest.param("brand=TESLA", facts("12.4", "550.54.14"), True, id="brand-any-case"),
        pytest.param("cuda>=12.4", facts(None, None), None, id="unknown-driver-unknown"),
        pytest.param("brand=tesla", facts("12.4", "550", frozenset()), None, id="unknown-brand-unknown"),
        pytest.param("arch>=8.0", facts("12.4", "550", arch=None), None, id="unknown-arch-unknown"),
        pytest.param("cuda>=12.8 brand=tesla", facts("12.2", "535", frozenset()), None, id="or-with-unknown"),
        pytest.param("cuda>=12.8,brand=tesla", facts("12.2", "535", frozenset()), False, id="and-false-wins"),
    ],
)
def test_evaluate(expression: str, node: NodeFacts, expected: bool | None) -> None:
    assert evaluate(parse_requirement(expression), node, TABLE) is expected


@pytest.mark.parametrize(
    ("expression", "driver", "cuda", "strict", "minor"),
    [
        pytest.param("cuda>=12.8", "535.104.05", "12.2", False, True, id="12x-on-535"),
        pytest.param("cuda>=12.8", "525.60.13", "12.0", False, True, id="12x-at-floor"),
        pytest.param("cuda>=12.8", "520.61.05", "11.8", False, False, id="12x-on-11x-driver"),
        pytest.param("cuda>=11.8", "450.80.02", "11.0", False, True, id="11x-at-floor"),
        pytest.param("cuda>=11.8", "450.51.06", "11.0", False, False, id="11x-below-floor"),
        pytest.param("cuda>=13.2", "580.65.06", "13.0", False, True, id="13x-at-floor"),
        pytest.param("cuda>=10.2", "418.39", "10.1", False, False, id="10x-has-no-floor"),
    ],
)
def test_minor_version_compatibility(expression: str, driver: str, cuda: str, strict: bool, minor: bool) -> None:
    req = parse_requirement(expression)
    assert evaluate(req, facts(cuda, driver), TABLE, "strict") is strict
    assert evaluate(req, facts(cuda, driver), TABLE, "minor") is minor


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        pytest.param("", "empty", id="empty"),
        pytest.param("   ", "empty", id="blank"),
        pytest.param("cuda", "no operator", id="no-operator"),
        pytest.param(">=12.4", "no key", id="no-key"),
        pytest.param("cuda>=", "no value", id="no-value"),
        pytest.param("cuda=>12.4", "not an operator", id="reversed-operator"),
        pytest.param("cuda==12.4", "not an operator", id="double-equal"),
        pytest.param("foo>=1", "unknown key", id="unknown-key"),
        pytest.param("cuda>=12.4 foo>=1", "unknown key", id="bad-term-after-good"),
        pytest.param("brand>=tesla", "only with = or !=", id="brand-ordered"),
        pytest.param("cuda>=twelve", "not a version", id="version-not-numeric"),
        pytest.param("driver>=535.x", "not a version", id="version-with-letter"),
        pytest.param("cuda >= 12.4", "no operator", id="spaces-split-terms"),
    ],
)
def test_invalid_expressions_are_errors(expression: str, fragment: str) -> None:
    with pytest.raises(RequirementError, match=fragment):
        parse_requirement(expression)


def test_requirement_lowest_cuda_and_forward_terms() -> None:
    req = parse_requirement(CUDA_124_REQUIRE)
    assert req.cuda == (12, 4)
    assert len(req.forward_terms) == 3
    assert req.without_forward().terms == req.terms[:1]
    assert parse_requirement("driver>=535").cuda is None
    assert parse_requirement("cuda>=12.0,cuda<12.3").cuda == (12, 0)


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        pytest.param("570.26", "570.124.06", -1, id="parts-numeric-not-text"),
        pytest.param("535.104.05", "535.104.5", 0, id="leading-zero-not-octal"),
        pytest.param("12.4", "12.4.0", 0, id="trailing-zero"),
        pytest.param("13.0", "12.9", 1, id="major-wins"),
    ],
)
def test_compare(a: str, b: str, expected: int) -> None:
    va, vb = parse_version(a), parse_version(b)
    assert va is not None and vb is not None
    assert compare(va, vb) == expected


def env(**values: str) -> dict[str, str]:
    return values


@pytest.mark.parametrize(
    ("c", "annotations", "version", "source"),
    [
        pytest.param(
            container(env=env(CUDA_VERSION="12.4.1")),
            {"gpu-admission.io/cuda-version.trainer": "12.8"},
            (12, 8),
            "annotation gpu-admission.io/cuda-version.trainer",
            id="container-annotation-first",
        ),
        pytest.param(
            container(),
            {"gpu-admission.io/cuda-version": "12.6", "gpu-admission.io/cuda-version.other": "11.8"},
            (12, 6),
            "annotation gpu-admission.io/cuda-version",
            id="pod-annotation",
        ),
        pytest.param(
            container(env=env(NVIDIA_REQUIRE_CUDA="cuda>=12.8", CUDA_VERSION="12.4")),
            {},
            (12, 8),
            "env NVIDIA_REQUIRE_CUDA",
            id="require-before-cuda-version",
        ),
        pytest.param(
            container(image="ubuntu:22.04", env=env(CUDA_VERSION="13.2.0.046")),
            {},
            (13, 2),
            "env CUDA_VERSION",
            id="ngc-four-part-cuda-version",
        ),
        pytest.param(
            container(image="pytorch/pytorch-nightly:2310000-cu12.1", env=env(CUDA_VERSION="12.8")),
            {},
            (12, 8),
            "env CUDA_VERSION",
            id="env-before-image",
        ),
        pytest.param(  # the image's own NVIDIA_REQUIRE_CUDA (cuda>=12.4 ...) is what the runtime reads first
            container(image="nvidia/cuda:12.4.1-base-ubuntu22.04", env=env(CUDA_VERSION="12.8")),
            {},
            (12, 4),
            "image tag, nvidia/cuda 12.4.1-base-ubuntu22.04: the image's NVIDIA_REQUIRE_CUDA, which the runtime"
            " reads before the pod's CUDA_VERSION",
            id="image-require-before-env-cuda-version",
        ),
        pytest.param(
            container(image="nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0", env=env(CUDA_VERSION="11.8")),
            {},
            (12, 5),
            "image tag, NVIDIA CUDA sample vectoradd-cuda12.5.0: the image's NVIDIA_REQUIRE_CUDA, which the runtime"
            " reads before the pod's CUDA_VERSION",
            id="sample-image-require-before-env-cuda-version",
        ),
        pytest.param(  # the pod's empty NVIDIA_REQUIRE_CUDA replaces the image's: CUDA_VERSION is read
            container(image="nvidia/cuda:12.4.1-base", env=env(CUDA_VERSION="12.8", NVIDIA_REQUIRE_CUDA="")),
            {},
            (12, 8),
            "env CUDA_VERSION",
            id="emptied-image-require",
        ),
        pytest.param(  # ... and without one of the pod's, the image's own CUDA_VERSION (no forward terms then)
            container(image="nvidia/cuda:12.4.1-base", env=env(NVIDIA_REQUIRE_CUDA="")),
            {},
            (12, 4),
            "image tag, nvidia/cuda 12.4.1-base: the image's CUDA_VERSION, the pod's empty NVIDIA_REQUIRE_CUDA"
            " replacing the image's",
            id="emptied-image-require-image-cuda-version",
        ),
        pytest.param(
            container(image="nvidia/cuda:12.4.1-base-ubuntu22.04"),
            {},
            (12, 4),
            "image tag, nvidia/cuda 12.4.1-base-ubuntu22.04",
            id="image-nvidia-cuda",
        ),
        pytest.param(
            container(image="nvidia/cuda:12.4.1-base", env=env(NVIDIA_DISABLE_REQUIRE="false")),
            {},
            (12, 4),
            "image tag, nvidia/cuda 12.4.1-base",
            id="disable-require-false",
        ),
        pytest.param(
            container(image="x:1", env=env(CUDA_VERSION="12.1", NVIDIA_REQUIRE_CUDA="")),
            {},
            (12, 1),
            "env CUDA_VERSION",
            id="empty-require-is-absent",
        ),
        pytest.param(
            container(image="x:1", env=env(CUDA_VERSION="12.1")),
            {"gpu-admission.io/cuda-version": " "},
            (12, 1),
            "env CUDA_VERSION",
            id="blank-annotation-is-absent",
        ),
    ],
)
def test_sources_in_order(
    c: dict[str, Any], annotations: dict[str, str], version: tuple[int, ...], source: str
) -> None:
    d = declared_cuda(c, annotations)
    assert (d.version, d.source, d.error) == (version, source, "")


def test_an_emptied_image_requirement_has_no_forward_terms() -> None:
    """Found by a review: the runtime reads an image whose NVIDIA_REQUIRE_CUDA the pod empties as a legacy one
    (``cuda>=`` its CUDA_VERSION), so nvidia/cuda's forward-compatibility alternatives do not hold then."""
    image = "nvidia/cuda:12.4.1-base"
    assert declared_cuda(container(image=image), {}).requirement.forward_terms  # type: ignore[union-attr]
    emptied = declared_cuda(container(image=image, env=env(NVIDIA_REQUIRE_CUDA="")), {}).requirement
    assert emptied is not None and emptied.text == "cuda>=12.4" and not emptied.forward_terms
    pytorch = "pytorch/pytorch-nightly:2310000-cu12.1"  # sets no CUDA variable: read from its tag as ever
    assert declared_cuda(container(image=pytorch, env=env(NVIDIA_REQUIRE_CUDA="")), {}).source == (
        "image tag, pytorch nightly 2310000-cu12.1"
    )


def test_disable_require_stops_the_image_guess() -> None:
    for value in ("true", "1", "T", "TRUE", "True"):
        d = declared_cuda(container(image="nvidia/cuda:12.8.0-base", env=env(NVIDIA_DISABLE_REQUIRE=value)), {})
        assert d.disabled and d.requirement is None and d.source == "env NVIDIA_DISABLE_REQUIRE", value
    d = declared_cuda(container(image="nvidia/cuda:12.8.0-base", env=env(NVIDIA_DISABLE_REQUIRE="yes")), {})
    assert not d.disabled and d.version == (12, 8)  # not a Go boolean: ignored, as the toolkit does


def test_env_duplicates() -> None:
    c = container(image="ubuntu:22.04")
    c["env"] = [
        {"name": "CUDA_VERSION", "value": "11.8"},
        {"name": "CUDA_VERSION", "value": "12.6"},  # the later entry wins
        "garbage",
        {"name": 5, "value": "cuda>=99"},
    ]
    assert declared_cuda(c, {}).version == (12, 6)


FROM_CONFIG_MAP = {"valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}


@pytest.mark.parametrize(
    ("entries", "env_from", "version", "said"),
    [
        pytest.param(
            [{"name": "MM", "value": "12.2"}, {"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=$(MM)"}],
            False,
            (12, 2),
            "env NVIDIA_REQUIRE_CUDA",
            id="reference-to-an-entry-before",
        ),
        pytest.param(
            [
                {"name": "MAJOR", "value": "12"},
                {"name": "MINOR", "value": "4"},
                {"name": "CUDA_VERSION", "value": "$(MAJOR).$(MINOR).1"},
            ],
            True,
            (12, 4),
            "env CUDA_VERSION",
            id="two-references",
        ),
        pytest.param(
            [{"name": "MM", "value": "12.2"}, {"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=$$(MM)"}],
            False,
            None,
            "invalid expression",
            id="escaped-stays-literal",
        ),
        pytest.param(
            [{"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=$(MM)"}, {"name": "MM", "value": "12.2"}],
            False,
            None,
            "invalid expression",
            id="reference-to-a-later-entry-stays-literal",
        ),
        pytest.param(
            [{"name": "MM", **FROM_CONFIG_MAP}, {"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=$(MM)"}],
            False,
            None,
            "env NVIDIA_REQUIRE_CUDA (refers to $(MM), a value set by valueFrom, which the webhook cannot read)",
            id="reference-to-value-from",
        ),
        pytest.param(
            [{"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=$(MM)"}],
            True,
            None,
            "env NVIDIA_REQUIRE_CUDA (refers to $(MM), a variable its envFrom may set, which the webhook cannot read)",
            id="reference-envFrom-may-set",
        ),
    ],
)
def test_env_references_are_expanded_as_the_kubelet_does(
    entries: list[dict[str, Any]], env_from: bool, version: tuple[int, ...] | None, said: str
) -> None:
    # an nvidia/cuda image, whose tag the env must override; one whose own env sets no NVIDIA_REQUIRE_CUDA where
    # CUDA_VERSION is read (the runtime reads an nvidia/cuda image's NVIDIA_REQUIRE_CUDA before it)
    cuda_version = any(entry.get("name") == "CUDA_VERSION" for entry in entries)
    image = "ubuntu:24.04" if cuda_version else "nvidia/cuda:13.0.1-base-ubuntu24.04"
    c: dict[str, Any] = {"name": "c", "image": image, "env": entries}
    if env_from:
        c["envFrom"] = [{"configMapRef": {"name": "settings"}}]
    declared = declared_cuda(c, {})
    assert declared.version == version
    assert said in declared.source or said in (declared.error or ""), (declared.source, declared.error)


@pytest.mark.parametrize(
    ("entries", "want"),
    [
        pytest.param(
            [{"name": "NVIDIA_REQUIRE_CUDA", **FROM_CONFIG_MAP}, {"name": "CUDA_VERSION", "value": "11.8"}],
            "env NVIDIA_REQUIRE_CUDA (set by valueFrom, which the webhook cannot read)",
            id="require-from-config-map-over-cuda-version",
        ),
        pytest.param(
            [
                {"name": "NVIDIA_DISABLE_REQUIRE", **FROM_CONFIG_MAP},
                {"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=12.8"},
            ],
            "env NVIDIA_DISABLE_REQUIRE (set by valueFrom, which the webhook cannot read)",
            id="disable-from-config-map",
        ),
        pytest.param(
            [{"name": "CUDA_VERSION", **FROM_CONFIG_MAP}],
            "image tag, nvidia/cuda 12.4.1-base-ubuntu22.04: the image's NVIDIA_REQUIRE_CUDA, which the runtime reads"
            " before the pod's CUDA_VERSION",
            id="under-the-image-require",
        ),
        pytest.param(
            [{"name": "NVIDIA_REQUIRE_CUDA", "value": ""}, {"name": "CUDA_VERSION", **FROM_CONFIG_MAP}],
            "env CUDA_VERSION (set by valueFrom",
            id="the-image-require-emptied",
        ),
        pytest.param(
            [{"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=12.8"}, {"name": "CUDA_VERSION", **FROM_CONFIG_MAP}],
            "env NVIDIA_REQUIRE_CUDA",
            id="a-literal-before-it-decides",
        ),
        pytest.param(
            [
                {"name": "NVIDIA_REQUIRE_CUDA", **FROM_CONFIG_MAP},
                {"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=12.8"},
            ],
            "env NVIDIA_REQUIRE_CUDA",
            id="a-later-literal-wins",
        ),
    ],
)
def test_a_cuda_variable_set_by_value_from_is_unknown_not_skipped(entries: list[Any], want: str) -> None:
    # The runtime reads the variable's value from the ConfigMap; the image tag (12.4 here) or a lower variable
    # says nothing of it: the version is unknown, and says why. But the image's own NVIDIA_REQUIRE_CUDA (an
    # nvidia/cuda image's), which the runtime reads before a CUDA_VERSION, still decides over that one
    c = container(image="nvidia/cuda:12.4.1-base-ubuntu22.04")
    c["env"] = entries
    d = declared_cuda(c, {"gpu-admission.io/other": "x"})
    assert d.source.startswith(want), d.source
    assert (d.requirement is None) == ("valueFrom" in want)
    with_annotation = declared_cuda(c, {"gpu-admission.io/cuda-version": "12.2"})
    assert with_annotation.version == (12, 2)  # the annotation comes first, as ever


@pytest.mark.parametrize(
    ("c", "annotations", "fragment"),
    [
        pytest.param(container(), {"gpu-admission.io/cuda-version": "twelve"}, "not a CUDA version", id="annotation"),
        pytest.param(
            container(image="ubuntu:24.04", env=env(CUDA_VERSION="12.x")), {}, "not a CUDA version", id="cuda-version"
        ),
        pytest.param(
            container(env=env(NVIDIA_REQUIRE_CUDA="cuda>=12.4 bogus")), {}, "invalid expression", id="require-cuda"
        ),
    ],
)
def test_unusable_declarations_are_errors(c: dict[str, Any], annotations: dict[str, str], fragment: str) -> None:
    d = declared_cuda(c, annotations)
    assert d.requirement is None and fragment in d.error


@pytest.mark.parametrize(
    ("image", "version", "secondary"),
    [
        pytest.param("nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04", (12, 4), False, id="nvidia-cuda-cudnn"),
        pytest.param("nvidia/cuda:11.0-base", (11, 0), False, id="nvidia-cuda-two-part"),
        pytest.param("docker.io/nvidia/cuda:12.2.0-base-ubuntu22.04", (12, 2), False, id="docker-io-prefix"),
        pytest.param("mirror.gcr.io/nvidia/cuda:11.8.0-devel-ubuntu22.04", (11, 8), False, id="mirror"),
        pytest.param("nvcr.io/nvidia/cuda:12.6.2-runtime-ubuntu24.04", (12, 6), False, id="nvcr-cuda"),
        pytest.param("localhost:5000/nvidia/cuda:12.1.0-base", (12, 1), False, id="registry-with-port"),
        pytest.param("nvidia/cuda:12.4.1-base@sha256:" + "a" * 64, (12, 4), False, id="tag-and-digest"),
        pytest.param("pytorch/pytorch-nightly:2310000-cu12.1", (12, 1), False, id="pytorch"),
        pytest.param("pytorch/pytorch:2.5.1-cuda12.4-cudnn9-devel", (12, 4), False, id="pytorch-devel"),
        pytest.param("tensorflow/tensorflow:2.15.0-gpu", (12, 2), False, id="tensorflow-2.15"),
        pytest.param("tensorflow/tensorflow:2.13.1-gpu-jupyter", (11, 8), False, id="tensorflow-jupyter"),
        pytest.param("tensorflow/tensorflow:2.17.0-gpu", (12, 3), False, id="tensorflow-2.17"),
        pytest.param("tensorflow/tensorflow:2.18.0-gpu", (12, 5), False, id="tensorflow-2.18"),
        pytest.param("nvcr.io/nvidia/pytorch:24.05-py3", (12, 4), False, id="ngc-primary"),
        # nvcr.io through a proxy or mirror read no CUDA (found by a review of real images)
        pytest.param("harbor.example.com/nvcr/nvidia/pytorch:24.05-py3", (12, 4), False, id="ngc-harbor-proxy"),
        pytest.param("registry.local:5000/nvidia/tritonserver:24.06-vllm-python-py3", (12, 5), False, id="ngc-mirror"),
        pytest.param(
            "harbor.example.com/nvcr/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0", (12, 5), False, id="sample-proxy"
        ),
        pytest.param("nvcr.io/nvidia/tritonserver:24.06-vllm-python-py3", (12, 5), False, id="ngc-triton-variant"),
        # 24.06 is CUDA 12.5.0.23 (PyTorch/Triton release notes), not the MXNet container's 12.4.1
        pytest.param("nvcr.io/nvidia/pytorch:24.06-py3", (12, 5), False, id="ngc-24.06-cuda-12.5"),
        pytest.param("nvcr.io/nvidia/pytorch:26.05-py3", (13, 2), False, id="ngc-26.05"),
        pytest.param("nvcr.io/nvidia/pytorch:25.01-py3", (12, 8), True, id="ngc-secondary"),
        pytest.param("vllm/vllm-openai:v0.10.1-cu126", (12, 6), False, id="vllm-suffix"),
        pytest.param("vllm/vllm-openai:nightly-cu129", (12, 9), False, id="vllm-nightly-suffix"),
        # RAPIDS: <RAPIDS>[a]-cuda<X.Y>-py<P> (rapidsai/docker README), on NGC too
        pytest.param("rapidsai/base:25.02-cuda12.8-py3.12", (12, 8), False, id="rapids-base"),
        pytest.param("rapidsai/notebooks:24.12-cuda12.5-py3.12", (12, 5), False, id="rapids-notebooks"),
        pytest.param("rapidsai/base:25.04a-cuda12.8-py3.12", (12, 8), False, id="rapids-nightly"),
        pytest.param("nvcr.io/nvidia/rapidsai/base:25.08-cuda12.9-py3.13", (12, 9), False, id="rapids-ngc"),
        # Ray: <ray>[-py<NNN>]-cu<NNN>[-<arch>] (ray-project/ray docker/ray/README.md)
        pytest.param("rayproject/ray:2.40.0-py310-cu124", (12, 4), False, id="ray"),
        pytest.param("rayproject/ray:2.9.3-cu118", (11, 8), False, id="ray-no-python"),
        pytest.param("rayproject/ray:nightly-py39-cu121-aarch64", (12, 1), False, id="ray-nightly-arch"),
        pytest.param("rayproject/ray-ml:2.9.3-py310-cu118", (11, 8), False, id="ray-ml"),
        pytest.param("rayproject/ray-llm:2.46.0-py311-cu128", (12, 8), False, id="ray-llm"),
        pytest.param("rayproject/ray:2.55.1.68d0e4-extra-py312-cu128", (12, 8), False, id="ray-extra"),
        pytest.param("rayproject/ray-llm:2.46.0-extra-py311-cu128", (12, 8), False, id="ray-llm-extra"),
        pytest.param("rayproject/ray:nightly-extra-py312-cu128", (12, 8), False, id="ray-nightly-extra"),
    ],
)
def test_image_rules(image: str, version: tuple[int, ...], secondary: bool) -> None:
    found = image_cuda(image)
    assert found is not None
    assert found.version[:2] == version and found.secondary is secondary
    d = declared_cuda(container(image=image), {})
    assert d.version == version and d.source.startswith("image tag, ")
    assert ("secondary source" in d.source) is secondary


@pytest.mark.parametrize(
    "image",
    [
        pytest.param("vllm/vllm-openai:v0.10.1", id="vllm-plain-tag-no-cuda"),
        pytest.param("nvidia/cuda:latest", id="no-version-in-tag"),
        pytest.param("nvidia/cuda@sha256:" + "b" * 64, id="digest-only"),
        pytest.param("ubuntu:22.04", id="unrelated"),
        pytest.param("tensorflow/tensorflow:2.15.0", id="tensorflow-cpu"),
        pytest.param("tensorflow/tensorflow:latest-gpu", id="tensorflow-latest"),
        pytest.param("tensorflow/tensorflow:2.99.0-gpu", id="tensorflow-unknown-release"),
        pytest.param("nvcr.io/nvidia/pytorch:99.99-py3", id="ngc-unknown-release"),
        pytest.param("nvcr.io/nvidia/pytorch:26.11-py3", id="ngc-26.11-no-source"),
        # 26.08-26.10 are CUDA 13.4 (Triton release notes), which the driver table has no row for: not taken (see
        # the NGC rule's comment in cuda-images.yaml)
        pytest.param("nvcr.io/nvidia/pytorch:26.10-py3", id="ngc-26.10-cuda-without-a-driver-row"),
        pytest.param("nvcr.io/nvidia/nemo:24.05", id="ngc-other-product"),
        pytest.param("example.com/team/pytorch:24.05-py3", id="ngc-product-elsewhere"),  # not under nvidia/
        # RAPIDS 25.10 on also tags the CUDA major alone: no minor to read
        pytest.param("rapidsai/base:25.12-cuda12-py3.13", id="rapids-major-only"),
        pytest.param("rapidsai/ci-conda:25.10-cuda13.0.2-ubuntu24.04-py3.13", id="rapids-ci-image"),  # not the rule's
        # Ray's -gpu aliases some -cuNNN tag; -cpu and no suffix are Ubuntu
        pytest.param("rayproject/ray:2.40.0-py310-gpu", id="ray-gpu-alias"),
        pytest.param("rayproject/ray:2.40.0-py310-cpu", id="ray-cpu"),
        pytest.param("rayproject/ray:2.40.0", id="ray-no-suffix"),
        pytest.param("rayproject/ray:2.40.0-py310-cu12", id="ray-two-digit-suffix"),
        pytest.param("anyscale/ray:2.40.0-py310-cu124", id="anyscale-not-read"),
        pytest.param("lmsysorg/sglang:v0.4.1-cu124", id="sglang-not-read"),
        pytest.param("", id="empty"),
        pytest.param("nvidia/cuda:" + "1" * 600, id="absurdly-long"),
    ],
)
def test_image_rules_unknown(image: str) -> None:
    assert image_cuda(image) is None
    assert declared_cuda(container(image=image), {}).requirement is None


def test_an_image_too_long_to_read_is_not_kept() -> None:
    """The image's CUDA is kept per reference for the process's life: 400 dryRun pods with a 1 MiB image each held
    400 MiB (74 -> 474 MiB), the length checked only inside the cache."""
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for n in range(20):
            assert image_cuda(f"registry.example/{n}/" + "a" * 100_000 + ":12.4") is None
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 100_000  # was 2 MB: every image kept


def test_image_references_can_be_switched_off() -> None:
    assert declared_cuda(container(image="nvidia/cuda:12.4.1-base"), {}, use_image=False).requirement is None


def test_every_rule_names_its_source() -> None:
    rules = image_rules()
    assert {r.name for r in rules} >= {"nvidia/cuda", "pytorch/pytorch", "tensorflow/tensorflow", "vLLM"}
    assert all(r.source for r in rules)


@pytest.mark.parametrize(
    ("image", "expected"),
    [
        pytest.param("nvidia/cuda:12.4.1-base", ("nvidia/cuda", "12.4.1-base"), id="hub"),
        pytest.param("docker.io/library/ubuntu:22.04", ("ubuntu", "22.04"), id="library"),
        pytest.param("NVCR.IO/nvidia/pytorch:24.05-py3", ("nvcr.io/nvidia/pytorch", "24.05-py3"), id="registry-case"),
        pytest.param("localhost:5000/a/b", ("localhost:5000/a/b", ""), id="port-no-tag"),
        pytest.param("a/b@sha256:0", ("a/b", ""), id="digest"),
    ],
)
def test_split_image(image: str, expected: tuple[str, str]) -> None:
    assert split_image(image) == expected


@pytest.mark.parametrize(
    ("product", "brand"),
    [
        pytest.param("NVIDIA-A100-SXM4-80GB", "tesla", id="a100"),
        pytest.param("NVIDIA-H100-80GB-HBM3", "tesla", id="h100"),
        pytest.param("NVIDIA-H200", "nvidia", id="h200"),
        pytest.param("Tesla-T4", "tesla", id="t4"),
        pytest.param("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "tesla", id="single-strategy-product"),
        pytest.param("NVIDIA-GeForce-RTX-4090", "geforcertx", id="geforce-rtx"),
        pytest.param("NVIDIA-RTX-A6000", "nvidiartx", id="rtx-a6000"),
        pytest.param("Quadro-RTX-6000", "quadrortx", id="quadro-rtx"),
    ],
)
def test_brands(product: str, brand: str) -> None:
    assert brand in brands_of(product)
    assert ("tesla" in brands_of(product)) is (brand in ("tesla", "nvidia"))


def test_unknown_product_has_no_brand() -> None:
    assert brands_of("Some-Future-GPU") == frozenset()


def test_cuda_11_0_needs_its_ga_driver_not_the_release_candidates() -> None:
    """11.0.2 GA needs 450.51.05; 450.36.06 was 11.0.1 RC's (the CUDA release notes' table "CUDA Toolkit and
    Corresponding Driver Versions")."""
    assert TABLE.minimum_driver((11, 0)) == (450, 51, 5)
    assert TABLE.cuda_for_driver((450, 36, 6)) == (10, 2)
    assert TABLE.cuda_for_driver((450, 51, 5)) == (11, 0)


def test_env_references_that_double_at_every_entry_stop_at_a_budget() -> None:
    """Found by a review that attacked the real server: sixty ``V{i} = $(V{i-1})$(V{i-1})`` entries (a 2 kB pod)
    grew a worker to 24 GB until the kernel killed it, answering nothing meanwhile."""
    import time

    doubling = [{"name": f"V{i}", "value": f"$(V{i - 1})$(V{i - 1})"} for i in range(1, 60)]
    bomb = [{"name": "V0", "value": "x"}, *doubling]
    for last in (
        {"name": "CUDA_VERSION", "value": "12.4"},  # its own value: read as ever
        {"name": "CUDA_VERSION", "value": "12.$(V59)"},  # past the budget: unread, said so
    ):
        c: dict[str, Any] = {"name": "c", "image": "ubuntu:24.04", "env": [*bomb, last]}
        started = time.process_time()
        declared = declared_cuda(c, {})
        assert time.process_time() - started < 5.0, "the expansion must stop at its budget, not at 2^60 characters"
        if last["value"] == "12.4":
            assert declared.version == (12, 4)
        else:
            assert declared.version is None
            assert "env CUDA_VERSION (its $(NAME) references expand past 1 MiB in all" in declared.source, declared


@pytest.mark.parametrize(
    ("image", "version", "floors", "platform"),
    [
        # the branches the image's own NVIDIA_REQUIRE_CUDA accepts (data/cuda-images.yaml, nvidia_cuda_forward)
        pytest.param("nvidia/cuda:12.8.0-base-ubuntu22.04", (12, 8), [470, 535, 550, 560, 565], "", id="cuda-12.8"),
        pytest.param("nvidia/cuda:13.0.1-runtime-ubuntu24.04", (13, 0), [535, 550, 565, 570, 575], "", id="cuda-13.0"),
        # before 12.5.1 the Ubuntu arm64 images have no compat package: amd64 nodes only
        pytest.param("nvidia/cuda:12.4.1-base-ubuntu22.04", (12, 4), [470, 525, 535], "amd64", id="cuda-12.4-amd64"),
        pytest.param(
            "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0", (12, 5), [470, 535, 550], "amd64", id="sample"
        ),
        # NGC release notes through 24.02: "470.57 (or later R470), 525.85 (or later R525), 535.86 (or later R535),
        # 545.23 ..."; later releases repeat that list unchanged: their CUDA's compat package's, as nvidia/cuda's
        pytest.param("nvcr.io/nvidia/pytorch:24.01-py3", (12, 3), [470, 525, 535, 545], "", id="ngc-24.01"),
        pytest.param("nvcr.io/nvidia/pytorch:24.06-py3", (12, 5), [470, 535, 550], "amd64", id="ngc-24.06"),
        pytest.param("nvcr.io/nvidia/tritonserver:24.10-py3", (12, 6), [470, 535, 550], "amd64", id="ngc-triton"),
        pytest.param("nvcr.io/nvidia/pytorch:25.12-py3", (13, 1), [], "", id="ngc-13.1.0-none"),
        # without forward compatibility (no row for its CUDA, or no compat package): the CUDA's own driver
        pytest.param("nvcr.io/nvidia/pytorch:25.10-py3", (13, 0), [535, 550, 565, 570, 575], "amd64", id="ngc-13.0"),
        pytest.param("nvidia/cuda:13.1.0-base-ubuntu24.04", (13, 1), [], "", id="cuda-13.1.0-not-found"),
        pytest.param("pytorch/pytorch-nightly:2700000-cu12.8", (12, 8), [], "", id="pytorch-no-compat"),
        # built on nvidia/cuda, their tags naming the minor release only: that minor's row, where its releases agree
        pytest.param("pytorch/pytorch:2.7.0-cuda12.8-cudnn9-devel", (12, 8), [470, 535, 550, 560, 565], "", id="pt"),
        pytest.param("pytorch/pytorch:2.2.0-cuda12.1-cudnn8-devel", (12, 1), [470, 525], "amd64", id="pt-dev-12.1"),
        # 12.5.0's compat package is amd64's alone, 12.5.1's every architecture's: amd64, where both carry it (refused
        # on every amd64 R535 and R550 node before, found by a review)
        pytest.param("pytorch/pytorch:2.4.0-cuda12.5-cudnn9-devel", (12, 5), [470, 535, 550], "amd64", id="pt-12.5"),
        pytest.param("vllm/vllm-openai:nightly-cu129", (12, 9), [535, 550, 560, 565, 570], "", id="vllm-cu129"),
        pytest.param("vllm/vllm-openai:v0.11.0-cu130", (13, 0), [535, 550, 565, 570, 575], "", id="vllm-cu130"),
        pytest.param("rapidsai/base:25.02-cuda12.8-py3.12", (12, 8), [470, 535, 550, 560, 565], "", id="rapids-12.8"),
        pytest.param("rayproject/ray:2.40.0-py310-cu124", (12, 4), [470, 525, 535], "amd64", id="ray-cu124"),
        pytest.param("rayproject/ray:2.10.0-py310-cu125", (12, 5), [470, 535, 550], "amd64", id="ray-cu125"),
        pytest.param("rapidsai/base:24.12-cuda12.5-py3.12", (12, 5), [470, 535, 550], "amd64", id="rapids-12.5"),
        # 11.8.0 was 11.8's only release: its row is the minor's (the data's own "11.8" row)
        pytest.param("pytorch/pytorch:2.1.0-cuda11.8-cudnn8-devel", (11, 8), [470], "amd64", id="pt-dev-11.8"),
        pytest.param("rayproject/ray:2.9.0-py310-cu118", (11, 8), [470], "amd64", id="ray-cu118"),
        # a minor of one release read: its row says nothing of the others (13.1.0 was not found)
        pytest.param("vllm/vllm-openai:nightly-cu131", (13, 1), [], "", id="vllm-cu131-one-release"),
        pytest.param("pytorch/pytorch:1.13.1-cuda11.6-cudnn8-devel", (11, 6), [], "", id="pt-dev-11.6-one-release"),
        pytest.param("nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3", (12, 9), [], "", id="trtllm"),
    ],
)
def test_an_image_read_from_its_tag_brings_its_forward_compatibility(
    image: str, version: tuple[int, int], floors: list[int], platform: str
) -> None:
    requirement = declared_cuda(container(image=image), {}).requirement
    assert requirement is not None and requirement.cuda == version
    forward = requirement.forward_terms
    assert [next(c.value for c in t if c.key == "driver" and c.op == ">=").split(".")[0] for t in forward] == [
        str(f) for f in floors
    ]
    assert all([c.value for c in t if c.key == "platform"] == ([platform] if platform else []) for t in forward)


def test_a_forward_branch_holds_on_data_center_gpus_of_its_platform_only() -> None:
    requirement = declared_cuda(container(image="nvidia/cuda:12.4.1-base-ubuntu22.04"), {}).requirement
    assert requirement is not None

    def on(driver: str, brands: frozenset[str] = DC, platform: str = "amd64") -> object:
        return evaluate(requirement, replace(facts("12.2", driver, brands), platform=platform), TABLE)

    assert on("535.104.05") is True  # an A100 on R535, amd64: the image's compat libraries run CUDA 12.4
    assert on("535.104.05", platform="arm64") is False  # the Ubuntu arm64 image has none
    assert on("535.104.05", platform="") is None  # not known: not trusted (a known driver is then "old")
    assert on("535.104.05", frozenset({"geforce"})) is False  # error 804 on a GeForce
    assert on("545.23.08") is False  # not a branch the image names
    ngc = declared_cuda(container(image="nvcr.io/nvidia/pytorch:24.01-py3"), {}).requirement
    assert ngc is not None
    assert evaluate(ngc, facts("12.2", "535.86.10"), TABLE) is True
    assert evaluate(ngc, facts("12.2", "535.54.03"), TABLE) is False  # below the release notes' 535.86


@pytest.mark.parametrize(
    ("image", "version"),
    [
        # Triton's TensorRT-LLM containers trail the release's CUDA (its "Release Compatibility Matrix")
        pytest.param("nvcr.io/nvidia/tritonserver:24.06-trtllm-python-py3", (12, 4), id="trtllm-24.06"),
        pytest.param("nvcr.io/nvidia/tritonserver:25.10-trtllm-python-py3", (12, 9), id="trtllm-25.10"),
        pytest.param("ghcr.io/pytorch/pytorch-nightly:71739c4-cu12.9.1", (12, 9), id="pytorch-nightly"),
        pytest.param("nvcr.io/nvidia/pytorch:23.10-py3", (12, 2), id="ngc-23.10"),
        pytest.param("nvcr.io/nvidia/tritonserver:26.06-py3", (13, 3), id="ngc-26.06"),
        pytest.param("nvcr.io/nvidia/pytorch:26.07-py3", (13, 3), id="ngc-26.07"),  # CUDA 13.3.1
    ],
)
def test_more_image_rules(image: str, version: tuple[int, int]) -> None:
    found = image_cuda(image)
    assert found is not None and found.version[:2] == version


def test_a_cuda_sample_of_a_release_without_a_forward_row_reads_no_cuda() -> None:
    """nbody-cuda11.7.1 (the device plugin's e2e Job) runs on a T4 of R470 through its base image's compat
    libraries; read as CUDA 11.7 without the row that says so, it was refused (a review of real manifests). A
    sample of a release the table has no row for is not read; 11.7.1's row came with 11.5.2's and 11.6.2's."""
    assert image_cuda("nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.4.3") is None
    assert declared_cuda(container(image="nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda11.4.3"), {}).requirement is None
    for tag in ("nbody-cuda11.7.1", "vectoradd-cuda12.5.0"):
        found = image_cuda(f"nvcr.io/nvidia/k8s/cuda-sample:{tag}")
        assert found is not None and found.forward.floors and found.forward.platform == "amd64"


def test_a_trtllm_release_not_in_its_table_reads_no_cuda_not_the_release_s_other_containers() -> None:
    assert image_cuda("nvcr.io/nvidia/tritonserver:26.10-trtllm-python-py3") is None
    assert image_cuda("nvcr.io/nvidia/tritonserver:26.10-trtllm-python-py3-sbsa") is None


def _nvidia_cuda_rows() -> dict[str, Forward]:
    rule = next(r for r in image_rules() if r.name == "nvidia/cuda")
    return dict(rule.forward)


def test_every_forward_row_names_a_version_or_release_its_rule_reads() -> None:
    cuda_minors = {row for row, _ in TABLE.minimum}
    nvidia_cuda = {parse_version(r.split()[0]) or (): f for r, f in _nvidia_cuda_rows().items()}
    for rule in image_rules():
        for key, forward in rule.forward.items():
            if rule.releases or rule.secondary_releases:
                release = rule.releases.get(key) or rule.secondary_releases.get(key)
                assert release is not None, (rule.name, key)
                # a row taken from nvidia/cuda's is that of the release's own CUDA
                same = [v for v, f in nvidia_cuda.items() if f.floors == forward.floors and v[:2] == release[:2]]
                assert same or key < "24.03", (rule.name, key, release)
            else:  # a CUDA release as the tag names it: X.Y.Z of a CUDA minor the driver table knows
                version = parse_version(key)
                assert version is not None and len(version) in (2, 3) and version[:2] in cuda_minors, (rule.name, key)
                if len(version) == 2:  # a minor's row: the branches every release of that minor has (two or
                    # more; or the one release of a minor that had one, 11.8), on the architecture any of them names
                    releases = [f for k, f in rule.forward.items() if k.startswith(f"{key}.")]
                    assert len(releases) > 1 or key == "11.8", (rule.name, key)
                    assert all(f.floors == forward.floors for f in releases), (rule.name, key)
                    assert {f.platform for f in releases} - {""} <= {forward.platform}, (rule.name, key)


@pytest.mark.parametrize(
    ("image", "version"),
    [
        ("pytorch/pytorch:2.7.0-cuda12.8-cudnn9-devel", (12, 8)),
        ("vllm/vllm-openai:nightly-cu129", (12, 9)),
        ("rapidsai/base:25.02-cuda12.8-py3.12", (12, 8)),
        ("rayproject/ray:2.40.0-py310-cu128", (12, 8)),
        ("pytorch/pytorch-nightly:2700000-cu12.8", (12, 4)),  # FROM ubuntu: no variable of its own
    ],
)
def test_an_image_built_on_nvidia_cuda_decides_over_the_pods_cuda_version(image: str, version: tuple[int, int]) -> None:
    """The runtime reads the NVIDIA_REQUIRE_CUDA these images inherit from nvidia/cuda before a CUDA_VERSION the pod
    sets (a review: a pytorch devel image with CUDA_VERSION=12.4 was admitted on a GeForce of R550)."""
    declared = declared_cuda(container(image=image, env={"CUDA_VERSION": "12.4"}), {})
    assert declared.version == version, declared.source


def test_an_image_reference_past_max_image_is_not_looked_up_in_its_registry() -> None:
    """With cuda.registry on, a pod's 1 MiB image reference went to the reader and was kept as its key (up to
    maxImages of them: GBs a worker), though the tag rules had refused it (found by a review of this session)."""
    asked: list[str] = []

    def configs(image: str) -> None:
        asked.append(image)

    long = "registry.example/team/" + "a" * cuda_version.MAX_IMAGE + ":12.4"
    assert cuda_version.declared_cuda({"name": "c", "image": long}, {}, True, configs).requirement is None
    cuda_version.declared_cuda({"name": "c", "image": "registry.example/team/app:1"}, {}, True, configs)
    assert asked == ["registry.example/team/app:1"]


@pytest.mark.parametrize(
    "image", ["nvcr.io/nvidia/k8s-device-plugin:v0.16.2", "nvcr.io/nvidia/k8s/dcgm-exporter:3.3.8-3.6.0-ubuntu22.04"]
)
def test_nvidias_cluster_components_set_disable_require_in_their_images(image: str) -> None:
    """Their images set NVIDIA_DISABLE_REQUIRE=true: the runtime checks no CUDA for them. They read as 'CUDA
    unknown', warned of on every node and refused under unknownVersion: deny (found by a review of real images).
    A pod that sets the variable itself decides."""
    d = declared_cuda(container(image=image), {})
    assert d.disabled and d.requirement is None and d.source.startswith("its image sets NVIDIA_DISABLE_REQUIRE: ")
    assert declared_cuda(container(image=image, env=env(CUDA_VERSION="12.4")), {}).disabled  # still: the image's
    own = declared_cuda(container(image=image, env=env(NVIDIA_DISABLE_REQUIRE="false", CUDA_VERSION="12.4")), {})
    assert not own.disabled and own.version == (12, 4)
    assert not declared_cuda(container(image=image), {}, use_image=False).disabled

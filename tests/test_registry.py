"""The image's config in its registry (``cuda.registry``): references, the reader against a real registry
(Debian's docker-registry behind Docker's token protocol), what a worker keeps, the CUDA it yields, and the real
server asking in the background while pods wait for nothing."""

from __future__ import annotations

import base64
import contextlib
import copy
import dataclasses
import hashlib
import http.server
import json
import os
import re
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, cast

import jsonpatch
import pytest
import urllib3
import yaml
from cryptography.hazmat.primitives import serialization

from certs.issue import Names, issue_ca, issue_leaf
from tests.conftest import FIXTURES, review
from tests.cuda_fixtures import container, gpu_node, pod, settings
from tests.registry import DOCKER_MANIFEST, Registry, registry
from tests.serving import serve
from webhook import app as app_module
from webhook import cli, decisions, pipeline
from webhook import registry as registry_module
from webhook.app import create_app
from webhook.cluster import PLATFORM_LABEL, StaticCluster, build_view
from webhook.config import ClusterSettings, PoolSettings, RegistrySettings, Settings
from webhook.cuda_version import declared_cuda, gpu_arches
from webhook.errors import ConfigError
from webhook.model import Context
from webhook.registry import (
    PLATFORMS,
    PRUNE_EVERY,
    QUEUE,
    READERS,
    Client,
    Credentials,
    ImageConfig,
    ImageConfigs,
    Reference,
    Unreadable,
    choose_platform,
    config_env,
    inside,
    parse_reference,
    platform_order,
    read_credentials,
)

VLLM = "vllm/vllm-openai:v0.11.0"  # no rule reads its tag: its CUDA is in its config only
REQUIRE_129 = "cuda>=12.9 brand=unknown,driver>=470,driver<471"
R535 = [gpu_node("a-1", "gpu-a", "535.104.05"), gpu_node("a-2", "gpu-a", "535.104.05")]


# ---------------------------------------------------------------------------------------------------------------
# References, configs, indexes


@pytest.mark.parametrize(
    ("image", "expected", "host"),
    [
        ("vllm/vllm-openai:v0.11.0", Reference("docker.io", "vllm/vllm-openai", "v0.11.0"), "registry-1.docker.io"),
        ("ubuntu", Reference("docker.io", "library/ubuntu", "latest"), "registry-1.docker.io"),
        ("docker.io/ollama/ollama", Reference("docker.io", "ollama/ollama", "latest"), "registry-1.docker.io"),
        (
            "index.docker.io/library/python:3.12",
            Reference("docker.io", "library/python", "3.12"),
            "registry-1.docker.io",
        ),
        (
            "nvcr.io/nim/meta/llama-3.1-8b-instruct:1.3",
            Reference("nvcr.io", "nim/meta/llama-3.1-8b-instruct", "1.3"),
            "nvcr.io",
        ),
        ("localhost:5000/team/model", Reference("localhost:5000", "team/model", "latest"), "localhost:5000"),
        ("GHCR.IO/huggingface/tgi:3.0", Reference("ghcr.io", "huggingface/tgi", "3.0"), "ghcr.io"),
        ("x/y:tag@sha256:" + "a" * 64, Reference("docker.io", "x/y", "sha256:" + "a" * 64), "registry-1.docker.io"),
    ],
)
def test_references_read_as_a_runtime_pulls_them(image: str, expected: Reference, host: str) -> None:
    ref = parse_reference(image)
    assert ref == expected
    assert ref.host == host


@pytest.mark.parametrize(
    ("image", "words"),
    [
        ("Team/Model:1", "is not a repository name"),
        ("team/model:bad tag", "is not a tag"),
        ("team/model@sha256:abc", "is not a sha256 digest"),
        ("bad_host.example.com:99999999/x", "is not a registry host"),
    ],
)
def test_a_reference_that_is_none_says_which_part(image: str, words: str) -> None:
    with pytest.raises(Unreadable, match=words):
        parse_reference(image)


def test_only_the_cuda_variables_are_kept_and_a_later_one_wins() -> None:
    config = {"config": {"Env": ["PATH=/bin", "CUDA_VERSION=12.1.0", "CUDA_VERSION=12.4.1", "NOEQUALS", 3]}}
    assert config_env(config) == {"CUDA_VERSION": "12.4.1"}
    assert config_env({"config": None}) == {} == config_env([])


def test_an_index_gives_amd64_first_and_never_an_attestation() -> None:
    digest = {name: "sha256:" + name[0] * 64 for name in ("attestation", "b-arm", "c-amd")}
    index = {
        "manifests": [
            {"digest": digest["attestation"], "platform": {"os": "unknown", "architecture": "unknown"}},
            {"digest": digest["b-arm"], "platform": {"os": "linux", "architecture": "arm64"}},
            {"digest": digest["c-amd"], "platform": {"os": "linux", "architecture": "amd64"}},
        ]
    }
    assert choose_platform(index) == (digest["c-amd"], "linux/amd64")
    del index["manifests"][2]
    assert choose_platform(index) == (digest["b-arm"], "linux/arm64")
    del index["manifests"][1]
    with pytest.raises(Unreadable, match="no Linux image"):
        choose_platform(index)


def test_registry_settings_refuse_what_cannot_work() -> None:
    with pytest.raises(ConfigError, match=r"cuda.registry.plainHttp: 'http://reg:5000'"):
        RegistrySettings(plain_http=["http://reg:5000"])
    with pytest.raises(ConfigError, match="timeoutSeconds"):
        RegistrySettings(timeout_seconds=0)
    with pytest.raises(ConfigError, match="retrySeconds: 1 is below"):
        settings(cuda={"registry": {"retrySeconds": 1}})
    assert settings(cuda={"registry": {"enabled": True, "plainHttp": ["reg.internal:5000"]}}).cuda.registry.enabled


# ---------------------------------------------------------------------------------------------------------------
# The CUDA a config yields


def configs_of(known: dict[str, ImageConfig | None]) -> Any:
    return known.get


def test_a_config_yields_the_cuda_as_the_containers_env_would() -> None:
    where = "docker.io/vllm/vllm-openai:v0.11.0, linux/amd64"
    config = ImageConfig({"NVIDIA_REQUIRE_CUDA": REQUIRE_129, "CUDA_VERSION": "12.9.1"}, where)
    got = declared_cuda(container(image=VLLM), {}, configs=configs_of({VLLM: config}))
    assert got.requirement is not None and got.requirement.text == REQUIRE_129
    assert got.source == f"image config NVIDIA_REQUIRE_CUDA of {where}"
    only_version = ImageConfig({"CUDA_VERSION": "12.9.1"}, where)
    got = declared_cuda(container(image=VLLM), {}, configs=configs_of({VLLM: only_version}))
    assert got.version == (12, 9) and got.source == f"image config CUDA_VERSION of {where}"
    disabled = ImageConfig({"NVIDIA_DISABLE_REQUIRE": "true", "CUDA_VERSION": "12.9.1"}, where)
    assert declared_cuda(container(image=VLLM), {}, configs=configs_of({VLLM: disabled})).disabled
    nothing = declared_cuda(container(image=VLLM), {}, configs=configs_of({VLLM: ImageConfig({}, where)}))
    assert nothing.requirement is None and nothing.source == f"its image's config sets no CUDA variable ({where})"


def test_a_requirement_too_long_to_read_is_said_to_be_so_not_cut() -> None:
    terms = " ".join(f"brand=tesla,driver>={400 + i},driver<{401 + i}" for i in range(200))
    env = config_env({"config": {"Env": [f"NVIDIA_REQUIRE_CUDA=cuda>=12.8 {terms}"]}})
    got = declared_cuda(container(image=VLLM), {}, configs=configs_of({VLLM: ImageConfig(env, "w")}))
    assert got.error == "invalid expression: longer than 4096 characters"  # not a term cut in two


def test_the_image_env_lies_under_the_containers_as_the_runtime_merges_them() -> None:
    def declared(config: ImageConfig | None, env: dict[str, str], image: str = VLLM) -> Any:
        return declared_cuda(container(image=image, env=env), {}, configs=configs_of({image: config}))

    where = f"docker.io/{VLLM}"
    requires = ImageConfig({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8", "CUDA_VERSION": "12.8.1"}, where)
    # the pod's CUDA_VERSION is read after the image's NVIDIA_REQUIRE_CUDA: the runtime checks 12.8
    got = declared(requires, {"CUDA_VERSION": "12.2"})
    assert got.version == (12, 8) and got.source == f"image config NVIDIA_REQUIRE_CUDA of {where}"
    # ... unless the pod sets that one too (even empty: it replaces the image's)
    assert declared(requires, {"CUDA_VERSION": "12.2", "NVIDIA_REQUIRE_CUDA": ""}).source == "env CUDA_VERSION"
    # the image's NVIDIA_DISABLE_REQUIRE turns the runtime's check off under the pod's requirement
    disables = ImageConfig({"NVIDIA_DISABLE_REQUIRE": "true"}, where)
    got = declared(disables, {"NVIDIA_REQUIRE_CUDA": "cuda>=13.0"})
    assert got.disabled and got.source == f"image config NVIDIA_DISABLE_REQUIRE of {where}"
    got = declared(disables, {"NVIDIA_REQUIRE_CUDA": "cuda>=13.0", "NVIDIA_DISABLE_REQUIRE": "false"})
    assert got.version == (13, 0) and got.source == "env NVIDIA_REQUIRE_CUDA"
    # a config that sets nothing above the pod's, one not read yet and one unreadable leave the pod's own value
    quiet = ImageConfig({"NVIDIA_DISABLE_REQUIRE": "0", "CUDA_VERSION": "12.8"}, where)
    for config in (quiet, None, ImageConfig(error="cannot reach docker.io")):
        assert declared(config, {"CUDA_VERSION": "12.2"}).source == "env CUDA_VERSION"
    # a CUDA_VERSION of the pod's set by valueFrom is not read where the image's NVIDIA_REQUIRE_CUDA is (nor is an
    # NVIDIA_REQUIRE_CUDA of the pod's where the image's NVIDIA_DISABLE_REQUIRE is)
    from_map = {"valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}}}
    pod_env = [{"name": "CUDA_VERSION", **from_map}]
    c = {"name": "c", "image": VLLM, "env": pod_env}
    got = declared_cuda(c, {}, configs=configs_of({VLLM: requires}))
    assert got.version == (12, 8) and got.source == f"image config NVIDIA_REQUIRE_CUDA of {where}"
    for config in (quiet, None):  # the pod's unread value decides where the image sets nothing above it
        assert declared_cuda(c, {}, configs=configs_of({VLLM: config})).source.startswith("env CUDA_VERSION (set by")
    c = {"name": "c", "image": VLLM, "env": [{"name": "NVIDIA_REQUIRE_CUDA", **from_map}]}
    assert declared_cuda(c, {}, configs=configs_of({VLLM: disables})).disabled
    assert declared_cuda(c, {}, configs=configs_of({VLLM: requires})).requirement is None  # the pod's own decides
    # an image a tag rule reads is not asked of its registry
    asked: list[str] = []
    tagged = "nvidia/cuda:12.4.1-base-ubuntu22.04"
    declared_cuda(container(image=tagged, env={"CUDA_VERSION": "12.2"}), {}, configs=lambda i: asked.append(i))
    declared_cuda(container(image=tagged), {}, configs=lambda i: asked.append(i))
    assert asked == []


def test_an_unread_config_says_why_and_an_invalid_one_is_an_error() -> None:
    pending = declared_cuda(container(image=VLLM), {}, configs=configs_of({}))
    assert pending.requirement is None and pending.pending
    assert "config was not read yet (it is read from its registry in the background: pods created" in pending.source
    failed = ImageConfig(error="docker.io refuses an anonymous pull of team/model (HTTP 401): a private image?")
    got = declared_cuda(container(image=VLLM), {}, configs=configs_of({VLLM: failed}))
    assert got.source == f"its image's config is unread: {failed.error}" and not got.error
    bad = ImageConfig({"NVIDIA_REQUIRE_CUDA": "cuda>>12"}, "w")
    got = declared_cuda(container(image=VLLM), {}, configs=configs_of({VLLM: bad}))
    assert got.error.startswith("invalid expression") and got.source == "image config NVIDIA_REQUIRE_CUDA of w"


# ---------------------------------------------------------------------------------------------------------------
# What a worker keeps


class Fake:
    """A registry client that answers with ``read`` and names ``digests`` on a HEAD (none: ""); ``orders``: the
    platform order of each read."""

    def __init__(self, read: Callable[[Reference], ImageConfig], digests: dict[str, str] | None = None) -> None:
        self.read, self.digests, self.heads = read, digests or {}, 0
        self.orders: list[tuple[str, ...]] = []

    def config(self, ref: Reference, order: Sequence[tuple[str, str]] = PLATFORMS) -> ImageConfig:
        self.orders.append(tuple("/".join(p) for p in order))
        return self.read(ref)

    def digest(self, ref: Reference) -> str:
        self.heads += 1
        return self.digests.get(ref.repository, "")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_worker_reads_once_keeps_for_a_while_and_counts_what_changed() -> None:
    clock, reads = Clock(), []
    answers = {"team/a": ImageConfig({"CUDA_VERSION": "12.4"}, "a")}

    def read(ref: Reference) -> ImageConfig:
        reads.append(ref.repository)
        if ref.repository in answers:
            return answers[ref.repository]
        raise Unreadable("no such image")

    settings = RegistrySettings(enabled=True, refresh_seconds=600, retry_seconds=60)
    known = ImageConfigs(settings, Fake(read), clock, background=False)  # a look at a due image reads it then
    first = known.read_now("team/a:1")
    assert first == answers["team/a"] and known.lookup("team/a:1") == first
    used = (("team/a:1", first),)  # what an answer kept for replicas found
    known.read_now("team/a:1")  # the same answer read again: nothing changed, the answer holds
    assert known.holds(used) and reads == ["team/a", "team/a"]
    assert known.read_now("team/b:1").error == "no such image" and known.holds(used)  # another image's read
    # a digest's config is kept for good; a tag's read again after refreshSeconds, a failure after retrySeconds
    digest = "team/a@sha256:" + "0" * 64
    known.read_now(digest)
    clock.now += 61
    assert known._known["team/b:1"].until < clock.now <= known._known["team/a:1"].until
    clock.now += 600
    assert known._known[digest].until > clock.now
    # a config fallen due is looked at again by the replica that finds it, and what it said holds if unchanged
    assert known.holds(used) and reads == ["team/a", "team/a", "team/b", "team/a", "team/a"]
    assert known.holds(used) and len(reads) == 5  # read once, not due again until refreshSeconds from now
    answers["team/a"] = ImageConfig({"CUDA_VERSION": "12.8"}, "a")
    assert known.read_now("team/a:1").env == {"CUDA_VERSION": "12.8"} and not known.holds(used)


def test_registries_not_listed_are_not_read_and_the_oldest_image_goes_first() -> None:
    reads: list[str] = []

    def read(ref: Reference) -> ImageConfig:
        reads.append(str(ref))
        return ImageConfig({"CUDA_VERSION": "12.4"}, str(ref))

    known = ImageConfigs(RegistrySettings(enabled=True, registries=["nvcr.io"], max_images=2), Fake(read), Clock())
    assert "docker.io is not among the registries read" in known.read_now("vllm/vllm-openai:v1").error
    known.read_now("nvcr.io/nim/a:1")
    known.read_now("nvcr.io/nim/b:1")
    assert list(known._known) == ["nvcr.io/nim/a:1", "nvcr.io/nim/b:1"]
    assert reads == ["nvcr.io/nim/a:1", "nvcr.io/nim/b:1"]


def test_a_tag_is_read_again_only_when_it_names_another_digest_and_a_failure_keeps_what_was_read() -> None:
    clock = Clock()
    versions = {"team/a": "12.4"}

    def read(ref: Reference) -> ImageConfig:
        if ref.repository not in versions:
            raise Unreadable("cannot reach registry.example: timed out")
        version = versions[ref.repository]
        return ImageConfig({"CUDA_VERSION": version}, str(ref), digest=f"sha256:{version[-1] * 64}")

    fake = Fake(read, {"team/a": "sha256:" + "4" * 64})
    known = ImageConfigs(RegistrySettings(enabled=True, refresh_seconds=600, retry_seconds=60), fake, clock)
    first = known.read_now("team/a:1")
    assert known.read_now("team/a:1") is first and fake.heads == 1 and known.counts["unchanged"] == 1
    assert known.holds((("team/a:1", first),))
    versions["team/a"], fake.digests["team/a"] = "12.8", "sha256:" + "8" * 64  # the tag pushed anew
    second = known.read_now("team/a:1")
    assert second.env == {"CUDA_VERSION": "12.8"} and not known.holds((("team/a:1", first),))
    del versions["team/a"]  # the registry away: what it said before stands, asked again after retrySeconds
    fake.digests.clear()
    assert known.read_now("team/a:1").env == {"CUDA_VERSION": "12.8"}
    assert known.counts["unreadable"] == 1 and known.holds((("team/a:1", second),))
    assert known._known["team/a:1"].until == clock.now + 60


def test_the_workers_of_one_server_share_what_they_read(tmp_path: Path) -> None:
    reads: list[str] = []

    def read(ref: Reference) -> ImageConfig:
        reads.append(ref.repository)
        return ImageConfig({"CUDA_VERSION": "12.6"}, str(ref), digest="sha256:" + "6" * 64)

    one, other = (ImageConfigs(RegistrySettings(enabled=True), Fake(read), shared=tmp_path) for _ in range(2))
    config = one.read_now(VLLM)
    assert other.read_now(VLLM) == config and reads == ["vllm/vllm-openai"]
    assert other.counts["shared"] == 1 and other.lookup(VLLM) == config
    # a record out of date, or not whole, is not taken: the registry is asked
    (record,) = tmp_path.glob("*.json")
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "until": time.time() - 1}))
    assert ImageConfigs(RegistrySettings(enabled=True), Fake(read), shared=tmp_path).read_now(VLLM) == config
    record.write_text("{not json")
    assert ImageConfigs(RegistrySettings(enabled=True), Fake(read), shared=tmp_path).read_now(VLLM) == config
    assert reads == ["vllm/vllm-openai"] * 3


def test_a_config_read_for_another_platform_is_read_again_when_the_cluster_prefers_another(tmp_path: Path) -> None:
    """Found by a review: a config read while the cluster's GPU nodes preferred amd64 (a view not synced yet, the
    nodes added later) was kept for good, a tag's HEAD naming the same index and a digest's never read again."""
    order: list[tuple[tuple[str, str], ...]] = [PLATFORMS]
    fake = Fake(lambda ref: ImageConfig({"CUDA_VERSION": "12.6"}, str(ref), digest="sha256:" + "6" * 64))
    fake.digests["vllm/vllm-openai"] = "sha256:" + "6" * 64

    def configs(shared: Path) -> ImageConfigs:
        return ImageConfigs(
            RegistrySettings(enabled=True), fake, background=False, shared=shared, platforms=lambda: order[0]
        )

    known = configs(tmp_path / "one")
    (tmp_path / "one").mkdir()
    digest = "team/a@sha256:" + "0" * 64
    assert known.lookup(VLLM).preferred == known.lookup(digest).preferred == "linux/amd64"  # type: ignore[union-attr]
    assert fake.orders == [("linux/amd64", "linux/arm64")] * 2
    order[0] = platform_order(["arm64"])  # the view synced: GH200 nodes
    assert known.lookup(VLLM).preferred == known.lookup(digest).preferred == "linux/arm64"  # type: ignore[union-attr]
    assert fake.orders[2:] == [("linux/arm64", "linux/amd64")] * 2 and fake.heads == 0  # read, not a HEAD
    assert known.lookup(VLLM).preferred == "linux/arm64" and len(fake.orders) == 4  # type: ignore[union-attr]
    # another worker's read for the platform its view preferred is not taken by one whose view prefers another
    assert configs(tmp_path / "one").lookup(VLLM).preferred == "linux/arm64" and len(fake.orders) == 4  # type: ignore[union-attr]
    order[0] = PLATFORMS
    assert configs(tmp_path / "one").lookup(VLLM).preferred == "linux/amd64" and len(fake.orders) == 5  # type: ignore[union-attr]


def test_the_platform_order_is_worked_out_once_per_view(monkeypatch: pytest.MonkeyPatch) -> None:
    worked: list[Any] = []

    def counted(view: Any) -> list[str]:
        worked.append(view)
        return gpu_arches(view)

    monkeypatch.setattr(app_module, "gpu_arches", counted)
    s = settings()
    arm = build_view([gpu_node("g-1", "gh200", "550.54.15", labels={PLATFORM_LABEL: "arm64"})], s)
    amd = build_view([gpu_node("a-1", "gpu-a", "550.54.15", labels={PLATFORM_LABEL: "amd64"})], s)
    views = iter([arm, arm, amd])
    order = app_module._platform_order(cast(Any, type("Source", (), {"snapshot": lambda self: next(views)})()))
    assert order()[0] == order()[0] == ("linux", "arm64") and order()[0] == ("linux", "amd64")
    assert worked == [arm, amd]  # the second look at the same view used what the first worked out
    # a declared pool of a Grace product with no kubernetes.io/arch in its nodeSelector: arm64
    pool = PoolSettings(
        name="gb200", node_selector={"pool": "gb200"}, gpu_product="NVIDIA-GB200", driver_version="570.124.06"
    )
    declared = build_view([], Settings(cluster=ClusterSettings(pools=[pool])), known=False)
    assert gpu_arches(declared) == ["arm64"]
    pool = PoolSettings(
        name="h100", node_selector={"pool": "h100"}, gpu_product="NVIDIA-H100-80GB-HBM3", driver_version="570.124.06"
    )
    assert gpu_arches(build_view([], Settings(cluster=ClusterSettings(pools=[pool])), known=False)) == [""]


def test_a_failure_is_not_shared_and_a_worker_takes_what_another_read_at_its_first_lookup(tmp_path: Path) -> None:
    answers: dict[str, ImageConfig | Unreadable] = {VLLM: Unreadable("cannot reach docker.io")}

    def read(ref: Reference) -> ImageConfig:
        found = answers[str(ref).removeprefix("docker.io/")]
        if isinstance(found, Unreadable):
            raise found
        return found

    one = ImageConfigs(RegistrySettings(enabled=True), Fake(read), shared=tmp_path)
    assert one.read_now(VLLM).error and not list(tmp_path.glob("*.json"))
    answers[VLLM] = ImageConfig({"CUDA_VERSION": "12.6"}, "w")
    one.read_now(VLLM)
    other = ImageConfigs(RegistrySettings(enabled=True), Fake(read), shared=tmp_path)
    assert other.lookup(VLLM) == answers[VLLM]  # from the file, in the review itself: not "not read yet"
    assert other.counts["shared"] == 1 and not other._asked


def test_the_shared_directory_keeps_at_most_max_images(tmp_path: Path) -> None:
    known = ImageConfigs(
        RegistrySettings(enabled=True, max_images=10), Fake(lambda ref: ImageConfig({}, str(ref))), shared=tmp_path
    )
    (tmp_path / ".left-by-a-killed-worker").write_text("{")
    os.utime(tmp_path / ".left-by-a-killed-worker", (time.time() - 120, time.time() - 120))
    for i in range(PRUNE_EVERY):
        known.read_now(f"team/model-{i}:1")
    assert len(list(tmp_path.iterdir())) == 10


def test_readers_that_died_are_replaced_and_only_they() -> None:
    known = ImageConfigs(RegistrySettings(enabled=True), Fake(lambda ref: ImageConfig({}, str(ref))))
    known._start()
    first = list(known._readers)
    dead = threading.Thread(target=lambda: None)
    dead.start()
    dead.join()
    known._readers[0] = dead
    known._start()
    assert len(known._readers) == READERS and first[1] in known._readers and dead not in known._readers


def test_a_reader_that_fails_unexpectedly_says_so_and_waits_to_try_again(caplog: pytest.LogCaptureFixture) -> None:
    def read(ref: Reference) -> ImageConfig:
        raise KeyError("config")

    clock = Clock()
    known = ImageConfigs(RegistrySettings(enabled=True, retry_seconds=60), Fake(read), clock)
    got = known.read_now(VLLM)
    assert got.error == "reading it failed (KeyError; see the webhook's log)"
    assert "reading the config of 'vllm/vllm-openai:v0.11.0'" in caplog.text
    assert known._known[VLLM].until == clock.now + 60


def test_a_lookup_answers_at_once_and_the_readers_fill_in() -> None:
    gate = threading.Event()

    def read(ref: Reference) -> ImageConfig:
        gate.wait(10)
        return ImageConfig({"CUDA_VERSION": "12.4"}, str(ref))

    known = ImageConfigs(RegistrySettings(enabled=True), Fake(read))
    started = time.monotonic()
    assert known.lookup(VLLM) is None and known.lookup(VLLM) is None  # asked once, answered without waiting
    assert time.monotonic() - started < 1.0
    gate.set()
    deadline = time.monotonic() + 10
    while known.lookup(VLLM) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert known.lookup(VLLM) == ImageConfig({"CUDA_VERSION": "12.4"}, f"docker.io/{VLLM}")
    assert known.counts["read"] == 1


# ---------------------------------------------------------------------------------------------------------------
# Through the pipeline, and the answers kept for replicas


def _ctx(known: ImageConfigs, nodes: list[dict[str, Any]] = R535) -> Context:
    s = settings(cuda={"registry": {"enabled": True}})
    return Context(settings=s, cluster=build_view(nodes, s), namespace="ml", images=known)


def test_a_pod_is_checked_against_its_images_config_once_it_is_read() -> None:
    config = ImageConfig({"NVIDIA_REQUIRE_CUDA": REQUIRE_129}, f"docker.io/{VLLM}, linux/amd64")
    known = ImageConfigs(RegistrySettings(enabled=True), Fake(lambda ref: config), Clock())
    known._asked.add(VLLM)  # as if its readers were busy: nothing read yet
    ctx = _ctx(known)
    first = pipeline.validate(pod(container(image=VLLM)), ctx)
    assert first.allowed
    assert any("CUDA version unknown" in w for w in first.warnings), first.warnings
    known.read_now(VLLM)
    later = pipeline.validate(pod(container(image=VLLM)), ctx)
    assert not later.allowed
    assert f"CUDA 12.9 (from image config NVIDIA_REQUIRE_CUDA of docker.io/{VLLM}, linux/amd64)" in later.message
    assert "pool gpu-a (driver 535.104.05, CUDA 12.2)" in later.message
    # the same image with the registry off: unknown, as before
    off = settings()
    assert pipeline.validate(pod(container(image=VLLM)), Context(settings=off, cluster=build_view(R535, off))).allowed


def test_a_pod_refused_for_an_unknown_cuda_while_its_config_is_read_is_told_to_come_back() -> None:
    known = ImageConfigs(RegistrySettings(enabled=True), Fake(lambda ref: ImageConfig({}, "w")), Clock())
    known._asked.add(VLLM)
    s = settings(cuda={"unknownVersion": "deny", "registry": {"enabled": True}})
    ctx = Context(settings=s, cluster=build_view(R535, s), namespace="ml", images=known)
    refused = pipeline.validate(pod(container(image=VLLM)), ctx)
    assert not refused.allowed
    assert "its image's config was not read yet" in refused.message
    assert "To fix: Create the pod again in a few seconds (a controller does so by itself)" in refused.message


def test_an_answer_kept_for_replicas_is_not_handed_out_once_the_config_is_read() -> None:
    config = ImageConfig({"CUDA_VERSION": "12.9"}, f"docker.io/{VLLM}")
    known = ImageConfigs(RegistrySettings(enabled=True), Fake(lambda ref: config), Clock())
    known._asked.add(VLLM)
    ctx = _ctx(known)
    body = _review(VLLM)

    def allowed() -> bool:
        _, result, _ = decisions.decide(
            "validate", pipeline.validate, body, "application/json", ctx.settings, ctx.cluster, known
        )
        return result.allowed

    assert allowed() and allowed()  # each asks again: no answer is kept while the image is unread
    known.read_now(VLLM)
    assert not allowed()


def _review(image: str, uid: str = "u1", name: str = "llm-7d9f-abcde") -> bytes:
    return json.dumps(review_of(image, uid, name)).encode()


def review_of(image: str, uid: str = "u1", name: str = "llm-7d9f-abcde") -> dict[str, Any]:
    """An AdmissionReview of a pod of one GPU container running ``image``, as its ReplicaSet creates it."""
    obj = pod(container(image=image), name=name)
    obj["metadata"]["uid"] = f"{uid}-pod"
    return review(obj, namespace="ml", uid=uid)


def _replicas(known: ImageConfigs) -> Callable[[int], pipeline.Result]:
    """The answers at /validate to the replicas of a ReplicaSet running VLLM (against R535), by their number."""
    ctx = _ctx(known)

    def replica(i: int) -> pipeline.Result:
        body = _review(VLLM, uid=f"0000{i}-aaaa", name=f"llm-7d9f-0000{i}")
        return decisions.decide(
            "validate", pipeline.validate, body, "application/json", ctx.settings, ctx.cluster, known
        )[1]

    return replica


def test_replicas_answered_from_a_template_are_checked_again_when_the_config_changes() -> None:
    configs = {"now": ImageConfig({"CUDA_VERSION": "12.1"}, f"docker.io/{VLLM}")}
    known = ImageConfigs(RegistrySettings(enabled=True), Fake(lambda ref: configs["now"]), Clock())
    replica = _replicas(known)
    assert replica(0).allowed and not replica(1).reused  # not kept while the image was unread
    known.read_now(VLLM)
    assert all(replica(i).allowed for i in range(2, 7))
    assert replica(7).replayed  # the replicas are answered from a template by now
    configs["now"] = ImageConfig({"CUDA_VERSION": "12.9"}, f"docker.io/{VLLM}")  # the tag pushed anew
    known.read_now(VLLM)
    later = replica(8)
    assert not later.allowed and not later.replayed


def test_an_answer_that_looked_no_image_up_is_kept_whatever_is_read() -> None:
    known = ImageConfigs(RegistrySettings(enabled=True), Fake(lambda ref: ImageConfig({}, "w")), Clock())
    ctx = _ctx(known)
    body = _review("nvidia/cuda:12.4.1-base-ubuntu22.04")  # its tag tells its CUDA: no registry asked

    def decided() -> pipeline.Result:
        return decisions.decide(
            "validate", pipeline.validate, body, "application/json", ctx.settings, ctx.cluster, known
        )[1]

    assert not decided().reused
    known.read_now("team/other:1")  # another image read: the generation moves on
    assert decided().reused and known.counts["read"] == 1


def test_an_answer_is_given_anew_only_when_one_of_its_own_images_reads_otherwise() -> None:
    """Found by the last session's note: one generation for every image gave anew every kept answer that had looked
    any image up, whenever any config was read or fell due (with 2,000 images, one every few seconds)."""
    clock, reads = Clock(), []
    configs = {"vllm/vllm-openai": ImageConfig({"CUDA_VERSION": "12.1"}, "v"), "team/other": ImageConfig({}, "o")}

    def read(ref: Reference) -> ImageConfig:
        reads.append(ref.repository)
        return configs[ref.repository]

    known = ImageConfigs(RegistrySettings(enabled=True, refresh_seconds=600), Fake(read), clock, background=False)
    replica = _replicas(known)
    assert replica(0).allowed and not replica(0).replayed
    assert all(replica(i).reused for i in range(1, 4)) and replica(4).replayed  # a template by now
    known.read_now("team/other:1")  # another image read, and then read otherwise
    configs["team/other"] = ImageConfig({"CUDA_VERSION": "13.0"}, "o")
    known.read_now("team/other:1")
    assert replica(5).replayed
    clock.now += 601  # its own image falls due: the replica that finds it has it looked at again
    assert replica(6).replayed and reads.count("vllm/vllm-openai") == 2
    configs["vllm/vllm-openai"] = ImageConfig({"CUDA_VERSION": "12.9"}, "v")  # the tag pushed anew
    clock.now += 601
    later = replica(7)
    assert not later.allowed and not later.replayed and not later.reused


def test_a_template_of_another_image_is_not_looked_up_for_a_request() -> None:
    """Found by a review: every template of a body's length had its images looked up before its match, so an
    answer kept what another image found too, and was given anew when only that one changed."""
    configs = {"team/aaaa": ImageConfig({"CUDA_VERSION": "12.1"}, "a"), "team/cccc": ImageConfig({}, "c")}
    known = ImageConfigs(
        RegistrySettings(enabled=True), Fake(lambda ref: configs[ref.repository]), Clock(), background=False
    )
    ctx = _ctx(known)

    def replica(image: str, i: int) -> pipeline.Result:
        body = _review(image, uid=f"0000{i}-aaaa", name=f"llm-7d9f-0000{i}")  # both images' bodies of one length
        return decisions.decide(
            "validate", pipeline.validate, body, "application/json", ctx.settings, ctx.cluster, known
        )[1]

    assert all(replica("team/aaaa:1", i).allowed for i in range(6))
    assert [replica("team/cccc:1", i).replayed for i in range(6)][-1]
    configs["team/aaaa"] = ImageConfig({"CUDA_VERSION": "12.2"}, "a")
    known.read_now("team/aaaa:1")  # only the other image reads otherwise
    assert replica("team/cccc:1", 6).replayed


def test_an_answer_given_while_the_registry_failed_is_given_anew_once_it_is_asked_again() -> None:
    clock = Clock()
    failing = [True]

    def read(ref: Reference) -> ImageConfig:
        if failing[0]:
            raise Unreadable("docker.io limits the pulls from here (HTTP 429)", retry_after=120)
        return ImageConfig({"CUDA_VERSION": "12.9"}, str(ref))

    known = ImageConfigs(RegistrySettings(enabled=True, retry_seconds=60), Fake(read), clock, background=False)
    ctx = _ctx(known)

    def allowed() -> bool:
        body = _review(VLLM)
        return decisions.decide(
            "validate", pipeline.validate, body, "application/json", ctx.settings, ctx.cluster, known
        )[1].allowed

    assert allowed() and allowed() and allowed()
    failing[0] = False
    clock.now += 100  # the registry asked for 120 s (Retry-After), more than retrySeconds
    assert allowed()
    clock.now += 21
    assert not allowed()


# ---------------------------------------------------------------------------------------------------------------
# A real registry


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    with registry(tmp_path_factory.mktemp("registry")) as running:
        yield running


def test_the_reader_reads_every_kind_of_image_from_a_real_registry(real: Registry) -> None:
    h = real.host
    digest = real.image("vllm/vllm-openai", "v1", ["PATH=/usr/bin", f"NVIDIA_REQUIRE_CUDA={REQUIRE_129}"])
    real.image("old/docker-format", "v1", ["CUDA_VERSION=11.8.0"], media=DOCKER_MANIFEST)
    index = real.index("multi/arch", "v1", {"arm64": ["CUDA_VERSION=12.4.1"], "amd64": ["CUDA_VERSION=12.6.3"]})
    real.index("arm/only", "v1", {"arm64": ["CUDA_VERSION=12.8.0"]})
    real.image("private/model", "v1", ["CUDA_VERSION=12.1"])
    client = Client(RegistrySettings(enabled=True, plain_http=[h]))

    def read(image: str) -> ImageConfig:
        return client.config(parse_reference(image))

    tagged = ImageConfig({"NVIDIA_REQUIRE_CUDA": REQUIRE_129}, f"{h}/vllm/vllm-openai:v1", digest=digest)
    assert read(f"{h}/vllm/vllm-openai:v1") == tagged
    by_digest = read(f"{h}/vllm/vllm-openai@{digest}")
    assert by_digest.env == tagged.env and by_digest.where == f"{h}/vllm/vllm-openai@{digest[:19]}"
    assert read(f"{h}/old/docker-format:v1").env == {"CUDA_VERSION": "11.8.0"}
    multi = read(f"{h}/multi/arch:v1")
    assert multi == ImageConfig({"CUDA_VERSION": "12.6.3"}, f"{h}/multi/arch:v1, linux/amd64", digest=index)
    assert read(f"{h}/arm/only:v1").env == {"CUDA_VERSION": "12.8.0"}
    assert read(f"{h}/arm/only:v1").where == f"{h}/arm/only:v1, linux/arm64"
    # a HEAD names the digest a tag points at (what a refresh compares before it reads again)
    assert client.digest(parse_reference(f"{h}/multi/arch:v1")) == index
    real.index("multi/arch", "v1", {"amd64": ["CUDA_VERSION=12.8.1"]}, attestation=False)
    assert client.digest(parse_reference(f"{h}/multi/arch:v1")) not in ("", index)
    with pytest.raises(Unreadable, match=rf"^{h} refuses an anonymous pull of private/model \(HTTP 401\)"):
        read(f"{h}/private/model:v1")
    with pytest.raises(Unreadable, match=rf"^{h} has no manifest for {h}/vllm/vllm-openai:v2 \(HTTP 404\)"):
        read(f"{h}/vllm/vllm-openai:v2")
    # anonymous pulls, each with the token the registry's 401 named (kept for the next read of the repository)
    anonymous = [scope for scope, pusher in real.tokens.asked if not pusher]
    assert anonymous.count("repository:vllm/vllm-openai:pull") == 1
    assert "repository:private/model:pull" in anonymous
    # an address inside the cluster or the node is read only where listed; over HTTPS unless plainHttp lists it
    unlisted = Client(RegistrySettings(enabled=True, timeout_seconds=2))
    with pytest.raises(Unreadable, match=f"^{h} is inside the cluster or the node: read only where"):
        unlisted.config(parse_reference(f"{h}/vllm/vllm-openai:v1"))
    https = Client(RegistrySettings(enabled=True, registries=[h], timeout_seconds=2))
    with pytest.raises(Unreadable, match=rf"^cannot reach {h} \(the webhook's log says why\)$"):
        https.config(parse_reference(f"{h}/vllm/vllm-openai:v1"))


def test_credentials_are_read_as_docker_login_writes_them() -> None:
    pair = base64.b64encode(b"$oauthtoken:nvapi-123").decode()
    text = json.dumps(
        {
            "auths": {
                "nvcr.io": {"auth": pair},
                "https://index.docker.io/v1/": {"username": "me", "password": "pw"},
                "harbor.corp.example:8443": {"username": "robot$pull", "password": "s3cret"},
            }
        }
    )
    got = read_credentials(text)
    assert got["nvcr.io"] == f"Basic {pair}"
    assert got["docker.io"] == "Basic " + base64.b64encode(b"me:pw").decode()
    assert got["harbor.corp.example:8443"] == "Basic " + base64.b64encode(b"robot$pull:s3cret").decode()
    assert list(read_credentials('{"auths": {"https://nvcr.io:443/v2/": {"auth": "YTpi"}}}')) == ["nvcr.io"]
    for bad, words in [
        ("{}", r"no credentials in 'auths' \(a .dockerconfigjson has one\)"),
        ('{"credsStore": "desktop"}', "credsStore and credHelpers keep them outside the file"),
        ('{"auths": {"nvcr.io": {}}}', "neither auth nor username and password"),
        ('{"auths": {"nvcr.io": {"auth": "bm9jb2xvbg=="}}}', "its auth is not user:password"),
        ('{"auths": {"x.azurecr.io": {"identitytoken": "eyJ"}}}', r"an identitytoken \(az acr login\) is not read"),
        ('{"auths": {"*.azurecr.io": {"auth": "YTpi"}}}', "a wildcard is not read"),
        ('{"auths": {"ghcr.io/team-a": {"auth": "YTpi"}, "ghcr.io/team-b": {"auth": "YTpi"}}}', "a second entry"),
    ]:
        with pytest.raises(ValueError, match=words):
            read_credentials(bad)


def test_a_private_image_is_read_with_the_credentials_and_only_by_its_registry(real: Registry, tmp_path: Path) -> None:
    h = real.host
    real.image("private/llm", "v1", ["CUDA_VERSION=12.9.1"])
    credentials = tmp_path / "config.json"
    credentials.write_text(json.dumps({"auths": {"elsewhere.example": {"username": "pusher", "password": "secret"}}}))
    client = Client(RegistrySettings(enabled=True, plain_http=[h], credentials_file=str(credentials)))
    with pytest.raises(Unreadable, match="refuses an anonymous pull of private/llm"):
        client.config(parse_reference(f"{h}/private/llm:v1"))
    # an account the token service refuses: said as such, and a public image is still read without it
    credentials.write_text(json.dumps({"auths": {h: {"username": "pusher", "password": "wrong"}}}))
    real.image("public/llm", "v1", ["CUDA_VERSION=12.4.1"])
    assert client.config(parse_reference(f"{h}/public/llm:v1")).env == {"CUDA_VERSION": "12.4.1"}
    with pytest.raises(Unreadable, match=f"^{h} refuses the pull account of cuda.registry.credentialsFile"):
        client.config(parse_reference(f"{h}/private/llm:v1"))
    # the Secret renewed with this registry's entry: read again, and used
    credentials.write_text(json.dumps({"auths": {h: {"username": "pusher", "password": "secret"}}}))
    assert client.config(parse_reference(f"{h}/private/llm:v1")).env == {"CUDA_VERSION": "12.9.1"}
    assert real.tokens.asked[-1] == ("repository:private/llm:pull", True)


def test_a_credentials_file_missing_says_so_at_its_first_use(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert Credentials(str(tmp_path / "absent.json")).get("nvcr.io") is None
    assert (
        "absent.json: [Errno 2] No such file or directory" in caplog.text and "no credentials are used" in caplog.text
    )


@pytest.mark.parametrize(
    ("key", "content", "words"),
    [
        ("credentialsFile", '{"auths": {"nvcr.io": {}}}', "auths['nvcr.io'] has neither auth"),
        ("caFile", "not a certificate", "not a PEM file of CA certificates"),
    ],
)
def test_serve_refuses_a_registry_file_it_cannot_use(tmp_path: Path, key: str, content: str, words: str) -> None:
    config = tmp_path / "config.yaml"
    bad = tmp_path / "file"
    bad.write_text(content)
    config.write_text(yaml.safe_dump({"cuda": {"registry": {"enabled": True, key: str(bad)}}}))
    certs = tmp_path / "certs"
    args = ["serve", "--config", str(config), "--cert", str(certs / "c"), "--key", str(certs / "k")]
    done = subprocess.run([sys.executable, "-m", "webhook.cli", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == cli.EXIT_UNUSABLE
    assert f"cuda.registry.{key} {bad}: {words}" in done.stderr


def test_check_config_reads_the_registry_files_as_serve_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """check-config exits 0 only where serve would start: the registry files are read (found by a review); a file not
    there passes only with --absent-registry-files (the chart's hook, whose optional volumes wait on nothing)."""
    credentials = tmp_path / "config.json"
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"cuda": {"registry": {"enabled": True, "credentialsFile": str(credentials)}}}))
    check = ["check-config", "--config", str(config)]
    assert cli.main(check) == cli.EXIT_UNUSABLE
    missing = f"gpu-admission: cuda.registry.credentialsFile {credentials}: [Errno 2] No such file or directory: "
    assert capsys.readouterr().err == f"{missing}'{credentials}'\n"
    assert cli.main([*check, "--absent-registry-files"]) == 0
    assert capsys.readouterr() == (f"{config}: settings the server loads\n", "")
    credentials.write_text('{"auths": {"nvcr.io": {}}}')
    assert cli.main([*check, "--absent-registry-files"]) == cli.EXIT_UNUSABLE
    unusable = f"gpu-admission: cuda.registry.credentialsFile {credentials}: auths['nvcr.io'] has neither auth"
    assert capsys.readouterr().err.startswith(unusable)


BASIC = "Basic " + base64.b64encode(b"user:pass").decode()


class _Quirky(http.server.BaseHTTPRequestHandler):
    """A registry with the ways of real ones the Debian registry does not have: blobs served from another host (Docker
    Hub's CDN), manifests redirected to another host (registry.k8s.io), a Basic challenge offered before the Bearer
    one, unquoted parameters, tokens that stop being accepted, a manifest served as application/json without its
    mediaType, an index whose entries name no platform, a blob that trickles, a 429 with Retry-After."""

    config = json.dumps({"config": {"Env": ["CUDA_VERSION=12.6.3"]}}).encode()
    seen: ClassVar[list[tuple[str, str | None]]] = []
    issued: ClassVar[list[str]] = []
    accepted: ClassVar[set[str]] = set()
    trickle: ClassVar[float] = 0.0

    def do_GET(self) -> None:
        kind = type(self)
        digest = "sha256:" + hashlib.sha256(self.config).hexdigest()
        manifest = json.dumps({"schemaVersion": 2, "config": {"digest": digest}}).encode()
        index = json.dumps({"manifests": [{"digest": "sha256:" + hashlib.sha256(manifest).hexdigest()}]}).encode()
        port = self.headers["Host"].rsplit(":", 1)[1]
        kind.seen.append((self.path, self.headers.get("Authorization")))
        if self.path.startswith("/token"):
            kind.issued.append(f"t{len(kind.issued)}")
            kind.accepted.add(kind.issued[-1])
            self._answer(200, json.dumps({"access_token": kind.issued[-1], "expires_in": 300}).encode())
        elif self.path.startswith("/v2/slow-headers/"):
            with contextlib.suppress(OSError):
                for byte in b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Padding: " + b"x" * 200:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.1)
        elif self.path.startswith("/v2/to-metadata/"):
            self._answer(307, b"", {"Location": "https://169.254.169.254/latest/meta-data/"})
        elif self.path.startswith("/v2/to-ftp/"):
            self._answer(307, b"", {"Location": "ftp://files.example.com/blob"})
        elif self.path.startswith("/v2/realm-inside/"):
            self._answer(401, b"{}", {"WWW-Authenticate": 'Bearer realm="https://10.96.0.1/token"'})
        elif self.path.startswith("/v2/limited/"):
            self._answer(429, b"{}", {"Retry-After": "3600"})
        elif self.path.startswith("/v2/basic-moved/"):
            if self.headers.get("Authorization") != BASIC:
                self._answer(401, b"{}", {"WWW-Authenticate": 'Basic realm="quirky"'})
            else:  # the manifests and blobs are served by another host, which asks for nothing
                self._answer(307, b"", {"Location": f"http://localhost:{port}/v2/open/{self.path[16:]}"})
        elif self.path.startswith("/v2/open/") and "/manifests/" in self.path:
            self._answer(200, manifest, {"Content-Type": "application/json"})
        elif self.path.startswith("/v2/open/"):
            self._answer(307, b"", {"Location": f"http://localhost:{port}/cdn/blob"})
        elif self.path.startswith("/v2/two-hosts/"):
            if self.headers.get("Authorization") != BASIC:
                self._answer(401, b"{}", {"WWW-Authenticate": 'Basic realm="quirky"'})
            else:  # localhost to urlsplit, 127.0.0.1 to urllib3: the login would go to another host
                self._answer(307, b"", {"Location": f"http://127.0.0.1:{port}\\@localhost:{port}/cdn/blob"})
        elif self.path.startswith("/v2/self-moved/"):
            if self.headers.get("Authorization") != BASIC:
                self._answer(401, b"{}", {"WWW-Authenticate": 'Basic realm="quirky"'})
            else:  # to itself, its name written otherwise (as a redirect may: a case of its own, a default port)
                self._answer(307, b"", {"Location": f"http://LOCALHOST:{port}/v2/basic-only/{self.path[15:]}"})
        elif self.path.startswith("/v2/basic-only/"):
            if self.headers.get("Authorization") != BASIC:
                self._answer(401, b"{}", {"WWW-Authenticate": 'Basic realm="quirky"'})
            elif "/manifests/" in self.path:
                self._answer(200, manifest, {"Content-Type": "application/json"})
            else:
                self._answer(307, b"", {"Location": f"http://localhost:{port}/cdn/blob"})
        elif self.path.startswith("/v2/") and self.headers.get("Authorization", "")[7:] not in kind.accepted:
            realm = f"http://{self.headers['Host']}/token"
            challenge = f'Basic realm="basic", Bearer realm="{realm}",service=quirky,scope="repository:x:pull"'
            self._answer(401, b"{}", {"WWW-Authenticate": challenge})
        elif self.path.startswith("/v2/k8s/"):
            self._answer(307, b"", {"Location": f"http://localhost:{port}/v2/moved/{self.path[8:]}"})
        elif "/manifests/sha256:" in self.path:
            self._answer(200, manifest, {"Content-Type": "application/json"})
        elif "/manifests/" in self.path and "/indexed/" in self.path:
            self._answer(200, index, {"Content-Type": "application/json"})
        elif "/manifests/" in self.path:
            self._answer(200, manifest, {"Content-Type": "application/json"})
        elif "/blobs/" in self.path:
            self._answer(307, b"", {"Location": f"http://localhost:{port}/cdn/blob"})
        else:
            self._answer(200, self.config, slow=kind.trickle)

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None, slow: float = 0.0) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not slow:
            self.wfile.write(body)
            return
        with contextlib.suppress(OSError):
            for i in range(len(body)):
                self.wfile.write(body[i : i + 1])
                self.wfile.flush()
                time.sleep(slow)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def quirky() -> Iterator[tuple[str, Client]]:
    _Quirky.seen, _Quirky.issued, _Quirky.accepted, _Quirky.trickle = [], [], set(), 0.0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Quirky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    host = f"127.0.0.1:{port}"
    try:
        yield host, Client(RegistrySettings(enabled=True, plain_http=[host, f"localhost:{port}"], timeout_seconds=0.5))
    finally:
        server.shutdown()
        server.server_close()


def test_a_blob_redirected_elsewhere_is_fetched_without_the_registrys_token(quirky: tuple[str, Client]) -> None:
    host, client = quirky
    got = client.config(parse_reference(f"{host}/team/model:1"))
    assert got.env == {"CUDA_VERSION": "12.6.3"}  # a manifest without mediaType, served as application/json
    assert ("/cdn/blob", None) in _Quirky.seen  # the other host never got the registry's token
    assert any(path.startswith("/v2/team/model/blobs/") and auth == "Bearer t0" for path, auth in _Quirky.seen)
    # the Bearer challenge was found after the Basic one, with its unquoted service, and the repository's pull asked
    token_asks = [path for path, _ in _Quirky.seen if path.startswith("/token")]
    assert token_asks == ["/token?scope=repository%3Ax%3Apull&scope=repository%3Ateam%2Fmodel%3Apull&service=quirky"]


def test_a_registry_that_asks_for_basic_gets_the_credentials_and_only_it(
    quirky: tuple[str, Client], tmp_path: Path
) -> None:
    host, _ = quirky
    port = host.rsplit(":", 1)[1]
    credentials = tmp_path / "config.json"
    credentials.write_text(json.dumps({"auths": {host: {"username": "user", "password": "pass"}}}))
    settings_ = RegistrySettings(
        enabled=True, plain_http=[host, f"localhost:{host.rsplit(':', 1)[1]}"], credentials_file=str(credentials)
    )
    assert Client(settings_).config(parse_reference(f"{host}/basic-only/model:1")).env == {"CUDA_VERSION": "12.6.3"}
    assert Client(settings_).config(parse_reference(f"{host}/basic-moved/model:1")).env == {"CUDA_VERSION": "12.6.3"}
    elsewhere = [auth for path, auth in _Quirky.seen if path.startswith(("/cdn/", "/v2/open/"))]
    assert len(elsewhere) >= 4 and set(elsewhere) == {None}  # another host never gets the credentials
    local = RegistrySettings(enabled=True, plain_http=[f"localhost:{port}"], credentials_file=str(credentials))
    credentials.write_text(json.dumps({"auths": {f"localhost:{port}": {"username": "user", "password": "pass"}}}))
    # a registry that sends the reader to itself, by its name written in capitals, keeps its credentials
    moved = Client(local).config(parse_reference(f"localhost:{port}/self-moved/model:1"))
    assert moved.env == {"CUDA_VERSION": "12.6.3"}
    # but not to a URL that two parsers read as two hosts: the login went to the one the request did
    _Quirky.seen.clear()
    with pytest.raises(Unreadable, match="which names no one host"):
        Client(local).config(parse_reference(f"localhost:{port}/two-hosts/model:1"))
    assert [auth for path, auth in _Quirky.seen if not path.startswith("/v2/two-hosts/")] == []
    without = Client(RegistrySettings(enabled=True, plain_http=[host]))
    with pytest.raises(Unreadable, match="wants credentials for basic-only/model"):
        without.config(parse_reference(f"{host}/basic-only/model:1"))


ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com"


class _EcrApi(http.server.BaseHTTPRequestHandler):
    """Amazon ECR's API, GetAuthorizationToken only (JSON 1.1 over HTTP, as botocore calls it): answers with the
    quirky registry's Basic pair, or with ``error``."""

    asked: ClassVar[list[tuple[str, dict[str, Any], str]]] = []
    error: ClassVar[str] = ""
    pair: ClassVar[bytes] = b"user:pass"

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).asked.append((self.headers.get("X-Amz-Target", ""), body, self.headers.get("Authorization", "")))
        if self.error:
            out, status = json.dumps({"__type": self.error, "message": "not allowed (in the test)"}).encode(), 400
        else:
            token = base64.b64encode(self.pair).decode()  # the quirky registry's BASIC
            out, status = (
                json.dumps({"authorizationData": [{"authorizationToken": token, "expiresAt": 4102444800}]}).encode(),
                200,
            )
        self.send_response(status)
        self.send_header("Content-Type", "application/x-amz-json-1.1")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def ecr(quirky: tuple[str, Client], monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, RegistrySettings]]:
    """The quirky registry as a private ECR registry (its name resolving to it), and ECR's API for its logins, with
    the AWS credentials of the environment (no AWS files, no instance metadata)."""
    _EcrApi.asked, _EcrApi.error, _EcrApi.pair = [], "", b"user:pass"
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EcrApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    real = socket.getaddrinfo

    def resolve(name: str, *args: Any, **kw: Any) -> Any:
        return real("127.0.0.1" if name == ECR else name, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    for name, value in {
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_ENDPOINT_URL_ECR": f"http://127.0.0.1:{server.server_address[1]}",
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        "AWS_EC2_METADATA_DISABLED": "true",
    }.items():
        monkeypatch.setenv(name, value)
    port = quirky[0].rsplit(":", 1)[1]
    registry = f"{ECR}:{port}"
    try:
        yield registry, RegistrySettings(enabled=True, plain_http=[registry, f"localhost:{port}"], timeout_seconds=2)
    finally:
        server.shutdown()
        server.server_close()


def test_a_private_ecr_image_is_read_with_a_login_from_the_ecr_api(ecr: tuple[str, RegistrySettings]) -> None:
    registry, settings_ = ecr
    client = Client(settings_)
    for repository in ("basic-only/model:1", "basic-only/other:2"):
        assert client.config(parse_reference(f"{registry}/{repository}")).env == {"CUDA_VERSION": "12.6.3"}
    ((target, body, signed),) = _EcrApi.asked  # asked once, kept until an hour before it expires
    assert target == "AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken"
    assert body == {"registryIds": ["123456789012"]} and signed.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/us-east-1/ecr/aws4_request" in signed
    assert all(auth is None for path, auth in _Quirky.seen if path.startswith("/cdn/"))  # never to another host
    # another registry is never asked of ECR; a credentialsFile entry comes first; ecr off: a private image
    other = quirky_host(registry)
    with pytest.raises(Unreadable, match="wants credentials"):
        listed = dataclasses.replace(settings_, plain_http=[*settings_.plain_http, other])
        Client(listed).config(parse_reference(f"{other}/basic-only/model:1"))
    assert len(_EcrApi.asked) == 1
    off = Client(dataclasses.replace(settings_, ecr=False))
    with pytest.raises(Unreadable, match="wants credentials for basic-only/model"):
        off.config(parse_reference(f"{registry}/basic-only/model:1"))
    assert len(_EcrApi.asked) == 1


def quirky_host(registry: str) -> str:
    return f"127.0.0.1:{registry.rsplit(':', 1)[1]}"


@pytest.mark.parametrize(
    ("error", "words"),
    [
        ("AccessDeniedException", r"ECR gives the webhook's AWS role no pull login for .* \(AccessDeniedException\)"),
        ("", r"the webhook has no AWS credentials: give its service account an IAM role \(EKS Pod Identity or IRSA\)"),
    ],
)
def test_an_ecr_login_refused_says_what_to_give_the_webhook(
    ecr: tuple[str, RegistrySettings], monkeypatch: pytest.MonkeyPatch, error: str, words: str
) -> None:
    registry, settings_ = ecr
    _EcrApi.error = error
    if not error:
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(Unreadable, match=words):
        Client(settings_).config(parse_reference(f"{registry}/basic-only/model:1"))


def test_an_ecr_login_the_registry_refuses_is_asked_again_and_a_failure_is_kept(
    ecr: tuple[str, RegistrySettings],
) -> None:
    registry, settings_ = ecr
    client = Client(settings_)
    _EcrApi.pair = b"user:revoked"  # a login the registry refuses (the role's sessions revoked, say)
    with pytest.raises(Unreadable, match="refuses the pull account"):
        client.config(parse_reference(f"{registry}/basic-only/model:1"))
    _EcrApi.pair = b"user:pass"
    assert client.config(parse_reference(f"{registry}/basic-only/model:1")).env == {"CUDA_VERSION": "12.6.3"}
    assert len(_EcrApi.asked) == 2  # not kept for its 12 hours
    _EcrApi.error = "AccessDeniedException"
    failing = Client(settings_)
    for tag in ("1", "2"):  # a refusal is kept for retrySeconds: the API is asked once
        with pytest.raises(Unreadable, match="AccessDeniedException"):
            failing.config(parse_reference(f"{registry}/basic-only/model:{tag}"))
    assert len(_EcrApi.asked) == 3


def test_aws_credentials_that_cannot_be_had_are_said_so_in_time(
    ecr: tuple[str, RegistrySettings], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    registry, settings_ = ecr
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    # IRSA whose token file is not there: botocore's open() fails (an OSError, not one of botocore's errors)
    monkeypatch.setenv("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/gpu-admission")
    monkeypatch.setenv("AWS_WEB_IDENTITY_TOKEN_FILE", str(tmp_path / "missing-token"))
    with pytest.raises(Unreadable, match="the webhook's AWS credentials could not be had"):
        Client(settings_).config(parse_reference(f"{registry}/basic-only/model:1"))
    # EKS Pod Identity's agent that takes no answer: the read waits READ_DEADLINE timeouts, not the chain's own
    monkeypatch.delenv("AWS_ROLE_ARN")
    monkeypatch.delenv("AWS_WEB_IDENTITY_TOKEN_FILE")
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    monkeypatch.setenv(
        "AWS_CONTAINER_CREDENTIALS_FULL_URI", f"http://127.0.0.1:{silent.getsockname()[1]}/v1/credentials"
    )
    started = time.monotonic()
    try:
        with pytest.raises(Unreadable, match=r"ECR gave no pull login for .* in time"):
            Client(dataclasses.replace(settings_, timeout_seconds=0.2)).config(
                parse_reference(f"{registry}/basic-only/model:1")
            )
        assert time.monotonic() - started < 0.2 * registry_module.READ_DEADLINE + 1.5
    finally:
        silent.close()
    assert _EcrApi.asked == []


def test_a_token_no_longer_accepted_is_fetched_again(quirky: tuple[str, Client]) -> None:
    host, client = quirky
    client.config(parse_reference(f"{host}/team/model:1"))
    _Quirky.accepted.clear()  # the registry's signing key rotated, say
    assert client.config(parse_reference(f"{host}/team/model:1")).env == {"CUDA_VERSION": "12.6.3"}
    assert _Quirky.issued == ["t0", "t1"]


def test_redirected_manifests_and_indexes_without_platforms_are_read(quirky: tuple[str, Client]) -> None:
    host, client = quirky
    assert client.config(parse_reference(f"{host}/k8s/team/model:1")).env == {"CUDA_VERSION": "12.6.3"}
    assert any(path.startswith("/v2/moved/team/model/manifests/1") for path, _ in _Quirky.seen)
    indexed = client.config(parse_reference(f"{host}/indexed/model:1"))
    assert indexed.env == {"CUDA_VERSION": "12.6.3"} and indexed.where == f"{host}/indexed/model:1"


@pytest.mark.parametrize(
    ("repository", "words"),
    [
        (
            "to-metadata/x",
            r"sends the reader \(a redirect\) to 169.254.169.254, which is inside the cluster or the node",
        ),
        ("to-ftp/x", r"sends the reader to 'ftp://files.example.com/blob' \(a redirect\), not over HTTPS"),
        ("realm-inside/x", r"sends the reader \(its token service\) to 10.96.0.1, which is inside the cluster"),
    ],
)
def test_a_registry_cannot_send_the_reader_inside_the_cluster(
    quirky: tuple[str, Client], repository: str, words: str
) -> None:
    host, client = quirky
    with pytest.raises(Unreadable, match=words):
        client.config(parse_reference(f"{host}/{repository}:1"))
    assert not any(path.startswith("/latest") for path, _ in _Quirky.seen)


def test_a_name_that_resolves_inside_the_network_is_read_only_where_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    def resolve(host: str, port: Any, *args: Any, **kw: Any) -> list[Any]:
        assert host in ("registry.corp.example", "10.1.2.3")  # the name, then the address connected to
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("10.1.2.3", port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    client = Client(RegistrySettings(enabled=True))
    with pytest.raises(
        Unreadable, match=r"^registry.corp.example resolves to an address inside the network \(10.1.2.3\)"
    ):
        client.config(parse_reference("registry.corp.example/team/model:1"))
    listed = Client(RegistrySettings(enabled=True, registries=["registry.corp.example"], timeout_seconds=0.5))
    with pytest.raises(Unreadable, match=r"^cannot reach registry\.corp\.example"):  # let through: nothing listens
        listed.config(parse_reference("registry.corp.example/team/model:1"))


def test_a_resolver_that_does_not_answer_holds_no_reader(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    answer = threading.Event()  # the resolver answers at the end of the test (its threads then end)

    def resolve(host: str, port: Any, *args: Any, **kw: Any) -> list[Any]:
        answer.wait(30)
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("93.184.216.34", port or 0))]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    client = Client(RegistrySettings(enabled=True, timeout_seconds=0.2))
    caplog.set_level("INFO", logger="gpu_admission.registry")
    try:
        started = time.monotonic()
        for n in range(registry_module.RESOLVERS):
            with pytest.raises(Unreadable, match=rf"^cannot reach slow{n}\.example \(the webhook's log says why\)$"):
                client.config(parse_reference(f"slow{n}.example/team/model:1"))
        assert time.monotonic() - started < 0.2 * registry_module.RESOLVERS + 2  # each waited its timeout, no more
        assert "cannot reach slow0.example: its name was not resolved within 0.2 s" in caplog.text
        started = time.monotonic()  # every lookup's place is taken by one the resolver has not answered
        with pytest.raises(Unreadable, match=r"^cannot reach one-more\.example"):
            client.config(parse_reference("one-more.example/team/model:1"))
        assert time.monotonic() - started < 0.15
        assert f"{registry_module.RESOLVERS} name lookups are still waiting for the resolver" in caplog.text
    finally:
        answer.set()
    deadline = time.monotonic() + 5  # the places come back once the resolver answers
    while _free_lookups() < registry_module.RESOLVERS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _free_lookups() == registry_module.RESOLVERS


def _free_lookups() -> int:
    taken = 0
    while registry_module._RESOLVING.acquire(blocking=False):
        taken += 1
    for _ in range(taken):
        registry_module._RESOLVING.release()
    return taken


def test_a_listed_registry_is_resolved_within_the_timeout_too(monkeypatch: pytest.MonkeyPatch) -> None:
    answer = threading.Event()

    def resolve(host: str, port: Any, *args: Any, **kw: Any) -> list[Any]:
        answer.wait(30)
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    listed = Client(RegistrySettings(enabled=True, registries=["slow.example"], timeout_seconds=0.2))
    started = time.monotonic()
    try:
        with pytest.raises(Unreadable, match=r"^cannot reach slow\.example"):
            listed.config(parse_reference("slow.example/team/model:1"))
        assert time.monotonic() - started < 2
    finally:
        answer.set()


@pytest.mark.parametrize(
    "error", [UnicodeError("label too long"), socket.gaierror(-2, "Name or service not known")], ids=str
)
def test_a_name_the_resolver_refuses_is_a_registry_that_cannot_be_reached(
    monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    def resolve(host: str, port: Any, *args: Any, **kw: Any) -> list[Any]:
        raise error  # IDNA refuses a label over 63 characters with a UnicodeError, not an OSError

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    with pytest.raises(Unreadable, match=r"^cannot reach x\.example \(the webhook's log says why\)$"):
        Client(RegistrySettings(enabled=True)).config(parse_reference("x.example/team/model:1"))


def test_no_lookup_starts_once_the_reads_deadline_has_passed(monkeypatch: pytest.MonkeyPatch) -> None:
    looked: list[str] = []

    def resolve(host: str, *args: Any, **kw: Any) -> list[Any]:
        looked.append(host)
        return []

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    for _ in range(registry_module.RESOLVERS + 1):
        with pytest.raises(Unreadable, match=r"^cannot reach x\.example"):
            registry_module._addresses("x.example", -3.0)
    assert looked == [] and _free_lookups() == registry_module.RESOLVERS


def _connected(monkeypatch: pytest.MonkeyPatch, resolved: Callable[[], list[str]], host: str) -> list[Any]:
    """Where the reader connects (each address refusing it) to read an image of ``host``, which resolves to
    ``resolved()`` at each lookup."""

    def resolve(name: str, port: Any, *args: Any, **kw: Any) -> list[Any]:
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port or 0)) for a in resolved()]

    connected: list[tuple[str, int]] = []

    def connect(address: tuple[str, int], *args: Any, **kw: Any) -> socket.socket:
        connected.append(address)
        raise OSError("connection refused (in the test)")

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setattr(urllib3.util.connection, "create_connection", connect)
    with pytest.raises(Unreadable, match=rf"^cannot reach {re.escape(host)}"):
        Client(RegistrySettings(enabled=True)).config(parse_reference(f"{host}/team/model:1"))
    return connected


class _TlsRegistry(http.server.BaseHTTPRequestHandler):
    """A registry over TLS (one image, no auth) that closes each connection after its answer, and notes the Host
    each request named."""

    config = json.dumps({"config": {"Env": ["CUDA_VERSION=12.6.3"]}}).encode()
    hosts: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).hosts.append(self.headers.get("Host", ""))
        digest = "sha256:" + hashlib.sha256(self.config).hexdigest()
        manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {"digest": digest}}).encode()
        body, media = (manifest, OCI_MANIFEST) if "/manifests/" in self.path else (self.config, "application/json")
        self.send_response(200)
        for name, value in (("Content-Type", media), ("Content-Length", str(len(body))), ("Connection", "close")):
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


@pytest.mark.parametrize("how", ["listed", "public", "ca-file", "untrusted"])
def test_a_registry_over_tls_is_read_by_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """Found while testing ECR logins: the reader connected to the address it checked by making it the
    connection's host, so TLS checked the registry's certificate against the address (every HTTPS registry: "IP
    address mismatch") and the Host header named it. Its CA trusted through the system's store (SSL_CERT_FILE
    here), or through cuda.registry.caFile; neither: not read."""
    ca, ca_key = issue_ca("test registries", 1)
    leaf, key = issue_leaf(ca, ca_key, Names(("registry.example",)), 1)
    (tmp_path / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "leaf.crt").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "leaf.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    _TlsRegistry.hosts = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TlsRegistry)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "leaf.crt", tmp_path / "leaf.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    real = socket.getaddrinfo
    monkeypatch.setattr(
        socket,
        "getaddrinfo",
        lambda name, *a, **kw: real("127.0.0.1" if name == "registry.example" else name, *a, **kw),
    )
    if how in ("listed", "public"):
        monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.crt"))
    if how == "public":  # a public registry: its address taken as a public one
        monkeypatch.setattr(registry_module, "_global", lambda address: True)
    host = f"registry.example:{server.server_address[1]}"
    ca_file = str(tmp_path / "ca.crt") if how == "ca-file" else ""
    client = Client(RegistrySettings(enabled=True, registries=[] if how == "public" else [host], ca_file=ca_file))
    try:
        for tag in ("1", "2"):  # each connection closed by the registry after its answer: made again, by its name
            if how == "untrusted":
                with pytest.raises(Unreadable, match=rf"^cannot reach {re.escape(host)}"):
                    client.config(parse_reference(f"{host}/team/model:{tag}"))
            else:
                assert client.config(parse_reference(f"{host}/team/model:{tag}")).env == {"CUDA_VERSION": "12.6.3"}
    finally:
        server.shutdown()
        server.server_close()
    assert _TlsRegistry.hosts == ([] if how == "untrusted" else [host] * 4)


class _Forgetful(http.server.BaseHTTPRequestHandler):
    """A registry behind a NAT that forgets idle connections: a request on a kept connection idle over ``idle``
    seconds is answered by a TCP reset (AWS's NAT gateway), or by silence (``silent``: Azure's and GCP's)."""

    protocol_version = "HTTP/1.1"
    config = json.dumps({"config": {"Env": ["CUDA_VERSION=12.6.3"]}}).encode()
    idle: ClassVar[float] = 0.3
    silent: ClassVar[bool] = False
    dropped: ClassVar[int] = 0

    def do_GET(self) -> None:
        last = getattr(self, "last", None)
        if last is not None and time.monotonic() - last > self.idle:
            type(self).dropped += 1
            if self.silent:
                time.sleep(3)
            else:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        digest = "sha256:" + hashlib.sha256(self.config).hexdigest()
        manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": {"digest": digest}}).encode()
        body, media = (manifest, OCI_MANIFEST) if "/manifests/" in self.path else (self.config, "application/json")
        self.send_response(200)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.last = time.monotonic()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize("silent", [False, True], ids=["reset", "silence"])
def test_a_kept_connection_the_network_forgot_is_asked_again_on_another(silent: bool) -> None:
    """Found by a review that stood in for real registries: AWS's NAT gateway forgets a connection idle 350 s and
    answers its next packet with a reset; the first read after an idle spell failed, the image unread for
    retrySeconds."""
    _Forgetful.silent, _Forgetful.dropped = silent, 0
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Forgetful)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    client = Client(RegistrySettings(enabled=True, plain_http=[host], timeout_seconds=1))
    try:
        assert client.config(parse_reference(f"{host}/team/model:1")).env == {"CUDA_VERSION": "12.6.3"}
        time.sleep(_Forgetful.idle + 0.2)
        assert client.config(parse_reference(f"{host}/team/model:2")).env == {"CUDA_VERSION": "12.6.3"}
    finally:
        server.shutdown()
        server.server_close()
    assert _Forgetful.dropped == 1


def test_a_registry_that_does_not_answer_is_asked_once() -> None:
    """Found by a review: a request that timed out on a connection made for it was asked again twice (each GET of
    a manifest counts against Docker Hub's pull limit, and the reader was held three timeouts)."""
    asked: list[str] = []

    class Silent(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            time.sleep(2)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Silent)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    host = f"127.0.0.1:{server.server_address[1]}"
    try:
        with pytest.raises(Unreadable, match=rf"^cannot reach {re.escape(host)}"):
            Client(RegistrySettings(enabled=True, plain_http=[host], timeout_seconds=0.3)).config(
                parse_reference(f"{host}/team/model:1")
            )
    finally:
        server.shutdown()
        server.server_close()
    assert asked == ["/v2/team/model/manifests/1"]


def test_the_next_address_is_tried_where_one_does_not_take_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    addresses = ["93.184.216.34", "93.184.216.35", "93.184.216.34", "93.184.216.36", "93.184.216.37"]
    connected = _connected(monkeypatch, lambda: addresses, "registry.many.example")
    # each address once, in the resolver's order, at most MAX_ADDRESSES of them
    assert connected == [("93.184.216.34", 443), ("93.184.216.35", 443), ("93.184.216.36", 443)]


def test_the_reader_connects_to_the_address_it_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter(["93.184.216.34", "127.0.0.1", "127.0.0.1"])  # public when checked, loopback a moment later
    connected = _connected(monkeypatch, lambda: [next(answers)], "registry.rebind.example")
    assert connected == [("93.184.216.34", 443)]


def test_a_token_from_where_a_registry_redirected_is_not_kept_for_the_registry(quirky: tuple[str, Client]) -> None:
    host, client = quirky
    client.config(parse_reference(f"{host}/k8s/team/model:1"))
    assert [key for key in client._tokens] == [(host, "k8s/team/model")]


def test_a_registry_that_trickles_cannot_hold_a_reader(quirky: tuple[str, Client]) -> None:
    host, client = quirky
    _Quirky.trickle = 0.1  # a byte every 0.1 s: each wait is short, the whole is not (0.5 s timeout: 2 s in all)
    started = time.monotonic()
    with pytest.raises(Unreadable, match="its config blob came too slowly"):
        client.config(parse_reference(f"{host}/team/model:1"))
    assert time.monotonic() - started < 5


def test_a_registry_that_trickles_its_headers_is_cut_off_at_the_deadline(quirky: tuple[str, Client]) -> None:
    host, client = quirky
    started = time.monotonic()
    with pytest.raises(Unreadable, match=f"^{host} answered too slowly$"):
        client.config(parse_reference(f"{host}/slow-headers/model:1"))
    assert time.monotonic() - started < 5


def test_a_registry_that_limits_pulls_is_asked_again_no_sooner_than_it_says(quirky: tuple[str, Client]) -> None:
    host, client = quirky
    clock = Clock()
    known = ImageConfigs(RegistrySettings(enabled=True, retry_seconds=60), client, clock)
    got = known.read_now(f"{host}/limited/model:1")
    assert got.error == f"{host} limits the pulls from here (HTTP 429)"
    assert known._known[f"{host}/limited/model:1"].until == clock.now + 3600


@pytest.mark.parametrize(
    ("host", "inside_"),
    [
        ("127.0.0.1:5000", True),
        ("10.0.0.12", True),
        ("[::1]:5000", True),
        ("localhost:5000", True),
        ("registry:5000", True),  # one label: a Service of the webhook's own namespace
        ("kubernetes.default.svc", True),
        ("harbor.registry.svc.cluster.local:443", True),
        ("printer.local", True),
        ("nvcr.io", False),
        ("registry.internal.example.com:5000", False),
        ("123456789012.dkr.ecr.us-east-1.amazonaws.com", False),
    ],
)
def test_addresses_inside_the_cluster_or_the_node_are_told_apart(host: str, inside_: bool) -> None:
    assert inside(host) is inside_


def test_a_worker_with_too_many_images_waiting_drops_the_next_without_waiting() -> None:
    gate = threading.Event()

    def read(ref: Reference) -> ImageConfig:
        gate.wait(10)
        return ImageConfig({}, str(ref))

    known = ImageConfigs(RegistrySettings(enabled=True), Fake(read))
    started = time.monotonic()
    for i in range(QUEUE + 10):
        assert known.lookup(f"team/model-{i}:1") is None
    assert time.monotonic() - started < 2
    assert known.counts["dropped"] == 10
    gate.set()


def test_the_server_reads_configs_in_the_background_and_checks_the_next_pods(real: Registry, tmp_path: Path) -> None:
    image = f"{real.host}/serving/llm:v3"
    real.image("serving/llm", "v3", [f"NVIDIA_REQUIRE_CUDA={REQUIRE_129}", "CUDA_VERSION=12.9.1"])
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": R535}))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"cuda": {"registry": {"enabled": True, "plainHttp": [real.host]}}}))
    review = review_of(image, uid="first")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    with serve(tmp_path, nodes=nodes, config=config, workers=2, env={"TMPDIR": str(scratch)}) as server:
        client = server.client()
        status, first = client.post("/validate", review)
        assert status == 200 and first["response"]["allowed"], first
        assert any("CUDA version unknown" in w for w in first["response"].get("warnings", []))
        deadline, answer = time.monotonic() + 20, first
        denied = 0
        while denied < 4 and time.monotonic() < deadline:
            again = copy.deepcopy(review)
            again["request"]["uid"] = f"u{time.monotonic_ns()}"
            status, answer = client.post("/validate", again)
            denied = denied + 1 if not answer["response"]["allowed"] else 0
            time.sleep(0.05)
        client.close()
        assert denied == 4, answer
        message = answer["response"]["status"]["message"]
        assert f"CUDA 12.9 (from image config NVIDIA_REQUIRE_CUDA of {image})" in message, message
        assert "pool gpu-a (driver 535.104.05, CUDA 12.2)" in message
        assert f"image config of '{image}': NVIDIA_REQUIRE_CUDA=" in server.output()
        reads = re.search(r'^gpu_admission_image_configs_total\{result="read"\} (\S+)$', server.metrics(), re.M)
        assert reads is not None and float(reads.group(1)) >= 1
        (record,) = scratch.glob("gpu-admission-images-*/*.json")  # what the other worker reads first
        assert json.loads(record.read_text())["image"] == image
    assert not list(scratch.glob("gpu-admission-images-*")), "the server leaves no shared directory behind"


def test_an_index_is_read_for_the_platform_of_the_clusters_gpu_nodes() -> None:
    assert platform_order(["amd64", "arm64", ""]) == PLATFORMS == platform_order([]) == platform_order([""])
    assert platform_order(["arm64", "", "arm64"]) == (("linux", "arm64"), ("linux", "amd64"))  # GH200, GB200
    digest = {name: "sha256:" + name[0] * 64 for name in ("a-amd", "b-arm")}
    index = {
        "manifests": [
            {"digest": digest["a-amd"], "platform": {"os": "linux", "architecture": "amd64"}},
            {"digest": digest["b-arm"], "platform": {"os": "linux", "architecture": "arm64"}},
        ]
    }
    assert choose_platform(index, platform_order(["arm64"])) == (digest["b-arm"], "linux/arm64")


@pytest.mark.parametrize("arch", ["arm64", "amd64"])
def test_the_server_reads_an_arm64_clusters_images_for_arm64(real: Registry, arch: str) -> None:
    """An nvidia/cuda image before 12.5.1 sets forward-compatibility terms on amd64 only: a GH200 cluster's pods
    were checked against the amd64 config of a multi-platform image."""
    image = f"{real.host}/multi/require:v1"
    real.index(
        "multi/require",
        "v1",
        {"arm64": ["NVIDIA_REQUIRE_CUDA=cuda>=12.4"], "amd64": ["NVIDIA_REQUIRE_CUDA=cuda>=12.4 " + _R535_TERM]},
    )
    s = settings(cuda={"registry": {"enabled": True, "plainHttp": [real.host]}})
    nodes = [gpu_node(f"g-{i}", "gh200", "535.104.05", product=GH200, labels={PLATFORM_LABEL: arch}) for i in (1, 2)]
    client = create_app(s, cluster=StaticCluster(build_view(nodes, s))).test_client()
    deadline, answer = time.monotonic() + 20, None
    while time.monotonic() < deadline:
        answer = client.post("/validate", json=review_of(image, uid=f"u{time.monotonic_ns()}")).get_json()
        if not any("unknown" in w for w in answer["response"].get("warnings", [])):
            break
        time.sleep(0.05)
    assert answer is not None
    # arm64: its own config, no forward terms (the runtime refuses 12.4 on R535); amd64: R535 runs it (compat)
    assert answer["response"]["allowed"] is (arch == "amd64"), answer


def test_review_reads_an_arm64_clusters_images_for_arm64(
    real: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = f"{real.host}/multi/review:v1"
    real.index("multi/review", "v1", {"arm64": ["CUDA_VERSION=12.9.1"], "amd64": ["CUDA_VERSION=12.1.1"]})
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"cuda": {"registry": {"enabled": True, "plainHttp": [real.host]}}}))
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(yaml.safe_dump(pod(container(image=image))))
    for arch, exit_code in (("arm64", cli.EXIT_DENIED), ("amd64", cli.EXIT_ADMITTED)):
        nodes = tmp_path / f"{arch}.yaml"
        items = [gpu_node("g-1", "gh200", "535.104.05", product=GH200, labels={PLATFORM_LABEL: arch})]
        nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
        assert cli.main(["review", "-f", str(manifest), "--nodes", str(nodes), "--config", str(config)]) == exit_code
        assert f"from image config CUDA_VERSION of {image}, linux/{arch}" in capsys.readouterr().out


_R535_TERM = "brand=tesla,driver>=535,driver<536"
GH200 = "NVIDIA-GH200-480GB"


def test_review_reads_the_config_there_and_then(
    real: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = f"{real.host}/batch/trainer:2025.1"
    real.image("batch/trainer", "2025.1", ["CUDA_VERSION=12.9.1"])
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": R535}))
    manifest = tmp_path / "job.yaml"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [container(image=image)]}}},
    }
    manifest.write_text(yaml.safe_dump(job))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"cuda": {"registry": {"enabled": True, "plainHttp": [real.host]}}}))
    args = ["review", "-f", str(manifest), "--nodes", str(nodes)]
    assert cli.main([*args, "--config", str(config)]) == cli.EXIT_DENIED
    out = capsys.readouterr().out
    assert out.startswith("DENIED") and f"CUDA 12.9 (from image config CUDA_VERSION of {image})" in out, out
    assert cli.main(args) == cli.EXIT_ADMITTED  # the registry off: the version unknown
    assert "CUDA version unknown" in capsys.readouterr().out


def test_serve_takes_out_the_shared_directories_an_earlier_server_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = [tmp_path / f"gpu-admission-images-{pid}-abc" for pid in (dead.pid, os.getpid())]
    running = tmp_path / f"gpu-admission-images-{os.getppid()}-xyz"  # another server, still running
    for d in (*left, running):
        d.mkdir()
    made = cli._images_directory()
    assert made.is_dir() and made.name.startswith(f"gpu-admission-images-{os.getpid()}-")
    assert running.is_dir() and not any(d.exists() for d in left)


def test_the_image_command_says_what_is_read_of_each_image(
    real: Registry, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = f"{real.host}/serving/chat:1.2"
    real.image("serving/chat", "1.2", [f"NVIDIA_REQUIRE_CUDA={REQUIRE_129}"])
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"cuda": {"registry": {"enabled": True, "plainHttp": [real.host]}}}))
    tagged = "nvidia/cuda:12.8.0-base-ubuntu22.04"
    assert cli.main(["image", tagged, image, "--config", str(config)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"{tagged}: CUDA 12.8 (from image tag, nvidia/cuda 12.8.0-base-ubuntu22.04); also on")
    assert "driver branches 470, 535" in out[0]
    assert (
        out[1] == f"{image}: CUDA 12.9 (from image config NVIDIA_REQUIRE_CUDA of {image}); also on data-center"
        " GPUs of driver branches 470 (forward compatibility)"
    )
    assert cli.main(["image", image]) == 1  # the registry off
    assert (
        capsys.readouterr().out
        == f"{image}: CUDA unknown (no rule reads its tag); cuda.registry.enabled would read its config\n"
    )


def test_the_request_path_bench_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.bench import registry_path

    registry_path.main(rounds=1, n=5)
    assert re.fullmatch(
        r"reader off \(CUDA unknown\) [0-9.]+ us   on \(config read\) [0-9.]+ us\n", capsys.readouterr().out
    )


ODD_CONFIGS = [
    ImageConfig({"NVIDIA_REQUIRE_CUDA": "cuda>=13.9 brand=tesla,driver>=535,driver<536"}, "w"),
    ImageConfig({"NVIDIA_REQUIRE_CUDA": "cuda>>12 ,,"}, "w"),
    ImageConfig({"NVIDIA_DISABLE_REQUIRE": "true", "CUDA_VERSION": "99"}, "w"),
    ImageConfig({"CUDA_VERSION": "not-a-version"}, "w"),
    ImageConfig({"CUDA_VERSION": "12." + "9" * 4000}, "w"),
    ImageConfig({}, "w"),
    ImageConfig(error="x" * 5000),
]


@pytest.mark.parametrize("odd", range(len(ODD_CONFIGS)))
@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.json") if not p.name.startswith("admission.")))
def test_every_shared_fixture_gets_a_valid_answer_whatever_its_images_configs_say(name: str, odd: int) -> None:
    s = settings(cuda={"registry": {"enabled": True}})
    known = ImageConfigs(s.cuda.registry, Fake(lambda ref: ODD_CONFIGS[odd]), Clock(), background=False)
    nodes = [gpu_node("a-1", "gpu-a", "535.104.05"), gpu_node("c-1", "gpu-c", "570.124.06")]
    client = create_app(s, cluster=StaticCluster(build_view(nodes, s)), images=known).test_client()
    obj = json.loads((FIXTURES / name).read_text())
    gpus = _with_gpus(obj)  # every container a GPU container: its image's config is read
    for path in ("/mutate", "/validate"):
        r = client.post(path, data=json.dumps(review(obj, uid="u")), content_type="application/json")
        assert r.status_code == 200, r.get_json()
        response = r.get_json()["response"]
        assert isinstance(response["allowed"], bool) and (response["allowed"] or response["status"]["message"])
        assert all(len(w) < 120 for w in response.get("warnings", []))
        if "patch" in response:
            patched = jsonpatch.apply_patch(obj, json.loads(base64.b64decode(response["patch"])))
            again = client.post("/mutate", data=json.dumps(review(patched, uid="v")), content_type="application/json")
            assert "patch" not in again.get_json()["response"], "mutating the result again must change nothing"
    assert (sum(known.counts.values()) > 0) == (gpus > 0)


def _with_gpus(node: Any) -> int:
    """Give every container under ``node`` (a pod spec's, a template's) a GPU; how many were given one."""
    count = 0
    if isinstance(node, dict):
        for key in ("containers", "initContainers"):
            for c in node.get(key) or [] if isinstance(node.get(key), list) else []:
                if isinstance(c, dict) and isinstance(c.get("image"), str):
                    resources = c.setdefault("resources", {})
                    resources.setdefault("limits", {})["nvidia.com/gpu"] = "1"
                    resources.get("requests", {}).pop("nvidia.com/gpu", None)
                    count += 1
        count += sum(_with_gpus(v) for k, v in node.items() if k not in ("containers", "initContainers"))
    elif isinstance(node, list):
        count += sum(_with_gpus(v) for v in node)
    return count


def test_a_registry_is_its_own_by_host_and_port_however_a_url_writes_them() -> None:
    client = Client(RegistrySettings(enabled=True))
    nvcr, hub = parse_reference("nvcr.io/nvidia/pytorch:25.01-py3"), parse_reference("ubuntu:24.04")
    assert client._own("https://NVCR.IO:443/v2/nvidia/pytorch/manifests/25.01-py3", nvcr)
    assert client._own("https://registry-1.docker.io/v2/library/ubuntu/blobs/sha256:00", hub)
    assert not client._own("https://nvcr.io:8443/v2/", nvcr)
    assert not client._own("https://nvcr.io:99999/v2/", nvcr)  # no port at all: not the registry's
    assert not client._own("https://evil.example\\@nvcr.io/v2/", nvcr)  # where urllib3 sends it: evil.example
    assert not client._own("https://docker.io/v2/", hub)  # Docker Hub's requests go to its API host


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("https://evil.example\\@nvcr.io/blob", "which names no one host"),  # urllib3 goes to evil.example
        ("https://user:pass@cdn.example/blob", "which names no one host"),
        ("https://evil.example\u2100@nvcr.io/", "not a URL"),  # NFKC makes an @ of it: was a ValueError, a "bug"
        ("https://[nvcr.io/blob", "not a URL"),
        ("https://[2606:4700:4700::1111]/blob", "inside the cluster or the node"),  # an address: listed or not read
        ("https://bücher.example/blob", ""),  # a name of other letters: one host to both parsers (xn--)
        ("https://cdn.example/blob", ""),
    ],
)
def test_where_a_redirect_may_send_the_reader(url: str, said: str) -> None:
    client = Client(RegistrySettings(enabled=True))
    ref = parse_reference("nvcr.io/nvidia/cuda:12.8.0-base-ubuntu22.04")
    if not said:
        assert client._target(url, ref, "a redirect") == url
        return
    with pytest.raises(Unreadable, match=re.escape(said)):
        client._target(url, ref, "a redirect")

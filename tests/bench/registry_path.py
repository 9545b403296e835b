"""What the registry reader (``cuda.registry``) puts on the request path, in one process: a vLLM pod per request,
each a new object (a number of its own in an annotation), /validate, 1,000 nodes, with the reader off (the pod's
CUDA unknown) and on with its image's config read (the pod checked against it), rounds taking turns. Prints µs per
request (docs/benchmarks.md, 44.). ``python -m tests.bench.registry_path``"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from tests.conftest import review
from tests.cuda_fixtures import container, gpu_node, pod, settings
from webhook import decisions, pipeline
from webhook.cluster import build_view
from webhook.config import Settings
from webhook.registry import PLATFORMS, ImageConfig, ImageConfigs, Reference

IMAGE = "vllm/vllm-openai:v0.11.0"
NODES = [gpu_node(f"a-{i}", f"gpu-{i % 10}", "570.124.06") for i in range(1000)]


class Known:
    """A registry whose every image needs CUDA 12.8 (no network)."""

    def config(self, ref: Reference, order: Sequence[tuple[str, str]] = PLATFORMS) -> ImageConfig:
        return ImageConfig({"NVIDIA_REQUIRE_CUDA": "cuda>=12.8"}, str(ref))

    def digest(self, ref: Reference) -> str:
        return ""


def body(i: int) -> bytes:
    obj: dict[str, Any] = pod(container(image=IMAGE), name=f"llm-{i}")
    obj["metadata"]["annotations"] = {"example.com/n": str(i)}
    return json.dumps(review(obj, namespace="ml", uid=f"u{i}")).encode()


def per_request(s: Settings, images: ImageConfigs | None, n: int) -> float:
    view = build_view(NODES, s)
    bodies = [body(i) for i in range(n)]
    started = time.perf_counter()
    for b in bodies:
        decisions.decide("validate", pipeline.validate, b, "application/json", s, view, images)
    return (time.perf_counter() - started) / n * 1e6


def main(rounds: int = 3, n: int = 3000) -> None:
    off, on = settings(), settings(cuda={"registry": {"enabled": True}})
    known = ImageConfigs(on.cuda.registry, Known())
    known.read_now(IMAGE)
    for _ in range(rounds):
        print(
            f"reader off (CUDA unknown) {per_request(off, None, n):.1f} us   on (config read) "
            f"{per_request(on, known, n):.1f} us"
        )


if __name__ == "__main__":
    main()

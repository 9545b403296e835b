"""A corpus of nasty inputs kept as regression tests (issue 10): every file in ``tests/nasty/`` goes through both
endpoints and gets a valid AdmissionReview or a 4xx with a JSON error, never a 5xx; patches apply and are idempotent.

``*.body`` and ``*.json`` files are sent byte for byte. ``*.recipe.json`` files describe inputs too big to keep in
the repository (8 MiB bodies, 100k containers, 1 MB annotations); ``build`` makes them. When the fuzzer finds a
crash, the smallest input that shows it goes here as a file.
"""

from __future__ import annotations

import copy
import json
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.hardening_fixtures import apply, check_answer, hardening_settings, patch_of, post, quiet_app
from webhook.admission import decode_json

NASTY = Path(__file__).resolve().parent / "nasty"
RAW = sorted(p.name for p in NASTY.iterdir() if p.suffix in (".body", ".json") and not p.name.endswith(".recipe.json"))
RECIPES = sorted(p.name for p in NASTY.glob("*.recipe.json"))
SECONDS = 8.0
"""Under the apiserver's default timeoutSeconds (10) even for the largest input, on a slow shared CI machine."""

# The answer some files must get; every other file only has to keep the contract.
EXPECT = {
    **dict.fromkeys(
        [
            "truncated-half.body",
            "truncated-one-byte.body",
            "trailing-garbage.body",
            "two-documents.body",
            "utf8-bom.body",
            "invalid-utf8-in-annotation.body",
            "overlong-utf8-slash.body",
            "utf16.body",
            "duplicate-key-deep.body",
            "duplicate-uid.body",
            "nan-quantity.body",
            "infinity-literal.body",
            "deep-nesting-10000-arrays.body",
            "deep-nesting-10000-objects.body",
            "empty-object.body",
            "json-null.body",
            "json-string.body",
            "whitespace-only.body",
            "empty-uid.body",
            "response-instead-of-request.json",
            "operation-lowercase.json",
            "dry-run-string.json",
        ],
        400,
    ),
    "deep-nesting-199.body": 200,
    "delete-with-null-object.json": 200,
    "connect-with-garbage-object.json": 200,
}

BUGS: dict[str, str] = {}
"""Corpus files that show a bug not fixed yet: file name -> what is wrong, where (run as xfail(strict=True))."""


def _body(name: str) -> bytes:
    return (NASTY / name).read_bytes()


def _uid(raw: bytes) -> Any:
    try:
        request = json.loads(raw).get("request")
    except (ValueError, AttributeError, RecursionError):
        return None
    return request.get("uid") if isinstance(request, dict) else None


@pytest.fixture(scope="module")
def client() -> Any:
    return quiet_app(hardening_settings()).test_client()


def _strict_json(text: str) -> Any:
    """What the apiserver's Go decoder accepts: no NaN/Infinity tokens anywhere."""

    def refuse(token: str) -> Any:
        raise AssertionError(f"answer holds the non-JSON token {token}")

    return json.loads(text, parse_constant=refuse)


class Overtime(BaseException):
    """Raised in the request's thread when it runs past SECONDS (a BaseException: Flask's handlers let it through)."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    def expire(signum: int, frame: Any) -> None:
        raise Overtime(f"no answer within {seconds:.0f}s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run(client: Any, raw: bytes, expect: int | None = None) -> list[int]:
    """Send ``raw`` to both endpoints; check the contract; check any patch applies and is idempotent."""
    uid = _uid(raw)
    statuses = []
    for path in ("/mutate", "/validate"):
        started = time.monotonic()
        try:
            with deadline(SECONDS):
                r = client.post(path, data=raw, content_type="application/json")
        except Overtime as err:
            raise AssertionError(f"{path}: {err}") from None
        elapsed = time.monotonic() - started
        assert elapsed < SECONDS, f"{path} took {elapsed:.1f}s"
        text = r.get_data(as_text=True)
        body = _strict_json(text) if text else None
        response = check_answer(r.status_code, body, uid, mutating=path == "/mutate")
        statuses.append(r.status_code)
        if expect is not None:
            assert r.status_code == expect, body
        if response is None or path == "/validate" or not patch_of(response):
            continue
        _strict_json(json.dumps(patch_of(response), allow_nan=True))
        review = decode_json(raw)
        patched = apply(copy.deepcopy(review["request"]["object"]), patch_of(response))
        review["request"]["object"] = patched
        review["request"]["uid"] = "again"
        status, again = post(client, "/mutate", review)
        second = check_answer(status, again, "again", mutating=True)
        assert second is not None and patch_of(second) == [], "mutating the patched object again must change nothing"
    return statuses


def _case(name: str) -> Any:
    marks = [pytest.mark.xfail(strict=True, reason=BUGS[name])] if name in BUGS else []
    return pytest.param(name, id=name, marks=marks)


@pytest.mark.parametrize("name", [_case(n) for n in RAW])
def test_nasty_file(client: Any, name: str) -> None:
    run(client, _body(name), EXPECT.get(name))


# -- big inputs, built from recipes ----------------------------------------------------------------------------------


def _review(obj: dict[str, Any], uid: str = "nasty-big") -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "default",
            "userInfo": {"username": "alice"},
            "object": obj,
        },
    }


def _pod(containers: list[dict[str, Any]] | None = None, **metadata: Any) -> dict[str, Any]:
    gpu = {
        "name": "trainer",
        "image": "nvidia/cuda:12.2.2-base-ubuntu22.04",
        "resources": {"limits": {"nvidia.com/gpu": "0.5"}},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "big", **metadata},
        "spec": {"containers": containers or [gpu]},
    }


def build(recipe: dict[str, Any]) -> bytes:
    make, n = recipe["make"], int(recipe.get("count") or recipe.get("bytes") or 0)
    if make == "annotation":
        skeleton = json.dumps(_review(_pod(annotations={recipe["key"]: ""})))
        filler = "x" * max(n - len(skeleton), 0) if recipe["key"] == "team" else "0." + "5" * (n - 2)
        return json.dumps(_review(_pod(annotations={recipe["key"]: filler}))).encode()
    if make == "containers":
        containers = [{"name": f"c{i}", "resources": {"limits": {"nvidia.com/gpu": "1"}}} for i in range(n)]
        containers[0] = {
            "name": "c0",
            "image": "nvidia/cuda:12.8.0-base-ubuntu22.04",
            "resources": {"limits": {"nvidia.com/gpu": "0.5"}},
        }
        return json.dumps(_review(_pod(containers)), separators=(",", ":")).encode()
    if make == "container-name":
        name = "n" * n
        return json.dumps(
            _review(
                _pod(
                    [
                        {
                            "name": name,
                            "image": "nvidia/cuda:13.0.0-base-ubuntu24.04",
                            "resources": {"limits": {"nvidia.com/gpu": "0.5"}},
                        }
                    ]
                )
            )
        ).encode()
    if make == "image":
        image = "nvidia/cuda:12.8.0-" + "a" * n
        return json.dumps(
            _review(_pod([{"name": "t", "image": image, "resources": {"limits": {"nvidia.com/gpu": "1"}}}]))
        ).encode()
    if make == "env":
        env = [
            {"name": "CUDA_VERSION" if i % 2 else "NVIDIA_REQUIRE_CUDA", "value": f"cuda>=12.{i % 10}"}
            for i in range(n)
        ]
        return json.dumps(
            _review(_pod([{"name": "t", "resources": {"limits": {"nvidia.com/gpu": "1"}}, "env": env}])),
            separators=(",", ":"),
        ).encode()
    if make == "labels":
        pod = _pod(labels={f"l{i}": "v" for i in range(n)}, annotations={"gpu-admission.io/spot": "tolerate"})
        return json.dumps(_review(pod), separators=(",", ":")).encode()
    if make == "tolerations":
        pod = _pod(annotations={"gpu-admission.io/spot": "require"})
        pod["spec"]["tolerations"] = [{"key": f"k{i}", "operator": "Exists"} for i in range(n)]
        return json.dumps(_review(pod), separators=(",", ":")).encode()
    if make == "affinity":
        pod = _pod()
        pod["spec"]["containers"][0]["image"] = "nvidia/cuda:12.8.0-base-ubuntu22.04"
        terms = [{"matchExpressions": [{"key": f"k{i}", "operator": "NotIn", "values": ["a"]}]} for i in range(n)]
        pod["spec"]["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
        return json.dumps(_review(pod), separators=(",", ":")).encode()
    if make == "uid":
        return json.dumps(_review(_pod(), uid="u" * n)).encode()
    raise AssertionError(f"unknown recipe {make}")


@pytest.mark.parametrize("name", [_case(n) for n in RECIPES])
def test_nasty_recipe(client: Any, name: str) -> None:
    recipe = json.loads((NASTY / name).read_text())
    raw = build(recipe)
    expect = recipe["expect"]
    if expect == 200 or expect == "any":
        assert len(raw) <= 7 * 1024 * 1024, f"the recipe must stay within 7 MiB (is {len(raw)} bytes)"
    statuses = run(client, raw, None if expect == "any" else expect)
    if expect == "any":
        assert all(s in (200, 413) or 400 <= s < 500 for s in statuses)


def test_corpus_is_there() -> None:
    """The issue's minimum: truncated JSON, 8 MiB, 10,000 deep, invalid UTF-8, duplicate keys, odd quantities."""
    names = set(RAW) | set(RECIPES)
    for needed in (
        "truncated-half.body",
        "body-8mib-valid-json.recipe.json",
        "deep-nesting-10000-arrays.body",
        "invalid-utf8-in-annotation.body",
        "duplicate-key-deep.body",
        "quantity-string-1e309.json",
        "quantity-string--1.json",
        "quantity-string-NaN.json",
        "quantity-string-0.5Ki.json",
        "containers-100k.recipe.json",
        "annotation-1mb-plain.recipe.json",
    ):
        assert needed in names, needed

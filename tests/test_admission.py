"""The AdmissionReview contract and every kind of bad input, through the Flask app."""

from __future__ import annotations

import base64
import json
import os
from typing import Any
from unittest import mock

import jsonpatch
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import gpu_pod, review
from webhook import decisions
from webhook.admission import decode_json, error_body
from webhook.errors import BadRequest
from webhook.workers import error_answer


def post(client: Any, path: str, body: Any, content_type: str = "application/json") -> Any:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return client.post(path, data=data, content_type=content_type)


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_answer_echoes_uid_and_kind(client: Any, path: str) -> None:
    r = post(client, path, review(gpu_pod(), uid="1234-abcd"))
    assert r.status_code == 200
    body = r.get_json()
    assert body["apiVersion"] == "admission.k8s.io/v1"
    assert body["kind"] == "AdmissionReview"
    assert body["response"]["uid"] == "1234-abcd"
    assert body["response"]["allowed"] is True


def test_unchanged_object_has_no_patch(client: Any) -> None:
    cpu_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web"},
        "spec": {"containers": [{"name": "web", "image": "nginx"}]},
    }
    response = post(client, "/mutate", review(cpu_pod)).get_json()["response"]
    assert "patch" not in response and "patchType" not in response
    assert "warnings" not in response


def test_forged_output_annotation_is_removed_by_a_patch_that_applies(client: Any) -> None:
    pod = gpu_pod(annotations={"gpu-admission.io/mig": "trainer: forged", "team": "ml"})
    response = post(client, "/mutate", review(pod)).get_json()["response"]
    assert response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    result = jsonpatch.apply_patch(pod, patch)
    assert "gpu-admission.io/mig" not in result["metadata"].get("annotations", {})
    assert result["metadata"]["annotations"]["team"] == "ml"


@pytest.mark.parametrize("operation", ["DELETE", "CONNECT"])
def test_delete_and_connect_pass_without_patch(client: Any, operation: str) -> None:
    body = review(None, operation=operation)
    body["request"]["oldObject"] = gpu_pod(annotations={"gpu-admission.io/mig": "forged"})
    response = post(client, "/mutate", body).get_json()["response"]
    assert response["allowed"] is True and "patch" not in response


def test_objects_not_handled_pass_untouched(client: Any) -> None:
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "x", "annotations": {"gpu-admission.io/mig": "x"}},
        "data": {},
    }
    response = post(client, "/mutate", review(cm)).get_json()["response"]
    assert response["allowed"] is True
    assert "patch" not in response and "warnings" not in response


def _review_with(**request: Any) -> dict[str, Any]:
    body = review(gpu_pod())
    for k, v in request.items():
        if v is ...:
            del body["request"][k]
        else:
            body["request"][k] = v
    return body


BAD = [
    pytest.param(b"{not json", "application/json", 400, "not valid JSON", id="not-json"),
    pytest.param(b"", "application/json", 400, "empty body", id="empty"),
    pytest.param(json.dumps(review(gpu_pod())).encode(), "text/plain", 415, "Content-Type", id="content-type"),
    pytest.param(b"[1, 2]", "application/json", 400, "JSON object", id="array"),
    pytest.param(
        json.dumps({**review(gpu_pod()), "apiVersion": "admission.k8s.io/v1beta1"}).encode(),
        "application/json",
        400,
        "apiVersion",
        id="v1beta1",
    ),
    pytest.param(
        json.dumps({**review(gpu_pod()), "kind": "Pod"}).encode(), "application/json", 400, "kind", id="wrong-kind"
    ),
    pytest.param(
        json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode(),
        "application/json",
        400,
        "request",
        id="no-request",
    ),
    pytest.param(json.dumps(_review_with(uid=...)).encode(), "application/json", 400, "uid", id="no-uid"),
    pytest.param(json.dumps(_review_with(uid=7)).encode(), "application/json", 400, "uid", id="uid-not-string"),
    pytest.param(
        json.dumps(_review_with(object=[1])).encode(),
        "application/json",
        400,
        "request.object",
        id="object-not-mapping",
    ),
    pytest.param(
        json.dumps(_review_with(operation="PATCH")).encode(), "application/json", 400, "operation", id="bad-operation"
    ),
    pytest.param(
        b'{"apiVersion": "admission.k8s.io/v1", "apiVersion": "x"}',
        "application/json",
        400,
        "duplicate key",
        id="duplicate-key",
    ),
    pytest.param(b'{"a": NaN}', "application/json", 400, "NaN", id="nan"),
    pytest.param(b'{"a": "\xff\xfe"}', "application/json", 400, "UTF-8", id="invalid-utf8"),
    pytest.param(b"[" * 10000 + b"]" * 10000, "application/json", 400, "nested", id="deep-nesting"),
]


@pytest.mark.parametrize("encoding", ["gzip", "br", "deflate, gzip"])
def test_an_encoded_body_is_a_415_naming_the_encoding(client: Any, encoding: str) -> None:
    """A gzipped body was read as the JSON itself ('not valid UTF-8 (byte 1)'), and a plain body labelled gzip
    accepted (found by a review that attacked the real server)."""
    body = json.dumps(review(gpu_pod())).encode()
    r = client.post("/mutate", data=body, headers={"Content-Type": "application/json", "Content-Encoding": encoding})
    assert r.status_code == 415
    assert r.get_json()["error"] == f"Content-Encoding {encoding!r} is not accepted: send the body unencoded"
    plain = client.post(
        "/mutate", data=body, headers={"Content-Type": "application/json", "Content-Encoding": "identity"}
    )
    assert plain.status_code == 200


@pytest.mark.parametrize(("body", "content_type", "status", "words"), BAD)
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_bad_input_gets_4xx_json_naming_the_problem(
    client: Any, path: str, body: bytes, content_type: str, status: int, words: str
) -> None:
    r = post(client, path, body, content_type)
    assert r.status_code == status
    assert words in r.get_json()["error"]


def test_body_over_limit_is_413(client: Any) -> None:
    r = post(client, "/mutate", b"x" * (7 * 1024 * 1024 + 1))
    assert r.status_code == 413
    assert "limit" in r.get_json()["error"]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("get", "/mutate", 405), ("put", "/validate", 405), ("post", "/healthz", 405), ("get", "/nope", 404)],
)
def test_wrong_method_or_path_is_json(client: Any, method: str, path: str, status: int) -> None:
    r = getattr(client, method)(path)
    assert r.status_code == status
    assert r.get_json()["error"]


def assert_status_body(body: dict[str, Any], code: int, reason: str | None) -> None:
    """An error body client-go reads (a metav1.Status), its message shown to whoever the apiserver answers."""
    assert {k: body[k] for k in ("kind", "apiVersion", "metadata", "status", "code")} == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "code": code,
    }, body
    assert body.get("reason") == reason, body
    assert isinstance(body["message"], str) and body["message"] and body["error"] == body["message"], body


def test_error_answers_are_a_status_client_go_shows(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by the protocol review: the error bodies were ``{"error": ...}`` alone, and client-go shows a non-2xx
    body only when it decodes as a metav1.Status: the apiserver said 'the server rejected our request for an unknown
    reason'."""
    answers = [
        (post(client, "/mutate", b"{"), 400, "BadRequest"),
        (post(client, "/mutate", b"x" * (7 * 1024 * 1024 + 1)), 413, "RequestEntityTooLarge"),
        (post(client, "/mutate", review(gpu_pod()), "text/plain"), 415, "UnsupportedMediaType"),
        (client.get("/mutate"), 405, "MethodNotAllowed"),
        (client.get("/nope"), 404, "NotFound"),
    ]
    monkeypatch.setattr(decisions, "decide", mock.Mock(side_effect=KeyError("bug")))
    answers.append((post(client, "/validate", review(gpu_pod())), 500, "InternalError"))
    for r, code, reason in answers:
        assert r.status_code == code and r.content_type == "application/json"
        assert_status_body(r.get_json(), code, reason)
    assert_status_body(error_body("the request body did not arrive", 408), 408, "Timeout")


@pytest.mark.parametrize(("status", "reason"), [(400, "BadRequest"), (431, None), (501, None), (500, "InternalError")])
def test_gunicorns_error_answers_are_a_status_client_go_shows(status: int, reason: str | None) -> None:
    head, _, body = error_answer(status, "Some Reason", "what gunicorn said").partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status) and b"Content-Type: application/json" in head
    assert_status_body(json.loads(body), status, reason)


def test_health_and_ready(client: Any) -> None:
    assert client.get("/healthz").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.get_json()["nodes"] == 2


def test_not_ready_until_synced(settings: Any) -> None:
    from webhook.app import create_app
    from webhook.cluster import StaticCluster, build_view

    class Unsynced(StaticCluster):
        def ready(self) -> bool:
            return False

    client = create_app(settings, cluster=Unsynced(build_view([], settings))).test_client()
    r = client.get("/readyz")
    assert r.status_code == 503 and "synced" in r.get_json()["error"]


def test_not_ready_while_another_worker_has_not_synced(settings: Any) -> None:
    from webhook.app import create_app
    from webhook.cluster import StaticCluster, build_view
    from webhook.server import Unsynced

    app = create_app(settings, cluster=StaticCluster(build_view([], settings)))
    unsynced = Unsynced()
    try:
        app.extensions["gpu_admission"].unsynced_workers = unsynced.others
        client = app.test_client()
        unsynced.add(os.getpid())  # this worker's own mark does not count: it answers for itself
        assert client.get("/readyz").status_code == 200
        unsynced.add(4242)
        r = client.get("/readyz")
        assert r.status_code == 503 and "in worker 4242 of this server" in r.get_json()["error"]
        unsynced.add(17)
        assert "in workers 17, 4242 of this server" in client.get("/readyz").get_json()["error"]
        unsynced.remove(4242)
        unsynced.remove(17)
        unsynced.remove(17)  # twice: the master's child_exit after the worker's own
        assert client.get("/readyz").status_code == 200
    finally:
        unsynced.remove_all()
    assert not os.path.exists(unsynced.path)


# -- the strict decoder against a reference that checks every object ----------------------------------------------
def _reference(text: str) -> Any:
    def pairs_hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in pairs]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate")
        return dict(pairs)

    return json.loads(text, object_pairs_hook=pairs_hook)


TRICKY = st.sampled_from(['"', "\\", ":", '\\"', '":', "\\\\", '\\":', "{", "}", "[", "]", "é", "\u2028", "\ud7ff"])
tricky_text = st.lists(TRICKY | st.text(max_size=3), max_size=5).map("".join)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | tricky_text,
    lambda inner: st.lists(inner, max_size=3) | st.lists(st.tuples(tricky_text, inner), max_size=3),
    max_leaves=12,
)


def _write(value: Any, spaced: bool) -> str:
    """JSON text in which a list of (key, value) tuples is an object written as is: its keys may repeat."""
    colon, comma = (" : ", " , ") if spaced else (":", ",")
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        return "{" + comma.join(json.dumps(k) + colon + _write(v, spaced) for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + comma.join(_write(v, spaced) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


@given(value=values, spaced=st.booleans())
def test_duplicate_keys_are_found_exactly_as_a_check_of_every_object_finds_them(value: Any, spaced: bool) -> None:
    text = _write(value, spaced)
    duplicate = object()
    try:
        expected: Any = _reference(text)
    except ValueError:
        expected = duplicate
    if expected is duplicate:
        with pytest.raises(BadRequest, match="duplicate key"):
            decode_json(text.encode())
    else:
        assert decode_json(text.encode()) == expected


@pytest.mark.parametrize(
    "text",
    [
        '{"a":1,"a":2}',
        '{"a\\"":1,"a\\"":2}',
        '{"a\\\\":1,"a\\\\":2}',
        '{"x":"\\":","a":1,"a":1}',
        '{"k" : [1, {"b": 2, "b" : 3}]}',
        '{"\\u0061":1,"a":2}',
        '{"a":123456789012345678901,"a":1}',  # read by json; its pairs counted by the walk (orjson cannot write it)
        '{"a":"\\ud800","a":1}',
    ],
)
def test_duplicate_keys_however_written_are_named(text: str) -> None:
    with pytest.raises(BadRequest, match="duplicate key"):
        decode_json(text.encode())


@pytest.mark.parametrize(
    "text",
    [
        '{"a":123456789012345678901}',  # past 64 bits: orjson alone reads a float
        '{"a":-9223372036854775809}',  # 19 digits, below int64
        '{"a":18446744073709551616,"b":-1e+19}',
        '{"a":"\\ud800","b":"\\udc00x"}',  # lone surrogates, escaped: orjson alone refuses them
        '{"t":"1733160000123456789"}',  # 19 digits in a string: read alike by either path
        '{"a":1.5e308,"b":-0.0,"c":1e-400,"d":"\\u00e9\u00e9\u2028"}',
    ],
)
def test_numbers_and_strings_read_as_pythons_json_reads_them(text: str) -> None:
    value = decode_json(text.encode())
    assert value == json.loads(text)
    assert [type(v) for v in value.values()] == [type(v) for v in json.loads(text).values()]


def _nested(depth: int, kind: str) -> str:
    """``depth`` levels of objects, of arrays or of both in turn, a number innermost."""
    opens = [("[" if kind == "arrays" or (kind == "both" and i % 2) else '{"k":') for i in range(depth)]
    return "".join(opens) + "1" + "".join("]" if o == "[" else "}" for o in reversed(opens))


@pytest.mark.parametrize("kind", ["objects", "arrays", "both"])
@pytest.mark.parametrize("depth", [199, 200, 201, 300, 1023, 1024, 1025, 5000])
def test_nesting_past_the_depth_limit_is_refused_however_deep(depth: int, kind: str) -> None:
    """The limit holds between it and orjson's own (1,024 levels) too: 199 levels of brackets and the number inside
    make 200 levels; one more is refused. Brackets inside strings open nothing."""
    text = _nested(depth, kind)
    if depth < 200:
        assert decode_json(text.encode()) == json.loads(text)
        padded = '{"s":"' + "[{" * 300 + '","v":' + _nested(depth - 1, kind) + "}"  # as deep, 600 more in a string
        assert decode_json(padded.encode()) == json.loads(padded)
    else:
        with pytest.raises(BadRequest, match="nested deeper than 200 levels"):
            decode_json(text.encode())


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"a":1e400}', "out of range"),
        ('{"a":Infinity}', "Infinity is not valid JSON"),
        ('{"a":-Infinity}', "-Infinity is not valid JSON"),
        ('{"a":"\x01"}', "Invalid control character"),
        ('{"a":01}', "Expecting ',' delimiter"),
        ('{"a":1}x', "Extra data"),
        ('{"a":' + "9" * 5000 + "}", "not usable JSON"),
    ],
)
def test_refused_bodies_name_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(BadRequest, match=words):
        decode_json(text.encode())


@pytest.mark.parametrize(
    ("path", "image"),
    [
        ("/mutate", "nvidia/cuda:12.2.2-base-ubuntu22.04"),
        ("/validate", "pytorch/pytorch-nightly:2700000-cu12.8"),  # no forward compatibility: denied
    ],
)
def test_an_answer_that_quotes_a_lone_surrogate_is_still_json(client: Any, path: str, image: str) -> None:
    """A container's name is quoted in the webhook's annotations (the patch) and messages (a denial); the JSON
    writer of the answers (orjson) refuses a lone surrogate, which a request may carry escaped: the answer is
    written all the same."""
    pod = gpu_pod(name="x\ud800", image=image)
    r = post(client, path, json.dumps(review(pod)).encode())
    assert r.status_code == 200, r.get_data()
    answer = json.loads(r.get_data())["response"]
    said = answer["status"]["message"] if path == "/validate" else json.loads(base64.b64decode(answer["patch"]))
    assert "x\\ud800" in json.dumps(said)


def test_a_long_content_type_is_cut_in_the_415(client: Any) -> None:
    """Found by the observability review: the 415 named the whole media type the client sent (7,000 characters,
    twice in the answer, and whole in the decision log line); cut as the other messages cut what they quote."""
    r = post(client, "/mutate", b"{}", "text/" + "p" * 7000)
    assert r.status_code == 415
    assert r.get_json()["error"] == f"Content-Type must be application/json (got {('text/' + 'p' * 55)!r})"
    assert post(client, "/mutate", b"{}", "").get_json()["error"] == "Content-Type must be application/json (got none)"

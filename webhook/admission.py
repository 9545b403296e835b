"""AdmissionReview admission.k8s.io/v1 at the edge: parse strictly, answer exactly as the apiserver expects.

The wire format is typed here once (TypedDicts); inside, objects stay plain dicts. A request that cannot be reviewed
raises ``BadRequest`` (answered 4xx with a metav1.Status body, ``error_body``, so the webhook's failurePolicy
decides), never 500.
"""

from __future__ import annotations

import base64
import gc
import json
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

import orjson

from webhook.errors import BadRequest, PayloadTooLarge
from webhook.model import as_dict, as_str, json_bytes
from webhook.pipeline import Result

API_VERSION = "admission.k8s.io/v1"
MAX_DEPTH = 200
"""Deeper JSON than this is not a Kubernetes object; refusing it keeps every later walk (copy, diff) safe."""

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]


class Status(TypedDict, total=False):
    code: int
    message: str
    reason: str


class Response(TypedDict):
    uid: str
    allowed: bool
    status: NotRequired[Status]
    patch: NotRequired[str]
    patchType: NotRequired[Literal["JSONPatch"]]
    warnings: NotRequired[list[str]]
    auditAnnotations: NotRequired[dict[str, str]]


class ResponseReview(TypedDict):
    apiVersion: str
    kind: Literal["AdmissionReview"]
    response: Response


@dataclass(frozen=True)
class Subject:
    """Who the reviewed object is, as the decision log and the Events name it: its apiVersion, kind and identity
    metadata. Empty strings for what it does not set."""

    api_version: str = ""
    kind: str = ""
    name: str = ""
    generate_name: str = ""
    namespace: str = ""
    uid: str = ""


def subject_of(obj: Any) -> Subject:
    obj = as_dict(obj)
    meta = as_dict(obj.get("metadata"))
    return Subject(
        as_str(obj.get("apiVersion")),
        as_str(obj.get("kind")),
        as_str(meta.get("name")),
        as_str(meta.get("generateName")),
        as_str(meta.get("namespace")),
        as_str(meta.get("uid")),
    )


@dataclass(frozen=True)
class ReviewRequest:
    """The facts of ``request`` that the webhook uses. ``object`` is None on a request answered from its bytes
    (``webhook.replay``): ``subject`` is all that is known of the object then, and all the recorder reads."""

    uid: str
    operation: str
    namespace: str
    name: str
    kind: str
    """request.kind.kind (the object's kind as the apiserver names it)."""
    username: str
    groups: tuple[str, ...]
    dry_run: bool
    object: Any
    old_object: Any
    subject: Subject = Subject()


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise BadRequest(f"duplicate key {key[:60]!r} in JSON object")
            seen.add(key)
    return out


def _no_constants(name: str) -> Any:
    raise BadRequest(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise BadRequest(f"number {text[:40]} is out of range")
    return value


_is_dict = dict.__instancecheck__


def _pairs_parsed(value: Any) -> int:
    """The key-value pairs of every object in ``value``; BadRequest when it nests deeper than MAX_DEPTH.

    Level by level, in C: ``gc.get_referents`` gives the next level (a dict's keys and values, a list's items;
    strings and numbers have none), so the walk runs no Python code per value."""
    level: list[Any] = [value]
    depth = pairs = 0
    while level:
        depth += 1
        if depth > MAX_DEPTH:
            raise BadRequest(f"JSON nested deeper than {MAX_DEPTH} levels")
        pairs += sum(map(len, filter(_is_dict, level)))
        level = gc.get_referents(*level)
    return pairs


_NOT_WRITTEN_OUTSIDE = bytes(b for b in range(256) if b not in b'":{[')


def _written(body: bytes) -> tuple[int, int]:
    """The key-value pairs written in ``body`` (valid JSON), a key written twice counted twice, and the objects
    and arrays it opens: its colons and its opening brackets outside strings. With the escaped backslashes and then
    the escaped quotes taken out (left to right, as JSON pairs them), every quote left opens or closes a string
    (UTF-8 never has a quote, a colon or a bracket byte inside a longer character). Keep only those and split at
    the quotes: the even pieces lie outside strings. All in C: a tenth of a hook on every object."""
    if b"\\" in body:
        body = body.replace(b"\\\\", b"").replace(b'\\"', b"")
    # Two quotes side by side leave every other character as far inside or outside as it was: drop them first
    # (most strings hold no colon), then split what is left.
    outside = b"".join(body.translate(None, _NOT_WRITTEN_OUTSIDE).replace(b'""', b"").split(b'"')[::2])
    pairs = outside.count(b":")
    return pairs, len(outside) - pairs


def _pairs_in(value: Any, opens: int) -> int:
    """The key-value pairs of every object in ``value``, parsed from a body that opens ``opens`` objects and
    arrays; BadRequest when it nests deeper than MAX_DEPTH. A body of fewer openings cannot nest that deep, and its
    pairs are counted in orjson's writing of the value (a third of the walk's time for a small pod); what orjson
    will not write (an integer past 64 bits, a lone surrogate: read by ``json``) is walked."""
    if opens < MAX_DEPTH:  # the walk counts a level more than the brackets: a container's keys or items
        try:
            return _written(orjson.dumps(value))[0]
        except orjson.JSONEncodeError:
            pass
    return _pairs_parsed(value)


def decode_json(body: bytes) -> Any:
    """Strict JSON: UTF-8 only, no duplicate keys, no NaN/Infinity, bounded depth.

    Parsed by orjson (a third of the time of ``json``'s C decoder; it refuses what is not UTF-8, NaN, Infinity and
    numbers out of a double's range by itself), but for a body it refuses or one with 19 digits in a row: those are
    parsed by ``json`` with hooks, which names what is wrong, or reads what orjson alone refuses (an escaped lone
    surrogate, nesting past orjson's 1,024 levels, which the depth bound then refuses) or reads otherwise (orjson
    reads an integer past 64 bits as a float, and some of 19 digits). A duplicate key shows as more pairs written
    than parsed (a dict keeps one of them), and only then is the body parsed again, pair by pair, to name the
    key."""
    try:
        value = _loads(_text(body)) if _NINETEEN_DIGITS in body.translate(_DIGITS) else orjson.loads(body)
    except orjson.JSONDecodeError:
        value = _loads(_text(body))
    written, opens = _written(body)
    if _pairs_in(value, opens) != written:
        _loads(_text(body), _PAIR_BY_PAIR)
    return value


_DIGITS = bytes.maketrans(b"0123456789", b"9999999999")
_NINETEEN_DIGITS = b"9" * 19
"""Where ``body.translate(_DIGITS)`` holds this, ``body`` holds 19 digits in a row (a number, or digits in a
string, which cost only the slower parse): in C, a tenth of orjson's parse."""


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadRequest(f"body is not valid UTF-8 (byte {err.start})") from err


_PLAIN = json.JSONDecoder(parse_constant=_no_constants, parse_float=_finite_float)
_PAIR_BY_PAIR = json.JSONDecoder(
    object_pairs_hook=_no_duplicates, parse_constant=_no_constants, parse_float=_finite_float
)
"""Built once: ``json.loads`` with hooks builds a decoder on every call."""


def _loads(text: str, decoder: json.JSONDecoder = _PLAIN) -> Any:
    try:
        return decoder.decode(text)
    except RecursionError as err:
        raise BadRequest(f"JSON nested deeper than {MAX_DEPTH} levels") from err
    except json.JSONDecodeError as err:
        raise BadRequest(f"body is not valid JSON: {err.msg} at line {err.lineno} column {err.colno}") from err
    except ValueError as err:  # e.g. an integer of more digits than Python converts (int_max_str_digits)
        raise BadRequest(f"body is not usable JSON: {str(err)[:100]}") from err


def _str(value: Any, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{where} must be a string")
    return value


def check_content_type(content_type: str | None) -> None:
    mime = (content_type or "").split(";")[0].strip().lower()
    if mime != "application/json":
        got = repr(mime[:60]) if mime else "none"  # cut as the other messages: it went whole into the answer and log
        raise BadRequest(f"Content-Type must be application/json (got {got})", status=415)


def parse_review(body: bytes, max_bytes: int) -> ReviewRequest:
    """Parse an AdmissionReview request body; raise BadRequest naming what is wrong. Its Content-Type is checked
    before (``check_content_type``: ``decisions.decide`` does, before it looks at the body at all)."""
    if len(body) > max_bytes:
        raise PayloadTooLarge(f"body of {len(body)} bytes is over the limit of {max_bytes}")
    if not body:
        raise BadRequest("empty body: expected an AdmissionReview")
    review = decode_json(body)
    if not isinstance(review, dict):
        raise BadRequest("body must be a JSON object (an AdmissionReview)")
    if review.get("kind") != "AdmissionReview":
        raise BadRequest(f"kind must be AdmissionReview (got {str(review.get('kind'))[:60]!r})")
    if review.get("apiVersion") != API_VERSION:
        raise BadRequest(
            f"apiVersion must be {API_VERSION} (got {str(review.get('apiVersion'))[:60]!r}); "
            "set admissionReviewVersions: [v1] in the webhook configuration"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise BadRequest("request is missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadRequest("request.uid is missing or not a non-empty string")
    operation = _str(request.get("operation"), "request.operation")
    if operation not in OPERATIONS:
        raise BadRequest(f"request.operation must be one of {', '.join(OPERATIONS)} (got {operation[:30]!r})")
    obj = request.get("object")
    if operation in ("CREATE", "UPDATE") and not isinstance(obj, dict):
        raise BadRequest(f"request.object must be an object for {operation}")
    if obj is not None and not isinstance(obj, dict):
        raise BadRequest("request.object must be an object or null")
    user = request.get("userInfo")
    user = user if isinstance(user, dict) else {}
    groups = user.get("groups")
    kind = request.get("kind")
    dry_run = request.get("dryRun", False)
    if not isinstance(dry_run, bool) and dry_run is not None:
        raise BadRequest("request.dryRun must be true or false")
    return ReviewRequest(
        uid=uid,
        operation=operation,
        namespace=_str(request.get("namespace"), "request.namespace"),
        name=_str(request.get("name"), "request.name"),
        kind=_str(kind.get("kind"), "request.kind.kind") if isinstance(kind, dict) else "",
        username=_str(user.get("username"), "request.userInfo.username"),
        groups=tuple(g for g in groups if isinstance(g, str)) if isinstance(groups, list) else (),
        dry_run=bool(dry_run),
        object=obj,
        old_object=request.get("oldObject"),
        subject=subject_of(obj),
    )


def build_response(uid: str, result: Result, mutating: bool) -> ResponseReview:
    """The AdmissionReview answer: uid echoed; patch and patchType together and only when there is a change."""
    response: Response = {"uid": uid, "allowed": result.allowed}
    if not result.allowed:
        response["status"] = {"code": max(result.code, 400), "message": result.message, "reason": result.reason}
    if mutating and result.allowed and result.ops:
        response["patch"] = base64.b64encode(result.patch_bytes()).decode()
        response["patchType"] = "JSONPatch"
    if result.warnings:
        response["warnings"] = list(result.warnings)
    if result.audit:
        response["auditAnnotations"] = dict(result.audit)
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


_UID_SLOT = b'"uid":""'


def answer_parts(result: Result, mutating: bool) -> tuple[bytes, bytes]:
    """``build_response``'s answer as compact JSON, cut where the uid's JSON string goes (``encode_answer``): the
    parts of a reused answer are kept with it, so its next request only writes its uid between them."""
    text = json_bytes(build_response("", result, mutating))
    head, _, tail = text.partition(_UID_SLOT)  # the first "uid" is the response's: it comes before anything else
    return head + b'"uid":', tail


def encode_answer(uid: str, parts: tuple[bytes, bytes]) -> bytes:
    return parts[0] + json_bytes(uid) + parts[1]


STATUS_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    408: "Timeout",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    500: "InternalError",
}
"""metav1.StatusReason by HTTP status, for the statuses the webhook answers with (a status it has no name for, as
gunicorn's 414, 417, 431 or 501, goes without one: StatusReasonUnknown)."""


def error_body(message: str, code: int) -> dict[str, object]:
    """The body of an error answer (4xx, 5xx): a metav1.Status, the one body of a failed call that client-go (the
    apiserver's webhook client) reads and shows the message of; of any other it says only "the server rejected our
    request for an unknown reason". The message is also under ``error``, as the webhook has always said it."""
    body: dict[str, object] = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body["message"] = message
    if code in STATUS_REASONS:
        body["reason"] = STATUS_REASONS[code]
    body["code"] = code
    body["error"] = message
    return body

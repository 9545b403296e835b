"""The Helm hook Job's work: keep the serving Secret valid and the webhook configurations trusting its CA.

``ensure`` reads the ``kubernetes.io/tls`` Secret (``tls.crt``, ``tls.key``, ``ca.crt``, plus ``ca.key`` so a renewal
can keep the CA), creates it when absent, reuses it unchanged while it is valid, covers the service's names and is
more than ``renew_within_days`` from expiry, and otherwise renews it (``certs.issue.plan``). It then sets
``clientConfig.caBundle`` on every webhook of the two configurations, patching nothing that is already right, so a
second run (every ``helm upgrade``) writes nothing.

Order matters during a CA rotation. Pods keep serving the old leaf until the kubelet refreshes the mounted Secret
(a minute or more) and the server notices the new files, so the caBundle must trust the old CA and the new one
before the new leaf can be presented: the bundle (new CA first, then the previous CAs until they expire) is
injected first, then the Secret is updated. A new Secret is created first (nothing serves yet), then injected.

Objects stay plain dicts (``_preload_content=False``); the webhook patch is a JSON Patch touching only
``/webhooks/<i>/clientConfig/caBundle``, guarded by a ``test`` of the webhook's name at that index so a concurrent
edit that reorders webhooks makes the patch fail (422) and be recomputed instead of landing on the wrong webhook.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import urllib3
from kubernetes import client

from certs import CertsError
from certs.issue import CA_CRT, CA_KEY, TLS_CRT, TLS_KEY, Bundle, KeyType, Plan, plan, trusting

JSON = dict[str, Any]
SECRET_TYPE = "kubernetes.io/tls"
REQUEST_TIMEOUT = 15.0
# Status codes worth retrying until the deadline: the API server is busy, restarting or behind a flaky balancer.
TRANSIENT = frozenset({429, 500, 502, 503, 504})
MAX_ROUNDS = 5
LABELS = {"app.kubernetes.io/name": "gpu-admission", "app.kubernetes.io/component": "serving-certificate"}


@dataclass
class ConfigResult:
    kind: str
    name: str
    webhooks: int = 0
    patched: int = 0

    def text(self) -> str:
        n = f"{self.webhooks} webhook{'s' if self.webhooks != 1 else ''}"
        if self.patched:
            return f"{self.kind}/{self.name}: caBundle set on {self.patched} of {n}"
        return f"{self.kind}/{self.name}: caBundle already right ({n})"


@dataclass
class Result:
    """What ``ensure`` did; ``summary()`` is the one line the Job prints."""

    namespace: str
    secret: str
    action: str = ""  # created | reused | renewed | rotated
    reason: str = ""
    raced: bool = False
    secret_written: bool = False
    configs: list[ConfigResult] = field(default_factory=list)

    @property
    def patched(self) -> bool:
        return any(c.patched for c in self.configs)

    def summary(self) -> str:
        what = {
            "created": "created",
            "reused": "reused unchanged" if not self.secret_written else "reused (expired previous CAs dropped)",
            "renewed": "renewed, CA kept",
            "rotated": "renewed with a new CA (caBundle trusts old and new CA until the old one expires)",
            "kept": "exists: kept as it is (--create-only)",
        }.get(self.action, self.action)
        if self.raced:
            what += " (after a concurrent write by another job)"
        why = f" [{self.reason}]" if self.reason and self.action in ("renewed", "rotated") else ""
        configs = "; ".join(c.text() for c in self.configs) or "caBundle not injected (--create-only)"
        return f"Secret {self.namespace}/{self.secret} {what}{why}; {configs}"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(value: object) -> bytes:
    if not isinstance(value, str):
        return b""
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        return b""


def bundle_from_secret(obj: JSON) -> Bundle:
    """The bundle stored in a Secret object (missing or garbled keys read as empty, which ``plan`` renews)."""
    data = obj.get("data")
    data = data if isinstance(data, dict) else {}
    ca_key = _unb64(data.get(CA_KEY)) if CA_KEY in data else None
    return Bundle(_unb64(data.get(CA_CRT)), _unb64(data.get(TLS_CRT)), _unb64(data.get(TLS_KEY)), ca_key or None)


def secret_data(bundle: Bundle) -> dict[str, str]:
    return {name: _b64(content) for name, content in bundle.files().items()}


def ca_bundle(bundle: Bundle) -> str:
    """The value of ``clientConfig.caBundle``: base64 of the PEM CA certificates (current first)."""
    return _b64(bundle.ca_crt)


class _Api:
    """The few calls ``ensure`` makes, returning dicts and retrying transient failures until a deadline."""

    def __init__(self, api_client: client.ApiClient, deadline: float, poll: float, log: Callable[[str], None]) -> None:
        self.core = client.CoreV1Api(api_client)
        self.adm = client.AdmissionregistrationV1Api(api_client)
        self.deadline = deadline
        self.started = time.monotonic()
        self.poll = poll
        self.log = log

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def pause(self) -> None:
        time.sleep(max(0.0, min(self.poll, self.remaining())))

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> JSON:
        """``fn(...)`` as a dict; ApiException for non-transient statuses, CertsError once the deadline passes."""
        warned = False
        while True:
            try:
                response = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
                body = json.loads(response.data or b"{}")
                return body if isinstance(body, dict) else {}
            except client.ApiException as err:
                if err.status not in TRANSIENT:
                    raise
                problem = f"HTTP {err.status} {err.reason}"
            except (urllib3.exceptions.HTTPError, OSError, json.JSONDecodeError) as err:
                problem = f"{type(err).__name__}: {err}"
            if self.remaining() <= 0:
                raise CertsError(f"{what}: the API server kept failing ({problem})")
            if not warned:
                self.log(f"{what}: {problem}; retrying")
                warned = True
            self.pause()


def _api_error(what: str, err: client.ApiException) -> CertsError:
    message = ""
    try:
        body = json.loads(err.body or "{}")
        message = body.get("message", "") if isinstance(body, dict) else ""
    except (TypeError, ValueError):
        pass
    hint = " (check the Job's RBAC: it needs this verb on this object)" if err.status in (401, 403) else ""
    return CertsError(f"{what}: HTTP {err.status} {err.reason}{': ' + message if message else ''}{hint}")


def ensure(
    api_client: client.ApiClient,
    namespace: str,
    service: str,
    secret: str,
    mutating: str,
    validating: str,
    days: int = 365,
    renew_within_days: float = 30,
    *,
    key_type: KeyType = "ecdsa",
    wait_seconds: float = 120.0,
    poll_seconds: float = 2.0,
    now: dt.datetime | None = None,
    log: Callable[[str], None] | None = None,
    create_only: bool = False,
) -> Result:
    """Create, reuse or renew the Secret, then inject its CA bundle into both webhook configurations.

    A configuration that does not exist yet (the chart may create it after this Job starts) is waited for up to
    ``wait_seconds``; then ``CertsError`` names it. API failures raise ``CertsError`` naming the call.

    ``create_only``: create the Secret when it is missing and do nothing else (no renewal, no caBundle): the chart's
    pre-install hook, so that the server's pods can start (and ``helm install --wait`` finish) before the
    post-install run injects the CA into configurations that exist by then.
    """
    if renew_within_days >= days:
        raise ValueError(
            f"renew_within_days ({renew_within_days:g}) must be less than days ({days}): every run would renew"
        )
    say = log or (lambda line: print(line, file=sys.stderr))
    api = _Api(api_client, time.monotonic() + wait_seconds, poll_seconds, say)
    result = Result(namespace, secret)
    what = f"Secret {namespace}/{secret}"
    configs = [
        ("MutatingWebhookConfiguration", mutating, api.adm.read_mutating_webhook_configuration,
         api.adm.patch_mutating_webhook_configuration),
        ("ValidatingWebhookConfiguration", validating, api.adm.read_validating_webhook_configuration,
         api.adm.patch_validating_webhook_configuration),
    ]  # fmt: skip

    def inject(bundle: Bundle) -> list[ConfigResult]:
        return [_inject(api, kind, name, read, patch, ca_bundle(bundle)) for kind, name, read, patch in configs]

    decided: Plan | None = None
    injected_early = False
    for _ in range(MAX_ROUNDS):
        try:
            obj: JSON | None = api.call(f"reading {what}", api.core.read_namespaced_secret, secret, namespace)
        except client.ApiException as err:
            if err.status != 404:
                raise _api_error(f"reading {what}", err) from err
            obj = None
        if obj is not None and obj.get("type") != SECRET_TYPE:
            raise CertsError(
                f"{what} has type {obj.get('type')!r}, not {SECRET_TYPE!r} (the type cannot be changed): "
                "delete it or name another Secret"
            )
        if create_only and obj is not None:
            if injected_early:
                # Another run made the Secret between our read and our create, after our own CA went in (and our
                # patch may have landed after its last one): its CA goes in beside what is trusted now
                try:
                    inject(trusting(bundle_from_secret(obj), _trusted(api, configs), now))
                except CertsError as err:
                    say(f"the Secret's CA is not in the webhook configurations yet ({err}): the next run puts it")
            result.action = "kept"
            return result
        current = bundle_from_secret(obj) if obj is not None else None
        decided = plan(
            current, service, namespace, days=days, renew_within_days=renew_within_days, key_type=key_type, now=now
        )
        result.action = {"create": "created", "reuse": "reused", "renew": "renewed", "rotate": "rotated"}[
            decided.action
        ]
        result.reason = decided.reason
        if obj is None:
            # Deleted by hand while the pods still serve its leaf (the kubelet keeps a deleted Secret's files until
            # the new one is there): the new CA goes into the configurations beside those they trust now, before
            # the Secret, so that the old leaf and the new one both verify; and so in the pre-upgrade hook too,
            # whose post-upgrade run may never come (a failed or rolled-back upgrade)
            trusted = _trusted(api, configs)
            if trusted:
                injected_early = True  # also where it failed halfway: one configuration may hold our CA alone
                try:
                    inject(trusting(decided.bundle, trusted, now))
                except CertsError as err:
                    if not create_only:
                        raise
                    say(f"the new CA is not in the webhook configurations yet ({err}): the post-upgrade run puts it")
            body = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret, "namespace": namespace, "labels": LABELS},
                "type": SECRET_TYPE,
                "data": secret_data(decided.bundle),
            }
            try:
                api.call(f"creating {what}", api.core.create_namespaced_secret, namespace, body)
            except client.ApiException as err:
                if err.status == 409:  # another replica's job created it between our read and our create
                    result.raced = True
                    continue
                raise _api_error(f"creating {what}", err) from err
            result.secret_written = True
            break
        if decided.bundle == current:
            break
        if decided.action == "rotate":
            inject(decided.bundle)  # trust the new CA (next to the old one) before any server can present its leaf
        old = obj.get("data")
        kept = (
            {k: v for k, v in old.items() if k not in (CA_CRT, CA_KEY, TLS_CRT, TLS_KEY)}
            if isinstance(old, dict)
            else {}
        )
        obj["data"] = kept | secret_data(decided.bundle)
        try:
            api.call(f"updating {what}", api.core.replace_namespaced_secret, secret, namespace, obj)
        except client.ApiException as err:
            if err.status == 409:  # changed since we read it (resourceVersion conflict): decide again
                result.raced = True
                continue
            raise _api_error(f"updating {what}", err) from err
        result.secret_written = True
        break
    else:
        raise CertsError(f"{what} kept changing while being written ({MAX_ROUNDS} attempts); is another job running?")
    if create_only:
        return result
    injected = decided.bundle
    if _made_lately(obj, now):
        # A Secret made in the last minutes (this run, or the pre-upgrade hook's, a Secret deleted by hand): the CAs
        # the configurations trusted before it stay in the caBundle while pods may still serve their leaf; they are
        # never stored in the Secret, so the first run after that (the daily renewal) drops them
        injected = trusting(decided.bundle, _trusted(api, configs), now)
    result.configs = inject(injected)
    return result


LATELY = dt.timedelta(minutes=10)
"""How long after the Secret is made the CAs trusted before it stay in the caBundle: the kubelet refreshes a mounted
Secret within a minute or two, and the pods then serve the new leaf."""


def _made_lately(obj: JSON | None, now: dt.datetime | None) -> bool:
    """Whether the Secret (None: made by this run) was created within ``LATELY``."""
    if obj is None:
        return True
    meta = obj.get("metadata")
    stamp = meta.get("creationTimestamp") if isinstance(meta, dict) else None
    try:
        made = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")) if isinstance(stamp, str) else None
    except ValueError:
        made = None
    if made is None or made.tzinfo is None:
        return False
    current = now or dt.datetime.now(dt.UTC)
    return current.replace(tzinfo=current.tzinfo or dt.UTC) - made < LATELY


def _trusted(api: _Api, configs: list[tuple[str, str, Callable[..., Any], Callable[..., Any]]]) -> bytes:
    """The PEM of the CAs the webhook configurations trust now (their webhooks' ``caBundle``s); nothing where they
    do not exist (an install) or cannot be read (403)."""
    found = b""
    for kind, name, read, _ in configs:
        try:
            obj = api.call(f"reading {kind} {name!r}", read, name)
        except client.ApiException as err:
            if err.status in (403, 404):
                continue
            raise _api_error(f"reading {kind} {name!r}", err) from err
        for hook in obj.get("webhooks") or []:
            cc = hook.get("clientConfig") if isinstance(hook, dict) else None
            if isinstance(cc, dict) and isinstance(cc.get("caBundle"), str):
                found += _unb64(cc["caBundle"])
    return found


def _inject(
    api: _Api,
    kind: str,
    name: str,
    read: Callable[..., Any],
    patch: Callable[..., Any],
    want: str,
) -> ConfigResult:
    """Set ``caBundle`` on every webhook of one configuration; wait for it to exist; patch only what differs."""
    what = f"{kind} {name!r}"
    out = ConfigResult(kind, name)
    waiting = False
    conflicts = 0
    while conflicts < MAX_ROUNDS:
        try:
            obj = api.call(f"reading {what}", read, name)
        except client.ApiException as err:
            if err.status != 404:
                raise _api_error(f"reading {what}", err) from err
            if api.remaining() <= 0:
                waited = time.monotonic() - api.started
                raise CertsError(
                    f"{what} not found ({waited:.0f}s after start; gave up): is the chart's webhook configuration "
                    "named so, and created before this Job's deadline (--wait-seconds)?"
                ) from err
            if not waiting:
                api.log(f"waiting for {what} to be created")
                waiting = True
            api.pause()
            continue
        webhooks = obj.get("webhooks")
        webhooks = webhooks if isinstance(webhooks, list) else []
        ops: list[JSON] = []
        for i, hook in enumerate(webhooks):
            if not isinstance(hook, dict):
                continue
            cc = hook.get("clientConfig")
            if isinstance(cc, dict) and cc.get("caBundle") == want:
                continue
            if isinstance(hook.get("name"), str):
                ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook["name"]})
            if isinstance(cc, dict):
                ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": want})
            else:
                ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig", "value": {"caBundle": want}})
        out.webhooks = len(webhooks)
        out.patched = sum(1 for op in ops if op["op"] == "add")
        if not ops:
            return out
        try:
            api.call(f"patching {what}", patch, name, ops, _content_type="application/json-patch+json")
        except client.ApiException as err:
            if err.status in (404, 409, 422):  # edited or recreated meanwhile: read again and recompute
                conflicts += 1
                continue
            raise _api_error(f"patching {what}", err) from err
        return out
    raise CertsError(f"{what} kept changing while its caBundle was being set ({MAX_ROUNDS} attempts)")

"""A small in-memory Kubernetes API server for tests, spoken to by the real ``kubernetes`` client and ``kubectl``.

It keeps objects by collection path, hands out resourceVersions, and serves: discovery (``/api``, ``/apis``,
``/api/v1``, ``/apis/<group>/<version>``), list (with ``labelSelector`` / ``fieldSelector`` equality), watch
(``?watch=true`` from a resourceVersion, streamed as JSON lines), get, create (``generateName`` included), replace,
patch (merge, a resourceVersion in it a precondition; strategic-merge treated as merge; JSON patch; one that changes
nothing keeps the resourceVersion, as kube-apiserver's) and delete (uid and resourceVersion preconditions checked).
Faults for tests: ``expire(rv)`` makes watches from an older resourceVersion get
410 Gone, ``restore(rv)`` sets the resourceVersion back as an etcd restore does (a watch from a later one gets 504
ResourceVersionTooLarge), ``drop_watches()`` cuts every open watch stream, ``bookmark_seconds`` sends a BOOKMARK that
often to watches that ask for them once there is a resourceVersion newer than the one they began from (as
kube-apiserver's watch cache does: on a quiet collection a watch hears nothing), ``fail_next(n, code)`` answers the next
n requests (of one method, given ``method``) with an error, ``hang_up_next(n, stored)`` closes the connection of the
next n creates or patches without an answer (having stored or patched the object, or not), ``stop()/start()`` take it
off the air. ``KubeAPI(tls=(cert, key), ca=ca)`` serves HTTPS; ``connections`` counts the connections accepted;
``create_delay`` holds each create that long, and ``most_in_flight`` says how many were under way at once.
"""

from __future__ import annotations

import base64
import copy
import json
import queue
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import jsonpatch

JSON = dict[str, Any]

# resource -> (kind, namespaced) per group/version
RESOURCES: dict[str, dict[str, tuple[str, bool]]] = {
    "v1": {
        "nodes": ("Node", False),
        "pods": ("Pod", True),
        "events": ("Event", True),
        "secrets": ("Secret", True),
        "namespaces": ("Namespace", False),
        "configmaps": ("ConfigMap", True),
        "services": ("Service", True),
    },
    "events.k8s.io/v1": {"events": ("Event", True)},
    "admissionregistration.k8s.io/v1": {
        "mutatingwebhookconfigurations": ("MutatingWebhookConfiguration", False),
        "validatingwebhookconfigurations": ("ValidatingWebhookConfiguration", False),
    },
    "apps/v1": {"deployments": ("Deployment", True)},
}


class _Watch:
    def __init__(self, collection: str, namespace: str | None, since: int = 0, bookmarks: bool = False) -> None:
        self.collection = collection
        self.namespace = namespace
        self.since = since
        """The resourceVersion it began from."""
        self.bookmarks = bookmarks
        self.events: queue.Queue[JSON | None] = queue.Queue()
        self.cut = False
        """Closed before its last chunk (``KubeAPI.cut_watches``)."""


class KubeAPI:
    """Start with ``KubeAPI().start()``; ``url`` is ``http://127.0.0.1:<port>``."""

    def __init__(self, tls: tuple[str, str] | None = None, ca: str | None = None, client_ca: str | None = None) -> None:
        self.tls = tls
        self.ca = ca
        """The CA file that signed ``tls``'s certificate, for clients (``kubeconfig`` names it)."""
        self.client_ca = client_ca
        """With ``tls``: a client must present a certificate this CA signed (as an apiserver's --client-ca-file)."""
        self.connections = 0
        self._hang_ups: list[bool] = []
        self.create_delay = 0.0
        """Seconds each create takes, as a distant apiserver's round trip."""
        self.in_flight = self.most_in_flight = 0
        self.lock = threading.RLock()
        self.objects: dict[str, dict[tuple[str, str], JSON]] = {}  # collection key -> (namespace, name) -> obj
        self.log: list[tuple[int, str, str, JSON]] = []  # (rv, type, collection, obj)
        self.rv = 100
        self.expired_before = 0
        self.watches: list[_Watch] = []
        self.bookmark_seconds: float | None = None
        """Send a BOOKMARK this often to each watch that asks for them (kube-apiserver: about every minute), once the
        resourceVersion is newer than the one the watch began from (k8s.io/apiserver pkg/storage/cacher,
        cacheWatcher: a bookmark goes out only when ``event.ResourceVersion > resourceVersion``)."""
        self.requests: list[tuple[str, str]] = []
        self.request_headers: list[dict[str, str]] = []  # one per request, as ``requests``
        self._failures: list[int] = []
        self._failing: str | None = None
        """The method whose requests ``_failures`` answers; None: any."""
        self.retry_after: int | None = None
        self.server: ThreadingHTTPServer | None = None
        self.port = 0
        self.thread: threading.Thread | None = None

    # -- lifecycle --------------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> KubeAPI:
        api = self

        class Handler(_Handler):
            pass

        Handler.api = api
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        if self.tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            if self.client_ca:
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(self.client_ca)
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.drop_watches()
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def kubeconfig(self, path: str) -> str:
        """Write a kubeconfig for this server to ``path`` and return it."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "test",
            "clusters": [
                {
                    "name": "test",
                    "cluster": {"server": self.url, **({"certificate-authority": self.ca} if self.ca else {})},
                }
            ],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": "default"}}],
        }
        with open(path, "w", encoding="utf-8") as f:
            json.dump(config, f)
        return path

    # -- faults -----------------------------------------------------------------------------------------------
    def expire(self, rv: int | None = None) -> None:
        """Watches that start from a resourceVersion older than ``rv`` (default: now) get 410 Gone."""
        with self.lock:
            self.expired_before = self.rv if rv is None else rv

    def restore(self, rv: int) -> None:
        """As etcd restored from a backup: the resourceVersion goes back to ``rv`` and the history after it is gone
        (the objects are kept as they are). A watch from a later resourceVersion is then answered as kube-apiserver
        answers one (its watch cache, ``NewTooLargeResourceVersionError``): 504 Timeout, its cause
        ResourceVersionTooLarge, Retry-After 1."""
        with self.lock:
            self.rv = rv
            self.log = [entry for entry in self.log if entry[0] <= rv]

    def drop_watches(self) -> None:
        with self.lock:
            for w in self.watches:
                w.events.put(None)
            self.watches = []

    def cut_watches(self) -> None:
        """Close every open watch's connection before its last chunk, as a load balancer cuts an idle stream: the
        client reads a response that ended prematurely, not a watch that ended."""
        with self.lock:
            for w in self.watches:
                w.cut = True
                w.events.put(None)
            self.watches = []

    def gone_watches(self) -> None:
        """Send a 410 Gone ERROR event on every open watch, as an apiserver does when history is compacted."""
        with self.lock:
            self.expired_before = self.rv + 1
            for w in self.watches:
                w.events.put({"type": "ERROR", "object": _status(410, "Expired", "too old resource version")})
                w.events.put(None)
            self.watches = []

    def fail_next(self, count: int, code: int = 500, retry_after: int | None = None, method: str | None = None) -> None:
        """The next ``count`` requests (of ``method`` alone, when given: a GET refused where a POST is not) are answered
        ``code`` (with a Retry-After of that many seconds, when given, as kube-apiserver's priority and fairness
        answers 429)."""
        with self.lock:
            self._failures += [code] * count
            self.retry_after, self._failing = retry_after, method

    def clear_failures(self) -> None:
        """The failures ``fail_next`` left unanswered are dropped: the next requests are answered again."""
        with self.lock:
            self._failures = []

    def hang_up_next(self, count: int, stored: bool = False) -> None:
        """The next ``count`` creates or patches are read and their connection closed with no answer, as a server does
        that closes an idle keep-alive connection as a request arrives; ``stored``: after the object was created or
        patched (a create of a name that is there stores nothing: kube-apiserver's AlreadyExists is what is lost)."""
        with self.lock:
            self._hang_ups += [stored] * count

    # -- store ------------------------------------------------------------------------------------------------
    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, type_: str, collection: str, obj: JSON) -> None:
        rv = int(obj["metadata"]["resourceVersion"])
        self.log.append((rv, type_, collection, copy.deepcopy(obj)))
        ns = obj["metadata"].get("namespace")
        for w in self.watches:
            if w.collection == collection and (w.namespace is None or w.namespace == ns):
                w.events.put({"type": type_, "object": copy.deepcopy(obj)})

    def put(self, gv: str, resource: str, obj: JSON, namespace: str | None = None) -> JSON:
        """Create or replace an object directly (test set-up); emits ADDED or MODIFIED."""
        kind, namespaced = RESOURCES[gv][resource]
        key = f"{gv}/{resource}"
        with self.lock:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            if namespaced:
                meta["namespace"] = namespace or meta.get("namespace") or "default"
            obj.setdefault("apiVersion", gv)
            obj.setdefault("kind", kind)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            meta["resourceVersion"] = self._next_rv()
            store = self.objects.setdefault(key, {})
            ident = (meta.get("namespace", ""), meta["name"])
            existed = ident in store
            store[ident] = obj
            self._emit("MODIFIED" if existed else "ADDED", key, obj)
            return copy.deepcopy(obj)

    def delete(self, gv: str, resource: str, name: str, namespace: str = "") -> None:
        key = f"{gv}/{resource}"
        with self.lock:
            obj = self.objects.get(key, {}).pop((namespace, name))
            obj["metadata"]["resourceVersion"] = self._next_rv()
            self._emit("DELETED", key, obj)

    def get(self, gv: str, resource: str, name: str, namespace: str = "") -> JSON | None:
        with self.lock:
            obj = self.objects.get(f"{gv}/{resource}", {}).get((namespace, name))
            return copy.deepcopy(obj) if obj else None

    def list(self, gv: str, resource: str, namespace: str | None = None) -> list[JSON]:
        with self.lock:
            return [
                copy.deepcopy(o)
                for (ns, _), o in self.objects.get(f"{gv}/{resource}", {}).items()
                if namespace is None or ns == namespace
            ]


def _status(code: int, reason: str, message: str) -> JSON:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
        "metadata": {},
    }


def _field(obj: JSON, path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return "" if node is None else str(node)


def _selected(obj: JSON, query: dict[str, list[str]]) -> bool:
    for name, source in (("fieldSelector", obj), ("labelSelector", obj.get("metadata", {}).get("labels") or {})):
        for clause in ",".join(query.get(name, [])).split(","):
            if not clause:
                continue
            negate = "!=" in clause
            k, _, v = clause.replace("!=", "=").replace("==", "=").partition("=")
            have = _field(source, k) if name == "fieldSelector" else str(source.get(k, ""))
            if (have == v) == negate:
                return False
    return True


class _Handler(BaseHTTPRequestHandler):
    api: KubeAPI
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    """TCP_NODELAY: headers and body are two writes, and the body waited for the client's delayed ACK (40 ms a
    request over keep-alive)."""

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.api.lock:
            self.api.connections += 1

    # -- plumbing ---------------------------------------------------------------------------------------------
    def _send(self, code: int, body: JSON, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(length) or b"null")

    def _route(self) -> tuple[str, str, str | None, str | None, dict[str, list[str]]] | None:
        """(gv, resource, namespace, name, query) for resource paths."""
        url = urlparse(self.path)
        parts = [p for p in url.path.split("/") if p]
        query = parse_qs(url.query)
        if parts[:2] == ["api", "v1"]:
            gv, rest = "v1", parts[2:]
        elif len(parts) >= 3 and parts[0] == "apis":
            gv, rest = f"{parts[1]}/{parts[2]}", parts[3:]
        else:
            return None
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        if not rest or gv not in RESOURCES or rest[0] not in RESOURCES[gv]:
            return None
        return gv, rest[0], namespace, rest[1] if len(rest) > 1 else None, query

    def _discovery(self) -> bool:
        path = urlparse(self.path).path.rstrip("/")
        if path == "/api":
            self._send(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}],
                },
            )
            return True
        if path == "/apis":
            groups = []
            for gv in RESOURCES:
                if "/" in gv:
                    g, v = gv.split("/")
                    groups.append(
                        {
                            "name": g,
                            "versions": [{"groupVersion": gv, "version": v}],
                            "preferredVersion": {"groupVersion": gv, "version": v},
                        }
                    )
            self._send(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
            return True
        gv = "v1" if path == "/api/v1" else path[len("/apis/") :] if path.startswith("/apis/") else ""
        if gv in RESOURCES:
            resources = [
                {
                    "name": r,
                    "singularName": k.lower(),
                    "namespaced": ns,
                    "kind": k,
                    "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                }
                for r, (k, ns) in RESOURCES[gv].items()
            ]
            self._send(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
            return True
        if path == "/version":
            self._send(200, {"major": "1", "minor": "34", "gitVersion": "v1.34.0", "platform": "linux/amd64"})
            return True
        return False

    def _fault(self) -> bool:
        with self.api.lock:
            self.api.requests.append((self.command, self.path))
            self.api.request_headers.append(dict(self.headers.items()))
            if self.api._failures and self.api._failing in (None, self.command):
                code = self.api._failures.pop(0)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))  # keep the connection usable
                extra = {"Retry-After": str(self.api.retry_after)} if self.api.retry_after is not None else {}
                self._send(code, _status(code, "InternalError", "injected failure"), extra)
                return True
        return False

    # -- verbs ------------------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        if self._fault() or self._discovery():
            return
        route = self._route()
        if route is None:
            self._send(404, _status(404, "NotFound", f"no route {self.path}"))
            return
        gv, resource, namespace, name, query = route
        key = f"{gv}/{resource}"
        if name:
            obj = self.api.get(gv, resource, name or "", namespace or "")
            if obj is None:
                self._send(404, _status(404, "NotFound", f'{resource} "{name}" not found'))
            else:
                self._send(200, obj)
            return
        if query.get("watch", ["false"])[0] in ("true", "1"):
            self._watch(key, namespace, query)
            return
        kind = RESOURCES[gv][resource][0]
        with self.api.lock:
            items = [o for o in self.api.list(gv, resource, namespace) if _selected(o, query)]
            rv = str(self.api.rv)
        self._send(200, {"kind": f"{kind}List", "apiVersion": gv, "metadata": {"resourceVersion": rv}, "items": items})

    def _watch(self, key: str, namespace: str | None, query: dict[str, list[str]]) -> None:
        since = int(query.get("resourceVersion", ["0"])[0] or 0)
        timeout = float(query.get("timeoutSeconds", ["30"])[0])
        w = _Watch(key, namespace, since, query.get("allowWatchBookmarks", ["false"])[0] == "true")
        with self.api.lock:
            current = self.api.rv
        if since > current:
            status = _status(504, "Timeout", f"Too large resource version: {since}, current: {current}")
            status["details"] = {
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1,
            }
            self._send(504, status, {"Retry-After": "1"})
            return
        with self.api.lock:
            gone = since and since < self.api.expired_before
            if not gone:
                for rv, type_, coll, obj in self.api.log:
                    if (
                        rv > since
                        and coll == key
                        and (namespace is None or obj["metadata"].get("namespace") == namespace)
                    ):
                        w.events.put({"type": type_, "object": copy.deepcopy(obj)})
                self.api.watches.append(w)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            if gone:
                self._chunk({"type": "ERROR", "object": _status(410, "Expired", "too old resource version")})
                return
            for event in self._drain(w, timeout):
                self._chunk(event)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with self.api.lock:
                if w in self.api.watches:
                    self.api.watches.remove(w)
            try:
                if not w.cut:
                    self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                pass
            self.close_connection = True

    def _drain(self, w: _Watch, timeout: float) -> Iterator[JSON]:
        deadline = time.monotonic() + timeout
        bookmark_at = time.monotonic()
        while time.monotonic() < deadline:
            every = self.api.bookmark_seconds
            if w.bookmarks and every is not None and time.monotonic() - bookmark_at >= every:
                with self.api.lock:  # events are queued under the lock: none queued, every one up to rv was sent
                    rv = self.api.rv if w.events.empty() else None
                if rv is not None and rv > w.since:
                    bookmark_at = time.monotonic()
                    gv, resource = w.collection.rsplit("/", 1)
                    kind = RESOURCES[gv][resource][0]
                    yield {"type": "BOOKMARK", "object": {"kind": kind, "metadata": {"resourceVersion": str(rv)}}}
            try:
                event = w.events.get(timeout=0.1 if every is None else min(0.1, every / 5))
            except queue.Empty:
                continue
            if event is None:
                return
            yield event

    def _chunk(self, event: JSON) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_POST(self) -> None:
        if self._fault():
            return
        route = self._route()
        if route is None or route[3]:
            self._send(404, _status(404, "NotFound", f"no route {self.path}"))
            return
        gv, resource, namespace, _, query = route
        obj = self._body()
        if self.api.create_delay:
            with self.api.lock:
                self.api.in_flight += 1
                self.api.most_in_flight = max(self.api.most_in_flight, self.api.in_flight)
            time.sleep(self.api.create_delay)
            with self.api.lock:
                self.api.in_flight -= 1
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            self._send(422, _status(422, "Invalid", "metadata.name: Required value"))
            return
        with self.api.lock:
            exists = self.api.get(gv, resource, meta["name"], namespace or "") is not None
            hang_up = self.api._hang_ups.pop(0) if self.api._hang_ups else None
            if hang_up is not None:
                if hang_up and not exists:  # there already: kube-apiserver stores nothing (its 409 is what is lost)
                    self.api.put(gv, resource, obj, namespace)
                self.close_connection = True
                return
            if exists:
                self._send(409, _status(409, "AlreadyExists", f'{resource} "{meta["name"]}" already exists'))
                return
            if query.get("dryRun"):
                self._send(201, obj)
                return
            self._send(201, self.api.put(gv, resource, obj, namespace))

    def _existing(self) -> tuple[str, str, str, str] | None:
        """(gv, resource, namespace, name) of an item path whose object exists; else a 404 is sent and None."""
        if self._fault():
            return None
        route = self._route()
        if route is None or not route[3]:
            self._send(404, _status(404, "NotFound", f"no route {self.path}"))
            return None
        gv, resource, namespace, name, _ = route
        if self.api.get(gv, resource, name or "", namespace or "") is None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))  # keep the connection usable
            self._send(404, _status(404, "NotFound", f'{resource} "{name}" not found'))
            return None
        return gv, resource, namespace or "", name or ""

    def do_PUT(self) -> None:
        found = self._existing()
        if found is None:
            return
        gv, resource, namespace, name = found
        obj = self._body()
        obj.setdefault("metadata", {})["name"] = name
        with self.api.lock:  # optimistic concurrency, as the apiserver: a stale resourceVersion is a 409 Conflict
            current = (self.api.get(gv, resource, name or "", namespace or "") or {}).get("metadata", {})
            if obj["metadata"].get("resourceVersion") not in (None, "", current.get("resourceVersion")):
                self._send(409, _status(409, "Conflict", "the object has been modified; please apply your changes"))
                return
            self._send(200, self.api.put(gv, resource, obj, namespace))

    def do_PATCH(self) -> None:
        found = self._existing()
        if found is None:
            return
        gv, resource, namespace, name = found
        with self.api.lock:
            current = self.api.get(gv, resource, name, namespace)
            if current is None:  # deleted in between
                self._send(404, _status(404, "NotFound", f'{resource} "{name}" not found'))
                return
            body = self._body()
            hang_up = self.api._hang_ups.pop(0) if self.api._hang_ups else None
            if hang_up is not None and not hang_up:
                self.close_connection = True
                return
            if "json-patch" in (self.headers.get("Content-Type") or ""):
                patched = jsonpatch.apply_patch(current, body)
            else:  # a merge patch that names a resourceVersion applies to that one only, as the apiserver's
                wanted = (body.get("metadata") or {}).get("resourceVersion")
                if wanted is not None and wanted != current["metadata"].get("resourceVersion"):
                    self._send(409, _status(409, "Conflict", "the object has been modified; please apply your changes"))
                    return
                patched = _merge(current, body)
            # a patch that changes nothing is no write: kube-apiserver keeps the resourceVersion and tells no watch
            stored = current if patched == current else self.api.put(gv, resource, patched, namespace)
            if hang_up:
                self.close_connection = True
                return
            self._send(200, stored)

    def do_DELETE(self) -> None:
        found = self._existing()
        if found is None:
            return
        gv, resource, namespace, name = found
        # DeleteOptions.preconditions, as the apiserver checks them: a mismatch is a 409 and nothing is deleted.
        wanted = (self._body() or {}).get("preconditions") or {}
        meta = (self.api.get(gv, resource, name, namespace) or {}).get("metadata", {})
        for field in ("uid", "resourceVersion"):
            if wanted.get(field) is not None and wanted[field] != meta.get(field):
                self._send(409, _status(409, "Conflict", f"Precondition failed: {field} in precondition"))
                return
        self.api.delete(gv, resource, name, namespace)
        self._send(200, _status(200, "", "deleted") | {"status": "Success"})


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (strategic merge patch is treated the same: good enough for tests)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


CREDENTIAL: JSON = {
    "apiVersion": "client.authentication.k8s.io/v1beta1",
    "kind": "ExecCredential",
    "status": {"token": "t"},
}
"""What an exec credential plugin prints."""
EXPIRED: JSON = {**CREDENTIAL, "status": {"token": "t", "expirationTimestamp": "2000-01-01T00:00:00Z"}}
"""A token the kubernetes client takes for expired at once: it runs the plugin again before each request."""


def exec_kubeconfig(api: KubeAPI, tmp_path: Path, credential: JSON) -> tuple[Path, Path]:
    """A kubeconfig whose user's exec plugin (`get-token eks get-token`) writes a line to ``runs`` and prints
    ``credential``, and hangs while the file ``hang`` exists: (the kubeconfig, the ``hang`` file)."""
    hang = tmp_path / "hang"
    plugin = tmp_path / "get-token"
    plugin.write_text(
        "#!/bin/sh\n"
        f"echo run >> {tmp_path}/runs\n"
        f"while [ -e {hang} ]; do sleep 0.05; done\n"
        f"echo '{json.dumps(credential)}'\n"
    )
    plugin.chmod(0o755)
    kubeconfig = tmp_path / "kubeconfig"
    config = json.loads(Path(api.kubeconfig(str(kubeconfig))).read_text())
    config["users"][0]["user"] = {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1beta1",
            "command": str(plugin),
            "args": ["eks", "get-token"],
            "interactiveMode": "Never",
        }
    }
    kubeconfig.write_text(json.dumps(config))
    return kubeconfig, hang


UNREADABLE_TLS = ("certificate-authority-data", "certificate-authority", "client-certificate")
"""The TLS material a kubeconfig may hold that the kubernetes client's loader takes whatever it is
(``with_unreadable_tls``)."""


def with_unreadable_tls(kubeconfig: Path, what: str) -> None:
    """``kubeconfig`` rewritten as a Secret's mount is (a new file renamed over it), with TLS material that loads and
    cannot be read (``what``, of UNREADABLE_TLS): certificate-authority-data that is no certificate, a
    certificate-authority file that is none, or client-certificate and client-key files that are none."""
    config = json.loads(kubeconfig.read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    junk = kubeconfig.with_name("junk.pem")
    junk.write_text("not a certificate\n")
    if what == "certificate-authority-data":
        cluster.pop("certificate-authority", None)
        cluster[what] = base64.b64encode(b"not a certificate").decode()
    elif what == "certificate-authority":
        cluster[what] = str(junk)
    else:
        user.update({"client-certificate": str(junk), "client-key": str(junk)})
    fresh = kubeconfig.with_name(kubeconfig.name + ".new")
    fresh.write_text(json.dumps(config))
    fresh.rename(kubeconfig)

"""Events on the reviewed object, so ``kubectl describe pod`` shows what the webhook decided under ``Events:``.

Only the validating side creates them: there, on CREATE, the apiserver has generated the pod's name and
``metadata.uid`` (``kubectl describe`` finds a pod's Events by name, namespace, kind and uid). Nothing is written on a
dryRun request (the webhook declares ``sideEffects: NoneOnDryRun``).

Sending is off the request path. Under ``gpu-admission serve`` it is out of the worker too: a review writes its
Events as lines to a pipe (``EventPipe``) and returns, and one relay process, forked before gunicorn starts, reads
the lines of every worker and sends them (``run_relay``): no thread of a worker wakes for an Event or takes the
worker's interpreter lock for it (an Event sent to the API costs more CPU than the review: ``docs/benchmarks.md``,
15.), and the Events a stopping worker has written still go out. In one process (tests, the Flask test client)
the request puts the body on a bounded queue whose daemon thread sends it (``EventQueue``). A full pipe or queue
drops the Event and counts it; it never blocks a request. Sinks: the API (core v1 Events through the
``kubernetes`` client; RBAC: core ``events`` ``create``, ``get`` and ``patch``: the same report about the same object
again raises its Event's count, ``ApiSink.send``) or the log (development, no cluster access).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import http.client
import json
import logging
import math
import os
import queue
import random
import re
import select
import signal
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import quote, urlsplit

from webhook import http1
from webhook.model import JSON, Event, as_dict, as_str, clipped, compact_json, middle_clipped

if TYPE_CHECKING:
    from webhook.admission import ReviewRequest, Subject
    from webhook.pipeline import Result
    from webhook.watch import InTime, Rewritten

log = logging.getLogger("gpu_admission.events")

COMPONENT = "gpu-admission"
"""``source.component`` and ``reportingComponent``: the ``From`` column of ``kubectl describe``."""
MESSAGE_LIMIT = 1024
"""events.k8s.io limits a note to 1 kB; core v1 Events are kept to the same size, a longer message cut in its middle
(``middle_clipped``): its advice is its end. A refused ungating's Event, the only place a user reads the refusal of
a controller's update, is made to fit refusal by refusal before (``pipeline.ungate_event``), also in the relay's pipe
(``MESSAGE_BYTES``). (Another line too long for that pipe, of mostly non-ASCII text, is cut further, at its end:
``EventPipe.write_lines``.)"""
NAME_LIMIT = 253


_STAMP: list[Any] = [None, ""]
"""The last second written as a timestamp, and its text: the Events of one second share it."""


def _timestamp(now: float) -> str:
    second = int(now)
    if _STAMP[0] != second:
        _STAMP[:] = [second, datetime.fromtimestamp(second, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")]
    return str(_STAMP[1])


@functools.lru_cache(maxsize=256)
def _report(event: Event) -> bytes:
    """A digest of what an Event says: its type, reason and message as sent (reused answers share their Events)."""
    said = f"{event.type}\0{event.reason}\0{middle_clipped(event.message, MESSAGE_LIMIT)}"
    return hashlib.blake2b(said.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def event_name(kind: str, name: str, uid: str, event: Event) -> str:
    """The name of the Event that tells ``event`` about the object: its name, then a digest of the object (kind,
    name, uid) and of the report (``_report``). The same report about the same object is the same Event, whose count
    the relay raises (``ApiSink.send``), as client-go's recorder aggregates a repeat ("x15 over 10m" in ``kubectl
    describe``): named by the time, as client-go names them, a controller retrying a refused ungating got an Event
    per retry, one identical line each in the pod's Events (a review's finding). A valid DNS subdomain: the object's
    name cut, if need be, where it does not end in '.' or '-'."""
    about = f"{kind or 'Pod'}/{name}/{uid}".encode("utf-8", "surrogatepass")
    suffix = "." + hashlib.blake2b(_report(event) + about, digest_size=8).hexdigest()
    return name[: NAME_LIMIT - len(suffix)].rstrip(".-") + suffix


def event_body(
    subject: Subject, namespace: str, name: str, event: Event, instance: str, now: float | None = None
) -> JSON:
    """A core v1 Event about the reviewed object (a plain dict: the client sends it as it is)."""
    stamp = _timestamp(time.time() if now is None else now)
    named = event_name(subject.kind, name, subject.uid, event)
    return _event(subject.api_version, subject.kind, subject.uid, namespace, named, name, event, instance, stamp)


def _event(
    api_version: str,
    kind: str,
    uid: str,
    namespace: str,
    event_name: str,
    name: str,
    event: Event,
    instance: str,
    stamp: str,
) -> JSON:
    involved: JSON = {"apiVersion": api_version or "v1", "kind": kind or "Pod", "namespace": namespace, "name": name}
    if uid:
        involved["uid"] = uid
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": event_name, "namespace": namespace},
        "involvedObject": involved,
        "reason": event.reason,
        "message": middle_clipped(event.message, MESSAGE_LIMIT),
        "type": event.type,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def _addressed(review: ReviewRequest | None, result: Result | None) -> tuple[str, str] | None:
    """(name, namespace) of the object a validating answer's Events are about; None when it calls for none: on
    dryRun, a skip, with no name, or a denial of a create (the object is not made; an UPDATE's is there: a pod's
    ungating refused, ``pipeline.ungated``)."""
    if review is None or result is None or review.dry_run or result.skipped:
        return None
    if not result.allowed and (review.operation != "UPDATE" or review.kind != "Pod"):
        return None  # a pod's update is refused only when it takes its last gate away: UngateRefused alone
    if review.operation not in ("CREATE", "UPDATE") or not result.outcome.events:
        return None
    name = review.name or review.subject.name
    namespace = review.namespace or review.subject.namespace
    return (name, namespace) if name and namespace else None


def events_for(review: ReviewRequest | None, result: Result | None, instance: str) -> list[JSON]:
    """The Event bodies a validating answer calls for (``_addressed``)."""
    where = _addressed(review, result)
    if review is None or result is None or where is None:
        return []
    name, namespace = where
    return [event_body(review.subject, namespace, name, e, instance) for e in result.outcome.events]


_MARKS = ("\x00e", "\x00n", "\x00u", "\x00t")
"""Where ``event_lines`` writes the Event's name, the object's name and uid, and the time into a template."""
_ENCODED_MARK = re.compile("|".join(re.escape(json.dumps(mark)) for mark in _MARKS))
_STRING = json.encoder.encode_basestring_ascii


@functools.lru_cache(maxsize=256)
def _line_template(
    api_version: str, kind: str, with_uid: bool, namespace: str, event: Event, instance: str
) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
    """An Event's JSON line cut where the marks are, and which mark each cut holds; None when its own text holds a
    mark (then ``event_lines`` writes it whole)."""
    uid = _MARKS[2] if with_uid else ""
    text = compact_json(_event(api_version, kind, uid, namespace, _MARKS[0], _MARKS[1], event, instance, _MARKS[3]))
    order = tuple(_MARKS.index(json.loads(m.group())) for m in _ENCODED_MARK.finditer(text))
    if sorted(order) != sorted((0, 1, 3, 3, *((2,) if with_uid else ()))):
        return None
    return tuple(_ENCODED_MARK.split(text)), order


def event_lines(review: ReviewRequest | None, result: Result | None, instance: str) -> list[bytes]:
    """The JSON lines of ``events_for``'s bodies, written from a template per Event (reused answers share their
    Events; their replicas differ in names, uid and time): a third of the time of building and encoding each body."""
    where = _addressed(review, result)
    if review is None or result is None or where is None:
        return []
    name, namespace = where
    subject = review.subject
    lines = []
    for event in result.outcome.events:
        template = _line_template(subject.api_version, subject.kind, bool(subject.uid), namespace, event, instance)
        if template is None:
            lines.append(_line(event_body(subject, namespace, name, event, instance)))
            continue
        pieces, order = template
        fills = (event_name(subject.kind, name, subject.uid, event), name, subject.uid, _timestamp(time.time()))
        out = [pieces[0]]
        for at, mark in enumerate(order, 1):
            out += (_STRING(fills[mark]), pieces[at])
        lines.append("".join(out).encode() + b"\n")
    return lines


class EventSink(Protocol):
    """Delivers one Event body; raises when it could not. A sink may say how many Events it sends at once from
    threads of its own, ``concurrency`` (1 when it does not say: ``Sender.deliver_all``)."""

    name: str

    def send(self, body: JSON) -> None: ...


class LogSink:
    """Events as JSON log lines (``make run``, no cluster access)."""

    name = "log"

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or log

    def send(self, body: JSON) -> None:
        """One line: ``{"event", "type", "object": "Kind/namespace/name", "uid", "message"}``, its strings written by
        the C encoder ``json.dumps`` ends in (a quarter of ``json.dumps``'s time for the relay, which writes one per
        Event)."""
        involved = as_dict(body.get("involvedObject"))
        where = f"{as_str(involved.get('kind'))}/{as_str(involved.get('namespace'))}/{as_str(involved.get('name'))}"
        fields = (body.get("reason"), body.get("type"), where, involved.get("uid"), body.get("message"))
        reason, kind, obj, uid, message = (_STRING(as_str(value)) for value in fields)
        self.logger.info('{"event":%s,"type":%s,"object":%s,"uid":%s,"message":%s}', reason, kind, obj, uid, message)


RETRY_STATUSES = frozenset({0, 429, 500, 502, 503, 504})


SENDING_AT_ONCE = 4
"""Events the API sink sends at once, each from a thread and on a connection of its own. One at a time, the relay
could send no more than one Event per round trip to the apiserver, whatever its CPU: 200 a second at 5 ms, and a
burst of pods past that filled the pipe and dropped Events."""


EVENTS_PATH = "/api/v1/namespaces/{namespace}/events"
EVENT_PATH = EVENTS_PATH + "/{name}"
JSON_TYPE = "application/json"
MERGE_PATCH = "application/merge-patch+json"
"""How client-go's recorder raises a repeated Event's count (a patch of ``count`` and ``lastTimestamp``); a merge
patch that names a ``metadata.resourceVersion`` applies only to that version (else 409 Conflict)."""

REPEATS_KEPT = 4096
"""Events the API sink keeps the count and resourceVersion it left them at, in each of two parts (``_Counts``): their
next repeat is one PATCH, which names that resourceVersion, so that a retry of it is not mistaken for a repeat already
counted (client-go's recorder keeps 4096 in its cache)."""
OWN_FIRST = ("count", "firstTimestamp", "reportingInstance")
"""What tells a create's own first try from an Event made before it: its count is the body's, and timestamps are whole
seconds, and each replica reports as its own instance (its pod name), so another replica's create in the same second
differs there; a raise sets the count and ``reportingInstance`` (``OWN_RAISE``)."""
OWN_RAISE = ("count", "reportingInstance")
"""What tells a raise's own first try from another replica's raise: the count it raised to, and the replica that raised
it (each raise sets ``reportingInstance`` to its own)."""
REPEAT_TRIES = 8
"""How often the API sink sets about a repeat (create, read the count, raise it) before it gives up, counted
failed: each time the Event changed in between (another replica raised its count) or went (its TTL)."""
CONFLICT_PAUSE_S = 0.01
"""The window of the random pause before a count is read again after the second Conflict of a repeat, doubled with
each one after (six: at most 0.63 s in all): replicas that a controller's retries reach at once raise the same Event at
once, and the one whose raise lands first changes it under the others (a read, a GET, changes nothing). Read and
raised again at once, three replicas ran out of tries and counted an Event failed though the API was healthy (a
review's finding); at random moments, each in turn finds it unchanged."""


class NotRaised(Exception):
    """A repeat's Event could not have its count raised: a read (``get``) or a patch of it failed (``__cause__``:
    how; ``verb``: which). Told apart from a failed create in the log, which names the verb: RBAC managed outside the
    chart, or a ClusterRole from before repeats were counted, grants ``create`` on Events and not ``get`` or
    ``patch``, and every repeat was told as a create that failed, the verb only in the quoted answer (found by a
    review). ``verb`` None: every request was answered, and what went wrong is in no verb's RBAC (an Event read with
    no count, or changed by other replicas at every try)."""

    def __init__(self, message: str, verb: str | None = None, shown: bool = False) -> None:
        super().__init__(message)
        self.verb = verb
        self.shown = shown
        """The Event is there all the same, its count alone not raised (read with no count): ``kubectl describe``
        shows the report, and it is counted sent (it was counted failed, an alert on Events lost for one shown)."""


class _Direct:
    """Requests (POST, PATCH) over one kept-alive connection (``webhook.http1``) to the server of a ``kubernetes``
    client configuration, with its TLS settings (CA file or data, client certificate, ``verify_ssl``) and socket
    options (TCP keepalive: ``api_client_from_environment``); None from ``of`` when the configuration asks for what
    only the client's own path does (a proxy, a TLS server name or host name of its own). One per sending thread
    (``ApiSink._here``): a connection carries one request at a time."""

    def __init__(self, configuration: Any, timeout: float) -> None:
        url = urlsplit(configuration.host)
        https = url.scheme == "https"
        self.address = url.hostname or "localhost"
        self.port = url.port or (443 if https else 80)
        self.prefix = url.path.rstrip("/")  # a server behind a path (a proxy to many clusters)
        self.timeout = timeout
        self.configuration = configuration
        self.tls: ssl.SSLContext | None = None
        self.files: tuple[float, ...] = ()
        """When the CA and client certificate files were last changed, as ``tls`` read them."""
        if https:
            self.tls, self.files = http1.tls_context(configuration), self._stamps()
        self.connection: http1.Connection | None = None

    def _stamps(self) -> tuple[float, ...]:
        c = self.configuration
        stamps = []
        for path in (c.ssl_ca_cert, c.cert_file, c.key_file):
            try:
                stamps.append(os.stat(path).st_mtime if path else 0.0)
            except OSError:
                stamps.append(-1.0)
        return tuple(stamps)

    def _fresh_tls(self) -> ssl.SSLContext | None:
        """``tls``, read again when its files changed (the cluster's CA rotated: the kubelet rewrites the mounted
        ca.crt), so that a new connection trusts what the files say now. A file that cannot be read keeps the
        context there is."""
        if self.tls is None or (stamps := self._stamps()) == self.files:
            return self.tls
        try:
            self.tls = http1.tls_context(self.configuration)
        except http1.UnreadableTLS as err:
            log.warning("cannot read the API server's TLS files again (%s): the ones read before stay", err)
        self.files = stamps
        return self.tls

    @classmethod
    def of(cls, configuration: Any, timeout: float) -> _Direct | None:
        if configuration.host.split("://", 1)[0] not in ("http", "https"):
            return None
        if configuration.proxy or configuration.tls_server_name:
            return None
        if configuration.assert_hostname is not None:
            return None
        return cls(configuration, timeout)

    def apart(self) -> _Direct:
        """The same server and TLS settings, with a connection of its own (one per sending thread)."""
        twin = copy.copy(self)
        twin.connection = None
        return twin

    def request(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, str, bytes, dict[bytes, bytes]]:
        """(status, reason, body, header fields). A failed connection is closed, and the next request opens a new
        one (a kept-alive connection the server closed meanwhile fails as the request goes out, ``http1.Stale``:
        ``ApiSink.send`` sends it again at once)."""
        if self.connection is None or not self.connection.open:  # a new connection: with the TLS files as they are
            options = self.configuration.socket_options
            self.connection = http1.Connection(self.address, self.port, self._fresh_tls(), self.timeout, options)
        status, reason, data = self.connection.request(method, self.prefix + path, body, headers)
        return status, reason, data, self.connection.head


@dataclass(frozen=True)
class _Server:
    """An API client and how its server is reached, made together and swapped in together (``ApiSink._use``): each
    request reads one (``ApiSink._request``), so that its connection and its credentials are of the same client.
    Set one by one, a request made while a kubeconfig rewritten to another server was loaded took the old server's
    connection and the new one's token (the TLS context took milliseconds to make), and sent one server's bearer
    token to the other (found by a review)."""

    client: Any
    host: str
    """The server's URL, read once: the configuration's ``host`` property is recomputed on every read."""
    direct: _Direct | None
    """How this configuration is reached without the client; each sending thread uses a copy (``ApiSink._here``)."""

    def headers(self, content_type: str | None) -> dict[str, str]:
        headers = {**self.client.default_headers, "Accept": JSON_TYPE}
        if content_type:
            headers["Content-Type"] = content_type
        for auth in self.client.configuration.auth_settings().values():
            if auth.get("in") == "header" and auth.get("value"):
                headers[auth["key"]] = auth["value"]
        return headers


class ApiSink:
    """Creates core v1 Events (``POST .../events``) as the ``kubernetes`` client's configuration says: its server,
    its TLS settings, its credentials (read per Event through ``Configuration.auth_settings``, which refreshes an
    in-cluster token) and the client's default headers.

    The body is already a plain dict of the API's own shape, and only the answer's status matters, so the request
    goes out on one kept-alive connection (``_Direct``, ``webhook.http1``): the client's own path (``param_serialize``,
    ``call_api``, urllib3's pool) cost about three times the CPU per Event (``docs/benchmarks.md``, 29.), on the cores
    that also answer the reviews, and the generated ``CoreV1Api.create_namespaced_event`` more still (pydantic
    models both ways). A configuration only the client can honour (a proxy, a TLS server name, ...) goes through
    ``call_api``.
    """

    name = "api"
    concurrency = SENDING_AT_ONCE

    def __init__(
        self,
        api_client: Any,
        timeout: float = 5.0,
        attempts: int = 2,
        backoff: float = 0.2,
        remake: Callable[[], Any | None] | None = None,
        files: Rewritten | None = None,
        loads: CredentialLoads | None = None,
    ) -> None:
        self.timeout, self.attempts, self.backoff = timeout, attempts, backoff
        self._use(api_client)
        self.remake = remake
        """Makes the client anew where ``files``, those it reads the credentials from, were rewritten, or where the
        API server refused its credentials (a 401, or a 403 to system:anonymous: ``_fresh``); None: the client given
        is kept."""
        self.files = files
        self.loads = loads
        """What ``remake``'s loads share: whether the last hung (``CredentialLoads.hung``)."""
        self._again_at: float | None = None
        """Where a load hung (an exec plugin), when the next Event loads again (once per ``watch.FILES_CHECK_S`` at
        most); None: not. Loaded again only at the next rewrite or refusal, a kubeconfig rewritten to another server
        while its plugin hung left the Events going to the old one for good (found by a review); loaded again, the
        answer the plugin gave at last is taken (``watch.InTime``), and one still hung fails at once."""
        self._refused: str | None = None
        """Why the API server refused the credentials (a 401, a 403 to ``system:anonymous``), where they are to be
        loaded again at the next Event (``_fresh``); None: not."""
        self._refused_at = -math.inf
        """When a refusal last had them loaded again: once per ``CREDENTIALS_RETRY_S`` at most."""
        self._reloading = threading.Lock()
        """Held while the client is made anew (``_fresh``): one load at a time, each installed in the order begun."""
        self._threads = threading.local()
        self._counts = _Counts(REPEATS_KEPT)
        """(namespace, name) -> (count, resourceVersion) of the Events this sink created or whose count it raised."""
        self._told_no_get = False
        """Whether the log said that a read of a count (a GET) was refused (``_read``)."""
        self._log = LogSink()
        """Where an Event goes whose credentials cannot be had in time (``send``)."""
        self._hangs = _OnceAWhile()

    def _use(self, api_client: Any) -> None:
        configuration = api_client.configuration
        self.server = _Server(api_client, configuration.host, _Direct.of(configuration, self.timeout))
        """The client in use and how its server is reached: made whole, then swapped in by one assignment."""

    def _fresh(self) -> None:
        """The client made anew where the API server refused its credentials (``_refused``: a 401, or a 403 to
        system:anonymous; at most once per ``CREDENTIALS_RETRY_S``), or where its kubeconfig was rewritten on disk (a
        Secret's mount, k3s: to a user the RBAC lets create Events, to another server): the one made at start was kept
        for the relay's lifetime, and its Events stayed refused until a restart though the node watch, reading the same
        files, recovered (found by a review). A kubeconfig that cannot be loaded keeps the client there is
        (``api_client_from_environment`` says why). The loads run one at a time (``_reloading``): a slow one (an exec
        plugin) begun first installed its older credentials over those of a newer rewrite loaded meanwhile, kept until
        the next rewrite (found by a review). A thread that did not see the change does not wait on a load: it sends
        with the client there is. A load that hung is tried again at the next Event (``_again_at``)."""
        from webhook.watch import FILES_CHECK_S

        if self.remake is None or self.files is None:
            return
        refused, self._refused = self._refused, None
        again = self._again_at is not None and time.monotonic() >= self._again_at
        if again:
            self._again_at = None  # taken by this thread (as ``_refused`` is)
        if refused is None and not again and not self.files.changed():
            return
        with self._reloading:
            if refused is not None:
                log.info("events: the API server refused the credentials (%s); loading them again", refused)
            elif not again:  # a load that hung, tried again, is said once (``CredentialLoads``)
                log.info("events: %s changed; loading the credentials again", ", ".join(self.files.paths))
            client = self.remake()  # reads the files as they are now: the last load begun reads the newest
            if client is not None:
                self._use(client)
            elif self.loads is not None and self.loads.hung:
                self._again_at = time.monotonic() + FILES_CHECK_S

    def _here(self, server: _Server) -> _Direct | None:
        """This thread's connection to ``server`` (its ``direct``, apart); None for the client's own path. One to the
        server of a client made before or after (``_fresh``) is closed, and one opened to this one's."""
        direct = server.direct
        if direct is None:
            return None
        mine: _Direct | None = getattr(self._threads, "direct", None)
        if mine is not None and mine.configuration is not direct.configuration and mine.connection is not None:
            mine.connection.close()
        if mine is None or mine.configuration is not direct.configuration:
            mine = self._threads.direct = direct.apart()
        return mine

    def _request(
        self, method: str, path: str, where: dict[str, str], payload: JSON | None, content_type: str | None
    ) -> bytes:
        """One request to ``path`` (its ``{namespace}`` and ``{name}`` from ``where``), with ``payload`` as its body
        (None: none, a GET): the answer's body, or an ``ApiException`` with its status (and Retry-After) when it is
        not a success."""
        from kubernetes.client.exceptions import ApiException

        server = self.server  # once: the connection and the credentials of the same client (``_Server``)
        direct = self._here(server)
        if direct is not None:
            url = path.format(**{key: quote(value, safe="") for key, value in where.items()})
            sent = b"" if payload is None else compact_json(payload).encode()
            status, reason, data, head = direct.request(method, url, sent, server.headers(content_type))
            if not 200 <= status <= 299:
                err = ApiException(status=status, reason=reason)
                err.body = data[:4096].decode("utf-8", "replace")  # its Status's message is logged (``_short_error``)
                if b"retry-after" in head:
                    err.headers = {"Retry-After": head[b"retry-after"].decode("latin-1")}
                raise err
            return data
        request = server.client.param_serialize(
            method=method,
            resource_path=path,
            path_params=where,
            header_params={"Accept": JSON_TYPE, **({"Content-Type": content_type} if content_type else {})},
            body=payload,
            auth_settings=["BearerToken"],
            _host=server.host,
        )
        response = server.client.call_api(*request, _request_timeout=self.timeout)
        data = response.read() or b""  # to the end, so that the connection goes back to the pool
        if not 200 <= response.status <= 299:
            raise ApiException.from_response(http_resp=response, body=data.decode("utf-8", "replace"), data=None)
        return bytes(data)

    def _exchange(
        self, method: str, path: str, where: dict[str, str], payload: JSON | None, content_type: str | None
    ) -> bytes | None:
        """``_request``, tried again as a failure calls for: at once on a new connection when a kept-alive one broke
        (``http1.Stale``), after a pause (or the answer's Retry-After) for a status of RETRY_STATUSES or a connection
        error, ``attempts`` tries in all. None: a Conflict (AlreadyExists, or a resourceVersion changed) after a try
        that may have reached the server, which that try may have caused or not (``send`` tells them apart: an Event's
        name is its report's, so a repeat's create meets AlreadyExists whoever made it)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        from webhook.watch import credentials_refused

        attempt, resent = 1, False
        while True:
            try:
                return self._request(method, path, where, payload, content_type)
            except http1.Stale:
                if not resent:  # closed while idle: again at once on a new connection, and not a try of its own
                    resent = True
                    continue
                if attempt >= self.attempts:
                    raise
            except ApiException as err:
                if credentials_refused(err) and time.monotonic() - self._refused_at >= CREDENTIALS_RETRY_S:
                    self._refused, self._refused_at = _short_error(err), time.monotonic()
                if err.status == 409 and (attempt > 1 or resent):  # a try before may have been applied
                    return None
                if err.status not in RETRY_STATUSES or attempt >= self.attempts:
                    raise
                wait = _retry_after(err)
                if wait is not None:  # the apiserver's priority and fairness says when (429): not before
                    time.sleep(wait)
                    attempt += 1
                    continue
            except (HTTPError, OSError, http.client.HTTPException):
                if attempt >= self.attempts:
                    raise
            time.sleep(self.backoff * attempt)
            attempt += 1

    def send(self, body: JSON) -> None:
        """The Event created or its count raised (``_create_or_raise``); where its credentials cannot be had in time
        (``watch.CredentialsHung``: the exec plugin hangs at a token refresh, or is not waited on since one hung), to
        the log, as while the relay awaits credentials (``AwaitingCredentials``), said at most once per FULL_TELL_S:
        it failed, lost, and the relay never went back to logging (found by a review)."""
        from webhook.watch import CredentialsHung

        self._fresh()
        try:
            self._create_or_raise(body)
        except CredentialsHung as err:
            self._to_log(body, err)

    def _to_log(self, body: JSON, err: Exception) -> None:
        self._log.send(body)
        count = self._hangs.count("hung")
        if count is not None:
            more = f" ({count} Events so since the last such line)" if count > 1 else ""
            log.warning("events: %s: the Event goes to the log instead%s", err, more)

    def _create_or_raise(self, body: JSON) -> None:
        """Create the Event; or, where it is there (its name is the report's, ``event_name``: the same report about
        the same object made before, by this relay or another replica's), raise its ``count`` by the body's (1, or the
        repeats the relay read at once: ``Sender.deliver_all``), set its ``lastTimestamp`` to the body's and its
        ``reportingInstance`` to this replica, as client-go's recorder does with a repeat. The count raised is the one
        this sink left it at (``_counts``: the answer to its create or to its last raise), else the one a GET of the
        Event reads (``_read``; a read that writes nothing: it was a patch of ``lastTimestamp`` alone, a write that
        changed the Event under the other replicas raising it at once, a Conflict more for each of them); the patch
        that raises it names the resourceVersion that count was read at, so that a change in between (another replica
        raising it) is a Conflict, and the count is read again (after a random pause from the second on:
        CONFLICT_PAUSE_S). An Event gone meanwhile (its TTL, an hour by default) is created again.

        A write tried again that meets a Conflict (its kept-alive connection closed while idle, as the apiserver does
        after 90 s, its first try answered 500 or timed out, or its connection broke once the apiserver had applied
        it) reads the Event: the first try was applied where the Event is as it would have left it (a create's count,
        firstTimestamp and reportingInstance, ``OWN_FIRST``; a raise's count and reportingInstance, ``OWN_RAISE``), and
        it is sent; else another replica's write came first, and the count is raised. Taken as the first try's doing,
        a create's AlreadyExists dropped a repeat, its count never raised; taken as another's, a raise applied before
        its connection broke was applied again, the count one too high (both found by reviews). A first try applied,
        then another replica's raise, both before the retry reads: the read shows the other's raise, and this one is
        applied again, its N too high (a review's; left, and said in docs/observability.md)."""
        from kubernetes.client.exceptions import ApiException

        meta = as_dict(body.get("metadata"))
        where = {"namespace": as_str(meta.get("namespace")), "name": as_str(meta.get("name"))}
        key = (where["namespace"], where["name"])
        stamp, repeats = body.get("lastTimestamp"), _repeats_in(body)
        known = self._counts.get(key)
        create, conflicts = known is None, 0
        lost: JSON | None = None
        """The fields a write whose answer was lost would have left, had it been applied."""
        for _ in range(REPEAT_TRIES):
            if conflicts > 1:  # the second Conflict: others raise it at once too
                time.sleep(random.uniform(0, CONFLICT_PAUSE_S * 2 ** (conflicts - 2)))
            status = 409
            try:
                if create:
                    made = self._exchange("POST", EVENTS_PATH, {"namespace": where["namespace"]}, body, JSON_TYPE)
                    if made is not None:
                        self._counts.keep(key, _count_of(_event_in(made)))  # its next repeat: one PATCH
                        return
                    create, lost = False, {k: body.get(k) for k in OWN_FIRST}  # made by the first try, or before?
                if known is None:
                    event = _event_in(self._read(where, stamp))
                    known = _count_of(event)
                    if known is None:
                        raise NotRaised(
                            "the Event, read, holds no count (written by other than gpu-admission)", shown=True
                        )
                    if lost is not None and all(event.get(k) == v for k, v in lost.items()):
                        self._counts.keep(key, known)  # the first try of the lost write was applied
                        return
                raised = {
                    "count": known[0] + repeats,
                    "lastTimestamp": stamp,
                    "reportingInstance": body.get("reportingInstance"),
                    "metadata": {"resourceVersion": known[1]},
                }
                answer = self._patch(where, raised)
                if answer is not None:
                    self._counts.keep(key, _count_of(_event_in(answer)))
                    return
                lost = {k: raised[k] for k in OWN_RAISE}  # a Conflict after a retry: applied by the first try?
            except ApiException as err:
                if err.status not in (404, 409) or (create and err.status == 404):
                    raise
                status, lost = err.status, None
            self._counts.keep(key, None)
            # gone: create it; there (AlreadyExists), or changed (a Conflict, after a retry too): read it
            create, known = status == 404, None
            conflicts += status == 409
        raise NotRaised(f"the Event changed {REPEAT_TRIES} times while its count was raised")

    def _read(self, where: dict[str, str], stamp: Any) -> bytes | None:
        """``_exchange`` of a GET of the Event; a failure other than its being gone (404) is ``NotRaised``. A GET
        refused (403: a ClusterRole kept from a release before the read was a GET grants ``create`` and ``patch``
        alone) reads the count as those releases did, from the answer to a patch of ``lastTimestamp`` (a write, a
        Conflict more for the other replicas raising it at once), said once: without it, every repeat a replica did
        not know the count of failed."""
        try:
            return self._on_event("GET", where, None, None)
        except NotRaised as err:
            refused = err.__cause__
            if getattr(refused, "status", None) != 403:
                raise
        if not self._told_no_get:
            self._told_no_get = True
            log.warning(
                "cannot read an Event's count with a get (%s): add the verb get to the core events rule of the "
                "webhook's ClusterRole (verbs: [create, get, patch], as charts/gpu-admission/templates/rbac.yaml "
                "grants; a role kept from an earlier release grants create and patch alone); until then a count is "
                "read with a patch, a write that makes Conflicts for the other replicas raising the same Event",
                _short_error(refused) if isinstance(refused, Exception) else "HTTP 403",
            )
        return self._patch(where, {"lastTimestamp": stamp})

    def _patch(self, where: dict[str, str], payload: JSON) -> bytes | None:
        """``_exchange`` of a merge patch of the Event; a failure other than its being gone (404) or changed (409) is
        ``NotRaised``."""
        return self._on_event("PATCH", where, payload, MERGE_PATCH)

    def _on_event(
        self, method: str, where: dict[str, str], payload: JSON | None, content_type: str | None
    ) -> bytes | None:
        """``_exchange`` on the Event; a failure other than its being gone (404), changed (409) or its credentials not
        had in time (``watch.CredentialsHung``, which ``send`` logs the Event for) is ``NotRaised``: a repeat whose
        token refresh hung was said as a count not raised, and lost (found by a review)."""
        from webhook.watch import CredentialsHung

        try:
            return self._exchange(method, EVENT_PATH, where, payload, content_type)
        except Exception as err:
            if getattr(err, "status", None) in (404, 409) or isinstance(err, CredentialsHung):
                raise
            raise NotRaised(_short_error(err), "get" if method == "GET" else "patch") from err


class _Counts:
    """The count and resourceVersion the API sink left each Event at (``ApiSink.send``), for REPEATS_KEPT Events
    sent once (count 1) and as many that repeat, each part forgetting its least recently sent first; shared by the
    sink's sending threads. On a busy cluster nearly every Event is a new pod's, sent once and never again: kept
    with the rest, 4096 of them pushed out an Event that repeats (a controller retrying a refused ungating every few
    minutes), whose next repeat then cost a create (AlreadyExists), a read and a raise instead of one PATCH (a
    review's finding). Here they push out only each other."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._once: dict[tuple[str, str], tuple[int, str]] = {}
        self._again: dict[tuple[str, str], tuple[int, str]] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> tuple[int, str] | None:
        with self._lock:
            return self._again.get(key) or self._once.get(key)

    def keep(self, key: tuple[str, str], count: tuple[int, str] | None) -> None:
        """Remember the count and resourceVersion an Event was left at, as the most recently sent of its part; None:
        forget it (not known)."""
        with self._lock:
            self._once.pop(key, None)
            self._again.pop(key, None)
            if count is None:
                return
            part = self._again if count[0] > 1 else self._once
            part[key] = count
            if len(part) > self.size:
                del part[next(iter(part))]


def _event_in(answer: bytes | None) -> JSON:
    """The Event in the API server's answer; {} for an answer that holds none (None: ``ApiSink._exchange``)."""
    try:
        event = json.loads(answer) if answer else None
    except ValueError:
        return {}
    return event if isinstance(event, dict) else {}


def _repeats_in(body: JSON) -> int:
    """How many reports an Event body stands for: its ``count`` (more than 1 where the relay read the same Event
    several times at once, ``Sender.deliver_all``)."""
    count = body.get("count")
    return count if isinstance(count, int) and count > 0 else 1


def _count_of(event: JSON) -> tuple[int, str] | None:
    """(count, resourceVersion) of an Event (``_event_in``); None unless it says both."""
    count, version = event.get("count"), as_dict(event.get("metadata")).get("resourceVersion")
    if not isinstance(count, int) or not isinstance(version, str):
        return None
    return count, version


def _merged(bodies: list[JSON]) -> JSON:
    """The bodies of one Event (one name) as one: the first's ``firstTimestamp``, the last's ``lastTimestamp``, and the
    reports of them all as its ``count``."""
    if len(bodies) == 1:
        return bodies[0]
    return {
        **bodies[-1],
        "firstTimestamp": bodies[0].get("firstTimestamp"),
        "count": sum(_repeats_in(body) for body in bodies),
    }


FULL_TELL_S = 60.0
"""How often at most a worker warns that it drops Events at a full pipe, and the relay that Events fail (each
kind of failure), with how many since it last said."""


class _OnceAWhile:
    """Counts what happens, by kind, and says when to tell of it: at the first, then at most once per FULL_TELL_S,
    with how many since the last telling (a line per Event would flood the log)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._told: dict[str, float] = {}
        self._since: dict[str, int] = {}

    def count(self, kind: str, n: int = 1) -> int | None:
        """How many of ``kind`` to tell of now (these ``n`` included); None: not yet."""
        now = time.monotonic()
        with self._lock:
            since = self._since.get(kind, 0) + n
            told = self._told.get(kind)
            if told is not None and now - told < FULL_TELL_S:
                self._since[kind] = since
                return None
            self._since[kind], self._told[kind] = 0, now
            return since


RETRY_AFTER_CAP_S = 5.0
"""The longest an Event's retry waits for a Retry-After (the relay's other Events wait behind it in its thread)."""


def _retry_after(err: Any) -> float | None:
    """The seconds of an answer's Retry-After (whole seconds, as kube-apiserver writes it), at most
    RETRY_AFTER_CAP_S; None when it has none or another form (an HTTP date)."""
    headers = getattr(err, "headers", None) or {}
    text = next((str(v) for k, v in dict(headers).items() if str(k).lower() == "retry-after"), "")
    return min(float(text), RETRY_AFTER_CAP_S) if text.strip().isdigit() else None


class Sender:
    """Sends one Event at a time to a sink, in the calling thread, and counts it: ``counted`` hears ``sent``,
    ``dropped`` or ``failed`` for every Event. The relay uses it as it is (``run_relay``)."""

    def __init__(self, sink: EventSink, counted: Callable[[str], None] | None = None) -> None:
        self.sink = sink
        self.counted = counted or (lambda result: None)
        self.sent = self.dropped = self.failed = 0
        self._counts = threading.Lock()
        self._senders: ThreadPoolExecutor | None = None
        self._failures = _OnceAWhile()
        """Failures by kind (a create's or a count raise's, and an HTTP status or an exception type), for the log."""

    def _count(self, result: str) -> None:
        with self._counts:
            setattr(self, result, getattr(self, result) + 1)
        try:
            self.counted(result)
        except Exception:
            log.exception("cannot count an event as %s", result)

    def deliver_all(self, bodies: list[JSON]) -> None:
        """Send ``bodies`` (what the relay read at once), up to the sink's ``concurrency`` at a time, from as many
        threads (started at the first batch: each keeps its connection); return when every one is sent or failed, and
        counted. A sink that sends one at a time sends in this thread, each body as it is.

        The same Event read several times (a controller's retries, ``event_name``) goes once, its count that many
        (``_merged``): sent each in turn, it cost a PATCH each, and each raise was a moment for another replica's
        raise of it to meet a Conflict."""
        width = int(getattr(self.sink, "concurrency", 1))
        if width <= 1:
            for body in bodies:
                self.deliver(body)
            return
        if self._senders is None:
            self._senders = ThreadPoolExecutor(width, "gpu-adm-events")
        for _ in self._senders.map(lambda run: self.deliver(_merged(run), len(run)), self.runs(bodies)):
            pass

    def runs(self, bodies: list[JSON]) -> list[list[JSON]]:
        """``bodies`` as ``deliver_all`` sends them: each Event's bodies together (one name in one namespace), in the
        order each came first; each body alone for a sink that sends one at a time."""
        if int(getattr(self.sink, "concurrency", 1)) <= 1:
            return [[body] for body in bodies]
        runs: dict[tuple[str, str], list[JSON]] = {}
        for body in bodies:
            meta = as_dict(body.get("metadata"))
            runs.setdefault((as_str(meta.get("namespace")), as_str(meta.get("name"))), []).append(body)
        return list(runs.values())

    def deliver(self, body: JSON, reports: int = 1) -> None:
        """Send one Event now, in the calling thread (the relay's or one of its senders'), and count it ``reports``
        times (the bodies ``_merged`` into it)."""
        failure: Exception | None = None
        try:
            self.sink.send(body)
        except Exception as err:
            failure = err
        shown = isinstance(failure, NotRaised) and failure.shown  # there, its count alone not raised
        for _ in range(reports):
            self._count("sent" if failure is None or shown else "failed")
        if failure is not None:
            self._tell_failed(body, failure)

    def _tell_failed(self, body: JSON, err: Exception) -> None:
        """A warning at the first failure of a kind (a create's or a patch's, an HTTP status, an exception type), then
        at most one per FULL_TELL_S with how many failed so since: an API that refuses (403: no RBAC) or is down fails
        every Event, and a line each would flood the log. A repeat's count not raised names the verb that failed
        (``NotRaised``: a get or a patch): its RBAC is that verb, not ``create``."""
        doing = "raise the count of" if isinstance(err, NotRaised) else "create"
        verb = f" ({err.verb})" if isinstance(err, NotRaised) and err.verb else ""  # a request refused: its RBAC
        cause = err.__cause__ if isinstance(err, NotRaised) and isinstance(err.__cause__, Exception) else err
        count = self._failures.count(f"{doing}{verb} {type(cause).__name__} {getattr(cause, 'status', '')}".strip())
        if count is None:
            return
        involved = as_dict(body.get("involvedObject"))
        happened = "" if isinstance(err, NotRaised) and err.shown else " failed"
        more = f" ({count} Events{happened} so since the last such line)" if count > 1 else ""
        log.warning(
            "cannot %s the %s event on %s/%s%s: %s%s",
            doing,
            body.get("reason"),
            involved.get("namespace"),
            involved.get("name"),
            verb,
            _short_error(cause),
            more,
        )


class EventQueue(Sender):
    """A bounded queue per worker and one daemon thread that drains it into a sink (an app that sends its own Events:
    embedded, tested; ``gpu-admission serve`` hands them to the relay instead).

    The thread starts on the first submit (so never before gunicorn forks), leaves after ``idle`` seconds without
    work, and starts again when needed.

    Woken by an Event, the thread waits ``linger`` seconds before it sends, then sends all that came meanwhile: a
    burst of pod creates wakes it once per ``linger`` instead of once per pod (a wake-up, its context switches and
    its turn at the GIL cost more than a LogSink line), and an Event is ``linger`` late at most. What it takes at once
    goes as the relay sends what it reads at once (``Sender.runs``, in this one thread): the same Event several times
    is one create of that count, or one raise by as many (sent in turn, it was a create and a PATCH per repeat).

    ``maxsize`` bounds the Events waiting, besides the one being sent: those taken to go after it wait too, and each
    frees its slot once it is sent. Freed only once the whole batch was sent, the slots of a burst stayed taken for
    as long as the burst took to send, and the queue dropped the Events that came meanwhile, however fast the API
    took them (a review's finding).
    """

    def __init__(
        self,
        sink: EventSink,
        maxsize: int = 1000,
        counted: Callable[[str], None] | None = None,
        idle: float = 30.0,
        linger: float = 0.05,
    ) -> None:
        super().__init__(sink, counted)
        self.maxsize = max(1, maxsize)
        self.idle, self.linger = idle, linger
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._queue: queue.Queue[JSON] = queue.Queue(self.maxsize)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def send_for(self, review: ReviewRequest | None, result: Result | None, instance: str) -> None:
        """Queue the Events an answer calls for (``events_for``)."""
        for body in events_for(review, result, instance):
            self.submit(body)

    def send_all(self, answers: list[tuple[ReviewRequest | None, Result | None]], instance: str) -> None:
        """Queue the Events of several answers (``audit.Reporter.report``)."""
        for review, result in answers:
            self.send_for(review, result, instance)

    def submit(self, body: JSON) -> bool:
        """Queue one Event; False (and counted as dropped) when the queue is full. Never blocks."""
        if self._pid != os.getpid():
            self._reset()  # a forked child: the parent's thread and queue are not ours
        try:
            if self._queue.unfinished_tasks > self.maxsize:  # taken, not yet sent: they wait too
                raise queue.Full
            self._queue.put_nowait(body)
        except queue.Full:
            self._count("dropped")
            return False
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gpu-admission-events", daemon=True)
                self._thread.start()
        return True

    def _run(self) -> None:
        while True:
            try:
                body = self._queue.get(timeout=self.idle)
            except queue.Empty:
                with self._lock:
                    if self._queue.empty():
                        self._thread = None
                        return
                continue
            if self.linger > 0:
                time.sleep(self.linger)
            batch = [body, *self._waiting()]
            while batch:
                for run in self.runs(batch):
                    try:
                        self.deliver(_merged(run), len(run))
                    finally:  # its slots free now: the rest of the batch may take as long again
                        for _ in run:
                            self._queue.task_done()
                batch = self._waiting()

    def _waiting(self) -> list[JSON]:
        """Every Event queued now, taken off the queue."""
        taken = []
        with contextlib.suppress(queue.Empty):
            while True:
                taken.append(self._queue.get_nowait())
        return taken

    def pending(self) -> int:
        return self._queue.unfinished_tasks

    def drain(self, timeout: float = 5.0) -> bool:
        """Wait until every queued Event was handled (tests, shutdown); False on timeout."""
        deadline = time.monotonic() + timeout
        done = self._queue.all_tasks_done
        with done:
            while self._queue.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                done.wait(left)
        return True


def _line(body: JSON) -> bytes:
    """An Event as the relay's pipe carries it: compact JSON, one line."""
    return compact_json(body).encode() + b"\n"


SHORT_MESSAGE = 200
"""An Event's message is cut to this when its line would not fit in one atomic pipe write."""
MESSAGE_BYTES = max(select.PIPE_BUF - 1400, SHORT_MESSAGE)
"""The bytes an Event's message may take in its line to the relay's pipe (``line_bytes``) for the line to keep to
``select.PIPE_BUF`` and reach the relay whole: the rest of an Event's line takes at most 1,321 bytes (the object's
name, the Event's and the reporting instance at 253 characters, the namespace at 63). A refused ungating's Event is
fitted to it (``pipeline.ungate_event``). Never under ``SHORT_MESSAGE``: where ``PIPE_BUF`` is 512 (macOS, the BSDs)
it came out negative, nothing fitted, and fitting a refused ungating's Event never ended (found by a review)."""


def line_bytes(message: str) -> int:
    """The bytes ``message`` takes in an Event's line to the relay's pipe (``_line``: JSON, each character outside
    ASCII written ``\\uXXXX``, 6 bytes, an emoji 12)."""
    return len(_STRING(message)) - 2


T = TypeVar("T", str, bytes)


def pipe_runs(lines: list[T]) -> Iterator[list[T]]:
    """``lines`` in runs of at most ``select.PIPE_BUF`` bytes together (UTF-8), a longer line alone: Linux writes
    that much to a pipe whole, so the lines of several processes that write a run at a time never interleave."""
    run: list[T] = []
    size = 0
    for line in lines:
        length = len(line) if isinstance(line, bytes) or line.isascii() else len(line.encode())
        if run and size + length > select.PIPE_BUF:
            yield run
            run, size = [], 0
        run.append(line)
        size += length
    if run:
        yield run


class EventPipe:
    """A worker's end of the relay: one JSON line per Event, written to the pipe that ``run_relay`` reads.

    A write of at most ``select.PIPE_BUF`` bytes is written whole or not at all, so the lines of several workers never
    interleave: the lines of a burst (``send_all``) go in writes of whole lines up to that size, and a longer
    line is sent with its message cut. The pipe does not block: when it is full (the relay is behind by a megabyte
    of Events) the Events of that write are dropped and counted."""

    def __init__(self, fd: int, counted: Callable[[str], None] | None = None) -> None:
        self.fd = fd
        self.counted = counted or (lambda result: None)
        self.dropped = 0
        self._told = False
        self._full = _OnceAWhile()

    def send_for(self, review: ReviewRequest | None, result: Result | None, instance: str) -> None:
        """Write the Events an answer calls for, as lines from their templates (``event_lines``)."""
        self.send_all([(review, result)], instance)

    def submit(self, body: JSON) -> bool:
        return self.write(_line(body))

    def send_all(self, answers: list[tuple[ReviewRequest | None, Result | None]], instance: str) -> None:
        """Write the Events of several answers (a burst, ``audit.Reporter.report``) in as few writes as keep each
        one atomic."""
        self.write_lines([line for review, result in answers for line in event_lines(review, result, instance)])

    def write(self, line: bytes) -> bool:
        """Write one Event's JSON line (``event_lines``); False (counted as dropped) when it could not."""
        return self.write_lines([line]) == 1

    def write_lines(self, lines: list[bytes]) -> int:
        """Write ``lines`` in as few writes as keep each one atomic: whole lines, at most ``select.PIPE_BUF`` bytes
        a write (a longer line is sent with its message cut). How many were written; the rest are counted
        dropped."""
        fitting = []
        for line in lines:
            if len(line) > select.PIPE_BUF:
                body = json.loads(line)
                body["message"] = clipped(as_str(body.get("message")), SHORT_MESSAGE)
                line = _line(body)
            if len(line) > select.PIPE_BUF:
                self._dropped(1, ValueError(f"an Event of {len(line)} bytes"))
            else:
                fitting.append(line)
        written = 0
        for run in pipe_runs(fitting):
            try:
                os.write(self.fd, b"".join(run))
                written += len(run)
            except OSError as err:  # full (BlockingIOError), the relay gone (EPIPE)
                self._dropped(len(run), err)
        return written

    def _dropped(self, count: int, err: Exception) -> None:
        self.dropped += count
        for _ in range(count):
            self.counted("dropped")
        if isinstance(err, BlockingIOError):
            self._tell_full(count)
        elif not self._told:
            self._told = True  # once per worker: the count goes on in gpu_admission_events_total{result="dropped"}
            log.error("cannot hand Events to the relay (%s): they are dropped and counted from now on", err)

    def _tell_full(self, count: int) -> None:
        """A warning at the first Event dropped at a full pipe, then at most one per FULL_TELL_S with the count."""
        dropped = self._full.count("full", count)
        if dropped is None:
            return
        log.warning(
            "the Events relay is behind: %d Events dropped (its pipe is full); it runs on what the workers leave of "
            "the cores, so busy cores or a slow apiserver hold it up",
            dropped,
        )


RELAY_NICE = 10
"""The relay's niceness: ``SCHED_IDLE`` ignores it, so it is what holds where the kernel refuses that policy
(``_yield_to_workers``)."""


def _yield_to_workers() -> None:
    """Run on what the workers leave: Linux's ``SCHED_IDLE`` policy (any process may take it), which a waking
    worker preempts at once, and ``nice`` RELAY_NICE besides. An Event may be late, a review may not: at ``nice
    10`` alone, a burst (one per linger) that had a core kept it when a worker woke for a request, and the small
    pod's /validate p99 at one connection was 1.80 ms against 1.52-1.55 with SCHED_IDLE and 1.32-1.35 with no
    Events (``docs/benchmarks.md``, 24.). The price: on cores the workers keep busy all the time, the relay gets
    next to nothing, the pipe fills and Events are dropped, counted (``gpu_admission_events_total``)."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or refused
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    with contextlib.suppress(OSError):
        os.nice(RELAY_NICE)


RELAY_NAME = "gpu-adm-events"
"""The relay's process name (``/proc/<pid>/comm``, ``ps -o comm``), apart from gunicorn's workers."""


def _name_process(name: str) -> None:
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME (Linux)
    except (OSError, AttributeError):
        pass


PIPE_BYTES = 1 << 20
"""The relay pipe's buffer (Linux ``F_SETPIPE_SZ``; the kernel's default, 64 kB, elsewhere): over a thousand Events."""


@dataclass
class Relay:
    """The relay process as the master sees it: the pipe's write end (for the workers) and the process."""

    fd: int
    pid: int

    def finish(self, timeout: float = 5.0) -> bool:
        """Close the master's write end and wait for the relay to send what is left and end (the master's last
        act: as PID 1 in a container, everything left goes with it). False, said in the log, when it was still
        running: what it had not sent is lost."""
        with contextlib.suppress(OSError):
            os.close(self.fd)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if os.waitpid(self.pid, os.WNOHANG)[0]:
                    return True
            except ChildProcessError:  # reaped already (gunicorn reaps any child)
                return True
            time.sleep(0.05)
        log.error(
            "the Events relay was still sending %.0f s after the server stopped: the Events it had not sent are"
            " lost (a slow or unreachable API server; see gpu_admission_events_total)",
            timeout,
        )
        return False


def start_relay(make_sender: Callable[[], Sender]) -> Relay:
    """Fork the relay's keeper (``keep_relaying``); the workers inherit the pipe's write end (gunicorn forks them
    later). Call it before any thread starts. The relay ends when every write end is closed (the master and its
    workers gone), once what they wrote is sent; keeper and relay ignore the signals that stop the master."""
    read_fd, write_fd = os.pipe()
    with contextlib.suppress(ImportError, OSError):
        import fcntl

        fcntl.fcntl(write_fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)

    def keeper() -> int:
        os.close(write_fd)
        _name_process(RELAY_NAME)
        _yield_to_workers()  # the relay inherits it
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        return keep_relaying(read_fd, make_sender)

    pid = _fork(keeper, "the Events relay's keeper")
    os.close(read_fd)
    os.set_blocking(write_fd, False)
    return Relay(write_fd, pid)


def _fork(run: Callable[[], int], what: str) -> int:
    """Run ``run`` in a child process, which exits with its code (1, logged, on an exception); the child's pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = run()
        except BaseException:
            log.exception("%s stopped", what)
        finally:
            os._exit(code)
    return pid


def keep_relaying(read_fd: int, make_sender: Callable[[], Sender], pause: float = 1.0) -> int:
    """Run the relay in a child process, and start it again when it dies before its end (every write end closed):
    a crash, or the kernel killing it for memory, loses the Events it held, not the Events to come. Returns 0
    when the relay ended as it should."""

    def relay() -> int:
        log.info("Events relay started (pid %d)", os.getpid())
        run_relay(read_fd, make_sender())
        return 0

    while True:
        child = _fork(relay, "the Events relay")
        status = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
        if status == 0:
            return 0
        how = f"signal {-status}" if status < 0 else f"exit code {status}"
        log.error("the Events relay (pid %d) ended with %s; starting it again", child, how)
        time.sleep(pause)


RELAY_LINGER_S = 0.01
"""How long the relay waits after each read before the next. Longer means fewer, bigger bursts: a 50 ms linger sent
~75 Events at a time under the bench's load, and each burst showed in the reviews' p99 (5.7-6.2 ms at 4
connections against 4.6-5.2 ms with 10 ms, same run). An Event is this much later at most."""


def run_relay(read_fd: int, events: Sender, linger: float = RELAY_LINGER_S) -> None:
    """Read Event lines from ``read_fd`` until every writer has closed it and send each through ``events``: what one
    read brought, at once (``Sender.deliver_all``: in this thread for the log, from ``SENDING_AT_ONCE`` threads for
    the API, whose round trips would otherwise bound the Events a second).

    After each read it waits ``linger`` before the next, so that the Events of that while gather in the pipe and
    are read at once: woken by every line, the relay took a context switch per Event from the cores the workers run
    on. A full pipe (``PIPE_BYTES``) holds a second of Events at a thousand pods a second; while the sink is slow,
    the pipe fills and the workers drop and count what does not fit."""
    rest = b""
    while chunk := os.read(read_fd, PIPE_BYTES):
        *lines, rest = (rest + chunk).split(b"\n")
        bodies = []
        for line in lines:
            try:
                body = json.loads(line)
            except ValueError:
                log.warning("the Events relay skipped a line that is not JSON (%d bytes)", len(line))
                continue
            if isinstance(body, dict):
                bodies.append(body)
        events.deliver_all(bodies)
        time.sleep(linger)
    os.close(read_fd)


def _short_error(err: Exception) -> str:
    """An Event's failure for the log, as the node watch says its own (``watch.brief``: the API's message, which says
    what a 403 forbade to whom, the cause of a connection's failure first): it said 'HTTP 403 Forbidden' alone, and
    cut a refused connection's cause after its URL."""
    from webhook.watch import brief

    return brief(err)


def instance_name() -> str:
    """``reportingInstance``: the pod's host name (the pod name in a cluster)."""
    return os.environ.get("POD_NAME") or socket.gethostname() or COMPONENT


CREDENTIALS_RETRY_S = 30.0
"""How often at most the Events relay, its Events going to the log for want of credentials that load
(``AwaitingCredentials``), loads them again though no kubeconfig file changed: an in-cluster ca.crt the kubelet
mended, a CA file that a kubeconfig names mended, an exec plugin that answers again. Such a relay was started again
each second instead, with a traceback each time."""


class CredentialLoads:
    """What the relay's loads of its credentials share, at start and while it awaits them (``AwaitingCredentials``):
    the ``InTime`` of each loader (``watch.load_kubeconfig``'s ``in_times``), and what was said of the last that
    failed, so that a reason is said once, and again once it changes."""

    def __init__(self) -> None:
        self.in_times: dict[str, InTime] = {}
        self.said: str | None = None
        self.hung = False
        """The last load failed for an exec plugin that hangs (``CredentialsHung``): ``ApiSink`` loads again at its
        next Event."""

    def say(self, level: int, message: str) -> None:
        """``message`` logged at ``level``, unless it is the one said last."""
        if message != self.said:
            self.said = message
            log.log(level, "%s", message)


def api_client_from_environment(again: bool = False, loads: CredentialLoads | None = None) -> Any | None:
    """A ``kubernetes`` ApiClient from in-cluster credentials, else the kubeconfig, their TLS material read as the
    client will read it (``watch.check_tls``); None where none load: said at INFO where none are found, at WARNING
    where they are found and cannot be loaded (a mistake to mend), each unless ``loads`` said it last
    (``AwaitingCredentials`` loading them again on a timer). ``again``: the kubeconfig is loaded again, rewritten
    (``ApiSink._fresh``), and one that cannot be loaded leaves the client made before in use: said at WARNING (it
    was said at INFO that Events went to the log, which they did not), as is one whose TLS material cannot be read
    (it raised out of making the connection, its Event counted failed, and nothing said why)."""
    from kubernetes import client, config

    from webhook.watch import CredentialsHung, check_tls, kubeconfig_candidates, kubeconfig_paths, load_kubeconfig

    loads = CredentialLoads() if loads is None else loads
    configuration = client.Configuration()
    where = "in-cluster credentials"
    try:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException as missing:  # not in a pod, or no service account token mounted
            found = kubeconfig_paths()  # KUBECONFIG read now, not when the kubernetes package was imported
            kubeconfig = os.pathsep.join(found or kubeconfig_candidates())
            where = f"kubeconfig {kubeconfig}"
            if not found and not again:
                loads.say(
                    logging.INFO,
                    f"no cluster credentials ({missing}; no {where}): events go to the log until one is written",
                )
                return None
            configuration = load_kubeconfig(kubeconfig, loads.in_times)
        check_tls(configuration)
    except Exception as err:
        loads.hung = isinstance(err, CredentialsHung)
        # a hung plugin names its command, TLS material its file: said whole
        why = str(err) if isinstance(err, (CredentialsHung, http1.UnreadableTLS)) else str(err)[:200]
        if again:  # after a rewrite or a refusal (``ApiSink._fresh`` says which); once in a row (found by a review)
            # a hung plugin's load is tried again at the next Event (``ApiSink._fresh``): said so, not "once
            # rewritten", which sent an operator to rewrite the file for nothing (found by a review)
            when = "at the next Event, once a second at most" if loads.hung else "once rewritten or refused"
            loads.say(
                logging.WARNING,
                f"events: the {where} cannot be loaded again ({why}): Events go on with the credentials loaded"
                f" before, and it is loaded again {when}",
            )
        else:  # a mistake to mend, not a cluster without credentials
            loads.say(
                logging.WARNING,
                f"events: {where}: {why}; events go to the log until they load, loaded again every"
                f" {CREDENTIALS_RETRY_S:.0f}s and once a kubeconfig is rewritten",
            )
        return None
    # the relay's connections stay open between Events, idle for hours on a quiet cluster: keepalive keeps a NAT or
    # load balancer from dropping them unseen, and finds one that died before an Event waits on it
    configuration.socket_options = http1.keepalive_options()
    loads.said = None  # loaded: a failure that comes back later is said again (it was not: found by a review)
    loads.hung = False
    return client.ApiClient(configuration)


def _api_sink(loads: CredentialLoads) -> ApiSink | None:
    """An ``ApiSink`` with the client of ``api_client_from_environment`` (``loads``: its), made anew by it where the
    kubeconfig it was loaded from is rewritten on disk, its loads sharing ``loads`` too: each rewrite while the
    plugin hung ran one more plugin and held up the relay in full (found by a review); None where no credentials
    load."""
    from webhook.watch import FILES_CHECK_S, Rewritten, credentials_files

    files = Rewritten(credentials_files(), every=FILES_CHECK_S)  # as they are before the client reads them
    api_client = api_client_from_environment(loads=loads)
    if api_client is None:
        return None
    remake = functools.partial(api_client_from_environment, again=True, loads=loads)
    return ApiSink(api_client, remake=remake, files=files, loads=loads)


class AwaitingCredentials:
    """Where the relay's Events go while no credentials load (none found, or found and not loadable: a kubeconfig
    whose CA is no certificate, an exec plugin that hung, an in-cluster ca.crt that cannot be read): to the log until
    they load, then to the API (``ApiSink``) for good. They are loaded again at the first Event after a kubeconfig
    file changed (``files``: one written where there was none, a Secret mended; looked at once per
    ``watch.FILES_CHECK_S`` at most), or after ``CREDENTIALS_RETRY_S``. Before, a relay that
    found no credentials at start sent its Events to the log for good, a kubeconfig written later unseen, and one
    whose credentials' TLS material could not be read ended and was started again each second, a traceback each.
    While it awaits, its Events are sent from one thread (the log's ``concurrency``), the relay's or the queue's:
    nothing of it runs on the request path.

    Its loads share ``loads`` (``CredentialLoads``) with the load at start (``api_sink_from_environment``). Why they
    fail is said when it is not what was said last: once, and again once it changes (a CA mended, the client key
    still unreadable), where the retries were unsaid once warned (found by a review). And an exec plugin that hung
    holds up one Event once, for ``watch.CREDENTIALS_TIMEOUT_S``, and runs as one process; a load while it still
    runs fails at once, and the first after it answered takes its answer (``watch.InTime``), the kubeconfig as it
    read it. Each load made its own, so each retry ran the plugin again and waited on it in full, the next retry due
    once it gave up: the relay held up 60 s of every 60, and one more plugin left running each minute (found by a
    review)."""

    def __init__(self, files: Rewritten, loads: CredentialLoads | None = None) -> None:
        self.files = files
        self.loads = CredentialLoads() if loads is None else loads
        self.sink: LogSink | ApiSink = LogSink()
        self.name = self.sink.name
        self.concurrency = 1
        self._retry_at = time.monotonic() + CREDENTIALS_RETRY_S

    def send(self, body: JSON) -> None:
        if isinstance(self.sink, LogSink):
            self._load()
        self.sink.send(body)

    def _load(self) -> None:
        rewritten = self.files.changed()
        if not rewritten and time.monotonic() < self._retry_at:
            return
        sink = _api_sink(self.loads)
        self._retry_at = time.monotonic() + CREDENTIALS_RETRY_S  # after the load: it may have waited on a plugin
        if sink is not None:
            log.info("events: the cluster's credentials load now: Events go to the API server %s", sink.server.host)
            self.sink, self.name, self.concurrency = sink, sink.name, sink.concurrency


def api_sink_from_environment() -> EventSink:
    """An ``ApiSink`` from the credentials found (``_api_sink``); where none load, ``AwaitingCredentials``: the
    Events to the log until they do."""
    from webhook.watch import FILES_CHECK_S, Rewritten, kubeconfig_candidates

    files = Rewritten(tuple(kubeconfig_candidates()), every=FILES_CHECK_S)  # before the load: one written meanwhile
    loads = CredentialLoads()
    sink = _api_sink(loads)
    return sink if sink is not None else AwaitingCredentials(files, loads)

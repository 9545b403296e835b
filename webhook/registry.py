"""A GPU container's image config, read from its registry in the background (``cuda.registry``).

Where neither the pod nor the image's name tells a container's CUDA (vLLM, TGI, NIM, a private build ...), its image
usually does: an image built on nvidia/cuda carries ``NVIDIA_REQUIRE_CUDA`` and ``CUDA_VERSION`` in its config's
env, which the NVIDIA runtime reads when the container starts. This module reads that config the way a container
runtime pulls it (the OCI distribution API, distribution-spec v1.1): ``GET /v2/<name>/manifests/<reference>``, the
platform's manifest where that is an index (linux/amd64 first, then linux/arm64), then the config blob, checked
against its digest. Anonymously, with the bearer token a registry's 401 names (Docker Hub, nvcr.io, ghcr.io,
quay.io ...), or with the pull account ``credentialsFile`` gives for the registry; a registry that wants credentials
the settings do not have leaves the image unread (the pods' own pull secrets are not read).

Never on the request path: a review looks images up in one request's ``Snapshot`` (a dict read each). An image not
read yet is queued for this worker's reader threads and reviewed as "CUDA unknown" (the settings' ``unknownVersion``)
until it is read. The answers kept for replicas carry the configs they found (``webhook.decisions``): each replica
looks those images up again, so an answer is given anew once one of its images reads otherwise (another image's
read leaves it be), and a replica of an image due to be read again queues it.

What the registries are spared: the workers of one server share what they read (a directory the server makes); a
tag falls due after ``refreshSeconds`` and is then looked at with a HEAD (Docker Hub counts manifest GETs, not HEADs,
against an address's pull limit), read again only when it names another digest; a failure is tried again after
``retrySeconds`` or the registry's ``Retry-After``, the config read before standing meanwhile. What the cluster is
spared: whoever creates a pod names the host, so an address inside the cluster or the node is read only where the
settings list it, each read has a deadline, and a pod is told only that a registry could not be reached, not how.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import ipaddress
import json
import logging
import math
import os
import queue
import re
import socket
import ssl
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlencode, urljoin, urlsplit

import urllib3
from urllib3.util import parse_url

from webhook import __version__
from webhook.config import RegistrySettings
from webhook.cuda_version import CUDA_VARIABLES, MAX_EXPRESSION
from webhook.cuda_version import DOCKER_HUB as DOCKER_HUB_NAMES

log = logging.getLogger("gpu_admission.registry")

DOCKER_HUB = "registry-1.docker.io"
"""Where Docker Hub's API answers (an image names it docker.io)."""
USER_AGENT = f"gpu-admission/{__version__}"

INDEX_TYPES = frozenset(
    {"application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json"}
)
MANIFEST_TYPES = frozenset(
    {"application/vnd.oci.image.manifest.v1+json", "application/vnd.docker.distribution.manifest.v2+json"}
)
SCHEMA1 = "application/vnd.docker.distribution.manifest.v1"
SCHEMA1_TYPES = frozenset({f"{SCHEMA1}+json", f"{SCHEMA1}+prettyjws"})
ACCEPT = ", ".join([*sorted(INDEX_TYPES), *sorted(MANIFEST_TYPES), *sorted(SCHEMA1_TYPES)])
PLATFORMS = (("linux", "amd64"), ("linux", "arm64"))
"""The platform whose config is read from a multi-platform image, in order (``platform_order``): NVIDIA's own images
set the same CUDA variables on both (their Dockerfiles are one per CUDA release, the platform an argument), but
for the forward-compatibility terms of nvidia/cuda before 12.5.1, which only the amd64 images carry."""

MAX_MANIFEST = 4 << 20
"""The largest manifest read (distribution's own limit for a manifest PUT is 4 MiB)."""
MAX_CONFIG = 8 << 20
"""The largest config blob read (a config with a long history is tens of kB)."""
MAX_REDIRECTS = 3
"""Redirects followed per request (Docker Hub's blobs go to a CDN, registry.k8s.io sends everything to a regional
Artifact Registry)."""
READ_DEADLINE = 4
"""A config's whole read (its requests together) may take this many times ``timeoutSeconds`` (which bounds each
wait for the network)."""
MAX_TOKENS = 1024
"""Bearer tokens kept per worker (one per repository read; a quarter, the oldest, go when it is reached)."""
READERS = 2
"""Reader threads per worker: one slow registry (a timeout) does not hold every other image back."""
MAX_ADDRESSES = 3
"""Addresses of a name tried in turn, where the one before does not take the connection (each within the timeout,
the whole within the read's deadline)."""
RESOLVERS = 4
"""Name lookups of a worker that may wait on the resolver at once (each reader waits at most ``timeoutSeconds``
for its own; a lookup the resolver never answers keeps its thread, and its place here, until the system gives up)."""
QUEUE = 256
"""Images waiting to be read per worker; past it a new one is not queued (and asked again by its next pod)."""
FOREVER = 10 * 365 * 86400.0
"""How long a config read by digest is kept (it cannot change), in seconds."""
PRUNE_EVERY = 64
"""Shared files written between two looks for old ones."""
RESULTS = ("read", "unchanged", "shared", "unreadable", "dropped")
"""How a read ended: read from the registry; unchanged (a HEAD named the digest read before); shared (another
worker's); unreadable; dropped (too many images waiting)."""

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_REPOSITORY = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*\Z")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
_DIGEST = re.compile(r"^sha256:[a-f0-9]{64}\Z")
_HOST = re.compile(r"^[a-z0-9](?:[a-z0-9.-]{0,251}[a-z0-9])?(?::[0-9]{1,5})?\Z")


class Unreadable(Exception):
    """Why an image's config cannot be read, in words for the pod's annotation; ``retry_after``: seconds the
    registry asked to wait (a 429's Retry-After)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class Reference:
    """An image reference as a runtime pulls it: the registry to connect to, the repository, a tag or digest."""

    registry: str
    """host[:port] as the image names it (docker.io for Docker Hub, as a user writes it)."""
    repository: str
    reference: str

    @property
    def host(self) -> str:
        """Where the requests go (Docker Hub's API host for docker.io)."""
        return DOCKER_HUB if self.registry == "docker.io" else self.registry

    @property
    def by_digest(self) -> bool:
        return self.reference.startswith("sha256:")

    def __str__(self) -> str:
        return f"{self.registry}/{self.repository}{'@' if self.by_digest else ':'}{self.reference}"


def parse_reference(image: str) -> Reference:
    """``image`` as the runtime reads it (distribution's reference grammar: Docker Hub's default host and
    ``library/``, the tag ``latest`` when none is given, a digest over a tag); Unreadable when it is not one."""
    name, _, digest = image.strip().partition("@")
    slash, colon = name.rfind("/"), name.rfind(":")
    tag = ""
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, path = first.lower(), rest
    else:
        registry, path = "docker.io", name
    if registry in DOCKER_HUB_NAMES:
        registry = "docker.io"
        if "/" not in path:
            path = f"library/{path}"
    if not _HOST.match(registry):
        raise Unreadable(f"{registry!r} is not a registry host")
    if not _REPOSITORY.match(path) or len(path) > 255:
        raise Unreadable(f"{path[:100]!r} is not a repository name")
    if digest:
        if not _DIGEST.match(digest):
            raise Unreadable(f"{digest[:80]!r} is not a sha256 digest")
        return Reference(registry, path, digest)
    if tag and not _TAG.match(tag):
        raise Unreadable(f"{tag[:80]!r} is not a tag")
    return Reference(registry, path, tag or "latest")


@dataclass(frozen=True)
class ImageConfig:
    """What an image's config says of CUDA, and where it was read; ``error`` says why it could not be."""

    env: Mapping[str, str] = field(default_factory=dict)
    """The config's values of ``CUDA_VARIABLES`` (the others are not kept)."""
    where: str = ""
    """'docker.io/vllm/vllm-openai@sha256:0123456789ab, linux/amd64': the image read, for the pod's words."""
    error: str = ""
    digest: str = ""
    """The manifest (or index) digest its reference named when it was read: a tag's config is read again only when
    a HEAD of the tag names another (Docker Hub counts GETs of manifests against its pull limits, not HEADs)."""
    preferred: str = field(default="", compare=False)
    """The platform read first when it was read ('linux/arm64': ``platform_order``): read again when the cluster's
    GPU nodes prefer another. Not what it says (``where`` names the platform read): not compared."""


def config_env(config: Any) -> dict[str, str]:
    """``CUDA_VARIABLES`` of an image config (``config.Env``: "NAME=value" strings; a later one wins, as in the
    runtime)."""
    env = config.get("config") if isinstance(config, dict) else None
    items = env.get("Env") if isinstance(env, dict) else None
    out: dict[str, str] = {}
    for item in items if isinstance(items, list) else ():
        if isinstance(item, str) and "=" in item:
            name, value = item.split("=", 1)
            if name in CUDA_VARIABLES:  # a value too long to be one is kept too long, for the parser to say so
                out[name] = value[: MAX_EXPRESSION + 1]
    return out


def platform_order(arches: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``PLATFORMS`` in the order a cluster whose GPU nodes have CPU architectures ``arches`` reads them: arm64
    first where every one known is arm64 (GH200, GB200), else amd64 first."""
    known = {arch for arch in arches if arch}
    return (PLATFORMS[1], PLATFORMS[0]) if known == {"arm64"} else PLATFORMS


def choose_platform(index: Any, order: Sequence[tuple[str, str]] = PLATFORMS) -> tuple[str, str]:
    """The digest and platform ('linux/amd64') of an index's manifest to read (``PLATFORMS``' order, else the first
    Linux one that is not an attestation, else the first entry that names no platform)."""
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list):
        raise Unreadable("its index lists no manifests")
    found: dict[tuple[str, str], str] = {}
    unnamed = ""
    for m in manifests:
        platform = m.get("platform") if isinstance(m, dict) else None
        digest = m.get("digest") if isinstance(m, dict) else None
        if not isinstance(digest, str) or not _DIGEST.match(digest):
            continue
        if not isinstance(platform, dict):  # optional in an OCI index
            unnamed = unnamed or digest
            continue
        found.setdefault((str(platform.get("os")), str(platform.get("architecture"))), digest)
    for key in (*order, *(k for k in found if k[0] == "linux")):
        if key in found:
            return found[key], "/".join(key)
    if unnamed:
        return unnamed, ""
    raise Unreadable("its index has no Linux image")


def media_of(body: dict[str, Any], content_type: str) -> str:
    """A manifest's media type: its own ``mediaType``, else the Content-Type it came with, else its shape (an OCI
    manifest need not name its type, and some registries serve it as application/json)."""
    media = body.get("mediaType")
    if isinstance(media, str) and media:
        return media
    media = content_type.split(";", 1)[0].strip()
    if media in INDEX_TYPES or media in MANIFEST_TYPES or media in SCHEMA1_TYPES:
        return media
    if body.get("schemaVersion") == 1:
        return f"{SCHEMA1}+json"
    if isinstance(body.get("manifests"), list):
        return "application/vnd.oci.image.index.v1+json"
    if isinstance(body.get("config"), dict):
        return "application/vnd.oci.image.manifest.v1+json"
    return media


_INSIDE = (".svc", ".local", ".localhost", ".home.arpa")
_NUMERIC = re.compile(r"^(?:0x[0-9a-f]+|[0-9]+)(?:\.(?:0x[0-9a-f]+|[0-9]+)){0,3}\Z")
"""An IPv4 address in any of the forms the resolver takes (127.1, 0177.0.0.1, 0x7f.0.0.1, 2130706433)."""


def inside(host: str) -> bool:
    """``host`` (host[:port]) names the node, the cluster or an address rather than a registry's name: an IP literal
    (in any form the resolver reads), localhost, a name of one label (a Service in the same namespace), a Service's
    name (.svc, .cluster.local) or a name of the local network (.local, .home.arpa). A pod naming such an image would
    have the webhook probe it. Names that only resolve to such addresses are caught when resolved (``Client``)."""
    name = _hostname(host).rstrip(".")
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        pass
    return bool(_NUMERIC.match(name)) or name == "localhost" or "." not in name or name.endswith(_INSIDE)


def _addresses(host: str, wait: float) -> list[str]:
    """``host``'s addresses, looked up by a thread of its own and waited for at most ``wait`` seconds:
    ``socket.getaddrinfo`` has no timeout, and a resolver that does not answer would otherwise hold a reader (and
    the images queued behind it) until the system's resolver gives up. At most ``RESOLVERS`` lookups wait at once."""
    name = _hostname(host).rstrip(".")
    if wait <= 0:
        raise _unreachable(host, OSError("no time was left to resolve its name"))
    if not _RESOLVING.acquire(blocking=False):
        raise _unreachable(host, OSError(f"{RESOLVERS} name lookups are still waiting for the resolver"))
    found: list[list[Any] | Exception] = []
    done = threading.Event()

    def look() -> None:
        try:
            found.append(socket.getaddrinfo(name, None, type=socket.SOCK_STREAM))
        except Exception as err:  # OSError, and UnicodeError for a name IDNA refuses (a label over 63 characters)
            found.append(err)
        finally:
            _RESOLVING.release()
            done.set()

    try:
        threading.Thread(target=look, name="registry-resolve", daemon=True).start()
    except BaseException:
        _RESOLVING.release()
        raise
    if not done.wait(wait):
        raise _unreachable(host, OSError(f"its name was not resolved within {wait:.3g} s"))
    if isinstance(found[0], Exception):
        raise _unreachable(host, found[0]) from found[0]
    addresses = [str(address[0]).split("%", 1)[0] for *_, address in found[0]]
    if not addresses:
        raise _unreachable(host, OSError("its name resolves to no address"))
    return list(dict.fromkeys(addresses))  # each once (one per socket type and protocol), in the resolver's order


def _global(address: str) -> bool:
    """Not loopback, link-local, private, shared (CGNAT) or reserved (an IPv4-mapped IPv6 address as its IPv4)."""
    ip = ipaddress.ip_address(address)
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return (mapped or ip).is_global


def _origin(url: str) -> tuple[str, int]:
    """A URL's host (lower case) and port (the scheme's default where it names none), as urllib3 reads it: the
    request goes where urllib3 reads (``urlsplit`` reads ``https://a.com\\@nvcr.io/`` as nvcr.io, urllib3 as
    a.com); ('', -1) where it reads none."""
    try:
        parts = parse_url(url)
    except urllib3.exceptions.LocationParseError:  # a port that is no number, or past 65535
        return "", -1
    return (parts.host or "").lower(), parts.port or (80 if parts.scheme == "http" else 443)


def _idna(name: str) -> str:
    """``name`` as urllib3 connects to it: a name of other than ASCII letters in its IDNA (xn--) form; '' where it
    has none."""
    if name.isascii():
        return name
    try:
        return name.encode("idna").decode("ascii")
    except UnicodeError:
        return ""


def _hostname(host: str) -> str:
    """host[:port] without its port, lower case."""
    if host.startswith("["):
        return host[1 : host.find("]")].lower()
    return (host.rsplit(":", 1)[0] if host.count(":") == 1 else host).lower()


_RESOLVING = threading.BoundedSemaphore(RESOLVERS)
_DEADLINE = threading.local()
"""The deadline of the read this thread is doing (``Client``), for the connections' watch (``_Watched``)."""
_GUARD = threading.local()
"""``pick``: the address a connection of this thread's read may go to (``Client._pick``), or None; ``fresh``: the
request being asked made a connection of its own (``_Watched._new_conn``)."""


class _Watched:
    """A connection that is cut (its socket shut down) when the read it serves passes its deadline while the
    answer's status line and headers are still arriving: the timeout bounds each wait, not a registry that sends
    them a byte at a time (the body is read against the deadline itself, ``_read``)."""

    sock: Any
    host: str
    port: int
    _dns_host: str

    def _new_conn(self) -> Any:
        """Connect to the address the reader checked (``Client._pick``), not to what a second lookup of the name
        gives: a name that resolves to a public address when checked and to an internal one a moment later (DNS
        rebinding) gets no second lookup. The name stays the connection's ``host`` (urllib3 reads the TLS name and
        the Host header from it, and a connection made again looks the name up again): only the socket goes to the
        address."""
        _GUARD.fresh = True  # this try's connection was made for it (``Client._request`` asks a made one once)
        pick = getattr(_GUARD, "pick", None)
        if pick is None:
            return super()._new_conn()  # type: ignore[misc]
        name = self._dns_host
        addresses = pick(name, self.port)[:MAX_ADDRESSES]
        try:
            for address in addresses[
                :-1
            ]:  # the next where one does not take the connection, as a resolver's user would
                self._dns_host = address
                try:
                    return super()._new_conn()  # type: ignore[misc]
                except (urllib3.exceptions.NewConnectionError, urllib3.exceptions.ConnectTimeoutError):
                    if time.monotonic() >= getattr(_DEADLINE, "at", math.inf):
                        raise
            self._dns_host = addresses[-1]
            return super()._new_conn()  # type: ignore[misc]
        finally:
            self._dns_host = name

    def getresponse(self) -> Any:
        left = getattr(_DEADLINE, "at", math.inf) - time.monotonic()
        if left == math.inf:
            return super().getresponse()  # type: ignore[misc]
        watch = threading.Timer(max(left, 0.0), self._cut)
        watch.daemon = True
        watch.start()
        try:
            return super().getresponse()  # type: ignore[misc]
        finally:
            watch.cancel()

    def _cut(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            self.sock.shutdown(socket.SHUT_RDWR)


class _HTTP(_Watched, urllib3.connection.HTTPConnection):
    pass


class _HTTPS(_Watched, urllib3.connection.HTTPSConnection):
    pass


class _Pool(urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTP


class _TLSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPS


def trust(ca_file: str) -> ssl.SSLContext | None:
    """The TLS context of the reader's connections: the system's CAs and ``ca_file``'s (``cuda.registry.caFile``);
    None (urllib3's own, the system's CAs) without one. OSError or ssl.SSLError where the file is not a PEM bundle
    (``serve`` refuses it at start; a worker that meets it later logs it and trusts the system's)."""
    if not ca_file:
        return None
    context = ssl.create_default_context()
    context.hostname_checks_common_name = False  # as urllib3's own: a certificate names its host in its SANs
    context.load_verify_locations(cafile=ca_file)
    return context


class Client:
    """Reads image configs from registries (see the module docstring); one per worker, used by its readers."""

    def __init__(self, settings: RegistrySettings) -> None:
        self.settings = settings
        timeout = urllib3.Timeout(connect=settings.timeout_seconds, read=settings.timeout_seconds)
        try:
            context = trust(settings.ca_file)
        except (OSError, ssl.SSLError) as err:
            log.warning("cuda.registry.caFile %s: %s; only the system's CAs are trusted", settings.ca_file, err)
            context = None
        self._http = urllib3.PoolManager(
            num_pools=32,
            maxsize=READERS,
            retries=False,
            timeout=timeout,
            headers={"User-Agent": USER_AGENT},
            ssl_context=context,
        )
        self._http.pool_classes_by_scheme = {"http": _Pool, "https": _TLSPool}
        self._tokens: dict[tuple[str, str], tuple[str, float]] = {}
        self._listed = frozenset((*settings.registries, *settings.plain_http))
        self._listed_hosts = frozenset(_hostname(listed) for listed in self._listed)
        self._credentials = Credentials(settings.credentials_file)
        self._ecr = EcrLogins(settings.timeout_seconds, settings.retry_seconds) if settings.ecr else None

    def config(self, ref: Reference, order: Sequence[tuple[str, str]] = PLATFORMS) -> ImageConfig:
        """What ``ref``'s config says of CUDA (a multi-platform image's first platform of ``order`` it has);
        Unreadable when the registry does not give it."""
        deadline = time.monotonic() + READ_DEADLINE * self.settings.timeout_seconds
        body, media, named = self._manifest(ref, ref.reference, deadline)
        platform = ""
        if media in INDEX_TYPES:
            digest, platform = choose_platform(body, order)
            body, media, _ = self._manifest(ref, digest, deadline)
        if media in SCHEMA1_TYPES:  # Docker's first format: the config is the newest history entry's
            history = body.get("history")
            first = history[0] if isinstance(history, list) and history else None
            raw = first.get("v1Compatibility") if isinstance(first, dict) else None
            env = config_env(_json(raw.encode() if isinstance(raw, str) else b"", "its v1 manifest's history"))
            return ImageConfig(env, _where(ref, platform), digest=named)
        if media not in MANIFEST_TYPES:
            raise Unreadable(f"its manifest is of a type not read ({media[:80] or 'none given'})")
        config = body.get("config")
        blob = config.get("digest") if isinstance(config, dict) else None
        if not isinstance(blob, str) or not _DIGEST.match(blob):
            raise Unreadable("its manifest names no sha256 config")
        data = self._get(ref, f"blobs/{blob}", "application/json, */*", MAX_CONFIG, deadline)[0]
        if _sha256(data) != blob:
            raise Unreadable(f"the config blob read is not {blob[:19]}... (its digest differs)")
        return ImageConfig(config_env(_json(data, "its config")), _where(ref, platform), digest=named)

    def digest(self, ref: Reference) -> str:
        """The digest ``ref``'s tag names now (a HEAD of its manifest: ``Docker-Content-Digest``); "" when the
        registry does not say."""
        deadline = time.monotonic() + READ_DEADLINE * self.settings.timeout_seconds
        headers = self._get(ref, f"manifests/{ref.reference}", ACCEPT, 0, deadline, method="HEAD")[1]
        found = headers.get("Docker-Content-Digest", "")
        return found if _DIGEST.match(found) else ""

    def _manifest(self, ref: Reference, reference: str, deadline: float) -> tuple[dict[str, Any], str, str]:
        """The manifest ``reference`` names, its media type and its digest."""
        data, headers = self._get(ref, f"manifests/{reference}", ACCEPT, MAX_MANIFEST, deadline)
        digest = _sha256(data)
        body = _json(data, "its manifest")
        if not isinstance(body, dict):
            raise Unreadable("its manifest is not a JSON object")
        media = media_of(body, headers.get("Content-Type", ""))
        # a signed v1 manifest's digest is its payload's, without the signature: not checked
        if reference.startswith("sha256:") and digest != reference and media not in SCHEMA1_TYPES:
            raise Unreadable(f"the manifest read is not {reference[:19]}... (its digest differs)")
        return body, media, digest

    def _scheme(self, host: str) -> str:
        return "http" if host in self.settings.plain_http else "https"

    def _target(self, url: str, ref: Reference, what: str, base: str = "") -> str:
        """``url`` (a redirect's, relative to ``base``; a token service's) where the reader may go: over HTTPS (or
        as the registry is reached) and not inside the cluster unless listed (or the registry's own host)."""
        try:
            url = urljoin(base, url) if base else url
            parts = urlsplit(url)
        except ValueError as err:  # '[' without its ']', a name that NFKC turns into '@' or '/'
            raise Unreadable(f"{ref.registry} sends the reader to {url[:100]!r} ({what}), not a URL ({err})") from err
        if parts.scheme not in ("https", self._scheme(ref.registry)) or not parts.netloc:
            raise Unreadable(f"{ref.registry} sends the reader to {url[:100]!r} ({what}), not over HTTPS")
        if "@" in parts.netloc or "\\" in url or _origin(url)[0].strip("[]") != _idna(parts.hostname or ""):
            # credentials in the URL, or a URL two parsers read as two hosts (a backslash before an @): the
            # registry's login would go where the checks did not look
            raise Unreadable(f"{ref.registry} sends the reader to {url[:100]!r} ({what}), which names no one host")
        if _hostname(parts.netloc) != _hostname(ref.registry):
            self._outside(parts.netloc, f"{ref.registry} sends the reader ({what}) to {parts.netloc[:100]}, which")
        return url

    def _outside(self, netloc: str, who: str) -> None:
        """Unreadable where ``netloc``'s name says it is inside the cluster, the node or the local network
        (``inside``) and the settings do not list it; what a name resolves to is checked when connecting
        (``_pick``)."""
        if netloc in self._listed:
            return
        if inside(netloc):
            raise Unreadable(
                f"{who} is inside the cluster or the node: read only where registries or plainHttp list it"
            )

    def _pick(self, host: str, port: int) -> list[str]:
        """The addresses a connection to ``host`` may go to, in order: resolved once here (within the timeout) and
        checked: none may be internal unless the settings list the host, on any port (its token service may be on
        another)."""
        left = getattr(_DEADLINE, "at", math.inf) - time.monotonic()
        addresses = _addresses(host, min(self.settings.timeout_seconds, left))
        if host.lower() in self._listed_hosts:
            return addresses
        if address := next((a for a in addresses if not _global(a)), ""):
            raise Unreadable(
                f"{host[:100]} resolves to an address inside the network ({address}): read only where registries or"
                " plainHttp list it"
            )
        return addresses

    def _get(
        self, ref: Reference, path: str, accept: str, limit: int, deadline: float, method: str = "GET"
    ) -> tuple[bytes, Mapping[str, str]]:
        """The body (none for a HEAD) and headers of ``/v2/<repository>/<path>``: a bearer token fetched on a 401
        (once more where a kept one was refused), redirects followed (the Authorization header only to the
        registry itself), the whole within ``deadline``."""
        self._outside(ref.registry, ref.registry)
        url = f"{self._scheme(ref.registry)}://{ref.host}/v2/{ref.repository}/{path}"
        headers = {"Accept": accept}
        token = self._tokens.get((ref.host, ref.repository))
        if token is not None and token[1] > time.monotonic():
            headers["Authorization"] = token[0]
        asked = False  # a token fetched for this request
        hops = 0
        while True:
            response = self._request(url, headers, method, deadline)
            try:
                status = response.status
                if status == 401 and not asked:  # the registry's, or where it redirected to (its own token)
                    challenge = response.headers.get("WWW-Authenticate")
                    headers["Authorization"] = self._authorize(ref, challenge, self._own(url, ref), deadline)
                    asked = True
                    continue
                if status in (301, 302, 303, 307, 308) and hops < MAX_REDIRECTS:
                    hops += 1
                    url = self._target(response.headers.get("Location", ""), ref, "a redirect", base=url)
                    if not self._own(url, ref):
                        headers.pop("Authorization", None)
                        asked = False
                    continue
                if status != 200:
                    used = headers.get("Authorization", "").startswith("Basic ") or self._credentials.get(ref.registry)
                    if status in (401, 403) and self._ecr is not None:
                        self._ecr.forget(ref.registry)  # a login refused is not kept for its 12 hours
                    words = _status_words(status, ref, path, bool(used))
                    raise Unreadable(words, _retry_after(response.headers))
                body = _read(response, limit, path, deadline, urlsplit(url).netloc) if method == "GET" else b""
                return body, response.headers
            finally:
                _done(response)

    def _request(self, url: str, headers: Mapping[str, str], method: str = "GET", deadline: float = math.inf) -> Any:
        _DEADLINE.at, _GUARD.pick = deadline, self._pick
        try:
            for tries_left in range(READERS, -1, -1):
                _GUARD.fresh = False
                try:
                    response = self._http.request(
                        method, url, headers=dict(headers), redirect=False, preload_content=False
                    )
                    break
                except (urllib3.exceptions.ProtocolError, urllib3.exceptions.ReadTimeoutError) as err:
                    # a kept connection the network forgot (a NAT's idle timeout: a reset, or silence): the request
                    # is asked again on another, up to once per kept connection (READERS), while a whole timeout
                    # is left; never after a connection made for it (a slow registry is asked once)
                    left = deadline - time.monotonic()
                    if _GUARD.fresh or not tries_left or left < self.settings.timeout_seconds:
                        raise
                    log.debug("%s: %s; asked again on another connection", urlsplit(url).netloc[:100], _reason(err))
        except urllib3.exceptions.HTTPError as err:
            if time.monotonic() > deadline:
                raise Unreadable(f"{urlsplit(url).netloc[:100]} answered too slowly") from err
            raise _unreachable(urlsplit(url).netloc, err) from err
        finally:
            _DEADLINE.at, _GUARD.pick = math.inf, None
        if time.monotonic() > deadline:  # cut off (``_Watched``): what arrived is not the whole answer
            _done(response)
            raise Unreadable(f"{urlsplit(url).netloc[:100]} answered too slowly")
        return response

    def _own(self, url: str, ref: Reference) -> bool:
        """``url`` is the registry's own (its host and port, as a redirect may write them: ``NVCR.IO:443``)."""
        return _origin(url) == _origin(f"{self._scheme(ref.registry)}://{ref.host}")

    def _authorize(self, ref: Reference, challenge: str | None, own: bool, deadline: float) -> str:
        """The Authorization a 401's ``WWW-Authenticate`` asks for: a pull token from the realm its Bearer challenge
        names (Docker's token protocol; the scope it names and the repository's pull), asked anonymously or with
        the registry's credentials (``credentialsFile``); the credentials themselves where it asks for Basic. Kept
        for its lifetime where the registry itself asked (``own``; a redirect's host gets no credentials).
        Unreadable where it wants credentials the settings do not have."""
        login = self._login(ref.registry) if own else None
        fields = _bearer(challenge or "")
        if fields is None:
            if login is None or "basic" not in (challenge or "").lower():
                raise Unreadable(f"{ref.registry} wants credentials for {ref.repository} (a private image?)")
            self._tokens[(ref.host, ref.repository)] = (login, time.monotonic() + 60)  # a Secret's change within
            return login
        realm = self._target(fields.get("realm", ""), ref, "its token service")
        pull = f"repository:{ref.repository}:pull"
        query = [("scope", scope) for scope in dict.fromkeys((fields.get("scope") or pull, pull))]
        if fields.get("service"):
            query.append(("service", fields["service"]))
        url = realm + ("&" if "?" in realm else "?") + urlencode(query)
        answer = self._token_answer(ref, url, login, deadline)
        if answer is None and login is not None:  # a wrong account: a public image is still read without it
            log.warning("%s's token service refuses the account of credentialsFile; asked anonymously", ref.registry)
            answer = self._token_answer(ref, url, None, deadline)
        if answer is None:
            raise Unreadable(f"{ref.registry}'s token service refuses an anonymous pull of {ref.repository}")
        token = (answer.get("token") or answer.get("access_token")) if isinstance(answer, dict) else None
        if not isinstance(token, str) or not token:
            raise Unreadable(f"{ref.registry}'s token service answered no token")
        lifetime = answer.get("expires_in")
        seconds = lifetime if isinstance(lifetime, int) and lifetime > 0 else 60
        if len(self._tokens) >= MAX_TOKENS:  # the oldest go first (one per repository read)
            for key in list(self._tokens)[: MAX_TOKENS // 4]:
                self._tokens.pop(key, None)  # another reader may have taken it out already
        if own:
            self._tokens[(ref.host, ref.repository)] = (f"Bearer {token}", time.monotonic() + max(seconds - 10, 10))
        return f"Bearer {token}"

    def _login(self, registry: str) -> str | None:
        """The Authorization of ``registry``'s pull account: credentialsFile's, else a private ECR registry's."""
        found = self._credentials.get(registry)
        return found if found is not None or self._ecr is None else self._ecr.get(registry)

    def _token_answer(self, ref: Reference, url: str, login: str | None, deadline: float) -> Any:
        """The token service's answer (JSON); None where it refuses the asker (401, 403); Unreadable otherwise."""
        asked = {"Accept": "application/json", **({"Authorization": login} if login else {})}
        response = self._request(url, asked, deadline=deadline)
        try:
            if response.status in (401, 403):
                return None
            if response.status != 200:
                raise Unreadable(
                    f"{ref.registry}'s token service answered HTTP {response.status} for {ref.repository}",
                    _retry_after(response.headers),
                )
            return _json(_read(response, 1 << 20, "token answer", deadline, urlsplit(url).netloc), "its token answer")
        finally:
            _done(response)


ECR_HOST = re.compile(r"(\d{12})\.dkr\.ecr(-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?")
"""A private Amazon ECR registry: <account>.dkr.ecr[-fips].<region>.amazonaws.com[.cn] (the ECR user guide's
registry address)."""
ECR_EARLY = 3600.0
"""An ECR pull login (valid 12 hours) is asked for again this many seconds before it expires."""
ECR_KEPT = 64
"""ECR logins kept per worker (one per account and region; the oldest go first)."""


class EcrLogins:
    """Pull logins for private Amazon ECR registries: the ECR API's GetAuthorizationToken, called with the webhook's
    own AWS credentials (botocore's chain: EKS Pod Identity, IRSA, the environment, the node's role), each kept until
    an hour before it expires, or until the registry refuses it. One ask at a time, within a deadline (the chain's
    own calls, STS's among them, may wait longer: they are left behind); a failure is kept for ``retry`` seconds.
    botocore (the ``aws`` extra, in the image) is imported at the first ask, and one client made per region."""

    def __init__(self, timeout: float, retry: float) -> None:
        self.timeout, self.retry = timeout, retry
        self._logins: OrderedDict[tuple[str, str, bool], tuple[str | Unreadable, float]] = OrderedDict()
        self._clients: dict[tuple[str, bool], Any] = {}
        self._lock = threading.Lock()
        self._asking = threading.Lock()

    def get(self, registry: str) -> str | None:
        """'Basic <base64>' for ``registry`` where it is an ECR one (None for any other); Unreadable, in words the
        platform engineer can act on, where ECR gives none."""
        found = ECR_HOST.fullmatch(_hostname(registry))
        if found is None:
            return None
        key = (found.group(1), found.group(3), bool(found.group(2)))
        with self._asking:  # two readers missing at once ask once
            with self._lock:
                kept = self._logins.get(key)
            if kept is None or kept[1] <= time.time():
                try:
                    login, until = self._within(registry, key)
                    kept = (login, until - ECR_EARLY)
                except Unreadable as err:
                    kept = (err, time.time() + self.retry)
                with self._lock:
                    self._logins[key] = kept
                    self._logins.move_to_end(key)
                    while len(self._logins) > ECR_KEPT:
                        self._logins.popitem(last=False)
        if isinstance(kept[0], Unreadable):
            raise kept[0]
        return kept[0]

    def forget(self, registry: str) -> None:
        """The registry refused the login (a role changed, its sessions revoked): ask again at the next read."""
        found = ECR_HOST.fullmatch(_hostname(registry))
        if found is not None:
            with self._lock:
                self._logins.pop((found.group(1), found.group(3), bool(found.group(2))), None)

    def _within(self, registry: str, key: tuple[str, str, bool]) -> tuple[str, float]:
        """``_ask`` in a thread of its own, waited for at most ``READ_DEADLINE`` timeouts."""
        answer: list[tuple[str, float] | Unreadable] = []

        def ask() -> None:
            try:
                answer.append(self._ask(registry, *key))
            except Unreadable as err:
                answer.append(err)

        thread = threading.Thread(target=ask, name="registry-ecr-login", daemon=True)
        thread.start()
        thread.join(READ_DEADLINE * self.timeout)
        if not answer:
            log.warning("ECR's login for %s took over %g s (the AWS credentials' chain, or the ECR API)",
                        registry[:100], READ_DEADLINE * self.timeout)  # fmt: skip
            raise Unreadable(f"ECR gave no pull login for {registry[:100]} in time (the webhook's log says why)")
        if isinstance(answer[0], Unreadable):
            raise answer[0]
        return answer[0]

    def _ask(self, registry: str, account: str, region: str, fips: bool) -> tuple[str, float]:
        try:
            import botocore.session
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError, ClientError, CredentialRetrievalError, NoCredentialsError
        except ImportError as err:
            raise Unreadable(
                f"{registry} is a private ECR registry, and reading it needs botocore (the gpu-admission[aws] extra;"
                " the image has it)"
            ) from err
        try:
            client = self._clients.get((region, fips))
            if client is None:
                config = Config(
                    connect_timeout=self.timeout,
                    read_timeout=self.timeout,
                    retries={"total_max_attempts": 1},
                    use_fips_endpoint=fips,
                )
                client = botocore.session.get_session().create_client("ecr", region_name=region, config=config)
                self._clients[(region, fips)] = client
            data = client.get_authorization_token(registryIds=[account])["authorizationData"][0]
            user, _, password = base64.b64decode(data["authorizationToken"]).decode().partition(":")
            return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode(), data["expiresAt"].timestamp()
        except NoCredentialsError as err:
            raise Unreadable(
                f"{registry} is a private ECR registry and the webhook has no AWS credentials: give its service"
                " account an IAM role (EKS Pod Identity or IRSA) allowed ecr:GetAuthorizationToken, ecr:BatchGetImage"
                " and ecr:GetDownloadUrlForLayer"
            ) from err
        except ClientError as err:
            code = str(err.response.get("Error", {}).get("Code", ""))[:80]
            log.warning("ECR's GetAuthorizationToken for %s: %s", registry, err)
            if code.startswith("AccessDenied"):
                raise Unreadable(
                    f"ECR gives the webhook's AWS role no pull login for {registry} ({code}): allow it"
                    " ecr:GetAuthorizationToken"
                ) from err
            raise Unreadable(f"ECR refuses the webhook a pull login for {registry} ({code}; its log says why)") from err
        except (CredentialRetrievalError, OSError) as err:  # the agent, STS, a token file that cannot be read
            log.warning("the webhook's AWS credentials for ECR (%s): %s", registry, err)
            raise Unreadable(
                "the webhook's AWS credentials could not be had (EKS Pod Identity's agent, IRSA's token file or STS:"
                " its log says why)"
            ) from err
        except (BotoCoreError, KeyError, IndexError, ValueError, TypeError, AttributeError) as err:
            raise _unreachable(f"ECR's API in {region}", err) from err


class Credentials:
    """Read credentials by registry host, from a Docker config file (``credentialsFile``), read again when it
    changes (a Secret's update). A file that cannot be read counts as none, and says so in the log once per
    change."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[float, int] | bool | None = False  # never read yet
        self._logins: dict[str, str] = {}
        self._lock = threading.Lock()

    def get(self, registry: str) -> str | None:
        """'Basic <base64>' for ``registry`` (host[:port] as images name it; docker.io for Docker Hub)."""
        if not self.path:
            return None
        with self._lock:
            try:
                stat = os.stat(self.path)
                stamp = (stat.st_mtime, stat.st_size)
            except OSError:
                stamp = None
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._logins = read_credentials(Path(self.path).read_text(encoding="utf-8"))
                except (OSError, ValueError) as err:
                    log.warning("cuda.registry.credentialsFile %s: %s; no credentials are used", self.path, err)
                    self._logins = {}
            return self._logins.get(registry)


def read_credentials(text: str) -> dict[str, str]:
    """'Basic <base64>' by registry host from a Docker config's ``auths`` (keys as ``docker login`` writes them:
    'https://index.docker.io/v1/' is docker.io); ValueError naming what is wrong."""
    data = json.loads(text)
    auths = data.get("auths") if isinstance(data, dict) else None
    if not isinstance(auths, dict) or not auths:
        helpers = isinstance(data, dict) and ("credsStore" in data or "credHelpers" in data)
        why = (
            " (credsStore and credHelpers keep them outside the file: make one with kubectl create secret"
            " docker-registry)"
            if helpers
            else " (a .dockerconfigjson has one)"
        )
        raise ValueError(f"no credentials in 'auths'{why}")
    out: dict[str, str] = {}
    for key, entry in auths.items():
        host = urlsplit(key if "://" in key else f"//{key}").netloc.lower().removesuffix(":443")
        host = "docker.io" if host in DOCKER_HUB_NAMES else host
        if "*" in host:
            raise ValueError(f"auths[{key!r}]: a wildcard is not read (name each registry)")
        if host in out:
            raise ValueError(f"auths[{key!r}]: a second entry for {host} (one account per registry is read)")
        if not isinstance(entry, dict):
            raise ValueError(f"auths[{key!r}] is not a mapping")
        if entry.get("identitytoken") and not entry.get("auth") and not entry.get("password"):
            raise ValueError(
                f"auths[{key!r}]: an identitytoken (az acr login) is not read: give a username and password"
            )
        if isinstance(entry.get("auth"), str) and entry["auth"]:
            pair = base64.b64decode(entry["auth"], validate=True).decode()
        elif isinstance(entry.get("username"), str) and isinstance(entry.get("password"), str):
            pair = f"{entry['username']}:{entry['password']}"
        else:
            raise ValueError(f"auths[{key!r}] has neither auth nor username and password")
        if ":" not in pair:
            raise ValueError(f"auths[{key!r}]: its auth is not user:password")
        out[host] = "Basic " + base64.b64encode(pair.encode()).decode()
    return out


_CHALLENGE = re.compile(r'([A-Za-z_][\w-]*)=(?:"([^"]*)"|([^",\s]*))')


def _bearer(header: str) -> dict[str, str] | None:
    """The parameters of the Bearer challenge among ``header``'s (a registry may offer Basic first); None when it
    offers none."""
    at = re.search(r"(?:^|[\s,])Bearer\s+", header, re.IGNORECASE)
    if at is None:
        return None
    fields: dict[str, str] = {}
    for m in _CHALLENGE.finditer(header, at.end()):
        between = header[at.end() : m.start()]
        if re.search(r"\b(?:Basic|Negotiate|Digest)\b", between, re.IGNORECASE):
            break  # the next challenge's parameters
        fields.setdefault(m.group(1).lower(), m.group(2) if m.group(2) is not None else m.group(3))
    return fields


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """A 429's or 503's ``Retry-After`` in seconds (the date form is not read); None when it gives none."""
    value = headers.get("Retry-After", "").strip()
    return float(min(int(value), 86400)) if value.isdigit() else None


def _unreachable(netloc: str, err: Exception) -> Unreadable:
    """What a pod is told of a registry it cannot reach: which, not how (refused, reset, not TLS: that would
    let whoever names an image map the network from the webhook); the log says how."""
    log.info("cannot reach %s: %s", netloc[:100], _reason(err))
    return Unreadable(f"cannot reach {netloc[:100]} (the webhook's log says why)")


def _where(ref: Reference, platform: str) -> str:
    """'docker.io/vllm/vllm-openai:v0.11.0, linux/amd64' (a digest shown by its first 12 hex digits)."""
    shown = f"{ref.registry}/{ref.repository}@{ref.reference[:19]}" if ref.by_digest else str(ref)
    return f"{shown}, {platform}" if platform else shown


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data)
    except ValueError as err:
        raise Unreadable(f"{what} is not JSON: {err}") from err


def _read(response: Any, limit: int, what: str, deadline: float, host: str) -> bytes:
    """The body, at most ``limit`` bytes, read by what arrives (``read1``) so that a registry that trickles it
    cannot hold the reader past ``deadline``."""
    noun = {"manifests": "manifest", "blobs": "config blob"}.get(what.split("/")[0], what)
    chunks: list[bytes] = []
    size = 0
    try:
        while chunk := response.read1(65536):
            size += len(chunk)
            if size > limit:
                raise Unreadable(f"its {noun} is over {limit >> 20} MiB")
            if time.monotonic() > deadline:
                raise Unreadable(f"its {noun} came too slowly (over {READ_DEADLINE} times the timeout)")
            chunks.append(chunk)
    except (urllib3.exceptions.HTTPError, OSError) as err:
        raise _unreachable(host, err) from err
    return b"".join(chunks)


def _done(response: Any) -> None:
    """Back to the pool when its body was read whole (an answer of 200 within its limit), else closed: an error's
    body is not read, however long a registry makes it."""
    if response.status == 200 and response.isclosed():
        response.release_conn()
    else:
        response.close()
        response.release_conn()


def _reason(err: Exception) -> str:
    text = str(getattr(err, "reason", None) or err)
    return text[:160]


def _status_words(status: int, ref: Reference, path: str, account: bool = False) -> str:
    what = "manifest" if path.startswith("manifests/") else "config blob"
    if (status == 401 or status == 403) and account:
        return (
            f"{ref.registry} refuses the pull account of cuda.registry.credentialsFile for {ref.repository} (HTTP"
            f" {status})"
        )
    if status == 401 or status == 403:
        return f"{ref.registry} refuses an anonymous pull of {ref.repository} (HTTP {status}): a private image?"
    if status == 404:
        return f"{ref.registry} has no {what} for {ref} (HTTP 404)"
    if status == 429:
        return f"{ref.registry} limits the pulls from here (HTTP 429)"
    return f"{ref.registry} answered HTTP {status} for the {what} of {ref}"


# ---------------------------------------------------------------------------------------------------------------
# What a worker knows, and its readers


@dataclass(frozen=True)
class Known:
    config: ImageConfig
    until: float
    """When it is read again (monotonic seconds)."""


class Reader(Protocol):
    """What reads registries (``Client``; the tests' own)."""

    def config(self, ref: Reference, order: Sequence[tuple[str, str]] = PLATFORMS) -> ImageConfig: ...

    def digest(self, ref: Reference) -> str: ...


Used = tuple[tuple[str, ImageConfig | None], ...]
"""The images an answer looked up, each with what it found: the answer holds while each still finds the same."""


class ImageLookup(Protocol):
    """What a review asks of the image configs (``ImageConfigs``, or one request's ``Snapshot`` of them)."""

    @property
    def used(self) -> Used:
        """The images the answer being given looked up, and what each found (an answer that looked none up holds
        whatever is read later)."""
        ...

    @property
    def waiting(self) -> bool:
        """Whether an image it looked up is not read yet (its answer is not kept)."""
        ...

    def lookup(self, image: str) -> ImageConfig | None: ...

    def holds(self, used: Used) -> bool:
        """Whether each image of ``used`` is still found as it was (an answer kept with them may be given again).
        Each is looked up: one due to be read again is queued, and what was read stands until it is."""
        ...


class Snapshot:
    """One request's view of the configs: each image looked up once (a read that lands meanwhile does not change
    its answer halfway, nor is an image asked twice)."""

    def __init__(self, configs: ImageConfigs) -> None:
        self._configs = configs
        self._seen: dict[str, ImageConfig | None] = {}

    @property
    def used(self) -> Used:
        return tuple(self._seen.items())

    @property
    def waiting(self) -> bool:
        """Whether an image it looked up is not read yet (its answer is not kept: the next replica asks again, so
        an image dropped from a full queue is not forgotten)."""
        return any(config is None for config in self._seen.values())

    def lookup(self, image: str) -> ImageConfig | None:
        if image not in self._seen:
            self._seen[image] = self._configs.lookup(image)
        return self._seen[image]

    def holds(self, used: Used) -> bool:
        return all(self.lookup(image) == config for image, config in used)


class ImageConfigs:
    """The image configs this worker has read, and the threads that read more; ``lookup`` is what a review asks."""

    def __init__(
        self,
        settings: RegistrySettings,
        client: Reader | None = None,
        clock: Callable[[], float] = time.monotonic,
        count: Callable[[str], None] | None = None,
        background: bool = True,
        shared: Path | None = None,
        platforms: Callable[[], Sequence[tuple[str, str]]] = lambda: PLATFORMS,
    ) -> None:
        """``client``: what reads the registries (its ``config`` and ``digest``); ``count``: told each result (the
        metrics); ``background``: False reads in the caller's thread (``gpu-admission review``: no pod waits
        there); ``shared``: a directory the workers of one server share what they read through (each worker
        otherwise reads every image itself); ``platforms``: the order a multi-platform image's configs are read in,
        at each read (``platform_order`` of the cluster's GPU nodes)."""
        self.settings = settings
        self.client = client or Client(settings)
        self._platforms = platforms
        self._clock = clock
        self._known: OrderedDict[str, Known] = OrderedDict()
        self._asked: set[str] = set()
        self._queue: queue.Queue[str] = queue.Queue()
        self._lock = threading.Lock()
        self._readers: list[threading.Thread] = []
        self._pid = 0
        self.counts = dict.fromkeys(RESULTS, 0)
        self._count = count
        self.background = background
        self.shared = shared
        self._writes = 0

    @property
    def used(self) -> Used:
        """Used whole (``gpu-admission review``, tests), not through one request's ``Snapshot``: any image known
        may have been looked up."""
        with self._lock:
            return tuple((image, known.config) for image, known in self._known.items())

    @property
    def waiting(self) -> bool:
        """Whether any image is waiting to be read (used whole: any may be the request's)."""
        return bool(self._asked)

    def holds(self, used: Used) -> bool:
        return all(self.lookup(image) == config for image, config in used)

    def snapshot(self) -> Snapshot:
        """A view for one request (``Snapshot``)."""
        return Snapshot(self)

    def lookup(self, image: str) -> ImageConfig | None:
        """What is known of ``image``'s config (None: nothing yet); one not known, or due to be read again, is
        queued (the known one answers meanwhile)."""
        known = self._known.get(image)
        if known is None or known.until <= self._clock() or self._other_platform(known.config):
            if not self.background:
                return self.read_now(image)
            if known is None and (found := self._shared_get(image)) is not None:
                self._keep(image, *found, "shared")  # another worker read it: one small file, once per worker
                return found[0]
            self._ask(image)
        return known.config if known is not None else None

    def _preferred(self) -> str:
        """The platform the cluster's GPU nodes now read first ('linux/arm64')."""
        return "/".join(self._platforms()[0])

    def _other_platform(self, config: ImageConfig) -> bool:
        """Read for another platform than the cluster's GPU nodes now prefer (``ImageConfig.preferred``)."""
        return bool(config.preferred) and config.preferred != self._preferred()

    def _ask(self, image: str) -> None:
        with self._lock:
            if image in self._asked:
                return
            if len(self._asked) >= QUEUE:
                self._counted("dropped")
                return
            self._asked.add(image)
            self._start()
        self._queue.put(image)

    def _counted(self, result: str) -> None:
        self.counts[result] += 1
        if self._count is not None:
            self._count(result)

    def _start(self) -> None:
        """The readers, in this process (gunicorn forks after the app's import: threads are started here), the
        missing ones only."""
        if self._pid != os.getpid():
            self._pid, self._readers = os.getpid(), []
        self._readers = [t for t in self._readers if t.is_alive()]
        for i in range(len(self._readers), READERS):
            thread = threading.Thread(target=self._run, name=f"gpu-admission-registry-{i}", daemon=True)
            self._readers.append(thread)
            thread.start()

    def _run(self) -> None:
        while True:
            image = self._queue.get()
            try:
                self.read_now(image)
            except Exception:  # never the reader's end: the image is asked again by a later review
                log.exception("reading the config of %r", image[:200])
                with self._lock:
                    self._asked.discard(image)

    def read_now(self, image: str) -> ImageConfig:
        """Read ``image``'s config here and now, and keep it (the readers' work; ``gpu-admission review``'s): what
        another worker read (``shared``), else the registry's answer. A tag read before is read again only where
        a HEAD names another digest; a registry that fails then leaves what it said before in place."""
        settings = self.settings
        found = self._shared_get(image)
        if found is not None:
            self._keep(image, *found, "shared")
            return found[0]
        before = self._known.get(image)
        result = "read"
        try:
            ref = parse_reference(image)
            if settings.registries and ref.registry not in settings.registries:
                raise Unreadable(f"{ref.registry} is not among the registries read (cuda.registry.registries)")
            kept = before.config if before is not None and not self._other_platform(before.config) else None
            if kept is not None and kept.digest and self.client.digest(ref) == kept.digest:
                config, result = kept, "unchanged"
            else:
                config = dataclasses.replace(self.client.config(ref, self._platforms()), preferred=self._preferred())
            seconds = FOREVER if ref.by_digest else settings.refresh_seconds
        except Unreadable as err:
            seconds = max(settings.retry_seconds, err.retry_after or 0)
            config, result = ImageConfig(error=str(err)), "unreadable"
            if before is not None and not before.config.error:
                log.warning("image config of %r: %s; what it said before stands", image[:200], err)
                config = before.config
        except Exception as err:  # a bug: said, logged, and tried again no sooner than a registry's failure
            log.exception("reading the config of %r", image[:200])
            error = f"reading it failed ({type(err).__name__}; see the webhook's log)"
            config, seconds, result = ImageConfig(error=error), settings.retry_seconds, "unreadable"
        self._keep(image, config, self._clock() + seconds, result)
        if not config.error:  # a failure is this worker's own: another's read stands where it has one
            self._shared_put(image, config, seconds)
        return config

    def _keep(self, image: str, config: ImageConfig, until: float, result: str) -> None:
        with self._lock:
            self._known[image] = Known(config, until)  # replaced in place: a lookup meanwhile finds the one or other
            self._known.move_to_end(image)  # forgotten last
            while len(self._known) > self.settings.max_images:
                del self._known[next(iter(self._known))]
            self._counted(result)
            self._asked.discard(image)
        if result != "unchanged":
            words = config.error or ", ".join(f"{k}={v}" for k, v in config.env.items()) or "no CUDA variables"
            whose = " (another worker's)" if result == "shared" else ""
            log.info("image config of %r: %s%s", image[:200], words, whose)

    # -- what the workers of one server share ----------------------------------------------------------------
    def _path(self, image: str) -> Path | None:
        return self.shared / f"{hashlib.sha256(image.encode()).hexdigest()[:40]}.json" if self.shared else None

    def _shared_get(self, image: str) -> tuple[ImageConfig, float] | None:
        """What another worker read of ``image`` and until when (in this worker's clock), while it holds."""
        path = self._path(image)
        if path is None:
            return None
        try:
            data = json.loads(path.read_bytes())
            left = float(data["until"]) - time.time()
            env = data["env"]
            if data["image"] != image or left <= 0 or not isinstance(env, dict):
                return None
            config = ImageConfig(
                {k: v for k, v in env.items() if k in CUDA_VARIABLES and isinstance(v, str)},
                str(data["where"]),
                str(data["error"]),
                str(data["digest"]),
                str(data.get("preferred", "")),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if self._other_platform(config):  # read by a worker whose cluster view preferred another
            return None
        return config, self._clock() + left

    def _shared_put(self, image: str, config: ImageConfig, seconds: float) -> None:
        path = self._path(image)
        if path is None:
            return
        record = {**dataclasses.asdict(config), "image": image, "until": time.time() + min(seconds, FOREVER)}
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        try:
            temporary.write_text(json.dumps(record))
            os.replace(temporary, path)  # whole or not at all, for the other workers
        except OSError as err:
            log.warning("cannot share the image config of %r with the other workers: %s", image[:200], err)
        self._writes += 1
        if self._writes % PRUNE_EVERY == 0:
            self._prune()

    def _prune(self) -> None:
        """Files not written for longer than a tag is kept (a digest's is read again when next asked), and past
        ``maxImages`` the oldest; a temporary file a worker left (killed between its write and its rename)."""
        assert self.shared is not None
        now = time.time()
        oldest = now - max(self.settings.refresh_seconds, self.settings.retry_seconds)
        kept: list[tuple[float, Path]] = []
        for path in self.shared.iterdir():
            with contextlib.suppress(OSError):
                written = path.stat().st_mtime
                if written < oldest or (path.name.startswith(".") and written < now - 60):
                    path.unlink()
                elif not path.name.startswith("."):
                    kept.append((written, path))
        for _, path in sorted(kept)[: max(len(kept) - self.settings.max_images, 0)]:
            with contextlib.suppress(OSError):
                path.unlink()

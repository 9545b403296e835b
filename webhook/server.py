"""gunicorn with the production settings: gthread workers (keep-alive), TLS 1.2+, certificates reloaded from disk.

Each worker builds its own app and cluster source after the fork (threads do not survive a fork), so a live node
watch runs in every worker. The Prometheus metrics endpoint runs in the master and aggregates every worker's
samples (prometheus_client multiprocess mode).

A worker's request threads take turns (``webhook.workers``): one runs Python at a time and the others stand by for
when it must wait for a client; a client silent for ``workers.IO_TIMEOUT_S`` is disconnected.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import shutil
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gunicorn.app.base import BaseApplication

from webhook.cluster import ClusterSource
from webhook.errors import InputError
from webhook.http1 import no_pass_phrase
from webhook.workers import TurnSSLSocket

log = logging.getLogger("gpu_admission.server")

KEPT_ALIVE = 1000
"""Idle kept-alive connections a worker holds besides one per request thread (gunicorn's ``worker_connections`` is
the two added up: it keeps alive at most ``worker_connections - threads``, and accepts no connection past the sum
until one closes)."""
THREADS = 512
"""Request threads per worker (``--threads``): one runs at a time, the others stand by for clients that stall
(``webhook.workers``). A thread is made only when every other one waits for a client, and costs 60-125 kB while it
waits (measured: 900 of them took a worker 64 MB more): so the bound is set for clients that trickle a request (or
its TLS handshake), each holding a thread up to ``workers.REQUEST_DEADLINE_S``, within the pod's memory limit
(two workers: about 70 MB more at the bound). At 16, sixteen such connections held every thread of a worker and a
review waited 10 s behind them, past kube-apiserver's timeout; at 128, 300 of them (anything in the cluster that
can reach the Service) held a review 19 s."""

KEEPALIVE_S = 100
"""How long an idle keep-alive connection is held: longer than kube-apiserver's webhook client keeps one idle (its
transport's IdleConnTimeout, 90 s: k8s.io/apimachinery util/net SetOldTransportDefaults takes
http.DefaultTransport's), so the apiserver is the one that closes it. Were the server first, a review sent as it
closes would fail the call (a POST is not retried), and under failurePolicy Fail the pod create with it."""

SYNC_WAIT_S = 10.0
"""How long a worker waits for its live node watch's first list before it serves: a few of the watch's backoffs
(0.5, 1, 2, 4 s) long, and well inside the chart's startup probe (60 s) and a pod's grace period (a SIGTERM during
the wait takes effect when it ends)."""


def prepare_metrics_dir(prefix: str = "gpu-admission-metrics-") -> str:
    """The prometheus_client multiprocess directory (``PROMETHEUS_MULTIPROC_DIR``, made when unset), created.

    Call it before anything imports prometheus_client: the library picks multiprocess mode at its first import."""
    path = os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix=prefix))
    os.makedirs(path, exist_ok=True)
    return path


def whole_number(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number of at least ``low`` (and at most ``high``), else an error naming the
    range and what was given (``--workers 0`` would start a master that serves nothing)."""
    wanted = f"from {low} to {high}" if high is not None else f"of {low} or more"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be a whole number {wanted} (got {text!r})")
        return value

    return parse


PORT = whole_number(1, 65535)


def listen_addresses(host: str) -> list[str]:
    """``[host]``, or for '' every address: '::' where an IPv6 socket also takes IPv4 connections (Linux's default,
    ``net.ipv6.bindv6only`` 0: an IPv6-only cluster reaches the pod by its IPv6 address, a dual-stack or IPv4 one by
    its IPv4 address); '0.0.0.0' and '::' where IPv6 sockets take IPv6 alone; '0.0.0.0' without IPv6."""
    if host:
        return [host]
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::", 0))
            if probe.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY):
                return ["0.0.0.0", "::"]
    except OSError:
        return ["0.0.0.0"]
    return ["::"]


def _address(host: str, port: int) -> str:
    """host:port, an IPv6 address in brackets (as gunicorn's bind and a URL write it)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class ServeOptions:
    cert: str
    key: str
    port: int = 8443
    metrics_port: int = 9090
    workers: int = 2
    threads: int = THREADS
    host: str = ""
    """The address both ports listen on; '' for every address (``listen_addresses``)."""
    graceful_timeout: int = 25

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser, port: int, metrics_port: int, host: str = "") -> None:
        """The serving flags of ``gpu-admission serve`` and of the bench's baseline (``--cert`` and ``--key`` are
        each one's own): --port, --metrics-port, --workers, --threads, --host, --graceful-timeout."""
        parser.add_argument("--port", type=PORT, default=port, help="HTTPS port of the webhook (default %(default)s)")
        parser.add_argument(
            "--metrics-port",
            type=PORT,
            default=metrics_port,
            help="plain-HTTP port of /metrics (default %(default)s)",
        )
        parser.add_argument(
            "--workers",
            type=whole_number(1),
            default=cls.workers,
            help="gunicorn worker processes (default %(default)s)",
        )
        parser.add_argument(
            "--threads",
            type=whole_number(1),
            default=cls.threads,
            help="request threads per worker, taking turns (default %(default)s)",
        )
        parser.add_argument(
            "--host",
            type=lambda text: text.strip().removeprefix("[").removesuffix("]"),
            default=host,
            help="address both ports listen on: an IPv4 or IPv6 address (:: is every IPv6 and IPv4 one), or a name;"
            " by default every address, over IPv6 and IPv4 where the kernel has IPv6 (an IPv6-only cluster's"
            " kubelet and API server reach the pod by its IPv6 address), else 0.0.0.0",
        )
        parser.add_argument(
            "--graceful-timeout",
            type=whole_number(1),
            default=cls.graceful_timeout,
            help="seconds the workers get to finish their requests after SIGTERM (the chart: the pod's grace period "
            "less its preStop sleep and 2 s; default %(default)s)",
        )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeOptions:
        """From the flags ``add_arguments`` adds, and --cert and --key. Both ports listen on the same addresses
        (--host): one port for both was accepted, /metrics failed to bind and the log went on to say it was served
        there (found by a review); InputError."""
        if args.metrics_port == args.port:
            raise InputError(
                f"--metrics-port {args.metrics_port} is also --port, the webhook's, on the same addresses (--host):"
                " give /metrics a port of its own"
            )
        return cls(
            cert=args.cert,
            key=args.key,
            port=args.port,
            metrics_port=args.metrics_port,
            workers=args.workers,
            threads=args.threads,
            host=args.host,
            graceful_timeout=args.graceful_timeout,
        )


EXPIRY_WARNING_DAYS = 14
"""The served certificate expiring within this many days is logged (the chart renews 30 days before, daily)."""


def _not_after(path: str) -> float | None:
    """Unix time the first certificate of the PEM file ``path`` expires; None where it cannot be read."""
    from certs.issue import load_certificates

    try:
        with open(path, "rb") as f:
            found = load_certificates(f.read())
    except OSError:
        return None
    return found[0].not_valid_after_utc.timestamp() if found else None


def server_context(cert: str, key: str) -> ssl.SSLContext:
    """The TLS context served from the PEM files ``cert`` and ``key``; ssl.SSLError where they do not make a pair
    (``[X509: KEY_VALUES_MISMATCH]``) or are not PEM, OSError where they cannot be read, ``http1.UnreadableTLS``
    (a ValueError) at once where the key is encrypted."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(
        certfile=cert, keyfile=key, password=no_pass_phrase(f"--key ({key})", "the webhook", "--key")
    )
    context.set_alpn_protocols(["http/1.1"])
    context.sslsocket_class = TurnSSLSocket
    return context


class ReloadingTLS:
    """One SSL context per worker, rebuilt when the certificate or key file changes on disk.

    gunicorn asks for a context on every new connection; building one (load_cert_chain) on each would cost a
    millisecond or more, so it is cached and the files are checked at most once a second. A file caught half-written
    keeps the previous context until the next check. A worker that has no context (its files could not be read since
    it started: removed, or not a certificate and its key) closes each connection at once, logs why once a check,
    and says so in ``gpu_admission_serving_certificate_loaded``.
    """

    CHECK_EVERY = 1.0

    def __init__(self, cert: str, key: str) -> None:
        self.cert, self.key = cert, key
        self._lock = threading.Lock()
        self._stamp: tuple[float, float] = (0.0, 0.0)
        self._checked = -math.inf
        self._context: ssl.SSLContext | None = None
        self.not_after: float | None = None
        """Unix time the served certificate expires (None: its file could not be read as PEM)."""
        self._told = -math.inf

    def _mtimes(self) -> tuple[float, float]:
        return os.stat(self.cert).st_mtime_ns, os.stat(self.key).st_mtime_ns

    def build(self) -> ssl.SSLContext:
        context = server_context(self.cert, self.key)
        self.not_after = _not_after(self.cert)
        from webhook import metrics

        metrics.serving_certificate(self.not_after)
        return context

    def _tell_expiry(self) -> None:
        """Warn (once an hour a worker) while the served certificate expires within ``EXPIRY_WARNING_DAYS`` or has:
        its renewal (the chart's CronJob, cert-manager) is not happening, and the API server will soon refuse every
        call (under failurePolicy Fail, every GPU pod)."""
        if self.not_after is None or time.monotonic() - self._told < 3600:
            return
        days = (self.not_after - time.time()) / 86400
        if days > EXPIRY_WARNING_DAYS:
            return
        self._told = time.monotonic()
        if days <= 0:
            log.error(
                "the serving certificate %s expired %.1f days ago: renew it (see docs/certificates.md)",
                self.cert,
                -days,
            )
        else:
            log.warning(
                "the serving certificate %s expires in %.1f days and has not been renewed: is its renewal failing?"
                " (see docs/certificates.md)",
                self.cert,
                days,
            )

    def check(self) -> None:
        """Load the files again if they changed (or none is loaded yet), at most once every ``CHECK_EVERY``; a
        failure is logged, never raised."""
        if time.monotonic() - self._checked < self.CHECK_EVERY:
            return
        with self._lock:
            if time.monotonic() - self._checked < self.CHECK_EVERY:
                return  # another thread checked meanwhile
            self._checked = time.monotonic()
            try:
                stamp = self._mtimes()
                if self._context is None or stamp != self._stamp:
                    self._context = self.build()
                    if self._stamp != (0.0, 0.0):
                        log.info("serving certificate reloaded from %s", self.cert)
                    self._stamp = stamp
            except (OSError, ValueError) as err:  # ssl.SSLError is an OSError; an encrypted key a ValueError
                if self._context is not None:
                    log.warning("certificate files unreadable (%s); keeping the previous certificate", err)
                else:
                    from webhook import metrics

                    metrics.serving_certificate(None, loaded=False)
                    log.warning(
                        "no serving certificate loaded: cannot load %s and %s (%s); every TLS connection to this"
                        " worker is closed until they are a certificate and its key (see docs/certificates.md)",
                        self.cert,
                        self.key,
                        err,
                    )
            self._tell_expiry()

    def context(self) -> ssl.SSLContext:
        self.check()
        context = self._context
        if context is None:  # gunicorn closes the connection on an SSL EOF without a word; check() said why
            raise ssl.SSLEOFError(ssl.SSL_ERROR_EOF, "no serving certificate loaded")
        return context


class Unsynced:
    """The workers of this server that have not listed the nodes yet: a file each, named by its pid, in a directory
    the master makes before it forks. /readyz reads it in every worker, so a worker that is ready does not report
    the pod ready while another one, serving unsynced after ``SYNC_WAIT_S`` (its reviews "not checked"), takes its
    share of the reviews: the kubelet probes one worker, the apiserver's connections reach them all."""

    def __init__(self) -> None:
        self.path = tempfile.mkdtemp(prefix="gpu-admission-workers-")

    def add(self, pid: int) -> None:
        with open(os.path.join(self.path, str(pid)), "w"):
            pass

    def remove(self, pid: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.path, str(pid)))

    def others(self) -> list[int]:
        """The pids of the workers but this one that have not listed yet."""
        try:
            names = os.listdir(self.path)
        except OSError:
            return []
        own = str(os.getpid())
        return sorted(int(name) for name in names if name.isdigit() and name != own)

    def remove_all(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class GunicornServer(BaseApplication):  # type: ignore[misc]
    def __init__(
        self,
        options: ServeOptions,
        app_factory: Callable[[], tuple[Any, ClusterSource]],
        on_exit: Callable[[], object] | None = None,
    ) -> None:
        self.options = options
        self.app_factory = app_factory
        self.on_exit = on_exit
        """Run by the master last, once its workers are gone (the Events relay's finish)."""
        self.tls = ReloadingTLS(options.cert, options.key)
        self.unsynced = Unsynced()
        super().__init__()

    def load_config(self) -> None:
        from webhook import audit

        o = self.options
        tls = self.tls

        def ssl_context(conf: Any, default: Any) -> ssl.SSLContext:
            return tls.context()

        hosts = listen_addresses(o.host)
        binds = [_address(host, o.port) for host in hosts]

        def when_ready(server: Any) -> None:
            served = audit.start_metrics_server(o.metrics_port, hosts)  # the same interfaces as the webhook itself
            log.info(
                "serving on https://%s with %d workers of %d threads; %s",
                " and https://".join(binds),
                o.workers,
                o.threads,
                # only where it listens: a port taken (its error logged above) was said to serve metrics
                "metrics on http://" + " and http://".join(_address(host, o.metrics_port) for host in served)
                if served
                else "metrics not served (see above)",
            )

        def child_exit(server: Any, worker: Any) -> None:
            audit.worker_exited(worker.pid)
            self.unsynced.remove(worker.pid)  # one that died before its first list

        def on_exit(server: Any) -> None:
            self.unsynced.remove_all()
            if self.on_exit is not None:
                self.on_exit()

        settings = {
            "bind": binds,
            "workers": o.workers,
            "worker_class": "webhook.workers.TurnWorker",
            "threads": o.threads,
            "worker_connections": o.threads + KEPT_ALIVE,
            "keepalive": KEEPALIVE_S,
            "timeout": 30,
            "graceful_timeout": o.graceful_timeout,
            "certfile": o.cert,
            "keyfile": o.key,
            "ssl_context": ssl_context,
            "when_ready": when_ready,
            "child_exit": child_exit,
            "on_exit": on_exit,
            "accesslog": None,
            "errorlog": "-",
            "loglevel": "info",
            "worker_tmp_dir": tempfile.gettempdir(),
            "control_socket_disable": True,
            "limit_request_line": 8190,
        }
        for key, value in settings.items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self) -> Any:
        """In each worker, after the fork: the app, its TLS context (``ReloadingTLS``: it sets the certificate's
        gauges, which were missing after a worker's start until its first connection; found by a review), and
        its cluster source started. A live watch's worker waits for its first list (up to ``SYNC_WAIT_S``) before it
        takes connections: the master's socket is shared, so a worker that took them at once (started beside one
        already synced, or restarted) would answer "not checked" to the reviews it got meanwhile, and /readyz from
        another worker could already say ready."""
        app, cluster = self.app_factory()
        pid = os.getpid()
        self.tls.check()  # now, not at the first connection: the certificate's gauges are there from the start
        self.unsynced.add(pid)
        if (runtime := app.extensions.get("gpu_admission")) is not None:  # not the bench's no-op app
            runtime.unsynced_workers = self.unsynced.others
        cluster.start()
        if cluster.wait_ready(SYNC_WAIT_S):
            self.unsynced.remove(pid)
        else:
            log.warning(
                "cluster: no node list after %.0f s; serving anyway (CUDA checks say 'not checked' and /readyz, "
                "in every worker, reports not ready until the first list succeeds)",
                SYNC_WAIT_S,
            )
            threading.Thread(
                target=self._mark_synced, args=(cluster, pid), name="gpu-admission-synced", daemon=True
            ).start()
        return app

    def _mark_synced(self, cluster: ClusterSource, pid: int) -> None:
        while not cluster.wait_ready(60.0):
            pass
        self.unsynced.remove(pid)

"""Prometheus metrics, correct across gunicorn workers (prometheus_client multiprocess mode).

Each worker counts into its own :class:`Metrics`; with ``PROMETHEUS_MULTIPROC_DIR`` set (``gpu-admission serve`` sets
it before gunicorn starts) every value is also written to a per-process file in that directory, and the master's
``/metrics`` endpoint (:func:`start_metrics_server`) adds the files of all workers up. Without the variable (unit tests,
the Flask test client) the values live in the app's own registry only, so two apps in one process never share a count.

Gauges need a rule for combining workers: the node count is the largest any live worker sees, the snapshot timestamp
(when a worker's node view was last known current) the oldest among live workers (so the age shows the stalest), the
serving certificate's (loaded or not, its expiry) the smallest among live workers.
``live*`` modes forget a worker once :func:`worker_exited` has marked it dead.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily

if TYPE_CHECKING:
    from webhook.cluster import ClusterSource

log = logging.getLogger("gpu_admission.metrics")

ENV = "PROMETHEUS_MULTIPROC_DIR"
NAMESPACE = "gpu_admission"
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds. Fine below 10 ms: the webhook answers in a few ms, and the apiserver's own histogram (5, 25, 100 ms
buckets) cannot see that range. Up to the longest webhook timeout the chart allows (30 s), so a slow review is told
apart from one the apiserver gave up on."""
REJECTED = "rejected"
"""The ``decision`` of a request that was no review (a 400, 408, 413 or 415): counted, not timed. A client that
stalls is answered 408 after ``workers.IO_TIMEOUT_S``, and pinned the p99 at the top bucket (found by a review)."""
ENDPOINTS = frozenset({"mutate", "validate"})
AGE = f"{NAMESPACE}_cluster_snapshot_age_seconds"
AGE_HELP = "Seconds since the node view of the worker furthest behind was last known current"
SNAPSHOT_TIME = f"{NAMESPACE}_cluster_snapshot_timestamp_seconds"
UNREADABLE = f"{NAMESPACE}_metrics_files_unreadable"
UNREADABLE_HELP = "Per-process sample files the last scrape could not read, so left out of every sum"
REFRESH_SECONDS = 5.0


def multiprocess_dir() -> str | None:
    return os.environ.get(ENV) or None


def _ensure_value_class() -> None:
    """Make prometheus_client write to files when the multiprocess directory is set.

    prometheus_client picks its value class when it is first imported; ``gpu-admission serve`` imports it (through
    the app) before it sets ``PROMETHEUS_MULTIPROC_DIR``, so the choice is made again here, in the worker, before any
    metric exists. Harmless when the choice was already right.
    """
    if multiprocess_dir() and not getattr(values.ValueClass, "_multiprocess", False):
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


def endpoint_label(endpoint: str) -> str:
    """Bounded label values: the two review endpoints, everything else ``other``."""
    return endpoint if endpoint in ENDPOINTS else "other"


class _SnapshotAge:
    """In-process only: the age of the app's current snapshot, read at scrape time."""

    def __init__(self, cluster: ClusterSource) -> None:
        self.cluster = cluster

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            age = self.cluster.snapshot_age_seconds
        except Exception:  # a scrape never fails because a snapshot cannot be read
            return
        yield GaugeMetricFamily(AGE, AGE_HELP, value=max(age, 0.0))

    def describe(self) -> Iterable[Any]:
        return []


def _events_counter(registry: CollectorRegistry) -> Counter:
    return Counter(
        "events",
        "Events on objects, by result (sent; dropped: the pipe or queue was full, or the relay gone; failed: the API"
        " refused or was away)",
        ["result"],
        namespace=NAMESPACE,
        registry=registry,
    )


_CERT_GAUGES: dict[str, Gauge] = {}
CERT_HELP = {
    "serving_certificate_loaded": "1 while every live worker serves a certificate; 0 while one has none loaded (its"
    " files could not be read since it started), so that every TLS handshake with it fails: alert on 0",
    "serving_certificate_expiry_timestamp_seconds": "Unix time the serving certificate expires (the earliest among"
    " live workers): alert well before it",
}


def _set_certificate_gauge(name: str, value: float) -> None:
    """Set a gauge of ``CERT_HELP`` (the smallest among live workers). Made at the first record, in the worker, so
    that it is written to the multiprocess directory; a gauge made earlier would read 0 in the sums until set."""
    if not multiprocess_dir():
        return  # one process (tests, the Flask test client): no server, no certificate served
    if name not in _CERT_GAUGES:
        _ensure_value_class()
        _CERT_GAUGES[name] = Gauge(
            name, CERT_HELP[name], namespace=NAMESPACE, multiprocess_mode="livemin", registry=None
        )
    _CERT_GAUGES[name].set(value)


def serving_certificate(not_after: float | None, loaded: bool = True) -> None:
    """Record the certificate this worker serves (``ReloadingTLS``): whether it has one loaded, and when it expires
    (None: unknown, or none loaded)."""
    _set_certificate_gauge("serving_certificate_loaded", 1.0 if loaded else 0.0)
    if not_after is not None:
        _set_certificate_gauge("serving_certificate_expiry_timestamp_seconds", not_after)


def event_counter() -> Callable[[str], None]:
    """The Events counter alone, for the Events relay process (it holds no snapshot, so no gauges of its own). Made
    at the first count: the relay starts before the master clears the metrics directory of the last run's files."""
    counter: list[Counter] = []

    def count(result: str) -> None:
        if not counter:
            _ensure_value_class()
            counter.append(_events_counter(CollectorRegistry()))
        counter[0].labels(result).inc()

    return count


class Metrics:
    """The webhook's metrics, in the app's own registry (and, in multiprocess mode, in the worker's files)."""

    def __init__(self, cluster: ClusterSource | None = None) -> None:
        _ensure_value_class()
        self.multiprocess = multiprocess_dir() is not None
        self.cluster = cluster
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "requests",
            f"Admission requests by endpoint and decision (allowed, patched, denied, skipped, {REJECTED}, error)",
            ["endpoint", "decision"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.latency = Histogram(
            "request_duration_seconds",
            "Time from reading the request to the answer, by endpoint (reviews only: a rejected request is not timed)",
            ["endpoint"],
            namespace=NAMESPACE,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.mutations = Counter(
            "mutations",
            "Admitted objects changed, by kind of change: each kind once per request, however many containers",
            ["kind"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.denials = Counter(
            "denials",
            "Policy refusals by endpoint, reason and action (denied: enforced; warned: admitted in warn mode)",
            ["endpoint", "reason", "action"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.reused_answers = Counter(
            "reused_answers",
            "Answers reused from an earlier object of the same shape (replicas of one workload), by endpoint",
            ["endpoint"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.events = _events_counter(r)
        self.image_configs = Counter(
            "image_configs",
            "Image configs read from registries (cuda.registry), by result (read; unchanged: a HEAD named the digest"
            " read before; shared: another worker's; unreadable: no such image, a private one, the registry"
            " unreachable; dropped: too many images waiting to be read)",
            ["result"],
            namespace=NAMESPACE,
            registry=r,
        )
        self.nodes = Gauge(
            "cluster_nodes",
            "Nodes in the cluster snapshot (the largest count any live worker holds)",
            namespace=NAMESPACE,
            multiprocess_mode="livemax",
            registry=r,
        )
        self.snapshot_time = Gauge(
            "cluster_snapshot_timestamp_seconds",
            "Unix time the node view was last known current (the oldest among live workers)",
            namespace=NAMESPACE,
            multiprocess_mode="livemin",
            registry=r,
        )
        for result in ("sent", "dropped", "failed"):
            self.events.labels(result)  # present at 0 from the start, so rate() and alerts see them
        if cluster is not None and not self.multiprocess:
            # In one process the gauges can be read live; set_function is not supported across processes.
            self.nodes.set_function(lambda: float(cluster.snapshot().node_count))
            self.snapshot_time.set_function(lambda: time.time() - cluster.snapshot_age_seconds)
            r.register(_SnapshotAge(cluster))
        self._refresher: threading.Thread | None = None
        self._refresher_pid = 0
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    # -- recording --------------------------------------------------------------------------------------------
    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: prometheus_client checks and locks on every call."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def request(self, endpoint: str, decision: str, seconds: float) -> None:
        label = endpoint_label(endpoint)
        self._child(self.requests, label, decision).inc()
        if decision != REJECTED:
            self._child(self.latency, label).observe(max(seconds, 0.0))

    def reused(self, endpoint: str) -> None:
        self._child(self.reused_answers, endpoint_label(endpoint)).inc()

    def mutation(self, kind: str) -> None:
        self._child(self.mutations, kind).inc()

    def denial(self, endpoint: str, reason: str, action: str) -> None:
        self._child(self.denials, endpoint_label(endpoint), reason or "Unknown", action).inc()

    def image_config(self, result: str) -> None:
        self._child(self.image_configs, result).inc()

    def event(self, result: str) -> None:
        self._child(self.events, result).inc()

    def refresh(self) -> None:
        """Publish the node count and when the node view was last known current (multiprocess mode; in-process
        gauges read live)."""
        if self.cluster is None or not self.multiprocess:
            return
        self.nodes.set(self.cluster.snapshot().node_count)
        self.snapshot_time.set(time.time() - self.cluster.snapshot_age_seconds)

    def start(self, every: float = REFRESH_SECONDS) -> None:
        """Keep the snapshot gauges fresh between requests (multiprocess mode, in the worker, after the fork)."""
        if not self.multiprocess or self.cluster is None:
            return
        if self._refresher is not None and self._refresher.is_alive() and self._refresher_pid == os.getpid():
            return
        self.refresh()

        def run() -> None:
            while True:
                time.sleep(every)
                try:
                    self.refresh()
                except Exception:
                    log.exception("cannot refresh the cluster gauges")

        self._refresher_pid = os.getpid()
        self._refresher = threading.Thread(target=run, name="gpu-admission-gauges", daemon=True)
        self._refresher.start()

    def text(self) -> str:
        """This app's metrics in the Prometheus text format (this process only)."""
        return generate_latest(self.registry).decode()


# -- the master ---------------------------------------------------------------------------------------------------
class MasterCollector:
    """Every worker's samples added up, plus the snapshot age derived at scrape time from the oldest snapshot."""

    def __init__(self, path: str, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.clock = clock
        self.reported: set[str] = set()
        """The unreadable files already logged (once each, not at every scrape)."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client import multiprocess

        files, unreadable = readable_files(self.path)
        for name in unreadable.keys() - self.reported:
            log.warning("metrics: cannot read %s (%s): its samples are left out of /metrics", name, unreadable[name])
        self.reported = set(unreadable)
        families = multiprocess.MultiProcessCollector.merge(files, accumulate=True)  # type: ignore[no-untyped-call]
        yield GaugeMetricFamily(UNREADABLE, UNREADABLE_HELP, value=len(unreadable))
        oldest: float | None = None
        for family in families:
            if family.name == SNAPSHOT_TIME:
                stamps = [s.value for s in family.samples]
                oldest = min(stamps) if stamps else None
            yield family
        if oldest is not None:
            yield GaugeMetricFamily(AGE, AGE_HELP, value=max(self.clock() - oldest, 0.0))

    def describe(self) -> Iterable[Any]:
        return []


def readable_files(path: str) -> tuple[list[str], dict[str, str]]:
    """The sample files of ``path`` that can be added up, and those that cannot, with why.

    prometheus_client's collector reads every file in one go, and a file it cannot read fails the whole scrape (a
    500: ``up`` 0 for every metric). A process creates its file for a metric type at its first sample of that type
    and sizes it afterwards, so the file is empty for a moment, and for good when the process is killed in that
    moment (prometheus/client_python#1199, open in 0.26.0): an empty file holds no sample and is left out. A file
    that cannot be read otherwise (truncated, corrupted) is left out too, its samples missing from the sums while
    it lasts, and counted in ``gpu_admission_metrics_files_unreadable``: better than no metrics at all. A live
    gauge's file removed since the listing (``worker_exited``) is simply gone."""
    from prometheus_client.mmap_dict import MmapedDict

    good: list[str] = []
    bad: dict[str, str] = {}
    for name in sorted(glob.glob(os.path.join(path, "*.db"))):
        try:
            if os.path.getsize(name) == 0:
                continue
            for key, _, _, _ in MmapedDict.read_all_values_from_file(name):  # type: ignore[no-untyped-call]
                json.loads(key)  # as the collector will
        except FileNotFoundError:
            continue
        except (OSError, RuntimeError, ValueError, struct.error) as err:  # a bad key: a ValueError
            bad[name] = str(err) or type(err).__name__
            continue
        good.append(name)
    return good, bad


def clear_directory(path: str) -> int:
    """Remove the previous run's sample files, so counts start at zero (before any worker starts)."""
    removed = 0
    for name in glob.glob(os.path.join(path, "*.db")):
        try:
            os.remove(name)
            removed += 1
        except OSError:
            pass
    return removed


def master_registry(path: str) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(MasterCollector(path))
    return registry


def start_metrics_server(port: int, addrs: Sequence[str] = ("0.0.0.0",)) -> list[str]:
    """Serve ``/metrics`` as plain HTTP on ``port`` of each address, from the gunicorn master, adding up every
    worker's samples; the addresses it listens on.

    Called in the master's ``when_ready``, before the workers are forked: stale files of an earlier run are removed.
    A metrics port that cannot be bound is logged, not fatal: the webhook keeps answering.
    """
    from prometheus_client import start_http_server

    path = multiprocess_dir()
    if path is None:
        log.warning("%s is not set: the metrics endpoint would not see the workers; not started", ENV)
        return []
    os.makedirs(path, exist_ok=True)
    clear_directory(path)
    registry = master_registry(path)
    served = []
    for addr in addrs:
        try:
            start_http_server(port, addr=addr, registry=registry)
        except OSError as err:
            log.error("cannot serve metrics on %s:%d: %s", addr, port, err)
        else:
            served.append(addr)
    return served


def worker_exited(pid: int) -> None:
    """A gunicorn worker died: its live gauges leave the sums (its counters stay, as counters must)."""
    path = multiprocess_dir()
    if path is None:
        return
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid, path)  # type: ignore[no-untyped-call]

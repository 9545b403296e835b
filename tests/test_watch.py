"""The live node watch, with the real ``kubernetes`` client against the in-test API server (tests/kubeapi.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import multiprocessing
import os
import queue
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from tests.kubeapi import CREDENTIAL, EXPIRED, UNREADABLE_TLS, KubeAPI, exec_kubeconfig, with_unreadable_tls
from webhook import watch
from webhook.cluster import build_view
from webhook.config import ClusterSettings, PoolSettings, Settings
from webhook.errors import ConfigError
from webhook.watch import Backoff, LiveCluster, _api_connections, kubeconfig_paths, live_cluster_from_environment

DEADLINE = 10.0


def node(name: str, driver: str = "550.54.15", pool: str = "h100", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "eks.amazonaws.com/nodegroup": pool,
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/cuda.driver-version.full": driver,
                **labels,
            },
        },
        "status": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "8"}},
    }


def wait_for(check: Callable[[], bool], what: str, deadline: float = DEADLINE) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def names(live: LiveCluster) -> set[str]:
    return {n for g in live.snapshot().groups for n in g.nodes}


def drivers(live: LiveCluster) -> dict[str, str]:
    return {n: g.driver_text for g in live.snapshot().groups for n in g.nodes}


def lists(api: KubeAPI) -> int:
    return sum(1 for method, path in api.requests if method == "GET" and "/nodes" in path and "watch=" not in path)


def make_live(
    kubeconfig: str, resync: int = 300, timestamp_labels: list[str] | None = None, **kwargs: Any
) -> LiveCluster:
    cluster = ClusterSettings()
    if timestamp_labels is not None:
        cluster = dataclasses.replace(cluster, timestamp_labels=timestamp_labels)
    settings = Settings(cluster=cluster)
    defaults: dict[str, Any] = {
        "debounce_seconds": 0.05,
        "backoff_initial": 0.05,
        "backoff_max": 0.3,
        "watch_timeout_seconds": 5,
        "connect_timeout": 1.0,
    }
    defaults.update(kwargs)

    def factory() -> Any:  # as the server's: keepalive, and urllib3 asks no answer again (watch._api_connections)
        cfg = k8s_client.Configuration()
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
        _api_connections(cfg)
        return k8s_client.ApiClient(cfg)

    live = LiveCluster(settings, factory, **defaults)
    live.resync_seconds = resync  # the settings take 30 s or more; the tests' relists come each second or two
    return live


@pytest.fixture
def api(tmp_path: Path) -> Iterator[KubeAPI]:
    server = KubeAPI().start()
    yield server
    server.stop()


@pytest.fixture
def kubeconfig(api: KubeAPI, tmp_path: Path) -> str:
    return api.kubeconfig(str(tmp_path / "kubeconfig"))


@pytest.fixture
def live(kubeconfig: str) -> Iterator[LiveCluster]:
    cluster = make_live(kubeconfig)
    yield cluster
    cluster.stop()


def test_lists_then_follows_adds_label_changes_and_deletes(api: KubeAPI, live: LiveCluster) -> None:
    api.put("v1", "nodes", node("a"))
    api.put("v1", "nodes", node("b"))
    assert not live.ready()
    assert not live.snapshot().known
    live.start()
    wait_for(live.ready, "the first list")
    assert names(live) == {"a", "b"}
    assert live.node_count == 2
    api.put("v1", "nodes", node("c"))
    wait_for(lambda: names(live) == {"a", "b", "c"}, "an added node")
    api.put("v1", "nodes", node("b", driver="570.124.06"))
    wait_for(lambda: drivers(live).get("b") == "570.124.06", "a label change")
    assert {g.cuda_text for g in live.snapshot().groups if "b" in g.nodes} == {"12.8"}
    api.delete("v1", "nodes", "a")
    wait_for(lambda: names(live) == {"b", "c"}, "a deleted node")
    assert lists(api) == 1, "events alone must not cause a relist"
    assert live.snapshot_age_seconds < 1


def test_a_node_change_that_no_view_reads_builds_no_snapshot(api: KubeAPI, live: LiveCluster) -> None:
    """Nodes are MODIFIED for their status all the time (conditions, heartbeats, images): a new snapshot for each
    would empty the stores of answers and templates that hang on the one in place, every debounce."""
    api.put("v1", "nodes", node("a"))
    _watching(live, api)
    view, before = live.snapshot(), live.builds
    for beat in range(20):
        heartbeat = node("a")
        heartbeat["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastHeartbeatTime": f"t{beat}"}]
        api.put("v1", "nodes", heartbeat)
    time.sleep(0.5)  # ten debounces
    assert live.builds == before and live.snapshot() is view
    api.put("v1", "nodes", node("a", driver="570.124.06"))
    wait_for(lambda: drivers(live).get("a") == "570.124.06", "a label change")
    assert live.builds == before + 1
    api.drop_watches()  # the watch resumes from the last event's version, the heartbeats' included
    api.put("v1", "nodes", node("b"))
    wait_for(lambda: names(live) == {"a", "b"}, "an added node after the resume")
    assert lists(api) == 1


STAMP = "nvidia.com/gfd.timestamp"


def stamps(live: LiveCluster) -> dict[str, str]:
    return {n: labels.get(STAMP, "") for g in live.snapshot().groups for n, labels in g.node_labels.items()}


def test_a_labellers_timestamp_alone_builds_no_snapshot(api: KubeAPI, live: LiveCluster) -> None:
    """GPU feature discovery writes the time into nvidia.com/gfd.timestamp on every run, each minute on each GPU
    node: a new snapshot for each would empty the stores and, at 10,000 nodes, rebuild (0.13 s of CPU) every
    debounce."""
    api.put("v1", "nodes", node("a", **{STAMP: "1764576000"}))
    _watching(live, api)
    view, before = live.snapshot(), live.builds
    for run in range(1, 11):
        version = api.put("v1", "nodes", node("a", **{STAMP: str(1764576000 + 60 * run)}))["metadata"]
    wait_for(lambda: live._rv == version["resourceVersion"], "the ten relabellings, seen by the watch")
    time.sleep(0.5)  # ten debounces
    assert live.builds == before and live.snapshot() is view
    api.put("v1", "nodes", node("a", driver="570.124.06", **{STAMP: "1764577000"}))  # with another label: a change
    wait_for(lambda: drivers(live).get("a") == "570.124.06", "a label change")
    assert stamps(live) == {"a": "1764577000"}, "the new snapshot holds the node as it is now"
    api.put("v1", "nodes", node("a", driver="570.124.06"))  # the label gone is a change too
    wait_for(lambda: stamps(live) == {"a": ""}, "the timestamp label removed")


def test_timestamp_labels_can_be_set_to_none(api: KubeAPI, kubeconfig: str) -> None:
    live = make_live(kubeconfig, timestamp_labels=[])
    try:
        api.put("v1", "nodes", node("a", **{STAMP: "1764576000"}))
        live.start()
        wait_for(live.ready, "the first list")
        api.put("v1", "nodes", node("a", **{STAMP: "1764576060"}))
        wait_for(lambda: stamps(live) == {"a": "1764576060"}, "a timestamp change, now a change like any other")
    finally:
        live.stop()


def test_a_relist_that_finds_the_nodes_held_builds_no_snapshot(api: KubeAPI, kubeconfig: str) -> None:
    live = make_live(kubeconfig, resync=1)
    try:
        api.put("v1", "nodes", node("a", **{STAMP: "1764576000"}))
        api.put("v1", "nodes", node("b"))
        live.start()
        wait_for(live.ready, "the first list")
        view, before = live.snapshot(), live.builds
        api.put("v1", "nodes", node("a", **{STAMP: "1764576060"}))
        wait_for(lambda: lists(api) >= 3, "two relists (resync every second)", deadline=15)
        assert live.builds == before and live.snapshot() is view
        api.put("v1", "nodes", node("c"))
        wait_for(lambda: names(live) == {"a", "b", "c"}, "a node added after the relists")
    finally:
        live.stop()


def test_a_relist_mends_a_view_whose_build_failed(
    api: KubeAPI, kubeconfig: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relist that finds the nodes held builds nothing, unless the last build failed: then the view is behind
    the nodes, and the list publishes them."""
    real, failing = build_view, threading.Event()

    def flaky(*args: Any, **kwargs: Any) -> Any:
        if failing.is_set():
            failing.clear()
            raise RuntimeError("a build that failed")
        return real(*args, **kwargs)

    monkeypatch.setattr(watch, "build_view", flaky)
    live = make_live(kubeconfig, resync=2)
    try:
        api.put("v1", "nodes", node("a"))
        _watching(live, api)
        failing.set()
        api.put("v1", "nodes", node("a", driver="570.124.06"))
        wait_for(lambda: not failing.is_set(), "the build that fails")
        assert drivers(live) == {"a": "550.54.15"}, "the view is behind the nodes"
        assert live.snapshot_age_seconds > 0, "and says so, though its watch is open"
        wait_for(lambda: drivers(live) == {"a": "570.124.06"}, "a relist that mends it", deadline=15)
        # the relist publishes before its watch opens again: 0 once it is (CI saw 0.005 s in between)
        wait_for(lambda: live.snapshot_age_seconds == 0.0, "the age back to 0 with the watch open again")
        assert live.snapshot_age_seconds == 0.0
    finally:
        live.stop()


def test_gone_error_event_on_an_open_watch_relists(api: KubeAPI, live: LiveCluster) -> None:
    api.put("v1", "nodes", node("a"))
    _watching(live, api)
    api.gone_watches()  # ERROR 410 on the stream; watches from older versions are now refused too
    api.put("v1", "nodes", node("late"))
    wait_for(lambda: lists(api) >= 2, "a relist after 410 Gone")
    wait_for(lambda: names(live) == {"a", "late"}, "the node added around the 410")
    assert live.ready()


def test_gone_status_on_watch_start_relists(api: KubeAPI, live: LiveCluster) -> None:
    api.put("v1", "nodes", node("a"))
    _watching(live, api)
    api.fail_next(1, 410)  # the next request, the new watch, gets HTTP 410
    api.drop_watches()
    wait_for(lambda: lists(api) >= 2, "a relist after a 410 on watch start")
    api.put("v1", "nodes", node("b"))
    wait_for(lambda: names(live) == {"a", "b"}, "events after the relist")


def test_expired_version_on_rewatch_relists(api: KubeAPI, live: LiveCluster) -> None:
    api.put("v1", "nodes", node("a"))
    _watching(live, api)
    api.put("v1", "nodes", node("b"))
    wait_for(lambda: names(live) == {"a", "b"}, "b")
    api.expire(api.rv + 1)  # history up to now is compacted: the re-watch gets an ERROR 410 at once
    api.drop_watches()
    wait_for(lambda: lists(api) >= 2, "a relist")
    api.delete("v1", "nodes", "a")
    wait_for(lambda: names(live) == {"b"}, "a delete after the relist")


def test_dropped_stream_reconnects_from_the_last_version(api: KubeAPI, live: LiveCluster) -> None:
    api.put("v1", "nodes", node("a"))
    _watching(live, api)
    api.drop_watches()
    api.put("v1", "nodes", node("b"))  # happens while no watch is open: the next watch replays it
    wait_for(lambda: names(live) == {"a", "b"}, "an event from the gap")
    api.fail_next(3, 503)
    api.drop_watches()
    api.put("v1", "nodes", node("c"))
    wait_for(lambda: names(live) == {"a", "b", "c"}, "recovery after 503s")
    assert lists(api) == 1, "a dropped stream resumes the watch; it does not relist"


def test_server_down_at_start_then_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    api = KubeAPI().start()
    kubeconfig = api.kubeconfig(str(tmp_path / "kubeconfig"))
    api.put("v1", "nodes", node("a"))
    api.stop()
    live = make_live(kubeconfig)
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    try:
        live.start()
        time.sleep(0.5)
        assert not live.ready()
        assert all(t.is_alive() for t in live._threads), "no exception may kill the threads"
        assert live.snapshot_age_seconds >= 0.4
        assert any("not ready" in r.getMessage() for r in caplog.records)
        api.start()  # same port
        wait_for(live.ready, "readiness once the server is back")
        assert names(live) == {"a"}
        # the line follows readiness (the view is published first): wait for it, do not race it
        wait_for(
            lambda: any("synced 1 nodes" in r.getMessage() and "ready" in r.getMessage() for r in caplog.records),
            "the synced log line",
        )
    finally:
        live.stop()
        api.stop()


def test_server_gone_after_sync_keeps_the_snapshot_and_readiness(api: KubeAPI, kubeconfig: str) -> None:
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig)
    try:
        _watching(live, api)
        api.stop()
        wait_for(lambda: live.snapshot_age_seconds > 0.2, "the snapshot ageing")
        assert live.ready() and names(live) == {"a"}
        api.start()
        api.put("v1", "nodes", node("b"))
        wait_for(lambda: names(live) == {"a", "b"}, "events once the server is back")
        wait_for(lambda: live.snapshot_age_seconds < 0.2, "the snapshot age recovering")
    finally:
        live.stop()


@pytest.mark.parametrize("fault", ["gone", "drop"])
def test_snapshot_age_recovers_after_a_410_or_a_dropped_watch(api: KubeAPI, kubeconfig: str, fault: str) -> None:
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig)
    try:
        _watching(live, api)
        # the stand-in counts the watch when its request comes, the client once the answer's head is read
        wait_for(lambda: live.snapshot_age_seconds == 0.0, "an open watch keeps the snapshot current")
        api.gone_watches() if fault == "gone" else api.drop_watches()
        api.put("v1", "nodes", node("b"))
        wait_for(lambda: names(live) == {"a", "b"}, "the resync")
        wait_for(lambda: len(api.watches) == 1 and live.snapshot_age_seconds == 0.0, "the age back at 0")
    finally:
        live.stop()


def test_burst_of_events_is_debounced(api: KubeAPI, kubeconfig: str) -> None:
    live = make_live(kubeconfig, debounce_seconds=0.2)
    try:
        _watching(live, api)
        before = live.builds
        for i in range(1500):
            api.put("v1", "nodes", node(f"n{i}", pool=f"p{i % 3}"))
        wait_for(lambda: live.node_count == 1500, "all nodes", deadline=30)
        assert live.builds - before < 40, f"{live.builds - before} rebuilds for 1500 events"
        assert {g.pool for g in live.snapshot().groups} == {"p0", "p1", "p2"}
    finally:
        live.stop()


def test_periodic_resync_relists(api: KubeAPI, kubeconfig: str) -> None:
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig, resync=1)
    try:
        live.start()
        wait_for(live.ready, "the first list")
        wait_for(lambda: lists(api) >= 3, "two resyncs", deadline=6)
        assert names(live) == {"a"}
    finally:
        live.stop()


def test_stop_is_prompt_and_start_is_idempotent(api: KubeAPI, live: LiveCluster) -> None:
    live.start()
    wait_for(live.ready, "the first list")
    threads = list(live._threads)
    live.start()
    assert live._threads == threads
    wait_for(lambda: len(api.watches) == 1, "the watch")
    began = time.monotonic()
    live.stop()
    assert time.monotonic() - began < 3
    assert not any(t.is_alive() for t in threads)


def _child(live: LiveCluster, out: Any) -> None:
    live.start()
    end = time.monotonic() + DEADLINE
    while not live.ready() and time.monotonic() < end:
        time.sleep(0.02)
    out.put((live.ready(), live.node_count, threading.active_count() > 1))
    live.stop()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_start_after_fork_runs_in_the_child(api: KubeAPI, kubeconfig: str) -> None:
    """As in a gunicorn worker: made in the master, started after the fork."""
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child, args=(live, out))
    child.start()
    try:
        assert out.get(timeout=DEADLINE + 5) == (True, 1, True)
    finally:
        child.join(timeout=5)
    assert not live.ready(), "the master itself never started watching"


def test_backoff_grows_caps_and_jitters() -> None:
    b = Backoff(0.5, 4.0)
    delays = [b.next() for _ in range(8)]
    assert 0.25 <= delays[0] <= 0.5
    assert all(2.0 <= d <= 4.0 for d in delays[4:])
    b.reset()
    assert b.next() <= 0.5


def test_environment_without_credentials_gives_none(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "missing")}
    assert kubeconfig_paths(env) == []
    assert live_cluster_from_environment(Settings(), env) is None


def test_environment_with_kubeconfig_gives_a_live_cluster(api: KubeAPI, kubeconfig: str, tmp_path: Path) -> None:
    api.put("v1", "nodes", node("a"))
    env = {"KUBECONFIG": os.pathsep.join([str(tmp_path / "missing"), kubeconfig])}
    live = live_cluster_from_environment(Settings(), env)
    assert live is not None
    assert api.url in live.description
    try:
        live.start()
        wait_for(live.ready, "the first list")
        assert names(live) == {"a"}
    finally:
        live.stop()


def test_unusable_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "config"
    bad.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n")
    with pytest.raises(ConfigError, match="kubeconfig"):
        live_cluster_from_environment(Settings(), {"KUBECONFIG": str(bad)})


def test_before_its_first_list_the_watch_knows_no_pool_not_even_the_declared_ones() -> None:
    """The declared pools join the nodes of the first list: before it they stood for the whole cluster, and pods
    were judged against them alone (found by a review of day-2 journeys)."""
    pool = PoolSettings(name="old", node_selector={"example.com/pool": "old"}, driver_version="535.104.05")
    source = LiveCluster(Settings(cluster=ClusterSettings(pools=[pool])), lambda: None)
    view = source.snapshot()
    assert not view.known and view.groups == () and "not synced yet" in view.source


def test_a_periodic_relist_that_fails_leaves_the_watch_going(
    api: KubeAPI, kubeconfig: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server's rate limits charge a list of every node far more than a watch: while the relist due every
    resync got 429s, the loop listed again and again and never watched, and no node change reached the view (found
    by a review that faulted the API server)."""
    from tests.kubeapi import _Handler

    throttled = threading.Event()
    fault = _Handler._fault

    def lists_throttled(self: Any) -> bool:
        if throttled.is_set() and "/nodes" in self.path and "watch=" not in self.path:
            self.api.requests.append((self.command, self.path))
            body = {"kind": "Status", "code": 429, "reason": "TooManyRequests", "message": "throttled"}
            self._send(429, body, {"Retry-After": "1"})
            return True
        return bool(fault(self))

    monkeypatch.setattr(_Handler, "_fault", lists_throttled)
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig, resync=2, watch_timeout_seconds=1)
    try:
        live.start()
        wait_for(live.ready, "the first list")
        throttled.set()
        time.sleep(2.5)  # the relist falls due, and fails
        api.put("v1", "nodes", node("b"))
        api.put("v1", "nodes", node("a", driver="580.65.06"))
        wait_for(lambda: names(live) == {"a", "b"} and drivers(live)["a"] == "580.65.06", "the watch going on")
    finally:
        live.stop()


def test_a_watch_cut_after_a_while_is_resumed_at_once(
    api: KubeAPI, kubeconfig: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A load balancer that cuts idle streams: each cut counted as a failure, so on a quiet cluster the backoff rose
    to its maximum (30 s in production) and a warning was logged at every cut (found by a review that faulted the
    API server). A stream open a while that breaks is resumed at once, told at INFO."""
    from webhook import watch

    monkeypatch.setattr(watch, "WATCH_HELD_S", 0.3)
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig, backoff_initial=3.0, backoff_max=3.0, watch_timeout_seconds=30)
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    try:
        live.start()
        wait_for(live.ready, "the first list")
        for n in range(3):
            wait_for(lambda: len(api.watches) == 1, "the watch")
            time.sleep(0.5)
            api.cut_watches()
            api.put("v1", "nodes", node(f"b{n}"))
            started = time.monotonic()
            added = f"b{n}"
            wait_for(lambda: added in names(live), "the node after the cut")  # noqa: B023
            assert time.monotonic() - started < 2.0, "resumed without the backoff's 3 s"
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        assert lists(api) == 1, "a cut stream resumes the watch; it does not relist"
    finally:
        live.stop()


def watches(api: KubeAPI) -> int:
    return sum(1 for method, path in api.requests if method == "GET" and "/nodes" in path and "watch=" in path)


def watch_socket(live: LiveCluster) -> socket.socket | None:
    """The client's socket under the open watch (None between watches)."""
    response = live._response
    return getattr(getattr(response, "connection", None), "sock", None)


def test_a_quiet_watch_that_hears_nothing_stays_current_and_open(
    api: KubeAPI, kubeconfig: str, caplog: pytest.LogCaptureFixture
) -> None:
    """kube-apiserver's watch cache sends a bookmark only once its resourceVersion passed the one the watch began
    from: on a quiet node set (kubelets report about every 5 minutes on a small cluster) a healthy watch hears
    nothing for minutes. Taken for a dead connection after 150 s of silence, it was begun again every 150 s, told at
    WARNING, and the age read non-zero (found by a review). Its read timeout is above its timeoutSeconds: nothing
    cuts it before the API server ends it, and the age stays 0 while it is open."""
    api.bookmark_seconds = 0.2  # sent, were the resourceVersion newer than the watch's
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig, resync=3600, watch_timeout_seconds=300)
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    try:
        live.start()
        wait_for(live.ready, "the first list")
        wait_for(lambda: watch_socket(live) is not None and live.snapshot_age_seconds == 0.0, "the open watch")
        sock = watch_socket(live)
        assert sock is not None
        (path,) = [p for m, p in api.requests if m == "GET" and "watch=" in p]
        assert "timeoutSeconds=300" in path
        read_timeout = sock.gettimeout()
        assert read_timeout is not None and read_timeout > 300, f"a silent read is cut after {read_timeout} s"
        ages = []
        quiet_until = time.monotonic() + 2.0
        while time.monotonic() < quiet_until:
            ages.append(live.snapshot_age_seconds)
            time.sleep(0.05)
        assert set(ages) == {0.0}
        assert watches(api) == 1 and lists(api) == 1
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
        api.put("v1", "nodes", node("b"))  # still following
        wait_for(lambda: "b" in names(live), "the change through the same watch")
        assert watches(api) == 1
    finally:
        live.stop()


def watched_from(api: KubeAPI) -> list[str]:
    """The ``resourceVersion`` each node watch request asked to begin from, in order."""
    return [
        parse_qs(urlparse(path).query).get("resourceVersion", [""])[0]
        for method, path in api.requests
        if method == "GET" and "/nodes" in path and "watch=" in path
    ]


def test_a_bookmark_moves_the_version_the_next_watch_resumes_from(api: KubeAPI, kubeconfig: str) -> None:
    """On a cluster whose nodes are quiet while other objects change, a bookmark is the node watch's only news of
    the resourceVersion: resumed from the list's version after a cut, the watch asks for history the API server
    may have compacted (410 Gone, and a list of every node). The bookmark's version is the one held and resumed
    from, with no relist."""
    api.bookmark_seconds = 0.1
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig, resync=3600, watch_timeout_seconds=300)  # nothing but the cut ends the watch
    try:
        _watching(live, api)
        listed = live._rv
        assert watched_from(api) == [listed]
        # not a node: the resourceVersion moves past the watch's, which hears of it only through a bookmark
        moved = api.put("v1", "configmaps", {"metadata": {"name": "other"}}, "default")["metadata"]["resourceVersion"]
        assert int(moved) > int(listed)
        wait_for(lambda: live._rv == moved, f"a bookmark at resourceVersion {moved}, held by the watch")
        api.cut_watches()
        wait_for(lambda: len(watched_from(api)) == 2, "the watch resumed after the cut")
        assert watched_from(api) == [listed, moved], "resumed from the bookmark's version, not the list's"
        assert lists(api) == 1, "a bookmark and a cut resume the watch; they do not relist"
        api.put("v1", "nodes", node("b"))
        wait_for(lambda: names(live) == {"a", "b"}, "a node added after the resume")
    finally:
        live.stop()


@pytest.mark.parametrize("where", ["kubeconfig", "in-cluster"])
def test_the_watch_connection_has_tcp_keepalive(
    api: KubeAPI, kubeconfig: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A connection that a NAT or load balancer dropped without a reset looks open and brings nothing, as a quiet
    watch does: TCP keepalive breaks it within a minute (probed after 30 s idle, every 10 s, given up after 3), and
    the watch resumes. The clients of both credential paths ask for it: the options are on the watch's socket."""
    from kubernetes import config as k8s_config

    env = {"KUBECONFIG": kubeconfig, "KUBERNETES_SERVICE_HOST": ""}
    if where == "in-cluster":
        token = tmp_path / "token"
        token.write_text("t")
        monkeypatch.setattr(watch, "SERVICE_ACCOUNT_TOKEN", str(token))
        env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}

        def test_server(client_configuration: Any) -> None:  # in a pod: the ServiceAccount's; here the test server
            k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=client_configuration)  # type: ignore[no-untyped-call]

        monkeypatch.setattr(k8s_config, "load_incluster_config", test_server)
    api.put("v1", "nodes", node("a"))
    live = live_cluster_from_environment(Settings(), env)
    assert live is not None and live.description.startswith("in-cluster" if where == "in-cluster" else api.url)
    try:
        live.start()
        wait_for(lambda: live.ready() and watch_socket(live) is not None, "the open watch")
        sock = watch_socket(live)
        assert sock is not None
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 10
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1, "urllib3's default kept"
    finally:
        live.stop()


def test_a_connection_keepalive_broke_is_told_as_such() -> None:
    """urllib3 reports a connection the kernel broke (its keepalive probes unanswered: ``ETIMEDOUT``) as a read that
    timed out, which the log then told, though no read timeout had passed: it says what happened."""
    import errno

    import urllib3

    def read_error(cause: OSError) -> BaseException:
        try:
            raise urllib3.exceptions.ReadTimeoutError(None, None, "Read timed out.") from cause  # type: ignore[arg-type]
        except urllib3.exceptions.ReadTimeoutError as err:
            return err

    dead = watch.brief(read_error(TimeoutError(errno.ETIMEDOUT, "Connection timed out")))
    assert "found dead, its TCP keepalive probes unanswered" in dead and "NAT or load balancer" in dead
    timed_out = watch.brief(read_error(TimeoutError("timed out")))  # its own read timeout: as urllib3 says
    assert "Read timed out." in timed_out and "keepalive" not in timed_out
    unreachable = watch.brief(read_error(OSError(errno.EHOSTUNREACH, "No route to host")))
    assert "found dead, the API server's host or network unreachable" in unreachable
    assert "keepalive" not in unreachable
    # a connection that could not be made at all (the same errno) is told as urllib3 tells it, not as one found dead
    try:
        raise urllib3.exceptions.NewConnectionError(
            None,  # type: ignore[arg-type]
            "Failed to establish a new connection: [Errno 113] No route to host",
        ) from OSError(errno.EHOSTUNREACH, "No route to host")
    except urllib3.exceptions.NewConnectionError as err:
        never_made = watch.brief(err)
    assert "Failed to establish a new connection" in never_made and "found dead" not in never_made


def test_retry_after_is_waited_in_the_loop_and_said(
    api: KubeAPI, kubeconfig: str, caplog: pytest.LogCaptureFixture
) -> None:
    """urllib3's own retries (3, each sleeping a 503's or 429's Retry-After) held the first list 3 x Retry-After
    with nothing logged, and then said "retrying in 0.4s" (found by a review that faulted the API server). The
    loop asks once, says so, and waits what Retry-After says."""
    api.put("v1", "nodes", node("a"))
    api.fail_next(1, 503, retry_after=2)
    live = live_cluster_from_environment(Settings(), {"KUBECONFIG": kubeconfig})
    assert live is not None
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    started = time.monotonic()
    try:
        live.start()
        wait_for(lambda: any("HTTP 503" in r.getMessage() for r in caplog.records), "the 503 said", deadline=1.5)
        said = next(r.getMessage() for r in caplog.records if "HTTP 503" in r.getMessage())
        assert "retrying in 2.0s" in said, said
        wait_for(live.ready, "the list after Retry-After")
        assert time.monotonic() - started >= 2.0
    finally:
        live.stop()


def test_an_api_server_whose_certificate_is_not_trusted_is_asked_a_few_times_at_most(tmp_path: Path) -> None:
    """The watch's clients ask urllib3 for no answer again, and retry a connection error once: with its `other`
    count unset, a TLS failure was asked again without end inside urllib3, unseen by the loop (no warning, no
    backoff, a flood of connections to the API server; found by a review of this session's commits)."""
    import ssl

    import urllib3

    from tests.serving import issue_certs

    certs = issue_certs(tmp_path / "certs")
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(certs / "tls.crt"), str(certs / "tls.key"))
    accepted: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            with contextlib.suppress(OSError, ssl.SSLError):
                context.wrap_socket(conn, server_side=True).close()
            conn.close()

    threading.Thread(target=serve, daemon=True).start()

    class Configuration:
        retries: Any = None

    cfg = Configuration()
    _api_connections(cfg)
    http = urllib3.PoolManager(retries=cfg.retries, cert_reqs="CERT_REQUIRED", ca_certs=str(tmp_path / "none.pem"))
    (tmp_path / "none.pem").write_bytes((issue_certs(tmp_path / "other") / "ca.crt").read_bytes())
    outcome: list[BaseException] = []

    def ask() -> None:
        try:
            http.request("GET", f"https://127.0.0.1:{port}/api/v1/nodes", timeout=2)
        except BaseException as err:
            outcome.append(err)

    asker = threading.Thread(target=ask, daemon=True)
    asker.start()
    asker.join(10)
    listener.close()
    assert not asker.is_alive() and outcome, f"still asking after {len(accepted)} connections"
    assert len(accepted) <= 3, accepted


def _watching(live: LiveCluster, api: KubeAPI) -> None:
    """Start ``live`` and wait for its first list of ``api``'s nodes and its watch."""
    live.start()
    wait_for(live.ready, "the first list")
    wait_for(lambda: len(api.watches) == 1, "the watch")


def _exec_watch(
    api: KubeAPI,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    credential: dict[str, Any],
) -> tuple[LiveCluster, Path, Path]:
    """A node watch over ``api`` (node a), not started, whose kubeconfig's exec plugin gives ``credential`` and
    hangs while ``hang`` exists, waited on 1 s, its retries quick, its log captured: (watch, kubeconfig, hang)."""
    kubeconfig, hang = exec_kubeconfig(api, tmp_path, credential)
    monkeypatch.setattr(watch, "CREDENTIALS_TIMEOUT_S", 1.0)
    api.put("v1", "nodes", node("a"))
    live = live_cluster_from_environment(Settings(), {"KUBECONFIG": str(kubeconfig)})
    assert live is not None
    live.backoff_initial, live.backoff_max = 0.05, 0.3
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    return live, kubeconfig, hang


def test_an_exec_credential_plugin_that_hangs_is_waited_on_a_while_then_said(
    api: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubernetes client runs a kubeconfig's exec credential plugin (aws eks get-token, kubelogin) with no
    timeout, on each new client: one that hung stopped the node watch for good, with no log line, /readyz saying
    ready (found by a review). It is waited on a while, then warned of by its command, and said in /readyz; no second
    one is run while it hangs; once it answers, its answer makes the client (it was thrown away, and the plugin
    known to be slow run again: found by a review), and the watch works again and says so."""
    from webhook.app import create_app

    live, _, hang = _exec_watch(api, tmp_path, monkeypatch, caplog, CREDENTIAL)
    plugin = tmp_path / "get-token"
    readyz = create_app(Settings(), cluster=live).test_client()
    try:
        _watching(live, api)
        hang.touch()
        runs = len((tmp_path / "runs").read_text().splitlines())
        api.fail_next(1, 401)  # a token refused: the watcher makes a new client, which runs the plugin again
        api.drop_watches()
        api.put("v1", "nodes", node("a", driver="570.124.06"))
        said = f"`{plugin} eks get-token` has not returned in 1s"
        wait_for(lambda: any(said in r.getMessage() for r in caplog.records), "a warning naming the plugin")
        warning = next(r for r in caplog.records if said in r.getMessage())
        assert warning.levelno == logging.WARNING and "cannot list nodes" in warning.getMessage(), warning.getMessage()
        wait_for(lambda: "not waited on until it returns" in (live.problem() or ""), "the retries waiting on it")
        assert len((tmp_path / "runs").read_text().splitlines()) == runs + 1, "one hanging plugin, not one a retry"
        answer = readyz.get("/readyz")
        assert answer.status_code == 200, "ready all the same: the last snapshot serves"
        assert f"`{plugin} eks get-token`" in answer.get_json()["warning"]
        assert drivers(live) == {"a": "550.54.15"}
        hang.unlink()  # it answers at last: the next retry makes a client
        wait_for(lambda: drivers(live) == {"a": "570.124.06"}, "the change, once the plugin answered")
        wait_for(lambda: any("works again" in r.getMessage() for r in caplog.records), "the watch said to work again")
        assert live.problem() is None and "warning" not in readyz.get("/readyz").get_json()
        assert len((tmp_path / "runs").read_text().splitlines()) == runs + 1, "the plugin run again after it answered"
    finally:
        hang.unlink(missing_ok=True)
        live.stop()


def test_a_kubeconfig_rewritten_to_another_plugin_is_loaded_while_the_old_one_hangs(
    api: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The node watch loaded its credentials in one ``InTime`` for its life, named by the plugin seen at start: while
    that plugin hung, the kubeconfig rewritten to another plugin (or the same with another AWS_PROFILE) was refused
    too, the view stale until the old plugin returned (found by a review). Its loads are told apart by plugin, as the
    Events relay's: the rewrite is loaded at once, and a 401 names the plugin that now gives the token."""
    live, kubeconfig, hang = _exec_watch(api, tmp_path, monkeypatch, caplog, CREDENTIAL)
    try:
        _watching(live, api)
        hang.touch()
        api.fail_next(1, 401)  # a token refused: the new client runs the plugin again, which hangs
        api.drop_watches()
        api.put("v1", "nodes", node("a", driver="570.124.06"))
        wait_for(lambda: "not waited on until it returns" in (live.problem() or ""), "the retries waiting on it")
        good = tmp_path / "good-token"
        good.write_text(f"#!/bin/sh\necho '{json.dumps(CREDENTIAL)}'\n")
        good.chmod(0o755)
        config = json.loads(kubeconfig.read_text())
        config["users"][0]["user"]["exec"]["command"] = str(good)
        kubeconfig.with_name("new").write_text(json.dumps(config))
        kubeconfig.with_name("new").rename(kubeconfig)  # as a Secret's mount is rewritten
        wait_for(lambda: drivers(live) == {"a": "570.124.06"}, "the change, listed with the rewritten plugin")
        assert hang.exists(), "loaded while the old plugin still hangs"
        caplog.clear()
        api.fail_next(1, 401)
        api.drop_watches()
        said = f"(the credentials of the kubeconfig's exec credential plugin `{good} eks get-token`)"
        wait_for(lambda: any(said in r.getMessage() for r in caplog.records), "a 401 naming the plugin now used")
    finally:
        hang.unlink(missing_ok=True)
        live.stop()


def test_a_watch_from_a_version_the_api_server_is_behind_lists_again(
    api: KubeAPI, kubeconfig: str, caplog: pytest.LogCaptureFixture
) -> None:
    """After etcd is restored from a backup, the API server's resourceVersion is below the one the watch holds, and
    it answers a watch from it 504 ResourceVersionTooLarge: retried from the same version with backoff, the watch
    was refused until the periodic relist, 5 minutes later by default, the view stale meanwhile (found by a review).
    It lists again at once, as for a 410 (client-go's reflector does the same)."""
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig, resync=3600)
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    try:
        live.start()
        wait_for(live.ready, "the first list")
        for run in range(10):
            held = api.put("v1", "nodes", node("a", run=str(run)))["metadata"]["resourceVersion"]
        wait_for(lambda: live._rv == held, "the watch at the last version")
        api.restore(int(held) - 8)
        api.drop_watches()
        api.put("v1", "nodes", node("b", driver="570.124.06"))  # after the restore, at a version below the one held
        wait_for(lambda: drivers(live).get("b") == "570.124.06", "the node added after the restore")
        assert lists(api) == 2
        said = [r.getMessage() for r in caplog.records]
        assert "cluster: resource version too large (API server restored or behind): listing again" in said, said
        # (urllib3 may warn that it asked again on a new connection, the kept one closed by the stand-in)
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "gpu_admission.cluster"]
        assert not warned, caplog.text
    finally:
        live.stop()


def test_an_api_server_that_never_answers_the_first_list_is_said_soon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An API server that takes connections and never answers: the first list waited 120 s for its answer, and
    urllib3 asked again, 4 minutes with nothing logged and /readyz saying only "not synced" (found by a review). The
    first list waits ``FIRST_LIST_READ_S``, is asked once, and the warning and /readyz say why."""
    from webhook.app import create_app

    monkeypatch.setattr(watch, "FIRST_LIST_READ_S", 1.0)
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def take() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=take, daemon=True).start()
    api = KubeAPI()
    api.port = listener.getsockname()[1]
    live = make_live(api.kubeconfig(str(tmp_path / "kubeconfig")), backoff_initial=30.0, backoff_max=30.0)
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    readyz = create_app(Settings(), cluster=live).test_client()
    try:
        live.start()
        wait_for(lambda: len(held) == 1, "the first list's connection")
        answer = readyz.get("/readyz")
        assert answer.status_code == 503 and "waiting on its answer" in answer.get_json()["error"], answer.get_json()
        began = time.monotonic()
        wait_for(lambda: any(r.levelno == logging.WARNING for r in caplog.records), "a warning", deadline=5)
        assert time.monotonic() - began < 3
        (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert "cannot list nodes: " in warning and "Read timed out" in warning and "not ready" in warning, warning
        assert len(held) == 1, "the list that was not answered is not asked again inside urllib3"
        error = readyz.get("/readyz").get_json()["error"]
        assert "no node list from the API server in " in error and "Read timed out" in error, error
    finally:
        live.stop()
        listener.close()
        for conn in held:
            conn.close()


FORBIDDEN = (
    'nodes is forbidden: User "system:serviceaccount:gpu-admission:gpu-admission" cannot list resource "nodes" in'
    ' API group "" at the cluster scope'
)


def refuse(monkeypatch: pytest.MonkeyPatch, message_for: Callable[[Any], str | None]) -> None:
    """The API stand-in answers 403 Forbidden (a Status with RBAC's message) to each request that ``message_for``
    gives a message for, the request counted as asked; the others as before."""
    from tests.kubeapi import _Handler

    fault = _Handler._fault

    def refused(self: Any) -> bool:
        message = message_for(self)
        if message is None:
            return bool(fault(self))
        self.api.requests.append((self.command, self.path))
        self._send(403, {"kind": "Status", "code": 403, "reason": "Forbidden", "message": message})
        return True

    monkeypatch.setattr(_Handler, "_fault", refused)


def test_the_log_says_why_the_watch_fails_and_when_it_works_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The watch's warnings were cut at 200 characters, urllib3's pool and URL first, so a refused connection (a
    name not resolved, a TLS failure) was cut before its cause; a 403 said "HTTP 403 Forbidden" without the API's
    message, which names the service account and the verb; and nothing said the watch worked again (found by a
    review). The cause comes first, the URL last; a 403 says the API's message; one line says it works again."""
    forbidden = threading.Event()

    def lists_forbidden(_: Any) -> str | None:
        if forbidden.is_set():
            forbidden.clear()
            return FORBIDDEN
        return None

    refuse(monkeypatch, lists_forbidden)
    api = KubeAPI()
    with socket.create_server(("127.0.0.1", 0)) as free:  # closed at once: connections refused
        api.port = free.getsockname()[1]
    live = make_live(api.kubeconfig(str(tmp_path / "kubeconfig")), backoff_initial=0.3, backoff_max=0.3)
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")

    def said(text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if text in r.getMessage() and r.name == "gpu_admission.cluster"]

    try:
        live.start()
        wait_for(lambda: bool(said("Connection refused")), "the refused connection said")
        refused = said("Connection refused")[0]
        assert refused.startswith("cluster: cannot list nodes: Failed to establish a new connection: [Errno 111]")
        assert refused.index("Connection refused") < refused.index(f"({api.url}/api/v1/nodes?limit=500)"), refused
        assert "HTTPConnection" not in refused, refused
        forbidden.set()
        api.put("v1", "nodes", node("a"))
        api.start()  # same port
        wait_for(lambda: bool(said("works again")), "the list that works said")  # after ready(), in another thread
        assert said(f"cannot list nodes: HTTP 403 Forbidden: {FORBIDDEN} from the API server; not ready")
        (back,) = said("works again")
        assert back.startswith("cluster: the node watch works again: the API server answers, after failing for")
        api.put("v1", "nodes", node("b"))
        wait_for(lambda: names(live) == {"a", "b"}, "the watch")
        assert len(said("works again")) == 1
    finally:
        live.stop()
        api.stop()


def test_rbac_that_lets_list_nodes_and_not_watch_them_is_said(
    api: KubeAPI, kubeconfig: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A ClusterRole that grants list on nodes and not watch: each relist worked and said the watch worked again,
    the snapshot's age stayed under its alert's 900 s, and nothing told that the watch was forbidden (found by a
    review). The log says so once, and /readyz's warning while it lasts, naming the verb and the RBAC to add."""
    from webhook.app import create_app

    forbidden = threading.Event()
    forbidden.set()
    message = FORBIDDEN.replace("cannot list", "cannot watch")
    refuse(monkeypatch, lambda asked: message if forbidden.is_set() and "watch=" in asked.path else None)
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig, resync=1)
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    readyz = create_app(Settings(), cluster=live).test_client()

    def said(text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if text in r.getMessage() and r.name == "gpu_admission.cluster"]

    try:
        live.start()
        wait_for(live.ready, "the first list")
        wait_for(lambda: lists(api) >= 4, "relists, the watch forbidden meanwhile")
        (warning,) = said("the node watch is forbidden")
        assert f"(HTTP 403 Forbidden: {message})" in warning, warning
        assert "add `watch` to the verbs of the ClusterRole rule for nodes" in warning, warning
        assert not said("works again"), said("works again")
        answer = readyz.get("/readyz")
        assert answer.status_code == 200 and "the node watch is forbidden" in answer.get_json()["warning"]
        assert "only at each relist, every 1s" in (live.problem() or "")
        forbidden.clear()  # the RBAC mended
        wait_for(lambda: bool(said("the node watch is let open again")), "the watch said to be let open again")
        assert live.problem() is None and "warning" not in readyz.get("/readyz").get_json()
    finally:
        live.stop()


def test_a_watch_refused_after_every_list_is_said_forbidden_after_one_list_more(
    api: KubeAPI, kubeconfig: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Where every watch is refused and every list let, the nodes are listed once more after the first 403 (the
    check that the list is still let), and the forbidden watch is said then; its retries list nothing more."""
    refuse(monkeypatch, lambda asked: FORBIDDEN if "watch=" in asked.path else None)
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig, resync=120)
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    try:
        live.start()
        wait_for(lambda: "add `watch`" in (live.problem() or ""), "the forbidden watch said")
        wait_for(lambda: len([p for _, p in api.requests if "watch=" in p]) >= 4, "the watch retried")
        assert lists(api) == 2, api.requests
    finally:
        live.stop()


def test_one_watch_refused_just_after_the_first_list_is_not_said_forbidden(
    api: KubeAPI, kubeconfig: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A single 403 to the watch right after the start's list (a ClusterRoleBinding deleted and made again, an HA API
    server whose RBAC cache lags) was said at once, at WARNING, to be RBAC that forbids the watch, with advice to add
    `watch` to the verbs, which the role had (a review's finding). The nodes are listed again first, and the watch
    that is then let open says nothing of the kind."""
    refused: list[str] = []

    def one_watch_forbidden(asked: Any) -> str | None:
        if "watch=" in asked.path and not refused:
            refused.append(asked.path)
            return FORBIDDEN.replace("cannot list", "cannot watch")
        return None

    refuse(monkeypatch, one_watch_forbidden)
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig, resync=120)
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    try:
        live.start()
        wait_for(lambda: len([p for _, p in api.requests if "watch=" in p]) >= 2, "the watch asked again")
        api.put("v1", "nodes", node("b"))
        wait_for(lambda: names(live) == {"a", "b"}, "the watch let open")
        forbidden = [r.getMessage() for r in caplog.records if "forbidden" in r.getMessage()]
        assert not forbidden, forbidden
        assert live.problem() is None
    finally:
        live.stop()


def test_nodes_forbidden_to_list_and_watch_after_start_are_not_said_a_forbidden_watch(
    api: KubeAPI, kubeconfig: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Every request for nodes answered 403 after start (the ClusterRoleBinding deleted): /readyz said that the RBAC
    lets list nodes and not watch them, to add `watch`, while the relists failed too, and went on saying it until the
    next periodic relist, 300 s by default (found by reviews). A watch's 403 after a list that worked has the list
    asked again at once: refused, it is said as the trouble it is. Lists let again while the watch is still refused:
    no false 'works again', and the forbidden watch said."""
    forbidden = {"list": threading.Event(), "watch": threading.Event()}

    def refused(asked: Any) -> str | None:
        verb = "watch" if "watch=" in asked.path else "list"
        if forbidden[verb].is_set() and "/nodes" in asked.path:
            return FORBIDDEN.replace("cannot list", f"cannot {verb}")
        return None

    def said(text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if text in r.getMessage() and r.name == "gpu_admission.cluster"]

    refuse(monkeypatch, refused)
    monkeypatch.setattr(watch, "RELIST_RETRY_S", 0.5)
    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig, resync=120)  # no periodic relist within the test but those after a failed one
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    try:
        live.start()
        wait_for(live.ready, "the first list")
        forbidden["list"].set()
        forbidden["watch"].set()
        api.drop_watches()
        wait_for(lambda: "cannot watch nodes: HTTP 403" in (live.problem() or ""), "the watch's 403 said")
        time.sleep(0.5)  # more watches refused
        problem = live.problem() or ""
        assert problem.startswith("the node view cannot be refreshed from the API server for "), problem
        assert "add `watch`" not in problem and not said("the node watch is forbidden"), problem
        caplog.clear()
        forbidden["list"].clear()  # the lists let again, the watch not
        wait_for(lambda: bool(said("the node watch is forbidden")), "the forbidden watch said")
        assert "add `watch`" in (live.problem() or "")
        assert not said("works again"), said("works again")
    finally:
        live.stop()


def _plugin_runs(tmp_path: Path) -> int:
    return len((tmp_path / "runs").read_text().splitlines())


@pytest.mark.parametrize(
    ("verb", "user", "rebuilt"),
    [
        pytest.param("list", "system:serviceaccount:gpu-admission:gpu-admission", False, id="list-rbac"),
        pytest.param("watch", "system:serviceaccount:gpu-admission:gpu-admission", False, id="watch-rbac"),
        pytest.param("list", "system:anonymous", True, id="list-no-credentials"),
    ],
)
def test_a_403_of_rbac_keeps_the_client_and_its_credentials(
    api: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, verb: str, user: str, rebuilt: bool
) -> None:
    """After a 403 every retry made a new client, which ran a kubeconfig's exec credential plugin (aws eks
    get-token) again (found by a review): a 403 is the RBAC's answer to credentials the API server took, and a new
    client's are the same. The client is kept; where the 403 is to no credentials at all (``system:anonymous``: the
    kubernetes client sends none where its plugin failed), a new client runs the plugin again."""
    forbidden = threading.Event()
    forbidden.set()

    def refused(request: Any) -> str | None:
        asked = "watch" if "watch=" in request.path else "list"
        if forbidden.is_set() and asked == verb and "/nodes" in request.path:
            return f'nodes is forbidden: User "{user}" cannot {verb} resource "nodes" in API group ""'
        return None

    def asked() -> int:
        return sum(1 for _, path in api.requests if "/nodes" in path and ("watch=" in path) == (verb == "watch"))

    refuse(monkeypatch, refused)
    kubeconfig, _ = exec_kubeconfig(api, tmp_path, CREDENTIAL)
    api.put("v1", "nodes", node("a"))
    live = make_live(str(kubeconfig), backoff_initial=0.02, backoff_max=0.05)
    try:
        live.start()
        wait_for(lambda: asked() >= 5, f"the {verb}s refused")
        runs = _plugin_runs(tmp_path)
        assert (runs > 2) is rebuilt, runs
        forbidden.clear()
        wait_for(lambda: live.ready() and len(api.watches) == 1, "the list and the watch, once let")
        assert (_plugin_runs(tmp_path) == 1) is not rebuilt
    finally:
        live.stop()


def test_a_kubeconfig_rewritten_to_a_user_the_rbac_lets_is_read_again(
    api: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 403 of the RBAC keeps the client (test above), and so a kubeconfig rewritten on disk (a Secret's mount, k3s)
    to a user the RBAC lets was never read again: /readyz stayed 503 until a restart (a review's finding). The
    client is made anew from the rewritten kubeconfig, and the nodes are listed."""

    def rbac(asked: Any) -> str | None:
        if "/nodes" in asked.path and asked.headers.get("Authorization") != "Bearer allowed":
            return 'nodes is forbidden: User "old" cannot list resource "nodes" in API group ""'
        return None

    refuse(monkeypatch, rbac)
    kubeconfig = Path(api.kubeconfig(str(tmp_path / "kubeconfig")))
    api.put("v1", "nodes", node("a"))
    live = live_cluster_from_environment(Settings(), {"KUBECONFIG": str(kubeconfig)})
    assert live is not None
    live.backoff_initial, live.backoff_max = 0.02, 0.05
    try:
        live.start()
        wait_for(lambda: lists(api) >= 3, "the lists refused")
        assert not live.ready()
        config = json.loads(kubeconfig.read_text())
        config["users"][0]["user"]["token"] = "allowed"
        kubeconfig.write_text(json.dumps(config))
        wait_for(live.ready, "the nodes listed by the rewritten kubeconfig's user")
        assert names(live) == {"a"}
    finally:
        live.stop()


def _rewrite(kubeconfig: Path, token: str | None, server: str | None = None) -> None:
    """The kubeconfig rewritten as a Secret's mount is: a new file renamed over it (its user's ``token``, its
    ``server``, where given)."""
    config = json.loads(kubeconfig.read_text())
    if token is not None:
        config["users"][0]["user"]["token"] = token
    if server is not None:
        config["clusters"][0]["cluster"]["server"] = server
    fresh = kubeconfig.with_name(kubeconfig.name + ".new")
    fresh.write_text(json.dumps(config))
    fresh.rename(kubeconfig)


def test_a_kubeconfig_rewritten_with_its_inode_mtime_and_size_kept_is_told_apart(tmp_path: Path) -> None:
    """The files' stamp was their inode, mtime and size: a kubeconfig rewritten in place to as long a server's
    address, its mtime kept (``cp -p``; ext4 reuses an inode freed by a rename over it too), was the same files, the
    rewrite unseen and a load given up on before it taken for theirs (found by a review). Their bytes are stamped."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("server: https://10.0.0.1")
    before = os.stat(kubeconfig)
    stamps, files = watch.file_stamps((str(kubeconfig),)), watch.Rewritten((str(kubeconfig),))
    kubeconfig.write_text("server: https://10.0.0.2")
    os.utime(kubeconfig, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(kubeconfig)
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
    assert watch.file_stamps((str(kubeconfig),)) != stamps and files.changed()


def test_a_kubeconfig_rewritten_to_a_user_refused_everything_is_not_said_to_be_refused_the_watch_alone(
    api: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client made anew from a rewritten kubeconfig watched on as the old one did: a user that may neither list
    nor watch nodes was said to be let list them and not watch them ("add `watch`") until the next periodic relist,
    300 s by default (a review's finding). New credentials are listed with at once, and what they are refused is
    said."""
    lets = {"Bearer old": {"list"}, "Bearer nobody": set()}

    def rbac(asked: Any) -> str | None:
        verb = "watch" if "watch=" in asked.path else "list"
        if "/nodes" in asked.path and verb not in lets[asked.headers.get("Authorization")]:
            return f'nodes is forbidden: User "u" cannot {verb} resource "nodes" in API group ""'
        return None

    refuse(monkeypatch, rbac)
    kubeconfig = Path(api.kubeconfig(str(tmp_path / "kubeconfig")))
    _rewrite(kubeconfig, "old")
    api.put("v1", "nodes", node("a"))
    live = live_cluster_from_environment(Settings(), {"KUBECONFIG": str(kubeconfig)})
    assert live is not None
    live.backoff_initial, live.backoff_max, live.resync_seconds = 0.02, 0.05, 300
    try:
        live.start()
        wait_for(lambda: "add `watch`" in (live.problem() or ""), "the forbidden watch said")
        listed = lists(api)
        _rewrite(kubeconfig, "nobody")
        wait_for(lambda: "cannot list nodes: HTTP 403" in (live.problem() or ""), "the new user's refused list said")
        assert lists(api) > listed
        assert "add `watch`" not in (live.problem() or "")
    finally:
        live.stop()


@contextlib.contextmanager
def _two_servers(
    api: KubeAPI, tmp_path: Path, watch_timeout: int, backoff: float = 0.5
) -> Iterator[tuple[LiveCluster, Path, KubeAPI]]:
    """A started node watch over ``api`` (node a) by a kubeconfig, and another API server (node b) to rewrite it to:
    (the watch, its kubeconfig, the other server); both stopped after. ``backoff``: its first pause after an error."""
    kubeconfig = Path(api.kubeconfig(str(tmp_path / "kubeconfig")))
    api.put("v1", "nodes", node("a"))
    other = KubeAPI().start()
    other.put("v1", "nodes", node("b"))
    live = live_cluster_from_environment(Settings(), {"KUBECONFIG": str(kubeconfig)})
    assert live is not None
    live.resync_seconds, live.watch_timeout_seconds, live.backoff_initial = 300, watch_timeout, backoff
    try:
        live.start()
        yield live, kubeconfig, other
    finally:
        live.stop()
        other.stop()


def test_a_kubeconfig_rewritten_to_another_server_is_listed_there_before_it_is_watched(
    api: KubeAPI, tmp_path: Path
) -> None:
    """The client made anew from a kubeconfig rewritten to another API server watched it from the resourceVersion
    of the old one's list, and its nodes reached the view only at the next periodic relist (a review's finding):
    the new server's nodes are listed first, at once."""
    with _two_servers(api, tmp_path, watch_timeout=1) as (live, kubeconfig, other):
        wait_for(lambda: names(live) == {"a"}, "the first server's nodes")
        _rewrite(kubeconfig, "test-token", server=other.url)
        wait_for(lambda: names(live) == {"b"}, "the other server's nodes")
        asked = [path for _, path in other.requests if "/nodes" in path]
        assert "watch=" not in asked[0], asked


def test_a_client_made_anew_after_an_error_from_a_kubeconfig_rewritten_to_another_server_lists_there(
    api: KubeAPI, tmp_path: Path
) -> None:
    """A client dropped for an error (a 401) and made anew from a kubeconfig rewritten meanwhile to another server
    watched that one from the old server's resourceVersion, unlisted: the view kept the old server's nodes under the
    new one's name (found by a review). A new client of another server lists there first, as a reload does."""
    with _two_servers(api, tmp_path, watch_timeout=300, backoff=2.0) as (live, kubeconfig, other):
        wait_for(lambda: names(live) == {"a"} and live._watching, "the first server's nodes, watched")
        api.fail_next(1, 401)
        api.drop_watches()
        wait_for(lambda: "HTTP 401" in (live.problem() or ""), "the refused watch, its client dropped")
        _rewrite(kubeconfig, "test-token", server=other.url)  # while the watch waits to retry, with no client
        wait_for(lambda: any("/nodes" in path for _, path in other.requests), "the other server asked")
        asked = [path for _, path in other.requests if "/nodes" in path]
        assert "watch=" not in asked[0], asked
        wait_for(lambda: names(live) == {"b"}, "the other server's nodes")


def test_a_kubeconfig_rewritten_to_another_server_while_its_watch_is_open_is_followed_at_once(
    api: KubeAPI, tmp_path: Path
) -> None:
    """The rewritten files were looked at only between watches: one rewritten to another server while the watch was
    open (on a quiet cluster, for minutes) left the view with the old server's nodes, and the log, /readyz and the
    view's source named the old server even after (found by a review). The watch open is ended where they changed,
    and the new server is named."""
    with _two_servers(api, tmp_path, watch_timeout=300) as (live, kubeconfig, other):
        wait_for(lambda: names(live) == {"a"} and live._watching, "the first server's nodes, watched")
        assert api.url in live.snapshot().source
        _rewrite(kubeconfig, "test-token", server=other.url)
        wait_for(lambda: names(live) == {"b"}, "the other server's nodes")
        wait_for(lambda: live._watching, "the other server watched")
        assert live.description == f"{other.url} (kubeconfig {kubeconfig})"
        assert other.url in live.snapshot().source and api.url not in live.snapshot().source
        api.stop()  # the old server gone: nothing to say of it
        time.sleep(0.2)
        assert live.problem() is None and names(live) == {"b"}


@pytest.mark.parametrize("what", ["half-written", *UNREADABLE_TLS])
def test_a_kubeconfig_rewritten_so_it_cannot_be_loaded_keeps_the_watch_that_works_and_is_loaded_again_once_mended(
    request: pytest.FixtureRequest, tmp_path: Path, caplog: pytest.LogCaptureFixture, what: str
) -> None:
    """A kubeconfig rewritten in place half-written (or with a typo) ended the watch that worked within a second and
    closed its client: then "cannot list nodes: while parsing ..." at each retry, the view frozen, /readyz in trouble
    (found by a review). The kubernetes client reads a kubeconfig's TLS material only as it connects: one rewritten
    with a CA that is no certificate (or such a client certificate) loaded, and the same followed, "cannot list
    nodes: [X509: NO_CERTIFICATE_OR_CRL_FOUND] ..." (found by a review). Either cannot be loaded: the client there is
    and its watch are kept, said at WARNING naming what cannot be read, and it is loaded again once mended."""
    api: KubeAPI = request.getfixturevalue("api" if what == "half-written" else "tls_api")
    kubeconfig = Path(api.kubeconfig(str(tmp_path / "kubeconfig")))
    good = kubeconfig.read_text()
    api.put("v1", "nodes", node("a"))
    live = live_cluster_from_environment(Settings(), {"KUBECONFIG": str(kubeconfig)})
    assert live is not None
    live.resync_seconds, live.watch_timeout_seconds = 300, 300
    caplog.set_level(logging.INFO, logger=watch.log.name)
    try:
        live.start()
        wait_for(lambda: names(live) == {"a"} and live._watching, "the nodes, watched")
        if what == "half-written":
            kubeconfig.write_text(good[: len(good) // 2])  # in place, part-way
        else:
            with_unreadable_tls(kubeconfig, what)
        wait_for(lambda: "cannot be loaded" in caplog.text, "the kubeconfig said unloadable")
        api.put("v1", "nodes", node("b"))
        wait_for(lambda: names(live) == {"a", "b"}, "a node added after, through the watch kept")
        assert live.problem() is None and live._watching
        (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        named = {"half-written": "", "client-certificate": "its client certificate ("}.get(
            what, "its certificate authority ("
        )
        assert warning.startswith(f"cluster: the kubeconfig {kubeconfig}, rewritten, cannot be loaded ({named}")
        assert "the node watch goes on with the credentials loaded before" in warning
        lists = live.lists
        kubeconfig.write_text(good)  # mended: loaded again, listed with it
        wait_for(lambda: live.lists > lists, "the nodes listed again with the kubeconfig mended")
    finally:
        live.stop()


def test_a_kubeconfig_rewritten_while_its_plugin_hangs_says_the_watch_fails_with_it(
    api: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A kubeconfig rewritten while its exec plugin hangs cannot be loaded, and was said to leave the watch going on
    with the credentials loaded before; the client there refreshes its token in the time of the same plugin, and
    failed at once (found by a review). Said as it is: the watch fails with it."""
    live, kubeconfig, hang = _exec_watch(api, tmp_path, monkeypatch, caplog, CREDENTIAL)
    other = KubeAPI().start()
    try:
        live.start()
        wait_for(lambda: names(live) == {"a"} and live._watching, "the nodes, watched")
        hang.touch()
        _rewrite(kubeconfig, None, server=other.url)
        wait_for(lambda: "cannot be loaded" in caplog.text, "the kubeconfig said unloadable")
        (warning,) = [r.getMessage() for r in caplog.records if "cannot be loaded" in r.getMessage()]
        assert "goes on with the credentials loaded before" not in warning
        assert "the node watch fails with it: the credentials loaded before are refreshed by the same plugin" in warning
        wait_for(lambda: "has not returned in 1s" in (live.problem() or ""), "the watch failing with it, as said")
    finally:
        hang.unlink(missing_ok=True)
        live.stop()
        other.stop()


def test_a_kubeconfig_whose_tls_material_cannot_be_read_at_start_is_said_and_loaded_again_until_mended(
    tls_api: KubeAPI, tmp_path: Path
) -> None:
    """At start, such a kubeconfig is not a reason to stop (the file may be mended, a Secret written again): the
    credentials are loaded again at each retry, and until they load /readyz names what cannot be read (it said the
    TLS library's words alone: no certificate or crl found)."""
    kubeconfig = Path(tls_api.kubeconfig(str(tmp_path / "kubeconfig")))
    good = kubeconfig.read_text()
    with_unreadable_tls(kubeconfig, "certificate-authority-data")
    tls_api.put("v1", "nodes", node("a"))
    live = live_cluster_from_environment(Settings(), {"KUBECONFIG": str(kubeconfig)})
    assert live is not None
    live.backoff_initial, live.backoff_max = 0.02, 0.05
    try:
        live.start()
        wait_for(lambda: "cannot list nodes: its certificate authority (" in (live.problem() or ""), "the CA named")
        assert not live.ready()
        kubeconfig.write_text(good)
        wait_for(live.ready, "the nodes listed with the kubeconfig mended")
        assert names(live) == {"a"}
    finally:
        live.stop()


def test_credential_loads_in_time_reuse_one_helper_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Events relay's client calls its refresh hook, so ``InTime``, before each Event: a thread was started for
    each, 80-180 us an Event where the token was valid (found by a review). One helper thread runs them all; idle
    ``INTIME_IDLE_S``, it ends, and the next call starts another."""
    monkeypatch.setattr(watch, "INTIME_IDLE_S", 0.3)
    in_time = watch.InTime("a loader", timeout=5)
    ran = [in_time(threading.current_thread) for _ in range(20)]  # the threads held: none is another's reuse
    assert len({id(thread) for thread in ran}) == 1, ran
    assert ran[0] is not threading.current_thread()
    wait_for(lambda: not ran[0].is_alive(), "the idle helper thread to end")
    later = in_time(threading.current_thread)
    assert later is not ran[0] and later is not threading.current_thread()
    assert in_time(lambda: 7) == 7


def test_a_credential_load_joined_at_the_helper_threads_idle_edge_is_answered_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller that joined a load in progress waited on it holding ``InTime``'s lock, which the helper thread takes
    to end when idle: a call handed to it in that moment was not run until the joiner's time ran out, and both got
    ``CredentialsHung`` naming a plugin that never hung (the Events relay's senders, a burst after a quiet minute;
    found by a review). The helper is held at its idle edge here, as the interpreter may hold it there."""

    class Edge(queue.SimpleQueue):  # type: ignore[type-arg]
        def get(self, block: bool = True, timeout: float | None = None) -> object:
            try:
                return super().get(block, timeout)
            except queue.Empty:
                time.sleep(0.3)  # the moment between the idle wait's end and the lock
                raise

    monkeypatch.setattr(watch, "INTIME_IDLE_S", 0.1)
    monkeypatch.setattr(queue, "SimpleQueue", Edge)
    in_time = watch.InTime("a loader", timeout=3)
    assert in_time(lambda: 1) == 1
    first = in_time._held
    time.sleep(0.15)  # the helper's idle wait has ended: it sleeps at the edge
    answers: list[object] = []
    handed = threading.Thread(target=lambda: answers.append(in_time(lambda: 2)))
    handed.start()
    wait_for(lambda: in_time._held is not first, "the second load to be handed")
    began = time.monotonic()
    joined = in_time(lambda: 3)  # joins the second load
    handed.join(5)
    assert (joined, answers) == (2, [2])
    assert time.monotonic() - began < 1.5


def _credentials(token: str | None) -> Any:
    """A client configuration as a load leaves it: with ``token``, or without (its plugin failed)."""
    cfg = k8s_client.Configuration()
    if token is not None:
        cfg.api_key["BearerToken"] = f"Bearer {token}"
    return cfg


@pytest.mark.parametrize(("late", "waited"), [("t", True), (None, False)], ids=["answered", "failed"])
def test_a_call_past_its_time_has_the_next_waited_on_where_it_answered(late: str | None, waited: bool) -> None:
    """Once a call outlasted its time, the next were not waited on until one returned in time (a plugin slower than
    its time at each run held up its callers at each retry): one that hung once, then answered, had the next fail at
    once, a token there (found by a review). A late call that gave credentials has the next waited on; one that gave
    none (a plugin that failed late: the kubernetes client loads on without its token) does not."""

    def slow() -> Any:
        time.sleep(0.4)
        return _credentials(late)

    in_time = watch.InTime("a loader", timeout=0.2)
    with pytest.raises(watch.CredentialsHung):
        in_time(slow)
    time.sleep(0.4)  # it returned, past its time
    if waited:
        assert in_time(lambda: 7) == 7
    else:
        with pytest.raises(watch.CredentialsHung, match="not waited on until it returns in time"):
            in_time(lambda: 7)


@pytest.mark.parametrize(
    ("stamp", "kept_s", "taken"),
    [("as read", 300, True), ("rewritten", 300, False), (None, 300, False), ("as read", 0.1, False)],
    ids=["same", "rewritten", "refresh", "old"],
)
def test_a_load_given_up_on_is_the_next_loads_of_the_same_files(
    stamp: str | None, kept_s: float, taken: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A load given up on that answered at last was thrown away, and the next ran the plugin known to be slow again
    (found by a review). Its answer is the next load's where that one reads the files as they were (``stamp``), once,
    and for ``KEPT_S`` after it came at most (found by a review); a kubeconfig rewritten meanwhile (to another
    server) is loaded anew, and a refresh (no stamp) takes none."""
    monkeypatch.setattr(watch, "KEPT_S", kept_s)
    late = _credentials("late")

    def slow() -> Any:
        time.sleep(0.4)
        return late

    in_time = watch.InTime("a loader", timeout=0.2)
    with pytest.raises(watch.CredentialsHung):
        in_time(slow, stamp="as read")
    time.sleep(0.4)  # it answered, past its time
    assert (in_time(lambda: _credentials("fresh"), stamp=stamp) is late) == taken
    assert in_time(lambda: 7, stamp="as read") == 7  # taken once at most


@pytest.mark.parametrize(("valid_s", "kept"), [(60, False), (3600, True)], ids=["refreshed-at-once", "valid"])
def test_a_late_answer_whose_token_the_client_would_refresh_at_once_is_not_kept(
    api: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, valid_s: int, kept: bool
) -> None:
    """The kubernetes client refreshes a token within 5 minutes of its expiry before each request: a late answer's
    token valid 60 s, kept, had the relay's every Event run the plugin, slower than its time at each run, and fail
    (found by a review). Such an answer is none: the next load runs the plugin, not waited on, as after a plugin that
    failed late; one valid longer is taken."""
    expiry = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=valid_s)).strftime("%Y-%m-%dT%H:%M:%SZ")
    credential = {**CREDENTIAL, "status": {"token": "t", "expirationTimestamp": expiry}}
    kubeconfig, hang = exec_kubeconfig(api, tmp_path, credential)
    monkeypatch.setattr(watch, "CREDENTIALS_TIMEOUT_S", 0.3)
    in_times: dict[str, watch.InTime] = {}
    hang.touch()
    with pytest.raises(watch.CredentialsHung):
        watch.load_kubeconfig(str(kubeconfig), in_times)
    hang.unlink()
    (in_time,) = in_times.values()
    wait_for(lambda: in_time._late is not None and in_time._late.done(), "the late answer")
    try:
        assert watch.load_kubeconfig(str(kubeconfig), in_times).api_key["BearerToken"] == "Bearer t"
    except watch.CredentialsHung:
        assert not kept  # the plugin run again, not waited on
    else:
        assert kept
    wait_for(lambda: in_time._held is not None and in_time._held[1].done(), "the load's plugin")
    assert len((tmp_path / "runs").read_text().splitlines()) == (1 if kept else 2)


def test_a_load_begun_and_not_waited_on_is_the_next_loads() -> None:
    """Once a load outlasted its time, the next is begun and not waited on: its answer was thrown away, though a
    token, and the plugin run once more (found by a review). It is kept for the next load of the same files as the
    answer of one given up on is."""

    def failing_late() -> Any:
        time.sleep(0.4)
        return _credentials(None)  # a plugin that failed past its time (kubelogin, nobody at the browser)

    in_time = watch.InTime("a loader", timeout=0.2)
    with pytest.raises(watch.CredentialsHung):
        in_time(failing_late, stamp="as read")
    time.sleep(0.4)  # it returned, past its time, without credentials: the next is not waited on
    begun = _credentials("begun")
    with pytest.raises(watch.CredentialsHung, match="not waited on until it returns in time"):
        in_time(lambda: begun, stamp="as read")
    time.sleep(0.1)  # it answered
    assert in_time(lambda: _credentials("fresh"), stamp="as read") is begun


def test_a_late_answer_whose_reading_raises_leaves_the_loads_after_it_working(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a late answer gave credentials is read in the kubernetes client's internals
    (``_refreshed_at_once``): had that raised (a later client's naive expiry against an aware now), the worker thread
    ended there, its call never answered, and each later load failed as hung, for good and unsaid (found by a
    review). It is then no answer."""

    def raising(cfg: Any) -> bool:
        raise TypeError("can't compare offset-naive and offset-aware datetimes")

    monkeypatch.setattr(watch, "_refreshed_at_once", raising)

    def late() -> Any:
        time.sleep(0.4)
        return _credentials("late")

    in_time = watch.InTime("a loader", timeout=0.2)
    with pytest.raises(watch.CredentialsHung):
        in_time(late, stamp="as read")
    time.sleep(0.4)  # it returned past its time; what it gave could not be read: not waited on once, as no answer
    with pytest.raises(watch.CredentialsHung, match="not waited on until it returns in time"):
        in_time(lambda: _credentials("begun"), stamp="other")
    time.sleep(0.1)  # that one returned in time: the next is waited on and answered
    fresh = _credentials("fresh")
    assert in_time(lambda: fresh, stamp="other") is fresh


def test_an_exec_plugin_that_hangs_at_a_token_refresh_of_a_live_client_is_said(
    api: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The kubernetes client's refresh hook installs itself anew on each call, so the bound put on a new client's
    hook covered its first request only: a plugin that hung at a later token refresh (every ~10 minutes for an EKS
    token) froze the watch for good, unsaid (found by a review). Each refresh of a live client is bounded."""
    live, _, hang = _exec_watch(api, tmp_path, monkeypatch, caplog, EXPIRED)
    try:
        _watching(live, api)
        hang.touch()
        api.drop_watches()  # the same client watches again: its token expired, the plugin runs again
        said = "has not returned in 1s"
        wait_for(lambda: any(said in r.getMessage() for r in caplog.records), "a warning naming the plugin")
        warning = next(r for r in caplog.records if said in r.getMessage())
        assert "cannot watch nodes" in warning.getMessage(), warning.getMessage()
        hang.unlink()
        api.put("v1", "nodes", node("a", driver="570.124.06"))
        wait_for(lambda: drivers(live) == {"a": "570.124.06"}, "the change, once the plugin answered")
        hang.touch()
        caplog.clear()
        api.drop_watches()  # and again on the client made after it hung: each refresh is bounded, not the first
        wait_for(lambda: any(said in r.getMessage() for r in caplog.records), "a warning at the second refresh")
    finally:
        hang.unlink(missing_ok=True)
        live.stop()


def test_an_exec_plugin_that_hangs_at_a_token_refresh_of_the_events_relay_is_said(
    api: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The Events relay's credentials were loaded in time, and its later token refreshes not: a plugin that hung at
    one (every ~10 minutes for an EKS token) held the relay's Event for good, and every Event after it (found by a
    review). Its refreshes are bounded as the node watch's: the Event goes to the log, saying so (it failed, lost,
    where the relay awaiting credentials logged it: found by a review)."""
    from webhook import events
    from webhook.admission import Subject
    from webhook.model import Event

    kubeconfig, hang = exec_kubeconfig(api, tmp_path, EXPIRED)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setattr(watch, "CREDENTIALS_TIMEOUT_S", 1.0)
    sink = events.ApiSink(events.api_client_from_environment())
    pod = Subject("v1", "Pod", "trainer", "", "default", "uid-1")
    body = events.event_body(pod, "default", "trainer", Event("Checked", "CUDA 12.4 fits the node's driver"), "a")
    failed: list[BaseException] = []
    caplog.set_level(logging.INFO, logger=events.log.name)

    def send() -> None:
        try:
            sink.send(body)
        except Exception as err:
            failed.append(err)

    hang.touch()
    try:
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        sender.join(timeout=5)
        assert not sender.is_alive(), "the Event still waiting on the plugin"
        assert failed == []
        said = [r.getMessage() for r in caplog.records if r.name == events.log.name]
        assert any('"object":"Pod/default/trainer"' in line for line in said), said
        assert any("get-token eks get-token` has not returned in 1s" in line for line in said), said
    finally:
        hang.unlink()


def test_a_first_list_slower_than_its_first_wait_is_waited_on_longer(
    kubeconfig: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The first list waited ``FIRST_LIST_READ_S`` at every try: an API server whose list answered after 40 s (a
    loaded one, 10,000 nodes) was asked every 31 s and never listed, the webhook never ready (found by a review). The
    first try waits that long and is said; each next waits twice as long, up to ``LIST_READ_S``."""
    from tests.kubeapi import _Handler

    fault = _Handler._fault

    def slow_lists(self: Any) -> bool:
        if self.command == "GET" and "/nodes" in self.path and "watch=" not in self.path:
            time.sleep(0.8)
        return bool(fault(self))

    monkeypatch.setattr(_Handler, "_fault", slow_lists)
    monkeypatch.setattr(watch, "FIRST_LIST_READ_S", 0.5)
    monkeypatch.setattr(watch, "LIST_READ_S", 3.0)
    live = make_live(kubeconfig)
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    try:
        live.start()
        wait_for(live.ready, "the first list, at its second try")
        warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warned) == 1 and "read timeout=0.5" in warned[0], warned
        assert live._list_read_s() == 3.0, "later lists wait LIST_READ_S"
    finally:
        live.stop()


def test_a_watch_that_opens_and_fails_at_once_is_not_said_to_work_again(
    api: KubeAPI, kubeconfig: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Each watch accepted, then an ERROR 500 on its stream at once (etcd in trouble): each retry logged that the
    watch worked again, then a warning, and /readyz's time failing never went past the backoff (found by a review).
    The watch works again once it brings an event or a bookmark (or stays open ``WATCH_HELD_S``)."""
    from tests.kubeapi import _Handler, _status

    drain = _Handler._drain

    def fails(self: Any, w: Any, timeout: float) -> Iterator[Any]:
        yield {"type": "ERROR", "object": _status(500, "InternalError", "etcdserver: request timed out")}

    api.put("v1", "nodes", node("a"))
    live = make_live(kubeconfig, backoff_initial=0.2, backoff_max=0.2)
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")

    def said(text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if text in r.getMessage()]

    try:
        live.start()
        wait_for(live.ready, "the first list")
        monkeypatch.setattr(_Handler, "_drain", fails)
        api.drop_watches()
        wait_for(lambda: len(said("cannot watch nodes: 500 InternalError")) >= 8, "the failing watches said")
        assert not said("works again"), said("works again")
        problem = live.problem() or ""
        assert re.search(r"for [1-9]\d*s: cannot watch nodes: 500 InternalError", problem), problem
        monkeypatch.setattr(_Handler, "_drain", drain)
        api.put("v1", "nodes", node("b"))
        wait_for(lambda: names(live) == {"a", "b"}, "the watch, once the API server mends")
        assert len(said("works again")) == 1 and live.problem() is None
    finally:
        live.stop()


def test_a_token_refused_names_the_exec_plugin_that_gave_it(
    api: KubeAPI, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A 401 or 403 said only the API's message where the token came from a kubeconfig's exec credential plugin,
    whose own error (an expired SSO session) sits on a separate line, without its command (found by a review). The
    warning names the plugin's command."""
    kubeconfig, _ = exec_kubeconfig(api, tmp_path, CREDENTIAL)
    api.put("v1", "nodes", node("a"))
    api.fail_next(1, 401)
    live = live_cluster_from_environment(Settings(), {"KUBECONFIG": str(kubeconfig)})
    assert live is not None
    live.backoff_initial, live.backoff_max = 0.05, 0.3
    caplog.set_level(logging.INFO, logger="gpu_admission.cluster")
    try:
        live.start()
        wait_for(live.ready, "the first list, once the token is taken")
        (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        plugin = f"the kubeconfig's exec credential plugin `{tmp_path / 'get-token'} eks get-token`"
        assert f"cannot list nodes: HTTP 401 Unauthorized: injected failure (the credentials of {plugin})" in warning
    finally:
        live.stop()


def test_a_load_that_finds_its_plugin_running_for_another_load_fails(
    api: KubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loads sharing ``in_times`` (the Events relay's): a load made while another ran the same plugin in its time
    waited on that one and returned without error, its own configuration never loaded (no server, no token), where
    a caller would take it for loaded (found by a review). It fails, and the first loads."""
    kubeconfig, hang = exec_kubeconfig(api, tmp_path, CREDENTIAL)
    shared: dict[str, watch.InTime] = {}
    loaded: list[Any] = []
    monkeypatch.setattr(watch, "CREDENTIALS_TIMEOUT_S", 5.0)
    hang.touch()
    loading = threading.Thread(target=lambda: loaded.append(watch.load_kubeconfig(str(kubeconfig), shared)))
    loading.start()
    wait_for(lambda: (tmp_path / "runs").exists(), "the first load's plugin")
    answers = threading.Timer(0.5, hang.unlink)  # in the first load's time
    answers.start()
    with pytest.raises(watch.CredentialsHung, match="is running already, for another load"):
        watch.load_kubeconfig(str(kubeconfig), shared)
    answers.join()
    loading.join(timeout=10)
    (first,) = loaded
    assert first.host == api.url and first.api_key

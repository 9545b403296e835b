"""The real server watching a live (in-test) API server: every gunicorn worker follows the Nodes it sees."""

from __future__ import annotations

import os
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.conftest import gpu_node, gpu_pod, review
from tests.kubeapi import KubeAPI
from tests.serving import Server, free_port, serve, wait_ready
from tests.test_chart import FULLNAME, template

CUDA_12_6_IMAGE = "pytorch/pytorch-nightly:2600000-cu12.6"


@pytest.fixture
def api() -> Iterator[KubeAPI]:
    server = KubeAPI().start()
    yield server
    server.stop()


def _allowed_everywhere(server: Server, pod: dict[str, Any], tries: int = 8) -> set[bool]:
    """The answers of several fresh connections (gunicorn spreads them over its workers)."""
    answers = set()
    for _ in range(tries):
        client = server.client()
        status, body = client.post("/validate", review(pod))
        client.close()
        assert status == 200, body
        answers.add(body["response"]["allowed"])
    return answers


def test_workers_follow_the_live_node_list(tmp_path: Path, api: KubeAPI) -> None:
    api.put("v1", "nodes", gpu_node("old-driver"))  # driver 550.54.15: CUDA 12.4
    env = {"KUBECONFIG": api.kubeconfig(str(tmp_path / "kubeconfig")), "KUBERNETES_SERVICE_HOST": ""}
    pod = gpu_pod(image=CUDA_12_6_IMAGE)
    with serve(tmp_path, nodes=None, workers=2, env=env) as server:
        # /readyz answered from one worker; the other may still be starting: it takes no connection before its
        # first list (SYNC_WAIT_S), so until then every answer comes from the first, and checking "every worker"
        # would check one (under a full test run, a second worker once had not listed by the end of this test).
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(re.findall(r"cluster: synced \d+ nodes", server.output())) < 2:
            time.sleep(0.2)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _allowed_everywhere(server, pod) != {False}:
            time.sleep(0.3)
        assert _allowed_everywhere(server, pod) == {False}
        newer = gpu_node(
            "new-driver",
            labels={
                "nvidia.com/cuda.driver-version.full": "560.35.03",
                "nvidia.com/cuda.runtime-version.major": "12",
                "nvidia.com/cuda.runtime-version.minor": "6",
            },
        )
        api.put("v1", "nodes", newer)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _allowed_everywhere(server, pod) != {True}:
            time.sleep(0.3)
        assert _allowed_everywhere(server, pod, tries=12) == {True}, "every worker must see the new node"
        synced = re.findall(r"cluster: synced \d+ nodes", server.output())
        assert len(synced) == 2, f"one watch per worker, each synced: {synced}"


def test_a_worker_takes_no_review_before_its_first_node_list(tmp_path: Path, api: KubeAPI) -> None:
    """The first lists fail (HTTP 500), so each worker's first list comes a few seconds late, after its backoff:
    a worker that took connections meanwhile would answer 'not checked' and admit a pod no node can run."""
    api.put("v1", "nodes", gpu_node("old-driver"))  # driver 550.54.15: CUDA 12.4
    api.fail_next(6)  # three failed lists a worker: 0.5 + 1 + 2 s of backoff, jittered
    env = {"KUBECONFIG": api.kubeconfig(str(tmp_path / "kubeconfig")), "KUBERNETES_SERVICE_HOST": ""}
    pod = gpu_pod(image=CUDA_12_6_IMAGE)
    with serve(tmp_path, nodes=None, workers=2, env=env, wait=False) as server:
        deadline = time.monotonic() + 15
        while True:  # the master listens at once; the workers accept once synced
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the server never listened"
                time.sleep(0.05)
        started = time.monotonic()
        client = server.client(timeout=30)
        status, body = client.post("/validate", review(pod))
        waited = time.monotonic() - started
        assert status == 200, body
        assert body["response"]["allowed"] is False, f"answered before the node list, after {waited:.1f} s: {body}"
        assert _allowed_everywhere(server, pod) == {False}, "every worker synced before it took a connection"


def test_not_ready_until_the_api_server_answers(tmp_path: Path) -> None:
    api = KubeAPI()
    api.port = free_port()  # not listening yet
    env = {"KUBECONFIG": api.kubeconfig(str(tmp_path / "kubeconfig")), "KUBERNETES_SERVICE_HOST": ""}
    with serve(tmp_path, nodes=None, workers=1, env=env, wait=False) as server:
        wait_ready(server, path="/healthz")
        client = server.client()
        status, body = client.request("GET", "/readyz")
        assert status == 503 and "synced" in body["error"]
        api.start()
        api.put("v1", "nodes", gpu_node("n1"))
        try:
            wait_ready(server, deadline_s=40)
        finally:
            api.stop()


def _workers(server: Server) -> list[int]:
    return [int(pid) for pid in re.findall(r"Booting worker with pid: (\d+)", server.output())]


def _readyz_everywhere(server: Server, tries: int = 6) -> list[tuple[int, str]]:
    answers = []
    for _ in range(tries):
        client = server.client()
        status, body = client.request("GET", "/readyz")
        client.close()
        answers.append((status, body.get("error", "")))
    return answers


def test_not_ready_while_any_worker_has_not_listed(tmp_path: Path, api: KubeAPI) -> None:
    """A worker restarted while the API server fails its lists takes no connection for SYNC_WAIT_S, then serves
    unsynced ("not checked"): the kubelet's probe reaches a synced worker, so that one must say not ready too. A
    worker that died before its first list no longer counts (the master drops its mark)."""
    api.put("v1", "nodes", gpu_node("old-driver"))
    env = {"KUBECONFIG": api.kubeconfig(str(tmp_path / "kubeconfig")), "KUBERNETES_SERVICE_HOST": ""}
    with serve(tmp_path, nodes=None, workers=2, env=env) as server:
        deadline = time.monotonic() + 30
        while len(re.findall(r"cluster: synced \d+ nodes", server.output())) < 2:
            assert time.monotonic() < deadline, server.output()[-3000:]
            time.sleep(0.1)
        assert {status for status, _ in _readyz_everywhere(server)} == {200}
        api.fail_next(100_000)  # every list from now on, until cleared
        for round_ in range(2):  # the second kills a worker that never listed
            victim = _workers(server)[-1]
            os.kill(victim, signal.SIGKILL)
            deadline = time.monotonic() + 15
            while len(_workers(server)) < 3 + round_:
                assert time.monotonic() < deadline, server.output()[-3000:]
                time.sleep(0.05)
            fresh = _workers(server)[-1]
            deadline = time.monotonic() + 15  # the fresh worker's first lists fail meanwhile; on a loaded machine
            while True:  # it may take a while to start and leave its mark
                answers = _readyz_everywhere(server)
                named = all(f"worker {fresh} of this server" in error for _, error in answers)
                if ({status for status, _ in answers} == {503} and named) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            assert {status for status, _ in answers} == {503}, answers
            assert named, answers
        api.clear_failures()
        wait_ready(server, deadline_s=40)
        assert {status for status, _ in _readyz_everywhere(server)} == {200}


def _verb(method: str, path: str) -> tuple[str, str, str] | None:
    """(API group, resource, RBAC verb) of a request to the API server; None for discovery (no resource)."""
    parts = urlsplit(path)
    segments = parts.path.strip("/").split("/")
    if segments[0] == "api" and len(segments) > 2:
        group, rest = "", segments[2:]
    elif segments[0] == "apis" and len(segments) > 3:
        group, rest = segments[1], segments[3:]
    else:
        return None
    if rest[0] == "namespaces" and len(rest) > 2:
        rest = rest[2:]
    named = len(rest) > 1
    watch = parse_qs(parts.query).get("watch", ["false"])[0] in ("true", "1")
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    verb = verbs.get(method) or ("watch" if watch else "get" if named else "list")
    return group, rest[0], verb


def test_the_servers_cluster_role_grants_what_it_asks_and_no_more(tmp_path: Path, api: KubeAPI) -> None:
    """Every request the server makes to the API (its node watch, its Events) against the chart's ClusterRole, both
    ways: a verb it uses and the role lacks is a 403 in a cluster; one the role grants and no code uses (it granted
    get on nodes and patch on Events of both API groups) is a permission nobody needs."""
    labels = {
        "nvidia.com/cuda.driver-version.full": "560.35.03",
        "nvidia.com/cuda.runtime-version.major": "12",
        "nvidia.com/cuda.runtime-version.minor": "6",
    }
    api.put("v1", "nodes", gpu_node("new-driver", labels=labels))
    env = {"KUBECONFIG": api.kubeconfig(str(tmp_path / "kubeconfig")), "KUBERNETES_SERVICE_HOST": ""}
    with serve(tmp_path, nodes=None, workers=1, env=env) as server:
        client = server.client()
        for count in (1, 3):  # the same report again once the first is created: its Event's count raised (a patch;
            # two reports the relay reads at once from its pipe would go as one create of count 2)
            if count == 3:  # another replica raised it meanwhile: this raise meets a Conflict, and the count is read
                (made,) = api.list("v1", "events", "default")  # (a get) and raised from 2
                api.put("v1", "events", {**made, "count": 2})
            status, body = client.post("/validate", review(gpu_pod(image=CUDA_12_6_IMAGE), name="trainer"))
            assert status == 200 and body["response"]["allowed"], body
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and [e["count"] for e in api.list("v1", "events", "default")] != [count]:
                time.sleep(0.1)
    used = {found for method, path in api.requests if (found := _verb(method, path))}
    assert {("", "events", "create"), ("", "events", "get"), ("", "events", "patch"), ("", "nodes", "watch")} <= used
    (role,) = [o for o in template() if o["kind"] == "ClusterRole" and o["metadata"]["name"] == FULLNAME]
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == used

"""The benchmark's smoke run (``python -m tests.bench.run --quick``): a few seconds, so that it cannot rot.

No assertion on timing: only that both servers answered every request with a 200 that echoes the uid, and that the
report holds every section and a row for every point measured.
"""

from __future__ import annotations

import json
import re
import select
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.bench import decide, pods, run
from tests.bench import nodes as node_lists
from tests.serving import issue_certs, serve
from webhook import events


def test_wrk_is_installed() -> None:
    # No skipping for a missing tool: `make tools` installs wrk from Debian's packages.
    assert shutil.which("wrk"), "wrk is not installed: run `make tools` (apt-get install wrk)"


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "benchmarks.md"
    out.write_text("# Hand-written\n\nkept as it is\n\n<!-- bench:start -->\nold figures\n<!-- bench:end -->\n\ntail\n")
    code = run.main(["--quick", "--out", str(out), "--json", str(tmp / "bench.json")])
    return code, out, json.loads((tmp / "bench.json").read_text())


def test_every_request_answered_200_with_the_uid(quick):
    code, _, data = quick
    assert code == 0
    points = data["points"]
    assert points
    for p in points:
        where = f"{p['target']} {p['pod']} /{p['endpoint']} at {p['nodes']} nodes"
        assert p["requests"] > 0, where
        assert p["good"] == p["requests"], f"{where}: {p['bad_sample']}"
        assert p["socket_errors"] == 0 and p["status_errors"] == 0, where
        assert p["cpu_us"] > 0, f"{where}: no server CPU measured"
    assert {p["target"] for p in points} == {"baseline", "webhook"}
    assert {a["status"] for a in data["answers"]} == {200}


def test_every_section_and_row_is_in_the_report(quick):
    _, out, data = quick
    text = out.read_text()
    assert text.startswith("# Hand-written\n\nkept as it is\n")
    assert text.rstrip().endswith("tail")
    assert "old figures" not in text
    section = text.split("<!-- bench:start -->")[1].split("<!-- bench:end -->")[0]
    for heading in (
        "### Goals",
        "### Per request",
        "### Every request a new object",
        "### Scaling with nodes",
        "### Scaling with nodes, the decision alone (one process)",
        "### Scaling with containers",
        "### Events: what one costs the worker",
        "### Start and memory",
        "### What the webhook answered",
    ):
        assert heading in section
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    plan = run.QUICK
    main = len(plan.levels) * len(plan.main_pods) * 3  # the baseline, /mutate, /validate
    nodes = len(plan.scaling_pods) * len(plan.scaling_endpoints) * len(plan.node_counts)
    containers = len(plan.containers) * (1 + len(plan.container_endpoints))
    new = len(plan.distinct_pods) * 3
    assert len(data["points"]) == main + nodes + containers + new
    cells = [
        line for line in rows if line.rstrip().endswith(tuple(f"{p['good']}/{p['requests']} |" for p in data["points"]))
    ]
    assert len(cells) == len(data["points"])
    assert len(data["instances"]) == 1 + len(plan.node_counts)
    assert all(i["ready_s"] > 0 and len(i["rss_after_mb"]) == run.WORKERS for i in data["instances"])
    decided = data["node_costs"]
    assert len(decided) == len(plan.scaling_pods) * len(plan.scaling_endpoints) * len(decide.KINDS)
    for c in decided:
        assert sorted(map(int, c["us"])) == sorted(plan.node_counts) and all(us > 0 for us in c["us"].values())
        assert f"| {c['pod']} | /{c['endpoint']} | {decide.KINDS[c['kind']]} | " in section
    fresh, replica, indexed = (next(c for c in decided if c["kind"] == kind) for kind in ("new", "replica", "indexed"))
    assert min(fresh["us"].values()) > max(replica["us"].values()), "a new object runs the policies; a replica not"
    assert min(fresh["us"].values()) > max(indexed["us"].values()), "an Indexed Job's next pod is a replica"
    rates = data["relay_events_per_s"]
    assert len(rates) == 2 and all(rate > 0 for rate in rates.values())
    assert sum(f"| {how} | " in section for how in rates) == 2
    costs = data["event_costs_us"]
    assert len(costs) == 7 and all(us > 0 for us in costs.values())
    assert sum(f"| {sink} | " in section for sink in costs) == 7
    assert [g["met"] for g in data["goals"]][-1] is True  # every request answered


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param("", "# Benchmarks", id="no-file"),
        pytest.param("# Mine\n", "# Mine\n\n<!-- bench:start -->\nnew\n<!-- bench:end -->\n", id="no-markers"),
        pytest.param(
            "a\n<!-- bench:start -->\nold\n<!-- bench:end -->\nb\n",
            "a\n<!-- bench:start -->\nnew\n<!-- bench:end -->\nb\n",
            id="replaced",
        ),
        pytest.param(
            "<!-- soak:start -->\ns\n<!-- soak:end -->\n<!-- bench:start -->\nold\n<!-- bench:end -->\n",
            "<!-- soak:start -->\ns\n<!-- soak:end -->\n<!-- bench:start -->\nnew\n<!-- bench:end -->\n",
            id="other-section-kept",
        ),
    ],
)
def test_write_section_replaces_only_its_own_section(tmp_path, before, after):
    path = tmp_path / "doc.md"
    if before:
        path.write_text(before)
    run.write_section(path, "bench", "new\n")
    text = path.read_text()
    if before:
        assert text == after
    else:
        assert text.startswith(after) and text.rstrip().endswith("<!-- bench:start -->\nnew\n<!-- bench:end -->")


def _counter(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def test_the_load_script_sends_a_new_object_only_where_asked(tmp_path: Path) -> None:
    """The rows of one body measure reused answers; the "+new" rows measure none: read from the server's own
    metrics (gpu_admission_reused_answers_total against gpu_admission_requests_total)."""
    bodies = run.Bodies(tmp_path)
    certs = issue_certs(tmp_path / "certs")
    same, new = bodies.mutate("small"), bodies.mutate("small+new")
    assert pods.SEQ_ANNOTATION in new.read_text() and pods.SEQ_ANNOTATION not in same.read_text()
    assert json.loads(same.read_text())["request"]["uid"] == pods.UID  # renumbered on every request, as all are
    (tmp_path / "server").mkdir()
    with serve(tmp_path / "server", config=run.CONFIG, workers=1, certs=certs) as server:
        base = f"https://127.0.0.1:{server.port}"
        counts = []
        for body in (same, new):
            figures = run.wrk(base, [("/mutate", body)], connections=2, threads=2, seconds=1)
            assert figures["good"] == figures["requests"] > 10
            counts.append(_settled(server.metrics))
    (answered_same, reused_same), (answered_total, reused_total) = counts
    assert answered_total - answered_same >= 10
    assert reused_same >= answered_same - 2  # all but the first (per wrk thread, at worst)
    assert reused_total - reused_same == 0


def _settled(metrics: Callable[[], str]) -> tuple[float, float]:
    """The requests the server has answered and the answers it reused, once it has counted every request: wrk
    stops with requests in flight, which the server answers and counts after wrk has reported (up to
    ``outbox.LINGER_S`` later); read apart, the last of them were counted in the next row's figures."""
    before = None
    for _ in range(100):
        text = metrics()
        now = (_counter(text, "gpu_admission_requests_total{"), _counter(text, "gpu_admission_reused_answers_total{"))
        if now == before:
            return now
        before = now
        time.sleep(0.05)
    raise AssertionError(f"the server's counts never settled: {before}")


def test_replicas_at_validate_are_pods_of_their_own_that_reuse_one_answer(tmp_path: Path) -> None:
    """The /validate body is the pod as the apiserver stored it, renamed on every request: each request is a pod
    of its own (its own CUDAChecked Event under its own name in the server's log), and all but the first reuse
    the first one's answer."""
    certs = issue_certs(tmp_path / "certs")
    (tmp_path / "server").mkdir()
    nodes = node_lists.write_nodes(tmp_path / "nodes.json", 10)
    with serve(tmp_path / "server", nodes=nodes, config=run.CONFIG, workers=1, certs=certs) as server:
        body = run.Bodies(tmp_path).validate("small", run.Instance("webhook", 10, server, 0.0))
        stored = json.loads(body.read_text())
        assert (
            stored["request"]["name"]
            == stored["request"]["object"]["metadata"]["name"]
            == "triton-7c9f5d8b6d-" + pods.SEQ_TOKEN
        )
        assert stored["request"]["object"]["metadata"]["uid"].endswith(pods.SEQ_TOKEN)
        figures = run.wrk(
            f"https://127.0.0.1:{server.port}", [("/validate", body)], connections=2, threads=2, seconds=1
        )
        assert figures["good"] == figures["requests"] > 10
        answered, reused = _settled(server.metrics)
        assert answered >= figures["requests"]
        assert reused >= answered - 2
        deadline = time.monotonic() + 10
        while True:
            names = set(
                re.findall(
                    r'"event":"CUDAChecked".*?"object":"Pod/[a-z-]+/(triton-7c9f5d8b6d-seq-\d{10})"', server.output()
                )
            )
            dropped = _counter(server.metrics(), 'gpu_admission_events_total{result="dropped"')
            if len(names) + dropped >= figures["requests"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        # One per request (and per request still in flight when wrk stopped counting, one per connection at most);
        # an Event the relay's pipe had no room for is dropped and counted, by design (a slow relay never holds a
        # request up). How many depends on what else runs on the cores (the relay runs under SCHED_IDLE: 880 of
        # 1,971 on a machine busy with other work); a full pipe holds at least this many, each line a whole write.
        assert figures["requests"] <= len(names) + dropped and len(names) <= figures["requests"] + 2
        assert len(names) >= min(figures["requests"], events.PIPE_BYTES // select.PIPE_BUF)


def test_rounds_take_the_rows_in_one_order_then_the_other() -> None:
    assert [list(run.turns(3, turn)) for turn in range(4)] == [[0, 1, 2], [2, 1, 0], [0, 1, 2], [2, 1, 0]]
    assert list(run.turns(1, 1)) == [0] and list(run.turns(0, 0)) == []


def test_a_row_of_rounds_keeps_its_median_round_and_the_median_of_its_ratios() -> None:
    def point(rps: float, p99: float, good: int, bad: int = 0, cpu: float = 500.0) -> run.Point:
        return run.Point(
            "main",
            "webhook",
            10,
            "small",
            "mutate",
            4,
            1,
            2,
            requests=good + bad,
            rps=rps,
            p99=p99,
            good=good,
            bad=bad,
            cpu_us=cpu,
        )

    reference = [point(1000, 4.0, 100, cpu=400), point(2000, 2.0, 200, cpu=500), point(1500, 3.0, 150, cpu=600)]
    rounds = [
        point(900, 5.0, 90, cpu=480),
        point(1000, 3.0, 99, bad=1, cpu=1000),
        point(1400, 3.3, 140, cpu=660),
    ]  # req/s ratios 0.9, 0.5, 0.93; CPU ratios 1.2, 2.0, 1.1
    row = run.merged(rounds, reference)
    assert row.rps == 1000 and row.p99 == 3.0  # the round of median req/s
    assert row.ratio == pytest.approx(0.9)  # the median of 0.9, 0.5 and 0.93
    assert row.p99_ratio == pytest.approx(1.25)  # of 1.25, 1.5 and 1.1
    assert row.cpu_ratio == pytest.approx(1.2)  # of 1.2, 2.0 and 1.1
    assert row.cpu_us == 660  # the median round's CPU, not the median req/s round's
    assert (row.requests, row.good, row.bad, row.rounds_rps) == (330, 329, 1, [900, 1000, 1400])
    assert row.answered == "**329/330**"


def test_the_server_cpu_counts_the_processes_under_it() -> None:
    """A busy grandchild's CPU (the Events relay is the master's grandchild) counts in ``server_cpu_s``."""
    import os
    import signal
    import subprocess
    import sys

    spin = "import time\nend = time.process_time() + 0.5\nwhile time.process_time() < end: pass\ntime.sleep(60)\n"
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {spin!r}])"],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        used = 0.0
        while time.monotonic() < deadline and used < 0.5:
            used = run.server_cpu_s(parent.pid)
            time.sleep(0.05)
        assert used >= 0.5, f"{used:.2f} s of CPU seen under pid {parent.pid}"
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()

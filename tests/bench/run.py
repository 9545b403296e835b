"""The webhook's cost on the path of every pod create, measured against a no-op baseline on the same stack.

    python -m tests.bench.run --out docs/benchmarks.md [--quick] [--json results.json]

Starts the real server (``gpu-admission serve``: gunicorn, gthread, TLS, one worker, ``examples/config.yaml``, a
generated node list) at each node count, and the no-op baseline (``tests.bench.noop``) on the same
GunicornServer/TLS stack; drives each with keep-alive HTTPS load from ``wrk`` (a separate process; Lua script
``wrk/review.lua`` checks every answer is a 200 echoing the uid); writes the tables between the markers
``<!-- bench:start -->`` and ``<!-- bench:end -->`` of the output file, leaving the rest of it as it is.

The /validate body is the pod as /mutate left it (the server's own patch applied), as the apiserver sends it.
The baseline is measured with each pod's /mutate body at each concurrency (its /validate is the same code).
Exit status 1 when any request failed (a socket error, a non-200, an answer without the uid).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import dataclasses
import http.client
import json
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import jsonpatch

from tests.bench import nodes as node_lists
from tests.bench import pods
from tests.bench.decide import NodeCost, node_costs
from tests.bench.events import event_costs, relay_rates
from tests.serving import REPO, Server, issue_certs, serve, wait_ready
from webhook.events import RELAY_NAME
from webhook.server import THREADS

HERE = Path(__file__).resolve().parent
LUA = HERE / "wrk" / "review.lua"
CONFIG = REPO / "examples" / "config.yaml"
WORKERS = 1
"""One gunicorn worker per server: on two cores shared with wrk, two workers split keep-alive connections unevenly
(4+0 or 3+1, by chance), which moved whole rows by 2x and hid what the webhook itself costs. One worker and wrk get a
core each; the ratio to the baseline (also one worker) is the figure that carries over to a cluster."""
READY_DEADLINE_S = 1800.0
RELAY_ROUND_TRIP_S = 0.005
"""The API server's answer time for the relay's rate: an apiserver a few milliseconds away, as across zones."""

# Goals (issue 9).
GOAL_THROUGHPUT = 0.80
GOAL_P99_MS = 5.0
GOAL_NODE_COST = 1.2
GOAL_RSS_MB = 150.0


@dataclass(frozen=True)
class Plan:
    seconds: int
    levels: tuple[tuple[int, int], ...]
    """(connections, wrk threads)."""
    node_counts: tuple[int, ...]
    main_nodes: int
    main_pods: tuple[str, ...]
    scaling_pods: tuple[str, ...]
    scaling_endpoints: tuple[str, ...]
    scaling_level: tuple[int, int]
    containers: tuple[int, ...]
    container_endpoints: tuple[str, ...]
    distinct_pods: tuple[str, ...]
    """Pods also sent as a new object on every request (no reused answer): the first replica's cost."""
    warmup_s: int
    quick: bool
    decide_rounds: int = 1
    """Rounds of the in-process decision figures at each node count (``tests/bench/decide.py``)."""
    rounds: int = 1
    """Each group of rows (a pod's baseline, /mutate and /validate; a pod at each node count) is measured this many
    times in turn, ``seconds`` a row each time: the machine's speed drifts, and a ratio is read within one round."""


FULL = Plan(
    seconds=2,
    levels=((1, 1), (4, 1), (16, 2)),
    node_counts=(10, 1_000, 10_000),
    main_nodes=1_000,
    main_pods=("small", "training", "fixture"),
    scaling_pods=("small", "training", "pinned"),
    scaling_endpoints=("mutate", "validate"),
    scaling_level=(4, 1),
    containers=(1, 10, 50),
    container_endpoints=("mutate", "validate"),
    distinct_pods=("small", "training", "fixture"),
    warmup_s=2,
    quick=False,
    rounds=5,
    decide_rounds=7,
)
QUICK = Plan(
    seconds=1,
    levels=((4, 1),),
    node_counts=(10, 50),
    main_nodes=10,
    main_pods=("small", "training", "fixture"),
    scaling_pods=("small",),
    scaling_endpoints=("mutate",),
    scaling_level=(4, 1),
    containers=(1, 50),
    container_endpoints=("mutate",),
    distinct_pods=("small",),
    warmup_s=0,
    quick=True,
)


@dataclass
class Point:
    """One wrk run and what it measured (latencies in milliseconds)."""

    section: str
    target: str
    """'webhook' or 'baseline'."""
    nodes: int
    pod: str
    endpoint: str
    connections: int
    threads: int
    seconds: int
    requests: int = 0
    rps: float = 0.0
    p50: float = 0.0
    p90: float = 0.0
    p99: float = 0.0
    max: float = 0.0
    mean: float = 0.0
    good: int = 0
    bad: int = 0
    bad_sample: str = ""
    socket_errors: int = 0
    status_errors: int = 0
    spread: str = ""
    """Established connections per gunicorn worker during the run (e.g. '4+0': all on one worker)."""
    cpu_us: float = 0.0
    """CPU time of the server's processes (master, workers, Events relay: ``server_cpu_s``) per request answered,
    in microseconds. With one CPU-bound worker it tracks 1/req/s (``docs/benchmarks.md``, 30.): it says what the
    server spends, not a steadier figure."""
    rounds_rps: list[float] = field(default_factory=list)
    ratio: float | None = None
    """req/s against the group's reference row (the baseline; the fewest nodes): the median of the rounds' ratios."""
    p99_ratio: float | None = None
    cpu_ratio: float | None = None
    """``cpu_us`` against the group's reference row: the median of the rounds' ratios."""

    @property
    def failed(self) -> int:
        return self.bad + self.socket_errors

    @property
    def answered(self) -> str:
        return f"{self.good}/{self.requests}" if not self.failed else f"**{self.good}/{self.requests}**"


@dataclass
class Instance:
    """A running server and what was measured about it outside the load."""

    name: str
    nodes: int
    server: Server
    ready_s: float
    node_list_mb: float = 0.0
    rss_ready_mb: list[float] = field(default_factory=list)
    rss_after_mb: list[float] = field(default_factory=list)
    master_rss_mb: float = 0.0

    @property
    def base(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"


@dataclass
class Answer:
    """What the server answered one verified request (the apiserver's view of one review)."""

    pod: str
    endpoint: str
    nodes: int
    status: int
    allowed: bool
    patch_ops: int
    warnings: int
    message: str


# ---------------------------------------------------------------------------------------------------------------
# Processes


def _kids(pid: int) -> list[int]:
    """The processes ``pid`` started (any of its threads): ``/proc/<pid>/task/*/children``, or, on a kernel without
    those files, every process whose parent is ``pid``."""
    kids: list[int] = []
    listed = False
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError, ValueError):
                kids += [int(k) for k in (task / "children").read_text().split()]
                listed = True
    if listed:
        return kids
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(stat.parent.name))
    return kids


def children(pid: int) -> list[int]:
    """The gunicorn workers of the master ``pid``: its children but the Events relay('s keeper)."""
    return [k for k in _kids(pid) if _comm(k) != RELAY_NAME]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _tree(pid: int) -> list[int]:
    """``pid`` and every process under it (the master, its workers, the relay's keeper and the relay)."""
    found, todo = [], [pid]
    while todo:
        at = todo.pop()
        found.append(at)
        todo += _kids(at)
    return found


def server_cpu_s(pid: int) -> float:
    """User and system CPU seconds used so far by the server ``pid`` and the processes under it (``/proc/*/stat``:
    every thread, ended ones included; in clock ticks, 10 ms, a percent of a 2 s row at one core)."""
    ticks = 0
    for at in _tree(pid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{at}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    return ticks / CLOCK_TICKS


def rss_mb(pid: int) -> float:
    """VmRSS of a process in MB (10^6 bytes); 0 when it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e6
    except OSError:
        pass
    return 0.0


def _established_inodes(port: int) -> set[str]:
    inodes: set[str] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "01":
                    inodes.add(fields[9])
    return inodes


def connection_spread(server: Server) -> list[int]:
    """How many established connections to the server each worker holds, most first."""
    inodes = _established_inodes(server.port)
    counts = []
    for pid in children(server.proc.pid):
        n = 0
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    link = os.readlink(fd)
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        n += 1
        counts.append(n)
    return sorted(counts, reverse=True)


def worker_rss(server: Server) -> dict[int, float]:
    return {pid: rss_mb(pid) for pid in sorted(children(server.proc.pid))}


def serve_noop(
    tmp: Path, certs: Path, workers: int = WORKERS, wait: bool = True
) -> contextlib.AbstractContextManager[Server]:
    """The no-op baseline on free loopback ports until the block ends (SIGTERM, then SIGKILL)."""
    tmp.mkdir(parents=True, exist_ok=True)
    return serve(tmp, nodes=None, workers=workers, certs=certs, wait=wait, command=("tests.bench.noop",))


def start(stack: contextlib.ExitStack, name: str, count: int, tmp: Path, certs: Path) -> Instance:
    """Start one server and time it from the process start to its first 200 on /readyz."""
    work = tmp / name
    work.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    if name == "baseline":
        server = stack.enter_context(serve_noop(work, certs, wait=False))
    else:
        node_file = node_lists.write_nodes(work / "nodes.json", count)
        began = time.monotonic()
        server = stack.enter_context(
            serve(work, nodes=node_file, config=CONFIG, workers=WORKERS, certs=certs, wait=False)
        )
    wait_ready(server, deadline_s=READY_DEADLINE_S)
    ready = time.monotonic() - began
    instance = Instance(name, count, server, ready)
    if name != "baseline":
        instance.node_list_mb = node_file.stat().st_size / 1e6
    instance.rss_ready_mb = list(worker_rss(server).values())
    return instance


# ---------------------------------------------------------------------------------------------------------------
# Load


def wrk(
    base: str,
    bodies: Sequence[tuple[str, Path]],
    connections: int,
    threads: int,
    seconds: int,
    server: Server | None = None,
    spread: list[int] | None = None,
) -> dict[str, Any]:
    """One wrk run; the figures its Lua ``done`` printed. With ``server``, the connections per worker are counted
    into ``spread`` a moment after the start."""
    exe = shutil.which("wrk")
    if exe is None:
        raise SystemExit("wrk not found: install it (make tools does, from Debian's packages)")
    args = [
        exe,
        f"-t{threads}",
        f"-c{connections}",
        f"-d{seconds}s",
        "--timeout",
        "5s",
        "-s",
        str(LUA),
        base,
        "--",
        pods.ECHOED,
        *(f"{path}={file}" for path, file in bodies),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        if server is not None and spread is not None:
            time.sleep(min(1.0, seconds / 2))
            spread[:] = connection_spread(server)
        stdout, stderr = proc.communicate(timeout=seconds + 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for line in stdout.splitlines():
        if line.startswith("BENCH_JSON "):
            figures: dict[str, Any] = json.loads(line[len("BENCH_JSON ") :])
            return figures
    raise RuntimeError(f"wrk printed no figures (exit {proc.returncode}):\n{stdout}\n{stderr}")


def turns(rows: int, turn: int) -> range:
    """The order of a group's rows in round ``turn``: first to last, then last to first, and so on. The machine's
    speed drifts within a round as well: in one order only, the last row was always measured farthest from the
    reference row (the first), and a drift that way or the other went into its ratio every round."""
    return range(rows) if turn % 2 == 0 else range(rows - 1, -1, -1)


def merged(points: Sequence[Point], reference: Sequence[Point]) -> Point:
    """One row from its rounds: the figures of the round with the median req/s, the answers of all rounds added
    up, and the ratios to the reference row as the median of the rounds' own ratios (each round measured the row
    and its reference a few seconds apart)."""
    ranked = sorted(points, key=lambda p: p.rps)
    row = dataclasses.replace(ranked[len(ranked) // 2])
    row.rounds_rps = [p.rps for p in points]
    for name in ("requests", "good", "bad", "socket_errors", "status_errors"):
        setattr(row, name, sum(getattr(p, name) for p in points))
    row.bad_sample = next((p.bad_sample for p in points if p.bad_sample), "")
    if all(q.rps and q.p99 for q in reference):
        row.ratio = statistics.median(p.rps / q.rps for p, q in zip(points, reference, strict=True))
        row.p99_ratio = statistics.median(p.p99 / q.p99 for p, q in zip(points, reference, strict=True))
    if all(q.cpu_us for q in reference) and all(p.cpu_us for p in points):
        row.cpu_us = statistics.median(p.cpu_us for p in points)
        row.cpu_ratio = statistics.median(p.cpu_us / q.cpu_us for p, q in zip(points, reference, strict=True))
    return row


def measure(point: Point, server: Server, bodies: Sequence[tuple[str, Path]]) -> Point:
    spread: list[int] = []
    base = f"https://127.0.0.1:{server.port}"
    cpu = server_cpu_s(server.proc.pid)
    f = wrk(base, bodies, point.connections, point.threads, point.seconds, server, spread)
    cpu = server_cpu_s(server.proc.pid) - cpu
    point.spread = "+".join(str(n) for n in spread)
    lat = f["latency_us"]
    errors = f["errors"]
    point.requests = f["requests"]
    point.rps = f["requests"] / (f["duration_us"] / 1e6) if f["duration_us"] else 0.0
    point.p50, point.p90, point.p99 = lat["p50"] / 1000, lat["p90"] / 1000, lat["p99"] / 1000
    point.max, point.mean = lat["max"] / 1000, lat["mean"] / 1000
    point.good, point.bad, point.bad_sample = f["good"], f["bad"], f["bad_sample"]
    point.socket_errors = errors["connect"] + errors["read"] + errors["write"] + errors["timeout"]
    point.status_errors = errors["status"]
    point.cpu_us = cpu / point.requests * 1e6 if point.requests else 0.0
    print(
        f"  {point.target:8} {point.nodes:>6} nodes {point.pod:12} /{point.endpoint:8} c={point.connections:<3}"
        f" {point.rps:8.0f} req/s  {point.cpu_us:5.0f} us CPU  p50 {point.p50:6.2f}  p99 {point.p99:6.2f}"
        f"  max {point.max:7.2f} ms"
        f"  {point.good}/{point.requests} good, per worker {point.spread}",
        flush=True,
    )
    return point


# ---------------------------------------------------------------------------------------------------------------
# Bodies


class Bodies:
    """AdmissionReview files for each pod: /mutate gets the pod, /validate gets the pod as /mutate left it and the
    apiserver then stored it (a name of its own per request, a uid, a creation time: ``pods.stored``)."""

    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "bodies"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.answers: list[Answer] = []
        self._mutated: dict[tuple[str, int], Path] = {}

    def mutate(self, name: str) -> Path:
        path = self.dir / f"{name}.mutate.json"
        if not path.exists():
            pods.write_body(path, pods.named(name))
        return path

    def validate(self, name: str, instance: Instance) -> Path:
        key = (name, instance.nodes)
        if key not in self._mutated:
            pod = pods.named(name)
            _, body = self._ask(instance, "/mutate", pod, name)
            response = body.get("response", {}) if isinstance(body, dict) else {}
            if response.get("patch"):
                patch = json.loads(base64.b64decode(response["patch"]))
                pod = jsonpatch.apply_patch(pod, patch)
            pod = pods.stored(pod)
            path = self.dir / f"{name}.validate.{instance.nodes}.json"
            pods.write_body(path, pod)
            self._ask(instance, "/validate", pod, name)
            self._mutated[key] = path
        return self._mutated[key]

    def body(self, name: str, endpoint: str, instance: Instance) -> Path:
        return self.validate(name, instance) if endpoint == "validate" else self.mutate(name)

    def _ask(self, instance: Instance, path: str, pod: dict[str, Any], name: str) -> tuple[int, Any]:
        """One request the way kube-apiserver makes it (CA-verified TLS, server name <svc>.<ns>.svc)."""
        client = instance.server.client(timeout=30)
        try:
            status, body = client.post(path, pods.admission_review(pod))
        except (OSError, http.client.HTTPException) as err:
            status, body = 0, {"error": str(err)}
        finally:
            client.close()
        response = body.get("response", {}) if isinstance(body, dict) else {}
        patch = json.loads(base64.b64decode(response["patch"])) if response.get("patch") else []
        message = (response.get("status") or {}).get("message", "") if isinstance(response, dict) else ""
        self.answers.append(
            Answer(
                name,
                path.strip("/"),
                instance.nodes,
                status,
                bool(response.get("allowed")),
                len(patch),
                len(response.get("warnings") or []),
                message,
            )
        )
        return status, body


# ---------------------------------------------------------------------------------------------------------------
# The run


@dataclass
class Results:
    plan: Plan
    machine: dict[str, str]
    points: list[Point] = field(default_factory=list)
    instances: list[Instance] = field(default_factory=list)
    answers: list[Answer] = field(default_factory=list)
    event_costs: list[tuple[str, float]] = field(default_factory=list)
    """(sink, µs of the sending thread's CPU per Event)."""
    relay_rates: list[tuple[str, float]] = field(default_factory=list)
    """(how, Events a second the relay sends to an API server RELAY_ROUND_TRIP_S away)."""
    node_costs: list[NodeCost] = field(default_factory=list)
    """The decision's CPU at each node count, in one process."""
    total_s: float = 0.0


def machine() -> dict[str, str]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    wrk_version = "not found"
    if shutil.which("wrk"):
        out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, timeout=10)
        text = (out.stdout or out.stderr).strip()
        wrk_version = text.splitlines()[0].split(" Copyright")[0] if text else "?"
    versions = {}
    for module in ("gunicorn", "flask", "werkzeug"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[module] = version(module)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return {
        "cpus": str(os.cpu_count() or "?"),
        "nproc": subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip() or "?",
        "cpu": cpu,
        "memory": memory,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "packages": ", ".join(f"{k} {v}" for k, v in versions.items()),
        "wrk": wrk_version,
        "commit": commit.stdout.strip() or "?",
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def run(plan: Plan, tmp: Path) -> Results:
    began = time.monotonic()
    results = Results(plan, machine())
    certs = issue_certs(tmp / "certs")
    bodies = Bodies(tmp)
    with contextlib.ExitStack() as stack:
        print("starting the no-op baseline", flush=True)
        baseline = start(stack, "baseline", 0, tmp, certs)
        results.instances.append(baseline)
        servers: dict[int, Instance] = {}
        for count in plan.node_counts:
            print(f"starting the webhook with {count} nodes", flush=True)
            servers[count] = start(stack, f"webhook-{count}", count, tmp, certs)
            results.instances.append(servers[count])
            print(f"  ready in {servers[count].ready_s:.1f} s; workers {servers[count].rss_ready_mb} MB", flush=True)
        main = servers[plan.main_nodes]

        if plan.warmup_s:
            for inst in (baseline, *servers.values()):
                wrk(inst.base, [("/mutate", bodies.mutate("small"))], 4, 1, plan.warmup_s)

        def one(section: str, inst: Instance, pod: str, endpoint: str, level: tuple[int, int]) -> Point:
            target = "baseline" if inst is baseline else "webhook"
            p = Point(section, target, inst.nodes, pod, endpoint, level[0], level[1], plan.seconds)
            body = bodies.mutate(pod) if inst is baseline else bodies.body(pod, endpoint, inst)
            return measure(p, inst.server, [(f"/{endpoint}", body)])

        def group(section: str, rows: Sequence[tuple[Instance, str, str]], level: tuple[int, int]) -> None:
            """Measure ``rows`` in ``plan.rounds`` rounds, each row once per round; the first row is the reference."""
            runs: list[list[Point]] = [[] for _ in rows]
            for turn in range(plan.rounds):
                for i in turns(len(rows), turn):
                    inst, pod, endpoint = rows[i]
                    runs[i].append(one(section, inst, pod, endpoint, level))
            results.points.extend(merged(points, runs[0]) for points in runs)

        print("per pod, per endpoint, per concurrency", flush=True)
        for level in plan.levels:
            for pod in plan.main_pods:
                group("main", [(baseline, pod, "mutate"), (main, pod, "mutate"), (main, pod, "validate")], level)

        print("scaling with nodes", flush=True)
        for pod in plan.scaling_pods:
            for endpoint in plan.scaling_endpoints:
                group("nodes", [(servers[count], pod, endpoint) for count in plan.node_counts], plan.scaling_level)

        print("every request a new object", flush=True)
        for pod in plan.distinct_pods:
            new = f"{pod}+new"
            group(
                "new", [(baseline, new, "mutate"), (main, new, "mutate"), (main, new, "validate")], plan.scaling_level
            )

        print("scaling with containers", flush=True)
        for n in plan.containers:
            name = f"containers-{n}"
            rows = [(baseline, name, "mutate"), *((main, name, endpoint) for endpoint in plan.container_endpoints)]
            group("containers", rows, plan.scaling_level)

        for inst in results.instances:
            inst.rss_after_mb = list(worker_rss(inst.server).values())
            inst.master_rss_mb = rss_mb(inst.server.proc.pid)
        results.answers = bodies.answers
    print("the decision at each node count, in one process", flush=True)
    results.node_costs = node_costs(
        plan.node_counts, plan.scaling_pods, plan.scaling_endpoints, plan.decide_rounds, CONFIG
    )
    print("the CPU of one Event, per sink", flush=True)
    results.event_costs = event_costs(50 if plan.quick else 300)
    print("the relay's Events a second to a distant API server", flush=True)
    results.relay_rates = relay_rates(RELAY_ROUND_TRIP_S, 40 if plan.quick else 400)
    results.total_s = time.monotonic() - began
    return results


# ---------------------------------------------------------------------------------------------------------------
# The report


def _n(count: int) -> str:
    return f"{count:,}"


HEAD = "req/s | × baseline | CPU µs | CPU × baseline | p50 | p90 | p99 | max | p99 × baseline | good |"


def _baseline_table(
    r: Results, section: str, first: str, label: Callable[[Point], str], conn: bool = False
) -> list[str]:
    """A table of ``section``'s rows with req/s and p99 as ratios to the baseline row of their group
    (``Point.ratio``): ``first`` heads the column that ``label`` fills; ``conn`` adds the connections."""
    align = "--:" if first == "containers" else "---"
    lines = [
        f"| {first} | endpoint |{' conn |' if conn else ''} per worker | {HEAD}",
        f"|{align}|---|{'--:|' if conn else ''}--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for p in (p for p in r.points if p.section == section):
        if p.target == "baseline":
            endpoint, rps, cpu, p99 = "no-op", "1", "1", "1"
        else:
            endpoint = f"/{p.endpoint}"
            rps = f"{p.ratio:.2f}" if p.ratio is not None else "-"
            cpu = f"{p.cpu_ratio:.2f}" if p.cpu_ratio is not None else "-"
            p99 = f"{p.p99_ratio:.2f}" if p.p99_ratio is not None else "-"
        connections = f" {p.connections} |" if conn else ""
        lines.append(
            f"| {label(p)} | {endpoint} |{connections} {p.spread} | {p.rps:,.0f} | {rps} | {p.cpu_us:,.0f} | {cpu} | "
            f"{p.p50:.2f} | "
            f"{p.p90:.2f} | {p.p99:.2f} | {p.max:.2f} | {p99} | {p.answered} |"
        )
    return lines


def _worst_ratio(r: Results, section: str) -> tuple[float, Point] | None:
    """The webhook row of ``section`` with the lowest req/s against its baseline row."""
    worst: tuple[float, Point] | None = None
    for p in r.points:
        if (
            p.section == section
            and p.target == "webhook"
            and p.ratio is not None
            and (worst is None or p.ratio < worst[0])
        ):
            worst = (p.ratio, p)
    return worst


Row = TypeVar("Row")


def _at_most_goal(
    goal: str, ratios: Sequence[tuple[float, Row]], where: Callable[[Row], str]
) -> list[tuple[str, str, bool | None]]:
    """The goal row for the largest of ``ratios`` (cost against the fewest nodes), none when nothing was measured."""
    if not ratios:
        return []
    ratio, row = max(ratios, key=lambda x: x[0])
    return [(goal, f"worst {ratio:.2f}x ({where(row)})", ratio <= GOAL_NODE_COST)]


def goals(r: Results) -> list[tuple[str, str, bool | None]]:
    plan = r.plan
    out: list[tuple[str, str, bool | None]] = []
    for section, rows in (("main", "every row of the first table"), ("new", "every request a new object")):
        worst = _worst_ratio(r, section)
        if worst:
            ratio, p = worst
            out.append(
                (
                    f"throughput >= {GOAL_THROUGHPUT:.0%} of the no-op baseline ({rows})",
                    f"worst {ratio:.0%} ({p.pod.partition('+')[0]} /{p.endpoint}, {p.connections} connections)",
                    ratio >= GOAL_THROUGHPUT,
                )
            )
    small4 = [
        p for p in r.points if p.section == "main" and p.target == "webhook" and p.pod == "small" and p.connections == 4
    ]
    if small4:
        high = max(small4, key=lambda p: p.p99)
        out.append(
            (
                f"p99 < {GOAL_P99_MS:g} ms at 4 keep-alive connections, small pod",
                f"{high.p99:.2f} ms (/{high.endpoint})",
                high.p99 < GOAL_P99_MS,
            )
        )
    low, high_count = min(plan.node_counts), max(plan.node_counts)
    decided = [(c.ratio[high_count], c) for c in r.node_costs if high_count in c.ratio]
    out += _at_most_goal(
        f"cost at {_n(high_count)} nodes within {GOAL_NODE_COST}x of {_n(low)} nodes (the decision's CPU per "
        "request, in one process, replicas, Indexed Job pods and new objects)",
        decided,
        lambda c: f"{c.pod} /{c.endpoint}, {c.requests}",
    )
    ended = [(p.cpu_ratio, p) for p in r.points if p.section == "nodes" and p.nodes == high_count and p.cpu_ratio]
    out += _at_most_goal(
        f"the same, end to end (the server's CPU per request at {_n(high_count)} / at {_n(low)}: three servers, the "
        "cores shared with wrk)",
        ended,
        lambda p: f"{p.pod} /{p.endpoint}; req/s {f'{1 / p.ratio:.2f}x' if p.ratio else '-'}",
    )
    big = next((i for i in r.instances if i.name == f"webhook-{high_count}"), None)
    if big and big.rss_after_mb:
        top = max(big.rss_after_mb)
        out.append(
            (
                f"RSS per worker < {GOAL_RSS_MB:g} MB at {_n(high_count)} nodes",
                f"{top:.0f} MB (largest worker)",
                top < GOAL_RSS_MB,
            )
        )
    failed = sum(p.failed for p in r.points)
    out.append(("every request answered 200 with the uid echoed", f"{failed} failed", failed == 0))
    return out


def markdown(r: Results) -> str:
    plan, m = r.plan, r.machine
    lines: list[str] = []
    add = lines.append
    mode = "quick smoke run (figures not meaningful)" if plan.quick else "full run"
    add(
        f"_Generated by `python -m tests.bench.run{' --quick' if plan.quick else ''}` ({mode}) on {m['date']}, "
        f"commit {m['commit']}, in {r.total_s / 60:.1f} minutes._"
    )
    add("")
    add(
        f"Machine: {m['nproc']} CPUs (nproc), {m['cpu']}, {m['memory']} memory, Python {m['python']}, "
        f"Linux {m['kernel']}, {m['packages']}, {m['wrk']}. Load average at start: {m['load']} "
        f"(the machine is shared; wrk runs on the same cores as the servers)."
    )
    add("")
    add(
        f"Servers: {WORKERS} gunicorn gthread worker(s) × {THREADS} request threads taking turns "
        "(`webhook/workers.py`), TLS 1.2+, keep-alive, settings "
        f"`examples/config.yaml`. wrk: `--timeout 5s`, one AdmissionReview body per row, {plan.seconds} s a row in "
        f"each of {plan.rounds} rounds: the rows of a group (a pod's baseline, /mutate and /validate; a pod at each "
        "node count) take turns, round after round, in one order and then in the other. A row shows the round of "
        "median req/s (its answers: all rounds added up), and its ratios are the medians of the rounds' ratios to the "
        "group's first row, each measured a few seconds apart: this machine's speed drifts by more than the "
        "differences measured."
    )
    add("")
    add("### Goals")
    add("")
    add("| goal | figure | |")
    add("|---|---|---|")
    for goal, figure, met in goals(r):
        add(f"| {goal} | {figure} | {'met' if met else 'not met'} |")
    add("")

    add(f"### Per request at {_n(plan.main_nodes)} nodes")
    add("")
    add(
        "One body per row, sent again and again (the replicas of one workload: answers reused from the second on). "
        "Ratios are to the no-op baseline with the same pod body and connections (req/s: higher is better; "
        "CPU and latency: lower is better). _CPU µs_: the server's CPU time per request (its master, worker and "
        "Events relay together, from `/proc`), the median of the rounds. Latencies in ms. _Per worker_: the "
        "established connections each gunicorn "
        "worker held a second into the row (`4+0`: all on one worker, which then serves them alone, on one core)."
    )
    add("")
    lines += _baseline_table(r, "main", "pod", lambda p: p.pod, conn=True)
    add("")
    shown = (*plan.main_pods, *plan.scaling_pods)
    add("Pods: " + "; ".join(f"`{k}`: {v}" for k, v in pods.DESCRIPTIONS.items() if k in shown) + ".")
    add("")

    add(f"### Every request a new object ({_n(plan.main_nodes)} nodes, {plan.scaling_level[0]} connections)")
    add("")
    add(
        "The rows above send one body again and again, as the replicas of one workload reach the webhook: from the "
        "second replica on, the webhook reuses its answer (`webhook/decisions.py`). Here the load script writes a "
        "new number into an annotation of every request, so each one is an object never answered before: what the "
        "first pod of each workload costs."
    )
    add("")
    lines += _baseline_table(r, "new", "pod", lambda p: p.pod.partition("+")[0])
    add("")

    low = min(plan.node_counts)
    add(f"### Scaling with nodes ({plan.scaling_level[0]} connections)")
    add("")
    add(
        f"Cost = the server's CPU per request at this count / at {_n(low)} nodes (1.00: no dearer per request; "
        "_CPU µs_: its master, worker and Events relay together, from `/proc`); _req/s vs "
        f"{_n(low)}_: req/s at {_n(low)} nodes / req/s at this count, which also moves with how wrk and the server "
        "happened to share the cores. Both are medians of the rounds' ratios."
    )
    add("")
    add(
        "| pod | endpoint | nodes | per worker | req/s | p50 | p90 | p99 | max | CPU µs | cost vs "
        f"{_n(low)} | req/s vs {_n(low)} | good |"
    )
    add("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for p in (p for p in r.points if p.section == "nodes"):
        cost = f"{p.cpu_ratio:.2f}" if p.cpu_ratio else "-"
        by_rps = f"{1 / p.ratio:.2f}" if p.ratio else "-"
        add(
            f"| {p.pod} | /{p.endpoint} | {_n(p.nodes)} | {p.spread} | {p.rps:,.0f} | {p.p50:.2f} | {p.p90:.2f} | "
            f"{p.p99:.2f} | {p.max:.2f} | {p.cpu_us:,.0f} | {cost} | {by_rps} | {p.answered} |"
        )
    add("")

    add("### Scaling with nodes, the decision alone (one process)")
    add("")
    add(
        "What `decisions.decide` (the parse, the policies, the answer's bytes) costs per request at each node count, "
        "in one process that holds the three views and answers the same bodies against each in turn, a batch at a "
        "time, in one order and then the other (`tests/bench/decide.py`): the rows above compare three servers a "
        "few seconds apart, and move with the machine's speed by more than the goal's 1.2x. CPU µs per request, the "
        "median of the rounds; cost: the median of the rounds' ratios to the fewest nodes. _Indexed Job pods_: the "
        "next index on every request, where the Job controller writes it (labels, an annotation, the hostname, the "
        "generated name); _new objects_: a number of its own in an annotation, so the policies run every time."
    )
    add("")
    counts = plan.node_counts
    add(
        "| pod | endpoint | requests | "
        + " | ".join(f"µs at {_n(n)}" for n in counts)
        + " | "
        + " | ".join(f"cost at {_n(n)}" for n in counts[1:])
        + " |"
    )
    add("|---|---|---|" + "--:|" * (2 * len(counts) - 1))
    for c in r.node_costs:
        add(
            f"| {c.pod} | /{c.endpoint} | {c.requests} | "
            + " | ".join(f"{c.us[n]:.1f}" for n in counts)
            + " | "
            + " | ".join(f"{c.ratio[n]:.2f}" for n in counts[1:])
            + " |"
        )
    add("")

    add(f"### Scaling with containers ({_n(plan.main_nodes)} nodes, {plan.scaling_level[0]} connections)")
    add("")
    add("The first eight containers ask for a GPU each (CUDA from the image tag), the rest are sidecars.")
    add("")
    lines += _baseline_table(r, "containers", "containers", lambda p: p.pod.split("-")[1])
    add("")

    add("### Events: what one costs the worker")
    add("")
    add(
        "Each GPU pod admitted at /validate gets an Event. The worker writes it to a pipe; the Events relay process "
        "sends it (`webhook/events.py`), on the same cores. The servers above log their Events; in a cluster they go "
        "to the API. CPU of the sending thread per Event, body included (`tests/bench/events.py`: the real "
        "`kubernetes` client's configuration, as in a cluster, over TLS and plain HTTP to `tests/kubeapi.py`):"
    )
    add("")
    add("| sink | CPU per Event |")
    add("|---|--:|")
    for sink, us in r.event_costs:
        add(f"| {sink} | {us / 1000:.2f} ms |")
    add("")
    add(
        f"Events a second the relay sends to an API server that takes {RELAY_ROUND_TRIP_S * 1000:g} ms to answer "
        "each create (the stand-in, in the bench's process; the Events written to the relay's pipe at once):"
    )
    add("")
    add("| relay | Events a second |")
    add("|---|--:|")
    for how, rate in r.relay_rates:
        add(f"| {how} | {rate:,.0f} |")
    add("")

    add("### Start and memory")
    add("")
    add(
        "Start to ready: from starting the process to the first 200 on `/readyz` (polled every 0.1 s). RSS: "
        "VmRSS of each gunicorn worker (MB = 10^6 bytes), after start and after all the load above."
    )
    add("")
    add("| server | nodes | node list | start to ready | RSS per worker after start | after load | master |")
    add("|---|--:|--:|--:|--:|--:|--:|")
    for inst in r.instances:
        size = f"{inst.node_list_mb:.1f} MB" if inst.node_list_mb else "-"
        add(
            f"| {'no-op baseline' if inst.name == 'baseline' else 'webhook'} | {_n(inst.nodes)} | {size} | "
            f"{inst.ready_s:.1f} s | {', '.join(f'{x:.0f}' for x in inst.rss_ready_mb)} MB | "
            f"{', '.join(f'{x:.0f}' for x in inst.rss_after_mb)} MB | {inst.master_rss_mb:.0f} MB |"
        )
    add("")

    add("### What the webhook answered")
    add("")
    add(
        "One CA-verified request per pod before the load (the /validate body is the pod with the /mutate patch "
        "applied, named and given a uid as the apiserver stores it)."
    )
    add("")
    add("| pod | endpoint | nodes | status | allowed | patch ops | warnings |")
    add("|---|---|--:|--:|---|--:|--:|")
    for a in r.answers:
        add(
            f"| {a.pod} | /{a.endpoint} | {_n(a.nodes)} | {a.status} | {'yes' if a.allowed else 'no'} | "
            f"{a.patch_ops} | {a.warnings} |"
        )
    return "\n".join(lines) + "\n"


DOC_HEAD = """# Benchmarks

How to reproduce: `make bench` (about ten minutes), `make soak` (ten minutes). See the sections below.

"""


def write_section(path: Path, name: str, text: str) -> None:
    """Replace what lies between ``<!-- name:start -->`` and ``<!-- name:end -->`` (append the pair if missing)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    old = path.read_text() if path.exists() else DOC_HEAD
    block = f"{start}\n{text.rstrip()}\n{end}"
    if start in old and end in old and old.index(start) < old.index(end):
        head, rest = old.split(start, 1)
        new = head + block + rest.split(end, 1)[1]
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(new)


def to_json(r: Results) -> dict[str, Any]:
    return {
        "plan": asdict(r.plan),
        "machine": r.machine,
        "points": [asdict(p) for p in r.points],
        "instances": [
            {
                "name": i.name,
                "nodes": i.nodes,
                "ready_s": i.ready_s,
                "rss_ready_mb": i.rss_ready_mb,
                "rss_after_mb": i.rss_after_mb,
                "master_rss_mb": i.master_rss_mb,
            }
            for i in r.instances
        ],
        "answers": [asdict(a) for a in r.answers],
        "event_costs_us": dict(r.event_costs),
        "relay_events_per_s": dict(r.relay_rates),
        "node_costs": [asdict(c) for c in r.node_costs],
        "goals": [{"goal": g, "figure": f, "met": m} for g, f, m in goals(r)],
        "total_s": r.total_s,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"), help="Markdown file to update")
    parser.add_argument("--quick", action="store_true", help="a few seconds: one concurrency, small node lists")
    parser.add_argument("--json", help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="gpu-admission-bench-") as tmp:
        results = run(plan, Path(tmp))
    write_section(Path(args.out), "bench", markdown(results))
    if args.json:
        Path(args.json).write_text(json.dumps(to_json(results), indent=2))
    failed = sum(p.failed for p in results.points)
    print(f"wrote {args.out} in {results.total_s:.0f} s; {failed} failed requests")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

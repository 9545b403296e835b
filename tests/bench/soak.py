"""Soak: steady keep-alive load for minutes, with zero errors and worker memory that does not grow.

    python -m tests.bench.soak --out docs/benchmarks.md [--minutes 10] [--nodes 1000] [--json soak.json]

Starts the real server (as ``tests.bench.run`` does: 2 gunicorn workers, TLS, ``examples/config.yaml``, a node
list) and drives it with ``wrk`` (4 keep-alive connections) in one-minute rounds; every request of a round is one
of a mix: each bench pod to /mutate, and as /mutate left it to /validate. A thread samples the workers' VmRSS every
few seconds. Passes when no request failed (socket errors, non-200s, answers without the uid), no worker was
restarted, nothing was logged at ERROR, and each worker's mean RSS over the last window is under 10% above its mean
over the first window after the warm-up. Writes the section between ``<!-- soak:start -->`` and
``<!-- soak:end -->``. Exit status 1 when it did not pass.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.bench import run as bench
from tests.serving import REPO, issue_certs

SAMPLE_EVERY_S = 5.0
GOAL_GROWTH = 0.10
POD_MIX = ("small", "training", "fixture", "containers-10")
LOG_PROBLEMS = ("Traceback", "[ERROR]", "[CRITICAL]", "WORKER TIMEOUT", " ERROR ")


@dataclass
class Sample:
    at_s: float
    rss_mb: dict[int, float]


@dataclass
class Soak:
    minutes: float
    nodes: int
    connections: int
    machine: dict[str, str]
    rounds: list[bench.Point] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    ready_s: float = 0.0
    warmup_s: float = 0.0
    window_s: float = 0.0
    growth: dict[int, tuple[float, float]] = field(default_factory=dict)
    """Per worker: mean RSS over the first window, over the last window (MB)."""
    restarts: int = 0
    log_problems: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        return sum(p.requests for p in self.rounds)

    @property
    def failed(self) -> int:
        return sum(p.failed for p in self.rounds)

    @property
    def worst_growth(self) -> float:
        return max((last / first - 1 for first, last in self.growth.values() if first), default=0.0)

    @property
    def passed(self) -> bool:
        return (
            self.failed == 0
            and self.requests > 0
            and self.restarts == 0
            and not self.log_problems
            and bool(self.growth)
            and self.worst_growth < GOAL_GROWTH
        )


class Sampler(threading.Thread):
    def __init__(self, server: Any, began: float) -> None:
        super().__init__(daemon=True)
        self.server, self.began = server, began
        self.samples: list[Sample] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            self.samples.append(Sample(time.monotonic() - self.began, bench.worker_rss(self.server)))
            self.halt.wait(SAMPLE_EVERY_S)


def windows(total_s: float) -> tuple[float, float]:
    """(warm-up, window): a minute each for long runs; shorter runs keep the two windows apart."""
    warmup = min(60.0, total_s * 0.2)
    return warmup, min(60.0, (total_s - warmup) / 3)


def growth(samples: Sequence[Sample], total_s: float, warmup: float, window: float) -> dict[int, tuple[float, float]]:
    out: dict[int, tuple[float, float]] = {}
    pids = set().union(*(s.rss_mb.keys() for s in samples)) if samples else set()
    for pid in sorted(pids):
        first = [s.rss_mb[pid] for s in samples if warmup <= s.at_s < warmup + window and s.rss_mb.get(pid)]
        last = [s.rss_mb[pid] for s in samples if s.at_s >= total_s - window and s.rss_mb.get(pid)]
        if first and last:
            out[pid] = (sum(first) / len(first), sum(last) / len(last))
    return out


def problems(log: Path) -> list[str]:
    """Lines of the server's log (not its JSON decision lines) that say something went wrong."""
    found: list[str] = []
    with log.open(errors="replace") as f:
        for line in f:
            if line.startswith('{"ts"'):
                continue
            if any(p in line for p in LOG_PROBLEMS):
                found.append(line.strip()[:200])
    return found


def soak(minutes: float, nodes: int, connections: int, tmp: Path) -> Soak:
    result = Soak(minutes, nodes, connections, bench.machine())
    certs = issue_certs(tmp / "certs")
    bodies = bench.Bodies(tmp)
    with contextlib.ExitStack() as stack:
        print(f"starting the webhook with {nodes} nodes", flush=True)
        inst = bench.start(stack, f"webhook-{nodes}", nodes, tmp, certs)
        result.ready_s = inst.ready_s
        mix = [(f"/{e}", bodies.body(p, e, inst)) for p in POD_MIX for e in ("mutate", "validate")]
        total_s = minutes * 60
        began = time.monotonic()
        sampler = Sampler(inst.server, began)
        sampler.start()
        try:
            left = total_s
            index = 0
            while left >= 1:
                seconds = int(min(60, left))
                index += 1
                point = bench.Point("soak", "webhook", nodes, f"round {index}", "mix", connections, 1, seconds)
                bench.measure(point, inst.server, mix)
                result.rounds.append(point)
                left = total_s - (time.monotonic() - began)
        finally:
            sampler.halt.set()
            sampler.join(timeout=10)
        elapsed = time.monotonic() - began
        result.samples = sampler.samples
        result.warmup_s, result.window_s = windows(elapsed)
        result.growth = growth(result.samples, elapsed, result.warmup_s, result.window_s)
        pid_sets = {frozenset(s.rss_mb) for s in result.samples if s.rss_mb}
        result.restarts = max(0, len(set().union(*pid_sets)) - bench.WORKERS) if pid_sets else 0
        result.log_problems = problems(inst.server.log)
    return result


def markdown(s: Soak) -> str:
    m = s.machine
    lines: list[str] = []
    add = lines.append
    add(f"_Generated by `python -m tests.bench.soak --minutes {s.minutes:g}` on {m['date']}, commit {m['commit']}._")
    add("")
    add(
        f"Machine: {m['nproc']} CPUs (nproc), {m['cpu']}, {m['memory']} memory, Python {m['python']}. "
        f"Load average at start: {m['load']} (shared machine)."
    )
    add("")
    add(
        f"The webhook with {s.nodes:,} nodes (ready in {s.ready_s:.1f} s), {bench.WORKERS} workers; wrk with "
        f"{s.connections} keep-alive connections in one-minute rounds (new connections each round), each request "
        f"one of {len(POD_MIX) * 2} bodies in turn: {', '.join(POD_MIX)}, each to /mutate and (mutated) to "
        f"/validate. RSS sampled every {SAMPLE_EVERY_S:g} s."
    )
    add("")
    add("| | figure | |")
    add("|---|---|---|")
    add(f"| requests | {s.requests:,} in {s.minutes:g} minutes | |")
    add(f"| failed (socket errors, non-200, uid not echoed) | {s.failed} | {'met' if s.failed == 0 else 'not met'} |")
    add(f"| worker restarts | {s.restarts} | {'met' if s.restarts == 0 else 'not met'} |")
    add(f"| errors in the server's log | {len(s.log_problems)} | {'met' if not s.log_problems else 'not met'} |")
    growth_text = ", ".join(f"{a:.1f} -> {b:.1f} MB ({b / a - 1:+.1%})" for a, b in s.growth.values() if a)
    add(
        f"| RSS growth per worker (mean of the first {s.window_s:.0f} s after a {s.warmup_s:.0f} s warm-up -> "
        f"mean of the last {s.window_s:.0f} s), goal < {GOAL_GROWTH:.0%} | {growth_text or 'no samples'} | "
        f"{'met' if s.growth and s.worst_growth < GOAL_GROWTH else 'not met'} |"
    )
    add(f"| **result** | | **{'passed' if s.passed else 'failed'}** |")
    add("")
    add("| round | seconds | per worker | req/s | p50 ms | p90 ms | p99 ms | max ms | good/requests | RSS at the end |")
    add("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for i, p in enumerate(s.rounds):
        end = sum(q.seconds for q in s.rounds[: i + 1])
        near = min(s.samples, key=lambda x: abs(x.at_s - end), default=None)
        rss = ", ".join(f"{v:.0f}" for v in near.rss_mb.values()) + " MB" if near else "-"
        add(
            f"| {i + 1} | {p.seconds} | {p.spread} | {p.rps:,.0f} | {p.p50:.2f} | {p.p90:.2f} | {p.p99:.2f} | "
            f"{p.max:.2f} | {p.answered} | {rss} |"
        )
    if s.log_problems:
        add("")
        add("Log lines:")
        add("")
        add("```")
        lines.extend(s.log_problems[:20])
        add("```")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"))
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--json", help="also write every figure to this JSON file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gpu-admission-soak-") as tmp:
        result = soak(args.minutes, args.nodes, args.connections, Path(tmp))
    bench.write_section(Path(args.out), "soak", markdown(result))
    if args.json:
        data = asdict(result)
        data["rounds"] = [asdict(p) for p in result.rounds]
        data["passed"] = result.passed
        Path(args.json).write_text(json.dumps(data, indent=2, default=str))
    print(
        f"wrote {args.out}: {result.requests} requests, {result.failed} failed, growth {result.worst_growth:+.1%}; "
        f"{'passed' if result.passed else 'FAILED'}"
    )
    return 0 if result.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())

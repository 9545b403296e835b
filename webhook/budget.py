"""The CPU a review may take: past it, the pod is refused as too complex to review, rather than answered late.

The apiserver waits ``timeoutSeconds`` for an answer (the chart's defaults: 2 s and 3 s) and then, under
failurePolicy Fail, refuses the pod with "context deadline exceeded"; the worker, meanwhile, is not told, and a
review of a pod built to be costly (many extended resources per container, MIG asks against thousands of affinity
values, a forged annotation naming thousands of places) went on for seconds to minutes, its worker answering no
other review: a few such pods held every worker (found by a review that measured the costliest pods the limits let
through). The hot loops of the policies and of the cluster view ``check`` the budget; ``within`` runs a review
under it, in this thread. The figure is CPU time of the thread, so a machine busy with other work does not spend it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

REVIEW_CPU_SECONDS = 1.0
"""Half the chart's default timeout of the mutating webhook (2 s; the validating one's is 3 s), with room for the
request's parse and answer and for the other request threads of the worker, which take turns with this one: a real
pod's review takes well under 50 ms (docs/benchmarks.md)."""

_local = threading.local()
T = TypeVar("T")


class TooComplex(Exception):
    """The review spent its budget."""


EVERY = 64
"""``check`` reads the clock on every 64th call: a thread's CPU clock is a system call (about 0.5 µs), and the
loops that call it may turn millions of times."""


def check() -> None:
    """Raise ``TooComplex`` once the review running in this thread is past its budget (a no-op outside one)."""
    local = _local
    ticks = getattr(local, "ticks", 0) + 1
    local.ticks = ticks
    if ticks % EVERY:
        return
    deadline = getattr(local, "deadline", None)
    if deadline is not None and time.thread_time() > deadline:
        raise TooComplex


def within(run: Callable[[], T], seconds: float | None = None) -> T:
    """``run()`` under a budget of ``seconds`` of this thread's CPU (``REVIEW_CPU_SECONDS``); nested, the outer
    budget holds."""
    if getattr(_local, "deadline", None) is not None:
        return run()
    _local.deadline = time.thread_time() + (REVIEW_CPU_SECONDS if seconds is None else seconds)
    try:
        return run()
    finally:
        _local.deadline = None

"""Work the request path leaves for later, done when the request thread gives its turn up (``webhook.workers``):
the reporting of each request (``audit.Reporter``: the decision log line, the metrics, the Events), after the
answers of a burst went out rather than in the middle of each request.

Each write is a system call, and CPython lets the GIL go around one: gunicorn's main thread, woken meanwhile by the
bytes of another connection's next request, takes it, and the request thread then waits to get it back, a context
switch each way. In the server (small pod, /mutate, 4 connections, 1,000 nodes) the decision log's one line per
request cost 40-70 µs of CPU that way, where a write of the same line cost 1 µs in a loop: nearly all of the
webhook's extra CPU against the no-op baseline (``docs/benchmarks.md``, 35.). Here a thread that holds a turn
(``defer``) queues what it is handed, and ``flush`` hands each owner its items in one call when the thread waits
for a client, ``settle`` when it stands by: the work of a burst of requests (or of several) at once, its writes at a
moment the GIL goes anyway.

An item waits for the request thread to run out of requests, and then (``settle``) for the bursts that come within
``LINGER_S`` of it: at one connection every request is a burst of its own, and its reporting alone, run cold, cost
more than its decision. At most ``LIMIT`` requests of one owner wait. A worker killed meanwhile (SIGKILL, the kernel
for memory) loses what waits, as a buffered log would; a worker that exits hands it over first. A thread that holds
no turn (tests, the Flask test client, an embedded app) gets each item done at once.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpu_admission.outbox")

LIMIT = 64
"""Items one owner may have waiting; with the next, they are handed over at once (a request thread that never runs
out of requests)."""

LINGER_S = 0.005
"""How long what a burst left may wait for the next bursts: at one connection (about 1,500 requests a second on the
bench's machine) the reporting of several requests goes in one write each, and an Event or a log line is at most
this late (``docs/benchmarks.md``, 38.)."""

Write = Callable[[list[Any]], object]
"""Does the work of a list of items (writes them out); what it returns is not read."""

_local = threading.local()
_waiting: dict[int, tuple[Write, list[Any]]] = {}
"""By ``id(owner)``: the owner's write and what waits for it. Touched by the thread that holds the turn, and at a
worker's exit by the interpreter's exit hook (``flush``) too, while a request thread may still hand items in."""
_lock = threading.Lock()
"""Held while an item joins its owner's entry and while ``flush`` takes an entry: an item appended to an entry
being written would be lost (never contended but at a worker's exit)."""
_since = 0.0
"""When the oldest item waiting was handed in (``time.monotonic``)."""
_writing = 0
"""Lists of items taken out of ``_waiting`` whose write has not returned yet (under ``_lock``): a request thread's
write (a daemon thread) is stopped where it stands once the interpreter finalizes, so the exit hook waits for it."""
_written = threading.Condition(_lock)
"""Told when ``_writing`` goes down."""

EXIT_WAIT_S = 5.0
"""How long a worker's exit (``_at_exit``) waits at most for the writes that other threads have under way."""


def defer() -> None:
    """From now on, what this thread hands ``later`` waits for ``flush``."""
    _local.deferring = True


def deferring() -> bool:
    return bool(getattr(_local, "deferring", False))


def later(owner: object, write: Write, item: Any) -> None:
    """``write([item])``, now, or (``defer``) at the next ``flush`` (or ``settle`` when due) together with
    ``owner``'s other waiting items."""
    global _since, _writing
    if not deferring():
        _write(write, [item])
        return
    with _lock:
        if not _waiting:
            _since = time.monotonic()
        entry = _waiting.get(id(owner))
        if entry is None:
            _waiting[id(owner)] = (write, [item])
            return
        if len(entry[1]) < LIMIT - 1:
            entry[1].append(item)
            return
        del _waiting[id(owner)]
        _writing += 1
    _hand_over(write, [*entry[1], item])


def settle() -> float | None:
    """At the end of a burst: hand over what waits once its oldest item has waited ``LINGER_S``; else leave it for
    a later burst, and say in how many seconds it is due (None: nothing waits). From now on this thread hands over
    at once, as after ``flush``."""
    _local.deferring = False
    if not _waiting:
        return None
    due = _since + LINGER_S - time.monotonic()
    if due > 0:
        return due
    flush()
    return None


def flush() -> None:
    """Hand over what waits, and hand over at once from now on in this thread (until the next ``defer``)."""
    global _writing
    _local.deferring = False
    while True:
        with _lock:  # two threads may flush at once: a worker's exit hook and a thread leaving the pool
            if not _waiting:
                return
            _, (write, items) = _waiting.popitem()
            _writing += 1
        _hand_over(write, items)


def _hand_over(write: Write, items: list[Any]) -> None:
    """``_write`` items taken out of ``_waiting`` (counted in ``_writing``), and count them out."""
    global _writing
    try:
        _write(write, items)
    finally:
        with _lock:
            _writing -= 1
            _written.notify_all()


def _write(write: Write, items: list[Any]) -> None:
    try:
        write(items)
    except Exception:  # the owner's to report; nothing is raised into a request
        log.exception("cannot hand over %d item(s) to %s", len(items), getattr(write, "__qualname__", write))


def _at_exit() -> None:
    """A worker's exit: hand over what waits, and wait for what another thread (one leaving the pool) took out of
    ``_waiting`` and is writing: the interpreter stops daemon threads where they stand once this hook returns, which
    lost the Events of a request answered just before SIGTERM (its decision log line written, its Events not)."""
    flush()
    with _lock:
        _written.wait_for(lambda: not _writing, EXIT_WAIT_S)


atexit.register(_at_exit)

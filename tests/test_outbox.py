"""Side writes left for later: at once outside a turn, batched per owner while a request thread holds one, written
when the thread gives the turn up to wait for a client, or stands by and the oldest has waited ``LINGER_S`` (by the
next burst, or by the thread itself once that time is up), never raised into a request."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import select
import socket
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import pytest

from webhook import outbox
from webhook.admission import ReviewRequest, Subject
from webhook.audit import DecisionLog, Reporter
from webhook.config import Settings
from webhook.events import EventPipe
from webhook.metrics import Metrics
from webhook.model import Outcome
from webhook.pipeline import Result
from webhook.workers import TurnPool


class Writes:
    """An owner that records each call of its write."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []

    def write(self, items: list[Any]) -> None:
        self.calls.append(list(items))


@pytest.fixture(autouse=True)
def _nothing_left() -> Iterator[None]:
    """After each test: the threads of the pools it shut down have left (a thread that leaves hands over the whole
    outbox, which could take the next test's items), and nothing waits."""
    before = set(threading.enumerate())
    yield
    for thread in set(threading.enumerate()) - before:
        if thread.name.startswith("gpu-admission-request-"):
            thread.join(5)
    outbox.flush()
    assert not outbox._waiting


def test_outside_a_turn_each_item_is_written_at_once() -> None:
    owner = Writes()
    outbox.later(owner, owner.write, "a")
    outbox.later(owner, owner.write, "b")
    assert owner.calls == [["a"], ["b"]]


def test_deferred_items_wait_for_flush_and_go_in_one_write_per_owner_in_order() -> None:
    log, pipe = Writes(), Writes()
    outbox.defer()
    for n in range(3):
        outbox.later(log, log.write, f"line{n}")
        outbox.later(pipe, pipe.write, n)
    assert log.calls == [] and pipe.calls == []
    outbox.flush()
    assert log.calls == [["line0", "line1", "line2"]]
    assert pipe.calls == [[0, 1, 2]]
    outbox.later(log, log.write, "after")
    assert log.calls[-1] == ["after"], "flush ends the deferring: the next item is written at once"


def test_two_threads_that_flush_at_once_hand_each_owners_items_over_once() -> None:
    """A worker that exits: the interpreter's exit hook and a request thread leaving the pool may flush together.
    Each owner's items go once, whole, and neither thread fails."""
    owners = [Writes() for _ in range(2000)]
    outbox.defer()
    for n, owner in enumerate(owners):
        outbox.later(owner, owner.write, n)
    failed: list[BaseException] = []

    def flush() -> None:
        try:
            outbox.flush()
        except BaseException as err:
            failed.append(err)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the two threads switch all the time
    try:
        other = threading.Thread(target=flush)
        other.start()
        flush()
        other.join(10)
    finally:
        sys.setswitchinterval(interval)
    assert failed == []
    assert [owner.calls for owner in owners] == [[[n]] for n in range(len(owners))]


def test_items_handed_in_while_another_thread_flushes_are_each_written_once() -> None:
    """A worker that exits: its exit hook flushes while a request thread may still hand items in. An item that joins
    an entry the other thread just took must not be lost with it (3 of 3 runs lost some before the lock)."""
    owners = [Writes() for _ in range(4)]
    handed = threading.Event()

    def hand() -> None:
        outbox.defer()
        for n in range(20_000):
            outbox.later(owners[n % 4], owners[n % 4].write, n)
        outbox.flush()
        handed.set()

    def flush() -> None:
        while not handed.is_set():
            outbox.flush()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # the two threads switch all the time
    try:
        threads = [threading.Thread(target=hand), threading.Thread(target=flush)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        sys.setswitchinterval(interval)
    written = [item for owner in owners for call in owner.calls for item in call]
    assert sorted(written) == list(range(20_000))


def test_a_workers_exit_waits_for_a_write_another_thread_has_under_way() -> None:
    """A thread leaving the pool took the last request's items and is writing them when the exit hook runs: the hook
    waits for that write (the interpreter would stop the thread where it stands: the request's Events were lost)."""
    started, written = threading.Event(), []

    def slow(items: list[Any]) -> None:
        started.set()
        time.sleep(0.3)
        written.extend(items)

    def leave() -> None:
        outbox.defer()
        outbox.later(owner, slow, "last request's Events")
        outbox.flush()

    owner = object()
    thread = threading.Thread(target=leave, daemon=True)
    thread.start()
    assert started.wait(5)
    outbox._at_exit()
    assert written == ["last request's Events"]
    thread.join(5)


def test_an_owner_with_limit_items_waiting_writes_them_out_at_once() -> None:
    owner = Writes()
    outbox.defer()
    for n in range(outbox.LIMIT * 2 + 3):
        outbox.later(owner, owner.write, n)
    assert [len(call) for call in owner.calls] == [outbox.LIMIT, outbox.LIMIT]
    assert owner.calls[0] == list(range(outbox.LIMIT))
    outbox.flush()
    assert owner.calls[-1] == list(range(outbox.LIMIT * 2, outbox.LIMIT * 2 + 3))


def test_deferring_is_the_threads_own() -> None:
    owner = Writes()
    outbox.defer()
    other = threading.Thread(target=outbox.later, args=(owner, owner.write, "elsewhere"))
    other.start()
    other.join()
    assert owner.calls == [["elsewhere"]], "a thread that holds no turn writes at once"
    outbox.later(owner, owner.write, "here")
    assert owner.calls == [["elsewhere"]]
    outbox.flush()
    assert owner.calls[-1] == ["here"]


def test_a_failing_write_is_logged_and_the_other_owners_still_written(caplog: pytest.LogCaptureFixture) -> None:
    def broken(items: list[Any]) -> None:
        raise OSError("disk full")

    good = Writes()
    outbox.defer()
    outbox.later(object(), broken, "lost")
    outbox.later(good, good.write, "kept")
    outbox.flush()
    assert good.calls == [["kept"]]
    assert "cannot hand over 1 item(s)" in caplog.text and "disk full" in caplog.text


def test_settle_leaves_a_young_burst_waiting_and_hands_over_an_old_one(monkeypatch: pytest.MonkeyPatch) -> None:
    owner = Writes()
    monkeypatch.setattr(outbox, "LINGER_S", 60.0)
    outbox.defer()
    outbox.later(owner, owner.write, "first burst")
    due = outbox.settle()
    assert due is not None and 59 < due <= 60 and owner.calls == [] and not outbox.deferring()
    outbox.defer()
    outbox.later(owner, owner.write, "second burst")
    monkeypatch.setattr(outbox, "LINGER_S", 0.0)  # the first burst's item has waited long enough now
    assert outbox.settle() is None
    assert owner.calls == [["first burst", "second burst"]]
    assert outbox.settle() is None  # nothing waits


# -- the pool writes out at the end of a burst, and before a wait -----------------------------------------------------
def test_a_burst_of_jobs_is_written_out_once_when_the_thread_runs_out_of_jobs() -> None:
    pool = TurnPool(4)
    owner = Writes()
    gate = threading.Event()
    seen_before_last: list[int] = []

    def job(n: int) -> int:
        if n == 0:
            gate.wait(5)  # the others queue up meanwhile: one burst
        if n == 5:
            seen_before_last.append(len(owner.calls))
        outbox.later(owner, owner.write, n)
        return n

    try:
        fs = [pool.submit(job, n) for n in range(6)]
        gate.set()
        assert [f.result(timeout=5) for f in fs] == list(range(6))
        deadline = time.monotonic() + 5
        while not owner.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen_before_last == [0], "nothing written while the burst ran"
        assert owner.calls == [[0, 1, 2, 3, 4, 5]]
    finally:
        pool.shutdown()


def test_bursts_within_the_linger_go_in_one_write_and_the_last_once_it_is_due(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One job at a time (one connection): each is a burst of its own; what they leave goes at once when the oldest
    is due, by a later burst, or by the thread standing by when no burst comes."""
    monkeypatch.setattr(outbox, "LINGER_S", 1.0)
    pool = TurnPool(4)
    owner = Writes()

    def job(n: int) -> int:
        outbox.later(owner, owner.write, n)
        return n

    try:
        began = time.monotonic()
        for n in range(3):
            assert pool.submit(job, n).result(timeout=5) == n
        assert owner.calls == [] or time.monotonic() - began >= 1.0, "three bursts in well under the linger"
        deadline = time.monotonic() + 5
        while not owner.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert owner.calls == [[0, 1, 2]], "handed over by the thread standing by, once due"
        assert time.monotonic() - began >= 1.0
    finally:
        pool.shutdown()


def test_a_pool_shut_down_hands_over_what_lingers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outbox, "LINGER_S", 60.0)
    pool = TurnPool(2)
    owner = Writes()
    assert pool.submit(outbox.later, owner, owner.write, "lingers").result(timeout=5) is None
    assert owner.calls == []
    pool.shutdown()
    deadline = time.monotonic() + 5
    while not owner.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    assert owner.calls == [["lingers"]]


def test_a_job_that_waits_for_its_client_writes_out_first() -> None:
    pool = TurnPool(2)
    owner = Writes()
    quiet, client = socket.socketpair()

    def waits() -> int:
        outbox.later(owner, owner.write, "before the wait")
        pool.wait_for_client(quiet, write=False)
        outbox.later(owner, owner.write, "after the wait")
        return len(owner.calls)

    try:
        waiting = pool.submit(waits)
        deadline = time.monotonic() + 5
        while not owner.calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert owner.calls == [["before the wait"]], "written before the turn was given up"
        client.sendall(b"x")
        assert waiting.result(timeout=5) == 1, "after the wait the job defers again"
        futures.wait([pool.submit(lambda: None)], timeout=5)
        deadline = time.monotonic() + 5
        while len(owner.calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert owner.calls == [["before the wait"], ["after the wait"]]
    finally:
        pool.shutdown()
        quiet.close()
        client.close()


# -- the Reporter: a burst's lines in one write, its Events in atomic pipe writes -------------------------------------
class CountedStream(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def write(self, text: str) -> int:
        self.writes += 1
        return super().write(text)


def validated(n: int) -> tuple[ReviewRequest, Result]:
    subject = Subject("v1", "Pod", f"pod-{n}", "", "default", f"uid-{n}")
    review = ReviewRequest(f"req-{n}", "CREATE", "default", "", "Pod", "u", (), False, None, None, subject)
    outcome = Outcome()
    outcome.event("CUDAChecked", "x" * 700)
    return review, Result(outcome=outcome)


def test_a_burst_is_reported_at_the_flush_its_lines_in_one_write_its_events_in_atomic_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_fd, write_fd = os.pipe()
    stream = CountedStream()
    reporter = Reporter(DecisionLog(Settings(), stream), Metrics(), EventPipe(write_fd), "i")
    writes: list[int] = []
    real = os.write

    def counted(fd: int, data: bytes) -> int:
        writes.append(len(data))
        return real(fd, data)

    monkeypatch.setattr(os, "write", counted)
    try:
        outbox.defer()
        for n in range(10):
            reporter.record("validate", *validated(n), 200, 0.001)
        assert (stream.getvalue(), writes) == ("", []), "nothing done before the flush"
        outbox.flush()
        monkeypatch.undo()
        assert stream.writes == 1
        assert [json.loads(line)["uid"] for line in stream.getvalue().splitlines()] == [f"req-{n}" for n in range(10)]
        assert len(writes) > 1 and all(size <= select.PIPE_BUF for size in writes)
        events = [json.loads(line) for line in os.read(read_fd, 1 << 16).splitlines()]
        assert [e["involvedObject"]["name"] for e in events] == [f"pod-{n}" for n in range(10)]
        requests = reporter.metrics.registry.get_sample_value(
            "gpu_admission_requests_total", {"endpoint": "validate", "decision": "allowed"}
        )
        assert requests == 10, "the metrics counted every request of the burst"
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_what_waits_holds_neither_the_object_nor_the_mutated_one() -> None:
    stream = io.StringIO()
    reporter = Reporter(DecisionLog(Settings(), stream), Metrics(), None, "i")
    review, result = validated(1)
    pod = {"metadata": {"name": "pod-1"}, "spec": {"containers": [{"name": "big", "image": "x" * 1000}]}}
    review = dataclasses.replace(review, object=pod, old_object=pod)
    result = dataclasses.replace(result, object=pod)
    outbox.defer()
    reporter.record("mutate", review, result, 200, 0.001)
    ((_, waiting),) = outbox._waiting.values()
    (recorded,) = waiting
    assert (recorded.review.object, recorded.review.old_object, recorded.result.object) == (None, None, None)
    assert recorded.review.uid == review.uid and recorded.result.outcome is result.outcome
    outbox.flush()
    assert json.loads(stream.getvalue())["uid"] == "req-1"

"""The request threads' turns (webhook/workers.py): one job runs at a time, on as few threads as it can, and a job
that waits for its client gives the turn up meanwhile. Over real sockets (``socket.socketpair``)."""

from __future__ import annotations

import socket
import threading
import time
from concurrent import futures
from typing import Any

import pytest

from webhook import workers
from webhook.workers import ClientSilent, TurnPool


@pytest.fixture
def pool() -> Any:
    p = TurnPool(4)
    yield p
    p.shutdown()


def test_jobs_run_one_at_a_time_and_their_results_and_errors_reach_the_futures(pool: TurnPool) -> None:
    running, most = [0], [0]
    lock = threading.Lock()

    def job(n: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.002)  # releases the GIL: a second thread could run now, if the pool let it
        with lock:
            running[0] -= 1
        if n == 7:
            raise ValueError("seven")
        return n * n

    fs = [pool.submit(job, n) for n in range(20)]
    futures.wait(fs, timeout=10)
    assert [f.result() for i, f in enumerate(fs) if i != 7] == [n * n for n in range(20) if n != 7]
    with pytest.raises(ValueError, match="seven"):
        fs[7].result()
    assert most[0] == 1


def test_jobs_that_never_wait_for_a_client_keep_to_one_thread(pool: TurnPool) -> None:
    for _ in range(5):  # in bursts, as keep-alive connections become readable together
        futures.wait([pool.submit(time.sleep, 0.001) for _ in range(10)], timeout=10)
    assert pool._threads == 1


def test_a_job_waiting_for_its_client_lets_the_others_run(pool: TurnPool) -> None:
    quiet, client = socket.socketpair()
    order: list[str] = []

    def reader() -> bytes:
        pool.wait_for_client(quiet, write=False)
        order.append("reader")
        return quiet.recv(10)

    waiting = pool.submit(reader)
    time.sleep(0.05)
    others = [pool.submit(order.append, f"job{n}") for n in range(3)]
    futures.wait(others, timeout=5)
    assert order == ["job0", "job1", "job2"], "the others ran while the reader waited"
    client.sendall(b"hello")
    assert waiting.result(timeout=5) == b"hello"
    assert order[-1] == "reader"
    assert pool._threads == 2
    quiet.close()
    client.close()


def test_a_silent_client_is_given_up_after_the_timeout(monkeypatch: pytest.MonkeyPatch, pool: TurnPool) -> None:
    monkeypatch.setattr(workers, "IO_TIMEOUT_S", 0.2)
    quiet, client = socket.socketpair()
    started = time.monotonic()
    waiting = pool.submit(pool.wait_for_client, quiet, False)
    with pytest.raises(ClientSilent, match=r"silent for 0\.2 s"):
        waiting.result(timeout=5)
    assert 0.2 <= time.monotonic() - started < 2
    assert pool.submit(lambda: "next").result(timeout=5) == "next", "the turn came back"
    quiet.close()
    client.close()


def test_every_thread_waiting_for_a_client_still_leaves_none_behind() -> None:
    pool = TurnPool(2)
    pairs = [socket.socketpair() for _ in range(2)]
    waiting = [pool.submit(pool.wait_for_client, a, False) for a, _ in pairs]
    time.sleep(0.05)
    late = pool.submit(lambda: "late")  # both threads wait for their clients: it waits in the backlog
    assert not late.done()
    pairs[0][1].sendall(b"x")
    assert waiting[0].result(timeout=5) is None
    assert late.result(timeout=5) == "late", "the first thread back took the backlog on"
    pairs[1][1].sendall(b"x")
    assert waiting[1].result(timeout=5) is None
    pool.shutdown()
    for a, b in pairs:
        a.close()
        b.close()


def test_after_shutdown_no_new_work_and_the_threads_leave() -> None:
    pool = TurnPool(3)
    futures.wait([pool.submit(time.sleep, 0.001) for _ in range(5)], timeout=5)
    pool.shutdown()
    with pytest.raises(RuntimeError):
        pool.submit(print)
    deadline = time.monotonic() + 5
    while pool._threads and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool._threads == 0 and pool._engaged == 0


def test_a_client_that_trickles_is_given_up_at_the_request_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workers, "IO_TIMEOUT_S", 0.5)
    monkeypatch.setattr(workers, "REQUEST_DEADLINE_S", 0.4)
    pool = TurnPool(2)
    server, client = socket.socketpair()
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.05):
            try:
                client.sendall(b"x")  # a byte at a time, never a pause as long as IO_TIMEOUT_S
            except OSError:  # the pool shut the connection down
                return

    def read_forever() -> None:
        while True:
            pool.wait_for_client(server, write=False)
            server.recv(1)

    threading.Thread(target=trickle, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(ClientSilent, match=r"no whole request in 0\.4 s"):
        pool.submit(read_forever).result(timeout=5)
    assert 0.35 < time.monotonic() - started < 2
    stop.set()
    time.sleep(0.1)
    pool.shutdown()
    server.close()
    client.close()


def test_waits_on_descriptors_above_1023() -> None:
    import fcntl
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    a, b = socket.socketpair()
    high = socket.socket(fileno=fcntl.fcntl(a.fileno(), fcntl.F_DUPFD, 1100))
    assert high.fileno() >= 1100
    pool = TurnPool(1)
    b.sendall(b"x")
    assert pool.submit(pool.wait_for_client, high, False).result(timeout=5) is None
    pool.shutdown()
    for s in (high, a, b):
        s.close()


def test_keyword_arguments_reach_the_job(pool: TurnPool) -> None:
    assert pool.submit(lambda a, *, b: (a, b), "a", b="b").result(timeout=10) == ("a", "b")

"""The request threads of a gunicorn worker: one runs Python at a time, the others stand by for when it must wait.

A review is Python from end to end, so threads of one process never run two at once (the GIL). gunicorn's gthread
pool hands every request to a thread of its own and lets them all run; they then fight over the GIL at every read
and write, and that fight cost a worker more CPU than the review itself (``docs/benchmarks.md``, 14.). One thread
would be fastest, but then a client that stops halfway (or opens a connection and sends nothing yet, as Go's
HTTP client does when it dialled for a request that another connection took) would stop every review behind it.

So the pool here (``TurnPool``) runs its jobs one at a time, in turn, on the thread that holds the turn: that
thread takes the next job itself, as long as there is one, without waking another. Only when it must wait for a
client (a read or a write that would block, in ``TurnSSLSocket``) does it give the turn up, and a thread standing
by takes the queue on; the waiting one takes its turn back when its client is ready. A connection is closed when
its client stays silent for ``IO_TIMEOUT_S``, or has not sent a whole request (TLS handshake included) within
``REQUEST_DEADLINE_S``, so a client that trickles bytes cannot keep a thread either; one past its TLS handshake that
has sent no byte of a request yet waits on the poller, as a kept-alive one does (``AwaitingRequest``). Before a
thread gives its turn up to wait for a client, it does the reporting its requests left (``webhook.outbox``); before
it stands by, that of the bursts of the last ``outbox.LINGER_S`` (else the next burst does, or it does once that
time is up).

A request gunicorn itself rejects before the app sees it (a malformed request line or header, one over its limits,
a body framing it cannot read) is answered in the app's JSON, a metav1.Status (``admission.error_body``), not
gunicorn's HTML page (``TurnWorker.handle_error``).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import logging
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

from gunicorn import util
from gunicorn.workers import gthread
from gunicorn.workers.gthread import ThreadWorker

from webhook import outbox
from webhook.admission import error_body

log = logging.getLogger("gpu_admission.server")

IO_TIMEOUT_S = 5.0
"""The longest one read or write waits for a client (the TLS handshake included); then the connection is closed.
kube-apiserver sends a review at once: only a client that stalled, or a connection opened for later, waits."""
REQUEST_DEADLINE_S = 10.0
"""The longest one request (a job: the TLS handshake of a new connection, the request, the answer) may wait for its
client in all."""

_Job = tuple[futures.Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class TurnPool(futures.Executor):
    """An executor for gunicorn's gthread worker (``submit`` and ``shutdown`` are what it uses)."""

    def __init__(self, max_workers: int) -> None:
        self.max_workers = max(1, max_workers)
        self.turn = threading.Lock()
        """Held by the thread that runs Python for a request."""
        self._lock = threading.RLock()
        """Guards what follows (re-entrant: gunicorn calls ``shutdown`` from a signal handler)."""
        self._backlog: collections.deque[_Job] = collections.deque()
        self._idle: list[threading.Semaphore] = []  # threads standing by; the last one to stop is woken first
        self._threads = 0
        self._engaged = 0
        """Threads that hold the turn or wait for it (not those waiting for a client): they take the backlog on."""
        self._shutdown = False
        self._local = threading.local()

    # -- gunicorn's side ----------------------------------------------------------------------------------------------
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> futures.Future[Any]:
        future: futures.Future[Any] = futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new work after shutdown")
            self._backlog.append((future, fn, args, kwargs))
            if self._engaged == 0:
                self._engage()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._shutdown = True
            if cancel_futures:
                while self._backlog:
                    self._backlog.popleft()[0].cancel()
            idle, self._idle = self._idle, []
            self._engaged += len(idle)  # each leaves through _next_job, which counts it out
        for wake in idle:
            wake.release()

    # -- the threads ------------------------------------------------------------------------------------------------
    def _engage(self) -> None:
        """Get a thread to take the backlog on: the one that stood by last, else a new one (under ``_lock``)."""
        if self._idle:
            self._engaged += 1
            self._idle.pop().release()
        elif self._threads < self.max_workers:
            self._engaged += 1
            self._threads += 1
            threading.Thread(target=self._run, name=f"gpu-admission-request-{self._threads}", daemon=True).start()
        # else every thread waits for a client: the first one back takes the backlog on

    def _run(self) -> None:
        self._local.wake = wake = threading.Semaphore(0)
        while True:
            with self.turn:
                self._local.turn = True
                outbox.defer()
                while (job := self._next_job()) is not None:
                    future, fn, args, kwargs = job
                    self._local.deadline = time.monotonic() + REQUEST_DEADLINE_S
                    if future.set_running_or_notify_cancel():
                        try:
                            future.set_result(fn(*args, **kwargs))
                        except BaseException as err:  # the future carries it to gunicorn
                            future.set_exception(err)
                    del job, future, fn, args, kwargs
                if self._local.leave:
                    outbox.flush()
                    linger = None
                else:
                    linger = outbox.settle()  # the reporting of the bursts before: now, or once due
                self._local.turn = False
            if self._local.leave:
                return
            self._stand_by(wake, linger)

    def _stand_by(self, wake: threading.Semaphore, linger: float | None) -> None:
        """Wait to be woken for the backlog; when ``linger`` runs out first, hand over what the bursts before left
        (``outbox.settle``): no burst came meanwhile to do it."""
        if linger is not None:
            if wake.acquire(timeout=linger):
                return
            with self.turn:
                outbox.flush()
        wake.acquire()

    def _next_job(self) -> _Job | None:
        """The next job for the thread that holds the turn, while it is the only one engaged; else None, and this
        thread stands by (or leaves, after shutdown)."""
        with self._lock:
            if self._backlog and self._engaged == 1:
                return self._backlog.popleft()
            self._engaged -= 1  # the backlog is empty, or another thread is engaged and takes it on
            self._local.leave = self._shutdown
            if self._shutdown:
                self._threads -= 1
            else:
                self._idle.append(self._local.wake)
            return None

    def wait_for_client(self, sock: Any, write: bool) -> None:
        """Wait until ``sock`` can be read (or written), the turn given up meanwhile; ClientSilent after IO_TIMEOUT_S
        or at the request's deadline. A thread that holds no turn of this pool just waits (IO_TIMEOUT_S at most)."""
        holds = getattr(self._local, "turn", False)
        if holds:
            outbox.flush()
            self._local.turn = False
            with self._lock:
                self._engaged -= 1
                if self._backlog and self._engaged == 0:
                    self._engage()
            self.turn.release()
        try:
            _ready_or_timeout(sock, write, getattr(self._local, "deadline", None) if holds else None)
        finally:
            if holds:
                with self._lock:
                    self._engaged += 1
                self.turn.acquire()
                self._local.turn = True
                outbox.defer()


class ClientSilent(ConnectionResetError):
    """A client that sent (or read) nothing for IO_TIMEOUT_S, or no whole request within REQUEST_DEADLINE_S. A
    reset to gunicorn, which then closes the connection without a traceback; the warning is logged here, once."""


def _ready_or_timeout(sock: Any, write: bool, deadline: float | None = None) -> None:
    """Wait until ``sock`` is ready; ClientSilent (the connection shut down, so that gunicorn's graceful close does
    not wait for the client either) after IO_TIMEOUT_S, or at ``deadline``."""
    wait = IO_TIMEOUT_S if deadline is None else min(IO_TIMEOUT_S, deadline - time.monotonic())
    poller = select.poll()  # not select.select: it cannot take a descriptor above 1023
    poller.register(sock, select.POLLOUT if write else select.POLLIN)
    if wait > 0 and poller.poll(wait * 1000):
        return
    why = f"silent for {IO_TIMEOUT_S:g} s" if wait >= IO_TIMEOUT_S else f"no whole request in {REQUEST_DEADLINE_S:g} s"
    try:
        peer = ":".join(map(str, sock.getpeername()[:2])) or "a client"
    except OSError:
        peer = "a client"
    log.warning("closing the connection of %s: %s", peer, why)
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    raise ClientSilent(errno.ECONNRESET, why)


_POOL: TurnPool | None = None
"""The pool of this process's worker (one gunicorn worker per process)."""


def _wait_for_client(sock: Any, write: bool) -> None:
    if _POOL is not None:
        _POOL.wait_for_client(sock, write)
    else:
        _ready_or_timeout(sock, write)


class AwaitingRequest(BaseException):  # not an Exception: gunicorn's "except Exception" must let it by
    """A connection that has done its TLS handshake and sent no byte of a request yet: it waits for one on the
    worker's poller, as a kept-alive connection does (``TurnWorker.handle``), not in a request thread."""


class TurnSSLSocket(ssl.SSLSocket):
    """The SSL context's ``sslsocket_class``. gunicorn reads and writes a client's connection in blocking mode,
    with no timeout; here each of those waits goes through the pool (the turn given up meanwhile) and ends after
    IO_TIMEOUT_S. The socket itself is non-blocking underneath, so no call can block with the turn held."""

    def setblocking(self, flag: bool) -> None:
        super().setblocking(False)
        self._blocking = flag

    def _blocks(self) -> bool:
        return getattr(self, "_blocking", True)

    def _io(self, reading: bool, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)``, waiting as the caller asked each time it would block: for a non-blocking caller the
        error is raised again; else the wait is in the direction TLS asks for (a read may need a write, and the
        reverse)."""
        while True:
            try:
                return call(*args)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError) as err:
                if not self._blocks():
                    raise
                write = isinstance(err, ssl.SSLWantWriteError) or (
                    not reading and not isinstance(err, ssl.SSLWantReadError)
                )
                _wait_for_client(self, write=write)

    def do_handshake(self, block: bool = False) -> None:
        super().setblocking(False)
        self._io(True, super().do_handshake)
        # Go's HTTP client (kube-apiserver's) keeps a connection it dialled for a request that another connection
        # served, idle in its pool: held to IO_TIMEOUT_S like a stalled request, it was closed after 5 s, and a
        # review sent on it as it closed failed the call (a POST on a connection never used is not retried)
        self._awaiting_request = True

    def _silent(self) -> bool:
        """Whether the client has sent nothing since its handshake (``AwaitingRequest``); once it has sent a byte,
        its request is waited for as any other (a client that stops inside its first TLS record was held on the
        poller, its wait renewed by each byte)."""
        if not getattr(self, "_awaiting_request", False) or not self._blocks() or self.pending():
            return False
        try:
            peeked = socket.socket.recv(self, 1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # the raw bytes, left there
        except BlockingIOError:
            return True  # nothing since the handshake
        except OSError:
            return False  # the read that follows meets the same error
        if peeked:
            self._awaiting_request = False
        return False  # bytes, or the client's close: read as any other

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        if self._silent():
            raise AwaitingRequest
        data: bytes = self._io(True, super().recv, buflen, flags)
        return data

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        if self._silent():
            raise AwaitingRequest
        count: int = self._io(True, super().recv_into, buffer, nbytes or 0, flags)
        return count

    def send(self, data: Any, flags: int = 0) -> int:
        count: int = self._io(False, super().send, data, flags)
        return count


_GUNICORN_WRITE_ERROR = util.write_error
_json_errors = threading.local()
"""``on`` while this thread runs ``TurnWorker.handle_error``."""

ERROR_DETAIL_CHARS = 300
"""The most characters of gunicorn's detail kept in an error answer (a rejected request line is up to 8 kB)."""


def error_answer(status: int, reason: str, detail: str) -> bytes:
    """The whole HTTP answer to a request gunicorn rejected (status, reason and detail as gunicorn chose them): the
    webhook's error body (``admission.error_body``), the connection closed after it."""
    if len(detail) > ERROR_DETAIL_CHARS:
        detail = detail[:ERROR_DETAIL_CHARS] + "..."
    if status >= 500 and status != 501:  # 501: a Transfer-Encoding gunicorn does not implement, the client's doing
        said = f" ({detail})" if detail else ""
        message = f"internal error in the webhook's HTTP server{said}; see the webhook's log"
    else:
        message = (
            f"malformed HTTP request: {detail or reason}; this webhook takes POST /mutate or POST /validate with a "
            "JSON AdmissionReview"
        )
    body = json.dumps(error_body(message, status), separators=(",", ":")).encode() + b"\n"  # ASCII: non-ASCII escaped
    head = (
        f"HTTP/1.1 {status} {reason}\r\nConnection: close\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1", "replace") + body


def write_json_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    """``gunicorn.util.write_error``'s part, in JSON (``error_answer``); it never raises. On a ``TurnSSLSocket`` the
    write waits for the client as every other one does, the turn given up meanwhile, IO_TIMEOUT_S each wait and
    until the request's deadline; any other socket (a connection whose TLS handshake failed) is written as gunicorn
    does, without waiting: what does not fit in its buffer is not sent."""
    try:
        data = error_answer(int(status_int), str(reason), str(mesg))
        if isinstance(sock, TurnSSLSocket):
            sock.sendall(data)
        else:
            util.write_nonblock(sock, data)
    except Exception as err:  # the client went away, or never spoke TLS: gunicorn's own write drops it as well
        log.debug("the error answer to a request gunicorn rejected was not sent: %r", err)


def _write_error(sock: Any, status_int: int, reason: str, mesg: str) -> None:
    """``gunicorn.util.write_error`` in a worker process: JSON inside ``TurnWorker.handle_error``, gunicorn's own
    elsewhere."""
    if getattr(_json_errors, "on", False):
        write_json_error(sock, status_int, reason, mesg)
    else:
        _GUNICORN_WRITE_ERROR(sock, status_int, reason, mesg)


DATA_WAIT_S = 0.01
"""How long a request thread of gunicorn's gthread worker (since 25) waits for the rest of a body the app did not read
(a 413), after which the connection is closed (``DEFAULT_WORKER_DATA_TIMEOUT``, 5 s, also bounds that drain for
a body the app read whole: 0 would close every kept-alive connection). A silent client holds a thread that long,
not 5 s. For a new connection's first bytes gunicorn waits as long; ``TurnWorker.handle`` only looks."""


def close_without_waiting(sock: Any, timeout: float = 2.0, max_drain: int = 65536) -> None:
    """gunicorn's ``util.close_graceful`` (its arguments), without its wait. gunicorn closes a connection that is not
    kept alive on the worker's main thread, and waited there up to ``timeout`` for the client to close its side, so
    that no unread byte of the client's turns the close into a reset (RFC 9112, 9.6): meanwhile the worker accepted
    and answered nothing, and a client that asked for ``Connection: close`` and then neither read nor closed held
    every review of the worker for 2 s. Here the answer's end (FIN) is sent and what the client sent that is
    already here is read away (up to ``max_drain``), then the socket is closed: a reset can only follow bytes the
    client sends after its answer is out."""
    with contextlib.suppress(OSError):  # a client gone, or nothing more to read (BlockingIOError)
        socket.socket.shutdown(sock, socket.SHUT_WR)  # the socket's own: an SSLSocket's would drop its TLS state
        drained = 0
        while drained < max_drain and (data := socket.socket.recv(sock, 4096, socket.MSG_DONTWAIT)):
            drained += len(data)
    util.close(sock)


class TurnWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's gthread worker with the pool above (``worker_class`` in ``webhook.server``), its waits for a
    client's bytes bounded by DATA_WAIT_S, a new connection that sent nothing closed after IO_TIMEOUT_S, and the
    errors gunicorn answers itself answered in JSON."""

    def init_process(self) -> None:
        if hasattr(gthread, "DEFAULT_WORKER_DATA_TIMEOUT"):  # read by gthread at each wait, in this worker only
            gthread.DEFAULT_WORKER_DATA_TIMEOUT = DATA_WAIT_S
        util.close_graceful = close_without_waiting  # looked up on gunicorn.util at each close, in this worker only
        super().init_process()

    def get_thread_pool(self) -> TurnPool:
        global _POOL
        _POOL = TurnPool(self.cfg.threads)
        return _POOL

    def handle(self, conn: Any) -> Any:
        """gunicorn's, but a new connection whose first bytes are not there yet goes back to the poller at once:
        gunicorn waits for them in the thread, which here holds the turn, and at 10 ms a burst of connections that
        sent nothing (2,100 of them) held a worker's reviews up for 7 s. A ClientHello comes with the TCP
        handshake's last packet; one that is late waits on the poller, where waiting costs nothing."""
        defer = getattr(gthread, "_DEFER", None)
        fresh = defer is not None and not conn.initialized and not getattr(conn, "data_ready", True)
        if fresh and not conn.wait_for_data(0):
            return defer
        try:
            return super().handle(conn)
        except AwaitingRequest:  # its TLS handshake done, no request yet: kept alive (KEEPALIVE_S), on the poller,
            # as many as gunicorn keeps alive after a request, not more (past them, 1,004 silent handshakes held the
            # worker's every connection 100 s: found by a review)
            # (a stopping worker keeps it for gunicorn's linger, as its kept-alive ones, and answers it)
            return not self.alive or len(self.keepalived_conns) < self.max_keepalived

    def finish_request(self, conn: Any, fs: Any) -> None:
        """gunicorn's, but a new connection put on the poller to wait for its first bytes is given IO_TIMEOUT_S
        for them, not the keep-alive's 100 s: silent connections would otherwise pile up to the worker's
        connection limit, after which it accepts none (kept-alive ones, which have sent a request, keep theirs)."""
        pending = getattr(self, "pending_conns", None)
        before = len(pending) if pending is not None else 0
        super().finish_request(conn, fs)
        if pending is not None and len(pending) > before and pending[-1] is conn:
            conn.timeout = min(conn.timeout, time.monotonic() + IO_TIMEOUT_S)

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        """gunicorn's, answering in the webhook's JSON (``admission.error_body``) instead of its HTML page: a request it
        rejected before the app saw it (400, 414, 417, 431, 501), or its own failure outside the app (500).

        gunicorn's code runs unchanged (which errors are the client's, the status, reason and detail, the warning
        and the access log line); it relies on ``Worker.handle_error`` (read in gunicorn 27.0.1; pyproject lets 23 to
        27 in) writing its answer with one call ``util.write_error(client, status_int, reason, mesg)``, looked up on
        ``gunicorn.util`` when called,
        which here is ``_write_error``: JSON on this thread while the flag is set. Should a later gunicorn write
        otherwise, its HTML comes back, and ``tests/test_http_errors.py`` fails."""
        util.write_error = _write_error  # this worker process's; gunicorn's own but inside this method
        _json_errors.on = True
        try:
            super().handle_error(req, client, addr, exc)
        except Exception:  # gunicorn's logging of it failed: the connection is closed all the same
            log.exception("error while answering a request that gunicorn rejected (%r)", exc)
        finally:
            _json_errors.on = False

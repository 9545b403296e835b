"""The requests gunicorn itself rejects before the app sees them (a malformed request line or header, one over its
limits, body framing it cannot read) are answered in the webhook's JSON, a metav1.Status with the message also under
``error``, as every other error is, not in gunicorn's HTML page (``webhook.workers.TurnWorker.handle_error``).
Against the real server over TLS, and the worker's method over socket pairs."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import pytest
from gunicorn import util
from gunicorn.config import Config
from gunicorn.http.errors import InvalidRequestLine, LimitRequestLine

from tests.conftest import EXAMPLES, gpu_pod, review
from tests.serving import Server, exchange, serve
from webhook.workers import TurnWorker

HINT = "this webhook takes POST /mutate or POST /validate with a JSON AdmissionReview"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    with serve(tmp_path_factory.mktemp("http-errors"), config=EXAMPLES / "config.yaml", workers=1) as s:
        yield s


def _answers(data: bytes) -> list[tuple[bytes, dict[str, str], bytes]]:
    """The answers in ``data``, one after the other: (status line, headers with lowercased names, body), each body
    exactly Content-Length long; nothing may be left over."""
    answers = []
    while data:
        head, sep, data = data.partition(b"\r\n\r\n")
        assert sep, f"an answer without the end of its head: {head[:300]!r}"
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
        length = int(headers["content-length"])
        assert len(data) >= length, f"the body is shorter than its Content-Length {length}: {data!r}"
        body, data = data[:length], data[length:]
        answers.append((status_line.encode("latin-1"), headers, body))
    return answers


def _assert_json_error(answer: tuple[bytes, dict[str, str], bytes], status: int, reason: str, names: str) -> str:
    status_line, headers, body = answer
    assert status_line == b"HTTP/1.1 %d %s" % (status, reason.encode()), answer
    assert headers["content-type"] == "application/json", answer
    assert headers["connection"] == "close", answer
    status_body = json.loads(body)
    assert (status_body["kind"], status_body["status"], status_body["code"]) == ("Status", "Failure", status), body
    error = status_body["error"]
    assert isinstance(error, str) and status_body["message"] == error, body
    assert error.startswith("malformed HTTP request: "), error
    assert names in error, error
    assert HINT in error, error
    return error


def _a_review_still_passes(server: Server) -> None:
    client = server.client()
    status, body = client.post("/validate", review(gpu_pod()))
    client.close()
    assert status == 200 and body["response"]["allowed"] is True, body


HEAD = b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "status", "reason", "names"),
    [
        pytest.param(b"xyz\r\n\r\n", 400, "Bad Request", "Invalid Request Line", id="garbage-request-line"),
        pytest.param(b"GET\x01 / HTTP/1.1\r\nHost: x\r\n\r\n", 400, "Bad Request", "Invalid Method", id="bad-method"),
        pytest.param(
            b"POST /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
            414,
            "URI Too Long",
            "Request Line is too large (9015 > 8190)",
            id="request-line-over-the-limit",
        ),
        pytest.param(
            HEAD + b"NoColonHere\r\nContent-Length: 2\r\n\r\n{}",
            400,
            "Bad Request",
            "Invalid HTTP Header: 'NoColonHere'",
            id="header-without-colon",
        ),
        pytest.param(
            HEAD + b"Bad Name: v\r\nContent-Length: 2\r\n\r\n{}",
            400,
            "Bad Request",
            "Invalid HTTP header name: 'Bad Name'",
            id="invalid-header-name",
        ),
        pytest.param(
            HEAD + b"X-A: a\r\n  b\r\nContent-Length: 2\r\n\r\n{}",
            400,
            "Bad Request",
            "Obsolete line folding",
            id="obsolete-folding",
        ),
        pytest.param(
            HEAD + b"".join(b"X-%d: v\r\n" % i for i in range(120)) + b"\r\n",
            431,
            "Request Header Fields Too Large",
            "limit request headers fields",
            id="too-many-headers",
        ),
        pytest.param(
            HEAD + b"Expect: 200-ok\r\nContent-Length: 2\r\n\r\n{}",
            417,
            "Expectation Failed",
            "Unable to comply with expectation: '200-ok'",
            id="expect-refused",
        ),
        pytest.param(  # gunicorn keeps the reason "Bad Request" for its 501: the status line is gunicorn's
            HEAD + b"Transfer-Encoding: br\r\n\r\n",
            501,
            "Bad Request",
            "Unsupported transfer coding: 'br'",
            id="unsupported-transfer-encoding",
        ),
    ],
)
def test_a_request_gunicorn_rejects_is_answered_in_json(
    server: Server, request_bytes: bytes, status: int, reason: str, names: str
) -> None:
    (answer,) = _answers(exchange(server, request_bytes))
    _assert_json_error(answer, status, reason, names)
    _a_review_still_passes(server)


def test_a_chunk_size_gunicorn_cannot_read_is_answered_in_json(server: Server) -> None:
    """A body the app does not read (a 404) is read by gunicorn, to keep the connection alive: its bad chunk size is
    gunicorn's to answer, after the app's answer (a body the app reads is the app's 400, in ``test_server``)."""
    chunked = b"POST /nope HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"
    first, second = _answers(exchange(server, chunked))
    assert first[0].startswith(b"HTTP/1.1 404 ") and "no such endpoint" in json.loads(first[2])["error"], first
    _assert_json_error(second, 400, "Bad Request", "Invalid chunk size: b'zz'")
    _a_review_still_passes(server)


def test_gunicorn_still_logs_what_it_rejected(server: Server) -> None:
    exchange(server, b"xyz\r\n\r\n")
    deadline = time.monotonic() + 10
    while "Invalid request from ip=127.0.0.1: Invalid HTTP request line: 'xyz'" not in server.output():
        assert time.monotonic() < deadline, server.output()[-2000:]
        time.sleep(0.1)


# -- the worker's method, over socket pairs ------------------------------------------------------------------------


@pytest.fixture
def worker() -> Iterator[TurnWorker]:
    w = TurnWorker(0, os.getppid(), [], None, 30, Config(), mock.MagicMock())
    yield w
    w.tmp.close()


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(5)
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def test_an_error_of_gunicorn_itself_is_a_500_that_points_to_the_log(worker: Any) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        worker.handle_error(None, ours, ("127.0.0.1", 1), RuntimeError("boom"))
        ours.close()
        (answer,) = _answers(_read_all(theirs))
    status_line, headers, body = answer
    assert status_line == b"HTTP/1.1 500 Internal Server Error" and headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error.startswith("internal error") and "see the webhook's log" in error, error
    worker.log.exception.assert_called_once()  # gunicorn's own logging, with the traceback


def test_json_only_inside_the_workers_handle_error(worker: Any) -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        worker.handle_error(None, ours, ("127.0.0.1", 1), InvalidRequestLine("xyz"))
        util.write_error(ours, 400, "Bad Request", "elsewhere")  # gunicorn's own, outside that method
        ours.close()
        got = _read_all(theirs)
    json_answer, html_answer = _answers(got)
    _assert_json_error(json_answer, 400, "Bad Request", "xyz")
    assert html_answer[1]["content-type"] == "text/html"
    worker.log.warning.assert_called_once()


def test_the_answer_never_raises_nor_waits_for_a_client_that_does_not_read(worker: Any) -> None:
    """A plain socket (a connection whose TLS handshake failed) is written without waiting, as gunicorn does; one
    whose buffer is full, or closed, loses the answer and the method returns."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            while True:
                ours.send(b"x" * 65536)
        ours.setblocking(True)  # as gthread leaves it: a blocking write would wait for ever
        done = threading.Event()

        def answer() -> None:
            worker.handle_error(None, ours, ("127.0.0.1", 1), LimitRequestLine(9000, 8190))
            done.set()

        threading.Thread(target=answer, daemon=True).start()
        assert done.wait(5), "handle_error waited for a client that does not read"
    closed, _ = socket.socketpair()
    closed.close()
    worker.handle_error(None, closed, ("127.0.0.1", 1), InvalidRequestLine("xyz"))  # does not raise

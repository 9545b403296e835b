"""webhook.http1 against a server that answers with scripted bytes: framing, keep-alive, and every malformed answer
raising (never a hang, never a wrong body taken for the right one)."""

from __future__ import annotations

import contextlib
import errno
import http.client
import os
import socket
import ssl
import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook import http1

CLOSE = b""
"""A script step: close the connection without answering."""


class Scripted:
    """A loopback server that reads each request whole and answers it with the next scripted bytes (written in the
    given pieces), on whichever connection it came. ``requests``: the raw requests; ``connections``: accepted."""

    def __init__(self, answers: list[bytes | list[bytes]]) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while self.answers:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with conn, contextlib.suppress(OSError):  # the client may hang up mid-answer
                self._answer_on(conn)

    def _answer_on(self, conn: socket.socket) -> None:
        buffered = b""
        while self.answers:
            while b"\r\n\r\n" not in buffered:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                buffered += chunk
            head, _, rest = buffered.partition(b"\r\n\r\n")
            length = next(
                int(v) for k, _, v in (h.partition(b": ") for h in head.split(b"\r\n")) if k == b"Content-Length"
            )
            while len(rest) < length:
                rest += conn.recv(65536)
            self.requests.append(head + b"\r\n\r\n" + rest[:length])
            buffered = rest[length:]
            answer = self.answers.pop(0)
            if answer == CLOSE:
                return
            for piece in answer if isinstance(answer, list) else [answer]:
                conn.sendall(piece)
            whole = answer if isinstance(answer, bytes) else b"".join(answer)
            if b"Connection: close" in whole or (whole.startswith(b"HTTP/1.0") and b"keep-alive" not in whole):
                return

    def close(self) -> None:
        self.answers.clear()
        self.listener.close()
        self.thread.join(5)


@pytest.fixture
def server(request: Any) -> Iterator[Scripted]:
    s = Scripted(request.param)
    yield s
    s.close()


def ok(body: bytes = b'{"kind":"Event"}', status: str = "201 Created") -> bytes:
    return (
        b"HTTP/1.1 "
        + status.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )


def connect(s: Scripted, timeout: float = 5.0) -> http1.Connection:
    return http1.Connection("127.0.0.1", s.port, None, timeout)


@pytest.mark.parametrize("server", [[ok(), ok(b"second", "200 OK")]], indirect=True)
def test_two_requests_go_over_one_connection_each_written_whole(server: Scripted) -> None:
    conn = connect(server)
    headers = {"Content-Type": "application/json", "Authorization": "Bearer t"}
    assert conn.post("/api/v1/namespaces/a/events", b'{"x":1}', headers) == (201, "Created", b'{"kind":"Event"}')
    assert conn.open
    assert conn.post("/p", b"", {}) == (200, "OK", b"second")
    assert server.connections == 1
    assert server.requests[0] == (
        b"POST /api/v1/namespaces/a/events HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Length: 7\r\n"
        b"Content-Type: application/json\r\nAuthorization: Bearer t\r\n\r\n"
        b'{"x":1}' % server.port
    )


CHUNKED = (
    b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5;name=value\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n"
)


@pytest.mark.parametrize("server", [[CHUNKED, ok()]], indirect=True)
def test_a_chunked_answer_is_read_whole_and_the_connection_kept(server: Scripted) -> None:
    conn = connect(server)
    assert conn.post("/p", b"{}", {}) == (201, "Created", b"hello world")
    assert conn.post("/p", b"{}", {})[0] == 201  # the trailers were read: the next answer starts clean
    assert server.connections == 1


@pytest.mark.parametrize(
    "server", [[b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n" + ok()]], indirect=True
)
def test_interim_answers_are_skipped(server: Scripted) -> None:
    assert connect(server).post("/p", b"{}", {})[:2] == (201, "Created")


@pytest.mark.parametrize(
    "server",
    [
        [
            b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 409 Conflict\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            ok(),
        ]
    ],
    indirect=True,
)
def test_no_body_on_204_and_a_new_connection_after_connection_close(server: Scripted) -> None:
    conn = connect(server)
    assert conn.post("/p", b"{}", {}) == (204, "No Content", b"")
    assert conn.post("/p", b"{}", {}) == (409, "Conflict", b"{}")
    assert not conn.open
    assert conn.post("/p", b"{}", {})[0] == 201
    assert server.connections == 2


@pytest.mark.parametrize("server", [[b"HTTP/1.0 201 Created\r\n\r\nto the end", ok()]], indirect=True)
def test_a_body_without_length_ends_with_the_connection(server: Scripted) -> None:
    conn = connect(server)
    assert conn.post("/p", b"{}", {}) == (201, "Created", b"to the end")
    assert not conn.open
    assert conn.post("/p", b"{}", {})[0] == 201


@pytest.mark.parametrize(
    "server", [[b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n1", ok()]], indirect=True
)
def test_http_1_0_keeps_the_connection_only_when_it_says_so(server: Scripted) -> None:
    conn = connect(server)
    assert conn.post("/p", b"{}", {})[2] == b"1"
    assert conn.open
    assert conn.post("/p", b"{}", {})[0] == 201
    assert server.connections == 1


@pytest.mark.parametrize("server", [[CLOSE, ok()]], indirect=True)
def test_a_connection_closed_without_an_answer_raises_remote_disconnected_and_the_next_post_reconnects(
    server: Scripted,
) -> None:
    conn = connect(server)
    with pytest.raises(http.client.RemoteDisconnected):
        conn.post("/p", b"{}", {})
    assert not conn.open
    assert conn.post("/p", b"{}", {})[0] == 201
    assert server.connections == 2


@pytest.mark.parametrize("server", [[ok(), CLOSE, CLOSE, ok()]], indirect=True)
def test_a_kept_alive_connection_closed_without_an_answer_raises_stale_and_a_new_one_does_not(
    server: Scripted,
) -> None:
    """Stale says the server had closed a connection kept from an earlier request; on a connection opened for this
    request the same hang-up is a plain RemoteDisconnected."""
    conn = connect(server)
    assert conn.post("/p", b"{}", {})[0] == 201
    with pytest.raises(http1.Stale):
        conn.post("/p", b"{}", {})
    with pytest.raises(http.client.RemoteDisconnected) as raised:
        conn.post("/p", b"{}", {})
    assert not isinstance(raised.value, http1.Stale)
    assert conn.post("/p", b"{}", {})[0] == 201
    assert server.connections == 3


MALFORMED = {
    "status line": b"HTTP/1.1 20 Created\r\n\r\n",
    "not HTTP": b"SSH-2.0-OpenSSH\r\n\r\n",
    "header without colon": b"HTTP/1.1 201 Created\r\nContent-Length 2\r\n\r\n{}",
    "space before colon": b"HTTP/1.1 201 Created\r\nContent-Length : 2\r\n\r\n{}",
    "two lengths": b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "negative length": b"HTTP/1.1 201 Created\r\nContent-Length: -2\r\n\r\n{}",
    "short body": b"HTTP/1.1 201 Created\r\nContent-Length: 20\r\nConnection: close\r\n\r\n{}",
    "head cut": b"HTTP/1.1 201 Created\r\nContent-Length: 2\r\nConnection: close\r\n",
    "chunk size": b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    "chunk end": b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}xx\r\n0\r\n\r\n",
    "gzip": b"HTTP/1.1 201 Created\r\nTransfer-Encoding: gzip\r\n\r\n",
    "long line": b"HTTP/1.1 201 Created\r\nX: " + b"a" * (http1.LINE_LIMIT + 10) + b"\r\n\r\n",
    "many headers": b"HTTP/1.1 201 Created\r\n" + b"X: a\r\n" * (http1.HEADER_LIMIT + 1) + b"\r\n",
    "huge length": b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n" % (http1.BODY_LIMIT + 1),
}


@pytest.mark.parametrize(
    "server", [[answer, ok()] for answer in MALFORMED.values()], ids=list(MALFORMED), indirect=True
)
def test_a_malformed_answer_raises_and_closes_the_connection(server: Scripted) -> None:
    conn = connect(server)
    with pytest.raises(http.client.HTTPException):
        conn.post("/p", b"{}", {})
    assert not conn.open
    assert conn.post("/p", b"{}", {})[0] == 201  # a new connection, the next answer


@pytest.mark.parametrize("server", [[ok()]], indirect=True)
def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(server: Scripted) -> None:
    conn = connect(server)
    for headers in ({"Authorization": "Bearer t\r\nX-Injected: 1"}, {"X\nY": "v"}, {"A:B": "v"}):
        with pytest.raises(ValueError, match="no header may hold"):
            conn.post("/p", b"{}", headers)
    assert conn.post("/p", b"{}", {"Authorization": "Bearer t"})[0] == 201
    assert server.requests[0].count(b"\r\n") == 5  # request line, Host, Content-Length, Authorization, blank


def test_the_host_header_names_the_port_only_when_it_is_not_the_default() -> None:
    assert http1.Connection("10.0.0.1", 443, ssl.create_default_context(), 1).host == "10.0.0.1"
    assert http1.Connection("10.0.0.1", 6443, ssl.create_default_context(), 1).host == "10.0.0.1:6443"
    assert http1.Connection("fd00::1", 80, None, 1).host == "[fd00::1]"
    assert http1.Connection("fd00::1", 8080, None, 1).host == "[fd00::1]:8080"


@pytest.mark.parametrize("server", [[ok(), ok()]], indirect=True)
@pytest.mark.parametrize(
    "dead", [errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, 0], ids=["timedout", "host", "net", "own-timeout"]
)
def test_a_kept_connection_that_keepalive_found_dead_is_stale(server: Scripted, dead: int) -> None:
    """A kept-alive connection whose TCP keepalive probes went unanswered while it was idle (the kernel broke it:
    ETIMEDOUT, at once, on the next write) is sent again at once on a new connection, as one the server closed: not
    a try spent. A request's own timeout is no broken connection: it stays a TimeoutError."""
    conn = connect(server)
    assert conn.post("/p", b"{}", {})[0] == 201
    kept = conn._sock
    assert kept is not None
    real: socket.socket = kept

    class Broken:
        def sendall(self, data: bytes) -> None:
            if dead == errno.ETIMEDOUT:
                raise TimeoutError(dead, "Connection timed out")
            raise OSError(dead, os.strerror(dead)) if dead else TimeoutError("timed out")

        def close(self) -> None:
            real.close()

    conn._sock = cast(Any, Broken())
    with pytest.raises(http1.Stale if dead else TimeoutError) as raised:
        conn.post("/p", b"{}", {})
    assert isinstance(raised.value, http1.Stale) == bool(dead)
    assert not conn.open
    assert conn.post("/p", b"{}", {})[0] == 201  # on a new connection


def test_a_server_that_never_answers_times_out() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        conn = http1.Connection("127.0.0.1", listener.getsockname()[1], None, 0.3)
        with pytest.raises(TimeoutError):
            conn.post("/p", b"{}", {})
        assert not conn.open
    finally:
        listener.close()


@settings(max_examples=40, deadline=None)
@given(
    body=st.binary(min_size=0, max_size=3000),
    chunks=st.lists(st.integers(min_value=1, max_value=700), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=1, max_value=400), min_size=1, max_size=12),
    chunked=st.booleans(),
)
def test_any_body_in_any_chunks_written_in_any_pieces_is_read_as_sent(
    body: bytes, chunks: list[int], cuts: list[int], chunked: bool
) -> None:
    if chunked:
        framed, at = b"", 0
        for size in chunks * (len(body) // max(sum(chunks), 1) + 1):
            if at >= len(body):
                break
            part = body[at : at + size]
            framed += b"%x\r\n" % len(part) + part + b"\r\n"
            at += size
        answer = b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n" + framed + b"0\r\n\r\n"
    else:
        answer = b"HTTP/1.1 201 Created\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    pieces, at = [], 0
    for cut in cuts * (len(answer) // sum(cuts) + 1):
        if at >= len(answer):
            break
        pieces.append(answer[at : at + cut])
        at += cut
    s = Scripted([pieces, ok()])
    try:
        conn = connect(s)
        assert conn.post("/p", b"{}", {}) == (201, "Created", body)
        assert conn.post("/p", b"{}", {})[0] == 201
        assert s.connections == 1
    finally:
        s.close()


@pytest.mark.parametrize("kept", ["absent", "a list", "None"])
def test_tls_material_is_named_whatever_the_kubernetes_client_keeps_the_files_it_wrote_in(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, kept: str
) -> None:
    """A file the kubernetes client's loader wrote a kubeconfig's certificate-authority-data to is told from one the
    kubeconfig names by the client's private ``kube_config._temp_files``, a dict: a client without it, or keeping
    them otherwise, raised AttributeError out of ``tls_context`` (a list) or named a /tmp/tmpXXXXXXXX alone (found by
    a review). The warning names the file and the field it may have come from, and raises only ``UnreadableTLS``."""
    from kubernetes import client
    from kubernetes.config import kube_config

    junk = tmp_path / "tmpjunk"
    junk.write_text("not a certificate\n")
    if kept == "absent":
        monkeypatch.delattr(kube_config, "_temp_files")
    else:
        monkeypatch.setattr(kube_config, "_temp_files", [str(junk)] if kept == "a list" else None)
    configuration = client.Configuration()
    configuration.host, configuration.ssl_ca_cert = "https://127.0.0.1:6443", str(junk)
    with pytest.raises(http1.UnreadableTLS) as err:
        http1.tls_context(configuration)
    named = f"its certificate authority ({junk}, or the kubeconfig's certificate-authority-data written there by"
    assert str(err.value).startswith(named), err.value

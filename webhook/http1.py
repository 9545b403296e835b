"""One HTTP/1.1 request at a time over a kept-alive connection: what the Events relay needs to create an Event.

The relay creates one Event per GPU pod admitted, and each is a POST whose answer matters only by its status (a
PATCH raises the count of an Event reported again: ``webhook.events``).
``http.client`` spends most of such a request's CPU on its generality: a call and a check per header line going out,
and the ``email`` package's parser for the headers coming back. Here a request goes out as one write, and the
answer's head is read line by line from a buffered reader (C code), keeping only what framing the body needs:
``Content-Length``, ``Transfer-Encoding: chunked``, ``Connection``. Half the sending thread's CPU per Event
(``docs/benchmarks.md``, 34.). The answer is read as RFC 9112 says (sections 6 and 7): interim 1xx answers
skipped, no body for 204 and 304, chunked bodies with their extensions and trailers, a body without a length read
to the end of the connection; anything else malformed raises ``http.client.HTTPException``, a connection that
closed before answering ``http.client.RemoteDisconnected`` (as ``http.client`` does: the caller may try again on a
new connection), and ``Stale`` when that connection had been kept alive from an earlier request.
"""

from __future__ import annotations

import errno
import functools
import http.client
import socket
import ssl
from collections.abc import Callable
from typing import Any, BinaryIO

LINE_LIMIT = 65536
"""The longest line of an answer's head (``http.client``'s limit too)."""
HEADER_LIMIT = 100
"""The most header (or trailer) lines in an answer."""
BODY_LIMIT = 16 << 20
"""The longest answer body read: an Event comes back as a few kB."""
KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES = 30, 10, 3
"""TCP keepalive on the connections to the API server (the node watch's and list's, the Events'), through the
``kubernetes`` client configuration's ``socket_options`` (``keepalive_options``). A connection that a NAT or load
balancer dropped without a reset, or whose API server vanished, looks open and brings nothing; a quiet node watch
brings nothing for minutes too (kube-apiserver's watch cache sends a bookmark only once its resourceVersion passed
the one the watch began from), so silence proves nothing. The kernel probes a connection idle for 30 s (client-go
dials with a 30 s keepalive) every 10 s and breaks it when 3 probes go unanswered: a dead peer is found within a
minute of the last byte received (client-go's, with Go's 15 s x 9 probes, after 2.75 minutes). The probes also
keep the idle timers of NATs and cloud load balancers (Azure's 4 minutes, AWS NLB's 350 s) from dropping a
quiet connection at all."""
TCP_NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]
"""The socket options of a connection whose configuration names none (urllib3's default): a request goes out as one
write, and its answer waits for no delayed ACK."""


def keepalive_options() -> list[tuple[int, int, int]]:
    """Socket options for a ``kubernetes`` client configuration (``socket_options``: urllib3 applies them to each
    connection it opens, ``Connection`` too): urllib3's default (``TCP_NODELAY``) and keepalive as above."""
    from kubernetes.utils.keepalive import tcp_keepalive_socket_options

    return tcp_keepalive_socket_options(KEEPALIVE_IDLE_S, KEEPALIVE_INTERVAL_S, KEEPALIVE_PROBES)


class UnreadableTLS(ValueError):
    """A ``kubernetes`` client configuration's TLS material (its CA, its client certificate and key) cannot be read:
    the message says which, from what file, and why."""


def tls_context(configuration: Any) -> ssl.SSLContext:
    """The TLS context of a ``kubernetes`` client configuration, its material read as urllib3 reads it for the
    client at each connection, whether ``verify_ssl`` or not: the CA (``ssl_ca_cert``: a kubeconfig's
    certificate-authority, or its certificate-authority-data written to a file by the loader, or the service
    account's ca.crt; ``ca_cert_data``), the client certificate and its key (``cert_file``, ``key_file``); nothing
    verified where ``verify_ssl`` is off. ``UnreadableTLS`` where they cannot be read: the client's loader reads none
    of it, so a kubeconfig whose CA is no certificate loaded, and failed at each connection
    (``watch.check_tls``)."""
    c = configuration
    try:
        tls = ssl.create_default_context(cafile=c.ssl_ca_cert, cadata=c.ca_cert_data)
    except (OSError, ValueError) as err:  # ssl.SSLError is an OSError
        raise UnreadableTLS(
            f"its certificate authority ({_file(c, 'ssl_ca_cert') or 'ca_cert_data'})"
            f" cannot be read as PEM certificates: {err}"
        ) from err
    if c.cert_file:
        try:
            tls.load_cert_chain(
                c.cert_file,
                c.key_file,
                password=no_pass_phrase(
                    f"its client key ({_file(c, 'key_file') or _file(c, 'cert_file')})",
                    "the kubernetes client",
                    "the kubeconfig",
                ),
            )
        except UnreadableTLS:
            raise
        except (OSError, ValueError) as err:
            raise UnreadableTLS(
                f"its client certificate ({_file(c, 'cert_file')}) and key"
                f" ({_file(c, 'key_file')}) cannot be read as a PEM certificate"
                f" and the key it was issued for: {err}"
            ) from err
    if not c.verify_ssl:
        tls.check_hostname = False
        tls.verify_mode = ssl.CERT_NONE
    return tls


LOADER_FILES = {
    "ssl_ca_cert": "the kubeconfig's certificate-authority-data",
    "cert_file": "the kubeconfig's client-certificate-data, or its exec plugin's clientCertificateData",
    "key_file": "the kubeconfig's client-key-data, or its exec plugin's clientKeyData",
}
"""What a client configuration's TLS file is to a user where the kubernetes client's loader wrote it (``_file``)."""


def _file(configuration: Any, attribute: str) -> str | None:
    """A client configuration's TLS file (``attribute``, of LOADER_FILES) as a user knows it: the kubeconfig's field
    where it is one of the temporary files the kubernetes client's loader writes such a field to, else its path. The
    warnings named such a file, /tmp/tmpXXXXXXXX, which means nothing to a user (found by a review). Those files are
    told by the client's private ``kube_config._temp_files`` (a dict, content -> path); a client without it, or
    keeping them otherwise, raised AttributeError here, or named the file alone: the file is named with the field it
    may have come from."""
    from kubernetes.config import kube_config

    path: str | None = getattr(configuration, attribute)
    written = getattr(kube_config, "_temp_files", None)
    if not isinstance(written, dict):
        return f"{path}, or {LOADER_FILES[attribute]} written there by the kubernetes client" if path else path
    return LOADER_FILES[attribute] if path in written.values() else path


def no_pass_phrase(key: str, user: str, where: str) -> Callable[[], bytes]:
    """``load_cert_chain``'s password: an encrypted ``key`` (as said to a user) is refused at once, with
    ``UnreadableTLS`` saying that ``user`` cannot use it and to give ``where`` the key decrypted. Without a password
    OpenSSL asked for one on the terminal ("Enter PEM pass phrase:") and waited, and said only '[Errno 22] Invalid
    argument' without a terminal. The kubernetes client gives urllib3 no password, which refuses such a key at each
    connection; the serving key is read again at each renewal, with nobody there to type one."""
    return functools.partial(_encrypted, key, user, where)


def _encrypted(key: str, user: str, where: str) -> bytes:
    raise UnreadableTLS(
        f"{key} is encrypted; {user} cannot use an encrypted key: decrypt it"
        f" (openssl pkey -in KEY -out DECRYPTED) and give {where} the decrypted key"
    )


DEAD_ERRNOS = frozenset({errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN})
"""How the kernel reports a connection TCP keepalive broke: its probes unanswered (ETIMEDOUT), or answered by a
router's ICMP unreachable (a review of the keepalive: only ETIMEDOUT was known, the rest spent a try)."""


class Stale(http.client.RemoteDisconnected):
    """A kept-alive connection broke before its answer came: the server, or a load balancer on the way, closed it
    while it was idle, or TCP keepalive found it dead (``KEEPALIVE_IDLE_S``). Worth sending again at once on a new
    connection, not counted as a failed try; the request may have reached the server (an Event then answers
    AlreadyExists)."""


class Connection:
    """A kept-alive connection to ``address:port`` (TLS with ``tls``), opened at the first request and again after
    the server closed it. One request at a time: a thread of its own per connection."""

    def __init__(
        self,
        address: str,
        port: int,
        tls: ssl.SSLContext | None,
        timeout: float,
        options: list[tuple[int, int, int]] | None = None,
    ) -> None:
        self.address, self.port, self.tls, self.timeout = address, port, tls, timeout
        self.options = TCP_NODELAY if options is None else options
        """Socket options set on each connection opened (a configuration's ``socket_options``), once it is connected,
        where urllib3 sets them before: the same for keepalive and TCP_NODELAY, not for options that act on the SYN."""
        default = 443 if tls is not None else 80
        host = f"[{address}]" if ":" in address else address
        self.host = host if port == default else f"{host}:{port}"
        self._sock: socket.socket | None = None
        self._in: BinaryIO | None = None
        self.head: dict[bytes, bytes] = {}
        """The last answer's header fields, names lowercased (Retry-After for ``webhook.events``)."""

    def _open(self) -> tuple[socket.socket, BinaryIO]:
        sock = socket.create_connection((self.address, self.port), timeout=self.timeout)
        try:
            for level, name, value in self.options:
                sock.setsockopt(level, name, value)
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_hostname=self.address)
        except BaseException:
            sock.close()
            raise
        self._sock, self._in = sock, sock.makefile("rb")
        return sock, self._in

    def close(self) -> None:
        if self._in is not None:
            self._in.close()
        if self._sock is not None:
            self._sock.close()
        self._sock = self._in = None

    @property
    def open(self) -> bool:
        return self._sock is not None

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
        """``request`` with POST."""
        return self.request("POST", path, body, headers)

    def request(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, bytes]:
        """Send ``method path`` with ``body`` and ``headers`` (``Host`` and ``Content-Length`` are written here) and
        read the answer: (status, reason, body), its header fields in ``head``. On any failure the connection is
        closed and the error raised."""
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.host}", f"Content-Length: {len(body)}"]
        for name, value in headers.items():
            if any(c in name or c in value for c in "\r\n\0") or ":" in name:
                raise ValueError(f"the header {name!r} holds a character no header may hold")
            head.append(f"{name}: {value}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        reused = self._sock is not None and self._in is not None
        if self._sock is None or self._in is None:
            sock, reader = self._open()
        else:
            sock, reader = self._sock, self._in
        self.head = {}
        try:
            sock.sendall(request)
            status, reason, data, keep = read_answer(reader, self.head)
        except OSError as err:
            self.close()
            # reset, broken pipe, closed without answering; or broken by TCP keepalive while idle (ETIMEDOUT; or the
            # ICMP answer to a probe, host or network unreachable: the API server's host gone). This request's own
            # timeout carries no errno, and is no broken connection
            if reused and (isinstance(err, ConnectionError) or err.errno in DEAD_ERRNOS):
                raise Stale(f"the kept-alive connection broke before the answer: {err}") from err
            raise
        except BaseException:
            self.close()
            raise
        if not keep:
            self.close()
        return status, reason, data


def _line(reader: BinaryIO) -> bytes:
    line = reader.readline(LINE_LIMIT + 1)
    if len(line) > LINE_LIMIT:
        raise http.client.LineTooLong("a line of the answer's head")
    return line


def _fields(reader: BinaryIO) -> dict[bytes, bytes]:
    """Header (or trailer) lines up to the blank line, names lowercased; a repeated name keeps its values joined."""
    fields: dict[bytes, bytes] = {}
    for _ in range(HEADER_LIMIT + 1):
        line = _line(reader)
        if line in (b"\r\n", b"\n"):
            return fields
        if not line:
            raise http.client.IncompleteRead(b"", None)
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise http.client.HTTPException(f"a header line that is not 'name: value': {line[:80]!r}")
        key = name.lower()
        fields[key] = fields[key] + b", " + value.strip() if key in fields else value.strip()
    raise http.client.HTTPException(f"more than {HEADER_LIMIT} header lines")


def _exactly(reader: BinaryIO, size: int) -> bytes:
    data = reader.read(size)
    if len(data) < size:
        raise http.client.IncompleteRead(data, size - len(data))
    return data


def _chunked(reader: BinaryIO) -> bytes:
    parts: list[bytes] = []
    total = 0
    while True:
        line = _line(reader)
        size_text = line.split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise http.client.HTTPException(f"a chunk size that is not hexadecimal: {line[:80]!r}") from None
        if size < 0:
            raise http.client.HTTPException(f"a negative chunk size: {line[:80]!r}")
        if size == 0:
            _fields(reader)  # trailers, up to the blank line
            return b"".join(parts)
        total += size
        if total > BODY_LIMIT:
            raise http.client.HTTPException(f"an answer body over {BODY_LIMIT} bytes")
        parts.append(_exactly(reader, size))
        if _line(reader) not in (b"\r\n", b"\n"):
            raise http.client.HTTPException("a chunk not followed by a line end")


def read_answer(reader: BinaryIO, head: dict[bytes, bytes] | None = None) -> tuple[int, str, bytes, bool]:
    """Read one answer: (status, reason, body, whether the connection stays open for the next request); its header
    fields (names lowercased) into ``head`` when given."""
    while True:
        line = _line(reader)
        if not line:
            raise http.client.RemoteDisconnected("the server closed the connection without answering")
        version, _, rest = line.rstrip(b"\r\n").partition(b" ")
        code, _, reason_bytes = rest.partition(b" ")
        if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise http.client.BadStatusLine(line[:80].decode("latin-1"))
        status = int(code)
        fields = _fields(reader)
        if 100 <= status < 200 and status != 101:
            continue  # an interim answer (100 Continue, 103 Early Hints): the final one follows
        break
    if head is not None:
        head.update(fields)
    connection = {token.strip() for token in fields.get(b"connection", b"").lower().split(b",")}
    keep = b"close" not in connection if version == b"HTTP/1.1" else b"keep-alive" in connection
    reason = reason_bytes.decode("latin-1")
    if status in (101, 204, 304):
        return status, reason, b"", keep and status != 101
    coding = fields.get(b"transfer-encoding", b"").lower()
    if coding:
        if coding.rsplit(b",", 1)[-1].strip() != b"chunked":
            raise http.client.HTTPException(f"a transfer coding this client does not read: {coding[:80]!r}")
        return status, reason, _chunked(reader), keep
    if b"content-length" in fields:
        lengths = {v.strip() for v in fields[b"content-length"].split(b",")}
        if len(lengths) != 1 or not next(iter(lengths)).isdigit():
            raise http.client.HTTPException(f"a Content-Length that is not one number: {fields[b'content-length']!r}")
        size = int(lengths.pop())
        if size > BODY_LIMIT:
            raise http.client.HTTPException(f"an answer body of {size} bytes, over {BODY_LIMIT}")
        return status, reason, _exactly(reader, size), keep
    data = reader.read(BODY_LIMIT + 1)  # no length: the body ends with the connection
    if len(data) > BODY_LIMIT:
        raise http.client.HTTPException(f"an answer body over {BODY_LIMIT} bytes")
    return status, reason, data, False

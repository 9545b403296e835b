"""certs.issue: what is issued, how it is read back and planned, how files are written, and a real TLS handshake."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import ssl
import stat
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, ExtensionOID, NameOID

from certs import CertsError
from certs import issue as ci

SVC, NS = "gpu-admission", "gpu-system"
NOW = dt.datetime.now(dt.UTC)
CLUSTER_NAMES = [SVC, f"{SVC}.{NS}", f"{SVC}.{NS}.svc", f"{SVC}.{NS}.svc.cluster.local"]


@pytest.fixture(scope="module")
def dev_bundle() -> ci.Bundle:
    return ci.issue(SVC, NS, dev=True)


@pytest.fixture(scope="module")
def prod_bundle() -> ci.Bundle:
    return ci.issue(SVC, NS)


def leaf(bundle: ci.Bundle) -> x509.Certificate:
    return ci.load_certificates(bundle.tls_crt)[0]


def ca(bundle: ci.Bundle) -> x509.Certificate:
    return ci.load_certificates(bundle.ca_crt)[0]


# -- what is issued ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dev", "expected"),
    [
        pytest.param(False, CLUSTER_NAMES, id="cluster-names-only"),
        pytest.param(True, [*CLUSTER_NAMES, "localhost", "127.0.0.1"], id="dev-adds-localhost-and-loopback"),
    ],
)
def test_serving_certificate_sans(dev, expected, dev_bundle, prod_bundle):
    cert = leaf(dev_bundle if dev else prod_bundle)
    assert ci.sans(cert) == expected
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)] == (["127.0.0.1"] if dev else [])


def test_serving_certificate_is_a_server_leaf(prod_bundle):
    cert = leaf(prod_bundle)
    assert cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH]
    )
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca is False
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    assert usage.digital_signature and not usage.key_cert_sign
    assert ci.signed_by(cert, ca(prod_bundle))
    assert 364.9 < ci.days_left(cert) <= 365.0


def test_ca_constraints(prod_bundle):
    cert = ca(prod_bundle)
    basic = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert basic.critical and basic.value.ca is True and basic.value.path_length == 0
    usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign and usage.value.crl_sign
    assert cert.issuer == cert.subject and ci.signed_by(cert, cert)
    assert ci.days_left(cert) > 3649  # ten times the leaf, so most renewals keep it


@pytest.mark.parametrize(
    ("key_type", "kind", "size"),
    [
        pytest.param("ecdsa", ec.EllipticCurvePrivateKey, 256, id="ecdsa-p256"),
        pytest.param("rsa", rsa.RSAPrivateKey, 2048, id="rsa-2048"),
    ],
)
def test_key_types(key_type, kind, size):
    bundle = ci.issue(SVC, NS, key_type=key_type, days=30)
    key = ci.load_key(bundle.tls_key)
    assert isinstance(key, kind) and key.key_size == size
    assert ci.key_matches(leaf(bundle), key)
    assert bundle.tls_key.startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8, what Go and OpenSSL both read


@pytest.mark.parametrize(
    ("names", "missing"),
    [
        pytest.param(ci.service_names(SVC, NS), [], id="cluster-names-covered"),
        pytest.param(ci.Names(("GPU-ADMISSION.gpu-system.svc",)), [], id="dns-case-insensitive"),
        pytest.param(ci.service_names(SVC, NS, dev=True), ["localhost", "127.0.0.1"], id="dev-names-missing"),
        pytest.param(ci.service_names("other", NS), ["other", "other.gpu-system"], id="other-service"),
        pytest.param(ci.Names((), ("::1",)), ["::1"], id="ip-not-covered"),
    ],
)
def test_missing_names(names, missing, prod_bundle):
    assert ci.missing_names(leaf(prod_bundle), names)[: len(missing)] == missing
    assert ci.covers(leaf(prod_bundle), names) is (not missing)


def test_signed_by_another_ca_is_false(prod_bundle, dev_bundle):
    assert not ci.signed_by(leaf(prod_bundle), ca(dev_bundle))
    assert not ci.signed_by(leaf(prod_bundle), leaf(prod_bundle))


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"not pem", id="text"),
        pytest.param(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n", id="bad-der"),
    ],
)
def test_garbage_reads_as_nothing(garbage):
    assert ci.load_certificates(garbage) == []
    assert ci.load_key(garbage) is None
    assert ci.describe(garbage) == []


# -- problems and plan -------------------------------------------------------------------------------------------------


def _with(bundle: ci.Bundle, **changes: Any) -> ci.Bundle:
    return replace(bundle, **changes)


@pytest.mark.parametrize(
    ("make", "expect"),
    [
        pytest.param(lambda b, o: b, None, id="valid"),
        pytest.param(lambda b, o: _with(b, tls_key=o.tls_key), "does not match", id="key-mismatch"),
        pytest.param(lambda b, o: _with(b, tls_key=b"junk"), "no usable private key", id="key-garbage"),
        pytest.param(lambda b, o: _with(b, ca_crt=o.ca_crt), "not signed by", id="wrong-ca"),
        pytest.param(lambda b, o: _with(b, tls_crt=b""), "holds no certificate", id="no-leaf"),
        pytest.param(lambda b, o: _with(b, ca_crt=b"x"), "ca.crt holds no certificate", id="no-ca"),
        pytest.param(lambda b, o: ci.issue(SVC, NS, days=10), "expires in 10.0 days", id="due-for-renewal"),
        pytest.param(lambda b, o: ci.issue(SVC, NS, now=NOW - dt.timedelta(days=400)), "expired", id="expired"),
        pytest.param(lambda b, o: ci.issue(SVC, NS, now=NOW + dt.timedelta(days=1)), "not valid before", id="future"),
        pytest.param(lambda b, o: ci.issue("other", NS), "lacks SANs gpu-admission,", id="wrong-names"),
    ],
)
def test_problems(make, expect, prod_bundle, dev_bundle):
    found = ci.problems(make(prod_bundle, dev_bundle), ci.service_names(SVC, NS), 30)
    if expect is None:
        assert found == []
    else:
        assert any(expect in p for p in found), found


def test_plan_reuses_a_valid_bundle_byte_for_byte(prod_bundle):
    p = ci.plan(prod_bundle, SVC, NS)
    assert p.action == "reuse" and p.bundle == prod_bundle and p.dropped_cas == 0


def test_plan_reuses_a_dev_bundle_when_dev_names_are_not_required(dev_bundle):
    assert ci.plan(dev_bundle, SVC, NS, dev=False).action == "reuse"
    assert ci.plan(dev_bundle, SVC, NS, dev=True).action == "reuse"


def test_plan_creates_when_there_is_nothing():
    p = ci.plan(None, SVC, NS, days=90)
    assert p.action == "create" and 89.9 < ci.days_left(leaf(p.bundle)) <= 90


def test_plan_renew_keeps_a_long_lived_ca():
    old = ci.issue(SVC, NS, days=5, ca_days=3650)
    p = ci.plan(old, SVC, NS, days=365, renew_within_days=30)
    assert p.action == "renew" and "expires in 5.0 days" in p.reason
    assert p.bundle.ca_crt == old.ca_crt and p.bundle.ca_key == old.ca_key
    assert p.bundle.tls_crt != old.tls_crt and ci.signed_by(leaf(p.bundle), ca(old))
    assert ci.problems(p.bundle, ci.service_names(SVC, NS), 30) == []


@pytest.mark.parametrize(
    ("old", "why"),
    [
        pytest.param(ci.issue(SVC, NS, days=5), "CA expires too soon", id="ca-too-short"),
        pytest.param(_with(ci.issue(SVC, NS, days=5, ca_days=3650), ca_key=None), "no CA key", id="ca-key-unknown"),
    ],
)
def test_plan_rotates_the_ca_and_keeps_the_old_one_in_the_bundle(old, why):
    p = ci.plan(old, SVC, NS, days=365, renew_within_days=30)
    assert p.action == "rotate" and why in p.reason
    cas = ci.load_certificates(p.bundle.ca_crt)
    assert len(cas) == 2 and cas[1] == ca(old) and cas[0] != ca(old)
    assert ci.signed_by(leaf(p.bundle), cas[0])
    again = ci.plan(p.bundle, SVC, NS, days=365, renew_within_days=30)
    assert again.action == "reuse" and again.bundle == p.bundle  # idempotent: the old CA stays until it expires


def _self_signed_leaf(days: int) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A serving certificate signed by its own key, with no CA flag: what cert-manager's selfSigned issuer writes
    (its ca.crt is the certificate itself)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{SVC}.{NS}.svc")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(days=1))
        .not_valid_after(NOW + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in ci.service_names(SVC, NS).dns]), False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def test_a_rotation_keeps_a_self_signed_serving_certificate_the_webhooks_trust():
    """The pods serve the old certificate until they load the new Secret: the caBundle must still trust it, though it
    is no CA (found by a review of the certs tool)."""
    cert, key = _self_signed_leaf(days=10)
    pem = ci._cert_pem(cert)
    old = ci.Bundle(pem, pem, ci._key_pem(key), None)
    p = ci.plan(old, SVC, NS, days=365, renew_within_days=30)
    assert p.action == "rotate" and p.dropped_cas == 0
    cas = ci.load_certificates(p.bundle.ca_crt)
    assert len(cas) == 2 and cas[1] == cert and ci.signed_by(leaf(p.bundle), cas[0])


def _malformed_san(bundle: ci.Bundle) -> ci.Bundle:
    """``bundle`` with a serving certificate whose subjectAltName does not parse (read when first asked for)."""
    key = ec.generate_private_key(ec.SECP256R1())
    issuer = ca(bundle)
    ca_key = ci.load_key(bundle.ca_key)
    assert ca_key is not None
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")]))
        .issuer_name(issuer.subject)
        .public_key(key.public_key())
        .serial_number(7)
        .not_valid_before(NOW)
        .not_valid_after(NOW + dt.timedelta(days=90))
        .add_extension(x509.UnrecognizedExtension(ExtensionOID.SUBJECT_ALTERNATIVE_NAME, b"\x30\x03\x82\x05a"), False)
        .sign(ca_key, hashes.SHA256())
    )
    return replace(bundle, tls_crt=ci._cert_pem(cert), tls_key=ci._key_pem(key))


def test_a_certificate_that_does_not_parse_whole_is_issued_anew(prod_bundle):
    """An extension that does not parse made plan raise (a traceback from certs ensure on every run): such a
    certificate serves no name, and is replaced."""
    p = ci.plan(_malformed_san(prod_bundle), SVC, NS)
    assert p.action == "renew" and "lacks SANs" in p.reason
    assert ci.covers(leaf(p.bundle), ci.service_names(SVC, NS))


def test_plan_drops_expired_previous_cas():
    expired = ci.issue(SVC, NS, days=1, ca_days=2, now=NOW - dt.timedelta(days=10))
    current = ci.issue(SVC, NS)
    bundle = _with(current, ca_crt=current.ca_crt + expired.ca_crt)
    p = ci.plan(bundle, SVC, NS)
    assert p.action == "reuse" and p.dropped_cas == 1 and p.bundle.ca_crt == current.ca_crt


# -- files -------------------------------------------------------------------------------------------------------------


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_files_modes_and_read_back(tmp_path, prod_bundle):
    d = tmp_path / "certs"
    assert ci.write_files(d, prod_bundle) == ["ca.crt", "ca.key", "tls.key", "tls.crt"]
    assert _mode(d) == 0o700
    assert _mode(d / "tls.key") == 0o600 and _mode(d / "ca.key") == 0o600
    assert _mode(d / "tls.crt") & 0o077 in (0o044, 0o004, 0o040, 0)  # public, less the umask
    assert ci.read_files(d) == prod_bundle
    assert sorted(os.listdir(d)) == ["ca.crt", "ca.key", "tls.crt", "tls.key"]  # no temporary files left


def test_write_files_leaves_unchanged_files_alone(tmp_path, prod_bundle):
    ci.write_files(tmp_path, prod_bundle)
    before = {n: (tmp_path / n).stat().st_mtime_ns for n in os.listdir(tmp_path)}
    assert ci.write_files(tmp_path, prod_bundle) == []
    assert before == {n: (tmp_path / n).stat().st_mtime_ns for n in os.listdir(tmp_path)}


def test_write_files_replaces_atomically_and_tightens_a_loose_key(tmp_path, prod_bundle, dev_bundle):
    ci.write_files(tmp_path, dev_bundle)
    key = tmp_path / "tls.key"
    key.chmod(0o644)  # e.g. copied by hand
    inode = key.stat().st_ino
    ci.write_files(tmp_path, prod_bundle)
    assert key.stat().st_ino != inode  # a new file renamed over the old one, not rewritten in place
    assert _mode(key) == 0o600 and key.read_bytes() == prod_bundle.tls_key


def test_key_is_created_private_even_with_a_permissive_umask(tmp_path, prod_bundle):
    old = os.umask(0)
    try:
        ci.write_files(tmp_path, prod_bundle)
    finally:
        os.umask(old)
    assert _mode(tmp_path / "tls.key") == 0o600 and _mode(tmp_path / "tls.crt") == 0o644


def test_failed_write_keeps_the_old_file(tmp_path, prod_bundle, dev_bundle, monkeypatch):
    ci.write_files(tmp_path, dev_bundle)

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(CertsError, match="cannot write certificate files: No space left"):
        ci.write_files(tmp_path, prod_bundle)
    assert ci.read_files(tmp_path) == dev_bundle
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


def test_read_files_missing_is_none(tmp_path, prod_bundle):
    assert ci.read_files(tmp_path / "nowhere") is None
    ci.write_files(tmp_path, prod_bundle)
    (tmp_path / "ca.key").unlink()
    assert ci.read_files(tmp_path) == _with(prod_bundle, ca_key=None)
    (tmp_path / "tls.key").unlink()
    assert ci.read_files(tmp_path) is None


def test_describe(dev_bundle):
    text = "\n".join(ci.describe(dev_bundle.tls_crt))
    assert "subject:   CN=gpu-admission.gpu-system.svc" in text
    assert "gpu-admission.gpu-system.svc.cluster.local, localhost, 127.0.0.1" in text
    assert "issuer:    CN=gpu-admission CA for gpu-admission.gpu-system" in text
    assert "key:       ECDSA secp256r1" in text and "days left: 365.0" in text
    assert "(self-signed)" in "\n".join(ci.describe(dev_bundle.ca_crt))


# -- a real TLS handshake, verified the way kube-apiserver verifies ----------------------------------------------------


@contextlib.contextmanager
def tls_server(directory: Path, version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_3) -> Iterator[int]:
    """Serve the files in ``directory`` on 127.0.0.1; each connection gets b"ok" after the handshake."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = context.maximum_version = version
    context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(5)
                try:
                    with context.wrap_socket(conn, server_side=True) as tls:
                        tls.sendall(b"ok")
                except (ssl.SSLError, OSError):
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def connect(port: int, ca_pem: bytes, server_name: str) -> bytes:
    """What the apiserver does: trust only the caBundle, check ``server_name`` against the SANs."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
        context.wrap_socket(sock, server_hostname=server_name) as tls,
    ):
        return tls.recv(2)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, dev_bundle: ci.Bundle) -> Iterator[int]:
    d = tmp_path_factory.mktemp("tls")
    ci.write_files(d, dev_bundle)
    with tls_server(d) as port:
        yield port


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, id=n)
        for n in [f"{SVC}.{NS}.svc", SVC, f"{SVC}.{NS}.svc.cluster.local", "localhost", "127.0.0.1"]
    ],
)
def test_handshake_verifies(served, dev_bundle, name):
    assert connect(served, dev_bundle.ca_crt, name) == b"ok"


@pytest.mark.parametrize(
    ("name", "ca_of", "error"),
    [
        pytest.param(f"other.{NS}.svc", "same", "Hostname mismatch", id="wrong-service-name"),
        pytest.param(f"{SVC}.default.svc", "same", "Hostname mismatch", id="wrong-namespace"),
        pytest.param(f"{SVC}.{NS}.svc", "other", "unable to get local issuer", id="wrong-ca"),
        pytest.param(f"{SVC}.{NS}.svc", "leaf", None, id="leaf-as-trust-root"),
    ],
)
def test_handshake_refused(served, dev_bundle, prod_bundle, name, ca_of, error):
    trust = {"same": dev_bundle.ca_crt, "other": prod_bundle.ca_crt, "leaf": dev_bundle.tls_crt}[ca_of]
    with pytest.raises(ssl.SSLCertVerificationError, match=error):
        connect(served, trust, name)


def test_handshake_without_dev_names_refuses_localhost(tmp_path, prod_bundle):
    ci.write_files(tmp_path, prod_bundle)
    with tls_server(tmp_path) as port:
        assert connect(port, prod_bundle.ca_crt, f"{SVC}.{NS}.svc") == b"ok"
        with pytest.raises(ssl.SSLCertVerificationError):
            connect(port, prod_bundle.ca_crt, "localhost")


@pytest.mark.parametrize(
    ("key_type", "version"),
    [
        pytest.param("ecdsa", ssl.TLSVersion.TLSv1_2, id="ecdsa-tls1.2"),
        pytest.param("rsa", ssl.TLSVersion.TLSv1_2, id="rsa-tls1.2"),
        pytest.param("rsa", ssl.TLSVersion.TLSv1_3, id="rsa-tls1.3"),
    ],
)
def test_handshake_key_types_and_versions(tmp_path, key_type, version):
    bundle = ci.issue(SVC, NS, key_type=key_type, days=30)
    ci.write_files(tmp_path, bundle)
    with tls_server(tmp_path, version) as port:
        assert connect(port, bundle.ca_crt, f"{SVC}.{NS}.svc") == b"ok"


def test_handshake_during_ca_rotation_old_and_new_leaf_both_verify(tmp_path):
    """After a rotation the caBundle holds new + old CA: a server still on the old leaf keeps working."""
    old = ci.issue(SVC, NS, days=5)
    rotated = ci.plan(old, SVC, NS, days=365, renew_within_days=30)
    assert rotated.action == "rotate"
    new_ca_only = ci.load_certificates(rotated.bundle.ca_crt)[0].public_bytes(serialization.Encoding.PEM)
    for name, served_bundle, trusted_by_new_ca_alone in (("old", old, False), ("new", rotated.bundle, True)):
        ci.write_files(tmp_path / name, served_bundle)
        with tls_server(tmp_path / name) as port:
            assert connect(port, rotated.bundle.ca_crt, f"{SVC}.{NS}.svc") == b"ok"
            if trusted_by_new_ca_alone:
                assert connect(port, new_ca_only, f"{SVC}.{NS}.svc") == b"ok"
            else:  # why the old CA must stay in the bundle during the overlap
                with pytest.raises(ssl.SSLCertVerificationError):
                    connect(port, new_ca_only, f"{SVC}.{NS}.svc")


def test_expired_certificate_is_refused(tmp_path):
    bundle = ci.issue(SVC, NS, days=1, ca_days=3650, now=NOW - dt.timedelta(days=3))
    ci.write_files(tmp_path, bundle)
    with tls_server(tmp_path) as port, pytest.raises(ssl.SSLCertVerificationError, match="expired"):
        connect(port, bundle.ca_crt, f"{SVC}.{NS}.svc")


def test_plan_keeps_stored_ca_text_byte_for_byte():
    """A CA file written by another tool (CRLF, trailing text) is not rewritten on reuse or a leaf renewal."""
    for bundle, action in ((ci.issue(SVC, NS), "reuse"), (ci.issue(SVC, NS, days=1, ca_days=3650), "renew")):
        odd = _with(bundle, ca_crt=bundle.ca_crt.replace(b"\n", b"\r\n") + b"\r\n# comment\r\n")
        p = ci.plan(odd, SVC, NS)
        assert p.action == action and p.bundle.ca_crt == odd.ca_crt

"""Issue, read back and check the webhook's CA and serving certificate. Pure apart from ``read_files``/``write_files``.

What the apiserver checks (the Kubernetes docs' "Dynamic Admission Control"; kubernetes/apiserver
``pkg/util/webhook/``): it dials ``https://<service>.<namespace>.svc``, trusts only the webhook configuration's
``caBundle``, and matches the server name against the certificate's subjectAltNames (the CN is ignored). So the
serving certificate carries the service's DNS names as SANs, has the serverAuth extended key usage, and is signed by
a CA whose certificate goes in the bundle.

Keys are ECDSA P-256 by default: a P-256 key and signature are a fraction of RSA's size and much faster to sign
with, which matters because every new connection from the apiserver pays a handshake; P-256 is supported by every
TLS stack involved (Go's crypto/tls in kube-apiserver, OpenSSL behind Python's ``ssl``, curl). RSA 2048 is offered
for tooling that only takes RSA. Ed25519 is not offered: many TLS clients still refuse Ed25519 certificates.

A *bundle* is the PEM text exactly as stored (files or Secret keys) so that "nothing changed" is a byte comparison:
``ca.crt`` holds the current CA first and, after a CA rotation, the previous CAs until they expire (so servers still
presenting a leaf of the old CA verify during the overlap); ``ca.key`` is the current CA's key, kept so that a leaf
renewal can keep the CA (and the caBundle) unchanged.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs import CertsError

KeyType = Literal["ecdsa", "rsa"]
PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
Action = Literal["reuse", "create", "renew", "rotate"]

# File and Secret key names (the kubernetes.io/tls Secret type requires tls.crt and tls.key; ca.crt is the convention
# cert-manager and the kubelet's projected volumes use).
CA_CRT, CA_KEY, TLS_CRT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
KEY_FILES = frozenset({CA_KEY, TLS_KEY})
# Certificates start a few minutes in the past so a node whose clock is slightly behind still accepts them.
BACKDATE = dt.timedelta(minutes=5)
# A new CA lives this many times longer than the serving certificates it signs, so most renewals keep it.
CA_LIFETIME_FACTOR = 10
DEV_DNS = ("localhost",)
DEV_IPS = ("127.0.0.1",)


@dataclass(frozen=True)
class Bundle:
    """PEM bytes as stored. ``ca_crt`` may carry previous CAs after the current one; ``ca_key`` may be unknown."""

    ca_crt: bytes
    tls_crt: bytes
    tls_key: bytes
    ca_key: bytes | None = None

    def files(self) -> dict[str, bytes]:
        """File (or Secret key) name -> content, in the order they should be written (the serving pair last)."""
        out = {CA_CRT: self.ca_crt}
        if self.ca_key is not None:
            out[CA_KEY] = self.ca_key
        out[TLS_KEY] = self.tls_key
        out[TLS_CRT] = self.tls_crt
        return out


@dataclass(frozen=True)
class Names:
    """The subjectAltNames a serving certificate must carry."""

    dns: tuple[str, ...]
    ips: tuple[str, ...] = ()

    def all(self) -> list[str]:
        return [*self.dns, *self.ips]


@dataclass(frozen=True)
class Plan:
    """What to do with the current bundle: ``bundle`` is the one to store (equal to the current one on reuse)."""

    action: Action
    bundle: Bundle
    reason: str
    dropped_cas: int = 0


def service_names(service: str, namespace: str, dev: bool = False) -> Names:
    """``<svc>``, ``<svc>.<ns>``, ``<svc>.<ns>.svc``, ``<svc>.<ns>.svc.cluster.local`` (+ localhost, 127.0.0.1)."""
    dns = (service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local")
    if dev:
        return Names(dns + DEV_DNS, DEV_IPS)
    return Names(dns)


def _now(now: dt.datetime | None) -> dt.datetime:
    return now if now is not None else dt.datetime.now(dt.UTC)


def new_key(key_type: KeyType = "ecdsa") -> PrivateKey:
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: PrivateKey) -> bytes:
    pem, pkcs8 = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    return key.private_bytes(pem, pkcs8, serialization.NoEncryption())


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _serial() -> int:
    # RFC 5280: positive, at most 20 octets; 159 random bits keeps the top bit clear.
    return secrets.randbits(159) | 1


def _key_usage(signs_certificates: bool = False, key_encipherment: bool = False) -> x509.KeyUsage:
    """Digital signature always; certificate and CRL signing for the CA; key encipherment for an RSA leaf."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def issue_ca(
    common_name: str, days: int, *, key_type: KeyType = "ecdsa", now: dt.datetime | None = None
) -> tuple[x509.Certificate, PrivateKey]:
    """A self-signed CA that may sign serving certificates only (CA:true, pathlen 0, keyCertSign)."""
    start = _now(now) - BACKDATE
    key = new_key(key_type)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(_serial())
        .not_valid_before(start)
        .not_valid_after(start + BACKDATE + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue_leaf(
    ca_cert: x509.Certificate,
    ca_key: PrivateKey,
    names: Names,
    days: int,
    *,
    key_type: KeyType = "ecdsa",
    now: dt.datetime | None = None,
) -> tuple[x509.Certificate, PrivateKey]:
    """A serving certificate for ``names`` (as SANs; the CN is for humans only), serverAuth, signed by the CA."""
    start = _now(now) - BACKDATE
    key = new_key(key_type)
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names.dns]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in names.ips]
    cn = next((n for n in names.dns if n.endswith(".svc")), names.all()[0])
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(_serial())
        .not_valid_before(start)
        .not_valid_after(start + BACKDATE + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        # key encipherment: RSA key exchange in TLS 1.2
        .add_extension(_key_usage(key_encipherment=isinstance(key, rsa.RSAPrivateKey)), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def issue(
    service: str,
    namespace: str,
    *,
    days: int = 365,
    ca_days: int | None = None,
    dev: bool = False,
    key_type: KeyType = "ecdsa",
    now: dt.datetime | None = None,
) -> Bundle:
    """A fresh CA (``ca_days``, default ten times ``days``) and a serving certificate for the service."""
    ca_cert, ca_key = issue_ca(
        f"gpu-admission CA for {service}.{namespace}", ca_days or days * CA_LIFETIME_FACTOR, key_type=key_type, now=now
    )
    cert, key = issue_leaf(ca_cert, ca_key, service_names(service, namespace, dev), days, key_type=key_type, now=now)
    return Bundle(_cert_pem(ca_cert), _cert_pem(cert), _key_pem(key), _key_pem(ca_key))


# -- reading back ----------------------------------------------------------------------------------------------------


def load_certificates(pem: bytes) -> list[x509.Certificate]:
    """Every certificate in a PEM text; [] when there is none or the text is not PEM."""
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


_UNREADABLE_EXTENSION = (x509.ExtensionNotFound, x509.DuplicateExtension, ValueError)
"""An extension absent, written twice, or that does not parse (cryptography parses them when first asked)."""


def load_key(pem: bytes | None) -> PrivateKey | None:
    """The private key in a PEM text; None when absent, unreadable, encrypted or of another type."""
    if not pem:
        return None
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        return None
    return key if isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) else None


def days_left(cert: x509.Certificate, now: dt.datetime | None = None) -> float:
    """Days until the certificate expires (negative once expired)."""
    return (cert.not_valid_after_utc - _now(now)).total_seconds() / 86400


def sans(cert: x509.Certificate) -> list[str]:
    """The DNS names and IP addresses the certificate is valid for."""
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except _UNREADABLE_EXTENSION:  # absent, or malformed: no name to trust it for
        return []
    return [*ext.get_values_for_type(x509.DNSName), *(str(ip) for ip in ext.get_values_for_type(x509.IPAddress))]


def missing_names(cert: x509.Certificate, names: Names) -> list[str]:
    """The wanted names the certificate does not carry as SANs (DNS case-insensitive, IPs compared as addresses)."""
    have = sans(cert)
    dns = {n.lower() for n in have}
    ips: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for n in have:
        with contextlib.suppress(ValueError):
            ips.add(ipaddress.ip_address(n))
    out = [n for n in names.dns if n.lower() not in dns]
    return out + [ip for ip in names.ips if ipaddress.ip_address(ip) not in ips]


def covers(cert: x509.Certificate, names: Names) -> bool:
    return not missing_names(cert, names)


def signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    """True when ``ca`` issued ``cert`` (issuer name matches and the signature verifies with the CA's key)."""
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def is_ca(cert: x509.Certificate) -> bool:
    try:
        return bool(cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca)
    except _UNREADABLE_EXTENSION:
        return False


def has_server_auth(cert: x509.Certificate) -> bool:
    try:
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return True  # no EKU extension: any usage
    except _UNREADABLE_EXTENSION:
        return False
    return ExtendedKeyUsageOID.SERVER_AUTH in eku


def key_matches(cert: x509.Certificate, key: PrivateKey) -> bool:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    try:
        public = cert.public_key()
    except (ValueError, UnsupportedAlgorithm):  # a key type cryptography cannot read: not this one
        return False
    return public.public_bytes(*spki) == key.public_key().public_bytes(*spki)


def problems(bundle: Bundle, names: Names, renew_within_days: float, now: dt.datetime | None = None) -> list[str]:
    """Why the bundle cannot be served as it is; [] when it can (valid, covering ``names``, not due for renewal)."""
    now = _now(now)
    leaf = load_certificates(bundle.tls_crt)
    cas = load_certificates(bundle.ca_crt)
    key = load_key(bundle.tls_key)
    if not leaf:
        return [f"{TLS_CRT} holds no certificate"]
    if not cas:
        return [f"{CA_CRT} holds no certificate"]
    cert, ca = leaf[0], cas[0]
    out: list[str] = []
    if key is None:
        out.append(f"{TLS_KEY} holds no usable private key")
    elif not key_matches(cert, key):
        out.append(f"{TLS_KEY} does not match {TLS_CRT}")
    if not signed_by(cert, ca):
        out.append(f"{TLS_CRT} is not signed by the first CA in {CA_CRT}")
    if missing := missing_names(cert, names):
        out.append(f"{TLS_CRT} lacks SANs {', '.join(missing)}")
    if not has_server_auth(cert):
        out.append(f"{TLS_CRT} is not for serverAuth")
    if cert.not_valid_before_utc > now:
        out.append(f"{TLS_CRT} is not valid before {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC")
    for what, c in ((TLS_CRT, cert), (CA_CRT, ca)):
        left = days_left(c, now)
        if left <= 0:
            out.append(f"{what} expired {c.not_valid_after_utc:%Y-%m-%d}")
        elif left <= renew_within_days:
            out.append(f"{what} expires in {left:.1f} days (renewal within {renew_within_days:g})")
    return out


def _current_ca(bundle: Bundle) -> tuple[x509.Certificate, PrivateKey] | None:
    """The current CA and its key when both are present and belong together."""
    cas = load_certificates(bundle.ca_crt)
    key = load_key(bundle.ca_key)
    if cas and key is not None and is_ca(cas[0]) and key_matches(cas[0], key):
        return cas[0], key
    return None


def _ca_text(
    first: x509.Certificate,
    previous: Sequence[x509.Certificate],
    now: dt.datetime,
    serving: Sequence[x509.Certificate] = (),
) -> tuple[bytes, int]:
    """PEM of ``first`` then the unexpired ``previous`` CAs (not repeating ``first``); and how many were dropped. A
    previous certificate that signed one ``serving`` now (a self-signed serving certificate stored as its own CA, as
    cert-manager's selfSigned issuer writes it: no CA flag) is kept too, or the pods still serving it would fail
    every call until they load the new one."""
    kept: list[x509.Certificate] = []
    for c in previous:
        if c == first or c in kept:
            continue
        if days_left(c, now) > 0 and (is_ca(c) or any(signed_by(s, c) for s in serving)):
            kept.append(c)
    dropped = sum(1 for c in previous if c != first) - len(kept)
    return b"".join(_cert_pem(c) for c in (first, *kept)), max(dropped, 0)


def trusting(bundle: Bundle, previous: bytes, now: dt.datetime | None = None) -> Bundle:
    """``bundle`` whose ``ca.crt`` also carries the unexpired CAs of ``previous`` (PEM) after its own: those the
    webhook configurations trust now, while the pods still serve a leaf of theirs (a Secret deleted by hand and
    created again)."""
    cas = load_certificates(bundle.ca_crt)
    if not cas:
        return bundle
    text, _ = _ca_text(cas[0], [*cas[1:], *load_certificates(previous)], _now(now))
    return replace(bundle, ca_crt=text)


def plan(
    current: Bundle | None,
    service: str,
    namespace: str,
    *,
    days: int = 365,
    renew_within_days: float = 30,
    dev: bool = False,
    key_type: KeyType = "ecdsa",
    now: dt.datetime | None = None,
) -> Plan:
    """Decide between reuse, create, renew (same CA) and rotate (new CA, old ones kept in ``ca.crt`` until expiry).

    The CA is kept when it has its key and outlives the new serving certificate by more than the renewal window
    (otherwise the next renewal would find it expiring first). Expired previous CAs are dropped from ``ca.crt``.
    """
    now = _now(now)
    names = service_names(service, namespace, dev)
    if current is None:
        return Plan("create", issue(service, namespace, days=days, dev=dev, key_type=key_type, now=now), "none found")
    found = problems(current, names, renew_within_days, now)
    cas = load_certificates(current.ca_crt)
    if not found:
        text, dropped = _ca_text(cas[0], cas[1:], now)
        bundle = replace(current, ca_crt=text) if dropped else current  # stored bytes kept: no rewrite for format
        left = days_left(load_certificates(current.tls_crt)[0], now)
        return Plan("reuse", bundle, f"valid for {left:.0f} more days", dropped)
    reason = "; ".join(found)
    ca = _current_ca(current)
    leaf_end = now + dt.timedelta(days=days)
    if ca is not None and ca[0].not_valid_after_utc - leaf_end > dt.timedelta(days=renew_within_days):
        cert, key = issue_leaf(ca[0], ca[1], names, days, key_type=key_type, now=now)
        text, dropped = _ca_text(ca[0], cas[1:], now)
        text = text if dropped else current.ca_crt  # the caBundle stays byte for byte: no webhook patch
        return Plan("renew", Bundle(text, _cert_pem(cert), _key_pem(key), current.ca_key), reason, dropped)
    fresh = issue(service, namespace, days=days, dev=dev, key_type=key_type, now=now)
    new_ca = load_certificates(fresh.ca_crt)[0]
    text, dropped = _ca_text(new_ca, cas, now, serving=load_certificates(current.tls_crt)[:1])
    why = "no CA key" if ca is None else "CA expires too soon"
    return Plan("rotate", replace(fresh, ca_crt=text), f"{reason} ({why} to keep the CA)", dropped)


# -- files -----------------------------------------------------------------------------------------------------------


def read_files(directory: str | os.PathLike[str]) -> Bundle | None:
    """The bundle in ``directory``; None when ca.crt, tls.crt or tls.key is missing."""
    d = Path(directory)
    try:
        ca_crt, tls_crt, tls_key = ((d / n).read_bytes() for n in (CA_CRT, TLS_CRT, TLS_KEY))
    except FileNotFoundError:
        return None
    except OSError as err:
        raise CertsError(f"{d}: cannot read certificate files: {err.strerror}") from err
    try:
        ca_key: bytes | None = (d / CA_KEY).read_bytes()
    except FileNotFoundError:
        ca_key = None
    except OSError as err:
        raise CertsError(f"{d / CA_KEY}: cannot read: {err.strerror}") from err
    return Bundle(ca_crt, tls_crt, tls_key, ca_key)


def atomic_write(path: str | os.PathLike[str], data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` so a reader sees the old file or the new one, never a part.

    The temporary file is created in the same directory by ``os.open`` with ``mode`` (so a key is never readable by
    others, not even for an instant; the umask can only narrow it), synced, then renamed over the target
    (``os.replace`` is atomic on POSIX). On any failure the temporary file is removed and the target is untouched.
    """
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename durable; not every filesystem lets a directory be opened
        dfd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def write_files(directory: str | os.PathLike[str], bundle: Bundle) -> list[str]:
    """Write ca.crt, ca.key (when known), tls.key, tls.crt atomically; keys 0600, certificates 0644 (less umask).

    Returns the names written. Files whose content is already right are left alone (no mtime change, so a server
    watching them does not reload for nothing).
    """
    d = Path(directory)
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        written = []
        for name, data in bundle.files().items():
            path = d / name
            with contextlib.suppress(FileNotFoundError):
                if path.read_bytes() == data and (name not in KEY_FILES or path.stat().st_mode & 0o077 == 0):
                    continue
            atomic_write(path, data, 0o600 if name in KEY_FILES else 0o644)
            written.append(name)
    except OSError as err:
        raise CertsError(f"{d}: cannot write certificate files: {err.strerror or err}") from err
    return written


# -- show ------------------------------------------------------------------------------------------------------------


def describe(pem: bytes, now: dt.datetime | None = None) -> list[str]:
    """Human-readable lines for every certificate in a PEM text (subject, SANs, issuer, validity, days left)."""
    out: list[str] = []
    for i, cert in enumerate(load_certificates(pem)):
        if i:
            out.append("")
        left = days_left(cert, now)
        key = cert.public_key()
        kind = f"ECDSA {key.curve.name}" if isinstance(key, ec.EllipticCurvePublicKey) else type(key).__name__
        if isinstance(key, rsa.RSAPublicKey):
            kind = f"RSA {key.key_size}"
        out += [
            f"subject:   {cert.subject.rfc4514_string()}",
            f"SANs:      {', '.join(sans(cert)) or '(none)'}",
            f"issuer:    {cert.issuer.rfc4514_string()}" + (" (self-signed)" if cert.issuer == cert.subject else ""),
            f"CA:        {'yes' if is_ca(cert) else 'no'}",
            f"key:       {kind}",
            f"valid:     {cert.not_valid_before_utc:%Y-%m-%d %H:%M} to {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC",
            f"days left: {left:.1f}" + (" (EXPIRED)" if left <= 0 else ""),
        ]
    return out

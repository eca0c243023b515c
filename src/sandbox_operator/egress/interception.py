"""The proxy's certificate authority, so it can see inside HTTPS to a host with rules.

Its own module because it is the one place that handles key material: a CA (an ECDSA P-256 key)
made by the operator once per namespace and kept in the proxy's Secret, which only the proxy's
pod mounts (never a sandbox's pod), and a leaf certificate per host the proxy intercepts, minted
on first use and cached in memory. Only the CA's certificate is given out: the sandbox pods
mount it and are told to trust it (docs/egress-proxy.md, "HTTPS to a host with rules").

The TLS contexts are the standard library's: towards the guest a server context offering only
HTTP/1.1 by ALPN (so HTTP/2 is never negotiated and every request is a head the proxy parses),
towards the upstream a client context that verifies the upstream's certificate and name in full
against the system's roots (or the roots the configuration names), also HTTP/1.1 only.

Python's ``ssl`` loads a certificate and key only from files: a leaf's pair is written to a
private directory (mode 0700, in the pod an in-memory ``emptyDir``), loaded and removed at once.
"""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import ssl
import tempfile
from collections import OrderedDict

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: How long the CA is valid. A namespace keeps its CA while its proxy's objects live (while it
#: has allowlist Sandboxes); a namespace served longer than this needs its Secret deleted.
CA_DAYS = 365
#: How long a leaf is valid (minted again after, at most once per host per this period).
LEAF_DAYS = 7
#: Leaves kept (one per host intercepted); the oldest is dropped past it.
LEAF_CACHE = 1024
ALPN = ["http/1.1"]


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def new_ca(name: str = "sandbox-operator egress proxy") -> tuple[bytes, bytes]:
    """A fresh CA: (certificate PEM, private key PEM). Made by the operator once per namespace
    and kept in the proxy's Secret, which only the proxy's pod mounts."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, name),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "sandbox-operator"),
        ]
    )
    now = _now()
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return _pem(cert), key_pem


class InterceptionCA:
    """The CA the proxy signs leaves with; ``cert_pem`` is what a guest trusts, the key never
    leaves this object."""

    def __init__(
        self,
        cert_pem: bytes | None = None,
        key_pem: bytes | None = None,
        *,
        extra_upstream_roots: str | None = None,
    ) -> None:
        if cert_pem is None or key_pem is None:
            cert_pem, key_pem = new_ca()
        key = serialization.load_pem_private_key(key_pem, password=None)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ValueError("the interception CA key must be an EC key")
        self._key = key
        self.cert = x509.load_pem_x509_certificate(cert_pem)
        if self.cert.public_key() != key.public_key():
            raise ValueError("the interception CA certificate does not match its key")
        #: PEM roots trusted for upstreams besides the system's (interception.extraUpstreamRoots)
        self.extra_upstream_roots = extra_upstream_roots
        self._leaves: OrderedDict[str, tuple[ssl.SSLContext, datetime.datetime]] = OrderedDict()
        self._dir = tempfile.mkdtemp(prefix="egress-leaves-")
        os.chmod(self._dir, 0o700)
        self._upstream: ssl.SSLContext | None = None

    @property
    def cert_pem(self) -> bytes:
        return _pem(self.cert)

    def _mint(self, host: str) -> tuple[bytes, bytes, datetime.datetime]:
        key = ec.generate_private_key(ec.SECP256R1())
        now = _now()
        not_after = min(now + datetime.timedelta(days=LEAF_DAYS), self.cert.not_valid_after_utc)
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return _pem(cert), key_pem, not_after

    def server_context(self, host: str) -> ssl.SSLContext:
        """The context that answers the guest as ``host`` (normalised), minted once and cached."""
        cached = self._leaves.get(host)
        if cached is not None and cached[1] - _now() > datetime.timedelta(hours=1):
            self._leaves.move_to_end(host)
            return cached[0]
        cert_pem, key_pem, not_after = self._mint(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(ALPN)
        fd, path = tempfile.mkstemp(dir=self._dir, suffix=".pem")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(cert_pem + key_pem)
            ctx.load_cert_chain(path)
        finally:
            os.unlink(path)
        self._leaves[host] = (ctx, not_after)
        while len(self._leaves) > LEAF_CACHE:
            self._leaves.popitem(last=False)
        return ctx

    def upstream_context(self) -> ssl.SSLContext:
        """Towards the upstream: full verification (chain and name), HTTP/1.1 only. Made once:
        loading the system's roots costs about 20 ms of CPU, more than the rest of a request."""
        if self._upstream is not None:
            return self._upstream
        ctx = ssl.create_default_context()
        if self.extra_upstream_roots:
            ctx.load_verify_locations(cadata=self.extra_upstream_roots)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(ALPN)
        self._upstream = ctx
        return ctx

    def close(self) -> None:
        self._leaves.clear()
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)

"""The interception CA of a namespace's managed egress proxy: read from the proxy's Secret, or
made when there is none (or it is about to expire).

Its own module because it is the operator's one touch of key material: the CA is made here
(``sandbox_operator.egress.interception.new_ca``) and written only into the proxy's Secret, which
only the proxy's pod mounts; what sandbox pods get is the certificate, in the proxy's ConfigMap.
One CA per namespace, kept across operator and proxy restarts (the Secret is re-applied with the
same content on every ensure, with each Sandbox among its owners like the proxy's other objects),
so a running sandbox's trusted certificate stays the proxy's.
"""

from __future__ import annotations

import base64
import datetime
import functools
import ssl
from typing import Any

from sandbox_operator.backends.egress_proxy_objects import ProxyCA
from sandbox_operator.egress.config import CA_CERT_KEY, CA_KEY_KEY

#: A CA with less left than this is replaced when the operator next reads it (the proxy's pod is
#: rolled with it, its checksum annotation covers the certificate; running sandboxes see the new
#: certificate once the kubelet refreshes their ConfigMap volume).
RENEW_BEFORE = datetime.timedelta(days=30)


@functools.cache
def public_roots() -> str:
    """The operator image's public roots (PEM), for the sandboxes' bundle; "" if it has none."""
    paths = ssl.get_default_verify_paths()
    for path in (paths.cafile, paths.openssl_cafile):
        if path:
            try:
                with open(path, encoding="ascii") as handle:
                    return handle.read()
            except OSError:
                continue
    return ""


def _still_good(cert_pem: str, key_pem: str) -> bool:
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
    except ValueError:
        return False
    left = cert.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    return bool(key_pem) and left > RENEW_BEFORE


def namespace_ca(secret: Any) -> ProxyCA:
    """The namespace's CA from the proxy's Secret as read (None: there is none), or a new one
    when it holds none that is still good (it is applied with the other objects)."""
    from sandbox_operator.egress.interception import new_ca

    data = (getattr(secret, "data", None) or {}) if secret is not None else {}
    try:
        cert_pem = base64.b64decode(data.get(CA_CERT_KEY, "")).decode("ascii")
        key_pem = base64.b64decode(data.get(CA_KEY_KEY, "")).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        cert_pem = key_pem = ""
    if not _still_good(cert_pem, key_pem):
        cert, key = new_ca()
        cert_pem, key_pem = cert.decode("ascii"), key.decode("ascii")
    return ProxyCA(cert_pem, key_pem, public_roots())

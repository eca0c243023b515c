"""The test kit: stand-ins for a cluster, a backend and the outside world, for your tests.

Public and versioned with the package, as ``kopf.testing`` is with kopf (see docs/testing.md).
None of it draws a boundary: everything runs as local processes and loopback sockets.

* :mod:`.fakes`: :func:`local_sandbox`, a client ``Sandbox`` over local processes, and
  :class:`DefectiveDataPlane`, which breaks named behaviours (:data:`DEFECTS`) on purpose so a
  conformance suite can be shown to catch each.
* :mod:`.backend`: :class:`FakeBackend` with :data:`FAKE_BACKEND_DECLARATIONS` and
  :data:`FAKE_HOST_POLICY`; :func:`admit` judges a spec with the operator's own policy and raises
  the client's typed refusal, :func:`acquire` also hands back a local ``Sandbox`` for it: a
  workload's admission, tested without a cluster.
* :mod:`.egress`: local upstream servers, self-signed certificates and clients that speak to
  the egress proxy from a chosen source address.
* :class:`LocalExecTransport`: the exec transport that runs commands as local processes (build a
  data plane with ``ExecDataPlane(LocalExecTransport())``).
* :class:`StaticTokenProvider`: a fixed bearer token for the ACA API client (a loopback
  stand-in of the API, never Azure).
"""

from sandbox_operator.acas.auth import StaticTokenProvider
from sandbox_operator.client.dataplane import LocalExecTransport
from sandbox_operator.testing.backend import (
    FAKE_BACKEND_DECLARATIONS,
    FAKE_HOST_POLICY,
    FakeBackend,
    acquire,
    admit,
)
from sandbox_operator.testing.egress import (
    LocalServer,
    ProxyReply,
    SelfSignedCert,
    connect_through,
    get_through,
    loopback_proxy_config,
    make_self_signed_cert,
    open_from,
    proxy_request,
    read_reply_head,
    self_signed_cert,
    serve_http_in_thread,
    start_echo_server,
    start_http_server,
)
from sandbox_operator.testing.fakes import DEFECTS, DefectiveDataPlane, local_sandbox

__all__ = [
    "DEFECTS",
    "FAKE_BACKEND_DECLARATIONS",
    "FAKE_HOST_POLICY",
    "DefectiveDataPlane",
    "FakeBackend",
    "LocalExecTransport",
    "LocalServer",
    "ProxyReply",
    "SelfSignedCert",
    "StaticTokenProvider",
    "acquire",
    "admit",
    "connect_through",
    "get_through",
    "local_sandbox",
    "loopback_proxy_config",
    "make_self_signed_cert",
    "open_from",
    "proxy_request",
    "read_reply_head",
    "self_signed_cert",
    "serve_http_in_thread",
    "start_echo_server",
    "start_http_server",
]

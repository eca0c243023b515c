"""This operator as a `maf-sandbox <https://pypi.org/project/maf-sandbox/>`_ backend.

Installed with the ``[maf]`` extra, Python 3.12 or later only (maf-sandbox's floor); nothing
else in the project imports it. :class:`OperatorBackend` is a ``maf_sandbox.SandboxBackend``
over a :class:`~sandbox_operator.client.SandboxClient`; the sandboxes it hands out are
:class:`OperatorSandbox` wrappers over the client's data plane.
"""

from sandbox_operator.maf._backend import OperatorBackend
from sandbox_operator.maf._errors import (
    ACQUIRE_ERRORS,
    OperatorAcquireFailed,
    OperatorAcquireTimedOut,
    OperatorBackendMismatch,
    OperatorSpecRejected,
)
from sandbox_operator.maf._published import (
    BackendNotSelected,
    PublishedBackendsMissing,
    parse_published,
    read_published,
    select_backend,
)
from sandbox_operator.maf._sandbox import OperatorSandbox, sandbox_instance_id
from sandbox_operator.maf._translate import (
    BASE_MOUNTED,
    RECLAIM_WITHHELD,
    RECLAIMS,
    declarations,
    operator_spec,
)

__all__ = [
    "ACQUIRE_ERRORS",
    "BASE_MOUNTED",
    "RECLAIMS",
    "RECLAIM_WITHHELD",
    "BackendNotSelected",
    "OperatorAcquireFailed",
    "OperatorAcquireTimedOut",
    "OperatorBackend",
    "OperatorBackendMismatch",
    "OperatorSandbox",
    "OperatorSpecRejected",
    "PublishedBackendsMissing",
    "declarations",
    "operator_spec",
    "parse_published",
    "read_published",
    "sandbox_instance_id",
    "select_backend",
]

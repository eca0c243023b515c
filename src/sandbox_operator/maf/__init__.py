"""This operator as a `maf-sandbox <https://pypi.org/project/maf-sandbox/>`_ backend.

Installed with the ``[maf]`` extra, Python 3.12 or later only (maf-sandbox's floor); nothing
else in the project imports it. :class:`OperatorBackend` is a ``maf_sandbox.SandboxBackend``
over a :class:`~sandbox_operator.client.SandboxClient`; the sandboxes it hands out are
:class:`OperatorSandbox` wrappers over the client's data plane.
"""

from sandbox_operator.maf._sandbox import OperatorSandbox

__all__ = ["OperatorSandbox"]

"""The data planes: how a ``Sandbox`` handle runs commands and moves files in a sandbox.

One protocol, several implementations, all owned by the client and handed to it
(``SandboxClient(dataplanes={servedBy kind: factory})``, the pod one built in):

* :mod:`.protocol` -- :class:`DataPlane`, its result types (:class:`ExecResult`,
  :class:`FileStat`, :class:`DirEntry`), :class:`ExecRequest` (the checks every data plane shares).
* :mod:`.execplane` -- :class:`ExecDataPlane`: every primitive over one "run this argv" transport,
  with the shell scripts of :mod:`.scripts`.
* :mod:`.streaming` -- :class:`ExecStream`: a command's output as it arrives (:class:`OutputChunk`,
  then :class:`ExitStatus`), its stdin while it runs, a terminal; over a :class:`StreamTransport`.
* :mod:`.pod` -- :class:`PodExecTransport` over the API server's ``pods/exec``; the default for
  ``servedBy.kind: Pod``.
* :mod:`.session` -- :class:`SessionExecTransport`: buffered commands through one long-lived
  exec stream to a launcher in the guest (:mod:`.launcher`), opt-in (:func:`pod_session_factory`).
* :mod:`.local` -- :class:`LocalExecTransport`: local processes, no isolation (tests only).
* :mod:`.acas` -- :class:`~.acas.AcasDataPlane` for ACA sandboxes; import it from there
  (``acas_dataplanes``): it is not imported here, so the base client never loads the ACA API client.
"""

from sandbox_operator.client.dataplane.execplane import (
    ExecDataPlane,
    ExecTransport,
    RawResult,
    _parse_size,
    _split_header,
)
from sandbox_operator.client.dataplane.local import LocalExecTransport, local_dataplane
from sandbox_operator.client.dataplane.pod import (
    PodExecTransport,
    PodTarget,
    _exit_code,
    pod_dataplane,
    pod_factory,
    pod_session_factory,
)
from sandbox_operator.client.dataplane.protocol import (
    DEFAULT_OUTPUT_BUDGET,
    DataPlane,
    DataPlaneFactory,
    DirEntry,
    ExecOptions,
    ExecRequest,
    ExecResult,
    FileKind,
    FileStat,
    check_exec_request,
)
from sandbox_operator.client.dataplane.session import SessionExecTransport
from sandbox_operator.client.dataplane.streaming import (
    ExecStream,
    ExitStatus,
    OutputChunk,
    StreamingPlane,
    StreamItem,
    StreamTransport,
)

__all__ = [
    "DEFAULT_OUTPUT_BUDGET",
    "DataPlane",
    "DataPlaneFactory",
    "DirEntry",
    "ExecDataPlane",
    "ExecOptions",
    "ExecRequest",
    "ExecResult",
    "ExecStream",
    "ExecTransport",
    "ExitStatus",
    "FileKind",
    "FileStat",
    "LocalExecTransport",
    "OutputChunk",
    "PodExecTransport",
    "PodTarget",
    "RawResult",
    "SessionExecTransport",
    "StreamItem",
    "StreamTransport",
    "StreamingPlane",
    "_exit_code",
    "_parse_size",
    "_split_header",
    "check_exec_request",
    "local_dataplane",
    "pod_dataplane",
    "pod_factory",
    "pod_session_factory",
]

"""A local stand-in for the Azure Container Apps sandboxes data-plane API (2026-09-01-preview).

Written from /work/shared/reference/aca-sandboxes-api.md (not from the client), served over real
HTTP on 127.0.0.1 by aiohttp: aiohttp is already installed (kopf depends on it), runs inside the
test's own event loop or in a thread, and gives raw control over statuses, headers and delays,
which the fault injection needs. State: sandboxes with labels (list filter `labels=k=v,...`,
paging), a real directory per sandbox for files, command executions that really run (subprocess,
cwd inside that directory), inline and named egress policies, egress decisions, lifecycle
auto-delete (and, opt-in, idle auto-suspend), stop / stop-async / resume (section 3.8: no body,
a Snapshot from the blocking stop, 409 from the wrong state, files kept). `rooted` (a knob, as
root): each sandbox's directory is its `/` for the file API and executions alike (executions
chrooted in a private mount namespace, the host's system directories bound read-only), so
conformance suites with absolute paths run on it and two sandboxes share nothing. Faults: any status
(429 with Retry-After, 500, 503, ...) per operation, slow responses, delete that leaves the
sandbox listed, expired/invalid tokens (401).
"""

from .server import DEFAULT_TOKEN, StandinServer, ThreadedStandin
from .state import API_VERSION, Fault, StandinState

__all__ = [
    "API_VERSION",
    "DEFAULT_TOKEN",
    "Fault",
    "StandinServer",
    "StandinState",
    "ThreadedStandin",
]

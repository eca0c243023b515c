"""The Azure Container Apps sandboxes service's HTTP API, for both sides that talk to it.

The operator's `acas` backend (`sandbox_operator.backends.acas`: create, observe, suspend and
dispose remote sandboxes) and the client's data plane for them
(`sandbox_operator.client.dataplane.acas`: exec and files) are two users of one API client. It
sits here, below both, so that the client never imports a backend (AGENTS.md, "Import rules").
Nothing of the operator in it (Kubernetes only to read a credential Secret, when the
configuration names one, through the caller's API client).

* `AcasBackendConfig` - one `type: acas` entry of the operator configuration: where the sandbox
  group is and what it declares (imported by `sandbox_operator.config`).
* `AcasClient` - async HTTP client of the data-plane API (one per backend).
* `StaticTokenProvider`, `TokenProvider`, `token_provider_for` - bearer tokens for it.
* `AcasError` and its subclasses (`errors.py`), typed by what a caller branches on.
* `REMOTE_KIND` - the `servedBy.kind` of a Sandbox one of its sandboxes serves.
"""

from .api import AcasClient
from .auth import StaticTokenProvider, TokenProvider, token_provider_for
from .config import AcasBackendConfig
from .errors import AcasError, disposal_code, disposal_failure
from .models import REMOTE_KIND

__all__ = [
    "REMOTE_KIND",
    "AcasBackendConfig",
    "AcasClient",
    "AcasError",
    "StaticTokenProvider",
    "TokenProvider",
    "disposal_code",
    "disposal_failure",
    "token_provider_for",
]

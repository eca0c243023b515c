"""Azure Container Apps sandboxes backend (`type: acas`).

* `AcasBackendConfig` - the operator configuration entry (imported by `sandbox_operator.config`).
* `AcasClient` - async HTTP client of the data-plane API (one per backend).
* `driver.build_driver` / `AcasDriver` - the operator's `BackendDriver`.
* The client's `DataPlane` for these sandboxes is the client's own:
  `sandbox_operator.client.dataplane.acas` (`AcasDataPlane`, `acas_dataplanes`).

Submodules that need the Kubernetes packages are not imported here.
"""

from .api import AcasClient
from .auth import StaticTokenProvider, TokenProvider, token_provider_for
from .config import AcasBackendConfig
from .errors import AcasError, disposal_code, disposal_failure

__all__ = [
    "AcasBackendConfig",
    "AcasClient",
    "AcasError",
    "StaticTokenProvider",
    "TokenProvider",
    "disposal_code",
    "disposal_failure",
    "token_provider_for",
]

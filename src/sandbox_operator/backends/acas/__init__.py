"""Azure Container Apps sandboxes backend (`type: acas`): config, HTTP client, driver."""

from .config import AcasBackendConfig

__all__ = ["AcasBackendConfig"]

"""sandbox-operator: AI-agent sandboxes as Kubernetes custom resources."""

__version__ = "0.1.0"

"""Azure Container Apps sandboxes backend (`type: acas`): the operator's driver.

* `driver.build_driver` / `AcasDriver` - the operator's `BackendDriver`, with `remote.py` (a
  Sandbox's remote sandbox: names, labels, the create request), `cache.py` (the observe cache)
  and `suspend.py`.
* The service's HTTP API client, its configuration entry (`AcasBackendConfig`), tokens and
  errors are `sandbox_operator.acas`, shared with the client's data plane for these sandboxes
  (`sandbox_operator.client.dataplane.acas`), which imports no backend.

Submodules that need the Kubernetes packages are not imported here.
"""

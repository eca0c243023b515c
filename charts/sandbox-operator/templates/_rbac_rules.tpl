{{/*
The operator's permissions, kept in one place. tests/unit/test_chart_rbac.py renders these and
compares them with the Kubernetes calls the operator's code makes.
*/}}

{{/* Rules on namespaced objects: the watched namespaces, or all of them. */}}
{{- define "sandbox-operator.namespacedRules" -}}
- apiGroups: [sandbox-operator.dev]
  resources: [sandboxes]
  # deletecollection: a scope purge deletes its Sandboxes in one call by label selector.
  verbs: [get, list, watch, patch, delete, deletecollection]
- apiGroups: [sandbox-operator.dev]
  resources: [sandboxscopes]
  # use: the operator grants it on a scope to the scope's agentServiceAccounts, and RBAC lets it
  # grant only what it holds (reconcile/access.py).
  verbs: [get, list, watch, patch, use]
- apiGroups: [sandbox-operator.dev]
  resources: [sandboxwarmpools]
  verbs: [list, watch, patch]
- apiGroups: [sandbox-operator.dev]
  resources: [sandboxes/status, sandboxscopes/status, sandboxwarmpools/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [pods]
  # patch: claiming a warm pool's idle pod for a Sandbox (labels and owner, one conditional patch).
  verbs: [get, list, watch, create, patch, delete, deletecollection]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  # watch: the operator reconciles from watched views; update: a namespace's egress policy that
  # differs from its backend's is replaced; deletecollection: scope purges.
  verbs: [get, list, watch, create, update, delete, deletecollection]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  # The work volumes of sandboxes with spec.storage (kept while suspended); deletecollection:
  # scope purges.
  verbs: [get, list, watch, create, delete, deletecollection]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  # A bound SandboxScope's Role and RoleBinding (sandbox-conversation-<scope>, reconcile/access.py),
  # written by server-side apply (create when missing); the garbage collector deletes them with
  # the scope. RBAC lets the operator grant in them only what it holds itself.
  verbs: [create, patch]
- apiGroups: [""]
  resources: [events]
  # list, watch: a pod stuck before its containers exist is explained by the kubelet's events (a
  # node without the RuntimeClass's handler), watched with the field selector
  # reason=FailedCreatePodSandBox (backends/runtimeclass/pod_sandbox_failures.py).
  verbs: [create, list, watch]
{{- if kindIs "map" .Values.config.egressProxy }}
# The egress proxy the operator runs per namespace (backends/egress_proxy.py): its objects are
# all named sandbox-egress-proxy and written by server-side apply, which needs create when the
# object is missing. The garbage collector deletes them (ownerReferences), never the operator.
- apiGroups: [""]
  resources: [serviceaccounts, configmaps]
  resourceNames: [sandbox-egress-proxy]
  verbs: [create, patch]
- apiGroups: [""]
  resources: [services]
  resourceNames: [sandbox-egress-proxy]
  verbs: [get, create, patch]
- apiGroups: [apps]
  resources: [deployments]
  resourceNames: [sandbox-egress-proxy]
  verbs: [create, patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  resourceNames: [sandbox-egress-proxy]
  verbs: [create, patch]
# The proxy's Role lets it patch Events (folded repeats); RBAC lets the operator create that Role
# only if it holds every permission in it itself.
- apiGroups: [""]
  resources: [events]
  verbs: [patch]
{{- end }}
{{- if .Values.watchNamespaces }}
{{ include "sandbox-operator.publishedRule" . }}
{{- end }}
{{- if and .Values.peering.enabled .Values.watchNamespaces }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end }}

{{/* Rules on cluster-scoped objects. */}}
{{- define "sandbox-operator.clusterRules" -}}
- apiGroups: [node.k8s.io]
  resources: [runtimeclasses]
  verbs: [get]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.watchNamespaces }}
# kopf watches the namespaces it serves, to notice them being created or deleted.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- if and .Values.peering.enabled (not .Values.watchNamespaces) }}
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end }}

{{/*
The ConfigMap the operator publishes its backends in (reconcile/publish.py), in every namespace
it serves or, serving all of them, in its own: read, then server-side applied only when it
differs (an apply of a missing object is authorized as create, by name).
*/}}
{{- define "sandbox-operator.publishedRule" -}}
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [sandbox-operator-backends]
  verbs: [get, create, patch]
{{- end }}

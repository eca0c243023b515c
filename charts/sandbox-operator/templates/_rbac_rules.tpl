{{/*
The operator's permissions, kept in one place. tests/unit/test_chart_rbac.py renders these and
compares them with the Kubernetes calls the operator's code makes. docs/rbac.md's table is
generated from this file (`make docs`, sandbox_operator.docgen): a comment inside a rule (indented
under it) is that rule's "why" there; a comment at the start of a line is for readers of this file.
*/}}

{{/* Rules on namespaced objects: the watched namespaces, or all of them. */}}
{{- define "sandbox-operator.namespacedRules" -}}
- apiGroups: [sandbox-operator.dev]
  resources: [sandboxes]
  # delete and deletecollection: a scope purge deletes its Sandboxes (in one call by label
  # selector); get: only to confirm a Sandbox whose pod vanished is being deleted.
  verbs: [get, list, watch, patch, delete, deletecollection]
- apiGroups: [sandbox-operator.dev]
  resources: [sandboxscopes]
  # get: a scope a Sandbox names but the views do not hold yet is confirmed with one read (its
  # watch event can lag the Sandbox's); use: the operator grants it on a scope to the scope's
  # agentServiceAccounts (reconcile/access.py), and RBAC lets it grant only what it holds.
  verbs: [get, list, watch, patch, use]
- apiGroups: [sandbox-operator.dev]
  resources: [sandboxes/ports]
  # connect: the ports router's verb (docs/ports.md); the operator grants it on a conversation's
  # Sandboxes, by name, to the scope's agentServiceAccounts (reconcile/access.py), and RBAC lets
  # it grant only what it holds. The operator itself never connects.
  verbs: [connect]
- apiGroups: [sandbox-operator.dev]
  resources: [sandboxwarmpools]
  # kopf: its watch, and its patches.
  verbs: [list, watch, patch]
- apiGroups: [sandbox-operator.dev]
  resources: [sandboxes/status, sandboxscopes/status, sandboxwarmpools/status]
  # Conditions and status fields, written only when they differ.
  verbs: [patch]
- apiGroups: [""]
  resources: [pods]
  # patch: claiming a warm pool's idle pod for a Sandbox (labels and owner, one conditional patch);
  # deletecollection: scope purges.
  verbs: [get, list, watch, create, patch, delete, deletecollection]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  # watch: the operator reconciles from watched views; update: a namespace's egress policy that
  # differs from its backend's is replaced; deletecollection: a scope purge of older per-Sandbox
  # policies.
  verbs: [get, list, watch, create, update, delete, deletecollection]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  # The work volumes of sandboxes with spec.storage (kept while suspended); watch: the views;
  # deletecollection: scope purges.
  verbs: [get, list, watch, create, delete, deletecollection]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  # A bound SandboxScope's Role and RoleBinding (sandbox-conversation-<scope>, reconcile/access.py),
  # written by server-side apply (create when missing); the garbage collector deletes them with
  # the scope. RBAC lets the operator grant in them only what it holds itself.
  verbs: [create, patch]
- apiGroups: [""]
  resources: [events]
  # create: Events on Sandboxes (the operator's and kopf's); list, watch: a pod stuck before its
  # containers exist is explained by the kubelet's events (a node without the RuntimeClass's
  # handler), watched with the field selector reason=FailedCreatePodSandBox
  # (backends/runtimeclass/pod_sandbox_failures.py).
  verbs: [create, list, watch]
{{- if kindIs "map" .Values.config.egressProxy }}
# The egress proxy the operator runs per namespace (backends/egress_proxy.py): its objects are
# all named sandbox-egress-proxy and written by server-side apply, which needs create when the
# object is missing. The garbage collector deletes them (ownerReferences), never the operator.
- apiGroups: [""]
  resources: [serviceaccounts, configmaps]
  resourceNames: [sandbox-egress-proxy]
  # The proxy's identity and its configuration.
  verbs: [create, patch]
- apiGroups: [""]
  resources: [secrets]
  resourceNames: [sandbox-egress-proxy]
  # The proxy's interception CA (config.egressProxy.config.interception): read once per
  # namespace, then applied with the other objects. Only the proxy's pod mounts it.
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [services]
  resourceNames: [sandbox-egress-proxy]
  # The proxy's address; get: the check that the proxy is still at a sandbox's recorded address.
  verbs: [get, create, patch]
- apiGroups: [apps]
  resources: [deployments]
  resourceNames: [sandbox-egress-proxy]
  # The proxy's pod.
  verbs: [create, patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  resourceNames: [sandbox-egress-proxy]
  # What the proxy may do in its namespace (read Sandboxes and pods, post Events, patch status).
  verbs: [create, patch]
- apiGroups: [""]
  resources: [events]
  # The proxy's Role lets it patch Events (folded repeats); RBAC lets the operator create that
  # Role only if it holds every permission in it itself.
  verbs: [patch]
{{- if .Values.egressCredentials.enabled }}
{{ include "sandbox-operator.egressCredentialsRules" (dict "role" (printf "%s-egress-credentials" (include "sandbox-operator.fullname" .))) }}
{{- end }}
{{- end }}
{{- if .Values.watchNamespaces }}
{{ include "sandbox-operator.publishedRule" . }}
{{- end }}
{{- end }}

{{/* Rules on cluster-scoped objects. */}}
{{- define "sandbox-operator.clusterRules" -}}
- apiGroups: [node.k8s.io]
  resources: [runtimeclasses]
  # Whether each backend's RuntimeClass exists: the availability probe, at start and then at
  # most every 30 s.
  verbs: [get]
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  # kopf: discovery of the resources it serves.
  verbs: [list, watch]
- apiGroups: [""]
  resources: [namespaces]
  # kopf watches the namespaces it serves, to notice them being created or deleted; serving all
  # of them, the operator watches them to publish its backends into each (reconcile/publish.py).
  verbs: [list, watch]
{{- if and .Values.peering.enabled .Values.watchNamespaces }}
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  # kopf peering: the highest-priority replica acts, the others stand by. Granted in every
  # namespace, not per served one: a `helm upgrade` that changes watchNamespaces removes the old
  # namespaces' Roles before the outgoing pod has stopped, and kopf's last peering write there
  # must meet a missing object (which it ignores), not a 403 (which it retries until killed).
  verbs: [get, list, watch, patch]
{{- end }}
{{- if and .Values.peering.enabled (not .Values.watchNamespaces) }}
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  # kopf peering: the highest-priority replica acts, the others stand by.
  verbs: [get, list, watch, patch]
{{- end }}
{{- if .Values.sealIdlePoolPods }}
{{ include "sandbox-operator.sealRule" (dict "connect" (printf "%s-sealed-pool-pods" (include "sandbox-operator.fullname" .)) "update" (printf "%s-sealed-pool-pods-update" (include "sandbox-operator.fullname" .))) }}
{{- end }}
{{- end }}

{{/*
Credentials at the egress hop (templates/egress-credentials.yaml), with egressCredentials.enabled
beside config.egressProxy; context: the Secrets reader ClusterRole's name (role).
*/}}
{{- define "sandbox-operator.egressCredentialsRules" -}}
- apiGroups: [rbac.authorization.k8s.io]
  resources: [rolebindings]
  resourceNames: [sandbox-egress-proxy-credentials]
  # Binds the proxy's ServiceAccount to the Secrets reader ClusterRole in its namespace, so the
  # proxy reads the Secrets egressRules credentials name (docs/egress-credentials.md).
  verbs: [create, patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterroles]
  resourceNames: [{{ .role }}]
  # The chart's <fullname>-egress-credentials (get on Secrets). bind: RBAC lets the operator bind
  # it without holding what it grants, so the operator never reads those Secrets; the proxy does.
  verbs: [bind]
{{- end }}

{{/*
The policies sealing idle warm-pool pods (templates/sealed-pool-pods-policy.yaml), which the
operator checks rather than assumes; context: the two policies' names (connect, update).
*/}}
{{- define "sandbox-operator.sealRule" -}}
- apiGroups: [admissionregistration.k8s.io]
  resources: [validatingadmissionpolicies, validatingadmissionpolicybindings]
  resourceNames:
    - {{ .connect }}
    - {{ .update }}
  # Whether idle warm-pool pods are sealed until claimed (reconcile/seal.py): the two policies
  # and their bindings, watched by name (a field selector, authorized by resourceNames).
  verbs: [get, list, watch]
{{- end }}

{{/*
The ConfigMap the operator publishes its backends in (reconcile/publish.py), in every namespace
it serves: read (serving all namespaces, listed by name across them: a list with the field
selector metadata.name is authorized by resourceNames), then server-side applied only when it
differs (an apply of a missing object is authorized as create, by name).
*/}}
{{- define "sandbox-operator.publishedRule" -}}
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [sandbox-operator-backends]
  # The backends it serves, for clients (docs/operator.md); read, then applied when it differs.
  verbs: [get, list, create, patch]
{{- end }}

{{/*
An acas backend whose credential is a Kubernetes Secret: the operator reads that one Secret (get,
by name) in its namespace. Its context is the backend's entry of config.backends (rbac.yaml).
*/}}
{{- define "sandbox-operator.credentialRule" -}}
- apiGroups: [""]
  resources: [secrets]
  resourceNames: [{{ .credential.secretName | quote }}]
  # The acas backend's credential.
  verbs: [get]
{{- end }}

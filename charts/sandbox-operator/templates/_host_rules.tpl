{{/*
The maf host's permissions (hostRole, host-role.yaml): what sandbox_operator.maf.OperatorBackend
calls under the host's identity, and nothing else. docs/rbac.md's host table is generated from
this file (`make docs`) as the operator's is from _rbac_rules.tpl: a comment inside a rule is its
"why". tests/maf/test_host_role.py runs the maf route under exactly these rules.
*/}}
{{- define "sandbox-operator.hostRules" -}}
- apiGroups: [sandbox-operator.dev]
  resources: [sandboxscopes]
  # The conversations it hosts: a SandboxScope per (scope, thread), server-side applied (create
  # when missing), watched until Ready when it binds agents, deleted by dispose_scope.
  verbs: [create, get, list, watch, patch, delete]
- apiGroups: [sandbox-operator.dev]
  resources: [sandboxes]
  # acquire (server-side apply, then a watch until Ready), last-activity stamps (patch), and
  # dispose / dispose_scope (list by label, delete by uid, watch until gone).
  verbs: [create, get, list, watch, patch, delete]
- apiGroups: [""]
  resources: [pods/exec]
  # The sandboxes' data plane. Every pod of the namespace to RBAC; with hostRole.restrictExec two
  # admission policies leave only claimed or cold sandbox pods.
  verbs: [create, get]
- apiGroups: [""]
  resources: [configmaps]
  resourceNames: [sandbox-operator-backends]
  # The backends the operator publishes in each namespace it serves, read by
  # OperatorBackend.connect.
  verbs: [get]
{{- if .Values.hostRole.credentialGrants }}
- apiGroups: [""]
  resources: [secrets]
  # With a maf CredentialGateway: each sandbox's grant, written (server-side apply) into a Secret
  # the Sandbox owns; get: the egressCredentials policy admits a Sandbox naming a Secret only from
  # a requester that may get it. RBAC cannot name Secrets not made yet: the namespace's Secrets.
  verbs: [create, patch, get]
{{- end }}
{{- end }}

{{/*
The exec confinement shared by the identities the chart grants pods/exec (the agents, agent-role.yaml;
the maf host, host-role.yaml). RBAC cannot name pods that do not exist yet, so pods/exec is
granted on the namespace's pods, and two ValidatingAdmissionPolicies take it back for every pod
but a claimed or cold sandbox pod: one refuses an exec into a pod whose name is not a sandbox
pod's (agentRole.sandboxPodPrefix), one an exec into an idle warm-pool pod.

Its context is a dict: root (the chart's), name (the first policy's name; the second adds
-idle), component (the objects' app.kubernetes.io/component), who (the subjects, in the refusal
messages), match (the CEL matchCondition naming the subjects) and namespaces (where it binds).
*/}}
{{- define "sandbox-operator.execPolicies" -}}
{{- $root := .root }}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ .name }}
  labels:
    {{- include "sandbox-operator.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: [v1]
        operations: [CONNECT]
        resources: [pods/exec, pods/attach]
  matchConditions:
    - name: is-{{ .component }}
      expression: {{ .match | toJson }}
  validations:
    - expression: request.name.startsWith({{ $root.Values.agentRole.sandboxPodPrefix | toJson }})
      message: {{ .who }} may exec only into sandbox pods
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .name }}
  labels:
    {{- include "sandbox-operator.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  policyName: {{ .name }}
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchExpressions:
        - key: kubernetes.io/metadata.name
          operator: In
          values: {{ toJson .namespaces }}
---
# Idle warm-pool pods are out of exec reach: a file or process planted in one before its claim
# would reach whoever claims it. The policy's params are the namespace's idle pool pods (a pool
# makes its pods with the pool label; a claim adds the sandbox label, in the one patch it makes
# anyway), and an exec is refused when it names one of them. Claiming is what opens a pod to
# exec: no write is added for this.
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: {{ .name }}-idle
  labels:
    {{- include "sandbox-operator.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  failurePolicy: Fail
  paramKind:
    apiVersion: v1
    kind: Pod
  matchConstraints:
    resourceRules:
      - apiGroups: [""]
        apiVersions: [v1]
        operations: [CONNECT]
        resources: [pods/exec, pods/attach]
  matchConditions:
    - name: is-{{ .component }}
      expression: {{ .match | toJson }}
  validations:
    - expression: params.metadata.name != request.name
      message: {{ .who }} may not exec into an idle warm-pool pod (it is reachable once claimed)
      reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: {{ .name }}-idle
  labels:
    {{- include "sandbox-operator.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .component }}
spec:
  policyName: {{ .name }}-idle
  validationActions: [Deny]
  paramRef:
    # The idle pool pods of the request's namespace (namespace unset: the request's own).
    selector:
      matchExpressions:
        - key: sandbox-operator.dev/pool
          operator: Exists
        - key: sandbox-operator.dev/sandbox
          operator: DoesNotExist
    parameterNotFoundAction: Allow
  matchResources:
    namespaceSelector:
      matchExpressions:
        - key: kubernetes.io/metadata.name
          operator: In
          values: {{ toJson .namespaces }}
{{- end }}

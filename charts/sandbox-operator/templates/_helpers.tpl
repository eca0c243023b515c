{{/* Chart name, truncated to a DNS label. */}}
{{- define "sandbox-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified app name: release-chart unless the release name already holds the chart name. */}}
{{- define "sandbox-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "sandbox-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "sandbox-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sandbox-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sandbox-operator.labels" -}}
helm.sh/chart: {{ include "sandbox-operator.chart" . }}
{{ include "sandbox-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: sandbox-operator
{{- end }}

{{- define "sandbox-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "sandbox-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "sandbox-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
The config file the operator reads, in its own format. A managed egress proxy (config.egressProxy)
runs the operator's own image unless it names another one.
*/}}
{{- define "sandbox-operator.config" -}}
{{- $config := deepCopy .Values.config }}
{{- if kindIs "map" $config.egressProxy }}
{{- if not $config.egressProxy.image }}
{{- $_ := set $config.egressProxy "image" (include "sandbox-operator.image" .) }}
{{- end }}
{{- if not $config.egressProxy.imagePullPolicy }}
{{- $_ := set $config.egressProxy "imagePullPolicy" .Values.image.pullPolicy }}
{{- end }}
{{- if .Values.egressCredentials.enabled }}
{{- $_ := set $config.egressProxy "credentialsClusterRole" (printf "%s-egress-credentials" (include "sandbox-operator.fullname" .)) }}
{{- end }}
{{- end }}
{{- if .Values.router.enabled }}
{{- $_ := set $config "router" (dict "baseUrl" (include "sandbox-operator.routerUrl" .)) }}
{{- end }}
{{- toYaml $config }}
{{- end }}

{{/*
The router's external base URL: router.baseUrl, else its in-cluster Service's.
*/}}
{{- define "sandbox-operator.routerUrl" -}}
{{- .Values.router.baseUrl | default (printf "http://%s-router.%s.svc" (include "sandbox-operator.fullname" .) .Release.Namespace) }}
{{- end }}

{{/*
The CEL condition matching a request made by one of a list of RBAC subjects (ServiceAccounts and
Users by username, Groups by group), for admission policies' matchConditions. Its context is a
dict: subjects, and namespace (a ServiceAccount's when it names none: the release's).
*/}}
{{- define "sandbox-operator.isSubject" -}}
{{- $users := list }}
{{- $groups := list }}
{{- $namespace := .namespace }}
{{- range .subjects }}
{{- if eq .kind "ServiceAccount" }}
{{- $users = append $users (printf "system:serviceaccount:%s:%s" (.namespace | default $namespace) .name) }}
{{- else if eq .kind "User" }}
{{- $users = append $users .name }}
{{- else }}
{{- $groups = append $groups .name }}
{{- end }}
{{- end -}}
request.userInfo.username in {{ toJson $users }} || request.userInfo.groups.exists(g, g in {{ toJson $groups }})
{{- end }}

{{/*
Serving all namespaces but ignoreNamespaces: the one kopf pattern (a leading exclusion implies
every other namespace), e.g. "!t-*,!scratch".
*/}}
{{- define "sandbox-operator.ignorePattern" -}}
{{- $parts := list }}
{{- range .Values.ignoreNamespaces }}{{ $parts = append $parts (printf "!%s" .) }}{{ end }}
{{- join "," $parts }}
{{- end }}

{{/*
A CEL expression on request.namespace: whether this release serves it (the same set kopf serves:
reconcile/namespaces.py). Globs become anchored regular expressions (`*` any, `?` one character;
the schema allows nothing else that a regular expression reads specially).
*/}}
{{- define "sandbox-operator.servesNamespace" -}}
{{- if .Values.watchNamespaces -}}
request.namespace in {{ toJson .Values.watchNamespaces }}
{{- else if .Values.ignoreNamespaces -}}
{{- $globs := list }}
{{- range .Values.ignoreNamespaces }}
{{- $globs = append $globs (printf "request.namespace.matches('^%s$')" (. | replace "*" ".*" | replace "?" ".")) }}
{{- end -}}
!({{ join " || " $globs }})
{{- else -}}
true
{{- end -}}
{{- end }}

{{/* What this release serves, in words, for refusals. */}}
{{- define "sandbox-operator.servedInWords" -}}
{{- if .Values.watchNamespaces -}}
the namespaces {{ join ", " .Values.watchNamespaces }}
{{- else if .Values.ignoreNamespaces -}}
every namespace except those matching {{ join ", " .Values.ignoreNamespaces }}
{{- else -}}
every namespace
{{- end -}}
{{- end }}

{{/* A request by one of agentRole.subjects (the agents' admission policies). */}}
{{- define "sandbox-operator.isAgent" -}}
{{- include "sandbox-operator.isSubject" (dict "subjects" .Values.agentRole.subjects "namespace" .Release.Namespace) }}
{{- end }}

{{/* A request by one of hostRole.subjects (the maf host's exec policies). */}}
{{- define "sandbox-operator.isHost" -}}
{{- include "sandbox-operator.isSubject" (dict "subjects" .Values.hostRole.subjects "namespace" .Release.Namespace) }}
{{- end }}

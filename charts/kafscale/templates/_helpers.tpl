{{/* The chart's name, or nameOverride. */}}
{{- define "kafscale.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The full name of the release's objects. */}}
{{- define "kafscale.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- printf "%s-operator" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s-operator" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Selector labels (never change over a release's life). */}}
{{- define "kafscale.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kafscale.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{/* Recommended labels. */}}
{{- define "kafscale.labels" -}}
{{ include "kafscale.selectorLabels" . }}
app.kubernetes.io/part-of: kafscale
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The ServiceAccount's name. */}}
{{- define "kafscale.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kafscale.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Namespaced permissions the operator needs wherever it serves clusters. */}}
{{- define "kafscale.namespacedRules" -}}
- apiGroups: ["kafscale.io"]
  resources: ["kafscaleclusters", "kafscaletopics", "kafscaleusers"]
  verbs: ["get", "list", "watch", "patch", "update"]
- apiGroups: ["kafscale.io"]
  resources: ["kafscaleclusters/status", "kafscaletopics/status", "kafscaleusers/status"]
  verbs: ["get", "patch", "update"]
- apiGroups: ["kafscale.io"]
  resources: ["kafscaleclusters/finalizers", "kafscaletopics/finalizers", "kafscaleusers/finalizers"]
  verbs: ["update"]
- apiGroups: [""]
  resources: ["configmaps", "services"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments", "statefulsets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# cert-manager (when installed): Issuers and Certificates for TLS listeners and etcd TLS.
- apiGroups: ["cert-manager.io"]
  resources: ["issuers", "certificates"]
  verbs: ["get", "list", "watch", "create", "update", "patch", "delete"]
# get: S3 credentials named by a cluster, certificate Secrets, a KafScaleUser's password Secret;
# create/patch: KafScaleUser password Secrets, operator-made CA and certificate Secrets
# (server-side apply). No list or watch: the operator reads Secrets it knows by name only.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["", "events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}

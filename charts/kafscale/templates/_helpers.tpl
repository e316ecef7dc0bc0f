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

{{/* Namespaced permissions the operator needs wherever it serves clusters: exactly the verbs
it uses (kopf watches and patches its resources and posts core Events; the operator applies its
objects with server-side apply: create + patch, deletes the ones a spec no longer wants, and
gets by name what it reads: each object it makes, before applying over or deleting it (only
the cluster's own), and the Secrets it knows). */}}
{{- define "kafscale.namespacedRules" -}}
# kopf: list/watch and patch (finalizer, annotations); the operator: get a cluster or user by name.
- apiGroups: ["kafscale.io"]
  resources: ["kafscaleclusters", "kafscaletopics", "kafscaleusers"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["kafscale.io"]
  resources: ["kafscaleclusters/status", "kafscaletopics/status", "kafscaleusers/status"]
  verbs: ["patch"]
# Owner references with blockOwnerDeletion need update on the owner's finalizers where the
# OwnerReferencesPermissionEnforcement admission plugin runs.
- apiGroups: ["kafscale.io"]
  resources: ["kafscaleclusters/finalizers", "kafscaletopics/finalizers", "kafscaleusers/finalizers"]
  verbs: ["update"]
# get on every kind it makes: an object of that name is applied over or deleted only when it
# is the cluster's (its owner references); create: an object of a name found free (it fails
# if one appeared meanwhile). list, on the kinds a cluster has several objects of: those of
# one cluster (its labels) in one call, not a get per name; never ConfigMaps or Secrets.
# ConfigMaps: also the etcd the brokers use, read before a switch of etcd.mode.
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "create", "patch", "delete"]
# get: also the broker Deployment's replicas and rollout, the managed etcd's ready members.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["autoscaling"]
  resources: ["horizontalpodautoscalers"]
  verbs: ["get", "create", "patch", "delete"]
# Terminating broker pods are drained (a kopf watch).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "create", "patch", "delete"]
# cert-manager (when installed): Issuers and Certificates for TLS listeners and etcd TLS.
- apiGroups: ["cert-manager.io"]
  resources: ["issuers", "certificates"]
  verbs: ["get", "list", "create", "patch", "delete"]
# get: S3 credentials named by a cluster, certificate Secrets, a KafScaleUser's password Secret;
# create/patch: KafScaleUser password Secrets, operator-made CA and certificate Secrets
# (server-side apply); list/watch: the Secret watch (a kopf watch), so that a Secret a cluster's
# pods read that is broken, fixed or deleted is acted on at once, not at the next resync.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# kopf posts core/v1 Events (POST only).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

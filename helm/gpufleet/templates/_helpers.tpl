{{/* Chart name, truncated to the 63 characters Kubernetes allows in names. */}}
{{- define "gpufleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name; the release name alone when it already contains the chart name. */}}
{{- define "gpufleet.fullname" -}}
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

{{- define "gpufleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Selector labels: only name and instance (plus component), so they never change on upgrade. */}}
{{- define "gpufleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpufleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "gpufleet.labels" -}}
helm.sh/chart: {{ include "gpufleet.chart" . }}
{{ include "gpufleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpufleet
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels for objects the Prometheus Operator or Grafana selects on (release=...). */}}
{{- define "gpufleet.monitoringLabels" -}}
{{ include "gpufleet.labels" . }}
{{- with .Values.monitoring.additionalLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "gpufleet.agent.fullname" -}}
{{- printf "%s-agent" (include "gpufleet.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpufleet.fleet.fullname" -}}
{{- printf "%s-fleet" (include "gpufleet.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpufleet.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}

{{/* The ingest token Secret: the one the user names, else the chart's own. */}}
{{- define "gpufleet.agent.tokenSecret" -}}
{{- .Values.agent.ingestToken.existingSecret | default (printf "%s-ingest-token" (include "gpufleet.agent.fullname" .)) }}
{{- end }}

{{- define "gpufleet.agent.tokenEnabled" -}}
{{- if or .Values.agent.ingestToken.existingSecret .Values.agent.ingestToken.create }}true{{- end }}
{{- end }}

{{- define "gpufleet.fleet.tokenSecret" -}}
{{- .Values.fleet.token.existingSecret | default (printf "%s-token" (include "gpufleet.fleet.fullname" .)) }}
{{- end }}

{{- define "gpufleet.fleet.tokenEnabled" -}}
{{- if or .Values.fleet.token.existingSecret .Values.fleet.token.create }}true{{- end }}
{{- end }}

{{/*
A random token kept across upgrades: reuse the value already in the cluster
(lookup answers nothing under `helm template`, which then shows a fresh one).
*/}}
{{- define "gpufleet.persistentToken" -}}
{{- $existing := lookup "v1" "Secret" .namespace .name }}
{{- if and $existing $existing.data (hasKey $existing.data .key) }}
{{- index $existing.data .key }}
{{- else }}
{{- randAlphaNum 40 | b64enc }}
{{- end }}
{{- end }}

{{/* Container security context shared by the ledger and the unprivileged agent. */}}
{{- define "gpufleet.restrictedContainerSecurityContext" -}}
allowPrivilegeEscalation: false
privileged: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "gpufleet.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.securityContext.runAsUser }}
runAsGroup: {{ .Values.securityContext.runAsGroup }}
fsGroup: {{ .Values.securityContext.runAsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
Sharded scraping (docs/SCALING.md): keep the targets whose node hashes to shard .index of
.shards, so a node's exporters share a shard (gpufleet.rules.sharding.shard_relabel_configs).
*/}}
{{- define "gpufleet.shardRelabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_node_name]
  modulus: {{ .shards }}
  targetLabel: __tmp_shard
  action: hashmod
- sourceLabels: [__tmp_shard]
  regex: {{ .index | quote }}
  action: keep
{{- end }}

{{/* A shard's object name, <fullname>-<component>-shard-<index>, within 63 characters. */}}
{{- define "gpufleet.shardName" -}}
{{- $suffix := printf "-%s-shard-%d" .component .index }}
{{- printf "%s%s" (include "gpufleet.fullname" .root | trunc (int (sub 63 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

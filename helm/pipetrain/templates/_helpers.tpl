{{/* Names, labels and the worker pool settings of the pipetrain chart. */}}

{{- define "pipetrain.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-scoped base name; resource names append -scheduler, -worker... */}}
{{- define "pipetrain.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "pipetrain.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pipetrain.labels" -}}
helm.sh/chart: {{ include "pipetrain.chart" . }}
app.kubernetes.io/name: {{ include "pipetrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: pipetrain
{{- end }}

{{- define "pipetrain.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pipetrain.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pipetrain.scheduler.fullname" -}}
{{- printf "%s-scheduler" (include "pipetrain.fullname" .) }}
{{- end }}

{{/* The headless Service that gives every worker pod a stable DNS name. */}}
{{- define "pipetrain.worker.serviceName" -}}
{{- printf "%s-worker" (include "pipetrain.fullname" .) }}
{{- end }}

{{- define "pipetrain.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pipetrain.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The scheduler's gRPC address as workers dial it. */}}
{{- define "pipetrain.scheduler.address" -}}
{{- printf "%s:%d" (include "pipetrain.scheduler.fullname" .) (int .Values.scheduler.service.grpcPort) }}
{{- end }}

{{/* image.repository:tag for the CPU image (cuda=false) or the CUDA one. */}}
{{- define "pipetrain.image" -}}
{{- $root := index . 0 }}
{{- $image := index . 1 }}
{{- $cuda := index . 2 }}
{{- $repository := default $root.Values.image.repository $image.repository }}
{{- $tag := "" }}
{{- if $cuda }}
{{- $tag = default (printf "%s-cuda" $root.Chart.AppVersion) (default $root.Values.image.cudaTag $image.tag) }}
{{- else }}
{{- $tag = default $root.Chart.AppVersion (default $root.Values.image.tag $image.tag) }}
{{- end }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}

{{/*
A worker pool's settings: .Values.worker overlaid with the pool's own keys.
Returns YAML; use with fromYaml.
*/}}
{{- define "pipetrain.worker.pool" -}}
{{- $root := index . 0 }}
{{- $pool := index . 1 }}
{{- $merged := mergeOverwrite (deepCopy $root.Values.worker) (deepCopy $pool) }}
{{- toYaml $merged }}
{{- end }}

{{/* The Secret holding the CA and certificates. */}}
{{- define "pipetrain.security.tlsSecret" -}}
{{- default (printf "%s-tls" (include "pipetrain.fullname" .)) .Values.security.tls.existingSecret }}
{{- end }}

{{/* The Secret holding the bearer tokens and the join token. */}}
{{- define "pipetrain.security.tokensSecret" -}}
{{- default (printf "%s-tokens" (include "pipetrain.fullname" .)) .Values.security.existingTokensSecret }}
{{- end }}

{{/* Security flags every pipetrain container takes: mutual TLS with the
files in /pki (CERT is the file stem), or --insecure. */}}
{{- define "pipetrain.security.tlsArgs" -}}
{{- $root := index . 0 }}
{{- $cert := index . 1 }}
{{- if $root.Values.security.tls.enabled }}
- --tls_cert=/pki/{{ $cert }}.crt
- --tls_key=/pki/{{ $cert }}.key
- --tls_ca=/pki/ca.crt
{{- else }}
- --insecure
{{- end }}
{{- end }}

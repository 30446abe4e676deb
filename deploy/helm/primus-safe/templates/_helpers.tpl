{{/*
Names, labels and the pieces every workload shares: image, PRIMUS_* settings,
security context and `primus-safe health` probes.
*/}}

{{- define "primus-safe.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "primus-safe.fullname" -}}
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

{{/* <fullname>-<component>, e.g. primus-safe-scheduler. Args: root, component. */}}
{{- define "primus-safe.componentName" -}}
{{- printf "%s-%s" (include "primus-safe.fullname" .root) .component | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "primus-safe.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Args: root, component. */}}
{{- define "primus-safe.selectorLabels" -}}
app.kubernetes.io/name: {{ include "primus-safe.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* Args: root, component. */}}
{{- define "primus-safe.labels" -}}
helm.sh/chart: {{ include "primus-safe.chart" .root }}
{{ include "primus-safe.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: primus-safe
{{- end }}

{{/* Labels of release-wide objects (Secret, PriorityClasses, ...). */}}
{{- define "primus-safe.commonLabels" -}}
helm.sh/chart: {{ include "primus-safe.chart" . }}
app.kubernetes.io/name: {{ include "primus-safe.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: primus-safe
{{- end }}

{{/* Args: root, image (a {repository, tag, pullPolicy} map). */}}
{{- define "primus-safe.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{- define "primus-safe.secretName" -}}
{{- default (printf "%s-credentials" (include "primus-safe.fullname" .)) .Values.auth.existingSecret }}
{{- end }}

{{- define "primus-safe.natsUrl" -}}
{{- if .Values.nats.enabled }}
{{- printf "nats://%s:4222" (include "primus-safe.componentName" (dict "root" . "component" "nats")) }}
{{- else }}
{{- required "nats.url is required when nats.enabled is false" .Values.nats.url }}
{{- end }}
{{- end }}

{{- define "primus-safe.priorityClassName" -}}
{{- printf "%s-%s" .Values.priorityClasses.prefix .name }}
{{- end }}

{{- define "primus-safe.platformPriorityClassName" -}}
{{- if .Values.priorityClasses.create }}
{{- include "primus-safe.priorityClassName" (dict "Values" .Values "name" .Values.priorityClasses.platform.name) }}
{{- end }}
{{- end }}

{{/*
PRIMUS_* settings every service reads. Secrets only through secretKeyRef.
*/}}
{{- define "primus-safe.env" -}}
- name: PRIMUS_NATS_URL
  value: {{ include "primus-safe.natsUrl" . | quote }}
- name: PRIMUS_NATS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "primus-safe.secretName" . }}
      key: nats-token
- name: PRIMUS_CLICKHOUSE_DSN
  valueFrom:
    secretKeyRef:
      name: {{ include "primus-safe.secretName" . }}
      key: clickhouse-dsn
- name: PRIMUS_CLICKHOUSE_DATABASE
  value: {{ .Values.clickhouse.database | quote }}
- name: PRIMUS_STATE_DIR
  value: {{ .Values.config.stateDir | quote }}
- name: PRIMUS_HEARTBEAT_INTERVAL_S
  value: {{ .Values.config.heartbeatIntervalS | quote }}
- name: PRIMUS_HEARTBEAT_MISSED
  value: {{ .Values.config.heartbeatMissed | quote }}
- name: PRIMUS_TELEMETRY_INTERVAL_S
  value: {{ .Values.config.telemetryIntervalS | quote }}
- name: PRIMUS_LOG_LEVEL
  value: {{ .Values.config.logLevel | quote }}
- name: PRIMUS_DRIVER
  value: {{ .Values.config.driver | quote }}
{{- if .Values.settings }}
- name: PRIMUS_SETTINGS_FILE
  value: /etc/primus-safe/settings/settings.yaml
{{- end }}
{{- end }}

{{/* Volume mounts every service has. */}}
{{- define "primus-safe.volumeMounts" -}}
- name: state
  mountPath: {{ .Values.config.stateDir }}
- name: tmp
  mountPath: /tmp
{{- if .Values.settings }}
- name: settings
  mountPath: /etc/primus-safe/settings
  readOnly: true
{{- end }}
{{- end }}

{{- define "primus-safe.volumes" -}}
- name: state
  emptyDir: {}
- name: tmp
  emptyDir: {}
{{- if .Values.settings }}
- name: settings
  configMap:
    name: {{ include "primus-safe.componentName" (dict "root" . "component" "settings") }}
{{- end }}
{{- end }}

{{/*
startup, readiness and liveness probes running `primus-safe health`.
Args: root, command (the exec command, a list).
*/}}
{{- define "primus-safe.probes" -}}
{{- $p := .root.Values.probes -}}
startupProbe:
  exec:
    command: {{ toJson .command }}
  periodSeconds: {{ $p.startup.periodSeconds }}
  timeoutSeconds: {{ $p.startup.timeoutSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
readinessProbe:
  exec:
    command: {{ toJson .command }}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
livenessProbe:
  exec:
    command: {{ toJson .command }}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
{{- end }}

{{/*
Pod annotations that roll the pods when their configuration changes.
*/}}
{{- define "primus-safe.configChecksum" -}}
checksum/settings: {{ toYaml .Values.settings | sha256sum }}
{{- end }}

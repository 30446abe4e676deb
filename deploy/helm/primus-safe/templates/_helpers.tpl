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

{{- define "primus-safe.natsTlsSecret" -}}
{{- required "nats.tls.secretName is required when nats.tls.enabled is true: a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt" .Values.nats.tls.secretName }}
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
The NATS users, one per service and their permissions, generated from the
route tables (python -m cli.catalog --write).
*/}}
{{- define "primus-safe.natsUsers" -}}
{{ .Files.Get "files/nats-users.conf" }}
{{- end }}

{{/* The names of those users, read from the generated file (one list, no copy). */}}
{{- define "primus-safe.natsRoles" -}}
{{- range regexFindAll "user: \"[a-z-]+\"" (include "primus-safe.natsUsers" .) -1 }}
{{ trimSuffix "\"" (trimPrefix "user: \"" .) }}
{{- end }}
{{- end }}

{{/* nats-server reads $NATS_PASSWORD_<ROLE> from its environment. Args: the role. */}}
{{- define "primus-safe.natsPasswordEnv" -}}
{{- printf "NATS_PASSWORD_%s" (. | upper | replace "-" "_") }}
{{- end }}

{{/*
A generated secret: 40 characters, the first a letter, because nats-server
reads an environment value as a config value (a leading digit makes it a
number and the server refuses its config).
*/}}
{{- define "primus-safe.generatedSecret" -}}
{{- printf "%s%s" (randAlpha 1) (randAlphaNum 39) }}
{{- end }}

{{- define "primus-safe.natsTlsDir" -}}
/etc/primus-safe/nats-tls
{{- end }}

{{/*
How one service signs in to NATS: its own user (nats.auth.mode=users) or the
shared token, and the TLS files when TLS is on. Args: root, component (the
service's CLI verb, which is also its NATS user).
*/}}
{{- define "primus-safe.natsEnv" -}}
{{- $root := .root -}}
{{- if eq $root.Values.nats.auth.mode "users" }}
- name: PRIMUS_NATS_USER
  value: {{ .component | quote }}
- name: PRIMUS_NATS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "primus-safe.secretName" $root }}
      key: {{ printf "nats-password-%s" .component }}
{{- else }}
- name: PRIMUS_NATS_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "primus-safe.secretName" $root }}
      key: nats-token
{{- end }}
{{- if $root.Values.nats.tls.enabled }}
- name: PRIMUS_NATS_TLS_CA
  value: {{ printf "%s/ca.crt" (include "primus-safe.natsTlsDir" $root) | quote }}
{{- if $root.Values.nats.tls.verifyClients }}
- name: PRIMUS_NATS_TLS_CERT
  value: {{ printf "%s/tls.crt" (include "primus-safe.natsTlsDir" $root) | quote }}
- name: PRIMUS_NATS_TLS_KEY
  value: {{ printf "%s/tls.key" (include "primus-safe.natsTlsDir" $root) | quote }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The writer's DSN, for lens-collector only (no other service touches
ClickHouse): from this release's Secret with the bundled server, else from
the Secret named by clickhouse.external.dsnSecret.
*/}}
{{- define "primus-safe.clickhouseEnv" -}}
- name: PRIMUS_CLICKHOUSE_DSN
  valueFrom:
    secretKeyRef:
{{- if .Values.clickhouse.enabled }}
      name: {{ include "primus-safe.secretName" . }}
      key: clickhouse-dsn
{{- else }}
      name: {{ required "clickhouse.external.dsnSecret.name is required when clickhouse.enabled is false: the Secret holding the writer's DSN" .Values.clickhouse.external.dsnSecret.name }}
      key: {{ .Values.clickhouse.external.dsnSecret.key }}
{{- end }}
{{- end }}

{{/*
PRIMUS_* settings every service reads. Secrets only through secretKeyRef
(primus-safe.natsEnv and primus-safe.clickhouseEnv).
*/}}
{{/*
Copies of each stream and KV bucket: one per server of a bundled NATS
cluster (so a stream survives the loss of a server), else one.
*/}}
{{- define "primus-safe.natsReplicas" -}}
{{- if and .Values.nats.enabled .Values.nats.cluster.enabled -}}
{{ .Values.nats.cluster.replicas }}
{{- else -}}
1
{{- end -}}
{{- end }}

{{- define "primus-safe.env" -}}
- name: PRIMUS_METRICS
  value: {{ .Values.metrics.enabled | quote }}
- name: PRIMUS_METRICS_PORT
  value: {{ int .Values.metrics.port | quote }}
- name: PRIMUS_NATS_URL
  value: {{ include "primus-safe.natsUrl" . | quote }}
- name: PRIMUS_NATS_REPLICAS
  value: {{ include "primus-safe.natsReplicas" . | quote }}
- name: PRIMUS_CLICKHOUSE_DATABASE
  value: {{ .Values.clickhouse.database | quote }}
{{- if and (not .Values.clickhouse.enabled) .Values.clickhouse.external.cluster }}
- name: PRIMUS_CLICKHOUSE_CLUSTER
  value: {{ .Values.clickhouse.external.cluster | quote }}
{{- end }}
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
- name: PRIMUS_K8S_CLUSTER_DOMAIN
  value: {{ .Values.config.clusterDomain | quote }}
- name: PRIMUS_LOG_SHIP
  value: {{ .Values.config.logShip | quote }}
{{- with .Values.config.workerLogs }}
- name: PRIMUS_WORKER_LOG_SHIP
  value: {{ .ship | quote }}
- name: PRIMUS_WORKER_LOG_RATE_BYTES_S
  value: {{ int .rateBytesS | quote }}
- name: PRIMUS_WORKER_LOG_MIN_RATE_BYTES_S
  value: {{ int .minRateBytesS | quote }}
- name: PRIMUS_WORKER_LOG_MAX_LINE_BYTES
  value: {{ int .maxLineBytes | quote }}
{{- end }}
- name: PRIMUS_LENS_LOGS_TTL_DAYS
  value: {{ int .Values.config.logsTtlDays | quote }}
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
{{- if .Values.nats.tls.enabled }}
- name: nats-tls
  mountPath: {{ include "primus-safe.natsTlsDir" . }}
  readOnly: true
{{- end }}
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
{{- if .Values.nats.tls.enabled }}
- name: nats-tls
  secret:
    secretName: {{ include "primus-safe.natsTlsSecret" . }}
    {{- if not .Values.nats.tls.verifyClients }}
    items:
      - key: ca.crt
        path: ca.crt
    {{- end }}
{{- end }}
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

{{/*
A container's metrics port (metrics.enabled), under the name the PodMonitor,
the ServiceMonitor's Service and the NetworkPolicy use.
*/}}
{{- define "primus-safe.metricsPort" -}}
{{- if .Values.metrics.enabled }}
ports:
  - name: metrics
    containerPort: {{ int .Values.metrics.port }}
    protocol: TCP
{{- end }}
{{- end }}

{{/*
Pod annotations for Prometheus's annotation-based pod discovery.
*/}}
{{- define "primus-safe.scrapeAnnotations" -}}
{{- if and .Values.metrics.enabled .Values.metrics.scrapeAnnotations }}
prometheus.io/scrape: "true"
prometheus.io/port: {{ int .Values.metrics.port | quote }}
prometheus.io/path: /metrics
{{- end }}
{{- end }}

{{/*
The pods that serve /metrics. Args: release (its name and instance labels),
components (list).
*/}}
{{- define "primus-safe.metricsSelector" -}}
matchLabels:
  {{- toYaml .release | nindent 2 }}
matchExpressions:
  - key: app.kubernetes.io/component
    operator: In
    values: {{ toJson .components }}
{{- end }}

{{/* The monitors' target labels: the component as `service`, an agent's node as `node`. */}}
{{- define "primus-safe.metricsRelabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_label_app_kubernetes_io_component]
  targetLabel: service
# Agents only: a service's Kubernetes node is not a platform node.
- sourceLabels: [__meta_kubernetes_pod_label_app_kubernetes_io_component, __meta_kubernetes_pod_node_name]
  regex: bench-agent;(.+)
  targetLabel: node
  replacement: $1
{{- end }}

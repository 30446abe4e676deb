{{/*
The services' configuration files rendered from values: the scheduler's
workspaces and priorities (scheduler.config), failover's fault rules
(failover.rules), Lens alert rules (lensCollector.alertRules) and the bench
config (bench.config). Each becomes one ConfigMap holding one file, mounted
read-only as a directory (never subPath, so that kubelet updates the file in
place) at /etc/primus-safe/<dir>/<file>, and the service's setting names
that path. values.schema.json holds each file's schema, generated from the
model the service loads (python -m cli.catalog --write).
*/}}

{{/* The directory a configuration file is mounted in. Args: the dir name. */}}
{{- define "primus-safe.configDir" -}}
{{- printf "/etc/primus-safe/%s" . }}
{{- end }}

{{/*
One configuration file's pieces for a pod, as YAML (read back with fromYaml):
env (the setting that names the file), mount and volume (lists as strings,
as primus-safe.service takes them), checksum (rolls the pods on a change).
Args: root, name (ConfigMap suffix and volume name), dir, file, env, data.
*/}}
{{- define "primus-safe.configFile" -}}
{{- $path := printf "%s/%s" (include "primus-safe.configDir" .dir) .file -}}
env: |
  - name: {{ .env }}
    value: {{ $path | quote }}
mount: |
  - name: {{ .name }}
    mountPath: {{ include "primus-safe.configDir" .dir }}
    readOnly: true
volume: |
  - name: {{ .name }}
    configMap:
      name: {{ include "primus-safe.componentName" (dict "root" .root "component" .name) }}
checksum: {{ toYaml (default (dict) .data) | sha256sum }}
{{- end }}

{{/*
The ConfigMap holding one configuration file. Args: root, component (its
labels), name (ConfigMap suffix), file, data (a map; empty: the model's
defaults).
*/}}
{{- define "primus-safe.configMap" -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "primus-safe.componentName" (dict "root" .root "component" .name) }}
  namespace: {{ .root.Release.Namespace }}
  labels:
    {{- include "primus-safe.labels" (dict "root" .root "component" .component) | nindent 4 }}
data:
  {{ .file }}: |
    {{- toYaml (default (dict) .data) | nindent 4 }}
{{- end }}

{{/*
The claim training workers mount for their checkpoints
(PRIMUS_K8S_CHECKPOINT_PVC): the chart's own (checkpoints.create), an
existing one (checkpoints.claimName), or none ("").
*/}}
{{- define "primus-safe.checkpointClaim" -}}
{{- $c := .Values.checkpoints -}}
{{- if $c.create -}}
{{- default (include "primus-safe.componentName" (dict "root" . "component" "checkpoints")) $c.claimName -}}
{{- else -}}
{{- $c.claimName -}}
{{- end -}}
{{- end }}

{{/* The bench config file's pieces (agents and coordinator share it). */}}
{{- define "primus-safe.benchConfigFile" -}}
{{- include "primus-safe.configFile" (dict "root" . "name" "bench-config" "dir" "bench" "file" "bench.yaml" "env" "PRIMUS_BENCH_CONFIG" "data" .Values.bench.config) }}
{{- end }}

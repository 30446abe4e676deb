{{/*
One control-plane service: its ServiceAccount and its Deployment.
Every service runs from the same image; the CLI verb picks the service.

Args:
  root            the chart's root context
  component       name of the service and of its CLI verb (e.g. lens-collector)
  values          the service's values (replicas, resources, ...)
  automountToken  whether the pod gets a Kubernetes API token (RBAC users only)
  strategy        optional Deployment strategy type (Recreate for singletons)
  extraEnv        optional YAML list (string) of additional env entries
  extraMounts     optional YAML list (string) of additional volumeMounts
  extraVolumes    optional YAML list (string) of additional volumes
  checksum        optional value of a checksum annotation (rolls the pods)
*/}}
{{- define "primus-safe.service" -}}
{{- $root := .root -}}
{{- $v := .values -}}
{{- $ctx := dict "root" $root "component" .component -}}
{{- $name := include "primus-safe.componentName" $ctx -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "primus-safe.labels" $ctx | nindent 4 }}
automountServiceAccountToken: {{ .automountToken }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "primus-safe.labels" $ctx | nindent 4 }}
spec:
  replicas: {{ $v.replicas }}
  revisionHistoryLimit: 5
  {{- with .strategy }}
  strategy:
    type: {{ . }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "primus-safe.selectorLabels" $ctx | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "primus-safe.labels" $ctx | nindent 8 }}
      annotations:
        {{- include "primus-safe.configChecksum" $root | nindent 8 }}
        {{- with (include "primus-safe.scrapeAnnotations" $root) }}
        {{- . | nindent 8 }}
        {{- end }}
        {{- with .checksum }}
        checksum/config: {{ . }}
        {{- end }}
        {{- with $v.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ $name }}
      automountServiceAccountToken: {{ .automountToken }}
      {{- with (include "primus-safe.platformPriorityClassName" $root) }}
      priorityClassName: {{ . }}
      {{- end }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        {{- toYaml $root.Values.podSecurityContext | nindent 8 }}
      terminationGracePeriodSeconds: 30
      containers:
        - name: {{ .component }}
          image: {{ include "primus-safe.image" (dict "root" $root "image" $root.Values.image) }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args: [{{ .component | quote }}]
          {{- with (include "primus-safe.metricsPort" $root) }}
          {{- . | nindent 10 }}
          {{- end }}
          env:
            {{- include "primus-safe.env" $root | nindent 12 }}
            {{- include "primus-safe.natsEnv" $ctx | nindent 12 }}
            {{- with .extraEnv }}
            {{- . | nindent 12 }}
            {{- end }}
            {{- with $v.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- include "primus-safe.probes" (dict "root" $root "command" (list "primus-safe" "health" .component "--here")) | nindent 10 }}
          resources:
            {{- toYaml $v.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          volumeMounts:
            {{- include "primus-safe.volumeMounts" $root | nindent 12 }}
            {{- with .extraMounts }}
            {{- . | nindent 12 }}
            {{- end }}
      volumes:
        {{- include "primus-safe.volumes" $root | nindent 8 }}
        {{- with .extraVolumes }}
        {{- . | nindent 8 }}
        {{- end }}
      {{- with $v.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $v.affinity }}
      affinity:
        {{- toYaml . | nindent 8 }}
      {{- end }}
{{- end }}

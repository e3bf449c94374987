{{/* Names, labels and the image, shared by every template. */}}

{{- define "lading.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lading.fullname" -}}
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

{{- define "lading.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "lading.labels" -}}
helm.sh/chart: {{ include "lading.chart" . }}
app.kubernetes.io/name: {{ include "lading.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: lading
{{- end }}

{{- define "lading.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lading.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "lading.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lading.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@sha256:... when the tag is a digest. */}}
{{- define "lading.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if hasPrefix "sha256:" $tag }}
{{- printf "%s@%s" .Values.image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* `lading operator` flags shaping the worker Deployments it renders, from `workers`, `keda`,
`amqp` and `imagePullSecrets` (workers run the chart's image). */}}
{{- define "lading.workerArgs" -}}
{{- $w := .Values.workers }}
{{- if .Values.amqp.secretName }}
- --amqp-secret
- "{{ .Values.amqp.secretName }}:{{ .Values.amqp.secretKey }}"
{{- end }}
{{- range .Values.imagePullSecrets }}
- --worker-image-pull-secret
- {{ .name | quote }}
{{- end }}
- --worker-resources
- {{ toJson $w.resources | quote }}
- --worker-log-level
- {{ $w.logLevel | quote }}
{{- with $w.processes }}
- --worker-processes
- {{ . | toString | quote }}
{{- end }}
{{- range $w.egressAllow }}
- --worker-egress-allow
- {{ . | quote }}
{{- end }}
{{- with $w.extraEnv }}
- --worker-env
- {{ toJson . | quote }}
{{- end }}
{{- with $w.volumes }}
- --worker-volumes
- {{ toJson . | quote }}
{{- end }}
{{- with $w.volumeMounts }}
- --worker-volume-mounts
- {{ toJson . | quote }}
{{- end }}
{{- range $w.documentRoots }}
- --worker-document-root
- {{ . | quote }}
{{- end }}
{{- range $key, $value := $w.labels }}
- --worker-label
- "{{ $key }}={{ $value }}"
{{- end }}
{{- range $key, $value := $w.annotations }}
- --worker-annotation
- "{{ $key }}={{ $value }}"
{{- end }}
{{- range $key, $value := $w.nodeSelector }}
- --worker-node-selector
- "{{ $key }}={{ $value }}"
{{- end }}
{{- with $w.tolerations }}
- --worker-tolerations
- {{ toJson . | quote }}
{{- end }}
{{- $cleaner := dict "intervalSeconds" "cleaner-interval" "batch" "cleaner-batch" "maxBatches" "cleaner-max-batches" }}
{{- range $key, $flag := $cleaner }}
{{- if hasKey $w.cleaner $key }}
- --worker-{{ $flag }}
- {{ index $w.cleaner $key | toString | quote }}
{{- end }}
{{- end }}
{{- $retention := dict "publishedEvents" "published-events" "inbox" "inbox" "quarantine" "quarantine" "delivered" "delivered" "staleCompletions" "stale-completions" "limiter" "limiter" "idempotencyKeys" "idempotency-keys" "gpuIntervals" "gpu-intervals" }}
{{- range $key, $flag := $retention }}
{{- if hasKey $w.retentionHours $key }}
- --worker-retain-{{ $flag }}-hours
- {{ index $w.retentionHours $key | toString | quote }}
{{- end }}
{{- end }}
{{- with .Values.keda.databaseSecret.secretName }}
- --keda-db-secret
- "{{ . }}:{{ $.Values.keda.databaseSecret.secretKey }}"
{{- end }}
{{- with .Values.keda.prometheusUrl }}
- --keda-prometheus-url
- {{ . | quote }}
{{- end }}
{{- end }}

{{/* Environment every Lading process shares: the database URL and, when configured, the broker URL. */}}
{{- define "lading.commonEnv" -}}
- name: LADING_LOG_FORMAT
  value: {{ .Values.logFormat | quote }}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.database.secretName }}
      key: {{ .Values.database.secretKey }}
{{- if .Values.amqp.secretName }}
- name: LADING_AMQP_URL
  valueFrom:
    secretKeyRef:
      name: {{ .Values.amqp.secretName }}
      key: {{ .Values.amqp.secretKey }}
{{- end }}
{{- end }}

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

{{- define "lading.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
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

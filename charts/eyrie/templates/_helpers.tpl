{{/* The release's full name, cut to the 63 characters a label or DNS name allows. */}}
{{- define "eyrie.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "eyrie.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "eyrie.labels" -}}
{{ include "eyrie.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: eyrie
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "eyrie.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "eyrie.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "eyrie.image" -}}
{{- printf "%s:%s" .repository .tag -}}
{{- end -}}

{{/* The operator's permissions, generated from operator/rbac.py by `python hack/derived.py`. */}}
{{- define "eyrie.rbacRules" -}}
{{- $doc := .Files.Get "files/rbac.json" | fromJson -}}
{{- if not $doc.rules -}}
{{- fail "files/rbac.json is missing or empty: run `python hack/derived.py`" -}}
{{- end -}}
{{- toJson $doc.rules -}}
{{- end -}}

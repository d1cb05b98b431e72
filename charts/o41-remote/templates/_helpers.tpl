{{- define "o41remote.name" -}}{{ printf "%s-o41-remote" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end }}
{{- define "o41remote.labels" -}}
app.kubernetes.io/name: o41-remote
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: o41-artifacts
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

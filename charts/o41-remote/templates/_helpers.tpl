{{- define "o41remote.name" -}}{{ printf "%s-o41-remote" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end }}
{{- define "o41remote.labels" -}}
app.kubernetes.io/name: o41-remote
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: o41-artifacts
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}
{{- /* The collections tier (collections.enabled): its objects carry a component label. */}}
{{- define "o41remote.tier" -}}{{ include "o41remote.name" . | trunc 51 | trimSuffix "-" }}-collections{{- end }}
{{- define "o41remote.etcd" -}}{{ include "o41remote.name" . | trunc 50 | trimSuffix "-" }}-etcd{{- end }}
{{- define "o41remote.selectorLabels" -}}
app.kubernetes.io/name: o41-remote
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- define "o41remote.componentLabels" -}}
{{ include "o41remote.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- /* The URL pods of this cluster call for their collections (O41_COLLECTIONS_ENDPOINT). */}}
{{- define "o41remote.collectionsEndpoint" -}}
{{- printf "http://%s.%s.svc:8080" (include "o41remote.tier" .) .Release.Namespace }}
{{- end }}
{{- /* The etcd members' client URLs, as the tier's --etcd. */}}
{{- define "o41remote.etcdEndpoints" -}}
{{- $etcd := include "o41remote.etcd" . }}
{{- $urls := list }}
{{- range $i := until (int .Values.collections.etcd.replicas) }}
{{- $urls = append $urls (printf "https://%s-%d.%s.%s.svc:2379" $etcd $i $etcd $.Release.Namespace) }}
{{- end }}
{{- join "," $urls }}
{{- end }}
{{- /* The members' DNS names (each form, and the wildcards), as the hub chart's o41.etcdNames:
       etcd checks that a peer's certificate names the address it connects from. */}}
{{- define "o41remote.etcdNames" -}}
{{- $etcd := include "o41remote.etcd" . }}
{{- $ns := .Release.Namespace }}
{{- $names := list }}
{{- range $i := until (int .Values.collections.etcd.replicas) }}
{{- $pod := printf "%s-%d" $etcd $i }}
{{- $names = concat $names (list (printf "%s.%s" $pod $etcd) (printf "%s.%s.%s" $pod $etcd $ns) (printf "%s.%s.%s.svc" $pod $etcd $ns) (printf "%s.%s.%s.svc.cluster.local" $pod $etcd $ns)) }}
{{- end }}
{{- $names = concat $names (list (printf "*.%s" $etcd) (printf "*.%s.%s" $etcd $ns) (printf "*.%s.%s.svc" $etcd $ns) (printf "*.%s.%s.svc.cluster.local" $etcd $ns)) }}
{{- toJson $names }}
{{- end }}
{{- /* Images as the hub chart makes them: repository@digest, else repository:tag; a
       global.imageRegistry (an umbrella's mirror) replaces the repository's registry host. */}}
{{- define "o41remote.image" -}}
{{- $repository := .image.repository }}
{{- with .registry }}
{{- $parts := splitList "/" $repository }}
{{- $first := first $parts }}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) (join "/" (rest $parts)) }}
{{- else }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}
{{- end }}
{{- end }}
{{- if .image.digest }}{{ printf "%s@%s" $repository .image.digest }}{{ else }}{{ printf "%s:%s" $repository .tag }}{{ end }}
{{- end }}
{{- define "o41remote.imagePullSecrets" -}}
{{- $names := list }}
{{- range (concat (((.Values.global).imagePullSecrets) | default list) (.Values.imagePullSecrets | default list)) }}
{{- $name := . }}
{{- if kindIs "map" . }}{{ $name = .name }}{{ end }}
{{- if not (has $name $names) }}{{ $names = append $names $name }}{{ end }}
{{- end }}
{{- if $names }}
imagePullSecrets:
{{- range $names }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end }}
{{- /* A preferred podAntiAffinity on the hostname for a component's pods, unless affinity is given. */}}
{{- define "o41remote.affinity" -}}
affinity:
{{- if .affinity }}
  {{- toYaml .affinity | nindent 2 }}
{{- else }}
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "o41remote.selectorLabels" (dict "ctx" .ctx "component" .component) | nindent 14 }}
{{- end }}
{{- end }}

{{/* Name of the chart, or its override. */}}
{{- define "o41.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Prefix of every object's name: fullnameOverride; else the release's name when it
contains the chart's (helm create's rule: release o41-artifacts gives o41-artifacts), the
chart's name when it starts with the release's (release o41 gives o41-artifacts, not
o41-artifacts), else <release>-o41-artifacts. */}}
{{- define "o41.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else if hasPrefix (printf "%s-" .Release.Name) $name }}
{{- $name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "o41.operator" -}}{{ include "o41.fullname" . | trunc 54 | trimSuffix "-" }}-operator{{- end }}
{{- define "o41.placement" -}}{{ include "o41.fullname" . | trunc 53 | trimSuffix "-" }}-placement{{- end }}
{{- define "o41.etcd" -}}{{ include "o41.fullname" . | trunc 50 | trimSuffix "-" }}-etcd{{- end }}
{{- define "o41.collectionsEtcd" -}}{{ include "o41.fullname" . | trunc 38 | trimSuffix "-" }}-collections-etcd{{- end }}
{{- define "o41.webhookTLS" -}}{{ include "o41.fullname" . | trunc 49 | trimSuffix "-" }}-webhook-tls{{- end }}
{{- define "o41.webhookConfig" -}}{{ include "o41.fullname" . }}.artifacts.o41.io{{- end }}

{{/* Labels on every object. */}}
{{- define "o41.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "o41.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: o41-artifacts
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Selector labels of one component: pass (dict "ctx" $ "component" "operator"). */}}
{{- define "o41.selectorLabels" -}}
app.kubernetes.io/name: {{ include "o41.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "o41.componentLabels" -}}
{{ include "o41.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The product's image: repository@digest when image.digest is set (the tag is then
ignored: a digest names one image), else repository:tag (default: the chart's appVersion). */}}
{{- define "o41.image" -}}
{{- include "o41.imageRef" (dict "image" .Values.image "tag" (default .Chart.AppVersion .Values.image.tag) "registry" ((.Values.global).imageRegistry)) }}
{{- end }}

{{/* etcd's image, the same way: repository@digest, else repository:tag. */}}
{{- define "o41.etcdImage" -}}
{{- include "o41.imageRef" (dict "image" .Values.etcd.image "tag" .Values.etcd.image.tag "registry" ((.Values.global).imageRegistry)) }}
{{- end }}

{{- define "o41.imageRef" -}}
{{- $repository := include "o41.repository" (dict "repository" .image.repository "registry" .registry) }}
{{- if .image.digest }}
{{- printf "%s@%s" $repository .image.digest }}
{{- else }}
{{- printf "%s:%s" $repository .tag }}
{{- end }}
{{- end }}

{{/* A repository moved to global.imageRegistry (a mirror) when an umbrella chart sets it:
the repository's own registry host (its first part, when that has a dot or a port, or is
localhost) is replaced, else the registry is put in front: ghcr.io/o41/o41-artifacts and
o41/o41-artifacts both become <registry>/o41/o41-artifacts. */}}
{{- define "o41.repository" -}}
{{- if .registry }}
{{- $parts := splitList "/" .repository }}
{{- $first := first $parts }}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) }}
{{- printf "%s/%s" (trimSuffix "/" .registry) (join "/" (rest $parts)) }}
{{- else }}
{{- printf "%s/%s" (trimSuffix "/" .registry) .repository }}
{{- end }}
{{- else }}
{{- .repository }}
{{- end }}
{{- end }}

{{/* The pods' imagePullSecrets: global.imagePullSecrets (names or {name: ...}) and
imagePullSecrets, each name once. */}}
{{- define "o41.imagePullSecrets" -}}
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

{{/* etcd client URLs the placement service uses, comma-separated. */}}
{{- define "o41.etcdEndpoints" -}}
{{- if .Values.etcd.external.endpoints }}
{{- join "," .Values.etcd.external.endpoints }}
{{- else }}
{{- $etcd := include "o41.etcd" . }}
{{- $urls := list }}
{{- range $i := until (int .Values.etcd.replicas) }}
{{- $urls = append $urls (printf "%s://%s-%d.%s.%s.svc:2379" (include "o41.etcdScheme" $) $etcd $i $etcd $.Release.Namespace) }}
{{- end }}
{{- join "," $urls }}
{{- end }}
{{- end }}

{{/* TLS to an external etcd needs https:// endpoints: say so at install, not as a
crash-looping pod. */}}
{{- define "o41.etcdTlsChecked" -}}
{{- if .Values.etcd.external.tls.secretName }}
{{- if not .Values.etcd.external.endpoints }}
{{- fail "etcd.external.tls.secretName is TLS to an existing etcd: give its https:// URLs in etcd.external.endpoints" }}
{{- end }}
{{- range .Values.etcd.external.endpoints }}
{{- if not (hasPrefix "https://" .) }}
{{- fail (printf "etcd.external.tls.secretName is set, so each of etcd.external.endpoints must be https://, not %s" .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when the chart deploys its own etcd with TLS (etcd.tls.enabled). */}}
{{- define "o41.etcdTLS" -}}
{{- if and (not .Values.etcd.external.endpoints) .Values.etcd.tls.enabled }}true{{ end }}
{{- end }}

{{/* The scheme of the chart's own etcd's client and peer URLs. */}}
{{- define "o41.etcdScheme" -}}
{{- if include "o41.etcdTLS" . }}https{{ else }}http{{ end }}
{{- end }}

{{/* The Secrets of the chart's etcd TLS, each in a cert-manager Certificate's layout
(ca.crt, tls.crt, tls.key): the members' serving certificate for clients (ca.crt: the CA
that signs client certificates), their peer certificate (ca.crt: the peers' CA), and the
placement service's client certificate (ca.crt: the CA that signed the serving one). */}}
{{- define "o41.etcdServerTLS" -}}{{ include "o41.etcd" . }}-server-tls{{- end }}
{{- define "o41.etcdPeerTLS" -}}{{ include "o41.etcd" . }}-peer-tls{{- end }}
{{- define "o41.etcdClientTLS" -}}{{ include "o41.etcd" . }}-client-tls{{- end }}
{{/* The common name every peer certificate has, and the only one a member lets in on its
peer port (--peer-cert-allowed-cn): a client certificate of the same CA is no peer's. */}}
{{- define "o41.etcdPeerCN" -}}{{ include "o41.etcd" . }}-peer{{- end }}

{{/* The DNS names of the etcd members through the headless Service, as a JSON list: each
member's <pod>.<svc>.<ns>.svc, its short and long forms, and the wildcards of each form.
etcd checks that a peer's certificate names resolve to the address it connects from (a
forward lookup of each name, a reverse lookup against the wildcards), so each member is
named. */}}
{{- define "o41.etcdNames" -}}
{{- include "o41.etcdNamesOf" (dict "ctx" . "name" (include "o41.etcd" .)) }}
{{- end }}
{{- define "o41.etcdNamesOf" -}}
{{- $etcd := .name }}
{{- $ns := .ctx.Release.Namespace }}
{{- $names := list }}
{{- range $i := until (int .ctx.Values.etcd.replicas) }}
{{- $pod := printf "%s-%d" $etcd $i }}
{{- $names = concat $names (list (printf "%s.%s" $pod $etcd) (printf "%s.%s.%s" $pod $etcd $ns) (printf "%s.%s.%s.svc" $pod $etcd $ns) (printf "%s.%s.%s.svc.cluster.local" $pod $etcd $ns)) }}
{{- end }}
{{- $names = concat $names (list (printf "*.%s" $etcd) (printf "*.%s.%s" $etcd $ns) (printf "*.%s.%s.svc" $etcd $ns) (printf "*.%s.%s.svc.cluster.local" $etcd $ns)) }}
{{- toJson $names }}
{{- end }}

{{/* The collections' own etcd (collections.etcd.enabled): its client URLs, the service's
--collections-etcd. */}}
{{- define "o41.collectionsEtcdEndpoints" -}}
{{- $etcd := include "o41.collectionsEtcd" . }}
{{- $urls := list }}
{{- range $i := until (int .Values.etcd.replicas) }}
{{- $urls = append $urls (printf "%s://%s-%d.%s.%s.svc:2379" (include "o41.etcdScheme" $) $etcd $i $etcd $.Release.Namespace) }}
{{- end }}
{{- join "," $urls }}
{{- end }}

{{/* The container securityContext of every container the chart runs (containerSecurityContext). */}}
{{- define "o41.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext }}
{{- end }}

{{/* The pods' securityContext (podSecurityContext): its runAsUser, runAsGroup and fsGroup
can be unset (null) where the platform assigns them, as OpenShift's restricted SCC does. */}}
{{- define "o41.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext }}
{{- end }}

{{/* A component's ServiceAccount: serviceAccounts.<component>.name, else the component's
name. Pass (dict "ctx" $ "component" "operator"). */}}
{{- define "o41.serviceAccountName" -}}
{{- $sa := index .ctx.Values.serviceAccounts .component }}
{{- default (include (printf "o41.%s" .component) .ctx) $sa.name }}
{{- end }}

{{/* A component's topologySpreadConstraints, each given the component's pods as its
labelSelector when it names none. Pass (dict "ctx" $ "component" "etcd" "constraints" list). */}}
{{- define "o41.spread" -}}
{{- $out := list }}
{{- range .constraints }}
{{- $c := deepCopy . }}
{{- if not $c.labelSelector }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (include "o41.selectorLabels" (dict "ctx" $.ctx "component" $.component) | fromYaml)) }}
{{- end }}
{{- $out = append $out $c }}
{{- end }}
{{- if $out }}
topologySpreadConstraints:
  {{- toYaml $out | nindent 2 }}
{{- end }}
{{- end }}

{{/* Where both servers may fetch TrustDomains' keys from, and this cluster's own issuer. */}}
{{- define "o41.trustEnv" -}}
{{- with .Values.trustDomains.allowedNetworks }}
- name: O41_TRUST_ALLOWED_NETWORKS
  value: {{ join "," . | quote }}
{{- end }}
{{- with .Values.trustDomains.ownIssuer }}
- name: O41_OWN_ISSUER
  value: {{ . | quote }}
{{- end }}
{{- end }}

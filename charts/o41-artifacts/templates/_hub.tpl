{{/* The placement service reached from outside the cluster (docs/chart.md, "Reaching the
service from outside"; docs/multi-cluster.md, "Reaching the hub"). */}}

{{/* "true" when the service serves HTTPS on its own port. */}}
{{- define "o41.placementTLS" -}}
{{- if .Values.placement.tls.enabled }}true{{ end }}
{{- end }}

{{/* "true" when the Service itself takes traffic from outside (NodePort, LoadBalancer). */}}
{{- define "o41.placementServiceExposed" -}}
{{- if has .Values.placement.service.type (list "NodePort" "LoadBalancer") }}true{{ end }}
{{- end }}

{{/* "true" when anything routes outside traffic to the API port. */}}
{{- define "o41.placementExposed" -}}
{{- if or (include "o41.placementServiceExposed" .) .Values.placement.ingress.enabled .Values.placement.httpRoute.enabled }}true{{ end }}
{{- end }}

{{- define "o41.placementTlsSecret" -}}{{ include "o41.placement" . }}-tls{{- end }}
{{- define "o41.placementCaSecret" -}}{{ include "o41.placement" . }}-tls-ca{{- end }}
{{- define "o41.placementCaConfigMap" -}}{{ include "o41.placement" . }}-ca{{- end }}

{{/* externalURL's host without its port; empty without externalURL. */}}
{{- define "o41.placementExternalHost" -}}
{{- with .Values.placement.externalURL }}{{ (urlParse .).hostname }}{{ end }}
{{- end }}

{{/* The serving certificate's names as JSON {"dns": [...], "ips": [...]}: the Service's
four in-cluster forms and externalURL's host (a name, or an address). */}}
{{- define "o41.placementNames" -}}
{{- $svc := include "o41.placement" . }}
{{- $ns := .Release.Namespace }}
{{- $dns := list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.cluster.local" $svc $ns) }}
{{- $ips := list }}
{{- $host := include "o41.placementExternalHost" . }}
{{- if $host }}
{{- if regexMatch "^[0-9.]+$|:" $host }}
{{- $ips = append $ips $host }}
{{- else if not (has $host $dns) }}
{{- $dns = append $dns $host }}
{{- end }}
{{- end }}
{{- dict "dns" $dns "ips" $ips | toJson }}
{{- end }}

{{/* The in-cluster endpoint pods use. */}}
{{- define "o41.placementEndpoint" -}}
{{- printf "%s://%s.%s.svc:%v" (ternary "https" "http" (eq (include "o41.placementTLS" .) "true")) (include "o41.placement" .) .Release.Namespace .Values.placement.service.port }}
{{- end }}

{{/* Refusals of values that cannot work, each saying what to set. */}}
{{- define "o41.placementExposureChecked" -}}
{{- $p := .Values.placement }}
{{- if and (include "o41.placementServiceExposed" .) (not $p.tls.enabled) }}
{{- fail (printf "placement.service.type=%s exposes the API port outside the cluster, where every request carries a bearer token: set placement.tls.enabled=true (or keep ClusterIP and use placement.ingress or placement.httpRoute with TLS)" $p.service.type) }}
{{- end }}
{{- if and $p.service.nodePort (eq $p.service.type "ClusterIP") }}
{{- fail "placement.service.nodePort is set but placement.service.type is ClusterIP: set type NodePort (or LoadBalancer), or nodePort 0" }}
{{- end }}
{{- if and $p.service.loadBalancerSourceRanges (ne $p.service.type "LoadBalancer") }}
{{- fail "placement.service.loadBalancerSourceRanges is set but placement.service.type is not LoadBalancer: set type LoadBalancer, or remove the ranges" }}
{{- end }}
{{- if and $p.ingress.enabled (not $p.ingress.host) }}
{{- fail "placement.ingress.enabled needs placement.ingress.host, the host clients use (e.g. o41.example.com)" }}
{{- end }}
{{- if and $p.httpRoute.enabled (not $p.httpRoute.parentRefs) }}
{{- fail "placement.httpRoute.enabled needs placement.httpRoute.parentRefs: the Gateway (and listener) to attach to, e.g. [{name: public, namespace: gateways}]" }}
{{- end }}
{{- if and $p.tls.certManager.issuerRef.name (not $p.tls.enabled) }}
{{- fail "placement.tls.certManager.issuerRef is set but placement.tls.enabled is false: set placement.tls.enabled=true, or remove the issuerRef" }}
{{- end }}
{{- if and $p.tls.certManager.caBundle (not $p.tls.certManager.issuerRef.name) }}
{{- fail "placement.tls.certManager.caBundle is set without placement.tls.certManager.issuerRef.name: the chart's own CA publishes its bundle itself; name your issuer, or remove caBundle" }}
{{- end }}
{{- end }}

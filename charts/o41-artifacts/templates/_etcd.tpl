{{- /* One etcd cluster of the chart: its headless Service, StatefulSet and PDB. The state
store's (component etcd), and with collections.etcd.enabled the collections' own (component
collections-etcd), both of etcd.*'s settings. Pass (dict "ctx" $ "name" <name> "component"
<component> "serverSecret" <Secret> "peerSecret" <Secret> "peerCN" <CN>). */}}
{{- define "o41.etcdCluster" -}}
{{- $ctx := .ctx }}
{{- $name := .name }}
{{- $component := .component }}
{{- $serverSecret := .serverSecret }}
{{- $peerSecret := .peerSecret }}
{{- $peerCN := .peerCN }}
{{- $ns := $ctx.Release.Namespace }}
{{- $tls := include "o41.etcdTLS" $ctx }}
{{- $scheme := include "o41.etcdScheme" $ctx }}
{{- $peers := list }}
{{- range $i := until (int $ctx.Values.etcd.replicas) }}
{{- $peers = append $peers (printf "%s-%d=%s://%s-%d.%s.%s.svc:2380" $name $i $scheme $name $i $name $ns) }}
{{- end }}
# Headless: each member's stable DNS name (<pod>.<service>.<namespace>.svc). Not-ready
# addresses are published so the members find each other while the cluster forms.
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  namespace: {{ $ns }}
  labels:
    {{- include "o41.componentLabels" (dict "ctx" $ctx "component" $component) | nindent 4 }}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector:
    {{- include "o41.selectorLabels" (dict "ctx" $ctx "component" $component) | nindent 4 }}
  ports:
    - name: client
      port: 2379
      targetPort: client
    - name: peer
      port: 2380
      targetPort: peer
    - name: metrics
      port: 2381
      targetPort: metrics
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: {{ $name }}
  namespace: {{ $ns }}
  labels:
    {{- include "o41.componentLabels" (dict "ctx" $ctx "component" $component) | nindent 4 }}
spec:
  serviceName: {{ $name }}
  replicas: {{ $ctx.Values.etcd.replicas }}
  # the initial cluster needs its members up together: start them in parallel
  podManagementPolicy: Parallel
  updateStrategy:
    type: RollingUpdate
  selector:
    matchLabels:
      {{- include "o41.selectorLabels" (dict "ctx" $ctx "component" $component) | nindent 6 }}
  template:
    metadata:
      labels:
        {{- include "o41.selectorLabels" (dict "ctx" $ctx "component" $component) | nindent 8 }}
      {{- with $ctx.Values.etcd.podAnnotations }}
      annotations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
    spec:
      serviceAccountName: {{ include "o41.serviceAccountName" (dict "ctx" $ctx "component" "etcd") }}
      automountServiceAccountToken: false
      {{- with include "o41.imagePullSecrets" $ctx }}
      {{- . | nindent 6 }}
      {{- end }}
      {{- with $ctx.Values.etcd.priorityClassName }}
      priorityClassName: {{ . }}
      {{- end }}
      securityContext:
        {{- include "o41.podSecurityContext" $ctx | nindent 8 }}
      containers:
        - name: etcd
          image: {{ include "o41.etcdImage" $ctx }}
          imagePullPolicy: {{ $ctx.Values.etcd.image.pullPolicy }}
          command: ["/usr/local/bin/etcd"]
          args:
            - --name=$(POD_NAME)
            - --data-dir=/var/lib/etcd/data
            - --listen-client-urls={{ $scheme }}://0.0.0.0:2379
            - --advertise-client-urls={{ $scheme }}://$(POD_NAME).{{ $name }}.{{ $ns }}.svc:2379
            - --listen-peer-urls={{ $scheme }}://0.0.0.0:2380
            - --initial-advertise-peer-urls={{ $scheme }}://$(POD_NAME).{{ $name }}.{{ $ns }}.svc:2380
            - --initial-cluster={{ join "," $peers }}
            - --initial-cluster-state=new
            - --initial-cluster-token={{ $name }}
            # plain HTTP on a port of its own: /metrics and the probes' /readyz, /livez need
            # no client certificate (and say nothing of the data)
            - --listen-metrics-urls=http://0.0.0.0:2381
            - --quota-backend-bytes={{ int64 $ctx.Values.etcd.quotaBackendBytes }}
            - --auto-compaction-mode=periodic
            - --auto-compaction-retention={{ $ctx.Values.etcd.autoCompactionRetention }}
            {{- if $tls }}
            # clients: only with a certificate of the clients' CA (the placement service's)
            - --client-cert-auth
            - --trusted-ca-file=/etc/etcd/tls/server/ca.crt
            - --cert-file=/etc/etcd/tls/server/tls.crt
            - --key-file=/etc/etcd/tls/server/tls.key
            # peers: only with a certificate of the peers' CA, named as a peer
            - --peer-client-cert-auth
            - --peer-trusted-ca-file=/etc/etcd/tls/peer/ca.crt
            - --peer-cert-file=/etc/etcd/tls/peer/tls.crt
            - --peer-key-file=/etc/etcd/tls/peer/tls.key
            - --peer-cert-allowed-cn={{ $peerCN }}
            {{- end }}
            {{- range $ctx.Values.etcd.extraArgs }}
            - {{ . | quote }}
            {{- end }}
          env:
            - name: POD_NAME
              valueFrom:
                fieldRef:
                  fieldPath: metadata.name
            - name: GOMAXPROCS
              value: "2"
          ports:
            - name: client
              containerPort: 2379
            - name: peer
              containerPort: 2380
            - name: metrics
              containerPort: 2381
          readinessProbe:
            httpGet:
              path: /readyz
              port: metrics
            {{- toYaml $ctx.Values.etcd.readinessProbe | nindent 12 }}
          livenessProbe:
            httpGet:
              path: /livez
              port: metrics
            {{- toYaml $ctx.Values.etcd.livenessProbe | nindent 12 }}
          resources:
            {{- toYaml $ctx.Values.etcd.resources | nindent 12 }}
          securityContext:
            {{- include "o41.containerSecurityContext" $ctx | nindent 12 }}
          volumeMounts:
            - name: data
              mountPath: /var/lib/etcd
            {{- if $tls }}
            - name: tls-server
              mountPath: /etc/etcd/tls/server
              readOnly: true
            - name: tls-peer
              mountPath: /etc/etcd/tls/peer
              readOnly: true
            {{- end }}
            {{- with $ctx.Values.etcd.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      {{- if or (not $ctx.Values.etcd.persistence.enabled) $tls $ctx.Values.etcd.extraVolumes }}
      volumes:
        {{- if not $ctx.Values.etcd.persistence.enabled }}
        - name: data
          emptyDir: {}
        {{- end }}
        {{- if $tls }}
        - name: tls-server
          secret:
            secretName: {{ $serverSecret }}
            defaultMode: 0440  # the pod's fsGroup reads it, nobody else
        - name: tls-peer
          secret:
            secretName: {{ $peerSecret }}
            defaultMode: 0440
        {{- end }}
        {{- with $ctx.Values.etcd.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
      affinity:
        {{- if $ctx.Values.etcd.affinity }}
        {{- toYaml $ctx.Values.etcd.affinity | nindent 8 }}
        {{- else }}
        # members on different nodes where the cluster has enough of them
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    {{- include "o41.selectorLabels" (dict "ctx" $ctx "component" $component) | nindent 20 }}
        {{- end }}
      {{- with $ctx.Values.etcd.nodeSelector }}
      nodeSelector:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with $ctx.Values.etcd.tolerations }}
      tolerations:
        {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with include "o41.spread" (dict "ctx" $ctx "component" $component "constraints" $ctx.Values.etcd.topologySpreadConstraints) }}
      {{- . | nindent 6 }}
      {{- end }}
  {{- if $ctx.Values.etcd.persistence.enabled }}
  volumeClaimTemplates:
    - apiVersion: v1
      kind: PersistentVolumeClaim
      metadata:
        name: data
      spec:
        accessModes: ["ReadWriteOnce"]
        {{- with $ctx.Values.etcd.persistence.storageClass }}
        storageClassName: {{ . | quote }}
        {{- end }}
        resources:
          requests:
            storage: {{ $ctx.Values.etcd.persistence.size }}
  {{- end }}
{{- if $ctx.Values.etcd.pdb.enabled }}
---
# Keep a majority: at most one member down at a time by a voluntary disruption.
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  namespace: {{ $ns }}
  labels:
    {{- include "o41.componentLabels" (dict "ctx" $ctx "component" $component) | nindent 4 }}
spec:
  maxUnavailable: {{ $ctx.Values.etcd.pdb.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "o41.selectorLabels" (dict "ctx" $ctx "component" $component) | nindent 6 }}
{{- end }}
{{- end }}

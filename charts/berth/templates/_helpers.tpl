{{/* Chart name. */}}
{{- define "berth.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name (release-chart, or release when it already contains the chart name). */}}
{{- define "berth.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "berth.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Common labels. */}}
{{- define "berth.labels" -}}
helm.sh/chart: {{ include "berth.chart" . }}
{{ include "berth.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels (component is added per workload). */}}
{{- define "berth.selectorLabels" -}}
app.kubernetes.io/name: {{ include "berth.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "berth.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "berth.workerFullname" -}}
{{- printf "%s-worker" (include "berth.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "berth.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Pod-level settings of the API and migration pods: the operator's ServiceAccount (IRSA,
     workload identity), never the workers' (worker-serviceaccount.yaml). */}}
{{- define "berth.podCommon" -}}
{{- include "berth.imagePullSecrets" . }}
{{- if .Values.serviceAccountName }}
serviceAccountName: {{ .Values.serviceAccountName }}
{{- end }}
automountServiceAccountToken: false
{{- end -}}

{{/* Labels selecting the API pods (Services, NetworkPolicies). */}}
{{- define "berth.apiSelectorLabels" -}}
{{ include "berth.selectorLabels" . }}
app.kubernetes.io/component: api
{{- end -}}

{{/* Labels selecting the worker pods. */}}
{{- define "berth.workerSelectorLabels" -}}
{{ include "berth.selectorLabels" . }}
app.kubernetes.io/component: worker
{{- end -}}

{{/* DATABASE_URL from the referenced Secret (required). */}}
{{- define "berth.databaseEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ required "database.existingSecret is required (name of a Secret holding DATABASE_URL)" .Values.database.existingSecret }}
      key: {{ .Values.database.existingSecretKey }}
{{- end -}}

{{/* Environment of `berth serve` and `berth migrate`. */}}
{{- define "berth.serverEnv" -}}
{{ include "berth.databaseEnv" . }}
- name: BERTH_DATA_DIR
  value: /var/lib/berth
- name: BERTH_DB_POOL_SIZE
  value: {{ .Values.database.poolSize | quote }}
# A floor under the URL's own sslmode: the stricter of the two applies.
- name: BERTH_DB_SSLMODE
  value: {{ .Values.database.sslmode | quote }}
{{- if .Values.database.caSecret }}
- name: BERTH_DB_CA_FILE
  value: /etc/berth/db-ca/{{ .Values.database.caSecretKey }}
{{- end }}
{{- with .Values.logFormat }}
- name: BERTH_LOG_FORMAT
  value: {{ . | quote }}
{{- end }}
- name: BERTH_LISTEN
  value: "0.0.0.0:{{ .Values.api.port }}"
- name: BERTH_METRICS_LISTEN
  value: "0.0.0.0:{{ .Values.api.metricsPort }}"
- name: BERTH_OBJECT_STORE
  value: {{ .Values.objectStore.url | quote }}
- name: BERTH_ALLOWED_ORIGINS
  value: {{ .Values.allowedOrigins | quote }}
{{- if .Values.jwt.existingSecret }}
- name: BERTH_JWT_SECRET_FILE
  value: /etc/berth/jwt/{{ .Values.jwt.existingSecretKey }}
{{- end }}
- name: BERTH_MODEL_BASE_URL
  value: {{ .Values.model.baseUrl | quote }}
- name: BERTH_MODEL
  value: {{ .Values.model.name | quote }}
{{- if .Values.model.existingSecret }}
- name: BERTH_MODEL_API_KEY
  valueFrom:
    secretKeyRef:
      name: {{ .Values.model.existingSecret }}
      key: {{ .Values.model.existingSecretKey }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "berth.serverEnvFrom" -}}
{{- if .Values.objectStore.existingSecret }}
envFrom:
  - secretRef:
      name: {{ .Values.objectStore.existingSecret }}
{{- end }}
{{- end -}}

{{/* Volumes shared by `berth serve` and `berth migrate`. */}}
{{- define "berth.serverVolumes" -}}
- name: data
  emptyDir:
    sizeLimit: {{ .Values.api.dataDir.sizeLimit }}
- name: tmp
  emptyDir: {}
{{- if .Values.jwt.existingSecret }}
- name: jwt
  secret:
    secretName: {{ .Values.jwt.existingSecret }}
    defaultMode: 0400
    items:
      - key: {{ .Values.jwt.existingSecretKey }}
        path: {{ .Values.jwt.existingSecretKey }}
{{- end }}
{{- if .Values.database.caSecret }}
- name: db-ca
  secret:
    secretName: {{ .Values.database.caSecret }}
    items:
      - key: {{ .Values.database.caSecretKey }}
        path: {{ .Values.database.caSecretKey }}
{{- end }}
{{- end -}}

{{- define "berth.serverVolumeMounts" -}}
- name: data
  mountPath: /var/lib/berth
- name: tmp
  mountPath: /tmp
{{- if .Values.jwt.existingSecret }}
- name: jwt
  mountPath: /etc/berth/jwt
  readOnly: true
{{- end }}
{{- if .Values.database.caSecret }}
- name: db-ca
  mountPath: /etc/berth/db-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* Can more than one API pod run at once (several replicas, or an autoscaler that may add them)? */}}
{{- define "berth.multiReplica" -}}
{{- if .Values.api.autoscaling.enabled -}}
{{- if gt (int .Values.api.autoscaling.maxReplicas) 1 }}true{{ end -}}
{{- else if gt (int .Values.api.replicaCount) 1 -}}
true
{{- end -}}
{{- end -}}

{{/* The fewest API pods that run outside a rollout: the autoscaler's floor, or replicaCount. */}}
{{- define "berth.minReplicas" -}}
{{- ternary .Values.api.autoscaling.minReplicas .Values.api.replicaCount .Values.api.autoscaling.enabled | int -}}
{{- end -}}

{{/* Is the PodDisruptionBudget rendered? Only when at least two API pods always run: with one,
     any budget that protects it (minAvailable: 1) blocks every node drain, and one that lets
     it go protects nothing. */}}
{{- define "berth.pdbEnabled" -}}
{{- if and .Values.api.pdb.enabled (gt (int (include "berth.minReplicas" .)) 1) }}true{{ end -}}
{{- end -}}

{{/* Combinations that render fine but break at run time: refuse them at install. */}}
{{- define "berth.checkValues" -}}
{{- if and (include "berth.multiReplica" .) (not .Values.jwt.existingSecret) -}}
{{- fail "jwt.existingSecret is required when more than one API replica can run (api.replicaCount > 1 or autoscaling): without a shared signing key each pod generates its own, and a login made on one replica is refused by the others. kubectl create secret generic berth-jwt --from-literal=jwt-secret=\"$(openssl rand -base64 48)\"" -}}
{{- end -}}
{{- if and (include "berth.multiReplica" .) (hasPrefix "file:" .Values.objectStore.url) -}}
{{- fail "objectStore.url is a file:// URL, which is private to each pod: with more than one API replica use shared object storage (s3://bucket/prefix)" -}}
{{- end -}}
{{- if ge (int .Values.api.preStopDelaySeconds) (int .Values.api.terminationGracePeriodSeconds) -}}
{{- fail "api.preStopDelaySeconds must be shorter than api.terminationGracePeriodSeconds (the drain after SIGTERM needs the rest of the grace period)" -}}
{{- end -}}
{{- $pods := ternary .Values.api.autoscaling.maxReplicas .Values.api.replicaCount .Values.api.autoscaling.enabled | int -}}
{{- $needed := add 1 (mul (add1 $pods) (add 2 (int .Values.database.poolSize))) -}}
{{- if gt (int $needed) (int .Values.database.connectionLimit) -}}
{{- fail (printf "the API tier may open %d database connections ((%d pods + 1 surge) × (database.poolSize %d + 1 LISTEN + 1 readiness probe) + 1 migration Job), more than database.connectionLimit %d: lower database.poolSize or the replica count, or raise PostgreSQL's max_connections and database.connectionLimit with it" (int $needed) $pods (int .Values.database.poolSize) (int .Values.database.connectionLimit)) -}}
{{- end -}}
{{- $_ := required "database.existingSecret is required (name of a Secret holding DATABASE_URL)" .Values.database.existingSecret -}}
{{- if and (not .Values.database.caSecret) (not .Values.database.allowUnverifiedTls) -}}
{{- fail "database.caSecret is empty: Berth would not verify the PostgreSQL server's certificate, and sslmode=require without a CA encrypts but does not authenticate the server (an active attacker in the path can impersonate it). Put the CA that signed the server's certificate in a Secret and name it: kubectl create secret generic berth-db-ca --from-file=ca.crt=./db-ca.pem; database.caSecret=berth-db-ca. To connect without verifying anyway, set database.allowUnverifiedTls=true" -}}
{{- end -}}
{{- if eq (int .Values.api.port) (int .Values.api.metricsPort) -}}
{{- fail (printf "api.port and api.metricsPort are both %d: the metrics listener must have a port of its own, or /metrics would be served on the public port, behind the Service and the Ingress" (int .Values.api.port)) -}}
{{- end -}}
{{- $ports := list (int .Values.api.port) (int .Values.api.metricsPort) (int .Values.api.internalPort) -}}
{{- if ne (len (uniq $ports)) 3 -}}
{{- fail (printf "api.port (%d), api.metricsPort (%d) and api.internalPort (%d) must be three different ports: the internal and metrics listeners must not share the public one" (int .Values.api.port) (int .Values.api.metricsPort) (int .Values.api.internalPort)) -}}
{{- end -}}
{{- $hpa := .Values.api.autoscaling -}}
{{- if and $hpa.enabled (gt (int $hpa.minReplicas) (int $hpa.maxReplicas)) -}}
{{- fail (printf "api.autoscaling.minReplicas (%d) is greater than api.autoscaling.maxReplicas (%d): Kubernetes rejects such a HorizontalPodAutoscaler" (int $hpa.minReplicas) (int $hpa.maxReplicas)) -}}
{{- end -}}
{{- range .Values.extraEnv -}}
{{- if eq .name "BERTH_TRUSTED_PROXIES" -}}
{{- fail "extraEnv sets BERTH_TRUSTED_PROXIES: set the trustedProxies value instead (a list of CIDRs), which the chart renders as BERTH_TRUSTED_PROXIES and checks against the Ingress" -}}
{{- end -}}
{{- end -}}
{{- if and .Values.ingress.enabled (not .Values.trustedProxies) -}}
{{- fail "trustedProxies is empty while the Ingress is enabled: behind the ingress controller every request comes from its pods, and Berth takes the client's address from X-Forwarded-For only when the peer is a trusted proxy. Without it the login rate limits and the per-address connection limits count all clients as one address (the controller's), so one client can lock everyone out, and logs show the controller's address. Set trustedProxies to the ingress controller pods' addresses, e.g. the cluster's pod CIDR: trustedProxies: [10.244.0.0/16]" -}}
{{- end -}}
{{- range .Values.trustedProxies -}}
{{- if or (hasSuffix "/0" .) (eq . "0.0.0.0") (eq . "::") -}}
{{- fail (printf "trustedProxies holds %s, which trusts every address: any client could then name its own address in X-Forwarded-For and escape the login rate limits. List the proxies' own networks" .) -}}
{{- end -}}
{{- end -}}
{{- if include "berth.pdbEnabled" . -}}
{{- $min := int (include "berth.minReplicas" .) -}}
{{- $pdb := .Values.api.pdb -}}
{{- if hasKey $pdb "maxUnavailable" -}}
{{- if has (toString $pdb.maxUnavailable) (list "0" "0%") -}}
{{- fail "api.pdb.maxUnavailable is 0: no API pod could ever be evicted, so every node drain would wait forever. Use 1 (or leave it unset for minAvailable)" -}}
{{- end -}}
{{- else -}}
{{- $minAvailable := $pdb.minAvailable | default 1 -}}
{{- if kindIs "string" $minAvailable -}}
{{- if eq $minAvailable "100%" -}}
{{- fail "api.pdb.minAvailable is 100%: no API pod could ever be evicted, so every node drain would wait forever. Lower it, or set api.pdb.maxUnavailable" -}}
{{- end -}}
{{- else if ge (int $minAvailable) $min -}}
{{- fail (printf "api.pdb.minAvailable (%d) is not below the fewest API replicas (%d, %s): no API pod could ever be evicted, so every node drain would wait forever. Lower it, or set api.pdb.maxUnavailable" (int $minAvailable) $min (ternary "api.autoscaling.minReplicas" "api.replicaCount" .Values.api.autoscaling.enabled)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.worker.enabled (gt (int .Values.worker.replicas) 1) (not .Values.worker.token.perPod) -}}
{{- fail "worker.replicas > 1 needs worker.token.perPod=true: a worker credential serves one workspace host, so each pod needs its own" -}}
{{- end -}}
{{- end -}}

{{/* Names and labels shared by the templates. */}}
{{- define "kvselect.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvselect.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvselect.labels" -}}
{{ include "kvselect.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kvselect.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- .Values.serviceAccount.name | default (include "kvselect.fullname" .) -}}
{{- else -}}
{{- .Values.serviceAccount.name | default "default" -}}
{{- end -}}
{{- end -}}

{{- define "kvselect.replicas" -}}
{{- if .Values.ha.enabled -}}{{ .Values.ha.replicas }}{{- else -}}{{ .Values.replicaCount }}{{- end -}}
{{- end -}}

{{/*
The Secret holding the REST token file (--auth-token-file); empty when none.
*/}}
{{- define "kvselect.authTokensSecret" -}}
{{- if .Values.auth.enabled -}}
{{- if .Values.auth.tokens.existingSecret -}}
{{- .Values.auth.tokens.existingSecret -}}
{{- else if .Values.auth.tokens.create -}}
{{- printf "%s-auth-tokens" (include "kvselect.fullname" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the replica mesh key (--replica-sync-key-file). */}}
{{- define "kvselect.meshKeySecret" -}}
{{- .Values.ha.meshKey.existingSecret | default (printf "%s-mesh-key" (include "kvselect.fullname" .)) -}}
{{- end -}}

{{/*
The ClusterRoleBinding to system:auth-delegator. Cluster-scoped, so the name
carries the namespace: two releases of the same name in two namespaces must
not overwrite each other's binding.
*/}}
{{- define "kvselect.authDelegatorName" -}}
{{- printf "%s-%s-auth-delegator" .Release.Namespace (include "kvselect.fullname" .) | trunc 253 | trimSuffix "-" -}}
{{- end -}}

{{/*
kvselect.secretValue: the decoded value of key in the Secret ns/name when it
exists (helm install/upgrade against a cluster), else default. Generated
secrets go through it so that an upgrade keeps the value instead of rotating
it (a changed mesh key splits the replicas mid-rollout; a changed token locks
out its users). `helm template` has no cluster: lookup returns nothing there.
Arguments: dict "ns" "name" "key" "default".
*/}}
{{- define "kvselect.secretValue" -}}
{{- $s := lookup "v1" "Secret" .ns .name -}}
{{- if and $s $s.data (index $s.data .key) -}}
{{- index $s.data .key | b64dec -}}
{{- else -}}
{{- .default -}}
{{- end -}}
{{- end -}}

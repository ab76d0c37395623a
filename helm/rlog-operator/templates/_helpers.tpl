{{- define "rlog-operator.name" -}}rlog-operator{{- end -}}
{{- /* The objects' name, by Helm's convention: the release's name when it already says
rlog-operator (release rlog-operator: Deployment rlog-operator, not
rlog-operator-rlog-operator), else <release>-rlog-operator; fullnameOverride replaces it.
An upgrade of a release installed under the old rule (0.1.0 named every release
<release>-rlog-operator) keeps the old name while its Deployment exists: renaming on an
upgrade would make Helm create the new Deployment before deleting the old, and for those
seconds two operators would act (without leader election nothing else keeps them apart). */ -}}
{{- define "rlog-operator.fullname" -}}
{{- $legacy := printf "%s-rlog-operator" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride -}}
{{- else if not (contains "rlog-operator" .Release.Name) -}}
{{- $legacy -}}
{{- else if and .Release.IsUpgrade (lookup "apps/v1" "Deployment" .Release.Namespace $legacy) -}}
{{- $legacy -}}
{{- else -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- /* The leader election's Lease: named after the release, never after fullname, so that
no rename (a fullnameOverride set on an upgrade) gives the old and the new pods two Leases. */ -}}
{{- define "rlog-operator.leaseName" -}}{{ printf "%s-rlog-operator" .Release.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- /* Cluster-scoped objects carry the namespace too: two releases of one name in two
namespaces (e.g. each serving its own watchNamespaces) must not collide. */ -}}
{{- define "rlog-operator.clusterName" -}}{{ .Release.Namespace }}-{{ include "rlog-operator.fullname" . }}{{- end -}}
{{- define "rlog-operator.labels" -}}
app.kubernetes.io/name: rlog-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "rlog-operator.selector" -}}
app.kubernetes.io/name: rlog-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

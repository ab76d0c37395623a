{{- define "rlog-operator.name" -}}rlog-operator{{- end -}}
{{- define "rlog-operator.fullname" -}}{{ .Release.Name }}-rlog-operator{{- end -}}
{{- /* Cluster-scoped objects carry the namespace too: two releases of one name in two
namespaces (e.g. each serving its own watchNamespaces) must not collide. */ -}}
{{- define "rlog-operator.clusterName" -}}{{ .Release.Namespace }}-{{ .Release.Name }}-rlog-operator{{- end -}}
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

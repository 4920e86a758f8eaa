{{- define "gna.labels" -}}
app.kubernetes.io/name: gpu-node-agent
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{- define "gna.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}

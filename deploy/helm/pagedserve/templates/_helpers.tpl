{{/* Names and labels. */}}
{{- define "pagedserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "pagedserve.fullname" -}}
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

{{/* The endpoint picker's name: the pool's name plus "-epp" (kept under 63 characters). */}}
{{- define "pagedserve.eppName" -}}
{{- printf "%s-epp" (include "pagedserve.fullname" . | trunc 59 | trimSuffix "-") -}}
{{- end -}}

{{- define "pagedserve.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "pagedserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selects the model server pods (Service, PodMonitor, InferencePool). */}}
{{- define "pagedserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pagedserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: model-server
{{- end -}}

{{- define "pagedserve.eppSelectorLabels" -}}
app.kubernetes.io/name: {{ include "pagedserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: endpoint-picker
{{- end -}}

{{- define "pagedserve.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The name of the Secret holding the API key ("" when the server runs without one). */}}
{{- define "pagedserve.apiKeySecret" -}}
{{- if .Values.apiKey.existingSecret -}}
{{- .Values.apiKey.existingSecret -}}
{{- else if .Values.apiKey.create -}}
{{- printf "%s-api-key" (include "pagedserve.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The MODEL argument of `pagedserve serve` ("" for the image's default model). */}}
{{- define "pagedserve.modelArg" -}}
{{- $m := .Values.model -}}
{{- if $m.fetch.enabled -}}
{{- printf "%s/%s" $m.mountPath $m.fetch.dir -}}
{{- else if $m.pvc.claimName -}}
{{- printf "%s/%s" $m.mountPath $m.name -}}
{{- else -}}
{{- $m.name -}}
{{- end -}}
{{- end -}}

{{/* server.servedModelName (a name or a list of names) as a JSON list, [] when unset. The
first name is the one responses and metrics carry; requests may name any of them. */}}
{{- define "pagedserve.servedModelNames" -}}
{{- $n := .Values.server.servedModelName -}}
{{- if kindIs "slice" $n -}}{{- toJson $n -}}{{- else if $n -}}{{- toJson (list $n) -}}{{- else -}}[]{{- end -}}
{{- end -}}

{{/* GPUs per pod: gpu.count, else one per tensor-parallel rank. */}}
{{- define "pagedserve.gpuCount" -}}
{{- if .Values.gpu.count -}}{{ int .Values.gpu.count }}{{- else -}}{{ int .Values.server.tensorParallelSize }}{{- end -}}
{{- end -}}

{{/* preStop sleep + the server's drain window + slack, unless set explicitly. */}}
{{- define "pagedserve.gracePeriod" -}}
{{- $t := .Values.termination -}}
{{- $floor := add (int $t.preStopSleepSeconds) (int (ceil .Values.server.gracefulTimeout)) -}}
{{- if $t.gracePeriodSeconds -}}
{{- if le (int $t.gracePeriodSeconds) (int $floor) -}}
{{- fail (printf "termination.gracePeriodSeconds (%d) must exceed termination.preStopSleepSeconds + server.gracefulTimeout (%d), or requests in flight are killed" (int $t.gracePeriodSeconds) (int $floor)) -}}
{{- end -}}
{{- int $t.gracePeriodSeconds -}}
{{- else -}}
{{- add $floor (int $t.slackSeconds) -}}
{{- end -}}
{{- end -}}

{{/* `pagedserve serve` arguments, as a YAML list. */}}
{{- define "pagedserve.args" -}}
{{- $s := .Values.server -}}
{{- $args := list "serve" -}}
{{- $model := include "pagedserve.modelArg" . -}}
{{- if $model -}}{{- $args = append $args $model -}}{{- end -}}
{{- $args = concat $args (list "--host" $s.host "--port" (toString (int $s.port))) -}}
{{- $args = concat $args (list "--graceful-timeout" (toString $s.gracefulTimeout)) -}}
{{- if gt (int $s.tensorParallelSize) 1 -}}
{{- $args = concat $args (list "--tensor-parallel-size" (toString (int $s.tensorParallelSize))) -}}
{{- end -}}
{{- $names := include "pagedserve.servedModelNames" . | fromJsonArray -}}
{{- if $names -}}
{{- $args = concat $args (list "--served-model-name") $names -}}
{{- /* The flag takes every word up to the next flag, and with no MODEL before it the server
reads its last word as the MODEL when it names one (a hub id org/name included): end the words
with the default model's empty MODEL. */ -}}
{{- if and (not $model) (gt (len $names) 1) -}}{{- $args = append $args "" -}}{{- end -}}
{{- end -}}
{{- $strings := dict "device" "--device" "dtype" "--dtype" "logLevel" "--log-level" -}}
{{- range $key := keys $strings | sortAlpha -}}
{{- $v := index $s $key -}}
{{- if $v -}}{{- $args = concat $args (list (index $strings $key) (toString $v)) -}}{{- end -}}
{{- end -}}
{{- $ints := dict "maxModelLen" "--max-model-len" "pageSize" "--page-size" "maxNumSeqs" "--max-num-seqs" "maxNumBatchedTokens" "--max-num-batched-tokens" "maxWaiting" "--max-waiting" -}}
{{- range $key := keys $ints | sortAlpha -}}
{{- $v := index $s $key -}}
{{- if not (kindIs "invalid" $v) -}}{{- $args = concat $args (list (index $ints $key) (toString (int $v))) -}}{{- end -}}
{{- end -}}
{{- $floats := dict "kvCacheMemory" "--kv-cache-memory" "gpuMemoryUtilization" "--gpu-memory-utilization" -}}
{{- range $key := keys $floats | sortAlpha -}}
{{- $v := index $s $key -}}
{{- if not (kindIs "invalid" $v) -}}{{- $args = concat $args (list (index $floats $key) (toString $v)) -}}{{- end -}}
{{- end -}}
{{- if kindIs "bool" $s.enablePrefixCaching -}}
{{- $args = append $args (ternary "--enable-prefix-caching" "--no-enable-prefix-caching" $s.enablePrefixCaching) -}}
{{- end -}}
{{- $args = concat $args $s.extraArgs -}}
{{- toYaml $args -}}
{{- end -}}

{{/* Value combinations that cannot work, refused at render time. */}}
{{- define "pagedserve.validate" -}}
{{- if and .Values.autoscaling.hpa.enabled .Values.autoscaling.keda.enabled -}}
{{- fail "autoscaling: enable one of hpa and keda, not both (KEDA creates its own HPA)" -}}
{{- end -}}
{{- if and .Values.model.pvc.claimName (not .Values.model.fetch.enabled) (not .Values.model.name) -}}
{{- fail "model.name: the model's path inside the PVC (a .gguf file or an HF folder) is required with model.pvc.claimName" -}}
{{- end -}}
{{- if and .Values.model.fetch.enabled (not .Values.model.fetch.hubId) -}}
{{- fail "model.fetch.hubId is required when model.fetch.enabled is true" -}}
{{- end -}}
{{- if and .Values.apiKey.create (not .Values.apiKey.value) -}}
{{- fail "apiKey.value is required when apiKey.create is true (or name a Secret in apiKey.existingSecret)" -}}
{{- end -}}
{{- if lt (int .Values.server.tensorParallelSize) 1 -}}
{{- fail "server.tensorParallelSize must be >= 1" -}}
{{- end -}}
{{- if and .Values.inferenceExtension.httpRoute.matchModelNames (not .Values.server.servedModelName) -}}
{{- fail "inferenceExtension.httpRoute.matchModelNames needs server.servedModelName: the names the route matches (the model's own name is not known to the chart)" -}}
{{- end -}}
{{- if and .Values.inferenceExtension.enabled .Values.inferenceExtension.httpRoute.enabled (not .Values.inferenceExtension.httpRoute.gateway.name) -}}
{{- fail "inferenceExtension.httpRoute.gateway.name is required when the HTTPRoute is enabled" -}}
{{- end -}}
{{- end -}}

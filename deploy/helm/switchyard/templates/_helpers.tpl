{{/* Names, labels and the list of services every template iterates over. */}}

{{- define "switchyard.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "switchyard.fullname" -}}
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

{{/* A component's resource name: (dict "root" $ "component" "scheduler"). */}}
{{- define "switchyard.componentName" -}}
{{- printf "%s-%s" (include "switchyard.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "switchyard.selectorLabels" -}}
app.kubernetes.io/name: {{ include "switchyard.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "switchyard.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{ include "switchyard.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: switchyard
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- end -}}

{{- define "switchyard.image" -}}
{{- $image := index .root.Values.image .kind -}}
{{- printf "%s:%s" $image.repository (toString $image.tag) -}}
{{- end -}}

{{- define "switchyard.registryClaim" -}}
{{- .Values.registry.persistence.existingClaim | default (include "switchyard.componentName" (dict "root" . "component" "registry")) -}}
{{- end -}}

{{- define "switchyard.redisSecret" -}}
{{- .Values.redis.existingSecret | default (include "switchyard.fullname" .) -}}
{{- end -}}

{{- define "switchyard.redisSecretKey" -}}
{{- if .Values.redis.existingSecret -}}
{{- .Values.redis.existingSecretKey -}}
{{- else -}}
SWITCHYARD_REDIS_URL
{{- end -}}
{{- end -}}

{{- /* Kafka's SASL password: the chart's Secret, or one of your own. */ -}}
{{- define "switchyard.kafkaSecret" -}}
{{- .Values.kafka.sasl.existingSecret | default (printf "%s-kafka" (include "switchyard.fullname" .)) -}}
{{- end -}}

{{- define "switchyard.kafkaSecretKey" -}}
{{- if .Values.kafka.sasl.existingSecret -}}
{{- .Values.kafka.sasl.existingSecretKey -}}
{{- else -}}
SWITCHYARD_KAFKA_SASL_PASSWORD
{{- end -}}
{{- end -}}

{{- define "switchyard.drainTimeout" -}}
{{- .Values.config.SWITCHYARD_DRAIN_TIMEOUT_S | default "15" | toString | float64 -}}
{{- end -}}

{{/*
Every long-running service as YAML, name -> its values plus what the code fixes about it:
the `switchyard service` it runs, its image and whether it reads the registry (these
wait for the registry job and mount its volume, as in docker-compose.yml). Worker pools
become `worker-NAME`.
*/}}
{{- define "switchyard.components" -}}
{{- $components := dict -}}
{{- $fixed := list
  (list "ingress" "core" true)
  (list "monitor" "core" false)
  (list "predictor" "core" false)
  (list "estimator" "ml" true)
  (list "scheduler" "core" true)
  (list "rebalancer" "core" false)
  (list "placement" "core" true) -}}
{{- range $fixed -}}
{{- $name := index . 0 -}}
{{- $spec := deepCopy (index $.Values $name) -}}
{{- $_ := set $components $name (merge (dict "service" $name "image" (index . 1) "readsRegistry" (index . 2)) $spec) -}}
{{- end -}}
{{- range $pool, $spec := .Values.workers -}}
{{- if $spec.enabled -}}
{{- $_ := set $components (printf "worker-%s" $pool) (merge (dict "service" "worker") (deepCopy $spec)) -}}
{{- end -}}
{{- end -}}
{{- toYaml $components -}}
{{- end -}}

{{/* The pod-level settings of a component: its own `pod` keys over the chart's. */}}
{{- define "switchyard.podSettings" -}}
{{- toYaml (merge (deepCopy (.spec.pod | default dict)) (deepCopy .root.Values.pod)) -}}
{{- end -}}

{{/*
Whether KEDA's lag scalers need credentials: a SASL user, or the CA of a TLS listener
(none: the image's trusted CAs). Empty text when not.
*/}}
{{- define "switchyard.kafkaLagAuth" -}}
{{- $protocol := .Values.kafka.securityProtocol -}}
{{- if or (hasPrefix "SASL_" $protocol) (and (hasSuffix "SSL" $protocol) .Values.kafka.tls.caSecret) -}}
true
{{- end -}}
{{- end -}}

{{/*
Kafka lag triggers of a ScaledObject: (dict "root" $ "autoscaling" $spec.autoscaling).
offsetResetPolicy is the services' own: a group without offsets starts at the earliest
record, so its lag counts from there. On a secured Kafka each trigger names KEDA's
SASL mechanism and TLS as the services use them, and the TriggerAuthentication that
gives it the user, the password and the CA (triggerauthentication.yaml).
*/}}
{{- define "switchyard.kafkaTriggers" -}}
{{- $prefix := .root.Values.config.SWITCHYARD_TOPIC_PREFIX | default "" -}}
{{- $protocol := .root.Values.kafka.securityProtocol -}}
{{- $sasl := dict "PLAIN" "plaintext" "SCRAM-SHA-256" "scram_sha256" "SCRAM-SHA-512" "scram_sha512" -}}
{{- range .autoscaling.triggers }}
- type: kafka
  metadata:
    bootstrapServers: {{ $.root.Values.kafka.bootstrap | quote }}
    consumerGroup: {{ printf "%s%s" $prefix .consumerGroup | quote }}
    topic: {{ printf "%s%s" $prefix .topic | quote }}
    lagThreshold: {{ .lagThreshold | toString | quote }}
    offsetResetPolicy: earliest
    allowIdleConsumers: {{ .allowIdleConsumers | default false | toString | quote }}
    {{- if hasPrefix "SASL_" $protocol }}
    sasl: {{ get $sasl $.root.Values.kafka.sasl.mechanism | quote }}
    {{- end }}
    {{- if hasSuffix "SSL" $protocol }}
    tls: enable
    {{- end }}
  {{- if include "switchyard.kafkaLagAuth" $.root }}
  authenticationRef:
    name: {{ include "switchyard.fullname" $.root }}-kafka-lag
  {{- end }}
{{- end }}
{{- with .autoscaling.extraTriggers }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
A variable's value as text. Values files give every number as a float, and a large one
would print as 1.048576e+06: whole numbers are written as integers.
*/}}
{{- define "switchyard.envValue" -}}
{{- if and (kindIs "float64" .) (eq (floor .) .) -}}
{{- int64 . -}}
{{- else -}}
{{- toString . -}}
{{- end -}}
{{- end -}}

{{/* Names */}}
{{- define "gpu-admission.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-admission.fullname" -}}
{{- $fullname := "" }}
{{- if .Values.fullnameOverride }}
{{- $fullname = .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- $fullname = .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $fullname = printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- /* The Service takes this name, and a Service's name must be an RFC 1035 label (lower case letters, digits and '-',
from a letter), which helm does not ask of a release name: it takes one that starts with a digit or holds a dot
(my.gpu), and the apiserver refused the Service, the certs tool its name (found by a review). */}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $fullname) }}
{{- fail (printf "the release name %q (or fullnameOverride, nameOverride) makes the Service name %q, which Kubernetes refuses: a Service name is an RFC 1035 label (lower case letters a-z, digits and '-', starting with a letter, ending with a letter or digit; no '.'). Choose such a release name, or set fullnameOverride to one" (.Values.fullnameOverride | default .Release.Name) $fullname) }}
{{- end }}
{{- $fullname }}
{{- end }}

{{- /*
The full name with a suffix, within a kind's name limit: (list . "-certs" [max]), max 63 (a DNS label: Jobs, whose
name becomes a label value, Services, pods; ServiceAccounts and RBAC objects are kept to it too) unless given (52 for
a CronJob: the controller appends "-<minutes>" to name its Jobs). The base is cut, never the suffix: cutting
"<fullname>-certs-cleanup" at 63 would leave the bare fullname for a long release, and every suffixed object of a kind
would take the same name as each other and as the server's own.
*/}}
{{- define "gpu-admission.suffixedName" -}}
{{- $root := index . 0 }}
{{- $suffix := index . 1 }}
{{- $max := 63 }}
{{- if gt (len .) 2 }}{{ $max = index . 2 }}{{ end }}
{{- $base := include "gpu-admission.fullname" $root | trunc (int (sub $max (len $suffix))) | trimSuffix "-" }}
{{- printf "%s%s" $base $suffix }}
{{- end }}

{{- define "gpu-admission.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpu-admission.labels" -}}
helm.sh/chart: {{ include "gpu-admission.chart" . }}
app.kubernetes.io/name: {{ include "gpu-admission.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- /* The server's pods and its Service: the common labels and the component the selectors name, each key once. */ -}}
{{- define "gpu-admission.webhookLabels" -}}
{{ include "gpu-admission.labels" . }}
app.kubernetes.io/component: webhook
{{- end }}

{{- define "gpu-admission.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpu-admission.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: webhook
{{- end }}

{{- /*
The name of certManager mode's own CA (its Certificate, Secret and Issuer), for the template and NOTES.txt. Cut at 63,
a fullname ending in -ca can come out as its own CA's name: the CA Certificate and Secret would be the serving ones.
*/}}
{{- define "gpu-admission.certManagerCAName" -}}
{{- $name := include "gpu-admission.suffixedName" (list . "-ca") }}
{{- if or (eq $name (include "gpu-admission.fullname" .)) (eq $name (include "gpu-admission.tlsSecretName" .)) }}
{{- $name = include "gpu-admission.suffixedName" (list . "-ca2") }}
{{- end }}
{{- $name }}
{{- end }}

{{- /*
The server's ServiceAccount. With create=false a name is required: falling back to the namespace's `default` SA
would bind the server's ClusterRole (read every Node, write Events) to every pod in the namespace that runs as it.
*/}}
{{- define "gpu-admission.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpu-admission.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false: name the ServiceAccount you made for the server (the chart binds its ClusterRole to it; the namespace's default ServiceAccount is not used)" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpu-admission.certsServiceAccountName" -}}
{{- include "gpu-admission.suffixedName" (list . "-certs") }}
{{- end }}

{{- define "gpu-admission.image" -}}
{{- /* A tag of digits alone given by --set (image.tag=123) comes as an integer (int64): written as given (found by a
review). Any other value that is not text is refused (gpu-admission.text): a number in a values file is not the tag
as written (0123 is read as 83, 20240101 as 2.0240101e+07, 2.0 as 2), as the schema's "integer" cannot tell. The tag is
checked where a digest is set too, which is pulled instead: a tag refused alone rendered there without a word (found
by a review), and the install broke the day the digest was dropped. */}}
{{- $tag := .Values.image.tag }}
{{- if kindIs "invalid" $tag }}{{ $tag = "" }}{{ end }}
{{- if not (kindIs "int64" $tag) }}
{{- include "gpu-admission.text" (dict "field" "image.tag" "key" "tag" "value" $tag) }}
{{- end }}
{{- /* A digest or a whole reference given as the tag (sha256:..., v1@sha256:..., repo:v1) rendered an image
Kubernetes refuses (InvalidImageName, each pod) (found by a review): a tag is what the registries take. A negative
number (--set image.tag=-1) is refused here too, in these words: the schema's "minimum: got -1, want 0" did not say
what a tag is (found by a review). */}}
{{- if not (regexMatch "^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$" (toString $tag | default "v")) }}
{{- $then := printf "and the image %s:%s would not pull (InvalidImageName): a digest goes in image.digest (image.digest: sha256:..., which is used instead of the tag), the repository in image.repository" .Values.image.repository (toString $tag) }}
{{- if .Values.image.digest }}
{{- $then = "checked though image.digest is set and pulled instead: leave image.tag empty, or give the tag that digest was pushed as" }}
{{- end }}
{{- fail (printf "image.tag %q is not an image tag (up to 128 letters, digits, '_', '.' and '-', not first '.' or '-'), %s" (toString $tag) $then) }}
{{- end }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (toString $tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/* The TLS Secret the server mounts. */}}
{{- define "gpu-admission.tlsSecretName" -}}
{{- if eq .Values.certs.mode "provided" }}
{{- required "certs.provided.secretName is required when certs.mode is provided" .Values.certs.provided.secretName }}
{{- else }}
{{- printf "%s-tls" (include "gpu-admission.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Webhook names the apiserver shows in denials: 'admission webhook "validate.gpu-admission.io" denied ...'. */}}
{{- define "gpu-admission.mutatingWebhookName" -}}mutate.gpu-admission.io{{- end }}
{{- define "gpu-admission.validatingWebhookName" -}}validate.gpu-admission.io{{- end }}
{{- define "gpu-admission.protectWebhookName" -}}protect-annotations.gpu-admission.io{{- end }}
{{- define "gpu-admission.ungateWebhookName" -}}ungate.gpu-admission.io{{- end }}

{{/* Restricted-profile container securityContext shared by every container of the chart. */}}
{{- define "gpu-admission.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "gpu-admission.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
Namespaces never sent to the webhook: the release's own (the webhook must always be able to start its own pods),
kube-system and kube-node-lease (system pods and leases must never wait on a webhook), the configured exemptions
(the server would pass them untouched anyway) and webhook.excludeNamespaces.
*/}}
{{- define "gpu-admission.excludedNamespaces" -}}
{{- $ex := list .Release.Namespace "kube-system" "kube-node-lease" }}
{{- $cfgEx := (.Values.config.exemptions | default dict).namespaces | default list }}
{{- concat $ex $cfgEx .Values.webhook.excludeNamespaces | uniq | toJson }}
{{- end }}

{{- /*
Why the helm test cannot pass, or "": its probe goes to test.namespace, and a namespace the webhook never sees (the
release namespace, e.g. a release installed in `default` with the default test.namespace, or an excluded one) is
admitted untouched, so the test would fail saying the webhook did not act. No other namespace can be picked for the
user (it must exist and be one where a dry-run probe is welcome), and refusing the render would refuse `helm install
-n default` and a bare `helm template` for the sake of the test: the test pod fails with this message instead, and
NOTES.txt prints it at install.
*/}}
{{- define "gpu-admission.testNamespaceProblem" -}}
{{- $excluded := include "gpu-admission.excludedNamespaces" . | fromJsonArray }}
{{- if has .Values.test.namespace $excluded }}
{{- printf "test.namespace %q is never sent to the webhook, which leaves out the release namespace %q, kube-system, kube-node-lease, config.exemptions.namespaces and webhook.excludeNamespaces: the helm test cannot pass; set test.namespace to an existing namespace the webhook covers" .Values.test.namespace .Release.Namespace }}
{{- end }}
{{- end }}

{{/* The settings file: values.config with the release namespace added to exemptions.namespaces. */}}
{{- define "gpu-admission.settings" -}}
{{- $cfg := deepCopy (.Values.config | default dict) }}
{{- $ex := $cfg.exemptions | default dict }}
{{- $ns := $ex.namespaces | default list }}
{{- $_ := set $ex "namespaces" (append $ns .Release.Namespace | uniq) }}
{{- $_ := set $cfg "exemptions" $ex }}
{{- /* The registry reader's files are the chart's to name: it mounts the user's Secret or ConfigMap and sets the
path. A path of the settings' own is a file in no pod (the server refuses to start where one is missing), whether or
not the value is given too: one check, one message, for each file (found by a review). */}}
{{- $files := list
  (dict "file" "credentialsFile" "value" "registryCredentials.secretName" "given" (.Values.registryCredentials | default dict).secretName "what" "the Secret" "holds" "the file of the kubernetes.io/dockerconfigjson Secret" "path" "/etc/gpu-admission-registry/config.json")
  (dict "file" "caFile" "value" "registryCA.configMapName" "given" (.Values.registryCA | default dict).configMapName "what" "the CA" "holds" "the PEM bundle of the ConfigMap" "path" "/etc/gpu-admission-registry-ca/ca.crt") }}
{{- range $files }}
{{- $cuda := $cfg.cuda | default dict }}
{{- $registry := $cuda.registry | default dict }}
{{- if and .given (not $registry.enabled) }}
{{- fail (printf "%s is for the registry reader: set config.cuda.registry.enabled: true too (or leave %s out)" .value .what) }}
{{- end }}
{{- if and $registry.enabled (index $registry .file) }}
{{- fail (printf "config.cuda.registry.%s %s: leave it out of config; the chart sets it to %s named in %s, which it mounts (a path of your own is a file in no pod, and the server would refuse to start)" .file (index $registry .file) .holds .value) }}
{{- end }}
{{- if .given }}
{{- $_ := set $registry .file .path }}
{{- $_ := set $cuda "registry" $registry }}
{{- $_ := set $cfg "cuda" $cuda }}
{{- end }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{- /*
Refuses a GPU_ADMISSION_ variable of extraEnv that sets a setting the chart reads itself to render, an entry of a map
below one, or a section that holds one: the server and the config check would take it, the chart would not
(GPU_ADMISSION_SPOT__DEFAULT=tolerate spot-tolerated the GPU pods alone: the matchConditions, widened by
config.spot.default only, never sent a CPU pod; found by a review). Honouring them would mean reading each variable's
YAML as the server does, and one given by valueFrom cannot be read at render at all: they are given in values. A
variable's path is compared as the server reads it (webhook/config.py): split at "__", in any case, "_" within a name
left out (namespaceDefaults). The registry's settings the NetworkPolicy alone reads are refused only where it is
rendered: elsewhere they change nothing the chart renders, and refusing them failed upgrades (a review's).
The refusal says, for each refused variable, what to set instead, and gives the rest of extraEnv for `helm upgrade
--reuse-values`, which reuses the release's list whole (as webhook.objectOptOut's gives its --set).
*/}}
{{- define "gpu-admission.checkExtraEnv" -}}
{{- $matched := "which pods are sent to the webhooks" }}
{{- $mounts := "the registry reader's mounts, whose files the chart names there" }}
{{- /* Each setting, by its path as compared: its key in config, what the chart renders from it, what to set instead. */}}
{{- $read := dict
  "spot.default" (list "config.spot.default" $matched "config.spot.default")
  "spot.namespacedefaults" (list "config.spot.namespaceDefaults" $matched "config.spot.namespaceDefaults")
  "spot.ownerdefaults" (list "config.spot.ownerDefaults" $matched "config.spot.ownerDefaults")
  "exemptions.namespaces" (list "config.exemptions.namespaces" "which namespaces the webhooks leave out" "config.exemptions.namespaces")
  "exemptions.allowoptoutlabel" (list "config.exemptions.allowOptOutLabel" "the webhooks' objectSelector" "config.exemptions.allowOptOutLabel")
  "cuda.registry.credentialsfile" (list "config.cuda.registry.credentialsFile" $mounts "registryCredentials.secretName")
  "cuda.registry.cafile" (list "config.cuda.registry.caFile" $mounts "registryCA.configMapName") }}
{{- if (.Values.networkPolicy | default dict).enabled }}
{{- range list "enabled" "registries" "plainHttp" "ecr" }}
{{- $key := printf "config.cuda.registry.%s" . }}
{{- $_ := set $read (printf "cuda.registry.%s" (lower .)) (list $key "the NetworkPolicy's egress to registries" $key) }}
{{- end }}
{{- end }}
{{- $told := list }}
{{- $names := list }}
{{- $kept := list }}
{{- range .Values.extraEnv }}
{{- $name := .name | default "" | toString }}
{{- $parts := list }}
{{- if hasPrefix "GPU_ADMISSION_" $name }}
{{- range splitList "__" (trimPrefix "GPU_ADMISSION_" $name) }}{{ if . }}{{ $parts = append $parts (lower . | replace "_" "") }}{{ end }}{{ end }}
{{- end }}
{{- $path := join "." $parts }}
{{- $held := list }}
{{- $what := list }}
{{- range $key := keys $read | sortAlpha }}
{{- $setting := get $read $key }}
{{- if not $parts }}
{{- else if or (eq $path $key) (hasPrefix (printf "%s." $key) $path) }}
{{- $told = append $told (printf "%s sets %s, which the chart renders from (%s), and the chart cannot read a variable: the server alone would take it. Set %s in values instead." $name (index $setting 0) (index $setting 1) (index $setting 2)) }}
{{- else if hasPrefix (printf "%s." $path) $key }}
{{- $held = append $held (index $setting 0) }}
{{- $what = append $what (index $setting 1) | uniq }}
{{- end }}
{{- end }}
{{- if $held }}
{{- $section := slice (splitList "." (first $held)) 0 (add 1 (len $parts)) | join "." }}
{{- $told = append $told (printf "%s gives the section %s, which holds %s, which the chart renders from (%s), and the chart cannot read a variable: the server alone would take them. Give that section in values, under %s, instead, or one variable for each of its fields the chart does not read (%s__<FIELD>)." $name $section (join ", " $held) (join "; " $what) $section $name) }}
{{- end }}
{{- if eq (len $told) (len $names) }}
{{- $kept = append $kept . }}
{{- else }}
{{- $names = append $names $name }}
{{- end }}
{{- end }}
{{- if $told }}
{{- $them := ternary "it" "them" (eq (len $names) 1) }}
{{- fail (printf "extraEnv: %s Drop %s: take %s out of extraEnv in your values files, and to helm upgrade --reuse-values (which reuses the release's extraEnv) give extraEnv without %s: --set-json '%s'" (join " " $told) (join ", " $names) $them $them (printf "extraEnv=%s" (toJson $kept) | replace "'" "'\\''")) }}
{{- end }}
{{- end }}

{{/*
The registry reader's files (config.cuda.registry): the user's Secret and ConfigMap, mounted where
"gpu-admission.settings" names them, into the server's pods and the config check's (config-check.yaml), which reads
them as the server does at start. `optional`: the config check's, which runs before the release's objects exist.
*/}}
{{- define "gpu-admission.registryVolumeMounts" -}}
{{- with (.Values.registryCredentials | default dict).secretName }}
# Read credentials for private registries (config.cuda.registry): a Secret volume, renewed in place.
- name: registry-credentials
  mountPath: /etc/gpu-admission-registry
  readOnly: true
{{- end }}
{{- with (.Values.registryCA | default dict).configMapName }}
# CA certificates of registries a private CA signed (config.cuda.registry.caFile).
- name: registry-ca
  mountPath: /etc/gpu-admission-registry-ca
  readOnly: true
{{- end }}
{{- end }}

{{- define "gpu-admission.registryVolumes" -}}
{{- with (.root.Values.registryCredentials | default dict).secretName }}
- name: registry-credentials
  secret:
    secretName: {{ . }}
    items:
      - {key: .dockerconfigjson, path: config.json}
    {{- if $.optional }}
    optional: true
    {{- end }}
{{- end }}
{{- with (.root.Values.registryCA | default dict).configMapName }}
- name: registry-ca
  configMap:
    name: {{ . }}
    items:
      {{- /* values.yaml's key where the values lack it: a release made before registryCA (--reuse-values). */}}
      - {key: {{ dig "key" "ca.crt" $.root.Values.registryCA | quote }}, path: ca.crt}
    {{- if $.optional }}
    optional: true
    {{- end }}
{{- end }}
{{- end }}

{{/*
CEL for matchConditions. `object` is untyped (DynType) in webhook matchConditions, so reading an absent field is an
error, and an error under failurePolicy Fail rejects the request: every field is guarded with has().
*/}}
{{- define "gpu-admission.cel.resource" -}}
({{ . }} == 'nvidia.com/gpu' || {{ . }}.startsWith('nvidia.com/gpu.') || {{ . }}.startsWith('nvidia.com/mig-') || {{ . }}.startsWith('gpu-admission.io/'))
{{- end }}

{{- define "gpu-admission.cel.container" -}}
((has(c.resources) && ((has(c.resources.limits) && c.resources.limits.exists(r, {{ include "gpu-admission.cel.resource" "r" }})) || (has(c.resources.requests) && c.resources.requests.exists(r, {{ include "gpu-admission.cel.resource" "r" }})))) || (has(c.env) && c.env.exists(e, has(e.name) && e.name == 'NVIDIA_VISIBLE_DEVICES')))
{{- end }}

{{/* Argument: the CEL path of a PodSpec. */}}
{{- define "gpu-admission.cel.podSpec" -}}
((has({{ . }}.containers) && {{ . }}.containers.exists(c, {{ include "gpu-admission.cel.container" . }})) || (has({{ . }}.initContainers) && {{ . }}.initContainers.exists(c, {{ include "gpu-admission.cel.container" . }})))
{{- end }}

{{/* Argument: the CEL path of an ObjectMeta. */}}
{{- define "gpu-admission.cel.annotated" -}}
(has({{ . }}.annotations) && {{ . }}.annotations.exists(a, a.startsWith('gpu-admission.io/')))
{{- end }}

{{/* Argument: the CEL path of a PodTemplateSpec. */}}
{{- define "gpu-admission.cel.template" -}}
((has({{ . }}.metadata) && {{ include "gpu-admission.cel.annotated" (printf "%s.metadata" .) }}) || (has({{ . }}.spec) && {{ include "gpu-admission.cel.podSpec" (printf "%s.spec" .) }}))
{{- end }}

{{/*
True for an object that asks for a GPU (nvidia.com/gpu, nvidia.com/gpu.*, nvidia.com/mig-*, gpu-admission.io/*
resources in any container or init container), sets NVIDIA_VISIBLE_DEVICES, or carries a gpu-admission.io/
annotation (fractions, CUDA version, spot), whether it is a Pod (object.spec), an apps/v1 workload or Job
(object.spec.template) or a CronJob (object.spec.jobTemplate.spec.template). Spot defaults in config widen it.
*/}}
{{- define "gpu-admission.matchExpression" -}}
{{- $spot := .Values.config.spot | default dict }}
{{- $default := $spot.default | default "off" }}
{{- if ne $default "off" -}}
true
{{- else -}}
{{- $terms := list }}
{{- $terms = append $terms (printf "(has(object.metadata) && %s)" (include "gpu-admission.cel.annotated" "object.metadata")) }}
{{- $terms = append $terms (printf "(has(object.spec) && %s)" (include "gpu-admission.cel.podSpec" "object.spec")) }}
{{- $terms = append $terms (printf "(has(object.spec) && has(object.spec.template) && %s)" (include "gpu-admission.cel.template" "object.spec.template")) }}
{{- $terms = append $terms (printf "(has(object.spec) && has(object.spec.jobTemplate) && has(object.spec.jobTemplate.spec) && has(object.spec.jobTemplate.spec.template) && %s)" (include "gpu-admission.cel.template" "object.spec.jobTemplate.spec.template")) }}
{{- /* An update of a workload whose stored template carries the webhook's words: what it wrote may have to come out
(a spot mode and the GPU ask dropped in one edit: kubectl takes the template's whole annotations map away, and
nothing else would send it). */}}
{{- $terms = append $terms (printf "(request.operation == 'UPDATE' && has(oldObject.spec) && has(oldObject.spec.template) && has(oldObject.spec.template.metadata) && %s)" (include "gpu-admission.cel.annotated" "oldObject.spec.template.metadata")) }}
{{- $terms = append $terms (printf "(request.operation == 'UPDATE' && has(oldObject.spec) && has(oldObject.spec.jobTemplate) && has(oldObject.spec.jobTemplate.spec) && has(oldObject.spec.jobTemplate.spec.template) && has(oldObject.spec.jobTemplate.spec.template.metadata) && %s)" (include "gpu-admission.cel.annotated" "oldObject.spec.jobTemplate.spec.template.metadata")) }}
{{- $namespaces := list }}
{{- range $ns, $mode := ($spot.namespaceDefaults | default dict) }}
{{- if ne $mode "off" }}{{ $namespaces = append $namespaces (printf "'%s'" $ns) }}{{ end }}
{{- end }}
{{- if $namespaces }}
{{- $terms = append $terms (printf "request.namespace in [%s]" (join ", " $namespaces)) }}
{{- end }}
{{- $kinds := list }}
{{- $requests := list }}
{{- range $key, $mode := ($spot.ownerDefaults | default dict) }}
{{- /* The server refuses these (webhook/config.py) and would crash-loop: say so at install. */}}
{{- if or (eq $key "CronJob") (eq $key "CronJob.batch") }}
{{- fail "config.spot.ownerDefaults: CronJob owns no pod (its Jobs own them): a default for CronJob would never apply; use Job (the pods of every Job, a CronJob's included)" }}
{{- else if not (regexMatch "^[A-Z][A-Za-z0-9]*(\\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$" $key) }}
{{- fail (printf "config.spot.ownerDefaults: %q is not a kind as a pod's ownerReferences name it (CamelCase, from a capital letter: Job, ReplicaSet, Deployment, StatefulSet, ...), nor one with its API group (Job.batch.volcano.sh)" $key) }}
{{- else if hasPrefix "ReplicationController." $key }}
{{- fail "config.spot.ownerDefaults: ReplicationController is of the core API group, which has no name: write ReplicationController" }}
{{- else if and (has $mode (list "prefer" "require" "never")) (eq (first (splitList "." $key)) "DaemonSet") }}
{{- fail (printf "config.spot.ownerDefaults: %s: %s: a default %s leaves a DaemonSet's pods alone (they run on every node they may, spot nodes' GPU plugins among them), so it would never apply; annotate the DaemonSet's template gpu-admission.io/spot: %s to ask it" $key $mode $mode $mode) }}
{{- end }}
{{- $parts := splitList "." $key }}
{{- $kind := first $parts }}
{{- $group := join "." (rest $parts) }}
{{- $builtin := get (dict "Job" "batch" "ReplicaSet" "apps" "Deployment" "apps" "StatefulSet" "apps" "DaemonSet" "apps") $kind }}
{{- if and (ne $mode "off") $group (ne $group $builtin) }}
{{- /* A kind of another API group (Job.batch.volcano.sh): its pods only, by their owner's apiVersion. */}}
{{- $terms = append $terms (printf "(has(object.metadata) && has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, has(o.kind) && o.kind == '%s' && has(o.apiVersion) && o.apiVersion.startsWith('%s/')))" $kind $group) }}
{{- else if ne $mode "off" }}
{{- $kinds = append $kinds (printf "'%s'" $kind) }}
{{- /* The workloads whose templates' pods this kind owns: a CronJob's are its Jobs', a Deployment's its ReplicaSets'. */}}
{{- if eq $kind "Job" }}{{ $requests = append $requests "'CronJob'" }}{{ end }}
{{- if eq $kind "ReplicaSet" }}{{ $requests = append $requests "'Deployment'" }}{{ end }}
{{- /* A Deployment's pods are owned by its ReplicaSets, which give them the pod-template-hash label. */}}
{{- if eq $kind "Deployment" }}
{{- $terms = append $terms "(has(object.metadata) && has(object.metadata.labels) && 'pod-template-hash' in object.metadata.labels && has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, has(o.kind) && o.kind == 'ReplicaSet'))" }}
{{- end }}
{{- end }}
{{- end }}
{{- if $kinds }}
{{- $k := join ", " (uniq $kinds) }}
{{- $terms = append $terms (printf "request.kind.kind in [%s] || (has(object.metadata) && has(object.metadata.ownerReferences) && object.metadata.ownerReferences.exists(o, has(o.kind) && o.kind in [%s]))" (join ", " (uniq (concat $kinds $requests))) $k) }}
{{- end }}
{{- join "\n|| " $terms }}
{{- end }}
{{- end }}

{{/* Fields shared by both webhooks. */}}
{{- define "gpu-admission.webhookCommon" -}}
admissionReviewVersions: [v1]
sideEffects: NoneOnDryRun
failurePolicy: {{ .Values.webhook.failurePolicy }}
matchPolicy: Equivalent
rules:
  - apiGroups: [""]
    apiVersions: [v1]
    operations: [CREATE]
    resources: [pods]
    scope: Namespaced
  {{- if .Values.webhook.workloads }}
  - apiGroups: [apps]
    apiVersions: [v1]
    operations: [CREATE, UPDATE]
    resources: [deployments, statefulsets, daemonsets, replicasets]
    scope: Namespaced
  # A Job's pod template is immutable once created, but for its scheduling directives while it is suspended and has
  # never started (nodeSelector, affinity, tolerations, labels, annotations, scheduling gates: Kubernetes 1.27 on;
  # Kueue writes its flavor's there): an UPDATE is not sent, for a patch to anything else of the template would make
  # the apiserver reject the update (the Job controller's and Kueue's own included). Its pods are reviewed as they
  # are created, with what was written.
  - apiGroups: [batch]
    apiVersions: [v1]
    operations: [CREATE]
    resources: [jobs]
    scope: Namespaced
  - apiGroups: [batch]
    apiVersions: [v1]
    operations: [CREATE, UPDATE]
    resources: [cronjobs]
    scope: Namespaced
  {{- end }}
{{ include "gpu-admission.namespaceSelector" . }}
{{- include "gpu-admission.objectSelector" . }}
matchConditions:
  - name: gpu-related
    expression: |-
      {{- include "gpu-admission.matchExpression" . | nindent 6 }}
  {{- if .Values.webhook.workloads }}
  # A workload UPDATE is sent only when its pod template changed: controllers' metadata updates (revision
  # annotations, finalizers) of objects created before the webhook must not be converted, denied or rolled by it,
  # and a scale (the Deployment controller updates its ReplicaSets whole; HPA, kubectl scale) or a CronJob's suspend
  # must not wait on it: the server passes such an update untouched anyway (pipeline.TEMPLATE_KEPT), and under
  # failurePolicy Fail a webhook outage would refuse them, GPU pods could not even be scaled down.
  - name: template-changed-on-update
    expression: >-
      request.operation != 'UPDATE' || !has(object.spec) || !has(oldObject.spec) ||
      (has(object.spec.template) ? !has(oldObject.spec.template) || object.spec.template != oldObject.spec.template :
      has(object.spec.jobTemplate) ? !has(oldObject.spec.jobTemplate) || object.spec.jobTemplate != oldObject.spec.jobTemplate :
      object.spec != oldObject.spec)
  # A Deployment's ReplicaSet carries the Deployment's template, reviewed there; its pods are reviewed as they are
  # created. The Deployment controller finds its ReplicaSet by comparing templates: one changed here (the template's
  # annotations from a newer node list, a creator or label the Deployment was exempt by) would make it create
  # ReplicaSets without end. The server skips them too (pipeline._guard).
  - name: not-a-deployments-replicaset
    expression: >-
      request.kind.kind != 'ReplicaSet' || !has(object.metadata) || !has(object.metadata.ownerReferences) ||
      !object.metadata.ownerReferences.exists(r, has(r.kind) && r.kind == 'Deployment' && has(r.controller) &&
      r.controller)
  {{- end }}
{{- end }}

{{- define "gpu-admission.objectSelector" -}}
{{- /* webhook.objectOptOut switched the opt-out label on objects in the first releases (before 077b784): `helm upgrade
--reuse-values` over one renders with that release's values whole, the key among them, and --reset-then-reuse-values
too where the user gave it to that release (--set, a values file from `helm show values`). The schema takes it so
that this, not 'additional properties not allowed', says what to do; null (--set webhook.objectOptOut=null) drops it. */}}
{{- if and (hasKey .Values.webhook "objectOptOut") (not (kindIs "invalid" .Values.webhook.objectOptOut)) }}
{{- fail (printf "webhook.objectOptOut (%v) is no longer a setting: it comes from the values of a release made before it went (its chart's defaults, which helm upgrade --reuse-values reuses, or values given to it, which --reset-then-reuse-values reuses too) or from a values file given now. Drop it: add --set webhook.objectOptOut=null to the upgrade, and take it out of your values files. What replaces it: the label gpu-admission.io/ignore on a pod or workload is honoured where config.exemptions.allowOptOutLabel is true (default false: anyone who can create a pod can set it; namespace labels are always honoured)" .Values.webhook.objectOptOut) }}
{{- end }}
{{- if (.Values.config.exemptions | default dict).allowOptOutLabel }}
objectSelector:
  matchExpressions:
    - key: gpu-admission.io/ignore
      operator: NotIn
      values: ["true"]
{{- end }}
{{- end }}

{{- define "gpu-admission.clientConfig" -}}
clientConfig:
  service:
    name: {{ include "gpu-admission.fullname" .root }}
    namespace: {{ .root.Release.Namespace }}
    path: {{ .path }}
    port: {{ .root.Values.service.port }}
  {{- if eq .root.Values.certs.mode "provided" }}
  caBundle: {{ required "certs.provided.caBundle is required when certs.mode is provided" .root.Values.certs.provided.caBundle | nospace | quote }}
  {{- end }}
{{- end }}

{{/*
Where every pod of the chart may run and how it gets its image: the server's Deployment and the one-shot pods (config
check Job, certs Jobs, renewal CronJob, cleanup Job, helm test pod) alike, so that on a cluster where only labelled or
tainted nodes may run the webhook, or images need a pull secret, the hook pods do not hang Pending (and `helm
install --wait` time out). (dict "root" . ["oneShot" true]). A one-shot pod takes only affinity.nodeAffinity (which
nodes): pod (anti-)affinity and the topology spread say how server replicas spread against each other, mean nothing
for one pod that runs once, and could leave it unschedulable (anti-affinity to the webhook's pods on a two-node
cluster).
*/}}
{{- define "gpu-admission.podScheduling" -}}
{{- $v := .root.Values -}}
{{- with $v.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $affinity := $v.affinity | default dict }}
{{- if .oneShot }}
{{- $affinity = pick $affinity "nodeAffinity" }}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- /*
The metadata of a one-shot pod's template (config check, certs Jobs, renewal CronJob, cleanup Job, helm test pod):
(dict "root" . "component" NAME ["annotations" DICT, the helm test pod's hook annotations]). The chart's labels and
annotations, then the mesh opt-out below, then jobPodLabels and jobPodAnnotations over it (gpu-admission.addGiven;
not podLabels and podAnnotations: those are the server's).
The opt-out is here, not in values.yaml (whose maps are empty): `helm upgrade --reuse-values` renders with the values
of the release it upgrades, and one made before jobPodLabels existed has none, so defaults kept in values.yaml were
lost there and an injected proxy kept the pre-upgrade config check from completing (a review's finding).
*/}}
{{- define "gpu-admission.jobPodMetadata" -}}
{{- $labels := include "gpu-admission.labels" .root | fromYaml }}
{{- $_ := set $labels "app.kubernetes.io/component" .component }}
{{- $annotations := .annotations | default dict }}
{{- $on := "its Job and test pods" }}
{{- include "gpu-admission.addGiven" (dict "field" "jobPodLabels" "given" .root.Values.jobPodLabels "own" $labels "on" $on "defaults" (dict "sidecar.istio.io/inject" "false")) }}
{{- include "gpu-admission.addGiven" (dict "field" "jobPodAnnotations" "given" .root.Values.jobPodAnnotations "own" $annotations "on" $on "defaults" (dict "linkerd.io/inject" "disabled")) }}
labels:
  {{- toYaml $labels | nindent 2 }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- /*
Adds a map of labels or annotations the user gave (podLabels, jobPodAnnotations, metrics.serviceMonitor.labels ...)
to `own`, the chart's own keys on the same object, in place: (dict "field" NAME "given" MAP "own" DICT "on" WHERE
["defaults" DICT]). A key the chart writes itself is refused, not written twice (kustomize and Argo CD refuse a key
given twice; kubectl and helm keep either). `defaults` are the chart's keys a user may replace; a key given null is
dropped, a default's included. Each value must be text, as the API server requires of a label or an annotation
(gpu-admission.text).
*/}}
{{- define "gpu-admission.addGiven" -}}
{{- $given := .given | default dict }}
{{- range $key, $value := $given }}
{{- if hasKey $.own $key }}
{{- fail (printf "%s: %s is set by the chart on %s (%s: %s); leave it out" $.field $key $.on $key (get $.own $key)) }}
{{- end }}
{{- end }}
{{- range $key, $value := .defaults | default dict }}
{{- if not (hasKey $given $key) }}{{ $_ := set $.own $key $value }}{{ end }}
{{- end }}
{{- range $key, $value := $given }}
{{- if not (kindIs "invalid" $value) }}
{{- include "gpu-admission.text" (dict "field" (printf "%s: %s" $.field $key) "key" $key "value" $value) }}
{{- $_ := set $.own $key $value }}
{{- end }}
{{- end }}
{{- end }}

{{- /*
Refuses a value that must be text and is not: (dict "field" WHERE "key" KEY "value" VALUE). YAML reads yes, no, on,
off, y, n, true and false in a values file as a boolean and digits as a number (0123 as 83, 1.10 as 1.1), and --set
reads true, false and digits so: what was written is lost, and the chart cannot tell a file's `yes` from --set
x=true, so it writes nothing it was not given as text (the schema takes booleans and numbers, so that this message,
not 'got boolean, want string', is what a user reads).
*/}}
{{- define "gpu-admission.text" -}}
{{- if not (kindIs "string" .value) }}
{{- fail (printf "%s: %v was read as %s, not as text (in a values file YAML reads yes, no, on, off, y and n as booleans and 0123 as the number 83; --set reads true, false and digits so): give it as text: quote it in your values file (%s: \"...\"), or pass it with --set-string instead of --set (with --set-json, a JSON string)" .field .value (ternary "a boolean" "a number" (kindIs "bool" .value)) .key) }}
{{- end }}
{{- end }}

{{- /*
"true" where the config check Job runs (configCheck.enabled), else "". `helm upgrade --reuse-values` renders with the
values of the release it upgrades, and one made before the config check existed has no configCheck: on, as
values.yaml's default (the template failed there, "nil pointer evaluating interface {}.enabled").
*/}}
{{- define "gpu-admission.configCheck" -}}
{{- if dig "enabled" true (.Values.configCheck | default dict) }}true{{ end }}
{{- end }}

{{- /*
"true" where `helm uninstall` runs the certs cleanup Job (certs.selfSigned.cleanupOnUninstall), else "". On where the
values lack it, as values.yaml's default: a release made before it (--reuse-values) ran the Job always, and read as
false the upgrade dropped it, and `helm uninstall` left the TLS Secret, its private key included.
*/}}
{{- define "gpu-admission.cleanupOnUninstall" -}}
{{- if dig "cleanupOnUninstall" true .Values.certs.selfSigned }}true{{ end }}
{{- end }}

{{- /*
The activeDeadlineSeconds of every Job of the chart (config check, certs, renewal, cleanup): jobDeadlineSeconds. The
cleanup Job had 120 s, too short for a node to be made where it may run, and `helm uninstall` failed. 300 where the
values lack it: `helm upgrade --reuse-values` from a release made before it (values.yaml's default, tests check it).
*/}}
{{- define "gpu-admission.jobDeadlineSeconds" -}}{{ .Values.jobDeadlineSeconds | default 300 | int }}{{- end }}

{{- /*
The helm --timeout the NOTES advise, in minutes: twice jobDeadlineSeconds, as docs/install.md's 10m for its 300 s
(helm waits for each hook Job up to --timeout), so a Job's own outcome is what helm reports.
*/}}
{{- define "gpu-admission.helmTimeoutMinutes" -}}
{{- div (add (mul 2 (include "gpu-admission.jobDeadlineSeconds" . | int)) 59) 60 }}
{{- end }}

{{/* Pod spec of the certs Jobs and of the renewal CronJob: (dict "root" . ["serviceAccount" NAME] ["createOnly" true]). */}}
{{- define "gpu-admission.certsPodSpec" -}}
{{- $r := .root -}}
serviceAccountName: {{ .serviceAccount | default (include "gpu-admission.certsServiceAccountName" $r) }}
restartPolicy: Never
enableServiceLinks: false  # the server's settings variables' prefix (deployment.yaml)
{{- with include "gpu-admission.podScheduling" (dict "root" $r "oneShot" true) | trim }}{{ . | nindent 0 }}{{ end }}
securityContext:
  {{- include "gpu-admission.podSecurityContext" $r | nindent 2 }}
containers:
  - name: certs
    image: {{ include "gpu-admission.image" $r }}
    imagePullPolicy: {{ $r.Values.image.pullPolicy }}
    args:
      - certs
      - ensure
      - --namespace
      - {{ $r.Release.Namespace | quote }}
      - --service
      - {{ include "gpu-admission.fullname" $r | quote }}
      - --secret
      - {{ include "gpu-admission.tlsSecretName" $r | quote }}
      - --mutating-config
      - {{ include "gpu-admission.fullname" $r | quote }}
      - --validating-config
      - {{ include "gpu-admission.fullname" $r | quote }}
      - --days
      - {{ $r.Values.certs.selfSigned.days | quote }}
      - --renew-within-days
      - {{ $r.Values.certs.selfSigned.renewWithinDays | quote }}
      {{- if .createOnly }}
      - --create-only
      {{- end }}
    env:
      - name: PYTHONDONTWRITEBYTECODE
        value: "1"
    securityContext:
      {{- include "gpu-admission.containerSecurityContext" $r | nindent 6 }}
    resources:
      {{- toYaml $r.Values.certs.selfSigned.resources | nindent 6 }}
    volumeMounts:
      - name: tmp
        mountPath: /tmp
volumes:
  - name: tmp
    emptyDir:
      sizeLimit: 16Mi
{{- end }}

{{- /*
The ports the server listens on, as JSON {"https": N, "metrics": N}: 8443 and 9090 in the pod's own network; with
hostNetwork, hostNetworkPorts on the node's. There they must differ from each other and from the ports the node's
own components hold, or the pod crash-loops on "address already in use" (or takes the port from a component that
restarts). Ports the Kubernetes components and the overlay CNIs this mode is for (Calico, Cilium) listen on by
default; the schema keeps out ports under 1024 (the server has no capabilities).
*/}}
{{- define "gpu-admission.serverPorts" -}}
{{- if .Values.hostNetwork }}
{{- $p := .Values.hostNetworkPorts | default dict }}
{{- range $name := list "https" "metrics" }}
{{- if not (kindIs "float64" (index $p $name)) }}{{- if not (kindIs "int64" (index $p $name)) }}
{{- fail (printf "hostNetworkPorts.%s is required with hostNetwork: the node port the server's %s listens on (default %s)" $name (ternary "webhook" "metrics" (eq $name "https")) (ternary "10270" "10271" (eq $name "https"))) }}
{{- end }}{{- end }}
{{- end }}
{{- $taken := dict "2379" "etcd's client port" "2380" "etcd's peer port" "6443" "the kube-apiserver's port" "10248" "the kubelet's health port" "10249" "kube-proxy's metrics port" "10250" "the kubelet's port" "10255" "the kubelet's read-only port" "10256" "kube-proxy's health port" "10257" "kube-controller-manager's port" "10259" "kube-scheduler's port" "4240" "Cilium's health port" "9879" "Cilium's agent health port" "9099" "Calico's (Felix) health port" }}
{{- if eq (int $p.https) (int $p.metrics) }}
{{- fail (printf "hostNetworkPorts.https and hostNetworkPorts.metrics are both %d: on the host network the webhook and the metrics each need a node port of their own" (int $p.https)) }}
{{- end }}
{{- range $name := list "https" "metrics" }}
{{- $port := index $p $name | int | toString }}
{{- if hasKey $taken $port }}
{{- fail (printf "hostNetworkPorts.%s (%s) is %s on the nodes: with hostNetwork the server listens on the node's own ports, so pick one nothing on the nodes uses (the default is %s)" $name $port (get $taken $port) (ternary "10270" "10271" (eq $name "https"))) }}
{{- end }}
{{- end }}
{{- dict "https" (int $p.https) "metrics" (int $p.metrics) | toJson }}
{{- else }}
{{- dict "https" 8443 "metrics" 9090 | toJson }}
{{- end }}
{{- end }}

{{- /*
Why Kubernetes would refuse a CronJob schedule, or "". It reads one at create with robfig/cron's ParseStandard: five
fields (minute 0-59, hour 0-23, day of month 1-31, month 1-12 or jan-dec, day of week 0-6 or sun-sat; names in any
case), each a list of *, ? or a value or range a-b, each with an optional /step (a value with a step runs to the
field's end); or @yearly, @annually, @monthly, @weekly, @daily, @midnight, @hourly, "@every <duration>". It refuses
TZ= and CRON_TZ= in the schedule on create (a CronJob has the timeZone field for that).
*/}}
{{- define "gpu-admission.cronProblem" -}}
{{- $s := . -}}
{{- $problem := "" -}}
{{- $macros := list "@yearly" "@annually" "@monthly" "@weekly" "@daily" "@midnight" "@hourly" -}}
{{- if contains "TZ" $s -}}
{{- $problem = "Kubernetes refuses a time zone (TZ= or CRON_TZ=) in a CronJob's schedule; it runs in the kube-controller-manager's time zone, usually UTC" -}}
{{- else if hasPrefix "@" $s -}}
{{- if not (or (has $s $macros) (regexMatch "^@every ([0-9]+(\\.[0-9]*)?(ns|us|µs|μs|ms|s|m|h))+$" $s)) -}}
{{- $problem = printf "%q is not a macro Kubernetes knows (%s, or @every <duration> such as @every 12h)" $s (join ", " $macros) -}}
{{- end -}}
{{- else if eq (trim $s) "" -}}
{{- $problem = "it is blank" -}}
{{- else if hasPrefix "@" (trim $s) -}}
{{- $problem = "a macro must come first, with no space before it" -}}
{{- else -}}
{{- $fields := regexSplit "\\s+" (trim $s) -1 -}}
{{- if ne (len $fields) 5 -}}
{{- $problem = printf "it has %d field(s), not the 5 of minute, hour, day of month, month and day of week (there is no seconds field)" (len $fields) -}}
{{- else -}}
{{- $months := dict "jan" 1 "feb" 2 "mar" 3 "apr" 4 "may" 5 "jun" 6 "jul" 7 "aug" 8 "sep" 9 "oct" 10 "nov" 11 "dec" 12 -}}
{{- $days := dict "sun" 0 "mon" 1 "tue" 2 "wed" 3 "thu" 4 "fri" 5 "sat" 6 -}}
{{- $specs := list (dict "name" "minute" "min" 0 "max" 59) (dict "name" "hour" "min" 0 "max" 23) (dict "name" "day of month" "min" 1 "max" 31) (dict "name" "month" "min" 1 "max" 12 "names" $months "hint" "jan to dec") (dict "name" "day of week" "min" 0 "max" 6 "names" $days "hint" "sun to sat") -}}
{{- range $i, $field := $fields -}}
{{- $spec := index $specs $i -}}
{{- $names := $spec.names | default dict -}}
{{- range $part := splitList "," $field -}}
{{- if $problem -}}
{{- else if not (regexMatch "^(\\*|\\?|[0-9A-Za-z]+(-[0-9A-Za-z]+)?)(/[0-9]+)?$" $part) -}}
{{- $problem = printf "%s field %q: %q is not *, ?, a value or a range a-b (each with an optional /step)" $spec.name $field $part -}}
{{- else -}}
{{- $rangeStep := splitList "/" $part -}}
{{- $step := "1" -}}
{{- if eq (len $rangeStep) 2 -}}{{- $step = regexReplaceAll "^0+([0-9])" (index $rangeStep 1) "${1}" -}}{{- end -}}
{{- if and (eq (len $rangeStep) 2) (gt (len $step) 18) -}}
{{- $problem = printf "%s step %s: more digits than Kubernetes reads (a step past 2^63)" $spec.name (index $rangeStep 1) -}}
{{- else if and (eq (len $rangeStep) 2) (lt (atoi $step) 1) -}}
{{- $problem = printf "%s step %s: a step must be 1 or more" $spec.name (index $rangeStep 1) -}}
{{- end -}}
{{- $range := index $rangeStep 0 -}}
{{- if not (or $problem (has $range (list "*" "?"))) -}}
{{- $values := list -}}
{{- range $end := splitList "-" $range -}}
{{- if $problem -}}
{{- else if hasKey $names (lower $end) -}}
{{- $values = append $values (get $names (lower $end)) -}}
{{- else if not (regexMatch "^[0-9]+$" $end) -}}
{{- $problem = ternary (printf "%s %q is neither a number nor a name (%s)" $spec.name $end $spec.hint) (printf "%s %q is not a number" $spec.name $end) (hasKey $spec "hint") -}}
{{- else -}}
{{- $digits := regexReplaceAll "^0+([0-9])" $end "${1}" -}}
{{- $n := ternary (atoi $digits) (add $spec.max 1) (le (len $digits) 4) -}}
{{- if lt $n $spec.min -}}
{{- $problem = printf "%s %s is below %d" $spec.name $end $spec.min -}}
{{- else if gt $n $spec.max -}}
{{- $problem = printf "%s %s is above %d" $spec.name $end $spec.max -}}
{{- else -}}
{{- $values = append $values $n -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (not $problem) (eq (len $values) 2) (gt (index $values 0) (index $values 1)) -}}
{{- $problem = printf "%s range %s starts after it ends" $spec.name $range -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $problem -}}
{{- end }}

{{/*
The annotations of both webhook configurations. AKS's Admissions Enforcer rewrites the namespaceSelector of every
webhook that does not opt out, and its field manager then owns the field: Helm 4 applies server-side, so the next
`helm upgrade` failed with a conflict with "admissionsenforcer" (Azure/AKS#4002). The chart's own selector leaves out
what the enforcer would (kube-system, and the namespaces AKS manages), so it opts out; elsewhere the annotation is
read by nothing.
*/}}
{{- define "gpu-admission.webhookAnnotations" -}}
admissions.enforcer/disabled: "true"
{{- if eq .Values.certs.mode "certManager" }}
# cert-manager's cainjector copies the Certificate's CA into every webhook's clientConfig.caBundle.
cert-manager.io/inject-ca-from: {{ .Release.Namespace }}/{{ include "gpu-admission.fullname" . }}
{{- end }}
{{- end }}

{{/*
The namespaces the webhooks are called for, every one of them (the one that protects the webhook's annotations too):
not the release's, not those exempt by settings, not those labelled gpu-admission.io/ignore=true (the webhook
leaves them alone entirely; labelling a namespace takes a namespace admin).
*/}}
{{- define "gpu-admission.namespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ include "gpu-admission.excludedNamespaces" . }}
    # AKS's own namespaces, as its Admissions Enforcer would leave them out (webhookAnnotations)
    - key: kubernetes.azure.com/managedby
      operator: NotIn
      values: ["aks"]
    - key: gpu-admission.io/ignore
      operator: NotIn
      values: ["true"]
{{- end }}

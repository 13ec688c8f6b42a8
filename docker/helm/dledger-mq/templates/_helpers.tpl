{{/* Names. Pods are <fullname>-raftnode00-0 ...: at most 63 characters with a 40-character fullname. */}}
{{- define "dledger-mq.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "dledger-mq.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "dledger-mq.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* The broker group's name (brokerName / dLegerGroup) for group number .g: RaftNode00, RaftNode01 ... */}}
{{- define "dledger-mq.group" -}}
{{- printf "RaftNode%02d" (int .g) -}}
{{- end -}}

{{/* Kubernetes names of group .g: the StatefulSet, and its headless Service (the peers' DNS names). */}}
{{- define "dledger-mq.groupResource" -}}
{{- printf "%s-raftnode%02d" (include "dledger-mq.fullname" .root) (int .g) -}}
{{- end -}}
{{- define "dledger-mq.groupHeadless" -}}
{{- printf "%s-peers" (include "dledger-mq.groupResource" .) -}}
{{- end -}}
{{/* <headless>.<namespace>.svc.<domain>: a replica's DNS name is <pod>.<this>. */}}
{{- define "dledger-mq.groupDomain" -}}
{{- printf "%s.%s.svc.%s" (include "dledger-mq.groupHeadless" .) .root.Release.Namespace .root.Values.clusterDomain -}}
{{- end -}}

{{- define "dledger-mq.namesrvName" -}}
{{- printf "%s-namesrv-%d" (include "dledger-mq.fullname" .root) (int .k) -}}
{{- end -}}

{{/* namesrvAddr: every NameServer's own Service, so every broker registers at every NameServer. */}}
{{- define "dledger-mq.namesrvAddr" -}}
{{- $root := . -}}
{{- $addrs := list -}}
{{- range $k := until (int .Values.namesrv.count) -}}
{{- $addrs = append $addrs (printf "%s.%s.svc.%s:%d" (include "dledger-mq.namesrvName" (dict "root" $root "k" $k)) $root.Release.Namespace $root.Values.clusterDomain (int $root.Values.namesrv.port)) -}}
{{- end -}}
{{- join ";" $addrs -}}
{{- end -}}

{{- define "dledger-mq.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end -}}

{{- define "dledger-mq.checks" -}}
{{- if or (lt (int .Values.broker.groups) 1) (gt (int .Values.broker.groups) 20) -}}
{{- fail "broker.groups must be in 1..20" -}}
{{- end -}}
{{- if or (lt (int .Values.namesrv.count) 1) (gt (int .Values.namesrv.count) 5) -}}
{{- fail "namesrv.count must be in 1..5" -}}
{{- end -}}
{{- if or (lt (int .Values.podDisruptionBudget.minAvailable) 2) (gt (int .Values.podDisruptionBudget.minAvailable) 3) -}}
{{- fail "podDisruptionBudget.minAvailable must be 2 or 3: a group of 3 needs a majority of 2" -}}
{{- end -}}
{{- end -}}

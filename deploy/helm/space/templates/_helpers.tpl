{{/*
The labels of every object: the kustomize layouts' part-of, and Helm's own.
The pod templates carry only name, component and part-of, as in
deploy/kubernetes, so that selectors and pods are the same either way.
*/}}
{{- define "space.labels" -}}
app.kubernetes.io/part-of: space
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "space.image" -}}
image: {{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
imagePullPolicy: {{ .Values.image.pullPolicy }}
{{- end -}}

{{/* The layout, checked: a typo must not render the other one. */}}
{{- define "space.split" -}}
{{- if eq .Values.layout "split" -}}
true
{{- else if ne .Values.layout "single" -}}
{{- fail (printf "layout %q: want single or split" .Values.layout) -}}
{{- end -}}
{{- end -}}

{{/* The operator address ranges (docs/egress.md), as arguments. */}}
{{- define "space.egressRanges" -}}
{{- if .Values.egress.publicRanges }}
- --egress-public-ranges={{ join "," .Values.egress.publicRanges }}
{{- end }}
{{- if .Values.egress.internalRanges }}
- --egress-internal-ranges={{ join "," .Values.egress.internalRanges }}
{{- end }}
{{- end -}}

{{/* $SPACE_STORE: the Secret's DSN, or the embedded SQLite store. */}}
{{- define "space.storeEnv" -}}
- name: SPACE_STORE
{{- if .Values.store.sqlite }}
  value: sqlite
{{- else }}
  valueFrom:
    secretKeyRef:
      name: space-db
      key: dsn
{{- end }}
{{- end -}}

{{/*
Template builds (Debian mirrors, OCI registries), an S3 snapshot store on
a public endpoint and the egress gateway's upstreams: public addresses
only; the cluster and cloud metadata stay out of reach. An S3 store or a
database inside the cluster needs a rule of its own.
*/}}
{{- define "space.publicEgress" -}}
- to:
    - ipBlock:
        cidr: 0.0.0.0/0
        except:
          - 10.0.0.0/8
          - 100.64.0.0/10
          - 169.254.0.0/16
          - 172.16.0.0/12
          - 192.168.0.0/16
{{- end -}}

{{/* The link-cert init container's limits and confinement. */}}
{{- define "space.linkCertContainer" -}}
resources:
  requests:
    cpu: 10m
    memory: 16Mi
  limits:
    cpu: 100m
    memory: 64Mi
securityContext:
  privileged: false
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: ["ALL"]
volumeMounts:
  - name: cluster-ca
    mountPath: /etc/space/cluster-ca
    readOnly: true
  - name: link-tls
    mountPath: /etc/space/tls
{{- end -}}

{{/*
The cluster secret, the node link CA (only the link-cert init container
mounts it) and this pod's link certificate, in memory. mode: the secret
files' mode (0440 = 288 for the non-root servers, group-readable through
fsGroup; 0400 = 256 for the root nodes).
*/}}
{{- define "space.linkVolumes" -}}
- name: cluster-secret
  secret:
    secretName: space-cluster
    defaultMode: {{ .mode }}
    items:
      - key: secret
        path: secret
- name: cluster-ca
  secret:
    secretName: space-cluster-ca
    defaultMode: {{ .mode }}
    items:
      - key: ca.crt
        path: ca.crt
      - key: ca.key
        path: ca.key
- name: link-tls
  emptyDir:
    medium: Memory
    sizeLimit: 1Mi
{{- end -}}

#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this host, built from source.
#
#   scripts/k8s.sh build    build etcd, Kubernetes, containerd and the CNI
#                           plugins from the Go module proxy into the cache
#                           (idempotent; prints the bin dir)
#   scripts/k8s.sh up       start the cluster (builds first), wait for Ready,
#                           print the kubeconfig path
#   scripts/k8s.sh down     stop it and remove everything `up` created
#   scripts/k8s.sh status   what is running
#   scripts/k8s.sh image    build the SPACE image from this checkout and
#                           import it into the cluster (space:local)
#   scripts/k8s.sh postgres build the PostgreSQL image of the split layout
#                           (cached), import it (space-postgres:local) and
#                           make its volume's directory
#   scripts/k8s.sh env      shell exports for KUBECONFIG and PATH
#   scripts/k8s.sh bin      the directory of kubectl and the other Kubernetes binaries
#   scripts/k8s.sh helm     build helm (cached, part of build too) and print its path
#
# Everything lives under $K8S_STATE (default /var/lib/space-k8s); the
# listeners are on 127.0.0.1. Only what this script created is removed.
#   K8S_CACHE   build cache root (default /var/cache/space/k8s)
#   K8S_STATE   state dir of a running cluster (default /var/lib/space-k8s)
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CNI_VERSION=${CNI_VERSION:-v1.10.0}
HELM_VERSION=${HELM_VERSION:-v4.3.1}
K8S_CACHE=${K8S_CACHE:-/var/cache/space/k8s}
K8S_STATE=${K8S_STATE:-/var/lib/space-k8s}

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=$PATH:/usr/local/go/bin
fi
export CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { echo "k8s.sh: $*" >&2; }

# The staging modules k8s.io/kubernetes replaces with ./staging/src/...: a
# module outside its repository takes each one's v0.N.M release instead.
staging_version() { local v=${K8S_VERSION#v1.}; echo "v0.$v"; }

# build_one NAME VERSION SETUP-FUNC: builds into $K8S_CACHE/NAME/VERSION/bin
# unless a complete build (the DONE marker) is there; logs the seconds taken.
build_one() {
  local name=$1 version=$2 fn=$3
  local dir=$K8S_CACHE/$name/$version
  if [ -f "$dir/DONE" ]; then return 0; fi
  command -v go >/dev/null || { log "Go is required to build $name"; exit 1; }
  mkdir -p "$dir"
  local work start
  work=$(mktemp -d)
  start=$(date +%s)
  log "building $name $version (log: $dir/build.log)"
  if ! (cd "$work" && "$fn" "$work" "$version") >"$dir/build.log" 2>&1; then
    tail -20 "$dir/build.log" >&2
    rm -rf "$work"
    log "building $name $version failed"
    exit 1
  fi
  rm -rf "$dir/bin"
  mv "$work/bin" "$dir/bin"
  rm -rf "$work"
  echo "$(($(date +%s) - start))" >"$dir/SECONDS"
  touch "$dir/DONE"
  log "built $name $version in $(cat "$dir/SECONDS") s"
}

gobuild() { go build -trimpath -ldflags "-s -w ${LDFLAGS:-}" "$@"; }

setup_etcd() {
  go mod init space.local/etcdbuild
  go get "go.etcd.io/etcd/server/v3@$2"
  LDFLAGS="-X go.etcd.io/etcd/api/v3/version.GitSHA=${2}" gobuild -o bin/etcd go.etcd.io/etcd/server/v3
  ./bin/etcd --version
}

setup_containerd() {
  go mod init space.local/containerdbuild
  go get "github.com/containerd/containerd/v2@$2"
  local tags="no_btrfs no_devmapper no_zfs no_aufs"
  LDFLAGS="-X github.com/containerd/containerd/v2/version.Version=$2 -X github.com/containerd/containerd/v2/version.Revision=$2" \
    gobuild -tags "$tags" -o bin/ \
    github.com/containerd/containerd/v2/cmd/containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr
  ./bin/containerd --version
}

setup_cni() {
  go mod init space.local/cnibuild
  go get "github.com/containernetworking/plugins@$2"
  LDFLAGS="-X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$2" \
    gobuild -o bin/ \
    github.com/containernetworking/plugins/plugins/main/bridge \
    github.com/containernetworking/plugins/plugins/main/loopback \
    github.com/containernetworking/plugins/plugins/ipam/host-local \
    github.com/containernetworking/plugins/plugins/meta/portmap
}

setup_kubernetes() {
  local v=$2 sv
  sv=$(staging_version)
  go mod init space.local/k8sbuild
  go mod download -json "k8s.io/kubernetes@$v" >/dev/null
  local gomod
  gomod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$v.mod
  {
    echo "require k8s.io/kubernetes $v"
    echo "replace ("
    sed -n 's#^\s*\(k8s\.io/[a-z0-9-]*\) => \./staging/.*#\t\1 => \1 '"$sv"'#p' "$gomod"
    echo ")"
  } >>go.mod
  go mod download -x k8s.io/kubernetes 2>&1 | tail -1 || true
  local major=${v#v}; major=${major%%.*}
  local minor=${v#v*.}; minor=${minor%%.*}
  local date
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local x
  for x in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    LDFLAGS+=" -X $x.gitVersion=$v -X $x.gitMajor=$major -X $x.gitMinor=$minor -X $x.gitTreeState=clean -X $x.buildDate=$date -X $x.gitCommit=$v"
  done
  export LDFLAGS
  local c
  for c in kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl; do
    echo "== $c $(date -u +%T)"
    gobuild -o "bin/$c" "k8s.io/kubernetes/cmd/$c"
  done
  ./bin/kubectl version --client
}

# helm, with its Kubernetes modules moved to the cluster's release (the
# same packages the Kubernetes build compiles, so the Go build cache shares
# them) and its version stamped as its Makefile does.
setup_helm() {
  local sv
  sv=$(staging_version)
  go mod init space.local/helmbuild
  go get "helm.sh/helm/v4@$2"
  local gomod mods
  gomod=$(go env GOMODCACHE)/cache/download/helm.sh/helm/v4/@v/$2.mod
  mods=$(sed -n 's#^\s*\(k8s\.io/\(api\|apiextensions-apiserver\|apimachinery\|apiserver\|cli-runtime\|client-go\|component-base\|kubectl\)\) v0\..*#\1@'"$sv"'#p' "$gomod")
  # shellcheck disable=SC2086
  go get $mods
  LDFLAGS="-X helm.sh/helm/v4/internal/version.version=$2 -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
    gobuild -o bin/helm helm.sh/helm/v4/cmd/helm
  ./bin/helm version
}

cmd_build() {
  build_one etcd "$ETCD_VERSION" setup_etcd
  build_one containerd "$CONTAINERD_VERSION" setup_containerd
  build_one cni "$CNI_VERSION" setup_cni
  build_one kubernetes "$K8S_VERSION" setup_kubernetes
  build_one helm "$HELM_VERSION" setup_helm
  echo "$K8S_CACHE"
}

# ---- the running cluster ---------------------------------------------------

REPO=$(cd "$(dirname "$0")/.." && pwd)
S=$K8S_STATE
PKI=$S/pki
NODE=${K8S_NODE:-space-k8s}
CG=space-k8s          # cgroup (every v1 hierarchy) of everything up starts
BRIDGE=spk8s0         # the pods' bridge
POD_CIDR=10.244.0.0/24
SVC_CIDR=10.97.0.0/16
APISERVER=https://127.0.0.1:16443
PAUSE_IMAGE=space.local/pause:1
# The host settings kubelet changes at start, and the forwarding the bridge
# plugin turns on for its gateway; down puts them back.
SYSCTLS="net.ipv4.ip_forward vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes"

bindir() { echo "$K8S_CACHE/$1/$2/bin"; }
ETCD_BIN=$(bindir etcd "$ETCD_VERSION")
CTRD_BIN=$(bindir containerd "$CONTAINERD_VERSION")
CNI_BIN=$(bindir cni "$CNI_VERSION")
KUBE_BIN=$(bindir kubernetes "$K8S_VERSION")
kubectl() { "$KUBE_BIN/kubectl" --kubeconfig "$PKI/admin.kubeconfig" "$@"; }

# The cgroup v1 hierarchies (and the v2 one of a hybrid host).
hierarchies() { awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts | sort -u; }

wait_for() { # SECONDS WHAT CMD...
  local deadline=$(($(date +%s) + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then log "timed out waiting for $what"; return 1; fi
    sleep 1
  done
}

cert() { # NAME CN O [SANS]
  local n=$1 cn=$2 o=$3 sans=${4:-}
  [ -f "$PKI/$n.crt" ] && return 0
  openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/$n.key" 2>/dev/null
  local subj="/CN=$cn"
  [ -n "$o" ] && subj="/O=$o$subj"
  openssl req -new -key "$PKI/$n.key" -subj "$subj" -out "$PKI/$n.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    [ -n "$sans" ] && echo "subjectAltName=$sans"
  } >"$PKI/$n.ext"
  openssl x509 -req -in "$PKI/$n.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 365 -extfile "$PKI/$n.ext" -out "$PKI/$n.crt" 2>/dev/null
}

kubeconfig() { # NAME (cert name) -> $PKI/NAME.kubeconfig
  cat >"$PKI/$1.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: space-k8s
  cluster:
    server: $APISERVER
    certificate-authority-data: $(base64 -w0 <"$PKI/ca.crt")
users:
- name: $1
  user:
    client-certificate-data: $(base64 -w0 <"$PKI/$1.crt")
    client-key-data: $(base64 -w0 <"$PKI/$1.key")
contexts:
- name: space-k8s
  context: {cluster: space-k8s, user: $1}
current-context: space-k8s
KC
}

make_pki() {
  mkdir -p "$PKI"
  if [ ! -f "$PKI/ca.crt" ]; then
    openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=space-k8s-ca" -days 365 -out "$PKI/ca.crt" 2>/dev/null
    openssl ecparam -name prime256v1 -genkey -noout -out "$PKI/sa.key" 2>/dev/null
    openssl ec -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  fi
  cert apiserver kube-apiserver "" "IP:127.0.0.1,IP:${SVC_CIDR%.0.0/16}.0.1,IP:$NODE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert admin space-k8s-admin system:masters
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  cert controller-manager system:kube-controller-manager ""
  cert scheduler system:kube-scheduler ""
  cert kube-proxy system:kube-proxy ""
  cert kubelet "system:node:$NODE" system:nodes
  local k
  for k in admin controller-manager scheduler kube-proxy kubelet; do kubeconfig "$k"; done
}

# start NAME CMD...: runs CMD in the cgroup $CG/system of every hierarchy,
# in its own session, logging to $S/logs/NAME.log.
start() {
  local name=$1
  shift
  (
    for h in $(hierarchies); do echo "$BASHPID" >"$h/$CG/system/cgroup.procs"; done
    exec setsid "$@"
  ) </dev/null >"$S/logs/$name.log" 2>&1 &
  echo $! >"$S/pids/$name"
}

make_cgroups() {
  local h d
  for h in $(hierarchies); do
    for d in "$h/$CG" "$h/$CG/system"; do
      mkdir -p "$d"
      if [ -f "$d/cpuset.cpus" ] && [ -z "$(cat "$d/cpuset.cpus")" ]; then
        cat "$(dirname "$d")/cpuset.cpus" >"$d/cpuset.cpus"
        cat "$(dirname "$d")/cpuset.mems" >"$d/cpuset.mems"
      fi
    done
  done
}

write_configs() {
  mkdir -p "$S/cni/net.d" "$S/containerd" "$S/kubelet"
  cat >"$S/cni/net.d/10-space-k8s.conflist" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "space-k8s",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {"type": "host-local", "dataDir": "$S/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "loopback"}
  ]
}
CNI
  cat >"$S/containerd/config.toml" <<TOML
version = 3
root = "$S/containerd/root"
state = "$S/containerd/state"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]

[grpc]
  address = "$S/containerd/containerd.sock"
[ttrpc]
  address = "$S/containerd/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins.'io.containerd.internal.v1.opt']
  path = "$S/containerd/opt"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "$PAUSE_IMAGE"
[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # kubelet asks for oom_score_adj -998 for pod sandboxes; lowering it needs
  # CAP_SYS_RESOURCE, which a host in a sandbox may lack (runc init then
  # fails: "failed to update /proc/self/oom_score_adj"). Clamp to ours.
  restrict_oom_score_adj = $( [ "$(( 0x$(awk '/^CapEff/ {print $2}' /proc/self/status) >> 24 & 1 ))" = 1 ] && echo false || echo true)
[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["$CNI_BIN"]
  conf_dir = "$S/cni/net.d"
[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = "runc"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  BinaryName = "$(command -v runc)"
  Root = "$S/runc"
  SystemdCgroup = false
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
TOML
  cat >"$S/kubelet/config.yaml" <<KCFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: 20250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 20248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupRoot: /$CG
cgroupsPerQOS: true
failSwapOn: false
failCgroupV1: false
containerRuntimeEndpoint: unix://$S/containerd/containerd.sock
podLogsDir: $S/pod-logs
tlsCertFile: $PKI/kubelet.crt
tlsPrivateKeyFile: $PKI/kubelet.key
serializeImagePulls: false
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
KCFG
}

# record_host: what down must restore or leave alone (written once per up).
record_host() {
  [ -f "$S/host/recorded" ] && return 0
  mkdir -p "$S/host"
  local k
  for k in $SYSCTLS; do sysctl -n "$k" >"$S/host/sysctl.$k" 2>/dev/null || true; done
  local p
  for p in /run/containerd /var/lib/cni /var/log/containers; do
    [ -e "$p" ] && touch "$S/host/existed.${p//\//_}"
  done
  nft list tables >"$S/host/nft-tables" 2>/dev/null || true
  touch "$S/host/recorded"
}

# pause_image, space: build (cached) and import an image tar.
import_tar() { "$CTRD_BIN/ctr" --address "$S/containerd/containerd.sock" -n k8s.io images import --no-unpack=false "$1" >&2; }

pause_tar() {
  local dir=$K8S_CACHE/image
  mkdir -p "$dir"
  if [ ! -f "$dir/pause.tar" ]; then
    (cd "$REPO" && go build -trimpath -ldflags "-s -w" -o "$dir/pause" ./deploy/ociimage/pause &&
      go run ./deploy/ociimage -o "$dir/pause.tar" -name "$PAUSE_IMAGE" -file "/pause=$dir/pause" -entrypoint '["/pause"]') >&2 || { log "building the pause image failed"; exit 1; }
  fi
  echo "$dir/pause.tar"
}

# The SPACE image: a Debian root filesystem from mmdebstrap (cached per
# package list) and a layer with this checkout's space and space-agent
# (deploy/Dockerfile makes the same contents with Docker).
IMAGE_PKGS=ca-certificates,busybox-static,mmdebstrap,nftables,iproute2,procps,util-linux,e2fsprogs,tini
SPACE_IMAGE=docker.io/library/space:local
rootfs_tar() {
  local key out
  key=$(echo "bookworm $IMAGE_PKGS" | sha256sum | cut -c1-12)
  out=$K8S_CACHE/image/rootfs-$key.tar
  if [ ! -f "$out" ]; then
    mkdir -p "$K8S_CACHE/image"
    log "building the image's root filesystem (mmdebstrap bookworm)"
    SOURCE_DATE_EPOCH=1700000000 mmdebstrap --variant=minbase --format=tar --include="$IMAGE_PKGS" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' bookworm "$out.tmp.tar" >&2
    mv "$out.tmp.tar" "$out"
  fi
  echo "$out"
}

space_tar() {
  local dir=$S/image rootfs
  rootfs=$(rootfs_tar)
  mkdir -p "$dir"
  (cd "$REPO" && go build -trimpath -ldflags "-s -w" -o "$dir/" ./cmd/space ./cmd/space-agent &&
    SOURCE_DATE_EPOCH=1700000000 go run ./deploy/ociimage -o "$dir/space.tar" -name "$SPACE_IMAGE" -base "$rootfs" \
      -file "/usr/local/bin/space=$dir/space" -file "/usr/local/bin/space-agent=$dir/space-agent" \
      -entrypoint '["/usr/bin/tini","--","/usr/local/bin/space"]' -cmd '["server"]') >&2 ||
    { log "building the SPACE image failed"; exit 1; }
  echo "$dir/space.tar"
}

# import_built FUNC: builds an image tarball with FUNC (it prints the
# path) and imports it into the running cluster's containerd.
import_built() {
  running || { log "the cluster is not up (scripts/k8s.sh up)"; exit 1; }
  local tarball
  tarball=$("$1")
  import_tar "$tarball"
}

cmd_image() {
  import_built space_tar
  echo "$SPACE_IMAGE"
}

# PostgreSQL for the split layout (deploy/kubernetes/local), in place of
# the postgres image no registry serves: Debian's postgresql-15 in a root
# filesystem from mmdebstrap, its postgres user moved to uid/gid 999 (the
# manifests run the container as 999, as the postgres image's user), the
# server binaries first on PATH (the probes call pg_isready) and an
# entrypoint that does what the postgres image's does with POSTGRES_USER,
# POSTGRES_DB, POSTGRES_PASSWORD and PGDATA
# (deploy/ociimage/postgres/entrypoint.sh). Cached by its inputs.
PG_PKGS=postgresql-15
PG_IMAGE=docker.io/library/space-postgres:local
postgres_tar() {
  # The root filesystem is keyed by its packages (a slow build), the image
  # by that and the entrypoint.
  local key rootfs out
  key=$(echo "bookworm $PG_PKGS uid999" | sha256sum | cut -c1-12)
  rootfs=$K8S_CACHE/image/postgres-rootfs-$key.tar
  key=$(cat <(echo "$key") "$REPO/deploy/ociimage/postgres/entrypoint.sh" | sha256sum | cut -c1-12)
  out=$K8S_CACHE/image/postgres-$key.tar
  [ -f "$out" ] && { echo "$out"; return 0; }
  mkdir -p "$K8S_CACHE/image"
  if [ ! -f "$rootfs" ]; then
    log "building the PostgreSQL image's root filesystem (mmdebstrap bookworm $PG_PKGS)"
    # The package's own cluster (/var/lib/postgresql/15/main) is not used:
    # the entrypoint initialises PGDATA on the volume.
    SOURCE_DATE_EPOCH=1700000000 mmdebstrap --variant=minbase --format=tar --include="$PG_PKGS" \
      --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
      --dpkgopt='path-exclude=/usr/share/locale/*' \
      --customize-hook='rm -rf "$1/var/lib/postgresql/15" "$1/etc/postgresql/15"' \
      --customize-hook='chroot "$1" groupmod -g 999 postgres' \
      --customize-hook='chroot "$1" usermod -u 999 -g 999 postgres' \
      --customize-hook='chroot "$1" chown -R 999:999 /var/lib/postgresql /var/run/postgresql /var/log/postgresql' \
      bookworm "$rootfs.tmp.tar" >&2
    mv "$rootfs.tmp.tar" "$rootfs"
  fi
  (cd "$REPO" && SOURCE_DATE_EPOCH=1700000000 go run ./deploy/ociimage -o "$out.tmp" -name "$PG_IMAGE" -base "$rootfs" \
    -file "/usr/local/bin/docker-entrypoint.sh=$REPO/deploy/ociimage/postgres/entrypoint.sh" \
    -env PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    -entrypoint '["/usr/local/bin/docker-entrypoint.sh"]') >&2 ||
    { log "building the PostgreSQL image failed"; exit 1; }
  mv "$out.tmp" "$out"
  echo "$out"
}

cmd_postgres() {
  import_built postgres_tar
  # The volume of the StatefulSet's one claim (the overlay's
  # PersistentVolume space-postgres: this cluster has no provisioner),
  # owned by the container's user.
  mkdir -p "$S/volumes/space-postgres"
  chown 999:999 "$S/volumes/space-postgres"
  chmod 700 "$S/volumes/space-postgres"
  echo "$PG_IMAGE"
}

running() { [ -f "$S/pids/kube-apiserver" ] && kill -0 "$(cat "$S/pids/kube-apiserver")" 2>/dev/null; }

apiserver_ready() {
  curl -fsS --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$APISERVER/readyz" >/dev/null
}

cmd_up() {
  if running; then echo "$PKI/admin.kubeconfig"; return 0; fi
  local bins
  bins=$(cmd_build)
  : "$bins"
  command -v runc >/dev/null || { log "runc is required (scripts/deps.sh)"; exit 1; }
  local t0
  t0=$(date +%s)
  NODE_IP=$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
  [ -n "$NODE_IP" ] || { log "no IPv4 default route: the node needs an address"; exit 1; }
  mkdir -p "$S/logs" "$S/pids" "$S/pod-logs"
  record_host
  make_pki
  make_cgroups
  write_configs

  start etcd "$ETCD_BIN/etcd" --name space-k8s --data-dir "$S/etcd" \
    --listen-client-urls http://127.0.0.1:12379 --advertise-client-urls http://127.0.0.1:12379 \
    --listen-peer-urls http://127.0.0.1:12380 --initial-advertise-peer-urls http://127.0.0.1:12380 \
    --initial-cluster space-k8s=http://127.0.0.1:12380 \
    --quota-backend-bytes 1073741824
  wait_for 60 etcd curl -fsS --max-time 2 http://127.0.0.1:12379/health

  start kube-apiserver "$KUBE_BIN/kube-apiserver" --etcd-servers http://127.0.0.1:12379 \
    --bind-address 127.0.0.1 --secure-port 16443 --advertise-address "$NODE_IP" \
    --service-cluster-ip-range "$SVC_CIDR" --allow-privileged=true \
    --client-ca-file "$PKI/ca.crt" --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --authorization-mode Node,RBAC --profiling=false
  wait_for 180 kube-apiserver apiserver_ready

  start kube-controller-manager "$KUBE_BIN/kube-controller-manager" --kubeconfig "$PKI/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$PKI/controller-manager.kubeconfig" --authorization-kubeconfig "$PKI/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 20257 --leader-elect=false --use-service-account-credentials \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" --profiling=false
  start kube-scheduler "$KUBE_BIN/kube-scheduler" --kubeconfig "$PKI/scheduler.kubeconfig" \
    --authentication-kubeconfig "$PKI/scheduler.kubeconfig" --authorization-kubeconfig "$PKI/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 20259 --leader-elect=false --profiling=false

  PATH=$CTRD_BIN:/usr/bin:/bin start containerd "$CTRD_BIN/containerd" --config "$S/containerd/config.toml"
  wait_for 60 containerd "$CTRD_BIN/ctr" --address "$S/containerd/containerd.sock" version
  local tarball
  tarball=$(pause_tar)
  import_tar "$tarball"

  # kubelet adds iptables chains (KUBE-FIREWALL, a canary) for kube-proxy's
  # iptables mode, and kube-proxy in nftables mode sweeps iptables and IPVS
  # leftovers: neither is this cluster's, so both get a PATH without
  # iptables (kube-proxy gets nft and conntrack) and leave the host's alone.
  mkdir -p "$S/proxy-bin"
  ln -sf "$(command -v nft)" "$S/proxy-bin/nft"
  ln -sf "$(command -v conntrack)" "$S/proxy-bin/conntrack"
  PATH=/usr/local/bin:/usr/bin:/bin start kubelet "$KUBE_BIN/kubelet" --config "$S/kubelet/config.yaml" --kubeconfig "$PKI/kubelet.kubeconfig" \
    --root-dir "$S/kubelet" --cert-dir "$S/kubelet/pki" --hostname-override "$NODE" --node-ip "$NODE_IP" \
    --node-labels space-sandbox.dev/node=true
  PATH=$S/proxy-bin:/usr/bin:/bin start kube-proxy "$KUBE_BIN/kube-proxy" --kubeconfig "$PKI/kube-proxy.kubeconfig" --proxy-mode nftables \
    --hostname-override "$NODE" --cluster-cidr "$POD_CIDR" --bind-address 127.0.0.1 \
    --metrics-bind-address 127.0.0.1:20249 --healthz-bind-address 127.0.0.1:20256 \
    --conntrack-max-per-core 0 --conntrack-tcp-timeout-established 0 --conntrack-tcp-timeout-close-wait 0

  wait_for 120 "node $NODE" kubectl get node "$NODE"
  if ! kubectl wait --for=condition=Ready "node/$NODE" --timeout=180s >&2; then
    log "node $NODE not Ready; logs in $S/logs"
    exit 1
  fi
  wait_for 60 "the default service account" kubectl -n default get serviceaccount default
  log "cluster up in $(($(date +%s) - t0)) s; KUBECONFIG=$PKI/admin.kubeconfig"
  echo "$PKI/admin.kubeconfig"
}

# cgroup_pids: every process in the cluster's cgroup tree.
cgroup_pids() {
  local h
  for h in $(hierarchies); do
    if [ -d "$h/$CG" ]; then find "$h/$CG" -name cgroup.procs -exec cat {} + 2>/dev/null || true; fi
  done | sort -u
}

cmd_down() {
  [ -d "$S" ] || return 0
  # kubelet first, so it does not restart what is stopped below.
  if [ -f "$S/pids/kubelet" ]; then kill "$(cat "$S/pids/kubelet")" 2>/dev/null || true; fi
  local pids i
  for i in $(seq 1 30); do
    pids=$(cgroup_pids)
    [ -z "$pids" ] && break
    # TERM first, KILL after 10 s: everything in the cgroup was started by up.
    if [ "$i" -le 10 ]; then kill -TERM $pids 2>/dev/null || true; else kill -KILL $pids 2>/dev/null || true; fi
    sleep 1
  done
  [ -z "$(cgroup_pids)" ] || log "processes left in cgroup $CG: $(cgroup_pids | tr '\n' ' ')"
  # Mounts below the state dir: container rootfs, pod volumes, network namespaces.
  local m
  for m in $(awk -v s="$S/" 'index($5, s) == 1 { print $5 }' /proc/self/mountinfo | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
  local h
  for h in $(hierarchies); do
    [ -d "$h/$CG" ] && find "$h/$CG" -depth -type d -exec rmdir {} + 2>/dev/null
    [ -d "$h/$CG" ] && log "cgroup $h/$CG left"
  done
  # nftables tables kube-proxy made (absent before up).
  local fam
  for fam in ip ip6; do
    if ! grep -qx "table $fam kube-proxy" "$S/host/nft-tables" 2>/dev/null; then
      nft delete table "$fam" kube-proxy 2>/dev/null || true
    fi
  done
  # Host settings kubelet changed, and what the components made outside $S.
  local k
  for k in $SYSCTLS; do
    [ -s "$S/host/sysctl.$k" ] && sysctl -q -w "$k=$(cat "$S/host/sysctl.$k")" >/dev/null 2>&1 || true
  done
  local p
  # Only with up's record of the host: without it nothing says they are ours.
  if [ -f "$S/host/recorded" ]; then
    for p in /run/containerd /var/lib/cni /var/log/containers; do
      if [ ! -e "$S/host/existed.${p//\//_}" ]; then rm -rf "$p"; fi
    done
  fi
  find /var/log/containers -maxdepth 1 -lname "$S/*" -delete 2>/dev/null || true
  find /var/lib/cni/results -maxdepth 1 -name 'space-k8s-*' -delete 2>/dev/null || true
  rm -rf "$S"
  log "down"
}

cmd_status() {
  local n
  for n in "$S"/pids/*; do
    [ -f "$n" ] || continue
    if kill -0 "$(cat "$n")" 2>/dev/null; then echo "$(basename "$n"): running ($(cat "$n"))"; else echo "$(basename "$n"): stopped"; fi
  done
  running && kubectl get nodes -o wide
}

case "${1:-}" in
  build) cmd_build ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  image) cmd_image ;;
  postgres) cmd_postgres ;;
  postgres-image) postgres_tar ;;
  bin) echo "$KUBE_BIN" ;;
  helm) build_one helm "$HELM_VERSION" setup_helm; echo "$(bindir helm "$HELM_VERSION")/helm" ;;
  # built: every binary of build is cached, helm included (a run of
  # scripts/test.sh never starts a long build on its own).
  built) for d in "$ETCD_BIN" "$CTRD_BIN" "$CNI_BIN" "$KUBE_BIN" "$(bindir helm "$HELM_VERSION")"; do [ -f "$(dirname "$d")/DONE" ] || exit 1; done ;;
  env) echo "export KUBECONFIG=$PKI/admin.kubeconfig PATH=$KUBE_BIN:$CTRD_BIN:\$PATH" ;;
  *) echo "usage: $0 build|built|up|down|status|image|postgres|postgres-image|env|bin|helm" >&2; exit 2 ;;
esac

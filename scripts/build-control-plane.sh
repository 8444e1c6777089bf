#!/usr/bin/env bash
# Builds the local Kubernetes control plane the `cluster` test tier runs, from source, through
# the Go module proxy only (no binary downloads, nothing vendored or committed). Pinned:
#   k8s.io/kubernetes   v1.36.3  kube-apiserver, kube-controller-manager, kube-scheduler, kubectl
#                                (environment.toml pins kubernetes_version = "1.36"; v1.36.3 is
#                                the newest 1.36 patch the proxy serves)
#   go.etcd.io/etcd/server/v3 v3.6.8  the etcd k8s.io/kubernetes v1.36.3's go.mod requires
#   sigs.k8s.io/kwok    v0.8.0   the kwok controller (fake kubelets on fake nodes)
#   github.com/ray-project/kuberay/ray-operator v1.6.2  the operator (tag ray-operator/v1.6.2).
#                                The project pins v1.7.0 (its CRDs are what the plane installs),
#                                but proxy.golang.org does not serve that version's source:
#                                `go mod download github.com/ray-project/kuberay/ray-operator@v1.7.0`
#                                -> "reading https://proxy.golang.org/github.com/ray-project/kuberay/
#                                ray-operator/@v/v1.7.0.zip: 403 Forbidden / This module version is
#                                not available." (the same for its commit 59d663ae and v1.6.3); v1.6.2 is the
#                                newest version it serves.
#   sigs.k8s.io/kueue   v0.19.2
# Each part builds in its own tiny module under .work/cluster-build/<name>/ (k8s.io/kubernetes
# can only be imported with its staging modules k8s.io/* replaced by their published v0.36.x
# versions, since its own go.mod points them at ./staging). Binaries land in
# .work/cluster-bin/<name>-<version>/; a part whose binaries exist is skipped, so a second run
# costs nothing. Build times are appended to .work/cluster-bin/build-times.txt.
# Usage: scripts/build-control-plane.sh [part ...]   (parts: etcd kubernetes kwok kuberay kueue)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
K8S_VERSION=v1.36.3
K8S_STAGING_VERSION=v0.36.3
ETCD_VERSION=v3.6.8
KWOK_VERSION=v0.8.0
KUBERAY_VERSION=${KUBERAY_VERSION:-v1.6.2}
KUEUE_VERSION=v0.19.2
GO_DIRECTIVE=1.26.0

BUILD=$ROOT/.work/cluster-build
BIN=$ROOT/.work/cluster-bin
mkdir -p "$BUILD" "$BIN"
export GOFLAGS="-trimpath -buildvcs=false -mod=mod"
export GOCACHE=${GOCACHE_CLUSTER:-$ROOT/.work/go-build-cache}
export GOPROXY=${GOPROXY:-https://proxy.golang.org}
export GOTOOLCHAIN=local
export CGO_ENABLED=0

command -v go >/dev/null || { echo "build-control-plane: go not found on PATH (Go >= 1.26 is needed)" >&2; exit 1; }

# build <name> <version> <module-path@version ...> -- <main package[=binary name] ...>
build() {
  local name=$1 version=$2; shift 2
  local requires=() pkgs=()
  while [ "$1" != "--" ]; do requires+=("$1"); shift; done; shift
  pkgs=("$@")
  local out=$BIN/$name-$version dir=$BUILD/$name-$version
  local missing=0
  for p in "${pkgs[@]}"; do [ -x "$out/$(bin_name "$p")" ] || missing=1; done
  if [ $missing = 0 ]; then echo "build-control-plane: $name $version already built in $out"; return 0; fi
  mkdir -p "$dir" "$out"
  {
    echo "module raytrain-eks.local/cluster-build/$name"
    echo
    echo "go $GO_DIRECTIVE"
    echo
    echo "require ("
    for r in "${requires[@]}"; do echo "	${r%@*} ${r#*@}"; done
    echo ")"
    echo
    echo "tool ("
    for p in "${pkgs[@]}"; do echo "	${p%%=*}"; done
    echo ")"
    [ -f "$dir/replace.mod" ] && cat "$dir/replace.mod"
  } > "$dir/go.mod"
  local start=$SECONDS
  echo "build-control-plane: building $name $version (${pkgs[*]})"
  local targets=()
  for p in "${pkgs[@]}"; do targets+=("${p%%=*}"); done
  (cd "$dir" && go mod tidy && go build ${LDFLAGS:+-ldflags "$LDFLAGS"} -o "$out/" "${targets[@]}")
  for p in "${pkgs[@]}"; do
    [ "$(basename "${p%%=*}")" = "$(bin_name "$p")" ] || mv "$out/$(basename "${p%%=*}")" "$out/$(bin_name "$p")"
  done
  local took=$((SECONDS - start))
  echo "$(date -u +%FT%TZ) $name $version ${took}s cores=$(nproc) cache=$([ -n "${COLD:-}" ] && echo cold || echo as-found)" >> "$BIN/build-times.txt"
  echo "build-control-plane: $name $version built in ${took}s"
}

bin_name() { case $1 in *=*) echo "${1#*=}" ;; *) basename "$1" ;; esac; }

k8s_replaces() {
  # k8s.io/kubernetes' own go.mod lists every staging module as `k8s.io/x => ./staging/src/k8s.io/x`;
  # an importer points each at its published version instead.
  local dir=$BUILD/kubernetes-$K8S_VERSION
  mkdir -p "$dir"
  local mod
  mod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo
    echo "replace ("
    grep -E '^\s*k8s\.io/[a-z0-9-]+ => \./staging/' "$mod" | awk -v v="$K8S_STAGING_VERSION" '{print "\t" $1 " => " $1 " " v}'
    echo ")"
  } > "$dir/replace.mod"
}

module_dir() { go mod download -json "$1" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }

# The YAML the plane needs from the same module versions (read from the module cache, copied under
# .work/, never committed): KWOK's stages (without them kwok moves no node or pod), Kueue's CRDs
# and webhook configurations (what its Helm chart templates from the same files).
stage_kwok() {
  local src out=$BIN/kwok-$KWOK_VERSION/stages.yaml
  [ -s "$out" ] && return 0
  src=$(module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")/kustomize/stage
  for f in "$src"/node/fast/node-initialize.yaml "$src"/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
           "$src"/pod/fast/pod-ready.yaml "$src"/pod/fast/pod-complete.yaml "$src"/pod/fast/pod-delete.yaml; do
    echo "---"; cat "$f"
  done > "$out.tmp" && mv "$out.tmp" "$out"
}
stage_kueue() {
  local src out=$BIN/kueue-$KUEUE_VERSION
  [ -s "$out/webhooks.yaml" ] && return 0
  src=$(module_dir "sigs.k8s.io/kueue@$KUEUE_VERSION")/config/components
  for f in "$src"/crd/bases/*.yaml; do echo "---"; cat "$f"; done > "$out/crds.yaml"
  cp "$src/webhook/manifests.yaml" "$out/webhooks.yaml.tmp" && mv "$out/webhooks.yaml.tmp" "$out/webhooks.yaml"
}

# The CRDs the operator's own controllers watch that the stack's pinned CRD file (charts/crds/:
# RayCluster, RayJob) lacks: v1.6.2's main.go sets up the RayService controller unconditionally and
# the manager exits when its informer finds no CRD ("failed to wait for rayservice caches to
# sync"); on EKS the operator's Helm chart installs it from its crds/ folder.
stage_kuberay() {
  local out=$BIN/kuberay-$KUBERAY_VERSION/crds-extra.yaml
  [ -s "$out" ] && return 0
  cp "$(module_dir "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION")/config/crd/bases/ray.io_rayservices.yaml" "$out.tmp" \
    && mv "$out.tmp" "$out"
}

parts=("$@")
[ ${#parts[@]} = 0 ] && parts=(etcd kubernetes kwok kuberay kueue)
for part in "${parts[@]}"; do
  case $part in
    etcd) build etcd "$ETCD_VERSION" "go.etcd.io/etcd/server/v3@$ETCD_VERSION" -- go.etcd.io/etcd/server/v3=etcd ;;
    kubernetes)
      k8s_replaces
      # The version the binaries report (/version; clients such as Kueue compare it): what the
      # release build stamps in with hack/lib/version.sh, here from the pinned tag.
      minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
      LDFLAGS="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 \
-X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean" \
      build kubernetes "$K8S_VERSION" "k8s.io/kubernetes@$K8S_VERSION" -- \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
        k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl ;;
    kwok) build kwok "$KWOK_VERSION" "sigs.k8s.io/kwok@$KWOK_VERSION" -- sigs.k8s.io/kwok/cmd/kwok; stage_kwok ;;
    kuberay) build kuberay "$KUBERAY_VERSION" "github.com/ray-project/kuberay/ray-operator@$KUBERAY_VERSION" -- github.com/ray-project/kuberay/ray-operator=kuberay-operator; stage_kuberay ;;
    kueue) build kueue "$KUEUE_VERSION" "sigs.k8s.io/kueue@$KUEUE_VERSION" -- sigs.k8s.io/kueue/cmd/kueue; stage_kueue ;;
    *) echo "build-control-plane: unknown part '$part' (allowed: etcd kubernetes kwok kuberay kueue)" >&2; exit 2 ;;
  esac
done

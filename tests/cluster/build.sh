#!/usr/bin/env bash
# Builds, once per machine, the real control plane the cluster tests run (DESIGN §9) and the MinIO server the S3
# tests run, from Go modules at the versions pinned in versions.env, into
# ${EYRIE_TESTBED_CACHE:-~/.cache/eyrie-testbed}/<component>-<version>/: etcd, kube-apiserver and
# kube-controller-manager, the KubeRay operator, the Kueue controller and MinIO; and for the real node
# (tests/cluster/node.py) kubelet, kube-proxy and kube-scheduler from the same k8s.io/kubernetes module, and CoreDNS
# (hack/images.sh builds the node's sandbox image). The tests read KubeRay's and
# Kueue's CRDs (and Kueue's webhook manifests) from the Go module cache beside them. Kueue's cold build alone took
# 63 min on a 2-core machine at load 20.
# A warm machine returns in well under a second; nothing is written into the repository.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
cache="${EYRIE_TESTBED_CACHE:-$HOME/.cache/eyrie-testbed}"
export GOMODCACHE="$cache/go/mod" GOCACHE="$cache/go/build" GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0 GOWORK=off
niceness=(nice -n 15)

# build NAME VERSION MAIN_MODULE PACKAGE... : a throwaway module requiring MAIN_MODULE, so that the replace directives in
# its own go.mod (which point into its source tree) do not apply; EXTRA_GOMOD is appended to that go.mod. With
# MAIN_GO (a file) that file is the module's main package, built as bin/NAME instead of PACKAGE.
build() {
  local name=$1 version=$2 module=$3; shift 3
  local dest="$cache/$name-$version"
  [[ -f "$dest/.done" ]] && return 0
  echo "testbed: building $name $version (once per machine)" >&2
  local src t0=$SECONDS; src="$(mktemp -d)"
  printf 'module eyrie.dev/testbed/%s\n\ngo 1.26\n\nrequire %s %s\n%s\n' \
    "$name" "$module" "$version" "${EXTRA_GOMOD:-}" >"$src/go.mod"
  local out="$dest/bin/"
  if [[ -n "${MAIN_GO:-}" ]]; then cp "$MAIN_GO" "$src/main.go"; set -- .; out="$dest/bin/$name"; fi
  mkdir -p "$dest/bin"
  (cd "$src" && "${niceness[@]}" go build -trimpath -ldflags="-s -w ${LDFLAGS:-}" -o "$out" "$@")
  rm -rf "$src"
  touch "$dest/.done"
  echo "testbed: built $name $version in $((SECONDS - t0)) s" >&2
}

build etcd "$ETCD" go.etcd.io/etcd/server/v3 go.etcd.io/etcd/server/v3
[[ -x "$cache/etcd-$ETCD/bin/etcd" ]] || mv "$cache/etcd-$ETCD/bin/server" "$cache/etcd-$ETCD/bin/etcd"
build kuberay "$KUBERAY" github.com/ray-project/kuberay/ray-operator github.com/ray-project/kuberay/ray-operator
build kueue "$KUEUE" sigs.k8s.io/kueue sigs.k8s.io/kueue/cmd/kueue
build minio "$MINIO" github.com/minio/minio github.com/minio/minio

# k8s.io/kubernetes requires its staging modules at v0.0.0 (replaced by ./staging in its own tree): replace each
# with its published v0.N.x, the usual way of importing it. The node's binaries are a component of their own, so
# that adding them reused the control plane's build (and its Go build cache) as it was.
kubernetes() {
  local name=$1; shift
  [[ -f "$cache/$name-$KUBERNETES/.done" ]] && return 0
  local k8s_minor="${KUBERNETES#v1.}" gomod staging replaces version_pkg=k8s.io/component-base/version
  gomod="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')"
  staging="$(awk '$1 ~ /^k8s\.io\// && $2 == "=>" && $3 ~ /^\.\/staging\// {print $1}' "$gomod" | sort -u)"
  [[ -n "$staging" ]] || { echo "testbed: no staging modules in k8s.io/kubernetes@$KUBERNETES's go.mod" >&2; exit 1; }
  replaces="$(for m in $staging; do echo "replace $m => $m v0.$k8s_minor"; done)"
  EXTRA_GOMOD="$replaces" LDFLAGS="-X $version_pkg.gitVersion=$KUBERNETES -X $version_pkg.gitMajor=1 \
-X $version_pkg.gitMinor=${k8s_minor%%.*} -X $version_pkg.gitTreeState=clean" \
    build "$name" "$KUBERNETES" k8s.io/kubernetes "${@/#/k8s.io/kubernetes/cmd/}"
}
kubernetes kubernetes kube-apiserver kube-controller-manager
kubernetes kubernetes-node kubelet kube-proxy kube-scheduler

# CoreDNS (cluster DNS for Service names), built with the plugins node/coredns.go names
MAIN_GO="$here/node/coredns.go" build coredns "$COREDNS" github.com/coredns/coredns
#!/usr/bin/env bash
# What the test suite needs beside Python packages, once per machine: the real Kubernetes control plane and node
# binaries built from Go modules (tests/cluster/build.sh, cached outside the repository: seconds when warm),
# Debian's headless chromium for the report page, and for the real node (tests/cluster/node.py) Debian's containerd,
# runc, CNI plugins, iptables, conntrack and a static busybox (the node's test image); buildah, mmdebstrap and a
# static libc for hack/images.sh, which builds the images under images/ meanwhile. Packages are installed only when
# missing (needs root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
# command or file -> the Debian package that provides it
declare -A packages=([chromium]=chromium [containerd]=containerd [runc]=runc
  [/usr/lib/cni/bridge]=containernetworking-plugins [iptables]=iptables [conntrack]=conntrack
  [/bin/busybox]=busybox-static [buildah]=buildah [mmdebstrap]=mmdebstrap [zstd]=zstd [gcc]=gcc
  [/usr/include/stdio.h]=libc6-dev)
missing=()
for need in "${!packages[@]}"; do
  if [[ "$need" == /* ]]; then [[ -e "$need" ]] || missing+=("${packages[$need]}")
  else command -v "$need" >/dev/null || missing+=("${packages[$need]}"); fi
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# The Go builds (CPU) and the images (mostly downloads, package installs and layer writes) at once: on a fresh
# 2-core machine each fills the other's waits. Each says what it builds on its own lines; the first to fail fails this.
tests/cluster/build.sh 2>&1 | sed -u 's/^/[testbed] /' &
testbed=$!
# the images the chart and the specs name, built with buildah from images/ (hack/images.sh: seconds when current)
hack/images.sh 2>&1 | sed -u 's/^/[images] /' &
images=$!
status=0
wait "$testbed" || status=$?
wait "$images" || status=$?
exit "$status"

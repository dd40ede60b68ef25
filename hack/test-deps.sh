#!/usr/bin/env bash
# What the test suite needs beside Python packages, once per machine: the real Kubernetes control plane
# built from Go modules (tests/cluster/build.sh, cached outside the repository: seconds when warm) and
# Debian's headless chromium for the report page (installed only when missing; needs root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."
tests/cluster/build.sh
if ! command -v chromium >/dev/null; then
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi

#!/usr/bin/env bash
# Builds, without a Docker engine, the images the chart and the DatasetGenerations name (DESIGN §9): buildah (overlay
# storage, chroot isolation) runs each Dockerfile under images/ unchanged but for its ARGs, FROM a Debian bookworm +
# Python 3.11 base assembled here by mmdebstrap from Debian's packages (no container registry is reachable), into
#   ${EYRIE_TESTBED_CACHE:-~/.cache/eyrie-testbed}/images/NAME-VERSION.oci.tar
# each named inside as the chart names it (ghcr.io/eyrie-dev/eyrie-operator:VERSION, ...), so that
# `ctr -n k8s.io images import FILE` gives a node the chart's default images. Also the sandbox ("pause") image a
# containerd node needs, compiled from Kubernetes' own build/pause at the pinned version. Each archive is keyed by
# what goes into it (this script, its Dockerfile, the files of its build context, its build arguments, the base's
# recipe) in NAME-VERSION.oci.tar.key: a warm machine rebuilds nothing. A changed key rebuilds only what changed:
# buildah --layers keeps each Dockerfile step in its store (images/buildah) and reuses every step before the first
# whose inputs differ (the Dockerfiles install the dependencies before the wheel, so a source edit rebuilds only the
# wheel's layer), and an archive's unchanged layers are copied from the previous archive rather than compressed again
# (hack/oci_layers.py). Needs root (mmdebstrap, buildah), network to Debian's archive and the Python package index,
# and the testbed's Go module cache (tests/cluster/build.sh).
#   hack/images.sh [--check] [NAME...]   NAME: pause operator ray-worker extractor-cpu (default: all)
#   --check: build nothing; list what is missing or stale, exit 1 if anything is
# Before building anything stale it checks the free space of each filesystem the build writes to (the cache, buildah's
# store under it, buildah's temporary files in ${TMPDIR:-/var/tmp}): the CPU extractor's build peaks at about 15 GB
# (buildah commits its 4.7 GB torch layer through a temporary copy), and a full disk fails deep inside buildah with
# an error that says neither which disk nor how much. With less than EYRIE_IMAGES_MIN_FREE_GB (default 15; GB of
# 1024^3 bytes, as df -h counts) free it refuses, naming how much is needed, how much is free and where; a machine
# that knows its builds need less (only the small images stale, say) sets it lower. Root is needed only to build.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=../tests/cluster/versions.env
source tests/cluster/versions.env
cache="${EYRIE_TESTBED_CACHE:-$HOME/.cache/eyrie-testbed}"
out="$cache/images"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)"
check=0
[[ "${1:-}" == --check ]] && { check=1; shift; }
stale=()
if ((!check)); then
  mkdir -p "$out"
  exec 9>"$out/.lock"
  flock 9  # one build at a time per cache: a second caller waits, then finds the archives built
fi
# overlay: each layer stored once, as its own files (vfs copies the whole tree at every step: GBs per step of the
# extractor).
buildah=(nice -n 10 buildah --root "$out/buildah" --runroot "$out/buildah-run" --storage-driver overlay)
layers=(nice -n 10 python3 hack/oci_layers.py)
# The build machine's trust store, mounted into each RUN and never written into an image: pip inside the builds
# then trusts what the machine trusts (an egress proxy's own CA, say).
certs=()
[[ -f /etc/ssl/certs/ca-certificates.crt ]] && certs=(-v /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)

sha() { sha256sum | cut -c1-64; }

min_free_gb="${EYRIE_IMAGES_MIN_FREE_GB:-15}"
[[ "$min_free_gb" =~ ^[0-9]+([.][0-9]+)?$ ]] || {
  echo "images: EYRIE_IMAGES_MIN_FREE_GB must be a number of GB (got '$min_free_gb')" >&2; exit 2; }

can_build() {  # can_build NAME: before building a stale NAME, refuse unless every filesystem the build writes to has
  # min_free_gb free (checked before each stale image: each build takes room from the next) and this is root
  local where path dir avail mount
  for where in "the cache:$out" "buildah's store:$out/buildah" "buildah's temporary files:${TMPDIR:-/var/tmp}"; do
    path="${where#*:}" dir="${where#*:}"
    while [[ ! -e "$dir" ]]; do dir="$(dirname "$dir")"; done  # a store not made yet: where it will be
    read -r avail mount < <(df -Pk "$dir" | awk 'NR == 2 {print $4, $6}')
    awk -v a="$avail" -v n="$min_free_gb" 'BEGIN {exit !(a < n * 1048576)}' || continue
    echo "images: not building $1: a build needs $min_free_gb GB free on the filesystem holding ${where%%:*}" \
      "($path), and $mount has $(awk -v a="$avail" 'BEGIN {printf "%.1f", a / 1048576}') GB free. Free space" \
      "there, or set EYRIE_IMAGES_MIN_FREE_GB (now $min_free_gb; the CPU extractor's build peaks at about 15 GB)" \
      "lower on a machine that knows its builds need less" >&2
    exit 1
  done
  [[ "$(id -u)" -eq 0 ]] || {
    echo "images: $1 is stale, and building it needs root (mmdebstrap and buildah's chroot builds)" >&2; exit 1; }
}

fresh() {  # fresh NAME ARCHIVE KEY: whether ARCHIVE was built from KEY's inputs (with --check: note it if not)
  [[ -f "$2" && "$(cat "$2.key" 2>/dev/null)" == "$3" ]] && return 0
  ((check)) && { stale+=("$1 ($2)"); return 0; }
  return 1
}

# The base: what python:3.11-slim-bookworm is (Debian bookworm's minimal set, its Python 3.11 and pip, CA
# certificates), from Debian's own packages. EXTERNALLY-MANAGED goes: the image's Python is the image's to manage.
# Plus wget, which rayproject/ray has and KubeRay's probes of every Ray container run (`bash -c "wget ..."`).
base_options=(--variant=minbase --include=python3,python3-pip,python-is-python3,ca-certificates,wget
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*'
  --customize-hook='rm -f "$1"/usr/lib/python3.11/EXTERNALLY-MANAGED "$1"/etc/resolv.conf "$1"/etc/hostname'
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*')
base_sources=("deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main")
base_key="$(printf '%s\n' "${base_options[@]}" "${base_sources[@]}" | sha)"
base="localhost/eyrie-testbed/python:3.11-bookworm-${base_key:0:12}"

timed() {  # timed WHAT COMMAND...: runs it, logs its wall time and the load to images/build-times.log
  local what=$1 start=$SECONDS; shift
  "$@"
  printf '%s %s %ss load %s\n' "$(date -u +%FT%TZ)" "$what" "$((SECONDS - start))" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$out/build-times.log" >&2
}

cleaned=0
clean_store() {  # what an interrupted build left in the store (under the lock nothing else is building): its
  # containers; its images stay until prune_store (its finished steps are the next build's cache)
  ((cleaned)) && return 0
  rm -rf --one-file-system "$out/storage" "$out/run"  # the vfs store of earlier versions of this script
  "${buildah[@]}" rm --all >/dev/null
  cleaned=1
}

built=0
prune_store() {  # after a build: the images no later build can reuse (hack/oci_layers.py prune)
  ((built)) || return 0
  timed "store prune" "${layers[@]}" prune "${buildah[@]}" >&2
}

ensure_base() {  # the base image in buildah's store, assembled when missing
  clean_store
  "${buildah[@]}" inspect --type image "$base" >/dev/null 2>&1 && return 0
  echo "images: assembling the base $base with mmdebstrap (once per machine)" >&2
  local tmp c; tmp="$(mktemp -d)"
  timed "base mmdebstrap" nice -n 10 mmdebstrap --quiet "${base_options[@]}" bookworm "$tmp/rootfs.tar" "${base_sources[@]}"
  c="$("${buildah[@]}" from scratch)"
  "${buildah[@]}" add "$c" "$tmp/rootfs.tar" / >/dev/null
  "${buildah[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
    --cmd '["python3"]' --label org.opencontainers.image.title=eyrie-testbed-python \
    --label org.opencontainers.image.description="Debian bookworm, its Python 3.11 and pip (mmdebstrap)" "$c"
  "${buildah[@]}" commit --quiet --rm "$c" "$base" >/dev/null
  rm -rf "$tmp"
  local old  # earlier bases: nothing builds on them any more
  for old in $("${buildah[@]}" images --noheading --format '{{.Name}}:{{.Tag}}' --filter reference="${base%:*}"); do
    [[ "$old" == "$base" ]] || "${buildah[@]}" rmi "$old" >/dev/null
  done
}

# The files of a Dockerfile's build context: what its .dockerignore lets through (only `!` lines after `*`).
context_files() {
  local ignore=$1 paths
  mapfile -t paths < <(sed -n 's:^!\(.*[^/]\)/*$:\1:p' "$ignore")
  find "${paths[@]}" -type f ! -path '*/__pycache__/*' | LC_ALL=C sort
}

# build NAME REF DOCKERFILE [BUILD ARGS...]: the Dockerfile built from the repository root into NAME-VERSION.oci.tar
build() {
  local name=$1 ref=$2 file=$3; shift 3
  local archive="$out/$name-$version.oci.tar" ignore="$file.dockerignore" files key
  mapfile -t files < <(context_files "$ignore")
  key="$({ printf '%s\n' "$ref" "$base" "$@"; sha256sum hack/images.sh "$file" "$ignore" "${files[@]}"; } | sha)"
  fresh "$name" "$archive" "$key" && return 0
  can_build "$name"
  ensure_base
  echo "images: building $name ($ref) from $file" >&2
  timed "$name build" "${buildah[@]}" bud --quiet --isolation chroot --pull-never --layers \
    -f "$file" --ignorefile "$ignore" "${certs[@]}" -t "$ref" "$@" . >/dev/null
  publish "$name" "$ref" "$archive" "$key"
}

# publish NAME REF ARCHIVE KEY: the image from the store into its archive (atomically); the image stays in the store,
# for the next build's cache. Layers are zstd-compressed (containerd reads them): gzip of a 5 GB layer took minutes
# of a 2-core machine, zstd a quarter of that, smaller (buildah 1.28 ignores --disable-compression for OCI). Only the
# layers the previous archive lacks are exported and compressed; the others are copied from it (hack/oci_layers.py).
publish() {
  local name=$1 ref=$2 archive=$3 key=$4 layout="$out/.layout-$name"
  rm -rf "$layout" "$archive.tmp"
  "${layers[@]}" placeholders "$archive" "$layout" >/dev/null
  timed "$name push" "${buildah[@]}" push --quiet --compression-format zstd "$ref" "oci:$layout:$ref"
  timed "$name archive" "${layers[@]}" archive "$layout" "$ref" "$archive.tmp" "$archive" >&2
  rm -rf "$layout"
  mv "$archive.tmp" "$archive"
  echo "$key" >"$archive.key"
  built=1
  echo "images: $archive ($(du -h "$archive" | cut -f1))" >&2
}

# The pause image, from Kubernetes' own source and Dockerfile at the pinned version (what registry.k8s.io serves).
pause() {
  local src="$cache/go/mod/k8s.io/kubernetes@$KUBERNETES/build/pause"
  [[ -d "$src" ]] || GOMODCACHE="$cache/go/mod" GOFLAGS=-mod=mod GOTOOLCHAIN=local \
    go mod download "k8s.io/kubernetes@$KUBERNETES"
  local tag arch ref archive key
  tag="$(sed -n 's/^TAG ?= //p' "$src/Makefile")"
  arch="$(dpkg --print-architecture)"
  ref="registry.k8s.io/pause:$tag"
  archive="$out/pause-$tag.oci.tar"
  key="$({ printf '%s\n' "$ref" "$arch"; gcc --version | head -1; sha256sum hack/images.sh
    cat "$src/Dockerfile" "$src/linux/pause.c" | sha; } | sha)"
  fresh pause "$archive" "$key" && return 0
  can_build pause
  echo "images: building $ref from $src" >&2
  clean_store
  local ctx; ctx="$(mktemp -d)"
  mkdir "$ctx/bin"
  cp "$src/Dockerfile" "$ctx/"
  # the Makefile's flags: -Os -Wall -Werror -static, the version string pause -v prints
  gcc -Os -Wall -Werror -static -DVERSION="v$tag-$KUBERNETES" -o "$ctx/bin/pause-linux-$arch" "$src/linux/pause.c"
  timed "pause build" "${buildah[@]}" bud --quiet --isolation chroot --layers --build-arg BASE=scratch \
    --build-arg ARCH="$arch" -t "$ref" "$ctx" >/dev/null
  rm -rf "$ctx"
  publish pause "$ref" "$archive" "$key"
}

all=(pause operator ray-worker extractor-cpu)
names=("$@")
((${#names[@]})) || names=("${all[@]}")
for name in "${names[@]}"; do
  case "$name" in
    pause) pause ;;
    operator) build operator "ghcr.io/eyrie-dev/eyrie-operator:$version" images/operator.Dockerfile \
      --build-arg PYTHON_IMAGE="$base" ;;
    ray-worker) build ray-worker "ghcr.io/eyrie-dev/eyrie-ray-worker:$version" images/ray-worker.Dockerfile \
      --build-arg RAY_IMAGE="$base" ;;
    # TORCH_INDEX_URL empty: pip's default index (the CPU index is not reachable here), so torch is its CUDA build
    extractor-cpu) build extractor-cpu "ghcr.io/eyrie-dev/eyrie-extractor:$version-cpu" images/extractor.Dockerfile \
      --target cpu --build-arg PYTHON_IMAGE="$base" --build-arg TORCH_INDEX_URL= ;;
    *) echo "images: unknown image $name (one of: ${all[*]})" >&2; exit 2 ;;
  esac
done
prune_store
if ((check)); then
  ((${#stale[@]} == 0)) || { printf 'images: missing or stale (run hack/images.sh): %s\n' "${stale[@]}" >&2; exit 1; }
fi

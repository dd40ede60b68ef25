"""The images hack/images.sh built with buildah (the README's test command builds them, through hack/test-deps.sh):
each OCI archive exists, is current (keyed by this tree's sources), is named inside as the chart names it (so
`ctr -n k8s.io images import` gives a node the chart's default images), declares a numeric non-root user, and runs:
`eyrie --version` inside it, unpacked here layer by layer (whiteouts applied), on a read-only root filesystem, as the
image's user with the image's environment, prints the chart's appVersion; the generation job runs in the Ray worker
image and the extraction Job's command in the CPU extractor image on what it generated. Each layer is unpacked once
(beside the archives in the testbed cache, keyed by its diff ID, which its content is checked against, as a node
keeps its snapshots), so an image rebuilt after a source edit costs only its new layers here too.

A missing archive fails (it is what the node's tests run); a stale one fails under CI=true and is skipped elsewhere
(a developer's edited tree: `hack/images.sh` rebuilds what changed).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.integration  # tier (tests/conftest.py): runs the images' archives (buildah, chroot processes)

ROOT = Path(__file__).resolve().parents[2]
CHART = yaml.safe_load((ROOT / "charts/eyrie/Chart.yaml").read_text())
VALUES = yaml.safe_load((ROOT / "charts/eyrie/values.yaml").read_text())
VERSION = CHART["appVersion"]
SCRIPT = ROOT / "hack" / "images.sh"
CHROOT = shutil.which("chroot") or "/usr/sbin/chroot"


def chart_ref(value: dict[str, str], suffix: str = "") -> str:
    return f"{value['repository']}:{value['tag']}{suffix}"


# archive name -> the image reference inside it (the chart's, and the CPU extractor's `-cpu` tag beside it)
IMAGES = {
    "operator": chart_ref(VALUES["image"]),
    "ray-worker": chart_ref(VALUES["workloadImages"]["rayWorker"]),
    "extractor-cpu": chart_ref(VALUES["workloadImages"]["extractor"], "-cpu"),
}
PAUSE_VERSION = "3.10.2"  # Kubernetes' build/pause/Makefile TAG at the pinned Kubernetes


def cache_dir() -> Path:
    return Path(os.environ.get("EYRIE_TESTBED_CACHE") or Path.home() / ".cache" / "eyrie-testbed")


def archive_file(name: str) -> Path:
    return cache_dir() / "images" / f"{name}-{PAUSE_VERSION if name == 'pause' else VERSION}.oci.tar"


def archive_path(name: str) -> Path:
    path = archive_file(name)
    if not path.is_file():
        pytest.fail(f"{path} is missing: build the images with `{SCRIPT}` (hack/test-deps.sh runs it)")
    return path


@dataclass(frozen=True)
class Image:
    ref: str
    digest: str  # the manifest's
    config: dict[str, Any]
    layers: list[dict[str, Any]]


def read_image(path: Path) -> Image:
    with tarfile.open(path) as t:
        def blob(desc: dict[str, Any]) -> Any:
            f = t.extractfile(f"blobs/{desc['digest'].replace(':', '/')}")
            assert f is not None
            return json.load(f)

        index = json.load(t.extractfile("index.json"))  # type: ignore[arg-type]
        [desc] = index["manifests"]
        manifest = blob(desc)
        return Image(desc["annotations"]["org.opencontainers.image.ref.name"], desc["digest"],
                     blob(manifest["config"]), manifest["layers"])


DECOMPRESS = {"gzip": ["gzip", "-dc"], "zstd": ["zstd", "-dcq"], "tar": ["cat"]}


def unpack_layer(outer: tarfile.TarFile, layer: dict[str, Any], diff_id: str, dest: Path) -> None:
    """One layer as a lower directory of an overlay, as containerd's overlayfs snapshotter keeps it: its files (GNU tar
    extracts them) and its whiteouts as overlay's (`.wh.NAME`: a 0:0 character device NAME hiding the lower layers'
    entry; `.wh..wh..opq`: the directory marked opaque). The uncompressed stream must have the image config's diff
    ID for this layer (what the archive's blob claims to be)."""
    src = outer.extractfile(f"blobs/{layer['digest'].replace(':', '/')}")
    assert src is not None, layer
    unzip = subprocess.Popen(DECOMPRESS[layer["mediaType"].rpartition("+")[2].rpartition(".")[2]],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    untar = subprocess.Popen(["tar", "-x", "-v", "-f", "-", "-C", str(dest), "--numeric-owner", "--same-permissions",
                              "--same-owner"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert unzip.stdin and unzip.stdout and untar.stdin and untar.stdout and untar.stderr
    digest = hashlib.sha256()
    with ThreadPoolExecutor(3) as pool:
        def feed() -> None:
            shutil.copyfileobj(src, unzip.stdin, 1 << 20)
            unzip.stdin.close()

        fed = pool.submit(feed)
        names = pool.submit(untar.stdout.read)
        err = pool.submit(untar.stderr.read)
        while chunk := unzip.stdout.read(1 << 20):
            digest.update(chunk)
            untar.stdin.write(chunk)
        untar.stdin.close()
        fed.result()
        listing, errors = names.result(), err.result()
    assert unzip.wait() == 0 and untar.wait() == 0, f"unpacking {layer['digest']}: {errors.decode(errors='replace')}"
    assert f"sha256:{digest.hexdigest()}" == diff_id, f"layer {layer['digest']} is not the diff ID {diff_id}"
    for name in listing.decode(errors="surrogateescape").splitlines():
        parent, _, base = name.rstrip("/").rpartition("/")
        if base == ".wh..wh..opq":
            (dest / parent / base).unlink()
            os.setxattr(dest / parent, "trusted.overlay.opaque", b"y")
        elif base.startswith(".wh."):
            (dest / parent / base).unlink()
            os.mknod(dest / parent / base[len(".wh."):], 0o600 | stat.S_IFCHR, os.makedev(0, 0))


def run_in(layers: list[Path], image: Image, *argv: str, tmp: Path | None = None, writable: Path | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """argv in the image as the node runs it: the image's user and only the image's environment, /proc mounted, /tmp
    writable (`tmp`, a host folder, as an emptyDir; else a fresh tmpfs). The root is the image's layers (bottom
    first) as an overlay's lower directories, read-only (as the chart asks of the operator's pod), or with `writable`
    (a host folder) under an upper directory there, as a container's writable layer: what the Ray and extraction pods
    get, since nothing asks them for a read-only root. `env` is added to the image's (as a pod's env from its
    Secrets)."""
    cfg = image.config["config"]
    lower = ":".join(str(p) for p in reversed(layers))
    with tempfile.TemporaryDirectory(prefix="eyrie-image-root-") as mountpoint:
        root = writable / "merged" if writable else Path(mountpoint)
        if writable:
            for d in ("upper", "work", "merged"):
                (writable / d).mkdir(parents=True, exist_ok=True)
            mount_root = 'mount -t overlay overlay -o "lowerdir=$0,upperdir=$W/upper,workdir=$W/work" "$R"'
        elif len(layers) == 1:  # an overlay needs two lower directories when it has no upper one
            mount_root = 'mount --bind "$0" "$R"; mount -o remount,bind,ro "$R"'
        else:  # no upper directory: read-only
            mount_root = 'mount -t overlay overlay -o "lowerdir=$0" "$R"'
        mount_tmp = 'mount --bind "$T" "$R/tmp"' if tmp else 'mount -t tmpfs -o size=64m tmpfs "$R/tmp"'
        script = (f'set -e; {mount_root}; [ ! -d "$R/proc" ] || mount -t proc proc "$R/proc"; '
                  f'[ ! -d "$R/tmp" ] || {{ {mount_tmp}; }}; exec env -i "$@"')
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, lower, *cfg.get("Env", []),
               *(f"{k}={v}" for k, v in (env or {}).items()), CHROOT, f"--userspec={cfg['User']}", str(root), *argv]
        mounts = {**os.environ, "R": str(root), "T": str(tmp or ""), "W": str(writable or "")}
        return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=mounts)


def rootfs(name: str) -> tuple[Image, list[Path]]:
    """The archive's layers, each unpacked once (keyed by its diff ID, as a node keeps its snapshots) beside the
    archives in the testbed cache, so a rebuilt image costs only its new layers; layers no current archive has, and
    the whole trees earlier versions of this test kept there, are removed."""
    path = archive_path(name)
    image = read_image(path)
    store = path.parent / "rootfs"
    layers = store / "layers"
    layers.mkdir(parents=True, exist_ok=True)
    diff_ids = image.config["rootfs"]["diff_ids"]
    current = {d for other in [*IMAGES, "pause"] if (p := archive_file(other)).is_file()
               for d in read_image(p).config["rootfs"]["diff_ids"]} | set(diff_ids)
    for old in [*(p for p in store.iterdir() if p != layers), *(p for p in layers.iterdir() if not p.name.startswith(
            ".") and f"sha256:{p.name}" not in current)]:
        subprocess.run(["rm", "-rf", "--one-file-system", str(old)], check=False)
    dirs = []
    with tarfile.open(path) as t:
        for layer, diff_id in zip(image.layers, diff_ids, strict=True):
            dest = layers / diff_id.partition(":")[2]
            if not dest.is_dir():
                partial = layers / f".{dest.name}.{os.getpid()}"
                subprocess.run(["rm", "-rf", "--one-file-system", str(partial)], check=False)
                partial.mkdir()
                unpack_layer(t, layer, diff_id, partial)
                partial.chmod(0o755)  # the image's `/`
                try:
                    partial.rename(dest)
                except OSError:  # another test process unpacked it meanwhile
                    subprocess.run(["rm", "-rf", "--one-file-system", str(partial)], check=False)
            dirs.append(dest)
    return image, dirs


@pytest.fixture(scope="module")
def unpacked() -> Any:
    if os.geteuid() != 0:
        pytest.fail("running an image here needs root (a private mount namespace and chroot), as the build does")
    return rootfs


def test_every_archive_is_current():
    """Built from this tree: hack/images.sh --check recomputes each key from the sources and compares."""
    r = subprocess.run(["bash", str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    if r.returncode != 0 and os.environ.get("CI") != "true":
        pytest.skip(f"images older than this tree (CI fails here; run {SCRIPT}):\n{r.stderr}")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_archive_names_the_charts_image_and_a_numeric_non_root_user(name):
    image = read_image(archive_path(name))
    assert image.ref == IMAGES[name]
    cfg = image.config["config"]
    uid, _, gid = cfg["User"].partition(":")
    assert uid.isdigit() and gid.isdigit() and int(uid) != 0, cfg["User"]
    assert cfg["Labels"]["org.opencontainers.image.version"] == VERSION
    assert image.config["architecture"] and image.config["os"] == "linux"


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_eyrie_version_inside_prints_the_charts_app_version(name, unpacked):
    image, rootfs = unpacked(name)
    r = run_in(rootfs, image, "eyrie", "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"eyrie {VERSION}"


def test_the_root_filesystem_really_is_read_only(unpacked):
    """The harness itself: a write outside /tmp fails, one under /tmp works."""
    image, rootfs = unpacked("operator")
    r = run_in(rootfs, image, "python", "-c", "open('/tmp/x', 'w').write('ok'); open('/etc/x', 'w')")
    assert r.returncode != 0 and "Read-only file system" in r.stderr, r.stderr


def test_operator_image_runs_the_operators_imports_without_torch(unpacked):
    image, rootfs = unpacked("operator")
    assert image.config["config"]["Entrypoint"] == ["eyrie"]
    code = ("import importlib.util as u, kopf, kubernetes_asyncio, eyrie.operator.main; "
            "print(u.find_spec('torch'), u.find_spec('transformers'))")
    r = run_in(rootfs, image, "python", "-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["None", "None"]


def test_ray_worker_image_has_the_ray_the_driver_pins_and_no_torch(unpacked):
    image, rootfs = unpacked("ray-worker")
    r = run_in(rootfs, image, "ray", "--version")
    assert r.returncode == 0, r.stderr
    ray_version = next(s["value"] for s in _args("ray-worker") if s["name"] == "RAY_VERSION")
    assert f"version {ray_version}" in r.stdout
    r = run_in(rootfs, image, "python", "-c", "import importlib.util as u; print(u.find_spec('torch'))")
    assert (r.returncode, r.stdout.strip()) == (0, "None"), r.stderr


def job_spec(tmp: Path, extraction: dict[str, Any], output: str) -> None:
    """A small run: prompts and the spec under the pods' /tmp (a host folder here), the output on S3 (MinIO)."""
    tmp.mkdir()
    tmp.chmod(0o1777)
    (tmp / "p.jsonl").write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"Say {i}."}]}) + "\n"
                                         for i in range(6)))
    spec = {"sources": [{"name": "p", "uri": "/tmp/p.jsonl", "format": "openai"}],
            "target": {"model": "sim/model", "tokenizer": "bundled:deepseek-v4", "chatFormat": "deepseek-v4"},
            "api": {"baseUrl": "simulated", "maxConcurrency": 4},
            "tools": {"gate": {"canarySamples": 2, "minToolCallRate": 0.0}},
            "budget": {"maxUSD": "1", "pricing": {"inputPerMillion": "0.6", "outputPerMillion": "2.5"}},
            "generation": {"shards": 2}, "extraction": extraction, "output": {"uri": output}}
    (tmp / "spec.yaml").write_text(yaml.safe_dump(spec))


GENERATE = "cd /tmp && exec eyrie run /tmp/spec.yaml --no-progress --inline --until samples"


def test_ray_worker_image_runs_the_generation_job(unpacked, tmp_path, s3_bucket, s3_env):
    """What a RayJob's head runs (`eyrie run SPEC --until samples`), inside the image: the simulated provider on
    loopback, the bundled tokenizer, the output on S3 with the credentials in the environment (a pod's Secrets)."""
    from eyrie.jobs.store import open_store

    image, rootfs = unpacked("ray-worker")
    job_spec(tmp_path / "tmp", {"enabled": False}, f"{s3_bucket}/out")
    r = run_in(rootfs, image, "sh", "-c", GENERATE, tmp=tmp_path / "tmp", writable=tmp_path / "ray",
               env=s3_env.env())
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads(open_store(f"{s3_bucket}/out").get("manifest.json"))
    assert manifest["reconstruction"]["samples"]["kept"] == 6


def test_the_cpu_extractor_image_extracts_what_the_ray_worker_image_generated(unpacked, tmp_path, s3_bucket,
                                                                               s3_env):
    """The data plane across the two images, as a cluster runs it: generation in the Ray worker image, then the
    extraction Job's command (`eyrie extract SPEC --index 0 --count 1`) in the CPU extractor image, on a tiny Llama
    built from its config (no download), writing hidden states beside the samples on S3."""
    from eyrie.jobs.store import open_store

    out = f"{s3_bucket}/out"
    job_spec(tmp_path / "tmp", {"enabled": True, "engine": "transformers", "model": "builtin:tiny-llama",
                                "dtype": "float32", "pods": 1}, out)
    image, rootfs = unpacked("ray-worker")
    r = run_in(rootfs, image, "sh", "-c", GENERATE, tmp=tmp_path / "tmp", writable=tmp_path / "ray",
               env=s3_env.env())
    assert r.returncode == 0, r.stderr[-3000:]
    image, rootfs = unpacked("extractor-cpu")
    r = run_in(rootfs, image, "sh", "-c", "cd /tmp && exec eyrie extract /tmp/spec.yaml --index 0 --count 1",
               tmp=tmp_path / "tmp", writable=tmp_path / "extractor", env=s3_env.env())
    assert r.returncode == 0, r.stderr[-3000:]
    store = open_store(out)
    extraction = json.loads(store.get("manifest.json"))["extraction"]
    assert (extraction["engine"], extraction["samples"]) == ("transformers", 6), extraction
    files = [f for s in extraction["shards"] for f in s["files"]]
    assert files and all(len(store.get(f)) > 0 for f in files), files


def test_cpu_extractor_image_imports_torch_and_transformers(unpacked):
    image, rootfs = unpacked("extractor-cpu")
    r = run_in(rootfs, image, "python", "-c", "import torch, transformers; print(torch.__version__)")
    assert r.returncode == 0, r.stderr
    torch_version = next(s["value"] for s in _args("extractor") if s["name"] == "TORCH_VERSION")
    assert r.stdout.strip().split("+")[0] == torch_version


def test_pause_image_is_kubernetes_pause_as_nobody(unpacked):
    image, rootfs = unpacked("pause")
    assert image.ref == f"registry.k8s.io/pause:{PAUSE_VERSION}"
    assert image.config["config"]["User"] == "65535:65535"
    assert image.config["config"]["Entrypoint"] == ["/pause"]
    r = run_in(rootfs, image, "/pause", "-v")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"pause.c v{PAUSE_VERSION}-")


def _args(dockerfile: str) -> list[dict[str, str]]:
    from dockerfile_parse import DockerfileParser

    out = []
    for s in DockerfileParser(path=str(ROOT / "images" / f"{dockerfile}.Dockerfile")).structure:
        if s["instruction"] == "ARG" and "=" in s["value"]:
            name, _, value = s["value"].partition("=")
            out.append({"name": name, "value": value})
    return out

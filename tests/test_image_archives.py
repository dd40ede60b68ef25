"""The images hack/images.sh built with buildah (the README's test command builds them, through hack/test-deps.sh):
each OCI archive exists, is current (keyed by this tree's sources), is named inside as the chart names it (so
`ctr -n k8s.io images import` gives a node the chart's default images), declares a numeric non-root user, and runs:
`eyrie --version` inside it, unpacked here layer by layer (whiteouts applied), on a read-only root filesystem, as the
image's user with the image's environment, prints the chart's appVersion; the generation job runs in the Ray worker
image and the extraction Job's command in the CPU extractor image on what it generated. Each archive is unpacked
once (beside it in the testbed cache, keyed by its manifest's digest, as a node keeps its snapshots).

A missing archive fails (it is what the node's tests run); a stale one fails under CI=true and is skipped elsewhere
(a developer's edited tree: `hack/images.sh` rebuilds what changed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
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


def archive_path(name: str) -> Path:
    version = PAUSE_VERSION if name == "pause" else VERSION
    path = cache_dir() / "images" / f"{name}-{version}.oci.tar"
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


def unpack(path: Path, image: Image, dest: Path) -> None:
    """The image's root filesystem: each layer in order (GNU tar extracts), its whiteouts first removing what the
    lower layers left (`.wh.NAME`: that entry; `.wh..wh..opq`: everything in that directory)."""
    with tarfile.open(path) as t:
        for layer in image.layers:
            blob = f"blobs/{layer['digest'].replace(':', '/')}"
            z = {"gzip": ["--gzip"], "zstd": ["--zstd"]}.get(layer["mediaType"].rpartition("+")[2], [])
            names = tar(t, blob, ["-t", *z]).splitlines()
            for name in names:
                parent, _, base = name.rstrip("/").rpartition("/")
                if base == ".wh..wh..opq":
                    for child in (dest / parent).iterdir() if (dest / parent).is_dir() else ():
                        remove(child)
                elif base.startswith(".wh."):
                    remove(dest / parent / base[len(".wh."):])
            tar(t, blob, ["-x", *z, "-C", str(dest), "--numeric-owner", "--same-permissions", "--same-owner",
                          "--exclude=.wh.*", "--exclude=*/.wh.*"])


def tar(outer: tarfile.TarFile, blob: str, args: list[str]) -> str:
    """GNU tar on one blob of the archive, fed through a pipe; its listing when `-t`."""
    src = outer.extractfile(blob)
    assert src is not None, blob
    with subprocess.Popen(["tar", *args, "-f", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        with ThreadPoolExecutor(1) as pool:
            listing = pool.submit(proc.stdout.read)
            shutil.copyfileobj(src, proc.stdin, 1 << 20)
            proc.stdin.close()
            out = listing.result()
        err = proc.stderr.read() if proc.stderr else b""
    assert proc.returncode == 0, f"tar {' '.join(args)} {blob}: {err.decode(errors='replace')}"
    return out.decode(errors="surrogateescape")


def remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p)
    elif p.exists() or p.is_symlink():
        p.unlink()


def run_in(rootfs: Path, image: Image, *argv: str, tmp: Path | None = None, writable: Path | None = None,
           env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """argv in the image as the node runs it: the image's user and only the image's environment, /proc mounted, /tmp
    writable (`tmp`, a host folder, as an emptyDir; else a fresh tmpfs). The root is read-only (as the chart asks of
    the operator's pod), or with `writable` (a host folder) an overlay on the unpacked tree, as a container's writable
    layer: what the Ray and extraction pods get, since nothing asks them for a read-only root. `env` is added to the
    image's (as a pod's env from its Secrets)."""
    cfg = image.config["config"]
    root = writable / "merged" if writable else rootfs
    if writable:
        for d in ("upper", "work", "merged"):
            (writable / d).mkdir(parents=True, exist_ok=True)
        mount_root = 'mount -t overlay overlay -o "lowerdir=$0,upperdir=$W/upper,workdir=$W/work" "$W/merged"'
    else:
        mount_root = 'mount --bind "$0" "$0"; mount -o remount,bind,ro "$0"'
    mount_tmp = 'mount --bind "$T" "$R/tmp"' if tmp else 'mount -t tmpfs -o size=64m tmpfs "$R/tmp"'
    script = (f'set -e; {mount_root}; [ ! -d "$R/proc" ] || mount -t proc proc "$R/proc"; '
              f'[ ! -d "$R/tmp" ] || {{ {mount_tmp}; }}; exec env -i "$@"')
    cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, str(rootfs), *cfg.get("Env", []),
           *(f"{k}={v}" for k, v in (env or {}).items()), CHROOT, f"--userspec={cfg['User']}", str(root), *argv]
    mounts = {**os.environ, "R": str(root), "T": str(tmp or ""), "W": str(writable or "")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=mounts)


def rootfs(name: str) -> tuple[Image, Path]:
    """The archive's root filesystem, unpacked once per archive (keyed by its manifest's digest, like a node's
    snapshots) beside it in the testbed cache; trees of the image's older archives are removed."""
    path = archive_path(name)
    image = read_image(path)
    trees = path.parent / "rootfs"
    dest = trees / f"{name}-{image.digest.partition(':')[2][:16]}"
    if not dest.is_dir():
        trees.mkdir(exist_ok=True)
        for old in trees.glob(f"{name}-*"):
            subprocess.run(["rm", "-rf", "--one-file-system", str(old)], check=False)
        partial = trees / f".{dest.name}.{os.getpid()}"
        partial.mkdir()
        unpack(path, image, partial)
        partial.chmod(0o755)  # the image's `/`
        partial.rename(dest)
    return image, dest


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

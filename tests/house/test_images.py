"""The Dockerfiles under images/, read statically: each parses, pins its bases by tag, runs as a numeric non-root
user, installs the wheel of the version the chart names, its wheel stage (same COPYs, same pip command, run here)
really produces that wheel, and the extractor's two variants (GPU: SGLang's image; CPU: --target cpu) install the
same wheel with the same entry point. Layer caching: each image installs its dependencies, listed from
pyproject.toml alone by images/requirements.py (what the wheel's metadata requires, checked here), in a layer before
the wheel's, and the wheel on top with --no-index. hack/images.sh builds them with buildah
(tests/house/test_image_archives.py runs what it built); the GPU extractor cannot be built here (its base is SGLang's
CUDA image), hence the static checks.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.version import Version

from eyrie.jobs.evaluate.plan import SPECFORGE_VERSION

ROOT = Path(__file__).resolve().parents[2]
IMAGES = ROOT / "images"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
VERSION = PYPROJECT["project"]["version"]
CHART = yaml.safe_load((ROOT / "charts/eyrie/Chart.yaml").read_text())
VALUES = yaml.safe_load((ROOT / "charts/eyrie/values.yaml").read_text())

# Dockerfile -> the chart value that names its image
IMAGE_VALUES = {
    "operator": VALUES["image"],
    "ray-worker": VALUES["workloadImages"]["rayWorker"],
    "extractor": VALUES["workloadImages"]["extractor"],
}
WHEEL = f"eyrie-{VERSION}-py3-none-any.whl"


def parse(name: str) -> DockerfileParser:
    return DockerfileParser(path=str(IMAGES / f"{name}.Dockerfile"))


def stages(df: DockerfileParser) -> dict[str, list[dict[str, Any]]]:
    """Each stage's instructions, by its `AS` name ("" for the unnamed final stage)."""
    froms = [i for i, s in enumerate(df.structure) if s["instruction"] == "FROM"]
    out = {}
    for start, end in zip(froms, [*froms[1:], len(df.structure)], strict=True):
        words = df.structure[start]["value"].split()
        out[words[2] if len(words) == 3 and words[1].upper() == "AS" else ""] = df.structure[start:end]
    return out


def final_stage(df: DockerfileParser) -> list[dict[str, Any]]:
    return list(stages(df).values())[-1]


def stage_args(stage: list[dict[str, Any]]) -> dict[str, str]:
    """A stage's ARG defaults (an ARG is scoped to the stage that declares it)."""
    pairs = [s["value"].split("=", 1) for s in stage if s["instruction"] == "ARG" and "=" in s["value"]]
    return {k: v.strip('"') for k, v in pairs}


def runtime_stages(name: str) -> dict[str, list[dict[str, Any]]]:
    """The stages that become an image: those that install the wheel stage's wheel."""
    return {k: v for k, v in stages(parse(name)).items()
            if any(s["instruction"] == "COPY" and s["value"].startswith("--from=wheel ") for s in v)}


def expand(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def pin(requirement_prefix: str, specs: list[str]) -> Requirement:
    [req] = [Requirement(s) for s in specs if Requirement(s).name == requirement_prefix]
    return req


def exact(req: Requirement) -> str:
    [spec] = list(req.specifier)
    assert spec.operator == "==", f"{req} must pin one version"
    return spec.version


@pytest.mark.parametrize("name", sorted(IMAGE_VALUES))
def test_bases_are_pinned_by_tag(name):
    df = parse(name)
    assert df.parent_images, f"{name}: no FROM"
    for image in df.parent_images:
        repo, _, tag = image.rpartition(":")
        assert repo and "/" not in tag, f"{name}: base {image!r} has no tag"
        assert tag != "latest" and re.search(r"\d+\.\d+", tag), f"{name}: base {image!r} is not pinned"


def test_operator_base_is_slim_python_311():
    assert {i.rsplit(":", 1)[1] for i in parse("operator").parent_images} == {"3.11.13-slim-bookworm"}
    assert {i.rsplit(":", 1)[0] for i in parse("operator").parent_images} == {"python"}


def test_ray_worker_base_matches_the_ray_we_depend_on():
    ray_installed = importlib.metadata.version("ray")
    declared = pin("ray", PYPROJECT["project"]["optional-dependencies"]["generate"])
    assert Version(ray_installed) in declared.specifier
    df = parse("ray-worker")
    assert set(df.parent_images) == {f"rayproject/ray:{ray_installed}-py311"}
    assert df.args["RAY_VERSION"] == ray_installed


def test_extractor_base_matches_the_sglang_extra_pin():
    sglang = exact(pin("sglang", PYPROJECT["project"]["optional-dependencies"]["sglang"]))
    df = parse("extractor")
    [gpu_from] = [s["value"] for s in final_stage(df) if s["instruction"] == "FROM"]
    assert gpu_from == "${SGLANG_IMAGE}", "the default (last) stage is the GPU variant, FROM SGLang's image"
    assert {i for i in df.parent_images if i.startswith("lmsysorg/sglang:")} == {f"lmsysorg/sglang:v{sglang}-cu130"}
    assert df.args["SGLANG_VERSION"] == sglang


def test_extractor_cpu_variant_is_python_311_slim_with_torchs_cpu_build():
    cpu = stages(parse("extractor"))["cpu"]
    assert cpu[0]["value"] == "${PYTHON_IMAGE} AS cpu"
    args = stage_args(cpu)
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    torch_pin = Requirement(f"torch=={args['TORCH_VERSION']}")
    jobs = PYPROJECT["project"]["optional-dependencies"]["jobs"]
    assert Version(args["TORCH_VERSION"]) in pin("torch", jobs).specifier
    installs = [s["value"] for s in cpu if s["instruction"] == "RUN" and "pip install" in s["value"]]
    # torch alone, first: the biggest layer, rebuilt only when the torch version or index changes
    assert installs[0] == ('python -m pip install --no-cache-dir ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} '
                           f'"{torch_pin.name}==${{TORCH_VERSION}}"')
    # then the other dependencies under a constraint that keeps exactly that torch
    [deps] = [r for r in installs if "--requirement /tmp/requirements.txt" in r]
    assert 'echo "torch==${TORCH_VERSION}" > /tmp/torch-constraint.txt' in deps
    assert "--constraint /tmp/torch-constraint.txt" in deps
    assert installs.index(deps) == 1


@pytest.mark.parametrize("name", sorted(IMAGE_VALUES))
def test_every_image_runs_as_a_numeric_non_root_user(name):
    """Numeric, so that a pod's runAsNonRoot can be checked by the kubelet (a user name cannot be)."""
    for stage_name, stage in runtime_stages(name).items():
        users = [s["value"].strip() for s in stage if s["instruction"] == "USER"]
        assert users, f"{name} {stage_name}: the stage sets no USER (it would run as the base image's user)"
        uid, _, gid = users[-1].partition(":")
        assert uid.isdigit() and gid.isdigit(), f"{name} {stage_name}: USER {users[-1]} is not uid:gid"
        assert int(uid) != 0, f"{name} {stage_name}: runs as root"


def wheel_installs(name: str) -> dict[str, str]:
    """Each runtime stage's one `pip install` of the wheel, its ARGs expanded."""
    out = {}
    for stage_name, stage in runtime_stages(name).items():
        args = stage_args(stage)
        assert args["EYRIE_VERSION"] == CHART["appVersion"] == VERSION, f"{name} {stage_name}"
        copies = [expand(s["value"], args) for s in stage if s["instruction"] == "COPY" and WHEEL in
                  expand(s["value"], args)]
        assert len(copies) == 1 and copies[0].startswith("--from=wheel ") and copies[0].endswith(
            f"/dist/{WHEEL} /tmp/wheels/"), f"{name} {stage_name}: no COPY of the wheel stage's wheel"
        runs = [expand(s["value"], args) for s in stage if s["instruction"] == "RUN"]
        installs = [r for r in runs if re.search(rf"pip install[^&]*/tmp/wheels/{re.escape(WHEEL)}(\[[a-z,]+\])?\"", r)]
        assert len(installs) == 1, f"{name} {stage_name}: one pip install of {WHEEL} expected"
        out[stage_name] = installs[0]
    return out


@pytest.mark.parametrize("name", sorted(IMAGE_VALUES))
def test_installs_the_wheel_of_the_charts_version(name):
    installs = wheel_installs(name)
    assert installs
    for stage_name, install in installs.items():
        # the build asserts the installed distribution's version, so a mismatch fails the build
        assert f"m.version('eyrie'); assert v == '{VERSION}'" in install, f"{name} {stage_name}"
    assert parse(name).labels["org.opencontainers.image.version"] == VERSION


def test_both_extractor_variants_install_the_same_wheel_with_the_same_entry_point():
    installs = wheel_installs("extractor")
    assert set(installs) == {"cpu", ""}, "a CPU variant (--target cpu) and the GPU default"
    extras = {k: re.search(rf"/tmp/wheels/{re.escape(WHEEL)}\[([a-z,]+)\]", v).group(1) for k, v in installs.items()}
    assert extras == {"cpu": "specforge", "": "specforge,sglang"}

    def entry(stage: list[dict[str, Any]]) -> dict[str, str]:
        keep = ("USER", "WORKDIR", "ENTRYPOINT", "CMD")
        return {s["instruction"]: s["value"] for s in stage if s["instruction"] in keep}

    cpu, gpu = stages(parse("extractor"))["cpu"], final_stage(parse("extractor"))
    assert entry(cpu) == entry(gpu) == {"USER": "10001:10001", "WORKDIR": "/home/eyrie", "ENTRYPOINT": "[]",
                                        "CMD": '["eyrie", "extract", "--help"]'}
    env = [s["value"] for s in cpu if s["instruction"] == "ENV"]
    assert env and "HF_HOME=/home/eyrie/.cache/huggingface" in env[0]


def test_ray_worker_builds_from_the_official_ray_image_or_a_plain_python_one():
    """The ray user (uid 1000, group users) is the official image's; on a plain Python base the stage creates it,
    and Ray comes with the generate extra's dependencies under the RAY_VERSION constraint."""
    stage = final_stage(parse("ray-worker"))
    runs = [s["value"] for s in stage if s["instruction"] == "RUN"]
    assert any(r.startswith("id -u ray >/dev/null 2>&1 || useradd --uid 1000 --gid 100") for r in runs)
    [deps] = [r for r in runs if "--requirement /tmp/requirements.txt" in r]
    assert '"ray==${RAY_VERSION}"' in deps and "--constraint /tmp/ray-constraint.txt" in deps
    assert [s["value"] for s in stage if s["instruction"] == "USER"][-1] == "1000:100"


def test_both_extractor_variants_carry_the_specforge_that_trains_the_pilots_drafters():
    """The pilot's Job runs on the extraction image: SpecForge's code (--no-deps, the version eyrie's drafters are
    written against) in both variants, and on the CPU triton, which its loss module imports (torch's CPU build
    does not bring it; the CUDA one does)."""
    cpu, gpu = stages(parse("extractor"))["cpu"], final_stage(parse("extractor"))
    for stage in (cpu, gpu):
        args = dict(s["value"].split("=", 1) for s in stage if s["instruction"] == "ARG" and "=" in s["value"])
        assert args["SPECFORGE_VERSION"] == SPECFORGE_VERSION
        runs = [s["value"] for s in stage if s["instruction"] == "RUN"]
        assert any('--no-deps "specforge==${SPECFORGE_VERSION}"' in r for r in runs)
    cpu_runs = " ".join(s["value"] for s in cpu if s["instruction"] == "RUN")
    assert '"triton==${TRITON_VERSION}"' in cpu_runs


def test_extractor_installs_the_sglang_extra_without_replacing_the_images_stack():
    runs = [s["value"] for s in final_stage(parse("extractor")) if s["instruction"] == "RUN"]
    [deps, wheel] = [r for r in runs if "pip install" in r]
    assert "--requirement /tmp/requirements.txt" in deps
    assert "--constraint /tmp/image-constraints.txt" in deps
    assert "('torch', 'sglang')" in deps
    assert "-py3-none-any.whl[specforge,sglang]" in wheel and "--no-index" in wheel


@pytest.mark.parametrize("name", sorted(IMAGE_VALUES))
def test_chart_values_name_each_image_at_the_app_version(name):
    value = IMAGE_VALUES[name]
    title = parse(name).labels["org.opencontainers.image.title"]
    assert value["repository"].rsplit("/", 1)[1] == title
    assert value["tag"] == CHART["appVersion"]


@pytest.mark.parametrize("name", sorted(IMAGE_VALUES))
def test_build_context_ignore_lets_through_exactly_what_the_wheel_stage_copies(name):
    df = parse(name)
    sources = set()
    for s in df.structure:
        if s["instruction"] == "COPY" and "--from=" not in s["value"]:
            parts = [p for p in s["value"].split() if not p.startswith("--")]
            sources.update(parts[:-1])
    ignore = (IMAGES / f"{name}.Dockerfile.dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "*" in ignore and sources == allowed == {"pyproject.toml", "README.md", "jobs", "operator",
                                                    "images/requirements.py"}


# --- layer caching: the dependencies' layer is reused across source edits

# each runtime stage -> the extras its wheel install names (and its dependency list must cover)
RUNTIME_EXTRAS = {("operator", ""): ["operator"], ("ray-worker", ""): ["generate"],
                  ("extractor", "cpu"): ["specforge"], ("extractor", ""): ["specforge", "sglang"]}


def requirements_stage(name: str) -> list[dict[str, Any]]:
    return stages(parse(name))["requirements"]


def listed_extras(name: str) -> dict[str, list[str]]:
    """The requirements stage's lists: file it writes -> the extras it asks images/requirements.py for."""
    [run] = [s["value"] for s in requirements_stage(name) if s["instruction"] == "RUN"]
    found = re.findall(r"python requirements\.py ([a-z ]+?) > (/\S+)", run)
    assert found, f"{name}: the requirements stage does not run requirements.py"
    return {path: extras.split() for extras, path in found}


@pytest.mark.parametrize("name", sorted(IMAGE_VALUES))
def test_the_requirements_stage_reads_only_pyproject_and_the_script(name):
    """So nothing but the declared dependencies changes its output: a source edit leaves the list, hence the
    dependencies' layer below the wheel, as it was."""
    stage = requirements_stage(name)
    copies = [s["value"] for s in stage if s["instruction"] == "COPY"]
    assert copies == ["pyproject.toml images/requirements.py ./"]
    assert [s["value"] for s in stage if s["instruction"] == "WORKDIR"] == ["/src"]


@pytest.mark.parametrize(("name", "stage_name"), sorted(RUNTIME_EXTRAS))
def test_dependencies_are_installed_in_a_layer_before_the_wheel(name, stage_name):
    stage = runtime_stages(name)[stage_name]
    steps = [(s["instruction"], s["value"]) for s in stage]
    [req_copy] = [i for i, (ins, v) in enumerate(steps) if ins == "COPY" and v.startswith("--from=requirements ")]
    [wheel_copy] = [i for i, (ins, v) in enumerate(steps) if ins == "COPY" and v.startswith("--from=wheel ")]
    src, dest = steps[req_copy][1].split()[1:]
    assert dest == "/tmp/requirements.txt"
    # the list it copies is the one for the extras the wheel install names
    assert listed_extras(name)[src] == RUNTIME_EXTRAS[(name, stage_name)]
    [deps] = [i for i, (ins, v) in enumerate(steps) if ins == "RUN" and "--requirement /tmp/requirements.txt" in v]
    assert req_copy < deps < wheel_copy, f"{name} {stage_name}: the dependencies must be installed before the wheel"
    assert "/tmp/wheels" not in steps[deps][1]
    # after the wheel's COPY: one pip install, --no-index (nothing fetched, so the layer below must hold everything)
    after = [v for ins, v in steps[wheel_copy:] if ins == "RUN" and "pip install" in v]
    extras = ",".join(RUNTIME_EXTRAS[(name, stage_name)])
    assert len(after) == 1 and "--no-index" in after[0] and f'-py3-none-any.whl[{extras}]"' in after[0], after
    # and nothing but the wheel and the user between the dependencies and the end of the image
    assert {ins for ins, _ in steps[deps + 1:]} <= {"COMMENT", "COPY", "RUN", "USER", "WORKDIR", "ENTRYPOINT", "CMD"}


def wheel_command(name: str) -> list[str]:
    [run] = [s["value"] for s in stages(parse(name))["wheel"] if s["instruction"] == "RUN"]
    return run.split()


def test_the_wheel_stages_are_one_command():
    assert wheel_command("operator") == wheel_command("ray-worker") == wheel_command("extractor")
    for name in IMAGE_VALUES:
        stage = stages(parse(name))["wheel"]
        assert [s["value"] for s in stage if s["instruction"] == "WORKDIR"] == ["/src"]


@pytest.mark.integration
def test_the_wheel_stage_builds_the_wheel_the_images_install(tmp_path):
    """Run the wheel stage's COPYs and its pip command, word for word, here, in its WORKDIR (the build context's
    `operator/` sits there beside the standard library's `operator`); the images COPY exactly this file name."""
    for item in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / item, tmp_path / item)
    for folder in ("jobs", "operator"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    argv = wheel_command("operator")
    assert argv[0] == "python" and argv[-1] == "."
    # -S, with this environment's import path given explicitly: nothing (no .pth file) has imported the standard
    # library's `operator` yet when the working directory goes on sys.path, as in the image's plain Python
    argv = [sys.executable, "-S", *argv[1:]]
    argv[argv.index("/dist")] = str(tmp_path / "dist")
    path = subprocess.run([sys.executable, "-P", "-c", "import os, sys; print(os.pathsep.join(sys.path))"],
                          cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    env = {**os.environ, "PYTHONPATH": path}
    # offline here: setuptools from this environment instead of an isolated download of the same requirement
    r = subprocess.run([*argv[:-1], "-q", "--no-build-isolation", "."], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "dist").iterdir()) == [WHEEL]
    names = set(zipfile.ZipFile(tmp_path / "dist" / WHEEL).namelist())
    # what the images run: `eyrie operator`, `eyrie run`, `eyrie extract`
    assert {"eyrie/operator/main.py", "eyrie/jobs/cli/__init__.py", "eyrie/jobs/cli/extract.py"} <= names
    entry = zipfile.ZipFile(tmp_path / "dist" / WHEEL).read(f"eyrie-{VERSION}.dist-info/entry_points.txt").decode()
    assert "eyrie = eyrie.jobs.cli:main" in entry
    # images/requirements.py lists from pyproject.toml what this wheel's metadata requires for each image's extras
    metadata = zipfile.ZipFile(tmp_path / "dist" / WHEEL).read(f"eyrie-{VERSION}.dist-info/METADATA").decode()
    requires = [line.partition(": ")[2] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    for extras in RUNTIME_EXTRAS.values():
        assert normalized(listed(extras)) == normalized(wheel_requirements(requires, extras)), extras


def listed(extras: list[str]) -> list[Requirement]:
    """images/requirements.py's list for these extras, as pip reads a requirements file on this platform."""
    r = subprocess.run([sys.executable, str(IMAGES / "requirements.py"), "--pyproject", str(ROOT / "pyproject.toml"),
                        *extras], capture_output=True, text=True, check=True)
    reqs = [Requirement(line) for line in r.stdout.splitlines()]
    return [q for q in reqs if q.marker is None or q.marker.evaluate({"extra": ""})]


def wheel_requirements(requires: list[str], extras: list[str]) -> list[Requirement]:
    """What pip installs for WHEEL[extras] on this platform, from its Requires-Dist lines (eyrie[...] expanded)."""
    reqs = [Requirement(line) for line in requires]
    out = [q for q in reqs if q.marker is None or q.marker.evaluate({"extra": ""})]
    todo, done = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in done:
            continue
        done.add(extra)
        for q in reqs:
            if q.marker is not None and "extra" in str(q.marker) and q.marker.evaluate({"extra": extra}):
                if q.name == "eyrie":
                    todo.extend(q.extras)
                else:
                    out.append(q)
    return out


def normalized(reqs: list[Requirement]) -> set[tuple[str, str, tuple[str, ...]]]:
    return {(q.name.lower().replace("_", "-"), str(q.specifier), tuple(sorted(q.extras))) for q in reqs}


def run_images_script(tmp_path: Path, min_free_gb: float) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """hack/images.sh operator into an empty testbed cache (the operator image stale), with stand-ins for `buildah`
    (records its arguments, then fails: no real build here) and `id` (root, so the run is the same for any user),
    under EYRIE_IMAGES_MIN_FREE_GB; the result, the cache's images folder and the stand-in buildah's record."""
    bin_dir, cache, calls = tmp_path / "bin", tmp_path / "cache", tmp_path / "buildah-calls"
    bin_dir.mkdir()
    for name, body in {"buildah": f'echo "$@" >> {calls}\nexit 3', "id": "echo 0"}.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "EYRIE_TESTBED_CACHE": str(cache),
           "EYRIE_IMAGES_MIN_FREE_GB": f"{min_free_gb:g}", "TMPDIR": str(tmp_path)}
    r = subprocess.run(["bash", str(ROOT / "hack" / "images.sh"), "operator"], env=env, capture_output=True,
                       text=True, timeout=120)
    return r, cache / "images", calls


@pytest.mark.integration
def test_images_script_refuses_to_build_on_a_disk_without_room_naming_need_free_and_where(tmp_path):
    """A full disk fails deep inside buildah (the extractor peaks at about 15 GB): the script checks first."""
    free_gb = shutil.disk_usage(tmp_path).free / 2**30
    r, images, calls = run_images_script(tmp_path, min_free_gb=round(free_gb + 100))
    assert r.returncode == 1, r.stderr
    need = f"{round(free_gb + 100)} GB free"
    assert f"images: not building operator: a build needs {need} on the filesystem holding the cache ({images})" \
        in r.stderr
    said = re.search(r", and (\S+) has ([0-9.]+) GB free\. ", r.stderr)
    assert said, r.stderr
    assert Path(said[1]) in {Path(tmp_path), *Path(tmp_path).parents}  # the mount point holding the cache
    assert abs(float(said[2]) - free_gb) < 0.5  # what df says is free there
    assert "EYRIE_IMAGES_MIN_FREE_GB" in r.stderr
    assert not calls.exists()  # buildah never ran
    assert sorted(p.name for p in images.iterdir()) == [".lock"]  # no archive, no store, no layout


@pytest.mark.integration
def test_images_script_with_room_goes_on_to_build(tmp_path):
    """The same stale image under a threshold the disk meets: past the check, the build starts (buildah's first
    call, the stand-in's failure stops it); a threshold that is not a number is refused before any build."""
    r, images, calls = run_images_script(tmp_path, min_free_gb=0)
    assert r.returncode == 3 and "not building" not in r.stderr, r.stderr
    assert calls.read_text().split("\n")[0].endswith("rm --all")  # ensure_base cleaning the store: a build began
    assert not (images / f"operator-{VERSION}.oci.tar").exists()
    env = {**os.environ, "EYRIE_TESTBED_CACHE": str(tmp_path / "cache2"), "EYRIE_IMAGES_MIN_FREE_GB": "lots"}
    bad = subprocess.run(["bash", str(ROOT / "hack" / "images.sh"), "operator"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and "EYRIE_IMAGES_MIN_FREE_GB must be a number of GB (got 'lots')" in bad.stderr

"""The Dockerfiles under images/: they cannot be built here (no Docker engine), so what can be checked
statically is: each parses, pins its base by tag, runs as non-root, installs the wheel of the version
the chart names, and its wheel stage (same COPYs, same pip command) really produces that wheel.
"""

from __future__ import annotations

import importlib.metadata
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

ROOT = Path(__file__).resolve().parents[1]
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


def final_stage(df: DockerfileParser) -> list[dict[str, Any]]:
    froms = [i for i, s in enumerate(df.structure) if s["instruction"] == "FROM"]
    return df.structure[froms[-1]:]


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
    declared = pin("ray", PYPROJECT["project"]["optional-dependencies"]["jobs"])
    assert Version(ray_installed) in declared.specifier
    df = parse("ray-worker")
    assert set(df.parent_images) == {f"rayproject/ray:{ray_installed}-py311"}
    assert df.args["RAY_VERSION"] == ray_installed


def test_extractor_base_matches_the_sglang_extra_pin():
    sglang = exact(pin("sglang", PYPROJECT["project"]["optional-dependencies"]["sglang"]))
    df = parse("extractor")
    [base] = set(df.parent_images)
    assert base.startswith(f"lmsysorg/sglang:v{sglang}-")
    assert df.args["SGLANG_VERSION"] == sglang


@pytest.mark.parametrize("name", sorted(IMAGE_VALUES))
def test_final_stage_runs_as_non_root(name):
    users = [s["value"].strip() for s in final_stage(parse(name)) if s["instruction"] == "USER"]
    assert users, f"{name}: the final stage sets no USER (it would run as the base image's user)"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), f"{name}: runs as root"


@pytest.mark.parametrize("name", sorted(IMAGE_VALUES))
def test_installs_the_wheel_of_the_charts_version(name):
    df = parse(name)
    assert df.args["EYRIE_VERSION"] == CHART["appVersion"] == VERSION
    stage = final_stage(df)
    copies = [expand(s["value"], df.args) for s in stage if s["instruction"] == "COPY" and WHEEL in
              expand(s["value"], df.args)]
    assert len(copies) == 1 and copies[0].startswith("--from=wheel "), f"{name}: no COPY of the wheel stage's wheel"
    runs = [expand(s["value"], df.args) for s in stage if s["instruction"] == "RUN"]
    installs = [r for r in runs if re.search(rf"pip install[^&]*/tmp/wheels/{re.escape(WHEEL)}(\[[a-z,]+\])?\"", r)]
    assert len(installs) == 1, f"{name}: one pip install of {WHEEL} expected"
    # the build asserts the installed distribution's version, so a mismatch fails the build
    assert f"m.version('eyrie'); assert v == '{VERSION}'" in installs[0]
    assert df.labels["org.opencontainers.image.version"] == VERSION


def test_extractor_installs_the_sglang_extra_without_replacing_the_images_stack():
    runs = [s["value"] for s in final_stage(parse("extractor")) if s["instruction"] == "RUN"]
    [install] = [r for r in runs if "pip install" in r]
    assert "-py3-none-any.whl[jobs,sglang]" in install
    assert "--constraint /tmp/image-constraints.txt" in install
    assert "('torch', 'sglang')" in install


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
    assert "*" in ignore and sources == allowed == {"pyproject.toml", "README.md", "jobs", "operator"}


def test_the_wheel_stage_builds_the_wheel_the_images_install(tmp_path):
    """Run the wheel stage's COPYs and pip command here; the images COPY exactly this file name."""
    for item in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / item, tmp_path / item)
    for folder in ("jobs", "operator"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-cache-dir", "--no-deps",
                        "--no-build-isolation", "--wheel-dir", str(tmp_path / "dist"), str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (tmp_path / "dist").iterdir()) == [WHEEL]
    names = set(zipfile.ZipFile(tmp_path / "dist" / WHEEL).namelist())
    # what the images run: `eyrie operator`, `eyrie run`, `eyrie extract`
    assert {"eyrie/operator/main.py", "eyrie/jobs/cli/__init__.py", "eyrie/jobs/extract/cli.py"} <= names
    entry = zipfile.ZipFile(tmp_path / "dist" / WHEEL).read(f"eyrie-{VERSION}.dist-info/entry_points.txt").decode()
    assert "eyrie = eyrie.jobs.cli:main" in entry

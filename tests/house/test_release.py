"""The release workflow (.github/workflows/release.yaml) against the chart, the examples, the docs and hack/images.sh.

Its steps are run here as GitHub runs them (`bash --noprofile --norc -eo pipefail`, the job's env with its
expressions resolved from the matrix and the version job's output), with a stand-in `buildah` that records its
arguments; hack/images.sh is run the same way (house/test_images.py does it for its disk check). So: `helm template`
of the chart with default values, and every example, names only images the workflow pushes, at the chart's
appVersion; a tag that is not v<appVersion> pushes nothing; and each image is built as hack/images.sh builds what
the tests' node runs (same Dockerfile, target, build context, tag), apart from the bases and index that script
substitutes because no registry is reachable where it runs.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW = yaml.safe_load((ROOT / ".github/workflows/release.yaml").read_text())
CHART = ROOT / "charts" / "eyrie"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
# what hack/images.sh passes only because no registry is reachable where it runs: its mmdebstrap base in place of
# python:3.11-slim / rayproject/ray, and pip's default index in place of PyTorch's CPU index
NO_REGISTRY_ARGS = {"PYTHON_IMAGE", "RAY_IMAGE", "TORCH_INDEX_URL"}
SEP = "\x1f"


def triggers() -> dict[str, Any]:
    return WORKFLOW.get("on", WORKFLOW.get(True))  # YAML 1.1 reads a bare `on` as true


def step(job: str, name_or_id: str) -> dict[str, Any]:
    [found] = [s for s in WORKFLOW["jobs"][job]["steps"] if name_or_id in (s.get("name"), s.get("id"))]
    return found


def run_step(script: str, env: dict[str, str], tmp: Path, stand_ins: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess:
    """A `run:` script as GitHub's runner runs it on Linux, in the repository root, with stand-in commands first on
    PATH and the runner's files (GITHUB_OUTPUT, GITHUB_ENV, RUNNER_TEMP) under tmp."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in (stand_ins or {}).items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (tmp / "runner").mkdir(exist_ok=True)
    full = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "HOME": str(tmp),
            "GITHUB_OUTPUT": str(tmp / "output"), "GITHUB_ENV": str(tmp / "env"), "RUNNER_TEMP": str(tmp / "runner"),
            "GITHUB_ACTOR": "someone", **{k: str(v) for k, v in WORKFLOW.get("env", {}).items()}, **env}
    (tmp / "script.sh").write_text(script)
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", str(tmp / "script.sh")], cwd=ROOT,
                          env=full, capture_output=True, text=True, timeout=120)


def outputs(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines()) if path.exists() else {}


def released_version(tmp: Path, tag: str) -> subprocess.CompletedProcess:
    s = step("version", "version")
    assert s["env"] == {"TAG": "${{ github.ref_name }}"}
    return run_step(s["run"], {"TAG": tag}, tmp)


def matrix() -> list[dict[str, str]]:
    return WORKFLOW["jobs"]["images"]["strategy"]["matrix"]["include"]


def job_env(entry: dict[str, str], version: str) -> dict[str, str]:
    """The images job's env for one matrix entry: the expressions it may use resolved, any other refused."""
    def resolve(m: re.Match) -> str:
        expr = m.group(1).strip()
        if expr == "needs.version.outputs.version":
            return version
        if expr.startswith("matrix.") and expr[len("matrix."):] in entry:
            return str(entry[expr[len("matrix."):]])
        raise AssertionError(f"the images job's env uses ${{{{ {expr} }}}}, which this test does not resolve")
    return {k: re.sub(r"\$\{\{(.*?)\}\}", resolve, str(v)) for k, v in WORKFLOW["jobs"]["images"]["env"].items()}


BUILDAH_RECORDER = f'(IFS=$\'{SEP}\'; echo "$*") >> "$CALLS"\n'


def build_in_workflow(tmp: Path, entry: dict[str, str], label: str | None = None) -> tuple[
        subprocess.CompletedProcess, list[list[str]], dict[str, str]]:
    """The images job's build step for one matrix entry, with stand-ins for sudo and buildah (whose `inspect`
    answers the version label, default the released version); the result, buildah's calls, what it put in
    GITHUB_ENV."""
    version = APP_VERSION
    calls = tmp / "calls"
    inspect = f'[[ "$1" == inspect ]] && {{ echo "{label or version}"; exit 0; }}\n'
    stand_ins = {"buildah": BUILDAH_RECORDER + inspect + "exit 0",
                 # `sudo VAR=value command...` as sudo runs it for a user allowed ALL
                 "sudo": 'exec env "$@"'}
    r = run_step(step("images", "build")["run"], {**job_env(entry, version), "CALLS": str(calls)}, tmp, stand_ins)
    recorded = [line.split(SEP) for line in calls.read_text().splitlines()] if calls.exists() else []
    return r, recorded, outputs(tmp / "env")


def build_in_images_sh(tmp: Path, name: str) -> list[str]:
    """hack/images.sh NAME into an empty cache with a stand-in buildah (the base taken as present, the build
    recorded, the push failing so nothing else runs) and a stand-in `id` (root): its `buildah ... bud` arguments."""
    bin_dir, calls = tmp / "bin", tmp / "calls"
    bin_dir.mkdir()
    for cmd, body in {"buildah": BUILDAH_RECORDER + '[[ " $* " == *" push "* ]] && exit 3\nexit 0',
                      "id": "echo 0"}.items():
        (bin_dir / cmd).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / cmd).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "CALLS": str(calls),
           "EYRIE_TESTBED_CACHE": str(tmp / "cache"), "EYRIE_IMAGES_MIN_FREE_GB": "0", "TMPDIR": str(tmp)}
    r = subprocess.run(["bash", str(ROOT / "hack" / "images.sh"), name], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 3, r.stderr  # the stand-in push stopped it, after the build
    [bud] = [c for c in (line.split(SEP) for line in calls.read_text().splitlines()) if "bud" in c]
    return bud


VALUED = {"-f", "--file", "--ignorefile", "--target", "-t", "--tag", "--isolation", "--build-arg", "-v", "--volume",
          "--root", "--runroot", "--storage-driver"}
# what defines the image; the rest says where buildah keeps its store, how much it prints, whether it may pull
DEFINING = ("file", "ignorefile", "target", "tag", "isolation", "layers", "context")


def build_options(argv: list[str]) -> dict[str, Any]:
    """A `buildah [global options] bud ...` call as what it builds: the defining options and the build args."""
    args = argv[argv.index("bud") + 1:]
    out: dict[str, Any] = {"build_args": {}, "layers": False, **{k: None for k in ("file", "ignorefile", "target",
                                                                                 "tag", "isolation")}}
    names = {"-f": "file", "--file": "file", "-t": "tag", "--tag": "tag", "--target": "target",
             "--ignorefile": "ignorefile", "--isolation": "isolation"}
    positional = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in VALUED:
            value = args[i + 1]
            if a == "--build-arg":
                k, _, v = value.partition("=")
                out["build_args"][k] = v
            elif a in names:
                out[names[a]] = value
            i += 2
            continue
        if a == "--layers":
            out["layers"] = True
        elif not a.startswith("-"):
            positional.append(a)
        i += 1
    [out["context"]] = positional
    return out


# ------------------------------------------------------------------------------------------ the trigger and version


def test_the_release_runs_on_version_tags_only():
    on = triggers()
    assert set(on) == {"push"}, on
    assert set(on["push"]) == {"tags"}, "a push to a branch releases nothing"
    assert on["push"]["tags"] == ["v[0-9]+.[0-9]+.[0-9]+*"]
    assert WORKFLOW["jobs"]["images"]["needs"] == "version"
    assert WORKFLOW["permissions"] == {"contents": "read"}  # only the images job may write packages
    assert WORKFLOW["jobs"]["images"]["permissions"] == {"contents": "read", "packages": "write"}


@pytest.mark.integration
def test_the_tag_must_be_v_and_the_charts_app_version(tmp_path):
    (tmp_path / "ok").mkdir()
    ok = released_version(tmp_path / "ok", f"v{APP_VERSION}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert outputs(tmp_path / "ok" / "output") == {"version": APP_VERSION}
    (tmp_path / "other").mkdir()
    other = released_version(tmp_path / "other", "v9.9.9")
    assert other.returncode == 1
    assert f"::error::tag v9.9.9 is not v{APP_VERSION}" in other.stdout
    assert outputs(tmp_path / "other" / "output") == {}, "a refused tag gives the images job no version"


# ---------------------------------------------------------------------------------------------- what it pushes


def released_refs() -> dict[str, dict[str, str]]:
    """Each image ref the images job pushes, at the chart's appVersion, with its matrix entry."""
    refs = {}
    for entry in matrix():
        env = job_env(entry, APP_VERSION)
        refs[f"{WORKFLOW['env']['REGISTRY']}/{env['IMAGE']}:{env['VERSION']}{env['SUFFIX']}"] = entry
    return refs


def images_in(node: Any) -> list[str]:
    """Every `image:` value in a YAML tree."""
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == "image" and isinstance(v, str)] + \
            [i for v in node.values() for i in images_in(v)]
    if isinstance(node, list):
        return [i for v in node for i in images_in(v)]
    return []


def test_helm_template_with_default_values_names_only_images_the_release_pushes():
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(None, name="eyrie", namespace="eyrie-system", is_install=True)
    released = released_refs()
    in_objects = [i for path, text in rendered.items() if not path.endswith("NOTES.txt")
                  for doc in yaml.safe_load_all(text) if doc for i in images_in(doc)]
    assert in_objects == [f"ghcr.io/eyrie-dev/eyrie-operator:{APP_VERSION}"]  # the Deployment's one container
    # the images DatasetGenerations are to name, as `helm install` prints them
    in_notes = re.findall(r"^\s*spec\.\S+\.image:\s+(\S+)$", rendered["eyrie/templates/NOTES.txt"], re.M)
    assert in_notes == [f"ghcr.io/eyrie-dev/eyrie-ray-worker:{APP_VERSION}",
                        f"ghcr.io/eyrie-dev/eyrie-extractor:{APP_VERSION}"]
    for ref in in_objects + in_notes:
        assert ref in released, f"the chart names {ref}, which .github/workflows/release.yaml does not push"


def test_every_example_names_only_images_the_release_pushes():
    named = {(p.name, i) for p in sorted((ROOT / "examples").glob("*.yaml"))
             for doc in yaml.safe_load_all(p.read_text()) if doc for i in images_in(doc)}
    assert {i for _, i in named} == {f"ghcr.io/eyrie-dev/eyrie-ray-worker:{APP_VERSION}",
                                     f"ghcr.io/eyrie-dev/eyrie-extractor:{APP_VERSION}"}
    assert not {(p, i) for p, i in named if i not in released_refs()}


def test_one_image_namespace_in_readme_docs_chart_examples_and_images():
    """Every ghcr.io name the user reads is one the release pushes (any tag: `$V`, a placeholder, a test's 9.9.9)."""
    pushed = {ref.rsplit(":", 1)[0] for ref in released_refs()}
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").glob("*.yaml")),
             *sorted(p for p in CHART.rglob("*") if p.is_file() and p.suffix in {".yaml", ".txt", ".tpl", ".json"}),
             *sorted((ROOT / "images").glob("*.Dockerfile")), ROOT / "hack" / "images.sh"]
    seen = {}
    for f in files:
        for m in re.finditer(r"ghcr\.io/[\w.-]+/[\w.-]+", f.read_text()):
            seen.setdefault(m.group(0), f.relative_to(ROOT))
    assert seen, "no image named anywhere"
    assert {name: f for name, f in seen.items() if name not in pushed} == {}


# ----------------------------------------------------------------------------------- built as hack/images.sh does


@pytest.mark.integration
def test_each_matrix_entry_builds_and_checks_its_ref(tmp_path):
    for n, entry in enumerate(matrix()):
        tmp = tmp_path / str(n)
        tmp.mkdir()
        r, calls, env = build_in_workflow(tmp, entry)
        assert r.returncode == 0, r.stdout + r.stderr
        ref = env["REF"]
        assert ref in released_refs() and released_refs()[ref] == entry
        [bud] = [c for c in calls if c[0] == "bud"]
        assert build_options(bud)["tag"] == ref
        assert (ROOT / build_options(bud)["file"]).is_file()
        assert any(c[:1] == ["inspect"] and c[-1] == ref for c in calls)
        conf = (tmp / "runner" / "registries.conf").read_text()
        assert conf.strip() == 'unqualified-search-registries = ["docker.io"]'


@pytest.mark.integration
def test_an_image_labelled_with_another_version_is_not_pushed(tmp_path):
    r, _, _ = build_in_workflow(tmp_path, matrix()[0], label="0.0.1")
    assert r.returncode == 1
    assert f"is labelled version '0.0.1', not {APP_VERSION}" in r.stdout


@pytest.mark.integration
@pytest.mark.parametrize("name", ["operator", "ray-worker", "extractor-cpu"])
def test_the_release_builds_each_image_as_hack_images_sh_does(tmp_path, name):
    (tmp_path / "sh").mkdir()
    (tmp_path / "wf").mkdir()
    local = build_options(build_in_images_sh(tmp_path / "sh", name))
    [entry] = [e for ref, e in released_refs().items() if ref == local["tag"]]
    _, calls, _ = build_in_workflow(tmp_path / "wf", entry)
    [bud] = [c for c in calls if c[0] == "bud"]
    release = build_options(bud)
    assert {k: release[k] for k in DEFINING} == {k: local[k] for k in DEFINING}
    assert set(local["build_args"]) <= NO_REGISTRY_ARGS, local["build_args"]
    assert release["build_args"] == {}, "the release builds with each Dockerfile's own defaults"


@pytest.mark.integration
def test_the_gpu_extractor_is_the_cpu_ones_dockerfile_at_its_default_target(tmp_path):
    by_target = {e["target"]: e for e in matrix() if e["image"] == "eyrie-extractor"}
    assert set(by_target) == {"", "cpu"}
    options = {}
    for target, entry in by_target.items():
        (tmp_path / (target or "gpu")).mkdir()
        _, calls, _ = build_in_workflow(tmp_path / (target or "gpu"), entry)
        [bud] = [c for c in calls if c[0] == "bud"]
        options[target] = build_options(bud)
    assert options[""]["target"] is None and options["cpu"]["target"] == "cpu"
    assert {k: v for k, v in options[""].items() if k not in {"target", "tag"}} == \
        {k: v for k, v in options["cpu"].items() if k not in {"target", "tag"}}

"""The `operator` extra's floor for kubernetes_asyncio is one the operator runs on: install exactly
that version (from the package index) over this environment and run the client tests with it."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

# tier (tests/conftest.py): installs the client's floor version into a venv and runs its tests
pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def floor() -> str:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["operator"]
    req = next(Requirement(r) for r in extra if Requirement(r).name.replace("_", "-") == "kubernetes-asyncio")
    (spec,) = [s for s in req.specifier if s.operator == ">="]
    return spec.version


def test_the_client_tests_pass_on_the_floor_version(tmp_path: Path) -> None:
    version = floor()
    target = tmp_path / "floor"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                          f"kubernetes_asyncio=={version}"], capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, f"could not install the floor kubernetes_asyncio=={version}:\n{pip.stderr[-2000:]}"
    # not run from the repository root: its `operator/` folder would shadow the standard library's
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(target), os.environ.get("PYTHONPATH")) if p)}
    seen = subprocess.run([sys.executable, "-c", "import kubernetes_asyncio as k; print(k.__version__)"],
                          env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert Version(seen.stdout.strip()) == Version(version), seen.stderr
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(ROOT),
                          "-c", str(ROOT / "pyproject.toml"), str(ROOT / "tests" / "operator" / "test_kube.py")],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, f"kubernetes_asyncio=={version}:\n{run.stdout[-4000:]}"
    assert " passed" in run.stdout and " failed" not in run.stdout

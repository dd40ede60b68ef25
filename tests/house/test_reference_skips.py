"""A test that needs a reference file it cannot find fails under CI=true and, elsewhere, is skipped
and named in the summary (tests/reference_helpers.py, the hook in tests/conftest.py): a clone
without the files never reports green silently. Runs the real KubeRay-CRD tests in a child pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # tier (tests/conftest.py): runs pytest itself as a process

ROOT = Path(__file__).resolve().parents[2]
NODES = "tests/operator/test_children.py"


def child_pytest(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("CI", "EYRIE_REFERENCE_DIR")}
    return subprocess.run([sys.executable, "-m", "pytest", NODES, "-k", "kuberays_crd", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, env={**full, **env}, capture_output=True, text=True, timeout=600)


@pytest.fixture
def empty(tmp_path: Path) -> str:
    (tmp_path / "ref").mkdir()
    return str(tmp_path / "ref")


def test_a_missing_reference_file_fails_under_ci(tmp_path, empty):
    got = child_pytest(tmp_path, CI="true", EYRIE_REFERENCE_DIR=empty)
    assert got.returncode == 1, got.stdout[-3000:]
    assert "3 failed" in got.stdout and "skipped" not in got.stdout.splitlines()[-1], got.stdout[-3000:]
    assert "kuberay/ray.io_rayjobs.yaml" in got.stdout and "CI=true" in got.stdout


def test_a_missing_reference_file_is_skipped_counted_and_named_elsewhere(tmp_path, empty):
    got = child_pytest(tmp_path, EYRIE_REFERENCE_DIR=empty)
    assert got.returncode == 0, got.stdout[-3000:]
    assert "3 tests skipped for missing reference files" in got.stdout, got.stdout[-3000:]
    assert "test_children.py::test_rayjob_validates_against_kuberays_crd[dg]" in got.stdout


def test_the_reference_folder_is_used_when_present(tmp_path):
    from tests.reference_helpers import reference

    folder = reference("kuberay/ray.io_rayjobs.yaml").parents[1]
    got = child_pytest(tmp_path, CI="true", EYRIE_REFERENCE_DIR=str(folder))
    assert got.returncode == 0 and "3 passed" in got.stdout, got.stdout[-3000:]

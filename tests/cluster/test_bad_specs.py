"""Parity: every bad spec is refused by the API server with the field path, and `eyrie validate` agrees."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .bad_specs import BAD_SPECS, BadSpec
from .conftest import Installed
from .testbed import REPO, ControlPlane

BASE = yaml.safe_load((REPO / "examples" / "quickstart.yaml").read_text())


def validate(doc: dict, where: Path) -> subprocess.CompletedProcess[str]:
    """`eyrie validate` on the spec written at `where`: its relative sources are the example's (a relative
    path in a spec file is taken next to that file, and this copy lives elsewhere)."""
    doc = copy.deepcopy(doc)
    for src in doc["spec"].get("sources") or []:
        if isinstance(src, dict) and isinstance(src.get("uri"), str) and "://" not in src["uri"]:
            src["uri"] = str(REPO / "examples" / src["uri"])
    where.write_text(yaml.safe_dump(doc))
    return subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "validate", str(where)],
                          capture_output=True, text=True, timeout=60)


def server_dry_run(cp: ControlPlane, doc: dict) -> subprocess.CompletedProcess[str]:
    return cp.kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(doc), namespace="default")


def test_the_base_spec_is_valid_to_both(control_plane: ControlPlane, chart: Installed, tmp_path: Path) -> None:
    assert server_dry_run(control_plane, BASE).returncode == 0
    assert validate(BASE, tmp_path / "base.yaml").returncode == 0


@pytest.mark.parametrize("bad", BAD_SPECS, ids=[b.id for b in BAD_SPECS])
def test_server_and_validate_refuse_naming_the_same_field(control_plane: ControlPlane, chart: Installed,
                                                         bad: BadSpec, tmp_path: Path) -> None:
    doc = copy.deepcopy(BASE)
    bad.change(doc["spec"])
    server = server_dry_run(control_plane, doc)
    local = validate(doc, tmp_path / "bad.yaml")
    verdicts = {"kubectl apply": server.returncode != 0, "eyrie validate": local.returncode != 0}
    assert verdicts == {"kubectl apply": True, "eyrie validate": True}, (server.stderr, local.stdout + local.stderr)
    assert bad.field in server.stderr, server.stderr
    assert bad.field in local.stdout + local.stderr, local.stdout + local.stderr

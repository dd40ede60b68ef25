"""benchmarks/gpu_acceptance.py in its CPU mode, so that the GPU check cannot rot unseen between GPU loans: what
travels made here (`--make`: the examples' samples, the pilot's answers), then every phase but the kernel's on the
CPU at two steps (`--from DIR --cpu`): the outputs extracted in process, `eyrie evaluate` with the control, the
pilot trained again from what it holds (nothing bought), the document written after each phase."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_acceptance.py"

pytestmark = pytest.mark.integration


def test_the_gpu_check_runs_its_phases_on_the_cpu(tmp_path):
    made = subprocess.run([sys.executable, str(SCRIPT), "--make", str(tmp_path / "carry"), "--inline",
                           "--out", str(tmp_path / "made.json")], capture_output=True, text=True, timeout=1800)
    assert made.returncode == 0, made.stderr[-3000:]
    carry = tmp_path / "carry"
    # what travels: samples, no hidden states (the device makes them), and the pilot's answers
    for name in ("quickstart", "quickstart-impostor"):
        assert list((carry / name / "samples").glob("shard-*.parquet")) and not (carry / name / "hidden").exists()
    assert list((carry / "pilot" / "audit" / "answers").rglob("*.jsonl.gz"))
    r = subprocess.run([sys.executable, str(SCRIPT), "--from", str(carry), "--cpu", "--steps", "2",
                        "--out", str(tmp_path / "doc.json")], capture_output=True, text=True, timeout=1800)
    doc = json.loads((tmp_path / "doc.json").read_text())
    assert r.returncode == 0 and doc["ok"], (r.stderr[-3000:], doc)
    assert "kernel" not in doc  # CUDA's alone
    assert {n: doc["extract"][n]["samples"] > 0 for n in ("quickstart", "quickstart-impostor")} == \
        {"quickstart": True, "quickstart-impostor": True}
    assert set(doc["evaluate"]["acceptedLength"]) == {"reference", "against", "control"}
    assert set(doc["pilot"]["acceptedLength"]) == {"text", "structured"} and "pilot of 20" in doc["pilot"]["sentence"]
    assert (carry / "pilot" / "pilot.json").exists() and list((carry / "quickstart" / "hidden").glob("*.safetensors"))

"""benchmarks/gpu_extraction_hf.py's CPU mode: every phase the GPU run will do, on a tiny model, so the
script the next GPU session runs first time cannot rot unseen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_the_gpu_script_runs_every_phase_in_cpu_mode(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_extraction_hf as bench
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    out = tmp_path / "result.json"
    assert bench.main(["--cpu", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    phases = {p["name"]: p for p in doc["phases"]}
    assert [p["name"] for p in doc["phases"]] == [name for name, _fn, _need in bench.PHASES]
    assert all(p["ok"] for p in doc["phases"]), [p.get("error") for p in doc["phases"]]
    assert phases["equal"]["samples"] == 6 + 16 and phases["equal"]["lowestCosinePerToken"] > 0.9999
    for row in phases["table"]["rows"]:
        assert row["new"]["padded"] == row["tokens"] <= row["old"]["padded"]  # packed: no padding computed
        assert row["new"]["tokensPerS"] > 0 and row["old"]["fractionOfMatmul"] > 0
        assert row["new"]["maxInFlight"] <= 2
    assert phases["table"]["rows"][1]["old"]["padded"] > phases["table"]["rows"][1]["tokens"]
    whole = phases["whole"]["stores"]
    assert "local" in whole and whole["local"]["stats"]["parts"] >= 2
    assert whole["local"]["binds"] in ("store", "host (copy, assembly, serialization)", "compute (the forward)")
    assert phases["flex"]["equal"]["kernel"] == "flex"
    printed = capsys.readouterr().out
    assert "| 6, lengths 20-120 | 406 |" in printed and "RESULT gpu_extraction_hf mode=cpu" in printed


# What the lent GPU machine's image lacks (shared/GPU.md, /work/.library/device/KINDS.md): the script may import
# none of it but what its docstring says to carry (orjson). dill is left out: torch imports it only when present.
MISSING_ON_THE_GPU_MACHINE = {"pydantic", "pydantic_core", "annotated_types", "typing_inspection", "jsonschema",
                              "jsonschema_specifications", "referencing", "rpds", "jsonschema_rs", "jsonpointer",
                              "plotly", "specforge", "datasets", "multiprocess", "minio", "ray", "sglang", "kopf"}
CARRIED = {"orjson"}


@pytest.mark.integration
def test_the_gpu_script_imports_only_what_the_gpu_machine_has():
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); import gpu_extraction_hf as b; "
            "import eyrie.jobs.extract.run, eyrie.jobs.contract.layout, pyarrow.parquet, json; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300)
    imported = set(json.loads(out.stdout.strip().splitlines()[-1]))
    assert imported & MISSING_ON_THE_GPU_MACHINE == set()
    assert imported >= CARRIED  # the docstring's wheel is needed: if this fails, drop it there too

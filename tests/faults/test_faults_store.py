"""Store faults: the S3 server is SIGKILLed for ~20 s in the middle of a run and started again on the
same data. Writes are retried with backoff; the run finishes (or stops with a reason and resumes);
every part decodes (never a torn part) and every prompt is persisted exactly once.

The test runs its own MinIO on free ports (the session's shared server stays untouched).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from fault_helpers import (
    API_KEY,
    PrivateS3,
    all_part_bytes,
    assert_exactly_once,
    persisted,
    progress,
    simple_rows,
    spec_doc,
    spent_sum,
    write_rows,
    write_spec,
)

from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.store import Store

# tier (tests/conftest.py): a MinIO of its own, stopped and started, and the simulator as a process
pytestmark = pytest.mark.integration

N = 60
OUTAGE_S = 20


def _cli(spec: Path, s3: PrivateS3) -> subprocess.Popen:
    env = {**os.environ, **s3.env(), "EYRIE_API_KEY": API_KEY, "EYRIE_NO_RAY": "1"}
    return subprocess.Popen([sys.executable, "-m", "eyrie.jobs.cli", "run", str(spec), "--no-progress"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@dataclass
class Outage:
    rc: int
    stderr: str
    outage_s: float
    stats: dict
    store: Store


@pytest.fixture(scope="module")
def outage(tmp_path_factory) -> Iterator[Outage]:
    """One run through a 20 s S3 outage, shared by the tests below (it takes ~45 s)."""
    tmp_path = tmp_path_factory.mktemp("s3-outage")
    base = Path(tempfile.mkdtemp(prefix="eyrie-s3f-"))
    s3 = PrivateS3(base).start()
    try:
        bucket = s3.make_bucket(f"f{time.time_ns()}")
        out = f"{bucket}/run"
        prompts = write_rows(tmp_path / "p.jsonl", simple_rows(N))
        with SimulatorProcess(SimulatorConfig(latency_ms=400)) as sim:
            spec = write_spec(tmp_path, spec_doc(prompts, out, sim.base_url, concurrency=2, shards=4,
                                                 extra={"output.endpoint": s3.endpoint}))
            proc = _cli(spec, s3)
            store = s3.store(out)
            deadline = time.time() + 60
            while time.time() < deadline and len(persisted(store)) < 8:
                time.sleep(0.2)
            assert proc.poll() is None, "the run ended before the outage"
            s3.kill()
            down_at = time.monotonic()
            time.sleep(OUTAGE_S)
            s3.start()
            outage_s = time.monotonic() - down_at
            _, stderr = proc.communicate(timeout=180)
            rc = proc.returncode
            if rc != 0:
                # stopping is allowed, but cleanly: a reason that names the store, no traceback
                assert "Traceback" not in stderr, stderr[-3000:]
                assert "s3://" in stderr, stderr[-3000:]
                rerun = _cli(spec, s3)
                _, stderr2 = rerun.communicate(timeout=180)
                assert rerun.returncode == 0, stderr2[-3000:]
            stats = sim.stats()
        yield Outage(rc, stderr, outage_s, stats, store)
    finally:
        s3.stop()
        shutil.rmtree(base, ignore_errors=True)


def test_s3_outage_leaves_whole_parts_and_every_prompt_once(outage):
    assert outage.outage_s >= OUTAGE_S
    all_part_bytes(outage.store)  # every part decodes: no torn part
    recs = persisted(outage.store)
    assert_exactly_once(recs, range(N))
    assert all(r["status"] == "ok" for r in recs)
    prog = progress(outage.store)
    assert prog["outcome"] == "Done"
    assert prog["samples"] == {"total": N, "done": N, "rejected": 0, "discarded": 0, "failed": 0}
    assert Decimal(prog["spentUSD"]) == spent_sum(recs) <= Decimal("5.00")
    assert outage.stats["faults"] == {}  # the provider itself never failed


def test_s3_outage_pays_each_answer_exactly_once(outage):
    recs = persisted(outage.store)
    # the provider never failed, so every sample took one attempt and was billed once
    assert [r["row"] for r in recs if r["attempts"] != 1] == []
    assert outage.stats["requests"] == N
    assert Decimal(progress(outage.store)["spentUSD"]) == Decimal(outage.stats["billedUSD"])

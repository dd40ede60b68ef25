"""`generation.ray.mode: Submit` end to end: the operator submits to a real Ray head on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess

from .conftest import NS, OperatorProcess, condition, dsg, free_port, status_of, wait_for
from .test_e2e import gen_spec, phase_is, secrets, write_prompts
from .testbed import DSG


@pytest.fixture(scope="module")
def ray_head() -> Iterator[str]:
    """`ray start --head --block` in its own process group, stopped by that group's id.

    Ray's CLI as this interpreter's module, not the `ray` script beside it: Ray's workers (the run's driver's
    coordinator and shard actors) run the Python `ray start` ran under, which must be the one eyrie is installed
    in; a venv's `ray` may be a link to another environment's script (its shebang that environment's Python).
    """
    tmp = Path(tempfile.mkdtemp(prefix="eyr-", dir="/tmp"))  # Ray's socket paths must stay short
    port = free_port()
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}"}
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port=0",
           f"--dashboard-port={port}", f"--ray-client-server-port={free_port()}",
           f"--dashboard-agent-listen-port={free_port()}", "--dashboard-host=127.0.0.1", "--include-dashboard=true",
           "--num-cpus=2", "--disable-usage-stats", f"--temp-dir={tmp}"]
    log = (tmp / "ray.log").open("wb")
    # cwd: not the checkout. The dashboard's forkserver is `python -c`, which puts the cwd first on sys.path,
    # where the checkout's operator/ (eyrie.operator's source) shadows the stdlib's `operator`: an interpreter
    # whose site-packages hold no .pth that happens to import it first dies there on `import collections`.
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp)
    address = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"ray start exited: {(tmp / 'ray.log').read_text()[-2000:]}")
        try:
            return httpx.get(f"{address}/api/version", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        wait_for("Ray dashboard", up, timeout=120, every=0.5)
        yield address
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_submit_mode_runs_once_across_an_operator_restart(cluster, operator: OperatorProcess, ray_head, s3_env,
                                                          s3_bucket, tmp_path):
    from ray.job_submission import JobSubmissionClient

    secrets(cluster, s3_env)
    prompts = write_prompts(tmp_path / "p.jsonl", 10)
    with SimulatorProcess(SimulatorConfig(latency_ms=200)) as sim:
        spec = gen_spec(prompts, s3_env, s3_bucket, sim.base_url, concurrency=2)
        spec["generation"]["ray"] = {"mode": "Submit", "address": ray_head}
        cluster.create(DSG, NS, dsg("sub", spec))
        client = JobSubmissionClient(ray_head)
        sid = "eyrie-default-sub-1"
        wait_for("submission", lambda: any(j.submission_id == sid for j in client.list_jobs()), timeout=120)
        operator.kill()  # restart while the job runs: it must not be submitted a second time
        operator.start()
        wait_for("Succeeded", phase_is(cluster, "sub", "Succeeded"), timeout=180)
        assert sim.stats()["completed"] == 10
    ours = [j for j in client.list_jobs() if (j.submission_id or "").startswith("eyrie-default-sub-")]
    assert [j.submission_id for j in ours] == [sid]
    wait_for("the driver to exit", lambda: client.get_job_status(sid).value == "SUCCEEDED", timeout=60)
    env_vars = (ours[0].runtime_env or {}).get("env_vars") or {}
    assert env_vars["EYRIE_ATTEMPT"] == "1"
    assert env_vars["RAY_JOB_STOP_WAIT_TIME_S"] == "40"  # requestTimeoutSeconds 10 + 30
    st = status_of(cluster, "sub")
    assert st["samples"]["done"] == 10 and st["attempt"] == "1"
    assert condition(cluster, "sub", "Succeeded")["status"] == "True"


def test_submit_mode_suspend_stops_the_job_gracefully_and_resume_submits_attempt_2(
        cluster, operator: OperatorProcess, ray_head, s3_env, s3_bucket, tmp_path):
    from ray.job_submission import JobSubmissionClient

    secrets(cluster, s3_env)
    prompts = write_prompts(tmp_path / "p.jsonl", 30)
    client = JobSubmissionClient(ray_head)
    with SimulatorProcess(SimulatorConfig(latency_ms=400)) as sim:
        spec = gen_spec(prompts, s3_env, s3_bucket, sim.base_url, concurrency=2)
        spec["generation"]["ray"] = {"mode": "Submit", "address": ray_head}
        cluster.create(DSG, NS, dsg("subp", spec))
        wait_for("some samples done", lambda: (status_of(cluster, "subp").get("samples") or {}).get("done", 0) >= 2,
                 timeout=180)
        cluster.patch(DSG, NS, "subp", {"spec": {"suspend": True}})
        # under the 40 s RAY_JOB_STOP_WAIT_TIME_S after which Ray kills the driver: it left on SIGTERM alone
        wait_for("Ray stopped attempt 1", lambda: client.get_job_status("eyrie-default-subp-1").value == "STOPPED",
                 timeout=35)
        wait_for("Suspended", phase_is(cluster, "subp", "Suspended"), timeout=60)
        assert condition(cluster, "subp", "Suspended")["reason"] == "SuspendedByUser"
        assert status_of(cluster, "subp")["samples"]["done"] < 30
        cluster.patch(DSG, NS, "subp", {"spec": {"suspend": False}})
        wait_for("Succeeded", phase_is(cluster, "subp", "Succeeded"), timeout=180)
        stats = sim.stats()
    assert stats["completed"] == 30  # attempt 2 re-requested nothing attempt 1 persisted
    ids = sorted(j.submission_id for j in client.list_jobs()
                 if (j.submission_id or "").startswith("eyrie-default-subp-"))
    assert ids == ["eyrie-default-subp-1", "eyrie-default-subp-2"]
    assert status_of(cluster, "subp")["attempt"] == "2"

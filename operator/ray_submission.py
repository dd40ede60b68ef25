"""Ray's job API, as the operator uses it: `generation.ray.mode: Submit` submits each attempt to a user's existing
Ray cluster (`ray.job_submission.JobSubmissionClient`, by its dashboard address), reads its state and stops it;
a RayJob's graceful stop goes through the same API on the cluster KubeRay made.

The client is synchronous and talks to the dashboard over HTTP, so each call runs in a thread; reading a state and
stopping a job are bounded by `RAY_TIMEOUT` (an unreachable dashboard must not stall a pass), a submission is not.
Ray is imported on the first call: an operator that never meets a Ray job does not pay for the import.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

from eyrie.jobs.spec import DatasetGenerationSpec

from . import children
from .kube import Kube
from .secret_refs import api_key, s3_credentials

RAY_TIMEOUT = 10.0


async def job_status(address: str, submission_id: str) -> str | None:
    """Ray's state of a submission (`PENDING`, `RUNNING`, ...), or None when Ray does not know the id."""
    return await asyncio.wait_for(asyncio.to_thread(_status, address, submission_id), RAY_TIMEOUT)


async def submit(address: str, submission_id: str, spec_yaml: str, env: dict[str, str]) -> None:
    """Submit one attempt unless Ray already knows its id (a restart must not submit twice)."""
    await asyncio.to_thread(_submit, address, submission_id, spec_yaml, env)


async def stop_job(address: str, job_id: str) -> None:
    """Ask Ray to stop a job (SIGTERM: the job drains and flushes)."""
    await asyncio.wait_for(asyncio.to_thread(_stop, address, job_id), RAY_TIMEOUT)


async def submission_env(kube: Kube, namespace: str, spec: DatasetGenerationSpec, attempt: str,
                         uid: str) -> dict[str, str]:
    """Env of a submission. An existing cluster has no pod env of ours, so the API key and S3 keys go
    in the job's runtime_env: Ray keeps them in its job table, readable by whoever can reach that
    cluster's dashboard (who can run code there anyway). RayJob mode keeps them in Secrets only."""
    env = {"EYRIE_ATTEMPT": attempt, **children.stop_env(spec)}
    if uid:
        env["EYRIE_RUN_ID"] = uid
    if spec.output.endpoint:
        env["EYRIE_S3_ENDPOINT"] = spec.output.endpoint
    key = await api_key(kube, namespace, spec)
    if key is not None:
        env["EYRIE_API_KEY"] = key
    creds = await s3_credentials(kube, namespace, spec)
    if creds is not None:
        env["EYRIE_S3_ACCESS_KEY"], env["EYRIE_S3_SECRET_KEY"] = creds.access_key, creds.secret_key
    return env


def _client(address: str) -> Any:
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


def _status(address: str, submission_id: str) -> str | None:
    try:
        return str(_client(address).get_job_status(submission_id).value)
    except RuntimeError as e:  # the client raises RuntimeError for an unknown submission id
        if "does not exist" in str(e) or "404" in str(e):
            return None
        raise


def _submit(address: str, submission_id: str, spec_yaml: str, env: dict[str, str]) -> None:
    if _status(address, submission_id) is not None:
        return
    with tempfile.TemporaryDirectory(prefix="eyrie-submit-") as d:
        Path(d, children.SPEC_KEY).write_text(spec_yaml)
        _client(address).submit_job(
            entrypoint=f"eyrie run {children.SPEC_KEY} --until samples", submission_id=submission_id,
            runtime_env={"working_dir": d, "env_vars": env})


def _stop(address: str, job_id: str) -> None:
    _client(address).stop_job(job_id)

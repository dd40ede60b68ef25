"""End to end: the real `eyrie operator` process against the emulated API server.

The tests play KubeRay and the kubelet: they run the real generation entrypoint (`eyrie run ...
--until samples`, simulator provider, SeaweedFS S3) for each RayJob the operator creates, and patch
the children's status as those controllers would.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

from eyrie.jobs import records
from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess
from eyrie.jobs.store import S3Credentials, open_store

from .conftest import NS, condition, dsg, status_of, wait_for
from .kube import DSG, RAYJOBS

API_KEY = "sk-or-v1-operator-e2e-key-0123456789abcdef"
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
        "generation": {"shards": 2, "flushSeconds": 0.2, "ray": {"mode": "RayJob", "image": "eyrie-ray:test",
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


def test_apply_runs_generation_to_succeeded_with_a_manifest(cluster, operator, player, s3_env, s3_bucket, tmp_path):
    secrets(cluster, s3_env)
    prompts = write_prompts(tmp_path / "p.jsonl", 12)
    with SimulatorProcess(SimulatorConfig(latency_ms=5)) as sim:
        cluster.create(DSG, NS, dsg("run1", gen_spec(prompts, s3_env, s3_bucket, sim.base_url)))
        rj = player.rayjob("run1-gen-1")
        assert rj["metadata"]["annotations"]["eyrie.dev/attempt"] == "1"
        owner = rj["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("DatasetGeneration", "run1")
        assert owner["uid"] == cluster.get(DSG, NS, "run1")["metadata"]["uid"]
        assert rj["spec"]["shutdownAfterJobFinishes"] is True
        rc = player.run_rayjob("run1-gen-1")
        assert rc == 0, player.log("run1-gen-1")
        wait_for("Succeeded", phase_is(cluster, "run1", "Succeeded"), timeout=20)
        billed = Decimal(sim.stats()["billedUSD"])
    st = status_of(cluster, "run1")
    assert st["outputManifest"] == f"{s3_bucket}/run/manifest.json"
    assert st["samples"] == {"total": 12, "done": 12, "dropped": 0, "failed": 0}
    assert Decimal(st["spentUSD"]) == billed > 0
    cond = condition(cluster, "run1", "Succeeded")
    assert cond is not None and cond["status"] == "True" and cond["observedGeneration"] == 1
    manifest = json.loads(store_of(s3_env, s3_bucket).get(records.MANIFEST))
    assert manifest["attempt"] == "1" and manifest["samples"]["done"] == 12
    assert [e["reason"] for e in cluster.events(NS, "run1")] == ["Succeeded"]
    # the API key never reached the spec the job reads, nor the status
    cm = cluster.get(("", "v1", "configmaps"), NS, "run1-spec")
    assert API_KEY not in json.dumps(cm) and API_KEY not in json.dumps(st)
    assert 'eyrie_datasetgenerations{phase="Succeeded"} 1.0' in operator.metrics()


def test_budget_exhaustion_suspends_then_raised_budget_resumes_paying_nothing_twice(
        cluster, operator, player, s3_env, s3_bucket, tmp_path):
    secrets(cluster, s3_env)
    prompts = write_prompts(tmp_path / "p.jsonl", 40)
    with SimulatorProcess(SimulatorConfig(latency_ms=5)) as sim:
        cluster.create(DSG, NS, dsg("budget", gen_spec(prompts, s3_env, s3_bucket, sim.base_url, max_usd="0.01")))
        rc = player.run_rayjob("budget-gen-1")
        assert rc == 3, player.log("budget-gen-1")  # BudgetExhausted
        wait_for("Suspended", phase_is(cluster, "budget", "Suspended"), timeout=15)
        doc = cluster.get(DSG, NS, "budget")
        assert doc["spec"]["suspend"] is True
        cond = condition(cluster, "budget", "Suspended")
        spent1 = Decimal(status_of(cluster, "budget")["spentUSD"])
        assert cond["status"] == "True" and cond["reason"] == "BudgetExceeded"
        assert cond["message"].startswith(f"spent {spent1} USD of the 0.01 USD budget")
        warnings = [e for e in cluster.events(NS, "budget") if e["type"] == "Warning"]
        assert [(e["reason"], e["message"]) for e in warnings] == [("BudgetExceeded", cond["message"])]
        wait_for("attempt 1 RayJob deleted", lambda: cluster.get(RAYJOBS, NS, "budget-gen-1") is None)
        done1 = status_of(cluster, "budget")["samples"]["done"]
        assert 0 < done1 < 40

        cluster.patch(DSG, NS, "budget", {"spec": {"budget": {"maxUSD": "1.00"}, "suspend": False}})
        rj = player.rayjob("budget-gen-2")
        assert rj["metadata"]["annotations"]["eyrie.dev/attempt"] == "2"
        rc = player.run_rayjob("budget-gen-2")
        assert rc == 0, player.log("budget-gen-2")
        wait_for("Succeeded", phase_is(cluster, "budget", "Succeeded"), timeout=20)
        stats = sim.stats()
    st = status_of(cluster, "budget")
    assert st["attempt"] == "2"
    assert st["samples"]["done"] == 40
    assert stats["completed"] == 40  # every prompt paid once over both attempts
    assert Decimal(st["spentUSD"]) == Decimal(stats["billedUSD"])
    resumed = condition(cluster, "budget", "Suspended")
    assert (resumed["status"], resumed["reason"]) == ("False", "Resumed")
    ids = [r["sample_id"] for r in records.iter_records(store_of(s3_env, s3_bucket))]
    assert len(ids) == len(set(ids)) == 40
    assert 'eyrie_suspensions_total{reason="BudgetExceeded"} 1.0' in operator.metrics()

"""The operator killed (SIGKILL) and restarted in each phase: no duplicate children, no lost status.

Phases are staged the way the other end-to-end tests stage them: the test plays KubeRay and the
kubelet and writes the generation job's progress.json itself.
"""

from __future__ import annotations

from typing import Any

from .conftest import API_KEY, NS, condition, dsg, status_of, wait_for, write_pod_summary
from .test_e2e import file_spec, phase_is, write_progress
from .testbed import DSG, JOBS, RAYJOBS


def restart(operator: Any, name: str) -> None:
    operator.kill()
    operator.start()
    operator.settled(name)


def names(cluster: Any, kind: tuple[str, str, str]) -> list[str]:
    return sorted(o["metadata"]["name"] for o in cluster.list(kind, NS))


def stable(status: dict) -> dict:
    """What a restart must not change: phase, attempt, figures and each condition's state."""
    conds = {c["type"]: (c["status"], c["reason"], c["lastTransitionTime"]) for c in status.get("conditions", [])}
    return {k: status.get(k) for k in ("phase", "attempt", "spentUSD", "samples")} | {"conditions": conds}


def test_restart_in_every_phase_keeps_children_and_status(cluster, operator, player, tmp_path):
    out = tmp_path / "out"
    spec = file_spec(out, extraction={"enabled": True, "image": "eyrie-sglang:test", "pods": 1})
    cluster.create(DSG, NS, dsg("ph", spec))

    # Pending: the API key's Secret is missing
    wait_for("SecretsReady=False", lambda: (condition(cluster, "ph", "SecretsReady") or {}).get("status") == "False")
    before = stable(status_of(cluster, "ph"))
    restart(operator, "ph")
    assert stable(status_of(cluster, "ph")) == before and before["phase"] == "Pending"
    assert names(cluster, RAYJOBS) == []

    # Canary: generation running
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    player.rayjob("ph-gen-1")
    write_progress(out, "1", "Running", 30, "0.30")
    wait_for("Canary", phase_is(cluster, "ph", "Canary"))
    before = stable(status_of(cluster, "ph"))
    restart(operator, "ph")
    assert stable(status_of(cluster, "ph")) == before
    assert names(cluster, RAYJOBS) == ["ph-gen-1"]

    # Generating: past the canary
    write_progress(out, "1", "Running", 250, "2.50")
    wait_for("Generating", phase_is(cluster, "ph", "Generating"))
    before = stable(status_of(cluster, "ph"))
    restart(operator, "ph")
    assert stable(status_of(cluster, "ph")) == before
    assert names(cluster, RAYJOBS) == ["ph-gen-1"]

    # Extracting: generation done, the extraction Job created once
    write_progress(out, "1", "Done", 300, "3.00", stage="samples")
    wait_for("extraction Job", lambda: cluster.get(JOBS, NS, "ph-extract"))
    wait_for("Extracting", phase_is(cluster, "ph", "Extracting"))
    before = stable(status_of(cluster, "ph"))
    restart(operator, "ph")
    assert stable(status_of(cluster, "ph")) == before
    assert names(cluster, JOBS) == ["ph-extract"]
    assert names(cluster, ("", "v1", "configmaps")) == ["ph-spec"]

    # Succeeded: the pod's summary, the Job complete, the manifest written once
    write_pod_summary(out, 0, 1, shard=0, samples=300, tokens=30000, nbytes=4096)
    player.complete_job("ph-extract")
    wait_for("Succeeded", phase_is(cluster, "ph", "Succeeded"))
    before = stable(status_of(cluster, "ph"))
    restart(operator, "ph")
    after = status_of(cluster, "ph")
    assert stable(after) == before and after["outputManifest"] == f"file://{out}/manifest.json"
    assert names(cluster, RAYJOBS) == ["ph-gen-1"] and names(cluster, JOBS) == ["ph-extract"]


def test_restart_while_suspended_by_the_budget_keeps_it_suspended(cluster, operator, player, tmp_path):
    out = tmp_path / "out"
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    cluster.create(DSG, NS, dsg("bx", file_spec(out)))
    player.rayjob("bx-gen-1")
    write_progress(out, "1", "BudgetExhausted", 40, "4.99")
    wait_for("Suspended", phase_is(cluster, "bx", "Suspended"))
    before = stable(status_of(cluster, "bx"))
    assert before["conditions"]["Suspended"][:2] == ("True", "BudgetExceeded")
    restart(operator, "bx")
    assert stable(status_of(cluster, "bx")) == before
    assert cluster.get(DSG, NS, "bx")["spec"]["suspend"] is True
    # the suspended attempt is never replaced while suspended
    assert [n for n in names(cluster, RAYJOBS) if n != "bx-gen-1"] == []

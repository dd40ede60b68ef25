"""What only a real API server and controller manager can show: the garbage collector removing a
DatasetGeneration's children, and optimistic concurrency between the operator and a user editing the spec."""

from __future__ import annotations

from typing import Any

from .conftest import API_KEY, NS, dsg, status_of, wait_for
from .test_e2e import file_spec, phase_is, write_progress
from .testbed import CONFIGMAPS, DSG, JOBS, PODS, RAYCLUSTERS, RAYJOBS, api_path


def owned_by(doc: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    [ref] = doc["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"]) == ("DatasetGeneration", owner["metadata"]["name"],
                                                       owner["metadata"]["uid"])
    return ref


def test_kubectl_delete_garbage_collects_rayjob_job_and_configmap(cluster, operator, player, tmp_path):
    out = tmp_path / "out"
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    cluster.create(DSG, NS, dsg("gc", file_spec(out, extraction={"enabled": True, "image": "eyrie-sglang:test",
                                                                  "pods": 2})))
    rj = player.accepted("gc-gen-1")  # KubeRay created its RayCluster: a grandchild for the collector too
    write_progress(out, "1", "Done", 100, "1.00", stage="samples")
    job = wait_for("extraction Job", lambda: cluster.get(JOBS, NS, "gc-extract"))
    pods = player.pods("gc-extract", 2)
    owner = cluster.get(DSG, NS, "gc")
    cm = cluster.get(CONFIGMAPS, NS, "gc-spec")
    for child in (rj, job, cm):
        # controller + blockOwnerDeletion: a foreground delete of the DatasetGeneration waits for each child
        ref = owned_by(child, owner)
        assert ref["controller"] is True and ref["blockOwnerDeletion"] is True, (child["kind"], ref)
    ray_cluster = rj["status"]["rayClusterName"]

    out_ = cluster.kubectl("delete", "dsg", "gc", "--cascade=foreground", "--timeout=60s", check=True)
    assert "deleted" in out_.stdout
    assert cluster.get(DSG, NS, "gc") is None
    # nothing is left behind. Not asserted at the owner's removal: the collector's graph is fed by watches, and a
    # child it has not seen yet when the owner goes does not block it; it is collected as soon as the graph has it.
    children = [(RAYJOBS, "gc-gen-1"), (JOBS, "gc-extract"), (CONFIGMAPS, "gc-spec"), (RAYCLUSTERS, ray_cluster),
                *[(PODS, p["metadata"]["name"]) for p in pods]]
    wait_for("RayJob, Job, ConfigMap, RayCluster and the Job's pods collected",
             lambda: [name for res, name in children if cluster.get(res, NS, name) is not None] == [], timeout=60)


def test_status_patches_racing_spec_edits_lose_neither(cluster, operator, player, tmp_path):
    out = tmp_path / "out"
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    cluster.create(DSG, NS, dsg("race", file_spec(out)))
    player.rayjob("race-gen-1")
    for i in range(1, 9):  # the job's progress (the operator writes status) and the user's edits interleave
        write_progress(out, "1", "Running", 10 * i, f"{i / 10:.2f}")
        cluster.kubectl("patch", "dsg", "race", "--type=merge", "-p",
                        f'{{"spec":{{"budget":{{"maxUSD":"{50 + i}"}}}}}}', check=True)
    wait_for("the last progress in status", lambda: status_of(cluster, "race").get("samples", {}).get("done") == 80)
    doc = cluster.get(DSG, NS, "race")
    assert doc["spec"]["budget"]["maxUSD"] == "58" and doc["status"]["spentUSD"] == "0.80"

    # a user's write from a stale read cannot undo what the operator wrote since: the server answers 409
    stale = cluster.get(DSG, NS, "race")
    write_progress(out, "1", "BudgetExhausted", 90, "0.90")
    wait_for("Suspended", phase_is(cluster, "race", "Suspended"))
    stale["spec"]["api"]["maxConcurrency"] = 3
    assert cluster.api is not None
    r = cluster.api.put(api_path(*DSG, NS, "race"), json=stale)
    assert r.status_code == 409, r.text
    # re-read and re-apply until no write came in between (as kubectl edit does on a conflict): both the
    # operator's suspend and the user's edit stand
    def reapply() -> bool:
        fresh = cluster.get(DSG, NS, "race")
        fresh["spec"]["api"]["maxConcurrency"] = 3
        r = cluster.api.put(api_path(*DSG, NS, "race"), json=fresh)
        if r.status_code != 409:
            r.raise_for_status()
        return r.status_code != 409

    wait_for("a write from a fresh read", reapply)
    doc = cluster.get(DSG, NS, "race")
    assert doc["spec"]["suspend"] is True and doc["spec"]["api"]["maxConcurrency"] == 3
    assert status_of(cluster, "race")["samples"]["done"] == 90


"""The operator's pilot against the real control plane (issue 41): the real `eyrie operator` process with the chart's
token and RBAC, the real Job controller and its pod failure policy, the CRD's printer columns through kubectl. The
test plays the pilot's pod (the data plane's side): it writes what `eyrie pilot` writes (progress.json at stage
pilot, pilot.json) and ends the pod with the command's exit code, as a kubelet reports it. What a real pod on the
node does is test_node_pilot.py; here the operator's side is timed and checked in seconds."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from eyrie.jobs.contract import layout
from eyrie.jobs.contract.fingerprint import pilot_key
from eyrie.jobs.contract.pilot import EXIT_FAILED, PilotVerdict, write_verdict
from eyrie.jobs.spec import parse_spec
from eyrie.jobs.store import open_store
from eyrie.operator import children

from .conftest import API_KEY, NS, condition, dsg, status_of, wait_for
from .test_e2e import file_spec
from .testbed import DSG, JOBS, PODS, RAYJOBS


def verdict(spec: dict[str, Any], own: str, other: str, passed: bool) -> PilotVerdict:
    """pilot.json as the pilot writes it for `spec`: the run's own option against the other mode."""
    def option(name: str, value: float) -> dict[str, Any]:
        return {"option": name, "own": name == own, "acceptedLength": {"value": value, "low": value - 0.05,
                                                                        "high": value + 0.05},
                "switch": json.dumps({"spec": {"tools": {"mode": name}}})}
    values = {own: 1.27 if passed else 1.23, other: 1.23 if passed else 1.27}
    sentence = (f"pilot: a drafter trained on {own} accepts {values[own]} tokens per step, on {other} "
                f"{values[other]}: {'keep' if passed else 'switch to'} {other if not passed else own}.")
    return PilotVerdict.model_validate({
        "key": pilot_key(parse_spec({"spec": spec}).spec), "policy": "require", "margin": 0.0, "passed": passed,
        "proceed": passed, "sentence": sentence, "own": own, "bestAlternative": other,
        "options": [option(own, values[own]), option(other, values[other])], "prompts": 20, "heldout": 5,
        "spentUSD": "0.004", "adopted": 20 if passed else 0, "evaluation": "evaluation.json"})


def piloted(out: Path, attempt: str, outcome: str, spent: str = "0.004") -> None:
    """progress.json as the pilot's pod writes it (stage pilot; the answers it bought, what they cost)."""
    open_store(f"file://{out}").put(layout.PROGRESS, json.dumps({
        "attempt": attempt, "outcome": outcome, "stage": "pilot", "spentUSD": spent, "pilotUSD": spent,
        "reservedUSD": "0", "maxUSD": "5", "samples": {"total": 30}, "updatedAt": "2026-01-01T00:00:00Z",
        "pilot": {"step": "decided", "prompts": 20, "answers": 40, "answersPlanned": 40, "spentUSD": spent}}).encode())


def end_pilot_pod(cluster: Any, player: Any, name: str, code: int) -> dict[str, Any]:
    """The pilot Job's pod ends with `code` (its kubelet's report); the Job controller judges the Job."""
    uid = cluster.get(JOBS, NS, name)["metadata"]["uid"]
    [pod] = wait_for(f"the pod of Job {name}", lambda: [p for p in cluster.list(
        PODS, NS, labelSelector=f"batch.kubernetes.io/job-name={name}") if any(
        o["uid"] == uid for o in p["metadata"].get("ownerReferences") or [])] or None)
    player.end_pod(pod, code)
    return pod


def job_ended(cluster: Any, name: str, type_: str) -> bool:
    return any(c["type"] == type_ and c["status"] == "True" for c in ((cluster.get(JOBS, NS, name) or {}).get(
        "status") or {}).get("conditions") or [])


def test_a_require_pilot_suspends_on_its_verdict_and_the_other_mode_resumes_through_a_new_pilot_job(
        cluster, operator, player, tmp_path):
    out, name = tmp_path / "out", "piloted"
    cluster.secret(NS, "provider", {"api-key": API_KEY})
    spec = file_spec(out, tools={"mode": "text"},
                     extraction={"enabled": True, "image": "eyrie-extractor:test", "pods": 1, "gpusPerPod": 0},
                     pilot={"prompts": 20, "heldout": 5, "policy": "require"})
    cluster.create(DSG, NS, dsg(name, spec))
    job_name = children.pilot_name(name)

    # the pilot's Job first, owned, with the run's Secrets as references and the attempt it runs under
    job = wait_for("the pilot Job", lambda: cluster.get(JOBS, NS, job_name))
    assert job["metadata"]["ownerReferences"][0]["name"] == name
    assert job["metadata"]["annotations"][children.ATTEMPT_ANNOTATION] == "1"
    [container] = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["eyrie", "pilot", "/etc/eyrie/spec.yaml", "--device", "cpu"]
    assert API_KEY not in json.dumps(job)
    wait_for("phase Pilot", lambda: status_of(cluster, name).get("phase") == "Pilot")
    assert cluster.list(RAYJOBS, NS) == []

    # the pilot decides against text and exits 10: the Job fails (its pod failure policy), the verdict decides
    piloted(out, "1", "PilotFailed")
    write_verdict(open_store(f"file://{out}"), verdict(spec, "text", "structured", passed=False))
    end_pilot_pod(cluster, player, job_name, EXIT_FAILED)
    wait_for("Suspended", lambda: status_of(cluster, name).get("phase") in ("Suspended", "Failed"))
    suspended = condition(cluster, name, "Suspended")
    assert (suspended["status"], suspended["reason"]) == ("True", "PilotFailed"), status_of(cluster, name)
    assert cluster.get(DSG, NS, name)["spec"]["suspend"] is True
    assert wait_for("the Job failed", lambda: job_ended(cluster, job_name, "Failed"))
    line = (f"kubectl patch dsg {name} -n {NS} --type merge -p "
            """'{"spec":{"suspend":false,"tools":{"mode":"structured"}}}'""")
    assert line in suspended["message"]
    passed = condition(cluster, name, "PilotPassed")
    assert (passed["status"], passed["reason"]) == ("False", "PilotFailed")
    assert [(e["type"], e["reason"]) for e in cluster.events(NS, name) if e["reason"].startswith("Pilot")] == [
        ("Warning", "PilotFailed")]
    got = cluster.kubectl("get", "dsg", name, "-n", NS, "-o", "wide", check=True).stdout.splitlines()
    columns = dict(zip(got[0].split(), got[1].split(), strict=False))
    assert (columns["PHASE"], columns["SPENT"], columns["ACCEPTED"], columns["ALT"], columns["ALTACCEPTED"]) == (
        "Suspended", "0.004", "1.23", "structured", "1.27")
    assert cluster.list(RAYJOBS, NS) == []  # nothing generated beyond the pilot

    # the message's line: the other mode, unsuspended -> the next attempt's pilot Job, once the old one is gone
    cluster.kubectl(*shlex.split(line)[1:], check=True)
    wait_for("the next attempt's pilot Job", lambda: (cluster.get(JOBS, NS, job_name) or {}).get(
        "metadata", {}).get("annotations", {}).get(children.ATTEMPT_ANNOTATION) == "2", timeout=60)
    wait_for("attempt 2 in the status", lambda: status_of(cluster, name).get("attempt") == "2")
    assert cluster.list(RAYJOBS, NS) == []
    structured = {**spec, "tools": {"mode": "structured"}}
    piloted(out, "2", "PilotPassed")
    write_verdict(open_store(f"file://{out}"), verdict(structured, "structured", "text", passed=True))
    end_pilot_pod(cluster, player, job_name, 0)
    rj = player.rayjob(children.generation_name(name, "2"), timeout=60)
    assert rj["metadata"]["annotations"][children.ATTEMPT_ANNOTATION] == "2"
    # the pass that creates the RayJob patches the status after it (kopf writes a handler's status on return)
    wait_for("PilotPassed True", lambda: (condition(cluster, name, "PilotPassed") or {}).get("status") == "True")
    assert condition(cluster, name, "PilotPassed")["reason"] == "PilotPassed"
    st = status_of(cluster, name)
    assert st["pilot"]["passed"] is True and (st["pilot"]["runOption"], st["pilot"]["runAccepted"]) == (
        "structured", 1.27)
    assert condition(cluster, name, "Suspended")["reason"] == "Resumed"
    assert ("Normal", "PilotPassed") in {(e["type"], e["reason"]) for e in cluster.events(NS, name)}

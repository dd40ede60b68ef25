"""Table tests of the operator's pilot decisions (spec.pilot): the pilot Job before any generation child, its verdict
into PilotPassed, events and status, then generation or a suspension that says how to resume; a resume with the other
option starting generation without a second pilot."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from eyrie.jobs.spec import DatasetGenerationStatus
from eyrie.operator import children, conditions
from eyrie.operator.reconcile import (
    CreatePilot,
    Event,
    PilotChild,
    PilotJudgement,
    PodProblem,
    SuspendSpec,
    reconcile,
    resume_command,
)

from .test_reconcile import NOW, Case, check, cond, gen, names, obs, prog, spec

KEY = "0123456789abcdef"


def pilot_spec(policy: str = "report", **over: Any):
    return spec(pilot={"policy": policy, "prompts": 20}, extraction__enabled=True, **over)


def job(attempt: str = "1", key: str = KEY, **kw: Any) -> PilotChild:
    return PilotChild(name="dg-pilot", attempt=attempt, key=key, **kw)


def verdict(passed: bool, proceed: bool | None = None, own: str = "text", best: str = "structured") -> PilotJudgement:
    sentence = (f"pilot: a drafter trained on {own} accepts 3.1 [2.9-3.3] tokens per step, on {best} 5.9 "
                f"[5.6-6.2]; the whole dataset would cost $4.10 with {own}, $4.30 with {best}.")
    return PilotJudgement(passed=passed, proceed=passed if proceed is None else proceed, sentence=sentence, own=own,
                          own_accepted=3.1, best=best, best_accepted=5.9, patch={"tools": {"mode": best}})


def piloting(attempt: str = "1", **more: Any):
    return prog(attempt=attempt, stage="pilot", done=0, **more)


def pobs(sp=None, **kw: Any):
    return obs(sp or pilot_spec(), pilot_key=KEY, **kw)


SUSPENDED_PILOT = {"attempt": "1", "phase": "Suspended",
                   "conditions": [cond("Suspended", "True", "PilotFailed"), cond("PilotPassed", "False",
                                                                                 "PilotFailed")]}

CASES = [
    Case("a pilot and no verdict: the pilot Job first, no generation child",
         pobs(), ["CreatePilot"], "Pilot", conds={"PilotPassed": ("False", "PilotRunning")}),
    Case("the pilot's Job waits for the Secrets like any child",
         pobs(missing_secrets=("spec.api.apiKeySecretRef: Secret 'openrouter' not found",)),
         ["Event:Warning:SecretNotFound"], "Pending"),
    Case("the pilot runs: phase Pilot, how far it is",
         pobs(pilot_job=job(), progress=piloting(pilot={"step": "buy", "answers": 7, "answersPlanned": 40,
                                                         "spentUSD": "0.02"})),
         [], "Pilot", conds={"PilotPassed": ("False", "PilotRunning"), "Queued": ("False", "Admitted")}),
    Case("the pilot Job waits for Kueue's admission",
         pobs(pilot_job=job(queued=True)), [], "Pilot", conds={"Queued": ("True", "WaitingForAdmission")}),
    Case("an earlier attempt's pilot Job goes before this attempt's is made",
         pobs(status={"attempt": "2"}, pilot_job=job(attempt="1", active=False, succeeded=True)),
         ["DeletePilot"], "Pilot", attempt="2"),
    Case("a pilot Job for other settings is deleted, even running (never two pilots paying)",
         pobs(pilot_job=job(key="fedcba9876543210")), ["DeletePilot"], "Pilot"),
    Case("a pilot Job being deleted: wait for it",
         pobs(pilot_job=job(key="fedcba9876543210", active=False)), [], "Pilot"),
    Case("the Job failed (exit 10) with a verdict to suspend on: the verdict decides, not the Job's end",
         pobs(pilot_spec("require"), pilot_job=job(active=False, failed=True, reason="PodFailurePolicy"),
              pilot=verdict(False), progress=piloting(outcome="PilotFailed")),
         ["SuspendSpec", "Event:Warning:PilotFailed"], "Suspended", conds={"Suspended": ("True", "PilotFailed")}),
    Case("the verdict passes and its Job has ended: PilotPassed, its event, then the generation RayJob",
         pobs(pilot_job=job(active=False, succeeded=True), pilot=verdict(True),
              progress=piloting(outcome="PilotPassed")),
         ["Event:Normal:PilotPassed", "CreateGeneration"], "Pending", conds={"PilotPassed": ("True", "PilotPassed")}),
    Case("the verdict is in but its Job still writes: generation waits for it to end",
         pobs(pilot_job=job(), pilot=verdict(True), progress=piloting(outcome="PilotPassed")),
         ["Event:Normal:PilotPassed"], "Pilot", conds={"PilotPassed": ("True", "PilotPassed")}),
    Case("policy report: a verdict against the run's data is said (Warning) and the run goes on",
         pobs(pilot_job=job(active=False, succeeded=True), pilot=verdict(False, proceed=True)),
         ["Event:Warning:PilotFailed", "CreateGeneration"], "Pending",
         conds={"PilotPassed": ("False", "PilotFailed")}),
    Case("policy require and the run's data worse: suspended before generating beyond the pilot",
         pobs(pilot_spec("require"), pilot_job=job(active=False, succeeded=True), pilot=verdict(False),
              progress=piloting(outcome="PilotFailed")),
         ["SuspendSpec", "Event:Warning:PilotFailed"], "Suspended",
         conds={"Suspended": ("True", "PilotFailed"), "PilotPassed": ("False", "PilotFailed")}),
    Case("suspended on the verdict: nothing more, no second event",
         pobs(pilot_spec("require", suspend=True), status=SUSPENDED_PILOT, pilot=verdict(False),
              pilot_job=job(active=False, succeeded=True)),
         [], "Suspended", conds={"Suspended": ("True", "PilotFailed")}),
    Case("unsuspended with the same option, still worse under require: suspended again, no new attempt",
         pobs(pilot_spec("require"), status=SUSPENDED_PILOT, pilot=verdict(False),
              pilot_job=job(active=False, succeeded=True), progress=piloting(outcome="PilotFailed")),
         ["SuspendSpec", "Event:Warning:PilotFailed"], "Suspended",
         conds={"Suspended": ("True", "PilotFailed")}),
    Case("unsuspended with the other option (another pilot key): the next attempt, after the old Job is gone",
         pobs(pilot_spec("require", tools={"mode": "structured"}), status=SUSPENDED_PILOT, pilot=None,
              pilot_job=job(active=False, failed=True, reason="PodFailurePolicy"),
              progress=piloting(outcome="PilotFailed")),
         ["Event:Normal:Resumed", "DeletePilot"], "Pilot", attempt="2", conds={"Suspended": ("False", "Resumed")}),
    Case("the old pilot Job gone: the next attempt's pilot Job (it re-buys nothing: the data plane's side)",
         pobs(pilot_spec("require", tools={"mode": "structured"}),
              status={"attempt": "2", "conditions": [cond("Suspended", "False", "Resumed")]},
              progress=piloting(outcome="PilotFailed")),
         ["CreatePilot"], "Pilot", attempt="2"),
    Case("the next attempt's verdict proceeds: the generation RayJob of that attempt",
         pobs(pilot_spec("require", tools={"mode": "structured"}),
              status={"attempt": "2", "conditions": [cond("Suspended", "False", "Resumed"),
                                                     cond("PilotPassed", "False", "PilotFailed")]},
              pilot=verdict(True, own="structured", best="text"), pilot_job=job("2", active=False, succeeded=True),
              progress=piloting("2", outcome="PilotPassed")),
         ["Event:Normal:PilotPassed", "CreateGeneration"], "Pending", attempt="2",
         conds={"PilotPassed": ("True", "PilotPassed")}),
    Case("the pilot out of memory: the run fails naming the limit to raise",
         pobs(pilot_job=job(active=False, failed=True, reason="PodFailurePolicy", message="exit code 137"),
              pod_problems=(PodProblem("OOMKilled", "dg-pilot-x", "pilot", "pilot", "x:1", memory="2Gi"),)),
         ["Event:Warning:OOMKilled", "Event:Warning:OOMKilled"], "Failed",
         conds={"Failed": ("True", "OOMKilled"), "PilotPassed": ("False", "OOMKilled")}),
    Case("the pilot said why it failed: that is the reason's message",
         pobs(pilot_job=job(active=False, failed=True, reason="PodFailurePolicy"),
              progress=piloting(outcome="Failed", message="extraction.model: not found")),
         ["Event:Warning:PilotJobFailed"], "Failed", conds={"Failed": ("True", "PilotJobFailed")}),
    Case("the pilot Job completed without a verdict for these settings: the run fails, saying so",
         pobs(pilot_job=job(active=False, succeeded=True), progress=piloting()),
         ["Event:Warning:PilotIncomplete"], "Failed", conds={"Failed": ("True", "PilotIncomplete")}),
    Case("the budget runs out in the pilot: suspended as any budget stop",
         pobs(pilot_job=job(active=False, succeeded=True), progress=piloting(outcome="BudgetExhausted", spent="9.9")),
         ["SuspendSpec", "Event:Warning:BudgetExceeded"], "Suspended",
         conds={"Suspended": ("True", "BudgetExceeded")}),
    Case("suspended by the user during the pilot: its Job is deleted (its answers are durable)",
         pobs(pilot_spec(suspend=True), pilot_job=job(), progress=piloting()),
         ["Event:Normal:SuspendedByUser", "DeletePilot"], "Suspended"),
    Case("spec.pilot removed while its Job runs: the Job goes before the generation job starts",
         obs(pilot_job=job()), ["DeletePilot"], "Pending"),
    Case("spec.pilot removed, its Job gone: generation starts",
         obs(pilot_job=job(active=False, failed=True), status={"attempt": "1", "pilot": {"answers": 3}}),
         ["CreateGeneration"], "Pending"),
    Case("generation under way: the pilot is not asked again",
         pobs(generation_children=(gen(),), progress=prog(done=500)), [], "Generating"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_pilot_table(case: Case) -> None:
    d = check(case)
    DatasetGenerationStatus.model_validate(d.status)  # what the CRD's status schema accepts


def test_the_pilot_job_runs_where_extraction_runs_with_the_runs_secrets_and_attempt() -> None:
    d = reconcile(pobs(uid="u-1"))
    [create] = [a for a in d.actions if isinstance(a, CreatePilot)]
    body = create.body
    assert body == children.pilot_job("dg", "ns", pilot_spec(), "1", KEY, {}, "u-1")
    meta, pod = body["metadata"], body["spec"]["template"]["spec"]
    assert meta["name"] == "dg-pilot" and meta["labels"][children.ROLE_LABEL] == "pilot"
    assert meta["annotations"] == {children.ATTEMPT_ANNOTATION: "1", children.PILOT_KEY_ANNOTATION: KEY}
    [c] = pod["containers"]
    assert c["image"] == "sgl:1" and c["command"] == ["eyrie", "pilot", children.SPEC_PATH, "--device", "cuda"]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8  # extraction.gpusPerPod: a GPU pod
    assert pod["nodeSelector"] == {"gpu": "h200"} and pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    env = {e["name"]: e for e in c["env"]}
    assert env["EYRIE_ATTEMPT"]["value"] == "1" and env["EYRIE_RUN_ID"]["value"] == "u-1"
    assert env["EYRIE_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "openrouter", "key": "api-key"}}
    assert env["EYRIE_S3_SECRET_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "minio"
    assert all("value" not in e or e["name"] not in ("EYRIE_API_KEY", "EYRIE_S3_SECRET_KEY") for e in c["env"])
    cpu = children.pilot_job("dg", "ns", pilot_spec(extraction__gpusPerPod=0), "1", KEY)
    [cpu_c] = cpu["spec"]["template"]["spec"]["containers"]
    assert "nvidia.com/gpu" not in json.dumps(cpu_c)  # CPU otherwise
    assert cpu_c["command"][-2:] == ["--device", "cpu"]
    rules = body["spec"]["podFailurePolicy"]["rules"]
    assert rules[1]["onExitCodes"] == {"containerName": "pilot", "operator": "NotIn", "values": [0]}
    assert body["spec"]["backoffLimit"] == children.EXTRACT_RETRIES_PER_INDEX


def test_a_require_suspension_says_the_verdict_and_the_kubectl_patch_lines_that_resume() -> None:
    d = reconcile(pobs(pilot_spec("require"), pilot_job=job(active=False, succeeded=True), pilot=verdict(False)))
    suspended = conditions.find(d.status["conditions"], "Suspended")
    assert suspended is not None
    message = suspended["message"]
    assert message.startswith(verdict(False).sentence)
    other = resume_command("dg", "ns", {"tools": {"mode": "structured"}})
    assert other == ("kubectl patch dsg dg -n ns --type merge -p "
                     "'{\"spec\":{\"suspend\":false,\"tools\":{\"mode\":\"structured\"}}}'")
    assert other in message and resume_command("dg", "ns", {"pilot": {"policy": "report"}}) in message
    [event] = [a for a in d.actions if isinstance(a, Event)]
    assert (event.type, event.reason, event.message) == ("Warning", "PilotFailed", message)
    assert any(isinstance(a, SuspendSpec) for a in d.actions)
    assert d.suspended_reason == "PilotFailed"


def test_status_carries_the_verdicts_accepted_lengths_for_kubectl_get() -> None:
    d = reconcile(pobs(pilot_job=job(active=False, succeeded=True), pilot=verdict(True),
                       progress=piloting(outcome="PilotPassed", pilot={"step": "decided", "answers": 40,
                                                                       "answersPlanned": 40, "spentUSD": "0.12"})))
    assert d.status["pilot"] == {"spentUSD": "0.12", "answers": 40, "planned": 40, "passed": True,
                                 "runOption": "text", "runAccepted": 3.1, "bestOption": "structured",
                                 "bestAccepted": 5.9}
    passed = conditions.find(d.status["conditions"], "PilotPassed")
    assert passed is not None and passed["message"] == verdict(True).sentence
    # the next pass finds the condition it wrote: no second event
    again = reconcile(replace(pobs(pilot_job=None, pilot=verdict(True)),
                              status={"attempt": "1", "conditions": d.status["conditions"]}))
    assert "Event:Normal:PilotPassed" not in names(again.actions)
    assert conditions.find(again.status["conditions"], "PilotPassed")["lastTransitionTime"] == NOW


def test_a_pilot_never_runs_twice_at_once_nor_beside_the_generation_job() -> None:
    """Whatever the pilot Job's state, reconcile never creates a second pilot Job while one exists, never creates the
    generation child while any pilot Job still runs, and stops a running one of another attempt or settings."""
    states = [dict(active=True), dict(active=False, succeeded=True), dict(active=False, failed=True),
              dict(active=False)]
    for attempt in ("1", "2"):
        for key in (KEY, "fedcba9876543210"):
            for state in states:
                for v in (None, verdict(True), verdict(False, proceed=True)):
                    d = reconcile(pobs(status={"attempt": "2"}, pilot_job=job(attempt, key, **state), pilot=v))
                    made = names(d.actions)
                    assert "CreatePilot" not in made, (attempt, key, state, v)
                    if state.get("active"):
                        assert "CreateGeneration" not in made, (attempt, key, state, v)
                        if (attempt, key) != ("2", KEY):  # another attempt's or settings': stopped
                            assert "DeletePilot" in made, (attempt, key, state, v)

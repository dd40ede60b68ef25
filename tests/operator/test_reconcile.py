"""Table-driven tests of the operator's pure decisions: (spec, children, progress) -> (actions, status)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

import pytest

from eyrie.jobs.contract.fingerprint import ACCEPT_ANNOTATION, fingerprint
from eyrie.jobs.contract.progress import ProgressError, parse_progress
from eyrie.jobs.spec import DatasetGenerationStatus, parse_spec
from eyrie.jobs.status import SampleCounts
from eyrie.operator import children, conditions
from eyrie.operator.reconcile import (
    CreateExtraction,
    CreateGeneration,
    Decision,
    Event,
    ExtractionChild,
    GenerationChild,
    Observation,
    PodProblem,
    Progress,
    pod_advice,
    reconcile,
)

NOW = "2026-01-01T00:00:00Z"
T0 = 1_000_000.0


def spec_doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "sources": [{"name": "s", "uri": "s3://prompts/s.jsonl"}],
        "target": {"model": "m", "tokenizer": "t"},
        "api": {"baseUrl": "https://openrouter.ai/api/v1",
                "apiKeySecretRef": {"name": "openrouter", "key": "api-key"}},
        "budget": {"maxUSD": "10", "pricing": {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}},
        "generation": {
            "shards": 4,
            "ray": {
                "mode": "RayJob",
                "image": "ray:1",
                "workers": 3,
                "cpusPerWorker": 2,
                "memoryPerWorker": "4Gi",
            },
        },
        "extraction": {
            "enabled": False,
            "image": "sgl:1",
            "pods": 2,
            "gpusPerPod": 8,
            "nodeSelector": {"gpu": "h200"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
        "output": {
            "uri": "s3://out/run",
            "endpoint": "http://minio:9000",
            "credentialsSecretRef": {"name": "minio"},
        },
    }
    for path, value in over.items():
        node = doc
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[k]
        node[keys[-1]] = value
    return doc


def spec(**over: Any):
    return parse_spec(spec_doc(**over)).spec


def prog(
    outcome: str = "Running",
    attempt: str = "1",
    spent: str = "1",
    done: int = 500,
    stage: str = "generate",
    message: str = "",
    **more: Any,
) -> Progress:
    return parse_progress(
        {
            **more,
            "attempt": attempt,
            "outcome": outcome,
            "message": message,
            "spentUSD": spent,
            "reservedUSD": "0.5",
            "maxUSD": "10",
            "stage": stage,
            "samples": {"total": 1000, "done": done, "rejected": 1, "discarded": 3, "failed": 2},
            "tokens": {"input": 10, "output": 20},
            "tools": {"declaredPrompts": 7, "callRate": 0.5, "invalidCalls": 1, "leaks": 0},
        }
    )


def gen(attempt: str = "1", state: str = "Running", **kw: Any) -> GenerationChild:
    return GenerationChild(attempt=attempt, name=f"dg-gen-{attempt}", state=state, **kw)  # type: ignore[arg-type]


def cond(type_: str, status: str, reason: str) -> dict[str, Any]:
    return conditions.make(type_, status, reason, "", "2025-12-31T00:00:00Z", 1)  # type: ignore[arg-type]


SUSPENDED_BUDGET = {
    "attempt": "1",
    "phase": "Suspended",
    "conditions": [cond("Suspended", "True", "BudgetExceeded")],
}
DONE_STATUS = {"attempt": "1", "phase": "Extracting"}


def bound_to(sp) -> dict[str, Any]:
    """<output>/fingerprint.json as a run of `sp` leaves it."""
    fp = fingerprint(sp)
    return {"version": 1, "current": fp.id, "fingerprints": {fp.id: {"fields": dict(fp.fields), "since": "1"}}}


OTHER_MODEL = bound_to(spec(target={"model": "deepseek/deepseek-v4", "tokenizer": "t"}))


def obs(sp=None, status: dict[str, Any] | None = None, **kw: Any) -> Observation:
    sp = sp or spec()
    base = Observation(
        name="dg",
        namespace="ns",
        generation=3,
        labels={},
        spec=sp,
        status=status or {},
        now=NOW,
        now_ts=T0,
        configmap_data=children.configmap("dg", "ns", sp)["data"],
    )
    return replace(base, **kw)


@dataclass
class Case:
    id: str
    observation: Observation
    actions: list[str]  # action class names, in order, Events as "Event:Type:Reason"
    phase: str
    attempt: str = "1"
    conds: dict[str, tuple[str, str]] = field(default_factory=dict)  # type -> (status, reason)


def names(actions: list[Any]) -> list[str]:
    out = []
    for a in actions:
        out.append(f"Event:{a.type}:{a.reason}" if isinstance(a, Event) else type(a).__name__)
    return out


CASES = [
    Case(
        "S3 credentials missing: output not checked yet",
        obs(missing_secrets=("spec.output.credentialsSecretRef.accessKeyKey: Secret 'minio' not found",),
            output_checked=False),
        ["Event:Warning:SecretNotFound"],
        "Pending",
        conds={"SecretsReady": ("False", "SecretNotFound"), "OutputReachable": ("Unknown", "WaitingForCredentials")},
    ),
    Case(
        "extraction Job complete without every pod summary",
        obs(spec(extraction__enabled=True), progress=prog("Done"), summaries_done=1,
            extraction=ExtractionChild("dg-extract", suspended=False, kueue=False, succeeded=2, completions=2)),
        ["Event:Warning:ExtractionIncomplete"],
        "Failed",
        conds={"Failed": ("True", "ExtractionIncomplete")},
    ),
    Case(
        "a job stopped outside the operator ends the run",
        obs(generation_children=(gen(state="Stopped"),), progress=prog("Stopped", message="stopped by a signal")),
        ["Event:Warning:GenerationEnded"],
        "Failed",
        conds={"Failed": ("True", "GenerationEnded")},
    ),
    Case(
        "resume after the job drained on a user suspend",
        obs(status={"attempt": "1", "conditions": [cond("Suspended", "True", "SuspendedByUser")]},
            progress=prog("Stopped")),
        ["Event:Normal:Resumed", "CreateGeneration"],
        "Pending",
        attempt="2",
        conds={"Suspended": ("False", "Resumed")},
    ),
    Case(
        "fresh: configmap and first attempt",
        obs(configmap_data=None),
        ["ApplyConfigMap", "CreateGeneration"],
        "Pending",
        conds={"SecretsReady": ("True", "SecretsFound"), "Suspended": ("False", "NotSuspended")},
    ),
    Case(
        "missing secret waits",
        obs(missing_secrets=("spec.api.apiKeySecretRef: Secret 'openrouter' not found",)),
        ["Event:Warning:SecretNotFound"],
        "Pending",
        conds={"SecretsReady": ("False", "SecretNotFound")},
    ),
    Case(
        "a secret still missing: no second event",
        obs(missing_secrets=("spec.api.apiKeySecretRef: Secret 'openrouter' not found",),
            status={"attempt": "1", "conditions": [conditions.make(
                "SecretsReady", "False", "SecretNotFound", "spec.api.apiKeySecretRef: Secret 'openrouter' not found",
                "2025-12-31T00:00:00Z", 1)]}),
        [],
        "Pending",
        conds={"SecretsReady": ("False", "SecretNotFound")},
    ),
    Case(
        "a Ray pod waits on an image the node lacks: PodsHealthy False, the run waits",
        obs(generation_children=(gen(state="Pending"),),
            pod_problems=(PodProblem("ImageNotPresent", "dg-gen-1-head", "generation", "ray-head", "ray:1"),)),
        ["Event:Warning:ImageNotPresent"],
        "Pending",
        conds={"PodsHealthy": ("False", "ImageNotPresent")},
    ),
    Case(
        "the pods run again: PodsHealthy True",
        obs(generation_children=(gen(state="Running"),), progress=prog(),
            status={"attempt": "1", "conditions": [cond("PodsHealthy", "False", "ImageNotPresent")]}),
        [],
        "Generating",
        conds={"PodsHealthy": ("True", "PodsRunning")},
    ),
    Case(
        "an extraction pod OOMKilled fails the run naming the memory to raise",
        obs(spec(extraction__enabled=True), progress=prog("Done"),
            extraction=ExtractionChild("dg-extract", False, False, failed=True, reason="PodFailurePolicy",
                                       message="Container extract for pod ns/dg-extract-0-x failed with exit code 137"),
            pod_problems=(PodProblem("OOMKilled", "dg-extract-0-x", "extraction", "extract", "sgl:1",
                                     memory="64Mi"),)),
        ["Event:Warning:OOMKilled", "Event:Warning:OOMKilled"],
        "Failed",
        conds={"Failed": ("True", "OOMKilled"), "PodsHealthy": ("False", "OOMKilled")},
    ),
    Case(
        "unreachable output waits, said once by a Warning",
        obs(progress_error="spec.output.uri: cannot read"),
        ["Event:Warning:OutputUnreachable"],
        "Pending",
        conds={"OutputReachable": ("False", "OutputUnreachable")},
    ),
    Case(
        "still unreachable, with another error's text: no second Warning",
        obs(progress_error="spec.output.uri: cannot read (another connection)",
            status={"attempt": "1", "conditions": [cond("OutputReachable", "False", "OutputUnreachable")]}),
        [],
        "Pending",
        conds={"OutputReachable": ("False", "OutputUnreachable")},
    ),
    Case(
        "the store goes mid-generation: the run's phase stays, the status keeps its figures",
        obs(generation_children=(gen(),), progress_error="spec.output.uri: cannot read",
            status={"attempt": "1", "phase": "Generating", "spentUSD": "0.42"}),
        ["Event:Warning:OutputUnreachable"],
        "Generating",
        conds={"OutputReachable": ("False", "OutputUnreachable")},
    ),
    Case(
        "the store goes mid-extraction: the generation child that ended is no failure, the phase stays",
        obs(generation_children=(gen(state="Succeeded"),), progress_error="spec.output.uri: cannot read",
            status={"attempt": "1", "phase": "Extracting", "spentUSD": "0.42"}),
        ["Event:Warning:OutputUnreachable"],
        "Extracting",
        conds={"OutputReachable": ("False", "OutputUnreachable")},
    ),
    Case(
        "the store is down as KubeRay says the RayJob failed: no decision until progress.json reads (retry or fail)",
        obs(generation_children=(gen(state="Failed", reason="AppFailed"),), progress_error="spec.output.uri: x",
            status={"attempt": "1", "phase": "Generating",
                    "conditions": [cond("OutputReachable", "False", "OutputUnreachable")]}),
        [],
        "Generating",
        conds={"OutputReachable": ("False", "OutputUnreachable")},
    ),
    Case(
        "the store is back: a Normal event says since when it was not",
        obs(generation_children=(gen(),), progress=prog(done=500),
            status={"attempt": "1", "phase": "Generating",
                    "conditions": [cond("OutputReachable", "False", "OutputUnreachable")]}),
        ["Event:Normal:OutputReadable"],
        "Generating",
        conds={"OutputReachable": ("True", "OutputReadable")},
    ),
    Case(
        "canary while under canarySamples",
        obs(generation_children=(gen(),), progress=prog(done=10)),
        [],
        "Canary",
        conds={"Queued": ("False", "Admitted")},
    ),
    Case(
        "generating past the canary",
        obs(generation_children=(gen(),), progress=prog(done=500)),
        [],
        "Generating",
    ),
    Case("child created, no progress yet", obs(generation_children=(gen(),)), [], "Pending"),
    Case(
        "budget exhausted suspends",
        obs(generation_children=(gen(),), progress=prog("BudgetExhausted", spent="9.9")),
        ["SuspendSpec", "Event:Warning:BudgetExceeded", "StopGeneration"],
        "Suspended",
        conds={"Suspended": ("True", "BudgetExceeded")},
    ),
    Case(
        "spend reaching maxUSD suspends (maxUSD lowered)",
        obs(spec(budget__maxUSD="0.5"), generation_children=(gen(),), progress=prog("Running", spent="1")),
        ["SuspendSpec", "Event:Warning:BudgetExceeded", "StopGeneration"],
        "Suspended",
        conds={"Suspended": ("True", "BudgetExceeded")},
    ),
    Case(
        "tool drift suspends",
        obs(
            generation_children=(gen(state="Succeeded"),),
            progress=prog("ToolSemanticsDrift", message="callRate 0.01 < minToolCallRate 0.1"),
        ),
        ["SuspendSpec", "Event:Warning:ToolSemanticsDrift", "DeleteGeneration"],
        "Suspended",
        conds={"Suspended": ("True", "ToolSemanticsDrift")},
    ),
    Case(
        "insufficient credits suspends",
        obs(progress=prog("InsufficientCredits", message="402")),
        ["SuspendSpec", "Event:Warning:InsufficientCredits"],
        "Suspended",
        conds={"Suspended": ("True", "InsufficientCredits")},
    ),
    Case(
        "a template no variant fits suspends",
        obs(generation_children=(gen(state="Succeeded"),),
            progress=prog("TemplateMismatch", message="provider X: no template variant of kimi-k2.5 ...")),
        ["SuspendSpec", "Event:Warning:TemplateMismatch", "DeleteGeneration"],
        "Suspended",
        conds={"Suspended": ("True", "TemplateMismatch")},
    ),
    Case(
        "an old attempt's outcome is never acted on",
        obs(
            status={"attempt": "2"},
            generation_children=(gen("2"),),
            progress=prog("BudgetExhausted", attempt="1"),
        ),
        [],
        "Pending",
        attempt="2",
        conds={"Suspended": ("False", "NotSuspended")},
    ),
    Case(
        "already suspended: delete the stopped child, no second event",
        obs(
            spec(suspend=True),
            status=SUSPENDED_BUDGET,
            generation_children=(gen(state="Stopped"),),
            progress=prog("BudgetExhausted", spent="9.9"),
        ),
        ["DeleteGeneration"],
        "Suspended",
        conds={"Suspended": ("True", "BudgetExceeded")},
    ),
    Case(
        "resume after budget raised starts attempt 2",
        obs(
            spec(budget__maxUSD="20"), status=SUSPENDED_BUDGET, progress=prog("BudgetExhausted", spent="9.9")
        ),
        ["Event:Normal:Resumed", "CreateGeneration"],
        "Pending",
        attempt="2",
        conds={"Suspended": ("False", "Resumed")},
    ),
    Case(
        "resume waits for the old attempt to stop",
        obs(
            spec(budget__maxUSD="20"),
            status=SUSPENDED_BUDGET,
            generation_children=(gen(),),
            progress=prog("BudgetExhausted", spent="9.9"),
        ),
        ["StopGeneration"],
        "Suspended",
        conds={"Suspended": ("True", "Stopping")},
    ),
    Case(
        "resume with the budget still spent re-suspends",
        obs(status=SUSPENDED_BUDGET, progress=prog("BudgetExhausted", spent="10")),
        ["SuspendSpec", "Event:Warning:BudgetExceeded"],
        "Suspended",
        conds={"Suspended": ("True", "BudgetExceeded")},
    ),
    Case(
        "user suspend stops gracefully",
        obs(spec(suspend=True), generation_children=(gen(),), progress=prog()),
        ["Event:Normal:SuspendedByUser", "StopGeneration"],
        "Suspended",
        conds={"Suspended": ("True", "SuspendedByUser")},
    ),
    Case(
        "stop requested long ago: delete anyway",
        obs(
            spec(suspend=True),
            status={"attempt": "1", "conditions": [cond("Suspended", "True", "SuspendedByUser")]},
            generation_children=(gen(stop_requested_at=T0 - 1000),),
        ),
        ["DeleteGeneration"],
        "Suspended",
    ),
    Case(
        "stop requested recently: wait",
        obs(
            spec(suspend=True),
            status={"attempt": "1", "conditions": [cond("Suspended", "True", "SuspendedByUser")]},
            generation_children=(gen(stop_requested_at=T0 - 5),),
        ),
        [],
        "Suspended",
    ),
    Case(
        "failed child without an outcome fails the run",
        obs(
            generation_children=(gen(state="Failed", reason="DeadlineExceeded", message="too slow"),),
            progress=prog(),
        ),
        ["Event:Warning:DeadlineExceeded"],
        "Failed",
        conds={"Failed": ("True", "DeadlineExceeded")},
    ),
    Case(
        "a RayJob failed with its job still running (the head lost, KubeRay gave up): retried as the next attempt",
        obs(generation_children=(gen(state="Failed", reason="JobDeploymentStatusTransitionGracePeriodExceeded"),),
            progress=prog()),
        ["Event:Warning:GenerationRetried", "DeleteGeneration"],
        "Pending",
        attempt="2",
    ),
    Case(
        "the retry waits while the failed attempt's RayJob is still there: never two jobs at once",
        obs(generation_children=(gen(state="Failed", reason="AppFailed"),), progress=prog(),
            status={"attempt": "2", "retries": 1}),
        ["DeleteGeneration"],
        "Pending",
        attempt="2",
    ),
    Case(
        "the failed RayJob gone: the retry's RayJob is created",
        obs(progress=prog(), status={"attempt": "2", "retries": 1}),
        ["CreateGeneration"],
        "Pending",
        attempt="2",
    ),
    Case(
        "a failure after the last retry fails the run",
        obs(generation_children=(gen(attempt="3", state="Failed", reason="AppFailed", message="lost"),),
            progress=prog(attempt="3"), status={"attempt": "3", "retries": 2}),
        ["Event:Warning:AppFailed"],
        "Failed",
        attempt="3",
        conds={"Failed": ("True", "AppFailed")},
    ),
    Case(
        "a cluster that never came up is not retried",
        obs(generation_children=(gen(state="Failed", reason="PreRunningDeadlineExceeded"),), progress=None),
        ["Event:Warning:PreRunningDeadlineExceeded"],
        "Failed",
        conds={"Failed": ("True", "PreRunningDeadlineExceeded")},
    ),
    Case(
        "child ended without Done",
        obs(generation_children=(gen(state="Succeeded"),), progress=prog()),
        ["Event:Warning:GenerationEnded"],
        "Failed",
        conds={"Failed": ("True", "GenerationEnded")},
    ),
    Case(
        "outcome Failed",
        obs(generation_children=(gen(state="Failed"),), progress=prog("Failed", message="boom")),
        ["Event:Warning:GenerationFailed"],
        "Failed",
        conds={"Failed": ("True", "GenerationFailed")},
    ),
    Case(
        "kueue holds the RayJob",
        obs(labels={"kueue.x-k8s.io/queue-name": "q"}, generation_children=(gen(state="Queued"),)),
        [],
        "Pending",
        conds={"Queued": ("True", "WaitingForAdmission")},
    ),
    Case(
        "restart after create, before status: adopt the newer attempt",
        obs(
            status={"attempt": "1", "conditions": [cond("Suspended", "True", "BudgetExceeded")]},
            generation_children=(gen("2"),),
            progress=prog("BudgetExhausted", attempt="1", spent="5"),
        ),
        [],
        "Pending",
        attempt="2",
        conds={"Suspended": ("False", "Resumed")},
    ),
    Case(
        "stale attempt still running is stopped",
        obs(status={"attempt": "2"}, generation_children=(gen("1"), gen("2"))),
        ["StopGeneration"],
        "Pending",
        attempt="2",
    ),
    Case(
        "done without extraction, manifest present -> Succeeded",
        obs(progress=prog("Done", stage="done"), manifest_uri="s3://out/run/manifest.json"),
        ["Event:Normal:Succeeded"],
        "Succeeded",
        conds={"Succeeded": ("True", "ManifestWritten")},
    ),
    Case(
        "done, manifest present, a provider under the fidelity floor -> Succeeded and a warning",
        obs(progress=prog("Done", stage="done"), manifest_uri="s3://out/run/manifest.json",
            fidelity={"minTop1Agreement": 0.8, "onLow": "flag", "belowFloor": ["cheap"],
                      "overall": {"samples": 3}, "byProvider": {"cheap": {"top1Agreement": 0.2}}}),
        ["Event:Normal:Succeeded", "Event:Warning:LowFidelity"],
        "Succeeded",
        conds={"Succeeded": ("True", "ManifestWritten")},
    ),
    Case(
        "done without extraction, no manifest -> finalize",
        obs(progress=prog("Done", stage="done")),
        ["FinalizeManifest"],
        "Generating",
    ),
    Case(
        "done -> extraction job",
        obs(spec(extraction__enabled=True), progress=prog("Done", stage="done")),
        ["CreateExtraction"],
        "Extracting",
    ),
    Case(
        "extraction queued by kueue",
        obs(
            spec(extraction__enabled=True),
            progress=prog("Done"),
            labels={"kueue.x-k8s.io/queue-name": "q"},
            extraction=ExtractionChild("dg-extract", suspended=True, kueue=True),
        ),
        [],
        "Extracting",
        conds={"Queued": ("True", "WaitingForAdmission")},
    ),
    Case(
        "extraction unsuspended when not kueue-managed",
        obs(
            spec(extraction__enabled=True),
            progress=prog("Done"),
            extraction=ExtractionChild("dg-extract", suspended=True, kueue=False),
        ),
        ["SetExtractionSuspend"],
        "Extracting",
    ),
    Case(
        "extraction suspended by Kueue without a queue label is left to Kueue (no ping-pong)",
        obs(
            spec(extraction__enabled=True),
            progress=prog("Done"),
            extraction=ExtractionChild("dg-extract", suspended=True, kueue=False, suspended_by_other=True),
        ),
        [],
        "Extracting",
        conds={"Queued": ("True", "WaitingForAdmission")},
    ),
    Case(
        "a RayJob KubeRay rejected ends the run",
        obs(generation_children=(gen(state="Failed", reason="ChildRejected",
                                     message="KubeRay rejected RayJob dg-gen-1: name too long"),)),
        ["Event:Warning:ChildRejected"],
        "Failed",
        conds={"Failed": ("True", "ChildRejected")},
    ),
    Case(
        "a RayJob past its pre-running deadline ends the run with KubeRay's reason",
        obs(generation_children=(gen(state="Failed", reason="PreRunningDeadlineExceeded"),)),
        ["Event:Warning:PreRunningDeadlineExceeded"],
        "Failed",
        conds={"Failed": ("True", "PreRunningDeadlineExceeded")},
    ),
    Case(
        "user suspend during extraction suspends the Job",
        obs(
            spec(extraction__enabled=True, suspend=True),
            progress=prog("Done"),
            extraction=ExtractionChild("dg-extract", suspended=False, kueue=False),
        ),
        ["Event:Normal:SuspendedByUser", "SetExtractionSuspend"],
        "Suspended",
        conds={"Suspended": ("True", "SuspendedByUser")},
    ),
    Case(
        "user suspend of a kueue-managed Job deletes it (Kueue owns its suspend)",
        obs(
            spec(extraction__enabled=True, suspend=True),
            progress=prog("Done"),
            extraction=ExtractionChild("dg-extract", suspended=False, kueue=True),
        ),
        ["Event:Normal:SuspendedByUser", "DeleteExtraction"],
        "Suspended",
    ),
    Case(
        "all pod summaries present -> finalize",
        obs(
            spec(extraction__enabled=True),
            progress=prog("Done"),
            summaries_done=2,
            extraction=ExtractionChild(
                "dg-extract", suspended=False, kueue=False, succeeded=2, completions=2
            ),
        ),
        ["FinalizeManifest"],
        "Extracting",
    ),
    Case(
        "extraction failed",
        obs(
            spec(extraction__enabled=True),
            progress=prog("Done"),
            extraction=ExtractionChild(
                "dg-extract", False, False, failed=True, reason="BackoffLimitExceeded", message="3 failures"
            ),
        ),
        ["Event:Warning:BackoffLimitExceeded"],
        "Failed",
        conds={"Failed": ("True", "BackoffLimitExceeded")},
    ),
    Case(
        "Local mode cannot run in a cluster",
        obs(spec(generation__ray={"mode": "Local"})),
        ["Event:Warning:PermanentError"],
        "Failed",
        conds={"Failed": ("True", "PermanentError")},
    ),
    Case(
        "RayJob without an image",
        obs(spec(generation__ray={"mode": "RayJob"})),
        ["Event:Warning:PermanentError"],
        "Failed",
        conds={"Failed": ("True", "PermanentError")},
    ),
    Case(
        "Succeeded is terminal",
        obs(status={"phase": "Succeeded", "attempt": "1"}, configmap_data=None),
        [],
        "Succeeded",
    ),
    Case(
        "the output's answers were bought under the same spec: the first attempt starts",
        obs(fingerprint_doc=bound_to(spec()), progress=prog("Stopped")),
        ["CreateGeneration"],
        "Pending",
        conds={"OutputMatchesSpec": ("True", "FingerprintMatches")},
    ),
    Case(
        "a resume after a spec edit of target.model starts nothing and says why",
        obs(status=SUSPENDED_BUDGET, fingerprint_doc=OTHER_MODEL, progress=prog("BudgetExhausted", spent="9")),
        ["Event:Normal:Resumed", "Event:Warning:SpecChanged"],
        "Pending",
        attempt="2",
        conds={"OutputMatchesSpec": ("False", "SpecChanged"), "Suspended": ("False", "Resumed")},
    ),
    Case(
        "the edited spec's fingerprint accepted by annotation: the attempt starts, told so",
        obs(status=SUSPENDED_BUDGET, fingerprint_doc=OTHER_MODEL, progress=prog("BudgetExhausted", spent="9"),
            accept_fingerprint=fingerprint(spec()).id),
        ["Event:Normal:Resumed", "CreateGeneration"],
        "Pending",
        attempt="2",
        conds={"OutputMatchesSpec": ("True", "ChangeAccepted")},
    ),
    Case(
        "an annotation naming another fingerprint accepts nothing",
        obs(fingerprint_doc=OTHER_MODEL, progress=prog("Stopped"), accept_fingerprint="0123456789ab"),
        ["Event:Warning:SpecChanged"],
        "Pending",
        conds={"OutputMatchesSpec": ("False", "SpecChanged")},
    ),
    Case(
        "a spec edit while an attempt runs: it goes on, the condition warns of the next one",
        obs(generation_children=(gen(),), fingerprint_doc=OTHER_MODEL, progress=prog(done=500)),
        ["Event:Warning:SpecChanged"],
        "Generating",
        conds={"OutputMatchesSpec": ("False", "SpecChanged")},
    ),
    Case(
        "a fingerprint recorded before any answer was persisted binds nothing",
        obs(fingerprint_doc=OTHER_MODEL,
            progress=prog("Stopped").model_copy(update={"samples": SampleCounts(total=10)})),
        ["CreateGeneration"],
        "Pending",
        conds={"OutputMatchesSpec": ("True", "FingerprintMatches")},
    ),
    Case(
        "Submit mode submits without a RayJob body",
        obs(spec(generation__ray={"mode": "Submit", "address": "http://ray:8265"})),
        ["CreateGeneration"],
        "Pending",
    ),
    Case(
        "Submit mode: the earlier attempt's submission has ended (Ray keeps its record): the next one is submitted",
        obs(spec(generation__ray={"mode": "Submit", "address": "http://ray:8265"}),
            generation_children=(gen(state="Stopped"),), status={"attempt": "2"}),
        ["CreateGeneration"],
        "Pending",
        attempt="2",
    ),
    Case(
        "Submit mode: the earlier attempt's submission still runs: it is stopped and the next one waits",
        obs(spec(generation__ray={"mode": "Submit", "address": "http://ray:8265"}),
            generation_children=(gen(state="Running"),), status={"attempt": "2"}),
        ["StopGeneration"],
        "Pending",
        attempt="2",
    ),
    Case(
        "RayJob mode: the earlier attempt's ended RayJob is still there: deleted, and the next one waits for it",
        obs(generation_children=(gen(state="Stopped"),), status={"attempt": "2"}),
        ["DeleteGeneration"],
        "Pending",
        attempt="2",
    ),
    Case(
        "a RayJob that failed before its job wrote any progress is not retried: it would fail the same way",
        obs(generation_children=(gen(state="Failed", reason="AppFailed", message="exit code 137"),), progress=None),
        ["Event:Warning:AppFailed"],
        "Failed",
        conds={"Failed": ("True", "AppFailed")},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_reconcile_table(case: Case) -> None:
    check(case)


def check(case: Case) -> Decision:
    """One row of a table: the actions, phase, attempt and conditions it says."""
    d = reconcile(case.observation)
    assert names(d.actions) == case.actions
    assert d.status["phase"] == case.phase
    assert d.status.get("attempt", "1") == case.attempt
    got = {c["type"]: (c["status"], c["reason"]) for c in d.status["conditions"]}
    for type_, want in case.conds.items():
        assert got[type_] == want, type_
    for c in d.status["conditions"]:
        if c["lastTransitionTime"] == NOW:
            assert c["observedGeneration"] == 3
    return d


def test_status_figures_come_from_progress() -> None:
    d = reconcile(obs(generation_children=(gen(),), progress=prog(spent="3.25")))
    s = d.status
    assert (s["spentUSD"], s["reservedUSD"]) == ("3.25", "0.5")
    assert s["samples"] == {"total": 1000, "done": 500, "rejected": 1, "discarded": 3, "failed": 2}
    assert s["tokens"] == {"input": 10, "output": 20}
    assert s["tools"] == {"declaredPrompts": 7, "callRate": 0.5, "invalidCalls": 1, "leaks": 0}
    assert s["observedGeneration"] == 3
    assert "extraction" not in s


def test_fidelity_short_form_in_status_and_the_low_provider_event() -> None:
    fid = {"minTop1Agreement": 0.8, "onLow": "exclude", "belowFloor": ["cheap"],
           "overall": {"samples": 30, "top1Agreement": 0.7, "meanNLL": 1.25, "toolCallRate": 0.5},
           "byProvider": {"native": {"samples": 20, "top1Agreement": 0.97},
                          "cheap": {"samples": 10, "top1Agreement": 0.21, "lowSamples": 9}},
           "bySource": {"s": {"samples": 30}}}
    d = reconcile(obs(progress=prog("Done", stage="done"), manifest_uri="s3://out/run/manifest.json", fidelity=fid))
    assert d.status["fidelity"] == {"samples": 30, "top1Agreement": 0.7, "meanNLL": 1.25,
                                    "byProvider": {"native": 0.97, "cheap": 0.21}, "belowFloor": ["cheap"]}
    DatasetGenerationStatus.model_validate(d.status)  # the CRD's status schema holds it
    ev = [a for a in d.actions if isinstance(a, Event) and a.reason == "LowFidelity"]
    assert len(ev) == 1 and ev[0].type == "Warning"
    assert ev[0].message.startswith("provider cheap: top-1 agreement 0.21 with the target model is under "
                                    "spec.extraction.fidelity.minTop1Agreement 0.8 (9 of 10 samples low, "
                                    "excluded from training)")
    assert "fidelity" not in reconcile(obs(progress=prog())).status


def test_a_queued_child_names_the_queue_that_holds_it() -> None:
    kueue = {"kueue.x-k8s.io/queue-name": "gpu-queue"}
    d = reconcile(obs(labels=kueue, generation_children=(gen(state="Queued"),)))
    c = conditions.find(d.status["conditions"], "Queued")
    assert c is not None and c["message"] == ("RayJob dg-gen-1 waits for admission by LocalQueue gpu-queue "
                                              "(kubectl get workloads -n ns)")
    d = reconcile(obs(spec(extraction__enabled=True), progress=prog("Done"), labels=kueue,
                      extraction=ExtractionChild("dg-extract", suspended=True, kueue=True)))
    c = conditions.find(d.status["conditions"], "Queued")
    assert c is not None and c["message"].startswith("Job dg-extract waits for admission by LocalQueue gpu-queue")


def test_budget_message_names_spend_and_budget() -> None:
    d = reconcile(obs(progress=prog("BudgetExhausted", spent="9.97")))
    ev = next(a for a in d.actions if isinstance(a, Event))
    assert ev.message.startswith("spent $9.97 of the $10.00 budget (spec.budget.maxUSD)")
    c = conditions.find(d.status["conditions"], "Suspended")
    assert c is not None and c["message"] == ev.message
    assert d.suspended_reason == "BudgetExceeded"


def test_drift_message_comes_from_the_job() -> None:
    d = reconcile(
        obs(progress=prog("ToolSemanticsDrift", message="callRate 0.01 below minToolCallRate 0.10"))
    )
    c = conditions.find(d.status["conditions"], "Suspended")
    assert c is not None and c["message"] == "callRate 0.01 below minToolCallRate 0.10"


def test_a_forecast_over_budget_suspends_and_a_resume_goes_on() -> None:
    msg = "forecast: the run would spend $31 (p90 $41) of the $10 budget (spec.budget.maxUSD)"
    d = reconcile(obs(generation_children=(gen(),), progress=prog("ForecastOverBudget", message=msg).model_copy(
        update={"forecast": Decimal("31")})))
    assert names(d.actions) == ["SuspendSpec", "Event:Warning:ForecastOverBudget", "StopGeneration"]
    c = conditions.find(d.status["conditions"], "Suspended")
    assert c is not None and (c["reason"], c["message"]) == ("ForecastOverBudget", msg)
    assert d.status["phase"] == "Suspended" and d.status["forecastUSD"] == "31"
    # raised budget, unsuspended, the stopped attempt gone: a fresh attempt starts
    resumed = reconcile(obs(sp=spec(budget__maxUSD="40"), status=d.status,
                            progress=prog("ForecastOverBudget", message=msg)))
    assert names(resumed.actions)[-1] == "CreateGeneration" and resumed.status["attempt"] == "2"


def test_resume_creates_rayjob_for_the_new_attempt() -> None:
    d = reconcile(obs(spec(budget__maxUSD="20"), status=SUSPENDED_BUDGET, progress=prog("BudgetExhausted")))
    create = next(a for a in d.actions if isinstance(a, CreateGeneration))
    assert create.attempt == "2"
    assert create.body is not None
    assert create.body["metadata"]["name"] == "dg-gen-2"
    assert create.body["metadata"]["annotations"] == {"eyrie.dev/attempt": "2"}
    env = create.body["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "EYRIE_ATTEMPT", "value": "2"} in env


def test_lastTransitionTime_is_kept_while_status_unchanged() -> None:
    st = {"attempt": "1", "conditions": [cond("SecretsReady", "True", "SecretsFound")]}
    d = reconcile(obs(status=st, generation_children=(gen(),)))
    c = conditions.find(d.status["conditions"], "SecretsReady")
    assert c is not None and c["lastTransitionTime"] == "2025-12-31T00:00:00Z"
    st2 = {"attempt": "1", "conditions": [cond("SecretsReady", "False", "SecretNotFound")]}
    d2 = reconcile(obs(status=st2, generation_children=(gen(),)))
    c2 = conditions.find(d2.status["conditions"], "SecretsReady")
    assert c2 is not None and c2["lastTransitionTime"] == NOW


def test_extraction_status_counts_summaries() -> None:
    d = reconcile(
        obs(
            spec(extraction__enabled=True),
            progress=prog("Done"),
            summaries_done=1,
            extraction=ExtractionChild("dg-extract", suspended=False, kueue=False, succeeded=0),
        )
    )
    assert d.status["extraction"] == {"shardsDone": 1, "shardsTotal": 2, "bytes": 0}


def test_create_extraction_body() -> None:
    d = reconcile(obs(spec(extraction__enabled=True), progress=prog("Done")))
    body = next(a for a in d.actions if isinstance(a, CreateExtraction)).body
    assert body["spec"]["completionMode"] == "Indexed"
    assert (body["spec"]["completions"], body["spec"]["parallelism"]) == (2, 2)


def test_parse_progress_rejects_unknown_outcome() -> None:
    with pytest.raises(ProgressError, match="outcome 'Weird'"):
        parse_progress({"attempt": "1", "outcome": "Weird"})
    with pytest.raises(ProgressError, match="spentUSD 'x'"):
        parse_progress({"attempt": "1", "outcome": "Running", "spentUSD": "x"})
    assert parse_progress({"attempt": 3, "outcome": "Done"}).spent == Decimal(0)


def test_an_outcome_written_for_another_object_is_never_acted_on() -> None:
    """A deleted and recreated DatasetGeneration with the same output.uri starts at attempt 1 again;
    its predecessor's `Failed` for attempt 1 carries the old uid and must not fail the new one."""
    old = prog("Failed", message="old run broke").model_copy(update={"run_id": "uid-old"})
    d = reconcile(obs(generation_children=(gen(),), progress=old, uid="uid-new", status={"attempt": "1"}))
    assert d.status["phase"] != "Failed"
    assert not any(c["type"] == "Failed" and c["status"] == "True" for c in d.status["conditions"])
    mine = old.model_copy(update={"run_id": "uid-new"})
    d = reconcile(obs(generation_children=(gen(),), progress=mine, uid="uid-new", status={"attempt": "1"}))
    assert d.status["phase"] == "Failed"


def test_the_run_id_reaches_the_job_and_comes_back_in_progress() -> None:
    body = children.rayjob("dg", "ns", spec(generation__ray={"mode": "RayJob", "image": "img"}), "2", None, "uid-7")
    head = body["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "EYRIE_RUN_ID", "value": "uid-7"} in head["env"]
    assert parse_progress({"attempt": "2", "outcome": "Done", "runId": "uid-7"}).run_id == "uid-7"


def test_status_says_where_the_manifest_and_the_report_are() -> None:
    o = obs(progress=prog("Done", stage="done"), manifest_uri="s3://out/run/manifest.json",
            report_uri="s3://out/run/report.html")
    d = reconcile(o)
    assert d.status["outputManifest"] == "s3://out/run/manifest.json"
    assert d.status["outputReport"] == "s3://out/run/report.html"
    succeeded = next(c for c in d.status["conditions"] if c["type"] == "Succeeded")
    assert "report at s3://out/run/report.html" in succeeded["message"]
    # a run still generating has no report yet: no field rather than an empty one
    assert "outputReport" not in reconcile(obs(progress=prog("Running"))).status


def test_a_refused_create_is_a_failed_status_naming_the_servers_message() -> None:
    from eyrie.operator.reconcile import child_rejected

    st = child_rejected("the API server refused RayJob dg-gen-1: denied", {"conditions": [
        cond("SecretsReady", "True", "SecretsFound")]}, 4, NOW)
    assert st["phase"] == "Failed" and st["observedGeneration"] == 4
    failed = conditions.find(st["conditions"], "Failed")
    assert failed is not None and (failed["reason"], failed["message"]) == (
        "ChildRejected", "the API server refused RayJob dg-gen-1: denied")
    assert conditions.find(st["conditions"], "SecretsReady") is not None  # the others are kept
    assert reconcile(obs(status=st)).actions == []  # Failed is terminal: nothing is retried


# ------------------------------------------------------------------ the provider probe (issue 26)

PROBED = [{"tag": "acme", "name": "Acme", "passed": True, "reason": "", "costPerAnswerUSD": "0.004"},
          {"tag": "cheapo/fp8", "name": "Cheapo", "passed": False,
           "reason": "schema accuracy 0.67 < minSchemaAccuracy 0.95 (2 of 6 calls invalid)",
           "costPerAnswerUSD": "0.001"}]


def probed(outcome: str = "Running", endpoints: list[dict[str, Any]] = PROBED, message: str = "") -> Progress:
    p = prog(outcome, message=message)
    doc = {"attempt": "1", "outcome": outcome, "message": message, "spentUSD": "1", "samples": p.samples,
           "providers": {"passing": [e["tag"] for e in endpoints if e["passed"]], "spentUSD": "0.04",
                         "endpoints": endpoints}}
    return parse_progress(doc)


@pytest.mark.parametrize(("before", "events"), [
    ({}, ["Event:Warning:ProviderDropped"]),  # first seen: one event per dropped endpoint
    ({"providers": PROBED}, []),  # already in the status: not posted again
], ids=["first-pass", "next-pass"])
def test_a_dropped_provider_is_shown_in_status_with_one_event(before: dict[str, Any], events: list[str]) -> None:
    d = reconcile(obs(status={"attempt": "1", **before}, generation_children=(gen(),), progress=probed()))
    assert [n for n in names(d.actions) if n.startswith("Event")] == events
    if events:
        ev = next(a for a in d.actions if isinstance(a, Event))
        assert ev.message == ("provider cheapo/fp8 dropped by the provider probe: schema accuracy 0.67 < "
                              "minSchemaAccuracy 0.95 (2 of 6 calls invalid)")
    assert d.status["providers"] == PROBED
    c = conditions.find(d.status["conditions"], "ProvidersChecked")
    assert c is not None and (c["status"], c["reason"]) == ("True", "ProvidersPassed")
    assert c["message"].startswith("generation routed to acme (cheapest first); dropped: cheapo/fp8 (schema")
    DatasetGenerationStatus.model_validate(d.status)  # the CRD's status schema holds it


def test_no_passing_provider_suspends_with_its_own_reason() -> None:
    none = [{**PROBED[1]}, {"tag": "lazy", "passed": False, "reason": "trigger F1 0.44 < minTriggerF1 0.73"}]
    msg = "no provider passes the probe: cheapo/fp8: schema accuracy 0.67 ...; lazy: trigger F1 0.44 ..."
    d = reconcile(obs(generation_children=(gen(),), progress=probed("NoProviderPasses", none, msg)))
    assert names(d.actions) == ["Event:Warning:ProviderDropped", "Event:Warning:ProviderDropped", "SuspendSpec",
                                "Event:Warning:NoProviderPasses", "StopGeneration"]
    assert d.status["phase"] == "Suspended" and d.suspended_reason == "NoProviderPasses"
    c = conditions.find(d.status["conditions"], "Suspended")
    assert c is not None and (c["reason"], c["message"]) == ("NoProviderPasses", msg)
    p = conditions.find(d.status["conditions"], "ProvidersChecked")
    assert p is not None and (p["status"], p["reason"]) == ("False", "NoProviderPasses")
    # the probe's thresholds loosened, unsuspended, the stopped attempt gone: a fresh attempt
    resumed = reconcile(obs(status=d.status, progress=probed("NoProviderPasses", none, msg)))
    assert names(resumed.actions)[-1] == "CreateGeneration" and resumed.status["attempt"] == "2"


def probing(answers: int = 13, attempt: str = "1", spent: str = "1.02", **over: Any) -> Progress:
    """progress.json while spec.api.providerProbe sends (the driver's stage probe)."""
    return parse_progress({"attempt": attempt, "outcome": "Running", "stage": "probe", "spentUSD": spent,
                           "reservedUSD": "0.01", "message": f"provider probe: {answers} of 32 answers",
                           "samples": {"total": 1000, "done": 0, "rejected": 0, "discarded": 0, "failed": 0},
                           "probe": {"endpoints": ["acme", "cheapo/fp8", "lazy", "solid"], "answers": answers,
                                     "answersPlanned": 32, "requests": answers, "spentUSD": "0.02"}, **over})


@pytest.mark.parametrize(("observation", "phase", "checked"), [
    (obs(generation_children=(gen(),), progress=probing()), "Canary", ("False", "Probing")),
    (obs(spec(tools={"gate": {"enabled": False}}), generation_children=(gen(),), progress=probing(0)),
     "Canary", ("False", "Probing")),  # the probe is measured before generation, gate or no gate
    (obs(generation_children=(gen(state="Queued"),), progress=probing()), "Pending", None),  # not admitted yet
    (obs(status={"attempt": "2"}, generation_children=(gen("2"),), progress=probing(attempt="1")),
     "Pending", None),  # an earlier attempt's probe: not this attempt's state
    (obs(generation_children=(gen(),), progress=probing(spent="10")), "Suspended", None),  # its spend counts
    (obs(generation_children=(gen(),), progress=probed()), "Generating", ("True", "ProvidersPassed")),  # done
], ids=["probing", "probing-without-gate", "queued", "older-attempt", "probe-spent-the-budget", "verdict-in"])
def test_a_probe_under_way_shows_in_phase_and_providers_checked(observation: Observation, phase: str,
                                                               checked: tuple[str, str] | None) -> None:
    d = reconcile(observation)
    assert d.status["phase"] == phase
    c = conditions.find(d.status["conditions"], "ProvidersChecked")
    assert (c["status"], c["reason"]) == checked if checked else c is None
    if checked == ("False", "Probing"):
        answers = observation.progress.probe.answers  # type: ignore[union-attr]
        assert c["message"] == (f"probing 4 endpoints (acme, cheapo/fp8, lazy, solid): {answers} of 32 answers in, "
                                "$0.02 spent on the probe; generation starts on the endpoints that pass")
        assert d.status["spentUSD"] == "1.02"  # the run's spend, the probe's included
    DatasetGenerationStatus.model_validate(d.status)


@pytest.mark.parametrize("section", [{"endpoints": "acme", "answers": 1, "answersPlanned": 2},
                                     {"endpoints": ["acme"], "answers": "1", "answersPlanned": 2}, []])
def test_progress_probe_must_be_well_formed(section: Any) -> None:
    with pytest.raises(ProgressError, match=r"probe must be"):
        parse_progress({"attempt": "1", "outcome": "Running", "stage": "probe", "probe": section})


def test_progress_providers_must_be_well_formed() -> None:
    with pytest.raises(ProgressError, match=r"providers\.endpoints"):
        parse_progress({"attempt": "1", "outcome": "Running", "providers": {"endpoints": [{"tag": 3}]}})
def test_pod_problems_say_which_and_what_to_do() -> None:
    d = reconcile(obs(generation_children=(gen(state="Pending"),), pod_problems=(
        PodProblem("ImagePullFailed", "dg-gen-1-head", "generation", "ray-head", "ray:1", "Back-off pulling image"),
        PodProblem("ImagePullFailed", "dg-gen-1-worker-a", "generation", "ray-head", "ray:1", "Back-off pulling"),
        PodProblem("SecretNotFound", "dg-gen-1-worker-b", "generation", "ray-worker", "ray:1",
                   'secret "openrouter" not found'))))
    c = conditions.find(d.status["conditions"], "PodsHealthy")
    assert c is not None and (c["status"], c["reason"]) == ("False", "ImagePullFailed")
    assert "image ray:1 cannot be pulled (Back-off pulling image)" in c["message"]
    assert "spec.generation.ray.image" in c["message"]
    assert 'secret "openrouter" not found: create it' in c["message"]
    assert c["message"].endswith("(and 1 more pods alike)")
    [event] = [a for a in d.actions if isinstance(a, Event)]
    assert (event.type, event.reason, event.message) == ("Warning", "ImagePullFailed", c["message"])


@pytest.mark.parametrize(("problem", "says"), [
    (PodProblem("ImageNotPresent", "p", "extraction", "extract", "x:1"), "set spec.extraction.image"),
    (PodProblem("OOMKilled", "p", "extraction", "extract", memory="64Mi"),
     "out of memory at its limit of 64Mi: raise spec.extraction.memory"),
    (PodProblem("OOMKilled", "p", "generation", "ray-worker", memory="4Gi"),
     "raise spec.generation.ray.memoryPerWorker"),
    (PodProblem("Unschedulable", "p", "generation", detail="0/1 nodes: Insufficient cpu"),
     "cannot be scheduled (0/1 nodes: Insufficient cpu): add node capacity"),
])
def test_pod_advice_names_the_field(problem: PodProblem, says: str) -> None:
    assert says in pod_advice(problem)


def test_a_refused_spec_edit_names_each_field_and_both_ways_on_once() -> None:
    edited = spec(target={"model": "moonshotai/kimi-k2.5", "tokenizer": "t"},
                  api={"baseUrl": "https://openrouter.ai/api/v1", "sampling": {"temperature": 0.2},
                       "apiKeySecretRef": {"name": "openrouter", "key": "api-key"}})
    o = obs(edited, fingerprint_doc=bound_to(spec(target={"model": "deepseek/deepseek-v4", "tokenizer": "t"})),
            progress=prog("Stopped"))
    d = reconcile(o)
    c = conditions.find(d.status["conditions"], "OutputMatchesSpec")
    assert c is not None and c["status"] == "False"
    msg = c["message"]
    assert 'spec.target.model: "deepseek/deepseek-v4" -> "moonshotai/kimi-k2.5"' in msg
    assert "spec.api.sampling.temperature: unset -> 0.2" in msg
    assert "another spec.output.uri" in msg and f"{ACCEPT_ANNOTATION}={fingerprint(edited).id}" in msg
    assert not any(isinstance(a, CreateGeneration) for a in d.actions)  # no job that would only refuse
    # the next poll keeps the condition and posts no second event: a refusal is not a crash loop
    again = reconcile(replace(o, status=d.status))
    assert names(again.actions) == [] and conditions.find(again.status["conditions"], "OutputMatchesSpec") == c


def test_an_accepted_fingerprint_reaches_the_job() -> None:
    accepted = fingerprint(spec()).id
    d = reconcile(obs(fingerprint_doc=OTHER_MODEL, progress=prog("Stopped"), accept_fingerprint=accepted))
    create = next(a for a in d.actions if isinstance(a, CreateGeneration))
    assert create.accept_fingerprint == accepted
    env = create.body["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    assert {"name": "EYRIE_ACCEPT_FINGERPRINT", "value": accepted} in env


def test_status_money_is_rounded_for_kubectl_get_never_below_the_spend() -> None:
    d = reconcile(obs(generation_children=(gen(),), progress=prog(spent="1.010928723076923076923076923")))
    assert d.status["spentUSD"] == "1.010929"
    assert reconcile(obs(generation_children=(gen(),), progress=prog(spent="0.42"))).status["spentUSD"] == "0.42"


def test_a_store_outage_mid_run_keeps_the_figures_and_says_how_long_it_waited() -> None:
    down = reconcile(obs(generation_children=(gen(),), progress_error="spec.output.uri: connection refused",
                         status={"attempt": "1", "phase": "Generating", "spentUSD": "0.42", "samples": {"done": 9}}))
    assert (down.status["phase"], down.status["spentUSD"], down.status["samples"]) == ("Generating", "0.42",
                                                                                      {"done": 9})
    [warning] = [a for a in down.actions if isinstance(a, Event)]
    assert (warning.type, warning.reason, warning.message) == ("Warning", "OutputUnreachable",
                                                              "spec.output.uri: connection refused")
    since = conditions.find(down.status["conditions"], "OutputReachable")["lastTransitionTime"]
    back = reconcile(obs(generation_children=(gen(),), progress=prog(done=500), status=down.status))
    [normal] = [a for a in back.actions if isinstance(a, Event)]
    assert (normal.type, normal.reason) == ("Normal", "OutputReadable")
    assert normal.message == f"s3://out/run is readable again (unreachable since {since})"


def disruption_events(decision: Any) -> list[tuple[str, str]]:
    return [(a.reason, a.message) for a in decision.actions
            if isinstance(a, Event) and a.reason in ("GenerationRestarted", "WorkerLost")]


def test_a_disrupted_attempt_says_once_what_happened_and_what_eyrie_did() -> None:
    """The job restarted after its head was lost, then lost a worker: one Warning per rise, none on a pass that
    finds the same counts, none for another attempt's, and the status keeps the counts of the current attempt."""
    running = {"attempt": "1", "phase": "Generating"}
    first = reconcile(obs(generation_children=(gen(),), progress=prog(restarts=1), status=running))
    [(reason, message)] = disruption_events(first)
    assert reason == "GenerationRestarted"
    assert "generation attempt 1 started again (1 time(s) in all)" in message
    assert "KubeRay submitted the job again" in message and "resumed from s3://out/run" in message
    assert first.status["disruptions"] == {"attempt": "1", "restarts": 1, "workersLost": 0}
    same = reconcile(obs(generation_children=(gen(),), progress=prog(restarts=1), status=first.status))
    assert disruption_events(same) == []
    lost = reconcile(obs(generation_children=(gen(),), progress=prog(restarts=1, workersLost=2), status=same.status))
    [(reason, message)] = disruption_events(lost)
    assert reason == "WorkerLost" and message.startswith("2 shard worker(s) of generation attempt 1 lost (2 in all)")
    assert "shards went back to the queue" in message and "at most spec.api.maxConcurrency" in message
    # a resumed attempt's counts start again: attempt 1's status is not what attempt 2 is compared with
    resumed = reconcile(obs(generation_children=(gen(attempt="2"),),
                            progress=prog(attempt="2", workersLost=1), status={**lost.status, "attempt": "2"}))
    assert [r for r, _ in disruption_events(resumed)] == ["WorkerLost"]
    assert resumed.status["disruptions"] == {"attempt": "2", "restarts": 0, "workersLost": 1}


def test_progress_counts_of_disruptions_are_counts() -> None:
    assert (prog(restarts=2, workersLost=3).restarts, prog(restarts=2, workersLost=3).workers_lost) == (2, 3)
    assert (prog().restarts, prog().workers_lost) == (0, 0)
    with pytest.raises(ProgressError, match="workersLost must be a count"):
        prog(workersLost=-1)


def test_a_retry_counts_and_says_what_it_does() -> None:
    d = reconcile(obs(generation_children=(gen(state="Failed", reason="AppFailed", message="head lost"),),
                      progress=prog(), status={"attempt": "1", "phase": "Generating", "spentUSD": "0.3"}))
    assert (d.status["attempt"], d.status["retries"], d.status["spentUSD"]) == ("2", 1, "1")
    [event] = [a for a in d.actions if isinstance(a, Event)]
    assert event.message.startswith("generation attempt 1 failed before its job said how it ended (RayJob dg-gen-1: "
                                    "AppFailed: head lost); retried as attempt 2 (1 of 2)")
    assert "resuming from s3://out/run" in event.message and "at most spec.api.maxConcurrency" in event.message
    again = reconcile(obs(generation_children=(gen(attempt="2", state="Failed", reason="AppFailed"),),
                          progress=prog(attempt="2"), status=d.status))
    assert (again.status["attempt"], again.status["retries"]) == ("3", 2)

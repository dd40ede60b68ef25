"""Thin kopf handlers: observe (API server, Ray, store), call `reconcile`, carry out its actions.

Each outside party has a module of its own: the API server `kube`, the referenced Secrets `secret_refs`, Ray's
job API `ray_submission`, the output store `output`; this module only calls them in order.

A timer polls every resource; an event handler reacts at once to spec changes (a new
`metadata.generation`). Both go through one lock per resource, so passes never interleave.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import kopf
import orjson

from eyrie.jobs.contract import layout
from eyrie.jobs.contract.fingerprint import ACCEPT_ANNOTATION, pilot_key
from eyrie.jobs.contract.manifest import finalize_manifest
from eyrie.jobs.contract.progress import ProgressError
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.spec import GROUP, PLURAL, VERSION, DatasetGenerationSpec, SpecError, parse_spec
from eyrie.jobs.store import S3Store, StoreError, open_store

from . import children, conditions, metrics, ray_submission
from .config import OperatorConfig
from .kube import Kind, Kube, KubeError
from .observed import job_child, neighbour_attempts, pilot_child, pod_problems, rayjob_child, submission_child
from .output import read_output
from .passes import PassGate
from .reconcile import (
    TERMINAL_PHASES,
    ApplyConfigMap,
    CreateExtraction,
    CreateGeneration,
    CreatePilot,
    Decision,
    DeleteExtraction,
    DeleteGeneration,
    DeletePilot,
    Event,
    FinalizeManifest,
    GenerationChild,
    Observation,
    PodProblem,
    SetExtractionSuspend,
    StopGeneration,
    SuspendSpec,
    child_rejected,
    invalid_spec,
    reconcile,
)
from .secret_refs import SecretMissing, api_key, s3_credentials


class ChildRejected(EyrieError):
    """The API server refused to create a child (schema, CEL, an admission webhook such as KubeRay's)."""


async def _create(kube: Kube, kind: Kind, namespace: str, body: dict[str, Any]) -> bool:
    """Create a child; a refusal of the object itself becomes ChildRejected (retrying cannot help)."""
    try:
        return await kube.create(kind, namespace, body)
    except KubeError as e:
        if e.rejected:
            raise ChildRejected(f"the API server refused {body.get('kind', kind.value)} "
                                f"{body['metadata']['name']}: {e.detail}") from e
        raise


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------------------- observe


async def observe(kube: Kube, memo: Memo, body: kopf.Body, spec: DatasetGenerationSpec) -> Observation:
    meta = body["metadata"]
    name, ns = meta["name"], meta["namespace"]
    status = dict(body.get("status") or {})
    missing: list[str] = []
    try:
        await api_key(kube, ns, spec)
    except SecretMissing as e:
        missing.append(str(e))
    creds = None
    try:
        creds = await s3_credentials(kube, ns, spec)
    except SecretMissing as e:
        missing.append(str(e))

    cm_key = _key(meta)
    if cm_key not in memo.configmaps:  # what this process applied last; read once after a restart
        cm = await kube.get(Kind.CONFIGMAP, ns, children.configmap_name(name))
        memo.configmaps[cm_key] = (cm or {}).get("data")
    attempt = status.get("attempt") or "1"
    resuming = conditions.is_true(status.get("conditions") or [], conditions.SUSPENDED)
    gens: list[GenerationChild] = []
    problems: list[PodProblem] = []
    ray = spec.generation.ray
    if ray.mode == "RayJob":
        # deterministic names: the previous, current and a possibly-unrecorded next attempt
        for a in neighbour_attempts(attempt, resuming):
            doc = await kube.get(Kind.RAYJOB, ns, children.generation_name(name, a))
            if doc is not None:
                gens.append(rayjob_child(doc))
                problems += await _rayjob_pod_problems(kube, ns, doc, gens[-1], attempt)
    elif ray.mode == "Submit" and ray.address:
        for a in neighbour_attempts(attempt, resuming):
            sid = children.submission_id(ns, name, a)
            st = await ray_submission.job_status(ray.address, sid)
            if st is not None:
                gens.append(submission_child(a, sid, st, memo.stops.get(sid)))
    ext = None
    if spec.extraction.enabled:
        doc = await kube.get(Kind.JOB, ns, children.extraction_name(name))
        ext = job_child(doc) if doc else None
        if ext is not None and not ext.suspended and not (ext.completions and ext.succeeded >= ext.completions):
            problems += pod_problems(await kube.pods(ns, f"batch.kubernetes.io/job-name={ext.name}"), "extraction")

    pilot_job = None
    if spec.pilot is not None or status.get("pilot"):
        doc = await kube.get(Kind.JOB, ns, children.pilot_name(name))
        pilot_job = pilot_child(doc) if doc else None
        if pilot_job is not None and pilot_job.active and not pilot_job.queued:
            problems += pod_problems(await kube.pods(ns, f"batch.kubernetes.io/job-name={pilot_job.name}"), "pilot")

    # progress after the children: what it says is at least as fresh as their status
    prog = error = manifest = fidelity = report = bound = pilot = None
    summaries = nbytes = 0
    output_checked = not (spec.output.credentials_secret_ref and creds is None)
    if output_checked:
        try:
            store = open_store(spec.output.uri, spec.output.endpoint, creds, spec.output.region)
            if isinstance(store, S3Store):
                store.RETRY_SECONDS = 0.0  # one try: the next poll retries; a dead endpoint must not stall a pass
            out = await asyncio.to_thread(read_output, store, spec)
            prog = out.progress
            manifest, summaries, nbytes = out.manifest_url, out.summaries, out.extraction_bytes
            fidelity, report, bound = out.fidelity, out.report_url, out.fingerprint
            pilot = out.pilot
        except (StoreError, ProgressError, orjson.JSONDecodeError) as e:
            error = f"spec.output.uri: {e}"
    return Observation(
        name=name, namespace=ns, generation=meta.get("generation"), labels=dict(meta.get("labels") or {}),
        spec=spec, status=status, now=now_rfc3339(), now_ts=time.time(),
        configmap_data=memo.configmaps[cm_key], generation_children=tuple(gens), extraction=ext,
        missing_secrets=tuple(missing), progress=prog, progress_error=error, output_checked=output_checked,
        manifest_uri=manifest, report_uri=report, summaries_done=summaries, extraction_bytes=nbytes,
        fidelity=fidelity, fingerprint_doc=bound,
        accept_fingerprint=(meta.get("annotations") or {}).get(ACCEPT_ANNOTATION),
        stop_grace=memo.config.stop_grace, uid=str(meta.get("uid") or ""), pod_problems=tuple(problems),
        pilot_key=pilot_key(spec) if spec.pilot is not None else "", pilot_job=pilot_job, pilot=pilot)


async def _rayjob_pod_problems(kube: Kube, ns: str, doc: dict[str, Any], child: GenerationChild,
                               attempt: str) -> tuple[PodProblem, ...]:
    """The pods of an attempt's Ray cluster and its submitter Job, while it should be coming up or running (listed
    only once KubeRay named the cluster: a queued or refused RayJob has none)."""
    cluster = (doc.get("status") or {}).get("rayClusterName")
    if not cluster or int(child.attempt) < int(attempt) or child.state not in ("Pending", "Running"):
        return ()
    pods = await kube.pods(ns, f"ray.io/cluster={cluster}")
    pods += await kube.pods(ns, f"batch.kubernetes.io/job-name={child.name}")
    return pod_problems(pods, "generation")


# ----------------------------------------------------------------------------------------- act


async def act(kube: Kube, memo: Memo, body: dict[str, Any], spec: DatasetGenerationSpec, decision: Decision,
              logger: logging.Logger) -> None:
    meta = body["metadata"]
    name, ns = meta["name"], meta["namespace"]
    for action in decision.actions:
        if isinstance(action, ApplyConfigMap):
            cm = action.body
            _own(cm, body)
            if not await _create(kube, Kind.CONFIGMAP, ns, cm):
                await kube.patch(Kind.CONFIGMAP, ns, cm["metadata"]["name"], {"data": cm["data"]})
            memo.configmaps[_key(meta)] = cm["data"]
        elif isinstance(action, CreateGeneration):
            if action.body is not None:
                _own(action.body, body)
                if await _create(kube, Kind.RAYJOB, ns, action.body):
                    logger.info(f"created RayJob {action.body['metadata']['name']} "
                                f"(attempt {action.attempt})")
            else:
                sid = children.submission_id(ns, name, action.attempt)
                env = await ray_submission.submission_env(kube, ns, spec, action.attempt,
                                                         str(meta.get("uid") or ""))
                if action.accept_fingerprint:
                    env["EYRIE_ACCEPT_FINGERPRINT"] = action.accept_fingerprint
                spec_yaml = children.resolved_spec_yaml(name, ns, spec)
                assert spec.generation.ray.address is not None  # the spec model requires it for Submit
                await ray_submission.submit(spec.generation.ray.address, sid, spec_yaml, env)
                logger.info(f"submitted Ray job {sid} (attempt {action.attempt})")
        elif isinstance(action, StopGeneration):
            await _stop_generation(kube, memo, ns, spec, action, logger)
        elif isinstance(action, DeleteGeneration):
            if spec.generation.ray.mode == "RayJob":
                await kube.delete(Kind.RAYJOB, ns, action.name)
                logger.info(f"deleted RayJob {action.name}")
        elif isinstance(action, CreateExtraction):
            _own(action.body, body)
            await _create(kube, Kind.JOB, ns, action.body)
        elif isinstance(action, CreatePilot):
            _own(action.body, body)
            if await _create(kube, Kind.JOB, ns, action.body):
                logger.info(f"created pilot Job {action.body['metadata']['name']}")
        elif isinstance(action, DeletePilot):
            await kube.delete(Kind.JOB, ns, action.name)
            logger.info(f"deleted pilot Job {action.name}")
        elif isinstance(action, SetExtractionSuspend):
            # marked, so that only a suspension eyrie made is one eyrie lifts (Kueue keeps its own)
            await kube.patch(Kind.JOB, ns, action.name, {
                "metadata": {"annotations": {children.SUSPENDED_ANNOTATION: "true" if action.suspend else None}},
                "spec": {"suspend": action.suspend}})
        elif isinstance(action, DeleteExtraction):
            await kube.delete(Kind.JOB, ns, action.name)
        elif isinstance(action, SuspendSpec):
            # before the status: a crash in between re-derives the same stop, never a false resume
            await kube.patch(Kind.DATASET, ns, name, {"spec": {"suspend": True}})
        elif isinstance(action, Event):
            kopf.event(body, type=action.type, reason=action.reason, message=action.message)
        elif isinstance(action, FinalizeManifest):
            creds = await s3_credentials(kube, ns, spec)
            store = open_store(spec.output.uri, spec.output.endpoint, creds, spec.output.region)
            await asyncio.to_thread(finalize_manifest, spec, store)
            logger.info(f"wrote {store.url(layout.MANIFEST)}")


async def _stop_generation(kube: Kube, memo: Memo, ns: str, spec: DatasetGenerationSpec,
                           action: StopGeneration, logger: logging.Logger) -> None:
    """Ask Ray to stop the job (SIGTERM: the job drains and flushes), then mark the request."""
    ray = spec.generation.ray
    now = time.time()
    try:
        if ray.mode == "Submit" and ray.address:
            await ray_submission.stop_job(ray.address, action.name)
            memo.stops[action.name] = now
            return
        doc = await kube.get(Kind.RAYJOB, ns, action.name) or {}
        st = doc.get("status") or {}
        if st.get("dashboardURL") and st.get("jobId"):
            url = st["dashboardURL"]
            url = url if "://" in url else f"http://{url}"
            await ray_submission.stop_job(url, st["jobId"])
    except Exception as e:  # the deletion after the grace period still stops it
        logger.warning(f"graceful stop of {action.name} failed ({type(e).__name__}: {e}); "
                       "it is deleted after the grace period")
    if ray.mode == "RayJob":
        await kube.patch(Kind.RAYJOB, ns, action.name,
                         {"metadata": {"annotations": {children.STOP_ANNOTATION: str(now)}}})
    logger.info(f"requested a graceful stop of {action.name}")


# ------------------------------------------------------------------------------------- handlers


@dataclass
class Memo:
    """Process-wide state kept by kopf's memo: settings, API client, the bound on passes at once,
    per-resource locks, Submit stop times, the ConfigMap data this process last applied, the finished
    runs this process has passed over."""

    config: OperatorConfig
    kube: Kube | None = None
    gate: PassGate = field(init=False)
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    stops: dict[str, float] = field(default_factory=dict)
    configmaps: dict[tuple[str, str, str | None], dict[str, str] | None] = field(default_factory=dict)
    finished: set[tuple[str, str, str | None]] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.gate = PassGate(self.config.max_passes)


def _own(child: dict[str, Any], owner: dict[str, Any]) -> None:
    """The owner reference only: `kopf.adopt` would also copy every label of the DatasetGeneration
    onto the child, undoing `children`'s choice of labels (eyrie's and Kueue's only)."""
    kopf.append_owner_reference(child, owner=kopf.Body(owner))


async def reconcile_resource(body: kopf.Body, memo: Memo, logger: logging.Logger, urgent: bool) -> None:
    """One pass for one DatasetGeneration; errors are logged and counted, the next tick retries.

    The pass re-reads the object under the lock and writes its own patches before releasing it,
    so a second pass (timer or spec change) always starts from what the first one wrote. Urgent
    passes (a new object, a spec change) take a free slot of the gate before polls do.
    """
    meta = body["metadata"]
    key = f"{meta['namespace']}/{meta['name']}"
    lock = memo.locks.setdefault(key, asyncio.Lock())
    kube = memo.kube
    assert kube is not None, "the startup handler connects before any resource is handled"
    async with lock:
        try:
            if not (body.get("status") or {}).get("phase"):
                await _announce(kube, meta)
            async with memo.gate.slot(urgent):
                metrics.RECONCILES.inc()
                fresh = await kube.get(Kind.DATASET, meta["namespace"], meta["name"])
                if fresh is None or (fresh.get("metadata") or {}).get("deletionTimestamp"):
                    return
                if await _reconcile(kube, fresh, memo, logger) in TERMINAL_PHASES:
                    memo.finished.add(_key(meta))
        except Exception as e:
            metrics.ERRORS.labels(type(e).__name__).inc()
            logger.error(f"reconcile failed: {type(e).__name__}: {e}")


async def _announce(kube: Kube, meta: dict[str, Any]) -> None:
    """A new object shows Pending at once, before it waits for a pass (which makes several calls).

    The patch carries the resourceVersion kopf saw: if anything wrote the object since, the server
    refuses it (409) and the pass, which reads the object afresh, decides instead.
    """
    try:
        await kube.patch(Kind.DATASET, meta["namespace"], meta["name"],
                         {"metadata": {"resourceVersion": meta.get("resourceVersion")},
                          "status": {"phase": "Pending"}}, status=True)
    except KubeError as e:
        if e.status not in (404, 409):
            raise


async def _reconcile(kube: Kube, body: dict[str, Any], memo: Memo, logger: logging.Logger) -> str | None:
    """One pass over a fresh copy of the object; returns the phase it leaves."""
    meta = body["metadata"]
    status = dict(body.get("status") or {})
    try:
        spec = parse_spec({"spec": dict(body.get("spec") or {})}).spec
    except SpecError as e:
        await _patch_status(kube, meta, status, invalid_spec(e, status, meta.get("generation"), now_rfc3339()))
        if status.get("phase") != "Failed":
            kopf.event(body, type="Warning", reason="PermanentError", message=str(e).replace("\n", " "))
        return "Failed"
    obs = await observe(kube, memo, body, spec)
    decision = reconcile(obs)
    try:
        await act(kube, memo, body, spec, decision, logger)
    except ChildRejected as e:  # Failed is terminal: one event, no retry loop
        await _patch_status(kube, meta, status, child_rejected(str(e), status, meta.get("generation"),
                                                                now_rfc3339()))
        kopf.event(body, type="Warning", reason="ChildRejected", message=str(e))
        logger.error(str(e))
        return "Failed"
    await _patch_status(kube, meta, status, decision.status)
    if decision.suspended_reason:
        metrics.SUSPENSIONS.labels(decision.suspended_reason).inc()
    metrics.TRACKER.observe(meta["namespace"], meta["name"], decision.status.get("phase"), decision.status)
    metrics.BUDGET.labels(meta["namespace"], meta["name"]).set(float(spec.budget.max_usd))
    return decision.status.get("phase")


async def _patch_status(kube: Kube, meta: dict[str, Any], old: dict[str, Any], new: dict[str, Any]) -> None:
    """Patch only what changed; `conditions` always goes as the whole list."""
    changed = {k: v for k, v in new.items() if old.get(k) != v}
    if changed:
        await kube.patch(Kind.DATASET, meta["namespace"], meta["name"], {"status": changed}, status=True)


def _spec_changed(body: kopf.Body, type: str | None, **_: Any) -> bool:
    if type == "DELETED":
        return False
    gen = (body.get("metadata") or {}).get("generation")
    return gen is None or gen != (body.get("status") or {}).get("observedGeneration")


async def _startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
    # one client for every pass: connected lazily inside the passes, every pass of a burst of new objects
    # saw no client yet and opened its own (client, connection pool, kubeconfig read)
    memo.state.kube = await Kube.connect()
    settings.persistence.finalizer = f"{GROUP}/operator"
    settings.posting.level = logging.INFO
    settings.watching.server_timeout = 300
    settings.networking.request_timeout = 60
    # store and Ray calls run in threads; the default pool (cores + 4) would queue them
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=32))


async def _cleanup(memo: Any, **_: Any) -> None:
    if memo.state.kube is not None:
        await memo.state.kube.close()


async def poll(body: kopf.Body, memo: Any, logger: logging.Logger, **_: Any) -> None:
    """A finished run changes only by a spec edit (`changed`): once this process has passed over it
    (after a restart too, so its metrics are there), polls cost nothing."""
    if (body.get("status") or {}).get("phase") in TERMINAL_PHASES and _key(body["metadata"]) in memo.state.finished:
        return
    await reconcile_resource(body, memo.state, logger, urgent=False)


async def changed(body: kopf.Body, memo: Any, logger: logging.Logger, **_: Any) -> None:
    await reconcile_resource(body, memo.state, logger, urgent=True)


def _key(meta: Any) -> tuple[str, str, str | None]:
    return (meta["namespace"], meta["name"], meta.get("uid"))


async def deleted(body: kopf.Body, memo: Any, logger: logging.Logger, **_: Any) -> None:
    """Kubernetes garbage-collects owned children; a submission to a shared Ray cluster is stopped."""
    meta = body["metadata"]
    metrics.TRACKER.forget(meta["namespace"], meta["name"])
    memo.state.locks.pop(f"{meta['namespace']}/{meta['name']}", None)
    memo.state.configmaps.pop(_key(meta), None)
    memo.state.finished.discard(_key(meta))
    try:
        ray = parse_spec({"spec": dict(body.get("spec") or {})}).spec.generation.ray
    except SpecError:
        return
    attempt = (body.get("status") or {}).get("attempt")
    if ray.mode == "Submit" and ray.address and attempt:
        sid = children.submission_id(meta["namespace"], meta["name"], attempt)
        try:
            await ray_submission.stop_job(ray.address, sid)
            logger.info(f"stopped Ray job {sid}: its DatasetGeneration was deleted")
        except Exception as e:
            logger.warning(f"could not stop Ray job {sid} ({type(e).__name__}: {e})")


def registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """The handlers, registered with the configured poll interval (kopf reads it at registration)."""
    reg = kopf.OperatorRegistry()
    # kopf's own watch connection logs in as our client does (service account, else kubeconfig)
    kopf.on.login(registry=reg)(kopf.login_via_async_client)
    kopf.on.startup(registry=reg)(_startup)
    kopf.on.cleanup(registry=reg)(_cleanup)
    kopf.timer(GROUP, VERSION, PLURAL, interval=config.interval, initial_delay=config.interval,
               registry=reg)(poll)
    kopf.on.event(GROUP, VERSION, PLURAL, when=_spec_changed, registry=reg)(changed)
    kopf.on.event(GROUP, VERSION, PLURAL, when=lambda type, **_: type == "DELETED", registry=reg)(deleted)
    return reg

"""The run end to end: generate -> samples -> extract -> manifest (DESIGN §3).

`eyrie run` calls `run_stages`; the CLI only parses arguments and prints. Each stage's own package
does the work; this module decides which stages a spec needs and records where the run stands.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from functools import partial

import orjson

from eyrie.jobs.context import RunContext
from eyrie.jobs.contract import layout
from eyrie.jobs.contract.fingerprint import bind_output
from eyrie.jobs.contract.manifest import finalize_manifest
from eyrie.jobs.contract.pilot import PilotVerdict
from eyrie.jobs.contract.progress import Outcome, Progress, Stage, mark_stage, now_iso, write_progress
from eyrie.jobs.spec import SIMULATED, DatasetGeneration, DatasetGenerationSpec
from eyrie.jobs.store import Store, open_output
from eyrie.jobs.timeline import Timeline

UNTIL = ("generate", "samples", "all")
TEXT_MODE_WARNING = (
    "tools.mode is text: functions reach the model only as prompt text, not as the API's `tools`; the "
    "model may call them less often or differently than it natively would. Use it for comparisons "
    "(`eyrie audit`), not for a dataset.")


@contextmanager
def provider(spec: DatasetGenerationSpec) -> Iterator[str]:
    """The base URL to send requests to: `api.baseUrl`, or the built-in simulator on loopback for
    `simulated` (started here, stopped on exit; the generation stage itself never imports it)."""
    with starting_provider(spec) as base_url:
        yield base_url()


@contextmanager
def starting_provider(spec: DatasetGenerationSpec) -> Iterator[Callable[[], str]]:
    """`provider` in two halves: the simulator's process starts at once, and `base_url()` waits for it to
    listen, so what the caller does meanwhile (the generation stage's imports) overlaps its start."""
    if spec.api.base_url != SIMULATED:
        yield lambda: spec.api.base_url
        return
    from eyrie.jobs.simulator import SimulatorConfig, SimulatorProcess

    cfg = SimulatorConfig.from_spec(spec.api.simulator, spec.target, spec.sources, spec.output.endpoint)
    cfg.input_per_million = spec.effective_pricing().input_per_million
    cfg.output_per_million = spec.effective_pricing().output_per_million
    sim = SimulatorProcess(cfg)
    sim.spawn()
    try:
        yield sim.wait_ready
    finally:
        sim.stop()


def run_stages(dg: DatasetGeneration, ctx: RunContext, until: str = "all", *, inline: bool = False,
               on_progress: Callable[[Progress], None] | None = None,
               notify: Callable[[str], None] = lambda _msg: None,
               on_audit: Callable[[dict], None] | None = None,
               on_pilot: Callable[[PilotVerdict], None] | None = None,
               accept_changed: Sequence[str] = (), timeline: Timeline | None = None) -> tuple[Outcome, str]:
    """generate -> samples (needs target.tokenizer) -> extract (needs extraction.enabled) -> manifest.
    `notify` receives notes for the user (warnings, a skipped audit), `on_progress` live snapshots and
    `on_audit` the audit's table (tools.mode audit), `on_pilot` the pilot's verdict (spec.pilot: decided
    before anything else is sent; one that suspends the run ends it here, outcome PilotFailed). An output
    whose answers were bought under another fingerprint is refused before anything is sent, the audit and
    the pilot included (`accept_changed`: the fields whose change the user accepts). `timeline` hears the
    start-up's steps (`eyrie run --verbose`)."""
    from eyrie.jobs.extract.projection import stored_bytes_per_token

    timeline = timeline or Timeline.off()
    spec = dg.spec
    store = open_output(spec)
    with timeline.step("the output's fingerprint"):
        binding = bind_output(store, spec, ctx.attempt, accept=accept_changed, accept_id=ctx.accept_fingerprint,
                              now=now_iso())
    if note := binding.note():
        notify(note)
    if spec.tools.mode == "text":
        notify(f"warning: {TEXT_MODE_WARNING}")
    with ExitStack() as stack:
        simulated = spec.api.base_url == SIMULATED
        started = time.time()
        base_url_of = stack.enter_context(starting_provider(spec))
        with timeline.step("generation's imports" + (" (beside the simulator's start)" if simulated else "")):
            from eyrie.jobs.generate.driver import run_generation
        base_url = base_url_of()
        if simulated:
            timeline.add("the simulator's start (listening)", started, time.time() - started)
        if spec.pilot is not None:
            stop = _pilot(dg, ctx, base_url, until, store, notify, on_progress, on_pilot)
            if stop is not None:
                return stop
        if spec.tools.mode == "audit":
            from eyrie.jobs.generate.audit.run import AuditError, run_audit

            try:
                doc = run_audit(dg, spec.tools.gate.canary_samples, ctx, base_url)  # reuses what it has
                if on_audit is not None:
                    on_audit(doc)
            except AuditError as e:
                notify(f"audit skipped: {e}")
        result = run_generation(dg, store, ctx, base_url, inline=inline, on_progress=on_progress, notify=notify,
                                binding=binding, bytes_per_token=partial(stored_bytes_per_token, spec),
                                timeline=timeline)

    def mark(stage: Stage, outcome: Outcome, message: str = "") -> None:
        write_progress(store, result.snapshot.model_copy(update={"stage": stage, "outcome": outcome,
                                                                 "message": message}))

    if result.outcome != Outcome.DONE:
        mark(Stage.GENERATE, result.outcome, result.message)
        return result.outcome, result.message
    stage = Stage.GENERATE
    if spec.target.tokenizer and until in ("samples", "all"):
        from eyrie.jobs.reconstruct.samples import build_samples

        mark(Stage.SAMPLES, Outcome.RUNNING)
        summary = build_samples(spec, store)
        store.put(layout.SAMPLES_SUMMARY, orjson.dumps(summary.to_manifest(), option=orjson.OPT_INDENT_2))
        stage = Stage.SAMPLES
    if spec.extraction.enabled and until == "all":
        from eyrie.jobs.extract.run import run_extraction

        mark(Stage.EXTRACT, Outcome.RUNNING)
        run_extraction(spec, store)
        stage = Stage.EXTRACT
    # "done" (and the manifest) only once every stage this spec needs has run
    needed = Stage.EXTRACT if spec.extraction.enabled else Stage.SAMPLES if spec.target.tokenizer else Stage.GENERATE
    final = Stage.DONE if stage == needed else stage
    mark(final, Outcome.DONE)
    if final == Stage.DONE:
        finalize_manifest(spec, store)
    return Outcome.DONE, ""


def _pilot(dg: DatasetGeneration, ctx: RunContext, base_url: str, until: str, store: Store,
           notify: Callable[[str], None], on_progress: Callable[[Progress], None] | None,
           on_pilot: Callable[[PilotVerdict], None] | None) -> tuple[Outcome, str] | None:
    """The pilot before anything else is sent (decided now, or read back): None when the run goes on, else its
    outcome. A generation-only run (`--until samples`: the operator's generation job, whose image has no torch)
    never trains drafters: it needs the verdict already decided (`eyrie pilot SPEC`, the operator's pilot Job)."""
    from eyrie.jobs.pilot.run import PilotError, decided, run_pilot

    if until != "all" and decided(dg.spec, store) is None:
        raise PilotError("spec.pilot: the pilot has not decided for this spec; run `eyrie pilot SPEC` first (in a "
                         "cluster the operator's pilot Job does), or `eyrie run SPEC` without --until")
    result = run_pilot(dg, ctx, base_url, notify=notify, on_progress=on_progress or (lambda _p: None))
    if result.verdict is not None and on_pilot is not None:
        on_pilot(result.verdict)
    if result.outcome == Outcome.PILOT_PASSED:
        return None
    return result.outcome, result.message


def finish_extraction(spec: DatasetGenerationSpec, store: Store, count: int) -> bool:
    """An extraction pod's last step, once its summary is written: the pod that finds every pod's
    summary in the store ends the run as `run_stages` ends a local one (progress at stage done,
    manifest.json with the extraction and fidelity merged) and rewrites report.html, which the
    generation job wrote before there was any extraction. Two pods finishing together both do it,
    with the same result (each write is atomic). Returns whether this pod did."""
    if not all(store.exists(layout.summary_key(i, count)) for i in range(count)):
        return False
    from eyrie.jobs.report import publish

    mark_stage(store, Stage.DONE)
    finalize_manifest(spec, store)
    publish(store)
    return True

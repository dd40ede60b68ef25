"""One root for every error eyrie raises on purpose: entry points catch `EyrieError` and print its
message (written for the user: it names the field, row, file or setting and what to do); anything
else is a bug and keeps its traceback. `InputError`s are caught before anything was paid (exit 2).

The whole tree, as httpx's `_exceptions.py` draws its own (tests/house/test_architecture.py keeps it true: a new
exception class goes under `EyrieError` and onto this drawing, in the same change):

```
EyrieError
    ApiError  (jobs/api/errors.py)
        ListingError  (jobs/api/endpoints.py)
        ApiUnreachable  (jobs/api/errors.py)
        AuthError  (jobs/api/errors.py)
        InsufficientCredits  (jobs/api/errors.py)
        RequestFailed  (jobs/api/errors.py)
            SampleRefused  (jobs/api/errors.py)
    Retryable  (jobs/api/errors.py)
    NotSent  (jobs/api/errors.py)
    LimitsTooLow  (jobs/api/limits.py)
    ExtractionError  (jobs/contract/extraction.py)
        VocabMismatch  (jobs/extract/run.py)
        EngineArgsError  (jobs/extract/sglang_backend.py)
        SGLangCaptureError  (jobs/extract/sglang_backend.py)
        SpoolTooSmall  (jobs/extract/sglang_backend.py)
        BuiltinModelError  (jobs/shipped.py)
    LayerError  (jobs/contract/layers.py)
    ProgressError  (jobs/contract/progress.py)
    InputError  (jobs/errors.py)
        ModelNotListed  (jobs/api/endpoints.py)
        AuditDocError  (jobs/contract/audit.py)
        FingerprintChanged  (jobs/contract/fingerprint.py)
        RecordedFileError  (jobs/generate/audit/recorded.py)
        PreflightError  (jobs/generate/preflight.py)
        ProbeError  (jobs/generate/probe/run.py)
        LimitsNotShared  (jobs/generate/sending/session.py)
        PilotError  (jobs/pilot/run.py)
        PackingRefused  (jobs/reconstruct/formats.py)
        SimulatorConfigError  (jobs/simulator/config.py)
        SpecError  (jobs/spec.py)
        ConfigError  (operator/config.py)
    EvaluationError  (jobs/evaluate/plan.py)
        DifferentTargets  (jobs/evaluate/data.py)
        NoHiddenStates  (jobs/evaluate/data.py)
        SpecForgeMissing  (jobs/evaluate/drafter.py)
        Leakage  (jobs/evaluate/plan.py)
        TooFewSamples  (jobs/evaluate/plan.py)
    ModelLoadError  (jobs/extract/hf_backend.py)
    ShardError  (jobs/extract/shards.py)
        SampleNotFound  (jobs/extract/shards.py)
    ExportError  (jobs/extract/specforge.py)
        SpecForgeUnavailable  (jobs/extract/specforge_online.py)
    VarlenError  (jobs/extract/varlen.py)
    AuditError  (jobs/generate/audit/run.py)
        UnusableFile  (jobs/generate/audit/from_recorded.py)
    StoppedAtOnce  (jobs/generate/budget/holder.py)
    UnpriceableRequest  (jobs/generate/budget/pricing.py)
    WorkerFailed  (jobs/generate/sending/worker.py)
    FormatError  (jobs/reconstruct/base.py)
    ToolDeclarationError  (jobs/reconstruct/kimi_facts.py)
    TokenizerError  (jobs/reconstruct/tokenizers.py)
    SourceError  (jobs/sources/errors.py)
    RowError  (jobs/sources/errors.py)
    StoreError  (jobs/store.py)
        NotFound  (jobs/store.py)
    DeclarationError  (jobs/tools/declarations.py)
    TextCallError  (jobs/tools/textcalls.py)
    ChildSpecError  (operator/children.py)
    ChildRejected  (operator/handlers.py)
    KubeError  (operator/kube.py)
    SecretMissing  (operator/secret_refs.py)
```
"""

from __future__ import annotations


class EyrieError(Exception):
    """An error a user can act on; `exit_code` is what the CLI exits with when it ends a command."""

    exit_code: int = 1


class InputError(EyrieError):
    """Bad input caught before anything was paid: the CLI exits 2."""

    exit_code = 2

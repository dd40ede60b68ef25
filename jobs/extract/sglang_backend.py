"""The SGLang backend: prefill-only runs in an `sglang.Engine`, hidden states captured inside it.

How the capture works (written against sglang 0.5.23, the `eyrie[sglang]` pin; every SGLang name used
here is checked against that wheel's source by tests/extract/test_sglang_pin.py, without a GPU):

- SGLang models already know how to collect EAGLE-3 auxiliary hidden states: after
  `model.set_eagle3_layers_to_capture(ids)` their decoder loop collects the residual stream entering
  each layer in `layers_to_capture` (SGLang's setter stores `id + 1`, so we pass our ids - 1: our ids
  are Hugging Face `output_hidden_states` indices) and hands the list to the logits processor with
  the final hidden state. Some families (Qwen2/3-MoE, Qwen3-Next, Qwen3.5, MiniMax-M3, ...) decide
  per layer from an `_is_layer_to_capture` flag that only their setter sets, so the setter is the
  only way in; afterwards we read back what the model will capture and refuse to run unless it is
  exactly the manifest's layers (a few model files apply other offsets).
- The hooks are an SGLang general plugin (`sglang.srt.plugins` entry point) that every SGLang
  process loads at start. eyrie does not install it globally: the backend writes a throw-away
  `.dist-info` naming the entry point into a temporary folder on PYTHONPATH, and the plugin does
  nothing unless EYRIE_SGLANG_CAPTURE is set, so other SGLang servers in the image are untouched.
- An AROUND hook on `LogitsProcessor.forward` slices the prefill batch per request (request ids,
  extend lengths and prefix offsets from the ForwardBatch; chunked prefill gives several pieces)
  and, on tensor-parallel rank 0 only (the residual stream is replicated across TP ranks), saves
  each piece as a safetensors file in a spool folder (/dev/shm). Binary tensors, never JSON lists.
  The driver submits requests with `max_new_tokens=1` (prefill only) and the radix cache off (a
  cached prefix would skip its hidden states), then assembles the pieces.
- The hooks never raise inside SGLang: a scheduler exception makes SGLang SIGQUIT the driver and
  kill the whole process tree, so the cause would only reach SGLang's log. They write the error to
  a status folder instead, and the driver raises it as an `ExtractionError`. Before the first
  request the driver checks (a handshake) that every TP rank loaded the plugin, applied both hooks
  and configured capture of the manifest's layers.
- Fidelity scores come from the engine's own input-token log-probabilities in the same prefill:
  `return_logprob` with `logprob_start_len` one before the first scored token and
  `top_logprobs_num=1`; `meta_info["input_token_logprobs"]` and `["input_top_logprobs"]` hold one
  entry per token from `logprob_start_len` on, the first None (see `engine_scores`).
- `generate()` is synchronous, so a whole batch is spooled before the driver reads any of it: the
  spool must hold one batch (the extraction Job mounts a sized memory volume at /dev/shm); start-up
  refuses when it cannot.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.torch
import torch

from eyrie.jobs.contract.extraction import ExtractionError
from eyrie.jobs.contract.layers import ModelFacts, model_facts, spool_bytes
from eyrie.jobs.extract.fidelity import Forward, TokenScores

SGLANG_VERSION = "0.5.23"
CAPTURE_ENV = "EYRIE_SGLANG_CAPTURE"
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "eyrie_hidden_capture"
PLUGIN_DIST = "eyrie_sglang_capture-0.0.0.dist-info"
RID_PREFIX = "eyrie-"
SHM = Path("/dev/shm")
_PIECE_RE = re.compile(r"^(?P<rid>.+)\.(?P<start>\d{10})\.safetensors$")

# What the backend touches in SGLang; tests/extract/test_sglang_pin.py verifies each against the pinned source.
HOOK_INIT = "sglang.srt.model_executor.model_runner.ModelRunner.init_attention_backends"
HOOK_LOGITS = "sglang.srt.layers.logits_processor.LogitsProcessor.forward"
HOOKS = (HOOK_INIT, HOOK_LOGITS)
CAPTURE_SETTER = "set_eagle3_layers_to_capture"
CAPTURE_LIST = "layers_to_capture"
CAPTURE_FLAG = "_is_layer_to_capture"
CAPTURE_SWITCH = "capture_aux_hidden_states"

# Engine arguments that split a prefill batch's rows (or layers) across ranks: rank 0 would spool
# only its share. Name -> (the value that leaves it off, why).
REFUSED_ENGINE_ARGS: dict[str, tuple[Any, str]] = {
    "attn_dp_size": (1, "attention data parallelism gives each attention-DP rank its own requests"),
    "enable_dp_attention": (False, "attention data parallelism gives each attention-DP rank its own requests"),
    "enable_dp_lm_head": (False, "it belongs to attention data parallelism"),
    "attn_cp_size": (1, "context parallelism shards each sequence across ranks"),
    "enable_prefill_cp": (False, "prefill context parallelism shards each sequence across ranks"),
    "enable_layernorm_sp": (False, "sequence parallelism shards the residual stream across ranks"),
    "enable_attn_tp_input_scattered": (False, "it scatters the residual stream across attention-TP ranks"),
    "pp_size": (1, "pipeline stages before the last never capture their layers"),
}
# Engine arguments eyrie sets itself: a different value would silently change what is captured.
OWNED_ENGINE_ARGS = ("model_path", "tp_size", "dtype", "disable_radix_cache", "skip_tokenizer_init")


def sglang_imports() -> list[tuple[str, str]]:
    """(module, name) of every SGLang name this file imports, read from its own source.

    The pin test resolves each in the pinned wheel's source; the GPU check imports each for real.
    """
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(Path(__file__).read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sglang":
            found.update((node.module or "", a.name) for a in node.names)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sglang":
            found.add(("sglang", node.attr))
    return sorted(found)


class SGLangCaptureError(ExtractionError):
    """SGLang did not deliver hidden states the way eyrie expects; the message says which part failed."""


class EngineArgsError(ExtractionError):
    """An SGLang engine argument that the capture cannot work with; the message names it."""


class SpoolTooSmall(ExtractionError):
    """The spool folder cannot hold one batch of hidden states."""


@dataclass(frozen=True)
class CaptureConfig:
    """What the plugin needs inside SGLang's processes (passed as JSON in EYRIE_SGLANG_CAPTURE)."""

    spool: str
    status: str
    layers: list[int]

    def dump(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def load(cls, raw: str) -> CaptureConfig:
        d = json.loads(raw)
        return cls(spool=d["spool"], status=d["status"], layers=[int(i) for i in d["layers"]])


# ------------------------------------------------------------- inside SGLang's processes


def _write_json(folder: Path, name: str, doc: dict[str, Any]) -> None:
    tmp = folder / f".{name}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, folder / name)


def record_error(status: Path, where: str, exc: BaseException, **extra: Any) -> None:
    """Leave an exception for the driver (raising inside SGLang would kill the driver with it)."""
    doc = {"where": where, "pid": os.getpid(), "type": type(exc).__name__, "message": str(exc),
           "traceback": "".join(traceback.format_exception(exc))[-4000:], **extra}
    try:
        _write_json(status, f"error.{where}.{os.getpid()}.{uuid.uuid4().hex[:8]}.json", doc)
    except OSError:
        print(f"eyrie capture: {where}: {type(exc).__name__}: {exc}", file=sys.stderr)


def capture_plugin() -> None:
    """Entry point SGLang calls in each process; registers the hooks only for eyrie's engine."""
    raw = os.environ.get(CAPTURE_ENV)
    if not raw:
        return
    cfg = CaptureConfig.load(raw)
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        HookRegistry.register(HOOK_INIT, functools.partial(enable_capture, cfg=cfg), HookType.BEFORE)
        HookRegistry.register(HOOK_LOGITS, functools.partial(capture_forward, cfg=cfg), HookType.AROUND)
    except Exception as e:  # SGLang only logs a failing plugin; the handshake reports this instead
        record_error(Path(cfg.status), "plugin", e)


def _tp_rank() -> int:
    """This process's tensor-parallel rank, read the way SGLang itself reads it."""
    from sglang.srt.runtime_context import get_parallel

    return int(get_parallel().tp_rank)


def _applied_hooks() -> list[str]:
    from sglang.srt.plugins.hook_registry import HookRegistry

    return [t for t in HOOKS if t in HookRegistry._patched]


def enable_capture(runner: Any, *_args: Any, cfg: CaptureConfig, **_kw: Any) -> None:
    """BEFORE hook of ModelRunner.init_attention_backends: configure capture, report it to the driver."""
    if getattr(runner, "is_draft_worker", False):
        return
    status = Path(cfg.status)
    try:
        rank = _tp_rank()
        layers = configure_capture(runner.model, cfg.layers)
        _write_json(status, f"ready.tp{rank}.{os.getpid()}.json",
                    {"tpRank": rank, "pid": os.getpid(), "model": type(runner.model).__name__,
                     "layers": layers, "hooks": _applied_hooks()})
    except Exception as e:
        record_error(status, "init", e)


def configure_capture(model: torch.nn.Module, layers: Sequence[int]) -> list[int]:
    """Ask the model to capture the inputs of `layers` through its own setter; return what it will capture.

    Raises unless the model will capture exactly `layers` (what the manifest records).
    """
    setter = getattr(model, CAPTURE_SETTER, None)
    if setter is None:
        raise SGLangCaptureError(f"{type(model).__name__} cannot capture auxiliary hidden states in SGLang "
                                 f"(no {CAPTURE_SETTER}); use engine: transformers")
    wanted, shifted = list(layers), [i - 1 for i in layers]
    setter(shifted)  # SGLang's setters store id + 1: the input of layer id + 1
    got = captured_layers(model)
    if got == shifted != wanted and not any(getattr(m, CAPTURE_FLAG, False) is True for m in model.modules()):
        # DeepSeek-V2/V3 and GLM-4-MoE-Lite store the ids unshifted unless the first is 1; their
        # capture is a plain list (no flags), so a second call replaces the first entirely
        setter(wanted)
        got = captured_layers(model)
    if got != wanted:
        raise SGLangCaptureError(
            f"{type(model).__name__}.{CAPTURE_SETTER}({shifted}) makes the model capture the "
            f"inputs of layers {got}, not {wanted}: this model file numbers layers differently; "
            "choose other extraction.layers or use engine: transformers")
    return got


def captured_layers(model: torch.nn.Module) -> list[int]:
    """The layers whose inputs the model's forward will capture, decided the way SGLang's model files do.

    The decoder loop of most families checks `i in layers_to_capture`; flag families check each
    layer's `_is_layer_to_capture`. Where any layer carries the flag, both must agree, else the
    manifest would name layers the model does not capture.
    """
    switches = [s for m in model.modules() if isinstance(s := getattr(m, CAPTURE_SWITCH, None), bool)]
    if switches and not any(switches):  # wrappers (VL, Kimi-K2.5) delegate: one module on is enough
        raise SGLangCaptureError(f"{type(model).__name__}.{CAPTURE_SWITCH} is off after {CAPTURE_SETTER}")
    found: dict[str, list[int]] = {}
    for name, m in model.named_modules():
        ids = getattr(m, CAPTURE_LIST, None)
        if not isinstance(ids, list | tuple | set) or not ids:
            continue
        listed = sorted(int(i) for i in ids)
        decoder = getattr(m, "layers", None)
        flagged = [i for i, layer in enumerate(decoder or ()) if getattr(layer, CAPTURE_FLAG, False) is True]
        if flagged and flagged != listed:
            raise SGLangCaptureError(
                f"{type(m).__name__} captures the layers flagged {CAPTURE_FLAG} ({flagged}) but its "
                f"{CAPTURE_LIST} is {listed}: the model would capture other layers than the manifest records")
        found[name or type(m).__name__] = listed
    if not found:
        raise SGLangCaptureError(f"{type(model).__name__}: {CAPTURE_SETTER} set no {CAPTURE_LIST}")
    if len({tuple(v) for v in found.values()}) > 1:
        raise SGLangCaptureError(f"{type(model).__name__}: submodules disagree on {CAPTURE_LIST}: {found}")
    return next(iter(found.values()))


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, name: str) -> Any:
    return args[pos] if len(args) > pos else kwargs.get(name)


def capture_forward(original: Any, *args: Any, cfg: CaptureConfig, **kwargs: Any) -> Any:
    """AROUND hook of LogitsProcessor.forward(self, input_ids, hidden_states, lm_head, meta, aux, ...)."""
    rids: Any = None
    try:
        hidden = _arg(args, kwargs, 2, "hidden_states")
        batch = _arg(args, kwargs, 4, "logits_metadata")
        aux = _arg(args, kwargs, 5, "aux_hidden_states")
        mode = getattr(batch, "forward_mode", None)
        rids = getattr(batch, "rids", None)
        if (mode is not None and mode.is_extend() and not mode.is_target_verify() and rids
                and any(r.startswith(RID_PREFIX) for r in rids) and _tp_rank() == 0):
            save_pieces(Path(cfg.spool), rids, batch.extend_seq_lens_cpu, batch.extend_prefix_lens_cpu, aux,
                        hidden)
    except Exception as e:
        record_error(Path(cfg.status), "forward", e, rids=[r for r in rids or () if r.startswith(RID_PREFIX)])
    return original(*args, **kwargs)


def save_pieces(spool: Path, rids: Sequence[str], lengths: Sequence[int], prefixes: Sequence[int],
                aux: Any, hidden: torch.Tensor) -> None:
    """Write each eyrie request's slice of a prefill batch as `<rid>.<start>.safetensors` (atomic)."""
    if aux is None:
        raise SGLangCaptureError("no auxiliary hidden states reached the logits processor (capture is off)")
    aux_t = torch.cat(list(aux), dim=-1) if isinstance(aux, list | tuple) else aux
    total = sum(int(n) for n in lengths)
    if total > hidden.shape[0] or total > aux_t.shape[0]:
        raise SGLangCaptureError(f"prefill batch has {total} tokens but {hidden.shape[0]} hidden rows")
    start = 0
    for rid, n, p in zip(rids, lengths, prefixes, strict=True):
        n, p = int(n), int(p)
        if rid.startswith(RID_PREFIX) and n:
            piece = {"aux_hidden": aux_t[start:start + n].contiguous().cpu(),
                     "last_hidden": hidden[start:start + n].contiguous().cpu()}
            path = spool / f"{rid}.{p:010d}.safetensors"
            tmp = spool / f".{path.name}.tmp"
            try:
                safetensors.torch.save_file(piece, str(tmp))
            except BaseException:
                tmp.unlink(missing_ok=True)  # a full spool: free it so the error record fits
                raise
            os.replace(tmp, path)
        start += n


# ------------------------------------------------------------------------------- the driver


def logprob_request(starts: Sequence[int | None]) -> dict[str, list[Any]]:
    """Engine.generate arguments that return the input tokens' log-probs and top-1 from `start` on."""
    return {"return_logprob": [s is not None for s in starts],
            "logprob_start_len": [s - 1 if s is not None else -1 for s in starts],
            "top_logprobs_num": [1 if s is not None else 0 for s in starts]}


def engine_scores(meta: dict[str, Any], ids: Sequence[int], start: int, rid: str) -> TokenScores:
    """Scores of ids[start:] from one request's meta_info (asked with logprob_start_len start - 1).

    SGLang returns an entry per input token from logprob_start_len on, `(logprob, token id, text)`,
    the first without a log-prob (nothing before it was computed); top logprobs likewise, each a
    list of such tuples, best first. A token whose log-prob equals the best counts as agreeing.
    """
    tokens, tops = meta.get("input_token_logprobs"), meta.get("input_top_logprobs")
    want = len(ids) - start + 1
    if not isinstance(tokens, list) or not isinstance(tops, list) or len(tokens) != want or len(tops) != want:
        raise SGLangCaptureError(
            f"request {rid}: SGLang returned {len(tokens) if isinstance(tokens, list) else 'no'} input log-probs "
            f"and {len(tops) if isinstance(tops, list) else 'no'} top log-probs for {want} positions")
    logprob = np.empty(want - 1, dtype=np.float32)
    top1 = np.empty(want - 1, dtype=bool)
    for j, ((val, tid, _text), best) in enumerate(zip(tokens[1:], tops[1:], strict=True)):
        # SGLang reports ids >= vocab_size - 1 as 0 (its clip for multimodal pad ids)
        if int(tid) not in (int(ids[start + j]), 0) or val is None or not best:
            raise SGLangCaptureError(f"request {rid}: input log-prob {j} is for token {tid}, not "
                                     f"{ids[start + j]}, or is missing")
        logprob[j] = float(val)
        top1[j] = int(best[0][1]) == int(ids[start + j]) or float(val) >= float(best[0][0])
    return TokenScores(start, logprob, top1)


def recorded_errors(status: Path) -> list[dict[str, Any]]:
    """Errors the hooks left in the status folder, oldest first."""
    docs = []
    for p in sorted(status.glob("error.*.json"), key=lambda q: q.stat().st_mtime):
        try:
            docs.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return docs


def raise_recorded_errors(status: Path) -> None:
    """Raise the first error a hook recorded inside SGLang, with its cause, as an ExtractionError."""
    errors = recorded_errors(status)
    if not errors:
        return
    e = errors[0]
    rids = f" (requests {', '.join(e['rids'][:3])})" if e.get("rids") else ""
    tail = "".join(e.get("traceback", "").splitlines(keepends=True)[-6:])
    more = f"; {len(errors) - 1} more recorded in {status}" if len(errors) > 1 else ""
    raise SGLangCaptureError(f"eyrie's capture hook failed in SGLang ({e['where']}, pid {e['pid']}){rids}: "
                             f"{e['type']}: {e['message']}{more}\n{tail}")


def handshake(status: Path, tp_size: int, layers: Sequence[int]) -> None:
    """Before the first request: every TP rank loaded the plugin, applied both hooks, captures `layers`."""
    raise_recorded_errors(status)
    ready = []
    for p in status.glob("ready.*.json"):
        ready.append(json.loads(p.read_text()))
    missing = sorted(set(range(tp_size)) - {int(r["tpRank"]) for r in ready})
    if missing:
        raise SGLangCaptureError(
            f"capture is not configured in SGLang's scheduler for TP rank(s) {missing}: the plugin "
            f"{PLUGIN_NAME} ({PLUGIN_GROUP} entry point) did not run there or its hook on {HOOK_INIT} was not "
            "applied (SGLang only logs 'Failed to load plugin' / 'Failed to apply hooks to'); is "
            f"SGLANG_PLUGINS restricting plugins, or is this not sglang=={SGLANG_VERSION}?")
    for r in ready:
        if set(r["hooks"]) != set(HOOKS):
            raise SGLangCaptureError(f"TP rank {r['tpRank']}: hook(s) {sorted(set(HOOKS) - set(r['hooks']))} "
                                     f"not applied in SGLang (is this sglang=={SGLANG_VERSION}?)")
        if list(r["layers"]) != list(layers):
            raise SGLangCaptureError(f"TP rank {r['tpRank']}: {r['model']} captures layers {r['layers']}, "
                                     f"the manifest records {list(layers)}")


def assemble(spool: Path, status: Path, rid: str, tokens: int, timeout: float = 5.0
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Join a request's pieces (one per prefill chunk) into (aux [T, kH], last [T, H]); deletes them.

    `generate()` returns after the prefill, so the pieces are there already; the short wait only
    covers the file system. A hook error recorded meanwhile is raised with its cause.
    """
    deadline = time.monotonic() + timeout
    while True:
        raise_recorded_errors(status)
        pieces = sorted((int(m.group("start")), p) for p in spool.glob(f"{glob_escape(rid)}.*.safetensors")
                        if (m := _PIECE_RE.match(p.name)) and m.group("rid") == rid)
        loaded = [(s, safetensors.torch.load_file(str(p))) for s, p in pieces]
        covered = 0
        for s, t in loaded:
            if s != covered:
                break
            covered += t["aux_hidden"].shape[0]
        if covered == tokens:
            break
        if time.monotonic() > deadline:
            raise SGLangCaptureError(f"request {rid}: captured {covered} of {tokens} positions "
                                     f"(pieces at {[s for s, _ in pieces]}) in {spool}")
        time.sleep(0.05)
    for _s, p in pieces:
        p.unlink(missing_ok=True)
    aux = torch.cat([t["aux_hidden"] for _s, t in loaded])
    last = torch.cat([t["last_hidden"] for _s, t in loaded])
    return aux, last


def glob_escape(s: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", s)


def write_plugin_dist(folder: Path) -> Path:
    """A minimal .dist-info on `folder` that advertises our capture plugin to SGLang."""
    dist = folder / PLUGIN_DIST
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: eyrie-sglang-capture\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{PLUGIN_GROUP}]\n{PLUGIN_NAME} = eyrie.jobs.extract.sglang_backend:capture_plugin\n")
    return folder


def check_plugin_loads() -> None:
    """In the driver, before SGLang starts: the entry point is visible and imports (SGLang would only log it)."""
    eps = [e for e in entry_points(group=PLUGIN_GROUP) if e.name == PLUGIN_NAME]
    if not eps:
        raise SGLangCaptureError(f"the capture plugin ({PLUGIN_GROUP} entry point {PLUGIN_NAME}) is not "
                                 f"visible on sys.path; SGLang would start without eyrie's hooks")
    try:
        fn = eps[0].load()
    except Exception as e:
        raise SGLangCaptureError(f"the capture plugin {eps[0].value} does not import: {type(e).__name__}: {e}"
                                 ) from e
    if fn is not capture_plugin:
        raise SGLangCaptureError(f"entry point {PLUGIN_NAME} resolves to {eps[0].value}, not eyrie's plugin "
                                 "(another installed distribution shadows it)")


def check_engine_args(extra: dict[str, Any]) -> None:
    """Refuse engine arguments that split captured rows across ranks or override what eyrie sets."""
    for name, value in extra.items():
        if name in OWNED_ENGINE_ARGS:
            raise EngineArgsError(f"engine argument {name}: set by eyrie (from the extraction spec); "
                                  "remove it from the engine arguments")
        if name in REFUSED_ENGINE_ARGS:
            off, why = REFUSED_ENGINE_ARGS[name]
            if value != off:
                raise EngineArgsError(f"engine argument {name}={value!r}: not supported with hidden-state "
                                      f"capture, {why} and rank 0 would record only its share; "
                                      f"leave it at {off!r} (scale out with extraction.pods)")


def engine_kwargs(model_path: str, tp_size: int, compute_dtype: str, trust_remote_code: bool,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """sglang.Engine arguments: prefill only, nothing cached, no CUDA graphs around our hook."""
    check_engine_args(extra or {})
    return {
        "model_path": model_path,
        "tp_size": tp_size,
        "dtype": compute_dtype,
        "trust_remote_code": trust_remote_code,
        "disable_radix_cache": True,
        "skip_tokenizer_init": True,
        "disable_prefill_cuda_graph": True,
        "disable_decode_cuda_graph": True,
        "random_seed": 0,
        "log_level": "error",
        **(extra or {}),
    }


def spool_folder() -> Path:
    """/dev/shm (memory) when the container has it, else the temp folder."""
    return SHM if SHM.is_dir() else Path(tempfile.gettempdir())


def check_spool(folder: Path, need: int, what: str) -> None:
    """Refuse when `folder` has less free space than `need` bytes, saying what to change."""
    free = shutil.disk_usage(folder).free
    if free < need:
        raise SpoolTooSmall(
            f"{folder} has {free / 2**20:,.0f} MiB free but {what} needs {need / 2**20:,.0f} MiB of spool "
            "(SGLang writes a whole batch before eyrie reads it): mount a larger memory-backed volume at "
            "/dev/shm (the operator's extraction Job does, sized from extraction.maxTokensPerBatch) or "
            "lower extraction.maxTokensPerBatch")


class SGLangBackend:
    """Starts the engine on the first batch (the layer ids must be known before CUDA init)."""

    name = "sglang"
    packs = True  # the engine schedules a batch's samples itself: no padding is computed

    def __init__(self, model_path: str, *, tp_size: int = 1, storage_dtype: str = "bfloat16",
                 trust_remote_code: bool = False, engine_args: dict[str, Any] | None = None,
                 max_tokens_per_batch: int = 16384):
        from transformers import AutoConfig

        check_engine_args(engine_args or {})
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        self.facts: ModelFacts = model_facts(config)
        self.model_path = model_path
        self.tp_size = tp_size
        self.compute_dtype = {"float32": "float32", "float16": "float16"}.get(storage_dtype, "bfloat16")
        self.elem_bytes = 4 if self.compute_dtype == "float32" else 2
        self.trust_remote_code = trust_remote_code
        self.engine_args = engine_args
        self.max_tokens_per_batch = max_tokens_per_batch
        self.engine: Any = None
        self.layers: tuple[int, ...] | None = None
        self._tmp: Path | None = None
        self._env: dict[str, str | None] = {}

    def _spool_need(self, tokens: int) -> int:
        assert self.layers is not None
        return spool_bytes(tokens, len(self.layers), self.facts.hidden_size, self.elem_bytes)

    def _start(self, layers: Sequence[int]) -> None:
        try:
            import sglang
        except ImportError as e:
            raise SGLangCaptureError(f"engine: sglang needs the sglang extra (pip install 'eyrie[sglang]', "
                                     f"sglang=={SGLANG_VERSION}) or the SGLang image: {e}") from None
        if min(layers) < 1:
            raise SGLangCaptureError(f"layer id {min(layers)}: SGLang captures inputs of layers 1..L-1 only")
        self.layers = tuple(layers)
        folder = spool_folder()
        check_spool(folder, self._spool_need(self.max_tokens_per_batch),
                    f"one batch (extraction.maxTokensPerBatch {self.max_tokens_per_batch} tokens x "
                    f"{len(layers) + 1} x hidden {self.facts.hidden_size} x {self.elem_bytes} bytes)")
        self._tmp = Path(tempfile.mkdtemp(prefix="eyrie-capture-", dir=folder))
        self.spool, self.status = self._tmp / "spool", self._tmp / "status"
        self.spool.mkdir()
        self.status.mkdir()
        plugin_path = write_plugin_dist(self._tmp / "plugin")
        cfg = CaptureConfig(spool=str(self.spool), status=str(self.status), layers=list(layers))
        env = {
            CAPTURE_ENV: cfg.dump(),
            "PYTHONPATH": os.pathsep.join(p for p in (str(plugin_path), os.environ.get("PYTHONPATH")) if p),
        }
        if os.environ.get("SGLANG_PLUGINS"):
            env["SGLANG_PLUGINS"] = os.environ["SGLANG_PLUGINS"] + "," + PLUGIN_NAME
        for k, v in env.items():
            self._env[k] = os.environ.get(k)
            os.environ[k] = v
        sys.path.insert(0, str(plugin_path))
        check_plugin_loads()
        kwargs = engine_kwargs(self.model_path, self.tp_size, self.compute_dtype, self.trust_remote_code,
                               self.engine_args)
        try:
            self.engine = sglang.Engine(**kwargs)
        except Exception as e:
            raise_recorded_errors(self.status)
            raise SGLangCaptureError(f"SGLang engine did not start: {type(e).__name__}: {e}") from e
        handshake(self.status, self.tp_size, layers)

    def hidden_states(self, batch: Sequence[Sequence[int]], layer_ids: Sequence[int]
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(aux, last) per sample, without scores."""
        return [(f.aux, f.last) for f in self.forward(batch, layer_ids)]

    def forward(self, batch: Sequence[Sequence[int]], layer_ids: Sequence[int],
                score_from: Sequence[int | None] | None = None) -> list[Forward]:
        """Prefill the batch in the engine; CPU tensors (aux [T, kH], last [T, H]) per sample and, where
        `score_from` gives a position, the engine's log-probs and top-1 of the tokens from there on."""
        if not batch:
            return []
        if self.engine is None:
            self._start(layer_ids)
        elif tuple(layer_ids) != self.layers:
            raise SGLangCaptureError(f"engine captures layers {self.layers}, asked for {tuple(layer_ids)}")
        tokens = sum(len(x) for x in batch)
        if tokens > self.max_tokens_per_batch:  # a sample longer than the budget runs alone
            check_spool(self.spool, self._spool_need(tokens), f"a batch of {tokens} tokens")
        tag = uuid.uuid4().hex[:12]
        rids = [f"{RID_PREFIX}{tag}-{i}" for i in range(len(batch))]
        starts = list(score_from) if score_from is not None else [None] * len(batch)
        scoring = logprob_request(starts) if any(s is not None for s in starts) else {}
        outs = self.engine.generate(input_ids=[[int(t) for t in x] for x in batch],
                                    sampling_params=[{"max_new_tokens": 1, "temperature": 0.0} for _ in batch],
                                    rid=rids, **scoring)
        result = []
        for b, (rid, x, s) in enumerate(zip(rids, batch, starts, strict=True)):
            aux, last = assemble(self.spool, self.status, rid, len(x))
            scores = engine_scores(outs[b]["meta_info"], x, s, rid) if s is not None else None
            result.append(Forward(aux, last, scores))
        return result

    def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
        for k, v in self._env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._env = {}
        if self._tmp is not None:
            plugin = str(self._tmp / "plugin")
            if plugin in sys.path:
                sys.path.remove(plugin)
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

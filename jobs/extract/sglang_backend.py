"""The SGLang backend: prefill-only runs in an `sglang.Engine`, hidden states captured inside it.

How the capture works (written against sglang 0.5.23, the `eyrie[sglang]` pin):

- SGLang models already know how to collect EAGLE-3 auxiliary hidden states: after
  `model.set_eagle3_layers_to_capture(None)` their decoder loop appends the residual stream entering
  every layer in `layers_to_capture` and hands the list to the logits processor, together with the
  final hidden state (after the last norm). A draft model is what normally calls it; we call it
  ourselves from a hook, then point `layers_to_capture` at our layer ids (same meaning as
  Hugging Face `output_hidden_states` indices; we set the attribute directly because the offset
  that `set_eagle3_layers_to_capture(ids)` applies differs between model files).
- The hooks are an SGLang general plugin (`sglang.srt.plugins` entry point) that every scheduler
  process loads at start. eyrie does not install it globally: the backend writes a throw-away
  `.dist-info` naming the entry point into a temporary folder on PYTHONPATH, and the plugin does
  nothing unless EYRIE_SGLANG_CAPTURE is set, so other SGLang servers in the image are untouched.
- An AROUND hook on `LogitsProcessor.forward` slices the prefill batch per request (request ids,
  extend lengths and prefix offsets from the ForwardBatch; chunked prefill gives several pieces)
  and, on tensor-parallel rank 0 only (the residual stream is replicated across TP ranks), saves
  each piece as a safetensors file in a spool folder (/dev/shm when present). Binary tensors,
  never JSON lists. The driver submits requests with `max_new_tokens=1` (prefill only) and the
  radix cache off (a cached prefix would skip its hidden states), then assembles the pieces.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from eyrie.jobs.extract.layers import ModelFacts, model_facts

SGLANG_VERSION = "0.5.23"
CAPTURE_ENV = "EYRIE_SGLANG_CAPTURE"
PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_NAME = "eyrie_hidden_capture"
PLUGIN_DIST = "eyrie_sglang_capture-0.0.0.dist-info"
RID_PREFIX = "eyrie-"
_PIECE_RE = re.compile(r"^(?P<rid>.+)\.(?P<start>\d{10})\.safetensors$")


class SGLangCaptureError(RuntimeError):
    """SGLang did not deliver hidden states the way eyrie expects; the message says which part failed."""


# ------------------------------------------------------------- inside SGLang's scheduler processes


def capture_plugin() -> None:
    """Entry point SGLang calls in each process; registers the hooks only for eyrie's engine."""
    raw = os.environ.get(CAPTURE_ENV)
    if not raw:
        return
    cfg = json.loads(raw)
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(
        "sglang.srt.model_executor.model_runner.ModelRunner.init_attention_backends",
        functools.partial(enable_capture, layers=cfg["layers"], num_layers=cfg["numLayers"]),
        HookType.BEFORE)
    HookRegistry.register(
        "sglang.srt.layers.logits_processor.LogitsProcessor.forward",
        functools.partial(capture_forward, spool=Path(cfg["spool"])),
        HookType.AROUND)


def enable_capture(runner: Any, *_args: Any, layers: Sequence[int], num_layers: int, **_kw: Any) -> None:
    """Turn on aux-hidden-state capture on the runner's model and retarget it to `layers`."""
    if getattr(runner, "is_draft_worker", False):
        return
    model = runner.model
    setter = getattr(model, "set_eagle3_layers_to_capture", None)
    if setter is None:
        raise SGLangCaptureError(f"{type(model).__name__} cannot capture auxiliary hidden states in SGLang "
                                 "(no set_eagle3_layers_to_capture); use engine: transformers")
    setter(None)
    retarget_capture(model, layers, num_layers)


def retarget_capture(model: torch.nn.Module, layers: Sequence[int], num_layers: int) -> None:
    """Replace SGLang's default capture list with ours, after checking it means what we think."""
    default = {2, num_layers // 2, num_layers - 3}
    holders = [m for m in model.modules()
               if isinstance(getattr(m, "layers_to_capture", None), list | set | tuple)
               and getattr(m, "layers_to_capture", None)]
    if not holders:
        raise SGLangCaptureError(f"{type(model).__name__}: set_eagle3_layers_to_capture set no layers_to_capture")
    for h in holders:
        cur = h.layers_to_capture
        if set(cur) != default:
            raise SGLangCaptureError(
                f"{type(h).__name__}.layers_to_capture is {sorted(cur)} after set_eagle3_layers_to_capture(None),"
                f" expected {sorted(default)} (inputs of layers 2, L//2, L-3): this model file captures with "
                "other semantics; use engine: transformers")
        h.layers_to_capture = type(cur)(layers)


def _arg(args: tuple[Any, ...], kwargs: dict[str, Any], pos: int, name: str) -> Any:
    return args[pos] if len(args) > pos else kwargs.get(name)


def capture_forward(original: Any, *args: Any, spool: Path, **kwargs: Any) -> Any:
    """AROUND hook of LogitsProcessor.forward(self, input_ids, hidden_states, lm_head, meta, aux, ...)."""
    hidden = _arg(args, kwargs, 2, "hidden_states")
    batch = _arg(args, kwargs, 4, "logits_metadata")
    aux = _arg(args, kwargs, 5, "aux_hidden_states")
    mode = getattr(batch, "forward_mode", None)
    rids = getattr(batch, "rids", None)
    if (mode is not None and mode.is_extend() and not mode.is_target_verify() and rids
            and any(r.startswith(RID_PREFIX) for r in rids) and _tp_rank() == 0):
        save_pieces(spool, rids, batch.extend_seq_lens_cpu, batch.extend_prefix_lens_cpu, aux, hidden)
    return original(*args, **kwargs)


def _tp_rank() -> int:
    from sglang.srt.distributed import get_tensor_model_parallel_rank

    return int(get_tensor_model_parallel_rank())


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
            safetensors.torch.save_file(piece, str(tmp))
            os.replace(tmp, path)
        start += n


# ------------------------------------------------------------------------------- the driver


def assemble(spool: Path, rid: str, tokens: int, timeout: float = 30.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Join a request's pieces (one per prefill chunk) into (aux [T, kH], last [T, H]); deletes them."""
    deadline = time.monotonic() + timeout
    while True:
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


def engine_kwargs(model_path: str, tp_size: int, compute_dtype: str, trust_remote_code: bool,
                  extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """sglang.Engine arguments: prefill only, nothing cached, no CUDA graphs around our hook."""
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


class SGLangBackend:
    """Starts the engine on the first batch (the layer ids must be known before CUDA init)."""

    name = "sglang"

    def __init__(self, model_path: str, *, tp_size: int = 1, storage_dtype: str = "bfloat16",
                 trust_remote_code: bool = False, engine_args: dict[str, Any] | None = None):
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
        self.facts: ModelFacts = model_facts(config)
        self.model_path = model_path
        self.tp_size = tp_size
        self.compute_dtype = {"float32": "float32", "float16": "float16"}.get(storage_dtype, "bfloat16")
        self.trust_remote_code = trust_remote_code
        self.engine_args = engine_args
        self.engine: Any = None
        self.layers: tuple[int, ...] | None = None
        self._tmp: Path | None = None
        self._env: dict[str, str | None] = {}

    def _start(self, layers: Sequence[int]) -> None:
        try:
            import sglang
        except ImportError as e:
            raise SGLangCaptureError(f"engine: sglang needs the sglang extra (pip install 'eyrie[sglang]', "
                                     f"sglang=={SGLANG_VERSION}) or the SGLang image: {e}") from None
        if min(layers) < 1:
            raise SGLangCaptureError(f"layer id {min(layers)}: SGLang captures inputs of layers 1..L-1 only")
        shm = Path("/dev/shm")
        self._tmp = Path(tempfile.mkdtemp(prefix="eyrie-capture-", dir=shm if shm.is_dir() else None))
        spool = self._tmp / "spool"
        spool.mkdir()
        plugin_path = write_plugin_dist(self._tmp / "plugin")
        env = {
            CAPTURE_ENV: json.dumps({"spool": str(spool), "layers": list(layers),
                                     "numLayers": self.facts.num_layers}),
            "PYTHONPATH": os.pathsep.join(p for p in (str(plugin_path), os.environ.get("PYTHONPATH")) if p),
        }
        if os.environ.get("SGLANG_PLUGINS"):
            env["SGLANG_PLUGINS"] = os.environ["SGLANG_PLUGINS"] + "," + PLUGIN_NAME
        for k, v in env.items():
            self._env[k] = os.environ.get(k)
            os.environ[k] = v
        sys.path.insert(0, str(plugin_path))
        self.spool = spool
        self.layers = tuple(layers)
        self.engine = sglang.Engine(**engine_kwargs(self.model_path, self.tp_size, self.compute_dtype,
                                                    self.trust_remote_code, self.engine_args))

    def hidden_states(self, batch: Sequence[Sequence[int]], layer_ids: Sequence[int]
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Prefill the batch in the engine; returns CPU tensors (aux [T, kH], last [T, H]) per sample."""
        if not batch:
            return []
        if self.engine is None:
            self._start(layer_ids)
        elif tuple(layer_ids) != self.layers:
            raise SGLangCaptureError(f"engine captures layers {self.layers}, asked for {tuple(layer_ids)}")
        tag = uuid.uuid4().hex[:12]
        rids = [f"{RID_PREFIX}{tag}-{i}" for i in range(len(batch))]
        self.engine.generate(input_ids=[[int(t) for t in x] for x in batch],
                             sampling_params=[{"max_new_tokens": 1, "temperature": 0.0} for _ in batch],
                             rid=rids)
        return [assemble(self.spool, rid, len(x)) for rid, x in zip(rids, batch, strict=True)]

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
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

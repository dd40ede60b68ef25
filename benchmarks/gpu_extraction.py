"""The one-shot GPU check of the SGLang backend (needs CUDA and `eyrie[sglang]`; no network, no download).

Runs, in this order, and stops at the first failure:
 1. imports   every SGLang name the backend uses (`sglang_imports()`), at the pinned version;
 2. shm       /dev/shm can hold the largest batch this script sends (and says what a default batch needs);
 3. llama     a random-weight Llama (L=8) in SGLang with `auto` and with explicit non-default layers:
              each aux block against HF `output_hidden_states[i]`, last against the final hidden
              state (cosine >= 0.999 per sample in bf16, rows == T);
 4. fidelity  the answers' scores from SGLang's input log-probs and top-1 in the same prefill against
              the transformers backend's LM head over the same rows (issue 15): |logprob| difference
              mean <= 0.02, top-1 verdicts equal on >= 98% of the tokens;
 5. chunked   `chunked_prefill_size: 64` on ~300-token prompts, two sharing a prefix, equal to the
              unchunked run (cosine >= 0.9999, rows == T);
 6. moe       a tiny random-weight Qwen3-MoE (`load_format: dummy`) with explicit layers: the start-up
              handshake checks its `_is_layer_to_capture` flags are the manifest's layers; rows == T;
 7. throughput an 8B-class Llama (`load_format: dummy`) on one GPU: tokens/s and MFU, against the
              reference below.
 8. hf        the transformers backend alone (no SGLang needed): the small Llama's samples in one
              packed batch (`extraction.attention` auto: one row, each sample attending to itself)
              against HF `output_hidden_states` one sample at a time (cosine >= 0.999 in bf16, rows == T).
Without SGLang installed (the lent GPU machines have none, and it cannot be carried) only `hf` runs
and the others are recorded as skipped; the transformers backend's speed is
benchmarks/gpu_extraction_hf.py's (old and new batching, the whole extraction, which side binds).
Writes one JSON document (--out, default $OUT/gpu_extraction.json or ./gpu_extraction.json) and
exits 1 on the first failed check. Without CUDA it writes `notRun` and exits 0 (the CPU import check).

Run: python benchmarks/gpu_extraction.py [--out FILE]
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from eyrie.jobs.contract.layers import resolve_layers, spool_bytes
from eyrie.jobs.extract import sglang_backend as sb

COSINE_MIN = 0.999
CHUNKED_COSINE_MIN = 0.9999
CHUNK = 64
FIDELITY_LOGPROB_MEAN = 0.02  # bf16 both sides: mean |logprob difference| per scored token
FIDELITY_TOP1_SHARE = 0.98  # share of tokens whose top-1 verdict both backends give alike (near-ties flip)
SMALL_LAYERS = 8
EXPLICIT_LAYERS = [1, 3, 6]  # not the auto 2, 4, 5 (L=8)
MOE_LAYERS = [1, 4, 6]
THROUGHPUT_BATCH_TOKENS = 16384
THROUGHPUT_SAMPLES = 128
# Bar for the 8B run. SpecForge's docs publish no tokens/s for offline hidden-state generation that
# we could find (as of this writing); record ours, and fail only far below a prefill-bound engine.
SPECFORGE_TOKENS_PER_S: float | None = None
MFU_MIN = 0.15
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "B200": 2250.0, "A100": 312.0}
# every engine argument this script passes (tests/extract/test_sglang_pin.py checks they exist at the pin)
ENGINE_ARGS_USED = ("mem_fraction_static", "chunked_prefill_size", "load_format")
ENGINE = {"mem_fraction_static": 0.6}


class CheckFailed(Exception):
    """One check's verdict; its message is what the JSON records."""


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.float().flatten(), b.float().flatten()
    return float(a @ b / (a.norm() * b.norm()).clamp_min(1e-12))


def row_cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


def llama_config(hidden: int, layers: int, intermediate: int, heads: int, kv: int, vocab: int) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                       num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                       max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=False)


def build_small_llama(path: Path) -> None:
    """Random weights saved as safetensors: SGLang and transformers load the same model."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(llama_config(1024, SMALL_LAYERS, 2816, 16, 8, 32000)).to(torch.bfloat16)
    model.save_pretrained(path)
    del model
    free_gpu()


def free_gpu() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def hf_reference(path: Path, samples: list[list[int]], layers: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """HF `output_hidden_states[i]` for each aux layer i, and the final hidden state (after the norm)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()  # transformers 5
    out = []
    with torch.no_grad():
        for ids in samples:
            hs = model(torch.tensor([ids], device="cuda"), output_hidden_states=True).hidden_states
            out.append((torch.cat([hs[i][0] for i in layers], dim=-1).cpu(), hs[-1][0].cpu()))
    del model
    free_gpu()
    return out


def run_sglang(path: Path, samples: list[list[int]], layers: list[int], batch_tokens: int = 8192,
               **engine: Any) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], float]:
    """Extract with the sglang backend (engine start excluded from the returned seconds)."""
    be = sb.SGLangBackend(str(path), storage_dtype="bfloat16", engine_args={**ENGINE, **engine},
                          max_tokens_per_batch=batch_tokens)
    try:
        be.hidden_states(samples[:1], layers)  # starts the engine (and the handshake)
        torch.cuda.synchronize()
        out: list[tuple[torch.Tensor, torch.Tensor]] = []
        t0 = time.perf_counter()
        batch: list[list[int]] = []
        for ids in samples:
            if batch and sum(map(len, batch)) + len(ids) > batch_tokens:
                out += be.hidden_states(batch, layers)
                batch = []
            batch.append(ids)
        if batch:
            out += be.hidden_states(batch, layers)
        return out, time.perf_counter() - t0
    finally:
        be.close()
        free_gpu()


def compare(name: str, got: list, want: list, layers: list[int], hidden: int, floor: float) -> dict[str, Any]:
    """Per sample and per aux block: rows == T and cosine >= floor; returns the worst figures."""
    worst: dict[str, Any] = {"auxCosineMin": 1.0, "lastCosineMin": 1.0, "rowCosineMin": 1.0}
    for i, ((ga, gl), (wa, wl)) in enumerate(zip(got, want, strict=True)):
        if ga.shape != wa.shape or gl.shape != wl.shape:
            raise CheckFailed(f"{name}: sample {i}: shapes aux {tuple(ga.shape)} last {tuple(gl.shape)}, "
                              f"want {tuple(wa.shape)} and {tuple(wl.shape)}")
        for j, layer in enumerate(layers):
            block = slice(j * hidden, (j + 1) * hidden)
            c = cosine(ga[:, block], wa[:, block])
            worst["auxCosineMin"] = min(worst["auxCosineMin"], c)
            worst["rowCosineMin"] = min(worst["rowCosineMin"], float(row_cosines(ga[:, block], wa[:, block]).min()))
            if c < floor:
                raise CheckFailed(f"{name}: sample {i}: aux layer {layer}: cosine {c:.6f} < {floor}")
        c = cosine(gl, wl)
        worst["lastCosineMin"] = min(worst["lastCosineMin"], c)
        if c < floor:
            raise CheckFailed(f"{name}: sample {i}: last hidden: cosine {c:.6f} < {floor}")
    return worst


# ------------------------------------------------------------------------------------ checks


def check_imports(_ctx: dict[str, Any]) -> dict[str, Any]:
    import sglang

    if sglang.__version__ != sb.SGLANG_VERSION:
        raise CheckFailed(f"sglang {sglang.__version__} installed, eyrie is written against {sb.SGLANG_VERSION}")
    names = sb.sglang_imports()
    for module, name in names:
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as e:
            raise CheckFailed(f"{module}.{name}: {type(e).__name__}: {e}") from None
    return {"names": [f"{m}.{n}" for m, n in names]}


def check_shm(_ctx: dict[str, Any]) -> dict[str, Any]:
    usage = shutil.disk_usage(sb.spool_folder())
    need = spool_bytes(THROUGHPUT_BATCH_TOKENS, 3, 4096, 2)
    default_8k = spool_bytes(16384, 3, 8192, 2)
    facts = {"folder": str(sb.spool_folder()), "totalMiB": usage.total >> 20, "freeMiB": usage.free >> 20,
             "needMiB": need >> 20, "defaultBatchAtHidden8192MiB": default_8k >> 20}
    if usage.free < need:
        raise CheckFailed(f"{facts['folder']} has {facts['freeMiB']} MiB free, this script's batches need "
                          f"{facts['needMiB']} MiB")
    return facts


def check_llama(ctx: dict[str, Any]) -> dict[str, Any]:
    path = ctx["base"] / "llama"
    build_small_llama(path)
    g = torch.Generator().manual_seed(1)
    samples = [torch.randint(0, 32000, (int(n),), generator=g).tolist() for n in (7, 64, 255, 513, 1000)]
    result = {}
    for label, layers in (("auto", list(resolve_layers("auto", SMALL_LAYERS).ids)), ("explicit", EXPLICIT_LAYERS)):
        want = hf_reference(path, samples, layers)
        got, _ = run_sglang(path, samples, layers)
        result[label] = {"layers": layers, **compare(f"llama {label}", got, want, layers, 1024, COSINE_MIN)}
    ctx["llama"] = path
    return result


def check_fidelity(ctx: dict[str, Any]) -> dict[str, Any]:
    """The second half of each sample scored by SGLang (input log-probs, top-1) and by the transformers
    backend (LM head over the last hidden state), one packed batch on the HF side (no padding)."""
    from eyrie.jobs.extract.hf_backend import HFBackend

    path = ctx["llama"]
    g = torch.Generator().manual_seed(3)
    samples = [torch.randint(0, 32000, (int(n),), generator=g).tolist() for n in (64, 300, 700)]
    starts = [len(x) // 2 for x in samples]
    layers = list(resolve_layers("auto", SMALL_LAYERS).ids)
    hf = HFBackend(str(path), device="cuda", storage_dtype="bfloat16")
    try:  # one packed batch: each sample's scores as if alone
        want = [f.scores for f in hf.forward(samples, layers, starts)]
    finally:
        hf.close()
        free_gpu()
    be = sb.SGLangBackend(str(path), storage_dtype="bfloat16", engine_args=ENGINE, max_tokens_per_batch=8192)
    try:
        got = [f.scores for f in be.forward(samples, layers, starts)]
    finally:
        be.close()
        free_gpu()
    diffs, same, n = [], 0, 0
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if a is None or b is None or a.logprob.shape != b.logprob.shape:
            raise CheckFailed(f"fidelity: sample {i}: scores missing or of other lengths")
        diffs.append(float(abs(a.logprob - b.logprob).mean()))
        same += int((a.top1 == b.top1).sum())
        n += a.top1.size
    facts = {"tokens": n, "logprobMeanAbsDiff": max(diffs), "top1Same": same / n}
    if max(diffs) > FIDELITY_LOGPROB_MEAN or same / n < FIDELITY_TOP1_SHARE:
        raise CheckFailed(f"fidelity: {facts} (limits: mean |diff| <= {FIDELITY_LOGPROB_MEAN}, "
                          f"top-1 alike >= {FIDELITY_TOP1_SHARE})")
    return facts


def check_chunked(ctx: dict[str, Any]) -> dict[str, Any]:
    path = ctx["llama"]
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(0, 32000, (200,), generator=g).tolist()
    samples = [prefix + torch.randint(0, 32000, (100,), generator=g).tolist(),
               prefix + torch.randint(0, 32000, (110,), generator=g).tolist(),
               torch.randint(0, 32000, (290,), generator=g).tolist()]
    layers = list(resolve_layers("auto", SMALL_LAYERS).ids)
    whole, _ = run_sglang(path, samples, layers)
    chunked, _ = run_sglang(path, samples, layers, chunked_prefill_size=CHUNK)
    worst = compare("chunked", chunked, whole, layers, 1024, CHUNKED_COSINE_MIN)
    diff = max(float((a.float() - b.float()).abs().max()) for (a, _), (b, _) in zip(chunked, whole, strict=True))
    return {"chunk": CHUNK, "tokens": [len(s) for s in samples], "maxAbsDiffAux": diff, **worst}


def check_moe(ctx: dict[str, Any]) -> dict[str, Any]:
    from transformers import Qwen3MoeConfig

    path = ctx["base"] / "qwen3moe"
    Qwen3MoeConfig(vocab_size=32000, hidden_size=512, intermediate_size=1024, moe_intermediate_size=256,
                   num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=4, head_dim=64,
                   num_experts=8, num_experts_per_tok=2, max_position_embeddings=8192).save_pretrained(path)
    g = torch.Generator().manual_seed(3)
    samples = [torch.randint(0, 32000, (int(n),), generator=g).tolist() for n in (5, 100, 400)]
    got, _ = run_sglang(path, samples, MOE_LAYERS, load_format="dummy")  # the handshake checks the flags
    for ids, (aux, last) in zip(samples, got, strict=True):
        if aux.shape != (len(ids), 3 * 512) or last.shape != (len(ids), 512):
            raise CheckFailed(f"moe: {len(ids)} tokens gave aux {tuple(aux.shape)}, last {tuple(last.shape)}")
        if not (torch.isfinite(aux.float()).all() and torch.isfinite(last.float()).all()):
            raise CheckFailed("moe: non-finite hidden states")
    return {"layers": MOE_LAYERS, "tokens": [len(s) for s in samples]}


def check_throughput(ctx: dict[str, Any]) -> dict[str, Any]:
    path = ctx["base"] / "llama8b"
    config = llama_config(4096, 32, 14336, 32, 8, 128256)  # Llama-3.1-8B's shape
    config.save_pretrained(path)
    h, inter, layers = 4096, 14336, 32
    # matmul weights per token; prefill-only runs the LM head on each sequence's last token only
    per_token = layers * (2 * h * h + 2 * h * (h // 4) + 3 * h * inter)
    g = torch.Generator().manual_seed(4)
    samples = [torch.randint(0, 128256, (int(torch.randint(512, 2049, (1,), generator=g)),),
                             generator=g).tolist() for _ in range(THROUGHPUT_SAMPLES)]
    tokens = sum(map(len, samples))
    layer_ids = list(resolve_layers("auto", layers).ids)
    _, secs = run_sglang(path, samples, layer_ids, batch_tokens=THROUGHPUT_BATCH_TOKENS, load_format="dummy")
    tps = tokens / secs
    gpu = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in gpu), None)
    mfu = tps * 2 * per_token / (peak * 1e12) if peak else None
    facts = {"gpu": gpu, "tokens": tokens, "seconds": secs, "tokensPerS": tps, "mfu": mfu,
             "peakBf16Tflops": peak, "specforgeTokensPerS": SPECFORGE_TOKENS_PER_S,
             "ratioToSpecforge": tps / SPECFORGE_TOKENS_PER_S if SPECFORGE_TOKENS_PER_S else None}
    if mfu is not None and mfu < MFU_MIN:
        raise CheckFailed(f"throughput: {tps:,.0f} tokens/s is MFU {mfu:.2f} < {MFU_MIN} on {gpu}")
    return facts


def check_hf(ctx: dict[str, Any]) -> dict[str, Any]:
    """The transformers backend's packed batch against HF's own forward of each sample alone."""
    from eyrie.jobs.extract.hf_backend import HFBackend

    path = ctx.get("llama")
    if path is None:
        path = ctx["base"] / "llama"
        build_small_llama(path)
    g = torch.Generator().manual_seed(1)
    samples = [torch.randint(0, 32000, (int(n),), generator=g).tolist() for n in (7, 64, 255, 513, 1000)]
    layers = list(resolve_layers("auto", SMALL_LAYERS).ids)
    want = hf_reference(path, samples, layers)
    hf = HFBackend(str(path), device="cuda", storage_dtype="bfloat16")
    try:
        got = [(f.aux.cpu(), f.last.cpu()) for f in hf.forward(samples, layers)]
        packs = hf.packs
    finally:
        hf.close()
        free_gpu()
    return {"packed": packs, "tokens": [len(s) for s in samples],
            **compare("hf", got, want, layers, 1024, COSINE_MIN)}


SGLANG_CHECKS = ("imports", "shm", "llama", "fidelity", "chunked", "moe", "throughput")
CHECKS: list[tuple[str, Callable[[dict[str, Any]], dict[str, Any]]]] = [
    ("imports", check_imports), ("shm", check_shm), ("llama", check_llama), ("fidelity", check_fidelity),
    ("chunked", check_chunked),
    ("moe", check_moe), ("throughput", check_throughput), ("hf", check_hf)]


def default_out() -> Path:
    return Path(os.environ["OUT"]) / "gpu_extraction.json" if os.environ.get("OUT") else Path("gpu_extraction.json")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    out = args.out or default_out()
    doc: dict[str, Any] = {"sglangPin": sb.SGLANG_VERSION, "checks": [], "failed": None}
    if not torch.cuda.is_available():
        doc["notRun"] = "no CUDA device"
        out.write_text(json.dumps(doc, indent=1))
        print("gpu_extraction: no CUDA device here; not run (needs a GPU and eyrie[sglang])")
        print("RESULT gpu_extraction not_run=no_cuda_device")
        return 0
    ctx: dict[str, Any] = {"base": Path(tempfile.mkdtemp(prefix="eyrie-gpu-check-"))}
    has_sglang = importlib.util.find_spec("sglang") is not None
    doc["skipped"] = [] if has_sglang else [{"name": n, "why": "sglang is not installed"} for n in SGLANG_CHECKS]
    try:
        for name, check in CHECKS:
            if not has_sglang and name in SGLANG_CHECKS:
                continue
            t0 = time.perf_counter()
            doc["running"] = name
            out.write_text(json.dumps(doc, indent=1, default=str))  # if SGLang kills this process, it shows where
            try:
                facts = check(ctx)
            except Exception as e:
                doc["checks"].append({"name": name, "ok": False, "seconds": time.perf_counter() - t0,
                                      "error": f"{type(e).__name__}: {e}",
                                      "traceback": traceback.format_exc()[-3000:]})
                doc["failed"] = name
                break
            doc["checks"].append({"name": name, "ok": True, "seconds": time.perf_counter() - t0, **facts})
        doc.pop("running", None)
    finally:
        shutil.rmtree(ctx["base"], ignore_errors=True)
        out.write_text(json.dumps(doc, indent=1, default=str))
    print(json.dumps(doc, indent=1, default=str))
    print(f"RESULT gpu_extraction {'FAILED at ' + doc['failed'] if doc['failed'] else 'all checks passed'}")
    return 1 if doc["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())

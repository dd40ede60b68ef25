"""GPU check of the two extraction backends on the same samples (needs CUDA and `eyrie[sglang]`).

Builds a model with a real architecture (Llama, ~1.2B parameters) and random weights from a config
(no download), runs the transformers backend and the SGLang backend in bf16 over the same samples,
and reports:
- the relative error between them, ||sglang - hf|| / ||hf|| per sample, for aux and last hidden
  states (target: < 1e-2 in bf16);
- each backend's tokens/s against the prefill ceiling: the measured bf16 matmul rate divided by
  2 x parameters FLOPs per token.

Run: python benchmarks/gpu_extraction.py [--samples N] [--tp N]. Without CUDA it says so and exits.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from eyrie.jobs.extract.layers import resolve_layers

TARGET_REL_ERR = 1e-2


def matmul_tflops(n: int = 8192, iters: int = 20) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * iters / (time.perf_counter() - t0) / 1e12


def build_model(path: Path) -> int:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    # per-token matmul weights: neither the embedding lookup nor the LM head runs for every position
    params = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)
    model.save_pretrained(path)
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return params


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def run(backend, samples: list[list[int]], layers: list[int], batch: int) -> tuple[list, float]:
    backend.hidden_states(samples[:1], layers)  # warm-up (and SGLang's engine start)
    torch.cuda.synchronize()
    out = []
    t0 = time.perf_counter()
    for i in range(0, len(samples), batch):
        out += [(a.cpu(), b.cpu()) for a, b in backend.hidden_states(samples[i:i + batch], layers)]
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("gpu_extraction: no CUDA device here; not run (needs a GPU and eyrie[sglang])")
        print("RESULT gpu_extraction not_run=no_cuda_device")
        return
    from eyrie.jobs.extract.hf_backend import HFBackend
    from eyrie.jobs.extract.sglang_backend import SGLangBackend

    base = Path(tempfile.mkdtemp(prefix="eyrie-gpu-bench-"))
    try:
        params = build_model(base / "model")
        tflops = matmul_tflops()
        ceiling = tflops * 1e12 / (2 * params)
        g = torch.Generator().manual_seed(0)
        samples = [torch.randint(0, 32000, (int(torch.randint(256, 2049, (1,), generator=g)),),
                                 generator=g).tolist() for _ in range(args.samples)]
        tokens = sum(map(len, samples))
        layers = list(resolve_layers("auto", 16).ids)

        hf = HFBackend(str(base / "model"), device="cuda", storage_dtype="bfloat16")
        hf_out, hf_s = run(hf, samples, layers, args.batch)
        hf.close()
        del hf
        gc.collect()
        torch.cuda.empty_cache()

        sg = SGLangBackend(str(base / "model"), tp_size=args.tp, storage_dtype="bfloat16",
                           engine_args={"mem_fraction_static": 0.7})
        try:
            sg_out, sg_s = run(sg, samples, layers, args.batch)
        finally:
            sg.close()

        aux_err = max(rel(s[0], h[0]) for s, h in zip(sg_out, hf_out, strict=True))
        last_err = max(rel(s[1], h[1]) for s, h in zip(sg_out, hf_out, strict=True))
        print(f"model: random Llama, {params / 1e9:.2f}B per-token parameters, layers {layers}; "
              f"{len(samples)} samples, {tokens} tokens; bf16 matmul {tflops:.0f} TFLOP/s -> prefill "
              f"ceiling {ceiling:,.0f} tokens/s")
        print(f"max relative error sglang vs transformers: aux {aux_err:.2e}, last {last_err:.2e} "
              f"(target < {TARGET_REL_ERR:.0e}) -> {'OK' if max(aux_err, last_err) < TARGET_REL_ERR else 'FAIL'}")
        for name, secs in (("transformers", hf_s), ("sglang", sg_s)):
            tps = tokens / secs
            print(f"{name:>12}: {tps:10,.0f} tokens/s = {tps / ceiling:.2f} of the prefill ceiling")
    finally:
        shutil.rmtree(base, ignore_errors=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

"""The one-shot GPU check of `eyrie evaluate` (issue 34 item 3; prepared, not yet run on a GPU).

Needs CUDA and SpecForge's Triton kernels; no network. In this order, stopping at the first failure:
 1. kernel   SpecForge's `core.loss.LogSoftmaxLoss` (Triton) against the torch formula eyrie uses on
             a CPU (`drafter._TorchLogSoftmaxLoss`), forward and gradient, on random [B, T, V] logits
             (fp32: |diff| <= 1e-4 relative; bf16 logits: <= 1e-2);
 2. evaluate `eyrie evaluate OUTPUT [--against ...] --device cuda` on outputs given (hidden states
             extracted by SGLang from a real small target: `eyrie run` with extraction.engine sglang on
             the lent machine), SpecForge's kernel and torch.compile untouched; the same evaluation
             with --device cpu on the same outputs for comparison of the accepted lengths
             (|difference| within the two intervals).
Writes one JSON document (--out, default $OUT/gpu_acceptance.json) and exits 1 on a failed check;
without CUDA it writes `notRun` and exits 0.

Run: python benchmarks/gpu_acceptance.py [--out FILE] [--output OUTPUT --against OTHER ...]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def kernel_check() -> dict:
    import torch
    from specforge.core.loss import LogSoftmaxLoss

    from eyrie.jobs.evaluate.drafter import _TorchLogSoftmaxLoss

    out = {}
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 1e-2)):
        g = torch.Generator(device="cuda").manual_seed(0)
        logits = torch.randn(2, 257, 32000, device="cuda", generator=g).to(dtype)
        target = torch.softmax(torch.randn(2, 257, 32000, device="cuda", generator=g), -1)
        mask = (torch.rand(2, 257, 1, device="cuda", generator=g) > 0.3).float()
        a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        la = LogSoftmaxLoss.apply(a, target, mask)
        la.backward()
        with torch.compiler.set_stance("force_eager"):
            lb = _TorchLogSoftmaxLoss.apply(b, target, mask)
        lb.backward()
        rel = abs(float(la) - float(lb)) / max(abs(float(lb)), 1e-12)
        grad = float((a.grad.float() - b.grad.float()).abs().max() / b.grad.float().abs().max().clamp(min=1e-30))
        out[str(dtype)] = {"kernel": float(la), "torch": float(lb), "lossRel": rel, "gradRelMax": grad,
                           "ok": rel <= tol and grad <= tol * 10}
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_acceptance.json"))
    ap.add_argument("--output")
    ap.add_argument("--against", nargs="*", default=[])
    args = ap.parse_args()
    import torch

    doc: dict = {}
    ok = True
    if not torch.cuda.is_available():
        doc["notRun"] = "no CUDA device"
    else:
        doc["kernel"] = kernel_check()
        ok = all(v["ok"] for v in doc["kernel"].values())
        if ok and args.output:
            from eyrie.jobs.evaluate.drafter import TrainSettings
            from eyrie.jobs.evaluate.run import Request, run_evaluation

            for device, dtype in (("cuda", "bfloat16"), ("cpu", "float32")):
                r = run_evaluation(Request(args.output, tuple(args.against), None,
                                           TrainSettings(dtype=dtype), device=device))
                doc[f"evaluate-{device}"] = {d["name"]: d["acceptance"]["acceptedLength"] for d in r.doc["drafters"]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

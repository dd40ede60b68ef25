"""The one-shot GPU check of `eyrie evaluate` (issue 34 item 3; prepared, not yet run on a GPU).

One script, no input, no network: it makes its own outputs. In this order, stopping at the first failure:
 1. kernel   SpecForge's `core.loss.LogSoftmaxLoss` (Triton) against the torch formula eyrie uses on a
             CPU (`drafter.TorchLogSoftmaxLoss`), forward and gradient, on random [B, T, V] logits
             (fp32: relative difference <= 1e-4; bf16 logits: <= 1e-2);
 2. outputs  `eyrie run` of examples/quickstart.yaml and examples/quickstart-impostor.yaml (the simulator
             serving builtin:tiny-chat's and builtin:tiny-chat-seed1's answers, both extracted by
             builtin:tiny-chat) on a copy of examples/, with extraction on the GPU: SGLang
             (`extraction.engine: sglang`) when it imports, else the transformers backend on cuda;
             which one is recorded;
 3. evaluate `eyrie evaluate QUICKSTART --against IMPOSTOR --control --steps S` on CUDA (SpecForge's Triton
             loss and torch.compile untouched, bfloat16) and the same on the CPU (eyrie's torch loss,
             float32); each must rank the drafters as tests/test_evaluate_drafters.py does (own answers,
             then the impostor, the control last), and each drafter's accepted lengths on the two
             devices must agree within their two 95% intervals (|a - b| <= half-width a + half-width b).
Writes one JSON document (--out, default $OUT/gpu_acceptance.json) and exits 1 on a failed check;
without CUDA it writes `notRun` and exits 0. About 5 minutes on a 16-core machine with one GPU.

Run: python benchmarks/gpu_acceptance.py [--out FILE] [--steps S] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("reference", "against", "control")


def kernel_check() -> dict[str, Any]:
    import torch
    from specforge.core.loss import LogSoftmaxLoss

    from eyrie.jobs.evaluate.drafter import TorchLogSoftmaxLoss

    out: dict[str, Any] = {}
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 1e-2)):
        g = torch.Generator(device="cuda").manual_seed(0)
        logits = torch.randn(2, 257, 32000, device="cuda", generator=g).to(dtype)
        target = torch.softmax(torch.randn(2, 257, 32000, device="cuda", generator=g), -1)
        mask = (torch.rand(2, 257, 1, device="cuda", generator=g) > 0.3).float()
        a, b = logits.clone().requires_grad_(), logits.clone().requires_grad_()
        la = LogSoftmaxLoss.apply(a, target, mask)
        la.backward()
        with torch.compiler.set_stance("force_eager"):
            lb = TorchLogSoftmaxLoss.apply(b, target, mask)
        lb.backward()
        rel = abs(float(la) - float(lb)) / max(abs(float(lb)), 1e-12)
        grad = float((a.grad.float() - b.grad.float()).abs().max() / b.grad.float().abs().max().clamp(min=1e-30))
        out[str(dtype)] = {"kernel": float(la), "torch": float(lb), "lossRel": rel, "gradRelMax": grad,
                           "ok": rel <= tol and grad <= tol * 10}
    return out


def engine() -> str:
    try:
        import sglang  # noqa: F401
    except Exception:  # any failure to import means: not usable here
        return "transformers"
    return "sglang"


def make_outputs(base: Path, extraction: dict[str, Any]) -> dict[str, Any]:
    """The two examples run by `eyrie run` on a copy of examples/, extraction as given."""
    examples = shutil.copytree(ROOT / "examples", base / "examples", ignore=shutil.ignore_patterns("eyrie-out"))
    got: dict[str, Any] = {}
    for name in ("quickstart", "quickstart-impostor"):
        path = examples / f"{name}.yaml"
        doc = yaml.safe_load(path.read_text())
        doc["spec"]["extraction"].update(extraction)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(path), "--no-progress"], cwd=base,
                           capture_output=True, text=True, timeout=1200)
        got[name] = {"rc": r.returncode, "seconds": round(time.perf_counter() - t0, 1),
                     "uri": str(examples / "eyrie-out" / name)}
        if r.returncode != 0:
            got[name]["stderr"] = r.stderr[-3000:]
            raise RuntimeError(f"eyrie run {name} failed: {r.stderr[-1500:]}")
    return got


def evaluate(ref: str, impostor: str, steps: int, device: str) -> dict[str, Any]:
    from eyrie.jobs.evaluate.drafter import TrainSettings
    from eyrie.jobs.evaluate.run import Request, run_evaluation

    cuda = device == "cuda"
    t0 = time.perf_counter()
    doc = run_evaluation(Request(ref, (impostor,), None, TrainSettings(
        steps=steps, dtype="bfloat16" if cuda else "float32", threads=None if cuda else 1), control=True,
        device=device)).doc
    lengths = {d["kind"]: d["acceptance"]["acceptedLength"] for d in doc["drafters"]}
    return {"seconds": round(time.perf_counter() - t0, 1), "acceptedLength": lengths,
            "ranked": lengths["reference"]["value"] > lengths["against"]["value"] > lengths["control"]["value"],
            "verdict": doc["verdict"]}


def agree(a: dict[str, Any], b: dict[str, Any]) -> bool:
    half = (a["high"] - a["low"]) / 2 + (b["high"] - b["low"]) / 2
    return abs(a["value"] - b["value"]) <= half


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_acceptance.json"))
    ap.add_argument("--steps", type=int, default=100, help="training steps per drafter (the test's budget)")
    ap.add_argument("--keep", help="make the outputs in this folder and keep them (default: a temporary one)")
    args = ap.parse_args()
    import torch

    doc: dict[str, Any] = {"steps": args.steps}
    ok = True
    if not torch.cuda.is_available():
        doc["notRun"] = "no CUDA device"
    else:
        doc["device"] = torch.cuda.get_device_name(0)
        base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpu-acceptance-"))
        base.mkdir(parents=True, exist_ok=True)
        try:
            doc["kernel"] = kernel_check()
            ok = all(v["ok"] for v in doc["kernel"].values())
            if ok:
                eng = engine()
                extraction = {"engine": eng} if eng == "sglang" else {"engine": "transformers", "device": "cuda"}
                doc["extraction"] = extraction
                outs = make_outputs(base, extraction)
                doc["outputs"] = outs
                ref, imp = outs["quickstart"]["uri"], outs["quickstart-impostor"]["uri"]
                for device in ("cuda", "cpu"):
                    (Path(ref) / "evaluation.json").unlink(missing_ok=True)  # each device trains its own
                    doc[f"evaluate-{device}"] = evaluate(ref, imp, args.steps, device)
                cuda, cpu = doc["evaluate-cuda"], doc["evaluate-cpu"]
                doc["agree"] = {k: agree(cuda["acceptedLength"][k], cpu["acceptedLength"][k]) for k in KINDS}
                ok = cuda["ranked"] and cpu["ranked"] and all(doc["agree"].values())
        except Exception as e:  # the document says what failed, the exit code that it did
            doc["error"] = f"{type(e).__name__}: {e}"
            doc["traceback"] = traceback.format_exc()[-4000:]
            ok = False
        finally:
            if not args.keep:
                shutil.rmtree(base, ignore_errors=True)
    doc["ok"] = ok
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""What fidelity scoring tells apart: `builtin:tiny-chat` (a tiny chat model trained on a small
corpus, jobs/extract/tiny.py) answers prompts of its training distribution greedily, and so does
each impostor the docs name: the same weights quantized to int8 and to fp8 (e4m3, per-channel
scales), the same recipe with another seed, and the model itself sent another family's chat template
(DeepSeek-V3's). Every answer is rebuilt after the prompt the model's own template renders and scored
by eyrie's extraction (transformers backend, float32: the path `eyrie run` takes).

Figures per kind: top-1 agreement (token-weighted, and per sample min-max), mean NLL and its ratio to
the model's own, how often the answers are the model's own. Targets: own answers >= 0.99; another
seed and a wrong template at least 0.05 below them. The quantized rows have no target: they are the
finding (a weight-only quantization barely moves the argmax, so top-1 agreement does not show it).
Builds the models once into the cache (about a minute of CPU each, single-threaded).

    python benchmarks/fidelity_impostors.py [--prompts 24]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from fidelity_fixture import KINDS, agreement, scored  # noqa: E402

TARGET_OWN = 0.99
TARGET_GAP = 0.05


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=24)
    args = ap.parse_args()
    t0, c0 = time.monotonic(), time.process_time()
    with tempfile.TemporaryDirectory() as tmp:
        target, by = scored(args.prompts, f"file://{tmp}/out")
    own, own_nll = agreement([r for _, r in by["native"]])
    print(f"fidelity_impostors: {args.prompts} prompts of builtin:tiny-chat's training distribution "
          f"({target.name}), greedy answers, scored by the transformers backend "
          f"({time.monotonic() - t0:.0f} s, {time.process_time() - c0:.0f} s CPU incl. any model build)")
    figures = {}
    for kind in KINDS:
        rows = [r for _, r in by[kind]]
        top1, nll = agreement(rows)
        same = sum(a.answer == o.answer for (a, _), (o, _) in zip(by[kind], by["native"], strict=True)) / len(rows)
        per = [r["top1_agreement"] for r in rows]
        figures[kind] = top1
        print(f"  {kind:15s} top-1 {top1:.3f} (per sample {min(per):.3f}-{max(per):.3f})  mean NLL {nll:.3f} "
              f"({nll / own_nll:.2f}x own)  answers identical to the model's own {same:.0%}")
    ok = own >= TARGET_OWN and all(own - figures[k] >= TARGET_GAP for k in ("seed1", "wrong_template"))
    print(f"RESULT fidelity_impostors own={own:.3f} int8={figures['int8']:.3f} fp8={figures['fp8']:.3f} "
          f"seed1={figures['seed1']:.3f} wrong_template={figures['wrong_template']:.3f} "
          f"target=own>={TARGET_OWN},seed1/wrong_template<=own-{TARGET_GAP} {'PASS' if ok else 'MISS'}")


if __name__ == "__main__":
    main()

"""Fidelity on the quickstart, as a user runs it: `eyrie run examples/quickstart.yaml` (the simulated
provider serving `builtin:tiny-chat`'s own greedy answers, calls and all: `answerModelCalls: model`,
extraction scoring them with the same model) and `eyrie run examples/quickstart-impostor.yaml` (the
provider serving `builtin:tiny-chat-seed1`, another model of the same recipe, under the same name),
each a process of its own on local Ray with the examples' defaults, in a copy of examples/.

Figures: top-1 agreement over all answer tokens, over the text the model wrote (reasoning and
content: what the floor judges) and per segment (reasoning, content, tool calls), mean NLL, the
providers under the floor, how many samples' prompt and completion token counts are exact, and each
run's wall time (the shipped models are checked against their hashes first, outside the timed runs,
and that time printed). Targets: the quickstart's text >= 0.95 (the impostor example's floor) and
every segment >= 0.95; the impostor's text under that floor, flagged, with every token count still
exact.

    python benchmarks/quickstart_fidelity.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FLOOR = 0.95  # examples/quickstart-impostor.yaml's extraction.fidelity.minTop1Agreement


def run(examples: Path, name: str) -> tuple[dict, float]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(examples / f"{name}.yaml"), "--no-progress"],
                       cwd=examples.parent, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        sys.exit(f"eyrie run {name}.yaml exited {r.returncode}:\n{r.stderr[-3000:]}")
    return json.loads((examples / "eyrie-out" / name / "manifest.json").read_text()), wall


def show(name: str, manifest: dict, wall: float) -> dict:
    fid, rec = manifest["fidelity"], manifest["reconstruction"]["samples"]
    seg = {k: v["top1Agreement"] for k, v in fid["overall"]["segments"].items()}
    text = fid["overall"]["writtenTop1Agreement"]
    kept = rec["kept"]
    exact = (rec["promptTokenGap"]["exact"] == kept and rec["completionTokenGap"]["exact"] == kept)
    print(f"  {name:20s} {wall:5.0f} s  top-1 {fid['overall']['top1Agreement']:.3f}, text {text:.3f} "
          f"({', '.join(f'{k} {v:.3f}' for k, v in seg.items())})  mean NLL {fid['overall']['meanNLL']:.3f}  "
          f"below floor: {', '.join(fid['belowFloor']) or 'none'}  samples {kept}, token counts exact: "
          f"prompt {rec['promptTokenGap']['exact']}, completion {rec['completionTokenGap']['exact']}")
    return {"top1": fid["overall"]["top1Agreement"], "text": text, "seg": seg, "below": fid["belowFloor"],
            "exact": exact}


def main() -> None:
    from eyrie.jobs.extract import tiny

    t0 = time.monotonic()
    for name in ("builtin:tiny-chat", "builtin:tiny-chat-seed1"):
        tiny.model_folder(name)
    checked = time.monotonic() - t0
    print(f"quickstart_fidelity: eyrie run (local Ray, the examples' defaults) on a copy of examples/; "
          f"the shipped models checked in {checked:.1f} s")
    with tempfile.TemporaryDirectory() as tmp:
        examples = shutil.copytree(ROOT / "examples", Path(tmp) / "examples",
                                   ignore=shutil.ignore_patterns("eyrie-out"))
        own = show("quickstart", *run(examples, "quickstart"))
        imp = show("quickstart-impostor", *run(examples, "quickstart-impostor"))
    ok = (own["text"] >= FLOOR and all(v >= FLOOR for v in own["seg"].values()) and own["exact"]
          and imp["text"] < FLOOR and imp["below"] and imp["exact"])
    print(f"RESULT quickstart_fidelity own={own['top1']:.3f} own_text={own['text']:.3f} "
          f"own_segments={'/'.join(f'{v:.3f}' for v in own['seg'].values())} impostor={imp['top1']:.3f} "
          f"impostor_text={imp['text']:.3f} impostor_segments={'/'.join(f'{v:.3f}' for v in imp['seg'].values())} "
          f"target=own_text_and_segments>={FLOOR},impostor_text<{FLOOR},counts_exact {'PASS' if ok else 'MISS'}")


if __name__ == "__main__":
    main()

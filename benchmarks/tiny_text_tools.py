"""What `builtin:tiny-chat` does when its functions move from the API's `tools` into the prompt, as
`eyrie audit` measures it: 400 prompts of the model's own training distribution
(`jobs/extract/tiny.py`'s `corpus(400, seed=7, text_share=0)`: every declaration in the row's
`tools`, which the audit's text side writes into the system prompt as text mode does), `eyrie audit --samples 60` of
them sent both ways to the simulated provider serving the model's greedy answers, calls and all
(`answerModelCalls: model`, temperature 0). Prints the audit's rows (call rates, validity, formats,
each with its 95% interval). The recipe's docstring says what the figures should look like; docs/
operating.md ("Does it matter for the drafter?") quotes them.

    python benchmarks/tiny_text_tools.py [--samples 60] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

PROMPTS, PROMPT_SEED = 400, 7


def write_inputs(folder: Path, n: int = PROMPTS, seed: int = PROMPT_SEED) -> Path:
    """The prompts (OpenAI rows, tools structured: the audit renders them as text for its text side)
    and the spec; returns the spec's path."""
    from eyrie.jobs.extract import tiny

    rows = [{"messages": c["messages"], **({"tools": c["tools"]} if c["tools"] else {})}
            for c in tiny.corpus(n, seed=seed, text_share=0)]
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration", "metadata": {"name": "tiny-text-tools"},
            "spec": {"sources": [{"name": "tiny", "uri": "prompts.jsonl", "format": "openai"}],
                     "target": {"model": "eyrie/tiny-chat", "tokenizer": "builtin:tiny-chat"},
                     "api": {"baseUrl": "simulated", "maxConcurrency": 4, "requestTimeoutSeconds": 300,
                             "sampling": {"temperature": 0, "maxTokens": 1024, "reasoning": {"effort": "high"}},
                             "simulator": {"answerModel": "builtin:tiny-chat", "answerModelCalls": "model"}},
                     "tools": {"mode": "audit", "gate": {"enabled": False}},
                     "budget": {"maxUSD": "5.00", "pricing": {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}},
                     "generation": {"shards": 2, "ray": {"mode": "Local", "workers": 1}},
                     "extraction": {"enabled": False},
                     "output": {"uri": "out"}}}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--samples", type=int, default=60)
    ap.add_argument("--keep", type=Path,
                    help="write the prompts, the spec and the audit here (default: a temporary folder)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tiny-text-tools-") as tmp:
        folder = a.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        spec = write_inputs(folder)
        r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "audit", str(spec), "--samples", str(a.samples)],
                           cwd=folder, text=True)
        if r.returncode != 0:
            return r.returncode
        modes = json.loads((folder / "out" / "audit.json").read_text())["figures"]["modes"]
        calls = {m: modes[m]["callRate"]["value"] for m in ("text", "structured")}
        invalid = {m: modes[m]["invalidRate"]["value"] or 0.0 for m in ("text", "structured")}
        # what a real model does with the declarations in the prompt: fewer calls, most of them still valid
        ok = calls["text"] < calls["structured"] and 0 < invalid["text"] < 0.5
        print(f"RESULT tiny_text_tools text_calls={calls['text']:.2f} structured_calls={calls['structured']:.2f} "
              f"text_invalid={invalid['text']:.2f} structured_invalid={invalid['structured']:.2f} "
              f"target=text_calls<structured_calls,0<text_invalid<0.5 {'PASS' if ok else 'MISS'}")
        return 0


if __name__ == "__main__":
    sys.exit(main())

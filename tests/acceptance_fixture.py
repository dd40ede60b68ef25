"""The acceptance experiment's datasets, which tests/evaluate/test_evaluate_drafters.py and
`benchmarks/acceptance.py --experiment` share: tool-declaring prompts of builtin:tiny-chat's training
distribution answered four ways by `eyrie run` (docs/operating.md, "The four-dataset experiment").

- `structured`: tools in the API's `tools`, the target's (builtin:tiny-chat's) greedy answers;
- `text`: the same prompts with the functions described in the system prompt (`tools.mode: text`);
- `dataset`: the rows' own answers, not regenerated (`generation.answers: dataset`);
- `impostor`: builtin:tiny-chat-seed1 answering under the target's name (examples/quickstart-impostor.yaml's
  provider), tools structured.

Every answer is kept as the model wrote it (`onInvalidCall: keep`: a dataset bought without eyrie's
checks), every output extracted by the target itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

SEED = 34  # the prompts' draw (issue 34); the recipe trains on seed 0's
DATASETS = ("structured", "text", "dataset", "impostor")


def rows(n: int, unique: bool = False) -> list[dict[str, Any]]:
    """`n` tool-declaring conversations of builtin:tiny-chat's training distribution as OpenAI rows: the
    prompt, its tools, and the recipe's own answer (what `generation.answers: dataset` takes). `unique`:
    no prompt twice (the distribution repeats some: a held-out prompt's twin is left out of training)."""
    from eyrie.jobs.extract import tiny

    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    draw = 0
    while len(out) < n:
        for c in tiny.corpus(4 * n, seed=SEED + draw, text_share=0):
            key = json.dumps([c["messages"], c["tools"]], sort_keys=True)
            if not c["tools"] or len(out) >= n or (unique and key in seen):
                continue
            seen.add(key)
            answer = tiny.assistant_message(c)
            calls = [{"id": f"call_{len(out)}_{i}", **tc} for i, tc in enumerate(answer.pop("tool_calls"))]
            if calls:
                answer["tool_calls"] = calls
            out.append({"messages": [*c["messages"], answer], "tools": c["tools"]})
        draw += 1000
    return out


def spec(name: str, prompts: str) -> dict[str, Any]:
    """The spec of one of the datasets (`DATASETS`), everything else as the quickstart's."""
    model = "builtin:tiny-chat-seed1" if name == "impostor" else "builtin:tiny-chat"
    body = {"sources": [{"name": "tiny", "uri": prompts, "format": "openai"}],
            "target": {"model": "eyrie/tiny-chat", "tokenizer": "builtin:tiny-chat"},
            "api": {"baseUrl": "simulated", "maxConcurrency": 8, "requestTimeoutSeconds": 600,
                    "sampling": {"temperature": 0, "maxTokens": 1024, "reasoning": {"effort": "high"}},
                    "simulator": {"answerModel": model, "answerModelCalls": "model"}},
            "tools": {"mode": "text" if name == "text" else "structured", "onInvalidCall": "keep",
                      "gate": {"enabled": False}},
            "budget": {"maxUSD": "20.00", "pricing": {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}},
            "generation": {"shards": 4, "ray": {"mode": "Local", "workers": 2},
                           **({"answers": "dataset"} if name == "dataset" else {})},
            "extraction": {"enabled": True, "engine": "transformers", "model": "builtin:tiny-chat",
                           "dtype": "bfloat16"},
            "output": {"uri": name}}
    return {"apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration", "metadata": {"name": f"acceptance-{name}"},
            "spec": body}


def write_prompts(work: Path, n: int, unique: bool = False) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    path = work / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows(n, unique)))
    return path


def make(work: Path, name: str) -> Path:
    """`eyrie run` of dataset `name` under `work` (its prompts written there first by `write_prompts`),
    as a process; the output folder. An output already done is kept (`eyrie run` resumes it, sending nothing)."""
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec(name, "prompts.jsonl"), sort_keys=False))
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(path), "--no-progress"], cwd=work,
                       capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"eyrie run {path} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return work / name

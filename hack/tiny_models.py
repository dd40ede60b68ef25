#!/usr/bin/env python3
"""Rebuild the builtin models eyrie ships (jobs/extract/builtin/): `python hack/tiny_models.py`.

Trains `builtin:tiny-chat` and `builtin:tiny-chat-seed1` with `jobs/extract/tiny.py`'s `build` (the
recipe; bump its VERSION when you change it), replaces their shipped files, derives the int8 and fp8
impostors from the new tiny-chat to record their weights' digests, and rewrites MANIFEST.json (every
file's sha256, and the platform they were trained on). About two minutes of CPU per model. Commit the
result: the models are then the same on every machine.

`--check [--only NAME]` trains into a temporary folder instead and prints, as JSON, how the rebuild
compares with the shipped files (byte for byte, and per weight tensor by how much), writing nothing:
training is deterministic on one machine, but 1,600 steps carry a last-bit difference of another CPU's
(or another instruction set's) kernels into the weights, so elsewhere it measures another model of
the same recipe (tests/extract/test_builtin_models.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from eyrie.jobs import shipped as registry  # the shipped files (names, MANIFEST.json)
from eyrie.jobs.extract import tiny


def train(name: str, folder: Path) -> Path:
    return tiny.build(folder, seed=registry.TRAINED[name])


def held_out_nll(folder: Path, n: int = 300) -> float:
    """Mean NLL per answer token of `n` conversations the recipe draws but never trains on (seed 12345):
    what any model of the same recipe reaches, whatever the bits of its weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    total = tokens = 0.0
    with torch.inference_mode():
        for ids, start in tiny._examples(tok, tiny.corpus(n, seed=12345)):
            x = torch.tensor([ids])
            labels = x.clone()
            labels[0, :start] = -100
            total += float(model(input_ids=x, labels=labels).loss) * (len(ids) - start)
            tokens += len(ids) - start
    return total / tokens


def compare(shipped: Path, rebuilt: Path) -> dict[str, Any]:
    """Files byte for byte, the weights tensor by tensor (how many are equal, and the largest
    difference relative to its tensor's largest weight), and what the two models do (held-out NLL)."""
    from safetensors.torch import load_file

    files = sorted(p.name for p in shipped.iterdir() if p.is_file())
    a, b = load_file(shipped / registry.WEIGHTS), load_file(rebuilt / registry.WEIGHTS)
    worst = {"tensor": None, "maxAbsDiff": 0.0, "relative": 0.0}
    equal = 0
    for k in sorted(a):
        if k not in b or a[k].shape != b[k].shape:
            return {"identicalFiles": [], "differentFiles": files, "weights": {"sameNamesAndShapes": False}}
        diff = float((a[k] - b[k]).abs().max())
        equal += diff == 0
        rel = diff / max(float(a[k].abs().max()), 1e-30)
        if rel > worst["relative"]:
            worst = {"tensor": k, "maxAbsDiff": diff, "relative": rel}
    same = [f for f in files
            if (rebuilt / f).is_file() and registry.file_sha256(shipped / f) == registry.file_sha256(rebuilt / f)]
    return {"identicalFiles": same, "differentFiles": [f for f in files if f not in same],
            "weights": {"sameNamesAndShapes": set(a) == set(b), "tensors": len(a), "equalTensors": equal,
                        "worst": worst},
            "heldOutNLL": {"shipped": held_out_nll(shipped), "rebuilt": held_out_nll(rebuilt)}}


def rebuild_all() -> dict[str, Any]:
    """Train both, replace the shipped folders, derive the impostors, write MANIFEST.json."""
    from safetensors.torch import load_file

    models: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="tiny-models-") as tmp:
        for name in registry.TRAINED:
            folder = name.removeprefix("builtin:")
            built = train(name, Path(tmp) / folder)
            dest = registry.SHIPPED / folder
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(built, dest)
            for f in dest.iterdir():
                f.chmod(0o644)  # safetensors writes 0600; package data is read by everyone
            models[name] = {"folder": folder, "seed": registry.TRAINED[name],
                            "files": {f.name: registry.file_sha256(f) for f in sorted(dest.iterdir())}}
        base = registry.SHIPPED / models[registry.NAMES[0]]["folder"]
        for name, kind in registry.DERIVED.items():
            derived = tiny.derive(base, Path(tmp) / kind, kind)
            models[name] = {"from": registry.NAMES[0], "quantize": kind,
                            "weightsSha256": tiny.weights_sha256(load_file(derived / registry.WEIGHTS))}
    doc = {"version": registry.VERSION,
           "madeBy": "python hack/tiny_models.py: jobs/extract/tiny.py's build(folder, seed) for each trained "
                     "model; quantize(tiny-chat, kind) for each derived one",
           "platform": tiny.build_platform(), "models": models}
    (registry.SHIPPED / "MANIFEST.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="hack/tiny_models.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="rebuild into a temporary folder and compare; write nothing")
    p.add_argument("--only", choices=tuple(registry.TRAINED), help="with --check: this model only")
    a = p.parse_args(argv)
    if not a.check:
        doc = rebuild_all()
        print(json.dumps({k: v.get("files", v.get("weightsSha256")) for k, v in doc["models"].items()}, indent=2))
        return 0
    report: dict[str, Any] = {"platform": tiny.build_platform(), "shippedOn": registry.manifest()["platform"],
                              "models": {}}
    with tempfile.TemporaryDirectory(prefix="tiny-models-") as tmp:
        for name in [a.only] if a.only else registry.TRAINED:
            rebuilt = train(name, Path(tmp) / name.removeprefix("builtin:"))
            report["models"][name] = compare(tiny.model_folder(name), rebuilt)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The fidelity fixture the tests and `benchmarks/fidelity_impostors.py` share: prompts of the
training distribution of `builtin:tiny-chat` (jobs/extract/tiny.py), each answered greedily by the
model itself and by every impostor the docs name, rebuilt as samples the way eyrie rebuilds them
(the prompt as the model's own template renders it, then the answer as returned).

Kinds: `native` (the model), `int8` and `fp8` (its weights quantized), `seed1` (the same recipe
with another seed), `wrong_template` (the model itself, sent the prompt as another family's chat
format renders it: DeepSeek-V3's, eyrie's named format).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KINDS = ("native", "int8", "fp8", "seed1", "wrong_template")
MODEL_OF = {"native": "builtin:tiny-chat", "int8": "builtin:tiny-chat-int8", "fp8": "builtin:tiny-chat-fp8",
            "seed1": "builtin:tiny-chat-seed1", "wrong_template": "builtin:tiny-chat"}
MAX_NEW = 150
HELD_OUT_SEED = 424242  # draws of the training distribution the model was not trained on


@dataclass(frozen=True)
class Answered:
    kind: str
    sample_id: str
    prompt: list[int]  # as eyrie rebuilds it: the model's own template
    answer: list[int]  # what the provider's model returned


def answered(n: int) -> tuple[Path, list[Answered]]:
    """(the target's folder, `n` prompts x every kind)."""
    import torch
    from transformers import AutoTokenizer

    from eyrie.jobs.extract import tiny
    from eyrie.jobs.reconstruct.base import Turn
    from eyrie.jobs.reconstruct.deepseek import DeepSeekV3

    folders = {kind: tiny.model_folder(name) for kind, name in MODEL_OF.items()}
    tok = AutoTokenizer.from_pretrained(folders["native"])
    other_family = DeepSeekV3()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # decoding one token at a time: threads only contend
    out: list[Answered] = []
    try:
        for i, c in enumerate(tiny.corpus(n, seed=HELD_OUT_SEED)):
            prompt = tok.encode(tok.apply_chat_template(c["messages"], tools=c["tools"], add_generation_prompt=True,
                                                        tokenize=False), add_special_tokens=False)
            wrong = tok.encode(other_family.render(c["messages"], c["tools"], Turn(content="."), True).prompt,
                               add_special_tokens=False)
            for kind in KINDS:
                sent = wrong if kind == "wrong_template" else prompt
                out.append(Answered(kind, f"{kind}-{i}", prompt, tiny.decode(folders[kind], sent, MAX_NEW)))
    finally:
        torch.set_num_threads(threads)
    return folders["native"], out


def scored(n: int, out: str) -> tuple[Path, dict[str, list[tuple[Answered, dict]]]]:
    """`answered(n)` rebuilt as samples in the store at `out` and scored by eyrie's extraction
    (transformers backend, float32, the path `eyrie run` takes): per kind, (answer, fidelity row)."""
    import io

    import pyarrow.parquet as pq
    from extract_helpers import make_spec

    from eyrie.jobs.contract import layout
    from eyrie.jobs.extract.hf_backend import HFBackend
    from eyrie.jobs.extract.run import run_extraction
    from eyrie.jobs.reconstruct.reconstructor import Sample
    from eyrie.jobs.reconstruct.samples import samples_table
    from eyrie.jobs.store import open_store

    target, got = answered(n)
    store = open_store(out)
    buf = io.BytesIO()
    pq.write_table(samples_table([Sample(a.sample_id, "src", a.prompt + a.answer, len(a.prompt), (), None, None,
                                         provider=a.kind) for a in got]), buf)
    store.put(layout.samples_key(0), buf.getvalue())
    run_extraction(make_spec(out, target, dtype="float32"), store,
                   backend=HFBackend(str(target), device="cpu", storage_dtype="float32"))
    rows = {r["sample_id"]: r for r in pq.read_table(io.BytesIO(store.get(layout.fidelity_key(0)))).to_pylist()}
    return target, {k: [(a, rows[a.sample_id]) for a in got if a.kind == k] for k in KINDS}


def agreement(rows: list[dict]) -> tuple[float, float]:
    """Token-weighted top-1 agreement and mean NLL of fidelity rows (as the manifest rolls them up)."""
    n = sum(r["n_completion_tokens"] for r in rows)
    return (sum(r["top1_agreement"] * r["n_completion_tokens"] for r in rows) / n,
            sum(r["mean_nll"] * r["n_completion_tokens"] for r in rows) / n)

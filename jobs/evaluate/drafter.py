"""A small EAGLE-3 drafter trained and evaluated with SpecForge 0.2.0's own code, driven by the
smallest loop that feeds it.

Why not `specforge train`: on this kind of machine (CPU, no CUDA) it cannot run, measured piece by
piece (docs/operating.md, "Does it matter for the drafter?"): it needs `accelerate` (not among its
installed dependencies here), its offline target head (`TargetHead.from_pretrained`) reads only sharded
checkpoints with an untied `lm_head.weight` (a small target ships one file with tied embeddings), and
its KL loss `core.loss.LogSoftmaxLoss` is a Triton kernel with no CPU path. So the loop is eyrie's and
every piece it calls is SpecForge's:

- the draft `LlamaForCausalLMEagle3` (`attention_backend="sdpa"`), built by `AutoDraftModel.from_config`
  from the draft config `eyrie export specforge` writes (the target's shape, one layer), its embedding
  loaded from the target and frozen (`load_embedding`, `freeze_embedding`) as SpecForge's builder does;
- the vocabulary mapping from the training data's loss tokens (`process_token_dict_to_mappings`);
- the test-time-training model `OnlineEagle3Model` and its step `Eagle3TrainStrategy.forward_loss` with
  the frozen `TargetHead` over the stored last hidden state (target_repr "hidden_state", the offline path);
- the offline normalizer (`normalize_offline_sample`) and collator (`DataCollatorWithPadding`);
- the optimizer `BF16Optimizer` (AdamW on fp32 masters, grad clipping, warmup then cosine);
- the evaluator `Evaluator` (per-position accuracy, `simulated_acc_len`).

On a CPU, `specforge_backend` swaps the Triton loss for SpecForge's own torch formula of it
(`core.loss._compute_loss`, the kernel's reference, run eagerly): tests/evaluate/test_evaluate.py shows it equal
to the kernel's forward and backward as the kernel's source computes them, and
benchmarks/gpu_acceptance.py compares it with the kernel itself where a GPU is lent. It also runs
`torch.compile`d helpers eagerly (inductor's first CPU compile of them costs minutes). Both are undone
when the block ends; the swap is a module attribute, so no other thread may train meanwhile.

Global state is left as found: the random generator is forked (`torch.random.fork_rng`), the thread
count and the compiler's stance restored.
"""

from __future__ import annotations

import contextlib
import io
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eyrie.jobs.evaluate.data import Corpus
from eyrie.jobs.evaluate.plan import SPECFORGE_VERSION, EvaluationError, Take
from eyrie.jobs.spec import STEPS, TOKENS_PER_STEP

__all__ = ["SPECFORGE_VERSION", "Counts", "Drafter", "TrainSettings", "evaluate", "shuffled", "train"]


@dataclass(frozen=True)
class TrainSettings:
    """One drafter's budget and optimizer; every drafter of an evaluation gets the same."""

    steps: int = STEPS  # on the quickstart (36 samples) 92 s of CPU, acc ~0.83 at every position (docs/operating.md)
    tokens_per_step: int = TOKENS_PER_STEP  # loss tokens per step, exact (plan.steps_plan)
    ttt_length: int = 7  # SpecForge's default draft positions (training.ttt_length)
    learning_rate: float = 1e-2  # SpecForge's 1e-4 is for a large draft and 100k steps; at 300 steps 1e-2 beat 3e-3
    warmup_ratio: float = 0.015  # SpecForge's default
    max_grad_norm: float = 0.5  # SpecForge's default
    max_length: int = 2048  # SpecForge's data.max_length default: longer samples are cut
    seed: int = 0
    dtype: str = "float32"  # on a CPU; SpecForge's bfloat16 on a GPU
    # torch threads while training (restored after; None: as found). One: a drafter of a small target is
    # tensors too small to split, and on 2 loaded cores two threads spun: 15 steps on the quickstart took
    # 65 s of CPU (128 s wall) with two, 13 s (26 s) with one
    threads: int | None = 1

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("steps", "tokens_per_step", "ttt_length", "learning_rate",
                                              "warmup_ratio", "max_grad_norm", "max_length", "seed", "dtype")}


# What `eyrie evaluate` imports of SpecForge (its model, step, data and evaluator code): a missing module
# among them is named before anything is read or trained
SPECFORGE_MODULES = ("specforge.core.loss", "specforge.algorithms.eagle3.model", "specforge.algorithms.eagle3.data",
                     "specforge.data.preprocessing", "specforge.data.utils", "specforge.modeling.auto",
                     "specforge.modeling.draft.llama3_eagle", "specforge.modeling.target.target_head",
                     "specforge.training.strategies.base", "specforge.eval.evaluator")
# SpecForge's own code beside eyrie: what its code imports (the extra), then it without its pins (--no-deps)
SPECFORGE_INSTALL = f"pip install 'eyrie[specforge]' && pip install --no-deps specforge=={SPECFORGE_VERSION}"


class SpecForgeMissing(EvaluationError):
    """SpecForge's code (or what it imports) is not installed: the message is the install line."""


def require_specforge() -> None:
    """Raise SpecForgeMissing (one line: what is missing, the install line) unless every module of
    SpecForge's that training a drafter uses imports; an entry point names its command before it."""
    import importlib

    for name in SPECFORGE_MODULES:
        try:
            importlib.import_module(name)
        except ImportError as e:
            missing = getattr(e, "name", None) or name
            raise SpecForgeMissing(f"drafters are trained with SpecForge's own code, and {missing!r} cannot be "
                                   f"imported: install it with `{SPECFORGE_INSTALL}` (its torch and sglang pins "
                                   "are not eyrie's: --no-deps)") from None


class TorchLogSoftmaxLoss:
    """SpecForge's `LogSoftmaxLoss` interface over its torch reference formula (`core.loss._compute_loss`:
    the kernel's loss, -sum(mask * p * log_softmax(logits)) averaged over every position)."""

    @staticmethod
    def apply(logits: torch.Tensor, target_p: torch.Tensor, position_mask: torch.Tensor) -> torch.Tensor:
        from specforge.core.loss import _compute_loss

        return _compute_loss(logits, target_p, position_mask)


@contextlib.contextmanager
def specforge_backend(device: torch.device) -> Iterator[None]:
    """SpecForge's EAGLE-3 step as it runs on `device`: on a CPU its loss is its torch formula and its
    compiled helpers run eagerly; on CUDA, untouched (the Triton kernel, torch.compile)."""
    if device.type == "cuda":
        yield
        return
    import specforge.algorithms.eagle3.model as eagle3_model

    saved = eagle3_model.LogSoftmaxLoss
    eagle3_model.LogSoftmaxLoss = TorchLogSoftmaxLoss  # type: ignore[assignment,misc]
    try:
        with torch.compiler.set_stance("force_eager"):
            yield
    finally:
        eagle3_model.LogSoftmaxLoss = saved


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    before = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _quiet() -> contextlib.AbstractContextManager[Any]:
    """SpecForge prints as it builds (vocab mapping, cache notes): kept off the command's output."""
    return contextlib.redirect_stdout(io.StringIO())


def _head_weight(model_path: str) -> torch.Tensor:
    """The target's output head ([vocab, hidden]) from its safetensors, without loading the model:
    `lm_head.weight`, or the input embedding when the model ties them."""
    import json

    from safetensors import safe_open
    from transformers import AutoConfig

    folder = Path(model_path)
    config = AutoConfig.from_pretrained(model_path)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    files: dict[str, str] = {}
    index = next(iter(sorted(folder.glob("*.safetensors.index.json"))), None)
    if index is not None:
        files = json.loads(index.read_text())["weight_map"]
    for key in ("lm_head.weight", "model.embed_tokens.weight") if not tied else ("model.embed_tokens.weight",):
        name = files.get(key, "model.safetensors")
        path = folder / name
        if not path.exists():
            continue
        with safe_open(str(path), framework="pt") as f:
            if key in f.keys():  # noqa: SIM118 (safe_open has keys(), not __contains__)
                return f.get_tensor(key)
    raise EvaluationError(f"{model_path}: no lm_head.weight (nor a tied embedding) in its safetensors: the "
                          "drafter's teacher is the target's head over the stored last hidden state")


def target_folder(name: str, model: str) -> str:
    """A local folder of the target: the builtin's cache folder, else the path the extraction loaded."""
    if name.startswith("builtin:"):
        from eyrie.jobs.extract.run import builtin_model

        return builtin_model(name)
    if Path(model).is_dir():
        return model
    from huggingface_hub import snapshot_download

    return snapshot_download(model, allow_patterns=["*.json", "*.safetensors"])


@dataclass
class Drafter:
    """A trained drafter and what its training did."""

    strategy: Any  # specforge.training.strategies.base.Eagle3TrainStrategy
    losses: list[float] = field(default_factory=list)  # the step's weighted TTT loss, every step
    seconds: float = 0.0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


def _draft_config(model_path: str, aux_layers: Sequence[int]) -> Any:
    from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
    from transformers import AutoConfig

    from eyrie.jobs.extract.specforge import draft_config

    doc = draft_config(AutoConfig.from_pretrained(model_path), list(aux_layers))
    doc["tie_word_embeddings"] = False  # as SpecForge's AutoDraftModelConfig.from_file sets it
    return LlamaForCausalLMEagle3.config_class(**doc)


def build(model_path: str, aux_layers: Sequence[int], token_counts: Counter[int], settings: TrainSettings,
          device: torch.device) -> Any:
    """SpecForge's EAGLE-3 training model for this target: draft, vocab mapping, TTT wrapper, target
    head, step strategy (its `build_eagle3_draft` / `build_eagle3_model` without the config plumbing)."""
    from specforge.algorithms.eagle3.model import OnlineEagle3Model
    from specforge.data.preprocessing import process_token_dict_to_mappings
    from specforge.modeling.auto import AutoDraftModel
    from specforge.modeling.target.target_head import TargetHead
    from specforge.training.strategies.base import Eagle3TrainStrategy

    dtype = getattr(torch, settings.dtype)
    config = _draft_config(model_path, aux_layers)
    with _quiet():
        draft = AutoDraftModel.from_config(config, attention_backend="sdpa", torch_dtype=dtype)
        d2t, t2d = process_token_dict_to_mappings(Counter(token_counts), int(config.draft_vocab_size),
                                                  int(config.vocab_size))
    draft.t2d.copy_(t2d)
    draft.d2t.copy_(d2t)
    draft.load_embedding(model_path, embedding_key="model.embed_tokens.weight")
    draft.freeze_embedding()
    model = OnlineEagle3Model(draft, length=settings.ttt_length, attention_backend="sdpa")
    model = model.to(device=device, dtype=dtype)
    head = TargetHead(model_path)
    with torch.no_grad():
        head.fc.weight.copy_(_head_weight(model_path))
    head.freeze_weights()
    head = head.eval().to(device=device, dtype=dtype)
    return Eagle3TrainStrategy(model, target_head=head)


def _cap(mask: torch.Tensor, cap: int) -> torch.Tensor:
    """The loss mask with only its first `cap` trained tokens kept."""
    keep = torch.cumsum(mask, dim=-1) <= cap
    return mask * keep


def shuffled(raw: dict[str, Any], seed: int) -> dict[str, Any]:
    """The control: what the drafter reads (each token's id and the target's auxiliary states at it, moved
    together) in a seeded random order, what it must predict (the target's last hidden state, the loss
    mask) in place. Its input then says nothing about its teacher's next token beyond the sample's bag
    of tokens, so it can learn little more than the answers' most frequent tokens: the floor every real
    drafter must clear. Shuffling the ids alone is no control: the auxiliary states still carry the
    whole context (measured on the quickstart at 60 steps: acc_0 0.294 against the real drafter's 0.297,
    and it ranked above the impostor's drafter)."""
    g = torch.Generator().manual_seed(seed)
    ids = raw["input_ids"]
    order = torch.randperm(len(ids), generator=g)
    aux = raw["aux_hidden_state"]
    return {**raw, "input_ids": ids[order], "aux_hidden_state": aux[:, order] if aux.dim() == 3 else aux[order]}


Transform = Callable[[dict[str, Any], int], dict[str, Any]]


def batch(corpus: Corpus, takes: Sequence[Take], settings: TrainSettings, device: torch.device,
          transform: Transform | None = None) -> Any:
    """A SpecForge `TrainBatch` of these samples: normalized and padded by SpecForge's own functions."""
    from specforge.algorithms.eagle3.data import normalize_offline_sample
    from specforge.data.utils import DataCollatorWithPadding
    from specforge.runtime.contracts import TrainBatch

    dtype = getattr(torch, settings.dtype)
    feats = []
    for t in takes:
        raw = corpus.raw(t.index)
        if transform is not None:
            raw = transform(raw, settings.seed * 1_000_003 + t.index)
        f = normalize_offline_sample(raw, max_len=settings.max_length)
        if t.loss_cap is not None:
            f["loss_mask"] = _cap(f["loss_mask"], t.loss_cap)
        f["hidden_state"] = f["hidden_state"].to(dtype)
        f["target"] = f["target"].to(dtype)
        feats.append(f)
    tensors = DataCollatorWithPadding()(feats)
    tensors = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}
    return TrainBatch(sample_ids=[corpus.samples[t.index].sample_id for t in takes], strategy="eagle3",
                      tensors=tensors, metadata={"target_repr": "hidden_state"})


def token_counts(corpus: Corpus, indices: Sequence[int]) -> Counter[int]:
    """The loss tokens of the training samples, as SpecForge counts them for its vocab mapping."""
    c: Counter[int] = Counter()
    for i in indices:
        ids, mask = corpus.tokens(i)
        c.update(ids[mask.astype(bool)].tolist())
    return c


def train(corpus: Corpus, plan: Sequence[Sequence[Take]], train_indices: Sequence[int], model_path: str,
          settings: TrainSettings, device: torch.device | None = None, transform: Transform | None = None,
          on_step: Callable[[int, float], None] | None = None) -> Drafter:
    """Train one drafter on `plan`'s steps with SpecForge's step and optimizer."""
    from specforge.optimizer import BF16Optimizer

    device = device or torch.device("cpu")
    started = time.perf_counter()
    with torch.random.fork_rng(devices=[]), _threads(settings.threads), specforge_backend(device):
        torch.manual_seed(settings.seed)
        strategy = build(model_path, corpus.target.aux_layers, token_counts(corpus, train_indices), settings, device)
        model = strategy.trainable_module()
        model.train()
        opt = BF16Optimizer(model, lr=settings.learning_rate, max_grad_norm=settings.max_grad_norm,
                            total_steps=len(plan), warmup_ratio=settings.warmup_ratio)
        losses = []
        for step, takes in enumerate(plan):
            out = strategy.forward_loss(batch(corpus, takes, settings, device, transform))
            out.loss.backward()
            opt.step()
            losses.append(float(out.loss.detach()))
            if on_step is not None:
                on_step(step, losses[-1])
        model.eval()
    return Drafter(strategy, losses, time.perf_counter() - started, device)


@dataclass(frozen=True)
class Counts:
    """SpecForge's per-position counts on each held-out sample, and its Evaluator's own figures."""

    correct: np.ndarray  # samples x positions
    denom: np.ndarray
    specforge: dict[str, Any]  # Evaluator.run's eval/* metrics


def evaluate(drafter: Drafter, corpus: Corpus, indices: Sequence[int], settings: TrainSettings) -> Counts:
    """The drafter on each held-out sample (a batch of one, so the counts are per sample), through
    SpecForge's `Evaluator`, which sums the same counts into its per-position accuracy."""
    from specforge.eval.evaluator import Evaluator

    rows_c: list[list[float]] = []
    rows_d: list[list[float]] = []

    def forward(b: Any) -> Any:
        out = drafter.strategy.forward_loss(b)
        rows_c.append([float(x) for x in out.metrics["acc_corrects"]])
        rows_d.append([float(x) for x in out.metrics["acc_denoms"]])
        return out

    if not indices:
        raise EvaluationError("no held-out sample to evaluate on")
    with torch.random.fork_rng(devices=[]), _threads(settings.threads), specforge_backend(drafter.device):
        metrics = Evaluator().run(forward, (batch(corpus, [Take(i)], settings, drafter.device) for i in indices))
    return Counts(np.array(rows_c), np.array(rows_d), metrics)

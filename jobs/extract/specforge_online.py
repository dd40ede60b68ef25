"""`eyrie export specforge-online`: the samples as SpecForge's online training reads them, each row
checked by SpecForge's own parser, so no hidden state has to be stored.

SpecForge's online mode re-tokenizes text: with `data.is_preformatted: true` it is given each sample's
text and rebuilds the ids with the target tokenizer and the loss mask from `data.chat_template`'s
assistant header and end-of-turn token (`specforge.data.parse.GeneralParser`). That is where template
drift creeps in, so every row is run through SpecForge's own `preprocess_conversations` (what its
`build_eagle3_dataset` maps over the file) with the tokenizer loaded as SpecForge loads it
(`AutoTokenizer.from_pretrained`), and its ids and mask are compared with eyrie's sample
(`specforge_check.compare`). Rows that differ are left out of the text file (kept with
`keep_mismatched`) and counted by cause.

Written into DIR:
- `data.jsonl`: `{"id", "text"}` per row (`data.train_data_path`);
- `tokens.jsonl`: `{"id", "input_ids", "loss_mask"}` for every sample: SpecForge 0.2.0 reads records that
  carry both as they are (`data.prompts_path`, its pre-tokenized path: no template, no re-tokenization),
  the exact hand-off where no built-in template rebuilds eyrie's mask;
- `data-config.yaml`, `data-config-tokens.yaml`: the `data:` section of a `specforge train` run config
  for each file (`chat_template`, `is_preformatted`, `train_only_last_turn`, `max_length`), and with
  `model` its `model:` section;
- with `model` (the target's config.json: its vocabulary size and shape), what SpecForge 0.2.0's online
  training cannot do without, since its capture servers and trainer cannot derive one shared mapping
  (`model.vocab_mapping_path` is required there): `vocab-mapping.pt`, the draft's vocabulary chosen by
  SpecForge's own `process_token_dict_to_mappings` from the loss tokens of `tokens.jsonl` (within
  `max_length`), and `draft-config.json`, the EAGLE-3 draft of the target's shape it maps into (its
  `eagle_config` names the capture layers: SpecForge's own default, or for a target of fewer than 7
  layers, where that default repeats a layer, eyrie's shallow `auto`);
- `mismatched.jsonl`: each row SpecForge rebuilds differently, its cause and the first difference decoded;
- `eyrie_export.json`: the summary, also stored in the run's output (`exports/specforge-online.json`)
  for `eyrie report`.

The chat template is named by `--chat-template`, or chosen among the templates SpecForge has for the
samples' chat format (for `auto`: those whose header and end-of-turn token are in the text) by what
rebuilds most of the first rows exactly; a format none fits is refused with the list SpecForge has.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import multiprocessing
import os
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import torch
import yaml

from eyrie.jobs.context import usable_cores
from eyrie.jobs.contract import layout
from eyrie.jobs.contract.layers import resolve_layers
from eyrie.jobs.extract.run import SampleRow, builtin_model, list_sample_shards, read_samples
from eyrie.jobs.extract.specforge import (
    DRAFT_CONFIG,
    RUN_FROM_HERE,
    SPECFORGE_VERSION,
    TARGET_MODEL,
    ExportError,
    draft_config,
    install_hint,
    portable_target,
    prepare_dir,
)
from eyrie.jobs.extract.specforge_check import CAUSE_TEXT, Difference, compare, runs
from eyrie.jobs.reconstruct.tokenizers import LoadedTokenizer, load_tokenizer
from eyrie.jobs.spec import TargetSpec
from eyrie.jobs.store import NotFound, Store

FORMAT_TEMPLATES: dict[str, tuple[str, ...]] = {  # SpecForge's templates for eyrie's named chat formats
    "kimi-k2.5": ("kimi-k2-thinking", "kimi-k2-instruct"),
    "qwen3": ("qwen3-thinking", "qwen3-instruct"),
    "deepseek-v3": ("deepseek-v3", "deepseek-v32"),
    "deepseek-v4": ("deepseek-v32", "deepseek-v3"),
}
PROBE_ROWS = 64  # rows each candidate template is tried on when none is named
CHUNK = 128  # rows per call of SpecForge's parser (and per task of a worker process)
ROWS_PER_WORKER = 5000  # rows that pay for starting one more parser process (auto_workers; measured in
# benchmarks/specforge_online.py: at 5,000 rows two processes were slower than one, at 50,000 1.28 x faster)
EXAMPLES = 3  # mismatched rows quoted per cause in the summary
DATA, TOKENS, MISMATCHED, SUMMARY = "data.jsonl", "tokens.jsonl", "mismatched.jsonl", "eyrie_export.json"
CONFIG, CONFIG_TOKENS = "data-config.yaml", "data-config-tokens.yaml"
VOCAB_MAPPING = "vocab-mapping.pt"
_OURS = {DATA, TOKENS, MISMATCHED, SUMMARY, CONFIG, CONFIG_TOKENS, VOCAB_MAPPING, DRAFT_CONFIG, TARGET_MODEL}


class SpecForgeUnavailable(ExportError):
    """SpecForge's data code cannot be imported here, so its parser cannot check the rows."""


@dataclass(frozen=True)
class OnlineOptions:
    chat_template: str | None = None  # a SpecForge template name; None: chosen from the chat format
    verify: bool | None = None  # None: when specforge imports
    keep_mismatched: bool = False
    max_length: int | None = None  # SpecForge's data.max_length; None: the longest sample
    truncate: bool = False  # rows longer than max_length are cut (and compared cut) instead of left out
    overwrite: bool = False
    tokenizer: str | None = None  # the tokenizer to load instead of the one the run names (same files)
    trust_remote_code: bool = False  # as SpecForge's model.trust_remote_code
    workers: int | None = None  # processes running SpecForge's parser; None: auto_workers (cores, rows)
    model: str | None = None  # the target model (folder or HF id): its config for the vocab mapping and draft


@dataclass
class OnlineResult:
    samples: int = 0
    exact: int = 0
    written: int = 0  # rows in data.jsonl
    over_max_length: int = 0
    truncated: int = 0
    mismatched: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)
    chat_template: str = ""
    chosen_by: str = ""  # given | probe | format
    probe: dict[str, int] = field(default_factory=dict)
    train_only_last_turn: bool = True
    max_length: int = 0
    verified: bool = False
    not_verified: str | None = None  # why SpecForge's parser was not run, and the command that fixes it
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # this process's (from the export's start) and its parser processes' (start-up too)
    parser_cpu_seconds: float | None = None  # of which inside SpecForge's parser (None: not verified)
    draft: dict[str, Any] | None = None  # draft-config.json's content (with model)
    model: str | None = None  # the target model's config as read here (a folder or HF id)
    target_model_path: str | None = None  # the target as the run config names it (portable_target)
    loss_tokens: Counter[int] = field(default_factory=Counter)  # counted for the vocab mapping (with model)
    summary: dict[str, Any] = field(default_factory=dict)


def specforge_importable() -> str | None:
    """None when SpecForge's data code imports; else why not."""
    try:
        import specforge.data.preprocessing
        import specforge.data.template  # noqa: F401
    except Exception as e:  # ImportError, or a dependency failing at import
        return f"{type(e).__name__}: {e}"
    return None


def specforge_templates() -> list[str]:
    from specforge.data.template import TEMPLATE_REGISTRY

    return TEMPLATE_REGISTRY.get_all_template_names()


def _hf_tokenizer(tok: LoadedTokenizer, trust_remote_code: bool) -> Any:
    """The tokenizer as SpecForge loads it (`AutoTokenizer.from_pretrained(model.target_model_path)`,
    pad falling back to EOS then UNK), a copy of its own: SpecForge's parser sets `pad_token_id`."""
    from transformers import AutoTokenizer

    if tok.kind != "huggingface" and not trust_remote_code:
        raise ExportError(f"tokenizer {tok.name!r} is a tiktoken folder eyrie reads without remote code; SpecForge "
                          "loads it with AutoTokenizer, which needs the folder's own code (tokenization_*.py): pass "
                          "--trust-remote-code (SpecForge's model.trust_remote_code: true), or --no-verify")
    try:
        hf = AutoTokenizer.from_pretrained(str(tok.folder), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise ExportError(f"tokenizer {tok.name!r}: AutoTokenizer cannot load {tok.folder} as SpecForge would: "
                          f"{type(e).__name__}: {e}") from None
    if hf.pad_token_id is None:
        hf.pad_token_id = hf.eos_token_id if hf.eos_token_id is not None else hf.unk_token_id
    return hf


@dataclass(frozen=True)
class ParserConfig:
    """What a process needs to run SpecForge's parser on rows (plain data: it crosses to workers)."""

    tokenizer: str  # the tokenizer folder
    trust_remote_code: bool
    template: str
    max_length: int
    train_only_last_turn: bool


class Checker:
    """Each row's text (the ids decoded) and SpecForge's verdict on it."""

    def __init__(self, cfg: ParserConfig, tok: LoadedTokenizer | None = None, hf: Any = None):
        from specforge.data.template import TEMPLATE_REGISTRY

        self.cfg = cfg
        self.tok = tok or load_tokenizer(TargetSpec(model="export", tokenizer=cfg.tokenizer,
                                                    trustRemoteCode=cfg.trust_remote_code))
        self.hf = hf if hf is not None else _hf_tokenizer(self.tok, cfg.trust_remote_code)
        self.template = TEMPLATE_REGISTRY.get(cfg.template)
        self.parser_cpu = 0.0  # CPU seconds inside SpecForge's parser: the export's cost that is not eyrie's

    def texts(self, rows: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[str]:
        return [self.tok.decode(ids.tolist()) for ids, _ in rows]

    def check(self, rows: Sequence[tuple[np.ndarray, np.ndarray]]) -> list[tuple[str, Difference | None]]:
        """(text, None) for a row SpecForge rebuilds exactly as eyrie has it, else (text, the difference);
        rows longer than max_length are compared cut to it (SpecForge truncates them)."""
        from specforge.data.preprocessing import preprocess_conversations

        texts = self.texts(rows)
        c0 = time.process_time()
        out = preprocess_conversations(self.hf, texts, self.template, self.cfg.max_length, is_preformatted=True,
                                       train_only_last_turn=self.cfg.train_only_last_turn,
                                       tools=[[] for _ in texts])
        self.parser_cpu += time.process_time() - c0
        if len(out["input_ids"]) != len(texts):  # SpecForge skips empty texts; eyrie's samples have tokens
            raise ExportError(f"SpecForge's parser returned {len(out['input_ids'])} rows for {len(texts)}")
        n = self.cfg.max_length
        return [(text, compare(ids[:n], mask[:n], t_ids[0].numpy(), t_mask[0].numpy(), self.tok.decode))
                for text, (ids, mask), t_ids, t_mask in zip(texts, rows, out["input_ids"], out["loss_mask"],
                                                            strict=True)]


_WORKER: Checker | None = None


def _init_worker(cfg: ParserConfig) -> None:
    global _WORKER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER = Checker(cfg)


def _check_in_worker(rows: list[tuple[np.ndarray, np.ndarray]]
                     ) -> tuple[list[tuple[str, Difference | None]], int, float, float]:
    """The rows' verdicts, and this process's CPU so far (pid, in SpecForge's parser, in all: start-up too)."""
    assert _WORKER is not None
    results = _WORKER.check(rows)
    return results, os.getpid(), _WORKER.parser_cpu, time.process_time()


class Pool:
    """SpecForge's parser over chunks of rows, in this process or in `workers` processes, results in
    order, at most 2 x workers chunks in flight (memory stays bounded whatever the export's size)."""

    def __init__(self, cfg: ParserConfig, workers: int, tok: LoadedTokenizer, hf: Any = None):
        self.local = Checker(cfg, tok, hf) if workers <= 1 else None
        self.ex = None if workers <= 1 else concurrent.futures.ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker, initargs=(cfg,))
        self.depth = 2 * max(1, workers)
        self.seen: dict[int, tuple[float, float]] = {}  # worker pid -> its last (parser, all) CPU seconds

    def cpu(self) -> tuple[float, float]:
        """(CPU seconds in SpecForge's parser, CPU seconds of the worker processes in all): with the export's
        own process time, the whole tree's cost and the share of it that is SpecForge's."""
        if self.local is not None:
            return self.local.parser_cpu, 0.0
        return sum(p for p, _ in self.seen.values()), sum(a for _, a in self.seen.values())

    def _take(self, done: concurrent.futures.Future) -> list[tuple[str, Difference | None]]:
        results, pid, parser, total = done.result()
        self.seen[pid] = max(self.seen.get(pid, (0.0, 0.0)), (parser, total))  # cumulative: the latest is largest
        return results

    def run(self, chunks: Iterator[list[tuple[np.ndarray, np.ndarray]]]
            ) -> Iterator[list[tuple[str, Difference | None]]]:
        if self.local is not None:
            for c in chunks:
                yield self.local.check(c)
            return
        assert self.ex is not None
        pending: deque[concurrent.futures.Future] = deque()
        for c in chunks:
            pending.append(self.ex.submit(_check_in_worker, c))
            if len(pending) >= self.depth:
                yield self._take(pending.popleft())
        while pending:
            yield self._take(pending.popleft())

    def close(self) -> None:
        if self.ex is not None:
            self.ex.shutdown(cancel_futures=True)


# ---------------------------------------------------------------------------------- the export


def _run_summary(store: Store) -> dict[str, Any]:
    try:
        doc = orjson.loads(store.get(layout.SAMPLES_SUMMARY))
    except NotFound:
        raise ExportError(f"{store.url(layout.SAMPLES_SUMMARY)}: no reconstruction summary: run the samples "
                          "stage first (eyrie run SPEC --until samples)") from None
    return doc


def _tokenizer(summary: dict[str, Any], opts: OnlineOptions) -> LoadedTokenizer:
    want = summary.get("tokenizer") or {}
    ref = opts.tokenizer or want.get("name")
    if not ref:
        raise ExportError("the run's reconstruction summary names no tokenizer: pass --tokenizer")
    tok = load_tokenizer(TargetSpec(model="export", tokenizer=ref, trustRemoteCode=opts.trust_remote_code),
                         None)
    if want.get("sha256") and tok.sha256 != want["sha256"]:
        raise ExportError(f"tokenizer {ref!r} hashes to {tok.sha256[:12]}…, but the samples were rebuilt with "
                          f"{want.get('name')!r} ({want['sha256'][:12]}…): pass --tokenizer with those files")
    return tok


def _scan(store: Store, shards: list[int]) -> tuple[int, int, bool, int]:
    """(samples, longest, any sample with more than one span in its loss: packed turns, largest token id)."""
    n = longest = top = 0
    packed = False
    for shard in shards:
        for r in read_samples(store, shard):
            n += 1
            longest = max(longest, len(r.input_ids))
            packed = packed or len(runs(r.loss_mask)) > 1
            top = max(top, int(r.input_ids.max(initial=0)))
    return n, longest, packed, top


def _draft(opts: OnlineOptions, top_id: int) -> tuple[dict[str, Any] | None, str | None]:
    """(draft-config.json's content from the target's config, the target's path for SpecForge); (None, None)
    without --model. Refused before anything is written when the config cannot be read or its vocabulary
    does not hold the samples' ids."""
    if not opts.model:
        return None, None
    from transformers import AutoConfig

    try:  # builtin:tiny-llama (the quickstart's demo model) is built into eyrie's cache, as extraction builds it
        ref = builtin_model(opts.model) if opts.model.startswith("builtin:") else opts.model
        config = AutoConfig.from_pretrained(ref, trust_remote_code=opts.trust_remote_code)
    except Exception as e:
        raise ExportError(f"--model {opts.model!r}: its config.json cannot be read ({type(e).__name__}: {e}); "
                          "name the target model's folder or HF id (--trust-remote-code if it needs its own code)"
                          ) from None
    # the capture layers: eyrie's auto, which is SpecForge's own default ([1, L/2-1, L-4] in its ids) for a
    # deep target; for a shallow one (the quickstart's 4-layer demo) that default repeats a layer, which
    # SpecForge's capture refuses, and auto's shallow choice is written instead
    get = getattr(config, "get_text_config", None)
    depth = getattr(get() if callable(get) else config, "num_hidden_layers", None)
    layers = list(resolve_layers("auto", depth).ids) if isinstance(depth, int) and depth >= 4 else None
    doc = draft_config(config, layers)
    if top_id >= doc["vocab_size"]:
        raise ExportError(f"--model {opts.model!r}: its vocabulary has {doc['vocab_size']} ids, but the samples use "
                          f"ids up to {top_id}: it is not the model whose tokenizer rebuilt them")
    return doc, ref


def vocab_mapping(counts: Counter[int], draft_vocab_size: int, target_vocab_size: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) as SpecForge's `process_token_dict_to_mappings` makes them (what its trainer installs
    from counted loss tokens): the draft vocabulary is chosen by its own code; only t2d is rebuilt here
    from that choice, since its own `[i in used_tokens for i in range(target_vocab_size)]` scans a list
    of 32,000 for each of the target's ids (minutes for a 160k vocabulary)."""
    from specforge.data.preprocessing import process_token_dict_to_mappings

    with contextlib.redirect_stdout(io.StringIO()):  # it prints its progress
        d2t, _ = process_token_dict_to_mappings(Counter(counts), draft_vocab_size, 0)
    t2d = torch.zeros(target_vocab_size, dtype=torch.bool)
    t2d[d2t + torch.arange(len(d2t))] = True
    return d2t, t2d


def _vocab_mapping(out: Path, r: OnlineResult) -> None:
    assert r.draft is not None
    d2t, t2d = vocab_mapping(r.loss_tokens, r.draft["draft_vocab_size"], r.draft["vocab_size"])
    tmp = out / f".{VOCAB_MAPPING}.tmp"
    torch.save({"d2t": d2t, "t2d": t2d}, tmp)
    tmp.replace(out / VOCAB_MAPPING)


def _rows(store: Store, shards: list[int]) -> Iterator[SampleRow]:
    for shard in shards:
        yield from read_samples(store, shard)


def _candidates(fmt: str, first_text: str) -> list[str]:
    from specforge.data.template import TEMPLATE_REGISTRY

    names = specforge_templates()
    if fmt in FORMAT_TEMPLATES:
        return [n for n in FORMAT_TEMPLATES[fmt] if n in names]
    found = []
    for n in names:
        t = TEMPLATE_REGISTRY.get(n)
        if t.parser_type in ("general", "thinking") and t.assistant_header and t.assistant_header in first_text \
                and (not t.end_of_turn_token or t.end_of_turn_token in first_text):
            found.append(n)
    return found


def _choose(fmt: str, tok: LoadedTokenizer, hf: Any, probe: list[SampleRow], opts: OnlineOptions, max_length: int,
            last_turn: bool, verify: bool) -> tuple[str, str, dict[str, int], float]:
    """(template, how it was chosen, exact rows of the probe per candidate, CPU seconds in SpecForge's parser)."""
    names = specforge_templates() if verify else []
    if opts.chat_template:
        if verify and opts.chat_template not in names:
            raise ExportError(f"--chat-template {opts.chat_template!r}: SpecForge {SPECFORGE_VERSION} has no such "
                              f"template; it has: {', '.join(names)}")
        return opts.chat_template, "given", {}, 0.0
    if not verify:
        if fmt not in FORMAT_TEMPLATES:
            raise ExportError(f"chat format {fmt!r} has no SpecForge template eyrie knows to name without checking: "
                              "pass --chat-template NAME (or let the export verify the rows: install specforge)")
        return FORMAT_TEMPLATES[fmt][0], "format", {}, 0.0
    text = tok.decode(probe[0].input_ids.tolist()) if probe else ""
    cands = _candidates(fmt, text)
    if not cands:
        raise ExportError(f"SpecForge {SPECFORGE_VERSION} has no chat template for chat format {fmt!r} (none of its "
                          f"templates' assistant header and end-of-turn token are in the samples' text); it has: "
                          f"{', '.join(names)}. Name one with --chat-template (the verification then says how its "
                          "rows compare), or train on tokens.jsonl (data.prompts_path), which needs no template")
    if len(cands) == 1:
        return cands[0], "format", {}, 0.0
    scores: dict[str, int] = {}
    rows = [(r.input_ids, r.loss_mask) for r in probe]
    cpu = 0.0
    for name in cands:
        checker = Checker(ParserConfig(str(tok.folder), opts.trust_remote_code, name, max_length, last_turn), tok, hf)
        scores[name] = sum(d is None for _t, d in checker.check(rows))
        cpu += checker.parser_cpu
    best = max(cands, key=lambda n: scores[n])  # the first listed among equals
    return best, "probe", scores, cpu


def _yaml(path: Path, header: str, doc: dict[str, Any]) -> None:
    path.write_text("".join(f"# {line}\n" for line in header.splitlines()) + yaml.safe_dump(doc, sort_keys=False))


def _configs(out: Path, r: OnlineResult, tok: LoadedTokenizer, opts: OnlineOptions) -> None:
    tail = (f"model.target_model_path must be the target model whose tokenizer rebuilt these samples:\n"
            f"  {tok.name} (files sha256 {tok.sha256}).\n")
    model: dict[str, Any] = {}
    if r.draft is not None:
        model = {"model": {"target_model_path": r.target_model_path, "trust_remote_code": opts.trust_remote_code,
                           "draft_model_config": DRAFT_CONFIG, "vocab_mapping_path": VOCAB_MAPPING}}
        tail += "Add training: and deployment: (online training: disaggregated, Mooncake; docs/operating.md).\n"
    else:
        tail += ("Online training needs model.vocab_mapping_path too: export with --model REF (the target) to have "
                 f"{VOCAB_MAPPING} and {DRAFT_CONFIG} written.\n")
    _yaml(out / CONFIG,
          f"SpecForge {SPECFORGE_VERSION} run config (specforge train -c CONFIG): the data section for {DATA},\n"
          f"preformatted text; {r.exact} of {r.samples} rows rebuilt by SpecForge's parser exactly as eyrie has them.\n"
          + tail + RUN_FROM_HERE, {**model, "data": {"train_data_path": DATA, "is_preformatted": True,
                                     "chat_template": r.chat_template, "train_only_last_turn": r.train_only_last_turn,
                                     "max_length": r.max_length}})
    _yaml(out / CONFIG_TOKENS,
          f"SpecForge {SPECFORGE_VERSION} run config: the data section for {TOKENS}, eyrie's ids and loss mask read "
          "as they are\n(pre-tokenized records: no chat template, no re-tokenization).\n" + tail + RUN_FROM_HERE,
          {**model, "data": {"prompts_path": TOKENS, "max_length": r.max_length}})


def auto_workers(rows: int, cores: int) -> int:
    """Parser processes by default: one per core, as long as each gets ROWS_PER_WORKER rows. A process
    costs seconds to start (its own torch, transformers, SpecForge and two tokenizer loads) and ~1 GB,
    which pays only over that many rows; below, the rows are parsed here, in one process."""
    return max(1, min(cores, rows // ROWS_PER_WORKER))


def export_specforge_online(store: Store, out_dir: str | Path, opts: OnlineOptions = OnlineOptions()
                            ) -> OnlineResult:
    """Write the run's samples for SpecForge's online training into `out_dir`, checked row by row."""
    t0, c0 = time.monotonic(), time.process_time()
    if opts.truncate and not opts.max_length:
        raise ExportError("--truncate needs --max-length N (SpecForge's data.max_length)")
    why = specforge_importable()
    verify = why is None if opts.verify is None else opts.verify
    if verify and why is not None:
        raise SpecForgeUnavailable(f"--verify: SpecForge's data code does not import here ({why}): "
                                   f"{install_hint(why)}; or pass --no-verify")
    if opts.model and why is not None:
        raise SpecForgeUnavailable(f"--model: the vocab mapping is made by SpecForge's own code, which does not "
                                   f"import here ({why}): {install_hint(why)}")
    run = _run_summary(store)
    fmt = str((run.get("chatTemplate") or {}).get("format") or "auto")
    shards = list_sample_shards(store)
    if not shards:
        raise ExportError(f"{store.url(layout.SAMPLES)}: no samples to export")
    tok = _tokenizer(run, opts)
    total, longest, packed, top_id = _scan(store, shards)
    r = OnlineResult(samples=total, verified=verify, train_only_last_turn=not packed,
                     max_length=opts.max_length or longest)
    if not verify:
        r.not_verified = "--no-verify" if why is None else f"SpecForge's data code does not import here ({why}): " \
            f"{install_hint(why)}"
    r.draft, r.model = _draft(opts, top_id)
    probe = []
    for row in _rows(store, shards):
        if len(row.input_ids) <= r.max_length or opts.truncate:
            probe.append(row)
        if len(probe) == PROBE_ROWS:
            break
    hf = _hf_tokenizer(tok, opts.trust_remote_code) if verify else None  # loaded once: a large vocabulary takes s
    r.chat_template, r.chosen_by, r.probe, probe_cpu = _choose(fmt, tok, hf, probe, opts, r.max_length,
                                                               r.train_only_last_turn, verify)
    out = Path(out_dir)
    prepare_dir(out, opts.overwrite, ours=_OURS)
    cfg = ParserConfig(str(tok.folder), opts.trust_remote_code, r.chat_template, r.max_length,
                       r.train_only_last_turn)
    workers = opts.workers or auto_workers(total, usable_cores())
    pool = Pool(cfg, workers, tok, hf) if verify else None
    try:
        with (out / DATA).open("wb") as data, (out / TOKENS).open("wb") as tokens, \
                (out / MISMATCHED).open("wb") as mism:
            _write(store, shards, r, opts, tok, pool, data, tokens, mism)
        if pool is not None:
            parser_cpu, r.cpu_seconds = pool.cpu()  # the workers' CPU; this process's is added below
            r.parser_cpu_seconds = probe_cpu + parser_cpu
    finally:
        if pool is not None:
            pool.close()
    if r.draft is not None:
        (out / DRAFT_CONFIG).write_text(orjson.dumps(r.draft, option=orjson.OPT_INDENT_2).decode() + "\n")
        _vocab_mapping(out, r)
        r.target_model_path = portable_target(str(r.model), out)
    _configs(out, r, tok, opts)
    r.seconds = round(time.monotonic() - t0, 3)
    r.cpu_seconds = round(r.cpu_seconds + time.process_time() - c0, 3)  # this process's and its workers'
    r.summary = _summary(store, out, r, run, tok, opts, workers)
    doc = orjson.dumps(r.summary, option=orjson.OPT_INDENT_2)
    (out / SUMMARY).write_bytes(doc + b"\n")
    store.put(layout.SPECFORGE_ONLINE, doc)
    return r


def _write(store: Store, shards: list[int], r: OnlineResult, opts: OnlineOptions, tok: LoadedTokenizer,
           pool: Pool | None, data: Any, tokens: Any, mism: Any) -> None:
    """One pass over the samples: every row into tokens.jsonl; the rows SpecForge rebuilds exactly
    (all with keep_mismatched) into data.jsonl; the others into mismatched.jsonl, counted by cause."""
    n = r.max_length
    pending: deque[SampleRow] = deque()  # rows sent to the parser, in order

    def chunks() -> Iterator[list[tuple[np.ndarray, np.ndarray]]]:
        batch: list[SampleRow] = []
        for row in _rows(store, shards):
            tokens.write(orjson.dumps({"id": row.sample_id, "input_ids": row.input_ids,
                                       "loss_mask": row.loss_mask}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            if r.draft is not None:  # the loss tokens SpecForge trains on from tokens.jsonl (cut at max_length)
                ids, counts = np.unique(row.input_ids[:n][row.loss_mask[:n] == 1], return_counts=True)
                r.loss_tokens.update(dict(zip(ids.tolist(), counts.tolist(), strict=True)))
            long = len(row.input_ids) > n
            r.over_max_length += long
            if long and not opts.truncate:
                r.mismatched["over_max_length"] += 1
                _example(r, row.sample_id, {"cause": "over_max_length", "position": n})
                mism.write(orjson.dumps({"id": row.sample_id, "cause": "over_max_length",
                                         "tokens": len(row.input_ids), "maxLength": n}) + b"\n")
                if opts.keep_mismatched:
                    _data_row(data, row.sample_id, tok.decode(row.input_ids.tolist()), r)
                continue
            batch.append(row)
            if len(batch) == CHUNK:
                pending.extend(batch)
                yield [(b.input_ids, b.loss_mask) for b in batch]
                batch = []
        if batch:
            pending.extend(batch)
            yield [(b.input_ids, b.loss_mask) for b in batch]

    if pool is None:  # not verified: every row is written as it is
        for chunk in chunks():
            for _ in chunk:
                row = pending.popleft()
                _data_row(data, row.sample_id, tok.decode(row.input_ids.tolist()), r)
        return
    for results in pool.run(chunks()):
        for text, diff in results:
            row = pending.popleft()
            if diff is None:
                r.exact += 1
                r.truncated += len(row.input_ids) > n
                _data_row(data, row.sample_id, text, r)
                continue
            r.mismatched[diff.cause] += 1
            _example(r, row.sample_id, diff.to_json())
            mism.write(orjson.dumps({"id": row.sample_id, **diff.to_json()}) + b"\n")
            if opts.keep_mismatched:
                _data_row(data, row.sample_id, text, r)


def _data_row(data: Any, sid: str, text: str, r: OnlineResult) -> None:
    data.write(orjson.dumps({"id": sid, "text": text}) + b"\n")
    r.written += 1


def _example(r: OnlineResult, sid: str, what: dict[str, Any]) -> None:
    if sum(e["cause"] == what["cause"] for e in r.examples) < EXAMPLES:
        r.examples.append({"id": sid, **what})


def _summary(store: Store, out: Path, r: OnlineResult, run: dict[str, Any], tok: LoadedTokenizer,
             opts: OnlineOptions, workers: int) -> dict[str, Any]:
    ct = run.get("chatTemplate") or {}
    return {
        "format": "specforge-online",
        "specforgeVersion": SPECFORGE_VERSION,
        "source": store.uri,
        "dir": str(out.resolve()),
        "chatFormat": ct.get("format"), "variant": ct.get("variant"),
        "tokenizer": {"name": tok.name, "sha256": tok.sha256},
        "chatTemplate": r.chat_template, "chosenBy": r.chosen_by, "probe": r.probe,
        "isPreformatted": True, "trainOnlyLastTurn": r.train_only_last_turn, "maxLength": r.max_length,
        "verified": r.verified, "notVerified": r.not_verified,
        "samples": r.samples,
        # rows SpecForge's parser rebuilds exactly as eyrie has them (None: not checked)
        "exact": r.exact if r.verified else None,
        "written": r.written, "keptMismatched": opts.keep_mismatched,
        "overMaxLength": r.over_max_length, "truncated": r.truncated,
        "mismatched": dict(sorted(r.mismatched.items())),
        "causes": {c: CAUSE_TEXT[c] for c in sorted(r.mismatched)},
        "examples": r.examples,
        "files": {"text": DATA, "tokens": TOKENS, "config": CONFIG, "configTokens": CONFIG_TOKENS,
                  "mismatched": MISMATCHED, "vocabMapping": VOCAB_MAPPING if r.draft else None,
                  "draftConfig": DRAFT_CONFIG if r.draft else None},
        "model": r.target_model_path,
        "draftVocabSize": r.draft["draft_vocab_size"] if r.draft else None,
        "workers": workers, "seconds": r.seconds,
        # CPU of the export's processes, and of it inside SpecForge's own parser: what is not eyrie's
        "cpuSeconds": r.cpu_seconds,
        "parserCpuSeconds": None if r.parser_cpu_seconds is None else round(r.parser_cpu_seconds, 3),
        "createdAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

"""`eyrie export specforge-online`: the samples as SpecForge's online training reads them, each row
checked by SpecForge's own parser (specforge==0.2.0, installed --no-deps), and read back by SpecForge's
own online entry point (`specforge.data.prompt_builder.prepare_prompt_tasks`, what `specforge train`
runs on `data.train_data_path` / `data.prompts_path`) and its run-config schema.

Formats: Kimi K2.5 (the synthetic Kimi vocabulary as a Hugging Face tokenizer, Kimi's special ids),
Qwen3 (Qwen's BPE) thinking and not, DeepSeek-V3.1 (on DeepSeek-V4's tokenizer.json), single- and
multi-turn with tool calls."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml

from eyrie.jobs.contract import layout
from eyrie.jobs.extract.specforge import ExportError
from eyrie.jobs.reconstruct.tokenizers import LoadedTokenizer, load_tokenizer
from eyrie.jobs.spec import TargetSpec
from tests.specforge_helpers import conversations, need_specforge, samples_store
from tests.tokenizer_helpers import kimi_hf_folder, qwen3_folder

# tier (tests/conftest.py): SpecForge's own parser and data code, run on every row (seconds a test)
pytestmark = pytest.mark.integration

@pytest.fixture(autouse=True)
def _specforge(monkeypatch, tmp_path_factory):
    need_specforge()
    # SpecForge's dataset path (datasets.load_dataset / map) caches under HF_DATASETS_CACHE: keep it in tmp
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path_factory.mktemp("hf-datasets")))


@pytest.fixture(scope="module")
def kimi(tmp_path_factory) -> LoadedTokenizer:
    return load_tokenizer(TargetSpec(model="m", tokenizer=str(kimi_hf_folder(tmp_path_factory.mktemp("kimi")))))


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> LoadedTokenizer:
    return load_tokenizer(TargetSpec(model="m", tokenizer=str(qwen3_folder(tmp_path_factory.mktemp("qwen")))))


@pytest.fixture(scope="module")
def deepseek() -> LoadedTokenizer:
    return load_tokenizer(TargetSpec(model="m", tokenizer="bundled:deepseek-v4"))


def export(store, out: Path, **kw):
    from eyrie.jobs.extract.specforge_online import OnlineOptions, export_specforge_online

    return export_specforge_online(store, out, OnlineOptions(**kw))


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def specforge_reads(out: Path, tok: LoadedTokenizer, config: str) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """What SpecForge's online trainer gets from a data-config snippet of the export: its run-config
    schema validates the section, then `prepare_prompt_tasks` (its one entry for train_data_path and
    prompts_path) reads the file; (ids, mask) per row, sorted (it shuffles raw text rows)."""
    from specforge.config.schema import DataConfig
    from specforge.data.prompt_builder import prepare_prompt_tasks
    from transformers import AutoTokenizer

    data = DataConfig(**yaml.safe_load((out / config).read_text())["data"])
    path = data.prompts_path or data.train_data_path
    with contextlib.chdir(out):  # its paths are relative to the export folder, where `specforge train` runs
        tasks = prepare_prompt_tasks(path, AutoTokenizer.from_pretrained(str(tok.folder)),
                                     chat_template=data.chat_template, max_length=data.max_length,
                                     is_preformatted=data.is_preformatted,
                                     train_only_last_turn=data.train_only_last_turn, cache_dir=None, cache_key=None,
                                     num_proc=1, min_loss_tokens=1)
    return sorted((tuple(t["payload"]["input_ids"]), tuple(t["payload"]["loss_mask"])) for t in tasks)


def eyrie_rows(samples) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    return sorted((tuple(s.input_ids), tuple(s.loss_mask)) for s in samples)


# --------------------------------------------------------------------------- exact hand-offs


@pytest.mark.integration
@pytest.mark.parametrize(("thinking", "template"), [(True, "qwen3-thinking"), (False, "qwen3-instruct")])
def test_qwen3_rows_are_rebuilt_by_specforge_exactly_and_its_trainer_reads_them_so(tmp_path, qwen, thinking,
                                                                                    template):
    store, samples = samples_store(tmp_path / "run", qwen, "qwen3", conversations(thinking))
    r = export(store, tmp_path / "sf")
    out = tmp_path / "sf"
    assert (r.chat_template, r.chosen_by) == (template, "probe")  # the template that fits, not a guess
    assert (r.samples, r.exact, r.written, dict(r.mismatched)) == (5, 5, 5, {})
    assert [row["text"] for row in lines(out / "data.jsonl")] == [qwen.decode(s.input_ids) for s in samples]
    # SpecForge's own online entry point, on the files as written: the same ids and loss masks as eyrie's
    assert specforge_reads(out, qwen, "data-config.yaml") == eyrie_rows(samples)
    assert specforge_reads(out, qwen, "data-config-tokens.yaml") == eyrie_rows(samples)
    cfg = yaml.safe_load((out / "data-config.yaml").read_text())["data"]
    assert cfg == {"train_data_path": "data.jsonl", "is_preformatted": True,
                   "chat_template": template, "train_only_last_turn": True, "max_length": max(len(s.input_ids)
                                                                                             for s in samples)}
    stored = json.loads(store.get(layout.SPECFORGE_ONLINE))  # the run's report reads it from there
    assert stored == json.loads((out / "eyrie_export.json").read_text())
    assert (stored["exact"], stored["samples"], stored["chatTemplate"], stored["tokenizer"]["sha256"]) == (
        5, 5, template, qwen.sha256)


def test_tokens_jsonl_is_every_sample_as_specforge_reads_pre_tokenized_records(tmp_path, kimi):
    store, samples = samples_store(tmp_path / "run", kimi, "kimi-k2.5", conversations(True))
    export(store, tmp_path / "sf")
    rows = lines(tmp_path / "sf" / "tokens.jsonl")
    assert [(r["input_ids"], r["loss_mask"]) for r in rows] == [(s.input_ids, s.loss_mask) for s in samples]
    assert specforge_reads(tmp_path / "sf", kimi, "data-config-tokens.yaml") == eyrie_rows(samples)


# ------------------------------------------------------------------ what SpecForge rebuilds otherwise


@pytest.mark.parametrize("thinking", [True, False])
def test_kimi_k25_rows_differ_at_the_boundary_token_and_are_excluded_saying_so(tmp_path, kimi, thinking):
    """SpecForge's kimi-k2-thinking/-instruct headers end at `<|im_middle|>`: its loss takes the `<think>`
    (thinking) or `<think></think>` (not) that K2.5's generation prompt ends with, which the model never
    generated. Every row is left out of data.jsonl, counted as mask_boundary, the difference decoded."""
    store, samples = samples_store(tmp_path / "run", kimi, "kimi-k2.5", conversations(thinking))
    r = export(store, tmp_path / "sf")
    assert r.chat_template == "kimi-k2-thinking"
    assert (r.exact, r.written, dict(r.mismatched)) == (0, 0, {"mask_boundary": 5})
    assert lines(tmp_path / "sf" / "data.jsonl") == []
    first = lines(tmp_path / "sf" / "mismatched.jsonl")[0]
    gen = "<think>" if thinking else "<think></think>"
    assert f"<|im_middle|>{gen}⟦" in first["eyrie"] and f"<|im_middle|>⟦{gen}" in first["specforge"]
    s0 = samples[0]
    assert first["position"] == s0.loss_mask.index(1) - (1 if thinking else 2)  # the prompt's last tokens
    assert r.summary["causes"]["mask_boundary"].startswith("mask differs at the answer's edge")
    # kept on request, counted all the same
    r2 = export(store, tmp_path / "kept", keep_mismatched=True)
    assert (r2.exact, r2.written, r2.mismatched["mask_boundary"]) == (0, 5, 5)


def test_a_template_whose_header_ends_where_the_answer_starts_rebuilds_kimi_exactly(tmp_path, kimi):
    """The cause is the header, and only it: registered with the generation prompt's `<think>` in its
    assistant header (what docs/operating.md gives for SpecForge's Python API), every row matches."""
    from specforge.data.template import TEMPLATE_REGISTRY, ChatTemplate

    TEMPLATE_REGISTRY.register("eyrie-kimi-k2.5-thinking", ChatTemplate(
        assistant_header="<|im_assistant|>assistant<|im_middle|><think>", user_header="<|im_user|>user<|im_middle|>",
        system_prompt=None, end_of_turn_token="<|im_end|>", parser_type="thinking", enable_thinking=True),
        override=True)
    store, _ = samples_store(tmp_path / "run", kimi, "kimi-k2.5", conversations(True))
    r = export(store, tmp_path / "sf", chat_template="eyrie-kimi-k2.5-thinking", workers=1)
    assert (r.exact, dict(r.mismatched), r.chosen_by) == (5, {}, "given")


def test_deepseek_v31_boundary_and_the_answer_after_a_tool_result(tmp_path, deepseek):
    """V3.1 answers after `<｜Assistant｜></think>` (non-thinking: what tool use takes), and an answer to a
    tool result follows `<｜tool▁output▁end｜>` with no header at all: SpecForge's loss then covers the
    earlier tool-call turn instead (train_only_last_turn keeps its last header)."""
    store, _ = samples_store(tmp_path / "run", deepseek, "deepseek-v3", conversations(False))
    r = export(store, tmp_path / "sf")
    assert r.chat_template == "deepseek-v3"
    assert dict(r.mismatched) == {"mask_boundary": 4, "mask_tool_turn": 1}
    tool = next(e for e in lines(tmp_path / "sf" / "mismatched.jsonl") if e["cause"] == "mask_tool_turn")
    assert tool["id"].startswith("after-tool")
    assert "<｜tool▁calls▁begin｜>" in tool["specforge"].split("⟦", 1)[1]  # its loss is on the tool call
    assert "⟦" not in tool["eyrie"]  # eyrie's loss is not there: it starts after the tool result


def test_a_wrong_template_name_excludes_every_row_and_says_why(tmp_path, qwen):
    store, _ = samples_store(tmp_path / "run", qwen, "qwen3", conversations(True))
    r = export(store, tmp_path / "sf", chat_template="llama3")
    assert (r.exact, r.written, dict(r.mismatched)) == (0, 0, {"no_answer_span": 5})
    assert "assistant header is not in the text" in r.summary["causes"]["no_answer_span"]


def test_an_unknown_template_and_a_format_specforge_has_none_for_are_refused_with_its_list(tmp_path, qwen):
    from eyrie.jobs.extract.specforge_online import specforge_templates

    store, _ = samples_store(tmp_path / "run", qwen, "qwen3", conversations(True))
    with pytest.raises(ExportError, match=r"no such template; it has: .*kimi-k2-thinking"):
        export(store, tmp_path / "sf", chat_template="kimi-k2.5")
    assert not (tmp_path / "sf").exists()  # refused before anything was written
    # chatFormat auto with a template none of SpecForge's headers appear in
    tpl = "{%- for m in messages -%}[{{ m.role }}]{{ m.content }}[/]{%- endfor -%}{%- if add_generation_prompt -%}" \
          "[assistant]{%- endif -%}"
    (tmp_path / "odd").mkdir()
    folder = qwen3_folder(tmp_path / "odd", tpl)
    odd = load_tokenizer(TargetSpec(model="m", tokenizer=str(folder)))
    recs = [conversations(False)[0]]
    recs[0]["request"].pop("reasoning")
    store2, _ = samples_store(tmp_path / "run2", odd, "auto", recs)
    with pytest.raises(ExportError, match="no chat template for chat format 'auto'") as e:
        export(store2, tmp_path / "sf2")
    assert all(n in str(e.value) for n in specforge_templates())


def test_longer_rows_are_counted_and_left_out_or_cut_and_compared_cut(tmp_path, qwen):
    store, samples = samples_store(tmp_path / "run", qwen, "qwen3", conversations(True))
    lengths = sorted(len(s.input_ids) for s in samples)
    n = lengths[2]
    r = export(store, tmp_path / "a", max_length=n)
    longer = sum(x > n for x in lengths)
    assert (r.over_max_length, r.mismatched["over_max_length"], r.exact) == (longer, longer, 5 - longer)
    r = export(store, tmp_path / "b", max_length=n, truncate=True)
    assert (r.exact, r.truncated, dict(r.mismatched)) == (5, longer, {})  # SpecForge cuts as eyrie compared
    with pytest.raises(ExportError, match="--truncate needs --max-length"):
        export(store, tmp_path / "c", truncate=True)


def test_the_default_is_a_parser_process_per_core_when_the_rows_pay_for_it():
    from eyrie.jobs.extract.specforge_online import ROWS_PER_WORKER, auto_workers

    assert auto_workers(50_000, 2) == 2 and auto_workers(16 * ROWS_PER_WORKER, 16) == 16
    assert auto_workers(3 * ROWS_PER_WORKER + 1, 16) == 3  # each process gets at least ROWS_PER_WORKER rows
    assert auto_workers(2 * ROWS_PER_WORKER - 1, 2) == 1 and auto_workers(10, 1) == 1


@pytest.mark.integration
def test_the_cli_spreads_the_parser_over_the_cores_by_default_with_the_same_bytes_in_row_order(
        tmp_path, deepseek, monkeypatch):
    from eyrie.jobs.cli.export import export_main
    from eyrie.jobs.extract import specforge_online
    from eyrie.jobs.extract.run import list_sample_shards, read_samples

    store, _ = samples_store(tmp_path / "run", deepseek, "deepseek-v3", conversations(False))
    monkeypatch.setattr(specforge_online, "CHUNK", 2)  # three chunks, in flight across the processes at once
    # data.jsonl holds every row (in order whichever process parsed it); no probe: all parsing is the processes'
    keep = ["--keep-mismatched", "--chat-template", "deepseek-v3"]
    assert export_main(["specforge-online", store.uri, str(tmp_path / "one"), *keep, "--workers", "1"]) == 0
    monkeypatch.setattr(specforge_online, "usable_cores", lambda: 2)  # a two-core machine, whatever this one is
    monkeypatch.setattr(specforge_online, "ROWS_PER_WORKER", 2)  # so that five rows pay for two processes
    assert export_main(["specforge-online", store.uri, str(tmp_path / "two"), *keep]) == 0  # the default workers
    one, two = (json.loads((tmp_path / d / "eyrie_export.json").read_text()) for d in ("one", "two"))
    assert (one["workers"], two["workers"]) == (1, 2)
    for doc in (one, two):  # the processes' CPU, and of it SpecForge's parser (in the workers too)
        assert 0 < doc["parserCpuSeconds"] < doc["cpuSeconds"], doc
    assert (two["exact"], two["mismatched"]) == (one["exact"], one["mismatched"]) and two["mismatched"]
    for name in ("data.jsonl", "tokens.jsonl", "mismatched.jsonl"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    order = [r.sample_id for shard in list_sample_shards(store) for r in read_samples(store, shard)]
    assert [r["id"] for r in lines(tmp_path / "two" / "tokens.jsonl")] == order
    assert [r["id"] for r in lines(tmp_path / "two" / "data.jsonl")] == order
    ids = [r["id"] for r in lines(tmp_path / "two" / "mismatched.jsonl")]
    assert ids == [i for i in order if i in set(ids)]


# ------------------------------------------------------------------------- refusals and the CLI


def test_without_specforge_the_rows_are_written_unchecked_and_verify_is_refused(tmp_path, qwen, monkeypatch):
    from eyrie.jobs.extract import specforge_online

    store, _ = samples_store(tmp_path / "run", qwen, "qwen3", conversations(True))
    no_specforge = "ModuleNotFoundError: No module named 'specforge'"
    monkeypatch.setattr(specforge_online, "specforge_importable", lambda: no_specforge)
    with pytest.raises(specforge_online.SpecForgeUnavailable, match=r"`pip install --no-deps specforge==0\.2\.0`"):
        export(store, tmp_path / "sf", verify=True)
    r = export(store, tmp_path / "sf")
    assert (r.verified, r.written, r.summary["exact"], r.chat_template, r.chosen_by) == (
        False, 5, None, "qwen3-thinking", "format")
    assert r.summary["parserCpuSeconds"] is None and r.summary["cpuSeconds"] > 0
    assert "`pip install --no-deps specforge==0.2.0`" in r.summary["notVerified"]  # the fix, said on the summary


@pytest.mark.parametrize(("missing", "command"), [
    ("ModuleNotFoundError: No module named 'specforge'", "`pip install --no-deps specforge==0.2.0`"),
    ("ModuleNotFoundError: No module named 'multiprocess'", "`pip install 'eyrie[specforge]'`"),
    ("ModuleNotFoundError: No module named 'datasets'", "`pip install 'eyrie[specforge]'`")])
def test_each_import_failure_names_the_command_that_fixes_it(tmp_path, qwen, monkeypatch, missing, command):
    """What a new user met: `No module named 'specforge'`, then `'multiprocess'`, and no word of the fix."""
    from eyrie.jobs.extract import specforge_online

    store, _ = samples_store(tmp_path / "run", qwen, "qwen3", conversations(True))
    monkeypatch.setattr(specforge_online, "specforge_importable", lambda: missing)
    both = "`pip install 'eyrie[specforge]' && pip install --no-deps specforge==0.2.0`"
    for kw in ({"model": "builtin:tiny-chat"}, {"verify": True}):
        with pytest.raises(specforge_online.SpecForgeUnavailable) as e:
            export(store, tmp_path / "sf", **kw)
        assert missing in str(e.value) and command in str(e.value) and both in str(e.value), str(e.value)
    assert not (tmp_path / "sf").exists()


def target_config(folder: Path, vocab: int) -> Path:
    """A target model's config.json alone (what --model reads): Llama-shaped, `vocab` ids."""
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=4096).save_pretrained(folder)
    return folder


def test_with_the_target_model_it_writes_the_vocab_mapping_and_draft_specforge_online_training_needs(tmp_path,
                                                                                                      qwen,
                                                                                                      monkeypatch):
    """SpecForge 0.2.0's online training refuses to start without model.vocab_mapping_path (its capture
    servers and trainer cannot derive one shared mapping): with --model the export writes it, by
    SpecForge's own mapping code from the loss tokens, and a draft config SpecForge builds its draft from;
    the draft loads the mapping, and `specforge train --plan` takes the run config the export's section makes."""
    import torch
    from specforge.algorithms.eagle3.providers import algorithm_providers
    from specforge.algorithms.model_providers import build_eagle3_draft
    from specforge.cli import main as specforge_main
    from specforge.config.schema import Config
    from specforge.training.model_loading import resolve_draft_config

    store, samples = samples_store(tmp_path / "run", qwen, "qwen3", conversations(True))
    vocab = 151_936  # Qwen3's padded vocabulary, beyond its tokenizer's ids
    model = target_config(tmp_path / "target", vocab)
    out = tmp_path / "sf"
    r = export(store, out, model=str(model))
    loss = {}
    for s in samples:
        for t, m in zip(s.input_ids, s.loss_mask, strict=True):
            if m:
                loss[t] = loss.get(t, 0) + 1
    assert dict(r.loss_tokens) == loss
    mapping = torch.load(out / "vocab-mapping.pt")
    d2t, t2d = mapping["d2t"], mapping["t2d"]
    assert d2t.shape == (32000,) and t2d.shape == (vocab,) and int(t2d.sum()) == 32000
    chosen = set((torch.arange(32000) + d2t).tolist())
    assert chosen == set(torch.nonzero(t2d).flatten().tolist()) and set(loss) <= chosen  # every loss token mapped
    section = yaml.safe_load((out / "data-config-tokens.yaml").read_text())
    # portable: paths relative to the export folder (a local target too), where `specforge train` runs
    assert section["model"] == {"target_model_path": os.path.relpath(model, out), "trust_remote_code": False,
                                "draft_model_config": "draft-config.json", "vocab_mapping_path": "vocab-mapping.pt"}
    monkeypatch.chdir(out)
    assert yaml.safe_load((out / "data-config.yaml").read_text())["model"] == section["model"]
    run = {**section, "training": {"strategy": "eagle3"},
           "deployment": {"mode": "disaggregated", "disaggregated": {
               "backend": "mooncake", "control_dir": str(tmp_path / "control"), "server_urls": ["http://capture:30000"],
               "mooncake_metadata_server": "http://mooncake:8080/metadata",
               "mooncake_master_server_addr": "mooncake:50051"}},
           "output_dir": str(tmp_path / "draft")}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    assert specforge_main(["train", "-c", str(tmp_path / "run.yaml"), "--plan"]) == 0
    # the draft SpecForge builds from draft-config.json takes the mapping (shapes of the target's vocabulary)
    cfg = Config.model_validate({**run, "model": {**section["model"], "load_target_embedding": False}})
    draft_cfg = resolve_draft_config(cfg, provider=algorithm_providers().model.draft_config)
    assert (draft_cfg.vocab_size, draft_cfg.draft_vocab_size, draft_cfg.hidden_size) == (vocab, 32000, 64)
    # 4 layers: SpecForge's default [1, L/2-1, L-4] would be [1, 1, 0], which its capture refuses
    assert draft_cfg.eagle_config == {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    draft = build_eagle3_draft(cfg, draft_cfg)
    assert draft.vocab_mapping_loaded and torch.equal(draft.t2d.cpu(), t2d) and torch.equal(draft.d2t.cpu(), d2t)
    summary = json.loads((out / "eyrie_export.json").read_text())
    assert (summary["files"]["vocabMapping"], summary["draftVocabSize"], summary["model"]) == (
        "vocab-mapping.pt", 32000, os.path.relpath(model, out))


def test_the_vocab_mapping_is_specforges_own_to_the_bit():
    """eyrie takes SpecForge's choice of the draft vocabulary and rebuilds only t2d (SpecForge's own scan
    is quadratic): equal to SpecForge's process_token_dict_to_mappings, ties, padding and all."""
    import random
    from collections import Counter

    import torch
    from specforge.data.preprocessing import process_token_dict_to_mappings

    from eyrie.jobs.extract.specforge_online import vocab_mapping

    rng = random.Random(3)
    for n_tokens, draft in ((300, 64), (40, 64), (500, 500)):  # more tokens than the draft, fewer, as many
        counts = Counter({rng.randrange(1000): rng.randint(1, 5) for _ in range(n_tokens)})
        ours = vocab_mapping(counts, draft, 1000)
        theirs = process_token_dict_to_mappings(Counter(counts), draft, 1000)
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1]) and ours[1].dtype == torch.bool


def test_a_target_model_that_does_not_hold_the_samples_ids_is_refused_before_writing(tmp_path, qwen):
    store, _ = samples_store(tmp_path / "run", qwen, "qwen3", conversations(True))
    with pytest.raises(ExportError, match="not the model whose tokenizer rebuilt them"):
        export(store, tmp_path / "sf", model=str(target_config(tmp_path / "small", 1000)))
    with pytest.raises(ExportError, match=r"its config\.json cannot be read"):
        export(store, tmp_path / "sf", model=str(tmp_path / "missing"))
    assert not (tmp_path / "sf").exists()
    export(store, tmp_path / "sf")  # without --model: no mapping, and the section says what is missing
    assert not (tmp_path / "sf" / "vocab-mapping.pt").exists()
    section = (tmp_path / "sf" / "data-config.yaml").read_text()
    assert "needs model.vocab_mapping_path too: export with --model" in section


def test_the_tokenizer_must_be_the_one_the_samples_were_rebuilt_with(tmp_path, qwen, kimi):
    store, _ = samples_store(tmp_path / "run", qwen, "qwen3", conversations(True))
    with pytest.raises(ExportError, match="but the samples were rebuilt with"):
        export(store, tmp_path / "sf", tokenizer=str(kimi.folder))
    tik = load_tokenizer(TargetSpec(model="m", tokenizer=str(Path(__file__).parents[1] / "data" / "kimi_synthetic")))
    store2, _ = samples_store(tmp_path / "run2", tik, "kimi-k2.5", conversations(True)[:1])
    with pytest.raises(ExportError, match="--trust-remote-code"):
        export(store2, tmp_path / "sf2")


def test_cli_prints_what_specforge_will_train_on_and_refuses_a_used_folder(tmp_path, kimi, capsys):
    from eyrie.jobs.cli.export import export_main

    store, _ = samples_store(tmp_path / "run", kimi, "kimi-k2.5", conversations(True))
    out = str(tmp_path / "sf")
    assert export_main(["specforge-online", store.uri, out]) == 0
    text = capsys.readouterr().out
    assert "SpecForge 0.2.0 will train on 0 of 5 rows exactly as eyrie rebuilt them" in text
    assert "5 mask_boundary" in text and "first difference: sample" in text
    assert "inside SpecForge's own parser" in text
    with pytest.raises(ExportError, match="not empty"):
        export_main(["specforge-online", store.uri, out])
    (tmp_path / "sf" / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="did not write"):
        export_main(["specforge-online", store.uri, out, "--overwrite"])
    (tmp_path / "sf" / "notes.txt").unlink()
    assert export_main(["specforge-online", store.uri, out, "--overwrite", "--keep-mismatched"]) == 0
    assert len(lines(tmp_path / "sf" / "data.jsonl")) == 5


def test_first_difference_is_shown_decoded_with_the_loss_marked():
    from eyrie.jobs.extract.specforge_check import compare

    def decode(ids):
        return "".join(chr(i) for i in ids)

    ids = np.array([ord(c) for c in "<a>xyz"])
    ours, theirs = np.array([0, 0, 0, 1, 1, 1]), np.array([0, 0, 1, 1, 1, 1])
    d = compare(ids, ours, ids, theirs, decode)
    assert (d.cause, d.position, d.ours, d.theirs) == ("mask_boundary", 2, "<a>⟦xyz⟧", "<a⟦>xyz⟧")
    assert compare(ids, ours, ids, ours, decode) is None
    other = np.array([ord(c) for c in "<a>xyq"])
    assert compare(ids, ours, other, ours, decode).cause == "retokenized"
    hist = np.array([1, 1, 0, 0, 0, 0, 0, 0, 1, 1])
    assert compare(np.arange(10), np.array([0] * 8 + [1, 1]), np.arange(10), hist, decode).cause == "mask_history"
    turn = np.array([0, 1, 1, 0, 0, 0, 0, 0, 0, 0])
    assert compare(np.arange(10), np.array([0] * 7 + [1] * 3), np.arange(10), turn, decode).cause == "mask_tool_turn"
    inside = np.array([0] * 3 + [1, 1, 0, 0, 1, 1, 1])
    assert compare(np.arange(10), np.array([0] * 3 + [1] * 7), np.arange(10), inside, decode).cause == "mask_inside"
    assert compare(np.arange(4), np.array([0, 0, 1, 1]), np.arange(4), np.zeros(4), decode).cause == "no_answer_span"


def test_the_report_shows_how_many_rows_specforge_trains_on_exactly(tmp_path, qwen):
    import io

    from rich.console import Console

    from eyrie.jobs.report.data import collect
    from eyrie.jobs.report.html import render
    from eyrie.jobs.report.terminal import print_report

    store, _ = samples_store(tmp_path / "run", qwen, "qwen3", conversations(True))
    export(store, tmp_path / "sf", max_length=200)
    d = collect(store)
    buf = io.StringIO()
    print_report(d, Console(file=buf, width=200))
    text = buf.getvalue()
    over = d.specforge_online["mismatched"]["over_max_length"]
    assert "SpecForge online hand-off" in text
    assert f"{5 - over} of 5 rows exactly as eyrie rebuilt them" in text and f"over_max_length {over}" in text
    assert f"{5 - over} of 5 rows exactly as eyrie rebuilt them" in render(d)


def test_the_run_config_names_a_target_that_exists_where_specforge_trains(tmp_path):
    """A builtin demo target exists only in eyrie's package or cache: it is copied into the export and
    named relatively; a model id stays an id; a local folder is named relative to the export folder."""
    from eyrie.jobs.extract.run import builtin_model, is_builtin_folder
    from eyrie.jobs.extract.specforge import TARGET_MODEL, portable_target

    out = tmp_path / "sf"
    out.mkdir()
    chat = builtin_model("builtin:tiny-chat")
    assert is_builtin_folder(chat) and portable_target(chat, out) == TARGET_MODEL
    assert sorted(p.name for p in (out / TARGET_MODEL).iterdir()) == sorted(p.name for p in Path(chat).iterdir())
    assert (out / TARGET_MODEL / "config.json").read_bytes() == (Path(chat) / "config.json").read_bytes()
    assert portable_target("moonshotai/Kimi-K2.5", out) == "moonshotai/Kimi-K2.5"
    (tmp_path / "models" / "mine").mkdir(parents=True)
    assert not is_builtin_folder(str(tmp_path / "models" / "mine"))
    assert portable_target(str(tmp_path / "models" / "mine"), out) == "../models/mine"

"""The SGLang capture glue, exercised on CPU with stand-ins for SGLang's objects (SGLang needs CUDA).

The stand-ins mirror sglang 0.5.23 where it matters (tests/extract/test_sglang_pin.py checks the names
against the pinned wheel): `sglang.srt.distributed` does not re-export the deprecated rank getters,
the rank comes from `sglang.srt.runtime_context.get_parallel()`, plugins are found through
`importlib.metadata` entry points, and hook exceptions never reach the driver by themselves.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import types
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import safetensors.torch
import torch

from eyrie.jobs.contract.extraction import ExtractionError
from eyrie.jobs.contract.layers import spool_bytes
from eyrie.jobs.extract import sglang_backend as sb
from eyrie.jobs.extract.hf_backend import build_tiny_model

# ------------------------------------------------------------------ stand-ins for SGLang's objects


class Layer(torch.nn.Module):
    pass


class ListInner(torch.nn.Module):
    """Llama/Qwen2/DeepSeek: the decoder loop checks `i in layers_to_capture`."""

    def __init__(self, n: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer() for _ in range(n))
        self.layers_to_capture: list[int] = []


class ListModel(torch.nn.Module):
    """LlamaForCausalLM.set_eagle3_layers_to_capture as in 0.5.23: stores id + 1."""

    def __init__(self, n: int):
        super().__init__()
        self.config = SimpleNamespace(num_hidden_layers=n)
        self.model = ListInner(n)
        self.capture_aux_hidden_states = False

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        n = self.config.num_hidden_layers
        self.capture_aux_hidden_states = True
        self.model.layers_to_capture = ([2, n // 2, n - 3] if layer_ids is None else [v + 1 for v in layer_ids])


class DeepseekModel(ListModel):
    """DeepseekV2ForCausalLM in 0.5.23: adds 1 only when the first id is 1."""

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        if layer_ids is None or layer_ids[0] == 1:
            super().set_eagle3_layers_to_capture(layer_ids)
        else:
            self.capture_aux_hidden_states = True
            self.model.layers_to_capture = list(layer_ids)


class FlagInner(ListInner):
    """Qwen2MoeModel: the decoder loop checks each layer's `_is_layer_to_capture`, set only here."""

    def set_eagle3_layers_to_capture(self, layers_to_capture):
        self.layers_to_capture = layers_to_capture
        for i in layers_to_capture:
            self.layers[i]._is_layer_to_capture = True

    def will_capture(self) -> list[int]:
        return [i for i, layer in enumerate(self.layers) if getattr(layer, "_is_layer_to_capture", False)]


class FlagModel(ListModel):
    """Qwen2MoeForCausalLM / Qwen3MoeForCausalLM in 0.5.23."""

    def __init__(self, n: int):
        super().__init__(n)
        self.model = FlagInner(n)

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        n = self.config.num_hidden_layers
        self.capture_aux_hidden_states = True
        self.model.set_eagle3_layers_to_capture([2, n // 2, n - 3] if layer_ids is None
                                                else [v + 1 for v in layer_ids])


class RawFlagModel(FlagModel):
    """A model file that stores the ids as given (no + 1): must be refused, not silently shifted."""

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        self.capture_aux_hidden_states = True
        self.model.set_eagle3_layers_to_capture(list(layer_ids))


class Mode:
    def __init__(self, extend: bool):
        self.extend = extend

    def is_extend(self):
        return self.extend

    def is_target_verify(self):
        return False


def _batch(rids, lens, prefixes, extend=True):
    return SimpleNamespace(forward_mode=Mode(extend), rids=rids, extend_seq_lens_cpu=lens,
                           extend_prefix_lens_cpu=prefixes)


class HookType(Enum):
    BEFORE = "before"
    AROUND = "around"


class HookRegistry:
    _hooks: ClassVar[dict[str, list[tuple[HookType, Any]]]] = {}
    _patched: ClassVar[set[str]] = set()

    @classmethod
    def register(cls, target, hook, hook_type):
        cls._hooks.setdefault(target, []).append((hook_type, hook))


@pytest.fixture
def sglang(monkeypatch, tmp_path):
    """The SGLang modules the hooks import, shaped as in 0.5.23; returns the process's parallel state."""
    parallel = SimpleNamespace(tp_rank=0)
    names = ("sglang", "sglang.srt", "sglang.srt.distributed", "sglang.srt.runtime_context",
             "sglang.srt.plugins", "sglang.srt.plugins.hook_registry")
    mods = {n: types.ModuleType(n) for n in names}
    # 0.5.23's distributed package star-imports parallel_state, whose __all__ leaves the
    # deprecated getters (get_tensor_model_parallel_rank, ...) out: nothing to import from here
    mods["sglang.srt.runtime_context"].get_parallel = lambda: parallel
    reg = mods["sglang.srt.plugins.hook_registry"]
    reg.HookType = HookType
    reg.HookRegistry = type("HookRegistry", (HookRegistry,), {"_hooks": {}, "_patched": set()})
    for n, m in mods.items():
        monkeypatch.setitem(sys.modules, n, m)
    monkeypatch.setattr(sb, "SHM", tmp_path / "shm")
    (tmp_path / "shm").mkdir()
    return SimpleNamespace(parallel=parallel, modules=mods, registry=reg.HookRegistry)


def _cfg(tmp_path: Path, layers=(3, 30, 57)) -> sb.CaptureConfig:
    for d in ("spool", "status"):
        (tmp_path / d).mkdir(exist_ok=True)
    return sb.CaptureConfig(spool=str(tmp_path / "spool"), status=str(tmp_path / "status"), layers=list(layers))


def _ready(cfg: sb.CaptureConfig) -> list[dict]:
    return [json.loads(p.read_text()) for p in Path(cfg.status).glob("ready.*.json")]


# ---------------------------------------------------------------------- defect 1: the TP rank


def test_the_rank_comes_from_get_parallel_and_only_rank_zero_writes(tmp_path, sglang):
    """0.5.23's `sglang.srt.distributed` has no get_tensor_model_parallel_rank to import (ImportError
    inside LogitsProcessor.forward kills SGLang's process tree); the rank is `get_parallel().tp_rank`."""
    cfg = _cfg(tmp_path)
    x = torch.ones(3, 2)
    sglang.parallel.tp_rank = 1
    sb.capture_forward(lambda *a, **k: None, "s", "i", x, "h", _batch(["eyrie-a"], [3], [0]), [x], cfg=cfg)
    assert list(Path(cfg.spool).iterdir()) == []
    sglang.parallel.tp_rank = 0
    sb.capture_forward(lambda *a, **k: None, "s", "i", x, "h", _batch(["eyrie-a"], [3], [0], extend=False), [x],
                       cfg=cfg)
    assert list(Path(cfg.spool).iterdir()) == []  # decode steps are ignored
    sb.capture_forward(lambda *a, **k: None, "s", "i", x, "h", _batch(["eyrie-a"], [3], [0]), [x], cfg=cfg)
    assert [p.name for p in Path(cfg.spool).iterdir()] == ["eyrie-a.0000000000.safetensors"]
    assert sb.recorded_errors(Path(cfg.status)) == []


def test_capture_forward_saves_each_eyrie_request_and_chunks_assemble(tmp_path, sglang):
    cfg = _cfg(tmp_path)
    spool = Path(cfg.spool)
    h, k = 4, 3
    full_aux = torch.arange(10 * k * h, dtype=torch.float32).reshape(10, k * h)
    full_last = -torch.arange(10 * h, dtype=torch.float32).reshape(10, h)
    other = torch.zeros(2, h)
    calls = []

    def original(*args, **kwargs):
        calls.append(len(args))
        return "logits"

    # chunk 1: eyrie-a tokens 0..5, a foreign request (warmup) with 2 tokens; chunk 2: eyrie-a 6..9
    aux1 = [torch.cat([full_aux[:6, i * h:(i + 1) * h], other]) for i in range(k)]  # SGLang's list form
    last1 = torch.cat([full_last[:6], other])
    out = sb.capture_forward(original, "self", "ids", last1, "head", _batch(["eyrie-a", "warmup"], [6, 2], [0, 0]),
                             aux1, cfg=cfg)
    assert out == "logits" and calls == [6]
    sb.capture_forward(original, "self", "ids", full_last[6:], "head", _batch(["eyrie-a"], [4], [6]),
                       aux_hidden_states=full_aux[6:], cfg=cfg)
    assert sorted(p.name for p in spool.iterdir()) == ["eyrie-a.0000000000.safetensors",
                                                       "eyrie-a.0000000006.safetensors"]
    aux, last = sb.assemble(spool, Path(cfg.status), "eyrie-a", 10)
    assert torch.equal(aux, full_aux) and torch.equal(last, full_last)
    assert list(spool.iterdir()) == []  # consumed


# ------------------------------------------------------- defect 2: what the model will capture


@pytest.mark.parametrize("model_cls", [ListModel, FlagModel, DeepseekModel])
def test_the_model_captures_exactly_the_manifest_layers(tmp_path, sglang, model_cls):
    """Flag families (Qwen2/3-MoE, Qwen3-Next, Qwen3.5, MiniMax-M3) capture where their setter put
    `_is_layer_to_capture`; overwriting `layers_to_capture` afterwards leaves the default flags."""
    cfg = _cfg(tmp_path, layers=(3, 30, 57))
    runner = SimpleNamespace(model=model_cls(61), is_draft_worker=False)
    sb.enable_capture(runner, cfg=cfg)
    assert sb.recorded_errors(Path(cfg.status)) == []
    inner = runner.model.model
    assert sorted(inner.layers_to_capture) == [3, 30, 57]
    if isinstance(inner, FlagInner):
        assert inner.will_capture() == [3, 30, 57]
    (ready,) = _ready(cfg)
    assert ready["layers"] == [3, 30, 57] and ready["tpRank"] == 0


def test_a_model_that_would_capture_other_layers_is_refused_with_the_cause(tmp_path, sglang):
    cfg = _cfg(tmp_path, layers=(3, 30, 57))
    sb.enable_capture(SimpleNamespace(model=RawFlagModel(61), is_draft_worker=False), cfg=cfg)  # does not raise
    assert _ready(cfg) == []
    with pytest.raises(ExtractionError, match=r"capture the inputs of layers \[2, 29, 56\], not \[3, 30, 57\]"):
        sb.handshake(Path(cfg.status), 1, [3, 30, 57])
    with pytest.raises(sb.SGLangCaptureError, match="Linear cannot capture"):
        sb.configure_capture(torch.nn.Linear(1, 1), [1])


def test_flags_and_list_must_agree(tmp_path):
    model = FlagModel(10)
    model.set_eagle3_layers_to_capture(None)  # flags at the default 2, 5, 7
    model.model.layers_to_capture = [3, 5, 8]
    with pytest.raises(sb.SGLangCaptureError, match=r"flagged _is_layer_to_capture \(\[2, 5, 7\]\).*\[3, 5, 8\]"):
        sb.captured_layers(model)


def test_a_model_whose_capture_switch_stays_off_is_refused():
    class SwitchOff(ListModel):
        def set_eagle3_layers_to_capture(self, layer_ids=None):
            self.model.layers_to_capture = [v + 1 for v in layer_ids]

    with pytest.raises(sb.SGLangCaptureError, match=r"SwitchOff\.capture_aux_hidden_states is off"):
        sb.configure_capture(SwitchOff(10), [2, 5, 7])


# ------------------------------------------------------------------------ defect 3: the spool


def test_a_default_batch_does_not_fit_a_default_pods_dev_shm():
    """The issue's arithmetic: a 16,384-token batch of 3 aux + last in bf16 vs 64 MiB of /dev/shm."""
    assert spool_bytes(16384, 3, 4096, 2) == 512 * 2**20
    assert spool_bytes(16384, 3, 8192, 2) == 2**30


def test_start_refuses_when_the_spool_cannot_hold_one_batch(tmp_path, sglang):
    engines = []
    sglang.modules["sglang"].Engine = lambda **kw: engines.append(kw)
    model = build_tiny_model(tmp_path / "m", 64, 32, layers=8, context=64)
    be = sb.SGLangBackend(str(model), max_tokens_per_batch=10**14)
    with pytest.raises(sb.SpoolTooSmall, match=r"one batch \(extraction.maxTokensPerBatch 100000000000000 tokens"
                                               r".*mount a larger memory-backed volume at /dev/shm"):
        be.hidden_states([[1, 2, 3]], [2, 4, 5])
    assert engines == []  # refused before the model is loaded
    be.close()


# -------------------------------------------------- defect 4: failures reach the user, with cause


def test_a_hook_error_never_raises_inside_sglang_and_reaches_the_driver(tmp_path, sglang):
    cfg = _cfg(tmp_path)
    x = torch.ones(3, 2)
    # capture is off: before, this raised inside LogitsProcessor.forward and SGLang killed the driver
    out = sb.capture_forward(lambda *a, **k: "logits", "s", "i", x, "h", _batch(["eyrie-a"], [3], [0]), None,
                             cfg=cfg)
    assert out == "logits"
    with pytest.raises(ExtractionError, match=r"capture hook failed in SGLang \(forward, pid \d+\) \(requests "
                                              r"eyrie-a\): SGLangCaptureError: no auxiliary hidden states"):
        sb.assemble(Path(cfg.spool), Path(cfg.status), "eyrie-a", 3, timeout=30)


def test_assemble_names_the_request_when_pieces_are_missing(tmp_path):
    (tmp_path / "status").mkdir()
    safetensors.torch.save_file({"aux_hidden": torch.zeros(2, 6), "last_hidden": torch.zeros(2, 2)},
                                str(tmp_path / "eyrie-b.0000000004.safetensors"))
    with pytest.raises(sb.SGLangCaptureError, match=r"request eyrie-b: captured 0 of 6 positions \(pieces at \[4\]\)"):
        sb.assemble(tmp_path, tmp_path / "status", "eyrie-b", 6, timeout=0.1)


def test_handshake_reports_ranks_without_the_plugin_and_unapplied_hooks(tmp_path):
    status = tmp_path
    with pytest.raises(sb.SGLangCaptureError, match=r"TP rank\(s\) \[0, 1\].*eyrie_hidden_capture.*did not run"):
        sb.handshake(status, 2, [2, 4, 5])
    (status / "ready.tp0.1.json").write_text(json.dumps(
        {"tpRank": 0, "pid": 1, "model": "M", "layers": [2, 4, 5], "hooks": [sb.HOOK_INIT]}))
    with pytest.raises(sb.SGLangCaptureError, match=r"TP rank 0: hook\(s\) \['sglang.srt.layers.logits_processor"):
        sb.handshake(status, 1, [2, 4, 5])


def test_a_plugin_that_does_not_import_is_reported_before_sglang_starts(tmp_path, monkeypatch):
    dist = tmp_path / "broken-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text(f"[{sb.PLUGIN_GROUP}]\n{sb.PLUGIN_NAME} = eyrie_no_such_module:f\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(sb.SGLangCaptureError, match=r"eyrie_no_such_module:f does not import: ModuleNotFoundError"):
        sb.check_plugin_loads()


class FakeEngine:
    """sglang.Engine as far as the capture sees it: loads plugins through entry points, initialises
    each TP rank's model runner through the hooked method, and runs the hooked logits processor
    on a prefill; hidden states are a function of the token ids so the driver's output can be checked."""

    model_cls: type = FlagModel
    num_layers = 8
    hidden = 4

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.generated = 0
        reg = sys.modules["sglang.srt.plugins.hook_registry"].HookRegistry
        parallel = sys.modules["sglang.srt.runtime_context"].get_parallel()
        from importlib.metadata import entry_points

        for ep in entry_points(group=sb.PLUGIN_GROUP):
            with contextlib.suppress(Exception):  # SGLang logs a failing plugin and goes on
                ep.load()()
        reg._patched.update(reg._hooks)
        self.hooks = {t: h for t, hooks in reg._hooks.items() for _ty, h in hooks}
        for rank in range(kwargs["tp_size"]):
            parallel.tp_rank = rank
            if sb.HOOK_INIT in self.hooks:
                self.hooks[sb.HOOK_INIT](SimpleNamespace(model=self.model_cls(self.num_layers), is_draft_worker=False))
        parallel.tp_rank = 0

    @classmethod
    def states(cls, ids: list[int], k: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.tensor(ids, dtype=torch.float32)[:, None]
        return t.repeat(1, k * cls.hidden) + 0.5, -t.repeat(1, cls.hidden)

    def generate(self, input_ids, sampling_params, rid):
        self.generated += 1
        assert all(p["max_new_tokens"] == 1 for p in sampling_params)
        k = len(json.loads(os.environ[sb.CAPTURE_ENV])["layers"])
        aux, last = zip(*(self.states(x, k) for x in input_ids), strict=True)
        batch = _batch(rid, [len(x) for x in input_ids], [0] * len(input_ids))
        self.hooks[sb.HOOK_LOGITS](lambda *a, **kw: "logits", "self", None, torch.cat(last), None, batch,
                                   torch.cat(aux))

    def shutdown(self):
        pass


def test_the_backend_end_to_end_with_a_stand_in_engine(tmp_path, sglang):
    sglang.modules["sglang"].Engine = FakeEngine
    model = build_tiny_model(tmp_path / "m", 64, 32, layers=8, context=64)
    be = sb.SGLangBackend(str(model), tp_size=2, engine_args={"chunked_prefill_size": 64})
    batch = [[1, 2, 3], [7, 8]]
    out = be.hidden_states(batch, [2, 4, 5])
    for x, (aux, last) in zip(batch, out, strict=True):
        want_aux, want_last = FakeEngine.states(x, 3)
        assert torch.equal(aux, want_aux) and torch.equal(last, want_last)
    assert be.engine.kwargs["disable_radix_cache"] is True and be.engine.kwargs["chunked_prefill_size"] == 64
    be.close()
    assert sb.CAPTURE_ENV not in os.environ


class ScoringEngine(FakeEngine):
    """Also answers `return_logprob` the way 0.5.23 does: per input token from logprob_start_len on,
    (logprob, id, text) and top-k lists of such, the first entry empty. Its "model" prefers token 0
    after odd positions and the given token after even ones."""

    def generate(self, input_ids, sampling_params, rid, **kw):
        super().generate(input_ids, sampling_params, rid)
        self.logprob_kwargs = kw
        outs = []
        for b, x in enumerate(input_ids):
            if not kw.get("return_logprob", [False] * len(input_ids))[b]:
                outs.append({"meta_info": {}})
                continue
            s = kw["logprob_start_len"][b]
            assert kw["top_logprobs_num"][b] == 1
            tokens, tops = [(None, x[s], None)], [None]
            for p in range(s + 1, len(x)):
                agree = p % 2 == 0
                tokens.append((-0.5 if agree else -2.0, x[p], None))
                tops.append([(-0.5, x[p] if agree else 0, None)])
            outs.append({"meta_info": {"input_token_logprobs": tokens, "input_top_logprobs": tops}})
        return outs


def test_scores_come_from_the_engines_input_logprobs_in_the_same_prefill(tmp_path, sglang):
    sglang.modules["sglang"].Engine = ScoringEngine
    model = build_tiny_model(tmp_path / "m", 64, 32, layers=8, context=64)
    be = sb.SGLangBackend(str(model), tp_size=1)
    batch = [[1, 2, 3, 4, 5, 6], [7, 8, 9]]
    out = be.forward(batch, [2, 4, 5], score_from=[3, None])
    assert be.engine.generated == 1  # hidden states and scores from one prefill
    assert be.engine.logprob_kwargs == {"return_logprob": [True, False], "logprob_start_len": [2, -1],
                                        "top_logprobs_num": [1, 0]}
    s = out[0].scores
    assert s is not None and s.start == 3 and out[1].scores is None
    assert s.logprob.tolist() == [-2.0, -0.5, -2.0] and s.top1.tolist() == [False, True, False]
    want_aux, _ = FakeEngine.states(batch[0], 3)
    assert torch.equal(out[0].aux, want_aux)
    be.close()


def test_engine_scores_refuse_a_misaligned_answer():
    meta = {"input_token_logprobs": [(None, 5, None), (-1.0, 6, None)], "input_top_logprobs": [None, [(-1.0, 6, None)]]}
    scores = sb.engine_scores(meta, [4, 5, 6], 2, "r")
    assert scores.logprob.tolist() == [-1.0] and scores.top1.tolist() == [True]  # a tie with the best agrees
    with pytest.raises(sb.SGLangCaptureError, match="returned 2 input log-probs and 2 top log-probs for 3"):
        sb.engine_scores(meta, [4, 5, 6, 7], 2, "r")
    with pytest.raises(sb.SGLangCaptureError, match="is for token 6, not 9"):
        sb.engine_scores(meta, [4, 5, 9], 2, "r")
    with pytest.raises(sb.SGLangCaptureError, match="returned no input log-probs"):
        sb.engine_scores({}, [4, 5, 6], 2, "r")


def test_without_the_plugin_in_sglang_the_first_batch_fails_fast_with_the_cause(tmp_path, sglang, monkeypatch):
    """SGLang swallows a plugin that fails; before, every request then waited 30 s for 'captured 0 of N'."""

    class NoPluginEngine(FakeEngine):
        def __init__(self, **kwargs):
            # the plugin cannot import an SGLang name (a renamed HookType, say)
            monkeypatch.delattr(sys.modules["sglang.srt.plugins.hook_registry"], "HookType")
            super().__init__(**kwargs)

    sglang.modules["sglang"].Engine = NoPluginEngine
    model = build_tiny_model(tmp_path / "m", 64, 32, layers=8, context=64)
    be = sb.SGLangBackend(str(model))
    with pytest.raises(ExtractionError, match=r"capture hook failed in SGLang \(plugin, pid \d+\): "
                                              r"ImportError: cannot import name 'HookType'"):
        be.hidden_states([[1, 2, 3]], [2, 4, 5])
    assert be.engine.generated == 0  # no request was sent
    be.close()


# -------------------------------------------------- engine arguments that split the captured rows


@pytest.mark.parametrize("arg", [{"attn_dp_size": 2}, {"enable_dp_attention": True}, {"attn_cp_size": 2},
                                 {"enable_prefill_cp": True}, {"enable_layernorm_sp": True}, {"pp_size": 2},
                                 {"enable_attn_tp_input_scattered": True}, {"disable_radix_cache": False}])
def test_engine_args_that_split_or_change_the_capture_are_refused(arg, tmp_path):
    with pytest.raises(sb.EngineArgsError, match=next(iter(arg))):
        sb.engine_kwargs("/models/k2", 8, "bfloat16", False, arg)
    model = build_tiny_model(tmp_path / "m", 64, 32, layers=4, context=32)
    with pytest.raises(sb.EngineArgsError):
        sb.SGLangBackend(str(model), engine_args=arg)


def test_engine_runs_prefill_only_without_radix_cache():
    kw = sb.engine_kwargs("/models/k2", 8, "bfloat16", False, {"attn_dp_size": 1, "chunked_prefill_size": 64})
    assert kw["disable_radix_cache"] is True and kw["tp_size"] == 8 and kw["skip_tokenizer_init"] is True
    assert kw["disable_prefill_cuda_graph"] is True and kw["dtype"] == "bfloat16"
    assert kw["chunked_prefill_size"] == 64


# ------------------------------------------------------------------------------ the plugin


@pytest.mark.integration
def test_the_plugin_is_discoverable_only_through_our_dist_info(tmp_path):
    folder = sb.write_plugin_dist(tmp_path / "plugin")
    probe = ("from importlib.metadata import entry_points;"
             f"eps=[e for e in entry_points(group={sb.PLUGIN_GROUP!r}) if e.name=={sb.PLUGIN_NAME!r}];"
             "print(len(eps)); f=eps[0].load() if eps else None; f and f(); print('ok')")
    env = {k: v for k, v in os.environ.items() if k != sb.CAPTURE_ENV}
    with_dist = subprocess.run([sys.executable, "-c", probe], env={**env, "PYTHONPATH": str(folder)},
                               capture_output=True, text=True, check=True)
    assert with_dist.stdout.split() == ["1", "ok"]  # found, and a no-op without EYRIE_SGLANG_CAPTURE
    without = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert without.stdout.split() == ["0", "ok"]


def test_without_sglang_the_backend_says_how_to_get_it(tmp_path, monkeypatch):
    model = build_tiny_model(tmp_path / "m", 64, 32, layers=4, context=32)
    be = sb.SGLangBackend(str(model))
    assert be.facts.num_layers == 4
    monkeypatch.setitem(sys.modules, "sglang", None)
    with pytest.raises(sb.SGLangCaptureError, match=r"eyrie\[sglang\].*sglang==0\.5\.23"):
        be.hidden_states([[1, 2, 3]], [1, 2, 3])
    be.close()

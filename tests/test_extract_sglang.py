"""The SGLang capture glue, exercised on CPU with stand-ins for SGLang's objects (SGLang needs CUDA)."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import safetensors.torch
import torch

from eyrie.jobs.extract import sglang_backend as sb
from eyrie.jobs.extract.hf_backend import build_tiny_model


class Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers_to_capture: list[int] = []


class FakeModel(torch.nn.Module):
    """Mimics SGLang's LlamaForCausalLM: the outer model sets the inner model's capture list."""

    def __init__(self, num_layers: int, offset_semantics: int = 0):
        super().__init__()
        self.model = Inner()
        self.num_layers = num_layers
        self.offset = offset_semantics

    def set_eagle3_layers_to_capture(self, layer_ids=None):
        assert layer_ids is None
        n = self.num_layers
        self.model.layers_to_capture = [2 + self.offset, n // 2 + self.offset, n - 3 + self.offset]


def test_enable_capture_retargets_the_default_list_to_our_ids():
    runner = SimpleNamespace(model=FakeModel(61), is_draft_worker=False)
    sb.enable_capture(runner, layers=[3, 30, 57], num_layers=61)
    assert runner.model.model.layers_to_capture == [3, 30, 57]


def test_unexpected_capture_semantics_are_refused():
    runner = SimpleNamespace(model=FakeModel(61, offset_semantics=-1), is_draft_worker=False)
    with pytest.raises(sb.SGLangCaptureError, match=r"is \[1, 29, 57\].*expected \[2, 30, 58\]"):
        sb.enable_capture(runner, layers=[2, 30, 58], num_layers=61)
    with pytest.raises(sb.SGLangCaptureError, match="Linear cannot capture"):
        sb.enable_capture(SimpleNamespace(model=torch.nn.Linear(1, 1)), layers=[1], num_layers=4)


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


def test_capture_forward_saves_each_eyrie_request_and_chunks_assemble(tmp_path, monkeypatch):
    monkeypatch.setattr(sb, "_tp_rank", lambda: 0)
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
                             aux1, spool=tmp_path)
    assert out == "logits" and calls == [6]
    sb.capture_forward(original, "self", "ids", full_last[6:], "head", _batch(["eyrie-a"], [4], [6]),
                       aux_hidden_states=full_aux[6:], spool=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eyrie-a.0000000000.safetensors",
                                                          "eyrie-a.0000000006.safetensors"]
    aux, last = sb.assemble(tmp_path, "eyrie-a", 10)
    assert torch.equal(aux, full_aux) and torch.equal(last, full_last)
    assert list(tmp_path.iterdir()) == []  # consumed


def test_only_rank_zero_writes_and_decode_steps_are_ignored(tmp_path, monkeypatch):
    monkeypatch.setattr(sb, "_tp_rank", lambda: 1)
    x = torch.ones(3, 2)
    sb.capture_forward(lambda *a, **k: None, "s", "i", x, "h", _batch(["eyrie-a"], [3], [0]), [x], spool=tmp_path)
    monkeypatch.setattr(sb, "_tp_rank", lambda: 0)
    sb.capture_forward(lambda *a, **k: None, "s", "i", x, "h", _batch(["eyrie-a"], [3], [0], extend=False), [x],
                       spool=tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(sb.SGLangCaptureError, match="capture is off"):
        sb.capture_forward(lambda *a, **k: None, "s", "i", x, "h", _batch(["eyrie-a"], [3], [0]), None,
                           spool=tmp_path)


def test_assemble_names_the_request_when_pieces_are_missing(tmp_path):
    safetensors.torch.save_file({"aux_hidden": torch.zeros(2, 6), "last_hidden": torch.zeros(2, 2)},
                                str(tmp_path / "eyrie-b.0000000004.safetensors"))
    with pytest.raises(sb.SGLangCaptureError, match=r"request eyrie-b: captured 0 of 6 positions \(pieces at \[4\]\)"):
        sb.assemble(tmp_path, "eyrie-b", 6, timeout=0.1)


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


def test_engine_runs_prefill_only_without_radix_cache():
    kw = sb.engine_kwargs("/models/k2", 8, "bfloat16", False)
    assert kw["disable_radix_cache"] is True and kw["tp_size"] == 8 and kw["skip_tokenizer_init"] is True
    assert kw["disable_prefill_cuda_graph"] is True and kw["dtype"] == "bfloat16"


def test_without_sglang_the_backend_says_how_to_get_it(tmp_path, monkeypatch):
    model = build_tiny_model(tmp_path / "m", 64, 32, layers=4, context=32)
    be = sb.SGLangBackend(str(model))
    assert be.facts.num_layers == 4
    monkeypatch.setitem(sys.modules, "sglang", None)
    with pytest.raises(sb.SGLangCaptureError, match=r"eyrie\[sglang\].*sglang==0\.5\.23"):
        be.hidden_states([[1, 2, 3]], [1, 2, 3])
    be.close()

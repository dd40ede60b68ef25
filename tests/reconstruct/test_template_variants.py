"""Template variants chosen by the provider's own prompt-token counts: the pure decision, each
family's variants rendering differently where they differ, and real runs where the simulated
provider serves each variant (or one eyrie does not know) and eyrie picks it (or stops)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from eyrie.jobs.contract import layout
from eyrie.jobs.reconstruct.formats import resolve_format, variant_names
from eyrie.jobs.reconstruct.tokenizers import load_tokenizer
from eyrie.jobs.reconstruct.variants import (
    FIT_SHARE,
    MAX_PROVIDERS,
    Choice,
    VariantDetector,
    candidates,
    prompt_lengths,
)
from eyrie.jobs.simulator import UNKNOWN_EXTRA_TOKENS
from eyrie.jobs.spec import TargetSpec
from eyrie.jobs.store import open_store

KIMI = Path(__file__).parents[1] / "data" / "kimi_synthetic"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Get weather ☀",
                                            "parameters": {"type": "object", "required": ["city"],
                                                           "properties": {"city": {"type": "string"}}}}}


# ------------------------------------------------------------------------------ the pure decision


def feed(d: VariantDetector, provider: str | None, n: int, tokens: int | None,
         lengths: dict[str, int | dict[bool, int]]) -> Any:
    """`n` answers; a bare length is one of an answer that said it was thinking (one reading)."""
    by = {v: n_ if isinstance(n_, dict) else {True: n_} for v, n_ in lengths.items()}
    stops = [d.observe(provider, tokens, by) for _ in range(n)]
    return next((s for s in stops if s is not None), None)


def test_the_variant_whose_length_is_the_providers_count_is_picked_per_provider():
    d = VariantDetector("kimi-k2.5", ["current", "release"], canary=10)
    assert feed(d, "a", 9, 100, {"current": 100, "release": 112}) is None
    assert d.summary().dump()["byProvider"]["a"] == {"variant": "current", "how": "detected", "answers": 9,
                                              "fits": ["current"], "thinking": None, "unsaid": 0,
                                              "final": False}
    assert feed(d, "a", 1, 100, {"current": 100, "release": 112}) is None
    assert feed(d, "b", 10, 112, {"current": 100, "release": 112}) is None
    by = d.summary().dump()["byProvider"]
    assert (by["a"]["variant"], by["b"]["variant"], by["b"]["how"], by["b"]["final"]) == (
        "current", "release", "detected", True)
    assert not d.wants("a") and d.wants("c")


def test_nearly_every_answer_is_enough_and_fewer_is_a_mismatch_naming_the_gaps():
    misses = int(10 * (1 - FIT_SHARE))  # 0 of 10 at 95%: every answer must fit
    d = VariantDetector("kimi-k2.5", ["current", "release"], canary=20)
    feed(d, "a", 20 - 1, 50, {"current": 50, "release": 62})
    assert feed(d, "a", 1, 50, {"current": 51, "release": 62}) is None  # 19/20 = 95%
    assert d.chosen["a"].variant == "current" and misses == 0
    d = VariantDetector("kimi-k2.5", ["current", "release"], canary=10)
    feed(d, "p", 8, 50, {"current": 50, "release": 62})
    stop = feed(d, "p", 2, 50, {"current": 47, "release": 59})
    assert stop is not None and d.stopped == stop and stop.provider == "p"
    assert ("provider p: no template variant of kimi-k2.5" in stop.message
            and "current: exact 8/10, gap (ours - provider's) min -3 p50 0 max 0" in stop.message
            and "release: exact 0/10, gap (ours - provider's) min 9 p50 12 max 12" in stop.message)
    assert d.chosen["p"].how == "mismatch"


def test_ties_keep_the_default_a_pin_wins_and_silence_is_flagged():
    d = VariantDetector("qwen3", ["release", "later"], canary=3)
    feed(d, "a", 3, 7, {"release": 7, "later": 7})
    assert (d.chosen["a"].variant, d.chosen["a"].fits) == ("release", ("release", "later"))
    pinned = VariantDetector("kimi-k2.5", ["current", "release"], canary=3, pinned="release")
    assert feed(pinned, "a", 3, 10, {"current": 10, "release": 22}) is None  # no stop: the user knows
    assert (pinned.chosen["a"].variant, pinned.chosen["a"].how, pinned.chosen["a"].fits) == (
        "release", "pinned", ("current",))
    silent = VariantDetector("kimi-k2.5", ["current", "release"], canary=3)
    assert feed(silent, None, 3, None, {"current": 10, "release": 22}) is None
    assert silent.summary().dump()["byProvider"]["(unknown)"]["how"] == "unreported"
    assert silent.summary().dump()["byProvider"]["(unknown)"]["variant"] == "current"


def test_a_router_naming_a_new_provider_per_answer_cannot_grow_the_detector():
    d = VariantDetector("kimi-k2.5", ["current", "release"], canary=2)
    for i in range(MAX_PROVIDERS * 3):
        d.observe(f"p{i}", 5, {"current": {True: 5}})
    assert len(d.summary().dump()["byProvider"]) == MAX_PROVIDERS + 1
    assert d.summary().dump()["byProvider"]["(other)"]["variant"] == "current"


def test_answers_that_do_not_say_fit_under_either_thinking_reading_and_the_providers_is_recorded():
    # Qwen3 served with thinking off without the request asking: `<think>\n\n</think>\n\n` (4 tokens)
    # in the prompt of every answer that did not say; answers that reasoned were thinking.
    d = VariantDetector("qwen3", ["release", "later"], canary=8)
    unsaid = {"release": {True: 100, False: 104}, "later": {True: 100, False: 104}}
    assert feed(d, "a", 6, 104, unsaid) is None
    assert feed(d, "a", 2, 90, {"release": 90, "later": 90}) is None
    assert d.chosen["a"] == Choice("release", "detected", 8, ("release", "later"), False, 6)
    # the template's default reading fits: it is kept, and said so
    d = VariantDetector("qwen3", ["release", "later"], canary=4)
    feed(d, "b", 4, 100, unsaid)
    assert (d.chosen["b"].thinking, d.chosen["b"].unsaid) == (True, 4)
    # a reading per answer, as the rebuilder takes it: the majority is the provider's
    d = VariantDetector("kimi-k2.5", ["current", "release"], canary=5)
    feed(d, "c", 3, 51, {"current": {True: 50, False: 51}, "release": {True: 62, False: 63}})
    assert feed(d, "c", 2, 50, {"current": {True: 50, False: 51}, "release": {True: 62, False: 63}}) is None
    assert (d.chosen["c"].variant, d.chosen["c"].thinking, d.chosen["c"].fits) == ("current", False, ("current",))


def test_counts_that_fit_neither_reading_still_stop_naming_both():
    d = VariantDetector("kimi-k2.5", ["current", "release"], canary=4)
    stop = feed(d, "p", 4, 45, {"current": {True: 50, False: 51}, "release": {True: 62, False: 63}})
    assert stop is not None and d.chosen["p"].how == "mismatch"
    assert "(4 of them did not say whether the model was thinking: both readings tried)" in stop.message
    assert ("current: exact 0/4 under either reading (thinking on exact 0/4, gap (ours - provider's) min 5 p50 5 "
            "max 5, thinking off exact 0/4, gap (ours - provider's) min 6 p50 6 max 6)") in stop.message


def test_a_mismatch_names_the_override_and_flag_or_exclude_go_on_recording_it():
    for on, stops in (("stop", True), ("flag", False), ("exclude", False)):
        d = VariantDetector("kimi-k2.5", ["current", "release"], canary=3, on_mismatch=on)
        stop = feed(d, "p", 3, 45, {"current": 50, "release": 62})
        assert (stop is not None) is stops and (d.stopped is not None) is stops
        c = d.chosen["p"]
        assert c.how == "mismatch" and c.message and "target.onTemplateMismatch (stop | flag | exclude; now " \
            f"{on}): flag keeps its samples flagged template_mismatch, exclude leaves them out" in c.message
        summary = d.summary().dump()
        assert summary["onMismatch"] == on and summary["byProvider"]["p"]["message"] == c.message
    # a format without variants: nothing to pin, so the message does not suggest it
    d = VariantDetector("deepseek-v4", ["deepseek-v4"], canary=2)
    stop = feed(d, "p", 2, 45, {"deepseek-v4": 50})
    assert stop is not None and "chat format deepseek-v4 does not give the prompt length" in stop.message
    assert "templateVariant" not in stop.message and "target.onTemplateMismatch (stop | flag | exclude" in stop.message


# ------------------------------------------------------------------- each family's variants render


@pytest.fixture(scope="module")
def kimi_tok():
    return load_tokenizer(TargetSpec(model="m", tokenizer=str(KIMI)))


@pytest.fixture(scope="module")
def ds_tok():
    return load_tokenizer(TargetSpec(model="m", tokenizer="bundled:deepseek-v4"))


def lengths(fmt_name: str, tok: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> dict:
    """Each variant's prompt length for an answer that does not say, under the format's default reading."""
    request = {"messages": messages, **({"tools": tools} if tools else {})}
    fmt = resolve_format(fmt_name, tok)
    by = prompt_lengths(candidates(fmt), tok, request, {"content": "ok", "finish_reason": "stop"}, {})
    assert all(list(r) == [fmt.default_thinking, not fmt.default_thinking] for r in by.values())
    return {v: r[fmt.default_thinking] for v, r in by.items()}


def test_every_family_declares_its_variants():
    assert variant_names("kimi-k2.5") == ("current", "release")
    assert variant_names("deepseek-v3") == ("vllm", "card")
    assert variant_names("qwen3") == ("release", "later")
    assert variant_names("deepseek-v4") == ("deepseek-v4",) and variant_names("auto") == ("auto",)


def test_kimi_variants_differ_by_the_default_system_prompt(kimi_tok):
    without = lengths("kimi-k2.5", kimi_tok, [{"role": "user", "content": "Hi"}], None)
    block = len(kimi_tok.encode("<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by "
                                "Moonshot AI.<|im_end|>"))
    assert without["release"] - without["current"] == block
    with_system = lengths("kimi-k2.5", kimi_tok, [{"role": "system", "content": "S"},
                                                  {"role": "user", "content": "Hi"}], None)
    assert with_system["release"] == with_system["current"]


def test_deepseek_variants_differ_in_the_tool_block(ds_tok):
    plain = lengths("deepseek-v3", ds_tok, [{"role": "user", "content": "Hi"}], None)
    assert plain["vllm"] == plain["card"]
    tooled = lengths("deepseek-v3", ds_tok, [{"role": "user", "content": "Weather?"}], [WEATHER])
    assert tooled["vllm"] != tooled["card"]


def test_a_pinned_variant_the_format_lacks_fails_before_anything_is_paid(kimi_tok):
    from eyrie.jobs.reconstruct.tokenizers import TokenizerError

    with pytest.raises(TokenizerError, match=r"target\.templateVariant: chat format kimi-k2\.5 has no template "
                                             r"variant 'v9' \(it has: current, release\)"):
        resolve_format("kimi-k2.5", kimi_tok, "v9")
    with pytest.raises(TokenizerError, match="chatFormat auto renders the tokenizer's own template"):
        resolve_format("auto", kimi_tok, "release")


# --------------------------------------------------------------- real runs against the simulator


def prompts(path: Path, n: int) -> Path:
    with path.open("w") as f:
        for i in range(n):
            msgs = [{"role": "user", "content": f"Weather in city {i}? 🌧️"}]
            if i % 3 == 0:
                msgs.insert(0, {"role": "system", "content": "Be brief."})
            f.write(json.dumps({"messages": msgs, "tools": [WEATHER]}) + "\n")
    return path


def run(tmp_path: Path, served: str | None, *, pinned: str | None = None, n: int = 24,
        fmt: str = "kimi-k2.5", tokenizer: str = str(KIMI), sampling: dict[str, Any] | None = None,
        simulator: dict[str, Any] | None = None, on_mismatch: str | None = None, ray: bool = False
        ) -> tuple[Any, Any]:
    """`eyrie run --until samples` on the spec, inline (or on local Ray, the default path, with `ray`)."""
    out = f"file://{tmp_path}/out"
    target = {"model": "sim/model", "tokenizer": tokenizer, "chatFormat": fmt,
              **({"templateVariant": pinned} if pinned else {}),
              **({"onTemplateMismatch": on_mismatch} if on_mismatch else {})}
    behaviour = {**({"templateVariant": served} if served else {}), **(simulator or {})}  # a simulator config file
    if behaviour:
        (tmp_path / "simulator.yaml").write_text(yaml.safe_dump(behaviour))
    sim = {"config": str(tmp_path / "simulator.yaml")} if behaviour else {}
    spec = {"sources": [{"name": "p", "uri": str(prompts(tmp_path / "p.jsonl", n)), "format": "openai"}],
            "target": target,
            "api": {"baseUrl": "simulated", "maxConcurrency": 4,
                    "sampling": {"reasoning": {"effort": "low"}} if sampling is None else sampling,
                    **({"simulator": sim} if sim else {})},
            "tools": {"gate": {"canarySamples": 8, "minToolCallRate": 0.1}},
            "budget": {"maxUSD": "5", "pricing": {"inputPerMillion": "0.6", "outputPerMillion": "2.5"}},
            "generation": {"shards": 2, **({"ray": {"mode": "Local", "workers": 2}} if ray else {})},
            "output": {"uri": out}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "EYRIE_NO_RAY": "0" if ray else "1"}
    r = subprocess.run([sys.executable, "-m", "eyrie.jobs.cli", "run", str(path), "--no-progress", "--until",
                        "samples"], capture_output=True, text=True, env=env, timeout=300)
    return r, open_store(out)


@pytest.mark.integration
@pytest.mark.parametrize("fmt, tokenizer, served", [
    ("kimi-k2.5", str(KIMI), "current"), ("kimi-k2.5", str(KIMI), "release"),
    ("deepseek-v3", "bundled:deepseek-v4", "vllm"), ("deepseek-v3", "bundled:deepseek-v4", "card")])
def test_eyrie_picks_the_variant_the_provider_serves_and_rebuilds_with_it(tmp_path, fmt, tokenizer, served):
    r, store = run(tmp_path, served, fmt=fmt, tokenizer=tokenizer)
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads(store.get(layout.MANIFEST))
    chosen = manifest["templateVariants"]["byProvider"]["eyrie-simulator"]
    assert (chosen["variant"], chosen["how"], chosen["final"]) == (served, "detected", True)
    assert chosen["fits"] == [served] and chosen["answers"] >= 8
    rec = manifest["reconstruction"]
    assert rec["chatTemplate"]["byProvider"]["eyrie-simulator"]["variant"] == served
    gaps = rec["samples"]["promptTokenGap"]
    assert gaps["count"] == rec["samples"]["kept"] == 24 and gaps["exact"] == 24  # every prompt is the provider's
    assert "call_id_inferred" not in rec["samples"]["flags"]  # the simulated Kimi API returns native ids


@pytest.mark.integration
def test_a_variant_eyrie_does_not_know_stops_the_run_after_the_canary(tmp_path):
    r, store = run(tmp_path, "unknown", n=40)
    assert r.returncode == 7, r.stderr[-3000:]
    prog = json.loads(store.get(layout.PROGRESS))
    assert prog["outcome"] == "TemplateMismatch"
    assert "provider eyrie-simulator: no template variant of kimi-k2.5" in prog["message"]
    assert f"current: exact 0/8, gap (ours - provider's) min -{UNKNOWN_EXTRA_TOKENS}" in prog["message"]
    assert prog["samples"]["done"] < 40  # stopped after the canary, not after the budget


@pytest.mark.integration
def test_a_pinned_variant_is_used_and_the_counts_still_reported(tmp_path):
    r, store = run(tmp_path, "release", pinned="current", n=10)
    assert r.returncode == 0, r.stderr[-3000:]
    chosen = json.loads(store.get(layout.MANIFEST))["templateVariants"]["byProvider"]["eyrie-simulator"]
    assert (chosen["variant"], chosen["how"], chosen["fits"]) == ("current", "pinned", ["release"])


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory) -> str:
    from tests.tokenizer_helpers import qwen3_folder

    return str(qwen3_folder(tmp_path_factory.mktemp("qwen3")))


@pytest.mark.integration
@pytest.mark.parametrize("served", ["release", "later"])
def test_qwen3_revisions_render_openai_requests_alike_and_the_first_is_kept(tmp_path, qwen_folder, served):
    r, store = run(tmp_path, served, fmt="qwen3", tokenizer=qwen_folder, n=10)
    assert r.returncode == 0, r.stderr[-3000:]
    chosen = json.loads(store.get(layout.MANIFEST))["templateVariants"]["byProvider"]["eyrie-simulator"]
    assert (chosen["variant"], chosen["how"], chosen["fits"]) == ("release", "detected", ["release", "later"])


def test_the_simulator_refuses_a_variant_the_format_lacks_at_start():
    from eyrie.jobs.simulator import PromptCounter, SimulatorConfig

    with pytest.raises(ValueError, match=r"simulator template_variant 'v9': kimi-k2\.5 has current, release"):
        PromptCounter(SimulatorConfig(tokenizer=str(KIMI), chat_format="kimi-k2.5", template_variant="v9"))
    assert PromptCounter(SimulatorConfig(tokenizer=str(KIMI), chat_format="kimi-k2.5",
                                         template_variant="unknown")).extra == UNKNOWN_EXTRA_TOKENS


# ------------------------------------- a provider that serves the model with thinking off, unasked


def official_folder(tmp_path: Path, family: str) -> str:
    """A tokenizer folder whose chat template is the family's official one (the reference file)."""
    import shutil

    from tests.reference_helpers import reference
    from tests.tokenizer_helpers import qwen3_folder

    template = reference(f"{family}/chat_template.jinja").read_text()
    folder = tmp_path / f"{family}-official"
    folder.mkdir()
    if family == "qwen3":
        return str(qwen3_folder(folder, template))
    shutil.copytree(KIMI, folder, dirs_exist_ok=True)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": template}))
    return str(folder)


@pytest.mark.integration
@pytest.mark.parametrize("family, fmt, ray", [("qwen3", "qwen3", False), ("qwen3", "auto", False),
                                              ("kimi-k2.5", "kimi-k2.5", False), ("kimi-k2.5", "auto", True)])
def test_a_provider_that_silently_disables_thinking_runs_to_done_with_every_sample_exact(tmp_path, family, fmt,
                                                                                          ray):
    """The default spec sends no `reasoning`; the provider serves the model with thinking off (its
    prompt carries the closed think block the template writes then) and returns no reasoning. The
    canary finds that reading, the run goes on, and every prompt is the one the provider counted
    (one case on local Ray, the default path: the readings cross from the workers to the coordinator)."""
    n = 12
    r, store = run(tmp_path, None, fmt=fmt, tokenizer=official_folder(tmp_path, family), n=n, sampling={},
                   simulator={"defaultThinking": False}, ray=ray)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(store.get(layout.PROGRESS))["outcome"] == "Done"
    assert "thinking off where the request did not say" in " ".join(r.stderr.split())  # wrapped at 100 columns
    manifest = json.loads(store.get(layout.MANIFEST))
    chosen = manifest["templateVariants"]["byProvider"]["eyrie-simulator"]
    assert (chosen["how"], chosen["thinking"], chosen["unsaid"], chosen["final"]) == ("detected", False, 8, True)
    rec = manifest["reconstruction"]
    assert rec["chatTemplate"]["byProvider"]["eyrie-simulator"]["thinking"] is False
    gaps, kept = rec["samples"]["promptTokenGap"], rec["samples"]["kept"]
    assert kept == n and gaps["count"] == n and gaps["exact"] == n, rec["samples"]
    assert rec["samples"]["flags"].get("thinking_inferred") == n  # nothing said it: the counts did


@pytest.mark.integration
def test_a_provider_whose_counts_fit_neither_thinking_reading_still_stops(tmp_path):
    r, store = run(tmp_path, "unknown", n=40, sampling={}, simulator={"defaultThinking": False})
    assert r.returncode == 7, r.stderr[-3000:]
    prog = json.loads(store.get(layout.PROGRESS))
    assert prog["outcome"] == "TemplateMismatch" and prog["samples"]["done"] < 40
    assert "8 of them did not say whether the model was thinking: both readings tried" in prog["message"]
    assert "current: exact 0/8 under either reading (thinking on exact 0/8" in prog["message"]
    assert prog["templateVariants"]["byProvider"]["eyrie-simulator"]["how"] == "mismatch"


# ------------------------------------------------------- going on past a mismatch, knowingly


@pytest.mark.integration
@pytest.mark.parametrize("fmt, family", [("kimi-k2.5", None), ("deepseek-v4", None), ("auto", "qwen3")])
def test_a_mismatch_stops_by_default_naming_the_override_for_every_format(tmp_path, fmt, family):
    tokenizer = {"kimi-k2.5": str(KIMI), "deepseek-v4": "bundled:deepseek-v4"}.get(fmt) or official_folder(
        tmp_path, family)
    r, store = run(tmp_path, "unknown", n=16, fmt=fmt, tokenizer=tokenizer)
    assert r.returncode == 7, r.stderr[-3000:]
    message = json.loads(store.get(layout.PROGRESS))["message"]
    assert "target.onTemplateMismatch (stop | flag | exclude; now stop)" in message
    assert ("templateVariant" in message) is (fmt == "kimi-k2.5")  # only a format with variants can pin one


@pytest.mark.integration
@pytest.mark.parametrize("fmt", ["kimi-k2.5", "deepseek-v4"])
@pytest.mark.parametrize("on", ["flag", "exclude"])
def test_on_template_mismatch_flag_or_exclude_goes_on_and_says_so_everywhere(tmp_path, fmt, on):
    """A provider that counts 5 tokens eyrie does not render (a BOS, an injected line): the user who
    looked goes on; its samples are flagged or left out, and the manifest and the report say so."""
    n = 12
    tokenizer = str(KIMI) if fmt == "kimi-k2.5" else "bundled:deepseek-v4"
    r, store = run(tmp_path, "unknown", n=n, fmt=fmt, tokenizer=tokenizer, on_mismatch=on)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning: provider eyrie-simulator:" in " ".join(r.stderr.split())  # wrapped at 100 columns
    assert json.loads(store.get(layout.PROGRESS))["outcome"] == "Done"
    manifest = json.loads(store.get(layout.MANIFEST))
    tv = manifest["templateVariants"]
    assert tv["onMismatch"] == on and tv["byProvider"]["eyrie-simulator"]["how"] == "mismatch"
    rec = manifest["reconstruction"]
    assert rec["chatTemplate"]["mismatched"] == ["eyrie-simulator"] and rec["chatTemplate"]["onMismatch"] == on
    samples = rec["samples"]
    if on == "flag":
        assert samples["kept"] == n and samples["flags"]["template_mismatch"] == n
        assert samples["promptTokenGap"]["exact"] == 0 and samples["promptTokenGap"]["max"] == -UNKNOWN_EXTRA_TOKENS
    else:
        assert samples["kept"] == 0 and samples["excluded"] == {"template_mismatch": n}
    page = store.get(layout.REPORT).decode()
    done = "flagged template_mismatch" if on == "flag" else "excluded"
    assert f"eyrie-simulator: samples {done} (target.onTemplateMismatch: {on})" in page

"""Tokenizer loading: bundled DeepSeek-V4, the Kimi tiktoken layout, s3:// folders, preflight errors."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eyrie.jobs.reconstruct import kimi_facts as kimi
from eyrie.jobs.reconstruct.formats import check_tokenizer, resolve_format
from eyrie.jobs.reconstruct.tokenizers import (
    TokenizerError,
    bundled_tokenizer_path,
    clear_cache,
    load_tokenizer,
)
from eyrie.jobs.spec import TargetSpec

DATA = Path(__file__).parents[1] / "data"
KIMI = DATA / "kimi_synthetic"


def target(tokenizer: str | None, chat_format: str = "auto", **kw) -> TargetSpec:
    return TargetSpec(model="m", tokenizer=tokenizer, chat_format=chat_format, **kw)


@pytest.fixture(autouse=True)
def _fresh_cache():
    clear_cache()
    yield
    clear_cache()


# ------------------------------------------------------------------------------ DeepSeek-V4 (real)


def test_bundled_deepseek_v4_is_the_real_tokenizer_with_single_id_markers():
    folder = bundled_tokenizer_path("deepseek-v4")
    assert (folder / "tokenizer.json").is_file()
    tok = load_tokenizer(target("bundled:deepseek-v4"))
    assert tok.kind == "huggingface"
    assert tok.chat_template is None  # V4 ships an encoder script, not a Jinja template
    assert tok.max_length == 1048576
    assert tok.eos_token == "<｜end▁of▁sentence｜>"
    expected = {"<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1, "<｜User｜>": 128803,
                "<｜Assistant｜>": 128804, "<think>": 128821, "</think>": 128822, "｜DSML｜": 128825,
                "<｜tool▁calls▁begin｜>": 128806, "<｜tool▁sep｜>": 128814}
    assert {m: tok.token_id(m) for m in expected} == expected
    assert tok.encode("hello") == [33310]  # no BOS added
    assert tok.encode("<think>hi</think>") == [128821, 6366, 128822]
    assert tok.decode(tok.encode("Grüße 🌧️ 世界")) == "Grüße 🌧️ 世界"
    files = {p: hashlib.sha256((folder / p).read_bytes()).hexdigest()
             for p in ("tokenizer.json", "tokenizer_config.json")}
    assert dict(tok.files) == files
    assert tok.sha256 == hashlib.sha256("".join(f"{n}\0{files[n]}\n" for n in sorted(files)).encode()).hexdigest()


def test_deepseek_v4_has_no_template_so_auto_fails_preflight_and_named_formats_pass():
    with pytest.raises(TokenizerError, match=r"target\.chatFormat: auto needs a chat template.*'bundled:deepseek-v4'"):
        check_tokenizer(target("bundled:deepseek-v4", "auto"))
    assert check_tokenizer(target("bundled:deepseek-v4", "deepseek-v4")).kind == "huggingface"
    assert check_tokenizer(target("bundled:deepseek-v4", "deepseek-v3")).kind == "huggingface"


def test_a_named_format_refuses_another_familys_tokenizer():
    with pytest.raises(TokenizerError, match=r"chatFormat kimi-k2\.5: marker '<\|im_end\|>' is not a single token"):
        check_tokenizer(target("bundled:deepseek-v4", "kimi-k2.5"))


# ---------------------------------------------------------------------------- Kimi tiktoken layout


def test_kimi_layout_loads_without_remote_code_with_specials_at_their_real_ids():
    tok = check_tokenizer(target(str(KIMI), "kimi-k2.5"))
    assert tok.kind == "tiktoken"
    assert {m: tok.token_id(m) for m in kimi.EXPECTED_IDS} == kimi.EXPECTED_IDS
    assert tok.token_id("<think>") == 163606 and tok.token_id("</think>") == 163607
    assert tok.encode("zqz zq") == [257, 32, 256]  # the two merges of the synthetic vocabulary
    assert tok.encode("Hé") == [72, 195, 169]  # bytes otherwise
    assert tok.encode("a<|im_end|>b") == [97, 163586, 98]
    assert tok.decode([163588, 72, 105, 163586]) == "<|im_assistant|>Hi<|im_end|>"
    assert tok.token_bytes(163586) == b"<|im_end|>" and tok.token_bytes(195) == b"\xc3"
    # Kimi names unlisted reserved slots after the base vocabulary
    assert tok.token_id("<|reserved_token_258|>") == 258
    assert tok.max_length == 262144
    assert tok.eos_token == "[EOS]"
    assert set(tok.files) == {"tiktoken.model", "tokenizer_config.json"}


def test_kimi_long_runs_are_split_like_kimis_tokenizer():
    tok = load_tokenizer(target(str(KIMI)))
    text = "a" * (kimi.MAX_RUN_CHARS + 5) + " b"
    ids = tok.encode(text)
    assert ids == [97] * (kimi.MAX_RUN_CHARS + 5) + [32, 98]
    assert tok.decode(ids) == text


def test_kimi_ids_the_family_fixes_are_enforced(tmp_path):
    shutil.copytree(KIMI, tmp_path / "tok")
    cfg_path = tmp_path / "tok" / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["added_tokens_decoder"]["163600"] = cfg["added_tokens_decoder"].pop("163586")  # move <|im_end|>
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(TokenizerError, match=r"gives '<\|im_end\|>' ID 163600, but kimi-k2\.5 models use 163586"):
        check_tokenizer(target(str(tmp_path / "tok"), "kimi-k2.5"))


def test_kimi_auto_format_finds_template_markers_and_end_of_turn():
    tok = load_tokenizer(target(str(KIMI)))
    fmt = resolve_format("auto", tok)
    assert set(fmt.markers) == {"<|im_end|>", "<|im_user|>", "<|im_assistant|>", "<|im_system|>", "<|im_middle|>",
                                "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                                "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<think>", "</think>"}
    assert fmt.end_markers == ("<|im_end|>",)
    assert fmt.sha256 == hashlib.sha256(tok.chat_template.encode()).hexdigest()


# ------------------------------------------------------------------- TypeScript tool declarations


def test_kimi_typescript_tool_declaration_is_exact():
    tools = [
        {"type": "function", "function": {
            "name": "search", "description": "Search the catalog.\nReturns items.",
            "parameters": {
                "type": "object", "required": ["query"],
                "properties": {
                    "query": {"type": "string", "description": "Words", "minLength": 1},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
                    "tags": {"type": "array", "items": {"type": "string", "description": "One tag"}, "maxItems": 5},
                    "sort": {"type": "string", "enum": ["price", "rating"]},
                    "filters": {"type": "object", "properties": {"in_stock": {"type": "boolean"}},
                                "additionalProperties": False},
                    "near": {"anyOf": [{"$ref": "#/$defs/point"}, {"type": "null"}]},
                    "mode": {"type": ["string", "null"]},
                },
                "$defs": {"point": {"type": "object", "description": "A place", "required": ["lat", "lon"],
                                    "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}}}},
            }}},
        {"type": "function", "function": {"name": "ping"}},
        {"type": "retrieval"},  # not a function: not declared
    ]
    assert kimi.tools_typescript(tools) == (
        "# Tools\n\n## functions\nnamespace functions {\n"
        "// A place\n"
        "interface point {\n  lat: number,\n  lon: number\n}\n"
        "// Search the catalog.\n// Returns items.\n"
        "type search = (_: {\n"
        "  // Words\n  // minLength: 1\n  query: string,\n"
        "  filters?: {\n    in_stock?: boolean,\n    [k: string]: never\n  },\n"
        "  // maximum: 50, minimum: 1\n  // Default: 10\n  limit?: number,\n"
        "  mode?: string | null,\n"
        "  near?: point | null,\n"
        '  sort?: "price" | "rating",\n'
        "  // maxItems: 5\n  tags?: Array<\n    // One tag\n    string\n  >\n"
        "}) => any;\n"
        "type ping = (_: {}) => any;\n"
        "}\n")
    assert kimi.tools_typescript([{"type": "retrieval"}]) == ""
    with pytest.raises(kimi.ToolDeclarationError, match="reference not found"):
        kimi.tools_typescript([{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {"x": {"$ref": "#/$defs/nope"}}}}}])


# ------------------------------------------------------------------------------ bad tokenizers


def test_unset_tokenizer_names_the_setting():
    with pytest.raises(TokenizerError, match=r"^target\.tokenizer: not set"):
        load_tokenizer(target(None))


@pytest.mark.parametrize("ref, message", [
    ("./no/such/tokenizer", r"target\.tokenizer './no/such/tokenizer': no such folder"),
    ("bundled:nope", r"target\.tokenizer: unknown bundled tokenizer 'nope'"),
])
def test_unloadable_references_name_the_setting(ref, message):
    with pytest.raises(TokenizerError, match=message):
        load_tokenizer(target(ref))


def test_builtin_model_tokenizers_name_the_setting(monkeypatch):
    with pytest.raises(TokenizerError, match=r"target\.tokenizer 'builtin:tiny-llama': no such builtin model's "
                                             r"tokenizer; known: builtin:tiny-chat, "):
        load_tokenizer(target("builtin:tiny-llama"))
    from eyrie.jobs import shipped

    monkeypatch.setattr(shipped, "SHIPPED", shipped.SHIPPED.with_name("nowhere"))
    shipped.clear_checks()
    try:  # a broken install says what to do
        with pytest.raises(TokenizerError, match=r"'builtin:tiny-chat-seed1': the builtin models' manifest "
                                                 r".*nowhere.* cannot be read .*: reinstall eyrie"):
            load_tokenizer(target("builtin:tiny-chat-seed1"))
    finally:
        shipped.clear_checks()


@pytest.mark.integration  # a Python process without torch
def test_builtin_model_tokenizers_load_where_torch_cannot_be_imported():
    """They ship with eyrie (the Ray worker image, without torch, reconstructs the quickstart's samples)."""
    code = ("import sys\n"
            "for m in ('torch', 'safetensors'): sys.modules[m] = None\n"
            "from eyrie.jobs.reconstruct.tokenizers import load_tokenizer\n"
            "from eyrie.jobs.spec import TargetSpec\n"
            "for name in ('builtin:tiny-chat', 'builtin:tiny-chat-seed1', 'builtin:tiny-chat-fp8'):\n"
            "    tok = load_tokenizer(TargetSpec(model='m', tokenizer=name))\n"
            "    print(name, ','.join(map(str, tok.encode('<|im_start|>user Paris<|im_end|>'))), tok.sha256)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line.split() for line in r.stdout.splitlines()]
    assert [n for n, _, _ in lines] == ["builtin:tiny-chat", "builtin:tiny-chat-seed1", "builtin:tiny-chat-fp8"]
    assert {(v, h) for _, v, h in lines} == {(lines[0][1], lines[0][2])}  # one tokenizer: the recipe's corpus


def test_unknown_hf_id_offline_names_the_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(TokenizerError, match=r"target\.tokenizer 'no-such-org/no-such-tokenizer'.*HF_HUB_OFFLINE"):
        load_tokenizer(target("no-such-org/no-such-tokenizer"))


def test_broken_files_name_the_setting(tmp_path):
    bad_json = tmp_path / "bad_json"
    bad_json.mkdir()
    (bad_json / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=rf"target\.tokenizer '{bad_json}': AutoTokenizer cannot load it"):
        load_tokenizer(target(str(bad_json)))
    bad_ranks = tmp_path / "bad_ranks"
    shutil.copytree(KIMI, bad_ranks)
    (bad_ranks / "tiktoken.model").write_text("!!! not-base64\n")
    with pytest.raises(TokenizerError, match=rf"target\.tokenizer '{bad_ranks}': cannot read tiktoken\.model"):
        load_tokenizer(target(str(bad_ranks)))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TokenizerError, match=rf"target\.tokenizer '{empty}': no tokenizer files"):
        load_tokenizer(target(str(empty)))


# --------------------------------------------------------------------------------- s3:// folders


def test_s3_folder_is_downloaded_once_and_only_its_tokenizer_files(s3_bucket, tmp_path, monkeypatch):
    from eyrie.jobs.store import S3Store, open_store

    monkeypatch.setenv("EYRIE_CACHE_DIR", str(tmp_path / "cache"))
    store = open_store(f"{s3_bucket}/models/kimi")
    for name in ("tiktoken.model", "tokenizer_config.json"):
        store.put(name, (KIMI / name).read_bytes())
    store.put("model-00001.safetensors", b"\0" * 1024)  # weights next to it: never downloaded
    uri = f"{s3_bucket}/models/kimi"

    tok = check_tokenizer(target(uri, "kimi-k2.5"))
    assert tok.encode("zqz") == [257]
    cached = tok.folder
    assert cached.parent == tmp_path / "cache" / "tokenizers"
    assert sorted(p.name for p in cached.iterdir()) == [".complete", "tiktoken.model", "tokenizer_config.json"]
    assert tok.files["tiktoken.model"] == hashlib.sha256((KIMI / "tiktoken.model").read_bytes()).hexdigest()

    clear_cache()
    gets: list[str] = []
    real_get = S3Store.get
    monkeypatch.setattr(S3Store, "get", lambda self, key: gets.append(key) or real_get(self, key))
    assert load_tokenizer(target(uri)).folder == cached
    assert gets == []  # listed and sized, not downloaded again

    store.put("tokenizer_config.json", (KIMI / "tokenizer_config.json").read_bytes() + b"\n")  # changed
    clear_cache()
    again = load_tokenizer(target(uri))
    assert again.folder != cached and sorted(gets) == ["tiktoken.model", "tokenizer_config.json"]


def test_s3_folder_without_tokenizer_files_names_the_setting(s3_bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("EYRIE_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(TokenizerError, match=rf"target\.tokenizer '{s3_bucket}/nothing': no tokenizer files"):
        load_tokenizer(target(f"{s3_bucket}/nothing"))

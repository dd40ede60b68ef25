"""One generation record -> one training sample (token IDs + loss mask), or the reason it is excluded.

Each sample is proven, not assumed: the prompt's tokens must be a prefix of the whole's
(`prefix_mismatch`); decoding the response tokens must give back the rendered response exactly and
the returned pieces (reasoning, content, each call's arguments) in order (`decode_mismatch`); each
special marker in the response must be one token (`marker_split`). The response length is compared
with `usage.completion_tokens` (the gap is reported; a large one adds the flag `token_count_gap`)
and, when the provider returned log-probs, their tokens with ours (`logprob_mismatch`).

Tokenizing the prompt and then the whole would double the work, so the whole is tokenized only
when it has to be: when the prompt ends (or the response starts) with a marker that is an added
token splitting text cleanly (see `LoadedTokenizer.boundary_safe`), tokenizing the text of the two
halves is provably the same as tokenizing the whole, and the prefix holds by construction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eyrie.jobs.contract.records import ReasoningDetail, Record
from eyrie.jobs.reconstruct.base import Call, ChatFormat, FormatError, Rendering, Turn
from eyrie.jobs.reconstruct.segments import segment_starts
from eyrie.jobs.reconstruct.tokenizers import LoadedTokenizer

# A response whose token count differs from usage.completion_tokens by more than
# max(GAP_ABS, GAP_REL x completion_tokens) is flagged `token_count_gap`.
GAP_ABS = 8
GAP_REL = 0.05
# Exclusions that say "this rendering is not what the provider rendered" (not "the answer is unusable").
RENDERING_REASONS = frozenset({"prefix_mismatch", "decode_mismatch", "marker_split", "template_error"})


@dataclass(frozen=True)
class Sample:
    sample_id: str
    source: str
    input_ids: list[int]
    n_prompt: int  # tokens before the response; the loss mask is 0 there, 1 after
    flags: tuple[str, ...]
    completion_gap: int | None  # response tokens - usage.completion_tokens
    prompt_gap: int | None  # prompt tokens - usage.prompt_tokens
    logprobs: str | None = None  # "match" | "mismatch" when the provider returned log-probs
    turn: int = 0  # the assistant turn of the conversation (generation.turns: all), else 0
    # packed conversations: the [start, end) spans in the loss, one per turn; else the tail after n_prompt
    spans: tuple[tuple[int, int], ...] = ()
    provider: str | None = None  # the provider that served the answer, as the response named it
    segments: tuple[int, int, int] | None = None  # where reasoning, content, tool calls start (segments.py)
    fingerprint: str | None = None  # what shaped the answer (the record's; contract/fingerprint.py)

    @property
    def n_tokens(self) -> int:
        return len(self.input_ids)

    @property
    def n_response(self) -> int:
        return sum(e - b for b, e in self.spans) if self.spans else len(self.input_ids) - self.n_prompt

    @property
    def loss_mask(self) -> list[int]:
        if not self.spans:
            return [0] * self.n_prompt + [1] * (len(self.input_ids) - self.n_prompt)
        mask = [0] * len(self.input_ids)
        for b, e in self.spans:
            mask[b:e] = [1] * (e - b)
        return mask


@dataclass(frozen=True)
class Excluded:
    sample_id: str
    source: str
    reason: str  # counted by reason in the manifest
    message: str
    turn: int = 0


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def turn_of(response: dict[str, Any]) -> Turn:
    """The returned answer as a Turn; raises FormatError on a tool call without a name."""
    calls = []
    for j, tc in enumerate(response.get("tool_calls") or ()):
        fn = (tc or {}).get("function") or {}
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise FormatError(f"response.tool_calls[{j}] has no function name", reason="malformed_response")
        args = fn.get("arguments")
        calls.append(Call(fn["name"], args if isinstance(args, str) else "", tc.get("id")))
    return Turn(reasoning=response.get("reasoning") or "", content=response.get("content") or "",
                calls=tuple(calls), finished=response.get("finish_reason") != "length")


def wants_thinking(request: dict[str, Any], usage: dict[str, Any], turn: Turn) -> bool | None:
    """Was the model thinking? Reasoning returned (or counted in usage) says yes; else the request's
    reasoning settings (OpenRouter `reasoning`: disabled by `enabled: false` or effort `none`); else
    None: unknown."""
    if turn.reasoning or (_int((usage.get("completion_tokens_details") or {}).get("reasoning_tokens")) or 0) > 0:
        return True
    r = request.get("reasoning")
    if isinstance(r, dict) and r:
        return not (r.get("enabled") is False or r.get("effort") == "none" or r.get("max_tokens") == 0)
    return None


def thinking_readings(request: dict[str, Any], usage: dict[str, Any], turn: Turn, unsaid: bool) -> tuple[bool, ...]:
    """Every reading of "was the model thinking" an answer allows, the one to try first first: the
    one the answer or the request says (`wants_thinking`); else both, `unsaid` first (what the
    provider does when nothing says: the template's default, or what its counts showed over the
    canary). The sample rebuilder and the canary's variant detector both enumerate these, so the
    detector judges every prompt the rebuilder may keep."""
    said = wants_thinking(request, usage, turn)
    return (said,) if said is not None else (unsaid, not unsaid)


def opaque_reasoning(details: Any) -> str | None:
    """Why the returned reasoning_details cannot be rebuilt into the tokens the model wrote:
    `reasoning_encrypted` when any of it is encrypted (redacted) data, `reasoning_summarised` when
    only a summary came back; None when the reasoning came as text (or no details came at all)."""
    if not isinstance(details, list):
        return None
    kinds = {d.get("type") for d in details if isinstance(d, dict)}
    if ReasoningDetail.ENCRYPTED in kinds:
        return "reasoning_encrypted"
    if ReasoningDetail.SUMMARY in kinds and ReasoningDetail.TEXT not in kinds:
        return "reasoning_summarised"
    return None


def _hidden_reasoning(request: dict[str, Any], usage: dict[str, Any], turn: Turn, thinking: bool) -> bool:
    """The model reasoned but the text was not returned: its tokens cannot be rebuilt."""
    if turn.reasoning or not thinking:
        return False
    details = usage.get("completion_tokens_details") or {}
    if (_int(details.get("reasoning_tokens")) or 0) > 0:
        return True
    r = request.get("reasoning")
    return isinstance(r, dict) and r.get("exclude") is True


def find_pieces(text: str, pieces: Sequence[tuple[str, str]]) -> tuple[str | None, bool]:
    """Are the pieces in `text`, in order? -> (label of the first missing one, whitespace-normalized).
    A piece found only once stripped of surrounding whitespace (a template that trims) counts as
    found and sets the second value."""
    pos, normalized = 0, False
    for label, piece in pieces:
        if not piece:
            continue
        i = text.find(piece, pos)
        if i < 0:
            piece = piece.strip()
            normalized = True
            if not piece:
                continue
            i = text.find(piece, pos)
            if i < 0:
                return label, normalized
        pos = i + len(piece)
    return None, normalized


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


class Reconstructor:
    """Turns records into samples for one (chat format, tokenizer) pair; call it per record.
    `unsaid`: whether the model thought when neither the answer nor the request says, tried first
    (None: the format's default; the canary's detector may have found the provider's)."""

    def __init__(self, fmt: ChatFormat, tokenizer: LoadedTokenizer, unsaid: bool | None = None):
        self.fmt = fmt
        self.tok = tokenizer
        self.unsaid = fmt.default_thinking if unsaid is None else unsaid
        ends = getattr(fmt, "end_markers", ())
        self.marker_ids = {m: tid for m in (*fmt.markers, *ends) if (tid := tokenizer.token_id(m)) is not None}
        self.boundary = tuple(m for m in self.marker_ids if tokenizer.boundary_safe(m))

    def _excluded(self, record: Record, reason: str, message: str) -> Excluded:
        sid, source, turn = record.get("sample_id", ""), record.get("source", ""), _int(record.get("turn")) or 0
        at = f" turn {turn}" if "turn" in record else ""
        row = record.get("row")
        row = row + 1 if isinstance(row, int) else row  # 1-based, as editors and samples/bad_rows.jsonl count
        return Excluded(sid, source, reason, f"sample {sid} ({source} row {row}{at}): {message}", turn)

    def _clean_split(self, prompt: str, response: str) -> bool:
        return not response or any(prompt.endswith(m) or response.startswith(m) for m in self.boundary)

    def _tokens(self, r: Rendering) -> tuple[list[int], list[int], str, list[str]] | str:
        """(prompt ids, response ids, response text, flags), or why the prompt is not a prefix."""
        flags: list[str] = []
        if not r.whole.startswith(r.prompt):
            prompt_ids, whole_ids = self.tok.encode(r.prompt), self.tok.encode(r.whole)
            if whole_ids[:len(prompt_ids)] != prompt_ids:
                at = _first_difference(r.prompt, r.whole)
                return f"the rendered prompt is not a prefix of the rendered whole (they differ at character {at})"
            resp_ids = whole_ids[len(prompt_ids):]
            return prompt_ids, resp_ids, self.tok.decode(resp_ids), flags
        response = r.whole[len(r.prompt):]
        if r.end_markers:  # a template may print text after the end of turn: never generated
            cut = max((response.rfind(m) + len(m) for m in r.end_markers if m in response), default=-1)
            if cut < 0:
                flags.append("no_end_of_turn")
            else:
                response = response[:cut]
        prompt_ids = self.tok.encode(r.prompt)
        if self._clean_split(r.prompt, response):
            return prompt_ids, self.tok.encode(response), response, flags
        whole_ids = self.tok.encode(r.prompt + response)
        if whole_ids[:len(prompt_ids)] != prompt_ids:
            return "the prompt's tokens are not a prefix of the whole's (a token spans the boundary)"
        return prompt_ids, whole_ids[len(prompt_ids):], response, flags

    def response_ids(self, rendering: Rendering) -> list[int] | None:
        """The response's token ids as this rebuild cuts them (None: the prompt is not a prefix): what
        a model generated when it wrote this answer; the simulator counts its completion tokens so."""
        got = self._tokens(rendering)
        return None if isinstance(got, str) else got[1]

    def _logprobs(self, resp_ids: list[int], logprobs: Any) -> str | None:
        entries = logprobs.get("content") if isinstance(logprobs, dict) else logprobs
        if not isinstance(entries, list) or not entries:
            return None
        theirs = []
        for e in entries:
            if not isinstance(e, dict) or not isinstance(e.get("token"), str):
                return None
            b = e.get("bytes")
            theirs.append(bytes(b) if isinstance(b, list) else e["token"].encode())
        ours = [self.tok.token_bytes(t) for t in resp_ids]
        n = len(theirs)
        for i in range(len(ours) - n + 1):
            if ours[i] == theirs[0] and ours[i:i + n] == theirs:
                return "match"
        return "mismatch"

    def __call__(self, record: Record) -> Sample | Excluded:
        status = record.get("status")
        if status != "ok":
            err = record.get("error") or {}
            why = f"{err.get('type')}: {err.get('message')}" if err else f"generation status is {status!r}"
            return self._excluded(record, f"status_{status}",
                                  f"{'never sent' if status == 'rejected' else 'failed'} ({why})")
        if record.get("policy") == "drop":
            return self._excluded(record, "policy_drop", "dropped by the tool policy")
        response, request = record.get("response"), record.get("request") or {}
        if not response:
            return self._excluded(record, "no_response", "the record has no response")
        if response.get("finish_reason") == "content_filter":
            return self._excluded(record, "content_filter", "the provider filtered the answer")
        if opaque := opaque_reasoning(response.get("reasoning_details")):
            return self._excluded(record, opaque, "the provider returned the reasoning only "
                                  f"{'encrypted' if opaque == 'reasoning_encrypted' else 'summarised'}: "
                                  "the tokens the model wrote cannot be rebuilt")
        usage = record.get("usage") or {}
        try:
            turn = turn_of(response)
        except FormatError as e:
            return self._excluded(record, e.reason, str(e))
        readings = thinking_readings(request, usage, turn, self.unsaid)
        first = self._build(record, request, response, usage, turn, readings[0])
        if len(readings) == 1:
            return first
        # Neither the answer nor the request says: the provider's reading first; the other when the
        # first cannot give this answer or the provider's prompt count says otherwise.
        if not (isinstance(first, Sample) and first.prompt_gap in (0, None)):
            other = self._build(record, request, response, usage, turn, readings[1])
            if isinstance(other, Sample) and (other.prompt_gap == 0 or (
                    isinstance(first, Excluded) and first.reason in RENDERING_REASONS)):
                return self._inferred(other, readings[1])
        return self._inferred(first, readings[0])

    def _inferred(self, result: Sample | Excluded, thinking: bool) -> Sample | Excluded:
        """A sample rebuilt with a reading nothing said and the template would not take: flagged."""
        if isinstance(result, Excluded) or thinking == self.fmt.default_thinking:
            return result
        return dataclasses.replace(result, flags=(*result.flags, "thinking_inferred"))

    def _build(self, record: Record, request: dict[str, Any], response: dict[str, Any], usage: dict[str, Any],
               turn: Turn, thinking: bool) -> Sample | Excluded:
        try:
            if _hidden_reasoning(request, usage, turn, thinking):
                return self._excluded(record, "reasoning_missing",
                                      "the model reasoned but no reasoning text was returned")
            rendering = self.fmt.render(request.get("messages") or [], request.get("tools") or None, turn, thinking)
        except FormatError as e:
            return self._excluded(record, e.reason, str(e))
        got = self._tokens(rendering)
        if isinstance(got, str):
            return self._excluded(record, "prefix_mismatch", got)
        prompt_ids, resp_ids, response_text, flags = got

        decoded = self.tok.decode(resp_ids)
        if decoded != response_text:
            at = _first_difference(decoded, response_text)
            return self._excluded(record, "decode_mismatch",
                                  f"decoding the response tokens changes the text at character {at}: "
                                  f"{decoded[at:at + 20]!r} instead of {response_text[at:at + 20]!r}")
        missing, normalized = find_pieces(decoded, rendering.pieces)
        if missing:
            return self._excluded(record, "decode_mismatch", f"the returned {missing} is not in the decoded response")
        for marker, tid in self.marker_ids.items():
            in_text = decoded.count(marker)  # 0 in the text means 0 as an ID: that decodes to the text
            if in_text and in_text != resp_ids.count(tid):
                return self._excluded(record, "marker_split",
                                      f"marker {marker!r} is not a single token in the response")
        n = len(prompt_ids) + len(resp_ids)
        if self.tok.max_length is not None and n > self.tok.max_length:
            return self._excluded(record, "too_long",
                                  f"{n} tokens, more than the tokenizer's maximum {self.tok.max_length}")

        flags = [*rendering.flags, *flags]
        if normalized and "whitespace_normalized" not in flags:
            flags.append("whitespace_normalized")
        if not turn.finished:
            flags.append("truncated")
        if record.get("policy") == "flag":
            flags.append("tool_policy_flag")
        if (record.get("agentic") or {}).get("divergedFrom") is not None:
            flags.append("diverged")  # keepOriginal: this turn or an earlier one left the dataset's path
        completion, prompt_tokens = _int(usage.get("completion_tokens")), _int(usage.get("prompt_tokens"))
        gap = len(resp_ids) - completion if completion is not None else None
        if gap is not None and abs(gap) > max(GAP_ABS, GAP_REL * (completion or 0)):
            flags.append("token_count_gap")
        lp = self._logprobs(resp_ids, response.get("logprobs"))
        if lp == "mismatch":
            flags.append("logprob_mismatch")
        segments = segment_starts(decoded, rendering.pieces, bool(turn.calls), len(prompt_ids), resp_ids,
                                  [self.tok.token_bytes(t) for t in resp_ids], self.tok.decode)
        provider = response.get("provider")
        return Sample(record.get("sample_id", ""), record.get("source", ""), prompt_ids + resp_ids,
                      len(prompt_ids), tuple(flags), gap,
                      len(prompt_ids) - prompt_tokens if prompt_tokens is not None else None, lp,
                      _int(record.get("turn")) or 0,
                      provider=provider if isinstance(provider, str) and provider else None, segments=segments,
                      fingerprint=record.get("fingerprint"))

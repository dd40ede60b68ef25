"""Prompt readers: JSONL, JSONL.gz and Parquet rows in the `openai`, `sharegpt` and `glaive` formats.

Two readings of a row: the conversation up to its last user turn (`generation.turns: last`, the
answer to it is what is bought), or the whole conversation (`turns: all`, every assistant turn is
regenerated; see `eyrie.jobs.generate.sending.conversation`). A whole conversation is normalized to the
OpenAI form: assistant `tool_calls` (each with an id and `arguments` as a string) and `tool`
messages with the `tool_call_id` they answer, whatever the row used (sharegpt `function_call` /
`observation`, glaive `<functioncall>` / `FUNCTION RESPONSE:`, Hermes `<tool_call>` /
`<tool_response>` text, OpenAI's older `function_call` / `function`). A result with no call to
answer, or a call never answered, makes the row a bad row.

A source yields one `Prompt` per good row and one `BadRow` per row it cannot use, so a single bad row
is counted and reported (with its 0-based row number) instead of stopping a paid run. Only a source
that cannot be opened at all raises `SourceError`; `check_source` finds that before any request.

Row numbers are stable: for JSONL they are the 0-based line index (blank lines keep their number but
yield nothing), for Parquet the 0-based row index. They feed the sample id, so they must not shift.

The rooms, lowest first: `errors` (SourceError, RowError), `calls` (whole conversations and their tool
calls in OpenAI form), `formats` (the three row formats), `reading` (bytes through the store, the index,
`iter_source`). Callers import from here.
"""

from eyrie.jobs.contract.prompt import BadRow, Prompt
from eyrie.jobs.sources.calls import outside_calls, whole_conversation
from eyrie.jobs.sources.errors import SourceError
from eyrie.jobs.sources.formats import glaive_first_user, original_answer, prompt_from_row
from eyrie.jobs.sources.reading import MARK_ROWS, Mark, SourceIndex, check_source, decode_line, iter_source, scan_source

__all__ = [
    "MARK_ROWS", "BadRow", "Mark", "Prompt", "SourceError", "SourceIndex", "check_source", "decode_line",
    "glaive_first_user", "iter_source", "original_answer", "outside_calls", "prompt_from_row", "scan_source",
    "whole_conversation",
]

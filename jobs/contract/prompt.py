"""What a source yields, row by row: a `Prompt` to answer or a `BadRow` never sent.

Below every stage (the tool declarations, the request builder, the simulator all take a `Prompt`); the readers
that make them are `jobs/sources/`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eyrie.jobs.contract.layout import sample_id

__all__ = ["BadRow", "Prompt"]


@dataclass
class Prompt:
    """One request's worth of conversation: `messages` end with the user turn to answer, or (read
    whole, `generation.turns: all`) hold the whole normalized conversation.

    `tools` are the OpenAI tools the row gives structurally (None when it gives none); tools declared
    as text in the system message stay there until `eyrie.jobs.tools.prepare_prompt` moves them.
    """

    source: str
    row: int
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    fmt: str
    # read only when asked (`generation.answers: dataset`): the row's own answer to `messages`, in OpenAI
    # message form (content, reasoning_content, tool_calls), or None when the row has none
    answer: dict[str, Any] | None = None

    def sample_id(self) -> str:
        """The one sample identity (DESIGN §3): source, row and content (messages and row tools)."""
        return sample_id(self.source, self.row, {"messages": self.messages, "tools": self.tools})


@dataclass
class BadRow:
    """A row that yields no prompt; `reason` says what is wrong in terms a user can fix."""

    source: str
    row: int
    reason: str

    def sample_id(self) -> str:
        """Source and row only: the id must not change with the wording of `reason`."""
        return sample_id(self.source, self.row, {"badRow": True})

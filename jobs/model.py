"""The base of every typed document eyrie writes or reads: the spec and status (`jobs/spec.py`), progress.json
(`contract/progress.py`). camelCase on the wire, snake_case in Python, unknown fields refused unless a document
says otherwise; a field's docstring is its description (the CRD, the spec reference)."""

from __future__ import annotations

from typing import Any

from pydantic import AliasGenerator, BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class Model(BaseModel):
    """Base: camelCase aliases, unknown fields rejected (a typo must not silently do nothing)."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=AliasGenerator(validation_alias=to_camel, serialization_alias=to_camel),
        populate_by_name=True,
        frozen=False,
        use_attribute_docstrings=True,  # a field's docstring is its description (CRD, reference)
    )

    def dump(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def wire(self) -> dict[str, Any]:
        """As sent to an API that spells fields in snake_case (OpenRouter's request objects)."""
        return self.model_dump(mode="json", by_alias=False, exclude_none=True)

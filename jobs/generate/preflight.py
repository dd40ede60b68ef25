"""Everything that can fail before the first paid request fails here, and costs nothing."""

from __future__ import annotations

from eyrie.jobs.errors import InputError
from eyrie.jobs.spec import DatasetGenerationSpec
from eyrie.jobs.store import Store


class PreflightError(InputError, RuntimeError):
    """The run cannot start: nothing was paid; the message says what to fix."""


async def preflight(spec: DatasetGenerationSpec, base_url: str, store: Store, api_key: str | None) -> None:
    """Everything that can fail before the first paid request fails here."""
    from eyrie.jobs.api import ApiError, ChatClient
    from eyrie.jobs.sources import SourceError, check_source

    for i, source in enumerate(spec.sources):
        try:
            check_source(source, spec.output.endpoint)
        except SourceError as e:
            raise PreflightError(f"sources[{i}].uri: {e}") from None
    try:
        store.check_writable()
    except Exception as e:
        raise PreflightError(f"output.uri: the store is not writable: {e}") from None
    async with ChatClient(base_url, api_key, timeout=min(30.0, spec.api.request_timeout_seconds),
                          max_retries=0, max_concurrency=1) as client:
        try:
            await client.preflight()
        except ApiError as e:
            raise PreflightError(f"api.baseUrl: {e}") from None
    if spec.extraction.enabled:
        from eyrie.jobs.extract.layers import LayerError, read_specforge_config, specforge_layer_ids

        try:  # a draft config that cannot be used must fail now, not after generation was paid
            config = read_specforge_config(spec.extraction.layers, spec.output.endpoint)
            if config is not None:
                specforge_layer_ids(config, str(spec.extraction.layers).removeprefix("specforge:"))
        except LayerError as e:
            raise PreflightError(str(e)) from None
    if spec.target.tokenizer:
        from eyrie.jobs.reconstruct.formats import check_tokenizer

        try:
            tok = check_tokenizer(spec.target, spec.output.endpoint)
        except Exception as e:
            raise PreflightError(f"target.tokenizer: {e}") from None
        if spec.generation.turns == "all" and spec.samples.multi_turn == "packed":
            from eyrie.jobs.reconstruct.formats import packing_refused, resolve_format

            fmt = resolve_format(spec.target.chat_format, tok)
            if reason := packing_refused(fmt):
                raise PreflightError(f"samples.multiTurn: packed is refused for {fmt.name}: {reason}; use perTurn")



"""Everything that can fail before the first paid request fails here, and costs nothing."""

from __future__ import annotations

from dataclasses import dataclass, field

from eyrie.jobs.errors import InputError
from eyrie.jobs.spec import DatasetGenerationSpec, SourceSpec
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
    if spec.generation.answers == "regenerate":  # the dataset's own answers send nothing: no API to reach
        async with ChatClient.unpaid(base_url, api_key, timeout=spec.api.request_timeout_seconds) as client:
            try:
                await client.preflight()
            except ApiError as e:
                raise PreflightError(f"api.baseUrl: {e}") from None
    if spec.extraction.enabled:
        from eyrie.jobs.contract.layers import LayerError, read_specforge_config, specforge_layer_ids

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




def empty_source(index: int, source: SourceSpec) -> PreflightError:
    """A source without a single row is an error: a run over it would end "Done 0/0" having bought nothing."""
    return PreflightError(f"sources[{index}].uri: source {source.name!r}: {source.uri} holds no rows (an empty "
                          "file, or blank lines only); fill it or remove the source")


@dataclass
class SourceCheck:
    """What `eyrie validate` found in one source: its rows and the ones a run would never send."""

    index: int
    name: str
    uri: str
    rows: int = 0
    bad: int = 0
    first_bad: list[tuple[int, str, str]] = field(default_factory=list)  # (row, 1-based; error type; reason)


def inspect_sources(spec: DatasetGenerationSpec, shown: int = 20) -> list[SourceCheck]:
    """Read every row of every source (their `limit` applied) the way a run does and report the ones it
    would reject, without sending anything. Raises PreflightError for a source that is missing,
    unreadable or holds no rows (a run refuses those too)."""
    from eyrie.jobs.contract.fingerprint import generated_mode
    from eyrie.jobs.generate.sending.requests import prepare_row
    from eyrie.jobs.sources import SourceError, iter_source

    whole = spec.generation.turns == "all"
    mode = generated_mode(spec)
    out = []
    for i, src in enumerate(spec.sources):
        check = SourceCheck(i, src.name, src.uri)
        try:
            for item in iter_source(src, spec.output.endpoint, whole=whole):
                check.rows += 1
                verdict = prepare_row(item, mode, whole=whole)
                if isinstance(verdict, tuple):
                    check.bad += 1
                    if len(check.first_bad) < shown:
                        check.first_bad.append((item.row + 1, *verdict))
        except SourceError as e:
            raise PreflightError(f"sources[{i}].uri: {e}") from None
        if check.rows == 0:
            raise empty_source(i, src)
        out.append(check)
    return out

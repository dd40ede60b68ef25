"""Who serves the target model: OpenRouter's endpoint listing, read as its API reference documents it.

`GET /models/{author}/{slug}/endpoints` answers `{"data": {"id", "name", ..., "endpoints": [...]}}`,
one `PublicEndpoint` per provider endpoint: `name`, `provider_name`, `tag` (the slug `provider.only`
and `order` take, e.g. `deepinfra/turbo`), `quantization`, `context_length`, `max_completion_tokens`,
`max_prompt_tokens`, `pricing` (USD per token, as decimal strings), `supported_parameters`, `status`
and uptime figures. An unknown model is a 404 with OpenRouter's error body (`{"error": {"code": 404,
...}}`). Another OpenAI-compatible API (vLLM, SGLang, a provider's own) has no listing: it is the
single endpoint it is, named by its host, and nothing is routed.

`parse_listing` is pure; `list_endpoints` does the one GET (free: nothing is paid for a listing).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote, urlsplit

import orjson

from eyrie.jobs.api.errors import ApiError
from eyrie.jobs.api.provider_errors import parse_error_body
from eyrie.jobs.errors import InputError

MILLION = Decimal(1_000_000)
MAX_ENDPOINTS = 256  # a listing longer than this is refused (no model has nearly as many providers)


class ListingError(ApiError):
    """The endpoint listing answered something eyrie cannot read; the message names the field."""


class ModelNotListed(InputError, ApiError):
    """The listing does not know the model: nothing can be probed, nothing was paid."""


@dataclass(frozen=True)
class Endpoint:
    """One provider endpoint of the model; prices in USD per million tokens (None: not listed)."""

    tag: str
    provider_name: str
    name: str = ""
    quantization: str | None = None
    context_length: int | None = None
    max_completion_tokens: int | None = None
    max_prompt_tokens: int | None = None
    prompt_per_million: Decimal | None = None
    completion_per_million: Decimal | None = None
    supported_parameters: tuple[str, ...] | None = None  # None: the API does not say
    status: int | None = None
    uptime_last_30m: float | None = None

    def to_json(self) -> dict[str, Any]:
        money = {k: str(v) for k, v in (("promptPerMillion", self.prompt_per_million),
                                         ("completionPerMillion", self.completion_per_million)) if v is not None}
        return {"tag": self.tag, "providerName": self.provider_name, "name": self.name,
                "quantization": self.quantization, "contextLength": self.context_length,
                "maxCompletionTokens": self.max_completion_tokens, "maxPromptTokens": self.max_prompt_tokens,
                "pricing": money,
                "supportedParameters": list(self.supported_parameters) if self.supported_parameters is not None
                else None, "status": self.status, "uptimeLast30m": self.uptime_last_30m}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Endpoint:
        """Read back what `to_json` wrote (a stored probe)."""
        money = d.get("pricing") or {}
        params = d.get("supportedParameters")
        return cls(d["tag"], d["providerName"], d.get("name") or "", d.get("quantization"), d.get("contextLength"),
                   d.get("maxCompletionTokens"), d.get("maxPromptTokens"),
                   Decimal(money["promptPerMillion"]) if "promptPerMillion" in money else None,
                   Decimal(money["completionPerMillion"]) if "completionPerMillion" in money else None,
                   tuple(params) if params is not None else None, d.get("status"), d.get("uptimeLast30m"))


@dataclass(frozen=True)
class Listing:
    """The endpoints of one model; `listed` False: the API has no listing and is its one endpoint."""

    model: str
    endpoints: tuple[Endpoint, ...]
    listed: bool = True

    def tags(self) -> list[str]:
        return [e.tag for e in self.endpoints]

    def get(self, tag: str) -> Endpoint | None:
        return next((e for e in self.endpoints if e.tag == tag), None)


def _int(v: Any, where: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
        raise ListingError(f"endpoint listing: {where} is {v!r}, not an integer")
    return int(v)


def _per_million(v: Any, where: str) -> Decimal | None:
    """A listing price (USD per token, a decimal string) per million tokens."""
    if v is None:
        return None
    try:
        d = Decimal(str(v))
    except InvalidOperation:
        raise ListingError(f"endpoint listing: {where} is {v!r}, not a decimal price") from None
    if not d.is_finite():
        raise ListingError(f"endpoint listing: {where} is {v!r}, not a finite price")
    # "-1" marks a variable price on OpenRouter's router models: not a price reservations can use
    return (d * MILLION).normalize() if d >= 0 else None


def parse_endpoint(e: Any, where: str) -> Endpoint:
    """One PublicEndpoint object; `tag` and `provider_name` are required, the rest may be null."""
    if not isinstance(e, dict):
        raise ListingError(f"endpoint listing: {where} is not an object")
    tag, provider = e.get("tag"), e.get("provider_name")
    if not isinstance(tag, str) or not tag:
        raise ListingError(f"endpoint listing: {where}.tag is missing (the slug provider.only takes)")
    if not isinstance(provider, str) or not provider:
        raise ListingError(f"endpoint listing: {where}.provider_name is missing")
    pricing = e.get("pricing") if isinstance(e.get("pricing"), dict) else {}
    params = e.get("supported_parameters")
    if params is not None and not (isinstance(params, list) and all(isinstance(p, str) for p in params)):
        raise ListingError(f"endpoint listing: {where}.supported_parameters is not a list of names")
    status = e.get("status")
    uptime = e.get("uptime_last_30m")
    quant = e.get("quantization")
    return Endpoint(
        tag=tag, provider_name=provider, name=str(e.get("name") or ""),
        quantization=quant if isinstance(quant, str) else None,
        context_length=_int(e.get("context_length"), f"{where}.context_length"),
        max_completion_tokens=_int(e.get("max_completion_tokens"), f"{where}.max_completion_tokens"),
        max_prompt_tokens=_int(e.get("max_prompt_tokens"), f"{where}.max_prompt_tokens"),
        prompt_per_million=_per_million(pricing.get("prompt"), f"{where}.pricing.prompt"),
        completion_per_million=_per_million(pricing.get("completion"), f"{where}.pricing.completion"),
        supported_parameters=tuple(params) if params is not None else None,
        status=status if isinstance(status, int) and not isinstance(status, bool) else None,
        uptime_last_30m=float(uptime) if isinstance(uptime, (int, float)) and not isinstance(uptime, bool) else None)


def parse_listing(doc: Any, model: str) -> Listing:
    """`{"data": {..., "endpoints": [...]}}` -> a Listing; a tag listed twice keeps its first entry."""
    data = doc.get("data") if isinstance(doc, dict) else None
    endpoints = data.get("endpoints") if isinstance(data, dict) else None
    if not isinstance(endpoints, list):
        raise ListingError("endpoint listing: data.endpoints is missing or not a list")
    if len(endpoints) > MAX_ENDPOINTS:
        raise ListingError(f"endpoint listing: {len(endpoints)} endpoints (more than {MAX_ENDPOINTS})")
    out: dict[str, Endpoint] = {}
    for i, e in enumerate(endpoints):
        ep = parse_endpoint(e, f"data.endpoints[{i}]")
        out.setdefault(ep.tag, ep)
    return Listing(model, tuple(out.values()))


def single_endpoint(base_url: str, model: str) -> Listing:
    """An API without a listing: the one endpoint it is, named by its host and port."""
    parts = urlsplit(base_url)
    tag = (parts.hostname or "endpoint") + (f":{parts.port}" if parts.port else "")
    return Listing(model, (Endpoint(tag=tag, provider_name=tag, name=base_url),), listed=False)


def listing_path(model: str) -> str | None:
    """`/models/{author}/{slug}/endpoints` for an `author/slug` model id (None for any other id)."""
    author, sep, slug = model.partition("/")
    if not sep or not author or not slug or "/" in slug:
        return None
    # a variant suffix (":free", ":thinking") is part of the slug OpenRouter lists
    return f"/models/{quote(author, safe='')}/{quote(slug, safe=':')}/endpoints"


async def list_endpoints(client: Any, model: str) -> Listing:
    """The endpoints serving `model` through `client` (an `api.ChatClient`): OpenRouter's listing,
    or the single endpoint of an API that has none. An unknown model raises ModelNotListed."""
    path = listing_path(model)
    if path is None:
        if client.is_openrouter:
            raise ModelNotListed(f"target.model: {model!r} is not an author/slug model id OpenRouter lists")
        return single_endpoint(client.base_url, model)
    status, raw = await client.get(path)
    if status == 200:
        try:
            doc = orjson.loads(raw)
        except orjson.JSONDecodeError:
            doc = None
        if isinstance(doc, dict) and isinstance(doc.get("data"), dict) and "endpoints" in doc["data"]:
            return parse_listing(doc, model)
        if client.is_openrouter:
            raise ListingError(f"endpoint listing of {model}: the answer is not {{data: {{endpoints: [...]}}}}")
        return single_endpoint(client.base_url, model)
    err = parse_error_body(raw)
    if status == 404 and (client.is_openrouter or err.status == 404):
        # OpenRouter's documented NotFoundResponse: the route exists, the model does not
        raise ModelNotListed(f"target.model: the endpoint listing at {client.base_url} does not know {model!r} "
                             f"(HTTP 404: {err.message}); check the model id")
    if client.is_openrouter:
        raise ListingError(f"endpoint listing of {model}: HTTP {status}: {err.message}")
    return single_endpoint(client.base_url, model)

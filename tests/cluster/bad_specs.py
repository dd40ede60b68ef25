"""Bad specs: each one is refused by the API server (CRD schema, CEL) and by `eyrie validate`, both naming the field.

A table, so that a rule added on one side only shows up as a row where the two disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Spec = dict[str, Any]


@dataclass(frozen=True)
class BadSpec:
    id: str
    field: str  # the path both must name, in kubectl's notation
    change: Callable[[Spec], None]


def _set(path: str, value: Any) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        *parents, last = path.split(".")
        node: Any = spec
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return change


def _drop(path: str) -> Callable[[Spec], None]:
    def change(spec: Spec) -> None:
        *parents, last = path.split(".")
        node: Any = spec
        for p in parents:
            node = node[p]
        del node[last]
    return change


BAD_SPECS: tuple[BadSpec, ...] = (
    BadSpec("zero-budget", "spec.budget.maxUSD", _set("budget.maxUSD", "0")),
    BadSpec("negative-budget", "spec.budget.maxUSD", _set("budget.maxUSD", "-1")),
    BadSpec("budget-not-a-number", "spec.budget.maxUSD", _set("budget.maxUSD", "ten")),
    BadSpec("price-not-a-number", "spec.budget.pricing.inputPerMillion",
            _set("budget.pricing.inputPerMillion", "free")),
    BadSpec("unknown-top-field", "spec.surprise", _set("surprise", 1)),
    BadSpec("misspelled-field", "spec.api.maxConcurency", _set("api.maxConcurency", 3)),
    BadSpec("zero-concurrency", "spec.api.maxConcurrency", _set("api.maxConcurrency", 0)),
    BadSpec("no-sources", "spec.sources", _set("sources", [])),
    BadSpec("unknown-source-format", "spec.sources[0].format", _set("sources.0.format", "csv")),
    BadSpec("bad-source-name", "spec.sources[0].name", _set("sources.0.name", "no spaces!")),
    BadSpec("no-output", "spec.output", _drop("output")),
    BadSpec("unknown-ray-mode", "spec.generation.ray.mode", _set("generation.ray.mode", "Cloud")),
    BadSpec("shards-not-a-number", "spec.generation.shards", _set("generation.shards", "four")),
    BadSpec("zero-shards", "spec.generation.shards", _set("generation.shards", 0)),
    BadSpec("memory-not-a-quantity", "spec.generation.ray.memoryPerWorker",
            _set("generation.ray.memoryPerWorker", "4GB")),
    BadSpec("memory-with-a-space", "spec.generation.ray.memoryPerWorker",
            _set("generation.ray.memoryPerWorker", "4 Gi")),
    BadSpec("zero-pre-running-deadline", "spec.generation.ray.preRunningDeadlineSeconds",
            _set("generation.ray.preRunningDeadlineSeconds", 0)),
)

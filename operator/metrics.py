"""Prometheus metrics of the operator: runs by phase, spend, samples, errors, suspensions by reason."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

REGISTRY = CollectorRegistry()
RUNS = Gauge("eyrie_datasetgenerations", "DatasetGenerations by phase", ["phase"], registry=REGISTRY)
SPENT = Gauge("eyrie_spent_usd", "Cumulative spend of a DatasetGeneration in USD",
              ["namespace", "name"], registry=REGISTRY)
BUDGET = Gauge("eyrie_budget_usd", "Budget (spec.budget.maxUSD) in USD", ["namespace", "name"],
               registry=REGISTRY)
SAMPLES = Gauge("eyrie_samples", "Samples by state", ["namespace", "name", "state"], registry=REGISTRY)
ERRORS = Counter("eyrie_reconcile_errors_total", "Reconcile passes that raised, by exception type",
                 ["error"], registry=REGISTRY)
SUSPENSIONS = Counter("eyrie_suspensions_total", "Runs suspended, by reason", ["reason"], registry=REGISTRY)
RECONCILES = Counter("eyrie_reconciles_total", "Reconcile passes", registry=REGISTRY)


class PhaseTracker:
    """Counts runs by phase from each object's latest phase (a gauge needs the whole picture)."""

    def __init__(self) -> None:
        self._phase: dict[tuple[str, str], str] = {}

    def observe(self, namespace: str, name: str, phase: str | None, status: dict) -> None:
        key = (namespace, name)
        old = self._phase.get(key)
        if phase != old:
            if old is not None:
                RUNS.labels(old).dec()
            if phase is not None:
                RUNS.labels(phase).inc()
                self._phase[key] = phase
            else:
                self._phase.pop(key, None)
        with contextlib.suppress(ValueError):
            SPENT.labels(namespace, name).set(float(status.get("spentUSD") or 0))
        for state, n in (status.get("samples") or {}).items():
            SAMPLES.labels(namespace, name, state).set(n)

    def forget(self, namespace: str, name: str) -> None:
        old = self._phase.pop((namespace, name), None)
        if old is not None:
            RUNS.labels(old).dec()
        for metric in (SPENT, BUDGET):
            with contextlib.suppress(KeyError):
                metric.remove(namespace, name)


TRACKER = PhaseTracker()


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Expose /metrics on a background thread."""
    start_http_server(port, addr=addr, registry=REGISTRY)

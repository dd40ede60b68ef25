"""The operator's settings, read once at start-up (arguments, then the env the chart may set) into
one typed object that kopf's memo carries to every handler: nothing reads the environment later."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass

from eyrie.jobs.contract.progress import STOP_GRACE_SECONDS
from eyrie.jobs.errors import InputError

from .passes import DEFAULT_MAX_PASSES

DEFAULT_INTERVAL = 5.0
DEFAULT_METRICS_PORT = 9090


class ConfigError(InputError, ValueError):
    """A setting the operator cannot run with; the message names the flag."""


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: every namespace (cluster-wide)
    standalone: bool = False
    liveness: str | None = None
    metrics_port: int = DEFAULT_METRICS_PORT  # 0: no metrics endpoint
    metrics_address: str = "0.0.0.0"
    interval: float = DEFAULT_INTERVAL  # seconds between polls of each resource
    max_passes: int = DEFAULT_MAX_PASSES  # reconcile passes at once (new objects and spec edits first)
    stop_grace: float = STOP_GRACE_SECONDS  # seconds a stopping job gets before its child is deleted
    verbose: bool = False

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ConfigError(f"--interval must be positive, got {self.interval}")
        if self.max_passes < 1:
            raise ConfigError(f"--max-passes must be at least 1, got {self.max_passes}")
        if self.stop_grace < 0:
            raise ConfigError(f"--stop-grace must not be negative, got {self.stop_grace}")


def parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="eyrie operator",
                                 description="Watch DatasetGenerations and run them (kopf operator).")
    ap.add_argument("--namespace", "-n", action="append", default=[],
                    help="serve only this namespace (repeatable; glob patterns allowed); default: all")
    ap.add_argument("--standalone", action="store_true",
                    help="no peering with other operator replicas (one replica, or tests)")
    ap.add_argument("--liveness", default=None, metavar="URL",
                    help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    ap.add_argument("--metrics-port", type=int, default=int(env.get("EYRIE_METRICS_PORT", DEFAULT_METRICS_PORT)),
                    help="Prometheus /metrics port (0 disables; default $EYRIE_METRICS_PORT or 9090)")
    ap.add_argument("--metrics-address", default="0.0.0.0")
    ap.add_argument("--interval", type=float, default=DEFAULT_INTERVAL,
                    help=f"seconds between progress polls of each resource (default {DEFAULT_INTERVAL:g})")
    ap.add_argument("--max-passes", type=int, default=DEFAULT_MAX_PASSES,
                    help="reconcile passes at once; new objects and spec edits go before polls "
                         f"(default {DEFAULT_MAX_PASSES})")
    ap.add_argument("--stop-grace", type=float, default=STOP_GRACE_SECONDS,
                    help="seconds a generation job gets to stop gracefully before its child is deleted "
                         f"(default {STOP_GRACE_SECONDS:g})")
    ap.add_argument("--verbose", "-v", action="store_true")
    return ap


def from_args(args: argparse.Namespace) -> OperatorConfig:
    return OperatorConfig(namespaces=tuple(args.namespace), standalone=args.standalone, liveness=args.liveness,
                          metrics_port=args.metrics_port, metrics_address=args.metrics_address,
                          interval=args.interval, max_passes=args.max_passes, stop_grace=args.stop_grace,
                          verbose=args.verbose)

"""`eyrie operator`: run the kopf operator (what the Helm chart's Deployment runs)."""

from __future__ import annotations

import argparse
import logging
import os

from .config import OperatorConfig, from_args, parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    return parser(os.environ).parse_args(argv)


class _QuietSuccess(logging.Filter):
    """kopf reports every timer tick and handler run as succeeded; keep the log for what matters."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith(("Timer '", "Handler '")) and msg.endswith("succeeded."))


def operator_main(argv: list[str]) -> int:
    cfg: OperatorConfig = from_args(parse_args(argv))
    logging.basicConfig(level=logging.DEBUG if cfg.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not cfg.verbose:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_QuietSuccess())
    import kopf

    from eyrie.operator import handlers, metrics

    if cfg.metrics_port:
        metrics.serve(cfg.metrics_port, cfg.metrics_address)
    logging.getLogger("eyrie.operator").info(
        f"serving {', '.join(cfg.namespaces) or 'all namespaces'}; poll interval {cfg.interval:g}s")
    kopf.run(
        registry=handlers.registry(cfg),
        memo=kopf.Memo(state=handlers.Memo(cfg)),
        standalone=cfg.standalone,
        clusterwide=not cfg.namespaces,
        namespaces=list(cfg.namespaces),
        liveness_endpoint=cfg.liveness,
    )
    return 0

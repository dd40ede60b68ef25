"""`eyrie operator`: run the kopf operator (what the Helm chart's Deployment runs)."""

from __future__ import annotations

import argparse
import logging
import os


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="eyrie operator",
                                 description="Watch DatasetGenerations and run them (kopf operator).")
    ap.add_argument("--namespace", "-n", action="append", default=[],
                    help="serve only this namespace (repeatable; glob patterns allowed); default: all")
    ap.add_argument("--standalone", action="store_true",
                    help="no peering with other operator replicas (one replica, or tests)")
    ap.add_argument("--liveness", default=None, metavar="URL",
                    help="kopf liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    ap.add_argument("--metrics-port", type=int, default=int(os.environ.get("EYRIE_METRICS_PORT", "9090")),
                    help="Prometheus /metrics port (0 disables)")
    ap.add_argument("--metrics-address", default="0.0.0.0")
    ap.add_argument("--interval", type=float, default=None,
                    help="seconds between progress polls of each resource (default 5)")
    ap.add_argument("--stop-grace", type=float, default=None,
                    help="seconds a generation job gets to stop gracefully before its child is deleted "
                         "(default 120)")
    ap.add_argument("--verbose", "-v", action="store_true")
    return ap.parse_args(argv)


class _QuietSuccess(logging.Filter):
    """kopf reports every timer tick and handler run as succeeded; keep the log for what matters."""

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not (msg.startswith(("Timer '", "Handler '")) and msg.endswith("succeeded."))


def operator_main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.interval is not None:  # read by the handlers module when it registers its timer
        os.environ["EYRIE_OPERATOR_INTERVAL"] = str(args.interval)
    if args.stop_grace is not None:
        os.environ["EYRIE_STOP_GRACE_SECONDS"] = str(args.stop_grace)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_QuietSuccess())
    import kopf

    from eyrie.operator import handlers, metrics

    if args.metrics_port:
        metrics.serve(args.metrics_port, args.metrics_address)
    logging.getLogger("eyrie.operator").info(
        f"serving {', '.join(args.namespace) or 'all namespaces'}; poll interval {handlers.INTERVAL}s")
    kopf.run(
        standalone=args.standalone,
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
    )
    return 0

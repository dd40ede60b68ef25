"""`eyrie operator` arguments: what the Helm chart's Deployment passes."""

from __future__ import annotations

from eyrie.operator.main import parse_args


def test_defaults_serve_all_namespaces() -> None:
    a = parse_args([])
    assert (a.namespace, a.standalone, a.liveness, a.metrics_port) == ([], False, None, 9090)


def test_chart_arguments() -> None:
    a = parse_args(["--namespace", "a", "-n", "b", "--standalone", "--liveness", "http://0.0.0.0:8080/healthz",
                    "--metrics-port", "9100", "--interval", "2", "--stop-grace", "30"])
    assert (a.namespace, a.standalone, a.liveness) == (["a", "b"], True, "http://0.0.0.0:8080/healthz")
    assert (a.metrics_port, a.interval, a.stop_grace) == (9100, 2.0, 30.0)

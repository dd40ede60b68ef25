"""`eyrie operator` arguments: what the Helm chart's Deployment passes, read once into `OperatorConfig`."""

from __future__ import annotations

import ast
from pathlib import Path

import kopf
import pytest

from eyrie.operator import handlers
from eyrie.operator.config import ConfigError, OperatorConfig, from_args, parser
from eyrie.operator.main import parse_args

OPERATOR = Path(handlers.__file__).parent


def test_defaults_serve_all_namespaces() -> None:
    a = parse_args([])
    assert (a.namespace, a.standalone, a.liveness, a.metrics_port) == ([], False, None, 9090)
    assert from_args(a) == OperatorConfig()


def test_chart_arguments() -> None:
    a = parse_args(["--namespace", "a", "-n", "b", "--standalone", "--liveness", "http://0.0.0.0:8080/healthz",
                    "--metrics-port", "9100", "--interval", "2", "--stop-grace", "30", "--max-passes", "8"])
    assert (a.namespace, a.standalone, a.liveness) == (["a", "b"], True, "http://0.0.0.0:8080/healthz")
    assert (a.metrics_port, a.interval, a.stop_grace, a.max_passes) == (9100, 2.0, 30.0, 8)
    cfg = from_args(a)
    assert (cfg.namespaces, cfg.interval, cfg.stop_grace, cfg.metrics_port) == (("a", "b"), 2.0, 30.0, 9100)
    assert handlers.Memo(cfg).gate.limit == 8


def test_the_metrics_port_env_is_read_by_the_parser_only() -> None:
    assert from_args(parser({"EYRIE_METRICS_PORT": "9300"}).parse_args([])).metrics_port == 9300


@pytest.mark.parametrize("argv", [["--interval", "0"], ["--stop-grace", "-1"], ["--max-passes", "0"]])
def test_nonsense_settings_are_refused(argv: list[str]) -> None:
    with pytest.raises(ConfigError, match=argv[0]):
        from_args(parse_args(argv))


def test_the_poll_interval_reaches_kopfs_timer() -> None:
    reg = handlers.registry(OperatorConfig(interval=2.5))
    timers = [h for h in reg._spawning.get_all_handlers() if getattr(h, "interval", None) is not None]
    assert [(t.interval, t.initial_delay) for t in timers] == [(2.5, 2.5)]
    # finished runs are not polled: only a spec edit (the event handler) passes over them again
    running = timers[0].when
    assert [running(body=kopf.Body({"status": st})) for st in
            ({}, {"phase": "Pending"}, {"phase": "Suspended"}, {"phase": "Succeeded"}, {"phase": "Failed"})] == \
        [True, True, True, False, False]


def test_only_main_reads_the_environment() -> None:
    """Settings come from `OperatorConfig`: no module reads os.environ at import or in a handler."""
    readers = []
    for path in sorted(OPERATOR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
                readers.append((path.name, node.lineno))
    assert [r for r in readers if r[0] != "main.py"] == []

"""`eyrie operator` arguments: what the Helm chart's Deployment passes, read once into `OperatorConfig`."""

from __future__ import annotations

import ast
import logging
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


class _CountingKube:
    """Answers every read with 404 (the object is gone), counting the reads."""

    def __init__(self) -> None:
        self.gets = 0

    async def get(self, *_: object) -> None:
        self.gets += 1


async def test_a_finished_run_this_process_passed_over_costs_no_call_when_polled() -> None:
    state = handlers.Memo(OperatorConfig())
    kube = state.kube = _CountingKube()  # type: ignore[assignment]
    meta = {"namespace": "ns", "name": "dg", "uid": "u1"}
    state.finished.add(("ns", "dg", "u1"))
    logger = logging.getLogger("test")
    for phase, calls in (("Succeeded", 0), ("Failed", 0), ("Generating", 1), ("Suspended", 2)):
        await handlers.poll(body=kopf.Body({"metadata": meta, "status": {"phase": phase}}), memo=kopf.Memo(state=state),
                            logger=logger)
        assert kube.gets == calls, phase
    # a finished run this process has not passed over (after a restart; a new object of the same name) is passed
    await handlers.poll(body=kopf.Body({"metadata": {**meta, "uid": "u2"}, "status": {"phase": "Succeeded"}}),
                        memo=kopf.Memo(state=state), logger=logger)
    assert kube.gets == 3


def test_only_main_reads_the_environment() -> None:
    """Settings come from `OperatorConfig`: no module reads os.environ at import or in a handler."""
    readers = []
    for path in sorted(OPERATOR.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
                readers.append((path.name, node.lineno))
    assert [r for r in readers if r[0] != "main.py"] == []

"""`eyrie simulate`: the built-in simulated provider in the foreground (jobs/simulator/), for demos and tests."""

from __future__ import annotations

import argparse
import asyncio
import sys

from eyrie.jobs.simulator.config import FAULTS, SimulatorConfig, SimulatorConfigError, read_behaviour
from eyrie.jobs.simulator.process import raise_nofile_limit, serve


def simulate_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="eyrie simulate",
        description="Run the built-in SIMULATED OpenAI-compatible provider, a tool for demos and tests: "
        "scripted deterministic answers (reasoning, content, tool calls), usage.cost, latency and "
        "injected faults. It is not a model; never point real work at it. Binds 127.0.0.1 by default.",
    )
    p.add_argument("--port", type=int, default=0, help="port (0 = a free one; the URL is printed)")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1, loopback only)")
    p.add_argument("--latency-ms", type=float, help="delay before each answer")
    p.add_argument("--fault-rate", type=float, help="share of requests that get a fault, 0..1")
    p.add_argument("--fault", action="append", choices=FAULTS, metavar="NAME",
                   help=f"a fault to inject (repeatable): {', '.join(FAULTS)}")
    p.add_argument("--seed", type=int, help="seed of answers and fault draws")
    p.add_argument("--config", metavar="FILE", help="a simulator config file (YAML or JSON, the file a spec's "
                   "api.simulator.config names): faults, endpoints, the template variant it counts, text calls")
    p.add_argument("--answer-model", help="a builtin chat model whose answers it serves (builtin:tiny-chat...)")
    p.add_argument("--config-json", help=argparse.SUPPRESS)  # SimulatorProcess hands its whole config over
    p.add_argument("--parent-pid", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        config = SimulatorConfig.from_json(a.config_json) if a.config_json else SimulatorConfig()
        if a.config:
            config = config.with_behaviour(read_behaviour(a.config))
        for name in ("latency_ms", "fault_rate", "seed", "answer_model"):
            if getattr(a, name) is not None:
                setattr(config, name, getattr(a, name))
        if a.fault:
            config.faults = list(a.fault)
        config.__post_init__()
    except (ValueError, TypeError, SimulatorConfigError) as e:
        print(f"eyrie simulate: {e}", file=sys.stderr)
        return 2
    raise_nofile_limit()
    try:
        asyncio.run(serve(config, a.host, a.port, a.parent_pid))
    except OSError as e:
        print(f"eyrie simulate: cannot listen on {a.host}:{a.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0

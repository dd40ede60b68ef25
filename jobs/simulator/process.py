"""The simulator as a process: `SimulatorProcess`, a child on loopback (reachable from Ray workers), stopped by
its PID, its config handed over as JSON; and `serve`, what that child (`eyrie simulate`) runs in the foreground,
the process that owns torch's threads for `answerModel`."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

from eyrie.jobs.simulator.config import SimulatorConfig

if TYPE_CHECKING:
    from eyrie.jobs.simulator.server import SimulatorServer

_LISTENING_RE = re.compile(r"listening on (http://\S+)")


class SimulatorProcess:
    """The simulator in a child process on loopback (reachable from Ray workers); stopped by PID."""

    def __init__(self, config: SimulatorConfig | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 startup_timeout: float = 30.0, python: str | None = None):
        self.config = config or SimulatorConfig()
        self.python = python or sys.executable  # another venv's eyrie serves a peer tool (its pins are not eyrie's)
        self.host, self.port = host, port
        self.startup_timeout = startup_timeout
        self.base_url = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: Any = None

    @property
    def pid(self) -> int:
        if self._proc is None:
            raise RuntimeError("simulator process not started")
        return self._proc.pid

    def start(self) -> SimulatorProcess:
        self.spawn()
        self.wait_ready()
        return self

    def spawn(self) -> None:
        """Start the child and return at once (`wait_ready` waits for it to listen): what the caller does
        meanwhile overlaps the child's start."""
        cmd = [self.python, "-m", "eyrie.jobs.cli", "simulate", "--host", self.host, "--port", str(self.port),
               "--config-json", self.config.to_json(), "--parent-pid", str(os.getpid())]
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the child; closed in stop()
        # its own session: a Ctrl-C meant for the run (which drains in-flight requests) must not
        # kill the provider those requests are waiting on; stop() ends it by PID.
        self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._stderr,
                                      stdin=subprocess.DEVNULL, start_new_session=True)

    def wait_ready(self) -> str:
        """The base URL once the child listens; RuntimeError (the child stopped) when it does not in time."""
        if self.base_url:
            return self.base_url
        assert self._proc is not None and self._proc.stdout is not None and self._stderr is not None
        deadline = time.monotonic() + self.startup_timeout
        line = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._proc.stdout], [], [], 0.1)
            if ready:
                line = self._proc.stdout.readline()
                if m := _LISTENING_RE.search(line.decode(errors="replace")):
                    self.base_url = m.group(1)
                    return self.base_url
                if not line:
                    break
            elif self._proc.poll() is not None:
                break
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:].decode(errors="replace")
        self.stop()
        raise RuntimeError(f"simulator did not start within {self.startup_timeout}s: {tail or line!r}")

    def stats(self) -> dict[str, Any]:
        import httpx

        r = httpx.get(self.base_url.removesuffix("/v1") + "/sim/stats", timeout=10, trust_env=False)
        r.raise_for_status()
        return r.json()

    def stop(self, grace: float = 3.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(grace)
                except subprocess.TimeoutExpired:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> SimulatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def raise_nofile_limit() -> None:
    """Thousands of concurrent connections need as many descriptors as the hard limit allows."""
    from eyrie.jobs.api.client import raise_open_files

    raise_open_files(60_000)


def warm_own_process(server: SimulatorServer, config: SimulatorConfig) -> None:
    """Warm the simulator of this process (`eyrie simulate`, SimulatorProcess), which owns torch's thread
    count: one thread, since decoding one token at a time through a tiny model gives more threads nothing
    but contention (on a loaded 2-core machine they spin against each other). Only here: a simulator
    started in another program's process (`start_simulator`) leaves that program's setting alone."""
    if config.answer_model:
        import torch

        torch.set_num_threads(1)
    server.warm()


async def serve(config: SimulatorConfig, host: str, port: int, parent_pid: int | None) -> None:
    from eyrie.jobs.simulator.server import start_simulator

    server = await start_simulator(config, host, port)
    print(f"eyrie simulator (a demo/test tool, not a real model) listening on {server.base_url}", flush=True)
    # the tokenizer and answer model load while the client starts (a local run's Ray), not on its first requests
    threading.Thread(target=warm_own_process, args=(server, config), name="simulator-warm", daemon=True).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if parent_pid is not None and os.getppid() != parent_pid:
                break  # the parent died (e.g. kill -9): do not linger as an orphan
    finally:
        await server.close()

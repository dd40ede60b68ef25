"""Shared fixtures: real servers started on 127.0.0.1 by the tests, stopped by their own PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# repository tooling (hack/derived.py, hack/specdoc.py) is not installed; tests import it from there
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hack"))
# the testbed's binaries (MinIO, the Kubernetes control plane) are looked up where tests/cluster/build.sh put them
sys.path.insert(0, str(Path(__file__).resolve().parent / "cluster"))

if TYPE_CHECKING:
    from tests.example_runs import ExampleRun

S3_ACCESS_KEY = "eyrietestaccess"
S3_SECRET_KEY = "eyrie-test-s3-secret-9f8e7d6c5b4a"


def _port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex((host, port)) == 0


def stop_pid(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after a grace period."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@dataclass
class S3Server:
    endpoint: str
    access_key: str
    secret_key: str
    proc: subprocess.Popen
    data_dir: Path
    ports: dict[str, int]

    @property
    def port(self) -> int:
        return self.ports["s3.port"]

    def env(self) -> dict[str, str]:
        return {"EYRIE_S3_ACCESS_KEY": self.access_key, "EYRIE_S3_SECRET_KEY": self.secret_key,
                "EYRIE_S3_ENDPOINT": self.endpoint}

    def stop(self) -> None:
        """The store goes away (SIGTERM, by its PID): connections are refused until `start`."""
        stop_pid(self.proc)

    def start(self) -> None:
        """The same server again after `stop`: the same ports, data and credentials (what a restarted MinIO pod
        behind its Service looks like to its clients); returns once it answers signed calls."""
        assert self.proc.poll() is not None, "MinIO is still running: stop it first"
        self.proc = start_minio(self.data_dir.parent, self.ports).proc


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held open together so none is handed out twice)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def minio_binary() -> Path:
    """The MinIO server built from its Go module by tests/cluster/build.sh (hack/test-deps.sh runs it)."""
    from testbed import binary

    return binary("minio", "minio")


def start_minio(base: Path, ports: dict[str, int] | None = None) -> S3Server:
    """A MinIO server (the store eyrie's users run) on loopback, on free ports, with credentials enforced.
    Pass the `ports` of an earlier server (``server.ports``) to restart it on the same data."""
    ports = ports or dict(zip(("s3.port", "console.port"), free_ports(2), strict=True))
    data = base / "minio"
    data.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MINIO_ROOT_USER": S3_ACCESS_KEY, "MINIO_ROOT_PASSWORD": S3_SECRET_KEY,
           "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "MINIO_CI_CD": "1", "HOME": str(base)}
    log = (base / "minio.log").open("ab")
    args = [str(minio_binary()), "server", "--quiet", "--anonymous", "--address", f"127.0.0.1:{ports['s3.port']}",
            "--console-address", f"127.0.0.1:{ports['console.port']}", str(data)]
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=base, env=env, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{ports['s3.port']}", S3_ACCESS_KEY, S3_SECRET_KEY, proc, data, ports)
    deadline = time.time() + 60
    while not _minio_ready(server):
        if proc.poll() is not None:
            raise RuntimeError(f"minio exited early: {(base / 'minio.log').read_text()[-2000:]}")
        if time.time() > deadline:
            stop_pid(proc)
            raise RuntimeError("MinIO did not come up in 60 s")
        time.sleep(0.2)
    return server


def _minio_ready(server: S3Server) -> bool:
    """MinIO's own readiness probe, then a signed call (credentials in force)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{server.endpoint}/minio/health/ready", timeout=1) as r:
            if r.status != 200:
                return False
    except (urllib.error.URLError, OSError):
        return False
    _wait_s3_ready(server)
    return True


def _wait_s3_ready(server: S3Server) -> None:
    from minio import Minio

    client = Minio(f"127.0.0.1:{server.port}", access_key=server.access_key, secret_key=server.secret_key,
                   secure=False)
    deadline = time.time() + 30
    while True:
        try:
            client.list_buckets()
            return
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.3)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory) -> Iterator[S3Server]:
    """A real MinIO server on 127.0.0.1 (a free port) with credentials enforced."""
    base = tmp_path_factory.mktemp("minio")
    server = start_minio(base)
    try:
        yield server
    finally:
        stop_pid(server.proc)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> S3Server:
    for k, v in s3_server.env().items():
        monkeypatch.setenv(k, v)
    return s3_server


@pytest.fixture
def s3_bucket(s3_env) -> str:
    """A fresh bucket URI per test."""
    from minio import Minio

    name = f"t{time.time_ns()}"
    Minio(f"127.0.0.1:{s3_env.port}", access_key=S3_ACCESS_KEY, secret_key=S3_SECRET_KEY,
          secure=False).make_bucket(name)
    return f"s3://{name}"


@pytest.fixture(scope="session")
def example_run(tmp_path_factory) -> Callable[[str], ExampleRun]:
    """`eyrie run examples/NAME.yaml` (tests/example_runs.py), once per session and name: the run, its
    output folder and its wall time, shared by the tests that read it (one that writes copies it: `copy_output`)."""
    from tests.example_runs import run_example

    done: dict[str, ExampleRun] = {}

    def run(name: str) -> ExampleRun:
        if name not in done:
            done[name] = run_example(tmp_path_factory.mktemp(name), name)
        return done[name]

    return run


@pytest.fixture(scope="session")
def _process_state_as_found() -> dict:
    """The process-global state as the last test left it (tests/process_state.py): first as the session
    found it, before any fixture of a narrower scope ran; a key not there yet (torch not imported) from
    when it appears."""
    from tests.process_state import snapshot

    return snapshot()


@pytest.fixture(autouse=True)
def _process_state_is_left_as_found(request, _process_state_as_found) -> Iterator[None]:
    """Fails the test after which torch's thread count or global seed, the working directory, the root
    logger or transformers' progress bars differ from before it (tests/process_state.py), and the test
    before which they differ from how the last test left them (a module- or session-scoped fixture set
    them): library code leaves them as it found them, so no test's outcome depends on which tests ran
    before it in the same process. About 0.1 ms a test (a thread started to read torch's count)."""
    from tests.process_state import changes, snapshot

    before = snapshot()
    earlier = changes(_process_state_as_found, before)
    _process_state_as_found.update(before)  # said once, then taken as found
    if earlier:
        pytest.fail(f"process-global state changed since the last test ended, by a fixture of a wider scope "
                    f"set up for {request.node.nodeid} or torn down before it: {'; '.join(earlier)}", pytrace=False)
    yield
    after = snapshot()
    _process_state_as_found.update(after)
    if changed := changes(before, after):
        pytest.fail(f"{request.node.nodeid} left process-global state changed: {'; '.join(changed)}", pytrace=False)


@pytest.fixture
def ray_tmp() -> Iterator[str]:
    """A private, short Ray temp dir for a run on local Ray (unix socket paths are limited to ~107 bytes)."""
    import tempfile

    d = tempfile.mkdtemp(prefix="ry", dir="/tmp")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
async def start_sim():
    """Start in-process simulators on 127.0.0.1 (`await start_sim(**config)`); all closed after the test."""
    from eyrie.jobs.simulator import SimulatorConfig, start_simulator

    servers = []

    async def start(**cfg):
        s = await start_simulator(SimulatorConfig(**cfg))
        servers.append(s)
        return s

    yield start
    for s in servers:
        await s.close()


def pytest_terminal_summary(terminalreporter) -> None:
    """Skips for something missing here (reference files, a wheel) counted and named by what is
    missing, so a green run that did not run them says so (under CI=true they fail instead)."""
    from tests.reference_helpers import UNAVAILABLE

    missing: dict[str, list[str]] = {}
    for rep in terminalreporter.stats.get("skipped", []):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        reason = reason.removeprefix("Skipped: ")
        if reason.startswith(UNAVAILABLE):
            what = reason.removeprefix(UNAVAILABLE).split(":", 1)[0].strip()
            missing.setdefault(what, []).append(rep.nodeid)
    for what, nodes in missing.items():
        terminalreporter.write_sep("=", f"{len(nodes)} tests skipped for missing {what}", yellow=True)
        for node in nodes:
            terminalreporter.write_line(f"  {node}")
    times = tier_times(terminalreporter.stats)
    if times:  # what the README's table of tiers quotes, from one run of them all
        terminalreporter.write_sep("=", "time per tier (setup to teardown; under -n N the workers' times added)")
        terminalreporter.write_line(", ".join(f"{tier} {n} tests {s:.0f} s" for tier, (n, s) in times.items()))


def tier_times(stats: dict[str, list[object]]) -> dict[str, tuple[int, float]]:
    """Per tier, the tests that ran and the seconds their phases took, from the terminal reporter's reports."""
    tests: dict[str, set[str]] = {}
    seconds: dict[str, float] = {}
    for reports in stats.values():
        for rep in reports:
            keywords, nodeid = getattr(rep, "keywords", None), getattr(rep, "nodeid", None)
            if not isinstance(keywords, dict) or not nodeid or not hasattr(rep, "when"):
                continue
            # the most specific first: a node test's keywords hold `cluster` too (its folder's name)
            tier = next((t for t in reversed(TIERS) if t in keywords), None)
            if tier is not None:
                tests.setdefault(tier, set()).add(nodeid)
                seconds[tier] = seconds.get(tier, 0.0) + float(getattr(rep, "duration", 0.0))
    return {t: (len(tests[t]), seconds[t]) for t in TIERS if t in tests}


# Test tiers (README "Tests"), kopf's and crate-operator's way: one marker per test, applied here by folder or by
# fixture, so a test file never has to remember its tier. `integration` starts something real on this machine (the
# simulator, MinIO, Ray, the tiny model, Chromium, a subprocess); `cluster` needs the control plane; `node` needs the
# kubelet running pods; `gpu` needs an accelerator; everything else is `unit`, and `unit_guard` makes a unit test
# that starts a process, Ray or a socket raise, so the fast tier cannot grow slow by accident.
TIERS = ("unit", "integration", "cluster", "node")
# fixtures that start a real component: a test using one is `integration` at least
INTEGRATION_FIXTURES = frozenset({"s3_server", "s3_env", "s3_bucket", "start_sim", "ray_tmp", "example_run"})
# fixtures of tests/cluster/conftest.py that run pods on the real node (the rest of that folder is `cluster`)
NODE_FIXTURES = frozenset({"node", "node_kuberay", "release"})
CLUSTER_DIR = Path(__file__).resolve().parent / "cluster"
ACCELERATOR = Path("/dev/nvidia0").exists()  # a `gpu` test is skipped, and named, where there is none


def tier_of(item: pytest.Item) -> str:
    """The one tier of a test: a marker written on the test (or its module) wins, then its folder, then its fixtures."""
    for tier in reversed(TIERS):
        if item.get_closest_marker(tier) is not None:
            return tier
    fixtures = set(getattr(item, "fixturenames", ()))
    if CLUSTER_DIR in Path(str(item.path)).resolve().parents:
        return "node" if fixtures & NODE_FIXTURES else "cluster"
    if fixtures & INTEGRATION_FIXTURES:
        return "integration"
    return "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
        if item.get_closest_marker("gpu") is not None and not ACCELERATOR:
            item.add_marker(pytest.mark.skip(reason="needs an accelerator (no /dev/nvidia0 here)"))


def xdist_scope(nodeid: str) -> str:
    """What pytest-xdist (`-n N`) hands one worker at a time: every test of tests/cluster's node files (one node for
    the session), every other test of tests/cluster (one control plane), else a test module (its module fixtures,
    a tiny model's answers say, made once). The biggest first (`--loadscope-reorder`, xdist's default), so the
    node and the cluster start at once on workers of their own and the modules fill in around them."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/cluster/"):
        return "node" if path.rsplit("/", 1)[-1].startswith("test_node") else "cluster"
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """xdist's scope scheduling with xdist_scope's scopes (its `loadgroup` keys on nodeids that pytest 9 no longer
    lets a plugin rename); `--dist each` (every test on every worker) is left as it is."""
    if config.getvalue("dist") == "each":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class TierScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

    return TierScheduling(config, log)


class UnitTierViolation(AssertionError):
    """A `unit` test started a process, Ray or a socket: mark it (or its module) `integration`, or fake the thing."""


def _refuse(what: str):
    def refuse(*args: object, **kwargs: object) -> None:
        raise UnitTierViolation(f"unit tests start no {what}: mark the test `integration` (tests/conftest.py tiers)")
    return refuse


def _from_ctypes_util() -> bool:
    import ctypes.util

    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == ctypes.util.__file__:
            return True
        frame = frame.f_back
    return False


@contextmanager
def unit_guard(item: pytest.Item) -> Iterator[None]:
    """What Ray Serve's unit conftest does for `ray.init`, for every slow thing: while a `unit` test and its
    fixtures (of any scope) are set up and while it runs, starting a subprocess, Ray, a listening or connecting inet
    socket, an asyncio server or a name lookup raises instead. Teardown is left alone: the session's last test tears
    down the session's servers."""
    if item.get_closest_marker("unit") is None:
        yield
        return
    import asyncio.base_events
    import multiprocessing.process

    with pytest.MonkeyPatch.context() as mp:
        execute_child = subprocess.Popen._execute_child  # type: ignore[attr-defined]

        def child(self: subprocess.Popen, *args: object) -> object:  # asyncio's subprocesses come here too
            if _from_ctypes_util():  # `import torch` asks ldconfig where libdl is (ctypes.util.find_library)
                return execute_child(self, *args)
            raise UnitTierViolation("unit tests start no subprocess: mark the test `integration` (tests/conftest.py "
                                    "tiers)")
        mp.setattr(subprocess.Popen, "_execute_child", child)
        for name in ("fork", "posix_spawn", "posix_spawnp", "system"):
            if hasattr(os, name):
                mp.setattr(os, name, _refuse(f"process (os.{name})"))
        mp.setattr(multiprocessing.process.BaseProcess, "start", _refuse("process (multiprocessing)"))
        inet = (socket.AF_INET, socket.AF_INET6)
        for name in ("connect", "connect_ex", "bind"):
            original = getattr(socket.socket, name)

            def guarded(self: socket.socket, *args: object, _original=original, _name=name) -> object:
                if self.family in inet:
                    raise UnitTierViolation(f"unit tests open no network socket (socket.{_name}): mark the test "
                                            "`integration` (tests/conftest.py tiers)")
                return _original(self, *args)
            mp.setattr(socket.socket, name, guarded)
        mp.setattr(socket, "getaddrinfo", _refuse("name lookup (network)"))
        for name in ("create_server", "create_connection"):
            mp.setattr(asyncio.base_events.BaseEventLoop, name, _refuse(f"network (loop.{name})"))
        ray = sys.modules.get("ray")
        if ray is not None:
            mp.setattr(ray, "init", _refuse("Ray (ray.init)"))
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    with unit_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    with unit_guard(item):
        return (yield)


def _terminated(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config) -> None:
    """SIGTERM ends a run as Ctrl-C does: pytest then tears down its fixtures, so every server they started is
    stopped by its PID and the node's namespaces, links and cgroups are removed (a plain SIGTERM would leave them)."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)


"""The test tiers (tests/conftest.py): every test has exactly one, the folders and fixtures give the ones they say,
and a `unit` test that starts a process, Ray or a socket fails at once instead of quietly making the fast tier slow."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

try:
    import ray  # imported before the test, as every module that starts Ray has it: the guard then has ray.init
except ImportError:  # pragma: no cover - the dev extra installs it
    ray = None

from tests.conftest import (
    CLUSTER_DIR,
    INTEGRATION_FIXTURES,
    NODE_FIXTURES,
    TIERS,
    UnitTierViolation,
    tier_of,
    tier_times,
    xdist_scope,
)


@dataclass
class Item:
    """What tier_of reads of a collected test."""

    path: Path
    fixturenames: tuple[str, ...] = ()
    marks: tuple[str, ...] = ()

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.marks else None


def test_the_tier_comes_from_the_mark_then_the_folder_then_the_fixtures():
    here, cluster = Path(__file__).parent, CLUSTER_DIR
    assert tier_of(Item(here / "test_x.py")) == "unit"
    assert tier_of(Item(here / "test_x.py", ("tmp_path", "s3_bucket"))) == "integration"
    assert tier_of(Item(here / "test_x.py", ("start_sim",))) == "integration"
    assert tier_of(Item(here / "test_x.py", marks=("integration",))) == "integration"
    assert tier_of(Item(cluster / "test_e2e.py", ("cluster", "s3_env"))) == "cluster"
    assert tier_of(Item(cluster / "test_node_e2e.py", ("release",))) == "node"
    assert tier_of(Item(cluster / "test_x.py", marks=("node",))) == "node"
    assert tier_of(Item(here / "test_kimi_official.py", ("release",))) == "unit"  # a fixture of the same name


def test_every_collected_test_has_exactly_one_tier_and_the_one_its_folder_or_fixtures_say(request):
    items = request.session.items
    assert items and request.node in items
    for item in items:
        tiers = [t for t in TIERS if item.get_closest_marker(t) is not None]
        assert len(tiers) == 1, (item.nodeid, tiers)
        fixtures = set(item.fixturenames)
        if CLUSTER_DIR in item.path.parents:
            assert tiers[0] in ("cluster", "node"), item.nodeid
            assert (tiers[0] == "node") is bool(fixtures & NODE_FIXTURES), item.nodeid
        if fixtures & INTEGRATION_FIXTURES:
            assert tiers[0] != "unit", item.nodeid
    assert request.node.get_closest_marker("unit") is not None  # this test starts nothing


def test_under_xdist_the_node_and_the_cluster_each_go_to_one_worker_and_modules_stay_whole():
    """`-n N` hands out xdist_scope's units: the node's session (its files) once, the control plane's once, and a
    module with its module fixtures whole."""
    assert xdist_scope("tests/cluster/test_node_e2e.py::test_a_run") == "node"
    assert xdist_scope("tests/cluster/test_node.py::test_ready[x]") == "node"
    assert xdist_scope("tests/cluster/test_e2e.py::test_b") == xdist_scope("tests/cluster/test_helm.py::t") == "cluster"
    fidelity = "tests/extract/test_fidelity.py"
    assert xdist_scope(f"{fidelity}::test_a") == xdist_scope(f"{fidelity}::test_b[1]") == fidelity
    assert xdist_scope("tests/operator/test_kube.py::test_c") == "tests/operator/test_kube.py"


def test_the_time_per_tier_adds_every_phase_of_each_test_once_counted():
    from types import SimpleNamespace as R

    stats = {"passed": [R(nodeid="a", when="call", duration=2.0, keywords={"unit": 1, "a": 1})],
             "": [R(nodeid="a", when="setup", duration=0.5, keywords={"unit": 1}),
                  R(nodeid="b", when="setup", duration=30.0, keywords={"node": 1, "cluster": 1, "b": 1})],
             "failed": [R(nodeid="b", when="call", duration=60.0, keywords={"node": 1, "cluster": 1})],  # its folder
             "warnings": [R(message="not a report")]}
    assert tier_times(stats) == {"unit": (1, 2.5), "node": (1, 90.0)}


def test_a_unit_test_cannot_start_a_process(tmp_path):
    with pytest.raises(UnitTierViolation, match="subprocess"):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    with pytest.raises(UnitTierViolation, match=r"os\.fork"):
        os.fork()
    with pytest.raises(UnitTierViolation, match="multiprocessing"):
        multiprocessing.get_context("spawn").Process(target=print).start()

    async def child() -> None:
        await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
    with pytest.raises(UnitTierViolation, match="subprocess"):
        asyncio.run(child())


def test_a_unit_test_cannot_open_a_network_socket_or_look_a_name_up():
    with socket.socket() as s, pytest.raises(UnitTierViolation, match=r"socket\.bind"):
        s.bind(("127.0.0.1", 0))
    with socket.socket() as s, pytest.raises(UnitTierViolation, match=r"socket\.connect"):
        s.connect(("127.0.0.1", 9))
    with pytest.raises(UnitTierViolation, match="name lookup"):
        socket.create_connection(("127.0.0.1", 9), timeout=0.1)
    with pytest.raises(UnitTierViolation, match="name lookup"):
        socket.getaddrinfo("localhost", 80)

    async def serve() -> None:
        await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    with pytest.raises(UnitTierViolation, match="network"):
        asyncio.run(serve())
    a, b = socket.socketpair()  # what every event loop makes for itself: not the network
    a.close()
    b.close()


def test_a_unit_test_cannot_start_ray():
    if ray is None:
        pytest.skip("ray is not installed")
    with pytest.raises(UnitTierViolation, match=r"Ray \(ray.init\)"):
        ray.init()


@pytest.mark.integration
def test_an_integration_test_may_start_a_process():
    assert subprocess.run([sys.executable, "-c", "print('ok')"], capture_output=True, text=True,
                          check=True).stdout == "ok\n"

"""Fixtures of the real control plane (testbed.py): one per test session, the chart's CRD and RBAC applied."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

from .testbed import EYRIE_CRD, REPO, ControlPlane, KubeRay, kuberay_crds, running_control_plane

CHART = REPO / "charts" / "eyrie"
OPERATOR_NS = "eyrie-system"
RELEASE = "eyrie"


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with running_control_plane(tmp_path_factory.mktemp("testbed")) as cp:
        sys.stderr.write(f"\ntestbed: etcd + kube-apiserver + kube-controller-manager ready in {cp.started_in:.1f}s\n")
        yield cp


def render_chart(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name=RELEASE, namespace=OPERATOR_NS, is_install=True)
    return [d for path, text in sorted(out.items()) if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


@dataclass(frozen=True)
class Installed:
    """What `helm install` leaves behind that the tests use: the operator's ServiceAccount and its token."""

    namespace: str
    service_account: str
    token: str

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


@pytest.fixture(scope="session")
def chart(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The chart installed for real, as far as the API server sees it: the CRD from crds/, then the rendered
    ServiceAccount, ClusterRole and binding (the Deployment is the operator process the tests start)."""
    control_plane.apply_crds(EYRIE_CRD)
    control_plane.ensure_namespace(OPERATOR_NS)
    docs = [d for d in render_chart() if d["kind"] in {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}]
    assert {d["kind"] for d in docs} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}, docs
    manifest = tmp_path_factory.mktemp("chart") / "rbac.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    control_plane.kubectl("apply", "-f", str(manifest), check=True)
    [sa] = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
    return Installed(OPERATOR_NS, sa, control_plane.service_account_token(OPERATOR_NS, sa))


@pytest.fixture(scope="session")
def kuberay(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeRay]:
    """KubeRay's CRDs (from the Go module cache) and the real KubeRay operator."""
    control_plane.apply_crds(*kuberay_crds())
    kr = KubeRay.start(control_plane, tmp_path_factory.mktemp("kuberay"))
    try:
        yield kr
    finally:
        kr.stop()


def manifest(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]

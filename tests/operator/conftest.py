"""The emulated API server (kube.py: kmock) for the operator client's fast unit tests (test_kube.py).

Nothing end to end rests on it: the operator process, the chart's RBAC, KubeRay, the Job controller and the
garbage collector are tested against a real control plane in tests/cluster."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .kube import Cluster, running_cluster


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with running_cluster() as c:
        yield c

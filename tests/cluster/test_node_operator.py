"""The operator as users run it (issue 28 item 3): `helm install` of the chart by Helm's own install action, its
Deployment's pod from the operator image (hack/images.sh) on the real node, in a namespace enforcing the
`restricted` Pod Security Standard, talking to the API server with its in-cluster ServiceAccount token, its probes
passing, its /metrics scraped through its Service from another pod."""

from __future__ import annotations

import re

import httpx
import pytest

from .conftest import OPERATOR_NS, RESTRICTED, Release, condition, dsg
from .node import busybox_image
from .test_node import finished, pod
from .testbed import DSG, PODS, wait_for

NS = "default"


def probes(release: Release, pod_name: str, kind: str) -> float:
    """Successful `kind` probes of the operator's container, as the kubelet counts them (its /metrics/probes,
    read through the API server's proxy to the node)."""
    text = release.node.cp.kubectl("get", "--raw", f"/api/v1/nodes/{release.node.cp.node}/proxy/metrics/probes",
                                   check=True).stdout
    total = 0.0
    for line in text.splitlines():
        if (line.startswith("prober_probe_total{") and f'pod="{pod_name}"' in line
                and f'probe_type="{kind}"' in line and 'result="successful"' in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_the_chart_runs_the_operator_as_a_restricted_pod_with_its_service_account(release: Release) -> None:
    cp = release.node.cp
    op = release.pod()
    spec, status = op["spec"], op["status"]
    assert spec["nodeName"] == cp.node and status["hostIP"] == release.node.ip
    assert spec["containers"][0]["image"] == "ghcr.io/eyrie-dev/eyrie-operator:0.1.0"  # the chart's default
    assert spec["serviceAccountName"] == release.name and spec["automountServiceAccountToken"] is True
    assert cp.get(("", "v1", "namespaces"), "", OPERATOR_NS)["metadata"]["labels"].items() >= RESTRICTED.items()
    # the namespace does enforce the standard: a pod that would run as root is refused
    with pytest.raises(httpx.HTTPStatusError) as refused:
        cp.create(PODS, OPERATOR_NS, pod("rooted", busybox_image()[0], ["true"]))
    assert refused.value.response.status_code == 403
    assert 'violates PodSecurity "restricted:latest"' in refused.value.response.json()["message"]
    # liveness and readiness as the kubelet probes them
    wait_for("a successful liveness probe", lambda: probes(release, op["metadata"]["name"], "Liveness") >= 1,
             timeout=90, every=1)
    assert probes(release, op["metadata"]["name"], "Readiness") >= 1
    assert status["containerStatuses"][0]["restartCount"] == 0
    # the in-cluster token: the operator watches, reads Secrets and patches status as the chart's ServiceAccount
    cp.create(DSG, NS, dsg("in-cluster", {
        "sources": [{"name": "p", "uri": "s3://nowhere/p.jsonl", "format": "openai"}],
        "target": {"model": "test/model"},
        "api": {"baseUrl": "http://sim.default.svc:8080/v1", "apiKeySecretRef": {"name": "absent", "key": "k"}},
        "budget": {"maxUSD": "1", "pricing": {"inputPerMillion": "1", "outputPerMillion": "1"}},
        "generation": {"ray": {"mode": "RayJob", "image": "ghcr.io/eyrie-dev/eyrie-ray-worker:0.1.0"}},
        "output": {"uri": "file:///tmp/out"}}))
    try:
        wait_for("the operator's SecretsReady=False", lambda: (condition(cp, "in-cluster", "SecretsReady") or {}).get(
            "reason") == "SecretNotFound", timeout=60, every=0.5)
        assert "Secret 'absent' not found" in condition(cp, "in-cluster", "SecretsReady")["message"]
    finally:
        cp.delete(DSG, NS, "in-cluster")
        wait_for("the DatasetGeneration gone (the operator removes its finalizer)",
                 lambda: cp.get(DSG, NS, "in-cluster") is None, timeout=60, every=0.5)
    log = release.log()
    assert "cannot" not in log and "Forbidden" not in log, log[-3000:]


def test_metrics_are_scraped_through_the_service_from_another_pod(release: Release) -> None:
    cp = release.node.cp
    release.pod()
    url = f"http://{release.name}-metrics.{OPERATOR_NS}.svc:9090/metrics"
    name = "scraper"
    cp.create(PODS, NS, pod(name, busybox_image()[0], ["wget", "-q", "-O", "-", url]))
    try:
        done = finished(cp, NS, name)
        text = cp.kubectl("logs", name, namespace=NS, check=True).stdout
        assert done["status"]["phase"] == "Succeeded", (done["status"], text)
    finally:
        cp.delete(PODS, NS, name, grace_seconds=0)
    assert re.search(r"^eyrie_reconciles_total \d", text, re.M), text[:2000]
    assert "# TYPE eyrie_datasetgenerations gauge" in text

"""What N DatasetGenerations running at once cost the API server, from the operator (issue 35 item 4).

Against a real kube-apiserver (tests/cluster/testbed.py: etcd, kube-apiserver, kube-controller-manager, the chart's
CRD and KubeRay's CRDs; build them with tests/cluster/build.sh), the real operator (`eyrie operator`, at the chart's
poll interval) serves N DatasetGenerations as users write them (the API key and the store's credentials in Secrets),
each owning its ConfigMap and RayJob; the real KubeRay operator makes each RayJob's RayCluster and pods, which no
node runs (Pending: every run stays coming up, polled every interval with its pods listed, as a running one is).
Once every object owns its RayJob and the operator has settled, a window of W seconds measures:

- the operator's requests per second, counted exactly by the API server's own flow control: the operator runs as a
  ServiceAccount of its own, matched by a FlowSchema of its own (`apiserver_flowcontrol_dispatched_requests_total`);
- the same window's requests by verb and resource (`apiserver_request_total`, less a window of the same length
  before the objects existed: the controller manager's own);
- the operator's passes (its own `eyrie_reconciles_total`), CPU seconds per pass and peak RSS.

Peer, measured the same way on a fresh control plane: a bare kopf operator whose only handler is a timer at the same
interval that patches each object's status (kopf's floor for "poll each object"). The ratio says what eyrie's pass
(the object read afresh, its Secrets, its RayJob, its pods, a status patch when something changed) adds.
Extrapolated to 1,000 objects; the target: the chart's CPU limit (1 core) polls 1,000 objects at the interval.

    python benchmarks/operator_load.py [--objects 100] [--interval 5] [--window 60]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "cluster"))
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import peak_rss_of  # noqa: E402
from operator_scale import operator_alive  # noqa: E402
from operator_scale import spec as bare_spec  # noqa: E402
from testbed import (  # noqa: E402
    DSG,
    EYRIE_CRD,
    RAYJOBS,
    ControlPlane,
    KubeRay,
    api_path,
    free_port,
    kuberay_crds,
    running_control_plane,
    wait_for,
)

SA_NS, SA_NAME, FLOW = "eyrie-system", "eyrie-operator", "eyrie-operator-bench"
CHART_CPU_LIMIT = 1.0  # charts/eyrie/values.yaml resources.limits.cpu
TARGET_OBJECTS = 1000  # the design point (benchmarks/operator_scale.py creates 1,000 at once)

PEER = '''
import kopf

@kopf.on.startup()
def configure(settings, **_):
    settings.posting.enabled = False

@kopf.timer("eyrie.dev", "v1alpha1", "datasetgenerations", interval=float({interval}), idle=None)
def poll(patch, retry, **_):
    patch.status["polls"] = (patch.status.get("polls") or 0) + 1
'''


def spec(out: Path) -> dict[str, Any]:
    """A RayJob run as users write one: its API key and store credentials in Secrets, which each poll checks."""
    s = bare_spec(out)
    s["api"]["apiKeySecretRef"] = {"name": "provider", "key": "api-key"}
    s["output"]["credentialsSecretRef"] = {"name": "store"}
    return s


def operator_identity(cp: ControlPlane, work: Path) -> Path:
    """A kubeconfig for a ServiceAccount bound to cluster-admin, and a FlowSchema that counts its requests."""
    token = cp.service_account_token(SA_NS, SA_NAME)
    cp.create(("rbac.authorization.k8s.io", "v1", "clusterrolebindings"), "", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": SA_NAME},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": SA_NAME, "namespace": SA_NS}]})
    cp.create(("flowcontrol.apiserver.k8s.io", "v1", "flowschemas"), "", {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": FLOW},
        "spec": {"priorityLevelConfiguration": {"name": "workload-high"}, "matchingPrecedence": 100,
                 "rules": [{"subjects": [{"kind": "ServiceAccount",
                                          "serviceAccount": {"name": SA_NAME, "namespace": SA_NS}}],
                            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                               "clusterScope": True, "namespaces": ["*"]}],
                            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}})
    return cp.kubeconfig(work / "operator.kubeconfig", token=token)


METRIC = re.compile(r'^(\w+)\{([^}]*)\} ([0-9.e+-]+)$')


def scrape(cp: ControlPlane) -> tuple[float, Counter[tuple[str, str]]]:
    """(the operator's dispatched requests so far, every client's requests by (verb, resource) so far)."""
    assert cp.api is not None
    text = cp.api.get("/metrics").text
    mine, by = 0.0, Counter[tuple[str, str]]()
    for line in text.splitlines():
        m = METRIC.match(line)
        if not m:
            continue
        name, labels, value = m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2))), float(m.group(3))
        if name == "apiserver_flowcontrol_dispatched_requests_total" and labels.get("flow_schema") == FLOW:
            mine += value
        elif name == "apiserver_request_total":
            by[(labels.get("verb", ""), labels.get("resource", "") + (f"/{labels['subresource']}"
                                                                      if labels.get("subresource") else ""))] += value
    return mine, by


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def passes(metrics_url: str | None) -> float:
    """eyrie_reconciles_total of the operator's /metrics (None: the peer, which has none)."""
    if metrics_url is None:
        return 0.0
    import httpx

    m = re.search(r"^eyrie_reconciles_total ([0-9.e+]+)$", httpx.get(metrics_url, timeout=5).text, re.M)
    return float(m.group(1)) if m else 0.0


def measure(cmd: list[str], n: int, interval: float, window: float, work: Path, label: str,
            with_kuberay: bool, metrics_url: str | None = None) -> dict[str, Any]:
    with running_control_plane(work / f"cp-{label}") as cp:
        cp.apply_crds(EYRIE_CRD, *kuberay_crds())
        cp.secret("default", "provider", {"api-key": "sk-bench"})
        cp.secret("default", "store", {"accessKey": "bench", "secretKey": "bench-secret"})
        (work / label).mkdir()
        kuberay = KubeRay.start(cp, work / f"kuberay-{label}") if with_kuberay else None
        kubeconfig = operator_identity(cp, work / label)
        baseline_start = scrape(cp)[1]
        t_base = time.monotonic()
        log = (work / f"{label}.log").open("wb")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        proc = subprocess.Popen([*cmd, "--liveness", liveness], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            wait_for(f"{label} liveness", lambda: operator_alive(proc, liveness), timeout=180, every=0.25)
            # the controller manager's own requests over a window as long as the measured one, nothing to serve yet
            time.sleep(max(0.0, window - (time.monotonic() - t_base)))
            baseline = scrape(cp)[1] - baseline_start
            base_seconds = time.monotonic() - t_base
            assert cp.api is not None
            for i in range(n):
                name = f"load-{i:04d}"
                cp.api.post(api_path(*DSG, "default"), json={
                    "apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration", "metadata": {"name": name},
                    "spec": spec(work / "out" / name)}).raise_for_status()
            if label == "eyrie":
                wait_for(f"{n} RayJobs", lambda: len(cp.api.get(api_path(*RAYJOBS, "default")).json()["items"]) >= n,
                         timeout=600, every=2)
            time.sleep(3 * interval)  # settled: every object polled a few times
            mine0, by0 = scrape(cp)
            cpu0, t0, pass0 = cpu_seconds(proc.pid), time.monotonic(), passes(metrics_url)
            time.sleep(window)
            mine1, by1 = scrape(cp)
            cpu1, t1, pass1 = cpu_seconds(proc.pid), time.monotonic(), passes(metrics_url)
            rss = peak_rss_of(proc.pid)
        finally:
            if kuberay is not None:
                kuberay.stop()
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            log.close()
    seconds = t1 - t0
    scale = seconds / base_seconds
    by = Counter({k: v for k, v in ((k, (by1[k] - by0[k]) - baseline[k] * scale) for k in by1) if v > 0.5})
    # the peer's passes: its status patches (one per timer call)
    done = pass1 - pass0 if metrics_url else by.get(("PATCH", "datasetgenerations/status"), 0.0)
    return {"rps": (mine1 - mine0) / seconds, "by": by, "seconds": seconds, "cpu": (cpu1 - cpu0) / seconds,
            "rss": rss, "passes": done / seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=100)
    ap.add_argument("--interval", type=float, default=5.0, help="poll interval (the chart's default: 5)")
    ap.add_argument("--window", type=float, default=60.0)
    ap.add_argument("--no-kuberay", action="store_true", help="no KubeRay: the RayJobs get no status, no pods")
    args = ap.parse_args()
    n, interval = args.objects, args.interval
    with tempfile.TemporaryDirectory(prefix="eyrie-bench-load-") as d:
        work = Path(d)
        peer_file = work / "peer.py"
        peer_file.write_text(PEER.format(interval=interval))
        peer = measure([sys.executable, "-m", "kopf", "run", "--standalone", "-A", "--quiet", str(peer_file)],
                       n, interval, args.window, work, "peer", not args.no_kuberay)
        metrics_port = free_port()
        eyrie = measure([sys.executable, "-m", "eyrie.jobs.cli", "operator", "--standalone", "--metrics-address",
                         "127.0.0.1", "--metrics-port", str(metrics_port), "--interval", str(interval)],
                        n, interval, args.window, work, "eyrie", not args.no_kuberay,
                        metrics_url=f"http://127.0.0.1:{metrics_port}/metrics")
    print(f"operator_load: {n} DatasetGenerations, each polled every {interval:g} s, window {eyrie['seconds']:.0f} s, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}, KubeRay {'off' if args.no_kuberay else 'on'}")
    for label, m in (("eyrie operator", eyrie), ("bare kopf timer", peer)):
        top = ", ".join(f"{v / m['seconds']:.1f}/s {verb} {res}" for (verb, res), v in m["by"].most_common(6))
        per = max(m["passes"], 1e-9)
        print(f"  {label:15s}: {m['passes']:5.1f} passes/s (nominal {n / interval:.1f}); {m['rps']:6.1f} requests/s = "
              f"{m['rps'] / per:.2f} per pass; CPU {m['cpu']:.2f} cores = {m['cpu'] / per * 1e3:.1f} ms per pass; "
              f"peak RSS {m['rss']:.0f} MiB")
        print(f"    by verb and resource (every client, less the controller manager's baseline): {top}")
    per_pass = eyrie["rps"] / max(eyrie["passes"], 1e-9)
    cpu_pass = eyrie["cpu"] / max(eyrie["passes"], 1e-9)
    ratio = per_pass / max(peer["rps"] / max(peer["passes"], 1e-9), 1e-9)
    capacity = CHART_CPU_LIMIT / cpu_pass * interval  # objects one chart-limited operator polls at this interval
    peer_cpu_pass = peer["cpu"] / max(peer["passes"], 1e-9)
    print(f"  ratio eyrie/peer, requests per pass: {ratio:.2f}; "
          f"CPU per pass x{cpu_pass / max(peer_cpu_pass, 1e-9):.2f}")
    for objects in (100, 1000):
        print(f"  extrapolated to {objects} objects at {interval:g} s: {per_pass * objects / interval:.0f} requests/s "
              f"from the operator, {cpu_pass * objects / interval:.2f} cores of the operator")
    print(f"  objects the chart's CPU limit ({CHART_CPU_LIMIT:g} core) polls every {interval:g} s: {capacity:.0f} "
          f"(target >= {TARGET_OBJECTS})")
    print(f"RESULT operator_load objects={n} interval_s={interval:g} requests_per_s={eyrie['rps']:.1f} "
          f"per_pass={per_pass:.2f} peer_ratio={ratio:.2f} cpu_ms_per_pass={cpu_pass * 1e3:.1f} "
          f"objects_per_core={capacity:.0f} rss_mib={eyrie['rss']:.0f} "
          f"{'PASS' if capacity >= TARGET_OBJECTS else 'MISS'}")


if __name__ == "__main__":
    main()

"""Operator scale: 200 DatasetGenerations created at once against the emulated API server (kmock).

Figure: time from each object's creation until it has `status.phase` (p50, p95), and the operator's
peak RSS. Peer, measured in the same run on a fresh emulator: a bare kopf operator whose only
handler writes `status.phase` (the framework + emulator floor). The ratio says what eyrie's
reconcile pass (ConfigMap + RayJob creation, Secret/progress reads, conditions) adds to that floor.

    python benchmarks/operator_scale.py [--objects 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "operator"))

from kube import DSG, Cluster, path, running_cluster  # noqa: E402

TARGET_P95_S = 10.0
TARGET_RSS_MIB = 400.0

BARE_OPERATOR = '''
import kopf

@kopf.on.startup()
def configure(settings, **_):
    settings.posting.enabled = False

@kopf.on.event("eyrie.dev", "v1alpha1", "datasetgenerations")
def phase(body, patch, **_):
    if not (body.get("status") or {}).get("phase"):
        patch.status["phase"] = "Pending"
'''


def spec(out: Path) -> dict[str, Any]:
    return {"sources": [{"name": "p", "uri": "file:///prompts.jsonl"}], "target": {"model": "m"},
            "api": {"baseUrl": "simulated"}, "budget": {"maxUSD": "5"},
            "generation": {"ray": {"mode": "RayJob", "image": "eyrie-ray:bench"}},
            "output": {"uri": f"file://{out}"}}


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(cmd: list[str], n: int, work: Path, label: str) -> tuple[list[float], float]:
    with running_cluster() as cluster:
        kubeconfig = cluster.kubeconfig(work / f"kubeconfig-{label}")
        log = (work / f"{label}.log").open("wb")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            time.sleep(3.0)  # operator start-up (imports, discovery, watch) is not part of the figure
            created = create_all(cluster, n, work / label)
            latencies = wait_phases(cluster, created, timeout=180)
            rss = peak_rss_mib(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            log.close()
    return latencies, rss


def create_all(cluster: Cluster, n: int, out: Path) -> dict[str, float]:
    created = {}
    assert cluster.api is not None
    for i in range(n):
        name = f"scale-{i:04d}"
        body = {"apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration", "metadata": {"name": name},
                "spec": spec(out / name)}
        created[name] = time.monotonic()
        cluster.api.post(path(*DSG, "default"), json=body).raise_for_status()
    return created


def wait_phases(cluster: Cluster, created: dict[str, float], timeout: float) -> list[float]:
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    with httpx.Client(base_url=cluster.url, timeout=30) as api:
        while len(seen) < len(created) and time.monotonic() < deadline:
            items = api.get(path(*DSG, "default")).json()["items"]
            now = time.monotonic()
            for obj in items:
                name = obj["metadata"]["name"]
                if name not in seen and (obj.get("status") or {}).get("phase"):
                    seen[name] = now - created[name]
            time.sleep(0.25)
    if len(seen) < len(created):
        raise SystemExit(f"only {len(seen)} of {len(created)} got a phase within {timeout}s")
    return sorted(seen.values())


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="eyrie-bench-operator-") as d:
        work = Path(d)
        bare = work / "bare.py"
        bare.write_text(BARE_OPERATOR)
        peer, peer_rss = measure([sys.executable, "-m", "kopf", "run", "--standalone", "-A", "--quiet", str(bare)],
                                 args.objects, work, "bare-kopf")
        eyrie, rss = measure([sys.executable, "-m", "eyrie.jobs.cli", "operator", "--standalone",
                              "--metrics-port", "0"], args.objects, work, "eyrie")
    p50, p95 = pct(eyrie, 50), pct(eyrie, 95)
    b50, b95 = pct(peer, 50), pct(peer, 95)
    print(f"operator_scale: {args.objects} DatasetGenerations created at once against kmock")
    print(f"  eyrie operator : time to status.phase p50 {p50:.2f}s  p95 {p95:.2f}s  max {eyrie[-1]:.2f}s  "
          f"peak RSS {rss:.0f} MiB")
    print(f"  bare kopf peer : time to status.phase p50 {b50:.2f}s  p95 {b95:.2f}s  max {peer[-1]:.2f}s  "
          f"peak RSS {peer_rss:.0f} MiB")
    print(f"  ratio eyrie/peer: p50 x{p50 / b50:.2f}  p95 x{p95 / b95:.2f}  RSS x{rss / peer_rss:.2f}")
    print(f"  target: p95 <= {TARGET_P95_S:.0f}s ({'met' if p95 <= TARGET_P95_S else 'MISSED'}), "
          f"peak RSS <= {TARGET_RSS_MIB:.0f} MiB ({'met' if rss <= TARGET_RSS_MIB else 'MISSED'})")
    print(f"RESULT operator_scale p50_s={p50:.2f} p95_s={p95:.2f} rss_mib={rss:.0f} "
          f"{'PASS' if p95 <= TARGET_P95_S else 'MISS'}")


if __name__ == "__main__":
    main()

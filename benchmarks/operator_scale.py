"""Operator scale: 1,000 DatasetGenerations created at once against a real kube-apiserver (tests/cluster/testbed.py:
etcd, kube-apiserver, kube-controller-manager, the chart's CRD and KubeRay's CRDs; build them with
tests/cluster/build.sh).

Figures: time from each object's creation until it has `status.phase` and until it owns a RayJob (p50, p95), and the
operator's peak RSS. Peer, measured in the same run on a fresh control plane: a bare kopf operator whose only
handler writes `status.phase` (the framework + API server floor). The ratio says what eyrie's reconcile pass
(ConfigMap + RayJob creation, Secret/progress reads, conditions) adds to that floor.

    python benchmarks/operator_scale.py [--objects 1000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "cluster"))
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import peak_rss_of  # noqa: E402
from testbed import (  # noqa: E402
    DSG,
    EYRIE_CRD,
    RAYJOBS,
    ControlPlane,
    api_path,
    free_port,
    kuberay_crds,
    running_control_plane,
    wait_for,
)

TARGET_P95_S = 5.0  # to a first status
TARGET_RSS_MIB = 300.0

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
            "api": {"baseUrl": "http://provider.invalid/v1"},  # never called here
            "budget": {"maxUSD": "5", "pricing": {"inputPerMillion": "0.60", "outputPerMillion": "2.50"}},
            "generation": {"ray": {"mode": "RayJob", "image": "eyrie-ray:bench"}},
            "output": {"uri": f"file://{out}"}}


def measure(cmd: list[str], n: int, work: Path, label: str) -> tuple[list[float], list[float], float]:
    with running_control_plane(work / f"cp-{label}") as cp:
        cp.apply_crds(EYRIE_CRD, *kuberay_crds())
        kubeconfig = cp.kubeconfig(work / f"kubeconfig-{label}")
        log = (work / f"{label}.log").open("wb")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig)}
        liveness = f"http://127.0.0.1:{free_port()}/healthz"
        proc = subprocess.Popen([*cmd, "--liveness", liveness], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        try:
            # operator start-up (imports, discovery, watch) is not part of the figure
            wait_for(f"{label} liveness", lambda: operator_alive(proc, liveness), timeout=180, every=0.25)
            phases, rayjobs = wait_all(cp, n, work / label, timeout=600, rayjobs=label == "eyrie")
            rss = peak_rss_of(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            log.close()
    return phases, rayjobs, rss


def operator_alive(proc: subprocess.Popen[bytes], url: str) -> bool:
    if proc.poll() is not None:
        raise SystemExit(f"the operator exited {proc.returncode} before it was live")
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def create_all(cp: ControlPlane, n: int, out: Path) -> dict[str, float]:
    created = {}
    assert cp.api is not None
    for i in range(n):
        name = f"scale-{i:04d}"
        body = {"apiVersion": "eyrie.dev/v1alpha1", "kind": "DatasetGeneration", "metadata": {"name": name},
                "spec": spec(out / name)}
        created[name] = time.monotonic()
        cp.api.post(api_path(*DSG, "default"), json=body).raise_for_status()
    return created


class FirstSeen:
    """Watches one resource (from the current resourceVersion) in a thread and records, per name, the
    moment `key(object)` first gives one: exact first-seen times, at the cost of one watch stream (polling
    LISTs of thousands of objects would load the API server the operators are measured against)."""

    def __init__(self, cp: ControlPlane, resource: tuple[str, str, str], key: Callable[[dict[str, Any]], str | None]):
        assert cp.api is not None
        self.cp, self.path, self.key = cp, api_path(*resource, "default"), key
        self.seen: dict[str, float] = {}
        self.since = cp.api.get(self.path, params={"limit": 1}).json()["metadata"]["resourceVersion"]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        assert self.cp.api is not None
        rv = self.since
        while not self.stop.is_set():
            params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "30"}
            try:
                with self.cp.api.stream("GET", self.path, params=params, timeout=None) as r:
                    for line in r.iter_lines():
                        if self.stop.is_set():
                            return
                        event = json.loads(line) if line else {}
                        if event.get("type") in ("ADDED", "MODIFIED", "BOOKMARK"):
                            obj = event["object"]
                            rv = obj["metadata"].get("resourceVersion", rv)
                            name = self.key(obj) if event["type"] != "BOOKMARK" else None
                            if name is not None and name not in self.seen:
                                self.seen[name] = time.monotonic()
            except httpx.HTTPError:
                if not self.stop.is_set():
                    raise  # the figures would be wrong; the control plane is still up


def _phase(obj: dict[str, Any]) -> str | None:
    return obj["metadata"]["name"] if (obj.get("status") or {}).get("phase") else None


def _owner(obj: dict[str, Any]) -> str | None:
    refs = obj["metadata"].get("ownerReferences") or []
    return refs[0]["name"] if refs and refs[0]["kind"] == "DatasetGeneration" else None


def wait_all(cp: ControlPlane, n: int, out: Path, timeout: float, rayjobs: bool) -> tuple[list[float], list[float]]:
    """Create the objects, then wait until every one has a phase and, for eyrie, an owned RayJob."""
    phases = FirstSeen(cp, DSG, _phase)
    owned = FirstSeen(cp, RAYJOBS, _owner) if rayjobs else None
    created = create_all(cp, n, out)
    deadline = time.monotonic() + timeout
    def done() -> bool:
        return len(phases.seen) >= n and (owned is None or len(owned.seen) >= n)
    while not done() and time.monotonic() < deadline:
        time.sleep(0.5)
    for w in (phases, owned):
        if w is not None:
            w.stop.set()
    if not done():
        # a percentile is still a figure when fewer than (100 - q)% are missing: they count as never (inf)
        assert cp.api is not None
        lacking = next(m for m in created if m not in phases.seen or (owned is not None and m not in owned.seen))
        status = cp.api.get(api_path(*DSG, "default", lacking)).json().get("status")
        print(f"within {timeout}s: {len(phases.seen)} of {n} got a phase, {len(owned.seen) if owned else 0} a "
              f"RayJob; {lacking}'s status: {status}", file=sys.stderr)
    never = float("inf")
    return (sorted(phases.seen[m] - t if m in phases.seen else never for m, t in created.items()),
            sorted(owned.seen[m] - t if m in owned.seen else never for m, t in created.items()) if owned else [])


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[int(q) - 1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--objects", type=int, default=1000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="eyrie-bench-operator-") as d:
        work = Path(d)
        bare = work / "bare.py"
        bare.write_text(BARE_OPERATOR)
        peer, _, peer_rss = measure([sys.executable, "-m", "kopf", "run", "--standalone", "-A", "--quiet", str(bare)],
                                    args.objects, work, "bare-kopf")
        eyrie, owned, rss = measure([sys.executable, "-m", "eyrie.jobs.cli", "operator", "--standalone",
                                     "--metrics-port", "0"], args.objects, work, "eyrie")
    p50, p95 = pct(eyrie, 50), pct(eyrie, 95)
    r50, r95 = pct(owned, 50), pct(owned, 95)
    b50, b95 = pct(peer, 50), pct(peer, 95)
    print(f"operator_scale: {args.objects} DatasetGenerations created at once against kube-apiserver")
    print(f"  eyrie operator : to status.phase p50 {p50:.2f}s  p95 {p95:.2f}s  max {eyrie[-1]:.2f}s; "
          f"to an owned RayJob p50 {r50:.2f}s  p95 {r95:.2f}s  max {owned[-1]:.2f}s; peak RSS {rss:.0f} MiB")
    print(f"  bare kopf peer : to status.phase p50 {b50:.2f}s  p95 {b95:.2f}s  max {peer[-1]:.2f}s  "
          f"peak RSS {peer_rss:.0f} MiB")
    print(f"  ratio eyrie/peer: p50 x{p50 / b50:.2f}  p95 x{p95 / b95:.2f}  RSS x{rss / peer_rss:.2f}")
    print(f"  ratio to target: p95 to status {p95:.2f}s / {TARGET_P95_S:.0f}s = x{p95 / TARGET_P95_S:.2f} "
          f"({'met' if p95 <= TARGET_P95_S else 'MISSED'}); peak RSS {rss:.0f} / {TARGET_RSS_MIB:.0f} MiB = "
          f"x{rss / TARGET_RSS_MIB:.2f} ({'met' if rss <= TARGET_RSS_MIB else 'MISSED'})")
    met = p95 <= TARGET_P95_S and rss <= TARGET_RSS_MIB
    print(f"RESULT operator_scale p50_s={p50:.2f} p95_s={p95:.2f} rayjob_p95_s={r95:.2f} rss_mib={rss:.0f} "
          f"{'PASS' if met else 'MISS'}")


if __name__ == "__main__":
    main()

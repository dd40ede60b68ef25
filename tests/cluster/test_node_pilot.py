"""The pilot in real pods (issue 41): on the real node, the chart's operator runs a DatasetGeneration's pilot as a Job
of its own (the CPU extractor image, which has SpecForge's code) before any generation child; the provider is the
simulator serving the built-in target's own answers (builtin:tiny-chat, decoded in its pod from the extractor image).
One run, in text mode with `policy: require`: the pilot's verdict (text worse) in the status, the conditions, the
events and `kubectl get`, the run suspended before anything is generated beyond the pilot; then the line the
suspension's message gives (`kubectl patch` to structured, `suspend: false`) resumes it: a second pilot pod re-judges
for the new settings buying nothing, the generation RayJob and the extraction Job run, the run Succeeds, and none of
the pilot's answers is paid for again (the simulator's own count).

Small: 30 rows, 20 pilot prompts of which 5 held out, 60 training steps per drafter, the smallest budget measured
here whose verdict is separated (text 2.60 [1.97, 3.54] against structured 4.28 [2.75, 7.89] tokens per step, the same
figures in the pod as with `eyrie pilot` on this machine; at 10 steps the two are 1.29 and 1.27, and text passes).
The resumed attempt's pilot reuses the first one's answers and drafters: it buys and trains nothing."""

from __future__ import annotations

import io
import json
import re
import shlex
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from minio import Minio

from eyrie.jobs.contract import layout, records
from eyrie.jobs.contract.fingerprint import pilot_key
from eyrie.jobs.contract.money import brief
from eyrie.jobs.contract.pilot import read_verdict
from eyrie.jobs.simulator.config import SimulatorConfig
from eyrie.jobs.spec import SimulatorSpec, TargetSpec, parse_spec

from .conftest import API_KEY, Release, dsg
from .node import Node, images_archive
from .node_runs import (
    EXTRACTOR_IMAGE,
    PRICING,
    RAY_IMAGE,
    SIM_PORT,
    Cluster,
    delete_every_run,
    eyrie_pods,
    running_cluster,
)
from .testbed import DSG, JOBS, RAYJOBS, REPO

NS = "pilot"
ROWS, PROMPTS, HELDOUT = 30, 20, 5
TARGET = {"model": "eyrie/tiny-chat", "tokenizer": "builtin:tiny-chat", "chatFormat": "auto"}
# examples/pilot.yaml's simulator
SIMULATED = SimulatorSpec.model_validate({"answerModel": "builtin:tiny-chat", "answerModelCalls": "model"})


def sim_args() -> tuple[str, ...]:
    """The simulator as `eyrie run examples/pilot.yaml` starts it (the model's own answers, its own calls, usage
    counted with its tokenizer), handed to `eyrie simulate` whole, as SimulatorProcess hands it."""
    return ("--config-json", SimulatorConfig.from_spec(SIMULATED, TargetSpec.model_validate(TARGET)).to_json())


@pytest.fixture(scope="module")
def cluster(node_kuberay: Node, release: Release, s3_server: Any) -> Iterator[Cluster]:
    node_kuberay.import_image(images_archive("extractor-cpu"))
    with running_cluster(node_kuberay, release, s3_server, NS, latency_ms=0, sim_image=EXTRACTOR_IMAGE,
                         sim_args=sim_args()) as c:
        yield c
        delete_every_run(c)


def bucket_with_pilot_prompts(cluster: Cluster) -> str:
    """examples/prompts/pilot.jsonl (tool-declaring prompts of the target's own distribution) in a bucket."""
    name = f"pilot{abs(hash(cluster.ns)) % 10**6}"
    client = Minio(f"127.0.0.1:{cluster.s3.port}", access_key=cluster.s3.access_key,
                   secret_key=cluster.s3.secret_key, secure=False)
    if not client.bucket_exists(name):
        client.make_bucket(name)
    body = (REPO / "examples" / "prompts" / "pilot.jsonl").read_bytes()
    client.put_object(name, "prompts.jsonl", io.BytesIO(body), len(body))
    return name


def pilot_spec(cluster: Cluster, bucket: str) -> dict[str, Any]:
    return {
        "sources": [{"name": "tiny", "uri": f"s3://{bucket}/prompts.jsonl", "format": "openai", "limit": ROWS}],
        "target": TARGET,
        "api": {"baseUrl": f"http://sim.{cluster.ns}.svc:{SIM_PORT}/v1",
                "apiKeySecretRef": {"name": "provider", "key": "api-key"}, "maxConcurrency": 4, "maxRetries": 4,
                "requestTimeoutSeconds": 120, "sampling": {"temperature": 0, "maxTokens": 1024,
                                                           "reasoning": {"effort": "high"}}},
        "tools": {"mode": "text", "onInvalidCall": "keep", "gate": {"enabled": False}},
        "budget": {"maxUSD": "1.00", "pricing": PRICING},
        "generation": {"shards": 2, "ray": {"mode": "RayJob", "image": RAY_IMAGE, "workers": 1,
                                            "cpusPerWorker": 0.25}},
        "extraction": {"enabled": True, "engine": "transformers", "model": "builtin:tiny-chat",
                       "image": EXTRACTOR_IMAGE, "pods": 1, "gpusPerPod": 0, "device": "cpu", "dtype": "bfloat16"},
        "pilot": {"prompts": PROMPTS, "heldout": HELDOUT, "compare": ["otherMode"],
                  "training": {"steps": 60, "tokensPerStep": 256}, "policy": "require", "margin": 0.0},
        "output": {"uri": f"s3://{bucket}/run", "endpoint": cluster.minio_endpoint,
                   "credentialsSecretRef": {"name": "s3"}},
    }


def said(event: str, message: str) -> bool:
    """An event says `message` (kopf keeps an event's first and last 510 characters of a longer one)."""
    return event == message or (len(message) > 1024 and event[:500] == message[:500] and event[-500:] == message[-500:])


def pilot_pods(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [p for p in eyrie_pods(cluster, name)
            if (p["metadata"].get("labels") or {}).get("batch.kubernetes.io/job-name") == f"{name}-pilot"]


def get_columns(cluster: Cluster, name: str) -> dict[str, str]:
    out = cluster.cp.kubectl("get", "dsg", name, "-n", cluster.ns, "-o", "wide", check=True).stdout.splitlines()
    return dict(zip(out[0].split(), out[1].split(), strict=False))


def test_a_require_pilot_suspends_with_its_verdict_and_the_other_mode_resumes_paying_nothing_twice(
        cluster: Cluster) -> None:
    cp, name = cluster.cp, "pilot"
    bucket = bucket_with_pilot_prompts(cluster)
    store = cluster.store(bucket)
    before = cluster.sim_reset()
    body = pilot_spec(cluster, bucket)
    cp.create(DSG, NS, dsg(name, body))

    # the pilot's own Job and pod, from the extractor image, before any generation child
    cluster.wait(name, "the pilot's pod", lambda: [p for p in pilot_pods(cluster, name)
                                                  if p["spec"]["containers"][0]["image"] == EXTRACTOR_IMAGE],
                 timeout=180)
    job = cp.get(JOBS, NS, f"{name}-pilot")
    owner = job["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("DatasetGeneration", name, True)
    assert job["metadata"]["annotations"]["eyrie.dev/attempt"] == "1"
    cluster.wait(name, "phase Pilot", cluster.phase_is(name, "Pilot", "Suspended", "Failed"), timeout=60)

    cluster.wait(name, "Suspended", cluster.phase_is(name, "Suspended", "Failed", "Succeeded"), timeout=1200, every=2)
    st = cluster.status(name)
    suspended = cluster.condition(name, "Suspended")
    assert suspended is not None and (suspended["status"], suspended["reason"]) == ("True", "PilotFailed"), \
        cluster.diagnose(name)
    assert cp.get(DSG, NS, name)["spec"]["suspend"] is True
    verdict = read_verdict(store)
    assert verdict is not None and not verdict.passed and not verdict.proceed
    assert (verdict.own, verdict.best_alternative) == ("text", "structured")
    assert verdict.key == pilot_key(parse_spec({"spec": body}).spec)
    # the verdict in the conditions, the events and the status
    passed = cluster.condition(name, "PilotPassed")
    assert passed is not None and (passed["status"], passed["reason"], passed["message"]) == (
        "False", "PilotFailed", verdict.sentence)
    assert suspended["message"].startswith(verdict.sentence)
    line = next(m for m in re.findall(r"kubectl patch dsg \S+ -n \S+ --type merge -p '[^']*'", suspended["message"])
                if "structured" in m)
    assert line == (f"kubectl patch dsg {name} -n {NS} --type merge -p "
                    """'{"spec":{"suspend":false,"tools":{"mode":"structured"}}}'""")
    [warned] = [e for e in cp.events(NS, name) if e["reason"] == "PilotFailed"]
    assert warned["type"] == "Warning" and said(warned["message"], suspended["message"])
    by = {o.option: o for o in verdict.options}
    pilot = st["pilot"]
    assert (pilot["runOption"], pilot["bestOption"], pilot["passed"]) == ("text", "structured", False)
    assert pilot["runAccepted"] == round(by["text"].accepted_length.value, 3)
    assert pilot["bestAccepted"] == round(by["structured"].accepted_length.value, 3)
    columns = get_columns(cluster, name)
    assert (columns["PHASE"], columns["ALT"]) == ("Suspended", "structured")
    assert float(columns["ACCEPTED"]) == pilot["runAccepted"] and float(columns["ALTACCEPTED"]) == pilot[
        "bestAccepted"]
    # nothing generated beyond the pilot: no RayJob ever, no record of the run's own
    assert cp.list(RAYJOBS, NS) == [] and records.list_shards(store) == []
    assert {p["status"]["phase"] for p in pilot_pods(cluster, name)} <= {"Succeeded", "Failed"}
    paid = cluster.sim_stats()
    bought = paid["completed"] - before["completed"]
    assert bought == 2 * PROMPTS  # each pilot prompt once per tools mode
    billed = Decimal(paid["billedUSD"]) - Decimal(before["billedUSD"])
    assert Decimal(st["spentUSD"]) == Decimal(brief(billed)) and billed > 0
    # the secrets stay in their Secrets
    assert API_KEY not in json.dumps(cp.get(DSG, NS, name)) and API_KEY not in json.dumps(job)

    # what the message says to run: the other mode, unsuspended
    args = shlex.split(line)
    assert args[:2] == ["kubectl", "patch"]
    cp.kubectl(*args[1:], check=True)
    cluster.wait(name, "Succeeded", cluster.phase_is(name, "Succeeded", "Failed"), timeout=1500, every=2)
    st = cluster.status(name)
    assert (st["phase"], st["attempt"]) == ("Succeeded", "2"), cluster.diagnose(name)
    again = read_verdict(store)
    assert again is not None and again.passed and again.own == "structured"
    passed = cluster.condition(name, "PilotPassed")
    assert (passed["status"], passed["reason"], passed["message"]) == ("True", "PilotPassed", again.sentence)
    assert any(e["type"] == "Normal" and said(e["message"], again.sentence) for e in cp.events(NS, name)
               if e["reason"] == "PilotPassed")
    assert st["pilot"]["passed"] is True and st["pilot"]["runOption"] == "structured"
    # the second pilot pod ran for attempt 2, then the generation RayJob of attempt 2 and the extraction Job
    assert cp.get(JOBS, NS, f"{name}-pilot")["metadata"]["annotations"]["eyrie.dev/attempt"] == "2"
    assert (cp.get(JOBS, NS, f"{name}-extract") or {}).get("metadata") is not None
    # none of the pilot's answers paid for again: the run bought only the rows the pilot did not hand it
    after = cluster.sim_stats()
    assert again.adopted > 0
    assert after["completed"] - paid["completed"] == ROWS - again.adopted, (again.adopted, after, paid)
    ids = [r["sample_id"] for r in records.iter_records(store)]
    assert len(ids) == len(set(ids)) == ROWS
    billed = Decimal(after["billedUSD"]) - Decimal(before["billedUSD"])
    assert Decimal(st["spentUSD"]) == Decimal(brief(billed))
    assert st["outputReport"] == store.url(layout.REPORT)
    manifest = json.loads(store.get(layout.MANIFEST))
    assert manifest["reconstruction"]["samples"]["kept"] == ROWS, manifest["reconstruction"]["samples"]
    assert manifest["extraction"]["samples"] == ROWS, manifest["extraction"]
    # the pilot's progress.json of the same attempt is no restart of the generation job's
    assert not {"GenerationRestarted", "GenerationRetried"} & {e["reason"] for e in cp.events(NS, name)}

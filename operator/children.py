"""Pure manifest builders for the children of a DatasetGeneration: ConfigMap, RayJob, extraction Job.

Names are deterministic functions of the parent (and the generation attempt), so a restarted
operator finds what it created instead of creating it twice, and they fit every limit for any valid
DatasetGeneration name (a DNS-1123 subdomain: up to 253 characters, dots, a leading digit): a name
that would not fit is cut and given a short hash of the full name, so two parents never share one.
Secrets are never copied into a manifest: the jobs receive them as env from `secretKeyRef`.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any

import yaml

from eyrie.jobs.contract.layers import ENGINE_BATCH_TOKENS, num_aux_layers, spool_bytes
from eyrie.jobs.errors import EyrieError
from eyrie.jobs.spec import DatasetGeneration, DatasetGenerationSpec

ATTEMPT_ANNOTATION = "eyrie.dev/attempt"
STOP_ANNOTATION = "eyrie.dev/stop-requested-at"
PILOT_KEY_ANNOTATION = "eyrie.dev/pilot-key"  # on the pilot Job: the settings its verdict is for
SUSPENDED_ANNOTATION = "eyrie.dev/suspended"  # on the Job: eyrie set spec.suspend, so eyrie may clear it
DATASET_LABEL = "eyrie.dev/dataset"  # the name, or its cut-and-hashed form when not a label value
DATASET_ANNOTATION = "eyrie.dev/dataset-name"  # the full name, where the label is not
ROLE_LABEL = "eyrie.dev/role"
MANAGED_BY = {"app.kubernetes.io/managed-by": "eyrie"}
KUEUE_PREFIX = "kueue.x-k8s.io/"
QUEUE_NAME_LABEL = f"{KUEUE_PREFIX}queue-name"
SPEC_DIR = "/etc/eyrie"
SPEC_KEY = "spec.yaml"
SPEC_PATH = f"{SPEC_DIR}/{SPEC_KEY}"
RAYJOB_API = ("ray.io", "v1", "rayjobs")
GENERATION_ENTRYPOINT = f"eyrie run {SPEC_PATH} --until samples"
PILOT_COMMAND = ("eyrie", "pilot", SPEC_PATH)
# KubeRay: a RayJob name is a DNS-1035 label of at most 47 characters (it derives RayCluster, pod and
# Service names from it; utils/constant.go MaxRayJobNameLength).
RAYJOB_NAME_MAX = 47
# A Job's name is its pods' `batch.kubernetes.io/job-name` label (<= 63) and an Indexed Job's pod
# hostname is `<job>-<index>`, a DNS-1123 label (<= 63): room is kept for an index up to 99999
# (the API server's bound on Indexed completions with backoffLimitPerIndex is 100000).
JOB_NAME_MAX = 63 - len("-99999")
LABEL_VALUE_MAX = 63
SUBDOMAIN_MAX = 253
DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
HASH_CHARS = 8
# The extraction Job's failure budget, per index (one pod's share): a non-zero exit of the extractor
# fails the Job at once (its errors repeat on a retry: a bad model path, a store refusing writes,
# out of memory); a disruption (preemption, eviction, a drained node) is not counted at all; other
# pod failures get this many retries per index instead of one backoffLimit shared by every pod.
EXTRACT_RETRIES_PER_INDEX = 2
# The operator cannot read the model, so /dev/shm is sized for the widest supported hidden size
# (Llama-3.1-405B); a sizeLimit reserves nothing, and the backend checks the real need at start-up.
SHM_HIDDEN_BOUND = 16384
SHM_HEADROOM = 1 << 30  # NCCL's tensor-parallel buffers live in /dev/shm too


class ChildSpecError(EyrieError, ValueError):
    """The spec lacks something a cluster child needs; `field` is the spec path to fix."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(f"{field}: {message}")


def name_hash(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:HASH_CHARS]


def fit(name: str, suffix: str, limit: int, valid: re.Pattern[str], letter_first: bool = False) -> str:
    """`<name><suffix>` when that is valid within `limit`; else the name with dots made dashes (and
    `dg-` before a leading digit where a letter must lead), cut to fit, then `-<hash of name><suffix>`."""
    plain = name + suffix
    if len(plain) <= limit and valid.fullmatch(plain):
        return plain
    base = re.sub(r"[^a-z0-9-]", "-", name.lower())
    if letter_first and not base[:1].isalpha():
        base = "dg-" + base
    tail = f"-{name_hash(name)}{suffix}"
    return base[: limit - len(tail)].rstrip("-") + tail


def configmap_name(name: str) -> str:
    return fit(name, "-spec", SUBDOMAIN_MAX, DNS1123_SUBDOMAIN)


def generation_name(name: str, attempt: str) -> str:
    return fit(name, f"-gen-{attempt}", RAYJOB_NAME_MAX, DNS1035_LABEL, letter_first=True)


def extraction_name(name: str) -> str:
    return fit(name, "-extract", JOB_NAME_MAX, DNS1123_LABEL)


def pilot_name(name: str) -> str:
    return fit(name, "-pilot", JOB_NAME_MAX, DNS1123_LABEL)


def dataset_label(name: str) -> str:
    """The parent's name as a label value (<= 63 characters); when it had to be cut, the full name is
    in the `eyrie.dev/dataset-name` annotation."""
    return fit(name, "", LABEL_VALUE_MAX, LABEL_VALUE)


def submission_id(namespace: str, name: str, attempt: str) -> str:
    """The Ray submission id of one attempt: the same on every operator restart, never reused."""
    return f"eyrie-{namespace}-{name}-{attempt}"


def extraction_count(spec: DatasetGenerationSpec) -> int:
    """Shard groups = pods: each pod loads the model once and extracts its share of the shards."""
    return spec.extraction.pods


def drain_seconds(spec: DatasetGenerationSpec) -> int:
    """How long a stopping job may take: its in-flight requests finish (or time out), then it flushes.

    Ray's job supervisor SIGKILLs a stopped driver after RAY_JOB_STOP_WAIT_TIME_S (default 3 s), which
    would lose responses already paid for, so it is set to this. The Ray pods' grace period is this too:
    an upper bound only, since they leave as soon as Ray has torn down (RAY_POD_ENV).
    """
    return math.ceil(spec.api.request_timeout_seconds) + 30


# The env of every Ray container. `ray start --block` is the container's PID 1 (KubeRay runs `bash -c "ulimit ...;
# ray start ..."`, and bash execs its last command) and Ray 2.60 handles SIGTERM by draining the node first: it
# waits, up to RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S (default 30 s), for the node to become idle, which a node
# running a shard worker (a live actor) never does; with the head already gone (a deleted RayCluster's head pod
# leaves in about 4 s) its drain call to the GCS hangs that long instead. Measured (tests/operator/test_ray_pod_stop.py:
# Ray 2.60, each node PID 1 of its own PID and network namespace, as in a pod): a worker node with an actor left
# 31-35 s after SIGTERM, an idle one with the head gone 33 s, against 1.4-2.5 s with 0. The drain is for Ray
# Serve's proxies; eyrie drains the job itself before the pods go (the operator's graceful stop, StopGeneration),
# so 0: the pods leave as soon as Ray has torn down.
RAY_POD_ENV = ({"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": "0"},)


def stop_env(spec: DatasetGenerationSpec) -> dict[str, str]:
    """Env for Ray's job supervisor (via the job's runtime_env): wait for the drain, then kill."""
    return {"RAY_JOB_STOP_WAIT_TIME_S": str(drain_seconds(spec))}


def kueue_labels(labels: dict[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (labels or {}).items() if k.startswith(KUEUE_PREFIX)}


def _labels(name: str, role: str, parent_labels: dict[str, str] | None) -> dict[str, str]:
    """eyrie's labels and the parent's Kueue labels: no other label of the parent reaches a child."""
    return {**MANAGED_BY, DATASET_LABEL: dataset_label(name), ROLE_LABEL: role, **kueue_labels(parent_labels)}


def _metadata(child: str, name: str, namespace: str, role: str, parent_labels: dict[str, str] | None,
              **annotations: str) -> dict[str, Any]:
    """Name, labels and annotations; the full parent name is annotated where the label had to cut it."""
    meta: dict[str, Any] = {"name": child, "namespace": namespace, "labels": _labels(name, role, parent_labels)}
    if dataset_label(name) != name:
        annotations = {DATASET_ANNOTATION: name, **annotations}
    if annotations:
        meta["annotations"] = annotations
    return meta


def resolved_spec_yaml(name: str, namespace: str, spec: DatasetGenerationSpec) -> str:
    """The spec with every default filled in, as the jobs read it (references to Secrets only)."""
    doc = DatasetGeneration(metadata={"name": name, "namespace": namespace}, spec=spec).dump()
    doc.pop("status", None)
    return yaml.safe_dump(doc, sort_keys=False)


def configmap(name: str, namespace: str, spec: DatasetGenerationSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(configmap_name(name), name, namespace, "spec", None),
        "data": {SPEC_KEY: resolved_spec_yaml(name, namespace, spec)},
    }


def _secret_env(var: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}


def secret_env(spec: DatasetGenerationSpec) -> list[dict[str, Any]]:
    """API key and S3 credentials as env from the referenced Secrets (values never leave them)."""
    env = []
    if spec.api.api_key_secret_ref is not None:
        ref = spec.api.api_key_secret_ref
        env.append(_secret_env("EYRIE_API_KEY", ref.name, ref.key))
    creds = spec.output.credentials_secret_ref
    if creds is not None:
        env.append(_secret_env("EYRIE_S3_ACCESS_KEY", creds.name, creds.access_key_key))
        env.append(_secret_env("EYRIE_S3_SECRET_KEY", creds.name, creds.secret_key_key))
    return env


def _env(spec: DatasetGenerationSpec, attempt: str | None, uid: str = "",
         accept_fingerprint: str | None = None) -> list[dict[str, Any]]:
    env = [{"name": "EYRIE_ATTEMPT", "value": attempt}] if attempt is not None else []
    if uid:
        env.append({"name": "EYRIE_RUN_ID", "value": uid})
    if accept_fingerprint:  # the user accepted this spec's new fingerprint (annotation eyrie.dev/accept-fingerprint)
        env.append({"name": "EYRIE_ACCEPT_FINGERPRINT", "value": accept_fingerprint})
    if spec.output.endpoint:
        env.append({"name": "EYRIE_S3_ENDPOINT", "value": spec.output.endpoint})
    return env + secret_env(spec)


def _spec_volume(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    volume = {"name": "eyrie-spec", "configMap": {"name": configmap_name(name)}}
    mount = {"name": "eyrie-spec", "mountPath": SPEC_DIR, "readOnly": True}
    return volume, mount


def rayjob(name: str, namespace: str, spec: DatasetGenerationSpec, attempt: str,
           parent_labels: dict[str, str] | None = None, uid: str = "",
           accept_fingerprint: str | None = None) -> dict[str, Any]:
    """A KubeRay RayJob running the generation job on its own cluster, torn down when it ends."""
    ray = spec.generation.ray
    if not ray.image:
        raise ChildSpecError("spec.generation.ray.image", "required when generation.ray.mode is RayJob")
    volume, mount = _spec_volume(name)
    env = [*RAY_POD_ENV, *_env(spec, attempt, uid, accept_fingerprint)]
    worker_resources: dict[str, Any] = {"cpu": str(ray.cpus_per_worker)}
    if ray.memory_per_worker:
        worker_resources["memory"] = ray.memory_per_worker

    def pod(container: str, resources: dict[str, Any]) -> dict[str, Any]:
        return {"spec": {
            "terminationGracePeriodSeconds": drain_seconds(spec),
            "containers": [{"name": container, "image": ray.image, "env": env, "volumeMounts": [mount],
                            "resources": {"requests": resources, "limits": resources}}],
            "volumes": [volume]}}

    body: dict[str, Any] = {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": _metadata(generation_name(name, attempt), name, namespace, "generation", parent_labels,
                              **{ATTEMPT_ANNOTATION: attempt}),
        "spec": {
            "entrypoint": GENERATION_ENTRYPOINT,
            # a cluster that never comes up (an image that cannot be pulled, pods that never schedule)
            # fails with reason PreRunningDeadlineExceeded instead of staying Pending (KubeRay >= 1.6)
            "preRunningDeadlineSeconds": ray.pre_running_deadline_seconds,
            # JSON is YAML; no secret in here, only how long a stop may drain
            "runtimeEnvYAML": json.dumps({"env_vars": stop_env(spec)}),
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 300,
            "rayClusterSpec": {
                "headGroupSpec": {
                    # the driver runs on the head; work is scheduled on the workers
                    "rayStartParams": {"dashboard-host": "0.0.0.0", "num-cpus": "0"},
                    "template": pod("ray-head", {"cpu": "1", "memory": "2Gi"}),
                },
                "workerGroupSpecs": [{
                    "groupName": "workers",
                    "replicas": ray.workers,
                    "minReplicas": ray.workers,
                    "maxReplicas": ray.workers,
                    "rayStartParams": {},
                    "template": pod("ray-worker", worker_resources),
                }],
            },
        },
    }
    if kueue_labels(parent_labels):
        body["spec"]["suspend"] = True  # Kueue admits it by unsuspending; from then on Kueue owns it
    return body


def shm_size(spec: DatasetGenerationSpec) -> str:
    """sizeLimit of the extraction pod's /dev/shm: one spooled batch at the widest hidden size, plus NCCL's."""
    ext = spec.extraction
    need = spool_bytes(ext.max_tokens_per_batch or ENGINE_BATCH_TOKENS, num_aux_layers(ext.layers), SHM_HIDDEN_BOUND,
                       4 if ext.dtype == "float32" else 2)
    return f"{math.ceil((need + SHM_HEADROOM) / 2**20)}Mi"


def _gpu_pod(name: str, spec: DatasetGenerationSpec, container_name: str, command: list[str],
             env: list[dict[str, Any]]) -> dict[str, Any]:
    """The pod of a Job on `spec.extraction`'s image and resources (GPUs, memory, node selector, tolerations, the
    shared memory SGLang spools into): the extraction pods' and the pilot's, which runs where extraction runs."""
    ext = spec.extraction
    volume, mount = _spec_volume(name)
    container: dict[str, Any] = {"name": container_name, "image": ext.image, "command": command, "env": env,
                                 "volumeMounts": [mount]}
    limits: dict[str, Any] = {}
    if ext.gpus_per_pod > 0:
        limits["nvidia.com/gpu"] = ext.gpus_per_pod
    if ext.memory:
        limits["memory"] = ext.memory
    if limits:
        container["resources"] = {"limits": limits, **({"requests": {"memory": ext.memory}} if ext.memory else {})}
    volumes = [volume]
    if ext.engine == "sglang":
        # containers get 64 MiB of /dev/shm; SGLang spools a whole batch of hidden states there
        volumes.append({"name": "eyrie-shm", "emptyDir": {"medium": "Memory", "sizeLimit": shm_size(spec)}})
        container["volumeMounts"].append({"name": "eyrie-shm", "mountPath": "/dev/shm"})
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [container], "volumes": volumes}
    if ext.node_selector:
        pod_spec["nodeSelector"] = dict(ext.node_selector)
    if ext.tolerations:
        pod_spec["tolerations"] = [t.dump() for t in ext.tolerations]
    return pod_spec


def _fail_on_exit(container: str) -> dict[str, Any]:
    """A Job's podFailurePolicy: a disruption (preemption, eviction, a drained node) is not counted at all; a
    non-zero exit of `container` fails the Job at once (its errors repeat on a retry: a bad model path, a store
    refusing writes, out of memory); other pod failures are retried within the Job's backoff limit."""
    return {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        # onPodConditions: [] because Kubernetes <= 1.28's schema requires the key
        {"action": "FailJob", "onPodConditions": [],
         "onExitCodes": {"containerName": container, "operator": "NotIn", "values": [0]}},
    ]}


def extraction_job(name: str, namespace: str, spec: DatasetGenerationSpec,
                   parent_labels: dict[str, str] | None = None) -> dict[str, Any]:
    """An Indexed batch/v1 Job: one index per shard group, GPUs per pod, scheduled as the spec says."""
    ext = spec.extraction
    if not ext.image:
        raise ChildSpecError("spec.extraction.image", "required when extraction.enabled is true")
    count = extraction_count(spec)
    labels = _labels(name, "extraction", parent_labels)
    # $(VAR) is expanded by the kubelet from the container env; the Job controller sets this one.
    command = ["eyrie", "extract", SPEC_PATH, "--index", "$(JOB_COMPLETION_INDEX)", "--count", str(count)]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(extraction_name(name), name, namespace, "extraction", parent_labels),
        "spec": {
            "completionMode": "Indexed",
            "completions": count,
            "parallelism": ext.pods,
            "backoffLimitPerIndex": EXTRACT_RETRIES_PER_INDEX,
            "podFailurePolicy": _fail_on_exit("extract"),
            "suspend": bool(kueue_labels(parent_labels)),
            "template": {"metadata": {"labels": labels},
                         "spec": _gpu_pod(name, spec, "extract", command, _env(spec, None))},
        },
    }


def pilot_job(name: str, namespace: str, spec: DatasetGenerationSpec, attempt: str, key: str,
              parent_labels: dict[str, str] | None = None, uid: str = "",
              accept_fingerprint: str | None = None) -> dict[str, Any]:
    """The pilot (`eyrie pilot`): one pod where the run's extraction runs (its image, which has SpecForge's code; a
    GPU pod when extraction asks for GPUs), buying the pilot's slice with the run's API key, extracting it, training
    and evaluating the drafters, writing the verdict to the output. It carries the attempt it runs under and the key
    of the settings its verdict is for (`PILOT_KEY_ANNOTATION`): a Job for other settings is deleted, not watched.
    The failure policy is the extraction Job's: a non-zero exit fails it at once, a disruption is not counted, other
    pod failures are retried `EXTRACT_RETRIES_PER_INDEX` times. `eyrie pilot` exits non-zero on a decided suspension
    (10) and on its stops (budget, credits, a signal) too: what it wrote to the store says which, and the operator
    reads that before the Job's end."""
    if not spec.extraction.image:
        raise ChildSpecError("spec.extraction.image", "required when extraction.enabled is true")
    labels = _labels(name, "pilot", parent_labels)
    command = [*PILOT_COMMAND, "--device", "cuda" if spec.extraction.gpus_per_pod > 0 else "cpu"]
    pod = _gpu_pod(name, spec, "pilot", command, _env(spec, attempt, uid, accept_fingerprint))
    # a deleted pilot (suspended, other settings) gets SIGTERM: its requests in flight finish and become durable
    pod["terminationGracePeriodSeconds"] = drain_seconds(spec)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(pilot_name(name), name, namespace, "pilot", parent_labels,
                              **{ATTEMPT_ANNOTATION: attempt, PILOT_KEY_ANNOTATION: key}),
        "spec": {
            "completions": 1,
            "parallelism": 1,
            "backoffLimit": EXTRACT_RETRIES_PER_INDEX,
            "podFailurePolicy": _fail_on_exit("pilot"),
            "suspend": bool(kueue_labels(parent_labels)),
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def check_cluster_spec(spec: DatasetGenerationSpec) -> None:
    """What the CRD accepts but a cluster cannot run; raises ChildSpecError naming the field."""
    ray = spec.generation.ray
    if ray.mode == "Local":
        raise ChildSpecError("spec.generation.ray.mode",
                             "Local runs only with `eyrie run` on one machine; "
                             "use RayJob or Submit in a cluster")
    if ray.mode == "RayJob" and not ray.image:
        raise ChildSpecError("spec.generation.ray.image", "required when generation.ray.mode is RayJob")
    if spec.extraction.enabled and not spec.extraction.image:
        raise ChildSpecError("spec.extraction.image", "required when extraction.enabled is true")

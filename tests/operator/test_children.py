"""The children's manifests: what KubeRay, the Job controller and Kueue will read."""

from __future__ import annotations

import functools
import re
from typing import Any

import jsonschema
import pytest
import yaml

from eyrie.jobs.spec import parse_spec
from eyrie.operator import children
from tests.reference_helpers import reference

from .test_reconcile import spec, spec_doc


def test_rayjob_cluster_from_generation_ray() -> None:
    body = children.rayjob("dg", "ns", spec(), "3", {"kueue.x-k8s.io/queue-name": "q", "team": "x"})
    assert body["apiVersion"] == "ray.io/v1" and body["kind"] == "RayJob"
    assert body["metadata"]["name"] == "dg-gen-3"
    assert body["metadata"]["annotations"] == {"eyrie.dev/attempt": "3"}
    assert body["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    assert "team" not in body["metadata"]["labels"]
    s = body["spec"]
    assert s["shutdownAfterJobFinishes"] is True
    assert s["suspend"] is True  # Kueue-labelled: created suspended, Kueue admits it
    assert s["entrypoint"] == "eyrie run /etc/eyrie/spec.yaml --until samples"
    # a stop drains in-flight requests (api.requestTimeoutSeconds default 600) before anything is killed
    assert yaml.safe_load(s["runtimeEnvYAML"]) == {"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "630"}}
    (group,) = s["rayClusterSpec"]["workerGroupSpecs"]
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (3, 3, 3)
    worker = group["template"]["spec"]["containers"][0]
    assert worker["image"] == "ray:1"
    assert worker["resources"]["limits"] == {"cpu": "2.0", "memory": "4Gi"}
    env = {e["name"]: e for e in worker["env"]}
    assert env["EYRIE_ATTEMPT"] == {"name": "EYRIE_ATTEMPT", "value": "3"}
    assert env["EYRIE_API_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "openrouter", "key": "api-key"}}
    assert env["EYRIE_S3_ACCESS_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "minio", "key": "accessKey"}}
    assert env["EYRIE_S3_SECRET_KEY"]["valueFrom"] == {"secretKeyRef": {"name": "minio", "key": "secretKey"}}
    head = s["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    # Ray's own node drain off in every Ray container: the pods leave at once (tests/operator/test_ray_pod_stop.py)
    for container in (worker, head["containers"][0]):
        assert {"name": "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "value": "0"} in container["env"]
    assert head["terminationGracePeriodSeconds"] == group["template"]["spec"]["terminationGracePeriodSeconds"] == 630
    assert head["volumes"] == [{"name": "eyrie-spec", "configMap": {"name": "dg-spec"}}]
    assert head["containers"][0]["volumeMounts"][0]["mountPath"] == "/etc/eyrie"


def test_rayjob_without_kueue_is_not_suspended() -> None:
    assert "suspend" not in children.rayjob("dg", "ns", spec(), "1", {})["spec"]


def test_extraction_job_is_indexed_on_gpus() -> None:
    body = children.extraction_job(
        "dg", "ns", spec(extraction__enabled=True), {"kueue.x-k8s.io/queue-name": "q"}
    )
    s = body["spec"]
    assert (s["completionMode"], s["completions"], s["parallelism"], s["suspend"]) == ("Indexed", 2, 2, True)
    pod = s["template"]["spec"]
    (c,) = pod["containers"]
    assert c["image"] == "sgl:1"
    assert c["command"] == [
        "eyrie",
        "extract",
        "/etc/eyrie/spec.yaml",
        "--index",
        "$(JOB_COMPLETION_INDEX)",
        "--count",
        "2",
    ]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 8}}
    assert pod["nodeSelector"] == {"gpu": "h200"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert pod["restartPolicy"] == "Never"
    assert "EYRIE_ATTEMPT" not in {e["name"] for e in c["env"]}


def test_extraction_memory_is_each_pods_request_and_limit() -> None:
    c = children.extraction_job("dg", "ns", spec(extraction__enabled=True, extraction__memory="48Gi"))[
        "spec"]["template"]["spec"]["containers"][0]
    assert c["resources"] == {"limits": {"nvidia.com/gpu": 8, "memory": "48Gi"}, "requests": {"memory": "48Gi"}}
    cpu = children.extraction_job("dg", "ns", spec(extraction__enabled=True, extraction__gpusPerPod=0))[
        "spec"]["template"]["spec"]["containers"][0]
    assert "resources" not in cpu


def test_sglang_extraction_mounts_a_memory_dev_shm_that_holds_one_batch() -> None:
    """Containers get 64 MiB of /dev/shm; SGLang spools a whole batch there before eyrie reads it."""
    from eyrie.jobs.contract.layers import spool_bytes

    body = children.extraction_job("dg", "ns", spec(extraction__enabled=True, extraction__engine="sglang",
                                                    extraction__layers=[3, 20, 40, 60]))
    pod = body["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert vol["emptyDir"]["medium"] == "Memory"
    limit = int(vol["emptyDir"]["sizeLimit"].removesuffix("Mi")) * 2**20
    # one default batch (16,384 tokens) of 4 aux + last at the widest hidden size, bf16, and NCCL's share
    assert limit >= spool_bytes(16384, 4, 16384, 2) + (1 << 30)
    wider = children.extraction_job("dg", "ns", spec(extraction__enabled=True, extraction__engine="sglang",
                                                     extraction__maxTokensPerBatch=65536))
    (wvol,) = [v for v in wider["spec"]["template"]["spec"]["volumes"] if "emptyDir" in v]
    assert int(wvol["emptyDir"]["sizeLimit"].removesuffix("Mi")) * 2**20 >= spool_bytes(65536, 3, 16384, 2)
    # the transformers backend spools nothing
    plain = children.extraction_job("dg", "ns", spec(extraction__enabled=True))["spec"]["template"]["spec"]
    assert all("emptyDir" not in v for v in plain["volumes"])


def test_configmap_holds_the_resolved_spec_and_no_secret() -> None:
    cm = children.configmap("dg", "ns", spec())
    assert cm["metadata"]["name"] == "dg-spec"
    doc = yaml.safe_load(cm["data"]["spec.yaml"])
    assert doc["metadata"] == {"name": "dg", "namespace": "ns"}
    again = parse_spec(doc)
    assert again.spec == spec()
    assert doc["spec"]["api"]["apiKeySecretRef"] == {"name": "openrouter", "key": "api-key"}
    assert doc["spec"]["generation"]["partRecords"] == 256  # defaults filled in


def test_deterministic_names() -> None:
    assert children.submission_id("ns", "dg", "2") == "eyrie-ns-dg-2"
    assert children.generation_name("dg", "2") == "dg-gen-2"
    assert children.extraction_name("dg") == "dg-extract"
    assert spec_doc()["output"]["uri"] == "s3://out/run"


def _pod_template(template: dict) -> dict:
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}


def test_manifests_validate_against_the_kubernetes_schemas() -> None:
    """Built-in kinds (and the RayJob's pod templates) checked with the Kubernetes OpenAPI schemas."""
    import kubernetes_validate

    sp = spec(extraction__enabled=True)
    for name in ("dg", "x" * 253):
        kubernetes_validate.validate(children.configmap(name, "ns", sp), "1.33", strict=True)
        kubernetes_validate.validate(children.extraction_job(name, "ns", sp), "1.33", strict=True)
    kubernetes_validate.validate(children.extraction_job("dg", "ns", sp, {"kueue.x-k8s.io/queue-name": "q"}),
                                 "1.33", strict=True)
    kubernetes_validate.validate(children.extraction_job("dg", "ns", spec(extraction__enabled=True,
                                                                          extraction__engine="sglang")),
                                 "1.33", strict=True)
    pilot = spec(extraction__enabled=True, pilot={"prompts": 20})
    for name in ("dg", "x" * 253):
        kubernetes_validate.validate(children.pilot_job(name, "ns", pilot, "1", "0123456789abcdef", None, "uid"),
                                     "1.33", strict=True)
    kubernetes_validate.validate(children.pilot_job("dg", "ns", pilot, "1", "k", {"kueue.x-k8s.io/queue-name": "q"}),
                                 "1.33", strict=True)
    rj = children.rayjob("dg", "ns", sp, "1")["spec"]["rayClusterSpec"]
    for tpl in (rj["headGroupSpec"]["template"], rj["workerGroupSpecs"][0]["template"]):
        kubernetes_validate.validate(_pod_template(tpl), "1.33", strict=True)


# --------------------------------------------------------------------------- names real clusters accept

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
HOSTILE = [
    "dg",
    "llama3.1-70b-run",  # dots: not a DNS label
    "2026-08-kimi",  # a leading digit: not a DNS-1035 label
    "a" * 41,  # "-gen-1" makes 47: fits exactly
    "a" * 42,  # one over KubeRay's 47
    "b" * 60,  # over 63 with "-extract"
    "c" * 63,  # a label value at most
    "x" * 253,  # the longest DatasetGeneration name
    ".".join(["9a"] * 84)[:253].rstrip("."),  # 253 characters of dotted, digit-led segments
    "0",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_child_names_fit_every_limit(name: str) -> None:
    assert SUBDOMAIN.fullmatch(name) and len(name) <= 253  # a valid DatasetGeneration name
    for attempt in ("1", "12", "999"):
        rj = children.generation_name(name, attempt)
        assert len(rj) <= 47 and DNS1035_LABEL.fullmatch(rj), rj
    pilot = children.pilot_name(name)
    assert len(pilot) <= 63 and DNS1123_LABEL.fullmatch(pilot)
    assert pilot not in (children.extraction_name(name), children.configmap_name(name))
    job = children.extraction_name(name)
    assert len(job) <= 63 and DNS1123_LABEL.fullmatch(job)
    for index in (0, 99_999):  # the Indexed Job's pod hostnames
        assert len(f"{job}-{index}") <= 63 and DNS1123_LABEL.fullmatch(f"{job}-{index}")
    cm = children.configmap_name(name)
    assert len(cm) <= 253 and SUBDOMAIN.fullmatch(cm)
    label = children.dataset_label(name)
    assert len(label) <= 63 and LABEL_VALUE.fullmatch(label)


def test_names_that_fit_are_kept_as_they_are() -> None:
    assert children.generation_name("a" * 41, "1") == "a" * 41 + "-gen-1"
    assert children.extraction_name("dg") == "dg-extract"
    assert children.configmap_name("llama3.1-70b-run") == "llama3.1-70b-run-spec"  # dots are fine there
    assert children.dataset_label("llama3.1-70b-run") == "llama3.1-70b-run"


def test_cut_names_carry_a_hash_of_the_full_name() -> None:
    h = children.name_hash("2026-08-kimi")
    assert children.generation_name("2026-08-kimi", "2") == f"dg-2026-08-kimi-{h}-gen-2"
    assert children.generation_name("llama3.1-70b-run", "1") == \
        f"llama3-1-70b-run-{children.name_hash('llama3.1-70b-run')}-gen-1"
    # two names that differ only past the cut, or only in a dot, get different children
    for a, b in (("x" * 252 + "a", "x" * 252 + "b"), ("llama3.1-70b", "llama3-1-70b")):
        assert children.generation_name(a, "1") != children.generation_name(b, "1")
        assert children.extraction_name(a) != children.extraction_name(b)
        assert children.dataset_label(a) != children.dataset_label(b) or len(a) <= 63
    # unique per attempt, stable across calls (a restarted operator finds its children)
    long = "x" * 253
    assert children.generation_name(long, "1") != children.generation_name(long, "2")
    assert children.generation_name(long, "1") == children.generation_name(long, "1")


def test_a_long_name_is_a_hashed_label_and_a_full_annotation() -> None:
    name = "d" * 200
    for body in (children.configmap(name, "ns", spec()), children.rayjob(name, "ns", spec(), "1"),
                 children.extraction_job(name, "ns", spec(extraction__enabled=True))):
        meta = body["metadata"]
        assert meta["labels"]["eyrie.dev/dataset"] == children.dataset_label(name) != name
        assert meta["annotations"]["eyrie.dev/dataset-name"] == name


def test_only_eyries_and_kueues_labels_reach_a_child() -> None:
    parent = {"team": "a", "app.kubernetes.io/name": "x", "kueue.x-k8s.io/queue-name": "q",
              "kueue.x-k8s.io/priority-class": "p"}
    want = {"app.kubernetes.io/managed-by", "eyrie.dev/dataset", "eyrie.dev/role", "kueue.x-k8s.io/queue-name",
            "kueue.x-k8s.io/priority-class"}
    assert set(children.rayjob("dg", "ns", spec(), "1", parent)["metadata"]["labels"]) == want
    job = children.extraction_job("dg", "ns", spec(extraction__enabled=True), parent)
    assert set(job["metadata"]["labels"]) == set(job["spec"]["template"]["metadata"]["labels"]) == want


def test_extraction_failure_budget_is_per_index_and_ignores_disruptions() -> None:
    s = children.extraction_job("dg", "ns", spec(extraction__enabled=True))["spec"]
    assert s["backoffLimitPerIndex"] == 2 and "backoffLimit" not in s
    ignore, fail = s["podFailurePolicy"]["rules"]
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert fail["action"] == "FailJob"
    assert fail["onExitCodes"] == {"containerName": "extract", "operator": "NotIn", "values": [0]}
    assert fail["onExitCodes"]["containerName"] == s["template"]["spec"]["containers"][0]["name"]


def test_rayjob_has_a_pre_running_deadline_from_the_spec() -> None:
    assert children.rayjob("dg", "ns", spec(), "1")["spec"]["preRunningDeadlineSeconds"] == 1800
    sp = spec(generation__ray__preRunningDeadlineSeconds=300)
    assert children.rayjob("dg", "ns", sp, "1")["spec"]["preRunningDeadlineSeconds"] == 300


@functools.cache
def _kuberay_validator() -> jsonschema.protocols.Validator:
    crd = yaml.load(reference("kuberay/ray.io_rayjobs.yaml").read_text(),
                    Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = v1["schema"]["openAPIV3Schema"]

    def strict(node: Any) -> None:  # the API server prunes unknown fields; here they are an error
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                node.setdefault("additionalProperties", False)
            for v in node.values():
                strict(v)
        elif isinstance(node, list):
            for v in node:
                strict(v)

    strict(schema)
    return jsonschema.Draft7Validator(schema)


@pytest.mark.parametrize("name", ["dg", "x" * 253, "2026-08-kimi"])
def test_rayjob_validates_against_kuberays_crd(name: str) -> None:
    sp = spec(generation__ray__memoryPerWorker="512Mi")
    body = children.rayjob(name, "ns", sp, "1", {"kueue.x-k8s.io/queue-name": "q"}, uid="u-1")
    _kuberay_validator().validate({k: v for k, v in body.items() if k != "metadata"})
    bad = children.rayjob("dg", "ns", sp, "1")
    bad["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]["resources"][
        "limits"]["memory"] = "4GB"
    with pytest.raises(jsonschema.ValidationError):  # the check can fail: KubeRay's CRD refuses 4GB
        _kuberay_validator().validate(bad)

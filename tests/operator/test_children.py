"""The children's manifests: what KubeRay, the Job controller and Kueue will read."""

from __future__ import annotations

import yaml

from eyrie.jobs.spec import parse_spec
from eyrie.operator import children

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


def test_sglang_extraction_mounts_a_memory_dev_shm_that_holds_one_batch() -> None:
    """Containers get 64 MiB of /dev/shm; SGLang spools a whole batch there before eyrie reads it."""
    from eyrie.jobs.extract.layers import spool_bytes

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
    kubernetes_validate.validate(children.configmap("dg", "ns", sp), "1.33", strict=True)
    kubernetes_validate.validate(children.extraction_job("dg", "ns", sp, {"kueue.x-k8s.io/queue-name": "q"}),
                                 "1.33", strict=True)
    kubernetes_validate.validate(children.extraction_job("dg", "ns", spec(extraction__enabled=True,
                                                                          extraction__engine="sglang")),
                                 "1.33", strict=True)
    rj = children.rayjob("dg", "ns", sp, "1")["spec"]["rayClusterSpec"]
    for tpl in (rj["headGroupSpec"]["template"], rj["workerGroupSpecs"][0]["template"]):
        kubernetes_validate.validate(_pod_template(tpl), "1.33", strict=True)

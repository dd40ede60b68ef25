"""The Helm chart, rendered and linted offline (helm-python-sdk embeds Helm; no binary, no cluster).

Every rendered built-in object is checked against Kubernetes' own schemas (kubernetes-validate,
strict: unknown fields fail), the RBAC against the operator's one permission list, the operator's
arguments against its real argument parser.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import derived  # hack/derived.py
import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from eyrie.jobs.crd import crd_yaml
from eyrie.operator.main import parse_args
from eyrie.operator.rbac import RULES

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "eyrie"
KUBE_VERSIONS = ("1.28.0", "1.37.0")  # the chart's kubeVersion floor and the newest schemas shipped
NS = "eyrie-system"
Triple = tuple[str, str, str]


def render(values: dict[str, Any] | None = None, name: str = "eyrie") -> list[dict[str, Any]]:
    with helm.Chart.load(CHART) as chart:
        out = chart.render(values, name=name, namespace=NS, is_install=True)
    docs = []
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def notes(values: dict[str, Any] | None = None) -> str:
    with helm.Chart.load(CHART) as chart:
        return chart.render(values, name="eyrie", namespace=NS)["eyrie/templates/NOTES.txt"]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [c] = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    return c


def triples(rules: list[dict[str, Any]]) -> set[Triple]:
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def operator_triples(*, namespaced_only: bool) -> set[Triple]:
    """What operator/rbac.py declares, less kopf peering (the chart runs --standalone)."""
    return {(r.group, r.resource, v) for r in RULES for v in r.verbs
            if r.group != derived.PEERING_GROUP
            and not (namespaced_only and (r.group, r.resource) in derived.CLUSTER_SCOPED)}


PYPROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "single-namespace": {"watchNamespaces": ["team-a"]},
    "two-namespaces-no-metrics": {"watchNamespaces": ["team-a", "team-b"], "metrics": {"enabled": False}},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}},
    "custom-images": {"image": {"repository": "registry.local/eyrie/op", "tag": "0.1.0-rc1", "pullPolicy": "Always"},
                      "workloadImages": {"rayWorker": {"repository": "registry.local/eyrie/ray", "tag": "t1"},
                                         "extractor": {"repository": "registry.local/eyrie/ext", "tag": "t2"}},
                      "imagePullSecrets": [{"name": "regcred"}], "serviceAccount": {"name": "eyrie-op"}},
}


# ------------------------------------------------------------------------------------ chart files


def test_versions_follow_pyproject():
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert meta["version"] == meta["appVersion"] == PYPROJECT_VERSION == "0.1.0"
    assert values["image"]["tag"] == PYPROJECT_VERSION
    assert {k: v["tag"] for k, v in values["workloadImages"].items()} == {
        "rayWorker": PYPROJECT_VERSION, "extractor": PYPROJECT_VERSION}


def test_chart_crd_is_byte_identical_to_the_generated_crd():
    chart_crd = (ROOT / derived.CHART_CRD_PATH).read_bytes()
    assert chart_crd == (ROOT / derived.CRD_PATH).read_bytes(), (
        f"charts/eyrie/crds differs from crds/: refresh with `{derived.REFRESH}`")
    assert chart_crd == crd_yaml().encode()
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == [derived.CRD_NAME]


def test_generated_chart_files_are_fresh():
    assert derived.stale() == [], f"stale generated chart files: refresh with `{derived.REFRESH}`"


def test_stale_files_are_found_and_rewritten(tmp_path):
    every = {derived.CRD_PATH, derived.CHART_CRD_PATH, derived.RBAC_PATH, derived.SPEC_REFERENCE_PATH}
    assert set(derived.stale(tmp_path)) == every
    for rel in every:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((ROOT / rel).read_text())
    (tmp_path / derived.RBAC_PATH).write_text("{}\n")
    assert derived.stale(tmp_path) == [derived.RBAC_PATH]
    assert derived.write(tmp_path) == [derived.RBAC_PATH]
    assert derived.stale(tmp_path) == []
    assert (tmp_path / derived.RBAC_PATH).read_text() == (ROOT / derived.RBAC_PATH).read_text()


def test_every_operator_rule_has_a_scope_and_the_scope_table_has_no_leftovers():
    declared = {(r.group, r.resource) for r in RULES}
    assert declared == derived.CLUSTER_SCOPED | derived.NAMESPACED
    assert not derived.CLUSTER_SCOPED & derived.NAMESPACED
    doc = derived.rbac_document()
    assert [(r["apiGroups"], r["resources"], r["verbs"]) for r in doc["rules"]] == [
        ([r.group], [r.resource], list(r.verbs)) for r in RULES]


def test_the_chart_crd_is_a_valid_crd():
    crd = yaml.safe_load((CHART / "crds" / derived.CRD_NAME).read_text())
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(crd, version, strict=True)


# --------------------------------------------------------------------------------- lint and render


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_lint_strict_is_clean(variant):
    for kube in KUBE_VERSIONS:
        report = helm.lint(CHART, VARIANTS[variant], strict=True, kube_version=f"v{kube}")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert (problems, report["errors"]) == ([], [])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_builtin_object_passes_strict_kubernetes_schemas(variant):
    docs = render(VARIANTS[variant])
    builtin = [d for d in docs if d["kind"] != "ServiceMonitor"]  # a Prometheus Operator CRD, checked below
    assert builtin
    for doc in builtin:
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_default_install_objects():
    docs = render()
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ClusterRole", "eyrie"), ("ClusterRoleBinding", "eyrie"), ("Deployment", "eyrie"),
        ("Service", "eyrie-metrics"), ("ServiceAccount", "eyrie")]
    for d in docs:
        if d["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert d["metadata"]["namespace"] == NS
        assert d["metadata"]["labels"]["app.kubernetes.io/version"] == PYPROJECT_VERSION


def test_release_name_containing_the_chart_name_is_not_doubled():
    assert {d["metadata"]["name"] for d in render(name="team-a")} == {"team-a-eyrie", "team-a-eyrie-metrics"}


def test_deployment_is_hardened_single_replica_standalone():
    docs = render()
    dep = one(docs, "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
                                      "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
    assert pod["serviceAccountName"] == one(docs, "ServiceAccount")["metadata"]["name"]
    c = container(docs)
    assert c["image"] == f"ghcr.io/eyrie-dev/eyrie-operator:{PYPROJECT_VERSION}"
    assert c["securityContext"] == {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True, "privileged": False,
                                    "capabilities": {"drop": ["ALL"]}}
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    assert c["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert {e["name"]: e["value"] for e in c["env"]}["HOME"] == "/tmp"


def test_operator_arguments_parse_with_the_operators_own_parser():
    c = container(render())
    assert c["command"] == ["eyrie", "operator"]
    args = parse_args(c["args"])
    assert (args.standalone, args.namespace, args.liveness, args.metrics_port, args.interval, args.stop_grace,
            args.verbose) == (True, [], "http://0.0.0.0:8080/healthz", 9090, 5.0, 120.0, False)
    c = container(render({"watchNamespaces": ["team-a", "team-b"], "metrics": {"enabled": False},
                          "operator": {"verbose": True, "interval": 2.5, "probePort": 8181}}))
    args = parse_args(c["args"])
    assert (args.namespace, args.metrics_port, args.verbose, args.interval, args.liveness) == (
        ["team-a", "team-b"], 0, True, 2.5, "http://0.0.0.0:8181/healthz")


def test_probes_hit_kopfs_liveness_endpoint_on_the_declared_port():
    c = container(render({"operator": {"probePort": 8181}}))
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"probe": 8181, "metrics": 9090}
    liveness = parse_args(c["args"]).liveness
    for probe in (c["livenessProbe"], c["readinessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "probe"}
        assert liveness == f"http://0.0.0.0:{ports['probe']}{probe['httpGet']['path']}"


def test_metrics_service_targets_the_metrics_port():
    docs = render({"metrics": {"port": 9300}})
    svc = one(docs, "Service")
    assert svc["spec"]["ports"] == [{"name": "metrics", "port": 9300, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert parse_args(container(docs)["args"]).metrics_port == 9300


def test_metrics_off_renders_no_service_no_port():
    docs = render({"metrics": {"enabled": False}})
    assert by_kind(docs, "Service") == [] and by_kind(docs, "ServiceMonitor") == []
    assert [p["name"] for p in container(docs)["ports"]] == ["probe"]


def test_service_monitor_scrapes_the_metrics_service():
    docs = render(VARIANTS["service-monitor"])
    sm, svc = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["metadata"]["labels"]["release"] == "prom"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"] == {"matchNames": [NS]}
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "30s",
                                        "scrapeTimeout": "10s"}]
    assert by_kind(render(), "ServiceMonitor") == []


def test_custom_images_and_service_account():
    docs = render(VARIANTS["custom-images"])
    c = container(docs)
    assert (c["image"], c["imagePullPolicy"]) == ("registry.local/eyrie/op:0.1.0-rc1", "Always")
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}] and pod["serviceAccountName"] == "eyrie-op"
    assert one(docs, "ServiceAccount")["metadata"]["name"] == "eyrie-op"
    assert one(docs, "ClusterRoleBinding")["subjects"] == [{"kind": "ServiceAccount", "name": "eyrie-op",
                                                            "namespace": NS}]
    text = notes(VARIANTS["custom-images"])
    assert "spec.generation.ray.image: registry.local/eyrie/ray:t1" in text
    assert "spec.extraction.image:     registry.local/eyrie/ext:t2" in text


def test_existing_service_account_without_rbac():
    docs = render({"serviceAccount": {"create": False, "name": "preexisting"}, "rbac": {"create": False}})
    assert sorted(d["kind"] for d in docs) == ["Deployment", "Service"]
    assert one(docs, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "preexisting"


@pytest.mark.parametrize(("values", "needle"), [
    ({"image": {"repository": "x", "tag": "latest"}}, "/image/tag"),
    ({"metrics": {"enabled": False, "serviceMonitor": {"enabled": True}}}, "/metrics/enabled"),
    ({"watchNamespaces": ["team-*"]}, "/watchNamespaces/0"),
    ({"replicas": 2}, "replicas"),
    ({"serviceAccount": {"create": False}}, "serviceAccount.name is required"),
])
def test_bad_values_are_refused_naming_the_key(values, needle):
    with helm.Chart.load(CHART) as chart, pytest.raises(helm.HelmError) as e:
        chart.render(values, name="eyrie", namespace=NS)
    assert needle in str(e.value)


# ------------------------------------------------------------------------------------------ RBAC


def test_cluster_install_grants_exactly_the_operators_rules():
    docs = render()
    role = one(docs, "ClusterRole")
    assert triples(role["rules"]) == operator_triples(namespaced_only=False)
    # one rule per declared (group, resource), nothing merged or widened
    assert len(role["rules"]) == len([r for r in RULES if r.group != derived.PEERING_GROUP])
    assert all("*" not in v for rule in role["rules"] for v in (*rule["verbs"], *rule["resources"]))
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "eyrie", "namespace": NS}]
    assert by_kind(docs, "Role") == [] and by_kind(docs, "RoleBinding") == []


@pytest.mark.parametrize("namespaces", [["team-a"], ["team-a", "team-b"]])
def test_namespaced_install_uses_only_roles_in_each_watched_namespace(namespaces):
    docs = render({"watchNamespaces": namespaces})
    assert by_kind(docs, "ClusterRole") == [] and by_kind(docs, "ClusterRoleBinding") == []
    roles, bindings = by_kind(docs, "Role"), by_kind(docs, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == sorted(namespaces)
    assert sorted(b["metadata"]["namespace"] for b in bindings) == sorted(namespaces)
    for role in roles:
        assert triples(role["rules"]) == operator_triples(namespaced_only=True)
    for b in bindings:
        assert b["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "eyrie"}
        assert b["subjects"] == [{"kind": "ServiceAccount", "name": "eyrie", "namespace": NS}]


def test_namespaced_rules_are_the_cluster_rules_without_cluster_scoped_resources():
    cluster_only = operator_triples(namespaced_only=False) - operator_triples(namespaced_only=True)
    assert {(g, r) for g, r, _ in cluster_only} == {("apiextensions.k8s.io", "customresourcedefinitions"),
                                                    ("", "namespaces")}

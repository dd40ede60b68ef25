"""`helm install`, `helm upgrade` and `helm uninstall` of charts/eyrie for real: Helm's own actions (helm-python-sdk
embeds Helm's Go SDK) against the real kube-apiserver, never rendered files applied by hand. What is asserted is
what the server holds: the release's objects with Helm's ownership marks, its revisions in Helm's release Secrets, the
CRD created from crds/, the Deployment's pod admitted under the `restricted` Pod Security Standard (this control plane
has no node: no pod runs here; tests on the node run the operator as a pod), the ServiceAccount's permissions as the
authorizer decides them, and what uninstall leaves: the CRD and the user's DatasetGenerations.
"""

from __future__ import annotations

import copy
from typing import Any

import derived  # hack/derived.py: which of the operator's rules a namespaced install leaves out
import helm_python as helm
import httpx
import pytest
import yaml

from eyrie.operator import rbac

from .conftest import CHART, OPERATOR_NS, RELEASE, RESTRICTED, Installed, release_objects
from .test_api_server import can_i, quickstart
from .testbed import DSG, EYRIE_CRD, SECRETS, ControlPlane, Resource

CRDS: Resource = ("apiextensions.k8s.io", "v1", "customresourcedefinitions")
DEPLOYMENTS: Resource = ("apps", "v1", "deployments")
PODS: Resource = ("", "v1", "pods")
# kind -> (resource, namespaced)
KINDS: dict[str, tuple[Resource, bool]] = {
    "ServiceAccount": (("", "v1", "serviceaccounts"), True),
    "Service": (("", "v1", "services"), True),
    "Deployment": (DEPLOYMENTS, True),
    "ClusterRole": (("rbac.authorization.k8s.io", "v1", "clusterroles"), False),
    "ClusterRoleBinding": (("rbac.authorization.k8s.io", "v1", "clusterrolebindings"), False),
    "Role": (("rbac.authorization.k8s.io", "v1", "roles"), True),
    "RoleBinding": (("rbac.authorization.k8s.io", "v1", "rolebindings"), True),
}


def on_server(cp: ControlPlane, doc: dict[str, Any]) -> dict[str, Any] | None:
    res, namespaced = KINDS[doc["kind"]]
    return cp.get(res, doc["metadata"].get("namespace", "") if namespaced else "", doc["metadata"]["name"])


def release_secrets(cp: ControlPlane, ns: str, name: str) -> dict[str, str]:
    """Helm's release storage: one Secret per revision, `sh.helm.release.v1.NAME.vN`, labelled with its status."""
    found = cp.list(SECRETS, ns, labelSelector=f"owner=helm,name={name}")
    assert all(s["type"] == "helm.sh/release.v1" for s in found), found
    return {s["metadata"]["name"]: s["metadata"]["labels"]["status"] for s in found}


def namespace(cp: ControlPlane, name: str, labels: dict[str, str] | None = None) -> None:
    cp.create(("", "v1", "namespaces"), "", {"apiVersion": "v1", "kind": "Namespace",
                                              "metadata": {"name": name, "labels": labels or {}}})


def test_the_session_release_is_helms_and_holds_every_rendered_object(control_plane: ControlPlane,
                                                                         chart: Installed) -> None:
    with control_plane.helm(OPERATOR_NS) as client:
        status = client.status(RELEASE)
    assert (status["status"], status["revision"]) == ("deployed", 1)
    assert status["app_version"] == yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert release_secrets(control_plane, OPERATOR_NS, RELEASE) == {f"sh.helm.release.v1.{RELEASE}.v1": "deployed"}
    objects = release_objects(status)
    assert sorted(d["kind"] for d in objects) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "Service",
                                                   "ServiceAccount"]
    for doc in objects:
        live = on_server(control_plane, doc)
        assert live is not None, f"{doc['kind']} {doc['metadata']['name']} is in the release but not on the server"
        meta = live["metadata"]
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "Helm", meta
        assert meta["annotations"]["meta.helm.sh/release-name"] == RELEASE
        assert meta["annotations"]["meta.helm.sh/release-namespace"] == OPERATOR_NS
    # the CRD is not a release object: Helm installs crds/ once and never deletes it (uninstall keeps users' data)
    assert "CustomResourceDefinition" not in {d["kind"] for d in objects}


def test_helm_created_the_crd_from_the_charts_crds_folder(control_plane: ControlPlane, chart: Installed) -> None:
    crd = control_plane.get(CRDS, "", "datasetgenerations.eyrie.dev")
    assert crd is not None
    chart_crd = yaml.safe_load((CHART / "crds" / "datasetgenerations.eyrie.dev.yaml").read_text())
    assert chart_crd == yaml.safe_load(EYRIE_CRD.read_text())
    assert {k: crd["spec"][k] for k in chart_crd["spec"]} == chart_crd["spec"]
    assert any(c["type"] == "Established" and c["status"] == "True" for c in crd["status"]["conditions"])
    # written by Helm 4's server-side apply from this process, not by kubectl
    managers = {(m["manager"], m["operation"]) for m in crd["metadata"]["managedFields"]}
    assert any(op == "Apply" for _, op in managers) and not any("kubectl" in m for m, _ in managers), managers


def pod_from(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    """The Pod the ReplicaSet controller would create from the Deployment's template."""
    template = copy.deepcopy(deployment["spec"]["template"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": template["metadata"]["labels"]},
            "spec": template["spec"]}


def test_the_operators_pod_is_admitted_under_the_restricted_pod_security_standard(control_plane: ControlPlane,
                                                                                     chart: Installed) -> None:
    """The API server's PodSecurity admission judges the Deployment's pod as stored (server defaults applied), in the
    release's namespace, which enforces `restricted`; the same pod with one hardening setting undone is refused."""
    ns = OPERATOR_NS
    assert control_plane.get(("", "v1", "namespaces"), "", ns)["metadata"]["labels"].items() >= RESTRICTED.items()
    deployment = control_plane.get(DEPLOYMENTS, OPERATOR_NS, RELEASE)
    assert deployment is not None
    pod = pod_from(deployment, "operator")
    admitted = control_plane.create(PODS, ns, pod, dry_run=True)
    [container] = admitted["spec"]["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # the image's USER (tests/house/test_image_archives.py)
    assert admitted["spec"]["securityContext"]["runAsUser"] == 10001

    loose = copy.deepcopy(pod)
    loose["spec"]["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    with pytest.raises(httpx.HTTPStatusError) as refused:
        control_plane.create(PODS, ns, loose, dry_run=True)
    assert refused.value.response.status_code == 403
    message = refused.value.response.json()["message"]
    assert 'violates PodSecurity "restricted:latest"' in message and "allowPrivilegeEscalation != false" in message
    assert control_plane.list(PODS, ns) == []  # dry runs store nothing


def test_install_upgrade_uninstall_of_a_namespaced_release(control_plane: ControlPlane, chart: Installed) -> None:
    """A second release, watching one namespace: Roles there and no ClusterRole; an upgrade changes the Deployment
    and removes what the new values no longer render; uninstall removes the release's objects and revisions and leaves
    the CRD and the user's DatasetGeneration."""
    ns, team, name = "helm-lifecycle", "helm-team", "lifecycle"
    namespace(control_plane, ns, RESTRICTED)
    namespace(control_plane, team)
    values: dict[str, Any] = {"watchNamespaces": [team]}
    with control_plane.helm(ns) as client:
        installed = client.install(CHART, name, values, timeout=120)
        assert (installed["status"], installed["revision"]) == ("deployed", 1)
        first = release_objects(installed)
        assert sorted(d["kind"] for d in first) == ["Deployment", "Role", "RoleBinding", "Service", "ServiceAccount"]
        assert {d["metadata"]["namespace"] for d in first if d["kind"].startswith("Role")} == {team}
        assert all(on_server(control_plane, d) is not None for d in first)

        # the release's ServiceAccount gets the operator's rules in the watched namespace, and only there
        [sa] = [d["metadata"]["name"] for d in first if d["kind"] == "ServiceAccount"]
        token = control_plane.service_account_token(ns, sa)
        namespaced = [r for r in rbac.RULES
                      if r.group != derived.PEERING_GROUP and (r.group, r.resource) not in derived.CLUSTER_SCOPED]
        assert namespaced
        for r in namespaced:
            for verb in r.verbs:
                assert can_i(control_plane, token, r.group, r.resource, verb, ns=team), (r, verb)
                assert not can_i(control_plane, token, r.group, r.resource, verb, ns="default"), (r, verb)

        control_plane.create(DSG, team, quickstart("users-data"))

        upgraded = client.upgrade(CHART, name, {**values, "operator": {"interval": 7}, "metrics": {"enabled": False}},
                                  timeout=120)
        assert (upgraded["status"], upgraded["revision"]) == ("deployed", 2)
        [deployment] = [on_server(control_plane, d) for d in first if d["kind"] == "Deployment"]
        assert deployment is not None
        args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--interval=7" in args and "--metrics-port=0" in args, args
        [service] = [d for d in first if d["kind"] == "Service"]
        assert on_server(control_plane, service) is None, "the metrics Service outlived metrics.enabled: false"
        assert release_secrets(control_plane, ns, name) == {f"sh.helm.release.v1.{name}.v1": "superseded",
                                                            f"sh.helm.release.v1.{name}.v2": "deployed"}
        assert [(h["revision"], h["status"]) for h in client.history(name)] == [(1, "superseded"), (2, "deployed")]

        client.uninstall(name, timeout=120)
        with pytest.raises(helm.HelmNotFoundError):
            client.status(name)
    gone = [f"{d['kind']} {d['metadata']['name']}" for d in first if on_server(control_plane, d) is not None]
    assert gone == [], f"left behind by helm uninstall: {gone}"
    assert release_secrets(control_plane, ns, name) == {}
    assert control_plane.get(CRDS, "", "datasetgenerations.eyrie.dev") is not None
    assert control_plane.get(DSG, team, "users-data") is not None, "helm uninstall took the user's DatasetGeneration"
    assert control_plane.get(("", "v1", "namespaces"), "", ns) is not None
    # the session release is untouched by the second one's lifecycle
    assert all(on_server(control_plane, d) is not None for d in release_objects(chart.release))


def test_a_bad_value_is_refused_by_install_before_anything_reaches_the_server(control_plane: ControlPlane,
                                                                             chart: Installed) -> None:
    """values.schema.json is checked by Helm's install action itself: nothing is created, no release is recorded."""
    ns = "helm-refused"
    namespace(control_plane, ns)
    with control_plane.helm(ns) as client, pytest.raises(helm.HelmError) as e:
        client.install(CHART, "refused", {"operator": {"interval": "often"}}, timeout=60)
    assert "interval" in str(e.value)
    assert release_secrets(control_plane, ns, "refused") == {}
    assert control_plane.list(DEPLOYMENTS, ns) == []

"""The CRD, its CEL rules, its printer columns and the chart's RBAC, as a real kube-apiserver sees them."""

from __future__ import annotations

import copy
import re
import subprocess
from typing import Any

import httpx
import kopf
import pytest
import yaml

from eyrie.jobs.spec import GROUP, PLURAL
from eyrie.operator import rbac

from .conftest import Installed
from .testbed import DSG, EYRIE_CRD, REPO, ControlPlane, api_path, versions, wait_for

EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
QUICKSTART = REPO / "examples" / "quickstart.yaml"


def quickstart(name: str) -> dict[str, Any]:
    doc = yaml.safe_load(QUICKSTART.read_text())
    doc["metadata"] = {"name": name}
    return doc


def apply(cp: ControlPlane, doc: dict[str, Any], ns: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return cp.kubectl("apply", "-f", "-", *flags, stdin=yaml.safe_dump(doc), namespace=ns)


def test_server_is_the_pinned_kubernetes(control_plane: ControlPlane) -> None:
    assert control_plane.api is not None
    assert control_plane.api.get("/version").json()["gitVersion"] == versions()["KUBERNETES"]


def test_crd_is_accepted_structural_with_its_cel_rules_compiled(control_plane: ControlPlane, chart: Installed) -> None:
    crd = control_plane.get(("apiextensions.k8s.io", "v1", "customresourcedefinitions"), "", f"{PLURAL}.{GROUP}")
    assert crd is not None
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    # a CEL rule that does not compile or exceeds the cost budget is refused at create; a non-structural
    # schema shows up as a condition
    assert conditions.get("Established") == "True" and conditions.get("NamesAccepted") == "True", conditions
    assert "NonStructuralSchema" not in conditions, conditions
    assert crd["spec"] == {**crd["spec"], **{k: v for k, v in yaml.safe_load(EYRIE_CRD.read_text())["spec"].items()
                                              if k in ("group", "names", "scope")}}


def test_every_example_applies_and_get_shows_the_printer_columns(control_plane: ControlPlane, chart: Installed) -> None:
    ns = "examples"
    control_plane.ensure_namespace(ns)
    for path in EXAMPLES:
        out = control_plane.kubectl("apply", "-f", str(path), namespace=ns)
        assert out.returncode == 0, f"{path.name}: {out.stderr}"
    dsgs = [d for p in EXAMPLES for d in yaml.safe_load_all(p.read_text()) if d and d["kind"] == "DatasetGeneration"]
    assert len(dsgs) >= 2
    first = dsgs[0]["metadata"]["name"]
    # the server's own table conversion (what `kubectl get` prints), from the CRD's additionalPrinterColumns
    status = {"phase": "Generating", "spentUSD": "0.42", "samples": {"done": 17},
              "pilot": {"runAccepted": 3.33, "bestOption": "structured", "bestAccepted": 7.06}}
    control_plane.patch(DSG, ns, first, {"status": status}, sub="status")
    out = control_plane.kubectl("get", "dsg", namespace=ns, check=True).stdout.splitlines()
    assert out[0].split() == ["NAME", "PHASE", "SPENT", "BUDGET", "DONE", "ACCEPTED", "ALTACCEPTED", "AGE"], out
    rows = {line.split()[0]: line.split() for line in out[1:]}
    assert sorted(rows) == sorted(d["metadata"]["name"] for d in dsgs)
    assert rows[first][1:7] == ["Generating", "0.42", dsgs[0]["spec"]["budget"]["maxUSD"], "17", "3.33", "7.06"], out
    # the alternative's name is a wide column (priority 1): `-o wide` shows it
    wide = control_plane.kubectl("get", "dsg", first, "-o", "wide", namespace=ns, check=True).stdout.splitlines()
    assert wide[0].split() == ["NAME", "PHASE", "SPENT", "BUDGET", "DONE", "ACCEPTED", "ALT", "ALTACCEPTED", "AGE"]
    assert wide[1].split()[5:8] == ["3.33", "structured", "7.06"], wide


def test_describe_shows_conditions_and_events(control_plane: ControlPlane, chart: Installed) -> None:
    ns = "describe"
    control_plane.ensure_namespace(ns)
    created = control_plane.create(DSG, ns, quickstart("described"))
    control_plane.patch(DSG, ns, "described", {"status": {"phase": "Pending", "conditions": [
        {"type": "Ready", "status": "False", "reason": "SecretMissing", "message": "Secret openrouter not found",
         "lastTransitionTime": "2026-01-01T00:00:00Z"}],
        "outputManifest": "s3://eyrie/described/manifest.json",
        "outputReport": "s3://eyrie/described/report.html"}}, sub="status")
    control_plane.create(("", "v1", "events"), ns, {
        "apiVersion": "v1", "kind": "Event", "metadata": {"name": "described.1"}, "type": "Warning",
        "reason": "SecretMissing", "message": "waiting for Secret openrouter",
        "involvedObject": {"apiVersion": f"{GROUP}/v1alpha1", "kind": "DatasetGeneration", "name": "described",
                           "namespace": ns, "uid": created["metadata"]["uid"]},
        "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z", "count": 1,
        "source": {"component": "eyrie-operator"}})
    out = control_plane.kubectl("describe", "dsg", "described", namespace=ns, check=True).stdout
    assert "Conditions:" in out and "SecretMissing" in out and "Secret openrouter not found" in out, out
    # where the dataset and its report are: kept by the status schema (not pruned), shown by describe
    assert re.search(r"Output Manifest:\s+s3://eyrie/described/manifest\.json", out), out
    assert re.search(r"Output Report:\s+s3://eyrie/described/report\.html", out), out
    events = out[out.index("Events:"):]
    assert "Warning" in events and "waiting for Secret openrouter" in events, out


@pytest.mark.parametrize(("change", "field", "needle"), [
    (lambda d: d["spec"]["budget"].update(maxUSD="0"), "spec.budget.maxUSD", "must be greater than 0"),
    (lambda d: d["spec"].update(surprise=1), "spec.surprise", "unknown field"),
    (lambda d: d["spec"]["api"].update(maxConcurency=3), "spec.api.maxConcurency", "unknown field"),
])
def test_the_server_refuses_bad_specs_naming_the_field(control_plane: ControlPlane, chart: Installed,
                                                       change: Any, field: str, needle: str) -> None:
    doc = quickstart("refused")
    change(doc)
    out = apply(control_plane, doc, "default")
    assert out.returncode != 0, out.stdout
    assert field in out.stderr and needle in out.stderr, out.stderr
    assert control_plane.get(DSG, "default", "refused") is None


def test_output_uri_cannot_change_once_set(control_plane: ControlPlane, chart: Installed) -> None:
    doc = quickstart("immutable-output")
    assert apply(control_plane, doc, "default").returncode == 0
    moved = copy.deepcopy(doc)
    moved["spec"]["output"]["uri"] = "eyrie-out/elsewhere"
    out = apply(control_plane, moved, "default")
    assert out.returncode != 0
    assert "spec.output.uri" in out.stderr and "output.uri is immutable once set" in out.stderr, out.stderr
    # another field of the same object still changes: the rule is a transition rule on uri alone
    doc["spec"]["budget"]["maxUSD"] = "2.00"
    assert apply(control_plane, doc, "default").returncode == 0
    assert control_plane.get(DSG, "default", "immutable-output")["spec"]["output"]["uri"] == "eyrie-out/quickstart"


# --- RBAC: the chart grants exactly operator/rbac.py's rules (minus kopf peering: the chart runs --standalone)

VERBS = ("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection")
# resources the operator has no business with at all
FOREIGN = (("", "persistentvolumeclaims"), ("", "pods/exec"), ("", "serviceaccounts"),
           ("rbac.authorization.k8s.io", "clusterroles"), ("apps", "deployments"), ("ray.io", "rayclusters"))


def can_i(cp: ControlPlane, token: str, group: str, resource: str, verb: str, ns: str = "default") -> bool:
    """SelfSubjectAccessReview as the operator's ServiceAccount: what the authorizer would decide."""
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": {"group": group, "resource": resource.split("/")[0], "verb": verb,
                                              "subresource": resource.partition("/")[2], "namespace": ns}}}
    assert cp.api is not None
    r = cp.api.post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", json=review,
                    headers={"Authorization": f"Bearer {token}"})  # REST, not a kubectl process per verb
    r.raise_for_status()
    return bool(r.json()["status"].get("allowed"))


def test_the_operator_account_gets_each_verb_it_uses_and_nothing_else(control_plane: ControlPlane,
                                                                        chart: Installed) -> None:
    rules = [r for r in rbac.RULES if r.group != "kopf.dev"]
    wrong = []
    for r in rules:
        for verb in VERBS:
            if can_i(control_plane, chart.token, r.group, r.resource, verb) != (verb in r.verbs):
                wrong.append(f"{r.group or 'core'}/{r.resource} {verb}: expected {verb in r.verbs}")
    for group, resource in FOREIGN:
        for verb in VERBS:
            if can_i(control_plane, chart.token, group, resource, verb):
                wrong.append(f"{group or 'core'}/{resource} {verb}: granted")
    assert wrong == []


def test_a_verb_the_operator_does_not_use_is_refused_by_the_server(control_plane: ControlPlane,
                                                                   chart: Installed) -> None:
    ns = "rbac-refusal"
    control_plane.ensure_namespace(ns)
    control_plane.create(DSG, ns, quickstart("kept"))
    out = control_plane.kubectl("delete", "dsg", "kept", token=chart.token, namespace=ns)
    assert out.returncode != 0 and "Forbidden" in out.stderr and chart.user in out.stderr, out.stderr
    assert control_plane.get(DSG, ns, "kept") is not None
    out = control_plane.kubectl("get", "secrets", token=chart.token, namespace=ns)
    assert out.returncode != 0 and "cannot list resource \"secrets\"" in out.stderr, out.stderr


def test_block_owner_deletion_needs_update_on_the_owners_finalizers_and_the_chart_grants_it(
        control_plane: ControlPlane, chart: Installed) -> None:
    """The server runs OwnerReferencesPermissionEnforcement (as OpenShift and hardened clusters do): a child
    created with `blockOwnerDeletion: true` is refused to an account without `update` on
    datasetgenerations/finalizers, and accepted with the chart's rules, which include it."""
    ns = "owner-refs"
    control_plane.ensure_namespace(ns)
    owner = control_plane.create(DSG, ns, quickstart("owner"))
    without = [r for r in rbac.policy_rules() if r["resources"] != [f"{PLURAL}/finalizers"]]
    assert len(without) == len(rbac.policy_rules()) - 1
    rbac_api = ("rbac.authorization.k8s.io", "v1")
    control_plane.create((*rbac_api, "roles"), ns, {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                                                    "metadata": {"name": "no-finalizers"}, "rules": without})
    token = control_plane.service_account_token(ns, "no-finalizers")
    control_plane.create((*rbac_api, "rolebindings"), ns, {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "no-finalizers"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-finalizers"},
        "subjects": [{"kind": "ServiceAccount", "name": "no-finalizers", "namespace": ns}]})

    def child(name: str, block: bool) -> dict[str, Any]:
        cm: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}
        kopf.append_owner_reference(cm, owner=kopf.Body(owner), block_owner_deletion=block)  # as the operator does
        return cm

    api = control_plane.api
    assert api is not None

    def create_as(who: str, body: dict[str, Any]) -> httpx.Response:
        return api.post(api_path("", "v1", "configmaps", ns), json=body, headers={"Authorization": f"Bearer {who}"})

    wait_for("the Role to reach the authorizer",
             lambda: create_as(token, child("unblocked", block=False)).status_code == 201)
    refused = create_as(token, child("blocking", block=True))
    assert refused.status_code == 403, refused.text
    assert "cannot set blockOwnerDeletion" in refused.json()["message"], refused.text
    accepted = create_as(chart.token, child("blocking", block=True))
    assert accepted.status_code == 201, accepted.text
    [ref] = accepted.json()["metadata"]["ownerReferences"]
    assert ref["blockOwnerDeletion"] is True and ref["uid"] == owner["metadata"]["uid"]

"""The declared RBAC list: one rule per (group, resource), ClusterRole-shaped."""

from __future__ import annotations

from eyrie.operator import rbac


def test_policy_rules_shape_and_uniqueness() -> None:
    rules = rbac.policy_rules()
    keys = [(r["apiGroups"][0], r["resources"][0]) for r in rules]
    assert len(keys) == len(set(keys))
    assert {"apiGroups": ["eyrie.dev"], "resources": ["datasetgenerations/status"],
            "verbs": ["get", "patch"]} in rules
    assert rbac.allows("", "secrets", "get") and not rbac.allows("", "secrets", "list")
    assert not rbac.allows("", "pods", "create")  # the operator never creates pods itself

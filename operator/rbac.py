"""The one list of Kubernetes permissions the operator uses; the Helm chart's RBAC derives from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eyrie.jobs.spec import GROUP, PLURAL

from .children import RAYJOB_API


@dataclass(frozen=True)
class Rule:
    group: str  # "" is the core group
    resource: str
    verbs: tuple[str, ...]
    why: str


RULES: tuple[Rule, ...] = (
    Rule(GROUP, PLURAL, ("get", "list", "watch", "patch"),
         "watch DatasetGenerations; set spec.suspend on budget/drift stops; kopf annotations and finalizers"),
    Rule(GROUP, f"{PLURAL}/status", ("get", "patch"), "write status"),
    Rule(GROUP, f"{PLURAL}/finalizers", ("update",),
         "children carry blockOwnerDeletion: true, which the OwnerReferencesPermissionEnforcement admission "
         "plugin allows only to who may update the owner's finalizers"),
    Rule("", "configmaps", ("get", "create", "patch"), "the resolved spec the jobs mount"),
    Rule("", "secrets", ("get",), "check the referenced Secrets exist; S3 credentials to read progress.json"),
    Rule("", "events", ("create",), "events that explain every stop (kopf posts core/v1 events)"),
    Rule("", "pods", ("list",), "why a child's pods do not run: an image missing, a Secret missing, out of memory, "
         "unschedulable (PodsHealthy)"),
    Rule(RAYJOB_API[0], RAYJOB_API[2], ("get", "create", "patch", "delete"), "generation RayJobs"),
    Rule("batch", "jobs", ("get", "create", "patch", "delete"), "the Indexed extraction Job"),
    Rule("apiextensions.k8s.io", "customresourcedefinitions", ("list", "watch"), "kopf resource discovery"),
    Rule("", "namespaces", ("list", "watch"), "kopf: serve all namespaces as they come and go"),
    Rule("kopf.dev", "clusterkopfpeerings", ("list", "watch", "patch", "get"),
         "kopf peering between operator replicas (unless --standalone)"),
    Rule("kopf.dev", "kopfpeerings", ("list", "watch", "patch", "get"),
         "kopf peering between operator replicas (unless --standalone)"),
)


def policy_rules() -> list[dict[str, Any]]:
    """The rules in ClusterRole form: one entry per (group, resource)."""
    return [{"apiGroups": [r.group], "resources": [r.resource], "verbs": list(r.verbs)} for r in RULES]


def allows(group: str, resource: str, verb: str) -> bool:
    return any(r.group == group and r.resource == resource and verb in r.verbs for r in RULES)

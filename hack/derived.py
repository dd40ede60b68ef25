"""Files in the repository that are generated from code, so none of them can drift from it.

- `crds/datasetgenerations.eyrie.dev.yaml` and its copy in `charts/eyrie/crds/`: byte for byte the
  CRD `eyrie crd` prints.
- `charts/eyrie/files/rbac.json`: the operator's one list of permissions (`eyrie.operator.rbac.RULES`),
  each rule tagged with its scope and whether only kopf peering needs it; the chart's RBAC templates
  render Roles/ClusterRoles from this file and nothing else.
- `docs/spec-reference.md`: the spec reference rendered from the pydantic models (`specdoc.py`).

Refresh them all with `python hack/derived.py`; `--check` exits 1 naming the stale files.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from specdoc import spec_reference_markdown

from eyrie.jobs.crd import crd_yaml
from eyrie.jobs.spec import GROUP, PLURAL

REPO = Path(__file__).resolve().parents[1]
CRD_NAME = f"{PLURAL}.{GROUP}.yaml"
CRD_PATH = Path("crds") / CRD_NAME
CHART_CRD_PATH = Path("charts/eyrie/crds") / CRD_NAME
RBAC_PATH = Path("charts/eyrie/files/rbac.json")
SPEC_REFERENCE_PATH = Path("docs/spec-reference.md")
REFRESH = "python hack/derived.py"

# Resources the operator touches that are not namespaced. Kubernetes decides scope per resource, not
# per verb, so this is a fact table; `rbac_document` refuses a rule it cannot place.
CLUSTER_SCOPED: frozenset[tuple[str, str]] = frozenset({
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("", "namespaces"),
    ("kopf.dev", "clusterkopfpeerings"),
})
NAMESPACED: frozenset[tuple[str, str]] = frozenset({
    (GROUP, PLURAL),
    (GROUP, f"{PLURAL}/status"),
    (GROUP, f"{PLURAL}/finalizers"),
    ("", "configmaps"),
    ("", "secrets"),
    ("", "events"),
    ("", "pods"),
    ("ray.io", "rayjobs"),
    ("batch", "jobs"),
    ("kopf.dev", "kopfpeerings"),
})
# kopf's peering objects: unused by the chart, which runs one replica with `--standalone`.
PEERING_GROUP = "kopf.dev"


class UnknownScope(ValueError):
    """A rule in eyrie.operator.rbac names a resource this module cannot place as namespaced or cluster."""


def rbac_document() -> dict[str, Any]:
    """The operator's RULES as the chart reads them: apiGroups/resources/verbs plus scope and peering."""
    from eyrie.operator.rbac import RULES

    rules = []
    for r in RULES:
        key = (r.group, r.resource)
        if key in CLUSTER_SCOPED:
            scope = "Cluster"
        elif key in NAMESPACED:
            scope = "Namespaced"
        else:
            raise UnknownScope(f"eyrie.operator.rbac rule for {r.group or 'core'}/{r.resource}: add it to "
                               "CLUSTER_SCOPED or NAMESPACED in hack/derived.py")
        rules.append({"apiGroups": [r.group], "resources": [r.resource], "verbs": list(r.verbs),
                      "scope": scope, "peering": r.group == PEERING_GROUP, "why": r.why})
    return {"generatedBy": REFRESH, "source": "operator/rbac.py", "rules": rules}


def generated() -> dict[Path, str]:
    """Path (relative to the repository) -> the text it must hold."""
    crd = crd_yaml()
    return {
        CRD_PATH: crd,
        CHART_CRD_PATH: crd,
        RBAC_PATH: json.dumps(rbac_document(), indent=2) + "\n",
        SPEC_REFERENCE_PATH: spec_reference_markdown(),
    }


def stale(root: Path = REPO) -> list[Path]:
    """The generated files under `root` whose content differs from what the code produces."""
    out = []
    for rel, text in generated().items():
        path = root / rel
        if not path.exists() or path.read_text() != text:
            out.append(rel)
    return out


def write(root: Path = REPO) -> list[Path]:
    """Write every stale file; returns what changed."""
    changed = stale(root)
    texts = generated()
    for rel in changed:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(texts[rel])
    return changed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python hack/derived.py", description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    args = ap.parse_args(argv)
    if args.check:
        bad = stale()
        for rel in bad:
            print(f"stale: {rel} (refresh with `{REFRESH}`)", file=sys.stderr)
        return 1 if bad else 0
    for rel in write():
        print(f"wrote {rel}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

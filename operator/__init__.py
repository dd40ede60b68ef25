"""eyrie control plane: the kopf operator (`eyrie operator`).

- `reconcile` decides (pure): observed children + `<output>/progress.json` -> actions + status.
- `children` builds the manifests: ConfigMap `<name>-spec`, RayJob `<name>-gen-<attempt>` (or the
  Ray submission `eyrie-<namespace>-<name>-<attempt>`), Indexed Job `<name>-extract`.
- `handlers` observes and acts (kopf timer + spec-change events, one lock per resource).
- `conditions`: SecretsReady, OutputReachable, Queued, Suspended, Succeeded, Failed.
- `rbac` is the one list of permissions; `metrics` the Prometheus endpoint.

Suspend reasons: BudgetExceeded, ToolSemanticsDrift, InsufficientCredits (the operator sets
`spec.suspend: true`), SuspendedByUser. Resuming starts a fresh attempt once the stopped one is gone.
"""

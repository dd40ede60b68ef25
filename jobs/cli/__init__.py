"""`eyrie` command line: run | validate | crd | simulate | audit | providers | report | evaluate | pilot |
extract | export | operator.

Each subcommand delegates to the module that owns it; heavy imports (ray, torch, kopf) happen only
inside the subcommand that needs them so `eyrie validate` stays instant.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

USAGE = """usage: eyrie COMMAND [ARGS]

commands:
  run SPEC          generate (and reconstruct, extract) a dataset locally or as a Ray job
  validate SPEC     check a spec and explain what is wrong, naming the field
  crd               print the CustomResourceDefinition generated from the spec model
  simulate          start the built-in simulated OpenAI-compatible provider (demo/test tool)
  audit SPEC        A/B the same prompts with tools as text vs structured, print the table
  providers SPEC    compare the target's providers on the same prompts; print which pass and the routing
  report OUTPUT     what a run bought: tables on the terminal, plots with --html FILE
  evaluate OUTPUT   train small EAGLE-3 drafters (SpecForge) on outputs, compare their acceptance
  pilot SPEC        the spec's pilot: drafters of each option on a slice, the verdict before the rest is bought
  extract SPEC      write hidden states for the run's samples (one pod's share with --index)
  export FORMAT     export hidden states (e.g. `export specforge OUTPUT_URI DIR`)
  operator          run the Kubernetes operator (kopf)

Run `eyrie COMMAND --help` for a command's options; `eyrie --version` prints the installed version.
"""


def _lazy(module: str, func: str) -> Callable[[list[str]], int]:
    def run(argv: list[str]) -> int:
        import importlib

        return importlib.import_module(module).__dict__[func](argv)

    return run


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "run": _lazy("eyrie.jobs.cli.run", "run_main"),
    "validate": _lazy("eyrie.jobs.cli.validate", "validate_main"),
    "crd": _lazy("eyrie.jobs.cli.crd", "crd_main"),
    "simulate": _lazy("eyrie.jobs.cli.simulate", "simulate_main"),
    "audit": _lazy("eyrie.jobs.cli.audit", "audit_main"),
    "providers": _lazy("eyrie.jobs.cli.providers", "providers_main"),
    "report": _lazy("eyrie.jobs.cli.report", "report_main"),
    "evaluate": _lazy("eyrie.jobs.cli.evaluate", "evaluate_main"),
    "pilot": _lazy("eyrie.jobs.cli.pilot", "pilot_main"),
    "extract": _lazy("eyrie.jobs.cli.extract", "extract_main"),
    "export": _lazy("eyrie.jobs.cli.export", "export_main"),
    "operator": _lazy("eyrie.operator.main", "operator_main"),
}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        sys.exit(0 if argv else 2)
    if argv[0] == "--version":  # the distribution's version: an image's eyrie is the chart's appVersion
        from importlib.metadata import version

        print(f"eyrie {version('eyrie')}")
        sys.exit(0)
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"eyrie: unknown command {cmd!r}\n\n{USAGE}", file=sys.stderr)
        sys.exit(2)
    from eyrie.jobs.errors import EyrieError

    try:
        code = COMMANDS[cmd](rest)
    except EyrieError as e:  # the one place an error a user can act on becomes a message and an exit code
        print(f"eyrie {cmd}: {e}", file=sys.stderr)
        code = e.exit_code
    sys.exit(code)


if __name__ == "__main__":
    main()

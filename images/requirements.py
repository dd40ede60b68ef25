"""Print the requirements of eyrie's base and of the named extras, one per line, from pyproject.toml alone.

The images install these in a layer of their own before the eyrie wheel (images/*.Dockerfile), so that layer is
rebuilt only when this text changes, i.e. when the declared dependencies do, not at every source edit: docker build
and buildah --layers both key a `COPY --from` on the content it brings. Nothing is resolved or pinned here; the
extras' references to eyrie itself (`eyrie[generate]`) are expanded. The wheel installed on top with `--no-index`
fails the build if this list ever misses one of its requirements.
    python requirements.py [--pyproject FILE] EXTRA...
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    """The base dependencies, then each extra's, in declaration order, each once."""
    project = pyproject["project"]
    self_ref = re.compile(rf"{re.escape(project['name'])}\[([^\]]+)\]")
    declared = project.get("optional-dependencies", {})
    out = list(project.get("dependencies", []))
    seen: set[str] = set()

    def add(extra: str) -> None:
        if extra in seen:
            return
        if extra not in declared:
            sys.exit(f"requirements.py: pyproject.toml declares no extra {extra!r} (it has: {', '.join(declared)})")
        seen.add(extra)
        for req in declared[extra]:
            if m := self_ref.fullmatch(req.strip()):
                for inner in m.group(1).split(","):
                    add(inner.strip())
            elif req not in out:
                out.append(req)

    for extra in extras:
        add(extra)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    parser.add_argument("extras", nargs="*")
    args = parser.parse_args()
    print("\n".join(requirements(tomllib.loads(args.pyproject.read_text()), args.extras)))


if __name__ == "__main__":
    main()
